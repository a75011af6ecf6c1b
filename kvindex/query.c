/*
 * kvindex/query.c: the read path. Runs concurrently with the single writer:
 * no lock, no allocation once the reader's scratch covers every pod id.
 */
#include <stdlib.h>
#include <string.h>

#include "kvindex/index_int.h"

static kvt_status_t reader_fit(kvt_idx_reader_t *r, uint32_t cap);
static kvt_status_t reader_fit_snap(kvt_idx_reader_t *r, uint32_t n);

kvt_status_t kvt_idx_reader_create(kvt_idx_t *idx, kvt_idx_reader_t **reader_p)
{
    kvt_idx_shared_t *sh = idx_shared(idx);
    kvt_idx_reader_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVT_ERR_NO_MEM;
    r->slot = kvt_ebr_slot_acquire(&sh->ebr);
    if (r->slot < 0) {
        free(r);
        return KVT_ERR_LIMIT;
    }
    r->idx = idx;
    if (reader_fit(r, 1) != KVT_OK || reader_fit_snap(r, 16) != KVT_OK) {
        kvt_idx_reader_destroy(r);
        return KVT_ERR_NO_MEM;
    }
    *reader_p = r;
    return KVT_OK;
}

void kvt_idx_reader_destroy(kvt_idx_reader_t *r)
{
    if (r == NULL)
        return;
    kvt_ebr_slot_release(&idx_shared(r->idx)->ebr, r->slot);
    free(r->allow);
    free(r->alive);
    free(r->atier);
    free(r->res);
    free(r->snap);
    free(r->snap2);
    free(r);
}

/* Grows the per-pod scratch arrays to cover @cap pod ids. */
static kvt_status_t reader_fit(kvt_idx_reader_t *r, uint32_t cap)
{
    if (cap <= r->cap)
        return KVT_OK;
    uint32_t ncap = r->cap ? r->cap : 64;
    while (ncap < cap)
        ncap *= 2;
    uint32_t *allow = calloc(ncap, sizeof(*allow));
    uint32_t *alive = malloc(ncap * sizeof(*alive));
    uint8_t *atier = malloc(ncap * sizeof(*atier));
    kvt_idx_match_t *res = malloc(ncap * sizeof(*res));
    if (!allow || !alive || !atier || !res) {
        free(allow);
        free(alive);
        free(atier);
        free(res);
        return KVT_ERR_NO_MEM;
    }
    free(r->allow);
    free(r->alive);
    free(r->atier);
    free(r->res);
    r->allow = allow;
    r->alive = alive;
    r->atier = atier;
    r->res = res;
    r->cap = ncap;
    r->qgen = 0; /* fresh arrays: every generation mark is stale */
    return KVT_OK;
}

static kvt_status_t reader_fit_snap(kvt_idx_reader_t *r, uint32_t n)
{
    if (n <= r->snapcap)
        return KVT_OK;
    uint32_t ncap = r->snapcap ? r->snapcap : 16;
    while (ncap < n)
        ncap *= 2;
    kvt_elem_t *s = malloc(ncap * sizeof(*s));
    kvt_elem_t *s2 = realloc(r->snap2, ncap * sizeof(*s2)); /* keeps its content */
    if (s2 != NULL)
        r->snap2 = s2;
    if (s == NULL || s2 == NULL) {
        free(s);
        return KVT_ERR_NO_MEM;
    }
    free(r->snap);
    r->snap = s;
    r->snapcap = ncap;
    return KVT_OK;
}

/*
 * Chunk @i of a directory this reader loaded earlier, or NULL. A node or set
 * handle read from a newer publication may live in a chunk appended after
 * that load: then the directory is reloaded. Directories also shrink (trims
 * give back node slabs past the last live node, set chunks once no set is
 * left, namespace chunks past the last live slot): a chunk missing from the
 * newest one too was given back, and everything in it was free, so callers
 * take NULL as "no such node" (or set). What they read through an older
 * directory stays valid until the query ends (EBR).
 */
static void *rchunk_slow(kvt_dir_t **dirp, kvt_dir_t *const *shared, uint32_t i)
{
    for (;;) {
        kvt_dir_t *d = *dirp;
        if (i < d->cap) {
            void *c = __atomic_load_n(&d->chunk[i], __ATOMIC_ACQUIRE);
            if (c != NULL)
                return c;
        }
        kvt_dir_t *nd = __atomic_load_n(shared, __ATOMIC_ACQUIRE);
        if (nd == d)
            return NULL; /* given back: see above */
        *dirp = nd;
    }
}

