/*
 * tests/integration/test_client.c: libkvtier against the real kvtierd.
 *
 * Usage: test_client path/to/kvtierd
 *
 * Starts kvtierd processes itself (fork/exec on ephemeral loopback ports, each
 * in its own mkdtemp directory), then drives them only through libkvtier:
 * events, sync queries by tokens and by keys, pod filters, stats, drop_engine,
 * 1000 pipelined async queries, fan-out over three daemons plus a dead
 * address and a stopped one, reconnect to a daemon restarted on the same
 * port, a Unix socket, the auth token, and timeouts against a socket that
 * never answers, server limits (error answers, local refusals), answers over
 * 64 KiB, a server that dies with queries in flight, and cache salts (salted
 * prefixes match only queries with the same salt, over sync, submit and
 * fan-out queries and salted keys), and the tier calls against a kvtierd
 * with tiers (--ram-bytes, --block-bytes 64KiB, an NVMe store in its temp
 * dir where io_uring and O_DIRECT allow one, the data plane on --rpc-unix):
 * attach, reserve, writes through the mapping, commit, lookup, pin (the
 * bytes through the mapping), unpin; the block API's round trip, not found,
 * too big, durable puts read back from NVMe; pins and reservations released
 * with the connection that held them. Every daemon is
 * stopped with SIGTERM and must exit 0 (except the one killed on purpose). On
 * a failure the test prints what failed, whether each daemon is still alive,
 * and every daemon's log (sanitizer reports included), and exits 1.
 *
 * The block keys are checked against a reference computed here with xxhash
 * (the standard in DESIGN.md), independently of kvindex.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "kvindex/hash.h"
#include "kvtier/client.h"

#define MODEL "m"
#define BS 4
#define NTOK 32 /* 8 blocks of BS */
#define MAX_DAEMONS 12
#define START_TIMEOUT_MS 30000
#define STOP_TIMEOUT_MS 20000
#define ASYNC_TOTAL 1000
#define ASYNC_FIRST 900 /* submitted up front; the callback submits the rest */
#define TOKEN "s3cret-token"

/* ---- failure reporting ---------------------------------------------------------------------- */

typedef struct daemon {
    pid_t pid; /* 0 once reaped */
    int out_fd;
    char dir[128];
    char log[160];
    char sock[160]; /* --rpc-unix path, "" when none */
    int http_port, rpc_port;
} daemon_t;

static const char *g_bin;
static daemon_t g_daemons[MAX_DAEMONS];
static size_t g_ndaemons;
static const char *g_phase = "setup";

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    (void)remove(path);
    return 0;
}

static void dump_log(const daemon_t *d)
{
    FILE *f = fopen(d->log, "r");
    if (f == NULL) {
        fprintf(stderr, "(no log at %s)\n", d->log);
        return;
    }
    /* The end of the log is what matters; keep the output bounded. */
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        if (size > 16384)
            (void)fseek(f, size - 16384, SEEK_SET);
        else
            rewind(f);
    }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stderr);
    fclose(f);
}

