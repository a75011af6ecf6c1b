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
/* Request of a keyed tier call (LOOKUP, RESERVE, COMMIT, PIN, UNPIN, PREFETCH,
 * BLOCK_*): its keys are an engine's block-hash ids (docs/protocol.md,
 * "Engine keys"), in a namespace apart from the same model's sequence keys.
 * Refused (400) on any other request. */
#define KVT_PROTO_F_ENGINE_KEYS 0x0004u

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
 * them when it closes. With KVT_PROTO_F_ENGINE_KEYS these calls name the
 * engine-keys namespace of (model, lora). Mutating (refused before HELLO on a server with an
 * auth token): ATTACH, RESERVE, COMMIT, BLOCK_PUT, BLOCK_DELETE.
 *
 * The transfer between sidecars (docs/protocol.md, "Transfer"). INC is a
 * u64 incarnation: the random id (never 0) a kvtierd draws at each start;
 * every request but XFER_HELLO and TRANSFER names the one it expects, and a
 * server whose own differs refuses it with KVT_ERR_STALE (412): the peer
 * restarted, the caller's handshake (rkey) is stale. LEASE is a u64 lease
 * id, 0: none. Keys per frame: 1..KVT_PROTO_XFER_MAX_KEYS.
 *
 * XFER_HELLO   req: u64 expect (0: any; else KVT_ERR_STALE when not current).
 *              ans: INC, u32 slot_bytes (>= 1), u32 nslots (>= 1), u64 base
 *              (the arena's address at the server, for UCX; base + nslots *
 *              slot_bytes does not wrap), u32 addr_len (1..
 *              KVT_PROTO_XFER_MAX_BLOB), the UCX worker address, u32 rkey_len
 *              (1..KVT_PROTO_XFER_MAX_BLOB), the packed rkey of the arena.
 * XFER_PIN     req: INC, LEASE (0: a new lease; else one of the caller's, the
 *              keys are added to it), str model (1..255), str lora (0..255),
 *              u32 lease_ms (0: the server's; <= KVT_PROTO_XFER_MAX_LEASE_MS),
 *              u32 n, n x u64 key.
 *              ans: LEASE (not 0 when a key was pinned), u32 n, n x (u32 slot
 *              (KVT_PROTO_SLOT_NONE: missing, then len and sum are 0), u32 len
 *              (>= 1), u64 sum (XXH3-64 of the block's len bytes)).
 * XFER_RENEW   req: INC, LEASE (not 0), u32 lease_ms (as in XFER_PIN).
 *              ans: u32 held (pins and reservations the lease holds).
 * XFER_RELEASE req: INC, LEASE (not 0). ans: u32 released.
 * XFER_RESERVE req: INC, LEASE (as in XFER_PIN), str model, str lora, u32
 *              lease_ms, u32 n, n x u64 key, n x u32 len (1..slot_bytes).
 *              ans: LEASE (not 0 when a slot was reserved), u32 n, n x u32
 *              slot (KVT_PROTO_SLOT_NONE: no room; KVT_PROTO_XFER_SLOT_HELD:
 *              the block is already here, nothing to send).
 * XFER_COMMIT  req: INC, LEASE (not 0), u32 n, n x (u64 key, u64 sum, u8 ok
 *              (0 | 1; 0: give the slot back)).
 *              ans: u32 n, n x u8 visible (0 | 1; 1 only when ok and the
 *              landed bytes' XXH3-64 is sum).
 * TRANSFER     req: str peer ("host:port", common/hostport.h), str model
 *              (1..255), str lora, u8 direction (KVT_PROTO_XFER_PULL |
 *              KVT_PROTO_XFER_PUSH), u8 flags (KVT_PROTO_XFER_STREAM, push
 *              only; other bits 0), u8 pad[2] (0), u32 timeout_ms (0: the
 *              server's; <= KVT_PROTO_XFER_MAX_TIMEOUT_MS), u32 n, n x u64 key.
 *              ans: u64 bytes, u64 ns, u32 ntransferred, u64 keys, u32
 *              nmissing, u64 keys, u32 nfailed, nfailed x (u64 key, u8 reason
 *              KVT_PROTO_XFER_FAIL_*); the three counts total 1..
 *              KVT_PROTO_XFER_MAX_KEYS.
 * Mutating (refused before HELLO on a server with an auth token): all seven.
 *
 * Error answer body (flags RESPONSE|ERROR): i32 kvt_status_t, u16 http-like
 * status (400, 401, 404, 412, 413, 429, 500, 501, 503), str message.
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
    KVT_PROTO_OP_XFER_HELLO = 0x50,
    KVT_PROTO_OP_XFER_PIN = 0x51,
    KVT_PROTO_OP_XFER_RENEW = 0x52,
    KVT_PROTO_OP_XFER_RELEASE = 0x53,
    KVT_PROTO_OP_XFER_RESERVE = 0x54,
    KVT_PROTO_OP_XFER_COMMIT = 0x55,
    KVT_PROTO_OP_TRANSFER = 0x56,
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

/* Transfer frames: keys per frame, the longest lease and timeout, the longest worker address
 * or rkey (bytes). */
#define KVT_PROTO_XFER_MAX_KEYS 65536u
#define KVT_PROTO_XFER_MAX_LEASE_MS 600000u
#define KVT_PROTO_XFER_MAX_TIMEOUT_MS 600000u
#define KVT_PROTO_XFER_MAX_BLOB 65536u
/* An XFER_RESERVE answer's slot for a key the receiver already holds. */
#define KVT_PROTO_XFER_SLOT_HELD 0xFFFFFFFEu
/* TRANSFER directions. */
#define KVT_PROTO_XFER_PULL 0u /* this sidecar reads the blocks from the peer */
#define KVT_PROTO_XFER_PUSH 1u /* this sidecar writes its blocks to the peer */
/* TRANSFER flags: a push that waits, up to its timeout, for keys not held yet and sends each
 * as soon as it is committed here (its engine's prefill still writing them) */
#define KVT_PROTO_XFER_STREAM 1u
/* Why a TRANSFER answer lists a key as failed. */
#define KVT_PROTO_XFER_FAIL_PEER_DOWN 1u      /* the peer cannot be reached, or went away */
#define KVT_PROTO_XFER_FAIL_PEER_RESTARTED 2u /* a new incarnation, twice in one call */
#define KVT_PROTO_XFER_FAIL_CHECKSUM 3u       /* the landed bytes do not match the source's sum */
#define KVT_PROTO_XFER_FAIL_TIMEOUT 4u        /* timeout_ms ran out before it landed */
#define KVT_PROTO_XFER_FAIL_NO_ROOM 5u        /* the receiver had no slot for it */
#define KVT_PROTO_XFER_FAIL_EVICTED 6u        /* gone from the source after it was found */
#define KVT_PROTO_XFER_FAIL_ERROR 7u          /* another error (UCX, memory) */
#define KVT_PROTO_XFER_FAIL_MAX 7u

#endif
