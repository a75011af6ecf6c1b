/*
 * kvindex when an allocation fails: the error is reported as it is and
 * nothing is left half done. The program is linked with -Wl,--wrap=malloc
 * and -Wl,--wrap=calloc (tests/CMakeLists.txt), so the index's allocations
 * (statically linked) go through the wrappers below, which fail the next one
 * of a chosen size. White box: sizes come from kvindex/index_test.h.
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
#include "kvindex/index_test.h"

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

static uint64_t bytes_of(kvt_idx_t *idx)
{
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    return st.bytes;
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
    fail_size = kvt_idx_test_alias_bytes(64); /* the alias array's first allocation */
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

/*
 * Giving back node slabs needs a new (shorter) node directory. When it cannot
 * be allocated nothing changes: the nodes stay where they are, the free ones
 * are reused, and no chunk is appended for them (the slab's node count used
 * to be cut while the directory kept every chunk, so every later chunk
 * boundary appended a chunk that already existed). The next trim gives them
 * back.
 */
static void test_node_trim_no_mem_changes_nothing(void **state)
{
    (void)state;
    kvt_idx_t *idx;
    uint32_t ns, pod;
    assert_int_equal(kvt_idx_create(NULL, &idx), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &ns), KVT_OK);
    const uint64_t base = bytes_of(idx);
    enum { CHAINS = 100, LEN = 100 }; /* 10,000 nodes: three node chunks */
    uint64_t k[LEN];
    for (int round = 0; round < 3; round++) {
        assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_OK);
        for (uint64_t c = 0; c < CHAINS; c++) {
            for (uint64_t i = 0; i < LEN; i++)
                k[i] = (c << 32) ^ (i * 0x9e3779b97f4a7c15ull) ^ 5;
            assert_int_equal(kvt_idx_store(idx, ns, pod, KVT_TIER_GPU, NULL, k, NULL, LEN), KVT_OK);
        }
        static uint64_t full;
        if (round == 0)
            full = bytes_of(idx);
        else
            assert_int_equal(bytes_of(idx), full); /* the same nodes, chunks and tables */
        /* the first drop cannot allocate the trimmed directory; the second can */
        fail_size = round == 0 ? kvt_idx_test_dir_min_bytes() : 0;
        fail_count = 0;
        assert_int_equal(kvt_idx_pod_drop(idx, pod), KVT_OK);
        assert_int_equal(fail_count, round == 0 ? 1 : 0);
        fail_size = 0;
        if (round > 0)
            assert_int_equal(bytes_of(idx), base); /* every slab came back */
        /* (kvt_idx_advance() would try the trim again: the next round stores first) */
    }
    kvt_idx_destroy(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alias_no_mem_is_no_mem),
        cmocka_unit_test(test_node_trim_no_mem_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
