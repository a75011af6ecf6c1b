/*
 * kvindex/index: which pods hold which prefix blocks, in which tiers.
 *
 * Entries are keyed by the 64-bit sequence key of the hashing standard
 * (kvindex/hash.h) inside a namespace (model, LoRA name). For every key the
 * index records the set of pods holding the block and, per pod, the tiers
 * (GPU, CPU, DISK) that hold it. Each pod also keeps a map from the engine's
 * own block hash to the key, so events that carry no tokens (removals, CPU
 * placeholder stores) can be applied.
 *
 * Concurrency: exactly one writer thread calls the functions marked "writer";
 * any number of reader threads, each with its own kvt_idx_reader_t, call
 * kvt_idx_query() at the same time without taking a lock shared with the
 * writer. docs/architecture.md describes the scheme (striped seqlocks plus
 * epoch-based reclamation).
 *
 * Memory: what the index allocates is counted (kvt_idx_stats_t.bytes):
 * blocks, tables, pods, namespaces and their names, and what it retired that
 * readers may still hold. Not counted: readers' own scratch
 * (kvt_idx_reader_t), the list of retired objects (24 bytes each, until
 * freed), the eviction heap (8 bytes per leaf block, freed before the
 * write that evicts returns) and the readers' names snapshot ("Names for
 * readers" below). With a budget, blocks
 * and their tables use at most 63/64 of it: before growing further the
 * writer evicts least-recently-used leaf blocks (blocks no other block
 * extends), so a chain is never cut in the middle; blocks that cannot be
 * made room for are not stored (kvt_idx_stats_t.dropped). The key table's
 * size is kept free too, to rebuild it. The last 1/64 is kept for pods,
 * namespaces and their names, which may also use whatever else is free (but
 * that room); creating one that does not fit fails with KVT_ERR_NO_SPACE
 * (kvt_idx_stats_t.refused) rather than evicting blocks, which would free
 * slab slots, not bytes. Dropping pods and namespaces returns their memory,
 * and what the index no longer needs after that.
 *
 * Namespace ids: a namespace's id is (generation << 16 | slot). Slots of
 * dropped namespaces are reused, under a new generation, so an id taken
 * before a drop never names the namespace that reuses its slot (until 65534
 * later reuses wrap the generation): queries with it answer nothing, writer
 * calls fail with KVT_ERR_INVAL or KVT_ERR_NOT_FOUND. A slot used for the
 * first time has generation 0, so without drops the ids are 0, 1, 2, ...
 */
#ifndef KVT_KVINDEX_INDEX_H
#define KVT_KVINDEX_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Tier bits; a (block, pod) entry holds a set of them. */
enum {
    KVT_TIER_GPU = 1u << 0,  /* engine HBM */
    KVT_TIER_CPU = 1u << 1,  /* host RAM (engine offload or kvtierd's arena) */
    KVT_TIER_DISK = 1u << 2, /* NVMe (kvtierd's store) */
    KVT_TIER_ALL = 7u,
};

/* Largest number of pods (engine, DP rank pairs) one index can hold. */
#define KVT_IDX_MAX_PODS 65534u
/* Largest number of namespaces one index holds at once. */
#define KVT_IDX_MAX_NS 65536u
/* No namespace: kvt_idx_ns_id() of a free slot; never a valid id. */
#define KVT_IDX_NS_NONE UINT32_MAX
/* Longest model or LoRA name, and longest pod name, in bytes. */
#define KVT_IDX_MAX_NAME 255u

typedef struct kvt_idx kvt_idx_t;
typedef struct kvt_idx_reader kvt_idx_reader_t;

/*
 * Called by the writer, inside the write call that caused it, for every
 * block evicted to stay within the budget, before its entries are dropped.
 * @salted_key is kvt_idx_salted_key() of the block's namespace and key. The
 * callback must not call the index's writer functions. It may query it
 * (kvt_idx_query() with a reader handle not in a query): eviction runs
 * between changes to nodes, never inside one, so the index it sees is whole
 * (blocks evicted before this one are gone, this one is still there).
 */
typedef void (*kvt_idx_evict_cb)(void *arg, uint64_t salted_key);

typedef struct kvt_idx_config {
    uint64_t budget_bytes;     /* 0: unbounded */
    uint32_t max_readers;      /* reader handles that may exist at once; 0: 64 */
    kvt_idx_evict_cb on_evict; /* may be NULL */
    void *on_evict_arg;
} kvt_idx_config_t;

