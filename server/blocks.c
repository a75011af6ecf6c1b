/*
 * server/blocks.c: the tiers' calls. The block API (PUT, GET, DELETE
 * /v1/blocks/{key} and RPC BLOCK_*), prefetch (POST /v1/prefetch, RPC
 * PREFETCH) and the engine's data plane over RPC (ATTACH, LOOKUP, RESERVE,
 * COMMIT, PIN, UNPIN). Calls that may wait on NVMe (put, get, delete, pin)
 * answer later: the handler leaves a JOB_TIER whose start the front end runs
 * once the job is tied to its connection, and the tier's callback posts the
 * finished job to the worker's box. The rest answer at once.
 */
#define KVT_LOG_COMPONENT "blocks"

#include "server/blocks.h"
#include "server/blockq.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/errtext.h"
#include "common/grow.h"
#include "kvindex/hash.h"
#include "server/http.h"
#include "server/mailbox.h"
#include "server/tier.h"
#include "tiers/tiers.h"

#define NS_MAX SRV_TIER_NS_MAX

typedef struct srv_tier_call {
    uint8_t op; /* KVT_PROTO_OP_BLOCK_PUT, _GET, _DELETE, _PIN */
    enum srv_proto proto;
    char ns[NS_MAX];
    size_t ns_len;
    uint64_t key;
    bool durable;
    uint64_t *keys; /* PIN */
    uint32_t n;
    const uint8_t *data; /* BLOCK_PUT: the request's bytes, valid until the start returns */
    size_t len;
    kvt_tier_sess_t *sess; /* PIN */
} srv_tier_call_t;

void srv_tier_call_free(srv_tier_call_t *tc)
{
    if (tc == NULL)
        return;
    free(tc->keys);
    free(tc);
}

static void error(srv_result_t *res, int status, kvt_status_t st, const char *msg)
{
    *res = (srv_result_t){.out = OUT_ERROR, .status = status, .st = st, .msg = msg};
}

/* The tier, or an error answer when this kvtierd has none. */
static kvt_tier_t *tier_or_error(srv_req_t *rq, srv_result_t *res)
{
    kvt_tier_t *t = rq->w->srv->tier;
    if (t == NULL)
        error(res, 501, KVT_ERR_UNSUPPORTED,
              "this kvtierd holds no blocks: start it with --ram-bytes (docs/tiers.md)");
    return t;
}

/* ---- finishing a job ------------------------------------------------------------------ */

static void job_error(srv_job_t *job, kvt_status_t st, int http, const char *msg)
{
    job->st = st;
    job->http_status = http;
    job->ctype = NULL;
    kvt_errf(job->errmsg, sizeof(job->errmsg), "%s", msg);
    kvt_jbuf_reset(&job->answer);
    if (job->tc->proto == PROTO_HTTP) {
        kvt_jbuf_cstr(&job->answer, "{\"error\":");
        kvt_jbuf_str(&job->answer, job->errmsg, strlen(job->errmsg));
        kvt_jbuf_cstr(&job->answer, "}");
    }
}

static void job_post(srv_job_t *job)
{
    if (job->answer.oom)
        job_error(job, KVT_ERR_NO_MEM, 503, "out of memory");
    srv_mbox_post(&job->worker->box, job); /* a worker's box is never closed while it runs */
}

/* The status a failed tier call answers with. */
static int tier_http(kvt_status_t st)
{
    switch (st) {
    case KVT_ERR_EXISTS: return 409;
    case KVT_ERR_NOT_FOUND: return 404;
    default: return kvt_proto_http_status(st);
    }
}

static const char *tier_msg(kvt_status_t st)
{
    switch (st) {
    case KVT_ERR_NOT_FOUND: return "block not found";
    case KVT_ERR_EXISTS: return "block busy: pinned, reserved or being moved; retry";
    case KVT_ERR_TOO_BIG: return "block larger than --block-bytes";
    case KVT_ERR_NO_SPACE: return "no slot could be freed: every block is pinned or reserved";
    case KVT_ERR_UNSUPPORTED: return "durable=1 needs an NVMe tier (--disk-path)";
    case KVT_ERR_IO: return "the NVMe write or its metadata failed";
    case KVT_ERR_CLOSED: return "kvtierd is stopping";
    default: return kvt_status_str(st);
    }
}

