/*
 * server/xfer.h: kvtierd's side of the transfer between sidecars
 * (docs/protocol.md "Transfer"). With --ucx on and tiers (--ram-bytes), one
 * "xfer" thread owns the UCX context (transfer/transfer.h) with the arena
 * registered; the RPC handlers of the source side (XFER_HELLO..XFER_COMMIT,
 * xfer_src.c) serve peers from the workers, holding slots in leases (a tier
 * session each); TRANSFER (xfer_run.c) runs on the xfer thread.
 */
#ifndef KVT_SERVER_XFER_H
#define KVT_SERVER_XFER_H

#include "server/routes.h"

struct srv_xfer_call;

/*
 * Starts the xfer thread, which creates the UCX context and registers the
 * arena. Nothing to do without tiers or with --ucx off. When UCX cannot start
 * a warning is logged and kvtierd runs without transfers (srv->xfer NULL):
 * KVT_OK all the same; KVT_ERR_NO_MEM only when memory runs out.
 */
kvt_status_t srv_xfer_open(kvt_srv_t *srv);

/* Stops the xfer thread (a TRANSFER in flight fails), closes every lease's session and frees
 * it all. Before the tier closes; the workers may still be running. NULL srv->xfer: no-op. */
void srv_xfer_close(kvt_srv_t *srv);

/* Appends "incarnation":N,"transfer":{...} (or null) to a /v1/stats body. */
void srv_xfer_stats_json(kvt_srv_t *srv, kvt_jbuf_t *o);

/* Frees a job's transfer call (mailbox.c). NULL is a no-op. */
void srv_xfer_call_free(struct srv_xfer_call *xc);

/* The RPC handlers (routes.c). */
void srv_h_xfer_hello(srv_req_t *rq, srv_result_t *res);
void srv_h_xfer_pin(srv_req_t *rq, srv_result_t *res);
void srv_h_xfer_renew(srv_req_t *rq, srv_result_t *res);
void srv_h_xfer_release(srv_req_t *rq, srv_result_t *res);
void srv_h_xfer_reserve(srv_req_t *rq, srv_result_t *res);
void srv_h_xfer_commit(srv_req_t *rq, srv_result_t *res);
void srv_h_transfer(srv_req_t *rq, srv_result_t *res);

/* POST /v1/transfer: the same call with a JSON body and answer (xfer_http.c). */
void srv_h_transfer_http(srv_req_t *rq, srv_result_t *res);

#endif
