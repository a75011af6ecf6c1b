/*
 * kvindex when an allocation fails: the error is reported as it is and
 * nothing is left half done. The program is linked with -Wl,--wrap=malloc
 * and -Wl,--wrap=calloc (tests/CMakeLists.txt), so the index's allocations
 * (statically linked) go through the wrappers below, which fail the next one
 * of a chosen size. White box: sizes come from the index's private headers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kvindex/index.h"
#include "kvindex/index_writer_int.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t m, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t m, size_t n);

static size_t fail_size; /* the next allocation of this many bytes fails; 0: none */
static unsigned fail_count;

static bool fail_now(size_t n)
{
    if (fail_size == 0 || n != fail_size)
        return false;
    fail_size = 0;
    fail_count++;
    return true;
}

void *__wrap_malloc(size_t n)
{
    return fail_now(n) ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t m, size_t n)
{
    return fail_now(m * n) ? NULL : __real_calloc(m, n);
}

/*
 * With a budget, an alias record the allocator cannot give is KVT_ERR_NO_MEM,
 * as without one; it used to be reported as the budget being full (KVT_OK,
 * the block counted dropped).
 */
static void test_alias_no_mem_is_no_mem(void **state)
{
    (void)state;
    kvt_idx_config_t cfg = {.budget_bytes = 64u << 20};
    kvt_idx_t *idx;
    uint32_t ns, a, b;
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &a), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "b", 0, &b), KVT_OK);
    uint64_t k = 42, eh = 43; /* b hashes the block differently: an alias */
    assert_int_equal(kvt_idx_store(idx, ns, a, KVT_TIER_GPU, NULL, &k, NULL, 1), KVT_OK);
    fail_size = 64 * sizeof(kvt_alias_t); /* the alias array's first allocation */
    fail_count = 0;
    assert_int_equal(kvt_idx_store(idx, ns, b, KVT_TIER_GPU, NULL, &k, &eh, 1), KVT_ERR_NO_MEM);
    assert_int_equal(fail_count, 1);
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    assert_int_equal(st.dropped, 0);
    assert_int_equal(kvt_idx_pod_entries(idx, b), 0);
    /* memory back: it works */
    assert_int_equal(kvt_idx_store(idx, ns, b, KVT_TIER_GPU, NULL, &k, &eh, 1), KVT_OK);
    assert_int_equal(kvt_idx_pod_entries(idx, b), 1);
    kvt_idx_destroy(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alias_no_mem_is_no_mem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
