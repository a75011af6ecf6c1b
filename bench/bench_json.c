/*
 * `kvtier-bench json`: kvtier's JSON reader (common/json.h) against jansson on
 * the three bodies kvtierd parses, each decoded by the code that serves it:
 *  - query:  POST /v1/query, kvt_srv_query_decode() (server/query_json.h);
 *  - events: POST /v1/events, kvt_ev_json_decode() (kvindex/event.h);
 *  - engine: POST /v1/engines, kvt_zsub_engine_json_decode() (kvindex/zsub.h).
 * The jansson side is json_loadb() and the same fields taken from the tree
 * with the same checks (ranges, required fields) into an equivalent plain
 * struct; before and after the timed rounds both sides decode each body and
 * their outputs must be equal, or the run fails. A "parse and drop" row per
 * body (kvt_json_skip() over the whole text against json_loadb() and
 * json_decref()) separates the parser from the extraction.
 *
 * The twelve measurements run round-robin, kvtier and jansson alternating,
 * so that noise from a shared machine hits both alike; a measurement decodes
 * one body many times (each case's count calibrated to about 2 ms). The
 * headline figure is the best round of each, the table also shows the
 * median. Untimed probes record what jansson does with a hash above 2^63 and
 * with a repeated key, and how many allocations it makes per body.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/clock.h"
#include "common/json.h"
#include "kvindex/event.h"
#include "kvindex/zsub.h"
#include "server/query_json.h"

enum { BJ_QUERY, BJ_EVENTS, BJ_ENGINE, BJ_NSHAPES };
/* Per body: kvtier's decoder, jansson's, then parse and drop with each. */
enum { BJ_KVT, BJ_JAN, BJ_KVT_SKIP, BJ_JAN_SKIP, BJ_NIMPL };

#define BJ_NCASES (BJ_NSHAPES * BJ_NIMPL)
#define BJ_MIN_ROUNDS 3
#define BJ_MAX_ROUNDS 1000
#define BJ_SAMPLE_NS 2000000.0      /* one measurement, at most */
#define BJ_MAX_QUERY_TOKENS 131072u /* kvtierd's --max-query-tokens default */
#define BJ_MAX_EVENT_ITEMS 4194304u /* kvtierd's --max-event-items default */
#define BJ_BLOCK_SIZE 16u
#define BJ_VOCAB 128256u /* Llama 3's vocabulary: token ids of 1 to 6 digits */
#define BJ_MODEL "meta-llama/Llama-3.1-8B-Instruct"

static const char *const bj_shape_names[BJ_NSHAPES] = {"query", "events", "engine"};
static const char *const bj_dups_choices[] = {"reject", "keep", NULL};

/* One event as the jansson side extracts it: kvt_event_t's fields that the body sets. */
typedef struct bj_event {
    int type;
    unsigned tier;
    uint32_t nhashes, ntokens, block_size;
    const uint64_t *hashes;
    const uint32_t *tokens;
    bool has_parent;
    uint64_t parent;
} bj_event_t;

/* An events body as the jansson side extracts it, into storage sized once. */
typedef struct bj_batch {
    char pod[KVT_IDX_MAX_NAME + 1], model[KVT_IDX_MAX_NAME + 1], lora[KVT_IDX_MAX_NAME + 1];
    bool has_lora;
    uint32_t dp_rank;
    bj_event_t *ev;
    size_t nev, ev_cap;
    uint64_t *hashes;
    size_t nh, h_cap;
    uint32_t *tokens;
    size_t nt, t_cap;
} bj_batch_t;

typedef struct bj {
    kvt_jbuf_t doc[BJ_NSHAPES];
    size_t jflags; /* json_loadb() flags */
    /* query: cap as kvtierd computes it; tokens per side */
    size_t qcap;
    uint32_t *qtok_k, *qtok_j;
    uint64_t *qkeys;
    kvt_srv_query_body_t qk, qj;
    /* events */
    kvt_evbatch_t evk;
    bj_batch_t evj;
    /* engine */
    kvt_zsub_engine_t enk, enj;
    uint64_t sum; /* folds every result, so no work can be optimized away */
    char why[320];
} bj_t;

static void bj_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier-bench json [--seconds S] [--tokens N] [--events N] [--blocks N]\n"
            "                         [--jansson-dups reject|keep]\n"
            "\n"
            "Decodes three bodies with kvtierd's own decoders (common/json.h) and with jansson\n"
            "(json_loadb, then the same fields): a POST /v1/query of N tokens, a POST\n"
            "/v1/events batch of N BlockStored events, a POST /v1/engines spec; also parses\n"
            "and drops each whole body with both. Both sides' outputs must agree. Rounds\n"
            "alternate the two for about S seconds (at least %d rounds); reports ns per body\n"
            "and MB/s, best and median round, and kvtier's speed over jansson's. The last\n"
            "line is JSON with the best figures.\n"
            "\n"
            "  --seconds S        time budget for the measured rounds (default 2, 0.01..600)\n"
            "  --tokens N         token ids in the query (default 1024, 1..131072)\n"
            "  --events N         BlockStored events in the batch (default 32, 1..4096)\n"
            "  --blocks N         block hashes per event, 16 tokens each (default 16, 1..1024)\n"
            "  --jansson-dups D   reject: json_loadb with JSON_REJECT_DUPLICATES, as kvtier\n"
            "                     refuses a repeated key (default); keep: without it\n",
            BJ_MIN_ROUNDS);
}

