/*
 * libFuzzer target for the transfer's decoders (proto/proto_xfer.c).
 *
 * Input: an optional first byte below 0x40, the capacity the caller gives
 * (keys, lens, pins, slots, flags, list entries; else the body's length,
 * more than any count can need), then a frame body. Every decoder runs on the
 * same body, copied to an exactly-sized heap buffer, with output arrays of
 * exactly that capacity, so ASan reports a read past the body or a write past
 * the capacity. Invariants:
 *  - a refused body gives KVT_ERR_INVAL or KVT_ERR_TOO_BIG, one line of text
 *    that starts with the decoder's name, in lowercase, without a trailing
 *    period, the same status without room for text, and leaves every output
 *    as it was;
 *  - a decoded body keeps the protocol's rules (checked again here), its
 *    counts fit the capacity (and one less is KVT_ERR_TOO_BIG), and it
 *    re-encodes to exactly the same body behind a header with the opcode,
 *    flags and req_id asked for.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvt_proto_wr_t wr; /* reused across inputs: the fuzzer runs one thread */

/* The caller's arrays, exactly @cap entries each; filled with a pattern before each call. */
typedef struct arrays {
    uint32_t cap;
    uint64_t *k, *k2;
    uint32_t *u;
    uint8_t *flags;
    kvt_proto_xfer_pinned_t *pins;
    kvt_proto_xfer_landed_t *landed;
    kvt_proto_xfer_failed_t *failed;
} arrays_t;

static void *alloc_n(size_t n, size_t size)
{
    void *p = malloc(n > 0 ? n * size : 1);
    CHECK(p != NULL);
    return p;
}

#define ALL_ARRAYS(X)                                                                              \
    X(k)                                                                                           \
    X(k2) X(u) X(flags) X(pins) X(landed) X(failed)

static void fill(arrays_t *a)
{
#define FILL(f) memset(a->f, 0xA5, a->cap * sizeof(*a->f));
    ALL_ARRAYS(FILL)
#undef FILL
}

/* Every byte of every array still holds the pattern. */
static void untouched_all(const arrays_t *a)
{
#define SAME(f)                                                                                    \
    for (size_t i = 0; i < a->cap * sizeof(*a->f); i++)                                            \
        CHECK(((const uint8_t *)a->f)[i] == 0xA5);
    ALL_ARRAYS(SAME)
#undef SAME
}

/* A refusal's text: "@what: ...", one lowercase line, no trailing period. */
static void check_err(kvt_status_t st, const char *err, const char *what)
{
    CHECK(st == KVT_ERR_INVAL || st == KVT_ERR_TOO_BIG);
    size_t wl = strlen(what), el = strlen(err);
    CHECK(strncmp(err, what, wl) == 0 && err[wl] == ':' && err[wl + 1] == ' ' && el > wl + 2);
    CHECK(err[0] >= 'a' && err[0] <= 'z');
    CHECK(strchr(err, '\n') == NULL && err[el - 1] != '.');
}

/* The frame just encoded into wr has @op, @flags, req_id 7 and @body as its body. */
static void check_frame(kvt_status_t st, uint8_t op, uint16_t flags, const uint8_t *body,
                        size_t len)
{
    kvt_proto_hdr_t h;
    CHECK(st == KVT_OK);
    CHECK(wr.len == KVT_PROTO_HDR_SIZE + len);
    CHECK(kvt_proto_hdr_decode(wr.buf, KVT_PROTO_MAX_BODY_LIMIT, &h) == KVT_OK);
    CHECK(h.op == op && h.flags == flags && h.req_id == 7 && h.body_len == len);
    CHECK(len == 0 || memcmp(wr.buf + KVT_PROTO_HDR_SIZE, body, len) == 0);
    kvt_proto_wr_reset(&wr);
}

static void check_str(kvt_proto_str_t s, const uint8_t *body, size_t len, bool nonempty)
{
    CHECK(s.len <= KVT_PROTO_MAX_STR && (!nonempty || s.len > 0));
    if (s.len > 0) {
        const uint8_t *p = (const uint8_t *)s.p;
        CHECK(p >= body && s.len <= len && (size_t)(p - body) <= len - s.len);
        CHECK(memchr(p, '\0', s.len) == NULL);
    }
}

