/*
 * libFuzzer target for the Mooncake trace reader (bench/trace.c).
 *
 * Invariants on every input: the reader never reads past len (the input is
 * copied to an exactly-sized buffer); on success the requests' hash-id slices
 * tile the id array in order and max_blocks is their maximum; re-serializing
 * the parsed trace (a session as the integer of its id) and parsing it again
 * gives the same trace, each session the id of its digits; on failure the
 * status is a known one and the message is one line.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes @t back in the trace format; returns a malloc'd buffer and its length. */
static char *serialize(const kvt_trace_t *t, size_t *len_p)
{
    size_t cap = 64 + t->nreqs * 136 + t->nids * 22, len = 0;
    char *out = malloc(cap);
    CHECK(out != NULL);
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *r = &t->reqs[i];
        len += (size_t)snprintf(out + len, cap - len,
                                "{\"timestamp\": %" PRIu64 ", \"input_length\": %" PRIu32
                                ", \"output_length\": %" PRIu32 ", \"hash_ids\": [",
                                r->timestamp_ms, r->input_length, r->output_length);
        for (uint32_t j = 0; j < r->nblocks; j++)
            len +=
                (size_t)snprintf(out + len, cap - len, "%s%" PRIu64, j ? ", " : "", r->hash_ids[j]);
        len += (size_t)snprintf(out + len, cap - len, "]");
        if (r->session != 0)
            len += (size_t)snprintf(out + len, cap - len, ", \"session_id\": %" PRIu64, r->session);
        len += (size_t)snprintf(out + len, cap - len, "}\n");
        CHECK(len < cap);
    }
    *len_p = len;
    return out;
}

static void check_shape(const kvt_trace_t *t)
{
    size_t off = 0;
    uint32_t maxb = 0;
    for (size_t i = 0; i < t->nreqs; i++) {
        CHECK(t->reqs[i].nblocks == 0 || t->reqs[i].hash_ids == t->ids + off);
        off += t->reqs[i].nblocks;
        if (t->reqs[i].nblocks > maxb)
            maxb = t->reqs[i].nblocks;
    }
    CHECK(off == t->nids);
    CHECK(maxb == t->max_blocks);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    CHECK(buf != NULL);
    memcpy(buf, data, size);
    kvt_trace_t *t = NULL;
    char err[256];
    kvt_status_t st = kvt_trace_parse(buf, size, &t, err, sizeof(err));
    if (st != KVT_OK) {
        CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_NO_MEM || st == KVT_ERR_INVAL);
        CHECK(t == NULL);
        CHECK(strchr(err, '\n') == NULL);
        free(buf);
        return 0;
    }
    check_shape(t);
    size_t len;
    char *again = serialize(t, &len);
    kvt_trace_t *t2 = NULL;
    CHECK(kvt_trace_parse(again, len, &t2, err, sizeof(err)) == KVT_OK);
    CHECK(t2->nreqs == t->nreqs && t2->nids == t->nids);
    for (size_t i = 0; i < t->nreqs; i++) {
        CHECK(t2->reqs[i].timestamp_ms == t->reqs[i].timestamp_ms);
        CHECK(t2->reqs[i].input_length == t->reqs[i].input_length);
        CHECK(t2->reqs[i].output_length == t->reqs[i].output_length);
        CHECK(t2->reqs[i].nblocks == t->reqs[i].nblocks);
        char digits[24];
        int n = snprintf(digits, sizeof(digits), "%" PRIu64, t->reqs[i].session);
        CHECK(t2->reqs[i].session ==
              (t->reqs[i].session ? kvt_trace_session_id(digits, (size_t)n) : 0));
    }
    CHECK(t->nids == 0 || memcmp(t2->ids, t->ids, t->nids * sizeof(uint64_t)) == 0);
    kvt_trace_free(t2);
    free(again);
    kvt_trace_free(t);
    free(buf);
    return 0;
}
