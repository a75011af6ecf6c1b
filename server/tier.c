/*
 * server/tier.c: kvtierd's own tiers (tiers/tiers.h). Opened from the config
 * when --ram-bytes is set; every change of theirs (a block stored in or
 * removed from RAM or NVMe) becomes a batch of vLLM-format events for the
 * sidecar's own pod (--pod): the writer applies it to the index, merged with
 * what the engine reports, and publishes it, so routers see the tiers.
 */
#define KVT_LOG_COMPONENT "tiers"

#include "server/tier.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errtext.h"
#include "common/log.h"
#include "server/mailbox.h"
#include "tiers/tiers.h"

#define CHANGES_PER_JOB 4096u /* events in one writer job at most */

size_t srv_tier_ns(const char *model, size_t mlen, const char *lora, size_t llen, bool engine,
                   char *out)
{
    /* a NUL never appears in a name, so (model, lora, kind) triples cannot collide */
    memcpy(out, model, mlen);
    if (llen == 0 && !engine)
        return mlen;
    out[mlen] = '\0';
    memcpy(out + mlen + 1, lora, llen);
    if (!engine)
        return mlen + 1 + llen;
    out[mlen + 1 + llen] = '\0';
    return mlen + 2 + llen;
}

/* One writer job for changes @ch[0..n), all of one namespace. */
static srv_job_t *changes_job(const kvt_srv_t *srv, const kvt_tier_change_t *ch, size_t n)
{
    /* srv_tier_ns() read back: model [NUL lora [NUL]] */
    const char *model = ch[0].ns;
    size_t mlen = strnlen(ch[0].ns, ch[0].ns_len);
    const char *lora = mlen < ch[0].ns_len ? ch[0].ns + mlen + 1 : NULL;
    size_t llen = lora != NULL ? ch[0].ns_len - mlen - 1 : 0;
    bool engine = llen > 0 && lora[llen - 1] == '\0';
    if (engine && --llen == 0)
        lora = NULL;
    size_t plen = strlen(srv->pod);
    size_t bytes = n * (sizeof(kvt_event_t) + sizeof(uint64_t)) + plen + mlen + llen + 3;
    srv_job_t *job = calloc(1, sizeof(*job));
    uint8_t *arena = malloc(bytes);
    if (job == NULL || arena == NULL) {
        free(job);
        free(arena);
        return NULL;
    }
    kvt_event_t *ev = (kvt_event_t *)arena;
    uint64_t *hashes = (uint64_t *)(ev + n);
    char *s = (char *)(hashes + n);
    kvt_evbatch_t *b = &job->batch;
    b->arena = arena;
    b->ev = ev;
    b->nev = n;
    b->pod = memcpy(s, srv->pod, plen + 1);
    s += plen + 1;
    memcpy(s, model, mlen);
    s[mlen] = '\0';
    b->model = s;
    s += mlen + 1;
    if (lora != NULL) {
        memcpy(s, lora, llen);
        s[llen] = '\0';
        b->lora = s;
    }
    for (size_t i = 0; i < n; i++) {
        hashes[i] = ch[i].key;
        ev[i] = (kvt_event_t){.type = ch[i].stored ? KVT_EV_STORED : KVT_EV_REMOVED,
                              .tier = ch[i].loc == KVT_TIER_LOC_RAM ? KVT_TIER_CPU : KVT_TIER_DISK,
                              .nhashes = 1,
                              .hashes = &hashes[i],
                              .group = -1};
    }
    job->kind = JOB_TIER_CHANGES;
    job->engine_keys = engine;
    return job;
}

/* The tier's changes, from whichever thread caused them, in order: to the writer. */
static void on_change(void *arg, const kvt_tier_change_t *ch, size_t n)
{
    kvt_srv_t *srv = arg;
    size_t i = 0;
    while (i < n) {
        size_t j = i + 1;
        while (j < n && j - i < CHANGES_PER_JOB && ch[j].ns_len == ch[i].ns_len &&
               memcmp(ch[j].ns, ch[i].ns, ch[i].ns_len) == 0)
            j++;
        srv_job_t *job = changes_job(srv, ch + i, j - i);
        if (job == NULL || srv_mbox_post(&srv->inbox, job) != KVT_OK) {
            srv_job_free(job);
            atomic_fetch_add(&srv->tier_lost, j - i);
            kvt_log_warn("%zu tier changes not reported to the index: writer queue full", j - i);
        }
        i = j;
    }
}

