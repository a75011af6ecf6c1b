/*
 * server/api.c: queries (decode, hash, look up, score, encode), job
 * construction for writes, /v1/stats, /metrics and request accounting.
 */
#define KVT_LOG_COMPONENT "api"

#include "server/api.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"
#include "common/grow.h"
#include "kvindex/hash.h"
#include "server/query_json.h"

/* ---- scratch ---------------------------------------------------------------------- */

kvt_status_t srv_scratch(kvt_srv_worker_t *w, size_t nkeys, size_t ntokens, size_t nfilter)
{
    size_t kc = w->keys_cap, tc = w->tokens_cap, fc = w->filter_cap;
    if (!kvt_grow(&w->keys, &kc, nkeys + 1, sizeof(uint64_t), 256))
        return KVT_ERR_NO_MEM;
    w->keys_cap = kc;
    if (ntokens > 0 && !kvt_grow(&w->tokens, &tc, ntokens + 1, sizeof(uint32_t), 256))
        return KVT_ERR_NO_MEM;
    w->tokens_cap = tc;
    if (!kvt_grow(&w->filter, &fc, nfilter + 1, sizeof(uint32_t), 256))
        return KVT_ERR_NO_MEM;
    w->filter_cap = fc;
    return KVT_OK;
}

/* ---- the query itself ------------------------------------------------------------- */

/*
 * The keys of @q's blocks under block size @bs, *@nb_p of them: @q's own keys, or its tokens
 * hashed into the worker's scratch (which must hold q->n / bs + 1 keys).
 */
static const uint64_t *query_keys(kvt_srv_worker_t *w, const srv_query_t *q, uint32_t bs,
                                  size_t *nb_p)
{
    if (q->by_keys) {
        *nb_p = q->n;
        return q->keys;
    }
    /*
     * A cache salt seeds the first block, as the events that stored the prefix did; under
     * --lora-keys dynamo a LoRA seeds every block (kvindex/hash.h), as its events' keys.
     */
    size_t lora_len = w->srv->cfg.lora_keys == KVT_SRV_LORA_KEYS_DYNAMO ? q->lora_len : 0;
    kvt_hash_seeds_t seeds;
    kvt_hash_seeds_lora(q->salt, q->salt_len, q->lora, lora_len, &seeds);
    bool plain = seeds.block == KVT_HASH_SEED; /* the standard's fast paths */
    if (q->le_tokens != NULL && plain)
        kvt_hash_seq_salted_le(q->le_tokens, q->n, bs, seeds.first, NULL, NULL, w->keys);
    else if (q->le_tokens != NULL)
        kvt_hash_seq_seeds_le(q->le_tokens, q->n, bs, &seeds, NULL, NULL, w->keys);
    else if (plain)
        kvt_hash_seq_salted(q->tokens, q->n, bs, seeds.first, NULL, NULL, w->keys);
    else
        kvt_hash_seq_seeds(q->tokens, q->n, bs, &seeds, NULL, NULL, w->keys);
    *nb_p = q->n / bs;
    return w->keys;
}

/* Runs @q; on KVT_OK the worker is in a read section of the index until srv_query_done(). */
kvt_status_t srv_query_run(kvt_srv_worker_t *w, const srv_query_t *q, srv_answer_t *a, char *err,
                           size_t errlen)
{
    kvt_srv_t *srv = w->srv;
    kvt_idx_read_begin(w->reader);
    uint32_t ns, bs;
    bool known =
        kvt_idx_ns_lookup(w->reader, q->model, q->model_len, q->lora, q->lora_len, &ns, &bs);
    if (!known)
        bs = srv->cfg.block_size;
    size_t nb;
    const uint64_t *keys = query_keys(w, q, bs, &nb);
    *a = (srv_answer_t){bs, (uint32_t)nb, 0, NULL};
    if (!known || nb == 0)
        return KVT_OK; /* a model nobody has reported yet holds nothing */
    size_t nf = 0;
    for (size_t i = 0; i < q->npods; i++)
        nf += kvt_idx_pods_named(w->reader, q->pod_names[i], q->pod_name_lens[i], w->filter + nf,
                                 w->filter_cap - nf);
    if (q->npods > 0 && nf == 0)
        return KVT_OK; /* none of the named pods is known */
    const kvt_idx_match_t *res;
    size_t nres;
    kvt_status_t st =
        kvt_idx_query(w->reader, ns, keys, nb, q->npods ? w->filter : NULL, nf, &res, &nres);
    if (st != KVT_OK) {
        kvt_errf(err, errlen, "out of memory");
        srv_query_done(w);
        return st;
    }
    size_t sc = w->scored_cap, vc = w->scored_cap;
    if (!kvt_grow(&w->scored, &sc, nres + 1, sizeof(kvt_scored_t), 256) ||
        !kvt_grow(&w->views, &vc, nres + 1, sizeof(kvt_idx_pod_view_t), 256)) {
        kvt_errf(err, errlen, "out of memory");
        srv_query_done(w);
        return KVT_ERR_NO_MEM;
    }
    w->scored_cap = sc < vc ? sc : vc;
    size_t n = kvt_score_rank(&srv->weights, res, nres, NULL, 0, NULL, 0, keys[nb - 1], w->scored);
    /* pods registered after this snapshot have no name yet: leave them out this time; the
     * names of those kept are looked up once, here, for srv_query_pod() */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (w->scored[i].matched > 0 &&
            kvt_idx_pod_view(w->reader, w->scored[i].pod, &w->views[k])) {
            if (k != i)
                w->scored[k] = w->scored[i];
            k++;
        }
    a->npods = k;
    a->scored = w->scored;
    return KVT_OK;
}

