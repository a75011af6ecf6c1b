/*
 * bench/sim: the cache model on hand-worked tiny traces, the policies' routing,
 * every policy alike with one pod, and the index agreeing with the model.
 * (tests/integration/test_sim_model.py checks the model against an
 * independent Python one on a generated trace.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/sim.h"
#include "bench/trace.h"
#include "tests/support/sim_trace.h"

static void run(const kvt_trace_t *t, uint32_t pods, uint64_t cap, kvt_sim_policy_t pol,
                const uint64_t *sessions, kvt_sim_result_t *r)
{
    kvt_sim_config_t cfg = {.pods = pods,
                            .capacity_blocks = cap,
                            .policy = pol,
                            .seed = 7,
                            .load_weight = -1,
                            .sessions = sessions};
    char why[128] = "";
    assert_int_equal(kvt_sim_run(t, &cfg, r, why, sizeof(why)), KVT_OK);
    assert_int_equal(r->index_mismatch, 0);
}

static void expect_hits(const kvt_sim_result_t *r, const uint32_t *hits, size_t n)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r->req_hit[i], hits[i]);
        sum += hits[i];
    }
    assert_int_equal(r->hit_blocks, sum);
}

/*
 * One pod, capacity 4 (MRU first after each request):
 *   req  ids       hit                    cache after
 *   0    1 2 3     0                      1 2 3
 *   1    1 2 4     2 (1 2)                1 2 4 3
 *   2    1 2 3 5   3 (1 2 3)              1 2 3 5 [4 evicted]
 *   3    6 7       0                      6 7 1 2 [3 5 evicted]
 *   4    1 2 3     2 (1 2; 3 is gone)     1 2 3 6 [7 evicted]
 *   5    7 8       0 (7 is gone)          7 8 1 2 [3 6 evicted]
 * 17 blocks, 7 hit.
 */
static void test_lru_one_pod(void **state)
{
    (void)state;
    static const int r0[] = {1, 2, 3, -1}, r1[] = {1, 2, 4, -1}, r2[] = {1, 2, 3, 5, -1},
                     r3[] = {6, 7, -1}, r4[] = {1, 2, 3, -1}, r5[] = {7, 8, -1};
    const int *reqs[] = {r0, r1, r2, r3, r4, r5};
    static const uint32_t hits[] = {0, 2, 3, 0, 2, 0};
    kvt_trace_t *t = test_sim_trace(reqs, 6);
    kvt_sim_result_t r;
    run(t, 1, 4, KVT_SIM_ROUND_ROBIN, NULL, &r);
    expect_hits(&r, hits, 6);
    assert_int_equal(r.total_blocks, 17);
    assert_int_equal(r.evicted, 1 + 2 + 1 + 2);
    kvt_sim_result_cleanup(&r);
    kvt_trace_free(t);
}

/*
 * Tail first: one pod, capacity 2.
 *   req  ids     hit   cache after (MRU first)
 *   0    1 2     0     1 2            (touched 2 then 1: block 0 most recent)
 *   1    3       0     3 1            [2 evicted; head first would have evicted 1]
 *   2    1 2     1     1 2            [3 evicted]
 *   3    4 5 6   0     4 5            [6, its own tail, and 1 2 evicted: larger than the cache]
 *   4    4 5 6   2     4 5            [6 evicted again]
 * 11 blocks, 3 hit.
 */
static void test_tail_first(void **state)
{
    (void)state;
    static const int r0[] = {1, 2, -1}, r1[] = {3, -1}, r2[] = {1, 2, -1}, r3[] = {4, 5, 6, -1};
    const int *reqs[] = {r0, r1, r2, r3, r3};
    static const uint32_t hits[] = {0, 0, 1, 0, 2};
    kvt_trace_t *t = test_sim_trace(reqs, 5);
    kvt_sim_result_t r;
    run(t, 1, 2, KVT_SIM_ROUND_ROBIN, NULL, &r);
    expect_hits(&r, hits, 5);
    assert_int_equal(r.total_blocks, 11);
    assert_int_equal(r.evicted, 1 + 1 + 3 + 1);
    kvt_sim_result_cleanup(&r);
    kvt_trace_free(t);
}

