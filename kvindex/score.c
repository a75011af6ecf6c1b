/*
 * kvindex/score.c: ranking pods from a query's matches and a load signal.
 */
#include "kvindex/score.h"

#include "kvindex/index_int.h"

void kvt_score_weights_default(kvt_score_weights_t *w)
{
    w->gpu = 1.0;
    w->cpu = 0.8;
    w->disk = 0.5;
    w->load = 1.0;
}

/* Tie-break rank: a per-request permutation of pod ids. */
static inline uint64_t tie_rank(uint64_t seed, uint32_t pod)
{
    return kvt_mix64(seed ^ ((uint64_t)pod * 0x9e3779b97f4a7c15ull));
}

/* True when @a ranks before @b. */
static bool better(const kvt_scored_t *a, const kvt_scored_t *b, uint64_t seed)
{
    if (a->score != b->score)
        return a->score > b->score;
    uint64_t ra = tie_rank(seed, a->pod), rb = tie_rank(seed, b->pod);
    if (ra != rb)
        return ra < rb;
    return a->pod < b->pod;
}

/* Scored entry of @pod; @m is its match or NULL. */
static kvt_scored_t make(const kvt_score_weights_t *w, uint32_t pod, const kvt_idx_match_t *m,
                         const double *load, size_t nload)
{
    kvt_scored_t s = {pod, 0, 0, 0, 0, 0.0};
    if (m != NULL) {
        s.matched = m->matched;
        s.gpu = m->gpu;
        s.cpu = m->cpu;
        s.disk = m->disk;
    }
    double l = (load != NULL && pod < nload) ? load[pod] : 0.0;
    s.score = w->gpu * s.gpu + w->cpu * s.cpu + w->disk * s.disk - w->load * l;
    return s;
}

static bool sorted_unique(const uint32_t *c, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (c[i - 1] >= c[i])
            return false;
    return true;
}

/* Position of @pod in candidate list @c (binary search when sorted), or SIZE_MAX. */
static size_t cand_pos(const uint32_t *c, size_t n, bool sorted, uint32_t pod)
{
    if (!sorted) {
        for (size_t i = 0; i < n; i++)
            if (c[i] == pod)
                return i;
        return SIZE_MAX;
    }
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c[mid] == pod)
            return mid;
        if (c[mid] < pod)
            lo = mid + 1;
        else
            hi = mid;
    }
    return SIZE_MAX;
}

/* One scored entry per candidate (or per match when @cands is NULL). */
static size_t fill(const kvt_score_weights_t *w, const kvt_idx_match_t *matches,
                   size_t nmatches, const uint32_t *cands, size_t ncands, const double *load,
                   size_t nload, kvt_scored_t *out)
{
    if (cands == NULL) {
        for (size_t i = 0; i < nmatches; i++)
            out[i] = make(w, matches[i].pod, &matches[i], load, nload);
        return nmatches;
    }
    for (size_t i = 0; i < ncands; i++)
        out[i] = make(w, cands[i], NULL, load, nload);
    bool sorted = sorted_unique(cands, ncands);
    for (size_t i = 0; i < nmatches; i++) {
        size_t pos = cand_pos(cands, ncands, sorted, matches[i].pod);
        if (pos != SIZE_MAX)
            out[pos] = make(w, matches[i].pod, &matches[i], load, nload);
    }
    return ncands;
}

static void sift_down(kvt_scored_t *a, size_t root, size_t n, uint64_t seed)
{
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n)
            return;
        /* max-heap on "worse": the worst entry rises, so the array ends best first */
        if (child + 1 < n && better(&a[child], &a[child + 1], seed))
            child++;
        if (!better(&a[root], &a[child], seed))
            return;
        kvt_scored_t t = a[root];
        a[root] = a[child];
        a[child] = t;
        root = child;
    }
}

size_t kvt_score_rank(const kvt_score_weights_t *w, const kvt_idx_match_t *matches,
                      size_t nmatches, const uint32_t *cands, size_t ncands, const double *load,
                      size_t nload, uint64_t tie_seed, kvt_scored_t *out)
{
    size_t n = fill(w, matches, nmatches, cands, ncands, load, nload, out);
    /* heapsort: O(n log n), no allocation, carries the tie seed */
    for (size_t i = n / 2; i-- > 0;)
        sift_down(out, i, n, tie_seed);
    for (size_t end = n; end > 1; end--) {
        kvt_scored_t t = out[0];
        out[0] = out[end - 1];
        out[end - 1] = t;
        sift_down(out, 0, end - 1, tie_seed);
    }
    return n;
}

uint32_t kvt_score_pick(const kvt_score_weights_t *w, const kvt_idx_match_t *matches,
                        size_t nmatches, const uint32_t *cands, size_t ncands, const double *load,
                        size_t nload, uint64_t tie_seed, kvt_scored_t *best_p)
{
    kvt_scored_t best = {UINT32_MAX, 0, 0, 0, 0, 0.0};
    bool have = false;
    bool sorted = cands != NULL && sorted_unique(cands, ncands);
    /* matched pods among the candidates */
    for (size_t i = 0; i < nmatches; i++) {
        if (cands != NULL && cand_pos(cands, ncands, sorted, matches[i].pod) == SIZE_MAX)
            continue;
        kvt_scored_t s = make(w, matches[i].pod, &matches[i], load, nload);
        if (!have || better(&s, &best, tie_seed)) {
            best = s;
            have = true;
        }
    }
    /*
     * Candidates scored as if they matched nothing. A matched candidate's
     * cache terms are >= 0, so its zero-match score never beats its real one:
     * only truly unmatched pods can win here, and no join is needed.
     */
    for (size_t i = 0; cands != NULL && i < ncands; i++) {
        kvt_scored_t s = make(w, cands[i], NULL, load, nload);
        if (!have || better(&s, &best, tie_seed)) {
            const kvt_idx_match_t *m = NULL;
            for (size_t j = 0; j < nmatches && m == NULL; j++)
                if (matches[j].pod == cands[i])
                    m = &matches[j];
            if (m != NULL)
                continue; /* it is matched: its real entry was considered above */
            best = s;
            have = true;
        }
    }
    if (have && best_p != NULL)
        *best_p = best;
    return have ? best.pod : UINT32_MAX;
}
