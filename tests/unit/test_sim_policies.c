/*
 * bench/sim: the `approx-prefix` policy on a hand-worked trace, and Belady's
 * farthest-next-use reference (kvt_sim_belady): hand-worked traces, a naive
 * reference on random tiny traces, the ideal when unbounded, and never below
 * LRU at the same capacity on random prefix-structured traces.
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
#include "tests/support/rng.h"
#include "tests/support/sim_trace.h"

static void run_approx(const kvt_trace_t *t, uint64_t cap, uint64_t approx_cap,
                       kvt_sim_policy_t pol, kvt_sim_result_t *r)
{
    kvt_sim_config_t cfg = {.pods = 2,
                            .capacity_blocks = cap,
                            .policy = pol,
                            .seed = 7,
                            .load_weight = 0.1,
                            .load_blocks = true,
                            .approx_capacity = approx_cap};
    char why[128] = "";
    assert_int_equal(kvt_sim_run(t, &cfg, r, why, sizeof(why)), KVT_OK);
    assert_int_equal(r->index_mismatch, 0);
}

/*
 * Two pods caching 2 blocks each, w_load 0.1 (load in blocks: prefilled
 * beyond the least loaded pod's), requests [1 2] [1 2 3] [1 2 3].
 *   r0: no match anywhere: pod A by the tie-break; A prefills 2.
 *   r1: A matches 2 in every table: 2 - 0.1 * 2 = 1.8 against B's 0: A, hit 2.
 *       A's cache evicts 3 (touched first, tail first); A's cache is {1 2}.
 *       The router's table of A, keys added in order (3 ends most recent):
 *       with 2 entries it evicts 1 and holds {2 3}; with 8 it holds {1 2 3}.
 *   r2: cost asks the index: A matches 2, 2 - 0.1 * 3 = 1.7: A, hit 2.
 *       approx-prefix, table of 2: A's leading run is 0 (1 is gone), so the
 *       load decides: B (0 against -0.3), hit 0.
 *       approx-prefix, table of 8: A matches 3 (more than A holds): A, hit 2.
 */
static void test_approx_prefix(void **state)
{
    (void)state;
    static const int a[] = {1, 2, -1}, b[] = {1, 2, 3, -1};
    const int *reqs[] = {a, b, b};
    kvt_trace_t *t = test_sim_trace(reqs, 3);
    kvt_sim_result_t r;

    static const uint32_t hits_kept[] = {0, 2, 2}, hits_lost[] = {0, 2, 0};
    run_approx(t, 2, 0, KVT_SIM_COST, &r);
    assert_memory_equal(r.req_hit, hits_kept, sizeof(hits_kept));
    assert_int_equal(r.req_pod[1], r.req_pod[0]);
    assert_int_equal(r.req_pod[2], r.req_pod[0]);
    kvt_sim_result_cleanup(&r);

    run_approx(t, 2, 0, KVT_SIM_APPROX_PREFIX, &r); /* the table as large as the cache */
    assert_memory_equal(r.req_hit, hits_lost, sizeof(hits_lost));
    assert_int_equal(r.req_pod[1], r.req_pod[0]);
    assert_int_not_equal(r.req_pod[2], r.req_pod[0]);
    assert_int_equal(r.prefilled[r.req_pod[0]], 3);
    assert_int_equal(r.prefilled[r.req_pod[2]], 3);
    kvt_sim_result_cleanup(&r);

    run_approx(t, 2, 8, KVT_SIM_APPROX_PREFIX, &r);
    assert_memory_equal(r.req_hit, hits_kept, sizeof(hits_kept));
    assert_int_equal(r.req_pod[2], r.req_pod[0]);
    kvt_sim_result_cleanup(&r);
    kvt_trace_free(t);
}

static uint64_t belady_hits(const kvt_trace_t *t, uint64_t cap)
{
    uint64_t hit = UINT64_MAX, total = 0;
    assert_int_equal(kvt_sim_belady(t, cap, &hit, &total), KVT_OK);
    assert_int_equal(total, t->nids);
    return hit;
}

/*
 * Capacity 2, [1] [2] [3] [1] [2] [3]: LRU hits nothing. Belady: after r2
 * {1 2 3}: 1 is next used by r3, 2 by r4, 3 (its own) is pinned: 2 goes.
 * r3 hits 1 (never used again after). r4 misses 2: {1 3 2}, 1 goes (never
 * used again). r5 hits 3. 2 hits of 6.
 */
