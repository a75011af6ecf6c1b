/*
 * bench/replay: what the modes of `kvtier-bench replay` share (cache mode in
 * bench_replay.c, timed in replay_timed.c, live in bench_live.c): the trace
 * input, the --policy list, a policy's cache-mode figures as JSON.
 */
#ifndef KVT_BENCH_REPLAY_H
#define KVT_BENCH_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "bench/gen.h"
#include "bench/sim.h"
#include "bench/trace.h"

/* A loaded trace and its requests' session ids. */
typedef struct kvt_replay_input {
    kvt_trace_t *t;
    kvt_gen_t *gen;     /* owns t for an Azure CSV given structure by the generator */
    uint64_t *sessions; /* per request; NULL when the trace names no session */
} kvt_replay_input_t;

/*
 * Loads @path: Mooncake JSONL, or with a ".csv" name the Azure CSV given
 * prefix structure by the generator's defaults and @seed. 0, or -1 after one
 * line on stderr (@in zeroed).
 */
int kvt_replay_input_load(kvt_replay_input_t *in, const char *path, uint64_t seed);

/* Frees @in and zeroes it; a zeroed @in is fine. */
void kvt_replay_input_free(kvt_replay_input_t *in);

/* --policy's list ("all" or names, comma-separated) into @pol (room for KVT_SIM_NPOLICIES);
 * 0, or -1 after a line on stderr. */
int kvt_bench_replay_policies(const char *list, kvt_sim_policy_t *pol, size_t *n_p);

/* A policy's cache-mode figures as JSON fields (no braces). */
void kvt_bench_replay_json(kvt_sim_policy_t pol, const kvt_sim_result_t *r, double ideal);

#endif