static inline void *rchunk(kvt_dir_t **dirp, kvt_dir_t *const *shared, uint32_t i)
{
    kvt_dir_t *d = *dirp;
    if (__builtin_expect(i < d->cap, 1)) {
        void *c = __atomic_load_n(&d->chunk[i], __ATOMIC_ACQUIRE);
        if (__builtin_expect(c != NULL, 1))
            return c;
    }
    return rchunk_slow(dirp, shared, i);
}

static inline kvt_node_t *rnode(kvt_idx_shared_t *sh, kvt_dir_t **nodes, uint32_t nid)
{
    kvt_node_t *c = rchunk(nodes, &sh->nodes, nid >> NODE_CHUNK_SHIFT);
    return c ? &c[nid & (NODE_CHUNK - 1)] : NULL;
}

/* Looks up salted @key in the published key table: node index or KVT_NIL. */
static uint32_t probe(kvt_idx_shared_t *sh, kvt_ktab_t *t, kvt_dir_t **nodes, uint64_t key)
{
    uint64_t h = kvt_mix64(key);
    uint8_t tag = kvt_grp_tag(h);
    for (uint32_t gi = kvt_grp_home(h, t->ngroups);; gi = kvt_grp_next(gi, t->ngroups)) {
        const kvt_group_t *g = &t->g[gi];
        uint32_t m = kvt_grp_match(g, tag);
        __atomic_thread_fence(__ATOMIC_ACQUIRE); /* slots were published before their ctrl */
        for (; m != 0; m &= m - 1) {
            uint32_t nid = __atomic_load_n(&g->slot[__builtin_ctz(m)], __ATOMIC_ACQUIRE);
            kvt_node_t *nd = rnode(sh, nodes, nid);
            if (nd != NULL && __atomic_load_n(&nd->key, __ATOMIC_RELAXED) == key)
                return nid;
        }
        if (kvt_grp_match(g, KVT_GRP_EMPTY) != 0)
            return KVT_NIL;
    }
}

/*
 * First slot in the probe sequence of hash @h (kvt_mix64 of the salted key)
 * whose tag matches, unverified (no node
 * access, so it does not stall on the node's miss), or KVT_NIL when the
 * table says the key is absent.
 */
static uint32_t probe_candidate(kvt_ktab_t *t, uint64_t h)
{
    uint8_t tag = kvt_grp_tag(h);
    for (uint32_t gi = kvt_grp_home(h, t->ngroups);; gi = kvt_grp_next(gi, t->ngroups)) {
        const kvt_group_t *g = &t->g[gi];
        uint32_t m = kvt_grp_match(g, tag);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (m != 0)
            return __atomic_load_n(&g->slot[__builtin_ctz(m)], __ATOMIC_ACQUIRE);
        if (kvt_grp_match(g, KVT_GRP_EMPTY) != 0)
            return KVT_NIL;
    }
}

/* Hint: fetches the holder set of node @n (may be NULL), if it has one. Changes nothing. */
static inline void prefetch_set(kvt_idx_shared_t *sh, kvt_dir_t **sets, const kvt_node_t *n)
{
    uint32_t pods = n ? __atomic_load_n(&n->pods, __ATOMIC_RELAXED) : PODS_FREE;
    if (pods == PODS_FREE || !(pods & PODS_SET_BIT))
        return;
    uint32_t h = pods & ~PODS_SET_BIT;
    kvt_podset_t **c = rchunk(sets, &sh->sets, h >> SET_CHUNK_SHIFT);
    if (c != NULL)
        __builtin_prefetch(__atomic_load_n(&c[h & (SET_CHUNK - 1)], __ATOMIC_RELAXED));
}

static inline void prefetch_group(const kvt_ktab_t *t, uint64_t h)
{
    __builtin_prefetch(&t->g[kvt_grp_home(h, t->ngroups)]);
}

#ifdef KVT_TSAN
/* TSan builds: element by element, as atomics, so the race with the writer is visible as intended.
 */
static bool elems_equal(const kvt_elem_t *live, const kvt_elem_t *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (__atomic_load_n(&live[i], __ATOMIC_RELAXED) != b[i])
            return false;
    return true;
}

static void elems_copy(kvt_elem_t *dst, const kvt_elem_t *live, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        dst[i] = __atomic_load_n(&live[i], __ATOMIC_RELAXED);
}
#else
/*
 * Plain block reads that may race the writer's element stores: whatever they
 * see is used only if the stripe's sequence did not move meanwhile (the
 * caller checks), as with kvt_grp_match()'s 16-byte control loads.
 */
