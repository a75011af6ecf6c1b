/*
 * common/hostport: the one "host:port" parser, against a table of forms and against a
 * naive reference on random strings over the characters that matter.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/hostport.h"
#include "tests/support/rng.h"

static void ok(const char *text, bool zero, const char *host, uint16_t port)
{
    char h[64];
    uint16_t p = 7;
    char why[128];
    if (kvt_hostport_split(text, h, sizeof(h), &p, zero, why, sizeof(why)) != KVT_OK)
        fail_msg("'%s' refused: %s", text, why);
    assert_string_equal(h, host);
    assert_int_equal(p, port);
}

static void bad(const char *text, bool zero, const char *reason)
{
    char h[64] = "untouched";
    uint16_t p = 7;
    char why[128];
    kvt_status_t st = kvt_hostport_split(text, h, sizeof(h), &p, zero, why, sizeof(why));
    if (st == KVT_OK)
        fail_msg("'%s' accepted as '%s' port %u", text, h, p);
    assert_int_equal(st, KVT_ERR_INVAL);
    if (reason != NULL && strstr(why, reason) == NULL)
        fail_msg("'%s': reason '%s' lacks '%s'", text, why, reason);
    assert_string_equal(h, "untouched"); /* nothing written */
    assert_int_equal(p, 7);
}

static void test_forms(void **state)
{
    (void)state;
    ok("127.0.0.1:7420", false, "127.0.0.1", 7420);
    ok("localhost:1", false, "localhost", 1);
    ok("[::1]:65535", false, "::1", 65535);
    ok("[fe80::1%eth0]:80", false, "fe80::1%eth0", 80);
    ok("0.0.0.0:0", true, "0.0.0.0", 0);
    ok("h:00080", false, "h", 80);
    bad("0.0.0.0:0", false, "1..65535");
    bad("h:65536", false, "port");
    bad("h:99999", true, "0..65535");
    bad("h:123456", false, "port");
    bad("h:", false, "port");
    bad("h:+1", false, "port");
    bad("h:-1", false, "port");
    bad("h:1 ", false, "port");
    bad("h: 1", false, "port");
    bad("h:0x10", false, "port");
    bad(":80", false, "empty host");
    bad("[]:80", false, "empty host");
    bad("host", false, "host:port");
    bad("", false, "host:port");
    bad("::1:7420", false, "brackets");
    bad("[::1]7420", false, "[ipv6]:port");
    bad("[::1", false, "[ipv6]:port");
    bad("[::1]:", false, "port");
    bad("[[::1]]:80", false, "[ipv6]:port");
    bad("[[::1]:80", false, "bracket");
    bad("a]b:80", false, "bracket");
    /* a host that does not fit the caller's buffer */
    char h[4];
    uint16_t p;
    assert_int_equal(kvt_hostport_split("abcd:1", h, sizeof(h), &p, false, NULL, 0), KVT_ERR_INVAL);
    assert_int_equal(kvt_hostport_split("abc:1", h, sizeof(h), &p, false, NULL, 0), KVT_OK);
    assert_string_equal(h, "abc");
    /* a reason longer than the caller's buffer is cut and NUL-terminated */
    char small[8];
    assert_int_equal(kvt_hostport_split("::1:7420", h, sizeof(h), &p, false, small, sizeof(small)),
                     KVT_ERR_INVAL);
    assert_string_equal(small, "an ipv6");
}

/* The reference: the grammar spelled out the slow way. */
static bool ref(const char *s, bool zero, char *host, unsigned *port)
{
    size_t n = strlen(s);
    size_t hs, he, ps; /* host [hs, he), port from ps */
    if (n > 0 && s[0] == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL || close[1] != ':')
            return false;
        hs = 1;
        he = (size_t)(close - s);
        ps = he + 2;
    } else {
        size_t last = n;
        for (size_t i = 0; i < n; i++)
            if (s[i] == ':')
                last = i;
        if (last == n)
            return false;
        for (size_t i = 0; i < last; i++)
            if (s[i] == ':')
                return false;
        hs = 0;
        he = last;
        ps = last + 1;
    }
    for (size_t i = hs; i < he; i++)
        if (s[i] == '[' || s[i] == ']')
            return false;
    if (he == hs || n - ps == 0 || n - ps > 5 || he - hs >= 32)
        return false;
    unsigned v = 0;
    for (size_t i = ps; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v > 65535 || (v == 0 && !zero))
        return false;
    memcpy(host, s + hs, he - hs);
    host[he - hs] = '\0';
    *port = v;
    return true;
}

static void test_random_against_reference(void **state)
{
    (void)state;
    static const char alphabet[] = "[]:0123456789ab.%";
    kvt_rng_t rng;
    kvt_rng_init(&rng, 0);
    for (int round = 0; round < 200000; round++) {
        char s[16];
        size_t n = kvt_rng_below(&rng, 12);
        for (size_t i = 0; i < n; i++)
            s[i] = alphabet[kvt_rng_below(&rng, sizeof(alphabet) - 1)];
        s[n] = '\0';
        bool zero = kvt_rng_below(&rng, 2);
        char h1[32], h2[32];
        uint16_t p1 = 0;
        unsigned p2 = 0;
        bool got = kvt_hostport_split(s, h1, sizeof(h1), &p1, zero, NULL, 0) == KVT_OK;
        bool want = ref(s, zero, h2, &p2);
        if (got != want)
            fail_msg("'%s' (zero %d): parser %s, reference %s", s, zero, got ? "ok" : "refuses",
                     want ? "ok" : "refuses");
        if (got) {
            assert_string_equal(h1, h2);
            assert_int_equal(p1, p2);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_random_against_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
