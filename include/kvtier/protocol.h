/*
 * kvtier binary RPC: constants and frame layout shared by kvtierd and
 * libkvtier. docs/protocol.md is the full specification; this header is its
 * machine-readable part. Every integer on the wire is little-endian.
 *
 * A frame is a 24-byte header followed by `body_len` bytes of body:
 *
 *   off size field
 *     0  4   magic      KVT_PROTO_MAGIC (bytes 'K' 'V' 'T' '1')
 *     4  1   version    KVT_PROTO_VERSION
 *     5  1   opcode     enum kvt_proto_op
 *     6  2   flags      KVT_PROTO_F_* bits; others must be 0
 *     8  8   req_id     chosen by the client; the answer carries the same id
 *    16  4   body_len   bytes after the header, <= the server's max frame size
 *    20  4   reserved   must be 0
 *
 * Requests may be pipelined: a client sends many frames without waiting, and
 * the server answers each (in any order) with a frame carrying the request's
 * opcode, req_id and KVT_PROTO_F_RESPONSE. A malformed header (bad magic,
 * version, flags, reserved or an oversized body) is fatal to the connection:
 * the server answers one error frame (req_id 0 when the header is not
 * trustworthy) and closes. A malformed body gets an error answer and the
 * connection stays open.
 */
#ifndef KVTIER_PROTOCOL_H
#define KVTIER_PROTOCOL_H

#include <stdint.h>

#define KVT_PROTO_MAGIC 0x3154564Bu /* "KVT1" read as a little-endian u32 */
#define KVT_PROTO_VERSION 1u
#define KVT_PROTO_HDR_SIZE 24u
/* Default and hard ceiling of a frame body, in bytes (kvtierd --rpc-max-frame). */
#define KVT_PROTO_MAX_BODY_DEFAULT (4u << 20)
#define KVT_PROTO_MAX_BODY_LIMIT (64u << 20)
/* Longest string field (model, LoRA, pod name, token) in bytes. */
#define KVT_PROTO_MAX_STR 255u

/* Header flags. */
#define KVT_PROTO_F_RESPONSE 0x0001u /* set on every answer */
#define KVT_PROTO_F_ERROR 0x0002u    /* answer body is an error body (below) */

