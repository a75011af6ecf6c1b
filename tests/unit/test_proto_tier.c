/*
 * proto/proto_tier.c: the tier data plane's frames. Every request and answer
 * is encoded from random contents and compared byte for byte with a naive
 * encoding written here from docs/protocol.md, then decoded back; every
 * refusal (each truncation, a trailing byte, counts of 0 or over the
 * caller's capacity, bad flags and pad bytes, bad strings, lengths that do
 * not match the body) gets its status and a message naming the field, and
 * leaves every output as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/support/rng.h"

#define MAXN 600u /* the most items a random message carries */

/* ---- randomness ----------------------------------------------------------------------------- */

static kvt_rng_t g_rng; /* started by each randomized test on its own stream */

static uint64_t rnd(void)
{
    return kvt_rng_next(&g_rng);
}

static uint32_t below(uint32_t n)
{
    return (uint32_t)kvt_rng_below(&g_rng, n);
}

/* A random count in [lo, MAXN]: small ones often, since edges live there. */
static uint32_t rand_count(uint32_t lo)
{
    uint32_t hi = below(4) == 0 ? lo + 3 : MAXN;
    return lo + below(hi - lo + 1);
}

typedef struct name {
    char b[KVT_PROTO_MAX_STR];
    kvt_proto_str_t s;
} name_t;

/* A str of @min..255 bytes, each 1..255 (short ones more often). */
static void rand_name(name_t *nm, uint32_t min)
{
    uint32_t max = below(2) == 0 ? 16 : KVT_PROTO_MAX_STR;
    uint32_t len = min + below(max - min + 1);
    for (uint32_t i = 0; i < len; i++)
        nm->b[i] = (char)(1 + below(255));
    nm->s.p = nm->b;
    nm->s.len = (uint16_t)len;
}

/* A model name (1..255 bytes) and a LoRA name (0..255). */
static void rand_names(name_t *model, name_t *lora)
{
    rand_name(model, 1);
    rand_name(lora, 0);
}

/* ---- the reference encoding ----------------------------------------------------------------- */

typedef struct bytes {
    uint8_t b[16384];
    size_t n;
} bytes_t;

/* @width little-endian bytes of @v. */
static void put(bytes_t *o, uint64_t v, unsigned width)
{
    assert_true(o->n + width <= sizeof(o->b));
    for (unsigned i = 0; i < width; i++)
        o->b[o->n++] = (uint8_t)(v >> (8 * i));
}

static void put_raw(bytes_t *o, const void *p, size_t len)
{
    assert_true(o->n + len <= sizeof(o->b));
    if (len > 0)
        memcpy(o->b + o->n, p, len);
    o->n += len;
}

/* A str: u16 length, then the bytes. */
static void put_s(bytes_t *o, const void *p, size_t len)
{
    put(o, len, 2);
    put_raw(o, p, len);
}

static void put_name(bytes_t *o, kvt_proto_str_t s)
{
    put_s(o, s.p, s.len);
}

/* model, then lora: the head of every tier request */
static void put_names(bytes_t *o, const name_t *model, const name_t *lora)
{
    put_name(o, model->s);
    put_name(o, lora->s);
}

/* ---- helpers -------------------------------------------------------------------------------- */

/* assert_memory_equal(), which compares byte by byte (slow), only to report a difference. */
#define SAME(a, b, n)                                                                              \
    do {                                                                                           \
        if (memcmp((a), (b), (n)) != 0)                                                            \
            assert_memory_equal((a), (b), (n));                                                    \
    } while (0)

static uint8_t *dup_exact(const uint8_t *p, size_t len)
{
    uint8_t *d = malloc(len > 0 ? len : 1);
    assert_non_null(d);
    if (len > 0)
        memcpy(d, p, len);
    return d;
}

static int str_is(kvt_proto_str_t s, kvt_proto_str_t want, const uint8_t *body, size_t len)
{
    if (s.len != want.len || (s.len > 0 && memcmp(s.p, want.p, s.len) != 0))
        return 0;
    return s.len == 0 ||
           ((const uint8_t *)s.p >= body && (const uint8_t *)s.p + s.len <= body + len);
}

/* Decoded names equal @model and @lora and point into the decoded @body. */
static void names_are(kvt_proto_str_t m, kvt_proto_str_t l, const name_t *model, const name_t *lora,
                      const uint8_t *body, size_t len)
{
    assert_true(str_is(m, model->s, body, len));
    assert_true(str_is(l, lora->s, body, len));
}

/* A writer holding one PING frame: every frame under test is appended after another. */
static size_t wr_start(kvt_proto_wr_t *w)
{
    kvt_proto_wr_reset(w);
    assert_int_equal(kvt_proto_raw_encode(w, KVT_PROTO_OP_PING, 0, 1, NULL, 0), KVT_OK);
    return w->len;
}

/* The frame appended after @off, the last in @w, has header @op/@flags/@req_id and body @want;
 * returns the body. */
static const uint8_t *frame_is(const kvt_proto_wr_t *w, size_t off, uint8_t op, uint16_t flags,
                               uint64_t req_id, const bytes_t *want)
{
    kvt_proto_hdr_t h;
    assert_int_equal(w->len, off + KVT_PROTO_HDR_SIZE + want->n);
    assert_int_equal(kvt_proto_hdr_decode(w->buf + off, KVT_PROTO_MAX_BODY_LIMIT, &h), KVT_OK);
    assert_true(h.op == op && h.flags == flags && h.req_id == req_id && h.body_len == want->n);
    const uint8_t *body = w->buf + off + KVT_PROTO_HDR_SIZE;
    SAME(body, want->b, want->n);
    return body;
}

/* ---- every decoder behind one signature, for the generic refusal checks --------------------- */

/* Every output a decoder may write; filled with a pattern before each call. */
typedef struct out {
    kvt_proto_keys_t keys;
    kvt_proto_commit_t commit;
    kvt_proto_block_key_t bkey;
    kvt_proto_block_put_t put;
    kvt_proto_attach_ans_t attach;
    kvt_proto_reserve_ans_t reserve;
    uint32_t count; /* hit, pins, count */
    uint64_t k[MAXN + 1];
    uint32_t u[MAXN + 1];
    uint8_t loc[MAXN + 1];
    kvt_proto_pinned_t pins[MAXN + 1];
    uint64_t ev[MAXN + 1];
} out_t;

static out_t g_out, g_fill;

static void out_reset(void)
{
    memset(&g_out, 0xA5, sizeof(g_out));
    if (g_fill.count != 0xA5A5A5A5u)
        memset(&g_fill, 0xA5, sizeof(g_fill));
}

/* @cap: the capacity the caller gives (<= MAXN). */
typedef kvt_status_t (*dec_fn)(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                               size_t errlen);

static kvt_status_t d_keys(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                           size_t errlen)
{
    return kvt_proto_keys_req_decode(b, len, o->k, cap, &o->keys, err, errlen);
}

static kvt_status_t d_commit(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                             size_t errlen)
{
    return kvt_proto_commit_req_decode(b, len, o->k, o->u, cap, &o->commit, err, errlen);
}

static kvt_status_t d_bkey(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                           size_t errlen)
{
    (void)cap;
    return kvt_proto_block_key_req_decode(b, len, &o->bkey, err, errlen);
}

static kvt_status_t d_put(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                          size_t errlen)
{
    (void)cap;
    return kvt_proto_block_put_req_decode(b, len, &o->put, err, errlen);
}

static kvt_status_t d_attach(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                             size_t errlen)
{
    (void)cap;
    return kvt_proto_attach_ans_decode(b, len, &o->attach, err, errlen);
}

static kvt_status_t d_lookup(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                             size_t errlen)
{
    return kvt_proto_lookup_ans_decode(b, len, o->loc, cap, &o->count, err, errlen);
}

static kvt_status_t d_reserve(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                              size_t errlen)
{
    return kvt_proto_reserve_ans_decode(b, len, o->u, cap, o->ev, cap, &o->reserve, err, errlen);
}

static kvt_status_t d_pin(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                          size_t errlen)
{
    return kvt_proto_pin_ans_decode(b, len, o->pins, cap, &o->count, err, errlen);
}

static kvt_status_t d_count(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                            size_t errlen)
{
    (void)cap;
    return kvt_proto_count_ans_decode(b, len, &o->count, err, errlen);
}

static kvt_status_t d_get(const uint8_t *b, size_t len, uint32_t cap, out_t *o, char *err,
                          size_t errlen)
{
    (void)cap;
    (void)o;
    return kvt_proto_block_get_ans_decode(b, len, err, errlen);
}

