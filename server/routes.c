/*
 * server/routes.c: the route table and the handlers that are not operations
 * of api.c (probes, counters, HELLO, PING, name routes, not-yet-served
 * paths). routes.h says how the front ends use them.
 */
#include "server/routes.h"

#include <stdio.h>
#include <string.h>

#include "server/api.h"
#include "server/auth.h"
#include "server/blocks.h"
#include "server/metrics.h"
#include "server/writer.h"
#include "server/xfer.h"

static void error(srv_result_t *res, int status, kvt_status_t st, const char *msg)
{
    *res = (srv_result_t){.out = OUT_ERROR, .status = status, .st = st, .msg = msg};
}

/* A job from an api.c constructor, or its error. */
static void job_or_error(srv_req_t *rq, srv_result_t *res, kvt_status_t st, srv_job_t *job)
{
    if (st != KVT_OK) {
        error(res, kvt_proto_http_status(st), st, rq->err);
        return;
    }
    *res = (srv_result_t){.out = OUT_JOB, .status = 200, .job = job};
}

static void text(srv_result_t *res, int status, const char *s)
{
    *res = (srv_result_t){.out = OUT_TEXT,
                          .status = status,
                          .text = s,
                          .len = strlen(s),
                          .ctype = "application/json"};
}

static void h_healthz(srv_req_t *rq, srv_result_t *res)
{
    (void)rq;
    text(res, 200, "{\"status\":\"ok\"}");
}

static void h_readyz(srv_req_t *rq, srv_result_t *res)
{
    char reason[128];
    if (srv_ready(rq->w->srv, reason, sizeof(reason))) {
        text(res, 200, "{\"status\":\"ready\"}");
        return;
    }
    kvt_jbuf_t *b = &rq->w->out;
    kvt_jbuf_reset(b);
    kvt_jbuf_cstr(b, "{\"status\":\"not ready\",\"reason\":");
    kvt_jbuf_str(b, reason, strlen(reason));
    kvt_jbuf_cstr(b, "}");
    *res = (srv_result_t){.out = OUT_JSON, .status = 503};
}

/* The shared counters body of @kind (encoded once per stats period: a reference, not a copy). */
static void blob(srv_req_t *rq, srv_result_t *res, enum srv_blob_kind kind, const char *ctype)
{
    srv_blob_t *b = srv_blob_get(rq->w, kind);
    if (b == NULL) {
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        return;
    }
    *res = (srv_result_t){.out = OUT_BLOB, .status = 200, .blob = b, .ctype = ctype};
}

static void h_metrics(srv_req_t *rq, srv_result_t *res)
{
    blob(rq, res, BLOB_METRICS, "text/plain; version=0.0.4; charset=utf-8");
}

static void h_stats(srv_req_t *rq, srv_result_t *res)
{
    if (rq->proto == PROTO_RPC && rq->len != 0) { /* protocol.md: its request body is empty */
        error(res, 400, KVT_ERR_INVAL, "STATS takes no body");
        return;
    }
    blob(rq, res, BLOB_STATS, "application/json");
}

static void h_query_http(srv_req_t *rq, srv_result_t *res)
{
    kvt_jbuf_reset(&rq->w->out);
    kvt_status_t st = srv_api_query_json(rq->w, (const char *)rq->body, rq->len, &rq->w->out,
                                         rq->err, rq->errlen);
    if (st != KVT_OK) {
        error(res, kvt_proto_http_status(st), st, rq->err);
        return;
    }
    *res = (srv_result_t){.out = OUT_JSON, .status = 200};
}

static void h_query_rpc(srv_req_t *rq, srv_result_t *res)
{
    kvt_status_t st =
        srv_api_query_rpc(rq->w, rq->req_id, rq->body, rq->len, rq->wr, rq->err, rq->errlen);
    if (st != KVT_OK) {
        error(res, kvt_proto_http_status(st), st, rq->err);
        return;
    }
    *res = (srv_result_t){.out = OUT_FRAMES, .status = 200};
}

/* POST /v1/events and RPC EVENTS carry the same JSON body. */
static void h_events(srv_req_t *rq, srv_result_t *res)
{
    srv_job_t *job = NULL;
    kvt_status_t st =
        srv_api_events_job(rq->w, (const char *)rq->body, rq->len, &job, rq->err, rq->errlen);
    job_or_error(rq, res, st, job);
}

/* POST /v1/routed and RPC ROUTED carry the same JSON body. */
static void h_routed(srv_req_t *rq, srv_result_t *res)
{
    srv_job_t *job = NULL;
    kvt_status_t st =
        srv_api_routed_job(rq->w, (const char *)rq->body, rq->len, &job, rq->err, rq->errlen);
    job_or_error(rq, res, st, job);
}

