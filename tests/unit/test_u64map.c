/* common/u64map: random puts, deletes and sweeps against a naive array of (key, value) pairs;
 * keys drawn from small sets (and their multiples of 2^32, which share low bits) so probe runs
 * collide, wrap and shift back on deletion. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/u64map.h"
#include "tests/support/rng.h"

#define REF_MAX 4096

typedef struct ref {
    uint64_t key[REF_MAX];
    uint8_t val[REF_MAX];
    size_t n;
} ref_t;

static size_t ref_find(const ref_t *r, uint64_t key)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->key[i] == key)
            return i;
    return r->n;
}

static void ref_put(ref_t *r, uint64_t key, uint8_t val)
{
    size_t i = ref_find(r, key);
    if (val == 0) {
        if (i < r->n) {
            r->key[i] = r->key[r->n - 1];
            r->val[i] = r->val[r->n - 1];
            r->n--;
        }
    } else if (i < r->n) {
        r->val[i] = val;
    } else {
        r->key[r->n] = key;
        r->val[r->n++] = val;
    }
}

/* Every reference entry is in the map with its value, and the map counts no more. */
static void check_same(const kvt_u64map_t *m, const ref_t *r)
{
    assert_int_equal(m->n, r->n);
    for (size_t i = 0; i < r->n; i++)
        assert_int_equal(kvt_u64map_get(m, r->key[i]), r->val[i]);
    size_t live = 0;
    for (size_t i = 0; i < m->cap; i++)
        live += m->vals[i] != 0;
    assert_int_equal(live, r->n);
}

static uint64_t draw_key(kvt_rng_t *rng, unsigned universe)
{
    uint64_t k = kvt_rng_below(rng, universe);
    switch (kvt_rng_below(rng, 3)) {
    case 0: return k;
    case 1: return k << 32; /* low bits all equal */
    default: return ~k;     /* UINT64_MAX and its neighbours */
    }
}

/* The sweep's callback: keeps the entries whose key is odd (value + 1, at most 255), drops
 * the even ones from the map and the reference alike; counts the visits per key. */
typedef struct sweep_arg {
    ref_t *ref;
    size_t visits;
} sweep_arg_t;

static uint8_t sweep_fn(void *arg, uint64_t key, uint8_t val)
{
    sweep_arg_t *a = arg;
    a->visits++;
    size_t i = ref_find(a->ref, key);
    assert_true(i < a->ref->n);
    assert_int_equal(a->ref->val[i], val);
    uint8_t nv = (key & 1) ? (uint8_t)(val == 255 ? 255 : val + 1) : 0;
    ref_put(a->ref, key, nv);
    return nv;
}

static void test_random_against_reference(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 7);
    static ref_t ref;
    for (int round = 0; round < 60; round++) {
        kvt_u64map_t m = {0};
        ref.n = 0;
        unsigned universe = 8 + (unsigned)kvt_rng_below(&rng, 1200);
        size_t cursor = 0;
        assert_int_equal(kvt_u64map_get(&m, 5), 0);
        for (int step = 0; step < 3000; step++) {
            unsigned op = (unsigned)kvt_rng_below(&rng, 10);
            uint64_t k = draw_key(&rng, universe);
            if (op < 6) {
                uint8_t v = (uint8_t)(1 + kvt_rng_below(&rng, 255));
                assert_true(kvt_u64map_put(&m, k, v));
                ref_put(&ref, k, v);
            } else if (op < 9) {
                assert_true(kvt_u64map_put(&m, k, 0));
                ref_put(&ref, k, 0);
            } else {
                sweep_arg_t a = {.ref = &ref};
                size_t before = m.n;
                size_t max = 1 + (size_t)kvt_rng_below(&rng, 2 * m.cap + 2);
                size_t v = kvt_u64map_sweep(&m, &cursor, max, sweep_fn, &a);
                assert_int_equal(v, a.visits);
                assert_true(m.n <= before);
            }
            size_t at = ref_find(&ref, k);
            assert_int_equal(kvt_u64map_get(&m, k), at < ref.n ? ref.val[at] : 0);
            if (step % 97 == 0)
                check_same(&m, &ref);
        }
        check_same(&m, &ref);
        /* a sweep over the whole table visits every entry at least once */
        sweep_arg_t a = {.ref = &ref};
        size_t n = m.n;
        kvt_u64map_sweep(&m, &cursor, m.cap ? m.cap : 1, sweep_fn, &a);
        assert_true(a.visits >= n);
        check_same(&m, &ref);
        for (size_t i = 0; i < ref.n; i++)
            assert_true(ref.key[i] & 1); /* every even key went */
        kvt_u64map_free(&m);
        assert_int_equal(m.n, 0);
        assert_null(m.keys);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
