/*
 * kvtier-cuda-check: the HBM <-> arena path an engine's connector takes,
 * checked on this machine's GPU against a running kvtierd (issue 20).
 *
 * It attaches to kvtierd's arena over the Unix socket (libkvtier), registers
 * the mapping with CUDA (cudaHostRegister, in chunks: one registration of a
 * large arena can fail where pieces succeed), reserves N slots, copies a
 * device buffer of N blocks into them (one cudaMemcpyAsync per block, one
 * stream, one sync: what vLLM's swap_blocks does), commits, pins the same
 * keys, copies them back into a second device buffer, unpins, and compares
 * the two device buffers on the host. The yardstick, in the same run: the
 * same copies between device memory and cudaMallocHost'd memory.
 *
 * Exit 0: bytes equal, numbers printed (the last line JSON); 1: a failure;
 * 2: bad arguments; 77: no usable GPU here (no device or no driver).
 * Only the CUDA runtime API is used: the sidecar itself needs no CUDA.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "kvtier/client.h"

#define CHUNK_BYTES (1ull << 30) /* cudaHostRegister per GiB */

typedef struct opts {
    const char *socket, *model;
    uint32_t blocks, rounds;
} opts_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cuda_fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "kvtier-cuda-check: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: kvtier-cuda-check --socket PATH [--model M] [--blocks N] [--rounds R]\n"
                    "  PATH: a running kvtierd's --rpc-unix socket (it needs --ram-bytes)\n"
                    "  N: blocks copied each way (default 64, at most the arena's slots)\n"
                    "  R: timed rounds (default 5)\n"
                    "Exit 77 when no GPU is usable here.\n");
    return 2;
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.model = "kvtier-cuda-check", .blocks = 64, .rounds = 5};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return usage();
        if (v == NULL)
            return usage();
        if (strcmp(a, "--socket") == 0) {
            o->socket = v;
        } else if (strcmp(a, "--model") == 0) {
            o->model = v;
        } else if (strcmp(a, "--blocks") == 0 || strcmp(a, "--rounds") == 0) {
            unsigned long x = strtoul(v, &end, 10);
            if (end == v || *end != '\0' || x == 0 || x > 1000000) {
                fprintf(stderr, "kvtier-cuda-check: %s: 1..1000000, not '%s'\n", a, v);
                return 2;
            }
            *(a[2] == 'b' ? &o->blocks : &o->rounds) = (uint32_t)x;
        } else {
            fprintf(stderr, "kvtier-cuda-check: unknown option '%s'\n", a);
            return usage();
        }
    }
    return o->socket != NULL ? 0 : usage();
}

/* Registers [base, base + len) with CUDA in chunks; on failure unregisters what it did. */
static cudaError_t register_chunks(uint8_t *base, size_t len, size_t *done_p)
{
    size_t off = 0;
    cudaError_t e = cudaSuccess;
    for (; off < len && e == cudaSuccess; off += CHUNK_BYTES) {
        size_t n = len - off < CHUNK_BYTES ? len - off : CHUNK_BYTES;
        e = cudaHostRegister(base + off, n, cudaHostRegisterDefault);
    }
    if (e != cudaSuccess) {
        for (size_t u = 0; u + CHUNK_BYTES < off; u += CHUNK_BYTES)
            cudaHostUnregister(base + u);
        off = 0;
    }
    *done_p = off < len ? off : len;
    return e;
}

static void unregister_chunks(uint8_t *base, size_t len)
{
    for (size_t off = 0; off < len; off += CHUNK_BYTES)
        cudaHostUnregister(base + off);
}

/* @n copies of @bb bytes between @dev (packed) and the host blocks @host[i], one stream:
 * seconds taken, or -1. */
static double copy_blocks(uint8_t *dev, uint8_t *const *host, uint32_t n, size_t bb, bool to_dev,
                          cudaStream_t s)
{
    double t0 = now_s();
    for (uint32_t i = 0; i < n; i++) {
        cudaError_t e = to_dev
                            ? cudaMemcpyAsync(dev + i * bb, host[i], bb, cudaMemcpyHostToDevice, s)
                            : cudaMemcpyAsync(host[i], dev + i * bb, bb, cudaMemcpyDeviceToHost, s);
        if (e != cudaSuccess)
            return -1;
    }
    return cudaStreamSynchronize(s) == cudaSuccess ? now_s() - t0 : -1;
}