/* ---- the bodies ------------------------------------------------------------------------- */

static void bj_doc_query(kvt_jbuf_t *d, uint32_t tokens, uint64_t *x)
{
    kvt_jbuf_cstr(d, "{\"model\":\"" BJ_MODEL "\",\"lora_name\":\"sql-adapter\",\"token_ids\":[");
    for (uint32_t i = 0; i < tokens; i++) {
        if (i)
            kvt_jbuf_raw(d, ",", 1);
        kvt_jbuf_u64(d, kvt_bench_rand(x) % BJ_VOCAB);
    }
    kvt_jbuf_cstr(d, "]}");
}

/* Engine hashes below 2^63: jansson cannot load larger ones (see bj_probe_u64()). */
static void bj_doc_events(kvt_jbuf_t *d, uint32_t events, uint32_t blocks, uint64_t *x)
{
    uint64_t parent = 0;
    kvt_jbuf_cstr(d, "{\"pod\":\"vllm-0\",\"model\":\"" BJ_MODEL "\",\"lora_name\":null,"
                     "\"dp_rank\":0,\"events\":[");
    for (uint32_t e = 0; e < events; e++) {
        kvt_jbuf_cstr(d, e ? ",{" : "{");
        kvt_jbuf_cstr(d, "\"type\":\"BlockStored\",\"block_hashes\":[");
        uint64_t h = 0;
        for (uint32_t b = 0; b < blocks; b++) {
            if (b)
                kvt_jbuf_raw(d, ",", 1);
            h = kvt_bench_rand(x) >> 1;
            kvt_jbuf_u64(d, h);
        }
        kvt_jbuf_cstr(d, "],\"parent_block_hash\":");
        if (e == 0)
            kvt_jbuf_cstr(d, "null");
        else
            kvt_jbuf_u64(d, parent);
        parent = h;
        kvt_jbuf_cstr(d, ",\"token_ids\":[");
        for (uint32_t t = 0; t < blocks * BJ_BLOCK_SIZE; t++) {
            if (t)
                kvt_jbuf_raw(d, ",", 1);
            kvt_jbuf_u64(d, kvt_bench_rand(x) % BJ_VOCAB);
        }
        kvt_jbuf_printf(d, "],\"block_size\":%u,\"medium\":\"GPU\"}", BJ_BLOCK_SIZE);
    }
    kvt_jbuf_cstr(d, "]}");
}

static void bj_doc_engine(kvt_jbuf_t *d)
{
    kvt_jbuf_cstr(d, "{\"pod\":\"vllm-0\",\"model\":\"" BJ_MODEL "\","
                     "\"endpoint\":\"tcp://10.0.0.5:5557\",\"replay_endpoint\":"
                     "\"tcp://10.0.0.5:5600\",\"topic\":\"kv@vllm-0@" BJ_MODEL "\","
                     "\"format\":\"vllm\",\"dp_size\":2,\"bind\":false}");
}

/* ---- the jansson side ------------------------------------------------------------------- */

/* A string of at most @cap-1 bytes into @buf. json_loadb() without JSON_ALLOW_NUL already
 * refused "\u0000", the NUL kvtier's decoders refuse in names. */
static int bj_jan_str(const json_t *v, char *buf, size_t cap, size_t *len_p)
{
    if (!json_is_string(v))
        return -1;
    size_t n = json_string_length(v);
    if (n >= cap)
        return -1;
    memcpy(buf, json_string_value(v), n + 1);
    *len_p = n;
    return 0;
}

/* An integer in [0, @max]. */
static int bj_jan_uint(const json_t *v, uint64_t max, uint64_t *v_p)
{
    if (!json_is_integer(v))
        return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x > max)
        return -1;
    *v_p = (uint64_t)x;
    return 0;
}

/* An array of u32s into @out[0..cap). */
static int bj_jan_u32s(const json_t *a, uint32_t *out, size_t cap, size_t *n_p)
{
    if (!json_is_array(a))
        return -1;
    size_t n = json_array_size(a);
    if (n > cap)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v))
            return -1;
        json_int_t t = json_integer_value(v);
        if (t < 0 || t > (json_int_t)UINT32_MAX)
            return -1;
        out[i] = (uint32_t)t;
    }
    *n_p = n;
    return 0;
}

/* A hash as kvt_json_hash() reads it: a negative int64 as its two's complement. jansson's
 * json_int_t is signed 64-bit: a hash above 2^63-1 never gets here (json_loadb fails). */
static int bj_jan_hash(const json_t *v, uint64_t *h_p)
{
    if (!json_is_integer(v))
        return -1;
    *h_p = (uint64_t)json_integer_value(v);
    return 0;
}

