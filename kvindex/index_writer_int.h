/*
 * kvindex/index_writer_int.h: the writer's private state and what its files
 * share: index.c (create, store, remove, speculate, stats), index_node.c
 * (nodes, holder sets, aliases, references), index_tab.c (the key table and
 * the per-pod engine-hash tables), index_names.c (pods, namespaces and their
 * names), index_mem.c (accounting, the budget, eviction, giving memory
 * back). Readers (query.c) see only index_int.h. Everything here is called
 * by the writer thread only.
 */
#ifndef KVT_KVINDEX_INDEX_WRITER_INT_H
#define KVT_KVINDEX_INDEX_WRITER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "kvindex/index_int.h"

#define ALIAS_BIT 0x80000000u
#define ALIAS_SPEC 0x1u /* alias flag: speculative mark */

#define KTAB_MIN_GROUPS 64u
#define PTAB_MIN_GROUPS 1u
#define SET_MIN 4u
#define DIR_MIN 16u

/*
 * Big, randomly probed arrays (node slabs, large key tables) sit on 2 MiB
 * transparent huge pages where the kernel allows it (THP "madvise" or
 * "always"): one TLB entry then covers 2 MiB, so a probe's miss is not
 * followed by a page walk, which costs most on virtual machines. All of it
 * is advice: without THP the memory is the same, on 4 KiB pages.
 */
#define KVT_HUGE ((size_t)2 << 20)

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older kernels answer EINVAL, which is ignored */
#endif

typedef struct kvt_alias {
    uint64_t ehash;  /* engine hash, or the spec marker of the key */
    uint32_t node;   /* node it refers to */
    uint32_t next;   /* next alias of the same node, or free-list link */
    uint32_t serial; /* bumped on every reuse; spec expiries check it */
    uint16_t pod;
    uint8_t tiers;
    uint8_t flags;
} kvt_alias_t;

typedef struct spec_item {
    uint64_t expiry; /* index clock, ms */
    uint32_t alias;
    uint32_t serial;
} spec_item_t;

typedef struct kvt_pod {
    char *name; /* NULL: id unused */
    size_t name_bytes;
    uint32_t dp_rank;
    uint32_t ngroups; /* engine-hash table groups (g != NULL) */
    uint32_t live, tomb;
    kvt_group_t *g; /* slots: node index, or ALIAS_BIT | alias index; NULL: no table */
    uint64_t entries;
    uint64_t last_write; /* index clock (ms) of its creation or last write */
} kvt_pod_t;

/* Writer-only part of a namespace slot (readers' part is kvt_ns_t). */
typedef struct ns_w {
    char *model; /* NULL: slot free */
    char *lora;
    uint64_t salt;
    uint64_t blocks;   /* live nodes whose side-array slot is this one */
    uint64_t last_use; /* index clock (ms) of its creation or last use */
    uint32_t id;       /* current id (NS_ID_FREE while free) */
    uint32_t block_size;
} ns_w_t;

/* Open-addressing map from a 64-bit name hash to a u32 id (pods, namespaces). */
typedef struct name_map {
    uint32_t mask, live, tomb;
    uint64_t *hash;
    uint32_t *id; /* NAME_EMPTY, NAME_TOMB or an id */
} name_map_t;
#define NAME_EMPTY UINT32_MAX
#define NAME_TOMB (UINT32_MAX - 1)

struct kvt_idx {
    kvt_idx_shared_t sh; /* must stay first: query.c reaches it by cast */
    kvt_idx_config_t cfg;
    uint64_t now_ms;
    uint64_t bytes; /* live allocations; retired ones are in sh.ebr.limbo_bytes */

    kvt_node_t **slabs; /* 2 MiB slabs; node chunk c is in slab c / NODE_SLAB_CHUNKS */
    uint32_t nslabs, slabs_cap;
    uint16_t **node_ns; /* per node chunk: each node's namespace slot (writer only) */
    uint32_t node_ns_cap;
    uint64_t trim_below; /* try giving back node slabs once live_nodes is at most this */

    uint32_t node_free;  /* free-list head */
    uint32_t nodes_used; /* node indices handed out so far */
    uint64_t live_nodes;
    uint32_t kt_live, kt_tomb;

    uint32_t *set_free; /* stack of free set handles */
    uint32_t nset_free, set_free_cap;
    uint32_t sets_used;

    kvt_alias_t *alias;
    uint32_t alias_used, alias_cap, alias_free;
    uint32_t alias_live;

