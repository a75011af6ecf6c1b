/*
 * proto/proto_tier.c: the tier data plane's frames (proto_tier.h, docs/protocol.md "Tiers").
 *
 * Every decoder reads its body in two passes: the first checks every field
 * and remembers where the arrays are, the second copies them out, so a
 * refused body leaves every output as it was. The numbers go through the
 * reader and writer of proto.c; arrays of keys, slots and lengths are copied
 * in one piece on little-endian hosts, where the wire order is the host's.
 */
#include "proto/proto_tier.h"
#include "common/errtext.h"
#include "proto/proto_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- reading -------------------------------------------------------------------------------- */

/* model, lora and key: the head of the KEY and BLOCK_PUT bodies. */
static kvt_status_t rd_names_key(kvt_proto_rd_t *r, const char *what, kvt_proto_str_t *model,
                                 kvt_proto_str_t *lora, uint64_t *key, char *err, size_t errlen)
{
    kvt_status_t st = proto_rd_names(r, what, model, lora, err, errlen);
    if (st == KVT_OK)
        st = proto_need(r, 8, what, "key", err, errlen);
    if (st == KVT_OK)
        *key = kvt_proto_rd_u64(r);
    return st;
}

/* ---- opcodes -------------------------------------------------------------------------------- */

bool kvt_proto_op_keys(uint8_t op)
{
    switch (op) {
    case KVT_PROTO_OP_LOOKUP:
    case KVT_PROTO_OP_RESERVE:
    case KVT_PROTO_OP_PIN:
    case KVT_PROTO_OP_UNPIN:
    case KVT_PROTO_OP_PREFETCH: return true;
    }
    return false;
}

bool kvt_proto_op_engine_keys(uint8_t op)
{
    return kvt_proto_op_keys(op) || op == KVT_PROTO_OP_COMMIT || op == KVT_PROTO_OP_BLOCK_PUT ||
           op == KVT_PROTO_OP_BLOCK_GET || op == KVT_PROTO_OP_BLOCK_DELETE;
}

kvt_status_t kvt_proto_empty_decode(uint8_t op, size_t len, char *err, size_t errlen)
{
    if (len == 0)
        return KVT_OK;
    char name[24];
    const char *up = kvt_proto_op_name(op);
    size_t i = 0;
    for (; up[i] != '\0' && i < sizeof(name) - 1; i++)
        name[i] = (char)(up[i] >= 'A' && up[i] <= 'Z' ? up[i] - 'A' + 'a' : up[i]);
    name[i] = '\0';
    return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %zu byte%s in a body that must be empty",
                      name, len, len == 1 ? "" : "s");
}

/* ---- KEYS requests -------------------------------------------------------------------------- */

kvt_status_t kvt_proto_keys_req_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                       const kvt_proto_keys_t *k, const uint64_t *keys)
{
    if (!kvt_proto_op_keys(op) || k->model.len == 0 || k->n == 0 || keys == NULL)
        return KVT_ERR_INVAL;
    if (k->n > KVT_PROTO_MAX_BODY_LIMIT / 8)
        return KVT_ERR_TOO_BIG; /* before copying up to 32 GiB */
    size_t off = kvt_proto_wr_frame_begin(w, op, 0, req_id);
    proto_put_names(w, k->model, k->lora);
    kvt_proto_wr_u32(w, k->n);
    proto_put_uints(w, keys, k->n, 8);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_keys_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                       uint32_t max_keys, kvt_proto_keys_t *k_p, char *err,
                                       size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_keys_t k = {0};
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_rd_names(&r, "keys", &k.model, &k.lora, err, errlen)) != KVT_OK ||
        (st = proto_rd_count(&r, "keys", "n", true, max_keys, 8, "the keys", &k.n, &at, err,
                             errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, "keys", "the keys", err, errlen)) != KVT_OK)
        return st;
    proto_get_uints(keys, at, k.n, 8);
    *k_p = k;
    return KVT_OK;
}

/* ---- COMMIT request ------------------------------------------------------------------------- */