static void put_done(void *arg, kvt_status_t st)
{
    srv_job_t *job = arg;
    srv_tier_call_t *tc = job->tc;
    if (st != KVT_OK) {
        job_error(job, st, tier_http(st), tier_msg(st));
    } else {
        job->st = KVT_OK;
        job->http_status = tc->proto == PROTO_HTTP ? 201 : 200;
        if (tc->proto == PROTO_HTTP) {
            kvt_jbuf_cstr(&job->answer, "{\"key\":");
            kvt_jbuf_u64(&job->answer, tc->key);
            kvt_jbuf_cstr(&job->answer,
                          tc->durable ? ",\"stored\":\"disk\"}" : ",\"stored\":\"ram\"}");
        }
    }
    job_post(job);
}

static void get_done(void *arg, kvt_status_t st, const void *data, size_t len)
{
    srv_job_t *job = arg;
    if (st != KVT_OK) {
        job_error(job, st, tier_http(st), tier_msg(st));
    } else {
        job->st = KVT_OK;
        job->http_status = 200;
        job->ctype = "application/octet-stream";
        kvt_jbuf_raw(&job->answer, data, len); /* copied while the tier holds the pin */
    }
    job_post(job);
}

static void delete_done(void *arg, kvt_status_t st)
{
    srv_job_t *job = arg;
    if (st != KVT_OK) {
        job_error(job, st, tier_http(st), tier_msg(st));
    } else {
        job->st = KVT_OK;
        job->http_status = 200;
        if (job->tc->proto == PROTO_HTTP)
            kvt_jbuf_cstr(&job->answer, "{\"deleted\":true}");
    }
    job_post(job);
}

static void pin_done(void *arg, const kvt_tier_pinned_t *out, size_t n)
{
    srv_job_t *job = arg;
    kvt_proto_wr_t wr;
    kvt_proto_wr_init(&wr);
    kvt_proto_pinned_t *pins = malloc((n > 0 ? n : 1) * sizeof(*pins));
    if (pins == NULL) {
        job_error(job, KVT_ERR_NO_MEM, 503, "out of memory");
    } else {
        for (size_t i = 0; i < n; i++)
            pins[i] = (kvt_proto_pinned_t){.slot = out[i].slot, .len = out[i].len};
        /* the answer's body, without the frame header the front end writes itself */
        kvt_proto_pin_ans_encode(&wr, job->req_id, pins, (uint32_t)n);
        if (wr.oom || wr.bad || wr.len < KVT_PROTO_HDR_SIZE) {
            job_error(job, KVT_ERR_NO_MEM, 503, "out of memory");
        } else {
            job->st = KVT_OK;
            job->http_status = 200;
            kvt_jbuf_raw(&job->answer, (const char *)wr.buf + KVT_PROTO_HDR_SIZE,
                         wr.len - KVT_PROTO_HDR_SIZE);
        }
    }
    free(pins);
    kvt_proto_wr_cleanup(&wr);
    job_post(job);
}

/* Runs the tier call of @job, which the front end has tied to its connection. */
static void tier_start(srv_job_t *job)
{
    srv_tier_call_t *tc = job->tc;
    kvt_tier_t *t = job->worker->srv->tier;
    kvt_jbuf_init(&job->answer);
    kvt_status_t st;
    switch (tc->op) {
    case KVT_PROTO_OP_BLOCK_PUT:
        st = kvt_tier_put(t, tc->ns, tc->ns_len, tc->key, tc->data, tc->len, tc->durable, put_done,
                          job);
        break;
    case KVT_PROTO_OP_BLOCK_GET:
        st = kvt_tier_get(t, tc->ns, tc->ns_len, tc->key, get_done, job);
        break;
    case KVT_PROTO_OP_BLOCK_DELETE:
        st = kvt_tier_delete(t, tc->ns, tc->ns_len, tc->key, delete_done, job);
        break;
    default:
        st = kvt_tier_pin(t, tc->sess, tc->ns, tc->ns_len, tc->keys, tc->n, pin_done, job);
        break;
    }
    tc->data = NULL; /* the request's bytes go with the request */
    if (st != KVT_OK) {
        job_error(job, st, tier_http(st), tier_msg(st));
        job_post(job);
    }
}

