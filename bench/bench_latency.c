/*
 * `kvtier-bench latency`: the latency a router sees from kvtierd, with
 * redis-server's GET measured by the same client in the same run as the
 * yardstick (docs/performance.md, "Latency as a router sees it").
 *
 * A router sends one query per routing decision and waits for its answer
 * before it routes that request: one request in flight per connection, no
 * pipelining. So every point here keeps at most one request in flight on each
 * connection:
 *   - closed loop at C connections (default 1, 4, 16): each answer is
 *     followed by the next request on its connection at once;
 *   - open loop at fixed rates (default 0.1, 0.25, 0.5 and 0.75 of the
 *     closed-loop throughput at the largest C, the lower of the two
 *     servers'): Poisson arrivals on a pool of that many connections; a
 *     request whose time has come waits in the client for a free connection,
 *     and its latency runs from its *scheduled* time to its answer, so time
 *     spent queued anywhere is counted (no coordinated omission).
 *
 * One client loop serves both servers; only the request bytes and the
 * answer parser differ (bl_proto_t): kvtierd gets binary RPC QUERY frames
 * (bench_rpc's workload: prompts of 1,024 tokens over 64 pods that all hold
 * the shared prefix), redis-server gets RESP "GET key" of a 16-byte value.
 * Both servers run on loopback on the same cores. Fairness: the server not
 * being measured is stopped (SIGSTOP) so it takes no CPU; each point is cut
 * into slices measured alternately (kvtierd, redis, redis, kvtierd, ...) so
 * both see the same spells of a noisy machine; both get the same arrival
 * times (same seed) and a short untimed warm-up on fresh connections.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_latency.h"
#include "common/clock.h"
#include "proto/proto.h"

typedef struct bl_opts {
    const char *kvtierd;
    const char *redis; /* path of redis-server; NULL: none */
    bool redis_asked;  /* --redis-server was given */
    bool no_redis;     /* --no-redis */
    double seconds;
    uint32_t conns[BL_MAX_CONNS];
    size_t nconns;
    double rates[BL_MAX_RATES]; /* fractions of the base, or per second (rates_abs) */
    size_t nrates;
    bool rates_abs;
    uint32_t slices, workers, pods, prompts, tokens;
    double max_others; /* %: a slice pair with more CPU of other processes is measured again */
    uint32_t retries;  /* at most this many times */
} bl_opts_t;

static void bl_usage(FILE *out)
{
    fprintf(out, "usage: kvtier-bench latency [--kvtierd PATH] [--redis-server PATH] [--no-redis]\n"
                 "                            [--seconds S] [--connections LIST] [--rates LIST]\n"
                 "                            [--rates-per-sec LIST] [--slices N] [--workers W]\n"
                 "                            [--pods P] [--prompts K] [--tokens N]\n"
                 "                            [--max-others PCT] [--retries R]\n"
                 "\n"
                 "Latency as a router sees it: one request in flight per connection, for kvtierd\n"
                 "(binary RPC QUERY of an N-token prompt, default 1024, against K prompts stored\n"
                 "on P pods, default 256 on 64) and for redis-server (GET of a 16-byte value),\n"
                 "measured by the same client in the same run. Points:\n"
                 "  closed loop at each connection count of LIST (default 1,4,16);\n"
                 "  open loop (Poisson arrivals, latency from each request's scheduled time) at\n"
                 "  each fraction of --rates (default 0.1,0.25,0.5,0.75) of the closed-loop\n"
                 "  throughput at the largest count (the lower of the two servers'), or at the\n"
                 "  absolute rates of --rates-per-sec (one or the other), on that many\n"
                 "  connections.\n"
                 "Each point runs S seconds per server (default 2), cut into N slices (default 8)\n"
                 "measured alternately; the server not being measured is stopped (SIGSTOP).\n"
                 "A pair of slices during which other processes used more than PCT of the\n"
                 "cores (default 20) is measured again, up to R times (default 1); 100: never.\n"
                 "kvtierd runs with W query workers (default 2; 0: kvtierd's own default).\n"
                 "redis-server is taken from PATH\n"
                 "unless --redis-server names it; without one kvtierd is measured alone.\n"
                 "Reported per point: p50, p99, p999 and max for both, and kvtierd / redis.\n"
                 "The last line is JSON.\n");
}

