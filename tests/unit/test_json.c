/*
 * common/json: the pull parser (every reader, every error kind with its
 * offset, sticky errors, escapes, surrogates, depth, number edges), the
 * writer, a randomized round trip (random trees written with kvt_jbuf_*,
 * read back with the parser, compared with the tree), and accept/reject
 * agreement with Debian's /usr/bin/python3 json module
 * (tests/fixtures/json_check.py) on tricky and mutated documents.
 *
 * Without /usr/bin/python3 the other tests still run; the program then exits
 * 77 (skip) because the comparison could not run. The random runs draw
 * from tests/support/rng.h (KVT_TEST_SEED=<n> runs other sequences, or
 * replays a printed seed); KVT_JSON_ROUNDS=<n> changes the round-trip count
 * (20000).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/json.h"
#include "tests/support/rng.h"

#define PYTHON "/usr/bin/python3"

/* ---- helpers -------------------------------------------------------------------------- */

static void init_n(kvt_json_t *j, const char *s, size_t n)
{
    kvt_json_init(j, s, n);
}

static void init(kvt_json_t *j, const char *s)
{
    kvt_json_init(j, s, strlen(s));
}

/* The parser holds error @st at byte @off, says so in its message, and every call
 * keeps failing the same way. */
static void check_err_state(kvt_json_t *j, kvt_status_t st, size_t off, const char *input)
{
    char prefix[48];
    uint64_t u = 77;
    double d = 7.5;
    bool bl = true;
    char buf[8] = "zz";
    size_t n = 99;
    const char *key = "k";

    if (kvt_json_status(j) != st)
        fail_msg("input \"%s\": status %d, want %d (%s)", input, kvt_json_status(j), st,
                 kvt_json_error(j));
    snprintf(prefix, sizeof(prefix), "offset %zu: ", off);
    if (strncmp(kvt_json_error(j), prefix, strlen(prefix)) != 0)
        fail_msg("input \"%s\": message \"%s\" does not start with \"%s\"", input,
                 kvt_json_error(j), prefix);
    assert_true(strlen(kvt_json_error(j)) > strlen(prefix));
    assert_null(strchr(kvt_json_error(j), '\n'));
    assert_int_equal(kvt_json_offset(j), off);

    char msg[sizeof(j->msg)];
    snprintf(msg, sizeof(msg), "%s", kvt_json_error(j));
    /* Sticky: every call returns the same error and changes nothing. */
    assert_int_equal(kvt_json_peek(j), KVT_JSON_NONE);
    assert_int_equal(kvt_json_u64(j, &u), st);
    assert_int_equal(kvt_json_double(j, &d), st);
    assert_int_equal(kvt_json_bool(j, &bl), st);
    assert_int_equal(kvt_json_null(j), st);
    assert_int_equal(kvt_json_string(j, buf, sizeof(buf), &n), st);
    assert_int_equal(kvt_json_object_begin(j), st);
    assert_int_equal(kvt_json_array_begin(j), st);
    assert_int_equal(kvt_json_object_next(j, &key, &n), (int)st);
    assert_int_equal(kvt_json_array_next(j), (int)st);
    assert_int_equal(kvt_json_skip(j), st);
    assert_int_equal(kvt_json_end(j), st);
    assert_int_equal(u, 77);
    assert_true(d == 7.5);
    assert_true(bl);
    assert_string_equal(buf, "zz");
    assert_int_equal(n, 99);
    assert_string_equal(key, "k");
    assert_string_equal(kvt_json_error(j), msg);
    assert_int_equal(kvt_json_offset(j), off);
}

/* Skips the whole of @s (one value then end) expecting @st at @off (st KVT_OK: accepted). */
static void expect_skip_n(const char *s, size_t len, kvt_status_t st, size_t off)
{
    kvt_json_t j;
    init_n(&j, s, len);
    kvt_status_t got = kvt_json_skip(&j);
    if (got == KVT_OK)
        got = kvt_json_end(&j);
    if (st == KVT_OK) {
        if (got != KVT_OK)
            fail_msg("input \"%.*s\": status %d (%s), want ok", (int)len, s, got,
                     kvt_json_error(&j));
        assert_string_equal(kvt_json_error(&j), "");
        return;
    }
    check_err_state(&j, st, off, s);
}

static void expect_skip(const char *s, kvt_status_t st, size_t off)
{
    expect_skip_n(s, strlen(s), st, off);
}

/* ---- scalars -------------------------------------------------------------------------- */

static void test_scalars(void **state)
{
    (void)state;
    kvt_json_t j;
    uint64_t u;
    int64_t i;
    uint32_t u32;
    double d;
    bool b;

    init(&j, " 42 ");
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_NUMBER);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(u, 42);
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_NONE); /* nothing due after the top value */
    assert_int_equal(kvt_json_status(&j), KVT_OK);
    assert_int_equal(kvt_json_end(&j), KVT_OK);
    assert_int_equal(kvt_json_offset(&j), 4);

    init(&j, "18446744073709551615");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_true(u == UINT64_MAX);
    init(&j, "0");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(u, 0);
    init(&j, "-0");
    u = 5;
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(u, 0);

    init(&j, "-9223372036854775808");
    assert_int_equal(kvt_json_i64(&j, &i), KVT_OK);
    assert_true(i == INT64_MIN);
    init(&j, "9223372036854775807");
    assert_int_equal(kvt_json_i64(&j, &i), KVT_OK);
    assert_true(i == INT64_MAX);
    init(&j, "-17");
    assert_int_equal(kvt_json_i64(&j, &i), KVT_OK);
    assert_int_equal(i, -17);

    init(&j, "4294967295");
    assert_int_equal(kvt_json_u32(&j, &u32), KVT_OK);
    assert_int_equal(u32, UINT32_MAX);

    init(&j, "-1");
    assert_int_equal(kvt_json_hash(&j, &u), KVT_OK);
    assert_true(u == UINT64_MAX);
    init(&j, "-9223372036854775808");
    assert_int_equal(kvt_json_hash(&j, &u), KVT_OK);
    assert_true(u == UINT64_C(9223372036854775808));
    init(&j, "18446744073709551615");
    assert_int_equal(kvt_json_hash(&j, &u), KVT_OK);
    assert_true(u == UINT64_MAX);
    init(&j, "-4658296946329380185"); /* an SGLang-style signed id */
    assert_int_equal(kvt_json_hash(&j, &u), KVT_OK);
    assert_true(u == (uint64_t)INT64_C(-4658296946329380185));

    init(&j, "1.5");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 1.5);
    init(&j, "-0");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 0.0 && signbit(d));
    init(&j, "-0.0e+0");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 0.0 && signbit(d));
    init(&j, "1e3");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 1000.0);
    init(&j, "0.1");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 0.1);
    init(&j, "123456789012345678901234567890");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 123456789012345678901234567890.0);
    init(&j, "2.2250738585072014E-308");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 2.2250738585072014E-308);
    init(&j, "1e-400"); /* underflow is 0, not an error */
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 0.0);
    init(&j, "0e99999999999999999999");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 0.0);

    init(&j, "true");
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_TRUE);
    assert_int_equal(kvt_json_bool(&j, &b), KVT_OK);
    assert_true(b);
    assert_int_equal(kvt_json_end(&j), KVT_OK);
    init(&j, "false");
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_FALSE);
    assert_int_equal(kvt_json_bool(&j, &b), KVT_OK);
    assert_false(b);
    init(&j, "null");
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_NULL);
    assert_int_equal(kvt_json_null(&j), KVT_OK);
    assert_int_equal(kvt_json_end(&j), KVT_OK);
}

/* Doubles must be correctly rounded, also past the digits kept. */
static void test_double_rounding(void **state)
{
    (void)state;
    kvt_json_t j;
    double d;
    char *s = malloc(4096);
    assert_non_null(s);

    /* 2^53 + 1 is a tie: rounds to even (2^53). */
    init(&j, "9007199254740993");
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 9007199254740992.0);
    /* Just above the tie: rounds up, even when the deciding digit is digit 818. */
    int n = snprintf(s, 4096, "9007199254740993.");
    for (int k = 0; k < 800; k++)
        s[n++] = '0';
    s[n++] = '1';
    s[n] = '\0';
    init(&j, s);
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 9007199254740994.0);
    /* The same value spelled with an exponent and leading zeros in the fraction. */
    n = snprintf(s, 4096, "0.0000009007199254740993");
    for (int k = 0; k < 800; k++)
        s[n++] = '0';
    n += snprintf(s + n, 4096 - (size_t)n, "1e22");
    init(&j, s);
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == 9007199254740994.0);
    /* Many digits that all count: compare with strtod. */
    n = snprintf(s, 4096, "0.");
    for (int k = 0; k < 1500; k++)
        s[n++] = (char)('0' + (k * 7 + 3) % 10);
    s[n] = '\0';
    init(&j, s);
    assert_int_equal(kvt_json_double(&j, &d), KVT_OK);
    assert_true(d == strtod(s, NULL));
    free(s);
}

static void test_number_errors(void **state)
{
    (void)state;
    kvt_json_t j;
    uint64_t u;
    int64_t i;
    uint32_t u32;
    double d;

    init(&j, "18446744073709551616"); /* 2^64 */
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 0, "2^64");
    init(&j, "[1, 99999999999999999999999]");
    assert_int_equal(kvt_json_array_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_array_next(&j), 1);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(kvt_json_array_next(&j), 1);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 4, "huge in array");
    init(&j, "-1");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 0, "-1 as u64");
    init(&j, "1e3");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 0, "1e3 as u64");
    init(&j, "  1.0");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 2, "1.0 as u64");
    init(&j, "2.5");
    assert_int_equal(kvt_json_i64(&j, &i), KVT_ERR_INVAL);
    init(&j, "1E2");
    assert_int_equal(kvt_json_hash(&j, &u), KVT_ERR_INVAL);
    init(&j, "9223372036854775808");
    assert_int_equal(kvt_json_i64(&j, &i), KVT_ERR_RANGE);
    init(&j, "-9223372036854775809");
    assert_int_equal(kvt_json_i64(&j, &i), KVT_ERR_RANGE);
    init(&j, "-9223372036854775809");
    assert_int_equal(kvt_json_hash(&j, &u), KVT_ERR_RANGE);
    init(&j, "18446744073709551616");
    assert_int_equal(kvt_json_hash(&j, &u), KVT_ERR_RANGE);
    init(&j, "4294967296");
    assert_int_equal(kvt_json_u32(&j, &u32), KVT_ERR_RANGE);
    init(&j, "-5");
    assert_int_equal(kvt_json_u32(&j, &u32), KVT_ERR_RANGE);
    init(&j, "1e400");
    assert_int_equal(kvt_json_double(&j, &d), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 0, "1e400");
    init(&j, "-1e400");
    assert_int_equal(kvt_json_double(&j, &d), KVT_ERR_RANGE);

    /* Malformed numbers are parse errors, whichever reader meets them. */
    expect_skip("01", KVT_ERR_PARSE, 0);
    expect_skip("-01", KVT_ERR_PARSE, 0);
    expect_skip("[0, 007]", KVT_ERR_PARSE, 4);
    expect_skip("+1", KVT_ERR_PARSE, 0);
    expect_skip("1.", KVT_ERR_PARSE, 2);
    expect_skip("1.e5", KVT_ERR_PARSE, 2);
    expect_skip(".5", KVT_ERR_PARSE, 0);
    expect_skip("1e", KVT_ERR_PARSE, 2);
    expect_skip("1e+", KVT_ERR_PARSE, 3);
    expect_skip("1E-x", KVT_ERR_PARSE, 3);
    expect_skip("-", KVT_ERR_PARSE, 1);
    expect_skip("--1", KVT_ERR_PARSE, 1);
    expect_skip("-a", KVT_ERR_PARSE, 1);
    expect_skip("NaN", KVT_ERR_PARSE, 0);
    expect_skip("Infinity", KVT_ERR_PARSE, 0);
    expect_skip("-Infinity", KVT_ERR_PARSE, 1);
    expect_skip("0x10", KVT_ERR_PARSE, 1);
    expect_skip("1_000", KVT_ERR_PARSE, 1);
    init(&j, "01");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 0, "01 as u64");
    init(&j, "-");
    assert_int_equal(kvt_json_double(&j, &d), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 1, "- as double");
    init(&j, "- 1");
    assert_int_equal(kvt_json_i64(&j, &i), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 1, "- 1");

    /* Accepted edge forms. */
    expect_skip("0", KVT_OK, 0);
    expect_skip("-0", KVT_OK, 0);
    expect_skip("0.0", KVT_OK, 0);
    expect_skip("-0.0e-0", KVT_OK, 0);
    expect_skip("1E+9", KVT_OK, 0);
    expect_skip("123456789012345678901234567890e-999999999999", KVT_OK, 0);
}