static void test_belady_cycle(void **state)
{
    (void)state;
    static const int r1[] = {1, -1}, r2[] = {2, -1}, r3[] = {3, -1};
    const int *reqs[] = {r1, r2, r3, r1, r2, r3};
    kvt_trace_t *t = test_sim_trace(reqs, 6);
    assert_int_equal(belady_hits(t, 2), 2);
    kvt_sim_config_t cfg = {.pods = 1, .capacity_blocks = 2, .policy = KVT_SIM_ROUND_ROBIN};
    kvt_sim_result_t r;
    assert_int_equal(kvt_sim_run(t, &cfg, &r, NULL, 0), KVT_OK);
    assert_int_equal(r.hit_blocks, 0);
    kvt_sim_result_cleanup(&r);
    kvt_trace_free(t);
}

/*
 * Ties within one request, capacity 3: [1 2 3] [4] [1 2 3]. After r1 one of
 * 1, 2, 3 goes (4 is pinned; all three are next used by r2): the deepest, 3,
 * so r2 hits 2 (evicting 1 would leave it 0).
 * A request larger than the cache, capacity 2: [1 2 3] [1 2 3]. Its own
 * blocks go, the deepest first: 3; r1 hits 2. 2 of 6.
 */
static void test_belady_ties(void **state)
{
    (void)state;
    static const int abc[] = {1, 2, 3, -1}, d[] = {4, -1};
    const int *reqs[] = {abc, d, abc};
    kvt_trace_t *t = test_sim_trace(reqs, 3);
    assert_int_equal(belady_hits(t, 3), 2);
    assert_int_equal(belady_hits(t, 0), 3); /* unbounded: 1 2 3 */
    kvt_trace_free(t);

    const int *big[] = {abc, abc};
    t = test_sim_trace(big, 2);
    assert_int_equal(belady_hits(t, 2), 2);
    assert_int_equal(belady_hits(t, 1), 1);
    kvt_trace_free(t);
}

/* ---- a naive reference: the cache as a list, next uses found by a linear scan ---------------- */

enum { NAIVE_MAX = 64 };

/* (request << 32 | position) of @id's first use after request @i; UINT64_MAX for none. */
static uint64_t naive_next(const kvt_trace_t *t, size_t i, uint64_t id)
{
    for (size_t r = i + 1; r < t->nreqs; r++)
        for (uint32_t k = 0; k < t->reqs[r].nblocks; k++)
            if (t->reqs[r].hash_ids[k] == id)
                return (uint64_t)r << 32 | k;
    return UINT64_MAX;
}

static bool naive_in(const uint64_t *v, size_t n, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == id)
            return true;
    return false;
}

static uint64_t naive_belady(const kvt_trace_t *t, size_t cap)
{
    uint64_t held[NAIVE_MAX];
    size_t n = 0;
    uint64_t hit = 0;
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *q = &t->reqs[i];
        uint32_t run = 0;
        while (run < q->nblocks && naive_in(held, n, q->hash_ids[run]))
            run++;
        hit += run;
        for (uint32_t k = 0; k < q->nblocks; k++)
            if (!naive_in(held, n, q->hash_ids[k])) {
                assert_true(n < NAIVE_MAX);
                held[n++] = q->hash_ids[k];
            }
        while (cap > 0 && n > cap) {
            /* the farthest next use among other blocks; among the request's own if none */
            size_t victim = SIZE_MAX;
            uint64_t far = 0;
            for (int own = 0; own < 2 && victim == SIZE_MAX; own++)
                for (size_t j = 0; j < n; j++) {
                    if (naive_in(q->hash_ids, q->nblocks, held[j]) != (own == 1))
                        continue;
                    uint64_t key = naive_next(t, i, held[j]);
                    if (victim == SIZE_MAX || key > far) {
                        victim = j;
                        far = key;
                    }
                }
            held[victim] = held[--n];
        }
    }
    return hit;
}