void srv_query_pod(kvt_srv_worker_t *w, const srv_answer_t *a, size_t i, srv_answer_pod_t *p)
{
    const kvt_scored_t *s = &a->scored[i];
    const kvt_idx_pod_view_t *v = &w->views[i]; /* found by srv_query_run() */
    *p = (srv_answer_pod_t){v->name,    v->name_len, v->json, v->json_len, v->dp_rank,
                            s->matched, s->gpu,      s->cpu,  s->disk,     s->score};
}

void srv_query_done(kvt_srv_worker_t *w)
{
    kvt_idx_read_end(w->reader);
}

/* ---- JSON front end ------------------------------------------------------------------ */

#define MAX_FILTER KVT_SRV_QUERY_MAX_PODS /* pod names in one query's filter */

kvt_status_t srv_api_query_json(kvt_srv_worker_t *w, const char *body, size_t len, kvt_jbuf_t *out,
                                char *err, size_t errlen)
{
    kvt_srv_t *srv = w->srv;
    size_t cap = len / 2 + 1;
    if (cap > srv->cfg.max_query_tokens)
        cap = srv->cfg.max_query_tokens;
    if (srv_scratch(w, cap, cap, MAX_FILTER * 8) != KVT_OK) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    kvt_srv_query_body_t b;
    kvt_status_t st = kvt_srv_query_decode(body, len, cap, w->tokens, w->keys, &b, err, errlen);
    if (st != KVT_OK)
        return st;
    srv_query_t q = {b.model,     b.model_len,     b.lora, b.lora_len, b.by_keys,
                     b.n,         w->tokens,       NULL,   w->keys,    b.npods,
                     b.pod_names, b.pod_name_lens, b.salt, b.salt_len};
    srv_answer_t a;
    st = srv_query_run(w, &q, &a, err, errlen);
    if (st != KVT_OK)
        return st;
    kvt_jbuf_cstr(out, "{\"block_size\":");
    kvt_jbuf_u64(out, a.block_size);
    kvt_jbuf_cstr(out, ",\"num_blocks\":");
    kvt_jbuf_u64(out, a.num_blocks);
    kvt_jbuf_cstr(out, ",\"pods\":[");
    /* one bounds check per entry: the name, the literals and seven numbers */
    enum { ENTRY_FIXED = 96 + 5 * KVT_JSON_U64_MAX_LEN + KVT_JSON_F64_MAX_LEN };
    for (size_t i = 0; i < a.npods; i++) {
        srv_answer_pod_t p;
        srv_query_pod(w, &a, i, &p);
        char *o = kvt_jbuf_room(out, p.pod_json_len + ENTRY_FIXED);
        if (o == NULL)
            break; /* oom: answered as such below */
        o = i ? KVT_JSON_PUT_LIT(o, ",{\"pod\":") : KVT_JSON_PUT_LIT(o, "{\"pod\":");
        o = kvt_json_put_raw(o, p.pod_json,
                             p.pod_json_len); /* escaped once, in the names snapshot */
        o = KVT_JSON_PUT_LIT(o, ",\"dp_rank\":");
        o = kvt_json_put_u64(o, p.dp_rank);
        o = KVT_JSON_PUT_LIT(o, ",\"matched_blocks\":");
        o = kvt_json_put_u64(o, p.matched);
        o = KVT_JSON_PUT_LIT(o, ",\"gpu\":");
        o = kvt_json_put_u64(o, p.gpu);
        o = KVT_JSON_PUT_LIT(o, ",\"cpu\":");
        o = kvt_json_put_u64(o, p.cpu);
        o = KVT_JSON_PUT_LIT(o, ",\"disk\":");
        o = kvt_json_put_u64(o, p.disk);
        o = KVT_JSON_PUT_LIT(o, ",\"score\":");
        o = kvt_json_put_f64(o, p.score);
        o = KVT_JSON_PUT_LIT(o, "}");
        kvt_jbuf_commit(out, o);
    }
    kvt_jbuf_cstr(out, "]}");
    srv_query_done(w);
    if (out->oom) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    return KVT_OK;
}

