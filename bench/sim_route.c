/* bench/sim_route: the routers' policies over simulated pods (sim_route.h). */
#include "bench/sim_route.h"

#include <inttypes.h>
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
};

void kvt_sim_router_destroy(kvt_sim_router_t *r)
{
    if (r == NULL)
        return;
    free(r->pod_of_id);
    free(r->load);
    free(r->sess_ids);
    free(r->sess_pods);
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
    case KVT_SIM_COST: break;
    case KVT_SIM_COST_TIERS: break;
    case KVT_SIM_NPOLICIES: return KVT_SIM_NONE;
    }

    const kvt_idx_match_t *m = NULL;
    size_t nm = 0;
    kvt_status_t st = kvt_idx_query(r->reader, r->ns, keys, n, NULL, 0, &m, &nm);
    if (st != KVT_OK) {
        kvt_errf(why, whylen, "index query: %s", kvt_status_str(st));
        return KVT_SIM_NONE;
    }
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    const double *sload = NULL;
    if (cfg->policy == KVT_SIM_COST)
        w.cpu = w.disk = 0.0; /* GPU matches only */
    if (cfg->policy == KVT_SIM_COST_TIERS) {
        w.gpu = 1.0;
        w.cpu = cfg->tier_cpu >= 0 ? cfg->tier_cpu : w.cpu;
        w.disk = cfg->tier_disk >= 0 ? cfg->tier_disk : w.disk;
    }
    if (cfg->policy == KVT_SIM_COST || cfg->policy == KVT_SIM_COST_TIERS) {
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
    return r->pod_of_id[id];
}
