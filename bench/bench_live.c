/*
 * `kvtier-bench replay --mode live`: simulated engines publishing real vLLM KV
 * events to a real index-role kvtierd, and a router asking it through
 * libkvtier (bench/live_run.h). The figures of the cache mode, plus TTFT, the
 * router's query latency and how often its view was stale.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/live_run.h"
#include "bench/replay_plot.h"
#include "bench/sim.h"
#include "bench/trace.h"
#include "common/clock.h"

static void live_usage(void)
{
    printf("usage: kvtier-bench replay --mode live --trace FILE [options]\n"
           "  --trace FILE            Mooncake JSONL trace (one hash id per block)\n"
           "  --pods N                simulated engines (default 4)\n"
           "  --capacity-blocks C     blocks each engine caches, LRU beyond (default 0: the\n"
           "                          trace's distinct blocks)\n"
           "  --policy P[,P...]|all   random, round-robin, least-loaded, session, prefix, cost,\n"
           "                          approx-prefix (default all)\n"
           "  --speedup X             trace seconds per wall second (default 100)\n"
           "  --requests N            replay the first N requests (default 0: all)\n"
           "  --kvtierd PATH          the kvtierd to start (default: next to kvtier-bench)\n"
           "  --connect HOST:PORT     use this kvtierd's RPC instead of starting one\n"
           "  --block-tokens B        tokens per block in the engines' events (default 16)\n"
           "  --routed-ttl-ms T       prefix, cost: record each decision with this TTL\n"
           "                          (kvt_client_routed; default 2000, 0: not recorded)\n"
           "  --seed S                random's generator and the scorer's tie-breaks (default 1)\n"
           "  --load-weight W         cost: the scorer's w_load (default 1.0)\n"
           "  --tag NAME              model '<NAME>-<policy>', pods '<NAME>-<policy>-<i>'\n"
           "                          (default live)\n"
           "  --keep-engines          leave the engines subscribed (and their blocks) at the end\n"
           "  --dump-held FILE        write 'model pod key...' per engine after each policy\n"
           "  --per-request FILE      write 'policy request pod hit blocks view ttft_us\n"
           "                          query_us' lines to FILE\n"
           "  --out DIR               write plots there as PNG (gnuplot): TTFT CDF, per-pod load\n"
           "  --lose-every K          test hook: each engine's every Kth batch skips the PUB\n"
           "                          (the daemon replays it; default 0: none)\n"
           "The last stdout line is one JSON object: the policy's figures, or with several\n"
           "policies a \"results\" array of them.\n");
}

static void live_json_result(kvt_sim_policy_t pol, const kvt_live_result_t *r, double ideal)
{
    kvt_bench_replay_json(pol, &r->sim, ideal);
    printf(",\"ttft_p50_ms\":%.3f,\"ttft_p90_ms\":%.3f,\"ttft_p99_ms\":%.3f,"
           "\"query_p50_us\":%.1f,\"query_p99_us\":%.1f,\"query_max_us\":%.1f,"
           "\"routed_calls\":%" PRIu64 ",\"routed_p50_us\":%.1f,\"stale_requests\":%" PRIu64
           ",\"stale_ratio\":%.6f,\"stale_over\":%" PRIu64 ",\"stale_under\":%" PRIu64
           ",\"final_view_mismatch\":%" PRIu64 ",\"held_blocks\":%" PRIu64 ",\"batches\":%" PRIu64
           ",\"gaps\":%" PRIu64 ",\"replays\":%" PRIu64 ",\"state_drops\":%" PRIu64
           ",\"lag_max_ms\":%.3f,\"wall_s\":%.3f",
           r->ttft_p50_ms, r->ttft_p90_ms, r->ttft_p99_ms, r->query_p50_us, r->query_p99_us,
           r->query_max_us, r->routed_calls, r->routed_p50_us, r->sim.index_mismatch,
           r->sim.requests ? (double)r->sim.index_mismatch / (double)r->sim.requests : 0.0,
           r->stale_over, r->stale_under, r->final_mismatch, r->held_blocks, r->batches, r->gaps,
           r->replays, r->state_drops, r->lag_max_ms, r->wall_s);
}

/* The trace's first @nreqs requests as a trace of their own (views into @t). */
static void live_slice(const kvt_trace_t *t, size_t nreqs, kvt_trace_t *s)
{
    *s = *t;
    s->nreqs = nreqs;
    s->nids = nreqs < t->nreqs ? (size_t)(t->reqs[nreqs].hash_ids - t->ids) : t->nids;
}

