/*
 * kvindex/score.c: ranking pods from a query's matches and a load signal.
 */
#include "kvindex/score.h"

#include <string.h>

#include "common/heap.h"
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

/* True when @a ranks before @b (tie ranks were computed once, by make()). */
static inline bool better(const kvt_scored_t *a, const kvt_scored_t *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    if (a->tie != b->tie)
        return a->tie < b->tie;
    return a->pod < b->pod;
}

/* Scored entry of @pod; @m is its match or NULL. */
static kvt_scored_t make(const kvt_score_weights_t *w, uint32_t pod, const kvt_idx_match_t *m,
                         const double *load, size_t nload, uint64_t seed)
{
    kvt_scored_t s = {pod, 0, 0, 0, 0, 0.0, tie_rank(seed, pod)};
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
static size_t fill(const kvt_score_weights_t *w, const kvt_idx_match_t *matches, size_t nmatches,
                   const uint32_t *cands, size_t ncands, const double *load, size_t nload,
                   uint64_t seed, kvt_scored_t *out)
{
    if (cands == NULL) {
        for (size_t i = 0; i < nmatches; i++)
            out[i] = make(w, matches[i].pod, &matches[i], load, nload, seed);
        return nmatches;
    }
    for (size_t i = 0; i < ncands; i++)
        out[i] = make(w, cands[i], NULL, load, nload, seed);
    bool sorted = sorted_unique(cands, ncands);
    for (size_t i = 0; i < nmatches; i++) {
        size_t pos = cand_pos(cands, ncands, sorted, matches[i].pod);
        if (pos != SIZE_MAX)
            out[pos] = make(w, matches[i].pod, &matches[i], load, nload, seed);
    }
    return ncands;
}

/* The heap sort's order: the worst entry on top, so the sorted array ends best first. */
static inline bool worse(const kvt_scored_t *a, const kvt_scored_t *b)
{
    return better(b, a);
}

KVT_HEAP_DEFINE(score_heap, kvt_scored_t, worse)

/*
 * The usual answer has many entries and few distinct scores, so comparison
 * sorts mostly compare random tie ranks and mispredict about every other
 * branch. Instead, with at most 16 distinct scores and 1024 entries, each
 * entry gets a 64-bit key: the rank of its score (best first) in the top
 * bits, its tie rank below, so keys order entries as better() does (equal
 * keys, which take equal high tie bits, fall back to better()). Each score
 * class gets its own run of buckets, at least two per entry of the class,
 * indexed by the top bits of the tie rank (one shared range would crowd a
 * big class into few buckets). One counting pass, an insertion pass that
 * settles entries sharing a bucket (few), and one pass that moves each entry
 * to its place (a gather from a copy up to SORT_GATHER entries, else one walk
 * of each permutation cycle). Returns false (nothing moved) for other shapes.
 */
enum { SORT_SMALL = 1024, SORT_CLASSES = 16, SORT_GATHER = 256 };

static bool bucket_sort(kvt_scored_t *out, size_t n)
{
    if (n > SORT_SMALL)
        return false;
    double ds[SORT_CLASSES];
    uint32_t ccount[SORT_CLASSES];
    uint8_t cls[SORT_SMALL];
    size_t nd = 0, last = 0;
    for (size_t i = 0; i < n; i++) {
        if (nd == 0 || ds[last] != out[i].score) {
            size_t d = 0;
            while (d < nd && ds[d] != out[i].score)
                d++;
            if (d == nd) {
                if (nd == SORT_CLASSES)
                    return false;
                ccount[nd] = 0;
                ds[nd++] = out[i].score;
            }
            last = d;
        }
        ccount[last]++;
        cls[i] = (uint8_t)last;
    }
    uint64_t rank[SORT_CLASSES]; /* classes with a higher score: 0 for the best */
    uint8_t byrank[SORT_CLASSES];
    for (size_t d = 0; d < nd; d++) {
        rank[d] = 0;
        for (size_t e = 0; e < nd; e++)
            rank[d] += ds[e] > ds[d];
        byrank[rank[d]] = (uint8_t)d;
    }
    /* each class's buckets: 2^cbits >= 2 x its entries, placed in score order */
    unsigned cshift[SORT_CLASSES];
    uint32_t cstart[SORT_CLASSES];
    uint32_t nbuckets = 0;
    for (size_t r = 0; r < nd; r++) {
        size_t d = byrank[r];
        unsigned cbits = 1;
        while (((uint32_t)1 << cbits) < 2 * ccount[d])
            cbits++;
        cshift[d] = 64 - cbits;
        cstart[d] = nbuckets;
        nbuckets += (uint32_t)1 << cbits;
    }
    const unsigned rb = nd > 1 ? 32u - (unsigned)__builtin_clz((unsigned)nd - 1u) : 0u;
#define SORT_KEY(i) (rb ? rank[cls[i]] << (64 - rb) | out[i].tie >> rb : out[i].tie)
#define SORT_BUCKET(i) (cstart[cls[i]] + (uint32_t)(out[i].tie >> cshift[cls[i]]))
    uint64_t sk[SORT_SMALL];  /* keys in sorted order */
    uint16_t pos[SORT_SMALL]; /* pos[k]: the entry whose key is sk[k] */
    uint16_t bk[SORT_SMALL];  /* bucket of entry i */
    uint16_t cnt[4 * SORT_SMALL + SORT_CLASSES + 1];
    memset(cnt, 0, ((size_t)nbuckets + 1) * sizeof(cnt[0]));
    for (size_t i = 0; i < n; i++) {
        bk[i] = (uint16_t)SORT_BUCKET(i);
        cnt[bk[i] + 1]++;
    }
    for (size_t b = 1; b <= nbuckets; b++)
        cnt[b] = (uint16_t)(cnt[b] + cnt[b - 1]);
    for (size_t i = 0; i < n; i++) {
        uint16_t k = cnt[bk[i]]++;
        sk[k] = SORT_KEY(i);
        pos[k] = (uint16_t)i;
    }
#undef SORT_KEY
#undef SORT_BUCKET
    for (size_t i = 1; i < n; i++) {
        /* buckets are in key order already: only neighbours in one bucket move */
        if (sk[i - 1] < sk[i])
            continue;
        uint64_t kk = sk[i];
        uint16_t p = pos[i];
        size_t j = i;
        while (j > 0 &&
               (sk[j - 1] > kk || (sk[j - 1] == kk && better(&out[p], &out[pos[j - 1]])))) {
            sk[j] = sk[j - 1];
            pos[j] = pos[j - 1];
            j--;
        }
        sk[j] = kk;
        pos[j] = p;
    }
    /* pos[k]: the entry that belongs at k */
    if (n <= SORT_GATHER) {
        /* a copy, then one gather: no data-dependent branch (cycles mispredict) */
        kvt_scored_t tmp[SORT_GATHER];
        memcpy(tmp, out, n * sizeof(*out));
        for (size_t k = 0; k < n; k++)
            out[k] = tmp[pos[k]];
        return true;
    }
    /* follow each cycle once */
    for (size_t start = 0; start < n; start++) {
        if (pos[start] == UINT16_MAX || pos[start] == start)
            continue;
        kvt_scored_t t = out[start];
        size_t k = start;
        while (pos[k] != start) {
            size_t from = pos[k];
            out[k] = out[from];
            pos[k] = UINT16_MAX;
            k = from;
        }
        out[k] = t;
        pos[k] = UINT16_MAX;
    }
    return true;
}

size_t kvt_score_rank(const kvt_score_weights_t *w, const kvt_idx_match_t *matches, size_t nmatches,
                      const uint32_t *cands, size_t ncands, const double *load, size_t nload,
                      uint64_t tie_seed, kvt_scored_t *out)
{
    size_t n = fill(w, matches, nmatches, cands, ncands, load, nload, tie_seed, out);
    /* no allocation; O(n) for the usual shape, else O(n log n) */
    if (!bucket_sort(out, n))
        score_heap_sort(out, n);
    return n;
}

uint32_t kvt_score_pick(const kvt_score_weights_t *w, const kvt_idx_match_t *matches,
                        size_t nmatches, const uint32_t *cands, size_t ncands, const double *load,
                        size_t nload, uint64_t tie_seed, kvt_scored_t *best_p)
{
    kvt_scored_t best = {UINT32_MAX, 0, 0, 0, 0, 0.0, 0};
    bool have = false;
    bool sorted = cands != NULL && sorted_unique(cands, ncands);
    /* matched pods among the candidates */
    for (size_t i = 0; i < nmatches; i++) {
        if (cands != NULL && cand_pos(cands, ncands, sorted, matches[i].pod) == SIZE_MAX)
            continue;
        kvt_scored_t s = make(w, matches[i].pod, &matches[i], load, nload, tie_seed);
        if (!have || better(&s, &best)) {
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
        double l = (load != NULL && cands[i] < nload) ? load[cands[i]] : 0.0;
        if (have && -w->load * l < best.score)
            continue; /* cannot win: spare the tie hash (routers pass many candidates) */
        kvt_scored_t s = make(w, cands[i], NULL, load, nload, tie_seed);
        if (!have || better(&s, &best)) {
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
