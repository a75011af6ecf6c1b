/*
 * kvtier-bench: micro-benchmarks and trace replay. `kvtier-bench <subcommand>`.
 * Subcommands are rows of kvt_bench_cmds; each gets argv from its own name on.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

#define KVT_BENCH_EXIT_USAGE 2

typedef struct kvt_bench_cmd {
    const char *name;
    const char *summary;
    int (*main)(int argc, char **argv);
} kvt_bench_cmd_t;

static const kvt_bench_cmd_t kvt_bench_cmds[] = {
    {"hash", "block-hashing throughput vs. one XXH3 call (GB/s)", kvt_bench_hash_main},
    {"index", "index apply/query benchmarks (see docs/performance.md)", kvt_bench_index_main},
    {"rpc", "kvtierd queries/s over RPC and HTTP vs. redis-benchmark", kvt_bench_rpc_main},
    {"latency", "router's view: kvtierd vs redis GET latency, closed loop and open-loop sweep",
     kvt_bench_latency_main},
    {"events", "kvtierd ingest of ZMQ KV events (block events/s) vs. in-process",
     kvt_bench_events_main},
    {"json", "kvtier's JSON decoders vs. jansson on the API's bodies (ns/body, MB/s)",
     kvt_bench_json_main},
    {"tiers", "RAM and NVMe tiers vs. memcpy and fio, restore vs. RocksDB, reload per block",
     kvt_bench_tiers_main},
    {"replay", "a trace over simulated pods: routing policies' hit ratios and load side by side",
     kvt_bench_replay_main},
    {"gen", "a synthetic trace of sessions, system prompts and tool loops (Mooncake JSONL)",
     kvt_bench_gen_main},
    {"transfer", "UCX pulls between two processes (GB/s, batch latency) vs. ucx_perftest",
     kvt_bench_transfer_main},
    {"connector", "an engine connector's LOOKUP + PIN + UNPIN of N blocks vs. a PING round trip",
     kvt_bench_connector_main},
};

#define KVT_BENCH_NCMDS (sizeof(kvt_bench_cmds) / sizeof(kvt_bench_cmds[0]))

/* ---- helpers (bench.h) ------------------------------------------------------------------ */

static int kvt_bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void kvt_bench_sort_u64(uint64_t *v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof(*v), kvt_bench_cmp_u64);
}

double kvt_bench_percentile(const uint64_t *sorted, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    if (!(p > 0.0))
        p = 0.0; /* also catches NaN */
    if (p > 100.0)
        p = 100.0;
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)rank;
    if (lo >= n - 1)
        return (double)sorted[n - 1];
    double frac = rank - (double)lo;
    return (double)sorted[lo] + frac * ((double)sorted[lo + 1] - (double)sorted[lo]);
}

int kvt_bench_parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out_p)
{
    uint64_t v = 0;
    const char *c = s;

    if (*c == '\0')
        goto err_bad;
    for (; *c != '\0'; c++) {
        if (*c < '0' || *c > '9')
            goto err_bad;
        unsigned d = (unsigned)(*c - '0');
        if (v > (UINT64_MAX - d) / 10)
            goto err_bad;
        v = v * 10 + d;
    }
    if (v < lo || v > hi)
        goto err_bad;
    *out_p = v;
    return 0;

err_bad:
    fprintf(stderr, "kvtier-bench: %s must be an integer in %llu..%llu, got '%s'\n", opt,
            (unsigned long long)lo, (unsigned long long)hi, s);
    return -1;
}

/* True when @s is a plain decimal number: [-]digits[.digits][e[+-]digits], a digit on a side of
 * the point. */
static bool bench_is_decimal(const char *s)
{
    const char *c = s + (*s == '-');
    size_t before = strspn(c, "0123456789");
    c += before;
    size_t after = 0;
    if (*c == '.') {
        after = strspn(c + 1, "0123456789");
        c += 1 + after;
    }
    if (before + after == 0)
        return false;
    if (*c == 'e' || *c == 'E') {
        c += 1 + (c[1] == '+' || c[1] == '-');
        size_t exp = strspn(c, "0123456789");
        if (exp == 0)
            return false;
        c += exp;
    }
    return *c == '\0';
}

