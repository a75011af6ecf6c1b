/*
 * server/srv.c: daemon lifecycle, the writer thread, registry snapshots and
 * published counters. srv_int.h describes the threads.
 */
#define KVT_LOG_COMPONENT "srv"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/listener.h>
#include <event2/thread.h>

#include "common/log.h"
#include "server/srv_int.h"

/* SO_REUSEPORT lets every worker own a listening socket on the same port. */
#ifndef SO_REUSEPORT
#error "kvtierd needs SO_REUSEPORT (Linux >= 3.9)"
#endif

static int stop_pipe[2] = {-1, -1}; /* written by kvt_srv_stop(), read by kvt_srv_run() */

uint64_t srv_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- addresses and listeners ---------------------------------------------- */

/* Parses "host:port" or "[v6]:port" into @ss. */
static kvt_status_t parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len_p)
{
    char host[256];
    const char *colon = strrchr(text, ':');
    if (colon == NULL || colon == text || strlen(colon + 1) == 0 ||
        (size_t)(colon - text) >= sizeof(host))
        return KVT_ERR_INVAL;
    size_t hl = (size_t)(colon - text);
    memcpy(host, text, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || port > 65535)
        return KVT_ERR_INVAL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || ai == NULL)
        return KVT_ERR_INVAL;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len_p = ai->ai_addrlen;
    freeaddrinfo(ai);
    return KVT_OK;
}

static bool is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)(const void *)ss;
        return (ntohl(s->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)(const void *)ss;
        return IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
    }
    return false;
}

static int listen_tcp(const struct sockaddr_storage *ss, socklen_t len)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
        bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static uint16_t bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)(void *)&ss)->sin6_port);
}

/* Opens @text's listener; with @port_p non-zero, binds that port instead (other workers). */
static int open_listener(kvt_srv_t *srv, const char *what, const char *text, uint16_t port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (parse_addr(text, &ss, &len) != KVT_OK) {
        kvt_log_error("%s address '%s' is not host:port", what, text);
        return -2;
    }
    if (!is_loopback(&ss) && !srv->cfg.allow_remote) {
        kvt_log_error("%s address '%s' is not loopback: pass --allow-remote to bind it", what,
                      text);
        return -2;
    }
    if (port != 0) {
        if (ss.ss_family == AF_INET)
            ((struct sockaddr_in *)(void *)&ss)->sin_port = htons(port);
        else
            ((struct sockaddr_in6 *)(void *)&ss)->sin6_port = htons(port);
    }
    int fd = listen_tcp(&ss, len);
    if (fd < 0)
        kvt_log_error("cannot listen on %s %s: %s", what, text, strerror(errno));
    return fd;
}

static int listen_unix(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        kvt_log_error("unix socket path too long: %s", path);
        return -2;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    unlink(path); /* a stale socket from an earlier run */
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 1024) != 0) {
        kvt_log_error("cannot listen on unix socket %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    chmod(path, 0600); /* only this user may talk to the daemon */
    return fd;
}

/* ---- auth ------------------------------------------------------------------- */

static kvt_status_t load_token(kvt_srv_t *srv, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        kvt_log_error("cannot read auth token file %s: %s", path, strerror(errno));
        return KVT_ERR_INVAL;
    }
    char buf[KVT_IDX_MAX_NAME + 2];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    if (n == 0 || n > KVT_IDX_MAX_NAME) {
        kvt_log_error("auth token file %s must hold 1..%u bytes", path, KVT_IDX_MAX_NAME);
        return KVT_ERR_INVAL;
    }
    srv->auth_token = strdup(buf);
    return srv->auth_token ? KVT_OK : KVT_ERR_NO_MEM;
}

bool srv_auth_ok(const kvt_srv_t *srv, const char *token, size_t len)
{
    if (srv->auth_token == NULL)
        return true;
    size_t want = strlen(srv->auth_token);
    if (token == NULL)
        return false;
    /* constant time in the token's content */
    unsigned diff = (unsigned)(len ^ want);
    for (size_t i = 0; i < want; i++)
        diff |= (unsigned)(srv->auth_token[i] ^ (i < len ? token[i] : 0));
    return diff == 0;
}

/* ---- readiness --------------------------------------------------------------- */

bool srv_ready(kvt_srv_t *srv, char *why, size_t whylen)
{
    if (atomic_load(&srv->draining)) {
        snprintf(why, whylen, "stopping");
        return false;
    }
    uint64_t beat = __atomic_load_n(&srv->writer_beat_ns, __ATOMIC_RELAXED), now = srv_now_ns();
    /* the writer comes round its loop every 5 ms when idle; a long stall is a stuck apply */
    if (now > beat && now - beat > srv->cfg.writer_stall_ms * 1000000ull) {
        snprintf(why, whylen, "the index writer has made no progress for %.3f s",
                 (double)(now - beat) / 1e9);
        return false;
    }
    return true;
}

