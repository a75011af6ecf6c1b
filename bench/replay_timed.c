/*
 * `kvtier-bench replay --mode timed`: the trace in simulated time over pods
 * with GPU, CPU and DISK tiers, the policies side by side (bench/sim_timed.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/replay.h"
#include "bench/replay_plot.h"
#include "bench/sim.h"
#include "bench/sim_timed.h"
#include "bench/trace.h"

static const char *const timed_modes[] = {"cache", "timed", NULL};

static void timed_usage(void)
{
    kvt_sim_model_t m;
    kvt_sim_model_default(&m);
    printf("usage: kvtier-bench replay --mode timed --trace FILE [options]\n"
           "  --trace FILE            Mooncake JSONL trace (one hash id per block)\n"
           "  --pods N                simulated pods (default 8)\n"
           "  --policy P[,P...]|all   random, round-robin, least-loaded, session, prefix, cost,\n"
           "                          cost-tiers (default all)\n"
           "  --speedup X             arrivals at trace timestamp / X (default 1)\n"
           "  --capacity-blocks C     GPU blocks per pod when --gpu-blocks is not given\n"
           "  --gpu-blocks G          GPU tier per pod (default C; 0 and no C: unbounded)\n"
           "  --cpu-blocks B          CPU tier per pod (default 0: none)\n"
           "  --disk-blocks D         DISK tier per pod (default 0: none)\n"
           "  --routed-ttl-ms T       prefix/cost/cost-tiers record each decision as speculative\n"
           "                          index entries for T ms (default 2000; 0: off)\n"
           "  --load-weight W         cost, cost-tiers: w_load per block of queued prefill (1.0)\n"
           "  --prefill-us X          per uncached token (default %.1f)\n"
           "  --cpu-us X              per token loaded from CPU (default %.1f)\n"
           "  --disk-us X             per token loaded from DISK (default %.1f)\n"
           "  --decode-us X           per output token (default %.0f)\n"
           "  --batch-tokens N        tokens a prefill batch computes at most (default %" PRIu32
           ")\n"
           "  --seed S                random's generator and the scorer's tie-breaks (default 1)\n"
           "  --out DIR               write plots there as PNG (gnuplot): TTFT CDF, per-pod\n"
           "                          prefill busy time\n"
           "  --per-request FILE      'policy request pod hit blocks ttft_ms queue_ms' lines\n"
           "The last stdout line is one JSON object: the policy's figures, or with several\n"
           "policies a \"results\" array of them.\n",
           m.prefill_us_per_token, m.cpu_us_per_token, m.disk_us_per_token, m.decode_us_per_token,
           m.batch_tokens);
}

/* "all" or a comma list of policy names into @pol (room for KVT_SIM_NPOLICIES). */
static void timed_json(kvt_sim_policy_t pol, const kvt_sim_timed_result_t *r, double ideal)
{
    double tb = r->total_blocks ? (double)r->total_blocks : 1.0, busy = 0;
    for (uint32_t p = 0; p < r->pods; p++)
        busy += r->busy_us[p];
    printf("\"policy\":\"%s\",\"hit_ratio\":%.6f,\"ideal_hit_ratio\":%.6f,"
           "\"gpu_hit_ratio\":%.6f,\"cpu_hit_ratio\":%.6f,\"disk_hit_ratio\":%.6f,"
           "\"load_imbalance\":%.4f,\"prefill_utilization\":%.4f,\"hit_blocks\":%" PRIu64
           ",\"total_blocks\":%" PRIu64 ",\"prompt_tokens\":%" PRIu64 ",\"saved_tokens\":%" PRIu64
           ",\"ttft_p50_ms\":%.3f,\"ttft_p90_ms\":%.3f,\"ttft_p99_ms\":%.3f,"
           "\"ttft_mean_ms\":%.3f,\"queue_mean_ms\":%.3f,\"queue_p99_ms\":%.3f,"
           "\"requests\":%" PRIu64 ",\"batches\":%" PRIu64 ",\"speculated\":%" PRIu64
           ",\"gpu_over_blocks\":%" PRIu64 ",\"index_mismatch\":%" PRIu64,
           kvt_sim_policy_name(pol), r->hit_ratio, ideal, (double)r->hit_tier[0] / tb,
           (double)r->hit_tier[1] / tb, (double)r->hit_tier[2] / tb, r->load_imbalance,
           r->makespan_ms > 0 ? busy / 1000.0 / r->makespan_ms / r->pods : 0.0, r->hit_blocks,
           r->total_blocks, r->prompt_tokens, r->saved_tokens, r->ttft_p50_ms, r->ttft_p90_ms,
           r->ttft_p99_ms, r->ttft_mean_ms, r->queue_mean_ms, r->queue_p99_ms, r->requests,
           r->batches, r->speculated, r->gpu_over, r->index_mismatch);
}

