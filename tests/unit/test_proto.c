/* proto/: the binary RPC codec, round trips and every rejection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/support/rng.h"

/* ---- helpers -------------------------------------------------------------------------------- */

/* Started by each randomized test on its own stream (tests/support/rng.h). */
static kvt_rng_t g_rng;

static uint64_t rnd(void)
{
    return kvt_rng_next(&g_rng);
}

static uint32_t rnd_below(uint32_t n)
{
    return (uint32_t)kvt_rng_below(&g_rng, n);
}

static kvt_proto_str_t S(const char *s)
{
    kvt_proto_str_t r = {s, (uint16_t)strlen(s)};
    return r;
}

static int str_eq(kvt_proto_str_t a, const char *b, size_t blen)
{
    return a.len == blen && (blen == 0 || memcmp(a.p, b, blen) == 0);
}

/* A naive byte builder, independent of the codec's writer: the reference encoding. */
typedef struct ref {
    uint8_t b[1 << 16];
    size_t n;
} ref_t;

static void ref_u8(ref_t *r, uint8_t v)
{
    assert_true(r->n < sizeof(r->b));
    r->b[r->n++] = v;
}

/* @bytes little-endian bytes of @v; beyond 8 bytes, zeros (for runs of zero fields). */
static void ref_le(ref_t *r, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        ref_u8(r, i < 8 ? (uint8_t)(v >> (8 * i)) : 0);
}

static void ref_str(ref_t *r, const char *p, size_t len)
{
    ref_le(r, len, 2);
    for (size_t i = 0; i < len; i++)
        ref_u8(r, (uint8_t)p[i]);
}

static void ref_f64(ref_t *r, double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    ref_le(r, u, 8);
}

static void ref_hdr(ref_t *r, uint8_t op, uint16_t flags, uint64_t req_id, uint32_t body_len)
{
    ref_u8(r, 'K');
    ref_u8(r, 'V');
    ref_u8(r, 'T');
    ref_u8(r, '1');
    ref_u8(r, KVT_PROTO_VERSION);
    ref_u8(r, op);
    ref_le(r, flags, 2);
    ref_le(r, req_id, 8);
    ref_le(r, body_len, 4);
    ref_le(r, 0, 4);
}

/* Patches the body length of the frame at @off of @r (ends at r->n). */
static void ref_fix_len(ref_t *r, size_t off)
{
    uint32_t len = (uint32_t)(r->n - off - KVT_PROTO_HDR_SIZE);
    for (int i = 0; i < 4; i++)
        r->b[off + 16 + i] = (uint8_t)(len >> (8 * i));
}

/* An exact-size heap copy so that ASan catches a read one byte past @len. */
static uint8_t *dup_exact(const uint8_t *p, size_t len)
{
    uint8_t *d = malloc(len > 0 ? len : 1);
    assert_non_null(d);
    if (len > 0)
        memcpy(d, p, len);
    return d;
}

/* ---- header --------------------------------------------------------------------------------- */

static void make_hdr(uint8_t *buf, uint8_t op, uint16_t flags, uint64_t req_id, uint32_t len)
{
    kvt_proto_hdr_t h = {KVT_PROTO_VERSION, op, flags, req_id, len};
    kvt_proto_hdr_encode(&h, buf);
}

static void expect_hdr_err(const uint8_t *buf, uint32_t max_body, kvt_status_t want,
                           const char *why_part)
{
    kvt_proto_hdr_t h;
    memset(&h, 0xAB, sizeof(h));
    kvt_proto_hdr_t before = h;
    char why[256] = "";

    assert_int_equal(kvt_proto_hdr_check(buf, max_body, &h, why, sizeof(why)), want);
    assert_memory_equal(&h, &before, sizeof(h));
    assert_true(why[0] != '\0');
    if (strstr(why, why_part) == NULL)
        fail_msg("reason \"%s\" does not mention \"%s\"", why, why_part);
    /* a buffer too small for the reason gets its start, NUL-terminated */
    char small[8];
    memset(small, 'x', sizeof(small));
    assert_int_equal(kvt_proto_hdr_check(buf, max_body, &h, small, sizeof(small)), want);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    assert_memory_equal(small, why, sizeof(small) - 1);
    assert_int_equal(kvt_proto_hdr_check(buf, max_body, &h, NULL, 0), want);
    assert_int_equal(kvt_proto_hdr_decode(buf, max_body, &h), want);
    assert_memory_equal(&h, &before, sizeof(h));
}

static void test_hdr_roundtrip(void **state)
{
    (void)state;
    uint8_t buf[KVT_PROTO_HDR_SIZE];
    kvt_proto_hdr_t in = {KVT_PROTO_VERSION, KVT_PROTO_OP_QUERY, KVT_PROTO_F_RESPONSE,
                          0x0102030405060708ull, 0x00A0B0C0u & (KVT_PROTO_MAX_BODY_LIMIT - 1)};
    kvt_proto_hdr_t out;
    char why[16] = "unset";

    kvt_proto_hdr_encode(&in, buf);
    static const uint8_t magic[4] = {'K', 'V', 'T', '1'};
    assert_memory_equal(buf, magic, 4);
    assert_int_equal(buf[4], 1);
    assert_int_equal(buf[5], 0x10);
    assert_int_equal(buf[6], 1);
    assert_int_equal(buf[7], 0);
    assert_int_equal(buf[8], 0x08);
    assert_int_equal(buf[15], 0x01);
    assert_int_equal(buf[20] | buf[21] | buf[22] | buf[23], 0);
    assert_int_equal(kvt_proto_hdr_check(buf, KVT_PROTO_MAX_BODY_LIMIT, &out, why, sizeof(why)),
                     KVT_OK);
    assert_string_equal(why, "unset"); /* untouched on success */
    assert_int_equal(out.version, in.version);
    assert_int_equal(out.op, in.op);
    assert_int_equal(out.flags, in.flags);
    assert_true(out.req_id == in.req_id);
    assert_int_equal(out.body_len, in.body_len);

    /* Every opcode and every legal flag combination. */
    static const uint8_t ops[] = {
        KVT_PROTO_OP_HELLO,       KVT_PROTO_OP_PING,       KVT_PROTO_OP_QUERY, KVT_PROTO_OP_EVENTS,
        KVT_PROTO_OP_ENGINE_DROP, KVT_PROTO_OP_ENGINE_ADD, KVT_PROTO_OP_STATS};
    static const uint16_t flags[] = {0, KVT_PROTO_F_RESPONSE,
                                     KVT_PROTO_F_RESPONSE | KVT_PROTO_F_ERROR,
                                     KVT_PROTO_F_ENGINE_KEYS};
    for (size_t i = 0; i < sizeof(ops); i++) {
        assert_true(kvt_proto_op_known(ops[i]));
        assert_string_not_equal(kvt_proto_op_name(ops[i]), "UNKNOWN");
        for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]); f++) {
            make_hdr(buf, ops[i], flags[f], UINT64_MAX - i, 0);
            assert_int_equal(kvt_proto_hdr_decode(buf, 0, &out), KVT_OK);
            assert_int_equal(out.op, ops[i]);
            assert_int_equal(out.flags, flags[f]);
            assert_true(out.req_id == UINT64_MAX - i);
        }
    }
    assert_string_equal(kvt_proto_op_name(KVT_PROTO_OP_QUERY), "QUERY");
    assert_string_equal(kvt_proto_op_name(0x77), "UNKNOWN");
    assert_true(kvt_proto_op_mutating(KVT_PROTO_OP_EVENTS));
    assert_true(kvt_proto_op_mutating(KVT_PROTO_OP_ENGINE_DROP));
    assert_false(kvt_proto_op_mutating(KVT_PROTO_OP_QUERY));

    /* body_len exactly at the limit passes; max_body is clamped to the hard limit. */
    make_hdr(buf, KVT_PROTO_OP_EVENTS, 0, 1, 1000);
    assert_int_equal(kvt_proto_hdr_decode(buf, 1000, &out), KVT_OK);
    make_hdr(buf, KVT_PROTO_OP_EVENTS, 0, 1, KVT_PROTO_MAX_BODY_LIMIT);
    assert_int_equal(kvt_proto_hdr_decode(buf, UINT32_MAX, &out), KVT_OK);
    assert_int_equal(out.body_len, KVT_PROTO_MAX_BODY_LIMIT);
}

static void test_hdr_rejects(void **state)
{
    (void)state;
    uint8_t buf[KVT_PROTO_HDR_SIZE];

    for (int i = 0; i < 4; i++) {
        make_hdr(buf, KVT_PROTO_OP_PING, 0, 1, 0);
        buf[i] ^= 0x20;
        expect_hdr_err(buf, 100, KVT_ERR_PROTO, "magic");
    }
    for (int v = 0; v < 256; v++) {
        if (v == KVT_PROTO_VERSION)
            continue;
        make_hdr(buf, KVT_PROTO_OP_PING, 0, 1, 0);
        buf[4] = (uint8_t)v;
        expect_hdr_err(buf, 100, KVT_ERR_PROTO, "version");
    }
    for (int bit = 3; bit < 16; bit++) { /* bit 2 is KVT_PROTO_F_ENGINE_KEYS */
        make_hdr(buf, KVT_PROTO_OP_PING, (uint16_t)(1u << bit), 1, 0);
        expect_hdr_err(buf, 100, KVT_ERR_PROTO, "flag");
    }
    make_hdr(buf, KVT_PROTO_OP_PING, KVT_PROTO_F_ERROR, 1, 0);
    expect_hdr_err(buf, 100, KVT_ERR_PROTO, "flag");
    make_hdr(buf, KVT_PROTO_OP_LOOKUP, KVT_PROTO_F_RESPONSE | KVT_PROTO_F_ENGINE_KEYS, 1, 0);
    expect_hdr_err(buf, 100, KVT_ERR_PROTO, "engine-keys flag on an answer");
    for (int i = 20; i < 24; i++) {
        make_hdr(buf, KVT_PROTO_OP_PING, 0, 1, 0);
        buf[i] = 1;
        expect_hdr_err(buf, 100, KVT_ERR_PROTO, "reserved");
    }
    make_hdr(buf, KVT_PROTO_OP_EVENTS, 0, 1, 101);
    expect_hdr_err(buf, 100, KVT_ERR_TOO_BIG, "body");
    make_hdr(buf, KVT_PROTO_OP_EVENTS, 0, 1, KVT_PROTO_MAX_BODY_LIMIT + 1);
    expect_hdr_err(buf, UINT32_MAX, KVT_ERR_TOO_BIG, "body");
    make_hdr(buf, KVT_PROTO_OP_EVENTS, 0, 1, UINT32_MAX);
    expect_hdr_err(buf, UINT32_MAX, KVT_ERR_TOO_BIG, "body");

    /* Unknown opcodes: per-request (UNSUPPORTED), after the fatal checks. */
    for (int op = 0; op < 256; op++) {
        if (kvt_proto_op_known((uint8_t)op))
            continue;
        make_hdr(buf, (uint8_t)op, 0, 42, 7);
        expect_hdr_err(buf, 100, KVT_ERR_UNSUPPORTED, "opcode");
        kvt_proto_hdr_t peek;
        kvt_proto_hdr_peek(buf, &peek);
        assert_true(peek.req_id == 42);
        assert_int_equal(peek.body_len, 7);
        assert_int_equal(peek.op, op);
        /* ... but an oversized body is still fatal. */
        make_hdr(buf, (uint8_t)op, 0, 42, 101);
        expect_hdr_err(buf, 100, KVT_ERR_TOO_BIG, "body");
    }
    /* Order: magic first even when everything else is wrong too. */
    memset(buf, 0xFF, sizeof(buf));
    expect_hdr_err(buf, 100, KVT_ERR_PROTO, "magic");
}