/* Per-pod answer of a query. */
typedef struct kvt_idx_match {
    uint32_t pod;     /* dense pod id */
    uint32_t matched; /* consecutive blocks from block 0 held in any tier */
    uint32_t gpu;     /* of those, blocks whose fastest tier is GPU (speculative counts as GPU) */
    uint32_t cpu;     /* ... fastest tier CPU */
    uint32_t disk;    /* ... fastest tier DISK */
} kvt_idx_match_t;

typedef struct kvt_idx_stats {
    uint64_t blocks;      /* distinct keys (block nodes) */
    uint64_t entries;     /* (block, pod) entries */
    uint64_t bytes;       /* bytes the index has allocated (see Memory at the top) */
    uint64_t evicted;     /* block nodes evicted for the budget, ever */
    uint64_t dropped;     /* blocks not stored: budget full and nothing evictable, ever */
    uint64_t refused;     /* pods and namespaces not created: budget full, nothing evictable */
    uint64_t speculative; /* live speculative (block, pod) entries */
    /* entries held in GPU, CPU, DISK ([0] [1] [2]); one in two tiers counts in both */
    uint64_t tier_entries[3];
    uint32_t pods;       /* registered pods */
    uint32_t namespaces; /* live namespaces (dropped ones not counted) */
} kvt_idx_stats_t;

/*
 * Creates an empty index. @cfg may be NULL for defaults. On success *idx_p is
 * owned by the caller and freed with kvt_idx_destroy().
 * Returns KVT_OK, KVT_ERR_INVAL or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_idx_create(const kvt_idx_config_t *cfg, kvt_idx_t **idx_p);

/* Frees the index. All readers must have been destroyed first. NULL is a no-op. */
void kvt_idx_destroy(kvt_idx_t *idx);

/*
 * Writer. Finds or creates the namespace (@model, @lora). @lora NULL or "" is
 * the base model. @block_size is the model's block size in tokens; a
 * namespace keeps the block size it was created with, and asking for an
 * existing one with another non-zero size fails with KVT_ERR_INVAL. With
 * @block_size 0 the namespace must exist (KVT_ERR_NOT_FOUND otherwise).
 * Names longer than KVT_IDX_MAX_NAME: KVT_ERR_TOO_BIG. Creating one takes the
 * lowest free slot; KVT_ERR_LIMIT when KVT_IDX_MAX_NS are live,
 * KVT_ERR_NO_SPACE when its memory does not fit the budget (counted in
 * kvt_idx_stats_t.refused; see the budget note at the top).
 * Finding or creating it counts as a use (kvt_idx_ns_last_use()).
 */
kvt_status_t kvt_idx_ns_get(kvt_idx_t *idx, const char *model, const char *lora,
                            uint32_t block_size, uint32_t *ns_p);

/*
 * Writer. Drops namespace @ns: every pod forgets every block of it (entries,
 * engine hashes, aliases, speculative marks), its nodes and key-table slots
 * are freed, its names freed and its slot made reusable (under a new id).
 * Blocks it removes are not reported to on_evict. *@blocks_p (may be NULL)
 * gets the number of block nodes freed (kvt_idx_ns_blocks() before the drop).
 * Costs O(block nodes ever allocated), not only the namespace's: a scan of
 * the node slab. Returns KVT_OK or KVT_ERR_NOT_FOUND (not a current id).
 */
kvt_status_t kvt_idx_ns_drop(kvt_idx_t *idx, uint32_t ns, uint64_t *blocks_p);

/*
 * Any thread. Namespace slots: every live namespace's slot is below this.
 * Iterate slots with kvt_idx_ns_id() (writer), which skips free ones.
 */
uint32_t kvt_idx_ns_count(const kvt_idx_t *idx);

/* Writer. Current id of namespace slot @slot, or KVT_IDX_NS_NONE when the slot is free. */
uint32_t kvt_idx_ns_id(const kvt_idx_t *idx, uint32_t slot);

/*
 * Writer. Model name of namespace @ns and, in *@lora_p (may be NULL), its
 * LoRA name ("" for the base model); NULL for an id that is not current.
 * The strings stay valid until the namespace is dropped.
 */
const char *kvt_idx_ns_name(const kvt_idx_t *idx, uint32_t ns, const char **lora_p);