/* A JOB_TIER for @rq, or NULL (an error answer set). */
static srv_job_t *tier_job(srv_req_t *rq, srv_result_t *res, uint8_t op)
{
    srv_job_t *job = calloc(1, sizeof(*job));
    srv_tier_call_t *tc = calloc(1, sizeof(*tc));
    if (job == NULL || tc == NULL) {
        free(job);
        free(tc);
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        return NULL;
    }
    job->kind = JOB_TIER;
    job->worker = rq->w;
    job->tc = tc;
    tc->op = op;
    tc->proto = rq->proto;
    return job;
}

static void async(srv_result_t *res, srv_job_t *job)
{
    *res = (srv_result_t){.out = OUT_ASYNC, .status = 200, .job = job, .start = tier_start};
}

/* ---- the block API over HTTP ---------------------------------------------------------- */

void srv_h_block_http(srv_req_t *rq, srv_result_t *res)
{
    kvt_tier_t *t = tier_or_error(rq, res);
    if (t == NULL)
        return;
    uint8_t op;
    switch (rq->method) {
    case KVT_HTTP_PUT: op = KVT_PROTO_OP_BLOCK_PUT; break;
    case KVT_HTTP_GET: op = KVT_PROTO_OP_BLOCK_GET; break;
    case KVT_HTTP_DELETE: op = KVT_PROTO_OP_BLOCK_DELETE; break;
    default: error(res, 405, KVT_ERR_INVAL, "method not allowed (PUT, GET or DELETE)"); return;
    }
    uint64_t key;
    if (!srv_block_key_parse(rq->name, &key)) {
        error(res, 400, KVT_ERR_INVAL, "a block key is an unsigned 64-bit decimal");
        return;
    }
    srv_block_query_t q;
    if (srv_block_query_parse(rq->query, rq->query_len, &q, rq->err, rq->errlen) != KVT_OK) {
        error(res, 400, KVT_ERR_INVAL, rq->err);
        return;
    }
    kvt_tier_geom_t g;
    kvt_tier_geom(t, &g);
    if (op == KVT_PROTO_OP_BLOCK_PUT && rq->len == 0) {
        error(res, 400, KVT_ERR_INVAL, "an empty block: the body holds the block's bytes");
        return;
    }
    if (op == KVT_PROTO_OP_BLOCK_PUT && rq->len > g.block_bytes) {
        kvt_errf(rq->err, rq->errlen, "a block of %zu bytes is larger than --block-bytes (%u)",
                 rq->len, g.block_bytes);
        error(res, 413, KVT_ERR_TOO_BIG, rq->err);
        return;
    }
    if (op != KVT_PROTO_OP_BLOCK_PUT && q.durable) {
        error(res, 400, KVT_ERR_INVAL, "durable goes with PUT only");
        return;
    }
    srv_job_t *job = tier_job(rq, res, op);
    if (job == NULL)
        return;
    srv_tier_call_t *tc = job->tc;
    tc->ns_len =
        srv_tier_ns(q.model, strlen(q.model), q.lora, strlen(q.lora), q.engine_keys, tc->ns);
    tc->key = key;
    tc->durable = q.durable;
    tc->data = rq->body;
    tc->len = rq->len;
    async(res, job);
}

/* ---- the block API over RPC ----------------------------------------------------------- */