static void test_http_status(void **state)
{
    (void)state;
    assert_int_equal(kvt_proto_http_status(KVT_ERR_INVAL), 400);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_PARSE), 400);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_NOT_FOUND), 404);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_TOO_BIG), 413);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_LIMIT), 503); /* the server's limits */
    assert_int_equal(kvt_proto_http_status(KVT_ERR_EXISTS), 409);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_STALE), 412);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_NO_SPACE), 503);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_UNSUPPORTED), 501);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_NO_MEM), 503);
    assert_int_equal(kvt_proto_http_status(KVT_ERR_INTERNAL), 500);
}

/* ---- reader and writer ---------------------------------------------------------------------- */

static void test_reader(void **state)
{
    (void)state;
    static const uint8_t data[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09,
                                   0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11};
    kvt_proto_rd_t r;

    kvt_proto_rd_init(&r, data, sizeof(data));
    assert_int_equal(kvt_proto_rd_u8(&r), 0x01);
    assert_int_equal(kvt_proto_rd_u16(&r), 0x0302);
    assert_int_equal(kvt_proto_rd_u32(&r), 0x07060504);
    assert_true(kvt_proto_rd_u64(&r) == 0x0F0E0D0C0B0A0908ull);
    assert_int_equal(kvt_proto_rd_left(&r), 2);
    assert_false(kvt_proto_rd_done(&r));
    assert_int_equal(kvt_proto_rd_u32(&r), 0); /* underflow */
    assert_true(r.bad);
    assert_int_equal(kvt_proto_rd_left(&r), 0);
    assert_int_equal(kvt_proto_rd_u8(&r), 0); /* sticky */
    assert_null(kvt_proto_rd_raw(&r, 0));
    assert_false(kvt_proto_rd_done(&r));

    /* Empty and NULL bodies. */
    kvt_proto_rd_init(&r, NULL, 0);
    assert_true(kvt_proto_rd_done(&r));
    assert_non_null(kvt_proto_rd_raw(&r, 0));
    assert_int_equal(kvt_proto_rd_u8(&r), 0);
    assert_true(r.bad);

    /* i32 and f64 */
    static const uint8_t neg[] = {0x9C, 0xFF, 0xFF, 0xFF};
    kvt_proto_rd_init(&r, neg, 4);
    assert_int_equal(kvt_proto_rd_i32(&r), -100);
    assert_true(kvt_proto_rd_done(&r));
    uint8_t f[8];
    double d = -1.5;
    uint64_t u;
    memcpy(&u, &d, 8);
    for (int i = 0; i < 8; i++)
        f[i] = (uint8_t)(u >> (8 * i));
    kvt_proto_rd_init(&r, f, 8);
    assert_true(kvt_proto_rd_f64(&r) == -1.5);

    /* Strings: ok, empty, truncated, too long, NUL. */
    uint8_t s[300];
    s[0] = 3;
    s[1] = 0;
    memcpy(s + 2, "abc", 3);
    kvt_proto_rd_init(&r, s, 5);
    kvt_proto_str_t str = kvt_proto_rd_str(&r);
    assert_true(str_eq(str, "abc", 3));
    assert_true(kvt_proto_rd_done(&r));
    kvt_proto_rd_init(&r, s, 4);
    str = kvt_proto_rd_str(&r);
    assert_true(r.bad);
    assert_int_equal(str.len, 0);
    assert_true(r.p == s); /* a failed read does not advance */
    s[0] = 0;
    kvt_proto_rd_init(&r, s, 2);
    str = kvt_proto_rd_str(&r);
    assert_true(kvt_proto_rd_done(&r));
    assert_int_equal(str.len, 0);
    s[0] = 0;
    s[1] = 1; /* 256 */
    memset(s + 2, 'x', 256);
    kvt_proto_rd_init(&r, s, 258);
    kvt_proto_rd_str(&r);
    assert_true(r.bad);
    s[0] = 255;
    s[1] = 0;
    kvt_proto_rd_init(&r, s, 257);
    str = kvt_proto_rd_str(&r);
    assert_false(r.bad);
    assert_int_equal(str.len, 255);
    s[100] = 0;
    kvt_proto_rd_init(&r, s, 257);
    kvt_proto_rd_str(&r);
    assert_true(r.bad);
}

static void test_writer(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);

    kvt_proto_wr_u8(&w, 0x01);
    kvt_proto_wr_u16(&w, 0x0302);
    kvt_proto_wr_u32(&w, 0x07060504);
    kvt_proto_wr_u64(&w, 0x0F0E0D0C0B0A0908ull);
    kvt_proto_wr_i32(&w, -1);
    static const uint8_t want[] = {1,  2,  3,  4,  5,  6,    7,    8,    9,   10,
                                   11, 12, 13, 14, 15, 0xFF, 0xFF, 0xFF, 0xFF};
    assert_int_equal(w.len, sizeof(want));
    assert_memory_equal(w.buf, want, sizeof(want));
    kvt_proto_wr_consume(&w, 3);
    assert_int_equal(w.len, sizeof(want) - 3);
    assert_memory_equal(w.buf, want + 3, sizeof(want) - 3);
    kvt_proto_wr_consume(&w, 1000);
    assert_int_equal(w.len, 0);

    /* Two pipelined frames, then a bad one that disappears again. */
    size_t a = kvt_proto_wr_frame_begin(&w, KVT_PROTO_OP_PING, 0, 1);
    assert_int_equal(kvt_proto_wr_frame_end(&w, a), KVT_OK);
    size_t b = kvt_proto_wr_frame_begin(&w, KVT_PROTO_OP_EVENTS, 0, 2);
    kvt_proto_wr_raw(&w, "{}", 2);
    assert_int_equal(kvt_proto_wr_frame_end(&w, b), KVT_OK);
    assert_int_equal(b, KVT_PROTO_HDR_SIZE);
    assert_int_equal(w.len, 2 * KVT_PROTO_HDR_SIZE + 2);
    size_t c = kvt_proto_wr_frame_begin(&w, KVT_PROTO_OP_ENGINE_DROP, 0, 3);
    char big[300];
    memset(big, 'p', sizeof(big));
    kvt_proto_wr_str(&w, big, 256);
    assert_true(w.bad);
    assert_int_equal(kvt_proto_wr_frame_end(&w, c), KVT_ERR_TOO_BIG);
    assert_false(w.bad);
    assert_int_equal(w.len, c);
    kvt_proto_wr_str(&w, "a\0b", 3); /* NUL inside a str */
    assert_true(w.bad);
    kvt_proto_wr_reset(&w);
    assert_false(w.bad);
    assert_int_equal(w.len, 0);

    kvt_proto_hdr_t h;
    a = kvt_proto_wr_frame_begin(&w, KVT_PROTO_OP_EVENTS, 0, 9);
    kvt_proto_wr_raw(&w, big, 300);
    assert_int_equal(kvt_proto_wr_frame_end(&w, a), KVT_OK);
    assert_int_equal(kvt_proto_hdr_decode(w.buf, 300, &h), KVT_OK);
    assert_int_equal(h.body_len, 300);
    assert_int_equal(kvt_proto_hdr_decode(w.buf, 299, &h), KVT_ERR_TOO_BIG);

    /* raw_encode refuses a body over the hard limit without touching the writer. */
    size_t before = w.len;
    assert_int_equal(
        kvt_proto_raw_encode(&w, KVT_PROTO_OP_EVENTS, 0, 1, big, KVT_PROTO_MAX_BODY_LIMIT + 1u),
        KVT_ERR_TOO_BIG);
    assert_int_equal(w.len, before);
    assert_int_equal(kvt_proto_wr_reserve(&w, 1 << 20), KVT_OK);
    assert_true(w.cap - w.len >= (1u << 20));
    assert_int_equal(kvt_proto_wr_reserve(&w, SIZE_MAX - 5), KVT_ERR_NO_MEM);
    assert_true(w.oom);
    kvt_proto_wr_u32(&w, 5); /* ignored while oom */
    assert_int_equal(w.len, before);
    kvt_proto_wr_reset(&w);
    kvt_proto_wr_cleanup(&w);
    assert_null(w.buf);
}

/* ---- HELLO, ENGINE_DROP, raw, error --------------------------------------------------------- */

/* Checks that the frame in w at @off has header @op/@flags/@req_id and returns its body. */
static const uint8_t *frame_body(const kvt_proto_wr_t *w, size_t off, uint8_t op, uint16_t flags,
                                 uint64_t req_id, uint32_t *len_p)
{
    kvt_proto_hdr_t h;
    assert_true(w->len - off >= KVT_PROTO_HDR_SIZE);
    assert_int_equal(kvt_proto_hdr_decode(w->buf + off, KVT_PROTO_MAX_BODY_LIMIT, &h), KVT_OK);
    assert_int_equal(h.op, op);
    assert_int_equal(h.flags, flags);
    assert_true(h.req_id == req_id);
    assert_true(w->len - off - KVT_PROTO_HDR_SIZE >= h.body_len);
    *len_p = h.body_len;
    return w->buf + off + KVT_PROTO_HDR_SIZE;
}

typedef kvt_status_t (*decode_fn)(const uint8_t *body, size_t len, void *out, char *err,
                                  size_t errlen);

/* Every strict prefix of @body and @body plus one trailing byte are rejected with
 * KVT_ERR_INVAL, a reason, and the output untouched. */
static void expect_truncations_fail(const uint8_t *body, size_t len, decode_fn fn, size_t outsz)
{
    uint8_t out[512], before[512];
    assert_true(outsz <= sizeof(out));
    for (size_t cut = 0; cut <= len + 1; cut++) {
        if (cut == len)
            continue;
        uint8_t *copy = malloc(cut + 1);
        assert_non_null(copy);
        memcpy(copy, body, cut < len ? cut : len);
        if (cut > len)
            copy[len] = 0;
        memset(out, 0x5A, outsz);
        memcpy(before, out, outsz);
        char why[256] = "";
        kvt_status_t st = fn(copy, cut, out, why, sizeof(why));
        if (st != KVT_ERR_INVAL)
            fail_msg("length %zu of %zu: status %d, want KVT_ERR_INVAL", cut, len, st);
        assert_true(why[0] != '\0');
        assert_null(strchr(why, '\n'));
        assert_memory_equal(out, before, outsz);
        free(copy);
    }
}

