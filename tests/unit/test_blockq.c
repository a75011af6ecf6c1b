/*
 * test_blockq: the block API URL's key and query string (server/blockq.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "server/blockq.h"
#include "tests/support/rng.h"

static void test_keys(void **state)
{
    (void)state;
    uint64_t k = 7;
    assert_true(srv_block_key_parse("0", &k));
    assert_int_equal(k, 0);
    assert_true(srv_block_key_parse("18446744073709551615", &k));
    assert_int_equal(k, UINT64_MAX);
    assert_true(srv_block_key_parse("00000000000000000042", &k));
    assert_int_equal(k, 42);
    const char *bad[] = {"",
                         "18446744073709551616",
                         "99999999999999999999",
                         "-1",
                         "+1",
                         " 1",
                         "1 ",
                         "0x10",
                         "1e3",
                         "abc",
                         "000000000000000000042"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        k = 7;
        assert_false(srv_block_key_parse(bad[i], &k));
        assert_int_equal(k, 7); /* untouched */
    }
    kvt_rng_t r;
    kvt_rng_init(&r, 1);
    for (int i = 0; i < 10000; i++) {
        uint64_t v = kvt_rng_next(&r) >> (kvt_rng_next(&r) % 64);
        char s[32];
        snprintf(s, sizeof(s), "%llu", (unsigned long long)v);
        assert_true(srv_block_key_parse(s, &k));
        assert_int_equal(k, v);
    }
}

static kvt_status_t parse(const char *q, srv_block_query_t *out, char *err, size_t errlen)
{
    return srv_block_query_parse(q, q != NULL ? strlen(q) : 0, out, err, errlen);
}

static void test_queries(void **state)
{
    (void)state;
    srv_block_query_t q;
    char err[128];
    assert_int_equal(parse("model=llama", &q, err, sizeof(err)), KVT_OK);
    assert_string_equal(q.model, "llama");
    assert_string_equal(q.lora, "");
    assert_false(q.durable);
    assert_int_equal(
        parse("durable=1&lora=a%2Fb&model=meta-llama%2FLlama-3.1-8B", &q, err, sizeof(err)),
        KVT_OK);
    assert_string_equal(q.model, "meta-llama/Llama-3.1-8B");
    assert_string_equal(q.lora, "a/b");
    assert_true(q.durable);
    assert_int_equal(parse("model=m&durable=true", &q, err, sizeof(err)), KVT_OK);
    assert_true(q.durable);
    assert_int_equal(parse("model=m&durable=false", &q, err, sizeof(err)), KVT_OK);
    assert_false(q.durable);
    assert_int_equal(parse("model=m&durable=0", &q, err, sizeof(err)), KVT_OK);
    assert_false(q.durable);
    assert_false(q.engine_keys);
    assert_int_equal(parse("keys=engine&model=m", &q, err, sizeof(err)), KVT_OK);
    assert_true(q.engine_keys);
    assert_int_equal(parse("model=m&keys=sequence", &q, err, sizeof(err)), KVT_OK);
    assert_false(q.engine_keys);
    char long_model[400];
    memset(long_model, 'x', sizeof(long_model));
    strcpy(long_model, "model=");
    memset(long_model + 6, 'x', 255);
    long_model[6 + 255] = '\0';
    assert_int_equal(parse(long_model, &q, err, sizeof(err)), KVT_OK);
    assert_int_equal(strlen(q.model), 255);
    long_model[6 + 255] = 'x';
    long_model[6 + 256] = '\0';
    const struct {
        const char *q;
        const char *why;
    } bad[] = {
        {NULL, "?model= is required"},
        {"", "?model= is required"},
        {"model=", "?model= is required"},
        {"lora=a", "?model= is required"},
        {"model", "without a value"},
        {"model=m&", "?model"}, /* a trailing '&' ends the string: nothing after it */
        {"model=m&x=1", "unknown query parameter x"},
        {"model=m&model=n", "given twice"},
        {"model=m&durable=2", "durable must be"},
        {"model=m&durable=", "durable must be"},
        {"model=m&keys=vllm", "keys must be sequence or engine"},
        {"model=m&keys=engine&keys=engine", "given twice"},
        {"model=a%00b", "bad %-escape"},
        {"model=a%zz", "bad %-escape"},
        {long_model, "over 255 bytes"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&q, 0x5a, sizeof(q));
        srv_block_query_t before = q;
        kvt_status_t st = parse(bad[i].q, &q, err, sizeof(err));
        if (strcmp(bad[i].why, "?model") == 0) { /* "model=m&": valid, the '&' ends it */
            assert_int_equal(st, KVT_OK);
            continue;
        }
        assert_int_equal(st, KVT_ERR_INVAL);
        if (strstr(err, bad[i].why) == NULL)
            fail_msg("%s: %s, not \"%s\"", bad[i].q ? bad[i].q : "(null)", err, bad[i].why);
        assert_null(strchr(err, '\n'));
        assert_memory_equal(&q, &before, sizeof(q)); /* untouched */
    }
    /* no room for the reason is fine */
    assert_int_equal(parse("x=1", &q, NULL, 0), KVT_ERR_INVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_queries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