/* ---- RPC front end -------------------------------------------------------------------- */

/* An RPC query's pod-name filter, per worker thread (the names point into the frame). */
static __thread const char *filter_name[MAX_FILTER];
static __thread size_t filter_len[MAX_FILTER];

kvt_status_t srv_api_query_rpc(kvt_srv_worker_t *w, uint64_t req_id, const uint8_t *body,
                               size_t len, kvt_proto_wr_t *wr, char *err, size_t errlen)
{
    kvt_srv_t *srv = w->srv;
    kvt_proto_query_t pq;
    kvt_status_t st =
        kvt_proto_query_decode(body, len, srv->cfg.max_query_tokens, &pq, err, errlen);
    if (st == KVT_ERR_TOO_BIG) /* worded as the HTTP front end words it, with the limit */
        kvt_errf(err, errlen, "more than %u tokens or keys in one query",
                 (unsigned)srv->cfg.max_query_tokens);
    if (st != KVT_OK)
        return st;
    if (pq.npods > MAX_FILTER) {
        kvt_errf(err, errlen, "too many pods in the filter");
        return KVT_ERR_TOO_BIG;
    }
    /* RPC tokens are hashed straight from the frame: keys only */
    if (srv_scratch(w, pq.n, 0, MAX_FILTER * 8) != KVT_OK) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    bool by_keys = pq.kind == KVT_PROTO_Q_KEYS; /* else tokens, salted when pq.salt is set */
    if (by_keys)
        kvt_proto_query_values(&pq, w->keys);
    kvt_proto_rd_t r;
    kvt_proto_rd_init(&r, pq.pods, pq.pods_len);
    for (uint32_t i = 0; i < pq.npods; i++) {
        kvt_proto_str_t s = kvt_proto_rd_str(&r);
        filter_name[i] = s.p;
        filter_len[i] = s.len;
    }
    /* tokens are hashed straight from the frame (little-endian u32s, as the standard hashes) */
    srv_query_t q = {pq.model.p,
                     pq.model.len,
                     pq.lora.p ? pq.lora.p : "",
                     pq.lora.len,
                     by_keys,
                     pq.n,
                     NULL,
                     by_keys ? NULL : pq.values,
                     w->keys,
                     pq.npods,
                     filter_name,
                     filter_len,
                     pq.salt.p,
                     pq.salt.len};
    srv_answer_t a;
    st = srv_query_run(w, &q, &a, err, errlen);
    if (st != KVT_OK)
        return st;
    kvt_proto_query_ans_enc_t e;
    kvt_proto_query_ans_begin(wr, req_id, a.block_size, a.num_blocks, &e);
    /*
     * Entries are written without add()'s checks: registered names are 1..255
     * bytes without NUL, and scores from the built-in weights and u32 counts
     * are finite (checked anyway: it costs a compare).
     */
    uint8_t *o = kvt_proto_query_ans_room(wr, &e, a.npods, a.npods * KVT_IDX_MAX_NAME);
    for (size_t i = 0; o != NULL && i < a.npods; i++) {
        srv_answer_pod_t p;
        srv_query_pod(w, &a, i, &p); /* inlined: the fields not read here cost nothing */
        kvt_proto_pod_ans_t pa = {
            {p.pod, (uint16_t)p.pod_len}, p.dp_rank, p.matched, p.gpu, p.cpu, p.disk, p.score};
        o = isfinite(p.score) ? kvt_proto_query_ans_put(&e, o, &pa) : NULL;
    }
    if (o != NULL)
        kvt_proto_query_ans_commit(wr, o);
    else if (!wr->oom)
        wr->bad = true; /* a non-finite score: the frame is dropped below */
    st = kvt_proto_query_ans_end(wr, &e);
    srv_query_done(w);
    if (st != KVT_OK)
        kvt_errf(err, errlen, "answer could not be encoded");
    return st;
}

