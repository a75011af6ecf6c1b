/*
 * kvtier-bench index --scale: the index at sizes no bundled trace reaches.
 *
 * The workload is generated in-process from --seed (bench_index_gen.c: system
 * prompts of Zipf popularity, multi-turn sessions spread over --pods, now
 * and then moving to another pod); no trace file. Its BlockStored events are
 * applied as the daemon's writer applies them: in batches, the index clock
 * advanced before each batch, every batch timed. The fill stops at
 * checkpoints (the yardstick, x10, x100, ... below --entries, then
 * --entries) to time queries one by one and read the memory: the index's own
 * count of bytes and the process's resident set. Before filling past a
 * checkpoint the resident set at --entries is projected from what the fill
 * used so far, and a run that would not fit in MemAvailable is refused.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_index_int.h"
#include "bench/progress.h"
#include "common/clock.h"
#include "kvindex/index.h"

#define SC_MIB (1024.0 * 1024.0)
#define SC_MAX_POINTS 16
/* MemAvailable kept free: the fill stops, and projections refuse, at this margin. */
#define SC_RESERVE (512ull << 20)
/* Bytes an entry costs at least (a block node alone is 32): the check before any fill. */
#define SC_PRIOR_BYTES 40u
/* Headroom on a projection from the resident set so far (tables grow in steps). */
#define SC_PROJECT_MARGIN 1.10
#define SC_WATCH_EVERY 64u /* batches between two reads of /proc/meminfo */

typedef struct sc_opts {
    bool scale;
    uint64_t entries;   /* target (block, pod) entries */
    uint64_t yardstick; /* first checkpoint */
    uint64_t seed;
    uint64_t max_rss; /* 0: MemAvailable is the limit */
    uint32_t pods, prompts, active, move_pct;
    uint32_t batch;   /* events per batch */
    uint32_t queries; /* per checkpoint */
    uint32_t qmin, qmax;
} sc_opts_t;

/* One set of timed queries. */
typedef struct sc_lat {
    uint64_t p50_ns, p99_ns, p999_ns;
    double answer_pods, query_blocks, hit_blocks; /* means per query */
} sc_lat_t;

/* What a checkpoint measured. */
typedef struct sc_point {
    uint64_t entries, blocks, bytes, sessions;
    uint64_t expect_entries, expect_blocks;
    uint64_t rss, peak_rss;
    uint64_t events, block_events; /* BlockStored events and blocks in them, this segment */
    uint64_t store_ns;             /* time in timed batches, this segment */
    uint64_t batches, batch_p99_ns, batch_max_ns;
    uint64_t batch_max_blocks; /* distinct blocks stored when the longest batch ended */
    int64_t batch_max_grew;    /* index bytes that batch added (a table's growth shows here) */
    double fill_s;             /* wall time of the segment, generating the events included */
    sc_lat_t req, chain;       /* the requests' queries, the chain queries (kvt_sgen_qkind_t) */
    double bytes_per_entry, rss_per_entry;
    uint64_t projected_rss; /* resident set projected at --entries from this point */
} sc_point_t;

/* The run's state. */
typedef struct sc_run {
    const sc_opts_t *o;
    kvt_sgen_t *gen;
    kvt_idx_t *idx;
    kvt_idx_reader_t *reader;
    uint32_t ns;
    uint32_t *pod_ids;
    kvt_sgen_event_t *evs; /* one batch */
    uint64_t *ehs;         /* their engine hashes: KVT_SGEN_EVENT_MAX per event */
    uint64_t *bat;         /* this segment's batch times */
    size_t nbat, capbat;
    uint64_t *lat; /* query times */
    uint64_t *qkeys;
    uint64_t now_ms; /* the index clock: one tick a batch */
    uint64_t rss_base;
    sc_point_t pts[SC_MAX_POINTS];
    size_t npts;
} sc_run_t;

