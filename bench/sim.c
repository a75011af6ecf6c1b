/* bench/sim: cache-mode replay of a trace over simulated pods (sim.h). */
#include "bench/sim.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"

#include "kvindex/index.h"
#include "kvindex/score.h"

#define SIM_NONE UINT32_MAX

static const char *const sim_policy_names[KVT_SIM_NPOLICIES] = {
    "random", "round-robin", "least-loaded", "session", "prefix", "cost",
};

const char *kvt_sim_policy_name(kvt_sim_policy_t p)
{
    return (unsigned)p < KVT_SIM_NPOLICIES ? sim_policy_names[p] : "?";
}

kvt_status_t kvt_sim_policy_parse(const char *name, kvt_sim_policy_t *p_p)
{
    for (unsigned i = 0; i < KVT_SIM_NPOLICIES; i++)
        if (strcmp(name, sim_policy_names[i]) == 0) {
            *p_p = (kvt_sim_policy_t)i;
            return KVT_OK;
        }
    return KVT_ERR_NOT_FOUND;
}

static uint64_t sim_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- one pod's cache: an LRU list of blocks and an open-addressing map id -> node ---------- */

typedef struct sim_node {
    uint64_t id;
    uint32_t prev, next; /* toward MRU, toward LRU; SIM_NONE at the ends */
} sim_node_t;

typedef struct sim_cache {
    sim_node_t *nodes; /* cap + room: a request's new blocks go in before the evictions */
    uint32_t *slots;   /* node index or SIM_NONE */
    uint64_t mask;     /* slots - 1 */
    uint64_t cap;      /* blocks held at most */
    uint64_t held;
    uint32_t mru, lru, free_head; /* free nodes chained through next */
} sim_cache_t;

/* A cache of @cap blocks, for requests of at most @room blocks. */
static kvt_status_t sim_cache_init(sim_cache_t *c, uint64_t cap, uint32_t room)
{
    memset(c, 0, sizeof(*c));
    if (cap == 0 || cap + room >= SIM_NONE - 1)
        return KVT_ERR_INVAL;
    uint64_t nodes = cap + room + 1;
    uint64_t nslots = 16;
    while (nslots < 2 * nodes)
        nslots <<= 1;
    c->nodes = malloc(nodes * sizeof(*c->nodes));
    c->slots = malloc(nslots * sizeof(*c->slots));
    if (c->nodes == NULL || c->slots == NULL) {
        free(c->nodes);
        free(c->slots);
        return KVT_ERR_NO_MEM;
    }
    memset(c->slots, 0xff, nslots * sizeof(*c->slots));
    for (uint64_t i = 0; i < nodes; i++)
        c->nodes[i].next = i + 1 < nodes ? (uint32_t)(i + 1) : SIM_NONE;
    c->mask = nslots - 1;
    c->cap = cap;
    c->mru = c->lru = SIM_NONE;
    c->free_head = 0;
    return KVT_OK;
}

static void sim_cache_cleanup(sim_cache_t *c)
{
    free(c->nodes);
    free(c->slots);
    memset(c, 0, sizeof(*c));
}

/* The slot holding @id, or the empty slot where it would go. */
static uint64_t sim_cache_slot(const sim_cache_t *c, uint64_t id)
{
    uint64_t s = sim_mix(id) & c->mask;
    while (c->slots[s] != SIM_NONE && c->nodes[c->slots[s]].id != id)
        s = (s + 1) & c->mask;
    return s;
}

static void sim_cache_unlink(sim_cache_t *c, uint32_t n)
{
    sim_node_t *x = &c->nodes[n];
    if (x->prev != SIM_NONE)
        c->nodes[x->prev].next = x->next;
    else
        c->mru = x->next;
    if (x->next != SIM_NONE)
        c->nodes[x->next].prev = x->prev;
    else
        c->lru = x->prev;
}

static void sim_cache_push_mru(sim_cache_t *c, uint32_t n)
{
    c->nodes[n].prev = SIM_NONE;
    c->nodes[n].next = c->mru;
    if (c->mru != SIM_NONE)
        c->nodes[c->mru].prev = n;
    c->mru = n;
    if (c->lru == SIM_NONE)
        c->lru = n;
}

