/*
 * proto/proto_xfer.c: the transfer's frames (proto_xfer.h, docs/protocol.md "Transfer").
 *
 * As in proto_tier.c, every decoder checks the whole body first and remembers
 * where its arrays are, then copies them out, so a refused body leaves every
 * output as it was. Encoders check what the decoders check before they write
 * a byte: a frame the codec writes is one it reads back.
 */
#include "proto/proto_xfer.h"
#include "common/hostport.h"
#include "proto/proto_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- reasons -------------------------------------------------------------------------------- */

static const char *const reason_names[KVT_PROTO_XFER_FAIL_MAX + 1] = {
    [KVT_PROTO_XFER_FAIL_PEER_DOWN] = "peer_down",
    [KVT_PROTO_XFER_FAIL_PEER_RESTARTED] = "peer_restarted",
    [KVT_PROTO_XFER_FAIL_CHECKSUM] = "checksum",
    [KVT_PROTO_XFER_FAIL_TIMEOUT] = "timeout",
    [KVT_PROTO_XFER_FAIL_NO_ROOM] = "no_room",
    [KVT_PROTO_XFER_FAIL_EVICTED] = "evicted",
    [KVT_PROTO_XFER_FAIL_ERROR] = "error",
};

const char *kvt_proto_xfer_reason_name(uint8_t reason)
{
    return reason <= KVT_PROTO_XFER_FAIL_MAX ? reason_names[reason] : NULL;
}

uint8_t kvt_proto_xfer_reason_parse(const char *name, size_t len)
{
    for (uint8_t r = 1; r <= KVT_PROTO_XFER_FAIL_MAX; r++)
        if (strlen(reason_names[r]) == len && memcmp(reason_names[r], name, len) == 0)
            return r;
    return 0;
}

/* ---- reading -------------------------------------------------------------------------------- */

/* The capacity a decoder uses: the caller's, never more than a frame may carry. */
static uint32_t cap_keys(uint32_t max)
{
    return max < KVT_PROTO_XFER_MAX_KEYS ? max : KVT_PROTO_XFER_MAX_KEYS;
}

/* Reads u64 @field; @nonzero refuses 0. */
static kvt_status_t rd_u64(kvt_proto_rd_t *r, const char *what, const char *field, bool nonzero,
                           uint64_t *v_p, char *err, size_t errlen)
{
    kvt_status_t st = proto_need(r, 8, what, field, err, errlen);
    if (st != KVT_OK)
        return st;
    uint64_t v = kvt_proto_rd_u64(r);
    if (v == 0 && nonzero)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s is 0", what, field);
    *v_p = v;
    return KVT_OK;
}

/* Reads u32 @field, at most @max. */
static kvt_status_t rd_u32_max(kvt_proto_rd_t *r, const char *what, const char *field, uint32_t max,
                               uint32_t *v_p, char *err, size_t errlen)
{
    kvt_status_t st = proto_need(r, 4, what, field, err, errlen);
    if (st != KVT_OK)
        return st;
    uint32_t v = kvt_proto_rd_u32(r);
    if (v > max)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s is %" PRIu32 ", over %" PRIu32, what,
                          field, v, max);
    *v_p = v;
    return KVT_OK;
}

/* Reads a blob: u32 length 1..KVT_PROTO_XFER_MAX_BLOB (@field), then its bytes (@items). */
static kvt_status_t rd_blob(kvt_proto_rd_t *r, const char *what, const char *field,
                            const char *items, uint32_t *len_p, const uint8_t **p_p, char *err,
                            size_t errlen)
{
    kvt_status_t st = proto_need(r, 4, what, field, err, errlen);
    if (st != KVT_OK)
        return st;
    kvt_proto_rd_t peek = *r;
    uint32_t len = kvt_proto_rd_u32(&peek);
    if (len > KVT_PROTO_XFER_MAX_BLOB) /* the protocol's limit, not a capacity: 400 */
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s is %" PRIu32 ", over %u", what, field,
                          len, KVT_PROTO_XFER_MAX_BLOB);
    return proto_rd_count(r, what, field, true, UINT32_MAX, 1, items, len_p, p_p, err, errlen);
}

/* The u32 count n (1..@max, capped) of @what's @width-byte entries, and where they are. */
static kvt_status_t rd_entries(kvt_proto_rd_t *r, const char *what, uint32_t max, size_t width,
                               const char *items, uint32_t *n_p, const uint8_t **at_p, char *err,
                               size_t errlen)
{
    return proto_rd_count(r, what, "n", true, cap_keys(max), width, items, n_p, at_p, err, errlen);
}

