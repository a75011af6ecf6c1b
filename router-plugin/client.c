/*
 * router-plugin/client.c: libkvtier, the client of kvtierd's binary RPC
 * (include/kvtier/client.h, docs/client.md).
 *
 * The socket is always non-blocking; blocking calls wait in poll() against a
 * deadline, so one io timeout bounds a whole call however the bytes trickle
 * in. Answers are matched to requests by req_id: an answer nobody waits for
 * (the request timed out earlier) is dropped.
 */
#include "kvtier/client.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "kvindex/hash.h"
#include "proto/proto.h"

#ifndef KVT_VERSION
#define KVT_VERSION "0.1.0"
#endif

#define CL_DEFAULT_TIMEOUT_MS 1000
#define CL_READ_CHUNK 65536u
#define CL_ERR_SIZE 512

/* A submitted query: waiting for its answer (st KVT_OK) or failed, to be reported. */
typedef struct cl_flight {
    uint64_t id;
    kvt_status_t st;
} cl_flight_t;

/*
 * What one query sends, as the public calls take it (all borrowed): every
 * query variant (sync, submit, fan-out; tokens, keys, salted) goes through
 * cl_build_query() with one of these.
 */
typedef struct cl_q {
    const char *model, *lora; /* lora NULL or "": the base model */
    const char *salt;         /* token queries: the cache salt; NULL or "": none (kind 0) */
    uint8_t kind;             /* KVT_PROTO_Q_TOKENS or KVT_PROTO_Q_KEYS */
    const void *vals;         /* n u32 tokens or n u64 keys */
    size_t n;
    const char *const *pods; /* filter; NULL/0: every pod */
    size_t npods;
} cl_q_t;

struct kvt_client {
    bool is_unix;
    char host[256]; /* TCP: host name or address literal (no brackets) */
    char port[8];
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char addr[300]; /* as given, for messages */
    int connect_ms, io_ms;
    char token[KVT_PROTO_MAX_STR + 1];
    uint16_t token_len;

    int fd;            /* -1: not connected */
    uint32_t max_body; /* the server's request limit, from HELLO */
    uint64_t next_id;

    kvt_proto_wr_t out; /* bytes not yet written */
    uint8_t *in;        /* bytes read: [in_off, in_len) not parsed yet */
    size_t in_off, in_len, in_cap;

    cl_flight_t *fl; /* submitted queries */
    size_t nfl, fl_cap;

    kvt_client_result_t cbres; /* handed to callbacks */
    size_t cbcap;

    char err[CL_ERR_SIZE];
};

/* ---- errors --------------------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static kvt_status_t
cl_fail(kvt_client_t *c, kvt_status_t st, const char *fmt, ...)
{
    char msg[CL_ERR_SIZE];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* A long message is cut; the return value is checked only to say so to the compiler. */
    if (snprintf(c->err, sizeof(c->err), "%s: %s", c->addr, msg) < 0)
        c->err[0] = '\0';
    /* One line, whatever the server or a file name contained. */
    for (char *p = c->err; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20)
            *p = '?';
    return st;
}

const char *kvt_client_last_error(const kvt_client_t *c)
{
    return c != NULL ? c->err : "no client";
}

void kvt_client_free(void *p)
{
    free(p);
}

const char *kvt_client_version(void)
{
    return KVT_VERSION;
}

size_t kvt_client_hash_tokens_salted(const uint32_t *tokens, size_t n, uint32_t block_size,
                                     const char *cache_salt, uint64_t *keys_out)
{
    if (block_size == 0 || n < block_size)
        return 0;
    size_t slen = cache_salt != NULL ? strlen(cache_salt) : 0;
    return kvt_hash_seq_salted(tokens, n, block_size, kvt_hash_salt_seed(cache_salt, slen), NULL,
                               NULL, keys_out);
}

size_t kvt_client_hash_tokens(const uint32_t *tokens, size_t n, uint32_t block_size,
                              uint64_t *keys_out)
{
    return kvt_client_hash_tokens_salted(tokens, n, block_size, NULL, keys_out);
}

/* ---- options and address -------------------------------------------------------------------- */

void kvt_client_opts_default(kvt_client_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->address = KVT_CLIENT_DEFAULT_ADDR;
    o->connect_timeout_ms = CL_DEFAULT_TIMEOUT_MS;
    o->io_timeout_ms = CL_DEFAULT_TIMEOUT_MS;
}

/* Splits @a into the client's host/port or path. Returns a static reason or NULL. */
static const char *cl_parse_addr(kvt_client_t *c, const char *a)
{
    size_t alen = strlen(a);

    if (alen >= sizeof(c->addr))
        return "address too long";
    memcpy(c->addr, a, alen + 1);
    if (strncmp(a, "unix:", 5) == 0) {
        size_t plen = alen - 5;
        if (plen == 0)
            return "empty unix socket path";
        if (plen >= sizeof(c->path))
            return "unix socket path too long";
        memcpy(c->path, a + 5, plen + 1);
        c->is_unix = true;
        return NULL;
    }
    const char *colon, *host = a;
    size_t hlen;
    if (a[0] == '[') {
        const char *close = strchr(a, ']');
        if (close == NULL || close[1] != ':')
            return "expected [ipv6]:port";
        host = a + 1;
        hlen = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(a, ':');
        if (colon == NULL)
            return "expected host:port or unix:/path";
        hlen = (size_t)(colon - a);
        if (memchr(a, ':', hlen) != NULL)
            return "an ipv6 address needs brackets: [addr]:port";
    }
    if (hlen == 0)
        return "empty host";
    if (hlen >= sizeof(c->host))
        return "host name too long";
    const char *p = colon + 1;
    size_t plen = strlen(p);
    unsigned long port = 0;
    if (plen == 0 || plen > 5)
        return "port must be a number in 1..65535";
    for (size_t i = 0; i < plen; i++) {
        if (p[i] < '0' || p[i] > '9')
            return "port must be a number in 1..65535";
        port = port * 10 + (unsigned long)(p[i] - '0');
    }
    if (port == 0 || port > 65535)
        return "port must be a number in 1..65535";
    memcpy(c->host, host, hlen);
    c->host[hlen] = '\0';
    memcpy(c->port, p, plen + 1);
    c->is_unix = false;
    return NULL;
}

/* ---- connection ----------------------------------------------------------------------------- */

/* Forgets the connection and every buffered byte (in-flight entries are the caller's). */
static void cl_close(kvt_client_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    kvt_proto_wr_reset(&c->out);
    c->in_off = c->in_len = 0;
}