kvt_status_t srv_tier_open(kvt_srv_t *srv)
{
    const kvt_srv_config_t *c = &srv->cfg;
    if (c->ram_bytes == 0)
        return KVT_OK;
    if (c->block_bytes == 0 || c->block_bytes > (1u << 30)) {
        kvt_log_error("--block-bytes must be 1 byte to 1 GiB");
        return KVT_ERR_INVAL;
    }
    if (c->block_bytes + 1024 > c->rpc_max_frame)
        kvt_log_warn("--rpc-max-frame (%" PRIu64 ") is below --block-bytes (%" PRIu64
                     ") plus 1 KiB: BLOCK_PUT and BLOCK_GET of whole blocks will not fit a frame",
                     c->rpc_max_frame, c->block_bytes);
    kvt_tier_admit_t admit;
    if (kvt_tier_admit_parse(c->disk_admit, &admit) != KVT_OK) {
        kvt_log_error("--disk-admit must be always, seen-twice or tinylfu, not \"%s\"",
                      c->disk_admit);
        return KVT_ERR_INVAL;
    }
    if (c->lease_ms == 0 || c->lease_ms > UINT32_MAX) {
        kvt_log_error("--lease must be between 1 ms and 49 days");
        return KVT_ERR_INVAL;
    }
    if (c->release_grace_ms > 600000) {
        kvt_log_error("--release-grace must be at most 10 minutes");
        return KVT_ERR_INVAL;
    }
    char meta[4096];
    int ml = snprintf(meta, sizeof(meta), "%s/tiers", c->data_dir[0] ? c->data_dir : ".");
    if (ml < 0 || (size_t)ml >= sizeof(meta)) {
        kvt_log_error("--data-dir is too long");
        return KVT_ERR_INVAL;
    }
    kvt_tier_cfg_t tc = {.ram_bytes = c->ram_bytes,
                         .block_bytes = (uint32_t)c->block_bytes,
                         .arena_name = c->arena_name,
                         .populate = true,
                         .disk_path = c->disk_path,
                         .disk_bytes = c->disk_bytes,
                         .disk_format = c->disk_format,
                         .data_dir = meta,
                         .io_depth = c->io_depth,
                         .sqpoll = c->sqpoll,
                         .admit = admit,
                         .lease_ms = (uint32_t)c->lease_ms,
                         .grace_ms = (uint32_t)c->release_grace_ms,
                         .on_change = on_change,
                         .on_change_arg = srv};
    char err[512];
    kvt_status_t st = kvt_tier_open(&tc, &srv->tier, err, sizeof(err));
    if (st != KVT_OK) {
        kvt_log_error("tiers: %s", err);
        return st;
    }
    kvt_tier_geom_t g;
    kvt_tier_geom(srv->tier, &g);
    kvt_log_info("tiers: RAM %u slots of %u bytes%s%s, NVMe %u slots, pod %s", g.nslots,
                 g.slot_bytes, c->arena_name[0] ? " in " : "", c->arena_name, g.disk_slots,
                 srv->pod);
    return KVT_OK;
}

void srv_tier_close(kvt_srv_t *srv)
{
    kvt_tier_close(srv->tier);
    srv->tier = NULL;
    kvt_u64map_free(&srv->tier_pending);
}

/*
 * Adds tier @tier to the block @pod holds under engine hash @ehash, or held until its
 * engine removed it lately (the removed mappings, as kvt_ev_apply() uses them for an
 * engine's token-less stores). False when the pod does not know the hash.
 */