/* ---- opcode checks for encoders ------------------------------------------------------------- */

/* A count an encoder takes: 1..KVT_PROTO_XFER_MAX_KEYS with its array. */
static kvt_status_t enc_count(uint32_t n, const void *arr)
{
    if (n == 0 || arr == NULL)
        return KVT_ERR_INVAL;
    return n > KVT_PROTO_XFER_MAX_KEYS ? KVT_ERR_TOO_BIG : KVT_OK;
}

/* ---- XFER_HELLO ----------------------------------------------------------------------------- */

kvt_status_t kvt_proto_xfer_hello_req_encode(kvt_proto_wr_t *w, uint64_t req_id, uint64_t expect)
{
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_XFER_HELLO, 0, req_id);
    kvt_proto_wr_u64(w, expect);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_xfer_hello_req_decode(const uint8_t *body, size_t len, uint64_t *expect_p,
                                             char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    uint64_t expect = 0;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_u64(&r, "xfer_hello", "expect", false, &expect, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, "xfer_hello", "expect", err, errlen)) != KVT_OK)
        return st;
    *expect_p = expect;
    return KVT_OK;
}

/* KVT_OK when @h's numbers are ones a peer may use: every slot addressable. */
static kvt_status_t hello_geom(const kvt_proto_xfer_hello_ans_t *h, char *err, size_t errlen)
{
    const char *what = "xfer_hello answer";
    if (h->incarnation == 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: incarnation is 0", what);
    if (h->slot_bytes == 0 || h->nslots == 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s is 0", what,
                          h->slot_bytes == 0 ? "slot_bytes" : "nslots");
    uint64_t span = (uint64_t)h->nslots * h->slot_bytes; /* < 2^64: two u32 */
    if (h->base > UINT64_MAX - span + 1)                 /* the last slot may end at 2^64 exactly */
        return proto_fail(err, errlen, KVT_ERR_INVAL,
                          "%s: %" PRIu32 " slots of %" PRIu32 " bytes at base 0x%" PRIx64
                          " end past the address space",
                          what, h->nslots, h->slot_bytes, h->base);
    return KVT_OK;
}

static bool blob_ok(uint32_t len, const uint8_t *p)
{
    return len >= 1 && len <= KVT_PROTO_XFER_MAX_BLOB && p != NULL;
}

/* A str the decoder takes: 0..255 bytes, no NUL. */
static bool str_ok(kvt_proto_str_t s)
{
    return s.len <= KVT_PROTO_MAX_STR &&
           (s.len == 0 || (s.p != NULL && memchr(s.p, '\0', s.len) == NULL));
}

kvt_status_t kvt_proto_xfer_hello_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                             const kvt_proto_xfer_hello_ans_t *h)
{
    if (hello_geom(h, NULL, 0) != KVT_OK || !blob_ok(h->addr_len, h->addr) ||
        !blob_ok(h->rkey_len, h->rkey) || !str_ok(h->host) || !str_ok(h->unix_path))
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_XFER_HELLO, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u64(w, h->incarnation);
    kvt_proto_wr_u32(w, h->slot_bytes);
    kvt_proto_wr_u32(w, h->nslots);
    kvt_proto_wr_u64(w, h->base);
    kvt_proto_wr_u32(w, h->addr_len);
    kvt_proto_wr_raw(w, h->addr, h->addr_len);
    kvt_proto_wr_u32(w, h->rkey_len);
    kvt_proto_wr_raw(w, h->rkey, h->rkey_len);
    kvt_proto_wr_str(w, h->host.p, h->host.len);
    kvt_proto_wr_str(w, h->unix_path.p, h->unix_path.len);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_xfer_hello_ans_decode(const uint8_t *body, size_t len,
                                             kvt_proto_xfer_hello_ans_t *h_p, char *err,
                                             size_t errlen)
{
    const char *what = "xfer_hello answer";
    kvt_proto_rd_t r;
    kvt_proto_xfer_hello_ans_t h;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_need(&r, 24, what, "the arena (24 bytes)", err, errlen)) != KVT_OK)
        return st;
    h.incarnation = kvt_proto_rd_u64(&r);
    h.slot_bytes = kvt_proto_rd_u32(&r);
    h.nslots = kvt_proto_rd_u32(&r);
    h.base = kvt_proto_rd_u64(&r);
    if ((st = hello_geom(&h, err, errlen)) != KVT_OK ||
        (st = rd_blob(&r, what, "addr_len", "the worker address", &h.addr_len, &h.addr, err,
                      errlen)) != KVT_OK ||
        (st = rd_blob(&r, what, "rkey_len", "the rkey", &h.rkey_len, &h.rkey, err, errlen)) !=
            KVT_OK ||
        (st = proto_rd_name(&r, what, "host", false, &h.host, err, errlen)) != KVT_OK ||
        (st = proto_rd_name(&r, what, "unix_path", false, &h.unix_path, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "unix_path", err, errlen)) != KVT_OK)
        return st;
    *h_p = h;
    return KVT_OK;
}

