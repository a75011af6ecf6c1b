/*
 * `kvtier-bench transfer`: the transfer component's pull (UCX get) bandwidth
 * between two processes on this machine, against ucx_perftest's ucp_get over
 * the same transport in the same run (issue 19).
 *
 * The far side is this binary again ("transfer --serve", exec'd after fork so
 * that UCX starts clean in it): it registers a region, sends its worker
 * address, rkey and region over a socketpair, and drives its worker until
 * told to stop. This side pulls batches of B blocks of S bytes (distinct
 * offsets, one batch in flight, the way a transfer of B keys runs) for
 * --seconds per point and reports GB/s and the batch latency percentiles.
 * It measures transfer/ alone: the daemons' handshake and pin frames are
 * not in it. With --tls shm the far side's region is a sealed memfd passed
 * over the socketpair and this side opens a mapped peer on it (kvtierd's
 * same-host path); the yardstick is then ucx_perftest on UCX_TLS=sm.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_transfer.h"
#include "common/clock.h"
#include "common/fdpass.h"
#include "transfer/transfer.h"

#define XB_MAX_POINTS 16
#define XB_MIB (1024ull * 1024ull)

typedef struct xb_hello {
    uint64_t addr_len, rkey_len, base, len;
} xb_hello_t;

typedef kvt_bench_xpoint_t xb_point_t;

static void *xb_map(uint64_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    memset(p, 0xa5, len); /* fault every page in before anything is timed */
    return p;
}

/* --tls shm: kvtierd's same-host path, the far side's region (a sealed memfd, as kvtierd's
 * arena) mapped here and copied; no UCX transport moves the bytes (contexts on tcp). */
#define XB_SHM "shm"
#define XB_SHM_PERFTEST "sm" /* the yardstick's UCX_TLS for it: UCX's shared-memory transports */

/* A region in a memfd sealed against shrinking, faulted in; its fd in *@fd_p. */
static void *xb_map_memfd(uint64_t len, int *fd_p)
{
    int fd = memfd_create("kvtier-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    memset(p, 0xa5, len);
    *fd_p = fd;
    return p;
}

/* One byte with @fd beside it (SCM_RIGHTS), or, with @fd_p, one received: 0 or -1. */
static int xb_pass_fd(int sock, int fd, int *fd_p)
{
    char one = 'F';
    if (fd_p != NULL) {
        *fd_p = -1;
        return kvt_fd_recv(sock, &one, 1, 0, fd_p) == 1 && *fd_p >= 0 ? 0 : -1;
    }
    return kvt_fd_send(sock, &one, 1, 0, fd) == 1 ? 0 : -1;
}

/* The far side: "transfer --serve FD TLS BYTES". Runs until its socket closes. */
static int xb_serve(int sock, const char *tls, uint64_t len)
{
    char err[256] = "";
    bool shm = strcmp(tls, XB_SHM) == 0;
    kvt_xfer_opts_t o = {.tls = shm ? "tcp" : tls};
    kvt_xfer_t *x = NULL;
    int mfd = -1;
    uint8_t *base = shm ? xb_map_memfd(len, &mfd) : xb_map(len);
    if (base == NULL || kvt_xfer_create(&o, &x, err, sizeof(err)) != KVT_OK ||
        kvt_xfer_register(x, base, len, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "kvtier-bench transfer (server): %s\n", err[0] ? err : "out of memory");
        return 1;
    }
    size_t alen, rlen;
    const void *addr = kvt_xfer_worker_address(x, &alen);
    const void *rkey = kvt_xfer_rkey(x, &rlen);
    xb_hello_t h = {alen, rlen, (uint64_t)(uintptr_t)base, len};
    if (kvt_bench_write_all(sock, &h, sizeof(h)) != 0 ||
        kvt_bench_write_all(sock, addr, alen) != 0 || kvt_bench_write_all(sock, rkey, rlen) != 0 ||
        (shm && xb_pass_fd(sock, mfd, NULL) != 0))
        return 1;
    for (;;) {
        while (kvt_xfer_progress(x) != 0) {
        }
        int efd = kvt_xfer_efd(x);
        bool armed = efd >= 0 && kvt_xfer_arm(x);
        if (efd >= 0 && !armed)
            continue;
        struct pollfd pf[2] = {{.fd = sock, .events = POLLIN}, {.fd = efd, .events = POLLIN}};
        if (poll(pf, armed ? 2 : 1, armed ? 1000 : 1) > 0 && pf[0].revents != 0)
            break; /* the client closed its end (or wrote): done */
    }
    kvt_xfer_destroy(x);
    munmap(base, len);
    if (mfd >= 0)
        close(mfd);
    return 0;
}

/* A free TCP port on 127.0.0.1 for ucx_perftest's rendezvous (released before use). */
static unsigned xb_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    unsigned port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/*
 * ucx_perftest's ucp_get bandwidth (GB/s) for @size bytes on @tls with
 * @window gets outstanding (-O: a batch's blocks are in flight together),
 * or -1: its server in the background, its client in the foreground, the
 * "Final:" line's overall bandwidth (MB/s of 2^20 bytes).
 */
static double xb_perftest(const char *perftest, const char *tls, uint64_t size, uint64_t window,
                          uint64_t iters)
{
    unsigned port = xb_free_port();
    if (port == 0)
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "UCX_TLS=%s timeout 60 %s -p %u >/dev/null 2>&1 & srv=$!; sleep 0.5; "
             "UCX_TLS=%s timeout 60 %s 127.0.0.1 -p %u -t ucp_get -s %" PRIu64 " -O %" PRIu64
             " -n %" PRIu64 " -w %" PRIu64 " 2>/dev/null | grep '^Final:'; wait $srv",
             tls, perftest, port, tls, perftest, port, size, window, iters, iters / 10 + 1);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    char line[512];
    double bw = -1;
    while (fgets(line, sizeof(line), p) != NULL) {
        double v[7];
        if (sscanf(line, "Final: %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4],
                   &v[5], &v[6]) == 7)
            bw = v[5] * (double)XB_MIB / 1e9;
    }
    pclose(p);
    return bw;
}