kvt_status_t kvt_proto_commit_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                         const kvt_proto_commit_t *c, const uint64_t *keys,
                                         const uint32_t *lens)
{
    if (c->model.len == 0 || c->n == 0 || keys == NULL)
        return KVT_ERR_INVAL;
    if (c->n > KVT_PROTO_MAX_BODY_LIMIT / 12)
        return KVT_ERR_TOO_BIG;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_COMMIT, 0, req_id);
    proto_put_names(w, c->model, c->lora);
    kvt_proto_wr_u8(w, c->ok ? 1 : 0);
    kvt_proto_wr_raw(w, "\0\0\0", 3);
    kvt_proto_wr_u32(w, c->n);
    proto_put_uints(w, keys, c->n, 8);
    proto_put_uints(w, lens, c->n, 4);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_commit_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                         uint32_t *lens, uint32_t max_keys, kvt_proto_commit_t *c_p,
                                         char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_commit_t c = {0};
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_rd_names(&r, "commit", &c.model, &c.lora, err, errlen)) != KVT_OK ||
        (st = proto_rd_flag_pad(&r, "commit", "ok", &c.ok, err, errlen)) != KVT_OK ||
        (st = proto_rd_count(&r, "commit", "n", true, max_keys, 12, "the keys and lens", &c.n, &at,
                             err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, "commit", "the lens", err, errlen)) != KVT_OK)
        return st;
    proto_get_uints(keys, at, c.n, 8);
    proto_get_uints(lens, at + (size_t)c.n * 8, c.n, 4);
    *c_p = c;
    return KVT_OK;
}

/* ---- KEY requests --------------------------------------------------------------------------- */

kvt_status_t kvt_proto_block_key_req_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                            const kvt_proto_block_key_t *k)
{
    if ((op != KVT_PROTO_OP_BLOCK_GET && op != KVT_PROTO_OP_BLOCK_DELETE) || k->model.len == 0)
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, op, 0, req_id);
    proto_put_names(w, k->model, k->lora);
    kvt_proto_wr_u64(w, k->key);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_block_key_req_decode(const uint8_t *body, size_t len,
                                            kvt_proto_block_key_t *k_p, char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_block_key_t k;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_names_key(&r, "block_key", &k.model, &k.lora, &k.key, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, "block_key", "the key", err, errlen)) != KVT_OK)
        return st;
    *k_p = k;
    return KVT_OK;
}

/* ---- BLOCK_PUT request ---------------------------------------------------------------------- */

kvt_status_t kvt_proto_block_put_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                            const kvt_proto_block_put_t *p)
{
    if (p->model.len == 0 || p->len == 0 || p->data == NULL)
        return KVT_ERR_INVAL;
    if (p->len > KVT_PROTO_MAX_BODY_LIMIT)
        return KVT_ERR_TOO_BIG;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_BLOCK_PUT, 0, req_id);
    proto_put_names(w, p->model, p->lora);
    kvt_proto_wr_u64(w, p->key);
    kvt_proto_wr_u8(w, p->durable ? 1 : 0);
    kvt_proto_wr_raw(w, "\0\0\0", 3);
    kvt_proto_wr_u32(w, p->len);
    kvt_proto_wr_raw(w, p->data, p->len);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_block_put_req_decode(const uint8_t *body, size_t len,
                                            kvt_proto_block_put_t *p_p, char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_block_put_t p;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = rd_names_key(&r, "block_put", &p.model, &p.lora, &p.key, err, errlen)) != KVT_OK ||
        (st = proto_rd_flag_pad(&r, "block_put", "durable", &p.durable, err, errlen)) != KVT_OK ||
        (st = proto_rd_count(&r, "block_put", "len", true, UINT32_MAX, 1, "the block", &p.len,
                             &p.data, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, "block_put", "the block", err, errlen)) != KVT_OK)
        return st;
    *p_p = p;
    return KVT_OK;
}

/* ---- ATTACH answer -------------------------------------------------------------------------- */

