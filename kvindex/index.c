/*
 * kvindex/index.c: the writer side of the index. See index_int.h for the
 * layout and docs/architecture.md for the reasoning.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvindex/index_int.h"

#define ALIAS_BIT 0x80000000u
#define ALIAS_SPEC 0x1u /* alias flag: speculative mark */

#define KTAB_MIN_GROUPS 64u
#define PTAB_MIN_GROUPS 1u
#define SET_MIN 4u
#define DIR_MIN 16u

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
    uint32_t pods_alloc; /* entries of pods[] allocated */
    uint32_t pod_hi;     /* ids < pod_hi have been handed out */
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

/* ---- accounting and counters ------------------------------------------ */

static void *acct_alloc(kvt_idx_t *idx, size_t bytes)
{
    void *p = malloc(bytes);
    if (p != NULL)
        idx->bytes += bytes;
    return p;
}

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

/* A table of @bytes (>= KVT_HUGE), 2 MiB aligned; its whole 2 MiB pages get huge pages. */
static void *huge_alloc(size_t bytes)
{
    void *p;
    if (posix_memalign(&p, KVT_HUGE, bytes) != 0)
        return NULL;
    (void)madvise(p, bytes & ~(KVT_HUGE - 1), MADV_HUGEPAGE);
    return p;
}

static void *acct_calloc(kvt_idx_t *idx, size_t bytes)
{
    void *p = calloc(1, bytes);
    if (p != NULL)
        idx->bytes += bytes;
    return p;
}

static void acct_free(kvt_idx_t *idx, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    free(p);
    idx->bytes -= bytes;
}

/* Hands @p to EBR: freed once readers are done; its bytes move to limbo. */
static void acct_retire(kvt_idx_t *idx, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    idx->bytes -= bytes;
    kvt_ebr_retire(&idx->sh.ebr, p, bytes);
}

static uint64_t total_bytes(const kvt_idx_t *idx)
{
    return idx->bytes + idx->sh.ebr.limbo_bytes;
}

/*
 * True when growing by @extra bytes would leave less than @keep of the budget
 * free. Retired memory counts until it is freed, so first free what readers
 * no longer hold.
 */
static bool over_limit(kvt_idx_t *idx, uint64_t extra, uint64_t keep)
{
    uint64_t budget = idx->cfg.budget_bytes;
    if (budget == 0 || total_bytes(idx) + extra + keep <= budget)
        return false;
    if (idx->sh.ebr.limbo_bytes == 0)
        return true;
    kvt_ebr_reclaim(&idx->sh.ebr);
    return total_bytes(idx) + extra + keep > budget;
}

/*
 * Evicting a block frees its node's slot in the slab and its table slots,
 * but returns bytes only when a table shrinks (below 1/8 full) or the slab's
 * tail empties: making room for anything but blocks by eviction alone would
 * evict most of the index. So blocks and their tables (node chunks, key and
 * pod tables, holder sets, aliases, the speculative ring) leave this much of
 * the budget free, for pods, namespaces and their names and maps.
 */
static uint64_t admin_reserve(const kvt_idx_t *idx)
{
    return idx->cfg.budget_bytes / 64;
}

/* True when block data growing by @extra bytes would break the budget (its reserve kept). */
static bool over_budget(kvt_idx_t *idx, uint64_t extra)
{
    return over_limit(idx, extra, admin_reserve(idx));
}

/*
 * Replaces the array *@arrp of @old_n elements of @elem bytes (@old_cap
 * allocated) with one of @cap, keeping the first @old_n. Counted. The old
 * array is freed (writer-only arrays). KVT_ERR_NO_MEM leaves it as it was.
 */
static kvt_status_t acct_resize(kvt_idx_t *idx, void **arrp, size_t elem, size_t old_n,
                                size_t old_cap, size_t cap)
{
    void *na = NULL;
    if (cap > 0) {
        na = acct_alloc(idx, cap * elem);
        if (na == NULL)
            return KVT_ERR_NO_MEM;
        if (old_n > 0)
            memcpy(na, *arrp, (old_n < cap ? old_n : cap) * elem);
    }
    acct_free(idx, *arrp, old_cap * elem);
    *arrp = na;
    return KVT_OK;
}

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

static size_t dir_bytes(uint32_t cap)
{
    return sizeof(kvt_dir_t) + (size_t)cap * sizeof(void *);
}

/* Appends a chunk pointer to a published directory, replacing the directory if full. */
static kvt_status_t dir_append(kvt_idx_t *idx, kvt_dir_t **dirp, void *chunk)
{
    kvt_dir_t *d = *dirp;
    if (d->n == d->cap) {
        uint32_t cap = d->cap * 2;
        kvt_dir_t *nd = acct_calloc(idx, dir_bytes(cap)); /* unused entries stay NULL */
        if (nd == NULL)
            return KVT_ERR_NO_MEM;
        nd->n = d->n;
        nd->cap = cap;
        memcpy(nd->chunk, d->chunk, (size_t)d->n * sizeof(void *));
        __atomic_store_n(dirp, nd, __ATOMIC_RELEASE);
        acct_retire(idx, d, dir_bytes(d->cap));
        d = nd;
    }
    __atomic_store_n(&d->chunk[d->n], chunk, __ATOMIC_RELEASE);
    d->n++;
    return KVT_OK;
}

static kvt_dir_t *dir_new(kvt_idx_t *idx)
{
    kvt_dir_t *d = acct_calloc(idx, dir_bytes(DIR_MIN));
    if (d != NULL)
        d->cap = DIR_MIN;
    return d;
}

/* Bytes dir_append() on @d allocates: a directory twice as big when @d is full. */
static size_t dir_grow_bytes(const kvt_dir_t *d)
{
    return d->n == d->cap ? dir_bytes(d->cap * 2) : 0;
}

static size_t evict_batch(kvt_idx_t *idx);
static bool room(kvt_idx_t *idx, size_t bytes);

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

/* Bytes node_chunk_add() allocates (the chunk, its side array and any array that must grow). */
static size_t node_chunk_need(const kvt_idx_t *idx)
{
    uint32_t c = idx->sh.nodes->n;
    size_t need = NODE_CHUNK_BYTES + NODE_NS_BYTES + dir_grow_bytes(idx->sh.nodes);
    if (c == idx->node_ns_cap)
        need += (size_t)(idx->node_ns_cap ? idx->node_ns_cap * 2 : 16) * sizeof(uint16_t *);
    if (c % NODE_SLAB_CHUNKS == 0 && idx->nslabs == idx->slabs_cap)
        need += (size_t)(idx->slabs_cap ? idx->slabs_cap * 2 : 8) * sizeof(kvt_node_t *);
    return need;
}

/* Appends node chunk number sh.nodes->n (free nodes), its side array, and publishes it. */
static kvt_status_t node_chunk_add(kvt_idx_t *idx)
{
    uint32_t c = idx->sh.nodes->n;
    if (c == idx->node_ns_cap) {
        uint32_t ncap = idx->node_ns_cap ? idx->node_ns_cap * 2 : 16;
        if (acct_resize(idx, (void **)&idx->node_ns, sizeof(uint16_t *), c, idx->node_ns_cap,
                        ncap) != KVT_OK)
            return KVT_ERR_NO_MEM;
        idx->node_ns_cap = ncap;
    }
    if (c % NODE_SLAB_CHUNKS == 0 && c / NODE_SLAB_CHUNKS == idx->nslabs) {
        if (idx->nslabs == idx->slabs_cap) {
            uint32_t ncap = idx->slabs_cap ? idx->slabs_cap * 2 : 8;
            if (acct_resize(idx, (void **)&idx->slabs, sizeof(kvt_node_t *), idx->nslabs,
                            idx->slabs_cap, ncap) != KVT_OK)
                return KVT_ERR_NO_MEM;
            idx->slabs_cap = ncap;
        }
        kvt_node_t *slab = aligned_alloc(KVT_HUGE, KVT_HUGE);
        if (slab == NULL)
            return KVT_ERR_NO_MEM;
        idx->slabs[idx->nslabs++] = slab;
    }
    uint16_t *nsc = acct_alloc(idx, NODE_NS_BYTES);
    if (nsc == NULL)
        return KVT_ERR_NO_MEM; /* the slab stays for the next try */
    kvt_node_t *chunk =
        idx->slabs[c / NODE_SLAB_CHUNKS] + (size_t)(c % NODE_SLAB_CHUNKS) * NODE_CHUNK;
    for (uint32_t i = 0; i < NODE_CHUNK; i++)
        chunk[i].pods = PODS_FREE;
    if (dir_append(idx, &idx->sh.nodes, chunk) != KVT_OK) {
        acct_free(idx, nsc, NODE_NS_BYTES);
        return KVT_ERR_NO_MEM;
    }
    idx->bytes += NODE_CHUNK_BYTES;
    idx->node_ns[c] = nsc;
    if (c % NODE_SLAB_CHUNKS == NODE_SLAB_CHUNKS - 1)
        (void)madvise(idx->slabs[c / NODE_SLAB_CHUNKS], KVT_HUGE, MADV_COLLAPSE);
    idx->trim_below = UINT64_MAX; /* nodes may empty at the end again */
    return KVT_OK;
}

/*
 * Allocates a node index into *@nid_p; evicts instead of growing past the
 * budget. KVT_ERR_NO_SPACE when over budget with nothing evictable.
 */
static kvt_status_t node_alloc(kvt_idx_t *idx, uint32_t *nid_p)
{
    while (idx->node_free == KVT_NIL && idx->nodes_used % NODE_CHUNK == 0) {
        if (over_budget(idx, node_chunk_need(idx))) {
            if (evict_batch(idx) == 0)
                return KVT_ERR_NO_SPACE;
            continue;
        }
        if (idx->nodes_used >= 0x7fffffffu - NODE_CHUNK)
            return KVT_ERR_NO_SPACE;
        kvt_status_t st = node_chunk_add(idx);
        if (st != KVT_OK)
            return st;
        break;
    }
    uint32_t nid;
    if (idx->node_free != KVT_NIL) {
        nid = idx->node_free;
        idx->node_free = N(idx, nid)->parent;
    } else {
        nid = idx->nodes_used++;
    }
    *nid_p = nid;
    return KVT_OK;
}

/* ---- key table ------------------------------------------------------------ */

static size_t ktab_bytes(uint32_t groups)
{
    return sizeof(kvt_ktab_t) + (size_t)groups * sizeof(kvt_group_t);
}

static uint64_t ktab_cap(const kvt_ktab_t *t)
{
    return (uint64_t)t->ngroups * KVT_GRP_SLOTS;
}