/* One line for people: "@what: ...", lowercase first, no newline, no trailing period. */
static void check_msg(const char *err, const char *what, const char *part)
{
    size_t wl = strlen(what), el = strlen(err);
    if (strncmp(err, what, wl) != 0 || err[wl] != ':' || err[wl + 1] != ' ' || el < wl + 3)
        fail_msg("message \"%s\" does not start with \"%s: \"", err, what);
    if (!(err[0] >= 'a' && err[0] <= 'z') || strchr(err, '\n') != NULL || err[el - 1] == '.')
        fail_msg("message \"%s\" is not one lowercase line without a trailing period", err);
    if (part != NULL && strstr(err, part) == NULL)
        fail_msg("message \"%s\" does not mention \"%s\"", err, part);
}

/*
 * @dec refuses an exact-size copy of @body with @want and a message of @what
 * mentioning @part (when not NULL), and writes no output; the same without
 * room for a message.
 */
static void refused(dec_fn dec, const uint8_t *body, size_t len, uint32_t cap, kvt_status_t want,
                    const char *what, const char *part)
{
    char err[256] = "unset";
    out_reset();
    uint8_t *copy = dup_exact(body, len);
    kvt_status_t st = dec(copy, len, cap, &g_out, err, sizeof(err));
    if (st != want)
        fail_msg("%s (len %zu, cap %u): status %d, want %d (\"%s\")", what, len, cap, st, want,
                 err);
    check_msg(err, what, part);
    SAME(&g_out, &g_fill, sizeof(g_out));
    assert_int_equal(dec(copy, len, cap, &g_out, NULL, 0), want);
    SAME(&g_out, &g_fill, sizeof(g_out));
    free(copy);
}

/* Every proper prefix of a valid @body is refused (KVT_ERR_INVAL). */
static void refused_truncated(dec_fn dec, const uint8_t *body, size_t len, uint32_t cap,
                              const char *what)
{
    for (size_t i = 0; i < len; i++)
        refused(dec, body, i, cap, KVT_ERR_INVAL, what, NULL);
}

/* A valid @body with one byte, or eight, appended is refused. */
static void refused_trailing(dec_fn dec, const uint8_t *body, size_t len, uint32_t cap,
                             const char *what)
{
    uint8_t *more = malloc(len + 8);
    assert_non_null(more);
    memcpy(more, body, len);
    memset(more + len, (int)below(256), 8);
    refused(dec, more, len + 1, cap, KVT_ERR_INVAL, what, "1 byte after");
    refused(dec, more, len + 8, cap, KVT_ERR_INVAL, what, "8 bytes after");
    free(more);
}

/*
 * What every valid @body holding @n counted items shows when broken: one item over the capacity
 * (@count names the count; NULL: a body without one), one or eight trailing bytes, and each
 * truncation (of the shorter bodies, and of the long ones every 8th @round).
 */
static void refused_faults(dec_fn dec, const uint8_t *body, size_t len, uint32_t n,
                           const char *count, const char *what, int round)
{
    if (count != NULL && n > 0) {
        char part[32];
        snprintf(part, sizeof(part), "%s is %u", count, n);
        refused(dec, body, len, n - 1, KVT_ERR_TOO_BIG, what, part);
    }
    refused_trailing(dec, body, len, MAXN, what);
    if (len <= 1024 || round % 8 == 0)
        refused_truncated(dec, body, len, MAXN, what);
}

/* The part of @arr past its first @n of @size bytes each still holds the pattern. */
static void rest_untouched(const void *arr, const void *fill, size_t n, size_t size)
{
    size_t total = (MAXN + 1) * size;
    SAME((const uint8_t *)arr + n * size, (const uint8_t *)fill + n * size, total - n * size);
}

/* ---- opcodes -------------------------------------------------------------------------------- */

static const uint8_t tier_ops[] = {
    KVT_PROTO_OP_ATTACH,    KVT_PROTO_OP_LOOKUP,      KVT_PROTO_OP_RESERVE,  KVT_PROTO_OP_COMMIT,
    KVT_PROTO_OP_PIN,       KVT_PROTO_OP_UNPIN,       KVT_PROTO_OP_PREFETCH, KVT_PROTO_OP_BLOCK_PUT,
    KVT_PROTO_OP_BLOCK_GET, KVT_PROTO_OP_BLOCK_DELETE};

static void test_ops(void **state)
{
    (void)state;
    static const char *names[] = {"ATTACH", "LOOKUP",   "RESERVE",   "COMMIT",    "PIN",
                                  "UNPIN",  "PREFETCH", "BLOCK_PUT", "BLOCK_GET", "BLOCK_DELETE"};
    static const bool mutating[] = {true,  false, true, true,  false,
                                    false, false, true, false, true};
    static const bool keys[] = {false, true, true, false, true, true, true, false, false, false};
    for (size_t i = 0; i < sizeof(tier_ops); i++) {
        assert_int_equal(tier_ops[i], 0x40 + i);
        assert_true(kvt_proto_op_known(tier_ops[i]));
        assert_string_equal(kvt_proto_op_name(tier_ops[i]), names[i]);
        assert_int_equal(kvt_proto_op_mutating(tier_ops[i]), mutating[i]);
        assert_int_equal(kvt_proto_op_keys(tier_ops[i]), keys[i]);
        /* a header with the opcode decodes, both ways */
        uint8_t hdr[KVT_PROTO_HDR_SIZE];
        kvt_proto_hdr_t h = {KVT_PROTO_VERSION, tier_ops[i], KVT_PROTO_F_RESPONSE, 9, 4}, back;
        kvt_proto_hdr_encode(&h, hdr);
        assert_int_equal(kvt_proto_hdr_decode(hdr, 100, &back), KVT_OK);
        assert_int_equal(back.op, tier_ops[i]);
    }
    /* the older opcodes keep their meaning; the rest of 0x40..0x4F is unknown */
    assert_true(kvt_proto_op_mutating(KVT_PROTO_OP_EVENTS));
    assert_false(kvt_proto_op_mutating(KVT_PROTO_OP_QUERY));
    assert_false(kvt_proto_op_keys(KVT_PROTO_OP_QUERY));
    for (int op = 0x4A; op <= 0x4F; op++) {
        assert_false(kvt_proto_op_known((uint8_t)op));
        assert_false(kvt_proto_op_keys((uint8_t)op));
        assert_false(kvt_proto_op_mutating((uint8_t)op));
    }
    assert_int_equal(KVT_PROTO_LOC_RAM, 1);
    assert_int_equal(KVT_PROTO_LOC_DISK, 2);
    assert_true(KVT_PROTO_SLOT_NONE == UINT32_MAX);
}

/* A LOOKUP request and its answer spelled out byte by byte, as docs/protocol.md lays them out. */
static void test_literal_frames(void **state)
{
    (void)state;
    static const uint8_t req[] = {
        0x4b, 0x56, 0x54, 0x31, 0x01, 0x41, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x19, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* LOOKUP, req_id 5, body
                                                                             25 */
        0x01, 0x00, 0x6d, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,             /* "m", "", n 2 */
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,                   /* key 1 */
        0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80};                  /* key 2^63 + 258 */
    static const uint8_t ans[] = {0x4b, 0x56, 0x54, 0x31, 0x01, 0x41, 0x01, 0x00, 0x05,
                                  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00,
                                  0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  /* RESPONSE, body 6 */
                                  0x02, 0x00, 0x00, 0x00, 0x01, 0x02}; /* hit 2: RAM, DISK */
    const uint64_t keys[2] = {1, 0x8000000000000102ull};
    const uint8_t loc[2] = {KVT_PROTO_LOC_RAM, KVT_PROTO_LOC_DISK};
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_proto_keys_t k = {{"m", 1}, {NULL, 0}, 2};
    assert_int_equal(kvt_proto_keys_req_encode(&w, KVT_PROTO_OP_LOOKUP, 5, &k, keys), KVT_OK);
    assert_int_equal(w.len, sizeof(req));
    assert_memory_equal(w.buf, req, sizeof(req));
    kvt_proto_wr_reset(&w);
    assert_int_equal(kvt_proto_lookup_ans_encode(&w, 5, loc, 2), KVT_OK);
    assert_int_equal(w.len, sizeof(ans));
    assert_memory_equal(w.buf, ans, sizeof(ans));
    kvt_proto_wr_cleanup(&w);

    uint64_t got[2];
    kvt_proto_keys_t dk;
    assert_int_equal(kvt_proto_keys_req_decode(req + KVT_PROTO_HDR_SIZE,
                                               sizeof(req) - KVT_PROTO_HDR_SIZE, got, 2, &dk, NULL,
                                               0),
                     KVT_OK);
    assert_int_equal(dk.n, 2);
    assert_true(got[0] == keys[0] && got[1] == keys[1]);
}

