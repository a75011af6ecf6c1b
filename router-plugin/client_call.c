/*
 * router-plugin/client_call.c: libkvtier's blocking calls (query, events,
 * engines, stats, ping, drops): one request, then its answer, within the io
 * timeout (client.h).
 */
#include "kvtier/client.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "router-plugin/client_int.h"

/* ---- blocking calls ------------------------------------------------------------------------- */

/* Sends @req and waits for its answer (client_int.h). */
kvt_status_t kvt_cl_call(kvt_client_t *c, kvt_proto_wr_t *req, bool idempotent, cl_answer_t *ans)
{
    kvt_status_t st = KVT_OK;

    c->err[0] = '\0';
    if (c->nfl > 0)
        return kvt_cl_fail(c, KVT_ERR_INVAL,
                           "blocking call while %zu submitted queries are in flight", c->nfl);
    for (int attempt = 0; attempt < 2; attempt++) {
        bool reused = c->fd >= 0;
        if (reused && !kvt_cl_alive(c)) {
            kvt_cl_close(c); /* the server went away while we were idle */
            reused = false;
        }
        if (c->fd < 0) {
            st = kvt_cl_connect(c, 0);
            if (st != KVT_OK)
                return st;
        }
        if (req->len - KVT_PROTO_HDR_SIZE > c->max_body)
            return kvt_cl_fail(c, KVT_ERR_TOO_BIG,
                               "request body of %zu bytes is over the server's %u",
                               req->len - KVT_PROTO_HDR_SIZE, c->max_body);
        uint64_t id = c->next_id++;
        uint8_t *idp = req->buf + 8;
        for (int i = 0; i < 8; i++)
            idp[i] = (uint8_t)(id >> (8 * i));
        uint64_t deadline = kvt_clock_ms() + (uint64_t)c->io_ms;
        kvt_proto_wr_raw(&c->out, req->buf, req->len);
        if (c->out.oom) {
            kvt_proto_wr_reset(&c->out);
            return kvt_cl_fail(c, KVT_ERR_NO_MEM, "out of memory for the request");
        }
        uint8_t op = req->buf[5];
        st = kvt_cl_flush(c, deadline, true);
        while (st == KVT_OK) {
            bool got;
            st = kvt_cl_next_frame(c, &got, &ans->h, &ans->body);
            if (st != KVT_OK)
                break;
            if (!got) {
                st = kvt_cl_read(c, deadline, true);
                continue;
            }
            if (ans->h.req_id == 0 && (ans->h.flags & KVT_PROTO_F_ERROR) != 0) {
                /* The server refused our stream and is closing it. */
                st = kvt_cl_error_answer(c, &ans->h, ans->body);
                if (st == KVT_OK || (int)st > 0)
                    st = KVT_ERR_PROTO;
                break;
            }
            if (ans->h.req_id != id)
                continue; /* a stale answer to a request that timed out */
            if (ans->h.op != op) {
                st = kvt_cl_fail(c, KVT_ERR_PROTO, "answer to %s has opcode %s",
                                 kvt_proto_op_name(op), kvt_proto_op_name(ans->h.op));
                break;
            }
            if ((ans->h.flags & KVT_PROTO_F_ERROR) != 0) {
                st = kvt_cl_error_answer(c, &ans->h, ans->body);
                if (st == KVT_ERR_PROTO)
                    kvt_cl_close(c);
                return st == KVT_OK ? KVT_ERR_PEER : st;
            }
            c->err[0] = '\0'; /* a failed first attempt is not this call's failure */
            return KVT_OK;
        }
        kvt_cl_close(c);
        bool retry =
            idempotent && reused && attempt == 0 && (st == KVT_ERR_CLOSED || st == KVT_ERR_IO);
        if (!retry)
            return st;
    }
    return st;
}