static void cleanup_all(bool kill_them)
{
    for (size_t i = 0; i < g_ndaemons; i++) {
        daemon_t *d = &g_daemons[i];
        if (d->pid > 0 && kill_them) {
            kill(d->pid, SIGCONT);
            kill(d->pid, SIGKILL);
            (void)waitpid(d->pid, NULL, 0);
            d->pid = 0;
        }
        if (d->out_fd >= 0)
            close(d->out_fd);
        d->out_fd = -1;
        if (d->dir[0] != '\0')
            (void)nftw(d->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        d->dir[0] = '\0';
    }
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4), noreturn))
#endif
static void
check_fail(int line, const char *expr, const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fprintf(stderr, "FAIL test_client.c:%d [%s]: %s: ", line, g_phase, expr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    for (size_t i = 0; i < g_ndaemons; i++) {
        daemon_t *d = &g_daemons[i];
        char state[64] = "stopped";
        int status = 0, pid = (int)d->pid;
        if (d->pid > 0 && waitpid(d->pid, &status, WNOHANG) == d->pid) {
            /* It died on its own: say how (a sanitizer report is in its log). */
            if (WIFEXITED(status))
                snprintf(state, sizeof(state), "DIED, exit status %d", WEXITSTATUS(status));
            else
                snprintf(state, sizeof(state), "DIED, signal %d", WTERMSIG(status));
            d->pid = 0;
        } else if (d->pid > 0) {
            snprintf(state, sizeof(state), "running");
        }
        fprintf(stderr, "---- kvtierd #%zu (pid %d, http %d, rpc %d, %s) log ----\n", i, pid,
                d->http_port, d->rpc_port, state);
        dump_log(d);
    }
    cleanup_all(true);
    exit(1);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check_fail(__LINE__, #cond, __VA_ARGS__);                                              \
    } while (0)

/* A call that must succeed; the message names the client's last error. */
#define CHECK_OK(c, call)                                                                          \
    do {                                                                                           \
        kvt_status_t st_ = (call);                                                                 \
        if (st_ != KVT_OK)                                                                         \
            check_fail(__LINE__, #call, "status %d (%s): %s", st_, kvt_status_str(st_),            \
                       kvt_client_last_error(c));                                                  \
    } while (0)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- daemons -------------------------------------------------------------------------------- */

/*
 * Starts kvtierd with RPC on @rpc_listen ("127.0.0.1:0" for an ephemeral
 * port), the auth token @token (NULL: none) and, with @unix_sock, a Unix
 * socket in its directory, and the NULL-terminated flags @extra (may be NULL;
 * a flag "@/NAME" is the path NAME in the daemon's directory).
 * Returns once it printed its ports.
 */
static daemon_t *daemon_start(const char *rpc_listen, const char *token, bool unix_sock,
                              const char *const *extra)
{
    CHECK(g_ndaemons < MAX_DAEMONS, "too many daemons");
    daemon_t *d = &g_daemons[g_ndaemons++];
    memset(d, 0, sizeof(*d));
    d->out_fd = -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(d->dir, sizeof(d->dir), "%s/kvtier_client_XXXXXX",
             tmp != NULL && tmp[0] != '\0' && strlen(tmp) < 64 ? tmp : "/tmp");
    CHECK(mkdtemp(d->dir) != NULL, "mkdtemp %s: %s", d->dir, strerror(errno));

    char dir[sizeof(d->dir)], data[160], tokfile[160];
    memcpy(dir, d->dir, sizeof(dir));
    snprintf(d->log, sizeof(d->log), "%s/kvtierd.log", dir);
    snprintf(data, sizeof(data), "%s/data", dir);
    snprintf(tokfile, sizeof(tokfile), "%s/token", dir);
    if (unix_sock)
        snprintf(d->sock, sizeof(d->sock), "%s/k.sock", dir);
    if (token != NULL) {
        FILE *f = fopen(tokfile, "w");
        CHECK(f != NULL, "%s: %s", tokfile, strerror(errno));
        fprintf(f, "%s\n", token);
        fclose(f);
    }
    const char *argv[32];
    size_t argc = 0;
    argv[argc++] = g_bin;
    argv[argc++] = "--http-listen";
    argv[argc++] = "127.0.0.1:0";
    argv[argc++] = "--rpc-listen";
    argv[argc++] = rpc_listen;
    argv[argc++] = "--data-dir";
    argv[argc++] = data;
    argv[argc++] = "--workers";
    argv[argc++] = "2";
    if (token != NULL) {
        argv[argc++] = "--auth-token-file";
        argv[argc++] = tokfile;
    }
    if (unix_sock) {
        argv[argc++] = "--rpc-unix";
        argv[argc++] = d->sock;
    }
    char paths[4][200];
    size_t npaths = 0;
    for (size_t i = 0; extra != NULL && extra[i] != NULL; i++) {
        CHECK(argc < sizeof(argv) / sizeof(argv[0]) - 1, "too many flags");
        argv[argc++] = extra[i];
        if (strncmp(extra[i], "@/", 2) == 0) {
            CHECK(npaths < sizeof(paths) / sizeof(paths[0]), "too many paths");
            snprintf(paths[npaths], sizeof(paths[0]), "%s%s", dir, extra[i] + 1);
            argv[argc - 1] = paths[npaths++];
        }
    }
    argv[argc] = NULL;

    int pfd[2];
    CHECK(pipe2(pfd, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
    int logfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(logfd >= 0, "%s: %s", d->log, strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        if (dup2(pfd[1], STDOUT_FILENO) < 0 || dup2(logfd, STDERR_FILENO) < 0)
            _exit(126);
        execv(g_bin, (char *const *)(uintptr_t)argv);
        dprintf(STDERR_FILENO, "exec %s: %s\n", g_bin, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    close(logfd);
    d->pid = pid;
    d->out_fd = pfd[0];

    /* "kvtierd listening http=P rpc=Q\n" */
    char line[256];
    size_t len = 0;
    uint64_t deadline = now_ms() + START_TIMEOUT_MS;
    while (len < sizeof(line) - 1) {
        uint64_t now = now_ms();
        CHECK(now < deadline, "kvtierd printed no ports within %d ms", START_TIMEOUT_MS);
        struct pollfd p = {.fd = d->out_fd, .events = POLLIN, .revents = 0};
        if (poll(&p, 1, (int)(deadline - now)) <= 0)
            continue;
        ssize_t n = read(d->out_fd, line + len, 1);
        if (n < 0 && errno == EINTR)
            continue;
        CHECK(n == 1, "kvtierd closed its stdout before printing its ports (read %zd: %s)", n,
              n < 0 ? strerror(errno) : "eof");
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = '\0';
    CHECK(sscanf(line, "kvtierd listening http=%d rpc=%d", &d->http_port, &d->rpc_port) == 2,
          "unexpected first line %s", line);
    CHECK(d->rpc_port > 0 && d->http_port > 0, "ports %s", line);
    return d;
}

/* SIGTERM, wait, and require exit status 0. */
static void daemon_stop(daemon_t *d)
{
    CHECK(d->pid > 0, "daemon already stopped");
    CHECK(kill(d->pid, SIGTERM) == 0, "kill: %s", strerror(errno));
    uint64_t deadline = now_ms() + STOP_TIMEOUT_MS;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid)
            break;
        CHECK(r == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
        CHECK(now_ms() < deadline, "kvtierd pid %d did not exit within %d ms of SIGTERM",
              (int)d->pid, STOP_TIMEOUT_MS);
        sleep_ms(10);
    }
    pid_t pid = d->pid;
    d->pid = 0;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "kvtierd pid %d ended with %s %d after SIGTERM (want exit 0)", (int)pid,
          WIFEXITED(status) ? "exit status" : "signal",
          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

/* SIGSTOP, and wait until the whole process is stopped (kill() only queues the signal). */
static void daemon_pause(daemon_t *d)
{
    int status = 0;
    CHECK(kill(d->pid, SIGSTOP) == 0, "SIGSTOP: %s", strerror(errno));
    pid_t r;
    while ((r = waitpid(d->pid, &status, WUNTRACED)) < 0 && errno == EINTR)
        ;
    CHECK(r == d->pid && WIFSTOPPED(status), "kvtierd pid %d did not stop (status %#x)",
          (int)d->pid, status);
}

/* SIGKILL (a deliberate crash) and reap. */
static void daemon_kill(daemon_t *d)
{
    int status = 0;
    CHECK(kill(d->pid, SIGKILL) == 0, "SIGKILL: %s", strerror(errno));
    pid_t r;
    while ((r = waitpid(d->pid, &status, 0)) < 0 && errno == EINTR)
        ;
    CHECK(r == d->pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
          "kvtierd pid %d: status %#x after SIGKILL", (int)d->pid, status);
    d->pid = 0;
}

static void daemon_resume(daemon_t *d)
{
    CHECK(kill(d->pid, SIGCONT) == 0, "SIGCONT: %s", strerror(errno));
}

/* ---- clients -------------------------------------------------------------------------------- */

static void addr_of(const daemon_t *d, char *buf, size_t cap)
{
    snprintf(buf, cap, "127.0.0.1:%d", d->rpc_port);
}

static kvt_client_t *client_new(const char *addr, const char *token, bool lazy, int timeout_ms)
{
    kvt_client_opts_t o;
    kvt_client_t *c = NULL;
    char msg[512];

    kvt_client_opts_default(&o);
    o.address = addr;
    o.auth_token = token;
    o.lazy_connect = lazy;
    o.connect_timeout_ms = o.io_timeout_ms = timeout_ms;
    kvt_status_t st = kvt_client_create_msg(&o, &c, msg, sizeof(msg));
    CHECK(st == KVT_OK && c != NULL, "create %s: status %d: %s", addr, st, msg);
    return c;
}

static kvt_client_t *client_for(const daemon_t *d, const char *token)
{
    char addr[64];
    addr_of(d, addr, sizeof(addr));
    return client_new(addr, token, false, 5000);
}

/* ---- events --------------------------------------------------------------------------------- */

static uint32_t g_tok[NTOK];

/* An event batch with one BlockStored of the first @nblocks blocks of g_tok, stored under the
 * request's cache salt @salt (NULL: the event has no "cache_salt"). */
static char *stored_json_salted(const char *pod, unsigned dp_rank, uint64_t first_hash,
                                size_t nblocks, const char *medium, const char *salt)
{
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    CHECK(s != NULL, "oom");
    len += (size_t)snprintf(s + len, cap - len,
                            "{\"pod\": \"%s\", \"model\": \"" MODEL "\", \"lora_name\": null, "
                            "\"dp_rank\": %u, \"events\": [{\"type\": \"BlockStored\", "
                            "\"block_hashes\": [",
                            pod, dp_rank);
    for (size_t i = 0; i < nblocks; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s%" PRIu64, i ? ", " : "", first_hash + i);
    len += (size_t)snprintf(s + len, cap - len, "], \"parent_block_hash\": null, \"token_ids\": [");
    for (size_t i = 0; i < nblocks * BS; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s%u", i ? ", " : "", g_tok[i]);
    len += (size_t)snprintf(s + len, cap - len, "], \"block_size\": %d, \"medium\": \"%s\"", BS,
                            medium);
    if (salt != NULL)
        len += (size_t)snprintf(s + len, cap - len, ", \"cache_salt\": \"%s\"", salt);
    len += (size_t)snprintf(s + len, cap - len, "}]}");
    CHECK(len < cap, "event JSON too long");
    return s;
}

static char *stored_json(const char *pod, unsigned dp_rank, uint64_t first_hash, size_t nblocks,
                         const char *medium)
{
    return stored_json_salted(pod, dp_rank, first_hash, nblocks, medium, NULL);
}

/* Reports one BlockStored batch (salted when @salt is not NULL) and checks the answer says it
 * was applied. */
static void report_stored_salted(kvt_client_t *c, const char *pod, unsigned dp_rank,
                                 uint64_t first_hash, size_t nblocks, const char *medium,
                                 const char *salt)
{
    char *json = stored_json_salted(pod, dp_rank, first_hash, nblocks, medium, salt);
    char *ans = NULL;
    CHECK_OK(c, kvt_client_report_events(c, json, strlen(json), &ans));
    CHECK(ans != NULL, "no answer");
    char want[64];
    snprintf(want, sizeof(want), "\"blocks\":%zu", nblocks);
    CHECK(strstr(ans, "\"applied\":1") != NULL && strstr(ans, want) != NULL,
          "events answer %s (want applied 1, %s)", ans, want);
    kvt_client_free(ans);
    free(json);
}

static void report_stored(kvt_client_t *c, const char *pod, unsigned dp_rank, uint64_t first_hash,
                          size_t nblocks, const char *medium)
{
    report_stored_salted(c, pod, dp_rank, first_hash, nblocks, medium, NULL);
}

/* ---- expected answers ----------------------------------------------------------------------- */

typedef struct want_pod {
    const char *pod;
    uint32_t dp_rank, matched, gpu, cpu, disk;
    double score;
} want_pod_t;

/*
 * What daemon #1 holds (set up in test_sync): A rank 0 has blocks 0..3 on
 * GPU, B rank 1 blocks 0..1 on GPU, C rank 0 blocks 0..2 on CPU. The expected
 * answer for a query of the first @k blocks, restricted to @filter (NULL: all).
 */
static size_t want_d1(size_t k, const char *const *filter, size_t nfilter, want_pod_t *out)
{
    static const struct {
        const char *pod;
        uint32_t rank, held;
        int tier; /* 0 gpu, 1 cpu */
    } holds[] = {{"A", 0, 4, 0}, {"B", 1, 2, 0}, {"C", 0, 3, 1}};
    size_t n = 0;
    for (size_t i = 0; i < 3; i++) {
        uint32_t m = (uint32_t)(k < holds[i].held ? k : holds[i].held);
        if (m == 0)
            continue;
        bool in = filter == NULL;
        for (size_t j = 0; j < nfilter; j++)
            if (strcmp(filter[j], holds[i].pod) == 0)
                in = true;
        if (!in)
            continue;
        want_pod_t w = {holds[i].pod, holds[i].rank, m, 0, 0, 0, 0};
        if (holds[i].tier == 0) {
            w.gpu = m;
            w.score = m;
        } else {
            w.cpu = m;
            w.score = 0.8 * m;
        }
        out[n++] = w;
    }
    return n;
}

static bool score_eq(double a, double b)
{
    double d = a - b;
    return d < 1e-9 && d > -1e-9;
}

/*
 * Checks @r against @want (any order): same pods with the same counts, listed
 * best first (scores never increase). With @exact_order, also in @want's order.
 * False with the first mismatch in @err (@errlen bytes).
 */
static bool result_matches(const kvt_client_result_t *r, uint32_t num_blocks,
                           const want_pod_t *want, size_t nwant, bool exact_order, char *err,
                           size_t errlen)
{
    if (r->block_size != BS || r->num_blocks != num_blocks) {
        snprintf(err, errlen, "block_size %u num_blocks %u, want %d %u", r->block_size,
                 r->num_blocks, BS, num_blocks);
        return false;
    }
    if (r->npods != nwant) {
        snprintf(err, errlen, "%zu pods, want %zu", r->npods, nwant);
        return false;
    }
    if (nwant > 0 && r->pods == NULL) {
        snprintf(err, errlen, "pods is NULL");
        return false;
    }
    for (size_t i = 0; i < r->npods; i++) {
        const kvt_client_pod_t *p = &r->pods[i];
        if (i > 0 && p->score > r->pods[i - 1].score) {
            snprintf(err, errlen, "not best first: pod %zu (%s) scores %g > %g", i, p->pod,
                     p->score, r->pods[i - 1].score);
            return false;
        }
        const want_pod_t *w = NULL;
        if (exact_order) {
            w = &want[i];
            if (strcmp(w->pod, p->pod) != 0 || w->dp_rank != p->dp_rank)
                w = NULL;
        } else {
            for (size_t j = 0; j < nwant && w == NULL; j++)
                if (strcmp(want[j].pod, p->pod) == 0 && want[j].dp_rank == p->dp_rank)
                    w = &want[j];
        }
        if (w == NULL) {
            snprintf(err, errlen, "pod %zu is %s rank %u, unexpected there", i, p->pod, p->dp_rank);
            return false;
        }
        if (p->matched != w->matched || p->gpu != w->gpu || p->cpu != w->cpu ||
            p->disk != w->disk || !score_eq(p->score, w->score)) {
            snprintf(err, errlen,
                     "%s rank %u: matched %u gpu %u cpu %u disk %u score %g, want %u %u %u %u %g",
                     p->pod, p->dp_rank, p->matched, p->gpu, p->cpu, p->disk, p->score, w->matched,
                     w->gpu, w->cpu, w->disk, w->score);
            return false;
        }
    }
    /* (npods equal and every pod found: with distinct (pod, rank) pairs, the sets are equal) */
    for (size_t i = 0; i < r->npods; i++)
        for (size_t j = i + 1; j < r->npods; j++)
            if (strcmp(r->pods[i].pod, r->pods[j].pod) == 0 &&
                r->pods[i].dp_rank == r->pods[j].dp_rank) {
                snprintf(err, errlen, "%s rank %u listed twice", r->pods[i].pod,
                         r->pods[i].dp_rank);
                return false;
            }
    return true;
}

#define CHECK_RESULT(r, nb, want, nwant, exact)                                                    \
    do {                                                                                           \
        char why_[512];                                                                            \
        CHECK(result_matches((r), (nb), (want), (nwant), (exact), why_, sizeof(why_)), "%s",       \
              why_);                                                                               \
    } while (0)

/*
 * Block keys computed here from the standard's definition, independently of kvindex; a
 * non-empty cache @salt seeds block 0 with XXH3_64bits_withSeed(salt, 1337); a non-empty
 * @lora (Dynamo's LoRA keys) adds XXH3_64bits_withSeed(lora, 0) to every block's seed
 * (docs/api.md, "Cache salt" and "LoRA keys").
 */
static void ref_keys_lora(const uint32_t *t, size_t nblocks, const char *salt, const char *lora,
                          uint64_t *out)
{
    uint64_t prev = 0;
    uint64_t term = lora[0] != '\0' ? XXH3_64bits_withSeed(lora, strlen(lora), 0) : 0;
    uint64_t first_seed =
        salt[0] != '\0' ? XXH3_64bits_withSeed(salt, strlen(salt), KVT_HASH_SEED) : KVT_HASH_SEED;
    for (size_t i = 0; i < nblocks; i++) {
        uint8_t b[4 * BS];
        for (size_t j = 0; j < BS; j++)
            for (int k = 0; k < 4; k++)
                b[4 * j + (size_t)k] = (uint8_t)(t[i * BS + j] >> (8 * k));
        uint64_t local =
            XXH3_64bits_withSeed(b, sizeof(b), (i == 0 ? first_seed : KVT_HASH_SEED) + term);
        if (i == 0) {
            prev = local;
        } else {
            uint8_t pl[16];
            for (int k = 0; k < 8; k++) {
                pl[k] = (uint8_t)(prev >> (8 * k));
                pl[8 + k] = (uint8_t)(local >> (8 * k));
            }
            prev = XXH3_64bits_withSeed(pl, sizeof(pl), KVT_HASH_SEED);
        }
        out[i] = prev;
    }
}

static void ref_keys_salted(const uint32_t *t, size_t nblocks, const char *salt, uint64_t *out)
{
    ref_keys_lora(t, nblocks, salt, "", out);
}

static void ref_keys(const uint32_t *t, size_t nblocks, uint64_t *out)
{
    ref_keys_salted(t, nblocks, "", out);
}

/* The number after "@key": inside the object that follows "@section": in @json; -1 if absent. */
static long long json_num(const char *json, const char *section, const char *key)
{
    char pat[64];
    const char *p = json;
    if (section != NULL) {
        snprintf(pat, sizeof(pat), "\"%s\":{", section);
        p = strstr(json, pat);
        if (p == NULL)
            return -1;
        p += strlen(pat);
    }
    const char *end = strchr(p, '}');
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *k = strstr(p, pat);
    if (k == NULL || (end != NULL && k > end))
        return -1;
    return strtoll(k + strlen(pat), NULL, 10);
}

/* Polls stats (refreshed every --stats-period) until index.@key is @want; returns the JSON. */
static char *wait_stat(kvt_client_t *c, const char *section, const char *key, long long want)
{
    uint64_t deadline = now_ms() + 5000;
    for (;;) {
        char *json = NULL;
        CHECK_OK(c, kvt_client_stats(c, &json));
        CHECK(json != NULL && json[0] == '{', "stats answer %s", json ? json : "(null)");
        long long v = json_num(json, section, key);
        if (v == want)
            return json;
        CHECK(now_ms() < deadline, "stats %s.%s is %lld, want %lld: %s", section, key, v, want,
              json);
        kvt_client_free(json);
        sleep_ms(20);
    }
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_local(void)
{
    g_phase = "local";
    uint64_t a[NTOK / BS], b[NTOK / BS], ref[NTOK / BS];
    CHECK(kvt_client_hash_tokens(g_tok, NTOK, BS, a) == NTOK / BS, "8 keys");
    CHECK(kvt_client_hash_tokens(g_tok, NTOK + 0, 0, b) == 0, "block size 0");
    CHECK(kvt_client_hash_tokens(g_tok, 3, BS, b) == 0, "partial block");
    CHECK(kvt_hash_seq(g_tok, NTOK, BS, KVT_HASH_SEED, NULL, NULL, b) == NTOK / BS, "8 keys");
    ref_keys(g_tok, NTOK / BS, ref);
    CHECK(memcmp(a, ref, sizeof(a)) == 0 && memcmp(b, ref, sizeof(b)) == 0,
          "kvt_client_hash_tokens differs from the standard: %016" PRIx64 " vs %016" PRIx64, a[0],
          ref[0]);
    /* LoRA keys: Dynamo's with KVT_CLIENT_LORA_KEYS_DYNAMO, the standard's without */
    static const char *const salts[] = {"", "tenant-a"};
    for (size_t k = 0; k < 2; k++) {
        CHECK(kvt_client_hash_tokens_lora(g_tok, NTOK, BS, salts[k], "adapter-a",
                                          KVT_CLIENT_LORA_KEYS_DYNAMO, a) == NTOK / BS,
              "8 lora keys");
        ref_keys_lora(g_tok, NTOK / BS, salts[k], "adapter-a", ref);
        CHECK(memcmp(a, ref, sizeof(a)) == 0, "dynamo lora keys (salt '%s') differ", salts[k]);
        CHECK(kvt_client_hash_tokens_lora(g_tok, NTOK, BS, salts[k], "adapter-a",
                                          KVT_CLIENT_LORA_KEYS_NAMESPACE, a) == NTOK / BS &&
                  kvt_client_hash_tokens_salted(g_tok, NTOK, BS, salts[k], b) == NTOK / BS &&
                  memcmp(a, b, sizeof(a)) == 0,
              "namespace lora keys are the standard's");
        CHECK(kvt_client_hash_tokens_lora(g_tok, NTOK, BS, salts[k], "",
                                          KVT_CLIENT_LORA_KEYS_DYNAMO, a) == NTOK / BS &&
                  kvt_client_hash_tokens_lora(g_tok, NTOK, BS, salts[k], NULL,
                                              KVT_CLIENT_LORA_KEYS_DYNAMO, ref) == NTOK / BS &&
                  memcmp(a, b, sizeof(a)) == 0 && memcmp(ref, b, sizeof(ref)) == 0,
              "no lora: the standard's keys");
    }
    CHECK(kvt_client_hash_tokens_lora(g_tok, NTOK, BS, NULL, "adapter-a", (kvt_client_lora_keys_t)7,
                                      a) == 0,
          "unknown lora keys mode");
    CHECK(kvt_client_hash_tokens_lora(g_tok, NTOK, 0, NULL, "adapter-a",
                                      KVT_CLIENT_LORA_KEYS_DYNAMO, a) == 0 &&
              kvt_client_hash_tokens_lora(g_tok, 3, BS, NULL, "adapter-a",
                                          KVT_CLIENT_LORA_KEYS_DYNAMO, a) == 0,
          "no full block");
    CHECK(kvt_client_version()[0] >= '0' && kvt_client_version()[0] <= '9', "version '%s'",
          kvt_client_version());

    kvt_client_opts_t o;
    kvt_client_t *c = (kvt_client_t *)(uintptr_t)1;
    char msg[256];
    kvt_client_opts_default(&o);
    CHECK(strcmp(o.address, KVT_CLIENT_DEFAULT_ADDR) == 0 && o.io_timeout_ms == 1000 &&
              o.connect_timeout_ms == 1000 && !o.lazy_connect && o.auth_token == NULL,
          "defaults");
    static const char *bad[] = {"nohostport", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000",
                                "::1:7420",   "[::1]7420",  "unix:",       ":7420"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        o.address = bad[i];
        o.lazy_connect = true;
        kvt_status_t st = kvt_client_create_msg(&o, &c, msg, sizeof(msg));
        CHECK(st == KVT_ERR_INVAL, "address '%s': status %d (%s), want KVT_ERR_INVAL", bad[i], st,
              msg);
        CHECK(c == (kvt_client_t *)(uintptr_t)1, "output set on failure");
        CHECK(strstr(msg, "bad address") != NULL, "message '%s'", msg);
    }
    kvt_client_destroy(NULL);
    kvt_client_result_t z = {0};
    kvt_client_result_free(&z);
}

/* A port with nothing listening (bound once, then closed). */
static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind: %s", strerror(errno));
    CHECK(getsockname(fd, (struct sockaddr *)&sa, &len) == 0, "getsockname");
    close(fd);
    return ntohs(sa.sin_port);
}

static void test_sync(daemon_t *d1, kvt_client_t *c)
{
    g_phase = "sync";
    kvt_client_result_t r;
    want_pod_t want[4];
    size_t nw;

    CHECK_OK(c, kvt_client_ping(c));
    /* Nothing reported yet: no pods, the default block size (16). */
    memset(&r, 0xAB, sizeof(r));
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 0 && r.pods == NULL && r.block_size == 16 && r.num_blocks == 2 &&
              r.answered == 1 && r.asked == 1,
          "empty index: npods %zu block_size %u num_blocks %u", r.npods, r.block_size,
          r.num_blocks);
    kvt_client_result_free(&r);
    CHECK(r.pods == NULL && r.npods == 0, "result_free zeroes");

    report_stored(c, "A", 0, 1, 4, "GPU");
    report_stored(c, "B", 1, 11, 2, "GPU");
    report_stored(c, "C", 0, 21, 3, "CPU");

    /* By tokens: A (4 on GPU, score 4), C (3 on CPU, 2.4), B (2 on GPU, 2). */
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    nw = want_d1(8, NULL, 0, want);
    CHECK(nw == 3, "want 3");
    const want_pod_t order[3] = {want[0], want[2], want[1]};
    CHECK_RESULT(&r, 8, order, 3, true);
    CHECK(r.answered == 1 && r.asked == 1, "answered %zu asked %zu", r.answered, r.asked);
    kvt_client_result_free(&r);

    /* Trailing tokens that fill no block do not count; "" lora is the base model. */
    CHECK_OK(c, kvt_client_query(c, MODEL, "", g_tok, 13, NULL, 0, &r));
    nw = want_d1(3, NULL, 0, want);
    CHECK_RESULT(&r, 3, want, nw, false);
    kvt_client_result_free(&r);

    /* By keys, from the client's hashing and from the reference: the same answers. */
    uint64_t keys[NTOK / BS], ref[NTOK / BS];
    CHECK(kvt_client_hash_tokens(g_tok, NTOK, BS, keys) == NTOK / BS, "hash");
    ref_keys(g_tok, NTOK / BS, ref);
    for (size_t k = 0; k <= NTOK / BS; k++) {
        CHECK_OK(c, kvt_client_query_keys(c, MODEL, NULL, k ? keys : NULL, k, NULL, 0, &r));
        nw = want_d1(k, NULL, 0, want);
        CHECK_RESULT(&r, (uint32_t)k, want, nw, false);
        kvt_client_result_free(&r);
        CHECK_OK(c, kvt_client_query_keys(c, MODEL, NULL, ref, k, NULL, 0, &r));
        CHECK_RESULT(&r, (uint32_t)k, want, nw, false);
        kvt_client_result_free(&r);
        CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, k * BS, NULL, 0, &r));
        CHECK_RESULT(&r, (uint32_t)k, want, nw, false);
        kvt_client_result_free(&r);
    }

    /* Pod filters: names select every DP rank of a pod; unknown names select nothing. */
    static const char *const bc[] = {"B", "C"}, *const nope[] = {"nope"},
                             *const dup[] = {"A", "A", "zz"};
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, bc, 2, &r));
    nw = want_d1(8, bc, 2, want);
    CHECK(nw == 2, "want 2");
    const want_pod_t cb_order[2] = {want[1], want[0]}; /* C 2.4, B 2 */
    CHECK_RESULT(&r, 8, cb_order, 2, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query_keys(c, MODEL, NULL, keys, NTOK / BS, bc, 2, &r));
    CHECK_RESULT(&r, 8, cb_order, 2, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, nope, 1, &r));
    CHECK_RESULT(&r, 8, want, 0, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, dup, 3, &r));
    nw = want_d1(8, dup, 3, want);
    CHECK_RESULT(&r, 8, want, nw, true);
    kvt_client_result_free(&r);
    /* 20 names: more than the client's on-stack array */
    const char *many[20];
    for (size_t i = 0; i < 20; i++)
        many[i] = i == 19 ? "B" : "x";
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, many, 20, &r));
    nw = want_d1(8, many, 20, want);
    CHECK_RESULT(&r, 8, want, nw, true);
    kvt_client_result_free(&r);

    /* A LoRA is another namespace; another model knows nothing. */
    CHECK_OK(c, kvt_client_query(c, MODEL, "adapter", g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 0, "lora namespace has %zu pods", r.npods);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query(c, "other-model", NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 0, "other model has %zu pods", r.npods);
    kvt_client_result_free(&r);

    /* Local argument errors leave the output alone and the connection usable. */
    memset(&r, 0x5A, sizeof(r));
    kvt_client_result_t r0 = r;
    CHECK(kvt_client_query(c, "", NULL, g_tok, NTOK, NULL, 0, &r) == KVT_ERR_INVAL, "empty model");
    CHECK(strstr(kvt_client_last_error(c), "model") != NULL, "msg %s", kvt_client_last_error(c));
    CHECK(kvt_client_query(c, MODEL, NULL, NULL, 5, NULL, 0, &r) == KVT_ERR_INVAL, "NULL tokens");
    CHECK(kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 2, &r) == KVT_ERR_INVAL, "NULL pods");
    static const char *const empty_name[] = {""};
    CHECK(kvt_client_query(c, MODEL, NULL, g_tok, NTOK, empty_name, 1, &r) == KVT_ERR_INVAL,
          "empty pod name");
    char longname[300];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    CHECK(kvt_client_query(c, longname, NULL, g_tok, NTOK, NULL, 0, &r) == KVT_ERR_INVAL,
          "long model");
    CHECK(memcmp(&r, &r0, sizeof(r)) == 0, "result changed by a failed call");
    CHECK_OK(c, kvt_client_ping(c));

    /* Server errors: status and the server's message, with its HTTP status; the connection
     * stays open. */
    static const char broken[] = "{broken";
    char *ans = (char *)(uintptr_t)1;
    kvt_status_t st = kvt_client_report_events(c, broken, strlen(broken), &ans);
    const char *msg = kvt_client_last_error(c);
    CHECK(st < 0 && st != KVT_ERR_IO && st != KVT_ERR_CLOSED && st != KVT_ERR_PROTO,
          "bad JSON: status %d (%s)", st, msg);
    CHECK(ans == (char *)(uintptr_t)1, "answer set on failure");
    char prefix[64];
    addr_of(d1, prefix, sizeof(prefix));
    CHECK(strncmp(msg, prefix, strlen(prefix)) == 0 && strstr(msg, "server: ") != NULL &&
              strstr(msg, "(400)") != NULL && strstr(msg, "expected") != NULL,
          "bad JSON message: %s", msg);
    char *bad_size = stored_json("A", 0, 1, 1, "GPU");
    char *bs8 = strstr(bad_size, "\"block_size\": 4");
    CHECK(bs8 != NULL, "json");
    bs8[strlen("\"block_size\": ")] = '8';
    st = kvt_client_report_events(c, bad_size, strlen(bad_size), NULL);
    CHECK(st < 0 && strstr(kvt_client_last_error(c), "(400)") != NULL, "block size 8: %d %s", st,
          kvt_client_last_error(c));
    free(bad_size);
    st = kvt_client_drop_engine(c, "nobody", &ans);
    CHECK(st == KVT_ERR_NOT_FOUND && strstr(kvt_client_last_error(c), "(404)") != NULL &&
              strstr(kvt_client_last_error(c), "nobody") != NULL,
          "drop of an unknown pod: status %d: %s", st, kvt_client_last_error(c));
    CHECK(kvt_client_drop_engine(c, "", NULL) == KVT_ERR_INVAL, "empty pod");
    CHECK_OK(c, kvt_client_ping(c));
    CHECK(kvt_client_last_error(c)[0] == '\0', "error left after success: %s",
          kvt_client_last_error(c));

    /* Stats: index counts of what was reported (9 entries of 4 distinct blocks, 3 pods). */
    char *json = wait_stat(c, "index", "entries", 9);
    CHECK(json_num(json, "index", "blocks") == 4 && json_num(json, "index", "pods") == 3 &&
              json_num(json, "events", "batches") == 3 && json_num(json, "events", "blocks") == 9 &&
              strstr(json, "\"engines\":[") != NULL,
          "stats: %s", json);
    kvt_client_free(json);

    /* Nothing the failed calls sent changed the index. */
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK_RESULT(&r, 8, order, 3, true);
    kvt_client_result_free(&r);
}