/* A namespace from an RPC str model and lora; false (an error set) when bad. */
static bool rpc_ns(srv_req_t *rq, srv_result_t *res, kvt_proto_str_t m, kvt_proto_str_t l, char *ns,
                   size_t *ns_len_p)
{
    if (m.len == 0) {
        error(res, 400, KVT_ERR_INVAL, "model must not be empty");
        return false;
    }
    bool engine = (rq->flags & KVT_PROTO_F_ENGINE_KEYS) != 0;
    *ns_len_p = srv_tier_ns(m.p, m.len, l.p, l.len, engine, ns);
    return true;
}

void srv_h_block_put_rpc(srv_req_t *rq, srv_result_t *res)
{
    kvt_tier_t *t = tier_or_error(rq, res);
    if (t == NULL)
        return;
    kvt_proto_block_put_t p;
    kvt_status_t st = kvt_proto_block_put_req_decode(rq->body, rq->len, &p, rq->err, rq->errlen);
    if (st != KVT_OK) {
        error(res, kvt_proto_http_status(st), st, rq->err);
        return;
    }
    kvt_tier_geom_t g;
    kvt_tier_geom(t, &g);
    if (p.len > g.block_bytes) {
        kvt_errf(rq->err, rq->errlen, "a block of %u bytes is larger than --block-bytes (%u)",
                 p.len, g.block_bytes);
        error(res, 413, KVT_ERR_TOO_BIG, rq->err);
        return;
    }
    srv_job_t *job = tier_job(rq, res, KVT_PROTO_OP_BLOCK_PUT);
    if (job == NULL)
        return;
    srv_tier_call_t *tc = job->tc;
    if (!rpc_ns(rq, res, p.model, p.lora, tc->ns, &tc->ns_len)) {
        srv_job_free(job);
        return;
    }
    tc->key = p.key;
    tc->durable = p.durable;
    tc->data = p.data;
    tc->len = p.len;
    async(res, job);
}

/* BLOCK_GET and BLOCK_DELETE. */
void srv_h_block_key_rpc(srv_req_t *rq, srv_result_t *res)
{
    kvt_tier_t *t = tier_or_error(rq, res);
    if (t == NULL)
        return;
    kvt_proto_block_key_t k;
    kvt_status_t st = kvt_proto_block_key_req_decode(rq->body, rq->len, &k, rq->err, rq->errlen);
    if (st != KVT_OK) {
        error(res, kvt_proto_http_status(st), st, rq->err);
        return;
    }
    srv_job_t *job = tier_job(rq, res, rq->op);
    if (job == NULL)
        return;
    if (!rpc_ns(rq, res, k.model, k.lora, job->tc->ns, &job->tc->ns_len)) {
        srv_job_free(job);
        return;
    }
    job->tc->key = k.key;
    async(res, job);
}

/* ---- the engine's data plane (RPC) ---------------------------------------------------- */

/*
 * A data-plane call on a KEYS body: its tier, the decoded request and its
 * namespace. The keys are in the worker's scratch (w->keys), which also has
 * room for one u32 (u32) and one u64 (u64) per key for the answer: no
 * allocation per call.
 */
typedef struct keys_call {
    kvt_tier_t *t;
    kvt_proto_keys_t k;
    char ns[NS_MAX];
    size_t ns_len;
    uint32_t *u32;
    uint64_t *u64;
} keys_call_t;

/* Decodes @rq's KEYS body into @c; false with an error answer set. */
static bool keys_call(srv_req_t *rq, srv_result_t *res, keys_call_t *c)
{
    kvt_srv_worker_t *w = rq->w;
    if ((c->t = tier_or_error(rq, res)) == NULL)
        return false;
    size_t need = rq->len / 8 + 1; /* a key takes 8 bytes of the body */
    if (!kvt_grow(&w->keys, &w->keys_cap, 2 * need, sizeof(uint64_t), 1024) ||
        !kvt_grow(&w->tokens, &w->tokens_cap, need, sizeof(uint32_t), 1024)) {
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        return false;
    }
    kvt_status_t st = kvt_proto_keys_req_decode(rq->body, rq->len, w->keys, (uint32_t)need, &c->k,
                                                rq->err, rq->errlen);
    if (st != KVT_OK) {
        error(res, kvt_proto_http_status(st), st, rq->err);
        return false;
    }
    c->u32 = w->tokens;
    c->u64 = w->keys + need;
    return rpc_ns(rq, res, c->k.model, c->k.lora, c->ns, &c->ns_len);
}