/* Milliseconds left until @deadline (a kvt_clock_ms() value), at least 0. */
static int cl_left(uint64_t deadline)
{
    uint64_t now = kvt_clock_ms();
    if (now >= deadline)
        return 0;
    uint64_t left = deadline - now;
    return left > (uint64_t)INT32_MAX ? INT32_MAX : (int)left;
}

/* Waits until @fd is ready for @events or @deadline passes. KVT_OK, KVT_ERR_TIMEOUT, KVT_ERR_IO. */
static kvt_status_t cl_wait(kvt_client_t *c, int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events, .revents = 0};
        int left = cl_left(deadline);
        if (left == 0)
            return cl_fail(c, KVT_ERR_TIMEOUT, "timed out");
        int r = poll(&p, 1, left);
        if (r > 0)
            return KVT_OK; /* errors and hangups surface in the next send/recv */
        if (r == 0)
            return cl_fail(c, KVT_ERR_TIMEOUT, "timed out");
        if (errno != EINTR)
            return cl_fail(c, KVT_ERR_IO, "poll: %s", strerror(errno));
    }
}

/* Non-blocking connect of a fresh socket for @sa, waiting up to @deadline. Returns the fd or -1
 * with the message in c->err. */
static int cl_connect_one(kvt_client_t *c, int family, const struct sockaddr *sa, socklen_t salen,
                          uint64_t deadline, kvt_status_t *st_p)
{
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *st_p = cl_fail(c, KVT_ERR_IO, "socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, sa, salen) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            *st_p = cl_fail(c, KVT_ERR_IO, "connect: %s", strerror(errno));
            goto err_close;
        }
        kvt_status_t st = cl_wait(c, fd, POLLOUT, deadline);
        if (st != KVT_OK) {
            *st_p = st == KVT_ERR_TIMEOUT ? cl_fail(c, st, "connect: timed out") : st;
            goto err_close;
        }
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
            soerr = errno;
        if (soerr != 0) {
            *st_p = cl_fail(c, KVT_ERR_IO, "connect: %s", strerror(soerr));
            goto err_close;
        }
    }
    if (family != AF_UNIX) {
        /* Requests are small and latency-bound: do not let Nagle hold them back. */
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return fd;

err_close:
    close(fd);
    return -1;
}

static kvt_status_t cl_read(kvt_client_t *c, uint64_t deadline, bool block);
static kvt_status_t cl_flush(kvt_client_t *c, uint64_t deadline, bool block);
static kvt_status_t cl_next_frame(kvt_client_t *c, bool *got_p, kvt_proto_hdr_t *h_p,
                                  const uint8_t **body_p);
static kvt_status_t cl_error_answer(kvt_client_t *c, const kvt_proto_hdr_t *h, const uint8_t *body);

/* Sends HELLO on the fresh connection and reads its answer, up to @deadline. */
static kvt_status_t cl_hello(kvt_client_t *c, uint64_t deadline)
{
    uint64_t id = c->next_id++;
    kvt_proto_hello_req_t req = {KVT_PROTO_VERSION, {c->token, c->token_len}};
    kvt_status_t st = kvt_proto_hello_req_encode(&c->out, id, &req);
    if (st != KVT_OK)
        return cl_fail(c, st, "cannot encode hello");
    st = cl_flush(c, deadline, true);
    if (st != KVT_OK)
        return st;
    for (;;) {
        bool got;
        kvt_proto_hdr_t h;
        const uint8_t *body;
        st = cl_next_frame(c, &got, &h, &body);
        if (st != KVT_OK)
            return st;
        if (!got) {
            st = cl_read(c, deadline, true);
            if (st != KVT_OK)
                return st;
            continue;
        }
        if (h.req_id != id && h.req_id != 0)
            continue;
        if ((h.flags & KVT_PROTO_F_ERROR) != 0) {
            kvt_proto_err_t e;
            /* A server with a token refuses a HELLO without one, yet serves reads: carry on
             * unauthenticated (mutating calls will get their own 401). */
            if (c->token_len == 0 && h.req_id == id &&
                kvt_proto_err_decode(body, h.body_len, &e, NULL) == KVT_OK && e.http == 401) {
                c->max_body = KVT_PROTO_MAX_BODY_DEFAULT;
                return KVT_OK;
            }
            st = cl_error_answer(c, &h, body);
            return cl_fail(c, st, "hello refused: %s", c->err + strlen(c->addr) + 2);
        }
        if (h.op != KVT_PROTO_OP_HELLO)
            return cl_fail(c, KVT_ERR_PROTO, "answer to hello has opcode %s",
                           kvt_proto_op_name(h.op));
        kvt_proto_hello_ans_t ans;
        const char *why = NULL;
        if (kvt_proto_hello_ans_decode(body, h.body_len, &ans, &why) != KVT_OK)
            return cl_fail(c, KVT_ERR_PROTO, "%s", why);
        if (ans.server_version != KVT_PROTO_VERSION)
            return cl_fail(c, KVT_ERR_PROTO, "server speaks protocol version %u, not %u",
                           ans.server_version, KVT_PROTO_VERSION);
        c->max_body = ans.max_body == 0 || ans.max_body > KVT_PROTO_MAX_BODY_LIMIT
                          ? KVT_PROTO_MAX_BODY_LIMIT
                          : ans.max_body;
        return KVT_OK;
    }
}

/* Connects and says HELLO, everything within the connect timeout (and @limit, when not 0). */
static kvt_status_t cl_connect(kvt_client_t *c, uint64_t limit)
{
    uint64_t deadline = kvt_clock_ms() + (uint64_t)c->connect_ms;
    kvt_status_t st = KVT_ERR_IO;

    if (limit != 0 && limit < deadline)
        deadline = limit;
    cl_close(c);
    if (c->is_unix) {
        struct sockaddr_un sun;
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        memcpy(sun.sun_path, c->path, strlen(c->path) + 1);
        c->fd =
            cl_connect_one(c, AF_UNIX, (const struct sockaddr *)&sun, sizeof(sun), deadline, &st);
    } else {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        int gai = getaddrinfo(c->host, c->port, &hints, &res);
        if (gai != 0)
            return cl_fail(c, KVT_ERR_IO, "cannot resolve '%s': %s", c->host, gai_strerror(gai));
        for (struct addrinfo *ai = res; ai != NULL && c->fd < 0; ai = ai->ai_next)
            c->fd = cl_connect_one(c, ai->ai_family, ai->ai_addr, ai->ai_addrlen, deadline, &st);
        freeaddrinfo(res);
    }
    if (c->fd < 0)
        return st;
    st = cl_hello(c, deadline);
    if (st != KVT_OK)
        cl_close(c);
    return st;
}