/* ---- XFER_PIN and XFER_RESERVE requests ----------------------------------------------------- */

/* The head both requests share: incarnation, lease, model, lora, lease_ms. */
static kvt_status_t rd_keys_head(kvt_proto_rd_t *r, const char *what, kvt_proto_xfer_keys_t *k,
                                 char *err, size_t errlen)
{
    kvt_status_t st;
    if ((st = rd_u64(r, what, "incarnation", true, &k->incarnation, err, errlen)) != KVT_OK ||
        (st = rd_u64(r, what, "lease", false, &k->lease, err, errlen)) != KVT_OK ||
        (st = proto_rd_names(r, what, &k->model, &k->lora, err, errlen)) != KVT_OK)
        return st;
    return rd_u32_max(r, what, "lease_ms", KVT_PROTO_XFER_MAX_LEASE_MS, &k->lease_ms, err, errlen);
}

/* Begins an XFER_PIN or XFER_RESERVE (@op) request and writes its head and count, or returns
 * the error and writes nothing. */
static kvt_status_t put_keys_head(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                  const kvt_proto_xfer_keys_t *k, const uint64_t *keys,
                                  size_t *off_p)
{
    kvt_status_t st = enc_count(k->n, keys);
    if (st != KVT_OK)
        return st;
    if (k->incarnation == 0 || k->model.len == 0 || k->lease_ms > KVT_PROTO_XFER_MAX_LEASE_MS)
        return KVT_ERR_INVAL;
    *off_p = kvt_proto_wr_frame_begin(w, op, 0, req_id);
    kvt_proto_wr_u64(w, k->incarnation);
    kvt_proto_wr_u64(w, k->lease);
    proto_put_names(w, k->model, k->lora);
    kvt_proto_wr_u32(w, k->lease_ms);
    kvt_proto_wr_u32(w, k->n);
    proto_put_uints(w, keys, k->n, 8);
    return KVT_OK;
}

kvt_status_t kvt_proto_xfer_pin_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                           const kvt_proto_xfer_keys_t *k, const uint64_t *keys)
{
    size_t off = 0;
    kvt_status_t st = put_keys_head(w, KVT_PROTO_OP_XFER_PIN, req_id, k, keys, &off);
    return st == KVT_OK ? kvt_proto_wr_frame_end(w, off) : st;
}

kvt_status_t kvt_proto_xfer_pin_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                           uint32_t max_keys, kvt_proto_xfer_keys_t *k_p, char *err,
                                           size_t errlen)
{
    const char *what = "xfer_pin";
    kvt_proto_rd_t r;
    kvt_proto_xfer_keys_t k = {0};
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_keys_head(&r, what, &k, err, errlen)) != KVT_OK ||
        (st = rd_entries(&r, what, max_keys, 8, "the keys", &k.n, &at, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "the keys", err, errlen)) != KVT_OK)
        return st;
    proto_get_uints(keys, at, k.n, 8);
    *k_p = k;
    return KVT_OK;
}

