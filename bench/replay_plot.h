/*
 * bench/replay_plot: the plots of `kvtier-bench replay --out DIR` (issue 18):
 * hit ratio against capacity per policy, TTFT CDF per policy, per-pod load.
 * Each writes DIR/NAME.{dat,gp,png} through bench/plot.h.
 */
#ifndef KVT_BENCH_REPLAY_PLOT_H
#define KVT_BENCH_REPLAY_PLOT_H

#include <stddef.h>
#include <stdint.h>

#include "bench/sim.h"
#include "bench/trace.h"

/* Distinct hash ids of @t; UINT64_MAX when out of memory. */
uint64_t kvt_replay_distinct_blocks(const kvt_trace_t *t);

/*
 * hit-ratio-vs-capacity: runs the cache mode for every policy of
 * @pol[0..npol) at per-pod capacities @fracs[0..nf) (fractions of the
 * trace's distinct blocks, ascending), other settings from @base, and plots
 * the hit ratios beside the ideal and Belady's (one pod at each capacity).
 * 0, or -1 with @err.
 */
int kvt_replay_plot_capacity(const char *dir, const kvt_trace_t *t, const kvt_sim_config_t *base,
                             const kvt_sim_policy_t *pol, size_t npol, const double *fracs,
                             size_t nf, char *err, size_t errlen);

/*
 * pod-load: one bar group per pod, one bar per policy: @load[k][p] is policy
 * @labels[k]'s load on pod p (@what names it on the y axis). 0, or -1 with @err.
 */
int kvt_replay_plot_load(const char *dir, const char *const *labels, const double *const *load,
                         size_t npol, uint32_t pods, const char *what, char *err, size_t errlen);

/*
 * ttft-cdf: per policy @labels[k], the CDF of @ttft_ms[k][0..n[k]) (any
 * order; not modified). 0, or -1 with @err.
 */
int kvt_replay_plot_ttft(const char *dir, const char *const *labels, const double *const *ttft_ms,
                         const size_t *n, size_t npol, char *err, size_t errlen);

#endif
