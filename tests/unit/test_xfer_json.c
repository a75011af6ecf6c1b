/*
 * server/xfer_json.c: the POST /v1/transfer body and answer. Good bodies decode to what they
 * say and write back to a canonical text that decodes the same; every bad field is refused with
 * its status and a one-line message naming it; the answer's JSON is exact; and the examples of
 * docs/api.md are what this code reads and writes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/xfer_json.h"
#include "tests/support/docblock.h"

#define CAP 8

static uint64_t g_keys[CAP];
static kvt_srv_xfer_body_t g_x;

static kvt_status_t decode(const char *body, size_t cap, char *err, size_t errlen)
{
    return kvt_srv_xfer_decode(body, strlen(body), g_keys, cap, &g_x, err, errlen);
}

/* @body decodes, and so does its canonical text, to the same; that text writes back the same. */
static void canonical_same(const char *body)
{
    char err[256] = "";
    assert_int_equal(decode(body, CAP, err, sizeof(err)), KVT_OK);
    kvt_srv_xfer_body_t first = g_x;
    uint64_t keys[CAP];
    memcpy(keys, g_keys, sizeof(keys));
    kvt_jbuf_t b, again;
    kvt_jbuf_init(&b);
    kvt_jbuf_init(&again);
    kvt_srv_xfer_body_json(&b, &first, keys);
    assert_false(b.oom);
    if (decode(b.buf, CAP, err, sizeof(err)) != KVT_OK)
        fail_msg("canonical text %s refused: %s", b.buf, err);
    assert_true(g_x.n == first.n && g_x.direction == first.direction &&
                g_x.timeout_ms == first.timeout_ms && g_x.stream == first.stream);
    assert_true(g_x.peer_len == first.peer_len && g_x.model_len == first.model_len &&
                g_x.lora_len == first.lora_len);
    assert_string_equal(g_x.peer, first.peer);
    assert_string_equal(g_x.model, first.model);
    assert_string_equal(g_x.lora, first.lora);
    assert_memory_equal(g_keys, keys, first.n * sizeof(keys[0]));
    kvt_srv_xfer_body_json(&again, &g_x, g_keys);
    assert_string_equal(again.buf, b.buf);
    kvt_jbuf_cleanup(&b);
    kvt_jbuf_cleanup(&again);
}