/* The connection's tier session, opened on first use; NULL with an error answer set. */
static kvt_tier_sess_t *sess_of(srv_req_t *rq, srv_result_t *res, kvt_tier_t *t)
{
    if (*rq->sess == NULL)
        *rq->sess = kvt_tier_sess_open(t);
    if (*rq->sess == NULL)
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
    return *rq->sess;
}

static void frames(srv_result_t *res)
{
    *res = (srv_result_t){.out = OUT_FRAMES, .status = 200};
}

void srv_h_attach(srv_req_t *rq, srv_result_t *res)
{
    kvt_tier_t *t = tier_or_error(rq, res);
    if (t == NULL)
        return;
    kvt_status_t st = kvt_proto_empty_decode(rq->op, rq->len, rq->err, rq->errlen);
    if (st != KVT_OK) {
        error(res, 400, st, rq->err);
        return;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(rq->fd, (struct sockaddr *)&ss, &sl) != 0 || ss.ss_family != AF_UNIX) {
        error(res, 400, KVT_ERR_INVAL,
              "ATTACH passes the arena's fd: call it on the Unix socket (--rpc-unix)");
        return;
    }
    kvt_tier_geom_t g;
    kvt_tier_geom(t, &g);
    const char *path = rq->w->srv->cfg.arena_name;
    char full[300] = "";
    if (path[0] != '\0' && path[0] != '/')
        kvt_errf(full, sizeof(full), "/dev/shm/%s", path);
    else
        kvt_errf(full, sizeof(full), "%s", path);
    kvt_proto_attach_ans_t a = {.map_bytes = g.map_bytes,
                                .slot_off = g.slot_off,
                                .slot_bytes = g.slot_bytes,
                                .nslots = g.nslots,
                                .block_bytes = g.block_bytes,
                                .disk_slots = g.disk_slots,
                                .arena_path = {full, (uint16_t)strlen(full)}};
    kvt_proto_attach_ans_encode(rq->wr, rq->req_id, &a);
    frames(res);
    res->pass_fd = g.fd;
}

void srv_h_lookup(srv_req_t *rq, srv_result_t *res)
{
    keys_call_t c;
    if (!keys_call(rq, res, &c))
        return;
    /* the tier's locations are the protocol's (1 RAM, 2 DISK) */
    uint8_t *loc = (uint8_t *)c.u32;
    size_t hit = kvt_tier_lookup(c.t, c.ns, c.ns_len, rq->w->keys, c.k.n, loc);
    kvt_proto_lookup_ans_encode(rq->wr, rq->req_id, loc, (uint32_t)hit);
    frames(res);
}

void srv_h_reserve(srv_req_t *rq, srv_result_t *res)
{
    keys_call_t c;
    if (!keys_call(rq, res, &c))
        return;
    kvt_tier_sess_t *s = sess_of(rq, res, c.t);
    if (s == NULL)
        return;
    size_t nev = 0;
    kvt_status_t st =
        kvt_tier_reserve(c.t, s, c.ns, c.ns_len, rq->w->keys, c.k.n, c.u32, c.u64, c.k.n, &nev);
    if (st != KVT_OK) {
        error(res, tier_http(st), st, tier_msg(st));
        return;
    }
    kvt_proto_reserve_ans_encode(rq->wr, rq->req_id, c.u32, c.k.n, c.u64,
                                 (uint32_t)(nev < c.k.n ? nev : c.k.n));
    frames(res);
}