/*
 * False when an idle connection is known to be dead (the server closed it or
 * it failed), so that a call does not learn it the hard way. Only meaningful
 * with nothing in flight: then any byte waiting is stale.
 */
static bool cl_alive(kvt_client_t *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP, .revents = 0};
    if (poll(&p, 1, 0) <= 0)
        return true;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
}

/* ---- buffered I/O --------------------------------------------------------------------------- */

/* Writes c->out; with @block waits up to @deadline, else returns once the socket is full. */
static kvt_status_t cl_flush(kvt_client_t *c, uint64_t deadline, bool block)
{
    if (c->fd < 0)
        return cl_fail(c, KVT_ERR_CLOSED, "not connected");
    size_t sent = 0;
    kvt_status_t st = KVT_OK;
    while (sent < c->out.len) {
        ssize_t n = send(c->fd, c->out.buf + sent, c->out.len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!block)
                break;
            st = cl_wait(c, c->fd, POLLOUT, deadline);
            if (st != KVT_OK)
                break;
            continue;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
            st = cl_fail(c, KVT_ERR_CLOSED, "connection closed by the server");
        else
            st = cl_fail(c, KVT_ERR_IO, "send: %s", strerror(errno));
        break;
    }
    kvt_proto_wr_consume(&c->out, sent);
    return st;
}

/*
 * Reads what the socket has into c->in; with @block waits for at least one
 * byte until @deadline. Without @block, KVT_OK may mean nothing arrived.
 */
static kvt_status_t cl_read(kvt_client_t *c, uint64_t deadline, bool block)
{
    if (c->fd < 0)
        return cl_fail(c, KVT_ERR_CLOSED, "not connected");
    if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    /* Room for the frame being received, at least one chunk. */
    size_t want = CL_READ_CHUNK;
    if (c->in_len >= KVT_PROTO_HDR_SIZE) {
        kvt_proto_hdr_t h;
        kvt_proto_hdr_peek(c->in, &h);
        size_t frame = KVT_PROTO_HDR_SIZE + (size_t)h.body_len;
        if (frame > c->in_len && frame - c->in_len > want)
            want = frame - c->in_len;
    }
    if (c->in_cap - c->in_len < want) {
        size_t cap = c->in_len + want;
        uint8_t *in = realloc(c->in, cap);
        if (in == NULL)
            return cl_fail(c, KVT_ERR_NO_MEM, "out of memory for a %zu-byte answer", cap);
        c->in = in;
        c->in_cap = cap;
    }
    for (;;) {
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
        if (n > 0) {
            c->in_len += (size_t)n;
            return KVT_OK;
        }
        if (n == 0)
            return cl_fail(c, KVT_ERR_CLOSED, "connection closed by the server");
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!block)
                return KVT_OK;
            kvt_status_t st = cl_wait(c, c->fd, POLLIN, deadline);
            if (st != KVT_OK)
                return st;
            continue;
        }
        if (errno == ECONNRESET)
            return cl_fail(c, KVT_ERR_CLOSED, "connection reset by the server");
        return cl_fail(c, KVT_ERR_IO, "recv: %s", strerror(errno));
    }
}

/*
 * Takes the next whole answer frame out of c->in: *@got_p says whether there
 * was one; *@body_p points into c->in and stays valid until the next cl_read.
 * A header that breaks the protocol is KVT_ERR_PROTO (the stream is lost).
 */
static kvt_status_t cl_next_frame(kvt_client_t *c, bool *got_p, kvt_proto_hdr_t *h_p,
                                  const uint8_t **body_p)
{
    size_t avail = c->in_len - c->in_off;
    *got_p = false;
    if (avail < KVT_PROTO_HDR_SIZE)
        return KVT_OK;
    const uint8_t *p = c->in + c->in_off;
    const char *why = NULL;
    kvt_proto_hdr_t h;
    kvt_status_t st = kvt_proto_hdr_check(p, KVT_PROTO_MAX_BODY_LIMIT, &h, &why);
    if (st != KVT_OK)
        return cl_fail(c, KVT_ERR_PROTO, "bad answer %s", why);
    if ((h.flags & KVT_PROTO_F_RESPONSE) == 0)
        return cl_fail(c, KVT_ERR_PROTO, "server sent a request frame");
    if (avail - KVT_PROTO_HDR_SIZE < h.body_len)
        return KVT_OK;
    *h_p = h;
    *body_p = p + KVT_PROTO_HDR_SIZE;
    c->in_off += KVT_PROTO_HDR_SIZE + h.body_len;
    *got_p = true;
    return KVT_OK;
}

/* Turns an error answer into its status and message. A malformed one is a protocol error. */
static kvt_status_t cl_error_answer(kvt_client_t *c, const kvt_proto_hdr_t *h, const uint8_t *body)
{
    kvt_proto_err_t e;
    const char *why = NULL;
    if (kvt_proto_err_decode(body, h->body_len, &e, &why) != KVT_OK)
        return cl_fail(c, KVT_ERR_PROTO, "%s", why);
    return cl_fail(c, (kvt_status_t)e.status, "server: %.*s (%u)", (int)e.msg.len,
                   e.msg.len > 0 ? e.msg.p : "", e.http);
}

/* ---- create / destroy ----------------------------------------------------------------------- */

