/*
 * bench/sim_timed: the timed model on hand-worked tiny traces (queueing and
 * batching times, pinning, demotion and promotion across tiers, the delayed
 * store, routed speculative entries and their TTL), determinism, and every
 * policy alike with one pod. Also sim_cache's pinned entries.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/sim_cache.h"
#include "bench/sim_timed.h"
#include "bench/trace.h"
#include "tests/support/rng.h"

static kvt_trace_t *parse(const char *text)
{
    kvt_trace_t *t = NULL;
    char err[128] = "";
    assert_int_equal(kvt_trace_parse(text, strlen(text), &t, err, sizeof(err)), KVT_OK);
    return t;
}

/* The tests' model: 2 tokens a block, 1 ms a computed token, 0.1 ms an output token. */
static void cfg_init(kvt_sim_timed_config_t *c, uint32_t pods, kvt_sim_policy_t pol)
{
    memset(c, 0, sizeof(*c));
    c->pods = pods;
    c->policy = pol;
    c->seed = 7;
    c->load_weight = -1;
    c->speedup = 1;
    c->model = (kvt_sim_model_t){.block_tokens = 2,
                                 .prefill_us_per_token = 1000,
                                 .cpu_us_per_token = 100,
                                 .disk_us_per_token = 400,
                                 .decode_us_per_token = 100,
                                 .batch_tokens = 4};
}

static void run(const kvt_trace_t *t, const kvt_sim_timed_config_t *c, kvt_sim_timed_result_t *r)
{
    char why[128] = "";
    assert_int_equal(kvt_sim_timed_run(t, c, r, why, sizeof(why)), KVT_OK);
    assert_int_equal(r->index_mismatch, 0);
}

static void expect_ttft_ms(const kvt_sim_timed_result_t *r, const double *ms, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_true(r->req_ttft_us[i] == ms[i] * 1000.0);
}

/*
 * One pod, batch limit 4 tokens:
 *   req  t(ms)  blocks  tokens  batch starts  hit      computes  TTFT
 *   0    0      1 2     4       0             0        4 -> 4    4
 *   1    1      3       2       4             0        2         7 (4 + 2 + 2 + 0 - 1)
 *   2    2      4       2       4             0        2         6
 *   3    3      1 2     4       4             2 (gpu)  0         5
 *   4    3      1 5     4       8 (2+2+0+2>4) 1 (gpu)  2         7 (8 + 2 - 3)
 */
static void test_queue_and_batch(void **state)
{
    (void)state;
    kvt_trace_t *t =
        parse("{\"timestamp\":0,\"input_length\":4,\"output_length\":1,\"hash_ids\":[1,2]}\n"
              "{\"timestamp\":1,\"input_length\":2,\"output_length\":0,\"hash_ids\":[3]}\n"
              "{\"timestamp\":2,\"input_length\":2,\"output_length\":0,\"hash_ids\":[4]}\n"
              "{\"timestamp\":3,\"input_length\":4,\"output_length\":0,\"hash_ids\":[1,2]}\n"
              "{\"timestamp\":3,\"input_length\":4,\"output_length\":0,\"hash_ids\":[1,5]}\n");
    kvt_sim_timed_config_t c;
    kvt_sim_timed_result_t r;
    cfg_init(&c, 1, KVT_SIM_ROUND_ROBIN);
    run(t, &c, &r);
    const double ttft[] = {4, 7, 6, 5, 7};
    expect_ttft_ms(&r, ttft, 5);
    const double queue[] = {0, 3, 2, 1, 5};
    for (size_t i = 0; i < 5; i++)
        assert_true(r.req_queue_us[i] == queue[i] * 1000.0);
    assert_int_equal(r.batches, 3);
    assert_int_equal(r.hit_tier[0], 3);
    assert_int_equal(r.hit_blocks, 3);
    assert_int_equal(r.total_blocks, 8);
    assert_int_equal(r.saved_tokens, 6);
    assert_true(r.busy_us[0] == 10000.0);
    assert_true(r.ttft_p50_ms == 6.0 && r.ttft_p99_ms == 7.0 && r.ttft_p90_ms == 7.0);
    assert_true(r.queue_mean_ms == 11.0 / 5);
    assert_true(r.load_imbalance == 1.0);
    kvt_sim_timed_result_cleanup(&r);
    kvt_trace_free(t);
}

