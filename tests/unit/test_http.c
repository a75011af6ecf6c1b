/* server/http: request-head parsing, good, incomplete and bad heads; percent-decoding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http.h"
#include "tests/support/rng.h"

#define MAXH 4096

static int parse(const char *s, kvt_http_req_t *r, int *status)
{
    char why[128] = "";
    *status = 0;
    int got = kvt_http_parse_head(s, strlen(s), MAXH, r, status, why, sizeof(why));
    if (got < 0) {
        assert_true(strlen(why) > 0);
        assert_null(strchr(why, '\n'));
    }
    return got;
}

static void test_get_keep_alive(void **state)
{
    (void)state;
    kvt_http_req_t r;
    int st;
    const char *s = "GET /v1/stats?x=1 HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
    assert_int_equal(parse(s, &r, &st), 1);
    assert_int_equal(r.method, KVT_HTTP_GET);
    assert_int_equal(r.path_len, 9);
    assert_memory_equal(r.path, "/v1/stats", 9);
    assert_int_equal(r.query_len, 3);
    assert_memory_equal(r.query, "x=1", 3);
    assert_int_equal(r.minor, 1);
    assert_true(r.keep_alive);
    assert_int_equal(r.body_len, 0);
    assert_null(r.auth);
    assert_int_equal(r.head_len, strlen(s) - 4);
}

static void test_post_headers(void **state)
{
    (void)state;
    kvt_http_req_t r;
    int st;
    const char *s = "\r\nPOST /v1/events HTTP/1.0\nContent-Length:  42 \nConnection: Keep-Alive, "
                    "foo\nAuthorization: Bearer abc \nExpect: 100-continue\n\n";
    assert_int_equal(parse(s, &r, &st), 1);
    assert_int_equal(r.method, KVT_HTTP_POST);
    assert_int_equal(r.body_len, 42);
    assert_int_equal(r.minor, 0);
    assert_true(r.keep_alive);
    assert_true(r.expect_continue);
    assert_int_equal(r.auth_len, 10);
    assert_memory_equal(r.auth, "Bearer abc", 10);
    assert_null(r.query);
    assert_int_equal(r.head_len, strlen(s));

    assert_int_equal(parse("DELETE /v1/engines/a HTTP/1.1\r\nConnection: close\r\n\r\n", &r, &st),
                     1);
    assert_int_equal(r.method, KVT_HTTP_DELETE);
    assert_false(r.keep_alive);
    assert_int_equal(parse("GET / HTTP/1.0\r\n\r\n", &r, &st), 1);
    assert_false(r.keep_alive);
    assert_int_equal(parse("BREW /pot HTTP/1.1\r\n\r\n", &r, &st), 1);
    assert_int_equal(r.method, KVT_HTTP_OTHER);
}

static void test_incomplete(void **state)
{
    (void)state;
    const char *s = "POST /v1/query HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
    size_t head = strlen(s) - 2;
    for (size_t n = 0; n < head; n++) {
        kvt_http_req_t r;
        int st = 0;
        char why[128] = "";
        int got = kvt_http_parse_head(s, n, MAXH, &r, &st, why, sizeof(why));
        /* a prefix is incomplete, except that a complete-looking line never errs early */
        if (got != 0)
            fail_msg("prefix of %zu bytes: got %d (status %d, %s)", n, got, st, why);
    }
}

static void expect_status(const char *s, int want)
{
    kvt_http_req_t r;
    int st;
    int got = parse(s, &r, &st);
    if (got != -1 || st != want)
        fail_msg("\"%s\": got %d status %d, want -1 status %d", s, got, st, want);
}

