/*
 * The client loop of `kvtier-bench latency` (see bench_latency.c): one slice
 * of a point on fresh connections, closed loop or open loop (Poisson
 * arrivals, latency from each request's scheduled time), and what the
 * scheduler says of the server's and the client's threads meanwhile.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_latency.h"
#include "common/clock.h"

typedef struct bl_conn {
    int fd;
    bool busy;
    uint64_t seq; /* the request in flight */
    uint64_t due; /* its scheduled (open loop) or send (closed loop) time */
    uint8_t *in;
    size_t inlen;
} bl_conn_t;

static void bl_add(bl_samples_t *s, uint64_t v)
{
    if (s->n == s->cap) {
        if (s->cap >= BL_MAX_SAMPLES)
            return; /* enough: the rest are counted in done, not in percentiles */
        size_t cap = s->cap ? s->cap * 2 : 65536;
        uint64_t *nv = realloc(s->v, cap * sizeof(*nv));
        if (nv == NULL)
            return;
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
}

void kvt_bl_result_drop(bl_result_t *r)
{
    free(r->lat.v);
    free(r->lag.v);
    memset(r, 0, sizeof(*r));
}

void kvt_bl_result_move(bl_result_t *dst, bl_result_t *src)
{
    for (size_t i = 0; i < src->lat.n; i++)
        bl_add(&dst->lat, src->lat.v[i]);
    for (size_t i = 0; i < src->lag.n; i++)
        bl_add(&dst->lag, src->lag.v[i]);
    dst->done += src->done;
    dst->errors += src->errors;
    dst->lost += src->lost;
    dst->ans_bytes = src->ans_bytes ? src->ans_bytes : dst->ans_bytes;
    dst->secs += src->secs;
    dst->server_cpu += src->server_cpu;
    dst->client_cpu += src->client_cpu;
    dst->server_wait += src->server_wait;
    dst->client_wait += src->client_wait;
    dst->server_vol += src->server_vol;
    dst->server_invol += src->server_invol;
    dst->client_vol += src->client_vol;
    dst->client_invol += src->client_invol;
    dst->others_cpu += src->others_cpu;
    dst->wall += src->wall;
    dst->overloaded = dst->overloaded || src->overloaded;
    kvt_bl_result_drop(src);
}

/* Scheduler counters summed over a process's threads (/proc/PID/task/TID/{schedstat,status}). */
typedef struct bl_sched {
    double run_s;   /* on a CPU */
    double wait_s;  /* runnable but waiting for a CPU (run-queue wait) */
    uint64_t vol;   /* voluntary context switches: went to sleep, so each needs a wake-up */
    uint64_t invol; /* involuntary: preempted */
} bl_sched_t;

static void bl_sched_read(pid_t pid, bl_sched_t *s)
{
    *s = (bl_sched_t){0};
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    if (dir == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char f[128], line[256];
        unsigned long long run = 0, wait = 0;
        snprintf(f, sizeof(f), "/proc/%d/task/%.16s/schedstat", (int)pid, de->d_name);
        FILE *fp = fopen(f, "r");
        if (fp != NULL) {
            if (fscanf(fp, "%llu %llu", &run, &wait) == 2) {
                s->run_s += (double)run / 1e9;
                s->wait_s += (double)wait / 1e9;
            }
            fclose(fp);
        }
        snprintf(f, sizeof(f), "/proc/%d/task/%.16s/status", (int)pid, de->d_name);
        if ((fp = fopen(f, "r")) == NULL)
            continue;
        while (fgets(line, sizeof(line), fp) != NULL) {
            unsigned long long v;
            if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1)
                s->vol += v;
            else if (sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
                s->invol += v;
        }
        fclose(fp);
    }
    closedir(dir);
}

uint32_t kvt_bl_kvtierd_workers(pid_t pid)
{
    char path[64], name[32] = "";
    snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
    FILE *mf = fopen(path, "r");
    if (mf == NULL)
        return 0;
    bool named = fgets(name, sizeof(name), mf) != NULL;
    fclose(mf);
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = named ? opendir(path) : NULL;
    if (dir == NULL)
        return 0;
    uint32_t n = 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || atoi(de->d_name) == (int)pid)
            continue;
        char f[96], comm[32] = "";
        snprintf(f, sizeof(f), "/proc/%d/task/%.16s/comm", (int)pid, de->d_name);
        FILE *fp = fopen(f, "r");
        if (fp == NULL)
            continue;
        if (fgets(comm, sizeof(comm), fp) != NULL && strcmp(comm, name) == 0)
            n++;
        fclose(fp);
    }
    closedir(dir);
    return n;
}