/* Removes the map's slot @s (backward-shift deletion: no tombstones). */
static void sim_cache_slot_del(sim_cache_t *c, uint64_t s)
{
    uint64_t hole = s;
    for (uint64_t i = (s + 1) & c->mask; c->slots[i] != SIM_NONE; i = (i + 1) & c->mask) {
        uint64_t home = sim_mix(c->nodes[c->slots[i]].id) & c->mask;
        /* moves into the hole unless its home lies cyclically in (hole, i] */
        if (((i - home) & c->mask) >= ((i - hole) & c->mask)) {
            c->slots[hole] = c->slots[i];
            hole = i;
        }
    }
    c->slots[hole] = SIM_NONE;
}

/* Blocks of @ids[0..n) held from block 0 on. */
static uint32_t sim_cache_hit(const sim_cache_t *c, const uint64_t *ids, uint32_t n)
{
    uint32_t b = 0;
    while (b < n && c->slots[sim_cache_slot(c, ids[b])] != SIM_NONE)
        b++;
    return b;
}

/*
 * Caches @ids[0..n) (n <= the init's @room), touched tail first; then evicts
 * least recently used blocks down to the capacity, appending them to
 * @evicted (room for @n) and counting them in *@nev_p. Evicting after the
 * request, not block by block, is what an engine does: the request's own
 * blocks are pinned while it runs, so only other blocks make room (and its
 * own only when it alone is larger than the cache: then its tail goes).
 */
static void sim_cache_insert(sim_cache_t *c, const uint64_t *ids, uint32_t n, uint64_t *evicted,
                             uint32_t *nev_p)
{
    uint32_t nev = 0;
    for (uint32_t k = n; k-- > 0;) {
        uint64_t s = sim_cache_slot(c, ids[k]);
        uint32_t node = c->slots[s];
        if (node != SIM_NONE) {
            sim_cache_unlink(c, node);
            sim_cache_push_mru(c, node);
            continue;
        }
        node = c->free_head;
        c->free_head = c->nodes[node].next;
        c->nodes[node].id = ids[k];
        c->slots[s] = node;
        sim_cache_push_mru(c, node);
        c->held++;
    }
    while (c->held > c->cap) {
        uint32_t old = c->lru;
        evicted[nev++] = c->nodes[old].id;
        sim_cache_slot_del(c, sim_cache_slot(c, c->nodes[old].id));
        sim_cache_unlink(c, old);
        c->nodes[old].next = c->free_head;
        c->free_head = old;
        c->held--;
    }
    *nev_p = nev;
}

/* ---- the cluster ---------------------------------------------------------------------------- */

typedef struct sim {
    const kvt_trace_t *t;
    const kvt_sim_config_t *cfg;
    sim_cache_t *caches;
    kvt_idx_t *idx;
    kvt_idx_reader_t *reader;
    uint32_t ns;
    uint32_t *pod_ids;   /* the index's id of pod i */
    uint32_t *pod_of_id; /* inverse, indexed by index id (pod_limit entries) */
    uint32_t pod_limit;  /* entries of pod_of_id */
    uint64_t *keys;      /* the index's key of every trace id (t->ids order) */
    uint64_t *evicted;   /* max_blocks scratch */
    double *load;        /* the scorer's load, indexed by index pod id */
    uint64_t rng;        /* `random` */
    uint64_t *sess_ids;  /* `session`: open-addressing map session id -> pod */
    uint32_t *sess_pods;
    uint64_t sess_mask;
    uint32_t rr; /* next round-robin pod (`session`'s fallback) */
} sim_t;

static void sim_cleanup(sim_t *s)
{
    if (s->caches != NULL)
        for (uint32_t p = 0; p < s->cfg->pods; p++)
            sim_cache_cleanup(&s->caches[p]);
    free(s->caches);
    if (s->reader != NULL)
        kvt_idx_reader_destroy(s->reader);
    kvt_idx_destroy(s->idx);
    free(s->pod_ids);
    free(s->pod_of_id);
    free(s->keys);
    free(s->evicted);
    free(s->load);
    free(s->sess_ids);
    free(s->sess_pods);
}

