/*
 * server/srv.c: wires kvtierd together: configuration checks, the index, the
 * writer (writer.c), the listeners (listen.c), the workers (worker.c); run,
 * stop and destroy. srv_int.h describes the threads.
 */
#define KVT_LOG_COMPONENT "srv"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/thread.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/auth.h"
#include "server/listen.h"
#include "server/metrics.h"
#include "server/tier.h"
#include "server/worker.h"
#include "server/writer.h"
#include "server/xfer.h"

static int stop_pipe[2] = {-1, -1}; /* written by kvt_srv_stop(), read by kvt_srv_run() */

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
    srv->cfg.pod = dup_or_empty(cfg->pod);
    srv->cfg.arena_name = dup_or_empty(cfg->arena_name);
    srv->cfg.disk_path = dup_or_empty(cfg->disk_path);
    srv->cfg.disk_admit = dup_or_empty(cfg->disk_admit != NULL ? cfg->disk_admit : "seen-twice");
    srv->fd_http = srv->fd_rpc = srv->fd_unix = -1;
    srv->q_efd = -1;
    memset(&srv->cfg.engines, 0, sizeof(srv->cfg.engines)); /* read during create only */
    pthread_mutex_init(&srv->stats_mu, NULL);
    pthread_mutex_init(&srv->blob_mu, NULL);
    kvt_score_weights_default(&srv->weights);
    srv->started_ns = kvt_clock_ns();
    srv->started_wall_s = kvt_clock_wall();
    kvt_status_t st = KVT_ERR_NO_MEM;
    if (!srv->cfg.http_listen || !srv->cfg.rpc_listen || !srv->cfg.rpc_unix || !srv->cfg.data_dir ||
        !srv->cfg.auth_token_file || !srv->cfg.publish || !srv->cfg.publish_replay ||
        !srv->cfg.ipc_dir || !srv->cfg.pod || !srv->cfg.arena_name || !srv->cfg.disk_path ||
        !srv->cfg.disk_admit)
        goto err;
    if (srv->cfg.pod[0] != '\0') {
        srv->pod = strdup(srv->cfg.pod);
    } else {
        char host[256] = "kvtierd";
        if (gethostname(host, sizeof(host) - 1) != 0)
            snprintf(host, sizeof(host), "kvtierd");
        host[sizeof(host) - 1] = '\0';
        srv->pod = strdup(host);
    }
    if (srv->pod == NULL)
        goto err;
    if (srv->cfg.block_size == 0 || srv->cfg.writer_queue == 0 || srv->cfg.max_connections == 0 ||
        srv->cfg.rpc_max_frame > (64u << 20) || srv->cfg.rpc_max_frame < 1024 ||
        srv->cfg.replay_timeout_ms == 0 || srv->cfg.replay_hold == 0 ||
        srv->cfg.event_max_message == 0 || srv->cfg.publish_buffer == 0 ||
        srv->cfg.writer_stall_ms == 0 || srv->cfg.lora_keys > KVT_SRV_LORA_KEYS_DYNAMO) {
        kvt_log_error("bad limits: block-size, writer-queue, max-connections, replay-timeout, "
                      "replay-hold, event-max-message and publish-buffer must be > 0, "
                      "rpc-max-frame in 1KiB..64MiB, writer-stall > 0, lora-keys known");
        st = KVT_ERR_INVAL;
        goto err;
    }
    if (srv->cfg.lora_keys == KVT_SRV_LORA_KEYS_DYNAMO)
        kvt_log_info("lora keys: dynamo (a LoRA's name seeds every block's hash)");
    if (srv->cfg.data_dir[0] && mkdir_p(srv->cfg.data_dir) != KVT_OK) {
        kvt_log_error("cannot create data dir %s: %s", srv->cfg.data_dir, strerror(errno));
        st = KVT_ERR_IO;
        goto err;
    }
    if ((st = srv_ipc_dir_open(srv)) != KVT_OK)
        goto err;
    if (srv->cfg.auth_token_file[0] &&
        (st = srv_auth_load(srv, srv->cfg.auth_token_file)) != KVT_OK)
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
    if ((st = kvt_ev_ctx_create(cfg->removed_map_bytes, &srv->ev_ctx)) != KVT_OK)
        goto err;
    if ((st = srv_writer_init(srv, cfg)) != KVT_OK)
        goto err;
    /* after the writer's inbox: the reloaded blocks' changes queue for it */
    if ((st = srv_tier_open(srv)) != KVT_OK)
        goto err;
    while (srv->incarnation == 0)
        if (getrandom(&srv->incarnation, sizeof(srv->incarnation), 0) !=
            (ssize_t)sizeof(srv->incarnation)) {
            kvt_log_error("getrandom: %s", strerror(errno));
            st = KVT_ERR_IO;
            goto err;
        }
    if ((st = srv_xfer_open(srv)) != KVT_OK)
        goto err;
    srv_stats_publish(srv); /* /v1/stats is whole from the first request */
    if ((st = kvt_idx_names_publish(srv->idx)) != KVT_OK)
        goto err;
    if ((st = srv_listen_first(srv)) != KVT_OK)
        goto err;
    srv->workers = calloc((size_t)srv->nworkers, sizeof(*srv->workers));
    if (srv->workers == NULL) {
        st = KVT_ERR_NO_MEM;
        goto err;
    }
    for (int i = 0; i < srv->nworkers; i++) {
        if ((st = srv_worker_init(srv, &srv->workers[i], i)) != KVT_OK) {
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

kvt_status_t kvt_srv_run(kvt_srv_t *srv)
{
    kvt_status_t st = srv_writer_start(srv);
    if (st != KVT_OK)
        return st;
    int started;
    st = srv_workers_start(srv, &started);
    kvt_log_info("kvtierd serving: http port %u, rpc port %u, %d workers%s", srv->http_port,
                 srv->rpc_port, srv->nworkers, srv->auth_token ? ", auth token required" : "");
    if (st == KVT_OK) {
        char c;
        while (read(stop_pipe[0], &c, 1) < 0 && errno == EINTR)
            ;
    }
    atomic_store(&srv->draining, true); /* /readyz: not ready from here on */
    kvt_log_info("stopping: applying queued writes, closing connections");
    /* writes already queued are applied and answered before the workers go */
    srv_writer_stop(srv);
    srv_workers_stop(srv, started);
    return st;
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
    /* connections (and their tier sessions) are closed; the tier's last completions may post to
     * the workers' boxes, which the cleanup below empties; the transfer's leases first */
    srv_xfer_close(srv);
    srv_tier_close(srv);
    if (srv->workers != NULL) {
        for (int i = 0; i < srv->nworkers; i++)
            srv_worker_cleanup(&srv->workers[i]);
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
    srv_writer_cleanup(srv); /* jobs never taken, the streams, the writer's eventfd */
    kvt_ev_ctx_destroy(srv->ev_ctx);
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
    free(srv->cfg.pod);
    free(srv->cfg.arena_name);
    free(srv->cfg.disk_path);
    free(srv->cfg.disk_admit);
    free(srv->pod);
    for (int i = 0; i < NBLOBS; i++)
        srv_blob_unref(srv->blobs[i]); /* output buffers holding them were freed with the workers */
    pthread_mutex_destroy(&srv->stats_mu);
    pthread_mutex_destroy(&srv->blob_mu);
    free(srv);
    if (stop_pipe[0] >= 0) {
        close(stop_pipe[0]);
        close(stop_pipe[1]);
        stop_pipe[0] = stop_pipe[1] = -1;
    }
}