/* ---- cache salts --------------------------------------------------------------------------- */

typedef struct salt_cb_ctx {
    uint64_t id;
    kvt_status_t st;
    bool done;
    char why[512];
} salt_cb_ctx_t;

static void salt_cb(void *arg, uint64_t req_id, kvt_status_t st, const kvt_client_result_t *res)
{
    salt_cb_ctx_t *x = arg;
    x->done = req_id == x->id;
    x->st = st;
    /* d4's salted pod S, alone: 4 blocks on GPU */
    const want_pod_t w = {"S", 0, 4, 4, 0, 0, 4.0};
    if (st == KVT_OK && !result_matches(res, 8, &w, 1, true, x->why, sizeof(x->why)))
        x->st = KVT_ERR_INTERNAL;
}

/*
 * d4 holds, for model MODEL: S blocks 0..3 stored with cache salt "tenant-a", T blocks 0..2
 * with "tenant-b" (CPU), U blocks 0..1 with no salt. A query sees only the pods whose salt is
 * its own, over every libkvtier path; keys hashed with the salt find the salted blocks.
 */
static void test_salt(daemon_t *d4, kvt_client_t *c1)
{
    g_phase = "cache salt";
    kvt_client_t *c = client_for(d4, NULL);
    kvt_client_result_t r;
    report_stored_salted(c, "S", 0, 501, 4, "GPU", "tenant-a");
    report_stored_salted(c, "T", 0, 601, 3, "CPU", "tenant-b");
    report_stored_salted(c, "U", 0, 701, 2, "GPU", NULL);
    report_stored_salted(c, "V", 0, 801, 1, "GPU", ""); /* "" is no salt, as in vLLM */
    const want_pod_t s_a = {"S", 0, 4, 4, 0, 0, 4.0}, s_b = {"T", 0, 3, 0, 3, 0, 2.4};
    const want_pod_t none[2] = {{"U", 0, 2, 2, 0, 0, 2.0}, {"V", 0, 1, 1, 0, 0, 1.0}};

    /* Each salt, and no salt, sees only its own prefixes; another salt sees nothing. */
    CHECK_OK(c, kvt_client_query_salted(c, MODEL, NULL, "tenant-a", g_tok, NTOK, NULL, 0, &r));
    CHECK_RESULT(&r, 8, &s_a, 1, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query_salted(c, MODEL, "", "tenant-b", g_tok, NTOK, NULL, 0, &r));
    CHECK_RESULT(&r, 8, &s_b, 1, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK_RESULT(&r, 8, none, 2, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query_salted(c, MODEL, NULL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK_RESULT(&r, 8, none, 2, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query_salted(c, MODEL, NULL, "", g_tok, NTOK, NULL, 0, &r));
    CHECK_RESULT(&r, 8, none, 2, true);
    kvt_client_result_free(&r);
    static const char *const other[] = {"tenant-c", "tenant-a ", "Tenant-a", "tenant-"};
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        CHECK_OK(c, kvt_client_query_salted(c, MODEL, NULL, other[i], g_tok, NTOK, NULL, 0, &r));
        CHECK(r.npods == 0 && r.num_blocks == 8, "salt '%s' matched %zu pods", other[i], r.npods);
        kvt_client_result_free(&r);
    }
    /* A shorter salted prompt, a pod filter, and a LoRA namespace (salted events went to the
     * base model). */
    CHECK_OK(c,
             kvt_client_query_salted(c, MODEL, NULL, "tenant-a", g_tok, 2 * BS + 1, NULL, 0, &r));
    const want_pod_t s_a2 = {"S", 0, 2, 2, 0, 0, 2.0};
    CHECK_RESULT(&r, 2, &s_a2, 1, true);
    kvt_client_result_free(&r);
    static const char *const only_u[] = {"U"}, *const only_s[] = {"S"};
    CHECK_OK(c, kvt_client_query_salted(c, MODEL, NULL, "tenant-a", g_tok, NTOK, only_u, 1, &r));
    CHECK(r.npods == 0, "tenant-a filtered to U: %zu pods", r.npods);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query_salted(c, MODEL, NULL, "tenant-a", g_tok, NTOK, only_s, 1, &r));
    CHECK_RESULT(&r, 8, &s_a, 1, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query_salted(c, MODEL, "adapter", "tenant-a", g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 0, "lora namespace: %zu pods", r.npods);
    kvt_client_result_free(&r);

    /* Salted keys: the client's, the reference's and the server's (a query by keys finds the
     * salted blocks) agree; unsalted keys find only the unsalted pods. */
    uint64_t ka[NTOK / BS], kref[NTOK / BS], kplain[NTOK / BS];
    CHECK(kvt_client_hash_tokens_salted(g_tok, NTOK, BS, "tenant-a", ka) == NTOK / BS, "hash");
    ref_keys_salted(g_tok, NTOK / BS, "tenant-a", kref);
    CHECK(memcmp(ka, kref, sizeof(ka)) == 0,
          "kvt_client_hash_tokens_salted differs from the reference: %016" PRIx64 " vs %016" PRIx64,
          ka[0], kref[0]);
    CHECK(kvt_client_hash_tokens_salted(g_tok, NTOK, BS, "", kplain) == NTOK / BS, "hash");
    ref_keys(g_tok, NTOK / BS, kref);
    CHECK(memcmp(kplain, kref, sizeof(kplain)) == 0, "empty salt is not the standard");
    CHECK(kvt_client_hash_tokens_salted(g_tok, NTOK, BS, NULL, kref) == NTOK / BS &&
              memcmp(kplain, kref, sizeof(kplain)) == 0,
          "NULL salt is not the standard");
    for (size_t i = 0; i < NTOK / BS; i++)
        CHECK(ka[i] != kplain[i], "block %zu: salted key equals the unsalted one", i);
    CHECK(kvt_client_hash_tokens_salted(g_tok, BS - 1, BS, "tenant-a", kref) == 0, "partial");
    CHECK_OK(c, kvt_client_query_keys(c, MODEL, NULL, ka, NTOK / BS, NULL, 0, &r));
    CHECK_RESULT(&r, 8, &s_a, 1, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_query_keys(c, MODEL, NULL, kplain, NTOK / BS, NULL, 0, &r));
    CHECK_RESULT(&r, 8, none, 2, true);
    kvt_client_result_free(&r);
    uint64_t kb[NTOK / BS];
    CHECK(kvt_client_hash_tokens_salted(g_tok, NTOK, BS, "tenant-b", kb) == NTOK / BS, "hash");
    CHECK_OK(c, kvt_client_query_keys(c, MODEL, NULL, kb, NTOK / BS, NULL, 0, &r));
    CHECK_RESULT(&r, 8, &s_b, 1, true);
    kvt_client_result_free(&r);

    /* Submit + progress. */
    salt_cb_ctx_t x = {0};
    CHECK_OK(
        c, kvt_client_query_salted_submit(c, MODEL, NULL, "tenant-a", g_tok, NTOK, NULL, 0, &x.id));
    uint64_t deadline = now_ms() + 5000;
    while (!x.done) {
        struct pollfd p = {.fd = kvt_client_fd(c), .events = POLLIN, .revents = 0};
        CHECK(p.fd >= 0, "connection lost: %s", kvt_client_last_error(c));
        (void)poll(&p, 1, 100);
        CHECK_OK(c, kvt_client_progress(c, salt_cb, &x));
        CHECK(now_ms() < deadline, "salted submit never answered");
    }
    CHECK(x.st == KVT_OK, "salted submit: status %d: %s %s", x.st, x.why, kvt_client_last_error(c));

    /* Fan-out over d1 (unsalted A, B, C) and d4: a salted query finds S only; unsalted, S and
     * T are out of reach and d1's pods join U and V. */
    kvt_client_t *cs[2] = {c1, c};
    CHECK_OK(c, kvt_client_fanout_query_salted(cs, 2, MODEL, NULL, "tenant-a", g_tok, NTOK, NULL, 0,
                                               3000, &r));
    CHECK(r.answered == 2 && r.asked == 2, "answered %zu asked %zu", r.answered, r.asked);
    CHECK_RESULT(&r, 8, &s_a, 1, true);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_fanout_query_salted(cs, 2, MODEL, NULL, "tenant-z", g_tok, NTOK, NULL, 0,
                                               3000, &r));
    CHECK(r.answered == 2 && r.npods == 0, "tenant-z: answered %zu, %zu pods", r.answered, r.npods);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_fanout_query(cs, 2, MODEL, NULL, g_tok, NTOK, NULL, 0, 3000, &r));
    const want_pod_t merged[] = {{"A", 0, 4, 4, 0, 0, 4.0},
                                 {"C", 0, 3, 0, 3, 0, 2.4},
                                 {"B", 1, 2, 2, 0, 0, 2.0},
                                 {"U", 0, 2, 2, 0, 0, 2.0},
                                 {"V", 0, 1, 1, 0, 0, 1.0}};
    CHECK_RESULT(&r, 8, merged, 5, false);
    kvt_client_result_free(&r);

    /* Local refusal: a salt longer than 255 bytes; nothing sent, the result untouched. */
    char longsalt[300];
    memset(longsalt, 's', sizeof(longsalt) - 1);
    longsalt[sizeof(longsalt) - 1] = '\0';
    memset(&r, 0x5A, sizeof(r));
    kvt_client_result_t r0 = r;
    CHECK(kvt_client_query_salted(c, MODEL, NULL, longsalt, g_tok, NTOK, NULL, 0, &r) ==
              KVT_ERR_INVAL,
          "salt of 299 bytes");
    CHECK(strstr(kvt_client_last_error(c), "salt") != NULL, "msg %s", kvt_client_last_error(c));
    CHECK(memcmp(&r, &r0, sizeof(r)) == 0, "result changed by a failed call");
    uint64_t id = 0;
    CHECK(kvt_client_query_salted_submit(c, MODEL, NULL, longsalt, g_tok, NTOK, NULL, 0, &id) ==
                  KVT_ERR_INVAL &&
              kvt_client_inflight(c) == 0,
          "salted submit of a long salt");
    CHECK(kvt_client_fanout_query_salted(cs, 2, MODEL, NULL, longsalt, g_tok, NTOK, NULL, 0, 1000,
                                         &r) == KVT_ERR_INVAL,
          "salted fan-out of a long salt");
    longsalt[255] = '\0'; /* 255 bytes: the limit */
    CHECK_OK(c, kvt_client_query_salted(c, MODEL, NULL, longsalt, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 0, "255-byte salt matched %zu pods", r.npods);
    kvt_client_result_free(&r);
    CHECK_OK(c, kvt_client_ping(c));
    kvt_client_destroy(c);
}

/* ---- async ---------------------------------------------------------------------------------- */

typedef struct async_q {
    uint64_t id;
    size_t k;     /* blocks queried */
    int filt;     /* 0 none, 1 {"B","C"}, 2 {"nope"} */
    bool by_keys; /* sent as keys */
    bool done;
} async_q_t;

typedef struct async_ctx {
    kvt_client_t *c;
    async_q_t q[ASYNC_TOTAL];
    size_t nq, ndone, nbad;
    uint64_t keys[NTOK / BS];
    char bad[512];
} async_ctx_t;

static const char *const g_filt_bc[] = {"B", "C"};
static const char *const g_filt_nope[] = {"nope"};

static void async_submit(async_ctx_t *x)
{
    CHECK(x->nq < ASYNC_TOTAL, "too many");
    async_q_t *q = &x->q[x->nq];
    size_t i = x->nq;
    q->k = i % 9;
    q->filt = (int)(i / 9 % 3);
    q->by_keys = i % 2 == 1;
    q->done = false;
    const char *const *f = q->filt == 1 ? g_filt_bc : q->filt == 2 ? g_filt_nope : NULL;
    size_t nf = q->filt == 1 ? 2 : q->filt == 2 ? 1 : 0;
    kvt_status_t st;
    if (q->by_keys)
        st = kvt_client_query_keys_submit(x->c, MODEL, NULL, x->keys, q->k, f, nf, &q->id);
    else
        st = kvt_client_query_submit(x->c, MODEL, NULL, g_tok, q->k * BS, f, nf, &q->id);
    CHECK(st == KVT_OK, "submit %zu: status %d: %s", i, st, kvt_client_last_error(x->c));
    for (size_t j = 0; j < x->nq; j++)
        CHECK(x->q[j].id != q->id, "request id %" PRIu64 " reused", q->id);
    x->nq++;
}

static void async_cb(void *arg, uint64_t req_id, kvt_status_t st, const kvt_client_result_t *res)
{
    async_ctx_t *x = arg;
    async_q_t *q = NULL;
    for (size_t i = 0; i < x->nq && q == NULL; i++)
        if (x->q[i].id == req_id)
            q = &x->q[i];
    char why[512];
    if (q == NULL) {
        snprintf(why, sizeof(why), "answer for unknown id %" PRIu64, req_id);
    } else if (q->done) {
        snprintf(why, sizeof(why), "second answer for id %" PRIu64, req_id);
    } else if (st != KVT_OK || res == NULL) {
        snprintf(why, sizeof(why), "id %" PRIu64 ": status %d: %s", req_id, st,
                 kvt_client_last_error(x->c));
    } else {
        want_pod_t want[4];
        const char *const *f = q->filt == 1 ? g_filt_bc : q->filt == 2 ? g_filt_nope : NULL;
        size_t nf = q->filt == 1 ? 2 : q->filt == 2 ? 1 : 0;
        size_t nw = want_d1(q->k, f, nf, want);
        char w2[480];
        if (result_matches(res, (uint32_t)q->k, want, nw, false, w2, sizeof(w2))) {
            q->done = true;
            x->ndone++;
            /* The callback may submit: top up to ASYNC_TOTAL from inside it. */
            if (x->nq < ASYNC_TOTAL)
                async_submit(x);
            return;
        }
        snprintf(why, sizeof(why), "id %" PRIu64 " (k %zu filter %d keys %d): %s", req_id, q->k,
                 q->filt, q->by_keys, w2);
        q->done = true;
    }
    if (x->nbad++ == 0)
        snprintf(x->bad, sizeof(x->bad), "%s", why);
}

static void test_async(kvt_client_t *c)
{
    g_phase = "async";
    async_ctx_t *x = calloc(1, sizeof(*x));
    CHECK(x != NULL, "oom");
    x->c = c;
    CHECK(kvt_client_hash_tokens(g_tok, NTOK, BS, x->keys) == NTOK / BS, "hash");
    CHECK(kvt_client_inflight(c) == 0, "inflight");
    uint64_t t0 = now_ms(), deadline = t0 + 20000;
    for (size_t i = 0; i < ASYNC_FIRST; i++)
        async_submit(x);
    CHECK(kvt_client_inflight(c) > 0, "nothing in flight after %d submits", ASYNC_FIRST);

    /* Blocking calls refuse while queries are in flight. */
    kvt_client_result_t r = {0};
    CHECK(kvt_client_ping(c) == KVT_ERR_INVAL, "ping while in flight");
    CHECK(kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r) == KVT_ERR_INVAL,
          "query while in flight");
    CHECK(strstr(kvt_client_last_error(c), "in flight") != NULL, "msg %s",
          kvt_client_last_error(c));

    while (kvt_client_inflight(c) > 0) {
        int fd = kvt_client_fd(c);
        CHECK(fd >= 0, "connection lost with %zu in flight: %s", kvt_client_inflight(c),
              kvt_client_last_error(c));
        struct pollfd p = {.fd = fd,
                           .events = (short)(POLLIN | (kvt_client_want_write(c) ? POLLOUT : 0)),
                           .revents = 0};
        int pr = poll(&p, 1, 100);
        CHECK(pr >= 0 || errno == EINTR, "poll: %s", strerror(errno));
        kvt_status_t st = kvt_client_progress(c, async_cb, x);
        CHECK(st == KVT_OK, "progress: status %d: %s", st, kvt_client_last_error(c));
        CHECK(x->nbad == 0, "%zu bad answers; first: %s", x->nbad, x->bad);
        CHECK(now_ms() < deadline, "%zu of %zu answered after 20 s", x->ndone, x->nq);
    }
    CHECK(x->nq == ASYNC_TOTAL && x->ndone == ASYNC_TOTAL, "submitted %zu answered %zu", x->nq,
          x->ndone);
    for (size_t i = 0; i < x->nq; i++)
        CHECK(x->q[i].done, "query %zu (id %" PRIu64 ") never answered", i, x->q[i].id);
    CHECK(!kvt_client_want_write(c), "bytes left to write");
    /* A progress with nothing in flight is a no-op; blocking calls work again. */
    CHECK_OK(c, kvt_client_progress(c, async_cb, x));
    CHECK_OK(c, kvt_client_ping(c));
    printf("async: %d pipelined queries answered in %" PRIu64 " ms\n", ASYNC_TOTAL, now_ms() - t0);
    free(x);
}