/* Requests [1 2] [1 3] [1 2] [1 3] on two pods with unbounded caches. */
static kvt_trace_t *two_prefixes(void)
{
    static const int a[] = {1, 2, -1}, b[] = {1, 3, -1};
    const int *reqs[] = {a, b, a, b};
    return test_sim_trace(reqs, 4);
}

/*
 * round-robin: pods 0 1 0 1; hits 0 0 2 2 (each pod sees its request again).
 * session without ids: round-robin.
 * session with ids 5 5 6 5: 5 -> pod 0, 6 -> pod 1; pods 0 0 1 0;
 *   hits 0, 1 ([1] on pod 0), 0 (pod 1 empty), 2 ([1 3] on pod 0).
 * least-loaded (blocks prefilled, ties to the lowest pod): r0 pod 0 (0 0) hit 0, pod 0 has 2;
 *   r1 pod 1 (2 0) hit 0, 2 2; r2 pod 0 (tie) hit 2, 2 2; r3 pod 0 (tie) hit 1 ([1]), 3 2.
 * prefix: r0 matches nowhere (a pod by the tie-break hash), then every request matches
 *   block 1 or more there: all on one pod, hits 0 1 2 2; prefilled 3 and 0: imbalance 2.0.
 */
static void test_policies_two_pods(void **state)
{
    (void)state;
    kvt_trace_t *t = two_prefixes();
    kvt_sim_result_t r;

    static const uint32_t rr_pods[] = {0, 1, 0, 1}, rr_hits[] = {0, 0, 2, 2};
    run(t, 2, 0, KVT_SIM_ROUND_ROBIN, NULL, &r);
    expect_hits(&r, rr_hits, 4);
    assert_memory_equal(r.req_pod, rr_pods, sizeof(rr_pods));
    kvt_sim_result_cleanup(&r);
    run(t, 2, 0, KVT_SIM_SESSION, NULL, &r);
    expect_hits(&r, rr_hits, 4);
    assert_memory_equal(r.req_pod, rr_pods, sizeof(rr_pods));
    kvt_sim_result_cleanup(&r);

    static const uint64_t sess[] = {5, 5, 6, 5};
    static const uint32_t s_pods[] = {0, 0, 1, 0}, s_hits[] = {0, 1, 0, 2};
    run(t, 2, 0, KVT_SIM_SESSION, sess, &r);
    expect_hits(&r, s_hits, 4);
    assert_memory_equal(r.req_pod, s_pods, sizeof(s_pods));
    kvt_sim_result_cleanup(&r);

    static const uint32_t ll_pods[] = {0, 1, 0, 0}, ll_hits[] = {0, 0, 2, 1};
    run(t, 2, 0, KVT_SIM_LEAST_LOADED, NULL, &r);
    expect_hits(&r, ll_hits, 4);
    assert_memory_equal(r.req_pod, ll_pods, sizeof(ll_pods));
    assert_int_equal(r.prefilled[0], 3);
    assert_int_equal(r.prefilled[1], 2);
    kvt_sim_result_cleanup(&r);

    static const uint32_t p_hits[] = {0, 1, 2, 2};
    run(t, 2, 0, KVT_SIM_PREFIX, NULL, &r);
    expect_hits(&r, p_hits, 4);
    for (int i = 1; i < 4; i++)
        assert_int_equal(r.req_pod[i], r.req_pod[0]);
    assert_true(r.load_imbalance == 2.0);
    kvt_sim_result_cleanup(&r);
    kvt_trace_free(t);
}

/*
 * cost, the load in blocks. Six requests [1 2] on two pods, w_load 0.1: r0 goes to a pod A by
 * the tie-break and prefills 2; then A scores 2 - 0.1 * 2 = 1.8 against B's 0: all stay on A,
 * hits 0 + 5 * 2 = 10.
 * Four distinct chains of 2 blocks, w_load 1 (load = prefilled minus the least loaded pod's):
 * r0 to A (tie), r1 to B (A scores -2), r2 and r3 on a tie again, one each: 4 and 4.
 * The load in percent of the mean (the default), w_load 1, six requests [1 2]: r0 to A; r1: A's
 * load is 100 * 2 / 1 (mean 1), A scores 2 - 200: B, hit 0; then both hold [1 2] with equal
 * loads: hits 2 each, 8 in all, 2 and 2 prefilled.
 */