static void sc_usage(FILE *f)
{
    fprintf(f,
            "usage: kvtier-bench index --scale --entries N [options]\n"
            "Fills one index with a generated workload (no trace file; deterministic from\n"
            "--seed) to N (block, pod) entries, timing the event batches, and times queries\n"
            "at each checkpoint: the yardstick, x10, x100, ... and N.\n"
            "  --entries N         target (block, pod) entries, 1..4000000000\n"
            "  --pods P            pods (default 10000), 1..%u\n"
            "  --seed S            workload seed (default 1)\n"
            "  --yardstick M       first checkpoint (default 1000000; at most N)\n"
            "  --queries Q         queries timed at each checkpoint (default 100000)\n"
            "  --query-min B       blocks a query has at least (default 8)\n"
            "  --query-max B       blocks a query has at most (default 64)\n"
            "  --batch E           BlockStored events per writer batch (default 64)\n"
            "  --prompts K         system prompts, Zipf(1) popularity (default 1000)\n"
            "  --active A          sessions in progress at once (default 16384)\n"
            "  --move-pct X        percent of turns that move a session to another pod\n"
            "                      (default 10)\n"
            "  --max-rss BYTES     refuse or stop past this resident set (K/M/G allowed;\n"
            "                      default: what MemAvailable allows, less 512 MiB)\n"
            "A run whose projected resident set exceeds the limit is refused (exit 1).\n"
            "The last output line is one JSON object with the results.\n",
            KVT_IDX_MAX_PODS);
}

/* Returns 0 on success, 2 on a bad command line, -1 after --help. */
static int sc_parse_opts(int argc, char **argv, sc_opts_t *o)
{
    *o = (sc_opts_t){.yardstick = 1000000,
                     .seed = 1,
                     .pods = 10000,
                     .prompts = 1000,
                     .active = 16384,
                     .move_pct = 10,
                     .batch = 64,
                     .queries = 100000,
                     .qmin = 8,
                     .qmax = 64};
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_FLAG("--scale", &o->scale),
        KVT_BENCH_ARG_U64("--entries", &o->entries, 1, 4000000000ull),
        KVT_BENCH_ARG_U32("--pods", &o->pods, 1, KVT_IDX_MAX_PODS),
        KVT_BENCH_ARG_U64("--seed", &o->seed, 0, UINT64_MAX),
        KVT_BENCH_ARG_U64("--yardstick", &o->yardstick, 1, 4000000000ull),
        KVT_BENCH_ARG_U32("--queries", &o->queries, 1, 10000000),
        KVT_BENCH_ARG_U32("--query-min", &o->qmin, 1, 1024),
        KVT_BENCH_ARG_U32("--query-max", &o->qmax, 1, 1024),
        KVT_BENCH_ARG_U32("--batch", &o->batch, 1, 4096),
        KVT_BENCH_ARG_U32("--prompts", &o->prompts, 1, 100000),
        KVT_BENCH_ARG_U32("--active", &o->active, 1, 1u << 24),
        KVT_BENCH_ARG_U32("--move-pct", &o->move_pct, 0, 100),
        KVT_BENCH_ARG_CUSTOM("--max-rss", &o->max_rss, kvt_bench_index_size_arg),
    };
    int r = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (r > 0) {
        sc_usage(stdout);
        return -1;
    }
    if (r < 0)
        return 2;
    if (o->entries == 0) {
        fprintf(stderr, "kvtier-bench: --scale needs --entries (see --scale --help)\n");
        return 2;
    }
    if (o->qmin > o->qmax) {
        fprintf(stderr, "kvtier-bench: --query-min %" PRIu32 " is above --query-max %" PRIu32 "\n",
                o->qmin, o->qmax);
        return 2;
    }
    if ((uint64_t)o->prompts * o->pods > (1ull << 31)) {
        fprintf(stderr, "kvtier-bench: --prompts x --pods is at most 2^31 (one bit each)\n");
        return 2;
    }
    if (o->yardstick > o->entries)
        o->yardstick = o->entries;
    return 0;
}

/* ---- memory ---- */

