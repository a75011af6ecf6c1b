/* Logging: level filtering before argument evaluation, both line formats, escaping,
 * the output stream, errno handling and whole lines under concurrent writers. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/log.h"

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (strstr((hay), (needle)) == NULL)                                                       \
            fail_msg("\"%s\" does not contain \"%s\"", (hay), (needle));                           \
    } while (0)

/* Captures log output in memory for one test. */
typedef struct capture {
    char *buf;
    size_t len;
    FILE *f;
} capture_t;

static capture_t cap;

static int setup(void **state)
{
    (void)state;
    cap.buf = NULL;
    cap.len = 0;
    cap.f = open_memstream(&cap.buf, &cap.len);
    if (cap.f == NULL)
        return -1;
    kvt_log_set_stream(cap.f);
    kvt_log_set_format(KVT_LOG_TEXT);
    kvt_log_set_level(KVT_LOG_INFO);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvt_log_set_stream(NULL);
    fclose(cap.f);
    free(cap.buf);
    cap.buf = NULL;
    return 0;
}

/* The output so far (memstream updates buf on fflush, which every log line does). */
static const char *out(void)
{
    fflush(cap.f);
    return cap.buf != NULL ? cap.buf : "";
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s != '\0'; s++)
        n += *s == '\n';
    return n;
}

static int calls;

static int counted(int v)
{
    calls++;
    return v;
}

static void test_disabled_level_skips_arguments(void **state)
{
    (void)state;
    kvt_log_set_level(KVT_LOG_WARN);
    calls = 0;
    kvt_log_debug("debug %d", counted(1));
    kvt_log_info("info %d", counted(2));
    assert_int_equal(calls, 0);
    assert_string_equal(out(), "");

    kvt_log_warn("warn %d", counted(3));
    kvt_log_error("error %d", counted(4));
    assert_int_equal(calls, 2);
    assert_int_equal(count_lines(out()), 2);
    assert_contains(out(), "warn 3");
    assert_contains(out(), "error 4");

    kvt_log_set_level(KVT_LOG_DEBUG);
    kvt_log_debug("debug %d", counted(5));
    assert_int_equal(calls, 3);
    assert_contains(out(), "debug 5");

    kvt_log_set_level(KVT_LOG_ERROR);
    assert_false(kvt_log_enabled(KVT_LOG_WARN));
    assert_true(kvt_log_enabled(KVT_LOG_ERROR));
    kvt_log_errno(KVT_LOG_WARN, "x %d", counted(6));
    assert_int_equal(calls, 3);
}

static void test_set_level_clamps(void **state)
{
    (void)state;
    kvt_log_set_level((kvt_log_level_t)42);
    assert_int_equal(kvt_log_get_level(), KVT_LOG_DEBUG);
    kvt_log_set_level((kvt_log_level_t)-3);
    assert_int_equal(kvt_log_get_level(), KVT_LOG_ERROR);
}

