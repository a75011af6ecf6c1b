/*
 * kvindex/index.c: the writer side of the index: create and destroy, store, remove, speculate,
 * the clock and stats. See index_int.h for the layout, index_writer_int.h for
 * the writer's files, and docs/architecture.md for the reasoning.
 */
#include <stdlib.h>

#include "kvindex/index_writer_int.h"

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
    idx->sh.ktab = kvt_idx_ktab_new(idx, KTAB_MIN_GROUPS);
    idx->sh.nodes = kvt_idx_dir_new(idx);
    idx->sh.sets = kvt_idx_dir_new(idx);
    idx->sh.nss = kvt_idx_dir_new(idx);
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
    kvt_idx_names_free(idx);
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
    kvt_status_t st = kvt_idx_node_alloc(idx, &nid);
    if (st != KVT_OK)
        return st;
    idx->pin[1] = nid;
    st = kvt_idx_ktab_reserve(idx);
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
 * the general path: the node found (or created empty), then
 * kvt_idx_ref_add_h().
 */
static kvt_status_t store_one(kvt_idx_t *idx, uint64_t key, uint64_t h, uint64_t eh, uint64_t ph,
                              uint32_t parent, uint32_t pod, unsigned tier, uint32_t slot,
                              uint32_t *nid_p)
{
    uint32_t nid = ktab_lookup_h(idx, key, h);
    if (nid != KVT_NIL) {
        node_found(idx, nid, parent);
        *nid_p = nid;
        return kvt_idx_ref_add_h(idx, nid, pod, eh, ph, tier);
    }
    if (ptab_find_h(idx, &idx->pods[pod], eh, ph, false) != KVT_NIL) {
        /* the pod maps this engine hash to another block: the general path drops that */
        kvt_status_t st = node_create_h(idx, key, h, eh, parent, PODS_EMPTY, slot, nid_p);
        return st == KVT_OK ? kvt_idx_ref_add_h(idx, *nid_p, pod, eh, ph, tier) : st;
    }
    kvt_status_t st = kvt_idx_ptab_reserve(idx, pod); /* may evict; the pod's table is pinned */
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
                kvt_idx_node_maybe_free(idx, nid);
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
        st = kvt_idx_ref_add(idx, nid, pod, ehashes[i], tier);
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
        have = ELEM_MAIN(*kvt_idx_node_elem(idx, n, pod));
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
        kvt_idx_ref_clear_tiers(idx, pod, slot, tiers);
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
        if (!kvt_idx_room(idx, cap * sizeof(spec_item_t)))
            return KVT_ERR_NO_SPACE;
        kvt_status_t st = kvt_idx_spec_resize(idx, cap);
        if (st != KVT_OK)
            return st;
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
        kvt_elem_t *ep = kvt_idx_node_elem(idx, nd, pod);
        if (ep == NULL || ELEM_TIERS(*ep) == 0) {
            uint32_t a;
            st = kvt_idx_ptab_reserve(idx, pod);
            if (st == KVT_OK)
                st = kvt_idx_alias_add(idx, nid, pod, spec_marker(key), KVT_TIER_SPEC, true, &a);
            if (st == KVT_OK)
                st = spec_push(idx, idx->now_ms + ttl_ms, a);
            if (st != KVT_OK) {
                uint32_t ps = ptab_find(idx, &idx->pods[pod], spec_marker(key), true);
                idx->pin[0] = idx->pin[1] = KVT_NIL;
                if (ps != KVT_NIL)
                    kvt_idx_ref_drop(idx, pod, ps);
                else
                    kvt_idx_node_maybe_free(idx, nid);
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
            kvt_idx_ref_drop(idx, a->pod, slot);
    }
    if (idx->live_nodes == 0 && (idx->nslabs > 0 || idx->sets_used > 0 || idx->alias_cap > 0))
        kvt_idx_trim(idx); /* everything went (removals, expiries): give the memory back */
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
