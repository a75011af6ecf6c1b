/*
 * server/xfer_http.c: POST /v1/transfer, the TRANSFER call with a JSON body
 * (server/xfer_json.h) and a JSON answer; and the one place a TRANSFER's
 * answer is written, as a frame or as JSON.
 */
#define KVT_LOG_COMPONENT "xfer"

#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"
#include "server/xfer.h"
#include "server/xfer_int.h"
#include "server/xfer_json.h"

void srv_xfer_answer(srv_job_t *job, const kvt_proto_transfer_ans_t *a)
{
    if (job->xc->http) {
        kvt_jbuf_reset(&job->answer);
        kvt_srv_xfer_answer_json(&job->answer, a);
        job->st = KVT_OK;
        job->http_status = 200;
        return;
    }
    kvt_proto_wr_t wr;
    kvt_proto_wr_init(&wr);
    kvt_status_t st = kvt_proto_transfer_ans_encode(&wr, job->req_id, a);
    if (st != KVT_OK)
        srv_xjob_error(job, st, kvt_proto_http_status(st), "transfer: answer not encoded");
    else
        srv_xjob_frame(job, &wr);
    kvt_proto_wr_cleanup(&wr);
}

void srv_h_transfer_http(srv_req_t *rq, srv_result_t *res)
{
    if (srv_xfer_or_error(rq, res) == NULL)
        return;
    /* n keys take at least 2n - 1 bytes of the body */
    size_t cap = rq->len / 2 + 1;
    if (cap > KVT_PROTO_XFER_MAX_KEYS)
        cap = KVT_PROTO_XFER_MAX_KEYS;
    srv_job_t *job = calloc(1, sizeof(*job));
    srv_xfer_call_t *xc = calloc(1, sizeof(*xc));
    kvt_srv_xfer_body_t *b = malloc(sizeof(*b));
    uint64_t *keys = malloc(cap * sizeof(uint64_t));
    kvt_status_t st = KVT_ERR_NO_MEM;
    if (job != NULL && xc != NULL && b != NULL && keys != NULL)
        st =
            kvt_srv_xfer_decode((const char *)rq->body, rq->len, keys, cap, b, rq->err, rq->errlen);
    else
        kvt_errf(rq->err, rq->errlen, "out of memory");
    if (st != KVT_OK) {
        free(job);
        free(xc);
        free(b);
        free(keys);
        int status = st == KVT_ERR_PARSE ? 400 : kvt_proto_http_status(st);
        *res = (srv_result_t){.out = OUT_ERROR, .status = status, .st = st, .msg = rq->err};
        return;
    }
    memcpy(xc->peer, b->peer, b->peer_len + 1);
    memcpy(xc->model, b->model, b->model_len + 1);
    memcpy(xc->lora, b->lora, b->lora_len + 1);
    xc->direction = b->direction;
    xc->stream = b->stream;
    xc->timeout_ms = b->timeout_ms;
    xc->keys = keys;
    xc->n = (uint32_t)b->n;
    xc->http = true;
    free(b);
    srv_xfer_accept(rq, res, job, xc);
}
