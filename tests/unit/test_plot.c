/*
 * bench/plot and bench/progress: every plot kind becomes a PNG through the
 * real gnuplot, names and missing gnuplot are refused with a reason, labels
 * with quotes survive; the progress output on a terminal and in a log.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "bench/plot.h"
#include "bench/progress.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvt-plot-XXXXXX");
    return mkdtemp(tmpdir) != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Whether @path starts with the PNG signature. */
static int is_png(const char *path)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    unsigned char b[8];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return 0;
    size_t got = fread(b, 1, sizeof(b), f);
    fclose(f);
    return got == sizeof(b) && memcmp(b, sig, sizeof(sig)) == 0;
}

static int gnuplot_present(void)
{
    return system("command -v gnuplot >/dev/null 2>&1") == 0;
}

static void test_every_kind(void **state)
{
    (void)state;
    if (!gnuplot_present())
        skip();
    static const double x[4] = {1, 2, 5, 10}, y1[4] = {0.1, 0.2, 0.3, 0.35},
                        y2[4] = {0.05, 0.1, 0.2, 0.3};
    kvt_plot_series_t s[2] = {{"cost", 4, x, y1}, {"it's round-robin", 4, x, y2}};
    const kvt_plot_kind_t kinds[3] = {KVT_PLOT_LINES, KVT_PLOT_STEPS, KVT_PLOT_BARS};
    const char *names[3] = {"lines", "steps", "bars"};
    for (int k = 0; k < 3; k++) {
        kvt_plot_t p = {names[k], "title 'quoted'", "x", "y", kinds[k], k == 0};
        char err[256] = "";
        assert_int_equal(kvt_plot_write(tmpdir, &p, s, 2, err, sizeof(err)), 0);
        char path[128];
        snprintf(path, sizeof(path), "%s/%s.png", tmpdir, names[k]);
        assert_true(is_png(path));
        snprintf(path, sizeof(path), "%s/%s.dat", tmpdir, names[k]);
        assert_int_equal(access(path, R_OK), 0);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    static const double x[1] = {1}, y[2] = {1, 2};
    kvt_plot_series_t s[2] = {{"a", 1, x, y}, {"b", 2, y, y}};
    char err[256] = "";
    kvt_plot_t bad = {"../escape", "t", "x", "y", KVT_PLOT_LINES, false};
    assert_int_equal(kvt_plot_write(tmpdir, &bad, s, 1, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "bad arguments"));
    kvt_plot_t bars = {"bars2", "t", "x", "y", KVT_PLOT_BARS, false};
    assert_int_equal(kvt_plot_write(tmpdir, &bars, s, 2, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "different lengths"));
    kvt_plot_t ok = {"nogp", "t", "x", "y", KVT_PLOT_LINES, false};
    setenv("KVT_GNUPLOT", "/nonexistent/gnuplot", 1);
    assert_int_equal(kvt_plot_write(tmpdir, &ok, s, 1, err, sizeof(err)), -1);
    unsetenv("KVT_GNUPLOT");
    assert_non_null(strstr(err, "not found"));
    char dir[128];
    snprintf(dir, sizeof(dir), "%s/no/such/dir", tmpdir);
    assert_int_equal(kvt_plot_write(dir, &ok, s, 1, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "No such file"));
}

/* Reads all of @f from its start into @buf (NUL-terminated). */
static void slurp(FILE *f, char *buf, size_t cap)
{
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
}

static void test_progress_plain(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    kvt_progress_t p;
    kvt_progress_start(&p, f, 0, "cost", 1000);
    for (uint64_t i = 0; i <= 1000; i++)
        kvt_progress_update(&p, i);
    kvt_progress_end(&p);
    char buf[1024];
    slurp(f, buf, sizeof(buf));
    fclose(f);
    /* 25%, 50%, 75% and the end: four lines, no carriage return */
    int lines = 0;
    for (char *c = buf; *c != '\0'; c++)
        lines += *c == '\n';
    assert_int_equal(lines, 4);
    assert_null(strchr(buf, '\r'));
    assert_non_null(strstr(buf, "cost:  25% 250/1000"));
    assert_non_null(strstr(buf, "cost: 100% 1000/1000"));
}

static void test_progress_tty(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    kvt_progress_t p;
    kvt_progress_start(&p, f, 1, "prefix", 10);
    kvt_progress_update(&p, 5); /* the first update draws */
    kvt_progress_end(&p);
    char buf[1024];
    slurp(f, buf, sizeof(buf));
    fclose(f);
    assert_non_null(strstr(buf, "\rprefix"));
    assert_non_null(strstr(buf, "50.0% 5/10"));
    assert_non_null(strstr(buf, "100.0% 10/10"));
    assert_int_equal(buf[strlen(buf) - 1], '\n');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_progress_plain),
        cmocka_unit_test(test_progress_tty),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
