/*
 * Unit tests of bench/naive_index: each rule of the model on small
 * hand-checked cases, then a randomized comparison with a brute-force model
 * (flat arrays, every query recomputed from scratch) over small key spaces.
 */
// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "bench/naive_index.h"
#include "tests/support/rng.h"

#define NS 3u
#define CAP 64

static kvt_naive_t *mk(void)
{
    kvt_naive_t *n = NULL;
    assert_int_equal(kvt_naive_create(&n), KVT_OK);
    assert_non_null(n);
    return n;
}

static size_t q(kvt_naive_t *n, uint32_t ns, const uint64_t *keys, size_t count,
                kvt_idx_match_t *out)
{
    return kvt_naive_query(n, ns, keys, count, NULL, 0, out, CAP);
}

static void assert_match(const kvt_idx_match_t *m, uint32_t pod, uint32_t matched, uint32_t gpu,
                         uint32_t cpu, uint32_t disk)
{
    assert_int_equal(m->pod, pod);
    assert_int_equal(m->matched, matched);
    assert_int_equal(m->gpu, gpu);
    assert_int_equal(m->cpu, cpu);
    assert_int_equal(m->disk, disk);
}

static void test_create_empty(void **state)
{
    (void)state;
    assert_int_equal(kvt_naive_create(NULL), KVT_ERR_INVAL);
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2};
    assert_int_equal(q(n, NS, keys, 2, out), 0);
    assert_int_equal(kvt_naive_entries(n), 0);
    assert_int_equal(kvt_naive_pod_entries(n, 0), 0);
    assert_true(kvt_naive_bytes(n) > 0);
    kvt_naive_destroy(n);
    kvt_naive_destroy(NULL);
}

static void test_store_query_basic(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {10, 11, 12, 13};
    kvt_naive_store(n, NS, 7, KVT_TIER_GPU, keys, NULL, 3);
    kvt_naive_store(n, NS, 2, KVT_TIER_CPU, keys, NULL, 2);
    kvt_naive_store(n, NS, 5, KVT_TIER_DISK, keys + 1, NULL, 3); /* no block 0 */
    assert_int_equal(kvt_naive_entries(n), 8);
    assert_int_equal(kvt_naive_blocks(n), 4);
    assert_int_equal(kvt_naive_pod_entries(n, 7), 3);
    assert_int_equal(kvt_naive_pod_entries(n, 2), 2);
    assert_int_equal(kvt_naive_pod_entries(n, 5), 3);

    assert_int_equal(q(n, NS, keys, 4, out), 2);
    assert_match(&out[0], 2, 2, 0, 2, 0);
    assert_match(&out[1], 7, 3, 3, 0, 0);
    /* the chain starting at block 1 */
    assert_int_equal(q(n, NS, keys + 1, 3, out), 3);
    assert_match(&out[0], 2, 1, 0, 1, 0);
    assert_match(&out[1], 5, 3, 0, 0, 3);
    assert_match(&out[2], 7, 2, 2, 0, 0);
    /* other namespace, zero-length query */
    assert_int_equal(q(n, NS + 1, keys, 4, out), 0);
    assert_int_equal(q(n, NS, keys, 0, out), 0);
    /* storing twice changes nothing */
    kvt_naive_store(n, NS, 7, KVT_TIER_GPU, keys, NULL, 3);
    assert_int_equal(kvt_naive_entries(n), 8);
    /* invalid tier and pod: no-ops */
    kvt_naive_store(n, NS, 9, 0, keys, NULL, 3);
    kvt_naive_store(n, NS, 9, 8, keys, NULL, 3);
    kvt_naive_store(n, NS, KVT_NAIVE_MAX_PODS, KVT_TIER_GPU, keys, NULL, 3);
    assert_int_equal(kvt_naive_entries(n), 8);
    kvt_naive_destroy(n);
}

static void test_gap_stops_run(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2, 3, 4};
    kvt_naive_store(n, NS, 0, KVT_TIER_GPU, &keys[0], NULL, 1);
    kvt_naive_store(n, NS, 0, KVT_TIER_GPU, &keys[2], NULL, 2);
    kvt_naive_store(n, NS, 1, KVT_TIER_GPU, keys, NULL, 4);
    assert_int_equal(q(n, NS, keys, 4, out), 2);
    assert_match(&out[0], 0, 1, 1, 0, 0);
    assert_match(&out[1], 1, 4, 4, 0, 0);
    kvt_naive_destroy(n);
}