/* KVT_OK when every slot of @a lies inside its mapping. */
static kvt_status_t attach_geom(const kvt_proto_attach_ans_t *a, char *err, size_t errlen)
{
    const char *what = "attach answer";
    if (a->block_bytes == 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: block_bytes is 0", what);
    if (a->slot_bytes < a->block_bytes)
        return proto_fail(err, errlen, KVT_ERR_INVAL,
                          "%s: slot_bytes %" PRIu32 " is less than block_bytes %" PRIu32, what,
                          a->slot_bytes, a->block_bytes);
    uint64_t span = (uint64_t)a->nslots * a->slot_bytes; /* < 2^64: two u32 */
    if (a->slot_off > a->map_bytes || span > a->map_bytes - a->slot_off)
        return proto_fail(err, errlen, KVT_ERR_INVAL,
                          "%s: %" PRIu32 " slots of %" PRIu32 " bytes at slot_off %" PRIu64
                          " end past map_bytes %" PRIu64,
                          what, a->nslots, a->slot_bytes, a->slot_off, a->map_bytes);
    return KVT_OK;
}

kvt_status_t kvt_proto_attach_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                         const kvt_proto_attach_ans_t *a)
{
    if (attach_geom(a, NULL, 0) != KVT_OK)
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_ATTACH, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u64(w, a->map_bytes);
    kvt_proto_wr_u64(w, a->slot_off);
    kvt_proto_wr_u32(w, a->slot_bytes);
    kvt_proto_wr_u32(w, a->nslots);
    kvt_proto_wr_u32(w, a->block_bytes);
    kvt_proto_wr_u32(w, a->disk_slots);
    kvt_proto_wr_str(w, a->arena_path.p, a->arena_path.len);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_attach_ans_decode(const uint8_t *body, size_t len,
                                         kvt_proto_attach_ans_t *a_p, char *err, size_t errlen)
{
    const char *what = "attach answer";
    kvt_proto_rd_t r;
    kvt_proto_attach_ans_t a;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_need(&r, 32, what, "the geometry (32 bytes)", err, errlen)) != KVT_OK)
        return st;
    a.map_bytes = kvt_proto_rd_u64(&r);
    a.slot_off = kvt_proto_rd_u64(&r);
    a.slot_bytes = kvt_proto_rd_u32(&r);
    a.nslots = kvt_proto_rd_u32(&r);
    a.block_bytes = kvt_proto_rd_u32(&r);
    a.disk_slots = kvt_proto_rd_u32(&r);
    if ((st = proto_rd_name(&r, what, "arena_path", false, &a.arena_path, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "arena_path", err, errlen)) != KVT_OK ||
        (st = attach_geom(&a, err, errlen)) != KVT_OK)
        return st;
    *a_p = a;
    return KVT_OK;
}

/* ---- LOOKUP answer -------------------------------------------------------------------------- */

static bool loc_ok(uint8_t loc)
{
    return loc == KVT_PROTO_LOC_RAM || loc == KVT_PROTO_LOC_DISK;
}

kvt_status_t kvt_proto_lookup_ans_encode(kvt_proto_wr_t *w, uint64_t req_id, const uint8_t *loc,
                                         uint32_t hit)
{
    if (hit > 0 && loc == NULL)
        return KVT_ERR_INVAL;
    for (uint32_t i = 0; i < hit; i++)
        if (!loc_ok(loc[i]))
            return KVT_ERR_INVAL;
    if (hit > KVT_PROTO_MAX_BODY_LIMIT)
        return KVT_ERR_TOO_BIG;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_LOOKUP, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u32(w, hit);
    kvt_proto_wr_raw(w, loc, hit);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_lookup_ans_decode(const uint8_t *body, size_t len, uint8_t *loc,
                                         uint32_t max_hit, uint32_t *hit_p, char *err,
                                         size_t errlen)
{
    const char *what = "lookup answer";
    kvt_proto_rd_t r;
    uint32_t hit = 0;
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_rd_count(&r, what, "hit", false, max_hit, 1, "the locations", &hit, &at, err,
                             errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "the locations", err, errlen)) != KVT_OK)
        return st;
    for (uint32_t i = 0; i < hit; i++)
        if (!loc_ok(at[i]))
            return proto_fail(err, errlen, KVT_ERR_INVAL,
                              "%s: loc[%" PRIu32 "] is %u, not 1 (ram) or 2 (disk)", what, i,
                              (unsigned)at[i]);
    if (hit > 0)
        memcpy(loc, at, hit);
    *hit_p = hit;
    return KVT_OK;
}

/* ---- RESERVE answer ------------------------------------------------------------------------- */