/* The "@field: N kB" line of @path, in bytes; 0 when it cannot be read. */
static uint64_t sc_proc_kb(const char *path, const char *field)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char line[256];
    size_t len = strlen(field);
    unsigned long long kb = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, field, len) == 0 && line[len] == ':') {
            if (sscanf(line + len + 1, "%llu", &kb) != 1)
                kb = 0;
            break;
        }
    }
    fclose(f);
    return (uint64_t)kb * 1024;
}

static uint64_t sc_rss(void)
{
    return sc_proc_kb("/proc/self/status", "VmRSS");
}

static uint64_t sc_peak_rss(void)
{
    return sc_proc_kb("/proc/self/status", "VmHWM");
}

static uint64_t sc_mem_available(void)
{
    return sc_proc_kb("/proc/meminfo", "MemAvailable");
}

/* The resident set this run may reach: what is free now beside what it holds, or --max-rss. */
static uint64_t sc_rss_limit(const sc_opts_t *o, uint64_t rss_now)
{
    uint64_t avail = sc_mem_available();
    if (avail == 0) /* unreadable: --max-rss alone (main() refused to start without either) */
        return o->max_rss;
    uint64_t lim = avail > SC_RESERVE ? rss_now + avail - SC_RESERVE : rss_now;
    if (o->max_rss != 0 && o->max_rss < lim)
        lim = o->max_rss;
    return lim;
}

/* ---- the fill ---- */

static int sc_bat_push(sc_run_t *r, uint64_t ns)
{
    if (r->nbat == r->capbat) {
        size_t cap = r->capbat ? r->capbat * 2 : 4096;
        uint64_t *p = realloc(r->bat, cap * sizeof(*p));
        if (p == NULL)
            return -1;
        r->bat = p;
        r->capbat = cap;
    }
    r->bat[r->nbat++] = ns;
    return 0;
}

/*
 * Applies batches until the workload stored @target entries; the segment's
 * counters go to *@pt. Returns 0, or 1 after printing why (an index error,
 * memory running out).
 */
static int sc_fill(sc_run_t *r, uint64_t target, sc_point_t *pt)
{
    const sc_opts_t *o = r->o;
    uint64_t wall0 = kvt_clock_ns(), from = kvt_sgen_entries(r->gen);
    r->nbat = 0;
    kvt_progress_t pg;
    char label[48];
    snprintf(label, sizeof(label), "fill to %" PRIu64, target);
    kvt_progress_start(&pg, NULL, -1, label, target > from ? target - from : 0);
    while (kvt_sgen_entries(r->gen) < target) {
        kvt_progress_update(&pg, kvt_sgen_entries(r->gen) - from);
        /* the engines' side, untimed: the events and their engine hashes */
        for (uint32_t b = 0; b < o->batch; b++) {
            kvt_sgen_event_t *ev = &r->evs[b];
            kvt_sgen_next(r->gen, ev);
            uint64_t *eh = r->ehs + (size_t)b * KVT_SGEN_EVENT_MAX;
            for (uint32_t i = 0; i < ev->n; i++)
                eh[i] = kvt_sgen_ehash(ev->keys[i]);
            pt->block_events += ev->n;
        }
        kvt_idx_stats_t st0, st1;
        kvt_idx_stats(r->idx, &st0);
        /* the writer's side, timed as one batch: the clock, then the events in order */
        uint64_t t0 = kvt_clock_ns();
        kvt_idx_advance(r->idx, ++r->now_ms);
        for (uint32_t b = 0; b < o->batch; b++) {
            const kvt_sgen_event_t *ev = &r->evs[b];
            kvt_status_t st = kvt_idx_store(r->idx, r->ns, r->pod_ids[ev->pod], KVT_TIER_GPU,
                                            ev->has_parent ? &ev->parent : NULL, ev->keys,
                                            r->ehs + (size_t)b * KVT_SGEN_EVENT_MAX, ev->n);
            if (st != KVT_OK) {
                fprintf(stderr, "kvtier-bench: store failed: %s\n", kvt_status_str(st));
                return 1;
            }
        }
        uint64_t dt = kvt_clock_ns() - t0;
        pt->store_ns += dt;
        pt->events += o->batch;
        if (dt > pt->batch_max_ns) {
            kvt_idx_stats(r->idx, &st1);
            pt->batch_max_ns = dt;
            pt->batch_max_blocks = kvt_sgen_blocks(r->gen);
            pt->batch_max_grew = (int64_t)(st1.bytes - st0.bytes);
        }
        if (sc_bat_push(r, dt) != 0) {
            fprintf(stderr, "kvtier-bench: out of memory\n");
            return 1;
        }
        if (r->nbat % SC_WATCH_EVERY == 0) {
            uint64_t rss = sc_rss(), lim = sc_rss_limit(o, rss);
            if (rss >= lim) {
                fprintf(stderr,
                        "kvtier-bench: stopped at %" PRIu64 " entries: resident set %.0f MiB "
                        "reached the limit %.0f MiB (MemAvailable less 512 MiB, or --max-rss)\n",
                        kvt_sgen_entries(r->gen), (double)rss / SC_MIB, (double)lim / SC_MIB);
                return 1;
            }
        }
    }
    kvt_progress_end(&pg);
    pt->fill_s = (double)(kvt_clock_ns() - wall0) / 1e9;
    pt->batches = r->nbat;
    kvt_bench_sort_u64(r->bat, r->nbat);
    pt->batch_p99_ns = (uint64_t)(kvt_bench_percentile(r->bat, r->nbat, 99) + 0.5);
    return 0;
}

