/*
 * Memory budget: eviction (leaves first, least recently used first), the
 * budget held, pods and namespaces refused when nothing fits, and memory
 * given back when pods and namespaces are dropped.
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

#include "kvindex/index.h"
#include "kvindex/index_test.h" /* white box: memory retired while a reader holds it, the alias array */

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
        assert_int_equal(kvt_idx_store(idx, ns, pod, KVT_TIER_GPU, NULL, kb, NULL, LEN_B), KVT_OK);
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

/* True when an index with budget @budget has room for namespace "m" and pod "a". */
static bool one_ns_one_pod_fit(uint64_t budget)
{
    kvt_idx_config_t cfg = {.budget_bytes = budget};
    kvt_idx_t *idx;
    uint32_t ns, pod;
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    bool fit = kvt_idx_ns_get(idx, "m", NULL, 16, &ns) == KVT_OK &&
               kvt_idx_pod_get(idx, "a", 0, &pod) == KVT_OK;
    kvt_idx_destroy(idx);
    return fit;
}

/*
 * A budget too small for anything beyond the empty index: creating a pod or
 * a namespace is refused (KVT_ERR_NO_SPACE, counted), changes nothing, and
 * succeeds once the budget has room.
 */
static void test_no_space_for_pods_and_namespaces(void **state)
{
    (void)state;
    kvt_idx_t *idx;
    assert_int_equal(kvt_idx_create(NULL, &idx), KVT_OK);
    uint64_t empty = bytes_of(idx);
    kvt_idx_destroy(idx);

    kvt_idx_config_t cfg = {.budget_bytes = empty + 8};
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    uint32_t ns, pod;
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_ERR_NO_SPACE);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_ERR_NO_SPACE);
    assert_int_equal(kvt_idx_pod_get(idx, "b", 1, &pod), KVT_ERR_NO_SPACE);
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    assert_int_equal(st.refused, 3);
    assert_int_equal(st.pods, 0);
    assert_int_equal(st.namespaces, 0);
    assert_int_equal(st.bytes, empty);
    assert_int_equal(kvt_idx_ns_count(idx), 0);
    assert_int_equal(kvt_idx_pod_limit(idx), 0);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 0, &ns), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_idx_pod_find(idx, "a", 0, &pod), KVT_ERR_NOT_FOUND);
    kvt_idx_destroy(idx);

    /*
     * The smallest budget with room for one namespace and one pod (beside
     * what they take, the room kept for rebuilding the key table) has no
     * room for a second pod's name and array.
     */
    cfg.budget_bytes = 0;
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_OK);
    uint64_t one = bytes_of(idx);
    kvt_idx_destroy(idx);
    uint64_t lo = one - 1, hi = one + 65536; /* lo has no room, hi has */
    assert_false(one_ns_one_pod_fit(lo));
    assert_true(one_ns_one_pod_fit(hi));
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (one_ns_one_pod_fit(mid))
            hi = mid;
        else
            lo = mid;
    }
    cfg.budget_bytes = hi;
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_OK);
    uint32_t pod2;
    assert_int_equal(kvt_idx_pod_get(idx, "a-second-pod", 0, &pod2), KVT_ERR_NO_SPACE);
    assert_int_equal(kvt_idx_ns_get(idx, "another-model", NULL, 16, &ns), KVT_ERR_NO_SPACE);
    kvt_idx_stats(idx, &st);
    assert_int_equal(st.refused, 2);
    assert_int_equal(st.pods, 1);
    assert_int_equal(st.namespaces, 1);
    /* what exists is still found: finding takes no memory */
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod2), KVT_OK);
    assert_int_equal(pod2, pod);
    /* dropping the pod makes room for the other */
    assert_int_equal(kvt_idx_pod_drop(idx, pod), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "b", 0, &pod2), KVT_OK);
    kvt_idx_destroy(idx);
}

/*
 * With the index full of blocks, creating pods and namespaces uses the
 * budget's reserve: no block is evicted for them. Once the reserve is gone,
 * creation is refused; the blocks stay.
 */