/*
 * One pod, GPU 2 blocks, CPU 1, DISK 1:
 *   t=0   r0 [1 2], decodes until 14 ms: 1 and 2 pinned
 *   t=5   r1 [3]: GPU holds 3 with nothing evictable (1 over); done at 7, 3 goes to CPU
 *   t=8   r2 [1 2]: both hit in GPU (pinned, so never evicted for 3)
 *   t=14  r0 done: 2 then 1 unpinned (1 most recent)
 *   t=20  r3 [4 5]: 2, 1 go to CPU; CPU keeps 1, 3 and 2 go to DISK; DISK keeps 2 (3 gone)
 *   t=30  r4 [1 2 6]: 1 from CPU, 2 from DISK: 2 computed tokens + 2 loaded each
 *         = 2000 + 200 + 800 us; 1 and 2 come back to GPU; 5, 4 go to CPU, 5 on to DISK
 *   t=33  r4 done: 6 to CPU, 4 to DISK, 5 gone
 */
static void test_tiers(void **state)
{
    (void)state;
    kvt_trace_t *t =
        parse("{\"timestamp\":0,\"input_length\":4,\"output_length\":100,\"hash_ids\":[1,2]}\n"
              "{\"timestamp\":5,\"input_length\":2,\"output_length\":0,\"hash_ids\":[3]}\n"
              "{\"timestamp\":8,\"input_length\":4,\"output_length\":0,\"hash_ids\":[1,2]}\n"
              "{\"timestamp\":20,\"input_length\":4,\"output_length\":0,\"hash_ids\":[4,5]}\n"
              "{\"timestamp\":30,\"input_length\":6,\"output_length\":0,\"hash_ids\":[1,2,6]}\n");
    kvt_sim_timed_config_t c;
    kvt_sim_timed_result_t r;
    cfg_init(&c, 1, KVT_SIM_COST_TIERS);
    c.gpu_blocks = 2;
    c.cpu_blocks = 1;
    c.disk_blocks = 1;
    run(t, &c, &r); /* index_mismatch 0: the index saw every move, tier by tier */
    const double ttft[] = {4, 2, 0, 4, 3};
    expect_ttft_ms(&r, ttft, 5);
    const uint32_t hit[] = {0, 0, 2, 0, 2};
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(r.req_hit[i], hit[i]);
    assert_int_equal(r.hit_tier[0], 2);
    assert_int_equal(r.hit_tier[1], 1);
    assert_int_equal(r.hit_tier[2], 1);
    assert_int_equal(r.evicted[0], 6); /* 3; 2, 1; 5, 4; 6 */
    assert_int_equal(r.evicted[1], 4); /* 3, 2; 5; 4 */
    assert_int_equal(r.evicted[2], 2); /* 3; 5 */
    assert_int_equal(r.gpu_over, 1);
    kvt_sim_timed_result_cleanup(&r);
    kvt_trace_free(t);
}

/*
 * Two pods, `cost`. r0 [1 2 3] (6 tokens, 6 ms) goes to a pod P; r1 [1 2 3 4]
 * arrives at 1 ms, before r0's store (6 ms). With a routed TTL, P's
 * speculative entries score 3 against its load of 2.5 blocks: r1 follows r0
 * and hits 3 blocks when it starts at 6 ms (TTFT 6 + 2 - 1 = 7 ms). Without,
 * the index knows nothing yet: r1 goes to the idle pod and computes all (8).
 * With a TTL of 1 ms the entries are gone by 1 ms: the same as none.
 */
