/*
 * server/xfer_peer.c: a TRANSFER's side of the conversation with its peer
 * (xfer_peer.h), on the xfer thread: blocking RPC calls with a timeout on
 * each read and write, the UCX endpoints cached by address and incarnation,
 * and one batch of UCX I/O driven to its end.
 */
#define KVT_LOG_COMPONENT "xfer"

#include "server/xfer_peer.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/fdpass.h"
#include "common/hostport.h"
#include "common/log.h"

/* ---- the RPC client ------------------------------------------------------------------- */

/* Sends (@wr) or reads all @n bytes: KVT_OK, KVT_ERR_TIMEOUT (the socket's timeout ran out)
 * or KVT_ERR_PEER. */
static kvt_status_t io_all(srv_xcli_t *c, void *buf, size_t n, bool wr)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = wr ? send(c->fd, p, n, MSG_NOSIGNAL) : kvt_fd_recv(c->fd, p, n, 0, &c->pass_fd);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return KVT_ERR_TIMEOUT;
        if (r <= 0)
            return KVT_ERR_PEER;
        p += r;
        n -= (size_t)r;
    }
    return KVT_OK;
}

static kvt_status_t cli_connect(srv_xcli_t *c, const char *peer, uint32_t timeout_ms, char *err,
                                size_t errlen)
{
    char host[256], port[8];
    uint16_t p;
    if (kvt_hostport_split(peer, host, sizeof(host), &p, false, err, errlen) != KVT_OK)
        return KVT_ERR_INVAL;
    snprintf(port, sizeof(port), "%u", p);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0) {
        kvt_errf(err, errlen, "peer %s: %s", peer, gai_strerror(gai));
        return KVT_ERR_PEER;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    for (struct addrinfo *a = ai; a != NULL && c->fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* connect() honours it */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            c->fd = fd;
        else
            close(fd);
    }
    freeaddrinfo(ai);
    if (c->fd < 0) {
        kvt_errf(err, errlen, "peer %s: cannot connect: %s", peer, strerror(errno));
        return KVT_ERR_PEER;
    }
    return KVT_OK;
}

static kvt_status_t cli_connect_unix(srv_xcli_t *c, const char *path, uint32_t timeout_ms,
                                     char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (path[0] == '\0' || strlen(path) >= sizeof(sa.sun_path)) {
        kvt_errf(err, errlen, "peer socket %s: empty or too long", path);
        return KVT_ERR_INVAL;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        kvt_errf(err, errlen, "socket: %s", strerror(errno));
        return KVT_ERR_PEER;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        kvt_errf(err, errlen, "peer socket %s: cannot connect: %s", path, strerror(errno));
        close(fd);
        return KVT_ERR_PEER;
    }
    c->fd = fd;
    return KVT_OK;
}

void srv_xcli_init(srv_xfer_t *xf, srv_xcli_t *c, uint32_t timeout_ms)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->pass_fd = -1;
    c->xf = xf;
    c->timeout_ms = timeout_ms;
    kvt_proto_wr_init(&c->wr);
}

/* HELLO with this kvtierd's --auth-token on a connected @c. */
static kvt_status_t cli_hello(srv_xcli_t *c, char *err, size_t errlen)
{
    srv_xfer_t *xf = c->xf;
    const char *tok = xf->srv->auth_token != NULL ? xf->srv->auth_token : "";
    kvt_proto_hello_req_t hr = {KVT_PROTO_VERSION, {tok, (uint16_t)strlen(tok)}};
    uint64_t id = ++c->next_id;
    kvt_proto_hello_req_encode(&c->wr, id, &hr);
    return srv_xcli_call(c, KVT_PROTO_OP_HELLO, id, err, errlen);
}

kvt_status_t srv_xcli_open(srv_xfer_t *xf, srv_xcli_t *c, const char *peer, uint32_t timeout_ms,
                           char *err, size_t errlen)
{
    srv_xcli_init(xf, c, timeout_ms);
    kvt_status_t st = cli_connect(c, peer, timeout_ms, err, errlen);
    return st != KVT_OK ? st : cli_hello(c, err, errlen);
}