static void test_errors(void **state)
{
    (void)state;
    expect_status("GARBAGE\r\n\r\n", 400);
    expect_status("GET\r\n\r\n", 400);
    expect_status("GET  / HTTP/1.1\r\n\r\n", 400);
    expect_status("GET http://x/ HTTP/1.1\r\n\r\n", 400);
    expect_status("GET /a\x01 HTTP/1.1\r\n\r\n", 400);
    expect_status("GET / HTTP/2.0\r\n\r\n", 505);
    expect_status("GET / HTTP/1.2\r\n\r\n", 505);
    expect_status("GET / FTP/1.1\r\n\r\n", 400);
    expect_status("G(T / HTTP/1.1\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\n: empty\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400);
    expect_status("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501);
    expect_status("POST / HTTP/1.1\r\nExpect: tea\r\n\r\n", 417);
    /* the same Content-Length twice is allowed */
    kvt_http_req_t r;
    int st;
    assert_int_equal(
        parse("GET / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n", &r, &st), 1);
    assert_int_equal(r.body_len, 3);
}

static void test_too_large(void **state)
{
    (void)state;
    char *s = malloc(MAXH * 2);
    assert_non_null(s);
    strcpy(s, "GET / HTTP/1.1\r\nX: ");
    size_t n = strlen(s);
    memset(s + n, 'a', MAXH * 2 - n - 1);
    s[MAXH * 2 - 1] = '\0';
    kvt_http_req_t r;
    int st = 0;
    char why[128] = "";
    assert_int_equal(kvt_http_parse_head(s, MAXH - 1, MAXH, &r, &st, why, sizeof(why)), 0);
    assert_int_equal(kvt_http_parse_head(s, MAXH, MAXH, &r, &st, why, sizeof(why)), -1);
    assert_int_equal(st, 431);
    assert_int_equal(kvt_http_parse_head(s, MAXH * 2 - 1, MAXH, &r, &st, why, sizeof(why)), -1);
    assert_int_equal(st, 431);
    /* blank lines alone also count */
    memset(s, '\n', MAXH);
    assert_int_equal(kvt_http_parse_head(s, MAXH, MAXH, &r, &st, why, sizeof(why)), -1);
    assert_int_equal(st, 431);
    free(s);
}

/* Random valid heads split at every byte: incomplete until the last byte, then exact fields. */
static void test_random_heads(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 7);
    static const char *methods[] = {"GET", "POST", "PUT", "DELETE", "HEAD"};
    char buf[2048];
    for (int iter = 0; iter < 2000; iter++) {
        int m = (int)kvt_rng_below(&rng, 5);
        char path[64];
        int pl = 1 + (int)kvt_rng_below(&rng, 40);
        path[0] = '/';
        for (int i = 1; i < pl; i++)
            path[i] = "abcdefghijklmnopqrstuvwxyz0123456789/_-.%"[kvt_rng_below(&rng, 41)];
        path[pl] = '\0';
        unsigned long long cl = kvt_rng_below(&rng, 1ull << 31) * 1000u; /* up to 2.1e12 */
        int minor = (int)kvt_rng_below(&rng, 2);
        const char *eol = kvt_rng_below(&rng, 2) ? "\r\n" : "\n";
        int n = snprintf(buf, sizeof(buf), "%s %s HTTP/1.%d%sContent-Length: %llu%sX-%d: v%s%s",
                         methods[m], path, minor, eol, cl, eol, iter, eol, eol);
        assert_true(n > 0 && n < (int)sizeof(buf));
        for (int cut = 0; cut <= n; cut++) {
            kvt_http_req_t r;
            int st = 0;
            char why[128] = "";
            int got = kvt_http_parse_head(buf, (size_t)cut, MAXH, &r, &st, why, sizeof(why));
            if (cut < n) {
                if (got != 0)
                    fail_msg("iter %d cut %d/%d: got %d (%s)", iter, cut, n, got, why);
                continue;
            }
            assert_int_equal(got, 1);
            assert_int_equal(r.head_len, (size_t)n);
            assert_int_equal(r.body_len, cl);
            assert_int_equal(r.minor, (unsigned)minor);
            assert_int_equal(r.path_len, (size_t)pl);
            assert_memory_equal(r.path, path, (size_t)pl);
            assert_int_equal(r.keep_alive, minor == 1);
        }
    }
}

static void test_pct_decode(void **state)
{
    (void)state;
    char out[16];
    assert_int_equal(kvt_http_pct_decode("a%2Fb%20c", 9, out, sizeof(out)), 5);
    assert_string_equal(out, "a/b c");
    assert_int_equal(kvt_http_pct_decode("pod-1", 5, out, sizeof(out)), 5);
    assert_string_equal(out, "pod-1");
    assert_int_equal(kvt_http_pct_decode("%zz", 3, out, sizeof(out)), -1);
    assert_int_equal(kvt_http_pct_decode("%2", 2, out, sizeof(out)), -1);
    assert_int_equal(kvt_http_pct_decode("%", 1, out, sizeof(out)), -1);
    assert_int_equal(kvt_http_pct_decode("%00", 3, out, sizeof(out)), -1);
    assert_int_equal(kvt_http_pct_decode("0123456789abcdef", 16, out, sizeof(out)), -1);
    assert_int_equal(kvt_http_pct_decode("0123456789abcde", 15, out, sizeof(out)), 15);
    assert_int_equal(kvt_http_pct_decode("", 0, out, sizeof(out)), 0);
    assert_string_equal(kvt_http_reason(404), "Not Found");
    assert_string_equal(kvt_http_reason(299), "Unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_keep_alive), cmocka_unit_test(test_post_headers),
        cmocka_unit_test(test_incomplete),     cmocka_unit_test(test_errors),
        cmocka_unit_test(test_too_large),      cmocka_unit_test(test_random_heads),
        cmocka_unit_test(test_pct_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
