/*
 * kvindex/index_mem.c: the index's memory: accounting against the budget, chunk directories,
 * eviction of least recently used leaves, and giving memory back (trimming
 * node slabs, holder sets, tables, pods and namespaces).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/heap.h"
#include "kvindex/index_writer_int.h"

/* ---- accounting and counters ------------------------------------------ */

void *kvt_idx_acct_alloc(kvt_idx_t *idx, size_t bytes)
{
    void *p = malloc(bytes);
    if (p != NULL)
        idx->bytes += bytes;
    return p;
}

void *kvt_idx_huge_alloc(size_t bytes)
{
    void *p;
    if (posix_memalign(&p, KVT_HUGE, bytes) != 0)
        return NULL;
    (void)madvise(p, bytes & ~(KVT_HUGE - 1), MADV_HUGEPAGE);
    return p;
}

void *kvt_idx_acct_calloc(kvt_idx_t *idx, size_t bytes)
{
    void *p = calloc(1, bytes);
    if (p != NULL)
        idx->bytes += bytes;
    return p;
}

void kvt_idx_acct_free(kvt_idx_t *idx, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    free(p);
    idx->bytes -= bytes;
}

void kvt_idx_acct_retire(kvt_idx_t *idx, void *p, size_t bytes)
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
 * but returns bytes only when it frees a holder set or a table shrinks
 * (below 1/8 full): making room for anything but blocks by eviction alone
 * would evict most of the index. So blocks and their tables (node chunks,
 * key and pod tables, holder sets, aliases, the speculative ring) leave this
 * much of the budget free, for pods, namespaces and their names and maps.
 */
static uint64_t admin_reserve(const kvt_idx_t *idx)
{
    return idx->cfg.budget_bytes / 64;
}

/*
 * Room kept free for rebuilding the key table at its size: a rebuild holds
 * both tables, and a reader in a query may keep the old one (retired, still
 * counted) after it. Nothing else may use it, so a rebuild that only drops
 * tombstones always fits without evicting (eviction frees slots, not bytes).
 */
static uint64_t ktab_room(const kvt_idx_t *idx)
{
    return ktab_bytes(idx->sh.ktab->ngroups);
}

bool kvt_idx_over_budget(kvt_idx_t *idx, uint64_t extra)
{
    return over_limit(idx, extra, admin_reserve(idx) + ktab_room(idx));
}

bool kvt_idx_ktab_fits(kvt_idx_t *idx, uint32_t groups)
{
    uint64_t cur = ktab_room(idx), nb = ktab_bytes(groups);
    if (nb <= cur)
        return !over_limit(idx, nb, 0); /* the room kept for it */
    /* growing: the new table, and then the room to rebuild it, beside the blocks */
    return !over_limit(idx, 2 * nb - cur, admin_reserve(idx));
}

kvt_status_t kvt_idx_acct_resize(kvt_idx_t *idx, void **arrp, size_t elem, size_t old_n,
                                 size_t old_cap, size_t cap)
{
    void *na = NULL;
    if (cap > 0) {
        na = kvt_idx_acct_alloc(idx, cap * elem);
        if (na == NULL)
            return KVT_ERR_NO_MEM;
        if (old_n > 0)
            memcpy(na, *arrp, (old_n < cap ? old_n : cap) * elem);
    }
    kvt_idx_acct_free(idx, *arrp, old_cap * elem);
    *arrp = na;
    return KVT_OK;
}

kvt_status_t kvt_idx_dir_append(kvt_idx_t *idx, kvt_dir_t **dirp, void *chunk)
{
    kvt_dir_t *d = *dirp;
    if (d->n == d->cap) {
        uint32_t cap = d->cap * 2;
        kvt_dir_t *nd = kvt_idx_acct_calloc(idx, dir_bytes(cap)); /* unused entries stay NULL */
        if (nd == NULL)
            return KVT_ERR_NO_MEM;
        nd->n = d->n;
        nd->cap = cap;
        memcpy(nd->chunk, d->chunk, (size_t)d->n * sizeof(void *));
        __atomic_store_n(dirp, nd, __ATOMIC_RELEASE);
        kvt_idx_acct_retire(idx, d, dir_bytes(d->cap));
        d = nd;
    }
    __atomic_store_n(&d->chunk[d->n], chunk, __ATOMIC_RELEASE);
    d->n++;
    return KVT_OK;
}

