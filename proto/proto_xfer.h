/*
 * proto/proto_xfer.h: the codec of the transfer between sidecars (opcodes
 * XFER_HELLO..TRANSFER, docs/protocol.md "Transfer"), included by
 * proto/proto.h.
 *
 * Two sidecars set up a UCX transfer of KV blocks with these frames: the
 * receiver of a pull (or the sender of a push) says XFER_HELLO to learn the
 * peer's incarnation, arena and rkey, then pins (XFER_PIN, XFER_RENEW,
 * XFER_RELEASE) or reserves and commits (XFER_RESERVE, XFER_COMMIT) slots at
 * the peer, naming the incarnation it learnt in every frame. TRANSFER is the
 * user's call that starts one.
 *
 * Same rules as proto_tier.h: decoders never allocate and never log, strings
 * and blobs point into the caller's body, every decoder checks the whole body
 * before it sets any output, arrays go to the caller's, which says how many
 * entries fit. A count over that capacity, or over KVT_PROTO_XFER_MAX_KEYS,
 * is KVT_ERR_TOO_BIG; anything else malformed KVT_ERR_INVAL, with one line in
 * @err naming the body and the field ("xfer_pin: incarnation is 0",
 * "transfer answer: reason of failed[2] is 9"), cut to fit, NUL-terminated,
 * untouched on success (@err may be NULL when @errlen is 0).
 *
 * Encoders append one whole frame (request: flags 0; answer: flags RESPONSE)
 * or, on error, leave the writer as it was. They refuse what the decoders
 * refuse: KVT_ERR_INVAL for a value the protocol forbids, KVT_ERR_TOO_BIG for
 * a count over KVT_PROTO_XFER_MAX_KEYS, a str over 255 bytes or with a NUL
 * byte, a body over KVT_PROTO_MAX_BODY_LIMIT; KVT_ERR_NO_MEM. So a decoded
 * body re-encodes to exactly the same bytes.
 *
 * The answers of XFER_RENEW (u32 held) and XFER_RELEASE (u32 released) are
 * one-count answers: kvt_proto_count_ans_encode() and _decode() (proto_tier.h).
 */
#ifndef KVT_PROTO_PROTO_XFER_H
#define KVT_PROTO_PROTO_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* "proto.h", not "proto/proto.h": as in proto_tier.h. */
#include "proto.h"

/* The name of TRANSFER failure @reason (KVT_PROTO_XFER_FAIL_*: "peer_down", "peer_restarted",
 * "checksum", "timeout", "no_room", "evicted", "error"), NULL for another value. */
const char *kvt_proto_xfer_reason_name(uint8_t reason);

/* The KVT_PROTO_XFER_FAIL_* value named @name[0..len), 0 for none. */
uint8_t kvt_proto_xfer_reason_parse(const char *name, size_t len);

/* ---- XFER_HELLO ----------------------------------------------------------------------------- */

/* Appends an XFER_HELLO request: @expect, the incarnation the caller expects (0: any). */
kvt_status_t kvt_proto_xfer_hello_req_encode(kvt_proto_wr_t *w, uint64_t req_id, uint64_t expect);

/* Decodes an XFER_HELLO request (a u64, nothing after): KVT_OK and *@expect_p, or KVT_ERR_INVAL. */
kvt_status_t kvt_proto_xfer_hello_req_decode(const uint8_t *body, size_t len, uint64_t *expect_p,
                                             char *err, size_t errlen);

/* What a peer learns in an XFER_HELLO answer: enough to read and write the arena over UCX. */
typedef struct kvt_proto_xfer_hello_ans {
    uint64_t incarnation; /* the server's, drawn at its start; never 0 */
    uint32_t slot_bytes;  /* distance between slots, >= 1 */
    uint32_t nslots;      /* RAM slots, >= 1 */
    uint64_t base;        /* address of slot 0 at the server; base + nslots * slot_bytes fits */
    uint32_t addr_len;    /* bytes of the UCX worker address, 1..KVT_PROTO_XFER_MAX_BLOB */
    const uint8_t *addr;  /* decoded: points into the body (borrowed) */
    uint32_t rkey_len;    /* bytes of the packed rkey, 1..KVT_PROTO_XFER_MAX_BLOB */
    const uint8_t *rkey;  /* decoded: points into the body (borrowed) */
    kvt_proto_str_t host; /* 0..255 bytes: the server's boot id, so a peer can tell it shares
                             the kernel; empty: unknown */
    kvt_proto_str_t unix_path; /* 0..255 bytes: the server's --rpc-unix socket, where a peer on
                                  the same host may ATTACH its arena; empty: none */
} kvt_proto_xfer_hello_ans_t;

