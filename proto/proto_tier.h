/*
 * proto/proto_tier.h: the codec of the tier data plane and block API (opcodes
 * ATTACH..BLOCK_DELETE, docs/protocol.md "Tiers"), included by proto/proto.h.
 *
 * Same rules as the rest of the codec: decoders never allocate and never
 * log, strings point into the caller's body, every decoder checks the whole
 * body before it sets any output. Keys, lengths, slots and locations are
 * copied into arrays of the caller, which says how many fit: a count over
 * that capacity is KVT_ERR_TOO_BIG.
 *
 * Errors: decoders take `char *err, size_t errlen` last and, when errlen > 0,
 * write one line there on failure (lowercase, no trailing period, naming the
 * field: "commit: ok must be 0 or 1"), cut to fit and NUL-terminated; @err
 * is untouched on success and may be NULL when errlen is 0. Request bodies
 * get KVT_ERR_INVAL for any malformed field and KVT_ERR_TOO_BIG for more keys
 * than the caller takes; answer bodies the same (as kvt_proto_query_ans_decode()).
 *
 * Encoders append one whole frame (request: flags 0; answer: flags RESPONSE)
 * or, on error, leave the writer as it was. They refuse what the decoders
 * refuse: KVT_ERR_INVAL for a value the protocol forbids (empty model, n 0,
 * an opcode that has no such body), KVT_ERR_TOO_BIG for a str over 255 bytes
 * or with a NUL byte (as kvt_proto_wr_str()) and for a body over
 * KVT_PROTO_MAX_BODY_LIMIT, KVT_ERR_NO_MEM. Empty bodies (the ATTACH request,
 * the BLOCK_PUT and BLOCK_DELETE answers) are encoded with
 * kvt_proto_raw_encode(w, op, flags, req_id, NULL, 0).
 *
 * The arena's fd that comes with an ATTACH answer on a Unix socket
 * (SCM_RIGHTS) is the server's and the client's business: this codec only
 * encodes the answer frame it travels with.
 */
#ifndef KVT_PROTO_PROTO_TIER_H
#define KVT_PROTO_PROTO_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* "proto.h", not "proto/proto.h": beside this file in the tree, and found through
 * -I<includedir>/kvtier where the two are installed (kvtier/proto.h, kvtier/proto/proto_tier.h). */
#include "proto.h"

/* True for the opcodes whose request is a KEYS body: LOOKUP, RESERVE, PIN, UNPIN, PREFETCH. */
bool kvt_proto_op_keys(uint8_t op);

/* True for the opcodes that may carry KVT_PROTO_F_ENGINE_KEYS: the KEYS ones, COMMIT and
 * BLOCK_PUT, BLOCK_GET, BLOCK_DELETE. */
bool kvt_proto_op_engine_keys(uint8_t op);

/*
 * Checks a body that must be empty (ATTACH request, BLOCK_PUT and
 * BLOCK_DELETE answers): KVT_OK when @len is 0, else KVT_ERR_INVAL and a
 * message naming @op ("attach: 3 bytes in a body that must be empty").
 */
kvt_status_t kvt_proto_empty_decode(uint8_t op, size_t len, char *err, size_t errlen);

/* ---- KEYS requests: LOOKUP, RESERVE, PIN, UNPIN, PREFETCH ----------------------------------- */

/* A KEYS request without its keys (they go to an array of the caller). */
typedef struct kvt_proto_keys {
    kvt_proto_str_t model; /* 1..255 bytes */
    kvt_proto_str_t lora;  /* 0..255 bytes; empty: the base model */
    uint32_t n;            /* keys, >= 1 */
} kvt_proto_keys_t;

/*
 * Appends a KEYS request of opcode @op (kvt_proto_op_keys()) for @k and its
 * k->n host-order @keys. KVT_ERR_INVAL: another opcode, an empty model, n 0,
 * @keys NULL; else as the file comment says.
 */
kvt_status_t kvt_proto_keys_req_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                       const kvt_proto_keys_t *k, const uint64_t *keys);

/*
 * Decodes a KEYS body: model 1..255 bytes, lora, n >= 1, n keys, nothing
 * after. On KVT_OK the n keys (host order) are in @keys[0..n) and *@k_p is
 * set (its strings point into @body). KVT_ERR_TOO_BIG when n > @max_keys;
 * KVT_ERR_INVAL for anything else; @keys and *@k_p are untouched then.
 */
kvt_status_t kvt_proto_keys_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                       uint32_t max_keys, kvt_proto_keys_t *k_p, char *err,
                                       size_t errlen);

/* ---- COMMIT request ------------------------------------------------------------------------- */

/* A COMMIT request without its arrays. */
typedef struct kvt_proto_commit {
    kvt_proto_str_t model; /* 1..255 bytes */
    kvt_proto_str_t lora;  /* 0..255 bytes */
    bool ok;               /* true: the blocks become visible; false: the slots are given back */
    uint32_t n;            /* keys, >= 1 */
} kvt_proto_commit_t;