static kvt_status_t dec_hello_req(const uint8_t *b, size_t n, void *o, char *err, size_t errlen)
{
    return kvt_proto_hello_req_decode(b, n, o, err, errlen);
}
static kvt_status_t dec_hello_ans(const uint8_t *b, size_t n, void *o, char *err, size_t errlen)
{
    return kvt_proto_hello_ans_decode(b, n, o, err, errlen);
}
static kvt_status_t dec_drop(const uint8_t *b, size_t n, void *o, char *err, size_t errlen)
{
    return kvt_proto_drop_req_decode(b, n, o, err, errlen);
}
static kvt_status_t dec_model_drop(const uint8_t *b, size_t n, void *o, char *err, size_t errlen)
{
    return kvt_proto_model_drop_req_decode(b, n, o, err, errlen);
}
static kvt_status_t dec_err(const uint8_t *b, size_t n, void *o, char *err, size_t errlen)
{
    return kvt_proto_err_decode(b, n, o, err, errlen);
}
static kvt_status_t dec_query(const uint8_t *b, size_t n, void *o, char *err, size_t errlen)
{
    return kvt_proto_query_decode(b, n, UINT32_MAX, o, err, errlen);
}
static kvt_status_t dec_query_ans(const uint8_t *b, size_t n, void *o, char *err, size_t errlen)
{
    return kvt_proto_query_ans_decode(b, n, o, err, errlen);
}

static void test_hello(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    uint32_t len;

    kvt_proto_hello_req_t req = {KVT_PROTO_VERSION, S("s3cret")};
    assert_int_equal(kvt_proto_hello_req_encode(&w, 77, &req), KVT_OK);
    const uint8_t *body = frame_body(&w, 0, KVT_PROTO_OP_HELLO, 0, 77, &len);
    ref_t *ref = calloc(1, sizeof(*ref));
    ref_hdr(ref, KVT_PROTO_OP_HELLO, 0, 77, 12);
    ref_le(ref, 1, 4);
    ref_str(ref, "s3cret", 6);
    assert_int_equal(w.len, ref->n);
    assert_memory_equal(w.buf, ref->b, ref->n);
    kvt_proto_hello_req_t got;
    assert_int_equal(kvt_proto_hello_req_decode(body, len, &got, NULL, 0), KVT_OK);
    assert_int_equal(got.client_version, 1);
    assert_true(str_eq(got.token, "s3cret", 6));
    expect_truncations_fail(body, len, dec_hello_req, sizeof(got));

    /* Empty token. */
    kvt_proto_wr_reset(&w);
    req.token = S("");
    assert_int_equal(kvt_proto_hello_req_encode(&w, 1, &req), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_HELLO, 0, 1, &len);
    assert_int_equal(len, 6);
    assert_int_equal(kvt_proto_hello_req_decode(body, len, &got, NULL, 0), KVT_OK);
    assert_int_equal(got.token.len, 0);

    /* Token too long: refused, writer unchanged. */
    char big[256];
    memset(big, 't', sizeof(big));
    req.token.p = big;
    req.token.len = 256;
    assert_int_equal(kvt_proto_hello_req_encode(&w, 2, &req), KVT_ERR_TOO_BIG);
    assert_int_equal(w.len, KVT_PROTO_HDR_SIZE + 6);

    kvt_proto_wr_reset(&w);
    kvt_proto_hello_ans_t ans = {KVT_PROTO_VERSION, KVT_PROTO_MAX_BODY_DEFAULT};
    assert_int_equal(kvt_proto_hello_ans_encode(&w, 77, &ans), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_HELLO, KVT_PROTO_F_RESPONSE, 77, &len);
    assert_int_equal(len, 8);
    kvt_proto_hello_ans_t agot;
    assert_int_equal(kvt_proto_hello_ans_decode(body, len, &agot, NULL, 0), KVT_OK);
    assert_int_equal(agot.server_version, 1);
    assert_int_equal(agot.max_body, KVT_PROTO_MAX_BODY_DEFAULT);
    expect_truncations_fail(body, len, dec_hello_ans, sizeof(agot));
    free(ref);
    kvt_proto_wr_cleanup(&w);
}

