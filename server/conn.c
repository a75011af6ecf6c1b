/*
 * server/conn.c: client connections on a worker's event base, for both front
 * ends. Limits that keep one client from hurting others live here: the
 * connection cap (with a small reserve that answers only health probes),
 * unsent answer bytes per connection (past --conn-buffer no more requests
 * are answered and reads pause until the client reads), a deadline for every
 * started request and for a new connection's first one (slow and silent
 * clients), an idle timeout, and a cap on RPC requests waiting for the writer.
 *
 * HTTP requests on one connection are handled one at a time (answers must
 * keep their order); RPC requests are pipelined and answered as they finish.
 */
#define KVT_LOG_COMPONENT "conn"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/log.h"
#include "proto/proto.h"
#include "server/api.h"
#include "server/auth.h"
#include "server/conn.h"
#include "server/conn_int.h"
#include "server/http.h"
#include "server/listen.h"
#include "server/mailbox.h"
#include "server/metrics.h"
#include "server/routes.h"
#include "server/writer.h"
#include "tiers/tiers.h"

static void conn_read_cb(struct bufferevent *bev, void *arg);

void conn_unref(kvt_srv_conn_t *c)
{
    if (--c->refs > 0)
        return;
    free(c);
}

static void conn_close(kvt_srv_conn_t *c)
{
    if (c->bev == NULL)
        return;
    if (c->w->rpc_owner == c) {
        /* answers for a closed connection go nowhere */
        kvt_proto_wr_reset(&c->w->rpc_out);
        c->w->rpc_owner = NULL;
    }
    if (c->sess != NULL) { /* its engine is gone: pins and reservations are released */
        kvt_tier_sess_close(c->w->srv->tier, c->sess);
        c->sess = NULL;
    }
    event_free(c->rd); /* before the socket closes */
    c->rd = NULL;
    bufferevent_free(c->bev); /* BEV_OPT_CLOSE_ON_FREE closes the socket */
    c->bev = NULL;
    event_free(c->deadline);
    c->deadline = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    atomic_fetch_sub(c->probe ? &c->w->srv->nprobes : &c->w->srv->nconns, 1);
    conn_unref(c);
}

void srv_conn_close_all(kvt_srv_worker_t *w)
{
    while (w->conns != NULL)
        conn_close(w->conns);
}

/* Watches the socket for input, with the idle timeout when one is set. */
static void conn_watch_reads(kvt_srv_conn_t *c)
{
    uint64_t ms = c->w->srv->cfg.idle_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    event_add(c->rd, ms ? &tv : NULL);
}

/*
 * Answer bytes not yet sent: the output buffer (shared bodies count at their
 * full size) and, while @c owns it, the worker's RPC batch. Every answer of
 * every kind counts against --conn-buffer.
 */
static size_t conn_unsent(const kvt_srv_conn_t *c)
{
    size_t n = evbuffer_get_length(bufferevent_get_output(c->bev));
    return c->w->rpc_owner == c ? n + c->w->rpc_out.len : n;
}

/* Past the budget: answer nothing more (the readers stop) until the client reads. */
bool conn_backed_up(const kvt_srv_conn_t *c)
{
    return conn_unsent(c) > c->w->srv->cfg.conn_buffer;
}

/* Output backed up beyond the per-connection budget: stop reading until it drains. */
void conn_update_reading(kvt_srv_conn_t *c)
{
    if (c->bev == NULL)
        return;
    kvt_srv_t *srv = c->w->srv;
    /* a full input buffer too: the level-triggered read event would fire with nothing to read */
    bool pause = conn_backed_up(c) || c->busy || c->close_after ||
                 c->inflight >= srv->cfg.rpc_max_inflight ||
                 evbuffer_get_length(bufferevent_get_input(c->bev)) >= c->read_high;
    if (pause && !c->paused)
        event_del(c->rd);
    else if (!pause && c->paused)
        conn_watch_reads(c);
    c->paused = pause;
}

/*
 * Sends what the callbacks queued: @c's RPC answer batch (if it owns the
 * worker's), then the output buffer, one sendmsg for all of it. Only a
 * remainder (a full socket buffer) turns the bufferevent's write event on, so
 * the usual answer costs no epoll_ctl and no copy.
 */