/* Times o->queries queries of @kind at this size. Returns 0, or 1 after printing why. */
static int sc_queries(sc_run_t *r, kvt_sgen_qkind_t kind, size_t point, sc_lat_t *l)
{
    const sc_opts_t *o = r->o;
    uint64_t rng = (o->seed ^ 0x7175657279ull) + 0x9e3779b97f4a7c15ull * (2 * point + kind + 1);
    if (rng == 0)
        rng = 1;
    uint64_t pods = 0, blocks = 0, hits = 0;
    for (uint32_t q = 0; q < o->queries; q++) {
        size_t n = kvt_sgen_query(r->gen, kind, &rng, r->qkeys, o->qmin, o->qmax);
        const kvt_idx_match_t *res;
        size_t nr;
        uint64_t t0 = kvt_clock_ns();
        kvt_status_t st = kvt_idx_query(r->reader, r->ns, r->qkeys, n, NULL, 0, &res, &nr);
        uint64_t t1 = kvt_clock_ns();
        if (st != KVT_OK) {
            fprintf(stderr, "kvtier-bench: query failed: %s\n", kvt_status_str(st));
            return 1;
        }
        r->lat[q] = t1 - t0;
        uint32_t best = 0;
        for (size_t i = 0; i < nr; i++)
            if (res[i].matched > best)
                best = res[i].matched;
        pods += nr;
        blocks += n;
        hits += best;
    }
    kvt_bench_sort_u64(r->lat, o->queries);
    l->p50_ns = (uint64_t)(kvt_bench_percentile(r->lat, o->queries, 50) + 0.5);
    l->p99_ns = (uint64_t)(kvt_bench_percentile(r->lat, o->queries, 99) + 0.5);
    l->p999_ns = (uint64_t)(kvt_bench_percentile(r->lat, o->queries, 99.9) + 0.5);
    l->answer_pods = (double)pods / o->queries;
    l->query_blocks = (double)blocks / o->queries;
    l->hit_blocks = (double)hits / o->queries;
    return 0;
}

