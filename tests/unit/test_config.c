/* Config table: precedence, every value type, file syntax, error messages, atomicity on
 * error, positional arguments, dump -> load round trip, usage text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/log.h"

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (strstr((hay), (needle)) == NULL)                                                       \
            fail_msg("\"%s\" does not contain \"%s\"", (hay), (needle));                           \
    } while (0)

typedef struct test_cfg {
    int outside; /* not in the table: must survive every load */
    char *name;
    bool flag;
    uint32_t count;
    uint64_t big;
    int64_t offset;
    double ratio;
    uint64_t block_size;
    uint64_t timeout_ms;
    kvt_cfg_list_t engines;
    kvt_log_level_t level;
    char *unset;
    char *secret;
    uint32_t hidden;
} test_cfg_t;

#define OPT(name, def, type, field, flags)                                                         \
    {                                                                                              \
        name, def, "help for " name, &type, offsetof(test_cfg_t, field), flags                     \
    }

static const kvt_cfg_opt_t opts[] = {
    OPT("name", "kvtier", kvt_cfg_string, name, 0),
    OPT("flag", "false", kvt_cfg_bool, flag, 0),
    OPT("count", "16", kvt_cfg_u32, count, 0),
    OPT("big", "0", kvt_cfg_u64, big, 0),
    OPT("offset", "-1", kvt_cfg_i64, offset, 0),
    OPT("ratio", "0.5", kvt_cfg_double, ratio, 0),
    OPT("block-size", "64KiB", kvt_cfg_size, block_size, 0),
    OPT("timeout", "30s", kvt_cfg_duration, timeout_ms, 0),
    OPT("engine", "default-engine", kvt_cfg_string_list, engines, 0),
    OPT("log-level", "info", kvt_cfg_log_level, level, 0),
    OPT("unset", NULL, kvt_cfg_string, unset, 0),
    OPT("secret", "hush", kvt_cfg_string, secret, KVT_CFG_NODUMP),
    OPT("hidden", "7", kvt_cfg_u32, hidden, KVT_CFG_HIDDEN),
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static char tmpdir[64];
static int nfiles;

static void clear_env(void)
{
    for (size_t i = 0; i < NOPTS; i++) {
        char env[128];
        assert_int_equal(kvt_cfg_env_name(opts[i].name, env, sizeof(env)), KVT_OK);
        unsetenv(env);
    }
    unsetenv("KVTIER_CONFIG");
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvt_test_config.XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    nfiles = 0;
    clear_env();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    clear_env();
    for (int i = 0; i < nfiles; i++) {
        char path[128];
        snprintf(path, sizeof(path), "%s/%d.conf", tmpdir, i);
        unlink(path);
    }
    rmdir(tmpdir);
    return 0;
}

/* Writes @text to a new file in the test's directory; returns its path (static storage,
 * valid until the next call). */
static const char *write_file(const char *text)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%d.conf", tmpdir, nfiles++);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* Loads with argv = {"prog", args..., NULL}. */
static kvt_status_t load_args(test_cfg_t *cfg, kvt_cfg_result_t *res, const char *default_file,
                              int nargs, const char **args, char *err, size_t errlen)
{
    char *argv[32];
    assert_true(nargs < 30);
    argv[0] = (char *)"prog";
    for (int i = 0; i < nargs; i++)
        argv[i + 1] = (char *)args[i];
    argv[nargs + 1] = NULL;
    err[0] = '\0';
    return kvt_cfg_load(opts, NOPTS, cfg, sizeof(*cfg), nargs + 1, argv, default_file, res, err,
                        errlen);
}

#define LOAD(cfg, res, err, ...)                                                                   \
    load_args((cfg), (res), NULL,                                                                  \
              (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)),                 \
              (const char *[]){__VA_ARGS__}, (err), sizeof(err))

static void done(test_cfg_t *cfg, kvt_cfg_result_t *res)
{
    kvt_cfg_cleanup(opts, NOPTS, cfg);
    kvt_cfg_result_cleanup(res);
}

