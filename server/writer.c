/*
 * server/writer.c: the writer thread. It owns every write to the index: it
 * takes jobs from its inbox (mailbox.h), polls the engines' event streams,
 * applies both, answers each job through its worker's box, republishes the
 * index's names and the counters, and forgets idle names (writer.h).
 */
#define KVT_LOG_COMPONENT "srv"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/log.h"
#include "server/tier.h"
#include "server/writer.h"

/* ---- readiness --------------------------------------------------------------- */

bool srv_ready(kvt_srv_t *srv, char *err, size_t errlen)
{
    if (atomic_load(&srv->draining)) {
        kvt_errf(err, errlen, "stopping");
        return false;
    }
    uint64_t beat = __atomic_load_n(&srv->writer_beat_ns, __ATOMIC_RELAXED), now = kvt_clock_ns();
    /* the writer comes round its loop every 5 ms when idle; a long stall is a stuck apply */
    if (now > beat && now - beat > srv->cfg.writer_stall_ms * 1000000ull) {
        kvt_errf(err, errlen, "the index writer has made no progress for %.3f s",
                 (double)(now - beat) / 1e9);
        return false;
    }
    return true;
}

/* Wakes the writer's poll (the eventfd counts; one read resets it): the inbox's wake-up. */
static void writer_wake(void *arg)
{
    kvt_srv_t *srv = arg;
    uint64_t one = 1;
    ssize_t r = write(srv->q_efd, &one, sizeof(one));
    (void)r; /* only fails when the counter is saturated: the writer is awake anyway */
}

/* Fails @job with HTTP status @status and the message @fmt (into job->errmsg, and the JSON
 * answer {"error": ...}). */
__attribute__((format(printf, 3, 4))) static void answer_error(srv_job_t *job, int status,
                                                               const char *fmt, ...)
{
    job->http_status = status;
    va_list ap;
    va_start(ap, fmt);
    kvt_verrf(job->errmsg, sizeof(job->errmsg), fmt, ap);
    va_end(ap);
    kvt_jbuf_reset(&job->answer);
    kvt_jbuf_cstr(&job->answer, "{\"error\":");
    kvt_jbuf_str(&job->answer, job->errmsg, strlen(job->errmsg));
    kvt_jbuf_cstr(&job->answer, "}");
}

/* The index's names for the workers: republished when a pod or namespace came or went. */
static void names_publish(kvt_srv_t *srv)
{
    if (kvt_idx_names_publish(srv->idx) != KVT_OK)
        kvt_log_warn("names snapshot: out of memory; queries see the previous names");
}

/* kvt_ev_apply() flags every source of events shares (HTTP/RPC batches, engine streams). */
static unsigned srv_ev_flags(const kvt_srv_t *srv)
{
    return srv->cfg.lora_keys == KVT_SRV_LORA_KEYS_DYNAMO ? KVT_EV_LORA_DYNAMO : 0u;
}

static void job_events(kvt_srv_t *srv, srv_job_t *job)
{
    kvt_evbatch_t *b = &job->batch;
    kvt_ev_counters_t before = srv->st_ev;
    char err[256];
    job->st = kvt_ev_apply(srv->idx, srv->ev_ctx, b, srv->cfg.block_size,
                           KVT_EV_STRICT | srv_ev_flags(srv), &srv->st_ev, err, sizeof(err));
    if (job->st != KVT_OK) {
        srv->st_rejected += job->st == KVT_ERR_INVAL;
        answer_error(job, kvt_proto_http_status(job->st), "%s", err);
        return;
    }
    srv->st_batches++;
    kvt_zsub_publish(srv->zsub, b); /* a failure is counted there; the batch stays applied */
    job->http_status = 200;
    kvt_jbuf_t *o = &job->answer;
    kvt_jbuf_cstr(o, "{\"applied\":");
    kvt_jbuf_u64(o, srv->st_ev.events - before.events);
    kvt_jbuf_cstr(o, ",\"blocks\":");
    kvt_jbuf_u64(o, srv->st_ev.blocks - before.blocks);
    kvt_jbuf_cstr(o, ",\"unresolved\":");
    kvt_jbuf_u64(o, srv->st_ev.unresolved - before.unresolved);
    kvt_jbuf_cstr(o, ",\"orphans\":");
    kvt_jbuf_u64(o, srv->st_ev.orphans - before.orphans);
    kvt_jbuf_cstr(o, ",\"dropped\":");
    kvt_jbuf_u64(o, srv->st_ev.dropped - before.dropped);
    kvt_jbuf_cstr(o, ",\"recovered\":");
    kvt_jbuf_u64(o, srv->st_ev.recovered - before.recovered);
    kvt_jbuf_cstr(o, ",\"ignored\":");
    kvt_jbuf_u64(o, b->unknown + (srv->st_ev.remote - before.remote) +
                        (srv->st_ev.other_groups - before.other_groups) +
                        (srv->st_ev.unknown_medium - before.unknown_medium));
    kvt_jbuf_cstr(o, "}");
}