/* json_loadb() of body @shape, which must be an object; NULL after an error (b->why). */
static json_t *bj_jan_load(bj_t *b, int shape)
{
    json_error_t e;
    json_t *root = json_loadb(b->doc[shape].buf, b->doc[shape].len, b->jflags, &e);
    if (root == NULL) {
        snprintf(b->why, sizeof(b->why), "jansson: %s at offset %d", e.text, e.position);
    } else if (!json_is_object(root)) {
        snprintf(b->why, sizeof(b->why), "jansson: the %s body is not an object",
                 bj_shape_names[shape]);
        json_decref(root);
        root = NULL;
    }
    return root;
}

/* The query body, as kvt_srv_query_decode() reads the fields it has. */
static int bj_jan_query(bj_t *b)
{
    kvt_srv_query_body_t *q = &b->qj;
    json_t *root = bj_jan_load(b, BJ_QUERY);
    if (root == NULL)
        return -1;
    bool have_model = false, have_tokens = false;
    int rc = -1;
    q->model_len = q->lora_len = q->salt_len = q->n = q->npods = 0;
    q->lora[0] = q->salt[0] = '\0';
    q->by_keys = false;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "model") == 0) {
            if (bj_jan_str(v, q->model, sizeof(q->model), &q->model_len) != 0)
                goto out;
            have_model = true;
        } else if (strcmp(key, "lora_name") == 0) {
            if (!json_is_null(v) && bj_jan_str(v, q->lora, sizeof(q->lora), &q->lora_len) != 0)
                goto out;
        } else if (strcmp(key, "cache_salt") == 0) {
            if (!json_is_null(v) && bj_jan_str(v, q->salt, sizeof(q->salt), &q->salt_len) != 0)
                goto out;
        } else if (strcmp(key, "token_ids") == 0) {
            if (bj_jan_u32s(v, b->qtok_j, b->qcap, &q->n) != 0)
                goto out;
            have_tokens = true;
        } else {
            goto out; /* block_hashes and pods: not in the bench's body */
        }
    }
    if (have_model && q->model_len > 0 && have_tokens)
        rc = 0;
out:
    if (rc != 0 && b->why[0] == '\0')
        snprintf(b->why, sizeof(b->why), "jansson: the query body did not decode");
    b->sum += q->n + q->model_len;
    json_decref(root);
    return rc;
}

/* One element of "events", appended to @o (an unknown type is skipped). */
static int bj_jan_event(bj_batch_t *o, const json_t *ev)
{
    const json_t *t = json_object_get(ev, "type");
    if (!json_is_object(ev) || !json_is_string(t))
        return -1;
    const char *ts = json_string_value(t);
    int type = strcmp(ts, "BlockStored") == 0        ? KVT_EV_STORED
               : strcmp(ts, "BlockRemoved") == 0     ? KVT_EV_REMOVED
               : strcmp(ts, "AllBlocksCleared") == 0 ? KVT_EV_CLEARED
                                                     : 0;
    if (type == 0)
        return 0;
    if (o->nev == o->ev_cap)
        return -1;
    bj_event_t *e = &o->ev[o->nev];
    memset(e, 0, sizeof(*e));
    e->type = type;
    e->tier = KVT_TIER_GPU;
    if (type != KVT_EV_CLEARED) {
        const json_t *h = json_object_get(ev, "block_hashes");
        if (!json_is_array(h) || json_array_size(h) > o->h_cap - o->nh)
            return -1;
        e->nhashes = (uint32_t)json_array_size(h);
        e->hashes = o->hashes + o->nh;
        for (size_t i = 0; i < e->nhashes; i++)
            if (bj_jan_hash(json_array_get(h, i), &o->hashes[o->nh + i]) != 0)
                return -1;
        o->nh += e->nhashes;
        const json_t *m = json_object_get(ev, "medium");
        if (m != NULL && !json_is_null(m)) {
            if (!json_is_string(m))
                return -1;
            e->tier = kvt_ev_medium_tier(json_string_value(m), json_string_length(m));
        }
    }
    if (type == KVT_EV_STORED) {
        if (e->nhashes == 0)
            return -1;
        const json_t *p = json_object_get(ev, "parent_block_hash");
        if (p != NULL && !json_is_null(p)) {
            if (bj_jan_hash(p, &e->parent) != 0)
                return -1;
            e->has_parent = true;
        }
        const json_t *tk = json_object_get(ev, "token_ids");
        size_t nt = 0;
        if (tk != NULL && !json_is_null(tk)) {
            if (bj_jan_u32s(tk, o->tokens + o->nt, o->t_cap - o->nt, &nt) != 0)
                return -1;
            e->tokens = o->tokens + o->nt;
            e->ntokens = (uint32_t)nt;
            o->nt += nt;
        }
        const json_t *bs = json_object_get(ev, "block_size");
        uint64_t size = 0;
        bool have_bs = bs != NULL && !json_is_null(bs);
        if (have_bs && bj_jan_uint(bs, UINT32_MAX, &size) != 0)
            return -1;
        e->block_size = (uint32_t)size;
        if (nt > 0 && have_bs && size * e->nhashes != nt)
            return -1;
        if (nt > 0 && !have_bs) {
            if (nt % e->nhashes != 0)
                return -1;
            e->block_size = (uint32_t)(nt / e->nhashes);
        }
    }
    o->nev++;
    return 0;
}

