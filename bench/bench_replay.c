/*
 * `kvtier-bench replay`: a trace replayed over simulated pods under the
 * routers' policies side by side (bench/sim.h). Only --mode cache for now.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/sim.h"
#include "bench/trace.h"

static const char *const replay_modes[] = {"cache", "timed", NULL};

static void replay_usage(void)
{
    printf("usage: kvtier-bench replay --trace FILE [options]\n"
           "  --mode cache            requests in trace order, each finished before the next\n"
           "  --mode timed            arrivals in simulated time (--mode timed --help)\n"
           "  --trace FILE            Mooncake JSONL trace (one hash id per block)\n"
           "  --pods N                simulated pods (default 8)\n"
           "  --capacity-blocks C     blocks each pod caches, LRU beyond (default 0: unbounded)\n"
           "  --policy P[,P...]|all   random, round-robin, least-loaded, session, prefix, cost\n"
           "                          (default all)\n"
           "  --seed S                random's generator and the scorer's tie-breaks (default 1)\n"
           "  --load-weight W         cost: the scorer's w_load (default 1.0)\n"
           "  --per-request FILE      write 'policy request pod hit blocks' lines to FILE\n"
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
    fprintf(stderr,
            "kvtier-bench: --policy must be 'all' or a comma list of random, round-robin, "
            "least-loaded, session, prefix, cost; got '%s'\n",
            list);
    return -1;
}

static void replay_json_result(const kvt_sim_policy_t pol, const kvt_sim_result_t *r, double ideal)
{
    printf("\"policy\":\"%s\",\"hit_ratio\":%.6f,\"ideal_hit_ratio\":%.6f,"
           "\"fraction_of_ideal\":%.4f,\"load_imbalance\":%.4f,\"routed_imbalance\":%.4f,"
           "\"hit_blocks\":%" PRIu64 ",\"total_blocks\":%" PRIu64 ",\"requests\":%" PRIu64
           ",\"evicted_blocks\":%" PRIu64 ",\"index_mismatch\":%" PRIu64,
           kvt_sim_policy_name(pol), r->hit_ratio, ideal, ideal > 0 ? r->hit_ratio / ideal : 0.0,
           r->load_imbalance, r->routed_imbalance, r->hit_blocks, r->total_blocks, r->requests,
           r->evicted, r->index_mismatch);
}

int kvt_bench_replay_main(int argc, char **argv)
{
    uint32_t mode = 0, pods = 8;
    uint64_t capacity = 0, seed = 1;
    double load_weight = 1.0;
    const char *trace_path = NULL, *policy = "all", *per_request = NULL;
    for (int i = 1; i < argc; i++) /* the timed mode has its own options */
        if (strcmp(argv[i], "--mode=timed") == 0 ||
            (strcmp(argv[i], "--mode") == 0 && i + 1 < argc && strcmp(argv[i + 1], "timed") == 0))
            return kvt_bench_replay_timed_main(argc, argv);
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_CHOICE("--mode", &mode, replay_modes),
        KVT_BENCH_ARG_STR("--trace", &trace_path),
        KVT_BENCH_ARG_U32("--pods", &pods, 1, 4096),
        KVT_BENCH_ARG_U64("--capacity-blocks", &capacity, 0, UINT32_MAX - 2u),
        KVT_BENCH_ARG_STR("--policy", &policy),
        KVT_BENCH_ARG_U64("--seed", &seed, 1, UINT64_MAX),
        KVT_BENCH_ARG_DOUBLE("--load-weight", &load_weight, 0.0, 1e9),
        KVT_BENCH_ARG_STR("--per-request", &per_request),
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
    kvt_trace_t *t = NULL;
    kvt_status_t st = kvt_trace_load(trace_path, &t, err, sizeof(err));
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: %s: %s\n", trace_path, err[0] ? err : kvt_status_str(st));
        return 1;
    }
    FILE *pf = NULL;
    if (per_request != NULL && (pf = fopen(per_request, "w")) == NULL) {
        perror(per_request);
        kvt_trace_free(t);
        return 1;
    }
    uint64_t ihit = 0, itotal = 0;
    if (kvt_sim_ideal(t, &ihit, &itotal) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto err_trace;
    }
    double ideal = itotal ? (double)ihit / (double)itotal : 0.0;

    kvt_sim_result_t res[KVT_SIM_NPOLICIES];
    memset(res, 0, sizeof(res));
    printf("replay --mode cache: %s, %zu requests, %" PRIu64 " blocks, %" PRIu32
           " pods, capacity %s%" PRIu64 " blocks per pod\n",
           trace_path, t->nreqs, itotal, pods, capacity ? "" : "unbounded ", capacity);
    printf("ideal (one pod, unbounded cache): %" PRIu64 " / %" PRIu64 " blocks hit = %.2f%%\n\n",
           ihit, itotal, 100.0 * ideal);
    printf("%-13s %9s %9s %10s %10s %12s %12s %10s\n", "policy", "hit %", "of ideal", "load imb",
           "routed imb", "hit blocks", "total", "evicted");
    for (size_t k = 0; k < npol; k++) {
        kvt_sim_config_t cfg = {
            .pods = pods,
            .capacity_blocks = capacity,
            .policy = pol[k],
            .seed = seed,
            .load_weight = load_weight,
            .sessions = NULL, /* the Mooncake reader carries no session ids yet */
        };
        st = kvt_sim_run(t, &cfg, &res[k], err, sizeof(err));
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
    printf("{\"bench\":\"replay\",\"mode\":\"cache\",\"pods\":%" PRIu32
           ",\"capacity_blocks\":%" PRIu64 ",",
           pods, capacity);
    if (npol == 1) {
        replay_json_result(pol[0], &res[0], ideal);
    } else {
        printf("\"ideal_hit_ratio\":%.6f,\"results\":[", ideal);
        for (size_t k = 0; k < npol; k++) {
            printf(k ? ",{" : "{");
            replay_json_result(pol[k], &res[k], ideal);
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
    kvt_trace_free(t);
    return rc;

err_res:
    for (size_t k = 0; k < npol; k++)
        kvt_sim_result_cleanup(&res[k]);
err_trace:
    if (pf != NULL)
        fclose(pf);
    kvt_trace_free(t);
    return 1;
}
