/* Unit tests of kvindex/index: namespaces, pods, store/remove/clear, tiers, aliases, spec. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvindex/index.h"

typedef struct fx {
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    uint32_t ns;
} fx_t;

static int setup(void **state)
{
    static fx_t f;
    memset(&f, 0, sizeof(f));
    assert_int_equal(kvt_idx_create(NULL, &f.idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(f.idx, &f.r), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(f.idx, "m", NULL, 16, &f.ns), KVT_OK);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    kvt_idx_reader_destroy(f->r);
    kvt_idx_destroy(f->idx);
    return 0;
}

static uint32_t pod(fx_t *f, const char *name)
{
    uint32_t p;
    assert_int_equal(kvt_idx_pod_get(f->idx, name, 0, &p), KVT_OK);
    return p;
}

/* Query result of @p, or a zeroed match when @p is absent. */
static kvt_idx_match_t q(fx_t *f, uint32_t ns, const uint64_t *keys, size_t n, uint32_t p)
{
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(f->r, ns, keys, n, NULL, 0, &res, &nres), KVT_OK);
    for (size_t i = 0; i < nres; i++) {
        assert_true(res[i].matched == res[i].gpu + res[i].cpu + res[i].disk);
        if (res[i].pod == p)
            return res[i];
    }
    kvt_idx_match_t none = {p, 0, 0, 0, 0};
    return none;
}

static size_t nresults(fx_t *f, uint32_t ns, const uint64_t *keys, size_t n)
{
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(f->r, ns, keys, n, NULL, 0, &res, &nres), KVT_OK);
    return nres;
}

static const uint64_t K[6] = {101, 102, 103, 104, 105, 106};
static const uint64_t E[6] = {901, 902, 903, 904, 905, 906};

static void test_namespaces(void **state)
{
    fx_t *f = *state;
    uint32_t ns2, again;
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", "", 0, &again), KVT_OK);
    assert_int_equal(again, f->ns);
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", "lora-a", 16, &ns2), KVT_OK);
    assert_int_not_equal(ns2, f->ns);
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", NULL, 32, &again), KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_ns_get(f->idx, "other", NULL, 0, &again), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_idx_ns_get(f->idx, "", NULL, 16, &again), KVT_ERR_INVAL);
    char longname[KVT_IDX_MAX_NAME + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(kvt_idx_ns_get(f->idx, longname, NULL, 16, &again), KVT_ERR_TOO_BIG);
    assert_int_equal(kvt_idx_ns_block_size(f->idx, ns2), 16);
    assert_int_equal(kvt_idx_ns_block_size(f->idx, 999), 0);

    /* the same keys in two namespaces do not mix */
    uint32_t a = pod(f, "a");
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, NULL, K, NULL, 3), KVT_OK);
    assert_int_equal(q(f, f->ns, K, 3, a).matched, 3);
    assert_int_equal(nresults(f, ns2, K, 3), 0);
    assert_int_not_equal(kvt_idx_salted_key(f->idx, ns2, 7), kvt_idx_salted_key(f->idx, f->ns, 7));
}

static void test_pods(void **state)
{
    fx_t *f = *state;
    uint32_t a = pod(f, "a"), a1, b = pod(f, "b"), p, rank = 9;
    assert_int_equal(kvt_idx_pod_get(f->idx, "a", 1, &a1), KVT_OK);
    assert_int_not_equal(a, a1);
    assert_int_equal(kvt_idx_pod_find(f->idx, "a", 1, &p), KVT_OK);
    assert_int_equal(p, a1);
    assert_int_equal(kvt_idx_pod_find(f->idx, "zz", 0, &p), KVT_ERR_NOT_FOUND);
    assert_string_equal(kvt_idx_pod_name(f->idx, a1, &rank), "a");
    assert_int_equal(rank, 1);
    assert_int_equal(kvt_idx_pod_get(f->idx, "", 0, &p), KVT_ERR_INVAL);

    assert_int_equal(kvt_idx_store(f->idx, f->ns, b, KVT_TIER_GPU, NULL, K, E, 4), KVT_OK);
    assert_int_equal(kvt_idx_pod_entries(f->idx, b), 4);
    assert_int_equal(kvt_idx_pod_drop(f->idx, b), KVT_OK);
    assert_null(kvt_idx_pod_name(f->idx, b, NULL));
    assert_int_equal(nresults(f, f->ns, K, 4), 0);
    assert_int_equal(kvt_idx_pod_drop(f->idx, b), KVT_ERR_NOT_FOUND);
    /* the id is reused, with nothing left over */
    uint32_t c = pod(f, "c");
    assert_int_equal(c, b);
    assert_int_equal(kvt_idx_pod_entries(f->idx, c), 0);
    kvt_idx_stats_t st;
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.pods, 3);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.blocks, 0);
}