kvt_status_t srv_xcli_open_unix(srv_xfer_t *xf, srv_xcli_t *c, const char *path,
                                uint32_t timeout_ms, char *err, size_t errlen)
{
    srv_xcli_init(xf, c, timeout_ms);
    kvt_status_t st = cli_connect_unix(c, path, timeout_ms, err, errlen);
    return st != KVT_OK ? st : cli_hello(c, err, errlen);
}

void srv_xcli_close(srv_xcli_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    if (c->pass_fd >= 0)
        close(c->pass_fd);
    c->pass_fd = -1;
    free(c->body);
    c->body = NULL;
    kvt_proto_wr_cleanup(&c->wr);
}

/*
 * Waits until the peer's answer can be read, progressing this sidecar's UCX
 * worker meanwhile: the xfer thread is the worker's only driver, and it is
 * not left idle while a peer may be reading from this sidecar. KVT_OK when
 * readable, KVT_ERR_TIMEOUT after c->timeout_ms.
 */
static kvt_status_t cli_wait(srv_xcli_t *c)
{
    kvt_xfer_t *x = c->xf != NULL ? c->xf->x : NULL;
    uint64_t deadline = kvt_clock_ms() + (c->timeout_ms ? c->timeout_ms : 30000u);
    for (;;) {
        bool armed = false;
        if (x != NULL) {
            while (kvt_xfer_progress(x) > 0) {
            }
            armed = kvt_xfer_arm(x);
        }
        uint64_t now = kvt_clock_ms();
        if (now >= deadline)
            return KVT_ERR_TIMEOUT;
        int efd = armed ? kvt_xfer_efd(x) : -1;
        /* not armed (events pending): look again soon */
        int ms = x != NULL && !armed ? 1 : (int)(deadline - now);
        struct pollfd pf[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = efd, .events = POLLIN}};
        int k = poll(pf, efd >= 0 ? 2 : 1, ms);
        if (k < 0 && errno != EINTR)
            return KVT_ERR_PEER;
        if (k > 0 && pf[0].revents != 0)
            return KVT_OK;
    }
}

/* After a failed call the stream is out of step: later calls fail at once. */
static void cli_drop(srv_xcli_t *c)
{
    close(c->fd);
    c->fd = -1;
}

kvt_status_t srv_xcli_call(srv_xcli_t *c, uint8_t op, uint64_t id, char *err, size_t errlen)
{
    free(c->body);
    c->body = NULL;
    c->len = 0;
    if (c->fd < 0) {
        kvt_proto_wr_reset(&c->wr);
        kvt_errf(err, errlen, "peer: connection closed before %s", kvt_proto_op_name(op));
        return KVT_ERR_PEER;
    }
    kvt_status_t st =
        c->wr.oom || c->wr.bad ? KVT_ERR_NO_MEM : io_all(c, c->wr.buf, c->wr.len, true);
    kvt_proto_wr_reset(&c->wr);
    uint8_t hb[KVT_PROTO_HDR_SIZE];
    kvt_proto_hdr_t h;
    if (st == KVT_OK)
        st = cli_wait(c);
    if (st == KVT_OK)
        st = io_all(c, hb, sizeof(hb), false);
    if (st == KVT_OK &&
        (kvt_proto_hdr_decode(hb, 64u << 20, &h) != KVT_OK || h.op != op || h.req_id != id))
        st = KVT_ERR_PEER;
    if (st != KVT_OK) {
        kvt_errf(err, errlen, "peer: %s to %s",
                 st == KVT_ERR_TIMEOUT ? "no answer in time" : "no answer", kvt_proto_op_name(op));
        cli_drop(c);
        return st;
    }
    c->body = malloc(h.body_len > 0 ? h.body_len : 1);
    if (c->body == NULL || (st = io_all(c, c->body, h.body_len, false)) != KVT_OK) {
        kvt_errf(err, errlen, "peer: %s answer cut", kvt_proto_op_name(op));
        cli_drop(c);
        return c->body == NULL ? KVT_ERR_NO_MEM : st;
    }
    c->len = h.body_len;
    if (h.flags & KVT_PROTO_F_ERROR) {
        if (kvt_proto_err_decode(c->body, c->len, &c->e, err, errlen) != KVT_OK)
            return KVT_ERR_PEER;
        kvt_errf(err, errlen, "peer: %s: %.*s", kvt_proto_op_name(op), (int)c->e.msg.len,
                 c->e.msg.p);
        return c->e.status < 0 ? (kvt_status_t)c->e.status : KVT_ERR_PEER;
    }
    return KVT_OK;
}