static void test_drop_and_raw(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    uint32_t len;

    assert_int_equal(kvt_proto_drop_req_encode(&w, 5, S("pod-a")), KVT_OK);
    const uint8_t *body = frame_body(&w, 0, KVT_PROTO_OP_ENGINE_DROP, 0, 5, &len);
    kvt_proto_str_t pod;
    assert_int_equal(kvt_proto_drop_req_decode(body, len, &pod, NULL, 0), KVT_OK);
    assert_true(str_eq(pod, "pod-a", 5));
    expect_truncations_fail(body, len, dec_drop, sizeof(pod));
    size_t keep = w.len;
    assert_int_equal(kvt_proto_drop_req_encode(&w, 6, S("")), KVT_ERR_INVAL);
    assert_int_equal(w.len, keep);
    static const uint8_t empty_pod[] = {0, 0};
    char why[256] = "";
    assert_int_equal(kvt_proto_drop_req_decode(empty_pod, 2, &pod, why, sizeof(why)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(why, "empty"));

    /* MODEL_DROP: the same one-name body under its own opcode, mutating */
    kvt_proto_wr_reset(&w);
    assert_int_equal(kvt_proto_model_drop_req_encode(&w, 7, S("org/model")), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_MODEL_DROP, 0, 7, &len);
    kvt_proto_str_t model;
    assert_int_equal(kvt_proto_model_drop_req_decode(body, len, &model, NULL, 0), KVT_OK);
    assert_true(str_eq(model, "org/model", 9));
    expect_truncations_fail(body, len, dec_model_drop, sizeof(model));
    keep = w.len;
    assert_int_equal(kvt_proto_model_drop_req_encode(&w, 8, S("")), KVT_ERR_INVAL);
    assert_int_equal(w.len, keep);
    assert_int_equal(kvt_proto_model_drop_req_decode(empty_pod, 2, &model, why, sizeof(why)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(why, "model drop: empty model name"));
    static const uint8_t trailing[] = {1, 0, 'm', 0};
    assert_int_equal(kvt_proto_model_drop_req_decode(trailing, 4, &model, why, sizeof(why)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(why, "trailing"));
    assert_true(kvt_proto_op_known(KVT_PROTO_OP_MODEL_DROP));
    assert_true(kvt_proto_op_mutating(KVT_PROTO_OP_MODEL_DROP));
    assert_string_equal(kvt_proto_op_name(KVT_PROTO_OP_MODEL_DROP), "MODEL_DROP");
    /* ROUTED carries a JSON body, as EVENTS does, and needs the token too */
    assert_true(kvt_proto_op_known(KVT_PROTO_OP_ROUTED));
    assert_true(kvt_proto_op_mutating(KVT_PROTO_OP_ROUTED));
    assert_string_equal(kvt_proto_op_name(KVT_PROTO_OP_ROUTED), "ROUTED");
    kvt_proto_wr_reset(&w);

    /* Raw frames: events JSON, empty ping / stats. */
    kvt_proto_wr_reset(&w);
    const char *json = "{\"pod\":\"a\",\"model\":\"m\",\"events\":[]}";
    assert_int_equal(kvt_proto_raw_encode(&w, KVT_PROTO_OP_EVENTS, 0, 8, json, strlen(json)),
                     KVT_OK);
    assert_int_equal(kvt_proto_raw_encode(&w, KVT_PROTO_OP_PING, 0, 9, NULL, 0), KVT_OK);
    assert_int_equal(
        kvt_proto_raw_encode(&w, KVT_PROTO_OP_STATS, KVT_PROTO_F_RESPONSE, 10, "{}", 2), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_EVENTS, 0, 8, &len);
    assert_int_equal(len, strlen(json));
    assert_memory_equal(body, json, len);
    size_t off = KVT_PROTO_HDR_SIZE + len;
    frame_body(&w, off, KVT_PROTO_OP_PING, 0, 9, &len);
    assert_int_equal(len, 0);
    off += KVT_PROTO_HDR_SIZE;
    body = frame_body(&w, off, KVT_PROTO_OP_STATS, KVT_PROTO_F_RESPONSE, 10, &len);
    assert_int_equal(len, 2);
    assert_int_equal(off + KVT_PROTO_HDR_SIZE + 2, w.len);
    kvt_proto_wr_cleanup(&w);
}

static void test_error_body(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    uint32_t len;
    kvt_proto_err_t e;

    const char *msg = "query: empty model name";
    assert_int_equal(
        kvt_proto_err_encode(&w, KVT_PROTO_OP_QUERY, 3, KVT_ERR_INVAL, 400, msg, strlen(msg)),
        KVT_OK);
    const uint8_t *body =
        frame_body(&w, 0, KVT_PROTO_OP_QUERY, KVT_PROTO_F_RESPONSE | KVT_PROTO_F_ERROR, 3, &len);
    ref_t *ref = calloc(1, sizeof(*ref));
    ref_le(ref, (uint32_t)(int32_t)KVT_ERR_INVAL, 4);
    ref_le(ref, 400, 2);
    ref_str(ref, msg, strlen(msg));
    assert_int_equal(len, ref->n);
    assert_memory_equal(body, ref->b, ref->n);
    assert_int_equal(kvt_proto_err_decode(body, len, &e, NULL, 0), KVT_OK);
    assert_int_equal(e.status, KVT_ERR_INVAL);
    assert_int_equal(e.http, 400);
    assert_true(str_eq(e.msg, msg, strlen(msg)));
    expect_truncations_fail(body, len, dec_err, sizeof(e));

    /* Bad status / http on both sides. */
    size_t keep = w.len;
    assert_int_equal(kvt_proto_err_encode(&w, 1, 1, KVT_OK, 400, "x", 1), KVT_ERR_INVAL);
    assert_int_equal(kvt_proto_err_encode(&w, 1, 1, KVT_ERR_INVAL, 200, "x", 1), KVT_ERR_INVAL);
    assert_int_equal(kvt_proto_err_encode(&w, 1, 1, KVT_ERR_INVAL, 600, "x", 1), KVT_ERR_INVAL);
    assert_int_equal(w.len, keep);
    uint8_t bad[8] = {0, 0, 0, 0, 0x90, 0x01, 0, 0}; /* status 0 */
    char why[256] = "";
    assert_int_equal(kvt_proto_err_decode(bad, 8, &e, why, sizeof(why)), KVT_ERR_INVAL);
    assert_non_null(strstr(why, "status"));
    bad[0] = 0xFF, bad[1] = 0xFF, bad[2] = 0xFF, bad[3] = 0xFF;
    bad[4] = 0xC7; /* 199 */
    bad[5] = 0;
    assert_int_equal(kvt_proto_err_decode(bad, 8, &e, why, sizeof(why)), KVT_ERR_INVAL);
    assert_non_null(strstr(why, "http"));
    bad[4] = 0x58, bad[5] = 0x02; /* 600 */
    assert_int_equal(kvt_proto_err_decode(bad, 8, &e, why, sizeof(why)), KVT_ERR_INVAL);
    bad[4] = 0x57; /* 599 */
    assert_int_equal(kvt_proto_err_decode(bad, 8, &e, why, sizeof(why)), KVT_OK);
    assert_int_equal(e.status, -1);
    assert_int_equal(e.msg.len, 0);

    /* Messages: cut at NUL, at 255 bytes, and back to a UTF-8 boundary. */
    kvt_proto_wr_reset(&w);
    assert_int_equal(kvt_proto_err_encode(&w, 2, 4, KVT_ERR_IO, 503, "a\0bc", 4), KVT_OK);
    body = frame_body(&w, 0, 2, KVT_PROTO_F_RESPONSE | KVT_PROTO_F_ERROR, 4, &len);
    assert_int_equal(kvt_proto_err_decode(body, len, &e, NULL, 0), KVT_OK);
    assert_true(str_eq(e.msg, "a", 1));
    kvt_proto_wr_reset(&w);
    char longmsg[600];
    memset(longmsg, 'm', sizeof(longmsg));
    assert_int_equal(kvt_proto_err_encode(&w, 2, 4, KVT_ERR_IO, 503, longmsg, 600), KVT_OK);
    body = frame_body(&w, 0, 2, KVT_PROTO_F_RESPONSE | KVT_PROTO_F_ERROR, 4, &len);
    assert_int_equal(kvt_proto_err_decode(body, len, &e, NULL, 0), KVT_OK);
    assert_int_equal(e.msg.len, 255);
    /* "é" (C3 A9) straddling byte 255: the whole character goes. */
    longmsg[254] = (char)0xC3;
    longmsg[255] = (char)0xA9;
    kvt_proto_wr_reset(&w);
    assert_int_equal(kvt_proto_err_encode(&w, 2, 4, KVT_ERR_IO, 503, longmsg, 600), KVT_OK);
    body = frame_body(&w, 0, 2, KVT_PROTO_F_RESPONSE | KVT_PROTO_F_ERROR, 4, &len);
    assert_int_equal(kvt_proto_err_decode(body, len, &e, NULL, 0), KVT_OK);
    assert_int_equal(e.msg.len, 254);
    kvt_proto_wr_reset(&w);
    assert_int_equal(kvt_proto_err_encode(&w, 2, 4, KVT_ERR_IO, 503, NULL, 10), KVT_OK);
    free(ref);
    kvt_proto_wr_cleanup(&w);
}

/* ---- QUERY ---------------------------------------------------------------------------------- */

static void test_query_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    uint32_t len;
    const uint32_t toks[] = {1, 2, 3, 0xFFFFFFFFu, 0};
    kvt_proto_str_t pods[] = {S("pod-a"), S("pod-b")};
    kvt_proto_query_req_t req = {S("llama"), S("lora1"), KVT_PROTO_Q_TOKENS, 5, toks, NULL, 2,
                                 pods,       S("")};

    assert_int_equal(kvt_proto_query_req_encode(&w, 11, &req), KVT_OK);
    const uint8_t *body = frame_body(&w, 0, KVT_PROTO_OP_QUERY, 0, 11, &len);
    ref_t *ref = calloc(1, sizeof(*ref));
    ref_str(ref, "llama", 5);
    ref_str(ref, "lora1", 5);
    ref_u8(ref, 0);
    ref_le(ref, 0, 3);
    ref_le(ref, 5, 4);
    for (int i = 0; i < 5; i++)
        ref_le(ref, toks[i], 4);
    ref_le(ref, 2, 4);
    ref_str(ref, "pod-a", 5);
    ref_str(ref, "pod-b", 5);
    assert_int_equal(len, ref->n);
    assert_memory_equal(body, ref->b, ref->n);

    kvt_proto_query_t q;
    assert_int_equal(kvt_proto_query_decode(body, len, 5, &q, NULL, 0), KVT_OK);
    assert_true(str_eq(q.model, "llama", 5));
    assert_true(str_eq(q.lora, "lora1", 5));
    assert_int_equal(q.kind, KVT_PROTO_Q_TOKENS);
    assert_int_equal(q.n, 5);
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(kvt_proto_query_token(&q, i), toks[i]);
    uint32_t tvals[5];
    kvt_proto_query_values(&q, tvals); /* the bulk form agrees */
    assert_memory_equal(tvals, toks, sizeof(tvals));
    assert_int_equal(q.npods, 2);
    kvt_proto_rd_t r;
    kvt_proto_rd_init(&r, q.pods, q.pods_len);
    assert_true(str_eq(kvt_proto_rd_str(&r), "pod-a", 5));
    assert_true(str_eq(kvt_proto_rd_str(&r), "pod-b", 5));
    assert_true(kvt_proto_rd_done(&r));
    expect_truncations_fail(body, len, dec_query, sizeof(q));

    /* n > max_items */
    char why[256] = "";
    kvt_proto_query_t q2;
    memset(&q2, 0x11, sizeof(q2));
    assert_int_equal(kvt_proto_query_decode(body, len, 4, &q2, why, sizeof(why)), KVT_ERR_TOO_BIG);
    assert_true(why[0] != '\0');
    assert_int_equal(q2.n, 0x11111111u);

    /* Keys, no pods, empty lora, decoded from an odd address (unaligned values). */
    kvt_proto_wr_reset(&w);
    const uint64_t keys[] = {UINT64_MAX, 0, 0x0123456789ABCDEFull};
    kvt_proto_query_req_t kreq = {S("m"), S(""), KVT_PROTO_Q_KEYS, 3, NULL, keys, 0, NULL, S("")};
    assert_int_equal(kvt_proto_query_req_encode(&w, 12, &kreq), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_QUERY, 0, 12, &len);
    uint8_t *odd = malloc(len + 1);
    memcpy(odd + 1, body, len);
    assert_int_equal(kvt_proto_query_decode(odd + 1, len, 100, &q, NULL, 0), KVT_OK);
    assert_int_equal(q.kind, KVT_PROTO_Q_KEYS);
    assert_int_equal(q.lora.len, 0);
    assert_int_equal(q.npods, 0);
    assert_int_equal(q.pods_len, 0);
    for (uint32_t i = 0; i < 3; i++)
        assert_true(kvt_proto_query_key(&q, i) == keys[i]);
    uint64_t kvals[3];
    kvt_proto_query_values(&q, kvals); /* bulk, from the unaligned frame */
    assert_memory_equal(kvals, keys, sizeof(kvals));
    free(odd);
    expect_truncations_fail(body, len, dec_query, sizeof(q));

    /* Empty query (n = 0) is valid. */
    kvt_proto_wr_reset(&w);
    kvt_proto_query_req_t empty = {S("m"), S(""), KVT_PROTO_Q_TOKENS, 0, NULL, NULL, 0,
                                   NULL,   S("")};
    assert_int_equal(kvt_proto_query_req_encode(&w, 13, &empty), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_QUERY, 0, 13, &len);
    assert_int_equal(len, 3 + 2 + 4 + 4 + 4);
    assert_int_equal(kvt_proto_query_decode(body, len, 0, &q, NULL, 0), KVT_OK);
    assert_int_equal(q.n, 0);
    free(ref);
    kvt_proto_wr_cleanup(&w);
}

/* Builds a valid body "model m, lora l, kind 0, n 2 tokens, 1 pod" into @ref and returns
 * the offsets of interesting fields. */
static void ref_query(ref_t *ref, size_t *kind_off, size_t *pod_off)
{
    ref->n = 0;
    ref_str(ref, "model", 5);
    ref_str(ref, "lora", 4);
    *kind_off = ref->n;
    ref_u8(ref, 0);
    ref_le(ref, 0, 3);
    ref_le(ref, 2, 4);
    ref_le(ref, 7, 4);
    ref_le(ref, 8, 4);
    ref_le(ref, 1, 4);
    *pod_off = ref->n;
    ref_str(ref, "pod", 3);
}

static void expect_query_err(const ref_t *ref, kvt_status_t want, const char *why_part)
{
    uint8_t *copy = dup_exact(ref->b, ref->n);
    kvt_proto_query_t q;
    memset(&q, 0x33, sizeof(q));
    kvt_proto_query_t before = q;
    char why[256] = "";
    assert_int_equal(kvt_proto_query_decode(copy, ref->n, 1000, &q, why, sizeof(why)), want);
    assert_memory_equal(&q, &before, sizeof(q));
    assert_true(why[0] != '\0');
    if (strstr(why, why_part) == NULL)
        fail_msg("reason \"%s\" does not mention \"%s\"", why, why_part);
    free(copy);
}

static void test_query_rejects(void **state)
{
    (void)state;
    ref_t *ref = calloc(1, sizeof(*ref));
    size_t kind_off, pod_off;
    kvt_proto_query_t q;

    ref_query(ref, &kind_off, &pod_off);
    uint8_t *copy = dup_exact(ref->b, ref->n);
    assert_int_equal(kvt_proto_query_decode(copy, ref->n, 1000, &q, NULL, 0), KVT_OK);
    assert_int_equal(q.n, 2);
    assert_int_equal(kvt_proto_query_token(&q, 1), 8);
    free(copy);

    for (int i = 1; i <= 3; i++) {
        ref_query(ref, &kind_off, &pod_off);
        ref->b[kind_off + i] = 0x80;
        expect_query_err(ref, KVT_ERR_INVAL, "pad");
    }
    for (int k = 3; k < 256; k += 36) { /* 2 is the salted kind (test_query_salted) */
        ref_query(ref, &kind_off, &pod_off);
        ref->b[kind_off] = (uint8_t)k;
        expect_query_err(ref, KVT_ERR_INVAL, "kind");
    }
    /* Kind 1 with 2 u64 keys needs 16 bytes; the 8 token bytes + npods + pod are 17. */
    ref_query(ref, &kind_off, &pod_off);
    ref->b[kind_off] = 1;
    expect_query_err(ref, KVT_ERR_INVAL, "");

    ref_query(ref, &kind_off, &pod_off);
    ref_u8(ref, 0);
    expect_query_err(ref, KVT_ERR_INVAL, "trailing");

    /* Empty model, NUL in model, model 256 bytes long. */
    ref->n = 0;
    ref_str(ref, "", 0);
    ref_str(ref, "", 0);
    ref_le(ref, 0, 8);
    ref_le(ref, 0, 4);
    expect_query_err(ref, KVT_ERR_INVAL, "model");
    ref->n = 0;
    ref_str(ref, "a\0b", 3);
    ref_str(ref, "", 0);
    ref_le(ref, 0, 8);
    ref_le(ref, 0, 4);
    expect_query_err(ref, KVT_ERR_INVAL, "model");
    char big[256];
    memset(big, 'x', sizeof(big));
    ref->n = 0;
    ref_str(ref, big, 256);
    ref_str(ref, "", 0);
    ref_le(ref, 0, 8);
    ref_le(ref, 0, 4);
    expect_query_err(ref, KVT_ERR_INVAL, "model");
    ref->n = 0;
    ref_str(ref, big, 255);
    ref_str(ref, big, 256);
    ref_le(ref, 0, 8);
    ref_le(ref, 0, 4);
    expect_query_err(ref, KVT_ERR_INVAL, "lora");

    /* Pod names: empty, too long, NUL. */
    ref_query(ref, &kind_off, &pod_off);
    ref->n = pod_off;
    ref_str(ref, "", 0);
    expect_query_err(ref, KVT_ERR_INVAL, "pod");
    ref->n = pod_off;
    ref_str(ref, big, 256);
    expect_query_err(ref, KVT_ERR_INVAL, "pod");
    ref->n = pod_off;
    ref_str(ref, "p\0", 2);
    expect_query_err(ref, KVT_ERR_INVAL, "pod");
    /* npods larger than what follows. */
    ref_query(ref, &kind_off, &pod_off);
    ref->b[pod_off - 4] = 2;
    expect_query_err(ref, KVT_ERR_INVAL, "pod");
    /* A huge n must not overflow the size computation. */
    ref_query(ref, &kind_off, &pod_off);
    ref->b[kind_off] = 1;
    for (int i = 0; i < 4; i++)
        ref->b[kind_off + 4 + i] = 0xFF;
    copy = dup_exact(ref->b, ref->n);
    assert_int_equal(kvt_proto_query_decode(copy, ref->n, UINT32_MAX, &q, NULL, 0), KVT_ERR_INVAL);
    assert_int_equal(kvt_proto_query_decode(copy, ref->n, 1000, &q, NULL, 0), KVT_ERR_TOO_BIG);
    free(copy);

    /* Encoder refusals leave the writer unchanged. */
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    assert_int_equal(kvt_proto_raw_encode(&w, KVT_PROTO_OP_PING, 0, 1, NULL, 0), KVT_OK);
    size_t keep = w.len;
    const uint32_t toks[] = {1};
    kvt_proto_str_t pods[] = {S("ok"), S("")};
    kvt_proto_query_req_t req = {S("m"), S(""), 3, 1, toks, NULL, 0, NULL, S("")};
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_INVAL); /* kind */
    req.kind = KVT_PROTO_Q_KEYS;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_INVAL); /* keys NULL */
    req.kind = KVT_PROTO_Q_TOKENS;
    req.model = S("");
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_INVAL);
    req.model = S("m");
    req.npods = 2;
    req.pods = pods;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_INVAL);
    pods[1].p = big;
    pods[1].len = 256;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_TOO_BIG);
    req.npods = 0;
    req.lora.p = big;
    req.lora.len = 256;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_TOO_BIG);
    req.lora = S("");
    req.n = (KVT_PROTO_MAX_BODY_LIMIT / 4) + 1;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_TOO_BIG);
    assert_int_equal(w.len, keep);
    assert_false(w.bad);
    assert_false(w.oom);
    kvt_proto_wr_cleanup(&w);
    free(ref);
}

