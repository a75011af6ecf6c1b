/*
 * proto/proto_xfer.c: the transfer's frames. Every request and answer is
 * encoded from random contents and compared byte for byte with an encoding
 * written here from docs/protocol.md ("Transfer"), decoded back and encoded
 * again to the same bytes; every truncation, a trailing byte, a count over
 * the caller's capacity and over KVT_PROTO_XFER_MAX_KEYS are refused with a
 * message naming the body, and leave every output as it was; then each rule
 * of each body, on both sides (the decoder refuses it, the encoder will not
 * write it). The docs' XFER_PIN example is this codec's bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/support/docblock.h"
#include "tests/support/rng.h"
#include "tests/support/wire.h"

#define MAXN 300u /* the most entries a random frame carries */

static kvt_rng_t g_rng;

static uint64_t rnd(void)
{
    return kvt_rng_next(&g_rng);
}

static uint32_t below(uint32_t n)
{
    return (uint32_t)kvt_rng_below(&g_rng, n);
}

/* 1..MAXN, small counts often. */
static uint32_t rand_n(void)
{
    return 1 + below(below(3) == 0 ? 4 : MAXN);
}

/* A nonzero u64, sometimes a small one. */
static uint64_t rnd_nz(void)
{
    uint64_t v = below(4) == 0 ? 1 + below(3) : rnd();
    return v != 0 ? v : 1;
}

typedef struct name {
    char b[KVT_PROTO_MAX_STR];
    kvt_proto_str_t s;
} name_t;

/* A str of @min..255 bytes, each 1..255. */
static void rand_name(name_t *nm, uint32_t min)
{
    uint32_t len = min + below((below(2) ? 16 : KVT_PROTO_MAX_STR) - min + 1);
    for (uint32_t i = 0; i < len; i++)
        nm->b[i] = (char)(1 + below(255));
    nm->s = (kvt_proto_str_t){nm->b, (uint16_t)len};
}

static kvt_proto_str_t cstr(const char *s)
{
    return (kvt_proto_str_t){s, (uint16_t)strlen(s)};
}

/* ---- the reference encoding ----------------------------------------------------------------- */

static void put_str(kvt_wire_t *o, kvt_proto_str_t s)
{
    kvt_wire_str(o, s.p, s.len);
}

/* ---- every decoder behind one signature ------------------------------------------------------ */

/* Every output a decoder may write; filled with a pattern before each call. */
typedef struct out {
    uint64_t u64; /* hello request's expect */
    kvt_proto_xfer_hello_ans_t hello;
    kvt_proto_xfer_keys_t keys;
    kvt_proto_xfer_slots_ans_t slots;
    kvt_proto_xfer_lease_t lease;
    kvt_proto_xfer_commit_t commit;
    kvt_proto_transfer_req_t treq;
    kvt_proto_transfer_ans_t tans;
    uint32_t count;
    uint64_t k[MAXN + 1], k2[MAXN + 1];
    uint32_t u[MAXN + 1];
    uint8_t flags[MAXN + 1];
    kvt_proto_xfer_pinned_t pins[MAXN + 1];
    kvt_proto_xfer_landed_t landed[MAXN + 1];
    kvt_proto_xfer_failed_t failed[MAXN + 1];
} out_t;

static out_t g_out, g_fill;

static void out_reset(void)
{
    memset(&g_out, 0xA5, sizeof(g_out));
    memset(&g_fill, 0xA5, sizeof(g_fill));
}

typedef kvt_status_t (*dec_fn)(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                               size_t errlen);

static kvt_status_t d_hello_req(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                                size_t errlen)
{
    (void)cap;
    return kvt_proto_xfer_hello_req_decode(b, len, &o->u64, err, errlen);
}

static kvt_status_t d_hello_ans(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                                size_t errlen)
{
    (void)cap;
    return kvt_proto_xfer_hello_ans_decode(b, len, &o->hello, err, errlen);
}

static kvt_status_t d_pin_req(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                              size_t errlen)
{
    return kvt_proto_xfer_pin_req_decode(b, len, o->k, cap, &o->keys, err, errlen);
}

static kvt_status_t d_reserve_req(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                                  size_t errlen)
{
    return kvt_proto_xfer_reserve_req_decode(b, len, o->k, o->u, cap, &o->keys, err, errlen);
}

static kvt_status_t d_pin_ans(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                              size_t errlen)
{
    return kvt_proto_xfer_pin_ans_decode(b, len, o->pins, cap, &o->slots, err, errlen);
}

static kvt_status_t d_reserve_ans(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                                  size_t errlen)
{
    return kvt_proto_xfer_reserve_ans_decode(b, len, o->u, cap, &o->slots, err, errlen);
}

static kvt_status_t d_renew(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                            size_t errlen)
{
    (void)cap;
    return kvt_proto_xfer_lease_req_decode(KVT_PROTO_OP_XFER_RENEW, b, len, &o->lease, err, errlen);
}

static kvt_status_t d_release(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                              size_t errlen)
{
    (void)cap;
    return kvt_proto_xfer_lease_req_decode(KVT_PROTO_OP_XFER_RELEASE, b, len, &o->lease, err,
                                           errlen);
}

static kvt_status_t d_commit_req(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                                 size_t errlen)
{
    return kvt_proto_xfer_commit_req_decode(b, len, o->landed, cap, &o->commit, err, errlen);
}

static kvt_status_t d_commit_ans(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                                 size_t errlen)
{
    return kvt_proto_xfer_commit_ans_decode(b, len, o->flags, cap, &o->count, err, errlen);
}

static kvt_status_t d_transfer_req(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                                   size_t errlen)
{
    return kvt_proto_transfer_req_decode(b, len, o->k, cap, &o->treq, err, errlen);
}

static kvt_status_t d_transfer_ans(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                                   size_t errlen)
{
    return kvt_proto_transfer_ans_decode(b, len, o->k, o->k2, o->failed, cap, &o->tans, err,
                                         errlen);
}

/* ---- refusals ------------------------------------------------------------------------------- */

/*
 * @dec refuses an exact-size copy of @body with @want and one line "@what: ..."
 * mentioning @part (when not NULL), writing no output; the same without room
 * for the line.
 */
static void refused(dec_fn dec, const uint8_t *body, size_t len, uint32_t cap, kvt_status_t want,
                    const char *what, const char *part)
{
    char err[256] = "unset";
    uint8_t *copy = kvt_wire_dup(body, len);
    out_reset();
    kvt_status_t st = dec(copy, len, cap, &g_out, err, sizeof(err));
    if (st != want)
        fail_msg("%s (len %zu, cap %u): status %d, want %d (\"%s\")", what, len, cap, st, want,
                 err);
    size_t wl = strlen(what), el = strlen(err);
    if (strncmp(err, what, wl) != 0 || err[wl] != ':' || err[wl + 1] != ' ' || el < wl + 3 ||
        strchr(err, '\n') != NULL || err[el - 1] == '.')
        fail_msg("message \"%s\" is not one line \"%s: ...\"", err, what);
    if (part != NULL && strstr(err, part) == NULL)
        fail_msg("message \"%s\" does not mention \"%s\"", err, part);
    if (memcmp(&g_out, &g_fill, sizeof(g_out)) != 0)
        fail_msg("%s: a refused body wrote an output", what);
    assert_int_equal(dec(copy, len, cap, &g_out, NULL, 0), want);
    free(copy);
}

/* A valid @body: every truncation, one and eight trailing bytes, and (when it counts @n > 0
 * entries) a capacity of n - 1 are refused. */
