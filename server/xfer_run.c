/*
 * server/xfer_run.c: the xfer thread. It creates the UCX context
 * (transfer/transfer.h: one owner thread makes every call), registers the
 * arena, and loops: progress, arm, poll on the worker's event fd and an
 * eventfd for jobs, with the earliest batch deadline as timeout. TRANSFER
 * jobs come from the workers through its inbox and go back to their worker's
 * box, answered.
 */
#define KVT_LOG_COMPONENT "xfer"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/errtext.h"
#include "common/log.h"
#include "server/mailbox.h"
#include "server/xfer_int.h"
#include "server/xfer_peer.h"
#include "server/xfer_pull.h"

static void inbox_wake(void *arg)
{
    srv_xfer_t *xf = arg;
    uint64_t one = 1;
    ssize_t r = write(xf->job_efd, &one, sizeof(one)); /* a full counter still wakes */
    (void)r;
}

static void started(srv_xfer_t *xf, int state)
{
    pthread_mutex_lock(&xf->start_mu);
    xf->start_state = state;
    pthread_cond_broadcast(&xf->start_cv);
    pthread_mutex_unlock(&xf->start_mu);
}

/* UCX up and the arena registered; the handshake copied for the handlers. */
static kvt_status_t ucx_start(srv_xfer_t *xf, char *err, size_t errlen)
{
    kvt_status_t st = kvt_xfer_create(NULL, &xf->x, err, errlen);
    if (st != KVT_OK)
        return st;
    st = kvt_xfer_register(xf->x, kvt_tier_slot_ptr(xf->tier, 0),
                           (size_t)xf->nslots * xf->slot_bytes, err, errlen);
    if (st != KVT_OK)
        return st;
    size_t al, rl;
    const void *a = kvt_xfer_worker_address(xf->x, &al);
    const void *r = kvt_xfer_rkey(xf->x, &rl);
    if (al == 0 || rl == 0 || al > KVT_PROTO_XFER_MAX_BLOB || rl > KVT_PROTO_XFER_MAX_BLOB) {
        kvt_errf(err, errlen, "ucx: worker address of %zu bytes, rkey of %zu", al, rl);
        return KVT_ERR_UNSUPPORTED;
    }
    xf->addr = malloc(al);
    xf->rkey = malloc(rl);
    if (xf->addr == NULL || xf->rkey == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    memcpy(xf->addr, a, al);
    memcpy(xf->rkey, r, rl);
    xf->addr_len = al;
    xf->rkey_len = rl;
    return KVT_OK;
}

/* Runs the jobs waiting in the inbox (closed: fails them). */
static void run_jobs(srv_xfer_t *xf)
{
    bool closed;
    srv_job_t *job = srv_mbox_take(&xf->inbox, NULL, NULL, NULL, &closed);
    while (job != NULL) {
        srv_job_t *next = job->next;
        job->next = NULL;
        if (atomic_load(&xf->stop))
            srv_xjob_error(job, KVT_ERR_CLOSED, 503, "kvtierd is stopping");
        else
            srv_xfer_pull_run(xf, job);
        srv_xjob_post(job);
        job = next;
    }
}

static void *xfer_main(void *arg)
{
    srv_xfer_t *xf = arg;
    char err[320] = "";
    kvt_status_t st = ucx_start(xf, err, sizeof(err));
    if (st != KVT_OK) {
        kvt_log_warn("transfers off: %s (%s)", err, kvt_status_str(st));
        kvt_xfer_destroy(xf->x);
        xf->x = NULL;
        started(xf, -1);
        return NULL;
    }
    started(xf, 1);
    /* the jobs, UCX's event fd (or -1: ignored by poll), the mapped peers' sockets */
    struct pollfd pfd[2 + SRV_XPEER_MAX] = {{.fd = xf->job_efd, .events = POLLIN},
                                            {.fd = kvt_xfer_efd(xf->x), .events = POLLIN}};
    while (!atomic_load(&xf->stop)) {
        while (kvt_xfer_progress(xf->x) > 0)
            ;
        run_jobs(xf);
        srv_xpeers_reap(xf);
        if (!kvt_xfer_arm(xf->x))
            continue;
        int timeout = kvt_xfer_next_deadline_ms(xf->x);
        if (pfd[1].fd < 0 && (timeout < 0 || timeout > 100))
            timeout = 100; /* no event fd: poll UCX now and then */
        uint32_t nw = srv_xpeers_watch(xf, pfd + 2, SRV_XPEER_MAX);
        if (poll(pfd, 2 + nw, timeout) < 0 && errno != EINTR) {
            kvt_log_error("poll: %s", strerror(errno));
            break;
        }
        uint64_t v;
        if (pfd[0].revents & POLLIN) {
            ssize_t r = read(xf->job_efd, &v, sizeof(v));
            (void)r;
        }
    }
    run_jobs(xf); /* the inbox is closed: what is left fails */
    srv_xpeers_cleanup(xf);
    kvt_xfer_destroy(xf->x);
    xf->x = NULL;
    return NULL;
}

kvt_status_t srv_xfer_thread_start(srv_xfer_t *xf, char *err, size_t errlen)
{
    xf->job_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (xf->job_efd < 0) {
        kvt_errf(err, errlen, "eventfd: %s", strerror(errno));
        return KVT_ERR_IO;
    }
    srv_mbox_init(&xf->inbox, 1024, inbox_wake, xf);
    pthread_mutex_init(&xf->start_mu, NULL);
    pthread_cond_init(&xf->start_cv, NULL);
    if (pthread_create(&xf->thread, NULL, xfer_main, xf) != 0) {
        kvt_errf(err, errlen, "cannot start the xfer thread");
        return KVT_ERR_NO_MEM;
    }
    xf->thread_on = true;
    pthread_mutex_lock(&xf->start_mu);
    while (xf->start_state == 0)
        pthread_cond_wait(&xf->start_cv, &xf->start_mu);
    int state = xf->start_state;
    pthread_mutex_unlock(&xf->start_mu);
    if (state < 0) {
        pthread_join(xf->thread, NULL);
        xf->thread_on = false;
        kvt_errf(err, errlen, "ucx did not start");
        return KVT_ERR_UNSUPPORTED;
    }
    return KVT_OK;
}

void srv_xfer_thread_stop(srv_xfer_t *xf)
{
    if (xf->thread_on) {
        atomic_store(&xf->stop, true);
        srv_mbox_close(&xf->inbox); /* wakes it */
        pthread_join(xf->thread, NULL);
        xf->thread_on = false;
    }
}

/* ---- open, close, stats -------------------------------------------------------------------- */

/* xf->host and xf->unix_path: what a peer needs to tell that it shares this host and to reach
 * the arena (XFER_HELLO). The boot id changes at every boot and is the same in every container
 * of one kernel; the socket path, made absolute, may still not be reachable from the peer's
 * mount namespace (the peer then falls back to UCX). */
static void host_of(srv_xfer_t *xf)
{
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, xf->host, sizeof(xf->host) - 1);
        close(fd);
        while (n > 0 && (xf->host[n - 1] == '\n' || xf->host[n - 1] == ' '))
            n--;
        xf->host[n > 0 ? n : 0] = '\0';
    }
    const char *u = xf->srv->cfg.rpc_unix;
    if (u == NULL || u[0] == '\0' || !xf->srv->cfg.shm)
        return;
    char cwd[PATH_MAX];
    if (u[0] == '/')
        snprintf(xf->unix_path, sizeof(xf->unix_path), "%s", u);
    else if (getcwd(cwd, sizeof(cwd)) != NULL &&
             (size_t)snprintf(xf->unix_path, sizeof(xf->unix_path), "%s/%s", cwd, u) >=
                 sizeof(xf->unix_path))
        xf->unix_path[0] = '\0'; /* too long to pass */
}

