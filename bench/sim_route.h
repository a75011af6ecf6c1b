/*
 * bench/sim_route: the routers' policies over simulated pods (sim.h names
 * them). One router serves one replay: the cache, timed and live modes feed
 * it each request's keys and the pods' load, and it answers a pod.
 */
#ifndef KVT_BENCH_SIM_ROUTE_H
#define KVT_BENCH_SIM_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "bench/sim.h"
#include "kvindex/index.h"

typedef struct kvt_sim_router kvt_sim_router_t;

/*
 * The simulators' index: a new kvtier index with a reader, the namespace
 * "replay" (block size 512) in *@ns_p, and pods "pod-0".."pod-<n-1>" whose
 * index ids go to @pod_ids[0..n). KVT_OK, or an index error with @why (what
 * was made is left in *@idx_p and *@reader_p for the caller to clean up).
 */
kvt_status_t kvt_sim_index_open(uint32_t n, kvt_idx_t **idx_p, kvt_idx_reader_t **reader_p,
                                uint32_t *ns_p, uint32_t *pod_ids, char *why, size_t whylen);

typedef struct kvt_sim_router_config {
    kvt_sim_policy_t policy;
    uint32_t pods;      /* >= 1 */
    uint64_t seed;      /* `random`'s generator and the scorer's tie-breaks; 0 is taken as 1 */
    double load_weight; /* `cost`: the scorer's w_load; < 0: the scorer's default */
    size_t sessions;    /* `session`: distinct session ids at most (0: none are given) */
    /* `approx-prefix`: its table's entries per pod (>= 1), and keys per request at most */
    uint64_t approx_capacity;
    uint32_t max_blocks;
    /* `cost-tiers`: the scorer's w_cpu and w_disk (w_gpu 1); < 0: the scorer's defaults */
    double tier_cpu, tier_disk;
} kvt_sim_router_config_t;

/*
 * A router over @pod_ids[0..cfg->pods) (the index's ids of the simulated
 * pods, borrowed) in namespace @ns of @idx, read through @reader (both
 * borrowed; `prefix` and `cost` query them). KVT_OK, KVT_ERR_INVAL or
 * KVT_ERR_NO_MEM (@why says which).
 */
kvt_status_t kvt_sim_router_create(const kvt_sim_router_config_t *cfg, kvt_idx_t *idx,
                                   kvt_idx_reader_t *reader, uint32_t ns, const uint32_t *pod_ids,
                                   kvt_sim_router_t **r_p, char *why, size_t whylen);

void kvt_sim_router_destroy(kvt_sim_router_t *r);

/*
 * The pod (0..pods-1) for request number @req with session id @session (0:
 * none) and index keys @keys[0..n). @load[p] is pod p's load in blocks
 * (NULL: all idle): `least-loaded` takes its minimum, `cost` and
 * `approx-prefix` weigh it. `approx-prefix` then records @keys as routed to
 * the pod it answers. `cost` scores GPU blocks only (w_cpu = w_disk = 0);
 * `cost-tiers` weighs CPU and DISK blocks too.
 * KVT_SIM_NONE after writing @why (an index error).
 */
uint32_t kvt_sim_route(kvt_sim_router_t *r, uint64_t req, uint64_t session, const uint64_t *keys,
                       uint32_t n, const double *load, char *why, size_t whylen);

#endif