/* ---- registry snapshots ------------------------------------------------------ */

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* Writer. Builds and publishes a snapshot of pods and namespaces. */
static void reg_publish(kvt_srv_t *srv)
{
    uint32_t npods = kvt_idx_pod_limit(srv->idx), nns = kvt_idx_ns_count(srv->idx);
    size_t names = 1;
    /* pod names rendered once as JSON strings, for the HTTP answers */
    kvt_jbuf_t js;
    kvt_jbuf_init(&js);
    uint32_t *js_off = malloc((npods + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < npods && js_off != NULL; i++) {
        const char *n = kvt_idx_pod_name(srv->idx, i, NULL);
        js_off[i] = (uint32_t)js.len;
        if (n != NULL) {
            names += strlen(n) + 1;
            kvt_jbuf_str(&js, n, strlen(n));
        }
    }
    if (js_off == NULL || js.oom || js.len > UINT32_MAX / 2) {
        kvt_log_warn("registry snapshot: out of memory; keeping the old one");
        free(js_off);
        kvt_jbuf_cleanup(&js);
        return;
    }
    js_off[npods] = (uint32_t)js.len;
    names += js.len;
    for (uint32_t i = 0; i < nns; i++) {
        const char *lora, *model = kvt_idx_ns_name(srv->idx, kvt_idx_ns_id(srv->idx, i), &lora);
        if (model != NULL) /* NULL: a dropped namespace's free slot */
            names += strlen(model) + strlen(lora) + 2;
    }
    uint32_t nb = 16;
    while (nb < npods * 2u)
        nb *= 2;
    size_t bytes = sizeof(kvt_srv_reg_t) + npods * sizeof(reg_pod_t) + nns * sizeof(reg_ns_t) +
                   nb * sizeof(uint32_t) + names;
    kvt_srv_reg_t *r = calloc(1, bytes);
    if (r == NULL) {
        kvt_log_warn("registry snapshot: out of memory; keeping the old one");
        free(js_off);
        kvt_jbuf_cleanup(&js);
        return;
    }
    r->bytes = bytes;
    r->npods = npods;
    r->nns = nns;
    r->nbucket = nb;
    r->pods = (reg_pod_t *)(void *)(r + 1);
    r->nss = (reg_ns_t *)(void *)(r->pods + npods);
    r->bucket = (uint32_t *)(void *)(r->nss + nns);
    r->names = (char *)(r->bucket + nb);
    memset(r->bucket, 0xff, nb * sizeof(uint32_t));
    size_t off = 1;
    if (js.len > 0)
        memcpy(r->names + off, js.buf, js.len);
    size_t js_base = off;
    off += js.len;
    for (uint32_t i = 0; i < npods; i++) {
        uint32_t rank = 0;
        const char *n = kvt_idx_pod_name(srv->idx, i, &rank);
        r->pods[i].next = UINT32_MAX;
        if (n == NULL)
            continue;
        size_t l = strlen(n);
        memcpy(r->names + off, n, l + 1);
        r->pods[i] = (reg_pod_t){(uint32_t)off,
                                 (uint32_t)l,
                                 (uint32_t)(js_base + js_off[i]),
                                 js_off[i + 1] - js_off[i],
                                 rank,
                                 1,
                                 UINT32_MAX};
        off += l + 1;
        uint32_t b = (uint32_t)name_hash(n, l) & (nb - 1);
        r->pods[i].next = r->bucket[b];
        r->bucket[b] = i;
    }
    uint32_t j = 0;
    for (uint32_t i = 0; i < nns; i++) {
        uint32_t id = kvt_idx_ns_id(srv->idx, i);
        const char *lora, *model = kvt_idx_ns_name(srv->idx, id, &lora);
        if (model == NULL)
            continue;
        size_t ml = strlen(model), ll = strlen(lora);
        r->nss[j].model_off = (uint32_t)off;
        memcpy(r->names + off, model, ml + 1);
        off += ml + 1;
        r->nss[j].lora_off = (uint32_t)off;
        memcpy(r->names + off, lora, ll + 1);
        off += ll + 1;
        r->nss[j].ns = id;
        r->nss[j].block_size = kvt_idx_ns_block_size(srv->idx, id);
        j++;
    }
    r->nns = j;
    srv->reg_pods = kvt_idx_pod_limit(srv->idx);
    srv->reg_nns = j; /* live namespaces, as kvt_idx_stats_t.namespaces counts them */
    srv->reg_live_pods = 0;
    for (uint32_t i = 0; i < npods; i++)
        srv->reg_live_pods += r->pods[i].live;
    free(js_off);
    kvt_jbuf_cleanup(&js);
    kvt_srv_reg_t *old = srv->reg;
    __atomic_store_n(&srv->reg, r, __ATOMIC_RELEASE);
    if (old != NULL)
        kvt_ebr_retire(&srv->ebr, old, old->bytes);
}

kvt_srv_reg_t *srv_reg_enter(kvt_srv_worker_t *w)
{
    kvt_ebr_enter(&w->srv->ebr, w->ebr_slot);
    return __atomic_load_n(&w->srv->reg, __ATOMIC_ACQUIRE);
}

void srv_reg_exit(kvt_srv_worker_t *w)
{
    kvt_ebr_exit(&w->srv->ebr, w->ebr_slot);
}

const reg_ns_t *srv_reg_ns(const kvt_srv_reg_t *r, const char *model, size_t mlen, const char *lora,
                           size_t llen)
{
    for (uint32_t i = 0; i < r->nns; i++) {
        const char *m = r->names + r->nss[i].model_off, *l = r->names + r->nss[i].lora_off;
        if (strlen(m) == mlen && memcmp(m, model, mlen) == 0 && strlen(l) == llen &&
            memcmp(l, lora, llen) == 0)
            return &r->nss[i];
    }
    return NULL;
}

size_t srv_reg_pods_named(const kvt_srv_reg_t *r, const char *name, size_t len, uint32_t *out,
                          size_t cap)
{
    size_t n = 0;
    uint32_t b = (uint32_t)name_hash(name, len) & (r->nbucket - 1);
    for (uint32_t id = r->bucket[b]; id != UINT32_MAX && n < cap; id = r->pods[id].next) {
        const char *s = r->names + r->pods[id].name_off;
        if (r->pods[id].name_len == len && memcmp(s, name, len) == 0)
            out[n++] = id;
    }
    return n;
}

/* ---- writer ---------------------------------------------------------------- */

void srv_job_free(srv_job_t *job)
{
    if (job == NULL)
        return;
    kvt_evbatch_cleanup(&job->batch);
    kvt_jbuf_cleanup(&job->answer);
    free(job->engine);
    free(job);
}

/* Wakes the writer's poll (the eventfd counts; one read resets it). */
static void srv_wake_writer(kvt_srv_t *srv)
{
    uint64_t one = 1;
    ssize_t r = write(srv->q_efd, &one, sizeof(one));
    (void)r; /* only fails when the counter is saturated: the writer is awake anyway */
}

kvt_status_t srv_submit(kvt_srv_t *srv, srv_job_t *job)
{
    pthread_mutex_lock(&srv->q_mu);
    if (srv->q_stop || srv->q_len >= srv->cfg.writer_queue) {
        pthread_mutex_unlock(&srv->q_mu);
        return KVT_ERR_LIMIT;
    }
    job->next = NULL;
    if (srv->q_tail)
        srv->q_tail->next = job;
    else
        srv->q_head = job;
    srv->q_tail = job;
    srv->q_len++;
    pthread_mutex_unlock(&srv->q_mu);
    srv_wake_writer(srv);
    return KVT_OK;
}

static void answer_error(srv_job_t *job, int status, const char *msg)
{
    job->http_status = status;
    snprintf(job->errmsg, sizeof(job->errmsg), "%s", msg);
    kvt_jbuf_reset(&job->answer);
    kvt_jbuf_cstr(&job->answer, "{\"error\":");
    kvt_jbuf_str(&job->answer, msg, strlen(msg));
    kvt_jbuf_cstr(&job->answer, "}");
}

/* Ids are handed out, reused and namespaces created only by applying events: republish on change.
 */
static void reg_maybe_publish(kvt_srv_t *srv)
{
    kvt_idx_stats_t st;
    kvt_idx_stats(srv->idx, &st);
    if (st.pods != srv->reg_live_pods || st.namespaces != srv->reg_nns ||
        kvt_idx_pod_limit(srv->idx) != srv->reg_pods)
        reg_publish(srv);
}

static void job_events(kvt_srv_t *srv, srv_job_t *job)
{
    kvt_evbatch_t *b = &job->batch;
    kvt_ev_counters_t before = srv->st_ev;
    char err[256];
    job->st = kvt_ev_apply(srv->idx, srv->ev_ctx, b, srv->cfg.block_size, KVT_EV_STRICT,
                           &srv->st_ev, err, sizeof(err));
    if (job->st != KVT_OK) {
        srv->st_rejected += job->st == KVT_ERR_INVAL;
        answer_error(job, kvt_proto_http_status(job->st), err[0] ? err : kvt_status_str(job->st));
        return;
    }
    srv->st_batches++;
    kvt_zsub_publish(srv->zsub, b); /* a failure is counted there; the batch stays applied */
    job->http_status = 200;
    kvt_jbuf_t *o = &job->answer;
    kvt_jbuf_cstr(o, "{\"applied\":");
    kvt_jbuf_u64(o, srv->st_ev.events - before.events);
    kvt_jbuf_cstr(o, ",\"blocks\":");
    kvt_jbuf_u64(o, srv->st_ev.blocks - before.blocks);
    kvt_jbuf_cstr(o, ",\"unresolved\":");
    kvt_jbuf_u64(o, srv->st_ev.unresolved - before.unresolved);
    kvt_jbuf_cstr(o, ",\"orphans\":");
    kvt_jbuf_u64(o, srv->st_ev.orphans - before.orphans);
    kvt_jbuf_cstr(o, ",\"dropped\":");
    kvt_jbuf_u64(o, srv->st_ev.dropped - before.dropped);
    kvt_jbuf_cstr(o, ",\"recovered\":");
    kvt_jbuf_u64(o, srv->st_ev.recovered - before.recovered);
    kvt_jbuf_cstr(o, ",\"ignored\":");
    kvt_jbuf_u64(o, b->unknown + (srv->st_ev.remote - before.remote) +
                        (srv->st_ev.other_groups - before.other_groups) +
                        (srv->st_ev.unknown_medium - before.unknown_medium));
    kvt_jbuf_cstr(o, "}");
}

static void job_drop(kvt_srv_t *srv, srv_job_t *job)
{
    uint32_t ranks = 0;
    uint64_t entries = 0;
    for (uint32_t id = 0; id < kvt_idx_pod_limit(srv->idx); id++) {
        const char *n = kvt_idx_pod_name(srv->idx, id, NULL);
        if (n == NULL || strcmp(n, job->name) != 0)
            continue;
        entries += kvt_idx_pod_entries(srv->idx, id);
        kvt_ev_ctx_pod_reset(srv->ev_ctx, id); /* the id may go to another pod */
        if (kvt_idx_pod_drop(srv->idx, id) == KVT_OK)
            ranks++;
    }
    bool unsubscribed = kvt_zsub_remove(srv->zsub, job->name);
    if (ranks == 0 && !unsubscribed) {
        job->st = KVT_ERR_NOT_FOUND;
        char msg[KVT_IDX_MAX_NAME + 32];
        snprintf(msg, sizeof(msg), "unknown pod '%s'", job->name);
        answer_error(job, 404, msg);
        return;
    }
    srv->st_drops++;
    reg_publish(srv);
    job->st = KVT_OK;
    job->http_status = 200;
    kvt_jbuf_cstr(&job->answer, "{\"pod\":");
    kvt_jbuf_str(&job->answer, job->name, strlen(job->name));
    kvt_jbuf_cstr(&job->answer, ",\"dp_ranks\":");
    kvt_jbuf_u64(&job->answer, ranks);
    kvt_jbuf_cstr(&job->answer, ",\"entries\":");
    kvt_jbuf_u64(&job->answer, entries);
    kvt_jbuf_cstr(&job->answer,
                  unsubscribed ? ",\"unsubscribed\":true}" : ",\"unsubscribed\":false}");
}

/* Drops every namespace (base model and LoRAs) of model job->name: what DELETE /v1/models does. */
static void job_model_drop(kvt_srv_t *srv, srv_job_t *job)
{
    uint32_t nss = 0;
    uint64_t blocks = 0;
    for (uint32_t slot = 0; slot < kvt_idx_ns_count(srv->idx); slot++) {
        uint32_t ns = kvt_idx_ns_id(srv->idx, slot);
        const char *model = ns == KVT_IDX_NS_NONE ? NULL : kvt_idx_ns_name(srv->idx, ns, NULL);
        uint64_t b = 0;
        if (model == NULL || strcmp(model, job->name) != 0 ||
            kvt_idx_ns_drop(srv->idx, ns, &b) != KVT_OK)
            continue;
        nss++;
        blocks += b;
    }
    if (nss == 0) {
        job->st = KVT_ERR_NOT_FOUND;
        char msg[KVT_IDX_MAX_NAME + 32];
        snprintf(msg, sizeof(msg), "unknown model '%s'", job->name);
        answer_error(job, 404, msg);
        return;
    }
    reg_publish(srv); /* a slot reused under a new id would not change the counts */
    job->st = KVT_OK;
    job->http_status = 200;
    kvt_jbuf_cstr(&job->answer, "{\"model\":");
    kvt_jbuf_str(&job->answer, job->name, strlen(job->name));
    kvt_jbuf_cstr(&job->answer, ",\"namespaces\":");
    kvt_jbuf_u64(&job->answer, nss);
    kvt_jbuf_cstr(&job->answer, ",\"blocks\":");
    kvt_jbuf_u64(&job->answer, blocks);
    kvt_jbuf_cstr(&job->answer, "}");
}

/* kvt_zsub_add(), after refusing a non-loopback bind without --allow-remote. */
static kvt_status_t srv_engine_add(kvt_srv_t *srv, const kvt_zsub_engine_t *e, char *err,
                                   size_t errlen)
{
    if (kvt_zsub_engine_binds(e) && !srv_zmq_local(e->endpoint) && !srv->cfg.allow_remote) {
        snprintf(err, errlen, "binding %s needs kvtierd --allow-remote", e->endpoint);
        return KVT_ERR_INVAL;
    }
    return kvt_zsub_add(srv->zsub, e, err, errlen);
}

/* Subscribes to an engine's event streams; answers with the endpoints in use. */
static void job_engine_add(kvt_srv_t *srv, srv_job_t *job)
{
    char err[320];
    job->st = srv_engine_add(srv, job->engine, err, sizeof(err));
    if (job->st != KVT_OK) {
        /* IO here is an endpoint that would not bind or connect: the request's fault */
        answer_error(job, job->st == KVT_ERR_IO ? 400 : kvt_proto_http_status(job->st),
                     err[0] ? err : kvt_status_str(job->st));
        return;
    }
    job->http_status = 200;
    size_t n = kvt_zsub_streams(srv->zsub, NULL, 0);
    kvt_zsub_stream_info_t *info = malloc(n * sizeof(*info));
    kvt_jbuf_t *o = &job->answer;
    kvt_jbuf_cstr(o, "{\"pod\":");
    kvt_jbuf_str(o, job->engine->pod, strlen(job->engine->pod));
    kvt_jbuf_cstr(o, ",\"dp_size\":");
    kvt_jbuf_u64(o, job->engine->dp_size);
    kvt_jbuf_cstr(o, ",\"endpoints\":[");
    if (info != NULL) {
        kvt_zsub_streams(srv->zsub, info, n);
        bool first = true;
        for (size_t i = 0; i < n; i++) {
            if (strcmp(info[i].pod, job->engine->pod) != 0)
                continue;
            if (!first)
                kvt_jbuf_cstr(o, ",");
            first = false;
            kvt_jbuf_str(o, info[i].endpoint, strlen(info[i].endpoint));
        }
        free(info);
    }
    kvt_jbuf_cstr(o, "]}");
}

/* Writer. Copies counters for /v1/stats and /metrics. */
static void stats_publish(kvt_srv_t *srv)
{
    kvt_idx_stats_t s;
    kvt_idx_stats(srv->idx, &s);
    uint32_t npods = kvt_idx_pod_limit(srv->idx);
    uint64_t *ent = NULL;
    if (npods > 0) {
        ent = malloc(npods * sizeof(*ent));
        if (ent == NULL)
            return;
        for (uint32_t i = 0; i < npods; i++)
            ent[i] =
                kvt_idx_pod_name(srv->idx, i, NULL) ? kvt_idx_pod_entries(srv->idx, i) : UINT64_MAX;
    }
    size_t nst = kvt_zsub_streams(srv->zsub, NULL, 0);
    kvt_zsub_stream_info_t *streams = nst ? malloc(nst * sizeof(*streams)) : NULL;
    if (streams != NULL)
        kvt_zsub_streams(srv->zsub, streams, nst);
    else
        nst = 0;
    /* totals count what came over HTTP/RPC and over the streams */
    kvt_ev_counters_t ev = srv->st_ev;
    uint64_t batches = srv->st_batches;
    for (size_t i = 0; i < nst; i++) {
        kvt_ev_counters_add(&ev, &streams[i].c.ev);
        batches += streams[i].c.batches;
    }
    kvt_ev_ctx_stats_t evctx;
    kvt_ev_ctx_stats(srv->ev_ctx, &evctx);
    pthread_mutex_lock(&srv->stats_mu);
    srv->st_idx = s;
    srv->st_ev_pub = ev;
    srv->st_batches_pub = batches;
    kvt_zsub_stream_info_t *old_streams = srv->st_streams;
    srv->st_streams = streams;
    srv->st_nstreams = nst;
    srv->st_rejected_pub = srv->st_rejected;
    srv->st_drops_pub = srv->st_drops;
    srv->st_forgotten_pub = srv->st_forgotten;
    srv->st_evctx = evctx;
    kvt_zsub_publish_info(srv->zsub, &srv->st_pub);
    uint64_t *old = srv->st_pod_entries;
    srv->st_pod_entries = ent;
    srv->st_npods = npods;
    __atomic_store_n(&srv->st_gen, srv->st_gen + 1, __ATOMIC_RELEASE); /* shared bodies are old */
    pthread_mutex_unlock(&srv->stats_mu);
    free(old);
    free(old_streams);
}

static void deliver(srv_job_t *job)
{
    kvt_srv_worker_t *w = job->worker;
    pthread_mutex_lock(&w->done_mu);
    job->next = NULL;
    if (w->done_tail)
        w->done_tail->next = job;
    else
        w->done_head = job;
    w->done_tail = job;
    pthread_mutex_unlock(&w->done_mu);
    event_active(w->wake, EV_READ, 0);
}

/*
 * Writer. Forgets pods that hold nothing, are fed by no stream and were last
 * written more than --forget-idle ago, and namespaces with no block unused
 * as long: a flood of names (pods, models, LoRAs) that came and went gives
 * its memory and ids back without a restart. Returns how many went.
 */
static size_t srv_forget(kvt_srv_t *srv, uint64_t now_ms)
{
    const uint64_t idle = srv->cfg.forget_idle_ms;
    size_t gone = 0;
    for (uint32_t id = kvt_idx_pod_limit(srv->idx); id-- > 0;) {
        const char *name = kvt_idx_pod_name(srv->idx, id, NULL);
        if (name == NULL || kvt_idx_pod_entries(srv->idx, id) != 0 ||
            now_ms - kvt_idx_pod_last_write(srv->idx, id) < idle ||
            kvt_zsub_subscribed(srv->zsub, name))
            continue;
        kvt_ev_ctx_pod_reset(srv->ev_ctx, id); /* the id may go to another pod */
        if (kvt_idx_pod_drop(srv->idx, id) == KVT_OK)
            gone++;
    }
    for (uint32_t slot = 0; slot < kvt_idx_ns_count(srv->idx); slot++) {
        uint32_t ns = kvt_idx_ns_id(srv->idx, slot);
        if (ns == KVT_IDX_NS_NONE || kvt_idx_ns_blocks(srv->idx, ns) != 0 ||
            now_ms - kvt_idx_ns_last_use(srv->idx, ns) < idle)
            continue;
        if (kvt_idx_ns_drop(srv->idx, ns, NULL) == KVT_OK)
            gone++;
    }
    if (gone > 0) {
        srv->st_forgotten += gone;
        reg_publish(srv); /* a slot reused under a new id would not change the counts */
    }
    return gone;
}

static void *writer_main(void *arg)
{
    kvt_srv_t *srv = arg;
    uint64_t last_stats = 0, last_forget = 0;
    for (;;) {
        /* for /readyz: the loop came round (again below, after the poll's wait) */
        __atomic_store_n(&srv->writer_beat_ns, srv_now_ns(), __ATOMIC_RELAXED);
        pthread_mutex_lock(&srv->q_mu);
        bool idle = srv->q_head == NULL && !srv->q_stop;
        pthread_mutex_unlock(&srv->q_mu);
        /* the index clock ticks every 5 ms at least */
        int rc = kvt_zsub_poll(srv->zsub, srv->q_efd, idle ? 5 : 0);
        if (rc == 1) {
            uint64_t v;
            ssize_t r = read(srv->q_efd, &v, sizeof(v));
            (void)r;
        } else if (rc < 0) {
            kvt_log_error("writer: polling the event streams failed: %s", kvt_status_str(rc));
            usleep(5000);
        }

        pthread_mutex_lock(&srv->q_mu);
        srv_job_t *jobs = srv->q_head;
        bool stop = srv->q_stop && jobs == NULL;
        srv->q_head = srv->q_tail = NULL;
        srv->q_len = 0;
        pthread_mutex_unlock(&srv->q_mu);

        uint64_t now = srv_now_ns();
        __atomic_store_n(&srv->writer_beat_ns, now, __ATOMIC_RELAXED);
        kvt_idx_advance(srv->idx, now / 1000000);
        reg_maybe_publish(srv); /* the streams may have registered pods or namespaces */
        bool others = false;
        for (srv_job_t *j = jobs; j != NULL; j = j->next) {
            kvt_jbuf_init(&j->answer);
            if (j->kind == JOB_EVENTS)
                job_events(srv, j);
            else if (j->kind == JOB_ENGINE_ADD)
                job_engine_add(srv, j);
            else if (j->kind == JOB_MODEL_DROP)
                job_model_drop(srv, j);
            else
                job_drop(srv, j);
            others |= j->kind != JOB_EVENTS;
        }
        /*
         * Pods and namespaces the jobs registered are published once for all of
         * them (a snapshot costs O(pods): once per job, a flood of new pods
         * would cost O(pods^2)), and before any answer goes: a caller that
         * queries after its answer finds its pod.
         */
        if (jobs != NULL)
            reg_maybe_publish(srv);
        if (others) { /* published at once: a caller reads its own change */
            stats_publish(srv);
            last_stats = now;
        }
        while (jobs != NULL) {
            srv_job_t *j = jobs;
            jobs = j->next;
            deliver(j);
        }
        /* forgetting looks at every pod and namespace: a few times per --forget-idle */
        uint64_t forget_every =
            srv->cfg.forget_idle_ms / 4 < 1000 ? srv->cfg.forget_idle_ms / 4 : 1000;
        if (srv->cfg.forget_idle_ms != 0 && now - last_forget >= forget_every * 1000000ull) {
            last_forget = now;
            if (srv_forget(srv, now / 1000000) > 0)
                last_stats = 0; /* publish at once */
        }
        kvt_ebr_reclaim(&srv->ebr);
        if (stop || now - last_stats >= srv->cfg.stats_period_ms * 1000000ull) {
            stats_publish(srv);
            last_stats = now;
        }
        if (stop)
            break;
    }
    return NULL;
}

/* ---- workers ----------------------------------------------------------------- */

static void worker_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvt_srv_worker_t *w = arg;
    int fds[SRV_HANDOFF];
    enum srv_proto protos[SRV_HANDOFF];
    pthread_mutex_lock(&w->done_mu);
    srv_job_t *jobs = w->done_head;
    w->done_head = w->done_tail = NULL;
    uint32_t nh = w->handoff_n;
    for (uint32_t i = 0; i < nh; i++) {
        fds[i] = w->handoff[i].fd;
        protos[i] = w->handoff[i].proto;
    }
    w->handoff_n = 0;
    pthread_mutex_unlock(&w->done_mu);
    for (uint32_t i = 0; i < nh; i++) {
        if (atomic_load(&w->srv->stopping)) {
            close(fds[i]);
        } else {
            srv_conn_accept(w, protos[i], fds[i]);
        }
    }
    while (jobs != NULL) {
        srv_job_t *j = jobs;
        jobs = j->next;
        srv_conn_job_done(j); /* frees the job */
    }
    if (atomic_load(&w->srv->stopping)) {
        srv_conn_close_all(w);
        event_base_loopbreak(w->base);
    }
}

