/*
 * `kvtier-bench rpc`: query throughput and latency of a real kvtierd over
 * loopback, binary RPC (pipelined) and HTTP/JSON (keep-alive), with
 * `redis-benchmark -P 16 -t get` against a Debian redis-server measured in
 * the same run as the yardstick.
 *
 * The bench starts kvtierd itself (--kvtierd, default: next to this binary)
 * on ephemeral ports in a temp dir, loads P pods' worth of prompts through
 * POST /v1/events, then:
 *   1. RPC closed loop: C connections with D queries in flight each, S seconds;
 *   2. RPC open loop at half the rate found in 1: latency from the scheduled
 *      send time to the answer (p50, p99);
 *   3. HTTP closed loop: H keep-alive connections, one request in flight each;
 *   4. the transport ceiling: phase 1's client against a server that answers
 *      with kvtierd's recorded answers and does nothing else (rpc_ceiling.c);
 *   5. redis-benchmark (skipped when redis is not installed).
 * Prompts are 1024 tokens (block size 16) sharing a 256-token system prefix,
 * so every query walks the index and matches several pods.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/clock.h"
#include "kvindex/hash.h"
#include "kvindex/index.h"
#include "kvindex/score.h"
#include "proto/proto.h"

typedef struct br_opts {
    const char *kvtierd;
    double seconds;
    uint32_t conns, depth, batch, http_conns, pods, prompts, tokens, workers;
    bool redis;
} br_opts_t;

static void br_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier-bench rpc [--kvtierd PATH] [--seconds S] [--conns C] [--depth D]\n"
            "                        [--batch B] [--http-conns H] [--pods P] [--prompts K]\n"
            "                        [--tokens N]\n"
            "                        [--workers W] [--no-redis]\n"
            "\n"
            "Starts kvtierd (W query workers, default 2) on loopback, stores K prompts of N\n"
            "tokens (default 256 x 1024, block size 16) on P pods (default 64), then measures\n"
            "RPC queries/s with C connections x D in flight (default 4 x 32), sent in writes\n"
            "of B requests once B answers are back (default 16, as redis-benchmark -P 16;\n"
            "--batch 1 replaces each answer at once), RPC latency at\n"
            "half that rate, HTTP queries/s with H keep-alive connections (default 16), the\n"
            "transport ceiling (the RPC client against a server that replays kvtierd's\n"
            "answers and does no query work), the query work in-process (decode, hash,\n"
            "index, rank, encode on one thread, no sockets; its answers must equal\n"
            "kvtierd's), the bound that gives (cores / (that work + the ceiling's server\n"
            "and client CPU per query)), and redis-benchmark -P 16 -t get as the\n"
            "yardstick. S seconds per phase (default 3).\n"
            "The last line is JSON.\n");
}

static int br_parse(int argc, char **argv, br_opts_t *o)
{
    *o = (br_opts_t){NULL, 3.0, 4, 32, 16, 16, 64, 256, 1024, 2, true};
    bool no_redis = false;
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_STR("--kvtierd", &o->kvtierd),
        KVT_BENCH_ARG_FLAG("--no-redis", &no_redis),
        KVT_BENCH_ARG_DOUBLE("--seconds", &o->seconds, 0.1, 600),
        KVT_BENCH_ARG_U32("--conns", &o->conns, 1, 256),
        KVT_BENCH_ARG_U32("--depth", &o->depth, 1, 1024),
        KVT_BENCH_ARG_U32("--batch", &o->batch, 1, 1024),
        KVT_BENCH_ARG_U32("--http-conns", &o->http_conns, 1, 256),
        KVT_BENCH_ARG_U32("--pods", &o->pods, 1, 10000),
        KVT_BENCH_ARG_U32("--prompts", &o->prompts, 1, 100000),
        KVT_BENCH_ARG_U32("--tokens", &o->tokens, 16, 65536),
        KVT_BENCH_ARG_U32("--workers", &o->workers, 1, 64),
    };
    int r = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (r > 0)
        br_usage(stdout);
    if (r != 0)
        return r;
    o->redis = !no_redis;
    if (o->batch > o->depth) {
        fprintf(stderr, "kvtier-bench: --batch %u is more than --depth %u\n", o->batch, o->depth);
        return -1;
    }
    if (o->kvtierd == NULL && (o->kvtierd = kvt_bench_default_kvtierd()) == NULL)
        return -1;
    return 0;
}

/* ---- sockets ------------------------------------------------------------------------ */