/* Builds the QUERY request frame of @q into @w (the blocking calls patch req_id in later). */
kvt_status_t kvt_cl_build_query(kvt_client_t *c, kvt_proto_wr_t *w, uint64_t req_id,
                                const cl_q_t *q)
{
    kvt_proto_str_t podstr[16], *ps = podstr;
    kvt_status_t st;

    if (q->model == NULL || q->model[0] == '\0')
        return kvt_cl_fail(c, KVT_ERR_INVAL, "query: empty model name");
    if (q->n > 0 && q->vals == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "query: NULL %s with n %zu",
                           q->kind == KVT_PROTO_Q_TOKENS ? "tokens" : "keys", q->n);
    if (q->npods > 0 && q->pods == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "query: NULL pods with npods %zu", q->npods);
    if (q->n > UINT32_MAX || q->npods > UINT32_MAX)
        return kvt_cl_fail(c, KVT_ERR_TOO_BIG, "query: too many values or pods");
    size_t mlen = strlen(q->model), llen = q->lora != NULL ? strlen(q->lora) : 0;
    if (mlen > KVT_PROTO_MAX_STR || llen > KVT_PROTO_MAX_STR)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "query: model or lora name longer than %u bytes",
                           KVT_PROTO_MAX_STR);
    size_t slen = q->salt != NULL ? strlen(q->salt) : 0;
    if (slen > KVT_PROTO_MAX_STR)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "query: cache salt longer than %u bytes",
                           KVT_PROTO_MAX_STR);
    /* a salted token query is kind 2; no salt stays kind 0, which every server speaks */
    uint8_t kind = q->kind == KVT_PROTO_Q_TOKENS && slen > 0 ? KVT_PROTO_Q_TOKENS_SALTED : q->kind;
    if (q->npods > sizeof(podstr) / sizeof(podstr[0])) {
        ps = malloc(q->npods * sizeof(*ps));
        if (ps == NULL)
            return kvt_cl_fail(c, KVT_ERR_NO_MEM, "out of memory for %zu pod names", q->npods);
    }
    for (size_t i = 0; i < q->npods; i++) {
        size_t plen = q->pods[i] != NULL ? strlen(q->pods[i]) : 0;
        if (plen == 0 || plen > KVT_PROTO_MAX_STR) {
            st = kvt_cl_fail(c, KVT_ERR_INVAL,
                             "query: pod name %zu is empty or longer than %u bytes", i,
                             KVT_PROTO_MAX_STR);
            goto out;
        }
        ps[i].p = q->pods[i];
        ps[i].len = (uint16_t)plen;
    }
    kvt_proto_query_req_t r = {
        .model = {q->model, (uint16_t)mlen},
        .lora = {q->lora, (uint16_t)llen},
        .kind = kind,
        .n = (uint32_t)q->n,
        .tokens = q->kind == KVT_PROTO_Q_TOKENS ? q->vals : NULL,
        .keys = q->kind == KVT_PROTO_Q_KEYS ? q->vals : NULL,
        .npods = (uint32_t)q->npods,
        .pods = ps,
        .salt = {q->salt, (uint16_t)slen},
    };
    st = kvt_proto_query_req_encode(w, req_id, &r);
    if (st == KVT_ERR_TOO_BIG)
        kvt_cl_fail(c, st, "query: request larger than the protocol allows");
    else if (st != KVT_OK)
        kvt_cl_fail(c, st, "query: cannot encode the request: %s", kvt_status_str(st));
out:
    if (ps != podstr)
        free(ps);
    return st;
}