int kvt_bench_parse_double(const char *opt, const char *s, double lo, double hi, double *out_p)
{
    /* strtod() alone would also take leading white space, hex, "inf" and "nan" */
    double v = bench_is_decimal(s) ? strtod(s, NULL) : NAN;
    if (!isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "kvtier-bench: %s must be a number in %g..%g, got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out_p = v;
    return 0;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

static void kvt_bench_usage(FILE *out)
{
    fprintf(out, "usage: kvtier-bench <subcommand> [options]\n\nsubcommands:\n");
    for (size_t i = 0; i < KVT_BENCH_NCMDS; i++)
        fprintf(out, "  %-8s %s\n", kvt_bench_cmds[i].name, kvt_bench_cmds[i].summary);
    fprintf(out, "\n'kvtier-bench <subcommand> --help' lists a subcommand's options.\n"
                 "The last line of a run's output is one JSON object with the results.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "kvtier-bench: missing subcommand (try 'kvtier-bench --help')\n");
        return KVT_BENCH_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        kvt_bench_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < KVT_BENCH_NCMDS; i++)
        if (strcmp(kvt_bench_cmds[i].name, name) == 0)
            return kvt_bench_cmds[i].main(argc - 1, argv + 1);
    fprintf(stderr, "kvtier-bench: unknown subcommand '%s' (try 'kvtier-bench --help')\n", name);
    return KVT_BENCH_EXIT_USAGE;
}

/*
 * When argv[*i] is @name as "--name V" or "--name=V", sets *@val_p to V,
 * advances *@i past the value and returns 1; 0 for another option; -1 after
 * printing why when V is missing.
 */
static int bench_opt(int argc, char **argv, int *i, const char *name, const char **val_p)
{
    const char *arg = argv[*i];
    size_t len = strlen(name);

    if (strncmp(arg, name, len) != 0)
        return 0;
    if (arg[len] == '=') {
        *val_p = arg + len + 1;
        return 1;
    }
    if (arg[len] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvtier-bench: option %s needs a value\n", name);
        return -1;
    }
    if (strncmp(argv[*i + 1], "--", 2) == 0) {
        /* another option, not this one's value ("--kvtierd --no-redis") */
        fprintf(stderr, "kvtier-bench: option %s needs a value, got option '%s'\n", name,
                argv[*i + 1]);
        return -1;
    }
    *i += 1;
    *val_p = argv[*i];
    return 1;
}

/* Sets *@a's destination from @v; 0, or -1 after printing why. */
static int bench_arg_set(const kvt_bench_arg_t *a, const char *v)
{
    uint64_t u;
    switch (a->kind) {
    case KVT_BENCH_FLAG: *(bool *)a->dst = true; return 0;
    case KVT_BENCH_STR:
        if (v[0] == '\0' || strncmp(v, "--", 2) == 0) {
            fprintf(stderr, "kvtier-bench: %s needs a value, got '%s'\n", a->name, v);
            return -1;
        }
        *(const char **)a->dst = v;
        return 0;
    case KVT_BENCH_U32:
    case KVT_BENCH_U64:
        if (kvt_bench_parse_u64(a->name, v, a->min, a->max, &u) != 0)
            return -1;
        if (a->kind == KVT_BENCH_U32)
            *(uint32_t *)a->dst = (uint32_t)u;
        else
            *(uint64_t *)a->dst = u;
        return 0;
    case KVT_BENCH_DOUBLE: return kvt_bench_parse_double(a->name, v, a->lo, a->hi, a->dst);
    case KVT_BENCH_CHOICE:
        for (uint32_t k = 0; a->choices[k] != NULL; k++)
            if (strcmp(v, a->choices[k]) == 0) {
                *(uint32_t *)a->dst = k;
                return 0;
            }
        fprintf(stderr, "kvtier-bench: %s must be one of", a->name);
        for (uint32_t k = 0; a->choices[k] != NULL; k++)
            fprintf(stderr, "%s %s", k ? "," : "", a->choices[k]);
        fprintf(stderr, "; got '%s'\n", v);
        return -1;
    case KVT_BENCH_CUSTOM: return a->parse(a->name, v, a->dst);
    }
    return -1;
}

int kvt_bench_parse_args(int argc, char **argv, const kvt_bench_arg_t *args, size_t n)
{
    uint64_t seen = 0; /* bit k: args[k] given */
    if (n > 64) {
        fprintf(stderr, "kvtier-bench: %zu options in one table, at most 64\n", n);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
        size_t k = 0;
        int r = 0;
        const char *v = NULL;
        for (; k < n; k++) {
            if (args[k].kind == KVT_BENCH_FLAG) {
                if ((r = strcmp(argv[i], args[k].name) == 0) != 0)
                    break;
            } else if ((r = bench_opt(argc, argv, &i, args[k].name, &v)) != 0) {
                break;
            }
        }
        if (k == n) {
            fprintf(stderr, "kvtier-bench: unknown option '%s' (try --help)\n", argv[i]);
            return -1;
        }
        if (r < 0)
            return -1;
        if (seen & (1ull << k)) {
            fprintf(stderr, "kvtier-bench: option %s given twice\n", args[k].name);
            return -1;
        }
        seen |= 1ull << k;
        if (bench_arg_set(&args[k], v) != 0)
            return -1;
    }
    return 0;
}
