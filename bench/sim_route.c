/* bench/sim_route: the routers' policies over simulated pods (sim_route.h). */
#include "bench/sim_route.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sim_cache.h"
#include "common/errtext.h"
#include "kvindex/score.h"

struct kvt_sim_router {
    kvt_sim_router_config_t cfg;
    kvt_idx_t *idx;
    kvt_idx_reader_t *reader;
    uint32_t ns;
    const uint32_t *pod_ids; /* the index's id of pod i */
    uint32_t *pod_of_id;     /* inverse, indexed by index id (pod_limit entries) */
    uint32_t pod_limit;
    double *load;       /* the scorer's load, indexed by index pod id */
    uint64_t rng;       /* `random` */
    uint64_t *sess_ids; /* `session`: open-addressing map session id -> pod */
    uint32_t *sess_pods;
    uint64_t sess_mask;
    uint32_t rr; /* next round-robin pod (`session`'s fallback) */
    /* `approx-prefix`: per pod an LRU of the keys routed there (llm-d's indexer) */
    kvt_sim_cache_t *approx;
    kvt_idx_match_t *amatch; /* per pod: its table's longest match */
    uint64_t *akeys;         /* max_blocks: a request's keys, last first */
    uint64_t *aevicted;      /* max_blocks */
};

kvt_status_t kvt_sim_index_open(uint32_t n, kvt_idx_t **idx_p, kvt_idx_reader_t **reader_p,
                                uint32_t *ns_p, uint32_t *pod_ids, char *why, size_t whylen)
{
    kvt_status_t st;
    if ((st = kvt_idx_create(NULL, idx_p)) != KVT_OK ||
        (st = kvt_idx_reader_create(*idx_p, reader_p)) != KVT_OK ||
        (st = kvt_idx_ns_get(*idx_p, "replay", NULL, 512, ns_p)) != KVT_OK) {
        kvt_errf(why, whylen, "index: %s", kvt_status_str(st));
        return st;
    }
    for (uint32_t p = 0; p < n; p++) {
        char name[32];
        snprintf(name, sizeof(name), "pod-%" PRIu32, p);
        if ((st = kvt_idx_pod_get(*idx_p, name, 0, &pod_ids[p])) != KVT_OK) {
            kvt_errf(why, whylen, "index: pod %" PRIu32 ": %s", p, kvt_status_str(st));
            return st;
        }
    }
    return KVT_OK;
}

void kvt_sim_router_destroy(kvt_sim_router_t *r)
{
    if (r == NULL)
        return;
    free(r->pod_of_id);
    free(r->load);
    free(r->sess_ids);
    free(r->sess_pods);
    if (r->approx != NULL)
        for (uint32_t p = 0; p < r->cfg.pods; p++)
            kvt_sim_cache_cleanup(&r->approx[p]);
    free(r->approx);
    free(r->amatch);
    free(r->akeys);
    free(r->aevicted);
    free(r);
}