static kvt_status_t cl_query(kvt_client_t *c, const cl_q_t *q, kvt_client_result_t *res_p)
{
    kvt_proto_wr_t req;
    cl_answer_t ans;
    kvt_client_result_t r = {0};
    size_t cap = 0;

    if (c == NULL || res_p == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    kvt_proto_wr_init(&req);
    kvt_status_t st = kvt_cl_build_query(c, &req, 0, q);
    if (st == KVT_OK)
        st = kvt_cl_call(c, &req, true, &ans);
    if (st == KVT_OK) {
        st = kvt_cl_decode_result(c, ans.body, ans.h.body_len, &r, &cap);
        if (st == KVT_ERR_PROTO)
            kvt_cl_close(c);
    }
    kvt_proto_wr_cleanup(&req);
    if (st != KVT_OK) {
        free(r.pods);
        return st;
    }
    *res_p = r;
    return KVT_OK;
}

kvt_status_t kvt_client_query(kvt_client_t *c, const char *model, const char *lora,
                              const uint32_t *tokens, size_t n, const char *const *pods,
                              size_t npods, kvt_client_result_t *res_p)
{
    return kvt_client_query_salted(c, model, lora, NULL, tokens, n, pods, npods, res_p);
}

kvt_status_t kvt_client_query_salted(kvt_client_t *c, const char *model, const char *lora,
                                     const char *cache_salt, const uint32_t *tokens, size_t n,
                                     const char *const *pods, size_t npods,
                                     kvt_client_result_t *res_p)
{
    cl_q_t q = {model, lora, cache_salt, KVT_PROTO_Q_TOKENS, tokens, n, pods, npods};
    return cl_query(c, &q, res_p);
}

kvt_status_t kvt_client_query_keys(kvt_client_t *c, const char *model, const char *lora,
                                   const uint64_t *keys, size_t n, const char *const *pods,
                                   size_t npods, kvt_client_result_t *res_p)
{
    cl_q_t q = {model, lora, NULL, KVT_PROTO_Q_KEYS, keys, n, pods, npods};
    return cl_query(c, &q, res_p);
}

/* Sends @req and, when @answer_p is not NULL, returns the answer body as a
 * NUL-terminated string the caller frees. */
static kvt_status_t cl_call_text(kvt_client_t *c, kvt_proto_wr_t *req, bool idempotent,
                                 char **answer_p)
{
    cl_answer_t ans;
    kvt_status_t st = kvt_cl_call(c, req, idempotent, &ans);
    if (st != KVT_OK || answer_p == NULL)
        return st;
    char *text = malloc((size_t)ans.h.body_len + 1);
    if (text == NULL)
        return kvt_cl_fail(c, KVT_ERR_NO_MEM, "out of memory for a %u-byte answer", ans.h.body_len);
    if (ans.h.body_len > 0)
        memcpy(text, ans.body, ans.h.body_len);
    text[ans.h.body_len] = '\0';
    *answer_p = text;
    return KVT_OK;
}

/* A call whose request body is @body and whose answer is JSON text. */
static kvt_status_t cl_json_call(kvt_client_t *c, uint8_t op, const void *body, size_t len,
                                 bool idempotent, char **answer_p)
{
    kvt_proto_wr_t req;

    if (c == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    kvt_proto_wr_init(&req);
    kvt_status_t st = kvt_proto_raw_encode(&req, op, 0, 0, body, len);
    if (st != KVT_OK) {
        st = kvt_cl_fail(c, st, "%s: request of %zu bytes cannot be encoded: %s",
                         kvt_proto_op_name(op), len, kvt_status_str(st));
        goto out;
    }
    st = cl_call_text(c, &req, idempotent, answer_p);
out:
    kvt_proto_wr_cleanup(&req);
    return st;
}

kvt_status_t kvt_client_report_events(kvt_client_t *c, const char *json, size_t len,
                                      char **answer_p)
{
    if (json == NULL && len > 0)
        return c != NULL ? kvt_cl_fail(c, KVT_ERR_INVAL, "events: NULL body") : KVT_ERR_INVAL;
    return cl_json_call(c, KVT_PROTO_OP_EVENTS, json, len, false, answer_p);
}

kvt_status_t kvt_client_routed(kvt_client_t *c, const char *json, size_t len, char **answer_p)
{
    if (json == NULL)
        return c != NULL ? kvt_cl_fail(c, KVT_ERR_INVAL, "routed: NULL body") : KVT_ERR_INVAL;
    return cl_json_call(c, KVT_PROTO_OP_ROUTED, json, len, false, answer_p);
}

kvt_status_t kvt_client_add_engine(kvt_client_t *c, const char *json, size_t len, char **answer_p)
{
    if (json == NULL)
        return c != NULL ? kvt_cl_fail(c, KVT_ERR_INVAL, "engine add: NULL body") : KVT_ERR_INVAL;
    return cl_json_call(c, KVT_PROTO_OP_ENGINE_ADD, json, len, false, answer_p);
}

kvt_status_t kvt_client_stats(kvt_client_t *c, char **json_p)
{
    if (json_p == NULL)
        return c != NULL ? kvt_cl_fail(c, KVT_ERR_INVAL, "stats: NULL output") : KVT_ERR_INVAL;
    return cl_json_call(c, KVT_PROTO_OP_STATS, NULL, 0, true, json_p);
}

kvt_status_t kvt_client_ping(kvt_client_t *c)
{
    return cl_json_call(c, KVT_PROTO_OP_PING, NULL, 0, true, NULL);
}

/* ENGINE_DROP or MODEL_DROP of @name: a body of one name, answered with JSON. */
static kvt_status_t cl_drop(kvt_client_t *c, bool model, const char *name, char **answer_p)
{
    kvt_proto_wr_t req;
    const char *what = model ? "model drop" : "engine drop";

    if (c == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    size_t n = name != NULL ? strlen(name) : 0;
    if (n == 0 || n > KVT_PROTO_MAX_STR)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "%s: %s name empty or longer than %u bytes", what,
                           model ? "model" : "pod", KVT_PROTO_MAX_STR);
    kvt_proto_wr_init(&req);
    kvt_proto_str_t s = {name, (uint16_t)n};
    kvt_status_t st =
        model ? kvt_proto_model_drop_req_encode(&req, 0, s) : kvt_proto_drop_req_encode(&req, 0, s);
    if (st != KVT_OK) {
        st = kvt_cl_fail(c, st, "%s: cannot encode the request: %s", what, kvt_status_str(st));
        goto out;
    }
    st = cl_call_text(c, &req, false, answer_p);
out:
    kvt_proto_wr_cleanup(&req);
    return st;
}

kvt_status_t kvt_client_drop_engine(kvt_client_t *c, const char *pod, char **answer_p)
{
    return cl_drop(c, false, pod, answer_p);
}

kvt_status_t kvt_client_drop_model(kvt_client_t *c, const char *model, char **answer_p)
{
    return cl_drop(c, true, model, answer_p);
}
