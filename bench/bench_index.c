/*
 * kvtier-bench index: replays a Mooncake trace into the index.
 *
 * Every hash id of the trace stands for one block of B synthetic tokens
 * derived from the id, so requests that share ids share prefixes exactly as
 * in the trace. Keys (kvindex/hash.h) and engine hashes are computed before
 * the clock starts. Per request, in trace order: one query over all pods
 * (timed), a routing decision (not timed: it is the router's work), and one
 * store of the whole prompt on the chosen pod (timed). The same replay then
 * runs on the naive reference model (bench/naive_index.h) for comparison.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_index_int.h"
#include "bench/floor_index.h"
#include "bench/naive_index.h"
#include "bench/trace.h"
#include "common/clock.h"
#include "common/heap.h"
#include "kvindex/hash.h"
#include "kvindex/index.h"
#include "kvindex/score.h"

#define BI_VOCAB 128000u /* synthetic token ids: 0 .. BI_VOCAB - 1 */
#define BI_MAX_BLOCK 65536u

enum bi_route { BI_BEST, BI_SPREAD, BI_RR };
enum { BI_IMPL_KVTIER = 1, BI_IMPL_NAIVE = 2, BI_IMPL_FLOOR = 4 };

typedef struct bi_opts {
    const char *trace;
    uint32_t pods;
    uint32_t block_size;
    enum bi_route route;
    uint64_t budget;
    unsigned impls;
    double load_weight;
    uint32_t repeat; /* rounds per implementation; the best one is reported */
} bi_opts_t;

/* Everything computed before the clock starts. */
typedef struct bi_prep {
    const kvt_trace_t *t;
    uint64_t *keys;    /* t->nids sequence keys, request by request */
    uint64_t *ehashes; /* engine hash of each key */
    uint64_t total_blocks;
    uint64_t ideal_hits;
    uint32_t *pod_ids;   /* pod index -> index pod id */
    uint32_t *pod_index; /* index pod id -> pod index (UINT32_MAX: none) */
    uint32_t max_pod_id;
} bi_prep_t;

/* One replay's results. */
typedef struct bi_run {
    const char *name;
    uint64_t query_ns, store_ns;
    uint64_t p50_ns, p99_ns;
    uint64_t hit_blocks, chosen_blocks, stored_blocks;
    uint64_t bytes, entries, blocks;
    uint32_t *chosen;   /* per request: pod index */
    uint32_t *best;     /* per request: longest match over all pods */
    uint32_t *chosen_m; /* per request: match on the chosen pod */
    double ops_per_sec, lookups_per_sec, events_per_sec, bytes_per_entry;
} bi_run_t;

static void bi_usage(FILE *f)
{
    fprintf(f,
            "usage: kvtier-bench index --trace FILE --pods N [options]\n"
            "  --trace FILE        Mooncake trace (JSON lines with hash_ids)\n"
            "  --pods N            number of pods, 1..%u\n"
            "  --block-size B      tokens per block (default 16)\n"
            "  --route R           best | spread | rr (default best)\n"
            "  --budget-bytes X    index memory budget, suffix K/M/G allowed (default unbounded)\n"
            "  --impl I            all | both | kvtier | naive | floor (default all: kvtier,\n"
            "                      naive and floor; both: kvtier and naive; floor: kvtier\n"
            "                      and floor, which replays kvtier's stores)\n"
            "  --load-weight W     load weight of the spread route (default 1.0)\n"
            "  --repeat N          rounds per implementation, each on a fresh index; the\n"
            "                      best round is reported (default 3; machines are noisy)\n"
            "       kvtier-bench index --scale --entries N [options]\n"
            "  a generated workload (no trace) at N entries: see --scale --help\n"
            "The last output line is one JSON object with the results.\n",
            KVT_IDX_MAX_PODS);
}

static uint64_t bi_splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Strict decimal u64 with an optional K/M/G (binary) suffix. */
static int bi_parse_size(const char *s, uint64_t *v_p)
{
    uint64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (*p != '\0' && p[1] == '\0') {
        unsigned shift = 0;
        switch (*p) {
        case 'k':
        case 'K': shift = 10; break;
        case 'm':
        case 'M': shift = 20; break;
        case 'g':
        case 'G': shift = 30; break;
        default: return -1;
        }
        if (v > (UINT64_MAX >> shift))
            return -1;
        v <<= shift;
        p++;
    }
    if (*p != '\0')
        return -1;
    *v_p = v;
    return 0;
}

