/* kvindex/score: weights, load term, candidates, deterministic spreading tie-break. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvindex/score.h"
#include "tests/support/rng.h"

static void test_defaults(void **state)
{
    (void)state;
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    assert_true(w.gpu == 1.0 && w.cpu == 0.8 && w.disk == 0.5 && w.load == 1.0);
}

static void test_tier_weights_rank(void **state)
{
    (void)state;
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    /* 10 blocks on CPU (8.0) beat 7 on GPU (7.0); 16 on disk (8.0) tie with CPU */
    kvt_idx_match_t m[3] = {{1, 7, 7, 0, 0}, {2, 10, 0, 10, 0}, {3, 16, 0, 0, 16}};
    kvt_scored_t out[3];
    assert_int_equal(kvt_score_rank(&w, m, 3, NULL, 0, NULL, 0, 1, out), 3);
    assert_int_equal(out[2].pod, 1);
    assert_true(out[0].score == 8.0 && out[1].score == 8.0);
    assert_true(out[0].score >= out[1].score && out[1].score >= out[2].score);
    assert_int_equal(out[0].matched + out[1].matched, 26);
}

static void test_load_term_and_candidates(void **state)
{
    (void)state;
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    kvt_idx_match_t m[2] = {{4, 5, 5, 0, 0}, {7, 3, 3, 0, 0}};
    double load[10] = {0};
    load[4] = 4.0; /* pod 4: 5 - 4 = 1; pod 7: 3; pods 0,2: 0 */
    uint32_t cands[4] = {0, 2, 4, 7};
    kvt_scored_t out[4], best;
    assert_int_equal(kvt_score_rank(&w, m, 2, cands, 4, load, 10, 9, out), 4);
    assert_int_equal(out[0].pod, 7);
    assert_int_equal(out[1].pod, 4);
    assert_true(out[2].score == 0.0 && out[3].score == 0.0);
    assert_int_equal(kvt_score_pick(&w, m, 2, cands, 4, load, 10, 9, &best), 7);
    assert_int_equal(best.matched, 3);
    /* heavy load everywhere but an unmatched pod: it wins */
    load[4] = 10.0;
    load[7] = 10.0;
    uint32_t winner = kvt_score_pick(&w, m, 2, cands, 4, load, 10, 9, &best);
    assert_int_equal(winner, best.pod);
    assert_true(best.pod == 0 || best.pod == 2);
    assert_int_equal(best.matched, 0);
    /* matched pods outside the candidate list are ignored; unsorted candidates work */
    uint32_t only[2] = {2, 0};
    uint32_t p = kvt_score_pick(&w, m, 2, only, 2, NULL, 0, 3, &best);
    assert_true(p == 0 || p == 2);
    assert_int_equal(kvt_score_rank(&w, m, 2, only, 2, NULL, 0, 3, out), 2);
    assert_int_equal(out[0].matched + out[1].matched, 0);
    /* nothing to pick from */
    assert_int_equal(kvt_score_pick(&w, NULL, 0, NULL, 0, NULL, 0, 1, NULL), UINT32_MAX);
}

/* Equal candidates: same seed -> same winner; different seeds spread the winners. */
static void test_ties_spread_deterministically(void **state)
{
    (void)state;
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    enum { N = 16, TRIES = 1600 };
    uint32_t cands[N];
    for (uint32_t i = 0; i < N; i++)
        cands[i] = i;
    int wins[N] = {0};
    for (uint64_t seed = 0; seed < TRIES; seed++) {
        uint32_t a = kvt_score_pick(&w, NULL, 0, cands, N, NULL, 0, seed, NULL);
        uint32_t b = kvt_score_pick(&w, NULL, 0, cands, N, NULL, 0, seed, NULL);
        assert_int_equal(a, b);
        kvt_scored_t out[N];
        kvt_score_rank(&w, NULL, 0, cands, N, NULL, 0, seed, out);
        assert_int_equal(out[0].pod, a); /* rank and pick agree */
        wins[a]++;
    }
    for (int i = 0; i < N; i++) {
        /* expected 100 each; a fair spread stays well inside [50, 150] */
        assert_true(wins[i] > 50);
        assert_true(wins[i] < 150);
    }
}

