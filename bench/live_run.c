/* bench/live_run: one policy of the live replay mode (live_run.h). */
#include "bench/live_run.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "bench/bench.h"
#include "bench/live_engine.h"
#include "bench/progress.h"
#include "bench/sim_cache.h"
#include "bench/sim_route.h"
#include "common/clock.h"
#include "common/errtext.h"
#include "kvindex/index.h"
#include "kvindex/score.h"

/* ---- keys ---------------------------------------------------------------------------------- */

static int live_cmp_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

kvt_status_t kvt_live_keys_build(const kvt_trace_t *t, size_t nreqs, uint32_t bs,
                                 kvt_live_keys_t *k)
{
    memset(k, 0, sizeof(*k));
    size_t nids = nreqs < t->nreqs ? (size_t)(t->reqs[nreqs].hash_ids - t->ids) : t->nids;
    uint32_t *tok = malloc(((size_t)t->max_blocks * bs + 1) * sizeof(*tok));
    uint64_t *pairs = malloc((nids ? nids : 1) * 2 * sizeof(*pairs));
    k->pos = malloc((nids ? nids : 1) * sizeof(*k->pos));
    k->ids = malloc((nids ? nids : 1) * sizeof(*k->ids));
    k->keys = malloc((nids ? nids : 1) * sizeof(*k->keys));
    if (tok == NULL || pairs == NULL || k->pos == NULL || k->ids == NULL || k->keys == NULL) {
        free(tok);
        free(pairs);
        kvt_live_keys_cleanup(k);
        return KVT_ERR_NO_MEM;
    }
    for (size_t i = 0; i < nreqs && i < t->nreqs; i++) {
        const kvt_trace_req_t *q = &t->reqs[i];
        for (uint32_t b = 0; b < q->nblocks; b++)
            kvt_live_block_tokens(q->hash_ids[b], bs, tok + (size_t)b * bs);
        kvt_client_hash_tokens(tok, (size_t)q->nblocks * bs, bs, k->pos + (q->hash_ids - t->ids));
    }
    for (size_t i = 0; i < nids; i++) {
        pairs[2 * i] = t->ids[i];
        pairs[2 * i + 1] = k->pos[i];
    }
    qsort(pairs, nids, 2 * sizeof(*pairs), live_cmp_pair);
    for (size_t i = 0; i < nids; i++) {
        if (k->n > 0 && k->ids[k->n - 1] == pairs[2 * i]) {
            k->conflicts += k->keys[k->n - 1] != pairs[2 * i + 1];
            continue;
        }
        k->ids[k->n] = pairs[2 * i];
        k->keys[k->n++] = pairs[2 * i + 1];
    }
    free(tok);
    free(pairs);
    return KVT_OK;
}

void kvt_live_keys_cleanup(kvt_live_keys_t *k)
{
    free(k->pos);
    free(k->ids);
    free(k->keys);
    memset(k, 0, sizeof(*k));
}