static void timed_row(kvt_sim_policy_t pol, const kvt_sim_timed_result_t *r)
{
    double tb = r->total_blocks ? (double)r->total_blocks : 1.0;
    double pt = r->prompt_tokens ? (double)r->prompt_tokens : 1.0;
    printf("%-13s %6.2f%% %6.2f%% %6.2f%% %6.2f%% %7.2f%% %9.1f %9.1f %9.1f %9.1f %9.1f %8.3f\n",
           kvt_sim_policy_name(pol), 100.0 * r->hit_ratio, 100.0 * r->hit_tier[0] / tb,
           100.0 * r->hit_tier[1] / tb, 100.0 * r->hit_tier[2] / tb,
           100.0 * (double)r->saved_tokens / pt, r->ttft_p50_ms, r->ttft_p90_ms, r->ttft_p99_ms,
           r->queue_mean_ms, r->queue_p99_ms, r->load_imbalance);
}

/* --out: the TTFT CDF and each pod's prefill busy time, per policy. */
static int timed_plots(const char *dir, const kvt_sim_policy_t *pol, size_t npol,
                       const kvt_sim_timed_result_t *res, uint32_t pods)
{
    const char *labels[KVT_SIM_NPOLICIES];
    double *ttft[KVT_SIM_NPOLICIES], *busy[KVT_SIM_NPOLICIES];
    size_t n[KVT_SIM_NPOLICIES];
    char err[256] = "";
    int rc = -1;
    size_t nr = npol ? res[0].requests : 0;
    double *buf = calloc(npol * (nr + pods) + 1, sizeof(*buf));
    if (buf == NULL) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        return -1;
    }
    for (size_t k = 0; k < npol; k++) {
        labels[k] = kvt_sim_policy_name(pol[k]);
        ttft[k] = buf + k * (nr + pods);
        busy[k] = ttft[k] + nr;
        n[k] = nr;
        for (size_t i = 0; i < nr; i++)
            ttft[k][i] = res[k].req_ttft_us[i] / 1000.0;
        for (uint32_t p = 0; p < pods; p++)
            busy[k][p] = res[k].busy_us[p] / 1e6;
    }
    if (kvt_replay_plot_ttft(dir, labels, (const double *const *)ttft, n, npol, err, sizeof(err)) !=
            0 ||
        kvt_replay_plot_load(dir, labels, (const double *const *)busy, npol, pods,
                             "prefill busy time (s)", err, sizeof(err)) != 0)
        fprintf(stderr, "kvtier-bench: --out: %s\n", err);
    else
        rc = 0;
    if (rc == 0)
        fprintf(stderr, "plots: %s/ttft-cdf.png, %s/pod-load.png\n", dir, dir);
    free(buf);
    return rc;
}