static void refused_faults(dec_fn dec, const uint8_t *body, size_t len, uint32_t n,
                           const char *what)
{
    for (size_t i = 0; i < len; i++)
        refused(dec, body, i, MAXN, KVT_ERR_INVAL, what, NULL);
    uint8_t *more = malloc(len + 8);
    assert_non_null(more);
    memcpy(more, body, len);
    memset(more + len, 0x33, 8);
    refused(dec, more, len + 1, MAXN, KVT_ERR_INVAL, what, "1 byte after");
    refused(dec, more, len + 8, MAXN, KVT_ERR_INVAL, what, "8 bytes after");
    free(more);
    if (n > 0)
        refused(dec, body, len, n - 1, KVT_ERR_TOO_BIG, what, NULL);
}

/* ---- frames --------------------------------------------------------------------------------- */

/* The one frame in @w has @op, @flags, @req_id and body @want; returns an exact copy of it. */
static uint8_t *frame_is(const kvt_proto_wr_t *w, uint8_t op, uint16_t flags, uint64_t req_id,
                         const kvt_wire_t *want)
{
    kvt_proto_hdr_t h;
    assert_int_equal(w->len, KVT_PROTO_HDR_SIZE + want->n);
    assert_int_equal(kvt_proto_hdr_decode(w->buf, KVT_PROTO_MAX_BODY_LIMIT, &h), KVT_OK);
    assert_true(h.op == op && h.flags == flags && h.req_id == req_id && h.body_len == want->n);
    if (memcmp(w->buf + KVT_PROTO_HDR_SIZE, want->b, want->n) != 0)
        assert_memory_equal(w->buf + KVT_PROTO_HDR_SIZE, want->b, want->n);
    return kvt_wire_dup(want->b, want->n);
}

/* Re-encoding what was decoded from @body gave the same frame again (it is now in @w). */
static void same_again(const kvt_proto_wr_t *w, const uint8_t *body, size_t len)
{
    assert_int_equal(w->len, KVT_PROTO_HDR_SIZE + len);
    assert_memory_equal(w->buf + KVT_PROTO_HDR_SIZE, body, len);
}

static void test_ops(void **state)
{
    (void)state;
    static const uint8_t ops[] = {KVT_PROTO_OP_XFER_HELLO,   KVT_PROTO_OP_XFER_PIN,
                                  KVT_PROTO_OP_XFER_RENEW,   KVT_PROTO_OP_XFER_RELEASE,
                                  KVT_PROTO_OP_XFER_RESERVE, KVT_PROTO_OP_XFER_COMMIT,
                                  KVT_PROTO_OP_TRANSFER};
    static const char *names[] = {"XFER_HELLO",   "XFER_PIN",    "XFER_RENEW", "XFER_RELEASE",
                                  "XFER_RESERVE", "XFER_COMMIT", "TRANSFER"};
    for (size_t i = 0; i < sizeof(ops); i++) {
        assert_int_equal(ops[i], 0x50 + i);
        assert_true(kvt_proto_op_known(ops[i]));
        assert_true(kvt_proto_op_mutating(ops[i]));
        assert_false(kvt_proto_op_keys(ops[i]));
        assert_string_equal(kvt_proto_op_name(ops[i]), names[i]);
    }
    for (int op = 0x57; op <= 0x5F; op++)
        assert_false(kvt_proto_op_known((uint8_t)op));
    /* the reasons, by number and by name */
    static const char *reasons[] = {NULL,      "peer_down", "peer_restarted", "checksum",
                                    "timeout", "no_room",   "evicted",        "error"};
    for (unsigned r = 0; r < 256; r++) {
        const char *name = kvt_proto_xfer_reason_name((uint8_t)r);
        if (r == 0 || r > KVT_PROTO_XFER_FAIL_MAX) {
            assert_null(name);
            continue;
        }
        assert_string_equal(name, reasons[r]);
        assert_int_equal(kvt_proto_xfer_reason_parse(name, strlen(name)), r);
    }
    assert_int_equal(kvt_proto_xfer_reason_parse("peer", 4), 0);
    assert_int_equal(kvt_proto_xfer_reason_parse("", 0), 0);
    /* a stale incarnation has a status of its own */
    assert_string_equal(kvt_status_str(KVT_ERR_STALE), "peer restarted");
    assert_int_equal(kvt_proto_http_status(KVT_ERR_STALE), 412);
}

/* ---- round trips ---------------------------------------------------------------------------- */

static void test_hello_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 1);
    static uint8_t addr[700], rkey[300];
    for (int round = 0; round < 200; round++) {
        uint64_t expect = below(3) == 0 ? 0 : rnd(), req_id = rnd();
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_hello_req_encode(&w, req_id, expect), KVT_OK);
        kvt_wire_t ref = {.n = 0};
        kvt_wire_put(&ref, expect, 8);
        uint8_t *body = frame_is(&w, KVT_PROTO_OP_XFER_HELLO, 0, req_id, &ref);
        out_reset();
        assert_int_equal(kvt_proto_xfer_hello_req_decode(body, ref.n, &g_out.u64, NULL, 0), KVT_OK);
        assert_true(g_out.u64 == expect);
        refused_faults(d_hello_req, body, ref.n, 0, "xfer_hello");
        free(body);

        kvt_proto_xfer_hello_ans_t h = {.incarnation = rnd_nz(),
                                        .slot_bytes = 1 + below(1u << 24),
                                        .nslots = 1 + below(1u << 20),
                                        .addr_len = 1 + below(sizeof(addr)),
                                        .addr = addr,
                                        .rkey_len = 1 + below(sizeof(rkey)),
                                        .rkey = rkey};
        name_t host, upath;
        rand_name(&host, 0);
        rand_name(&upath, 0);
        h.host = host.s;
        h.unix_path = upath.s;
        uint64_t span = (uint64_t)h.nslots * h.slot_bytes;
        h.base = below(2) ? UINT64_MAX - span + 1 : rnd() % (UINT64_MAX - span);
        for (uint32_t i = 0; i < h.addr_len; i++)
            addr[i] = (uint8_t)rnd();
        for (uint32_t i = 0; i < h.rkey_len; i++)
            rkey[i] = (uint8_t)rnd();
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_hello_ans_encode(&w, req_id, &h), KVT_OK);
        ref.n = 0;
        kvt_wire_put(&ref, h.incarnation, 8);
        kvt_wire_put(&ref, h.slot_bytes, 4);
        kvt_wire_put(&ref, h.nslots, 4);
        kvt_wire_put(&ref, h.base, 8);
        kvt_wire_put(&ref, h.addr_len, 4);
        kvt_wire_raw(&ref, addr, h.addr_len);
        kvt_wire_put(&ref, h.rkey_len, 4);
        kvt_wire_raw(&ref, rkey, h.rkey_len);
        kvt_wire_str(&ref, host.b, host.s.len);
        kvt_wire_str(&ref, upath.b, upath.s.len);
        body = frame_is(&w, KVT_PROTO_OP_XFER_HELLO, KVT_PROTO_F_RESPONSE, req_id, &ref);
        out_reset();
        kvt_proto_xfer_hello_ans_t *d = &g_out.hello;
        assert_int_equal(kvt_proto_xfer_hello_ans_decode(body, ref.n, d, NULL, 0), KVT_OK);
        assert_true(d->incarnation == h.incarnation && d->base == h.base);
        assert_true(d->slot_bytes == h.slot_bytes && d->nslots == h.nslots);
        assert_true(d->addr_len == h.addr_len && d->addr == body + 28);
        assert_memory_equal(d->addr, addr, h.addr_len);
        assert_true(d->rkey_len == h.rkey_len && d->rkey == body + 32 + h.addr_len);
        assert_memory_equal(d->rkey, rkey, h.rkey_len);
        assert_true(d->host.len == host.s.len && d->unix_path.len == upath.s.len);
        assert_memory_equal(d->host.p, host.b, host.s.len);
        assert_true(d->unix_path.p + d->unix_path.len == (const char *)body + ref.n);
        assert_memory_equal(d->unix_path.p, upath.b, upath.s.len);
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_hello_ans_encode(&w, req_id, d), KVT_OK);
        same_again(&w, body, ref.n);
        if (round % 4 == 0)
            refused_faults(d_hello_ans, body, ref.n, 0, "xfer_hello answer");
        free(body);
    }
    kvt_proto_wr_cleanup(&w);
}

