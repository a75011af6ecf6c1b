/* common/grow: kvt_grow() against the doubling rule it promises, contents kept, overflow refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/grow.h"
#include "tests/support/rng.h"

static void test_rule_and_contents(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 1);
    for (int round = 0; round < 200; round++) {
        uint32_t *a = NULL;
        size_t cap = 0, n = 0, first = 1 + kvt_rng_below(&rng, 64);
        for (int step = 0; step < 50; step++) {
            size_t need = n + 1 + kvt_rng_below(&rng, 300);
            size_t want = cap;
            if (need > cap) { /* the reference: double from first until it fits */
                want = cap ? cap : first;
                while (want < need)
                    want *= 2;
            }
            assert_true(kvt_grow(&a, &cap, need, sizeof(*a), first));
            assert_int_equal(cap, want);
            for (size_t i = 0; i < n; i++) /* what was there is kept */
                assert_int_equal(a[i], (uint32_t)(i * 2654435761u));
            for (; n < need; n++)
                a[n] = (uint32_t)(n * 2654435761u);
        }
        /* no growth needed: the same array */
        uint32_t *same = a;
        assert_true(kvt_grow(&a, &cap, cap, sizeof(*a), first));
        assert_ptr_equal(a, same);
        free(a);
    }
}

static void test_overflow_refused(void **state)
{
    (void)state;
    uint64_t *a = NULL;
    size_t cap = 0;
    assert_true(kvt_grow(&a, &cap, 4, sizeof(*a), 0)); /* first 0 starts at 1 */
    assert_int_equal(cap, 4);
    a[3] = 42;
    uint64_t *kept = a;
    /* elements times size past SIZE_MAX, and a count that cannot double there */
    assert_false(kvt_grow(&a, &cap, SIZE_MAX / 4, sizeof(*a), 0));
    assert_false(kvt_grow(&a, &cap, SIZE_MAX, 1, 0));
    assert_ptr_equal(a, kept);
    assert_int_equal(cap, 4);
    assert_int_equal(a[3], 42);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_and_contents),
        cmocka_unit_test(test_overflow_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