/* rank's order is a total order consistent with pick, for random inputs. */
static void test_rank_sorted_random(void **state)
{
    (void)state;
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    kvt_rng_t rng;
    kvt_rng_init(&rng, 99);
    for (int round = 0; round < 200; round++) {
        kvt_idx_match_t m[64];
        double load[128];
        size_t n = 0;
        for (uint32_t p = 0; p < 128; p++) {
            const uint64_t x = kvt_rng_next(&rng);
            load[p] = (double)((x >> 40) % 4);
            if ((x >> 20) % 2 && n < 64) {
                uint32_t g = (uint32_t)(x >> 50) % 5, c = (uint32_t)(x >> 54) % 5;
                m[n++] = (kvt_idx_match_t){p, g + c, g, c, 0};
            }
        }
        kvt_scored_t out[64], best;
        size_t k = kvt_score_rank(&w, m, n, NULL, 0, load, 128, (uint64_t)round, out);
        assert_int_equal(k, n);
        for (size_t i = 1; i < k; i++)
            assert_true(out[i - 1].score >= out[i].score);
        if (n > 0) {
            assert_int_equal(kvt_score_pick(&w, m, n, NULL, 0, load, 128, (uint64_t)round, &best),
                             out[0].pod);
        }
    }
}

static int ref_cmp(const void *pa, const void *pb)
{
    const kvt_scored_t *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->tie != b->tie)
        return a->tie < b->tie ? -1 : 1;
    return (a->pod > b->pod) - (a->pod < b->pod);
}

/* rank against a naive reference (qsort of the documented order), both sort paths. */
static void test_rank_matches_reference(void **state)
{
    (void)state;
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    enum { MAXN = 1500 };
    static kvt_idx_match_t m[MAXN];
    static kvt_scored_t out[MAXN], ref[MAXN];
    static double load[3 * MAXN + 1];
    kvt_rng_t rng;
    kvt_rng_init(&rng, 7);
    static const size_t sizes[] = {0, 1, 2, 3, 17, 64, 65, 255, 1024, 1025, 1500};
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        for (int round = 0; round < 20; round++) {
            size_t n = sizes[si];
            for (size_t i = 0; i < n; i++) {
                const uint64_t x = kvt_rng_next(&rng);
                /* few distinct scores: ties are the common case, as in real answers */
                uint32_t g = (uint32_t)(x >> 60) % 3, c = (uint32_t)(x >> 50) % 2;
                m[i] = (kvt_idx_match_t){(uint32_t)(i * 3 + 1), g + c, g, c, 0};
                /* odd rounds: many distinct scores, so the heap-sort fallback runs */
                load[i * 3 + 1] =
                    round % 2 ? (double)((x >> 20) % 1000) / 7.0 : (double)((x >> 40) % 2);
            }
            uint64_t seed = kvt_rng_next(&rng);
            size_t k = kvt_score_rank(&w, m, n, NULL, 0, load, 3 * MAXN + 1, seed, out);
            assert_int_equal(k, n);
            memcpy(ref, out, n * sizeof(*out));
            qsort(ref, n, sizeof(*ref), ref_cmp);
            assert_memory_equal(out, ref, n * sizeof(*out));
            /* every input pod appears once with its own counts */
            for (size_t i = 0; i < n; i++) {
                size_t at = (out[i].pod - 1) / 3;
                assert_true(at < n);
                assert_int_equal(out[i].matched, m[at].matched);
                assert_int_equal(out[i].gpu, m[at].gpu);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_tier_weights_rank),
        cmocka_unit_test(test_load_term_and_candidates),
        cmocka_unit_test(test_ties_spread_deterministically),
        cmocka_unit_test(test_rank_sorted_random),
        cmocka_unit_test(test_rank_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
