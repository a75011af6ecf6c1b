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
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/ipcdir.h"
#include "common/json.h"
#include "common/log.h"

enum { ZS_WAITING, ZS_LIVE, ZS_REPLAYING };
static const char *const zs_state_name[] = {"waiting", "live", "replaying"};

#define ZS_END_SEQ UINT64_MAX /* seq of the replay's end marker: 8 bytes of 0xff */
#define ZS_BUDGET 256         /* messages per socket per poll round */
#define ZS_LOG_EVERY_NS 60000000000ull

/* Kinds of stream warnings, each rate-limited on its own. */
enum {
    ZW_FRAME,       /* a message not shaped [topic, seq, payload] */
    ZW_UNDECODABLE, /* a payload that is not a batch */
    ZW_BAD_EVENT,   /* a store that does not decode or apply: skipped */
    ZW_BAD_REMOVAL, /* an event that may have been a removal does not decode: state dropped */
    ZW_MEDIUM,      /* events on a medium kvtier does not model */
    ZW_APPLY,       /* the index refused a batch (memory, limits) */
    ZW_GAP,         /* missed batches */
    ZW_RESTART,     /* seq went back */
    ZW_REPLAY,      /* a replay failed */
    ZW_KINDS
};

typedef struct zs_held {
    uint64_t seq;
    size_t len;
    void *data; /* malloc'd copy of the payload */
} zs_held_t;

typedef struct zs_engine zs_engine_t;
typedef struct zs_stream zs_stream_t;

/*
 * A SUB socket: one stream's own, or shared by the engines that dial into one
 * bound endpoint (llm-d's layout: every engine connects to the indexer's port
 * and names itself in the topic). A shared socket's messages go to the stream
 * whose topic starts the message's topic; topics there may not prefix one another.
 */
typedef struct zs_sock {
    void *sock;
    char want[KVT_ZSUB_MAX_ENDPOINT + 1]; /* the endpoint as asked: later binds match it */
    char addr[KVT_ZSUB_MAX_ENDPOINT + 1]; /* as connected or bound */
    bool bound;
    void *mon;       /* PAIR reading the SUB's disconnect events (connecting SUBs only), or NULL */
    uint64_t log_ns; /* rate limit of its warnings */
    zs_stream_t **streams; /* those reading it */
    size_t n, cap;
} zs_sock_t;

struct zs_stream {
    zs_engine_t *eng;
    uint32_t rank;
    zs_sock_t *sub;
    void *dealer; /* NULL until a replay is needed; closed after a failed one */
    char endpoint[KVT_ZSUB_MAX_ENDPOINT + 1];
    char replay_endpoint[KVT_ZSUB_MAX_ENDPOINT + 1]; /* "": none */
    int state;
    bool have_seq;
    uint64_t last_seq;
    uint64_t replay_target; /* the replay is whole once last_seq reaches it */
    uint64_t replay_from;   /* first seq asked; held batches in [from, last_seq] came by replay */
    bool dups;              /* replay_from is in effect (until the next batch in order) */
    uint64_t replay_deadline_ns;
    uint64_t backoff_ms, backoff_until_ns;
    zs_held_t *held; /* FIFO: [head, head + n) of cap */
    size_t held_head, held_n, held_cap;
    uint64_t log_ns[ZW_KINDS], log_quiet[ZW_KINDS]; /* rate limit of warnings, per kind */
    kvt_zsub_counters_t c;
};

struct zs_engine {
    kvt_zsub_engine_t spec;
    zs_stream_t *streams; /* [spec.dp_size] */
};

/* The publisher (kvt_zsub_publish_open()). */
typedef struct zs_pub {
    void *pub, *router; /* router NULL without a replay endpoint */
    kvt_zsub_pub_info_t info;
    zs_held_t *ring; /* the last info.buffered batches, oldest at head */
    uint32_t cap, head;
    msgpack_sbuffer sb; /* encoding scratch */
} zs_pub_t;

struct kvt_zsub {
    kvt_idx_t *idx;
    zs_pub_t *pub;
    kvt_zsub_config_t cfg;
    void *ctx;
    zs_engine_t **eng;
    size_t neng, eng_cap;
    zs_sock_t **socks; /* every SUB */
    size_t nsocks, socks_cap;
    uint64_t unmatched, unmatched_log_ns; /* shared-socket messages no stream's topic starts */
    zmq_pollitem_t *items;                /* scratch for kvt_zsub_poll() */
    zs_stream_t **item_stream;            /* the DEALER's stream, or NULL */
    zs_sock_t **item_sock;                /* the SUB, or NULL */
    size_t items_cap;
};

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