/*
 * Appends a COMMIT request for @c, its c->n @keys and their @lens (bytes of
 * each block, 0: the block size; @lens NULL: all 0). KVT_ERR_INVAL: an empty
 * model, n 0, @keys NULL; else as the file comment says.
 */
kvt_status_t kvt_proto_commit_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                         const kvt_proto_commit_t *c, const uint64_t *keys,
                                         const uint32_t *lens);

/*
 * Decodes a COMMIT body: model, lora, ok 0 or 1, pad 0 0 0, n >= 1, n keys,
 * n lens, nothing after. On KVT_OK @keys[0..n) and @lens[0..n) (host order)
 * and *@c_p are set. KVT_ERR_TOO_BIG when n > @max_keys; KVT_ERR_INVAL for
 * anything else; nothing is written then.
 */
kvt_status_t kvt_proto_commit_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                         uint32_t *lens, uint32_t max_keys, kvt_proto_commit_t *c_p,
                                         char *err, size_t errlen);

/* ---- KEY requests: BLOCK_GET, BLOCK_DELETE -------------------------------------------------- */

typedef struct kvt_proto_block_key {
    kvt_proto_str_t model; /* 1..255 bytes */
    kvt_proto_str_t lora;  /* 0..255 bytes */
    uint64_t key;
} kvt_proto_block_key_t;

/* Appends a BLOCK_GET or BLOCK_DELETE (@op) request for @k. KVT_ERR_INVAL: another opcode, an
 * empty model; else as the file comment says. */
kvt_status_t kvt_proto_block_key_req_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                            const kvt_proto_block_key_t *k);

/* Decodes a KEY body (model 1..255 bytes, lora, key, nothing after). KVT_OK and *@k_p, or
 * KVT_ERR_INVAL. */
kvt_status_t kvt_proto_block_key_req_decode(const uint8_t *body, size_t len,
                                            kvt_proto_block_key_t *k_p, char *err, size_t errlen);

/* ---- BLOCK_PUT request ---------------------------------------------------------------------- */

typedef struct kvt_proto_block_put {
    kvt_proto_str_t model; /* 1..255 bytes */
    kvt_proto_str_t lora;  /* 0..255 bytes */
    uint64_t key;
    bool durable;        /* answer only once on NVMe with its metadata committed */
    uint32_t len;        /* bytes of the block, >= 1 */
    const uint8_t *data; /* the block; decoded: points into the body (borrowed) */
} kvt_proto_block_put_t;

/* Appends a BLOCK_PUT request for @p (its len bytes copied). KVT_ERR_INVAL: an empty model,
 * len 0, data NULL; KVT_ERR_TOO_BIG: a body over the hard limit; else as the file comment. */
kvt_status_t kvt_proto_block_put_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                            const kvt_proto_block_put_t *p);

/*
 * Decodes a BLOCK_PUT body: model, lora, key, durable 0 or 1, pad 0 0 0,
 * len >= 1, then exactly len bytes to the end of the body. KVT_OK and *@p_p
 * (p_p->data points into @body), or KVT_ERR_INVAL. The block's size against
 * the tier's block size is the server's check, not the codec's.
 */
kvt_status_t kvt_proto_block_put_req_decode(const uint8_t *body, size_t len,
                                            kvt_proto_block_put_t *p_p, char *err, size_t errlen);

/* ---- ATTACH answer -------------------------------------------------------------------------- */

/* The arena's geometry: slot i is bytes [slot_off + i * slot_bytes, + block_bytes) of the
 * first map_bytes bytes of the arena's fd. */
typedef struct kvt_proto_attach_ans {
    uint64_t map_bytes;         /* bytes to map */
    uint64_t slot_off;          /* offset of slot 0 in the mapping */
    uint32_t slot_bytes;        /* stride of the slots, >= block_bytes */
    uint32_t nslots;            /* RAM slots */
    uint32_t block_bytes;       /* largest block, >= 1 */
    uint32_t disk_slots;        /* NVMe slots; 0 without a disk */
    kvt_proto_str_t arena_path; /* the arena's file; empty: a memfd (only the fd reaches it) */
} kvt_proto_attach_ans_t;

/*
 * Appends an ATTACH answer. KVT_ERR_INVAL for a geometry the decoder refuses
 * (block_bytes 0, slot_bytes < block_bytes, slots past map_bytes); else as
 * the file comment says.
 */
kvt_status_t kvt_proto_attach_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                         const kvt_proto_attach_ans_t *a);

/*
 * Decodes an ATTACH answer body and checks that every slot lies inside the
 * mapping (slot_off + nslots * slot_bytes <= map_bytes, block_bytes 1..
 * slot_bytes), so a client may index slots without checks of its own. KVT_OK
 * and *@a_p, or KVT_ERR_INVAL.
 */
kvt_status_t kvt_proto_attach_ans_decode(const uint8_t *body, size_t len,
                                         kvt_proto_attach_ans_t *a_p, char *err, size_t errlen);

/* ---- LOOKUP answer -------------------------------------------------------------------------- */