static void test_routed(void **state)
{
    (void)state;
    kvt_trace_t *t =
        parse("{\"timestamp\":0,\"input_length\":6,\"output_length\":0,\"hash_ids\":[1,2,3]}\n"
              "{\"timestamp\":1,\"input_length\":8,\"output_length\":0,\"hash_ids\":[1,2,3,4]}\n");
    kvt_sim_timed_config_t c;
    kvt_sim_timed_result_t r;
    cfg_init(&c, 2, KVT_SIM_COST);
    c.model.batch_tokens = 100;

    c.routed_ttl_ms = 2000;
    run(t, &c, &r);
    assert_int_equal(r.req_pod[1], r.req_pod[0]);
    assert_int_equal(r.req_hit[1], 3);
    assert_true(r.req_ttft_us[1] == 7000.0);
    assert_int_equal(r.speculated, 2);
    kvt_sim_timed_result_cleanup(&r);

    c.routed_ttl_ms = 0;
    run(t, &c, &r);
    assert_int_not_equal(r.req_pod[1], r.req_pod[0]);
    assert_int_equal(r.req_hit[1], 0);
    assert_true(r.req_ttft_us[1] == 8000.0);
    assert_int_equal(r.speculated, 0);
    kvt_sim_timed_result_cleanup(&r);

    c.routed_ttl_ms = 1; /* expires at 1 ms, when r1 is routed */
    run(t, &c, &r);
    assert_int_not_equal(r.req_pod[1], r.req_pod[0]);
    kvt_sim_timed_result_cleanup(&r);

    /* the engine's store at 6 ms is what a later request finds, TTL or not */
    kvt_trace_free(t);
    t = parse("{\"timestamp\":0,\"input_length\":6,\"output_length\":0,\"hash_ids\":[1,2,3]}\n"
              "{\"timestamp\":7,\"input_length\":8,\"output_length\":0,\"hash_ids\":[1,2,3,4]}\n");
    run(t, &c, &r);
    assert_int_equal(r.req_pod[1], r.req_pod[0]);
    assert_int_equal(r.req_hit[1], 3);
    kvt_sim_timed_result_cleanup(&r);
    kvt_trace_free(t);
}

/* A random trace of @n requests over 6 prefix chains (stream @stream of rng.h). */
static kvt_trace_t *random_trace(uint64_t stream, size_t n)
{
    kvt_rng_t g;
    kvt_rng_init(&g, stream);
    size_t cap = n * 200 + 1, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    uint64_t ts = 0;
    for (size_t i = 0; i < n; i++) {
        ts += kvt_rng_below(&g, 400);
        uint32_t chain = (uint32_t)kvt_rng_below(&g, 6), nb = 1 + (uint32_t)kvt_rng_below(&g, 8);
        len += (size_t)snprintf(buf + len, cap - len,
                                "{\"timestamp\":%llu,\"input_length\":%u,\"output_length\":%u,"
                                "\"hash_ids\":[",
                                (unsigned long long)ts, nb * 2 - (uint32_t)kvt_rng_below(&g, 2),
                                (unsigned)kvt_rng_below(&g, 50));
        for (uint32_t b = 0; b < nb; b++) {
            /* blocks 0..2 shared by the chain, the rest shared less often */
            uint32_t id = b < 3 ? chain * 100 + b
                                : 1000 + chain * 100 + b * 10 + (uint32_t)kvt_rng_below(&g, 3);
            len += (size_t)snprintf(buf + len, cap - len, "%s%u", b ? "," : "", id);
        }
        len += (size_t)snprintf(buf + len, cap - len, "]}\n");
        assert_true(len < cap);
    }
    kvt_trace_t *t = parse(buf);
    free(buf);
    return t;
}

static void expect_same(const kvt_sim_timed_result_t *a, const kvt_sim_timed_result_t *b,
                        bool pods_too)
{
    assert_int_equal(a->requests, b->requests);
    assert_int_equal(a->hit_blocks, b->hit_blocks);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(a->hit_tier[k], b->hit_tier[k]);
        assert_int_equal(a->evicted[k], b->evicted[k]);
    }
    for (size_t i = 0; i < a->requests; i++) {
        assert_true(a->req_ttft_us[i] == b->req_ttft_us[i]);
        assert_int_equal(a->req_hit[i], b->req_hit[i]);
        if (pods_too)
            assert_int_equal(a->req_pod[i], b->req_pod[i]);
    }
    assert_true(a->ttft_p99_ms == b->ttft_p99_ms);
}

static void tiers_cfg(kvt_sim_timed_config_t *c, uint32_t pods, kvt_sim_policy_t pol)
{
    cfg_init(c, pods, pol);
    c->gpu_blocks = 12;
    c->cpu_blocks = 10;
    c->disk_blocks = 20;
    c->routed_ttl_ms = 2000;
    c->model.batch_tokens = 8;
}