static void test_good_bodies(void **state)
{
    (void)state;
    char err[256] = "unset";
    assert_int_equal(decode("{\"peer\":\"10.0.0.7:7420\",\"model\":\"llama\",\"keys\":[42]}", CAP,
                            err, sizeof(err)),
                     KVT_OK);
    assert_string_equal(err, "unset"); /* untouched on success */
    assert_string_equal(g_x.peer, "10.0.0.7:7420");
    assert_string_equal(g_x.model, "llama");
    assert_string_equal(g_x.lora, "");
    assert_int_equal(g_x.n, 1);
    assert_true(g_keys[0] == 42);
    assert_int_equal(g_x.direction, KVT_PROTO_XFER_PULL);
    assert_int_equal(g_x.timeout_ms, 0);

    /* every field, in another order, with whitespace; the largest and smallest keys */
    assert_int_equal(decode(" { \"timeout_ms\" : 600000 , \"direction\":\"push\",\n"
                            "\"keys\":[18446744073709551615, 0,7],\"lora_name\":\"sql\\u0041\","
                            "\"model\":\"m\",\"peer\":\"[::1]:1\"}\n",
                            CAP, err, sizeof(err)),
                     KVT_OK);
    assert_string_equal(g_x.peer, "[::1]:1");
    assert_string_equal(g_x.lora, "sqlA");
    assert_int_equal(g_x.n, 3);
    assert_true(g_keys[0] == UINT64_MAX && g_keys[1] == 0 && g_keys[2] == 7);
    assert_int_equal(g_x.direction, KVT_PROTO_XFER_PUSH);
    assert_int_equal(g_x.timeout_ms, KVT_PROTO_XFER_MAX_TIMEOUT_MS);
    assert_false(g_x.stream);
    /* a streaming push; "stream": false is the default said out loud */
    assert_int_equal(decode("{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"direction\":\"push\","
                            "\"stream\":true}",
                            CAP, err, sizeof(err)),
                     KVT_OK);
    assert_true(g_x.stream && g_x.direction == KVT_PROTO_XFER_PUSH);
    assert_int_equal(decode("{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"stream\":false}", CAP,
                            err, sizeof(err)),
                     KVT_OK);
    assert_false(g_x.stream);

    /* lora_name null is the base model; "pull" said out loud; exactly the cap */
    assert_int_equal(decode("{\"peer\":\"h:65535\",\"model\":\"m\",\"lora_name\":null,"
                            "\"direction\":\"pull\",\"timeout_ms\":1,\"keys\":[1,2,3]}",
                            3, err, sizeof(err)),
                     KVT_OK);
    assert_string_equal(g_x.lora, "");
    assert_int_equal(g_x.n, 3);
    assert_int_equal(g_x.timeout_ms, 1);

    canonical_same("{\"peer\":\"10.0.0.7:7420\",\"model\":\"llama\",\"keys\":[42]}");
    canonical_same("{\"timeout_ms\":9,\"direction\":\"push\",\"keys\":[18446744073709551615,0],"
                   "\"lora_name\":\"a\\\"b\\u00e9\",\"model\":\"m\\n\",\"peer\":\"[::1]:1\"}");
    canonical_same("{\"peer\":\"h:1\",\"model\":\"m\",\"lora_name\":\"\",\"keys\":[5,5,5]}");
    canonical_same("{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[5],\"direction\":\"push\","
                   "\"stream\":true,\"timeout_ms\":100}");

    kvt_jbuf_t b;
    kvt_jbuf_init(&b);
    assert_int_equal(decode("{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1,2]}", CAP, NULL, 0),
                     KVT_OK);
    kvt_srv_xfer_body_json(&b, &g_x, g_keys);
    assert_string_equal(b.buf, "{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1,2],"
                               "\"direction\":\"pull\"}");
    kvt_jbuf_cleanup(&b);
}