static void test_fastest_tier(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {100, 101, 102, 103};
    kvt_naive_store(n, NS, 4, KVT_TIER_DISK, keys, NULL, 4);
    kvt_naive_store(n, NS, 4, KVT_TIER_CPU, &keys[1], NULL, 2);
    kvt_naive_store(n, NS, 4, KVT_TIER_GPU, &keys[2], NULL, 1);
    /* a multi-bit tier mask is accepted; bits above ALL are ignored */
    kvt_naive_store(n, NS, 4, KVT_TIER_GPU | KVT_TIER_CPU | 0x100u, &keys[3], NULL, 1);
    /* tiers: DISK, DISK|CPU, DISK|CPU|GPU, DISK|CPU|GPU */
    assert_int_equal(q(n, NS, keys, 4, out), 1);
    assert_match(&out[0], 4, 4, 2, 1, 1);
    kvt_naive_destroy(n);
}

static void test_extreme_values(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {0, UINT64_MAX, 0x8000000000000000ull};
    uint64_t eh[] = {UINT64_MAX, 0, 1};
    kvt_naive_store(n, UINT32_MAX, KVT_NAIVE_MAX_PODS - 1, KVT_TIER_GPU, keys, eh, 3);
    assert_int_equal(q(n, UINT32_MAX, keys, 3, out), 1);
    assert_match(&out[0], KVT_NAIVE_MAX_PODS - 1, 3, 3, 0, 0);
    assert_int_equal(kvt_naive_remove(n, KVT_NAIVE_MAX_PODS - 1, KVT_TIER_GPU, &eh[1], 1), 0);
    assert_int_equal(q(n, UINT32_MAX, keys, 3, out), 1);
    assert_match(&out[0], KVT_NAIVE_MAX_PODS - 1, 1, 1, 0, 0);
    kvt_naive_destroy(n);
}

/* An ehash stored again with another key moves: the old entry goes. */
static void test_ehash_remapped(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t a = 1000, b = 2000, h = 77, h2 = 78;
    kvt_naive_store(n, NS, 1, KVT_TIER_GPU | KVT_TIER_CPU, &a, &h, 1);
    assert_int_equal(kvt_naive_entries(n), 1);
    kvt_naive_store(n, NS, 1, KVT_TIER_DISK, &b, &h, 1);
    assert_int_equal(kvt_naive_entries(n), 1);
    assert_int_equal(q(n, NS, &a, 1, out), 0);
    /* h's tier set started over: only DISK, the old GPU|CPU did not follow */
    assert_int_equal(q(n, NS, &b, 1, out), 1);
    assert_match(&out[0], 1, 1, 0, 0, 1);

    /* remap to another namespace, same key: also a different block */
    kvt_naive_store(n, NS + 1, 1, KVT_TIER_CPU, &b, &h, 1);
    assert_int_equal(q(n, NS, &b, 1, out), 0);
    assert_int_equal(q(n, NS + 1, &b, 1, out), 1);
    assert_match(&out[0], 1, 1, 0, 1, 0);

    /* a remap away from a key another ehash still holds keeps that key */
    kvt_naive_store(n, NS, 1, KVT_TIER_GPU, &a, &h2, 1);
    kvt_naive_store(n, NS, 1, KVT_TIER_CPU, &a, &h, 1);
    assert_int_equal(kvt_naive_entries(n), 1);
    assert_int_equal(q(n, NS, &a, 1, out), 1);
    assert_match(&out[0], 1, 1, 1, 0, 0);
    kvt_naive_store(n, NS, 1, KVT_TIER_DISK, &b, &h, 1);
    assert_int_equal(kvt_naive_entries(n), 2);
    assert_int_equal(q(n, NS, &a, 1, out), 1);
    assert_match(&out[0], 1, 1, 1, 0, 0);
    /* removing GPU from h2 drops a; h (now on b) is unaffected */
    assert_int_equal(kvt_naive_remove(n, 1, KVT_TIER_GPU, &h2, 1), 0);
    assert_int_equal(q(n, NS, &a, 1, out), 0);
    assert_int_equal(q(n, NS, &b, 1, out), 1);
    assert_int_equal(kvt_naive_entries(n), 1);
    kvt_naive_destroy(n);
}