static void test_pods_under_full_budget(void **state)
{
    (void)state;
    const uint64_t budget = 4u << 20;
    kvt_idx_config_t cfg = {.budget_bytes = budget};
    kvt_idx_t *idx;
    uint32_t ns, pods[64];
    char name[32];
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    for (int p = 0; p < 64; p++) {
        snprintf(name, sizeof(name), "p%d", p);
        assert_int_equal(kvt_idx_pod_get(idx, name, 0, &pods[p]), KVT_OK);
    }
    uint64_t k[32];
    for (uint64_t c = 0; c < 20000; c++) {
        kvt_idx_advance(idx, c + 1);
        for (int i = 0; i < 32; i++)
            k[i] = key_of(c, (uint64_t)i);
        assert_int_equal(kvt_idx_store(idx, ns, pods[c % 64], KVT_TIER_GPU, NULL, k, NULL, 32),
                         KVT_OK);
    }
    kvt_idx_stats_t before, after;
    kvt_idx_stats(idx, &before);
    assert_true(before.evicted > 0);
    for (int p = 0; p < 8; p++) {
        snprintf(name, sizeof(name), "new-pod-%d", p);
        uint32_t pod;
        assert_int_equal(kvt_idx_pod_get(idx, name, 0, &pod), KVT_OK);
        snprintf(name, sizeof(name), "new-model-%d", p);
        assert_int_equal(kvt_idx_ns_get(idx, name, NULL, 16, &pod), KVT_OK);
    }
    kvt_idx_stats(idx, &after);
    assert_int_equal(after.evicted, before.evicted);
    assert_int_equal(after.blocks, before.blocks);
    assert_true(after.bytes <= budget);
    /* a flood of long names eats the reserve; then creation is refused, the blocks stay */
    char longname[KVT_IDX_MAX_NAME + 1];
    memset(longname, 'x', KVT_IDX_MAX_NAME);
    longname[KVT_IDX_MAX_NAME] = '\0';
    uint32_t refused_at = 0;
    for (uint32_t i = 0; i < 4000 && refused_at == 0; i++) {
        uint32_t pod;
        snprintf(longname, sizeof(longname), "%u", i);
        longname[strlen(longname)] = 'x';
        kvt_status_t st = kvt_idx_pod_get(idx, longname, 0, &pod);
        if (st == KVT_ERR_NO_SPACE)
            refused_at = i;
        else
            assert_int_equal(st, KVT_OK);
        assert_true(bytes_of(idx) <= budget);
    }
    kvt_idx_stats(idx, &after);
    print_message("full budget: %llu blocks, pod %u (of ~256-byte names) refused\n",
                  (unsigned long long)before.blocks, refused_at);
    assert_true(refused_at > 100);
    assert_int_equal(after.refused, 1);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.evicted, before.evicted);
    /* dropping pods gives the room back */
    for (int p = 0; p < 8; p++)
        assert_int_equal(kvt_idx_pod_drop(idx, pods[p]), KVT_OK);
    uint32_t pod;
    assert_int_equal(kvt_idx_pod_get(idx, "after-drops", 0, &pod), KVT_OK);
    kvt_idx_destroy(idx);
}

/*
 * A reader inside a query keeps what the writer retires meanwhile (EBR), and
 * that memory is counted until it is freed: rebuilding the key table (to
 * grow it, or to clear its tombstones), shrinking holder sets and the like
 * must fit with the old copies still held. The reader opens a read section
 * (its epoch entered, as kvt_idx_query() does) and holds it while the writer
 * fills the index past its budget and churns it. White box: the retired bytes.
 */
static void test_reader_in_query_holds_retired_memory(void **state)
{
    (void)state;
    const uint64_t budget = 1u << 20;
    kvt_idx_config_t cfg = {.budget_bytes = budget};
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    uint32_t ns, pods[4];
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(idx, &r), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    char name[16];
    for (int p = 0; p < 4; p++) {
        snprintf(name, sizeof(name), "p%d", p);
        assert_int_equal(kvt_idx_pod_get(idx, name, 0, &pods[p]), KVT_OK);
    }
    kvt_idx_read_begin(r);
    enum { LEN = 32 };
    uint64_t k[LEN];
    uint64_t peak = 0;
    for (uint64_t c = 0; c < 6000; c++) {
        kvt_idx_advance(idx, c + 1); /* reclaims nothing: the reader holds its epoch */
        for (int i = 0; i < LEN; i++)
            k[i] = key_of(c, (uint64_t)i);
        uint32_t p = pods[c % 4];
        assert_int_equal(kvt_idx_store(idx, ns, p, KVT_TIER_GPU, NULL, k, NULL, LEN), KVT_OK);
        if (c % 3 == 0) /* removals leave tombstones in the key table */
            assert_int_equal(kvt_idx_remove(idx, p, KVT_TIER_ALL, k + LEN / 2, LEN / 2, NULL),
                             KVT_OK);
        uint64_t b = bytes_of(idx);
        if (b > budget)
            fail_msg("chain %llu: %llu bytes > budget %llu with a reader in a query",
                     (unsigned long long)c, (unsigned long long)b, (unsigned long long)budget);
        peak = b > peak ? b : peak;
    }
    assert_true(kvt_idx_test_limbo_bytes(idx) > 0); /* the test held retired memory */
    kvt_idx_read_end(r);
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    print_message("reader held: peak %llu bytes of %llu, %llu retired at the end, %llu evicted\n",
                  (unsigned long long)peak, (unsigned long long)budget,
                  (unsigned long long)kvt_idx_test_limbo_bytes(idx),
                  (unsigned long long)st.evicted);
    assert_true(st.evicted > 0);
    /* the query over, the retired memory goes and the index fills again */
    kvt_idx_advance(idx, 100000);
    assert_int_equal(kvt_idx_test_limbo_bytes(idx), 0);
    for (int i = 0; i < LEN; i++)
        k[i] = key_of(99999, (uint64_t)i);
    assert_int_equal(kvt_idx_store(idx, ns, pods[0], KVT_TIER_GPU, NULL, k, NULL, LEN), KVT_OK);
    assert_int_equal(query1(r, ns, k, LEN, pods[0]).matched, LEN);
    assert_true(bytes_of(idx) <= budget);
    kvt_idx_reader_destroy(r);
    kvt_idx_destroy(idx);
}