/* Writer. Block nodes of namespace @ns (blocks held, and chain links kept for them); 0 if unknown.
 */
uint64_t kvt_idx_ns_blocks(const kvt_idx_t *idx, uint32_t ns);

/*
 * Writer. Index-clock time (ms, kvt_idx_advance()) of namespace @ns's
 * creation or last use (kvt_idx_ns_get(), a store or a speculative mark in
 * it); 0 if unknown. With kvt_idx_ns_blocks() == 0, tells how long a
 * namespace has been empty and idle.
 */
uint64_t kvt_idx_ns_last_use(const kvt_idx_t *idx, uint32_t ns);

/* Writer. Every live pod id is below this (ids of dropped pods below it are reused first). */
uint32_t kvt_idx_pod_limit(const kvt_idx_t *idx);

/* Writer. Block size of namespace @ns, or 0 if @ns is not a current id. */
uint32_t kvt_idx_ns_block_size(const kvt_idx_t *idx, uint32_t ns);

/*
 * Writer. The key under which @key of namespace @ns is stored (keys are
 * salted per namespace so one table serves all); what on_evict reports. @key
 * itself when @ns is not a current id.
 */
uint64_t kvt_idx_salted_key(const kvt_idx_t *idx, uint32_t ns, uint64_t key);

/*
 * Writer. Finds or creates the pod (@name, @dp_rank) and returns its dense id.
 * Ids of dropped pods are reused. KVT_ERR_LIMIT past KVT_IDX_MAX_PODS,
 * KVT_ERR_NO_SPACE when the pod's memory does not fit the budget (counted in
 * kvt_idx_stats_t.refused; see the budget note at the top).
 * Creating a pod counts as a write (kvt_idx_pod_last_write()).
 */
kvt_status_t kvt_idx_pod_get(kvt_idx_t *idx, const char *name, uint32_t dp_rank, uint32_t *pod_p);

/* Writer. Looks up (@name, @dp_rank) without creating it; KVT_ERR_NOT_FOUND if absent. */
kvt_status_t kvt_idx_pod_find(const kvt_idx_t *idx, const char *name, uint32_t dp_rank,
                              uint32_t *pod_p);

/*
 * Writer. Name and DP rank of @pod. The name stays valid until the pod is
 * dropped. Returns NULL for an unknown id.
 */
const char *kvt_idx_pod_name(const kvt_idx_t *idx, uint32_t pod, uint32_t *dp_rank_p);

/* Writer. Number of (block, pod) entries @pod holds, speculative ones included. */
uint64_t kvt_idx_pod_entries(const kvt_idx_t *idx, uint32_t pod);

/*
 * Writer. Index-clock time (ms) of @pod's creation or last write naming it
 * (store, store by engine hash, remove, clear, speculate), hit or not; 0 for
 * an unknown id. A pod with no entries whose last write is old enough can be
 * forgotten with kvt_idx_pod_drop().
 */
uint64_t kvt_idx_pod_last_write(const kvt_idx_t *idx, uint32_t pod);

/*
 * Writer. The key (in namespace @ns) of the block @pod holds under engine
 * hash @ehash: how an event's parent_block_hash continues a chain.
 * KVT_ERR_NOT_FOUND when the pod does not know @ehash, KVT_ERR_INVAL for a
 * bad pod or namespace. (A pod's engine hashes are not per namespace: the
 * key is right when the block belongs to @ns.)
 */
kvt_status_t kvt_idx_pod_key(const kvt_idx_t *idx, uint32_t pod, uint32_t ns, uint64_t ehash,
                             uint64_t *key_p);

/*
 * Writer. Removes tiers @tiers from every entry of @pod (AllBlocksCleared is
 * @tiers = KVT_TIER_GPU; KVT_TIER_ALL also drops speculative entries). Costs
 * O(blocks the pod holds).
 */
kvt_status_t kvt_idx_pod_clear(kvt_idx_t *idx, uint32_t pod, unsigned tiers);

/*
 * Writer. Clears every tier of @pod and unregisters it; its id may be reused.
 * Its memory (tables, name) is freed, and memory the index no longer needs
 * after that (emptied node slabs, holder-set directories, sparse tables) is
 * returned too. KVT_ERR_NOT_FOUND for an unknown id.
 */
kvt_status_t kvt_idx_pod_drop(kvt_idx_t *idx, uint32_t pod);

