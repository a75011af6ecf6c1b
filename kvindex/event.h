/*
 * kvindex/event: engine KV events in one neutral form. Decoders (JSON for the
 * HTTP/RPC API, vLLM/SGLang msgpack for the engines' ZMQ streams) fill a
 * kvt_evbatch_t; kvt_ev_apply() applies it to the index on the writer thread.
 *
 * Field names and meanings follow vLLM's KVEvents (../shared/WIRE-FORMATS.md);
 * docs/api.md lists every form the decoders accept, slot by slot.
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
    /*
     * An engine event that could not be decoded (msgpack streams only; a bad
     * JSON event fails its whole request instead). Skipped and counted; when
     * it was, or may have been, a removal or a clear (may_remove), the pod's
     * engine-reported state can no longer be trusted and is dropped.
     */
    KVT_EV_BAD = 4,
} kvt_ev_type_t;

/* Tiers an engine reports (GPU, CPU, DISK): what a state drop clears. */
#define KVT_EV_ENGINE_TIERS (KVT_TIER_GPU | KVT_TIER_CPU | KVT_TIER_DISK)

/* Why a decoded event is not applied (kvt_event_t.skip). */
enum {
    KVT_EV_SKIP_NONE = 0,
    KVT_EV_SKIP_MEDIUM = 1, /* a medium kvtier does not model; medium/medium_len name it */
    KVT_EV_SKIP_REMOTE = 2, /* locality "REMOTE": the blocks are not held by this pod */
};

/* The KV cache group an event belongs to (hybrid models send one stream per group). */
enum {
    KVT_EV_GROUP_ANY = 0,   /* no kv_cache_spec_kind given (or one kvtier does not know) */
    KVT_EV_GROUP_FULL = 1,  /* full attention (full_attention, mla_attention, ...): indexed */
    KVT_EV_GROUP_OTHER = 2, /* sliding window, chunked local attention, mamba: not indexed */
};

/* One event. Pointers point into the batch's arena. */
typedef struct kvt_event {
    kvt_ev_type_t type;
    unsigned tier;          /* KVT_TIER_* from "medium" (absent or null: GPU); 0 for an event
                               skipped for its medium, and for KVT_EV_BAD */
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
    const char *cache_salt;  /* NUL-terminated, no NUL inside (such a string is no salt) */
    uint32_t cache_salt_len; /* >= 1 when cache_salt is set */
    /*
     * Per block: a seed standing for the block's other extra keys (multimodal
     * inputs, prompt embeddings: anything but the LoRA and the salt), hashed
     * by value in one canonical form for both decoders (docs/api.md, "Extra
     * keys"), mixed into its local hash so such blocks never match a token
     * query. 0: none. NULL when no block has any.
     */
    const uint64_t *extra_seeds;
    int64_t group;       /* "group_idx"; -1 when absent */
    uint8_t group_kind;  /* KVT_EV_GROUP_* from "kv_cache_spec_kind" */
    uint8_t skip;        /* KVT_EV_SKIP_* */
    bool may_remove;     /* KVT_EV_BAD: it was, or may have been, a removal or a clear */
    const char *medium;  /* KVT_EV_SKIP_MEDIUM: the medium's name (not NUL-terminated) */
    uint32_t medium_len; /* its bytes (at most KVT_EV_MEDIUM_NAME_MAX) */
} kvt_event_t;

/*
 * Seed of the hash that turns a block's other extra keys into its
 * extra_seeds entry (the local hash's seed is then KVT_HASH_SEED, or the
 * salt's seed, xor that entry).
 */
#define KVT_EV_EXTRA_SEED 0x6b76747278u

/* Longest medium name kept for counting by name (kvt_ev_medium_name_len()). */
#define KVT_EV_MEDIUM_NAME_MAX 32u

/*
 * Bytes of medium name @name[0..@len) that both decoders keep for counting:
 * all of it up to KVT_EV_MEDIUM_NAME_MAX bytes, else that many less the
 * bytes of a UTF-8 character the cut would split.
 */