/* ---- peers: one UCX endpoint per peer address, from its XFER_HELLO ------------------- */

typedef struct peers {
    srv_xpeer_t v[SRV_XPEER_MAX];
    uint32_t n;
} peers_t;

static peers_t *peers_of(srv_xfer_t *xf)
{
    if (xf->peers == NULL)
        xf->peers = calloc(1, sizeof(peers_t));
    return xf->peers;
}

void srv_xpeer_drop(srv_xfer_t *xf, srv_xpeer_t *p)
{
    peers_t *ps = xf->peers;
    kvt_xfer_peer_close(p->p);
    if (p->map != NULL)
        munmap(p->map, p->map_len);
    if (p->watch_fd >= 0)
        close(p->watch_fd);
    *p = ps->v[--ps->n];
}

uint32_t srv_xpeers_watch(srv_xfer_t *xf, struct pollfd *pf, uint32_t max)
{
    peers_t *ps = xf->peers;
    uint32_t k = 0;
    for (uint32_t i = 0; ps != NULL && i < ps->n && k < max; i++)
        if (ps->v[i].watch_fd >= 0)
            pf[k++] = (struct pollfd){.fd = ps->v[i].watch_fd, .events = POLLIN};
    return k;
}

void srv_xpeers_reap(srv_xfer_t *xf)
{
    peers_t *ps = xf->peers;
    for (uint32_t i = 0; ps != NULL && i < ps->n;) {
        struct pollfd pf = {.fd = ps->v[i].watch_fd, .events = POLLIN};
        if (pf.fd >= 0 && poll(&pf, 1, 0) > 0) {
            /* nothing is asked on it: any input or hang-up means the peer closed it */
            kvt_log_info("peer %s (incarnation %016llx): its socket closed, its arena unmapped",
                         ps->v[i].addr, (unsigned long long)ps->v[i].inc);
            srv_xpeer_drop(xf, &ps->v[i]); /* moves the last one to i */
            continue;
        }
        i++;
    }
}

/*
 * Maps the arena of the peer that answered @h on @c, when it runs on this
 * host: it gave this host's boot id and a Unix socket; over that socket
 * ATTACH hands its arena's descriptor, and an XFER_HELLO naming @h's
 * incarnation proves the socket leads to the same kvtierd (a socket path may
 * name another one in another mount namespace). Only a memfd sealed against
 * shrinking is mapped, so no copy from it can fault (SIGBUS) whatever its
 * owner does. On success p->map, p->map_len, p->watch_fd and the peer's
 * region at *@region_p; otherwise false and nothing held (the caller uses
 * UCX), with the reason logged at debug.
 */