/* A random XFER_PIN / XFER_RESERVE head (@model and @lora hold its names). */
static kvt_proto_xfer_keys_t rand_keys_head(name_t *model, name_t *lora, uint32_t n)
{
    rand_name(model, 1);
    rand_name(lora, 0);
    return (kvt_proto_xfer_keys_t){.incarnation = rnd_nz(),
                                   .lease = below(2) ? 0 : rnd(),
                                   .model = model->s,
                                   .lora = lora->s,
                                   .lease_ms = below(KVT_PROTO_XFER_MAX_LEASE_MS + 1),
                                   .n = n};
}

static void put_keys_head(kvt_wire_t *ref, const kvt_proto_xfer_keys_t *k)
{
    kvt_wire_put(ref, k->incarnation, 8);
    kvt_wire_put(ref, k->lease, 8);
    put_str(ref, k->model);
    put_str(ref, k->lora);
    kvt_wire_put(ref, k->lease_ms, 4);
    kvt_wire_put(ref, k->n, 4);
}

static void keys_head_is(const kvt_proto_xfer_keys_t *d, const kvt_proto_xfer_keys_t *k)
{
    assert_true(d->incarnation == k->incarnation && d->lease == k->lease);
    assert_true(d->lease_ms == k->lease_ms && d->n == k->n);
    assert_true(d->model.len == k->model.len && memcmp(d->model.p, k->model.p, k->model.len) == 0);
    assert_true(d->lora.len == k->lora.len &&
                (k->lora.len == 0 || memcmp(d->lora.p, k->lora.p, k->lora.len) == 0));
}

static void test_pin_reserve_requests_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 2);
    for (int round = 0; round < 200; round++) {
        uint32_t n = rand_n();
        name_t model, lora;
        kvt_proto_xfer_keys_t k = rand_keys_head(&model, &lora, n);
        uint64_t keys[MAXN], req_id = rnd();
        uint32_t lens[MAXN];
        for (uint32_t i = 0; i < n; i++) {
            keys[i] = rnd();
            lens[i] = 1 + (uint32_t)(rnd() % (below(2) ? 64 : UINT32_MAX));
        }
        bool reserve = round % 2 == 1;
        kvt_proto_wr_reset(&w);
        kvt_wire_t ref = {.n = 0};
        put_keys_head(&ref, &k);
        for (uint32_t i = 0; i < n; i++)
            kvt_wire_put(&ref, keys[i], 8);
        if (reserve) {
            for (uint32_t i = 0; i < n; i++)
                kvt_wire_put(&ref, lens[i], 4);
            assert_int_equal(kvt_proto_xfer_reserve_req_encode(&w, req_id, &k, keys, lens), KVT_OK);
        } else {
            assert_int_equal(kvt_proto_xfer_pin_req_encode(&w, req_id, &k, keys), KVT_OK);
        }
        uint8_t op = reserve ? KVT_PROTO_OP_XFER_RESERVE : KVT_PROTO_OP_XFER_PIN;
        uint8_t *body = frame_is(&w, op, 0, req_id, &ref);
        out_reset();
        kvt_status_t st =
            reserve ? kvt_proto_xfer_reserve_req_decode(body, ref.n, g_out.k, g_out.u, n,
                                                        &g_out.keys, NULL, 0)
                    : kvt_proto_xfer_pin_req_decode(body, ref.n, g_out.k, n, &g_out.keys, NULL, 0);
        assert_int_equal(st, KVT_OK);
        keys_head_is(&g_out.keys, &k);
        assert_memory_equal(g_out.k, keys, n * 8);
        assert_true(g_out.k[n] == g_fill.k[n]);
        if (reserve)
            assert_memory_equal(g_out.u, lens, n * 4);
        kvt_proto_wr_reset(&w);
        assert_int_equal(
            reserve ? kvt_proto_xfer_reserve_req_encode(&w, req_id, &g_out.keys, g_out.k, g_out.u)
                    : kvt_proto_xfer_pin_req_encode(&w, req_id, &g_out.keys, g_out.k),
            KVT_OK);
        same_again(&w, body, ref.n);
        if (round % 4 < 2)
            refused_faults(reserve ? d_reserve_req : d_pin_req, body, ref.n, n,
                           reserve ? "xfer_reserve" : "xfer_pin");
        free(body);
    }
    kvt_proto_wr_cleanup(&w);
}

static void test_pin_reserve_answers_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 3);
    for (int round = 0; round < 200; round++) {
        uint32_t n = rand_n();
        uint64_t req_id = rnd();
        bool held = false;
        kvt_proto_xfer_pinned_t pins[MAXN];
        uint32_t slots[MAXN];
        for (uint32_t i = 0; i < n; i++) {
            uint32_t kind = below(4);
            if (kind == 0) {
                pins[i] = (kvt_proto_xfer_pinned_t){KVT_PROTO_SLOT_NONE, 0, 0};
                slots[i] = below(2) ? KVT_PROTO_SLOT_NONE : KVT_PROTO_XFER_SLOT_HELD;
            } else {
                pins[i] = (kvt_proto_xfer_pinned_t){below(1u << 20), 1 + below(1u << 24), rnd()};
                slots[i] = pins[i].slot;
                held = true;
            }
        }
        kvt_proto_xfer_slots_ans_t a = {held || below(2) ? rnd_nz() : 0, n};

        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_pin_ans_encode(&w, req_id, &a, pins), KVT_OK);
        kvt_wire_t ref = {.n = 0};
        kvt_wire_put(&ref, a.lease, 8);
        kvt_wire_put(&ref, n, 4);
        for (uint32_t i = 0; i < n; i++) {
            kvt_wire_put(&ref, pins[i].slot, 4);
            kvt_wire_put(&ref, pins[i].len, 4);
            kvt_wire_put(&ref, pins[i].sum, 8);
        }
        uint8_t *body = frame_is(&w, KVT_PROTO_OP_XFER_PIN, KVT_PROTO_F_RESPONSE, req_id, &ref);
        out_reset();
        assert_int_equal(
            kvt_proto_xfer_pin_ans_decode(body, ref.n, g_out.pins, n, &g_out.slots, NULL, 0),
            KVT_OK);
        assert_true(g_out.slots.lease == a.lease && g_out.slots.n == n);
        assert_memory_equal(g_out.pins, pins, n * sizeof(pins[0]));
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_pin_ans_encode(&w, req_id, &g_out.slots, g_out.pins),
                         KVT_OK);
        same_again(&w, body, ref.n);
        if (round % 4 == 0)
            refused_faults(d_pin_ans, body, ref.n, n, "xfer_pin answer");
        free(body);

        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_reserve_ans_encode(&w, req_id, &a, slots), KVT_OK);
        ref.n = 0;
        kvt_wire_put(&ref, a.lease, 8);
        kvt_wire_put(&ref, n, 4);
        for (uint32_t i = 0; i < n; i++)
            kvt_wire_put(&ref, slots[i], 4);
        body = frame_is(&w, KVT_PROTO_OP_XFER_RESERVE, KVT_PROTO_F_RESPONSE, req_id, &ref);
        out_reset();
        assert_int_equal(
            kvt_proto_xfer_reserve_ans_decode(body, ref.n, g_out.u, n, &g_out.slots, NULL, 0),
            KVT_OK);
        assert_true(g_out.slots.lease == a.lease && g_out.slots.n == n);
        assert_memory_equal(g_out.u, slots, n * 4);
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_reserve_ans_encode(&w, req_id, &g_out.slots, g_out.u),
                         KVT_OK);
        same_again(&w, body, ref.n);
        if (round % 4 == 1)
            refused_faults(d_reserve_ans, body, ref.n, n, "xfer_reserve answer");
        free(body);
    }
    kvt_proto_wr_cleanup(&w);
}