/* ---- requests: round trips ------------------------------------------------------------------ */

static void test_keys_roundtrip(void **state)
{
    (void)state;
    static const uint8_t ops[] = {KVT_PROTO_OP_LOOKUP, KVT_PROTO_OP_RESERVE, KVT_PROTO_OP_PIN,
                                  KVT_PROTO_OP_UNPIN, KVT_PROTO_OP_PREFETCH};
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 1);
    for (int round = 0; round < 300; round++) {
        name_t model, lora;
        rand_names(&model, &lora);
        uint32_t n = rand_count(1);
        uint64_t keys[MAXN];
        for (uint32_t i = 0; i < n; i++)
            keys[i] = rnd();
        uint8_t op = ops[below(5)];
        uint64_t req_id = rnd();

        size_t off = wr_start(&w);
        kvt_proto_keys_t k = {model.s, lora.s, n};
        assert_int_equal(kvt_proto_keys_req_encode(&w, op, req_id, &k, keys), KVT_OK);
        bytes_t ref = {.n = 0};
        put_names(&ref, &model, &lora);
        put(&ref, n, 4);
        for (uint32_t i = 0; i < n; i++)
            put(&ref, keys[i], 8);
        const uint8_t *body = frame_is(&w, off, op, 0, req_id, &ref);

        /* back, with room for exactly n keys */
        uint8_t *copy = dup_exact(body, ref.n);
        char err[64] = "unset";
        out_reset();
        assert_int_equal(
            kvt_proto_keys_req_decode(copy, ref.n, g_out.k, n, &g_out.keys, err, sizeof(err)),
            KVT_OK);
        assert_string_equal(err, "unset");
        names_are(g_out.keys.model, g_out.keys.lora, &model, &lora, copy, ref.n);
        assert_int_equal(g_out.keys.n, n);
        assert_memory_equal(g_out.k, keys, n * sizeof(keys[0]));
        rest_untouched(g_out.k, g_fill.k, n, sizeof(g_out.k[0]));
        free(copy);

        refused_faults(d_keys, body, ref.n, n, "n", "keys", round);
    }
    kvt_proto_wr_cleanup(&w);
}

static void test_commit_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 2);
    for (int round = 0; round < 300; round++) {
        name_t model, lora;
        rand_names(&model, &lora);
        uint32_t n = rand_count(1);
        uint64_t keys[MAXN];
        uint32_t lens[MAXN];
        bool no_lens = below(4) == 0; /* NULL: every block of the block size */
        for (uint32_t i = 0; i < n; i++) {
            keys[i] = rnd();
            lens[i] = no_lens || below(3) == 0 ? 0 : (uint32_t)rnd();
        }
        bool ok = below(2) == 1;
        uint64_t req_id = rnd();

        size_t off = wr_start(&w);
        kvt_proto_commit_t c = {model.s, lora.s, ok, n};
        assert_int_equal(kvt_proto_commit_req_encode(&w, req_id, &c, keys, no_lens ? NULL : lens),
                         KVT_OK);
        bytes_t ref = {.n = 0};
        put_names(&ref, &model, &lora);
        put(&ref, ok ? 1 : 0, 1);
        put(&ref, 0, 3);
        put(&ref, n, 4);
        for (uint32_t i = 0; i < n; i++)
            put(&ref, keys[i], 8);
        for (uint32_t i = 0; i < n; i++)
            put(&ref, lens[i], 4);
        const uint8_t *body = frame_is(&w, off, KVT_PROTO_OP_COMMIT, 0, req_id, &ref);

        uint8_t *copy = dup_exact(body, ref.n);
        out_reset();
        assert_int_equal(
            kvt_proto_commit_req_decode(copy, ref.n, g_out.k, g_out.u, n, &g_out.commit, NULL, 0),
            KVT_OK);
        names_are(g_out.commit.model, g_out.commit.lora, &model, &lora, copy, ref.n);
        assert_int_equal(g_out.commit.ok, ok);
        assert_int_equal(g_out.commit.n, n);
        assert_memory_equal(g_out.k, keys, n * sizeof(keys[0]));
        assert_memory_equal(g_out.u, lens, n * sizeof(lens[0]));
        rest_untouched(g_out.k, g_fill.k, n, sizeof(g_out.k[0]));
        rest_untouched(g_out.u, g_fill.u, n, sizeof(g_out.u[0]));
        free(copy);

        refused_faults(d_commit, body, ref.n, n, "n", "commit", round);
    }
    kvt_proto_wr_cleanup(&w);
}

static void test_block_requests_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 3);
    static uint8_t data[4096];
    for (int round = 0; round < 300; round++) {
        name_t model, lora;
        rand_names(&model, &lora);
        uint64_t key = rnd(), req_id = rnd();

        /* BLOCK_GET / BLOCK_DELETE */
        uint8_t op = below(2) == 0 ? KVT_PROTO_OP_BLOCK_GET : KVT_PROTO_OP_BLOCK_DELETE;
        size_t off = wr_start(&w);
        kvt_proto_block_key_t k = {model.s, lora.s, key};
        assert_int_equal(kvt_proto_block_key_req_encode(&w, op, req_id, &k), KVT_OK);
        bytes_t ref = {.n = 0};
        put_names(&ref, &model, &lora);
        put(&ref, key, 8);
        const uint8_t *body = frame_is(&w, off, op, 0, req_id, &ref);
        uint8_t *copy = dup_exact(body, ref.n);
        out_reset();
        assert_int_equal(kvt_proto_block_key_req_decode(copy, ref.n, &g_out.bkey, NULL, 0), KVT_OK);
        names_are(g_out.bkey.model, g_out.bkey.lora, &model, &lora, copy, ref.n);
        assert_true(g_out.bkey.key == key);
        free(copy);
        refused_faults(d_bkey, body, ref.n, 0, NULL, "block_key", 0);

        /* BLOCK_PUT */
        uint32_t len = below(4) == 0 ? 1 + below(8) : 1 + below(sizeof(data));
        for (uint32_t i = 0; i < len; i++)
            data[i] = (uint8_t)rnd();
        bool durable = below(2) == 1;
        off = wr_start(&w);
        kvt_proto_block_put_t p = {model.s, lora.s, key, durable, len, data};
        assert_int_equal(kvt_proto_block_put_req_encode(&w, req_id, &p), KVT_OK);
        ref.n = 0;
        put_names(&ref, &model, &lora);
        put(&ref, key, 8);
        put(&ref, durable ? 1 : 0, 1);
        put(&ref, 0, 3);
        put(&ref, len, 4);
        put_raw(&ref, data, len);
        body = frame_is(&w, off, KVT_PROTO_OP_BLOCK_PUT, 0, req_id, &ref);
        copy = dup_exact(body, ref.n);
        out_reset();
        assert_int_equal(kvt_proto_block_put_req_decode(copy, ref.n, &g_out.put, NULL, 0), KVT_OK);
        names_are(g_out.put.model, g_out.put.lora, &model, &lora, copy, ref.n);
        assert_true(g_out.put.key == key);
        assert_int_equal(g_out.put.durable, durable);
        assert_int_equal(g_out.put.len, len);
        assert_ptr_equal(g_out.put.data, copy + ref.n - len); /* in place, not copied */
        assert_memory_equal(g_out.put.data, data, len);
        free(copy);
        refused_faults(d_put, body, ref.n, 0, NULL, "block_put", round);
    }
    kvt_proto_wr_cleanup(&w);
}

/* ---- answers: round trips ------------------------------------------------------------------- */