static bool ehash_store(kvt_srv_t *srv, uint32_t pod, unsigned tier, uint64_t ehash)
{
    size_t unresolved = 0;
    if (kvt_idx_store_by_ehash(srv->idx, pod, tier, &ehash, 1, &unresolved) == KVT_OK &&
        unresolved == 0)
        return true;
    uint32_t ns;
    uint64_t key, parent;
    bool has_parent;
    if (!kvt_ev_ctx_removed_get(srv->ev_ctx, pod, ehash, &ns, &key, &has_parent, &parent))
        return false;
    return kvt_idx_store(srv->idx, ns, pod, tier, has_parent ? &parent : NULL, &key, &ehash, 1) ==
           KVT_OK;
}

void srv_tier_apply(kvt_srv_t *srv, srv_job_t *job)
{
    kvt_evbatch_t *b = &job->batch;
    uint32_t ns = 0, pod;
    kvt_status_t st = KVT_OK;
    if (!job->engine_keys) { /* engine hashes name their blocks' namespace through the pod */
        st = kvt_idx_ns_get(srv->idx, b->model, b->lora, 0, &ns);
        if (st == KVT_ERR_NOT_FOUND)
            st = kvt_idx_ns_get(srv->idx, b->model, b->lora, srv->cfg.block_size, &ns);
    }
    if (st == KVT_OK)
        st = kvt_idx_pod_get(srv->idx, b->pod, 0, &pod);
    if (st != KVT_OK) {
        kvt_log_warn("tier changes of %s: %s", b->model, kvt_status_str(st));
        return;
    }
    /*
     * Sequence keys (docs/tiers.md) are stored as the pod's own blocks; engine-hash keys
     * (ENGINE_KEYS) add the tier to the block the pod's engine reported under that hash, as
     * an engine's own CPU store without tokens would. A hash the pod does not know yet waits
     * in tier_pending until it does (srv_tier_retry()).
     */
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        uint64_t h = e->hashes[0];
        if (e->type != KVT_EV_STORED) {
            kvt_idx_remove(srv->idx, pod, e->tier, e->hashes, 1, NULL);
            uint8_t was = job->engine_keys ? kvt_u64map_get(&srv->tier_pending, h) : 0;
            if ((was & e->tier) != 0)
                kvt_u64map_put(&srv->tier_pending, h, (uint8_t)(was & ~e->tier));
        } else if (job->engine_keys) {
            uint8_t was = kvt_u64map_get(&srv->tier_pending, h);
            if (!ehash_store(srv, pod, e->tier, h) &&
                !kvt_u64map_put(&srv->tier_pending, h, (uint8_t)(was | e->tier)))
                kvt_log_warn("engine key %#" PRIx64 ": out of memory; not in the index", h);
        } else {
            kvt_idx_store(srv->idx, ns, pod, e->tier, NULL, e->hashes, NULL, 1);
        }
    }
    atomic_store(&srv->tier_unresolved, srv->tier_pending.n);
    kvt_zsub_publish(srv->zsub, b); /* a failure is counted there */
}

typedef struct retry_arg {
    kvt_srv_t *srv;
    uint32_t pod;
} retry_arg_t;

/* One pending engine key: the tiers the pod now knows it under are added and dropped. */
static uint8_t retry_one(void *arg, uint64_t ehash, uint8_t tiers)
{
    retry_arg_t *a = arg;
    for (unsigned bit = 1; bit <= KVT_TIER_ALL; bit <<= 1)
        if ((tiers & bit) != 0 && ehash_store(a->srv, a->pod, bit, ehash))
            tiers &= (uint8_t)~bit;
    return tiers;
}

void srv_tier_retry(kvt_srv_t *srv, uint64_t now_ns)
{
    if (srv->tier_pending.n == 0 || now_ns - srv->tier_pending_ns < SRV_TIER_RETRY_NS)
        return;
    srv->tier_pending_ns = now_ns;
    retry_arg_t a = {.srv = srv};
    if (kvt_idx_pod_get(srv->idx, srv->pod, 0, &a.pod) != KVT_OK)
        return;
    kvt_u64map_sweep(&srv->tier_pending, &srv->tier_pending_cursor, SRV_TIER_RETRY_SLOTS,
                     retry_one, &a);
    atomic_store(&srv->tier_unresolved, srv->tier_pending.n);
}