/* The events body, as kvt_ev_json_decode() reads the fields it has. */
static int bj_jan_events(bj_t *b)
{
    bj_batch_t *o = &b->evj;
    json_t *root = bj_jan_load(b, BJ_EVENTS);
    if (root == NULL)
        return -1;
    o->nev = o->nh = o->nt = 0;
    o->has_lora = false;
    o->dp_rank = 0;
    o->pod[0] = o->model[0] = '\0';
    bool have_pod = false, have_events = false;
    int rc = -1;
    size_t n;
    uint64_t u;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "pod") == 0) {
            if (bj_jan_str(v, o->pod, sizeof(o->pod), &n) != 0 || n == 0)
                goto out;
            have_pod = true;
        } else if (strcmp(key, "model") == 0) {
            if (bj_jan_str(v, o->model, sizeof(o->model), &n) != 0)
                goto out;
        } else if (strcmp(key, "lora_name") == 0) {
            o->has_lora = !json_is_null(v);
            if (o->has_lora && bj_jan_str(v, o->lora, sizeof(o->lora), &n) != 0)
                goto out;
        } else if (strcmp(key, "dp_rank") == 0) {
            if (bj_jan_uint(v, KVT_EV_MAX_DP_RANK, &u) != 0)
                goto out;
            o->dp_rank = (uint32_t)u;
        } else if (strcmp(key, "events") == 0) {
            if (!json_is_array(v))
                goto out;
            for (size_t i = 0; i < json_array_size(v); i++)
                if (bj_jan_event(o, json_array_get(v, i)) != 0)
                    goto out;
            have_events = true;
        } else {
            goto out;
        }
    }
    if (!have_pod || !have_events)
        goto out;
    rc = 0;
    for (size_t i = 0; i < o->nev; i++)
        if (o->ev[i].type == KVT_EV_STORED && o->model[0] == '\0')
            rc = -1;
out:
    if (rc != 0 && b->why[0] == '\0')
        snprintf(b->why, sizeof(b->why), "jansson: the events body did not decode");
    b->sum += o->nev + o->nh + o->nt;
    json_decref(root);
    return rc;
}

/* The engine spec, as kvt_zsub_engine_json_decode() reads it, then its same checks. */
static int bj_jan_engine(bj_t *b)
{
    kvt_zsub_engine_t e;
    memset(&e, 0, sizeof(e));
    e.format = KVT_EV_FMT_VLLM;
    e.dp_size = 1;
    json_t *root = bj_jan_load(b, BJ_ENGINE);
    if (root == NULL)
        return -1;
    int rc = -1;
    size_t n;
    uint64_t u;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        bool null = json_is_null(v);
        if (strcmp(key, "pod") == 0) {
            if (bj_jan_str(v, e.pod, sizeof(e.pod), &n) != 0 || n == 0)
                goto out;
        } else if (strcmp(key, "model") == 0) {
            if (bj_jan_str(v, e.model, sizeof(e.model), &n) != 0 || n == 0)
                goto out;
        } else if (strcmp(key, "endpoint") == 0) {
            if (bj_jan_str(v, e.endpoint, sizeof(e.endpoint), &n) != 0 || n == 0)
                goto out;
        } else if (strcmp(key, "replay_endpoint") == 0) {
            if (!null && bj_jan_str(v, e.replay_endpoint, sizeof(e.replay_endpoint), &n) != 0)
                goto out;
        } else if (strcmp(key, "topic") == 0) {
            if (!null && bj_jan_str(v, e.topic, sizeof(e.topic), &n) != 0)
                goto out;
        } else if (strcmp(key, "format") == 0) {
            const char *f = json_string_value(v); /* NULL when not a string */
            if (f != NULL && strcmp(f, "vllm") == 0)
                e.format = KVT_EV_FMT_VLLM;
            else if (f != NULL && strcmp(f, "sglang") == 0)
                e.format = KVT_EV_FMT_SGLANG;
            else
                goto out;
        } else if (strcmp(key, "dp_size") == 0) {
            if (bj_jan_uint(v, UINT32_MAX, &u) != 0)
                goto out;
            e.dp_size = (uint32_t)u;
        } else if (strcmp(key, "bind") == 0) {
            if (!json_is_boolean(v))
                goto out;
            e.bind = json_is_true(v);
        } else {
            goto out;
        }
    }
    if (kvt_zsub_engine_check(&e, NULL, 0) == KVT_OK) {
        b->enj = e;
        rc = 0;
    }
out:
    if (rc != 0 && b->why[0] == '\0')
        snprintf(b->why, sizeof(b->why), "jansson: the engine spec did not decode");
    b->sum += e.dp_size;
    json_decref(root);
    return rc;
}

/* ---- one decode ------------------------------------------------------------------------- */

