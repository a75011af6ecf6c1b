/*
 * `kvtier-bench connector`: what an engine's connector pays per scheduler
 * step to load a request's blocks from its sidecar (issue 20): one LOOKUP,
 * one PIN and one UNPIN of N blocks (one batched call each) on the Unix
 * socket, against a bare PING round trip on the same connection, measured
 * alternately in the same run. The engine side is simulated on host memory:
 * the blocks are stored first (RESERVE, copy, COMMIT), and each cycle also
 * copies the pinned slots into a host buffer standing in for HBM, timed
 * apart. Target: the cycle's three calls cost at most 4 pings (p50).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/clock.h"
#include "kvtier/client.h"

#define BC_MODEL "bench-connector"

static void bc_usage(void)
{
    printf("usage: kvtier-bench connector [options]\n"
           "  --blocks N         blocks per call (default 64)\n"
           "  --block-bytes B    bytes per block (default 262144)\n"
           "  --seconds S        measuring time (default 1)\n"
           "  --kvtierd PATH     the daemon (default: the one next to kvtier-bench)\n"
           "The last stdout line is JSON: {\"bench\":\"connector\", \"ping_p50_us\", "
           "\"cycle_p50_us\", \"ratio_p50\", ...}.\n");
}

static int bc_fail(kvt_client_t *c, const char *what)
{
    fprintf(stderr, "kvtier-bench: connector: %s: %s\n", what, kvt_client_last_error(c));
    return -1;
}

/* Stores @n blocks of @keys the way a connector's store does: RESERVE, write, COMMIT. */
static int bc_store(kvt_client_t *c, const kvt_client_arena_t *a, const uint64_t *keys, uint32_t n,
                    const uint8_t *hbm, size_t bb)
{
    uint32_t *slots = calloc(n, sizeof(*slots));
    int rc = slots == NULL ? -1 : 0;
    if (rc == 0 && kvt_client_reserve(c, BC_MODEL, NULL, keys, n, slots, NULL, 0, NULL) != KVT_OK)
        rc = bc_fail(c, "reserve");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        uint8_t *p = kvt_client_arena_slot(a, slots[i]);
        if (p == NULL) {
            fprintf(stderr, "kvtier-bench: connector: no slot for block %u\n", i);
            rc = -1;
        } else {
            memcpy(p, hbm + i * bb, bb);
        }
    }
    if (rc == 0 && kvt_client_commit(c, BC_MODEL, NULL, keys, n, NULL, true, NULL) != KVT_OK)
        rc = bc_fail(c, "commit");
    free(slots);
    return rc;
}

