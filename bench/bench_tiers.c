/*
 * `kvtier-bench tiers`: the tier (tiers/tiers.h) against its yardsticks, in
 * one run (the targets of docs/cli.md):
 *  1. RAM: N non-durable puts of B-byte blocks into a RAM-only tier (a memfd
 *     arena of N slots), then N gets copying the bytes out, against memcpy()
 *     of the same N x B bytes between two buffers of the same size; rounds
 *     alternate the three, the best of each counts.
 *  2. NVMe: N durable puts kept Q in flight through a RAM of 2 x Q slots, so
 *     the bytes stream to the store; the tier reopened (RAM empty); N gets
 *     kept Q in flight. Against fio (io_uring, O_DIRECT) on a file of the
 *     same size in the same directory, same block size and queue depth:
 *     writes with --sync=dsync (the tier's writes are RWF_DSYNC: like for
 *     like), writes without (for information), reads. Rounds alternate the
 *     tier and fio (a shared device's noise hits both alike); the best of
 *     each counts.
 *  3. Restore: M block records written straight into a data dir through the
 *     metadata module, then kvt_tier_open() on them (it rebuilds the store),
 *     against a bare RocksDB iteration over the same database (compacted
 *     first, as a store that has run a while is); best of the rounds.
 *  4. Reload: for blocks of 256 KiB .. 4 MiB, a few durable puts, the tier
 *     reopened, and the time of each get: NVMe read, checksum, promotion.
 *
 * Every file lives in a temp dir of the bench's own under --dir, removed at
 * the end, also when a phase fails.
 *
 * The restore and reload phases are in bench_tiers_restore.c; bench_tiers_int.h is what
 * the two files share.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <linux/magic.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_tiers_int.h"
#include "common/clock.h"
#include "common/errtext.h"
#include "common/log.h"
#include "tiers/tiers.h"
#include "tiers/tiers_test.h"

extern char **environ;

#define BT_MAX_BYTES (1ull << 30) /* any one buffer or arena, at most */

static void bt_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier-bench tiers [--dir D] [--block-bytes B] [--blocks N] [--depth Q]\n"
            "                          [--restore-blocks M] [--fio PATH] [--quick]\n"
            "\n"
            "Measures the tier against its yardsticks in one run: RAM puts and gets of N\n"
            "B-byte blocks against memcpy; durable puts and gets through NVMe, Q in flight,\n"
            "against fio (io_uring, O_DIRECT; writes with --sync=dsync) on a file of the same\n"
            "size; the restore of M block records at open against a bare RocksDB iteration;\n"
            "the time to reload one block from NVMe for blocks of 256 KiB .. 4 MiB. The last\n"
            "line is JSON. Files go to a temp dir of the bench's own under D, removed at the\n"
            "end. The RAM phase holds 3 x N x B bytes (two buffers and the arena).\n"
            "\n"
            "  --dir D             where the store, data dirs and fio's file go: a file system\n"
            "                      with O_DIRECT, not tmpfs (default /tmp)\n"
            "  --block-bytes B     block size, a multiple of 4096 (default 1048576)\n"
            "  --blocks N          blocks per RAM and NVMe phase, N x B <= 1 GiB (default 256)\n"
            "  --depth Q           I/Os in flight, tier and fio, 1..256 (default 32)\n"
            "  --restore-blocks M  block records to restore, 1..1000000 (default 200000)\n"
            "  --fio PATH          the fio to run (default: fio on PATH; missing: fio's\n"
            "                      figures are 0)\n"
            "  --quick             tiny sizes (64 KiB blocks, 16 blocks, depth 4, 2000\n"
            "                      records), one round: a smoke test of a few seconds\n");
}

/* ---- files ------------------------------------------------------------------------------- */

static int bt_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0 && errno != ENOENT)
        fprintf(stderr, "kvtier-bench: tiers: removing %s: %s\n", path, strerror(errno));
    return 0;
}