void conn_flush(kvt_srv_conn_t *c)
{
    kvt_srv_worker_t *w = c->w;
    if (w->rpc_owner == c) {
        /*
         * RPC answers were encoded straight into the worker's batch: send
         * them from there when nothing is queued before them, and queue only
         * what the socket does not take.
         */
        kvt_proto_wr_t *b = &w->rpc_out;
        w->rpc_owner = NULL;
        size_t sent = 0;
        bool direct = c->bev != NULL && !c->writing &&
                      evbuffer_get_length(bufferevent_get_output(c->bev)) == 0;
        while (direct && sent < b->len) {
            ssize_t r = send(bufferevent_getfd(c->bev), b->buf + sent, b->len - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (r == -1 && errno == EINTR)
                continue;
            if (r <= 0)
                break; /* full, or an error the write event will report */
            sent += (size_t)r;
        }
        if (c->bev != NULL && sent < b->len) {
            bufferevent_write(c->bev, b->buf + sent, b->len - sent);
            if (direct) {
                /* the socket just refused more: wait for the write event, not another try */
                c->writing = true;
                bufferevent_enable(c->bev, EV_WRITE);
            }
        }
        kvt_proto_wr_reset(b);
    }
    if (c->bev == NULL || c->writing)
        return;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    while (evbuffer_get_length(out) > 0) {
        struct evbuffer_iovec v[16];
        int nv = evbuffer_peek(out, -1, NULL, v, 16);
        if (nv > 16)
            nv = 16;
        struct iovec iov[16];
        for (int i = 0; i < nv; i++)
            iov[i] = (struct iovec){v[i].iov_base, v[i].iov_len};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)nv};
        ssize_t r = sendmsg(bufferevent_getfd(c->bev), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r == -1 && errno == EINTR)
            continue;
        if (r <= 0)
            break; /* full (EAGAIN) or an error: the write event reports either */
        if (evbuffer_drain(out, (size_t)r) != 0) {
            /* a bufferevent keeps its output's start frozen: only it drains */
            evbuffer_unfreeze(out, 1);
            int d = evbuffer_drain(out, (size_t)r);
            evbuffer_freeze(out, 1);
            if (d != 0) {
                conn_close(c); /* cannot happen; resending sent bytes would corrupt the stream */
                return;
            }
        }
    }
    if (evbuffer_get_length(out) > 0) {
        c->writing = true;
        bufferevent_enable(c->bev, EV_WRITE);
    }
}

/*
 * Reads what the socket holds into the input buffer, up to 256 KiB a call,
 * bounded by the read high watermark. kvtierd reads sockets itself rather
 * than through the bufferevent: libevent 2.1 asks the kernel for the
 * readable size (an ioctl) before every read and reads 4 KiB at most, so a
 * request of a few KiB cost three or four system calls instead of one.
 * Returns false at EOF or on a socket error: the caller answers what was
 * read, then closes.
 */
static bool conn_fill(kvt_srv_conn_t *c)
{
    bool open = true;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    int fd = bufferevent_getfd(c->bev);
    bool thawed = false; /* a bufferevent keeps its input's end frozen: only it adds */
    for (int round = 0; round < 8; round++) {
        size_t have = evbuffer_get_length(in);
        if (have >= c->read_high)
            break;
        size_t want = c->read_high - have;
        if (want > 256 * 1024)
            want = 256 * 1024;
        struct evbuffer_iovec v[2];
        int nv = evbuffer_reserve_space(in, (ev_ssize_t)want, v, 2);
        if (nv <= 0 && !thawed) {
            evbuffer_unfreeze(in, 0);
            thawed = true;
            nv = evbuffer_reserve_space(in, (ev_ssize_t)want, v, 2);
        }
        if (nv <= 0)
            break;
        struct iovec iov[2];
        for (int i = 0; i < nv; i++)
            iov[i] = (struct iovec){v[i].iov_base, v[i].iov_len};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)nv};
        ssize_t r = recvmsg(fd, &mh, MSG_DONTWAIT);
        if (r <= 0) {
            /* nothing committed: the reservation lapses */
            if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                open = false;
            break;
        }
        size_t left = (size_t)r;
        int used = 0;
        for (; used < nv && left > 0; used++) {
            if (v[used].iov_len > left)
                v[used].iov_len = left;
            left -= v[used].iov_len;
        }
        evbuffer_commit_space(in, v, used);
        if ((size_t)r < want)
            break; /* the socket is drained */
    }
    if (thawed)
        evbuffer_freeze(in, 0);
    return open;
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvt_srv_conn_t *c = arg;
    CTR_INC(c->w->ctr.timeouts[c->proto]);
    if (c->proto == PROTO_HTTP && !c->busy) {
        http_error(c, 408, "request took too long", false);
        conn_flush(c);
        /* sent whole: close now (reads are off, nothing else would); else conn_write_cb() does */
        if (c->bev != NULL && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
            conn_close(c);
            return;
        }
        conn_update_reading(c);
        return;
    }
    conn_close(c);
}