    spec_item_t *spec; /* ring buffer, expiry order */
    size_t spec_head, spec_len, spec_cap;

    kvt_pod_t *pods;
    uint32_t pods_alloc;               /* entries of pods[] allocated */
    uint32_t pod_hi;                   /* ids < pod_hi have been handed out */
    uint64_t names_gen, names_pub_gen; /* bumped when a pod or namespace comes or goes; published */
    uint32_t *pod_free;
    uint32_t npod_free;
    name_map_t pod_map;
    name_map_t ns_map;

    ns_w_t *nsw; /* per namespace slot, nsw_cap allocated, sh.nns in use */
    uint32_t nsw_cap;
    uint32_t ns_live; /* namespaces not dropped */
    uint32_t ns_hw;   /* slots ever used: a slot below this gets a new generation */
    uint32_t ns_gen;  /* last generation handed to a reused slot */
    uint32_t ns_hint; /* no free slot below this */

    uint64_t entries, evicted, spec_live, dropped, refused;
    uint64_t tier_entries[3]; /* entries whose effective tiers include GPU, CPU, DISK */
    uint32_t npods_live;

    uint32_t pin[2];  /* nodes the current write must not lose to eviction */
    uint32_t pin_pod; /* pod whose table the current write has reserved room in */
    bool evicting;    /* guards against re-entering eviction */
};

/* ---- nodes -------------------------------------------------------------- */

static inline kvt_node_t *N(kvt_idx_t *idx, uint32_t nid)
{
    return dir_node(idx->sh.nodes, nid);
}