static void test_store_query_tiers(void **state)
{
    fx_t *f = *state;
    uint32_t a = pod(f, "a"), b = pod(f, "b");
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, NULL, K, E, 4), KVT_OK);
    assert_int_equal(kvt_idx_store(f->idx, f->ns, b, KVT_TIER_CPU, NULL, K, E, 2), KVT_OK);
    kvt_idx_match_t m = q(f, f->ns, K, 6, a);
    assert_int_equal(m.matched, 4);
    assert_int_equal(m.gpu, 4);
    m = q(f, f->ns, K, 6, b);
    assert_int_equal(m.matched, 2);
    assert_int_equal(m.cpu, 2);

    /* the same blocks also on CPU: fastest tier stays GPU; drop GPU: CPU shows */
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_CPU, NULL, K, E, 2), KVT_OK);
    assert_int_equal(q(f, f->ns, K, 6, a).gpu, 4);
    size_t unres = 9;
    assert_int_equal(kvt_idx_remove(f->idx, a, KVT_TIER_GPU, E, 1, &unres), KVT_OK);
    assert_int_equal(unres, 0);
    m = q(f, f->ns, K, 6, a);
    assert_int_equal(m.matched, 4);
    assert_int_equal(m.cpu, 1);
    assert_int_equal(m.gpu, 3);

    /* removing the last tier of a middle block cuts the run there */
    assert_int_equal(kvt_idx_remove(f->idx, a, KVT_TIER_GPU, &E[2], 1, NULL), KVT_OK);
    assert_int_equal(q(f, f->ns, K, 6, a).matched, 2);
    assert_int_equal(kvt_idx_pod_entries(f->idx, a), 3);

    /* unknown hashes are counted, not fatal */
    uint64_t bogus[2] = {1, 2};
    assert_int_equal(kvt_idx_remove(f->idx, a, KVT_TIER_GPU, bogus, 2, &unres), KVT_OK);
    assert_int_equal(unres, 2);

    /* a query starting at an unknown block, or empty, matches nothing */
    assert_int_equal(nresults(f, f->ns, &K[4], 2), 0);
    assert_int_equal(nresults(f, f->ns, K, 0), 0);
    assert_int_equal(nresults(f, 77, K, 3), 0);

    /* pods filter */
    const kvt_idx_match_t *res;
    size_t nres;
    uint32_t only_b[3] = {b, b, 60000};
    assert_int_equal(kvt_idx_query(f->r, f->ns, K, 6, only_b, 3, &res, &nres), KVT_OK);
    assert_int_equal(nres, 1);
    assert_int_equal(res[0].pod, b);
}