kvt_dir_t *kvt_idx_dir_new(kvt_idx_t *idx)
{
    kvt_dir_t *d = kvt_idx_acct_calloc(idx, dir_bytes(DIR_MIN));
    if (d != NULL)
        d->cap = DIR_MIN;
    return d;
}

bool kvt_idx_room(kvt_idx_t *idx, size_t bytes)
{
    while (kvt_idx_over_budget(idx, bytes))
        if (kvt_idx_evict_batch(idx) == 0)
            return false;
    return true;
}

/* ---- eviction ------------------------------------------------------------ */

void kvt_idx_node_strip(kvt_idx_t *idx, uint32_t nid)
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
                kvt_idx_ref_drop(idx, a->pod, slot);
                continue;
            }
            e = s->e[0];
        } else {
            e = n->pods;
        }
        uint32_t pod = ELEM_POD(e);
        uint32_t slot = ptab_find(idx, &idx->pods[pod], n->ehash, false);
        kvt_idx_ref_drop(idx, pod, slot);
    }
}

/* Shrinks the key table when it is mostly empty (about half full after). */
static void ktab_maybe_shrink(kvt_idx_t *idx)
{
    uint32_t kgroups = idx->sh.ktab->ngroups;
    if (kgroups > KTAB_MIN_GROUPS && (uint64_t)idx->kt_live * 8 <= ktab_cap(idx->sh.ktab)) {
        uint32_t ng = (uint32_t)(((uint64_t)idx->kt_live * 2 + KVT_GRP_SLOTS - 1) / KVT_GRP_SLOTS);
        if (ng < KTAB_MIN_GROUPS)
            ng = KTAB_MIN_GROUPS;
        /* a reader may still hold the old table: then it waits for the next chance */
        if (kvt_idx_ktab_fits(idx, ng))
            kvt_idx_ktab_rebuild(idx, ng); /* on failure it stays */
    }
}

/* After blocks went: tables that emptied shrink, so the room is real. */
static void shrink_tables(kvt_idx_t *idx)
{
    for (uint32_t p = 0; p < idx->pod_hi; p++)
        if (idx->pods[p].name != NULL && p != idx->pin_pod)
            kvt_idx_ptab_maybe_shrink(idx, &idx->pods[p]);
    ktab_maybe_shrink(idx);
}

/* Eviction heap of (age << 32 | node): the oldest leaf on top. */
static inline bool older(const uint64_t *a, const uint64_t *b)
{
    return *a > *b;
}

KVT_HEAP_DEFINE(evict_heap, uint64_t, older)

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

size_t kvt_idx_evict_batch(kvt_idx_t *idx)
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
    evict_heap_make(heap, n);
    while (n > 0 && freed < want) {
        uint32_t nid = (uint32_t)evict_heap_pop(heap, &n);
        if (!evictable_leaf(idx, nid))
            continue;
        kvt_node_t *nd = N(idx, nid);
        uint32_t parent = nd->parent;
        if (nd->pods == PODS_EMPTY) {
            kvt_idx_node_maybe_free(idx, nid); /* structural: no entries to report */
        } else {
            if (idx->cfg.on_evict != NULL)
                idx->cfg.on_evict(idx->cfg.on_evict_arg, nd->key);
            kvt_idx_node_strip(idx, nid); /* frees nid once its last holder is gone */
            evicted++;
        }
        freed++;
        /* the parent may have become a leaf: it competes with its own age (heap slot freed above)
         */
        if (parent != KVT_NIL && evictable_leaf(idx, parent))
            evict_heap_push(heap, &n, heap_item(idx, parent, now));
    }
    free(heap);
    shrink_tables(idx);
    idx->evicted += evicted;
out:
    idx->evicting = false;
    return (size_t)freed;
}

/* ---- giving memory back ---------------------------------------------------- */

/*
 * A copy of directory @d keeping its first @n chunks, not yet published, or
 * NULL (nothing changed) when it cannot be made. The caller publishes it in
 * place of @d (readers then take the chunks past @n as gone), retires those
 * chunks, then @d (its bytes: dir_bytes(d->cap)).
 */
