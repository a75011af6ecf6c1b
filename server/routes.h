/*
 * server/routes.h: kvtierd's calls, one table. Each route names a call once
 * (its metrics label), its HTTP method and path, its RPC opcode, whether it
 * needs the bearer token, whether the writer answers it, and its handlers.
 * The HTTP and RPC front ends (conn.c) find a route, check method, probe slot
 * and token from it, run its handler, and send what the handler left in a
 * srv_result_t: handlers never touch the connection, and a write becomes a
 * job the front end posts to the writer's inbox.
 */
#ifndef KVT_SERVER_ROUTES_H
#define KVT_SERVER_ROUTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/json.h"
#include "proto/proto.h"
#include "server/http.h"
#include "server/srv_int.h"

/* What a handler leaves for the front end to send. */
typedef enum srv_out {
    OUT_JSON,   /* body: rq->out (HTTP) */
    OUT_TEXT,   /* body: text/len, a constant */
    OUT_BLOB,   /* body: a shared blob; the reference goes to the front end */
    OUT_FRAMES, /* RPC: the answer frame is already in rq->wr */
    OUT_ERROR,  /* status/st and msg */
    OUT_JOB,    /* job: the front end posts it to the writer, which answers later */
    OUT_ASYNC,  /* job: the front end ties it to the connection, then runs start(job); the
                   answer comes later through the worker's box (tier calls) */
} srv_out_t;

typedef struct srv_result {
    srv_out_t out;
    int status;       /* HTTP status, also an RPC error frame's http field */
    kvt_status_t st;  /* OUT_ERROR: the RPC error frame's status */
    const char *msg;  /* OUT_ERROR: one line (static, or in rq->err) */
    const char *text; /* OUT_TEXT */
    size_t len;
    const char *ctype;             /* HTTP content type of OUT_TEXT, OUT_BLOB */
    srv_blob_t *blob;              /* OUT_BLOB */
    srv_job_t *job;                /* OUT_JOB, OUT_ASYNC */
    void (*start)(srv_job_t *job); /* OUT_ASYNC */
    int pass_fd; /* OUT_FRAMES over a Unix socket: an fd sent with the answer (> 0) */
} srv_result_t;

/* One request as a handler sees it. */
typedef struct srv_req {
    kvt_srv_worker_t *w;
    enum srv_proto proto;
    const uint8_t *body; /* HTTP body or RPC frame body */
    size_t len;
    const char *name; /* HTTP routes with a name: the decoded path segment, NUL-terminated */
    kvt_http_method_t method; /* HTTP */
    const char *query;        /* HTTP: after '?', not decoded; NULL when none */
    size_t query_len;
    int fd;                      /* the connection's socket */
    struct kvt_tier_sess **sess; /* RPC: the connection's tier session, opened on first use */
    uint64_t req_id;             /* RPC */
    uint8_t op;                  /* RPC */
    uint16_t flags;              /* RPC: the header's (KVT_PROTO_F_ENGINE_KEYS or 0) */
    bool *authed;                /* RPC: the connection's HELLO state (HELLO sets it) */
    kvt_proto_wr_t *wr;          /* RPC: answers are appended here */
    char *err;                   /* the front end's buffer for error text, not zeroed per request */
    size_t errlen;               /* bytes of @err */
} srv_req_t;

typedef void (*srv_handler_t)(srv_req_t *rq, srv_result_t *res);

typedef struct srv_route {
    enum srv_call call;
    const char *label;        /* the call's metrics label; routes of one call share it */
    kvt_http_method_t method; /* KVT_HTTP_OTHER: not over HTTP; SRV_ANY_METHOD: any method */
    const char *path;         /* HTTP path; with name_what: the prefix a name segment follows */
    size_t path_len;          /* strlen(path) */
    const char *name_what;    /* "pod", "model": a percent-decoded name follows path; else NULL */
    uint8_t op;               /* RPC opcode; 0: not served over RPC */
    bool auth;                /* needs the bearer token (HTTP header, or RPC HELLO) */
    bool writes;              /* the handler leaves a job: the writer answers */
    bool probe;               /* served from the probe reserve */
    srv_handler_t http, rpc;
} srv_route_t;

#define SRV_ANY_METHOD ((kvt_http_method_t)-1)

extern const srv_route_t srv_routes[];
extern const size_t srv_nroutes;

/* The metrics label of @call ("query", ...; "other" for CALL_OTHER). */
const char *srv_call_label(enum srv_call call);

/* The route of an HTTP path (not decoded), or NULL. A name route also matches its bare prefix
 * ("/v1/engines/"), whose empty name the handler refuses. */
const srv_route_t *srv_route_http(const char *path, size_t len);

/* The route of RPC opcode @op, or NULL. */
const srv_route_t *srv_route_rpc(uint8_t op);

#endif