static void test_lease_commit_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 4);
    for (int round = 0; round < 200; round++) {
        uint64_t req_id = rnd();
        /* XFER_RENEW and XFER_RELEASE */
        bool renew = round % 2 == 0;
        uint8_t op = renew ? KVT_PROTO_OP_XFER_RENEW : KVT_PROTO_OP_XFER_RELEASE;
        kvt_proto_xfer_lease_t l = {rnd_nz(), rnd_nz(),
                                    renew ? below(KVT_PROTO_XFER_MAX_LEASE_MS + 1) : 0};
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_lease_req_encode(&w, op, req_id, &l), KVT_OK);
        kvt_wire_t ref = {.n = 0};
        kvt_wire_put(&ref, l.incarnation, 8);
        kvt_wire_put(&ref, l.lease, 8);
        if (renew)
            kvt_wire_put(&ref, l.lease_ms, 4);
        uint8_t *body = frame_is(&w, op, 0, req_id, &ref);
        out_reset();
        assert_int_equal(kvt_proto_xfer_lease_req_decode(op, body, ref.n, &g_out.lease, NULL, 0),
                         KVT_OK);
        assert_true(g_out.lease.incarnation == l.incarnation && g_out.lease.lease == l.lease &&
                    g_out.lease.lease_ms == l.lease_ms);
        refused_faults(renew ? d_renew : d_release, body, ref.n, 0,
                       renew ? "xfer_renew" : "xfer_release");
        free(body);
        /* their answers: one count */
        uint32_t count = (uint32_t)rnd();
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_count_ans_encode(&w, op, req_id, count), KVT_OK);
        uint32_t got = 0;
        assert_int_equal(kvt_proto_count_ans_decode(w.buf + KVT_PROTO_HDR_SIZE, 4, &got, NULL, 0),
                         KVT_OK);
        assert_int_equal(got, count);

        /* XFER_COMMIT request and answer */
        uint32_t n = rand_n();
        kvt_proto_xfer_commit_t c = {rnd_nz(), rnd_nz(), n};
        kvt_proto_xfer_landed_t landed[MAXN];
        uint8_t visible[MAXN];
        memset(landed, 0, sizeof(landed)); /* the padding too: compared with memcmp below */
        for (uint32_t i = 0; i < n; i++) {
            landed[i].key = rnd();
            landed[i].sum = rnd();
            landed[i].ok = below(4) != 0;
            visible[i] = landed[i].ok && below(4) != 0;
        }
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_commit_req_encode(&w, req_id, &c, landed), KVT_OK);
        ref.n = 0;
        kvt_wire_put(&ref, c.incarnation, 8);
        kvt_wire_put(&ref, c.lease, 8);
        kvt_wire_put(&ref, n, 4);
        for (uint32_t i = 0; i < n; i++) {
            kvt_wire_put(&ref, landed[i].key, 8);
            kvt_wire_put(&ref, landed[i].sum, 8);
            kvt_wire_put(&ref, landed[i].ok, 1);
        }
        body = frame_is(&w, KVT_PROTO_OP_XFER_COMMIT, 0, req_id, &ref);
        out_reset();
        memset(g_out.landed, 0, sizeof(g_out.landed));
        assert_int_equal(
            kvt_proto_xfer_commit_req_decode(body, ref.n, g_out.landed, n, &g_out.commit, NULL, 0),
            KVT_OK);
        assert_true(g_out.commit.incarnation == c.incarnation && g_out.commit.lease == c.lease &&
                    g_out.commit.n == n);
        for (uint32_t i = 0; i < n; i++)
            assert_true(g_out.landed[i].key == landed[i].key &&
                        g_out.landed[i].sum == landed[i].sum && g_out.landed[i].ok == landed[i].ok);
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_commit_req_encode(&w, req_id, &g_out.commit, g_out.landed),
                         KVT_OK);
        same_again(&w, body, ref.n);
        if (round % 4 == 0)
            refused_faults(d_commit_req, body, ref.n, n, "xfer_commit");
        free(body);

        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_xfer_commit_ans_encode(&w, req_id, visible, n), KVT_OK);
        ref.n = 0;
        kvt_wire_put(&ref, n, 4);
        kvt_wire_raw(&ref, visible, n);
        body = frame_is(&w, KVT_PROTO_OP_XFER_COMMIT, KVT_PROTO_F_RESPONSE, req_id, &ref);
        out_reset();
        assert_int_equal(
            kvt_proto_xfer_commit_ans_decode(body, ref.n, g_out.flags, n, &g_out.count, NULL, 0),
            KVT_OK);
        assert_int_equal(g_out.count, n);
        assert_memory_equal(g_out.flags, visible, n);
        if (round % 4 == 1)
            refused_faults(d_commit_ans, body, ref.n, n, "xfer_commit answer");
        free(body);
    }
    kvt_proto_wr_cleanup(&w);
}

static const char *const good_peers[] = {"127.0.0.1:7420", "[::1]:1", "sp-0.prefill.svc:65535",
                                         "h:80"};

