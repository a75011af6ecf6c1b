/*
 * router-plugin/client.c: libkvtier, the client of kvtierd's binary RPC
 * (include/kvtier/client.h, docs/client.md): errors, options and address,
 * the connection, buffered I/O, create and destroy, results. Blocking calls
 * are in client_call.c, the tier calls in client_tier.c, submitted queries in
 * client_async.c, fan-out in client_fanout.c; client_int.h is what they share.
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
#include "common/errtext.h"
#include "common/fdpass.h"
#include "common/hostport.h"
#include "kvindex/hash.h"
#include "router-plugin/client_int.h"

/* ---- errors --------------------------------------------------------------------------------- */

kvt_status_t kvt_cl_fail(kvt_client_t *c, kvt_status_t st, const char *fmt, ...)
{
    char msg[CL_ERR_SIZE];
    va_list ap;

    va_start(ap, fmt);
    kvt_verrf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvt_errf(c->err, sizeof(c->err), "%s: %s", c->addr, msg); /* a long message is cut */
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

size_t kvt_client_hash_tokens_lora(const uint32_t *tokens, size_t n, uint32_t block_size,
                                   const char *cache_salt, const char *lora,
                                   kvt_client_lora_keys_t mode, uint64_t *keys_out)
{
    if (mode != KVT_CLIENT_LORA_KEYS_NAMESPACE && mode != KVT_CLIENT_LORA_KEYS_DYNAMO)
        return 0;
    size_t llen = lora != NULL && mode == KVT_CLIENT_LORA_KEYS_DYNAMO ? strlen(lora) : 0;
    if (llen == 0 || block_size == 0 || n < block_size)
        return kvt_client_hash_tokens_salted(tokens, n, block_size, cache_salt, keys_out);
    kvt_hash_seeds_t seeds;
    kvt_hash_seeds_lora(cache_salt, cache_salt != NULL ? strlen(cache_salt) : 0, lora, llen,
                        &seeds);
    return kvt_hash_seq_seeds(tokens, n, block_size, &seeds, NULL, NULL, keys_out);
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

/* Splits @a into the client's host/port or path. Returns KVT_OK, or KVT_ERR_INVAL with the
 * reason in @err (@errlen bytes). */
static kvt_status_t cl_parse_addr(kvt_client_t *c, const char *a, char *err, size_t errlen)
{
    size_t alen = strlen(a);

    if (alen >= sizeof(c->addr)) {
        kvt_errf(err, errlen, "address too long");
        return KVT_ERR_INVAL;
    }
    memcpy(c->addr, a, alen + 1);
    if (strncmp(a, "unix:", 5) == 0) {
        size_t plen = alen - 5;
        if (plen == 0 || plen >= sizeof(c->path)) {
            kvt_errf(err, errlen, "%s",
                     plen == 0 ? "empty unix socket path" : "unix socket path too long");
            return KVT_ERR_INVAL;
        }
        memcpy(c->path, a + 5, plen + 1);
        c->is_unix = true;
        return KVT_OK;
    }
    if (strchr(a, ':') == NULL) {
        kvt_errf(err, errlen, "expected host:port or unix:/path");
        return KVT_ERR_INVAL;
    }
    uint16_t port;
    kvt_status_t st = kvt_hostport_split(a, c->host, sizeof(c->host), &port, false, err, errlen);
    if (st != KVT_OK)
        return st;
    snprintf(c->port, sizeof(c->port), "%u", port);
    c->is_unix = false;
    return KVT_OK;
}

/* ---- connection ----------------------------------------------------------------------------- */

/* Forgets the connection and every buffered byte (in-flight entries are the caller's). */
void kvt_cl_close(kvt_client_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    if (c->pass_fd >= 0)
        close(c->pass_fd); /* came with an ATTACH answer nobody took */
    c->pass_fd = -1;
    kvt_proto_wr_reset(&c->out);
    c->in_off = c->in_len = 0;
}

/* Milliseconds left until @deadline (a kvt_clock_ms() value), at least 0. */
int kvt_cl_left(uint64_t deadline)
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
        int left = kvt_cl_left(deadline);
        if (left == 0)
            return kvt_cl_fail(c, KVT_ERR_TIMEOUT, "timed out");
        int r = poll(&p, 1, left);
        if (r > 0)
            return KVT_OK; /* errors and hangups surface in the next send/recv */
        if (r == 0)
            return kvt_cl_fail(c, KVT_ERR_TIMEOUT, "timed out");
        if (errno != EINTR)
            return kvt_cl_fail(c, KVT_ERR_IO, "poll: %s", strerror(errno));
    }
}