static void test_deterministic(void **state)
{
    (void)state;
    kvt_trace_t *t = random_trace(1, 300);
    for (unsigned p = 0; p < KVT_SIM_NPOLICIES; p++) {
        kvt_sim_timed_config_t c;
        kvt_sim_timed_result_t a, b;
        tiers_cfg(&c, 3, (kvt_sim_policy_t)p);
        run(t, &c, &a);
        run(t, &c, &b);
        expect_same(&a, &b, true);
        assert_true(a.hit_tier[1] + a.hit_tier[2] > 0); /* the lower tiers are used */
        kvt_sim_timed_result_cleanup(&a);
        kvt_sim_timed_result_cleanup(&b);
    }
    kvt_trace_free(t);
}

static void test_one_pod_all_alike(void **state)
{
    (void)state;
    kvt_trace_t *t = random_trace(2, 300);
    kvt_sim_timed_config_t c;
    kvt_sim_timed_result_t ref;
    tiers_cfg(&c, 1, KVT_SIM_RANDOM);
    run(t, &c, &ref);
    for (unsigned p = 1; p < KVT_SIM_NPOLICIES; p++) {
        kvt_sim_timed_result_t r;
        tiers_cfg(&c, 1, (kvt_sim_policy_t)p);
        run(t, &c, &r);
        expect_same(&ref, &r, true);
        kvt_sim_timed_result_cleanup(&r);
    }
    kvt_sim_timed_result_cleanup(&ref);
    kvt_trace_free(t);
}

/* sim_cache: pinned entries stay past the capacity, grow the arrays, leave in unpin order. */
static void test_cache_pins(void **state)
{
    (void)state;
    kvt_sim_cache_t c;
    uint64_t id;
    uint32_t pins;
    assert_int_equal(kvt_sim_cache_init(&c, 2, 1), KVT_OK);
    for (uint64_t i = 1; i <= 40; i++)
        assert_int_equal(kvt_sim_cache_put(&c, i, 1), KVT_OK);
    assert_int_equal(c.held, 40);
    assert_false(kvt_sim_cache_evict(&c, &id)); /* all pinned */
    for (uint64_t i = 40; i >= 1; i--)
        assert_true(kvt_sim_cache_pin(&c, i, -1)); /* 1 ends most recent */
    assert_false(kvt_sim_cache_pin(&c, 5, -1));
    for (uint64_t want = 40; want > 2; want--) {
        assert_true(kvt_sim_cache_evict(&c, &id));
        assert_int_equal(id, want);
    }
    assert_false(kvt_sim_cache_evict(&c, &id));
    assert_true(kvt_sim_cache_has(&c, 1) && kvt_sim_cache_has(&c, 2));
    assert_true(kvt_sim_cache_pin(&c, 2, 1));
    assert_int_equal(kvt_sim_cache_put(&c, 9, 0), KVT_OK);
    assert_true(kvt_sim_cache_evict(&c, &id)); /* 2 is pinned: 1 goes */
    assert_int_equal(id, 1);
    assert_true(kvt_sim_cache_remove(&c, 2, &pins));
    assert_int_equal(pins, 1);
    assert_false(kvt_sim_cache_remove(&c, 2, NULL));
    assert_int_equal(c.held, 1);
    kvt_sim_cache_cleanup(&c);
}

static void test_bad_args(void **state)
{
    (void)state;
    kvt_trace_t *t = parse("{\"timestamp\":0,\"input_length\":2,\"output_length\":0,"
                           "\"hash_ids\":[1]}\n");
    kvt_sim_timed_config_t c;
    kvt_sim_timed_result_t r;
    char why[64] = "";
    cfg_init(&c, 0, KVT_SIM_COST);
    assert_int_equal(kvt_sim_timed_run(t, &c, &r, why, sizeof(why)), KVT_ERR_INVAL);
    cfg_init(&c, 1, KVT_SIM_COST);
    c.speedup = 0;
    assert_int_equal(kvt_sim_timed_run(t, &c, &r, why, sizeof(why)), KVT_ERR_INVAL);
    assert_null(r.req_ttft_us);
    kvt_trace_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_and_batch),
        cmocka_unit_test(test_tiers),
        cmocka_unit_test(test_routed),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_one_pod_all_alike),
        cmocka_unit_test(test_cache_pins),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