/* Two ehashes of one pod on the same key: tiers are their OR. */
static void test_two_ehashes_one_key(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t k = 5, h1 = 51, h2 = 52;
    kvt_naive_store(n, NS, 3, KVT_TIER_GPU, &k, &h1, 1);
    kvt_naive_store(n, NS, 3, KVT_TIER_CPU, &k, &h2, 1);
    assert_int_equal(kvt_naive_entries(n), 1);
    assert_int_equal(kvt_naive_pod_entries(n, 3), 1);
    assert_int_equal(q(n, NS, &k, 1, out), 1);
    assert_match(&out[0], 3, 1, 1, 0, 0);
    /* h1 loses GPU (its only tier): it is dropped; h2 still holds k in CPU */
    assert_int_equal(kvt_naive_remove(n, 3, KVT_TIER_GPU, &h1, 1), 0);
    assert_int_equal(q(n, NS, &k, 1, out), 1);
    assert_match(&out[0], 3, 1, 0, 1, 0);
    /* h1 is gone now: unresolved */
    assert_int_equal(kvt_naive_remove(n, 3, KVT_TIER_GPU, &h1, 1), 1);
    assert_int_equal(kvt_naive_store_by_ehash(n, 3, KVT_TIER_GPU, &h1, 1), 1);
    /* removing GPU from h2, which lacks it: no-op, resolved */
    assert_int_equal(kvt_naive_remove(n, 3, KVT_TIER_GPU, &h2, 1), 0);
    assert_int_equal(kvt_naive_entries(n), 1);
    assert_int_equal(kvt_naive_remove(n, 3, KVT_TIER_ALL, &h2, 1), 0);
    assert_int_equal(kvt_naive_entries(n), 0);
    assert_int_equal(q(n, NS, &k, 1, out), 0);
    kvt_naive_destroy(n);
}

static void test_store_by_ehash_and_remove(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2, 3};
    uint64_t eh[] = {901, 902, 903};
    uint64_t mix[] = {901, 999, 903, 998};
    kvt_naive_store(n, NS, 0, KVT_TIER_GPU, keys, eh, 3);
    assert_int_equal(kvt_naive_store_by_ehash(n, 0, KVT_TIER_CPU, mix, 4), 2);
    assert_int_equal(kvt_naive_store_by_ehash(n, 1, KVT_TIER_CPU, mix, 4), 4); /* unknown pod */
    /* the keys are not ehashes here */
    assert_int_equal(kvt_naive_remove(n, 0, KVT_TIER_GPU, keys, 3), 3);
    assert_int_equal(kvt_naive_remove(n, 0, KVT_TIER_GPU, eh, 3), 0);
    /* 901 and 903 keep CPU, 902 is gone */
    assert_int_equal(kvt_naive_entries(n), 2);
    assert_int_equal(q(n, NS, keys, 3, out), 1);
    assert_match(&out[0], 0, 1, 0, 1, 0);
    assert_int_equal(q(n, NS, &keys[2], 1, out), 1);
    assert_match(&out[0], 0, 1, 0, 1, 0);
    assert_int_equal(kvt_naive_remove(n, 0, KVT_TIER_CPU, eh, 3), 1);
    assert_int_equal(kvt_naive_entries(n), 0);
    assert_int_equal(kvt_naive_remove(n, KVT_NAIVE_MAX_PODS + 5, KVT_TIER_CPU, eh, 3), 3);
    kvt_naive_destroy(n);
}

static void test_spec_confirm(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2, 3};
    kvt_naive_speculate(n, NS, 6, keys, 3, 100);
    assert_int_equal(kvt_naive_entries(n), 3);
    assert_int_equal(q(n, NS, keys, 3, out), 1);
    assert_match(&out[0], 6, 3, 3, 0, 0);
    /* the engine stores block 0 in CPU only: the mark is confirmed (gone), tier CPU */
    kvt_naive_store(n, NS, 6, KVT_TIER_CPU, keys, NULL, 1);
    assert_int_equal(kvt_naive_entries(n), 3);
    assert_int_equal(q(n, NS, keys, 3, out), 1);
    assert_match(&out[0], 6, 3, 2, 1, 0);
    /* removing the stored block drops the entry: no mark is left under it */
    assert_int_equal(kvt_naive_remove(n, 6, KVT_TIER_CPU, keys, 1), 0);
    assert_int_equal(kvt_naive_entries(n), 2);
    assert_int_equal(q(n, NS, keys, 3, out), 0);
    assert_int_equal(q(n, NS, &keys[1], 2, out), 1);
    /* a confirmed block does not expire */
    kvt_naive_store(n, NS, 6, KVT_TIER_GPU, &keys[1], NULL, 1);
    kvt_naive_advance(n, 100);
    assert_int_equal(kvt_naive_entries(n), 1);
    assert_int_equal(q(n, NS, &keys[1], 2, out), 1);
    assert_match(&out[0], 6, 1, 1, 0, 0);
    kvt_naive_destroy(n);
}