int kvt_bench_index_size_arg(const char *opt, const char *val, void *dst)
{
    uint64_t v;
    if (bi_parse_size(val, &v) != 0 || v == 0) {
        fprintf(stderr, "kvtier-bench: bad value for %s: '%s' (see --help)\n", opt, val);
        return -1;
    }
    *(uint64_t *)dst = v;
    return 0;
}

/* Returns 0 on success, 2 on a bad command line, -1 after --help. */
static int bi_parse_opts(int argc, char **argv, bi_opts_t *o)
{
    *o = (bi_opts_t){.block_size = 16, .route = BI_BEST, .load_weight = 1.0, .repeat = 3};
    static const char *const routes[] = {"best", "spread", "rr", NULL};
    static const char *const impls[] = {"all", "both", "floor", "kvtier", "naive", NULL};
    static const unsigned impl_sets[] = {
        BI_IMPL_KVTIER | BI_IMPL_NAIVE | BI_IMPL_FLOOR, BI_IMPL_KVTIER | BI_IMPL_NAIVE,
        BI_IMPL_KVTIER | BI_IMPL_FLOOR, BI_IMPL_KVTIER, BI_IMPL_NAIVE};
    uint32_t route = 0, impl = 0;
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_STR("--trace", &o->trace),
        KVT_BENCH_ARG_U32("--pods", &o->pods, 1, KVT_IDX_MAX_PODS),
        KVT_BENCH_ARG_U32("--block-size", &o->block_size, 1, BI_MAX_BLOCK),
        KVT_BENCH_ARG_CHOICE("--route", &route, routes),
        KVT_BENCH_ARG_CUSTOM("--budget-bytes", &o->budget, kvt_bench_index_size_arg),
        KVT_BENCH_ARG_CHOICE("--impl", &impl, impls),
        KVT_BENCH_ARG_DOUBLE("--load-weight", &o->load_weight, 0, 1e9),
        KVT_BENCH_ARG_U32("--repeat", &o->repeat, 1, 100),
    };
    int r = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (r > 0) {
        bi_usage(stdout);
        return -1;
    }
    if (r < 0)
        return 2;
    o->route = route == 0 ? BI_BEST : route == 1 ? BI_SPREAD : BI_RR;
    o->impls = impl_sets[impl];
    if (o->trace == NULL) {
        fprintf(stderr, "kvtier-bench: --trace is required (see --help)\n");
        return 2;
    }
    if (o->pods == 0) {
        fprintf(stderr, "kvtier-bench: --pods is required (see --help)\n");
        return 2;
    }
    return 0;
}

/* ---- preparation (untimed) ---- */

/* Counts blocks whose id appeared in an earlier request: the trace's ideal hits. */
static int bi_ideal_hits(const kvt_trace_t *t, uint64_t *hits_p)
{
    size_t cap = 16;
    while (cap < t->nids * 2)
        cap *= 2;
    uint64_t *slots = malloc(cap * sizeof(*slots));
    unsigned char *used = calloc(cap, 1);
    if (slots == NULL || used == NULL) {
        free(slots);
        free(used);
        return -1;
    }
    uint64_t hits = 0;
    for (size_t r = 0; r < t->nreqs; r++) {
        const kvt_trace_req_t *q = &t->reqs[r];
        for (uint32_t i = 0; i < q->nblocks; i++) {
            size_t s = bi_splitmix(q->hash_ids[i]) & (cap - 1);
            while (used[s] && slots[s] != q->hash_ids[i])
                s = (s + 1) & (cap - 1);
            hits += used[s];
        }
        for (uint32_t i = 0; i < q->nblocks; i++) {
            size_t s = bi_splitmix(q->hash_ids[i]) & (cap - 1);
            while (used[s] && slots[s] != q->hash_ids[i])
                s = (s + 1) & (cap - 1);
            used[s] = 1;
            slots[s] = q->hash_ids[i];
        }
    }
    free(slots);
    free(used);
    *hits_p = hits;
    return 0;
}