static bool elems_equal(const kvt_elem_t *live, const kvt_elem_t *b, uint32_t n)
{
    return memcmp(live, b, (size_t)n * sizeof(*b)) == 0;
}

static void elems_copy(kvt_elem_t *dst, const kvt_elem_t *live, uint32_t n)
{
    memcpy(dst, live, (size_t)n * sizeof(*dst));
}
#endif

_Static_assert(KVT_TIER_GPU == 1 && KVT_TIER_CPU == 2 && KVT_TIER_DISK == 4 && KVT_TIER_SPEC == 8,
               "first_tier() packs its table by these bit values");

/* Fastest tier of a holder's tier bits: 0 GPU (or speculative), 1 CPU, 2 DISK. */
static inline unsigned first_tier(unsigned tiers)
{
    /* 2 bits per value of the 4 tier bits (GPU, CPU, DISK, SPEC) */
    return (0x1212u >> (2u * (tiers & 15u))) & 3u;
}

/* A pod's result after its first block, by first_tier(); the pod is filled in. */
static const kvt_idx_match_t first_match[3] = {{0, 1, 1, 0, 0}, {0, 1, 0, 1, 0}, {0, 1, 0, 0, 1}};

#define SNAP_SAME (-2) /* snapshot(): the holders equal r->snap2[0..prev_cnt) */

/*
 * Copies the holders of node @nid (at @n) into r->snap under the node's stripe seqlock.
 * Returns the number copied, 0 if the node no longer holds @key, -1 when the
 * scratch cannot grow, or SNAP_SAME (nothing copied) when they are exactly
 * the @prev_cnt (> 0) holders in r->snap2, compared in place.
 */
static int snapshot(kvt_idx_reader_t *r, kvt_idx_shared_t *sh, kvt_dir_t **sets, uint32_t nid,
                    const kvt_node_t *n, uint64_t key, int prev_cnt)
{
    const uint32_t *stripe = &sh->stripes[nid & (NSTRIPES - 1)];
    for (;;) {
        uint32_t s1 = __atomic_load_n(stripe, __ATOMIC_ACQUIRE);
        if (s1 & 1u)
            continue;
        int ret = 0;
        uint32_t pods = __atomic_load_n(&n->pods, __ATOMIC_ACQUIRE);
        uint64_t k = __atomic_load_n(&n->key, __ATOMIC_RELAXED);
        if (k != key || pods == PODS_FREE || pods == PODS_EMPTY) {
            ret = 0;
        } else if (!(pods & PODS_SET_BIT)) {
            if (prev_cnt == 1 && r->snap2[0] == pods) {
                ret = SNAP_SAME;
            } else {
                r->snap[0] = pods;
                ret = 1;
            }
        } else {
            uint32_t h = pods & ~PODS_SET_BIT;
            kvt_podset_t **c = rchunk(sets, &sh->sets, h >> SET_CHUNK_SHIFT);
            kvt_podset_t *s = c ? __atomic_load_n(&c[h & (SET_CHUNK - 1)], __ATOMIC_ACQUIRE) : NULL;
            if (s != NULL) {
                uint32_t cnt = __atomic_load_n(&s->n, __ATOMIC_RELAXED);
                if (cnt > s->cap)
                    cnt = s->cap; /* torn read; the seqlock check below retries */
                if ((int)cnt == prev_cnt && elems_equal(s->e, r->snap2, cnt)) {
                    ret = SNAP_SAME;
                } else {
                    if (cnt > r->snapcap) {
                        if (reader_fit_snap(r, cnt) != KVT_OK)
                            return -1;
                        continue;
                    }
                    elems_copy(r->snap, s->e, cnt);
                    ret = (int)cnt;
                }
            }
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(stripe, __ATOMIC_RELAXED) == s1)
            return ret;
    }
}

/* Credits result @m @mul blocks in tier class @t (first_tier()). */
static inline void credit(kvt_idx_match_t *m, unsigned t, uint32_t mul)
{
    m->matched += mul;
    if (t == 0)
        m->gpu += mul;
    else if (t == 1)
        m->cpu += mul;
    else
        m->disk += mul;
}

/*
 * Intersects the alive results (sorted by pod) with one block's holders
 * @snap[@cnt], crediting each survivor one block in its fastest tier there
 * (remembered in r->atier for credit_same()). Compacts r->alive and r->atier
 * in place; returns how many stay alive.
 */