/*
 * Writer. Records that @pod holds blocks @keys[0..n) in tier @tier (one bit).
 * keys[i] extends keys[i-1]; keys[0] extends *@parent_key when @parent_key is
 * not NULL (the parent need not be known). @ehashes[i] is the engine's block
 * hash for keys[i], used later by kvt_idx_remove() and
 * kvt_idx_store_by_ehash(); with @ehashes NULL the keys serve as engine
 * hashes. Storing what is already held only refreshes its recency.
 * With a budget, when no leaf other than this chain's own tail can be
 * evicted, the blocks that do not fit are not stored (the chain keeps its
 * prefix) and counted in kvt_idx_stats_t.dropped; that is still KVT_OK.
 * Returns KVT_OK, KVT_ERR_INVAL (bad ns, pod or tier), KVT_ERR_NO_MEM, or
 * KVT_ERR_LIMIT (the pod holds a block already under 127 other engine
 * hashes); on the last two the blocks before the failing one stay stored.
 */
kvt_status_t kvt_idx_store(kvt_idx_t *idx, uint32_t ns, uint32_t pod, unsigned tier,
                           const uint64_t *parent_key, const uint64_t *keys,
                           const uint64_t *ehashes, size_t n);

/*
 * Writer. Adds tier @tier to blocks @pod already holds under engine hashes
 * @ehashes (vLLM's CPU placeholder stores: no tokens). Hashes the pod does
 * not know are skipped and counted in *@unresolved_p (may be NULL).
 * Returns KVT_OK, KVT_ERR_INVAL (bad pod or tier), or, with the hashes
 * before the failing one applied: KVT_ERR_NO_SPACE (the budget has no room
 * and nothing is evictable), KVT_ERR_NO_MEM or KVT_ERR_LIMIT (as for
 * kvt_idx_store()).
 */
kvt_status_t kvt_idx_store_by_ehash(kvt_idx_t *idx, uint32_t pod, unsigned tier,
                                    const uint64_t *ehashes, size_t n, size_t *unresolved_p);

/*
 * Writer. Removes tiers @tiers from the blocks @pod holds under @ehashes. An
 * entry left with no tier is dropped. Unknown hashes are skipped and counted
 * in *@unresolved_p (may be NULL).
 */
kvt_status_t kvt_idx_remove(kvt_idx_t *idx, uint32_t pod, unsigned tiers, const uint64_t *ehashes,
                            size_t n, size_t *unresolved_p);

/* A block a pod no longer holds under an engine hash (kvt_idx_remove_report()). */
typedef struct kvt_idx_gone {
    uint64_t ehash;      /* the engine hash removed */
    uint64_t key;        /* the block's sequence key (unsalted) */
    uint64_t parent_key; /* its parent block's sequence key (unsalted), when has_parent */
    uint32_t ns;         /* the block's namespace id */
    uint32_t has_parent; /* 1 when the index knows the block's parent, else 0 */
} kvt_idx_gone_t;

/*
 * Writer. kvt_idx_remove(), and for every hash of @ehashes whose last tier
 * on @pod went (the pod no longer knows the hash: its entry was dropped, or
 * kept only through another of the pod's hashes for the same block), in
 * order, one element of @gone (capacity @n, may be NULL when @n is 0 or no
 * report is wanted): what the hash named, so a token-less store of the same
 * hash that follows (vLLM offloading a block it just evicted from GPU) can
 * still be resolved. *@ngone_p (may be NULL) gets the count. Allocates
 * nothing.
 */
kvt_status_t kvt_idx_remove_report(kvt_idx_t *idx, uint32_t pod, unsigned tiers,
                                   const uint64_t *ehashes, size_t n, size_t *unresolved_p,
                                   kvt_idx_gone_t *gone, size_t *ngone_p);

/*
 * Writer. A router's decision before the engine reports it: @pod will hold
 * @keys[0..n) (a chain from block 0). The entries count as GPU in queries
 * until the engine's own store confirms them or @ttl_ms passes on the index
 * clock, whichever comes first; re-announcing does not extend the TTL.
 */
kvt_status_t kvt_idx_speculate(kvt_idx_t *idx, uint32_t ns, uint32_t pod, const uint64_t *keys,
                               size_t n, uint32_t ttl_ms);