/*
 * The deadline runs while a request is incomplete (or its error answer is
 * pending): a request read whole and answered in one callback never arms it,
 * which spares a pipelined stream two timer operations per request.
 */
void request_started(kvt_srv_conn_t *c)
{
    if (c->in_request)
        return;
    c->in_request = true;
    uint64_t ms = c->timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    event_add(c->deadline, &tv);
}

void request_finished(kvt_srv_conn_t *c)
{
    c->sent_continue = false;
    if (c->in_request) {
        c->in_request = false;
        event_del(c->deadline);
    }
}

/* libevent is done sending a shared body: drop the output buffer's reference. */
static void blob_sent_cb(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    srv_blob_unref(arg);
}

/*
 * Queues shared body @b (takes the caller's reference) after what is queued,
 * without copying it. Should libevent fail to take the reference, a copy; and
 * if that fails too, the connection ends after what was queued.
 */
void conn_add_blob(kvt_srv_conn_t *c, srv_blob_t *b)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_add_reference(out, b->data, b->len, blob_sent_cb, b) == 0)
        return;
    if (evbuffer_add(out, b->data, b->len) != 0)
        c->close_after = true; /* a cut answer: the client sees the connection end */
    srv_blob_unref(b);
}

/* Posts @job (from a route that writes) to the writer; the connection lives until the answer. */
kvt_status_t conn_post_job(kvt_srv_conn_t *c, const srv_route_t *rt, srv_job_t *job,
                           uint64_t req_id, uint64_t t0)
{
    job->conn = c;
    job->req_id = req_id;
    job->t0_ns = t0;
    job->call = rt->call;
    job->op = rt->op;
    c->refs++;
    kvt_status_t st = srv_mbox_post(&c->w->srv->inbox, job);
    if (st != KVT_OK) {
        c->refs--;
        srv_job_free(job);
    }
    return st;
}

void conn_start_async(kvt_srv_conn_t *c, const srv_route_t *rt, srv_job_t *job,
                      void (*start)(srv_job_t *job), uint64_t req_id, uint64_t t0)
{
    job->conn = c;
    job->worker = c->w;
    job->req_id = req_id;
    job->t0_ns = t0;
    job->call = rt->call;
    job->op = rt->op;
    c->refs++;
    start(job); /* its completion may already be in the worker's box: it is handled later */
}

/* ---- answers from the writer ------------------------------------------------------- */

void srv_conn_job_done(srv_job_t *job)
{
    kvt_srv_conn_t *c = job->conn;
    kvt_srv_worker_t *w = job->worker;
    if (c->bev != NULL) {
        if (c->proto == PROTO_HTTP) {
            if (job->ctype != NULL)
                http_respond(c, job->http_status, job->ctype, job->answer.buf, job->answer.len,
                             c->keep_alive);
            else
                http_json(c, job->http_status, &job->answer, c->keep_alive);
            c->busy = false;
        } else {
            kvt_proto_wr_t *wr = rpc_batch(c);
            if (job->http_status == 200)
                kvt_proto_raw_encode(wr, job->op, KVT_PROTO_F_RESPONSE, job->req_id,
                                     job->answer.buf, job->answer.len);
            else
                kvt_proto_err_encode(wr, job->op, job->req_id, job->st, (uint16_t)job->http_status,
                                     job->errmsg, strlen(job->errmsg));
            c->inflight--;
        }
    }
    srv_count(w, c->proto, job->call, job->http_status, job->t0_ns);
    srv_job_free(job);
    if (c->bev != NULL) {
        conn_update_reading(c);
        conn_read_cb(c->bev, c); /* requests that arrived meanwhile */
    }
    conn_unref(c);
}

/* ---- callbacks ------------------------------------------------------------------------ */