static kvt_status_t sim_init(sim_t *s, const kvt_trace_t *t, const kvt_sim_config_t *cfg, char *why,
                             size_t whylen)
{
    uint32_t np = cfg->pods;
    kvt_status_t st;

    memset(s, 0, sizeof(*s));
    s->t = t;
    s->cfg = cfg;
    s->rng = cfg->seed ? cfg->seed : 1;
    /* an unbounded cache never holds more than the trace's blocks */
    uint64_t cap = cfg->capacity_blocks;
    if (cap == 0 || cap > t->nids)
        cap = t->nids ? t->nids : 1;
    s->caches = calloc(np, sizeof(*s->caches));
    s->pod_ids = calloc(np, sizeof(*s->pod_ids));
    s->keys = malloc((t->nids ? t->nids : 1) * sizeof(*s->keys));
    s->evicted = malloc((t->max_blocks ? t->max_blocks : 1) * sizeof(*s->evicted));
    if (s->caches == NULL || s->pod_ids == NULL || s->keys == NULL || s->evicted == NULL)
        return KVT_ERR_NO_MEM;
    for (uint32_t p = 0; p < np; p++)
        if ((st = sim_cache_init(&s->caches[p], cap, t->max_blocks)) != KVT_OK)
            return st;
    for (size_t i = 0; i < t->nids; i++)
        s->keys[i] = sim_mix(t->ids[i] ^ 0x6b76746965722d73ull);

    if ((st = kvt_idx_create(NULL, &s->idx)) != KVT_OK ||
        (st = kvt_idx_reader_create(s->idx, &s->reader)) != KVT_OK ||
        (st = kvt_idx_ns_get(s->idx, "replay", NULL, 512, &s->ns)) != KVT_OK) {
        kvt_errf(why, whylen, "index: %s", kvt_status_str(st));
        return st;
    }
    for (uint32_t p = 0; p < np; p++) {
        char name[32];
        snprintf(name, sizeof(name), "pod-%" PRIu32, p);
        if ((st = kvt_idx_pod_get(s->idx, name, 0, &s->pod_ids[p])) != KVT_OK) {
            kvt_errf(why, whylen, "index: pod %" PRIu32 ": %s", p, kvt_status_str(st));
            return st;
        }
    }
    s->pod_limit = kvt_idx_pod_limit(s->idx);
    s->pod_of_id = malloc(s->pod_limit * sizeof(*s->pod_of_id));
    s->load = calloc(s->pod_limit, sizeof(*s->load));
    if (s->pod_of_id == NULL || s->load == NULL)
        return KVT_ERR_NO_MEM;
    memset(s->pod_of_id, 0xff, s->pod_limit * sizeof(*s->pod_of_id));
    for (uint32_t p = 0; p < np; p++)
        s->pod_of_id[s->pod_ids[p]] = p;

    if (cfg->policy == KVT_SIM_SESSION && cfg->sessions != NULL) {
        uint64_t n = 16;
        while (n < 2 * (uint64_t)t->nreqs)
            n <<= 1;
        s->sess_ids = calloc(n, sizeof(*s->sess_ids));
        s->sess_pods = malloc(n * sizeof(*s->sess_pods));
        if (s->sess_ids == NULL || s->sess_pods == NULL)
            return KVT_ERR_NO_MEM;
        s->sess_mask = n - 1;
    }
    return KVT_OK;
}

/* `session`: the pod of session @sid (0: none), round-robin for one seen first. */
static uint32_t sim_session_pod(sim_t *s, uint64_t sid)
{
    if (sid == 0 || s->sess_ids == NULL)
        return s->rr++ % s->cfg->pods;
    uint64_t i = sim_mix(sid) & s->sess_mask;
    while (s->sess_ids[i] != 0 && s->sess_ids[i] != sid)
        i = (i + 1) & s->sess_mask;
    if (s->sess_ids[i] == 0) {
        s->sess_ids[i] = sid;
        s->sess_pods[i] = s->rr++ % s->cfg->pods;
    }
    return s->sess_pods[i];
}