/* ---- engine specs ---------------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static kvt_status_t
zs_fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return KVT_ERR_INVAL;
}

/* The ":PORT" at the end of a tcp:// endpoint: its value, and where the digits start. */
static bool zs_tcp_port(const char *ep, unsigned *port_p, size_t *at_p)
{
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    const char *colon = strrchr(ep + 6, ':');
    if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) > 5)
        return false;
    unsigned v = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (unsigned)(*p - '0');
    }
    if (v == 0 || v > 65535)
        return false;
    *port_p = v;
    *at_p = (size_t)(colon + 1 - ep);
    return true;
}

/* Checks one endpoint field: a transport kvtier speaks, and a port when ranks need one. */
static kvt_status_t zs_check_endpoint(const char *what, const char *ep, uint32_t dp_size, char *err,
                                      size_t errlen)
{
    if (strncmp(ep, "tcp://", 6) != 0 && strncmp(ep, "ipc://", 6) != 0 &&
        strncmp(ep, "inproc://", 9) != 0)
        return zs_fail(err, errlen, "%s: want tcp://, ipc:// or inproc://", what);
    if (strchr(ep, ' ') != NULL || strlen(ep) < 8)
        return zs_fail(err, errlen, "%s: not an endpoint", what);
    unsigned port;
    size_t at;
    if (dp_size > 1 && !zs_tcp_port(ep, &port, &at))
        return zs_fail(err, errlen, "%s: dp_size %u needs tcp://host:port (rank r uses port + r)",
                       what, dp_size);
    if (dp_size > 1 && port + dp_size - 1 > 65535)
        return zs_fail(err, errlen, "%s: port %u + %u ranks passes 65535", what, port, dp_size);
    return KVT_OK;
}

bool kvt_zsub_engine_binds(const kvt_zsub_engine_t *e)
{
    return e->bind || strncmp(e->endpoint, "tcp://*:", 8) == 0;
}

kvt_status_t kvt_zsub_engine_check(const kvt_zsub_engine_t *e, char *err, size_t errlen)
{
    if (e->pod[0] == '\0')
        return zs_fail(err, errlen, "field 'pod' is missing or empty");
    if (e->model[0] == '\0')
        return zs_fail(err, errlen, "field 'model' is missing or empty");
    if (e->endpoint[0] == '\0')
        return zs_fail(err, errlen, "field 'endpoint' is missing or empty");
    if (e->format != KVT_EV_FMT_VLLM && e->format != KVT_EV_FMT_SGLANG)
        return zs_fail(err, errlen, "field 'format': want \"vllm\" or \"sglang\"");
    if (e->dp_size < 1 || e->dp_size > KVT_ZSUB_MAX_RANKS)
        return zs_fail(err, errlen, "field 'dp_size': want 1..%d", KVT_ZSUB_MAX_RANKS);
    kvt_status_t st = zs_check_endpoint("field 'endpoint'", e->endpoint, e->dp_size, err, errlen);
    if (st == KVT_OK && e->replay_endpoint[0] != '\0')
        st = zs_check_endpoint("field 'replay_endpoint'", e->replay_endpoint, e->dp_size, err,
                               errlen);
    return st;
}

/* Reads the string that is due into @buf (1..cap-1 bytes, no NUL; "" only with @empty_ok). */
static kvt_status_t zs_json_str(kvt_json_t *j, const char *field, char *buf, size_t cap,
                                bool empty_ok, char *err, size_t errlen)
{
    size_t n;
    if (kvt_json_peek(j) != KVT_JSON_STRING) {
        if (kvt_json_status(j) != KVT_OK)
            return zs_fail(err, errlen, "field '%s': %s", field, kvt_json_error(j));
        return zs_fail(err, errlen, "field '%s' must be a string", field);
    }
    if (kvt_json_string(j, buf, cap, &n) != KVT_OK) {
        if (kvt_json_status(j) == KVT_ERR_TOO_BIG)
            return zs_fail(err, errlen, "field '%s' is over %zu bytes", field, cap - 1);
        return zs_fail(err, errlen, "field '%s': %s", field, kvt_json_error(j));
    }
    if (memchr(buf, '\0', n) != NULL)
        return zs_fail(err, errlen, "field '%s' contains a NUL character", field);
    if (n == 0 && !empty_ok)
        return zs_fail(err, errlen, "field '%s' is empty", field);
    return KVT_OK;
}