static int bj_kvt(bj_t *b, int shape)
{
    const char *doc = b->doc[shape].buf;
    size_t len = b->doc[shape].len;
    kvt_status_t st;
    if (shape == BJ_QUERY) {
        char err[200];
        st = kvt_srv_query_decode(doc, len, b->qcap, b->qtok_k, b->qkeys, &b->qk, err, sizeof(err));
        if (st != KVT_OK)
            snprintf(b->why, sizeof(b->why), "kvtier: query: %s", err);
        b->sum += b->qk.n + b->qk.model_len;
    } else if (shape == BJ_EVENTS) {
        char err[200];
        kvt_evbatch_cleanup(&b->evk); /* the previous decode's: the last one is compared */
        st = kvt_ev_json_decode(doc, len, BJ_MAX_EVENT_ITEMS, &b->evk, err, sizeof(err));
        if (st != KVT_OK)
            snprintf(b->why, sizeof(b->why), "kvtier: events: %s", err);
        b->sum += b->evk.nev;
    } else {
        char err[200];
        st = kvt_zsub_engine_json_decode(doc, len, &b->enk, err, sizeof(err));
        if (st != KVT_OK)
            snprintf(b->why, sizeof(b->why), "kvtier: engine: %s", err);
        b->sum += b->enk.dp_size;
    }
    return st == KVT_OK ? 0 : -1;
}

static int bj_one(bj_t *b, int shape, int impl)
{
    switch (impl) {
    case BJ_KVT: return bj_kvt(b, shape);
    case BJ_JAN:
        return shape == BJ_QUERY    ? bj_jan_query(b)
               : shape == BJ_EVENTS ? bj_jan_events(b)
                                    : bj_jan_engine(b);
    case BJ_KVT_SKIP: {
        kvt_json_t j;
        kvt_json_init(&j, b->doc[shape].buf, b->doc[shape].len);
        if (kvt_json_skip(&j) != KVT_OK || kvt_json_end(&j) != KVT_OK) {
            snprintf(b->why, sizeof(b->why), "kvtier: %s", kvt_json_error(&j));
            return -1;
        }
        b->sum += kvt_json_offset(&j);
        return 0;
    }
    default: {
        json_t *root = bj_jan_load(b, shape);
        if (root == NULL)
            return -1;
        b->sum += json_object_size(root);
        json_decref(root);
        return 0;
    }
    }
}

/* @iters decodes of body @shape by @impl; elapsed ns, or 0 after an error (b->why). */
static uint64_t bj_run(bj_t *b, int shape, int impl, size_t iters)
{
    uint64_t t0 = kvt_clock_ns();
    for (size_t i = 0; i < iters; i++)
        if (bj_one(b, shape, impl) != 0)
            return 0;
    uint64_t t1 = kvt_clock_ns();
    return t1 > t0 ? t1 - t0 : 1;
}

/* ---- agreement -------------------------------------------------------------------------- */

static int bj_differ(bj_t *b, int shape, const char *what)
{
    snprintf(b->why, sizeof(b->why), "%s: kvtier and jansson disagree on %s", bj_shape_names[shape],
             what);
    return -1;
}

static int bj_agree_events(bj_t *b)
{
    const kvt_evbatch_t *k = &b->evk;
    const bj_batch_t *j = &b->evj;
    if (strcmp(k->pod, j->pod) != 0 || strcmp(k->model, j->model) != 0)
        return bj_differ(b, BJ_EVENTS, "pod or model");
    if ((k->lora != NULL) != j->has_lora || (j->has_lora && strcmp(k->lora, j->lora) != 0))
        return bj_differ(b, BJ_EVENTS, "lora_name");
    if (k->dp_rank != j->dp_rank || k->nev != j->nev)
        return bj_differ(b, BJ_EVENTS, "dp_rank or the number of events");
    for (size_t i = 0; i < k->nev; i++) {
        const kvt_event_t *ke = &k->ev[i];
        const bj_event_t *je = &j->ev[i];
        if ((int)ke->type != je->type || ke->tier != je->tier || ke->nhashes != je->nhashes ||
            ke->ntokens != je->ntokens || ke->block_size != je->block_size ||
            ke->has_parent != je->has_parent || (ke->has_parent && ke->parent != je->parent))
            return bj_differ(b, BJ_EVENTS, "an event's fields");
        if ((ke->nhashes && memcmp(ke->hashes, je->hashes, ke->nhashes * sizeof(uint64_t))) ||
            (ke->ntokens && memcmp(ke->tokens, je->tokens, ke->ntokens * sizeof(uint32_t))))
            return bj_differ(b, BJ_EVENTS, "an event's hashes or tokens");
    }
    return 0;
}