typedef struct live_opts {
    uint32_t pods, block_tokens, routed_ttl, lose_every;
    uint64_t capacity, seed, requests;
    double load_weight, speedup;
    const char *trace, *policy, *kvtierd, *connect, *tag, *dump, *per_request, *out;
    bool keep;
} live_opts_t;

static int live_parse(int argc, char **argv, live_opts_t *o)
{
    static const char *const modes[] = {"cache", "live", NULL};
    uint32_t mode = 1;
    *o = (live_opts_t){.pods = 4,
                       .block_tokens = 16,
                       .routed_ttl = 2000,
                       .seed = 1,
                       .load_weight = 1.0,
                       .speedup = 100.0,
                       .policy = "all",
                       .tag = "live"};
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_CHOICE("--mode", &mode, modes),
        KVT_BENCH_ARG_STR("--trace", &o->trace),
        KVT_BENCH_ARG_U32("--pods", &o->pods, 1, KVT_LIVE_MAX_PODS),
        KVT_BENCH_ARG_U64("--capacity-blocks", &o->capacity, 0, UINT32_MAX - 2u),
        KVT_BENCH_ARG_STR("--policy", &o->policy),
        KVT_BENCH_ARG_DOUBLE("--speedup", &o->speedup, 0.001, 1e6),
        KVT_BENCH_ARG_U64("--requests", &o->requests, 0, UINT64_MAX),
        KVT_BENCH_ARG_STR("--kvtierd", &o->kvtierd),
        KVT_BENCH_ARG_STR("--connect", &o->connect),
        KVT_BENCH_ARG_U32("--block-tokens", &o->block_tokens, 1, 1024),
        KVT_BENCH_ARG_U32("--routed-ttl-ms", &o->routed_ttl, 0, 60000),
        KVT_BENCH_ARG_U64("--seed", &o->seed, 1, UINT64_MAX),
        KVT_BENCH_ARG_DOUBLE("--load-weight", &o->load_weight, 0.0, 1e9),
        KVT_BENCH_ARG_STR("--tag", &o->tag),
        KVT_BENCH_ARG_FLAG("--keep-engines", &o->keep),
        KVT_BENCH_ARG_STR("--dump-held", &o->dump),
        KVT_BENCH_ARG_STR("--per-request", &o->per_request),
        KVT_BENCH_ARG_STR("--out", &o->out),
        KVT_BENCH_ARG_U32("--lose-every", &o->lose_every, 0, UINT32_MAX),
    };
    int pr = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (pr == 1) {
        live_usage();
        return 1;
    }
    if (pr != 0)
        return -1;
    if (o->trace == NULL) {
        fprintf(stderr, "kvtier-bench: replay needs --trace FILE\n");
        return -1;
    }
    if (o->lose_every == 1) {
        fprintf(stderr, "kvtier-bench: --lose-every must be 0 or at least 2\n");
        return -1;
    }
    if (strlen(o->tag) > 40 || strpbrk(o->tag, "\"\\/ ") != NULL) {
        fprintf(stderr, "kvtier-bench: --tag: at most 40 bytes, no quote, backslash, / or space\n");
        return -1;
    }
    if (o->kvtierd == NULL && o->connect == NULL &&
        (o->kvtierd = kvt_bench_default_kvtierd()) == NULL) {
        fprintf(stderr, "kvtier-bench: no kvtierd: give --kvtierd PATH or --connect HOST:PORT\n");
        return -1;
    }
    return 0;
}

/* --out: the TTFT CDF and the per-pod load of every policy's run. */
static int live_plots(const char *dir, const kvt_sim_policy_t *pol, size_t npol,
                      const kvt_live_result_t *res, uint32_t pods)
{
    const char *labels[KVT_SIM_NPOLICIES];
    const double *ttft[KVT_SIM_NPOLICIES];
    double *load[KVT_SIM_NPOLICIES];
    size_t n[KVT_SIM_NPOLICIES];
    char err[256] = "";
    double *buf = calloc(npol * pods, sizeof(*buf));
    if (buf == NULL) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        return -1;
    }
    for (size_t k = 0; k < npol; k++) {
        labels[k] = kvt_sim_policy_name(pol[k]);
        ttft[k] = res[k].ttft_ms;
        n[k] = res[k].sim.requests;
        load[k] = buf + k * pods;
        for (uint32_t p = 0; p < pods; p++)
            load[k][p] = (double)res[k].sim.prefilled[p];
    }
    int rc = kvt_replay_plot_ttft(dir, labels, ttft, n, npol, err, sizeof(err)) != 0 ||
                     kvt_replay_plot_load(dir, labels, (const double *const *)load, npol, pods,
                                          "blocks prefilled", err, sizeof(err)) != 0
                 ? -1
                 : 0;
    free(buf);
    if (rc != 0)
        fprintf(stderr, "kvtier-bench: --out: %s\n", err);
    else
        fprintf(stderr, "plots: %s/ttft-cdf.png, %s/pod-load.png\n", dir, dir);
    return rc;
}