static void test_cost(void **state)
{
    (void)state;
    static const int a[] = {1, 2, -1};
    const int *reqs[] = {a, a, a, a, a, a};
    kvt_trace_t *t = test_sim_trace(reqs, 6);
    kvt_sim_config_t cfg = {.pods = 2,
                            .capacity_blocks = 0,
                            .policy = KVT_SIM_COST,
                            .seed = 3,
                            .load_weight = 0.1,
                            .load_blocks = true};
    kvt_sim_result_t r;
    assert_int_equal(kvt_sim_run(t, &cfg, &r, NULL, 0), KVT_OK);
    assert_int_equal(r.hit_blocks, 10);
    for (int i = 1; i < 6; i++)
        assert_int_equal(r.req_pod[i], r.req_pod[0]);
    kvt_sim_result_cleanup(&r);
    kvt_trace_free(t);

    /* distinct chains, no sharing: the load term alternates the pods exactly */
    static const int c0[] = {10, 11, -1}, c1[] = {20, 21, -1}, c2[] = {30, 31, -1},
                     c3[] = {40, 41, -1};
    const int *dreqs[] = {c0, c1, c2, c3};
    t = test_sim_trace(dreqs, 4);
    cfg.load_weight = 1.0;
    assert_int_equal(kvt_sim_run(t, &cfg, &r, NULL, 0), KVT_OK);
    assert_int_equal(r.prefilled[0], 4);
    assert_int_equal(r.prefilled[1], 4);
    assert_true(r.load_imbalance == 1.0);
    kvt_sim_result_cleanup(&r);
    kvt_trace_free(t);

    t = test_sim_trace(reqs, 6);
    cfg.load_blocks = false;
    assert_int_equal(kvt_sim_run(t, &cfg, &r, NULL, 0), KVT_OK);
    assert_int_equal(r.hit_blocks, 8);
    assert_int_not_equal(r.req_pod[1], r.req_pod[0]);
    assert_int_equal(r.prefilled[0], 2);
    assert_int_equal(r.prefilled[1], 2);
    kvt_sim_result_cleanup(&r);
    kvt_trace_free(t);
}

/* A generated trace: sessions whose prompts grow turn by turn, on a few shared system prompts. */
static kvt_trace_t *gen_trace(uint64_t seed, size_t nreq)
{
    enum { SESS = 12, SYS = 3 };
    int ctx[SESS][64];
    int len[SESS];
    int next = 1000;
    int **reqs = calloc(nreq, sizeof(*reqs));
    assert_non_null(reqs);
    uint64_t x = seed;
    for (int s = 0; s < SESS; s++) {
        len[s] = 2;
        ctx[s][0] = 1 + (s % SYS);
        ctx[s][1] = next++;
    }
    for (size_t i = 0; i < nreq; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int s = (int)(x % SESS);
        if (len[s] > 40) { /* a new conversation on the same system prompt */
            len[s] = 1;
        }
        int add = 1 + (int)((x >> 20) % 4);
        for (int k = 0; k < add; k++)
            ctx[s][len[s]++] = next++;
        reqs[i] = malloc((size_t)(len[s] + 1) * sizeof(int));
        assert_non_null(reqs[i]);
        memcpy(reqs[i], ctx[s], (size_t)len[s] * sizeof(int));
        reqs[i][len[s]] = -1;
    }
    kvt_trace_t *t = test_sim_trace((const int *const *)reqs, nreq);
    for (size_t i = 0; i < nreq; i++)
        free(reqs[i]);
    free(reqs);
    return t;
}

