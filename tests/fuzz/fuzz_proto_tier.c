/*
 * libFuzzer target for the tier data plane's decoders (proto/proto_tier.c).
 *
 * Input: an optional first byte below 0x40, the capacity the caller gives
 * (keys, lens, locations, slots, evicted keys, pins; else the body's length,
 * more than any count can need), then a frame body. Every decoder runs on the
 * same body, copied to an exactly-sized heap buffer, with output arrays of
 * exactly that capacity, so ASan reports a read past the body or a write past
 * the capacity. Invariants:
 *  - a refused body gives KVT_ERR_INVAL (or KVT_ERR_TOO_BIG, from decoders
 *    with a capacity only), one line of text that starts with the decoder's
 *    name, in lowercase, without a trailing period, the same status without
 *    room for text, and leaves every output as it was;
 *  - a decoded body's strings lie inside it, its counts fit the capacity (and
 *    one less is KVT_ERR_TOO_BIG), and it re-encodes to exactly the same
 *    body behind a header with the opcode, flags and req_id asked for.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvt_proto_wr_t wr; /* reused across inputs: the fuzzer runs one thread */

/* The caller's arrays, exactly @cap entries each; refilled with a pattern before each call. */
typedef struct arrays {
    uint32_t cap;
    uint64_t *k, *ev;
    uint32_t *u;
    uint8_t *loc;
    kvt_proto_pinned_t *pins;
} arrays_t;

static void *alloc_n(size_t n, size_t size)
{
    void *p = malloc(n > 0 ? n * size : 1);
    CHECK(p != NULL);
    return p;
}

static void fill(arrays_t *a)
{
    memset(a->k, 0xA5, a->cap * sizeof(*a->k));
    memset(a->ev, 0xA5, a->cap * sizeof(*a->ev));
    memset(a->u, 0xA5, a->cap * sizeof(*a->u));
    memset(a->loc, 0xA5, a->cap);
    memset(a->pins, 0xA5, a->cap * sizeof(*a->pins));
}

/* Entries [@from, @to) of @size bytes each still hold the pattern. */
static void untouched(const void *p, size_t from, size_t to, size_t size)
{
    static uint8_t pat[4096];
    if (pat[0] != 0xA5)
        memset(pat, 0xA5, sizeof(pat));
    const uint8_t *b = (const uint8_t *)p + from * size;
    for (size_t left = from < to ? (to - from) * size : 0; left > 0;) {
        size_t n = left < sizeof(pat) ? left : sizeof(pat);
        CHECK(memcmp(b, pat, n) == 0);
        b += n;
        left -= n;
    }
}

static void untouched_all(const arrays_t *a, uint32_t from)
{
    untouched(a->k, from, a->cap, sizeof(*a->k));
    untouched(a->ev, from, a->cap, sizeof(*a->ev));
    untouched(a->u, from, a->cap, sizeof(*a->u));
    untouched(a->loc, from, a->cap, 1);
    untouched(a->pins, from, a->cap, sizeof(*a->pins));
}

static void check_str(kvt_proto_str_t s, const uint8_t *body, size_t len, bool nonempty)
{
    CHECK(s.len <= KVT_PROTO_MAX_STR);
    CHECK(!nonempty || s.len > 0);
    if (s.len == 0)
        return;
    const uint8_t *p = (const uint8_t *)s.p;
    CHECK(s.len <= len && p >= body && (size_t)(p - body) <= len - s.len);
    CHECK(memchr(p, '\0', s.len) == NULL);
}

/* A refusal's text: "@what: ...", one lowercase line, no trailing period. */
static void check_err(kvt_status_t st, bool may_be_big, const char *err, const char *what)
{
    CHECK(st == KVT_ERR_INVAL || (may_be_big && st == KVT_ERR_TOO_BIG));
    size_t wl = strlen(what), el = strlen(err);
    CHECK(strncmp(err, what, wl) == 0 && err[wl] == ':' && err[wl + 1] == ' ' && el > wl + 2);
    CHECK(err[0] >= 'a' && err[0] <= 'z');
    CHECK(strchr(err, '\n') == NULL && err[el - 1] != '.');
}