/* Reads the sizes at a checkpoint and projects the resident set at --entries. */
static void sc_measure(sc_run_t *r, sc_point_t *pt)
{
    kvt_idx_stats_t st;
    kvt_idx_stats(r->idx, &st);
    pt->entries = st.entries;
    pt->blocks = st.blocks;
    pt->bytes = st.bytes;
    pt->sessions = kvt_sgen_sessions(r->gen);
    pt->expect_entries = kvt_sgen_entries(r->gen);
    pt->expect_blocks = kvt_sgen_blocks(r->gen);
    pt->rss = sc_rss();
    pt->peak_rss = sc_peak_rss();
    pt->bytes_per_entry = st.entries ? (double)st.bytes / (double)st.entries : 0.0;
    uint64_t grown = pt->rss > r->rss_base ? pt->rss - r->rss_base : 0;
    pt->rss_per_entry = st.entries ? (double)grown / (double)st.entries : 0.0;
    /* the peak so far carries the steps of table growth the current size may not show */
    uint64_t peak_grown = pt->peak_rss > r->rss_base ? pt->peak_rss - r->rss_base : grown;
    double per = st.entries ? (double)(peak_grown > grown ? peak_grown : grown) / st.entries : 0;
    pt->projected_rss = r->rss_base + (uint64_t)(per * (double)r->o->entries * SC_PROJECT_MARGIN);
}

static double sc_rate(uint64_t n, uint64_t ns)
{
    return ns ? (double)n * 1e9 / (double)ns : 0.0;
}

static void sc_row(const sc_point_t *p)
{
    printf("%11" PRIu64 " %11" PRIu64 " %7.2f %7.2f %7.0f %7.2f %7.3f %7.0f %7.1f | %6" PRIu64
           " %6" PRIu64 " %6" PRIu64 " %6.0f | %6" PRIu64 " %6" PRIu64 " %6" PRIu64 " %5.1f\n",
           p->entries, p->blocks, p->bytes_per_entry, p->rss_per_entry, (double)p->rss / SC_MIB,
           sc_rate(p->block_events, p->store_ns) / 1e6, sc_rate(p->events, p->store_ns) / 1e6,
           (double)p->batch_p99_ns / 1e3, (double)p->batch_max_ns / 1e6, p->req.p50_ns,
           p->req.p99_ns, p->req.p999_ns, p->req.answer_pods, p->chain.p50_ns, p->chain.p99_ns,
           p->chain.p999_ns, p->chain.answer_pods);
    fflush(stdout);
}

/* One query set's fields, each name prefixed with @pfx. */
static void sc_json_lat(const char *pfx, const sc_lat_t *l)
{
    printf(",\"%sp50_ns\":%" PRIu64 ",\"%sp99_ns\":%" PRIu64 ",\"%sp999_ns\":%" PRIu64
           ",\"%sanswer_pods\":%.2f,\"%squery_blocks\":%.2f,\"%squery_hit_blocks\":%.2f",
           pfx, l->p50_ns, pfx, l->p99_ns, pfx, l->p999_ns, pfx, l->answer_pods, pfx,
           l->query_blocks, pfx, l->hit_blocks);
}

/* One checkpoint's fields, each name prefixed with @pfx ("" or "yardstick_"). */
static void sc_json_point(const char *pfx, const sc_point_t *p)
{
    char lp[48], cp[48];
    snprintf(lp, sizeof(lp), "%slookup_", pfx);
    snprintf(cp, sizeof(cp), "%schain_", pfx);
    printf("\"%sentries\":%" PRIu64 ",\"%sblocks\":%" PRIu64 ",\"%sbytes\":%" PRIu64
           ",\"%sbytes_per_entry\":%.2f,\"%srss_bytes\":%" PRIu64 ",\"%srss_per_entry\":%.2f"
           ",\"%speak_rss_bytes\":%" PRIu64,
           pfx, p->entries, pfx, p->blocks, pfx, p->bytes, pfx, p->bytes_per_entry, pfx, p->rss,
           pfx, p->rss_per_entry, pfx, p->peak_rss);
    printf(",\"%sevents_per_sec\":%.1f,\"%sstore_calls_per_sec\":%.1f,\"%sbatches\":%" PRIu64
           ",\"%sbatch_p99_ns\":%" PRIu64 ",\"%sbatch_max_ns\":%" PRIu64
           ",\"%sbatch_max_blocks\":%" PRIu64 ",\"%sbatch_max_grew_bytes\":%" PRId64
           ",\"%sfill_s\":%.3f",
           pfx, sc_rate(p->block_events, p->store_ns), pfx, sc_rate(p->events, p->store_ns), pfx,
           p->batches, pfx, p->batch_p99_ns, pfx, p->batch_max_ns, pfx, p->batch_max_blocks, pfx,
           p->batch_max_grew, pfx, p->fill_s);
    sc_json_lat(lp, &p->req);
    sc_json_lat(cp, &p->chain);
}