static void test_defaults(void **state)
{
    (void)state;
    test_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.outside = 1234;
    kvt_cfg_result_t res;
    char err[256];
    char *argv[] = {(char *)"prog", NULL};
    assert_int_equal(
        kvt_cfg_load(opts, NOPTS, &cfg, sizeof(cfg), 1, argv, NULL, &res, err, sizeof(err)),
        KVT_OK);
    assert_int_equal(cfg.outside, 1234);
    assert_string_equal(cfg.name, "kvtier");
    assert_false(cfg.flag);
    assert_int_equal(cfg.count, 16);
    assert_int_equal(cfg.big, 0);
    assert_int_equal(cfg.offset, -1);
    assert_true(cfg.ratio == 0.5);
    assert_int_equal(cfg.block_size, 65536);
    assert_int_equal(cfg.timeout_ms, 30000);
    assert_int_equal(cfg.engines.n, 1);
    assert_string_equal(cfg.engines.items[0], "default-engine");
    assert_int_equal(cfg.level, KVT_LOG_INFO);
    assert_null(cfg.unset);
    assert_string_equal(cfg.secret, "hush");
    assert_int_equal(cfg.hidden, 7);
    assert_int_equal(res.first_arg, 1);
    assert_false(res.help);
    assert_false(res.dump);
    assert_null(res.file);
    done(&cfg, &res);
    assert_null(cfg.name);
    assert_null(cfg.engines.items);
    assert_int_equal(cfg.engines.n, 0);

    /* argc 0 (a library with no command line) works too. */
    assert_int_equal(
        kvt_cfg_load(opts, NOPTS, &cfg, sizeof(cfg), 0, NULL, NULL, &res, err, sizeof(err)),
        KVT_OK);
    assert_int_equal(res.first_arg, 0);
    done(&cfg, &res);
}

static void test_precedence(void **state)
{
    (void)state;
    test_cfg_t cfg = {0};
    kvt_cfg_result_t res;
    char err[256];
    const char *path = write_file("count = 1\nbig = 1\noffset = 1\n");

    /* file only (named by --config) */
    assert_int_equal(LOAD(&cfg, &res, err, "--config", path), KVT_OK);
    assert_int_equal(cfg.count, 1);
    assert_int_equal(cfg.big, 1);
    assert_int_equal(cfg.offset, 1);
    assert_string_equal(res.file, path);
    done(&cfg, &res);

    /* env beats file */
    setenv("KVTIER_BIG", "2", 1);
    setenv("KVTIER_OFFSET", "2", 1);
    /* flag beats env */
    assert_int_equal(LOAD(&cfg, &res, err, "--offset", "3", "--config", path), KVT_OK);
    assert_int_equal(cfg.count, 1);
    assert_int_equal(cfg.big, 2);
    assert_int_equal(cfg.offset, 3);
    done(&cfg, &res);

    /* KVTIER_CONFIG names the file when --config does not */
    setenv("KVTIER_CONFIG", path, 1);
    assert_int_equal(LOAD(&cfg, &res, err, "--offset=4"), KVT_OK);
    assert_int_equal(cfg.count, 1);
    assert_int_equal(cfg.big, 2);
    assert_int_equal(cfg.offset, 4);
    assert_string_equal(res.file, path);
    done(&cfg, &res);

    /* --config beats KVTIER_CONFIG */
    const char *other = write_file("count = 9\n");
    assert_int_equal(LOAD(&cfg, &res, err, "--config=", other), KVT_ERR_INVAL); /* an empty path */
    assert_int_equal(LOAD(&cfg, &res, err, "--config", other), KVT_OK);
    assert_int_equal(cfg.count, 9);
    assert_int_equal(cfg.big, 2);
    done(&cfg, &res);

    /* an empty variable counts as unset */
    unsetenv("KVTIER_CONFIG");
    setenv("KVTIER_COUNT", "", 1);
    assert_int_equal(LOAD(&cfg, &res, err, "--big", "5"), KVT_OK);
    assert_int_equal(cfg.count, 16);
    assert_int_equal(cfg.big, 5);
    done(&cfg, &res);
}

static void test_default_file(void **state)
{
    (void)state;
    test_cfg_t cfg = {0};
    kvt_cfg_result_t res;
    char err[256];
    char missing[160];
    snprintf(missing, sizeof(missing), "%s/does-not-exist.conf", tmpdir);

    /* a missing default file is skipped */
    assert_int_equal(load_args(&cfg, &res, missing, 0, NULL, err, sizeof(err)), KVT_OK);
    assert_null(res.file);
    assert_int_equal(cfg.count, 16);
    done(&cfg, &res);

    /* an existing one is read */
    const char *path = write_file("count = 3\n");
    assert_int_equal(load_args(&cfg, &res, path, 0, NULL, err, sizeof(err)), KVT_OK);
    assert_int_equal(cfg.count, 3);
    assert_string_equal(res.file, path);
    done(&cfg, &res);

    /* a file named explicitly must exist */
    assert_int_equal(LOAD(&cfg, &res, err, "--config", missing), KVT_ERR_INVAL);
    assert_contains(err, "cannot open");
    assert_contains(err, missing);
    setenv("KVTIER_CONFIG", missing, 1);
    assert_int_equal(LOAD(&cfg, &res, err, "--count=1"), KVT_ERR_INVAL);
    assert_contains(err, "cannot open");
}