static void job_drop(kvt_srv_t *srv, srv_job_t *job)
{
    uint32_t ranks = 0;
    uint64_t entries = 0;
    for (uint32_t id = 0; id < kvt_idx_pod_limit(srv->idx); id++) {
        const char *n = kvt_idx_pod_name(srv->idx, id, NULL);
        if (n == NULL || strcmp(n, job->name) != 0)
            continue;
        entries += kvt_idx_pod_entries(srv->idx, id);
        kvt_ev_ctx_pod_reset(srv->ev_ctx, id); /* the id may go to another pod */
        if (kvt_idx_pod_drop(srv->idx, id) == KVT_OK)
            ranks++;
    }
    bool unsubscribed = kvt_zsub_remove(srv->zsub, job->name);
    if (ranks == 0 && !unsubscribed) {
        job->st = KVT_ERR_NOT_FOUND;
        answer_error(job, 404, "unknown pod '%s'", job->name);
        return;
    }
    srv->st_drops++;
    job->st = KVT_OK;
    job->http_status = 200;
    kvt_jbuf_cstr(&job->answer, "{\"pod\":");
    kvt_jbuf_str(&job->answer, job->name, strlen(job->name));
    kvt_jbuf_cstr(&job->answer, ",\"dp_ranks\":");
    kvt_jbuf_u64(&job->answer, ranks);
    kvt_jbuf_cstr(&job->answer, ",\"entries\":");
    kvt_jbuf_u64(&job->answer, entries);
    kvt_jbuf_cstr(&job->answer,
                  unsubscribed ? ",\"unsubscribed\":true}" : ",\"unsubscribed\":false}");
}

/* Drops every namespace (base model and LoRAs) of model job->name: what DELETE /v1/models does. */
static void job_model_drop(kvt_srv_t *srv, srv_job_t *job)
{
    uint32_t nss = 0;
    uint64_t blocks = 0;
    for (uint32_t slot = 0; slot < kvt_idx_ns_count(srv->idx); slot++) {
        uint32_t ns = kvt_idx_ns_id(srv->idx, slot);
        const char *model = ns == KVT_IDX_NS_NONE ? NULL : kvt_idx_ns_name(srv->idx, ns, NULL);
        uint64_t b = 0;
        if (model == NULL || strcmp(model, job->name) != 0 ||
            kvt_idx_ns_drop(srv->idx, ns, &b) != KVT_OK)
            continue;
        nss++;
        blocks += b;
    }
    if (nss == 0) {
        job->st = KVT_ERR_NOT_FOUND;
        answer_error(job, 404, "unknown model '%s'", job->name);
        return;
    }
    job->st = KVT_OK;
    job->http_status = 200;
    kvt_jbuf_cstr(&job->answer, "{\"model\":");
    kvt_jbuf_str(&job->answer, job->name, strlen(job->name));
    kvt_jbuf_cstr(&job->answer, ",\"namespaces\":");
    kvt_jbuf_u64(&job->answer, nss);
    kvt_jbuf_cstr(&job->answer, ",\"blocks\":");
    kvt_jbuf_u64(&job->answer, blocks);
    kvt_jbuf_cstr(&job->answer, "}");
}

