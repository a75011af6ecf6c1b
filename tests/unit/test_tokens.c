/* kvindex/tokens: the token-list parser, good and bad inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvindex/tokens.h"
#include "tests/support/rng.h"

/* Parses a NUL-terminated @s, expecting success with the @n values in @want. */
static void expect_ok(const char *s, const uint32_t *want, size_t n)
{
    uint32_t *toks = (uint32_t *)(uintptr_t)1; /* must be overwritten */
    size_t got = 12345;
    char err[128] = "unset";

    kvt_status_t st = kvt_tokens_parse(s, strlen(s), &toks, &got, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("input \"%s\": status %d (%s)", s, st, err);
    assert_int_equal(got, n);
    if (n == 0)
        assert_null(toks);
    else
        assert_memory_equal(toks, want, n * sizeof(uint32_t));
    free(toks);
}

/*
 * Parses @len bytes of @s expecting @want_st; checks that the outputs stay
 * untouched and that the message is one line naming byte @want_off.
 */
static void expect_err_n(const char *s, size_t len, kvt_status_t want_st, size_t want_off)
{
    uint32_t sentinel_buf[1];
    uint32_t *toks = sentinel_buf;
    size_t n = 777;
    char err[128];
    char prefix[32];

    kvt_status_t st = kvt_tokens_parse(s, len, &toks, &n, err, sizeof(err));
    if (st != want_st)
        fail_msg("input \"%.*s\": status %d, want %d (%s)", (int)len, s, st, want_st,
                 st == KVT_OK ? "ok" : err);
    assert_ptr_equal(toks, sentinel_buf);
    assert_int_equal(n, 777);
    assert_null(strchr(err, '\n'));
    snprintf(prefix, sizeof(prefix), "byte %zu: ", want_off);
    if (strncmp(err, prefix, strlen(prefix)) != 0)
        fail_msg("input \"%.*s\": message \"%s\" does not start with \"%s\"", (int)len, s, err,
                 prefix);
}

static void expect_err(const char *s, kvt_status_t want_st, size_t want_off)
{
    expect_err_n(s, strlen(s), want_st, want_off);
}

static void test_good_lists(void **state)
{
    (void)state;
    const uint32_t v123[] = {1, 2, 3};
    expect_ok("1,2,3", v123, 3);
    expect_ok("1 2 3", v123, 3);
    expect_ok("1, 2, 3", v123, 3);
    expect_ok("1 ,2 , 3", v123, 3);
    expect_ok("[1,2,3]", v123, 3);
    expect_ok("[ 1, 2, 3 ]", v123, 3);
    expect_ok("  [1 2 3]  \n", v123, 3);
    expect_ok("\t1\t2\t3\t", v123, 3);
    expect_ok("1\n2\n3\n", v123, 3);
    expect_ok("1\r\n2\r\n3\r\n", v123, 3);
    expect_ok("[\n  1,\n  2,\n  3\n]\n", v123, 3);
    expect_ok("001,0002,3", v123, 3);

    const uint32_t vmax[] = {0, 4294967295u, 4294967294u};
    expect_ok("0,4294967295,4294967294", vmax, 3);
    expect_ok("[0000000000000, 4294967295, 04294967294]", vmax, 3);

    const uint32_t v7[] = {7};
    expect_ok("7", v7, 1);
    expect_ok("[7]", v7, 1);
    expect_ok(" 7 ", v7, 1);
}

static void test_empty_lists(void **state)
{
    (void)state;
    expect_ok("", NULL, 0);
    expect_ok("   ", NULL, 0);
    expect_ok("\n\t\r ", NULL, 0);
    expect_ok("[]", NULL, 0);
    expect_ok(" [ \n ] ", NULL, 0);

    uint32_t *toks = (uint32_t *)(uintptr_t)1;
    size_t n = 9;
    assert_int_equal(kvt_tokens_parse(NULL, 0, &toks, &n, NULL, 0), KVT_OK);
    assert_null(toks);
    assert_int_equal(n, 0);
}

static void test_rejects(void **state)
{
    (void)state;
    /* signs */
    expect_err("-1", KVT_ERR_PARSE, 0);
    expect_err("+1", KVT_ERR_PARSE, 0);
    expect_err("1,-2", KVT_ERR_PARSE, 2);
    expect_err("1, +2", KVT_ERR_PARSE, 3);
    expect_err("1-2", KVT_ERR_PARSE, 1);
    /* hex, decimals, exponents */
    expect_err("0x10", KVT_ERR_PARSE, 1);
    expect_err("1,0X1f", KVT_ERR_PARSE, 3);
    expect_err("1.5", KVT_ERR_PARSE, 1);
    expect_err("1,2.0", KVT_ERR_PARSE, 3);
    expect_err("1e3", KVT_ERR_PARSE, 1);
    expect_err(".5", KVT_ERR_PARSE, 0);
    /* empty elements */
    expect_err("1,,2", KVT_ERR_PARSE, 2);
    expect_err("1, ,2", KVT_ERR_PARSE, 3);
    expect_err("1,2,", KVT_ERR_PARSE, 4);
    expect_err("1,2, ", KVT_ERR_PARSE, 5);
    expect_err(",1", KVT_ERR_PARSE, 0);
    expect_err(",", KVT_ERR_PARSE, 0);
    expect_err("[,]", KVT_ERR_PARSE, 1);
    expect_err("[1,]", KVT_ERR_PARSE, 3);
    expect_err("[1,2,]", KVT_ERR_PARSE, 5);
    /* garbage */
    expect_err("abc", KVT_ERR_PARSE, 0);
    expect_err("1,a", KVT_ERR_PARSE, 2);
    expect_err("12a", KVT_ERR_PARSE, 2);
    expect_err("1 a", KVT_ERR_PARSE, 2);
    expect_err("1;2", KVT_ERR_PARSE, 1);
    expect_err("\"1\"", KVT_ERR_PARSE, 0);
    expect_err("1\v2", KVT_ERR_PARSE, 1);
    expect_err("1 2 \xff", KVT_ERR_PARSE, 4);
    expect_err("null", KVT_ERR_PARSE, 0);
    /* brackets */
    expect_err("[", KVT_ERR_PARSE, 1);
    expect_err("[1,2", KVT_ERR_PARSE, 4);
    expect_err("[1,2 ", KVT_ERR_PARSE, 5);
    expect_err("1,2]", KVT_ERR_PARSE, 3);
    expect_err("]", KVT_ERR_PARSE, 0);
    expect_err("[[1]]", KVT_ERR_PARSE, 1);
    expect_err("[1]]", KVT_ERR_PARSE, 3);
    expect_err("[1][2]", KVT_ERR_PARSE, 3);
    expect_err("[1] 2", KVT_ERR_PARSE, 4);
    expect_err("[1],", KVT_ERR_PARSE, 3);
    expect_err("1 [2]", KVT_ERR_PARSE, 2);
    /* overflow: the message names the number's first byte */
    expect_err("4294967296", KVT_ERR_RANGE, 0);
    expect_err("1, 99999999999999999999999999", KVT_ERR_RANGE, 3);
    expect_err("[0,10000000000]", KVT_ERR_RANGE, 3);
    expect_err("42949672950", KVT_ERR_RANGE, 0);
}

static void test_nul_bytes(void **state)
{
    (void)state;
    expect_err_n("1,2\0", 4, KVT_ERR_PARSE, 3);
    expect_err_n("\0", 1, KVT_ERR_PARSE, 0);
    expect_err_n("1\0"
                 "2",
                 3, KVT_ERR_PARSE, 1);
    expect_err_n("[1,\0]", 5, KVT_ERR_PARSE, 3);

    char err[128];
    uint32_t *toks = NULL;
    size_t n = 0;
    assert_int_equal(kvt_tokens_parse("1,\0", 3, &toks, &n, err, sizeof(err)), KVT_ERR_PARSE);
    assert_non_null(strstr(err, "NUL"));
}

static void test_messages(void **state)
{
    (void)state;
    char err[128];
    uint32_t *toks = NULL;
    size_t n = 0;

    assert_int_equal(kvt_tokens_parse("1,,2", 4, &toks, &n, err, sizeof(err)), KVT_ERR_PARSE);
    assert_string_equal(err, "byte 2: expected a token id after ',', got ','");
    assert_int_equal(kvt_tokens_parse("-5", 2, &toks, &n, err, sizeof(err)), KVT_ERR_PARSE);
    assert_non_null(strstr(err, "sign"));
    assert_int_equal(kvt_tokens_parse("[1", 2, &toks, &n, err, sizeof(err)), KVT_ERR_PARSE);
    assert_string_equal(err, "byte 2: expected ',' or ']', got end of input");
    assert_int_equal(kvt_tokens_parse("9999999999", 10, &toks, &n, err, sizeof(err)),
                     KVT_ERR_RANGE);
    assert_string_equal(err, "byte 0: token id exceeds 4294967295");

    /* A tiny error buffer is truncated, not overrun; NULL err is fine. */
    char tiny[4] = "zzz";
    assert_int_equal(kvt_tokens_parse("x", 1, &toks, &n, tiny, 2), KVT_ERR_PARSE);
    assert_int_equal(tiny[1], '\0');
    assert_int_equal(tiny[2], 'z');
    assert_int_equal(kvt_tokens_parse("x", 1, &toks, &n, NULL, 0), KVT_ERR_PARSE);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    uint32_t *toks = NULL;
    size_t n = 0;
    assert_int_equal(kvt_tokens_parse(NULL, 1, &toks, &n, NULL, 0), KVT_ERR_INVAL);
    assert_int_equal(kvt_tokens_parse("1", 1, NULL, &n, NULL, 0), KVT_ERR_INVAL);
    assert_int_equal(kvt_tokens_parse("1", 1, &toks, NULL, NULL, 0), KVT_ERR_INVAL);
}

/*
 * Input placed flush against a PROT_NONE page: any read past len faults.
 * Also checks that a length cut in the middle of a number stops there.
 */
static void test_not_nul_terminated(void **state)
{
    (void)state;
    long page = sysconf(_SC_PAGESIZE);
    char *map =
        mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(map != MAP_FAILED);
    assert_int_equal(mprotect(map + page, (size_t)page, PROT_NONE), 0);

    static const char *const inputs[] = {"1,2,3", "[4294967295]", "12", " ", "[1,", "1,", "",
                                         "[",     "4294967296"};
    for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
        size_t len = strlen(inputs[i]);
        char *s = map + page - len;
        memcpy(s, inputs[i], len);
        uint32_t *toks = NULL;
        size_t n = 0;
        kvt_status_t st = kvt_tokens_parse(s, len, &toks, &n, NULL, 0);
        (void)st; /* surviving is the point; values are checked below */
        free(toks);
    }

    /* "12345" cut to 3 bytes is 123. */
    char *s = map + page - 3;
    memcpy(s, "123", 3);
    uint32_t *toks = NULL;
    size_t n = 0;
    assert_int_equal(kvt_tokens_parse(s, 3, &toks, &n, NULL, 0), KVT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(toks[0], 123);
    free(toks);

    const char buf[] = "7,8,9999";
    assert_int_equal(kvt_tokens_parse(buf, 5, &toks, &n, NULL, 0), KVT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(toks[2], 9);
    free(toks);

    munmap(map, (size_t)page * 2);
}

/* Appends "v<sep>" for 0..n-1 values into a malloc'd buffer. */
static char *format_list(const uint32_t *v, size_t n, const char *sep, size_t *len_p)
{
    size_t cap = n * (10 + strlen(sep)) + 3, len = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    s[len++] = '[';
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s%u", i == 0 ? "" : sep, v[i]);
    s[len++] = ']';
    *len_p = len;
    return s;
}

static void test_big_lists(void **state)
{
    (void)state;
    const size_t n_all = 1000000;
    uint32_t *want = malloc(n_all * sizeof(uint32_t));
    assert_non_null(want);
    kvt_rng_t rng;
    kvt_rng_init(&rng, 88172645463325252u);
    for (size_t i = 0; i < n_all; i++)
        want[i] = (uint32_t)kvt_rng_next(&rng);
    want[0] = 0;

    /* A million ids with commas; a quarter of that for the other separators. */
    static const char *const seps[] = {",", ", ", " ", "\n", " ,\t"};
    for (size_t k = 0; k < sizeof(seps) / sizeof(seps[0]); k++) {
        size_t len, n = k == 0 ? n_all : n_all / 4;
        want[n - 1] = 4294967295u;
        char *s = format_list(want, n, seps[k], &len);
        uint32_t *toks = NULL;
        size_t got = 0;
        assert_int_equal(kvt_tokens_parse(s, len, &toks, &got, NULL, 0), KVT_OK);
        assert_int_equal(got, n);
        assert_memory_equal(toks, want, n * sizeof(uint32_t));
        free(toks);
        /* Without the brackets too. */
        assert_int_equal(kvt_tokens_parse(s + 1, len - 2, &toks, &got, NULL, 0), KVT_OK);
        assert_int_equal(got, n);
        assert_memory_equal(toks, want, n * sizeof(uint32_t));
        free(toks);
        free(s);
    }
    free(want);
}

/* The token limit at small sizes, exactly at the boundary. */
static void test_limit(void **state)
{
    (void)state;
    uint32_t *toks = NULL;
    size_t n = 0;
    char err[128];

    for (size_t max = 0; max < 600; max += (max < 10 ? 1 : 97)) {
        for (size_t count = max > 0 ? max - 1 : 0; count <= max + 1; count++) {
            char *s = malloc(2 * count + 1);
            assert_non_null(s);
            for (size_t i = 0; i < count; i++)
                memcpy(s + 2 * i, "7,", 2);
            size_t len = count > 0 ? 2 * count - 1 : 0;
            kvt_status_t st = kvt_tokens_parse_max(s, len, max, &toks, &n, err, sizeof(err));
            if (count <= max) {
                assert_int_equal(st, KVT_OK);
                assert_int_equal(n, count);
                for (size_t i = 0; i < count; i++)
                    assert_int_equal(toks[i], 7);
                free(toks);
            } else {
                assert_int_equal(st, KVT_ERR_TOO_BIG);
                char want[64];
                snprintf(want, sizeof(want), "byte %zu: more than %zu tokens", 2 * max, max);
                assert_string_equal(err, want);
            }
            free(s);
        }
    }
}

/*
 * The real limit: one token past KVT_TOKENS_MAX is KVT_ERR_TOO_BIG ("0," is
 * the cheapest token; 128 MiB of input).
 */
static void test_too_many(void **state)
{
    (void)state;
    size_t n = KVT_TOKENS_MAX + 1;
    char *s = malloc(2 * n);
    assert_non_null(s);
    memcpy(s, "0,", 2);
    for (size_t have = 2; have < 2 * n; have *= 2) /* doubling: few, large copies */
        memcpy(s + have, s, have < 2 * n - have ? have : 2 * n - have);
    uint32_t *toks = NULL;
    size_t got = 0;
    char err[128];

    assert_int_equal(kvt_tokens_parse(s, 2 * n - 1, &toks, &got, err, sizeof(err)),
                     KVT_ERR_TOO_BIG);
    assert_null(toks);
    char want[64];
    snprintf(want, sizeof(want), "byte %zu: more than %zu tokens", 2 * KVT_TOKENS_MAX,
             KVT_TOKENS_MAX);
    assert_string_equal(err, want);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_lists),
        cmocka_unit_test(test_empty_lists),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_nul_bytes),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_not_nul_terminated),
        cmocka_unit_test(test_big_lists),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_too_many),
    };
    return cmocka_run_group_tests_name("tokens", tests, NULL, NULL);
}