static uint32_t merge_block(kvt_idx_reader_t *r, const kvt_elem_t *snap, int cnt, uint32_t nalive)
{
    uint32_t *alive = r->alive;
    kvt_idx_match_t *res = r->res;
    uint8_t *atier = r->atier;
    uint32_t a = 0, out = 0;
    const bool search = nalive > 32 && cnt * 8 < (int)nalive;
    for (int j = 0; j < cnt && a < nalive; j++) {
        uint32_t pod = ELEM_POD(snap[j]);
        if (search) {
            /* few holders, many alive: binary search instead of a walk */
            uint32_t lo = a, hi = nalive;
            while (lo < hi) {
                uint32_t mid = (lo + hi) / 2;
                if (res[alive[mid]].pod < pod)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            a = lo;
        } else {
            while (a < nalive && res[alive[a]].pod < pod)
                a++;
        }
        if (a == nalive || res[alive[a]].pod != pod)
            continue;
        unsigned t = first_tier(ELEM_TIERS(snap[j]));
        uint32_t k = alive[a++];
        credit(&res[k], t, 1);
        /* out < a: compaction in place keeps the order */
        alive[out] = k;
        atier[out] = (uint8_t)t;
        out++;
    }
    return out;
}

/*
 * Credits @mul blocks whose holders were exactly those of the last block
 * merged: every alive pod holds them, in the tier it held that block in.
 */
static void credit_same(kvt_idx_reader_t *r, uint32_t nalive, uint32_t mul)
{
    for (uint32_t k = 0; k < nalive; k++)
        credit(&r->res[r->alive[k]], r->atier[k], mul);
}

kvt_status_t kvt_idx_query(kvt_idx_reader_t *r, uint32_t ns, const uint64_t *keys, size_t n,
                           const uint32_t *pods, size_t npods, const kvt_idx_match_t **res_p,
                           size_t *nres_p)
{
    kvt_idx_shared_t *sh = idx_shared(r->idx);
    *res_p = r->res;
    *nres_p = 0;
    if (n == 0 || NS_SLOT(ns) >= __atomic_load_n(&sh->nns, __ATOMIC_ACQUIRE))
        return KVT_OK;
    uint32_t pod_cap = __atomic_load_n(&sh->pod_cap, __ATOMIC_ACQUIRE);
    if (reader_fit(r, pod_cap) != KVT_OK || reader_fit_snap(r, 16) != KVT_OK)
        return KVT_ERR_NO_MEM;
    *res_p = r->res; /* reader_fit() may have replaced the array */
    if (++r->qgen == 0) {
        /* generation wrapped: clear the marks once every 4 G queries */
        memset(r->allow, 0, r->cap * sizeof(*r->allow));
        r->qgen = 1;
    }
    const uint32_t gen = r->qgen;
    if (pods != NULL)
        for (size_t i = 0; i < npods; i++)
            if (pods[i] < r->cap)
                r->allow[pods[i]] = gen;

    if (!r->pinned) /* inside a read section the reader is already in */
        kvt_ebr_enter(&sh->ebr, r->slot);
    /*
     * The id is checked once, here: a namespace dropped later in the query
     * (or its slot reused) is seen as any concurrent removal is, since the
     * salt is the dropped one's and so are the nodes it finds.
     */
    uint64_t salt;
    if (!ns_read_salt(sh, ns, &salt)) {
        if (!r->pinned)
            kvt_ebr_exit(&sh->ebr, r->slot);
        return KVT_OK;
    }
    kvt_ktab_t *t = __atomic_load_n(&sh->ktab, __ATOMIC_ACQUIRE);
    kvt_dir_t *nodes = __atomic_load_n(&sh->nodes, __ATOMIC_ACQUIRE);
    kvt_dir_t *sets = __atomic_load_n(&sh->sets, __ATOMIC_ACQUIRE);
    const uint32_t now = __atomic_load_n(&sh->clock32, __ATOMIC_RELAXED);
    uint32_t nres = 0, nalive = 0;
    uint32_t same = 0; /* blocks after the last merge with exactly its holders, not yet credited */
    int prev_cnt = -1;
    kvt_status_t status = KVT_OK;

    /*
     * Software pipeline: the key-table group of key i + 2*AHEAD and the node
     * of key i + AHEAD are fetched while key i is processed, so the misses of
     * a long prompt overlap instead of following one another. A candidate's
     * node address is resolved once, when it is found, and reused.
     */
    enum { AHEAD = 4, RING = 8 };
    uint32_t ring[RING];
    kvt_node_t *nring[RING]; /* node of ring[j], NULL when the table says the key is absent */
    uint64_t hring[RING];    /* kvt_mix64 of salted key j, hashed once when its group is fetched */
    for (size_t j = 0; j < n && j < 2 * AHEAD; j++) {
        hring[j % RING] = kvt_mix64(keys[j] ^ salt);
        prefetch_group(t, hring[j % RING]);
    }
    for (size_t j = 0; j < n && j < AHEAD; j++) {
        uint32_t c = probe_candidate(t, hring[j % RING]);
        ring[j % RING] = c;
        nring[j % RING] = c != KVT_NIL ? rnode(sh, &nodes, c) : NULL;
        __builtin_prefetch(nring[j % RING]);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t key = keys[i] ^ salt;
        uint32_t nid = ring[i % RING];
        kvt_node_t *nd = nring[i % RING];
        if (i + AHEAD < n) {
            uint32_t c = probe_candidate(t, hring[(i + AHEAD) % RING]);
            kvt_node_t *cn = c != KVT_NIL ? rnode(sh, &nodes, c) : NULL;
            ring[(i + AHEAD) % RING] = c;
            nring[(i + AHEAD) % RING] = cn;
            __builtin_prefetch(cn);
        }
        if (i + 2 * AHEAD < n) {
            /* slot (i + 2*AHEAD) % RING held key i's hash, no longer needed */
            hring[(i + 2 * AHEAD) % RING] = kvt_mix64(keys[i + 2 * AHEAD] ^ salt);
            prefetch_group(t, hring[(i + 2 * AHEAD) % RING]);
        }
        if (i + 2 < n)
            prefetch_set(sh, &sets, nring[(i + 2) % RING]); /* its node was fetched */
        if (nid == KVT_NIL)
            break;
        if (nd == NULL || __atomic_load_n(&nd->key, __ATOMIC_RELAXED) != key) {
            nid = probe(sh, t, &nodes, key); /* a tag collision: the full probe decides */
            if (nid == KVT_NIL)
                break;
            nd = rnode(sh, &nodes, nid);
        }
        int cnt = snapshot(r, sh, &sets, nid, nd, key, i > 0 ? prev_cnt : -1);
        if (cnt == -1) {
            status = KVT_ERR_NO_MEM;
            break;
        }
        const kvt_elem_t *snap = r->snap;
        uint32_t extended = 0;
        if (i == 0) {
            /* results are written in pod order: holder sets are sorted by pod */
            kvt_idx_match_t *res = r->res;
            uint32_t *alive = r->alive;
            uint8_t *atier = r->atier;
            const uint32_t cap = r->cap;
            for (int j = 0; j < cnt; j++) {
                uint32_t pod = ELEM_POD(snap[j]);
                if (pod >= cap || (pods != NULL && r->allow[pod] != gen))
                    continue; /* registered after this query started, or filtered out */
                unsigned tc = first_tier(ELEM_TIERS(snap[j]));
                res[nres] = first_match[tc];
                res[nres].pod = pod;
                alive[nres] = nres;
                atier[nres] = (uint8_t)tc;
                nres++;
            }
            nalive = nres;
            extended = nres;
        } else if (cnt == SNAP_SAME) {
            /*
             * The same holders in the same tiers as the block before: the
             * intersection cannot change, so only count the block. Runs of
             * identical holder sets are the usual shape of a shared prefix.
             */
            same++;
            extended = nalive;
        } else {
            if (same > 0) {
                credit_same(r, nalive, same);
                same = 0;
            }
            nalive = merge_block(r, snap, cnt, nalive);
            extended = nalive;
        }
        if (extended != 0 && same == 0) {
            /* keep this block's holders for the comparison with the next one */
            kvt_elem_t *keep = r->snap;
            r->snap = r->snap2;
            r->snap2 = keep;
            prev_cnt = cnt;
        }
        if (extended == 0)
            break; /* nobody can extend its run */
        if (__atomic_load_n(&nd->stamp, __ATOMIC_RELAXED) != now)
            __atomic_store_n(&nd->stamp, now, __ATOMIC_RELAXED);
    }
    if (same > 0)
        credit_same(r, nalive, same);
    if (!r->pinned)
        kvt_ebr_exit(&sh->ebr, r->slot);
    *nres_p = nres;
    return status;
}
