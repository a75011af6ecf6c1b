/*
 * `kvtier-bench replay`: a trace replayed over simulated pods under the
 * routers' policies side by side (bench/sim.h). --mode live is bench_live.c.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/gen.h"
#include "bench/live_run.h"
#include "bench/replay.h"
#include "bench/replay_plot.h"
#include "bench/sim.h"
#include "bench/trace.h"

static const char *const replay_modes[] = {"cache", "timed", "live", NULL};
static const char *const replay_load_units[] = {"percent", "blocks", NULL};

static void replay_usage(void)
{
    printf("usage: kvtier-bench replay --trace FILE [options]\n"
           "  --mode cache            requests in trace order, each finished before the next\n"
           "  --mode timed            arrivals in simulated time (--mode timed --help)\n"
           "  --mode live             engines publishing to a real kvtierd (--mode live --help)\n"
           "  --trace FILE            Mooncake JSONL trace (one hash id per block, optional\n"
           "                          session_id), or the Azure CSV (*.csv: prefix structure\n"
           "                          from `kvtier-bench gen --from-azure` defaults, --seed)\n"
           "  --pods N                simulated pods (default 8)\n"
           "  --capacity-blocks C     blocks each pod caches, LRU beyond (default 0: unbounded)\n"
           "  --policy P[,P...]|all   random, round-robin, least-loaded, session, prefix, cost,\n"
           "                          approx-prefix, cost-tiers (default all)\n"
           "  --seed S                random's generator and the scorer's tie-breaks (default 1)\n"
           "  --load-weight W         cost, approx-prefix: the scorer's w_load (default 1.0)\n"
           "  --load-unit U           a pod's load, its blocks prefilled beyond the least loaded\n"
           "                          pod's: in percent of the mean (default) or in blocks\n"
           "  --load-half-life S      those blocks decay with this half-life in trace seconds\n"
           "                          (default 0: every block since the start counts)\n"
           "  --approx-capacity E     approx-prefix: its table's entries per pod (default 0:\n"
           "                          --capacity-blocks)\n"
           "  --per-request FILE      write 'policy request pod hit blocks' lines to FILE\n"
           "  --out DIR               write plots there as PNG (gnuplot): hit ratio against\n"
           "                          capacity per policy, per-pod load\n"
           "The last stdout line is one JSON object: the policy's figures, or with several\n"
           "policies a \"results\" array of them.\n");
}

/* Parses @list ("all" or comma-separated names) into @pol (room for KVT_SIM_NPOLICIES). */
static int replay_policies(const char *list, kvt_sim_policy_t *pol, size_t *n_p)
{
    size_t n = 0;
    if (strcmp(list, "all") == 0) {
        for (unsigned i = 0; i < KVT_SIM_NPOLICIES; i++)
            pol[n++] = (kvt_sim_policy_t)i;
        *n_p = n;
        return 0;
    }
    const char *p = list;
    while (*p != '\0') {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char name[32];
        kvt_sim_policy_t k;
        if (len == 0 || len >= sizeof(name))
            goto err_bad;
        memcpy(name, p, len);
        name[len] = '\0';
        if (kvt_sim_policy_parse(name, &k) != KVT_OK)
            goto err_bad;
        for (size_t j = 0; j < n; j++)
            if (pol[j] == k) {
                fprintf(stderr, "kvtier-bench: --policy: '%s' given twice\n", name);
                return -1;
            }
        pol[n++] = k;
        p += len + (e != NULL);
        if (e != NULL && *p == '\0')
            goto err_bad;
    }
    *n_p = n;
    return 0;

err_bad:
    fprintf(stderr, "kvtier-bench: --policy must be 'all' or a comma list of");
    for (unsigned i = 0; i < KVT_SIM_NPOLICIES; i++)
        fprintf(stderr, "%s %s", i ? "," : "", kvt_sim_policy_name((kvt_sim_policy_t)i));
    fprintf(stderr, "; got '%s'\n", list);
    return -1;
}