static bool map_arena(srv_xfer_t *xf, uint32_t timeout_ms, const kvt_proto_xfer_hello_ans_t *h,
                      srv_xpeer_t *p, void **region_p)
{
    size_t hl = strlen(xf->host);
    if (!xf->srv->cfg.shm || hl == 0 || h->host.len != hl || memcmp(h->host.p, xf->host, hl) != 0 ||
        h->unix_path.len == 0)
        return false;
    char path[256], why[320] = "";
    memcpy(path, h->unix_path.p, h->unix_path.len);
    path[h->unix_path.len] = '\0';
    srv_xcli_t u;
    kvt_proto_attach_ans_t a;
    kvt_proto_xfer_hello_ans_t h2;
    struct stat sb;
    void *m = MAP_FAILED;
    int fd = -1;
    uint64_t id;
    if (srv_xcli_open_unix(xf, &u, path, timeout_ms, why, sizeof(why)) != KVT_OK)
        goto out;
    id = ++u.next_id;
    if (kvt_proto_raw_encode(&u.wr, KVT_PROTO_OP_ATTACH, 0, id, NULL, 0) != KVT_OK ||
        srv_xcli_call(&u, KVT_PROTO_OP_ATTACH, id, why, sizeof(why)) != KVT_OK ||
        kvt_proto_attach_ans_decode(u.body, u.len, &a, why, sizeof(why)) != KVT_OK)
        goto out;
    fd = u.pass_fd;
    u.pass_fd = -1;
    if (fd < 0 || a.slot_bytes != h->slot_bytes || a.nslots != h->nslots) {
        kvt_errf(why, sizeof(why), "ATTACH: %s", fd < 0 ? "no descriptor" : "another geometry");
        goto out;
    }
    id = ++u.next_id;
    kvt_proto_xfer_hello_req_encode(&u.wr, id, h->incarnation);
    if (srv_xcli_call(&u, KVT_PROTO_OP_XFER_HELLO, id, why, sizeof(why)) != KVT_OK ||
        kvt_proto_xfer_hello_ans_decode(u.body, u.len, &h2, why, sizeof(why)) != KVT_OK ||
        h2.incarnation != h->incarnation) {
        if (why[0] == '\0')
            kvt_errf(why, sizeof(why), "another kvtierd answers at %s", path);
        goto out;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &sb) != 0 ||
        (uint64_t)sb.st_size < a.map_bytes) {
        kvt_errf(why, sizeof(why), "its arena is not a memfd sealed against shrinking");
        goto out;
    }
    m = mmap(NULL, a.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        kvt_errf(why, sizeof(why), "mmap of %llu bytes: %s", (unsigned long long)a.map_bytes,
                 strerror(errno));
        goto out;
    }
    p->map = m;
    p->map_len = a.map_bytes;
    p->watch_fd = u.fd; /* kept open, asked nothing more: it closes when the peer goes */
    u.fd = -1;
    *region_p = (uint8_t *)m + a.slot_off;
out:
    if (fd >= 0)
        close(fd);
    srv_xcli_close(&u);
    if (m == MAP_FAILED)
        kvt_log_debug("peer on this host, arena not mapped (UCX instead): %s", why);
    return m != MAP_FAILED;
}

void srv_xpeers_cleanup(srv_xfer_t *xf)
{
    peers_t *ps = xf->peers;
    while (ps != NULL && ps->n > 0)
        srv_xpeer_drop(xf, &ps->v[0]);
    free(ps);
    xf->peers = NULL;
}