/*
 * The alias array is full and the budget has no room to double it, but
 * evicting frees alias records: the new alias takes one of them and the
 * array keeps its size (it used to be doubled anyway, or the block dropped
 * when no room could be made, with a free record at hand). White box: the
 * budget is set on a filled index, just above what its blocks use.
 */
static void test_alias_reused_after_eviction(void **state)
{
    (void)state;
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    uint32_t ns, a, b;
    assert_int_equal(kvt_idx_create(NULL, &idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(idx, &r), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &a), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "b", 0, &b), KVT_OK);
    /* the oldest blocks: held by a, and by b under other engine hashes (aliases) */
    kvt_idx_advance(idx, 1);
    for (uint64_t i = 0; i < 64; i++) {
        uint64_t k = key_of(1, i), eh = k ^ (1ull << 60);
        assert_int_equal(kvt_idx_store(idx, ns, a, KVT_TIER_GPU, NULL, &k, NULL, 1), KVT_OK);
        assert_int_equal(kvt_idx_store(idx, ns, b, KVT_TIER_GPU, NULL, &k, &eh, 1), KVT_OK);
    }
    kvt_idx_test_alias_t al;
    kvt_idx_test_alias(idx, &al);
    assert_int_equal(al.used, 64);
    assert_int_equal(al.cap, 64);
    assert_int_equal(al.free, KVT_IDX_TEST_NIL);
    kvt_idx_advance(idx, 2);
    for (uint64_t i = 0; i < 2000; i++) {
        uint64_t k = key_of(2, i);
        assert_int_equal(kvt_idx_store(idx, ns, a, KVT_TIER_GPU, NULL, &k, NULL, 1), KVT_OK);
    }
    /* block data may grow by 1 KiB: not enough for 128 more alias records */
    uint64_t used = bytes_of(idx) + kvt_idx_test_ktab_bytes(idx) + 1024;
    const uint64_t budget = (used * 64 + 62) / 63;
    kvt_idx_test_set_budget(idx, budget);
    kvt_idx_advance(idx, 3);
    uint64_t k = key_of(2, 7), eh = k ^ (1ull << 60);
    assert_int_equal(kvt_idx_store(idx, ns, b, KVT_TIER_GPU, NULL, &k, &eh, 1), KVT_OK);
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    assert_int_equal(st.dropped, 0);
    assert_true(st.evicted > 0 && st.evicted <= 128);
    kvt_idx_test_alias(idx, &al);
    assert_int_equal(al.cap, 64);
    assert_int_equal(query1(r, ns, &k, 1, b).matched, 1);
    assert_true(st.bytes <= budget);
    kvt_idx_reader_destroy(r);
    kvt_idx_destroy(idx);
}

static void drop_all(kvt_idx_t *idx)
{
    for (uint32_t p = 0; p < kvt_idx_pod_limit(idx); p++)
        if (kvt_idx_pod_name(idx, p, NULL) != NULL)
            assert_int_equal(kvt_idx_pod_drop(idx, p), KVT_OK);
    for (uint32_t s = 0; s < kvt_idx_ns_count(idx); s++) {
        uint32_t id = kvt_idx_ns_id(idx, s);
        if (id != KVT_IDX_NS_NONE)
            assert_int_equal(kvt_idx_ns_drop(idx, id, NULL), KVT_OK);
    }
}