/* Runs one type's parser directly. */
static kvt_status_t parse(const kvt_cfg_type_t *t, void *field, const char *text)
{
    char why[160] = "";
    kvt_status_t st = t->parse(field, text, why, sizeof(why));
    if (st != KVT_OK && why[0] == '\0')
        fail_msg("no reason for rejecting '%s'", text);
    return st;
}

static void test_parse_u32_u64(void **state)
{
    (void)state;
    uint32_t u = 77;
    assert_int_equal(parse(&kvt_cfg_u32, &u, "0"), KVT_OK);
    assert_int_equal(u, 0);
    assert_int_equal(parse(&kvt_cfg_u32, &u, "4294967295"), KVT_OK);
    assert_int_equal(u, UINT32_MAX);
    assert_int_equal(parse(&kvt_cfg_u32, &u, "0x10"), KVT_OK);
    assert_int_equal(u, 16);
    assert_int_equal(parse(&kvt_cfg_u32, &u, "010"), KVT_OK);
    assert_int_equal(u, 10);
    u = 77;
    const char *bad32[] = {"4294967296",  "99999999999999999999999",
                           "-1",          "",
                           " 1",          "1 ",
                           "12a",         "0x",
                           "0x100000000", "+1",
                           "1.0"};
    for (size_t i = 0; i < sizeof(bad32) / sizeof(bad32[0]); i++) {
        if (parse(&kvt_cfg_u32, &u, bad32[i]) != KVT_ERR_INVAL)
            fail_msg("u32 accepted '%s'", bad32[i]);
        assert_int_equal(u, 77);
    }

    uint64_t v = 5;
    assert_int_equal(parse(&kvt_cfg_u64, &v, "18446744073709551615"), KVT_OK);
    assert_true(v == UINT64_MAX);
    assert_int_equal(parse(&kvt_cfg_u64, &v, "0xffffffffffffffff"), KVT_OK);
    assert_true(v == UINT64_MAX);
    v = 5;
    assert_int_equal(parse(&kvt_cfg_u64, &v, "18446744073709551616"), KVT_ERR_INVAL);
    assert_int_equal(parse(&kvt_cfg_u64, &v, "0x10000000000000000"), KVT_ERR_INVAL);
    assert_int_equal(parse(&kvt_cfg_u64, &v, "-5"), KVT_ERR_INVAL);
    assert_int_equal(v, 5);
}

static void test_parse_i64(void **state)
{
    (void)state;
    int64_t v = 0;
    assert_int_equal(parse(&kvt_cfg_i64, &v, "-9223372036854775808"), KVT_OK);
    assert_true(v == INT64_MIN);
    assert_int_equal(parse(&kvt_cfg_i64, &v, "9223372036854775807"), KVT_OK);
    assert_true(v == INT64_MAX);
    assert_int_equal(parse(&kvt_cfg_i64, &v, "+7"), KVT_OK);
    assert_true(v == 7);
    assert_int_equal(parse(&kvt_cfg_i64, &v, "-0"), KVT_OK);
    assert_true(v == 0);
    v = 3;
    const char *bad[] = {
        "9223372036854775808", "-9223372036854775809", "", "-", "1.5", "--1", "0x10", "1e3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (parse(&kvt_cfg_i64, &v, bad[i]) != KVT_ERR_INVAL)
            fail_msg("i64 accepted '%s'", bad[i]);
        assert_true(v == 3);
    }
}

static void test_parse_double(void **state)
{
    (void)state;
    double d = 0;
    assert_int_equal(parse(&kvt_cfg_double, &d, "0.25"), KVT_OK);
    assert_true(d == 0.25);
    assert_int_equal(parse(&kvt_cfg_double, &d, "-2.5e3"), KVT_OK);
    assert_true(d == -2500.0);
    assert_int_equal(parse(&kvt_cfg_double, &d, "7"), KVT_OK);
    assert_true(d == 7.0);
    d = 1.5;
    const char *bad[] = {"nan", "inf", "-inf", "1e999", "abc", "", " 1", "1.0x", "1,5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (parse(&kvt_cfg_double, &d, bad[i]) != KVT_ERR_INVAL)
            fail_msg("double accepted '%s'", bad[i]);
        assert_true(d == 1.5);
    }
}

static void test_parse_bool(void **state)
{
    (void)state;
    const char *yes[] = {"true", "1", "yes", "on", "TRUE", "Yes", "ON"};
    const char *no[] = {"false", "0", "no", "off", "False", "NO", "Off"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        bool b = false;
        assert_int_equal(parse(&kvt_cfg_bool, &b, yes[i]), KVT_OK);
        assert_true(b);
        assert_int_equal(parse(&kvt_cfg_bool, &b, no[i]), KVT_OK);
        assert_false(b);
    }
    bool b = true;
    assert_int_equal(parse(&kvt_cfg_bool, &b, "maybe"), KVT_ERR_INVAL);
    assert_int_equal(parse(&kvt_cfg_bool, &b, ""), KVT_ERR_INVAL);
    assert_int_equal(parse(&kvt_cfg_bool, &b, "2"), KVT_ERR_INVAL);
    assert_true(b);
}