kvt_status_t kvt_proto_xfer_reserve_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                               const kvt_proto_xfer_keys_t *k, const uint64_t *keys,
                                               const uint32_t *lens)
{
    kvt_status_t st = enc_count(k->n, lens);
    if (st != KVT_OK)
        return st;
    for (uint32_t i = 0; i < k->n; i++)
        if (lens[i] == 0)
            return KVT_ERR_INVAL;
    size_t off = 0;
    st = put_keys_head(w, KVT_PROTO_OP_XFER_RESERVE, req_id, k, keys, &off);
    if (st != KVT_OK)
        return st;
    proto_put_uints(w, lens, k->n, 4);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_xfer_reserve_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                               uint32_t *lens, uint32_t max_keys,
                                               kvt_proto_xfer_keys_t *k_p, char *err, size_t errlen)
{
    const char *what = "xfer_reserve";
    kvt_proto_rd_t r;
    kvt_proto_xfer_keys_t k = {0};
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_keys_head(&r, what, &k, err, errlen)) != KVT_OK ||
        (st = rd_entries(&r, what, max_keys, 12, "the keys and lens", &k.n, &at, err, errlen)) !=
            KVT_OK ||
        (st = proto_rd_end(&r, what, "the lens", err, errlen)) != KVT_OK)
        return st;
    kvt_proto_rd_t lr;
    kvt_proto_rd_init(&lr, at + (size_t)k.n * 8, (size_t)k.n * 4);
    for (uint32_t i = 0; i < k.n; i++)
        if (kvt_proto_rd_u32(&lr) == 0)
            return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: lens[%" PRIu32 "] is 0", what, i);
    proto_get_uints(keys, at, k.n, 8);
    proto_get_uints(lens, at + (size_t)k.n * 8, k.n, 4);
    *k_p = k;
    return KVT_OK;
}

/* ---- XFER_PIN and XFER_RESERVE answers ------------------------------------------------------ */

/* The whole of an XFER_PIN or XFER_RESERVE answer: the lease, then n >= 1 entries of @width
 * bytes (@items), nothing after; *@at_p is where the entries are. */
static kvt_status_t rd_slots_ans(const uint8_t *body, size_t len, const char *what, uint32_t max,
                                 size_t width, const char *items, kvt_proto_xfer_slots_ans_t *a,
                                 const uint8_t **at_p, char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_status_t st;
    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_u64(&r, what, "lease", false, &a->lease, err, errlen)) != KVT_OK ||
        (st = rd_entries(&r, what, max, width, items, &a->n, at_p, err, errlen)) != KVT_OK)
        return st;
    return proto_rd_end(&r, what, items, err, errlen);
}