/* Builds a valid kind-2 body "model m, lora "", salt @salt, n 2 tokens, 1 pod" into @ref and
 * returns the offsets of the kind byte and of the salt's length. */
static void ref_salted(ref_t *ref, const char *salt, size_t salt_len, size_t *kind_off,
                       size_t *salt_off)
{
    ref->n = 0;
    ref_str(ref, "m", 1);
    ref_str(ref, "", 0);
    *kind_off = ref->n;
    ref_u8(ref, KVT_PROTO_Q_TOKENS_SALTED);
    ref_le(ref, 0, 3);
    *salt_off = ref->n;
    ref_str(ref, salt, salt_len);
    ref_le(ref, 2, 4);
    ref_le(ref, 7, 4);
    ref_le(ref, 8, 4);
    ref_le(ref, 1, 4);
    ref_str(ref, "pod", 3);
}

/* Kind 2 (token ids with a cache salt): layout, round trip, and every malformed body. */
static void test_query_salted(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    uint32_t len;
    const uint32_t toks[] = {1, 0xFFFFFFFFu, 3};
    kvt_proto_str_t pods[] = {S("pod-a")};
    kvt_proto_query_req_t req = {
        S("llama"), S("ad1"), KVT_PROTO_Q_TOKENS_SALTED, 3, toks, NULL, 1, pods, S("tenant-a")};
    /* The bytes against a reference: test_doc_example (fixed) and test_random_roundtrips. */
    assert_int_equal(kvt_proto_query_req_encode(&w, 21, &req), KVT_OK);
    const uint8_t *body = frame_body(&w, 0, KVT_PROTO_OP_QUERY, 0, 21, &len);
    assert_int_equal(len, 7 + 5 + 4 + 10 + 4 + 3 * 4 + 4 + 7);
    assert_memory_equal(body + 16, "\x08\x00tenant-a", 10); /* right after pad, before n */
    ref_t *ref = calloc(1, sizeof(*ref));

    kvt_proto_query_t q;
    assert_int_equal(kvt_proto_query_decode(body, len, 3, &q, NULL, 0), KVT_OK);
    assert_int_equal(q.kind, KVT_PROTO_Q_TOKENS_SALTED);
    assert_true(kvt_proto_query_kind_tokens(q.kind));
    assert_true(str_eq(q.salt, "tenant-a", 8));
    assert_true(str_eq(q.model, "llama", 5));
    assert_true(str_eq(q.lora, "ad1", 3));
    assert_int_equal(q.n, 3);
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(kvt_proto_query_token(&q, i), toks[i]);
    uint32_t vals[3];
    kvt_proto_query_values(&q, vals);
    assert_memory_equal(vals, toks, sizeof(vals));
    assert_int_equal(q.npods, 1);
    expect_truncations_fail(body, len, dec_query, sizeof(q));
    char why[256] = "";
    assert_int_equal(kvt_proto_query_decode(body, len, 2, &q, why, sizeof(why)), KVT_ERR_TOO_BIG);

    /* The other kinds decode with an empty salt; only kinds 0 and 2 are token kinds. */
    kvt_proto_wr_reset(&w);
    req.kind = KVT_PROTO_Q_TOKENS;
    req.salt = S("");
    assert_int_equal(kvt_proto_query_req_encode(&w, 22, &req), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_QUERY, 0, 22, &len);
    memset(&q, 0x44, sizeof(q));
    assert_int_equal(kvt_proto_query_decode(body, len, 3, &q, NULL, 0), KVT_OK);
    assert_int_equal(q.salt.len, 0);
    assert_true(kvt_proto_query_kind_tokens(KVT_PROTO_Q_TOKENS));
    assert_false(kvt_proto_query_kind_tokens(KVT_PROTO_Q_KEYS));
    assert_false(kvt_proto_query_kind_tokens(3));

    /* A salt of 255 bytes (the limit), any byte but NUL. */
    char big[256];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)(1 + i % 255);
    kvt_proto_wr_reset(&w);
    req.kind = KVT_PROTO_Q_TOKENS_SALTED;
    req.salt.p = big;
    req.salt.len = 255;
    assert_int_equal(kvt_proto_query_req_encode(&w, 23, &req), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_QUERY, 0, 23, &len);
    assert_int_equal(kvt_proto_query_decode(body, len, 3, &q, NULL, 0), KVT_OK);
    assert_true(str_eq(q.salt, big, 255));

    /* Malformed kind-2 bodies: each refused with a reason, the output untouched. */
    size_t kind_off, salt_off;
    ref_salted(ref, "s", 1, &kind_off, &salt_off);
    uint8_t *copy = dup_exact(ref->b, ref->n);
    assert_int_equal(kvt_proto_query_decode(copy, ref->n, 1000, &q, NULL, 0), KVT_OK);
    assert_true(str_eq(q.salt, "s", 1));
    assert_int_equal(kvt_proto_query_token(&q, 1), 8);
    free(copy);
    ref_salted(ref, "", 0, &kind_off, &salt_off); /* no salt is kind 0, not kind 2 with "" */
    expect_query_err(ref, KVT_ERR_INVAL, "empty cache salt");
    ref_salted(ref, big, 256, &kind_off, &salt_off);
    expect_query_err(ref, KVT_ERR_INVAL, "salt");
    ref_salted(ref, "a\0b", 3, &kind_off, &salt_off);
    expect_query_err(ref, KVT_ERR_INVAL, "salt");
    ref_salted(ref, "s", 1, &kind_off, &salt_off);
    ref->n = salt_off + 1; /* inside the salt's length */
    expect_query_err(ref, KVT_ERR_INVAL, "salt");
    ref_salted(ref, "salt", 4, &kind_off, &salt_off);
    ref->n = salt_off + 2 + 3; /* inside the salt's bytes */
    expect_query_err(ref, KVT_ERR_INVAL, "salt");
    ref_salted(ref, "salt", 4, &kind_off, &salt_off);
    ref->n = salt_off + 2 + 4 + 2; /* inside the count */
    expect_query_err(ref, KVT_ERR_INVAL, "count");
    ref_salted(ref, "salt", 4, &kind_off, &salt_off);
    ref->b[salt_off] = 200; /* the salt's length runs past the body */
    expect_query_err(ref, KVT_ERR_INVAL, "salt");
    for (int i = 1; i <= 3; i++) {
        ref_salted(ref, "s", 1, &kind_off, &salt_off);
        ref->b[kind_off + i] = 1;
        expect_query_err(ref, KVT_ERR_INVAL, "pad");
    }
    ref_salted(ref, "s", 1, &kind_off, &salt_off);
    ref_u8(ref, 0);
    expect_query_err(ref, KVT_ERR_INVAL, "trailing");
    /* A kind-0 body relabelled kind 2: its count reads as a salt with NUL bytes. */
    size_t pod_off;
    ref_query(ref, &kind_off, &pod_off);
    ref->b[kind_off] = KVT_PROTO_Q_TOKENS_SALTED;
    expect_query_err(ref, KVT_ERR_INVAL, "salt");
    /* A kind-2 body relabelled kind 0: the salt's bytes read as a count; nothing fits. */
    ref_salted(ref, "s", 1, &kind_off, &salt_off);
    ref->b[kind_off] = KVT_PROTO_Q_TOKENS;
    copy = dup_exact(ref->b, ref->n);
    assert_int_equal(kvt_proto_query_decode(copy, ref->n, UINT32_MAX, &q, NULL, 0), KVT_ERR_INVAL);
    free(copy);
    /* Keys cannot be salted (kind 1 keys already carry it): a salted kind-1 body is garbage. */
    ref_salted(ref, "s", 1, &kind_off, &salt_off);
    ref->b[kind_off] = KVT_PROTO_Q_KEYS;
    copy = dup_exact(ref->b, ref->n);
    assert_int_equal(kvt_proto_query_decode(copy, ref->n, UINT32_MAX, &q, NULL, 0), KVT_ERR_INVAL);
    free(copy);

    /* Encoder refusals leave the writer unchanged. */
    kvt_proto_wr_reset(&w);
    assert_int_equal(kvt_proto_raw_encode(&w, KVT_PROTO_OP_PING, 0, 1, NULL, 0), KVT_OK);
    size_t keep = w.len;
    req.salt = S("");
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_INVAL); /* kind 2, no salt */
    req.salt = S("t");
    req.kind = KVT_PROTO_Q_TOKENS;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_INVAL); /* salt, kind 0 */
    req.kind = KVT_PROTO_Q_KEYS;
    const uint64_t keys[] = {1, 2, 3};
    req.keys = keys;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_INVAL); /* salt, kind 1 */
    req.kind = KVT_PROTO_Q_TOKENS_SALTED;
    req.salt.p = big;
    req.salt.len = 256;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_TOO_BIG);
    req.salt = (kvt_proto_str_t){"a\0b", 3};
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_TOO_BIG);
    req.salt = S("t");
    req.tokens = NULL;
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &req), KVT_ERR_INVAL); /* NULL tokens */
    assert_int_equal(w.len, keep);
    assert_false(w.bad);
    assert_false(w.oom);
    free(ref);
    kvt_proto_wr_cleanup(&w);
}

