/*
 * kvindex/zsub.c: engines' ZMQ KV-event streams; the contract is in zsub.h.
 *
 * A stream is in one of three states: waiting (no batch yet: the first seq
 * seen is taken as the start, since an engine that ran before kvtierd
 * subscribed has published batches nobody here saw), live, or replaying
 * (a DEALER request [b"", start_seq] is out; live batches are held in a FIFO
 * until the replay ends, then go through the same rules in order).
 */
#include "kvindex/zsub.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/errtext.h"
#include "common/grow.h"
#include "common/ipcdir.h"
#include "common/log.h"
#include "kvindex/zsub_int.h"

static const char *const zs_state_name[] = {"waiting", "live", "replaying"};

void kvt_zsub_config_default(kvt_zsub_config_t *cfg)
{
    *cfg = (kvt_zsub_config_t){.default_block_size = 16,
                               .max_items = (size_t)4 << 20,
                               .max_msg_bytes = (uint64_t)64 << 20,
                               .replay_timeout_ms = 2000,
                               .backoff_min_ms = 1000,
                               .backoff_max_ms = 60000,
                               .max_held = 10000};
}

/* ---- life cycle ------------------------------------------------------------------------------ */

kvt_status_t kvt_zsub_create(kvt_idx_t *idx, const kvt_zsub_config_t *cfg, kvt_zsub_t **z_p)
{
    kvt_zsub_t *z = calloc(1, sizeof(*z));
    if (z == NULL)
        return KVT_ERR_NO_MEM;
    z->idx = idx;
    z->cfg = *cfg;
    z->ctx = zmq_ctx_new();
    if (z->ctx == NULL) {
        kvt_log_error("zmq_ctx_new: %s", zmq_strerror(errno));
        free(z);
        return KVT_ERR_IO;
    }
    *z_p = z;
    return KVT_OK;
}

void kvt_zsub_sock_close(void **sock)
{
    if (*sock != NULL) {
        zmq_close(*sock);
        *sock = NULL;
    }
}

static void zs_held_clear(zs_stream_t *s)
{
    for (size_t i = 0; i < s->held_n; i++)
        free(s->held[(s->held_head + i) % s->held_cap].data);
    s->held_head = s->held_n = 0;
}

/* Takes @s off its SUB; the last stream closes it, others keep it without @s's topic. */
static void zs_sock_detach(kvt_zsub_t *z, zs_stream_t *s)
{
    zs_sock_t *k = s->sub;
    if (k == NULL)
        return;
    s->sub = NULL;
    for (size_t i = 0; i < k->n; i++)
        if (k->streams[i] == s)
            k->streams[i] = k->streams[--k->n];
    if (k->n > 0) {
        const char *t = s->eng->spec.topic;
        zmq_setsockopt(k->sock, ZMQ_UNSUBSCRIBE, t, strlen(t));
        return;
    }
    if (k->mon != NULL) {
        zmq_socket_monitor(k->sock, NULL, 0);
        kvt_zsub_sock_close(&k->mon);
    }
    kvt_zsub_sock_close(&k->sock);
    if (k->bound)
        kvt_ipcdir_release(k->addr); /* libzmq leaves the socket file; addr is "" until bound */
    for (size_t i = 0; i < z->nsocks; i++)
        if (z->socks[i] == k)
            z->socks[i] = z->socks[--z->nsocks];
    free(k->streams);
    free(k);
}

static void zs_engine_free(kvt_zsub_t *z, zs_engine_t *e)
{
    if (e == NULL)
        return;
    for (uint32_t r = 0; e->streams != NULL && r < e->spec.dp_size; r++) {
        zs_stream_t *s = &e->streams[r];
        zs_sock_detach(z, s);
        kvt_zsub_sock_close(&s->dealer);
        zs_held_clear(s);
        free(s->held);
    }
    free(e->streams);
    free(e);
}

void kvt_zsub_destroy(kvt_zsub_t *z)
{
    if (z == NULL)
        return;
    for (size_t i = 0; i < z->neng; i++)
        zs_engine_free(z, z->eng[i]);
    kvt_zsub_pub_free(z->pub);
    free(z->eng);
    free(z->socks);
    free(z->items);
    free(z->item_stream);
    free(z->item_sock);
    zmq_ctx_term(z->ctx);
    free(z);
}

/* Whether topics @a and @b could both start one message's topic. */
static bool zs_topics_clash(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    return strncmp(a, b, la < lb ? la : lb) == 0;
}

