/*
 * server/query_json: the POST /v1/query body decoder kvtierd and kvtier-bench json share.
 * What it reads (names, tokens, keys in the full u64 range, the pod filter) and what it
 * refuses, with the reason kvtierd answers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/query_json.h"

#define CAP 8

static uint32_t tokens[CAP];
static uint64_t keys[CAP];

/* Decodes @body with room for CAP tokens or keys; the reason goes to @err ("" when none). */
static kvt_status_t decode(const char *body, kvt_srv_query_body_t *q, char *err, size_t errlen)
{
    err[0] = '\0';
    return kvt_srv_query_decode(body, strlen(body), CAP, tokens, keys, q, err, errlen);
}

/* @body is refused with @st and a reason containing @why. */
static void refused(const char *body, kvt_status_t st, const char *why)
{
    kvt_srv_query_body_t q;
    char got[256];
    kvt_status_t r = decode(body, &q, got, sizeof(got));
    if (r != st || got[0] == '\0' || strstr(got, why) == NULL)
        fail_msg("%s: got %d '%s', want %d '%s'", body, r, got, st, why);
    assert_null(strchr(got, '\n'));
}

static void test_tokens(void **state)
{
    (void)state;
    kvt_srv_query_body_t q;
    char why[256];
    assert_int_equal(decode("{\"model\":\"m\\u00e9\",\"lora_name\":\"sql\",\"cache_salt\":\"t\","
                            "\"token_ids\":[0,4294967295,7]}",
                            &q, why, sizeof(why)),
                     KVT_OK);
    assert_int_equal(q.model_len, 3);
    assert_string_equal(q.model, "m\xc3\xa9");
    assert_string_equal(q.lora, "sql");
    assert_int_equal(q.lora_len, 3);
    assert_string_equal(q.salt, "t");
    assert_false(q.by_keys);
    assert_int_equal(q.n, 3);
    assert_int_equal(tokens[1], UINT32_MAX);
    assert_int_equal(q.npods, 0);
    /* null and "" are no LoRA and no salt; fields in any order */
    assert_int_equal(
        decode("{\"token_ids\":[],\"cache_salt\":null,\"lora_name\":null,\"model\":\"m\"}", &q, why,
               sizeof(why)),
        KVT_OK);
    assert_int_equal(q.lora_len + q.salt_len + q.n, 0);
    assert_int_equal(
        decode("{\"model\":\"m\",\"cache_salt\":\"\",\"token_ids\":[1]}", &q, why, sizeof(why)),
        KVT_OK);
    assert_int_equal(q.salt_len, 0);
}

static void test_keys_and_pods(void **state)
{
    (void)state;
    kvt_srv_query_body_t q;
    char why[256];
    /* the full u64 range, and SGLang's negative ids as two's complement */
    assert_int_equal(decode("{\"model\":\"m\",\"block_hashes\":[18446744073709551615,"
                            "9223372036854775809,-1],\"pods\":[\"a\",\"b\\n\"]}",
                            &q, why, sizeof(why)),
                     KVT_OK);
    assert_true(q.by_keys);
    assert_int_equal(q.n, 3);
    assert_true(keys[0] == UINT64_MAX);
    assert_true(keys[1] == (UINT64_C(1) << 63) + 1);
    assert_true(keys[2] == UINT64_MAX);
    assert_int_equal(q.npods, 2);
    assert_int_equal(q.pod_name_lens[0], 1);
    assert_memory_equal(q.pod_names[0], "a", 1);
    assert_int_equal(q.pod_name_lens[1], 2);
    assert_memory_equal(q.pod_names[1], "b\n", 2);
}