static double sc_ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

static void sc_json(const sc_run_t *r, uint64_t pod_entries, bool agree)
{
    const sc_opts_t *o = r->o;
    const sc_point_t *y = &r->pts[0], *f = &r->pts[r->npts - 1];
    uint64_t events = 0, block_events = 0, store_ns = 0;
    for (size_t i = 0; i < r->npts; i++) {
        events += r->pts[i].events;
        block_events += r->pts[i].block_events;
        store_ns += r->pts[i].store_ns;
    }
    printf("{\"bench\":\"index\",\"mode\":\"scale\",\"seed\":%" PRIu64 ",\"pods\":%" PRIu32
           ",\"target_entries\":%" PRIu64 ",\"prompts\":%" PRIu32 ",\"active\":%" PRIu32
           ",\"move_pct\":%" PRIu32 ",\"batch\":%" PRIu32 ",\"queries\":%" PRIu32
           ",\"query_min\":%" PRIu32 ",\"query_max\":%" PRIu32 ",\"sessions\":%" PRIu64
           ",\"expected_entries\":%" PRIu64 ",\"expected_blocks\":%" PRIu64
           ",\"pod_entries\":%" PRIu64 ",\"entries_agree\":%s,\"rss_base_bytes\":%" PRIu64
           ",\"total_events\":%" PRIu64 ",\"total_block_events\":%" PRIu64
           ",\"fill_events_per_sec\":%.1f,",
           o->seed, o->pods, o->entries, o->prompts, o->active, o->move_pct, o->batch, o->queries,
           o->qmin, o->qmax, f->sessions, f->expect_entries, f->expect_blocks, pod_entries,
           agree ? "true" : "false", r->rss_base, events, block_events,
           sc_rate(block_events, store_ns));
    sc_json_point("", f);
    printf(",");
    sc_json_point("yardstick_", y);
    printf(",\"projected_rss_bytes\":%" PRIu64, f->projected_rss);
    printf(",\"lookup_p99_ratio\":%.3f,\"lookup_p50_ratio\":%.3f,\"chain_p99_ratio\":%.3f"
           ",\"chain_p50_ratio\":%.3f,\"checkpoints\":[",
           sc_ratio(f->req.p99_ns, y->req.p99_ns), sc_ratio(f->req.p50_ns, y->req.p50_ns),
           sc_ratio(f->chain.p99_ns, y->chain.p99_ns), sc_ratio(f->chain.p50_ns, y->chain.p50_ns));
    for (size_t i = 0; i < r->npts; i++) {
        printf("%s{", i ? "," : "");
        sc_json_point("", &r->pts[i]);
        printf(",\"projected_rss_bytes\":%" PRIu64 "}", r->pts[i].projected_rss);
    }
    printf("]}\n");
    fflush(stdout);
}

/* ---- setup ---- */