/* ---- strings -------------------------------------------------------------------------- */

/* Decodes @s (a whole document, one string) expecting @want of @wlen bytes. */
static void check_string(const char *s, size_t slen, const char *want, size_t wlen)
{
    kvt_json_t j;
    char buf[256];
    size_t n = 999;
    init_n(&j, s, slen);
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_STRING);
    kvt_status_t st = kvt_json_string(&j, buf, sizeof(buf), &n);
    if (st != KVT_OK)
        fail_msg("input %s: %s", s, kvt_json_error(&j));
    assert_int_equal(n, wlen);
    assert_memory_equal(buf, want, wlen);
    assert_int_equal(buf[wlen], '\0');
    assert_int_equal(kvt_json_end(&j), KVT_OK);
    /* skip accepts the same */
    expect_skip_n(s, slen, KVT_OK, 0);
}

#define EXPECT_STR(lit, want) check_string(lit, sizeof(lit) - 1, want, sizeof(want) - 1)

static void test_strings(void **state)
{
    (void)state;
    EXPECT_STR("\"\"", "");
    EXPECT_STR("\"abc\"", "abc");
    EXPECT_STR("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t");
    EXPECT_STR("\"\\u0041\\u00e9\\u20AC\"", "A\xc3\xa9\xe2\x82\xac");
    EXPECT_STR("\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80");
    EXPECT_STR("\"\\uD834\\uDD1E\"", "\xf0\x9d\x84\x9e");
    EXPECT_STR("\"\\udbff\\udfff\"", "\xf4\x8f\xbf\xbf"); /* U+10FFFF */
    EXPECT_STR("\"a\\u0000b\"", "a\0b");
    EXPECT_STR("\"\\u007f\\u0080\\u07ff\\u0800\\uffff\"",
               "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf");
    EXPECT_STR("\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x7f\"",
               "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x7f");
    EXPECT_STR("\"\xed\x9f\xbf\xee\x80\x80\xf4\x8f\xbf\xbf\"",
               "\xed\x9f\xbf\xee\x80\x80\xf4\x8f\xbf\xbf");

    /* Escape errors: the offset is the backslash. */
    expect_skip("\"\\ud800\"", KVT_ERR_PARSE, 1);
    expect_skip("\"ab\\ud800\\u0041\"", KVT_ERR_PARSE, 3);
    expect_skip("\"\\ud800x\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\ud800\\ud800\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\udc00\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\udfff\\ud800\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\u12\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\u12g4\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\U0041\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\x41\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\'\"", KVT_ERR_PARSE, 1);
    expect_skip("\"\\", KVT_ERR_PARSE, 2);
    expect_skip("\"\\u00", KVT_ERR_PARSE, 1);
    /* Raw control bytes: the offset is the byte. */
    expect_skip("\"a\tb\"", KVT_ERR_PARSE, 2);
    expect_skip("\"a\nb\"", KVT_ERR_PARSE, 2);
    expect_skip("\"\x1f\"", KVT_ERR_PARSE, 1);
    expect_skip_n("\"a\0\"", 4, KVT_ERR_PARSE, 2);
    /* Invalid UTF-8: the offset is the first bad byte's sequence. */
    expect_skip("\"\xff\"", KVT_ERR_PARSE, 1);
    expect_skip("\"ab\x80\"", KVT_ERR_PARSE, 3);
    expect_skip("\"\xc0\x80\"", KVT_ERR_PARSE, 1);         /* overlong NUL */
    expect_skip("\"\xc1\xbf\"", KVT_ERR_PARSE, 1);         /* overlong */
    expect_skip("\"\xe0\x80\xaf\"", KVT_ERR_PARSE, 1);     /* overlong */
    expect_skip("\"\xed\xa0\x80\"", KVT_ERR_PARSE, 1);     /* encoded surrogate */
    expect_skip("\"\xf0\x80\x80\xaf\"", KVT_ERR_PARSE, 1); /* overlong */
    expect_skip("\"\xf4\x90\x80\x80\"", KVT_ERR_PARSE, 1); /* above U+10FFFF */
    expect_skip("\"\xf5\x80\x80\x80\"", KVT_ERR_PARSE, 1);
    expect_skip("\"x\xe2\x82\"", KVT_ERR_PARSE, 2); /* truncated */
    expect_skip("\"\xe2\x82", KVT_ERR_PARSE, 1);    /* truncated at the end */
    expect_skip("\"\xc3(\"", KVT_ERR_PARSE, 1);
    /* Unterminated: the offset is the end. */
    expect_skip("\"abc", KVT_ERR_PARSE, 4);
    expect_skip("\"", KVT_ERR_PARSE, 1);
    expect_skip("[\"a\\\"]", KVT_ERR_PARSE, 6);
}

static void test_string_buffer(void **state)
{
    (void)state;
    kvt_json_t j;
    char buf[8];
    size_t n = 0;

    init(&j, "\"abcd\"");
    assert_int_equal(kvt_json_string(&j, buf, 5, &n), KVT_OK);
    assert_string_equal(buf, "abcd");
    assert_int_equal(n, 4);
    init(&j, "\"abcd\"");
    n = 42;
    assert_int_equal(kvt_json_string(&j, buf, 4, &n), KVT_ERR_TOO_BIG);
    assert_int_equal(n, 42);
    check_err_state(&j, KVT_ERR_TOO_BIG, 0, "abcd cap 4");
    /* A multi-byte character that would not fit whole. */
    init(&j, " \"ab\\u20ac\"");
    assert_int_equal(kvt_json_string(&j, buf, 5, &n), KVT_ERR_TOO_BIG);
    check_err_state(&j, KVT_ERR_TOO_BIG, 1, "euro cap 5");
    init(&j, "\"ab\\u20ac\"");
    assert_int_equal(kvt_json_string(&j, buf, 6, &n), KVT_OK);
    assert_int_equal(n, 5);
    init(&j, "\"\"");
    assert_int_equal(kvt_json_string(&j, buf, 1, &n), KVT_OK);
    assert_int_equal(n, 0);
    init(&j, "\"x\"");
    assert_int_equal(kvt_json_string(&j, NULL, 0, &n), KVT_ERR_INVAL);
    /* len_p may be NULL */
    init(&j, "\"xy\"");
    assert_int_equal(kvt_json_string(&j, buf, sizeof(buf), NULL), KVT_OK);
    assert_string_equal(buf, "xy");
}

/* ---- containers ----------------------------------------------------------------------- */

