/*
 * libFuzzer target for the binary RPC codec (proto/proto.c).
 *
 * The input is read as a stream of frames, as a server or client reads a
 * connection: header decode, then the body decoder of the frame's opcode and
 * direction. Invariants checked on every input:
 *  - each body is copied to an exactly-sized heap buffer, so ASan reports any
 *    read past it; decoded strings and arrays lie inside the body;
 *  - a header that decodes re-encodes to the same 24 bytes; a refused one
 *    leaves the output untouched and gives a one-line reason; fatal errors
 *    (PROTO, TOO_BIG) end the stream, UNSUPPORTED skips the frame;
 *  - a body that decodes re-encodes (with the same opcode, flags and req_id)
 *    to exactly the input frame; a refused body leaves the output untouched;
 *  - QUERY: a lower max_items than n gives KVT_ERR_TOO_BIG; kind 2 (salted
 *    tokens) carries a non-empty cache salt inside the body, the other kinds
 *    none.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvt_proto_wr_t wr; /* reused across inputs: the fuzzer runs one thread */

static void check_in(const void *p, size_t len, const uint8_t *body, size_t body_len)
{
    if (len == 0)
        return;
    const uint8_t *q = p;
    CHECK(q >= body && len <= body_len && (size_t)(q - body) <= body_len - len);
}

static void check_str(kvt_proto_str_t s, const uint8_t *body, size_t len)
{
    CHECK(s.len <= KVT_PROTO_MAX_STR);
    check_in(s.p, s.len, body, len);
    CHECK(s.len == 0 || memchr(s.p, '\0', s.len) == NULL);
}

/* The frame just encoded into wr must equal the input frame. The request encoders write
 * flags 0: a request's ENGINE_KEYS (the caller's, set after encoding) is copied over first. */
static void check_same(const uint8_t *frame, size_t frame_len)
{
    CHECK(wr.len == frame_len);
    kvt_proto_hdr_t in, out;
    if (frame_len >= KVT_PROTO_HDR_SIZE) {
        kvt_proto_hdr_peek(frame, &in);
        kvt_proto_hdr_peek(wr.buf, &out);
        if (in.flags == KVT_PROTO_F_ENGINE_KEYS && out.flags == 0) {
            out.flags = in.flags;
            kvt_proto_hdr_encode(&out, wr.buf);
        }
    }
    CHECK(memcmp(wr.buf, frame, frame_len) == 0);
}

static void check_why(kvt_status_t st, const char *why)
{
    CHECK(st == KVT_ERR_INVAL || st == KVT_ERR_TOO_BIG);
    CHECK(why[0] != '\0' && strchr(why, '\n') == NULL);
}

static void fuzz_query_req(const kvt_proto_hdr_t *h, const uint8_t *body, const uint8_t *frame,
                           size_t frame_len)
{
    kvt_proto_query_t q, before;
    memset(&q, 0xA5, sizeof(q));
    before = q;
    char why[256] = "";
    kvt_status_t st = kvt_proto_query_decode(body, h->body_len, UINT32_MAX, &q, why, sizeof(why));
    if (st != KVT_OK) {
        check_why(st, why);
        CHECK(memcmp(&q, &before, sizeof(q)) == 0);
        return;
    }
    check_str(q.model, body, h->body_len);
    check_str(q.lora, body, h->body_len);
    CHECK(q.model.len > 0);
    bool by_tokens = kvt_proto_query_kind_tokens(q.kind);
    CHECK(by_tokens || q.kind == KVT_PROTO_Q_KEYS);
    check_str(q.salt, body, h->body_len);
    CHECK((q.kind == KVT_PROTO_Q_TOKENS_SALTED) == (q.salt.len > 0));
    size_t width = by_tokens ? 4 : 8;
    check_in(q.values, (size_t)q.n * width, body, h->body_len);
    check_in(q.pods, q.pods_len, body, h->body_len);
    if (q.n > 0)
        CHECK(kvt_proto_query_decode(body, h->body_len, q.n - 1, &before, NULL, 0) ==
              KVT_ERR_TOO_BIG);

    uint32_t *toks = NULL;
    uint64_t *keys = NULL;
    kvt_proto_str_t *pods = malloc((q.npods > 0 ? q.npods : 1) * sizeof(*pods));
    CHECK(pods != NULL);
    if (by_tokens) {
        toks = malloc((q.n > 0 ? q.n : 1) * sizeof(*toks));
        CHECK(toks != NULL);
        for (uint32_t i = 0; i < q.n; i++)
            toks[i] = kvt_proto_query_token(&q, i);
    } else {
        keys = malloc((q.n > 0 ? q.n : 1) * sizeof(*keys));
        CHECK(keys != NULL);
        for (uint32_t i = 0; i < q.n; i++)
            keys[i] = kvt_proto_query_key(&q, i);
    }
    kvt_proto_rd_t r;
    kvt_proto_rd_init(&r, q.pods, q.pods_len);
    for (uint32_t i = 0; i < q.npods; i++) {
        pods[i] = kvt_proto_rd_str(&r);
        CHECK(!r.bad && pods[i].len > 0);
        check_str(pods[i], body, h->body_len);
    }
    CHECK(kvt_proto_rd_done(&r));

    kvt_proto_query_req_t req = {q.model, q.lora, q.kind, q.n, toks, keys, q.npods, pods, q.salt};
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_query_req_encode(&wr, h->req_id, &req) == KVT_OK);
    check_same(frame, frame_len);
    free(toks);
    free(keys);
    free(pods);
}

