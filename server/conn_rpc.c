/*
 * server/conn_rpc.c: the binary RPC front end of a connection: the worker's
 * answer batch, error frames, shared bodies, the route table's dispatch and
 * reading pipelined frames.
 */
#define KVT_LOG_COMPONENT "conn"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "common/clock.h"
#include "common/fdpass.h"
#include "common/log.h"
#include "proto/proto.h"
#include "server/conn_int.h"
#include "server/metrics.h"

/* ---- RPC ----------------------------------------------------------------------------- */

/*
 * The worker's answer batch, for @c: answers are encoded straight into it, in
 * order, and conn_flush() sends them. Another connection's pending answers
 * are flushed first, so the batch only ever holds one connection's.
 */
kvt_proto_wr_t *rpc_batch(kvt_srv_conn_t *c)
{
    kvt_srv_worker_t *w = c->w;
    if (w->rpc_owner != c) {
        if (w->rpc_owner != NULL)
            conn_flush(w->rpc_owner);
        w->rpc_owner = c;
    }
    return &w->rpc_out;
}

void rpc_error(kvt_srv_conn_t *c, uint8_t op, uint64_t req_id, kvt_status_t st, uint16_t http,
               const char *msg)
{
    kvt_proto_err_encode(rpc_batch(c), op, req_id, st, http, msg, msg ? strlen(msg) : 0);
}

/*
 * An answer frame whose body is shared body @b (takes the caller's
 * reference): the answers batched before it go to the output buffer first,
 * then its header, then the body by reference.
 */
static void rpc_answer_blob(kvt_srv_conn_t *c, uint8_t op, uint64_t req_id, srv_blob_t *b)
{
    kvt_srv_worker_t *w = c->w;
    if (b->len > KVT_PROTO_MAX_BODY_LIMIT) { /* what every answer is held to (protocol.md) */
        srv_blob_unref(b);
        rpc_error(c, op, req_id, KVT_ERR_TOO_BIG, 500, "answer over the frame limit");
        return;
    }
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (w->rpc_owner == c && w->rpc_out.len > 0) {
        evbuffer_add(out, w->rpc_out.buf, w->rpc_out.len);
        kvt_proto_wr_reset(&w->rpc_out);
    }
    kvt_proto_hdr_t h = {KVT_PROTO_VERSION, op, KVT_PROTO_F_RESPONSE, req_id, (uint32_t)b->len};
    uint8_t hdr[KVT_PROTO_HDR_SIZE];
    kvt_proto_hdr_encode(&h, hdr);
    evbuffer_add(out, hdr, sizeof(hdr));
    conn_add_blob(c, b);
}

/*
 * Sends the answer frame at @mark of the worker's batch (ATTACH's) with @fd
 * beside it (SCM_RIGHTS): everything before it goes out first, then the frame
 * with one sendmsg(). When earlier output cannot leave at once, or the frame
 * cannot go whole, the client gets an error answer instead and may retry.
 */
static int rpc_pass_fd(kvt_srv_conn_t *c, const kvt_proto_hdr_t *h, size_t mark, int fd)
{
    kvt_srv_worker_t *w = c->w;
    uint8_t frame[1024];
    size_t flen = w->rpc_out.len - mark;
    if (flen > sizeof(frame)) {
        w->rpc_out.len = mark;
        rpc_error(c, h->op, h->req_id, KVT_ERR_INTERNAL, 500, "answer too long to pass an fd");
        return 500;
    }
    memcpy(frame, w->rpc_out.buf + mark, flen);
    w->rpc_out.len = mark;
    conn_flush(c);
    if (c->bev == NULL)
        return 500;
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) != 0 ||
        (w->rpc_owner == c && w->rpc_out.len != 0)) {
        rpc_error(c, h->op, h->req_id, KVT_ERR_LIMIT, 503,
                  "earlier answers are still being sent: retry ATTACH");
        return 503;
    }
    ssize_t n;
    do
        n = kvt_fd_send(bufferevent_getfd(c->bev), frame, flen, MSG_NOSIGNAL, fd);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)flen)
        return 200;
    if (n > 0) {
        /* the fd went with the first bytes; the rest follows as ordinary output */
        evbuffer_add(bufferevent_get_output(c->bev), frame + n, flen - (size_t)n);
        return 200;
    }
    rpc_error(c, h->op, h->req_id, KVT_ERR_IO, 503, "could not send the arena's fd: retry ATTACH");
    return 503;
}

/* Handles one whole frame through the route table; returns the http-like status, or -1 when
 * the writer answers. */