static int bi_prepare(const kvt_trace_t *t, uint32_t block_size, bi_prep_t *p)
{
    p->t = t;
    p->keys = malloc((t->nids ? t->nids : 1) * sizeof(uint64_t));
    p->ehashes = malloc((t->nids ? t->nids : 1) * sizeof(uint64_t));
    size_t ntok = (size_t)t->max_blocks * block_size;
    uint32_t *tokens = malloc((ntok ? ntok : 1) * sizeof(uint32_t));
    if (p->keys == NULL || p->ehashes == NULL || tokens == NULL) {
        free(tokens);
        return -1;
    }
    for (size_t r = 0; r < t->nreqs; r++) {
        const kvt_trace_req_t *q = &t->reqs[r];
        size_t off = (size_t)(q->hash_ids - t->ids);
        for (uint32_t b = 0; b < q->nblocks; b++) {
            uint64_t base = q->hash_ids[b] * 1000003u;
            for (uint32_t j = 0; j < block_size; j++)
                tokens[(size_t)b * block_size + j] = (uint32_t)(bi_splitmix(base + j) % BI_VOCAB);
        }
        size_t nb = kvt_hash_seq(tokens, (size_t)q->nblocks * block_size, block_size, KVT_HASH_SEED,
                                 NULL, NULL, p->keys + off);
        if (nb != q->nblocks) {
            free(tokens);
            return -1;
        }
        /* engine hashes: a fixed mix of the key, the same on every pod (like vLLM's) */
        for (uint32_t b = 0; b < q->nblocks; b++)
            p->ehashes[off + b] = bi_splitmix(p->keys[off + b] ^ 0x6b7674696572ull);
        p->total_blocks += q->nblocks;
    }
    free(tokens);
    return bi_ideal_hits(t, &p->ideal_hits);
}

/* ---- load simulation for the spread route ---- */

typedef struct bi_active {
    double end_ms;
    uint32_t pod;
} bi_active_t;

typedef struct bi_load {
    double *load; /* indexed by pod id */
    size_t nload;
    bi_active_t *heap; /* min-heap on end_ms */
    size_t n;
} bi_load_t;

static inline bool bi_ends_first(const bi_active_t *a, const bi_active_t *b)
{
    return a->end_ms < b->end_ms;
}

KVT_HEAP_DEFINE(bi_heap, bi_active_t, bi_ends_first)

/* Ends the requests finished by @now_ms: a request is active in [start, start + service). */
static void bi_load_expire(bi_load_t *l, double now_ms)
{
    while (l->n > 0 && l->heap[0].end_ms <= now_ms) {
        bi_active_t a = bi_heap_pop(l->heap, &l->n);
        l->load[a.pod] -= 1.0;
    }
}

/* ---- the replay ---- */

/*
 * Replays the trace on the index (@idx, @reader, @ns) or, when @idx is NULL,
 * on the naive model @nv. Returns 0, or -1 after printing an error.
 */
