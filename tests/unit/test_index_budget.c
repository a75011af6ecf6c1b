/* Memory-budget eviction: leaves first, least recently used first, budget held. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvindex/index.h"

static uint64_t key_of(uint64_t chain, uint64_t i)
{
    return (chain << 32) ^ (i * 0x9e3779b97f4a7c15ull) ^ 0x1234;
}

static uint64_t bytes_of(kvt_idx_t *idx)
{
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    return st.bytes;
}

static kvt_idx_match_t query1(kvt_idx_reader_t *r, uint32_t ns, const uint64_t *k, size_t n,
                              uint32_t pod)
{
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(r, ns, k, n, NULL, 0, &res, &nres), KVT_OK);
    for (size_t i = 0; i < nres; i++)
        if (res[i].pod == pod)
            return res[i];
    return (kvt_idx_match_t){pod, 0, 0, 0, 0};
}

/*
 * One chain longer than the budget: its prefix is kept, its tail dropped and
 * counted. A later chain then makes room by shortening the old one from its
 * tail only: what is left of it is always a prefix.
 */
static void test_chain_cut_from_tail_only(void **state)
{
    (void)state;
    const uint64_t budget = 512 * 1024;
    kvt_idx_config_t cfg = {.budget_bytes = budget};
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    uint32_t ns, pod;
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(idx, &r), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_OK);
    enum { LEN = 40000, LEN_B = 200 };
    uint64_t *k = malloc(LEN * sizeof(uint64_t));
    for (uint64_t i = 0; i < LEN; i++)
        k[i] = key_of(1, i);
    kvt_idx_advance(idx, 1);
    assert_int_equal(kvt_idx_store(idx, ns, pod, KVT_TIER_GPU, NULL, k, NULL, LEN), KVT_OK);
    assert_true(bytes_of(idx) <= budget);
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    uint32_t kept = query1(r, ns, k, LEN, pod).matched;
    assert_true(kept > 1000 && kept < LEN);
    assert_int_equal(st.entries, kept);
    assert_int_equal(st.dropped, LEN - kept);

    /* newer chains push the old one back, from its tail */
    uint64_t kb[LEN_B];
    for (uint64_t c = 2; c < 40; c++) {
        kvt_idx_advance(idx, c);
        for (uint64_t i = 0; i < LEN_B; i++)
            kb[i] = key_of(c, i);
        assert_int_equal(kvt_idx_store(idx, ns, pod, KVT_TIER_GPU, NULL, kb, NULL, LEN_B),
                         KVT_OK);
        assert_true(bytes_of(idx) <= budget);
        assert_int_equal(query1(r, ns, kb, LEN_B, pod).matched, LEN_B);
        /* every chain's held blocks form its matched run: no chain has a hole */
        uint64_t held = query1(r, ns, k, LEN, pod).matched;
        assert_true(held <= kept);
        kept = (uint32_t)held;
        for (uint64_t c2 = 2; c2 < c; c2++) {
            uint64_t kc[LEN_B];
            for (uint64_t i = 0; i < LEN_B; i++)
                kc[i] = key_of(c2, i);
            held += query1(r, ns, kc, LEN_B, pod).matched;
        }
        kvt_idx_stats(idx, &st);
        assert_int_equal(st.entries, held + LEN_B);
    }
    kvt_idx_stats(idx, &st);
    assert_true(st.evicted > 0);
    print_message("long chain: %u of %d blocks left, %llu evicted, %llu dropped\n", kept, LEN,
                  (unsigned long long)st.evicted, (unsigned long long)st.dropped);
    free(k);
    kvt_idx_reader_destroy(r);
    kvt_idx_destroy(idx);
}

