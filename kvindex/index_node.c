/*
 * kvindex/index_node.c: block nodes and who holds them: node allocation from huge-page slabs,
 * holder elements and overflow sets, alias records, and the references that
 * tie a pod's engine hashes to nodes.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kvindex/index_writer_int.h"

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
        if (kvt_idx_acct_resize(idx, (void **)&idx->node_ns, sizeof(uint16_t *), c,
                                idx->node_ns_cap, ncap) != KVT_OK)
            return KVT_ERR_NO_MEM;
        idx->node_ns_cap = ncap;
    }
    if (c % NODE_SLAB_CHUNKS == 0 && c / NODE_SLAB_CHUNKS == idx->nslabs) {
        if (idx->nslabs == idx->slabs_cap) {
            uint32_t ncap = idx->slabs_cap ? idx->slabs_cap * 2 : 8;
            if (kvt_idx_acct_resize(idx, (void **)&idx->slabs, sizeof(kvt_node_t *), idx->nslabs,
                                    idx->slabs_cap, ncap) != KVT_OK)
                return KVT_ERR_NO_MEM;
            idx->slabs_cap = ncap;
        }
        kvt_node_t *slab = aligned_alloc(KVT_HUGE, KVT_HUGE);
        if (slab == NULL)
            return KVT_ERR_NO_MEM;
        idx->slabs[idx->nslabs++] = slab;
    }
    uint16_t *nsc = kvt_idx_acct_alloc(idx, NODE_NS_BYTES);
    if (nsc == NULL)
        return KVT_ERR_NO_MEM; /* the slab stays for the next try */
    kvt_node_t *chunk =
        idx->slabs[c / NODE_SLAB_CHUNKS] + (size_t)(c % NODE_SLAB_CHUNKS) * NODE_CHUNK;
    for (uint32_t i = 0; i < NODE_CHUNK; i++)
        chunk[i].pods = PODS_FREE;
    if (kvt_idx_dir_append(idx, &idx->sh.nodes, chunk) != KVT_OK) {
        kvt_idx_acct_free(idx, nsc, NODE_NS_BYTES);
        return KVT_ERR_NO_MEM;
    }
    idx->bytes += NODE_CHUNK_BYTES;
    idx->node_ns[c] = nsc;
    if (c % NODE_SLAB_CHUNKS == NODE_SLAB_CHUNKS - 1)
        (void)madvise(idx->slabs[c / NODE_SLAB_CHUNKS], KVT_HUGE, MADV_COLLAPSE);
    idx->trim_below = UINT64_MAX; /* nodes may empty at the end again */
    return KVT_OK;
}

