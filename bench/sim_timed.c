/* bench/sim_timed: the timed replay mode, an event-driven cluster in simulated time (sim_timed.h).
 */
#include "bench/sim_timed.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sim_cache.h"
#include "bench/sim_route.h"
#include "common/errtext.h"
#include "common/heap.h"
#include "kvindex/index.h"

enum { T_GPU, T_CPU, T_DISK, NTIERS };
static const unsigned tier_bit[NTIERS] = {KVT_TIER_GPU, KVT_TIER_CPU, KVT_TIER_DISK};

enum { EV_BATCH_DONE, EV_DECODE_DONE };

typedef struct ev {
    double t;     /* µs of simulated time */
    uint64_t seq; /* ties: first scheduled, first run */
    uint32_t kind, arg;
} ev_t;

#define EV_BEFORE(a, b) ((a)->t < (b)->t || ((a)->t == (b)->t && (a)->seq < (b)->seq))
KVT_HEAP_DEFINE(evh, ev_t, EV_BEFORE)

typedef struct tpod {
    kvt_sim_cache_t tier[NTIERS];
    bool has[NTIERS];
    uint32_t qhead, qtail; /* FIFO of queued requests through req_t.next */
    uint32_t bhead;        /* the running batch, through req_t.next */
    bool busy;
    double busy_end;      /* µs: the running batch's end */
    double queued_est_us; /* estimated prefill time of the queued requests */
} tpod_t;

typedef struct req {
    double arrival, start, end; /* µs */
    double est_us;              /* prefill time estimated when routed */
    uint32_t pod, next;
    uint32_t route_pinned; /* leading blocks pinned when routed */
    uint32_t hit[NTIERS];  /* blocks hit per tier at batch start */
} req_t;

typedef struct tsim {
    const kvt_trace_t *t;
    const kvt_sim_timed_config_t *cfg;
    kvt_sim_timed_result_t *r;
    tpod_t *pods;
    req_t *reqs;
    uint8_t *found; /* per trace id position: 1 + tier hit at batch start, 0: computed */
    uint64_t *keys; /* the index's key of every trace id */
    ev_t *heap;
    size_t nheap;
    uint64_t seq;
    double now;
    double *load; /* per pod, for the router: outstanding prefill in blocks of compute */
    kvt_idx_t *idx;
    kvt_idx_reader_t *reader;
    kvt_sim_router_t *router;
    uint32_t ns;
    uint32_t *pod_id; /* the index's id of pod i */
    kvt_status_t st;  /* the first index write error */
} tsim_t;

/* ---- tiers ---------------------------------------------------------------------------------- */

/* The tier of pod @p holding @id, or -1. */
static int tier_of(const tpod_t *p, uint64_t id)
{
    for (int k = 0; k < NTIERS; k++)
        if (p->has[k] && kvt_sim_cache_has(&p->tier[k], id))
            return k;
    return -1;
}

static void idx_write(tsim_t *s, kvt_status_t st)
{
    if (st != KVT_OK && s->st == KVT_OK)
        s->st = st;
}

/*
 * Evicts pod @pi's tiers down to their capacities, top first: a block leaving
 * tier k goes to the next present tier below (the index stores it there, then
 * drops tier k) or away (the index drops it: BlockRemoved).
 */
static void tiers_evict(tsim_t *s, uint32_t pi)
{
    tpod_t *p = &s->pods[pi];
    uint32_t pod = s->pod_id[pi];
    for (int k = 0; k < NTIERS; k++) {
        if (!p->has[k])
            continue;
        int below = -1;
        for (int j = k + 1; j < NTIERS && below < 0; j++)
            if (p->has[j])
                below = j;
        uint64_t id;
        while (kvt_sim_cache_evict(&p->tier[k], &id)) {
            uint64_t key = kvt_sim_key(id);
            s->r->evicted[k]++;
            if (below >= 0) {
                idx_write(s, kvt_sim_cache_put(&p->tier[below], id, 0));
                idx_write(s,
                          kvt_idx_store(s->idx, s->ns, pod, tier_bit[below], NULL, &key, NULL, 1));
            }
            idx_write(s, kvt_idx_remove(s->idx, pod, tier_bit[k], &key, 1, NULL));
        }
    }
    uint64_t held = p->tier[T_GPU].held, cap = p->tier[T_GPU].cap;
    if (held > cap && held - cap > s->r->gpu_over)
        s->r->gpu_over = held - cap;
}

