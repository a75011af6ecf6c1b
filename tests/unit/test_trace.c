/* bench/trace: the Mooncake trace reader (also fuzzed: tests/fuzz/fuzz_trace.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "bench/trace.h"

static kvt_trace_t *parse_ok(const char *text)
{
    kvt_trace_t *t = NULL;
    char err[256] = "";
    assert_int_equal(kvt_trace_parse(text, strlen(text), &t, err, sizeof(err)), KVT_OK);
    return t;
}

static void test_good(void **state)
{
    (void)state;
    kvt_trace_t *t = parse_ok("{\"timestamp\": 0, \"input_length\": 1030, \"output_length\": 5,"
                              " \"hash_ids\": [0, 1, 2]}\n"
                              "\n"
                              "{\"hash_ids\": [0, 7], \"output_length\": 1, \"x\": {\"y\": [null]},"
                              " \"input_length\": 600, \"timestamp\": 12}\n");
    assert_int_equal(t->nreqs, 2);
    assert_int_equal(t->nids, 5);
    assert_int_equal(t->max_blocks, 3);
    assert_int_equal(t->reqs[1].timestamp_ms, 12);
    assert_int_equal(t->reqs[1].nblocks, 2);
    assert_int_equal(t->reqs[1].hash_ids[1], 7);
    kvt_trace_free(t);
}

/* Every request without hash ids: no id array at all (was undefined behaviour). */
static void test_all_empty(void **state)
{
    (void)state;
    kvt_trace_t *t = parse_ok("{\"hash_ids\": [], \"timestamp\": 5, \"input_length\": 0,"
                              " \"output_length\": 1}\n");
    assert_int_equal(t->nreqs, 1);
    assert_int_equal(t->nids, 0);
    assert_int_equal(t->reqs[0].nblocks, 0);
    kvt_trace_free(t);
}

static void test_bad(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3, \"hash_ids\": [1,]}\n",
        "{\"timestamp\": -1, \"input_length\": 2, \"output_length\": 3, \"hash_ids\": [1]}\n",
        "{\"timestamp\": 1.5, \"input_length\": 2, \"output_length\": 3, \"hash_ids\": [1]}\n",
        "{\"timestamp\": 1, \"input_length\": 4294967296, \"output_length\": 3, \"hash_ids\": []}\n",
        "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3}\n",
        "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3, \"hash_ids\": [1]} x\n",
        "{\"timestamp\": 1",
        "[1, 2, 3]\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvt_trace_t *t = NULL;
        char err[256] = "";
        kvt_status_t st = kvt_trace_parse(bad[i], strlen(bad[i]), &t, err, sizeof(err));
        assert_int_equal(st, KVT_ERR_PARSE);
        assert_null(t);
        assert_non_null(strstr(err, "line 1"));
    }
    /* the error names the right line */
    const char *two = "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3,"
                      " \"hash_ids\": [1]}\n{\"timestamp\": }\n";
    kvt_trace_t *t = NULL;
    char err[256] = "";
    assert_int_equal(kvt_trace_parse(two, strlen(two), &t, err, sizeof(err)), KVT_ERR_PARSE);
    assert_non_null(strstr(err, "line 2"));
    assert_int_equal(kvt_trace_load("/nonexistent/trace.jsonl", &t, err, sizeof(err)),
                     KVT_ERR_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_all_empty),
        cmocka_unit_test(test_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