static void test_query_answer(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    uint32_t len;
    kvt_proto_query_ans_enc_t e;
    kvt_proto_pod_ans_t pa = {S("pod-a"), 1, 10, 6, 3, 1, 9.25};
    kvt_proto_pod_ans_t pb = {S("pod-b"), 0, 2, 2, 0, 0, -0.0};

    kvt_proto_query_ans_begin(&w, 99, 16, 12, &e);
    kvt_proto_query_ans_add(&w, &e, &pa);
    kvt_proto_query_ans_add(&w, &e, &pb);
    assert_int_equal(kvt_proto_query_ans_end(&w, &e), KVT_OK);
    const uint8_t *body = frame_body(&w, 0, KVT_PROTO_OP_QUERY, KVT_PROTO_F_RESPONSE, 99, &len);
    ref_t *ref = calloc(1, sizeof(*ref));
    ref_le(ref, 16, 4);
    ref_le(ref, 12, 4);
    ref_le(ref, 2, 4);
    ref_str(ref, "pod-a", 5);
    ref_le(ref, 1, 4);
    ref_le(ref, 10, 4);
    ref_le(ref, 6, 4);
    ref_le(ref, 3, 4);
    ref_le(ref, 1, 4);
    ref_f64(ref, 9.25);
    ref_str(ref, "pod-b", 5);
    ref_le(ref, 0, 4);
    ref_le(ref, 2, 4);
    ref_le(ref, 2, 4);
    ref_le(ref, 0, 8);
    ref_f64(ref, -0.0);
    assert_int_equal(len, ref->n);
    assert_memory_equal(body, ref->b, ref->n);

    kvt_proto_query_ans_t a;
    assert_int_equal(kvt_proto_query_ans_decode(body, len, &a, NULL, 0), KVT_OK);
    assert_int_equal(a.block_size, 16);
    assert_int_equal(a.num_blocks, 12);
    assert_int_equal(a.npods, 2);
    kvt_proto_rd_t r;
    kvt_proto_pod_ans_t got;
    kvt_proto_rd_init(&r, a.pods, a.pods_len);
    assert_true(kvt_proto_query_ans_next(&r, &got));
    assert_true(str_eq(got.pod, "pod-a", 5));
    assert_int_equal(got.dp_rank, 1);
    assert_int_equal(got.matched, 10);
    assert_int_equal(got.gpu, 6);
    assert_int_equal(got.cpu, 3);
    assert_int_equal(got.disk, 1);
    assert_true(got.score == 9.25);
    assert_true(kvt_proto_query_ans_next(&r, &got));
    assert_true(str_eq(got.pod, "pod-b", 5));
    assert_true(signbit(got.score));
    assert_false(kvt_proto_query_ans_next(&r, &got));
    assert_true(kvt_proto_rd_done(&r));
    expect_truncations_fail(body, len, dec_query_ans, sizeof(a));

    /* The bulk form writes the same bytes: room for more than it uses, two commits. */
    kvt_proto_wr_t w2;
    kvt_proto_wr_init(&w2);
    kvt_proto_query_ans_begin(&w2, 99, 16, 12, &e);
    uint8_t *o = kvt_proto_query_ans_room(&w2, &e, 1, 255);
    assert_non_null(o);
    kvt_proto_query_ans_commit(&w2, kvt_proto_query_ans_put(&e, o, &pa));
    o = kvt_proto_query_ans_room(&w2, &e, 3, 3 * 255);
    assert_non_null(o);
    kvt_proto_query_ans_commit(&w2, kvt_proto_query_ans_put(&e, o, &pb));
    assert_int_equal(kvt_proto_query_ans_end(&w2, &e), KVT_OK);
    assert_int_equal(w2.len, w.len);
    assert_memory_equal(w2.buf, w.buf, w.len);
    const size_t keep2 = w2.len;
    /* a room no size_t can hold: oom, and the frame vanishes */
    kvt_proto_query_ans_begin(&w2, 5, 16, 1, &e);
    assert_null(kvt_proto_query_ans_room(&w2, &e, 1, SIZE_MAX / 2));
    assert_true(w2.oom);
    assert_int_equal(kvt_proto_query_ans_end(&w2, &e), KVT_ERR_NO_MEM);
    assert_int_equal(w2.len, keep2);
    /* more entries than a u32 counts: bad, and the frame vanishes */
    kvt_proto_query_ans_begin(&w2, 6, 16, 1, &e);
    e.npods = UINT32_MAX - 1;
    assert_non_null(kvt_proto_query_ans_room(&w2, &e, 1, 8));
    assert_null(kvt_proto_query_ans_room(&w2, &e, 2, 8));
    assert_true(w2.bad);
    assert_int_equal(kvt_proto_query_ans_end(&w2, &e), KVT_ERR_TOO_BIG);
    assert_int_equal(w2.len, keep2);
    /* an end outside the room: bad, nothing kept */
    kvt_proto_query_ans_begin(&w2, 7, 16, 1, &e);
    o = kvt_proto_query_ans_room(&w2, &e, 1, 8);
    assert_non_null(o);
    kvt_proto_query_ans_commit(&w2, o - 1);
    assert_true(w2.bad);
    assert_int_equal(kvt_proto_query_ans_end(&w2, &e), KVT_ERR_TOO_BIG);
    assert_int_equal(w2.len, keep2);
    kvt_proto_wr_cleanup(&w2);

    /* No pods. */
    kvt_proto_wr_reset(&w);
    kvt_proto_query_ans_begin(&w, 1, 16, 0, &e);
    assert_int_equal(kvt_proto_query_ans_end(&w, &e), KVT_OK);
    body = frame_body(&w, 0, KVT_PROTO_OP_QUERY, KVT_PROTO_F_RESPONSE, 1, &len);
    assert_int_equal(len, 12);
    assert_int_equal(kvt_proto_query_ans_decode(body, len, &a, NULL, 0), KVT_OK);
    assert_int_equal(a.npods, 0);

    /* Bad entries make the frame vanish; earlier frames stay. */
    size_t keep = w.len;
    kvt_proto_pod_ans_t bad = pa;
    bad.score = NAN;
    kvt_proto_query_ans_begin(&w, 2, 16, 1, &e);
    kvt_proto_query_ans_add(&w, &e, &pa);
    kvt_proto_query_ans_add(&w, &e, &bad);
    assert_int_equal(kvt_proto_query_ans_end(&w, &e), KVT_ERR_TOO_BIG);
    assert_int_equal(w.len, keep);
    bad = pa;
    bad.pod = S("");
    kvt_proto_query_ans_begin(&w, 2, 16, 1, &e);
    kvt_proto_query_ans_add(&w, &e, &bad);
    assert_int_equal(kvt_proto_query_ans_end(&w, &e), KVT_ERR_TOO_BIG);
    assert_int_equal(w.len, keep);

    /* Decoder: infinite score, empty pod, npods too high, trailing byte. */
    char why[256] = "";
    ref->n = 0;
    ref_le(ref, 16, 4);
    ref_le(ref, 1, 4);
    ref_le(ref, 1, 4);
    ref_str(ref, "p", 1);
    ref_le(ref, 0, 20);
    ref_f64(ref, INFINITY);
    assert_int_equal(kvt_proto_query_ans_decode(ref->b, ref->n, &a, why, sizeof(why)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(why, "score"));
    ref->n = 12;
    ref_str(ref, "", 0);
    ref_le(ref, 0, 20);
    ref_f64(ref, 1.0);
    assert_int_equal(kvt_proto_query_ans_decode(ref->b, ref->n, &a, why, sizeof(why)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(why, "empty"));
    ref->n = 12;
    ref_str(ref, "p", 1);
    ref_le(ref, 0, 20);
    ref_f64(ref, 1.0);
    assert_int_equal(kvt_proto_query_ans_decode(ref->b, ref->n, &a, why, sizeof(why)), KVT_OK);
    ref->b[8] = 2;
    assert_int_equal(kvt_proto_query_ans_decode(ref->b, ref->n, &a, why, sizeof(why)),
                     KVT_ERR_INVAL);
    ref->b[8] = 1;
    ref_u8(ref, 0);
    assert_int_equal(kvt_proto_query_ans_decode(ref->b, ref->n, &a, why, sizeof(why)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(why, "trailing"));
    free(ref);
    kvt_proto_wr_cleanup(&w);
}

/* ---- randomized round trips against the naive reference ------------------------------------- */

typedef struct rq {
    char model[256], lora[256], salt[256];
    size_t model_len, lora_len, salt_len;
    uint8_t kind;
    uint32_t n;
    uint32_t toks[64];
    uint64_t keys[64];
    uint32_t npods;
    char pod[8][256];
    size_t pod_len[8];
    kvt_proto_str_t pods[8];
} rq_t;

static size_t rnd_name(char *buf, size_t min, size_t max)
{
    size_t len = min + rnd_below((uint32_t)(max - min + 1));
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)(1 + rnd_below(255)); /* any byte but NUL */
    return len;
}

/* Short names most of the time, the 255-byte edge now and then. */
static size_t rnd_name_len(char *buf, size_t min)
{
    return rnd_below(8) == 0 ? rnd_name(buf, 250 > min ? 250 : min, 255) : rnd_name(buf, min, 12);
}

static void rq_random(rq_t *q)
{
    q->model_len = rnd_name_len(q->model, 1);
    q->lora_len = rnd_below(2) ? 0 : rnd_name_len(q->lora, 0);
    q->kind = (uint8_t)rnd_below(3);
    q->salt_len = q->kind == KVT_PROTO_Q_TOKENS_SALTED ? rnd_name_len(q->salt, 1) : 0;
    q->n = rnd_below(65);
    for (uint32_t i = 0; i < q->n; i++) {
        q->toks[i] = (uint32_t)rnd();
        q->keys[i] = rnd();
    }
    q->npods = rnd_below(9);
    for (uint32_t i = 0; i < q->npods; i++) {
        q->pod_len[i] = rnd_name_len(q->pod[i], 1);
        q->pods[i].p = q->pod[i];
        q->pods[i].len = (uint16_t)q->pod_len[i];
    }
}

static void rq_ref(const rq_t *q, uint64_t req_id, ref_t *ref)
{
    size_t off = ref->n;
    ref_hdr(ref, KVT_PROTO_OP_QUERY, 0, req_id, 0);
    ref_str(ref, q->model, q->model_len);
    ref_str(ref, q->lora, q->lora_len);
    ref_u8(ref, q->kind);
    ref_le(ref, 0, 3);
    if (q->kind == KVT_PROTO_Q_TOKENS_SALTED)
        ref_str(ref, q->salt, q->salt_len);
    ref_le(ref, q->n, 4);
    for (uint32_t i = 0; i < q->n; i++)
        if (q->kind != KVT_PROTO_Q_KEYS)
            ref_le(ref, q->toks[i], 4);
        else
            ref_le(ref, q->keys[i], 8);
    ref_le(ref, q->npods, 4);
    for (uint32_t i = 0; i < q->npods; i++)
        ref_str(ref, q->pod[i], q->pod_len[i]);
    ref_fix_len(ref, off);
}

static void rq_check(const rq_t *q, const kvt_proto_query_t *d)
{
    assert_true(str_eq(d->model, q->model, q->model_len));
    assert_true(str_eq(d->lora, q->lora, q->lora_len));
    assert_int_equal(d->kind, q->kind);
    assert_true(str_eq(d->salt, q->salt, q->salt_len));
    assert_int_equal(d->n, q->n);
    for (uint32_t i = 0; i < q->n; i++) {
        if (q->kind != KVT_PROTO_Q_KEYS)
            assert_int_equal(kvt_proto_query_token(d, i), q->toks[i]);
        else
            assert_true(kvt_proto_query_key(d, i) == q->keys[i]);
    }
    assert_int_equal(d->npods, q->npods);
    kvt_proto_rd_t r;
    kvt_proto_rd_init(&r, d->pods, d->pods_len);
    for (uint32_t i = 0; i < q->npods; i++)
        assert_true(str_eq(kvt_proto_rd_str(&r), q->pod[i], q->pod_len[i]));
    assert_true(kvt_proto_rd_done(&r));
}

typedef struct ra {
    uint32_t block_size, num_blocks, npods;
    char pod[8][256];
    size_t pod_len[8];
    kvt_proto_pod_ans_t e[8];
} ra_t;

static double rnd_score(void)
{
    switch (rnd_below(4)) {
    case 0: return 0.0;
    case 1: return (double)(int32_t)rnd() / 1024.0;
    case 2: return -(double)rnd_below(1000);
    default: {
        double d;
        do { /* any finite bit pattern */
            uint64_t u = rnd();
            memcpy(&d, &u, 8);
        } while (!isfinite(d));
        return d;
    }
    }
}

static void ra_random(ra_t *a)
{
    a->block_size = rnd_below(2) ? 16 : (uint32_t)rnd();
    a->num_blocks = (uint32_t)rnd();
    a->npods = rnd_below(9);
    for (uint32_t i = 0; i < a->npods; i++) {
        a->pod_len[i] = rnd_name_len(a->pod[i], 1);
        kvt_proto_pod_ans_t *e = &a->e[i];
        e->pod.p = a->pod[i];
        e->pod.len = (uint16_t)a->pod_len[i];
        e->dp_rank = rnd_below(4);
        e->matched = (uint32_t)rnd();
        e->gpu = (uint32_t)rnd();
        e->cpu = (uint32_t)rnd();
        e->disk = (uint32_t)rnd();
        e->score = rnd_score();
    }
}

static void ra_ref(const ra_t *a, uint64_t req_id, ref_t *ref)
{
    size_t off = ref->n;
    ref_hdr(ref, KVT_PROTO_OP_QUERY, KVT_PROTO_F_RESPONSE, req_id, 0);
    ref_le(ref, a->block_size, 4);
    ref_le(ref, a->num_blocks, 4);
    ref_le(ref, a->npods, 4);
    for (uint32_t i = 0; i < a->npods; i++) {
        const kvt_proto_pod_ans_t *e = &a->e[i];
        ref_str(ref, a->pod[i], a->pod_len[i]);
        ref_le(ref, e->dp_rank, 4);
        ref_le(ref, e->matched, 4);
        ref_le(ref, e->gpu, 4);
        ref_le(ref, e->cpu, 4);
        ref_le(ref, e->disk, 4);
        ref_f64(ref, e->score);
    }
    ref_fix_len(ref, off);
}

static void ra_check(const ra_t *a, const kvt_proto_query_ans_t *d)
{
    assert_int_equal(d->block_size, a->block_size);
    assert_int_equal(d->num_blocks, a->num_blocks);
    assert_int_equal(d->npods, a->npods);
    kvt_proto_rd_t r;
    kvt_proto_rd_init(&r, d->pods, d->pods_len);
    for (uint32_t i = 0; i < a->npods; i++) {
        kvt_proto_pod_ans_t g;
        assert_true(kvt_proto_query_ans_next(&r, &g));
        assert_true(str_eq(g.pod, a->pod[i], a->pod_len[i]));
        assert_int_equal(g.dp_rank, a->e[i].dp_rank);
        assert_int_equal(g.matched, a->e[i].matched);
        assert_int_equal(g.gpu, a->e[i].gpu);
        assert_int_equal(g.cpu, a->e[i].cpu);
        assert_int_equal(g.disk, a->e[i].disk);
        assert_memory_equal(&g.score, &a->e[i].score, sizeof(double));
    }
    kvt_proto_pod_ans_t g;
    assert_false(kvt_proto_query_ans_next(&r, &g));
    assert_true(kvt_proto_rd_done(&r));
}

/*
 * Pipelines batches of random QUERY requests and answers into one writer,
 * compares the bytes with the naive reference, then walks the stream frame by
 * frame (header decode, body decode) and checks every field.
 */
static void test_random_roundtrips(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 0xC0FFEE1234ull);
    enum { ROUNDS = 1250, BATCH = 8 }; /* 10,000 queries and 10,000 answers */
    rq_t *qs = calloc(BATCH, sizeof(*qs));
    ra_t *as = calloc(BATCH, sizeof(*as));
    ref_t *ref = calloc(1, sizeof(*ref));
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    size_t frames = 0;

    for (int round = 0; round < ROUNDS; round++) {
        kvt_proto_wr_reset(&w);
        ref->n = 0;
        for (int i = 0; i < BATCH; i++) {
            uint64_t id = (uint64_t)round * BATCH + (uint64_t)i;
            rq_random(&qs[i]);
            kvt_proto_query_req_t req = {{qs[i].model, (uint16_t)qs[i].model_len},
                                         {qs[i].lora, (uint16_t)qs[i].lora_len},
                                         qs[i].kind,
                                         qs[i].n,
                                         qs[i].toks,
                                         qs[i].keys,
                                         qs[i].npods,
                                         qs[i].pods,
                                         {qs[i].salt, (uint16_t)qs[i].salt_len}};
            assert_int_equal(kvt_proto_query_req_encode(&w, id, &req), KVT_OK);
            rq_ref(&qs[i], id, ref);

            ra_random(&as[i]);
            kvt_proto_query_ans_enc_t e;
            kvt_proto_query_ans_begin(&w, id, as[i].block_size, as[i].num_blocks, &e);
            for (uint32_t k = 0; k < as[i].npods; k++)
                kvt_proto_query_ans_add(&w, &e, &as[i].e[k]);
            assert_int_equal(kvt_proto_query_ans_end(&w, &e), KVT_OK);
            ra_ref(&as[i], id, ref);
        }
        assert_int_equal(w.len, ref->n);
        assert_memory_equal(w.buf, ref->b, ref->n);

        size_t off = 0;
        for (int i = 0; i < 2 * BATCH; i++) {
            kvt_proto_hdr_t h;
            assert_true(w.len - off >= KVT_PROTO_HDR_SIZE);
            assert_int_equal(kvt_proto_hdr_decode(w.buf + off, KVT_PROTO_MAX_BODY_DEFAULT, &h),
                             KVT_OK);
            assert_int_equal(h.op, KVT_PROTO_OP_QUERY);
            assert_true(h.req_id == (uint64_t)round * BATCH + (uint64_t)(i / 2));
            off += KVT_PROTO_HDR_SIZE;
            uint8_t *body = dup_exact(w.buf + off, h.body_len);
            if (i % 2 == 0) {
                assert_int_equal(h.flags, 0);
                kvt_proto_query_t d;
                assert_int_equal(kvt_proto_query_decode(body, h.body_len, 64, &d, NULL, 0), KVT_OK);
                rq_check(&qs[i / 2], &d);
                if (d.n > 0)
                    assert_int_equal(kvt_proto_query_decode(body, h.body_len, d.n - 1, &d, NULL, 0),
                                     KVT_ERR_TOO_BIG);
                /* A random cut is always rejected. */
                size_t cut = rnd_below(h.body_len);
                assert_int_equal(kvt_proto_query_decode(body, cut, 64, &d, NULL, 0), KVT_ERR_INVAL);
            } else {
                assert_int_equal(h.flags, KVT_PROTO_F_RESPONSE);
                kvt_proto_query_ans_t d;
                assert_int_equal(kvt_proto_query_ans_decode(body, h.body_len, &d, NULL, 0), KVT_OK);
                ra_check(&as[i / 2], &d);
                size_t cut = rnd_below(h.body_len);
                assert_int_equal(kvt_proto_query_ans_decode(body, cut, &d, NULL, 0), KVT_ERR_INVAL);
            }
            free(body);
            off += h.body_len;
            frames++;
        }
        assert_int_equal(off, w.len);
    }
    assert_int_equal(frames, 2 * ROUNDS * BATCH);
    kvt_proto_wr_cleanup(&w);
    free(ref);
    free(as);
    free(qs);
}

/* Random bytes into every body decoder: no crash, and success only when re-encoding the
 * decoded value gives the same bytes back. */
static void test_random_garbage(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 0xBADC0DEull);
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    size_t accepted = 0;

    for (int iter = 0; iter < 20000; iter++) {
        size_t len = rnd_below(64);
        uint8_t *b = malloc(len + 1);
        for (size_t i = 0; i < len; i++)
            b[i] = rnd_below(3) == 0 ? 0 : (uint8_t)rnd_below(6);
        kvt_proto_err_t e;
        kvt_proto_hello_req_t hr;
        kvt_proto_str_t pod;
        if (kvt_proto_err_decode(b, len, &e, NULL, 0) == KVT_OK) {
            kvt_proto_wr_reset(&w);
            assert_int_equal(
                kvt_proto_err_encode(&w, 1, 0, (kvt_status_t)e.status, e.http, e.msg.p, e.msg.len),
                KVT_OK);
            assert_int_equal(w.len, KVT_PROTO_HDR_SIZE + len);
            assert_memory_equal(w.buf + KVT_PROTO_HDR_SIZE, b, len);
            accepted++;
        }
        if (kvt_proto_hello_req_decode(b, len, &hr, NULL, 0) == KVT_OK) {
            kvt_proto_wr_reset(&w);
            assert_int_equal(kvt_proto_hello_req_encode(&w, 0, &hr), KVT_OK);
            assert_memory_equal(w.buf + KVT_PROTO_HDR_SIZE, b, len);
            accepted++;
        }
        if (kvt_proto_drop_req_decode(b, len, &pod, NULL, 0) == KVT_OK) {
            kvt_proto_wr_reset(&w);
            assert_int_equal(kvt_proto_drop_req_encode(&w, 0, pod), KVT_OK);
            assert_memory_equal(w.buf + KVT_PROTO_HDR_SIZE, b, len);
            accepted++;
        }
        kvt_proto_query_t q;
        if (kvt_proto_query_decode(b, len, 16, &q, NULL, 0) == KVT_OK) {
            uint32_t toks[16];
            uint64_t keys[16];
            kvt_proto_str_t pods[64];
            kvt_proto_rd_t r;
            kvt_proto_rd_init(&r, q.pods, q.pods_len);
            assert_true(q.npods <= 64);
            for (uint32_t i = 0; i < q.npods; i++)
                pods[i] = kvt_proto_rd_str(&r);
            for (uint32_t i = 0; i < q.n; i++) {
                if (q.kind == KVT_PROTO_Q_KEYS)
                    keys[i] = kvt_proto_query_key(&q, i);
                else
                    toks[i] = kvt_proto_query_token(&q, i);
            }
            kvt_proto_query_req_t req = {q.model, q.lora,  q.kind, q.n,   toks,
                                         keys,    q.npods, pods,   q.salt};
            kvt_proto_wr_reset(&w);
            assert_int_equal(kvt_proto_query_req_encode(&w, 0, &req), KVT_OK);
            assert_int_equal(w.len, KVT_PROTO_HDR_SIZE + len);
            assert_memory_equal(w.buf + KVT_PROTO_HDR_SIZE, b, len);
            accepted++;
        }
        free(b);
    }
    assert_true(accepted > 0);
    kvt_proto_wr_cleanup(&w);
}

