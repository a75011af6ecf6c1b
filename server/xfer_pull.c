/*
 * server/xfer_pull.c: TRANSFER, pull: the RPC handler hands the job to the
 * xfer thread, which pins the keys at the peer, reads them over UCX into
 * slots reserved here, checks each block against the peer's XXH3 and commits
 * the good ones (the tier's changes index and publish them).
 */
#define KVT_LOG_COMPONENT "xfer"

#include "server/xfer_pull.h"

#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"
#include "server/mailbox.h"

void srv_xfer_pull_run(srv_xfer_t *xf, srv_job_t *job)
{
    (void)xf;
    srv_xjob_error(job, KVT_ERR_UNSUPPORTED, 501, "TRANSFER is not served yet");
}

void srv_xfer_pull_cleanup(srv_xfer_t *xf)
{
    (void)xf;
}

static void transfer_start(srv_job_t *job)
{
    kvt_jbuf_init(&job->answer);
    srv_xfer_t *xf = job->worker->srv->xfer;
    if (srv_mbox_post(&xf->inbox, job) != KVT_OK) {
        srv_xjob_error(job, KVT_ERR_LIMIT, 503, "too many transfers waiting, or stopping");
        srv_xjob_post(job);
    }
}

void srv_h_transfer(srv_req_t *rq, srv_result_t *res)
{
    srv_xfer_t *xf = rq->w->srv->xfer;
    if (xf == NULL) {
        *res = (srv_result_t){.out = OUT_ERROR,
                              .status = 501,
                              .st = KVT_ERR_UNSUPPORTED,
                              .msg = "this kvtierd takes no part in transfers: it needs "
                                     "--ram-bytes and --ucx on, and UCX must start (see its log)"};
        return;
    }
    size_t cap = rq->len / 8 + 1;
    srv_job_t *job = calloc(1, sizeof(*job));
    srv_xfer_call_t *xc = calloc(1, sizeof(*xc));
    uint64_t *keys = malloc(cap * sizeof(uint64_t));
    kvt_proto_transfer_req_t t;
    kvt_status_t st = KVT_ERR_NO_MEM;
    if (job != NULL && xc != NULL && keys != NULL)
        st = kvt_proto_transfer_req_decode(rq->body, rq->len, keys, (uint32_t)cap, &t, rq->err,
                                           rq->errlen);
    else
        kvt_errf(rq->err, rq->errlen, "out of memory");
    if (st == KVT_OK && t.direction != KVT_PROTO_XFER_PULL) {
        st = KVT_ERR_UNSUPPORTED;
        kvt_errf(rq->err, rq->errlen, "transfer: push is not served yet");
    }
    if (st != KVT_OK) {
        free(job);
        free(xc);
        free(keys);
        *res = (srv_result_t){
            .out = OUT_ERROR, .status = kvt_proto_http_status(st), .st = st, .msg = rq->err};
        return;
    }
    memcpy(xc->peer, t.peer.p, t.peer.len);
    memcpy(xc->model, t.model.p, t.model.len);
    memcpy(xc->lora, t.lora.p, t.lora.len);
    xc->direction = t.direction;
    xc->timeout_ms = t.timeout_ms;
    xc->keys = keys;
    xc->n = t.n;
    job->kind = JOB_TIER;
    job->worker = rq->w;
    job->xc = xc;
    *res = (srv_result_t){.out = OUT_ASYNC, .status = 200, .job = job, .start = transfer_start};
}