/*
 * A router's decision (POST /v1/routed): the pod (created if needed) will hold the keys, as
 * speculative entries until the engine's own store confirms them or the TTL passes. Answers
 * {"blocks": 0} and changes nothing for a model (namespace) no engine has reported yet.
 */
static void job_routed(kvt_srv_t *srv, srv_job_t *job)
{
    const srv_routed_t *r = job->routed;
    uint32_t ns, pod;
    job->st = KVT_OK;
    if (r->n == 0) { /* shorter than a block: nothing to mark, no pod to create */
        job->http_status = 200;
        kvt_jbuf_cstr(&job->answer, "{\"blocks\":0}");
        return;
    }
    /*
     * Only a namespace an engine reported: creating one here would fix its block size to
     * --block-size before the engine's first events say what it is (and refuse those).
     */
    job->st = kvt_idx_ns_get(srv->idx, r->model, r->lora, 0, &ns);
    if (job->st == KVT_ERR_NOT_FOUND) {
        job->st = KVT_OK;
        job->http_status = 200;
        kvt_jbuf_cstr(&job->answer, "{\"blocks\":0}");
        return;
    }
    if (job->st == KVT_OK && kvt_idx_ns_block_size(srv->idx, ns) != r->block_size) {
        /* the namespace came, with another block size, after the worker hashed */
        job->st = KVT_ERR_INVAL;
        answer_error(job, 400, "model '%s' has another block size now; send the call again",
                     r->model);
        return;
    }
    if (job->st == KVT_OK)
        job->st = kvt_idx_pod_get(srv->idx, job->name, r->dp_rank, &pod);
    if (job->st == KVT_OK)
        job->st = kvt_idx_speculate(srv->idx, ns, pod, r->keys, r->n, r->ttl_ms);
    if (job->st != KVT_OK) {
        answer_error(job, kvt_proto_http_status(job->st), "routed: %s", kvt_status_str(job->st));
        return;
    }
    job->http_status = 200;
    kvt_jbuf_cstr(&job->answer, "{\"blocks\":");
    kvt_jbuf_u64(&job->answer, r->n);
    kvt_jbuf_cstr(&job->answer, "}");
}

