/*
 * bench/trace: the Mooncake JSONL and Azure CSV readers (also fuzzed:
 * tests/fuzz/fuzz_trace.c, fuzz_trace_csv.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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
        ("{\"timestamp\": 1, \"input_length\": 4294967296, \"output_length\": 3, "
         "\"hash_ids\": []}\n"),
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
    assert_int_equal(kvt_trace_load("/nonexistent/trace.jsonl", &t, err, sizeof(err)), KVT_ERR_IO);
}

/* One line with the required keys and @session_kv (", \"session_id\": ..." or ""). */
static uint64_t session_of(const char *session_kv)
{
    char line[512];
    snprintf(line, sizeof(line),
             "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3, \"hash_ids\": [4]%s}\n",
             session_kv);
    kvt_trace_t *t = parse_ok(line);
    assert_int_equal(t->nreqs, 1);
    uint64_t s = t->reqs[0].session;
    kvt_trace_free(t);
    return s;
}

/* AIPerf's form (a string) and an integer name sessions; null, "" and no key mean none. */
static void test_session_forms(void **state)
{
    (void)state;
    uint64_t abc = kvt_trace_session_id("abc", 3);
    assert_int_not_equal(abc, 0);
    assert_int_equal(kvt_trace_session_id("", 0), 0);
    assert_int_equal(session_of(", \"session_id\": \"abc\""), abc);
    assert_int_equal(session_of(", \"session_id\" : \"abc\" "), abc);
    assert_int_equal(session_of(", \"session_id\": \"\\u0061b\\u0063\""), abc); /* escapes */
    assert_int_not_equal(session_of(", \"session_id\": \"abd\""), abc);
    assert_int_equal(session_of(""), 0);
    assert_int_equal(session_of(", \"session_id\": null"), 0);
    assert_int_equal(session_of(", \"session_id\": \"\""), 0);
    /* an integer is its decimal digits: 7 and "7" are one session; 0 is a session */
    assert_int_equal(session_of(", \"session_id\": 7"), kvt_trace_session_id("7", 1));
    assert_int_equal(session_of(", \"session_id\": \"7\""), kvt_trace_session_id("7", 1));
    assert_int_not_equal(session_of(", \"session_id\": 0"), 0);
    assert_int_equal(session_of(", \"session_id\": 18446744073709551615"),
                     kvt_trace_session_id("18446744073709551615", 20));
    /* non-ASCII: escapes decode to UTF-8, a surrogate pair to one code point */
    assert_int_equal(session_of(", \"session_id\": \"caf\\u00e9\""),
                     kvt_trace_session_id("caf\xc3\xa9", 5));
    assert_int_equal(session_of(", \"session_id\": \"caf\xc3\xa9\""),
                     kvt_trace_session_id("caf\xc3\xa9", 5));
    assert_int_equal(session_of(", \"session_id\": \"\\ud83d\\ude00\""),
                     kvt_trace_session_id("\xf0\x9f\x98\x80", 4));
    assert_int_not_equal(session_of(", \"session_id\": \"\\u00e8\""),
                         session_of(", \"session_id\": \"\\u00e9\""));
    /* keys in any order, the session key first */
    kvt_trace_t *t = parse_ok("{\"session_id\": \"x\", \"hash_ids\": [], \"timestamp\": 0, "
                              "\"input_length\": 0, \"output_length\": 0}\n"
                              "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 0, "
                              "\"hash_ids\": [], \"session_id\": \"x\"}\n");
    assert_int_equal(t->reqs[0].session, kvt_trace_session_id("x", 1));
    assert_int_equal(t->reqs[1].session, t->reqs[0].session);
    kvt_trace_free(t);
}