static void hist_json(kvt_jbuf_t *o, const uint64_t *h)
{
    kvt_jbuf_cstr(o, "[");
    for (int i = 0; i < KVT_TIER_HIST; i++) {
        if (i > 0)
            kvt_jbuf_cstr(o, ",");
        kvt_jbuf_u64(o, h[i]);
    }
    kvt_jbuf_cstr(o, "]");
}

void srv_tier_stats_json(kvt_srv_t *srv, kvt_jbuf_t *o)
{
    if (srv->tier == NULL) {
        kvt_jbuf_cstr(o, "\"tiers\":null");
        return;
    }
    kvt_tier_stats_t s;
    kvt_tier_geom_t g;
    kvt_tier_stats(srv->tier, &s);
    kvt_tier_geom(srv->tier, &g);
    kvt_jbuf_cstr(o, "\"tiers\":{\"pod\":");
    kvt_jbuf_str(o, srv->pod, strlen(srv->pod));
    kvt_jbuf_printf(
        o,
        ",\"block_bytes\":%u,\"slot_bytes\":%u,"
        "\"ram\":{\"slots\":%u,\"used\":%u,\"pinned\":%u,\"reserved\":%u},"
        "\"disk\":{\"slots\":%u,\"used\":%u},\"blocks\":%" PRIu64 ",\"lookups\":%" PRIu64
        ",\"hits_ram\":%" PRIu64 ",\"hits_disk\":%" PRIu64 ",\"misses\":%" PRIu64
        ",\"puts\":%" PRIu64 ",\"gets\":%" PRIu64 ",\"deletes\":%" PRIu64
        ",\"ram_evictions\":%" PRIu64 ",\"drops\":%" PRIu64 ",\"disk_evictions\":%" PRIu64
        ",\"admitted\":%" PRIu64 ",\"rejected\":%" PRIu64 ",\"demotions\":%" PRIu64
        ",\"promotions\":%" PRIu64 ",\"prefetches\":%" PRIu64 ",\"checksum_failures\":%" PRIu64
        ",\"io_errors\":%" PRIu64 ",\"lease_expired\":%" PRIu64 ",\"restored\":%" PRIu64
        ",\"restore_bad\":%" PRIu64 ",\"read_bytes\":%" PRIu64 ",\"write_bytes\":%" PRIu64
        ",\"changes_lost\":%" PRIu64 ",\"unresolved\":%" PRIu64,
        g.block_bytes, g.slot_bytes, s.ram_slots, s.ram_used, s.ram_pinned, s.ram_reserved,
        s.disk_slots, s.disk_used, s.blocks, s.lookups, s.hits_ram, s.hits_disk, s.misses, s.puts,
        s.gets, s.deletes, s.ram_evictions, s.drops, s.disk_evictions, s.admitted, s.rejected,
        s.demotions, s.promotions, s.prefetches, s.checksum_failures, s.io_errors, s.lease_expired,
        s.restored, s.restore_bad, s.read_bytes, s.write_bytes,
        (uint64_t)atomic_load(&srv->tier_lost), (uint64_t)atomic_load(&srv->tier_unresolved));
    kvt_jbuf_cstr(o, ",\"read_us_log2\":");
    hist_json(o, s.read_hist);
    kvt_jbuf_cstr(o, ",\"write_us_log2\":");
    hist_json(o, s.write_hist);
    kvt_jbuf_cstr(o, "}");
}

/* One Prometheus histogram from @h (bucket i: I/Os under 2^i microseconds). */
static void hist_metric(kvt_jbuf_t *o, const char *name, const char *help, const uint64_t *h)
{
    kvt_jbuf_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < KVT_TIER_HIST - 1; i++) {
        cum += h[i];
        kvt_jbuf_printf(o, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double)(1ull << i) / 1e6,
                        cum);
    }
    cum += h[KVT_TIER_HIST - 1];
    kvt_jbuf_printf(o, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n%s_count %" PRIu64 "\n", name, cum,
                    name, cum);
}

