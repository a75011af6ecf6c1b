/*
 * kvindex/event: engine KV events in one neutral form. Decoders (JSON here,
 * vLLM/SGLang msgpack later) fill a kvt_evbatch_t; kvt_ev_apply() applies it
 * to the index on the writer thread.
 *
 * Field names and meanings follow vLLM's KVEvents (../shared/WIRE-FORMATS.md).
 */
#ifndef KVT_KVINDEX_EVENT_H
#define KVT_KVINDEX_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kvindex/index.h"

typedef enum kvt_ev_type {
    KVT_EV_STORED = 1,  /* BlockStored */
    KVT_EV_REMOVED = 2, /* BlockRemoved */
    KVT_EV_CLEARED = 3, /* AllBlocksCleared */
} kvt_ev_type_t;

/* One event. Pointers point into the batch's arena. */
typedef struct kvt_event {
    kvt_ev_type_t type;
    unsigned tier;          /* KVT_TIER_* from "medium" (absent or null: GPU) */
    uint32_t nhashes;       /* engine block hashes (stored or removed) */
    const uint64_t *hashes; /* NULL when nhashes is 0 */
    bool has_parent;        /* "parent_block_hash" present and not null */
    uint64_t parent;        /* engine hash of the parent block */
    uint32_t ntokens;       /* "token_ids"; block_size * nhashes, or 0 (placeholder) */
    const uint32_t *tokens; /* NULL when ntokens is 0 */
    uint32_t block_size;    /* "block_size"; 0 when absent */
    const char *lora_name;  /* NUL-terminated; NULL: the batch's LoRA */
    /* The request's cache salt (vLLM extra_keys, SGLang metadata, or "cache_salt"): it seeds the
     * chain's first block (kvindex/hash.h) when this event starts a chain. NULL: none. */
    const char *cache_salt;
    uint32_t cache_salt_len; /* 1..KVT_IDX_MAX_NAME bytes when cache_salt is set */
} kvt_event_t;

/* A batch of events from one pod (engine, DP rank) for one model. */
typedef struct kvt_evbatch {
    const char *pod;   /* NUL-terminated, 1..KVT_IDX_MAX_NAME bytes */
    uint32_t dp_rank;  /* "dp_rank"; 0 when absent */
    const char *model; /* NUL-terminated; "" when absent (only for batches without BlockStored) */
    const char *lora;  /* "lora_name" of the batch; NULL: base model */
    kvt_event_t *ev;
    size_t nev;
    size_t unknown; /* events of unknown types and unknown fields, skipped */
    void *arena;    /* owns every pointer above; freed by kvt_evbatch_cleanup() */
} kvt_evbatch_t;

/* Frees what a decoder put in @b and zeroes it. A zeroed batch is a no-op. */
void kvt_evbatch_cleanup(kvt_evbatch_t *b);

/*
 * Decodes the JSON body of POST /v1/events:
 *   {"pod": str, "model": str, "lora_name"?: str|null, "dp_rank"?: uint,
 *    "events": [ {"type": "BlockStored", "block_hashes": [h..],
 *                 "parent_block_hash"?: h|null, "token_ids"?: [u32..],
 *                 "block_size"?: uint, "medium"?: str|null,
 *                 "lora_name"?: str|null, "lora_id"?: any, "extra_keys"?: any,
 *                 "group_idx"?: any, ... },
 *                {"type": "BlockRemoved", "block_hashes": [h..], "medium"?: str|null},
 *                {"type": "AllBlocksCleared"} ]}
 * A hash h is a JSON integer: unsigned 64-bit decimal, or a negative int64
 * (SGLang) taken as its two's-complement u64. Unknown event types and unknown
 * fields inside an event are skipped and counted in b->unknown; an unknown
 * top-level field, a wrong type, a missing required field, token_ids whose
 * length is not block_size * len(block_hashes), or trailing bytes are errors.
 * On success fills *@b (caller cleans up). On failure *@b is untouched and a
 * one-line reason is written to @err (NUL-terminated, at most @errlen bytes).
 * Returns KVT_OK, KVT_ERR_PARSE (not JSON), KVT_ERR_INVAL (wrong shape),
 * KVT_ERR_TOO_BIG (a name over KVT_IDX_MAX_NAME, more than @max_items hashes
 * or tokens in all) or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_ev_json_decode(const char *body, size_t len, size_t max_items, kvt_evbatch_t *b,
                                char *err, size_t errlen);

/* Engine event streams. They differ in how a raw-bytes block hash becomes an id. */
typedef enum kvt_ev_format {
    KVT_EV_FMT_VLLM = 1,   /* bytes: the last 8, big-endian */
    KVT_EV_FMT_SGLANG = 2, /* bytes: the first 8, big-endian (SGLang's signed int64) */
} kvt_ev_format_t;

