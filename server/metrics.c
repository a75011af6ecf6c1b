/*
 * server/metrics.c: request accounting (per-worker counters, summed when
 * scraped), the GET /v1/stats JSON and the GET /metrics Prometheus text.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/version.h"
#include "server/metrics.h"
#include "server/routes.h"
#include "server/tier.h"
#include "server/xfer.h"

/* Upper bounds of the latency buckets, seconds; the last bucket is +Inf. */
static const double bucket_le[NBUCKETS - 1] = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
                                               0.001,   0.0025,   0.005,   0.01,   0.025,   0.05,
                                               0.1,     0.25,     0.5,     1.0,    2.5};

static const char *const proto_name[NPROTOS] = {"http", "rpc"};
static const char *const class_name[NCLASSES] = {"2xx", "4xx", "5xx"};

void srv_count(kvt_srv_worker_t *w, enum srv_proto proto, enum srv_call call, int http_status,
               uint64_t t0_ns)
{
    enum srv_class cl = http_status < 400 ? CLASS_2XX : http_status < 500 ? CLASS_4XX : CLASS_5XX;
    uint64_t ns = kvt_clock_ns() - t0_ns;
    double s = (double)ns / 1e9;
    int b = 0;
    while (b < NBUCKETS - 1 && s > bucket_le[b])
        b++;
    CTR_INC(w->ctr.requests[proto][call][cl]);
    CTR_INC(w->ctr.hist[proto][call][b]);
    __atomic_fetch_add(&w->ctr.lat_sum_ns[proto][call], ns, __ATOMIC_RELAXED);
}

/* What the process holds, read from /proc and getrusage(); a figure that cannot be read is 0. */
typedef struct proc_info {
    uint64_t rss_bytes;
    uint64_t open_fds;
    uint64_t max_fds;
    double cpu_s; /* user + system */
} proc_info_t;