/* Decodes body @shape with both sides and compares what they extracted; 0, or -1 (b->why). */
static int bj_agree(bj_t *b, int shape)
{
    if (bj_one(b, shape, BJ_KVT) != 0 || bj_one(b, shape, BJ_JAN) != 0)
        return -1;
    if (shape == BJ_QUERY) {
        const kvt_srv_query_body_t *k = &b->qk, *j = &b->qj;
        if (k->model_len != j->model_len || memcmp(k->model, j->model, k->model_len) != 0 ||
            k->lora_len != j->lora_len || memcmp(k->lora, j->lora, k->lora_len) != 0 ||
            k->salt_len != j->salt_len || k->by_keys != j->by_keys || k->npods != j->npods)
            return bj_differ(b, shape, "the names");
        if (k->n != j->n || memcmp(b->qtok_k, b->qtok_j, k->n * sizeof(uint32_t)) != 0)
            return bj_differ(b, shape, "token_ids");
        return 0;
    }
    if (shape == BJ_EVENTS)
        return bj_agree_events(b);
    const kvt_zsub_engine_t *k = &b->enk, *j = &b->enj;
    if (strcmp(k->pod, j->pod) || strcmp(k->model, j->model) || strcmp(k->endpoint, j->endpoint) ||
        strcmp(k->replay_endpoint, j->replay_endpoint) || strcmp(k->topic, j->topic) ||
        k->format != j->format || k->dp_size != j->dp_size || k->bind != j->bind)
        return bj_differ(b, shape, "the spec");
    return 0;
}

/* ---- probes: what each side does with a hash above 2^63, a repeated key ---------------- */

/*
 * A vLLM block hash above 2^63 (2^63 + 1): kvtier reads it exactly. jansson
 * refuses the whole body ("too big integer"); with JSON_DECODE_INT_AS_REAL it
 * loads every integer as a double, which cannot hold it. Writes "exact",
 * "refused" or "inexact" for kvtier, jansson and jansson as real.
 */
static void bj_probe_u64(const char **kvt_p, const char **jan_p, const char **real_p)
{
    static const char doc[] =
        "{\"pod\":\"p\",\"model\":\"m\",\"events\":[{\"type\":\"BlockStored\","
        "\"block_hashes\":[9223372036854775809],\"token_ids\":[1],"
        "\"block_size\":1}]}";
    const uint64_t want = (UINT64_C(1) << 63) + 1;
    kvt_evbatch_t kb;
    *kvt_p = "refused";
    if (kvt_ev_json_decode(doc, sizeof(doc) - 1, 16, &kb, NULL, 0) == KVT_OK) {
        *kvt_p = kb.nev == 1 && kb.ev[0].hashes[0] == want ? "exact" : "inexact";
        kvt_evbatch_cleanup(&kb);
    }
    json_error_t e;
    json_t *root = json_loadb(doc, sizeof(doc) - 1, 0, &e);
    *jan_p = root == NULL ? "refused" : "loaded";
    json_decref(root);
    root = json_loadb(doc, sizeof(doc) - 1, JSON_DECODE_INT_AS_REAL, &e);
    *real_p = "refused";
    if (root != NULL) {
        json_t *ev = json_array_get(json_object_get(root, "events"), 0);
        double d = json_real_value(json_array_get(json_object_get(ev, "block_hashes"), 0));
        *real_p = d < 18446744073709551616.0 && (uint64_t)d == want ? "exact" : "inexact";
    }
    json_decref(root);
}

/* {"model":"a","model":"b",...}: kvtier refuses it; jansson keeps the last value unless
 * JSON_REJECT_DUPLICATES. Writes "refused" or "last wins"/"first wins". */
static void bj_probe_dups(const char **kvt_p, const char **jan_p, const char **reject_p)
{
    static const char doc[] = "{\"model\":\"a\",\"model\":\"b\",\"token_ids\":[1]}";
    uint32_t tok[4];
    uint64_t keys[4];
    kvt_srv_query_body_t q;
    *kvt_p = kvt_srv_query_decode(doc, sizeof(doc) - 1, 4, tok, keys, &q, NULL, 0) == KVT_OK
                 ? "accepted"
                 : "refused";
    json_error_t e;
    json_t *root = json_loadb(doc, sizeof(doc) - 1, 0, &e);
    const char *m = json_string_value(json_object_get(root, "model"));
    *jan_p = root == NULL                       ? "refused"
             : m != NULL && strcmp(m, "b") == 0 ? "last wins"
                                                : "first wins";
    json_decref(root);
    root = json_loadb(doc, sizeof(doc) - 1, JSON_REJECT_DUPLICATES, &e);
    *reject_p = root == NULL ? "refused" : "accepted";
    json_decref(root);
}

/* Allocations jansson makes for one json_loadb() of each body (counting allocator). */
static size_t bj_allocs, bj_alloc_bytes;
static void *bj_count_malloc(size_t n)
{
    bj_allocs++;
    bj_alloc_bytes += n;
    return malloc(n);
}

static void bj_probe_allocs(bj_t *b, size_t *allocs, size_t *bytes)
{
    json_set_alloc_funcs(bj_count_malloc, free);
    for (int s = 0; s < BJ_NSHAPES; s++) {
        bj_allocs = bj_alloc_bytes = 0;
        json_decref(bj_jan_load(b, s));
        allocs[s] = bj_allocs;
        bytes[s] = bj_alloc_bytes;
    }
    json_set_alloc_funcs(malloc, free);
}

/* ---- main ------------------------------------------------------------------------------- */