void srv_h_commit(srv_req_t *rq, srv_result_t *res)
{
    kvt_tier_t *t = tier_or_error(rq, res);
    if (t == NULL)
        return;
    kvt_srv_worker_t *w = rq->w;
    size_t need = rq->len / 12 + 1; /* a key and its length take 12 bytes of the body */
    if (!kvt_grow(&w->keys, &w->keys_cap, need, sizeof(uint64_t), 1024) ||
        !kvt_grow(&w->tokens, &w->tokens_cap, need, sizeof(uint32_t), 1024)) {
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        return;
    }
    uint32_t *lens = w->tokens;
    kvt_proto_commit_t c;
    kvt_status_t st = kvt_proto_commit_req_decode(rq->body, rq->len, w->keys, lens, (uint32_t)need,
                                                  &c, rq->err, rq->errlen);
    char ns[NS_MAX];
    size_t ns_len;
    if (st != KVT_OK) {
        error(res, kvt_proto_http_status(st), st, rq->err);
    } else if (rpc_ns(rq, res, c.model, c.lora, ns, &ns_len)) {
        kvt_tier_geom_t g;
        kvt_tier_geom(t, &g);
        for (uint32_t i = 0; i < c.n; i++)
            if (lens[i] == 0)
                lens[i] = g.block_bytes;
        kvt_tier_sess_t *s = sess_of(rq, res, t);
        size_t done = 0;
        if (s != NULL) {
            st = kvt_tier_commit(t, s, ns, ns_len, w->keys, c.n, lens, c.ok, &done);
            if (st == KVT_OK) {
                kvt_proto_count_ans_encode(rq->wr, rq->op, rq->req_id, (uint32_t)done);
                frames(res);
            } else {
                error(res, 400, st, "commit: a length is above --block-bytes");
            }
        }
    }
}

void srv_h_pin(srv_req_t *rq, srv_result_t *res)
{
    keys_call_t c;
    if (!keys_call(rq, res, &c))
        return;
    kvt_tier_t *t = c.t;
    kvt_proto_keys_t k = c.k;
    const char *ns = c.ns;
    size_t ns_len = c.ns_len;
    kvt_tier_sess_t *s = sess_of(rq, res, t);
    if (s == NULL)
        return;
    srv_job_t *job = tier_job(rq, res, KVT_PROTO_OP_PIN);
    if (job == NULL)
        return;
    srv_tier_call_t *tc = job->tc;
    tc->keys = malloc(k.n * sizeof(uint64_t));
    if (tc->keys == NULL) {
        srv_job_free(job);
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        return;
    }
    memcpy(tc->keys, rq->w->keys, k.n * sizeof(uint64_t));
    tc->n = k.n;
    memcpy(tc->ns, ns, ns_len);
    tc->ns_len = ns_len;
    tc->sess = s;
    async(res, job);
}

void srv_h_unpin(srv_req_t *rq, srv_result_t *res)
{
    keys_call_t c;
    if (!keys_call(rq, res, &c))
        return;
    kvt_tier_t *t = c.t;
    kvt_proto_keys_t k = c.k;
    const char *ns = c.ns;
    size_t ns_len = c.ns_len;
    size_t done =
        *rq->sess != NULL ? kvt_tier_unpin(t, *rq->sess, ns, ns_len, rq->w->keys, k.n) : 0;
    kvt_proto_count_ans_encode(rq->wr, rq->op, rq->req_id, (uint32_t)done);
    frames(res);
}

void srv_h_prefetch_rpc(srv_req_t *rq, srv_result_t *res)
{
    keys_call_t c;
    if (!keys_call(rq, res, &c))
        return;
    kvt_tier_t *t = c.t;
    kvt_proto_keys_t k = c.k;
    const char *ns = c.ns;
    size_t ns_len = c.ns_len;
    size_t started = kvt_tier_prefetch(t, ns, ns_len, rq->w->keys, k.n);
    kvt_proto_count_ans_encode(rq->wr, rq->op, rq->req_id, (uint32_t)started);
    frames(res);
}

/* ---- prefetch over HTTP --------------------------------------------------------------- */