kvt_status_t srv_xfer_open(kvt_srv_t *srv)
{
    if (srv->tier == NULL)
        return KVT_OK;
    if (!srv->cfg.ucx) {
        kvt_log_info("transfers off: --ucx off");
        return KVT_OK;
    }
    srv_xfer_t *xf = calloc(1, sizeof(*xf));
    if (xf == NULL)
        return KVT_ERR_NO_MEM;
    xf->srv = srv;
    xf->tier = srv->tier;
    xf->job_efd = -1;
    kvt_tier_geom_t g;
    kvt_tier_geom(srv->tier, &g);
    xf->slot_bytes = g.slot_bytes;
    xf->nslots = g.nslots;
    xf->block_bytes = g.block_bytes;
    xf->base = (uint64_t)(uintptr_t)kvt_tier_slot_ptr(srv->tier, 0);
    host_of(xf);
    pthread_mutex_init(&xf->mu, NULL);
    char err[320];
    kvt_status_t st = srv_xfer_thread_start(xf, err, sizeof(err));
    if (st != KVT_OK) {
        if (st != KVT_ERR_UNSUPPORTED) /* UCX's own failure is logged by the thread */
            kvt_log_warn("transfers off: %s", err);
        srv->xfer = xf;
        srv_xfer_close(srv);
        return st == KVT_ERR_NO_MEM ? st : KVT_OK;
    }
    srv->xfer = xf;
    kvt_log_info("transfers on: ucx, incarnation %" PRIu64 ", %u slots of %u bytes registered",
                 srv->incarnation, xf->nslots, xf->slot_bytes);
    return KVT_OK;
}