static void bj_free(bj_t *b)
{
    for (int s = 0; s < BJ_NSHAPES; s++)
        kvt_jbuf_cleanup(&b->doc[s]);
    free(b->qtok_k);
    free(b->qtok_j);
    free(b->qkeys);
    kvt_evbatch_cleanup(&b->evk);
    free(b->evj.ev);
    free(b->evj.hashes);
    free(b->evj.tokens);
}

int kvt_bench_json_main(int argc, char **argv)
{
    double seconds = 2.0;
    uint32_t tokens = 1024, events = 32, blocks = 16, dups = 0;
    int rc = 1;

    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_DOUBLE("--seconds", &seconds, 0.01, 600),
        KVT_BENCH_ARG_U32("--tokens", &tokens, 1, BJ_MAX_QUERY_TOKENS),
        KVT_BENCH_ARG_U32("--events", &events, 1, 4096),
        KVT_BENCH_ARG_U32("--blocks", &blocks, 1, 1024),
        KVT_BENCH_ARG_CHOICE("--jansson-dups", &dups, bj_dups_choices),
    };
    int r = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (r > 0)
        bj_usage(stdout);
    if (r != 0)
        return r > 0 ? 0 : 2;

    static bj_t bj; /* ~3 KB of names: off the stack */
    bj_t *b = &bj;
    memset(b, 0, sizeof(*b));
    b->jflags = dups == 0 ? JSON_REJECT_DUPLICATES : 0;
    uint64_t x = UINT64_C(0x9E3779B97F4A7C15);
    for (int s = 0; s < BJ_NSHAPES; s++)
        kvt_jbuf_init(&b->doc[s]);
    bj_doc_query(&b->doc[BJ_QUERY], tokens, &x);
    bj_doc_events(&b->doc[BJ_EVENTS], events, blocks, &x);
    bj_doc_engine(&b->doc[BJ_ENGINE]);
    /* scratch for the query as kvtierd sizes it (len / 2 + 1, at most the default limit) */
    b->qcap = b->doc[BJ_QUERY].len / 2 + 1;
    if (b->qcap > BJ_MAX_QUERY_TOKENS)
        b->qcap = BJ_MAX_QUERY_TOKENS;
    b->qtok_k = malloc(b->qcap * sizeof(uint32_t));
    b->qtok_j = malloc(b->qcap * sizeof(uint32_t));
    b->qkeys = malloc(b->qcap * sizeof(uint64_t));
    b->evj.ev_cap = events;
    b->evj.h_cap = (size_t)events * blocks;
    b->evj.t_cap = (size_t)events * blocks * BJ_BLOCK_SIZE;
    b->evj.ev = malloc(b->evj.ev_cap * sizeof(bj_event_t));
    b->evj.hashes = malloc(b->evj.h_cap * sizeof(uint64_t));
    b->evj.tokens = malloc(b->evj.t_cap * sizeof(uint32_t));
    uint64_t *times = malloc((size_t)BJ_NCASES * BJ_MAX_ROUNDS * sizeof(uint64_t));
    bool oom = false;
    for (int s = 0; s < BJ_NSHAPES; s++)
        oom |= b->doc[s].oom;
    if (oom || !b->qtok_k || !b->qtok_j || !b->qkeys || !b->evj.ev || !b->evj.hashes ||
        !b->evj.tokens || !times) {
        fprintf(stderr, "kvtier-bench: json: out of memory\n");
        goto err_free;
    }

    /* both sides agree on every body before anything is timed (also the warm-up) */
    for (int s = 0; s < BJ_NSHAPES; s++)
        if (bj_agree(b, s) != 0)
            goto err_why;

    /* each measurement takes about sample_ns (calibrated per case: jansson is slower) */
    double budget_ns = seconds * 1e9;
    double sample_ns = budget_ns / (BJ_NCASES * BJ_MIN_ROUNDS);
    if (sample_ns > BJ_SAMPLE_NS)
        sample_ns = BJ_SAMPLE_NS;
    size_t iters[BJ_NCASES];
    for (int c = 0; c < BJ_NCASES; c++) {
        size_t n = 1;
        uint64_t t;
        while ((t = bj_run(b, c / BJ_NIMPL, c % BJ_NIMPL, n)) != 0 && (double)t < sample_ns / 8 &&
               n < (1u << 30))
            n *= 2;
        if (t == 0)
            goto err_why;
        double per = (double)t / (double)n;
        iters[c] = per >= sample_ns ? 1 : (size_t)(sample_ns / per);
    }

    uint64_t start = kvt_clock_ns();
    size_t rounds = 0;
    while (rounds < BJ_MAX_ROUNDS &&
           (rounds < BJ_MIN_ROUNDS || (double)(kvt_clock_ns() - start) < budget_ns)) {
        for (int c = 0; c < BJ_NCASES; c++) {
            uint64_t t = bj_run(b, c / BJ_NIMPL, c % BJ_NIMPL, iters[c]);
            if (t == 0)
                goto err_why;
            times[(size_t)c * BJ_MAX_ROUNDS + rounds] = t;
        }
        rounds++;
    }
    double elapsed = (double)(kvt_clock_ns() - start) * 1e-9;
    for (int s = 0; s < BJ_NSHAPES; s++) /* and after: still equal */
        if (bj_agree(b, s) != 0)
            goto err_why;

    /* best and median ns per body, MB/s (10^6 bytes/s) of the best */
    double best[BJ_NCASES], median[BJ_NCASES], mbps[BJ_NCASES];
    for (int c = 0; c < BJ_NCASES; c++) {
        uint64_t *t = &times[(size_t)c * BJ_MAX_ROUNDS];
        double n = (double)iters[c];
        kvt_bench_sort_u64(t, rounds);
        best[c] = (double)t[0] / n;
        median[c] = kvt_bench_percentile(t, rounds, 50.0) / n;
        mbps[c] = (double)b->doc[c / BJ_NIMPL].len / best[c] * 1e3;
    }
    const char *u64_kvt, *u64_jan, *u64_real, *dup_kvt, *dup_jan, *dup_reject;
    size_t allocs[BJ_NSHAPES], abytes[BJ_NSHAPES];
    bj_probe_u64(&u64_kvt, &u64_jan, &u64_real);
    bj_probe_dups(&dup_kvt, &dup_jan, &dup_reject);
    bj_probe_allocs(b, allocs, abytes);

    printf("kvtier-bench json: jansson %s%s, %zu rounds in %.2f s, one core\n",
           jansson_version_str(), dups == 0 ? " with JSON_REJECT_DUPLICATES" : "", rounds, elapsed);
    printf("%-7s %-15s %7s | %10s %10s %9s | %10s %10s %9s | %8s\n", "body", "work", "bytes",
           "kvtier ns", "median", "MB/s", "jansson ns", "median", "MB/s", "speed k/j");
    for (int c = 0; c < BJ_NCASES; c += 2) {
        int s = c / BJ_NIMPL;
        printf("%-7s %-15s %7zu | %10.0f %10.0f %9.1f | %10.0f %10.0f %9.1f | %8.2f\n",
               bj_shape_names[s], c % BJ_NIMPL == BJ_KVT ? "decode" : "parse and drop",
               b->doc[s].len, best[c], median[c], mbps[c], best[c + 1], median[c + 1], mbps[c + 1],
               best[c + 1] / best[c]);
    }
    printf("ns and MB/s per body (best round; median beside); speed k/j = kvtier MB/s over "
           "jansson's\n");
    printf("agree: kvtier and jansson extracted the same fields from every body\n");
    printf("jansson allocations per json_loadb: query %zu (%zu B), events %zu (%zu B), engine %zu "
           "(%zu B); kvtier: none but the events arena\n",
           allocs[BJ_QUERY], abytes[BJ_QUERY], allocs[BJ_EVENTS], abytes[BJ_EVENTS],
           allocs[BJ_ENGINE], abytes[BJ_ENGINE]);
    printf("hash 2^63+1: kvtier %s, jansson %s, jansson JSON_DECODE_INT_AS_REAL %s\n", u64_kvt,
           u64_jan, u64_real);
    printf("repeated key: kvtier %s, jansson %s, jansson JSON_REJECT_DUPLICATES %s\n", dup_kvt,
           dup_jan, dup_reject);
    printf("checksum %016" PRIx64 "\n", b->sum);

    printf("{\"bench\":\"json\",\"jansson\":\"%s\",\"jansson_dups\":\"%s\",\"rounds\":%zu,"
           "\"stat\":\"best\",\"agree\":true",
           jansson_version_str(), bj_dups_choices[dups], rounds);
    for (int c = 0; c < BJ_NCASES; c += 2) {
        int s = c / BJ_NIMPL;
        const char *sfx = c % BJ_NIMPL == BJ_KVT ? "" : "_skip";
        if (sfx[0] == '\0')
            printf(",\"%s_bytes\":%zu,\"%s_jansson_allocs\":%zu", bj_shape_names[s], b->doc[s].len,
                   bj_shape_names[s], allocs[s]);
        printf(",\"%s%s_kvtier_ns\":%.1f,\"%s%s_jansson_ns\":%.1f,\"%s%s_kvtier_mbps\":%.1f,"
               "\"%s%s_jansson_mbps\":%.1f,\"%s%s_speed_ratio\":%.3f",
               bj_shape_names[s], sfx, best[c], bj_shape_names[s], sfx, best[c + 1],
               bj_shape_names[s], sfx, mbps[c], bj_shape_names[s], sfx, mbps[c + 1],
               bj_shape_names[s], sfx, best[c + 1] / best[c]);
    }
    printf(",\"hash_above_2p63\":{\"kvtier\":\"%s\",\"jansson\":\"%s\",\"jansson_as_real\":\"%s\"},"
           "\"repeated_key\":{\"kvtier\":\"%s\",\"jansson\":\"%s\",\"jansson_reject\":\"%s\"}}\n",
           u64_kvt, u64_jan, u64_real, dup_kvt, dup_jan, dup_reject);
    rc = fflush(stdout) == 0 ? 0 : 1;
    goto err_free;

err_why:
    fprintf(stderr, "kvtier-bench: json: %s\n", b->why);
err_free:
    free(times);
    bj_free(b);
    return rc;
}