int kvt_bench_connector_main(int argc, char **argv)
{
    uint64_t blocks = 64, bb = 256 * 1024;
    double seconds = 1.0;
    const char *kvtierd = NULL;
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_U64("--blocks", &blocks, 1, 4096),
        KVT_BENCH_ARG_U64("--block-bytes", &bb, 4096, 64ull << 20),
        KVT_BENCH_ARG_DOUBLE("--seconds", &seconds, 0.01, 600),
        KVT_BENCH_ARG_STR("--kvtierd", &kvtierd),
    };
    int pr = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (pr == 1) {
        bc_usage();
        return 0;
    }
    if (pr != 0)
        return 2;
    if (kvtierd == NULL && (kvtierd = kvt_bench_default_kvtierd()) == NULL) {
        fprintf(stderr, "kvtier-bench: connector: no kvtierd next to kvtier-bench (--kvtierd)\n");
        return 2;
    }
    uint32_t n = (uint32_t)blocks;
    char ram[32], bbs[32], sock[128];
    snprintf(ram, sizeof(ram), "%" PRIu64, (blocks + 8) * bb);
    snprintf(bbs, sizeof(bbs), "%" PRIu64, bb);
    const char *dargs[] = {"--ram-bytes", ram, "--block-bytes", bbs, NULL};
    kvt_bench_daemon_t d = {.unix_sock = true};
    kvt_client_t *c = NULL;
    kvt_client_arena_t a = {.fd = -1};
    uint64_t *keys = calloc(n, sizeof(*keys)), *ping = NULL, *cyc = NULL, *cpy = NULL;
    uint8_t *hbm = malloc(n * bb), *loc = calloc(n, 1);
    kvt_client_pinned_t *pins = calloc(n, sizeof(*pins));
    size_t cap = 0, k = 0;
    int rc = 1;
    if (keys == NULL || hbm == NULL || loc == NULL || pins == NULL) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto out;
    }
    if (kvt_bench_daemon_start(kvtierd, dargs, &d) != 0)
        goto out;
    snprintf(sock, sizeof(sock), "%s/rpc.sock", d.dir);
    char addr[160];
    snprintf(addr, sizeof(addr), "unix:%s", sock);
    if ((c = kvt_bench_client(addr, 10000)) == NULL)
        goto out;
    if (kvt_client_attach(c, &a) != KVT_OK) {
        bc_fail(c, "attach");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        keys[i] = 0x6b7674696572ull + i;
    memset(hbm, 0x5a, n * bb);
    if (bc_store(c, &a, keys, n, hbm, bb) != 0)
        goto out;

    uint64_t until = kvt_clock_ns() + (uint64_t)(seconds * 1e9);
    for (int warm = 20; warm > 0 || kvt_clock_ns() < until || k < 20; warm--) {
        if (k == cap) {
            cap = cap ? cap * 2 : 4096;
            uint64_t *p1 = realloc(ping, cap * sizeof(*p1)), *p2 = realloc(cyc, cap * sizeof(*p2)),
                     *p3 = realloc(cpy, cap * sizeof(*p3));
            ping = p1 ? p1 : ping;
            cyc = p2 ? p2 : cyc;
            cpy = p3 ? p3 : cpy;
            if (!p1 || !p2 || !p3) {
                fprintf(stderr, "kvtier-bench: out of memory\n");
                goto out;
            }
        }
        uint64_t t0 = kvt_clock_ns();
        if (kvt_client_ping(c) != KVT_OK) {
            bc_fail(c, "ping");
            goto out;
        }
        uint64_t t1 = kvt_clock_ns();
        uint32_t hit = 0;
        if (kvt_client_lookup(c, BC_MODEL, NULL, keys, n, loc, &hit) != KVT_OK || hit != n) {
            fprintf(stderr, "kvtier-bench: connector: lookup found %u of %u\n", hit, n);
            goto out;
        }
        if (kvt_client_pin(c, BC_MODEL, NULL, keys, n, pins) != KVT_OK) {
            bc_fail(c, "pin");
            goto out;
        }
        uint64_t t2 = kvt_clock_ns();
        for (uint32_t i = 0; i < n; i++) {
            const uint8_t *p = kvt_client_arena_slot(&a, pins[i].slot);
            if (p == NULL) {
                fprintf(stderr, "kvtier-bench: connector: block %u not pinned\n", i);
                goto out;
            }
            memcpy(hbm + i * bb, p, pins[i].len);
        }
        uint64_t t3 = kvt_clock_ns();
        if (kvt_client_unpin(c, BC_MODEL, NULL, keys, n, NULL) != KVT_OK) {
            bc_fail(c, "unpin");
            goto out;
        }
        uint64_t t4 = kvt_clock_ns();
        if (warm > 0)
            continue;
        ping[k] = t1 - t0;
        cyc[k] = (t2 - t1) + (t4 - t3);
        cpy[k++] = t3 - t2;
    }
    kvt_bench_sort_u64(ping, k);
    kvt_bench_sort_u64(cyc, k);
    kvt_bench_sort_u64(cpy, k);
    double pp50 = kvt_bench_percentile(ping, k, 50) / 1e3,
           pp99 = kvt_bench_percentile(ping, k, 99) / 1e3;
    double cp50 = kvt_bench_percentile(cyc, k, 50) / 1e3,
           cp99 = kvt_bench_percentile(cyc, k, 99) / 1e3;
    double xp50 = kvt_bench_percentile(cpy, k, 50) / 1e3;
    printf("connector: %u blocks of %" PRIu64 " bytes, Unix socket, %zu cycles\n", n, bb, k);
    printf("  PING                        p50 %8.1f us  p99 %8.1f us\n", pp50, pp99);
    printf("  LOOKUP + PIN + UNPIN        p50 %8.1f us  p99 %8.1f us  = %.2f pings (target <= 4)\n",
           cp50, cp99, cp50 / pp50);
    printf("  copy of the pinned slots    p50 %8.1f us  (%.2f GB/s, not in the cycle)\n", xp50,
           (double)n * (double)bb / (xp50 * 1e3));
    printf("{\"bench\":\"connector\",\"blocks\":%u,\"block_bytes\":%" PRIu64 ",\"cycles\":%zu,"
           "\"ping_p50_us\":%.2f,\"ping_p99_us\":%.2f,\"cycle_p50_us\":%.2f,\"cycle_p99_us\":%.2f,"
           "\"ratio_p50\":%.3f,\"copy_p50_us\":%.2f}\n",
           n, bb, k, pp50, pp99, cp50, cp99, cp50 / pp50, xp50);
    rc = 0;
out:
    kvt_client_detach(&a);
    kvt_client_destroy(c);
    kvt_bench_daemon_stop(&d);
    free(keys);
    free(hbm);
    free(loc);
    free(pins);
    free(ping);
    free(cyc);
    free(cpy);
    return rc;
}
