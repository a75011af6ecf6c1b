/* tiers/slots: the allocator against a naive reference (one bool per slot) under random
 * alloc/free/take, the first allocation order, refusals that change nothing, n = 0 and 1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/rng.h"
#include "tiers/tiers_test.h"

/* The allocator agrees with @used[0..n) and its stack and index agree with each other. */
static void check(const kvt_slots_t *s, const bool *used, uint32_t n)
{
    uint32_t nfree = 0;
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(kvt_slots_used(s, i), used[i]);
        if (!used[i]) {
            nfree++;
            assert_true(s->pos[i] < s->nfree);
            assert_int_equal(s->free[s->pos[i]], i);
        }
    }
    assert_int_equal(s->nfree, nfree);
    assert_false(kvt_slots_used(s, n)); /* out of range is never used */
    assert_false(kvt_slots_used(s, KVT_SLOT_NONE));
}

/* A copy of the allocator's state, to show a refused call changed nothing. */
typedef struct snap {
    uint32_t nfree;
    uint32_t *free, *pos;
} snap_t;

static void snap_take(snap_t *sn, const kvt_slots_t *s)
{
    sn->nfree = s->nfree;
    memcpy(sn->free, s->free, s->n * sizeof(uint32_t));
    memcpy(sn->pos, s->pos, s->n * sizeof(uint32_t));
}

static void snap_same(const snap_t *sn, const kvt_slots_t *s)
{
    assert_int_equal(s->nfree, sn->nfree);
    assert_memory_equal(s->free, sn->free, s->n * sizeof(uint32_t));
    assert_memory_equal(s->pos, sn->pos, s->n * sizeof(uint32_t));
}

static void test_first_order(void **state)
{
    (void)state;
    kvt_slots_t s;
    assert_int_equal(kvt_slots_init(&s, 100), KVT_OK);
    assert_int_equal(s.n, 100);
    assert_int_equal(s.nfree, 100);
    for (uint32_t i = 0; i < 100; i++) {
        assert_false(kvt_slots_used(&s, i));
        assert_int_equal(kvt_slots_alloc(&s), i);
        assert_true(kvt_slots_used(&s, i));
    }
    assert_int_equal(s.nfree, 0);
    assert_int_equal(kvt_slots_alloc(&s), KVT_SLOT_NONE);
    assert_int_equal(kvt_slots_alloc(&s), KVT_SLOT_NONE);
    kvt_slots_cleanup(&s);
    kvt_slots_cleanup(&s); /* twice is harmless */
}

static void test_random_vs_reference(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 1);
    for (int round = 0; round < 200; round++) {
        uint32_t n = 1 + (uint32_t)kvt_rng_below(&rng, round < 20 ? 4 : 200);
        kvt_slots_t s;
        assert_int_equal(kvt_slots_init(&s, n), KVT_OK);
        bool *used = calloc(n, sizeof(*used));
        snap_t sn = {.free = malloc(n * sizeof(uint32_t)), .pos = malloc(n * sizeof(uint32_t))};
        assert_non_null(used);
        assert_non_null(sn.free);
        assert_non_null(sn.pos);
        check(&s, used, n);
        /* phases leaning to alloc, then free, so both full and empty are reached */
        for (int step = 0; step < 1500; step++) {
            bool fill = (step / 150) % 2 == 0;
            uint64_t op = kvt_rng_below(&rng, 10);
            /* mostly in range; sometimes just past it, sometimes far */
            uint32_t slot = (uint32_t)kvt_rng_below(&rng, n + 2);
            if (kvt_rng_below(&rng, 50) == 0)
                slot = kvt_rng_below(&rng, 2) ? KVT_SLOT_NONE : (uint32_t)kvt_rng_next(&rng);
            bool in = slot < n;
            if (op < (fill ? 6u : 2u)) {
                uint32_t got = kvt_slots_alloc(&s);
                bool any = false;
                for (uint32_t i = 0; i < n; i++)
                    any |= !used[i];
                if (!any) {
                    assert_int_equal(got, KVT_SLOT_NONE);
                } else {
                    assert_true(got < n);
                    assert_false(used[got]); /* never a used slot */
                    used[got] = true;
                }
            } else if (op < 8) {
                snap_take(&sn, &s);
                bool ok = kvt_slots_free(&s, slot);
                assert_int_equal(ok, in && used[slot]);
                if (ok)
                    used[slot] = false;
                else
                    snap_same(&sn, &s);
            } else {
                snap_take(&sn, &s);
                bool ok = kvt_slots_take(&s, slot);
                assert_int_equal(ok, in && !used[slot]);
                if (ok)
                    used[slot] = true;
                else
                    snap_same(&sn, &s);
            }
            check(&s, used, n);
        }
        free(sn.free);
        free(sn.pos);
        free(used);
        kvt_slots_cleanup(&s);
    }
}