/* POST /v1/prefetch {"model", "lora_name"?, "token_ids": [..] | "keys": [..]} */
void srv_h_prefetch_http(srv_req_t *rq, srv_result_t *res)
{
    kvt_tier_t *t = tier_or_error(rq, res);
    if (t == NULL)
        return;
    kvt_srv_worker_t *w = rq->w;
    kvt_srv_t *srv = w->srv;
    size_t cap = rq->len / 2 + 1; /* N numbers take at least 2N-1 bytes */
    if (!kvt_grow(&w->keys, &w->keys_cap, cap, sizeof(uint64_t), 1024) ||
        !kvt_grow(&w->tokens, &w->tokens_cap, cap, sizeof(uint32_t), 1024)) {
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        return;
    }
    char model[KVT_IDX_MAX_NAME + 1] = "", lora[KVT_IDX_MAX_NAME + 1] = "";
    size_t mlen = 0, llen = 0, n = 0;
    int which = 0; /* 1 token_ids, 2 keys */
    kvt_json_t j;
    kvt_json_init(&j, (const char *)rq->body, rq->len);
    kvt_status_t st = kvt_json_object_begin(&j);
    const char *key;
    size_t klen;
    int more;
    while (st == KVT_OK && (more = kvt_json_object_next(&j, &key, &klen)) > 0) {
        if (klen == 5 && memcmp(key, "model", 5) == 0) {
            st = kvt_json_string(&j, model, sizeof(model), &mlen);
        } else if (klen == 9 && memcmp(key, "lora_name", 9) == 0) {
            st = kvt_json_peek(&j) == KVT_JSON_NULL
                     ? kvt_json_null(&j)
                     : kvt_json_string(&j, lora, sizeof(lora), &llen);
        } else if (klen == 9 && memcmp(key, "token_ids", 9) == 0) {
            st = kvt_json_u32_array(&j, w->tokens, cap, UINT32_MAX, &n);
            which |= 1;
        } else if (klen == 4 && memcmp(key, "keys", 4) == 0) {
            st = kvt_json_hash_array(&j, w->keys, cap, &n);
            which |= 2;
        } else {
            st = kvt_json_skip(&j); /* unknown members are ignored, as in queries */
        }
    }
    if (st == KVT_OK && more < 0)
        st = (kvt_status_t)more;
    if (st == KVT_OK)
        st = kvt_json_end(&j);
    if (st != KVT_OK) {
        kvt_errf(rq->err, rq->errlen, "prefetch: %s",
                 kvt_json_error(&j)[0] ? kvt_json_error(&j) : kvt_status_str(st));
        error(res, 400, KVT_ERR_INVAL, rq->err);
        return;
    }
    if (mlen == 0 || memchr(model, '\0', mlen) != NULL || memchr(lora, '\0', llen) != NULL) {
        error(res, 400, KVT_ERR_INVAL, "prefetch needs a non-empty \"model\" without NUL bytes");
        return;
    }
    if (which != 1 && which != 2) {
        error(res, 400, KVT_ERR_INVAL, "prefetch needs exactly one of \"token_ids\" and \"keys\"");
        return;
    }
    size_t nb = n;
    if (which == 1) {
        /* the keys of the blocks these tokens fill, as a query computes them */
        kvt_idx_read_begin(w->reader);
        uint32_t ns_id, bs;
        if (!kvt_idx_ns_lookup(w->reader, model, mlen, lora, llen, &ns_id, &bs))
            bs = srv->cfg.block_size;
        kvt_idx_read_end(w->reader);
        nb = n / bs;
        kvt_hash_seq_salted(w->tokens, n, bs, KVT_HASH_SEED, NULL, NULL, w->keys);
    }
    char ns[NS_MAX];
    size_t ns_len = srv_tier_ns(model, mlen, lora, llen, false, ns);
    size_t started = kvt_tier_prefetch(t, ns, ns_len, w->keys, nb);
    kvt_jbuf_t *o = &w->out;
    kvt_jbuf_reset(o);
    kvt_jbuf_cstr(o, "{\"blocks\":");
    kvt_jbuf_u64(o, nb);
    kvt_jbuf_cstr(o, ",\"started\":");
    kvt_jbuf_u64(o, started);
    kvt_jbuf_cstr(o, "}");
    *res = (srv_result_t){.out = OUT_JSON, .status = 200};
}
