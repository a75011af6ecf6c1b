/*
 * common/errtext: the one formatter of error text. It fills the caller's buffer like
 * snprintf, cuts what does not fit, always NUL-terminates, and writes nothing when the
 * caller asks for no text (errlen 0, err NULL).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/errtext.h"

static void test_formats(void **state)
{
    (void)state;
    char err[64];
    memset(err, 'x', sizeof(err));
    kvt_errf(err, sizeof(err), "pod '%s': %d %zu", "a", -3, (size_t)7);
    assert_string_equal(err, "pod 'a': -3 7");
}

static void test_cuts_and_terminates(void **state)
{
    (void)state;
    char err[8];
    memset(err, 'x', sizeof(err));
    kvt_errf(err, sizeof(err), "%s", "header: bad magic");
    assert_string_equal(err, "header:"); /* 7 bytes and the NUL */
    char one[1] = {'x'};
    kvt_errf(one, sizeof(one), "anything");
    assert_int_equal(one[0], '\0');
}

static void test_no_text_wanted(void **state)
{
    (void)state;
    kvt_errf(NULL, 0, "nothing %d", 1); /* must not touch anything */
    char err[4] = {'x', 'x', 'x', 'x'};
    kvt_errf(err, 0, "nothing");
    assert_memory_equal(err, "xxxx", 4);
}

/* A helper that adds a prefix, the way the decoders' fail helpers use kvt_verrf(). */
__attribute__((format(printf, 4, 5))) static void prefixed(char *err, size_t errlen, int line,
                                                           const char *fmt, ...)
{
    char msg[64];
    va_list ap;
    va_start(ap, fmt);
    kvt_verrf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvt_errf(err, errlen, "line %d: %s", line, msg);
}

static void test_va_list_form(void **state)
{
    (void)state;
    char err[32];
    prefixed(err, sizeof(err), 3, "expected '%c'", ':');
    assert_string_equal(err, "line 3: expected ':'");
    prefixed(err, 10, 3, "expected '%c'", ':');
    assert_string_equal(err, "line 3: e");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_cuts_and_terminates),
        cmocka_unit_test(test_no_text_wanted),
        cmocka_unit_test(test_va_list_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