bool srv_handoff(kvt_srv_worker_t *w, enum srv_proto proto, int fd)
{
    pthread_mutex_lock(&w->done_mu);
    bool ok = w->handoff_n < SRV_HANDOFF;
    if (ok) {
        w->handoff[w->handoff_n].fd = fd;
        w->handoff[w->handoff_n].proto = proto;
        w->handoff_n++;
    }
    pthread_mutex_unlock(&w->done_mu);
    if (ok)
        event_active(w->wake, EV_READ, 0);
    return ok;
}

static void *worker_main(void *arg)
{
    kvt_srv_worker_t *w = arg;
    event_base_dispatch(w->base);
    return NULL;
}

static void worker_cleanup(kvt_srv_worker_t *w)
{
    if (w->base == NULL)
        return;
    srv_conn_close_all(w);
    if (w->l_http)
        evconnlistener_free(w->l_http);
    if (w->l_rpc)
        evconnlistener_free(w->l_rpc);
    if (w->l_unix)
        evconnlistener_free(w->l_unix);
    if (w->wake)
        event_free(w->wake);
    event_base_free(w->base);
    w->base = NULL;
    if (w->reader)
        kvt_idx_reader_destroy(w->reader);
    if (w->ebr_slot >= 0)
        kvt_ebr_slot_release(&w->srv->ebr, w->ebr_slot);
    for (uint32_t i = 0; i < w->handoff_n; i++) {
        close(w->handoff[i].fd); /* passed here after this worker stopped */
    }
    w->handoff_n = 0;
    pthread_mutex_destroy(&w->done_mu);
    free(w->keys);
    free(w->tokens);
    free(w->filter);
    free(w->scored);
    kvt_jbuf_cleanup(&w->out);
    kvt_proto_wr_cleanup(&w->rpc_out);
}