/* Checks an XFER_PIN answer entry @p (number @i); @held_p is set when it holds a pin. */
static kvt_status_t pinned_ok(const kvt_proto_xfer_pinned_t *p, uint32_t i, bool *held_p, char *err,
                              size_t errlen)
{
    const char *what = "xfer_pin answer";
    if (p->slot == KVT_PROTO_SLOT_NONE) {
        if (p->len != 0 || p->sum != 0)
            return proto_fail(err, errlen, KVT_ERR_INVAL,
                              "%s: missing key %" PRIu32 " has a len or sum that is not 0", what,
                              i);
        return KVT_OK;
    }
    if (p->len == 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: len of key %" PRIu32 " is 0", what, i);
    *held_p = true;
    return KVT_OK;
}

/* A lease must be named when something is held under it. */
static kvt_status_t lease_ok(const char *what, uint64_t lease, bool held, char *err, size_t errlen)
{
    if (held && lease == 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: lease is 0 but slots are held", what);
    return KVT_OK;
}

kvt_status_t kvt_proto_xfer_pin_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                           const kvt_proto_xfer_slots_ans_t *a,
                                           const kvt_proto_xfer_pinned_t *pins)
{
    kvt_status_t st = enc_count(a->n, pins);
    if (st != KVT_OK)
        return st;
    bool held = false;
    for (uint32_t i = 0; i < a->n; i++)
        if (pinned_ok(&pins[i], i, &held, NULL, 0) != KVT_OK)
            return KVT_ERR_INVAL;
    if (lease_ok("", a->lease, held, NULL, 0) != KVT_OK)
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_XFER_PIN, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u64(w, a->lease);
    kvt_proto_wr_u32(w, a->n);
    if (kvt_proto_wr_reserve(w, (size_t)a->n * 16) == KVT_OK)
        for (uint32_t i = 0; i < a->n; i++) {
            kvt_proto_wr_u32(w, pins[i].slot);
            kvt_proto_wr_u32(w, pins[i].len);
            kvt_proto_wr_u64(w, pins[i].sum);
        }
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_xfer_pin_ans_decode(const uint8_t *body, size_t len,
                                           kvt_proto_xfer_pinned_t *pins, uint32_t max_pins,
                                           kvt_proto_xfer_slots_ans_t *a_p, char *err,
                                           size_t errlen)
{
    const char *what = "xfer_pin answer";
    kvt_proto_rd_t r;
    kvt_proto_xfer_slots_ans_t a = {0};
    const uint8_t *at = NULL;
    kvt_status_t st = rd_slots_ans(body, len, what, max_pins, 16, "the pins", &a, &at, err, errlen);
    if (st != KVT_OK)
        return st;
    bool held = false;
    kvt_proto_rd_init(&r, at, (size_t)a.n * 16);
    for (uint32_t i = 0; i < a.n; i++) {
        kvt_proto_xfer_pinned_t p;
        p.slot = kvt_proto_rd_u32(&r);
        p.len = kvt_proto_rd_u32(&r);
        p.sum = kvt_proto_rd_u64(&r);
        if ((st = pinned_ok(&p, i, &held, err, errlen)) != KVT_OK)
            return st;
    }
    if ((st = lease_ok(what, a.lease, held, err, errlen)) != KVT_OK)
        return st;
    kvt_proto_rd_init(&r, at, (size_t)a.n * 16);
    for (uint32_t i = 0; i < a.n; i++) {
        pins[i].slot = kvt_proto_rd_u32(&r);
        pins[i].len = kvt_proto_rd_u32(&r);
        pins[i].sum = kvt_proto_rd_u64(&r);
    }
    *a_p = a;
    return KVT_OK;
}

static bool slot_held(uint32_t slot)
{
    return slot != KVT_PROTO_SLOT_NONE && slot != KVT_PROTO_XFER_SLOT_HELD;
}

kvt_status_t kvt_proto_xfer_reserve_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                               const kvt_proto_xfer_slots_ans_t *a,
                                               const uint32_t *slots)
{
    kvt_status_t st = enc_count(a->n, slots);
    if (st != KVT_OK)
        return st;
    bool held = false;
    for (uint32_t i = 0; i < a->n; i++)
        held = held || slot_held(slots[i]);
    if (lease_ok("", a->lease, held, NULL, 0) != KVT_OK)
        return KVT_ERR_INVAL;
    size_t off =
        kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_XFER_RESERVE, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u64(w, a->lease);
    kvt_proto_wr_u32(w, a->n);
    proto_put_uints(w, slots, a->n, 4);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_xfer_reserve_ans_decode(const uint8_t *body, size_t len, uint32_t *slots,
                                               uint32_t max_slots, kvt_proto_xfer_slots_ans_t *a_p,
                                               char *err, size_t errlen)
{
    const char *what = "xfer_reserve answer";
    kvt_proto_rd_t r;
    kvt_proto_xfer_slots_ans_t a = {0};
    const uint8_t *at = NULL;
    kvt_status_t st =
        rd_slots_ans(body, len, what, max_slots, 4, "the slots", &a, &at, err, errlen);
    if (st != KVT_OK)
        return st;
    bool held = false;
    kvt_proto_rd_init(&r, at, (size_t)a.n * 4);
    for (uint32_t i = 0; i < a.n && !held; i++)
        held = slot_held(kvt_proto_rd_u32(&r));
    if ((st = lease_ok(what, a.lease, held, err, errlen)) != KVT_OK)
        return st;
    proto_get_uints(slots, at, a.n, 4);
    *a_p = a;
    return KVT_OK;
}

/* ---- XFER_RENEW and XFER_RELEASE requests --------------------------------------------------- */

kvt_status_t kvt_proto_xfer_lease_req_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                             const kvt_proto_xfer_lease_t *l)
{
    bool renew = op == KVT_PROTO_OP_XFER_RENEW;
    if ((!renew && op != KVT_PROTO_OP_XFER_RELEASE) || l->incarnation == 0 || l->lease == 0 ||
        l->lease_ms > (renew ? KVT_PROTO_XFER_MAX_LEASE_MS : 0))
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, op, 0, req_id);
    kvt_proto_wr_u64(w, l->incarnation);
    kvt_proto_wr_u64(w, l->lease);
    if (renew)
        kvt_proto_wr_u32(w, l->lease_ms);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_xfer_lease_req_decode(uint8_t op, const uint8_t *body, size_t len,
                                             kvt_proto_xfer_lease_t *l_p, char *err, size_t errlen)
{
    bool renew = op == KVT_PROTO_OP_XFER_RENEW;
    if (!renew && op != KVT_PROTO_OP_XFER_RELEASE)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "xfer_lease: opcode 0x%02x has no lease body",
                          (unsigned)op);
    const char *what = renew ? "xfer_renew" : "xfer_release";
    kvt_proto_rd_t r;
    kvt_proto_xfer_lease_t l = {0};
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_u64(&r, what, "incarnation", true, &l.incarnation, err, errlen)) != KVT_OK ||
        (st = rd_u64(&r, what, "lease", true, &l.lease, err, errlen)) != KVT_OK ||
        (renew && (st = rd_u32_max(&r, what, "lease_ms", KVT_PROTO_XFER_MAX_LEASE_MS, &l.lease_ms,
                                   err, errlen)) != KVT_OK) ||
        (st = proto_rd_end(&r, what, renew ? "lease_ms" : "lease", err, errlen)) != KVT_OK)
        return st;
    *l_p = l;
    return KVT_OK;
}