static int bi_replay(const bi_opts_t *o, const bi_prep_t *p, kvt_idx_t *idx,
                     kvt_idx_reader_t *reader, uint32_t ns, kvt_naive_t *nv, bi_run_t *run)
{
    const kvt_trace_t *t = p->t;
    int rc = -1;
    uint64_t *lat = malloc((t->nreqs ? t->nreqs : 1) * sizeof(*lat));
    kvt_idx_match_t *nres = malloc(o->pods * sizeof(*nres));
    bi_load_t load = {.nload = (size_t)p->max_pod_id + 1};
    load.load = calloc(load.nload, sizeof(double));
    load.heap = malloc((t->nreqs ? t->nreqs : 1) * sizeof(*load.heap));
    run->chosen = malloc((t->nreqs ? t->nreqs : 1) * sizeof(uint32_t));
    run->best = malloc((t->nreqs ? t->nreqs : 1) * sizeof(uint32_t));
    run->chosen_m = malloc((t->nreqs ? t->nreqs : 1) * sizeof(uint32_t));
    if (lat == NULL || nres == NULL || load.load == NULL || load.heap == NULL ||
        run->chosen == NULL || run->best == NULL || run->chosen_m == NULL) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto out;
    }
    kvt_score_weights_t w;
    kvt_score_weights_default(&w);
    if (o->route == BI_BEST) {
        /* longest match in any tier, ties spread by the pick's hash */
        w.gpu = w.cpu = w.disk = 1.0;
        w.load = 0.0;
    } else {
        w.load = o->load_weight;
    }
    for (size_t r = 0; r < t->nreqs; r++) {
        const kvt_trace_req_t *q = &t->reqs[r];
        size_t off = (size_t)(q->hash_ids - t->ids);
        const uint64_t *keys = p->keys + off;
        const uint64_t *ehs = p->ehashes + off;
        const kvt_idx_match_t *res;
        size_t nr;
        uint64_t t0, t1;

        if (idx != NULL) {
            kvt_idx_advance(idx, q->timestamp_ms);
            t0 = kvt_clock_ns();
            kvt_status_t st = kvt_idx_query(reader, ns, keys, q->nblocks, NULL, 0, &res, &nr);
            t1 = kvt_clock_ns();
            if (st != KVT_OK) {
                fprintf(stderr, "kvtier-bench: query failed: %s\n", kvt_status_str(st));
                goto out;
            }
        } else {
            kvt_naive_advance(nv, q->timestamp_ms);
            t0 = kvt_clock_ns();
            nr = kvt_naive_query(nv, ns, keys, q->nblocks, NULL, 0, nres, o->pods);
            t1 = kvt_clock_ns();
            res = nres;
        }
        lat[r] = t1 - t0;
        run->query_ns += t1 - t0;

        uint32_t best = 0;
        for (size_t i = 0; i < nr; i++)
            if (res[i].matched > best)
                best = res[i].matched;
        run->best[r] = best;
        run->hit_blocks += best;

        /* routing: the router's work, not timed */
        uint32_t pod;
        uint64_t seed = (q->nblocks ? keys[0] : 0) ^ (uint64_t)r;
        if (o->route == BI_RR) {
            pod = p->pod_ids[r % o->pods];
        } else {
            const double *ld = NULL;
            if (o->route == BI_SPREAD) {
                bi_load_expire(&load, (double)q->timestamp_ms);
                ld = load.load;
            }
            pod = kvt_score_pick(&w, res, nr, p->pod_ids, o->pods, ld, ld ? load.nload : 0, seed,
                                 NULL);
            if (pod > p->max_pod_id || p->pod_index[pod] == UINT32_MAX) {
                fprintf(stderr, "kvtier-bench: scorer picked unknown pod %" PRIu32 "\n", pod);
                goto out;
            }
            if (o->route == BI_SPREAD) {
                double service = q->input_length * 0.1 + q->output_length * 25.0;
                bi_heap_push(load.heap, &load.n,
                             (bi_active_t){(double)q->timestamp_ms + service, pod});
                load.load[pod] += 1.0;
            }
        }
        uint32_t cm = 0;
        for (size_t i = 0; i < nr; i++)
            if (res[i].pod == pod)
                cm = res[i].matched;
        run->chosen[r] = p->pod_index[pod];
        run->chosen_m[r] = cm;
        run->chosen_blocks += cm;

        if (q->nblocks == 0)
            continue;
        if (idx != NULL) {
            t0 = kvt_clock_ns();
            kvt_status_t st =
                kvt_idx_store(idx, ns, pod, KVT_TIER_GPU, NULL, keys, ehs, q->nblocks);
            t1 = kvt_clock_ns();
            if (st != KVT_OK) {
                fprintf(stderr, "kvtier-bench: store failed: %s\n", kvt_status_str(st));
                goto out;
            }
        } else {
            t0 = kvt_clock_ns();
            kvt_naive_store(nv, ns, pod, KVT_TIER_GPU, keys, ehs, q->nblocks);
            t1 = kvt_clock_ns();
        }
        run->store_ns += t1 - t0;
        run->stored_blocks += q->nblocks;
    }

    kvt_bench_sort_u64(lat, t->nreqs);
    run->p50_ns = (uint64_t)(kvt_bench_percentile(lat, t->nreqs, 50) + 0.5);
    run->p99_ns = (uint64_t)(kvt_bench_percentile(lat, t->nreqs, 99) + 0.5);
    uint64_t total_ns = run->query_ns + run->store_ns;
    run->ops_per_sec =
        total_ns ? (double)(t->nreqs + run->stored_blocks) * 1e9 / (double)total_ns : 0.0;
    run->lookups_per_sec = run->query_ns ? (double)t->nreqs * 1e9 / (double)run->query_ns : 0.0;
    run->events_per_sec =
        run->store_ns ? (double)run->stored_blocks * 1e9 / (double)run->store_ns : 0.0;
    if (idx != NULL) {
        kvt_idx_stats_t st;
        kvt_idx_stats(idx, &st);
        run->bytes = st.bytes;
        run->entries = st.entries;
        run->blocks = st.blocks;
    } else {
        run->bytes = kvt_naive_bytes(nv);
        run->entries = kvt_naive_entries(nv);
        run->blocks = kvt_naive_blocks(nv);
    }
    run->bytes_per_entry = run->entries ? (double)run->bytes / (double)run->entries : 0.0;
    rc = 0;
