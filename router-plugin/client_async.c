/*
 * router-plugin/client_async.c: libkvtier's submitted queries for event-loop
 * routers: submit, then progress() when the fd is ready; answers come back
 * through the callback, in any order (client.h).
 */
#include "kvtier/client.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "router-plugin/client_int.h"

/* ---- asynchronous queries ------------------------------------------------------------------- */

/* Marks every waiting query failed with @st (reported by the next progress) and closes. */
static void cl_break(kvt_client_t *c, kvt_status_t st)
{
    for (size_t i = 0; i < c->nfl; i++)
        if (c->fl[i].st == KVT_OK)
            c->fl[i].st = st;
    kvt_cl_close(c);
}

static void cl_fl_remove(kvt_client_t *c, size_t i)
{
    memmove(&c->fl[i], &c->fl[i + 1], (c->nfl - i - 1) * sizeof(c->fl[0]));
    c->nfl--;
}

/* Queues @q on @c (connecting first, within @limit when not 0) and writes what the socket takes. */
kvt_status_t kvt_cl_submit(kvt_client_t *c, const cl_q_t *q, uint64_t limit, uint64_t *req_id_p)
{
    if (c == NULL || req_id_p == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    if (c->fd >= 0 && c->nfl == 0 && c->out.len == 0 && !kvt_cl_alive(c))
        kvt_cl_close(c);
    if (c->fd < 0) {
        kvt_status_t st = kvt_cl_connect(c, limit);
        if (st != KVT_OK)
            return st;
    }
    if (!kvt_grow(&c->fl, &c->fl_cap, c->nfl + 1, sizeof(*c->fl), 16))
        return kvt_cl_fail(c, KVT_ERR_NO_MEM, "out of memory for in-flight queries");
    uint64_t id = c->next_id++;
    size_t off = c->out.len;
    kvt_status_t st = kvt_cl_build_query(c, &c->out, id, q);
    if (st != KVT_OK)
        return st;
    if (c->out.len - off - KVT_PROTO_HDR_SIZE > c->max_body) {
        size_t body = c->out.len - off - KVT_PROTO_HDR_SIZE;
        c->out.len = off;
        return kvt_cl_fail(c, KVT_ERR_TOO_BIG, "request body of %zu bytes is over the server's %u",
                           body, c->max_body);
    }
    c->fl[c->nfl].id = id;
    c->fl[c->nfl].st = KVT_OK;
    c->nfl++;
    st = kvt_cl_flush(c, 0, false);
    if (st != KVT_OK) {
        /* This one fails now; the others are reported by the next progress. */
        c->nfl--;
        char msg[CL_ERR_SIZE];
        memcpy(msg, c->err, sizeof(msg));
        cl_break(c, st);
        memcpy(c->err, msg, sizeof(msg));
        return st;
    }
    *req_id_p = id;
    return KVT_OK;
}

kvt_status_t kvt_client_query_submit(kvt_client_t *c, const char *model, const char *lora,
                                     const uint32_t *tokens, size_t n, const char *const *pods,
                                     size_t npods, uint64_t *req_id_p)
{
    return kvt_client_query_salted_submit(c, model, lora, NULL, tokens, n, pods, npods, req_id_p);
}

kvt_status_t kvt_client_query_salted_submit(kvt_client_t *c, const char *model, const char *lora,
                                            const char *cache_salt, const uint32_t *tokens,
                                            size_t n, const char *const *pods, size_t npods,
                                            uint64_t *req_id_p)
{
    cl_q_t q = {model, lora, cache_salt, KVT_PROTO_Q_TOKENS, tokens, n, pods, npods};
    return kvt_cl_submit(c, &q, 0, req_id_p);
}

kvt_status_t kvt_client_query_keys_submit(kvt_client_t *c, const char *model, const char *lora,
                                          const uint64_t *keys, size_t n, const char *const *pods,
                                          size_t npods, uint64_t *req_id_p)
{
    cl_q_t q = {model, lora, NULL, KVT_PROTO_Q_KEYS, keys, n, pods, npods};
    return kvt_cl_submit(c, &q, 0, req_id_p);
}

/* Reports (and forgets) every failed in-flight query. */
static void cl_report_failed(kvt_client_t *c, kvt_client_cb cb, void *arg)
{
    for (size_t i = 0; i < c->nfl;) {
        if (c->fl[i].st == KVT_OK) {
            i++;
            continue;
        }
        cl_flight_t f = c->fl[i];
        cl_fl_remove(c, i);
        if (cb != NULL)
            cb(arg, f.id, f.st, NULL); /* may submit: restart the scan */
        i = 0;
    }
}

/* Handles one answer frame in progress(). Returns KVT_OK or a connection-fatal error. */
static kvt_status_t cl_dispatch(kvt_client_t *c, const kvt_proto_hdr_t *h, const uint8_t *body,
                                kvt_client_cb cb, void *arg)
{
    if (h->req_id == 0 && (h->flags & KVT_PROTO_F_ERROR) != 0) {
        kvt_status_t st = kvt_cl_error_answer(c, h, body);
        return st == KVT_OK || (int)st > 0 ? KVT_ERR_PROTO : st;
    }
    size_t i = 0;
    while (i < c->nfl && (c->fl[i].id != h->req_id || c->fl[i].st != KVT_OK))
        i++;
    if (i == c->nfl)
        return KVT_OK; /* stale */
    if (h->op != KVT_PROTO_OP_QUERY)
        return kvt_cl_fail(c, KVT_ERR_PROTO, "answer to QUERY has opcode %s",
                           kvt_proto_op_name(h->op));
    kvt_status_t st;
    if ((h->flags & KVT_PROTO_F_ERROR) != 0) {
        st = kvt_cl_error_answer(c, h, body);
        if (st == KVT_ERR_PROTO)
            return st;
    } else {
        st = kvt_cl_decode_result(c, body, h->body_len, &c->cbres, &c->cbcap);
        if (st == KVT_ERR_PROTO)
            return st;
    }
    cl_fl_remove(c, i);
    if (cb != NULL)
        cb(arg, h->req_id, st, st == KVT_OK ? &c->cbres : NULL);
    return KVT_OK;
}

kvt_status_t kvt_client_progress(kvt_client_t *c, kvt_client_cb cb, void *arg)
{
    if (c == NULL)
        return KVT_ERR_INVAL;
    cl_report_failed(c, cb, arg);
    if (c->fd < 0)
        return KVT_OK;
    kvt_status_t st = KVT_OK;
    if (c->out.len > 0)
        st = kvt_cl_flush(c, 0, false);
    while (st == KVT_OK && c->fd >= 0) {
        bool got;
        kvt_proto_hdr_t h;
        const uint8_t *body;
        st = kvt_cl_next_frame(c, &got, &h, &body);
        if (st != KVT_OK)
            break;
        if (got) {
            /* The callback may submit (appending to out) but never reads, so body stays valid. */
            st = cl_dispatch(c, &h, body, cb, arg);
            continue;
        }
        size_t before = c->in_len - c->in_off;
        st = kvt_cl_read(c, 0, false);
        if (st == KVT_OK && c->in_len - c->in_off == before)
            return KVT_OK; /* nothing more has arrived */
    }
    if (st == KVT_OK)
        return KVT_OK;
    cl_break(c, st);
    cl_report_failed(c, cb, arg);
    return st;
}