void srv_xfer_close(kvt_srv_t *srv)
{
    srv_xfer_t *xf = srv->xfer;
    if (xf == NULL)
        return;
    srv->xfer = NULL;
    srv_xfer_thread_stop(xf);
    srv_xfer_leases_close(xf);
    if (xf->job_efd >= 0) {
        srv_mbox_cleanup(&xf->inbox);
        close(xf->job_efd);
        pthread_mutex_destroy(&xf->start_mu);
        pthread_cond_destroy(&xf->start_cv);
    }
    pthread_mutex_destroy(&xf->mu);
    free(xf->addr);
    free(xf->rkey);
    free(xf);
}

#define LOAD(x) ((uint64_t)atomic_load_explicit(&(x), memory_order_relaxed))

void srv_xfer_stats_json(kvt_srv_t *srv, kvt_jbuf_t *o)
{
    kvt_jbuf_printf(o, "\"incarnation\":%" PRIu64 ",", srv->incarnation);
    srv_xfer_t *xf = srv->xfer;
    if (xf == NULL) {
        kvt_jbuf_cstr(o, "\"transfer\":null");
        return;
    }
    kvt_jbuf_printf(o,
                    "\"transfer\":{\"ucx\":true,\"leases\":%u,\"leases_opened\":%" PRIu64
                    ",\"leases_expired\":%" PRIu64 ",\"pinned_keys\":%" PRIu64
                    ",\"reserved_keys\":%" PRIu64 ",\"committed\":%" PRIu64
                    ",\"commit_bad_sum\":%" PRIu64 ",\"transfers\":%" PRIu64
                    ",\"transferred\":%" PRIu64 ",\"missing\":%" PRIu64 ",\"failed\":%" PRIu64
                    ",\"bytes\":%" PRIu64 ",\"handshakes\":%" PRIu64 ",\"renewals\":%" PRIu64
                    ",\"mapped_peers\":%" PRIu64 "}",
                    srv_xfer_nleases(xf), LOAD(xf->leases_opened), LOAD(xf->leases_expired),
                    LOAD(xf->pinned_keys), LOAD(xf->reserved_keys), LOAD(xf->committed),
                    LOAD(xf->commit_bad_sum), LOAD(xf->transfers), LOAD(xf->transferred),
                    LOAD(xf->missing), LOAD(xf->failed), LOAD(xf->bytes), LOAD(xf->handshakes),
                    LOAD(xf->renewals), LOAD(xf->mapped_peers));
}