static void test_spec_expiry_no_extend(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2};
    kvt_naive_advance(n, 1000);
    kvt_naive_speculate(n, NS, 2, keys, 1, 100); /* expires at 1100 */
    kvt_naive_advance(n, 1050);
    kvt_naive_speculate(n, NS, 2, keys, 2, 100); /* key 1: not extended; key 2: 1150 */
    kvt_naive_advance(n, 500);                   /* backwards: ignored */
    kvt_naive_advance(n, 1099);
    assert_int_equal(kvt_naive_entries(n), 2);
    assert_int_equal(q(n, NS, keys, 2, out), 1);
    assert_match(&out[0], 2, 2, 2, 0, 0);
    kvt_naive_advance(n, 1100);
    assert_int_equal(kvt_naive_entries(n), 1);
    assert_int_equal(q(n, NS, keys, 2, out), 0);
    assert_int_equal(q(n, NS, &keys[1], 1, out), 1);
    kvt_naive_advance(n, 1149);
    assert_int_equal(kvt_naive_entries(n), 1);
    kvt_naive_advance(n, 1150);
    assert_int_equal(kvt_naive_entries(n), 0);
    /* TTL 0: lives until the clock moves forward */
    kvt_naive_speculate(n, NS, 2, keys, 1, 0);
    kvt_naive_advance(n, 1150);
    assert_int_equal(kvt_naive_entries(n), 1);
    kvt_naive_advance(n, 1151);
    assert_int_equal(kvt_naive_entries(n), 0);
    /* huge TTL near the end of the clock saturates instead of wrapping */
    kvt_naive_advance(n, UINT64_MAX - 5);
    kvt_naive_speculate(n, NS, 2, keys, 1, UINT32_MAX);
    kvt_naive_advance(n, UINT64_MAX - 1);
    assert_int_equal(kvt_naive_entries(n), 1);
    kvt_naive_advance(n, UINT64_MAX);
    assert_int_equal(kvt_naive_entries(n), 0);
    kvt_naive_destroy(n);
}

/* Speculating a block the pod holds from an ehash does nothing, in any tier. */
static void test_spec_on_held_block(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2};
    kvt_naive_store(n, NS, 0, KVT_TIER_DISK, keys, NULL, 1);
    kvt_naive_speculate(n, NS, 0, keys, 2, 100);
    assert_int_equal(kvt_naive_entries(n), 2);
    /* block 0 stays DISK (no mark makes it GPU), block 1 is speculative GPU */
    assert_int_equal(q(n, NS, keys, 2, out), 1);
    assert_match(&out[0], 0, 2, 1, 0, 1);
    /* removing the store leaves no mark behind on block 0 */
    assert_int_equal(kvt_naive_remove(n, 0, KVT_TIER_DISK, keys, 1), 0);
    assert_int_equal(kvt_naive_entries(n), 1);
    assert_int_equal(q(n, NS, keys, 2, out), 0);
    /* a CPU store on a speculative block confirms it: CPU, no longer GPU */
    kvt_naive_store(n, NS, 0, KVT_TIER_CPU, &keys[1], NULL, 1);
    assert_int_equal(q(n, NS, &keys[1], 1, out), 1);
    assert_match(&out[0], 0, 1, 0, 1, 0);
    kvt_naive_destroy(n);
}