/* ---- limits: server errors and local refusals, sync and async ------------------------------ */

typedef struct lim_ctx {
    kvt_client_t *c;
    uint64_t ids[4];
    kvt_status_t st[4];
    bool done[4];
    size_t ncb;
    char msg[512];
    char bad[512];
} lim_ctx_t;

static void lim_cb(void *arg, uint64_t req_id, kvt_status_t st, const kvt_client_result_t *res)
{
    lim_ctx_t *x = arg;
    x->ncb++;
    for (size_t i = 0; i < 4; i++) {
        if (x->ids[i] != req_id)
            continue;
        if (x->done[i])
            snprintf(x->bad, sizeof(x->bad), "second completion of id %" PRIu64, req_id);
        x->done[i] = true;
        x->st[i] = st;
        if (st != KVT_OK) {
            snprintf(x->msg, sizeof(x->msg), "%s", kvt_client_last_error(x->c));
            if (res != NULL)
                snprintf(x->bad, sizeof(x->bad), "error completion with a result");
        } else if (res == NULL || res->npods != 0 || res->block_size != 16 ||
                   res->num_blocks != NTOK / 16) {
            /* (nothing reported to this daemon yet: the default block size, no pods) */
            snprintf(x->bad, sizeof(x->bad), "id %" PRIu64 ": unexpected result", req_id);
        }
        return;
    }
    snprintf(x->bad, sizeof(x->bad), "completion of unknown id %" PRIu64, req_id);
}

/* @c: a client (with the token) of the daemon run with --rpc-max-frame 64KiB
 * --max-query-tokens 1000. */
static void test_limits(kvt_client_t *c)
{
    g_phase = "limits";
    size_t n = 20000;
    uint32_t *big = calloc(n, sizeof(*big));
    CHECK(big != NULL, "oom");
    for (size_t i = 0; i < n; i++)
        big[i] = (uint32_t)i;
    kvt_client_result_t r;
    memset(&r, 0, sizeof(r));

    /* Over --max-query-tokens: the server's error answer (413); the connection stays. */
    kvt_status_t st = kvt_client_query(c, MODEL, NULL, big, 1001, NULL, 0, &r);
    CHECK(st < 0 && st != KVT_ERR_IO && st != KVT_ERR_CLOSED && st != KVT_ERR_PROTO &&
              strstr(kvt_client_last_error(c), "server: ") != NULL &&
              strstr(kvt_client_last_error(c), "(413)") != NULL,
          "1001 tokens: status %d: %s", st, kvt_client_last_error(c));
    int fd = kvt_client_fd(c);
    CHECK_OK(c, kvt_client_ping(c));
    CHECK(kvt_client_fd(c) == fd, "an error answer must not cost the connection");

    /* Over the frame limit learnt in HELLO: refused locally, nothing sent. */
    st = kvt_client_query(c, MODEL, NULL, big, n, NULL, 0, &r);
    CHECK(st == KVT_ERR_TOO_BIG && strstr(kvt_client_last_error(c), "65536") != NULL,
          "80 KB request to a 64 KiB server: status %d: %s", st, kvt_client_last_error(c));
    CHECK(r.pods == NULL && r.npods == 0, "result set on failure");
    CHECK_OK(c, kvt_client_ping(c));
    CHECK(kvt_client_fd(c) == fd, "a local refusal must not cost the connection");

    /* Async: ok, server error, local refusal (nothing queued), ok, ok. */
    lim_ctx_t *x = calloc(1, sizeof(*x));
    CHECK(x != NULL, "oom");
    x->c = c;
    uint64_t id = 0;
    CHECK_OK(c, kvt_client_query_submit(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &x->ids[0]));
    CHECK_OK(c, kvt_client_query_submit(c, MODEL, NULL, big, 1001, NULL, 0, &x->ids[1]));
    st = kvt_client_query_submit(c, MODEL, NULL, big, n, NULL, 0, &id);
    CHECK(st == KVT_ERR_TOO_BIG && id == 0, "async 80 KB request: status %d", st);
    CHECK(kvt_client_inflight(c) == 2, "inflight %zu after a refused submit",
          kvt_client_inflight(c));
    CHECK_OK(c, kvt_client_query_submit(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &x->ids[2]));
    CHECK_OK(c, kvt_client_query_submit(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &x->ids[3]));
    uint64_t deadline = now_ms() + 5000;
    while (kvt_client_inflight(c) > 0) {
        struct pollfd p = {.fd = kvt_client_fd(c), .events = POLLIN, .revents = 0};
        (void)poll(&p, 1, 50);
        CHECK_OK(c, kvt_client_progress(c, lim_cb, x));
        CHECK(now_ms() < deadline, "async queries unanswered");
    }
    CHECK(x->bad[0] == '\0', "%s", x->bad);
    CHECK(x->ncb == 4 && x->done[0] && x->done[1] && x->done[2] && x->done[3], "%zu completions",
          x->ncb);
    CHECK(x->st[0] == KVT_OK && x->st[2] == KVT_OK && x->st[3] == KVT_OK, "ok queries failed");
    CHECK(x->st[1] < 0 && strstr(x->msg, "(413)") != NULL,
          "async 1001 tokens: status %d, message in the callback: %s", x->st[1], x->msg);
    CHECK(kvt_client_fd(c) == fd, "the connection changed");
    free(x);
    free(big);
}