/* take() of every slot in a random order, then alloc finds none; free of all, then the
 * allocs return each slot once. */
static void test_take_all_free_all(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 2);
    const uint32_t n = 1000;
    uint32_t *order = malloc(n * sizeof(*order));
    bool *seen = calloc(n, sizeof(*seen));
    assert_non_null(order);
    assert_non_null(seen);
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)kvt_rng_below(&rng, i + 1);
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    kvt_slots_t s;
    assert_int_equal(kvt_slots_init(&s, n), KVT_OK);
    for (uint32_t i = 0; i < n; i++) {
        assert_true(kvt_slots_take(&s, order[i]));
        assert_false(kvt_slots_take(&s, order[i]));
        assert_int_equal(s.nfree, n - 1 - i);
    }
    assert_int_equal(kvt_slots_alloc(&s), KVT_SLOT_NONE);
    for (uint32_t i = 0; i < n; i++)
        assert_true(kvt_slots_free(&s, order[i]));
    for (uint32_t i = 0; i < n; i++) {
        uint32_t got = kvt_slots_alloc(&s);
        assert_true(got < n);
        assert_false(seen[got]);
        seen[got] = true;
    }
    assert_int_equal(kvt_slots_alloc(&s), KVT_SLOT_NONE);
    kvt_slots_cleanup(&s);
    free(seen);
    free(order);
}

static void test_empty_and_one(void **state)
{
    (void)state;
    kvt_slots_t s;
    /* n = 0: valid, nothing to allocate, nothing to free or take */
    assert_int_equal(kvt_slots_init(&s, 0), KVT_OK);
    assert_int_equal(s.n, 0);
    assert_int_equal(s.nfree, 0);
    assert_int_equal(kvt_slots_alloc(&s), KVT_SLOT_NONE);
    assert_false(kvt_slots_free(&s, 0));
    assert_false(kvt_slots_take(&s, 0));
    assert_false(kvt_slots_used(&s, 0));
    assert_int_equal(s.nfree, 0);
    kvt_slots_cleanup(&s);

    /* n = 1 */
    assert_int_equal(kvt_slots_init(&s, 1), KVT_OK);
    assert_false(kvt_slots_free(&s, 0)); /* free already */
    assert_int_equal(kvt_slots_alloc(&s), 0);
    assert_true(kvt_slots_used(&s, 0));
    assert_int_equal(kvt_slots_alloc(&s), KVT_SLOT_NONE);
    assert_false(kvt_slots_take(&s, 0)); /* used already */
    assert_false(kvt_slots_free(&s, 1));
    assert_true(kvt_slots_free(&s, 0));
    assert_false(kvt_slots_free(&s, 0)); /* double free */
    assert_int_equal(s.nfree, 1);
    assert_true(kvt_slots_take(&s, 0));
    assert_int_equal(s.nfree, 0);
    assert_int_equal(kvt_slots_alloc(&s), KVT_SLOT_NONE);
    assert_true(kvt_slots_free(&s, 0));
    assert_int_equal(kvt_slots_alloc(&s), 0);
    kvt_slots_cleanup(&s);
}

static void test_too_many(void **state)
{
    (void)state;
    kvt_slots_t s = {.n = 7, .nfree = 3};
    /* KVT_SLOT_NONE is the used mark, so it cannot be a count; *s is left alone */
    assert_int_equal(kvt_slots_init(&s, KVT_SLOT_NONE), KVT_ERR_RANGE);
    assert_int_equal(s.n, 7);
    assert_int_equal(s.nfree, 3);
    assert_null(s.free);
    assert_null(s.pos);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_order),       cmocka_unit_test(test_random_vs_reference),
        cmocka_unit_test(test_take_all_free_all), cmocka_unit_test(test_empty_and_one),
        cmocka_unit_test(test_too_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