/* Non-blocking connect of a fresh socket for @sa, waiting up to @deadline. Returns the fd or -1
 * with the message in c->err. */
static int cl_connect_one(kvt_client_t *c, int family, const struct sockaddr *sa, socklen_t salen,
                          uint64_t deadline, kvt_status_t *st_p)
{
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *st_p = kvt_cl_fail(c, KVT_ERR_IO, "socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, sa, salen) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            *st_p = kvt_cl_fail(c, KVT_ERR_IO, "connect: %s", strerror(errno));
            goto err_close;
        }
        kvt_status_t st = cl_wait(c, fd, POLLOUT, deadline);
        if (st != KVT_OK) {
            *st_p = st == KVT_ERR_TIMEOUT ? kvt_cl_fail(c, st, "connect: timed out") : st;
            goto err_close;
        }
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
            soerr = errno;
        if (soerr != 0) {
            *st_p = kvt_cl_fail(c, KVT_ERR_IO, "connect: %s", strerror(soerr));
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

/* Sends HELLO on the fresh connection and reads its answer, up to @deadline. */
static kvt_status_t cl_hello(kvt_client_t *c, uint64_t deadline)
{
    uint64_t id = c->next_id++;
    kvt_proto_hello_req_t req = {KVT_PROTO_VERSION, {c->token, c->token_len}};
    kvt_status_t st = kvt_proto_hello_req_encode(&c->out, id, &req);
    if (st != KVT_OK)
        return kvt_cl_fail(c, st, "cannot encode hello");
    st = kvt_cl_flush(c, deadline, true);
    if (st != KVT_OK)
        return st;
    for (;;) {
        bool got;
        kvt_proto_hdr_t h;
        const uint8_t *body;
        st = kvt_cl_next_frame(c, &got, &h, &body);
        if (st != KVT_OK)
            return st;
        if (!got) {
            st = kvt_cl_read(c, deadline, true);
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
                kvt_proto_err_decode(body, h.body_len, &e, NULL, 0) == KVT_OK && e.http == 401) {
                c->max_body = KVT_PROTO_MAX_BODY_DEFAULT;
                return KVT_OK;
            }
            st = kvt_cl_error_answer(c, &h, body);
            return kvt_cl_fail(c, st, "hello refused: %s", c->err + strlen(c->addr) + 2);
        }
        if (h.op != KVT_PROTO_OP_HELLO)
            return kvt_cl_fail(c, KVT_ERR_PROTO, "answer to hello has opcode %s",
                               kvt_proto_op_name(h.op));
        kvt_proto_hello_ans_t ans;
        char why[128];
        if (kvt_proto_hello_ans_decode(body, h.body_len, &ans, why, sizeof(why)) != KVT_OK)
            return kvt_cl_fail(c, KVT_ERR_PROTO, "%s", why);
        if (ans.server_version != KVT_PROTO_VERSION)
            return kvt_cl_fail(c, KVT_ERR_PROTO, "server speaks protocol version %u, not %u",
                               ans.server_version, KVT_PROTO_VERSION);
        c->max_body = ans.max_body == 0 || ans.max_body > KVT_PROTO_MAX_BODY_LIMIT
                          ? KVT_PROTO_MAX_BODY_LIMIT
                          : ans.max_body;
        return KVT_OK;
    }
}

/* Connects and says HELLO, everything within the connect timeout (and @limit, when not 0). */
kvt_status_t kvt_cl_connect(kvt_client_t *c, uint64_t limit)
{
    uint64_t deadline = kvt_clock_ms() + (uint64_t)c->connect_ms;
    kvt_status_t st = KVT_ERR_IO;

    if (limit != 0 && limit < deadline)
        deadline = limit;
    kvt_cl_close(c);
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
            return kvt_cl_fail(c, KVT_ERR_IO, "cannot resolve '%s': %s", c->host,
                               gai_strerror(gai));
        for (struct addrinfo *ai = res; ai != NULL && c->fd < 0; ai = ai->ai_next)
            c->fd = cl_connect_one(c, ai->ai_family, ai->ai_addr, ai->ai_addrlen, deadline, &st);
        freeaddrinfo(res);
    }
    if (c->fd < 0)
        return st;
    st = cl_hello(c, deadline);
    if (st != KVT_OK)
        kvt_cl_close(c);
    else
        c->nconnects++;
    return st;
}

