/* bench/sim: cache-mode replay of a trace over simulated pods (sim.h). */
#include "bench/sim.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"

#include "bench/sim_cache.h"
#include "bench/sim_route.h"
#include "kvindex/index.h"

static const char *const sim_policy_names[KVT_SIM_NPOLICIES] = {
    "random", "round-robin", "least-loaded",  "session",
    "prefix", "cost",        "approx-prefix", "cost-tiers",
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

/* ---- the cluster ---------------------------------------------------------------------------- */

typedef struct sim {
    const kvt_trace_t *t;
    const kvt_sim_config_t *cfg;
    kvt_sim_cache_t *caches;
    kvt_idx_t *idx;
    kvt_idx_reader_t *reader;
    kvt_sim_router_t *router;
    uint32_t ns;
    uint32_t *pod_ids; /* the index's id of pod i */
    uint64_t *keys;    /* the index's key of every trace id (t->ids order) */
    uint64_t *evicted; /* max_blocks scratch */
    double *load;      /* per pod: the router's load, beyond the least loaded pod's */
    double *recent;    /* per pod: blocks prefilled, decayed (load_half_life_ms > 0) */
} sim_t;

static void sim_cleanup(sim_t *s)
{
    if (s->caches != NULL)
        for (uint32_t p = 0; p < s->cfg->pods; p++)
            kvt_sim_cache_cleanup(&s->caches[p]);
    free(s->caches);
    kvt_sim_router_destroy(s->router);
    if (s->reader != NULL)
        kvt_idx_reader_destroy(s->reader);
    kvt_idx_destroy(s->idx);
    free(s->pod_ids);
    free(s->keys);
    free(s->evicted);
    free(s->load);
    free(s->recent);
}

static kvt_status_t sim_init(sim_t *s, const kvt_trace_t *t, const kvt_sim_config_t *cfg, char *why,
                             size_t whylen)
{
    uint32_t np = cfg->pods;
    kvt_status_t st;

    memset(s, 0, sizeof(*s));
    s->t = t;
    s->cfg = cfg;
    /* an unbounded cache never holds more than the trace's blocks */
    uint64_t cap = cfg->capacity_blocks;
    if (cap == 0 || cap > t->nids)
        cap = t->nids ? t->nids : 1;
    s->caches = calloc(np, sizeof(*s->caches));
    s->pod_ids = calloc(np, sizeof(*s->pod_ids));
    s->keys = malloc((t->nids ? t->nids : 1) * sizeof(*s->keys));
    s->evicted = malloc((t->max_blocks ? t->max_blocks : 1) * sizeof(*s->evicted));
    s->load = calloc(np, sizeof(*s->load));
    s->recent = calloc(np, sizeof(*s->recent));
    if (s->caches == NULL || s->pod_ids == NULL || s->keys == NULL || s->evicted == NULL ||
        s->load == NULL || s->recent == NULL)
        return KVT_ERR_NO_MEM;
    for (uint32_t p = 0; p < np; p++)
        if ((st = kvt_sim_cache_init(&s->caches[p], cap, t->max_blocks)) != KVT_OK)
            return st;
    for (size_t i = 0; i < t->nids; i++)
        s->keys[i] = kvt_sim_key(t->ids[i]);

    if ((st = kvt_sim_index_open(np, &s->idx, &s->reader, &s->ns, s->pod_ids, why, whylen)) !=
        KVT_OK)
        return st;
    kvt_sim_router_config_t rc = {
        .policy = cfg->policy,
        .pods = np,
        .seed = cfg->seed,
        .load_weight = cfg->load_weight,
        .sessions = cfg->sessions != NULL ? t->nreqs : 0,
        .approx_capacity = cfg->approx_capacity ? cfg->approx_capacity : cap,
        .max_blocks = t->max_blocks,
    };
    return kvt_sim_router_create(&rc, s->idx, s->reader, s->ns, s->pod_ids, &s->router, why,
                                 whylen);
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

/*
 * The router's load before a request at @now_ms. Nothing is outstanding when
 * requests finish one by one, so a pod's load is the work it has done: its
 * blocks prefilled so far, or with a half-life those decayed by the trace's
 * time since. What counts is the excess over the least loaded pod's, in
 * percent of the mean (default: scale-free, so w_load 1 trades a block of
 * match for 1% of excess at any point of any trace) or in blocks.
 */
static void sim_load(sim_t *s, const uint64_t *prefilled, uint64_t now_ms, uint64_t *last_p)
{
    uint32_t np = s->cfg->pods;
    double hl = s->cfg->load_half_life_ms, lo = INFINITY;
    if (hl > 0 && now_ms > *last_p) {
        double f = exp2(-(double)(now_ms - *last_p) / hl);
        for (uint32_t p = 0; p < np; p++)
            s->recent[p] *= f;
    }
    *last_p = now_ms > *last_p ? now_ms : *last_p;
    for (uint32_t p = 0; p < np; p++) {
        s->load[p] = hl > 0 ? s->recent[p] : (double)prefilled[p];
        lo = s->load[p] < lo ? s->load[p] : lo;
    }
    double mean = 0.0;
    for (uint32_t p = 0; p < np; p++)
        mean += s->load[p] / np;
    double scale = s->cfg->load_blocks || mean <= 0.0 ? 1.0 : 100.0 / mean;
    for (uint32_t p = 0; p < np; p++)
        s->load[p] = (s->load[p] - lo) * scale;
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
        (unsigned)cfg->policy >= KVT_SIM_NPOLICIES || cfg->capacity_blocks >= KVT_SIM_NONE - 1 ||
        cfg->approx_capacity >= KVT_SIM_NONE - 1) {
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

    uint64_t last_ms = t->nreqs ? t->reqs[0].timestamp_ms : 0;
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *q = &t->reqs[i];
        const uint64_t *keys = s.keys + (q->hash_ids - t->ids);
        uint32_t n = q->nblocks;

        sim_load(&s, r.prefilled, q->timestamp_ms, &last_ms);
        uint64_t sid = cfg->sessions != NULL ? cfg->sessions[i] : 0;
        uint32_t pod = kvt_sim_route(s.router, i, sid, keys, n, s.load, why, whylen);
        if (pod == KVT_SIM_NONE) {
            st = KVT_ERR_INTERNAL;
            goto err_sim;
        }
        kvt_sim_cache_t *c = &s.caches[pod];
        uint32_t hit = kvt_sim_cache_hit(c, q->hash_ids, n);
        if (sim_index_match(&s, pod, keys, n) != hit)
            r.index_mismatch++;
        r.req_pod[i] = pod;
        r.req_hit[i] = hit;
        r.hit_blocks += hit;
        r.total_blocks += n;
        r.prefilled[pod] += n - hit;
        s.recent[pod] += n - hit;
        r.routed[pod] += n;
        if (n == 0)
            continue;

        /* the engine's events: BlockStored for the request's chain, BlockRemoved for evictions */
        uint32_t nev = 0;
        kvt_sim_cache_insert(c, q->hash_ids, n, s.evicted, &nev);
        st = kvt_idx_store(s.idx, s.ns, s.pod_ids[pod], KVT_TIER_GPU, NULL, keys, NULL, n);
        for (uint32_t k = 0; k < nev && st == KVT_OK; k++) {
            uint64_t key = kvt_sim_key(s.evicted[k]);
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
    kvt_sim_cache_t c;
    uint64_t hit = 0, total = 0;
    uint64_t *ev = malloc((t->max_blocks ? t->max_blocks : 1) * sizeof(*ev));
    kvt_status_t st =
        ev ? kvt_sim_cache_init(&c, t->nids ? t->nids : 1, t->max_blocks) : KVT_ERR_NO_MEM;
    if (st != KVT_OK) {
        free(ev);
        return st;
    }
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *q = &t->reqs[i];
        uint32_t nev;
        hit += kvt_sim_cache_hit(&c, q->hash_ids, q->nblocks);
        total += q->nblocks;
        kvt_sim_cache_insert(&c, q->hash_ids, q->nblocks, ev, &nev);
    }
    kvt_sim_cache_cleanup(&c);
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