/* Appends an XFER_HELLO answer (addr and rkey copied). KVT_ERR_INVAL for what the decoder
 * refuses; else as the file comment says. */
kvt_status_t kvt_proto_xfer_hello_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                             const kvt_proto_xfer_hello_ans_t *h);

/*
 * Decodes an XFER_HELLO answer: incarnation not 0, slot_bytes and nslots at
 * least 1, base + nslots * slot_bytes at most 2^64, addr and rkey of
 * 1..KVT_PROTO_XFER_MAX_BLOB bytes each, then the strs host and unix_path,
 * nothing after. KVT_OK and *@h_p, or
 * KVT_ERR_INVAL.
 */
kvt_status_t kvt_proto_xfer_hello_ans_decode(const uint8_t *body, size_t len,
                                             kvt_proto_xfer_hello_ans_t *h_p, char *err,
                                             size_t errlen);

/* ---- XFER_PIN and XFER_RESERVE requests ----------------------------------------------------- */

/* An XFER_PIN or XFER_RESERVE request without its arrays. */
typedef struct kvt_proto_xfer_keys {
    uint64_t incarnation;  /* the server's, as its XFER_HELLO said; not 0 */
    uint64_t lease;        /* 0: a new lease; else one the caller holds there, to add the keys to */
    kvt_proto_str_t model; /* 1..255 bytes */
    kvt_proto_str_t lora;  /* 0..255 bytes; empty: the base model */
    uint32_t lease_ms;     /* 0: the server's lease time; else <= KVT_PROTO_XFER_MAX_LEASE_MS */
    uint32_t n;            /* keys, 1..KVT_PROTO_XFER_MAX_KEYS */
} kvt_proto_xfer_keys_t;

/* Appends an XFER_PIN request for @k and its k->n host-order @keys. */
kvt_status_t kvt_proto_xfer_pin_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                           const kvt_proto_xfer_keys_t *k, const uint64_t *keys);

/* Decodes an XFER_PIN body: on KVT_OK @keys[0..n) and *@k_p (its strings point into @body).
 * KVT_ERR_TOO_BIG when n > @max_keys (or KVT_PROTO_XFER_MAX_KEYS); KVT_ERR_INVAL else. */
kvt_status_t kvt_proto_xfer_pin_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                           uint32_t max_keys, kvt_proto_xfer_keys_t *k_p, char *err,
                                           size_t errlen);

/* Appends an XFER_RESERVE request for @k, its @keys and the bytes each block will take,
 * @lens (each >= 1; the server refuses more than its slot_bytes). */
kvt_status_t kvt_proto_xfer_reserve_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                               const kvt_proto_xfer_keys_t *k, const uint64_t *keys,
                                               const uint32_t *lens);

/* Decodes an XFER_RESERVE body into @keys[0..n), @lens[0..n) and *@k_p. Returns as
 * kvt_proto_xfer_pin_req_decode(); a len of 0 is KVT_ERR_INVAL. */
kvt_status_t kvt_proto_xfer_reserve_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                               uint32_t *lens, uint32_t max_keys,
                                               kvt_proto_xfer_keys_t *k_p, char *err,
                                               size_t errlen);

/* ---- XFER_PIN and XFER_RESERVE answers ------------------------------------------------------ */

/* The head of an XFER_PIN or XFER_RESERVE answer. */
typedef struct kvt_proto_xfer_slots_ans {
    uint64_t lease; /* the lease that holds the slots; not 0 when one is held */
    uint32_t n;     /* entries, one per key of the request, >= 1 */
} kvt_proto_xfer_slots_ans_t;

/* One key of an XFER_PIN answer. */
typedef struct kvt_proto_xfer_pinned {
    uint32_t slot; /* RAM slot at the server; KVT_PROTO_SLOT_NONE: missing there */
    uint32_t len;  /* bytes of the block, >= 1; 0 when missing */
    uint64_t sum;  /* XXH3-64 of those bytes, as the server recorded it when it stored the
                      block; 0 when missing */
} kvt_proto_xfer_pinned_t;

/* Appends an XFER_PIN answer: @a and its a->n @pins. KVT_ERR_INVAL for what the decoder refuses. */
kvt_status_t kvt_proto_xfer_pin_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                           const kvt_proto_xfer_slots_ans_t *a,
                                           const kvt_proto_xfer_pinned_t *pins);

