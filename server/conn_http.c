/*
 * server/conn_http.c: the HTTP/1.1 front end of a connection: heads and
 * bodies of answers, the route table's dispatch with its checks (method,
 * probe reserve, bearer token, name segments), and reading requests one at
 * a time so answers keep their order.
 */
#define KVT_LOG_COMPONENT "conn"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/log.h"
#include "server/auth.h"
#include "server/conn_int.h"
#include "server/metrics.h"

/* ---- HTTP ------------------------------------------------------------------------ */

/* The status line and headers of an answer with a @len-byte body. */
static void http_head(kvt_srv_conn_t *c, int status, const char *ctype, size_t len, bool keep_alive)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    /* the head without printf: it is on every answer's path */
    const char *reason = kvt_http_reason(status);
    /* both are kvtierd's own constants, far shorter than this (the cap only bounds h) */
    size_t rl = strnlen(reason, 80), cl = strnlen(ctype, 80);
    char h[80 + 80 + 96];
    char *o = KVT_JSON_PUT_LIT(h, "HTTP/1.1 ");
    o = kvt_json_put_u64(o, (uint64_t)status);
    *o++ = ' ';
    o = kvt_json_put_raw(o, reason, rl);
    o = KVT_JSON_PUT_LIT(o, "\r\nContent-Type: ");
    o = kvt_json_put_raw(o, ctype, cl);
    o = KVT_JSON_PUT_LIT(o, "\r\nContent-Length: ");
    o = kvt_json_put_u64(o, len);
    o = keep_alive ? KVT_JSON_PUT_LIT(o, "\r\n\r\n")
                   : KVT_JSON_PUT_LIT(o, "\r\nConnection: close\r\n\r\n");
    evbuffer_add(out, h, (size_t)(o - h));
    if (!keep_alive)
        c->close_after = true;
}

void http_respond(kvt_srv_conn_t *c, int status, const char *ctype, const char *body, size_t len,
                  bool keep_alive)
{
    if (c->bev == NULL)
        return;
    http_head(c, status, ctype, len, keep_alive);
    evbuffer_add(bufferevent_get_output(c->bev), body, len);
}

/* A 200 answer whose body is shared body @b (takes the caller's reference). */
static void http_respond_blob(kvt_srv_conn_t *c, const char *ctype, srv_blob_t *b, bool keep_alive)
{
    if (c->bev == NULL) {
        srv_blob_unref(b);
        return;
    }
    http_head(c, 200, ctype, b->len, keep_alive);
    conn_add_blob(c, b);
}

void http_json(kvt_srv_conn_t *c, int status, const kvt_jbuf_t *b, bool keep_alive)
{
    if (b->oom) {
        static const char oom[] = "{\"error\":\"out of memory\"}";
        http_respond(c, 503, "application/json", oom, sizeof(oom) - 1, keep_alive);
        return;
    }
    http_respond(c, status, "application/json", b->buf, b->len, keep_alive);
}

void http_error(kvt_srv_conn_t *c, int status, const char *msg, bool keep_alive)
{
    kvt_jbuf_t *b = &c->w->out;
    kvt_jbuf_reset(b);
    kvt_jbuf_cstr(b, "{\"error\":");
    kvt_jbuf_str(b, msg, strlen(msg));
    kvt_jbuf_cstr(b, "}");
    http_json(c, status, b, keep_alive);
}

static bool http_authorized(kvt_srv_conn_t *c, const kvt_http_req_t *r)
{
    kvt_srv_t *srv = c->w->srv;
    if (srv->auth_token == NULL)
        return true;
    if (r->auth == NULL || r->auth_len < 7 || strncasecmp(r->auth, "Bearer ", 7) != 0)
        return false;
    return srv_auth_ok(srv, r->auth + 7, r->auth_len - 7);
}

/*
 * Routes one complete request through the route table and sends what its
 * handler left. Returns the call (for metrics) and its status via *status_p,
 * or -1 in *status_p when the answer comes later from the writer.
 */