/*
 * Runs decoder call @CALL (which writes status `st` given `cap`, `err` and
 * `errlen`) with the full capacity, with and without room for text; on
 * refusal checks the text and that *@OUT and the arrays are as they were,
 * then returns.
 */
#define DECODE(WHAT, OUT, CALL)                                                                    \
    uint32_t cap = a->cap;                                                                         \
    char err[256] = "";                                                                            \
    size_t errlen = sizeof(err);                                                                   \
    memset((OUT), 0x5A, sizeof(*(OUT)));                                                           \
    fill(a);                                                                                       \
    kvt_status_t st = (CALL);                                                                      \
    if (st != KVT_OK) {                                                                            \
        check_err(st, err, (WHAT));                                                                \
        uint8_t pat[sizeof(*(OUT))];                                                               \
        memset(pat, 0x5A, sizeof(pat));                                                            \
        CHECK(memcmp((OUT), pat, sizeof(pat)) == 0);                                               \
        untouched_all(a);                                                                          \
        errlen = 0;                                                                                \
        CHECK((CALL) == st);                                                                       \
        return;                                                                                    \
    }

/* With capacity @n - 1, the decoder @CALL refuses with KVT_ERR_TOO_BIG. */
#define ONE_LESS(N, CALL)                                                                          \
    do {                                                                                           \
        cap = (N)-1;                                                                               \
        errlen = 0;                                                                                \
        CHECK((CALL) == KVT_ERR_TOO_BIG);                                                          \
    } while (0)

static void fuzz_hello(const uint8_t *body, size_t len, arrays_t *a)
{
    uint64_t expect;
    DECODE("xfer_hello", &expect,
           kvt_proto_xfer_hello_req_decode(body, len, &expect, errlen ? err : NULL, errlen));
    (void)cap;
    check_frame(kvt_proto_xfer_hello_req_encode(&wr, 7, expect), KVT_PROTO_OP_XFER_HELLO, 0, body,
                len);
}

static void fuzz_hello_ans(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_xfer_hello_ans_t h;
    DECODE("xfer_hello answer", &h,
           kvt_proto_xfer_hello_ans_decode(body, len, &h, errlen ? err : NULL, errlen));
    (void)cap;
    CHECK(h.incarnation != 0 && h.slot_bytes >= 1 && h.nslots >= 1);
    CHECK(h.base - 1 <= UINT64_MAX - (uint64_t)h.nslots * h.slot_bytes || h.base == 0);
    CHECK(h.addr_len >= 1 && h.addr_len <= KVT_PROTO_XFER_MAX_BLOB && h.addr >= body);
    CHECK(h.rkey_len >= 1 && h.rkey_len <= KVT_PROTO_XFER_MAX_BLOB);
    CHECK(h.host.len <= KVT_PROTO_MAX_STR && h.unix_path.len <= KVT_PROTO_MAX_STR);
    CHECK(h.unix_path.len == 0 || memchr(h.unix_path.p, '\0', h.unix_path.len) == NULL);
    CHECK(h.unix_path.p + h.unix_path.len == (const char *)body + len); /* unix_path ends it */
    check_frame(kvt_proto_xfer_hello_ans_encode(&wr, 7, &h), KVT_PROTO_OP_XFER_HELLO,
                KVT_PROTO_F_RESPONSE, body, len);
}

static void check_keys_head(const kvt_proto_xfer_keys_t *k, const uint8_t *body, size_t len,
                            uint32_t cap)
{
    CHECK(k->incarnation != 0 && k->lease_ms <= KVT_PROTO_XFER_MAX_LEASE_MS);
    CHECK(k->n >= 1 && k->n <= cap && k->n <= KVT_PROTO_XFER_MAX_KEYS);
    check_str(k->model, body, len, true);
    check_str(k->lora, body, len, false);
}

static void fuzz_pin(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_xfer_keys_t k, again;
    DECODE("xfer_pin", &k,
           kvt_proto_xfer_pin_req_decode(body, len, a->k, cap, &k, errlen ? err : NULL, errlen));
    check_keys_head(&k, body, len, cap);
    check_frame(kvt_proto_xfer_pin_req_encode(&wr, 7, &k, a->k), KVT_PROTO_OP_XFER_PIN, 0, body,
                len);
    ONE_LESS(k.n, kvt_proto_xfer_pin_req_decode(body, len, a->k, cap, &again, NULL, 0));
}