/* Answers larger than the client's read chunk (64 KiB): 300 pods with 255-byte names. */
static void test_big_answer(kvt_client_t *c)
{
    g_phase = "big answer";
    enum { NPODS = 300 };
    char name[KVT_CLIENT_POD_NAME_SIZE];
    for (unsigned i = 0; i < NPODS; i++) {
        memset(name, 'p', 255);
        name[255] = '\0';
        char num[16];
        int len = snprintf(num, sizeof(num), "%03u", i);
        memcpy(name, num, (size_t)len);
        char json[512];
        snprintf(json, sizeof(json),
                 "{\"pod\":\"%s\",\"model\":\"big\",\"events\":[{\"type\":\"BlockStored\","
                 "\"block_hashes\":[1,2],\"token_ids\":[%u,%u,%u,%u,%u,%u,%u,%u],"
                 "\"block_size\":4}]}",
                 name, g_tok[0], g_tok[1], g_tok[2], g_tok[3], g_tok[4], g_tok[5], g_tok[6],
                 g_tok[7]);
        CHECK_OK(c, kvt_client_report_events(c, json, strlen(json), NULL));
    }
    kvt_client_result_t r;
    CHECK_OK(c, kvt_client_query(c, "big", NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == NPODS, "%zu pods, want %d", r.npods, NPODS);
    bool seen[NPODS] = {false};
    for (size_t i = 0; i < r.npods; i++) {
        const kvt_client_pod_t *p = &r.pods[i];
        unsigned k = (unsigned)atoi(p->pod);
        CHECK(strlen(p->pod) == 255 && k < NPODS && !seen[k] && p->matched == 2 && p->gpu == 2 &&
                  strspn(p->pod + 3, "p") == 252,
              "pod %zu: '%.20s...' (%zu bytes) matched %u", i, p->pod, strlen(p->pod), p->matched);
        seen[k] = true;
    }
    kvt_client_result_free(&r);
    /* The same through the pipelined path, a few at once. */
    size_t answered = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t id;
        CHECK_OK(c, kvt_client_query_submit(c, "big", NULL, g_tok, NTOK, NULL, 0, &id));
    }
    uint64_t deadline = now_ms() + 5000;
    while (kvt_client_inflight(c) > 0) {
        struct pollfd p = {.fd = kvt_client_fd(c), .events = POLLIN, .revents = 0};
        (void)poll(&p, 1, 50);
        size_t before = kvt_client_inflight(c);
        CHECK_OK(c, kvt_client_progress(c, NULL, NULL));
        answered += before - kvt_client_inflight(c);
        CHECK(now_ms() < deadline, "big async answers missing");
    }
    CHECK(answered == 3, "answered %zu", answered);
}

/* ---- Unix socket ---------------------------------------------------------------------------- */

static void test_unix(daemon_t *d1)
{
    g_phase = "unix";
    char addr[200];
    snprintf(addr, sizeof(addr), "unix:%s", d1->sock);
    kvt_client_t *u = client_new(addr, NULL, false, 5000);
    kvt_client_result_t r;
    want_pod_t want[4];
    CHECK_OK(u, kvt_client_ping(u));
    CHECK_OK(u, kvt_client_query(u, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    size_t nw = want_d1(8, NULL, 0, want);
    CHECK_RESULT(&r, 8, want, nw, false);
    kvt_client_result_free(&r);
    char *json = NULL;
    CHECK_OK(u, kvt_client_stats(u, &json));
    CHECK(json_num(json, "index", "pods") == 3, "stats over unix: %s", json);
    kvt_client_free(json);
    /* A few async queries over the Unix socket too. */
    uint64_t id;
    CHECK_OK(u, kvt_client_query_submit(u, MODEL, NULL, g_tok, NTOK, NULL, 0, &id));
    uint64_t deadline = now_ms() + 5000;
    while (kvt_client_inflight(u) > 0) {
        struct pollfd p = {.fd = kvt_client_fd(u), .events = POLLIN, .revents = 0};
        (void)poll(&p, 1, 50);
        CHECK_OK(u, kvt_client_progress(u, NULL, NULL));
        CHECK(now_ms() < deadline, "unix async query unanswered");
    }
    kvt_client_destroy(u);

    /* A path where nothing listens. */
    snprintf(addr, sizeof(addr), "unix:%s/none.sock", d1->dir);
    kvt_client_opts_t o;
    kvt_client_opts_default(&o);
    o.address = addr;
    char msg[512];
    kvt_client_t *c = NULL;
    kvt_status_t st = kvt_client_create_msg(&o, &c, msg, sizeof(msg));
    CHECK(st == KVT_ERR_IO && c == NULL && strstr(msg, "connect") != NULL,
          "unix socket without a server: status %d: %s", st, msg);
}

/* ---- fan-out -------------------------------------------------------------------------------- */

static void test_fanout(daemon_t *d2, daemon_t *d3, kvt_client_t *c1, kvt_client_t *w2,
                        kvt_client_t *w3)
{
    g_phase = "fanout";
    /* d2: A holds all 8 blocks (better than d1's A), P2 one block. d3: P3 five blocks on disk,
     * C one block on GPU (worse than d1's C). */
    report_stored(w2, "A", 0, 101, 8, "GPU");
    report_stored(w2, "P2", 0, 201, 1, "GPU");
    report_stored(w3, "P3", 0, 301, 5, "DISK");
    report_stored(w3, "C", 0, 401, 1, "GPU");

    char a2[64], a3[64], dead[64];
    addr_of(d2, a2, sizeof(a2));
    addr_of(d3, a3, sizeof(a3));
    snprintf(dead, sizeof(dead), "127.0.0.1:%d", dead_port());
    kvt_client_t *f2 = client_new(a2, NULL, true, 2000); /* no token: reads still work */
    kvt_client_t *f3 = client_new(a3, NULL, true, 2000);
    kvt_client_t *fd = client_new(dead, NULL, true, 2000);
    kvt_client_t *cs[4] = {c1, f2, fd, f3};

    const want_pod_t merged[] = {
        {"A", 0, 8, 8, 0, 0, 8.0}, {"P3", 0, 5, 0, 0, 5, 2.5}, {"C", 0, 3, 0, 3, 0, 2.4},
        {"B", 1, 2, 2, 0, 0, 2.0}, {"P2", 0, 1, 1, 0, 0, 1.0},
    };
    kvt_client_result_t r;
    memset(&r, 0, sizeof(r));
    uint64_t t0 = now_ms();
    CHECK_OK(c1, kvt_client_fanout_query(cs, 4, MODEL, NULL, g_tok, NTOK, NULL, 0, 3000, &r));
    uint64_t took = now_ms() - t0;
    CHECK(r.asked == 4 && r.answered == 3, "asked %zu answered %zu (want 4, 3)", r.asked,
          r.answered);
    CHECK_RESULT(&r, 8, merged, 5, true);
    CHECK(took < 2500, "fan-out with a dead address took %" PRIu64 " ms", took);
    CHECK(strstr(kvt_client_last_error(fd), "connect") != NULL, "dead sidecar's error: %s",
          kvt_client_last_error(fd));
    kvt_client_result_free(&r);

    /* By keys, with a pod filter. */
    uint64_t keys[NTOK / BS];
    CHECK(kvt_client_hash_tokens(g_tok, NTOK, BS, keys) == NTOK / BS, "hash");
    static const char *const f[] = {"P3", "P2", "B"};
    CHECK_OK(c1, kvt_client_fanout_query_keys(cs, 4, MODEL, NULL, keys, NTOK / BS, f, 3, 3000, &r));
    const want_pod_t mf[] = {merged[1], merged[3], merged[4]};
    CHECK(r.answered == 3, "answered %zu", r.answered);
    CHECK_RESULT(&r, 8, mf, 3, true);
    kvt_client_result_free(&r);

    /* Only the dead one: the call fails with its error and leaves the result alone. */
    memset(&r, 0x77, sizeof(r));
    kvt_client_result_t r0 = r;
    kvt_status_t st = kvt_client_fanout_query(&fd, 1, MODEL, NULL, g_tok, NTOK, NULL, 0, 1000, &r);
    CHECK(st == KVT_ERR_IO, "fan-out to a dead address only: status %d", st);
    CHECK(memcmp(&r, &r0, sizeof(r)) == 0, "result changed by a failed fan-out");
    CHECK(kvt_client_fanout_query(cs, 0, MODEL, NULL, g_tok, NTOK, NULL, 0, 1000, &r) ==
              KVT_ERR_INVAL,
          "n 0");

    /* A stopped daemon times out: skipped within the timeout, then back after SIGCONT. */
    daemon_pause(d3);
    memset(&r, 0, sizeof(r));
    t0 = now_ms();
    st = kvt_client_fanout_query(cs, 4, MODEL, NULL, g_tok, NTOK, NULL, 0, 300, &r);
    took = now_ms() - t0;
    daemon_resume(d3);
    CHECK(st == KVT_OK, "fan-out with a stopped daemon: status %d", st);
    CHECK(r.answered == 2 && r.asked == 4, "answered %zu asked %zu (want 2, 4)", r.answered,
          r.asked);
    CHECK(took >= 250 && took < 1500, "fan-out with a stopped sidecar took %" PRIu64 " ms", took);
    const want_pod_t ms[] = {merged[0], merged[2], merged[3], merged[4]};
    CHECK_RESULT(&r, 8, ms, 4, true);
    CHECK(strstr(kvt_client_last_error(f3), "no answer") != NULL, "stopped sidecar's error: %s",
          kvt_client_last_error(f3));
    kvt_client_result_free(&r);
    CHECK(kvt_client_inflight(f3) == 0, "timed-out sidecar keeps %zu in flight",
          kvt_client_inflight(f3));
    CHECK_OK(c1, kvt_client_fanout_query(cs, 4, MODEL, NULL, g_tok, NTOK, NULL, 0, 3000, &r));
    CHECK(r.answered == 3, "after SIGCONT answered %zu", r.answered);
    CHECK_RESULT(&r, 8, merged, 5, true);
    kvt_client_result_free(&r);
    /* The clients still work on their own. */
    CHECK_OK(f3, kvt_client_ping(f3));
    CHECK_OK(f2, kvt_client_ping(f2));

    kvt_client_destroy(f2);
    kvt_client_destroy(f3);
    kvt_client_destroy(fd);
}

/* ---- io timeout against a stopped daemon ---------------------------------------------------- */

static void test_io_timeout(daemon_t *d1)
{
    g_phase = "io timeout";
    char addr[64];
    addr_of(d1, addr, sizeof(addr));
    kvt_client_t *c = client_new(addr, NULL, false, 300);
    CHECK_OK(c, kvt_client_ping(c));
    daemon_pause(d1);
    kvt_client_result_t r = {0};
    uint64_t t0 = now_ms();
    kvt_status_t st = kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r);
    uint64_t took = now_ms() - t0;
    daemon_resume(d1);
    CHECK(st == KVT_ERR_TIMEOUT, "query to a stopped daemon: status %d: %s", st,
          kvt_client_last_error(c));
    CHECK(took >= 280 && took < 1300, "io timeout 300 ms took %" PRIu64 " ms", took);
    CHECK(r.pods == NULL && r.npods == 0, "result set on failure");
    /* The late answer to the timed-out query must not be taken for the next one's. */
    want_pod_t want[4];
    size_t nw = want_d1(2, NULL, 0, want);
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, 2 * BS, NULL, 0, &r));
    CHECK_RESULT(&r, 2, want, nw, false);
    kvt_client_result_free(&r);
    kvt_client_destroy(c);
}

/* ---- add_engine ----------------------------------------------------------------------------- */

static void test_add_engine(kvt_client_t *c)
{
    g_phase = "add_engine";
    static const char spec[] = "{\"pod\":\"Z\",\"model\":\"m\",\"endpoint\":\"tcp://127.0.0.1:1\"}";
    char *ans = NULL;
    CHECK_OK(c, kvt_client_add_engine(c, spec, strlen(spec), &ans));
    CHECK(ans != NULL && strstr(ans, "\"endpoints\":[\"tcp://127.0.0.1:1\"]") != NULL,
          "add answer %s", ans ? ans : "(null)");
    kvt_client_free(ans);
    kvt_status_t st = kvt_client_add_engine(c, spec, strlen(spec), NULL);
    CHECK(st == KVT_ERR_EXISTS && strstr(kvt_client_last_error(c), "already subscribed"),
          "second add: status %d: %s", st, kvt_client_last_error(c));
    st = kvt_client_add_engine(c, "{\"pod\":1}", 9, NULL);
    CHECK(st == KVT_ERR_INVAL && strstr(kvt_client_last_error(c), "'pod'"),
          "bad add: status %d: %s", st, kvt_client_last_error(c));
    CHECK(kvt_client_add_engine(c, NULL, 0, NULL) == KVT_ERR_INVAL, "NULL body");
    CHECK_OK(c, kvt_client_drop_engine(c, "Z", NULL));
}

/* ---- routed --------------------------------------------------------------------------------- */

