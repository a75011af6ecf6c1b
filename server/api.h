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

typedef struct srv_query {
    const char *model;
    size_t model_len;
    const char *lora;
    size_t lora_len;
    bool by_keys;
    size_t n;
    const uint32_t *tokens; /* !by_keys: host order (le_tokens NULL) */
    const void *le_tokens;  /* !by_keys: little-endian bytes, any alignment (RPC frames) */
    const uint64_t *keys;   /* by_keys */
    size_t npods;           /* pod-name filter; 0: every pod */
    const char *const *pod_names;
    const size_t *pod_name_lens;
    const char *salt; /* !by_keys: the request's cache salt (not NUL-terminated); NULL: none */
    size_t salt_len;  /* bytes; 0: no salt */
} srv_query_t;

typedef struct srv_answer_pod {
    const char *pod; /* valid until srv_query_done() */
    uint32_t pod_len;
    const char *pod_json; /* the name as a JSON string (quoted, escaped); not NUL-terminated */
    uint32_t pod_json_len;
    uint32_t dp_rank;
    uint32_t matched, gpu, cpu, disk;
    double score;
} srv_answer_pod_t;

typedef struct srv_answer {
    uint32_t block_size, num_blocks;
    size_t npods;
    const kvt_scored_t *scored; /* [npods], best first */
} srv_answer_t;

/* Runs a query on the worker; on KVT_OK call srv_query_pod() for each pod, then srv_query_done().
 * On error returns the status with a one-line reason in @err (@errlen bytes; common/errtext.h). */
kvt_status_t srv_query_run(kvt_srv_worker_t *w, const srv_query_t *q, srv_answer_t *a, char *err,
                           size_t errlen);
void srv_query_pod(kvt_srv_worker_t *w, const srv_answer_t *a, size_t i, srv_answer_pod_t *p);
void srv_query_done(kvt_srv_worker_t *w);
/* Grows worker scratch to hold @nkeys keys, @ntokens tokens (0: none needed) and @nfilter pods. */
kvt_status_t srv_scratch(kvt_srv_worker_t *w, size_t nkeys, size_t ntokens, size_t nfilter);

/* POST /v1/query: decodes @body, runs the query, writes the JSON answer to @out.
 * On error returns the status and a one-line reason in @err (@errlen bytes). */
kvt_status_t srv_api_query_json(kvt_srv_worker_t *w, const char *body, size_t len, kvt_jbuf_t *out,
                                char *err, size_t errlen);

/* RPC QUERY: decodes @body and appends the answer frame to @wr. Errors as above. */
kvt_status_t srv_api_query_rpc(kvt_srv_worker_t *w, uint64_t req_id, const uint8_t *body,
                               size_t len, kvt_proto_wr_t *wr, char *err, size_t errlen);

/* Decodes an events body into a new job (caller submits or frees it). On error
 * writes a one-line reason to @err (@errlen bytes). */
kvt_status_t srv_api_events_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                srv_job_t **job_p, char *err, size_t errlen);

/*
 * A job dropping @name (NUL-terminated, 1..255 bytes): with @kind JOB_DROP
 * every DP rank of that pod, with JOB_MODEL_DROP every namespace (base and
 * LoRAs) of that model. Errors as srv_api_events_job().
 */
kvt_status_t srv_api_drop_job(kvt_srv_worker_t *w, job_kind_t kind, const char *name,
                              srv_job_t **job_p, char *err, size_t errlen);

/*
 * Worker: decodes a POST /v1/routed body (also the RPC ROUTED body) into a
 * job: the request's keys, hashed as a query would hash them now (the
 * namespace's block size, or --block-size for a model the index does not
 * know; the salt and LoRA rules of queries), for the writer to mark as
 * speculative entries of the pod. Errors as srv_api_events_job().
 */
kvt_status_t srv_api_routed_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                srv_job_t **job_p, char *err, size_t errlen);

/* Worker: decodes a POST /v1/engines body (also the RPC ENGINE_ADD body) into a job. Errors as
 * srv_api_events_job(). */
kvt_status_t srv_api_engine_add_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                    srv_job_t **job_p, char *err, size_t errlen);

#endif