/* A list option's destination: up to @cap values in [lo, hi] (whole numbers when @whole). */
typedef struct bl_list {
    double *out;
    size_t cap, *n_p;
    double lo, hi;
    bool whole;
    bool given; /* set when the option was parsed */
} bl_list_t;

/* kvt_bench_arg_t parser for "a,b,c" into a bl_list_t; 0 or -1. */
static int bl_list(const char *opt, const char *s, void *dst)
{
    bl_list_t *l = dst;
    char buf[512];
    if (strlen(s) >= sizeof(buf)) {
        fprintf(stderr, "kvtier-bench: %s: list too long\n", opt);
        return -1;
    }
    if (s[0] == '\0' || s[0] == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,") != NULL) {
        fprintf(stderr, "kvtier-bench: %s must be a comma-separated list, got '%s'\n", opt, s);
        return -1;
    }
    strcpy(buf, s);
    size_t n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (n == l->cap) {
            fprintf(stderr, "kvtier-bench: %s: at most %zu values\n", opt, l->cap);
            return -1;
        }
        if (kvt_bench_parse_double(opt, t, l->lo, l->hi, &l->out[n]) != 0)
            return -1;
        if (l->whole && l->out[n] != floor(l->out[n])) {
            fprintf(stderr, "kvtier-bench: %s takes whole numbers, got '%s'\n", opt, s);
            return -1;
        }
        n++;
    }
    *l->n_p = n;
    l->given = true;
    return 0;
}

/* redis-server on PATH, or NULL; a static buffer. */
static const char *bl_redis_on_path(void)
{
    static char path[4096];
    const char *env = getenv("PATH");
    while (env != NULL && *env != '\0') {
        const char *end = strchr(env, ':');
        size_t len = end ? (size_t)(end - env) : strlen(env);
        if (len > 0 && len < sizeof(path) - 16) {
            memcpy(path, env, len);
            strcpy(path + len, "/redis-server");
            if (access(path, X_OK) == 0)
                return path;
        }
        env = end ? end + 1 : NULL;
    }
    return NULL;
}

static int bl_parse(int argc, char **argv, bl_opts_t *o)
{
    *o = (bl_opts_t){.seconds = 2.0,
                     .nconns = 3,
                     .rates = {0.1, 0.25, 0.5, 0.75},
                     .nrates = 4,
                     .slices = 8,
                     .workers = 2,
                     .pods = 64,
                     .prompts = 256,
                     .tokens = 1024,
                     .max_others = 20,
                     .retries = 1};
    double conns[BL_MAX_CONNS] = {1, 4, 16};
    bl_list_t lconns = {conns, BL_MAX_CONNS, &o->nconns, 1, BL_MAX_POOL, true, false};
    /* both fill o->rates: one of them at most */
    bl_list_t lrates = {o->rates, BL_MAX_RATES, &o->nrates, 0.001, 4, false, false};
    bl_list_t lrps = {o->rates, BL_MAX_RATES, &o->nrates, 1, 1e7, false, false};
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_STR("--kvtierd", &o->kvtierd),
        KVT_BENCH_ARG_STR("--redis-server", &o->redis),
        KVT_BENCH_ARG_FLAG("--no-redis", &o->no_redis),
        KVT_BENCH_ARG_DOUBLE("--seconds", &o->seconds, 0.05, 600),
        KVT_BENCH_ARG_DOUBLE("--max-others", &o->max_others, 0, 100),
        KVT_BENCH_ARG_CUSTOM("--connections", &lconns, bl_list),
        KVT_BENCH_ARG_CUSTOM("--rates", &lrates, bl_list),
        KVT_BENCH_ARG_CUSTOM("--rates-per-sec", &lrps, bl_list),
        KVT_BENCH_ARG_U32("--slices", &o->slices, 1, 64),
        KVT_BENCH_ARG_U32("--retries", &o->retries, 0, 10),
        KVT_BENCH_ARG_U32("--workers", &o->workers, 0, 64),
        KVT_BENCH_ARG_U32("--pods", &o->pods, 1, 10000),
        KVT_BENCH_ARG_U32("--prompts", &o->prompts, 1, 100000),
        KVT_BENCH_ARG_U32("--tokens", &o->tokens, 16, 65536),
    };
    int r = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (r > 0)
        bl_usage(stdout);
    if (r != 0)
        return r;
    for (size_t k = 0; k < o->nconns; k++)
        o->conns[k] = (uint32_t)conns[k];
    o->redis_asked = o->redis != NULL;
    if (o->no_redis && o->redis_asked) {
        fprintf(stderr, "kvtier-bench: --no-redis and --redis-server exclude each other\n");
        return -1;
    }
    if (lrates.given && lrps.given) {
        fprintf(stderr, "kvtier-bench: --rates and --rates-per-sec exclude each other\n");
        return -1;
    }
    o->rates_abs = lrps.given;
    if (o->no_redis)
        o->redis = NULL;
    else if (!o->redis_asked)
        o->redis = bl_redis_on_path();
    if (o->kvtierd == NULL && (o->kvtierd = kvt_bench_default_kvtierd()) == NULL)
        return -1;
    return 0;
}