typedef struct xb_done {
    int calls;
    kvt_status_t st;
} xb_done_t;

static void xb_on_done(void *arg, kvt_status_t st)
{
    xb_done_t *d = arg;
    d->calls++;
    d->st = st;
}

/* Drives @x until @d is called back; false on a 60 s stall. */
static bool xb_wait(kvt_xfer_t *x, xb_done_t *d)
{
    uint64_t limit = kvt_clock_ns() + 60ull * 1000000000ull;
    while (d->calls == 0) {
        if (kvt_clock_ns() > limit)
            return false;
        kvt_xfer_progress(x); /* spin: the latency is what is measured */
    }
    return true;
}

/* One point: batches of @batch blocks of @block bytes for @seconds. 0, or -1 after a line. */
static int xb_point(kvt_xfer_t *x, kvt_xfer_peer_t *peer, uint8_t *local, xb_point_t *pt,
                    double seconds, uint64_t **lat, size_t *latcap)
{
    kvt_xfer_iov_t *iov = calloc(pt->batch, sizeof(*iov));
    kvt_status_t *status = calloc(pt->batch, sizeof(*status));
    if (iov == NULL || status == NULL) {
        free(iov);
        free(status);
        fprintf(stderr, "kvtier-bench: out of memory\n");
        return -1;
    }
    for (uint64_t i = 0; i < pt->batch; i++)
        iov[i] = (kvt_xfer_iov_t){i * pt->block, local + i * pt->block, pt->block};
    char err[256] = "";
    size_t n = 0;
    uint64_t t0 = kvt_clock_ns(), until = t0 + (uint64_t)(seconds * 1e9), warm = 2;
    int rc = 0;
    while (n < 5 || kvt_clock_ns() < until) {
        xb_done_t d = {0};
        uint64_t s = kvt_clock_ns();
        if (kvt_xfer_submit(peer, KVT_XFER_GET, iov, (uint32_t)pt->batch, status, 0, xb_on_done, &d,
                            err, sizeof(err)) != KVT_OK ||
            !xb_wait(x, &d) || d.st != KVT_OK) {
            fprintf(stderr, "kvtier-bench: transfer: %s\n",
                    err[0]    ? err
                    : d.calls ? kvt_status_str(d.st)
                              : "stalled");
            rc = -1;
            break;
        }
        uint64_t e = kvt_clock_ns();
        if (warm > 0) { /* the first batches set up UCX's lanes: not counted */
            warm--;
            t0 = e;
            until = t0 + (uint64_t)(seconds * 1e9);
            continue;
        }
        if (n == *latcap) {
            size_t cap = *latcap ? *latcap * 2 : 1024;
            uint64_t *v = realloc(*lat, cap * sizeof(*v));
            if (v == NULL) {
                rc = -1;
                break;
            }
            *lat = v;
            *latcap = cap;
        }
        (*lat)[n++] = e - s;
    }
    if (rc == 0) {
        double secs = (double)(kvt_clock_ns() - t0) / 1e9;
        kvt_bench_sort_u64(*lat, n);
        pt->batches = n;
        pt->gbps = (double)(n * pt->batch * pt->block) / secs / 1e9;
        pt->p50_us = kvt_bench_percentile(*lat, n, 50) / 1000.0;
        pt->p99_us = kvt_bench_percentile(*lat, n, 99) / 1000.0;
    }
    free(iov);
    free(status);
    return rc;
}

