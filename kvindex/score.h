/*
 * kvindex/score: turns per-pod prefix matches into a routing decision.
 *
 *   score(p) = w_gpu*gpu(p) + w_cpu*cpu(p) + w_disk*disk(p) - w_load*load(p)
 *
 * Cache terms are in blocks; load is whatever the router feeds per pod
 * (active requests, or queued prefill tokens divided by the block size) and
 * w_load converts it to blocks. Higher is better. Equal scores are broken by
 * a hash of (tie_seed, pod) so that equal candidates spread over pods from
 * one request to the next, yet the same request always gets the same order.
 */
#ifndef KVT_KVINDEX_SCORE_H
#define KVT_KVINDEX_SCORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvindex/index.h"

typedef struct kvt_score_weights {
    double gpu;  /* per block whose fastest tier is GPU; default 1.0 */
    double cpu;  /* default 0.8 */
    double disk; /* default 0.5 */
    double load; /* per unit of load; default 1.0 */
} kvt_score_weights_t;

typedef struct kvt_scored {
    uint32_t pod;
    uint32_t matched, gpu, cpu, disk; /* as in kvt_idx_match_t; 0 if no match */
    double score;
    uint64_t tie; /* tie-break rank from (tie_seed, pod): lower ranks first */
} kvt_scored_t;

/* Fills @w with the defaults above. */
void kvt_score_weights_default(kvt_score_weights_t *w);

/*
 * Scores and sorts candidates best first.
 * @matches/@nmatches: a query's answer (pods absent from it matched nothing).
 * @cands/@ncands: the pods to rank; NULL ranks exactly the pods in @matches.
 * @load: per-pod load indexed by pod id, @nload entries (NULL: no load term;
 *        pods >= @nload have load 0).
 * @out: room for max(@ncands, @nmatches) results. Returns how many were written.
 * Never allocates; O(k log k) for k candidates.
 */
size_t kvt_score_rank(const kvt_score_weights_t *w, const kvt_idx_match_t *matches, size_t nmatches,
                      const uint32_t *cands, size_t ncands, const double *load, size_t nload,
                      uint64_t tie_seed, kvt_scored_t *out);

/*
 * Same decision as kvt_score_rank()'s first result, without sorting: O(k).
 * Returns the best pod id, or UINT32_MAX when there is no candidate.
 * @best_p (may be NULL) receives the winner's details.
 */
uint32_t kvt_score_pick(const kvt_score_weights_t *w, const kvt_idx_match_t *matches,
                        size_t nmatches, const uint32_t *cands, size_t ncands, const double *load,
                        size_t nload, uint64_t tie_seed, kvt_scored_t *best_p);

#endif