/* The frame just encoded into wr has @op, @flags, req_id 7 and @body as its body. */
static void check_frame(uint8_t op, uint16_t flags, const uint8_t *body, size_t len)
{
    kvt_proto_hdr_t h;
    CHECK(wr.len == KVT_PROTO_HDR_SIZE + len);
    CHECK(kvt_proto_hdr_decode(wr.buf, KVT_PROTO_MAX_BODY_LIMIT, &h) == KVT_OK);
    CHECK(h.op == op && h.flags == flags && h.req_id == 7 && h.body_len == len);
    CHECK(len == 0 || memcmp(wr.buf + KVT_PROTO_HDR_SIZE, body, len) == 0);
}

/*
 * Runs decoder call @CALL (which writes status `st` given `err`/`errlen`)
 * twice, with and without room for text; on refusal checks the text and that
 * *@OUT and the arrays are as they were, then returns.
 */
#define DECODE(WHAT, BIG, OUT, CALL)                                                               \
    do {                                                                                           \
        char err[256] = "";                                                                        \
        size_t errlen = sizeof(err);                                                               \
        memset((OUT), 0x5A, sizeof(*(OUT)));                                                       \
        fill(a);                                                                                   \
        st = (CALL);                                                                               \
        kvt_status_t st0 = st;                                                                     \
        if (st != KVT_OK) {                                                                        \
            check_err(st, (BIG), err, (WHAT));                                                     \
            uint8_t pat[sizeof(*(OUT))];                                                           \
            memset(pat, 0x5A, sizeof(pat));                                                        \
            CHECK(memcmp((OUT), pat, sizeof(pat)) == 0);                                           \
            untouched_all(a, 0);                                                                   \
            errlen = 0;                                                                            \
            CHECK((CALL) == st0);                                                                  \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void fuzz_keys(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_keys_t k;
    kvt_status_t st;
    DECODE("keys", true, &k,
           kvt_proto_keys_req_decode(body, len, a->k, a->cap, &k, errlen ? err : NULL, errlen));
    check_str(k.model, body, len, true);
    check_str(k.lora, body, len, false);
    CHECK(k.n >= 1 && k.n <= a->cap);
    untouched(a->k, k.n, a->cap, sizeof(*a->k));
    kvt_proto_keys_t again;
    CHECK(kvt_proto_keys_req_decode(body, len, a->k, k.n - 1, &again, NULL, 0) == KVT_ERR_TOO_BIG);
    static const uint8_t ops[] = {KVT_PROTO_OP_LOOKUP, KVT_PROTO_OP_RESERVE, KVT_PROTO_OP_PIN,
                                  KVT_PROTO_OP_UNPIN, KVT_PROTO_OP_PREFETCH};
    uint8_t op = ops[len % 5];
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_keys_req_encode(&wr, op, 7, &k, a->k) == KVT_OK);
    check_frame(op, 0, body, len);
}

static void fuzz_commit(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_commit_t c;
    kvt_status_t st;
    DECODE("commit", true, &c,
           kvt_proto_commit_req_decode(body, len, a->k, a->u, a->cap, &c, errlen ? err : NULL,
                                       errlen));
    check_str(c.model, body, len, true);
    check_str(c.lora, body, len, false);
    CHECK(c.n >= 1 && c.n <= a->cap);
    untouched(a->k, c.n, a->cap, sizeof(*a->k));
    untouched(a->u, c.n, a->cap, sizeof(*a->u));
    kvt_proto_commit_t again;
    CHECK(kvt_proto_commit_req_decode(body, len, a->k, a->u, c.n - 1, &again, NULL, 0) ==
          KVT_ERR_TOO_BIG);
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_commit_req_encode(&wr, 7, &c, a->k, a->u) == KVT_OK);
    check_frame(KVT_PROTO_OP_COMMIT, 0, body, len);
}