out:
    free(lat);
    free(nres);
    free(load.load);
    free(load.heap);
    return rc;
}

static void bi_run_free(bi_run_t *run)
{
    free(run->chosen);
    free(run->best);
    free(run->chosen_m);
}

static int bi_run_kvtier(const bi_opts_t *o, bi_prep_t *p, bi_run_t *run)
{
    kvt_idx_config_t cfg = {.budget_bytes = o->budget};
    kvt_idx_t *idx;
    kvt_idx_reader_t *reader;
    uint32_t ns;
    char name[32];
    kvt_status_t st = kvt_idx_create(&cfg, &idx);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: kvt_idx_create: %s\n", kvt_status_str(st));
        return -1;
    }
    st = kvt_idx_ns_get(idx, "bench-model", NULL, o->block_size, &ns);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: kvt_idx_ns_get: %s\n", kvt_status_str(st));
        goto err_idx;
    }
    for (uint32_t i = 0; i < o->pods; i++) {
        snprintf(name, sizeof(name), "pod-%" PRIu32, i);
        st = kvt_idx_pod_get(idx, name, 0, &p->pod_ids[i]);
        if (st != KVT_OK) {
            fprintf(stderr, "kvtier-bench: kvt_idx_pod_get: %s\n", kvt_status_str(st));
            goto err_idx;
        }
    }
    st = kvt_idx_reader_create(idx, &reader);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: kvt_idx_reader_create: %s\n", kvt_status_str(st));
        goto err_idx;
    }
    /* reverse map for routing; the naive replay reuses the same pod ids */
    p->max_pod_id = 0;
    for (uint32_t i = 0; i < o->pods; i++) {
        if (p->pod_ids[i] >= KVT_NAIVE_MAX_PODS) {
            fprintf(stderr, "kvtier-bench: pod id %" PRIu32 " out of range\n", p->pod_ids[i]);
            goto err_reader;
        }
        if (p->pod_ids[i] > p->max_pod_id)
            p->max_pod_id = p->pod_ids[i];
    }
    for (uint32_t i = 0; i < KVT_NAIVE_MAX_PODS; i++)
        p->pod_index[i] = UINT32_MAX;
    for (uint32_t i = 0; i < o->pods; i++)
        p->pod_index[p->pod_ids[i]] = i;

    if (bi_replay(o, p, idx, reader, ns, NULL, run) != 0)
        goto err_reader;
    kvt_idx_reader_destroy(reader);
    kvt_idx_destroy(idx);
    return 0;

err_reader:
    kvt_idx_reader_destroy(reader);
err_idx:
    kvt_idx_destroy(idx);
    return -1;
}

static int bi_run_naive(const bi_opts_t *o, const bi_prep_t *p, bi_run_t *run)
{
    kvt_naive_t *nv;
    if (kvt_naive_create(&nv) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        return -1;
    }
    int rc = bi_replay(o, p, NULL, NULL, 0, nv, run);
    kvt_naive_destroy(nv);
    return rc;
}

/*
 * Replays the stores of kvtier's round (@chosen: pod index per request) into
 * the floor index. No queries: its ops/s is what the stores alone allow, as
 * if lookups were free.
 */