static bool zs_sock_add_stream(zs_sock_t *k, zs_stream_t *s)
{
    if (!kvt_grow(&k->streams, &k->cap, k->n + 1, sizeof(void *), 8))
        return false;
    k->streams[k->n++] = s;
    s->sub = k;
    return true;
}

/*
 * A connecting SUB is watched for disconnects: libzmq reconnects after a network
 * error, but not after a protocol error such as a message over ZMQ_MAXMSGSIZE,
 * and the stream would go silent for good. On each disconnect zs_read_monitor()
 * disconnects and connects the endpoint again (one connection either way).
 * Without a monitor the SUB still works; only that recovery is missing.
 */
static void zs_watch(kvt_zsub_t *z, zs_sock_t *k)
{
    char name[64];
    snprintf(name, sizeof(name), "inproc://kvt-zsub-mon-%p", (void *)k);
    if (zmq_socket_monitor(k->sock, name, ZMQ_EVENT_DISCONNECTED) != 0)
        return;
    k->mon = zmq_socket(z->ctx, ZMQ_PAIR);
    if (k->mon != NULL && zmq_connect(k->mon, name) != 0)
        kvt_zsub_sock_close(&k->mon);
    if (k->mon == NULL) {
        zmq_socket_monitor(k->sock, NULL, 0);
        kvt_log_warn("%s: no disconnect monitor (%s)", k->addr, zmq_strerror(errno));
    }
}

/* Disconnect events of SUB @k: connect again (see zs_watch()). */
static void zs_read_monitor(zs_sock_t *k)
{
    zmq_msg_t f[4];
    bool extra, any = false;
    int n;
    while ((n = kvt_zsub_msg_recv(k->mon, f, 4, &extra)) >= 0) {
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
        any = true;
    }
    if (!any)
        return;
    zmq_disconnect(k->sock, k->addr); /* ENOENT when libzmq already gave up on it */
    if (zmq_connect(k->sock, k->addr) != 0) {
        kvt_log_error("%s: reconnect failed: %s", k->addr, zmq_strerror(errno));
        return;
    }
    uint64_t now = kvt_clock_ns();
    if (k->log_ns == 0 || now - k->log_ns >= ZS_LOG_EVERY_NS) {
        kvt_log_warn("%s: the connection dropped (a message over --event-max-message, or the "
                     "engine went away); connecting again",
                     k->addr);
        k->log_ns = now;
    }
}

/*
 * Gives @s a SUB on s->endpoint: joins the socket already bound on that exact
 * endpoint (engines dial in; topics tell them apart), or opens one (options,
 * the topic, then bind or connect). s->endpoint becomes the address in use.
 */