static void test_attach_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 4);
    for (int round = 0; round < 300; round++) {
        kvt_proto_attach_ans_t a;
        name_t path;
        rand_name(&path, 0);
        if (below(3) == 0)
            path.s.len = 0; /* a memfd */
        a.block_bytes = 1 + below(1u << 22);
        a.slot_bytes = a.block_bytes + (below(2) == 0 ? 0 : below(8192));
        a.nslots = below(4) == 0 ? below(4) : (uint32_t)rnd();
        a.slot_off = below(2) == 0 ? 4096 : rnd() >> 1;
        uint64_t span = (uint64_t)a.nslots * a.slot_bytes;
        if (a.slot_off > UINT64_MAX - span)
            a.slot_off = UINT64_MAX - span;
        uint64_t slack = UINT64_MAX - a.slot_off - span;
        a.map_bytes =
            a.slot_off + span + (below(2) == 0 ? 0 : rnd() % (slack + (slack < UINT64_MAX)));
        a.disk_slots = below(3) == 0 ? 0 : (uint32_t)rnd();
        a.arena_path = path.s;
        uint64_t req_id = rnd();

        size_t off = wr_start(&w);
        assert_int_equal(kvt_proto_attach_ans_encode(&w, req_id, &a), KVT_OK);
        bytes_t ref = {.n = 0};
        put(&ref, a.map_bytes, 8);
        put(&ref, a.slot_off, 8);
        put(&ref, a.slot_bytes, 4);
        put(&ref, a.nslots, 4);
        put(&ref, a.block_bytes, 4);
        put(&ref, a.disk_slots, 4);
        put_name(&ref, path.s);
        const uint8_t *body =
            frame_is(&w, off, KVT_PROTO_OP_ATTACH, KVT_PROTO_F_RESPONSE, req_id, &ref);
        uint8_t *copy = dup_exact(body, ref.n);
        out_reset();
        assert_int_equal(kvt_proto_attach_ans_decode(copy, ref.n, &g_out.attach, NULL, 0), KVT_OK);
        kvt_proto_attach_ans_t *d = &g_out.attach;
        assert_true(d->map_bytes == a.map_bytes && d->slot_off == a.slot_off);
        assert_true(d->slot_bytes == a.slot_bytes && d->nslots == a.nslots);
        assert_true(d->block_bytes == a.block_bytes && d->disk_slots == a.disk_slots);
        assert_true(str_is(d->arena_path, path.s, copy, ref.n));
        free(copy);
        refused_faults(d_attach, body, ref.n, 0, NULL, "attach answer", 0);
    }
    kvt_proto_wr_cleanup(&w);
}

static void test_array_answers_roundtrip(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 5);
    for (int round = 0; round < 300; round++) {
        uint64_t req_id = rnd();
        bytes_t ref = {.n = 0};

        /* LOOKUP */
        uint32_t hit = rand_count(0);
        uint8_t loc[MAXN];
        for (uint32_t i = 0; i < hit; i++)
            loc[i] = below(2) == 0 ? KVT_PROTO_LOC_RAM : KVT_PROTO_LOC_DISK;
        size_t off = wr_start(&w);
        assert_int_equal(kvt_proto_lookup_ans_encode(&w, req_id, hit > 0 ? loc : NULL, hit),
                         KVT_OK);
        put(&ref, hit, 4);
        put_raw(&ref, loc, hit);
        const uint8_t *body =
            frame_is(&w, off, KVT_PROTO_OP_LOOKUP, KVT_PROTO_F_RESPONSE, req_id, &ref);
        uint8_t *copy = dup_exact(body, ref.n);
        out_reset();
        assert_int_equal(
            kvt_proto_lookup_ans_decode(copy, ref.n, g_out.loc, hit, &g_out.count, NULL, 0),
            KVT_OK);
        assert_int_equal(g_out.count, hit);
        assert_memory_equal(g_out.loc, loc, hit);
        rest_untouched(g_out.loc, g_fill.loc, hit, 1);
        free(copy);
        refused_faults(d_lookup, body, ref.n, hit, "hit", "lookup answer", round);

        /* RESERVE */
        uint32_t n = rand_count(0), nev = rand_count(0);
        uint32_t slots[MAXN];
        uint64_t ev[MAXN];
        for (uint32_t i = 0; i < n; i++)
            slots[i] = below(4) == 0 ? KVT_PROTO_SLOT_NONE : (uint32_t)rnd();
        for (uint32_t i = 0; i < nev; i++)
            ev[i] = rnd();
        off = wr_start(&w);
        assert_int_equal(kvt_proto_reserve_ans_encode(&w, req_id, n > 0 ? slots : NULL, n,
                                                      nev > 0 ? ev : NULL, nev),
                         KVT_OK);
        ref.n = 0;
        put(&ref, n, 4);
        for (uint32_t i = 0; i < n; i++)
            put(&ref, slots[i], 4);
        put(&ref, nev, 4);
        for (uint32_t i = 0; i < nev; i++)
            put(&ref, ev[i], 8);
        body = frame_is(&w, off, KVT_PROTO_OP_RESERVE, KVT_PROTO_F_RESPONSE, req_id, &ref);
        copy = dup_exact(body, ref.n);
        out_reset();
        assert_int_equal(kvt_proto_reserve_ans_decode(copy, ref.n, g_out.u, n, g_out.ev, nev,
                                                      &g_out.reserve, NULL, 0),
                         KVT_OK);
        assert_int_equal(g_out.reserve.n, n);
        assert_int_equal(g_out.reserve.nevicted, nev);
        assert_memory_equal(g_out.u, slots, n * sizeof(slots[0]));
        assert_memory_equal(g_out.ev, ev, nev * sizeof(ev[0]));
        rest_untouched(g_out.u, g_fill.u, n, sizeof(g_out.u[0]));
        rest_untouched(g_out.ev, g_fill.ev, nev, sizeof(g_out.ev[0]));
        /* each count over its own capacity */
        kvt_proto_reserve_ans_t before;
        memset(&before, 0x5A, sizeof(before));
        kvt_proto_reserve_ans_t ra = before;
        char err[128] = "";
        if (n > 0) {
            assert_int_equal(kvt_proto_reserve_ans_decode(copy, ref.n, g_out.u, n - 1, g_out.ev,
                                                          nev, &ra, err, sizeof(err)),
                             KVT_ERR_TOO_BIG);
            check_msg(err, "reserve answer", "n is");
        }
        if (nev > 0) {
            assert_int_equal(kvt_proto_reserve_ans_decode(copy, ref.n, g_out.u, n, g_out.ev,
                                                          nev - 1, &ra, err, sizeof(err)),
                             KVT_ERR_TOO_BIG);
            check_msg(err, "reserve answer", "nevicted is");
        }
        assert_memory_equal(&ra, &before, sizeof(ra));
        free(copy);
        refused_faults(d_reserve, body, ref.n, 0, NULL, "reserve answer", round);

        /* PIN */
        n = rand_count(0);
        kvt_proto_pinned_t pins[MAXN];
        for (uint32_t i = 0; i < n; i++) {
            pins[i].slot = below(4) == 0 ? KVT_PROTO_SLOT_NONE : (uint32_t)rnd();
            pins[i].len = (uint32_t)rnd();
        }
        off = wr_start(&w);
        assert_int_equal(kvt_proto_pin_ans_encode(&w, req_id, n > 0 ? pins : NULL, n), KVT_OK);
        ref.n = 0;
        put(&ref, n, 4);
        for (uint32_t i = 0; i < n; i++) {
            put(&ref, pins[i].slot, 4);
            put(&ref, pins[i].len, 4);
        }
        body = frame_is(&w, off, KVT_PROTO_OP_PIN, KVT_PROTO_F_RESPONSE, req_id, &ref);
        copy = dup_exact(body, ref.n);
        out_reset();
        assert_int_equal(
            kvt_proto_pin_ans_decode(copy, ref.n, g_out.pins, n, &g_out.count, NULL, 0), KVT_OK);
        assert_int_equal(g_out.count, n);
        for (uint32_t i = 0; i < n; i++) {
            assert_int_equal(g_out.pins[i].slot, pins[i].slot);
            assert_int_equal(g_out.pins[i].len, pins[i].len);
        }
        rest_untouched(g_out.pins, g_fill.pins, n, sizeof(g_out.pins[0]));
        free(copy);
        refused_faults(d_pin, body, ref.n, n, "n", "pin answer", round);
    }
    kvt_proto_wr_cleanup(&w);
}

