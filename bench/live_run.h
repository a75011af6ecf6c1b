/*
 * bench/live_run: one policy of `kvtier-bench replay --mode live` (issue 18):
 * N simulated engines (bench/live_engine.h) publish vLLM KV events to a real
 * kvtierd, and a router asks that kvtierd through libkvtier where each
 * request goes.
 *
 * Per policy the engines are new and publish under their own model name
 * ("<tag>-<policy>", pods "<tag>-<policy>-<i>"): a namespace of its own in
 * the daemon, so each policy starts from an empty view, against the same
 * kvtierd. Requests are paced at trace time / speedup in wall time. Per
 * request the router makes one query (kvt_client_query_keys: the request's
 * block keys, every pod) and picks as bench/sim_route.h's policies do:
 * `prefix` and `cost` rank the daemon's matches with kvt_score_pick (cost's
 * load: each engine's outstanding prefill, in blocks) and record the
 * decision with kvt_client_routed (speculative entries); the others route
 * through kvt_sim_route with the same load. After the last request every
 * batch is sent, the daemon is waited for, and its view of each engine is
 * compared with the engine's cache, block by block.
 */
#ifndef KVT_BENCH_LIVE_RUN_H
#define KVT_BENCH_LIVE_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bench/replay.h"
#include "bench/sim.h"
#include "bench/sim_model.h"
#include "bench/trace.h"
#include "common/status.h"
#include "kvtier/client.h"

/* `kvtier-bench replay --mode live`: the subcommand (bench_live.c). */
int kvt_bench_live_main(int argc, char **argv);

/* The block keys of a trace's requests, as kvtierd computes them from the engines' tokens. */
typedef struct kvt_live_keys {
    uint64_t *pos;  /* the key of every t->ids entry (same order) */
    uint64_t *ids;  /* distinct trace ids, sorted */
    uint64_t *keys; /* their keys */
    size_t n;
    size_t conflicts; /* ids met under two different prefixes (the trace is not prefix-chained) */
} kvt_live_keys_t;

/*
 * Keys of the first @nreqs requests of @t, each block @bs tokens of
 * kvt_live_block_tokens(). KVT_OK or KVT_ERR_NO_MEM (@k zeroed).
 */
kvt_status_t kvt_live_keys_build(const kvt_trace_t *t, size_t nreqs, uint32_t bs,
                                 kvt_live_keys_t *k);

void kvt_live_keys_cleanup(kvt_live_keys_t *k);

typedef struct kvt_live_config {
    const kvt_trace_t *t;
    size_t nreqs; /* the first nreqs requests are replayed */
    const kvt_live_keys_t *keys;
    uint32_t pods;            /* engines, 1..KVT_LIVE_MAX_PODS */
    uint64_t capacity_blocks; /* per engine, >= 1 */
    kvt_sim_policy_t policy;
    uint64_t seed;
    double load_weight; /* cost: the scorer's w_load */
    double speedup;     /* trace seconds per wall second */
    uint32_t block_size;
    uint32_t routed_ttl_ms; /* prefix, cost: kvt_client_routed's TTL; 0: no routed calls */
    uint32_t lose_every;    /* test hook: every Nth batch of each engine skips the PUB (0: none) */
    const char *tag;        /* names: model "<tag>-<policy>", pods "<tag>-<policy>-<i>" */
    kvt_sim_model_t model;
    bool keep_engines; /* leave the engines subscribed afterwards (their sockets close) */
    FILE *dump;        /* may be NULL: "model pod key..." per engine after the run */
    FILE *per_request; /* may be NULL: "policy request pod hit blocks view ttft_us query_us" */
    const uint64_t *sessions; /* per request (`session`), borrowed; NULL: none */
} kvt_live_config_t;

#define KVT_LIVE_MAX_PODS 256

typedef struct kvt_live_result {
    /* the cache mode's figures; sim.index_mismatch counts stale views (below) */
    kvt_sim_result_t sim;
    double ttft_p50_ms, ttft_p90_ms, ttft_p99_ms; /* simulated: wait + prefill */
    double query_p50_us, query_p99_us, query_max_us;
    double routed_p50_us; /* kvt_client_routed round trips (0 when none) */
    uint64_t routed_calls;
    uint64_t stale_over;     /* the daemon's match on the chosen pod > the engine's hit */
    uint64_t stale_under;    /* ... < the engine's hit */
    uint64_t final_mismatch; /* blocks where the daemon's final view != the engine's cache */
    uint64_t held_blocks;    /* blocks the engines held at the end */
    uint64_t batches, gaps, replays, state_drops; /* over the engines' streams */
    double lag_max_ms; /* how far the bench fell behind the trace's schedule (wall) */
    double wall_s;
    double *ttft_ms; /* per request (trace order), for the TTFT CDF; sim.requests entries */
} kvt_live_result_t;

/*
 * Runs @cfg against the kvtierd behind @c (borrowed; its RPC). On KVT_OK
 * *@res is filled (free with kvt_live_result_cleanup); else @why has one line.
 */
kvt_status_t kvt_live_run(kvt_client_t *c, const kvt_live_config_t *cfg, kvt_live_result_t *res,
                          char *why, size_t whylen);

void kvt_live_result_cleanup(kvt_live_result_t *r);

#endif