/*
 * Decodes an XFER_PIN answer: n >= 1 entries; a missing key (slot NONE) has len
 * and sum 0, a pinned one len >= 1; the lease is not 0 when a key is pinned.
 * That slot < nslots and len <= slot_bytes (of the XFER_HELLO answer) is the
 * caller's check. KVT_OK with *@a_p and @pins[0..n); KVT_ERR_TOO_BIG when n >
 * @max_pins; KVT_ERR_INVAL else.
 */
kvt_status_t kvt_proto_xfer_pin_ans_decode(const uint8_t *body, size_t len,
                                           kvt_proto_xfer_pinned_t *pins, uint32_t max_pins,
                                           kvt_proto_xfer_slots_ans_t *a_p, char *err,
                                           size_t errlen);

/* Appends an XFER_RESERVE answer: @a and its a->n @slots (KVT_PROTO_SLOT_NONE: no room;
 * KVT_PROTO_XFER_SLOT_HELD: already held there). KVT_ERR_INVAL for what the decoder refuses. */
kvt_status_t kvt_proto_xfer_reserve_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                               const kvt_proto_xfer_slots_ans_t *a,
                                               const uint32_t *slots);

/* Decodes an XFER_RESERVE answer: n >= 1 slots, the lease not 0 when one of them is a slot
 * (neither NONE nor HELD). KVT_OK with *@a_p and @slots[0..n); KVT_ERR_TOO_BIG when n >
 * @max_slots; KVT_ERR_INVAL else. */
kvt_status_t kvt_proto_xfer_reserve_ans_decode(const uint8_t *body, size_t len, uint32_t *slots,
                                               uint32_t max_slots, kvt_proto_xfer_slots_ans_t *a_p,
                                               char *err, size_t errlen);

/* ---- XFER_RENEW and XFER_RELEASE requests --------------------------------------------------- */

typedef struct kvt_proto_xfer_lease {
    uint64_t incarnation; /* not 0 */
    uint64_t lease;       /* not 0 */
    uint32_t lease_ms;    /* XFER_RENEW only (0: the server's; <= KVT_PROTO_XFER_MAX_LEASE_MS);
                             must be 0 to encode an XFER_RELEASE */
} kvt_proto_xfer_lease_t;

/* Appends an XFER_RENEW or XFER_RELEASE (@op) request. KVT_ERR_INVAL: another opcode, or what
 * the decoder refuses. */
kvt_status_t kvt_proto_xfer_lease_req_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                             const kvt_proto_xfer_lease_t *l);

/* Decodes the body of an XFER_RENEW or XFER_RELEASE (@op) request: KVT_OK and *@l_p (lease_ms
 * 0 for XFER_RELEASE), or KVT_ERR_INVAL (also for another @op). */
kvt_status_t kvt_proto_xfer_lease_req_decode(uint8_t op, const uint8_t *body, size_t len,
                                             kvt_proto_xfer_lease_t *l_p, char *err, size_t errlen);

/* ---- XFER_COMMIT ---------------------------------------------------------------------------- */

/* The head of an XFER_COMMIT request. */
typedef struct kvt_proto_xfer_commit {
    uint64_t incarnation; /* not 0 */
    uint64_t lease;       /* the lease of the reservations, not 0 */
    uint32_t n;           /* entries, 1..KVT_PROTO_XFER_MAX_KEYS */
} kvt_proto_xfer_commit_t;

/* One key of an XFER_COMMIT request. */
typedef struct kvt_proto_xfer_landed {
    uint64_t key;
    uint64_t sum; /* XXH3-64 the block's bytes must have (the source's) */
    bool ok;      /* true: its bytes landed, check and publish; false: give its slot back */
} kvt_proto_xfer_landed_t;

/* Appends an XFER_COMMIT request: @c and its c->n @landed. */
kvt_status_t kvt_proto_xfer_commit_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                              const kvt_proto_xfer_commit_t *c,
                                              const kvt_proto_xfer_landed_t *landed);

/* Decodes an XFER_COMMIT request (ok 0 or 1): KVT_OK with *@c_p and @landed[0..n);
 * KVT_ERR_TOO_BIG when n > @max_keys; KVT_ERR_INVAL else. */
kvt_status_t kvt_proto_xfer_commit_req_decode(const uint8_t *body, size_t len,
                                              kvt_proto_xfer_landed_t *landed, uint32_t max_keys,
                                              kvt_proto_xfer_commit_t *c_p, char *err,
                                              size_t errlen);