static void fuzz_block_key(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_block_key_t k;
    kvt_status_t st;
    DECODE("block_key", false, &k,
           kvt_proto_block_key_req_decode(body, len, &k, errlen ? err : NULL, errlen));
    check_str(k.model, body, len, true);
    check_str(k.lora, body, len, false);
    uint8_t op = len % 2 ? KVT_PROTO_OP_BLOCK_GET : KVT_PROTO_OP_BLOCK_DELETE;
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_block_key_req_encode(&wr, op, 7, &k) == KVT_OK);
    check_frame(op, 0, body, len);
}

static void fuzz_block_put(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_block_put_t p;
    kvt_status_t st;
    DECODE("block_put", false, &p,
           kvt_proto_block_put_req_decode(body, len, &p, errlen ? err : NULL, errlen));
    check_str(p.model, body, len, true);
    check_str(p.lora, body, len, false);
    CHECK(p.len >= 1 && p.data >= body && p.data + p.len == body + len); /* the block ends it */
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_block_put_req_encode(&wr, 7, &p) == KVT_OK);
    check_frame(KVT_PROTO_OP_BLOCK_PUT, 0, body, len);
}

static void fuzz_attach(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_attach_ans_t at;
    kvt_status_t st;
    DECODE("attach answer", false, &at,
           kvt_proto_attach_ans_decode(body, len, &at, errlen ? err : NULL, errlen));
    check_str(at.arena_path, body, len, false);
    /* every slot inside the mapping */
    CHECK(at.block_bytes >= 1 && at.slot_bytes >= at.block_bytes);
    CHECK(at.slot_off <= at.map_bytes);
    CHECK((uint64_t)at.nslots * at.slot_bytes <= at.map_bytes - at.slot_off);
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_attach_ans_encode(&wr, 7, &at) == KVT_OK);
    check_frame(KVT_PROTO_OP_ATTACH, KVT_PROTO_F_RESPONSE, body, len);
}

static void fuzz_lookup(const uint8_t *body, size_t len, arrays_t *a)
{
    uint32_t hit;
    kvt_status_t st;
    DECODE(
        "lookup answer", true, &hit,
        kvt_proto_lookup_ans_decode(body, len, a->loc, a->cap, &hit, errlen ? err : NULL, errlen));
    CHECK(hit <= a->cap);
    for (uint32_t i = 0; i < hit; i++)
        CHECK(a->loc[i] == KVT_PROTO_LOC_RAM || a->loc[i] == KVT_PROTO_LOC_DISK);
    untouched(a->loc, hit, a->cap, 1);
    uint32_t again;
    if (hit > 0)
        CHECK(kvt_proto_lookup_ans_decode(body, len, a->loc, hit - 1, &again, NULL, 0) ==
              KVT_ERR_TOO_BIG);
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_lookup_ans_encode(&wr, 7, a->loc, hit) == KVT_OK);
    check_frame(KVT_PROTO_OP_LOOKUP, KVT_PROTO_F_RESPONSE, body, len);
}

static void fuzz_reserve(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_reserve_ans_t r;
    kvt_status_t st;
    DECODE("reserve answer", true, &r,
           kvt_proto_reserve_ans_decode(body, len, a->u, a->cap, a->ev, a->cap, &r,
                                        errlen ? err : NULL, errlen));
    CHECK(r.n <= a->cap && r.nevicted <= a->cap);
    untouched(a->u, r.n, a->cap, sizeof(*a->u));
    untouched(a->ev, r.nevicted, a->cap, sizeof(*a->ev));
    kvt_proto_reserve_ans_t again;
    if (r.n > 0)
        CHECK(kvt_proto_reserve_ans_decode(body, len, a->u, r.n - 1, a->ev, a->cap, &again, NULL,
                                           0) == KVT_ERR_TOO_BIG);
    if (r.nevicted > 0)
        CHECK(kvt_proto_reserve_ans_decode(body, len, a->u, a->cap, a->ev, r.nevicted - 1, &again,
                                           NULL, 0) == KVT_ERR_TOO_BIG);
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_reserve_ans_encode(&wr, 7, a->u, r.n, a->ev, r.nevicted) == KVT_OK);
    check_frame(KVT_PROTO_OP_RESERVE, KVT_PROTO_F_RESPONSE, body, len);
}