/* The in-process bound of --tls shm: memcpy() of the point's blocks from @far to @local, batch
 * after batch, for @seconds: GB/s. */
static double xb_memcpy(const uint8_t *far, uint8_t *local, const xb_point_t *pt, double seconds)
{
    uint64_t n = 0, t0 = kvt_clock_ns(), until = t0 + (uint64_t)(seconds * 1e9);
    while (n < 7 || kvt_clock_ns() < until) {
        for (uint64_t i = 0; i < pt->batch; i++)
            memcpy(local + i * pt->block, far + i * pt->block, pt->block);
        if (++n == 2)
            t0 = kvt_clock_ns(); /* two warm-up batches, as for the measured path */
    }
    return (double)((n - 2) * pt->batch * pt->block) / ((double)(kvt_clock_ns() - t0) / 1e9) / 1e9;
}

/* "64K,1M,16M" or "1,8,32" into @v (at most XB_MAX_POINTS values, each >= 1). */
static int xb_list(const char *name, const char *s, uint64_t *v, size_t *n_p)
{
    size_t n = 0;
    const char *p = s;
    while (*p != '\0') {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(p, &end, 10);
        if (end == p || errno != 0 || x == 0 || n == XB_MAX_POINTS)
            goto bad;
        if (*end == 'K' || *end == 'M') {
            x <<= *end == 'K' ? 10 : 20;
            end++;
        }
        v[n++] = x;
        if (*end == ',' && end[1] != '\0')
            end++;
        else if (*end != '\0')
            goto bad;
        p = end;
    }
    if (n == 0)
        goto bad;
    *n_p = n;
    return 0;
bad:
    fprintf(stderr,
            "kvtier-bench: %s: a comma list of at most %d positive integers (K and M suffixes for "
            "sizes); got '%s'\n",
            name, XB_MAX_POINTS, s);
    return -1;
}

static void xb_usage(void)
{
    printf(
        "usage: kvtier-bench transfer [options]\n"
        "  --tls T                 UCX transports, as UCX_TLS (default tcp), or shm: kvtierd's\n"
        "                          same-host path (the peer's arena mapped and copied), against\n"
        "                          ucx_perftest on UCX_TLS=sm\n"
        "  --sizes LIST            block sizes (default 64K,256K,1M,4M,16M)\n"
        "  --batches LIST          blocks per batch (default 1,8,32)\n"
        "  --seconds S             per point (default 1)\n"
        "  --region-mib M          each side's registered region (default 512): a point\n"
        "                          whose batch does not fit is skipped\n"
        "  --perftest PATH|none    ucx_perftest (default: ucx_perftest on PATH)\n"
        "The last stdout line is one JSON object: {\"transport\", \"results\": [{\"block_bytes\",\n"
        "\"batch\", \"gbps\", \"perftest_gbps\", \"ratio\", \"p50_us\", \"p99_us\"}]}.\n");
}