/* Runs every policy of @pol; prints the table. 0, or 1 after a line on stderr. */
static int live_policies(kvt_client_t *c, const live_opts_t *o, const kvt_trace_t *t,
                         const uint64_t *sessions, const kvt_live_keys_t *keys,
                         const kvt_sim_policy_t *pol, size_t npol, double ideal,
                         kvt_live_result_t *res, FILE *dump, FILE *pf)
{
    printf("%-13s %7s %8s %8s %9s %9s %9s %9s %7s %7s\n", "policy", "hit %", "of ideal", "load imb",
           "TTFT p50", "TTFT p99", "query p50", "query p99", "stale %", "wall s");
    for (size_t k = 0; k < npol; k++) {
        kvt_live_config_t cfg = {
            .t = t,
            .nreqs = t->nreqs,
            .keys = keys,
            .pods = o->pods,
            .capacity_blocks = o->capacity ? o->capacity : (keys->n ? keys->n : 1),
            .policy = pol[k],
            .seed = o->seed,
            .load_weight = o->load_weight,
            .speedup = o->speedup,
            .block_size = o->block_tokens,
            .routed_ttl_ms = o->routed_ttl,
            .lose_every = o->lose_every,
            .tag = o->tag,
            .keep_engines = o->keep,
            .dump = dump,
            .per_request = pf,
            .sessions = sessions,
        };
        kvt_sim_model_default(&cfg.model);
        char err[256] = "";
        if (kvt_live_run(c, &cfg, &res[k], err, sizeof(err)) != KVT_OK) {
            fprintf(stderr, "kvtier-bench: replay %s: %s\n", kvt_sim_policy_name(pol[k]), err);
            return 1;
        }
        const kvt_live_result_t *r = &res[k];
        printf("%-13s %6.2f%% %7.1f%% %8.3f %7.0fms %7.0fms %7.0fus %7.0fus %6.2f%% %7.1f\n",
               kvt_sim_policy_name(pol[k]), 100.0 * r->sim.hit_ratio,
               ideal > 0 ? 100.0 * r->sim.hit_ratio / ideal : 0.0, r->sim.load_imbalance,
               r->ttft_p50_ms, r->ttft_p99_ms, r->query_p50_us, r->query_p99_us,
               r->sim.requests ? 100.0 * (double)r->sim.index_mismatch / (double)r->sim.requests
                               : 0.0,
               r->wall_s);
        fflush(stdout);
        if (r->final_mismatch != 0)
            fprintf(stderr,
                    "kvtier-bench: %s: the daemon's final view differs from the engines' caches on "
                    "%" PRIu64 " blocks\n",
                    kvt_sim_policy_name(pol[k]), r->final_mismatch);
    }
    return 0;
}

