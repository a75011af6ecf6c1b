/*
 * `kvtier-bench transfer --daemons`: the same points as the core's, through
 * two real kvtierd: per batch one TRANSFER call (pull) on the receiver, with
 * everything a user's call costs (the RPC, XFER_HELLO once, XFER_PIN, local
 * reservations, the UCX batch, the sums, the commit, XFER_RELEASE). Between
 * calls the receiver's copies are deleted (not timed), so every call moves
 * the bytes again.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_transfer.h"
#include "common/clock.h"
#include "kvtier/client.h"

#define XD_MODEL "bench"

static kvt_client_t *xd_client(uint16_t port)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)port);
    return kvt_bench_client(addr, 60000);
}

/* One point through the daemons: @pt's block size and batch; fills daemon_gbps and the
 * daemon latencies. 0, or -1 after a line. */
static int xd_point(kvt_client_t *ca, kvt_client_t *cb, uint16_t a_rpc, kvt_bench_xpoint_t *pt,
                    double seconds, uint64_t **lat, size_t *latcap)
{
    size_t n = pt->batch;
    uint64_t *keys = calloc(n, sizeof(*keys));
    uint64_t *out = calloc(3 * n, sizeof(*out));
    uint8_t *data = malloc(pt->block);
    int rc = -1;
    if (keys == NULL || out == NULL || data == NULL) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        keys[i] = pt->block * 1000 + pt->batch * 10000000 + i + 1;
        memset(data, (int)(keys[i] & 0xff), pt->block);
        if (kvt_client_block_put(ca, XD_MODEL, NULL, keys[i], data, pt->block, false) != KVT_OK) {
            fprintf(stderr, "kvtier-bench: block put: %s\n", kvt_client_last_error(ca));
            goto out;
        }
    }
    char peer[64];
    snprintf(peer, sizeof(peer), "127.0.0.1:%u", (unsigned)a_rpc);
    kvt_client_transfer_t t = {
        .peer = peer, .model = XD_MODEL, .keys = keys, .n = n, .timeout_ms = 60000};
    size_t k = 0;
    uint64_t busy = 0, until = kvt_clock_ns() + (uint64_t)(seconds * 1e9);
    for (int warm = 1; k < 3 || kvt_clock_ns() < until; warm = 0) {
        kvt_client_transfer_out_t o = {
            .transferred = out, .missing = out + n, .failed = out + 2 * n};
        uint64_t s = kvt_clock_ns();
        if (kvt_client_transfer(cb, &t, &o) != KVT_OK) {
            fprintf(stderr, "kvtier-bench: transfer: %s\n", kvt_client_last_error(cb));
            goto out;
        }
        uint64_t e = kvt_clock_ns();
        if (o.ntransferred != n || o.bytes != n * pt->block) {
            fprintf(stderr,
                    "kvtier-bench: transfer moved %zu of %zu blocks (%" PRIu64
                    " bytes; %zu missing, %zu failed)\n",
                    o.ntransferred, n, o.bytes, o.nmissing, o.nfailed);
            goto out;
        }
        for (size_t i = 0; i < n; i++) /* the next call moves them again */
            if (kvt_client_block_delete(cb, XD_MODEL, NULL, keys[i]) != KVT_OK) {
                fprintf(stderr, "kvtier-bench: block delete: %s\n", kvt_client_last_error(cb));
                goto out;
            }
        if (warm) /* the first call makes the handshake: not counted */
            continue;
        if (k == *latcap) {
            size_t cap = *latcap ? *latcap * 2 : 1024;
            uint64_t *v = realloc(*lat, cap * sizeof(*v));
            if (v == NULL)
                goto out;
            *lat = v;
            *latcap = cap;
        }
        (*lat)[k++] = e - s;
        busy += e - s;
    }
    kvt_bench_sort_u64(*lat, k);
    pt->daemon_gbps = (double)(k * n * pt->block) / ((double)busy / 1e9) / 1e9;
    pt->daemon_p50_us = kvt_bench_percentile(*lat, k, 50) / 1000.0;
    pt->daemon_p99_us = kvt_bench_percentile(*lat, k, 99) / 1000.0;
    rc = 0;
out:
    for (size_t i = 0; keys != NULL && i < n; i++) /* room for the next point */
        kvt_client_block_delete(ca, XD_MODEL, NULL, keys[i]);
    free(keys);
    free(out);
    free(data);
    return rc;
}

int kvt_bench_transfer_daemons(const char *kvtierd, const char *tls, kvt_bench_xpoint_t *pts,
                               size_t npts, double seconds)
{
    if (kvtierd == NULL && (kvtierd = kvt_bench_default_kvtierd()) == NULL) {
        fprintf(stderr, "kvtier-bench: --daemons: no kvtierd next to kvtier-bench (--kvtierd)\n");
        return -1;
    }
    /* the daemons inherit it; shm: each daemon has a Unix socket and maps the other's arena */
    bool shm = strcmp(tls, "shm") == 0;
    setenv("UCX_TLS", shm ? "tcp" : tls, 1);
    uint64_t *lat = NULL;
    size_t latcap = 0;
    int rc = 0;
    /* one pair of daemons per block size: --block-bytes is the daemon's */
    for (size_t i = 0; i < npts && rc == 0;) {
        uint64_t block = pts[i].block, maxb = 0;
        size_t j = i;
        for (; j < npts && pts[j].block == block; j++)
            maxb = pts[j].batch > maxb ? pts[j].batch : maxb;
        char ram[32], bb[32], frame[32];
        snprintf(ram, sizeof(ram), "%" PRIu64, (maxb + 4) * block);
        snprintf(bb, sizeof(bb), "%" PRIu64, block);
        snprintf(frame, sizeof(frame), "%" PRIu64, block + 65536); /* a whole block's PUT */
        const char *args[] = {"--ram-bytes", ram, "--block-bytes", bb, "--rpc-max-frame",
                              frame,         NULL};
        kvt_bench_daemon_t a = {.unix_sock = shm}, b = {.unix_sock = shm};
        kvt_client_t *ca = NULL, *cb = NULL;
        if (kvt_bench_daemon_start(kvtierd, args, &a) != 0 ||
            kvt_bench_daemon_start(kvtierd, args, &b) != 0 || (ca = xd_client(a.rpc)) == NULL ||
            (cb = xd_client(b.rpc)) == NULL) {
            rc = -1;
        } else {
            for (size_t k = i; k < j && rc == 0; k++)
                rc = xd_point(ca, cb, a.rpc, &pts[k], seconds, &lat, &latcap);
        }
        kvt_client_destroy(ca);
        kvt_client_destroy(cb);
        kvt_bench_daemon_stop(&a);
        kvt_bench_daemon_stop(&b);
        i = j;
    }
    free(lat);
    return rc;
}