static void test_parent_and_placeholders(void **state)
{
    fx_t *f = *state;
    uint32_t a = pod(f, "a");
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, NULL, K, E, 2), KVT_OK);
    /* a later event continues the chain from its parent */
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, &K[1], &K[2], &E[2], 2), KVT_OK);
    assert_int_equal(q(f, f->ns, K, 6, a).matched, 4);
    /* an unknown parent is fine: the blocks are still indexed */
    uint64_t unknown = 555;
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, &unknown, &K[4], &E[4], 1),
                     KVT_OK);
    assert_int_equal(q(f, f->ns, K, 6, a).matched, 5);

    /* CPU placeholder stores resolve through the engine hashes */
    uint64_t eh[3] = {E[0], E[1], 12345};
    size_t unres = 0;
    assert_int_equal(kvt_idx_store_by_ehash(f->idx, a, KVT_TIER_CPU, eh, 3, &unres), KVT_OK);
    assert_int_equal(unres, 1);
    assert_int_equal(kvt_idx_pod_clear(f->idx, a, KVT_TIER_GPU), KVT_OK);
    kvt_idx_match_t m = q(f, f->ns, K, 6, a);
    assert_int_equal(m.matched, 2);
    assert_int_equal(m.cpu, 2);
    assert_int_equal(kvt_idx_pod_entries(f->idx, a), 2);
    assert_int_equal(kvt_idx_pod_clear(f->idx, a, KVT_TIER_ALL), KVT_OK);
    kvt_idx_stats_t st;
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.blocks, 0);
}

static void test_aliases_and_remap(void **state)
{
    fx_t *f = *state;
    uint32_t a = pod(f, "a"), b = pod(f, "b");
    uint64_t eb[3] = {7001, 7002, 7003}; /* pod b hashes the same blocks differently */
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, NULL, K, E, 3), KVT_OK);
    assert_int_equal(kvt_idx_store(f->idx, f->ns, b, KVT_TIER_GPU, NULL, K, eb, 3), KVT_OK);
    assert_int_equal(q(f, f->ns, K, 3, b).matched, 3);
    size_t unres;
    /* b's hashes mean nothing for a, and the other way round */
    assert_int_equal(kvt_idx_remove(f->idx, a, KVT_TIER_GPU, eb, 3, &unres), KVT_OK);
    assert_int_equal(unres, 3);
    assert_int_equal(kvt_idx_remove(f->idx, b, KVT_TIER_GPU, &eb[1], 1, &unres), KVT_OK);
    assert_int_equal(unres, 0);
    assert_int_equal(q(f, f->ns, K, 3, b).matched, 1);
    assert_int_equal(q(f, f->ns, K, 3, a).matched, 3);

    /* two engine hashes on one block of one pod: tiers are per hash */
    uint64_t e2 = 8888;
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_DISK, NULL, K, &e2, 1), KVT_OK);
    assert_int_equal(kvt_idx_pod_entries(f->idx, a), 3);
    assert_int_equal(kvt_idx_remove(f->idx, a, KVT_TIER_GPU, E, 1, &unres), KVT_OK);
    kvt_idx_match_t m = q(f, f->ns, K, 3, a);
    assert_int_equal(m.matched, 3);
    assert_int_equal(m.disk, 1);

    /* the engine reuses hash E[2] for another block: the old mapping goes */
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, NULL, &K[5], &E[2], 1), KVT_OK);
    assert_int_equal(q(f, f->ns, K, 3, a).matched, 2);
    assert_int_equal(kvt_idx_remove(f->idx, a, KVT_TIER_GPU, &E[2], 1, &unres), KVT_OK);
    assert_int_equal(unres, 0);
    assert_int_equal(nresults(f, f->ns, &K[5], 1), 0);
}