/* Appends an XFER_COMMIT answer of @n (>= 1) entries: @visible[i] 1 when key i is now
 * visible at the server, 0 when not (ok was 0, or its checksum did not match). */
kvt_status_t kvt_proto_xfer_commit_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                              const uint8_t *visible, uint32_t n);

/* Decodes an XFER_COMMIT answer (each entry 0 or 1): KVT_OK with *@n_p and @visible[0..n);
 * KVT_ERR_TOO_BIG when n > @max; KVT_ERR_INVAL else. */
kvt_status_t kvt_proto_xfer_commit_ans_decode(const uint8_t *body, size_t len, uint8_t *visible,
                                              uint32_t max, uint32_t *n_p, char *err,
                                              size_t errlen);

/* ---- TRANSFER ------------------------------------------------------------------------------- */

/* A TRANSFER request without its keys. */
typedef struct kvt_proto_transfer_req {
    kvt_proto_str_t peer;  /* the peer's binary RPC address, "host:port" (common/hostport.h) */
    kvt_proto_str_t model; /* 1..255 bytes */
    kvt_proto_str_t lora;  /* 0..255 bytes */
    uint8_t direction;     /* KVT_PROTO_XFER_PULL or KVT_PROTO_XFER_PUSH */
    uint8_t flags;         /* KVT_PROTO_XFER_STREAM (with a push) or 0 */
    uint32_t timeout_ms;   /* 0: the server's; else <= KVT_PROTO_XFER_MAX_TIMEOUT_MS */
    uint32_t n;            /* keys, 1..KVT_PROTO_XFER_MAX_KEYS */
} kvt_proto_transfer_req_t;

/* Appends a TRANSFER request for @t and its t->n @keys. */
kvt_status_t kvt_proto_transfer_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                           const kvt_proto_transfer_req_t *t, const uint64_t *keys);

/* Decodes a TRANSFER request (a peer kvt_hostport_split() takes, port 1..65535; direction 0
 * or 1; flags 0, or KVT_PROTO_XFER_STREAM with a push; pad 0): KVT_OK with *@t_p and @keys[0..n); KVT_ERR_TOO_BIG when n > @max_keys;
 * KVT_ERR_INVAL else. */
kvt_status_t kvt_proto_transfer_req_decode(const uint8_t *body, size_t len, uint64_t *keys,
                                           uint32_t max_keys, kvt_proto_transfer_req_t *t_p,
                                           char *err, size_t errlen);

/* One key of a TRANSFER answer's failed list. */
typedef struct kvt_proto_xfer_failed {
    uint64_t key;
    uint8_t reason; /* KVT_PROTO_XFER_FAIL_* */
} kvt_proto_xfer_failed_t;

/* A TRANSFER answer: what landed (and became visible at the receiver), what the source did not
 * hold, what failed and why. */
typedef struct kvt_proto_transfer_ans {
    uint64_t bytes;                           /* bytes moved */
    uint64_t ns;                              /* the call's duration, nanoseconds */
    uint32_t ntransferred, nmissing, nfailed; /* together 1..KVT_PROTO_XFER_MAX_KEYS */
    const uint64_t *transferred;              /* decoded: the caller's arrays */
    const uint64_t *missing;
    const kvt_proto_xfer_failed_t *failed;
} kvt_proto_transfer_ans_t;

/* Appends a TRANSFER answer (an array may be NULL when its count is 0). KVT_ERR_INVAL for what
 * the decoder refuses. */
kvt_status_t kvt_proto_transfer_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                           const kvt_proto_transfer_ans_t *a);

/*
 * Decodes a TRANSFER answer into the caller's @transferred, @missing and
 * @failed (@max entries each): KVT_OK with *@a_p (its arrays those three);
 * KVT_ERR_TOO_BIG when a count is over @max or the three over
 * KVT_PROTO_XFER_MAX_KEYS; KVT_ERR_INVAL else (no key at all, a reason that
 * is not KVT_PROTO_XFER_FAIL_*).
 */
kvt_status_t kvt_proto_transfer_ans_decode(const uint8_t *body, size_t len, uint64_t *transferred,
                                           uint64_t *missing, kvt_proto_xfer_failed_t *failed,
                                           uint32_t max, kvt_proto_transfer_ans_t *a_p, char *err,
                                           size_t errlen);

#endif
