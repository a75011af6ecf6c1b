/* common/heap: KVT_HEAP_DEFINE's heaps against naive references (a linear scan, qsort). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/heap.h"
#include "tests/support/rng.h"

/* A max-heap of ints, its order given by a macro. */
#define INT_GREATER(a, b) (*(a) > *(b))
KVT_HEAP_DEFINE(imax, int, INT_GREATER)

/* A min-heap of structs on key, its order given by a function; id tells equal keys apart. */
typedef struct item {
    int key;
    uint32_t id;
} item_t;

static bool item_less(const item_t *a, const item_t *b)
{
    return a->key < b->key;
}

KVT_HEAP_DEFINE(imin, item_t, item_less)

enum { MAXN = 300 };

static void assert_imax_heap(const int *a, size_t n)
{
    for (size_t i = 1; i < n; i++)
        assert_true(a[(i - 1) / 2] >= a[i]);
}

static void assert_imin_heap(const item_t *a, size_t n)
{
    for (size_t i = 1; i < n; i++)
        assert_true(a[(i - 1) / 2].key <= a[i].key);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_item_key_id(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    if (x->key != y->key)
        return (x->key > y->key) - (x->key < y->key);
    return (x->id > y->id) - (x->id < y->id);
}

/* The reference max-heap: removes and returns the largest value of @ref[0..*n_p), *n_p > 0. */
static int ref_pop_max(int *ref, size_t *n_p)
{
    size_t m = 0;
    for (size_t i = 1; i < *n_p; i++)
        if (ref[i] > ref[m])
            m = i;
    int v = ref[m];
    ref[m] = ref[--*n_p];
    return v;
}

/* Random pushes and pops (few distinct values, so many duplicates), each pop checked against a
 * linear scan of the same multiset. */
static void test_push_pop_random(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 1);
    int heap[MAXN], ref[MAXN];
    for (int round = 0; round < 400; round++) {
        size_t n = 0, nref = 0;
        int range = 1 + (int)kvt_rng_below(&rng, round % 2 ? 8 : 1000);
        unsigned push_pct = 30 + (unsigned)kvt_rng_below(&rng, 50);
        for (int step = 0; step < 600; step++) {
            if (n < MAXN && (n == 0 || kvt_rng_below(&rng, 100) < push_pct)) {
                int v = (int)kvt_rng_below(&rng, (uint64_t)range) - range / 2;
                imax_push(heap, &n, v);
                ref[nref++] = v;
            } else {
                int want = ref_pop_max(ref, &nref);
                assert_int_equal(imax_pop(heap, &n), want);
            }
            assert_int_equal(n, nref);
            assert_imax_heap(heap, n);
        }
        while (n > 0) { /* drain: the multiset runs out with the heap */
            int want = ref_pop_max(ref, &nref);
            assert_int_equal(imax_pop(heap, &n), want);
        }
        assert_int_equal(nref, 0);
    }
}

/* make then pop everything gives the values largest first; sort gives qsort's ascending order. */
static void test_make_pop_all_and_sort(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 2);
    int heap[MAXN], sorted[MAXN], want[MAXN];
    for (int round = 0; round < 2000; round++) {
        size_t n = kvt_rng_below(&rng, MAXN + 1);
        int range = 1 + (int)kvt_rng_below(&rng, round % 2 ? 4 : 100000);
        for (size_t i = 0; i < n; i++)
            want[i] = (int)kvt_rng_below(&rng, (uint64_t)range);
        memcpy(heap, want, n * sizeof(int));
        memcpy(sorted, want, n * sizeof(int));
        qsort(want, n, sizeof(int), cmp_int);

        imax_make(heap, n);
        assert_imax_heap(heap, n);
        for (size_t k = n; k-- > 0;) {
            size_t left = k + 1;
            assert_int_equal(imax_pop(heap, &left), want[k]);
            assert_int_equal(left, k);
        }

        imax_sort(sorted, n);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(sorted[i], want[i]);
    }
}