static void fuzz_pin(const uint8_t *body, size_t len, arrays_t *a)
{
    uint32_t n;
    kvt_status_t st;
    DECODE("pin answer", true, &n,
           kvt_proto_pin_ans_decode(body, len, a->pins, a->cap, &n, errlen ? err : NULL, errlen));
    CHECK(n <= a->cap);
    untouched(a->pins, n, a->cap, sizeof(*a->pins));
    uint32_t again;
    if (n > 0)
        CHECK(kvt_proto_pin_ans_decode(body, len, a->pins, n - 1, &again, NULL, 0) ==
              KVT_ERR_TOO_BIG);
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_pin_ans_encode(&wr, 7, a->pins, n) == KVT_OK);
    check_frame(KVT_PROTO_OP_PIN, KVT_PROTO_F_RESPONSE, body, len);
}

static void fuzz_count(const uint8_t *body, size_t len, arrays_t *a)
{
    uint32_t count;
    kvt_status_t st;
    DECODE("count answer", false, &count,
           kvt_proto_count_ans_decode(body, len, &count, errlen ? err : NULL, errlen));
    static const uint8_t ops[] = {KVT_PROTO_OP_COMMIT, KVT_PROTO_OP_UNPIN, KVT_PROTO_OP_PREFETCH};
    uint8_t op = ops[count % 3];
    kvt_proto_wr_reset(&wr);
    CHECK(kvt_proto_count_ans_encode(&wr, op, 7, count) == KVT_OK);
    check_frame(op, KVT_PROTO_F_RESPONSE, body, len);
}

static void fuzz_small(const uint8_t *body, size_t len)
{
    char err[256] = "";
    kvt_status_t st = kvt_proto_block_get_ans_decode(body, len, err, sizeof(err));
    CHECK((st == KVT_OK) == (len > 0));
    if (st == KVT_OK) {
        kvt_proto_wr_reset(&wr);
        CHECK(kvt_proto_block_get_ans_encode(&wr, 7, body, len) == KVT_OK);
        check_frame(KVT_PROTO_OP_BLOCK_GET, KVT_PROTO_F_RESPONSE, body, len);
    } else {
        check_err(st, false, err, "block_get answer");
    }
    /* empty bodies: the ATTACH request, the BLOCK_PUT and BLOCK_DELETE answers */
    static const uint8_t ops[] = {KVT_PROTO_OP_ATTACH, KVT_PROTO_OP_BLOCK_PUT,
                                  KVT_PROTO_OP_BLOCK_DELETE};
    static const char *names[] = {"attach", "block_put", "block_delete"};
    for (int i = 0; i < 3; i++) {
        err[0] = '\0';
        st = kvt_proto_empty_decode(ops[i], len, err, sizeof(err));
        CHECK((st == KVT_OK) == (len == 0));
        if (st != KVT_OK)
            check_err(st, false, err, names[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    arrays_t a;
    if (size > 0 && data[0] < 0x40) {
        a.cap = data[0];
        data++;
        size--;
    } else {
        a.cap = (uint32_t)(size < UINT32_MAX ? size : UINT32_MAX);
    }
    /* Exact-size copies: one byte past the body, or one entry past the capacity, is a heap
     * overflow ASan reports. */
    uint8_t *body = fuzz_copy(data, size);
    CHECK(body != NULL);
    a.k = alloc_n(a.cap, sizeof(*a.k));
    a.ev = alloc_n(a.cap, sizeof(*a.ev));
    a.u = alloc_n(a.cap, sizeof(*a.u));
    a.loc = alloc_n(a.cap, 1);
    a.pins = alloc_n(a.cap, sizeof(*a.pins));

    fuzz_keys(body, size, &a);
    fuzz_commit(body, size, &a);
    fuzz_block_key(body, size, &a);
    fuzz_block_put(body, size, &a);
    fuzz_attach(body, size, &a);
    fuzz_lookup(body, size, &a);
    fuzz_reserve(body, size, &a);
    fuzz_pin(body, size, &a);
    fuzz_count(body, size, &a);
    fuzz_small(body, size);

    free(a.k);
    free(a.ev);
    free(a.u);
    free(a.loc);
    free(a.pins);
    free(body);
    return 0;
}