static void test_transfer_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 5);
    for (int round = 0; round < 200; round++) {
        uint64_t req_id = rnd(), keys[MAXN];
        uint32_t n = rand_n();
        name_t model, lora;
        rand_name(&model, 1);
        rand_name(&lora, 0);
        kvt_proto_transfer_req_t t = {.peer = cstr(good_peers[below(4)]),
                                      .model = model.s,
                                      .lora = lora.s,
                                      .direction = (uint8_t)below(2),
                                      .flags = 0,
                                      .timeout_ms = below(KVT_PROTO_XFER_MAX_TIMEOUT_MS + 1),
                                      .n = n};
        if (t.direction == KVT_PROTO_XFER_PUSH && below(2))
            t.flags = KVT_PROTO_XFER_STREAM;
        for (uint32_t i = 0; i < n; i++)
            keys[i] = rnd();
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_transfer_req_encode(&w, req_id, &t, keys), KVT_OK);
        kvt_wire_t ref = {.n = 0};
        put_str(&ref, t.peer);
        put_str(&ref, t.model);
        put_str(&ref, t.lora);
        kvt_wire_put(&ref, t.direction, 1);
        kvt_wire_put(&ref, t.flags, 1);
        kvt_wire_put(&ref, 0, 2);
        kvt_wire_put(&ref, t.timeout_ms, 4);
        kvt_wire_put(&ref, n, 4);
        for (uint32_t i = 0; i < n; i++)
            kvt_wire_put(&ref, keys[i], 8);
        uint8_t *body = frame_is(&w, KVT_PROTO_OP_TRANSFER, 0, req_id, &ref);
        out_reset();
        kvt_proto_transfer_req_t *d = &g_out.treq;
        assert_int_equal(kvt_proto_transfer_req_decode(body, ref.n, g_out.k, n, d, NULL, 0),
                         KVT_OK);
        assert_true(d->peer.len == t.peer.len && memcmp(d->peer.p, t.peer.p, t.peer.len) == 0);
        assert_true(d->direction == t.direction && d->timeout_ms == t.timeout_ms && d->n == n);
        assert_int_equal(d->flags, t.flags);
        assert_memory_equal(g_out.k, keys, n * 8);
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_transfer_req_encode(&w, req_id, d, g_out.k), KVT_OK);
        same_again(&w, body, ref.n);
        if (round % 4 == 0)
            refused_faults(d_transfer_req, body, ref.n, n, "transfer");
        free(body);

        /* the answer: the keys split among the three lists */
        uint64_t tr[MAXN], mi[MAXN];
        kvt_proto_xfer_failed_t fa[MAXN];
        kvt_proto_transfer_ans_t a = {.bytes = rnd(), .ns = rnd()};
        memset(fa, 0, sizeof(fa));
        for (uint32_t i = 0; i < n; i++) {
            uint32_t which = below(3);
            if (which == 0)
                tr[a.ntransferred++] = keys[i];
            else if (which == 1)
                mi[a.nmissing++] = keys[i];
            else
                fa[a.nfailed++] = (kvt_proto_xfer_failed_t){
                    keys[i], (uint8_t)(1 + below(KVT_PROTO_XFER_FAIL_MAX))};
        }
        a.transferred = a.ntransferred ? tr : NULL;
        a.missing = a.nmissing ? mi : NULL;
        a.failed = a.nfailed ? fa : NULL;
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_transfer_ans_encode(&w, req_id, &a), KVT_OK);
        ref.n = 0;
        kvt_wire_put(&ref, a.bytes, 8);
        kvt_wire_put(&ref, a.ns, 8);
        kvt_wire_put(&ref, a.ntransferred, 4);
        for (uint32_t i = 0; i < a.ntransferred; i++)
            kvt_wire_put(&ref, tr[i], 8);
        kvt_wire_put(&ref, a.nmissing, 4);
        for (uint32_t i = 0; i < a.nmissing; i++)
            kvt_wire_put(&ref, mi[i], 8);
        kvt_wire_put(&ref, a.nfailed, 4);
        for (uint32_t i = 0; i < a.nfailed; i++) {
            kvt_wire_put(&ref, fa[i].key, 8);
            kvt_wire_put(&ref, fa[i].reason, 1);
        }
        body = frame_is(&w, KVT_PROTO_OP_TRANSFER, KVT_PROTO_F_RESPONSE, req_id, &ref);
        out_reset();
        kvt_proto_transfer_ans_t *da = &g_out.tans;
        assert_int_equal(kvt_proto_transfer_ans_decode(body, ref.n, g_out.k, g_out.k2, g_out.failed,
                                                       n, da, NULL, 0),
                         KVT_OK);
        assert_true(da->bytes == a.bytes && da->ns == a.ns);
        assert_true(da->ntransferred == a.ntransferred && da->nmissing == a.nmissing &&
                    da->nfailed == a.nfailed);
        assert_true(da->transferred == g_out.k && da->missing == g_out.k2 &&
                    da->failed == g_out.failed);
        assert_memory_equal(g_out.k, tr, a.ntransferred * 8);
        assert_memory_equal(g_out.k2, mi, a.nmissing * 8);
        for (uint32_t i = 0; i < a.nfailed; i++)
            assert_true(g_out.failed[i].key == fa[i].key && g_out.failed[i].reason == fa[i].reason);
        kvt_proto_wr_reset(&w);
        assert_int_equal(kvt_proto_transfer_ans_encode(&w, req_id, da), KVT_OK);
        same_again(&w, body, ref.n);
        if (round % 4 == 1) {
            uint32_t most = a.ntransferred > a.nmissing ? a.ntransferred : a.nmissing;
            refused_faults(d_transfer_ans, body, ref.n, most > a.nfailed ? most : a.nfailed,
                           "transfer answer");
        }
        free(body);
    }
    kvt_proto_wr_cleanup(&w);
}

/* ---- each rule, both ways ------------------------------------------------------------------- */

/* An encoder's refusal leaves the writer as it was (empty here). */
static void enc_refused(kvt_status_t got, kvt_status_t want, const kvt_proto_wr_t *w)
{
    assert_int_equal(got, want);
    assert_int_equal(w->len, 0);
}

static void test_hello_rules(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    const uint8_t blob[3] = {1, 2, 3};
    kvt_proto_xfer_hello_ans_t good = {7,    4096, 10,   0x7f0000000000ull, 3,
                                       blob, 3,    blob, cstr("b"),         cstr("/s")};
    struct {
        kvt_proto_xfer_hello_ans_t h;
        const char *part;
    } bad[] = {
        {{0, 4096, 10, 0, 3, blob, 3, blob, {NULL, 0}, {NULL, 0}}, "incarnation is 0"},
        {{7, 0, 10, 0, 3, blob, 3, blob, {NULL, 0}, {NULL, 0}}, "slot_bytes is 0"},
        {{7, 4096, 0, 0, 3, blob, 3, blob, {NULL, 0}, {NULL, 0}}, "nslots is 0"},
        {{7, 4096, 10, UINT64_MAX - 40958, 3, blob, 3, blob, {NULL, 0}, {NULL, 0}},
         "past the address space"},
        {{7, 4096, 10, 0, 0, blob, 3, blob, {NULL, 0}, {NULL, 0}}, "addr_len is 0"},
        {{7, 4096, 10, 0, KVT_PROTO_XFER_MAX_BLOB + 1, blob, 3, blob, {NULL, 0}, {NULL, 0}},
         "addr_len is 65537"},
        {{7, 4096, 10, 0, 3, blob, 0, blob, {NULL, 0}, {NULL, 0}}, "rkey_len is 0"},
    };
    /* the reference layout, then each rule broken in it */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const kvt_proto_xfer_hello_ans_t *h = &bad[i].h;
        kvt_wire_t ref = {.n = 0};
        kvt_wire_put(&ref, h->incarnation, 8);
        kvt_wire_put(&ref, h->slot_bytes, 4);
        kvt_wire_put(&ref, h->nslots, 4);
        kvt_wire_put(&ref, h->base, 8);
        kvt_wire_put(&ref, h->addr_len, 4);
        kvt_wire_raw(&ref, blob, h->addr_len <= 3 ? h->addr_len : 3);
        kvt_wire_put(&ref, h->rkey_len, 4);
        kvt_wire_raw(&ref, blob, h->rkey_len);
        kvt_wire_str(&ref, "", 0);
        kvt_wire_str(&ref, "", 0);
        refused(d_hello_ans, ref.b, ref.n, MAXN, KVT_ERR_INVAL, "xfer_hello answer", bad[i].part);
        enc_refused(kvt_proto_xfer_hello_ans_encode(&w, 1, h), KVT_ERR_INVAL, &w);
    }
    kvt_proto_xfer_hello_ans_t nul = good;
    nul.rkey = NULL;
    enc_refused(kvt_proto_xfer_hello_ans_encode(&w, 1, &nul), KVT_ERR_INVAL, &w);
    /* host and unix_path: strs (a NUL byte, over 255 bytes, cut) */
    static char big[KVT_PROTO_MAX_STR + 1];
    memset(big, 'a', sizeof(big));
    nul = good;
    nul.unix_path = (kvt_proto_str_t){"/a\0b", 4};
    enc_refused(kvt_proto_xfer_hello_ans_encode(&w, 1, &nul), KVT_ERR_INVAL, &w);
    nul = good;
    nul.host = (kvt_proto_str_t){big, sizeof(big)};
    enc_refused(kvt_proto_xfer_hello_ans_encode(&w, 1, &nul), KVT_ERR_INVAL, &w);
    for (int which = 0; which < 2; which++) {
        kvt_wire_t ref = {.n = 0};
        kvt_wire_put(&ref, 7, 8);
        kvt_wire_put(&ref, 4096, 4);
        kvt_wire_put(&ref, 10, 4);
        kvt_wire_put(&ref, 0, 8);
        kvt_wire_put(&ref, 3, 4);
        kvt_wire_raw(&ref, blob, 3);
        kvt_wire_put(&ref, 3, 4);
        kvt_wire_raw(&ref, blob, 3);
        if (which == 0) {
            kvt_wire_str(&ref, "a\0c", 3);
            kvt_wire_str(&ref, "", 0);
            refused(d_hello_ans, ref.b, ref.n, MAXN, KVT_ERR_INVAL, "xfer_hello answer", "host");
        } else {
            kvt_wire_str(&ref, "b", 1);
            kvt_wire_put(&ref, 9, 2); /* unix_path says 9 bytes, has 2 */
            kvt_wire_raw(&ref, (const uint8_t *)"/s", 2);
            refused(d_hello_ans, ref.b, ref.n, MAXN, KVT_ERR_INVAL, "xfer_hello answer",
                    "unix_path");
        }
    }
    /* the last slot may end at 2^64 exactly */
    good.base = UINT64_MAX - 40960 + 1;
    assert_int_equal(kvt_proto_xfer_hello_ans_encode(&w, 1, &good), KVT_OK);
    kvt_proto_wr_cleanup(&w);
}