/*
 * Records kvtierd's answer to each prompt (request id = the prompt's number)
 * for the transport ceiling; 0 or -1.
 */
static int br_rpc_capture(uint16_t port, uint8_t **reqs, const size_t *reqlen, uint32_t n,
                          uint8_t **ans, size_t *anslen)
{
    int fd = kvt_bench_connect(port);
    if (fd < 0)
        return -1;
    int rc = 0;
    for (uint32_t q = 0; q < n && rc == 0; q++) {
        uint64_t id = q;
        memcpy(reqs[q] + 8, &id, 8);
        uint8_t hdr[KVT_PROTO_HDR_SIZE];
        kvt_proto_hdr_t h;
        rc = -1;
        if (kvt_bench_write_all(fd, reqs[q], reqlen[q]) != 0 ||
            kvt_bench_read_all(fd, hdr, sizeof(hdr)) != 0)
            break;
        kvt_proto_hdr_peek(hdr, &h);
        if (h.req_id != id || (h.flags & KVT_PROTO_F_ERROR) ||
            (ans[q] = malloc(sizeof(hdr) + h.body_len)) == NULL)
            break;
        memcpy(ans[q], hdr, sizeof(hdr));
        if (kvt_bench_read_all(fd, ans[q] + sizeof(hdr), h.body_len) != 0)
            break;
        anslen[q] = sizeof(hdr) + h.body_len;
        rc = 0;
    }
    close(fd);
    return rc;
}

/* ---- the query work in-process ---------------------------------------------------------- */

typedef struct br_inproc {
    kvt_idx_t *idx;
    kvt_idx_reader_t *rd;
    uint32_t ns, pods;
    uint64_t *keys;
    kvt_scored_t *sc;   /* [pods + 1] */
    char (*names)[16];  /* "pod-N", id N, as kvtierd registered them */
    uint16_t *name_len; /* as kvtierd's registry keeps them */
    kvt_score_weights_t sw;
    kvt_proto_wr_t w; /* the last answer */
} br_inproc_t;

/*
 * The work kvtierd does for one RPC query, without sockets, event loop or
 * threads: decode the request frame, hash its tokens from the frame, query
 * the index, rank the matches, encode the answer into @c->w. 0 or -1.
 */
static int br_inproc_one(br_inproc_t *c, const uint8_t *req, size_t reqlen, uint64_t id)
{
    kvt_proto_query_t pq;
    if (kvt_proto_query_decode(req + KVT_PROTO_HDR_SIZE, reqlen - KVT_PROTO_HDR_SIZE, 1u << 20, &pq,
                               NULL, 0) != KVT_OK)
        return -1;
    size_t n = kvt_hash_seq_le(pq.values, pq.n, 16, KVT_HASH_SEED, NULL, NULL, c->keys);
    const kvt_idx_match_t *m;
    size_t nm;
    if (n == 0 || kvt_idx_query(c->rd, c->ns, c->keys, n, NULL, 0, &m, &nm) != KVT_OK ||
        nm > c->pods)
        return -1;
    size_t k = kvt_score_rank(&c->sw, m, nm, NULL, 0, NULL, 0, c->keys[n - 1], c->sc);
    kvt_proto_wr_reset(&c->w);
    kvt_proto_query_ans_enc_t e;
    kvt_proto_query_ans_begin(&c->w, id, 16, (uint32_t)n, &e);
    uint8_t *p = kvt_proto_query_ans_room(&c->w, &e, k, k * sizeof(c->names[0]));
    for (size_t i = 0; p != NULL && i < k; i++) {
        const kvt_scored_t *s = &c->sc[i];
        kvt_proto_pod_ans_t pa = {{c->names[s->pod], c->name_len[s->pod]},
                                  0,
                                  s->matched,
                                  s->gpu,
                                  s->cpu,
                                  s->disk,
                                  s->score};
        p = kvt_proto_query_ans_put(&e, p, &pa);
    }
    if (p == NULL)
        return -1;
    kvt_proto_query_ans_commit(&c->w, p);
    return kvt_proto_query_ans_end(&c->w, &e) == KVT_OK ? 0 : -1;
}