static void test_speculative(void **state)
{
    fx_t *f = *state;
    uint32_t a = pod(f, "a"), b = pod(f, "b");
    kvt_idx_advance(f->idx, 1000);
    assert_int_equal(kvt_idx_speculate(f->idx, f->ns, a, K, 3, 500), KVT_OK);
    kvt_idx_match_t m = q(f, f->ns, K, 3, a);
    assert_int_equal(m.matched, 3);
    assert_int_equal(m.gpu, 3);
    kvt_idx_stats_t st;
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.speculative, 3);
    /* the engine confirms block 0 on CPU: it now counts as CPU */
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_CPU, NULL, K, E, 1), KVT_OK);
    m = q(f, f->ns, K, 3, a);
    assert_int_equal(m.cpu, 1);
    assert_int_equal(m.gpu, 2);
    /* re-announcing does not extend; the TTL runs out at 1500 */
    kvt_idx_advance(f->idx, 1400);
    assert_int_equal(kvt_idx_speculate(f->idx, f->ns, a, K, 3, 500), KVT_OK);
    assert_int_equal(kvt_idx_speculate(f->idx, f->ns, b, K, 1, 0), KVT_OK);
    kvt_idx_advance(f->idx, 1400); /* the clock did not move: b's TTL-0 mark stays */
    assert_int_equal(q(f, f->ns, K, 1, b).matched, 1);
    kvt_idx_advance(f->idx, 1500);
    assert_int_equal(q(f, f->ns, K, 3, a).matched, 1);
    assert_int_equal(q(f, f->ns, K, 1, b).matched, 0);
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.speculative, 0);
    assert_int_equal(st.entries, 1);
    /* clear ALL drops speculative marks, clear GPU does not */
    assert_int_equal(kvt_idx_speculate(f->idx, f->ns, b, K, 2, 100), KVT_OK);
    assert_int_equal(kvt_idx_pod_clear(f->idx, b, KVT_TIER_GPU), KVT_OK);
    assert_int_equal(q(f, f->ns, K, 2, b).matched, 2);
    assert_int_equal(kvt_idx_pod_clear(f->idx, b, KVT_TIER_ALL), KVT_OK);
    assert_int_equal(q(f, f->ns, K, 2, b).matched, 0);
}

static void test_bad_input_changes_nothing(void **state)
{
    fx_t *f = *state;
    uint32_t a = pod(f, "a");
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, NULL, K, E, 2), KVT_OK);
    kvt_idx_stats_t before, after;
    kvt_idx_stats(f->idx, &before);
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, 3, NULL, K, E, 2), KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, 0, NULL, K, E, 2), KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_store(f->idx, f->ns, 4242, KVT_TIER_GPU, NULL, K, E, 2),
                     KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_store(f->idx, 99, a, KVT_TIER_GPU, NULL, K, E, 2), KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_store(f->idx, f->ns, a, KVT_TIER_GPU, NULL, NULL, E, 2),
                     KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_remove(f->idx, a, 0, E, 2, NULL), KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_remove(f->idx, a, 16, E, 2, NULL), KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_pod_clear(f->idx, 4242, KVT_TIER_GPU), KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_speculate(f->idx, 99, a, K, 2, 10), KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_store_by_ehash(f->idx, a, KVT_TIER_ALL, E, 2, NULL), KVT_ERR_INVAL);
    kvt_idx_stats(f->idx, &after);
    assert_int_equal(before.entries, after.entries);
    assert_int_equal(before.blocks, after.blocks);
    assert_int_equal(q(f, f->ns, K, 2, a).matched, 2);
}

static void test_many_pods_share_block(void **state)
{
    fx_t *f = *state;
    /* one block held by many pods: the holder set grows, shrinks, folds back */
    enum { NP = 300 };
    uint32_t ids[NP];
    char name[16];
    for (int i = 0; i < NP; i++) {
        snprintf(name, sizeof(name), "p%d", i);
        ids[i] = pod(f, name);
        assert_int_equal(kvt_idx_store(f->idx, f->ns, ids[i], KVT_TIER_GPU, NULL, K, E, 1 + i % 3),
                         KVT_OK);
    }
    assert_int_equal(nresults(f, f->ns, K, 3), NP);
    for (int i = 0; i < NP; i++)
        assert_int_equal(q(f, f->ns, K, 3, ids[i]).matched, 1 + i % 3);
    for (int i = 0; i < NP - 1; i++)
        assert_int_equal(kvt_idx_pod_drop(f->idx, ids[i]), KVT_OK);
    assert_int_equal(nresults(f, f->ns, K, 3), 1);
    assert_int_equal(q(f, f->ns, K, 3, ids[NP - 1]).matched, 1 + (NP - 1) % 3);
    kvt_idx_stats_t st;
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.entries, 1 + (NP - 1) % 3);
}