/*
 * Decodes the msgpack payload of one ZMQ KV-event message (msgpack-c):
 *   [ts: float|int, events: array, dp_rank?: uint|nil]
 * Each event is a positional array ["BlockStored", block_hashes,
 * parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
 * extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
 * (trailing fields may be omitted; likewise ["BlockRemoved", block_hashes,
 * medium, group_idx] and ["AllBlocksCleared"]), or a map with "type" and
 * those field names in any order. A hash is a uint64, an int64 (taken as
 * its two's-complement u64) or bin bytes (1..64 of them; see
 * kvt_ev_format_t). nil means absent for every optional field.
 * Unknown event types, unknown fields, extra positional fields and events
 * on an unknown medium are skipped and counted in b->unknown (a stream must
 * survive newer engines). Anything else out of shape fails the batch.
 * @pod and @model are borrowed: the batch points at them, so they must
 * outlive it. b->dp_rank is the payload's dp_rank when present, else
 * @dp_rank. On success fills *@b (caller cleans up). On failure *@b is
 * untouched and a one-line reason is written to @err (NUL-terminated, at
 * most @errlen bytes). Returns KVT_OK, KVT_ERR_PARSE (not one msgpack
 * value: truncated, trailing bytes, a reserved byte), KVT_ERR_INVAL (wrong
 * shape), KVT_ERR_TOO_BIG (more than @max_items hashes and tokens, a name
 * over KVT_IDX_MAX_NAME) or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_ev_msgpack_decode(const void *payload, size_t len, kvt_ev_format_t fmt,
                                   const char *pod, const char *model, uint32_t dp_rank,
                                   size_t max_items, kvt_evbatch_t *b, char *err, size_t errlen);

/* What kvt_ev_apply() did; counters are added to, never reset. */
typedef struct kvt_ev_counters {
    uint64_t events;     /* events applied */
    uint64_t blocks;     /* block hashes in applied events */
    uint64_t unresolved; /* hashes the pod did not know (removals, placeholder stores) */
    uint64_t orphans;    /* BlockStored whose parent the pod did not know: chained from block 0 */
} kvt_ev_counters_t;

/*
 * Writer. Applies @b to @idx: registers the pod (b->pod, b->dp_rank) and the
 * namespace (model, LoRA) as needed. BlockStored with tokens computes keys
 * with the hashing standard, continuing from the parent's key when the pod
 * knows parent_block_hash, else from block 0; without tokens it adds the
 * tier to blocks the pod already knows by engine hash. BlockRemoved drops
 * the medium's tier; AllBlocksCleared drops the pod's GPU tier.
 * @default_block_size is used when an event has tokens but no block_size.
 * The whole batch is checked first: a BlockStored with tokens and no model,
 * or whose block size differs from its namespace's, fails the batch with
 * KVT_ERR_INVAL and nothing applied (a one-line reason in @err, @errlen
 * bytes). Otherwise returns KVT_OK, or the first hard error (KVT_ERR_NO_MEM,
 * KVT_ERR_LIMIT, KVT_ERR_TOO_BIG); events before it stay applied.
 */
kvt_status_t kvt_ev_apply(kvt_idx_t *idx, const kvt_evbatch_t *b, uint32_t default_block_size,
                          kvt_ev_counters_t *c, char *err, size_t errlen);

#endif