static kvt_status_t worker_init(kvt_srv_t *srv, kvt_srv_worker_t *w, int id)
{
    w->srv = srv;
    w->id = id;
    w->ebr_slot = -1;
    pthread_mutex_init(&w->done_mu, NULL);
    kvt_jbuf_init(&w->out);
    kvt_proto_wr_init(&w->rpc_out);
    w->base = event_base_new();
    if (w->base == NULL)
        return KVT_ERR_NO_MEM;
    w->wake = event_new(w->base, -1, 0, worker_wake, w);
    if (w->wake == NULL)
        return KVT_ERR_NO_MEM;
    kvt_status_t st = kvt_idx_reader_create(srv->idx, &w->reader);
    if (st != KVT_OK)
        return st;
    w->ebr_slot = kvt_ebr_slot_acquire(&srv->ebr);
    if (w->ebr_slot < 0)
        return KVT_ERR_LIMIT;
    return srv_conn_listen(w);
}

/* ---- lifecycle ----------------------------------------------------------------- */

static char *dup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

static kvt_status_t mkdir_p(const char *path)
{
    char buf[4096];
    if (strlen(path) >= sizeof(buf))
        return KVT_ERR_INVAL;
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0750) != 0 && errno != EEXIST)
            return KVT_ERR_IO;
        *p = '/';
    }
    if (mkdir(buf, 0750) != 0 && errno != EEXIST)
        return KVT_ERR_IO;
    return KVT_OK;
}