/* CPU seconds all processes spent in user and system mode so far (/proc/stat), or -1. */
static double bl_machine_busy(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL)
        return -1;
    unsigned long long u = 0, n = 0, sy = 0;
    int got = fscanf(f, "cpu %llu %llu %llu", &u, &n, &sy);
    fclose(f);
    return got == 3 ? (double)(u + n + sy) / (double)sysconf(_SC_CLK_TCK) : -1;
}

/* A slice's connections and the state of its run. */
typedef struct bl_run {
    bl_proto_t *p;
    bl_conn_t *c;
    uint32_t nc;
    int ep;
    uint64_t next_seq;
} bl_run_t;

static int bl_send(bl_run_t *r, bl_conn_t *k, uint64_t due)
{
    size_t len;
    const uint8_t *req = r->p->request(r->p, r->next_seq, &len);
    k->seq = r->next_seq++;
    k->due = due;
    k->busy = true;
    return kvt_bench_write_all(k->fd, req, len);
}

/*
 * Reads what connection @k holds and takes its answer when whole. Returns 1
 * (answered: *@t_p the time), 0 (not whole yet) or -1 (closed, or no answer).
 */
static int bl_recv(bl_run_t *r, bl_conn_t *k, bl_result_t *res, uint64_t *t_p, bool *ok_p)
{
    ssize_t got = read(k->fd, k->in + k->inlen, BL_IN_CAP - k->inlen);
    if (got < 0 && errno == EINTR)
        return 0;
    if (got <= 0)
        return -1;
    uint64_t t = kvt_clock_ns();
    k->inlen += (size_t)got;
    bool ok = false;
    long len = r->p->answer(k->in, k->inlen, k->seq, &ok);
    if (len < 0 || (len == 0 && k->inlen == BL_IN_CAP) || !k->busy)
        return -1;
    if (len == 0)
        return 0;
    if ((size_t)len != k->inlen)
        return -1; /* bytes after the answer to the only request in flight */
    res->ans_bytes = (uint64_t)len;
    k->inlen = 0;
    k->busy = false;
    *t_p = t;
    *ok_p = ok;
    return 1;
}

/*
 * Closed loop on every connection for @ns: each answer is followed at once
 * by the next request. Recorded into @res when @res is not NULL (else a
 * warm-up). 0 or -1.
 */
static int bl_closed(bl_run_t *r, uint64_t ns, bl_result_t *res)
{
    bl_result_t scratch = {0};
    bl_result_t *out = res ? res : &scratch;
    uint64_t t0 = kvt_clock_ns(), end = t0 + ns;
    for (uint32_t i = 0; i < r->nc; i++)
        if (!r->c[i].busy && bl_send(r, &r->c[i], kvt_clock_ns()) != 0)
            return -1;
    for (;;) {
        uint64_t now = kvt_clock_ns();
        if (now >= end)
            break;
        struct epoll_event evs[64];
        int n = epoll_wait(r->ep, evs, 64, (int)((end - now) / 1000000u) + 1);
        for (int e = 0; e < n; e++) {
            bl_conn_t *k = &r->c[evs[e].data.u32];
            uint64_t t;
            bool ok;
            int got = bl_recv(r, k, out, &t, &ok);
            if (got < 0)
                return -1;
            if (got == 0 || t >= end)
                continue; /* an answer after the end is not counted */
            out->done++;
            out->errors += !ok;
            if (res != NULL)
                bl_add(&res->lat, t - k->due);
            if (bl_send(r, k, kvt_clock_ns()) != 0)
                return -1;
        }
    }
    out->secs += (double)(kvt_clock_ns() - t0) / 1e9;
    return 0;
}