/* Blocks of @ids[0..n) held by pod @p from block 0 on, per tier into @hit; marks @found. */
static uint32_t tiers_hit(const tpod_t *p, const uint64_t *ids, uint32_t n, uint32_t *hit,
                          uint8_t *found)
{
    uint32_t b = 0;
    if (hit != NULL)
        memset(hit, 0, NTIERS * sizeof(*hit));
    for (; b < n; b++) {
        int k = tier_of(p, ids[b]);
        if (k < 0)
            break;
        if (hit != NULL)
            hit[k]++;
        if (found != NULL)
            found[b] = (uint8_t)(1 + k);
    }
    for (uint32_t i = b; found != NULL && i < n; i++)
        found[i] = 0;
    return b;
}

/* ---- events --------------------------------------------------------------------------------- */

static void ev_push(tsim_t *s, double t, uint32_t kind, uint32_t arg)
{
    evh_push(s->heap, &s->nheap, (ev_t){t, s->seq++, kind, arg});
}

static const kvt_trace_req_t *treq(const tsim_t *s, uint32_t i)
{
    return &s->t->reqs[i];
}

static size_t tpos(const tsim_t *s, uint32_t i)
{
    return (size_t)(s->t->reqs[i].hash_ids - s->t->ids);
}

/* The index's answer for pod @pi against the model's hit of request @i (see result's note). */
static void check_index(tsim_t *s, uint32_t pi, uint32_t i)
{
    const kvt_trace_req_t *q = treq(s, i);
    const req_t *rq = &s->reqs[i];
    const kvt_idx_match_t *m = NULL;
    size_t nm = 0;
    uint32_t id = s->pod_id[pi], got[4] = {0};
    if (kvt_idx_query(s->reader, s->ns, s->keys + tpos(s, i), q->nblocks, &id, 1, &m, &nm) !=
        KVT_OK) {
        s->r->index_mismatch++;
        return;
    }
    for (size_t k = 0; k < nm; k++)
        if (m[k].pod == id) {
            got[0] = m[k].gpu;
            got[1] = m[k].cpu;
            got[2] = m[k].disk;
            got[3] = m[k].matched;
        }
    uint32_t hit = rq->hit[0] + rq->hit[1] + rq->hit[2];
    bool ok = s->cfg->routed_ttl_ms > 0
                  ? got[3] >= hit /* speculative entries may stand for more */
                  : got[0] == rq->hit[0] && got[1] == rq->hit[1] && got[2] == rq->hit[2];
    if (!ok)
        s->r->index_mismatch++;
}

/* Starts pod @pi's next batch when it is idle and has queued requests. */
static void batch_start(tsim_t *s, uint32_t pi)
{
    tpod_t *p = &s->pods[pi];
    const kvt_sim_model_t *m = &s->cfg->model;
    if (p->busy || p->qhead == KVT_SIM_NONE)
        return;

    /* hits against the pod as it is now, FIFO while the computed tokens fit */
    uint64_t tokens = 0;
    uint32_t tail = KVT_SIM_NONE;
    double dur = 0;
    p->bhead = KVT_SIM_NONE;
    while (p->qhead != KVT_SIM_NONE) {
        uint32_t i = p->qhead;
        const kvt_trace_req_t *q = treq(s, i);
        req_t *rq = &s->reqs[i];
        uint32_t hit = tiers_hit(p, q->hash_ids, q->nblocks, rq->hit, s->found + tpos(s, i));
        uint32_t miss = kvt_sim_miss_tokens(m, q->input_length, hit);
        if (p->bhead != KVT_SIM_NONE && tokens + miss > m->batch_tokens)
            break;
        tokens += miss;
        p->qhead = rq->next;
        rq->next = KVT_SIM_NONE;
        if (tail == KVT_SIM_NONE)
            p->bhead = i;
        else
            s->reqs[tail].next = i;
        tail = i;
        rq->start = s->now;
        p->queued_est_us -= rq->est_us;
        dur += kvt_sim_prefill_tok_us(m, q->input_length, rq->hit[T_GPU], rq->hit[T_CPU],
                                      rq->hit[T_DISK]);
        check_index(s, pi, i);
    }
    if (p->qhead == KVT_SIM_NONE) {
        p->qtail = KVT_SIM_NONE;
        p->queued_est_us = 0; /* no drift from sums of doubles */
    }

    /* every block of the batch into GPU, pinned; loaded ones leave CPU/DISK */
    for (uint32_t i = p->bhead; i != KVT_SIM_NONE; i = s->reqs[i].next) {
        const kvt_trace_req_t *q = treq(s, i);
        for (uint32_t b = 0; b < q->nblocks; b++) {
            uint64_t id = q->hash_ids[b];
            uint32_t pins = 0;
            int k = tier_of(p, id);
            if (k > T_GPU) {
                kvt_sim_cache_remove(&p->tier[k], id, &pins);
                /* past the hit (recomputed), its stale copy goes too */
                if (s->found[tpos(s, i) + b] == 0)
                    s->found[tpos(s, i) + b] = (uint8_t)(1 + k);
            }
            idx_write(s, kvt_sim_cache_put(&p->tier[T_GPU], id, pins + 1));
        }
        for (uint32_t b = 0; b < s->reqs[i].route_pinned; b++)
            kvt_sim_cache_pin(&p->tier[T_GPU], q->hash_ids[b], -1);
        s->reqs[i].route_pinned = 0;
    }
    tiers_evict(s, pi);
    p->busy = true;
    p->busy_end = s->now + dur;
    s->r->busy_us[pi] += dur;
    s->r->batches++;
    ev_push(s, p->busy_end, EV_BATCH_DONE, pi);
}