static void test_parse_size(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {
        {"0", 0},
        {"4096", 4096},
        {"7B", 7},
        {"4k", 4096},
        {"4K", 4096},
        {"4KiB", 4096},
        {"2m", 2u << 20},
        {"2M", 2u << 20},
        {"2MiB", 2u << 20},
        {"3g", UINT64_C(3) << 30},
        {"3G", UINT64_C(3) << 30},
        {"3GiB", UINT64_C(3) << 30},
        {"1T", UINT64_C(1) << 40},
        {"1TiB", UINT64_C(1) << 40},
        {"16777215T", UINT64_C(16777215) << 40},
        {"18446744073709551615", UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        uint64_t v = 1;
        if (parse(&kvt_cfg_size, &v, good[i].text) != KVT_OK || v != good[i].bytes)
            fail_msg("size '%s' gave %llu", good[i].text, (unsigned long long)v);
    }
    const char *bad[] = {"",
                         "KiB",
                         "4kb",
                         "4 KiB",
                         "-1",
                         "4KIB",
                         "1.5G",
                         "4Ki",
                         "16777216T",
                         "0x10",
                         "18446744073709551616",
                         "4k ",
                         "17179869184G"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 9;
        if (parse(&kvt_cfg_size, &v, bad[i]) != KVT_ERR_INVAL)
            fail_msg("size accepted '%s'", bad[i]);
        assert_int_equal(v, 9);
    }
}

static void test_parse_duration(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t ms;
    } good[] = {
        {"250", 250}, {"250ms", 250}, {"30s", 30000}, {"5m", 300000}, {"1h", 3600000}, {"0", 0},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        uint64_t v = 1;
        if (parse(&kvt_cfg_duration, &v, good[i].text) != KVT_OK || v != good[i].ms)
            fail_msg("duration '%s' gave %llu", good[i].text, (unsigned long long)v);
    }
    const char *bad[] = {"", "s", "5x", "1.5s", "-1s", "10 s", "5M", "18446744073709551615s"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 9;
        if (parse(&kvt_cfg_duration, &v, bad[i]) != KVT_ERR_INVAL)
            fail_msg("duration accepted '%s'", bad[i]);
        assert_int_equal(v, 9);
    }
}

static void test_parse_string_and_level(void **state)
{
    (void)state;
    char *s = NULL;
    assert_int_equal(parse(&kvt_cfg_string, &s, "hello"), KVT_OK);
    assert_string_equal(s, "hello");
    assert_int_equal(parse(&kvt_cfg_string, &s, ""), KVT_OK); /* replaces, frees the old one */
    assert_string_equal(s, "");
    kvt_cfg_string.cleanup(&s);
    assert_null(s);

    kvt_log_level_t l = KVT_LOG_INFO;
    assert_int_equal(parse(&kvt_cfg_log_level, &l, "debug"), KVT_OK);
    assert_int_equal(l, KVT_LOG_DEBUG);
    assert_int_equal(parse(&kvt_cfg_log_level, &l, "loud"), KVT_ERR_INVAL);
    assert_int_equal(l, KVT_LOG_DEBUG);
}

static void test_flag_forms(void **state)
{
    (void)state;
    test_cfg_t cfg = {0};
    kvt_cfg_result_t res;
    char err[256];

    assert_int_equal(LOAD(&cfg, &res, err, "--count", "5", "--big=6", "--flag", "--block-size",
                          "1M", "--timeout=250ms", "--name=", "--log-level", "debug"),
                     KVT_OK);
    assert_int_equal(cfg.count, 5);
    assert_int_equal(cfg.big, 6);
    assert_true(cfg.flag);
    assert_int_equal(cfg.block_size, 1 << 20);
    assert_int_equal(cfg.timeout_ms, 250);
    assert_string_equal(cfg.name, "");
    assert_int_equal(cfg.level, KVT_LOG_DEBUG);
    assert_int_equal(res.first_arg, 11);
    done(&cfg, &res);

    assert_int_equal(LOAD(&cfg, &res, err, "--flag=yes", "--no-flag"), KVT_OK);
    assert_false(cfg.flag);
    done(&cfg, &res);
    assert_int_equal(LOAD(&cfg, &res, err, "--no-flag", "--flag=on"), KVT_OK);
    assert_true(cfg.flag);
    done(&cfg, &res);

    /* a bool flag does not take the next argument: it is the first positional */
    assert_int_equal(LOAD(&cfg, &res, err, "--flag", "false"), KVT_OK);
    assert_true(cfg.flag);
    assert_int_equal(res.first_arg, 2);
    done(&cfg, &res);

    /* value-taking flags take the next argument even when it starts with '-' */
    assert_int_equal(LOAD(&cfg, &res, err, "--offset", "-5"), KVT_OK);
    assert_true(cfg.offset == -5);
    done(&cfg, &res);
}