/* A random trace of @nreq requests of 1..@maxlen ids drawn from 1..@ids (repeats allowed). */
static kvt_trace_t *random_trace(kvt_rng_t *g, size_t nreq, uint32_t maxlen, uint32_t ids)
{
    int buf[32][9];
    const int *reqs[32];
    assert_true(nreq <= 32 && maxlen <= 8);
    for (size_t i = 0; i < nreq; i++) {
        uint32_t len = 1 + (uint32_t)kvt_rng_below(g, maxlen);
        for (uint32_t k = 0; k < len; k++)
            buf[i][k] = 1 + (int)kvt_rng_below(g, ids);
        buf[i][len] = -1;
        reqs[i] = buf[i];
    }
    return test_sim_trace(reqs, nreq);
}

static void test_belady_vs_naive(void **state)
{
    (void)state;
    kvt_rng_t g;
    kvt_rng_init(&g, 18);
    for (int round = 0; round < 400; round++) {
        size_t nreq = 1 + (size_t)kvt_rng_below(&g, 20);
        kvt_trace_t *t = random_trace(&g, nreq, 1 + (uint32_t)kvt_rng_below(&g, 6),
                                      2 + (uint32_t)kvt_rng_below(&g, 10));
        size_t cap = (size_t)kvt_rng_below(&g, 8); /* 0: unbounded */
        uint64_t want = naive_belady(t, cap);
        if (belady_hits(t, cap) != want)
            fail_msg("round %d: capacity %zu: belady %" PRIu64 ", naive %" PRIu64, round, cap,
                     belady_hits(t, cap), want);
        kvt_trace_free(t);
    }
}

/*
 * Random conversations in Mooncake's shape: ids name prefixes (a request
 * extends an earlier one of its session, or starts on one of a few shared
 * system prompts), so a block's parent is always used no later than it.
 */
static kvt_trace_t *prefix_trace(kvt_rng_t *g, size_t nreq)
{
    enum { SESS = 10, LEN = 24 };
    int ctx[SESS][LEN + 1], len[SESS], next = 100;
    int(*buf)[LEN + 1] = calloc(nreq, sizeof(*buf));
    const int **reqs = calloc(nreq, sizeof(*reqs));
    assert_true(buf != NULL && reqs != NULL);
    for (int s = 0; s < SESS; s++)
        len[s] = 0;
    for (size_t i = 0; i < nreq; i++) {
        int s = (int)kvt_rng_below(g, SESS);
        int add = 1 + (int)kvt_rng_below(g, 4);
        if (len[s] == 0 || len[s] + add > LEN) { /* a new conversation on a shared prompt */
            ctx[s][0] = 1 + (int)kvt_rng_below(g, 3);
            len[s] = 1;
        }
        for (int k = 0; k < add; k++)
            ctx[s][len[s]++] = next++;
        memcpy(buf[i], ctx[s], (size_t)len[s] * sizeof(int));
        buf[i][len[s]] = -1;
        reqs[i] = buf[i];
    }
    kvt_trace_t *t = test_sim_trace(reqs, nreq);
    free(buf);
    free(reqs);
    return t;
}

/* Belady never below LRU at the same capacity on prefix-structured traces; the ideal unbounded. */
static void test_belady_beats_lru(void **state)
{
    (void)state;
    kvt_rng_t g;
    kvt_rng_init(&g, 1818);
    for (int round = 0; round < 30; round++) {
        kvt_trace_t *t = prefix_trace(&g, 200);
        uint64_t ih = 0;
        assert_int_equal(kvt_sim_ideal(t, &ih, NULL), KVT_OK);
        assert_int_equal(belady_hits(t, 0), ih);
        for (uint64_t cap = 4; cap <= 256; cap *= 2) {
            kvt_sim_config_t cfg = {.pods = 1, .capacity_blocks = cap, .policy = KVT_SIM_RANDOM};
            kvt_sim_result_t r;
            assert_int_equal(kvt_sim_run(t, &cfg, &r, NULL, 0), KVT_OK);
            uint64_t b = belady_hits(t, cap);
            if (b < r.hit_blocks || b > ih)
                fail_msg("round %d: capacity %" PRIu64 ": belady %" PRIu64 ", lru %" PRIu64
                         ", ideal %" PRIu64,
                         round, cap, b, r.hit_blocks, ih);
            kvt_sim_result_cleanup(&r);
        }
        kvt_trace_free(t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_approx_prefix),    cmocka_unit_test(test_belady_cycle),
        cmocka_unit_test(test_belady_ties),      cmocka_unit_test(test_belady_vs_naive),
        cmocka_unit_test(test_belady_beats_lru),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