/* A router's decision (ROUTED): pod R ranks first for the whole prompt before any event of it. */
static void test_routed(kvt_client_t *c)
{
    g_phase = "routed";
    char json[1024];
    int n = snprintf(json, sizeof(json),
                     "{\"model\":\"" MODEL "\",\"pod\":\"R\",\"ttl_ms\":60000,"
                     "\"token_ids\":[");
    for (size_t i = 0; i < NTOK; i++)
        n += snprintf(json + n, sizeof(json) - (size_t)n, "%s%u", i ? "," : "", g_tok[i]);
    snprintf(json + n, sizeof(json) - (size_t)n, "]}");
    char *ans = NULL;
    CHECK_OK(c, kvt_client_routed(c, json, strlen(json), &ans));
    CHECK(ans != NULL && json_num(ans, NULL, "blocks") == NTOK / BS, "routed answer %s",
          ans ? ans : "(null)");
    kvt_client_free(ans);
    kvt_client_result_t r;
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods >= 1 && strcmp(r.pods[0].pod, "R") == 0 && r.pods[0].matched == NTOK / BS &&
              r.pods[0].gpu == NTOK / BS,
          "routed pod not first with %d speculative blocks", NTOK / BS);
    kvt_client_result_free(&r);
    static const char nopod[] = "{\"model\":\"" MODEL "\",\"block_hashes\":[1]}";
    kvt_status_t st = kvt_client_routed(c, nopod, strlen(nopod), NULL);
    CHECK(st == KVT_ERR_INVAL && strstr(kvt_client_last_error(c), "\"pod\""),
          "routed without pod: status %d: %s", st, kvt_client_last_error(c));
    CHECK(kvt_client_routed(c, NULL, 0, NULL) == KVT_ERR_INVAL, "NULL body");
    CHECK_OK(c, kvt_client_drop_engine(c, "R", NULL));
}

/* ---- drop_engine ---------------------------------------------------------------------------- */

static void test_drop(kvt_client_t *c)
{
    g_phase = "drop_engine";
    char *ans = NULL;
    CHECK_OK(c, kvt_client_drop_engine(c, "B", &ans));
    CHECK(ans != NULL && strstr(ans, "\"pod\":\"B\"") != NULL &&
              json_num(ans, NULL, "dp_ranks") == 1 && json_num(ans, NULL, "entries") == 2,
          "drop answer %s", ans ? ans : "(null)");
    kvt_client_free(ans);
    kvt_client_result_t r;
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    const want_pod_t w[] = {{"A", 0, 4, 4, 0, 0, 4.0}, {"C", 0, 3, 0, 3, 0, 2.4}};
    CHECK_RESULT(&r, 8, w, 2, true);
    kvt_client_result_free(&r);
    kvt_status_t st = kvt_client_drop_engine(c, "B", NULL);
    CHECK(st == KVT_ERR_NOT_FOUND, "second drop: status %d: %s", st, kvt_client_last_error(c));
    char *json = wait_stat(c, "index", "entries", 7);
    /* two drops: engine Z of test_add_engine, then B */
    CHECK(json_num(json, "index", "pods") == 2 && json_num(json, "events", "engines_dropped") == 2,
          "stats after drop: %s", json);
    kvt_client_free(json);
    CHECK_OK(c, kvt_client_drop_engine(c, "A", NULL)); /* no answer wanted */
    test_routed(c);                                    /* on C alone, before the model goes */
    /* a model: every namespace of it goes; a second time it is unknown */
    g_phase = "drop_model";
    CHECK_OK(c, kvt_client_drop_model(c, MODEL, &ans));
    CHECK(ans != NULL && strstr(ans, "\"model\":\"" MODEL "\"") != NULL &&
              json_num(ans, NULL, "namespaces") >= 1,
          "model drop answer %s", ans ? ans : "(null)");
    kvt_client_free(ans);
    CHECK_OK(c, kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 0, "pods after the model drop: %zu", r.npods);
    kvt_client_result_free(&r);
    st = kvt_client_drop_model(c, MODEL, NULL);
    CHECK(st == KVT_ERR_NOT_FOUND, "second model drop: status %d: %s", st,
          kvt_client_last_error(c));
    CHECK(kvt_client_drop_model(c, "", NULL) == KVT_ERR_INVAL, "empty model");
    CHECK(kvt_client_drop_model(NULL, MODEL, NULL) == KVT_ERR_INVAL, "no client");
}

/* ---- reconnect ------------------------------------------------------------------------------ */

enum { BRK_N = 20 };

typedef struct brk_ctx {
    kvt_client_t *c;
    uint64_t ids[BRK_N];
    bool done[BRK_N];
    size_t ncb;
    char bad[256];
} brk_ctx_t;

static void brk_cb(void *arg, uint64_t req_id, kvt_status_t st, const kvt_client_result_t *res)
{
    brk_ctx_t *x = arg;
    x->ncb++;
    for (size_t i = 0; i < BRK_N; i++) {
        if (x->ids[i] != req_id)
            continue;
        if (x->done[i])
            snprintf(x->bad, sizeof(x->bad), "id %" PRIu64 " completed twice", req_id);
        else if ((st != KVT_ERR_CLOSED && st != KVT_ERR_IO) || res != NULL)
            snprintf(x->bad, sizeof(x->bad), "id %" PRIu64 ": status %d (%s), want an error",
                     req_id, st, kvt_client_last_error(x->c));
        x->done[i] = true;
        return;
    }
    snprintf(x->bad, sizeof(x->bad), "completion of unknown id %" PRIu64, req_id);
}

