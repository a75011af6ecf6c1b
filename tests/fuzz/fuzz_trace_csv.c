/*
 * libFuzzer target for the Azure CSV reader (bench/trace_csv.c).
 *
 * Invariants on every input: the reader never reads past len (the input is
 * copied to an exactly-sized buffer); on success no request has hash ids or
 * a session, the first starts at 0 ms, and writing the trace back (each
 * timestamp as a date that many milliseconds after 0000-01-01) and parsing it
 * again gives the same trace; on failure the status is a known one, nothing
 * is returned, and the message is one line that names a line.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The civil date @days after 0000-03-01 (proleptic Gregorian), as year, month, day. */
static void civil(int64_t days, int64_t *y_p, unsigned *m_p, unsigned *d_p)
{
    int64_t era = days / 146097;
    int64_t doe = days - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d_p = (unsigned)(doy - (153 * mp + 2) / 5 + 1);
    *m_p = (unsigned)(mp < 10 ? mp + 3 : mp - 9);
    *y_p = era * 400 + yoe + (*m_p <= 2);
}

/* Writes @t back as CSV; a malloc'ed buffer and its length. */
static char *serialize(const kvt_trace_t *t, size_t *len_p)
{
    size_t cap = 64 + t->nreqs * 64, len = 0;
    char *out = malloc(cap);
    CHECK(out != NULL);
    len += (size_t)snprintf(out, cap, "TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *r = &t->reqs[i];
        /* 0000-01-01 is 60 days before 0000-03-01 (a leap year) */
        uint64_t ms = r->timestamp_ms, secs = ms / 1000;
        int64_t y;
        unsigned mo, d;
        civil((int64_t)(secs / 86400) - 60, &y, &mo, &d);
        if (secs / 86400 < 60) { /* January and February of year 0 */
            y = 0;
            mo = secs / 86400 < 31 ? 1 : 2;
            d = (unsigned)(secs / 86400 - (mo == 1 ? 0 : 31) + 1);
        }
        len += (size_t)snprintf(
            out + len, cap - len,
            "%04" PRId64 "-%02u-%02u %02u:%02u:%02u.%03u,%" PRIu32 ",%" PRIu32 "\n", y, mo, d,
            (unsigned)(secs / 3600 % 24), (unsigned)(secs / 60 % 60), (unsigned)(secs % 60),
            (unsigned)(ms % 1000), r->input_length, r->output_length);
        CHECK(len < cap);
    }
    *len_p = len;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    CHECK(buf != NULL);
    memcpy(buf, data, size);
    kvt_trace_t *t = NULL;
    char err[256];
    kvt_status_t st = kvt_trace_parse_csv(buf, size, &t, err, sizeof(err));
    free(buf);
    if (st != KVT_OK) {
        CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_NO_MEM);
        CHECK(t == NULL);
        CHECK(strchr(err, '\n') == NULL);
        CHECK(st != KVT_ERR_PARSE || strncmp(err, "line ", 5) == 0);
        return 0;
    }
    CHECK(t->nids == 0 && t->ids == NULL && t->max_blocks == 0);
    CHECK(t->nreqs == 0 || t->reqs[0].timestamp_ms == 0);
    for (size_t i = 0; i < t->nreqs; i++)
        CHECK(t->reqs[i].nblocks == 0 && t->reqs[i].hash_ids == NULL && t->reqs[i].session == 0);
    size_t len;
    char *again = serialize(t, &len);
    kvt_trace_t *t2 = NULL;
    st = kvt_trace_parse_csv(again, len, &t2, err, sizeof(err));
    if (st != KVT_OK)
        fprintf(stderr, "re-parse: %s\n", err);
    CHECK(st == KVT_OK);
    CHECK(t2->nreqs == t->nreqs);
    for (size_t i = 0; i < t->nreqs; i++) {
        CHECK(t2->reqs[i].timestamp_ms == t->reqs[i].timestamp_ms);
        CHECK(t2->reqs[i].input_length == t->reqs[i].input_length);
        CHECK(t2->reqs[i].output_length == t->reqs[i].output_length);
    }
    kvt_trace_free(t2);
    free(again);
    kvt_trace_free(t);
    return 0;
}