/*
 * Open loop for @ns: Poisson arrivals at @rate per second (the gaps drawn
 * from @seed), each sent on a free connection as soon as there is one, its
 * latency counted from its scheduled time. Then up to BL_DRAIN_NS for the
 * answers still owed; requests unanswered by then are counted lost, with the
 * time waited as their latency (a lower bound). 0 or -1.
 */
static int bl_open(bl_run_t *r, double rate, uint64_t ns, uint64_t seed, bl_result_t *res)
{
    uint64_t *queue = malloc(BL_MAX_QUEUED * sizeof(uint64_t)); /* due times waiting */
    uint32_t *idle = malloc(r->nc * sizeof(uint32_t));
    if (queue == NULL || idle == NULL) {
        free(queue);
        free(idle);
        return -1;
    }
    size_t qhead = 0, qlen = 0, nidle = 0;
    for (uint32_t i = r->nc; i-- > 0;)
        if (!r->c[i].busy)
            idle[nidle++] = i;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    double mean_ns = 1e9 / rate;
    uint64_t t0 = kvt_clock_ns(), end = t0 + ns, give_up = end + BL_DRAIN_NS;
    double next = (double)t0;
    int rc = -1;
#define BL_GAP() (-log(((double)(kvt_bench_rand(&x) >> 11) + 1.0) / 9007199254740992.0) * mean_ns)
    next += BL_GAP();
    for (;;) {
        uint64_t now = kvt_clock_ns();
        while (next < (double)end && next <= (double)now) {
            if (qlen == BL_MAX_QUEUED) {
                res->overloaded = true; /* the server fell far behind: stop offering */
                next = (double)end;
                break;
            }
            queue[(qhead + qlen++) % BL_MAX_QUEUED] = (uint64_t)next;
            next += BL_GAP();
        }
        while (qlen > 0 && nidle > 0) {
            uint64_t due = queue[qhead];
            qhead = (qhead + 1) % BL_MAX_QUEUED;
            qlen--;
            bl_add(&res->lag, kvt_clock_ns() - due);
            if (bl_send(r, &r->c[idle[--nidle]], due) != 0)
                goto out;
        }
        if (next >= (double)end && qlen == 0 && nidle == r->nc)
            break; /* every arrival answered */
        if (now >= give_up) {
            for (uint32_t i = 0; i < r->nc; i++)
                if (r->c[i].busy) {
                    res->lost++;
                    bl_add(&res->lat, now - r->c[i].due);
                }
            for (; qlen > 0; qlen--, qhead = (qhead + 1) % BL_MAX_QUEUED) {
                res->lost++;
                bl_add(&res->lat, now - queue[qhead]);
            }
            break;
        }
        /* sleep until the next arrival, or an answer (no busy poll: the servers need the cores) */
        uint64_t wake = next < (double)end ? (uint64_t)next : give_up;
        uint64_t wait = wake > now ? wake - now : 0;
        if (qlen > 0 && nidle == 0 && next < (double)end)
            wait = wait < 1000000 ? wait : 1000000;
        struct timespec ts = {(time_t)(wait / 1000000000u), (long)(wait % 1000000000u)};
        struct epoll_event evs[64];
        int n = epoll_pwait2(r->ep, evs, 64, &ts, NULL);
        for (int e = 0; e < n; e++) {
            bl_conn_t *k = &r->c[evs[e].data.u32];
            uint64_t t;
            bool ok;
            int got = bl_recv(r, k, res, &t, &ok);
            if (got < 0)
                goto out;
            if (got == 0)
                continue;
            res->done++;
            res->errors += !ok;
            bl_add(&res->lat, t - k->due);
            idle[nidle++] = evs[e].data.u32;
        }
    }
#undef BL_GAP
    res->secs += (double)(end - t0) / 1e9;
    rc = 0;
out:
    free(queue);
    free(idle);
    return rc;
}