static void fuzz_reserve(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_xfer_keys_t k, again;
    DECODE("xfer_reserve", &k,
           kvt_proto_xfer_reserve_req_decode(body, len, a->k, a->u, cap, &k, errlen ? err : NULL,
                                             errlen));
    check_keys_head(&k, body, len, cap);
    for (uint32_t i = 0; i < k.n; i++)
        CHECK(a->u[i] >= 1);
    check_frame(kvt_proto_xfer_reserve_req_encode(&wr, 7, &k, a->k, a->u),
                KVT_PROTO_OP_XFER_RESERVE, 0, body, len);
    ONE_LESS(k.n, kvt_proto_xfer_reserve_req_decode(body, len, a->k, a->u, cap, &again, NULL, 0));
}

static void fuzz_pin_ans(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_xfer_slots_ans_t s, again;
    DECODE("xfer_pin answer", &s,
           kvt_proto_xfer_pin_ans_decode(body, len, a->pins, cap, &s, errlen ? err : NULL, errlen));
    CHECK(s.n >= 1 && s.n <= cap);
    for (uint32_t i = 0; i < s.n; i++) {
        const kvt_proto_xfer_pinned_t *p = &a->pins[i];
        if (p->slot == KVT_PROTO_SLOT_NONE)
            CHECK(p->len == 0 && p->sum == 0);
        else
            CHECK(p->len >= 1 && s.lease != 0);
    }
    check_frame(kvt_proto_xfer_pin_ans_encode(&wr, 7, &s, a->pins), KVT_PROTO_OP_XFER_PIN,
                KVT_PROTO_F_RESPONSE, body, len);
    ONE_LESS(s.n, kvt_proto_xfer_pin_ans_decode(body, len, a->pins, cap, &again, NULL, 0));
}

static void fuzz_reserve_ans(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_xfer_slots_ans_t s, again;
    DECODE(
        "xfer_reserve answer", &s,
        kvt_proto_xfer_reserve_ans_decode(body, len, a->u, cap, &s, errlen ? err : NULL, errlen));
    CHECK(s.n >= 1 && s.n <= cap);
    for (uint32_t i = 0; i < s.n; i++)
        if (a->u[i] != KVT_PROTO_SLOT_NONE && a->u[i] != KVT_PROTO_XFER_SLOT_HELD)
            CHECK(s.lease != 0);
    check_frame(kvt_proto_xfer_reserve_ans_encode(&wr, 7, &s, a->u), KVT_PROTO_OP_XFER_RESERVE,
                KVT_PROTO_F_RESPONSE, body, len);
    ONE_LESS(s.n, kvt_proto_xfer_reserve_ans_decode(body, len, a->u, cap, &again, NULL, 0));
}

static void fuzz_lease(const uint8_t *body, size_t len, arrays_t *a, uint8_t op)
{
    kvt_proto_xfer_lease_t l;
    DECODE(op == KVT_PROTO_OP_XFER_RENEW ? "xfer_renew" : "xfer_release", &l,
           kvt_proto_xfer_lease_req_decode(op, body, len, &l, errlen ? err : NULL, errlen));
    (void)cap;
    CHECK(l.incarnation != 0 && l.lease != 0 && l.lease_ms <= KVT_PROTO_XFER_MAX_LEASE_MS);
    CHECK(op == KVT_PROTO_OP_XFER_RENEW || l.lease_ms == 0);
    check_frame(kvt_proto_xfer_lease_req_encode(&wr, op, 7, &l), op, 0, body, len);
}

static void fuzz_commit(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_xfer_commit_t c, again;
    DECODE("xfer_commit", &c,
           kvt_proto_xfer_commit_req_decode(body, len, a->landed, cap, &c, errlen ? err : NULL,
                                            errlen));
    CHECK(c.incarnation != 0 && c.lease != 0 && c.n >= 1 && c.n <= cap);
    check_frame(kvt_proto_xfer_commit_req_encode(&wr, 7, &c, a->landed), KVT_PROTO_OP_XFER_COMMIT,
                0, body, len);
    ONE_LESS(c.n, kvt_proto_xfer_commit_req_decode(body, len, a->landed, cap, &again, NULL, 0));
}