/*
 * br_inproc_one() over an index that holds what kvt_bench_load() stored (same pods
 * in the same order, so the same pod ids and tie-breaks). First every
 * request once, untimed: *@agree_p says whether each answer body equals the
 * daemon's recorded one. Then the best of nine passes of 10,000 queries
 * (this VM's speed changes from one moment to the next: the best pass is the
 * steadiest figure). Returns microseconds per query, or -1 on an error.
 */
static double br_inproc(const br_opts_t *o, uint8_t *const *reqs, const size_t *reqlen,
                        uint8_t *const *ans, const size_t *anslen, uint32_t *tok, bool *agree_p)
{
    uint32_t nb = o->tokens / 16;
    br_inproc_t c = {.pods = o->pods};
    c.keys = malloc((size_t)nb * sizeof(uint64_t) + 8);
    c.sc = malloc(((size_t)o->pods + 1) * sizeof(kvt_scored_t));
    c.names = malloc((size_t)o->pods * sizeof(c.names[0]));
    c.name_len = malloc((size_t)o->pods * sizeof(uint16_t));
    uint64_t *eh = malloc((size_t)nb * sizeof(uint64_t) + 8);
    kvt_idx_config_t cfg = {0};
    double best = -1;
    kvt_score_weights_default(&c.sw);
    kvt_proto_wr_init(&c.w);
    if (!c.keys || !c.sc || !c.names || !c.name_len || !eh ||
        kvt_idx_create(&cfg, &c.idx) != KVT_OK ||
        kvt_idx_ns_get(c.idx, "bench", "", 16, &c.ns) != KVT_OK)
        goto out;
    for (uint32_t p = 0; p < o->pods; p++) {
        uint32_t id;
        c.name_len[p] = (uint16_t)snprintf(c.names[p], sizeof(c.names[p]), "pod-%u", p);
        if (kvt_idx_pod_get(c.idx, c.names[p], 0, &id) != KVT_OK || id != p)
            goto out;
    }
    for (uint32_t i = 0; i < o->prompts; i++) {
        kvt_bench_prompt(i, o->tokens, tok);
        kvt_hash_seq(tok, (size_t)nb * 16, 16, KVT_HASH_SEED, NULL, NULL, c.keys);
        for (uint32_t b = 0; b < nb; b++)
            eh[b] = kvt_bench_ehash(i, b);
        for (uint32_t copy = 0; copy < 2; copy++) {
            uint32_t blocks, pod = kvt_bench_holder(o->pods, o->tokens, i, copy, &blocks);
            if (kvt_idx_store(c.idx, c.ns, pod, KVT_TIER_GPU, NULL, c.keys, eh, blocks) != KVT_OK)
                goto out;
        }
    }
    if (kvt_idx_reader_create(c.idx, &c.rd) != KVT_OK)
        goto out;
    bool agree = true;
    for (uint32_t q = 0; q < o->prompts; q++) {
        if (br_inproc_one(&c, reqs[q], reqlen[q], q) != 0)
            goto out;
        agree = agree && c.w.len == anslen[q] &&
                memcmp(c.w.buf + KVT_PROTO_HDR_SIZE, ans[q] + KVT_PROTO_HDR_SIZE,
                       c.w.len - KVT_PROTO_HDR_SIZE) == 0;
    }
    const uint32_t reps = 10000;
    for (int pass = 0; pass < 9; pass++) {
        uint64_t t0 = kvt_clock_ns();
        for (uint32_t r = 0; r < reps; r++)
            if (br_inproc_one(&c, reqs[r % o->prompts], reqlen[r % o->prompts], r) != 0)
                goto out;
        double us = (double)(kvt_clock_ns() - t0) / 1e3 / reps;
        if (best < 0 || us < best)
            best = us;
    }
    *agree_p = agree;
out:
    kvt_proto_wr_cleanup(&c.w);
    kvt_idx_reader_destroy(c.rd);
    kvt_idx_destroy(c.idx);
    free(c.keys);
    free(c.sc);
    free(c.names);
    free(c.name_len);
    free(eh);
    return best;
}

/* ---- load generator ------------------------------------------------------------------------- */

typedef struct br_conn {
    int fd;
    uint8_t *in;
    size_t inlen, incap;
    uint8_t *out; /* closed loop: replacement requests not yet written */
    size_t outlen;
    uint32_t queued; /* requests in out (counted in inflight already) */
    uint32_t inflight;
    uint64_t *sent_at; /* per in-flight slot (req_id % depth) */
} br_conn_t;