kvt_status_t kvt_idx_node_alloc(kvt_idx_t *idx, uint32_t *nid_p)
{
    while (idx->node_free == KVT_NIL && idx->nodes_used % NODE_CHUNK == 0) {
        if (kvt_idx_over_budget(idx, node_chunk_need(idx))) {
            if (kvt_idx_evict_batch(idx) == 0)
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

/* Never evicts: callers make room first, outside any wbegin/wend bracket. */
static kvt_podset_t *set_new(kvt_idx_t *idx, uint32_t cap)
{
    kvt_podset_t *s = kvt_idx_acct_alloc(idx, set_bytes(cap));
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
    while (kvt_idx_over_budget(idx, need)) {
        if (kvt_idx_evict_batch(idx) == 0)
            return KVT_ERR_NO_SPACE;
        if (idx->nset_free > 0)
            return KVT_OK; /* eviction freed one */
    }
    /* the new chunk's handles: sets_used .. sets_used + SET_CHUNK - 1 */
    if (fcap > idx->set_free_cap) {
        if (kvt_idx_acct_resize(idx, (void **)&idx->set_free, sizeof(uint32_t), idx->nset_free,
                                idx->set_free_cap, fcap) != KVT_OK)
            return KVT_ERR_NO_MEM;
        idx->set_free_cap = fcap;
    }
    kvt_podset_t **c = kvt_idx_acct_calloc(idx, chunk_bytes);
    if (c == NULL)
        return KVT_ERR_NO_MEM;
    if (kvt_idx_dir_append(idx, &idx->sh.sets, c) != KVT_OK) {
        kvt_idx_acct_free(idx, c, chunk_bytes);
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

kvt_elem_t *kvt_idx_node_elem(kvt_idx_t *idx, kvt_node_t *n, uint32_t pod)
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
        kvt_idx_acct_retire(idx, old, set_bytes(old->cap));
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
    if (need != 0 && !kvt_idx_room(idx, set_bytes(need)))
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
            kvt_idx_acct_retire(idx, s, set_bytes(s->cap));
            set_handle_free(idx, h);
        } else if (s->cap > SET_MIN && s->n * 4 <= s->cap &&
                   !kvt_idx_over_budget(idx, set_bytes(s->cap / 2))) {
            /* counted whole: a reader may hold the old set for a while */
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

void kvt_idx_node_maybe_free(kvt_idx_t *idx, uint32_t nid)
{
    while (nid != KVT_NIL) {
        kvt_node_t *n = N(idx, nid);
        if (n->pods != PODS_EMPTY || n->nchild != 0 || pinned(idx, nid))
            return;
        uint32_t parent = n->parent;
        kvt_idx_ktab_delete(idx, n->key);
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

/*
 * A free alias record into *@a_p. The array grows (doubles) only when none is
 * free: evicting to make room for it may free one, which is then taken
 * instead. KVT_ERR_NO_SPACE when the budget has no room, KVT_ERR_NO_MEM.
 */
static kvt_status_t alias_alloc(kvt_idx_t *idx, uint32_t *a_p)
{
    while (idx->alias_free == KVT_NIL && idx->alias_used == idx->alias_cap) {
        uint32_t cap = idx->alias_cap ? idx->alias_cap * 2 : 64;
        if (cap > 0x7fffffffu)
            return KVT_ERR_NO_SPACE;
        if (kvt_idx_over_budget(idx, (size_t)cap * sizeof(kvt_alias_t))) {
            if (kvt_idx_evict_batch(idx) == 0)
                return KVT_ERR_NO_SPACE;
            continue;
        }
        kvt_status_t st = kvt_idx_acct_resize(idx, (void **)&idx->alias, sizeof(kvt_alias_t),
                                              idx->alias_used, idx->alias_cap, cap);
        if (st != KVT_OK)
            return st;
        idx->alias_cap = cap;
    }
    uint32_t a;
    if (idx->alias_free != KVT_NIL) {
        a = idx->alias_free;
        idx->alias_free = idx->alias[a].next;
    } else {
        a = idx->alias_used++;
        idx->alias[a].serial = 0;
    }
    idx->alias_live++;
    *a_p = a;
    return KVT_OK;
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
    kvt_elem_t *ep = kvt_idx_node_elem(idx, n, pod);
    if (main == 0 && nalias == 0) {
        node_elem_del(idx, nid, pod);
        return;
    }
    kvt_elem_t e = ELEM_MAKE(pod, 0, main, nalias);
    e = ELEM_MAKE(pod, elem_recompute(idx, n, e), main, nalias);
    node_elem_set(idx, nid, ep, e);
}

void kvt_idx_ref_drop(kvt_idx_t *idx, uint32_t pod, uint32_t slot)
{
    kvt_pod_t *p = &idx->pods[pod];
    uint32_t ref = PREF(p, slot);
    uint32_t nid = ref_node(idx, ref);
    kvt_node_t *n = N(idx, nid);
    kvt_elem_t e = *kvt_idx_node_elem(idx, n, pod);
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
                kvt_idx_acct_retire(idx, s, set_bytes(s->cap));
                set_handle_free(idx, h);
            }
        }
    } else {
        elem_update(idx, nid, pod, 0, ELEM_NALIAS(e));
    }
    kvt_idx_node_maybe_free(idx, nid);
}

void kvt_idx_ref_clear_tiers(kvt_idx_t *idx, uint32_t pod, uint32_t slot, unsigned tiers)
{
    kvt_pod_t *p = &idx->pods[pod];
    uint32_t ref = PREF(p, slot);
    uint32_t nid = ref_node(idx, ref);
    kvt_node_t *n = N(idx, nid);
    kvt_elem_t e = *kvt_idx_node_elem(idx, n, pod);
    if (ref & ALIAS_BIT) {
        kvt_alias_t *a = &idx->alias[ref & ~ALIAS_BIT];
        if (!(a->tiers & tiers))
            return;
        if ((a->tiers & ~tiers) == 0) {
            kvt_idx_ref_drop(idx, pod, slot);
            return;
        }
        a->tiers &= (uint8_t)~tiers;
        elem_update(idx, nid, pod, ELEM_MAIN(e), ELEM_NALIAS(e));
        return;
    }
    if (!(ELEM_MAIN(e) & tiers))
        return;
    if ((ELEM_MAIN(e) & ~tiers) == 0) {
        kvt_idx_ref_drop(idx, pod, slot);
        return;
    }
    elem_update(idx, nid, pod, ELEM_MAIN(e) & ~tiers, ELEM_NALIAS(e));
}

kvt_status_t kvt_idx_alias_add(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh,
                               unsigned tier, bool spec, uint32_t *alias_p)
{
    kvt_node_t *n = N(idx, nid);
    kvt_elem_t *ep = kvt_idx_node_elem(idx, n, pod);
    if (ep != NULL && ELEM_NALIAS(*ep) >= ELEM_MAX_ALIAS)
        return KVT_ERR_LIMIT;
    uint32_t a;
    kvt_status_t st = alias_alloc(idx, &a);
    if (st != KVT_OK)
        return st;
    if (!(n->pods & PODS_SET_BIT)) {
        if (!kvt_idx_room(idx, set_bytes(SET_MIN))) {
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
    ep = kvt_idx_node_elem(idx, n, pod);
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

kvt_status_t kvt_idx_ref_add_h(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh, uint64_t ph,
                               unsigned tier)
{
    kvt_node_t *n0 = N(idx, nid);
    if (eh == n0->ehash) {
        /* fast path: the pod already maps the node's own hash to it in this tier */
        kvt_elem_t *ep = kvt_idx_node_elem(idx, n0, pod);
        if (ep != NULL && (ELEM_MAIN(*ep) & tier) && !(ELEM_TIERS(*ep) & KVT_TIER_SPEC))
            return KVT_OK;
    }
    kvt_pod_t *p = &idx->pods[pod];
    uint32_t slot = ptab_find_h(idx, p, eh, ph, false);
    if (slot != KVT_NIL && ref_node(idx, PREF(p, slot)) != nid) {
        /* the engine reused this hash for another block: forget the old one */
        kvt_idx_ref_drop(idx, pod, slot);
        slot = KVT_NIL;
    }
    kvt_node_t *n = N(idx, nid);
    if (slot != KVT_NIL) {
        uint32_t ref = PREF(p, slot);
        kvt_elem_t *ep = kvt_idx_node_elem(idx, n, pod);
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
        kvt_status_t st = kvt_idx_ptab_reserve(idx, pod);
        if (st != KVT_OK)
            return st;
        p = &idx->pods[pod];
        kvt_elem_t *ep = kvt_idx_node_elem(idx, n, pod);
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
            st = kvt_idx_alias_add(idx, nid, pod, eh, tier, false, &a);
            if (st != KVT_OK)
                return st;
        }
    }
    /* a real store confirms (replaces) a speculative mark */
    kvt_elem_t *ep = kvt_idx_node_elem(idx, n, pod);
    if (ep != NULL && (ELEM_TIERS(*ep) & KVT_TIER_SPEC)) {
        uint32_t s = ptab_find(idx, &idx->pods[pod], spec_marker(n->key), true);
        if (s != KVT_NIL)
            kvt_idx_ref_drop(idx, pod, s);
    }
    return KVT_OK;
}

kvt_status_t kvt_idx_ref_add(kvt_idx_t *idx, uint32_t nid, uint32_t pod, uint64_t eh, unsigned tier)
{
    return kvt_idx_ref_add_h(idx, nid, pod, eh, kvt_mix64(eh), tier);
}