static void test_clear_gpu_vs_all(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2, 3, 4};
    kvt_naive_store(n, NS, 1, KVT_TIER_GPU, keys, NULL, 4);
    kvt_naive_store(n, NS, 1, KVT_TIER_CPU, keys, NULL, 2);
    kvt_naive_speculate(n, NS, 1, (const uint64_t[]){50, 51}, 2, 1000);
    kvt_naive_store(n, NS, 2, KVT_TIER_GPU, keys, NULL, 4);
    assert_int_equal(kvt_naive_pod_entries(n, 1), 6);

    kvt_naive_pod_clear(n, 1, KVT_TIER_GPU);
    /* blocks 0,1 keep CPU; 2,3 gone; marks kept; pod 2 untouched */
    assert_int_equal(kvt_naive_pod_entries(n, 1), 4);
    assert_int_equal(kvt_naive_pod_entries(n, 2), 4);
    assert_int_equal(q(n, NS, keys, 4, out), 2);
    assert_match(&out[0], 1, 2, 0, 2, 0);
    assert_match(&out[1], 2, 4, 4, 0, 0);
    assert_int_equal(q(n, NS, (const uint64_t[]){50, 51}, 2, out), 1);
    assert_match(&out[0], 1, 2, 2, 0, 0);

    kvt_naive_pod_clear(n, 1, KVT_TIER_CPU | KVT_TIER_DISK);
    assert_int_equal(kvt_naive_pod_entries(n, 1), 2); /* marks only */
    kvt_naive_pod_clear(n, 1, KVT_TIER_ALL);
    assert_int_equal(kvt_naive_pod_entries(n, 1), 0);
    assert_int_equal(kvt_naive_entries(n), 4);
    assert_int_equal(q(n, NS, (const uint64_t[]){50, 51}, 2, out), 0);
    kvt_naive_pod_clear(n, 9, KVT_TIER_ALL); /* unknown pod: no-op */
    kvt_naive_destroy(n);
}

static void test_evict(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2};
    uint64_t eh[] = {11, 12, 13};
    kvt_naive_store(n, NS, 0, KVT_TIER_GPU, keys, eh, 2);
    kvt_naive_store(n, NS, 0, KVT_TIER_CPU, keys, &eh[2], 1); /* second ehash on key 1 */
    kvt_naive_store(n, NS, 1, KVT_TIER_GPU, keys, NULL, 2);
    kvt_naive_store(n, NS + 1, 1, KVT_TIER_GPU, keys, (const uint64_t[]){21, 22}, 2);
    kvt_naive_speculate(n, NS, 2, keys, 2, 100);
    assert_int_equal(kvt_naive_entries(n), 8);

    kvt_naive_evict(n, NS, keys[0]);
    assert_int_equal(kvt_naive_entries(n), 5);
    assert_int_equal(q(n, NS, keys, 2, out), 0);
    assert_int_equal(q(n, NS, &keys[1], 1, out), 3);
    assert_int_equal(q(n, NS + 1, keys, 2, out), 1); /* other namespace untouched */
    assert_match(&out[0], 1, 2, 2, 0, 0);
    /* both ehashes of pod 0 on key 1 are gone */
    assert_int_equal(kvt_naive_remove(n, 0, KVT_TIER_ALL, eh, 3), 2);
    kvt_naive_evict(n, NS, 12345); /* absent: no-op */
    assert_int_equal(kvt_naive_entries(n), 4);
    kvt_naive_destroy(n);
}

static void test_pods_filter(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    kvt_idx_match_t out[CAP];
    uint64_t keys[] = {1, 2};
    for (uint32_t pod = 0; pod < 6; pod++)
        kvt_naive_store(n, NS, pod * 10, KVT_TIER_GPU, keys, NULL, 1 + pod % 2);
    uint32_t pods[] = {30, 10, 30, 7, 9999, KVT_NAIVE_MAX_PODS - 1, 4000000000u, 10, 50};
    size_t r = kvt_naive_query(n, NS, keys, 2, pods, sizeof(pods) / sizeof(pods[0]), out, CAP);
    assert_int_equal(r, 3);
    assert_match(&out[0], 10, 2, 2, 0, 0);
    assert_match(&out[1], 30, 2, 2, 0, 0);
    assert_match(&out[2], 50, 2, 2, 0, 0);
    /* an empty filter admits nobody */
    assert_int_equal(kvt_naive_query(n, NS, keys, 2, pods, 0, out, CAP), 0);
    /* no filter: all six, ascending */
    assert_int_equal(q(n, NS, keys, 2, out), 6);
    for (uint32_t i = 0; i < 6; i++)
        assert_match(&out[i], i * 10, 1 + i % 2, 1 + i % 2, 0, 0);
    /* cap: the lowest pod ids */
    assert_int_equal(kvt_naive_query(n, NS, keys, 2, NULL, 0, out, 2), 2);
    assert_int_equal(out[0].pod, 0);
    assert_int_equal(out[1].pod, 10);
    kvt_naive_destroy(n);
}