static void test_bad_bodies(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        kvt_status_t st;
        const char *msg; /* the whole message, or its start when it ends in '*' */
    } bad[] = {
        /* missing fields */
        {"{\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL, "a transfer needs \"peer\""},
        {"{\"peer\":\"h:1\",\"keys\":[1]}", KVT_ERR_INVAL, "a transfer needs \"model\""},
        {"{\"peer\":\"h:1\",\"model\":\"m\"}", KVT_ERR_INVAL, "a transfer needs \"keys\""},
        /* peer */
        {"{\"peer\":7420,\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" must be a string"},
        {"{\"peer\":null,\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" must be a string"},
        {"{\"peer\":\"\",\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" is empty or contains a NUL character"},
        {"{\"peer\":\"h\\u0000:1\",\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" is empty or contains a NUL character"},
        {"{\"peer\":\"nohost\",\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" is not a host:port: *"},
        {"{\"peer\":\"h:0\",\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" is not a host:port: *"},
        {"{\"peer\":\"h:65536\",\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" is not a host:port: *"},
        {"{\"peer\":\"::1:80\",\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" is not a host:port: *"},
        {"{\"peer\":\":80\",\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"peer\" is not a host:port: *"},
        /* model, lora_name */
        {"{\"peer\":\"h:1\",\"model\":\"\",\"keys\":[1]}", KVT_ERR_INVAL,
         "\"model\" is empty or contains a NUL character"},
        {"{\"peer\":\"h:1\",\"model\":[],\"keys\":[1]}", KVT_ERR_INVAL,
         "\"model\" must be a string"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"lora_name\":3,\"keys\":[1]}", KVT_ERR_INVAL,
         "\"lora_name\" must be a string or null"},
        /* keys */
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[]}", KVT_ERR_INVAL,
         "\"keys\" is empty: a transfer moves at least one block"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":7}", KVT_ERR_INVAL,
         "\"keys\" must be an array of unsigned 64-bit decimals"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1,2,3,4,5,6,7,8,9]}", KVT_ERR_TOO_BIG,
         "more than 8 keys in one transfer"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1,-1]}", KVT_ERR_INVAL,
         "\"keys\"[1] is not an unsigned 64-bit decimal"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[-0]}", KVT_ERR_INVAL,
         "\"keys\"[0] is not an unsigned 64-bit decimal"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[18446744073709551616]}", KVT_ERR_INVAL,
         "\"keys\"[0] is not an unsigned 64-bit decimal"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1.5]}", KVT_ERR_INVAL,
         "\"keys\"[0] is not an unsigned 64-bit decimal"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1e3]}", KVT_ERR_INVAL,
         "\"keys\"[0] is not an unsigned 64-bit decimal"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1,\"2\"]}", KVT_ERR_INVAL,
         "\"keys\"[1] is not an unsigned 64-bit decimal"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[null]}", KVT_ERR_INVAL,
         "\"keys\"[0] is not an unsigned 64-bit decimal"},
        /* direction, timeout_ms */
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"direction\":\"both\"}", KVT_ERR_INVAL,
         "\"direction\" must be \"pull\" or \"push\""},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"direction\":\"pulling\"}", KVT_ERR_INVAL,
         "\"direction\" must be \"pull\" or \"push\""},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"direction\":1}", KVT_ERR_INVAL,
         "\"direction\" must be \"pull\" or \"push\""},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"stream\":true}", KVT_ERR_INVAL,
         "\"stream\" is for a push"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"direction\":\"push\",\"stream\":1}",
         KVT_ERR_INVAL, "\"stream\" must be true or false"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"stream\":\"yes\"}", KVT_ERR_INVAL,
         "\"stream\" must be true or false"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"timeout_ms\":0}", KVT_ERR_INVAL,
         "\"timeout_ms\" must be an integer in 1..600000"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"timeout_ms\":600001}", KVT_ERR_INVAL,
         "\"timeout_ms\" must be an integer in 1..600000"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"timeout_ms\":\"5\"}", KVT_ERR_INVAL,
         "\"timeout_ms\" must be an integer in 1..600000"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"timeout_ms\":-5}", KVT_ERR_INVAL,
         "\"timeout_ms\" must be an integer in 1..600000"},
        /* unknown and duplicate fields, not JSON */
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"pod\":\"x\"}", KVT_ERR_INVAL,
         "unknown field 'pod' in a transfer"},
        {"{\"peer\":\"h:1\",\"peer\":\"h:2\",\"model\":\"m\",\"keys\":[1]}", KVT_ERR_INVAL,
         "offset 14: duplicate field 'peer'"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1],\"keys\":[2]}", KVT_ERR_INVAL,
         "offset 37: duplicate field 'keys'"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[01]}", KVT_ERR_PARSE, "offset *"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1]} x", KVT_ERR_PARSE, "offset *"},
        {"{\"peer\":\"h:1\",\"model\":\"m\",\"keys\":[1]", KVT_ERR_PARSE, "offset *"},
        {"[]", KVT_ERR_INVAL, "offset *"},
        {"", KVT_ERR_PARSE, "offset *"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        kvt_status_t st = decode(bad[i].body, CAP, err, sizeof(err));
        size_t ml = strlen(bad[i].msg);
        bool prefix = bad[i].msg[ml - 1] == '*';
        if (st != bad[i].st ||
            (prefix ? strncmp(err, bad[i].msg, ml - 1) != 0 : strcmp(err, bad[i].msg) != 0))
            fail_msg("%s: status %d \"%s\", want %d \"%s\"", bad[i].body, st, err, bad[i].st,
                     bad[i].msg);
        assert_null(strchr(err, '\n'));
        assert_int_equal(decode(bad[i].body, CAP, NULL, 0), bad[i].st);
    }
}

