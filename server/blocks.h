/*
 * server/blocks.h: handlers of the tiers' calls (server/blocks.c): the block
 * API, prefetch and the engine's data plane. routes.c puts them in the route
 * table; each answers 501 when this kvtierd has no tiers.
 */
#ifndef KVT_SERVER_BLOCKS_H
#define KVT_SERVER_BLOCKS_H

#include "server/routes.h"

struct srv_tier_call;
/* Frees a JOB_TIER's call (srv_job_free()). NULL is a no-op. */
void srv_tier_call_free(struct srv_tier_call *tc);

void srv_h_block_http(srv_req_t *rq, srv_result_t *res);    /* PUT, GET, DELETE /v1/blocks/{key} */
void srv_h_block_put_rpc(srv_req_t *rq, srv_result_t *res); /* BLOCK_PUT */
void srv_h_block_key_rpc(srv_req_t *rq, srv_result_t *res); /* BLOCK_GET, BLOCK_DELETE */
void srv_h_prefetch_http(srv_req_t *rq, srv_result_t *res); /* POST /v1/prefetch */
void srv_h_prefetch_rpc(srv_req_t *rq, srv_result_t *res);  /* PREFETCH */
void srv_h_attach(srv_req_t *rq, srv_result_t *res);        /* ATTACH (Unix socket) */
void srv_h_lookup(srv_req_t *rq, srv_result_t *res);
void srv_h_reserve(srv_req_t *rq, srv_result_t *res);
void srv_h_commit(srv_req_t *rq, srv_result_t *res);
void srv_h_pin(srv_req_t *rq, srv_result_t *res);
void srv_h_unpin(srv_req_t *rq, srv_result_t *res);

#endif