/* ---- XFER_COMMIT ---------------------------------------------------------------------------- */

kvt_status_t kvt_proto_xfer_commit_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                              const kvt_proto_xfer_commit_t *c,
                                              const kvt_proto_xfer_landed_t *landed)
{
    kvt_status_t st = enc_count(c->n, landed);
    if (st != KVT_OK)
        return st;
    if (c->incarnation == 0 || c->lease == 0)
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_XFER_COMMIT, 0, req_id);
    kvt_proto_wr_u64(w, c->incarnation);
    kvt_proto_wr_u64(w, c->lease);
    kvt_proto_wr_u32(w, c->n);
    if (kvt_proto_wr_reserve(w, (size_t)c->n * 17) == KVT_OK)
        for (uint32_t i = 0; i < c->n; i++) {
            kvt_proto_wr_u64(w, landed[i].key);
            kvt_proto_wr_u64(w, landed[i].sum);
            kvt_proto_wr_u8(w, landed[i].ok ? 1 : 0);
        }
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_xfer_commit_req_decode(const uint8_t *body, size_t len,
                                              kvt_proto_xfer_landed_t *landed, uint32_t max_keys,
                                              kvt_proto_xfer_commit_t *c_p, char *err,
                                              size_t errlen)
{
    const char *what = "xfer_commit";
    kvt_proto_rd_t r;
    kvt_proto_xfer_commit_t c = {0};
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_u64(&r, what, "incarnation", true, &c.incarnation, err, errlen)) != KVT_OK ||
        (st = rd_u64(&r, what, "lease", true, &c.lease, err, errlen)) != KVT_OK ||
        (st = rd_entries(&r, what, max_keys, 17, "the keys", &c.n, &at, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "the keys", err, errlen)) != KVT_OK)
        return st;
    for (uint32_t i = 0; i < c.n; i++) {
        uint8_t ok = at[(size_t)i * 17 + 16];
        if (ok > 1)
            return proto_fail(err, errlen, KVT_ERR_INVAL,
                              "%s: ok of key %" PRIu32 " must be 0 or 1, not %u", what, i,
                              (unsigned)ok);
    }
    kvt_proto_rd_init(&r, at, (size_t)c.n * 17);
    for (uint32_t i = 0; i < c.n; i++) {
        landed[i].key = kvt_proto_rd_u64(&r);
        landed[i].sum = kvt_proto_rd_u64(&r);
        landed[i].ok = kvt_proto_rd_u8(&r) == 1;
    }
    *c_p = c;
    return KVT_OK;
}

kvt_status_t kvt_proto_xfer_commit_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                              const uint8_t *visible, uint32_t n)
{
    kvt_status_t st = enc_count(n, visible);
    if (st != KVT_OK)
        return st;
    for (uint32_t i = 0; i < n; i++)
        if (visible[i] > 1)
            return KVT_ERR_INVAL;
    size_t off =
        kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_XFER_COMMIT, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u32(w, n);
    kvt_proto_wr_raw(w, visible, n);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_xfer_commit_ans_decode(const uint8_t *body, size_t len, uint8_t *visible,
                                              uint32_t max, uint32_t *n_p, char *err, size_t errlen)
{
    const char *what = "xfer_commit answer";
    kvt_proto_rd_t r;
    uint32_t n = 0;
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_entries(&r, what, max, 1, "the visible flags", &n, &at, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "the visible flags", err, errlen)) != KVT_OK)
        return st;
    for (uint32_t i = 0; i < n; i++)
        if (at[i] > 1)
            return proto_fail(err, errlen, KVT_ERR_INVAL,
                              "%s: visible[%" PRIu32 "] must be 0 or 1, not %u", what, i,
                              (unsigned)at[i]);
    memcpy(visible, at, n);
    *n_p = n;
    return KVT_OK;
}