/*
 * Opcodes. Bodies are built from: u8/u16/u32/u64 (LE), f64 (IEEE-754 LE),
 * str = u16 length + bytes (no NUL, <= KVT_PROTO_MAX_STR).
 *
 * HELLO   req: u32 client_version, str auth_token (empty when none)
 *         ans: u32 server_version, u32 max_body
 *         A server with an auth token refuses mutating calls (EVENTS,
 *         ENGINE_ADD, ENGINE_DROP, MODEL_DROP and the tier calls named
 *         below) on a connection that has not said HELLO with it.
 * PING    req: empty. ans: empty.
 * QUERY   req: str model, str lora (empty: base model), u8 kind
 *              (KVT_PROTO_Q_TOKENS | KVT_PROTO_Q_KEYS |
 *              KVT_PROTO_Q_TOKENS_SALTED), u8 pad[3] (0),
 *              [kind SALTED only: str cache_salt, 1..255 bytes],
 *              u32 n, then n u32 token ids (kinds TOKENS, SALTED) or n u64
 *              sequence keys (KEYS), u32 npods, npods x str pod name
 *              (filter; 0 = every pod)
 *         ans: u32 block_size, u32 num_blocks, u32 npods, then per pod,
 *              best first: str pod, u32 dp_rank, u32 matched_blocks,
 *              u32 gpu, u32 cpu, u32 disk, f64 score
 * EVENTS  req: the JSON body of HTTP POST /v1/events
 *         ans: the JSON answer of that call
 * STATS   req: empty. ans: the JSON of GET /v1/stats
 * ENGINE_DROP req: str pod. ans: the JSON answer of DELETE /v1/engines/{pod}
 * MODEL_DROP req: str model. ans: the JSON answer of DELETE /v1/models/{model}
 * ROUTED  req: the JSON body of HTTP POST /v1/routed (a router's decision:
 *         speculative entries). ans: the JSON answer of that call
 *
 * The tier data plane (docs/protocol.md, "Tiers"). KEYS below is: str model
 * (1..255 bytes), str lora (0..255), u32 n (>= 1), n x u64 key, nothing after;
 * KEY is: str model (1..255), str lora, u64 key.
 *
 * ATTACH   req: empty. ans: u64 map_bytes, u64 slot_off, u32 slot_bytes,
 *               u32 nslots, u32 block_bytes, u32 disk_slots, str arena_path
 *               (empty: a memfd). On a Unix socket the server sends the
 *               arena's fd with the answer frame (SCM_RIGHTS); slot i is at
 *               slot_off + i * slot_bytes of that mapping.
 * LOOKUP   req: KEYS. ans: u32 hit, hit x u8 loc (KVT_PROTO_LOC_RAM | _DISK):
 *               how many leading keys are held, and where.
 * RESERVE  req: KEYS. ans: u32 n, n x u32 slot (KVT_PROTO_SLOT_NONE: none),
 *               u32 nevicted, nevicted x u64 key evicted altogether.
 * COMMIT   req: str model, str lora, u8 ok (0 | 1), u8 pad[3] (0), u32 n
 *               (>= 1), n x u64 key, n x u32 len (0: the block size).
 *               ans: u32 done (reservations ended).
 * PIN      req: KEYS. ans: u32 n, n x (u32 slot, u32 len); answered once
 *               the blocks are in RAM.
 * UNPIN    req: KEYS. ans: u32 done.
 * PREFETCH req: KEYS. ans: u32 started (reads from NVMe started).
 * BLOCK_PUT    req: str model, str lora, u64 key, u8 durable (0 | 1),
 *               u8 pad[3] (0), u32 len (>= 1), len bytes (the body ends
 *               there). ans: empty.
 * BLOCK_GET    req: KEY. ans: the block's bytes (the whole body, >= 1 byte).
 * BLOCK_DELETE req: KEY. ans: empty.
 * Reservations and pins belong to the connection (a session): it releases
 * them when it closes. Mutating (refused before HELLO on a server with an
 * auth token): ATTACH, RESERVE, COMMIT, BLOCK_PUT, BLOCK_DELETE.
 *
 * Error answer body (flags RESPONSE|ERROR): i32 kvt_status_t, u16 http-like
 * status (400, 401, 404, 413, 429, 500, 501, 503), str message.
 */
enum kvt_proto_op {
    KVT_PROTO_OP_HELLO = 0x01,
    KVT_PROTO_OP_PING = 0x02,
    KVT_PROTO_OP_QUERY = 0x10,
    KVT_PROTO_OP_EVENTS = 0x20,
    KVT_PROTO_OP_ENGINE_DROP = 0x21,
    KVT_PROTO_OP_ENGINE_ADD = 0x22,
    KVT_PROTO_OP_MODEL_DROP = 0x23,
    KVT_PROTO_OP_ROUTED = 0x24,
    KVT_PROTO_OP_STATS = 0x30,
    KVT_PROTO_OP_ATTACH = 0x40,
    KVT_PROTO_OP_LOOKUP = 0x41,
    KVT_PROTO_OP_RESERVE = 0x42,
    KVT_PROTO_OP_COMMIT = 0x43,
    KVT_PROTO_OP_PIN = 0x44,
    KVT_PROTO_OP_UNPIN = 0x45,
    KVT_PROTO_OP_PREFETCH = 0x46,
    KVT_PROTO_OP_BLOCK_PUT = 0x47,
    KVT_PROTO_OP_BLOCK_GET = 0x48,
    KVT_PROTO_OP_BLOCK_DELETE = 0x49,
};

/* QUERY kinds. */
#define KVT_PROTO_Q_TOKENS 0u /* u32 token ids, hashed by the server */
#define KVT_PROTO_Q_KEYS 1u   /* u64 block sequence keys */
/* u32 token ids with a request's cache salt (vLLM/SGLang `cache_salt`): the salt (a non-empty
 * str) follows pad, and seeds the first block's hash (docs/api.md, "POST /v1/query"). */
#define KVT_PROTO_Q_TOKENS_SALTED 2u

/* Where a LOOKUP answer says a block is: the fastest place that holds it. */
#define KVT_PROTO_LOC_RAM 1u
#define KVT_PROTO_LOC_DISK 2u
/* A RESERVE or PIN answer's slot for a key that got none. */
#define KVT_PROTO_SLOT_NONE 0xFFFFFFFFu

#endif