static daemon_t *test_reconnect(daemon_t *d3, kvt_client_t *old)
{
    g_phase = "reconnect";
    int port = d3->rpc_port;
    char listen[64];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    kvt_client_result_t r;
    CHECK_OK(old, kvt_client_ping(old));

    /* Down: the next call fails fast (nothing listens), and says so. */
    daemon_stop(d3);
    memset(&r, 0, sizeof(r));
    uint64_t t0 = now_ms();
    kvt_status_t st = kvt_client_query(old, MODEL, NULL, g_tok, NTOK, NULL, 0, &r);
    CHECK(st == KVT_ERR_IO && strstr(kvt_client_last_error(old), "connect") != NULL,
          "query with the daemon down: status %d: %s", st, kvt_client_last_error(old));
    CHECK(now_ms() - t0 < 2000, "refused connect took %" PRIu64 " ms", now_ms() - t0);
    CHECK(kvt_client_fd(old) < 0, "fd kept after a failed connect");

    /* Up again on the same port: the old client reconnects by itself. */
    daemon_t *n1 = daemon_start(listen, NULL, false, NULL);
    CHECK(n1->rpc_port == port, "restarted on %d, want %d", n1->rpc_port, port);
    CHECK_OK(old, kvt_client_query(old, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 0, "a fresh daemon has %zu pods", r.npods);
    kvt_client_result_free(&r);
    report_stored(old, "P3", 0, 301, 5, "DISK");

    /* Restarted between two calls (no failed call in between): the next query succeeds. */
    daemon_stop(n1);
    daemon_t *n2 = daemon_start(listen, NULL, false, NULL);
    CHECK(n2->rpc_port == port, "restarted on %d, want %d", n2->rpc_port, port);
    CHECK_OK(old, kvt_client_query(old, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 0, "a fresh daemon has %zu pods", r.npods);
    kvt_client_result_free(&r);
    report_stored(old, "P3", 0, 301, 5, "DISK");
    CHECK_OK(old, kvt_client_query(old, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    const want_pod_t w[] = {{"P3", 0, 5, 0, 0, 5, 2.5}};
    CHECK_RESULT(&r, 8, w, 1, true);
    kvt_client_result_free(&r);

    /* Async submit on a connection the server closed: it reconnects too. */
    daemon_stop(n2);
    daemon_t *n3 = daemon_start(listen, NULL, false, NULL);
    uint64_t id;
    CHECK_OK(old, kvt_client_query_submit(old, MODEL, NULL, g_tok, NTOK, NULL, 0, &id));
    uint64_t deadline = now_ms() + 5000;
    while (kvt_client_inflight(old) > 0) {
        struct pollfd p = {.fd = kvt_client_fd(old), .events = POLLIN, .revents = 0};
        (void)poll(&p, 1, 50);
        CHECK_OK(old, kvt_client_progress(old, NULL, NULL));
        CHECK(now_ms() < deadline, "async query after a restart unanswered");
    }

    /* The server dies with queries in flight (stopped, then SIGKILL: it cannot answer any):
     * every one completes once, with the error, and progress() returns it. */
    daemon_pause(n3);
    brk_ctx_t *x = calloc(1, sizeof(*x));
    CHECK(x != NULL, "oom");
    x->c = old;
    for (size_t i = 0; i < BRK_N; i++)
        CHECK_OK(old, kvt_client_query_submit(old, MODEL, NULL, g_tok, NTOK, NULL, 0, &x->ids[i]));
    daemon_kill(n3);
    deadline = now_ms() + 5000;
    st = KVT_OK;
    while (st == KVT_OK) {
        struct pollfd p = {.fd = kvt_client_fd(old), .events = POLLIN, .revents = 0};
        CHECK(p.fd >= 0, "connection closed without an error from progress()");
        (void)poll(&p, 1, 50);
        st = kvt_client_progress(old, brk_cb, x);
        CHECK(now_ms() < deadline, "the broken connection went unnoticed");
    }
    CHECK(st == KVT_ERR_CLOSED || st == KVT_ERR_IO, "progress: status %d: %s", st,
          kvt_client_last_error(old));
    CHECK(x->bad[0] == '\0', "%s", x->bad);
    CHECK(x->ncb == BRK_N && kvt_client_inflight(old) == 0 && kvt_client_fd(old) < 0,
          "%zu of %d completed, %zu in flight", x->ncb, BRK_N, kvt_client_inflight(old));
    free(x);
    CHECK(kvt_client_query_submit(old, MODEL, NULL, g_tok, NTOK, NULL, 0, &id) == KVT_ERR_IO,
          "submit with nothing listening: %s", kvt_client_last_error(old));
    daemon_t *n4 = daemon_start(listen, NULL, false, NULL);
    CHECK_OK(old, kvt_client_query_submit(old, MODEL, NULL, g_tok, NTOK, NULL, 0, &id));
    deadline = now_ms() + 5000;
    while (kvt_client_inflight(old) > 0) {
        struct pollfd p = {.fd = kvt_client_fd(old), .events = POLLIN, .revents = 0};
        (void)poll(&p, 1, 50);
        CHECK_OK(old, kvt_client_progress(old, NULL, NULL));
        CHECK(now_ms() < deadline, "async query after a crash unanswered");
    }
    return n4;
}

/* ---- auth ----------------------------------------------------------------------------------- */

static void test_auth(daemon_t *d2, kvt_client_t *with_token)
{
    g_phase = "auth";
    char addr[64];
    addr_of(d2, addr, sizeof(addr));
    kvt_client_t *anon = client_new(addr, NULL, false, 5000);
    kvt_client_result_t r;
    CHECK_OK(anon, kvt_client_query(anon, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 2, "reads without a token: %zu pods", r.npods);
    kvt_client_result_free(&r);
    char *json = NULL;
    CHECK_OK(anon, kvt_client_stats(anon, &json));
    kvt_client_free(json);

    char *ev = stored_json("Q", 0, 501, 2, "GPU");
    char *ans = (char *)(uintptr_t)1;
    kvt_status_t st = kvt_client_report_events(anon, ev, strlen(ev), &ans);
    const char *msg = kvt_client_last_error(anon);
    CHECK(st != KVT_OK && strstr(msg, "token") != NULL && strstr(msg, "(401)") != NULL,
          "events without the token: status %d: %s", st, msg);
    CHECK(ans == (char *)(uintptr_t)1, "answer set on failure");
    st = kvt_client_drop_engine(anon, "P2", NULL);
    CHECK(st != KVT_OK && strstr(kvt_client_last_error(anon), "(401)") != NULL,
          "drop without the token: status %d: %s", st, kvt_client_last_error(anon));
    CHECK_OK(anon, kvt_client_ping(anon)); /* still connected */

    /* A wrong token fails the connect. */
    kvt_client_opts_t o;
    kvt_client_opts_default(&o);
    o.address = addr;
    o.auth_token = "wrong";
    char emsg[512];
    kvt_client_t *bad = NULL;
    st = kvt_client_create_msg(&o, &bad, emsg, sizeof(emsg));
    CHECK(st != KVT_OK && bad == NULL && strstr(emsg, "hello refused") != NULL &&
              strstr(emsg, "(401)") != NULL,
          "wrong token: status %d: %s", st, emsg);
    /* ... and, lazily, the first call. */
    o.lazy_connect = true;
    CHECK(kvt_client_create_msg(&o, &bad, emsg, sizeof(emsg)) == KVT_OK, "lazy create: %s", emsg);
    CHECK(kvt_client_ping(bad) != KVT_OK &&
              strstr(kvt_client_last_error(bad), "hello refused") != NULL,
          "lazy wrong token: %s", kvt_client_last_error(bad));
    kvt_client_destroy(bad);

    /* Nothing changed; with the token it works. */
    CHECK_OK(anon, kvt_client_query(anon, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 2, "unauthorized events changed the index: %zu pods", r.npods);
    kvt_client_result_free(&r);
    char *ok = NULL;
    CHECK_OK(with_token, kvt_client_report_events(with_token, ev, strlen(ev), &ok));
    CHECK(json_num(ok, NULL, "applied") == 1, "answer %s", ok);
    kvt_client_free(ok);
    CHECK_OK(anon, kvt_client_query(anon, MODEL, NULL, g_tok, NTOK, NULL, 0, &r));
    CHECK(r.npods == 3, "after the authorized batch: %zu pods", r.npods);
    kvt_client_result_free(&r);
    CHECK_OK(with_token, kvt_client_drop_engine(with_token, "Q", NULL));
    free(ev);
    kvt_client_destroy(anon);
}

/* ---- timeouts against a socket that never answers ------------------------------------------- */

static void test_timeouts(void)
{
    g_phase = "timeouts";
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(ls >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    CHECK(bind(ls, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind: %s", strerror(errno));
    CHECK(listen(ls, 16) == 0, "listen: %s", strerror(errno));
    CHECK(getsockname(ls, (struct sockaddr *)&sa, &len) == 0, "getsockname");
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(sa.sin_port));

    kvt_client_opts_t o;
    kvt_client_opts_default(&o);
    o.address = addr;
    o.connect_timeout_ms = 300;
    o.io_timeout_ms = 300;
    char msg[512];
    kvt_client_t *c = NULL;

    /* Eager create: the TCP connect succeeds (backlog), HELLO never gets an answer. */
    uint64_t t0 = now_ms();
    kvt_status_t st = kvt_client_create_msg(&o, &c, msg, sizeof(msg));
    uint64_t took = now_ms() - t0;
    CHECK(st == KVT_ERR_TIMEOUT && c == NULL, "create: status %d: %s", st, msg);
    CHECK(strstr(msg, "timed out") != NULL, "message %s", msg);
    CHECK(took >= 280 && took < 1300, "create with a 300 ms timeout took %" PRIu64 " ms", took);

    /* Lazy: each call times out within the timeout. */
    o.lazy_connect = true;
    CHECK(kvt_client_create_msg(&o, &c, msg, sizeof(msg)) == KVT_OK, "lazy create: %s", msg);
    kvt_client_result_t r = {0};
    t0 = now_ms();
    st = kvt_client_query(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &r);
    took = now_ms() - t0;
    CHECK(st == KVT_ERR_TIMEOUT, "query: status %d: %s", st, kvt_client_last_error(c));
    CHECK(took >= 280 && took < 1300, "query with a 300 ms timeout took %" PRIu64 " ms", took);
    t0 = now_ms();
    st = kvt_client_ping(c);
    took = now_ms() - t0;
    CHECK(st == KVT_ERR_TIMEOUT && took >= 280 && took < 1300, "ping: status %d in %" PRIu64 " ms",
          st, took);
    uint64_t id;
    t0 = now_ms();
    st = kvt_client_query_submit(c, MODEL, NULL, g_tok, NTOK, NULL, 0, &id);
    took = now_ms() - t0;
    CHECK(st == KVT_ERR_TIMEOUT && took < 1300, "submit: status %d in %" PRIu64 " ms", st, took);
    CHECK(kvt_client_inflight(c) == 0, "failed submit left a query in flight");
    kvt_client_t *one[1] = {c};
    t0 = now_ms();
    st = kvt_client_fanout_query(one, 1, MODEL, NULL, g_tok, NTOK, NULL, 0, 200, &r);
    took = now_ms() - t0;
    CHECK(st == KVT_ERR_TIMEOUT && took < 1000, "fan-out: status %d in %" PRIu64 " ms", st, took);
    kvt_client_destroy(c);

    /* Refused connections fail at once with KVT_ERR_IO. */
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", dead_port());
    o.lazy_connect = false;
    t0 = now_ms();
    st = kvt_client_create_msg(&o, &c, msg, sizeof(msg));
    CHECK(st == KVT_ERR_IO && strstr(msg, "connect") != NULL && now_ms() - t0 < 300,
          "refused: status %d: %s", st, msg);
    close(ls);
}

/* ---- tiers ---------------------------------------------------------------------------------- */

#define TMODEL "tm"
#define TBLOCK (64 * 1024) /* --block-bytes */
#define TSLOTS 16          /* --ram-bytes 1MiB of 64 KiB slots */

/* Why kvtierd cannot keep an NVMe store under the temp dir here (io_uring refused, or a file
 * system without O_DIRECT), or NULL. */
static const char *tier_disk_unsupported(char *why, size_t cap)
{
#ifdef __NR_io_uring_setup
    uint64_t params[16]; /* struct io_uring_params is 120 bytes */
    memset(params, 0, sizeof(params));
    int ring = (int)syscall(__NR_io_uring_setup, 2u, params);
    if (ring < 0) {
        snprintf(why, cap, "io_uring refused: %s", strerror(errno));
        return why;
    }
    close(ring);
#else
    snprintf(why, cap, "no io_uring in this system's headers");
    return why;
#endif
    const char *tmp = getenv("TMPDIR");
    char path[200];
    snprintf(path, sizeof(path), "%s/kvt_odirect_XXXXXX",
             tmp != NULL && tmp[0] != '\0' && strlen(tmp) < 64 ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) {
        snprintf(why, cap, "mkstemp %s: %s", path, strerror(errno));
        return why;
    }
    int rc = fcntl(fd, F_SETFL, O_DIRECT), e = errno; /* what the disk store does */
    close(fd);
    unlink(path);
    if (rc != 0) {
        snprintf(why, cap, "O_DIRECT refused in %s: %s", path, strerror(e));
        return why;
    }
    return NULL;
}

/* The bytes of block @key (its first @len), a pattern of its own. */
static void fill_block(uint8_t *p, size_t len, uint64_t key)
{
    uint64_t x = key * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static bool block_is(const void *p, size_t len, uint64_t key)
{
    static uint8_t want[TBLOCK];
    if (p == NULL || len > sizeof(want))
        return false;
    fill_block(want, len, key);
    return memcmp(p, want, len) == 0;
}

/* Polls stats until tiers.@section.@key is @want (pinned and reserved: /v1/stats's JSON). */
static void wait_tier(kvt_client_t *c, const char *section, const char *key, long long want)
{
    kvt_client_free(wait_stat(c, section, key, want));
}

static uint32_t lookup_hit(kvt_client_t *c, const uint64_t *keys, size_t n, uint8_t *loc)
{
    uint32_t hit = UINT32_MAX;
    CHECK_OK(c, kvt_client_lookup(c, TMODEL, NULL, keys, n, loc, &hit));
    CHECK(hit <= n, "lookup: hit %u of %zu keys", hit, n);
    return hit;
}

/* ATTACH: refused over TCP, the geometry over the Unix socket, two mappings of one arena. */
static void tier_attach(kvt_client_t *u, kvt_client_t *t, bool disk, kvt_client_arena_t *a,
                        kvt_client_arena_t *a2)
{
    g_phase = "tiers: attach";
    kvt_client_arena_t before, none = {0};
    memset(a, 0x5a, sizeof(*a));
    before = *a;
    kvt_status_t st = kvt_client_attach(t, a);
    CHECK(st == KVT_ERR_INVAL && strstr(kvt_client_last_error(t), "Unix socket") != NULL,
          "attach over TCP: status %d: %s", st, kvt_client_last_error(t));
    CHECK(memcmp(a, &before, sizeof(*a)) == 0, "arena set on failure");
    CHECK_OK(u, kvt_client_attach(u, a));
    CHECK(a->base != NULL && a->fd >= 0 && a->block_bytes == TBLOCK && a->slot_bytes >= TBLOCK &&
              a->slot_bytes % 4096 == 0 && a->nslots == TSLOTS &&
              a->slot_off + (size_t)a->nslots * a->slot_bytes <= a->map_bytes &&
              (a->disk_slots > 0) == disk,
          "geometry: map %zu, slot_off %zu, slot_bytes %u, nslots %u, block %u, disk %u",
          a->map_bytes, a->slot_off, a->slot_bytes, a->nslots, a->block_bytes, a->disk_slots);
    CHECK((fcntl(a->fd, F_GETFD) & FD_CLOEXEC) != 0, "the arena's fd is not close-on-exec");
    uint8_t *s0 = (uint8_t *)a->base + a->slot_off;
    CHECK(kvt_client_arena_slot(a, 0) == s0 && kvt_client_arena_slot(a, 1) == s0 + a->slot_bytes &&
              kvt_client_arena_slot(a, a->nslots - 1) ==
                  s0 + (size_t)(a->nslots - 1) * a->slot_bytes &&
              kvt_client_arena_slot(a, a->nslots) == NULL &&
              kvt_client_arena_slot(a, KVT_CLIENT_SLOT_NONE) == NULL &&
              kvt_client_arena_slot(NULL, 0) == NULL && kvt_client_arena_slot(&none, 0) == NULL,
          "slot addresses");
    CHECK_OK(u, kvt_client_attach(u, a2));
    CHECK(a2->base != a->base && a2->fd != a->fd && a2->map_bytes == a->map_bytes,
          "a second attach is a second mapping");
}

/* RESERVE, write through the mapping, COMMIT, LOOKUP, PIN (the bytes), UNPIN. */
static void tier_data_plane(kvt_client_t *u, const kvt_client_arena_t *a,
                            const kvt_client_arena_t *a2)
{
    g_phase = "tiers: reserve and commit";
    enum { NK = 4 };
    const uint64_t keys[NK] = {0x1001, 0x1002, 0x1003, 0x1004};
    const uint32_t lens[NK] = {TBLOCK, TBLOCK, 1000, 0 /* block_bytes */};
    uint8_t loc[NK];
    uint32_t slots[NK], again[NK], done = 99;
    uint64_t ev[NK];
    size_t nev = 99;
    CHECK(lookup_hit(u, keys, NK, loc) == 0, "lookup before anything is stored");
    CHECK_OK(u, kvt_client_reserve(u, TMODEL, NULL, keys, NK, slots, ev, NK, &nev));
    CHECK(nev == 0, "%zu keys evicted from an empty arena", nev);
    for (size_t i = 0; i < NK; i++) {
        CHECK(slots[i] < a->nslots, "key %zu: slot %u", i, slots[i]);
        for (size_t j = 0; j < i; j++)
            CHECK(slots[i] != slots[j], "keys %zu and %zu share slot %u", i, j, slots[i]);
    }
    CHECK_OK(u, kvt_client_reserve(u, TMODEL, NULL, keys, NK, again, NULL, 0, NULL));
    for (size_t i = 0; i < NK; i++)
        CHECK(again[i] == KVT_CLIENT_SLOT_NONE, "key %zu reserved twice: slot %u", i, again[i]);
    wait_tier(u, "ram", "reserved", NK);
    CHECK(lookup_hit(u, keys, NK, loc) == 0, "a reservation is visible before its commit");
    for (size_t i = 0; i < NK; i++)
        fill_block(kvt_client_arena_slot(a, slots[i]), lens[i] != 0 ? lens[i] : TBLOCK, keys[i]);
    /* a length over block_bytes: the server refuses, nothing changes, the connection stays */
    const uint32_t bad[NK] = {TBLOCK, TBLOCK + 1, 1, 1};
    kvt_status_t st = kvt_client_commit(u, TMODEL, NULL, keys, NK, bad, true, &done);
    CHECK(st == KVT_ERR_INVAL && done == 99 && strstr(kvt_client_last_error(u), "(400)") != NULL,
          "commit of a block over block_bytes: status %d, done %u: %s", st, done,
          kvt_client_last_error(u));
    CHECK_OK(u, kvt_client_commit(u, TMODEL, NULL, keys, NK, lens, true, &done));
    CHECK(done == NK, "commit ended %u reservations", done);
    CHECK_OK(u, kvt_client_commit(u, TMODEL, NULL, keys, NK, NULL, true, &done));
    CHECK(done == 0, "a second commit ended %u reservations", done);
    wait_tier(u, "ram", "reserved", 0);
    CHECK(lookup_hit(u, keys, NK, loc) == NK, "lookup after the commit");
    for (size_t i = 0; i < NK; i++)
        CHECK(loc[i] == KVT_CLIENT_LOC_RAM, "key %zu: location %u", i, loc[i]);
    const uint64_t gap[NK] = {keys[0], keys[1], 0xdead, keys[3]};
    CHECK(lookup_hit(u, gap, NK, loc) == 2, "lookup stops at the first block not held");
    uint32_t hit = 99;
    CHECK_OK(u, kvt_client_lookup(u, TMODEL, "other-lora", keys, NK, loc, &hit));
    CHECK(hit == 0, "another namespace holds %u of the blocks", hit);

    g_phase = "tiers: pin";
    kvt_client_pinned_t pins[NK];
    CHECK_OK(u, kvt_client_pin(u, TMODEL, NULL, keys, NK, pins));
    for (size_t i = 0; i < NK; i++) {
        uint32_t len = lens[i] != 0 ? lens[i] : TBLOCK;
        CHECK(pins[i].slot < a->nslots && pins[i].len == len, "pin %zu: slot %u, len %u", i,
              pins[i].slot, pins[i].len);
        CHECK(block_is(kvt_client_arena_slot(a, pins[i].slot), len, keys[i]) &&
                  block_is(kvt_client_arena_slot(a2, pins[i].slot), len, keys[i]),
              "pinned block %zu: other bytes through the mapping", i);
    }
    wait_tier(u, "ram", "pinned", NK);
    const uint64_t missing = 0xdead;
    kvt_client_pinned_t mp;
    CHECK_OK(u, kvt_client_pin(u, TMODEL, NULL, &missing, 1, &mp));
    CHECK(mp.slot == KVT_CLIENT_SLOT_NONE, "a block not held pinned at slot %u", mp.slot);
    /* The block API reads what the engine wrote; a pinned block cannot be deleted. */
    uint8_t buf[2048];
    size_t len = 0;
    CHECK_OK(u, kvt_client_block_get(u, TMODEL, NULL, keys[2], buf, sizeof(buf), &len));
    CHECK(len == 1000 && block_is(buf, len, keys[2]), "block get of a committed block: %zu", len);
    st = kvt_client_block_delete(u, TMODEL, NULL, keys[0]);
    CHECK(st == KVT_ERR_EXISTS, "delete of a pinned block: status %d: %s", st,
          kvt_client_last_error(u));
    CHECK_OK(u, kvt_client_unpin(u, TMODEL, NULL, keys, NK, &done));
    CHECK(done == NK, "unpin released %u pins", done);
    CHECK_OK(u, kvt_client_unpin(u, TMODEL, NULL, keys, NK, NULL));
    wait_tier(u, "ram", "pinned", 0);

    g_phase = "tiers: commit without ok";
    const uint64_t k5 = 0x1005;
    uint32_t s5;
    CHECK_OK(u, kvt_client_reserve(u, TMODEL, NULL, &k5, 1, &s5, NULL, 0, NULL));
    CHECK(s5 < a->nslots, "slot %u", s5);
    CHECK_OK(u, kvt_client_commit(u, TMODEL, NULL, &k5, 1, NULL, false, &done));
    CHECK(done == 1, "commit(ok=false) ended %u reservations", done);
    CHECK(lookup_hit(u, &k5, 1, loc) == 0, "a block given back is visible");
    wait_tier(u, "ram", "reserved", 0);
}

/* BLOCK_PUT, _GET, _DELETE: byte equality, not found, too big, local refusals. */
static void tier_blocks(kvt_client_t *u, kvt_client_t *t)
{
    g_phase = "tiers: block api";
    static uint8_t buf[TBLOCK + 1];
    const uint64_t bk = 0x2001, small_k = 0x2002;
    size_t len = 0;
    fill_block(buf, TBLOCK, bk);
    CHECK_OK(u, kvt_client_block_put(u, TMODEL, NULL, bk, buf, TBLOCK, false));
    CHECK_OK(u, kvt_client_block_put(u, TMODEL, NULL, bk, buf, TBLOCK, false)); /* held: kept */
    memset(buf, 0, sizeof(buf));
    CHECK_OK(u, kvt_client_block_get(u, TMODEL, NULL, bk, buf, TBLOCK, &len));
    CHECK(len == TBLOCK && block_is(buf, len, bk), "block get: %zu bytes, or other bytes", len);
    /* the block API on the TCP socket too; the data plane sees the block */
    memset(buf, 0, sizeof(buf));
    CHECK_OK(t, kvt_client_block_get(t, TMODEL, NULL, bk, buf, sizeof(buf), &len));
    CHECK(len == TBLOCK && block_is(buf, len, bk), "block get over TCP: %zu bytes", len);
    uint8_t loc;
    CHECK(lookup_hit(u, &bk, 1, &loc) == 1 && loc == KVT_CLIENT_LOC_RAM, "lookup of a put block");
    /* a short buffer: KVT_ERR_TOO_BIG with the block's length, the buffer untouched */
    uint8_t small[16];
    memset(small, 0xee, sizeof(small));
    len = 0;
    kvt_status_t st = kvt_client_block_get(u, TMODEL, NULL, bk, small, sizeof(small), &len);
    bool untouched = true;
    for (size_t i = 0; i < sizeof(small); i++)
        untouched = untouched && small[i] == 0xee;
    CHECK(st == KVT_ERR_TOO_BIG && len == TBLOCK && untouched,
          "block get into 16 bytes: status %d, len %zu", st, len);
    len = 0;
    st = kvt_client_block_get(u, TMODEL, NULL, bk, NULL, 0, &len);
    CHECK(st == KVT_ERR_TOO_BIG && len == TBLOCK, "block length probe: status %d, len %zu", st,
          len);
    /* a block smaller than a slot */
    fill_block(buf, 777, small_k);
    CHECK_OK(u, kvt_client_block_put(u, TMODEL, "", small_k, buf, 777, false));
    memset(buf, 0, sizeof(buf));
    CHECK_OK(u, kvt_client_block_get(u, TMODEL, NULL, small_k, buf, sizeof(buf), &len));
    CHECK(len == 777 && block_is(buf, len, small_k), "small block: %zu bytes", len);
    /* delete, then not found */
    CHECK_OK(u, kvt_client_block_delete(u, TMODEL, NULL, bk));
    len = 12345;
    st = kvt_client_block_get(u, TMODEL, NULL, bk, buf, sizeof(buf), &len);
    CHECK(st == KVT_ERR_NOT_FOUND && len == 12345 &&
              strstr(kvt_client_last_error(u), "(404)") != NULL,
          "get after delete: status %d, len %zu: %s", st, len, kvt_client_last_error(u));
    st = kvt_client_block_delete(u, TMODEL, NULL, bk);
    CHECK(st == KVT_ERR_NOT_FOUND, "second delete: status %d", st);
    st = kvt_client_block_get(u, "other-model", NULL, small_k, buf, sizeof(buf), &len);
    CHECK(st == KVT_ERR_NOT_FOUND, "a block of another model: status %d", st);
    /* larger than a slot: the server refuses it (413) and stores nothing */
    fill_block(buf, TBLOCK + 1, 0x2003);
    st = kvt_client_block_put(u, TMODEL, NULL, 0x2003, buf, TBLOCK + 1, false);
    CHECK(st == KVT_ERR_TOO_BIG && strstr(kvt_client_last_error(u), "(413)") != NULL,
          "put of a block over block_bytes: status %d: %s", st, kvt_client_last_error(u));
    st = kvt_client_block_get(u, TMODEL, NULL, 0x2003, buf, sizeof(buf), &len);
    CHECK(st == KVT_ERR_NOT_FOUND, "a refused block was stored: status %d", st);
    CHECK_OK(u, kvt_client_ping(u)); /* the connection survived every refusal */

    g_phase = "tiers: local refusals";
    char longname[300];
    memset(longname, 'l', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    uint32_t hit, slot;
    struct {
        kvt_status_t st;
        const char *what;
    } local[] = {
        {kvt_client_block_put(u, TMODEL, NULL, 1, buf, 0, false), "put of 0 bytes"},
        {kvt_client_block_put(u, TMODEL, NULL, 1, NULL, 10, false), "put of NULL"},
        {kvt_client_block_put(u, "", NULL, 1, buf, 10, false), "empty model"},
        {kvt_client_block_get(u, NULL, NULL, 1, buf, 10, &len), "NULL model"},
        {kvt_client_block_delete(u, TMODEL, longname, 1), "long lora"},
        {kvt_client_lookup(u, TMODEL, NULL, &bk, 0, &loc, &hit), "lookup of 0 keys"},
        {kvt_client_lookup(u, TMODEL, NULL, NULL, 1, &loc, &hit), "lookup of NULL keys"},
        {kvt_client_lookup(u, longname, NULL, &bk, 1, &loc, &hit), "long model"},
        {kvt_client_reserve(u, TMODEL, NULL, &bk, 1, NULL, NULL, 0, NULL), "NULL slots"},
        {kvt_client_reserve(u, TMODEL, NULL, &bk, 1, &slot, NULL, 4, NULL), "NULL evicted"},
        {kvt_client_pin(u, TMODEL, NULL, &bk, 1, NULL), "NULL pins"},
        {kvt_client_commit(u, TMODEL, NULL, NULL, 1, NULL, true, NULL), "commit of NULL keys"},
        {kvt_client_unpin(u, TMODEL, NULL, &bk, 0, NULL), "unpin of 0 keys"},
        {kvt_client_prefetch(u, "", NULL, &bk, 1, NULL), "prefetch of an empty model"},
        {kvt_client_block_get(u, TMODEL, NULL, 1, NULL, 10, &len), "get into NULL"},
    };
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
        CHECK(local[i].st == KVT_ERR_INVAL, "%s: status %d, want KVT_ERR_INVAL", local[i].what,
              local[i].st);
    CHECK(kvt_client_attach(NULL, NULL) == KVT_ERR_INVAL &&
              kvt_client_lookup(NULL, TMODEL, NULL, &bk, 1, &loc, &hit) == KVT_ERR_INVAL,
          "NULL client");
}

/* A durable put reaches NVMe; evicted from RAM, its block comes back through PIN byte-exact. */
static void tier_disk(kvt_client_t *u, const kvt_client_arena_t *a, const char *nodisk)
{
    g_phase = "tiers: durable";
    static uint8_t buf[TBLOCK];
    const uint64_t dk = 0x3001;
    fill_block(buf, TBLOCK, dk);
    kvt_status_t st = kvt_client_block_put(u, TMODEL, NULL, dk, buf, TBLOCK, true);
    if (nodisk != NULL) {
        CHECK(st == KVT_ERR_UNSUPPORTED, "durable put without a disk: status %d: %s", st,
              kvt_client_last_error(u));
        printf("test_client: tiers: NVMe checks skipped: %s\n", nodisk);
        return;
    }
    CHECK_OK(u, st);
    wait_tier(u, "disk", "used", 1); /* the only block on NVMe so far */
    /* other blocks push it out of RAM; it stays on NVMe */
    uint8_t loc = 0;
    for (uint64_t k = 0x4000; k < 0x4000 + 4 * TSLOTS && loc != KVT_CLIENT_LOC_DISK; k++) {
        fill_block(buf, TBLOCK, k);
        CHECK_OK(u, kvt_client_block_put(u, TMODEL, NULL, k, buf, TBLOCK, false));
        CHECK(lookup_hit(u, &dk, 1, &loc) == 1, "the durable block was lost from both tiers");
    }
    CHECK(loc == KVT_CLIENT_LOC_DISK, "the durable block never left RAM");
    uint32_t started = 99;
    CHECK_OK(u, kvt_client_prefetch(u, TMODEL, NULL, &dk, 1, &started));
    CHECK(started <= 1, "prefetch of one key started %u reads", started);
    kvt_client_pinned_t p;
    CHECK_OK(u, kvt_client_pin(u, TMODEL, NULL, &dk, 1, &p));
    CHECK(p.slot < a->nslots && p.len == TBLOCK, "pin of a block on NVMe: slot %u, len %u", p.slot,
          p.len);
    CHECK(block_is(kvt_client_arena_slot(a, p.slot), TBLOCK, dk),
          "a block read back from NVMe differs");
    CHECK(lookup_hit(u, &dk, 1, &loc) == 1 && loc == KVT_CLIENT_LOC_RAM, "pinned, not in RAM");
    CHECK_OK(u, kvt_client_unpin(u, TMODEL, NULL, &dk, 1, NULL));
    size_t len = 0;
    memset(buf, 0, sizeof(buf));
    CHECK_OK(u, kvt_client_block_get(u, TMODEL, NULL, dk, buf, sizeof(buf), &len));
    CHECK(len == TBLOCK && block_is(buf, len, dk), "durable block: %zu bytes, or other bytes", len);
}

/* An engine connection that goes away holding pins and reservations: all released. */
static void tier_session_end(kvt_client_t *u, const char *addr)
{
    g_phase = "tiers: session end";
    static uint8_t buf[TBLOCK];
    const uint64_t pk[2] = {0x5001, 0x5002}, rk = 0x5003;
    for (size_t i = 0; i < 2; i++) {
        fill_block(buf, TBLOCK, pk[i]);
        CHECK_OK(u, kvt_client_block_put(u, TMODEL, NULL, pk[i], buf, TBLOCK, false));
    }
    kvt_client_t *e = client_new(addr, NULL, false, 5000);
    kvt_client_pinned_t pins[2];
    uint32_t slot;
    CHECK_OK(e, kvt_client_pin(e, TMODEL, NULL, pk, 2, pins));
    CHECK(pins[0].slot != KVT_CLIENT_SLOT_NONE && pins[1].slot != KVT_CLIENT_SLOT_NONE,
          "pins of held blocks");
    CHECK_OK(e, kvt_client_reserve(e, TMODEL, NULL, &rk, 1, &slot, NULL, 0, NULL));
    CHECK(slot != KVT_CLIENT_SLOT_NONE, "no slot for a reservation");
    wait_tier(u, "ram", "pinned", 2);
    wait_tier(u, "ram", "reserved", 1);
    CHECK(kvt_client_block_delete(u, TMODEL, NULL, pk[0]) == KVT_ERR_EXISTS,
          "another connection's pin does not hold the block");
    kvt_client_destroy(e);
    wait_tier(u, "ram", "pinned", 0);
    wait_tier(u, "ram", "reserved", 0);
    CHECK_OK(u, kvt_client_block_delete(u, TMODEL, NULL, pk[0]));
    uint8_t loc;
    CHECK(lookup_hit(u, &rk, 1, &loc) == 0, "an uncommitted reservation became a block");
}

/*
 * A kvtierd with tiers (--ram-bytes, --block-bytes, and an NVMe store in its
 * temp dir unless @nodisk says why not), driven through the Unix socket
 * (ATTACH and the data plane) and TCP (the block API); @c1 talks to a
 * kvtierd without tiers.
 */
static void test_tiers(daemon_t *dt, kvt_client_t *c1, const char *nodisk)
{
    char addr[200];
    snprintf(addr, sizeof(addr), "unix:%s", dt->sock);
    kvt_client_t *u = client_new(addr, NULL, false, 5000);
    kvt_client_t *t = client_for(dt, NULL);
    kvt_client_arena_t a, a2;

    tier_attach(u, t, nodisk == NULL, &a, &a2);
    tier_data_plane(u, &a, &a2);
    tier_blocks(u, t);
    tier_disk(u, &a, nodisk);
    tier_session_end(u, addr);

    g_phase = "tiers: a kvtierd without tiers";
    const uint64_t k = 1;
    uint8_t loc;
    uint32_t hit;
    kvt_status_t st = kvt_client_lookup(c1, TMODEL, NULL, &k, 1, &loc, &hit);
    CHECK(st == KVT_ERR_UNSUPPORTED && strstr(kvt_client_last_error(c1), "(501)") != NULL,
          "lookup without tiers: status %d: %s", st, kvt_client_last_error(c1));

    g_phase = "tiers: detach";
    int fd = a.fd;
    kvt_client_detach(&a);
    CHECK(a.base == NULL && a.fd == -1 && a.nslots == 0, "detach leaves the arena set");
    CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "detach left the arena's fd open");
    kvt_client_detach(&a);
    kvt_client_detach(NULL);
    kvt_client_arena_t zero = {0};
    kvt_client_detach(&zero);
    CHECK(fcntl(0, F_GETFD) != -1 || errno != EBADF, "detach of a zeroed arena closed fd 0");
    /* the mapping is the caller's: it outlives the client */
    kvt_client_destroy(u);
    kvt_client_destroy(t);
    volatile uint8_t *p = kvt_client_arena_slot(&a2, 0);
    (void)p[0];
    kvt_client_detach(&a2);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/kvtierd\n", argv[0]);
        return 2;
    }
    g_bin = argv[1];
    if (access(g_bin, X_OK) != 0) {
        fprintf(stderr, "%s: %s\n", g_bin, strerror(errno));
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    for (size_t i = 0; i < NTOK; i++)
        g_tok[i] = (uint32_t)(100 + i);
    uint64_t t0 = now_ms();

    test_local();

    static const char *const d2_flags[] = {"--rpc-max-frame", "64KiB", "--max-query-tokens", "1000",
                                           NULL};
    daemon_t *d1 = daemon_start("127.0.0.1:0", NULL, true, NULL);
    daemon_t *d2 = daemon_start("127.0.0.1:0", TOKEN, false, d2_flags);
    daemon_t *d3 = daemon_start("127.0.0.1:0", NULL, false, NULL);
    daemon_t *d4 = daemon_start("127.0.0.1:0", NULL, false, NULL);
    char why[256];
    const char *nodisk = tier_disk_unsupported(why, sizeof(why));
    /* tiers: an NVMe store in its temp dir where this machine allows one (the first 4 flags) */
    static const char *const dt_flags[] = {"--disk-path",   "@/disk",      "--disk-bytes",
                                           "8MiB",          "--ram-bytes", "1MiB",
                                           "--block-bytes", "64KiB",       NULL};
    daemon_t *dt = daemon_start("127.0.0.1:0", NULL, true, dt_flags + (nodisk == NULL ? 0 : 4));
    kvt_client_t *c1 = client_for(d1, NULL);
    kvt_client_t *w2 = client_for(d2, TOKEN);
    kvt_client_t *w3 = client_for(d3, NULL);

    test_sync(d1, c1);
    test_salt(d4, c1);
    test_async(c1);
    test_unix(d1);
    test_limits(w2);
    test_big_answer(w3);
    test_fanout(d2, d3, c1, w2, w3);
    test_io_timeout(d1);
    test_auth(d2, w2);
    test_add_engine(c1);
    test_drop(c1);
    daemon_t *d3b = test_reconnect(d3, w3);
    test_timeouts();
    test_tiers(dt, c1, nodisk);

    g_phase = "shutdown";
    kvt_client_destroy(c1);
    kvt_client_destroy(w2);
    kvt_client_destroy(w3);
    daemon_stop(d1);
    daemon_stop(d2);
    daemon_stop(d3b);
    daemon_stop(d4);
    daemon_stop(dt);
    struct stat sb;
    CHECK(stat(d1->sock, &sb) != 0, "kvtierd left its Unix socket %s behind", d1->sock);
    cleanup_all(false);
    printf("test_client: all passed in %" PRIu64 " ms\n", now_ms() - t0);
    return 0;
}