/* ---- the worked example of docs/protocol.md ------------------------------------------------- */

static const uint8_t doc_hello[] = {0x4b, 0x56, 0x54, 0x31, 0x01, 0x01, 0x00, 0x00, 0x01, 0x00,
                                    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00,
                                    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t doc_query[] = {
    0x4b, 0x56, 0x54, 0x31, 0x01, 0x10, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x35, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x6c, 0x6c, 0x61, 0x6d, 0x61, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00,
    0x00, 0x03, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00,
    0x00, 0x07, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t doc_answer[] = {
    0x4b, 0x56, 0x54, 0x31, 0x01, 0x10, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x52, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x05, 0x00, 0x70, 0x6f, 0x64, 0x2d, 0x61, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x05, 0x00, 0x70, 0x6f, 0x64, 0x2d, 0x62, 0x01, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x9a, 0x99, 0x99, 0x99, 0x99, 0x99, 0xe9, 0x3f};
static const uint8_t doc_error[] = {
    0x4b, 0x56, 0x54, 0x31, 0x01, 0x10, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x9c, 0xff, 0xff, 0xff,
    0x90, 0x01, 0x17, 0x00, 0x71, 0x75, 0x65, 0x72, 0x79, 0x3a, 0x20, 0x65, 0x6d, 0x70,
    0x74, 0x79, 0x20, 0x6d, 0x6f, 0x64, 0x65, 0x6c, 0x20, 0x6e, 0x61, 0x6d, 0x65};

static const uint8_t doc_salted[] = {
    0x4b, 0x56, 0x54, 0x31, 0x01, 0x10, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x3f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x6c, 0x6c, 0x61, 0x6d,
    0x61, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x08, 0x00, 0x74, 0x65, 0x6e, 0x61, 0x6e, 0x74,
    0x2d, 0x61, 0x08, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03,
    0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00,
    0x07, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

/*
 * Reads the hex dumps of the "Worked example" section of docs/protocol.md
 * (lines "OFFS  xx xx ...  comment" inside ``` blocks) into @out, one frame per
 * block. Returns the number of blocks, or -1 when the file cannot be read.
 */
static int read_doc_frames(const char *path, uint8_t out[][128], size_t *lens, int max)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[512];
    int nblocks = 0, in_section = 0, in_block = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "## ", 3) == 0)
            in_section = strncmp(line, "## Worked example", 17) == 0;
        if (!in_section)
            continue;
        if (strncmp(line, "```", 3) == 0) {
            if (in_block)
                nblocks++;
            in_block = !in_block;
            if (in_block) {
                assert_true(nblocks < max);
                lens[nblocks] = 0;
            }
            continue;
        }
        unsigned off;
        if (!in_block || sscanf(line, "%4x", &off) != 1)
            continue;
        assert_int_equal(off, lens[nblocks]); /* offsets are those of the line's first byte */
        for (const char *p = line + 6; p[0] != '\0' && p[0] != ' ' && p[0] != '\n'; p += 3) {
            unsigned b;
            assert_int_equal(sscanf(p, "%2x", &b), 1);
            assert_true(lens[nblocks] < 128);
            out[nblocks][lens[nblocks]++] = (uint8_t)b;
            if (p[2] != ' ')
                break;
        }
    }
    fclose(f);
    return nblocks;
}