static void proc_read(proc_info_t *pi)
{
    memset(pi, 0, sizeof(*pi));
    FILE *f = fopen("/proc/self/statm", "r");
    if (f != NULL) {
        unsigned long long size, resident;
        if (fscanf(f, "%llu %llu", &size, &resident) == 2)
            pi->rss_bytes = resident * (uint64_t)sysconf(_SC_PAGESIZE);
        fclose(f);
    }
    DIR *d = opendir("/proc/self/fd");
    if (d != NULL) {
        uint64_t n = 0;
        for (struct dirent *e; (e = readdir(d)) != NULL;)
            if (e->d_name[0] != '.')
                n++;
        closedir(d);
        pi->open_fds = n > 0 ? n - 1 : 0; /* not the directory's own descriptor */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        pi->max_fds = (uint64_t)rl.rlim_cur;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        pi->cpu_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                    (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static uint64_t ld(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* Sums every worker's counters into @t. */
static void sum_counters(kvt_srv_t *srv, srv_counters_t *t)
{
    memset(t, 0, sizeof(*t));
    for (int i = 0; i < srv->nworkers; i++) {
        const uint64_t *src = (const uint64_t *)(const void *)&srv->workers[i].ctr;
        uint64_t *dst = (uint64_t *)(void *)t;
        for (size_t k = 0; k < sizeof(*t) / sizeof(uint64_t); k++)
            dst[k] += ld(&src[k]);
    }
}

typedef struct pub {
    kvt_idx_stats_t idx;
    kvt_ev_counters_t ev;
    uint64_t batches, rejected, drops, forgotten;
    uint64_t *pod_entries;
    uint32_t npods;
    kvt_zsub_stream_info_t *streams; /* engines' event streams */
    size_t nstreams;
    kvt_zsub_pub_info_t publisher;
    kvt_ev_ctx_stats_t evctx;
} pub_t;

static void pub_get(kvt_srv_t *srv, pub_t *p)
{
    pthread_mutex_lock(&srv->stats_mu);
    p->idx = srv->st_idx;
    p->ev = srv->st_ev_pub;
    p->batches = srv->st_batches_pub;
    p->rejected = srv->st_rejected_pub;
    p->drops = srv->st_drops_pub;
    p->forgotten = srv->st_forgotten_pub;
    p->npods = srv->st_npods;
    p->pod_entries = p->npods ? malloc(p->npods * sizeof(uint64_t)) : NULL;
    if (p->pod_entries)
        memcpy(p->pod_entries, srv->st_pod_entries, p->npods * sizeof(uint64_t));
    else
        p->npods = 0;
    p->publisher = srv->st_pub;
    p->evctx = srv->st_evctx;
    p->nstreams = srv->st_nstreams;
    p->streams = p->nstreams ? malloc(p->nstreams * sizeof(*p->streams)) : NULL;
    if (p->streams)
        memcpy(p->streams, srv->st_streams, p->nstreams * sizeof(*p->streams));
    else
        p->nstreams = 0;
    pthread_mutex_unlock(&srv->stats_mu);
}

/* Whether pod @name is fed by a subscribed event stream. */
static bool pub_streamed(const pub_t *p, const char *name)
{
    for (size_t i = 0; i < p->nstreams; i++)
        if (strcmp(p->streams[i].pod, name) == 0)
            return true;
    return false;
}

/* A stream's counters, by name, for /v1/stats and /metrics (one list for both). */
typedef struct stream_ctr {
    const char *json, *metric, *help;
    uint64_t v;
} stream_ctr_t;

#define STREAM_NCTRS 20

static size_t stream_ctrs(const kvt_zsub_stream_info_t *s, stream_ctr_t out[STREAM_NCTRS])
{
    const kvt_zsub_counters_t *c = &s->c;
    const stream_ctr_t all[] = {
        {"batches", "kvtier_stream_batches_total", "Event batches applied from a stream.",
         c->batches},
        {"events", "kvtier_stream_events_total", "Events applied from a stream.", c->ev.events},
        {"blocks", "kvtier_stream_blocks_total", "Block hashes in events applied from a stream.",
         c->ev.blocks},
        {"unresolved", "kvtier_stream_unresolved_total",
         "Engine hashes of a stream's events that its pod did not know.", c->ev.unresolved},
        {"orphans", "kvtier_stream_orphans_total",
         "BlockStored events of a stream whose parent its pod did not know.", c->ev.orphans},
        {"ignored", "kvtier_stream_ignored_total",
         "Unknown events and fields skipped in a stream's batches.", c->ignored},
        {"undecodable", "kvtier_stream_undecodable_total",
         "A stream's payloads that were no batch, or that the index refused (state dropped).",
         c->undecodable},
        {"bad_events", "kvtier_stream_bad_events_total",
         "A stream's events that did not decode or apply (skipped alone).", c->ev.bad},
        {"remote", "kvtier_stream_remote_events_total",
         "A stream's events with locality REMOTE (skipped).", c->ev.remote},
        {"other_groups", "kvtier_stream_other_group_events_total",
         "A stream's events of KV cache groups kvtier does not index (skipped).",
         c->ev.other_groups},
        {"unknown_medium", "kvtier_stream_unknown_medium_events_total",
         "A stream's events on a medium kvtier does not model (skipped).", c->ev.unknown_medium},
        {"recovered", "kvtier_stream_recovered_total",
         "Placeholder hashes of a stream resolved through recently removed blocks.",
         c->ev.recovered},
        {"dropped", "kvtier_stream_dropped_blocks_total",
         "A stream's blocks the index had no room for.", c->ev.dropped},
        {"bad_frames", "kvtier_stream_bad_frames_total",
         "A stream's messages not shaped [topic, seq, payload] (skipped).", c->bad_frames},
        {"gaps", "kvtier_stream_gaps_total", "Times a stream's seq skipped ahead.", c->gaps},
        {"replays", "kvtier_stream_replays_total", "Replay requests sent for a stream.",
         c->replays},
        {"replayed", "kvtier_stream_replayed_batches_total", "Batches applied from replays.",
         c->replayed},
        {"replay_failures", "kvtier_stream_replay_failures_total",
         "Replays that could not fill a gap.", c->replay_failures},
        {"restarts", "kvtier_stream_restarts_total",
         "Engine restarts seen (a stream's seq went back).", c->restarts},
        {"state_drops", "kvtier_stream_state_drops_total",
         "Times a pod's engine state was dropped (restart, unfilled gap, no batch, bad removal).",
         c->state_drops + c->ev.state_drops},
    };
    _Static_assert(sizeof(all) / sizeof(all[0]) <= STREAM_NCTRS, "STREAM_NCTRS too small");
    memcpy(out, all, sizeof(all));
    return sizeof(all) / sizeof(all[0]);
}

static void streams_json(const pub_t *p, kvt_jbuf_t *o)
{
    kvt_jbuf_cstr(o, "\"streams\":[");
    for (size_t i = 0; i < p->nstreams; i++) {
        const kvt_zsub_stream_info_t *s = &p->streams[i];
        kvt_jbuf_cstr(o, i ? ",{\"pod\":" : "{\"pod\":");
        kvt_jbuf_str(o, s->pod, strlen(s->pod));
        kvt_jbuf_printf(o, ",\"dp_rank\":%u,\"model\":", s->rank);
        kvt_jbuf_str(o, s->model, strlen(s->model));
        kvt_jbuf_cstr(o, ",\"endpoint\":");
        kvt_jbuf_str(o, s->endpoint, strlen(s->endpoint));
        kvt_jbuf_printf(o, ",\"state\":\"%s\",\"last_seq\":", s->state);
        if (s->have_seq)
            kvt_jbuf_u64(o, s->last_seq);
        else
            kvt_jbuf_cstr(o, "null");
        stream_ctr_t ctr[STREAM_NCTRS];
        size_t n = stream_ctrs(s, ctr);
        for (size_t k = 0; k < n; k++)
            kvt_jbuf_printf(o, ",\"%s\":%llu", ctr[k].json, (unsigned long long)ctr[k].v);
        kvt_jbuf_cstr(o, ",\"mediums\":{");
        bool firstm = true;
        for (int k = 0; k < KVT_ZSUB_MEDIUM_NAMES && s->c.mediums[k].name[0]; k++) {
            kvt_jbuf_cstr(o, firstm ? "" : ",");
            firstm = false;
            kvt_jbuf_str(o, s->c.mediums[k].name, strlen(s->c.mediums[k].name));
            kvt_jbuf_printf(o, ":%llu", (unsigned long long)s->c.mediums[k].events);
        }
        if (s->c.mediums_other > 0)
            kvt_jbuf_printf(o, "%s\"(other)\":%llu", firstm ? "" : ",",
                            (unsigned long long)s->c.mediums_other);
        kvt_jbuf_cstr(o, "}}");
    }
    kvt_jbuf_cstr(o, "],\"publisher\":");
    const kvt_zsub_pub_info_t *pi = &p->publisher;
    if (!pi->open) {
        kvt_jbuf_cstr(o, "null,");
        return;
    }
    kvt_jbuf_cstr(o, "{\"endpoint\":");
    kvt_jbuf_str(o, pi->endpoint, strlen(pi->endpoint));
    kvt_jbuf_cstr(o, ",\"replay_endpoint\":");
    if (pi->replay_endpoint[0])
        kvt_jbuf_str(o, pi->replay_endpoint, strlen(pi->replay_endpoint));
    else
        kvt_jbuf_cstr(o, "null");
    kvt_jbuf_printf(o,
                    ",\"batches\":%llu,\"send_failures\":%llu,\"replays\":%llu,"
                    "\"replayed\":%llu,\"bad_requests\":%llu,\"buffered\":%u},",
                    (unsigned long long)pi->batches, (unsigned long long)pi->send_failures,
                    (unsigned long long)pi->replays, (unsigned long long)pi->replayed,
                    (unsigned long long)pi->bad_requests, pi->buffered);
}

void srv_stats_json(kvt_srv_worker_t *w, kvt_jbuf_t *o)
{
    kvt_srv_t *srv = w->srv;
    pub_t p;
    pub_get(srv, &p);
    srv_counters_t t;
    sum_counters(srv, &t);
    proc_info_t pi;
    proc_read(&pi);
    kvt_jbuf_printf(o, "{\"uptime_s\":%.3f,", (double)(kvt_clock_ns() - srv->started_ns) / 1e9);
    kvt_jbuf_cstr(o, "\"build\":{\"version\":");
    kvt_jbuf_str(o, kvt_version(), strlen(kvt_version()));
    kvt_jbuf_cstr(o, ",\"revision\":");
    kvt_jbuf_str(o, kvt_build_rev(), strlen(kvt_build_rev()));
    kvt_jbuf_cstr(o, ",\"build_type\":");
    kvt_jbuf_str(o, kvt_build_type(), strlen(kvt_build_type()));
    kvt_jbuf_cstr(o, ",\"compiler\":");
    kvt_jbuf_str(o, kvt_build_compiler(), strlen(kvt_build_compiler()));
    kvt_jbuf_printf(o,
                    "},\"process\":{\"rss_bytes\":%llu,\"open_fds\":%llu,\"max_fds\":%llu,"
                    "\"cpu_s\":%.3f},",
                    (unsigned long long)pi.rss_bytes, (unsigned long long)pi.open_fds,
                    (unsigned long long)pi.max_fds, pi.cpu_s);
    srv_tier_stats_json(srv, o);
    kvt_jbuf_cstr(o, ",");
    srv_xfer_stats_json(srv, o);
    kvt_jbuf_cstr(o, ",");
    kvt_jbuf_printf(o,
                    "\"index\":{\"blocks\":%llu,\"entries\":%llu,\"bytes\":%llu,"
                    "\"budget_bytes\":%llu,\"evicted\":%llu,\"dropped\":%llu,\"refused\":%llu,"
                    "\"forgotten\":%llu,"
                    "\"speculative\":%llu,\"pods\":%u,\"namespaces\":%u,"
                    "\"tiers\":{\"gpu\":%llu,\"cpu\":%llu,\"disk\":%llu}},",
                    (unsigned long long)p.idx.blocks, (unsigned long long)p.idx.entries,
                    (unsigned long long)p.idx.bytes, (unsigned long long)srv->cfg.index_budget,
                    (unsigned long long)p.idx.evicted, (unsigned long long)p.idx.dropped,
                    (unsigned long long)p.idx.refused, (unsigned long long)p.forgotten,
                    (unsigned long long)p.idx.speculative, p.idx.pods, p.idx.namespaces,
                    (unsigned long long)p.idx.tier_entries[0],
                    (unsigned long long)p.idx.tier_entries[1],
                    (unsigned long long)p.idx.tier_entries[2]);
    kvt_jbuf_printf(
        o,
        "\"events\":{\"batches\":%llu,\"rejected_batches\":%llu,\"applied\":%llu,"
        "\"blocks\":%llu,\"unresolved\":%llu,\"orphans\":%llu,\"dropped\":%llu,"
        "\"bad_events\":%llu,\"remote\":%llu,\"other_groups\":%llu,"
        "\"unknown_medium\":%llu,\"recovered\":%llu,\"engines_dropped\":%llu,"
        "\"removed_map\":{\"entries\":%llu,\"capacity\":%llu,\"bytes\":%llu,"
        "\"hits\":%llu,\"evicted\":%llu}},",
        (unsigned long long)p.batches, (unsigned long long)p.rejected,
        (unsigned long long)p.ev.events, (unsigned long long)p.ev.blocks,
        (unsigned long long)p.ev.unresolved, (unsigned long long)p.ev.orphans,
        (unsigned long long)p.ev.dropped, (unsigned long long)p.ev.bad,
        (unsigned long long)p.ev.remote, (unsigned long long)p.ev.other_groups,
        (unsigned long long)p.ev.unknown_medium, (unsigned long long)p.ev.recovered,
        (unsigned long long)p.drops, (unsigned long long)p.evctx.removed_entries,
        (unsigned long long)p.evctx.removed_capacity, (unsigned long long)p.evctx.removed_bytes,
        (unsigned long long)p.evctx.removed_hits, (unsigned long long)p.evctx.removed_evicted);
    kvt_jbuf_printf(o, "\"connections\":{\"open\":%d,\"probes\":%d", atomic_load(&srv->nconns),
                    atomic_load(&srv->nprobes));
    for (int pr = 0; pr < NPROTOS; pr++)
        kvt_jbuf_printf(o, ",\"%s_accepted\":%llu,\"%s_refused\":%llu", proto_name[pr],
                        (unsigned long long)t.conns_accepted[pr], proto_name[pr],
                        (unsigned long long)t.conns_refused[pr]);
    kvt_jbuf_cstr(o, "},");
    streams_json(&p, o);
    kvt_jbuf_cstr(o, "\"engines\":[");
    kvt_idx_read_begin(w->reader);
    bool first = true;
    kvt_idx_pod_view_t v;
    for (uint32_t i = 0; i < p.npods; i++) {
        if (p.pod_entries[i] == UINT64_MAX || !kvt_idx_pod_view(w->reader, i, &v))
            continue;
        kvt_jbuf_cstr(o, first ? "{\"pod\":" : ",{\"pod\":");
        first = false;
        kvt_jbuf_raw(o, v.json, v.json_len);
        kvt_jbuf_printf(o, ",\"dp_rank\":%u,\"entries\":%llu,\"source\":\"%s\"}", v.dp_rank,
                        (unsigned long long)p.pod_entries[i],
                        pub_streamed(&p, v.name) ? "zmq" : "http");
    }
    kvt_idx_read_end(w->reader);
    kvt_jbuf_cstr(o, "]}");
    free(p.pod_entries);
    free(p.streams);
}

static void metric_head(kvt_jbuf_t *o, const char *name, const char *type, const char *help);
static void label_value(kvt_jbuf_t *o, const char *s);

/* One sample of every stream: {pod="..",dp_rank=".."} @v. */
static void stream_sample(kvt_jbuf_t *o, const char *name, const kvt_zsub_stream_info_t *s,
                          uint64_t v)
{
    kvt_jbuf_printf(o, "%s{pod=\"", name);
    label_value(o, s->pod);
    kvt_jbuf_printf(o, "\",dp_rank=\"%u\"} %llu\n", s->rank, (unsigned long long)v);
}

/* The engines' event streams: state and counters, labelled by pod and DP rank. */
static void streams_metrics(const pub_t *p, kvt_jbuf_t *o)
{
    const kvt_zsub_pub_info_t *pi = &p->publisher;
    if (pi->open) {
        const struct {
            const char *name, *type, *help;
            uint64_t v;
        } g[] = {
            {"kvtier_publish_batches_total", "counter", "Batches kvtierd published.", pi->batches},
            {"kvtier_publish_send_failures_total", "counter",
             "Published batches not sent (replayable) or not encoded.", pi->send_failures},
            {"kvtier_publish_replays_total", "counter", "Replay requests answered.", pi->replays},
            {"kvtier_publish_replayed_batches_total", "counter", "Batches sent in replays.",
             pi->replayed},
            {"kvtier_publish_buffered_batches", "gauge", "Batches kept for replay.", pi->buffered},
        };
        for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++) {
            metric_head(o, g[i].name, g[i].type, g[i].help);
            kvt_jbuf_printf(o, "%s %llu\n", g[i].name, (unsigned long long)g[i].v);
        }
    }
    metric_head(o, "kvtier_streams", "gauge", "Subscribed engine event streams (engine, DP rank).");
    kvt_jbuf_printf(o, "kvtier_streams %zu\n", p->nstreams);
    if (p->nstreams == 0)
        return;
    metric_head(o, "kvtier_stream_last_seq", "gauge", "Last batch seq applied from a stream.");
    for (size_t i = 0; i < p->nstreams; i++)
        if (p->streams[i].have_seq)
            stream_sample(o, "kvtier_stream_last_seq", &p->streams[i], p->streams[i].last_seq);
    metric_head(o, "kvtier_stream_replaying", "gauge", "1 while a stream waits for a replay.");
    for (size_t i = 0; i < p->nstreams; i++)
        stream_sample(o, "kvtier_stream_replaying", &p->streams[i],
                      strcmp(p->streams[i].state, "replaying") == 0);
    stream_ctr_t ctr[STREAM_NCTRS];
    size_t n = stream_ctrs(&p->streams[0], ctr);
    for (size_t k = 0; k < n; k++) {
        metric_head(o, ctr[k].metric, "counter", ctr[k].help);
        for (size_t i = 0; i < p->nstreams; i++) {
            stream_ctr_t c[STREAM_NCTRS];
            stream_ctrs(&p->streams[i], c);
            stream_sample(o, ctr[k].metric, &p->streams[i], c[k].v);
        }
    }
    metric_head(o, "kvtier_stream_medium_events_total", "counter",
                "A stream's events skipped for their medium, by medium name (\"(other)\" past "
                "the first names).");
    for (size_t i = 0; i < p->nstreams; i++) {
        const kvt_zsub_stream_info_t *s = &p->streams[i];
        for (int k = 0; k <= KVT_ZSUB_MEDIUM_NAMES; k++) {
            bool other = k == KVT_ZSUB_MEDIUM_NAMES;
            const char *name = other ? "(other)" : s->c.mediums[k].name;
            uint64_t v = other ? s->c.mediums_other : s->c.mediums[k].events;
            if (name[0] == '\0' || (other && v == 0))
                continue;
            kvt_jbuf_cstr(o, "kvtier_stream_medium_events_total{pod=\"");
            label_value(o, s->pod);
            kvt_jbuf_printf(o, "\",dp_rank=\"%u\",medium=\"", s->rank);
            label_value(o, name);
            kvt_jbuf_printf(o, "\"} %llu\n", (unsigned long long)v);
        }
    }
}

static void metric_head(kvt_jbuf_t *o, const char *name, const char *type, const char *help)
{
    kvt_jbuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: Prometheus escapes backslash, quote and newline. */
static void label_value(kvt_jbuf_t *o, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            kvt_jbuf_printf(o, "\\%c", *s);
        else if (*s == '\n')
            kvt_jbuf_cstr(o, "\\n");
        else
            kvt_jbuf_raw(o, s, 1);
    }
}

void srv_metrics_text(kvt_srv_worker_t *w, kvt_jbuf_t *o)
{
    kvt_srv_t *srv = w->srv;
    pub_t p;
    pub_get(srv, &p);
    srv_counters_t t;
    sum_counters(srv, &t);

    metric_head(o, "kvtier_requests_total", "counter",
                "Requests answered, by front end, call and status class.");
    for (int pr = 0; pr < NPROTOS; pr++)
        for (int c = 0; c < NCALLS; c++)
            for (int k = 0; k < NCLASSES; k++)
                if (t.requests[pr][c][k] || (c == CALL_QUERY && k == CLASS_2XX))
                    kvt_jbuf_printf(
                        o, "kvtier_requests_total{proto=\"%s\",call=\"%s\",code=\"%s\"} %llu\n",
                        proto_name[pr], srv_call_label((enum srv_call)c), class_name[k],
                        (unsigned long long)t.requests[pr][c][k]);
    metric_head(o, "kvtier_request_duration_seconds", "histogram",
                "Time from a request's first parsed byte to its answer.");
    for (int pr = 0; pr < NPROTOS; pr++)
        for (int c = 0; c < NCALLS; c++) {
            uint64_t cum = 0;
            for (int b = 0; b < NBUCKETS; b++)
                cum += t.hist[pr][c][b];
            if (cum == 0)
                continue;
            cum = 0;
            for (int b = 0; b < NBUCKETS; b++) {
                cum += t.hist[pr][c][b];
                if (b < NBUCKETS - 1)
                    kvt_jbuf_printf(o,
                                    "kvtier_request_duration_seconds_bucket{proto=\"%s\",call=\"%"
                                    "s\",le=\"%g\"} %llu\n",
                                    proto_name[pr], srv_call_label((enum srv_call)c), bucket_le[b],
                                    (unsigned long long)cum);
                else
                    kvt_jbuf_printf(o,
                                    "kvtier_request_duration_seconds_bucket{proto=\"%s\",call=\"%"
                                    "s\",le=\"+Inf\"} %llu\n",
                                    proto_name[pr], srv_call_label((enum srv_call)c),
                                    (unsigned long long)cum);
            }
            kvt_jbuf_printf(o,
                            "kvtier_request_duration_seconds_sum{proto=\"%s\",call=\"%s\"} %.9f\n",
                            proto_name[pr], srv_call_label((enum srv_call)c),
                            (double)t.lat_sum_ns[pr][c] / 1e9);
            kvt_jbuf_printf(
                o, "kvtier_request_duration_seconds_count{proto=\"%s\",call=\"%s\"} %llu\n",
                proto_name[pr], srv_call_label((enum srv_call)c), (unsigned long long)cum);
        }

    struct {
        const char *name, *type, *help;
        uint64_t v;
    } g[] = {
        {"kvtier_index_blocks", "gauge", "Distinct blocks (keys) in the index.", p.idx.blocks},
        {"kvtier_index_entries", "gauge", "(block, pod) entries in the index.", p.idx.entries},
        {"kvtier_index_bytes", "gauge", "Bytes the index has allocated.", p.idx.bytes},
        {"kvtier_index_budget_bytes", "gauge", "Index memory budget; 0 is unbounded.",
         srv->cfg.index_budget},
        {"kvtier_index_evicted_blocks_total", "counter",
         "Blocks evicted to stay within the budget.", p.idx.evicted},
        {"kvtier_index_dropped_blocks_total", "counter", "Blocks not stored: budget full.",
         p.idx.dropped},
        {"kvtier_index_refused_total", "counter", "Pods and namespaces not created: budget full.",
         p.idx.refused},
        {"kvtier_index_forgotten_total", "counter",
         "Pods and namespaces forgotten: empty and idle for --forget-idle.", p.forgotten},
        {"kvtier_index_speculative_entries", "gauge", "Live speculative entries.",
         p.idx.speculative},
        {"kvtier_index_pods", "gauge", "Registered pods (engine, DP rank).", p.idx.pods},
        {"kvtier_index_namespaces", "gauge", "Registered (model, LoRA) namespaces.",
         p.idx.namespaces},
        {"kvtier_event_batches_total", "counter", "Event batches applied.", p.batches},
        {"kvtier_event_batches_rejected_total", "counter", "Event batches refused as bad input.",
         p.rejected},
        {"kvtier_events_applied_total", "counter", "Engine events applied.", p.ev.events},
        {"kvtier_event_blocks_total", "counter", "Block hashes in applied events.", p.ev.blocks},
        {"kvtier_events_unresolved_total", "counter", "Engine hashes a pod did not know.",
         p.ev.unresolved},
        {"kvtier_events_orphans_total", "counter", "BlockStored whose parent the pod did not know.",
         p.ev.orphans},
        {"kvtier_events_dropped_blocks_total", "counter",
         "Blocks of applied events the index had no room for.", p.ev.dropped},
        {"kvtier_events_bad_total", "counter", "Engine events that did not decode (skipped).",
         p.ev.bad},
        {"kvtier_events_skipped_total", "counter",
         "Events skipped: REMOTE, a KV cache group not indexed, or an unknown medium.",
         p.ev.remote + p.ev.other_groups + p.ev.unknown_medium},
        {"kvtier_events_recovered_total", "counter",
         "Placeholder hashes resolved through recently removed blocks.", p.ev.recovered},
        {"kvtier_removed_map_entries", "gauge", "Engine-hash mappings of removed blocks kept.",
         p.evctx.removed_entries},
        {"kvtier_removed_map_bytes", "gauge", "Bytes of the removed-block mappings table.",
         p.evctx.removed_bytes},
        {"kvtier_engines_dropped_total", "counter", "Engines dropped through the API.", p.drops},
        {"kvtier_rpc_bad_frames_total", "counter", "RPC connections closed for a malformed frame.",
         t.bad_frames},
    };
    for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++) {
        metric_head(o, g[i].name, g[i].type, g[i].help);
        kvt_jbuf_printf(o, "%s %llu\n", g[i].name, (unsigned long long)g[i].v);
    }
    static const char *const tier_name[3] = {"gpu", "cpu", "disk"};
    metric_head(o, "kvtier_index_tier_entries", "gauge",
                "(block, pod) entries held in each tier; one in two tiers counts in both.");
    for (int ti = 0; ti < 3; ti++)
        kvt_jbuf_printf(o, "kvtier_index_tier_entries{tier=\"%s\"} %llu\n", tier_name[ti],
                        (unsigned long long)p.idx.tier_entries[ti]);
    metric_head(o, "kvtier_connections_open", "gauge", "Open client connections.");
    kvt_jbuf_printf(o, "kvtier_connections_open %d\n", atomic_load(&srv->nconns));
    const char *cn[] = {"kvtier_connections_accepted_total", "kvtier_connections_refused_total",
                        "kvtier_request_timeouts_total"};
    const char *ch[] = {"Connections accepted.", "Connections refused over --max-connections.",
                        "Connections closed for a slow request or idleness."};
    for (int k = 0; k < 3; k++) {
        metric_head(o, cn[k], "counter", ch[k]);
        for (int pr = 0; pr < NPROTOS; pr++) {
            uint64_t v = k == 0   ? t.conns_accepted[pr]
                         : k == 1 ? t.conns_refused[pr]
                                  : t.timeouts[pr];
            kvt_jbuf_printf(o, "%s{proto=\"%s\"} %llu\n", cn[k], proto_name[pr],
                            (unsigned long long)v);
        }
    }
    metric_head(o, "kvtier_pod_entries", "gauge", "(block, pod) entries per pod.");
    kvt_idx_read_begin(w->reader);
    kvt_idx_pod_view_t v;
    for (uint32_t i = 0; i < p.npods; i++) {
        if (p.pod_entries[i] == UINT64_MAX || !kvt_idx_pod_view(w->reader, i, &v))
            continue;
        kvt_jbuf_cstr(o, "kvtier_pod_entries{pod=\"");
        label_value(o, v.name);
        kvt_jbuf_printf(o, "\",dp_rank=\"%u\"} %llu\n", v.dp_rank,
                        (unsigned long long)p.pod_entries[i]);
    }
    kvt_idx_read_end(w->reader);
    double uptime = (double)(kvt_clock_ns() - srv->started_ns) / 1e9;
    metric_head(o, "kvtier_uptime_seconds", "gauge", "Seconds since kvtierd started.");
    kvt_jbuf_printf(o, "kvtier_uptime_seconds %.3f\n", uptime);
    metric_head(o, "kvtier_build_info", "gauge",
                "Always 1; the labels name the version and build of this kvtierd.");
    kvt_jbuf_cstr(o, "kvtier_build_info{version=\"");
    label_value(o, kvt_version());
    kvt_jbuf_cstr(o, "\",revision=\"");
    label_value(o, kvt_build_rev());
    kvt_jbuf_cstr(o, "\",build_type=\"");
    label_value(o, kvt_build_type());
    kvt_jbuf_cstr(o, "\",compiler=\"");
    label_value(o, kvt_build_compiler());
    kvt_jbuf_cstr(o, "\"} 1\n");
    /* the names every Prometheus client library exports for its process */
    proc_info_t pi;
    proc_read(&pi);
    metric_head(o, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    kvt_jbuf_printf(o, "process_resident_memory_bytes %llu\n", (unsigned long long)pi.rss_bytes);
    metric_head(o, "process_open_fds", "gauge", "Number of open file descriptors.");
    kvt_jbuf_printf(o, "process_open_fds %llu\n", (unsigned long long)pi.open_fds);
    metric_head(o, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
    kvt_jbuf_printf(o, "process_max_fds %llu\n", (unsigned long long)pi.max_fds);
    metric_head(o, "process_cpu_seconds_total", "counter",
                "Total user and system CPU time spent in seconds.");
    kvt_jbuf_printf(o, "process_cpu_seconds_total %.3f\n", pi.cpu_s);
    metric_head(o, "process_start_time_seconds", "gauge",
                "Start time of the process since unix epoch in seconds.");
    kvt_jbuf_printf(o, "process_start_time_seconds %.3f\n", srv->started_wall_s);
    streams_metrics(&p, o);
    srv_tier_metrics(srv, o);
    free(p.pod_entries);
    free(p.streams);
}

/* ---- shared answer bodies ------------------------------------------------------------ */

void srv_blob_unref(srv_blob_t *b)
{
    if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1)
        free(b);
}

srv_blob_t *srv_blob_get(kvt_srv_worker_t *w, enum srv_blob_kind kind)
{
    kvt_srv_t *srv = w->srv;
    /* read before encoding: a body made while the writer publishes is older than its label */
    uint64_t gen = __atomic_load_n(&srv->st_gen, __ATOMIC_ACQUIRE), now = kvt_clock_ns();
    /* also renewed each period by the clock: a stalled writer publishes nothing, but the
     * workers' own counters, connections and uptime still move */
    uint64_t period = srv->cfg.stats_period_ms * 1000000ull;
    pthread_mutex_lock(&srv->blob_mu);
    srv_blob_t *b = srv->blobs[kind];
    if (b != NULL && b->gen == gen && now - b->made_ns < period) {
        atomic_fetch_add(&b->refs, 1);
        pthread_mutex_unlock(&srv->blob_mu);
        return b;
    }
    pthread_mutex_unlock(&srv->blob_mu);
    /* encoded outside the lock; two workers may both do it once per period, the last one stays */
    kvt_jbuf_t *o = &w->out;
    kvt_jbuf_reset(o);
    if (kind == BLOB_STATS)
        srv_stats_json(w, o);
    else
        srv_metrics_text(w, o);
    if (o->oom)
        return NULL;
    b = malloc(sizeof(*b) + o->len);
    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1); /* the caller's */
    b->gen = gen;
    b->made_ns = now;
    b->len = o->len;
    memcpy(b->data, o->buf, o->len);
    pthread_mutex_lock(&srv->blob_mu);
    srv_blob_t *old = srv->blobs[kind];
    if (old == NULL || old->gen < gen || (old->gen == gen && old->made_ns <= now)) {
        /* never replace a newer one */
        atomic_fetch_add(&b->refs, 1); /* the cache's */
        srv->blobs[kind] = b;
    } else {
        old = NULL;
    }
    pthread_mutex_unlock(&srv->blob_mu);
    srv_blob_unref(old);
    return b;
}