static void fuzz_commit_ans(const uint8_t *body, size_t len, arrays_t *a)
{
    uint32_t n, again;
    DECODE("xfer_commit answer", &n,
           kvt_proto_xfer_commit_ans_decode(body, len, a->flags, cap, &n, errlen ? err : NULL,
                                            errlen));
    CHECK(n >= 1 && n <= cap);
    for (uint32_t i = 0; i < n; i++)
        CHECK(a->flags[i] <= 1);
    check_frame(kvt_proto_xfer_commit_ans_encode(&wr, 7, a->flags, n), KVT_PROTO_OP_XFER_COMMIT,
                KVT_PROTO_F_RESPONSE, body, len);
    ONE_LESS(n, kvt_proto_xfer_commit_ans_decode(body, len, a->flags, cap, &again, NULL, 0));
}

static void fuzz_transfer(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_transfer_req_t t, again;
    DECODE("transfer", &t,
           kvt_proto_transfer_req_decode(body, len, a->k, cap, &t, errlen ? err : NULL, errlen));
    check_str(t.peer, body, len, true);
    check_str(t.model, body, len, true);
    check_str(t.lora, body, len, false);
    CHECK(t.direction <= KVT_PROTO_XFER_PUSH && t.timeout_ms <= KVT_PROTO_XFER_MAX_TIMEOUT_MS);
    CHECK(t.flags == 0 || (t.flags == KVT_PROTO_XFER_STREAM && t.direction == KVT_PROTO_XFER_PUSH));
    CHECK(t.n >= 1 && t.n <= cap);
    check_frame(kvt_proto_transfer_req_encode(&wr, 7, &t, a->k), KVT_PROTO_OP_TRANSFER, 0, body,
                len);
    ONE_LESS(t.n, kvt_proto_transfer_req_decode(body, len, a->k, cap, &again, NULL, 0));
}

static void fuzz_transfer_ans(const uint8_t *body, size_t len, arrays_t *a)
{
    kvt_proto_transfer_ans_t t, again;
    DECODE("transfer answer", &t,
           kvt_proto_transfer_ans_decode(body, len, a->k, a->k2, a->failed, cap, &t,
                                         errlen ? err : NULL, errlen));
    uint64_t total = (uint64_t)t.ntransferred + t.nmissing + t.nfailed;
    CHECK(total >= 1 && total <= KVT_PROTO_XFER_MAX_KEYS);
    CHECK(t.ntransferred <= cap && t.nmissing <= cap && t.nfailed <= cap);
    CHECK(t.transferred == a->k && t.missing == a->k2 && t.failed == a->failed);
    for (uint32_t i = 0; i < t.nfailed; i++)
        CHECK(kvt_proto_xfer_reason_name(t.failed[i].reason) != NULL);
    check_frame(kvt_proto_transfer_ans_encode(&wr, 7, &t), KVT_PROTO_OP_TRANSFER,
                KVT_PROTO_F_RESPONSE, body, len);
    uint32_t most = t.ntransferred > t.nmissing ? t.ntransferred : t.nmissing;
    most = most > t.nfailed ? most : t.nfailed;
    ONE_LESS(most, kvt_proto_transfer_ans_decode(body, len, a->k, a->k2, a->failed, cap, &again,
                                                 NULL, 0));
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
#define ALLOC(f) a.f = alloc_n(a.cap, sizeof(*a.f));
    ALL_ARRAYS(ALLOC)
#undef ALLOC

    fuzz_hello(body, size, &a);
    fuzz_hello_ans(body, size, &a);
    fuzz_pin(body, size, &a);
    fuzz_reserve(body, size, &a);
    fuzz_pin_ans(body, size, &a);
    fuzz_reserve_ans(body, size, &a);
    fuzz_lease(body, size, &a, KVT_PROTO_OP_XFER_RENEW);
    fuzz_lease(body, size, &a, KVT_PROTO_OP_XFER_RELEASE);
    fuzz_commit(body, size, &a);
    fuzz_commit_ans(body, size, &a);
    fuzz_transfer(body, size, &a);
    fuzz_transfer_ans(body, size, &a);

#define FREE(f) free(a.f);
    ALL_ARRAYS(FREE)
#undef FREE
    free(body);
    return 0;
}