static kvt_ktab_t *ktab_new(kvt_idx_t *idx, uint32_t groups)
{
    size_t bytes = ktab_bytes(groups);
    kvt_ktab_t *t = bytes >= KVT_HUGE ? huge_alloc(bytes) : aligned_alloc(64, bytes);
    if (t == NULL)
        return NULL;
    idx->bytes += bytes;
    memset(t, 0, sizeof(*t));
    t->ngroups = groups;
    kvt_grp_init(t->g, groups);
    return t;
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

static bool ktab_find(kvt_idx_t *idx, const kvt_ktab_t *t, uint64_t key, uint32_t *gi_p,
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

static uint32_t ktab_lookup(kvt_idx_t *idx, uint64_t key)
{
    return ktab_lookup_h(idx, key, kvt_mix64(key));
}

/* Writer: inserts @nid under hash @h (kvt_mix64 of its salted key). */
static inline void ktab_put_h(kvt_ktab_t *t, uint64_t h, uint32_t nid)
{
    kvt_grp_put(t->g, t->ngroups, h, nid);
}

/*
 * Rebuilds the key table with @groups groups (dropping tombstones) and
 * publishes it. Reads the node slab in order rather than chasing the old
 * table's slots: every live node is in the table, and only they are.
 */
static kvt_status_t ktab_rebuild(kvt_idx_t *idx, uint32_t groups)
{
    kvt_ktab_t *old = idx->sh.ktab;
    kvt_ktab_t *t = ktab_new(idx, groups);
    if (t == NULL)
        return KVT_ERR_NO_MEM;
    kvt_dir_t *d = idx->sh.nodes;
    /* the reads stream; the writes land at random: hash AHEAD early, fetch, then put */
    enum { AHEAD = 16 };
    uint64_t ring[AHEAD];
    for (uint32_t c = 0; c < d->n; c++) {
        kvt_node_t *chunk = d->chunk[c];
        uint32_t end = idx->nodes_used - c * NODE_CHUNK;
        if (end > NODE_CHUNK)
            end = NODE_CHUNK;
        for (uint32_t i = 0; i < end && i < AHEAD; i++) {
            ring[i] = chunk[i].pods != PODS_FREE ? kvt_mix64(chunk[i].key) : 0;
            __builtin_prefetch(&t->g[kvt_grp_home(ring[i], groups)]);
        }
        for (uint32_t i = 0; i < end; i++) {
            uint64_t h = ring[i % AHEAD];
            if (i + AHEAD < end) {
                /* a free node's key is stale or unset: not hashed */
                uint64_t ha =
                    chunk[i + AHEAD].pods != PODS_FREE ? kvt_mix64(chunk[i + AHEAD].key) : 0;
                ring[(i + AHEAD) % AHEAD] = ha;
                __builtin_prefetch(&t->g[kvt_grp_home(ha, groups)]);
            }
            if (chunk[i].pods != PODS_FREE)
                kvt_grp_put(t->g, groups, h, c * NODE_CHUNK + i);
        }
    }
    __atomic_store_n(&idx->sh.ktab, t, __ATOMIC_RELEASE);
    acct_retire(idx, old, ktab_bytes(old->ngroups));
    idx->kt_tomb = 0;
    return KVT_OK;
}

/* Makes room for one more key; may evict rather than grow past the budget. */
static kvt_status_t ktab_reserve(kvt_idx_t *idx)
{
    for (;;) {
        uint64_t cap = ktab_cap(idx->sh.ktab);
        uint32_t groups = idx->sh.ktab->ngroups;
        if ((uint64_t)(idx->kt_live + idx->kt_tomb + 1) * 8 <= cap * 7)
            return KVT_OK;
        if ((uint64_t)(idx->kt_live + 1) * 4 <= cap * 3)
            return ktab_rebuild(idx, groups);
        if (groups >= 0x40000000u)
            return KVT_ERR_NO_SPACE;
        if (!over_budget(idx, ktab_bytes(kvt_grp_grow(groups) - groups)))
            return ktab_rebuild(idx, kvt_grp_grow(groups));
        if (evict_batch(idx) == 0)
            return KVT_ERR_NO_SPACE;
    }
}

static void ktab_delete(kvt_idx_t *idx, uint64_t key)
{
    kvt_ktab_t *t = idx->sh.ktab;
    uint32_t gi, si;
    if (!ktab_find(idx, t, key, &gi, &si))
        return;
    idx->kt_live--;
    if (kvt_grp_erase(&t->g[gi], si))
        idx->kt_tomb++;
}

/* ---- holder sets ------------------------------------------------------------ */

static size_t set_bytes(uint32_t cap)
{
    return sizeof(kvt_podset_t) + (size_t)cap * sizeof(kvt_elem_t);
}

static kvt_podset_t *set_of(kvt_idx_t *idx, uint32_t pods)
{
    return *dir_set(idx->sh.sets, pods & ~PODS_SET_BIT);
}

/* Evicts until @bytes more of block data fit the budget. False when they cannot. */
static bool room(kvt_idx_t *idx, size_t bytes)
{
    while (over_budget(idx, bytes))
        if (evict_batch(idx) == 0)
            return false;
    return true;
}

/* Never evicts: callers make room first, outside any wbegin/wend bracket. */
static kvt_podset_t *set_new(kvt_idx_t *idx, uint32_t cap)
{
    kvt_podset_t *s = acct_alloc(idx, set_bytes(cap));
    if (s == NULL)
        return NULL;
    s->n = 0;
    s->cap = cap;
    s->alias_head = KVT_NIL;
    s->pad = 0;
    return s;
}

/*
 * Makes sure set_handle_alloc() has a handle to give without allocating: a
 * chunk of handles comes with room in the free-handle stack for all of them,
 * so freeing a handle (during eviction too) never allocates either. May
 * evict, so it is called before a write bracket (wbegin/wend), never inside.
 * KVT_ERR_NO_SPACE or KVT_ERR_NO_MEM when no chunk can be added.
 */
static kvt_status_t set_handle_reserve(kvt_idx_t *idx)
{
    if (idx->nset_free > 0 || idx->sets_used < idx->sh.sets->n * SET_CHUNK)
        return KVT_OK;
    size_t chunk_bytes = SET_CHUNK * sizeof(kvt_podset_t *);
    uint32_t fcap = idx->sets_used + SET_CHUNK;
    size_t need = chunk_bytes + dir_grow_bytes(idx->sh.sets) +
                  (fcap > idx->set_free_cap ? (size_t)fcap * sizeof(uint32_t) : 0);
    if (!room(idx, need))
        return KVT_ERR_NO_SPACE;
    if (idx->nset_free > 0)
        return KVT_OK; /* eviction freed one */
    /* the new chunk's handles: sets_used .. sets_used + SET_CHUNK - 1 */
    if (fcap > idx->set_free_cap) {
        if (acct_resize(idx, (void **)&idx->set_free, sizeof(uint32_t), idx->nset_free,
                        idx->set_free_cap, fcap) != KVT_OK)
            return KVT_ERR_NO_MEM;
        idx->set_free_cap = fcap;
    }
    kvt_podset_t **c = acct_calloc(idx, chunk_bytes);
    if (c == NULL)
        return KVT_ERR_NO_MEM;
    if (dir_append(idx, &idx->sh.sets, c) != KVT_OK) {
        acct_free(idx, c, chunk_bytes);
        return KVT_ERR_NO_MEM;
    }
    return KVT_OK;
}

/* A free set handle; set_handle_reserve() must have succeeded since the last one. */
static uint32_t set_handle_alloc(kvt_idx_t *idx)
{
    if (idx->nset_free > 0)
        return idx->set_free[--idx->nset_free];
    return idx->sets_used++;
}

static void set_handle_free(kvt_idx_t *idx, uint32_t h)
{
    idx->set_free[idx->nset_free++] = h; /* set_free_cap >= sets_used */
}

/* Finds @pod among a node's holders: returns a pointer to its element or NULL. */
static kvt_elem_t *node_elem(kvt_idx_t *idx, kvt_node_t *n, uint32_t pod)
{
    if (n->pods == PODS_EMPTY || n->pods == PODS_FREE)
        return NULL;
    if (!(n->pods & PODS_SET_BIT))
        return ELEM_POD(n->pods) == pod ? &n->pods : NULL;
    kvt_podset_t *s = set_of(idx, n->pods);
    uint32_t lo = 0, hi = s->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        uint32_t p = ELEM_POD(s->e[mid]);
        if (p == pod)
            return &s->e[mid];
        if (p < pod)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static inline void elem_store(kvt_elem_t *e, kvt_elem_t v)
{
    __atomic_store_n(e, v, __ATOMIC_RELAXED);
}

/* Moves a node's holders into a new set of @cap; publishes it. Caller brackets with wbegin/wend. */
static kvt_status_t node_to_set(kvt_idx_t *idx, uint32_t nid, uint32_t cap)
{
    kvt_node_t *n = N(idx, nid);
    kvt_podset_t *s = set_new(idx, cap);
    if (s == NULL)
        return KVT_ERR_NO_MEM;
    if (n->pods & PODS_SET_BIT) {
        kvt_podset_t *old = set_of(idx, n->pods);
        memcpy(s->e, old->e, (size_t)old->n * sizeof(kvt_elem_t));
        s->n = old->n;
        s->alias_head = old->alias_head;
        __atomic_store_n(dir_set(idx->sh.sets, n->pods & ~PODS_SET_BIT), s, __ATOMIC_RELEASE);
        acct_retire(idx, old, set_bytes(old->cap));
        return KVT_OK;
    }
    uint32_t h = set_handle_alloc(idx);
    if (n->pods != PODS_EMPTY)
        s->e[s->n++] = n->pods;
    __atomic_store_n(dir_set(idx->sh.sets, h), s, __ATOMIC_RELEASE);
    __atomic_store_n(&n->pods, PODS_SET_BIT | h, __ATOMIC_RELEASE);
    return KVT_OK;
}

/* Adds holder element @e (pod not yet present). @force_set keeps it in a set. */
/* Keeps the per-tier entry counts: an element's effective tiers went from @old to @new. */
static inline void tiers_moved(kvt_idx_t *idx, unsigned old, unsigned new_)
{
    for (unsigned t = 0; t < 3; t++)
        idx->tier_entries[t] += (uint64_t)((new_ >> t) & 1u) - (uint64_t)((old >> t) & 1u);
}

static kvt_status_t node_elem_add(kvt_idx_t *idx, uint32_t nid, kvt_elem_t e, bool force_set)
{
    kvt_node_t *n = N(idx, nid);
    kvt_status_t st = KVT_OK;
    uint32_t need = 0;
    if (!(n->pods & PODS_SET_BIT))
        need = (n->pods == PODS_EMPTY && !force_set) ? 0 : SET_MIN;
    else if (set_of(idx, n->pods)->n == set_of(idx, n->pods)->cap)
        need = set_of(idx, n->pods)->cap * 2;
    /* before the bracket: eviction bumps stripes too */
    if (need != 0 && !room(idx, set_bytes(need)))
        return KVT_ERR_NO_SPACE;
    if (!(n->pods & PODS_SET_BIT) && need != 0) {
        kvt_status_t hs = set_handle_reserve(idx);
        if (hs != KVT_OK)
            return hs;
    }
    wbegin(idx, nid);
    if (n->pods == PODS_EMPTY && !force_set) {
        __atomic_store_n(&n->pods, e, __ATOMIC_RELAXED);
        goto out;
    }
    if (!(n->pods & PODS_SET_BIT)) {
        st = node_to_set(idx, nid, SET_MIN);
        if (st != KVT_OK)
            goto out;
    }
    kvt_podset_t *s = set_of(idx, n->pods);
    if (s->n == s->cap) {
        st = node_to_set(idx, nid, s->cap * 2);
        if (st != KVT_OK)
            goto out;
        s = set_of(idx, n->pods);
    }
    uint32_t i = s->n;
    while (i > 0 && ELEM_POD(s->e[i - 1]) > ELEM_POD(e)) {
        elem_store(&s->e[i], s->e[i - 1]);
        i--;
    }
    elem_store(&s->e[i], e);
    __atomic_store_n(&s->n, s->n + 1, __ATOMIC_RELAXED);
out:
    wend(idx, nid);
    if (st == KVT_OK) {
        idx->entries++;
        idx->pods[ELEM_POD(e)].entries++;
        tiers_moved(idx, 0, ELEM_TIERS(e));
    }
    return st;
}

/* Removes @pod's element; shrinks or dissolves the set when it empties. */
static void node_elem_del(kvt_idx_t *idx, uint32_t nid, uint32_t pod)
{
    kvt_node_t *n = N(idx, nid);
    wbegin(idx, nid);
    if (!(n->pods & PODS_SET_BIT)) {
        tiers_moved(idx, ELEM_TIERS(n->pods), 0);
        __atomic_store_n(&n->pods, PODS_EMPTY, __ATOMIC_RELAXED);
    } else {
        kvt_podset_t *s = set_of(idx, n->pods);
        uint32_t i = 0;
        while (i < s->n && ELEM_POD(s->e[i]) != pod)
            i++;
        if (i < s->n)
            tiers_moved(idx, ELEM_TIERS(s->e[i]), 0);
        for (; i + 1 < s->n; i++)
            elem_store(&s->e[i], s->e[i + 1]);
        __atomic_store_n(&s->n, s->n - 1, __ATOMIC_RELAXED);
        if (s->alias_head == KVT_NIL && s->n <= 1) {
            /* back to the inline form */
            uint32_t h = n->pods & ~PODS_SET_BIT;
            __atomic_store_n(&n->pods, s->n ? s->e[0] : PODS_EMPTY, __ATOMIC_RELEASE);
            __atomic_store_n(dir_set(idx->sh.sets, h), NULL, __ATOMIC_RELEASE);
            acct_retire(idx, s, set_bytes(s->cap));
            set_handle_free(idx, h);
        } else if (s->cap > SET_MIN && s->n * 4 <= s->cap) {
            node_to_set(idx, nid, s->cap / 2); /* on failure the bigger set stays */
        }
    }
    wend(idx, nid);
    idx->entries--;
    idx->pods[pod].entries--;
}

static void node_elem_set(kvt_idx_t *idx, uint32_t nid, kvt_elem_t *ep, kvt_elem_t v)
{
    tiers_moved(idx, ELEM_TIERS(*ep), ELEM_TIERS(v));
    wbegin(idx, nid);
    elem_store(ep, v);
    wend(idx, nid);
}

/* Frees @nid if it holds nothing and has no children, then its parents likewise. */
static void node_maybe_free(kvt_idx_t *idx, uint32_t nid)
{
    while (nid != KVT_NIL) {
        kvt_node_t *n = N(idx, nid);
        if (n->pods != PODS_EMPTY || n->nchild != 0 || pinned(idx, nid))
            return;
        uint32_t parent = n->parent;
        ktab_delete(idx, n->key);
        wbegin(idx, nid);
        __atomic_store_n(&n->pods, PODS_FREE, __ATOMIC_RELAXED);
        wend(idx, nid);
        n->parent = idx->node_free;
        idx->node_free = nid;
        idx->live_nodes--;
        idx->nsw[*node_ns(idx, nid)].blocks--;
        if (parent == KVT_NIL)
            return;
        N(idx, parent)->nchild--;
        nid = parent;
    }
}

/* ---- aliases and spec ---------------------------------------------------- */

static uint32_t alias_alloc(kvt_idx_t *idx)
{
    if (idx->alias_free != KVT_NIL) {
        uint32_t a = idx->alias_free;
        idx->alias_free = idx->alias[a].next;
        idx->alias_live++;
        return a;
    }
    if (idx->alias_used == idx->alias_cap) {
        uint32_t cap = idx->alias_cap ? idx->alias_cap * 2 : 64;
        if (cap > 0x7fffffffu || !room(idx, (size_t)cap * sizeof(kvt_alias_t)))
            return KVT_NIL;
        kvt_alias_t *na = acct_alloc(idx, (size_t)cap * sizeof(kvt_alias_t));
        if (na == NULL)
            return KVT_NIL;
        if (idx->alias != NULL)
            memcpy(na, idx->alias, (size_t)idx->alias_used * sizeof(kvt_alias_t));
        acct_free(idx, idx->alias, (size_t)idx->alias_cap * sizeof(kvt_alias_t));
        idx->alias = na;
        idx->alias_cap = cap;
    }
    idx->alias[idx->alias_used].serial = 0;
    idx->alias_live++;
    return idx->alias_used++;
}

static void alias_release(kvt_idx_t *idx, uint32_t a)
{
    kvt_alias_t *al = &idx->alias[a];
    idx->alias_live--;
    al->flags = 0;
    al->serial++;
    al->next = idx->alias_free;
    idx->alias_free = a;
}

static uint64_t spec_marker(uint64_t key)
{
    return kvt_mix64(key ^ 0x5350454355u) ^ 0xa5a5a5a5a5a5a5a5ull;
}

/* ---- per-pod engine-hash tables ---------------------------------------- */

/* A slot of a pod table: group << 4 | index in group. */
#define PSLOT(gi, si) (((gi) << 4) | (si))
#define PREF(p, s_) ((p)->g[(s_) >> 4].slot[(s_)&15u])

static size_t ptab_bytes(uint32_t groups)
{
    return (size_t)groups * sizeof(kvt_group_t);
}

static uint64_t ref_ehash(kvt_idx_t *idx, uint32_t ref, bool *spec_p)
{
    if (ref & ALIAS_BIT) {
        kvt_alias_t *a = &idx->alias[ref & ~ALIAS_BIT];
        *spec_p = (a->flags & ALIAS_SPEC) != 0;
        return a->ehash;
    }
    *spec_p = false;
    return N(idx, ref)->ehash;
}

static uint32_t ref_node(kvt_idx_t *idx, uint32_t ref)
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
static uint32_t ptab_find(kvt_idx_t *idx, kvt_pod_t *p, uint64_t eh, bool spec)
{
    return ptab_find_h(idx, p, eh, kvt_mix64(eh), spec);
}

static kvt_status_t ptab_rebuild(kvt_idx_t *idx, kvt_pod_t *p, uint32_t groups)
{
    kvt_group_t *g = aligned_alloc(64, ptab_bytes(groups));
    if (g == NULL)
        return KVT_ERR_NO_MEM;
    idx->bytes += ptab_bytes(groups);
    kvt_grp_init(g, groups);
    if (p->g != NULL) {
        /*
         * Re-hashing needs each entry's engine hash, which lives in its node
         * (or alias): a miss per entry. Batches of refs are gathered first,
         * then re-put with the node of entry i + AHEAD fetched meanwhile.
         */
        enum { BATCH = 256, AHEAD = 8 };
        uint32_t refs[BATCH];
        uint32_t gi = 0, m = p->ngroups ? ~kvt_grp_free(&p->g[0]) & ((1u << KVT_GRP_SLOTS) - 1) : 0;
        for (;;) {
            uint32_t nb = 0;
            while (nb < BATCH && gi < p->ngroups) {
                if (m == 0) {
                    if (++gi < p->ngroups)
                        m = ~kvt_grp_free(&p->g[gi]) & ((1u << KVT_GRP_SLOTS) - 1);
                    continue;
                }
                refs[nb++] = p->g[gi].slot[__builtin_ctz(m)];
                m &= m - 1;
            }
            if (nb == 0)
                break;
            for (uint32_t k = 0; k < nb && k < AHEAD; k++)
                if (!(refs[k] & ALIAS_BIT))
                    __builtin_prefetch(&N(idx, refs[k])->ehash);
            for (uint32_t k = 0; k < nb; k++) {
                if (k + AHEAD < nb && !(refs[k + AHEAD] & ALIAS_BIT))
                    __builtin_prefetch(&N(idx, refs[k + AHEAD])->ehash);
                bool spec;
                kvt_grp_put(g, groups, kvt_mix64(ref_ehash(idx, refs[k], &spec)), refs[k]);
            }
        }
        acct_free(idx, p->g, ptab_bytes(p->ngroups));
    }
    p->g = g;
    p->ngroups = groups;
    p->tomb = 0;
    return KVT_OK;
}

static uint64_t ptab_cap(const kvt_pod_t *p)
{
    return (uint64_t)p->ngroups * KVT_GRP_SLOTS;
}

/* Makes room for one more reference in @pod's table; may evict rather than grow. */
static kvt_status_t ptab_reserve(kvt_idx_t *idx, uint32_t pod)
{
    for (;;) {
        kvt_pod_t *p = &idx->pods[pod];
        if (p->g == NULL) {
            if (!room(idx, ptab_bytes(PTAB_MIN_GROUPS)))
                return KVT_ERR_NO_SPACE;
            return ptab_rebuild(idx, &idx->pods[pod], PTAB_MIN_GROUPS);
        }
        uint64_t cap = ptab_cap(p);
        uint32_t groups = p->ngroups;
        if ((uint64_t)(p->live + p->tomb + 1) * 8 <= cap * 7)
            return KVT_OK;
        if ((uint64_t)(p->live + 1) * 2 <= cap)
            return ptab_rebuild(idx, p, groups);
        if (groups >= 0x08000000u)
            return KVT_ERR_NO_SPACE;
        /* small tables grow x4 (fewer re-hashes), big ones by half (less slack) */
        uint32_t ng = groups < 8 ? groups * 4 : kvt_grp_grow(groups);
        if (!over_budget(idx, ptab_bytes(ng - groups)))
            return ptab_rebuild(idx, p, ng);
        if (evict_batch(idx) == 0)
            return KVT_ERR_NO_SPACE;
    }
}

static void ptab_insert(kvt_idx_t *idx, kvt_pod_t *p, uint32_t ref)
{
    bool spec;
    kvt_grp_put(p->g, p->ngroups, kvt_mix64(ref_ehash(idx, ref, &spec)), ref);
    p->live++;
}

static void ptab_delete(kvt_pod_t *p, uint32_t slot)
{
    p->live--;
    if (kvt_grp_erase(&p->g[slot >> 4], slot & 15u))
        p->tomb++;
}

/* Shrinks @pod's table when it is mostly empty (after evictions or removals). */
static void ptab_maybe_shrink(kvt_idx_t *idx, kvt_pod_t *p)
{
    if (p->g == NULL)
        return;
    if (p->live == 0) {
        acct_free(idx, p->g, ptab_bytes(p->ngroups));
        p->g = NULL;
        p->ngroups = 0;
        p->tomb = 0;
        return;
    }
    uint32_t groups = p->ngroups;
    if (groups <= PTAB_MIN_GROUPS || (uint64_t)p->live * 8 > ptab_cap(p))
        return;
    /* target about half full */
    uint32_t ng = (uint32_t)(((uint64_t)p->live * 2 + KVT_GRP_SLOTS - 1) / KVT_GRP_SLOTS);
    if (ng < PTAB_MIN_GROUPS)
        ng = PTAB_MIN_GROUPS;
    ptab_rebuild(idx, p, ng); /* on failure the bigger table stays */
}

/* ---- references --------------------------------------------------------- */

/* Effective tiers of @pod on node @nid: main tiers | tiers of its aliases. */
static unsigned elem_recompute(kvt_idx_t *idx, kvt_node_t *n, kvt_elem_t e)
{
    unsigned t = ELEM_MAIN(e);
    if (ELEM_NALIAS(e) == 0)
        return t;
    kvt_podset_t *s = set_of(idx, n->pods);
    for (uint32_t a = s->alias_head; a != KVT_NIL; a = idx->alias[a].next)
        if (idx->alias[a].pod == ELEM_POD(e))
            t |= idx->alias[a].tiers;
    return t;
}

/* Writes @e's new fields to the node, or removes the element when no reference is left. */
static void elem_update(kvt_idx_t *idx, uint32_t nid, uint32_t pod, unsigned main, unsigned nalias)
{
    kvt_node_t *n = N(idx, nid);
    kvt_elem_t *ep = node_elem(idx, n, pod);
    if (main == 0 && nalias == 0) {
        node_elem_del(idx, nid, pod);
        return;
    }
    kvt_elem_t e = ELEM_MAKE(pod, 0, main, nalias);
    e = ELEM_MAKE(pod, elem_recompute(idx, n, e), main, nalias);
    node_elem_set(idx, nid, ep, e);
}

/* Drops the reference in @pod's table slot @slot entirely; frees what it leaves empty. */
static void ref_drop(kvt_idx_t *idx, uint32_t pod, uint32_t slot)
{
    kvt_pod_t *p = &idx->pods[pod];
    uint32_t ref = PREF(p, slot);
    uint32_t nid = ref_node(idx, ref);
    kvt_node_t *n = N(idx, nid);
    kvt_elem_t e = *node_elem(idx, n, pod);
    ptab_delete(p, slot);
    if (ref & ALIAS_BIT) {
        uint32_t a = ref & ~ALIAS_BIT;
        kvt_podset_t *s = set_of(idx, n->pods);
        uint32_t *link = &s->alias_head;
        while (*link != a)
            link = &idx->alias[*link].next;
        *link = idx->alias[a].next;
        if (idx->alias[a].flags & ALIAS_SPEC)
            idx->spec_live--;
        alias_release(idx, a);
        elem_update(idx, nid, pod, ELEM_MAIN(e), ELEM_NALIAS(e) - 1);
        /* a set kept only for aliases may now fold back inline */
        if (n->pods & PODS_SET_BIT) {
            s = set_of(idx, n->pods);
            if (s->alias_head == KVT_NIL && s->n == 1) {
                uint32_t h = n->pods & ~PODS_SET_BIT;
                wbegin(idx, nid);
                __atomic_store_n(&n->pods, s->e[0], __ATOMIC_RELEASE);
                __atomic_store_n(dir_set(idx->sh.sets, h), NULL, __ATOMIC_RELEASE);
                wend(idx, nid);
                acct_retire(idx, s, set_bytes(s->cap));
                set_handle_free(idx, h);
            }
        }
    } else {
        elem_update(idx, nid, pod, 0, ELEM_NALIAS(e));
    }
    node_maybe_free(idx, nid);
}

/* Removes @tiers from the reference in @slot; drops it when no tier is left. */
static void ref_clear_tiers(kvt_idx_t *idx, uint32_t pod, uint32_t slot, unsigned tiers)
{
    kvt_pod_t *p = &idx->pods[pod];
    uint32_t ref = PREF(p, slot);
    uint32_t nid = ref_node(idx, ref);
    kvt_node_t *n = N(idx, nid);
    kvt_elem_t e = *node_elem(idx, n, pod);
    if (ref & ALIAS_BIT) {
        kvt_alias_t *a = &idx->alias[ref & ~ALIAS_BIT];
        if (!(a->tiers & tiers))
            return;
        if ((a->tiers & ~tiers) == 0) {
            ref_drop(idx, pod, slot);
            return;
        }
        a->tiers &= (uint8_t)~tiers;
        elem_update(idx, nid, pod, ELEM_MAIN(e), ELEM_NALIAS(e));
        return;
    }
    if (!(ELEM_MAIN(e) & tiers))
        return;
    if ((ELEM_MAIN(e) & ~tiers) == 0) {
        ref_drop(idx, pod, slot);
        return;
    }
    elem_update(idx, nid, pod, ELEM_MAIN(e) & ~tiers, ELEM_NALIAS(e));
}

/* Adds a new alias reference (@eh, @tier) of @pod to @nid. */
static kvt_status_t alias_add(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh,
                              unsigned tier, bool spec, uint32_t *alias_p)
{
    kvt_node_t *n = N(idx, nid);
    kvt_elem_t *ep = node_elem(idx, n, pod);
    if (ep != NULL && ELEM_NALIAS(*ep) >= ELEM_MAX_ALIAS)
        return KVT_ERR_LIMIT;
    uint32_t a = alias_alloc(idx);
    if (a == KVT_NIL)
        return idx->cfg.budget_bytes ? KVT_ERR_NO_SPACE : KVT_ERR_NO_MEM;
    kvt_status_t st;
    if (!(n->pods & PODS_SET_BIT)) {
        if (!room(idx, set_bytes(SET_MIN))) {
            alias_release(idx, a);
            return KVT_ERR_NO_SPACE;
        }
        st = set_handle_reserve(idx);
        if (st != KVT_OK) {
            alias_release(idx, a);
            return st;
        }
        wbegin(idx, nid);
        st = node_to_set(idx, nid, SET_MIN);
        wend(idx, nid);
        if (st != KVT_OK) {
            alias_release(idx, a);
            return st;
        }
    }
    kvt_alias_t *al = &idx->alias[a];
    al->ehash = eh;
    al->node = nid;
    al->pod = (uint16_t)pod;
    al->tiers = (uint8_t)tier;
    al->flags = spec ? ALIAS_SPEC : 0;
    kvt_podset_t *s = set_of(idx, n->pods);
    al->next = s->alias_head;
    s->alias_head = a;
    ep = node_elem(idx, n, pod);
    if (ep == NULL) {
        st = node_elem_add(idx, nid, ELEM_MAKE(pod, tier, 0, 1), true);
        if (st != KVT_OK) {
            s = set_of(idx, n->pods);
            s->alias_head = al->next;
            alias_release(idx, a);
            return st;
        }
    } else {
        kvt_elem_t e = *ep;
        node_elem_set(idx, nid, ep,
                      ELEM_MAKE(pod, ELEM_TIERS(e) | tier, ELEM_MAIN(e), ELEM_NALIAS(e) + 1));
    }
    ptab_insert(idx, &idx->pods[pod], ALIAS_BIT | a);
    if (spec)
        idx->spec_live++;
    *alias_p = a;
    return KVT_OK;
}

/* True when some pod maps the node's own engine hash to it. */
static bool node_has_main(kvt_idx_t *idx, kvt_node_t *n)
{
    if (n->pods == PODS_EMPTY)
        return false;
    if (!(n->pods & PODS_SET_BIT))
        return ELEM_MAIN(n->pods) != 0;
    kvt_podset_t *s = set_of(idx, n->pods);
    for (uint32_t i = 0; i < s->n; i++)
        if (ELEM_MAIN(s->e[i]) != 0)
            return true;
    return false;
}

/* Records that @pod holds @nid in @tier under engine hash @eh (@ph = kvt_mix64(eh)). */
static kvt_status_t ref_add_h(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh, uint64_t ph,
                              unsigned tier)
{
    kvt_node_t *n0 = N(idx, nid);
    if (eh == n0->ehash) {
        /* fast path: the pod already maps the node's own hash to it in this tier */
        kvt_elem_t *ep = node_elem(idx, n0, pod);
        if (ep != NULL && (ELEM_MAIN(*ep) & tier) && !(ELEM_TIERS(*ep) & KVT_TIER_SPEC))
            return KVT_OK;
    }
    kvt_pod_t *p = &idx->pods[pod];
    uint32_t slot = ptab_find_h(idx, p, eh, ph, false);
    if (slot != KVT_NIL && ref_node(idx, PREF(p, slot)) != nid) {
        /* the engine reused this hash for another block: forget the old one */
        ref_drop(idx, pod, slot);
        slot = KVT_NIL;
    }
    kvt_node_t *n = N(idx, nid);
    if (slot != KVT_NIL) {
        uint32_t ref = PREF(p, slot);
        kvt_elem_t *ep = node_elem(idx, n, pod);
        kvt_elem_t e = *ep;
        if (ref & ALIAS_BIT) {
            idx->alias[ref & ~ALIAS_BIT].tiers |= (uint8_t)tier;
            node_elem_set(idx, nid, ep,
                          ELEM_MAKE(pod, ELEM_TIERS(e) | tier, ELEM_MAIN(e), ELEM_NALIAS(e)));
        } else {
            node_elem_set(
                idx, nid, ep,
                ELEM_MAKE(pod, ELEM_TIERS(e) | tier, ELEM_MAIN(e) | tier, ELEM_NALIAS(e)));
        }
    } else {
        kvt_status_t st = ptab_reserve(idx, pod);
        if (st != KVT_OK)
            return st;
        p = &idx->pods[pod];
        kvt_elem_t *ep = node_elem(idx, n, pod);
        if (eh != n->ehash && !node_has_main(idx, n))
            n->ehash = eh; /* e.g. a node created by a speculative mark */
        if (eh == n->ehash) {
            if (ep == NULL) {
                st = node_elem_add(idx, nid, ELEM_MAKE(pod, tier, tier, 0), false);
                if (st != KVT_OK)
                    return st;
            } else {
                kvt_elem_t e = *ep;
                node_elem_set(idx, nid, ep,
                              ELEM_MAKE(pod, ELEM_TIERS(e) | tier, tier, ELEM_NALIAS(e)));
            }
            kvt_grp_put(p->g, p->ngroups, ph, nid); /* n->ehash == eh */
            p->live++;
        } else {
            uint32_t a;
            st = alias_add(idx, nid, pod, eh, tier, false, &a);
            if (st != KVT_OK)
                return st;
        }
    }
    /* a real store confirms (replaces) a speculative mark */
    kvt_elem_t *ep = node_elem(idx, n, pod);
    if (ep != NULL && (ELEM_TIERS(*ep) & KVT_TIER_SPEC)) {
        uint32_t s = ptab_find(idx, &idx->pods[pod], spec_marker(n->key), true);
        if (s != KVT_NIL)
            ref_drop(idx, pod, s);
    }
    return KVT_OK;
}

static kvt_status_t ref_add(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh, unsigned tier)
{
    return ref_add_h(idx, nid, pod, eh, kvt_mix64(eh), tier);
}

/* ---- eviction ------------------------------------------------------------ */

static void node_strip(kvt_idx_t *idx, uint32_t nid)
{
    kvt_node_t *n = N(idx, nid);
    /* drop every holder's references; the node frees itself once empty */
    while (n->pods != PODS_EMPTY && n->pods != PODS_FREE) {
        kvt_elem_t e;
        if (n->pods & PODS_SET_BIT) {
            kvt_podset_t *s = set_of(idx, n->pods);
            if (s->alias_head != KVT_NIL) {
                kvt_alias_t *a = &idx->alias[s->alias_head];
                uint32_t slot =
                    ptab_find(idx, &idx->pods[a->pod], a->ehash, (a->flags & ALIAS_SPEC) != 0);
                ref_drop(idx, a->pod, slot);
                continue;
            }
            e = s->e[0];
        } else {
            e = n->pods;
        }
        uint32_t pod = ELEM_POD(e);
        uint32_t slot = ptab_find(idx, &idx->pods[pod], n->ehash, false);
        ref_drop(idx, pod, slot);
    }
}

/* Shrinks the key table when it is mostly empty (about half full after). */
static void ktab_maybe_shrink(kvt_idx_t *idx)
{
    uint32_t kgroups = idx->sh.ktab->ngroups;
    if (kgroups > KTAB_MIN_GROUPS && (uint64_t)idx->kt_live * 8 <= ktab_cap(idx->sh.ktab)) {
        uint32_t ng = (uint32_t)(((uint64_t)idx->kt_live * 2 + KVT_GRP_SLOTS - 1) / KVT_GRP_SLOTS);
        ktab_rebuild(idx, ng < KTAB_MIN_GROUPS ? KTAB_MIN_GROUPS : ng); /* on failure it stays */
    }
}

/* After blocks went: tables that emptied shrink, so the room is real. */
static void shrink_tables(kvt_idx_t *idx)
{
    for (uint32_t p = 0; p < idx->pod_hi; p++)
        if (idx->pods[p].name != NULL && p != idx->pin_pod)
            ptab_maybe_shrink(idx, &idx->pods[p]);
    ktab_maybe_shrink(idx);
}

/* Max-heap of (age << 32 | node): the oldest leaf on top. */
static void heap_down(uint64_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && h[c + 1] > h[c])
            c++;
        if (h[i] >= h[c])
            return;
        uint64_t t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

static void heap_up(uint64_t *h, size_t i)
{
    while (i > 0 && h[(i - 1) / 2] < h[i]) {
        uint64_t t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static bool evictable_leaf(kvt_idx_t *idx, uint32_t nid)
{
    kvt_node_t *n = N(idx, nid);
    return n->pods != PODS_FREE && n->nchild == 0 && !pinned(idx, nid);
}

static uint64_t heap_item(kvt_idx_t *idx, uint32_t nid, uint32_t now)
{
    uint32_t age = now - __atomic_load_n(&N(idx, nid)->stamp, __ATOMIC_RELAXED);
    return ((uint64_t)age << 32) | nid;
}

/*
 * Evicts about 1/32 of the blocks (at least 16), strictly least recently used
 * leaf first: a parent whose last child goes becomes a leaf and competes with
 * its own age. Then shrinks tables that emptied. Returns nodes freed (0: none
 * could be: every leaf is pinned by the write in progress).
 */
static size_t evict_batch(kvt_idx_t *idx)
{
    if (idx->evicting || idx->live_nodes == 0)
        return 0;
    idx->evicting = true;
    const uint32_t now = idx->sh.clock32;
    uint64_t want = idx->live_nodes / 32;
    if (want < 16)
        want = 16;
    size_t n = 0, cap = 1024;
    uint64_t *heap = malloc(cap * sizeof(uint64_t));
    size_t evicted = 0;
    uint64_t freed = 0;
    if (heap == NULL)
        goto out;
    for (uint32_t nid = 0; nid < idx->nodes_used; nid++) {
        if (!evictable_leaf(idx, nid))
            continue;
        if (n == cap) {
            uint64_t *h2 = realloc(heap, cap * 2 * sizeof(uint64_t));
            if (h2 == NULL)
                break;
            heap = h2;
            cap *= 2;
        }
        heap[n++] = heap_item(idx, nid, now);
    }
    for (size_t i = n / 2; i-- > 0;)
        heap_down(heap, n, i);
    while (n > 0 && freed < want) {
        uint32_t nid = (uint32_t)heap[0];
        heap[0] = heap[--n];
        heap_down(heap, n, 0);
        if (!evictable_leaf(idx, nid))
            continue;
        kvt_node_t *nd = N(idx, nid);
        uint32_t parent = nd->parent;
        if (nd->pods == PODS_EMPTY) {
            node_maybe_free(idx, nid); /* structural: no entries to report */
        } else {
            if (idx->cfg.on_evict != NULL)
                idx->cfg.on_evict(idx->cfg.on_evict_arg, nd->key);
            node_strip(idx, nid); /* frees nid once its last holder is gone */
            evicted++;
        }
        freed++;
        /* the parent may have become a leaf: it competes with its own age (heap slot freed above)
         */
        if (parent != KVT_NIL && evictable_leaf(idx, parent)) {
            heap[n] = heap_item(idx, parent, now);
            heap_up(heap, n++);
        }
    }
    free(heap);
    shrink_tables(idx);
    idx->evicted += evicted;
out:
    idx->evicting = false;
    return (size_t)freed;
}

/* ---- names ----------------------------------------------------------------- */

static uint64_t name_hash(const char *a, const char *b, uint32_t n)
{
    XXH3_state_t s;
    XXH3_INITSTATE(&s);
    XXH3_64bits_reset_withSeed(&s, 0x6b7674u);
    XXH3_64bits_update(&s, a, strlen(a) + 1);
    XXH3_64bits_update(&s, b, strlen(b) + 1);
    XXH3_64bits_update(&s, &n, sizeof(n));
    return XXH3_64bits_digest(&s);
}

static size_t nmap_bytes(uint32_t cap)
{
    return (size_t)cap * (sizeof(uint64_t) + sizeof(uint32_t));
}

static kvt_status_t nmap_rebuild(kvt_idx_t *idx, name_map_t *m, uint32_t cap)
{
    uint8_t *mem = acct_alloc(idx, nmap_bytes(cap));
    if (mem == NULL)
        return KVT_ERR_NO_MEM;
    uint64_t *hash = (uint64_t *)(void *)mem;
    uint32_t *id = (uint32_t *)(void *)(mem + (size_t)cap * sizeof(uint64_t));
    for (uint32_t i = 0; i < cap; i++)
        id[i] = NAME_EMPTY;
    for (uint32_t i = 0; m->mask && i <= m->mask; i++) {
        if (m->id[i] >= NAME_TOMB)
            continue;
        uint32_t j = (uint32_t)m->hash[i] & (cap - 1);
        while (id[j] != NAME_EMPTY)
            j = (j + 1) & (cap - 1);
        hash[j] = m->hash[i];
        id[j] = m->id[i];
    }
    if (m->mask)
        acct_free(idx, m->hash, nmap_bytes(m->mask + 1));
    m->hash = hash;
    m->id = id;
    m->mask = cap - 1;
    m->tomb = 0;
    return KVT_OK;
}

/* Calls @eq for candidates with hash @h; returns the slot holding a match or KVT_NIL. */
typedef bool (*name_eq_fn)(kvt_idx_t *idx, uint32_t id, const char *a, const char *b, uint32_t n);

static uint32_t nmap_find(kvt_idx_t *idx, const name_map_t *m, uint64_t h, name_eq_fn eq,
                          const char *a, const char *b, uint32_t n)
{
    if (m->mask == 0)
        return KVT_NIL;
    for (uint32_t i = (uint32_t)h & m->mask;; i = (i + 1) & m->mask) {
        if (m->id[i] == NAME_EMPTY)
            return KVT_NIL;
        if (m->id[i] != NAME_TOMB && m->hash[i] == h && eq(idx, m->id[i], a, b, n))
            return i;
    }
}

/* Capacity the next nmap_add() on @m rebuilds it with, or 0 when it has room. */
static uint32_t nmap_grow_cap(const name_map_t *m)
{
    if (m->mask != 0 && (uint64_t)(m->live + m->tomb + 1) * 4 <= (uint64_t)(m->mask + 1) * 3)
        return 0;
    uint32_t cap = m->mask ? m->mask + 1 : 16;
    if ((uint64_t)(m->live + 1) * 2 > cap)
        cap *= 2;
    return cap;
}

/* Bytes the next nmap_add() on @m allocates (callers ask the budget for them first). */
static size_t nmap_grow_bytes(const name_map_t *m)
{
    uint32_t cap = nmap_grow_cap(m);
    return cap ? nmap_bytes(cap) : 0;
}

static kvt_status_t nmap_add(kvt_idx_t *idx, name_map_t *m, uint64_t h, uint32_t id)
{
    uint32_t cap = nmap_grow_cap(m);
    if (cap != 0) {
        kvt_status_t st = nmap_rebuild(idx, m, cap);
        if (st != KVT_OK)
            return st;
    }
    uint32_t i = (uint32_t)h & m->mask;
    while (m->id[i] < NAME_TOMB)
        i = (i + 1) & m->mask;
    if (m->id[i] == NAME_TOMB)
        m->tomb--;
    m->hash[i] = h;
    m->id[i] = id;
    m->live++;
    return KVT_OK;
}

/* Removes the name in slot @i; an emptied map is freed, a sparse one shrinks. */
static void nmap_del(kvt_idx_t *idx, name_map_t *m, uint32_t i)
{
    m->id[i] = NAME_TOMB;
    m->live--;
    m->tomb++;
    uint32_t cap = m->mask + 1;
    if (m->live == 0) {
        acct_free(idx, m->hash, nmap_bytes(cap));
        memset(m, 0, sizeof(*m));
        return;
    }
    if (cap > 16 && (uint64_t)m->live * 8 <= cap) {
        uint32_t ncap = 16;
        while ((uint64_t)(m->live + 1) * 2 > ncap)
            ncap *= 2;
        nmap_rebuild(idx, m, ncap); /* on failure the bigger map stays */
    }
}

static bool pod_eq(kvt_idx_t *idx, uint32_t id, const char *a, const char *b, uint32_t n)
{
    (void)b;
    kvt_pod_t *p = &idx->pods[id];
    return p->name != NULL && p->dp_rank == n && strcmp(p->name, a) == 0;
}

static bool ns_eq(kvt_idx_t *idx, uint32_t slot, const char *a, const char *b, uint32_t n)
{
    (void)n;
    const ns_w_t *w = &idx->nsw[slot];
    return w->model != NULL && strcmp(w->model, a) == 0 && strcmp(w->lora, b) == 0;
}

static char *acct_strdup(kvt_idx_t *idx, const char *s, size_t *bytes_p)
{
    size_t len = strlen(s) + 1;
    char *d = acct_alloc(idx, len);
    if (d != NULL) {
        memcpy(d, s, len);
        *bytes_p = len;
    }
    return d;
}

static void acct_strfree(kvt_idx_t *idx, char *s)
{
    if (s != NULL)
        acct_free(idx, s, strlen(s) + 1);
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

/* ---- giving memory back ---------------------------------------------------- */

/*
 * Swaps in a copy of directory *@dirp that keeps its first @n chunks (readers
 * take the rest as gone) and returns the old one, still allocated: the caller
 * retires the chunks past @n, then the old directory (its bytes:
 * dir_bytes(old->cap)). NULL (nothing changed) when the copy cannot be made.
 */
static kvt_dir_t *dir_swap(kvt_idx_t *idx, kvt_dir_t **dirp, uint32_t n)
{
    kvt_dir_t *d = *dirp;
    uint32_t cap = DIR_MIN;
    while (cap < n)
        cap *= 2;
    kvt_dir_t *nd = acct_calloc(idx, dir_bytes(cap));
    if (nd == NULL)
        return NULL;
    nd->n = n;
    nd->cap = cap;
    memcpy(nd->chunk, d->chunk, (size_t)n * sizeof(void *));
    __atomic_store_n(dirp, nd, __ATOMIC_RELEASE);
    return d;
}

/* Drops speculative-ring items whose mark is gone (confirmed or dropped); shrinks the ring. */
static void spec_compact(kvt_idx_t *idx)
{
    size_t keep = 0;
    for (size_t i = 0; i < idx->spec_len; i++) {
        spec_item_t it = idx->spec[(idx->spec_head + i) % idx->spec_cap];
        const kvt_alias_t *a = &idx->alias[it.alias];
        if (a->serial == it.serial && (a->flags & ALIAS_SPEC))
            idx->spec[(idx->spec_head + keep++) % idx->spec_cap] = it; /* keep <= i: read already */
    }
    idx->spec_len = keep;
    size_t cap = idx->spec_cap;
    while (cap > 64 && keep * 4 <= cap)
        cap /= 2;
    if (keep == 0)
        cap = 0;
    if (cap == idx->spec_cap)
        return;
    spec_item_t *s = NULL;
    if (cap > 0 && (s = acct_alloc(idx, cap * sizeof(spec_item_t))) == NULL)
        return; /* the bigger ring stays */
    for (size_t i = 0; i < keep; i++)
        s[i] = idx->spec[(idx->spec_head + i) % idx->spec_cap];
    acct_free(idx, idx->spec, idx->spec_cap * sizeof(spec_item_t));
    idx->spec = s;
    idx->spec_cap = cap;
    idx->spec_head = 0;
}

/*
 * Gives back the node slabs at the end whose nodes are all free: every slab
 * when no node is live, else those above the highest live node (found by a
 * scan down from the top, tried again only once the live nodes halved or the
 * slab grew). Readers may still be reading them: they are retired, and the
 * published directory stops listing their chunks. Only between writes
 * (nodes are named by index everywhere).
 */
static void nodes_trim(kvt_idx_t *idx)
{
    if (idx->nslabs == 0)
        return;
    uint32_t keep = 0; /* nodes kept: whole slabs */
    if (idx->live_nodes != 0) {
        if (idx->live_nodes > idx->trim_below ||
            idx->nodes_used - idx->live_nodes < NODE_SLAB_NODES)
            return;
        idx->trim_below = idx->live_nodes / 2;
        uint32_t hi = idx->nodes_used;
        while (hi > 0 && N(idx, hi - 1)->pods == PODS_FREE)
            hi--;
        keep = (hi + NODE_SLAB_NODES - 1) / NODE_SLAB_NODES * NODE_SLAB_NODES;
        if (keep >= idx->nodes_used)
            return;
    }
    uint32_t nchunks = idx->sh.nodes->n, kchunks = keep / NODE_CHUNK;
    /* the free list loses the nodes given back (read through the directory still listing them) */
    uint32_t *link = &idx->node_free;
    while (*link != KVT_NIL) {
        if (*link >= keep)
            *link = N(idx, *link)->parent;
        else
            link = &N(idx, *link)->parent;
    }
    kvt_dir_t *old = dir_swap(idx, &idx->sh.nodes, kchunks);
    if (old == NULL) {
        /* nothing is given back; the nodes past @keep are simply not reused */
        idx->nodes_used = keep;
        return;
    }
    for (uint32_t sl = keep / NODE_SLAB_NODES; sl < idx->nslabs; sl++) {
        uint32_t c0 = sl * NODE_SLAB_CHUNKS, c1 = c0 + NODE_SLAB_CHUNKS;
        if (c1 > nchunks)
            c1 = nchunks > c0 ? nchunks : c0; /* a slab may be allocated before its first chunk */
        acct_retire(idx, idx->slabs[sl], (size_t)(c1 - c0) * NODE_CHUNK_BYTES);
        idx->slabs[sl] = NULL;
    }
    acct_retire(idx, old, dir_bytes(old->cap));
    for (uint32_t c = kchunks; c < nchunks; c++) {
        acct_free(idx, idx->node_ns[c], NODE_NS_BYTES);
        idx->node_ns[c] = NULL;
    }
    idx->nslabs = keep / NODE_SLAB_NODES;
    idx->nodes_used = keep;
    if (idx->nslabs == 0) {
        acct_free(idx, idx->slabs, (size_t)idx->slabs_cap * sizeof(kvt_node_t *));
        acct_free(idx, idx->node_ns, (size_t)idx->node_ns_cap * sizeof(uint16_t *));
        idx->slabs = NULL;
        idx->node_ns = NULL;
        idx->slabs_cap = idx->node_ns_cap = 0;
    }
}

/* With no holder set left, gives back the set-handle chunks and the free-handle stack. */
static void sets_trim(kvt_idx_t *idx)
{
    if (idx->sets_used == 0 || idx->nset_free != idx->sets_used)
        return;
    kvt_dir_t *old = dir_swap(idx, &idx->sh.sets, 0);
    if (old == NULL)
        return;
    for (uint32_t c = 0; c < old->n; c++)
        acct_retire(idx, old->chunk[c], SET_CHUNK * sizeof(kvt_podset_t *));
    acct_retire(idx, old, dir_bytes(old->cap));
    acct_free(idx, idx->set_free, (size_t)idx->set_free_cap * sizeof(uint32_t));
    idx->set_free = NULL;
    idx->set_free_cap = idx->nset_free = idx->sets_used = 0;
}

/* After a namespace drop: trailing free slots, their record chunks and writer entries go. */
static void ns_trim(kvt_idx_t *idx)
{
    uint32_t nns = idx->sh.nns;
    while (nns > 0 && idx->nsw[nns - 1].model == NULL)
        nns--;
    if (nns == idx->sh.nns)
        return;
    __atomic_store_n(&idx->sh.nns, nns, __ATOMIC_RELEASE);
    if (idx->ns_hint > nns)
        idx->ns_hint = nns;
    uint32_t kchunks = (nns + NS_CHUNK - 1) / NS_CHUNK;
    if (kchunks < idx->sh.nss->n) {
        kvt_dir_t *old = dir_swap(idx, &idx->sh.nss, kchunks);
        if (old != NULL) {
            for (uint32_t c = kchunks; c < old->n; c++)
                acct_retire(idx, old->chunk[c], NS_CHUNK * sizeof(kvt_ns_t));
            acct_retire(idx, old, dir_bytes(old->cap));
        }
    }
    uint32_t cap = idx->nsw_cap;
    while (cap > 16 && (uint64_t)nns * 4 <= cap)
        cap /= 2;
    if (nns == 0)
        cap = 0;
    if (cap != idx->nsw_cap &&
        acct_resize(idx, (void **)&idx->nsw, sizeof(ns_w_t), nns, idx->nsw_cap, cap) == KVT_OK)
        idx->nsw_cap = cap;
}

/* After a pod drop: trailing free pod ids go, and the pod arrays shrink with them. */
static void pods_trim(kvt_idx_t *idx)
{
    uint32_t hi = idx->pod_hi;
    while (hi > 0 && idx->pods[hi - 1].name == NULL)
        hi--;
    if (hi == idx->pod_hi)
        return;
    uint32_t k = 0;
    for (uint32_t i = 0; i < idx->npod_free; i++)
        if (idx->pod_free[i] < hi)
            idx->pod_free[k++] = idx->pod_free[i];
    idx->npod_free = k;
    idx->pod_hi = hi;
    uint32_t cap = idx->pods_alloc;
    while (cap > 16 && (uint64_t)hi * 4 <= cap)
        cap /= 2;
    if (hi == 0)
        cap = 0;
    if (cap == idx->pods_alloc)
        return;
    kvt_pod_t *np = NULL;
    uint32_t *nf = NULL;
    if (cap > 0) {
        np = acct_alloc(idx, (size_t)cap * sizeof(kvt_pod_t));
        nf = acct_alloc(idx, (size_t)cap * sizeof(uint32_t));
        if (np == NULL || nf == NULL) {
            acct_free(idx, np, (size_t)cap * sizeof(kvt_pod_t));
            acct_free(idx, nf, (size_t)cap * sizeof(uint32_t));
            return; /* the bigger arrays stay */
        }
        memcpy(np, idx->pods, (size_t)hi * sizeof(kvt_pod_t));
        memcpy(nf, idx->pod_free, (size_t)k * sizeof(uint32_t));
    }
    acct_free(idx, idx->pods, (size_t)idx->pods_alloc * sizeof(kvt_pod_t));
    acct_free(idx, idx->pod_free, (size_t)idx->pods_alloc * sizeof(uint32_t));
    idx->pods = np;
    idx->pod_free = nf;
    idx->pods_alloc = cap;
}

/*
 * After drops (and when the index is empty): gives back what no longer holds
 * anything (stale speculative items, an unused alias array, emptied node
 * slabs and set chunks) and shrinks sparse tables. Only between writes.
 */
static void idx_trim(kvt_idx_t *idx)
{
    spec_compact(idx);
    if (idx->alias_live == 0 && idx->spec_len == 0 && idx->alias_cap > 0) {
        /* every ring item was stale and is gone: no alias index is referenced */
        acct_free(idx, idx->alias, (size_t)idx->alias_cap * sizeof(kvt_alias_t));
        idx->alias = NULL;
        idx->alias_used = idx->alias_cap = 0;
        idx->alias_free = KVT_NIL;
    }
    nodes_trim(idx);
    sets_trim(idx);
    shrink_tables(idx);
}

/*
 * Room for @bytes of pods' and namespaces' memory: what the budget has free,
 * the reserve (admin_reserve()) included, after giving back what drops left
 * (idx_trim(); between writes only). Blocks are not evicted for it: that
 * frees slab slots, not bytes, so it would empty much of the index before a
 * table shrank enough; past the reserve, creation is refused instead.
 */
static bool room_admin(kvt_idx_t *idx, size_t bytes)
{
    if (!over_limit(idx, bytes, 0))
        return true;
    idx_trim(idx);
    return !over_limit(idx, bytes, 0);
}

/* ---- public API -------------------------------------------------------------- */

kvt_status_t kvt_idx_create(const kvt_idx_config_t *cfg, kvt_idx_t **idx_p)
{
    kvt_idx_t *idx = calloc(1, sizeof(*idx));
    if (idx == NULL)
        return KVT_ERR_NO_MEM;
    idx->bytes = sizeof(*idx);
    if (cfg != NULL)
        idx->cfg = *cfg;
    if (idx->cfg.max_readers == 0)
        idx->cfg.max_readers = 64;
    if (idx->cfg.max_readers > 4096) {
        free(idx);
        return KVT_ERR_INVAL;
    }
    idx->node_free = KVT_NIL;
    idx->alias_free = KVT_NIL;
    idx->pin[0] = idx->pin[1] = KVT_NIL;
    idx->pin_pod = KVT_NIL;
    idx->trim_below = UINT64_MAX;
    if (kvt_ebr_init(&idx->sh.ebr, idx->cfg.max_readers) != KVT_OK)
        goto err_free;
    idx->bytes += sizeof(kvt_ebr_slot_t) * idx->cfg.max_readers;
    idx->sh.ktab = ktab_new(idx, KTAB_MIN_GROUPS);
    idx->sh.nodes = dir_new(idx);
    idx->sh.sets = dir_new(idx);
    idx->sh.nss = dir_new(idx);
    if (!idx->sh.ktab || !idx->sh.nodes || !idx->sh.sets || !idx->sh.nss)
        goto err_destroy;
    *idx_p = idx;
    return KVT_OK;

err_destroy:
    kvt_idx_destroy(idx);
    return KVT_ERR_NO_MEM;
err_free:
    free(idx);
    return KVT_ERR_NO_MEM;
}

void kvt_idx_destroy(kvt_idx_t *idx)
{
    if (idx == NULL)
        return;
    for (uint32_t p = 0; p < idx->pod_hi; p++) {
        free(idx->pods[p].name);
        free(idx->pods[p].g);
    }
    free(idx->pods);
    free(idx->pod_free);
    free(idx->pod_map.hash);
    free(idx->ns_map.hash);
    free(idx->alias);
    free(idx->spec);
    free(idx->set_free);
    if (idx->sh.sets != NULL) {
        for (uint32_t h = 0; h < idx->sets_used; h++)
            free(*dir_set(idx->sh.sets, h));
        for (uint32_t i = 0; i < idx->sh.sets->n; i++)
            free(idx->sh.sets->chunk[i]);
        free(idx->sh.sets);
    }
    for (uint32_t i = 0; i < idx->sh.nns; i++) {
        free(idx->nsw[i].model);
        free(idx->nsw[i].lora);
    }
    free(idx->nsw);
    if (idx->sh.nss != NULL) {
        for (uint32_t i = 0; i < idx->sh.nss->n; i++)
            free(idx->sh.nss->chunk[i]);
        free(idx->sh.nss);
    }
    if (idx->sh.nodes != NULL) {
        for (uint32_t i = 0; i < idx->nslabs; i++)
            free(idx->slabs[i]);
        for (uint32_t i = 0; i < idx->sh.nodes->n; i++)
            free(idx->node_ns[i]);
        free(idx->sh.nodes);
    }
    free(idx->slabs);
    free(idx->node_ns);
    free(idx->sh.ktab);
    kvt_ebr_cleanup(&idx->sh.ebr);
    free(idx);
}

kvt_status_t kvt_idx_ns_get(kvt_idx_t *idx, const char *model, const char *lora,
                            uint32_t block_size, uint32_t *ns_p)
{
    if (model == NULL || model[0] == '\0')
        return KVT_ERR_INVAL;
    if (lora == NULL)
        lora = "";
    if (strlen(model) > KVT_IDX_MAX_NAME || strlen(lora) > KVT_IDX_MAX_NAME)
        return KVT_ERR_TOO_BIG;
    uint64_t h = name_hash(model, lora, 0);
    uint32_t found = nmap_find(idx, &idx->ns_map, h, ns_eq, model, lora, 0);
    if (found != KVT_NIL) {
        ns_w_t *w = &idx->nsw[idx->ns_map.id[found]];
        if (block_size != 0 && block_size != w->block_size)
            return KVT_ERR_INVAL;
        w->last_use = idx->now_ms;
        *ns_p = w->id;
        return KVT_OK;
    }
    if (block_size == 0)
        return KVT_ERR_NOT_FOUND;
    if (idx->ns_live >= KVT_IDX_MAX_NS)
        return KVT_ERR_LIMIT;
    /* the lowest free slot, so trailing slots stay free and can be given back */
    uint32_t slot = idx->ns_hint;
    while (slot < idx->sh.nns && idx->nsw[slot].model != NULL)
        slot++;
    idx->ns_hint = slot;
    bool new_chunk = (slot >> NS_CHUNK_SHIFT) >= idx->sh.nss->n;
    uint32_t wcap = idx->nsw_cap;
    if (slot >= wcap)
        wcap = wcap ? wcap * 2 : 16;
    size_t need = strlen(model) + strlen(lora) + 2 + nmap_grow_bytes(&idx->ns_map) +
                  (wcap != idx->nsw_cap ? (size_t)wcap * sizeof(ns_w_t) : 0) +
                  (new_chunk ? NS_CHUNK * sizeof(kvt_ns_t) + dir_grow_bytes(idx->sh.nss) : 0);
    if (!room_admin(idx, need)) {
        idx->refused++;
        return KVT_ERR_NO_SPACE;
    }
    if (wcap != idx->nsw_cap) {
        if (acct_resize(idx, (void **)&idx->nsw, sizeof(ns_w_t), idx->sh.nns, idx->nsw_cap, wcap) !=
            KVT_OK)
            return KVT_ERR_NO_MEM;
        idx->nsw_cap = wcap;
    }
    if (new_chunk) {
        kvt_ns_t *c = acct_alloc(idx, NS_CHUNK * sizeof(kvt_ns_t));
        if (c == NULL)
            return KVT_ERR_NO_MEM;
        for (uint32_t i = 0; i < NS_CHUNK; i++)
            c[i] = (kvt_ns_t){0, NS_ID_FREE, 0};
        if (dir_append(idx, &idx->sh.nss, c) != KVT_OK) {
            acct_free(idx, c, NS_CHUNK * sizeof(kvt_ns_t));
            return KVT_ERR_NO_MEM;
        }
    }
    size_t b1 = 0, b2 = 0;
    char *m = acct_strdup(idx, model, &b1), *l = acct_strdup(idx, lora, &b2);
    if (m == NULL || l == NULL || nmap_add(idx, &idx->ns_map, h, slot) != KVT_OK)
        goto err_names;
    uint32_t gen = 0;
    if (slot < idx->ns_hw) {
        /* a reused slot: ids handed out for it before must not match */
        idx->ns_gen = idx->ns_gen >= NS_GEN_MAX ? 1 : idx->ns_gen + 1;
        gen = idx->ns_gen;
    }
    /* the very first namespace has salt 0: its keys are the sequence keys themselves */
    uint64_t salt = idx->ns_hw == 0 ? 0 : kvt_mix64(h | 1);
    uint32_t id = NS_ID(gen, slot);
    idx->nsw[slot] = (ns_w_t){m, l, salt, 0, idx->now_ms, id, block_size};
    kvt_ns_t *r = dir_ns(idx->sh.nss, slot);
    /* the slot reads free (since its drop or its chunk's creation) while the salt changes */
    __atomic_store_n(&r->id, NS_ID_FREE, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&r->salt, salt, __ATOMIC_RELAXED);
    __atomic_store_n(&r->id, id, __ATOMIC_RELEASE);
    if (slot >= idx->sh.nns)
        __atomic_store_n(&idx->sh.nns, slot + 1, __ATOMIC_RELEASE);
    if (slot >= idx->ns_hw)
        idx->ns_hw = slot + 1;
    idx->ns_hint = slot + 1;
    idx->ns_live++;
    *ns_p = id;
    return KVT_OK;

err_names:
    acct_free(idx, m, b1);
    acct_free(idx, l, b2);
    return KVT_ERR_NO_MEM;
}

kvt_status_t kvt_idx_ns_drop(kvt_idx_t *idx, uint32_t ns, uint64_t *blocks_p)
{
    uint32_t slot;
    if (!ns_slot(idx, ns, &slot))
        return KVT_ERR_NOT_FOUND;
    uint64_t blocks = idx->nsw[slot].blocks;
    /* from here on queries with the id answer nothing, rather than a namespace half gone */
    kvt_ns_t *r = dir_ns(idx->sh.nss, slot);
    __atomic_store_n(&r->id, NS_ID_FREE, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    /*
     * Nodes do not list their namespace's other nodes: scan the slab. A node
     * whose holders are gone frees itself once childless, and so do its
     * ancestors. Chains stay within a namespace (a parent is looked up with
     * the store's own salt), so once the count is 0 nothing is left; a node
     * of another namespace linked to one of these (a salted-key collision)
     * is unlinked.
     */
    for (uint32_t nid = 0; nid < idx->nodes_used && idx->nsw[slot].blocks > 0; nid++) {
        kvt_node_t *n = N(idx, nid);
        if (n->pods == PODS_FREE)
            continue;
        if (*node_ns(idx, nid) == slot) {
            node_strip(idx, nid);
            node_maybe_free(idx, nid); /* one that held nothing; a no-op once freed */
        } else if (n->parent != KVT_NIL && *node_ns(idx, n->parent) == slot) {
            uint32_t parent = n->parent;
            n->parent = KVT_NIL;
            N(idx, parent)->nchild--;
            node_maybe_free(idx, parent);
        }
    }
    ns_w_t *w = &idx->nsw[slot];
    uint32_t mi =
        nmap_find(idx, &idx->ns_map, name_hash(w->model, w->lora, 0), ns_eq, w->model, w->lora, 0);
    if (mi != KVT_NIL)
        nmap_del(idx, &idx->ns_map, mi);
    acct_strfree(idx, w->model);
    acct_strfree(idx, w->lora);
    *w = (ns_w_t){NULL, NULL, 0, 0, 0, NS_ID_FREE, 0};
    idx->ns_live--;
    if (slot < idx->ns_hint)
        idx->ns_hint = slot;
    ns_trim(idx);
    idx_trim(idx);
    if (blocks_p != NULL)
        *blocks_p = blocks;
    return KVT_OK;
}

uint32_t kvt_idx_ns_count(const kvt_idx_t *idx)
{
    return __atomic_load_n(&idx_shared((kvt_idx_t *)idx)->nns, __ATOMIC_ACQUIRE);
}

uint32_t kvt_idx_ns_id(const kvt_idx_t *idx, uint32_t slot)
{
    return slot < idx->sh.nns ? idx->nsw[slot].id : KVT_IDX_NS_NONE;
}

const char *kvt_idx_ns_name(const kvt_idx_t *idx, uint32_t ns, const char **lora_p)
{
    uint32_t slot;
    if (!ns_slot(idx, ns, &slot))
        return NULL;
    if (lora_p != NULL)
        *lora_p = idx->nsw[slot].lora;
    return idx->nsw[slot].model;
}

uint64_t kvt_idx_ns_blocks(const kvt_idx_t *idx, uint32_t ns)
{
    uint32_t slot;
    return ns_slot(idx, ns, &slot) ? idx->nsw[slot].blocks : 0;
}

uint64_t kvt_idx_ns_last_use(const kvt_idx_t *idx, uint32_t ns)
{
    uint32_t slot;
    return ns_slot(idx, ns, &slot) ? idx->nsw[slot].last_use : 0;
}

uint32_t kvt_idx_pod_limit(const kvt_idx_t *idx)
{
    return idx->pod_hi;
}

uint32_t kvt_idx_ns_block_size(const kvt_idx_t *idx, uint32_t ns)
{
    uint32_t slot;
    return ns_slot(idx, ns, &slot) ? idx->nsw[slot].block_size : 0;
}

uint64_t kvt_idx_salted_key(const kvt_idx_t *idx, uint32_t ns, uint64_t key)
{
    uint32_t slot;
    return ns_slot(idx, ns, &slot) ? key ^ idx->nsw[slot].salt : key;
}

kvt_status_t kvt_idx_pod_find(const kvt_idx_t *cidx, const char *name, uint32_t dp_rank,
                              uint32_t *pod_p)
{
    kvt_idx_t *idx = (kvt_idx_t *)cidx;
    if (name == NULL)
        return KVT_ERR_INVAL;
    uint32_t slot =
        nmap_find(idx, &idx->pod_map, name_hash(name, "", dp_rank), pod_eq, name, "", dp_rank);
    if (slot == KVT_NIL)
        return KVT_ERR_NOT_FOUND;
    *pod_p = idx->pod_map.id[slot];
    return KVT_OK;
}

kvt_status_t kvt_idx_pod_get(kvt_idx_t *idx, const char *name, uint32_t dp_rank, uint32_t *pod_p)
{
    if (name == NULL || name[0] == '\0')
        return KVT_ERR_INVAL;
    if (strlen(name) > KVT_IDX_MAX_NAME)
        return KVT_ERR_TOO_BIG;
    if (kvt_idx_pod_find(idx, name, dp_rank, pod_p) == KVT_OK)
        return KVT_OK;
    bool fresh = idx->npod_free == 0;
    if (fresh && idx->pod_hi >= KVT_IDX_MAX_PODS)
        return KVT_ERR_LIMIT;
    uint32_t cap = idx->pods_alloc;
    if (fresh && idx->pod_hi == cap)
        cap = cap ? cap * 2 : 16;
    size_t need =
        strlen(name) + 1 + nmap_grow_bytes(&idx->pod_map) +
        (cap != idx->pods_alloc ? (size_t)cap * (sizeof(kvt_pod_t) + sizeof(uint32_t)) : 0);
    if (!room_admin(idx, need)) {
        idx->refused++;
        return KVT_ERR_NO_SPACE;
    }
    if (cap != idx->pods_alloc) {
        kvt_pod_t *np = acct_alloc(idx, (size_t)cap * sizeof(kvt_pod_t));
        uint32_t *nf = acct_alloc(idx, (size_t)cap * sizeof(uint32_t));
        if (np == NULL || nf == NULL) {
            acct_free(idx, np, (size_t)cap * sizeof(kvt_pod_t));
            acct_free(idx, nf, (size_t)cap * sizeof(uint32_t));
            return KVT_ERR_NO_MEM;
        }
        if (idx->pods != NULL) {
            memcpy(np, idx->pods, (size_t)idx->pod_hi * sizeof(kvt_pod_t));
            memcpy(nf, idx->pod_free, (size_t)idx->npod_free * sizeof(uint32_t));
        }
        acct_free(idx, idx->pods, (size_t)idx->pods_alloc * sizeof(kvt_pod_t));
        acct_free(idx, idx->pod_free, (size_t)idx->pods_alloc * sizeof(uint32_t));
        idx->pods = np;
        idx->pod_free = nf;
        idx->pods_alloc = cap;
    }
    uint32_t id = fresh ? idx->pod_hi : idx->pod_free[idx->npod_free - 1];
    kvt_pod_t *p = &idx->pods[id];
    memset(p, 0, sizeof(*p)); /* an entry past pod_hi may be uninitialized */
    p->name = acct_strdup(idx, name, &p->name_bytes);
    if (p->name == NULL)
        return KVT_ERR_NO_MEM;
    p->dp_rank = dp_rank;
    p->last_write = idx->now_ms;
    if (nmap_add(idx, &idx->pod_map, name_hash(name, "", dp_rank), id) != KVT_OK) {
        acct_free(idx, p->name, p->name_bytes);
        p->name = NULL;
        return KVT_ERR_NO_MEM;
    }
    if (fresh) {
        idx->pod_hi++;
        if (idx->pod_hi > idx->sh.pod_cap)
            __atomic_store_n(&idx->sh.pod_cap, idx->pod_hi, __ATOMIC_RELEASE);
    } else {
        idx->npod_free--;
    }
    idx->npods_live++;
    *pod_p = id;
    return KVT_OK;
}

static kvt_pod_t *pod_live(kvt_idx_t *idx, uint32_t pod)
{
    if (pod >= idx->pod_hi || idx->pods[pod].name == NULL)
        return NULL;
    return &idx->pods[pod];
}

const char *kvt_idx_pod_name(const kvt_idx_t *idx, uint32_t pod, uint32_t *dp_rank_p)
{
    kvt_pod_t *p = pod_live((kvt_idx_t *)idx, pod);
    if (p == NULL)
        return NULL;
    if (dp_rank_p != NULL)
        *dp_rank_p = p->dp_rank;
    return p->name;
}

uint64_t kvt_idx_pod_entries(const kvt_idx_t *idx, uint32_t pod)
{
    kvt_pod_t *p = pod_live((kvt_idx_t *)idx, pod);
    return p ? p->entries : 0;
}

uint64_t kvt_idx_pod_last_write(const kvt_idx_t *idx, uint32_t pod)
{
    kvt_pod_t *p = pod_live((kvt_idx_t *)idx, pod);
    return p ? p->last_write : 0;
}

kvt_status_t kvt_idx_pod_key(const kvt_idx_t *cidx, uint32_t pod, uint32_t ns, uint64_t ehash,
                             uint64_t *key_p)
{
    kvt_idx_t *idx = (kvt_idx_t *)cidx;
    kvt_pod_t *p = pod_live(idx, pod);
    uint32_t slot;
    if (p == NULL || !ns_slot(idx, ns, &slot))
        return KVT_ERR_INVAL;
    uint32_t ps = ptab_find(idx, p, ehash, false);
    if (ps == KVT_NIL)
        return KVT_ERR_NOT_FOUND;
    kvt_node_t *n = N(idx, ref_node(idx, PREF(p, ps)));
    *key_p = n->key ^ idx->nsw[slot].salt;
    return KVT_OK;
}

kvt_status_t kvt_idx_pod_clear(kvt_idx_t *idx, uint32_t pod, unsigned tiers)
{
    kvt_pod_t *p = pod_live(idx, pod);
    if (p == NULL || (tiers & ~KVT_TIER_ALL) != 0)
        return KVT_ERR_INVAL;
    p->last_write = idx->now_ms;
    for (uint32_t i = 0; p->g != NULL && i < PSLOT(p->ngroups, 0); i++) {
        if ((i & 15u) >= KVT_GRP_SLOTS || p->g[i >> 4].ctrl[i & 15u] < 0x80u)
            continue;
        uint32_t ref = PREF(p, i);
        if ((ref & ALIAS_BIT) && (idx->alias[ref & ~ALIAS_BIT].flags & ALIAS_SPEC)) {
            if (tiers == KVT_TIER_ALL)
                ref_drop(idx, pod, i);
        } else {
            ref_clear_tiers(idx, pod, i, tiers);
        }
    }
    ptab_maybe_shrink(idx, p);
    return KVT_OK;
}

kvt_status_t kvt_idx_pod_drop(kvt_idx_t *idx, uint32_t pod)
{
    kvt_pod_t *p = pod_live(idx, pod);
    if (p == NULL)
        return KVT_ERR_NOT_FOUND;
    kvt_idx_pod_clear(idx, pod, KVT_TIER_ALL);
    uint32_t slot = nmap_find(idx, &idx->pod_map, name_hash(p->name, "", p->dp_rank), pod_eq,
                              p->name, "", p->dp_rank);
    if (slot != KVT_NIL)
        nmap_del(idx, &idx->pod_map, slot);
    if (p->g != NULL)
        acct_free(idx, p->g, ptab_bytes(p->ngroups));
    acct_free(idx, p->name, p->name_bytes);
    memset(p, 0, sizeof(*p));
    idx->pod_free[idx->npod_free++] = pod;
    idx->npods_live--;
    pods_trim(idx);
    idx_trim(idx);
    return KVT_OK;
}

/* Salt and slot of current namespace id @ns; false when it is not current. */
static inline bool ns_salt(kvt_idx_t *idx, uint32_t ns, uint64_t *salt_p, uint32_t *slot_p)
{
    if (!ns_slot(idx, ns, slot_p))
        return false;
    *salt_p = idx->nsw[*slot_p].salt;
    return true;
}

/* Node @nid was found for a store under @parent: learns a late parent, stamps, pins. */
static void node_found(kvt_idx_t *idx, uint32_t nid, uint32_t parent)
{
    kvt_node_t *n = N(idx, nid);
    if (n->parent == KVT_NIL && parent != KVT_NIL && parent != nid) {
        /* learn a parent reported late, unless that would close a cycle */
        uint32_t a = parent;
        int depth = 0;
        while (a != KVT_NIL && a != nid && depth++ < 4096)
            a = N(idx, a)->parent;
        if (a == KVT_NIL) {
            n->parent = parent;
            N(idx, parent)->nchild++;
        }
    }
    __atomic_store_n(&n->stamp, idx->sh.clock32, __ATOMIC_RELAXED);
    idx->pin[1] = nid;
}

/*
 * Creates the node for salted key @key (absent; @h = kvt_mix64(key)) of
 * namespace slot @slot under @parent, holding @pods (PODS_EMPTY, or one
 * inline element whose table reference the caller adds). Pins it.
 */
static kvt_status_t node_create_h(kvt_idx_t *idx, uint64_t key, uint64_t h, uint64_t eh,
                                  uint32_t parent, uint32_t pods, uint32_t slot, uint32_t *nid_p)
{
    uint32_t nid;
    /* the node stays PODS_FREE until inserted: a rebuild in between skips it */
    kvt_status_t st = node_alloc(idx, &nid);
    if (st != KVT_OK)
        return st;
    idx->pin[1] = nid;
    st = ktab_reserve(idx);
    if (st != KVT_OK) {
        N(idx, nid)->parent = idx->node_free;
        idx->node_free = nid;
        return st;
    }
    kvt_node_t *n = N(idx, nid);
    n->ehash = eh;
    n->parent = parent;
    n->nchild = 0;
    if (parent != KVT_NIL)
        N(idx, parent)->nchild++;
    idx->live_nodes++;
    *node_ns(idx, nid) = (uint16_t)slot;
    idx->nsw[slot].blocks++;
    wbegin(idx, nid);
    __atomic_store_n(&n->key, key, __ATOMIC_RELAXED);
    __atomic_store_n(&n->stamp, idx->sh.clock32, __ATOMIC_RELAXED);
    __atomic_store_n(&n->pods, pods, __ATOMIC_RELAXED);
    wend(idx, nid);
    ktab_put_h(idx->sh.ktab, h, nid);
    idx->kt_live++;
    if (pods != PODS_EMPTY) {
        idx->entries++;
        idx->pods[ELEM_POD(pods)].entries++;
        tiers_moved(idx, 0, ELEM_TIERS(pods));
    }
    *nid_p = nid;
    return KVT_OK;
}

/* Finds or creates the node for salted key @key of slot @slot under @parent. Pins it. */
static kvt_status_t node_get(kvt_idx_t *idx, uint64_t key, uint64_t eh, uint32_t parent,
                             uint32_t slot, uint32_t *nid_p)
{
    uint64_t h = kvt_mix64(key);
    uint32_t nid = ktab_lookup_h(idx, key, h);
    if (nid != KVT_NIL) {
        node_found(idx, nid, parent);
        *nid_p = nid;
        return KVT_OK;
    }
    return node_create_h(idx, key, h, eh, parent, PODS_EMPTY, slot, nid_p);
}

static bool tier_ok(unsigned tier)
{
    return tier == KVT_TIER_GPU || tier == KVT_TIER_CPU || tier == KVT_TIER_DISK;
}

/*
 * Ends a store or speculate that stopped with @st before its last @left
 * blocks. A full budget with nothing evictable but this chain's own tail is
 * not an error: the chain keeps its prefix and the rest is counted as dropped.
 */
static kvt_status_t write_stopped(kvt_idx_t *idx, kvt_status_t st, size_t left)
{
    if (st != KVT_ERR_NO_SPACE)
        return st;
    idx->dropped += left;
    return KVT_OK;
}

static void write_done(kvt_idx_t *idx)
{
    idx->pin[0] = idx->pin[1] = KVT_NIL;
    idx->pin_pod = KVT_NIL;
}

/*
 * A store works in chunks of STORE_CHUNK blocks: one pass hashes the chunk's
 * keys and engine hashes once (every later probe and insert reuses them) and
 * prefetches their key-table and pod-table groups; the apply pass then also
 * fetches the node of block i + 4 while block i is applied.
 */
enum { STORE_CHUNK = 32 };

static inline void store_hash_chunk(kvt_idx_t *idx, uint32_t pod, uint64_t salt,
                                    const uint64_t *keys, const uint64_t *ehashes, size_t n,
                                    uint64_t *hk, uint64_t *hp)
{
    const kvt_ktab_t *t = idx->sh.ktab;
    const kvt_pod_t *p = &idx->pods[pod];
    for (size_t j = 0; j < n; j++) {
        hk[j] = kvt_mix64(keys[j] ^ salt);
        hp[j] = kvt_mix64(ehashes ? ehashes[j] : keys[j]);
        __builtin_prefetch(&t->g[kvt_grp_home(hk[j], t->ngroups)]);
        if (p->g != NULL)
            __builtin_prefetch(&p->g[kvt_grp_home(hp[j], p->ngroups)]);
    }
}

/* Prefetch hint for the node a key probably maps to; changes nothing. */
static inline void store_prefetch_node(kvt_idx_t *idx, uint64_t h)
{
    const kvt_ktab_t *t = idx->sh.ktab;
    const kvt_group_t *g = &t->g[kvt_grp_home(h, t->ngroups)];
    uint32_t m = kvt_grp_match(g, kvt_grp_tag(h));
    if (m != 0)
        __builtin_prefetch(N(idx, g->slot[__builtin_ctz(m)]));
}

/*
 * One block of a store. A block no pod holds yet, on a pod whose table does
 * not know its engine hash (the usual new block), is created already holding
 * the pod: one seqlock bracket and no holder search. Everything else takes
 * the general path (node_get_h, then ref_add_h).
 */
static kvt_status_t store_one(kvt_idx_t *idx, uint64_t key, uint64_t h, uint64_t eh, uint64_t ph,
                              uint32_t parent, uint32_t pod, unsigned tier, uint32_t slot,
                              uint32_t *nid_p)
{
    uint32_t nid = ktab_lookup_h(idx, key, h);
    if (nid != KVT_NIL) {
        node_found(idx, nid, parent);
        *nid_p = nid;
        return ref_add_h(idx, nid, pod, eh, ph, tier);
    }
    if (ptab_find_h(idx, &idx->pods[pod], eh, ph, false) != KVT_NIL) {
        /* the pod maps this engine hash to another block: the general path drops that */
        kvt_status_t st = node_create_h(idx, key, h, eh, parent, PODS_EMPTY, slot, nid_p);
        return st == KVT_OK ? ref_add_h(idx, *nid_p, pod, eh, ph, tier) : st;
    }
    kvt_status_t st = ptab_reserve(idx, pod); /* may evict; the pod's table is pinned */
    if (st != KVT_OK)
        return st;
    st = node_create_h(idx, key, h, eh, parent, ELEM_MAKE(pod, tier, tier, 0), slot, nid_p);
    if (st != KVT_OK)
        return st;
    kvt_pod_t *p = &idx->pods[pod];
    kvt_grp_put(p->g, p->ngroups, ph, *nid_p); /* the node's own hash: a main reference */
    p->live++;
    return KVT_OK;
}

kvt_status_t kvt_idx_store(kvt_idx_t *idx, uint32_t ns, uint32_t pod, unsigned tier,
                           const uint64_t *parent_key, const uint64_t *keys,
                           const uint64_t *ehashes, size_t n)
{
    uint64_t salt;
    uint32_t slot;
    kvt_pod_t *p = pod_live(idx, pod);
    if (!ns_salt(idx, ns, &salt, &slot) || p == NULL || !tier_ok(tier) || (n > 0 && keys == NULL))
        return KVT_ERR_INVAL;
    p->last_write = idx->now_ms;
    idx->nsw[slot].last_use = idx->now_ms;
    uint32_t parent = parent_key ? ktab_lookup(idx, *parent_key ^ salt) : KVT_NIL;
    kvt_status_t st = KVT_OK;
    uint64_t hk[STORE_CHUNK], hp[STORE_CHUNK];
    idx->pin_pod = pod;
    for (size_t c0 = 0; c0 < n; c0 += STORE_CHUNK) {
        size_t cn = n - c0 < STORE_CHUNK ? n - c0 : STORE_CHUNK;
        store_hash_chunk(idx, pod, salt, keys + c0, ehashes ? ehashes + c0 : NULL, cn, hk, hp);
        for (size_t j = 0; j < cn; j++) {
            size_t i = c0 + j;
            uint64_t eh = ehashes ? ehashes[i] : keys[i];
            uint32_t nid = KVT_NIL;
            if (j + 4 < cn)
                store_prefetch_node(idx, hk[j + 4]);
            idx->pin[0] = parent;
            idx->pin[1] = KVT_NIL;
            st = store_one(idx, keys[i] ^ salt, hk[j], eh, hp[j], parent, pod, tier, slot, &nid);
            if (st != KVT_OK) {
                idx->pin[0] = KVT_NIL;
                idx->pin[1] = KVT_NIL;
                node_maybe_free(idx, nid);
                st = write_stopped(idx, st, n - i);
                goto out;
            }
            parent = nid;
        }
    }
out:
    write_done(idx);
    return st;
}

kvt_status_t kvt_idx_store_by_ehash(kvt_idx_t *idx, uint32_t pod, unsigned tier,
                                    const uint64_t *ehashes, size_t n, size_t *unresolved_p)
{
    kvt_pod_t *p = pod_live(idx, pod);
    if (p == NULL || !tier_ok(tier) || (n > 0 && ehashes == NULL))
        return KVT_ERR_INVAL;
    p->last_write = idx->now_ms;
    size_t unresolved = 0;
    kvt_status_t st = KVT_OK;
    idx->pin_pod = pod;
    for (size_t i = 0; i < n; i++) {
        uint32_t slot = ptab_find(idx, p, ehashes[i], false);
        if (slot == KVT_NIL) {
            unresolved++;
            continue;
        }
        uint32_t nid = ref_node(idx, PREF(p, slot));
        idx->pin[1] = nid;
        __atomic_store_n(&N(idx, nid)->stamp, idx->sh.clock32, __ATOMIC_RELAXED);
        st = ref_add(idx, nid, pod, ehashes[i], tier);
        if (st != KVT_OK)
            break;
        p = &idx->pods[pod];
    }
    write_done(idx);
    if (unresolved_p != NULL)
        *unresolved_p = unresolved;
    return st;
}

/* True when removing @tiers from the reference @ref of @pod leaves it no tier (it is dropped). */
static bool ref_goes(kvt_idx_t *idx, uint32_t pod, uint32_t ref, unsigned tiers)
{
    unsigned have;
    if (ref & ALIAS_BIT) {
        have = idx->alias[ref & ~ALIAS_BIT].tiers;
    } else {
        kvt_node_t *n = N(idx, ref);
        have = ELEM_MAIN(*node_elem(idx, n, pod));
    }
    return (have & tiers) != 0 && (have & ~tiers) == 0;
}

/* What a reference of node @nid under engine hash @eh named: for kvt_idx_remove_report(). */
static void gone_fill(kvt_idx_t *idx, uint32_t nid, uint64_t eh, kvt_idx_gone_t *g)
{
    const kvt_node_t *n = N(idx, nid);
    const ns_w_t *w = &idx->nsw[*node_ns(idx, nid)];
    g->ehash = eh;
    g->key = n->key ^ w->salt;
    g->ns = w->id;
    g->has_parent = n->parent != KVT_NIL;
    g->parent_key = 0;
    if (n->parent != KVT_NIL)
        g->parent_key = N(idx, n->parent)->key ^ idx->nsw[*node_ns(idx, n->parent)].salt;
}

kvt_status_t kvt_idx_remove_report(kvt_idx_t *idx, uint32_t pod, unsigned tiers,
                                   const uint64_t *ehashes, size_t n, size_t *unresolved_p,
                                   kvt_idx_gone_t *gone, size_t *ngone_p)
{
    kvt_pod_t *p = pod_live(idx, pod);
    if (p == NULL || tiers == 0 || (tiers & ~KVT_TIER_ALL) != 0 || (n > 0 && ehashes == NULL))
        return KVT_ERR_INVAL;
    p->last_write = idx->now_ms;
    size_t unresolved = 0, ngone = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t slot = ptab_find(idx, p, ehashes[i], false);
        if (slot == KVT_NIL) {
            unresolved++;
            continue;
        }
        if (gone != NULL) {
            uint32_t ref = PREF(p, slot);
            if (ref_goes(idx, pod, ref, tiers))
                gone_fill(idx, ref_node(idx, ref), ehashes[i], &gone[ngone++]);
        }
        ref_clear_tiers(idx, pod, slot, tiers);
    }
    if (unresolved_p != NULL)
        *unresolved_p = unresolved;
    if (ngone_p != NULL)
        *ngone_p = ngone;
    return KVT_OK;
}

kvt_status_t kvt_idx_remove(kvt_idx_t *idx, uint32_t pod, unsigned tiers, const uint64_t *ehashes,
                            size_t n, size_t *unresolved_p)
{
    return kvt_idx_remove_report(idx, pod, tiers, ehashes, n, unresolved_p, NULL, NULL);
}

static kvt_status_t spec_push(kvt_idx_t *idx, uint64_t expiry, uint32_t alias)
{
    if (idx->spec_len == idx->spec_cap) {
        size_t cap = idx->spec_cap ? idx->spec_cap * 2 : 64;
        if (!room(idx, cap * sizeof(spec_item_t)))
            return KVT_ERR_NO_SPACE;
        spec_item_t *s = acct_alloc(idx, cap * sizeof(spec_item_t));
        if (s == NULL)
            return KVT_ERR_NO_MEM;
        for (size_t i = 0; i < idx->spec_len; i++)
            s[i] = idx->spec[(idx->spec_head + i) % idx->spec_cap];
        acct_free(idx, idx->spec, idx->spec_cap * sizeof(spec_item_t));
        idx->spec = s;
        idx->spec_cap = cap;
        idx->spec_head = 0;
    }
    /* keep expiry order even if TTLs differ: insertion sort from the tail */
    size_t i = idx->spec_len++;
    while (i > 0) {
        spec_item_t *prev = &idx->spec[(idx->spec_head + i - 1) % idx->spec_cap];
        if (prev->expiry <= expiry)
            break;
        idx->spec[(idx->spec_head + i) % idx->spec_cap] = *prev;
        i--;
    }
    idx->spec[(idx->spec_head + i) % idx->spec_cap] =
        (spec_item_t){expiry, alias, idx->alias[alias].serial};
    return KVT_OK;
}

kvt_status_t kvt_idx_speculate(kvt_idx_t *idx, uint32_t ns, uint32_t pod, const uint64_t *keys,
                               size_t n, uint32_t ttl_ms)
{
    uint64_t salt;
    uint32_t slot;
    kvt_pod_t *p = pod_live(idx, pod);
    if (!ns_salt(idx, ns, &salt, &slot) || p == NULL || (n > 0 && keys == NULL))
        return KVT_ERR_INVAL;
    p->last_write = idx->now_ms;
    idx->nsw[slot].last_use = idx->now_ms;
    uint32_t parent = KVT_NIL;
    kvt_status_t st = KVT_OK;
    idx->pin_pod = pod;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = keys[i] ^ salt;
        uint32_t nid = KVT_NIL;
        idx->pin[0] = parent;
        idx->pin[1] = KVT_NIL;
        st = node_get(idx, key, keys[i], parent, slot, &nid);
        if (st != KVT_OK) {
            st = write_stopped(idx, st, n - i);
            break;
        }
        kvt_node_t *nd = N(idx, nid);
        kvt_elem_t *ep = node_elem(idx, nd, pod);
        if (ep == NULL || ELEM_TIERS(*ep) == 0) {
            uint32_t a;
            st = ptab_reserve(idx, pod);
            if (st == KVT_OK)
                st = alias_add(idx, nid, pod, spec_marker(key), KVT_TIER_SPEC, true, &a);
            if (st == KVT_OK)
                st = spec_push(idx, idx->now_ms + ttl_ms, a);
            if (st != KVT_OK) {
                uint32_t ps = ptab_find(idx, &idx->pods[pod], spec_marker(key), true);
                idx->pin[0] = idx->pin[1] = KVT_NIL;
                if (ps != KVT_NIL)
                    ref_drop(idx, pod, ps);
                else
                    node_maybe_free(idx, nid);
                st = write_stopped(idx, st, n - i);
                break;
            }
        }
        parent = nid;
    }
    write_done(idx);
    return st;
}

void kvt_idx_advance(kvt_idx_t *idx, uint64_t now_ms)
{
    kvt_ebr_reclaim(&idx->sh.ebr);
    if (now_ms <= idx->now_ms)
        return;
    idx->now_ms = now_ms;
    __atomic_store_n(&idx->sh.clock32, (uint32_t)now_ms, __ATOMIC_RELAXED);
    while (idx->spec_len > 0) {
        spec_item_t *it = &idx->spec[idx->spec_head];
        if (it->expiry > idx->now_ms)
            break;
        spec_item_t item = *it;
        idx->spec_head = (idx->spec_head + 1) % idx->spec_cap;
        idx->spec_len--;
        kvt_alias_t *a = &idx->alias[item.alias];
        if (a->serial != item.serial || !(a->flags & ALIAS_SPEC))
            continue; /* confirmed or dropped meanwhile */
        uint32_t slot = ptab_find(idx, &idx->pods[a->pod], a->ehash, true);
        if (slot != KVT_NIL)
            ref_drop(idx, a->pod, slot);
    }
    if (idx->live_nodes == 0 && (idx->nslabs > 0 || idx->sets_used > 0 || idx->alias_cap > 0))
        idx_trim(idx); /* everything went (removals, expiries): give the memory back */
}

void kvt_idx_stats(const kvt_idx_t *cidx, kvt_idx_stats_t *st)
{
    kvt_idx_t *idx = (kvt_idx_t *)cidx;
    st->blocks = __atomic_load_n(&idx->live_nodes, __ATOMIC_RELAXED);
    st->entries = __atomic_load_n(&idx->entries, __ATOMIC_RELAXED);
    st->bytes = __atomic_load_n(&idx->bytes, __ATOMIC_RELAXED) +
                __atomic_load_n(&idx->sh.ebr.limbo_bytes, __ATOMIC_RELAXED);
    st->evicted = __atomic_load_n(&idx->evicted, __ATOMIC_RELAXED);
    st->dropped = __atomic_load_n(&idx->dropped, __ATOMIC_RELAXED);
    st->refused = __atomic_load_n(&idx->refused, __ATOMIC_RELAXED);
    st->speculative = __atomic_load_n(&idx->spec_live, __ATOMIC_RELAXED);
    for (int t = 0; t < 3; t++)
        st->tier_entries[t] = __atomic_load_n(&idx->tier_entries[t], __ATOMIC_RELAXED);
    st->pods = __atomic_load_n(&idx->npods_live, __ATOMIC_RELAXED);
    st->namespaces = __atomic_load_n(&idx->ns_live, __ATOMIC_RELAXED);
}