/*
 * Answers the requests buffered in @c's input and sends the answers, round
 * after round while the socket takes them: a reader stops at the output
 * budget, and when the flush then empties the output the rest of the input
 * is served here (nothing else would wake it: the client may have sent
 * everything already). It stops when the input is used up, when the output
 * stays backed up (conn_write_cb() comes back once it drains), or when no
 * request could be taken (an incomplete one, or one waiting for the writer).
 */
static void conn_serve(kvt_srv_conn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    for (;;) {
        size_t before = evbuffer_get_length(in);
        bool was_backed_up = conn_backed_up(c);
        if (c->proto == PROTO_HTTP)
            http_read(c);
        else
            rpc_read(c);
        conn_flush(c);
        if (c->bev == NULL)
            return;
        size_t left = evbuffer_get_length(in);
        if (left == 0 || conn_backed_up(c) || (left == before && !was_backed_up))
            return;
    }
}

/* Reads what the socket holds (unless reads are paused) and serves it. */
static void conn_read_cb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    kvt_srv_conn_t *c = arg;
    c->refs++; /* @c outlives a close below until this callback is done with it */
    bool open = c->paused || conn_fill(c);
    conn_serve(c);
    if (c->bev != NULL && !open)
        conn_close(c); /* EOF or a socket error */
    conn_update_reading(c);
    if (c->bev != NULL && c->close_after &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        conn_close(c);
    conn_unref(c);
}

static void conn_rd_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    kvt_srv_conn_t *c = arg;
    if (what & EV_TIMEOUT) {
        CTR_INC(c->w->ctr.timeouts[c->proto]);
        conn_close(c); /* idle */
        return;
    }
    conn_read_cb(c->bev, c);
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    kvt_srv_conn_t *c = arg;
    /* the output drained: direct sends again (conn_flush) */
    c->writing = false;
    bufferevent_disable(c->bev, EV_WRITE);
    if (c->close_after && !c->busy && c->inflight == 0) {
        conn_close(c);
        return;
    }
    conn_update_reading(c);
    /* requests held back while the output was over budget: answer them now */
    if (c->bev != NULL && evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        conn_read_cb(c->bev, c);
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    kvt_srv_conn_t *c = arg;
    conn_close(c); /* a write error (reads report theirs in conn_fill(); no bufferevent timeouts) */
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg);