static void test_positional_arguments(void **state)
{
    (void)state;
    test_cfg_t cfg = {0};
    kvt_cfg_result_t res;
    char err[256];

    assert_int_equal(LOAD(&cfg, &res, err, "--count", "5", "hash", "--big", "1"), KVT_OK);
    assert_int_equal(res.first_arg, 3);
    assert_int_equal(cfg.count, 5);
    assert_int_equal(cfg.big, 0); /* after the positional: left for the subcommand */
    done(&cfg, &res);

    assert_int_equal(LOAD(&cfg, &res, err, "--count=5", "--", "--big"), KVT_OK);
    assert_int_equal(res.first_arg, 3);
    assert_int_equal(cfg.big, 0);
    done(&cfg, &res);

    assert_int_equal(LOAD(&cfg, &res, err, "-", "x"), KVT_OK);
    assert_int_equal(res.first_arg, 1);
    done(&cfg, &res);

    assert_int_equal(LOAD(&cfg, &res, err, "--count=2", "--"), KVT_OK);
    assert_int_equal(res.first_arg, 3);
    done(&cfg, &res);
}

static void test_help_and_dump_flags(void **state)
{
    (void)state;
    test_cfg_t cfg, before;
    memset(&cfg, 0x5a, sizeof(cfg));
    before = cfg;
    kvt_cfg_result_t res;
    char err[256];

    assert_int_equal(LOAD(&cfg, &res, err, "--count", "5", "--help", "--bogus"), KVT_OK);
    assert_true(res.help);
    assert_null(res.file);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
    assert_int_equal(LOAD(&cfg, &res, err, "-h"), KVT_OK);
    assert_true(res.help);
    assert_memory_equal(&cfg, &before, sizeof(cfg));

    memset(&cfg, 0, sizeof(cfg));
    assert_int_equal(LOAD(&cfg, &res, err, "--dump-config", "--count=3"), KVT_OK);
    assert_true(res.dump);
    assert_false(res.help);
    assert_int_equal(cfg.count, 3);
    done(&cfg, &res);
    assert_int_equal(LOAD(&cfg, &res, err, "--dump-config=1"), KVT_ERR_INVAL);
}

/* Every failing load leaves the caller's struct exactly as it was. */
static void expect_error(const char *what, kvt_status_t st, const char *err, const char *needle1,
                         const char *needle2, const test_cfg_t *cfg, const test_cfg_t *before)
{
    if (st != KVT_ERR_INVAL)
        fail_msg("%s: status %d, err \"%s\"", what, st, err);
    assert_contains(err, needle1);
    assert_contains(err, needle2);
    assert_null(strchr(err, '\n'));
    assert_memory_equal(cfg, before, sizeof(*cfg));
}