int kvt_bench_replay_timed_main(int argc, char **argv)
{
    uint32_t mode = 1, pods = 8, ttl = 2000, batch;
    uint64_t capacity = 0, gpu = UINT64_MAX, cpu = 0, disk = 0, seed = 1;
    double load_weight = 1.0, speedup = 1.0;
    const char *trace_path = NULL, *policy = "all", *per_request = NULL, *out_dir = NULL;
    kvt_sim_model_t m;
    kvt_sim_model_default(&m);
    batch = m.batch_tokens;
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_CHOICE("--mode", &mode, timed_modes),
        KVT_BENCH_ARG_STR("--trace", &trace_path),
        KVT_BENCH_ARG_U32("--pods", &pods, 1, 4096),
        KVT_BENCH_ARG_STR("--policy", &policy),
        KVT_BENCH_ARG_DOUBLE("--speedup", &speedup, 1e-6, 1e9),
        KVT_BENCH_ARG_U64("--capacity-blocks", &capacity, 0, UINT32_MAX / 8),
        KVT_BENCH_ARG_U64("--gpu-blocks", &gpu, 0, UINT32_MAX / 8),
        KVT_BENCH_ARG_U64("--cpu-blocks", &cpu, 0, UINT32_MAX / 8),
        KVT_BENCH_ARG_U64("--disk-blocks", &disk, 0, UINT32_MAX / 8),
        KVT_BENCH_ARG_U32("--routed-ttl-ms", &ttl, 0, 3600000),
        KVT_BENCH_ARG_DOUBLE("--load-weight", &load_weight, 0.0, 1e9),
        KVT_BENCH_ARG_DOUBLE("--prefill-us", &m.prefill_us_per_token, 1e-6, 1e9),
        KVT_BENCH_ARG_DOUBLE("--cpu-us", &m.cpu_us_per_token, 0.0, 1e9),
        KVT_BENCH_ARG_DOUBLE("--disk-us", &m.disk_us_per_token, 0.0, 1e9),
        KVT_BENCH_ARG_DOUBLE("--decode-us", &m.decode_us_per_token, 0.0, 1e9),
        KVT_BENCH_ARG_U32("--batch-tokens", &batch, 1, UINT32_MAX),
        KVT_BENCH_ARG_U64("--seed", &seed, 1, UINT64_MAX),
        KVT_BENCH_ARG_STR("--per-request", &per_request),
        KVT_BENCH_ARG_STR("--out", &out_dir),
    };
    int pr = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (pr == 1) {
        timed_usage();
        return 0;
    }
    if (pr != 0)
        return 2;
    if (trace_path == NULL) {
        fprintf(stderr, "kvtier-bench: replay needs --trace FILE\n");
        return 2;
    }
    m.batch_tokens = batch;
    if (gpu == UINT64_MAX)
        gpu = capacity;
    kvt_sim_policy_t pol[KVT_SIM_NPOLICIES];
    size_t npol = 0;
    if (kvt_bench_replay_policies(policy, pol, &npol) != 0)
        return 2;

    char err[256] = "";
    kvt_replay_input_t in;
    kvt_status_t st;
    if (kvt_replay_input_load(&in, trace_path, seed) != 0)
        return 1;
    const kvt_trace_t *t = in.t;
    FILE *pf = NULL;
    if (per_request != NULL && (pf = fopen(per_request, "w")) == NULL) {
        perror(per_request);
        kvt_replay_input_free(&in);
        return 1;
    }
    uint64_t ihit = 0, itotal = 0;
    int rc = 1;
    kvt_sim_timed_result_t res[KVT_SIM_NPOLICIES];
    memset(res, 0, sizeof(res));
    if (kvt_sim_ideal(t, &ihit, &itotal) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto out;
    }
    double ideal = itotal ? (double)ihit / (double)itotal : 0.0;
    printf("replay --mode timed: %s, %zu requests, %" PRIu64 " blocks, %" PRIu32
           " pods, speedup %g, tiers per pod: gpu %" PRIu64 ", cpu %" PRIu64 ", disk %" PRIu64
           " blocks, routed ttl %" PRIu32 " ms\n",
           trace_path, t->nreqs, itotal, pods, speedup, gpu, cpu, disk, ttl);
    printf("model: prefill %g us/token, cpu load %g, disk load %g, decode %g us/token, batch "
           "%" PRIu32 " tokens, %" PRIu32 " tokens/block\n",
           m.prefill_us_per_token, m.cpu_us_per_token, m.disk_us_per_token, m.decode_us_per_token,
           m.batch_tokens, m.block_tokens);
    printf("ideal (one pod, unbounded cache): %.2f%% of blocks\n\n", 100.0 * ideal);
    printf("%-13s %7s %7s %7s %7s %8s %9s %9s %9s %9s %9s %8s\n", "policy", "hit", "gpu", "cpu",
           "disk", "saved", "ttft p50", "ttft p90", "ttft p99", "queue avg", "queue p99",
           "load imb");
    for (size_t k = 0; k < npol; k++) {
        kvt_sim_timed_config_t cfg = {
            .pods = pods,
            .gpu_blocks = gpu,
            .cpu_blocks = cpu,
            .disk_blocks = disk,
            .policy = pol[k],
            .seed = seed,
            .load_weight = load_weight,
            .speedup = speedup,
            .routed_ttl_ms = ttl,
            .model = m,
            .sessions = in.sessions,
        };
        st = kvt_sim_timed_run(t, &cfg, &res[k], err, sizeof(err));
        if (st != KVT_OK) {
            fprintf(stderr, "kvtier-bench: replay %s: %s\n", kvt_sim_policy_name(pol[k]), err);
            goto out;
        }
        timed_row(pol[k], &res[k]);
        if (res[k].index_mismatch != 0)
            fprintf(stderr,
                    "kvtier-bench: %s: the index disagreed with the model at %" PRIu64
                    " batch starts\n",
                    kvt_sim_policy_name(pol[k]), res[k].index_mismatch);
        for (size_t i = 0; pf != NULL && i < t->nreqs; i++)
            fprintf(pf, "%s %zu %" PRIu32 " %" PRIu32 " %" PRIu32 " %.3f %.3f\n",
                    kvt_sim_policy_name(pol[k]), i, res[k].req_pod[i], res[k].req_hit[i],
                    t->reqs[i].nblocks, res[k].req_ttft_us[i] / 1000.0,
                    res[k].req_queue_us[i] / 1000.0);
    }
    printf("hit: blocks found on the chosen pod, by tier; saved: prompt tokens not computed; "
           "ttft, queue in ms; load imb: max/mean prefill busy time\n");
    if (out_dir != NULL && timed_plots(out_dir, pol, npol, res, pods) != 0)
        goto out;
    printf("{\"bench\":\"replay\",\"mode\":\"timed\",\"pods\":%" PRIu32 ",\"speedup\":%g,"
           "\"gpu_blocks\":%" PRIu64 ",\"cpu_blocks\":%" PRIu64 ",\"disk_blocks\":%" PRIu64
           ",\"routed_ttl_ms\":%" PRIu32 ",",
           pods, speedup, gpu, cpu, disk, ttl);
    if (npol == 1) {
        timed_json(pol[0], &res[0], ideal);
    } else {
        printf("\"ideal_hit_ratio\":%.6f,\"results\":[", ideal);
        for (size_t k = 0; k < npol; k++) {
            printf(k ? ",{" : "{");
            timed_json(pol[k], &res[k], ideal);
            printf("}");
        }
        printf("]");
    }
    printf("}\n");
    rc = 0;
    for (size_t k = 0; k < npol; k++)
        if (res[k].index_mismatch != 0)
            rc = 1;

out:
    for (size_t k = 0; k < npol; k++)
        kvt_sim_timed_result_cleanup(&res[k]);
    if (pf != NULL && fclose(pf) != 0) {
        perror(per_request);
        rc = 1;
    }
    kvt_replay_input_free(&in);
    return rc;
}
