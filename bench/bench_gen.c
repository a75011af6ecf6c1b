/*
 * `kvtier-bench gen`: writes a synthetic Mooncake-format trace with sessions,
 * shared system prompts and tool-agent loops (bench/gen.h), or gives the
 * Azure CSV's arrivals that prefix structure (--from-azure).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/gen.h"
#include "bench/sim.h"
#include "bench/trace.h"

/* Options not given keep these, so that the ones that do not apply can be refused. */
#define GEN_UNSET_U32 UINT32_MAX
#define GEN_UNSET_DBL (-1.0)

static void gen_usage(const kvt_gen_config_t *d)
{
    printf(
        "usage: kvtier-bench gen --out FILE|- [options]\n"
        "Writes Mooncake-format JSONL (timestamp ms, input_length, output_length, hash_ids,\n"
        "session_id), sorted by timestamp; a summary goes to stderr.\n"
        "  --out FILE|-            where the trace goes ('-': stdout)\n"
        "  --seed S                the generator's seed (default %" PRIu64 ")\n"
        "  --block-tokens N        tokens per hash id (default %" PRIu32 ")\n"
        "  --system-prompts K      distinct shared system prompts (default %" PRIu32 ")\n"
        "  --system-blocks B       blocks of each (default %" PRIu32 ")\n"
        "  --system-share F        share of sessions that open with one (default %g)\n"
        "  --prefix-share F        share of a first message's blocks common to its group\n"
        "                          (same system prompt, or none) (default %g)\n"
        "  --turns N               a chat's turns; with --from-azure the mean (default %" PRIu32
        ")\n"
        "  --turns-max M           chats: uniform in [N, M]; --from-azure: the most (default 0)\n"
        "synthetic sessions:\n"
        "  --sessions N            sessions (default %" PRIu32 ")\n"
        "  --rate R                new sessions per second, Poisson (default %g)\n"
        "  --think-ms MS           mean gap between a chat's turns, exponential (default %" PRIu32
        ")\n"
        "  --first-tokens N        mean tokens of a first user message (default %" PRIu32 ")\n"
        "  --user-tokens N         mean tokens of a later user message (default %" PRIu32 ")\n"
        "  --output-tokens N       mean output tokens (default %" PRIu32 ")\n"
        "  --tool-share F          share of sessions that are tool-agent loops (default %g)\n"
        "  --tool-turns N          a tool loop's turns (default %" PRIu32 ")\n"
        "  --tool-tokens N         mean tokens of a tool result (default %" PRIu32 ")\n"
        "  --tool-think-ms MS      mean gap between a tool loop's turns (default %" PRIu32 ")\n"
        "  (lengths are uniform within +-50%% of their means)\n"
        "arrivals and lengths from the Azure LLM inference CSV instead:\n"
        "  --from-azure CSV        keeps its timestamps and lengths exactly\n"
        "  --idle-ms MS            a session idle this long takes no more turns (default %" PRIu32
        ")\n",
        d->seed, d->block_tokens, d->system_prompts, d->system_blocks, d->system_share,
        d->prefix_share, d->turns, d->sessions, d->rate, d->think_ms, d->first_tokens,
        d->user_tokens, d->output_tokens, d->tool_share, d->tool_turns, d->tool_tokens,
        d->tool_think_ms, d->idle_ms);
}

/* An option whose default is filled in after parsing; @only: 0 both sources, 1 synthetic
 * only, 2 --from-azure only. */
typedef struct gen_opt {
    const char *name;
    uint32_t *u;
    double *d;
    const uint32_t *du;
    const double *dd;
    int only;
} gen_opt_t;

/* Gives options not given their defaults; refuses those that do not apply. 0 or -1. */
static int gen_settle(const gen_opt_t *opts, size_t n, bool azure)
{
    for (size_t i = 0; i < n; i++) {
        const gen_opt_t *o = &opts[i];
        bool given = o->u != NULL ? *o->u != GEN_UNSET_U32 : *o->d != GEN_UNSET_DBL;
        if (given && o->only == 1 && azure) {
            fprintf(stderr,
                    "kvtier-bench: gen: %s does not apply with --from-azure (the CSV gives the "
                    "arrivals and lengths)\n",
                    o->name);
            return -1;
        }
        if (given && o->only == 2 && !azure) {
            fprintf(stderr, "kvtier-bench: gen: %s applies only with --from-azure\n", o->name);
            return -1;
        }
        if (!given) {
            if (o->u != NULL)
                *o->u = *o->du;
            else
                *o->d = *o->dd;
        }
    }
    return 0;
}