static void test_errors(void **state)
{
    (void)state;
    test_cfg_t cfg, before;
    memset(&cfg, 0x5a, sizeof(cfg));
    before = cfg;
    kvt_cfg_result_t res;
    char err[256];
    kvt_status_t st;

    st = LOAD(&cfg, &res, err, "--nope", "1");
    expect_error("unknown flag", st, err, "flag --nope", "unknown option", &cfg, &before);
    st = LOAD(&cfg, &res, err, "-x");
    expect_error("short flag", st, err, "flag -x", "unknown option", &cfg, &before);
    st = LOAD(&cfg, &res, err, "--count");
    expect_error("missing value", st, err, "flag --count", "missing value", &cfg, &before);
    st = LOAD(&cfg, &res, err, "--config");
    expect_error("missing config", st, err, "flag --config", "missing value", &cfg, &before);
    st = LOAD(&cfg, &res, err, "--count=4294967296");
    expect_error("overflow", st, err, "flag --count: bad value '4294967296'", "out of range", &cfg,
                 &before);
    st = LOAD(&cfg, &res, err, "--no-count");
    expect_error("no- on non-bool", st, err, "flag --no-count", "unknown option", &cfg, &before);
    st = LOAD(&cfg, &res, err, "--no-flag=1");
    expect_error("no- with value", st, err, "flag --no-flag", "takes no value", &cfg, &before);
    st = LOAD(&cfg, &res, err, "--flag=maybe");
    expect_error("bad bool", st, err, "flag --flag: bad value 'maybe'", "true/false", &cfg,
                 &before);

    setenv("KVTIER_BLOCK_SIZE", "lots", 1);
    st = LOAD(&cfg, &res, err, "--count=1");
    expect_error("env", st, err, "env KVTIER_BLOCK_SIZE: bad value 'lots'", "size", &cfg, &before);
    unsetenv("KVTIER_BLOCK_SIZE");

    /* good values from the file and flags, then one bad flag at the end: still untouched */
    const char *good = write_file("name = changed\nengine = e1\n");
    st = LOAD(&cfg, &res, err, "--config", good, "--engine", "e2", "--count", "1", "--big", "x");
    expect_error("late bad flag", st, err, "flag --big: bad value 'x'", "unsigned integer", &cfg,
                 &before);

    const char *path = write_file("# a comment\n\ncount = 2\nbogus = 1\n");
    st = LOAD(&cfg, &res, err, "--config", path);
    char want[256];
    snprintf(want, sizeof(want), "file %s line 4", path);
    expect_error("unknown key", st, err, want, "unknown key 'bogus'", &cfg, &before);

    path = write_file("count = 2\n\n   big = -3\n");
    st = LOAD(&cfg, &res, err, "--config", path);
    snprintf(want, sizeof(want), "file %s line 3: big: bad value '-3'", path);
    expect_error("bad file value", st, err, want, "unsigned", &cfg, &before);

    path = write_file("count 2\n");
    st = LOAD(&cfg, &res, err, "--config", path);
    expect_error("no =", st, err, "line 1", "expected 'key = value'", &cfg, &before);
    path = write_file("= 2\n");
    st = LOAD(&cfg, &res, err, "--config", path);
    expect_error("no key", st, err, "line 1", "expected 'key = value'", &cfg, &before);
    path = write_file("[section]\n");
    st = LOAD(&cfg, &res, err, "--config", path);
    expect_error("section", st, err, "line 1", "expected 'key = value'", &cfg, &before);
    path = write_file("name = \"open\n");
    st = LOAD(&cfg, &res, err, "--config", path);
    expect_error("unterminated", st, err, "line 1", "unterminated", &cfg, &before);
    path = write_file("name = \"x\" y\n");
    st = LOAD(&cfg, &res, err, "--config", path);
    expect_error("trailing", st, err, "line 1", "after the closing quote", &cfg, &before);
    path = write_file("name = \"a\\qb\"\n");
    st = LOAD(&cfg, &res, err, "--config", path);
    expect_error("escape", st, err, "line 1", "unknown escape", &cfg, &before);

    /* errors are cut to the caller's buffer */
    char small[12];
    st = LOAD(&cfg, &res, small, "--nope");
    assert_int_equal(st, KVT_ERR_INVAL);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    /* and a zero-length buffer is fine */
    char *argv[] = {(char *)"prog", (char *)"--nope", NULL};
    assert_int_equal(kvt_cfg_load(opts, NOPTS, &cfg, sizeof(cfg), 2, argv, NULL, &res, NULL, 0),
                     KVT_ERR_INVAL);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
}

static void test_file_syntax(void **state)
{
    (void)state;
    test_cfg_t cfg = {0};
    kvt_cfg_result_t res;
    char err[256];
    const char *path = write_file("# kvtier test config\n"
                                  "   \n"
                                  "\t# indented comment\n"
                                  "count = 5 # five\n"
                                  "big=6\n"
                                  "block_size = 2MiB\r\n"
                                  "name = \"a \\\"quoted\\\" # not a comment \\\\ x\"  # comment\n"
                                  "secret = value with spaces   \n"
                                  "unset = a#b\n"
                                  "log_level = warn\n"
                                  "engine =\n");
    assert_int_equal(LOAD(&cfg, &res, err, "--config", path), KVT_OK);
    assert_int_equal(cfg.count, 5);
    assert_int_equal(cfg.big, 6);
    assert_int_equal(cfg.block_size, 2 << 20);
    assert_string_equal(cfg.name, "a \"quoted\" # not a comment \\ x");
    assert_string_equal(cfg.secret, "value with spaces");
    assert_string_equal(cfg.unset, "a#b");
    assert_int_equal(cfg.level, KVT_LOG_WARN);
    assert_int_equal(cfg.engines.n, 1);
    assert_string_equal(cfg.engines.items[0], "");
    done(&cfg, &res);

    /* the last of repeated scalar keys wins */
    path = write_file("count = 1\ncount = 2\n");
    assert_int_equal(LOAD(&cfg, &res, err, "--config", path), KVT_OK);
    assert_int_equal(cfg.count, 2);
    done(&cfg, &res);
}

