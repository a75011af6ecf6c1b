/*
 * libFuzzer target for kvt_tokens_parse (kvindex/tokens.c).
 *
 * Invariants checked on every input:
 *  - the input is copied to an exactly-sized heap buffer, so ASan reports any
 *    read past len;
 *  - success: the list has one value per maximal run of digits, equal to that
 *    run's value; the input holds only digits, separators and brackets; and
 *    re-formatting the values (three ways) parses back to the same list;
 *  - failure: a known status, outputs untouched, one-line message
 *    "byte N: ..." with N <= len; KVT_ERR_RANGE points at a digit run whose
 *    value exceeds 4294967295;
 *  - the result does not depend on whether an error buffer is given;
 *  - kvt_tokens_parse_max with a small limit agrees with the unlimited parse.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvindex/tokens.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_allowed(char c)
{
    return is_digit(c) || c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '[' ||
           c == ']';
}

/* Value of the digit run starting at s[i], saturated just above UINT32_MAX. */
static uint64_t run_value(const char *s, size_t len, size_t *i)
{
    uint64_t v = 0;
    while (*i < len && is_digit(s[*i])) {
        if (v <= UINT32_MAX)
            v = v * 10 + (uint64_t)(s[*i] - '0');
        (*i)++;
    }
    return v;
}

static void check_success(const char *s, size_t len, const uint32_t *toks, size_t n)
{
    CHECK((toks == NULL) == (n == 0));
    CHECK(n <= KVT_TOKENS_MAX);

    size_t k = 0;
    for (size_t i = 0; i < len;) {
        CHECK(is_allowed(s[i]));
        if (is_digit(s[i])) {
            uint64_t v = run_value(s, len, &i);
            CHECK(k < n);
            CHECK(v == toks[k]);
            k++;
        } else {
            i++;
        }
    }
    CHECK(k == n);

    /* Re-format and re-parse: "a,b", "[a, b]", "a\nb\n". */
    static const char *const fmts[][3] = {{"", ",", ""}, {"[", ", ", "]"}, {"", "\n", "\n"}};
    for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
        size_t cap = n * 12 + 4, off = 0;
        char *out = malloc(cap);
        CHECK(out != NULL);
        off += (size_t)snprintf(out + off, cap - off, "%s", fmts[f][0]);
        for (size_t i = 0; i < n; i++)
            off +=
                (size_t)snprintf(out + off, cap - off, "%s%u", i == 0 ? "" : fmts[f][1], toks[i]);
        if (n > 0 || f == 1)
            off += (size_t)snprintf(out + off, cap - off, "%s", fmts[f][2]);
        CHECK(off < cap);

        uint32_t *again = NULL;
        size_t n2 = 0;
        CHECK(kvt_tokens_parse(out, off, &again, &n2, NULL, 0) == KVT_OK);
        CHECK(n2 == n);
        CHECK(n == 0 || memcmp(again, toks, n * sizeof(uint32_t)) == 0);
        free(again);
        free(out);
    }
}

static void check_failure(const char *s, size_t len, kvt_status_t st, const char *err)
{
    CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_RANGE || st == KVT_ERR_TOO_BIG ||
          st == KVT_ERR_NO_MEM);
    CHECK(strchr(err, '\n') == NULL);

    unsigned long long off = 0;
    int used = 0;
    CHECK(sscanf(err, "byte %llu: %n", &off, &used) == 1 && used > 0);
    CHECK(err[used] != '\0');
    CHECK(off <= len);
    if (st == KVT_ERR_RANGE) {
        size_t i = (size_t)off;
        CHECK(i < len && is_digit(s[i]));
        CHECK(i == 0 || !is_digit(s[i - 1]));
        CHECK(run_value(s, len, &i) > UINT32_MAX);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy: one byte past it is a heap overflow ASan reports. */
    char *s = malloc(size > 0 ? size : 1);
    if (s == NULL)
        return 0;
    if (size > 0)
        memcpy(s, data, size);

    uint32_t sentinel[1];
    uint32_t *toks = sentinel;
    size_t n = 999;
    char err[160];
    memset(err, 'x', sizeof(err));

    kvt_status_t st = kvt_tokens_parse(s, size, &toks, &n, err, sizeof(err));
    CHECK(memchr(err, '\0', sizeof(err)) != NULL);
    if (st == KVT_OK) {
        check_success(s, size, toks, n);
    } else {
        CHECK(toks == sentinel && n == 999);
        check_failure(s, size, st, err);
    }

    /* Same verdict without an error buffer, and with a 1-byte one. */
    uint32_t *toks2 = NULL;
    size_t n2 = 0;
    char tiny[1] = {'x'};
    kvt_status_t st2 = kvt_tokens_parse(s, size, &toks2, &n2, NULL, 0);
    CHECK(st2 == st);
    if (st == KVT_OK) {
        CHECK(n2 == n && (n == 0 || memcmp(toks, toks2, n * sizeof(uint32_t)) == 0));
        free(toks2);
        toks2 = NULL;
    }
    CHECK(kvt_tokens_parse(s, size, &toks2, &n2, tiny, sizeof(tiny)) == st);
    CHECK(tiny[0] == '\0');
    if (st == KVT_OK)
        free(toks2);

    /* A lower limit: the same list when it fits, else KVT_ERR_TOO_BIG. */
    size_t max = size % 8;
    toks2 = NULL;
    st2 = kvt_tokens_parse_max(s, size, max, &toks2, &n2, NULL, 0);
    if (st == KVT_OK && n <= max) {
        CHECK(st2 == KVT_OK && n2 == n);
        CHECK(n == 0 || memcmp(toks, toks2, n * sizeof(uint32_t)) == 0);
        free(toks2);
    } else if (st == KVT_OK) {
        CHECK(st2 == KVT_ERR_TOO_BIG);
    } else {
        CHECK(st2 == st || st2 == KVT_ERR_TOO_BIG); /* the limit may trip first */
    }
    if (st == KVT_OK)
        free(toks);
    free(s);
    return 0;
}