static int bi_run_floor(const bi_prep_t *p, const uint32_t *chosen, bi_run_t *run)
{
    const kvt_trace_t *t = p->t;
    kvt_floor_t *f;
    if (kvt_floor_create(p->max_pod_id + 1, &f) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        return -1;
    }
    for (size_t r = 0; r < t->nreqs; r++) {
        const kvt_trace_req_t *q = &t->reqs[r];
        size_t off = (size_t)(q->hash_ids - t->ids);
        if (q->nblocks == 0)
            continue;
        uint64_t t0 = kvt_clock_ns();
        kvt_status_t st =
            kvt_floor_store(f, p->pod_ids[chosen[r]], p->keys + off, p->ehashes + off, q->nblocks);
        uint64_t t1 = kvt_clock_ns();
        if (st != KVT_OK) {
            fprintf(stderr, "kvtier-bench: floor store failed: %s\n", kvt_status_str(st));
            kvt_floor_destroy(f);
            return -1;
        }
        run->store_ns += t1 - t0;
        run->stored_blocks += q->nblocks;
    }
    run->ops_per_sec =
        run->store_ns ? (double)(t->nreqs + run->stored_blocks) * 1e9 / (double)run->store_ns : 0.0;
    run->events_per_sec =
        run->store_ns ? (double)run->stored_blocks * 1e9 / (double)run->store_ns : 0.0;
    run->bytes = kvt_floor_bytes(f);
    run->entries = kvt_floor_entries(f);
    run->blocks = kvt_floor_blocks(f);
    run->bytes_per_entry = run->entries ? (double)run->bytes / (double)run->entries : 0.0;
    kvt_floor_destroy(f);
    return 0;
}

/* Index of the first request where the two runs differ, or SIZE_MAX. */
static size_t bi_first_diff(const bi_run_t *a, const bi_run_t *b, size_t nreqs)
{
    for (size_t r = 0; r < nreqs; r++)
        if (a->chosen[r] != b->chosen[r] || a->best[r] != b->best[r] ||
            a->chosen_m[r] != b->chosen_m[r])
            return r;
    return a->hit_blocks == b->hit_blocks ? SIZE_MAX : nreqs;
}

/* Runs one round of @impl and keeps it in *@best if it is the fastest so far. */
static int bi_round(const bi_opts_t *o, bi_prep_t *p, unsigned impl, const uint32_t *chosen,
                    uint32_t round, bi_run_t *best)
{
    bi_run_t r = {.name = best->name};
    int rc = impl == BI_IMPL_KVTIER  ? bi_run_kvtier(o, p, &r)
             : impl == BI_IMPL_NAIVE ? bi_run_naive(o, p, &r)
                                     : bi_run_floor(p, chosen, &r);
    if (rc != 0)
        return rc;
    /* replays are deterministic, and the floor relies on it (it replays one round's pods) */
    if (round > 0 && r.chosen != NULL && bi_first_diff(&r, best, p->t->nreqs) != SIZE_MAX) {
        fprintf(stderr, "kvtier-bench: %s: round %" PRIu32 " routed differently from round 0\n",
                r.name, round);
        bi_run_free(&r);
        return -1;
    }
    if (round == 0 || r.ops_per_sec > best->ops_per_sec) {
        bi_run_free(best);
        *best = r;
    } else {
        bi_run_free(&r);
    }
    return 0;
}

static void bi_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

static double bi_ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

static void bi_table_row(const bi_run_t *r, uint64_t total_blocks)
{
    printf("%-8s %14.0f %14.0f %14.0f %10" PRIu64 " %10" PRIu64 " %12.2f %10.4f\n", r->name,
           r->ops_per_sec, r->lookups_per_sec, r->events_per_sec, r->p50_ns, r->p99_ns,
           r->bytes_per_entry, bi_ratio(r->hit_blocks, total_blocks));
}