static kvt_dir_t *dir_trunc(kvt_idx_t *idx, const kvt_dir_t *d, uint32_t n)
{
    uint32_t cap = DIR_MIN;
    while (cap < n)
        cap *= 2;
    if (over_limit(idx, dir_bytes(cap), 0))
        return NULL; /* readers still hold retired memory: another trim gives it back */
    kvt_dir_t *nd = kvt_idx_acct_calloc(idx, dir_bytes(cap));
    if (nd == NULL)
        return NULL;
    nd->n = n;
    nd->cap = cap;
    memcpy(nd->chunk, d->chunk, (size_t)n * sizeof(void *));
    return nd;
}

/*
 * The capacity an array of @cap entries, @used of them in use, shrinks to:
 * halved while at most a quarter would be used, never below @floor; 0 when
 * nothing is used. (One rule for every writer array that gives memory back.)
 */
static size_t shrunk_cap(size_t cap, size_t used, size_t floor)
{
    if (used == 0)
        return 0;
    while (cap > floor && used * 4 <= cap)
        cap /= 2;
    return cap;
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
    size_t cap = shrunk_cap(idx->spec_cap, keep, 64);
    if (cap != idx->spec_cap)
        kvt_idx_spec_resize(idx, cap); /* on failure the bigger ring stays */
}

kvt_status_t kvt_idx_spec_resize(kvt_idx_t *idx, size_t cap)
{
    spec_item_t *s = NULL;
    if (cap > 0 && (s = kvt_idx_acct_alloc(idx, cap * sizeof(spec_item_t))) == NULL)
        return KVT_ERR_NO_MEM;
    for (size_t i = 0; i < idx->spec_len; i++)
        s[i] = idx->spec[(idx->spec_head + i) % idx->spec_cap];
    kvt_idx_acct_free(idx, idx->spec, idx->spec_cap * sizeof(spec_item_t));
    idx->spec = s;
    idx->spec_cap = cap;
    idx->spec_head = 0;
    return KVT_OK;
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
        uint32_t hi = idx->nodes_used;
        while (hi > 0 && N(idx, hi - 1)->pods == PODS_FREE)
            hi--;
        keep = (hi + NODE_SLAB_NODES - 1) / NODE_SLAB_NODES * NODE_SLAB_NODES;
        if (keep >= idx->nodes_used) {
            idx->trim_below = idx->live_nodes / 2;
            return;
        }
    }
    kvt_dir_t *old = idx->sh.nodes;
    uint32_t nchunks = old->n, kchunks = keep / NODE_CHUNK;
    kvt_dir_t *nd = dir_trunc(idx, old, kchunks);
    if (nd == NULL)
        return; /* nothing changes; the next trim tries again */
    idx->trim_below = idx->live_nodes / 2;
    /* the free list loses the nodes given back (read through the directory still listing them) */
    uint32_t *link = &idx->node_free;
    while (*link != KVT_NIL) {
        if (*link >= keep)
            *link = N(idx, *link)->parent;
        else
            link = &N(idx, *link)->parent;
    }
    __atomic_store_n(&idx->sh.nodes, nd, __ATOMIC_RELEASE);
    for (uint32_t sl = keep / NODE_SLAB_NODES; sl < idx->nslabs; sl++) {
        uint32_t c0 = sl * NODE_SLAB_CHUNKS, c1 = c0 + NODE_SLAB_CHUNKS;
        if (c1 > nchunks)
            c1 = nchunks > c0 ? nchunks : c0; /* a slab may be allocated before its first chunk */
        kvt_idx_acct_retire(idx, idx->slabs[sl], (size_t)(c1 - c0) * NODE_CHUNK_BYTES);
        idx->slabs[sl] = NULL;
    }
    kvt_idx_acct_retire(idx, old, dir_bytes(old->cap));
    for (uint32_t c = kchunks; c < nchunks; c++) {
        kvt_idx_acct_free(idx, idx->node_ns[c], NODE_NS_BYTES);
        idx->node_ns[c] = NULL;
    }
    idx->nslabs = keep / NODE_SLAB_NODES;
    idx->nodes_used = keep;
    if (idx->nslabs == 0) {
        kvt_idx_acct_free(idx, idx->slabs, (size_t)idx->slabs_cap * sizeof(kvt_node_t *));
        kvt_idx_acct_free(idx, idx->node_ns, (size_t)idx->node_ns_cap * sizeof(uint16_t *));
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
    kvt_dir_t *old = idx->sh.sets, *nd = dir_trunc(idx, old, 0);
    if (nd == NULL)
        return;
    __atomic_store_n(&idx->sh.sets, nd, __ATOMIC_RELEASE);
    for (uint32_t c = 0; c < old->n; c++)
        kvt_idx_acct_retire(idx, old->chunk[c], SET_CHUNK * sizeof(kvt_podset_t *));
    kvt_idx_acct_retire(idx, old, dir_bytes(old->cap));
    kvt_idx_acct_free(idx, idx->set_free, (size_t)idx->set_free_cap * sizeof(uint32_t));
    idx->set_free = NULL;
    idx->set_free_cap = idx->nset_free = idx->sets_used = 0;
}