static int sc_setup(sc_run_t *r)
{
    const sc_opts_t *o = r->o;
    kvt_sgen_config_t gc = {.seed = o->seed,
                            .pods = o->pods,
                            .prompts = o->prompts,
                            .active = o->active,
                            .move_pct = o->move_pct};
    r->gen = kvt_sgen_create(&gc);
    r->pod_ids = malloc((size_t)o->pods * sizeof(uint32_t));
    r->evs = malloc((size_t)o->batch * sizeof(kvt_sgen_event_t));
    r->ehs = malloc((size_t)o->batch * KVT_SGEN_EVENT_MAX * sizeof(uint64_t));
    r->lat = malloc((size_t)o->queries * sizeof(uint64_t));
    r->qkeys = malloc((size_t)o->qmax * sizeof(uint64_t));
    if (r->gen == NULL || r->pod_ids == NULL || r->evs == NULL || r->ehs == NULL ||
        r->lat == NULL || r->qkeys == NULL) {
        fprintf(stderr, "kvtier-bench: out of memory\n");
        return 1;
    }
    /* the baseline: everything but the index (and the batch times, small) is allocated */
    r->rss_base = sc_rss();
    kvt_status_t st = kvt_idx_create(NULL, &r->idx);
    if (st == KVT_OK)
        st = kvt_idx_ns_get(r->idx, "bench-model", NULL, 16, &r->ns);
    char name[32];
    for (uint32_t i = 0; st == KVT_OK && i < o->pods; i++) {
        snprintf(name, sizeof(name), "pod-%" PRIu32, i);
        st = kvt_idx_pod_get(r->idx, name, 0, &r->pod_ids[i]);
    }
    if (st == KVT_OK)
        st = kvt_idx_reader_create(r->idx, &r->reader);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: index setup: %s\n", kvt_status_str(st));
        return 1;
    }
    return 0;
}

static void sc_teardown(sc_run_t *r)
{
    kvt_idx_reader_destroy(r->reader);
    kvt_idx_destroy(r->idx);
    kvt_sgen_destroy(r->gen);
    free(r->pod_ids);
    free(r->evs);
    free(r->ehs);
    free(r->bat);
    free(r->lat);
    free(r->qkeys);
}

/* Checkpoints: the yardstick, x10 while below the target, the target. */
static size_t sc_targets(const sc_opts_t *o, uint64_t *t)
{
    size_t n = 0;
    for (uint64_t v = o->yardstick; v < o->entries && n < SC_MAX_POINTS - 1; v *= 10)
        t[n++] = v;
    t[n++] = o->entries;
    return n;
}

static int sc_run(sc_run_t *r)
{
    const sc_opts_t *o = r->o;
    uint64_t targets[SC_MAX_POINTS];
    size_t nt = sc_targets(o, targets);
    printf("scale: seed %" PRIu64 ", %" PRIu32 " pods, %" PRIu32 " prompts, %" PRIu32
           " active sessions, %" PRIu32 "%% of turns move, batches of %" PRIu32 " events; %" PRIu32
           " queries of %" PRIu32 "..%" PRIu32 " blocks per checkpoint\n",
           o->seed, o->pods, o->prompts, o->active, o->move_pct, o->batch, o->queries, o->qmin,
           o->qmax);
    printf("%11s %11s %7s %7s %7s %7s %7s %7s %7s | %-27s | %-26s\n", "", "", "index", "RSS", "RSS",
           "blocks", "events", "batch", "batch", "requests' lookups (ns)", "chain lookups (ns)");
    printf("%11s %11s %7s %7s %7s %7s %7s %7s %7s | %6s %6s %6s %6s | %6s %6s %6s %5s\n", "entries",
           "blocks", "B/entry", "B/entry", "MiB", "M/s", "M/s", "p99 us", "max ms", "p50", "p99",
           "p999", "pods", "p50", "p99", "p999", "pods");
    for (size_t i = 0; i < nt; i++) {
        sc_point_t *pt = &r->pts[r->npts];
        *pt = (sc_point_t){0};
        if (sc_fill(r, targets[i], pt) != 0)
            return 1;
        sc_measure(r, pt);
        if (sc_queries(r, KVT_SGEN_Q_REQUEST, i, &pt->req) != 0 ||
            sc_queries(r, KVT_SGEN_Q_CHAIN, i, &pt->chain) != 0)
            return 1;
        r->npts++;
        sc_row(pt);
        if (i + 1 == nt)
            break;
        uint64_t lim = sc_rss_limit(o, pt->rss);
        printf("  projected resident set at %" PRIu64 " entries: %.0f MiB (limit %.0f MiB)\n",
               o->entries, (double)pt->projected_rss / SC_MIB, (double)lim / SC_MIB);
        if (pt->projected_rss > lim) {
            fprintf(stderr,
                    "kvtier-bench: refusing --entries %" PRIu64 ": its resident set is projected "
                    "at %.0f MiB (%.1f bytes an entry measured at %" PRIu64
                    " entries, +10%%), above the %.0f MiB this machine has for it "
                    "(MemAvailable less 512 MiB, or --max-rss)\n",
                    o->entries, (double)pt->projected_rss / SC_MIB,
                    (double)(pt->projected_rss - r->rss_base) / SC_PROJECT_MARGIN /
                        (double)o->entries,
                    pt->entries, (double)lim / SC_MIB);
            return 1;
        }
    }
    return 0;
}

