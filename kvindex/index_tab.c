/*
 * kvindex/index_tab.c: the key table (salted key -> node, probed by readers without locks) and
 * the per-pod engine-hash tables (writer only): creation, growth, deletion.
 */
#include <stdlib.h>
#include <string.h>

#include "kvindex/index_writer_int.h"

kvt_ktab_t *kvt_idx_ktab_new(kvt_idx_t *idx, uint32_t groups)
{
    size_t bytes = ktab_bytes(groups);
    kvt_ktab_t *t = bytes >= KVT_HUGE ? kvt_idx_huge_alloc(bytes) : aligned_alloc(64, bytes);
    if (t == NULL)
        return NULL;
    idx->bytes += bytes;
    memset(t, 0, sizeof(*t));
    t->ngroups = groups;
    kvt_grp_init(t->g, groups);
    return t;
}

kvt_status_t kvt_idx_ktab_rebuild(kvt_idx_t *idx, uint32_t groups)
{
    kvt_ktab_t *old = idx->sh.ktab;
    kvt_ktab_t *t = kvt_idx_ktab_new(idx, groups);
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
    kvt_idx_acct_retire(idx, old, ktab_bytes(old->ngroups));
    idx->kt_tomb = 0;
    return KVT_OK;
}

kvt_status_t kvt_idx_ktab_reserve(kvt_idx_t *idx)
{
    for (;;) {
        uint64_t cap = ktab_cap(idx->sh.ktab);
        uint32_t groups = idx->sh.ktab->ngroups;
        if (kvt_grp_room(groups, (uint64_t)idx->kt_live + idx->kt_tomb))
            return KVT_OK;
        /* tombstones fill it: rebuild at the same size, else grow by half */
        uint32_t ng = groups;
        if ((uint64_t)(idx->kt_live + 1) * 4 > cap * 3) {
            if (groups >= 0x40000000u)
                return KVT_ERR_NO_SPACE;
            ng = kvt_grp_grow(groups);
        }
        if (kvt_idx_ktab_fits(idx, ng))
            return kvt_idx_ktab_rebuild(idx, ng);
        if (kvt_idx_evict_batch(idx) == 0)
            return KVT_ERR_NO_SPACE;
    }
}

void kvt_idx_ktab_delete(kvt_idx_t *idx, uint64_t key)
{
    kvt_ktab_t *t = idx->sh.ktab;
    uint32_t gi, si;
    if (!ktab_find(idx, t, key, &gi, &si))
        return;
    idx->kt_live--;
    if (kvt_grp_erase(&t->g[gi], si))
        idx->kt_tomb++;
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
        kvt_idx_acct_free(idx, p->g, ptab_bytes(p->ngroups));
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

kvt_status_t kvt_idx_ptab_reserve(kvt_idx_t *idx, uint32_t pod)
{
    for (;;) {
        kvt_pod_t *p = &idx->pods[pod];
        if (p->g == NULL) {
            if (!kvt_idx_room(idx, ptab_bytes(PTAB_MIN_GROUPS)))
                return KVT_ERR_NO_SPACE;
            return ptab_rebuild(idx, &idx->pods[pod], PTAB_MIN_GROUPS);
        }
        uint64_t cap = ptab_cap(p);
        uint32_t groups = p->ngroups;
        if (kvt_grp_room(groups, (uint64_t)p->live + p->tomb))
            return KVT_OK;
        if ((uint64_t)(p->live + 1) * 2 <= cap)
            return ptab_rebuild(idx, p, groups);
        if (groups >= 0x08000000u)
            return KVT_ERR_NO_SPACE;
        /* small tables grow x4 (fewer re-hashes), big ones by half (less slack) */
        uint32_t ng = groups < 8 ? groups * 4 : kvt_grp_grow(groups);
        if (!kvt_idx_over_budget(idx, ptab_bytes(ng - groups)))
            return ptab_rebuild(idx, p, ng);
        if (kvt_idx_evict_batch(idx) == 0)
            return KVT_ERR_NO_SPACE;
    }
}

void kvt_idx_ptab_maybe_shrink(kvt_idx_t *idx, kvt_pod_t *p)
{
    if (p->g == NULL)
        return;
    if (p->live == 0) {
        kvt_idx_acct_free(idx, p->g, ptab_bytes(p->ngroups));
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
