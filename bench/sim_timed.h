/*
 * bench/sim_timed: the timed mode of `kvtier-bench replay` (issue 18), an
 * event-driven simulation in simulated time (nothing sleeps).
 *
 * Requests arrive at their trace timestamps divided by the speedup and are
 * routed at once. Each pod runs one prefill at a time: when idle it takes
 * queued requests FIFO into a batch while the tokens they compute fit the
 * model's batch limit (the first always goes); the batch takes the sum of
 * its requests' prefill times (bench/sim_model.h); every request of it gets
 * its first token when the batch ends (TTFT), then decodes for
 * output_length times the time per output token, beside later prefills.
 *
 * Each pod has a GPU, a CPU and a DISK tier (LRU each; a capacity of 0 is an
 * absent tier, but GPU is always there). A block lives in one tier at a time:
 * blocks evicted from GPU go down to CPU, from CPU to DISK, from DISK away
 * (skipping absent tiers). A request's hit, taken when its batch starts, is
 * the longest leading run of its blocks held in any tier, each block counted
 * in the tier it was found; the CPU and DISK ones are loaded back to GPU,
 * the rest computed there. Blocks of running requests are pinned: those a
 * pod holds when a request is routed to it stay until its batch starts, and
 * all its blocks from then until its decode ends (then freed tail first, so
 * block 0 ends most recently used). Evictions run at a batch's start and when
 * a decode ends.
 *
 * The pods write a real kvtier index as the engines' and kvtier's own tier
 * events would, on the index clock kept at simulated time: a request's
 * blocks are stored in GPU when its prefill completes (not when routed), and
 * its loaded blocks leave CPU/DISK then; a demotion stores the lower tier
 * then removes the upper one; a block leaving its last tier is removed
 * (BlockRemoved). `prefix`, `cost` and `cost-tiers` route by that index, and
 * with a TTL record each decision as speculative entries
 * (kvt_idx_speculate), which stand for the blocks until the engine's store.
 */
#ifndef KVT_BENCH_SIM_TIMED_H
#define KVT_BENCH_SIM_TIMED_H

#include <stddef.h>
#include <stdint.h>

#include "bench/sim.h"
#include "bench/sim_model.h"
#include "bench/trace.h"
#include "common/status.h"

typedef struct kvt_sim_timed_config {
    uint32_t pods;        /* >= 1 */
    uint64_t gpu_blocks;  /* per pod; 0: unbounded */
    uint64_t cpu_blocks;  /* per pod; 0: no CPU tier */
    uint64_t disk_blocks; /* per pod; 0: no DISK tier */
    kvt_sim_policy_t policy;
    uint64_t seed;          /* `random`'s generator and the scorer's tie-breaks */
    double load_weight;     /* `cost`, `cost-tiers`: w_load; < 0: 1.0 */
    double speedup;         /* arrival time = timestamp / speedup; > 0 */
    uint32_t routed_ttl_ms; /* `prefix`, `cost`, `cost-tiers`: speculative TTL; 0: none */
    kvt_sim_model_t model;
    const uint64_t *sessions; /* per request, borrowed; NULL: none */
} kvt_sim_timed_config_t;

typedef struct kvt_sim_timed_result {
    uint64_t requests;
    uint64_t total_blocks;
    uint64_t hit_blocks;    /* gpu + cpu + disk */
    uint64_t hit_tier[3];   /* blocks hit in GPU, CPU, DISK */
    double hit_ratio;       /* hit_blocks / total_blocks */
    uint64_t prompt_tokens; /* the trace's input tokens */
    uint64_t saved_tokens;  /* prompt tokens not computed (cached) */
    double ttft_p50_ms, ttft_p90_ms, ttft_p99_ms, ttft_mean_ms;
    double queue_mean_ms, queue_p99_ms; /* arrival to batch start */
    double load_imbalance;              /* max/mean over pods of prefill busy time; 1.0 when none */
    double makespan_ms;                 /* the last decode's end */
    uint64_t batches;
    uint64_t evicted[3];     /* blocks leaving GPU, CPU, DISK (demoted or dropped) */
    uint64_t gpu_over;       /* most GPU blocks held beyond capacity (all pinned), any pod */
    uint64_t index_mismatch; /* batch starts where the index disagreed with the model (see .c) */
    uint64_t speculated;     /* routing decisions recorded as speculative entries */
    uint32_t pods;
    double *busy_us;      /* per pod: prefill busy time */
    uint32_t *req_pod;    /* per request (trace order) */
    uint32_t *req_hit;    /* per request: blocks hit (any tier) */
    double *req_ttft_us;  /* per request: arrival to first token */
    double *req_queue_us; /* per request: arrival to its batch's start */
} kvt_sim_timed_result_t;

/*
 * Replays @t under @cfg. On KVT_OK *@res is filled (freed with
 * kvt_sim_timed_result_cleanup()); on error @res is zeroed and @why holds
 * one line. KVT_OK, KVT_ERR_INVAL, KVT_ERR_NO_MEM or an index error.
 * Deterministic: the same trace and config give the same result.
 */
kvt_status_t kvt_sim_timed_run(const kvt_trace_t *t, const kvt_sim_timed_config_t *cfg,
                               kvt_sim_timed_result_t *res, char *why, size_t whylen);

/* Frees @res's arrays and zeroes it; a zeroed @res is fine. */
void kvt_sim_timed_result_cleanup(kvt_sim_timed_result_t *res);

#endif