int kvt_bench_index_scale_main(int argc, char **argv)
{
    sc_opts_t o;
    int rc = sc_parse_opts(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (o.max_rss == 0 && sc_mem_available() == 0) {
        fprintf(stderr, "kvtier-bench: cannot read MemAvailable from /proc/meminfo: give "
                        "--max-rss to bound the run\n");
        return 1;
    }
    /* before anything: a size that cannot fit whatever the workload */
    uint64_t rss0 = sc_rss(), lim0 = sc_rss_limit(&o, rss0);
    double need = (double)o.entries * SC_PRIOR_BYTES;
    if (rss0 + need > (double)lim0) {
        fprintf(stderr,
                "kvtier-bench: refusing --entries %" PRIu64 ": its resident set would be %.0f "
                "MiB at least (%u bytes an entry beside the %.0f MiB held now), above the %.0f "
                "MiB this machine has for it (MemAvailable less 512 MiB, or --max-rss)\n",
                o.entries, ((double)rss0 + need) / SC_MIB, SC_PRIOR_BYTES, (double)rss0 / SC_MIB,
                (double)lim0 / SC_MIB);
        return 1;
    }
    sc_run_t r = {.o = &o};
    rc = sc_setup(&r);
    if (rc == 0)
        rc = sc_run(&r);
    if (rc == 0) {
        const sc_point_t *y = &r.pts[0], *f = &r.pts[r.npts - 1];
        uint64_t pod_entries = 0;
        for (uint32_t i = 0; i < o.pods; i++)
            pod_entries += kvt_idx_pod_entries(r.idx, r.pod_ids[i]);
        bool agree = f->entries == f->expect_entries && f->blocks == f->expect_blocks &&
                     pod_entries == f->entries;
        printf("lookup p99 at %" PRIu64 " entries / at %" PRIu64 ": %.2fx (%" PRIu64
               " ns / %" PRIu64 " ns); chain lookups %.2fx; peak resident set %.0f MiB\n",
               f->entries, y->entries, sc_ratio(f->req.p99_ns, y->req.p99_ns), f->req.p99_ns,
               y->req.p99_ns, sc_ratio(f->chain.p99_ns, y->chain.p99_ns),
               (double)f->peak_rss / SC_MIB);
        printf("index: %" PRIu64 " entries, %" PRIu64 " blocks, %" PRIu64 " sessions; %s\n",
               f->entries, f->blocks, f->sessions,
               agree ? "as the workload stored" : "DIFFERS FROM what the workload stored");
        if (!agree)
            fprintf(stderr,
                    "warning: index holds %" PRIu64 " entries (%" PRIu64 " by pod), %" PRIu64
                    " blocks; the workload stored %" PRIu64 " and %" PRIu64 "\n",
                    f->entries, pod_entries, f->blocks, f->expect_entries, f->expect_blocks);
        sc_json(&r, pod_entries, agree);
    }
    sc_teardown(&r);
    return rc;
}