kvt_status_t kvt_client_create_msg(const kvt_client_opts_t *o, kvt_client_t **c_p, char *msg,
                                   size_t msglen)
{
    kvt_client_opts_t def;
    kvt_status_t st;

    if (msg != NULL && msglen > 0)
        msg[0] = '\0';
    if (c_p == NULL)
        return KVT_ERR_INVAL;
    if (o == NULL) {
        kvt_client_opts_default(&def);
        o = &def;
    }
    kvt_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        if (msg != NULL && msglen > 0)
            snprintf(msg, msglen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    c->fd = -1;
    c->next_id = 1; /* 0 is the id of answers to untrustworthy headers */
    c->max_body = KVT_PROTO_MAX_BODY_DEFAULT;
    c->connect_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : CL_DEFAULT_TIMEOUT_MS;
    c->io_ms = o->io_timeout_ms > 0 ? o->io_timeout_ms : CL_DEFAULT_TIMEOUT_MS;
    kvt_proto_wr_init(&c->out);

    const char *addr = o->address != NULL ? o->address : KVT_CLIENT_DEFAULT_ADDR;
    const char *why = cl_parse_addr(c, addr);
    if (why != NULL) {
        snprintf(c->addr, sizeof(c->addr), "%.200s", addr);
        st = cl_fail(c, KVT_ERR_INVAL, "bad address: %s", why);
        goto err_free;
    }
    if (o->auth_token != NULL) {
        size_t tlen = strlen(o->auth_token);
        if (tlen > KVT_PROTO_MAX_STR) {
            st = cl_fail(c, KVT_ERR_INVAL, "auth token longer than %u bytes", KVT_PROTO_MAX_STR);
            goto err_free;
        }
        memcpy(c->token, o->auth_token, tlen);
        c->token_len = (uint16_t)tlen;
    }
    if (!o->lazy_connect) {
        st = cl_connect(c, 0);
        if (st != KVT_OK)
            goto err_free;
    }
    *c_p = c;
    return KVT_OK;

err_free:
    if (msg != NULL && msglen > 0)
        snprintf(msg, msglen, "%s", c->err);
    kvt_client_destroy(c);
    return st;
}

kvt_status_t kvt_client_create(const kvt_client_opts_t *o, kvt_client_t **c_p)
{
    return kvt_client_create_msg(o, c_p, NULL, 0);
}

void kvt_client_destroy(kvt_client_t *c)
{
    if (c == NULL)
        return;
    cl_close(c);
    kvt_proto_wr_cleanup(&c->out);
    free(c->in);
    free(c->fl);
    free(c->cbres.pods);
    free(c);
}

int kvt_client_fd(const kvt_client_t *c)
{
    return c->fd;
}

bool kvt_client_want_write(const kvt_client_t *c)
{
    return c->fd >= 0 && c->out.len > 0;
}

size_t kvt_client_inflight(const kvt_client_t *c)
{
    return c->nfl;
}

/* ---- results -------------------------------------------------------------------------------- */

void kvt_client_result_free(kvt_client_result_t *r)
{
    if (r == NULL)
        return;
    free(r->pods);
    memset(r, 0, sizeof(*r));
}

/*
 * Decodes a QUERY answer into @r, whose pods array has room for *@cap entries
 * (grown with realloc as needed). KVT_OK, KVT_ERR_PROTO, KVT_ERR_NO_MEM.
 */
static kvt_status_t cl_decode_result(kvt_client_t *c, const uint8_t *body, uint32_t len,
                                     kvt_client_result_t *r, size_t *cap)
{
    kvt_proto_query_ans_t a;
    const char *why = NULL;

    if (kvt_proto_query_ans_decode(body, len, &a, &why) != KVT_OK)
        return cl_fail(c, KVT_ERR_PROTO, "%s", why);
    if (a.npods > *cap) {
        kvt_client_pod_t *pods = realloc(r->pods, (size_t)a.npods * sizeof(*pods));
        if (pods == NULL)
            return cl_fail(c, KVT_ERR_NO_MEM, "out of memory for %u pods", a.npods);
        r->pods = pods;
        *cap = a.npods;
    }
    kvt_proto_rd_t rd;
    kvt_proto_rd_init(&rd, a.pods, a.pods_len);
    for (uint32_t i = 0; i < a.npods; i++) {
        kvt_proto_pod_ans_t pa;
        if (!kvt_proto_query_ans_next(&rd, &pa))
            return cl_fail(c, KVT_ERR_INTERNAL, "validated answer did not read back");
        kvt_client_pod_t *p = &r->pods[i];
        memcpy(p->pod, pa.pod.p, pa.pod.len);
        p->pod[pa.pod.len] = '\0';
        p->dp_rank = pa.dp_rank;
        p->matched = pa.matched;
        p->gpu = pa.gpu;
        p->cpu = pa.cpu;
        p->disk = pa.disk;
        p->score = pa.score;
    }
    r->block_size = a.block_size;
    r->num_blocks = a.num_blocks;
    r->npods = a.npods;
    r->answered = r->asked = 1;
    return KVT_OK;
}

/* ---- blocking calls ------------------------------------------------------------------------- */

/* An answer to a blocking call: the frame stays in c->in until the next read. */
typedef struct cl_answer {
    kvt_proto_hdr_t h;
    const uint8_t *body;
} cl_answer_t;

/*
 * Sends the frame @req (req_id patched in) and waits for its answer. Retries
 * once on a fresh connection when @idempotent and a reused connection broke.
 * On KVT_OK *@ans holds a non-error answer of the request's opcode; an error
 * answer returns the server's status (connection kept).
 */
static kvt_status_t cl_call(kvt_client_t *c, kvt_proto_wr_t *req, bool idempotent, cl_answer_t *ans)
{
    kvt_status_t st = KVT_OK;

    c->err[0] = '\0';
    if (c->nfl > 0)
        return cl_fail(c, KVT_ERR_INVAL, "blocking call while %zu submitted queries are in flight",
                       c->nfl);
    for (int attempt = 0; attempt < 2; attempt++) {
        bool reused = c->fd >= 0;
        if (reused && !cl_alive(c)) {
            cl_close(c); /* the server went away while we were idle */
            reused = false;
        }
        if (c->fd < 0) {
            st = cl_connect(c, 0);
            if (st != KVT_OK)
                return st;
        }
        if (req->len - KVT_PROTO_HDR_SIZE > c->max_body)
            return cl_fail(c, KVT_ERR_TOO_BIG, "request body of %zu bytes is over the server's %u",
                           req->len - KVT_PROTO_HDR_SIZE, c->max_body);
        uint64_t id = c->next_id++;
        uint8_t *idp = req->buf + 8;
        for (int i = 0; i < 8; i++)
            idp[i] = (uint8_t)(id >> (8 * i));
        uint64_t deadline = kvt_clock_ms() + (uint64_t)c->io_ms;
        kvt_proto_wr_raw(&c->out, req->buf, req->len);
        if (c->out.oom) {
            kvt_proto_wr_reset(&c->out);
            return cl_fail(c, KVT_ERR_NO_MEM, "out of memory for the request");
        }
        uint8_t op = req->buf[5];
        st = cl_flush(c, deadline, true);
        while (st == KVT_OK) {
            bool got;
            st = cl_next_frame(c, &got, &ans->h, &ans->body);
            if (st != KVT_OK)
                break;
            if (!got) {
                st = cl_read(c, deadline, true);
                continue;
            }
            if (ans->h.req_id == 0 && (ans->h.flags & KVT_PROTO_F_ERROR) != 0) {
                /* The server refused our stream and is closing it. */
                st = cl_error_answer(c, &ans->h, ans->body);
                if (st == KVT_OK || (int)st > 0)
                    st = KVT_ERR_PROTO;
                break;
            }
            if (ans->h.req_id != id)
                continue; /* a stale answer to a request that timed out */
            if (ans->h.op != op) {
                st = cl_fail(c, KVT_ERR_PROTO, "answer to %s has opcode %s", kvt_proto_op_name(op),
                             kvt_proto_op_name(ans->h.op));
                break;
            }
            if ((ans->h.flags & KVT_PROTO_F_ERROR) != 0) {
                st = cl_error_answer(c, &ans->h, ans->body);
                if (st == KVT_ERR_PROTO)
                    cl_close(c);
                return st == KVT_OK ? KVT_ERR_PEER : st;
            }
            c->err[0] = '\0'; /* a failed first attempt is not this call's failure */
            return KVT_OK;
        }
        cl_close(c);
        bool retry =
            idempotent && reused && attempt == 0 && (st == KVT_ERR_CLOSED || st == KVT_ERR_IO);
        if (!retry)
            return st;
    }
    return st;
}

/* Builds the QUERY request frame of @q into @w (the blocking calls patch req_id in later). */
static kvt_status_t cl_build_query(kvt_client_t *c, kvt_proto_wr_t *w, uint64_t req_id,
                                   const cl_q_t *q)
{
    kvt_proto_str_t podstr[16], *ps = podstr;
    kvt_status_t st;

    if (q->model == NULL || q->model[0] == '\0')
        return cl_fail(c, KVT_ERR_INVAL, "query: empty model name");
    if (q->n > 0 && q->vals == NULL)
        return cl_fail(c, KVT_ERR_INVAL, "query: NULL %s with n %zu",
                       q->kind == KVT_PROTO_Q_TOKENS ? "tokens" : "keys", q->n);
    if (q->npods > 0 && q->pods == NULL)
        return cl_fail(c, KVT_ERR_INVAL, "query: NULL pods with npods %zu", q->npods);
    if (q->n > UINT32_MAX || q->npods > UINT32_MAX)
        return cl_fail(c, KVT_ERR_TOO_BIG, "query: too many values or pods");
    size_t mlen = strlen(q->model), llen = q->lora != NULL ? strlen(q->lora) : 0;
    if (mlen > KVT_PROTO_MAX_STR || llen > KVT_PROTO_MAX_STR)
        return cl_fail(c, KVT_ERR_INVAL, "query: model or lora name longer than %u bytes",
                       KVT_PROTO_MAX_STR);
    size_t slen = q->salt != NULL ? strlen(q->salt) : 0;
    if (slen > KVT_PROTO_MAX_STR)
        return cl_fail(c, KVT_ERR_INVAL, "query: cache salt longer than %u bytes",
                       KVT_PROTO_MAX_STR);
    /* a salted token query is kind 2; no salt stays kind 0, which every server speaks */
    uint8_t kind = q->kind == KVT_PROTO_Q_TOKENS && slen > 0 ? KVT_PROTO_Q_TOKENS_SALTED : q->kind;
    if (q->npods > sizeof(podstr) / sizeof(podstr[0])) {
        ps = malloc(q->npods * sizeof(*ps));
        if (ps == NULL)
            return cl_fail(c, KVT_ERR_NO_MEM, "out of memory for %zu pod names", q->npods);
    }
    for (size_t i = 0; i < q->npods; i++) {
        size_t plen = q->pods[i] != NULL ? strlen(q->pods[i]) : 0;
        if (plen == 0 || plen > KVT_PROTO_MAX_STR) {
            st = cl_fail(c, KVT_ERR_INVAL, "query: pod name %zu is empty or longer than %u bytes",
                         i, KVT_PROTO_MAX_STR);
            goto out;
        }
        ps[i].p = q->pods[i];
        ps[i].len = (uint16_t)plen;
    }
    kvt_proto_query_req_t r = {
        .model = {q->model, (uint16_t)mlen},
        .lora = {q->lora, (uint16_t)llen},
        .kind = kind,
        .n = (uint32_t)q->n,
        .tokens = q->kind == KVT_PROTO_Q_TOKENS ? q->vals : NULL,
        .keys = q->kind == KVT_PROTO_Q_KEYS ? q->vals : NULL,
        .npods = (uint32_t)q->npods,
        .pods = ps,
        .salt = {q->salt, (uint16_t)slen},
    };
    st = kvt_proto_query_req_encode(w, req_id, &r);
    if (st == KVT_ERR_TOO_BIG)
        cl_fail(c, st, "query: request larger than the protocol allows");
    else if (st != KVT_OK)
        cl_fail(c, st, "query: cannot encode the request: %s", kvt_status_str(st));
out:
    if (ps != podstr)
        free(ps);
    return st;
}

static kvt_status_t cl_query(kvt_client_t *c, const cl_q_t *q, kvt_client_result_t *res_p)
{
    kvt_proto_wr_t req;
    cl_answer_t ans;
    kvt_client_result_t r = {0};
    size_t cap = 0;

    if (c == NULL || res_p == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    kvt_proto_wr_init(&req);
    kvt_status_t st = cl_build_query(c, &req, 0, q);
    if (st == KVT_OK)
        st = cl_call(c, &req, true, &ans);
    if (st == KVT_OK) {
        st = cl_decode_result(c, ans.body, ans.h.body_len, &r, &cap);
        if (st == KVT_ERR_PROTO)
            cl_close(c);
    }
    kvt_proto_wr_cleanup(&req);
    if (st != KVT_OK) {
        free(r.pods);
        return st;
    }
    *res_p = r;
    return KVT_OK;
}

kvt_status_t kvt_client_query(kvt_client_t *c, const char *model, const char *lora,
                              const uint32_t *tokens, size_t n, const char *const *pods,
                              size_t npods, kvt_client_result_t *res_p)
{
    return kvt_client_query_salted(c, model, lora, NULL, tokens, n, pods, npods, res_p);
}

kvt_status_t kvt_client_query_salted(kvt_client_t *c, const char *model, const char *lora,
                                     const char *cache_salt, const uint32_t *tokens, size_t n,
                                     const char *const *pods, size_t npods,
                                     kvt_client_result_t *res_p)
{
    cl_q_t q = {model, lora, cache_salt, KVT_PROTO_Q_TOKENS, tokens, n, pods, npods};
    return cl_query(c, &q, res_p);
}

kvt_status_t kvt_client_query_keys(kvt_client_t *c, const char *model, const char *lora,
                                   const uint64_t *keys, size_t n, const char *const *pods,
                                   size_t npods, kvt_client_result_t *res_p)
{
    cl_q_t q = {model, lora, NULL, KVT_PROTO_Q_KEYS, keys, n, pods, npods};
    return cl_query(c, &q, res_p);
}

/* Sends @req and, when @answer_p is not NULL, returns the answer body as a
 * NUL-terminated string the caller frees. */
static kvt_status_t cl_call_text(kvt_client_t *c, kvt_proto_wr_t *req, bool idempotent,
                                 char **answer_p)
{
    cl_answer_t ans;
    kvt_status_t st = cl_call(c, req, idempotent, &ans);
    if (st != KVT_OK || answer_p == NULL)
        return st;
    char *text = malloc((size_t)ans.h.body_len + 1);
    if (text == NULL)
        return cl_fail(c, KVT_ERR_NO_MEM, "out of memory for a %u-byte answer", ans.h.body_len);
    if (ans.h.body_len > 0)
        memcpy(text, ans.body, ans.h.body_len);
    text[ans.h.body_len] = '\0';
    *answer_p = text;
    return KVT_OK;
}

/* A call whose request body is @body and whose answer is JSON text. */
static kvt_status_t cl_json_call(kvt_client_t *c, uint8_t op, const void *body, size_t len,
                                 bool idempotent, char **answer_p)
{
    kvt_proto_wr_t req;

    if (c == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    kvt_proto_wr_init(&req);
    kvt_status_t st = kvt_proto_raw_encode(&req, op, 0, 0, body, len);
    if (st != KVT_OK) {
        st = cl_fail(c, st, "%s: request of %zu bytes cannot be encoded: %s", kvt_proto_op_name(op),
                     len, kvt_status_str(st));
        goto out;
    }
    st = cl_call_text(c, &req, idempotent, answer_p);
out:
    kvt_proto_wr_cleanup(&req);
    return st;
}

kvt_status_t kvt_client_report_events(kvt_client_t *c, const char *json, size_t len,
                                      char **answer_p)
{
    if (json == NULL && len > 0)
        return c != NULL ? cl_fail(c, KVT_ERR_INVAL, "events: NULL body") : KVT_ERR_INVAL;
    return cl_json_call(c, KVT_PROTO_OP_EVENTS, json, len, false, answer_p);
}

kvt_status_t kvt_client_add_engine(kvt_client_t *c, const char *json, size_t len, char **answer_p)
{
    if (json == NULL)
        return c != NULL ? cl_fail(c, KVT_ERR_INVAL, "engine add: NULL body") : KVT_ERR_INVAL;
    return cl_json_call(c, KVT_PROTO_OP_ENGINE_ADD, json, len, false, answer_p);
}

kvt_status_t kvt_client_stats(kvt_client_t *c, char **json_p)
{
    if (json_p == NULL)
        return c != NULL ? cl_fail(c, KVT_ERR_INVAL, "stats: NULL output") : KVT_ERR_INVAL;
    return cl_json_call(c, KVT_PROTO_OP_STATS, NULL, 0, true, json_p);
}

kvt_status_t kvt_client_ping(kvt_client_t *c)
{
    return cl_json_call(c, KVT_PROTO_OP_PING, NULL, 0, true, NULL);
}

/* ENGINE_DROP or MODEL_DROP of @name: a body of one name, answered with JSON. */
static kvt_status_t cl_drop(kvt_client_t *c, bool model, const char *name, char **answer_p)
{
    kvt_proto_wr_t req;
    const char *what = model ? "model drop" : "engine drop";

    if (c == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    size_t n = name != NULL ? strlen(name) : 0;
    if (n == 0 || n > KVT_PROTO_MAX_STR)
        return cl_fail(c, KVT_ERR_INVAL, "%s: %s name empty or longer than %u bytes", what,
                       model ? "model" : "pod", KVT_PROTO_MAX_STR);
    kvt_proto_wr_init(&req);
    kvt_proto_str_t s = {name, (uint16_t)n};
    kvt_status_t st = model ? kvt_proto_model_drop_req_encode(&req, 0, s)
                            : kvt_proto_drop_req_encode(&req, 0, s);
    if (st != KVT_OK) {
        st = cl_fail(c, st, "%s: cannot encode the request: %s", what, kvt_status_str(st));
        goto out;
    }
    st = cl_call_text(c, &req, false, answer_p);
out:
    kvt_proto_wr_cleanup(&req);
    return st;
}

kvt_status_t kvt_client_drop_engine(kvt_client_t *c, const char *pod, char **answer_p)
{
    return cl_drop(c, false, pod, answer_p);
}

kvt_status_t kvt_client_drop_model(kvt_client_t *c, const char *model, char **answer_p)
{
    return cl_drop(c, true, model, answer_p);
}

/* ---- asynchronous queries ------------------------------------------------------------------- */

/* Marks every waiting query failed with @st (reported by the next progress) and closes. */
static void cl_break(kvt_client_t *c, kvt_status_t st)
{
    for (size_t i = 0; i < c->nfl; i++)
        if (c->fl[i].st == KVT_OK)
            c->fl[i].st = st;
    cl_close(c);
}

static void cl_fl_remove(kvt_client_t *c, size_t i)
{
    memmove(&c->fl[i], &c->fl[i + 1], (c->nfl - i - 1) * sizeof(c->fl[0]));
    c->nfl--;
}

/* Queues @q on @c (connecting first, within @limit when not 0) and writes what the socket takes. */
static kvt_status_t cl_submit(kvt_client_t *c, const cl_q_t *q, uint64_t limit, uint64_t *req_id_p)
{
    if (c == NULL || req_id_p == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    if (c->fd >= 0 && c->nfl == 0 && c->out.len == 0 && !cl_alive(c))
        cl_close(c);
    if (c->fd < 0) {
        kvt_status_t st = cl_connect(c, limit);
        if (st != KVT_OK)
            return st;
    }
    if (c->nfl == c->fl_cap) {
        size_t cap = c->fl_cap == 0 ? 16 : c->fl_cap * 2;
        cl_flight_t *fl = realloc(c->fl, cap * sizeof(*fl));
        if (fl == NULL)
            return cl_fail(c, KVT_ERR_NO_MEM, "out of memory for in-flight queries");
        c->fl = fl;
        c->fl_cap = cap;
    }
    uint64_t id = c->next_id++;
    size_t off = c->out.len;
    kvt_status_t st = cl_build_query(c, &c->out, id, q);
    if (st != KVT_OK)
        return st;
    if (c->out.len - off - KVT_PROTO_HDR_SIZE > c->max_body) {
        size_t body = c->out.len - off - KVT_PROTO_HDR_SIZE;
        c->out.len = off;
        return cl_fail(c, KVT_ERR_TOO_BIG, "request body of %zu bytes is over the server's %u",
                       body, c->max_body);
    }
    c->fl[c->nfl].id = id;
    c->fl[c->nfl].st = KVT_OK;
    c->nfl++;
    st = cl_flush(c, 0, false);
    if (st != KVT_OK) {
        /* This one fails now; the others are reported by the next progress. */
        c->nfl--;
        char msg[CL_ERR_SIZE];
        memcpy(msg, c->err, sizeof(msg));
        cl_break(c, st);
        memcpy(c->err, msg, sizeof(msg));
        return st;
    }
    *req_id_p = id;
    return KVT_OK;
}

kvt_status_t kvt_client_query_submit(kvt_client_t *c, const char *model, const char *lora,
                                     const uint32_t *tokens, size_t n, const char *const *pods,
                                     size_t npods, uint64_t *req_id_p)
{
    return kvt_client_query_salted_submit(c, model, lora, NULL, tokens, n, pods, npods, req_id_p);
}

kvt_status_t kvt_client_query_salted_submit(kvt_client_t *c, const char *model, const char *lora,
                                            const char *cache_salt, const uint32_t *tokens,
                                            size_t n, const char *const *pods, size_t npods,
                                            uint64_t *req_id_p)
{
    cl_q_t q = {model, lora, cache_salt, KVT_PROTO_Q_TOKENS, tokens, n, pods, npods};
    return cl_submit(c, &q, 0, req_id_p);
}

kvt_status_t kvt_client_query_keys_submit(kvt_client_t *c, const char *model, const char *lora,
                                          const uint64_t *keys, size_t n, const char *const *pods,
                                          size_t npods, uint64_t *req_id_p)
{
    cl_q_t q = {model, lora, NULL, KVT_PROTO_Q_KEYS, keys, n, pods, npods};
    return cl_submit(c, &q, 0, req_id_p);
}

/* Reports (and forgets) every failed in-flight query. */
static void cl_report_failed(kvt_client_t *c, kvt_client_cb cb, void *arg)
{
    for (size_t i = 0; i < c->nfl;) {
        if (c->fl[i].st == KVT_OK) {
            i++;
            continue;
        }
        cl_flight_t f = c->fl[i];
        cl_fl_remove(c, i);
        if (cb != NULL)
            cb(arg, f.id, f.st, NULL); /* may submit: restart the scan */
        i = 0;
    }
}

/* Handles one answer frame in progress(). Returns KVT_OK or a connection-fatal error. */
static kvt_status_t cl_dispatch(kvt_client_t *c, const kvt_proto_hdr_t *h, const uint8_t *body,
                                kvt_client_cb cb, void *arg)
{
    if (h->req_id == 0 && (h->flags & KVT_PROTO_F_ERROR) != 0) {
        kvt_status_t st = cl_error_answer(c, h, body);
        return st == KVT_OK || (int)st > 0 ? KVT_ERR_PROTO : st;
    }
    size_t i = 0;
    while (i < c->nfl && (c->fl[i].id != h->req_id || c->fl[i].st != KVT_OK))
        i++;
    if (i == c->nfl)
        return KVT_OK; /* stale */
    if (h->op != KVT_PROTO_OP_QUERY)
        return cl_fail(c, KVT_ERR_PROTO, "answer to QUERY has opcode %s", kvt_proto_op_name(h->op));
    kvt_status_t st;
    if ((h->flags & KVT_PROTO_F_ERROR) != 0) {
        st = cl_error_answer(c, h, body);
        if (st == KVT_ERR_PROTO)
            return st;
    } else {
        st = cl_decode_result(c, body, h->body_len, &c->cbres, &c->cbcap);
        if (st == KVT_ERR_PROTO)
            return st;
    }
    cl_fl_remove(c, i);
    if (cb != NULL)
        cb(arg, h->req_id, st, st == KVT_OK ? &c->cbres : NULL);
    return KVT_OK;
}

kvt_status_t kvt_client_progress(kvt_client_t *c, kvt_client_cb cb, void *arg)
{
    if (c == NULL)
        return KVT_ERR_INVAL;
    cl_report_failed(c, cb, arg);
    if (c->fd < 0)
        return KVT_OK;
    kvt_status_t st = KVT_OK;
    if (c->out.len > 0)
        st = cl_flush(c, 0, false);
    while (st == KVT_OK && c->fd >= 0) {
        bool got;
        kvt_proto_hdr_t h;
        const uint8_t *body;
        st = cl_next_frame(c, &got, &h, &body);
        if (st != KVT_OK)
            break;
        if (got) {
            /* The callback may submit (appending to out) but never reads, so body stays valid. */
            st = cl_dispatch(c, &h, body, cb, arg);
            continue;
        }
        size_t before = c->in_len - c->in_off;
        st = cl_read(c, 0, false);
        if (st == KVT_OK && c->in_len - c->in_off == before)
            return KVT_OK; /* nothing more has arrived */
    }
    if (st == KVT_OK)
        return KVT_OK;
    cl_break(c, st);
    cl_report_failed(c, cb, arg);
    return st;
}

/* ---- fan-out -------------------------------------------------------------------------------- */

typedef struct cl_fan_slot {
    kvt_client_t *c;
    uint64_t id;
    kvt_status_t st; /* KVT_OK once answered; 1 while waiting */
    kvt_client_result_t res;
} cl_fan_slot_t;

static void cl_fan_cb(void *arg, uint64_t req_id, kvt_status_t st, const kvt_client_result_t *res)
{
    cl_fan_slot_t *s = arg;
    if (req_id != s->id || s->st != (kvt_status_t)1)
        return;
    if (st == KVT_OK) {
        s->res = *res;
        s->res.pods = NULL;
        if (res->npods > 0) {
            s->res.pods = malloc(res->npods * sizeof(*res->pods));
            if (s->res.pods == NULL) {
                s->st = cl_fail(s->c, KVT_ERR_NO_MEM, "out of memory for %zu pods", res->npods);
                return;
            }
            memcpy(s->res.pods, res->pods, res->npods * sizeof(*res->pods));
        }
    }
    s->st = st;
}

static int cl_pod_cmp_name(const void *a, const void *b)
{
    const kvt_client_pod_t *x = a, *y = b;
    int r = strcmp(x->pod, y->pod);
    if (r != 0)
        return r;
    return x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
}

/* Better first: higher score, more matched, then name and rank for a stable order. */
static int cl_pod_cmp_rank(const void *a, const void *b)
{
    const kvt_client_pod_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->matched != y->matched)
        return x->matched > y->matched ? -1 : 1;
    return cl_pod_cmp_name(a, b);
}

static bool cl_pod_better(const kvt_client_pod_t *x, const kvt_client_pod_t *y)
{
    return x->score > y->score || (x->score == y->score && x->matched > y->matched);
}

static kvt_status_t cl_fanout(kvt_client_t *const *cs, size_t n, const cl_q_t *q, int timeout_ms,
                              kvt_client_result_t *res_p)
{
    const kvt_status_t waiting = (kvt_status_t)1;
    if (cs == NULL || n == 0 || res_p == NULL)
        return KVT_ERR_INVAL;
    cl_fan_slot_t *slots = calloc(n, sizeof(*slots));
    struct pollfd *pfd = calloc(n, sizeof(*pfd));
    if (slots == NULL || pfd == NULL) {
        free(slots);
        free(pfd);
        return KVT_ERR_NO_MEM;
    }
    if (timeout_ms <= 0)
        for (size_t i = 0; i < n; i++)
            if (cs[i] != NULL && cs[i]->io_ms > timeout_ms)
                timeout_ms = cs[i]->io_ms;
    uint64_t deadline = kvt_clock_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);

    for (size_t i = 0; i < n; i++) {
        slots[i].c = cs[i];
        if (cs[i] == NULL) {
            slots[i].st = KVT_ERR_INVAL;
        } else if (cs[i]->nfl > 0) {
            slots[i].st =
                cl_fail(cs[i], KVT_ERR_INVAL, "fan-out: %zu queries already in flight", cs[i]->nfl);
        } else {
            slots[i].st = cl_submit(cs[i], q, deadline, &slots[i].id);
            if (slots[i].st == KVT_OK)
                slots[i].st = waiting;
        }
    }
    for (;;) {
        nfds_t np = 0;
        for (size_t i = 0; i < n; i++) {
            if (slots[i].st != waiting)
                continue;
            kvt_client_t *c = slots[i].c;
            /* An answer may already sit in the buffer; progress() picks it up. */
            pfd[np].fd = c->fd;
            pfd[np].events = (short)(POLLIN | (kvt_client_want_write(c) ? POLLOUT : 0));
            pfd[np].revents = 0;
            np++;
        }
        if (np == 0)
            break;
        int left = cl_left(deadline);
        if (left == 0)
            break;
        int r = poll(pfd, np, left);
        if (r < 0 && errno != EINTR)
            break;
        nfds_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (slots[i].st != waiting)
                continue;
            if (pfd[k++].revents == 0)
                continue;
            kvt_status_t st = kvt_client_progress(slots[i].c, cl_fan_cb, &slots[i]);
            if (st != KVT_OK && slots[i].st == waiting)
                slots[i].st = st;
        }
    }

    /* Merge; close connections that still wait (their answers would be stale). */
    size_t total = 0, answered = 0, first = n;
    kvt_status_t first_err = KVT_OK;
    for (size_t i = 0; i < n; i++) {
        if (slots[i].st == waiting) {
            kvt_client_t *c = slots[i].c;
            cl_fail(c, KVT_ERR_TIMEOUT, "fan-out: no answer within %d ms", timeout_ms);
            c->nfl = 0;
            cl_close(c);
            slots[i].st = KVT_ERR_TIMEOUT;
        }
        if (slots[i].st == KVT_OK) {
            answered++;
            total += slots[i].res.npods;
            if (first == n)
                first = i;
        } else if (first_err == KVT_OK) {
            first_err = slots[i].st;
        }
    }
    kvt_status_t st = KVT_OK;
    kvt_client_pod_t *all = NULL;
    if (answered == 0) {
        st = first_err != KVT_OK ? first_err : KVT_ERR_PEER;
        goto out;
    }
    if (total > 0) {
        all = malloc(total * sizeof(*all));
        if (all == NULL) {
            st = KVT_ERR_NO_MEM;
            goto out;
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (slots[i].st == KVT_OK && slots[i].res.npods > 0) {
            memcpy(all + m, slots[i].res.pods, slots[i].res.npods * sizeof(*all));
            m += slots[i].res.npods;
        }
    size_t u = 0;
    if (m > 0) {
        qsort(all, m, sizeof(*all), cl_pod_cmp_name);
        for (size_t i = 0; i < m; i++) {
            if (u > 0 && cl_pod_cmp_name(&all[u - 1], &all[i]) == 0) {
                if (cl_pod_better(&all[i], &all[u - 1]))
                    all[u - 1] = all[i];
                continue;
            }
            all[u++] = all[i];
        }
        qsort(all, u, sizeof(*all), cl_pod_cmp_rank);
    }
    res_p->block_size = slots[first].res.block_size;
    res_p->num_blocks = slots[first].res.num_blocks;
    res_p->npods = u;
    res_p->pods = u > 0 ? all : NULL;
    if (u == 0)
        free(all);
    res_p->answered = answered;
    res_p->asked = n;
out:
    for (size_t i = 0; i < n; i++)
        free(slots[i].res.pods);
    free(slots);
    free(pfd);
    return st;
}

kvt_status_t kvt_client_fanout_query(kvt_client_t *const *cs, size_t n, const char *model,
                                     const char *lora, const uint32_t *tokens, size_t ntokens,
                                     const char *const *pods, size_t npods, int timeout_ms,
                                     kvt_client_result_t *res_p)
{
    return kvt_client_fanout_query_salted(cs, n, model, lora, NULL, tokens, ntokens, pods, npods,
                                          timeout_ms, res_p);
}

kvt_status_t kvt_client_fanout_query_salted(kvt_client_t *const *cs, size_t n, const char *model,
                                            const char *lora, const char *cache_salt,
                                            const uint32_t *tokens, size_t ntokens,
                                            const char *const *pods, size_t npods, int timeout_ms,
                                            kvt_client_result_t *res_p)
{
    cl_q_t q = {model, lora, cache_salt, KVT_PROTO_Q_TOKENS, tokens, ntokens, pods, npods};
    return cl_fanout(cs, n, &q, timeout_ms, res_p);
}

kvt_status_t kvt_client_fanout_query_keys(kvt_client_t *const *cs, size_t n, const char *model,
                                          const char *lora, const uint64_t *keys, size_t nkeys,
                                          const char *const *pods, size_t npods, int timeout_ms,
                                          kvt_client_result_t *res_p)
{
    cl_q_t q = {model, lora, NULL, KVT_PROTO_Q_KEYS, keys, nkeys, pods, npods};
    return cl_fanout(cs, n, &q, timeout_ms, res_p);
}