/* The batch of pod @pi ends: first tokens, the engine's BlockStored, decodes begin. */
static void batch_done(tsim_t *s, uint32_t pi)
{
    tpod_t *p = &s->pods[pi];
    uint32_t pod = s->pod_id[pi];
    for (uint32_t i = p->bhead, nx; i != KVT_SIM_NONE; i = nx) {
        const kvt_trace_req_t *q = treq(s, i);
        req_t *rq = &s->reqs[i];
        const uint64_t *keys = s->keys + tpos(s, i);
        const uint8_t *found = s->found + tpos(s, i);
        nx = rq->next;
        rq->end = s->now;
        if (q->nblocks > 0)
            idx_write(
                s, kvt_idx_store(s->idx, s->ns, pod, KVT_TIER_GPU, NULL, keys, NULL, q->nblocks));
        for (uint32_t b = 0; b < q->nblocks; b++)
            if (found[b] > 1 + T_GPU)
                idx_write(s, kvt_idx_remove(s->idx, pod, KVT_TIER_CPU | KVT_TIER_DISK, &keys[b], 1,
                                            NULL));
        ev_push(s, s->now + (double)q->output_length * s->cfg->model.decode_us_per_token,
                EV_DECODE_DONE, i);
    }
    p->bhead = KVT_SIM_NONE;
    p->busy = false;
    batch_start(s, pi);
}

/* Request @i's decode ends: its blocks are freed tail first (block 0 ends most recent). */
static void decode_done(tsim_t *s, uint32_t i)
{
    const kvt_trace_req_t *q = treq(s, i);
    tpod_t *p = &s->pods[s->reqs[i].pod];
    for (uint32_t b = q->nblocks; b-- > 0;)
        kvt_sim_cache_pin(&p->tier[T_GPU], q->hash_ids[b], -1);
    tiers_evict(s, s->reqs[i].pod);
}

static bool speculates(kvt_sim_policy_t pol)
{
    return pol == KVT_SIM_PREFIX || pol == KVT_SIM_COST || pol == KVT_SIM_COST_TIERS;
}

