/*
 * server/conn_int.h: a client connection, shared by the files of the
 * connection layer: conn.c (life cycle, limits, output, answers from the
 * writer and the tier), conn_http.c (the HTTP front end) and conn_rpc.c (the
 * binary RPC front end). Private to these three files.
 */
#ifndef KVT_SERVER_CONN_INT_H
#define KVT_SERVER_CONN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/bufferevent.h>

#include "server/http.h"
#include "server/routes.h"
#include "server/srv_int.h"

struct kvt_srv_conn {
    kvt_srv_worker_t *w;
    struct bufferevent *bev; /* NULL once closed */
    struct event *deadline;  /* request timeout */
    struct event *rd;        /* readable socket, or idle timeout: reads are ours, not libevent's */
    enum srv_proto proto;
    int refs;         /* the socket's, plus one per job at the writer */
    bool in_request;  /* the deadline runs: a request is incomplete, or its error answer pending */
    bool busy;        /* HTTP: a request waits for the writer */
    bool close_after; /* close once the output is flushed */
    bool sent_continue;  /* HTTP: "100 Continue" sent for the current request */
    bool authed;         /* RPC: HELLO carried the token */
    bool paused;         /* reads off: output backed up or too many jobs in flight */
    bool writing;        /* output left over: the bufferevent's write event is on */
    bool probe;          /* HTTP, in the probe reserve: /healthz and /readyz only, then close */
    uint64_t timeout_ms; /* the request deadline of this connection */
    size_t read_high;    /* input bytes buffered at most (the read high watermark) */
    uint32_t inflight;   /* RPC jobs at the writer */
    bool keep_alive;     /* HTTP: of the request waiting for the writer */
    struct kvt_tier_sess *sess; /* RPC: pins and reservations of this connection's engine */
    kvt_srv_conn_t *prev, *next;
};

void conn_unref(kvt_srv_conn_t *c);
bool conn_backed_up(const kvt_srv_conn_t *c);
void conn_update_reading(kvt_srv_conn_t *c);
void conn_flush(kvt_srv_conn_t *c);
/* Ties @job to @c (its answer comes through the worker's box), then runs @start(job). */
void conn_start_async(kvt_srv_conn_t *c, const srv_route_t *rt, srv_job_t *job,
                      void (*start)(srv_job_t *job), uint64_t req_id, uint64_t t0);
void request_started(kvt_srv_conn_t *c);
void request_finished(kvt_srv_conn_t *c);
void conn_add_blob(kvt_srv_conn_t *c, srv_blob_t *b);
kvt_status_t conn_post_job(kvt_srv_conn_t *c, const srv_route_t *rt, srv_job_t *job,
                           uint64_t req_id, uint64_t t0);
void http_json(kvt_srv_conn_t *c, int status, const kvt_jbuf_t *b, bool keep_alive);
void http_error(kvt_srv_conn_t *c, int status, const char *msg, bool keep_alive);
void http_read(kvt_srv_conn_t *c);
void http_respond(kvt_srv_conn_t *c, int status, const char *ctype, const char *body, size_t len,
                  bool keep_alive);
kvt_proto_wr_t *rpc_batch(kvt_srv_conn_t *c);
void rpc_read(kvt_srv_conn_t *c);
void rpc_error(kvt_srv_conn_t *c, uint8_t op, uint64_t req_id, kvt_status_t st, uint16_t http,
               const char *msg);

#endif