kvt_status_t kvt_sim_router_create(const kvt_sim_router_config_t *cfg, kvt_idx_t *idx,
                                   kvt_idx_reader_t *reader, uint32_t ns, const uint32_t *pod_ids,
                                   kvt_sim_router_t **r_p, char *why, size_t whylen)
{
    *r_p = NULL;
    if (cfg->pods == 0 || (unsigned)cfg->policy >= KVT_SIM_NPOLICIES || idx == NULL ||
        reader == NULL || pod_ids == NULL) {
        kvt_errf(why, whylen, "bad arguments");
        return KVT_ERR_INVAL;
    }
    kvt_sim_router_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        goto err_nomem;
    r->cfg = *cfg;
    r->idx = idx;
    r->reader = reader;
    r->ns = ns;
    r->pod_ids = pod_ids;
    r->rng = cfg->seed ? cfg->seed : 1;
    r->pod_limit = kvt_idx_pod_limit(idx);
    r->pod_of_id = malloc(r->pod_limit * sizeof(*r->pod_of_id));
    r->load = calloc(r->pod_limit, sizeof(*r->load));
    if (r->pod_of_id == NULL || r->load == NULL)
        goto err_nomem;
    memset(r->pod_of_id, 0xff, r->pod_limit * sizeof(*r->pod_of_id));
    for (uint32_t p = 0; p < cfg->pods; p++) {
        if (pod_ids[p] >= r->pod_limit) {
            kvt_errf(why, whylen, "pod %" PRIu32 " has no index id", p);
            kvt_sim_router_destroy(r);
            return KVT_ERR_INVAL;
        }
        r->pod_of_id[pod_ids[p]] = p;
    }
    if (cfg->policy == KVT_SIM_SESSION && cfg->sessions > 0) {
        uint64_t n = 16;
        while (n < 2 * (uint64_t)cfg->sessions)
            n <<= 1;
        r->sess_ids = calloc(n, sizeof(*r->sess_ids));
        r->sess_pods = malloc(n * sizeof(*r->sess_pods));
        if (r->sess_ids == NULL || r->sess_pods == NULL)
            goto err_nomem;
        r->sess_mask = n - 1;
    }
    if (cfg->policy == KVT_SIM_APPROX_PREFIX) {
        size_t room = cfg->max_blocks ? cfg->max_blocks : 1;
        r->approx = calloc(cfg->pods, sizeof(*r->approx));
        r->amatch = malloc(cfg->pods * sizeof(*r->amatch));
        r->akeys = malloc(room * sizeof(*r->akeys));
        r->aevicted = malloc(room * sizeof(*r->aevicted));
        if (r->approx == NULL || r->amatch == NULL || r->akeys == NULL || r->aevicted == NULL)
            goto err_nomem;
        for (uint32_t p = 0; p < cfg->pods; p++) {
            kvt_status_t st =
                kvt_sim_cache_init(&r->approx[p], cfg->approx_capacity, cfg->max_blocks);
            if (st != KVT_OK) {
                kvt_sim_router_destroy(r);
                kvt_errf(why, whylen, "approx-prefix table: %s", kvt_status_str(st));
                return st;
            }
        }
    }
    *r_p = r;
    return KVT_OK;

err_nomem:
    kvt_sim_router_destroy(r);
    kvt_errf(why, whylen, "out of memory");
    return KVT_ERR_NO_MEM;
}

/* `session`: the pod of session @sid (0: none), round-robin for one seen first. */
static uint32_t route_session(kvt_sim_router_t *r, uint64_t sid)
{
    if (sid == 0 || r->sess_ids == NULL)
        return r->rr++ % r->cfg.pods;
    uint64_t i = kvt_sim_mix(sid) & r->sess_mask;
    while (r->sess_ids[i] != 0 && r->sess_ids[i] != sid)
        i = (i + 1) & r->sess_mask;
    if (r->sess_ids[i] == 0) {
        r->sess_ids[i] = sid;
        r->sess_pods[i] = r->rr++ % r->cfg.pods;
    }
    return r->sess_pods[i];
}

/*
 * `approx-prefix`: each pod's longest leading run of @keys in its table, as
 * the index would answer (only pods with a match; GPU tier).
 */
static void approx_match(kvt_sim_router_t *r, const uint64_t *keys, uint32_t n,
                         const kvt_idx_match_t **m_p, size_t *nm_p)
{
    size_t nm = 0;
    for (uint32_t p = 0; p < r->cfg.pods; p++) {
        uint32_t hit = kvt_sim_cache_hit(&r->approx[p], keys, n);
        if (hit > 0)
            r->amatch[nm++] = (kvt_idx_match_t){.pod = r->pod_ids[p], .matched = hit, .gpu = hit};
    }
    *m_p = r->amatch;
    *nm_p = nm;
}