static void test_answer_json(void **state)
{
    (void)state;
    kvt_jbuf_t b;
    kvt_jbuf_init(&b);
    const uint64_t tr[2] = {1, UINT64_MAX}, mi[1] = {3};
    const kvt_proto_xfer_failed_t fa[3] = {
        {4, KVT_PROTO_XFER_FAIL_CHECKSUM}, {5, KVT_PROTO_XFER_FAIL_PEER_RESTARTED}, {6, 99}};
    kvt_proto_transfer_ans_t a = {.bytes = 3 << 20,
                                  .ns = 1500000000,
                                  .ntransferred = 2,
                                  .nmissing = 1,
                                  .nfailed = 3,
                                  .transferred = tr,
                                  .missing = mi,
                                  .failed = fa};
    kvt_srv_xfer_answer_json(&b, &a);
    assert_string_equal(b.buf, "{\"transferred\":[1,18446744073709551615],\"missing\":[3],"
                               "\"failed\":[{\"key\":4,\"reason\":\"checksum\"},"
                               "{\"key\":5,\"reason\":\"peer_restarted\"},"
                               "{\"key\":6,\"reason\":\"error\"}],"
                               "\"bytes\":3145728,\"seconds\":1.5}");
    /* empty lists, nothing moved */
    kvt_jbuf_reset(&b);
    a = (kvt_proto_transfer_ans_t){.nmissing = 1, .missing = mi};
    kvt_srv_xfer_answer_json(&b, &a);
    assert_string_equal(b.buf, "{\"transferred\":[],\"missing\":[3],\"failed\":[],\"bytes\":0,"
                               "\"seconds\":0}");
    /* every reason by its name */
    for (uint8_t r = 1; r <= KVT_PROTO_XFER_FAIL_MAX; r++) {
        kvt_proto_xfer_failed_t f = {7, r};
        a = (kvt_proto_transfer_ans_t){.nfailed = 1, .failed = &f};
        kvt_jbuf_reset(&b);
        kvt_srv_xfer_answer_json(&b, &a);
        char want[128];
        snprintf(want, sizeof(want), "\"reason\":\"%s\"", kvt_proto_xfer_reason_name(r));
        assert_non_null(strstr(b.buf, want));
    }
    kvt_jbuf_cleanup(&b);
}

/* The examples of docs/api.md ("POST /v1/transfer"): the body is read as it says, and the
 * answer is what the writer writes for the transfer it describes. */
static void test_doc_examples(void **state)
{
    (void)state;
    /* doc-test: api-transfer */
    char *body = kvt_doc_block("docs/api.md", "api-transfer");
    if (body == NULL)
        fail_msg("docs/api.md has no block marked api-transfer (set KVT_SOURCE_DIR)");
    char err[256] = "";
    if (decode(body, CAP, err, sizeof(err)) != KVT_OK)
        fail_msg("docs/api.md's transfer body refused: %s", err);
    assert_string_equal(g_x.peer, "10.0.0.7:7420");
    assert_string_equal(g_x.model, "llama-3-8b");
    assert_int_equal(g_x.n, 3);
    assert_true(g_keys[0] == 4496801001785708469ull && g_keys[1] == 820907412447827424ull &&
                g_keys[2] == 16777012769546811212ull);
    assert_int_equal(g_x.direction, KVT_PROTO_XFER_PULL);
    assert_int_equal(g_x.timeout_ms, 5000);
    free(body);

    /* doc-test: api-transfer-answer */
    char *shown = kvt_doc_block("docs/api.md", "api-transfer-answer");
    if (shown == NULL)
        fail_msg("docs/api.md has no block marked api-transfer-answer");
    const uint64_t tr[1] = {4496801001785708469ull}, mi[1] = {16777012769546811212ull};
    const kvt_proto_xfer_failed_t fa[1] = {{820907412447827424ull, KVT_PROTO_XFER_FAIL_CHECKSUM}};
    kvt_proto_transfer_ans_t a = {.bytes = 2097152,
                                  .ns = 4200000,
                                  .ntransferred = 1,
                                  .nmissing = 1,
                                  .nfailed = 1,
                                  .transferred = tr,
                                  .missing = mi,
                                  .failed = fa};
    kvt_jbuf_t b;
    kvt_jbuf_init(&b);
    kvt_srv_xfer_answer_json(&b, &a);
    kvt_jbuf_raw(&b, "\n", 1);
    assert_string_equal(b.buf, shown);
    kvt_jbuf_cleanup(&b);
    free(shown);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_bodies),
        cmocka_unit_test(test_bad_bodies),
        cmocka_unit_test(test_answer_json),
        cmocka_unit_test(test_doc_examples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