static void test_refused(void **state)
{
    (void)state;
    refused("{\"model\":\"m\",\"token_ids\":[1],\"top_k\":3}", KVT_ERR_INVAL,
            "unknown field 'top_k' in query");
    /* a key's control bytes are shown as '?': the reason stays one line (refused() checks) */
    refused("{\"model\":\"m\",\"token_ids\":[1],\"e\\no\":3}", KVT_ERR_INVAL,
            "unknown field 'e?o' in query");
    refused("{\"model\":\"m\",\"model\":\"n\",\"token_ids\":[1]}", KVT_ERR_INVAL,
            "duplicate field 'model'");
    refused("{\"model\":\"m\",\"token_ids\":[1],\"block_hashes\":[1]}", KVT_ERR_INVAL,
            "exactly one of");
    refused("{\"model\":\"m\"}", KVT_ERR_INVAL, "exactly one of");
    refused("{\"token_ids\":[1]}", KVT_ERR_INVAL, "non-empty \"model\"");
    refused("{\"model\":\"\",\"token_ids\":[1]}", KVT_ERR_INVAL, "non-empty \"model\"");
    refused("{\"model\":\"a\\u0000\",\"token_ids\":[1]}", KVT_ERR_INVAL, "NUL character");
    refused("{\"model\":\"m\",\"block_hashes\":[1],\"cache_salt\":\"t\"}", KVT_ERR_INVAL,
            "\"cache_salt\" goes with \"token_ids\"");
    refused("{\"model\":\"m\",\"cache_salt\":7,\"token_ids\":[1]}", KVT_ERR_INVAL,
            "\"cache_salt\" must be a string or null");
    refused("{\"model\":\"m\",\"token_ids\":[1,2,3,4,5,6,7,8,9]}", KVT_ERR_TOO_BIG,
            "more than 8 tokens or keys in one query");
    refused("{\"model\":\"m\",\"token_ids\":[4294967296]}", KVT_ERR_RANGE, "offset");
    refused("{\"model\":\"m\",\"block_hashes\":[18446744073709551616]}", KVT_ERR_RANGE, "offset");
    refused("{\"model\":\"m\",\"token_ids\":[1],\"pods\":[\"\"]}", KVT_ERR_INVAL,
            "a pod name in \"pods\" is empty");
    refused("{\"model\":\"m\",\"token_ids\":[1]} x", KVT_ERR_PARSE, "end of input");
    refused("[]", KVT_ERR_INVAL, "expected an object");

    /* more pods than the filter holds */
    size_t cap = 16 + 4 * (KVT_SRV_QUERY_MAX_PODS + 1) + 64;
    char *body = malloc(cap);
    assert_non_null(body);
    size_t o = (size_t)snprintf(body, cap, "{\"model\":\"m\",\"token_ids\":[1],\"pods\":[");
    for (unsigned i = 0; i <= KVT_SRV_QUERY_MAX_PODS; i++)
        o += (size_t)snprintf(body + o, cap - o, i ? ",\"p\"" : "\"p\"");
    snprintf(body + o, cap - o, "]}");
    refused(body, KVT_ERR_TOO_BIG, "more than 1024 pods in the filter");
    free(body);
}

/* A POST /v1/routed body: a query's fields, the pod, its DP rank and the TTL, each checked. */
static void test_routed(void **state)
{
    (void)state;
    kvt_srv_routed_body_t r;
    char err[256];
    static const char ok[] = "{\"model\":\"m\",\"token_ids\":[1,2,3],\"pod\":\"p\"}";
    assert_int_equal(kvt_srv_routed_decode(ok, strlen(ok), CAP, tokens, keys, &r, err, sizeof(err)),
                     KVT_OK);
    assert_string_equal(r.pod, "p");
    assert_int_equal(r.pod_len, 1);
    assert_int_equal(r.dp_rank, 0);
    assert_int_equal(r.ttl_ms, KVT_SRV_ROUTED_TTL_MS);
    assert_int_equal(r.q.n, 3);
    assert_false(r.q.by_keys);
    static const char full[] = "{\"ttl_ms\":60000,\"dp_rank\":255,\"pod\":\"q\",\"model\":\"m\","
                               "\"lora_name\":\"l\",\"block_hashes\":[18446744073709551615]}";
    assert_int_equal(
        kvt_srv_routed_decode(full, strlen(full), CAP, tokens, keys, &r, err, sizeof(err)), KVT_OK);
    assert_int_equal(r.ttl_ms, 60000);
    assert_int_equal(r.dp_rank, 255);
    assert_true(r.q.by_keys && r.q.n == 1 && keys[0] == UINT64_MAX);
    assert_string_equal(r.q.lora, "l");
    static const struct {
        const char *body, *why;
    } bad[] = {
        {"{\"model\":\"m\",\"token_ids\":[1]}", "needs a non-empty \"pod\""},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pod\":\"\"}", "\"pod\" is empty"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"block_hashes\":[1],\"pod\":\"p\"}", "exactly one"},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pod\":\"p\",\"ttl_ms\":60001}", "\"ttl_ms\""},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pod\":\"p\",\"ttl_ms\":0}", "\"ttl_ms\""},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pod\":\"p\",\"ttl_ms\":\"1\"}", "\"ttl_ms\""},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pod\":\"p\",\"dp_rank\":256}", "\"dp_rank\""},
        {"{\"model\":\"m\",\"token_ids\":[1],\"pod\":\"p\",\"pods\":[\"p\"]}",
         "unknown field 'pods' in routed call"},
        {"{\"token_ids\":[1],\"pod\":\"p\"}", "routed call needs a non-empty \"model\""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        kvt_status_t st = kvt_srv_routed_decode(bad[i].body, strlen(bad[i].body), CAP, tokens, keys,
                                                &r, err, sizeof(err));
        if (st == KVT_OK || strstr(err, bad[i].why) == NULL)
            fail_msg("%s: got %d '%s', want '%s'", bad[i].body, st, err, bad[i].why);
    }
    /* a query still refuses the routed fields */
    refused("{\"model\":\"m\",\"token_ids\":[1],\"pod\":\"p\"}", KVT_ERR_INVAL,
            "unknown field 'pod' in query");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_keys_and_pods),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_routed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