static void test_small_answers_roundtrip(void **state)
{
    (void)state;
    static const uint8_t count_ops[] = {KVT_PROTO_OP_COMMIT, KVT_PROTO_OP_UNPIN,
                                        KVT_PROTO_OP_PREFETCH};
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_rng_init(&g_rng, 6);
    static uint8_t data[4096];
    for (int round = 0; round < 200; round++) {
        uint64_t req_id = rnd();
        bytes_t ref = {.n = 0};

        /* COMMIT, UNPIN, PREFETCH: one count */
        uint8_t op = count_ops[below(3)];
        uint32_t count = below(2) == 0 ? below(4) : (uint32_t)rnd();
        size_t off = wr_start(&w);
        assert_int_equal(kvt_proto_count_ans_encode(&w, op, req_id, count), KVT_OK);
        put(&ref, count, 4);
        const uint8_t *body = frame_is(&w, off, op, KVT_PROTO_F_RESPONSE, req_id, &ref);
        uint8_t *copy = dup_exact(body, ref.n);
        uint32_t got = 0;
        assert_int_equal(kvt_proto_count_ans_decode(copy, ref.n, &got, NULL, 0), KVT_OK);
        assert_int_equal(got, count);
        free(copy);
        refused_faults(d_count, body, ref.n, 0, NULL, "count answer", 0);

        /* BLOCK_GET: the block is the body */
        uint32_t len = 1 + below(sizeof(data));
        for (uint32_t i = 0; i < len; i++)
            data[i] = (uint8_t)rnd();
        off = wr_start(&w);
        assert_int_equal(kvt_proto_block_get_ans_encode(&w, req_id, data, len), KVT_OK);
        ref.n = 0;
        put_raw(&ref, data, len);
        body = frame_is(&w, off, KVT_PROTO_OP_BLOCK_GET, KVT_PROTO_F_RESPONSE, req_id, &ref);
        copy = dup_exact(body, len);
        assert_int_equal(kvt_proto_block_get_ans_decode(copy, len, NULL, 0), KVT_OK);
        free(copy);
    }
    refused(d_get, (const uint8_t *)"", 0, 0, KVT_ERR_INVAL, "block_get answer", "empty");

    /* empty bodies: the ATTACH request, the BLOCK_PUT and BLOCK_DELETE answers */
    char err[128] = "unset";
    for (size_t i = 0; i < sizeof(tier_ops); i++)
        assert_int_equal(kvt_proto_empty_decode(tier_ops[i], 0, err, sizeof(err)), KVT_OK);
    assert_string_equal(err, "unset");
    assert_int_equal(kvt_proto_empty_decode(KVT_PROTO_OP_ATTACH, 3, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_string_equal(err, "attach: 3 bytes in a body that must be empty");
    assert_int_equal(kvt_proto_empty_decode(KVT_PROTO_OP_BLOCK_DELETE, 1, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_string_equal(err, "block_delete: 1 byte in a body that must be empty");
    assert_int_equal(kvt_proto_empty_decode(KVT_PROTO_OP_BLOCK_PUT, 1, NULL, 0), KVT_ERR_INVAL);
    wr_start(&w);
    assert_int_equal(kvt_proto_raw_encode(&w, KVT_PROTO_OP_ATTACH, 0, 3, NULL, 0), KVT_OK);
    assert_int_equal(w.len, 2 * KVT_PROTO_HDR_SIZE);
    kvt_proto_wr_cleanup(&w);
}

/* ---- requests: refusals --------------------------------------------------------------------- */

/* A KEYS body: @model and @lora given as raw (length, bytes), @n announced, @nkeys written. */
static void keys_body(bytes_t *o, const char *model, size_t mlen, const char *lora, size_t llen,
                      uint32_t n, uint32_t nkeys)
{
    o->n = 0;
    put_s(o, model, mlen);
    put_s(o, lora, llen);
    put(o, n, 4);
    for (uint32_t i = 0; i < nkeys; i++)
        put(o, 0x0101010101010101ull * (i + 1), 8);
}

/* Strings every request refuses in its model and lora fields (@what: the body's name). */
static void refused_names(dec_fn dec, const char *what, const bytes_t *tail)
{
    static char long_name[KVT_PROTO_MAX_STR + 1];
    memset(long_name, 'a', sizeof(long_name));
    bytes_t b;
    struct {
        const char *model;
        size_t mlen;
        const char *lora;
        size_t llen;
        const char *part;
    } cases[] = {
        {"", 0, "", 0, "model is empty"},
        {"", 0, "x", 1, "model is empty"},
        {"a\0b", 3, "", 0, "model has a NUL byte"},
        {"\0", 1, "", 0, "model has a NUL byte"},
        {"m", 1, "l\0", 2, "lora has a NUL byte"},
        {long_name, KVT_PROTO_MAX_STR + 1, "", 0, "model is 256 bytes"},
        {"m", 1, long_name, KVT_PROTO_MAX_STR + 1, "lora is 256 bytes"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        b.n = 0;
        put_s(&b, cases[i].model, cases[i].mlen);
        put_s(&b, cases[i].lora, cases[i].llen);
        put_raw(&b, tail->b, tail->n);
        refused(dec, b.b, b.n, MAXN, KVT_ERR_INVAL, what, cases[i].part);
    }
    /* a length that claims more than the body holds */
    b.n = 0;
    put(&b, 9, 2);
    put_raw(&b, "abc", 3);
    refused(dec, b.b, b.n, MAXN, KVT_ERR_INVAL, what, "body ends inside model");
    /* 255 bytes is the longest accepted */
    b.n = 0;
    put_s(&b, long_name, KVT_PROTO_MAX_STR);
    put_s(&b, long_name, KVT_PROTO_MAX_STR);
    put_raw(&b, tail->b, tail->n);
    out_reset();
    assert_int_equal(dec(b.b, b.n, MAXN, &g_out, NULL, 0), KVT_OK);
}

static void test_keys_rejects(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 7);
    bytes_t b, tail = {.n = 0};
    put(&tail, 1, 4);
    put(&tail, 42, 8);
    refused_names(d_keys, "keys", &tail);

    keys_body(&b, "m", 1, "", 0, 0, 0);
    refused(d_keys, b.b, b.n, MAXN, KVT_ERR_INVAL, "keys", "n is 0");
    keys_body(&b, "m", 1, "", 0, 5, 5);
    refused(d_keys, b.b, b.n, 4, KVT_ERR_TOO_BIG, "keys", "n is 5, more than the 4 taken");
    refused(d_keys, b.b, b.n, 0, KVT_ERR_TOO_BIG, "keys", "n is 5");
    out_reset();
    assert_int_equal(d_keys(b.b, b.n, 5, &g_out, NULL, 0), KVT_OK); /* exactly the capacity */
    rest_untouched(g_out.k, g_fill.k, 5, sizeof(g_out.k[0]));
    keys_body(&b, "m", 1, "", 0, 5, 4);
    refused(d_keys, b.b, b.n, MAXN, KVT_ERR_INVAL, "keys", "body ends inside the keys");
    keys_body(&b, "m", 1, "", 0, 5, 6);
    refused(d_keys, b.b, b.n, MAXN, KVT_ERR_INVAL, "keys", "8 bytes after the keys");
    keys_body(&b, "m", 1, "", 0, UINT32_MAX, 1);
    refused(d_keys, b.b, b.n, UINT32_MAX, KVT_ERR_INVAL, "keys", "body ends inside the keys");
    keys_body(&b, "m", 1, "", 0, UINT32_MAX / 8 + 1, 1); /* n * 8 wraps a u32 */
    refused(d_keys, b.b, b.n, UINT32_MAX, KVT_ERR_INVAL, "keys", "body ends inside the keys");
    keys_body(&b, "m", 1, "lora", 4, 1, 1);
    b.n -= 12; /* ends before n ... */
    refused(d_keys, b.b, b.n, MAXN, KVT_ERR_INVAL, "keys", "body ends before n");
    b.n += 2; /* ... inside it */
    refused(d_keys, b.b, b.n, MAXN, KVT_ERR_INVAL, "keys", "body ends inside n");
    refused(d_keys, b.b, 0, MAXN, KVT_ERR_INVAL, "keys", "body ends before model");
    refused(d_keys, NULL, 0, MAXN, KVT_ERR_INVAL, "keys", "body ends before model");
}

/* A COMMIT body with the given ok and pad bytes, @n announced and @nk keys and lens written. */
static void commit_body(bytes_t *o, uint8_t ok, const uint8_t pad[3], uint32_t n, uint32_t nk,
                        uint32_t nl)
{
    o->n = 0;
    put_s(o, "model", 5);
    put_s(o, "", 0);
    put(o, ok, 1);
    put_raw(o, pad, 3);
    put(o, n, 4);
    for (uint32_t i = 0; i < nk; i++)
        put(o, i + 100, 8);
    for (uint32_t i = 0; i < nl; i++)
        put(o, i, 4);
}

static void test_commit_rejects(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 8);
    static const uint8_t zero[3] = {0, 0, 0};
    bytes_t b, tail = {.n = 0};
    put(&tail, 1, 4); /* ok 1, pad */
    put(&tail, 1, 4);
    put(&tail, 42, 8);
    put(&tail, 0, 4);
    refused_names(d_commit, "commit", &tail);

    for (int ok = 2; ok < 256; ok++) {
        commit_body(&b, (uint8_t)ok, zero, 1, 1, 1);
        char part[40];
        snprintf(part, sizeof(part), "ok must be 0 or 1, not %d", ok);
        refused(d_commit, b.b, b.n, MAXN, KVT_ERR_INVAL, "commit", part);
    }
    for (int i = 0; i < 3; i++) {
        uint8_t pad[3] = {0, 0, 0};
        pad[i] = (uint8_t)(1u << below(8));
        commit_body(&b, 1, pad, 1, 1, 1);
        refused(d_commit, b.b, b.n, MAXN, KVT_ERR_INVAL, "commit", "pad bytes after ok must be 0");
    }
    commit_body(&b, 0, zero, 0, 0, 0);
    refused(d_commit, b.b, b.n, MAXN, KVT_ERR_INVAL, "commit", "n is 0");
    commit_body(&b, 0, zero, 3, 3, 3);
    refused(d_commit, b.b, b.n, 2, KVT_ERR_TOO_BIG, "commit", "n is 3");
    commit_body(&b, 0, zero, 3, 3, 2);
    refused(d_commit, b.b, b.n, MAXN, KVT_ERR_INVAL, "commit",
            "body ends inside the keys and lens");
    commit_body(&b, 0, zero, 3, 3, 4);
    refused(d_commit, b.b, b.n, MAXN, KVT_ERR_INVAL, "commit", "4 bytes after the lens");
    commit_body(&b, 0, zero, 3, 0, 0);
    refused(d_commit, b.b, b.n, MAXN, KVT_ERR_INVAL, "commit",
            "body ends before the keys and lens");
    commit_body(&b, 1, zero, 3, 3, 3);
    refused(d_commit, b.b, 9, MAXN, KVT_ERR_INVAL, "commit", "body ends before ok and pad");
    refused(d_commit, b.b, 11, MAXN, KVT_ERR_INVAL, "commit", "body ends inside ok and pad");
    /* both flag values decode; lens of 0 stay 0 (the server reads them as the block size) */
    for (uint8_t ok = 0; ok < 2; ok++) {
        commit_body(&b, ok, zero, 2, 2, 2);
        out_reset();
        assert_int_equal(d_commit(b.b, b.n, 2, &g_out, NULL, 0), KVT_OK);
        assert_int_equal(g_out.commit.ok, ok == 1);
        assert_int_equal(g_out.u[0], 0);
        assert_int_equal(g_out.u[1], 1);
        assert_true(g_out.k[1] == 101);
    }
}

/* A BLOCK_PUT body: @len announced, @nbytes of data written. */
static void put_body(bytes_t *o, uint8_t durable, const uint8_t pad[3], uint32_t len,
                     uint32_t nbytes)
{
    o->n = 0;
    put_s(o, "m", 1);
    put_s(o, "lora-7", 6);
    put(o, 0xFEDCBA9876543210ull, 8);
    put(o, durable, 1);
    put_raw(o, pad, 3);
    put(o, len, 4);
    for (uint32_t i = 0; i < nbytes; i++)
        put(o, i * 7, 1);
}

static void test_block_rejects(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 9);
    static const uint8_t zero[3] = {0, 0, 0};
    bytes_t b, tail = {.n = 0};

    /* BLOCK_PUT */
    put(&tail, 7, 8);
    put(&tail, 0, 4);
    put(&tail, 1, 4);
    put(&tail, 0xEE, 1);
    refused_names(d_put, "block_put", &tail);
    for (int d = 2; d < 256; d += 17) {
        put_body(&b, (uint8_t)d, zero, 4, 4);
        refused(d_put, b.b, b.n, 0, KVT_ERR_INVAL, "block_put", "durable must be 0 or 1");
    }
    for (int i = 0; i < 3; i++) {
        uint8_t pad[3] = {0, 0, 0};
        pad[i] = 0x80;
        put_body(&b, 0, pad, 4, 4);
        refused(d_put, b.b, b.n, 0, KVT_ERR_INVAL, "block_put",
                "pad bytes after durable must be 0");
    }
    put_body(&b, 1, zero, 0, 0);
    refused(d_put, b.b, b.n, 0, KVT_ERR_INVAL, "block_put", "len is 0");
    put_body(&b, 1, zero, 0, 3);
    refused(d_put, b.b, b.n, 0, KVT_ERR_INVAL, "block_put", "len is 0");
    put_body(&b, 1, zero, 5, 4);
    refused(d_put, b.b, b.n, 0, KVT_ERR_INVAL, "block_put", "body ends inside the block");
    put_body(&b, 1, zero, 4, 7);
    refused(d_put, b.b, b.n, 0, KVT_ERR_INVAL, "block_put", "3 bytes after the block");
    put_body(&b, 1, zero, UINT32_MAX, 10);
    refused(d_put, b.b, b.n, 0, KVT_ERR_INVAL, "block_put", "body ends inside the block");
    put_body(&b, 1, zero, 4, 4);
    refused(d_put, b.b, 11, 0, KVT_ERR_INVAL, "block_put", "body ends before key");
    refused(d_put, b.b, 15, 0, KVT_ERR_INVAL, "block_put", "body ends inside key");
    refused(d_put, b.b, 19, 0, KVT_ERR_INVAL, "block_put", "body ends before durable and pad");
    refused(d_put, b.b, 21, 0, KVT_ERR_INVAL, "block_put", "body ends inside durable and pad");
    refused(d_put, b.b, 23, 0, KVT_ERR_INVAL, "block_put", "body ends before len");
    refused(d_put, b.b, 27, 0, KVT_ERR_INVAL, "block_put", "body ends before the block");
    refused(d_put, b.b, 29, 0, KVT_ERR_INVAL, "block_put", "body ends inside the block");
    out_reset();
    assert_int_equal(d_put(b.b, b.n, 0, &g_out, NULL, 0), KVT_OK);
    assert_true(g_out.put.key == 0xFEDCBA9876543210ull && g_out.put.durable && g_out.put.len == 4);

    /* BLOCK_GET / BLOCK_DELETE */
    tail.n = 0;
    put(&tail, 7, 8);
    refused_names(d_bkey, "block_key", &tail);
    b.n = 0;
    put_s(&b, "m", 1);
    put_s(&b, "", 0);
    put(&b, 1, 4);
    refused(d_bkey, b.b, b.n, 0, KVT_ERR_INVAL, "block_key", "body ends inside key");
    put(&b, 0, 4);
    put(&b, 0, 1);
    refused(d_bkey, b.b, b.n, 0, KVT_ERR_INVAL, "block_key", "1 byte after the key");
}

/* ---- answers: refusals ---------------------------------------------------------------------- */

static void attach_body(bytes_t *o, uint64_t map, uint64_t off, uint32_t slot, uint32_t nslots,
                        uint32_t block, const char *path, size_t plen)
{
    o->n = 0;
    put(o, map, 8);
    put(o, off, 8);
    put(o, slot, 4);
    put(o, nslots, 4);
    put(o, block, 4);
    put(o, 77, 4);
    put_s(o, path, plen);
}

static void test_answer_rejects(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 10);
    bytes_t b;
    const char *A = "attach answer";

    /* ATTACH: the slots fit the mapping exactly, or not */
    attach_body(&b, 4096 + 10 * 8192, 4096, 8192, 10, 8000, "/dev/shm/kv", 11);
    out_reset();
    assert_int_equal(d_attach(b.b, b.n, 0, &g_out, NULL, 0), KVT_OK);
    attach_body(&b, 4096 + 10 * 8192 - 1, 4096, 8192, 10, 8000, "", 0);
    refused(d_attach, b.b, b.n, 0, KVT_ERR_INVAL, A, "end past map_bytes");
    attach_body(&b, 100, 101, 8192, 0, 8000, "", 0);
    refused(d_attach, b.b, b.n, 0, KVT_ERR_INVAL, A, "end past map_bytes");
    attach_body(&b, UINT64_MAX, UINT64_MAX - 8191, 8192, 2, 8192, "", 0);
    refused(d_attach, b.b, b.n, 0, KVT_ERR_INVAL, A, "end past map_bytes");
    attach_body(&b, UINT64_MAX, UINT64_MAX - 8192, 8192, 1, 8192, "", 0);
    out_reset();
    assert_int_equal(d_attach(b.b, b.n, 0, &g_out, NULL, 0), KVT_OK);
    attach_body(&b, 1 << 20, 0, 4096, 4, 4097, "", 0);
    refused(d_attach, b.b, b.n, 0, KVT_ERR_INVAL, A, "slot_bytes 4096 is less than block_bytes");
    attach_body(&b, 1 << 20, 0, 4096, 4, 0, "", 0);
    refused(d_attach, b.b, b.n, 0, KVT_ERR_INVAL, A, "block_bytes is 0");
    attach_body(&b, 1 << 20, 0, 4096, 4, 4096, "/a\0b", 4);
    refused(d_attach, b.b, b.n, 0, KVT_ERR_INVAL, A, "arena_path has a NUL byte");
    attach_body(&b, 1 << 20, 0, 4096, 4, 4096, "", 0);
    refused(d_attach, b.b, 31, 0, KVT_ERR_INVAL, A, "body ends inside the geometry");
    refused(d_attach, b.b, 0, 0, KVT_ERR_INVAL, A, "body ends before the geometry");
    refused(d_attach, b.b, 32, 0, KVT_ERR_INVAL, A, "body ends before arena_path");

    /* LOOKUP: locations other than RAM and DISK */
    for (int v = 0; v < 256; v++) {
        if (v == KVT_PROTO_LOC_RAM || v == KVT_PROTO_LOC_DISK)
            continue;
        b.n = 0;
        put(&b, 3, 4);
        put(&b, KVT_PROTO_LOC_RAM, 1);
        put(&b, KVT_PROTO_LOC_DISK, 1);
        put(&b, (uint64_t)v, 1);
        char part[64];
        snprintf(part, sizeof(part), "loc[2] is %d", v);
        refused(d_lookup, b.b, b.n, MAXN, KVT_ERR_INVAL, "lookup answer", part);
    }
    b.n = 0;
    put(&b, 2, 4);
    put(&b, 1, 1);
    refused(d_lookup, b.b, b.n, MAXN, KVT_ERR_INVAL, "lookup answer",
            "body ends inside the locations");
    refused(d_lookup, b.b, 0, MAXN, KVT_ERR_INVAL, "lookup answer", "body ends before hit");
    refused(d_lookup, b.b, 3, MAXN, KVT_ERR_INVAL, "lookup answer", "body ends inside hit");

    /* RESERVE: counts and what they announce */
    b.n = 0;
    put(&b, 1, 4);
    put(&b, 9, 4);
    refused(d_reserve, b.b, b.n, MAXN, KVT_ERR_INVAL, "reserve answer",
            "body ends before nevicted");
    put(&b, 2, 4);
    put(&b, 5, 8);
    refused(d_reserve, b.b, b.n, MAXN, KVT_ERR_INVAL, "reserve answer",
            "body ends inside the evicted keys");
    put(&b, 6, 8);
    out_reset();
    assert_int_equal(d_reserve(b.b, b.n, 2, &g_out, NULL, 0), KVT_OK);
    assert_true(g_out.reserve.n == 1 && g_out.reserve.nevicted == 2 && g_out.u[0] == 9);
    assert_true(g_out.ev[0] == 5 && g_out.ev[1] == 6);
    b.n = 0;
    put(&b, 3, 4);
    put(&b, 1, 4);
    refused(d_reserve, b.b, b.n, MAXN, KVT_ERR_INVAL, "reserve answer",
            "body ends inside the slots");

    /* PIN */
    b.n = 0;
    put(&b, 2, 4);
    put(&b, 1, 4);
    put(&b, 1, 4);
    put(&b, 1, 4);
    refused(d_pin, b.b, b.n, MAXN, KVT_ERR_INVAL, "pin answer", "body ends inside the pins");

    /* one count */
    refused(d_count, b.b, 3, 0, KVT_ERR_INVAL, "count answer", "body ends inside the count");
    refused(d_count, b.b, 5, 0, KVT_ERR_INVAL, "count answer", "1 byte after the count");
}

/* ---- encoders: refusals --------------------------------------------------------------------- */

/* Encoding failed with @want and left @w as @before (@blen bytes). */
static void wr_kept(kvt_status_t got, kvt_status_t want, const kvt_proto_wr_t *w,
                    const uint8_t *before, size_t blen)
{
    assert_int_equal(got, want);
    assert_int_equal(w->len, blen);
    assert_memory_equal(w->buf, before, blen);
    assert_false(w->oom);
    assert_false(w->bad);
}

static void test_encode_refusals(void **state)
{
    (void)state;
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    size_t blen = wr_start(&w);
    uint8_t before[KVT_PROTO_HDR_SIZE];
    memcpy(before, w.buf, blen);
    static char long_name[KVT_PROTO_MAX_STR + 1];
    memset(long_name, 'x', sizeof(long_name));
    const uint64_t keys[2] = {1, 2};
    const uint32_t lens[2] = {0, 5};
    kvt_proto_str_t m = {"m", 1}, none = {NULL, 0}, longs = {long_name, KVT_PROTO_MAX_STR + 1};
    kvt_proto_str_t nul = {"a\0", 2};

    /* KEYS */
    kvt_proto_keys_t k = {m, none, 2};
    for (int op = 0; op < 256; op++)
        if (!kvt_proto_op_keys((uint8_t)op))
            wr_kept(kvt_proto_keys_req_encode(&w, (uint8_t)op, 1, &k, keys), KVT_ERR_INVAL, &w,
                    before, blen);
    wr_kept(kvt_proto_keys_req_encode(&w, KVT_PROTO_OP_PIN, 1, &k, NULL), KVT_ERR_INVAL, &w, before,
            blen);
    k.n = 0;
    wr_kept(kvt_proto_keys_req_encode(&w, KVT_PROTO_OP_PIN, 1, &k, keys), KVT_ERR_INVAL, &w, before,
            blen);
    k = (kvt_proto_keys_t){none, none, 2};
    wr_kept(kvt_proto_keys_req_encode(&w, KVT_PROTO_OP_PIN, 1, &k, keys), KVT_ERR_INVAL, &w, before,
            blen);
    k = (kvt_proto_keys_t){longs, none, 2};
    wr_kept(kvt_proto_keys_req_encode(&w, KVT_PROTO_OP_PIN, 1, &k, keys), KVT_ERR_TOO_BIG, &w,
            before, blen);
    k = (kvt_proto_keys_t){m, nul, 2};
    wr_kept(kvt_proto_keys_req_encode(&w, KVT_PROTO_OP_PIN, 1, &k, keys), KVT_ERR_TOO_BIG, &w,
            before, blen);
    k = (kvt_proto_keys_t){m, none, KVT_PROTO_MAX_BODY_LIMIT / 8 + 1};
    wr_kept(kvt_proto_keys_req_encode(&w, KVT_PROTO_OP_PIN, 1, &k, keys), KVT_ERR_TOO_BIG, &w,
            before, blen);

    /* COMMIT */
    kvt_proto_commit_t c = {none, none, true, 2};
    wr_kept(kvt_proto_commit_req_encode(&w, 1, &c, keys, lens), KVT_ERR_INVAL, &w, before, blen);
    c = (kvt_proto_commit_t){m, none, true, 0};
    wr_kept(kvt_proto_commit_req_encode(&w, 1, &c, keys, lens), KVT_ERR_INVAL, &w, before, blen);
    c = (kvt_proto_commit_t){m, none, true, 2};
    wr_kept(kvt_proto_commit_req_encode(&w, 1, &c, NULL, lens), KVT_ERR_INVAL, &w, before, blen);
    c = (kvt_proto_commit_t){m, longs, true, 2};
    wr_kept(kvt_proto_commit_req_encode(&w, 1, &c, keys, lens), KVT_ERR_TOO_BIG, &w, before, blen);
    c = (kvt_proto_commit_t){m, none, true, KVT_PROTO_MAX_BODY_LIMIT / 12 + 1};
    wr_kept(kvt_proto_commit_req_encode(&w, 1, &c, keys, lens), KVT_ERR_TOO_BIG, &w, before, blen);

    /* KEY, BLOCK_PUT */
    kvt_proto_block_key_t bk = {m, none, 9};
    wr_kept(kvt_proto_block_key_req_encode(&w, KVT_PROTO_OP_BLOCK_PUT, 1, &bk), KVT_ERR_INVAL, &w,
            before, blen);
    wr_kept(kvt_proto_block_key_req_encode(&w, KVT_PROTO_OP_LOOKUP, 1, &bk), KVT_ERR_INVAL, &w,
            before, blen);
    bk.model = none;
    wr_kept(kvt_proto_block_key_req_encode(&w, KVT_PROTO_OP_BLOCK_GET, 1, &bk), KVT_ERR_INVAL, &w,
            before, blen);
    bk.model = nul;
    wr_kept(kvt_proto_block_key_req_encode(&w, KVT_PROTO_OP_BLOCK_DELETE, 1, &bk), KVT_ERR_TOO_BIG,
            &w, before, blen);
    kvt_proto_block_put_t p = {m, none, 9, true, 0, (const uint8_t *)"x"};
    wr_kept(kvt_proto_block_put_req_encode(&w, 1, &p), KVT_ERR_INVAL, &w, before, blen);
    p = (kvt_proto_block_put_t){m, none, 9, true, 1, NULL};
    wr_kept(kvt_proto_block_put_req_encode(&w, 1, &p), KVT_ERR_INVAL, &w, before, blen);
    p = (kvt_proto_block_put_t){none, none, 9, true, 1, (const uint8_t *)"x"};
    wr_kept(kvt_proto_block_put_req_encode(&w, 1, &p), KVT_ERR_INVAL, &w, before, blen);
    p = (kvt_proto_block_put_t){
        m, none, 9, true, KVT_PROTO_MAX_BODY_LIMIT + 1, (const uint8_t *)"x"};
    wr_kept(kvt_proto_block_put_req_encode(&w, 1, &p), KVT_ERR_TOO_BIG, &w, before, blen);
    /* a block of exactly the limit leaves no room for the fields before it */
    uint8_t *big = calloc(KVT_PROTO_MAX_BODY_LIMIT, 1);
    assert_non_null(big);
    p = (kvt_proto_block_put_t){m, none, 9, true, KVT_PROTO_MAX_BODY_LIMIT, big};
    wr_kept(kvt_proto_block_put_req_encode(&w, 1, &p), KVT_ERR_TOO_BIG, &w, before, blen);
    p.len = KVT_PROTO_MAX_BODY_LIMIT - 21; /* 3 + 2 + 8 + 4 + 4 + len: exactly the limit */
    assert_int_equal(kvt_proto_block_put_req_encode(&w, 1, &p), KVT_OK);
    assert_int_equal(w.len, blen + KVT_PROTO_HDR_SIZE + KVT_PROTO_MAX_BODY_LIMIT);
    free(big);
    blen = wr_start(&w);

    /* answers */
    kvt_proto_attach_ans_t a = {1 << 20, 0, 4096, 256, 4096, 0, none};
    assert_int_equal(kvt_proto_attach_ans_encode(&w, 1, &a), KVT_OK);
    blen = wr_start(&w);
    a.nslots = 257;
    wr_kept(kvt_proto_attach_ans_encode(&w, 1, &a), KVT_ERR_INVAL, &w, before, blen);
    a.nslots = 256;
    a.block_bytes = 0;
    wr_kept(kvt_proto_attach_ans_encode(&w, 1, &a), KVT_ERR_INVAL, &w, before, blen);
    a.block_bytes = 4097;
    wr_kept(kvt_proto_attach_ans_encode(&w, 1, &a), KVT_ERR_INVAL, &w, before, blen);
    a.block_bytes = 4096;
    a.arena_path = nul;
    wr_kept(kvt_proto_attach_ans_encode(&w, 1, &a), KVT_ERR_TOO_BIG, &w, before, blen);
    a.arena_path = longs;
    wr_kept(kvt_proto_attach_ans_encode(&w, 1, &a), KVT_ERR_TOO_BIG, &w, before, blen);

    const uint8_t bad_loc[3] = {1, 3, 2}, zero_loc[1] = {0};
    wr_kept(kvt_proto_lookup_ans_encode(&w, 1, bad_loc, 3), KVT_ERR_INVAL, &w, before, blen);
    wr_kept(kvt_proto_lookup_ans_encode(&w, 1, zero_loc, 1), KVT_ERR_INVAL, &w, before, blen);
    wr_kept(kvt_proto_lookup_ans_encode(&w, 1, NULL, 1), KVT_ERR_INVAL, &w, before, blen);
    const uint32_t slots[1] = {3};
    wr_kept(kvt_proto_reserve_ans_encode(&w, 1, NULL, 1, keys, 1), KVT_ERR_INVAL, &w, before, blen);
    wr_kept(kvt_proto_reserve_ans_encode(&w, 1, slots, 1, NULL, 1), KVT_ERR_INVAL, &w, before,
            blen);
    wr_kept(kvt_proto_pin_ans_encode(&w, 1, NULL, 1), KVT_ERR_INVAL, &w, before, blen);
    for (int op = 0; op < 256; op++)
        if (op != KVT_PROTO_OP_COMMIT && op != KVT_PROTO_OP_UNPIN && op != KVT_PROTO_OP_PREFETCH &&
            op != KVT_PROTO_OP_XFER_RENEW && op != KVT_PROTO_OP_XFER_RELEASE)
            wr_kept(kvt_proto_count_ans_encode(&w, (uint8_t)op, 1, 1), KVT_ERR_INVAL, &w, before,
                    blen);
    wr_kept(kvt_proto_block_get_ans_encode(&w, 1, "x", 0), KVT_ERR_INVAL, &w, before, blen);
    wr_kept(kvt_proto_block_get_ans_encode(&w, 1, NULL, 1), KVT_ERR_INVAL, &w, before, blen);
    wr_kept(kvt_proto_block_get_ans_encode(&w, 1, "x", (size_t)KVT_PROTO_MAX_BODY_LIMIT + 1),
            KVT_ERR_TOO_BIG, &w, before, blen);
    kvt_proto_wr_cleanup(&w);
}

/* ---- error text ----------------------------------------------------------------------------- */

static void test_error_text(void **state)
{
    (void)state;
    bytes_t b;
    keys_body(&b, "m", 1, "", 0, 0, 0);
    uint64_t keys[1];
    kvt_proto_keys_t k;

    /* the whole message, then cut to the room given, always terminated */
    char err[64];
    assert_int_equal(kvt_proto_keys_req_decode(b.b, b.n, keys, 1, &k, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_string_equal(err, "keys: n is 0");
    memset(err, 'x', sizeof(err));
    assert_int_equal(kvt_proto_keys_req_decode(b.b, b.n, keys, 1, &k, err, 5), KVT_ERR_INVAL);
    assert_string_equal(err, "keys");
    assert_int_equal(err[5], 'x');
    memset(err, 'x', sizeof(err));
    assert_int_equal(kvt_proto_keys_req_decode(b.b, b.n, keys, 1, &k, err, 1), KVT_ERR_INVAL);
    assert_int_equal(err[0], '\0');
    assert_int_equal(err[1], 'x');
    /* errlen 0: nothing written, @err may be NULL */
    memset(err, 'x', sizeof(err));
    assert_int_equal(kvt_proto_keys_req_decode(b.b, b.n, keys, 1, &k, err, 0), KVT_ERR_INVAL);
    assert_int_equal(err[0], 'x');
    assert_int_equal(kvt_proto_keys_req_decode(b.b, b.n, keys, 1, &k, NULL, 0), KVT_ERR_INVAL);

    /* the brief's own examples */
    static const uint8_t zero[3] = {0, 0, 0};
    commit_body(&b, 2, zero, 1, 1, 1);
    kvt_proto_commit_t c;
    uint32_t lens[1];
    assert_int_equal(kvt_proto_commit_req_decode(b.b, b.n, keys, lens, 1, &c, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_string_equal(err, "commit: ok must be 0 or 1, not 2");
    put_body(&b, 0, zero, 4, 7);
    kvt_proto_block_put_t p;
    assert_int_equal(kvt_proto_block_put_req_decode(b.b, b.n, &p, err, sizeof(err)), KVT_ERR_INVAL);
    assert_string_equal(err, "block_put: 3 bytes after the block");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_literal_frames),
        cmocka_unit_test(test_keys_roundtrip),
        cmocka_unit_test(test_commit_roundtrip),
        cmocka_unit_test(test_block_requests_roundtrip),
        cmocka_unit_test(test_attach_roundtrip),
        cmocka_unit_test(test_array_answers_roundtrip),
        cmocka_unit_test(test_small_answers_roundtrip),
        cmocka_unit_test(test_keys_rejects),
        cmocka_unit_test(test_commit_rejects),
        cmocka_unit_test(test_block_rejects),
        cmocka_unit_test(test_answer_rejects),
        cmocka_unit_test(test_encode_refusals),
        cmocka_unit_test(test_error_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