/* Request @i arrives: routed at once, its held leading blocks pinned, queued. */
static kvt_status_t arrive(tsim_t *s, uint32_t i, char *why, size_t whylen)
{
    const kvt_sim_timed_config_t *cfg = s->cfg;
    const kvt_sim_model_t *m = &cfg->model;
    const kvt_trace_req_t *q = treq(s, i);
    const uint64_t *keys = s->keys + tpos(s, i);
    double block_us = (double)m->block_tokens * m->prefill_us_per_token;

    for (uint32_t pi = 0; pi < cfg->pods; pi++) {
        const tpod_t *p = &s->pods[pi];
        double run = p->busy && p->busy_end > s->now ? p->busy_end - s->now : 0.0;
        s->load[pi] = (p->queued_est_us + run) / block_us;
    }
    uint64_t sid = cfg->sessions != NULL ? cfg->sessions[i] : 0;
    uint32_t pi = kvt_sim_route(s->router, i, sid, keys, q->nblocks, s->load, why, whylen);
    if (pi == KVT_SIM_NONE)
        return KVT_ERR_INTERNAL;
    if (cfg->routed_ttl_ms > 0 && speculates(cfg->policy) && q->nblocks > 0) {
        kvt_status_t st =
            kvt_idx_speculate(s->idx, s->ns, s->pod_id[pi], keys, q->nblocks, cfg->routed_ttl_ms);
        if (st != KVT_OK) {
            kvt_errf(why, whylen, "index speculate: %s", kvt_status_str(st));
            return st;
        }
        s->r->speculated++;
    }
    tpod_t *p = &s->pods[pi];
    req_t *rq = &s->reqs[i];
    uint32_t hit[NTIERS];
    rq->pod = pi;
    rq->arrival = s->now;
    rq->next = KVT_SIM_NONE;
    rq->route_pinned = tiers_hit(p, q->hash_ids, q->nblocks, hit, NULL);
    for (uint32_t b = 0; b < rq->route_pinned; b++)
        kvt_sim_cache_pin(&p->tier[tier_of(p, q->hash_ids[b])], q->hash_ids[b], 1);
    rq->est_us = kvt_sim_prefill_tok_us(m, q->input_length, hit[T_GPU], hit[T_CPU], hit[T_DISK]);
    p->queued_est_us += rq->est_us;
    if (p->qtail == KVT_SIM_NONE)
        p->qhead = i;
    else
        s->reqs[p->qtail].next = i;
    p->qtail = i;
    batch_start(s, pi);
    return KVT_OK;
}

/* ---- setup and results ---------------------------------------------------------------------- */

static void tsim_cleanup(tsim_t *s)
{
    if (s->pods != NULL)
        for (uint32_t p = 0; p < s->cfg->pods; p++)
            for (int k = 0; k < NTIERS; k++)
                kvt_sim_cache_cleanup(&s->pods[p].tier[k]);
    free(s->pods);
    kvt_sim_router_destroy(s->router);
    if (s->reader != NULL)
        kvt_idx_reader_destroy(s->reader);
    kvt_idx_destroy(s->idx);
    free(s->pod_id);
    free(s->reqs);
    free(s->found);
    free(s->keys);
    free(s->heap);
    free(s->load);
}