/* With one pod every policy routes alike: the same hits, request by request. */
static void test_one_pod_all_alike(void **state)
{
    (void)state;
    kvt_trace_t *t = gen_trace(0x1234567, 300);
    kvt_sim_result_t ref;
    run(t, 1, 50, KVT_SIM_ROUND_ROBIN, NULL, &ref);
    assert_true(ref.hit_blocks > 0 && ref.evicted > 0);
    for (unsigned p = 0; p < KVT_SIM_NPOLICIES; p++) {
        kvt_sim_result_t r;
        run(t, 1, 50, (kvt_sim_policy_t)p, NULL, &r);
        assert_int_equal(r.hit_blocks, ref.hit_blocks);
        assert_memory_equal(r.req_hit, ref.req_hit, t->nreqs * sizeof(uint32_t));
        kvt_sim_result_cleanup(&r);
    }
    /* unbounded, one pod: the ideal */
    uint64_t ih = 0, it = 0;
    assert_int_equal(kvt_sim_ideal(t, &ih, &it), KVT_OK);
    kvt_sim_result_cleanup(&ref);
    run(t, 1, 0, KVT_SIM_RANDOM, NULL, &ref);
    assert_int_equal(ref.hit_blocks, ih);
    assert_int_equal(ref.total_blocks, it);
    kvt_sim_result_cleanup(&ref);
    kvt_trace_free(t);
}

/* Many pods, small caches, every policy: the index agrees with the model (run() checks),
 * and no policy beats the ideal. */
static void test_index_agrees(void **state)
{
    (void)state;
    kvt_trace_t *t = gen_trace(0xfeedbeef, 500);
    uint64_t ih = 0, it = 0;
    assert_int_equal(kvt_sim_ideal(t, &ih, &it), KVT_OK);
    for (unsigned p = 0; p < KVT_SIM_NPOLICIES; p++) {
        kvt_sim_result_t r;
        run(t, 5, 30, (kvt_sim_policy_t)p, NULL, &r);
        assert_true(r.hit_blocks <= ih);
        assert_int_equal(r.total_blocks, it);
        kvt_sim_result_cleanup(&r);
    }
    kvt_trace_free(t);
}

/* The bench's fixture: 11 of 24 blocks (tests/integration/test_bench_smoke.sh works it out). */
static void test_ideal_mini(void **state)
{
    (void)state;
    const char *src = getenv("KVT_SOURCE_DIR");
    if (src == NULL)
        skip();
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/fixtures/mini_trace.jsonl", src);
    kvt_trace_t *t = NULL;
    assert_int_equal(kvt_trace_load(path, &t, NULL, 0), KVT_OK);
    uint64_t ih = 0, it = 0;
    assert_int_equal(kvt_sim_ideal(t, &ih, &it), KVT_OK);
    assert_int_equal(ih, 11);
    assert_int_equal(it, 24);
    kvt_trace_free(t);
}

static void test_bad_args(void **state)
{
    (void)state;
    kvt_trace_t *t = two_prefixes();
    kvt_sim_config_t cfg = {.pods = 0, .policy = KVT_SIM_RANDOM};
    kvt_sim_result_t r;
    char why[64] = "";
    assert_int_equal(kvt_sim_run(t, &cfg, &r, why, sizeof(why)), KVT_ERR_INVAL);
    assert_null(r.req_pod);
    cfg.pods = 2;
    cfg.policy = KVT_SIM_NPOLICIES;
    assert_int_equal(kvt_sim_run(t, &cfg, &r, why, sizeof(why)), KVT_ERR_INVAL);
    kvt_sim_policy_t p;
    assert_int_equal(kvt_sim_policy_parse("cost", &p), KVT_OK);
    assert_int_equal(p, KVT_SIM_COST);
    assert_int_equal(kvt_sim_policy_parse("costly", &p), KVT_ERR_NOT_FOUND);
    kvt_trace_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_one_pod),       cmocka_unit_test(test_tail_first),
        cmocka_unit_test(test_policies_two_pods), cmocka_unit_test(test_cost),
        cmocka_unit_test(test_one_pod_all_alike), cmocka_unit_test(test_index_agrees),
        cmocka_unit_test(test_ideal_mini),        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
