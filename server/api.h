/*
 * server/api: the operations behind both front ends (HTTP/JSON and binary
 * RPC), run on a worker thread. Queries complete here; writes become jobs
 * for the writer thread.
 */
#ifndef KVT_SERVER_API_H
#define KVT_SERVER_API_H

#include <stddef.h>
#include <stdint.h>

#include "common/json.h"
#include "proto/proto.h"
#include "server/srv_int.h"

/* POST /v1/query: decodes @body, runs the query, writes the JSON answer to @out.
 * On error returns the status and a one-line reason in *@why_p (valid until the
 * worker's next call). */
kvt_status_t srv_api_query_json(kvt_srv_worker_t *w, const char *body, size_t len, kvt_jbuf_t *out,
                                const char **why_p);

/* RPC QUERY: decodes @body and appends the answer frame to @wr. Errors as above. */
kvt_status_t srv_api_query_rpc(kvt_srv_worker_t *w, uint64_t req_id, const uint8_t *body,
                               size_t len, kvt_proto_wr_t *wr, const char **why_p);

/* Decodes an events body into a new job (caller submits or frees it). On error
 * writes a one-line reason to @msg. */
kvt_status_t srv_api_events_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                srv_job_t **job_p, char *msg, size_t msglen);

/*
 * A job dropping @name (NUL-terminated, 1..255 bytes): with @kind JOB_DROP
 * every DP rank of that pod, with JOB_MODEL_DROP every namespace (base and
 * LoRAs) of that model.
 */
kvt_status_t srv_api_drop_job(kvt_srv_worker_t *w, job_kind_t kind, const char *name,
                              srv_job_t **job_p, char *msg, size_t msglen);

/* Worker: decodes a POST /v1/engines body (also the RPC ENGINE_ADD body) into a job. */
kvt_status_t srv_api_engine_add_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                    srv_job_t **job_p, char *msg, size_t msglen);

#endif