kvt_status_t srv_xpeer_hello(srv_xfer_t *xf, srv_xcli_t *c, const char *addr, srv_xpeer_t **p_p,
                             char *err, size_t errlen)
{
    peers_t *ps = peers_of(xf);
    if (ps == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    for (uint32_t i = 0; i < ps->n; i++)
        if (strcmp(ps->v[i].addr, addr) == 0) {
            srv_xpeer_drop(xf, &ps->v[i]);
            break;
        }
    if (ps->n == SRV_XPEER_MAX)
        srv_xpeer_drop(xf, &ps->v[0]);
    uint64_t id = ++c->next_id;
    kvt_proto_xfer_hello_req_encode(&c->wr, id, 0);
    kvt_proto_xfer_hello_ans_t h;
    kvt_status_t st = srv_xcli_call(c, KVT_PROTO_OP_XFER_HELLO, id, err, errlen);
    if (st != KVT_OK)
        return st;
    if (kvt_proto_xfer_hello_ans_decode(c->body, c->len, &h, err, errlen) != KVT_OK)
        return KVT_ERR_PEER;
    atomic_fetch_add_explicit(&xf->handshakes, 1, memory_order_relaxed);
    kvt_xfer_peer_info_t info = {.worker_addr = h.addr,
                                 .worker_addr_len = h.addr_len,
                                 .rkey = h.rkey,
                                 .rkey_len = h.rkey_len,
                                 .remote_base = h.base,
                                 .remote_len = (uint64_t)h.nslots * h.slot_bytes,
                                 .incarnation = h.incarnation};
    srv_xpeer_t *p = &ps->v[ps->n];
    *p = (srv_xpeer_t){
        .inc = h.incarnation, .slot_bytes = h.slot_bytes, .nslots = h.nslots, .watch_fd = -1};
    if (map_arena(xf, c->timeout_ms, &h, p, &info.map))
        atomic_fetch_add_explicit(&xf->mapped_peers, 1, memory_order_relaxed);
    if (kvt_xfer_peer_open(xf->x, &info, &p->p, err, errlen) != KVT_OK) {
        if (p->map != NULL)
            munmap(p->map, p->map_len);
        if (p->watch_fd >= 0)
            close(p->watch_fd);
        return KVT_ERR_PEER;
    }
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    ps->n++;
    *p_p = p;
    return KVT_OK;
}

kvt_status_t srv_xpeer_get(srv_xfer_t *xf, srv_xcli_t *c, const char *addr, srv_xpeer_t **p_p,
                           char *err, size_t errlen)
{
    srv_xpeers_reap(xf); /* a mapped peer that went is not used */
    peers_t *ps = peers_of(xf);
    for (uint32_t i = 0; ps != NULL && i < ps->n; i++)
        if (strcmp(ps->v[i].addr, addr) == 0 && !kvt_xfer_peer_failed(ps->v[i].p, NULL)) {
            *p_p = &ps->v[i];
            return KVT_OK;
        }
    return srv_xpeer_hello(xf, c, addr, p_p, err, errlen);
}

uint32_t srv_xpeer_lease_ms(const srv_xfer_t *xf, uint32_t timeout_ms)
{
    /* this sidecar's own --lease (30 s by default), renewed while the batch runs; no longer
     * than the transfer can last */
    uint64_t ms = (uint64_t)timeout_ms + 2000, own = xf->srv->cfg.lease_ms;
    if (own != 0 && own < ms)
        ms = own;
    return ms < KVT_PROTO_XFER_MAX_LEASE_MS ? (uint32_t)ms : KVT_PROTO_XFER_MAX_LEASE_MS;
}

/* XFER_RENEW of @lease at @p for @lease_ms more, best effort: a lost renewal shows as the
 * lease's expiry there, and so as the blocks' failure. */
static void xpeer_renew(srv_xfer_t *xf, srv_xcli_t *c, const srv_xpeer_t *p, uint64_t lease,
                        uint32_t lease_ms)
{
    kvt_proto_xfer_lease_t lr = {.incarnation = p->inc, .lease = lease, .lease_ms = lease_ms};
    uint64_t id = ++c->next_id;
    if (kvt_proto_xfer_lease_req_encode(&c->wr, KVT_PROTO_OP_XFER_RENEW, id, &lr) != KVT_OK)
        return;
    char e2[200];
    if (srv_xcli_call(c, KVT_PROTO_OP_XFER_RENEW, id, e2, sizeof(e2)) == KVT_OK)
        atomic_fetch_add_explicit(&xf->renewals, 1, memory_order_relaxed);
}

void srv_xpeer_release(srv_xcli_t *c, const srv_xpeer_t *p, uint64_t lease)
{
    if (lease == 0 || c->fd < 0)
        return;
    kvt_proto_xfer_lease_t lr = {.incarnation = p->inc, .lease = lease};
    uint64_t id = ++c->next_id;
    kvt_proto_xfer_lease_req_encode(&c->wr, KVT_PROTO_OP_XFER_RELEASE, id, &lr);
    char e2[200];
    srv_xcli_call(c, KVT_PROTO_OP_XFER_RELEASE, id, e2, sizeof(e2));
}

/* ---- one batch ------------------------------------------------------------------------ */

typedef struct batch_wait {
    bool done;
    kvt_status_t st;
} batch_wait_t;

static void batch_done(void *arg, kvt_status_t st)
{
    batch_wait_t *bw = arg;
    bw->done = true;
    bw->st = st;
}

/*
 * Drives UCX (this thread is its only driver) until *@done (when not NULL) or
 * @end_ms (kvt_clock_ms(); 0: none); renews @lease at @p (when there is one)
 * over @c for @lease_ms each time *@renew_at passes, then sets it a third of
 * @lease_ms later.
 */
static void drive(srv_xfer_t *xf, srv_xcli_t *c, const srv_xpeer_t *p, uint64_t lease,
                  uint32_t lease_ms, uint64_t *renew_at, const bool *done, uint64_t end_ms)
{
    bool renews = lease != 0 && p != NULL && c != NULL;
    for (;;) {
        uint64_t now = kvt_clock_ms();
        if (renews && c->fd >= 0 && now >= *renew_at) {
            xpeer_renew(xf, c, p, lease, lease_ms);
            *renew_at = kvt_clock_ms() + (lease_ms / 3 > 0 ? lease_ms / 3 : 1);
        }
        while (kvt_xfer_progress(xf->x) > 0 && (done == NULL || !*done)) {
        }
        now = kvt_clock_ms();
        if ((done != NULL && *done) || (end_ms != 0 && now >= end_ms))
            return;
        int64_t wait = -1;
        if (end_ms != 0)
            wait = (int64_t)(end_ms - now);
        if (renews && (wait < 0 || (int64_t)(*renew_at - now) < wait))
            wait = *renew_at > now ? (int64_t)(*renew_at - now) : 0;
        kvt_xfer_wait(xf->x, (int)wait);
    }
}

void srv_xpeer_batch(srv_xfer_t *xf, srv_xpeer_t *p, kvt_xfer_op_t op, const kvt_xfer_iov_t *iov,
                     uint32_t n, kvt_status_t *est, uint32_t timeout_ms, srv_xcli_t *c,
                     uint64_t lease, uint32_t lease_ms, char *err, size_t errlen)
{
    batch_wait_t bw = {0};
    for (uint32_t j = 0; j < n; j++)
        est[j] = KVT_ERR_INTERNAL;
    kvt_status_t st =
        kvt_xfer_submit(p->p, op, iov, n, est, timeout_ms, batch_done, &bw, err, errlen);
    if (st != KVT_OK) {
        for (uint32_t j = 0; j < n; j++)
            est[j] = st;
        return;
    }
    /* the batch's deadline bounds the wait; the peer's lease is renewed every third of it */
    uint64_t renew_at = kvt_clock_ms() + (lease_ms / 3 > 0 ? lease_ms / 3 : 1);
    drive(xf, c, p, lease, lease_ms, &renew_at, &bw.done, 0);
}

void srv_xpeer_idle(srv_xfer_t *xf, srv_xcli_t *c, const srv_xpeer_t *p, uint64_t lease,
                    uint32_t lease_ms, uint64_t *renew_at, uint32_t ms)
{
    drive(xf, c, p, lease, lease_ms, renew_at, NULL, kvt_clock_ms() + ms);
}

uint8_t srv_xfer_reason(kvt_status_t st)
{
    switch (st) {
    case KVT_ERR_PEER:
    case KVT_ERR_CLOSED: return KVT_PROTO_XFER_FAIL_PEER_DOWN;
    case KVT_ERR_STALE: return KVT_PROTO_XFER_FAIL_PEER_RESTARTED;
    case KVT_ERR_TIMEOUT: return KVT_PROTO_XFER_FAIL_TIMEOUT;
    default: return KVT_PROTO_XFER_FAIL_ERROR;
    }
}

void srv_xres_fail(srv_xres_t *r, const uint64_t *keys, uint32_t n, uint8_t reason)
{
    for (uint32_t i = 0; i < n; i++)
        r->failed[r->nf++] = (kvt_proto_xfer_failed_t){.key = keys[i], .reason = reason};
}