int kvt_bench_transfer_main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--serve") == 0)
        return xb_serve(atoi(argv[2]), argv[3], strtoull(argv[4], NULL, 10));
    const char *tls = "tcp", *sizes = "64K,256K,1M,4M,16M", *batches = "1,8,32";
    const char *perftest = "ucx_perftest", *kvtierd = NULL;
    bool daemons = false;
    double seconds = 1.0;
    uint64_t region_mib = 512;
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_STR("--tls", &tls),
        KVT_BENCH_ARG_STR("--sizes", &sizes),
        KVT_BENCH_ARG_STR("--batches", &batches),
        KVT_BENCH_ARG_DOUBLE("--seconds", &seconds, 0.01, 600),
        KVT_BENCH_ARG_U64("--region-mib", &region_mib, 1, 65536),
        KVT_BENCH_ARG_STR("--perftest", &perftest),
        KVT_BENCH_ARG_FLAG("--daemons", &daemons),
        KVT_BENCH_ARG_STR("--kvtierd", &kvtierd),
    };
    int pr = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (pr == 1) {
        xb_usage();
        return 0;
    }
    uint64_t sz[XB_MAX_POINTS], bt[XB_MAX_POINTS];
    size_t nsz = 0, nbt = 0;
    if (pr != 0 || xb_list("--sizes", sizes, sz, &nsz) != 0 ||
        xb_list("--batches", batches, bt, &nbt) != 0)
        return 2;
    if (strpbrk(tls, " '\"\\$`;&|") != NULL) {
        fprintf(stderr, "kvtier-bench: --tls: transport names and commas only\n");
        return 2;
    }
    uint64_t region = region_mib * XB_MIB;

    /* the far side */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        int fd = dup(sv[1]); /* without CLOEXEC */
        char fds[16], lens[32];
        snprintf(fds, sizeof(fds), "%d", fd);
        snprintf(lens, sizeof(lens), "%" PRIu64, region);
        execl("/proc/self/exe", "kvtier-bench", "transfer", "--serve", fds, tls, lens,
              (char *)NULL);
        _exit(127);
    }
    close(sv[1]);

    int rc = 1;
    char err[256] = "";
    kvt_xfer_t *x = NULL;
    kvt_xfer_peer_t *peer = NULL;
    uint64_t *lat = NULL;
    size_t latcap = 0, npts = 0;
    xb_point_t pts[XB_MAX_POINTS * XB_MAX_POINTS];
    uint8_t *local = xb_map(region);
    bool shm = strcmp(tls, XB_SHM) == 0;
    void *far = NULL; /* --tls shm: the far side's region, mapped here */
    kvt_xfer_opts_t o = {.tls = shm ? "tcp" : tls};
    xb_hello_t h;
    void *addr = NULL, *rkey = NULL;
    if (local == NULL || kvt_xfer_create(&o, &x, err, sizeof(err)) != KVT_OK ||
        kvt_xfer_register(x, local, region, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: transfer on %s: %s\n", tls, err[0] ? err : "out of memory");
        goto out;
    }
    if (kvt_bench_read_all(sv[0], &h, sizeof(h)) != 0 || h.addr_len == 0 || h.addr_len > 65536 ||
        h.rkey_len == 0 || h.rkey_len > 65536 || (addr = malloc(h.addr_len)) == NULL ||
        (rkey = malloc(h.rkey_len)) == NULL || kvt_bench_read_all(sv[0], addr, h.addr_len) != 0 ||
        kvt_bench_read_all(sv[0], rkey, h.rkey_len) != 0) {
        fprintf(stderr, "kvtier-bench: transfer: the server process did not start on %s\n", tls);
        goto out;
    }
    kvt_xfer_peer_info_t info = {addr, h.addr_len, rkey, h.rkey_len, h.base, h.len, 1, NULL};
    int mfd = -1;
    if (shm) {
        if (xb_pass_fd(sv[0], -1, &mfd) != 0 ||
            (far = mmap(NULL, h.len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0)) == MAP_FAILED) {
            far = NULL;
            fprintf(stderr, "kvtier-bench: transfer: the server's region could not be mapped\n");
            if (mfd >= 0)
                close(mfd);
            goto out;
        }
        close(mfd);
        info.map = far;
    }
    if (kvt_xfer_peer_open(x, &info, &peer, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: transfer on %s: %s\n", tls, err);
        goto out;
    }
    const char *ptls = shm ? XB_SHM_PERFTEST : tls;
    if (shm)
        printf("transfer: the same-host path (a second process's sealed memfd mapped here, "
               "copied), %.2f s a point; yardstick: %s ucp_get on UCX_TLS=%s\n\n",
               seconds, strcmp(perftest, "none") == 0 ? "no" : perftest, ptls);
    else
        printf("transfer: UCX_TLS=%s, pulls (ucp_get) from a second process, %.2f s a point; "
               "yardstick: %s ucp_get\n\n",
               tls, seconds, strcmp(perftest, "none") == 0 ? "no" : perftest);
    printf("%10s %6s %9s %13s %7s %10s %10s %8s%s\n", "block", "batch", "GB/s", "perftest GB/s",
           "ratio", "p50 us", "p99 us", "batches", shm ? " memcpy GB/s  of memcpy" : "");
    for (size_t i = 0; i < nsz; i++) {
        for (size_t j = 0; j < nbt; j++) {
            if (sz[i] * bt[j] > region || sz[i] * bt[j] > h.len)
                continue;
            /* the yardstick: enough gets for about --seconds at tcp's speed, as many in
             * flight as the batch has */
            uint64_t iters = (uint64_t)(seconds * 2e9 / (double)sz[i]) + 100;
            double perf = strcmp(perftest, "none") == 0
                              ? -1
                              : xb_perftest(perftest, ptls, sz[i], bt[j], iters);
            xb_point_t *pt = &pts[npts];
            *pt = (xb_point_t){
                .block = sz[i], .batch = bt[j], .perftest_gbps = perf, .memcpy_gbps = -1};
            if (xb_point(x, peer, local, pt, seconds, &lat, &latcap) != 0)
                goto out;
            if (shm)
                pt->memcpy_gbps = xb_memcpy(far, local, pt, seconds);
            npts++;
            char ratio[16] = "-";
            if (pt->perftest_gbps > 0)
                snprintf(ratio, sizeof(ratio), "%.2f", pt->gbps / pt->perftest_gbps);
            printf("%10" PRIu64 " %6" PRIu64 " %9.2f %13.2f %7s %10.1f %10.1f %8" PRIu64, pt->block,
                   pt->batch, pt->gbps, pt->perftest_gbps, ratio, pt->p50_us, pt->p99_us,
                   pt->batches);
            if (shm)
                printf(" %11.2f %10.2f", pt->memcpy_gbps, pt->gbps / pt->memcpy_gbps);
            printf("\n");
            fflush(stdout);
        }
    }
    printf("ratio: kvtier's GB/s over ucx_perftest's ucp_get at the same block size with the "
           "batch's blocks outstanding (-O)\n");
    if (shm)
        printf("memcpy: one thread copying the same batch of distinct blocks in this process; "
               "perftest's outstanding gets reuse one buffer, which stays in cache\n");
    if (daemons) {
        /* the same points through two kvtierd, after the core's (one at a time on 2 cores) */
        kvt_xfer_peer_close(peer);
        peer = NULL;
        if (kvt_bench_transfer_daemons(kvtierd, tls, pts, npts, seconds) != 0)
            goto out;
        printf("\nthrough two kvtierd: one TRANSFER (pull) per batch\n");
        printf("%10s %6s %9s %9s %10s %10s\n", "block", "batch", "GB/s", "of core", "p50 us",
               "p99 us");
        for (size_t k = 0; k < npts; k++)
            printf("%10" PRIu64 " %6" PRIu64 " %9.2f %9.2f %10.1f %10.1f\n", pts[k].block,
                   pts[k].batch, pts[k].daemon_gbps,
                   pts[k].gbps > 0 ? pts[k].daemon_gbps / pts[k].gbps : 0.0, pts[k].daemon_p50_us,
                   pts[k].daemon_p99_us);
    }
    printf("{\"bench\":\"transfer\",\"transport\":\"%s\",\"results\":[", tls);
    for (size_t k = 0; k < npts; k++) {
        printf("%s{\"block_bytes\":%" PRIu64 ",\"batch\":%" PRIu64
               ",\"gbps\":%.4f,\"perftest_gbps\":%.4f,\"ratio\":%.4f,\"p50_us\":%.1f,"
               "\"p99_us\":%.1f",
               k ? "," : "", pts[k].block, pts[k].batch, pts[k].gbps, pts[k].perftest_gbps,
               pts[k].perftest_gbps > 0 ? pts[k].gbps / pts[k].perftest_gbps : -1.0, pts[k].p50_us,
               pts[k].p99_us);
        if (shm)
            printf(",\"memcpy_gbps\":%.4f", pts[k].memcpy_gbps);
        if (daemons)
            printf(",\"daemon_gbps\":%.4f,\"daemon_p50_us\":%.1f,\"daemon_p99_us\":%.1f",
                   pts[k].daemon_gbps, pts[k].daemon_p50_us, pts[k].daemon_p99_us);
        printf("}");
    }
    printf("]}\n");
    rc = 0;

out:
    kvt_xfer_peer_close(peer);
    kvt_xfer_destroy(x);
    close(sv[0]); /* the server sees its socket close and exits */
    int wst;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    free(addr);
    free(rkey);
    free(lat);
    if (local != NULL)
        munmap(local, region);
    if (far != NULL)
        munmap(far, h.len);
    return rc;
}