static void test_list_appends(void **state)
{
    (void)state;
    test_cfg_t cfg = {0};
    kvt_cfg_result_t res;
    char err[256];

    /* flags repeat and append; they replace the default */
    assert_int_equal(LOAD(&cfg, &res, err, "--engine", "x", "--engine=y", "--engine", "z"), KVT_OK);
    assert_int_equal(cfg.engines.n, 3);
    assert_string_equal(cfg.engines.items[0], "x");
    assert_string_equal(cfg.engines.items[1], "y");
    assert_string_equal(cfg.engines.items[2], "z");
    done(&cfg, &res);

    /* repeated keys in the file append */
    const char *path = write_file("engine = f1\nengine = f2\n");
    assert_int_equal(LOAD(&cfg, &res, err, "--config", path), KVT_OK);
    assert_int_equal(cfg.engines.n, 2);
    assert_string_equal(cfg.engines.items[0], "f1");
    assert_string_equal(cfg.engines.items[1], "f2");
    done(&cfg, &res);

    /* the environment replaces the file's list with one item */
    setenv("KVTIER_ENGINE", "from-env", 1);
    assert_int_equal(LOAD(&cfg, &res, err, "--config", path), KVT_OK);
    assert_int_equal(cfg.engines.n, 1);
    assert_string_equal(cfg.engines.items[0], "from-env");
    done(&cfg, &res);

    /* flags replace everything below them */
    assert_int_equal(
        LOAD(&cfg, &res, err, "--config", path, "--engine", "flag1", "--engine", "flag2"), KVT_OK);
    assert_int_equal(cfg.engines.n, 2);
    assert_string_equal(cfg.engines.items[0], "flag1");
    assert_string_equal(cfg.engines.items[1], "flag2");
    done(&cfg, &res);
}

static void assert_cfg_equal(const test_cfg_t *a, const test_cfg_t *b)
{
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->flag, b->flag);
    assert_int_equal(a->count, b->count);
    assert_true(a->big == b->big);
    assert_true(a->offset == b->offset);
    assert_memory_equal(&a->ratio, &b->ratio, sizeof(double)); /* bit for bit */
    assert_true(a->block_size == b->block_size);
    assert_true(a->timeout_ms == b->timeout_ms);
    assert_int_equal(a->engines.n, b->engines.n);
    for (size_t i = 0; i < a->engines.n; i++)
        assert_string_equal(a->engines.items[i], b->engines.items[i]);
    assert_int_equal(a->level, b->level);
    if (a->unset == NULL || b->unset == NULL)
        assert_ptr_equal(a->unset, b->unset);
    else
        assert_string_equal(a->unset, b->unset);
    assert_int_equal(a->hidden, b->hidden);
}

static char *dump_to_string(const test_cfg_t *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(kvt_cfg_dump(f, opts, NOPTS, cfg), KVT_OK);
    fclose(f);
    return buf;
}

static void round_trip(const char **args, int nargs)
{
    test_cfg_t a = {0}, b = {0};
    kvt_cfg_result_t res;
    char err[256];

    if (load_args(&a, &res, NULL, nargs, args, err, sizeof(err)) != KVT_OK)
        fail_msg("load: %s", err);
    kvt_cfg_result_cleanup(&res);
    char *text = dump_to_string(&a);
    assert_null(strstr(text, "secret")); /* KVT_CFG_NODUMP */

    const char *path = write_file(text);
    const char *file_args[] = {"--config", path};
    if (load_args(&b, &res, NULL, 2, file_args, err, sizeof(err)) != KVT_OK)
        fail_msg("reload: %s\n--- dump ---\n%s", err, text);
    kvt_cfg_result_cleanup(&res);
    assert_cfg_equal(&a, &b);

    char *again = dump_to_string(&b);
    assert_string_equal(text, again);
    free(text);
    free(again);
    kvt_cfg_cleanup(opts, NOPTS, &a);
    kvt_cfg_cleanup(opts, NOPTS, &b);
}

static void test_dump_round_trip(void **state)
{
    (void)state;
    /* the defaults */
    round_trip(NULL, 0);

    /* awkward values of every type */
    const char *args[] = {
        "--name",
        " lead \"q\" # hash \\ back\nnew\ttab ",
        "--flag",
        "--count=4294967295",
        "--big=18446744073709551615",
        "--offset=-9223372036854775808",
        "--ratio=0.1",
        "--block-size=123457",
        "--timeout=1500ms",
        "--engine=",
        "--engine=#x",
        "--engine",
        "\"quoted\"",
        "--engine",
        "plain",
        "--log-level=debug",
        "--unset=",
        "--hidden=0",
    };
    round_trip(args, (int)(sizeof(args) / sizeof(args[0])));

    const char *args2[] = {"--ratio=-1e-300", "--block-size=3TiB", "--timeout=2h", "--unset=x",
                           "--name=\"",       "--engine=a b",      "--no-flag"};
    round_trip(args2, (int)(sizeof(args2) / sizeof(args2[0])));
}

