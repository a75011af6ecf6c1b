/* router-plugin/client_xfer.c: TRANSFER, a pull or push of blocks between two sidecars
 * (kvtier/client.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router-plugin/client_int.h"

const char *kvt_client_transfer_reason(uint8_t reason)
{
    const char *s = kvt_proto_xfer_reason_name(reason);
    return s != NULL ? s : "error";
}

kvt_status_t kvt_client_transfer(kvt_client_t *c, const kvt_client_transfer_t *t,
                                 kvt_client_transfer_out_t *out)
{
    if (c == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    if (t == NULL || out == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "transfer: NULL arguments");
    size_t plen = t->peer != NULL ? strlen(t->peer) : 0;
    size_t mlen = t->model != NULL ? strlen(t->model) : 0;
    size_t llen = t->lora != NULL ? strlen(t->lora) : 0;
    if (plen == 0 || plen > KVT_PROTO_MAX_STR)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "transfer: peer empty or longer than %u bytes",
                           KVT_PROTO_MAX_STR);
    if (mlen == 0 || mlen > KVT_PROTO_MAX_STR || llen > KVT_PROTO_MAX_STR)
        return kvt_cl_fail(c, KVT_ERR_INVAL,
                           "transfer: model name empty, or a name longer than %u bytes",
                           KVT_PROTO_MAX_STR);
    if (t->n == 0 || t->keys == NULL || t->n > KVT_PROTO_XFER_MAX_KEYS)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "transfer: 1..%u keys, not NULL (got %zu)",
                           KVT_PROTO_XFER_MAX_KEYS, t->n);
    if (t->stream && !t->push)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "transfer: stream is for a push");
    if (out->transferred == NULL || out->missing == NULL || out->failed == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "transfer: the answer's arrays are NULL");
    kvt_proto_transfer_req_t r = {.peer = {t->peer, (uint16_t)plen},
                                  .model = {t->model, (uint16_t)mlen},
                                  .lora = {t->lora, (uint16_t)llen},
                                  .direction = t->push ? KVT_PROTO_XFER_PUSH : KVT_PROTO_XFER_PULL,
                                  .flags = t->stream ? KVT_PROTO_XFER_STREAM : 0,
                                  .timeout_ms = t->timeout_ms,
                                  .n = (uint32_t)t->n};
    kvt_proto_wr_t req;
    kvt_proto_wr_init(&req);
    kvt_status_t st = kvt_proto_transfer_req_encode(&req, 0, &r, t->keys);
    if (st != KVT_OK) {
        kvt_proto_wr_cleanup(&req);
        return kvt_cl_fail(c, st, "transfer: cannot encode the request: %s%s", kvt_status_str(st),
                           st == KVT_ERR_INVAL ? " (is peer a host:port?)" : "");
    }
    /* the answer comes when the transfer is done: wait for its timeout (the server's 30 s when
     * 0), plus the usual I/O time */
    uint32_t io = c->io_ms;
    c->io_ms = io + (t->timeout_ms != 0 ? t->timeout_ms : 30000u);
    cl_answer_t ans;
    st = kvt_cl_call(c, &req, false, &ans);
    c->io_ms = io;
    kvt_proto_wr_cleanup(&req);
    if (st != KVT_OK)
        return st;
    kvt_proto_xfer_failed_t *failed = malloc(t->n * sizeof(*failed));
    if (failed == NULL)
        return kvt_cl_fail(c, KVT_ERR_NO_MEM, "transfer: out of memory");
    kvt_proto_transfer_ans_t a;
    char why[160];
    st = kvt_proto_transfer_ans_decode(ans.body, ans.h.body_len, out->transferred, out->missing,
                                       failed, (uint32_t)t->n, &a, why, sizeof(why));
    if (st != KVT_OK) {
        free(failed);
        kvt_cl_close(c);
        return kvt_cl_fail(c, KVT_ERR_PROTO, "%s", why);
    }
    for (uint32_t i = 0; i < a.nfailed; i++) {
        out->failed[i] = failed[i].key;
        if (out->reasons != NULL)
            out->reasons[i] = failed[i].reason;
    }
    free(failed);
    out->ntransferred = a.ntransferred;
    out->nmissing = a.nmissing;
    out->nfailed = a.nfailed;
    out->bytes = a.bytes;
    out->ns = a.ns;
    return KVT_OK;
}