static inline void wbegin(kvt_idx_t *idx, uint32_t nid)
{
    uint32_t *s = &idx->sh.stripes[nid & (NSTRIPES - 1)];
    __atomic_store_n(s, *s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void wend(kvt_idx_t *idx, uint32_t nid)
{
    uint32_t *s = &idx->sh.stripes[nid & (NSTRIPES - 1)];
    __atomic_store_n(s, *s + 1, __ATOMIC_RELEASE);
}

static inline bool pinned(const kvt_idx_t *idx, uint32_t nid)
{
    return nid == idx->pin[0] || nid == idx->pin[1];
}

static inline size_t dir_bytes(uint32_t cap)
{
    return sizeof(kvt_dir_t) + (size_t)cap * sizeof(void *);
}

/* Bytes kvt_idx_dir_append() on @d allocates: a directory twice as big when @d is full. */
static inline size_t dir_grow_bytes(const kvt_dir_t *d)
{
    return d->n == d->cap ? dir_bytes(d->cap * 2) : 0;
}

/*
 * Node chunks are carved, NODE_SLAB_CHUNKS at a time, from 2 MiB-aligned
 * slabs. A slab is left on ordinary pages (only the chunks handed out are
 * touched, and counted) until its last chunk is handed out; then it is
 * collapsed into one huge page (MADV_COLLAPSE, Linux 6.1+; elsewhere it
 * stays as it is). Slabs at the end whose nodes are all free are given back
 * (nodes_trim()).
 */
#define NODE_SLAB_CHUNKS ((uint32_t)(KVT_HUGE / (NODE_CHUNK * sizeof(kvt_node_t))))
#define NODE_SLAB_NODES (NODE_SLAB_CHUNKS * NODE_CHUNK)
#define NODE_CHUNK_BYTES ((size_t)NODE_CHUNK * sizeof(kvt_node_t))
#define NODE_NS_BYTES ((size_t)NODE_CHUNK * sizeof(uint16_t))

/* Namespace slot of node @nid (side array). */
static inline uint16_t *node_ns(kvt_idx_t *idx, uint32_t nid)
{
    return &idx->node_ns[nid >> NODE_CHUNK_SHIFT][nid & (NODE_CHUNK - 1)];
}

/* ---- key table ------------------------------------------------------------ */

static inline size_t ktab_bytes(uint32_t groups)
{
    return sizeof(kvt_ktab_t) + (size_t)groups * sizeof(kvt_group_t);
}

static inline uint64_t ktab_cap(const kvt_ktab_t *t)
{
    return (uint64_t)t->ngroups * KVT_GRP_SLOTS;
}

/* Writer: group and slot of salted @key (whose kvt_mix64() is @h), or false. */
static inline bool ktab_find_h(kvt_idx_t *idx, const kvt_ktab_t *t, uint64_t key, uint64_t h,
                               uint32_t *gi_p, uint32_t *si_p)
{
    uint8_t tag = kvt_grp_tag(h);
    for (uint32_t gi = kvt_grp_home(h, t->ngroups);; gi = kvt_grp_next(gi, t->ngroups)) {
        const kvt_group_t *g = &t->g[gi];
        for (uint32_t m = kvt_grp_match(g, tag); m != 0; m &= m - 1) {
            uint32_t si = (uint32_t)__builtin_ctz(m);
            if (N(idx, g->slot[si])->key == key) {
                *gi_p = gi;
                *si_p = si;
                return true;
            }
        }
        if (kvt_grp_match(g, KVT_GRP_EMPTY) != 0)
            return false;
    }
}

static inline bool ktab_find(kvt_idx_t *idx, const kvt_ktab_t *t, uint64_t key, uint32_t *gi_p,
                             uint32_t *si_p)
{
    return ktab_find_h(idx, t, key, kvt_mix64(key), gi_p, si_p);
}

static inline uint32_t ktab_lookup_h(kvt_idx_t *idx, uint64_t key, uint64_t h)
{
    uint32_t gi, si;
    kvt_ktab_t *t = idx->sh.ktab;
    return ktab_find_h(idx, t, key, h, &gi, &si) ? t->g[gi].slot[si] : KVT_NIL;
}

static inline uint32_t ktab_lookup(kvt_idx_t *idx, uint64_t key)
{
    return ktab_lookup_h(idx, key, kvt_mix64(key));
}

/* Writer: inserts @nid under hash @h (kvt_mix64 of its salted key). */
static inline void ktab_put_h(kvt_ktab_t *t, uint64_t h, uint32_t nid)
{
    kvt_grp_put(t->g, t->ngroups, h, nid);
}

/* ---- holder sets ------------------------------------------------------------ */

static inline size_t set_bytes(uint32_t cap)
{
    return sizeof(kvt_podset_t) + (size_t)cap * sizeof(kvt_elem_t);
}

static inline kvt_podset_t *set_of(kvt_idx_t *idx, uint32_t pods)
{
    return *dir_set(idx->sh.sets, pods & ~PODS_SET_BIT);
}

/* Keeps the per-tier entry counts: an element's effective tiers went from @old to @new. */
static inline void tiers_moved(kvt_idx_t *idx, unsigned old, unsigned new_)
{
    for (unsigned t = 0; t < 3; t++)
        idx->tier_entries[t] += (uint64_t)((new_ >> t) & 1u) - (uint64_t)((old >> t) & 1u);
}

static inline uint64_t spec_marker(uint64_t key)
{
    return kvt_mix64(key ^ 0x5350454355u) ^ 0xa5a5a5a5a5a5a5a5ull;
}

/* ---- per-pod engine-hash tables ---------------------------------------- */

/* A slot of a pod table: group << 4 | index in group. */
#define PSLOT(gi, si) (((gi) << 4) | (si))
#define PREF(p, s_) ((p)->g[(s_) >> 4].slot[(s_)&15u])

static inline size_t ptab_bytes(uint32_t groups)
{
    return (size_t)groups * sizeof(kvt_group_t);
}

static inline uint64_t ref_ehash(kvt_idx_t *idx, uint32_t ref, bool *spec_p)
{
    if (ref & ALIAS_BIT) {
        kvt_alias_t *a = &idx->alias[ref & ~ALIAS_BIT];
        *spec_p = (a->flags & ALIAS_SPEC) != 0;
        return a->ehash;
    }
    *spec_p = false;
    return N(idx, ref)->ehash;
}

static inline uint32_t ref_node(kvt_idx_t *idx, uint32_t ref)
{
    return (ref & ALIAS_BIT) ? idx->alias[ref & ~ALIAS_BIT].node : ref;
}

/* Slot of engine hash @eh (hash @h = kvt_mix64(eh); a spec marker when @spec) in @p's table. */
static inline uint32_t ptab_find_h(kvt_idx_t *idx, kvt_pod_t *p, uint64_t eh, uint64_t h, bool spec)
{
    if (p->g == NULL)
        return KVT_NIL;
    uint8_t tag = kvt_grp_tag(h);
    for (uint32_t gi = kvt_grp_home(h, p->ngroups);; gi = kvt_grp_next(gi, p->ngroups)) {
        const kvt_group_t *g = &p->g[gi];
        for (uint32_t m = kvt_grp_match(g, tag); m != 0; m &= m - 1) {
            uint32_t si = (uint32_t)__builtin_ctz(m);
            bool is_spec;
            if (ref_ehash(idx, g->slot[si], &is_spec) == eh && is_spec == spec)
                return PSLOT(gi, si);
        }
        if (kvt_grp_match(g, KVT_GRP_EMPTY) != 0)
            return KVT_NIL;
    }
}

/* Slot of engine hash @eh (a spec marker when @spec) in @p's table, or KVT_NIL. */
static inline uint32_t ptab_find(kvt_idx_t *idx, kvt_pod_t *p, uint64_t eh, bool spec)
{
    return ptab_find_h(idx, p, eh, kvt_mix64(eh), spec);
}

static inline void ptab_insert(kvt_idx_t *idx, kvt_pod_t *p, uint32_t ref)
{
    bool spec;
    kvt_grp_put(p->g, p->ngroups, kvt_mix64(ref_ehash(idx, ref, &spec)), ref);
    p->live++;
}

static inline void ptab_delete(kvt_pod_t *p, uint32_t slot)
{
    p->live--;
    if (kvt_grp_erase(&p->g[slot >> 4], slot & 15u))
        p->tomb++;
}

/* Slot of current namespace id @ns into *@slot_p; false when @ns is not current. */
static inline bool ns_slot(const kvt_idx_t *idx, uint32_t ns, uint32_t *slot_p)
{
    uint32_t slot = NS_SLOT(ns);
    if (slot >= idx->sh.nns || idx->nsw[slot].id != ns)
        return false;
    *slot_p = slot;
    return true;
}

static inline kvt_pod_t *pod_live(kvt_idx_t *idx, uint32_t pod)
{
    if (pod >= idx->pod_hi || idx->pods[pod].name == NULL)
        return NULL;
    return &idx->pods[pod];
}

/* ---- memory: index_mem.c ---- */

void *kvt_idx_acct_alloc(kvt_idx_t *idx, size_t bytes);

/* A table of @bytes (>= KVT_HUGE), 2 MiB aligned; its whole 2 MiB pages get huge pages. */
void *kvt_idx_huge_alloc(size_t bytes);

void *kvt_idx_acct_calloc(kvt_idx_t *idx, size_t bytes);

void kvt_idx_acct_free(kvt_idx_t *idx, void *p, size_t bytes);

/* Hands @p to EBR: freed once readers are done; its bytes move to limbo. */
void kvt_idx_acct_retire(kvt_idx_t *idx, void *p, size_t bytes);

/*
 * True when block data growing by @extra bytes would break the budget (its
 * reserve, and the room to rebuild the key table, kept).
 */
bool kvt_idx_over_budget(kvt_idx_t *idx, uint64_t extra);

/*
 * True when rebuilding the key table with @groups groups fits the budget:
 * the new table is counted whole (the old one is retired, and a reader may
 * hold it for a while); a bigger one must also leave the room to rebuild it.
 */
bool kvt_idx_ktab_fits(kvt_idx_t *idx, uint32_t groups);

/*
 * Replaces the array *@arrp of @old_n elements of @elem bytes (@old_cap
 * allocated) with one of @cap, keeping the first @old_n. Counted. The old
 * array is freed (writer-only arrays). KVT_ERR_NO_MEM leaves it as it was.
 */
kvt_status_t kvt_idx_acct_resize(kvt_idx_t *idx, void **arrp, size_t elem, size_t old_n,
                                 size_t old_cap, size_t cap);

/* Appends a chunk pointer to a published directory, replacing the directory if full. */
kvt_status_t kvt_idx_dir_append(kvt_idx_t *idx, kvt_dir_t **dirp, void *chunk);

kvt_dir_t *kvt_idx_dir_new(kvt_idx_t *idx);

/* Evicts until @bytes more of block data fit the budget. False when they cannot. */
bool kvt_idx_room(kvt_idx_t *idx, size_t bytes);

void kvt_idx_node_strip(kvt_idx_t *idx, uint32_t nid);

/*
 * Evicts about 1/32 of the blocks (at least 16), strictly least recently used
 * leaf first: a parent whose last child goes becomes a leaf and competes with
 * its own age. Then shrinks tables that emptied. Returns nodes freed (0: none
 * could be: every leaf is pinned by the write in progress).
 */
size_t kvt_idx_evict_batch(kvt_idx_t *idx);

/* After a namespace drop: trailing free slots, their record chunks and writer entries go. */
void kvt_idx_ns_trim(kvt_idx_t *idx);

/* After a pod drop: trailing free pod ids go, and the pod arrays shrink with them. */
void kvt_idx_pods_trim(kvt_idx_t *idx);

/*
 * Replaces the pod array and the free-id stack with arrays of @cap entries
 * (cap >= pod_hi and npod_free), keeping ids below pod_hi and the free ids.
 * Counted, not budget-checked (callers ask first). KVT_ERR_NO_MEM leaves both.
 */
kvt_status_t kvt_idx_pods_resize(kvt_idx_t *idx, uint32_t cap);

/*
 * Replaces the speculative ring with one of @cap items (cap >= spec_len),
 * keeping its items in order from index 0. Counted, not budget-checked
 * (callers ask first). KVT_ERR_NO_MEM leaves it as it was.
 */
kvt_status_t kvt_idx_spec_resize(kvt_idx_t *idx, size_t cap);

/*
 * After drops (and when the index is empty): gives back what no longer holds
 * anything (stale speculative items, an unused alias array, emptied node
 * slabs and set chunks) and shrinks sparse tables. Only between writes.
 */
void kvt_idx_trim(kvt_idx_t *idx);

/*
 * Room for @bytes of pods' and namespaces' memory: what the budget has free,
 * the reserve (admin_reserve()) included but not the room kept for
 * rebuilding the key table, after giving back what drops left
 * (kvt_idx_trim(); between writes only). Blocks are not evicted for it: that
 * frees slab slots, not bytes, so it would empty much of the index before a
 * table shrank enough; past the reserve, creation is refused instead.
 */
bool kvt_idx_room_admin(kvt_idx_t *idx, size_t bytes);

/* ---- tables: index_tab.c ---- */

kvt_ktab_t *kvt_idx_ktab_new(kvt_idx_t *idx, uint32_t groups);

/*
 * Rebuilds the key table with @groups groups (dropping tombstones) and
 * publishes it. Reads the node slab in order rather than chasing the old
 * table's slots: every live node is in the table, and only they are.
 */
kvt_status_t kvt_idx_ktab_rebuild(kvt_idx_t *idx, uint32_t groups);

/* Makes room for one more key; may evict rather than grow past the budget. */
kvt_status_t kvt_idx_ktab_reserve(kvt_idx_t *idx);

void kvt_idx_ktab_delete(kvt_idx_t *idx, uint64_t key);

/* Makes room for one more reference in @pod's table; may evict rather than grow. */
kvt_status_t kvt_idx_ptab_reserve(kvt_idx_t *idx, uint32_t pod);

/* Shrinks @pod's table when it is mostly empty (after evictions or removals). */
void kvt_idx_ptab_maybe_shrink(kvt_idx_t *idx, kvt_pod_t *p);

/* ---- nodes and references: index_node.c ---- */

/*
 * Allocates a node index into *@nid_p; evicts instead of growing past the
 * budget. KVT_ERR_NO_SPACE when over budget with nothing evictable.
 */
kvt_status_t kvt_idx_node_alloc(kvt_idx_t *idx, uint32_t *nid_p);

/* Finds @pod among a node's holders: returns a pointer to its element or NULL. */
kvt_elem_t *kvt_idx_node_elem(kvt_idx_t *idx, kvt_node_t *n, uint32_t pod);

/* Frees @nid if it holds nothing and has no children, then its parents likewise. */
void kvt_idx_node_maybe_free(kvt_idx_t *idx, uint32_t nid);

/* Drops the reference in @pod's table slot @slot entirely; frees what it leaves empty. */
void kvt_idx_ref_drop(kvt_idx_t *idx, uint32_t pod, uint32_t slot);

/* Removes @tiers from the reference in @slot; drops it when no tier is left. */
void kvt_idx_ref_clear_tiers(kvt_idx_t *idx, uint32_t pod, uint32_t slot, unsigned tiers);

/* Adds a new alias reference (@eh, @tier) of @pod to @nid. */
kvt_status_t kvt_idx_alias_add(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh,
                               unsigned tier, bool spec, uint32_t *alias_p);

/* Records that @pod holds @nid in @tier under engine hash @eh (@ph = kvt_mix64(eh)). */
kvt_status_t kvt_idx_ref_add_h(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh, uint64_t ph,
                               unsigned tier);

kvt_status_t kvt_idx_ref_add(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh,
                             unsigned tier);

/* ---- names for readers: names.c ---- */

typedef struct kvt_names kvt_names_t;

/* A pod or namespace came or went: the next kvt_idx_names_publish() rebuilds the snapshot. */
void kvt_idx_names_changed(kvt_idx_t *idx);

/* Frees the published snapshot at destroy (no reader remains). */
void kvt_idx_names_free(kvt_idx_t *idx);

#endif