/* Appends a LOOKUP answer: @hit leading keys held, @loc[i] KVT_PROTO_LOC_RAM or _DISK for each
 * (@loc may be NULL when @hit is 0). KVT_ERR_INVAL for another location. */
kvt_status_t kvt_proto_lookup_ans_encode(kvt_proto_wr_t *w, uint64_t req_id, const uint8_t *loc,
                                         uint32_t hit);

/*
 * Decodes a LOOKUP answer: KVT_OK with the hit count in *@hit_p and the
 * locations (each KVT_PROTO_LOC_RAM or _DISK) in @loc[0..hit). KVT_ERR_TOO_BIG
 * when hit > @max_hit; KVT_ERR_INVAL for anything else (nothing written).
 */
kvt_status_t kvt_proto_lookup_ans_decode(const uint8_t *body, size_t len, uint8_t *loc,
                                         uint32_t max_hit, uint32_t *hit_p, char *err,
                                         size_t errlen);

/* ---- RESERVE answer ------------------------------------------------------------------------- */

/* The counts of a decoded RESERVE answer. */
typedef struct kvt_proto_reserve_ans {
    uint32_t n;        /* slots, one per key of the request */
    uint32_t nevicted; /* keys of blocks evicted altogether to make room */
} kvt_proto_reserve_ans_t;

/* Appends a RESERVE answer: @n @slots (KVT_PROTO_SLOT_NONE: that key got none), @nevicted
 * @evicted keys (either array may be NULL when its count is 0). KVT_ERR_INVAL for a NULL array
 * with a count; else as the file comment says. */
kvt_status_t kvt_proto_reserve_ans_encode(kvt_proto_wr_t *w, uint64_t req_id, const uint32_t *slots,
                                          uint32_t n, const uint64_t *evicted, uint32_t nevicted);

/*
 * Decodes a RESERVE answer: KVT_OK with the counts in *@a_p, the slots in
 * @slots[0..n), the evicted keys in @evicted[0..nevicted). KVT_ERR_TOO_BIG
 * when n > @max_slots or nevicted > @max_evicted; KVT_ERR_INVAL for anything
 * else (nothing written).
 */
kvt_status_t kvt_proto_reserve_ans_decode(const uint8_t *body, size_t len, uint32_t *slots,
                                          uint32_t max_slots, uint64_t *evicted,
                                          uint32_t max_evicted, kvt_proto_reserve_ans_t *a_p,
                                          char *err, size_t errlen);

/* ---- PIN answer ----------------------------------------------------------------------------- */

/* One key of a PIN answer (kvt_tier_pinned_t on the wire). */
typedef struct kvt_proto_pinned {
    uint32_t slot; /* RAM slot; KVT_PROTO_SLOT_NONE: not held */
    uint32_t len;  /* bytes of the block */
} kvt_proto_pinned_t;

/* Appends a PIN answer of @n entries (@pins may be NULL when @n is 0). KVT_ERR_INVAL for NULL
 * with entries; else as the file comment says. */
kvt_status_t kvt_proto_pin_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                      const kvt_proto_pinned_t *pins, uint32_t n);

/* Decodes a PIN answer: KVT_OK with the count in *@n_p and the entries in @pins[0..n).
 * KVT_ERR_TOO_BIG when n > @max_pins; KVT_ERR_INVAL for anything else (nothing written). */
kvt_status_t kvt_proto_pin_ans_decode(const uint8_t *body, size_t len, kvt_proto_pinned_t *pins,
                                      uint32_t max_pins, uint32_t *n_p, char *err, size_t errlen);

/* ---- one-count answers: COMMIT, UNPIN, PREFETCH, XFER_RENEW, XFER_RELEASE ------------------- */

/* Appends the answer of COMMIT (reservations ended), UNPIN (pins released), PREFETCH (reads
 * started), XFER_RENEW (pins and reservations the lease holds) or XFER_RELEASE (released), @op,
 * carrying @count. KVT_ERR_INVAL for another opcode. */
kvt_status_t kvt_proto_count_ans_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                        uint32_t count);

/* Decodes a one-count answer (a u32, nothing after). KVT_OK and *@count_p, or KVT_ERR_INVAL. */
kvt_status_t kvt_proto_count_ans_decode(const uint8_t *body, size_t len, uint32_t *count_p,
                                        char *err, size_t errlen);

/* ---- BLOCK_GET answer ----------------------------------------------------------------------- */

/* Appends a BLOCK_GET answer whose body is the block's @len bytes (>= 1: KVT_ERR_INVAL for 0
 * or @data NULL; KVT_ERR_TOO_BIG over the hard limit). */
kvt_status_t kvt_proto_block_get_ans_encode(kvt_proto_wr_t *w, uint64_t req_id, const void *data,
                                            size_t len);

/* Checks a BLOCK_GET answer body (the block itself): KVT_OK when it holds at least 1 byte,
 * else KVT_ERR_INVAL. */
kvt_status_t kvt_proto_block_get_ans_decode(const uint8_t *body, size_t len, char *err,
                                            size_t errlen);

#endif