/* POST /v1/engines and RPC ENGINE_ADD carry the same JSON body. */
static void h_engine_add(srv_req_t *rq, srv_result_t *res)
{
    srv_job_t *job = NULL;
    kvt_status_t st =
        srv_api_engine_add_job(rq->w, (const char *)rq->body, rq->len, &job, rq->err, rq->errlen);
    job_or_error(rq, res, st, job);
}

/* A drop by name: from the path (HTTP) or the RPC body (one str). */
static void drop(srv_req_t *rq, srv_result_t *res, job_kind_t kind)
{
    char name[KVT_IDX_MAX_NAME + 1];
    const char *n = rq->name;
    if (rq->proto == PROTO_RPC) {
        kvt_proto_str_t s;
        kvt_status_t st =
            kind == JOB_MODEL_DROP
                ? kvt_proto_model_drop_req_decode(rq->body, rq->len, &s, rq->err, rq->errlen)
                : kvt_proto_drop_req_decode(rq->body, rq->len, &s, rq->err, rq->errlen);
        if (st != KVT_OK) {
            error(res, kvt_proto_http_status(st), st, rq->err);
            return;
        }
        memcpy(name, s.p, s.len);
        name[s.len] = '\0';
        n = name;
    }
    srv_job_t *job = NULL;
    kvt_status_t st = srv_api_drop_job(rq->w, kind, n, &job, rq->err, rq->errlen);
    job_or_error(rq, res, st, job);
}

static void h_engine_drop(srv_req_t *rq, srv_result_t *res)
{
    drop(rq, res, JOB_DROP);
}

static void h_model_drop(srv_req_t *rq, srv_result_t *res)
{
    drop(rq, res, JOB_MODEL_DROP);
}

static void h_hello(srv_req_t *rq, srv_result_t *res)
{
    kvt_srv_t *srv = rq->w->srv;
    kvt_proto_hello_req_t hr;
    kvt_status_t st = kvt_proto_hello_req_decode(rq->body, rq->len, &hr, rq->err, rq->errlen);
    if (st != KVT_OK) {
        error(res, 400, st, rq->err);
        return;
    }
    if (!srv_auth_ok(srv, hr.token.p, hr.token.len)) {
        error(res, 401, KVT_ERR_INVAL, "wrong auth token");
        return;
    }
    *rq->authed = true;
    kvt_proto_hello_ans_t ans = {KVT_PROTO_VERSION, (uint32_t)srv->cfg.rpc_max_frame};
    kvt_proto_hello_ans_encode(rq->wr, rq->req_id, &ans);
    *res = (srv_result_t){.out = OUT_FRAMES, .status = 200};
}

static void h_ping(srv_req_t *rq, srv_result_t *res)
{
    if (rq->len != 0) { /* protocol.md: its request body is empty */
        error(res, 400, KVT_ERR_INVAL, "PING takes no body");
        return;
    }
    kvt_proto_raw_encode(rq->wr, rq->op, KVT_PROTO_F_RESPONSE, rq->req_id, NULL, 0);
    *res = (srv_result_t){.out = OUT_FRAMES, .status = 200};
}

#define GET KVT_HTTP_GET
#define POST KVT_HTTP_POST
#define DELETE KVT_HTTP_DELETE
#define NOHTTP KVT_HTTP_OTHER
#define ANY SRV_ANY_METHOD
#define PATH(p) p, sizeof(p) - 1
#define NOPATH NULL, 0

/* call, label, HTTP method, path (and its length), name, RPC op, auth, writes, probe, HTTP handler,
 * RPC handler */