typedef struct br_result {
    uint64_t done, errors;
    double secs;   /* measured length of the phase */
    uint64_t *lat; /* ns, one per answer (open loop) */
    size_t nlat, caplat;
} br_result_t;

/*
 * RPC load: closed loop when @rate is 0 (keep D in flight per connection),
 * else open loop at @rate queries/s (latency from the scheduled time).
 */
static int br_rpc_run(const br_opts_t *o, uint16_t port, uint8_t **reqs, size_t *reqlen,
                      double rate, br_result_t *res)
{
    uint32_t nc = o->conns, depth = o->depth;
    br_conn_t *c = calloc(nc, sizeof(*c));
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (c == NULL || ep < 0)
        return -1;
    uint32_t slots = rate > 0 ? 65536 : depth;
    size_t maxreq = 0;
    for (uint32_t q = 0; q < o->prompts; q++)
        maxreq = reqlen[q] > maxreq ? reqlen[q] : maxreq;
    for (uint32_t i = 0; i < nc; i++) {
        c[i].fd = kvt_bench_connect(port);
        c[i].incap = 1 << 20;
        c[i].in = malloc(c[i].incap);
        c[i].out = malloc((size_t)depth * maxreq);
        c[i].sent_at = calloc(slots, sizeof(uint64_t));
        if (c[i].fd < 0 || c[i].in == NULL || c[i].out == NULL || c[i].sent_at == NULL)
            return -1;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &ev);
    }
    uint64_t t0 = kvt_clock_ns(), end = t0 + (uint64_t)(o->seconds * 1e9);
    uint64_t next_id = 1, scheduled = 0;
    double interval = rate > 0 ? 1e9 / rate : 0;
    uint32_t rr = 0;
    /* closed loop: fill every connection */
    if (rate == 0)
        for (uint32_t i = 0; i < nc; i++)
            for (uint32_t k = 0; k < depth; k++, next_id++) {
                size_t q = next_id % o->prompts;
                uint8_t *f = reqs[q];
                memcpy(f + 8, &next_id, 8); /* req_id: little-endian host */
                c[i].sent_at[next_id % slots] = kvt_clock_ns();
                if (kvt_bench_write_all(c[i].fd, f, reqlen[q]) != 0)
                    return -1;
                c[i].inflight++;
            }
    for (;;) {
        uint64_t now = kvt_clock_ns();
        if (now >= end)
            break;
        if (rate > 0) {
            /* send every request whose time has come */
            /* all that are due, one write per connection (latency counts from the due time) */
            while (t0 + (uint64_t)(scheduled * interval) <= now) {
                br_conn_t *k = &c[rr++ % nc];
                if (k->inflight >= slots - 1)
                    break;
                size_t q = next_id % o->prompts;
                if (k->outlen + reqlen[q] > (size_t)depth * maxreq) {
                    if (kvt_bench_write_all(k->fd, k->out, k->outlen) != 0)
                        return -1;
                    k->outlen = 0;
                }
                memcpy(k->out + k->outlen, reqs[q], reqlen[q]);
                memcpy(k->out + k->outlen + 8, &next_id, 8);
                k->outlen += reqlen[q];
                k->sent_at[next_id % slots] = t0 + (uint64_t)(scheduled * interval);
                k->inflight++;
                next_id++;
                scheduled++;
            }
            for (uint32_t i = 0; i < nc; i++) {
                if (c[i].outlen > 0 && kvt_bench_write_all(c[i].fd, c[i].out, c[i].outlen) != 0)
                    return -1;
                c[i].outlen = 0;
            }
        }
        struct epoll_event evs[64];
        int n;
        if (rate > 0) {
            /* sleep until the next send is due (no busy poll: the daemon shares the cores) */
            uint64_t due = t0 + (uint64_t)(scheduled * interval), now2 = kvt_clock_ns();
            uint64_t wait = due > now2 ? due - now2 : 0;
            struct timespec ts = {(time_t)(wait / 1000000000u), (long)(wait % 1000000000u)};
            n = epoll_pwait2(ep, evs, 64, &ts, NULL);
        } else {
            n = epoll_wait(ep, evs, 64, 100);
        }
        for (int e = 0; e < n; e++) {
            br_conn_t *k = &c[evs[e].data.u32];
            ssize_t r = read(k->fd, k->in + k->inlen, k->incap - k->inlen);
            if (r <= 0)
                return -1;
            k->inlen += (size_t)r;
            size_t off = 0;
            while (k->inlen - off >= KVT_PROTO_HDR_SIZE) {
                kvt_proto_hdr_t h;
                kvt_proto_hdr_peek(k->in + off, &h);
                if (k->inlen - off < KVT_PROTO_HDR_SIZE + h.body_len)
                    break;
                uint64_t t = kvt_clock_ns();
                if (h.flags & KVT_PROTO_F_ERROR)
                    res->errors++;
                res->done++;
                k->inflight--;
                if (rate > 0 && res->nlat < res->caplat)
                    res->lat[res->nlat++] = t - k->sent_at[h.req_id % slots];
                off += KVT_PROTO_HDR_SIZE + h.body_len;
                if (rate == 0) {
                    /* replace it; like a pipelining router, one write per batch */
                    size_t q = next_id % o->prompts;
                    memcpy(k->out + k->outlen, reqs[q], reqlen[q]);
                    memcpy(k->out + k->outlen + 8, &next_id, 8);
                    k->outlen += reqlen[q];
                    k->sent_at[next_id % slots] = t;
                    k->inflight++;
                    k->queued++;
                    next_id++;
                }
            }
            memmove(k->in, k->in + off, k->inlen - off);
            k->inlen -= off;
            /* pipelining as redis-benchmark -P does: whole batches per write */
            if (k->queued >= o->batch) {
                if (kvt_bench_write_all(k->fd, k->out, k->outlen) != 0)
                    return -1;
                k->outlen = 0;
                k->queued = 0;
            }
        }
    }
    double secs = (double)(kvt_clock_ns() - t0) / 1e9;
    for (uint32_t i = 0; i < nc; i++) {
        close(c[i].fd);
        free(c[i].in);
        free(c[i].out);
        free(c[i].sent_at);
    }
    free(c);
    close(ep);
    res->secs = secs;
    return 0;
}