static kvt_status_t tsim_init(tsim_t *s, const kvt_trace_t *t, const kvt_sim_timed_config_t *cfg,
                              kvt_sim_timed_result_t *r, char *why, size_t whylen)
{
    uint32_t np = cfg->pods;
    size_t nr = t->nreqs ? t->nreqs : 1, ni = t->nids ? t->nids : 1;
    kvt_status_t st;

    memset(s, 0, sizeof(*s));
    s->t = t;
    s->cfg = cfg;
    s->r = r;
    s->pods = calloc(np, sizeof(*s->pods));
    s->pod_id = calloc(np, sizeof(*s->pod_id));
    s->reqs = calloc(nr, sizeof(*s->reqs));
    s->found = calloc(ni, sizeof(*s->found));
    s->keys = malloc(ni * sizeof(*s->keys));
    s->heap = malloc((nr + np + 1) * sizeof(*s->heap));
    s->load = calloc(np, sizeof(*s->load));
    if (s->pods == NULL || s->pod_id == NULL || s->reqs == NULL || s->found == NULL ||
        s->keys == NULL || s->heap == NULL || s->load == NULL)
        return KVT_ERR_NO_MEM;
    for (size_t i = 0; i < t->nids; i++)
        s->keys[i] = kvt_sim_key(t->ids[i]);
    uint64_t caps[NTIERS] = {cfg->gpu_blocks, cfg->cpu_blocks, cfg->disk_blocks};
    if (caps[T_GPU] == 0 || caps[T_GPU] > t->nids)
        caps[T_GPU] = ni; /* unbounded: never more than the trace's blocks */
    for (uint32_t p = 0; p < np; p++) {
        s->pods[p].qhead = s->pods[p].qtail = s->pods[p].bhead = KVT_SIM_NONE;
        for (int k = 0; k < NTIERS; k++) {
            if (caps[k] == 0)
                continue;
            s->pods[p].has[k] = true;
            if ((st = kvt_sim_cache_init(&s->pods[p].tier[k], caps[k], t->max_blocks)) != KVT_OK)
                return st;
        }
    }
    if ((st = kvt_sim_index_open(np, &s->idx, &s->reader, &s->ns, s->pod_id, why, whylen)) !=
        KVT_OK)
        return st;
    /* cost-tiers: a block loaded instead of computed saves prefill_us - load_us a token */
    const kvt_sim_model_t *m = &cfg->model;
    kvt_sim_router_config_t rc = {
        .policy = cfg->policy,
        .pods = np,
        .seed = cfg->seed,
        .load_weight = cfg->load_weight,
        .sessions = cfg->sessions != NULL ? t->nreqs : 0,
        .approx_capacity = cfg->gpu_blocks ? cfg->gpu_blocks : (t->nids ? t->nids : 1),
        .max_blocks = t->max_blocks,
        .tier_cpu = (m->prefill_us_per_token - m->cpu_us_per_token) / m->prefill_us_per_token,
        .tier_disk = (m->prefill_us_per_token - m->disk_us_per_token) / m->prefill_us_per_token,
    };
    return kvt_sim_router_create(&rc, s->idx, s->reader, s->ns, s->pod_id, &s->router, why, whylen);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile @pct of sorted @v[0..n). */
static double pctl(const double *v, size_t n, double pct)
{
    if (n == 0)
        return 0.0;
    size_t k = (size_t)(pct / 100.0 * (double)n + 0.999999999);
    return v[k > 0 ? k - 1 : 0];
}

static kvt_status_t results(tsim_t *s)
{
    kvt_sim_timed_result_t *r = s->r;
    const kvt_trace_t *t = s->t;
    size_t n = t->nreqs;
    double *v = malloc((n ? n : 1) * sizeof(*v));
    if (v == NULL)
        return KVT_ERR_NO_MEM;
    double tsum = 0, qsum = 0, last = 0;
    for (size_t i = 0; i < n; i++) {
        const req_t *rq = &s->reqs[i];
        const kvt_trace_req_t *q = &t->reqs[i];
        uint32_t hit = rq->hit[0] + rq->hit[1] + rq->hit[2];
        r->req_pod[i] = rq->pod;
        r->req_hit[i] = hit;
        r->req_ttft_us[i] = rq->end - rq->arrival;
        r->req_queue_us[i] = rq->start - rq->arrival;
        for (int k = 0; k < NTIERS; k++)
            r->hit_tier[k] += rq->hit[k];
        r->hit_blocks += hit;
        r->total_blocks += q->nblocks;
        r->prompt_tokens += q->input_length;
        r->saved_tokens +=
            q->input_length - kvt_sim_miss_tokens(&s->cfg->model, q->input_length, hit);
        tsum += r->req_ttft_us[i];
        qsum += r->req_queue_us[i];
        double fin = rq->end + (double)q->output_length * s->cfg->model.decode_us_per_token;
        last = fin > last ? fin : last;
    }
    r->requests = n;
    r->hit_ratio = r->total_blocks ? (double)r->hit_blocks / (double)r->total_blocks : 0.0;
    r->ttft_mean_ms = n ? tsum / (double)n / 1000.0 : 0.0;
    r->queue_mean_ms = n ? qsum / (double)n / 1000.0 : 0.0;
    r->makespan_ms = last / 1000.0;
    memcpy(v, r->req_ttft_us, n * sizeof(*v));
    qsort(v, n, sizeof(*v), cmp_double);
    r->ttft_p50_ms = pctl(v, n, 50) / 1000.0;
    r->ttft_p90_ms = pctl(v, n, 90) / 1000.0;
    r->ttft_p99_ms = pctl(v, n, 99) / 1000.0;
    memcpy(v, r->req_queue_us, n * sizeof(*v));
    qsort(v, n, sizeof(*v), cmp_double);
    r->queue_p99_ms = pctl(v, n, 99) / 1000.0;
    free(v);
    double max = 0, sum = 0;
    for (uint32_t p = 0; p < r->pods; p++) {
        sum += r->busy_us[p];
        max = r->busy_us[p] > max ? r->busy_us[p] : max;
    }
    r->load_imbalance = sum > 0 ? max * r->pods / sum : 1.0;
    return KVT_OK;
}

/* Request indices in arrival order (stable: file order among equal timestamps). */
static int cmp_arrival(const void *a, const void *b, const kvt_trace_t *t)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    uint64_t tx = t->reqs[x].timestamp_ms, ty = t->reqs[y].timestamp_ms;
    return tx != ty ? (tx < ty ? -1 : 1) : (x < y ? -1 : x > y);
}

/* Insertion-free merge sort of @v[0..n) by arrival, @tmp scratch of n. */
static void sort_arrivals(uint32_t *v, uint32_t *tmp, size_t n, const kvt_trace_t *t)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    sort_arrivals(v, tmp, h, t);
    sort_arrivals(v + h, tmp, n - h, t);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = cmp_arrival(&v[j], &v[i], t) < 0 ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof(*v));
}