/* Whether ZMQ @ep stays on this host: ipc, inproc, or tcp on a loopback address. "" counts. */
bool srv_zmq_local(const char *ep)
{
    if (ep[0] == '\0' || strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return true;
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    const char *h = ep + 6;
    return strncmp(h, "127.", 4) == 0 || strncmp(h, "localhost:", 10) == 0 ||
           strncmp(h, "[::1]:", 6) == 0;
}

/* kvt_zsub_add(), after refusing a non-loopback bind without --allow-remote. */
static kvt_status_t srv_engine_add(kvt_srv_t *srv, const kvt_zsub_engine_t *e, char *err,
                                   size_t errlen)
{
    if (kvt_zsub_engine_binds(e) && !srv_zmq_local(e->endpoint) && !srv->cfg.allow_remote) {
        kvt_errf(err, errlen, "binding %s needs kvtierd --allow-remote", e->endpoint);
        return KVT_ERR_INVAL;
    }
    return kvt_zsub_add(srv->zsub, e, err, errlen);
}

/* Subscribes to an engine's event streams; answers with the endpoints in use. */
static void job_engine_add(kvt_srv_t *srv, srv_job_t *job)
{
    char err[320];
    job->st = srv_engine_add(srv, job->engine, err, sizeof(err));
    if (job->st != KVT_OK) {
        answer_error(job, kvt_proto_http_status(job->st), "%s", err);
        return;
    }
    job->http_status = 200;
    size_t n = kvt_zsub_streams(srv->zsub, NULL, 0);
    kvt_zsub_stream_info_t *info = malloc(n * sizeof(*info));
    kvt_jbuf_t *o = &job->answer;
    kvt_jbuf_cstr(o, "{\"pod\":");
    kvt_jbuf_str(o, job->engine->pod, strlen(job->engine->pod));
    kvt_jbuf_cstr(o, ",\"dp_size\":");
    kvt_jbuf_u64(o, job->engine->dp_size);
    kvt_jbuf_cstr(o, ",\"endpoints\":[");
    if (info != NULL) {
        kvt_zsub_streams(srv->zsub, info, n);
        bool first = true;
        for (size_t i = 0; i < n; i++) {
            if (strcmp(info[i].pod, job->engine->pod) != 0)
                continue;
            if (!first)
                kvt_jbuf_cstr(o, ",");
            first = false;
            kvt_jbuf_str(o, info[i].endpoint, strlen(info[i].endpoint));
        }
        free(info);
    }
    kvt_jbuf_cstr(o, "]}");
}

/* Writer. Copies counters for /v1/stats and /metrics. */
void srv_stats_publish(kvt_srv_t *srv)
{
    kvt_idx_stats_t s;
    kvt_idx_stats(srv->idx, &s);
    uint32_t npods = kvt_idx_pod_limit(srv->idx);
    uint64_t *ent = NULL;
    if (npods > 0) {
        ent = malloc(npods * sizeof(*ent));
        if (ent == NULL)
            return;
        for (uint32_t i = 0; i < npods; i++)
            ent[i] =
                kvt_idx_pod_name(srv->idx, i, NULL) ? kvt_idx_pod_entries(srv->idx, i) : UINT64_MAX;
    }
    size_t nst = kvt_zsub_streams(srv->zsub, NULL, 0);
    kvt_zsub_stream_info_t *streams = nst ? malloc(nst * sizeof(*streams)) : NULL;
    if (streams != NULL)
        kvt_zsub_streams(srv->zsub, streams, nst);
    else
        nst = 0;
    /* totals count what came over HTTP/RPC and over the streams */
    kvt_ev_counters_t ev = srv->st_ev;
    uint64_t batches = srv->st_batches;
    for (size_t i = 0; i < nst; i++) {
        kvt_ev_counters_add(&ev, &streams[i].c.ev);
        batches += streams[i].c.batches;
    }
    kvt_ev_ctx_stats_t evctx;
    kvt_ev_ctx_stats(srv->ev_ctx, &evctx);
    pthread_mutex_lock(&srv->stats_mu);
    srv->st_idx = s;
    srv->st_ev_pub = ev;
    srv->st_batches_pub = batches;
    kvt_zsub_stream_info_t *old_streams = srv->st_streams;
    srv->st_streams = streams;
    srv->st_nstreams = nst;
    srv->st_rejected_pub = srv->st_rejected;
    srv->st_drops_pub = srv->st_drops;
    srv->st_forgotten_pub = srv->st_forgotten;
    srv->st_evctx = evctx;
    kvt_zsub_publish_info(srv->zsub, &srv->st_pub);
    uint64_t *old = srv->st_pod_entries;
    srv->st_pod_entries = ent;
    srv->st_npods = npods;
    __atomic_store_n(&srv->st_gen, srv->st_gen + 1, __ATOMIC_RELEASE); /* shared bodies are old */
    pthread_mutex_unlock(&srv->stats_mu);
    free(old);
    free(old_streams);
}

/* The answer goes back through the box of the worker that posted the job (never closed). */
static void deliver(srv_job_t *job)
{
    if (job->worker == NULL) { /* the tier's changes: nobody waits for an answer */
        srv_job_free(job);
        return;
    }
    kvt_status_t st = srv_mbox_post(&job->worker->box, job);
    (void)st;
}

/*
 * Writer. Forgets pods that hold nothing, are fed by no stream and were last
 * written more than --forget-idle ago, and namespaces with no block unused
 * as long: a flood of names (pods, models, LoRAs) that came and went gives
 * its memory and ids back without a restart. Returns how many went.
 */
static size_t srv_forget(kvt_srv_t *srv, uint64_t now_ms)
{
    const uint64_t idle = srv->cfg.forget_idle_ms;
    size_t gone = 0;
    for (uint32_t id = kvt_idx_pod_limit(srv->idx); id-- > 0;) {
        const char *name = kvt_idx_pod_name(srv->idx, id, NULL);
        if (name == NULL || kvt_idx_pod_entries(srv->idx, id) != 0 ||
            now_ms - kvt_idx_pod_last_write(srv->idx, id) < idle ||
            kvt_zsub_subscribed(srv->zsub, name))
            continue;
        kvt_ev_ctx_pod_reset(srv->ev_ctx, id); /* the id may go to another pod */
        if (kvt_idx_pod_drop(srv->idx, id) == KVT_OK)
            gone++;
    }
    for (uint32_t slot = 0; slot < kvt_idx_ns_count(srv->idx); slot++) {
        uint32_t ns = kvt_idx_ns_id(srv->idx, slot);
        if (ns == KVT_IDX_NS_NONE || kvt_idx_ns_blocks(srv->idx, ns) != 0 ||
            now_ms - kvt_idx_ns_last_use(srv->idx, ns) < idle)
            continue;
        if (kvt_idx_ns_drop(srv->idx, ns, NULL) == KVT_OK)
            gone++;
    }
    if (gone > 0) {
        srv->st_forgotten += gone;
        names_publish(srv);
    }
    return gone;
}

static void *writer_main(void *arg)
{
    kvt_srv_t *srv = arg;
    uint64_t last_stats = 0, last_forget = 0;
    for (;;) {
        /* for /readyz: the loop came round (again below, after the poll's wait) */
        __atomic_store_n(&srv->writer_beat_ns, kvt_clock_ns(), __ATOMIC_RELAXED);
        bool idle = srv_mbox_idle(&srv->inbox);
        /* the index clock ticks every 5 ms at least */
        int rc = kvt_zsub_poll(srv->zsub, srv->q_efd, idle ? 5 : 0);
        if (rc == 1) {
            uint64_t v;
            ssize_t r = read(srv->q_efd, &v, sizeof(v));
            (void)r;
        } else if (rc < 0) {
            kvt_log_error("writer: polling the event streams failed: %s", kvt_status_str(rc));
            usleep(5000);
        }

        bool closed;
        srv_job_t *jobs = srv_mbox_take(&srv->inbox, NULL, NULL, NULL, &closed);
        bool stop = closed && jobs == NULL;

        uint64_t now = kvt_clock_ns();
        __atomic_store_n(&srv->writer_beat_ns, now, __ATOMIC_RELAXED);
        kvt_idx_advance(srv->idx, now / 1000000);
        names_publish(srv); /* the streams may have registered pods or namespaces */
        bool others = false;
        for (srv_job_t *j = jobs; j != NULL; j = j->next) {
            kvt_jbuf_init(&j->answer);
            if (j->kind == JOB_EVENTS)
                job_events(srv, j);
            else if (j->kind == JOB_ENGINE_ADD)
                job_engine_add(srv, j);
            else if (j->kind == JOB_MODEL_DROP)
                job_model_drop(srv, j);
            else if (j->kind == JOB_TIER_CHANGES)
                srv_tier_apply(srv, j);
            else if (j->kind == JOB_ROUTED)
                job_routed(srv, j);
            else
                job_drop(srv, j);
            /* routed calls come with every request a router sends: counters at their period */
            others |= j->kind != JOB_EVENTS && j->kind != JOB_TIER_CHANGES && j->kind != JOB_ROUTED;
        }
        /*
         * Pods and namespaces the jobs registered are published once for all of
         * them (a snapshot costs O(pods): once per job, a flood of new pods
         * would cost O(pods^2)), and before any answer goes: a caller that
         * queries after its answer finds its pod.
         */
        names_publish(srv); /* a no-op when no job changed a name */
        if (others) {       /* published at once: a caller reads its own change */
            srv_stats_publish(srv);
            last_stats = now;
        }
        while (jobs != NULL) {
            srv_job_t *j = jobs;
            jobs = j->next;
            deliver(j);
        }
        /* forgetting looks at every pod and namespace: a few times per --forget-idle */
        uint64_t forget_every =
            srv->cfg.forget_idle_ms / 4 < 1000 ? srv->cfg.forget_idle_ms / 4 : 1000;
        if (srv->cfg.forget_idle_ms != 0 && now - last_forget >= forget_every * 1000000ull) {
            last_forget = now;
            if (srv_forget(srv, now / 1000000) > 0)
                last_stats = 0; /* publish at once */
        }
        srv_tier_retry(srv, now);
        if (stop || now - last_stats >= srv->cfg.stats_period_ms * 1000000ull) {
            srv_stats_publish(srv);
            last_stats = now;
        }
        if (stop)
            break;
    }
    return NULL;
}

kvt_status_t srv_writer_init(kvt_srv_t *srv, const kvt_srv_config_t *cfg)
{
    srv->q_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (srv->q_efd < 0) {
        kvt_log_error("eventfd: %s", strerror(errno));
        return KVT_ERR_IO;
    }
    srv_mbox_init(&srv->inbox, srv->cfg.writer_queue, writer_wake, srv);
    srv->inbox_ready = true;
    kvt_zsub_config_t zc;
    kvt_zsub_config_default(&zc);
    zc.default_block_size = cfg->block_size;
    zc.max_items = cfg->max_event_items;
    zc.max_msg_bytes = cfg->event_max_message;
    zc.replay_timeout_ms = cfg->replay_timeout_ms;
    zc.max_held = cfg->replay_hold;
    zc.ev_ctx = srv->ev_ctx;
    zc.ev_flags = srv_ev_flags(srv); /* streams key LoRAs as HTTP/RPC events do */
    zc.ipc_dir = srv->ipc_dir;
    kvt_status_t st = kvt_zsub_create(srv->idx, &zc, &srv->zsub);
    if (st == KVT_OK && srv->cfg.publish[0] != '\0') {
        char err[320];
        const char *remote = !srv_zmq_local(srv->cfg.publish)          ? srv->cfg.publish
                             : !srv_zmq_local(srv->cfg.publish_replay) ? srv->cfg.publish_replay
                                                                       : NULL;
        if (remote != NULL && !srv->cfg.allow_remote) {
            kvt_log_error("--publish: binding %s needs --allow-remote", remote);
            return KVT_ERR_INVAL;
        }
        st = kvt_zsub_publish_open(srv->zsub, srv->cfg.publish, srv->cfg.publish_replay,
                                   srv->cfg.publish_buffer, err, sizeof(err));
        if (st != KVT_OK) {
            kvt_log_error("--publish: %s", err);
            return KVT_ERR_INVAL;
        }
    }
    for (size_t i = 0; st == KVT_OK && i < cfg->engines.n; i++) {
        const char *text = cfg->engines.items[i];
        kvt_zsub_engine_t e;
        char err[320];
        st = kvt_zsub_engine_json_decode(text, strlen(text), &e, err, sizeof(err));
        if (st == KVT_OK)
            st = srv_engine_add(srv, &e, err, sizeof(err));
        if (st != KVT_OK) {
            kvt_log_error("--engine %zu: %s", i + 1, err);
            st = KVT_ERR_INVAL;
        }
    }
    return st;
}

kvt_status_t srv_writer_start(kvt_srv_t *srv)
{
    if (pthread_create(&srv->writer, NULL, writer_main, srv) != 0)
        return KVT_ERR_NO_MEM;
    pthread_setname_np(srv->writer, "kvt-writer"); /* kvtier-bench events reads its CPU time */
    /* serve only once the writer came round its loop: /readyz is then true from the first
     * request */
    while (__atomic_load_n(&srv->writer_beat_ns, __ATOMIC_RELAXED) == 0)
        usleep(200);
    return KVT_OK;
}

void srv_writer_stop(kvt_srv_t *srv)
{
    /* writes already queued are applied and answered before the writer ends */
    srv_mbox_close(&srv->inbox);
    pthread_join(srv->writer, NULL);
}

void srv_writer_cleanup(kvt_srv_t *srv)
{
    if (srv->inbox_ready) {
        srv_mbox_cleanup(&srv->inbox);
        srv->inbox_ready = false;
    }
    kvt_zsub_destroy(srv->zsub);
    srv->zsub = NULL;
    if (srv->q_efd >= 0)
        close(srv->q_efd);
    srv->q_efd = -1;
}