static kvt_status_t zs_open_sub(kvt_zsub_t *z, zs_stream_t *s, bool bind, char *err, size_t errlen)
{
    const char *topic = s->eng->spec.topic;
    bool ipc = bind && kvt_ipcdir_is_ipc(s->endpoint); /* confined to the ipc dir */
    if (ipc && kvt_ipcdir_bind_endpoint(z->cfg.ipc_dir, s->endpoint, s->endpoint,
                                        sizeof(s->endpoint), err, errlen) != KVT_OK)
        return KVT_ERR_INVAL;
    for (size_t i = 0; bind && i < z->nsocks; i++) {
        zs_sock_t *k = z->socks[i];
        if (!k->bound || strcmp(k->want, s->endpoint) != 0 || strstr(k->want, ":*") != NULL)
            continue;
        for (size_t j = 0; j < k->n; j++)
            if (topic[0] == '\0' || zs_topics_clash(topic, k->streams[j]->eng->spec.topic)) {
                kvt_errf(err, errlen,
                         "%s is shared with engine '%s': engines dialing into one port need "
                         "topics that do not start one another (as kv@<pod>@<model>)",
                         s->endpoint, k->streams[j]->eng->spec.pod);
                return KVT_ERR_INVAL;
            }
        if (!zs_sock_add_stream(k, s)) {
            kvt_errf(err, errlen, "out of memory");
            return KVT_ERR_NO_MEM;
        }
        zmq_setsockopt(k->sock, ZMQ_SUBSCRIBE, topic, strlen(topic));
        memcpy(s->endpoint, k->addr, sizeof(s->endpoint));
        return KVT_OK;
    }
    zs_sock_t *k = NULL;
    if (!kvt_grow(&z->socks, &z->socks_cap, z->nsocks + 1, sizeof(void *), 8) ||
        (k = calloc(1, sizeof(*k))) == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    memcpy(k->want, s->endpoint, sizeof(k->want));
    k->bound = bind;
    k->sock = zmq_socket(z->ctx, ZMQ_SUB);
    if (k->sock == NULL || !zs_sock_add_stream(k, s)) {
        kvt_errf(err, errlen, "zmq_socket: %s", zmq_strerror(errno));
        if (k->sock != NULL)
            zmq_close(k->sock);
        free(k);
        return KVT_ERR_IO;
    }
    z->socks[z->nsocks++] = k;
    int zero = 0, hwm = 100000;
    int64_t maxmsg = z->cfg.max_msg_bytes > INT64_MAX ? -1 : (int64_t)z->cfg.max_msg_bytes;
    zmq_setsockopt(k->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(k->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(k->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    zmq_setsockopt(k->sock, ZMQ_SUBSCRIBE, topic, strlen(topic));
    if (ipc && kvt_ipcdir_check_free(s->endpoint, err, errlen) != KVT_OK) {
        zs_sock_detach(z, s);
        return KVT_ERR_INVAL;
    }
    int rc = bind ? zmq_bind(k->sock, s->endpoint) : zmq_connect(k->sock, s->endpoint);
    if (rc != 0) {
        int e = errno;
        kvt_errf(err, errlen, "%s %s: %s", bind ? "bind" : "connect", s->endpoint, zmq_strerror(e));
        zs_sock_detach(z, s);
        return KVT_ERR_INVAL; /* the endpoint given cannot be used (bad, in use, no device) */
    }
    if (bind) {
        /* "tcp://127.0.0.1:*" picks a port: report the one bound */
        size_t n = sizeof(s->endpoint);
        zmq_getsockopt(k->sock, ZMQ_LAST_ENDPOINT, s->endpoint, &n);
        s->endpoint[sizeof(s->endpoint) - 1] = '\0';
    }
    memcpy(k->addr, s->endpoint, sizeof(k->addr));
    if (!bind)
        zs_watch(z, k);
    return KVT_OK;
}

kvt_status_t kvt_zsub_add(kvt_zsub_t *z, const kvt_zsub_engine_t *spec, char *err, size_t errlen)
{
    kvt_status_t st = kvt_zsub_engine_check(spec, err, errlen);
    if (st != KVT_OK)
        return st;
    size_t streams = 0;
    for (size_t i = 0; i < z->neng; i++) {
        if (strcmp(z->eng[i]->spec.pod, spec->pod) == 0) {
            kvt_errf(err, errlen, "pod '%s' is already subscribed", spec->pod);
            return KVT_ERR_EXISTS;
        }
        streams += z->eng[i]->spec.dp_size;
    }
    if (streams + spec->dp_size > 65536) {
        kvt_errf(err, errlen, "too many streams (%zu open)", streams);
        return KVT_ERR_LIMIT;
    }
    zs_engine_t *e = NULL;
    if (!kvt_grow(&z->eng, &z->eng_cap, z->neng + 1, sizeof(void *), 8) ||
        (e = calloc(1, sizeof(*e))) == NULL ||
        (e->streams = calloc(spec->dp_size, sizeof(*e->streams))) == NULL) {
        free(e);
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    e->spec = *spec;
    bool bind = kvt_zsub_engine_binds(spec);
    for (uint32_t r = 0; r < spec->dp_size && st == KVT_OK; r++) {
        zs_stream_t *s = &e->streams[r];
        s->eng = e;
        s->rank = r;
        kvt_zsub_rank_endpoint(spec->endpoint, r, s->endpoint, sizeof(s->endpoint));
        if (spec->replay_endpoint[0] != '\0')
            kvt_zsub_rank_endpoint(spec->replay_endpoint, r, s->replay_endpoint,
                                   sizeof(s->replay_endpoint));
        st = zs_open_sub(z, s, bind, err, errlen);
    }
    if (st != KVT_OK) {
        zs_engine_free(z, e);
        return st;
    }
    z->eng[z->neng++] = e;
    kvt_log_info("engine %s: subscribed to %s (%u rank%s, %s, replay %s)", spec->pod,
                 e->streams[0].endpoint, spec->dp_size, spec->dp_size == 1 ? "" : "s",
                 spec->format == KVT_EV_FMT_SGLANG ? "sglang" : "vllm",
                 spec->replay_endpoint[0] ? spec->replay_endpoint : "none");
    return KVT_OK;
}

bool kvt_zsub_remove(kvt_zsub_t *z, const char *pod)
{
    for (size_t i = 0; i < z->neng; i++) {
        if (strcmp(z->eng[i]->spec.pod, pod) != 0)
            continue;
        zs_engine_free(z, z->eng[i]);
        z->eng[i] = z->eng[--z->neng];
        kvt_log_info("engine %s: unsubscribed", pod);
        return true;
    }
    return false;
}

bool kvt_zsub_subscribed(const kvt_zsub_t *z, const char *pod)
{
    for (size_t i = 0; i < z->neng; i++)
        if (strcmp(z->eng[i]->spec.pod, pod) == 0)
            return true;
    return false;
}

size_t kvt_zsub_streams(const kvt_zsub_t *z, kvt_zsub_stream_info_t *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < z->neng; i++) {
        const zs_engine_t *e = z->eng[i];
        for (uint32_t r = 0; r < e->spec.dp_size; r++, n++) {
            if (n >= cap)
                continue;
            const zs_stream_t *s = &e->streams[r];
            kvt_zsub_stream_info_t *o = &out[n];
            memcpy(o->pod, e->spec.pod, sizeof(o->pod));
            memcpy(o->model, e->spec.model, sizeof(o->model));
            memcpy(o->endpoint, s->endpoint, sizeof(o->endpoint));
            o->rank = r;
            o->state = zs_state_name[s->state];
            o->have_seq = s->have_seq;
            o->last_seq = s->last_seq;
            o->c = s->c;
        }
    }
    return n;
}

/* ---- stream health --------------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void
zs_warn(zs_stream_t *s, int kind, uint64_t now, const char *fmt, ...)
{
    if (s->log_ns[kind] != 0 && now - s->log_ns[kind] < ZS_LOG_EVERY_NS) {
        s->log_quiet[kind]++;
        return;
    }
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (s->log_quiet[kind] > 0)
        kvt_log_warn("engine %s rank %u: %s (%llu more like it in the last minute)",
                     s->eng->spec.pod, s->rank, msg, (unsigned long long)s->log_quiet[kind]);
    else
        kvt_log_warn("engine %s rank %u: %s", s->eng->spec.pod, s->rank, msg);
    s->log_ns[kind] = now;
    s->log_quiet[kind] = 0;
}

/* Drops what the engine reported for this rank: the stream can no longer vouch for it. */
static void zs_drop_state(kvt_zsub_t *z, zs_stream_t *s)
{
    s->c.state_drops++;
    kvt_ev_drop_state(z->idx, z->cfg.ev_ctx, s->eng->spec.pod, s->rank);
}

/* Counts @b's events on unknown mediums by name; returns how many there were. */
static uint64_t zs_count_mediums(zs_stream_t *s, const kvt_evbatch_t *b, const char **name_p,
                                 uint32_t *len_p)
{
    uint64_t n = 0;
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        if (e->type == KVT_EV_BAD || e->skip != KVT_EV_SKIP_MEDIUM)
            continue;
        n++;
        *name_p = e->medium;
        *len_p = e->medium_len;
        kvt_zsub_medium_t *m = NULL;
        for (int k = 0; k < KVT_ZSUB_MEDIUM_NAMES && m == NULL; k++) {
            kvt_zsub_medium_t *c = &s->c.mediums[k];
            if (c->name[0] == '\0') {
                memcpy(c->name, e->medium, e->medium_len);
                c->name[e->medium_len] = '\0';
                m = c;
            } else if (strlen(c->name) == e->medium_len &&
                       memcmp(c->name, e->medium, e->medium_len) == 0) {
                m = c;
            }
        }
        if (m != NULL)
            m->events++;
        else
            s->c.mediums_other++;
    }
    return n;
}

/*
 * Decodes and applies one batch of @s, event by event (kvt_ev_apply() with
 * the configured flags, never KVT_EV_STRICT). A payload that is no batch at
 * all may have held removals: the rank's state is dropped. Failures are
 * counted and logged, never fatal.
 */
static void zs_apply(kvt_zsub_t *z, zs_stream_t *s, uint64_t seq, const void *data, size_t len,
                     uint64_t now)
{
    const kvt_zsub_engine_t *e = &s->eng->spec;
    kvt_evbatch_t b;
    char err[256];
    kvt_status_t st = kvt_ev_msgpack_decode(data, len, e->format, e->pod, e->model, s->rank,
                                            z->cfg.max_items, &b, err, sizeof(err));
    if (st != KVT_OK) {
        s->c.undecodable++;
        zs_warn(s, ZW_UNDECODABLE, now, "batch seq %llu is not a batch (%s): dropping its state",
                (unsigned long long)seq, err);
        zs_drop_state(z, s);
        return;
    }
    uint64_t bad = s->c.ev.bad, drops = s->c.ev.state_drops;
    char decode_err[256];
    memcpy(decode_err, err, sizeof(err));
    b.dp_rank = s->rank; /* the stream names the rank */
    st = kvt_ev_apply(z->idx, z->cfg.ev_ctx, &b, z->cfg.default_block_size,
                      z->cfg.ev_flags & ~(unsigned)KVT_EV_STRICT, &s->c.ev, err, sizeof(err));
    s->c.ignored += b.unknown;
    const char *medium = NULL;
    uint32_t mlen = 0;
    uint64_t nmed = zs_count_mediums(s, &b, &medium, &mlen);
    kvt_evbatch_cleanup(&b);
    if (nmed > 0)
        zs_warn(s, ZW_MEDIUM, now,
                "batch seq %llu: %llu events on medium '%.*s' (or another kvtier does not "
                "model) skipped",
                (unsigned long long)seq, (unsigned long long)nmed, (int)mlen, medium);
    if (s->c.ev.bad != bad)
        zs_warn(s, s->c.ev.state_drops != drops ? ZW_BAD_REMOVAL : ZW_BAD_EVENT, now,
                "batch seq %llu: %llu events skipped (%s)%s", (unsigned long long)seq,
                (unsigned long long)(s->c.ev.bad - bad), decode_err[0] ? decode_err : err,
                s->c.ev.state_drops != drops ? "; one may have been a removal: state dropped" : "");
    if (st != KVT_OK) {
        s->c.undecodable++;
        zs_warn(s, ZW_APPLY, now, "batch seq %llu not applied whole: %s: dropping its state",
                (unsigned long long)seq, err);
        return; /* kvt_ev_apply() dropped the state */
    }
    s->c.batches++;
}

static bool zs_held_push(zs_stream_t *s, bool front, uint64_t seq, const void *data, size_t len)
{
    if (s->held_n == s->held_cap) {
        size_t ncap = s->held_cap ? 2 * s->held_cap : 16;
        zs_held_t *n = malloc(ncap * sizeof(*n));
        if (n == NULL)
            return false;
        for (size_t i = 0; i < s->held_n; i++)
            n[i] = s->held[(s->held_head + i) % s->held_cap];
        free(s->held);
        s->held = n;
        s->held_cap = ncap;
        s->held_head = 0;
    }
    void *copy = malloc(len ? len : 1);
    if (copy == NULL)
        return false;
    if (len > 0)
        memcpy(copy, data, len);
    size_t at;
    if (front) {
        s->held_head = (s->held_head + s->held_cap - 1) % s->held_cap;
        at = s->held_head;
    } else {
        at = (s->held_head + s->held_n) % s->held_cap;
    }
    s->held[at] = (zs_held_t){seq, len, copy};
    s->held_n++;
    return true;
}

static void zs_replay_fail(kvt_zsub_t *z, zs_stream_t *s, uint64_t now, const char *why);
static void zs_drain(kvt_zsub_t *z, zs_stream_t *s, uint64_t now);

/* Asks the replay endpoint for every batch from last_seq + 1; false when it cannot be sent. */
static bool zs_replay_start(kvt_zsub_t *z, zs_stream_t *s, uint64_t target, uint64_t now)
{
    if (s->dealer == NULL) {
        s->dealer = zmq_socket(z->ctx, ZMQ_DEALER);
        if (s->dealer == NULL)
            return false;
        int zero = 0;
        int64_t maxmsg = z->cfg.max_msg_bytes > INT64_MAX ? -1 : (int64_t)z->cfg.max_msg_bytes;
        zmq_setsockopt(s->dealer, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(s->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        if (zmq_connect(s->dealer, s->replay_endpoint) != 0) {
            kvt_zsub_sock_close(&s->dealer);
            return false;
        }
    }
    uint8_t start[8];
    uint64_t from = s->last_seq + 1;
    kvt_store_be64(start, from);
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) != 0 ||
        zmq_send(s->dealer, start, 8, ZMQ_DONTWAIT) != 8) {
        kvt_zsub_sock_close(&s->dealer);
        return false;
    }
    s->c.replays++;
    s->replay_from = from;
    s->dups = false;
    s->state = ZS_REPLAYING;
    s->replay_target = target;
    s->replay_deadline_ns = now + z->cfg.replay_timeout_ms * 1000000ull;
    return true;
}

/*
 * Applies live batch @seq by the stream rules. Returns false when it started
 * a replay instead: the caller keeps the batch at the front of the held FIFO.
 */
static bool zs_live(kvt_zsub_t *z, zs_stream_t *s, uint64_t seq, const void *data, size_t len,
                    uint64_t now)
{
    if (s->dups && seq >= s->replay_from && seq <= s->last_seq)
        return true; /* held while the replay brought it: already applied */
    s->dups = false;
    if (s->have_seq && seq > s->last_seq + 1) {
        s->c.gaps++;
        if (s->replay_endpoint[0] != '\0' && now >= s->backoff_until_ns &&
            zs_replay_start(z, s, seq - 1, now))
            return false;
        zs_warn(s, ZW_GAP, now,
                "missed batches %llu..%llu and cannot replay them: dropping its state",
                (unsigned long long)s->last_seq + 1, (unsigned long long)seq - 1);
        zs_drop_state(z, s);
    } else if (s->have_seq && seq <= s->last_seq) {
        s->c.restarts++;
        zs_warn(s, ZW_RESTART, now,
                "seq went back from %llu to %llu: the engine restarted, dropping its state",
                (unsigned long long)s->last_seq, (unsigned long long)seq);
        zs_drop_state(z, s);
    }
    zs_apply(z, s, seq, data, len, now);
    s->have_seq = true;
    s->last_seq = seq;
    s->state = ZS_LIVE;
    return true;
}

/* Applies held batches in order until none is left or a replay starts. */
static void zs_drain(kvt_zsub_t *z, zs_stream_t *s, uint64_t now)
{
    while (s->held_n > 0 && s->state != ZS_REPLAYING) {
        zs_held_t h = s->held[s->held_head];
        s->held_head = (s->held_head + 1) % s->held_cap;
        s->held_n--;
        if (!zs_live(z, s, h.seq, h.data, h.len, now)) {
            /* a replay started: the batch goes back to the front */
            s->held_head = (s->held_head + s->held_cap - 1) % s->held_cap;
            s->held_n++;
            return;
        }
        free(h.data);
    }
}

static void zs_replay_fail(kvt_zsub_t *z, zs_stream_t *s, uint64_t now, const char *why)
{
    s->c.replay_failures++;
    kvt_zsub_sock_close(&s->dealer); /* late replies of this replay go nowhere */
    s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : z->cfg.backoff_min_ms;
    if (s->backoff_ms == 0)
        s->backoff_ms = 1; /* zs_on_live() relies on no replay starting at once */
    if (s->backoff_ms > z->cfg.backoff_max_ms)
        s->backoff_ms = z->cfg.backoff_max_ms;
    s->backoff_until_ns = now + s->backoff_ms * 1000000ull;
    zs_warn(s, ZW_REPLAY, now,
            "replay from %llu failed (%s): dropping its state, next replay in %llu ms",
            (unsigned long long)s->last_seq + 1, why, (unsigned long long)s->backoff_ms);
    zs_drop_state(z, s);
    s->have_seq = false; /* the held batches start the stream over */
    s->state = ZS_WAITING;
    zs_drain(z, s, now);
}

int kvt_zsub_msg_recv(void *sock, zmq_msg_t *f, int cap, bool *more_frames_p)
{
    int n = 0;
    *more_frames_p = false;
    for (;;) {
        zmq_msg_t tmp;
        zmq_msg_t *m = n < cap ? &f[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(m);
            if (n == 0)
                return -1;
            break; /* cannot happen: frames of a message arrive together */
        }
        bool more = zmq_msg_more(m);
        if (n < cap)
            n++;
        else {
            zmq_msg_close(m);
            *more_frames_p = true;
        }
        if (!more)
            break;
    }
    return n;
}

bool kvt_zsub_msg_seq(zmq_msg_t *m, uint64_t *seq_p)
{
    if (zmq_msg_size(m) != 8)
        return false;
    *seq_p = kvt_load_be(zmq_msg_data(m), 8);
    return true;
}

/* One live message [topic, seq, payload]. */
static void zs_on_live(kvt_zsub_t *z, zs_stream_t *s, zmq_msg_t *f, int n, bool extra, uint64_t now)
{
    uint64_t seq;
    if (n != 3 || extra || !kvt_zsub_msg_seq(&f[1], &seq)) {
        s->c.bad_frames++;
        zs_warn(s, ZW_FRAME, now,
                "message of %d frames skipped (want [topic, seq(8 bytes), payload])",
                extra ? n + 1 : n);
        return;
    }
    const void *data = zmq_msg_data(&f[2]);
    size_t len = zmq_msg_size(&f[2]);
    if (s->state == ZS_REPLAYING) {
        if (s->held_n < z->cfg.max_held && zs_held_push(s, false, seq, data, len))
            return;
        /* the held batches are applied; this one follows below (a failed replay backs
         * off, so none starts again meanwhile) */
        zs_replay_fail(z, s, now, "too many live batches held");
    }
    if (!zs_live(z, s, seq, data, len, now) && !zs_held_push(s, true, seq, data, len)) {
        zs_replay_fail(z, s, now, "out of memory");
        zs_live(z, s, seq, data, len, now);
    }
}

/* One replay reply: ["", seq, payload] (<= v0.25, SGLang) or ["", topic, seq, payload] (v0.26+). */
static void zs_on_replay(kvt_zsub_t *z, zs_stream_t *s, zmq_msg_t *f, int n, bool extra,
                         uint64_t now)
{
    uint64_t seq;
    if (s->state != ZS_REPLAYING)
        return; /* nothing asked: a leftover */
    if (extra || (n != 3 && n != 4) || zmq_msg_size(&f[0]) != 0 ||
        !kvt_zsub_msg_seq(&f[n - 2], &seq)) {
        zs_replay_fail(z, s, now, "malformed reply");
        return;
    }
    if (seq == ZS_END_SEQ) {
        if (s->last_seq >= s->replay_target) {
            s->state = ZS_LIVE;
            s->backoff_ms = 0;
            s->dups = true;
            zs_drain(z, s, now);
        } else {
            char why[80];
            snprintf(why, sizeof(why), "it ended before seq %llu",
                     (unsigned long long)s->last_seq + 1);
            zs_replay_fail(z, s, now, why);
        }
        return;
    }
    if (seq <= s->last_seq)
        return; /* already applied */
    if (seq > s->last_seq + 1) {
        char why[80];
        snprintf(why, sizeof(why), "its buffer starts after seq %llu",
                 (unsigned long long)s->last_seq + 1);
        zs_replay_fail(z, s, now, why);
        return;
    }
    zs_apply(z, s, seq, zmq_msg_data(&f[n - 1]), zmq_msg_size(&f[n - 1]), now);
    s->c.replayed++;
    s->last_seq = seq;
}

/* Reads up to ZS_BUDGET replies from @s's DEALER. */
static void zs_read_replay(kvt_zsub_t *z, zs_stream_t *s)
{
    zmq_msg_t f[4];
    for (int k = 0; k < ZS_BUDGET && s->dealer != NULL; k++) {
        bool extra;
        int n = kvt_zsub_msg_recv(s->dealer, f, 4, &extra);
        if (n < 0)
            return;
        zs_on_replay(z, s, f, n, extra, kvt_clock_ns());
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]); /* a failed replay closed the dealer, not these */
    }
}

/* The stream of shared SUB @k whose topic starts the message's topic @t, or NULL. */
static zs_stream_t *zs_route(const zs_sock_t *k, zmq_msg_t *t)
{
    const char *p = zmq_msg_data(t);
    size_t n = zmq_msg_size(t);
    for (size_t i = 0; i < k->n; i++) {
        const char *topic = k->streams[i]->eng->spec.topic;
        size_t tl = strlen(topic);
        if (tl <= n && memcmp(p, topic, tl) == 0)
            return k->streams[i];
    }
    return NULL;
}

/* Reads up to ZS_BUDGET live messages from SUB @k, each to its stream. */
static void zs_read_live(kvt_zsub_t *z, zs_sock_t *k)
{
    zmq_msg_t f[4];
    for (int j = 0; j < ZS_BUDGET; j++) {
        bool extra;
        int n = kvt_zsub_msg_recv(k->sock, f, 4, &extra);
        if (n < 0)
            return;
        uint64_t now = kvt_clock_ns();
        zs_stream_t *s = k->n == 1 ? k->streams[0] : zs_route(k, &f[0]);
        if (s != NULL) {
            zs_on_live(z, s, f, n, extra, now);
        } else {
            /* ZMQ filters by every topic subscribed here, so only a race with an
             * unsubscribe lands here; counted, logged once a minute */
            z->unmatched++;
            if (z->unmatched_log_ns == 0 || now - z->unmatched_log_ns >= ZS_LOG_EVERY_NS) {
                kvt_log_warn("%s: a message whose topic no engine has (%llu so far)", k->addr,
                             (unsigned long long)z->unmatched);
                z->unmatched_log_ns = now;
            }
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
}

int kvt_zsub_poll(kvt_zsub_t *z, int fd, long timeout_ms)
{
    size_t need = 2 + 2 * z->nsocks;
    for (size_t i = 0; i < z->neng; i++)
        need += z->eng[i]->spec.dp_size;
    if (need > z->items_cap) {
        zmq_pollitem_t *it = realloc(z->items, need * sizeof(*it));
        if (it != NULL)
            z->items = it;
        zs_stream_t **is = realloc(z->item_stream, need * sizeof(*is));
        if (is != NULL)
            z->item_stream = is;
        zs_sock_t **ik = realloc(z->item_sock, need * sizeof(*ik));
        if (ik != NULL)
            z->item_sock = ik;
        if (it == NULL || is == NULL || ik == NULL)
            return KVT_ERR_NO_MEM;
        z->items_cap = need;
    }
    uint64_t now = kvt_clock_ns();
    size_t n = 0;
    if (fd >= 0) {
        z->items[n] = (zmq_pollitem_t){NULL, fd, ZMQ_POLLIN, 0};
        z->item_stream[n] = NULL;
        z->item_sock[n++] = NULL;
    }
    if (z->pub != NULL && z->pub->router != NULL) {
        z->items[n] = (zmq_pollitem_t){z->pub->router, 0, ZMQ_POLLIN, 0};
        z->item_stream[n] = NULL;
        z->item_sock[n++] = NULL;
    }
    for (size_t i = 0; i < z->nsocks; i++) {
        z->items[n] = (zmq_pollitem_t){z->socks[i]->sock, 0, ZMQ_POLLIN, 0};
        z->item_stream[n] = NULL;
        z->item_sock[n++] = z->socks[i];
        if (z->socks[i]->mon != NULL) {
            z->items[n] = (zmq_pollitem_t){z->socks[i]->mon, 0, ZMQ_POLLIN, 0};
            z->item_stream[n] = NULL;
            z->item_sock[n++] = z->socks[i];
        }
    }
    for (size_t i = 0; i < z->neng; i++) {
        for (uint32_t r = 0; r < z->eng[i]->spec.dp_size; r++) {
            zs_stream_t *s = &z->eng[i]->streams[r];
            if (s->state == ZS_REPLAYING && s->dealer != NULL) {
                z->items[n] = (zmq_pollitem_t){s->dealer, 0, ZMQ_POLLIN, 0};
                z->item_sock[n] = NULL;
                z->item_stream[n++] = s;
                long left = (long)((s->replay_deadline_ns > now ? s->replay_deadline_ns - now : 0) /
                                   1000000u) +
                            1;
                if (timeout_ms < 0 || left < timeout_ms)
                    timeout_ms = left;
            }
        }
    }
    int rc = zmq_poll(z->items, (int)n, timeout_ms);
    if (rc < 0)
        return errno == EINTR ? 0 : KVT_ERR_IO;
    int fd_ready = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(z->items[i].revents & ZMQ_POLLIN))
            continue;
        if (z->item_sock[i] != NULL && z->items[i].socket == z->item_sock[i]->mon)
            zs_read_monitor(z->item_sock[i]);
        else if (z->item_sock[i] != NULL)
            zs_read_live(z, z->item_sock[i]);
        else if (z->item_stream[i] != NULL)
            zs_read_replay(z, z->item_stream[i]);
        else if (z->items[i].socket == NULL)
            fd_ready = 1;
        else
            kvt_zsub_pub_serve(z->pub);
    }
    now = kvt_clock_ns();
    for (size_t i = 0; i < z->neng; i++)
        for (uint32_t r = 0; r < z->eng[i]->spec.dp_size; r++) {
            zs_stream_t *s = &z->eng[i]->streams[r];
            if (s->state == ZS_REPLAYING && now >= s->replay_deadline_ns)
                zs_replay_fail(z, s, now, "timed out");
        }
    return fd_ready;
}