static kvt_status_t tsim_loop(tsim_t *s, char *why, size_t whylen)
{
    const kvt_trace_t *t = s->t;
    size_t n = t->nreqs;
    uint32_t *order = malloc((n ? n : 1) * sizeof(*order));
    uint32_t *tmp = malloc((n ? n : 1) * sizeof(*tmp));
    kvt_status_t st = KVT_OK;
    if (order == NULL || tmp == NULL) {
        free(order);
        free(tmp);
        return KVT_ERR_NO_MEM;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    sort_arrivals(order, tmp, n, t);
    free(tmp);

    size_t next = 0;
    while (st == KVT_OK && (next < n || s->nheap > 0)) {
        double ta =
            next < n ? (double)t->reqs[order[next]].timestamp_ms * 1000.0 / s->cfg->speedup : 0.0;
        if (s->nheap > 0 && (next >= n || s->heap[0].t <= ta)) {
            ev_t e = evh_pop(s->heap, &s->nheap);
            s->now = e.t;
            kvt_idx_advance(s->idx, (uint64_t)(s->now / 1000.0));
            if (e.kind == EV_BATCH_DONE)
                batch_done(s, e.arg);
            else
                decode_done(s, e.arg);
        } else {
            s->now = ta;
            kvt_idx_advance(s->idx, (uint64_t)(s->now / 1000.0));
            st = arrive(s, order[next++], why, whylen);
        }
        if (st == KVT_OK && s->st != KVT_OK) {
            st = s->st;
            kvt_errf(why, whylen, "index write: %s", kvt_status_str(st));
        }
    }
    free(order);
    return st;
}

kvt_status_t kvt_sim_timed_run(const kvt_trace_t *t, const kvt_sim_timed_config_t *cfg,
                               kvt_sim_timed_result_t *res, char *why, size_t whylen)
{
    kvt_sim_timed_result_t r = {0};
    tsim_t s;
    kvt_status_t st;

    if (res != NULL)
        memset(res, 0, sizeof(*res));
    if (t == NULL || cfg == NULL || res == NULL || cfg->pods == 0 || cfg->pods > KVT_IDX_MAX_PODS ||
        (unsigned)cfg->policy >= KVT_SIM_NPOLICIES || !(cfg->speedup > 0) ||
        !(cfg->model.prefill_us_per_token > 0) || cfg->model.block_tokens == 0 ||
        t->nreqs >= KVT_SIM_NONE || cfg->gpu_blocks >= KVT_SIM_NONE / 4 ||
        cfg->cpu_blocks >= KVT_SIM_NONE / 4 || cfg->disk_blocks >= KVT_SIM_NONE / 4) {
        kvt_errf(why, whylen, "bad arguments");
        return KVT_ERR_INVAL;
    }
    size_t nr = t->nreqs ? t->nreqs : 1;
    r.pods = cfg->pods;
    r.busy_us = calloc(cfg->pods, sizeof(*r.busy_us));
    r.req_pod = calloc(nr, sizeof(*r.req_pod));
    r.req_hit = calloc(nr, sizeof(*r.req_hit));
    r.req_ttft_us = calloc(nr, sizeof(*r.req_ttft_us));
    r.req_queue_us = calloc(nr, sizeof(*r.req_queue_us));
    st = tsim_init(&s, t, cfg, &r, why, whylen);
    if (st == KVT_OK && (r.busy_us == NULL || r.req_pod == NULL || r.req_hit == NULL ||
                         r.req_ttft_us == NULL || r.req_queue_us == NULL))
        st = KVT_ERR_NO_MEM;
    if (st == KVT_OK)
        st = tsim_loop(&s, why, whylen);
    if (st == KVT_OK)
        st = results(&s);
    if (st != KVT_OK) {
        if (st == KVT_ERR_NO_MEM)
            kvt_errf(why, whylen, "out of memory");
        tsim_cleanup(&s);
        kvt_sim_timed_result_cleanup(&r);
        return st;
    }
    tsim_cleanup(&s);
    *res = r;
    return KVT_OK;
}

void kvt_sim_timed_result_cleanup(kvt_sim_timed_result_t *res)
{
    if (res == NULL)
        return;
    free(res->busy_us);
    free(res->req_pod);
    free(res->req_hit);
    free(res->req_ttft_us);
    free(res->req_queue_us);
    memset(res, 0, sizeof(*res));
}