uint32_t kvt_ev_medium_name_len(const char *name, size_t len);

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
 * The tier of medium name @name[0..@len), any case: GPU; CPU and CPU_PINNED
 * (SGLang's HiCache host memory); DISK, NVME, STORAGE (vLLM) and EXTERNAL
 * (SGLang's L3 storage backend). 0 for a name kvtier does not model.
 */
unsigned kvt_ev_medium_tier(const char *name, size_t len);

/*
 * The group kind of kv_cache_spec_kind @name[0..@len) (vLLM's
 * KVCacheSpecKind values): KVT_EV_GROUP_FULL for full_attention,
 * mla_attention and sink_full_attention; KVT_EV_GROUP_OTHER for
 * sliding_window, sliding_window_mla, chunked_local_attention and mamba;
 * KVT_EV_GROUP_ANY for anything else ("unknown" included).
 */
uint8_t kvt_ev_group_kind(const char *name, size_t len);

/*
 * Decodes the JSON body of POST /v1/events:
 *   {"pod": str, "model": str, "lora_name"?: str|null, "dp_rank"?: uint,
 *    "events": [ {"type": "BlockStored", "block_hashes": [h..],
 *                 "parent_block_hash"?: h|null, "token_ids"?: [u32..],
 *                 "block_size"?: uint, "medium"?: str|null,
 *                 "lora_name"?: str|null, "cache_salt"?: str|null,
 *                 "extra_keys"?: [null|[..]..]|null, "group_idx"?: uint|null,
 *                 "kv_cache_spec_kind"?: str|null, "locality"?: str|null,
 *                 "lora_id"?: any, ... },
 *                {"type": "BlockRemoved", "block_hashes": [h..], "medium"?: str|null,
 *                 "group_idx"?: uint|null, "locality"?: str|null},
 *                {"type": "AllBlocksCleared"} ]}
 * A hash h is a JSON integer: unsigned 64-bit decimal, or a negative int64
 * (SGLang) taken as its two's-complement u64. dp_rank is at most
 * KVT_EV_MAX_DP_RANK. Unknown event types and unknown fields inside an
 * event are skipped and counted in b->unknown; events on a medium kvtier
 * does not model, and REMOTE ones, are kept with their skip reason (and
 * skipped by kvt_ev_apply()). An unknown top-level field, a wrong type, a
 * missing required field, token_ids whose length is not
 * block_size * len(block_hashes), extra_keys whose length is not
 * len(block_hashes), or trailing bytes are errors. extra_keys are read
 * after the whole body (a LoRA leading an entry is the event's lora_name,
 * else the batch's, or its lora_id when that is an unsigned integer).
 * On success fills *@b (caller cleans up). On failure *@b is untouched and a
 * one-line reason is written to @err (NUL-terminated, at most @errlen bytes).
 * Returns KVT_OK, KVT_ERR_PARSE (not JSON), KVT_ERR_INVAL (wrong shape),
 * KVT_ERR_TOO_BIG (a name over KVT_IDX_MAX_NAME, more than @max_items hashes
 * or tokens in all) or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_ev_json_decode(const char *body, size_t len, size_t max_items, kvt_evbatch_t *b,
                                char *err, size_t errlen);

/* Largest DP rank a batch may name over HTTP/RPC (streams take theirs from the stream). */
#define KVT_EV_MAX_DP_RANK 255u

/* Engine event streams. They differ in how a raw-bytes block hash becomes an id. */
typedef enum kvt_ev_format {
    KVT_EV_FMT_VLLM = 1,   /* bytes: the last 8, big-endian */
    KVT_EV_FMT_SGLANG = 2, /* bytes: the first 8, big-endian (SGLang's signed int64) */
} kvt_ev_format_t;

/*
 * Decodes the msgpack payload of one ZMQ KV-event message (msgpack-c). The
 * batch is an array [ts, events] or [ts, events, dp_rank], or a map
 * {"ts", "events", "data_parallel_rank"} (vLLM's EventBatch without
 * array_like). Each event is a positional array (vLLM <= 0.25, SGLang) or
 * a map with "type" (vLLM 0.26+), in any batch form:
 *  - vLLM  ["BlockStored", block_hashes, parent_block_hash, token_ids,
 *           block_size, lora_id, medium, lora_name, extra_keys, group_idx,
 *           kv_cache_spec_kind, kv_cache_spec_sliding_window, locality,
 *           ownership]
 *  - SGLang the same, except that slot 7 (vLLM's lora_name; the type tag
 *           is slot 0) may hold BlockStoredWithMetadata's metadata map
 *           ({"cache_salt": str});
 *  - in either format, a map past ownership (slot 14 on: SGLang's
 *    vLLM-aligned layout, kvtierd's own publisher) is that metadata map (in
 *    a vLLM stream a cache_salt there that is no string is unknown, not bad);
 *  - ["BlockRemoved", block_hashes, medium, group_idx, locality, ownership],
 *    ["AllBlocksCleared"]; trailing fields may be omitted.
 * A hash is a uint64, an int64 (taken as its two's-complement u64) or bin
 * bytes (1..64 of them; see kvt_ev_format_t). nil means absent for every
 * optional field. Unknown event types, unknown fields and extra positional
 * fields are skipped and counted in b->unknown (a stream must survive newer
 * engines). An event that does not decode becomes a KVT_EV_BAD event (its
 * reason goes to @err when @err is still empty) and the rest of the batch
 * decodes on. Events on an unknown medium or REMOTE are kept with their skip
 * reason. @pod and @model are borrowed: the batch points at them, so they
 * must outlive it. b->dp_rank is the payload's dp_rank when present, else
 * @dp_rank. On success fills *@b (caller cleans up). On failure *@b is
 * untouched and a one-line reason is written to @err (NUL-terminated, at
 * most @errlen bytes). Returns KVT_OK, KVT_ERR_PARSE (not one msgpack
 * value: truncated, trailing bytes, a reserved byte), KVT_ERR_INVAL (not a
 * batch), KVT_ERR_TOO_BIG (more than @max_items hashes and tokens) or
 * KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_ev_msgpack_decode(const void *payload, size_t len, kvt_ev_format_t fmt,
                                   const char *pod, const char *model, uint32_t dp_rank,
                                   size_t max_items, kvt_evbatch_t *b, char *err, size_t errlen);

/* What kvt_ev_apply() did; counters are added to, never reset. */
typedef struct kvt_ev_counters {
    uint64_t events;       /* events applied whole */
    uint64_t blocks;       /* block hashes applied */
    uint64_t unresolved;   /* hashes the pod did not know (removals, placeholder stores) */
    uint64_t orphans;      /* BlockStored whose parent the pod did not know: chained from block 0 */
    uint64_t dropped;      /* blocks not stored: the index budget was full and nothing evictable */
    uint64_t bad;          /* events that did not decode or apply (lenient mode): skipped */
    uint64_t state_drops;  /* pod state dropped because a bad event may have been a removal */
    uint64_t remote;       /* locality REMOTE events: skipped */
    uint64_t other_groups; /* events of a KV cache group kvtier does not index: skipped */
    uint64_t unknown_medium; /* events on a medium kvtier does not model: skipped */
    uint64_t recovered;      /* placeholder hashes resolved through recently removed blocks */
} kvt_ev_counters_t;

/* Adds every counter of @b to @a. */
void kvt_ev_counters_add(kvt_ev_counters_t *a, const kvt_ev_counters_t *b);

/*
 * Writer-side memory that outlives a batch, shared by every source of events:
 *  - per pod, the KV cache groups known not to be indexed (hybrid models),
 *    because a BlockRemoved names only its group_idx;
 *  - engine-hash -> key mappings of blocks recently removed from a pod, so a
 *    token-less CPU BlockStored that vLLM's offloading connector emits right
 *    after the GPU removal (same batch or a later one) still resolves. They
 *    are kept in a table of at most @removed_bytes bytes (oldest first out).
 */
typedef struct kvt_ev_ctx kvt_ev_ctx_t;

typedef struct kvt_ev_ctx_stats {
    uint64_t removed_capacity; /* mappings the budget holds (0 until the first is kept) */
    uint64_t removed_entries;  /* mappings held */
    uint64_t removed_bytes;    /* their table's bytes (<= the budget) */
    uint64_t removed_hits;     /* placeholder hashes resolved through them, ever */
    uint64_t removed_evicted;  /* mappings pushed out by newer ones, ever */
} kvt_ev_ctx_stats_t;

/*
 * Creates a context; @removed_bytes 0 keeps no removed mappings. *@ctx_p is
 * the caller's, freed with kvt_ev_ctx_destroy(). KVT_OK or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_ev_ctx_create(size_t removed_bytes, kvt_ev_ctx_t **ctx_p);
void kvt_ev_ctx_destroy(kvt_ev_ctx_t *ctx);

/* Forgets what @ctx knows of pod id @pod: call when the pod is dropped or its state is. */
void kvt_ev_ctx_pod_reset(kvt_ev_ctx_t *ctx, uint32_t pod);

void kvt_ev_ctx_stats(const kvt_ev_ctx_t *ctx, kvt_ev_ctx_stats_t *st);

/*
 * The removed mappings themselves (kvt_ev_apply() uses them; exposed for
 * tests and tools). put: remembers that @pod held block @key of namespace
 * @ns, chained from *@parent_key (NULL: none), under engine hash @ehash; a
 * mapping for the same (pod, hash) is replaced, and the oldest mapping goes
 * when the table is full; a @pod of KVT_IDX_MAX_PODS or more (no index's id)
 * is ignored. get: looks (@pod, @ehash) up; true with the outputs set. Both
 * are O(1); put allocates only on the first put and for a higher pod id.
 */
void kvt_ev_ctx_removed_put(kvt_ev_ctx_t *ctx, uint32_t pod, uint64_t ehash, uint32_t ns,
                            uint64_t key, const uint64_t *parent_key);
bool kvt_ev_ctx_removed_get(kvt_ev_ctx_t *ctx, uint32_t pod, uint64_t ehash, uint32_t *ns_p,
                            uint64_t *key_p, bool *has_parent_p, uint64_t *parent_p);

/* Mappings one removed-table entry costs, for sizing a budget: bytes per entry. */
#define KVT_EV_REMOVED_ENTRY_BYTES 48u

/*
 * Writer. Drops what pod (@pod, @dp_rank)'s engine reported (its
 * KVT_EV_ENGINE_TIERS) and the pod's removed mappings in @ctx (may be NULL):
 * what a stream does when it can no longer trust them (a restart, a gap it
 * cannot fill, a batch it cannot read). False when the pod is not registered.
 */
bool kvt_ev_drop_state(kvt_idx_t *idx, kvt_ev_ctx_t *ctx, const char *pod, uint32_t dp_rank);

/* kvt_ev_apply() flags. */
enum {
    /*
     * The whole batch is checked first: a BlockStored with tokens and no
     * model, or whose block size differs from its namespace's (for a
     * namespace the batch would create, from the batch's first event in
     * it), fails the batch with KVT_ERR_INVAL and nothing applied (the
     * HTTP/RPC API: a bad request changes nothing). Without it (engine streams) such an event is
     * skipped and counted as bad, and the rest is applied.
     */
    KVT_EV_STRICT = 1u << 0,
    /*
     * LoRA keys as NVIDIA Dynamo computes them (kvtierd --lora-keys dynamo):
     * a BlockStored of a LoRA (the event's lora_name, else the batch's; ""
     * is the base model) is keyed with kvt_hash_seeds_lora() seeds (LoRA
     * term in every block's seed, a cache salt's in block 0's) instead of the
     * standard's. Base-model keys do not change. Without it the LoRA only
     * names the namespace, and its keys are the standard's.
     */
    KVT_EV_LORA_DYNAMO = 1u << 1,
};

/*
 * Writer. Applies @b to @idx: registers the pod (b->pod, b->dp_rank) and the
 * namespace (model, LoRA) as needed. BlockStored with tokens computes keys
 * with the hashing standard, continuing from the parent's key when the pod
 * knows parent_block_hash, else from block 0 (with the event's cache salt);
 * without tokens it adds the tier to blocks the pod already knows by engine
 * hash (or recently removed, through @ctx). BlockRemoved drops the medium's
 * tier; AllBlocksCleared drops the pod's GPU tier. Skipped events (unknown
 * medium, REMOTE, a group that is not indexed, KVT_EV_BAD) are counted; a
 * KVT_EV_BAD that may have been a removal drops the pod's engine-reported
 * tiers (KVT_EV_ENGINE_TIERS) at that point, as a restart does. @ctx may be
 * NULL (no group memory, no removed mappings). @default_block_size is used
 * when an event has tokens but no block_size. @flags: KVT_EV_STRICT, KVT_EV_LORA_DYNAMO.
 * Returns KVT_OK, KVT_ERR_INVAL (strict check, with a one-line reason in
 * @err, @errlen bytes), or the first hard error (KVT_ERR_NO_MEM,
 * KVT_ERR_LIMIT, KVT_ERR_NO_SPACE, KVT_ERR_TOO_BIG); events before it stay
 * applied, and without KVT_EV_STRICT the pod's engine-reported state is then
 * dropped (what follows may have held removals).
 */
kvt_status_t kvt_ev_apply(kvt_idx_t *idx, kvt_ev_ctx_t *ctx, const kvt_evbatch_t *b,
                          uint32_t default_block_size, unsigned flags, kvt_ev_counters_t *c,
                          char *err, size_t errlen);

#endif