static void bl_close(bl_run_t *r)
{
    for (uint32_t i = 0; i < r->nc; i++) {
        if (r->c[i].fd >= 0)
            close(r->c[i].fd);
        free(r->c[i].in);
    }
    free(r->c);
    if (r->ep >= 0)
        close(r->ep);
    r->c = NULL;
    r->ep = -1;
}

static int bl_connect(bl_run_t *r, bl_proto_t *p, uint32_t nc)
{
    *r = (bl_run_t){.p = p, .ep = epoll_create1(EPOLL_CLOEXEC), .next_seq = 1};
    r->c = calloc(nc, sizeof(*r->c));
    if (r->c == NULL)
        return -1; /* nc stays 0: bl_close() has no connection to look at */
    r->nc = nc;
    for (uint32_t i = 0; i < nc; i++)
        r->c[i].fd = -1; /* before any failure: bl_close() must not close fd 0 */
    if (r->ep < 0)
        return -1;
    for (uint32_t i = 0; i < nc; i++) {
        r->c[i].fd = kvt_bench_connect(p->port);
        r->c[i].in = malloc(BL_IN_CAP);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        if (r->c[i].fd < 0 || r->c[i].in == NULL ||
            epoll_ctl(r->ep, EPOLL_CTL_ADD, r->c[i].fd, &ev) != 0)
            return -1;
    }
    return 0;
}

/* Waits (bounded) until no connection has a request in flight; the warm-up's last answers. */
static int bl_settle(bl_run_t *r)
{
    bl_result_t scratch = {0};
    uint64_t give_up = kvt_clock_ns() + BL_DRAIN_NS;
    for (;;) {
        uint32_t busy = 0;
        for (uint32_t i = 0; i < r->nc; i++)
            busy += r->c[i].busy;
        if (busy == 0)
            return 0;
        if (kvt_clock_ns() >= give_up)
            return -1;
        struct epoll_event evs[64];
        int n = epoll_wait(r->ep, evs, 64, 100);
        for (int e = 0; e < n; e++) {
            uint64_t t;
            bool ok;
            if (bl_recv(r, &r->c[evs[e].data.u32], &scratch, &t, &ok) < 0)
                return -1;
        }
    }
}

int kvt_bl_slice(bl_proto_t *p, uint32_t nc, double rate, uint64_t ns, uint64_t seed,
                 bl_result_t *res)
{
    bl_run_t r;
    int rc = -1;
    if (bl_connect(&r, p, nc) != 0)
        goto out;
    if (bl_closed(&r, BL_WARMUP_NS, NULL) != 0 || (rate > 0 && bl_settle(&r) != 0))
        goto out;
    bl_sched_t s0, s1, c0, c1;
    bl_sched_read(p->pid, &s0);
    bl_sched_read(getpid(), &c0);
    double m0 = bl_machine_busy(), w0 = (double)kvt_clock_ns() / 1e9;
    rc = rate > 0 ? bl_open(&r, rate, ns, seed, res) : bl_closed(&r, ns, res);
    double m1 = bl_machine_busy(), w1 = (double)kvt_clock_ns() / 1e9;
    bl_sched_read(p->pid, &s1);
    bl_sched_read(getpid(), &c1);
    res->server_cpu += s1.run_s - s0.run_s;
    res->server_wait += s1.wait_s - s0.wait_s;
    res->server_vol += s1.vol - s0.vol;
    res->server_invol += s1.invol - s0.invol;
    res->client_cpu += c1.run_s - c0.run_s;
    res->client_wait += c1.wait_s - c0.wait_s;
    res->client_vol += c1.vol - c0.vol;
    res->client_invol += c1.invol - c0.invol;
    res->wall += w1 - w0;
    if (m0 >= 0 && m1 >= 0) {
        double others = (m1 - m0) - (s1.run_s - s0.run_s) - (c1.run_s - c0.run_s);
        res->others_cpu += others > 0 ? others : 0;
    }
out:
    bl_close(&r);
    return rc;
}