static void test_doc_example(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);

    kvt_proto_hello_req_t hello = {KVT_PROTO_VERSION, S("")};
    assert_int_equal(kvt_proto_hello_req_encode(&w, 1, &hello), KVT_OK);
    assert_int_equal(w.len, sizeof(doc_hello));
    assert_memory_equal(w.buf, doc_hello, sizeof(doc_hello));

    kvt_proto_wr_reset(&w);
    const uint32_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvt_proto_query_req_t q = {S("llama"), S(""), KVT_PROTO_Q_TOKENS, 8, toks, NULL, 0,
                               NULL,       S("")};
    assert_int_equal(kvt_proto_query_req_encode(&w, 1, &q), KVT_OK);
    assert_int_equal(w.len, sizeof(doc_query));
    assert_memory_equal(w.buf, doc_query, sizeof(doc_query));

    kvt_proto_wr_reset(&w);
    kvt_proto_query_ans_enc_t e;
    kvt_proto_pod_ans_t a = {S("pod-a"), 0, 2, 2, 0, 0, 2.0};
    kvt_proto_pod_ans_t b = {S("pod-b"), 1, 1, 0, 1, 0, 0.8};
    kvt_proto_query_ans_begin(&w, 1, 4, 2, &e);
    kvt_proto_query_ans_add(&w, &e, &a);
    kvt_proto_query_ans_add(&w, &e, &b);
    assert_int_equal(kvt_proto_query_ans_end(&w, &e), KVT_OK);
    assert_int_equal(w.len, sizeof(doc_answer));
    assert_memory_equal(w.buf, doc_answer, sizeof(doc_answer));

    kvt_proto_wr_reset(&w);
    const char *msg = "query: empty model name";
    assert_int_equal(
        kvt_proto_err_encode(&w, KVT_PROTO_OP_QUERY, 1, KVT_ERR_INVAL, 400, msg, strlen(msg)),
        KVT_OK);
    assert_int_equal(w.len, sizeof(doc_error));
    assert_memory_equal(w.buf, doc_error, sizeof(doc_error));
    /* The codec's own message for an empty model is the one the example shows. */
    char why[256] = "";
    kvt_proto_query_t dq;
    static const uint8_t empty_model[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(
        kvt_proto_query_decode(empty_model, sizeof(empty_model), 10, &dq, why, sizeof(why)),
        KVT_ERR_INVAL);
    assert_string_equal(why, msg);

    /* The salted query (kind 2), and it decodes back to the salt and the tokens. */
    kvt_proto_wr_reset(&w);
    kvt_proto_query_req_t sq = {
        S("llama"), S(""), KVT_PROTO_Q_TOKENS_SALTED, 8, toks, NULL, 0, NULL, S("tenant-a")};
    assert_int_equal(kvt_proto_query_req_encode(&w, 2, &sq), KVT_OK);
    assert_int_equal(w.len, sizeof(doc_salted));
    assert_memory_equal(w.buf, doc_salted, sizeof(doc_salted));
    assert_int_equal(kvt_proto_query_decode(doc_salted + KVT_PROTO_HDR_SIZE,
                                            sizeof(doc_salted) - KVT_PROTO_HDR_SIZE, 8, &dq, why,
                                            sizeof(why)),
                     KVT_OK);
    assert_true(str_eq(dq.salt, "tenant-a", 8));
    assert_int_equal(kvt_proto_query_token(&dq, 7), 8);
    kvt_proto_wr_cleanup(&w);

    /* The document itself, when the source tree is known (ctest sets KVT_SOURCE_DIR). */
    const char *src = getenv("KVT_SOURCE_DIR");
    if (src == NULL)
        return;
    char path[1024];
    snprintf(path, sizeof(path), "%s/docs/protocol.md", src);
    uint8_t frames[5][128];
    size_t lens[5];
    int n = read_doc_frames(path, frames, lens, 5);
    assert_int_equal(n, 5);
    const uint8_t *want[5] = {doc_hello, doc_query, doc_answer, doc_error, doc_salted};
    const size_t wlen[5] = {sizeof(doc_hello), sizeof(doc_query), sizeof(doc_answer),
                            sizeof(doc_error), sizeof(doc_salted)};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(lens[i], wlen[i]);
        assert_memory_equal(frames[i], want[i], wlen[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hdr_roundtrip),
        cmocka_unit_test(test_hdr_rejects),
        cmocka_unit_test(test_http_status),
        cmocka_unit_test(test_reader),
        cmocka_unit_test(test_writer),
        cmocka_unit_test(test_hello),
        cmocka_unit_test(test_drop_and_raw),
        cmocka_unit_test(test_error_body),
        cmocka_unit_test(test_query_roundtrip),
        cmocka_unit_test(test_query_rejects),
        cmocka_unit_test(test_query_salted),
        cmocka_unit_test(test_query_answer),
        cmocka_unit_test(test_random_roundtrips),
        cmocka_unit_test(test_random_garbage),
        cmocka_unit_test(test_doc_example),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