/* Every way of emptying the model gives the bytes back. */
static void test_bytes_back_to_initial(void **state)
{
    (void)state;
    kvt_naive_t *n = mk();
    const uint64_t initial = kvt_naive_bytes(n);
    enum { K = 3000 };
    static uint64_t keys[K], eh[K];
    for (size_t i = 0; i < K; i++) {
        keys[i] = i * 0x9e3779b97f4a7c15ull;
        eh[i] = ~keys[i];
    }
    /* remove */
    kvt_naive_store(n, NS, 3, KVT_TIER_GPU, keys, eh, K);
    kvt_naive_store(n, NS, 700, KVT_TIER_CPU, keys, NULL, K);
    assert_true(kvt_naive_bytes(n) > initial + 2 * K * 16);
    assert_int_equal(kvt_naive_entries(n), 2 * K);
    assert_int_equal(kvt_naive_remove(n, 3, KVT_TIER_GPU, eh, K), 0);
    assert_int_equal(kvt_naive_remove(n, 700, KVT_TIER_ALL, keys, K), 0);
    assert_int_equal(kvt_naive_entries(n), 0);
    assert_int_equal(kvt_naive_bytes(n), initial);
    /* clear */
    kvt_naive_store(n, NS, 3, KVT_TIER_GPU, keys, eh, K);
    kvt_naive_speculate(n, NS, 3, keys + K / 2, K / 2, 10);
    kvt_naive_speculate(n, NS, 5, keys, K, 10);
    kvt_naive_pod_clear(n, 3, KVT_TIER_ALL);
    kvt_naive_pod_clear(n, 5, KVT_TIER_ALL);
    assert_int_equal(kvt_naive_bytes(n), initial);
    /* expiry */
    kvt_naive_speculate(n, NS, 5, keys, K, 10);
    kvt_naive_speculate(n, NS, 6, keys, K, 20);
    kvt_naive_advance(n, 10);
    assert_int_equal(kvt_naive_entries(n), K);
    kvt_naive_advance(n, 30);
    assert_int_equal(kvt_naive_entries(n), 0);
    assert_int_equal(kvt_naive_bytes(n), initial);
    /* evict */
    kvt_naive_store(n, NS, 1, KVT_TIER_GPU, keys, eh, K);
    kvt_naive_store(n, NS, 2, KVT_TIER_DISK, keys, NULL, K);
    kvt_naive_speculate(n, NS, 4, keys, K, 10);
    for (size_t i = 0; i < K; i++)
        kvt_naive_evict(n, NS, keys[i]);
    assert_int_equal(kvt_naive_entries(n), 0);
    assert_int_equal(kvt_naive_bytes(n), initial);
    /* remaps */
    kvt_naive_store(n, NS, 1, KVT_TIER_GPU, keys, eh, K);
    kvt_naive_store(n, NS, 1, KVT_TIER_GPU, eh, eh, K);
    assert_int_equal(kvt_naive_entries(n), K);
    assert_int_equal(kvt_naive_remove(n, 1, KVT_TIER_GPU, eh, K), 0);
    assert_int_equal(kvt_naive_bytes(n), initial);
    kvt_naive_destroy(n);
}

/* ---- randomized comparison with a brute-force model ---- */

enum { BP = 6, BNS = 2, BK = 10, BH = 12, BLEN = 6 };

typedef struct bmap {
    int valid;
    unsigned ns, key, tiers;
} bmap_t;

typedef struct brute {
    bmap_t map[BP][BH];
    struct {
        int valid;
        uint64_t expiry;
    } spec[BP][BNS][BK];
    uint64_t now;
} brute_t;