static void test_dump_format(void **state)
{
    (void)state;
    test_cfg_t cfg = {0};
    kvt_cfg_result_t res;
    char err[256];
    assert_int_equal(LOAD(&cfg, &res, err, "--engine=a", "--engine=b"), KVT_OK);
    char *text = dump_to_string(&cfg);
    assert_string_equal(text, "name = kvtier\n"
                              "flag = false\n"
                              "count = 16\n"
                              "big = 0\n"
                              "offset = -1\n"
                              "ratio = 0.5\n"
                              "block-size = 64KiB\n"
                              "timeout = 30s\n"
                              "engine = a\n"
                              "engine = b\n"
                              "log-level = info\n"
                              "hidden = 7\n");
    free(text);
    done(&cfg, &res);
}

static void test_usage(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    kvt_cfg_usage(f, "kvtierd", opts, NOPTS);
    fclose(f);
    assert_contains(buf, "usage: kvtierd [options]");
    assert_contains(buf, "--count N");
    assert_contains(buf, "help for count [default: 16]");
    assert_contains(buf, "--[no-]flag");
    assert_contains(buf, "--block-size SIZE");
    assert_contains(buf, "--engine STRING");
    assert_contains(buf, "(repeatable)");
    assert_contains(buf, "--config FILE");
    assert_contains(buf, "--dump-config");
    assert_contains(buf, "-h, --help");
    assert_contains(buf, "KVTIER_NAME=VALUE");
    assert_null(strstr(buf, "--hidden"));
    free(buf);
}

static void test_bad_tables(void **state)
{
    (void)state;
    test_cfg_t cfg = {0};
    kvt_cfg_result_t res;
    char err[256];
    char *argv[] = {(char *)"prog", NULL};

    const kvt_cfg_opt_t dup[] = {
        OPT("count", "1", kvt_cfg_u32, count, 0),
        OPT("count", "2", kvt_cfg_u32, hidden, 0),
    };
    assert_int_equal(kvt_cfg_load(dup, 2, &cfg, sizeof(cfg), 1, argv, NULL, &res, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_contains(err, "count");

    const kvt_cfg_opt_t reserved[] = {OPT("config", "x", kvt_cfg_string, name, 0)};
    assert_int_equal(
        kvt_cfg_load(reserved, 1, &cfg, sizeof(cfg), 1, argv, NULL, &res, err, sizeof(err)),
        KVT_ERR_INVAL);

    const kvt_cfg_opt_t outside[] = {
        {"far", NULL, "", &kvt_cfg_u64, sizeof(test_cfg_t) - 4, 0},
    };
    assert_int_equal(
        kvt_cfg_load(outside, 1, &cfg, sizeof(cfg), 1, argv, NULL, &res, err, sizeof(err)),
        KVT_ERR_INVAL);
    assert_contains(err, "outside");

    const kvt_cfg_opt_t bad_default[] = {OPT("count", "lots", kvt_cfg_u32, count, 0)};
    assert_int_equal(
        kvt_cfg_load(bad_default, 1, &cfg, sizeof(cfg), 1, argv, NULL, &res, err, sizeof(err)),
        KVT_ERR_INVAL);
    assert_contains(err, "default of count");
}

static void test_env_name(void **state)
{
    (void)state;
    char buf[32];
    assert_int_equal(kvt_cfg_env_name("block-size", buf, sizeof(buf)), KVT_OK);
    assert_string_equal(buf, "KVTIER_BLOCK_SIZE");
    assert_int_equal(kvt_cfg_env_name("a", buf, 9), KVT_OK);
    assert_string_equal(buf, "KVTIER_A");
    assert_int_equal(kvt_cfg_env_name("ab", buf, 9), KVT_ERR_TOO_BIG);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_defaults),
        T(test_precedence),
        T(test_default_file),
        T(test_parse_u32_u64),
        T(test_parse_i64),
        T(test_parse_double),
        T(test_parse_bool),
        T(test_parse_size),
        T(test_parse_duration),
        T(test_parse_string_and_level),
        T(test_flag_forms),
        T(test_positional_arguments),
        T(test_help_and_dump_flags),
        T(test_errors),
        T(test_file_syntax),
        T(test_list_appends),
        T(test_dump_round_trip),
        T(test_dump_format),
        T(test_usage),
        T(test_bad_tables),
        T(test_env_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