/* One policy's figures; @belady < 0 leaves belady_hit_ratio out (live mode has none). */
static void replay_json_result(const kvt_sim_policy_t pol, const kvt_sim_result_t *r, double ideal,
                               double belady)
{
    printf("\"policy\":\"%s\",\"hit_ratio\":%.6f,\"ideal_hit_ratio\":%.6f,",
           kvt_sim_policy_name(pol), r->hit_ratio, ideal);
    if (belady >= 0)
        printf("\"belady_hit_ratio\":%.6f,", belady);
    printf("\"fraction_of_ideal\":%.4f,\"load_imbalance\":%.4f,\"routed_imbalance\":%.4f,"
           "\"hit_blocks\":%" PRIu64 ",\"total_blocks\":%" PRIu64 ",\"requests\":%" PRIu64
           ",\"evicted_blocks\":%" PRIu64 ",\"index_mismatch\":%" PRIu64,
           ideal > 0 ? r->hit_ratio / ideal : 0.0, r->load_imbalance, r->routed_imbalance,
           r->hit_blocks, r->total_blocks, r->requests, r->evicted, r->index_mismatch);
}

int kvt_replay_input_load(kvt_replay_input_t *in, const char *path, uint64_t seed)
{
    char err[256] = "";
    size_t n = strlen(path);
    bool csv = n >= 4 && strcmp(path + n - 4, ".csv") == 0;
    kvt_trace_t *t = NULL;
    memset(in, 0, sizeof(*in));
    kvt_status_t st = csv ? kvt_trace_load_csv(path, &t, err, sizeof(err))
                          : kvt_trace_load(path, &t, err, sizeof(err));
    if (st == KVT_OK && csv) {
        kvt_gen_config_t cfg;
        kvt_gen_config_default(&cfg);
        cfg.seed = seed;
        st = kvt_gen_create(&cfg, t, &in->gen, err, sizeof(err));
        kvt_trace_free(t);
        t = st == KVT_OK ? in->gen->trace : NULL;
    }
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: %s: %s\n", path, err[0] ? err : kvt_status_str(st));
        return -1;
    }
    in->t = t;
    /* the requests' session ids, for `session`: none when the trace names no session */
    for (size_t i = 0; i < t->nreqs && in->sessions == NULL; i++)
        if (t->reqs[i].session != 0 &&
            (in->sessions = calloc(t->nreqs, sizeof(*in->sessions))) == NULL) {
            fprintf(stderr, "kvtier-bench: out of memory\n");
            kvt_replay_input_free(in);
            return -1;
        }
    for (size_t i = 0; in->sessions != NULL && i < t->nreqs; i++)
        in->sessions[i] = t->reqs[i].session;
    return 0;
}

void kvt_replay_input_free(kvt_replay_input_t *in)
{
    if (in->gen != NULL)
        kvt_gen_destroy(in->gen); /* and its trace */
    else
        kvt_trace_free(in->t);
    free(in->sessions);
    memset(in, 0, sizeof(*in));
}

int kvt_bench_replay_policies(const char *list, kvt_sim_policy_t *pol, size_t *n_p)
{
    return replay_policies(list, pol, n_p);
}

void kvt_bench_replay_json(kvt_sim_policy_t pol, const kvt_sim_result_t *r, double ideal)
{
    replay_json_result(pol, r, ideal, -1.0);
}

/* Per-pod capacities of the hit-ratio plot, as fractions of the trace's distinct blocks. */
static const double replay_plot_fracs[] = {0.005, 0.01, 0.02, 0.05, 0.1, 0.2};

/* The cache mode's plots in @dir: per-pod load of @res, hit ratio against capacity. */
static int replay_cache_plots(const char *dir, const kvt_trace_t *t, const kvt_sim_config_t *base,
                              const kvt_sim_policy_t *pol, size_t npol, const kvt_sim_result_t *res)
{
    const char *labels[KVT_SIM_NPOLICIES];
    double *load[KVT_SIM_NPOLICIES];
    uint32_t pods = base->pods;
    char err[256] = "";
    int rc = -1;
    double *buf = calloc(npol * pods, sizeof(*buf));
    if (buf == NULL) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        return -1;
    }
    for (size_t k = 0; k < npol; k++) {
        labels[k] = kvt_sim_policy_name(pol[k]);
        load[k] = buf + k * pods;
        for (uint32_t p = 0; p < pods; p++)
            load[k][p] = (double)res[k].prefilled[p];
    }
    if (kvt_replay_plot_load(dir, labels, (const double *const *)load, npol, pods,
                             "blocks prefilled", err, sizeof(err)) != 0 ||
        kvt_replay_plot_capacity(dir, t, base, pol, npol, replay_plot_fracs,
                                 sizeof(replay_plot_fracs) / sizeof(replay_plot_fracs[0]), err,
                                 sizeof(err)) != 0)
        fprintf(stderr, "kvtier-bench: --out: %s\n", err);
    else
        rc = 0;
    if (rc == 0)
        fprintf(stderr, "plots: %s/pod-load.png, %s/hit-ratio-vs-capacity.png\n", dir, dir);
    free(buf);
    return rc;
}