/* A struct min-heap: pops in key order, every item once; up and down restore the heap after a
 * key changes in place; sort ends with the largest key first (the first popped ends last). */
static void test_struct_min_order(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 3);
    item_t heap[MAXN], all[MAXN];
    for (int round = 0; round < 1000; round++) {
        size_t n = 0, total = 1 + kvt_rng_below(&rng, MAXN);
        int range = 1 + (int)kvt_rng_below(&rng, round % 2 ? 6 : 1000);
        for (size_t i = 0; i < total; i++) {
            all[i] = (item_t){(int)kvt_rng_below(&rng, (uint64_t)range), (uint32_t)i};
            imin_push(heap, &n, all[i]);
            assert_imin_heap(heap, n);
        }
        /* change keys in place, then up or down as the change asks */
        for (int c = 0; c < 20; c++) {
            size_t i = kvt_rng_below(&rng, n);
            int old = heap[i].key;
            heap[i].key = (int)kvt_rng_below(&rng, (uint64_t)range);
            all[heap[i].id].key = heap[i].key;
            if (heap[i].key < old)
                imin_up(heap, i);
            else
                imin_down(heap, n, i);
            assert_imin_heap(heap, n);
        }
        item_t copy[MAXN];
        memcpy(copy, heap, n * sizeof(item_t));
        qsort(all, total, sizeof(item_t), cmp_item_key_id);

        bool seen[MAXN] = {false};
        int prev = INT32_MIN;
        for (size_t k = 0; k < total; k++) {
            item_t it = imin_pop(heap, &n);
            assert_imin_heap(heap, n);
            assert_int_equal(it.key, all[k].key);
            assert_true(it.key >= prev);
            assert_false(seen[it.id]);
            seen[it.id] = true;
            prev = it.key;
        }
        assert_int_equal(n, 0);

        imin_sort(copy, total);
        for (size_t k = 0; k < total; k++)
            assert_int_equal(copy[k].key, all[total - 1 - k].key);
    }
}

/* n = 0, 1, 2: nothing read or written past n, and both orders of two. */
static void test_small(void **state)
{
    (void)state;
    int a[3] = {7, 8, 9};
    imax_make(a, 0);
    imax_sort(a, 0);
    imax_make(a, 1);
    imax_sort(a, 1);
    assert_int_equal(a[0], 7);
    assert_int_equal(a[1], 8);

    size_t n = 0;
    imax_push(a, &n, 5);
    assert_int_equal(n, 1);
    assert_int_equal(a[0], 5);
    assert_int_equal(imax_pop(a, &n), 5);
    assert_int_equal(n, 0);

    int lo_hi[3] = {1, 2, 99}, hi_lo[3] = {2, 1, 99};
    imax_sort(lo_hi, 2);
    imax_sort(hi_lo, 2);
    assert_int_equal(lo_hi[0], 1);
    assert_int_equal(lo_hi[1], 2);
    assert_int_equal(hi_lo[0], 1);
    assert_int_equal(hi_lo[1], 2);
    assert_int_equal(lo_hi[2], 99);
    assert_int_equal(hi_lo[2], 99);

    imax_make(lo_hi, 2);
    assert_int_equal(lo_hi[0], 2);
    n = 2;
    assert_int_equal(imax_pop(lo_hi, &n), 2);
    assert_int_equal(imax_pop(lo_hi, &n), 1);
    assert_int_equal(n, 0);

    item_t it[2] = {{3, 0}, {1, 1}};
    imin_make(it, 2);
    assert_int_equal(it[0].key, 1);
    n = 0;
    item_t one[1];
    imin_push(one, &n, (item_t){4, 2});
    imin_up(one, 0);
    imin_down(one, 1, 0);
    assert_int_equal(imin_pop(one, &n).id, 2);
    assert_int_equal(n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_pop_random),
        cmocka_unit_test(test_make_pop_all_and_sort),
        cmocka_unit_test(test_struct_min_order),
        cmocka_unit_test(test_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
