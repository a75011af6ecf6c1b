/*
 * The transport ceiling of `kvtier-bench rpc`: a server that does no query
 * work at all. It answers every RPC frame with a recorded kvtierd answer
 * (answers[req_id % n], its request id patched in), on the same number of
 * threads as kvtierd's workers, with plain epoll, read and send. Loaded by
 * the same client as kvtierd, it shows how many queries/s loopback TCP and
 * the client leave room for on this machine, so kvtierd's rate can be read
 * as a fraction of what is possible here.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "proto/proto.h"

typedef struct ce_conn {
    int fd;
    uint8_t *in, *out;
    size_t inlen, incap, outoff, outlen, outcap;
    bool want_out; /* EPOLLOUT is armed: the socket took only part of the output */
} ce_conn_t;

typedef struct ce_server {
    uint8_t *const *answers;
    const size_t *anslen;
    size_t n;
} ce_server_t;

typedef struct ce_thread {
    const ce_server_t *s;
    int ep;
} ce_thread_t;

static bool ce_room(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap : 65536;
    while (nc < need)
        nc *= 2;
    uint8_t *b = realloc(*buf, nc);
    if (b == NULL)
        return false;
    *buf = b;
    *cap = nc;
    return true;
}

/* Asks for EPOLLOUT or stops asking; an epoll_ctl only when that changes. */
static void ce_want_out(ce_thread_t *t, ce_conn_t *c, bool on)
{
    if (c->want_out == on)
        return;
    c->want_out = on;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0u), .data.ptr = c};
    epoll_ctl(t->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Sends what is pending; false when the connection is gone. */
static bool ce_flush(ce_thread_t *t, ce_conn_t *c)
{
    while (c->outoff < c->outlen) {
        ssize_t r =
            send(c->fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ce_want_out(t, c, true);
            return true;
        }
        if (r <= 0)
            return false;
        c->outoff += (size_t)r;
    }
    c->outoff = c->outlen = 0;
    ce_want_out(t, c, false);
    return true;
}

/* Reads what the socket holds and queues one answer per whole frame. */
static bool ce_read(ce_thread_t *t, ce_conn_t *c)
{
    const ce_server_t *s = t->s;
    for (;;) {
        if (!ce_room(&c->in, &c->incap, c->inlen + 65536))
            return false;
        ssize_t r = recv(c->fd, c->in + c->inlen, c->incap - c->inlen, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (r <= 0)
            return false;
        c->inlen += (size_t)r;
        if ((size_t)r < 65536)
            break;
    }
    size_t off = 0;
    while (c->inlen - off >= KVT_PROTO_HDR_SIZE) {
        kvt_proto_hdr_t h;
        kvt_proto_hdr_peek(c->in + off, &h);
        if (c->inlen - off < KVT_PROTO_HDR_SIZE + (size_t)h.body_len)
            break;
        size_t k = (size_t)(h.req_id % s->n);
        if (!ce_room(&c->out, &c->outcap, c->outlen + s->anslen[k]))
            return false;
        memcpy(c->out + c->outlen, s->answers[k], s->anslen[k]);
        memcpy(c->out + c->outlen + 8, c->in + off + 8, 8); /* the request's id, as sent */
        c->outlen += s->anslen[k];
        off += KVT_PROTO_HDR_SIZE + h.body_len;
    }
    memmove(c->in, c->in + off, c->inlen - off);
    c->inlen -= off;
    return ce_flush(t, c);
}

static void *ce_thread_main(void *arg)
{
    ce_thread_t *t = arg;
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(t->ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            ce_conn_t *c = evs[i].data.ptr;
            bool ok = true;
            if (evs[i].events & EPOLLOUT)
                ok = ce_flush(t, c);
            if (ok && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                ok = ce_read(t, c);
            if (!ok) {
                epoll_ctl(t->ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                free(c->in);
                free(c->out);
                free(c);
            }
        }
    }
    return NULL;
}

/* The child: accepts connections and deals them to @threads epoll threads. */
static void ce_serve(int lfd, uint32_t threads, const ce_server_t *s)
{
    ce_thread_t *t = calloc(threads, sizeof(*t));
    if (t == NULL)
        _exit(1);
    for (uint32_t i = 0; i < threads; i++) {
        pthread_t th;
        t[i] = (ce_thread_t){s, epoll_create1(EPOLL_CLOEXEC)};
        if (t[i].ep < 0 || pthread_create(&th, NULL, ce_thread_main, &t[i]) != 0)
            _exit(1);
    }
    for (uint32_t next = 0;; next++) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        int one = 1; /* as kvtierd does */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        ce_conn_t *c = calloc(1, sizeof(*c));
        if (c == NULL)
            _exit(1);
        c->fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(t[next % threads].ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

int kvt_bench_ceiling_start(uint32_t threads, uint8_t *const *answers, const size_t *anslen,
                            size_t n, pid_t *pid_p, uint16_t *port_p)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (lfd < 0 || n == 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(lfd, 128) != 0 || getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) {
        if (lfd >= 0)
            close(lfd);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(lfd);
        return -1;
    }
    if (pid == 0) {
        ce_server_t s = {answers, anslen, n};
        ce_serve(lfd, threads ? threads : 1, &s);
        _exit(0);
    }
    close(lfd);
    *pid_p = pid;
    *port_p = ntohs(sa.sin_port);
    return 0;
}

void kvt_bench_ceiling_stop(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL); /* it holds nothing that needs a clean exit */
        waitpid(pid, NULL, 0);
    }
}
