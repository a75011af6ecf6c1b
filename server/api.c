/*
 * server/api.c: queries (decode, hash, look up, score, encode), job
 * construction for writes, /v1/stats, /metrics and request accounting.
 */
#define KVT_LOG_COMPONENT "api"

#include "server/api.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvindex/hash.h"
#include "server/registry.h"

/* ---- scratch ---------------------------------------------------------------------- */

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 256;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (q == NULL)
        return false;
    *p = q;
    *cap = n;
    return true;
}

kvt_status_t srv_scratch(kvt_srv_worker_t *w, size_t nkeys, size_t ntokens, size_t nfilter)
{
    size_t kc = w->keys_cap, tc = w->tokens_cap, fc = w->filter_cap;
    if (!grow((void **)&w->keys, &kc, nkeys + 1, sizeof(uint64_t)))
        return KVT_ERR_NO_MEM;
    w->keys_cap = kc;
    if (ntokens > 0 && !grow((void **)&w->tokens, &tc, ntokens + 1, sizeof(uint32_t)))
        return KVT_ERR_NO_MEM;
    w->tokens_cap = tc;
    if (!grow((void **)&w->filter, &fc, nfilter + 1, sizeof(uint32_t)))
        return KVT_ERR_NO_MEM;
    w->filter_cap = fc;
    return KVT_OK;
}

/* ---- the query itself ------------------------------------------------------------- */