kvt_status_t kvt_proto_reserve_ans_encode(kvt_proto_wr_t *w, uint64_t req_id, const uint32_t *slots,
                                          uint32_t n, const uint64_t *evicted, uint32_t nevicted)
{
    if ((n > 0 && slots == NULL) || (nevicted > 0 && evicted == NULL))
        return KVT_ERR_INVAL;
    if (n > KVT_PROTO_MAX_BODY_LIMIT / 4 || nevicted > KVT_PROTO_MAX_BODY_LIMIT / 8)
        return KVT_ERR_TOO_BIG;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_RESERVE, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u32(w, n);
    proto_put_uints(w, slots, n, 4);
    kvt_proto_wr_u32(w, nevicted);
    proto_put_uints(w, evicted, nevicted, 8);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_reserve_ans_decode(const uint8_t *body, size_t len, uint32_t *slots,
                                          uint32_t max_slots, uint64_t *evicted,
                                          uint32_t max_evicted, kvt_proto_reserve_ans_t *a_p,
                                          char *err, size_t errlen)
{
    const char *what = "reserve answer";
    kvt_proto_rd_t r;
    kvt_proto_reserve_ans_t a = {0};
    const uint8_t *at_slots = NULL, *at_evicted = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_rd_count(&r, what, "n", false, max_slots, 4, "the slots", &a.n, &at_slots, err,
                             errlen)) != KVT_OK ||
        (st = proto_rd_count(&r, what, "nevicted", false, max_evicted, 8, "the evicted keys",
                             &a.nevicted, &at_evicted, err, errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "the evicted keys", err, errlen)) != KVT_OK)
        return st;
    proto_get_uints(slots, at_slots, a.n, 4);
    proto_get_uints(evicted, at_evicted, a.nevicted, 8);
    *a_p = a;
    return KVT_OK;
}

/* ---- PIN answer ----------------------------------------------------------------------------- */

kvt_status_t kvt_proto_pin_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                      const kvt_proto_pinned_t *pins, uint32_t n)
{
    if (n > 0 && pins == NULL)
        return KVT_ERR_INVAL;
    if (n > KVT_PROTO_MAX_BODY_LIMIT / 8)
        return KVT_ERR_TOO_BIG;
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_PIN, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u32(w, n);
    if (kvt_proto_wr_reserve(w, (size_t)n * 8) == KVT_OK)
        for (uint32_t i = 0; i < n; i++) {
            kvt_proto_wr_u32(w, pins[i].slot);
            kvt_proto_wr_u32(w, pins[i].len);
        }
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_pin_ans_decode(const uint8_t *body, size_t len, kvt_proto_pinned_t *pins,
                                      uint32_t max_pins, uint32_t *n_p, char *err, size_t errlen)
{
    const char *what = "pin answer";
    kvt_proto_rd_t r;
    uint32_t n = 0;
    const uint8_t *at = NULL;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_rd_count(&r, what, "n", false, max_pins, 8, "the pins", &n, &at, err,
                             errlen)) != KVT_OK ||
        (st = proto_rd_end(&r, what, "the pins", err, errlen)) != KVT_OK)
        return st;
    kvt_proto_rd_init(&r, at, (size_t)n * 8);
    for (uint32_t i = 0; i < n; i++) {
        pins[i].slot = kvt_proto_rd_u32(&r);
        pins[i].len = kvt_proto_rd_u32(&r);
    }
    *n_p = n;
    return KVT_OK;
}

/* ---- one-count answers ---------------------------------------------------------------------- */

kvt_status_t kvt_proto_count_ans_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                        uint32_t count)
{
    if (op != KVT_PROTO_OP_COMMIT && op != KVT_PROTO_OP_UNPIN && op != KVT_PROTO_OP_PREFETCH &&
        op != KVT_PROTO_OP_XFER_RENEW && op != KVT_PROTO_OP_XFER_RELEASE)
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, op, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u32(w, count);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_count_ans_decode(const uint8_t *body, size_t len, uint32_t *count_p,
                                        char *err, size_t errlen)
{
    const char *what = "count answer";
    kvt_proto_rd_t r;
    kvt_status_t st;

    kvt_proto_rd_init(&r, body, len);
    if ((st = proto_need(&r, 4, what, "the count", err, errlen)) != KVT_OK)
        return st;
    uint32_t count = kvt_proto_rd_u32(&r);
    if ((st = proto_rd_end(&r, what, "the count", err, errlen)) != KVT_OK)
        return st;
    *count_p = count;
    return KVT_OK;
}

/* ---- BLOCK_GET answer ----------------------------------------------------------------------- */

kvt_status_t kvt_proto_block_get_ans_encode(kvt_proto_wr_t *w, uint64_t req_id, const void *data,
                                            size_t len)
{
    if (len == 0 || data == NULL)
        return KVT_ERR_INVAL;
    return kvt_proto_raw_encode(w, KVT_PROTO_OP_BLOCK_GET, KVT_PROTO_F_RESPONSE, req_id, data, len);
}

kvt_status_t kvt_proto_block_get_ans_decode(const uint8_t *body, size_t len, char *err,
                                            size_t errlen)
{
    (void)body;
    if (len == 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL,
                          "block_get answer: empty body (a block is at least 1 byte)");
    return KVT_OK;
}