void srv_tier_metrics(kvt_srv_t *srv, kvt_jbuf_t *o)
{
    if (srv->tier == NULL)
        return;
    kvt_tier_stats_t s;
    kvt_tier_geom_t g;
    kvt_tier_stats(srv->tier, &s);
    kvt_tier_geom(srv->tier, &g);
    kvt_jbuf_printf(o,
                    "# HELP kvtier_tier_slots Slots of each tier.\n"
                    "# TYPE kvtier_tier_slots gauge\n"
                    "kvtier_tier_slots{tier=\"ram\"} %u\nkvtier_tier_slots{tier=\"disk\"} %u\n"
                    "# HELP kvtier_tier_used_slots Slots holding a block.\n"
                    "# TYPE kvtier_tier_used_slots gauge\n"
                    "kvtier_tier_used_slots{tier=\"ram\"} %u\n"
                    "kvtier_tier_used_slots{tier=\"disk\"} %u\n"
                    "# HELP kvtier_tier_used_bytes Bytes of the slots holding a block.\n"
                    "# TYPE kvtier_tier_used_bytes gauge\n"
                    "kvtier_tier_used_bytes{tier=\"ram\"} %" PRIu64 "\n"
                    "kvtier_tier_used_bytes{tier=\"disk\"} %" PRIu64 "\n"
                    "# HELP kvtier_tier_pinned_slots RAM slots pinned by engines.\n"
                    "# TYPE kvtier_tier_pinned_slots gauge\nkvtier_tier_pinned_slots %u\n"
                    "# HELP kvtier_tier_hits_total Keys found, by the tier that held them.\n"
                    "# TYPE kvtier_tier_hits_total counter\n"
                    "kvtier_tier_hits_total{tier=\"ram\"} %" PRIu64 "\n"
                    "kvtier_tier_hits_total{tier=\"disk\"} %" PRIu64 "\n"
                    "# HELP kvtier_tier_misses_total Keys not held.\n"
                    "# TYPE kvtier_tier_misses_total counter\nkvtier_tier_misses_total %" PRIu64
                    "\n"
                    "# HELP kvtier_tier_evictions_total Copies dropped to make room.\n"
                    "# TYPE kvtier_tier_evictions_total counter\n"
                    "kvtier_tier_evictions_total{tier=\"ram\"} %" PRIu64 "\n"
                    "kvtier_tier_evictions_total{tier=\"disk\"} %" PRIu64 "\n"
                    "# HELP kvtier_tier_admissions_total NVMe admission decisions.\n"
                    "# TYPE kvtier_tier_admissions_total counter\n"
                    "kvtier_tier_admissions_total{result=\"admitted\"} %" PRIu64 "\n"
                    "kvtier_tier_admissions_total{result=\"rejected\"} %" PRIu64 "\n"
                    "# HELP kvtier_tier_checksum_failures_total NVMe reads that did not match "
                    "their checksum (each a miss).\n"
                    "# TYPE kvtier_tier_checksum_failures_total counter\n"
                    "kvtier_tier_checksum_failures_total %" PRIu64 "\n"
                    "# HELP kvtier_tier_io_errors_total NVMe reads and writes that failed.\n"
                    "# TYPE kvtier_tier_io_errors_total counter\n"
                    "kvtier_tier_io_errors_total %" PRIu64 "\n",
                    s.ram_slots, s.disk_slots, s.ram_used, s.disk_used,
                    (uint64_t)s.ram_used * g.slot_bytes, (uint64_t)s.disk_used * g.slot_bytes,
                    s.ram_pinned, s.hits_ram, s.hits_disk, s.misses, s.ram_evictions,
                    s.disk_evictions, s.admitted, s.rejected, s.checksum_failures, s.io_errors);
    hist_metric(o, "kvtier_tier_read_seconds", "NVMe read latency.", s.read_hist);
    hist_metric(o, "kvtier_tier_write_seconds", "NVMe write latency (durable).", s.write_hist);
}