/* Runs @q; on KVT_OK the worker holds the registry until srv_query_done(). */
kvt_status_t srv_query_run(kvt_srv_worker_t *w, const srv_query_t *q, srv_answer_t *a,
                           const char **why_p)
{
    kvt_srv_t *srv = w->srv;
    kvt_srv_reg_t *reg = srv_reg_enter(w);
    w->cur_reg = reg;
    const reg_ns_t *ns = srv_reg_ns(reg, q->model, q->model_len, q->lora, q->lora_len);
    uint32_t bs = ns ? ns->block_size : srv->cfg.block_size;
    const uint64_t *keys = q->keys;
    size_t nb = q->n;
    if (!q->by_keys) {
        /* a cache salt seeds the first block, as the events that stored the prefix did */
        uint64_t first_seed = kvt_hash_salt_seed(q->salt, q->salt_len);
        nb = q->n / bs;
        if (q->le_tokens != NULL)
            kvt_hash_seq_salted_le(q->le_tokens, q->n, bs, first_seed, NULL, NULL, w->keys);
        else
            kvt_hash_seq_salted(q->tokens, q->n, bs, first_seed, NULL, NULL, w->keys);
        keys = w->keys;
    }
    *a = (srv_answer_t){bs, (uint32_t)nb, 0, NULL};
    if (ns == NULL || nb == 0)
        return KVT_OK; /* a model nobody has reported yet holds nothing */
    size_t nf = 0;
    for (size_t i = 0; i < q->npods; i++)
        nf += srv_reg_pods_named(reg, q->pod_names[i], q->pod_name_lens[i], w->filter + nf,
                                 w->filter_cap - nf);
    if (q->npods > 0 && nf == 0)
        return KVT_OK; /* none of the named pods is known */
    const kvt_idx_match_t *res;
    size_t nres;
    kvt_status_t st =
        kvt_idx_query(w->reader, ns->ns, keys, nb, q->npods ? w->filter : NULL, nf, &res, &nres);
    if (st != KVT_OK) {
        *why_p = "out of memory";
        srv_query_done(w);
        return st;
    }
    size_t sc = w->scored_cap;
    if (!grow((void **)&w->scored, &sc, nres + 1, sizeof(kvt_scored_t))) {
        *why_p = "out of memory";
        srv_query_done(w);
        return KVT_ERR_NO_MEM;
    }
    w->scored_cap = sc;
    size_t n = kvt_score_rank(&srv->weights, res, nres, NULL, 0, NULL, 0, keys[nb - 1], w->scored);
    /* pods registered after this snapshot have no name yet: leave them out this time */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (w->scored[i].matched > 0 && w->scored[i].pod < reg->npods &&
            reg->pods[w->scored[i].pod].live) {
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
    const reg_pod_t *rp = &w->cur_reg->pods[s->pod];
    *p = (srv_answer_pod_t){w->cur_reg->names + rp->name_off,
                            rp->name_len,
                            w->cur_reg->names + rp->json_off,
                            rp->json_len,
                            rp->dp_rank,
                            s->matched,
                            s->gpu,
                            s->cpu,
                            s->disk,
                            s->score};
}

void srv_query_done(kvt_srv_worker_t *w)
{
    w->cur_reg = NULL;
    srv_reg_exit(w);
}

/* ---- JSON front end ------------------------------------------------------------------ */

#define MAX_FILTER 1024u /* pod names in one query's filter */

/* A query's pod-name filter, per worker thread (the JSON path copies names into filter_buf). */
static __thread const char *filter_name[MAX_FILTER];
static __thread size_t filter_len[MAX_FILTER];
static __thread char filter_buf[MAX_FILTER][KVT_IDX_MAX_NAME + 1];

/*
 * The value of a query's "cache_salt": a string of 1..@cap-1 bytes without
 * NUL into @buf (*@len_p its length), or "" / null for no salt (*@len_p 0).
 * Anything else is KVT_ERR_INVAL with a static reason in *@why_p (the same
 * limits as the salt of an event and of an RPC query); a broken JSON text
 * returns the parser's status with @why_p untouched.
 */
static kvt_status_t query_salt_json(kvt_json_t *j, char *buf, size_t cap, size_t *len_p,
                                    const char **why_p)
{
    kvt_json_type_t t = kvt_json_peek(j);
    if (t == KVT_JSON_NULL) {
        *len_p = 0;
        return kvt_json_null(j);
    }
    if (t != KVT_JSON_STRING) {
        if (kvt_json_status(j) != KVT_OK)
            return kvt_json_status(j); /* the JSON itself is broken: reported as such */
        *why_p = "\"cache_salt\" must be a string or null";
        return KVT_ERR_INVAL;
    }
    size_t n = 0;
    kvt_status_t st = kvt_json_string(j, buf, cap, &n);
    if (st == KVT_ERR_TOO_BIG) {
        *why_p = "\"cache_salt\" is longer than 255 bytes";
        return KVT_ERR_INVAL;
    }
    if (st != KVT_OK)
        return st;
    if (memchr(buf, '\0', n) != NULL) {
        *why_p = "\"cache_salt\" contains a NUL character";
        return KVT_ERR_INVAL;
    }
    *len_p = n;
    return KVT_OK;
}

kvt_status_t srv_api_query_json(kvt_srv_worker_t *w, const char *body, size_t len, kvt_jbuf_t *out,
                                const char **why_p)
{
    kvt_srv_t *srv = w->srv;
    static __thread char why[200];
    char model[KVT_IDX_MAX_NAME + 1] = "", lora[KVT_IDX_MAX_NAME + 1] = "";
    char salt[KVT_IDX_MAX_NAME + 1] = "";
    size_t mlen = 0, llen = 0, slen = 0, n = 0, npods = 0;
    bool have_model = false, have_tokens = false, have_keys = false;
    size_t cap = len / 2 + 1;
    if (cap > srv->cfg.max_query_tokens)
        cap = srv->cfg.max_query_tokens;
    if (srv_scratch(w, cap, cap, MAX_FILTER * 8) != KVT_OK) {
        *why_p = "out of memory";
        return KVT_ERR_NO_MEM;
    }
    kvt_json_t j;
    kvt_json_init(&j, body, len);
    kvt_status_t st = kvt_json_object_begin(&j);
    const char *key;
    size_t klen;
    int more;
    while (st == KVT_OK && (more = kvt_json_object_next(&j, &key, &klen)) == 1) {
        if (klen == 5 && memcmp(key, "model", 5) == 0) {
            st = kvt_json_string(&j, model, sizeof(model), &mlen);
            have_model = true;
        } else if (klen == 9 && memcmp(key, "lora_name", 9) == 0) {
            if (kvt_json_peek(&j) == KVT_JSON_NULL)
                st = kvt_json_null(&j);
            else
                st = kvt_json_string(&j, lora, sizeof(lora), &llen);
        } else if (klen == 10 && memcmp(key, "cache_salt", 10) == 0) {
            const char *swhy = NULL;
            st = query_salt_json(&j, salt, sizeof(salt), &slen, &swhy);
            if (swhy != NULL) {
                *why_p = swhy;
                return KVT_ERR_INVAL;
            }
        } else if (klen == 9 && memcmp(key, "token_ids", 9) == 0) {
            st = kvt_json_u32_array(&j, w->tokens, cap, UINT32_MAX, &n);
            have_tokens = true;
        } else if (klen == 12 && memcmp(key, "block_hashes", 12) == 0) {
            st = kvt_json_hash_array(&j, w->keys, cap, &n);
            have_keys = true;
        } else if (klen == 4 && memcmp(key, "pods", 4) == 0) {
            st = kvt_json_array_begin(&j);
            while (st == KVT_OK && (more = kvt_json_array_next(&j)) == 1) {
                if (npods == MAX_FILTER) {
                    snprintf(why, sizeof(why), "more than %u pods in the filter", MAX_FILTER);
                    *why_p = why;
                    return KVT_ERR_TOO_BIG;
                }
                st = kvt_json_string(&j, filter_buf[npods], sizeof(filter_buf[npods]),
                                     &filter_len[npods]);
                if (st == KVT_OK && (filter_len[npods] == 0 ||
                                     memchr(filter_buf[npods], '\0', filter_len[npods]))) {
                    *why_p = "a pod name in \"pods\" is empty or contains a NUL character";
                    return KVT_ERR_INVAL;
                }
                filter_name[npods] = filter_buf[npods];
                npods++;
            }
            if (st == KVT_OK && more < 0)
                st = (kvt_status_t)more;
        } else {
            snprintf(why, sizeof(why), "unknown field '%.*s' in query",
                     (int)(klen > 64 ? 64 : klen), key);
            *why_p = why;
            return KVT_ERR_INVAL;
        }
    }
    if (st == KVT_OK && more < 0)
        st = (kvt_status_t)more;
    if (st == KVT_OK)
        st = kvt_json_end(&j);
    if (st != KVT_OK) {
        if (st == KVT_ERR_TOO_BIG && kvt_json_status(&j) == KVT_ERR_TOO_BIG && n == 0 &&
            (have_tokens || have_keys))
            snprintf(why, sizeof(why), "more than %zu tokens or keys in one query", cap);
        else
            snprintf(why, sizeof(why), "%s",
                     kvt_json_error(&j)[0] ? kvt_json_error(&j) : kvt_status_str(st));
        *why_p = why;
        return st == KVT_ERR_PARSE ? KVT_ERR_PARSE : st;
    }
    if (!have_model || mlen == 0) {
        *why_p = "query needs a non-empty \"model\"";
        return KVT_ERR_INVAL;
    }
    if (memchr(model, '\0', mlen) != NULL || memchr(lora, '\0', llen) != NULL) {
        *why_p = "\"model\" or \"lora_name\" contains a NUL character";
        return KVT_ERR_INVAL;
    }
    if (have_tokens == have_keys) {
        *why_p = "query needs exactly one of \"token_ids\" and \"block_hashes\"";
        return KVT_ERR_INVAL;
    }
    if (have_keys && slen > 0) {
        *why_p = "\"cache_salt\" goes with \"token_ids\": \"block_hashes\" are keys that already "
                 "carry their salt";
        return KVT_ERR_INVAL;
    }
    srv_query_t q = {model, mlen,    lora,  llen,        have_keys,  n,    w->tokens,
                     NULL,  w->keys, npods, filter_name, filter_len, salt, slen};
    srv_answer_t a;
    st = srv_query_run(w, &q, &a, why_p);
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
        o = kvt_json_put_raw(o, p.pod_json, p.pod_json_len); /* escaped once, in the registry */
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
    return out->oom ? KVT_ERR_NO_MEM : KVT_OK;
}

/* ---- RPC front end -------------------------------------------------------------------- */

kvt_status_t srv_api_query_rpc(kvt_srv_worker_t *w, uint64_t req_id, const uint8_t *body,
                               size_t len, kvt_proto_wr_t *wr, const char **why_p)
{
    kvt_srv_t *srv = w->srv;
    kvt_proto_query_t pq;
    kvt_status_t st = kvt_proto_query_decode(body, len, srv->cfg.max_query_tokens, &pq, why_p);
    if (st == KVT_ERR_TOO_BIG) {
        /* worded as the HTTP front end words it, with the limit */
        static __thread char why[96];
        snprintf(why, sizeof(why), "more than %u tokens or keys in one query",
                 (unsigned)srv->cfg.max_query_tokens);
        *why_p = why;
    }
    if (st != KVT_OK)
        return st;
    if (pq.npods > MAX_FILTER) {
        *why_p = "too many pods in the filter";
        return KVT_ERR_TOO_BIG;
    }
    /* RPC tokens are hashed straight from the frame: keys only */
    if (srv_scratch(w, pq.n, 0, MAX_FILTER * 8) != KVT_OK) {
        *why_p = "out of memory";
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
    st = srv_query_run(w, &q, &a, why_p);
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
        *why_p = "answer could not be encoded";
    return st;
}

/* ---- writes ------------------------------------------------------------------------------ */

kvt_status_t srv_api_events_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                srv_job_t **job_p, char *msg, size_t msglen)
{
    srv_job_t *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        snprintf(msg, msglen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    kvt_status_t st =
        kvt_ev_json_decode(body, len, w->srv->cfg.max_event_items, &job->batch, msg, msglen);
    if (st != KVT_OK) {
        free(job);
        return st;
    }
    job->kind = JOB_EVENTS;
    job->worker = w;
    *job_p = job;
    return KVT_OK;
}

kvt_status_t srv_api_engine_add_job(kvt_srv_worker_t *w, const char *body, size_t len,
                                    srv_job_t **job_p, char *msg, size_t msglen)
{
    srv_job_t *job = calloc(1, sizeof(*job));
    kvt_zsub_engine_t *e = malloc(sizeof(*e));
    if (job == NULL || e == NULL) {
        free(job);
        free(e);
        snprintf(msg, msglen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    kvt_status_t st = kvt_zsub_engine_json_decode(body, len, e, msg, msglen);
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
                              srv_job_t **job_p, char *msg, size_t msglen)
{
    size_t n = strlen(name);
    if (n == 0 || n > KVT_IDX_MAX_NAME) {
        snprintf(msg, msglen, "%s name must be 1..%u bytes", kind == JOB_DROP ? "pod" : "model",
                 KVT_IDX_MAX_NAME);
        return KVT_ERR_INVAL;
    }
    srv_job_t *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        snprintf(msg, msglen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    job->kind = kind;
    job->worker = w;
    memcpy(job->name, name, n + 1);
    *job_p = job;
    return KVT_OK;
}