/* ---- TRANSFER ------------------------------------------------------------------------------- */

/* KVT_OK when @peer is a "host:port" a sidecar can dial. */
static kvt_status_t peer_ok(kvt_proto_str_t peer, const char *what, char *err, size_t errlen)
{
    char text[KVT_PROTO_MAX_STR + 1], host[KVT_PROTO_MAX_STR + 1], why[128];
    uint16_t port;
    if (peer.len > 0)
        memcpy(text, peer.p, peer.len);
    text[peer.len] = '\0';
    if (kvt_hostport_split(text, host, sizeof(host), &port, false, why, sizeof(why)) != KVT_OK)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: peer: %s", what, why);
    return KVT_OK;
}

kvt_status_t kvt_proto_transfer_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                           const kvt_proto_transfer_req_t *t, const uint64_t *keys)
{
    kvt_status_t st = enc_count(t->n, keys);
    if (st != KVT_OK)
        return st;
    /* a str over 255 bytes or with a NUL byte: KVT_ERR_TOO_BIG, as kvt_proto_wr_str() says */
    if (t->peer.len > KVT_PROTO_MAX_STR ||
        (t->peer.len > 0 && memchr(t->peer.p, '\0', t->peer.len) != NULL))
        return KVT_ERR_TOO_BIG;
    if (t->model.len == 0 || t->direction > KVT_PROTO_XFER_PUSH ||
        (t->flags != 0 &&
         (t->flags != KVT_PROTO_XFER_STREAM || t->direction != KVT_PROTO_XFER_PUSH)) ||
        t->timeout_ms > KVT_PROTO_XFER_MAX_TIMEOUT_MS || peer_ok(t->peer, "", NULL, 0) != KVT_OK)
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_TRANSFER, 0, req_id);
    kvt_proto_wr_str(w, t->peer.p, t->peer.len);
    proto_put_names(w, t->model, t->lora);
    kvt_proto_wr_u8(w, t->direction);
    kvt_proto_wr_u8(w, t->flags);
    kvt_proto_wr_raw(w, "\0\0", 2);
    kvt_proto_wr_u32(w, t->timeout_ms);
    kvt_proto_wr_u32(w, t->n);
    proto_put_uints(w, keys, t->n, 8);
    return kvt_proto_wr_frame_end(w, off);
}

/* TRANSFER's u8 direction (0 | 1), u8 flags (KVT_PROTO_XFER_STREAM, with a push), u16 pad 0. */
static kvt_status_t rd_direction_flags(kvt_proto_rd_t *r, kvt_proto_transfer_req_t *t, char *err,
                                       size_t errlen)
{
    const char *what = "transfer";
    kvt_status_t st = proto_need(r, 4, what, "direction, flags and pad", err, errlen);
    if (st != KVT_OK)
        return st;
    t->direction = kvt_proto_rd_u8(r);
    t->flags = kvt_proto_rd_u8(r);
    uint16_t pad = kvt_proto_rd_u16(r);
    if (t->direction > KVT_PROTO_XFER_PUSH)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: direction must be 0 or 1, not %u", what,
                          t->direction);
    if (t->flags & ~KVT_PROTO_XFER_STREAM)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: flags 0x%02x has unknown bits", what,
                          t->flags);
    if (t->flags != 0 && t->direction != KVT_PROTO_XFER_PUSH)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: stream is for a push", what);
    if (pad != 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: pad is %u, not 0", what, pad);
    return KVT_OK;
}

kvt_status_t kvt_proto_transfer_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                           uint32_t max_keys, kvt_proto_transfer_req_t *t_p,
                                           char *err, size_t errlen)
{
    const char *what = "transfer";
    kvt_proto_rd_t r;
    kvt_proto_transfer_req_t t = {0};
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_rd_name(&r, what, "peer", true, &t.peer, err, errlen)) != KVT_OK ||
        (st = peer_ok(t.peer, what, err, errlen)) != KVT_OK ||
        (st = proto_rd_names(&r, what, &t.model, &t.lora, err, errlen)) != KVT_OK ||
        (st = rd_direction_flags(&r, &t, err, errlen)) != KVT_OK ||
        (st = rd_u32_max(&r, what, "timeout_ms", KVT_PROTO_XFER_MAX_TIMEOUT_MS, &t.timeout_ms, err,
                         errlen)) != KVT_OK ||
        (st = rd_entries(&r, what, max_keys, 8, "the keys", &t.n, &at, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "the keys", err, errlen)) != KVT_OK)
        return st;
    proto_get_uints(keys, at, t.n, 8);
    *t_p = t;
    return KVT_OK;
}