/* Over every limit: one best-effort non-blocking answer, then close. */
static void conn_refuse(kvt_srv_worker_t *w, enum srv_proto proto, int fd)
{
    CTR_INC(w->ctr.conns_refused[proto]);
    if (proto == PROTO_HTTP) {
        static const char busy[] =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Content-Length: 32\r\nConnection: close\r\n\r\n{\"error\":\"too many "
            "connections\"}";
        ssize_t r = send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)r;
    } else {
        kvt_proto_wr_t wr;
        kvt_proto_wr_init(&wr);
        static const char msg[] = "too many connections";
        kvt_proto_err_encode(&wr, KVT_PROTO_OP_HELLO, 0, KVT_ERR_LIMIT, 503, msg, sizeof(msg) - 1);
        ssize_t r = send(fd, wr.buf, wr.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)r;
        kvt_proto_wr_cleanup(&wr);
    }
    /* a request already received would make close() reset the connection, and the client
     * could lose the answer: read it away first (what arrives later still resets) */
    char sink[4096];
    for (int i = 0; i < 16 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
        ;
    close(fd);
}

void srv_conn_accept(kvt_srv_worker_t *w, enum srv_proto proto, int fd)
{
    kvt_srv_t *srv = w->srv;
    bool probe = false;
    if (atomic_fetch_add(&srv->nconns, 1) >= (int)srv->cfg.max_connections) {
        atomic_fetch_sub(&srv->nconns, 1);
        /* every slot is taken: an HTTP connection may still carry a health probe */
        if (proto == PROTO_HTTP && atomic_fetch_add(&srv->nprobes, 1) < SRV_PROBE_SLOTS) {
            probe = true;
        } else {
            if (proto == PROTO_HTTP)
                atomic_fetch_sub(&srv->nprobes, 1);
            conn_refuse(w, proto, fd);
            return;
        }
    }
    kvt_srv_conn_t *c = calloc(1, sizeof(*c));
    struct bufferevent *bev = c ? bufferevent_socket_new(w->base, fd, BEV_OPT_CLOSE_ON_FREE) : NULL;
    struct event *dl = c ? evtimer_new(w->base, deadline_cb, c) : NULL;
    struct event *rd = c ? event_new(w->base, fd, EV_READ | EV_PERSIST, conn_rd_cb, c) : NULL;
    if (c == NULL || bev == NULL || dl == NULL || rd == NULL) {
        if (rd)
            event_free(rd);
        if (bev)
            bufferevent_free(bev);
        else
            close(fd);
        if (dl)
            event_free(dl);
        free(c);
        atomic_fetch_sub(probe ? &srv->nprobes : &srv->nconns, 1);
        return;
    }
    c->w = w;
    c->bev = bev;
    c->deadline = dl;
    c->rd = rd;
    c->proto = proto;
    c->probe = probe;
    c->refs = 1;
    c->authed = srv->auth_token == NULL;
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    CTR_INC(w->ctr.conns_accepted[proto]);
    /* the bufferevent only writes: reads are conn_rd_cb's (see conn_fill()) */
    bufferevent_setcb(bev, NULL, conn_write_cb, conn_event_cb, c);
    /* input beyond one request plus a head is not read until it is consumed */
    c->read_high = (proto == PROTO_HTTP ? srv->cfg.max_body + srv->cfg.max_header
                                        : srv->cfg.rpc_max_frame + KVT_PROTO_HDR_SIZE) +
                   65536;
    c->timeout_ms = srv->cfg.request_timeout_ms;
    if (probe) { /* a probe's request is a head, sent at once */
        c->read_high = srv->cfg.max_header;
        if (c->timeout_ms > SRV_PROBE_TIMEOUT_MS)
            c->timeout_ms = SRV_PROBE_TIMEOUT_MS;
    }
    /* answers go out through conn_flush(): the write event is off until output is left over */
    bufferevent_disable(bev, EV_WRITE);
    bufferevent_set_max_single_write(bev, 256 * 1024);
    conn_watch_reads(c);
    /* the first request is due at once: a connection that stays silent is closed like a
     * stalled request (--request-timeout), not only after --idle-timeout */
    request_started(c);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg)
{
    (void)l;
    (void)sa;
    (void)len;
    listen_arg_t *a = arg;
    if (a->proto == PROTO_HTTP || a->proto == PROTO_RPC) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    enum srv_proto proto = a->proto == NPROTOS ? PROTO_RPC : a->proto;
    /*
     * Connections go round-robin over the workers: the kernel's reuseport
     * hash can put three of four connections on one worker and leave the
     * other idle. A full hand-off ring keeps the connection here.
     */
    kvt_srv_t *srv = a->w->srv;
    unsigned target = atomic_fetch_add(&srv->next_worker, 1) % (unsigned)srv->nworkers;
    if ((int)target != a->w->id && srv_mbox_post_fd(&srv->workers[target].box, fd, proto))
        return;
    srv_conn_accept(a->w, proto, fd);
}

static void accept_error_cb(struct evconnlistener *l, void *arg)
{
    (void)l;
    (void)arg;
    /* EMFILE and friends: log and keep listening; the next accept may work */
    kvt_log_warn("accept failed: %s", strerror(errno));
}

kvt_status_t srv_conn_listen(kvt_srv_worker_t *w)
{
    static const enum srv_proto which[] = {PROTO_HTTP, PROTO_RPC, NPROTOS};
    struct evconnlistener **slot[] = {&w->l_http, &w->l_rpc, &w->l_unix};
    for (int i = 0; i < 3; i++) {
        int fd = srv_listener_fd(w, which[i]);
        if (fd == -1 && (i == 2 || (i == 0 ? w->srv->fd_http : w->srv->fd_rpc) < 0))
            continue; /* that listener is off */
        if (fd < 0)
            return KVT_ERR_IO;
        listen_arg_t *a = &w->listen_args[i];
        a->w = w;
        a->proto = which[i];
        *slot[i] = evconnlistener_new(w->base, accept_cb, a, LEV_OPT_CLOSE_ON_FREE, -1, fd);
        if (*slot[i] == NULL) {
            close(fd);
            return KVT_ERR_NO_MEM;
        }
        evconnlistener_set_error_cb(*slot[i], accept_error_cb);
    }
    return KVT_OK;
}