/* HTTP closed loop: H keep-alive connections, one request in flight each. */
static double br_http_run(const br_opts_t *o, uint16_t port, char **reqs, size_t *reqlen,
                          uint64_t *errors_p, uint64_t *done_p)
{
    uint32_t nc = o->http_conns;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    br_conn_t *c = calloc(nc, sizeof(*c));
    if (c == NULL || ep < 0)
        return -1;
    uint64_t next = 0, done = 0, errors = 0;
    for (uint32_t i = 0; i < nc; i++) {
        c[i].fd = kvt_bench_connect(port);
        c[i].incap = 1 << 16;
        c[i].in = malloc(c[i].incap);
        if (c[i].fd < 0 || c[i].in == NULL)
            return -1;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &ev);
        size_t q = next++ % o->prompts;
        if (kvt_bench_write_all(c[i].fd, reqs[q], reqlen[q]) != 0)
            return -1;
    }
    uint64_t t0 = kvt_clock_ns(), end = t0 + (uint64_t)(o->seconds * 1e9);
    while (kvt_clock_ns() < end) {
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, 100);
        for (int e = 0; e < n; e++) {
            br_conn_t *k = &c[evs[e].data.u32];
            ssize_t r = read(k->fd, k->in + k->inlen, k->incap - k->inlen - 1);
            if (r <= 0)
                return -1;
            k->inlen += (size_t)r;
            k->in[k->inlen] = '\0';
            /* one answer: head, then Content-Length bytes */
            char *he = strstr((char *)k->in, "\r\n\r\n");
            if (he == NULL)
                continue;
            char *cl = strstr((char *)k->in, "Content-Length: ");
            size_t blen = cl ? (size_t)strtoul(cl + 16, NULL, 10) : 0;
            size_t total = (size_t)(he + 4 - (char *)k->in) + blen;
            if (k->inlen < total)
                continue;
            if (strncmp((char *)k->in + 9, "200", 3) != 0)
                errors++;
            done++;
            memmove(k->in, k->in + total, k->inlen - total);
            k->inlen -= total;
            size_t q = next++ % o->prompts;
            if (kvt_bench_write_all(k->fd, reqs[q], reqlen[q]) != 0)
                return -1;
        }
    }
    double secs = (double)(kvt_clock_ns() - t0) / 1e9;
    for (uint32_t i = 0; i < nc; i++) {
        close(c[i].fd);
        free(c[i].in);
    }
    free(c);
    close(ep);
    *errors_p = errors;
    *done_p = done;
    return (double)done / secs;
}

