/* Status strings: every status has its own non-empty text; unknown values have one too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"

static const kvt_status_t all_statuses[] = {
    KVT_OK,           KVT_ERR_INVAL,       KVT_ERR_PARSE,
    KVT_ERR_RANGE,    KVT_ERR_TOO_BIG,     KVT_ERR_NOT_FOUND,
    KVT_ERR_EXISTS,   KVT_ERR_NO_SPACE,    KVT_ERR_NO_MEM,
    KVT_ERR_LIMIT,    KVT_ERR_IO,          KVT_ERR_TIMEOUT,
    KVT_ERR_PEER,     KVT_ERR_PROTO,       KVT_ERR_CLOSED,
    KVT_ERR_STALE,    KVT_ERR_INTERNAL,    KVT_ERR_UNSUPPORTED,
};
#define NSTATUS (sizeof(all_statuses) / sizeof(all_statuses[0]))

static void test_strings_distinct_and_nonempty(void **state)
{
    (void)state;
    for (size_t i = 0; i < NSTATUS; i++) {
        const char *s = kvt_status_str(all_statuses[i]);
        assert_non_null(s);
        assert_true(strlen(s) > 0);
        assert_string_not_equal(s, "unknown status");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(s, kvt_status_str(all_statuses[j]));
    }
    assert_string_equal(kvt_status_str(KVT_OK), "ok");
}

static void test_errors_are_negative(void **state)
{
    (void)state;
    assert_int_equal(KVT_OK, 0);
    for (size_t i = 1; i < NSTATUS; i++)
        assert_true(all_statuses[i] < 0);
}

/* Every value in the error range that has a string is in the list above, so a status
 * added to status.h without a test entry (or a string) fails here. */
static void test_no_unlisted_status(void **state)
{
    (void)state;
    size_t named = 0;
    for (int v = -1000; v <= 1000; v++) {
        if (strcmp(kvt_status_str((kvt_status_t)v), "unknown status") != 0)
            named++;
    }
    assert_int_equal(named, NSTATUS);
}

static void test_unknown_value(void **state)
{
    (void)state;
    assert_string_equal(kvt_status_str((kvt_status_t)-99999), "unknown status");
    assert_string_equal(kvt_status_str((kvt_status_t)1), "unknown status");
    assert_string_equal(kvt_status_str((kvt_status_t)-1), "unknown status");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strings_distinct_and_nonempty),
        cmocka_unit_test(test_errors_are_negative),
        cmocka_unit_test(test_no_unlisted_status),
        cmocka_unit_test(test_unknown_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
