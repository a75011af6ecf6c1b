/*
 * server/metrics.h: per-request accounting and the GET /v1/stats and
 * GET /metrics bodies (metrics.c).
 */
#ifndef KVT_SERVER_METRICS_H
#define KVT_SERVER_METRICS_H

#include <stdint.h>

#include "common/json.h"
#include "server/srv_int.h"

void srv_stats_json(kvt_srv_worker_t *w, kvt_jbuf_t *out);
void srv_metrics_text(kvt_srv_worker_t *w, kvt_jbuf_t *out);

/* The shared body of @kind for the counters published last (encoded here, on the worker's
 * scratch, when the cached one is older): a reference for the caller, dropped with
 * srv_blob_unref(); NULL when out of memory. */
srv_blob_t *srv_blob_get(kvt_srv_worker_t *w, enum srv_blob_kind kind);

/* Drops a reference; the last one frees @b. NULL is a no-op. Any thread. */
void srv_blob_unref(srv_blob_t *b);

/* Counts one answered request of @call with @http_status, timed from @t0_ns. Worker @w only. */
void srv_count(kvt_srv_worker_t *w, enum srv_proto proto, enum srv_call call, int http_status,
               uint64_t t0_ns);

#endif