/* CPU seconds (user + system) this process has used. */
static double br_self_cpu(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* CPU microseconds per query between two readings, 0 when either failed. */
static double br_us_per(double cpu0, double cpu1, uint64_t n)
{
    return cpu0 >= 0 && cpu1 >= 0 && n ? (cpu1 - cpu0) * 1e6 / (double)n : 0;
}

/* redis-benchmark -P 16 -t get against a fresh redis-server; GET/s, or 0 when unavailable. */
static double br_redis(void)
{
    if (access("/usr/bin/redis-server", X_OK) != 0 || access("/usr/bin/redis-benchmark", X_OK) != 0)
        return 0;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(s, (struct sockaddr *)&sa, &sl) != 0)
        return 0;
    unsigned port = ntohs(sa.sin_port);
    close(s);
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "redis-server --port %u --bind 127.0.0.1 --save '' --appendonly no --daemonize yes "
             "--pidfile /tmp/kvtier_bench_redis_%u.pid --logfile /dev/null",
             port, port);
    if (system(cmd) != 0)
        return 0;
    usleep(300000);
    snprintf(cmd, sizeof(cmd),
             "redis-benchmark -h 127.0.0.1 -p %u -P 16 -t get -n 2000000 -q 2>/dev/null "
             "| tr '\\r' '\\n' | grep -o 'GET: [0-9.]*' | tail -1",
             port);
    FILE *f = popen(cmd, "r");
    double rps = 0;
    if (f != NULL) {
        char line[128];
        if (fgets(line, sizeof(line), f) != NULL)
            rps = strtod(line + 5, NULL);
        pclose(f);
    }
    snprintf(cmd, sizeof(cmd),
             "kill $(cat /tmp/kvtier_bench_redis_%u.pid) 2>/dev/null; rm -f "
             "/tmp/kvtier_bench_redis_%u.pid",
             port, port);
    if (system(cmd) != 0)
        fprintf(stderr, "kvtier-bench: could not stop redis-server\n");
    return rps;
}