/* Reads the null that is due (an optional field left out). */
static kvt_status_t zs_json_null(kvt_json_t *j, const char *field, char *err, size_t errlen)
{
    if (kvt_json_null(j) != KVT_OK)
        return zs_fail(err, errlen, "field '%s': %s", field, kvt_json_error(j));
    return KVT_OK;
}

kvt_status_t kvt_zsub_engine_json_decode(const char *body, size_t len, kvt_zsub_engine_t *out,
                                         char *err, size_t errlen)
{
    kvt_zsub_engine_t e;
    memset(&e, 0, sizeof(e));
    e.format = KVT_EV_FMT_VLLM;
    e.dp_size = 1;
    kvt_json_t j;
    kvt_json_init(&j, body, len);
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (kvt_json_peek(&j) != KVT_JSON_OBJECT) {
        if (kvt_json_status(&j) != KVT_OK) {
            zs_fail(err, errlen, "%s", kvt_json_error(&j));
            return KVT_ERR_PARSE;
        }
        return zs_fail(err, errlen, "the body must be a JSON object");
    }
    kvt_json_object_begin(&j);
    const char *key;
    size_t klen;
    int r;
    kvt_status_t st = KVT_OK;
    while (st == KVT_OK && (r = kvt_json_object_next(&j, &key, &klen)) == 1) {
        bool null = kvt_json_peek(&j) == KVT_JSON_NULL;
        if (strcmp(key, "pod") == 0 && klen == 3) {
            st = zs_json_str(&j, "pod", e.pod, sizeof(e.pod), false, err, errlen);
        } else if (strcmp(key, "model") == 0 && klen == 5) {
            st = zs_json_str(&j, "model", e.model, sizeof(e.model), false, err, errlen);
        } else if (strcmp(key, "endpoint") == 0 && klen == 8) {
            st = zs_json_str(&j, "endpoint", e.endpoint, sizeof(e.endpoint), false, err, errlen);
        } else if (strcmp(key, "replay_endpoint") == 0 && klen == 15) {
            st = null ? zs_json_null(&j, "replay_endpoint", err, errlen)
                      : zs_json_str(&j, "replay_endpoint", e.replay_endpoint,
                                    sizeof(e.replay_endpoint), true, err, errlen);
        } else if (strcmp(key, "topic") == 0 && klen == 5) {
            st = null ? zs_json_null(&j, "topic", err, errlen)
                      : zs_json_str(&j, "topic", e.topic, sizeof(e.topic), true, err, errlen);
        } else if (strcmp(key, "format") == 0 && klen == 6) {
            char f[16];
            st = zs_json_str(&j, "format", f, sizeof(f), false, err, errlen);
            if (st == KVT_OK && strcmp(f, "vllm") == 0)
                e.format = KVT_EV_FMT_VLLM;
            else if (st == KVT_OK && strcmp(f, "sglang") == 0)
                e.format = KVT_EV_FMT_SGLANG;
            else if (st == KVT_OK)
                st = zs_fail(err, errlen, "field 'format': want \"vllm\" or \"sglang\"");
            else if (kvt_json_status(&j) == KVT_OK)
                st = zs_fail(err, errlen, "field 'format': want \"vllm\" or \"sglang\"");
        } else if (strcmp(key, "dp_size") == 0 && klen == 7) {
            if (kvt_json_u32(&j, &e.dp_size) != KVT_OK)
                st = zs_fail(err, errlen, "field 'dp_size': want an integer (%s)",
                             kvt_json_error(&j));
        } else if (strcmp(key, "bind") == 0 && klen == 4) {
            if (kvt_json_bool(&j, &e.bind) != KVT_OK)
                st = zs_fail(err, errlen, "field 'bind': want true or false");
        } else {
            char shown[48];
            snprintf(shown, sizeof(shown), "%.40s", key);
            for (char *p = shown; *p; p++)
                if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f || *p == '\'')
                    *p = '?';
            st = zs_fail(err, errlen, "unknown field '%s'", shown);
        }
    }
    if (st == KVT_OK && r < 0)
        st = zs_fail(err, errlen, "%s", kvt_json_error(&j));
    if (st == KVT_OK && kvt_json_end(&j) != KVT_OK)
        st = zs_fail(err, errlen, "%s", kvt_json_error(&j));
    if (st != KVT_OK)
        return kvt_json_status(&j) == KVT_ERR_PARSE ? KVT_ERR_PARSE : KVT_ERR_INVAL;
    if ((st = kvt_zsub_engine_check(&e, err, errlen)) != KVT_OK)
        return st;
    *out = e;
    return KVT_OK;
}

