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
 *         ENGINE_DROP, MODEL_DROP) on a connection that has not said HELLO with it.
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
    KVT_PROTO_OP_STATS = 0x30,
};

/* QUERY kinds. */
#define KVT_PROTO_Q_TOKENS 0u /* u32 token ids, hashed by the server */
#define KVT_PROTO_Q_KEYS 1u   /* u64 block sequence keys */
/* u32 token ids with a request's cache salt (vLLM/SGLang `cache_salt`): the salt (a non-empty
 * str) follows pad, and seeds the first block's hash (docs/api.md, "POST /v1/query"). */
#define KVT_PROTO_Q_TOKENS_SALTED 2u

#endif