/*
 * A flood of namespaces, pods, blocks (aliases, holder sets and speculative
 * marks included), then every pod and namespace dropped: the memory goes back
 * to an empty index's, and everything works again.
 */
static void test_flood_then_drop_returns_memory(void **state)
{
    (void)state;
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    assert_int_equal(kvt_idx_create(NULL, &idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(idx, &r), KVT_OK);
    const uint64_t empty = bytes_of(idx);
    enum { NSS = 300, PODS = 700, LEN = 24 };
    for (int round = 0; round < 2; round++) {
        uint32_t ns[NSS], pods[PODS];
        char name[40];
        for (int i = 0; i < NSS; i++) {
            snprintf(name, sizeof(name), "model-%d-with-a-longer-name", i);
            assert_int_equal(kvt_idx_ns_get(idx, name, i % 3 ? "lora" : NULL, 16, &ns[i]), KVT_OK);
        }
        for (int p = 0; p < PODS; p++) {
            snprintf(name, sizeof(name), "pod-%d.example.internal", p);
            assert_int_equal(kvt_idx_pod_get(idx, name, (uint32_t)p % 4, &pods[p]), KVT_OK);
        }
        uint64_t k[LEN], eh[LEN];
        for (uint64_t step = 0; step < 12000; step++) {
            kvt_idx_advance(idx, (uint64_t)round * 100000 + step + 1);
            uint32_t p = pods[(step * 13) % PODS];
            uint32_t n = ns[step % NSS];
            uint64_t c = step % 4 == 0 ? 7 : step; /* shared chains: holder sets */
            for (int i = 0; i < LEN; i++) {
                k[i] = key_of(c, (uint64_t)i);
                eh[i] = k[i] ^ (step % 3 == 0 ? (uint64_t)p << 40 : 0); /* aliases */
            }
            if (step % 5 == 0) /* another pod's: the store does not confirm it */
                assert_int_equal(kvt_idx_speculate(idx, n, pods[(step * 7) % PODS], k, LEN, 1000),
                                 KVT_OK);
            assert_int_equal(kvt_idx_store(idx, n, p, 1u << (step % 3), NULL, k, eh, LEN), KVT_OK);
        }
        kvt_idx_stats_t st;
        kvt_idx_stats(idx, &st);
        assert_true(st.blocks > 100000 && st.speculative > 0);
        print_message("flood %d: %llu blocks, %llu entries, %llu bytes (empty: %llu)\n", round,
                      (unsigned long long)st.blocks, (unsigned long long)st.entries,
                      (unsigned long long)st.bytes, (unsigned long long)empty);
        /* half the pods and namespaces, then the rest: both orders of trimming */
        for (int p = 0; p < PODS; p += 2)
            assert_int_equal(kvt_idx_pod_drop(idx, pods[p]), KVT_OK);
        for (int i = 1; i < NSS; i += 2)
            assert_int_equal(kvt_idx_ns_drop(idx, ns[i], NULL), KVT_OK);
        drop_all(idx);
        kvt_idx_advance(idx,
                        (uint64_t)round * 100000 + 50000); /* readers idle: retired memory goes */
        kvt_idx_stats(idx, &st);
        print_message("after dropping everything: %llu bytes\n", (unsigned long long)st.bytes);
        assert_int_equal(st.blocks, 0);
        assert_int_equal(st.entries, 0);
        assert_int_equal(st.speculative, 0);
        assert_int_equal(st.pods, 0);
        assert_int_equal(st.namespaces, 0);
        assert_int_equal(kvt_idx_ns_count(idx), 0);
        assert_int_equal(kvt_idx_pod_limit(idx), 0);
        assert_int_equal(st.bytes, empty); /* every byte came back */
    }
    /* and it works again */
    uint32_t ns, pod;
    uint64_t k[4] = {1, 2, 3, 4};
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_OK);
    assert_int_equal(kvt_idx_store(idx, ns, pod, KVT_TIER_GPU, NULL, k, NULL, 4), KVT_OK);
    assert_int_equal(query1(r, ns, k, 4, pod).matched, 4);
    kvt_idx_reader_destroy(r);
    kvt_idx_destroy(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_cut_from_tail_only),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_budget_many_pods),
        cmocka_unit_test(test_no_space_for_pods_and_namespaces),
        cmocka_unit_test(test_pods_under_full_budget),
        cmocka_unit_test(test_reader_in_query_holds_retired_memory),
        cmocka_unit_test(test_alias_reused_after_eviction),
        cmocka_unit_test(test_flood_then_drop_returns_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