int kvt_bench_index_main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--scale") == 0)
            return kvt_bench_index_scale_main(argc, argv);
    bi_opts_t o;
    int rc = bi_parse_opts(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;

    char err[256] = "";
    kvt_trace_t *t;
    kvt_status_t st = kvt_trace_load(o.trace, &t, err, sizeof(err));
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: %s: %s\n", o.trace, err[0] ? err : kvt_status_str(st));
        return 1;
    }
    if (t->nreqs == 0) {
        fprintf(stderr, "kvtier-bench: %s: no requests\n", o.trace);
        kvt_trace_free(t);
        return 1;
    }

    rc = 1;
    bi_prep_t p = {0};
    bi_run_t kv = {.name = "kvtier"}, nv = {.name = "naive"}, fl = {.name = "floor"};
    p.pod_ids = malloc(o.pods * sizeof(uint32_t));
    p.pod_index = malloc(KVT_NAIVE_MAX_PODS * sizeof(uint32_t));
    if (p.pod_ids == NULL || p.pod_index == NULL || bi_prepare(t, o.block_size, &p) != 0) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        goto out;
    }
    /* pod-i is pod id i unless the index hands out other ids (then the naive reuses them) */
    for (uint32_t i = 0; i < o.pods; i++)
        p.pod_ids[i] = i;
    for (uint32_t i = 0; i < KVT_NAIVE_MAX_PODS; i++)
        p.pod_index[i] = i < o.pods ? i : UINT32_MAX;
    p.max_pod_id = o.pods - 1;

    int have_kv = (o.impls & BI_IMPL_KVTIER) != 0, have_nv = (o.impls & BI_IMPL_NAIVE) != 0;
    /* the floor has no budget: with one its entries would not be kvtier's */
    int have_fl = (o.impls & BI_IMPL_FLOOR) != 0 && o.budget == 0;
    /* rounds alternate between the implementations so all see the same noise */
    for (uint32_t round = 0; round < o.repeat; round++) {
        if (have_kv && bi_round(&o, &p, BI_IMPL_KVTIER, NULL, round, &kv) != 0)
            goto out;
        if (have_nv && bi_round(&o, &p, BI_IMPL_NAIVE, NULL, round, &nv) != 0)
            goto out;
        /* routing is deterministic: every kvtier round chose the same pods */
        if (have_fl && bi_round(&o, &p, BI_IMPL_FLOOR, kv.chosen, round, &fl) != 0)
            goto out;
    }

    const bi_run_t *main_run = have_kv ? &kv : &nv;
    const char *route = o.route == BI_BEST ? "best" : o.route == BI_SPREAD ? "spread" : "rr";
    double ideal = bi_ratio(p.ideal_hits, p.total_blocks);
    printf("trace %s: %zu requests, %" PRIu64 " blocks; pods %" PRIu32 ", route %s, "
           "block size %" PRIu32 ", budget %s\n",
           o.trace, t->nreqs, p.total_blocks, o.pods, route, o.block_size,
           o.budget ? "set" : "unbounded");
    printf("%-8s %14s %14s %14s %10s %10s %12s %10s\n", "impl", "ops/s", "lookups/s", "events/s",
           "p50_ns", "p99_ns", "bytes/entry", "hit_ratio");
    if (have_kv)
        bi_table_row(&kv, p.total_blocks);
    if (have_nv)
        bi_table_row(&nv, p.total_blocks);
    if (have_fl)
        printf("%-8s %14.0f %14s %14.0f %10s %10s %12.2f %10s  (stores only: lookups free)\n",
               fl.name, fl.ops_per_sec, "-", fl.events_per_sec, "-", "-", fl.bytes_per_entry, "-");
    if ((o.impls & BI_IMPL_FLOOR) && !have_fl)
        printf("floor not run (it has no memory budget)\n");
    printf("ideal hit ratio %.4f; chosen-pod hit ratio %.4f", ideal,
           bi_ratio(main_run->chosen_blocks, p.total_blocks));
    printf("\n");
    if (have_kv)
        printf("kvtier: %" PRIu64 " entries, %" PRIu64 " blocks, %" PRIu64 " bytes\n", kv.entries,
               kv.blocks, kv.bytes);
    if (have_nv)
        printf("naive: %" PRIu64 " entries, %" PRIu64 " blocks, %" PRIu64 " bytes\n", nv.entries,
               nv.blocks, nv.bytes);
    /* the floor stored what kvtier stored: same entries and blocks, or the yardstick is off */
    int floor_agree = have_fl && fl.entries == kv.entries && fl.blocks == kv.blocks;
    if (have_fl)
        printf("floor: %" PRIu64 " entries, %" PRIu64 " blocks, %" PRIu64 " bytes; %s kvtier's\n",
               fl.entries, fl.blocks, fl.bytes, floor_agree ? "same counts as" : "DIFFERS FROM");
    if (o.budget == 0) {
        if (have_kv && kv.hit_blocks != p.ideal_hits)
            fprintf(stderr, "warning: kvtier hit ratio %.6f differs from the ideal %.6f\n",
                    bi_ratio(kv.hit_blocks, p.total_blocks), ideal);
        if (have_nv && nv.hit_blocks != p.ideal_hits)
            fprintf(stderr, "warning: naive hit ratio %.6f differs from the ideal %.6f\n",
                    bi_ratio(nv.hit_blocks, p.total_blocks), ideal);
    }
    int agree = -1; /* not compared */
    if (have_kv && have_nv) {
        if (o.budget != 0) {
            printf("naive and kvtier not compared (the naive model has no budget)\n");
        } else {
            size_t d = bi_first_diff(&kv, &nv, t->nreqs);
            agree = d == SIZE_MAX;
            if (agree)
                printf("naive and kvtier agree\n");
            else if (d < t->nreqs)
                printf("naive and kvtier differ at request %zu: kvtier chose pod-%" PRIu32
                       " (matched %" PRIu32 ", best %" PRIu32 "), naive chose pod-%" PRIu32
                       " (matched %" PRIu32 ", best %" PRIu32 ")\n",
                       d, kv.chosen[d], kv.chosen_m[d], kv.best[d], nv.chosen[d], nv.chosen_m[d],
                       nv.best[d]);
            else
                printf("naive and kvtier differ in hit blocks\n");
        }
    }

    printf("{\"bench\":\"index\",\"trace\":");
    bi_json_str(stdout, o.trace);
    printf(",\"impl\":\"%s\",\"requests\":%zu,\"pods\":%" PRIu32 ",\"route\":\"%s\","
           "\"block_size\":%" PRIu32 ",\"budget_bytes\":%" PRIu64 ",\"repeat\":%" PRIu32
           ",\"ops_per_sec\":%.1f,"
           "\"events_per_sec\":%.1f,\"lookups_per_sec\":%.1f,\"lookup_p50_ns\":%" PRIu64
           ",\"lookup_p99_ns\":%" PRIu64 ",\"bytes_per_entry\":%.2f,\"entries\":%" PRIu64
           ",\"blocks\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"hit_blocks\":%" PRIu64
           ",\"total_blocks\":%" PRIu64 ",\"hit_ratio\":%.6f,\"ideal_hit_ratio\":%.6f"
           ",\"chosen_hit_ratio\":%.6f",
           main_run->name, t->nreqs, o.pods, route, o.block_size, o.budget, o.repeat,
           main_run->ops_per_sec, main_run->events_per_sec, main_run->lookups_per_sec,
           main_run->p50_ns, main_run->p99_ns, main_run->bytes_per_entry, main_run->entries,
           main_run->blocks, main_run->bytes, main_run->hit_blocks, p.total_blocks,
           bi_ratio(main_run->hit_blocks, p.total_blocks), ideal,
           bi_ratio(main_run->chosen_blocks, p.total_blocks));
    if (have_nv)
        printf(",\"naive_ops_per_sec\":%.1f,\"naive_lookup_p50_ns\":%" PRIu64
               ",\"naive_lookup_p99_ns\":%" PRIu64 ",\"naive_bytes_per_entry\":%.2f"
               ",\"naive_hit_blocks\":%" PRIu64,
               nv.ops_per_sec, nv.p50_ns, nv.p99_ns, nv.bytes_per_entry, nv.hit_blocks);
    if (have_kv && have_nv) {
        printf(",\"speedup_vs_naive\":%.3f,\"memory_ratio_vs_naive\":%.4f",
               nv.ops_per_sec > 0 ? kv.ops_per_sec / nv.ops_per_sec : 0.0,
               nv.bytes_per_entry > 0 ? kv.bytes_per_entry / nv.bytes_per_entry : 0.0);
        if (agree >= 0)
            printf(",\"agree\":%s", agree ? "true" : "false");
    }
    if (have_fl)
        printf(",\"floor_ops_per_sec\":%.1f,\"floor_events_per_sec\":%.1f"
               ",\"floor_bytes_per_entry\":%.2f,\"events_vs_floor\":%.3f,\"floor_agree\":%s",
               fl.ops_per_sec, fl.events_per_sec, fl.bytes_per_entry,
               fl.events_per_sec > 0 ? kv.events_per_sec / fl.events_per_sec : 0.0,
               floor_agree ? "true" : "false");
    printf("}\n");
    fflush(stdout);
    rc = 0;
out:
    bi_run_free(&kv);
    bi_run_free(&nv);
    bi_run_free(&fl);
    free(p.keys);
    free(p.ehashes);
    free(p.pod_ids);
    free(p.pod_index);
    kvt_trace_free(t);
    return rc;
}
