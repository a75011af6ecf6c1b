/*
 * libFuzzer target for the POST /v1/transfer body (server/xfer_json.c).
 *
 * Input: an optional first byte below 0x09, the caller's key capacity (1..9;
 * else half the input's length, plus one: more than any body can hold), then
 * the body. Invariants:
 *  - a refused body gives KVT_ERR_PARSE, _INVAL, _RANGE or _TOO_BIG with one
 *    line of text, and the same status without room for text;
 *  - a decoded body keeps its rules (a peer kvt_hostport_split() takes, a
 *    model, 1..capacity keys, no NUL in a string), and its canonical text
 *    (kvt_srv_xfer_body_json()) decodes to the same and writes the same text
 *    again; the same request goes through a TRANSFER frame and back unchanged;
 *  - an answer made of its keys is one JSON value.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hostport.h"
#include "server/xfer_json.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvt_jbuf_t canon, again;
static kvt_proto_wr_t wr;

static bool same_body(const kvt_srv_xfer_body_t *a, const kvt_srv_xfer_body_t *b,
                      const uint64_t *ka, const uint64_t *kb)
{
    return a->peer_len == b->peer_len && a->model_len == b->model_len &&
           a->lora_len == b->lora_len && strcmp(a->peer, b->peer) == 0 &&
           strcmp(a->model, b->model) == 0 && strcmp(a->lora, b->lora) == 0 &&
           a->direction == b->direction && a->stream == b->stream &&
           a->timeout_ms == b->timeout_ms && a->n == b->n &&
           memcmp(ka, kb, a->n * sizeof(*ka)) == 0;
}

/* The decoded request as a TRANSFER frame, and back. */
static void through_frame(const kvt_srv_xfer_body_t *x, const uint64_t *keys, uint64_t *out)
{
    kvt_proto_transfer_req_t t = {.peer = {x->peer, (uint16_t)x->peer_len},
                                  .model = {x->model, (uint16_t)x->model_len},
                                  .lora = {x->lora, (uint16_t)x->lora_len},
                                  .direction = x->direction,
                                  .flags = x->stream ? KVT_PROTO_XFER_STREAM : 0,
                                  .timeout_ms = x->timeout_ms,
                                  .n = (uint32_t)x->n};
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_transfer_req_encode(&wr, 7, &t, keys) == KVT_OK);
    kvt_proto_transfer_req_t back;
    CHECK(kvt_proto_transfer_req_decode(wr.buf + KVT_PROTO_HDR_SIZE, wr.len - KVT_PROTO_HDR_SIZE,
                                        out, (uint32_t)x->n, &back, NULL, 0) == KVT_OK);
    CHECK(back.n == x->n && back.direction == x->direction && back.timeout_ms == x->timeout_ms);
    CHECK(back.flags == t.flags);
    CHECK(back.peer.len == x->peer_len && memcmp(back.peer.p, x->peer, x->peer_len) == 0);
    CHECK(memcmp(out, keys, x->n * sizeof(*keys)) == 0);
}

/* An answer of @keys, split among the lists by value, is one JSON value. */
static void answer_is_json(const uint64_t *keys, size_t n, uint64_t *l0, uint64_t *l1,
                           kvt_proto_xfer_failed_t *l2)
{
    kvt_proto_transfer_ans_t a = {.bytes = n > 0 ? keys[0] : 0, .ns = n > 1 ? keys[1] : 0};
    for (size_t i = 0; i < n; i++) {
        if (keys[i] % 3 == 0)
            l0[a.ntransferred++] = keys[i];
        else if (keys[i] % 3 == 1)
            l1[a.nmissing++] = keys[i];
        else
            l2[a.nfailed++] = (kvt_proto_xfer_failed_t){keys[i], (uint8_t)(keys[i] >> 56)};
    }
    a.transferred = l0;
    a.missing = l1;
    a.failed = l2;
    kvt_jbuf_reset(&again);
    kvt_srv_xfer_answer_json(&again, &a);
    CHECK(!again.oom);
    kvt_json_t j;
    kvt_json_init(&j, again.buf, again.len);
    CHECK(kvt_json_skip(&j) == KVT_OK && kvt_json_end(&j) == KVT_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t cap;
    if (size > 0 && data[0] < 0x09) {
        cap = (size_t)data[0] + 1;
        data++;
        size--;
    } else {
        cap = size / 2 + 1;
    }
    char *body = fuzz_copy(data, size);
    uint64_t *keys = malloc(cap * sizeof(*keys)), *k2 = malloc(cap * sizeof(*k2));
    uint64_t *k3 = malloc(cap * sizeof(*k3));
    kvt_proto_xfer_failed_t *f = malloc(cap * sizeof(*f));
    kvt_srv_xfer_body_t *x = malloc(sizeof(*x)), *y = malloc(sizeof(*y));
    CHECK(body != NULL && keys != NULL && k2 != NULL && k3 != NULL && f != NULL && x != NULL &&
          y != NULL);

    char err[256] = "";
    kvt_status_t st = kvt_srv_xfer_decode(body, size, keys, cap, x, err, sizeof(err));
    CHECK(kvt_srv_xfer_decode(body, size, k2, cap, y, NULL, 0) == st);
    if (st != KVT_OK) {
        CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_INVAL || st == KVT_ERR_RANGE ||
              st == KVT_ERR_TOO_BIG);
        CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
    } else {
        char host[KVT_PROTO_MAX_STR + 1];
        uint16_t port;
        CHECK(kvt_hostport_split(x->peer, host, sizeof(host), &port, false, NULL, 0) == KVT_OK);
        CHECK(x->peer_len == strlen(x->peer) && x->model_len == strlen(x->model) &&
              x->lora_len == strlen(x->lora) && x->model_len > 0);
        CHECK(x->n >= 1 && x->n <= cap && x->direction <= KVT_PROTO_XFER_PUSH);
        CHECK(x->timeout_ms <= KVT_PROTO_XFER_MAX_TIMEOUT_MS);
        /* the canonical text: decodes the same, writes the same */
        kvt_jbuf_reset(&canon);
        kvt_srv_xfer_body_json(&canon, x, keys);
        CHECK(!canon.oom);
        CHECK(kvt_srv_xfer_decode(canon.buf, canon.len, k2, cap, y, NULL, 0) == KVT_OK);
        CHECK(same_body(x, y, keys, k2));
        kvt_jbuf_reset(&again);
        kvt_srv_xfer_body_json(&again, y, k2);
        CHECK(again.len == canon.len && memcmp(again.buf, canon.buf, canon.len) == 0);
        through_frame(x, keys, k2);
        answer_is_json(keys, x->n, k2, k3, f);
    }
    free(body);
    free(keys);
    free(k2);
    free(k3);
    free(f);
    free(x);
    free(y);
    return 0;
}