int main(int argc, char **argv)
{
    opts_t o;
    int pr = parse(argc, argv, &o);
    if (pr != 0)
        return pr;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "kvtier-cuda-check: SKIP: no usable GPU (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return 77;
    }

    char addr[512];
    snprintf(addr, sizeof(addr), "unix:%s", o.socket);
    kvt_client_opts_t co;
    kvt_client_opts_default(&co);
    co.address = addr;
    kvt_client_t *c = NULL;
    char err[256] = "";
    if (kvt_client_create_msg(&co, &c, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "kvtier-cuda-check: kvtierd at %s: %s\n", o.socket, err);
        return 1;
    }
    int rc = 1;
    kvt_client_arena_t a = {.fd = -1};
    uint8_t *dsrc = NULL, *ddst = NULL, *pinned = NULL, *hsrc = NULL, *hdst = NULL;
    uint8_t **slots = NULL, **pslots = NULL;
    uint64_t *keys = NULL;
    uint32_t *sl = NULL;
    kvt_client_pinned_t *pins = NULL;
    size_t reg = 0;
    cudaStream_t s = NULL;
    if (kvt_client_attach(c, &a) != KVT_OK) {
        fprintf(stderr, "kvtier-cuda-check: attach: %s\n", kvt_client_last_error(c));
        goto out;
    }
    uint32_t n = o.blocks;
    size_t bb = a.block_bytes, total = (size_t)n * bb;
    if (n > a.nslots) {
        fprintf(stderr, "kvtier-cuda-check: --blocks %u: the arena has %u slots\n", n, a.nslots);
        goto out;
    }
    if ((e = register_chunks(a.base, a.map_bytes, &reg)) != cudaSuccess) {
        cuda_fail("cudaHostRegister of the arena", e);
        goto out;
    }
    keys = calloc(n, sizeof(*keys));
    sl = calloc(n, sizeof(*sl));
    pins = calloc(n, sizeof(*pins));
    slots = calloc(n, sizeof(*slots));
    pslots = calloc(n, sizeof(*pslots));
    hsrc = malloc(total);
    hdst = malloc(total);
    if (!keys || !sl || !pins || !slots || !pslots || !hsrc || !hdst) {
        fprintf(stderr, "kvtier-cuda-check: out of memory\n");
        goto out;
    }
    if ((e = cudaMalloc((void **)&dsrc, total)) != cudaSuccess ||
        (e = cudaMalloc((void **)&ddst, total)) != cudaSuccess ||
        (e = cudaMallocHost((void **)&pinned, total)) != cudaSuccess ||
        (e = cudaStreamCreate(&s)) != cudaSuccess) {
        cuda_fail("device buffers", e);
        goto out;
    }
    uint64_t seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < total; i += 8) {
        seed += 0x9e3779b97f4a7c15ull;
        uint64_t v = seed ^ (seed >> 29);
        memcpy(hsrc + i, &v, total - i < 8 ? total - i : 8);
    }
    if ((e = cudaMemcpy(dsrc, hsrc, total, cudaMemcpyHostToDevice)) != cudaSuccess) {
        cuda_fail("filling the device buffer", e);
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        keys[i] = seed ^ (0x1000 + i);
        pslots[i] = pinned + (size_t)i * bb;
    }

    /* HBM -> arena: reserve, copy, commit; arena -> HBM: pin, copy, unpin; timed rounds */
    double t_store = 0, t_load = 0, t_pstore = 0, t_pload = 0;
    for (uint32_t r = 0; r <= o.rounds; r++) {
        for (uint32_t i = 0; i < n; i++)
            keys[i] += 0x10000; /* new keys each round: every store reserves */
        if (kvt_client_reserve(c, o.model, NULL, keys, n, sl, NULL, 0, NULL) != KVT_OK) {
            fprintf(stderr, "kvtier-cuda-check: reserve: %s\n", kvt_client_last_error(c));
            goto out;
        }
        for (uint32_t i = 0; i < n; i++) {
            if ((slots[i] = kvt_client_arena_slot(&a, sl[i])) == NULL) {
                fprintf(stderr, "kvtier-cuda-check: no slot for block %u\n", i);
                goto out;
            }
        }
        double ts = copy_blocks(dsrc, slots, n, bb, false, s);
        if (ts < 0 || kvt_client_commit(c, o.model, NULL, keys, n, NULL, true, NULL) != KVT_OK) {
            fprintf(stderr, "kvtier-cuda-check: store: %s\n",
                    ts < 0 ? "a device-to-arena copy failed" : kvt_client_last_error(c));
            goto out;
        }
        if (kvt_client_pin(c, o.model, NULL, keys, n, pins) != KVT_OK) {
            fprintf(stderr, "kvtier-cuda-check: pin: %s\n", kvt_client_last_error(c));
            goto out;
        }
        for (uint32_t i = 0; i < n; i++) {
            if ((slots[i] = kvt_client_arena_slot(&a, pins[i].slot)) == NULL || pins[i].len != bb) {
                fprintf(stderr, "kvtier-cuda-check: block %u not held after its commit\n", i);
                goto out;
            }
        }
        cudaMemset(ddst, 0, total);
        double tl = copy_blocks(ddst, slots, n, bb, true, s);
        if (tl < 0 || kvt_client_unpin(c, o.model, NULL, keys, n, NULL) != KVT_OK) {
            fprintf(stderr, "kvtier-cuda-check: load: %s\n",
                    tl < 0 ? "an arena-to-device copy failed" : kvt_client_last_error(c));
            goto out;
        }
        if ((e = cudaMemcpy(hdst, ddst, total, cudaMemcpyDeviceToHost)) != cudaSuccess) {
            cuda_fail("reading back", e);
            goto out;
        }
        if (memcmp(hsrc, hdst, total) != 0) {
            fprintf(stderr,
                    "kvtier-cuda-check: round %u: bytes differ after HBM -> arena -> "
                    "HBM\n",
                    r);
            goto out;
        }
        double tps = copy_blocks(dsrc, pslots, n, bb, false, s);
        double tpl = copy_blocks(ddst, pslots, n, bb, true, s);
        if (tps < 0 || tpl < 0) {
            fprintf(stderr, "kvtier-cuda-check: the cudaMallocHost yardstick failed\n");
            goto out;
        }
        if (r == 0)
            continue; /* warm-up */
        t_store += ts;
        t_load += tl;
        t_pstore += tps;
        t_pload += tpl;
    }
    double gb = (double)total * o.rounds / 1e9;
    printf("kvtier-cuda-check: %u blocks of %zu bytes, %u rounds, bytes equal every round\n", n, bb,
           o.rounds);
    printf("  HBM -> arena %.2f GB/s (pinned host %.2f: %.2f of it)\n", gb / t_store, gb / t_pstore,
           t_pstore / t_store);
    printf("  arena -> HBM %.2f GB/s (pinned host %.2f: %.2f of it)\n", gb / t_load, gb / t_pload,
           t_pload / t_load);
    printf("{\"bench\":\"cuda-check\",\"blocks\":%u,\"block_bytes\":%zu,\"rounds\":%u,"
           "\"d2h_gbps\":%.4f,\"d2h_pinned_gbps\":%.4f,\"h2d_gbps\":%.4f,"
           "\"h2d_pinned_gbps\":%.4f}\n",
           n, bb, o.rounds, gb / t_store, gb / t_pstore, gb / t_load, gb / t_pload);
    rc = 0;
out:
    if (s != NULL)
        cudaStreamDestroy(s);
    cudaFree(dsrc);
    cudaFree(ddst);
    cudaFreeHost(pinned);
    if (reg > 0)
        unregister_chunks(a.base, a.map_bytes);
    kvt_client_detach(&a);
    kvt_client_destroy(c);
    free(keys);
    free(sl);
    free(pins);
    free(slots);
    free(pslots);
    free(hsrc);
    free(hdst);
    return rc;
}