void kvt_idx_ns_trim(kvt_idx_t *idx)
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
        kvt_dir_t *old = idx->sh.nss, *nd = dir_trunc(idx, old, kchunks);
        if (nd != NULL) {
            __atomic_store_n(&idx->sh.nss, nd, __ATOMIC_RELEASE);
            for (uint32_t c = kchunks; c < old->n; c++)
                kvt_idx_acct_retire(idx, old->chunk[c], NS_CHUNK * sizeof(kvt_ns_t));
            kvt_idx_acct_retire(idx, old, dir_bytes(old->cap));
        }
    }
    uint32_t cap = (uint32_t)shrunk_cap(idx->nsw_cap, nns, 16);
    if (cap != idx->nsw_cap && kvt_idx_acct_resize(idx, (void **)&idx->nsw, sizeof(ns_w_t), nns,
                                                   idx->nsw_cap, cap) == KVT_OK)
        idx->nsw_cap = cap;
}

void kvt_idx_pods_trim(kvt_idx_t *idx)
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
    uint32_t cap = (uint32_t)shrunk_cap(idx->pods_alloc, hi, 16);
    if (cap != idx->pods_alloc)
        kvt_idx_pods_resize(idx, cap); /* on failure the bigger arrays stay */
}

kvt_status_t kvt_idx_pods_resize(kvt_idx_t *idx, uint32_t cap)
{
    kvt_pod_t *np = NULL;
    uint32_t *nf = NULL;
    if (cap > 0) {
        np = kvt_idx_acct_alloc(idx, (size_t)cap * sizeof(kvt_pod_t));
        nf = kvt_idx_acct_alloc(idx, (size_t)cap * sizeof(uint32_t));
        if (np == NULL || nf == NULL) {
            kvt_idx_acct_free(idx, np, (size_t)cap * sizeof(kvt_pod_t));
            kvt_idx_acct_free(idx, nf, (size_t)cap * sizeof(uint32_t));
            return KVT_ERR_NO_MEM;
        }
        if (idx->pod_hi > 0)
            memcpy(np, idx->pods, (size_t)idx->pod_hi * sizeof(kvt_pod_t));
        if (idx->npod_free > 0)
            memcpy(nf, idx->pod_free, (size_t)idx->npod_free * sizeof(uint32_t));
    }
    kvt_idx_acct_free(idx, idx->pods, (size_t)idx->pods_alloc * sizeof(kvt_pod_t));
    kvt_idx_acct_free(idx, idx->pod_free, (size_t)idx->pods_alloc * sizeof(uint32_t));
    idx->pods = np;
    idx->pod_free = nf;
    idx->pods_alloc = cap;
    return KVT_OK;
}

void kvt_idx_trim(kvt_idx_t *idx)
{
    spec_compact(idx);
    if (idx->alias_live == 0 && idx->spec_len == 0 && idx->alias_cap > 0) {
        /* every ring item was stale and is gone: no alias index is referenced */
        kvt_idx_acct_free(idx, idx->alias, (size_t)idx->alias_cap * sizeof(kvt_alias_t));
        idx->alias = NULL;
        idx->alias_used = idx->alias_cap = 0;
        idx->alias_free = KVT_NIL;
    }
    nodes_trim(idx);
    sets_trim(idx);
    shrink_tables(idx);
}

bool kvt_idx_room_admin(kvt_idx_t *idx, size_t bytes)
{
    if (!over_limit(idx, bytes, ktab_room(idx)))
        return true;
    kvt_idx_trim(idx);
    return !over_limit(idx, bytes, ktab_room(idx));
}