/* ---- writes ------------------------------------------------------------------------------ */

kvt_status_t srv_api_events_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                srv_job_t **job_p, char *err, size_t errlen)
{
    srv_job_t *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    kvt_status_t st =
        kvt_ev_json_decode(body, len, w->srv->cfg.max_event_items, &job->batch, err, errlen);
    if (st != KVT_OK) {
        free(job);
        return st;
    }
    job->kind = JOB_EVENTS;
    job->worker = w;
    *job_p = job;
    return KVT_OK;
}

kvt_status_t srv_api_routed_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                srv_job_t **job_p, char *err, size_t errlen)
{
    kvt_srv_t *srv = w->srv;
    size_t cap = len / 2 + 1;
    if (cap > srv->cfg.max_query_tokens)
        cap = srv->cfg.max_query_tokens;
    if (srv_scratch(w, cap, cap, 0) != KVT_OK) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    kvt_srv_routed_body_t r;
    kvt_status_t st = kvt_srv_routed_decode(body, len, cap, w->tokens, w->keys, &r, err, errlen);
    if (st != KVT_OK)
        return st;
    const kvt_srv_query_body_t *b = &r.q;
    srv_query_t q = {b->model, b->model_len, b->lora, b->lora_len, b->by_keys,
                     b->n,     w->tokens,    NULL,    w->keys,     0,
                     NULL,     NULL,         b->salt, b->salt_len};
    /* tokens are hashed here, with the block size a query would use now; a namespace the
     * writer creates meanwhile with another size refuses the job there */
    uint32_t ns, bs;
    kvt_idx_read_begin(w->reader);
    bool known =
        kvt_idx_ns_lookup(w->reader, b->model, b->model_len, b->lora, b->lora_len, &ns, &bs);
    kvt_idx_read_end(w->reader);
    if (!known)
        bs = srv->cfg.block_size;
    size_t nb;
    const uint64_t *keys = query_keys(w, &q, bs, &nb);
    srv_job_t *job = calloc(1, sizeof(*job));
    srv_routed_t *rt = malloc(sizeof(*rt) + nb * sizeof(uint64_t));
    if (job == NULL || rt == NULL) {
        free(job);
        free(rt);
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    memcpy(rt->model, b->model, b->model_len + 1);
    memcpy(rt->lora, b->lora, b->lora_len + 1);
    rt->block_size = bs;
    rt->dp_rank = r.dp_rank;
    rt->ttl_ms = r.ttl_ms;
    rt->n = nb;
    if (nb > 0)
        memcpy(rt->keys, keys, nb * sizeof(uint64_t));
    memcpy(job->name, r.pod, r.pod_len + 1);
    job->kind = JOB_ROUTED;
    job->worker = w;
    job->routed = rt;
    *job_p = job;
    return KVT_OK;
}

kvt_status_t srv_api_engine_add_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                    srv_job_t **job_p, char *err, size_t errlen)
{
    srv_job_t *job = calloc(1, sizeof(*job));
    kvt_zsub_engine_t *e = malloc(sizeof(*e));
    if (job == NULL || e == NULL) {
        free(job);
        free(e);
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    kvt_status_t st = kvt_zsub_engine_json_decode(body, len, e, err, errlen);
    if (st != KVT_OK) {
        free(job);
        free(e);
        return st;
    }
    job->kind = JOB_ENGINE_ADD;
    job->worker = w;
    job->engine = e;
    *job_p = job;
    return KVT_OK;
}

kvt_status_t srv_api_drop_job(kvt_srv_worker_t *w, job_kind_t kind, const char *name,
                              srv_job_t **job_p, char *err, size_t errlen)
{
    size_t n = strlen(name);
    if (n == 0 || n > KVT_IDX_MAX_NAME) {
        kvt_errf(err, errlen, "%s name must be 1..%u bytes", kind == JOB_DROP ? "pod" : "model",
                 KVT_IDX_MAX_NAME);
        return KVT_ERR_INVAL;
    }
    srv_job_t *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    job->kind = kind;
    job->worker = w;
    memcpy(job->name, name, n + 1);
    *job_p = job;
    return KVT_OK;
}