/* ---- the two protocols ------------------------------------------------------------------ */

static const uint8_t *bl_rpc_request(bl_proto_t *p, uint64_t seq, size_t *len_p)
{
    uint8_t *f = p->reqs[seq % p->nreqs];
    memcpy(f + 8, &seq, 8); /* req_id, little-endian like the host */
    *len_p = p->reqlen[seq % p->nreqs];
    return f;
}

static long bl_rpc_answer(const uint8_t *buf, size_t n, uint64_t seq, bool *ok_p)
{
    kvt_proto_hdr_t h;
    if (n < KVT_PROTO_HDR_SIZE)
        return 0;
    if (kvt_proto_hdr_decode(buf, BL_IN_CAP - KVT_PROTO_HDR_SIZE, &h) != KVT_OK)
        return -1;
    size_t total = KVT_PROTO_HDR_SIZE + (size_t)h.body_len;
    if (n < total)
        return 0;
    kvt_proto_query_ans_t a;
    *ok_p =
        h.op == KVT_PROTO_OP_QUERY && h.req_id == seq && (h.flags & KVT_PROTO_F_RESPONSE) &&
        !(h.flags & KVT_PROTO_F_ERROR) &&
        kvt_proto_query_ans_decode(buf + KVT_PROTO_HDR_SIZE, h.body_len, &a, NULL, 0) == KVT_OK &&
        a.npods > 0;
    return (long)total;
}

static const uint8_t *bl_resp_request(bl_proto_t *p, uint64_t seq, size_t *len_p)
{
    (void)seq;
    *len_p = p->reqlen[0];
    return p->reqs[0];
}

/* RESP: "$<len>\r\n<bytes>\r\n" is the answer to GET; "-<line>\r\n" an error. */
static long bl_resp_answer(const uint8_t *buf, size_t n, uint64_t seq, bool *ok_p)
{
    (void)seq;
    const uint8_t *eol = n > 0 ? memchr(buf, '\n', n) : NULL;
    if (eol == NULL)
        return n > 64 ? -1 : 0;
    size_t head = (size_t)(eol - buf) + 1;
    if (buf[0] == '-' || buf[0] == '+') {
        *ok_p = false;
        return (long)head;
    }
    if (buf[0] != '$' || head < 4 || buf[head - 2] != '\r')
        return -1;
    if (buf[1] == '-') { /* $-1: no such key */
        *ok_p = false;
        return (long)head;
    }
    size_t len = 0;
    for (size_t i = 1; i < head - 2; i++) {
        if (buf[i] < '0' || buf[i] > '9' || len > BL_IN_CAP)
            return -1;
        len = len * 10 + (size_t)(buf[i] - '0');
    }
    if (n < head + len + 2)
        return 0;
    *ok_p = len == sizeof(BL_REDIS_VALUE) - 1 &&
            memcmp(buf + head, BL_REDIS_VALUE, sizeof(BL_REDIS_VALUE) - 1) == 0;
    return (long)(head + len + 2);
}

/* ---- redis-server ------------------------------------------------------------------------- */