/*
 * Writer. Advances the index clock to @now_ms (milliseconds, any monotonic
 * origin). Only a later value moves the clock, and only then do speculative
 * entries whose expiry is <= @now_ms go. Also frees memory readers no longer
 * use. Call it regularly (the daemon does every few
 * milliseconds). Recency for LRU eviction is measured on this clock.
 */
void kvt_idx_advance(kvt_idx_t *idx, uint64_t now_ms);

/*
 * Writer. Current counters. (Other threads need a copy the writer publishes:
 * the daemon does that.)
 */
void kvt_idx_stats(const kvt_idx_t *idx, kvt_idx_stats_t *st);

/*
 * Any thread. Creates a reader handle for one thread's queries. Fails with
 * KVT_ERR_LIMIT when max_readers handles exist. Destroy before the index.
 */
kvt_status_t kvt_idx_reader_create(kvt_idx_t *idx, kvt_idx_reader_t **reader_p);
void kvt_idx_reader_destroy(kvt_idx_reader_t *reader);

/*
 * Reader (one thread per handle). For the chain @keys[0..n) in namespace
 * @ns (an id that may have gone stale: then nothing matches), finds every pod holding keys[0] and
 * the length of its run of consecutive blocks from block 0, split by fastest tier. With @pods not
 * NULL only those @npods pod ids are considered. Stops as soon as no pod can extend its run.
 * *@res_p points at *@nres_p results in no particular order, owned by the reader and valid until
 * its next query. Does not allocate once the reader has seen the index's pod count. Returns KVT_OK
 * (zero results when nothing matches or @ns is not a current id) or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_idx_query(kvt_idx_reader_t *reader, uint32_t ns, const uint64_t *keys, size_t n,
                           const uint32_t *pods, size_t npods, const kvt_idx_match_t **res_p,
                           size_t *nres_p);

/* ---- names for readers ------------------------------------------------------------- */

/*
 * Readers resolve names through an immutable snapshot of the index's pods and
 * namespaces that the writer publishes with kvt_idx_names_publish(): a query
 * goes from names to ids to blocks and back to names without the writer. The
 * snapshot is not counted in bytes (a copy of the names, about 40 bytes a pod
 * or namespace besides them, which are counted): it is what the daemon's own
 * registry was before the index owned its names, and counting it, with the
 * copies a flood of new pods retires, would refuse names the budget admits.
 */

/*
 * Writer. Publishes the snapshot when a pod or namespace came or went since
 * the last call (cheap otherwise). Until a first call, readers find no names.
 * KVT_ERR_NO_MEM keeps the previous snapshot.
 */
kvt_status_t kvt_idx_names_publish(kvt_idx_t *idx);

/*
 * Reader. Opens a read section: the names snapshot (and every table a query
 * reads) stays as it is until kvt_idx_read_end(); kvt_idx_query() calls and
 * the lookups below happen inside. Sections do not nest; keep them short
 * (one request): the writer frees nothing a section could still see.
 */
void kvt_idx_read_begin(kvt_idx_reader_t *reader);
void kvt_idx_read_end(kvt_idx_reader_t *reader);

/* Inside a read section: the id and block size of namespace (@model, @lora) (@lora "" for the
 * base model), false when the snapshot has none. */
bool kvt_idx_ns_lookup(const kvt_idx_reader_t *reader, const char *model, size_t mlen,
                       const char *lora, size_t llen, uint32_t *ns_p, uint32_t *block_size_p);

/* Inside a read section: writes to @out (up to @cap) the id of every pod named @name (each DP
 * rank is a pod); returns how many. */
size_t kvt_idx_pods_named(const kvt_idx_reader_t *reader, const char *name, size_t len,
                          uint32_t *out, size_t cap);

/* A pod as the snapshot names it; pointers valid until kvt_idx_read_end(). */
typedef struct kvt_idx_pod_view {
    const char *name; /* NUL-terminated */
    uint32_t name_len;
    const char *json; /* the name as a JSON string (quoted, escaped), not NUL-terminated */
    uint32_t json_len;
    uint32_t dp_rank;
} kvt_idx_pod_view_t;

/* Inside a read section: pod id @pod's names, false when the snapshot has no such pod (a pod
 * registered after it, or one dropped). */
bool kvt_idx_pod_view(const kvt_idx_reader_t *reader, uint32_t pod, kvt_idx_pod_view_t *view);

/* Inside a read section: pod ids of the snapshot are below this. */
uint32_t kvt_idx_names_pods(const kvt_idx_reader_t *reader);

#endif