int kvt_bench_gen_main(int argc, char **argv)
{
    kvt_gen_config_t d, c;
    kvt_gen_config_default(&d);
    c = d;
    const char *out = NULL, *azure = NULL;
    uint32_t *u32s[] = {&c.block_tokens,  &c.sessions,    &c.turns,         &c.turns_max,
                        &c.tool_turns,    &c.think_ms,    &c.tool_think_ms, &c.first_tokens,
                        &c.user_tokens,   &c.tool_tokens, &c.output_tokens, &c.system_prompts,
                        &c.system_blocks, &c.idle_ms};
    for (size_t i = 0; i < sizeof(u32s) / sizeof(u32s[0]); i++)
        *u32s[i] = GEN_UNSET_U32;
    c.rate = c.tool_share = c.system_share = c.prefix_share = GEN_UNSET_DBL;
    const uint32_t big = UINT32_MAX - 1;
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_STR("--out", &out),
        KVT_BENCH_ARG_STR("--from-azure", &azure),
        KVT_BENCH_ARG_U64("--seed", &c.seed, 1, UINT64_MAX),
        KVT_BENCH_ARG_U32("--block-tokens", &c.block_tokens, 1, 1u << 20),
        KVT_BENCH_ARG_U32("--sessions", &c.sessions, 1, 100000000),
        KVT_BENCH_ARG_DOUBLE("--rate", &c.rate, 1e-9, 1e6),
        KVT_BENCH_ARG_U32("--turns", &c.turns, 1, 1000000),
        KVT_BENCH_ARG_U32("--turns-max", &c.turns_max, 0, 1000000),
        KVT_BENCH_ARG_U32("--tool-turns", &c.tool_turns, 1, 1000000),
        KVT_BENCH_ARG_U32("--think-ms", &c.think_ms, 0, big),
        KVT_BENCH_ARG_U32("--tool-think-ms", &c.tool_think_ms, 0, big),
        KVT_BENCH_ARG_U32("--first-tokens", &c.first_tokens, 1, 1u << 24),
        KVT_BENCH_ARG_U32("--user-tokens", &c.user_tokens, 1, 1u << 24),
        KVT_BENCH_ARG_U32("--tool-tokens", &c.tool_tokens, 1, 1u << 24),
        KVT_BENCH_ARG_U32("--output-tokens", &c.output_tokens, 1, 1u << 24),
        KVT_BENCH_ARG_DOUBLE("--tool-share", &c.tool_share, 0.0, 1.0),
        KVT_BENCH_ARG_U32("--system-prompts", &c.system_prompts, 1, 1u << 24),
        KVT_BENCH_ARG_U32("--system-blocks", &c.system_blocks, 1, 1u << 20),
        KVT_BENCH_ARG_DOUBLE("--system-share", &c.system_share, 0.0, 1.0),
        KVT_BENCH_ARG_DOUBLE("--prefix-share", &c.prefix_share, 0.0, 1.0),
        KVT_BENCH_ARG_U32("--idle-ms", &c.idle_ms, 0, big),
    };
    const gen_opt_t opts[] = {
        {"--block-tokens", &c.block_tokens, NULL, &d.block_tokens, NULL, 0},
        {"--sessions", &c.sessions, NULL, &d.sessions, NULL, 1},
        {"--rate", NULL, &c.rate, NULL, &d.rate, 1},
        {"--turns", &c.turns, NULL, &d.turns, NULL, 0},
        {"--turns-max", &c.turns_max, NULL, &d.turns_max, NULL, 0},
        {"--tool-turns", &c.tool_turns, NULL, &d.tool_turns, NULL, 1},
        {"--think-ms", &c.think_ms, NULL, &d.think_ms, NULL, 1},
        {"--tool-think-ms", &c.tool_think_ms, NULL, &d.tool_think_ms, NULL, 1},
        {"--first-tokens", &c.first_tokens, NULL, &d.first_tokens, NULL, 1},
        {"--user-tokens", &c.user_tokens, NULL, &d.user_tokens, NULL, 1},
        {"--tool-tokens", &c.tool_tokens, NULL, &d.tool_tokens, NULL, 1},
        {"--output-tokens", &c.output_tokens, NULL, &d.output_tokens, NULL, 1},
        {"--tool-share", NULL, &c.tool_share, NULL, &d.tool_share, 1},
        {"--system-prompts", &c.system_prompts, NULL, &d.system_prompts, NULL, 0},
        {"--system-blocks", &c.system_blocks, NULL, &d.system_blocks, NULL, 0},
        {"--system-share", NULL, &c.system_share, NULL, &d.system_share, 0},
        {"--prefix-share", NULL, &c.prefix_share, NULL, &d.prefix_share, 0},
        {"--idle-ms", &c.idle_ms, NULL, &d.idle_ms, NULL, 2},
    };
    int pr = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (pr == 1) {
        gen_usage(&d);
        return 0;
    }
    if (pr != 0)
        return 2;
    if (gen_settle(opts, sizeof(opts) / sizeof(opts[0]), azure != NULL) != 0)
        return 2;
    if (out == NULL) {
        fprintf(stderr, "kvtier-bench: gen needs --out FILE (or --out - for stdout)\n");
        return 2;
    }

    char err[256] = "";
    kvt_trace_t *arr = NULL;
    if (azure != NULL) {
        kvt_status_t st = kvt_trace_load_csv(azure, &arr, err, sizeof(err));
        if (st != KVT_OK) {
            fprintf(stderr, "kvtier-bench: %s: %s\n", azure, err[0] ? err : kvt_status_str(st));
            return 1;
        }
    }
    kvt_gen_t *g = NULL;
    kvt_status_t st = kvt_gen_create(&c, arr, &g, err, sizeof(err));
    kvt_trace_free(arr);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: gen: %s\n", err[0] ? err : kvt_status_str(st));
        return st == KVT_ERR_INVAL ? 2 : 1;
    }
    int rc = 1;
    bool to_stdout = strcmp(out, "-") == 0;
    FILE *f = to_stdout ? stdout : fopen(out, "w");
    if (f == NULL) {
        perror(out);
        goto out_gen;
    }
    st = kvt_gen_write(g, f, err, sizeof(err));
    if (!to_stdout && fclose(f) != 0 && st == KVT_OK) {
        st = KVT_ERR_IO;
        snprintf(err, sizeof(err), "write error");
    }
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: %s: %s\n", out, err);
        goto out_gen;
    }
    uint64_t hit = 0, total = 0;
    if (kvt_sim_ideal(g->trace, &hit, &total) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto out_gen;
    }
    uint32_t tools = 0, sys = 0;
    for (uint32_t s = 0; s < g->nsessions; s++) {
        tools += g->session_tool[s];
        sys += g->session_system[s] != 0;
    }
    double ideal = total ? (double)hit / (double)total : 0.0;
    fprintf(stderr,
            "gen: %zu requests, %" PRIu32 " sessions (%" PRIu32 " tool loops, %" PRIu32
            " with a system prompt), %" PRIu64 " distinct blocks of %" PRIu32 " tokens, %" PRIu64
            " blocks in all; ideal hit ratio (one pod, unbounded cache) %.2f%%\n",
            g->trace->nreqs, g->nsessions, tools, sys, g->distinct_blocks, c.block_tokens, total,
            100.0 * ideal);
    if (!to_stdout)
        printf("{\"bench\":\"gen\",\"requests\":%zu,\"sessions\":%" PRIu32
               ",\"tool_sessions\":%" PRIu32 ",\"system_sessions\":%" PRIu32
               ",\"distinct_blocks\":%" PRIu64 ",\"total_blocks\":%" PRIu64
               ",\"ideal_hit_ratio\":%.6f}\n",
               g->trace->nreqs, g->nsessions, tools, sys, g->distinct_blocks, total, ideal);
    rc = 0;
out_gen:
    kvt_gen_destroy(g);
    return rc;
}