/* A chain queried all along survives; the oldest untouched chains go first. */
static void test_lru_order(void **state)
{
    (void)state;
    const uint64_t budget = 400 * 1024;
    kvt_idx_config_t cfg = {.budget_bytes = budget};
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    uint32_t ns, pod;
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(idx, &r), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_OK);
    enum { LEN = 32, CHAINS = 2000 };
    uint64_t k[LEN], hot[LEN];
    for (int i = 0; i < LEN; i++)
        hot[i] = key_of(0, (uint64_t)i);
    kvt_idx_advance(idx, 1);
    assert_int_equal(kvt_idx_store(idx, ns, pod, KVT_TIER_GPU, NULL, hot, NULL, LEN), KVT_OK);
    uint64_t evicted_at = 0;
    for (uint64_t c = 1; c <= CHAINS; c++) {
        kvt_idx_advance(idx, 1 + c);
        for (int i = 0; i < LEN; i++)
            k[i] = key_of(c, (uint64_t)i);
        assert_int_equal(kvt_idx_store(idx, ns, pod, KVT_TIER_GPU, NULL, k, NULL, LEN), KVT_OK);
        assert_true(bytes_of(idx) <= budget);
        /* the hot chain is used by every request */
        assert_int_equal(query1(r, ns, hot, LEN, pod).matched, LEN);
        kvt_idx_stats_t st;
        kvt_idx_stats(idx, &st);
        if (st.evicted > 0 && evicted_at == 0)
            evicted_at = c;
    }
    assert_true(evicted_at > 0);
    /* the oldest cold chain is gone entirely, the newest is whole */
    for (int i = 0; i < LEN; i++)
        k[i] = key_of(1, (uint64_t)i);
    assert_int_equal(query1(r, ns, k, LEN, pod).matched, 0);
    for (int i = 0; i < LEN; i++)
        k[i] = key_of(CHAINS, (uint64_t)i);
    assert_int_equal(query1(r, ns, k, LEN, pod).matched, LEN);
    /* recency is monotone: survivors are a suffix of the cold chains in age */
    int first_alive = 0;
    for (uint64_t c = 1; c <= CHAINS; c++) {
        for (int i = 0; i < LEN; i++)
            k[i] = key_of(c, (uint64_t)i);
        uint32_t m = query1(r, ns, k, LEN, pod).matched;
        if (first_alive == 0 && m > 0)
            first_alive = (int)c;
        if (first_alive != 0 && c > (uint64_t)first_alive + 1)
            assert_int_equal(m, LEN); /* all newer ones (but the batch edge) are whole */
    }
    print_message("lru: first eviction at chain %llu, oldest survivor %d of %d\n",
                  (unsigned long long)evicted_at, first_alive, CHAINS);
    kvt_idx_reader_destroy(r);
    kvt_idx_destroy(idx);
}

/* Many pods with their own tables and shared blocks: bytes stay within the budget. */
static void test_budget_many_pods(void **state)
{
    (void)state;
    const uint64_t budget = 1024 * 1024;
    kvt_idx_config_t cfg = {.budget_bytes = budget};
    kvt_idx_t *idx;
    uint32_t ns;
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    enum { PODS = 200, LEN = 16 };
    uint32_t pods[PODS];
    char name[16];
    for (int p = 0; p < PODS; p++) {
        snprintf(name, sizeof(name), "p%d", p);
        assert_int_equal(kvt_idx_pod_get(idx, name, 0, &pods[p]), KVT_OK);
    }
    uint64_t k[LEN], eh[LEN];
    for (uint64_t step = 0; step < 20000; step++) {
        kvt_idx_advance(idx, step + 1);
        uint32_t p = pods[(step * 7) % PODS];
        uint64_t c = step % 3 == 0 ? 0 : step; /* a shared system prompt, and unique chains */
        for (int i = 0; i < LEN; i++) {
            k[i] = key_of(c, (uint64_t)i);
            eh[i] = k[i] ^ (step % 5 == 0 ? (uint64_t)p << 48 : 0); /* some pods hash differently */
        }
        if (step % 11 == 0)
            assert_int_equal(kvt_idx_speculate(idx, ns, p, k, LEN / 2, 5), KVT_OK);
        assert_int_equal(kvt_idx_store(idx, ns, p, KVT_TIER_GPU, NULL, k, eh, LEN), KVT_OK);
        if (bytes_of(idx) > budget)
            fail_msg("step %llu: %llu bytes > budget", (unsigned long long)step,
                     (unsigned long long)bytes_of(idx));
    }
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    assert_true(st.evicted > 0);
    print_message("many pods: %llu entries, %llu blocks, %llu bytes, %llu evicted\n",
                  (unsigned long long)st.entries, (unsigned long long)st.blocks,
                  (unsigned long long)st.bytes, (unsigned long long)st.evicted);
    /* dropping every pod leaves nothing behind */
    for (int p = 0; p < PODS; p++)
        assert_int_equal(kvt_idx_pod_drop(idx, pods[p]), KVT_OK);
    kvt_idx_stats(idx, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.speculative, 0);
    kvt_idx_destroy(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_cut_from_tail_only),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_budget_many_pods),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