static void test_session_bad(void **state)
{
    (void)state;
    static const char *const bad[] = {
        ", \"session_id\": true",
        ", \"session_id\": [1]",
        ", \"session_id\": {\"a\": 1}",
        ", \"session_id\": -1",
        ", \"session_id\": 1.5",
        ", \"session_id\": 1e3",
        ", \"session_id\": 007",
        ", \"session_id\": \"ab",
        ", \"session_id\": \"\\x\"",
        ", \"session_id\": nul",
        ", \"session_id\": ",
        ", \"session_id\": \"a\", \"session_id\": \"a\"",
        ", \"session_id\": 18446744073709551616",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[512];
        snprintf(
            text, sizeof(text),
            "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3, \"hash_ids\": []}\n"
            "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3, \"hash_ids\": [1]%s}\n",
            bad[i]);
        kvt_trace_t *t = NULL;
        char err[256] = "";
        kvt_status_t st = kvt_trace_parse(text, strlen(text), &t, err, sizeof(err));
        if (st != KVT_ERR_PARSE || t != NULL || strstr(err, "line 2:") == NULL)
            fail_msg("%s: status %d, error '%s'", bad[i], (int)st, err);
    }
}

/* ---- the Azure CSV ------------------------------------------------------------------------- */

static kvt_trace_t *csv_ok(const char *text)
{
    kvt_trace_t *t = NULL;
    char err[256] = "";
    kvt_status_t st = kvt_trace_parse_csv(text, strlen(text), &t, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("%s", err);
    return t;
}

static void test_csv_good(void **state)
{
    (void)state;
    /* a byte order mark, CR LF line ends, a blank line, fractions of any length, no newline at
     * the end, a year's end and a leap day crossed */
    kvt_trace_t *t = csv_ok("\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                            "2023-11-16 18:17:03.9799600,4808,10\r\n"
                            "2023-11-16 18:17:04.0319600,3180,8\r\n"
                            "\r\n"
                            "2023-11-16 18:17:04,0,0\r\n"
                            "2023-11-16 18:17:05.5,4294967295,1\r\n"
                            "2023-12-31 23:59:59.999999999,1,2\n"
                            "2024-01-01 00:00:00.000,1,2\n"
                            "2024-02-29 00:00:00.0,1,2\n"
                            "2024-03-01 00:00:00.0,7,8");
    assert_int_equal(t->nreqs, 8);
    assert_int_equal(t->nids, 0);
    assert_int_equal(t->max_blocks, 0);
    /* by hand: Python's datetime differences, in whole milliseconds */
    static const uint64_t ts[8] = {0, 52, 20, 1520, 3908576020, 3908576020, 9006176020, 9092576020};
    for (size_t i = 0; i < t->nreqs; i++) {
        assert_int_equal(t->reqs[i].timestamp_ms, ts[i]);
        assert_int_equal(t->reqs[i].nblocks, 0);
        assert_null(t->reqs[i].hash_ids);
        assert_int_equal(t->reqs[i].session, 0);
    }
    assert_int_equal(t->reqs[0].input_length, 4808);
    assert_int_equal(t->reqs[0].output_length, 10);
    assert_int_equal(t->reqs[3].input_length, UINT32_MAX);
    assert_int_equal(t->reqs[7].input_length, 7);
    assert_int_equal(t->reqs[7].output_length, 8);
    kvt_trace_free(t);
    /* the header alone: no requests */
    t = csv_ok("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    assert_int_equal(t->nreqs, 0);
    kvt_trace_free(t);
}

static void test_csv_bad(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *line; /* the error's start */
    } bad[] = {
        {"", "line 1:"},
        {"\n\n", "line 1:"},
        {"TIMESTAMP,ContextTokens\n", "line 1:"},
        {"timestamp,ContextTokens,GeneratedTokens\n", "line 1:"},
        {"TIMESTAMP,ContextTokens,GeneratedTokens,X\n", "line 1:"},
        {"H\n2023-11-16 18:17:03,1,2\n", "line 1:"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvt_trace_t *t = NULL;
        char err[256] = "";
        kvt_status_t st =
            kvt_trace_parse_csv(bad[i].text, strlen(bad[i].text), &t, err, sizeof(err));
        if (st != KVT_ERR_PARSE || t != NULL || strncmp(err, bad[i].line, strlen(bad[i].line)))
            fail_msg("%zu: status %d, error '%s'", i, (int)st, err);
    }
    /* bad rows, each the third line after a good one */
    static const char *const rows[] = {
        "2023-11-16 18:17:03,1",
        "2023-11-16 18:17:03,1,2,3",
        "2023-11-16 18:17:03,1,2 ",
        "2023-11-16 18:17:03,-1,2",
        "2023-11-16 18:17:03,1,+2",
        "2023-11-16 18:17:03,1,x",
        "2023-11-16 18:17:03,,2",
        "2023-11-16 18:17:03,1,",
        "2023-11-16 18:17:03,4294967296,2",
        "2023-11-16 18:17:03,1,99999999999",
        "2023-11-16T18:17:03,1,2",
        "2023-11-16 18:17,1,2",
        "2023-11-16 18:17:03.,1,2",
        "2023-11-16 18:17:03.1234567890,1,2",
        "2023-02-29 18:17:03,1,2",
        "2023-13-01 18:17:03,1,2",
        "2023-11-31 18:17:03,1,2",
        "2023-11-16 24:00:00,1,2",
        "2023-11-16 18:60:00,1,2",
        "2023-11-16 18:17:60,1,2",
        "2023-11-16 18:17:01,1,2",
        "23-11-16 18:17:03,1,2",
        ",1,2",
        "2023-11-16 18:17:03 ,1,2",
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char text[256];
        snprintf(text, sizeof(text),
                 "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:02,5,6\r\n%s\r\n"
                 "2023-11-16 18:17:09,5,6\r\n",
                 rows[i]);
        kvt_trace_t *t = NULL;
        char err[256] = "";
        kvt_status_t st = kvt_trace_parse_csv(text, strlen(text), &t, err, sizeof(err));
        if (st != KVT_ERR_PARSE || t != NULL || strncmp(err, "line 3: ", 8) != 0 ||
            strchr(err, '\n') != NULL)
            fail_msg("'%s': status %d, error '%s'", rows[i], (int)st, err);
    }
    kvt_trace_t *t = NULL;
    char err[256] = "";
    assert_int_equal(kvt_trace_load_csv("/nonexistent/trace.csv", &t, err, sizeof(err)),
                     KVT_ERR_IO);
    assert_null(t);
}

/* The bundled Azure trace, when the checkout has it: 8,819 rows over about 57 minutes. */
static void test_csv_azure(void **state)
{
    (void)state;
    const char *src = getenv("KVT_SOURCE_DIR");
    char path[512];
    snprintf(path, sizeof(path), "%s/../shared/traces/AzureLLMInferenceTrace_code.csv",
             src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        skip();
    fclose(f);
    kvt_trace_t *t = NULL;
    char err[256] = "";
    assert_int_equal(kvt_trace_load_csv(path, &t, err, sizeof(err)), KVT_OK);
    assert_int_equal(t->nreqs, 8819);
    assert_int_equal(t->reqs[0].timestamp_ms, 0);
    assert_int_equal(t->reqs[0].input_length, 4808);
    assert_int_equal(t->reqs[1].timestamp_ms, 52); /* 04.03196 - 03.97996 */
    assert_int_equal(t->reqs[8818].input_length, 549);
    assert_int_equal(t->reqs[8818].output_length, 173);
    /* 19:14:19.928016 - 18:17:03.97996 */
    assert_int_equal(t->reqs[8818].timestamp_ms, 3435948);
    kvt_trace_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),        cmocka_unit_test(test_all_empty),
        cmocka_unit_test(test_bad),         cmocka_unit_test(test_session_forms),
        cmocka_unit_test(test_session_bad), cmocka_unit_test(test_csv_good),
        cmocka_unit_test(test_csv_bad),     cmocka_unit_test(test_csv_azure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