/* The first query after the pod count outgrows the reader's scratch must answer from the new one.
 */
static void test_results_after_reader_growth(void **state)
{
    fx_t *f = *state;
    char name[16];
    uint32_t have = 0;
    for (uint32_t cap = 64; cap <= 256; cap *= 2) {
        for (; have < cap; have++) {
            snprintf(name, sizeof(name), "g%u", have);
            uint32_t p = pod(f, name);
            assert_int_equal(kvt_idx_store(f->idx, f->ns, p, KVT_TIER_GPU, NULL, K, E, 1), KVT_OK);
        }
        const kvt_idx_match_t *res;
        size_t nres;
        assert_int_equal(kvt_idx_query(f->r, f->ns, K, 1, NULL, 0, &res, &nres), KVT_OK);
        assert_int_equal(nres, cap);
        for (size_t i = 0; i < nres; i++) {
            assert_true(res[i].pod < cap);
            assert_int_equal(res[i].matched, 1);
            assert_int_equal(res[i].gpu, 1);
        }
    }
}

/*
 * An index of 400k blocks: node chunks fill seven 2 MiB slabs (the full ones
 * are collapsed into huge pages where the kernel can) and the key table
 * passes 2 MiB (allocated on huge-page alignment). Every block stays findable, chains stay whole,
 * and the bytes counted grow with the chunks handed out, not with the slabs reserved.
 */
static void test_big_index_on_slabs(void **state)
{
    fx_t *f = *state;
    enum { NB = 400000, CHAIN = 100 };
    static uint64_t keys[NB], eh[NB];
    for (uint64_t i = 0; i < NB; i++) {
        keys[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
        eh[i] = ~keys[i];
    }
    uint32_t a = pod(f, "a"), b = pod(f, "b");
    kvt_idx_stats_t st0, st;
    kvt_idx_stats(f->idx, &st0);
    for (size_t c = 0; c < NB; c += CHAIN)
        assert_int_equal(kvt_idx_store(f->idx, f->ns, c % 2 ? b : a, KVT_TIER_GPU, NULL, keys + c,
                                       eh + c, CHAIN),
                         KVT_OK);
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.blocks, NB);
    assert_int_equal(st.entries, NB);
    /*
     * 32-byte nodes in chunks of 4096 (at most one chunk of slack), plus the
     * key table and two pod tables, each at least 7/12 full (64-byte groups
     * of 12 slots): under 9.2 bytes per block each. Counting the seven 2 MiB
     * slabs instead of the chunks would exceed this bound.
     */
    assert_true(st.bytes - st0.bytes >= (uint64_t)NB * 32);
    assert_true(st.bytes - st0.bytes <= (uint64_t)NB * 32 + 4096 * 32 + (uint64_t)NB * 19);
    for (size_t c = 0; c < NB; c += CHAIN) {
        uint32_t want = c % 2 ? b : a;
        assert_int_equal(q(f, f->ns, keys + c, CHAIN, want).matched, CHAIN);
        assert_int_equal(q(f, f->ns, keys + c, CHAIN, c % 2 ? a : b).matched, 0);
    }
    /* removal by engine hash still resolves nodes in every slab */
    for (size_t c = 0; c < NB; c += 7 * CHAIN)
        assert_int_equal(
            kvt_idx_remove(f->idx, c % 2 ? b : a, KVT_TIER_GPU, eh + c + CHAIN / 2, 1, NULL),
            KVT_OK);
    for (size_t c = 0; c < NB; c += 7 * CHAIN)
        assert_int_equal(q(f, f->ns, keys + c, CHAIN, c % 2 ? b : a).matched, CHAIN / 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_namespaces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pods, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_query_tiers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parent_and_placeholders, setup, teardown),
        cmocka_unit_test_setup_teardown(test_aliases_and_remap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_speculative, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input_changes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_pods_share_block, setup, teardown),
        cmocka_unit_test_setup_teardown(test_results_after_reader_growth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_big_index_on_slabs, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
