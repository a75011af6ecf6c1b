/*
 * server/worker.c: the worker threads: each runs its own libevent loop with
 * its own listeners and connections (conn.c), takes the writer's answers and
 * other workers' accepted sockets from its box (mailbox.h), and queries the
 * index through its own reader (worker.h).
 */
#define KVT_LOG_COMPONENT "srv"

#include <stdlib.h>
#include <unistd.h>

#include <event2/listener.h>

#include "server/conn.h"
#include "server/worker.h"

/* The box's wake-up: the worker's loop runs worker_wake(). Any thread. */
static void worker_box_wake(void *arg)
{
    kvt_srv_worker_t *w = arg;
    event_active(w->wake, EV_READ, 0);
}

/* Sockets other workers accepted for this one, then the writer's answers; at stop, closes all. */
static void worker_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvt_srv_worker_t *w = arg;
    int fds[SRV_MBOX_FDS], protos[SRV_MBOX_FDS];
    uint32_t nh;
    srv_job_t *jobs = srv_mbox_take(&w->box, fds, protos, &nh, NULL);
    for (uint32_t i = 0; i < nh; i++) {
        if (atomic_load(&w->srv->stopping)) {
            close(fds[i]);
        } else {
            srv_conn_accept(w, (enum srv_proto)protos[i], fds[i]);
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

static void *worker_main(void *arg)
{
    kvt_srv_worker_t *w = arg;
    event_base_dispatch(w->base);
    return NULL;
}

void srv_worker_cleanup(kvt_srv_worker_t *w)
{
    if (w->srv == NULL)
        return; /* never initialised */
    if (w->base != NULL)
        srv_conn_close_all(w);
    if (w->l_http)
        evconnlistener_free(w->l_http);
    if (w->l_rpc)
        evconnlistener_free(w->l_rpc);
    if (w->l_unix)
        evconnlistener_free(w->l_unix);
    if (w->wake)
        event_free(w->wake);
    if (w->base)
        event_base_free(w->base);
    w->base = NULL;
    if (w->reader)
        kvt_idx_reader_destroy(w->reader);
    srv_mbox_cleanup(&w->box); /* sockets passed here after this worker stopped are closed */
    free(w->keys);
    free(w->tokens);
    free(w->filter);
    free(w->scored);
    free(w->views);
    kvt_jbuf_cleanup(&w->out);
    kvt_proto_wr_cleanup(&w->rpc_out);
}

kvt_status_t srv_worker_init(kvt_srv_t *srv, kvt_srv_worker_t *w, int id)
{
    w->srv = srv;
    w->id = id;
    srv_mbox_init(&w->box, 0, worker_box_wake, w);
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
    return srv_conn_listen(w);
}

kvt_status_t srv_workers_start(kvt_srv_t *srv, int *started_p)
{
    int started = 0;
    for (; started < srv->nworkers; started++)
        if (pthread_create(&srv->workers[started].thread, NULL, worker_main,
                           &srv->workers[started]) != 0)
            break;
    *started_p = started;
    return started == srv->nworkers ? KVT_OK : KVT_ERR_NO_MEM;
}

void srv_workers_stop(kvt_srv_t *srv, int started)
{
    atomic_store(&srv->stopping, true);
    for (int i = 0; i < started; i++)
        event_active(srv->workers[i].wake, EV_READ, 0);
    for (int i = 0; i < started; i++)
        pthread_join(srv->workers[i].thread, NULL);
}