static void fuzz_query_ans(const kvt_proto_hdr_t *h, const uint8_t *body, const uint8_t *frame,
                           size_t frame_len)
{
    kvt_proto_query_ans_t a, before;
    memset(&a, 0x5A, sizeof(a));
    before = a;
    char why[256] = "";
    kvt_status_t st = kvt_proto_query_ans_decode(body, h->body_len, &a, why, sizeof(why));
    if (st != KVT_OK) {
        check_why(st, why);
        CHECK(memcmp(&a, &before, sizeof(a)) == 0);
        return;
    }
    check_in(a.pods, a.pods_len, body, h->body_len);
    kvt_proto_query_ans_enc_t e;
    kvt_proto_wr_reset(&wr);
    kvt_proto_query_ans_begin(&wr, h->req_id, a.block_size, a.num_blocks, &e);
    kvt_proto_rd_t r;
    kvt_proto_rd_init(&r, a.pods, a.pods_len);
    for (uint32_t i = 0; i < a.npods; i++) {
        kvt_proto_pod_ans_t pod;
        CHECK(kvt_proto_query_ans_next(&r, &pod));
        check_str(pod.pod, body, h->body_len);
        CHECK(pod.pod.len > 0);
        kvt_proto_query_ans_add(&wr, &e, &pod);
    }
    kvt_proto_pod_ans_t extra;
    CHECK(!kvt_proto_query_ans_next(&r, &extra));
    CHECK(kvt_proto_rd_done(&r));
    CHECK(kvt_proto_query_ans_end(&wr, &e) == KVT_OK);
    check_same(frame, frame_len);
}