int kvt_bench_replay_main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) { /* the timed and live modes have options of their own */
        bool eq = strncmp(argv[i], "--mode=", 7) == 0;
        const char *m = eq                                               ? argv[i] + 7
                        : strcmp(argv[i], "--mode") == 0 && i + 1 < argc ? argv[i + 1]
                                                                         : "";
        if (strcmp(m, "timed") == 0)
            return kvt_bench_replay_timed_main(argc, argv);
        if (strcmp(m, "live") == 0)
            return kvt_bench_live_main(argc, argv);
    }
    uint32_t mode = 0, pods = 8, load_unit = 0;
    uint64_t capacity = 0, seed = 1, approx_capacity = 0;
    double load_weight = 1.0, half_life = 0.0;
    const char *trace_path = NULL, *policy = "all", *per_request = NULL, *out_dir = NULL;
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_CHOICE("--mode", &mode, replay_modes),
        KVT_BENCH_ARG_STR("--trace", &trace_path),
        KVT_BENCH_ARG_U32("--pods", &pods, 1, 4096),
        KVT_BENCH_ARG_U64("--capacity-blocks", &capacity, 0, UINT32_MAX - 2u),
        KVT_BENCH_ARG_STR("--policy", &policy),
        KVT_BENCH_ARG_U64("--seed", &seed, 1, UINT64_MAX),
        KVT_BENCH_ARG_DOUBLE("--load-weight", &load_weight, 0.0, 1e9),
        KVT_BENCH_ARG_DOUBLE("--load-half-life", &half_life, 0.0, 1e9),
        KVT_BENCH_ARG_CHOICE("--load-unit", &load_unit, replay_load_units),
        KVT_BENCH_ARG_U64("--approx-capacity", &approx_capacity, 0, UINT32_MAX - 2u),
        KVT_BENCH_ARG_STR("--per-request", &per_request),
        KVT_BENCH_ARG_STR("--out", &out_dir),
    };
    int pr = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (pr == 1) {
        replay_usage();
        return 0;
    }
    if (pr != 0)
        return 2;
    (void)mode;
    if (trace_path == NULL) {
        fprintf(stderr, "kvtier-bench: replay needs --trace FILE\n");
        return 2;
    }
    kvt_sim_policy_t pol[KVT_SIM_NPOLICIES];
    size_t npol = 0;
    if (replay_policies(policy, pol, &npol) != 0)
        return 2;

    char err[256] = "";
    kvt_replay_input_t in;
    if (kvt_replay_input_load(&in, trace_path, seed) != 0)
        return 1;
    const kvt_trace_t *t = in.t;
    const uint64_t *sessions = in.sessions;
    FILE *pf = NULL;
    if (per_request != NULL && (pf = fopen(per_request, "w")) == NULL) {
        perror(per_request);
        goto err_trace;
    }
    uint64_t ihit = 0, itotal = 0;
    if (kvt_sim_ideal(t, &ihit, &itotal) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto err_trace;
    }
    double ideal = itotal ? (double)ihit / (double)itotal : 0.0;
    uint64_t bhit = 0;
    if (kvt_sim_belady(t, capacity, &bhit, NULL) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto err_trace;
    }
    double belady = itotal ? (double)bhit / (double)itotal : 0.0;

    kvt_sim_result_t res[KVT_SIM_NPOLICIES];
    memset(res, 0, sizeof(res));
    printf("replay --mode cache: %s, %zu requests, %" PRIu64 " blocks, %" PRIu32
           " pods, capacity %s%" PRIu64 " blocks per pod\n",
           trace_path, t->nreqs, itotal, pods, capacity ? "" : "unbounded ", capacity);
    printf("ideal (one pod, unbounded cache): %" PRIu64 " / %" PRIu64 " blocks hit = %.2f%%\n",
           ihit, itotal, 100.0 * ideal);
    printf("belady (one pod, the same capacity, farthest next use evicted): %" PRIu64
           " blocks hit = %.2f%%\n\n",
           bhit, 100.0 * belady);
    printf("%-13s %9s %9s %10s %10s %12s %12s %10s\n", "policy", "hit %", "of ideal", "load imb",
           "routed imb", "hit blocks", "total", "evicted");
    for (size_t k = 0; k < npol; k++) {
        kvt_sim_config_t cfg = {
            .pods = pods,
            .capacity_blocks = capacity,
            .policy = pol[k],
            .seed = seed,
            .load_weight = load_weight,
            .load_half_life_ms = 1000.0 * half_life,
            .load_blocks = load_unit == 1,
            .approx_capacity = approx_capacity,
            .sessions = sessions,
        };
        kvt_status_t st = kvt_sim_run(t, &cfg, &res[k], err, sizeof(err));
        if (st != KVT_OK) {
            fprintf(stderr, "kvtier-bench: replay %s: %s\n", kvt_sim_policy_name(pol[k]), err);
            goto err_res;
        }
        const kvt_sim_result_t *r = &res[k];
        printf("%-13s %8.2f%% %8.1f%% %10.3f %10.3f %12" PRIu64 " %12" PRIu64 " %10" PRIu64 "\n",
               kvt_sim_policy_name(pol[k]), 100.0 * r->hit_ratio,
               ideal > 0 ? 100.0 * r->hit_ratio / ideal : 0.0, r->load_imbalance,
               r->routed_imbalance, r->hit_blocks, r->total_blocks, r->evicted);
        if (r->index_mismatch != 0)
            fprintf(stderr,
                    "kvtier-bench: %s: the index disagreed with the cache model on %" PRIu64
                    " requests\n",
                    kvt_sim_policy_name(pol[k]), r->index_mismatch);
        if (pf != NULL)
            for (size_t i = 0; i < t->nreqs; i++)
                fprintf(pf, "%s %zu %" PRIu32 " %" PRIu32 " %" PRIu32 "\n",
                        kvt_sim_policy_name(pol[k]), i, r->req_pod[i], r->req_hit[i],
                        t->reqs[i].nblocks);
    }
    printf("load imb: max/mean over pods of blocks prefilled (not hit); routed imb: of blocks "
           "routed\n");
    if (out_dir != NULL) {
        kvt_sim_config_t base = {
            .pods = pods,
            .seed = seed,
            .load_weight = load_weight,
            .load_half_life_ms = 1000.0 * half_life,
            .load_blocks = load_unit == 1,
            .approx_capacity = approx_capacity,
            .sessions = sessions,
        };
        if (replay_cache_plots(out_dir, t, &base, pol, npol, res) != 0)
            goto err_res;
    }
    printf("{\"bench\":\"replay\",\"mode\":\"cache\",\"pods\":%" PRIu32
           ",\"capacity_blocks\":%" PRIu64 ",",
           pods, capacity);
    if (npol == 1) {
        replay_json_result(pol[0], &res[0], ideal, belady);
    } else {
        printf("\"ideal_hit_ratio\":%.6f,\"belady_hit_ratio\":%.6f,\"results\":[", ideal, belady);
        for (size_t k = 0; k < npol; k++) {
            printf(k ? ",{" : "{");
            replay_json_result(pol[k], &res[k], ideal, belady);
            printf("}");
        }
        printf("]");
    }
    printf("}\n");
    int rc = 0;
    for (size_t k = 0; k < npol; k++) {
        if (res[k].index_mismatch != 0)
            rc = 1;
        kvt_sim_result_cleanup(&res[k]);
    }
    if (pf != NULL && fclose(pf) != 0) {
        perror(per_request);
        rc = 1;
    }
    kvt_replay_input_free(&in);
    return rc;

err_res:
    for (size_t k = 0; k < npol; k++)
        kvt_sim_result_cleanup(&res[k]);
err_trace:
    if (pf != NULL)
        fclose(pf);
    kvt_replay_input_free(&in);
    return 1;
}