int kvt_bench_live_main(int argc, char **argv)
{
    live_opts_t o;
    int pr = live_parse(argc, argv, &o);
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    kvt_sim_policy_t pol[KVT_SIM_NPOLICIES];
    size_t npol = 0;
    if (kvt_bench_replay_policies(o.policy, pol, &npol) != 0)
        return 2;
    size_t kept = 0;
    for (size_t k = 0; k < npol; k++) {
        if (pol[k] <= KVT_SIM_COST || pol[k] == KVT_SIM_APPROX_PREFIX) {
            pol[kept++] = pol[k];
        } else if (strcmp(o.policy, "all") != 0) { /* a policy this mode does not drive (yet) */
            fprintf(stderr, "kvtier-bench: --mode live has no policy '%s'\n",
                    kvt_sim_policy_name(pol[k]));
            return 2;
        }
    }
    npol = kept; /* "all": the ones it drives */

    uint64_t wall0 = kvt_clock_ns();
    kvt_replay_input_t in;
    kvt_trace_t t;
    if (kvt_replay_input_load(&in, o.trace, o.seed) != 0)
        return 1;
    const kvt_trace_t *full = in.t;
    live_slice(full, o.requests && o.requests < full->nreqs ? o.requests : full->nreqs, &t);
    int rc = 1;
    FILE *pf = NULL, *dump = NULL;
    kvt_bench_daemon_t d = {0};
    kvt_client_t *c = NULL;
    kvt_live_keys_t keys = {0};
    kvt_live_result_t res[KVT_SIM_NPOLICIES];
    memset(res, 0, sizeof(res));
    uint64_t ihit = 0, itotal = 0;
    if (kvt_sim_ideal(&t, &ihit, &itotal) != KVT_OK ||
        kvt_live_keys_build(&t, t.nreqs, o.block_tokens, &keys) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto out;
    }
    if (keys.conflicts != 0)
        fprintf(stderr,
                "kvtier-bench: %zu trace ids come after different prefixes: the daemon keys them "
                "apart, the engines' caches do not\n",
                keys.conflicts);
    if ((o.per_request != NULL && (pf = fopen(o.per_request, "w")) == NULL) ||
        (o.dump != NULL && (dump = fopen(o.dump, "w")) == NULL)) {
        perror(pf == NULL && o.per_request != NULL ? o.per_request : o.dump);
        goto out;
    }
    double ideal = itotal ? (double)ihit / (double)itotal : 0.0;

    char addr[300];
    if (o.connect == NULL) {
        const char *args[] = {"--workers", "1", "--stats-period", "10ms", NULL};
        if (kvt_bench_daemon_start(o.kvtierd, args, &d) != 0)
            goto out;
        snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)d.rpc);
    } else {
        snprintf(addr, sizeof(addr), "%s", o.connect);
    }
    if ((c = kvt_bench_client(addr, 10000)) == NULL)
        goto out;
    printf("replay --mode live: %s, %zu requests, %" PRIu64 " blocks, %" PRIu32
           " engines, capacity %" PRIu64 " blocks per engine, speedup %g, kvtierd %s%s\n",
           o.trace, t.nreqs, itotal, o.pods, o.capacity ? o.capacity : (uint64_t)keys.n, o.speedup,
           o.connect ? "at " : "started on ", addr);
    printf("ideal (one pod, unbounded cache): %" PRIu64 " / %" PRIu64 " blocks hit = %.2f%%\n\n",
           ihit, itotal, 100.0 * ideal);
    if (live_policies(c, &o, &t, in.sessions, &keys, pol, npol, ideal, res, dump, pf) != 0)
        goto out;
    if (o.out != NULL && live_plots(o.out, pol, npol, res, o.pods) != 0)
        goto out;
    printf(
        "load imb: max/mean over engines of blocks prefilled; TTFT: simulated (wait + prefill);\n"
        "query: the router's kvt_client_query_keys round trip; stale: requests whose daemon\n"
        "match on the chosen engine differed from the engine's hit; %.1f s wall in all\n",
        (double)(kvt_clock_ns() - wall0) / 1e9);
    printf("{\"bench\":\"replay\",\"mode\":\"live\",\"pods\":%" PRIu32
           ",\"capacity_blocks\":%" PRIu64 ",\"speedup\":%g,\"requests\":%zu,",
           o.pods, o.capacity ? o.capacity : (uint64_t)keys.n, o.speedup, t.nreqs);
    if (npol == 1) {
        live_json_result(pol[0], &res[0], ideal);
    } else {
        printf("\"ideal_hit_ratio\":%.6f,\"results\":[", ideal);
        for (size_t k = 0; k < npol; k++) {
            printf(k ? ",{" : "{");
            live_json_result(pol[k], &res[k], ideal);
            printf("}");
        }
        printf("]");
    }
    printf("}\n");
    rc = 0;
    for (size_t k = 0; k < npol; k++)
        if (res[k].final_mismatch != 0)
            rc = 1;
out:
    for (size_t k = 0; k < KVT_SIM_NPOLICIES; k++)
        kvt_live_result_cleanup(&res[k]);
    kvt_client_destroy(c);
    kvt_bench_daemon_stop(&d);
    kvt_live_keys_cleanup(&keys);
    if (pf != NULL && fclose(pf) != 0)
        rc = 1;
    if (dump != NULL && fclose(dump) != 0)
        rc = 1;
    kvt_replay_input_free(&in);
    return rc;
}