/*
 * `approx-prefix` after its pick: the request's keys go into @pod's table in
 * request order, the last ending most recent, as llm-d's indexer adds them
 * one by one to a per-pod LRU (kvt_sim_cache_insert touches the last key it
 * is given first, hence the reversed copy). Inserting one by one or evicting
 * after the request leaves the same set: the capacity's most recent keys.
 */
static void approx_record(kvt_sim_router_t *r, uint32_t pod, const uint64_t *keys, uint32_t n)
{
    uint32_t nev = 0;
    for (uint32_t k = 0; k < n; k++)
        r->akeys[k] = keys[n - 1 - k];
    kvt_sim_cache_insert(&r->approx[pod], r->akeys, n, r->aevicted, &nev);
}

uint32_t kvt_sim_route(kvt_sim_router_t *r, uint64_t req, uint64_t session, const uint64_t *keys,
                       uint32_t n, const double *load, char *why, size_t whylen)
{
    const kvt_sim_router_config_t *cfg = &r->cfg;
    uint32_t np = cfg->pods;

    switch (cfg->policy) {
    case KVT_SIM_RANDOM: {
        uint64_t x = r->rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r->rng = x;
        return (uint32_t)(x % np);
    }
    case KVT_SIM_ROUND_ROBIN: return (uint32_t)(req % np);
    case KVT_SIM_LEAST_LOADED: {
        uint32_t best = 0;
        for (uint32_t p = 1; load != NULL && p < np; p++)
            if (load[p] < load[best])
                best = p;
        return best;
    }
    case KVT_SIM_SESSION: return route_session(r, session);
    case KVT_SIM_PREFIX:
    case KVT_SIM_COST:
    case KVT_SIM_COST_TIERS:
    case KVT_SIM_APPROX_PREFIX: break;
    case KVT_SIM_NPOLICIES: return KVT_SIM_NONE;
    }

    const kvt_idx_match_t *m = NULL;
    size_t nm = 0;
    if (cfg->policy == KVT_SIM_APPROX_PREFIX) {
        if (n > cfg->max_blocks) {
            kvt_errf(why, whylen, "request of %" PRIu32 " blocks, more than max_blocks", n);
            return KVT_SIM_NONE;
        }
        approx_match(r, keys, n, &m, &nm);
    } else {
        kvt_status_t st = kvt_idx_query(r->reader, r->ns, keys, n, NULL, 0, &m, &nm);
        if (st != KVT_OK) {
            kvt_errf(why, whylen, "index query: %s", kvt_status_str(st));
            return KVT_SIM_NONE;
        }
    }
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    const double *sload = NULL;
    if (cfg->policy == KVT_SIM_COST || cfg->policy == KVT_SIM_APPROX_PREFIX)
        w.cpu = w.disk = 0.0; /* GPU matches only */
    if (cfg->policy == KVT_SIM_COST_TIERS) {
        w.gpu = 1.0;
        w.cpu = cfg->tier_cpu >= 0 ? cfg->tier_cpu : w.cpu;
        w.disk = cfg->tier_disk >= 0 ? cfg->tier_disk : w.disk;
    }
    if (cfg->policy != KVT_SIM_PREFIX) {
        if (cfg->load_weight >= 0)
            w.load = cfg->load_weight;
        for (uint32_t p = 0; p < np; p++)
            r->load[r->pod_ids[p]] = load != NULL ? load[p] : 0.0;
        sload = r->load;
    }
    uint64_t tie = kvt_sim_mix(cfg->seed ^ req);
    uint32_t id =
        kvt_score_pick(&w, m, nm, r->pod_ids, np, sload, sload ? r->pod_limit : 0, tie, NULL);
    if (id >= r->pod_limit || r->pod_of_id[id] == KVT_SIM_NONE) {
        kvt_errf(why, whylen, "scorer picked unknown pod %" PRIu32, id);
        return KVT_SIM_NONE;
    }
    uint32_t pod = r->pod_of_id[id];
    if (cfg->policy == KVT_SIM_APPROX_PREFIX)
        approx_record(r, pod, keys, n);
    return pod;
}