static enum srv_call http_dispatch(kvt_srv_conn_t *c, const kvt_http_req_t *r, const char *body,
                                   uint64_t t0, int *status_p)
{
    kvt_srv_worker_t *w = c->w;
    bool ka = r->keep_alive && !c->probe; /* the probe reserve serves one probe per connection */
    const srv_route_t *rt = srv_route_http(r->path, r->path_len);
    enum srv_call call = rt ? rt->call : CALL_OTHER;
    char err[256];
    srv_req_t rq = {.w = w,
                    .method = r->method,
                    .query = r->query,
                    .query_len = r->query_len,
                    .fd = bufferevent_getfd(c->bev),
                    .proto = PROTO_HTTP,
                    .body = (const uint8_t *)body,
                    .len = r->body_len,
                    .err = err,
                    .errlen = sizeof(err)};
    srv_result_t res;
    char name[KVT_IDX_MAX_NAME + 1];
    if (c->probe && !(rt != NULL && rt->probe && r->method == KVT_HTTP_GET)) {
        res = (srv_result_t){.out = OUT_ERROR, .status = 503, .msg = "too many connections"};
    } else if (rt == NULL || rt->http == NULL) {
        res = (srv_result_t){.out = OUT_ERROR, .status = 404, .msg = "no such path"};
    } else if (rt->method != SRV_ANY_METHOD && r->method != rt->method) {
        res = (srv_result_t){.out = OUT_ERROR, .status = 405, .msg = "method not allowed"};
    } else if (rt->auth && !http_authorized(c, r)) {
        res =
            (srv_result_t){.out = OUT_ERROR, .status = 401, .msg = "missing or wrong bearer token"};
    } else {
        long n = 0;
        if (rt->name_what != NULL) {
            /*
             * The segment after the route's path is a name, percent-decoded: a
             * name holding '/', '%', '?', '#', spaces or non-ASCII bytes is sent
             * escaped (%2F for '/': model names such as meta-llama/Llama-3.1-8B
             * have one), so any name that can be created can be deleted. A raw
             * '/' would start another segment: no such path.
             */
            size_t at = strlen(rt->path);
            const char *enc = r->path + at;
            size_t elen = r->path_len - at;
            n = memchr(enc, '/', elen) != NULL ? -2
                                               : kvt_http_pct_decode(enc, elen, name, sizeof(name));
            rq.name = name;
        }
        if (n == -2) {
            kvt_errf(rq.err, rq.errlen, "no such path (escape a '/' in a %s name as %%2F)",
                     rt->name_what);
            res = (srv_result_t){.out = OUT_ERROR, .status = 404, .msg = rq.err};
        } else if (n < 0) {
            kvt_errf(rq.err, rq.errlen,
                     "bad %s name in path: a bad %%-escape, %%00, or over %u bytes", rt->name_what,
                     KVT_IDX_MAX_NAME);
            res = (srv_result_t){.out = OUT_ERROR, .status = 400, .msg = rq.err};
        } else {
            rt->http(&rq, &res);
        }
    }
    if (res.out == OUT_ASYNC) {
        c->busy = true;
        c->keep_alive = ka;
        conn_start_async(c, rt, res.job, res.start, 0, t0);
        *status_p = -1;
        return call;
    }
    if (res.out == OUT_JOB) {
        if (conn_post_job(c, rt, res.job, 0, t0) == KVT_OK) {
            c->busy = true;
            c->keep_alive = ka;
            *status_p = -1;
            return call;
        }
        res = (srv_result_t){
            .out = OUT_ERROR, .status = 503, .msg = "writer queue full or stopping: retry"};
    }
    switch (res.out) {
    case OUT_JSON: http_json(c, res.status, &w->out, ka); break;
    case OUT_TEXT: http_respond(c, res.status, res.ctype, res.text, res.len, ka); break;
    case OUT_BLOB: http_respond_blob(c, res.ctype, res.blob, ka); break;
    default: http_error(c, res.status, res.msg ? res.msg : "internal error", ka); break;
    }
    *status_p = res.status;
    return call;
}

void http_read(kvt_srv_conn_t *c)
{
    kvt_srv_worker_t *w = c->w;
    kvt_srv_t *srv = w->srv;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    /* answers wait in order: past the output budget, the rest waits for the client to read */
    while (c->bev != NULL && !c->busy && !c->close_after && !conn_backed_up(c)) {
        size_t len = evbuffer_get_length(in);
        if (len == 0)
            return;
        uint64_t t0 = kvt_clock_ns();
        size_t look = len < srv->cfg.max_header ? len : srv->cfg.max_header;
        const char *p = (const char *)evbuffer_pullup(in, (ssize_t)look);
        kvt_http_req_t r;
        int status = 0;
        char why[128];
        int got = kvt_http_parse_head(p, look, srv->cfg.max_header, &r, &status, why, sizeof(why));
        if (got == 0) {
            request_started(c);
            return;
        }
        if (got < 0) {
            request_started(c);
            http_error(c, status, why, false);
            srv_count(w, PROTO_HTTP, CALL_OTHER, status, t0);
            break;
        }
        if (c->probe && r.body_len > 0) {
            request_started(c);
            http_error(c, 503, "too many connections", false); /* probes carry no body */
            srv_count(w, PROTO_HTTP, CALL_OTHER, 503, t0);
            break;
        }
        if (r.body_len > srv->cfg.max_body) {
            char msg[96];
            snprintf(msg, sizeof(msg), "body of %llu bytes is over the limit of %llu",
                     (unsigned long long)r.body_len, (unsigned long long)srv->cfg.max_body);
            request_started(c);
            http_error(c, 413, msg, false); /* the body is not read: the connection ends */
            srv_count(w, PROTO_HTTP, CALL_OTHER, 413, t0);
            break;
        }
        size_t total = r.head_len + (size_t)r.body_len;
        if (len < total) {
            request_started(c);
            if (r.expect_continue && !c->sent_continue) {
                evbuffer_add_printf(bufferevent_get_output(c->bev),
                                    "HTTP/1.1 100 Continue\r\n\r\n");
                c->sent_continue = true;
            }
            return;
        }
        p = (const char *)evbuffer_pullup(in, (ssize_t)total);
        /* the parse result points into the first pullup, which may have moved */
        kvt_http_parse_head(p, r.head_len, srv->cfg.max_header, &r, &status, NULL, 0);
        enum srv_call call = http_dispatch(c, &r, p + r.head_len, t0, &status);
        evbuffer_drain(in, total);
        request_finished(c);
        if (status >= 0) /* else the writer answers: srv_conn_job_done() counts it */
            srv_count(w, PROTO_HTTP, call, status, t0);
    }
    conn_update_reading(c);
}