static void test_containers(void **state)
{
    (void)state;
    kvt_json_t j;
    const char *key;
    size_t klen;
    uint64_t u;
    char buf[32];
    bool b;

    init(&j, " { \"a\" : 1 , \"b\\u0000c\":[true, \"x\", {}, []], \"\":null } ");
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_OBJECT);
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_NONE); /* a key is due, not a value */
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_string_equal(key, "a");
    assert_int_equal(klen, 1);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(u, 1);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_int_equal(klen, 3);
    assert_memory_equal(key, "b\0c", 4);
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_ARRAY);
    assert_int_equal(kvt_json_array_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_array_next(&j), 1);
    assert_int_equal(kvt_json_bool(&j, &b), KVT_OK);
    assert_true(b);
    assert_int_equal(kvt_json_array_next(&j), 1);
    assert_int_equal(kvt_json_string(&j, buf, sizeof(buf), NULL), KVT_OK);
    assert_string_equal(buf, "x");
    assert_int_equal(kvt_json_array_next(&j), 1);
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, NULL, NULL), 0);
    assert_int_equal(kvt_json_array_next(&j), 1);
    assert_int_equal(kvt_json_array_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_array_next(&j), 0);
    assert_int_equal(kvt_json_array_next(&j), 0);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_int_equal(klen, 0);
    assert_string_equal(key, "");
    assert_int_equal(kvt_json_null(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 0);
    assert_int_equal(kvt_json_end(&j), KVT_OK);

    /* Syntax errors in containers, with offsets. */
    expect_skip("{\"a\" 1}", KVT_ERR_PARSE, 5);
    expect_skip("{\"a\":1,}", KVT_ERR_PARSE, 7);
    expect_skip("{\"a\":1 \"b\":2}", KVT_ERR_PARSE, 7);
    expect_skip("{,}", KVT_ERR_PARSE, 1);
    expect_skip("{1:2}", KVT_ERR_PARSE, 1);
    expect_skip("{a:1}", KVT_ERR_PARSE, 1);
    expect_skip("{'a':1}", KVT_ERR_PARSE, 1);
    expect_skip("{\"a\":}", KVT_ERR_PARSE, 5);
    expect_skip("{\"a\"", KVT_ERR_PARSE, 4);
    expect_skip("{", KVT_ERR_PARSE, 1);
    expect_skip("{\"a\":1", KVT_ERR_PARSE, 6);
    expect_skip("[1,]", KVT_ERR_PARSE, 3);
    expect_skip("[,1]", KVT_ERR_PARSE, 1);
    expect_skip("[1,,2]", KVT_ERR_PARSE, 3);
    expect_skip("[1 2]", KVT_ERR_PARSE, 3);
    expect_skip("[1", KVT_ERR_PARSE, 2);
    expect_skip("[", KVT_ERR_PARSE, 1);
    expect_skip("]", KVT_ERR_PARSE, 0);
    expect_skip("}", KVT_ERR_PARSE, 0);
    expect_skip("[1]]", KVT_ERR_PARSE, 3);
    expect_skip("{\"a\":1}}", KVT_ERR_PARSE, 7);
    expect_skip("[}", KVT_ERR_PARSE, 1);
    expect_skip("{]", KVT_ERR_PARSE, 1);
    expect_skip("[\"a\":1]", KVT_ERR_PARSE, 4);
    expect_skip("{\"a\":1]", KVT_ERR_PARSE, 6);

    /* Keys: 255 bytes decode, 256 are TOO_BIG; skipping accepts any length. */
    char doc[700];
    int n = snprintf(doc, sizeof(doc), "{\"");
    for (int k = 0; k < 255; k++)
        doc[n++] = 'k';
    n += snprintf(doc + n, sizeof(doc) - (size_t)n, "\":1}");
    init(&j, doc);
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_int_equal(klen, 255);
    n = snprintf(doc, sizeof(doc), "{\"\\u00e9");
    for (int k = 0; k < 254; k++)
        doc[n++] = 'k';
    n += snprintf(doc + n, sizeof(doc) - (size_t)n, "\":1}");
    init(&j, doc);
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), KVT_ERR_TOO_BIG);
    check_err_state(&j, KVT_ERR_TOO_BIG, 1, "256-byte key");
    expect_skip(doc, KVT_OK, 0);
    /* ... and decode into a caller's buffer big enough for them, duplicates still refused */
    char kbuf[300];
    size_t kn = 0;
    init(&j, doc);
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next_into(&j, kbuf, sizeof(kbuf), &kn), 1);
    assert_int_equal(kn, 256);
    assert_memory_equal(kbuf, "\xc3\xa9kkk", 5);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(kvt_json_object_next_into(&j, kbuf, sizeof(kbuf), &kn), 0);
    init(&j, "{\"ab\":1,\"a\\u0062\":2}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next_into(&j, kbuf, 3, &kn), 1);
    assert_string_equal(kbuf, "ab");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(kvt_json_object_next_into(&j, kbuf, 3, &kn), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 8, "escaped duplicate key");
    init(&j, "{\"abc\":1}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next_into(&j, kbuf, 3, &kn), KVT_ERR_TOO_BIG);
    init(&j, "{\"a\":1}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next_into(&j, NULL, 0, &kn), KVT_ERR_INVAL);
    /* A bad key is a parse error whatever its length. */
    expect_skip("{\"\\q\":1}", KVT_ERR_PARSE, 2);
}

static void test_depth(void **state)
{
    (void)state;
    char doc[600];
    kvt_json_t j;

    /* 64 levels are fine, the 65th opening is TOO_BIG at its offset. */
    memset(doc, '[', 64);
    memset(doc + 64, ']', 64);
    doc[128] = '\0';
    expect_skip(doc, KVT_OK, 0);
    memset(doc, '[', 65);
    memset(doc + 65, ']', 65);
    doc[130] = '\0';
    expect_skip(doc, KVT_ERR_TOO_BIG, 64);
    /* Mixed objects and arrays, read by hand. */
    size_t n = 0;
    for (int k = 0; k < 32; k++)
        n += (size_t)snprintf(doc + n, sizeof(doc) - n, "{\"a\":[");
    doc[n++] = '1';
    for (int k = 0; k < 32; k++) {
        doc[n++] = ']';
        doc[n++] = '}';
    }
    doc[n] = '\0';
    init(&j, doc);
    for (int k = 0; k < 32; k++) {
        assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
        assert_int_equal(kvt_json_object_next(&j, NULL, NULL), 1);
        assert_int_equal(kvt_json_array_begin(&j), KVT_OK);
        assert_int_equal(kvt_json_array_next(&j), 1);
    }
    uint64_t u;
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    for (int k = 0; k < 32; k++) {
        assert_int_equal(kvt_json_array_next(&j), 0);
        assert_int_equal(kvt_json_object_next(&j, NULL, NULL), 0);
    }
    assert_int_equal(kvt_json_end(&j), KVT_OK);
    /* A lower limit. */
    init(&j, "[[1]]");
    kvt_json_set_max_depth(&j, 1);
    assert_int_equal(kvt_json_skip(&j), KVT_ERR_TOO_BIG);
    check_err_state(&j, KVT_ERR_TOO_BIG, 1, "depth 1");
    init(&j, "[[1]]");
    kvt_json_set_max_depth(&j, 0); /* clamped to 1 */
    assert_int_equal(kvt_json_array_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_array_next(&j), 1);
    assert_int_equal(kvt_json_array_begin(&j), KVT_ERR_TOO_BIG);
    /* A higher one, up to the hard limit. */
    char *deep = malloc(2 * KVT_JSON_DEPTH_LIMIT + 4);
    assert_non_null(deep);
    memset(deep, '[', KVT_JSON_DEPTH_LIMIT);
    memset(deep + KVT_JSON_DEPTH_LIMIT, ']', KVT_JSON_DEPTH_LIMIT);
    init_n(&j, deep, 2 * KVT_JSON_DEPTH_LIMIT);
    kvt_json_set_max_depth(&j, 100000);
    assert_int_equal(kvt_json_skip(&j), KVT_OK);
    assert_int_equal(kvt_json_end(&j), KVT_OK);
    free(deep);
}

static void test_type_errors(void **state)
{
    (void)state;
    kvt_json_t j;
    uint64_t u;
    bool b;
    char buf[8];
    double d;

    init(&j, "{\"a\": \"x\"}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, NULL, NULL), 1);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_INVAL);
    assert_string_equal(kvt_json_error(&j), "offset 6: expected an unsigned integer, got a string");
    check_err_state(&j, KVT_ERR_INVAL, 6, "u64 on string");

    init(&j, "1");
    assert_int_equal(kvt_json_string(&j, buf, sizeof(buf), NULL), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 0, "string on number");
    init(&j, "[1]");
    assert_int_equal(kvt_json_object_begin(&j), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 0, "object on array");
    init(&j, " {}");
    assert_int_equal(kvt_json_array_begin(&j), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 1, "array on object");
    init(&j, "null");
    assert_int_equal(kvt_json_bool(&j, &b), KVT_ERR_INVAL);
    init(&j, "true");
    assert_int_equal(kvt_json_null(&j), KVT_ERR_INVAL);
    init(&j, "\"1\"");
    assert_int_equal(kvt_json_double(&j, &d), KVT_ERR_INVAL);
    init(&j, "false");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_INVAL);
    /* A byte that starts no value is a parse error, whatever was asked for. */
    init(&j, "  x");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 2, "x");
    init(&j, "'a'");
    assert_int_equal(kvt_json_string(&j, buf, sizeof(buf), NULL), KVT_ERR_PARSE);
    /* Misspelled literals. */
    expect_skip("tru", KVT_ERR_PARSE, 0);
    expect_skip("trUe", KVT_ERR_PARSE, 0);
    expect_skip("True", KVT_ERR_PARSE, 0);
    expect_skip("nul", KVT_ERR_PARSE, 0);
    expect_skip("[fals]", KVT_ERR_PARSE, 1);
    expect_skip("nulll", KVT_ERR_PARSE, 4);
    init(&j, "fals");
    assert_int_equal(kvt_json_bool(&j, &b), KVT_ERR_PARSE);
    init(&j, "nUll");
    assert_int_equal(kvt_json_null(&j), KVT_ERR_PARSE);
}

/* Calls out of order are usage errors (INVAL) and never make bad text look good. */
static void test_usage_errors(void **state)
{
    (void)state;
    kvt_json_t j;
    uint64_t u;

    init(&j, "[1 2]");
    assert_int_equal(kvt_json_array_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_INVAL); /* array_next was not called */
    check_err_state(&j, KVT_ERR_INVAL, 1, "value before array_next");

    init(&j, "{\"a\":1}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_array_next(&j), KVT_ERR_INVAL); /* not in an array */
    init(&j, "{\"a\":1,\"b\":2}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, NULL, NULL), 1);
    assert_int_equal(kvt_json_object_next(&j, NULL, NULL), KVT_ERR_INVAL); /* value unread */
    check_err_state(&j, KVT_ERR_INVAL, 5, "value unread");

    init(&j, "[1]");
    assert_int_equal(kvt_json_object_next(&j, NULL, NULL), KVT_ERR_INVAL); /* not in an object */
    init(&j, "[1]");
    assert_int_equal(kvt_json_end(&j), KVT_ERR_INVAL); /* nothing read */
    init(&j, "[1]");
    assert_int_equal(kvt_json_array_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_end(&j), KVT_ERR_INVAL); /* not finished */
    init(&j, "1");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_ERR_INVAL); /* one top value only */
    init(&j, "1");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(kvt_json_skip(&j), KVT_ERR_INVAL);
    init(&j, "[1]");
    assert_int_equal(kvt_json_array_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_skip(&j), KVT_ERR_INVAL); /* skip needs a value due */
}

static void test_whitespace_and_end(void **state)
{
    (void)state;
    kvt_json_t j;

    expect_skip(" \t\r\n[ \t\r\n1 \t\r\n, \t\r\n2 \t\r\n] \t\r\n", KVT_OK, 0);
    expect_skip("", KVT_ERR_PARSE, 0);
    expect_skip(" \n ", KVT_ERR_PARSE, 3);
    expect_skip("\f1", KVT_ERR_PARSE, 0);
    expect_skip("\v1", KVT_ERR_PARSE, 0);
    expect_skip("[1,\f2]", KVT_ERR_PARSE, 3);
    expect_skip("\xc2\xa0"
                "1",
                KVT_ERR_PARSE, 0); /* no-break space */
    expect_skip("\xef\xbb\xbf"
                "1",
                KVT_ERR_PARSE, 0); /* byte order mark */
    expect_skip("1 2", KVT_ERR_PARSE, 2);
    expect_skip("{} x", KVT_ERR_PARSE, 3);
    expect_skip("/*c*/1", KVT_ERR_PARSE, 0);
    expect_skip("1//c", KVT_ERR_PARSE, 1);
    expect_skip_n("1\0", 2, KVT_ERR_PARSE, 1);
    expect_skip_n("\0", 1, KVT_ERR_PARSE, 0);
    /* The length bounds the text: what lies past it is never read. */
    expect_skip_n("[1]garbage", 3, KVT_OK, 0);
    expect_skip_n("[1, 2]", 4, KVT_ERR_PARSE, 4);
    /* NULL text with length 0 */
    kvt_json_init(&j, NULL, 0);
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_NONE);
    check_err_state(&j, KVT_ERR_PARSE, 0, "NULL");
    /* peek on a bad byte sets the error */
    init(&j, "  @");
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_NONE);
    check_err_state(&j, KVT_ERR_PARSE, 2, "@");
    assert_string_equal(kvt_json_error(&j), "offset 2: expected a value, got '@'");
    init(&j, "\x01");
    assert_int_equal(kvt_json_peek(&j), KVT_JSON_NONE);
    assert_string_equal(kvt_json_error(&j), "offset 0: expected a value, got byte 0x01");
}