int kvt_bench_rpc_main(int argc, char **argv)
{
    br_opts_t o;
    int rc = br_parse(argc, argv, &o);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    signal(SIGPIPE, SIG_IGN);
    kvt_bench_daemon_t d = {0};
    uint32_t *tok = malloc((size_t)o.tokens * sizeof(uint32_t));
    uint8_t **rpc = calloc(o.prompts, sizeof(*rpc));
    size_t *rpclen = calloc(o.prompts, sizeof(*rpclen));
    char **http = calloc(o.prompts, sizeof(*http));
    size_t *httplen = calloc(o.prompts, sizeof(*httplen));
    uint8_t **ans = calloc(o.prompts, sizeof(*ans));
    size_t *anslen = calloc(o.prompts, sizeof(*anslen));
    if (!tok || !rpc || !rpclen || !http || !httplen || !ans || !anslen)
        return 1;
    char workers[16];
    snprintf(workers, sizeof(workers), "%u", o.workers);
    const char *args[] = {"--workers", workers, "--max-connections", "4096", NULL};
    if (kvt_bench_daemon_start(o.kvtierd, args, &d) != 0 ||
        kvt_bench_load(d.http, o.pods, o.prompts, o.tokens, tok) != 0) {
        kvt_bench_daemon_stop(&d);
        return 1;
    }
    /* requests, built before the clock starts */
    for (uint32_t i = 0; i < o.prompts; i++) {
        if ((rpc[i] = kvt_bench_query_frame(i, o.tokens, tok, &rpclen[i])) == NULL)
            return 1;
        size_t cap = (size_t)o.tokens * 12 + 256, n = 0;
        char *body = malloc(cap), *req = malloc(cap + 256);
        n = (size_t)snprintf(body, cap, "{\"model\":\"bench\",\"token_ids\":[");
        for (uint32_t t = 0; t < o.tokens; t++)
            n += (size_t)snprintf(body + n, cap - n, "%s%u", t ? "," : "", tok[t]);
        n += (size_t)snprintf(body + n, cap - n, "]}");
        httplen[i] = (size_t)snprintf(req, cap + 256,
                                      "POST /v1/query HTTP/1.1\r\nHost: b\r\nContent-Length: "
                                      "%zu\r\n\r\n%s",
                                      n, body);
        http[i] = req;
        free(body);
    }
    uint64_t steal0 = 0, tick0 = 0, steal1 = 0, tick1 = 0;
    bool have_steal = kvt_bench_steal(&steal0, &tick0);
    br_result_t closed = {0}, open = {0};
    double cpu0 = kvt_bench_proc_cpu(d.pid), self0 = br_self_cpu();
    if (br_rpc_run(&o, d.rpc, rpc, rpclen, 0, &closed) < 0) {
        fprintf(stderr, "kvtier-bench: rpc closed loop failed\n");
        kvt_bench_daemon_stop(&d);
        return 1;
    }
    double rpc_qps = (double)closed.done / closed.secs;
    double cpu1 = kvt_bench_proc_cpu(d.pid), self1 = br_self_cpu();
    double rpc_cpu_us = br_us_per(cpu0, cpu1, closed.done);
    double rpc_client_us = br_us_per(self0, self1, closed.done);
    open.caplat = (size_t)(rpc_qps * o.seconds) + 1024;
    open.lat = malloc(open.caplat * sizeof(uint64_t));
    if (open.lat == NULL || br_rpc_run(&o, d.rpc, rpc, rpclen, rpc_qps / 2, &open) < 0) {
        fprintf(stderr, "kvtier-bench: rpc open loop failed\n");
        kvt_bench_daemon_stop(&d);
        return 1;
    }
    kvt_bench_sort_u64(open.lat, open.nlat);
    double p50 = kvt_bench_percentile(open.lat, open.nlat, 50) / 1000.0;
    double p99 = kvt_bench_percentile(open.lat, open.nlat, 99) / 1000.0;
    uint64_t http_err = 0, http_done = 0;
    double cpu2 = kvt_bench_proc_cpu(d.pid);
    double http_qps = br_http_run(&o, d.http, http, httplen, &http_err, &http_done);
    double cpu3 = kvt_bench_proc_cpu(d.pid);
    double http_cpu_us = br_us_per(cpu2, cpu3, http_done);
    int cap_rc = br_rpc_capture(d.rpc, rpc, rpclen, o.prompts, ans, anslen);
    kvt_bench_daemon_stop(&d);
    /* the query work alone, once kvtierd no longer competes for the cores */
    bool inproc_agree = false;
    double inproc_us =
        cap_rc == 0 ? br_inproc(&o, rpc, rpclen, ans, anslen, tok, &inproc_agree) : -1;
    if (inproc_us < 0) {
        fprintf(stderr, "kvtier-bench: in-process query work failed\n");
        return 1;
    }
    /* the transport ceiling: the same client against a server doing no query work */
    br_result_t ceil = {0};
    pid_t cpid = -1;
    uint16_t cport = 0;
    double ccpu0 = -1, ccpu1 = -1, cself0 = -1, cself1 = -1;
    if (cap_rc == 0 &&
        kvt_bench_ceiling_start(o.workers, ans, anslen, o.prompts, &cpid, &cport) == 0) {
        ccpu0 = kvt_bench_proc_cpu(cpid);
        cself0 = br_self_cpu();
        cap_rc = br_rpc_run(&o, cport, rpc, rpclen, 0, &ceil);
        ccpu1 = kvt_bench_proc_cpu(cpid);
        cself1 = br_self_cpu();
    } else {
        cap_rc = -1;
    }
    kvt_bench_ceiling_stop(cpid);
    if (cap_rc != 0) {
        fprintf(stderr, "kvtier-bench: transport ceiling failed\n");
        return 1;
    }
    double ceil_qps = (double)ceil.done / ceil.secs;
    double ceil_cpu_us = br_us_per(ccpu0, ccpu1, ceil.done);
    double ceil_client_us = br_us_per(cself0, cself1, ceil.done);
    double redis = o.redis ? br_redis() : 0;
    have_steal = have_steal && kvt_bench_steal(&steal1, &tick1) && tick1 > tick0;
    /* -1: unknown (no /proc/stat steal column), not "no steal" */
    double steal_pct =
        have_steal ? 100.0 * (double)(steal1 - steal0) / (double)(tick1 - tick0) : -1;
    /* what these cores could serve if kvtierd added nothing to the work and the transport */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double bound = 1e6 * (double)(ncpu > 0 ? ncpu : 1) / (inproc_us + ceil_cpu_us + ceil_client_us);

    printf("kvtierd: %u workers; %u prompts of %u tokens on %u pods\n", o.workers, o.prompts,
           o.tokens, o.pods);
    printf("%-34s %12.0f /s  (%u conns x %u in flight, batches of %u, %" PRIu64 " errors)\n",
           "rpc queries, closed loop", rpc_qps, o.conns, o.depth, o.batch, closed.errors);
    printf("%-34s %12.1f us  (daemon user + system CPU per query; client %.1f us)\n",
           "rpc daemon CPU per query", rpc_cpu_us, rpc_client_us);
    printf("%-34s %12.0f /s  p50 %.1f us  p99 %.1f us  (%zu samples, %" PRIu64 " errors)\n",
           "rpc queries, open loop at half", (double)open.done / open.secs, p50, p99, open.nlat,
           open.errors);
    printf("%-34s %12.0f /s  (%u keep-alive conns, %" PRIu64 " errors)\n",
           "http queries, closed loop", http_qps, o.http_conns, http_err);
    printf("%-34s %12.1f us\n", "http daemon CPU per query", http_cpu_us);
    printf("%-34s %12.0f /s  (same client, recorded answers, no query work)\n",
           "rpc transport ceiling", ceil_qps);
    printf("%-34s %12.1f us  (client %.1f us)\n", "ceiling server CPU per query", ceil_cpu_us,
           ceil_client_us);
    printf("%-34s %12.2f us  (decode, hash, index, rank, encode: one thread; answers %s)\n",
           "query work in-process", inproc_us,
           inproc_agree ? "equal kvtierd's" : "DIFFER from kvtierd's");
    printf("%-34s %12.0f /s  (%ld cores / (in-process work + ceiling server + client CPU))\n",
           "rpc bound", bound, ncpu);
    printf("%-34s %12.0f /s  (redis-benchmark -P 16 -t get)\n", "redis GET (yardstick)", redis);
    printf("%-34s %12.1f %%  (of all CPU time during the run; high: a busy host; -1: unknown)\n",
           "cpu steal", steal_pct);
    printf("{\"bench\":\"rpc\",\"workers\":%u,\"tokens\":%u,\"conns\":%u,\"depth\":%u,"
           "\"batch\":%u,"
           "\"rpc_queries_per_sec\":%.0f,\"rpc_p50_us\":%.1f,\"rpc_p99_us\":%.1f,"
           "\"rpc_half_load_per_sec\":%.0f,\"http_queries_per_sec\":%.0f,"
           "\"rpc_server_cpu_us_per_query\":%.2f,\"http_server_cpu_us_per_query\":%.2f,"
           "\"rpc_client_cpu_us_per_query\":%.2f,"
           "\"rpc_ceiling_per_sec\":%.0f,\"rpc_vs_ceiling\":%.3f,"
           "\"ceiling_server_cpu_us_per_query\":%.2f,\"ceiling_client_cpu_us_per_query\":%.2f,"
           "\"inproc_us_per_query\":%.2f,\"inproc_agree\":%s,\"rpc_bound_per_sec\":%.0f,"
           "\"rpc_vs_bound\":%.3f,\"steal_pct\":%.1f,"
           "\"redis_get_per_sec\":%.0f,\"rpc_vs_redis\":%.3f,\"errors\":%" PRIu64 "}\n",
           o.workers, o.tokens, o.conns, o.depth, o.batch, rpc_qps, p50, p99,
           (double)open.done / open.secs, http_qps, rpc_cpu_us, http_cpu_us, rpc_client_us,
           ceil_qps, ceil_qps > 0 ? rpc_qps / ceil_qps : 0.0, ceil_cpu_us, ceil_client_us,
           inproc_us, inproc_agree ? "true" : "false", bound, rpc_qps / bound, steal_pct, redis,
           redis > 0 ? rpc_qps / redis : 0.0, closed.errors + open.errors + http_err + ceil.errors);
    for (uint32_t i = 0; i < o.prompts; i++) {
        free(rpc[i]);
        free(http[i]);
        free(ans[i]);
    }
    free(ans);
    free(anslen);
    free(rpc);
    free(rpclen);
    free(http);
    free(httplen);
    free(tok);
    free(open.lat);
    return closed.errors + open.errors + http_err + ceil.errors ? 1 : 0;
}