/* "2026-11-21T10:00:00.123Z warn  test_log: message" */
static void test_text_format(void **state)
{
    (void)state;
    kvt_log_warn("pod %d sent %s", 3, "junk");
    const char *s = out();
    int y, mo, d, h, mi, sec, ms, n = 0;
    assert_int_equal(
        sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ %n", &y, &mo, &d, &h, &mi, &sec, &ms, &n), 7);
    assert_int_equal(n, 25);
    assert_true(y >= 2024 && mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && h < 24 && mi < 60);
    assert_string_equal(s + 24, " warn  test_log: pod 3 sent junk\n");

    kvt_log_error("e");
    kvt_log_info("i");
    assert_contains(out(), " error test_log: e\n");
    assert_contains(out(), " info  test_log: i\n");
}

static void test_explicit_component_and_file(void **state)
{
    (void)state;
    kvt_log_write(KVT_LOG_INFO, "engine-a", __FILE__, "x");
    kvt_log_write(KVT_LOG_INFO, NULL, "kvindex/index.c", "y");
    kvt_log_write(KVT_LOG_INFO, NULL, NULL, "z");
    assert_contains(out(), " engine-a: x\n");
    assert_contains(out(), " index: y\n");
    assert_contains(out(), " kvtier: z\n");
}

static void test_text_escapes_control_characters(void **state)
{
    (void)state;
    kvt_log_info("two\nlines\tand\x01");
    assert_int_equal(count_lines(out()), 1);
    assert_contains(out(), "test_log: two\\nlines\\tand\\x01\n");
}

static void test_logfmt_escaping(void **state)
{
    (void)state;
    kvt_log_set_format(KVT_LOG_LOGFMT);
    kvt_log_warn("say \"hi\"\nback\\slash");
    const char *s = out();
    assert_int_equal(count_lines(s), 1);
    assert_true(strstr(s, "ts=") == s);
    assert_contains(s, "Z level=warn component=test_log ");
    assert_contains(s, " msg=\"say \\\"hi\\\"\\nback\\\\slash\"\n");

    /* A component that needs quoting gets them. */
    kvt_log_write(KVT_LOG_ERROR, "my pod", NULL, "m");
    assert_contains(out(), "level=error component=\"my pod\" msg=\"m\"\n");
}

static void test_output_goes_to_set_stream(void **state)
{
    (void)state;
    FILE *t = tmpfile();
    assert_non_null(t);
    kvt_log_set_stream(t);
    kvt_log_info("to the tmpfile");
    kvt_log_set_stream(cap.f);
    kvt_log_info("to the memstream");

    char line[256] = "";
    rewind(t);
    assert_non_null(fgets(line, sizeof(line), t));
    assert_contains(line, "to the tmpfile\n");
    assert_null(fgets(line, sizeof(line), t));
    fclose(t);
    assert_int_equal(count_lines(out()), 1);
    assert_contains(out(), "to the memstream");
}

static void test_errno_suffix_and_preserved(void **state)
{
    (void)state;
    char expect[256];
    snprintf(expect, sizeof(expect), "open /nope: %s\n", strerror(ENOENT));
    errno = ENOENT;
    kvt_log_errno(KVT_LOG_ERROR, "open %s", "/nope");
    assert_int_equal(errno, ENOENT);
    assert_contains(out(), expect);

    errno = EINVAL;
    kvt_log_info("plain");
    assert_int_equal(errno, EINVAL);
}

static void test_long_message_is_cut(void **state)
{
    (void)state;
    size_t len = 10000;
    char *big = malloc(len + 1);
    assert_non_null(big);
    memset(big, 'a', len);
    big[len] = '\0';
    kvt_log_info("%s", big);
    free(big);
    const char *s = out();
    assert_int_equal(count_lines(s), 1);
    size_t slen = strlen(s);
    assert_true(slen > 2000 && slen < 2200);
    assert_string_equal(s + slen - 5, "a...\n");
}

static void test_parse_level(void **state)
{
    (void)state;
    kvt_log_level_t l = KVT_LOG_INFO;
    assert_int_equal(kvt_log_parse_level("debug", &l), KVT_OK);
    assert_int_equal(l, KVT_LOG_DEBUG);
    assert_int_equal(kvt_log_parse_level("ERROR", &l), KVT_OK);
    assert_int_equal(l, KVT_LOG_ERROR);
    assert_int_equal(kvt_log_parse_level("warning", &l), KVT_OK);
    assert_int_equal(l, KVT_LOG_WARN);
    assert_int_equal(kvt_log_parse_level("Info", &l), KVT_OK);
    assert_int_equal(l, KVT_LOG_INFO);

    l = KVT_LOG_DEBUG;
    assert_int_equal(kvt_log_parse_level("verbose", &l), KVT_ERR_INVAL);
    assert_int_equal(kvt_log_parse_level("", &l), KVT_ERR_INVAL);
    assert_int_equal(kvt_log_parse_level(NULL, &l), KVT_ERR_INVAL);
    assert_int_equal(l, KVT_LOG_DEBUG);

    assert_string_equal(kvt_log_level_name(KVT_LOG_WARN), "warn");
    assert_string_equal(kvt_log_level_name((kvt_log_level_t)9), "unknown");
}

#define THREADS 4
#define LINES_PER_THREAD 500

static void *writer(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < LINES_PER_THREAD; i++)
        kvt_log_info("thread %d line %d %s", id, i, "padding-padding-padding-padding-padding");
    return NULL;
}

/* Lines from concurrent writers never interleave. */
static void test_concurrent_lines_are_whole(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, writer, (void *)(intptr_t)i), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);

    char *copy = strdup(out());
    assert_non_null(copy);
    size_t n = 0;
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        int id, i, consumed = 0;
        const char *body = strstr(line, " info  test_log: ");
        assert_non_null(body);
        assert_int_equal(
            sscanf(body, " info  test_log: thread %d line %d %*s%n", &id, &i, &consumed), 2);
        assert_true(consumed > 0 && body[consumed] == '\0');
        n++;
    }
    free(copy);
    assert_int_equal(n, THREADS * LINES_PER_THREAD);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_disabled_level_skips_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_level_clamps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_text_format, setup, teardown),
        cmocka_unit_test_setup_teardown(test_explicit_component_and_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_text_escapes_control_characters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logfmt_escaping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_output_goes_to_set_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errno_suffix_and_preserved, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_message_is_cut, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_level, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_lines_are_whole, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