kvt_status_t kvt_proto_transfer_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                           const kvt_proto_transfer_ans_t *a)
{
    uint64_t total = (uint64_t)a->ntransferred + a->nmissing + a->nfailed;
    if (total == 0 || (a->ntransferred > 0 && a->transferred == NULL) ||
        (a->nmissing > 0 && a->missing == NULL) || (a->nfailed > 0 && a->failed == NULL))
        return KVT_ERR_INVAL;
    if (total > KVT_PROTO_XFER_MAX_KEYS)
        return KVT_ERR_TOO_BIG;
    for (uint32_t i = 0; i < a->nfailed; i++)
        if (kvt_proto_xfer_reason_name(a->failed[i].reason) == NULL)
            return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_TRANSFER, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u64(w, a->bytes);
    kvt_proto_wr_u64(w, a->ns);
    kvt_proto_wr_u32(w, a->ntransferred);
    proto_put_uints(w, a->transferred, a->ntransferred, 8);
    kvt_proto_wr_u32(w, a->nmissing);
    proto_put_uints(w, a->missing, a->nmissing, 8);
    kvt_proto_wr_u32(w, a->nfailed);
    if (kvt_proto_wr_reserve(w, (size_t)a->nfailed * 9) == KVT_OK)
        for (uint32_t i = 0; i < a->nfailed; i++) {
            kvt_proto_wr_u64(w, a->failed[i].key);
            kvt_proto_wr_u8(w, a->failed[i].reason);
        }
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_transfer_ans_decode(const uint8_t *body, size_t len, uint64_t *transferred,
                                           uint64_t *missing, kvt_proto_xfer_failed_t *failed,
                                           uint32_t max, kvt_proto_transfer_ans_t *a_p, char *err,
                                           size_t errlen)
{
    const char *what = "transfer answer";
    kvt_proto_rd_t r;
    kvt_proto_transfer_ans_t a = {0};
    const uint8_t *at_t = NULL, *at_m = NULL, *at_f = NULL;
    uint32_t cap = cap_keys(max);
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_need(&r, 16, what, "bytes and ns", err, errlen)) != KVT_OK)
        return st;
    a.bytes = kvt_proto_rd_u64(&r);
    a.ns = kvt_proto_rd_u64(&r);
    if ((st = proto_rd_count(&r, what, "ntransferred", false, cap, 8, "the transferred keys",
                             &a.ntransferred, &at_t, err, errlen)) != KVT_OK ||
        (st = proto_rd_count(&r, what, "nmissing", false, cap, 8, "the missing keys", &a.nmissing,
                             &at_m, err, errlen)) != KVT_OK ||
        (st = proto_rd_count(&r, what, "nfailed", false, cap, 9, "the failed keys", &a.nfailed,
                             &at_f, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "the failed keys", err, errlen)) != KVT_OK)
        return st;
    uint64_t total = (uint64_t)a.ntransferred + a.nmissing + a.nfailed;
    if (total == 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: no key in any list", what);
    if (total > KVT_PROTO_XFER_MAX_KEYS)
        return proto_fail(err, errlen, KVT_ERR_TOO_BIG, "%s: %" PRIu64 " keys, over %u", what,
                          total, KVT_PROTO_XFER_MAX_KEYS);
    for (uint32_t i = 0; i < a.nfailed; i++) {
        uint8_t reason = at_f[(size_t)i * 9 + 8];
        if (kvt_proto_xfer_reason_name(reason) == NULL)
            return proto_fail(err, errlen, KVT_ERR_INVAL,
                              "%s: reason of failed[%" PRIu32 "] is %u, not 1..%u", what, i,
                              (unsigned)reason, KVT_PROTO_XFER_FAIL_MAX);
    }
    proto_get_uints(transferred, at_t, a.ntransferred, 8);
    proto_get_uints(missing, at_m, a.nmissing, 8);
    kvt_proto_rd_init(&r, at_f, (size_t)a.nfailed * 9);
    for (uint32_t i = 0; i < a.nfailed; i++) {
        failed[i].key = kvt_proto_rd_u64(&r);
        failed[i].reason = kvt_proto_rd_u8(&r);
    }
    a.transferred = transferred;
    a.missing = missing;
    a.failed = failed;
    *a_p = a;
    return KVT_OK;
}