/* Removes @path and everything under it; a missing @path is fine. */
void kvt_bt_rmtree(const char *path)
{
    if (access(path, F_OK) == 0)
        nftw(path, bt_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void kvt_bt_path(const bt_t *b, const char *name, char *out)
{
    snprintf(out, BT_PATH, "%s/%s", b->dir, name);
}

/* ---- completions ------------------------------------------------------------------------- */

void kvt_bt_wait_init(bt_wait_t *w)
{
    *w = (bt_wait_t){.inflight = 0};
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

void kvt_bt_wait_cleanup(bt_wait_t *w)
{
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

static void bt_end(bt_wait_t *w, kvt_status_t st)
{
    pthread_mutex_lock(&w->mu);
    w->inflight--;
    if (st == KVT_OK)
        w->ok++;
    else if (w->failed++ == 0)
        w->first = st;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits for room (fewer than @depth in flight), then counts one more. */
void kvt_bt_acquire(bt_wait_t *w, uint32_t depth)
{
    pthread_mutex_lock(&w->mu);
    while (w->inflight >= depth)
        pthread_cond_wait(&w->cv, &w->mu);
    w->inflight++;
    pthread_mutex_unlock(&w->mu);
}

/* Gives back a slot whose call failed (its callback does not run). */
void kvt_bt_release(bt_wait_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->inflight--;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void kvt_bt_drain(bt_wait_t *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->inflight > 0)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static void bt_done(void *arg, kvt_status_t st)
{
    bt_end(arg, st);
}

void kvt_bt_got(void *arg, kvt_status_t st, const void *data, size_t len)
{
    bt_get_t *g = arg;
    if (st == KVT_OK && (len != g->len || memcmp(data, g->want, BT_CHECK) != 0))
        st = KVT_ERR_INTERNAL; /* wrong bytes: the tier must never return them */
    bt_end(g->w, st);
}

/* The RAM phase's callbacks run inline, on the bench's thread: plain counters. */
typedef struct bt_ram_ctx {
    uint64_t ok, failed;
    uint8_t *out; /* where the next get copies its bytes */
    size_t len;
} bt_ram_ctx_t;

static void bt_ram_done(void *arg, kvt_status_t st)
{
    bt_ram_ctx_t *c = arg;
    if (st == KVT_OK)
        c->ok++;
    else
        c->failed++;
}

static void bt_ram_got(void *arg, kvt_status_t st, const void *data, size_t len)
{
    bt_ram_ctx_t *c = arg;
    if (st != KVT_OK || len != c->len) {
        c->failed++;
        return;
    }
    memcpy(c->out, data, len);
    c->ok++;
}

/* ---- the tier ---------------------------------------------------------------------------- */

/* Opens a tier of @ram_slots slots of @block bytes, with a store of @disk_slots slots at @store
 * (none when NULL) and its metadata in @data. */
kvt_tier_t *kvt_bt_open(uint32_t block, uint32_t ram_slots, const char *store, uint32_t disk_slots,
                        const char *data, uint32_t depth)
{
    kvt_tier_cfg_t c = {.ram_bytes = (uint64_t)ram_slots * block,
                        .block_bytes = block,
                        .arena_name = "",
                        .populate = true,
                        .disk_path = store,
                        .disk_bytes =
                            store != NULL ? KVT_DISK_HEADER + (uint64_t)disk_slots * block : 0,
                        .data_dir = data,
                        .io_depth = depth,
                        .admit = KVT_TIER_ADMIT_SEEN_TWICE};
    kvt_tier_t *t = NULL;
    char err[512];
    kvt_status_t st = kvt_tier_open(&c, &t, err, sizeof(err));
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: tiers: opening a tier: %s (%s)\n", err, kvt_status_str(st));
        return NULL;
    }
    return t;
}

/* Reopens @store: NULL (after a line on stderr) unless it restores exactly @want blocks. */
kvt_tier_t *kvt_bt_reopen(uint32_t block, uint32_t ram_slots, const char *store, const char *data,
                          uint32_t depth, uint64_t want)
{
    kvt_tier_t *t = kvt_bt_open(block, ram_slots, store, 0, data, depth);
    if (t == NULL)
        return NULL;
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    if (st.restored != want || st.restore_bad != 0) {
        fprintf(stderr,
                "kvtier-bench: tiers: reopened store restored %" PRIu64 " blocks (%" PRIu64
                " bad), want %" PRIu64 "\n",
                st.restored, st.restore_bad, want);
        kvt_tier_close(t);
        return NULL;
    }
    return t;
}

/* Durable puts of keys [0, n), @depth in flight, block i's bytes at @data + i * @stride. @w
 * (nothing in flight) counts them; its owner destroys it only once the tier is closed, when no
 * callback can still be returning from it. */
int kvt_bt_put_durable(kvt_tier_t *t, bt_wait_t *w, uint32_t n, const uint8_t *data, size_t stride,
                       uint32_t len, uint32_t depth)
{
    w->ok = w->failed = 0;
    kvt_status_t st = KVT_OK;
    for (uint32_t i = 0; i < n && st == KVT_OK; i++) {
        kvt_bt_acquire(w, depth);
        st = kvt_tier_put(t, BT_NS, BT_NS_LEN, i, data + (size_t)i * stride, len, true, bt_done, w);
        if (st != KVT_OK)
            kvt_bt_release(w);
    }
    kvt_bt_drain(w);
    if (st == KVT_OK && w->failed > 0)
        st = w->first;
    if (st != KVT_OK)
        fprintf(stderr, "kvtier-bench: tiers: durable put: %s (%" PRIu64 " of %u failed)\n",
                kvt_status_str(st), w->failed, n);
    w->ok = w->failed = 0;
    return st == KVT_OK ? 0 : -1;
}

/* ---- 1. RAM ------------------------------------------------------------------------------ */

static int bt_ram(bt_t *b)
{
    uint32_t B = b->o.block_bytes, N = b->o.blocks;
    size_t total = (size_t)N * B;
    kvt_tier_t *t = kvt_bt_open(B, N, NULL, 0, NULL, b->o.depth);
    if (t == NULL)
        return -1;
    uint64_t best_cpy = UINT64_MAX, best_put = UINT64_MAX, best_get = UINT64_MAX;
    for (uint32_t r = 0; r < b->rounds; r++) {
        uint64_t t0 = kvt_clock_ns();
        for (uint32_t i = 0; i < N; i++)
            memcpy(b->dst + (size_t)i * B, b->src + (size_t)i * B, B);
        uint64_t t1 = kvt_clock_ns();
        best_cpy = t1 - t0 < best_cpy ? t1 - t0 : best_cpy;
        memset(b->dst, 0, total); /* the gets must bring the bytes back */

        bt_ram_ctx_t c = {.len = B};
        t0 = kvt_clock_ns();
        for (uint32_t i = 0; i < N; i++)
            if (kvt_tier_put(t, BT_NS, BT_NS_LEN, i, b->src + (size_t)i * B, B, false, bt_ram_done,
                             &c) != KVT_OK)
                c.failed++;
        t1 = kvt_clock_ns();
        best_put = t1 - t0 < best_put ? t1 - t0 : best_put;
        if (c.ok != N) {
            fprintf(stderr, "kvtier-bench: tiers: %" PRIu64 " of %u RAM puts completed inline\n",
                    c.ok, N);
            goto err_close;
        }

        c = (bt_ram_ctx_t){.len = B};
        t0 = kvt_clock_ns();
        for (uint32_t i = 0; i < N; i++) {
            c.out = b->dst + (size_t)i * B;
            if (kvt_tier_get(t, BT_NS, BT_NS_LEN, i, bt_ram_got, &c) != KVT_OK)
                c.failed++;
        }
        t1 = kvt_clock_ns();
        best_get = t1 - t0 < best_get ? t1 - t0 : best_get;
        if (c.ok != N || memcmp(b->dst, b->src, total) != 0) {
            fprintf(stderr, "kvtier-bench: tiers: RAM gets: %" PRIu64 " of %u answered, bytes %s\n",
                    c.ok, N, memcmp(b->dst, b->src, total) == 0 ? "equal" : "differ");
            goto err_close;
        }

        c = (bt_ram_ctx_t){.len = B};
        for (uint32_t i = 0; i < N; i++)
            if (kvt_tier_delete(t, BT_NS, BT_NS_LEN, i, bt_ram_done, &c) != KVT_OK)
                c.failed++;
        if (c.ok != N) {
            fprintf(stderr, "kvtier-bench: tiers: %" PRIu64 " of %u RAM deletes completed\n", c.ok,
                    N);
            goto err_close;
        }
    }
    kvt_tier_close(t);
    b->r.memcpy_gbps = (double)total / (double)best_cpy; /* bytes per ns = GB/s */
    b->r.ram_put_gbps = (double)total / (double)best_put;
    b->r.ram_get_gbps = (double)total / (double)best_get;
    return 0;

err_close:
    kvt_tier_close(t);
    return -1;
}

/* ---- 2. NVMe ----------------------------------------------------------------------------- */

/* One round of the NVMe phase: a fresh store written, reopened and read; GB/s of each. */
static int bt_disk(bt_t *b, double *write_p, double *read_p)
{
    uint32_t B = b->o.block_bytes, N = b->o.blocks, Q = b->o.depth;
    double total = (double)N * B;
    char store[BT_PATH], data[BT_PATH];
    kvt_bt_path(b, "tier.store", store);
    kvt_bt_path(b, "tier.meta", data);
    int rc = -1;
    bt_wait_t w;
    kvt_bt_wait_init(&w);
    bt_get_t *g = calloc(N, sizeof(*g));
    kvt_tier_t *t = NULL;
    if (g == NULL) {
        fprintf(stderr, "kvtier-bench: tiers: out of memory\n");
        goto out;
    }
    if ((t = kvt_bt_open(B, 2 * Q, store, N, data, Q)) == NULL)
        goto out;

    uint64_t t0 = kvt_clock_ns();
    if (kvt_bt_put_durable(t, &w, N, b->src, B, B, Q) != 0)
        goto out;
    uint64_t t1 = kvt_clock_ns();
    *write_p = total / (double)(t1 - t0);
    kvt_tier_close(t);

    if ((t = kvt_bt_reopen(B, 2 * Q, store, data, Q, N)) == NULL)
        goto out;
    kvt_status_t st = KVT_OK;
    t0 = kvt_clock_ns();
    for (uint32_t i = 0; i < N && st == KVT_OK; i++) {
        g[i] = (bt_get_t){.w = &w, .want = b->src + (size_t)i * B, .len = B};
        kvt_bt_acquire(&w, Q);
        if ((st = kvt_tier_get(t, BT_NS, BT_NS_LEN, i, kvt_bt_got, &g[i])) != KVT_OK)
            kvt_bt_release(&w);
    }
    kvt_bt_drain(&w);
    t1 = kvt_clock_ns();
    if (st == KVT_OK && w.failed > 0)
        st = w.first;
    kvt_tier_stats_t ts;
    kvt_tier_stats(t, &ts);
    if (st != KVT_OK || ts.checksum_failures > 0) {
        fprintf(stderr,
                "kvtier-bench: tiers: NVMe gets: %s (%" PRIu64 " of %u failed, %" PRIu64
                " checksum failures)\n",
                kvt_status_str(st), w.failed, N, ts.checksum_failures);
        goto out;
    }
    *read_p = total / (double)(t1 - t0);
    rc = 0;

out:
    kvt_tier_close(t);
    kvt_bt_wait_cleanup(&w);
    free(g);
    unlink(store);
    kvt_bt_rmtree(data);
    return rc;
}

/* ---- fio --------------------------------------------------------------------------------- */

/* fio splits --filename at ':'; a literal one is written "\:". */
static void bt_fio_escape(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (; *in != '\0' && n + 3 < cap; in++) {
        if (*in == ':')
            out[n++] = '\\';
        out[n++] = *in;
    }
    out[n] = '\0';
}

/* fio's bandwidth (bytes/s) for @rw from its JSON report @path; -1 when absent. */
static double bt_fio_bw(const char *path, const char *rw, char *why, size_t whylen)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) {
        snprintf(why, whylen, "its report does not parse: %s (line %d)", je.text, je.line);
        return -1;
    }
    double bw = -1;
    json_t *job = json_array_get(json_object_get(root, "jobs"), 0);
    json_t *err = json_object_get(job, "error");
    json_t *v = json_object_get(json_object_get(job, rw), "bw_bytes");
    if (json_is_integer(err) && json_integer_value(err) != 0)
        snprintf(why, whylen, "its job reports error %" JSON_INTEGER_FORMAT,
                 json_integer_value(err));
    else if (!json_is_number(v))
        snprintf(why, whylen, "its report has no jobs[0].%s.bw_bytes", rw);
    else
        bw = json_number_value(v);
    json_decref(root);
    return bw;
}

/*
 * Runs fio once on @file: @rw ("write", "read") of @size bytes, with O_DSYNC when @dsync.
 * Returns 0 with *@gbps_p set, 1 when fio is missing, -1 when it failed (a note on stdout
 * either way: the yardstick is missing, the bench goes on).
 */
static int bt_fio_run(const bt_t *b, const char *file, uint64_t size, const char *rw, bool dsync,
                      double *gbps_p)
{
    char report[BT_PATH], esc[BT_PATH], a_file[BT_PATH + 16], a_out[BT_PATH + 16];
    char a_size[48], a_bs[48], a_qd[48], a_rw[48], why[512] = "";
    kvt_bt_path(b, "fio.json", report);
    bt_fio_escape(file, esc, sizeof(esc));
    snprintf(a_file, sizeof(a_file), "--filename=%s", esc);
    snprintf(a_out, sizeof(a_out), "--output=%s", report);
    snprintf(a_size, sizeof(a_size), "--size=%" PRIu64, size);
    snprintf(a_bs, sizeof(a_bs), "--bs=%u", b->o.block_bytes);
    snprintf(a_qd, sizeof(a_qd), "--iodepth=%u", b->o.depth);
    snprintf(a_rw, sizeof(a_rw), "--rw=%s", rw);
    const char *argv[] = {b->o.fio,
                          "--name=w",
                          a_file,
                          a_size,
                          a_bs,
                          a_qd,
                          "--ioengine=io_uring",
                          "--direct=1",
                          a_rw,
                          "--output-format=json",
                          a_out,
                          dsync ? "--sync=dsync" : NULL,
                          NULL};

    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        printf("note: fio not run: pipe: %s\n", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
    pid_t pid;
    int e = posix_spawnp(&pid, b->o.fio, &fa, NULL, (char *const *)(uintptr_t)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (e != 0) {
        close(pfd[0]);
        if (e == ENOENT) {
            printf("note: %s not found: fio's figures are 0\n", b->o.fio);
            return 1;
        }
        printf("note: fio not run: %s: %s\n", b->o.fio, strerror(e));
        return -1;
    }
    char errbuf[400];
    size_t got = 0;
    for (;;) {
        char tmp[4096];
        ssize_t n = read(pfd[0], tmp, sizeof(tmp));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t keep = (size_t)n < sizeof(errbuf) - 1 - got ? (size_t)n : sizeof(errbuf) - 1 - got;
        memcpy(errbuf + got, tmp, keep);
        got += keep;
    }
    errbuf[got] = '\0';
    close(pfd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    double bw = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        bw = bt_fio_bw(report, rw, why, sizeof(why));
    } else {
        errbuf[strcspn(errbuf, "\n")] = '\0';
        snprintf(why, sizeof(why), "exit status %d: %s",
                 WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), errbuf);
    }
    unlink(report);
    if (bw < 0) {
        printf("note: fio --rw=%s%s failed, its figures are 0: %s\n", rw,
               dsync ? " --sync=dsync" : "", why);
        return -1;
    }
    *gbps_p = bw / 1e9;
    return 0;
}

/* One round of fio: writes with and without O_DSYNC, reads; GB/s in @gbps (write dsync, write,
 * read). 0, or what bt_fio_run() returned when a run did not give its figure. */
static int bt_fio(const bt_t *b, double gbps[3])
{
    char file[BT_PATH];
    kvt_bt_path(b, "fio.dat", file);
    uint64_t size = (uint64_t)b->o.blocks * b->o.block_bytes;
    /* each write run starts from a fresh (fallocated) file, as the tier's store did */
    int rc = bt_fio_run(b, file, size, "write", false, &gbps[1]);
    unlink(file);
    if (rc == 0)
        rc = bt_fio_run(b, file, size, "write", true, &gbps[0]);
    if (rc == 0)
        rc = bt_fio_run(b, file, size, "read", false, &gbps[2]);
    unlink(file);
    return rc;
}

static double bt_max(double a, double b)
{
    return a > b ? a : b;
}

/* Rounds of the NVMe phase and fio, alternating (a shared device's noise hits both alike); the
 * best of each counts. fio's figures stay 0 once it is missing or fails. */
static int bt_nvme(bt_t *b)
{
    int fio = 0;
    for (uint32_t r = 0; r < b->rounds; r++) {
        double w = 0, rd = 0, f[3] = {0, 0, 0};
        if (bt_disk(b, &w, &rd) != 0)
            return -1;
        b->r.disk_write_gbps = bt_max(b->r.disk_write_gbps, w);
        b->r.disk_read_gbps = bt_max(b->r.disk_read_gbps, rd);
        if (fio == 0 && (fio = bt_fio(b, f)) == 0) {
            b->r.fio_write_gbps = bt_max(b->r.fio_write_gbps, f[0]);
            b->r.fio_write_nosync_gbps = bt_max(b->r.fio_write_nosync_gbps, f[1]);
            b->r.fio_read_gbps = bt_max(b->r.fio_read_gbps, f[2]);
        }
    }
    b->r.fio = fio == 0 ? "ok" : fio == 1 ? "missing" : "failed";
    if (fio != 0)
        b->r.fio_write_gbps = b->r.fio_write_nosync_gbps = b->r.fio_read_gbps = 0;
    return 0;
}

/* ---- report ------------------------------------------------------------------------------ */

static double bt_ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

static void bt_report(const bt_t *b)
{
    const bt_opts_t *o = &b->o;
    const bt_res_t *r = &b->r;
    printf("best of %u round%s each:\n", b->rounds, b->rounds == 1 ? "" : "s");
    printf("%-8s %-44s %9s   %-30s %9s %7s\n", "phase", "tier", "GB/s", "yardstick", "GB/s",
           "ratio");
    printf("%-8s %-44s %9.3f   %-30s %9.3f %7.3f\n", "ram", "put, non-durable (copies in)",
           r->ram_put_gbps, "memcpy, same blocks", r->memcpy_gbps,
           bt_ratio(r->ram_put_gbps, r->memcpy_gbps));
    printf("%-8s %-44s %9.3f   %-30s %9.3f %7.3f\n", "ram", "get (copies out)", r->ram_get_gbps,
           "memcpy, same blocks", r->memcpy_gbps, bt_ratio(r->ram_get_gbps, r->memcpy_gbps));
    char what[64];
    snprintf(what, sizeof(what), "durable put, %u in flight", o->depth);
    printf("%-8s %-44s %9.3f   %-30s %9.3f %7.3f\n", "nvme", what, r->disk_write_gbps,
           "fio write --sync=dsync", r->fio_write_gbps,
           bt_ratio(r->disk_write_gbps, r->fio_write_gbps));
    printf("%-8s %-44s %9s   %-30s %9.3f %7s\n", "nvme", "", "", "fio write (no dsync; info)",
           r->fio_write_nosync_gbps, "");
    snprintf(what, sizeof(what), "get after reopen (cold RAM), %u in flight", o->depth);
    printf("%-8s %-44s %9.3f   %-30s %9.3f %7.3f\n", "nvme", what, r->disk_read_gbps, "fio read",
           r->fio_read_gbps, bt_ratio(r->disk_read_gbps, r->fio_read_gbps));
    printf("fio: %s (io_uring, O_DIRECT, bs %u, iodepth %u, %" PRIu64 " bytes, a fresh file per "
           "write run)\n",
           r->fio, o->block_bytes, o->depth, (uint64_t)o->blocks * o->block_bytes);
    printf("\nrestore: %u block records: kvt_tier_open %.1f ms = %.0f blocks/s;"
           " rocksdb iteration %.1f ms = %.0f keys/s (open %.1f ms more); ratio %.3f"
           " (%.3f against open + iteration)\n",
           o->restore_blocks, r->restore_ms, r->restore_per_sec, r->rocks_iter_ms, r->rocks_per_sec,
           r->rocks_open_ms, bt_ratio(r->restore_per_sec, r->rocks_per_sec),
           bt_ratio(r->rocks_open_ms + r->rocks_iter_ms, r->restore_ms));
    printf("\nreload from NVMe after a reopen (read + checksum + promotion), median of %u:\n",
           b->reload_blocks);
    printf("%12s %14s %10s\n", "block bytes", "us per block", "GB/s");
    for (int i = 0; i < BT_NRELOAD; i++)
        printf("%12u %14.1f %10.3f\n", kvt_bt_reload_sizes[i], r->reload_us[i],
               (double)kvt_bt_reload_sizes[i] / (r->reload_us[i] * 1e3));

    printf("{\"bench\":\"tiers\",\"block_bytes\":%u,\"blocks\":%u,\"depth\":%u,\"quick\":%s,"
           "\"ram_put_gbps\":%.3f,\"ram_get_gbps\":%.3f,\"memcpy_gbps\":%.3f,"
           "\"ram_put_vs_memcpy\":%.4f,\"ram_get_vs_memcpy\":%.4f,"
           "\"disk_write_gbps\":%.3f,\"disk_read_gbps\":%.3f,\"fio\":\"%s\","
           "\"fio_write_gbps\":%.3f,\"fio_write_nosync_gbps\":%.3f,\"fio_read_gbps\":%.3f,"
           "\"disk_write_vs_fio\":%.4f,\"disk_read_vs_fio\":%.4f,"
           "\"restore_blocks\":%u,\"restore_ms\":%.2f,\"restore_blocks_per_sec\":%.0f,"
           "\"rocksdb_open_ms\":%.2f,\"rocksdb_iter_ms\":%.2f,\"rocksdb_iter_per_sec\":%.0f,"
           "\"restore_vs_rocksdb\":%.4f,\"restore_vs_rocksdb_open\":%.4f,\"reload_us\":{",
           o->block_bytes, o->blocks, o->depth, o->quick ? "true" : "false", r->ram_put_gbps,
           r->ram_get_gbps, r->memcpy_gbps, bt_ratio(r->ram_put_gbps, r->memcpy_gbps),
           bt_ratio(r->ram_get_gbps, r->memcpy_gbps), r->disk_write_gbps, r->disk_read_gbps, r->fio,
           r->fio_write_gbps, r->fio_write_nosync_gbps, r->fio_read_gbps,
           bt_ratio(r->disk_write_gbps, r->fio_write_gbps),
           bt_ratio(r->disk_read_gbps, r->fio_read_gbps), o->restore_blocks, r->restore_ms,
           r->restore_per_sec, r->rocks_open_ms, r->rocks_iter_ms, r->rocks_per_sec,
           bt_ratio(r->restore_per_sec, r->rocks_per_sec),
           bt_ratio(r->rocks_open_ms + r->rocks_iter_ms, r->restore_ms));
    for (int i = 0; i < BT_NRELOAD; i++)
        printf("%s\"%u\":%.1f", i ? "," : "", kvt_bt_reload_sizes[i], r->reload_us[i]);
    printf("},\"reload_blocks\":%u}\n", b->reload_blocks);
}

/* ---- main -------------------------------------------------------------------------------- */

/* Options left at 0 get their defaults (--quick's where given). 0, or 2 after a line. */
static int bt_settle(bt_opts_t *o)
{
    if (o->block_bytes == 0)
        o->block_bytes = o->quick ? 64u << 10 : 1u << 20;
    if (o->blocks == 0)
        o->blocks = o->quick ? 16 : 256;
    if (o->depth == 0)
        o->depth = o->quick ? 4 : 32;
    if (o->restore_blocks == 0)
        o->restore_blocks = o->quick ? 2000 : 200000;
    if (o->dir == NULL)
        o->dir = "/tmp";
    if (o->fio == NULL)
        o->fio = "fio";
    if (o->block_bytes % BT_ALIGN != 0) {
        fprintf(stderr, "kvtier-bench: --block-bytes must be a multiple of 4096, got %u\n",
                o->block_bytes);
        return 2;
    }
    if ((uint64_t)o->blocks * o->block_bytes > BT_MAX_BYTES ||
        2ull * o->depth * o->block_bytes > BT_MAX_BYTES) {
        fprintf(stderr,
                "kvtier-bench: --blocks x --block-bytes and 2 x --depth x --block-bytes must be "
                "at most 1 GiB, got %u x %u and 2 x %u x %u\n",
                o->blocks, o->block_bytes, o->depth, o->block_bytes);
        return 2;
    }
    return 0;
}

/* Makes the bench's temp dir under @o->dir; -1 after a line on stderr. */
static int bt_mkdir(bt_t *b)
{
    struct statfs fs;
    if (statfs(b->o.dir, &fs) != 0) {
        fprintf(stderr, "kvtier-bench: tiers: --dir %s: %s\n", b->o.dir, strerror(errno));
        return -1;
    }
    if (fs.f_type == TMPFS_MAGIC) {
        fprintf(stderr,
                "kvtier-bench: tiers: --dir %s is on tmpfs, which has no O_DIRECT: "
                "give a directory on a disk\n",
                b->o.dir);
        return -1;
    }
    errno = ENAMETOOLONG;
    if ((size_t)snprintf(b->dir, sizeof(b->dir), "%s/kvtier-bench-tiers.XXXXXX", b->o.dir) >=
            sizeof(b->dir) ||
        mkdtemp(b->dir) == NULL) {
        fprintf(stderr, "kvtier-bench: tiers: cannot make a temp dir under %s: %s\n", b->o.dir,
                strerror(errno));
        b->dir[0] = '\0';
        return -1;
    }
    return 0;
}

int kvt_bench_tiers_main(int argc, char **argv)
{
    bt_t b = {.r.fio = "missing"};
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_STR("--dir", &b.o.dir),
        KVT_BENCH_ARG_U32("--block-bytes", &b.o.block_bytes, BT_ALIGN, 64u << 20),
        KVT_BENCH_ARG_U32("--blocks", &b.o.blocks, 1, 262144),
        KVT_BENCH_ARG_U32("--depth", &b.o.depth, 1, 256),
        KVT_BENCH_ARG_U32("--restore-blocks", &b.o.restore_blocks, 1, 1000000),
        KVT_BENCH_ARG_STR("--fio", &b.o.fio),
        KVT_BENCH_ARG_FLAG("--quick", &b.o.quick),
    };
    int r = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (r > 0)
        bt_usage(stdout);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (bt_settle(&b.o) != 0)
        return 2;
    b.rounds = b.o.quick ? 1 : 3;
    b.reload_blocks = b.o.quick ? 2 : 8;
    kvt_log_set_level(KVT_LOG_WARN); /* the tier's lifecycle lines are not results */

    int rc = 1;
    size_t total = (size_t)b.o.blocks * b.o.block_bytes;
    b.src = malloc(total);
    b.dst = malloc(total);
    b.rbuf = malloc(BT_RELOAD_MAX);
    if (b.src == NULL || b.dst == NULL || b.rbuf == NULL) {
        fprintf(stderr, "kvtier-bench: tiers: out of memory for 2 x %zu bytes\n", total);
        goto out;
    }
    /* every page written before anything is timed; blocks differ from each other */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i + 8 <= total; i += 8) {
        uint64_t v = kvt_bench_rand(&x);
        memcpy(b.src + i, &v, 8);
    }
    memset(b.dst, 0, total);
    for (size_t i = 0; i + 8 <= BT_RELOAD_MAX; i += 8) {
        uint64_t v = kvt_bench_rand(&x);
        memcpy(b.rbuf + i, &v, 8);
    }
    if (bt_mkdir(&b) != 0)
        goto out;
    printf("kvtier-bench tiers: %u blocks of %u bytes (%zu MiB), depth %u, %u block records;"
           " files in %s\n",
           b.o.blocks, b.o.block_bytes, total >> 20, b.o.depth, b.o.restore_blocks, b.dir);
    fflush(stdout);
    if (bt_ram(&b) != 0 || bt_nvme(&b) != 0 || kvt_bt_restore(&b) != 0 || kvt_bt_reload(&b) != 0)
        goto out;
    bt_report(&b);
    rc = fflush(stdout) == 0 ? 0 : 1;

out:
    if (b.dir[0] != '\0')
        kvt_bt_rmtree(b.dir);
    free(b.rbuf);
    free(b.dst);
    free(b.src);
    return rc;
}