/*
 * False when an idle connection is known to be dead (the server closed it or
 * it failed), so that a call does not learn it the hard way. Only meaningful
 * with nothing in flight: then any byte waiting is stale.
 */
bool kvt_cl_alive(kvt_client_t *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP, .revents = 0};
    if (poll(&p, 1, 0) <= 0)
        return true;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
}

/* ---- buffered I/O --------------------------------------------------------------------------- */

/* Writes c->out; with @block waits up to @deadline, else returns once the socket is full. */
kvt_status_t kvt_cl_flush(kvt_client_t *c, uint64_t deadline, bool block)
{
    if (c->fd < 0)
        return kvt_cl_fail(c, KVT_ERR_CLOSED, "not connected");
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
            st = kvt_cl_fail(c, KVT_ERR_CLOSED, "connection closed by the server");
        else
            st = kvt_cl_fail(c, KVT_ERR_IO, "send: %s", strerror(errno));
        break;
    }
    kvt_proto_wr_consume(&c->out, sent);
    return st;
}

/* recv() for an ATTACH in flight: the arena's descriptor comes beside the answer's first bytes
 * (SCM_RIGHTS), and a plain recv() would drop it; it is kept in c->pass_fd. */
static ssize_t cl_recv_fd(kvt_client_t *c, uint8_t *buf, size_t len)
{
    return kvt_fd_recv(c->fd, buf, len, MSG_DONTWAIT, &c->pass_fd);
}

/*
 * Reads what the socket has into c->in; with @block waits for at least one
 * byte until @deadline. Without @block, KVT_OK may mean nothing arrived.
 */
kvt_status_t kvt_cl_read(kvt_client_t *c, uint64_t deadline, bool block)
{
    if (c->fd < 0)
        return kvt_cl_fail(c, KVT_ERR_CLOSED, "not connected");
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
            return kvt_cl_fail(c, KVT_ERR_NO_MEM, "out of memory for a %zu-byte answer", cap);
        c->in = in;
        c->in_cap = cap;
    }
    for (;;) {
        ssize_t n = c->want_fd
                        ? cl_recv_fd(c, c->in + c->in_len, c->in_cap - c->in_len)
                        : recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
        if (n > 0) {
            c->in_len += (size_t)n;
            return KVT_OK;
        }
        if (n == 0)
            return kvt_cl_fail(c, KVT_ERR_CLOSED, "connection closed by the server");
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
            return kvt_cl_fail(c, KVT_ERR_CLOSED, "connection reset by the server");
        return kvt_cl_fail(c, KVT_ERR_IO, "recv: %s", strerror(errno));
    }
}

/*
 * Takes the next whole answer frame out of c->in: *@got_p says whether there
 * was one; *@body_p points into c->in and stays valid until the next kvt_cl_read.
 * A header that breaks the protocol is KVT_ERR_PROTO (the stream is lost).
 */
kvt_status_t kvt_cl_next_frame(kvt_client_t *c, bool *got_p, kvt_proto_hdr_t *h_p,
                               const uint8_t **body_p)
{
    size_t avail = c->in_len - c->in_off;
    *got_p = false;
    if (avail < KVT_PROTO_HDR_SIZE)
        return KVT_OK;
    const uint8_t *p = c->in + c->in_off;
    char why[128];
    kvt_proto_hdr_t h;
    kvt_status_t st = kvt_proto_hdr_check(p, KVT_PROTO_MAX_BODY_LIMIT, &h, why, sizeof(why));
    if (st != KVT_OK)
        return kvt_cl_fail(c, KVT_ERR_PROTO, "bad answer %s", why);
    if ((h.flags & KVT_PROTO_F_RESPONSE) == 0)
        return kvt_cl_fail(c, KVT_ERR_PROTO, "server sent a request frame");
    if (avail - KVT_PROTO_HDR_SIZE < h.body_len)
        return KVT_OK;
    *h_p = h;
    *body_p = p + KVT_PROTO_HDR_SIZE;
    c->in_off += KVT_PROTO_HDR_SIZE + h.body_len;
    *got_p = true;
    return KVT_OK;
}