/* The key of trace id @id (0 when the trace has no such id). */
static uint64_t live_key_of(const kvt_live_keys_t *k, uint64_t id)
{
    size_t lo = 0, hi = k->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (k->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < k->n && k->ids[lo] == id ? k->keys[lo] : 0;
}

/* ---- the daemon's stats -------------------------------------------------------------------- */

/* The unsigned number after "@key": in [@s, @end); @dflt when absent or null. */
static int64_t live_field(const char *s, const char *end, const char *key, int64_t dflt)
{
    char pat[64];
    int n = snprintf(pat, sizeof(pat), "\"%s\":", key);
    for (const char *p = s; p != NULL && p < end; p = strstr(p + 1, pat))
        if (strncmp(p, pat, (size_t)n) == 0)
            return p[n] >= '0' && p[n] <= '9' ? strtoll(p + n, NULL, 10) : dflt;
    return dflt;
}

/* The object for @pod in /v1/stats whose next key is @next ("model": streams, "entries":
 * engines): its start, and in *@end_p where the next pod's object starts. NULL: absent. */
static const char *live_stats_obj(const char *json, const char *pod, const char *next,
                                  const char **end_p)
{
    char pat[320];
    snprintf(pat, sizeof(pat), "{\"pod\":\"%s\",\"dp_rank\":0,\"%s\":", pod, next);
    const char *s = strstr(json, pat);
    if (s == NULL)
        return NULL;
    const char *e = strstr(s + 1, "{\"pod\":");
    *end_p = e ? e : s + strlen(s);
    return s;
}

/* ---- one run ------------------------------------------------------------------------------- */

typedef struct live {
    const kvt_live_config_t *cfg;
    kvt_client_t *c;
    void *zctx;
    kvt_live_engine_t *eng;
    char (*names)[128];
    uint32_t *cands; /* 0..pods-1 */
    char model[96];
    double *load;
    kvt_idx_match_t *matches;
    kvt_idx_t *idx; /* empty: kvt_sim_route's policies that do not read it */
    kvt_idx_reader_t *reader;
    uint32_t *pod_ids;
    kvt_sim_router_t *router;
    uint64_t *qlat, *ttft, *rlat; /* per request: ns, µs, ns */
    char *body;                   /* a ROUTED body */
    size_t bodycap;
    char *why;
    size_t whylen;
} live_t;

static void live_cleanup(live_t *l)
{
    if (l->eng != NULL)
        for (uint32_t p = 0; p < l->cfg->pods; p++)
            kvt_live_engine_cleanup(&l->eng[p]);
    free(l->eng);
    if (l->zctx != NULL)
        zmq_ctx_term(l->zctx);
    kvt_sim_router_destroy(l->router);
    if (l->reader != NULL)
        kvt_idx_reader_destroy(l->reader);
    kvt_idx_destroy(l->idx);
    free(l->names);
    free(l->cands);
    free(l->load);
    free(l->matches);
    free(l->pod_ids);
    free(l->qlat);
    free(l->ttft);
    free(l->rlat);
    free(l->body);
}

static bool live_daemon_policy(kvt_sim_policy_t p)
{
    return p == KVT_SIM_PREFIX || p == KVT_SIM_COST;
}

static kvt_status_t live_init(live_t *l, kvt_live_result_t *res)
{
    const kvt_live_config_t *cfg = l->cfg;
    uint32_t np = cfg->pods;
    size_t nr = cfg->nreqs ? cfg->nreqs : 1;
    kvt_status_t st;

    snprintf(l->model, sizeof(l->model), "%s-%s", cfg->tag, kvt_sim_policy_name(cfg->policy));
    l->eng = calloc(np, sizeof(*l->eng));
    l->names = calloc(np, sizeof(*l->names));
    l->cands = malloc(np * sizeof(*l->cands));
    l->load = calloc(np, sizeof(*l->load));
    l->matches = malloc(np * sizeof(*l->matches));
    l->pod_ids = malloc(np * sizeof(*l->pod_ids));
    l->qlat = malloc(nr * sizeof(*l->qlat));
    l->ttft = malloc(nr * sizeof(*l->ttft));
    l->rlat = malloc(nr * sizeof(*l->rlat));
    l->bodycap = (size_t)cfg->t->max_blocks * 24 + 1024;
    l->body = malloc(l->bodycap);
    res->sim.pods = np;
    res->sim.prefilled = calloc(np, sizeof(*res->sim.prefilled));
    res->sim.routed = calloc(np, sizeof(*res->sim.routed));
    res->sim.req_pod = malloc(nr * sizeof(*res->sim.req_pod));
    res->sim.req_hit = malloc(nr * sizeof(*res->sim.req_hit));
    if (l->eng == NULL || l->names == NULL || l->cands == NULL || l->load == NULL ||
        l->matches == NULL || l->pod_ids == NULL || l->qlat == NULL || l->ttft == NULL ||
        l->rlat == NULL || l->body == NULL || res->sim.prefilled == NULL ||
        res->sim.routed == NULL || res->sim.req_pod == NULL || res->sim.req_hit == NULL) {
        kvt_errf(l->why, l->whylen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    if ((l->zctx = zmq_ctx_new()) == NULL) {
        kvt_errf(l->why, l->whylen, "zmq_ctx_new failed");
        return KVT_ERR_IO;
    }
    if ((st = kvt_idx_create(NULL, &l->idx)) != KVT_OK ||
        (st = kvt_idx_reader_create(l->idx, &l->reader)) != KVT_OK) {
        kvt_errf(l->why, l->whylen, "index: %s", kvt_status_str(st));
        return st;
    }
    for (uint32_t p = 0; p < np; p++) {
        char topic[160];
        l->cands[p] = p;
        snprintf(l->names[p], sizeof(l->names[p]), "%s-%" PRIu32, l->model, p);
        snprintf(topic, sizeof(topic), "kv@%s@%s", l->names[p], l->model);
        st = kvt_live_engine_init(&l->eng[p], l->zctx, topic, cfg->capacity_blocks,
                                  cfg->t->max_blocks, cfg->block_size, l->why, l->whylen);
        if (st != KVT_OK)
            return st;
        l->eng[p].lose_every = cfg->lose_every;
        if ((st = kvt_idx_pod_get(l->idx, l->names[p], 0, &l->pod_ids[p])) != KVT_OK) {
            kvt_errf(l->why, l->whylen, "index: %s", kvt_status_str(st));
            return st;
        }
    }
    kvt_sim_router_config_t rc = {.policy = cfg->policy,
                                  .pods = np,
                                  .seed = cfg->seed,
                                  .load_weight = cfg->load_weight,
                                  .sessions = cfg->sessions != NULL ? cfg->nreqs : 0,
                                  .approx_capacity = cfg->capacity_blocks,
                                  .max_blocks = cfg->t->max_blocks};
    return kvt_sim_router_create(&rc, l->idx, l->reader, 0, l->pod_ids, &l->router, l->why,
                                 l->whylen);
}

/* Sends what is due and answers replays until @until_ns (wall). */
static kvt_status_t live_wait(live_t *l, uint64_t until_ns)
{
    uint32_t np = l->cfg->pods;
    for (;;) {
        uint64_t now = kvt_clock_ns(), next = until_ns;
        for (uint32_t p = 0; p < np; p++) {
            if (kvt_live_engine_flush(&l->eng[p], now, false) != KVT_OK) {
                kvt_errf(l->why, l->whylen, "engine %" PRIu32 ": send failed", p);
                return KVT_ERR_IO;
            }
            uint64_t d = kvt_live_engine_next_due(&l->eng[p]);
            next = d < next ? d : next;
        }
        if (now >= until_ns)
            return KVT_OK;
        if (next <= now)
            continue;
        uint64_t dt = next - now;
        if (dt > 2000000 && np <= 64) { /* sleep on the replay sockets */
            zmq_pollitem_t items[64];
            for (uint32_t p = 0; p < np; p++)
                items[p] = (zmq_pollitem_t){l->eng[p].router, 0, ZMQ_POLLIN, 0};
            zmq_poll(items, (int)np, (long)(dt / 1000000) - 1);
        } else {
            struct timespec ts = {(time_t)(dt / 1000000000), (long)(dt % 1000000000)};
            if (dt > 1000000)
                ts = (struct timespec){0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Where request @i goes; its view (the daemon's match there) in *@view_p. KVT_SIM_NONE: error. */
static uint32_t live_route(live_t *l, size_t i, const uint64_t *keys, uint32_t n, double now_us,
                           uint32_t *view_p)
{
    const kvt_live_config_t *cfg = l->cfg;
    uint32_t np = cfg->pods;
    kvt_client_result_t res = {0};
    uint64_t t1 = kvt_clock_ns();
    kvt_status_t st = kvt_client_query_keys(l->c, l->model, NULL, keys, n, NULL, 0, &res);
    l->qlat[i] = kvt_clock_ns() - t1;
    if (st != KVT_OK) {
        kvt_errf(l->why, l->whylen, "query: %s", kvt_client_last_error(l->c));
        return KVT_SIM_NONE;
    }
    size_t nm = 0;
    for (size_t k = 0; k < res.npods; k++)
        for (uint32_t p = 0; p < np; p++)
            if (strcmp(res.pods[k].pod, l->names[p]) == 0) {
                l->matches[nm++] = (kvt_idx_match_t){p, res.pods[k].matched, res.pods[k].gpu,
                                                     res.pods[k].cpu, res.pods[k].disk};
                break;
            }
    kvt_client_result_free(&res);
    for (uint32_t p = 0; p < np; p++)
        l->load[p] = kvt_live_engine_load(&l->eng[p], &cfg->model, now_us);
    uint32_t pod;
    if (live_daemon_policy(cfg->policy)) {
        kvt_score_weights_t w;
        kvt_score_weights_default(&w);
        bool cost = cfg->policy == KVT_SIM_COST;
        if (cost && cfg->load_weight >= 0)
            w.load = cfg->load_weight;
        pod = kvt_score_pick(&w, l->matches, nm, l->cands, np, cost ? l->load : NULL, cost ? np : 0,
                             kvt_sim_mix(cfg->seed ^ i), NULL);
    } else {
        pod = kvt_sim_route(l->router, i, cfg->sessions != NULL ? cfg->sessions[i] : 0, keys, n,
                            l->load, l->why, l->whylen);
    }
    if (pod >= np) {
        if (pod != KVT_SIM_NONE || l->why[0] == '\0')
            kvt_errf(l->why, l->whylen, "no pod picked");
        return KVT_SIM_NONE;
    }
    *view_p = 0;
    for (size_t k = 0; k < nm; k++)
        if (l->matches[k].pod == pod)
            *view_p = l->matches[k].matched;
    return pod;
}

/* Records the decision: the request's blocks as speculative entries on @pod. */
static kvt_status_t live_routed(live_t *l, uint32_t pod, const uint64_t *keys, uint32_t n,
                                uint64_t *lat_p)
{
    size_t off =
        (size_t)snprintf(l->body, l->bodycap, "{\"model\":\"%s\",\"block_hashes\":[", l->model);
    for (uint32_t b = 0; b < n; b++)
        off +=
            (size_t)snprintf(l->body + off, l->bodycap - off, "%s%" PRIu64, b ? "," : "", keys[b]);
    off += (size_t)snprintf(l->body + off, l->bodycap - off,
                            "],\"pod\":\"%s\",\"ttl_ms\":%" PRIu32 "}", l->names[pod],
                            l->cfg->routed_ttl_ms);
    uint64_t t1 = kvt_clock_ns();
    char *answer = NULL;
    kvt_status_t st = kvt_client_routed(l->c, l->body, off, &answer);
    *lat_p = kvt_clock_ns() - t1;
    free(answer);
    if (st != KVT_OK)
        kvt_errf(l->why, l->whylen, "routed: %s", kvt_client_last_error(l->c));
    return st;
}

/*
 * The engines' streams in /v1/stats: how many have applied a batch (@join)
 * or every batch sent (else); their counters summed into @res (may be NULL).
 */
static uint32_t live_streams(live_t *l, bool join, kvt_live_result_t *res)
{
    char *json = NULL;
    uint32_t n = 0;
    if (kvt_client_stats(l->c, &json) != KVT_OK)
        return 0;
    if (res != NULL)
        res->batches = res->gaps = res->replays = res->state_drops = 0;
    for (uint32_t p = 0; p < l->cfg->pods; p++) {
        const char *end, *s = live_stats_obj(json, l->names[p], "model", &end);
        if (s == NULL)
            continue;
        int64_t last = live_field(s, end, "last_seq", -1);
        n += join ? last >= 0 : last == kvt_live_engine_last_seq(&l->eng[p]);
        if (res == NULL)
            continue;
        res->batches += (uint64_t)live_field(s, end, "batches", 0);
        res->gaps += (uint64_t)live_field(s, end, "gaps", 0);
        res->replays += (uint64_t)live_field(s, end, "replays", 0);
        res->state_drops += (uint64_t)live_field(s, end, "state_drops", 0);
    }
    free(json);
    return n;
}

/*
 * Waits until every stream has a batch (@join: the engines ping meanwhile,
 * since a SUB misses what is sent before it joins; up to 20 s) or has
 * applied every batch sent (up to 60 s, answering replays meanwhile).
 */
static kvt_status_t live_await(live_t *l, bool join, kvt_live_result_t *res)
{
    uint32_t np = l->cfg->pods, n;
    unsigned limit_s = join ? 20 : 60;
    uint64_t deadline = kvt_clock_ns() + limit_s * 1000000000ull;
    for (;;) {
        for (uint32_t p = 0; join && p < np; p++)
            if (kvt_live_engine_ping(&l->eng[p]) != KVT_OK) {
                kvt_errf(l->why, l->whylen, "engine %" PRIu32 ": send failed", p);
                return KVT_ERR_IO;
            }
        if (live_wait(l, kvt_clock_ns() + (join ? 20000000 : 5000000)) != KVT_OK)
            return KVT_ERR_IO;
        if ((n = live_streams(l, join, res)) == np)
            return KVT_OK;
        if (kvt_clock_ns() > deadline) {
            kvt_errf(l->why, l->whylen, "the daemon %s %" PRIu32 " of %" PRIu32 " engines in %u s",
                     join ? "joined the streams of" : "caught up with", n, np, limit_s);
            return KVT_ERR_TIMEOUT;
        }
    }
}

/* Subscribes the daemon to every engine and waits until it has joined each stream. */
static kvt_status_t live_subscribe(live_t *l)
{
    const kvt_live_config_t *cfg = l->cfg;
    for (uint32_t p = 0; p < cfg->pods; p++) {
        const kvt_live_engine_t *e = &l->eng[p];
        int n = snprintf(l->body, l->bodycap,
                         "{\"pod\":\"%s\",\"model\":\"%s\",\"endpoint\":\"%s\","
                         "\"replay_endpoint\":\"%s\",\"topic\":\"%s\"}",
                         l->names[p], l->model, e->endpoint, e->replay_endpoint, e->topic);
        kvt_status_t st = kvt_client_add_engine(l->c, l->body, (size_t)n, NULL);
        if (st != KVT_OK) {
            kvt_errf(l->why, l->whylen, "subscribing %s: %s%s", l->names[p],
                     kvt_client_last_error(l->c), st == KVT_ERR_EXISTS ? " (another --tag?)" : "");
            return st;
        }
    }
    return live_await(l, true, NULL);
}

/* After the last request: every batch out, a trailing withheld one exposed, the daemon caught up.
 */
static kvt_status_t live_drain(live_t *l, kvt_live_result_t *res)
{
    for (uint32_t p = 0; p < l->cfg->pods; p++) {
        kvt_live_engine_t *e = &l->eng[p];
        kvt_status_t st = kvt_live_engine_flush(e, kvt_clock_ns(), true);
        while (st == KVT_OK && e->last_lost) /* lose_every >= 2: the next one is sent */
            st = kvt_live_engine_ping(e);
        if (st != KVT_OK) {
            kvt_errf(l->why, l->whylen, "engine %" PRIu32 ": send failed", p);
            return KVT_ERR_IO;
        }
    }
    return live_await(l, false, res);
}

/*
 * The daemon's view of each engine against its cache: every held block must
 * be found on it (a one-key query with the pod's name), and the daemon must
 * hold no more entries for it than the cache holds blocks.
 */
static kvt_status_t live_verify(live_t *l, kvt_live_result_t *res)
{
    const kvt_live_config_t *cfg = l->cfg;
    char *json = NULL;
    kvt_status_t st = kvt_client_stats(l->c, &json);
    if (st != KVT_OK) {
        kvt_errf(l->why, l->whylen, "stats: %s", kvt_client_last_error(l->c));
        return st;
    }
    for (uint32_t p = 0; p < cfg->pods && st == KVT_OK; p++) {
        const kvt_sim_cache_t *cache = &l->eng[p].cache;
        const char *end, *s = live_stats_obj(json, l->names[p], "entries", &end);
        int64_t entries = s ? live_field(s, end, "entries", 0) : 0;
        uint64_t found = 0;
        const char *pod = l->names[p];
        if (cfg->dump != NULL)
            fprintf(cfg->dump, "%s %s", l->model, pod);
        for (uint32_t x = cache->mru; x != KVT_SIM_NONE; x = cache->nodes[x].next) {
            uint64_t key = live_key_of(cfg->keys, cache->nodes[x].id);
            kvt_client_result_t r = {0};
            if (cfg->dump != NULL)
                fprintf(cfg->dump, " %" PRIu64, key);
            st = kvt_client_query_keys(l->c, l->model, NULL, &key, 1, &pod, 1, &r);
            if (st != KVT_OK) {
                kvt_errf(l->why, l->whylen, "query: %s", kvt_client_last_error(l->c));
                break;
            }
            found += r.npods == 1 && r.pods[0].matched == 1;
            kvt_client_result_free(&r);
        }
        if (cfg->dump != NULL)
            fprintf(cfg->dump, "\n");
        res->held_blocks += cache->held;
        res->final_mismatch += cache->held - found;
        if (entries > (int64_t)found)
            res->final_mismatch += (uint64_t)entries - found;
    }
    free(json);
    return st;
}

static double live_imbalance(const uint64_t *v, uint32_t n)
{
    uint64_t max = 0, sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        sum += v[i];
        max = v[i] > max ? v[i] : max;
    }
    return sum ? (double)max * n / (double)sum : 1.0;
}

/* Request @i: due at @t0 + its trace time / speedup; routed, recorded, admitted. */
static kvt_status_t live_request(live_t *l, kvt_live_result_t *res, size_t i, uint64_t t0,
                                 uint64_t *lag_p)
{
    const kvt_live_config_t *cfg = l->cfg;
    const kvt_trace_t *t = cfg->t;
    kvt_sim_result_t *r = &res->sim;
    const kvt_trace_req_t *q = &t->reqs[i];
    const uint64_t *keys = cfg->keys->pos + (q->hash_ids - t->ids);
    uint32_t n = q->nblocks, view = 0;
    uint64_t ts0 = t->reqs[0].timestamp_ms; /* a timestamp before the first counts as the first */
    double arrival_us = (double)(q->timestamp_ms > ts0 ? q->timestamp_ms - ts0 : 0) * 1000.0;
    uint64_t due = t0 + (uint64_t)(arrival_us * 1000.0 / cfg->speedup);
    if (live_wait(l, due) != KVT_OK)
        return KVT_ERR_IO;
    uint64_t now = kvt_clock_ns();
    *lag_p = now - due > *lag_p ? now - due : *lag_p;
    uint32_t pod = live_route(l, i, keys, n, arrival_us, &view);
    if (pod == KVT_SIM_NONE)
        return KVT_ERR_INTERNAL;
    if (live_daemon_policy(cfg->policy) && cfg->routed_ttl_ms > 0 && n > 0 &&
        live_routed(l, pod, keys, n, &l->rlat[res->routed_calls++]) != KVT_OK)
        return KVT_ERR_IO;
    kvt_live_admit_t a;
    if (kvt_live_engine_admit(&l->eng[pod], &cfg->model, q->hash_ids, n, arrival_us, t0,
                              cfg->speedup, &a) != KVT_OK) {
        kvt_errf(l->why, l->whylen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    l->ttft[i] = (uint64_t)a.ttft_us;
    r->req_pod[i] = pod;
    r->req_hit[i] = a.hit;
    r->hit_blocks += a.hit;
    r->total_blocks += n;
    r->index_mismatch += view != a.hit;
    res->stale_over += view > a.hit;
    res->stale_under += view < a.hit;
    if (cfg->per_request != NULL)
        fprintf(cfg->per_request,
                "%s %zu %" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu64 " %.1f\n",
                kvt_sim_policy_name(cfg->policy), i, pod, a.hit, n, view, l->ttft[i],
                (double)l->qlat[i] / 1000.0);
    return KVT_OK;
}

/* The requests, paced at trace time / speedup, behind a progress bar. */
static kvt_status_t live_replay(live_t *l, kvt_live_result_t *res)
{
    const kvt_live_config_t *cfg = l->cfg;
    uint64_t t0 = kvt_clock_ns() + 20000000, lag = 0;
    kvt_status_t st = KVT_OK;
    kvt_progress_t pg;
    kvt_progress_start(&pg, NULL, -1, kvt_sim_policy_name(cfg->policy), cfg->nreqs);
    for (size_t i = 0; i < cfg->nreqs && st == KVT_OK; i++) {
        kvt_progress_update(&pg, i);
        st = live_request(l, res, i, t0, &lag);
    }
    kvt_progress_end(&pg);
    res->lag_max_ms = (double)lag / 1e6;
    if (res->routed_calls > 0) {
        kvt_bench_sort_u64(l->rlat, res->routed_calls);
        res->routed_p50_us = kvt_bench_percentile(l->rlat, res->routed_calls, 50) / 1000.0;
    }
    return st;
}

kvt_status_t kvt_live_run(kvt_client_t *c, const kvt_live_config_t *cfg, kvt_live_result_t *res,
                          char *why, size_t whylen)
{
    live_t l = {.cfg = cfg, .c = c, .why = why, .whylen = whylen};
    memset(res, 0, sizeof(*res));
    if (why != NULL && whylen > 0)
        why[0] = '\0';
    if (cfg->pods == 0 || cfg->pods > KVT_LIVE_MAX_PODS || cfg->capacity_blocks == 0 ||
        cfg->nreqs > cfg->t->nreqs || !(cfg->speedup > 0) || cfg->block_size == 0 ||
        (unsigned)cfg->policy >= KVT_SIM_NPOLICIES) {
        kvt_errf(why, whylen, "bad arguments");
        return KVT_ERR_INVAL;
    }
    uint64_t start = kvt_clock_ns();
    kvt_status_t st = live_init(&l, res);
    if (st == KVT_OK)
        st = live_subscribe(&l);
    if (st == KVT_OK)
        st = live_replay(&l, res);
    if (st == KVT_OK)
        st = live_drain(&l, res);
    if (st == KVT_OK)
        st = live_verify(&l, res);
    if (l.eng != NULL && !cfg->keep_engines)
        for (uint32_t p = 0; p < cfg->pods; p++)
            kvt_client_drop_engine(c, l.names[p], NULL); /* what is not subscribed says 404 */
    if (st != KVT_OK) {
        live_cleanup(&l);
        kvt_live_result_cleanup(res);
        return st;
    }
    kvt_sim_result_t *r = &res->sim;
    size_t nr = cfg->nreqs;
    for (uint32_t p = 0; p < cfg->pods; p++) {
        r->prefilled[p] = l.eng[p].prefilled;
        r->routed[p] = l.eng[p].routed;
        r->evicted += l.eng[p].evicted_blocks;
    }
    r->requests = nr;
    r->hit_ratio = r->total_blocks ? (double)r->hit_blocks / (double)r->total_blocks : 0.0;
    r->load_imbalance = live_imbalance(r->prefilled, cfg->pods);
    r->routed_imbalance = live_imbalance(r->routed, cfg->pods);
    if ((res->ttft_ms = malloc((nr ? nr : 1) * sizeof(*res->ttft_ms))) == NULL) {
        live_cleanup(&l);
        kvt_live_result_cleanup(res);
        kvt_errf(why, whylen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    for (size_t i = 0; i < nr; i++)
        res->ttft_ms[i] = (double)l.ttft[i] / 1000.0;
    kvt_bench_sort_u64(l.ttft, nr);
    kvt_bench_sort_u64(l.qlat, nr);
    res->ttft_p50_ms = kvt_bench_percentile(l.ttft, nr, 50) / 1000.0;
    res->ttft_p90_ms = kvt_bench_percentile(l.ttft, nr, 90) / 1000.0;
    res->ttft_p99_ms = kvt_bench_percentile(l.ttft, nr, 99) / 1000.0;
    res->query_p50_us = kvt_bench_percentile(l.qlat, nr, 50) / 1000.0;
    res->query_p99_us = kvt_bench_percentile(l.qlat, nr, 99) / 1000.0;
    res->query_max_us = kvt_bench_percentile(l.qlat, nr, 100) / 1000.0;
    res->wall_s = (double)(kvt_clock_ns() - start) / 1e9;
    live_cleanup(&l);
    return KVT_OK;
}

void kvt_live_result_cleanup(kvt_live_result_t *r)
{
    kvt_sim_result_cleanup(&r->sim);
    free(r->ttft_ms);
    memset(r, 0, sizeof(*r));
}