/* The policy's pod for request @r (keys @keys[0..n)); SIM_NONE after writing @why. */
static uint32_t sim_route(sim_t *s, size_t r, const uint64_t *keys, uint32_t n,
                          const kvt_sim_result_t *res, char *why, size_t whylen)
{
    const kvt_sim_config_t *cfg = s->cfg;
    uint32_t np = cfg->pods;

    switch (cfg->policy) {
    case KVT_SIM_RANDOM: {
        uint64_t x = s->rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s->rng = x;
        return (uint32_t)(x % np);
    }
    case KVT_SIM_ROUND_ROBIN: return (uint32_t)(r % np);
    case KVT_SIM_LEAST_LOADED: {
        uint32_t best = 0;
        for (uint32_t p = 1; p < np; p++)
            if (res->prefilled[p] < res->prefilled[best])
                best = p;
        return best;
    }
    case KVT_SIM_SESSION: return sim_session_pod(s, cfg->sessions ? cfg->sessions[r] : 0);
    case KVT_SIM_PREFIX:
    case KVT_SIM_COST: break;
    case KVT_SIM_NPOLICIES: return SIM_NONE;
    }

    const kvt_idx_match_t *m = NULL;
    size_t nm = 0;
    kvt_status_t st = kvt_idx_query(s->reader, s->ns, keys, n, NULL, 0, &m, &nm);
    if (st != KVT_OK) {
        kvt_errf(why, whylen, "index query: %s", kvt_status_str(st));
        return SIM_NONE;
    }
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    const double *load = NULL;
    if (cfg->policy == KVT_SIM_COST) {
        if (cfg->load_weight >= 0)
            w.load = cfg->load_weight;
        uint64_t lo = UINT64_MAX;
        for (uint32_t p = 0; p < np; p++)
            if (res->prefilled[p] < lo)
                lo = res->prefilled[p];
        for (uint32_t p = 0; p < np; p++)
            s->load[s->pod_ids[p]] = (double)(res->prefilled[p] - lo);
        load = s->load;
    }
    uint64_t tie = sim_mix(cfg->seed ^ (uint64_t)r);
    uint32_t id =
        kvt_score_pick(&w, m, nm, s->pod_ids, np, load, load ? s->pod_limit : 0, tie, NULL);
    if (id >= s->pod_limit || s->pod_of_id[id] == SIM_NONE) {
        kvt_errf(why, whylen, "scorer picked unknown pod %" PRIu32, id);
        return SIM_NONE;
    }
    return s->pod_of_id[id];
}

/* The index's match for @pod on @keys[0..n); UINT32_MAX on a query error. */
static uint32_t sim_index_match(sim_t *s, uint32_t pod, const uint64_t *keys, uint32_t n)
{
    const kvt_idx_match_t *m = NULL;
    size_t nm = 0;
    uint32_t id = s->pod_ids[pod];
    if (kvt_idx_query(s->reader, s->ns, keys, n, &id, 1, &m, &nm) != KVT_OK)
        return UINT32_MAX;
    for (size_t i = 0; i < nm; i++)
        if (m[i].pod == id)
            return m[i].matched;
    return 0;
}

static double sim_imbalance(const uint64_t *v, uint32_t n)
{
    uint64_t max = 0, sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        sum += v[i];
        if (v[i] > max)
            max = v[i];
    }
    return sum ? (double)max * n / (double)sum : 1.0;
}