/* Turns an error answer into its status and message. A malformed one is a protocol error. */
kvt_status_t kvt_cl_error_answer(kvt_client_t *c, const kvt_proto_hdr_t *h, const uint8_t *body)
{
    kvt_proto_err_t e;
    char why[128];
    if (kvt_proto_err_decode(body, h->body_len, &e, why, sizeof(why)) != KVT_OK)
        return kvt_cl_fail(c, KVT_ERR_PROTO, "%s", why);
    return kvt_cl_fail(c, (kvt_status_t)e.status, "server: %.*s (%u)", (int)e.msg.len,
                       e.msg.len > 0 ? e.msg.p : "", e.http);
}

/* ---- create / destroy ----------------------------------------------------------------------- */

kvt_status_t kvt_client_create_msg(const kvt_client_opts_t *o, kvt_client_t **c_p, char *err,
                                   size_t errlen)
{
    kvt_client_opts_t def;
    kvt_status_t st;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (c_p == NULL) {
        kvt_errf(err, errlen, "kvt_client_create: NULL c_p");
        return KVT_ERR_INVAL;
    }
    if (o == NULL) {
        kvt_client_opts_default(&def);
        o = &def;
    }
    kvt_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    c->fd = c->pass_fd = -1;
    c->next_id = 1; /* 0 is the id of answers to untrustworthy headers */
    c->max_body = KVT_PROTO_MAX_BODY_DEFAULT;
    c->connect_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : CL_DEFAULT_TIMEOUT_MS;
    c->io_ms = o->io_timeout_ms > 0 ? o->io_timeout_ms : CL_DEFAULT_TIMEOUT_MS;
    kvt_proto_wr_init(&c->out);

    const char *addr = o->address != NULL ? o->address : KVT_CLIENT_DEFAULT_ADDR;
    char why[128];
    if (cl_parse_addr(c, addr, why, sizeof(why)) != KVT_OK) {
        snprintf(c->addr, sizeof(c->addr), "%.200s", addr);
        st = kvt_cl_fail(c, KVT_ERR_INVAL, "bad address: %s", why);
        goto err_free;
    }
    if (o->auth_token != NULL) {
        size_t tlen = strlen(o->auth_token);
        if (tlen > KVT_PROTO_MAX_STR) {
            st =
                kvt_cl_fail(c, KVT_ERR_INVAL, "auth token longer than %u bytes", KVT_PROTO_MAX_STR);
            goto err_free;
        }
        memcpy(c->token, o->auth_token, tlen);
        c->token_len = (uint16_t)tlen;
    }
    if (!o->lazy_connect) {
        st = kvt_cl_connect(c, 0);
        if (st != KVT_OK)
            goto err_free;
    }
    *c_p = c;
    return KVT_OK;

err_free:
    kvt_errf(err, errlen, "%s", c->err);
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
    kvt_cl_close(c);
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

uint64_t kvt_client_connects(const kvt_client_t *c)
{
    return c->nconnects;
}

bool kvt_client_connected(kvt_client_t *c)
{
    return c->fd >= 0 && c->nfl == 0 && kvt_cl_alive(c);
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
kvt_status_t kvt_cl_decode_result(kvt_client_t *c, const uint8_t *body, uint32_t len,
                                  kvt_client_result_t *r, size_t *cap)
{
    kvt_proto_query_ans_t a;
    char why[128];

    if (kvt_proto_query_ans_decode(body, len, &a, why, sizeof(why)) != KVT_OK)
        return kvt_cl_fail(c, KVT_ERR_PROTO, "%s", why);
    if (a.npods > *cap) {
        kvt_client_pod_t *pods = realloc(r->pods, (size_t)a.npods * sizeof(*pods));
        if (pods == NULL)
            return kvt_cl_fail(c, KVT_ERR_NO_MEM, "out of memory for %u pods", a.npods);
        r->pods = pods;
        *cap = a.npods;
    }
    kvt_proto_rd_t rd;
    kvt_proto_rd_init(&rd, a.pods, a.pods_len);
    for (uint32_t i = 0; i < a.npods; i++) {
        kvt_proto_pod_ans_t pa;
        if (!kvt_proto_query_ans_next(&rd, &pa))
            return kvt_cl_fail(c, KVT_ERR_INTERNAL, "validated answer did not read back");
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