/* Rank @rank's copy of @ep: the port plus the rank for tcp, else @ep itself. */
static void zs_rank_endpoint(const char *ep, uint32_t rank, char *out, size_t cap)
{
    unsigned port;
    size_t at;
    if (rank == 0 || !zs_tcp_port(ep, &port, &at)) {
        snprintf(out, cap, "%s", ep);
        return;
    }
    snprintf(out, cap, "%.*s%u", (int)at, ep, port + rank);
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

static void zs_close(void **sock)
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
        zs_close(&k->mon);
    }
    zs_close(&k->sock);
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
        zs_close(&s->dealer);
        zs_held_clear(s);
        free(s->held);
    }
    free(e->streams);
    free(e);
}

static void zs_pub_free(zs_pub_t *p)
{
    if (p == NULL)
        return;
    zs_close(&p->pub);
    zs_close(&p->router);
    kvt_ipcdir_release(p->info.endpoint); /* "" until bound */
    kvt_ipcdir_release(p->info.replay_endpoint);
    for (uint32_t i = 0; i < p->info.buffered; i++)
        free(p->ring[(p->head + i) % p->cap].data);
    free(p->ring);
    msgpack_sbuffer_destroy(&p->sb);
    free(p);
}

void kvt_zsub_destroy(kvt_zsub_t *z)
{
    if (z == NULL)
        return;
    for (size_t i = 0; i < z->neng; i++)
        zs_engine_free(z, z->eng[i]);
    zs_pub_free(z->pub);
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

/*
 * Room for one more element in the pointer array at @arr_p (a T ** holding @n of
 * *@cap_p): doubles it when full. The array is read and written through memcpy,
 * so any pointer-to-pointer type can use it.
 */
static bool zs_reserve(void *arr_p, size_t n, size_t *cap_p)
{
    if (n < *cap_p)
        return true;
    size_t ncap = *cap_p ? 2 * *cap_p : 8;
    void *arr;
    memcpy(&arr, arr_p, sizeof(arr));
    arr = realloc(arr, ncap * sizeof(void *));
    if (arr == NULL)
        return false;
    memcpy(arr_p, &arr, sizeof(arr));
    *cap_p = ncap;
    return true;
}

static bool zs_sock_add_stream(zs_sock_t *k, zs_stream_t *s)
{
    if (!zs_reserve(&k->streams, k->n, &k->cap))
        return false;
    k->streams[k->n++] = s;
    s->sub = k;
    return true;
}

static int zs_recv(void *sock, zmq_msg_t *f, int cap, bool *more_frames_p);

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
        zs_close(&k->mon);
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
    while ((n = zs_recv(k->mon, f, 4, &extra)) >= 0) {
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
                snprintf(err, errlen,
                         "%s is shared with engine '%s': engines dialing into one port need "
                         "topics that do not start one another (as kv@<pod>@<model>)",
                         s->endpoint, k->streams[j]->eng->spec.pod);
                return KVT_ERR_INVAL;
            }
        if (!zs_sock_add_stream(k, s))
            return KVT_ERR_NO_MEM;
        zmq_setsockopt(k->sock, ZMQ_SUBSCRIBE, topic, strlen(topic));
        memcpy(s->endpoint, k->addr, sizeof(s->endpoint));
        return KVT_OK;
    }
    if (!zs_reserve(&z->socks, z->nsocks, &z->socks_cap))
        return KVT_ERR_NO_MEM;
    zs_sock_t *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return KVT_ERR_NO_MEM;
    memcpy(k->want, s->endpoint, sizeof(k->want));
    k->bound = bind;
    k->sock = zmq_socket(z->ctx, ZMQ_SUB);
    if (k->sock == NULL || !zs_sock_add_stream(k, s)) {
        snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(errno));
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
        snprintf(err, errlen, "%s %s: %s", bind ? "bind" : "connect", s->endpoint, zmq_strerror(e));
        zs_sock_detach(z, s);
        return e == EINVAL || e == EPROTONOSUPPORT ? KVT_ERR_INVAL : KVT_ERR_IO;
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
    char scratch[8];
    if (err == NULL || errlen == 0) {
        err = scratch;
        errlen = sizeof(scratch);
    }
    err[0] = '\0';
    kvt_status_t st = kvt_zsub_engine_check(spec, err, errlen);
    if (st != KVT_OK)
        return st;
    size_t streams = 0;
    for (size_t i = 0; i < z->neng; i++) {
        if (strcmp(z->eng[i]->spec.pod, spec->pod) == 0) {
            snprintf(err, errlen, "pod '%s' is already subscribed", spec->pod);
            return KVT_ERR_EXISTS;
        }
        streams += z->eng[i]->spec.dp_size;
    }
    if (streams + spec->dp_size > 65536) {
        snprintf(err, errlen, "too many streams (%zu open)", streams);
        return KVT_ERR_LIMIT;
    }
    if (!zs_reserve(&z->eng, z->neng, &z->eng_cap))
        return KVT_ERR_NO_MEM;
    zs_engine_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return KVT_ERR_NO_MEM;
    e->spec = *spec;
    e->streams = calloc(spec->dp_size, sizeof(*e->streams));
    if (e->streams == NULL) {
        free(e);
        return KVT_ERR_NO_MEM;
    }
    bool bind = kvt_zsub_engine_binds(spec);
    for (uint32_t r = 0; r < spec->dp_size && st == KVT_OK; r++) {
        zs_stream_t *s = &e->streams[r];
        s->eng = e;
        s->rank = r;
        zs_rank_endpoint(spec->endpoint, r, s->endpoint, sizeof(s->endpoint));
        if (spec->replay_endpoint[0] != '\0')
            zs_rank_endpoint(spec->replay_endpoint, r, s->replay_endpoint,
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
 * Decodes and applies one batch of @s, event by event (kvt_ev_apply() without
 * KVT_EV_STRICT). A payload that is no batch at all may have held removals:
 * the rank's state is dropped. Failures are counted and logged, never fatal.
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
    st = kvt_ev_apply(z->idx, z->cfg.ev_ctx, &b, z->cfg.default_block_size, 0, &s->c.ev, err,
                      sizeof(err));
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
                s->c.ev.state_drops != drops ? "; one may have been a removal: state dropped"
                                             : "");
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
            zs_close(&s->dealer);
            return false;
        }
    }
    uint8_t start[8];
    uint64_t from = s->last_seq + 1;
    kvt_store_be64(start, from);
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) != 0 ||
        zmq_send(s->dealer, start, 8, ZMQ_DONTWAIT) != 8) {
        zs_close(&s->dealer);
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
        zs_warn(s, ZW_GAP, now, "missed batches %llu..%llu and cannot replay them: dropping its state",
                (unsigned long long)s->last_seq + 1, (unsigned long long)seq - 1);
        zs_drop_state(z, s);
    } else if (s->have_seq && seq <= s->last_seq) {
        s->c.restarts++;
        zs_warn(s, ZW_RESTART, now, "seq went back from %llu to %llu: the engine restarted, dropping its state",
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
    zs_close(&s->dealer); /* late replies of this replay go nowhere */
    s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : z->cfg.backoff_min_ms;
    if (s->backoff_ms == 0)
        s->backoff_ms = 1; /* zs_on_live() relies on no replay starting at once */
    if (s->backoff_ms > z->cfg.backoff_max_ms)
        s->backoff_ms = z->cfg.backoff_max_ms;
    s->backoff_until_ns = now + s->backoff_ms * 1000000ull;
    zs_warn(s, ZW_REPLAY, now, "replay from %llu failed (%s): dropping its state, next replay in %llu ms",
            (unsigned long long)s->last_seq + 1, why, (unsigned long long)s->backoff_ms);
    zs_drop_state(z, s);
    s->have_seq = false; /* the held batches start the stream over */
    s->state = ZS_WAITING;
    zs_drain(z, s, now);
}

/* Reads one whole multipart message into @f (at most @cap frames); returns the count or -1. */
static int zs_recv(void *sock, zmq_msg_t *f, int cap, bool *more_frames_p)
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

static bool zs_seq(zmq_msg_t *m, uint64_t *seq_p)
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
    if (n != 3 || extra || !zs_seq(&f[1], &seq)) {
        s->c.bad_frames++;
        zs_warn(s, ZW_FRAME, now, "message of %d frames skipped (want [topic, seq(8 bytes), payload])",
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
    if (extra || (n != 3 && n != 4) || zmq_msg_size(&f[0]) != 0 || !zs_seq(&f[n - 2], &seq)) {
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
        int n = zs_recv(s->dealer, f, 4, &extra);
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
        int n = zs_recv(k->sock, f, 4, &extra);
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

/* ---- the publisher --------------------------------------------------------------------------- */

kvt_status_t kvt_zsub_publish_open(kvt_zsub_t *z, const char *endpoint, const char *replay_endpoint,
                                   uint32_t buffer_steps, char *err, size_t errlen)
{
    if (z->pub != NULL) {
        snprintf(err, errlen, "the publisher is already open");
        return KVT_ERR_EXISTS;
    }
    if (zs_check_endpoint("publish endpoint", endpoint, 1, err, errlen) != KVT_OK ||
        (replay_endpoint[0] != '\0' &&
         zs_check_endpoint("publish replay endpoint", replay_endpoint, 1, err, errlen) != KVT_OK))
        return KVT_ERR_INVAL;
    if (buffer_steps == 0) {
        snprintf(err, errlen, "the replay buffer needs at least 1 batch");
        return KVT_ERR_INVAL;
    }
    /* ipc binds: inside the ipc dir, never over a file that is not a dead socket of ours */
    char ep[2][KVT_ZSUB_MAX_ENDPOINT + 1];
    const char *want[2] = {endpoint, replay_endpoint};
    for (int i = 0; i < 2; i++) {
        snprintf(ep[i], sizeof(ep[i]), "%s", want[i]);
        if (!kvt_ipcdir_is_ipc(ep[i]))
            continue;
        if (kvt_ipcdir_bind_endpoint(z->cfg.ipc_dir, ep[i], ep[i], sizeof(ep[i]), err, errlen) !=
            KVT_OK)
            return KVT_ERR_INVAL;
        if (i == 1 && strcmp(ep[0], ep[1]) == 0) { /* the second bind would take the first's file */
            snprintf(err, errlen, "the publisher and its replay need two ipc names");
            return KVT_ERR_INVAL;
        }
        if (kvt_ipcdir_check_free(ep[i], err, errlen) != KVT_OK)
            return KVT_ERR_INVAL;
    }
    endpoint = ep[0];
    replay_endpoint = ep[1];
    zs_pub_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->ring = calloc(buffer_steps, sizeof(*p->ring))) == NULL) {
        free(p);
        return KVT_ERR_NO_MEM;
    }
    msgpack_sbuffer_init(&p->sb);
    p->cap = buffer_steps;
    int zero = 0;
    p->pub = zmq_socket(z->ctx, ZMQ_PUB);
    if (p->pub == NULL)
        goto err_zmq;
    zmq_setsockopt(p->pub, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(p->pub, endpoint) != 0) {
        snprintf(err, errlen, "bind %s: %s", endpoint, zmq_strerror(errno));
        goto err_io;
    }
    size_t n = sizeof(p->info.endpoint);
    zmq_getsockopt(p->pub, ZMQ_LAST_ENDPOINT, p->info.endpoint, &n);
    if (replay_endpoint[0] != '\0') {
        p->router = zmq_socket(z->ctx, ZMQ_ROUTER);
        if (p->router == NULL)
            goto err_zmq;
        zmq_setsockopt(p->router, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(p->router, ZMQ_SNDHWM, &zero, sizeof(zero)); /* a replay is sent whole */
        if (zmq_bind(p->router, replay_endpoint) != 0) {
            snprintf(err, errlen, "bind %s: %s", replay_endpoint, zmq_strerror(errno));
            goto err_io;
        }
        n = sizeof(p->info.replay_endpoint);
        zmq_getsockopt(p->router, ZMQ_LAST_ENDPOINT, p->info.replay_endpoint, &n);
    }
    p->info.open = true;
    z->pub = p;
    kvt_log_info("publishing kv events on %s (replay %s, %u batches kept)", p->info.endpoint,
                 p->router ? p->info.replay_endpoint : "none", buffer_steps);
    return KVT_OK;
err_zmq:
    snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(errno));
err_io:
    zs_pub_free(p);
    return errno == EINVAL || errno == EPROTONOSUPPORT ? KVT_ERR_INVAL : KVT_ERR_IO;
}

static const char *const zs_medium[] = {"GPU", "CPU", "DISK"};

/* Whether event @e is republished: what kvtier could not read or does not model is not. */
static bool zs_publishes(const kvt_event_t *e)
{
    return e->type != KVT_EV_BAD && e->skip == KVT_EV_SKIP_NONE;
}

/* kv_cache_spec_kind names for KVT_EV_GROUP_* (ANY: nil). */
static const char *const zs_kind[] = {NULL, "full_attention", "sliding_window"};

/*
 * Event @e's extra_keys as vLLM would send them: the first block's cache salt
 * where the chain starts, and each block's extra seed (an opaque key that
 * seeds the block again downstream); nil where a block has none.
 */
static void zs_encode_extra_keys(msgpack_packer *pk, const kvt_event_t *e)
{
    bool salt = e->cache_salt != NULL && !e->has_parent;
    msgpack_pack_array(pk, e->nhashes);
    for (uint32_t k = 0; k < e->nhashes; k++) {
        bool s = k == 0 && salt;
        bool x = e->extra_seeds != NULL && e->extra_seeds[k] != 0;
        if (!s && !x) {
            msgpack_pack_nil(pk);
            continue;
        }
        msgpack_pack_array(pk, (uint32_t)s + (uint32_t)x);
        if (s)
            msgpack_pack_str_with_body(pk, e->cache_salt, e->cache_salt_len);
        if (x)
            msgpack_pack_uint64(pk, e->extra_seeds[k]);
    }
}

/*
 * @b as a positional vLLM batch [ts, events, dp_rank] into p->sb. Stores run
 * to lora_name, and on to extra_keys, group_idx and kv_cache_spec_kind when
 * they carry any; removals to group_idx when they have one.
 */
static void zs_encode(zs_pub_t *p, const kvt_evbatch_t *b)
{
    msgpack_packer pk;
    msgpack_sbuffer_clear(&p->sb);
    msgpack_packer_init(&pk, &p->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, kvt_clock_wall());
    uint32_t n = 0;
    for (size_t i = 0; i < b->nev; i++)
        n += zs_publishes(&b->ev[i]);
    msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        if (!zs_publishes(e))
            continue;
        const char *medium = zs_medium[e->tier == KVT_TIER_CPU    ? 1
                                       : e->tier == KVT_TIER_DISK ? 2
                                                                  : 0];
        if (e->type == KVT_EV_CLEARED) {
            msgpack_pack_array(&pk, 1);
            msgpack_pack_str_with_body(&pk, "AllBlocksCleared", 16);
            continue;
        }
        bool stored = e->type == KVT_EV_STORED;
        bool group = e->group >= 0;
        bool extras = stored && ((e->cache_salt != NULL && !e->has_parent) || e->extra_seeds);
        const char *lora = e->lora_name != NULL ? e->lora_name : b->lora;
        msgpack_pack_array(&pk, stored ? (group ? 11 : extras ? 9 : 8) : (group ? 4 : 3));
        if (stored)
            msgpack_pack_str_with_body(&pk, "BlockStored", 11);
        else
            msgpack_pack_str_with_body(&pk, "BlockRemoved", 12);
        msgpack_pack_array(&pk, e->nhashes);
        for (uint32_t k = 0; k < e->nhashes; k++)
            msgpack_pack_uint64(&pk, e->hashes[k]);
        if (!stored) {
            msgpack_pack_str_with_body(&pk, medium, strlen(medium));
            if (group)
                msgpack_pack_uint64(&pk, (uint64_t)e->group);
            continue;
        }
        if (e->has_parent)
            msgpack_pack_uint64(&pk, e->parent);
        else
            msgpack_pack_nil(&pk);
        msgpack_pack_array(&pk, e->ntokens);
        for (uint32_t k = 0; k < e->ntokens; k++)
            msgpack_pack_uint32(&pk, e->tokens[k]);
        msgpack_pack_uint32(&pk, e->block_size);
        msgpack_pack_nil(&pk); /* lora_id */
        msgpack_pack_str_with_body(&pk, medium, strlen(medium));
        if (lora != NULL)
            msgpack_pack_str_with_body(&pk, lora, strlen(lora));
        else
            msgpack_pack_nil(&pk);
        if (!group && !extras)
            continue;
        if (extras)
            zs_encode_extra_keys(&pk, e);
        else
            msgpack_pack_nil(&pk);
        if (!group)
            continue;
        msgpack_pack_uint64(&pk, (uint64_t)e->group);
        const char *kind = zs_kind[e->group_kind < 3 ? e->group_kind : 0];
        if (kind != NULL)
            msgpack_pack_str_with_body(&pk, kind, strlen(kind));
        else
            msgpack_pack_nil(&pk);
    }
    msgpack_pack_uint32(&pk, b->dp_rank);
}

kvt_status_t kvt_zsub_publish(kvt_zsub_t *z, const kvt_evbatch_t *b)
{
    zs_pub_t *p = z->pub;
    if (p == NULL)
        return KVT_OK;
    zs_encode(p, b);
    void *copy = malloc(p->sb.size ? p->sb.size : 1);
    if (copy == NULL) {
        p->info.send_failures++;
        return KVT_ERR_NO_MEM;
    }
    memcpy(copy, p->sb.data, p->sb.size);
    uint64_t seq = p->info.batches++;
    if (p->info.buffered == p->cap) {
        free(p->ring[p->head].data);
        p->head = (p->head + 1) % p->cap;
        p->info.buffered--;
    }
    p->ring[(p->head + p->info.buffered) % p->cap] = (zs_held_t){seq, p->sb.size, copy};
    p->info.buffered++;
    char topic[2 * KVT_IDX_MAX_NAME + 8];
    int tl = snprintf(topic, sizeof(topic), "kv@%s@%s", b->pod, b->model ? b->model : "");
    uint8_t s8[8];
    kvt_store_be64(s8, seq);
    if (zmq_send(p->pub, topic, (size_t)tl, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->pub, s8, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->pub, copy, p->sb.size, ZMQ_DONTWAIT) < 0) {
        p->info.send_failures++;
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

void kvt_zsub_publish_info(const kvt_zsub_t *z, kvt_zsub_pub_info_t *info)
{
    if (z->pub == NULL)
        memset(info, 0, sizeof(*info));
    else
        *info = z->pub->info;
}

/* Answers replay requests [id, "", start_seq(8)] waiting on the ROUTER. */
static void zs_pub_serve(zs_pub_t *p)
{
    zmq_msg_t f[4];
    for (int k = 0; k < ZS_BUDGET; k++) {
        bool extra;
        int n = zs_recv(p->router, f, 4, &extra);
        if (n < 0)
            return;
        uint64_t start;
        if (n != 3 || extra || zmq_msg_size(&f[1]) != 0 || !zs_seq(&f[2], &start)) {
            p->info.bad_requests++;
        } else {
            p->info.replays++;
            const void *id = zmq_msg_data(&f[0]);
            size_t idlen = zmq_msg_size(&f[0]);
            uint8_t s8[8];
            bool ok = true;
            for (uint32_t i = 0; i < p->info.buffered && ok; i++) {
                const zs_held_t *h = &p->ring[(p->head + i) % p->cap];
                if (h->seq < start)
                    continue;
                kvt_store_be64(s8, h->seq);
                ok = zmq_send(p->router, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                     zmq_send(p->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                     zmq_send(p->router, s8, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                     zmq_send(p->router, h->data, h->len, ZMQ_DONTWAIT) >= 0;
                p->info.replayed += ok;
            }
            kvt_store_be64(s8, ZS_END_SEQ);
            if (ok && zmq_send(p->router, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                zmq_send(p->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                zmq_send(p->router, s8, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
                zmq_send(p->router, "", 0, ZMQ_DONTWAIT);
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
            zs_pub_serve(z->pub);
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