kvt_status_t kvt_sim_run(const kvt_trace_t *t, const kvt_sim_config_t *cfg, kvt_sim_result_t *res,
                         char *why, size_t whylen)
{
    kvt_sim_result_t r = {0};
    sim_t s;
    kvt_status_t st;

    if (res != NULL)
        memset(res, 0, sizeof(*res));
    if (t == NULL || cfg == NULL || res == NULL || cfg->pods == 0 || cfg->pods > KVT_IDX_MAX_PODS ||
        (unsigned)cfg->policy >= KVT_SIM_NPOLICIES || cfg->capacity_blocks >= SIM_NONE - 1) {
        kvt_errf(why, whylen, "bad arguments");
        return KVT_ERR_INVAL;
    }
    r.pods = cfg->pods;
    r.prefilled = calloc(cfg->pods, sizeof(*r.prefilled));
    r.routed = calloc(cfg->pods, sizeof(*r.routed));
    r.req_pod = malloc((t->nreqs ? t->nreqs : 1) * sizeof(*r.req_pod));
    r.req_hit = malloc((t->nreqs ? t->nreqs : 1) * sizeof(*r.req_hit));
    st = sim_init(&s, t, cfg, why, whylen);
    if (st == KVT_OK &&
        (r.prefilled == NULL || r.routed == NULL || r.req_pod == NULL || r.req_hit == NULL))
        st = KVT_ERR_NO_MEM;
    if (st != KVT_OK)
        goto err_sim;

    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *q = &t->reqs[i];
        const uint64_t *keys = s.keys + (q->hash_ids - t->ids);
        uint32_t n = q->nblocks;

        uint32_t pod = sim_route(&s, i, keys, n, &r, why, whylen);
        if (pod == SIM_NONE) {
            st = KVT_ERR_INTERNAL;
            goto err_sim;
        }
        sim_cache_t *c = &s.caches[pod];
        uint32_t hit = sim_cache_hit(c, q->hash_ids, n);
        if (sim_index_match(&s, pod, keys, n) != hit)
            r.index_mismatch++;
        r.req_pod[i] = pod;
        r.req_hit[i] = hit;
        r.hit_blocks += hit;
        r.total_blocks += n;
        r.prefilled[pod] += n - hit;
        r.routed[pod] += n;
        if (n == 0)
            continue;

        /* the engine's events: BlockStored for the request's chain, BlockRemoved for evictions */
        uint32_t nev = 0;
        sim_cache_insert(c, q->hash_ids, n, s.evicted, &nev);
        st = kvt_idx_store(s.idx, s.ns, s.pod_ids[pod], KVT_TIER_GPU, NULL, keys, NULL, n);
        for (uint32_t k = 0; k < nev && st == KVT_OK; k++) {
            uint64_t key = sim_mix(s.evicted[k] ^ 0x6b76746965722d73ull);
            st = kvt_idx_remove(s.idx, s.pod_ids[pod], KVT_TIER_GPU, &key, 1, NULL);
        }
        if (st != KVT_OK) {
            kvt_errf(why, whylen, "index write: %s", kvt_status_str(st));
            goto err_sim;
        }
        r.evicted += nev;
    }
    r.requests = t->nreqs;
    r.hit_ratio = r.total_blocks ? (double)r.hit_blocks / (double)r.total_blocks : 0.0;
    r.load_imbalance = sim_imbalance(r.prefilled, cfg->pods);
    r.routed_imbalance = sim_imbalance(r.routed, cfg->pods);
    sim_cleanup(&s);
    *res = r;
    return KVT_OK;

err_sim:
    if (st == KVT_ERR_NO_MEM)
        kvt_errf(why, whylen, "out of memory");
    sim_cleanup(&s);
    kvt_sim_result_cleanup(&r);
    return st;
}

kvt_status_t kvt_sim_ideal(const kvt_trace_t *t, uint64_t *hit_p, uint64_t *total_p)
{
    sim_cache_t c;
    uint64_t hit = 0, total = 0;
    uint64_t *ev = malloc((t->max_blocks ? t->max_blocks : 1) * sizeof(*ev));
    kvt_status_t st =
        ev ? sim_cache_init(&c, t->nids ? t->nids : 1, t->max_blocks) : KVT_ERR_NO_MEM;
    if (st != KVT_OK) {
        free(ev);
        return st;
    }
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *q = &t->reqs[i];
        uint32_t nev;
        hit += sim_cache_hit(&c, q->hash_ids, q->nblocks);
        total += q->nblocks;
        sim_cache_insert(&c, q->hash_ids, q->nblocks, ev, &nev);
    }
    sim_cache_cleanup(&c);
    free(ev);
    if (hit_p != NULL)
        *hit_p = hit;
    if (total_p != NULL)
        *total_p = total;
    return KVT_OK;
}

void kvt_sim_result_cleanup(kvt_sim_result_t *res)
{
    if (res == NULL)
        return;
    free(res->prefilled);
    free(res->routed);
    free(res->req_pod);
    free(res->req_hit);
    memset(res, 0, sizeof(*res));
}