static void test_skip(void **state)
{
    (void)state;
    kvt_json_t j;
    const char *key;
    size_t klen;
    uint64_t u;

    init(&j, "{\"skip\": {\"a\": [1, 2.5e-3, {\"b\": [\"\\u00e9\", null, true, false]}]}, "
             "\"keep\": 7, \"more\": [[], {}]}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_string_equal(key, "skip");
    assert_int_equal(kvt_json_skip(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_string_equal(key, "keep");
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(u, 7);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_int_equal(kvt_json_skip(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 0);
    assert_int_equal(kvt_json_end(&j), KVT_OK);

    /* skip checks what it skips */
    expect_skip("{\"a\": [1, {\"b\": \"\\q\"}]}", KVT_ERR_PARSE, 17);
    expect_skip("[1, 2, [3, 01]]", KVT_ERR_PARSE, 11);
    expect_skip("[\"\xff\"]", KVT_ERR_PARSE, 2);
    /* scalars */
    expect_skip("\"s\"", KVT_OK, 0);
    expect_skip("-1.5e3", KVT_OK, 0);
    expect_skip("null", KVT_OK, 0);
}

/* ---- duplicate keys ------------------------------------------------------------------- */

/* Reads @s's top object with object_next (keys decoded), skipping values. */
static kvt_status_t read_object(kvt_json_t *j)
{
    const char *key;
    size_t klen;
    int r;
    if (kvt_json_object_begin(j) != KVT_OK)
        return kvt_json_status(j);
    while ((r = kvt_json_object_next(j, &key, &klen)) == 1)
        if (kvt_json_skip(j) != KVT_OK)
            return kvt_json_status(j);
    if (r < 0)
        return (kvt_status_t)r;
    return kvt_json_end(j);
}

/* @s is refused at @off with @st both when its top object's keys are read and when
 * it is skipped whole; the duplicate message names the key. */
static void expect_both(const char *s, kvt_status_t st, size_t off, const char *msg)
{
    kvt_json_t j;
    init(&j, s);
    kvt_status_t got = read_object(&j);
    if (st == KVT_OK) {
        if (got != KVT_OK)
            fail_msg("input \"%s\": status %d (%s), want ok", s, got, kvt_json_error(&j));
    } else {
        check_err_state(&j, st, off, s);
        if (msg != NULL && strstr(kvt_json_error(&j), msg) == NULL)
            fail_msg("input \"%s\": message \"%s\" lacks \"%s\"", s, kvt_json_error(&j), msg);
    }
    expect_skip(s, st, off);
}

static void test_duplicate_keys(void **state)
{
    (void)state;
    expect_both("{\"a\":1,\"a\":2}", KVT_ERR_INVAL, 7, "duplicate field 'a'");
    expect_both("{\"a\":1, \"b\":2, \"a\":3}", KVT_ERR_INVAL, 15, "duplicate field 'a'");
    expect_both("{\"\":1,\"\":2}", KVT_ERR_INVAL, 6, "duplicate field ''");
    /* compared decoded: escapes, raw UTF-8 and \u escapes of it, surrogate pairs */
    expect_both("{\"a\":1,\"\\u0061\":2}", KVT_ERR_INVAL, 7, "duplicate field 'a'");
    expect_both("{\"\\/\":1,\"/\":2}", KVT_ERR_INVAL, 8, "duplicate field '/'");
    expect_both("{\"\xc3\xa9t\xc3\xa9\":1,\"\\u00e9t\\u00E9\":2}", KVT_ERR_INVAL, 11,
                "duplicate field '\xc3\xa9t\xc3\xa9'");
    expect_both("{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\":2}", KVT_ERR_INVAL, 10, NULL);
    expect_both("{\"a\\u0000\":1,\"a\\u0000\":2}", KVT_ERR_INVAL, 13, "duplicate field 'a?'");
    expect_both("{\"it's\":1,\"it's\":2}", KVT_ERR_INVAL, 10, "duplicate field 'it?s'");
    /* different keys, however alike */
    expect_both("{\"a\":1,\"A\":2,\"a \":3,\"a\\u0000\":4,\"\\u00e9\":5,\"e\\u0301\":6}", KVT_OK, 0,
                NULL);
    /* one key per object: nested and sibling objects have their own */
    expect_both("{\"a\":{\"a\":{\"a\":1}},\"b\":[{\"a\":1},{\"a\":2}]}", KVT_OK, 0, NULL);
    /* a closed inner object's keys are forgotten, the outer one's are not */
    expect_both("{\"a\":{\"b\":1},\"b\":2}", KVT_OK, 0, NULL);
    expect_both("{\"a\":{\"b\":1},\"a\":2}", KVT_ERR_INVAL, 13, "duplicate field 'a'");
    expect_both("{\"x\":[{\"a\":1,\"a\":2}]}", KVT_ERR_INVAL, 13, NULL);
    /* keys over KVT_JSON_KEY_MAX are compared too when skipped */
    char big[1200];
    char k300[301];
    memset(k300, 'k', 300);
    k300[300] = '\0';
    snprintf(big, sizeof(big), "[{\"%s\":1,\"%sx\":2,\"%s\":3}]", k300, k300, k300);
    expect_skip(big, KVT_ERR_INVAL, 613);
    snprintf(big, sizeof(big), "[{\"%s\":1,\"%sx\":2}]", k300, k300);
    expect_skip(big, KVT_OK, 0);
    /* keys past the remembered length (32767 bytes) are still told apart and matched,
     * with and without escapes (the second spelling escapes its first 'k' as \u006b) */
    size_t kl = 40000, bl = 4 * kl + 64;
    char *huge = malloc(bl), *kk = malloc(kl + 1);
    assert_non_null(huge);
    assert_non_null(kk);
    memset(kk, 'k', kl);
    kk[kl] = '\0';
    snprintf(huge, bl, "[{\"%s\":1,\"%.*sj\":2}]", kk, (int)kl - 1, kk);
    expect_skip(huge, KVT_OK, 0);
    snprintf(huge, bl, "[{\"%s\":1,\"\\u006b%s\":2}]", kk, kk + 1);
    expect_skip(huge, KVT_ERR_INVAL, kl + 7);
    free(huge);
    free(kk);

    /* a duplicate is refused by a decoder that saved the parser and restores it */
    kvt_json_t j, save;
    const char *key;
    size_t klen;
    uint64_t u;
    init(&j, "{\"a\":1,\"b\":2,\"a\":3}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    save = j;
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_string_equal(key, "b");
    j = save;
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 13, "restored");

    /* mark, a string too long for its buffer, rewind, skip it: the error is forgotten and the
     * keys read before the mark are still remembered */
    kvt_json_mark_t m;
    char small[4];
    size_t slen;
    init(&j, "{\"a\":\"long string\",\"b\":1,\"a\":2}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    kvt_json_mark(&j, &m);
    assert_int_equal(kvt_json_string(&j, small, sizeof(small), &slen), KVT_ERR_TOO_BIG);
    assert_int_not_equal(kvt_json_status(&j), KVT_OK);
    kvt_json_rewind(&j, &m);
    assert_int_equal(kvt_json_status(&j), KVT_OK);
    assert_int_equal(kvt_json_skip(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), 1);
    assert_string_equal(key, "b");
    /* a mark inside an object, rewound after reading on: the members seen since are forgotten */
    kvt_json_mark(&j, &m);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    kvt_json_rewind(&j, &m);
    assert_int_equal(kvt_json_u64(&j, &u), KVT_OK);
    assert_int_equal(u, 1);
    assert_int_equal(kvt_json_object_next(&j, &key, &klen), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 25, "rewound");
    assert_non_null(strstr(kvt_json_error(&j), "duplicate field 'a'"));
}

/* The duplicate message cuts a long key at a character boundary, never inside one. */
static void test_duplicate_key_shown(void **state)
{
    (void)state;
    char doc[512], key[128], want[64];
    /* 40 ASCII bytes then 2-byte characters: wherever the cut lands, the message ends in
     * whole characters and "..." */
    for (int pre = 36; pre <= 44; pre++) {
        size_t o = 0;
        for (int i = 0; i < pre; i++)
            key[o++] = 'k';
        for (int i = 0; i < 10; i++)
            key[o++] = (char)0xc3, key[o++] = (char)0xa9;
        key[o] = '\0';
        snprintf(doc, sizeof(doc), "{\"%s\":1,\"%s\":2}", key, key);
        kvt_json_t j;
        init(&j, doc);
        assert_int_equal(read_object(&j), KVT_ERR_INVAL);
        const char *msg = strstr(kvt_json_error(&j), "duplicate field '");
        assert_non_null(msg);
        msg += strlen("duplicate field '");
        const char *end = strstr(msg, "...'");
        assert_non_null(end);
        size_t shown = (size_t)(end - msg);
        snprintf(want, sizeof(want), "%.*s", (int)shown, key);
        assert_memory_equal(msg, want, shown);
        /* as much as fits (a 48-byte buffer: 44 bytes, "..." and the NUL), less only the
         * byte of a character the cut split */
        bool split = pre <= 43 && (43 - pre) % 2 == 0; /* a character's lead byte at 43 */
        assert_int_equal(shown, split ? 43 : 44);
        /* never half a character */
        assert_true(shown <= (size_t)pre || (shown - (size_t)pre) % 2 == 0);
    }
}

/* KVT_JSON_MEMBERS_MAX: the keys of all objects open at once; closed ones free theirs. */
static void test_member_limit(void **state)
{
    (void)state;
    kvt_jbuf_t b;
    kvt_jbuf_init(&b);
    /* exactly the limit in one object, then one more */
    for (unsigned extra = 0; extra < 2; extra++) {
        kvt_jbuf_reset(&b);
        kvt_jbuf_cstr(&b, "{");
        size_t at = 0;
        for (unsigned i = 0; i < KVT_JSON_MEMBERS_MAX + extra; i++) {
            if (i > 0)
                kvt_jbuf_cstr(&b, ",");
            at = b.len;
            kvt_jbuf_printf(&b, "\"k%u\":%u", i, i);
        }
        kvt_jbuf_cstr(&b, "}");
        char msg[64];
        snprintf(msg, sizeof(msg), "more than %u members", KVT_JSON_MEMBERS_MAX);
        if (extra == 0)
            expect_both(b.buf, KVT_OK, 0, NULL);
        else
            expect_both(b.buf, KVT_ERR_TOO_BIG, at, msg);
    }
    /* an outer object's keys and an inner one's count together while both are open */
    kvt_jbuf_reset(&b);
    kvt_jbuf_cstr(&b, "{");
    unsigned outer = KVT_JSON_MEMBERS_MAX - 20;
    for (unsigned i = 0; i < outer; i++)
        kvt_jbuf_printf(&b, "\"o%u\":1,", i);
    kvt_jbuf_cstr(&b, "\"in\":{");
    size_t at = 0;
    for (unsigned i = 0; i < 20; i++) { /* outer + "in" + 20 = one over */
        at = b.len + (i ? 1 : 0);
        kvt_jbuf_printf(&b, "%s\"i%u\":1", i ? "," : "", i);
    }
    kvt_jbuf_cstr(&b, "}}");
    expect_both(b.buf, KVT_ERR_TOO_BIG, at, NULL);
    /* many objects one after another: each one's keys go when it closes */
    kvt_jbuf_reset(&b);
    kvt_jbuf_cstr(&b, "[");
    for (unsigned o = 0; o < 100; o++) {
        kvt_jbuf_cstr(&b, o ? ",{" : "{");
        for (unsigned i = 0; i + 1 < KVT_JSON_MEMBERS_MAX; i++)
            kvt_jbuf_printf(&b, "%s\"k%u\":{\"k\":1}", i ? "," : "", i);
        kvt_jbuf_cstr(&b, "}");
    }
    kvt_jbuf_cstr(&b, "]");
    expect_skip(b.buf, KVT_OK, 0);
    kvt_jbuf_cleanup(&b);
}

/* ---- number arrays -------------------------------------------------------------------- */

static void test_u32_array(void **state)
{
    (void)state;
    kvt_json_t j;
    uint32_t out[8];
    size_t n = 99;

    init(&j, "[0, 1,2 ,\t3\n,4294967295, -0]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_OK);
    assert_int_equal(n, 6);
    const uint32_t want[] = {0, 1, 2, 3, UINT32_MAX, 0};
    assert_memory_equal(out, want, sizeof(want));
    assert_int_equal(kvt_json_end(&j), KVT_OK);

    init(&j, " [ ] ");
    assert_int_equal(kvt_json_u32_array(&j, out, 0, 0, &n), KVT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvt_json_end(&j), KVT_OK);

    /* Exactly cap elements fit; one more is TOO_BIG at that element. */
    init(&j, "[1,2,3]");
    assert_int_equal(kvt_json_u32_array(&j, out, 3, 10, &n), KVT_OK);
    assert_int_equal(n, 3);
    n = 99;
    init(&j, "[1,2,3]");
    assert_int_equal(kvt_json_u32_array(&j, out, 2, 10, &n), KVT_ERR_TOO_BIG);
    assert_int_equal(n, 99);
    check_err_state(&j, KVT_ERR_TOO_BIG, 5, "cap 2");
    /* max */
    init(&j, "[1, 11]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, 10, &n), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 4, "max 10");
    init(&j, "[1, 4294967296]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 4, "2^32");
    init(&j, "[1, 123456789012345678901234567890]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_RANGE);
    init(&j, "[1, -1]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 4, "-1");
    /* shapes */
    init(&j, "[1, 2.0]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 4, "2.0");
    init(&j, "[1, 1e2]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_INVAL);
    init(&j, "[1, \"2\"]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_INVAL);
    check_err_state(&j, KVT_ERR_INVAL, 4, "string element");
    init(&j, "[1, [2]]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_INVAL);
    init(&j, "[1, 02]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 4, "02");
    init(&j, "[1,]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 3, "[1,]");
    init(&j, "[1 2]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 3, "[1 2]");
    init(&j, "[1, 2");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 5, "[1, 2");
    init(&j, "[1, -]");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_PARSE);
    check_err_state(&j, KVT_ERR_PARSE, 5, "[1, -]");
    init(&j, "{}");
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_ERR_INVAL);

    /* Inside an object, followed by more members. */
    init(&j, "{\"t\":[5,6],\"u\":7}");
    assert_int_equal(kvt_json_object_begin(&j), KVT_OK);
    assert_int_equal(kvt_json_object_next(&j, NULL, NULL), 1);
    assert_int_equal(kvt_json_u32_array(&j, out, 8, UINT32_MAX, &n), KVT_OK);
    assert_int_equal(n, 2);
    assert_int_equal(kvt_json_object_next(&j, NULL, NULL), 1);
    uint32_t v;
    assert_int_equal(kvt_json_u32(&j, &v), KVT_OK);
    assert_int_equal(v, 7);
    assert_int_equal(kvt_json_object_next(&j, NULL, NULL), 0);
    assert_int_equal(kvt_json_end(&j), KVT_OK);
}

static void test_hash_array(void **state)
{
    (void)state;
    kvt_json_t j;
    uint64_t out[16];
    size_t n = 0;

    init(&j, "[0,18446744073709551615,-1,-9223372036854775808,9999999999999999999,"
             "10000000000000000000, 12345678901234567890 ,-0]");
    assert_int_equal(kvt_json_hash_array(&j, out, 16, &n), KVT_OK);
    assert_int_equal(n, 8);
    assert_true(out[0] == 0);
    assert_true(out[1] == UINT64_MAX);
    assert_true(out[2] == UINT64_MAX);
    assert_true(out[3] == UINT64_C(9223372036854775808));
    assert_true(out[4] == UINT64_C(9999999999999999999));
    assert_true(out[5] == UINT64_C(10000000000000000000));
    assert_true(out[6] == UINT64_C(12345678901234567890));
    assert_true(out[7] == 0);
    assert_int_equal(kvt_json_end(&j), KVT_OK);

    init(&j, "[1,18446744073709551616]");
    assert_int_equal(kvt_json_hash_array(&j, out, 16, &n), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 3, "2^64");
    init(&j, "[99999999999999999999]");
    assert_int_equal(kvt_json_hash_array(&j, out, 16, &n), KVT_ERR_RANGE);
    init(&j, "[184467440737095516150]");
    assert_int_equal(kvt_json_hash_array(&j, out, 16, &n), KVT_ERR_RANGE);
    init(&j, "[-9223372036854775809]");
    assert_int_equal(kvt_json_hash_array(&j, out, 16, &n), KVT_ERR_RANGE);
    check_err_state(&j, KVT_ERR_RANGE, 1, "-2^63-1");
    init(&j, "[1.5]");
    assert_int_equal(kvt_json_hash_array(&j, out, 16, &n), KVT_ERR_INVAL);
    init(&j, "[null]");
    assert_int_equal(kvt_json_hash_array(&j, out, 16, &n), KVT_ERR_INVAL);
    init(&j, "[1,2,3]");
    assert_int_equal(kvt_json_hash_array(&j, out, 1, &n), KVT_ERR_TOO_BIG);
    check_err_state(&j, KVT_ERR_TOO_BIG, 3, "hash cap 1");
    init(&j, "[-01]");
    assert_int_equal(kvt_json_hash_array(&j, out, 16, &n), KVT_ERR_PARSE);
}

/* ---- writer --------------------------------------------------------------------------- */

static void test_writer(void **state)
{
    (void)state;
    kvt_jbuf_t b;

    kvt_jbuf_init(&b);
    assert_null(b.buf);
    kvt_jbuf_u64(&b, 0);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_u64(&b, 9);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_u64(&b, 10);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_u64(&b, 99);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_u64(&b, 100);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_u64(&b, 1234567);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_u64(&b, UINT64_MAX);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_i64(&b, INT64_MIN);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_i64(&b, -5);
    kvt_jbuf_cstr(&b, " ");
    kvt_jbuf_i64(&b, INT64_MAX);
    assert_string_equal(b.buf, "0 9 10 99 100 1234567 18446744073709551615 -9223372036854775808 -5 "
                               "9223372036854775807");
    assert_int_equal(b.len, strlen(b.buf));

    kvt_jbuf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_non_null(b.buf);
    kvt_jbuf_f64(&b, 0.1);
    kvt_jbuf_raw(&b, " ", 1);
    kvt_jbuf_f64(&b, -0.0);
    kvt_jbuf_raw(&b, " ", 1);
    kvt_jbuf_f64(&b, 1e300);
    kvt_jbuf_raw(&b, " ", 1);
    kvt_jbuf_f64(&b, NAN);
    kvt_jbuf_raw(&b, " ", 1);
    kvt_jbuf_f64(&b, -INFINITY);
    kvt_jbuf_raw(&b, " ", 1);
    kvt_jbuf_f64(&b, 2.5);
    assert_string_equal(b.buf, "0.1 -0 1e+300 null null 2.5");

    kvt_jbuf_reset(&b);
    const char raw[] = "a\"b\\c\x01\x1f\n\r\t\b\f\x7f/\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                       "\xff\xc3(\xed\xa0\x80\0z";
    kvt_jbuf_str(&b, raw, sizeof(raw) - 1);
    assert_string_equal(b.buf, "\"a\\\"b\\\\c\\u0001\\u001f\\n\\r\\t\\b\\f\x7f/\xc3\xa9\xe2\x82\xac"
                               "\xf0\x9f\x98\x80\\ufffd\\ufffd(\\ufffd\\ufffd\\ufffd\\u0000z\"");
    kvt_jbuf_reset(&b);
    kvt_jbuf_str(&b, "", 0);
    assert_string_equal(b.buf, "\"\"");

    /* printf, short and long (past its stack buffer) */
    kvt_jbuf_reset(&b);
    kvt_jbuf_printf(&b, "{\"n\":%d}", 42);
    assert_string_equal(b.buf, "{\"n\":42}");
    char big[1000];
    memset(big, 'q', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kvt_jbuf_printf(&b, "<%s>", big);
    assert_int_equal(b.len, 8 + 2 + 999);
    assert_int_equal(b.buf[b.len - 1], '>');
    assert_int_equal(b.buf[b.len], '\0');

    /* Growth keeps content; oom is sticky until reset. */
    kvt_jbuf_reset(&b);
    for (int i = 0; i < 10000; i++)
        kvt_jbuf_u64(&b, (uint64_t)i % 10);
    assert_int_equal(b.len, 10000);
    assert_int_equal(b.buf[9999], '9');
    assert_false(b.oom);
    kvt_jbuf_str(&b, "x", SIZE_MAX / 4); /* cannot be reserved: never read */
    assert_true(b.oom);
    kvt_jbuf_cstr(&b, "more");
    kvt_jbuf_u64(&b, 5);
    kvt_jbuf_printf(&b, "%s", "more");
    assert_int_equal(b.len, 10000);
    kvt_jbuf_reset(&b);
    assert_false(b.oom);
    kvt_jbuf_cstr(&b, "ok");
    assert_string_equal(b.buf, "ok");
    kvt_jbuf_cleanup(&b);
    assert_null(b.buf);
    assert_int_equal(b.len, 0);
    kvt_jbuf_cleanup(&b); /* twice is fine */
}

/* ---- randomized round trip ------------------------------------------------------------ */

static kvt_rng_t g_rng; /* started by each randomized test on its own stream */

static uint64_t rnd(void)
{
    return kvt_rng_next(&g_rng);
}

static size_t rnd_below(size_t n)
{
    return (size_t)kvt_rng_below(&g_rng, n);
}

enum { N_OBJ, N_ARR, N_STR, N_U64, N_I64, N_F64, N_TRUE, N_FALSE, N_NULL };

typedef struct node {
    int kind;
    uint64_t u;
    int64_t i;
    double d;
    char *s; /* string bytes as written (may be invalid UTF-8) */
    size_t slen;
    char *key; /* member key as written, when the parent is an object */
    size_t klen;
    struct node *kids;
    size_t nkids;
} node_t;

/* Random bytes for a string: printable ASCII, escapes, controls, valid UTF-8 of every
 * length, and invalid bytes. */
static char *rnd_bytes(size_t maxlen, size_t *len_p)
{
    size_t n = rnd_below(maxlen + 1);
    char *s = malloc(n * 4 + 1);
    assert_non_null(s);
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        switch (rnd_below(8)) {
        case 0:
        case 1:
        case 2: s[o++] = (char)(0x20 + rnd_below(0x5f)); break;
        case 3: s[o++] = "\"\\/\b\f\n\r\t"[rnd_below(8)]; break;
        case 4: s[o++] = (char)rnd_below(0x20); break;
        case 5: { /* a valid code point */
            uint32_t cp;
            do {
                size_t kind = rnd_below(3);
                cp = kind == 0   ? 0x80 + (uint32_t)rnd_below(0x780)
                     : kind == 1 ? 0x800 + (uint32_t)rnd_below(0xf800)
                                 : 0x10000 + (uint32_t)rnd_below(0x100000);
            } while (cp >= 0xd800 && cp <= 0xdfff);
            if (cp < 0x800) {
                s[o++] = (char)(0xc0 | (cp >> 6));
                s[o++] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                s[o++] = (char)(0xe0 | (cp >> 12));
                s[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                s[o++] = (char)(0x80 | (cp & 0x3f));
            } else {
                s[o++] = (char)(0xf0 | (cp >> 18));
                s[o++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                s[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                s[o++] = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default: s[o++] = (char)(0x80 + rnd_below(0x80)); break; /* often invalid */
        }
    }
    s[o] = '\0';
    *len_p = o;
    return s;
}

/*
 * The naive reference for what the writer makes of @s and the parser decodes:
 * valid UTF-8 kept, every byte that does not start a valid sequence replaced
 * by U+FFFD. Decodes code points arithmetically (not with the library's
 * range table) and then checks them.
 */
static char *ref_sanitize(const char *s, size_t n, size_t *len_p)
{
    char *out = malloc(n * 3 + 1);
    assert_non_null(out);
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = 0;
        uint32_t cp = 0, min = 0;
        if (c < 0x80) {
            out[o++] = (char)c;
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 2, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 3, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 4, cp = c & 0x07, min = 0x10000;
        }
        bool ok = k != 0 && i + k <= n;
        for (size_t m = 1; ok && m < k; m++) {
            if ((u[i + m] & 0xc0) != 0x80)
                ok = false;
            cp = (cp << 6) | (u[i + m] & 0x3f);
        }
        if (ok && (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)))
            ok = false;
        if (ok) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    *len_p = o;
    return out;
}

/* Whether kid @k's key reads (sanitised, as the parser decodes it) like an earlier kid's. */
static bool key_taken(const node_t *nd, size_t k)
{
    size_t la, lb;
    char *a = ref_sanitize(nd->kids[k].key, nd->kids[k].klen, &la);
    bool taken = false;
    for (size_t i = 0; i < k && !taken; i++) {
        char *b = ref_sanitize(nd->kids[i].key, nd->kids[i].klen, &lb);
        taken = la == lb && memcmp(a, b, la) == 0;
        free(b);
    }
    free(a);
    return taken;
}

/* A random key for kid @k of object @nd that no earlier kid has (objects are
 * valid JSON only without duplicate keys). */
static void gen_key(node_t *nd, size_t k)
{
    node_t *c = &nd->kids[k];
    for (int tries = 0;; tries++) {
        free(c->key);
        if (tries < 64) {
            c->key = rnd_bytes(12, &c->klen);
        } else {
            c->key = malloc(32);
            assert_non_null(c->key);
            c->klen = (size_t)snprintf(c->key, 32, "#%zu#%d", k, tries);
        }
        if (!key_taken(nd, k))
            return;
    }
}

static void gen(node_t *nd, int depth, size_t *budget)
{
    memset(nd, 0, sizeof(*nd));
    size_t pick = rnd_below(depth < 6 && *budget > 0 ? 12 : 9);
    if (*budget > 0)
        (*budget)--;
    switch (pick) {
    case 0: nd->kind = N_STR, nd->s = rnd_bytes(40, &nd->slen); break;
    case 1: {
        nd->kind = N_U64;
        int bits = (int)rnd_below(65);
        nd->u = bits == 0 ? 0 : rnd() >> (64 - bits);
        break;
    }
    case 2: {
        nd->kind = N_I64;
        int bits = (int)rnd_below(64);
        nd->i = bits == 0 ? 0 : (int64_t)(rnd() >> (64 - bits));
        if (rnd() & 1)
            nd->i = -nd->i - (int64_t)(rnd() & 1); /* reaches INT64_MIN too */
        break;
    }
    case 3: {
        nd->kind = N_F64;
        uint64_t bits = rnd();
        switch (rnd_below(4)) {
        case 0: memcpy(&nd->d, &bits, sizeof(nd->d)); break; /* any double, NaN/inf too */
        case 1: nd->d = (double)(int64_t)(bits >> 20) / 1024.0; break;
        case 2: nd->d = ldexp((double)(bits >> 11), (int)rnd_below(200) - 150); break;
        default: nd->d = (double)rnd_below(1000) / 10.0 - 50.0; break;
        }
        break;
    }
    case 4: nd->kind = N_TRUE; break;
    case 5: nd->kind = N_FALSE; break;
    case 6: nd->kind = N_NULL; break;
    case 7:
    case 8: nd->kind = N_STR, nd->s = rnd_bytes(8, &nd->slen); break;
    default: {
        nd->kind = pick == 9 ? N_OBJ : N_ARR;
        bool tokens = nd->kind == N_ARR && pick == 11; /* a token or hash list */
        nd->nkids = rnd_below(tokens ? 40 : 6);
        nd->kids = calloc(nd->nkids + 1, sizeof(node_t));
        assert_non_null(nd->kids);
        for (size_t k = 0; k < nd->nkids; k++) {
            if (tokens) {
                node_t *c = &nd->kids[k];
                c->kind = N_U64;
                c->u = rnd() >> (rnd_below(2) ? 32 : rnd_below(64));
            } else {
                gen(&nd->kids[k], depth + 1, budget);
            }
            if (nd->kind == N_OBJ)
                gen_key(nd, k);
        }
        break;
    }
    }
}

static void node_free(node_t *nd)
{
    for (size_t k = 0; k < nd->nkids; k++)
        node_free(&nd->kids[k]);
    free(nd->kids);
    free(nd->s);
    free(nd->key);
}

static void rnd_ws(kvt_jbuf_t *b)
{
    static const char ws[] = " \t\r\n";
    if (rnd_below(4) == 0) {
        size_t n = 1 + rnd_below(3);
        for (size_t k = 0; k < n; k++)
            kvt_jbuf_raw(b, &ws[rnd_below(4)], 1);
    }
}

static void emit(kvt_jbuf_t *b, const node_t *nd)
{
    rnd_ws(b);
    switch (nd->kind) {
    case N_OBJ:
    case N_ARR:
        kvt_jbuf_cstr(b, nd->kind == N_OBJ ? "{" : "[");
        for (size_t k = 0; k < nd->nkids; k++) {
            if (k > 0)
                kvt_jbuf_cstr(b, ",");
            if (nd->kind == N_OBJ) {
                rnd_ws(b);
                kvt_jbuf_str(b, nd->kids[k].key, nd->kids[k].klen);
                rnd_ws(b);
                kvt_jbuf_cstr(b, ":");
            }
            emit(b, &nd->kids[k]);
        }
        rnd_ws(b);
        kvt_jbuf_cstr(b, nd->kind == N_OBJ ? "}" : "]");
        break;
    case N_STR: kvt_jbuf_str(b, nd->s, nd->slen); break;
    case N_U64: kvt_jbuf_u64(b, nd->u); break;
    case N_I64: kvt_jbuf_i64(b, nd->i); break;
    case N_F64: kvt_jbuf_f64(b, nd->d); break;
    case N_TRUE: kvt_jbuf_cstr(b, "true"); break;
    case N_FALSE: kvt_jbuf_cstr(b, "false"); break;
    default: kvt_jbuf_cstr(b, "null"); break;
    }
    rnd_ws(b);
}

static void compare(kvt_json_t *j, const node_t *nd, char *buf, size_t cap);

static bool all_u64(const node_t *nd, uint64_t max)
{
    for (size_t k = 0; k < nd->nkids; k++)
        if (nd->kids[k].kind != N_U64 || nd->kids[k].u > max)
            return false;
    return true;
}

static void compare_array(kvt_json_t *j, const node_t *nd, char *buf, size_t cap)
{
    size_t n = 0;
    if (all_u64(nd, UINT32_MAX) && rnd_below(2)) {
        uint32_t *out = malloc((nd->nkids + 1) * sizeof(uint32_t));
        assert_non_null(out);
        assert_int_equal(kvt_json_u32_array(j, out, nd->nkids, UINT32_MAX, &n), KVT_OK);
        assert_int_equal(n, nd->nkids);
        for (size_t k = 0; k < n; k++)
            assert_int_equal(out[k], nd->kids[k].u);
        free(out);
        return;
    }
    if (all_u64(nd, UINT64_MAX) && rnd_below(2)) {
        uint64_t *out = malloc((nd->nkids + 1) * sizeof(uint64_t));
        assert_non_null(out);
        assert_int_equal(kvt_json_hash_array(j, out, nd->nkids, &n), KVT_OK);
        assert_int_equal(n, nd->nkids);
        for (size_t k = 0; k < n; k++)
            assert_true(out[k] == nd->kids[k].u);
        free(out);
        return;
    }
    assert_int_equal(kvt_json_array_begin(j), KVT_OK);
    for (size_t k = 0; k < nd->nkids; k++) {
        assert_int_equal(kvt_json_array_next(j), 1);
        compare(j, &nd->kids[k], buf, cap);
    }
    assert_int_equal(kvt_json_array_next(j), 0);
}

static void compare(kvt_json_t *j, const node_t *nd, char *buf, size_t cap)
{
    static const kvt_json_type_t types[] = {
        [N_OBJ] = KVT_JSON_OBJECT, [N_ARR] = KVT_JSON_ARRAY,   [N_STR] = KVT_JSON_STRING,
        [N_U64] = KVT_JSON_NUMBER, [N_I64] = KVT_JSON_NUMBER,  [N_F64] = KVT_JSON_NUMBER,
        [N_TRUE] = KVT_JSON_TRUE,  [N_FALSE] = KVT_JSON_FALSE, [N_NULL] = KVT_JSON_NULL,
    };
    bool nonfinite = nd->kind == N_F64 && !isfinite(nd->d);
    kvt_json_type_t t = kvt_json_peek(j);
    if (t != (nonfinite ? KVT_JSON_NULL : types[nd->kind]))
        fail_msg("peek %d for kind %d (%s)", t, nd->kind, kvt_json_error(j));
    if (rnd_below(16) == 0) {
        assert_int_equal(kvt_json_skip(j), KVT_OK);
        return;
    }
    switch (nd->kind) {
    case N_OBJ: {
        const char *key;
        size_t klen;
        assert_int_equal(kvt_json_object_begin(j), KVT_OK);
        for (size_t k = 0; k < nd->nkids; k++) {
            assert_int_equal(kvt_json_object_next(j, &key, &klen), 1);
            size_t wlen;
            char *want = ref_sanitize(nd->kids[k].key, nd->kids[k].klen, &wlen);
            assert_int_equal(klen, wlen);
            assert_memory_equal(key, want, wlen);
            free(want);
            compare(j, &nd->kids[k], buf, cap);
        }
        assert_int_equal(kvt_json_object_next(j, &key, &klen), 0);
        break;
    }
    case N_ARR: compare_array(j, nd, buf, cap); break;
    case N_STR: {
        size_t n, wlen;
        kvt_status_t st = kvt_json_string(j, buf, cap, &n);
        if (st != KVT_OK)
            fail_msg("string: %s", kvt_json_error(j));
        char *want = ref_sanitize(nd->s, nd->slen, &wlen);
        assert_int_equal(n, wlen);
        assert_memory_equal(buf, want, wlen);
        free(want);
        break;
    }
    case N_U64: {
        uint64_t u;
        double d;
        switch (rnd_below(3)) {
        case 0:
            assert_int_equal(kvt_json_u64(j, &u), KVT_OK);
            assert_true(u == nd->u);
            break;
        case 1:
            assert_int_equal(kvt_json_hash(j, &u), KVT_OK);
            assert_true(u == nd->u);
            break;
        default:
            assert_int_equal(kvt_json_double(j, &d), KVT_OK);
            assert_true(d == (double)nd->u);
            break;
        }
        break;
    }
    case N_I64: {
        int64_t i;
        uint64_t h;
        if (rnd_below(2)) {
            assert_int_equal(kvt_json_i64(j, &i), KVT_OK);
            assert_true(i == nd->i);
        } else {
            assert_int_equal(kvt_json_hash(j, &h), KVT_OK);
            assert_true(h == (uint64_t)nd->i);
        }
        break;
    }
    case N_F64:
        if (nonfinite) {
            assert_int_equal(kvt_json_null(j), KVT_OK);
        } else {
            double d;
            assert_int_equal(kvt_json_double(j, &d), KVT_OK);
            if (memcmp(&d, &nd->d, sizeof(d)) != 0)
                fail_msg("double %.17g read back as %.17g", nd->d, d);
        }
        break;
    case N_TRUE:
    case N_FALSE: {
        bool b;
        assert_int_equal(kvt_json_bool(j, &b), KVT_OK);
        assert_int_equal(b, nd->kind == N_TRUE);
        break;
    }
    default: assert_int_equal(kvt_json_null(j), KVT_OK); break;
    }
}

static void test_round_trip_random(void **state)
{
    (void)state;
    const char *env = getenv("KVT_JSON_ROUNDS");
    size_t rounds = env != NULL ? strtoul(env, NULL, 10) : 20000;
    kvt_jbuf_t b;
    size_t bytes = 0;
    char *buf = malloc(1 << 16);
    assert_non_null(buf);

    kvt_rng_init(&g_rng, 0);
    kvt_jbuf_init(&b);
    for (size_t r = 0; r < rounds; r++) {
        node_t root;
        size_t budget = 1 + rnd_below(40);
        gen(&root, 0, &budget);
        kvt_jbuf_reset(&b);
        emit(&b, &root);
        assert_false(b.oom);
        bytes += b.len;
        kvt_json_t j;
        kvt_json_init(&j, b.buf, b.len);
        compare(&j, &root, buf, 1 << 16);
        if (kvt_json_end(&j) != KVT_OK)
            fail_msg("round %zu: %s in %s", r, kvt_json_error(&j), b.buf);
        /* The whole document also skips cleanly. */
        kvt_json_init(&j, b.buf, b.len);
        assert_int_equal(kvt_json_skip(&j), KVT_OK);
        assert_int_equal(kvt_json_end(&j), KVT_OK);
        node_free(&root);
    }
    kvt_jbuf_cleanup(&b);
    free(buf);
    printf("round trip: %zu documents, %zu bytes\n", rounds, bytes);
}

/*
 * kvt_json_u32_array() (which takes runs of short elements by 64-byte windows
 * and eight bytes at a time) against the element-by-element reader, on random arrays of token-like
 * numbers with random spacing, now and then a bad element, a leading zero, a
 * fraction, a value over the limit or more elements than fit: the same status,
 * the same values, the same error offset.
 */
static void test_u32_array_random(void **state)
{
    (void)state;
    enum { ROUNDS = 3000, MAXN = 300 };
    static const char *const bad[] = {
        "012",         "07",         "1.5", "2e3", "-1",   "-",         "\"7\"", "[]",   "",
        "99999999999", "4294967296", "x",   "1 2", "null", "123456789", "1,,2",  "3,  4"};
    static char text[MAXN * 16 + 64];
    static uint32_t got[MAXN], want[MAXN];
    size_t fast_ok = 0, errors = 0;
    kvt_rng_init(&g_rng, 0x75333261ull);
    for (size_t r = 0; r < ROUNDS; r++) {
        size_t n = rnd_below(MAXN), len = 0;
        uint32_t max = rnd_below(8) == 0 ? (uint32_t)rnd_below(200000) : UINT32_MAX;
        size_t cap = rnd_below(10) == 0 ? rnd_below(MAXN) : MAXN;
        /* most rounds are clean; some carry a bad element every ~30 */
        uint64_t bad_rate = rnd_below(4) == 0 ? 30 : 400;
        text[len++] = '[';
        for (size_t i = 0; i < n; i++) {
            if (i > 0) {
                static const char *const sep[] = {",", ", ", ", ", ",  ", " ,", ",\n", ",\t "};
                len += (size_t)sprintf(text + len, "%s",
                                       sep[rnd_below(4) ? rnd_below(3) : rnd_below(7)]);
            }
            if (rnd_below(bad_rate) == 0) {
                len +=
                    (size_t)sprintf(text + len, "%s", bad[rnd_below(sizeof(bad) / sizeof(bad[0]))]);
                continue;
            }
            static const uint32_t lim[] = {10, 100, 1000, 128000, 10000000, UINT32_MAX};
            uint32_t v = (uint32_t)(rnd() % ((uint64_t)lim[rnd_below(6)] + 1));
            len += (size_t)sprintf(text + len, "%" PRIu32, v);
        }
        len += (size_t)sprintf(text + len, "%s", rnd_below(50) == 0 ? "" : "]");
        text[len] = '\0';

        kvt_json_t a, b;
        kvt_json_init(&a, text, len);
        size_t na = 0;
        memset(got, 0xab, sizeof(got));
        kvt_status_t sa = kvt_json_u32_array(&a, got, cap, max, &na);
        for (size_t i = cap; i < MAXN; i++)
            if (got[i] != 0xabababab)
                fail_msg("round %zu: element %zu written past cap %zu", r, i, cap);

        kvt_json_init(&b, text, len);
        size_t nb = 0;
        kvt_status_t sb = kvt_json_array_begin(&b);
        int more = 0;
        while (sb == KVT_OK && (more = kvt_json_array_next(&b)) == 1) {
            uint32_t v;
            sb = kvt_json_u32(&b, &v);
            if (sb != KVT_OK)
                break;
            if (v > max) {
                sb = KVT_ERR_RANGE;
                break;
            }
            if (nb >= cap) {
                sb = KVT_ERR_TOO_BIG;
                break;
            }
            want[nb++] = v;
        }
        if (sb == KVT_OK && more < 0)
            sb = (kvt_status_t)more;
        if (sa != sb)
            fail_msg("round %zu: status %d (%s), element reader %d (%s) on %s", r, sa,
                     kvt_json_error(&a), sb, kvt_json_error(&b), text);
        if (sa == KVT_OK) {
            assert_int_equal(na, nb);
            assert_memory_equal(got, want, nb * sizeof(got[0]));
            assert_int_equal(kvt_json_end(&a), KVT_OK);
            fast_ok += len >= 16;
        } else {
            errors++;
            /* both stop at the element at fault (the limit checks: at its start) */
            if (sa != KVT_ERR_TOO_BIG && sa != KVT_ERR_RANGE &&
                kvt_json_offset(&a) != kvt_json_offset(&b))
                fail_msg("round %zu: error at %zu (%s), element reader at %zu (%s) on %s", r,
                         kvt_json_offset(&a), kvt_json_error(&a), kvt_json_offset(&b),
                         kvt_json_error(&b), text);
        }
    }
    /* the run must have exercised both outcomes */
    assert_true(fast_ok > ROUNDS / 4);
    assert_true(errors > ROUNDS / 20);
}

/* kvt_json_put_*() against printf, written through kvt_jbuf_room()/commit(). */
static void test_put_numbers(void **state)
{
    (void)state;
    kvt_jbuf_t b;
    kvt_jbuf_init(&b);
    char want[4096];
    size_t wlen = 0;
    kvt_rng_init(&g_rng, 0x707574ull);
    for (size_t r = 0; r < 20000; r++) {
        uint64_t u = rnd() >> rnd_below(64);
        int64_t i = (int64_t)(rnd() >> rnd_below(64)) * (rnd_below(2) ? -1 : 1);
        if (r == 0) {
            u = UINT64_MAX;
            i = INT64_MIN;
        }
        char *o = kvt_jbuf_room(&b, 2 * KVT_JSON_U64_MAX_LEN + 2);
        assert_non_null(o);
        o = kvt_json_put_u64(o, u);
        o = KVT_JSON_PUT_LIT(o, ",");
        o = kvt_json_put_i64(o, i);
        o = KVT_JSON_PUT_LIT(o, ";");
        kvt_jbuf_commit(&b, o);
        wlen +=
            (size_t)snprintf(want + wlen, sizeof(want) - wlen, "%" PRIu64 ",%" PRId64 ";", u, i);
        assert_int_equal(b.len, wlen);
        assert_string_equal(b.buf, want);
        if (wlen > 2048) {
            kvt_jbuf_reset(&b);
            wlen = 0;
        }
    }
    kvt_jbuf_cleanup(&b);
}

/* The text "%.15g".."%.17g" gives: the shortest of those that reads back. */
static void f64_reference(double v, char *out, size_t cap)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/*
 * kvt_jbuf_f64() writes scores (sums of block counts times tier weights, less
 * a load term) without printf where a short decimal reads back exactly; its
 * text must equal the printf reference on such values and on random doubles
 * of every magnitude, and always read back exactly.
 */
static void test_f64_random(void **state)
{
    (void)state;
    static const double w[] = {1.0, 0.8, 0.5, 0.25, 0.3, 0.7, 1.5, 0.1};
    kvt_jbuf_t b;
    kvt_jbuf_init(&b);
    kvt_rng_init(&g_rng, 0x663634ull);
    size_t fractions = 0;
    static const double edge[] = {
        0.0, -0.0,      1.0,  -1.0,    16.0, 1e15 - 1, 1e15,  -1e15, 9007199254740992.0,
        1e9, 1e9 - 0.5, 1e-3, 9.99e-4, 0.1,  19.2,     1e300, 5e-324};
    for (size_t r = 0; r < 200000; r++) {
        double v;
        switch (r < sizeof(edge) / sizeof(edge[0]) ? 9 : rnd_below(5)) {
        case 9: v = edge[r]; break;
        case 0: /* a score: counts times weights, minus a load */
            v = (double)rnd_below(5000) * w[rnd_below(8)] +
                (double)rnd_below(500) * w[rnd_below(8)] - (double)rnd_below(100) * w[rnd_below(8)];
            break;
        case 1: { /* a short decimal, 1..8 fraction digits */
            static const double p10[] = {1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8};
            v = (double)(int64_t)(rnd() % 100000000000ull) / p10[rnd_below(8)];
            break;
        }
        case 2: { /* any finite double */
            uint64_t bits = rnd();
            memcpy(&v, &bits, sizeof(v));
            if (!isfinite(v))
                v = 1.0;
            break;
        }
        case 3: /* around the fast path's bounds */
            v = ldexp((double)(rnd() >> 11), -(int)rnd_below(64)) * (rnd_below(2) ? 1e-3 : 1e9);
            break;
        default: v = (double)(int64_t)rnd() / (double)(1 + rnd_below(1000)); break;
        }
        if (r >= sizeof(edge) / sizeof(edge[0]) && rnd_below(2))
            v = -v;
        char want[64];
        f64_reference(v, want, sizeof(want));
        kvt_jbuf_reset(&b);
        kvt_jbuf_f64(&b, v);
        if (strcmp(b.buf, want) != 0)
            fail_msg("value %.17g: wrote \"%s\", printf reference \"%s\"", v, b.buf, want);
        assert_true(strtod(b.buf, NULL) == v);
        fractions += strchr(b.buf, '.') != NULL && strchr(b.buf, 'e') == NULL;
    }
    kvt_jbuf_cleanup(&b);
    assert_true(fractions > 50000);
}

/* ---- agreement with Python's json module ---------------------------------------------- */

typedef struct doc {
    char *s;
    size_t n;
} doc_t;

#define LIT(x)                                                                                     \
    {                                                                                              \
        x, sizeof(x) - 1                                                                           \
    }
static const struct {
    const char *s;
    size_t n;
} g_tricky[] = {
    LIT("0"),
    LIT("-0"),
    LIT("-0.0e+0"),
    LIT("1E5"),
    LIT("1e-5"),
    LIT("[]"),
    LIT("{}"),
    LIT(" [ ] "),
    LIT("\"\\u0000\""),
    LIT("\"\\ud83d\\ude00\""),
    LIT("\"\\u00e9\""),
    LIT("\"\xc3\xa9\""),
    LIT("[1,[2,[3]]]"),
    LIT("{\"a\":{\"b\":[]}}"),
    LIT("\"\\/\""),
    LIT("123456789012345678901234567890"),
    LIT("1e999"),
    LIT("-1e-999"),
    LIT("\"\x7f\""),
    LIT("true"),
    LIT("false"),
    LIT("null"),
    LIT("\"\\uD834\\uDD1E\""),
    LIT("\"\xf4\x8f\xbf\xbf\""),
    LIT("\"\xee\x80\x80\""),
    LIT(" \t\r\n1 \t\r\n"),
    LIT("[\"\", \"\\\"\", {\"\": \"\"}]"),
    /* rejected */
    LIT(""),
    LIT(" "),
    LIT("["),
    LIT("]"),
    LIT("[1,]"),
    LIT("{\"a\":1,}"),
    LIT("{\"a\":1,\"a\":2}"),
    LIT("{\"a\":1,\"\\u0061\":2}"),
    LIT("{\"\xc3\xa9\":1,\"\\u00e9\":2}"),
    LIT("{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\":2}"),
    LIT("{\"a\":{\"a\":1},\"b\":[{\"a\":1},{\"a\":1}]}"),
    LIT("{\"a\":{\"b\":1},\"b\":2}"),
    LIT("{\"a\":{\"b\":1},\"a\":2}"),
    LIT("{\"a\\u0000\":1,\"a\":2}"),
    LIT("{\"\":1,\"\":2}"),
    LIT("{,}"),
    LIT("[,1]"),
    LIT("01"),
    LIT("-01"),
    LIT("+1"),
    LIT(".1"),
    LIT("1."),
    LIT("1.e1"),
    LIT("1e"),
    LIT("1e+"),
    LIT("-"),
    LIT("--1"),
    LIT("0x10"),
    LIT("NaN"),
    LIT("Infinity"),
    LIT("-Infinity"),
    LIT("nul"),
    LIT("True"),
    LIT("tru e"),
    LIT("\"abc"),
    LIT("\"\\x\""),
    LIT("\"\\u12\""),
    LIT("\"\\uZZZZ\""),
    LIT("\"\\ud800\""),
    LIT("\"\\udc00\""),
    LIT("\"\\ud800\\u0041\""),
    LIT("\"\\ud800x\""),
    LIT("\"\\udbff\\udbff\""),
    LIT("\"a\tb\""),
    LIT("\"a\nb\""),
    LIT("\"\0\""),
    LIT("\xef\xbb\xbf"
        "1"),
    LIT("\"\xff\""),
    LIT("\"\xc0\x80\""),
    LIT("\"\xed\xa0\x80\""),
    LIT("\"\xf4\x90\x80\x80\""),
    LIT("\"\xe2\x82\""),
    LIT("1 2"),
    LIT("[1 2]"),
    LIT("{\"a\" 1}"),
    LIT("{\"a\":}"),
    LIT("{a:1}"),
    LIT("['a']"),
    LIT("[1]x"),
    LIT("\f1"),
    LIT("\v1"),
    LIT("\xc2\xa0"
        "1"),
    LIT("1\0"),
    LIT("[1]]"),
    LIT("{\"a\":1}}"),
    LIT("/*c*/1"),
    LIT("[1,,2]"),
    LIT("\"\\U0041\""),
    LIT("{\"a\":1 \"b\":2}"),
    LIT("[\"a\":1]"),
    LIT("{\"a\",1}"),
    LIT("\"\\u00e\""),
    LIT("1.5e"),
    LIT("-.5"),
    LIT("1e1.5"),
    LIT("\"\xc3\""),
    LIT("\x80"),
};

/* Our verdict: skip + end, and a full typed walk must agree with it. */
static int our_verdict(const char *s, size_t n);

static int walk(kvt_json_t *j, char *buf, size_t cap)
{
    switch (kvt_json_peek(j)) {
    case KVT_JSON_OBJECT: {
        int r;
        if (kvt_json_object_begin(j) != KVT_OK)
            return -1;
        while ((r = kvt_json_object_next(j, NULL, NULL)) == 1)
            if (walk(j, buf, cap) != 0)
                return -1;
        return r;
    }
    case KVT_JSON_ARRAY: {
        int r;
        if (kvt_json_array_begin(j) != KVT_OK)
            return -1;
        while ((r = kvt_json_array_next(j)) == 1)
            if (walk(j, buf, cap) != 0)
                return -1;
        return r;
    }
    case KVT_JSON_STRING: return kvt_json_string(j, buf, cap, NULL) == KVT_OK ? 0 : -1;
    case KVT_JSON_NUMBER: return kvt_json_skip(j) == KVT_OK ? 0 : -1;
    case KVT_JSON_TRUE:
    case KVT_JSON_FALSE: {
        bool b;
        return kvt_json_bool(j, &b) == KVT_OK ? 0 : -1;
    }
    case KVT_JSON_NULL: return kvt_json_null(j) == KVT_OK ? 0 : -1;
    default: return -1;
    }
}

static int our_verdict(const char *s, size_t n)
{
    kvt_json_t j;
    kvt_json_init(&j, s, n);
    int a = kvt_json_skip(&j) == KVT_OK && kvt_json_end(&j) == KVT_OK;
    char *buf = malloc(n + 1);
    assert_non_null(buf);
    kvt_json_init(&j, s, n);
    int b = walk(&j, buf, n + 1) == 0 && kvt_json_end(&j) == KVT_OK;
    free(buf);
    if (a != b)
        fail_msg("skip says %d, walk says %d: %.*s", a, b, (int)n, s);
    return a;
}

/* A mutation of a valid document: a byte changed, inserted, dropped or duplicated. */
static void mutate(doc_t *d)
{
    static const char interesting[] = "\"\\,:[]{}0-+.eE \t\n\x01\x7f\x80\xc3\xed\xff"
                                      "u1a";
    size_t muts = 1 + rnd_below(3);
    d->s = realloc(d->s, d->n + muts + 1);
    assert_non_null(d->s);
    for (size_t m = 0; m < muts; m++) {
        size_t at = rnd_below(d->n + 1);
        char c = interesting[rnd_below(sizeof(interesting) - 1)];
        switch (rnd_below(4)) {
        case 0:
            if (at < d->n)
                d->s[at] = c;
            break;
        case 1:
            memmove(d->s + at + 1, d->s + at, d->n - at);
            d->s[at] = c;
            d->n++;
            break;
        case 2:
            if (at < d->n) {
                memmove(d->s + at, d->s + at + 1, d->n - at - 1);
                d->n--;
            }
            break;
        default:
            if (at < d->n) {
                memmove(d->s + at + 1, d->s + at, d->n - at);
                d->n++;
            }
            break;
        }
    }
}

static char g_fixture[4096];

static int find_fixture(void)
{
    const char *src = getenv("KVT_SOURCE_DIR");
    if (src != NULL && src[0] != '\0') {
        snprintf(g_fixture, sizeof(g_fixture), "%s/tests/fixtures/json_check.py", src);
    } else {
        const char *self = __FILE__;
        const char *tail = strstr(self, "tests/unit/test_json.c");
        if (tail == NULL)
            return -1;
        snprintf(g_fixture, sizeof(g_fixture), "%.*stests/fixtures/json_check.py",
                 (int)(tail - self), self);
    }
    return access(g_fixture, R_OK) == 0 && strchr(g_fixture, '\'') == NULL ? 0 : -1;
}

/*
 * Duplicate keys against a naive model: objects whose keys come from a small
 * set of spellings (several of which decode alike), nested at random. The
 * model decodes every key and compares it with each earlier one of its object.
 */
static const struct {
    const char *text; /* as written between the quotes */
    int id;           /* equal ids decode alike */
} g_spellings[] = {
    {"a", 0},
    {"\\u0061", 0},
    {"\\u0041", 1},
    {"A", 1},
    {"\xc3\xa9", 2},
    {"\\u00e9", 2},
    {"\\u00E9", 2},
    {"e\\u0301", 3},
    {"", 4},
    {"\\u0000", 5},
    {"\\ud83d\\ude00", 6},
    {"\xf0\x9f\x98\x80", 6},
    {"\\\"", 7},
    {"\\u0022", 7},
    {"\\/", 8},
    {"/", 8},
    {"a\\u0000", 9},
    {"pod", 10},
    {"p\\u006fd", 10},
    {"po", 11},
};

typedef struct dup_gen {
    kvt_jbuf_t b;
    bool dup;           /* the model saw a duplicate (before any other limit) */
    size_t dup_off;     /* where: the offending key's quote */
    unsigned open_keys; /* keys of the objects open right now */
    bool over;          /* the model passed KVT_JSON_MEMBERS_MAX first */
    size_t over_off;
} dup_gen_t;

static void dup_value(dup_gen_t *g, int depth)
{
    size_t pick = rnd_below(depth < 4 ? 6 : 3);
    if (pick == 0) {
        kvt_jbuf_u64(&g->b, rnd_below(100));
    } else if (pick == 1) {
        kvt_jbuf_cstr(&g->b, "\"v\"");
    } else if (pick == 2) {
        kvt_jbuf_cstr(&g->b, "null");
    } else if (pick == 3) {
        size_t n = rnd_below(4);
        kvt_jbuf_cstr(&g->b, "[");
        for (size_t i = 0; i < n; i++) {
            if (i)
                kvt_jbuf_cstr(&g->b, ",");
            dup_value(g, depth + 1);
        }
        kvt_jbuf_cstr(&g->b, "]");
    } else {
        size_t n = rnd_below(8);
        int ids[8];
        unsigned base = g->open_keys;
        kvt_jbuf_cstr(&g->b, "{");
        for (size_t i = 0; i < n; i++) {
            size_t sp = rnd_below(sizeof(g_spellings) / sizeof(g_spellings[0]));
            if (i)
                kvt_jbuf_cstr(&g->b, ", ");
            size_t at = g->b.len;
            kvt_jbuf_cstr(&g->b, "\"");
            kvt_jbuf_cstr(&g->b, g_spellings[sp].text);
            kvt_jbuf_cstr(&g->b, "\":");
            ids[i] = g_spellings[sp].id;
            for (size_t k = 0; k < i && !g->dup && !g->over; k++)
                if (ids[k] == ids[i]) {
                    g->dup = true;
                    g->dup_off = at;
                }
            if (!g->dup && !g->over && ++g->open_keys > KVT_JSON_MEMBERS_MAX) {
                g->over = true;
                g->over_off = at;
            }
            dup_value(g, depth + 1);
        }
        kvt_jbuf_cstr(&g->b, "}");
        g->open_keys = base;
    }
}

static void test_duplicate_keys_random(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 0x647570ull);
    size_t dups = 0, ok = 0;
    for (int round = 0; round < 20000; round++) {
        dup_gen_t g;
        memset(&g, 0, sizeof(g));
        kvt_jbuf_init(&g.b);
        kvt_jbuf_cstr(&g.b, "[");
        dup_value(&g, 1);
        kvt_jbuf_cstr(&g.b, "]");
        assert_false(g.b.oom);
        kvt_status_t want = g.dup ? KVT_ERR_INVAL : g.over ? KVT_ERR_TOO_BIG : KVT_OK;
        size_t off = g.dup ? g.dup_off : g.over ? g.over_off : 0;
        expect_skip(g.b.buf, want, off);
        /* the typed walk (keys decoded) agrees with skip */
        assert_int_equal(our_verdict(g.b.buf, g.b.len), want == KVT_OK);
        dups += g.dup;
        ok += want == KVT_OK;
        kvt_jbuf_cleanup(&g.b);
    }
    assert_true(dups > 1000 && ok > 1000);
}

static bool g_python_ran;
static char g_python_why[256];

static void test_python_agreement(void **state)
{
    (void)state;
    char path[] = "/tmp/kvt_test_json_XXXXXX";
    char cmd[8300];

    if (access(PYTHON, X_OK) != 0) {
        snprintf(g_python_why, sizeof(g_python_why), "%s is missing", PYTHON);
        return;
    }
    if (find_fixture() != 0) {
        snprintf(g_python_why, sizeof(g_python_why),
                 "cannot find tests/fixtures/json_check.py (set KVT_SOURCE_DIR)");
        return;
    }

    /* The documents: the tricky list, then mutations of random valid documents. */
    size_t ntricky = sizeof(g_tricky) / sizeof(g_tricky[0]);
    size_t nmut = 20000, ndocs = ntricky + nmut;
    doc_t *docs = calloc(ndocs, sizeof(doc_t));
    assert_non_null(docs);
    for (size_t i = 0; i < ntricky; i++) {
        docs[i].s = malloc(g_tricky[i].n + 1);
        assert_non_null(docs[i].s);
        memcpy(docs[i].s, g_tricky[i].s, g_tricky[i].n);
        docs[i].n = g_tricky[i].n;
    }
    kvt_rng_init(&g_rng, UINT64_C(0x9e3779b97f4a7c15));
    kvt_jbuf_t b;
    kvt_jbuf_init(&b);
    for (size_t i = ntricky; i < ndocs; i++) {
        node_t root;
        size_t budget = 1 + rnd_below(12);
        gen(&root, 0, &budget);
        kvt_jbuf_reset(&b);
        emit(&b, &root);
        node_free(&root);
        docs[i].s = malloc(b.len + 1);
        assert_non_null(docs[i].s);
        memcpy(docs[i].s, b.buf, b.len);
        docs[i].n = b.len;
        if (rnd_below(8) != 0)
            mutate(&docs[i]);
    }
    kvt_jbuf_cleanup(&b);

    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    for (size_t i = 0; i < ndocs; i++) {
        for (size_t k = 0; k < docs[i].n; k++)
            fprintf(f, "%02x", (unsigned char)docs[i].s[k]);
        fputc('\n', f);
    }
    assert_int_equal(fclose(f), 0);

    snprintf(cmd, sizeof(cmd), PYTHON " '%s' '%s'", g_fixture, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t accepted = 0, mismatches = 0;
    for (size_t i = 0; i < ndocs; i++) {
        int py;
        if (fscanf(p, "%d", &py) != 1) {
            pclose(p);
            unlink(path);
            fail_msg("json_check.py gave no verdict for document %zu", i);
        }
        int ours = our_verdict(docs[i].s, docs[i].n);
        accepted += (size_t)ours;
        if (ours != py) {
            mismatches++;
            if (mismatches <= 10) {
                fprintf(stderr, "disagree (ours %d, python %d) on document %zu: ", ours, py, i);
                for (size_t k = 0; k < docs[i].n && k < 200; k++) {
                    unsigned char c = (unsigned char)docs[i].s[k];
                    fprintf(stderr, c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x", c);
                }
                fputc('\n', stderr);
            }
        }
    }
    int rc = pclose(p);
    unlink(path);
    for (size_t i = 0; i < ndocs; i++)
        free(docs[i].s);
    free(docs);
    assert_int_equal(rc, 0);
    printf("python agreement: %zu documents (%zu tricky), %zu accepted, %zu disagreements\n", ndocs,
           ntricky, accepted, mismatches);
    assert_int_equal(mismatches, 0);
    g_python_ran = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_double_rounding),
        cmocka_unit_test(test_number_errors),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_string_buffer),
        cmocka_unit_test(test_containers),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_type_errors),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_whitespace_and_end),
        cmocka_unit_test(test_skip),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_duplicate_key_shown),
        cmocka_unit_test(test_member_limit),
        cmocka_unit_test(test_u32_array),
        cmocka_unit_test(test_u32_array_random),
        cmocka_unit_test(test_hash_array),
        cmocka_unit_test(test_f64_random),
        cmocka_unit_test(test_put_numbers),
        cmocka_unit_test(test_writer),
        cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_duplicate_keys_random),
        cmocka_unit_test(test_python_agreement),
    };
    int failed = cmocka_run_group_tests_name("json", tests, NULL, NULL);
    if (failed)
        return 1;
    if (!g_python_ran) {
        fprintf(stderr, "test_json: SKIP python comparison: %s\n", g_python_why);
        return 77;
    }
    return 0;
}
