/* server/worker.h: the worker threads (worker.c). */
#ifndef KVT_SERVER_WORKER_H
#define KVT_SERVER_WORKER_H

#include "server/srv_int.h"

/* Prepares worker @id of @srv: its loop, box, index reader, EBR slot and listeners. */
kvt_status_t srv_worker_init(kvt_srv_t *srv, kvt_srv_worker_t *w, int id);

/* Frees what srv_worker_init() made, closing every connection. The thread must not run. */
void srv_worker_cleanup(kvt_srv_worker_t *w);

/* Starts every worker's thread; *@started_p says how many started (KVT_ERR_NO_MEM if not all). */
kvt_status_t srv_workers_start(kvt_srv_t *srv, int *started_p);

/* Tells the first @started workers to close their connections and end, and joins them. */
void srv_workers_stop(kvt_srv_t *srv, int started);

#endif