/* Value tables: index -> u64, covering 0 and UINT64_MAX. */
static const uint64_t key_val[BK] = {0, UINT64_MAX, 1, 2, 3, 0x8000000000000000ull, 42, 43, 44, 7};
static const uint64_t eh_val[BH] = {UINT64_MAX, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

static unsigned brute_tiers(const brute_t *b, unsigned pod, unsigned ns, unsigned key)
{
    unsigned t = 0;
    for (unsigned h = 0; h < BH; h++)
        if (b->map[pod][h].valid && b->map[pod][h].ns == ns && b->map[pod][h].key == key)
            t |= b->map[pod][h].tiers;
    return t;
}

static uint64_t brute_blocks(const brute_t *b)
{
    uint64_t n = 0;
    for (unsigned ns = 0; ns < BNS; ns++) {
        for (unsigned k = 0; k < BK; k++) {
            int held = 0;
            for (unsigned p = 0; p < BP; p++)
                held |= brute_tiers(b, p, ns, k) != 0 || b->spec[p][ns][k].valid;
            n += held;
        }
    }
    return n;
}

static uint64_t brute_entries(const brute_t *b)
{
    uint64_t e = 0;
    for (unsigned p = 0; p < BP; p++)
        for (unsigned ns = 0; ns < BNS; ns++)
            for (unsigned k = 0; k < BK; k++)
                e += brute_tiers(b, p, ns, k) != 0 || b->spec[p][ns][k].valid;
    return e;
}

static kvt_rng_t g_rng; /* started by test_random_vs_brute() */

static unsigned rn(unsigned bound)
{
    return (unsigned)kvt_rng_below(&g_rng, bound);
}

static void test_random_vs_brute(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 0x1234567u);
    kvt_naive_t *n = mk();
    const uint64_t initial = kvt_naive_bytes(n);
    static brute_t b;
    memset(&b, 0, sizeof(b));
    kvt_idx_match_t out[CAP];
    for (int op = 0; op < 200000; op++) {
        unsigned pod = rn(BP), ns = rn(BNS), len = 1 + rn(BLEN), tier = 1u << rn(3);
        unsigned ki[BLEN], hi[BLEN];
        uint64_t keys[BLEN], ehs[BLEN];
        for (unsigned i = 0; i < len; i++) {
            ki[i] = rn(BK);
            hi[i] = rn(BH);
            keys[i] = key_val[ki[i]];
            ehs[i] = eh_val[hi[i]];
        }
        unsigned kind = rn(100);
        if (kind < 35) { /* store */
            kvt_naive_store(n, ns, pod, tier, keys, ehs, len);
            for (unsigned i = 0; i < len; i++) {
                bmap_t *m = &b.map[pod][hi[i]];
                if (m->valid && (m->ns != ns || m->key != ki[i]))
                    m->valid = 0;
                if (!m->valid) {
                    m->valid = 1;
                    m->ns = ns;
                    m->key = ki[i];
                    m->tiers = 0;
                }
                m->tiers |= tier;
                b.spec[pod][ns][ki[i]].valid = 0;
            }
        } else if (kind < 42) { /* store_by_ehash */
            size_t unres = 0;
            for (unsigned i = 0; i < len; i++) {
                if (b.map[pod][hi[i]].valid)
                    b.map[pod][hi[i]].tiers |= tier;
                else
                    unres++;
            }
            assert_int_equal(kvt_naive_store_by_ehash(n, pod, tier, ehs, len), unres);
        } else if (kind < 57) { /* remove */
            unsigned tiers = 1 + rn(7);
            size_t unres = 0;
            for (unsigned i = 0; i < len; i++) {
                if (!b.map[pod][hi[i]].valid) {
                    unres++;
                    continue;
                }
                b.map[pod][hi[i]].tiers &= ~tiers;
                if (b.map[pod][hi[i]].tiers == 0)
                    b.map[pod][hi[i]].valid = 0;
            }
            assert_int_equal(kvt_naive_remove(n, pod, tiers, ehs, len), unres);
        } else if (kind < 59) { /* clear */
            unsigned tiers = rn(2) ? KVT_TIER_ALL : 1 + rn(7);
            kvt_naive_pod_clear(n, pod, tiers);
            for (unsigned h = 0; h < BH; h++) {
                b.map[pod][h].tiers &= ~tiers;
                if (b.map[pod][h].tiers == 0)
                    b.map[pod][h].valid = 0;
            }
            if (tiers == KVT_TIER_ALL)
                memset(b.spec[pod], 0, sizeof(b.spec[pod]));
        } else if (kind < 69) { /* speculate */
            uint32_t ttl = rn(50);
            kvt_naive_speculate(n, ns, pod, keys, len, ttl);
            for (unsigned i = 0; i < len; i++) {
                if (brute_tiers(&b, pod, ns, ki[i]) != 0 || b.spec[pod][ns][ki[i]].valid)
                    continue;
                b.spec[pod][ns][ki[i]].valid = 1;
                b.spec[pod][ns][ki[i]].expiry = b.now + ttl;
            }
        } else if (kind < 74) { /* advance */
            uint64_t now = b.now + rn(20);
            if (rn(4) == 0 && b.now >= 3)
                now = b.now - 3; /* backwards: ignored */
            kvt_naive_advance(n, now);
            if (now > b.now) {
                b.now = now;
                for (unsigned p = 0; p < BP; p++)
                    for (unsigned s = 0; s < BNS; s++)
                        for (unsigned k = 0; k < BK; k++)
                            if (b.spec[p][s][k].valid && b.spec[p][s][k].expiry <= now)
                                b.spec[p][s][k].valid = 0;
            }
        } else if (kind < 76) { /* evict */
            kvt_naive_evict(n, ns, keys[0]);
            for (unsigned p = 0; p < BP; p++) {
                for (unsigned h = 0; h < BH; h++)
                    if (b.map[p][h].valid && b.map[p][h].ns == ns && b.map[p][h].key == ki[0])
                        b.map[p][h].valid = 0;
                b.spec[p][ns][ki[0]].valid = 0;
            }
        } else { /* query, sometimes with a pods filter */
            uint32_t filt[4];
            unsigned nf = 0, use_filter = rn(3) == 0;
            if (use_filter) {
                nf = rn(5);
                for (unsigned i = 0; i < nf; i++)
                    filt[i] = rn(BP + 2); /* BP, BP+1: unknown */
            }
            size_t r = kvt_naive_query(n, ns, keys, len, use_filter ? filt : NULL, nf, out, CAP);
            size_t j = 0;
            for (unsigned p = 0; p < BP; p++) {
                int admitted = !use_filter;
                for (unsigned i = 0; i < nf; i++)
                    admitted |= filt[i] == p;
                if (!admitted)
                    continue;
                uint32_t m = 0, g = 0, c = 0, d = 0;
                while (m < len) {
                    unsigned t = brute_tiers(&b, p, ns, ki[m]);
                    int sp = b.spec[p][ns][ki[m]].valid;
                    if (t == 0 && !sp)
                        break;
                    if ((t & KVT_TIER_GPU) || sp)
                        g++;
                    else if (t & KVT_TIER_CPU)
                        c++;
                    else
                        d++;
                    m++;
                }
                if (m == 0)
                    continue;
                assert_true(j < r);
                assert_match(&out[j], p, m, g, c, d);
                j++;
            }
            assert_int_equal(j, r);
        }
        if (op % 64 == 0) {
            assert_int_equal(kvt_naive_entries(n), brute_entries(&b));
            assert_int_equal(kvt_naive_blocks(n), brute_blocks(&b));
            uint64_t sum = 0;
            for (unsigned p = 0; p < BP; p++)
                sum += kvt_naive_pod_entries(n, p);
            assert_int_equal(sum, kvt_naive_entries(n));
        }
    }
    for (unsigned p = 0; p < BP; p++)
        kvt_naive_pod_clear(n, p, KVT_TIER_ALL);
    assert_int_equal(kvt_naive_entries(n), 0);
    assert_int_equal(kvt_naive_blocks(n), 0);
    assert_int_equal(kvt_naive_bytes(n), initial);
    kvt_naive_destroy(n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_empty),
        cmocka_unit_test(test_store_query_basic),
        cmocka_unit_test(test_gap_stops_run),
        cmocka_unit_test(test_fastest_tier),
        cmocka_unit_test(test_extreme_values),
        cmocka_unit_test(test_ehash_remapped),
        cmocka_unit_test(test_two_ehashes_one_key),
        cmocka_unit_test(test_store_by_ehash_and_remove),
        cmocka_unit_test(test_spec_confirm),
        cmocka_unit_test(test_spec_expiry_no_extend),
        cmocka_unit_test(test_spec_on_held_block),
        cmocka_unit_test(test_clear_gpu_vs_all),
        cmocka_unit_test(test_evict),
        cmocka_unit_test(test_pods_filter),
        cmocka_unit_test(test_bytes_back_to_initial),
        cmocka_unit_test(test_random_vs_brute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