static void fuzz_body(const kvt_proto_hdr_t *h, const uint8_t *body, const uint8_t *frame,
                      size_t frame_len)
{
    char why[256] = "";
    kvt_status_t st;
    bool answer = (h->flags & KVT_PROTO_F_RESPONSE) != 0;

    if ((h->flags & KVT_PROTO_F_ERROR) != 0) {
        kvt_proto_err_t e, before;
        memset(&e, 0x77, sizeof(e));
        before = e;
        st = kvt_proto_err_decode(body, h->body_len, &e, why, sizeof(why));
        if (st != KVT_OK) {
            check_why(st, why);
            CHECK(memcmp(&e, &before, sizeof(e)) == 0);
            return;
        }
        check_str(e.msg, body, h->body_len);
        CHECK(e.status < 0 && e.http >= 400 && e.http <= 599);
        kvt_proto_wr_reset(&wr);
        CHECK(kvt_proto_err_encode(&wr, h->op, h->req_id, (kvt_status_t)e.status, e.http, e.msg.p,
                                   e.msg.len) == KVT_OK);
        check_same(frame, frame_len);
        return;
    }

    switch (h->op) {
    case KVT_PROTO_OP_HELLO:
        if (!answer) {
            kvt_proto_hello_req_t hr;
            st = kvt_proto_hello_req_decode(body, h->body_len, &hr, why, sizeof(why));
            if (st != KVT_OK) {
                check_why(st, why);
                return;
            }
            check_str(hr.token, body, h->body_len);
            kvt_proto_wr_reset(&wr);
            CHECK(kvt_proto_hello_req_encode(&wr, h->req_id, &hr) == KVT_OK);
        } else {
            kvt_proto_hello_ans_t ha;
            st = kvt_proto_hello_ans_decode(body, h->body_len, &ha, why, sizeof(why));
            if (st != KVT_OK) {
                check_why(st, why);
                return;
            }
            kvt_proto_wr_reset(&wr);
            CHECK(kvt_proto_hello_ans_encode(&wr, h->req_id, &ha) == KVT_OK);
        }
        check_same(frame, frame_len);
        return;
    case KVT_PROTO_OP_QUERY:
        if (answer)
            fuzz_query_ans(h, body, frame, frame_len);
        else
            fuzz_query_req(h, body, frame, frame_len);
        return;
    case KVT_PROTO_OP_ENGINE_DROP:
    case KVT_PROTO_OP_MODEL_DROP:
        if (!answer) {
            bool model = h->op == KVT_PROTO_OP_MODEL_DROP;
            kvt_proto_str_t name;
            st = model ? kvt_proto_model_drop_req_decode(body, h->body_len, &name, why, sizeof(why))
                       : kvt_proto_drop_req_decode(body, h->body_len, &name, why, sizeof(why));
            if (st != KVT_OK) {
                check_why(st, why);
                return;
            }
            check_str(name, body, h->body_len);
            kvt_proto_wr_reset(&wr);
            CHECK((model ? kvt_proto_model_drop_req_encode(&wr, h->req_id, name)
                         : kvt_proto_drop_req_encode(&wr, h->req_id, name)) == KVT_OK);
            check_same(frame, frame_len);
            return;
        }
        break; /* JSON answer: opaque */
    default: break;
    }
    /* Opaque bodies (EVENTS, STATS, PING, JSON answers): a raw frame re-encodes exactly. */
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_raw_encode(&wr, h->op, h->flags, h->req_id, body, h->body_len) == KVT_OK);
    check_same(frame, frame_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The first byte picks the peer's frame limit, so TOO_BIG paths get exercised. */
    uint32_t max_body = KVT_PROTO_MAX_BODY_DEFAULT;
    if (size > 0 && data[0] < 32) {
        max_body = data[0] * 8u;
        data++;
        size--;
    }

    size_t off = 0;
    while (size - off >= KVT_PROTO_HDR_SIZE) {
        uint8_t hdr[KVT_PROTO_HDR_SIZE];
        memcpy(hdr, data + off, sizeof(hdr));
        kvt_proto_hdr_t h, before;
        memset(&h, 0xC3, sizeof(h));
        before = h;
        char why[256] = "";
        kvt_status_t st = kvt_proto_hdr_check(hdr, max_body, &h, why, sizeof(why));
        CHECK(kvt_proto_hdr_decode(hdr, max_body, &before) == st);
        if (st != KVT_OK) {
            CHECK(why[0] != '\0' && strchr(why, '\n') == NULL);
            CHECK(st == KVT_ERR_PROTO || st == KVT_ERR_TOO_BIG || st == KVT_ERR_UNSUPPORTED);
            if (st != KVT_ERR_UNSUPPORTED)
                break; /* connection-fatal */
            kvt_proto_hdr_peek(hdr, &h);
            CHECK(h.body_len <= max_body);
            CHECK(!kvt_proto_op_known(h.op));
            if (size - off - KVT_PROTO_HDR_SIZE < h.body_len)
                break;
            off += KVT_PROTO_HDR_SIZE + h.body_len;
            continue;
        }
        CHECK(h.body_len <= max_body && kvt_proto_op_known(h.op));
        uint8_t again[KVT_PROTO_HDR_SIZE];
        kvt_proto_hdr_encode(&h, again);
        CHECK(memcmp(again, hdr, sizeof(hdr)) == 0);
        if (size - off - KVT_PROTO_HDR_SIZE < h.body_len)
            break; /* the rest has not arrived */

        size_t frame_len = KVT_PROTO_HDR_SIZE + h.body_len;
        uint8_t *frame = malloc(frame_len);
        CHECK(frame != NULL);
        memcpy(frame, data + off, frame_len);
        /* Exact-size body copy: one byte past it is a heap overflow ASan reports. */
        uint8_t *body = malloc(h.body_len > 0 ? h.body_len : 1);
        CHECK(body != NULL);
        memcpy(body, frame + KVT_PROTO_HDR_SIZE, h.body_len);
        fuzz_body(&h, body, frame, frame_len);
        free(body);
        free(frame);
        off += frame_len;
    }
    return 0;
}
