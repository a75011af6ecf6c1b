/*
 * Unit tests of bench/floor_index, the bench's store-path floor: bad
 * arguments, then random chains on random pods checked against the naive
 * model after every store (entries and blocks), with enough keys that both
 * kinds of table grow many times.
 */
// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include "bench/floor_index.h"
#include "bench/naive_index.h"
#include "tests/support/rng.h"

/* One engine hash per key, as in the bench. */
static uint64_t ehash_of(uint64_t key)
{
    return key * 0x9e3779b97f4a7c15ull + 7;
}

static void test_bad_args(void **state)
{
    (void)state;
    kvt_floor_t *f = NULL;
    assert_int_equal(kvt_floor_create(0, &f), KVT_ERR_INVAL);
    assert_int_equal(kvt_floor_create(4, NULL), KVT_ERR_INVAL);
    assert_int_equal(kvt_floor_create(4, &f), KVT_OK);
    uint64_t k = 1, e = 2;
    assert_int_equal(kvt_floor_store(f, 4, &k, &e, 1), KVT_ERR_INVAL);
    assert_int_equal(kvt_floor_store(f, 0, NULL, &e, 1), KVT_ERR_INVAL);
    assert_int_equal(kvt_floor_store(f, 0, &k, NULL, 1), KVT_ERR_INVAL);
    assert_int_equal(kvt_floor_store(f, 0, NULL, NULL, 0), KVT_OK);
    assert_int_equal(kvt_floor_entries(f), 0);
    assert_int_equal(kvt_floor_blocks(f), 0);
    assert_int_equal(kvt_floor_store(f, 3, &k, &e, 1), KVT_OK);
    assert_int_equal(kvt_floor_store(f, 3, &k, &e, 1), KVT_OK); /* again: no new entry */
    assert_int_equal(kvt_floor_store(f, 1, &k, &e, 1), KVT_OK);
    assert_int_equal(kvt_floor_entries(f), 2);
    assert_int_equal(kvt_floor_blocks(f), 1);
    assert_true(kvt_floor_bytes(f) > 0);
    kvt_floor_destroy(f);
    kvt_floor_destroy(NULL);
}

/*
 * Chains are walks down a random tree (key k's parent is k / 4), so shared
 * prefixes, repeated stores and long chains all occur; 48 pods, keys up to 2^20.
 */
static void test_random_vs_naive(void **state)
{
    (void)state;
    enum { PODS = 48, ROUNDS = 20000, KEYS = 1 << 20, MAXLEN = 40 };
    kvt_floor_t *f = NULL;
    kvt_naive_t *nv = NULL;
    assert_int_equal(kvt_floor_create(PODS, &f), KVT_OK);
    assert_int_equal(kvt_naive_create(&nv), KVT_OK);
    kvt_rng_t rng;
    kvt_rng_init(&rng, 0x243f6a8885a308d3ull);
    uint64_t keys[MAXLEN], eh[MAXLEN];
    for (int r = 0; r < ROUNDS; r++) {
        uint32_t pod = (uint32_t)kvt_rng_below(&rng, PODS);
        uint64_t leaf = 1 + kvt_rng_below(&rng, KEYS);
        size_t n = 0;
        uint64_t path[MAXLEN];
        for (uint64_t k = leaf; k != 0 && n < MAXLEN; k /= 4)
            path[n++] = k;
        /* root first; sometimes only a prefix of the path */
        size_t len = kvt_rng_below(&rng, 4) == 0 ? 1 + kvt_rng_below(&rng, n) : n;
        for (size_t i = 0; i < len; i++) {
            keys[i] = path[n - 1 - i] * 0x2545f4914f6cdd1dull; /* spread over u64 */
            eh[i] = ehash_of(keys[i]);
        }
        assert_int_equal(kvt_floor_store(f, pod, keys, eh, len), KVT_OK);
        kvt_naive_store(nv, 0, pod, KVT_TIER_GPU, keys, eh, len);
        assert_int_equal(kvt_floor_entries(f), kvt_naive_entries(nv));
        assert_int_equal(kvt_floor_blocks(f), kvt_naive_blocks(nv));
    }
    assert_true(kvt_floor_blocks(f) > 20000); /* the key table grew many times */
    kvt_floor_destroy(f);
    kvt_naive_destroy(nv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_random_vs_naive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