/* A body: @head bytes, then u32 @n, then @items bytes of zeros. */
static void counted(kvt_wire_t *o, const kvt_wire_t *head, uint32_t n, size_t items)
{
    *o = *head;
    kvt_wire_put(o, n, 4);
    for (size_t i = 0; i < items; i++)
        kvt_wire_put(o, 0, 1);
}

static void test_counts(void **state)
{
    (void)state;
    /* A count over KVT_PROTO_XFER_MAX_KEYS is too big whatever the caller takes, and before the
     * body is known to hold it; 0 is invalid. */
    kvt_wire_t head = {.n = 0}, b;
    kvt_wire_put(&head, 5, 8); /* incarnation */
    kvt_wire_put(&head, 0, 8); /* lease */
    put_str(&head, cstr("m")); /* model */
    put_str(&head, cstr(""));  /* lora */
    kvt_wire_put(&head, 0, 4); /* lease_ms */
    counted(&b, &head, KVT_PROTO_XFER_MAX_KEYS + 1, 0);
    refused(d_pin_req, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "xfer_pin", "n is 65537");
    refused(d_reserve_req, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "xfer_reserve", "n is 65537");
    counted(&b, &head, UINT32_MAX, 8);
    refused(d_pin_req, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "xfer_pin", NULL);
    counted(&b, &head, 0, 0);
    refused(d_pin_req, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_pin", "n is 0");
    counted(&b, &head, 2, 8); /* 2 keys, one there */
    refused(d_pin_req, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_pin", "body ends inside the keys");

    kvt_wire_t lease = {.n = 0};
    kvt_wire_put(&lease, 9, 8);
    counted(&b, &lease, KVT_PROTO_XFER_MAX_KEYS + 1, 16);
    refused(d_pin_ans, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "xfer_pin answer", NULL);
    refused(d_reserve_ans, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "xfer_reserve answer", NULL);
    counted(&b, &lease, 0, 0);
    refused(d_pin_ans, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_pin answer", "n is 0");
    kvt_wire_t commit = lease;
    kvt_wire_put(&commit, 3, 8);
    counted(&b, &commit, KVT_PROTO_XFER_MAX_KEYS + 1, 17);
    refused(d_commit_req, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "xfer_commit", NULL);
    kvt_wire_t none = {.n = 0};
    counted(&b, &none, KVT_PROTO_XFER_MAX_KEYS + 1, 1);
    refused(d_commit_ans, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "xfer_commit answer", NULL);

    kvt_wire_t treq = {.n = 0};
    put_str(&treq, cstr("h:1"));
    put_str(&treq, cstr("m"));
    put_str(&treq, cstr(""));
    kvt_wire_put(&treq, 0, 4);
    kvt_wire_put(&treq, 0, 4);
    counted(&b, &treq, KVT_PROTO_XFER_MAX_KEYS + 1, 0);
    refused(d_transfer_req, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "transfer", NULL);

    /* a TRANSFER answer's lists: each within the cap, together within the limit */
    kvt_wire_t ans = {.n = 0};
    kvt_wire_put(&ans, 1, 8);
    kvt_wire_put(&ans, 2, 8);
    b = ans;
    kvt_wire_put(&b, 0, 4);
    kvt_wire_put(&b, 0, 4);
    kvt_wire_put(&b, 0, 4);
    refused(d_transfer_ans, b.b, b.n, MAXN, KVT_ERR_INVAL, "transfer answer", "no key");
    b = ans;
    kvt_wire_put(&b, KVT_PROTO_XFER_MAX_KEYS + 1, 4);
    refused(d_transfer_ans, b.b, b.n, UINT32_MAX, KVT_ERR_TOO_BIG, "transfer answer", NULL);

    /* the encoders: n 0, NULL arrays, and over the limit */
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    static uint64_t keys[KVT_PROTO_XFER_MAX_KEYS + 1];
    static uint32_t lens[KVT_PROTO_XFER_MAX_KEYS + 1];
    for (size_t i = 0; i <= KVT_PROTO_XFER_MAX_KEYS; i++)
        lens[i] = 1;
    kvt_proto_xfer_keys_t k = {5, 0, cstr("m"), cstr(""), 0, KVT_PROTO_XFER_MAX_KEYS + 1};
    enc_refused(kvt_proto_xfer_pin_req_encode(&w, 1, &k, keys), KVT_ERR_TOO_BIG, &w);
    enc_refused(kvt_proto_xfer_reserve_req_encode(&w, 1, &k, keys, lens), KVT_ERR_TOO_BIG, &w);
    k.n = KVT_PROTO_XFER_MAX_KEYS; /* the most is fine */
    assert_int_equal(kvt_proto_xfer_reserve_req_encode(&w, 1, &k, keys, lens), KVT_OK);
    kvt_proto_wr_reset(&w);
    k.n = 0;
    enc_refused(kvt_proto_xfer_pin_req_encode(&w, 1, &k, keys), KVT_ERR_INVAL, &w);
    k.n = 1;
    enc_refused(kvt_proto_xfer_pin_req_encode(&w, 1, &k, NULL), KVT_ERR_INVAL, &w);
    enc_refused(kvt_proto_xfer_reserve_req_encode(&w, 1, &k, keys, NULL), KVT_ERR_INVAL, &w);
    kvt_proto_transfer_ans_t a = {.ntransferred = KVT_PROTO_XFER_MAX_KEYS,
                                  .transferred = keys,
                                  .nmissing = 1,
                                  .missing = keys};
    enc_refused(kvt_proto_transfer_ans_encode(&w, 1, &a), KVT_ERR_TOO_BIG, &w);
    a = (kvt_proto_transfer_ans_t){0};
    enc_refused(kvt_proto_transfer_ans_encode(&w, 1, &a), KVT_ERR_INVAL, &w);
    a.nmissing = 1;
    enc_refused(kvt_proto_transfer_ans_encode(&w, 1, &a), KVT_ERR_INVAL, &w);
    enc_refused(kvt_proto_xfer_commit_ans_encode(&w, 1, NULL, 1), KVT_ERR_INVAL, &w);
    const uint8_t two = 2;
    enc_refused(kvt_proto_xfer_commit_ans_encode(&w, 1, &two, 1), KVT_ERR_INVAL, &w);
    kvt_proto_wr_cleanup(&w);
}

static void test_request_rules(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    const uint64_t key = 42;
    const uint32_t len0 = 0;

    /* XFER_PIN / XFER_RESERVE heads */
    struct {
        uint64_t inc;
        const char *model;
        uint32_t lease_ms;
        const char *part;
    } heads[] = {{0, "m", 0, "incarnation is 0"},
                 {5, "", 0, "model is empty"},
                 {5, "m", KVT_PROTO_XFER_MAX_LEASE_MS + 1, "lease_ms is 600001, over 600000"}};
    for (size_t i = 0; i < 3; i++) {
        kvt_wire_t b = {.n = 0};
        kvt_wire_put(&b, heads[i].inc, 8);
        kvt_wire_put(&b, 0, 8);
        put_str(&b, cstr(heads[i].model));
        put_str(&b, cstr(""));
        kvt_wire_put(&b, heads[i].lease_ms, 4);
        kvt_wire_put(&b, 1, 4);
        kvt_wire_put(&b, key, 8);
        refused(d_pin_req, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_pin", heads[i].part);
        kvt_wire_put(&b, 1, 4);
        refused(d_reserve_req, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_reserve", heads[i].part);
        kvt_proto_xfer_keys_t k = {heads[i].inc,      0, cstr(heads[i].model), cstr(""),
                                   heads[i].lease_ms, 1};
        enc_refused(kvt_proto_xfer_pin_req_encode(&w, 1, &k, &key), KVT_ERR_INVAL, &w);
    }
    kvt_wire_t b = {.n = 0};
    kvt_wire_put(&b, 5, 8);
    kvt_wire_put(&b, 0, 8);
    put_str(&b, cstr("m"));
    put_str(&b, cstr(""));
    kvt_wire_put(&b, 0, 4);
    kvt_wire_put(&b, 1, 4);
    kvt_wire_put(&b, key, 8);
    kvt_wire_put(&b, 0, 4);
    refused(d_reserve_req, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_reserve", "lens[0] is 0");
    kvt_proto_xfer_keys_t k = {5, 0, cstr("m"), cstr(""), 0, 1};
    enc_refused(kvt_proto_xfer_reserve_req_encode(&w, 1, &k, &key, &len0), KVT_ERR_INVAL, &w);

    /* XFER_RENEW / XFER_RELEASE */
    struct {
        uint8_t op;
        uint64_t inc, lease;
        uint32_t ms;
        const char *what, *part;
    } leases[] = {
        {KVT_PROTO_OP_XFER_RENEW, 0, 1, 0, "xfer_renew", "incarnation is 0"},
        {KVT_PROTO_OP_XFER_RENEW, 1, 0, 0, "xfer_renew", "lease is 0"},
        {KVT_PROTO_OP_XFER_RENEW, 1, 1, KVT_PROTO_XFER_MAX_LEASE_MS + 1, "xfer_renew", "lease_ms"},
        {KVT_PROTO_OP_XFER_RELEASE, 1, 0, 0, "xfer_release", "lease is 0"},
    };
    for (size_t i = 0; i < 4; i++) {
        bool renew = leases[i].op == KVT_PROTO_OP_XFER_RENEW;
        b.n = 0;
        kvt_wire_put(&b, leases[i].inc, 8);
        kvt_wire_put(&b, leases[i].lease, 8);
        if (renew)
            kvt_wire_put(&b, leases[i].ms, 4);
        refused(renew ? d_renew : d_release, b.b, b.n, MAXN, KVT_ERR_INVAL, leases[i].what,
                leases[i].part);
        kvt_proto_xfer_lease_t l = {leases[i].inc, leases[i].lease, leases[i].ms};
        enc_refused(kvt_proto_xfer_lease_req_encode(&w, leases[i].op, 1, &l), KVT_ERR_INVAL, &w);
    }
    kvt_proto_xfer_lease_t l = {1, 1, 5};
    enc_refused(kvt_proto_xfer_lease_req_encode(&w, KVT_PROTO_OP_XFER_RELEASE, 1, &l),
                KVT_ERR_INVAL, &w); /* a release has no lease_ms */
    enc_refused(kvt_proto_xfer_lease_req_encode(&w, KVT_PROTO_OP_PIN, 1, &l), KVT_ERR_INVAL, &w);
    char err[128] = "";
    assert_int_equal(
        kvt_proto_xfer_lease_req_decode(KVT_PROTO_OP_PIN, b.b, 16, &l, err, sizeof(err)),
        KVT_ERR_INVAL);
    assert_non_null(strstr(err, "no lease body"));

    /* XFER_COMMIT: ok must be 0 or 1; incarnation and lease not 0 */
    b.n = 0;
    kvt_wire_put(&b, 1, 8);
    kvt_wire_put(&b, 2, 8);
    kvt_wire_put(&b, 1, 4);
    kvt_wire_put(&b, key, 8);
    kvt_wire_put(&b, 9, 8);
    kvt_wire_put(&b, 2, 1);
    refused(d_commit_req, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_commit",
            "ok of key 0 must be 0 or 1, not 2");
    kvt_proto_xfer_commit_t c = {1, 0, 1};
    kvt_proto_xfer_landed_t landed = {key, 9, true};
    enc_refused(kvt_proto_xfer_commit_req_encode(&w, 1, &c, &landed), KVT_ERR_INVAL, &w);
    b.n = 0;
    kvt_wire_put(&b, 1, 4);
    kvt_wire_put(&b, 2, 1);
    refused(d_commit_ans, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_commit answer",
            "visible[0] must be 0 or 1, not 2");

    /* TRANSFER: the peer, direction, flags, pad, timeout */
    struct {
        const char *peer;
        uint8_t dir, flags;
        uint16_t pad;
        uint32_t timeout;
        const char *part;
    } tr[] = {
        {"", 0, 0, 0, 0, "peer is empty"},
        {"nohost", 0, 0, 0, 0, "peer: "},
        {"h:0", 0, 0, 0, 0, "peer: "},
        {"h:65536", 0, 0, 0, 0, "peer: "},
        {"::1:80", 0, 0, 0, 0, "peer: "},
        {":80", 0, 0, 0, 0, "peer: "},
        {"h:1", 2, 0, 0, 0, "direction must be 0 or 1, not 2"},
        {"h:1", 1, 2, 0, 0, "flags 0x02 has unknown bits"},
        {"h:1", 0, KVT_PROTO_XFER_STREAM, 0, 0, "stream is for a push"},
        {"h:1", 1, 1, 1, 0, "pad is 1, not 0"},
        {"h:1", 0, 0, 0, KVT_PROTO_XFER_MAX_TIMEOUT_MS + 1, "timeout_ms is 600001"},
    };
    for (size_t i = 0; i < sizeof(tr) / sizeof(tr[0]); i++) {
        b.n = 0;
        put_str(&b, cstr(tr[i].peer));
        put_str(&b, cstr("m"));
        put_str(&b, cstr(""));
        kvt_wire_put(&b, tr[i].dir, 1);
        kvt_wire_put(&b, tr[i].flags, 1);
        kvt_wire_put(&b, tr[i].pad, 2);
        kvt_wire_put(&b, tr[i].timeout, 4);
        kvt_wire_put(&b, 1, 4);
        kvt_wire_put(&b, key, 8);
        refused(d_transfer_req, b.b, b.n, MAXN, KVT_ERR_INVAL, "transfer", tr[i].part);
        if (tr[i].pad != 0)
            continue;
        kvt_proto_transfer_req_t t = {cstr(tr[i].peer), cstr("m"),     cstr(""), tr[i].dir,
                                      tr[i].flags,      tr[i].timeout, 1};
        enc_refused(kvt_proto_transfer_req_encode(&w, 1, &t, &key), KVT_ERR_INVAL, &w);
    }
    kvt_proto_transfer_req_t t = {{"h:1\0", 4}, cstr("m"), cstr(""), 0, 0, 0, 1};
    enc_refused(kvt_proto_transfer_req_encode(&w, 1, &t, &key), KVT_ERR_TOO_BIG, &w);
    t.peer = cstr("h:1");
    t.model = cstr("");
    enc_refused(kvt_proto_transfer_req_encode(&w, 1, &t, &key), KVT_ERR_INVAL, &w);
    kvt_proto_wr_cleanup(&w);
}

static void test_answer_rules(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    /* XFER_PIN answer entries */
    struct {
        uint64_t lease;
        uint32_t slot, len;
        uint64_t sum;
        const char *part;
    } pins[] = {
        {1, KVT_PROTO_SLOT_NONE, 5, 0, "missing key 0 has a len or sum"},
        {1, KVT_PROTO_SLOT_NONE, 0, 5, "missing key 0 has a len or sum"},
        {1, 3, 0, 5, "len of key 0 is 0"},
        {0, 3, 5, 5, "lease is 0 but slots are held"},
    };
    for (size_t i = 0; i < 4; i++) {
        kvt_wire_t b = {.n = 0};
        kvt_wire_put(&b, pins[i].lease, 8);
        kvt_wire_put(&b, 1, 4);
        kvt_wire_put(&b, pins[i].slot, 4);
        kvt_wire_put(&b, pins[i].len, 4);
        kvt_wire_put(&b, pins[i].sum, 8);
        refused(d_pin_ans, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_pin answer", pins[i].part);
        kvt_proto_xfer_slots_ans_t a = {pins[i].lease, 1};
        kvt_proto_xfer_pinned_t p = {pins[i].slot, pins[i].len, pins[i].sum};
        enc_refused(kvt_proto_xfer_pin_ans_encode(&w, 1, &a, &p), KVT_ERR_INVAL, &w);
    }
    /* nothing held: lease 0 is fine; a slot held: it is not */
    kvt_proto_xfer_slots_ans_t a = {0, 2};
    const uint32_t none[2] = {KVT_PROTO_SLOT_NONE, KVT_PROTO_XFER_SLOT_HELD};
    const uint32_t one[2] = {KVT_PROTO_SLOT_NONE, 7};
    assert_int_equal(kvt_proto_xfer_reserve_ans_encode(&w, 1, &a, none), KVT_OK);
    kvt_proto_wr_reset(&w);
    enc_refused(kvt_proto_xfer_reserve_ans_encode(&w, 1, &a, one), KVT_ERR_INVAL, &w);
    kvt_wire_t b = {.n = 0};
    kvt_wire_put(&b, 0, 8);
    kvt_wire_put(&b, 2, 4);
    kvt_wire_put(&b, one[0], 4);
    kvt_wire_put(&b, one[1], 4);
    refused(d_reserve_ans, b.b, b.n, MAXN, KVT_ERR_INVAL, "xfer_reserve answer",
            "lease is 0 but slots are held");

    /* TRANSFER answer reasons */
    for (unsigned reason = 0; reason < 256; reason += reason < 10 ? 1 : 49) {
        if (reason >= 1 && reason <= KVT_PROTO_XFER_FAIL_MAX)
            continue;
        b.n = 0;
        kvt_wire_put(&b, 0, 8); /* bytes */
        kvt_wire_put(&b, 0, 8); /* ns */
        kvt_wire_put(&b, 0, 4);
        kvt_wire_put(&b, 0, 4);
        kvt_wire_put(&b, 1, 4);
        kvt_wire_put(&b, 77, 8);
        kvt_wire_put(&b, reason, 1);
        char part[64];
        snprintf(part, sizeof(part), "reason of failed[0] is %u", reason);
        refused(d_transfer_ans, b.b, b.n, MAXN, KVT_ERR_INVAL, "transfer answer", part);
        kvt_proto_xfer_failed_t f = {77, (uint8_t)reason};
        kvt_proto_transfer_ans_t t = {.nfailed = 1, .failed = &f};
        enc_refused(kvt_proto_transfer_ans_encode(&w, 1, &t), KVT_ERR_INVAL, &w);
    }
    kvt_proto_wr_cleanup(&w);
}

/* ---- the docs' example ---------------------------------------------------------------------- */

/* The bytes of a hex dump as docs/protocol.md writes them ("0000  4b 56 ...  comment"). */
static size_t parse_dump(const char *text, uint8_t *out, size_t cap)
{
    size_t n = 0;
    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        assert_non_null(end);
        unsigned off = 0;
        assert_int_equal(sscanf(line, "%4x", &off), 1);
        assert_int_equal(off, n); /* each line starts at its offset */
        const char *p = line + 6; /* after the offset and two spaces */
        while (p + 2 <= end && isxdigit((unsigned char)p[0]) && isxdigit((unsigned char)p[1]) &&
               (p + 2 == end || p[2] == ' ')) {
            unsigned v;
            assert_int_equal(sscanf(p, "%2x", &v), 1);
            assert_true(n < cap);
            out[n++] = (uint8_t)v;
            p += 2;
            if (p == end || p[1] == ' ') /* the line's comment follows two spaces */
                break;
            p++;
        }
        line = end + 1;
    }
    return n;
}

static void test_doc_example(void **state)
{
    (void)state;
    /* doc-test: protocol-xfer-pin, in docs/protocol.md ("Transfer") */
    char *text = kvt_doc_block("docs/protocol.md", "protocol-xfer-pin");
    if (text == NULL)
        fail_msg("docs/protocol.md has no block marked protocol-xfer-pin (set KVT_SOURCE_DIR)");
    uint8_t doc[256];
    size_t n = parse_dump(text, doc, sizeof(doc));
    free(text);
    const uint64_t keys[2] = {42, 43};
    kvt_proto_xfer_keys_t k = {0x1122334455667788ull, 0, cstr("llama"), cstr(""), 30000, 2};
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    assert_int_equal(kvt_proto_xfer_pin_req_encode(&w, 3, &k, keys), KVT_OK);
    assert_int_equal(w.len, n);
    assert_memory_equal(w.buf, doc, n);
    kvt_proto_wr_cleanup(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_hello_roundtrip),
        cmocka_unit_test(test_pin_reserve_requests_roundtrip),
        cmocka_unit_test(test_pin_reserve_answers_roundtrip),
        cmocka_unit_test(test_lease_commit_roundtrip),
        cmocka_unit_test(test_transfer_roundtrip),
        cmocka_unit_test(test_hello_rules),
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_request_rules),
        cmocka_unit_test(test_answer_rules),
        cmocka_unit_test(test_doc_example),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