/* One RESP command on a fresh connection; 0 when the answer starts with @want. */
static int bl_redis_cmd(uint16_t port, const char *cmd, const char *want)
{
    int fd = kvt_bench_connect(port);
    if (fd < 0)
        return -1;
    char buf[256];
    size_t n = 0;
    int rc = -1;
    if (kvt_bench_write_all(fd, cmd, strlen(cmd)) == 0) {
        ssize_t got;
        while (n < sizeof(buf) - 1 && memchr(buf, '\n', n) == NULL &&
               ((got = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0 || (got < 0 && errno == EINTR)))
            n += got > 0 ? (size_t)got : 0;
        buf[n] = '\0';
        rc = strncmp(buf, want, strlen(want)) == 0 ? 0 : -1;
    }
    close(fd);
    return rc;
}

/* A free loopback port (bound and released: redis-server cannot take port 0). */
static uint16_t bl_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    uint16_t port = 0;
    if (s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(s, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    if (s >= 0)
        close(s);
    return port;
}

typedef struct bl_redis {
    pid_t pid;
    uint16_t port;
    char dir[64];
} bl_redis_t;

static void bl_redis_stop(bl_redis_t *rs)
{
    if (rs->pid > 0) {
        kill(rs->pid, SIGKILL); /* nothing to keep: no persistence */
        waitpid(rs->pid, NULL, 0);
        rs->pid = 0;
    }
    if (rs->dir[0] != '\0') {
        rmdir(rs->dir); /* empty: --save "" and --appendonly no */
        rs->dir[0] = '\0';
    }
}

/*
 * Starts redis-server @path on 127.0.0.1 (a free port; another try if that
 * port was taken meanwhile) in a new temp dir, with no persistence, and
 * stores the GET key. 0, or -1 with a line on stderr.
 */
static int bl_redis_start(const char *path, bl_redis_t *rs)
{
    *rs = (bl_redis_t){0};
    strcpy(rs->dir, "/tmp/kvtier_bench_redis.XXXXXX");
    if (mkdtemp(rs->dir) == NULL) {
        rs->dir[0] = '\0';
        fprintf(stderr, "kvtier-bench: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    for (int attempt = 0; attempt < 3; attempt++) {
        uint16_t port = bl_free_port();
        char ports[8];
        snprintf(ports, sizeof(ports), "%u", port);
        const char *argv[] = {path, "--port",       ports, "--bind",     "127.0.0.1", "--save",
                              "",   "--appendonly", "no",  "--dir",      rs->dir,     "--daemonize",
                              "no", "--logfile",    "",    "--loglevel", "warning",   NULL};
        pid_t pid = fork();
        if (pid < 0)
            break;
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int nul = open("/dev/null", O_WRONLY);
            if (nul >= 0) {
                dup2(nul, 1);
                dup2(nul, 2);
            }
            execv(path, (char *const *)(uintptr_t)argv);
            _exit(127);
        }
        rs->pid = pid;
        rs->port = port;
        /* ready when it answers PING; gone (port taken, bad binary) when it exited */
        for (int i = 0; i < 500; i++) {
            if (bl_redis_cmd(port, "PING\r\n", "+PONG") == 0) {
                if (bl_redis_cmd(port,
                                 "*3\r\n$3\r\nSET\r\n$16\r\n" BL_REDIS_KEY
                                 "\r\n$16\r\n" BL_REDIS_VALUE "\r\n",
                                 "+OK") == 0)
                    return 0;
                fprintf(stderr, "kvtier-bench: redis-server refused SET\n");
                bl_redis_stop(rs);
                return -1;
            }
            if (waitpid(pid, NULL, WNOHANG) == pid) {
                rs->pid = 0;
                break;
            }
            usleep(10000);
        }
        if (rs->pid > 0) {
            kill(rs->pid, SIGKILL);
            waitpid(rs->pid, NULL, 0);
            rs->pid = 0;
        }
    }
    fprintf(stderr, "kvtier-bench: %s did not start\n", path);
    bl_redis_stop(rs);
    return -1;
}

/* ---- report ------------------------------------------------------------------------------ */

typedef struct bl_stats {
    double per_sec, p50, p99, p999, max; /* latencies in us */
    double lag_p99, server_cpu_us, client_cpu_us;
    double server_wait_us, client_wait_us; /* run-queue wait per request */
    double server_wakes, server_preempts;  /* context switches per request */
    double client_wakes, client_preempts;
    double others_pct; /* of all cores, used by other processes during the timed windows */
    uint64_t samples, done, errors, lost, ans_bytes;
    bool overloaded;
} bl_stats_t;

static bl_stats_t bl_summarize(bl_result_t *r)
{
    bl_stats_t s = {0};
    kvt_bench_sort_u64(r->lat.v, r->lat.n);
    kvt_bench_sort_u64(r->lag.v, r->lag.n);
    s.per_sec = r->secs > 0 ? (double)r->done / r->secs : 0;
    s.p50 = kvt_bench_percentile(r->lat.v, r->lat.n, 50) / 1e3;
    s.p99 = kvt_bench_percentile(r->lat.v, r->lat.n, 99) / 1e3;
    s.p999 = kvt_bench_percentile(r->lat.v, r->lat.n, 99.9) / 1e3;
    s.max = kvt_bench_percentile(r->lat.v, r->lat.n, 100) / 1e3;
    s.lag_p99 = kvt_bench_percentile(r->lag.v, r->lag.n, 99) / 1e3;
    s.server_cpu_us = r->done ? r->server_cpu * 1e6 / (double)r->done : 0;
    s.client_cpu_us = r->done ? r->client_cpu * 1e6 / (double)r->done : 0;
    double per = r->done ? 1.0 / (double)r->done : 0;
    s.server_wait_us = r->server_wait * 1e6 * per;
    s.client_wait_us = r->client_wait * 1e6 * per;
    s.server_wakes = (double)r->server_vol * per;
    s.server_preempts = (double)r->server_invol * per;
    s.client_wakes = (double)r->client_vol * per;
    s.client_preempts = (double)r->client_invol * per;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s.others_pct =
        r->wall > 0 ? 100.0 * r->others_cpu / (r->wall * (double)(ncpu > 0 ? ncpu : 1)) : 0;
    s.samples = r->lat.n;
    s.done = r->done;
    s.errors = r->errors;
    s.lost = r->lost;
    s.ans_bytes = r->ans_bytes;
    s.overloaded = r->overloaded;
    return s;
}

static void bl_print_row(const char *label, const char *server, const bl_stats_t *s, bool open)
{
    printf("%-22s %-8s %9.0f/s %8.1f %8.1f %8.1f %9.1f %7.1f %7.1f %7.1f", label, server,
           s->per_sec, s->p50, s->p99, s->p999, s->max, s->server_cpu_us, s->server_wait_us,
           s->others_pct);
    if (open)
        printf(" %8.1f", s->lag_p99);
    else
        printf(" %8s", "-");
    if (s->errors || s->lost || s->overloaded)
        printf("  (%" PRIu64 " errors, %" PRIu64 " lost%s)", s->errors, s->lost,
               s->overloaded ? ", overloaded" : "");
    printf("\n");
}

static double bl_ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

static void bl_json_stats(const bl_stats_t *s)
{
    printf("{\"per_sec\":%.1f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f,"
           "\"samples\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"lost\":%" PRIu64
           ",\"overloaded\":%s,\"server_cpu_us_per_req\":%.2f,\"client_cpu_us_per_req\":%.2f,"
           "\"lag_p99_us\":%.2f,\"server_runq_wait_us_per_req\":%.2f,"
           "\"client_runq_wait_us_per_req\":%.2f,\"server_wakes_per_req\":%.3f,"
           "\"server_preempts_per_req\":%.3f,\"client_wakes_per_req\":%.3f,"
           "\"client_preempts_per_req\":%.3f,\"others_cpu_pct\":%.1f,\"answer_bytes\":%" PRIu64 "}",
           s->per_sec, s->p50, s->p99, s->p999, s->max, s->samples, s->errors, s->lost,
           s->overloaded ? "true" : "false", s->server_cpu_us, s->client_cpu_us, s->lag_p99,
           s->server_wait_us, s->client_wait_us, s->server_wakes, s->server_preempts,
           s->client_wakes, s->client_preempts, s->others_pct, s->ans_bytes);
}

/* ---- main --------------------------------------------------------------------------------- */

typedef struct bl_point {
    bool open;
    uint32_t conns;
    uint32_t retried;      /* slice pairs measured again: other processes were busy */
    uint32_t disturbed;    /* slice pairs kept although other processes were busy */
    double fraction, rate; /* open loop */
    bl_stats_t st[2];      /* kvtierd, redis */
} bl_point_t;

/*
 * Measures one point for every server in @ps (1 or 2): @o->slices slices of
 * @o->seconds / slices each, alternating which server goes first; the other
 * server is stopped meanwhile. 0 or -1.
 */
static int bl_point(const bl_opts_t *o, bl_proto_t *ps, int nps, bl_point_t *pt, uint64_t seed)
{
    bl_result_t res[2], tmp[2];
    memset(res, 0, sizeof(res));
    memset(tmp, 0, sizeof(tmp));
    uint64_t ns = (uint64_t)(o->seconds / o->slices * 1e9);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int rc = 0;
    for (uint32_t s = 0; s < o->slices && rc == 0; s++) {
        for (uint32_t attempt = 0; rc == 0; attempt++) {
            for (int k = 0; k < nps && rc == 0; k++) {
                int i = (s % 2 == 0) ? k : nps - 1 - k;
                for (int j = 0; j < nps; j++)
                    kill(ps[j].pid, j == i ? SIGCONT : SIGSTOP);
                rc =
                    kvt_bl_slice(&ps[i], pt->conns, pt->open ? pt->rate : 0, ns, seed + s, &tmp[i]);
                if (rc != 0)
                    fprintf(stderr, "kvtier-bench: %s: a connection failed\n", ps[i].name);
            }
            /* other processes' CPU during the pair: a busy neighbour measured, not the servers */
            double others = 0, wall = 0;
            for (int i = 0; i < nps; i++) {
                others += tmp[i].others_cpu;
                wall += tmp[i].wall;
            }
            double pct = wall > 0 ? 100.0 * others / (wall * (double)(ncpu > 0 ? ncpu : 1)) : 0;
            bool busy = o->max_others < 100 && pct > o->max_others;
            if (rc == 0 && busy && attempt < o->retries) {
                pt->retried++;
                for (int i = 0; i < nps; i++)
                    kvt_bl_result_drop(&tmp[i]);
                continue;
            }
            pt->disturbed += busy;
            for (int i = 0; i < nps; i++)
                kvt_bl_result_move(&res[i], &tmp[i]);
            break;
        }
    }
    for (int j = 0; j < nps; j++)
        kill(ps[j].pid, SIGCONT);
    for (int i = 0; i < nps; i++) {
        pt->st[i] = bl_summarize(&res[i]);
        kvt_bl_result_drop(&res[i]);
        kvt_bl_result_drop(&tmp[i]);
    }
    return rc;
}

int kvt_bench_latency_main(int argc, char **argv)
{
    bl_opts_t o;
    int rc = bl_parse(argc, argv, &o);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    signal(SIGPIPE, SIG_IGN);
    /* the open loop sleeps to each arrival: wake on time, not up to 50 us late */
    prctl(PR_SET_TIMERSLACK, 1UL);

    kvt_bench_daemon_t d = {0};
    bl_redis_t rs = {0};
    bl_proto_t ps[2] = {{.name = "kvtierd", .request = bl_rpc_request, .answer = bl_rpc_answer},
                        {.name = "redis", .request = bl_resp_request, .answer = bl_resp_answer}};
    int nps = 1;
    uint32_t *tok = malloc((size_t)o.tokens * sizeof(uint32_t));
    ps[0].reqs = calloc(o.prompts, sizeof(uint8_t *));
    ps[0].reqlen = calloc(o.prompts, sizeof(size_t));
    ps[0].nreqs = o.prompts;
    size_t npoints = o.nconns + o.nrates;
    bl_point_t *pts = calloc(npoints, sizeof(*pts));
    static char get_cmd[] = "*2\r\n$3\r\nGET\r\n$16\r\n" BL_REDIS_KEY "\r\n";
    uint8_t *get_req = (uint8_t *)get_cmd;
    size_t get_len = sizeof(get_cmd) - 1;
    ps[1].reqs = &get_req;
    ps[1].reqlen = &get_len;
    ps[1].nreqs = 1;
    rc = 1;
    if (tok == NULL || ps[0].reqs == NULL || ps[0].reqlen == NULL || pts == NULL)
        goto out;
    char workers[16];
    snprintf(workers, sizeof(workers), "%u", o.workers);
    const char *args[] = {"--workers", workers, NULL};
    if (o.workers == 0)
        args[0] = NULL; /* kvtierd picks */
    if (kvt_bench_daemon_start(o.kvtierd, args, &d) != 0 ||
        kvt_bench_load(d.http, o.pods, o.prompts, o.tokens, tok) != 0)
        goto out;
    for (uint32_t i = 0; i < o.prompts; i++)
        if ((ps[0].reqs[i] = kvt_bench_query_frame(i, o.tokens, tok, &ps[0].reqlen[i])) == NULL)
            goto out;
    ps[0].pid = d.pid;
    ps[0].port = d.rpc;
    if (o.workers == 0)
        o.workers = kvt_bl_kvtierd_workers(d.pid);
    const char *redis_note = NULL;
    if (o.no_redis) {
        redis_note = "--no-redis: kvtierd measured alone";
    } else if (o.redis == NULL) {
        redis_note = "redis-server not found on PATH: kvtierd measured alone";
    } else if (access(o.redis, X_OK) != 0) {
        redis_note = "redis-server not executable: kvtierd measured alone";
    } else if (bl_redis_start(o.redis, &rs) != 0) {
        redis_note = "redis-server did not start: kvtierd measured alone";
    } else {
        ps[1].pid = rs.pid;
        ps[1].port = rs.port;
        nps = 2;
    }
    if (redis_note != NULL && !o.no_redis)
        fprintf(stderr, "kvtier-bench: %s\n", redis_note);

    uint64_t steal0 = 0, tick0 = 0, steal1 = 0, tick1 = 0;
    bool have_steal = kvt_bench_steal(&steal0, &tick0);
    uint32_t pool = 0;
    for (size_t i = 0; i < o.nconns; i++) {
        pts[i] = (bl_point_t){.conns = o.conns[i]};
        pool = o.conns[i] > pool ? o.conns[i] : pool;
    }
    for (size_t i = 0; i < o.nconns; i++)
        if (bl_point(&o, ps, nps, &pts[i], 1000 + i) != 0)
            goto out;
    /* the base of the rates: the closed loop at the pool's size, the slower server's */
    double base = 0;
    for (size_t i = 0; i < o.nconns; i++)
        if (o.conns[i] == pool)
            for (int k = 0; k < nps; k++)
                if (base == 0 || pts[i].st[k].per_sec < base)
                    base = pts[i].st[k].per_sec;
    for (size_t i = 0; i < o.nrates; i++) {
        bl_point_t *pt = &pts[o.nconns + i];
        *pt = (bl_point_t){.open = true, .conns = pool};
        pt->fraction = o.rates_abs ? (base > 0 ? o.rates[i] / base : 0) : o.rates[i];
        pt->rate = o.rates_abs ? o.rates[i] : o.rates[i] * base;
        if (pt->rate < 1) {
            fprintf(stderr, "kvtier-bench: no closed-loop throughput to take rates from\n");
            goto out;
        }
        if (bl_point(&o, ps, nps, pt, 2000 + 16 * i) != 0)
            goto out;
    }
    have_steal = have_steal && kvt_bench_steal(&steal1, &tick1) && tick1 > tick0;
    double steal_pct =
        have_steal ? 100.0 * (double)(steal1 - steal0) / (double)(tick1 - tick0) : -1;

    /* the table */
    size_t req_bytes = 0;
    for (uint32_t i = 0; i < o.prompts; i++)
        req_bytes += ps[0].reqlen[i];
    printf("kvtierd: %u workers; queries of %u tokens against %u prompts on %u pods "
           "(%zu-byte requests)\n",
           o.workers, o.tokens, o.prompts, o.pods, req_bytes / o.prompts);
    printf("redis:   %s\n", nps == 2 ? "GET of a 16-byte value" : redis_note);
    printf("%.2f s per server and point in %u slices; one request in flight per connection; "
           "open loop: Poisson arrivals on %u connections, latency from the scheduled time\n"
           "cpu us, runq us: the server's CPU and run-queue wait (all its threads) per request; "
           "others%%: CPU of other processes (of all cores); lag p99: scheduled -> written\n\n",
           o.seconds, o.slices, pool);
    printf("%-22s %-8s %11s %8s %8s %8s %9s %7s %7s %7s %8s\n", "point", "server", "rate", "p50 us",
           "p99 us", "p999 us", "max us", "cpu us", "runq us", "others%", "lag p99");
    double worst99 = 0, worst999 = 0;
    uint64_t errors = 0;
    for (size_t i = 0; i < npoints; i++) {
        bl_point_t *pt = &pts[i];
        char label[64];
        if (pt->open)
            snprintf(label, sizeof(label), "open %.0f/s (%.2f)", pt->rate, pt->fraction);
        else
            snprintf(label, sizeof(label), "closed, %u conn%s", pt->conns,
                     pt->conns == 1 ? "" : "s");
        for (int k = 0; k < nps; k++) {
            bl_print_row(k == 0 ? label : "", ps[k].name, &pt->st[k], pt->open);
            errors += pt->st[k].errors + pt->st[k].lost;
        }
        if (pt->retried || pt->disturbed)
            printf("%-22s (%u slice pairs measured again, %u kept with other processes busy)\n", "",
                   pt->retried, pt->disturbed);
        if (nps == 2) {
            const bl_stats_t *a = &pt->st[0], *b = &pt->st[1];
            double r99 = bl_ratio(a->p99, b->p99), r999 = bl_ratio(a->p999, b->p999);
            printf("%-22s %-8s %11s %8.2f %8.2f %8.2f %9.2f\n", "", "ratio", "",
                   bl_ratio(a->p50, b->p50), r99, r999, bl_ratio(a->max, b->max));
            worst99 = r99 > worst99 ? r99 : worst99;
            worst999 = r999 > worst999 ? r999 : worst999;
        }
    }
    if (nps == 2)
        printf("\nworst kvtierd / redis: p99 %.2fx, p999 %.2fx (target: within 1.5x)\n", worst99,
               worst999);
    printf("cpu steal %.1f %% of the run (-1: unknown)\n", steal_pct);

    /* the JSON line */
    printf("{\"bench\":\"latency\",\"workers\":%u,\"tokens\":%u,\"pods\":%u,\"prompts\":%u,"
           "\"seconds\":%.3f,\"slices\":%u,\"pool\":%u,\"base_per_sec\":%.1f,"
           "\"kvtier_request_bytes\":%zu,\"redis_request_bytes\":%zu,\"redis_measured\":%s,",
           o.workers, o.tokens, o.pods, o.prompts, o.seconds, o.slices, pool, base,
           req_bytes / o.prompts, get_len, nps == 2 ? "true" : "false");
    if (nps != 2)
        printf("\"redis_note\":\"%s\",", redis_note);
    printf("\"points\":[");
    for (size_t i = 0; i < npoints; i++) {
        bl_point_t *pt = &pts[i];
        printf("%s{\"mode\":\"%s\",\"connections\":%u,\"retried\":%u,\"disturbed\":%u,",
               i ? "," : "", pt->open ? "open" : "closed", pt->conns, pt->retried, pt->disturbed);
        if (pt->open)
            printf("\"rate_per_sec\":%.1f,\"fraction\":%.4f,", pt->rate, pt->fraction);
        printf("\"kvtier\":");
        bl_json_stats(&pt->st[0]);
        if (nps == 2) {
            const bl_stats_t *a = &pt->st[0], *b = &pt->st[1];
            printf(",\"redis\":");
            bl_json_stats(b);
            printf(",\"ratio\":{\"p50\":%.3f,\"p99\":%.3f,\"p999\":%.3f,\"max\":%.3f}",
                   bl_ratio(a->p50, b->p50), bl_ratio(a->p99, b->p99), bl_ratio(a->p999, b->p999),
                   bl_ratio(a->max, b->max));
        }
        printf("}");
    }
    printf("]");
    if (nps == 2)
        printf(",\"worst_p99_ratio\":%.3f,\"worst_p999_ratio\":%.3f,\"within_1_5x\":%s", worst99,
               worst999, worst99 <= 1.5 && worst999 <= 1.5 ? "true" : "false");
    printf(",\"steal_pct\":%.1f,\"errors\":%" PRIu64 "}\n", steal_pct, errors);
    rc = errors ? 1 : 0;
out:
    bl_redis_stop(&rs);
    kvt_bench_daemon_stop(&d);
    for (uint32_t i = 0; ps[0].reqs != NULL && i < o.prompts; i++)
        free(ps[0].reqs[i]);
    free(ps[0].reqs);
    free(ps[0].reqlen);
    free(pts);
    free(tok);
    return rc;
}