const srv_route_t srv_routes[] = {
    {CALL_HEALTHZ, "healthz", GET, PATH("/healthz"), NULL, 0, false, false, true, h_healthz, NULL},
    {CALL_READYZ, "readyz", GET, PATH("/readyz"), NULL, 0, false, false, true, h_readyz, NULL},
    {CALL_METRICS, "metrics", GET, PATH("/metrics"), NULL, 0, false, false, false, h_metrics, NULL},
    {CALL_STATS, "stats", GET, PATH("/v1/stats"), NULL, KVT_PROTO_OP_STATS, false, false, false,
     h_stats, h_stats},
    {CALL_QUERY, "query", POST, PATH("/v1/query"), NULL, KVT_PROTO_OP_QUERY, false, false, false,
     h_query_http, h_query_rpc},
    {CALL_EVENTS, "events", POST, PATH("/v1/events"), NULL, KVT_PROTO_OP_EVENTS, true, true, false,
     h_events, h_events},
    {CALL_ROUTED, "routed", POST, PATH("/v1/routed"), NULL, KVT_PROTO_OP_ROUTED, true, true, false,
     h_routed, h_routed},
    {CALL_ENGINES, "engines", POST, PATH("/v1/engines"), NULL, KVT_PROTO_OP_ENGINE_ADD, true, true,
     false, h_engine_add, h_engine_add},
    {CALL_ENGINES, "engines", DELETE, PATH("/v1/engines/"), "pod", KVT_PROTO_OP_ENGINE_DROP, true,
     true, false, h_engine_drop, h_engine_drop},
    {CALL_MODELS, "models", DELETE, PATH("/v1/models/"), "model", KVT_PROTO_OP_MODEL_DROP, true,
     true, false, h_model_drop, h_model_drop},
    {CALL_HELLO, "hello", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_HELLO, false, false, false, NULL,
     h_hello},
    {CALL_PING, "ping", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_PING, false, false, false, NULL, h_ping},
    /* the tiers (server/blocks.c); the block route takes PUT, GET and DELETE itself */
    {CALL_BLOCKS, "blocks", ANY, PATH("/v1/blocks/"), "block", KVT_PROTO_OP_BLOCK_PUT, true, false,
     false, srv_h_block_http, srv_h_block_put_rpc},
    {CALL_BLOCKS, "blocks", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_BLOCK_GET, false, false, false, NULL,
     srv_h_block_key_rpc},
    {CALL_BLOCKS, "blocks", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_BLOCK_DELETE, true, false, false,
     NULL, srv_h_block_key_rpc},
    {CALL_PREFETCH, "prefetch", POST, PATH("/v1/prefetch"), NULL, KVT_PROTO_OP_PREFETCH, false,
     false, false, srv_h_prefetch_http, srv_h_prefetch_rpc},
    {CALL_ATTACH, "attach", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_ATTACH, true, false, false, NULL,
     srv_h_attach},
    {CALL_LOOKUP, "lookup", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_LOOKUP, false, false, false, NULL,
     srv_h_lookup},
    {CALL_RESERVE, "reserve", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_RESERVE, true, false, false, NULL,
     srv_h_reserve},
    {CALL_COMMIT, "commit", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_COMMIT, true, false, false, NULL,
     srv_h_commit},
    {CALL_PIN, "pin", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_PIN, false, false, false, NULL, srv_h_pin},
    {CALL_UNPIN, "unpin", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_UNPIN, false, false, false, NULL,
     srv_h_unpin},
    /* the transfer between sidecars (server/xfer_*.c): a peer's frames, and the user's call */
    {CALL_XFER, "xfer", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_XFER_HELLO, true, false, false, NULL,
     srv_h_xfer_hello},
    {CALL_XFER, "xfer", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_XFER_PIN, true, false, false, NULL,
     srv_h_xfer_pin},
    {CALL_XFER, "xfer", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_XFER_RENEW, true, false, false, NULL,
     srv_h_xfer_renew},
    {CALL_XFER, "xfer", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_XFER_RELEASE, true, false, false, NULL,
     srv_h_xfer_release},
    {CALL_XFER, "xfer", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_XFER_RESERVE, true, false, false, NULL,
     srv_h_xfer_reserve},
    {CALL_XFER, "xfer", NOHTTP, NOPATH, NULL, KVT_PROTO_OP_XFER_COMMIT, true, false, false, NULL,
     srv_h_xfer_commit},
    {CALL_TRANSFER, "transfer", POST, PATH("/v1/transfer"), NULL, KVT_PROTO_OP_TRANSFER, true,
     false, false, srv_h_transfer_http, srv_h_transfer},
};
const size_t srv_nroutes = sizeof(srv_routes) / sizeof(srv_routes[0]);

const char *srv_call_label(enum srv_call call)
{
    for (size_t i = 0; i < srv_nroutes; i++)
        if (srv_routes[i].call == call)
            return srv_routes[i].label;
    return "other";
}

const srv_route_t *srv_route_http(const char *path, size_t len)
{
    for (size_t i = 0; i < srv_nroutes; i++) {
        const srv_route_t *r = &srv_routes[i];
        if (r->path == NULL)
            continue;
        size_t n = r->path_len;
        if (r->name_what != NULL ? len >= n && memcmp(path, r->path, n) == 0
                                 : len == n && memcmp(path, r->path, n) == 0)
            return r;
    }
    return NULL;
}

const srv_route_t *srv_route_rpc(uint8_t op)
{
    for (size_t i = 0; op != 0 && i < srv_nroutes; i++)
        if (srv_routes[i].op == op)
            return &srv_routes[i];
    return NULL;
}
