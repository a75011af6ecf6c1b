/*
 * server/writer.h: the writer thread (writer.c): every write to the index,
 * the engines' event streams, the published counters and names.
 */
#ifndef KVT_SERVER_WRITER_H
#define KVT_SERVER_WRITER_H

#include <stdbool.h>
#include <stddef.h>

#include "server/srv_int.h"

/* Creates the writer's inbox and eventfd, the engines' subscriber set, the publisher
 * (--publish) and --engine's subscriptions. The index and the ipc dir must exist. */
kvt_status_t srv_writer_init(kvt_srv_t *srv, const kvt_srv_config_t *cfg);

/* Starts the writer thread; returns once it came round its loop (so /readyz is true). */
kvt_status_t srv_writer_start(kvt_srv_t *srv);

/* Closes the inbox; the writer applies and answers what was queued, then ends (joined here). */
void srv_writer_stop(kvt_srv_t *srv);

/* Frees what srv_writer_init() made (jobs never taken are freed). The thread must not run. */
void srv_writer_cleanup(kvt_srv_t *srv);

/* Writer (or before it starts). Copies the counters /v1/stats and /metrics show. */
void srv_stats_publish(kvt_srv_t *srv);

/* GET /readyz: true when not stopping and the writer came round its loop within
 * --writer-stall; else false with a one-line reason in @err (@errlen bytes). Any thread. */
bool srv_ready(kvt_srv_t *srv, char *err, size_t errlen);

/* Whether ZMQ endpoint @ep stays on this host (ipc, inproc, tcp on loopback); "" does. */
bool srv_zmq_local(const char *ep);

#endif