static int rpc_dispatch(kvt_srv_conn_t *c, const kvt_proto_hdr_t *h, const uint8_t *body,
                        uint64_t t0, enum srv_call *call_p)
{
    kvt_srv_worker_t *w = c->w;
    kvt_srv_t *srv = w->srv;
    const srv_route_t *rt = srv_route_rpc(h->op);
    *call_p = rt ? rt->call : CALL_OTHER;
    char err[256];
    srv_req_t rq = {.w = w,
                    .err = err,
                    .errlen = sizeof(err),
                    .proto = PROTO_RPC,
                    .body = body,
                    .len = h->body_len,
                    .req_id = h->req_id,
                    .op = h->op,
                    .flags = h->flags,
                    .authed = &c->authed,
                    .sess = &c->sess,
                    .fd = bufferevent_getfd(c->bev),
                    .wr = rpc_batch(c)}; /* answers append; a failed encode drops only its frame */
    srv_result_t res;
    size_t mark = rq.wr->len; /* where this request's answer starts in the batch */
    if (h->flags & KVT_PROTO_F_RESPONSE)
        res = (srv_result_t){.out = OUT_ERROR,
                             .status = 400,
                             .st = KVT_ERR_PROTO,
                             .msg = "a request must not carry RESPONSE"};
    else if ((h->flags & KVT_PROTO_F_ENGINE_KEYS) && !kvt_proto_op_engine_keys(h->op))
        res = (srv_result_t){.out = OUT_ERROR,
                             .status = 400,
                             .st = KVT_ERR_INVAL,
                             .msg = "ENGINE_KEYS goes with keyed tier calls only"};
    else if (rt == NULL || rt->rpc == NULL)
        res = (srv_result_t){
            .out = OUT_ERROR, .status = 501, .st = KVT_ERR_UNSUPPORTED, .msg = "unknown opcode"};
    else if (rt->auth && srv->auth_token != NULL && !c->authed)
        res = (srv_result_t){.out = OUT_ERROR,
                             .status = 401,
                             .st = KVT_ERR_INVAL,
                             .msg = "say HELLO with the auth token first"};
    else
        rt->rpc(&rq, &res);
    if (res.out == OUT_ASYNC) {
        c->inflight++;
        conn_start_async(c, rt, res.job, res.start, h->req_id, t0);
        return -1;
    }
    if (res.out == OUT_FRAMES && res.pass_fd > 0 && !rq.wr->oom)
        return rpc_pass_fd(c, h, mark, res.pass_fd);
    if (res.out == OUT_JOB) {
        if (conn_post_job(c, rt, res.job, h->req_id, t0) == KVT_OK) {
            c->inflight++;
            return -1;
        }
        res = (srv_result_t){.out = OUT_ERROR,
                             .status = 503,
                             .st = KVT_ERR_LIMIT,
                             .msg = "writer queue full or stopping: retry"};
    }
    if (res.out == OUT_BLOB)
        rpc_answer_blob(c, h->op, h->req_id, res.blob);
    else if (res.out == OUT_ERROR)
        rpc_error(c, h->op, h->req_id, res.st, (uint16_t)res.status,
                  res.msg ? res.msg : kvt_status_str(res.st));
    else if (rq.wr->oom) {
        rpc_error(c, h->op, h->req_id, KVT_ERR_NO_MEM, 503, "out of memory");
        return 503;
    }
    return res.status;
}

void rpc_read(kvt_srv_conn_t *c)
{
    kvt_srv_worker_t *w = c->w;
    kvt_srv_t *srv = w->srv;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (c->bev != NULL && !c->close_after && c->inflight < srv->cfg.rpc_max_inflight &&
           !conn_backed_up(c)) {
        size_t len = evbuffer_get_length(in);
        if (len == 0)
            return;
        if (len < KVT_PROTO_HDR_SIZE) {
            request_started(c);
            return;
        }
        const uint8_t *p = evbuffer_pullup(in, KVT_PROTO_HDR_SIZE);
        kvt_proto_hdr_t h;
        char why[128];
        kvt_status_t st =
            kvt_proto_hdr_check(p, (uint32_t)srv->cfg.rpc_max_frame, &h, why, sizeof(why));
        if (st == KVT_ERR_UNSUPPORTED) {
            kvt_proto_hdr_peek(p, &h); /* valid framing: skip the frame, answer 501 */
        } else if (st != KVT_OK) {
            request_started(c);
            CTR_INC(w->ctr.bad_frames);
            kvt_proto_hdr_t raw;
            kvt_proto_hdr_peek(p, &raw);
            rpc_error(c, raw.op, st == KVT_ERR_TOO_BIG ? raw.req_id : 0, st,
                      kvt_proto_http_status(st), why);
            c->close_after = true;
            srv_count(w, PROTO_RPC, CALL_OTHER, kvt_proto_http_status(st), kvt_clock_ns());
            break;
        }
        size_t total = KVT_PROTO_HDR_SIZE + (size_t)h.body_len;
        if (len < total) {
            request_started(c);
            return;
        }
        uint64_t t0 = kvt_clock_ns();
        p = evbuffer_pullup(in, (ssize_t)total);
        enum srv_call call;
        int status = rpc_dispatch(c, &h, p + KVT_PROTO_HDR_SIZE, t0, &call);
        evbuffer_drain(in, total);
        request_finished(c);
        if (status >= 0) /* else the writer answers: srv_conn_job_done() counts it */
            srv_count(w, PROTO_RPC, call, status, t0);
        /* a long burst: send what is ready rather than hold it until the burst ends */
        if (c->bev != NULL && w->rpc_owner == c && w->rpc_out.len >= 16384)
            conn_flush(c);
    }
    conn_update_reading(c);
}