/* Whether ZMQ @ep stays on this host: ipc, inproc, or tcp on a loopback address. "" counts. */
bool srv_zmq_local(const char *ep)
{
    if (ep[0] == '\0' || strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return true;
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    const char *h = ep + 6;
    return strncmp(h, "127.", 4) == 0 || strncmp(h, "localhost:", 10) == 0 ||
           strncmp(h, "[::1]:", 6) == 0;
}

/* --ipc-dir (default <data-dir>/ipc): created 0700 or an existing private one, its canonical
 * path kept for zsub. */
static kvt_status_t srv_ipc_dir_open(kvt_srv_t *srv)
{
    char path[4096], err[320];
    if (srv->cfg.ipc_dir[0] != '\0')
        snprintf(path, sizeof(path), "%s", srv->cfg.ipc_dir);
    else if (srv->cfg.data_dir[0] != '\0')
        snprintf(path, sizeof(path), "%s/ipc", srv->cfg.data_dir);
    else
        return KVT_OK; /* no directory: ipc binds are refused */
    kvt_status_t st = kvt_ipcdir_open(path, srv->ipc_dir, sizeof(srv->ipc_dir), err, sizeof(err));
    if (st == KVT_ERR_RANGE) { /* kvtierd still serves; only ipc binds are refused */
        kvt_log_warn("%s: ipc binds will be refused (give a shorter --ipc-dir)", err);
        srv->ipc_dir[0] = '\0';
        return KVT_OK;
    }
    if (st != KVT_OK)
        kvt_log_error("%s", err);
    return st;
}

/* The writer's wake-up eventfd, the engines' subscriber set, the publisher, and --engine's engines.
 */
static kvt_status_t srv_engines_start(kvt_srv_t *srv, const kvt_srv_config_t *cfg)
{
    srv->q_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (srv->q_efd < 0) {
        kvt_log_error("eventfd: %s", strerror(errno));
        return KVT_ERR_IO;
    }
    kvt_zsub_config_t zc;
    kvt_zsub_config_default(&zc);
    zc.default_block_size = cfg->block_size;
    zc.max_items = cfg->max_event_items;
    zc.max_msg_bytes = cfg->event_max_message;
    zc.replay_timeout_ms = cfg->replay_timeout_ms;
    zc.max_held = cfg->replay_hold;
    zc.ev_ctx = srv->ev_ctx;
    zc.ipc_dir = srv->ipc_dir;
    kvt_status_t st = kvt_zsub_create(srv->idx, &zc, &srv->zsub);
    if (st == KVT_OK && srv->cfg.publish[0] != '\0') {
        char err[320];
        const char *remote = !srv_zmq_local(srv->cfg.publish)          ? srv->cfg.publish
                             : !srv_zmq_local(srv->cfg.publish_replay) ? srv->cfg.publish_replay
                                                                       : NULL;
        if (remote != NULL && !srv->cfg.allow_remote) {
            kvt_log_error("--publish: binding %s needs --allow-remote", remote);
            return KVT_ERR_INVAL;
        }
        st = kvt_zsub_publish_open(srv->zsub, srv->cfg.publish, srv->cfg.publish_replay,
                                   srv->cfg.publish_buffer, err, sizeof(err));
        if (st != KVT_OK) {
            kvt_log_error("--publish: %s", err);
            return KVT_ERR_INVAL;
        }
    }
    for (size_t i = 0; st == KVT_OK && i < cfg->engines.n; i++) {
        const char *text = cfg->engines.items[i];
        kvt_zsub_engine_t e;
        char err[320];
        st = kvt_zsub_engine_json_decode(text, strlen(text), &e, err, sizeof(err));
        if (st == KVT_OK)
            st = srv_engine_add(srv, &e, err, sizeof(err));
        if (st != KVT_OK) {
            kvt_log_error("--engine %zu: %s", i + 1, err);
            st = KVT_ERR_INVAL;
        }
    }
    return st;
}

kvt_status_t kvt_srv_create(const kvt_srv_config_t *cfg, kvt_srv_t **srv_p)
{
    static bool threads_on;
    if (!threads_on) {
        if (evthread_use_pthreads() != 0)
            return KVT_ERR_INTERNAL;
        threads_on = true;
    }
    kvt_srv_t *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return KVT_ERR_NO_MEM;
    srv->cfg = *cfg;
    srv->cfg.http_listen = dup_or_empty(cfg->http_listen);
    srv->cfg.rpc_listen = dup_or_empty(cfg->rpc_listen);
    srv->cfg.rpc_unix = dup_or_empty(cfg->rpc_unix);
    srv->cfg.data_dir = dup_or_empty(cfg->data_dir);
    srv->cfg.auth_token_file = dup_or_empty(cfg->auth_token_file);
    srv->cfg.publish = dup_or_empty(cfg->publish);
    srv->cfg.publish_replay = dup_or_empty(cfg->publish_replay);
    srv->cfg.ipc_dir = dup_or_empty(cfg->ipc_dir);
    srv->fd_http = srv->fd_rpc = srv->fd_unix = -1;
    srv->q_efd = -1;
    memset(&srv->cfg.engines, 0, sizeof(srv->cfg.engines)); /* read during create only */
    pthread_mutex_init(&srv->q_mu, NULL);
    pthread_mutex_init(&srv->stats_mu, NULL);
    pthread_mutex_init(&srv->blob_mu, NULL);
    kvt_score_weights_default(&srv->weights);
    srv->started_ns = srv_now_ns();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    srv->started_wall_s = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9;
    kvt_status_t st = KVT_ERR_NO_MEM;
    if (!srv->cfg.http_listen || !srv->cfg.rpc_listen || !srv->cfg.rpc_unix || !srv->cfg.data_dir ||
        !srv->cfg.auth_token_file || !srv->cfg.publish || !srv->cfg.publish_replay ||
        !srv->cfg.ipc_dir)
        goto err;
    if (srv->cfg.block_size == 0 || srv->cfg.writer_queue == 0 || srv->cfg.max_connections == 0 ||
        srv->cfg.rpc_max_frame > (64u << 20) || srv->cfg.rpc_max_frame < 1024 ||
        srv->cfg.replay_timeout_ms == 0 || srv->cfg.replay_hold == 0 ||
        srv->cfg.event_max_message == 0 || srv->cfg.publish_buffer == 0 ||
        srv->cfg.writer_stall_ms == 0) {
        kvt_log_error("bad limits: block-size, writer-queue, max-connections, replay-timeout, "
                      "replay-hold, event-max-message and publish-buffer must be > 0, "
                      "rpc-max-frame in 1KiB..64MiB, writer-stall > 0");
        st = KVT_ERR_INVAL;
        goto err;
    }
    if (srv->cfg.data_dir[0] && mkdir_p(srv->cfg.data_dir) != KVT_OK) {
        kvt_log_error("cannot create data dir %s: %s", srv->cfg.data_dir, strerror(errno));
        st = KVT_ERR_IO;
        goto err;
    }
    if ((st = srv_ipc_dir_open(srv)) != KVT_OK)
        goto err;
    if (srv->cfg.auth_token_file[0] && (st = load_token(srv, srv->cfg.auth_token_file)) != KVT_OK)
        goto err;
    /*
     * One worker per core this process may run on (taskset, a cpuset), not per
     * online core: two workers on one core time-share it, and a request waits
     * for the other worker's time slice (milliseconds; docs/performance.md).
     */
    cpu_set_t allowed;
    long cores = sched_getaffinity(0, sizeof(allowed), &allowed) == 0
                     ? (long)CPU_COUNT(&allowed)
                     : sysconf(_SC_NPROCESSORS_ONLN);
    srv->nworkers = cfg->workers ? (int)cfg->workers : (cores > 0 ? (int)cores : 1);
    if (srv->nworkers > 256)
        srv->nworkers = 256;
    kvt_idx_config_t icfg = {.budget_bytes = cfg->index_budget,
                             .max_readers = (uint32_t)srv->nworkers + 4};
    if ((st = kvt_idx_create(&icfg, &srv->idx)) != KVT_OK)
        goto err;
    if ((st = kvt_ebr_init(&srv->ebr, (uint32_t)srv->nworkers + 4)) != KVT_OK)
        goto err;
    if ((st = kvt_ev_ctx_create(cfg->removed_map_bytes, &srv->ev_ctx)) != KVT_OK)
        goto err;
    if ((st = srv_engines_start(srv, cfg)) != KVT_OK)
        goto err;
    stats_publish(srv); /* /v1/stats is whole from the first request */
    reg_publish(srv);
    if (srv->reg == NULL) {
        st = KVT_ERR_NO_MEM;
        goto err;
    }
    /* the first listeners fix the ports; other workers bind the same ones */
    st = KVT_ERR_IO;
    if (srv->cfg.http_listen[0]) {
        srv->fd_http = open_listener(srv, "http", srv->cfg.http_listen, 0);
        if (srv->fd_http < 0) {
            st = srv->fd_http == -2 ? KVT_ERR_INVAL : KVT_ERR_IO;
            goto err;
        }
        srv->http_port = bound_port(srv->fd_http);
    }
    if (srv->cfg.rpc_listen[0]) {
        srv->fd_rpc = open_listener(srv, "rpc", srv->cfg.rpc_listen, 0);
        if (srv->fd_rpc < 0) {
            st = srv->fd_rpc == -2 ? KVT_ERR_INVAL : KVT_ERR_IO;
            goto err;
        }
        srv->rpc_port = bound_port(srv->fd_rpc);
    }
    if (srv->cfg.rpc_unix[0]) {
        srv->fd_unix = listen_unix(srv->cfg.rpc_unix);
        if (srv->fd_unix < 0) {
            st = srv->fd_unix == -2 ? KVT_ERR_INVAL : KVT_ERR_IO;
            goto err;
        }
    }
    srv->workers = calloc((size_t)srv->nworkers, sizeof(*srv->workers));
    if (srv->workers == NULL) {
        st = KVT_ERR_NO_MEM;
        goto err;
    }
    for (int i = 0; i < srv->nworkers; i++) {
        if ((st = worker_init(srv, &srv->workers[i], i)) != KVT_OK) {
            kvt_log_error("worker %d: %s", i, kvt_status_str(st));
            goto err;
        }
    }
    /* created here so a signal between create and run is not lost */
    if (stop_pipe[0] < 0 && pipe2(stop_pipe, O_CLOEXEC) != 0) {
        st = KVT_ERR_IO;
        goto err;
    }
    *srv_p = srv;
    return KVT_OK;
err:
    kvt_srv_destroy(srv);
    return st;
}

uint16_t kvt_srv_http_port(const kvt_srv_t *srv)
{
    return srv->http_port;
}

uint16_t kvt_srv_rpc_port(const kvt_srv_t *srv)
{
    return srv->rpc_port;
}

/* Open a listener for worker @w (worker 0 takes the first socket; others bind their own). */
int srv_listener_fd(kvt_srv_worker_t *w, int which);
int srv_listener_fd(kvt_srv_worker_t *w, int which)
{
    kvt_srv_t *srv = w->srv;
    if (which == PROTO_HTTP) {
        if (srv->fd_http < 0)
            return -1;
        if (w->id == 0)
            return srv->fd_http;
        return open_listener(srv, "http", srv->cfg.http_listen, srv->http_port);
    }
    if (which == PROTO_RPC) {
        if (srv->fd_rpc < 0)
            return -1;
        if (w->id == 0)
            return srv->fd_rpc;
        return open_listener(srv, "rpc", srv->cfg.rpc_listen, srv->rpc_port);
    }
    return w->id == 0 ? srv->fd_unix : -1;
}

kvt_status_t kvt_srv_run(kvt_srv_t *srv)
{
    if (pthread_create(&srv->writer, NULL, writer_main, srv) != 0)
        return KVT_ERR_NO_MEM;
    pthread_setname_np(srv->writer, "kvt-writer"); /* kvtier-bench events reads its CPU time */
    /* serve only once the writer came round its loop: /readyz is then true from the first request
     */
    while (__atomic_load_n(&srv->writer_beat_ns, __ATOMIC_RELAXED) == 0)
        usleep(200);
    int started = 0;
    for (; started < srv->nworkers; started++)
        if (pthread_create(&srv->workers[started].thread, NULL, worker_main,
                           &srv->workers[started]) != 0)
            break;
    kvt_log_info("kvtierd serving: http port %u, rpc port %u, %d workers%s", srv->http_port,
                 srv->rpc_port, srv->nworkers, srv->auth_token ? ", auth token required" : "");
    if (started == srv->nworkers) {
        char c;
        while (read(stop_pipe[0], &c, 1) < 0 && errno == EINTR)
            ;
    }
    atomic_store(&srv->draining, true); /* /readyz: not ready from here on */
    kvt_log_info("stopping: applying queued writes, closing connections");
    /* writes already queued are applied and answered before the workers go */
    pthread_mutex_lock(&srv->q_mu);
    srv->q_stop = true;
    pthread_mutex_unlock(&srv->q_mu);
    srv_wake_writer(srv);
    pthread_join(srv->writer, NULL);
    atomic_store(&srv->stopping, true);
    for (int i = 0; i < started; i++)
        event_active(srv->workers[i].wake, EV_READ, 0);
    for (int i = 0; i < started; i++)
        pthread_join(srv->workers[i].thread, NULL);
    return started == srv->nworkers ? KVT_OK : KVT_ERR_NO_MEM;
}

void kvt_srv_stop(kvt_srv_t *srv)
{
    (void)srv;
    int fd = stop_pipe[1];
    if (fd >= 0) {
        char c = 1;
        ssize_t r = write(fd, &c, 1); /* async-signal-safe */
        (void)r;
    }
}

void kvt_srv_destroy(kvt_srv_t *srv)
{
    if (srv == NULL)
        return;
    if (srv->workers != NULL) {
        for (int i = 0; i < srv->nworkers; i++)
            worker_cleanup(&srv->workers[i]);
        free(srv->workers);
    }
    /* worker 0's listeners owned the first fds; close any never handed over */
    if (srv->workers == NULL) {
        if (srv->fd_http >= 0)
            close(srv->fd_http);
        if (srv->fd_rpc >= 0)
            close(srv->fd_rpc);
        if (srv->fd_unix >= 0)
            close(srv->fd_unix);
    }
    if (srv->cfg.rpc_unix && srv->cfg.rpc_unix[0] && srv->fd_unix >= 0)
        unlink(srv->cfg.rpc_unix);
    srv_job_t *j = srv->q_head;
    while (j != NULL) {
        srv_job_t *n = j->next;
        srv_job_free(j);
        j = n;
    }
    if (srv->reg != NULL) {
        free(srv->reg);
        srv->reg = NULL;
    }
    if (srv->ebr.slots != NULL)
        kvt_ebr_cleanup(&srv->ebr);
    kvt_zsub_destroy(srv->zsub);
    kvt_ev_ctx_destroy(srv->ev_ctx);
    if (srv->q_efd >= 0)
        close(srv->q_efd);
    kvt_idx_destroy(srv->idx);
    free(srv->st_pod_entries);
    free(srv->st_streams);
    free(srv->auth_token);
    free(srv->cfg.http_listen);
    free(srv->cfg.rpc_listen);
    free(srv->cfg.rpc_unix);
    free(srv->cfg.data_dir);
    free(srv->cfg.auth_token_file);
    free(srv->cfg.publish);
    free(srv->cfg.publish_replay);
    free(srv->cfg.ipc_dir);
    for (int i = 0; i < NBLOBS; i++)
        srv_blob_unref(srv->blobs[i]); /* output buffers holding them were freed with the workers */
    pthread_mutex_destroy(&srv->q_mu);
    pthread_mutex_destroy(&srv->stats_mu);
    pthread_mutex_destroy(&srv->blob_mu);
    free(srv);
    if (stop_pipe[0] >= 0) {
        close(stop_pipe[0]);
        close(stop_pipe[1]);
        stop_pipe[0] = stop_pipe[1] = -1;
    }
}
