/*
 * server/conn.h: client connections on a worker (conn.c): accepting, reading
 * and answering HTTP and binary RPC requests, output limits and deadlines.
 */
#ifndef KVT_SERVER_CONN_H
#define KVT_SERVER_CONN_H

#include "server/srv_int.h"

/* Sets up worker @w's listeners (srv_listener_fd()) on its loop. */
kvt_status_t srv_conn_listen(kvt_srv_worker_t *w);

/* Takes over accepted socket @fd on worker @w (limits, bufferevent). */
void srv_conn_accept(kvt_srv_worker_t *w, enum srv_proto proto, int fd);

/* Sends the writer's answer to @job's connection (if still open), counts it, frees @job. */
void srv_conn_job_done(srv_job_t *job);

/* Closes every connection of @w. */
void srv_conn_close_all(kvt_srv_worker_t *w);

#endif
