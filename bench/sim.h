/*
 * bench/sim: the cache mode of `kvtier-bench replay`, a simulated cluster of
 * pods serving a request trace under one routing policy (issue 18).
 *
 * The cache model, per pod: requests run in trace order, each finished
 * before the next. On the chosen pod a request hits the longest leading run
 * of its blocks that the pod holds. Afterwards all its blocks are cached
 * there, touched tail first, so block 0 ends most recently used (vLLM frees
 * a request's blocks tail first), and the least recently used blocks beyond
 * the pod's capacity are evicted. A block is its trace hash id (Mooncake's
 * ids name a whole prefix, so equal ids mean equal prefixes).
 *
 * Every policy runs beside a real kvtier index (kvindex/index.h) fed the way
 * the engines' events would feed it: the blocks a pod caches are stored
 * (BlockStored), the blocks it evicts removed (BlockRemoved). The `prefix`
 * and `cost` policies route by that index; for every policy the index's
 * answer for the chosen pod is checked against the model's hit
 * (kvt_sim_result_t.index_mismatch).
 */
#ifndef KVT_BENCH_SIM_H
#define KVT_BENCH_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/trace.h"
#include "common/status.h"

/*
 * Routing policies, each named after the routers that use it.
 * KVT_SIM_APPROX_PREFIX: the router's own table of what it routed where
 * (AIBrix's and llm-d's approximate prefix scorer, no engine events), with
 * `cost`'s load term.
 */
typedef enum kvt_sim_policy {
    KVT_SIM_RANDOM,       /* uniform over pods, from a seeded xorshift64 */
    KVT_SIM_ROUND_ROBIN,  /* request r goes to pod r mod N */
    KVT_SIM_LEAST_LOADED, /* fewest blocks prefilled so far (ties: lowest pod) */
    KVT_SIM_SESSION,      /* sticky by session id; round-robin for a new or absent one */
    KVT_SIM_PREFIX,       /* longest match in kvtier's index (kvt_score_pick, no load) */
    KVT_SIM_COST,         /* kvtier's scorer with its load term (see kvt_sim_config_t) */
    KVT_SIM_APPROX_PREFIX,
    KVT_SIM_COST_TIERS, /* the scorer over GPU, CPU and DISK matches (timed mode's weights) */
    KVT_SIM_NPOLICIES,
} kvt_sim_policy_t;

/* The policy's name ("round-robin", ...). */
const char *kvt_sim_policy_name(kvt_sim_policy_t p);

/* The policy named @name (exactly); KVT_OK or KVT_ERR_NOT_FOUND. */
kvt_status_t kvt_sim_policy_parse(const char *name, kvt_sim_policy_t *p_p);

typedef struct kvt_sim_config {
    uint32_t pods;            /* >= 1 */
    uint64_t capacity_blocks; /* per pod; 0: unbounded */
    kvt_sim_policy_t policy;
    uint64_t seed; /* `random`'s generator and the scorer's tie-breaks; 0 is taken as 1 */
    /*
     * `cost` and `approx-prefix`: the scorer's w_load (blocks of cache score
     * per unit of load). With requests finished one by one nothing is
     * outstanding, so a pod's load is the work it has done: the blocks it has
     * prefilled (decayed when load_half_life_ms > 0) beyond the least loaded
     * pod's, in percent of the pods' mean, or in blocks when load_blocks.
     * < 0: the scorer's default (1.0).
     */
    double load_weight;
    double load_half_life_ms; /* 0: every block prefilled so far counts */
    bool load_blocks;         /* the excess in blocks, not in percent of the mean */
    /* per request (trace order), borrowed; 0 means none; NULL: the trace has none */
    const uint64_t *sessions;
    /*
     * `approx-prefix`: entries of the router's table per pod (llm-d's
     * lruCapacityPerServer); 0: capacity_blocks (unbounded when that is).
     */
    uint64_t approx_capacity;
} kvt_sim_config_t;

typedef struct kvt_sim_result {
    uint64_t requests;
    uint64_t total_blocks; /* the trace's blocks */
    uint64_t hit_blocks;   /* blocks found cached on the chosen pod */
    double hit_ratio;      /* hit_blocks / total_blocks (0 for no blocks) */
    /* max/mean over pods of blocks prefilled (not hit): 1.0 when none was */
    double load_imbalance;
    double routed_imbalance; /* max/mean over pods of blocks routed (hit or not) */
    uint64_t evicted;        /* blocks evicted, all pods */
    uint64_t index_mismatch; /* requests whose index match on the chosen pod != the model's hit */
    uint32_t pods;           /* entries of the arrays below */
    uint64_t *prefilled;     /* per pod: blocks prefilled */
    uint64_t *routed;        /* per pod: blocks routed */
    uint32_t *req_pod;       /* per request: the chosen pod */
    uint32_t *req_hit;       /* per request: blocks hit */
} kvt_sim_result_t;

/*
 * Replays @t under @cfg. On KVT_OK *@res is filled (its arrays owned by it,
 * freed by kvt_sim_result_cleanup()); on error @res is left zeroed and @why
 * (when not NULL and @whylen > 0) holds one line. Returns KVT_OK,
 * KVT_ERR_INVAL (bad arguments), KVT_ERR_NO_MEM, or an index error.
 * Deterministic: the same trace and config give the same result.
 */
kvt_status_t kvt_sim_run(const kvt_trace_t *t, const kvt_sim_config_t *cfg, kvt_sim_result_t *res,
                         char *why, size_t whylen);

/*
 * The reference: the hit ratio of one pod with an unbounded cache, every
 * block cached from its first appearance (the best any routing can do).
 * @hit_p/@total_p may be NULL. KVT_OK or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_sim_ideal(const kvt_trace_t *t, uint64_t *hit_p, uint64_t *total_p);

/*
 * The second reference: one pod of @capacity blocks (0: unbounded) under
 * Belady's farthest-next-use eviction, with the cache model's semantics (hit:
 * the longest leading run held; all the request's blocks are cached; after
 * it, blocks beyond @capacity are evicted, the request's own only when it
 * alone exceeds the cache). The block evicted first is the one whose next
 * request is farthest, and among blocks next used by the same request the
 * one deepest in it (a leading run breaks at its first miss); blocks never
 * used again go before all. @hit_p/@total_p may be NULL. KVT_OK or
 * KVT_ERR_NO_MEM. (bench/sim_belady.c)
 */
kvt_status_t kvt_sim_belady(const kvt_trace_t *t, uint64_t capacity, uint64_t *hit_p,
                            uint64_t *total_p);

/* Frees @res's arrays and zeroes it. A zeroed @res is fine. */
void kvt_sim_result_cleanup(kvt_sim_result_t *res);

#endif
