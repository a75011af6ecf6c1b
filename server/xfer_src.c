/*
 * server/xfer_src.c: the source side of the transfer, RPC only: XFER_HELLO
 * hands out the arena's handshake; XFER_PIN, XFER_RENEW and XFER_RELEASE
 * hold blocks in place for a peer's reads, XFER_RESERVE and XFER_COMMIT take
 * slots for a peer's writes and publish what landed intact. Leases are tier
 * sessions of their own (xfer_int.h). Every frame names this kvtierd's
 * incarnation; another one is refused (KVT_ERR_STALE) and changes nothing.
 */
#define KVT_LOG_COMPONENT "xfer"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/grow.h"
#include "server/mailbox.h"
#include "server/tier.h"
#include "server/xfer_int.h"

static void error(srv_result_t *res, int status, kvt_status_t st, const char *msg)
{
    *res = (srv_result_t){.out = OUT_ERROR, .status = status, .st = st, .msg = msg};
}

static void frames(srv_result_t *res)
{
    *res = (srv_result_t){.out = OUT_FRAMES, .status = 200};
}

/* ---- jobs ------------------------------------------------------------------------------ */

void srv_xfer_call_free(srv_xfer_call_t *xc)
{
    if (xc == NULL)
        return;
    if (xc->lease != NULL)
        srv_lease_put(xc->lease);
    free(xc->keys);
    free(xc);
}

void srv_xjob_error(srv_job_t *job, kvt_status_t st, int http, const char *msg)
{
    job->st = st;
    job->http_status = http;
    kvt_errf(job->errmsg, sizeof(job->errmsg), "%s", msg);
    kvt_jbuf_reset(&job->answer);
}

void srv_xjob_frame(srv_job_t *job, const kvt_proto_wr_t *wr)
{
    kvt_jbuf_reset(&job->answer);
    if (wr->oom || wr->bad || wr->len < KVT_PROTO_HDR_SIZE) {
        srv_xjob_error(job, KVT_ERR_NO_MEM, 503, "out of memory");
        return;
    }
    kvt_jbuf_raw(&job->answer, (const char *)wr->buf + KVT_PROTO_HDR_SIZE,
                 wr->len - KVT_PROTO_HDR_SIZE);
    job->st = KVT_OK;
    job->http_status = 200;
}

void srv_xjob_post(srv_job_t *job)
{
    if (job->answer.oom)
        srv_xjob_error(job, KVT_ERR_NO_MEM, 503, "out of memory");
    if (job->xc != NULL && job->xc->http && job->http_status != 200) {
        /* an HTTP error's body is {"error": "..."} */
        kvt_jbuf_reset(&job->answer);
        kvt_jbuf_cstr(&job->answer, "{\"error\":");
        kvt_jbuf_str(&job->answer, job->errmsg, strlen(job->errmsg));
        kvt_jbuf_cstr(&job->answer, "}");
    }
    srv_mbox_post(&job->worker->box, job); /* a worker's box is never closed while it runs */
}

/* ---- leases ---------------------------------------------------------------------------- */

static void lease_destroy(srv_lease_t *l)
{
    kvt_tier_sess_close(l->xf->tier, l->sess); /* releases its pins and reservations */
    free(l->resv);
    free(l);
}

static void destroy_list(srv_lease_t *dead)
{
    while (dead != NULL) {
        srv_lease_t *next = dead->next;
        lease_destroy(dead);
        dead = next;
    }
}

/* Unlinks @l (under mu): onto @dead_p when idle, else doomed for its last user. */
static void unlink_locked(srv_xfer_t *xf, srv_lease_t **pp, srv_lease_t **dead_p)
{
    srv_lease_t *l = *pp;
    *pp = l->next;
    xf->nleases--;
    if (l->busy == 0) {
        l->next = *dead_p;
        *dead_p = l;
    } else {
        l->next = NULL;
        l->doomed = true;
    }
}

/* Drops the leases past their deadline (under mu); their sessions go to @dead_p. */
static void sweep_locked(srv_xfer_t *xf, srv_lease_t **dead_p)
{
    uint64_t now = kvt_clock_ns();
    for (srv_lease_t **pp = &xf->leases; *pp != NULL;) {
        if ((*pp)->busy == 0 && (*pp)->deadline_ns < now) {
            atomic_fetch_add_explicit(&xf->leases_expired, 1, memory_order_relaxed);
            unlink_locked(xf, pp, dead_p);
        } else {
            pp = &(*pp)->next;
        }
    }
}

static uint64_t lease_ns(const srv_xfer_t *xf, uint32_t lease_ms)
{
    uint64_t ms = lease_ms != 0 ? lease_ms : xf->srv->cfg.lease_ms;
    return kvt_clock_ns() + ms * 1000000u;
}

/* Lease @id, taken (busy), or NULL when it is not held. */
static srv_lease_t *lease_get(srv_xfer_t *xf, uint64_t id)
{
    srv_lease_t *dead = NULL, *found = NULL;
    pthread_mutex_lock(&xf->mu);
    sweep_locked(xf, &dead);
    for (srv_lease_t *l = xf->leases; l != NULL; l = l->next)
        if (l->id == id) {
            l->busy++;
            found = l;
            break;
        }
    pthread_mutex_unlock(&xf->mu);
    destroy_list(dead);
    return found;
}

/* A new lease, taken (busy); NULL when out of memory or over SRV_XFER_MAX_LEASES. */
static srv_lease_t *lease_new(srv_xfer_t *xf, uint32_t lease_ms)
{
    srv_lease_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->sess = kvt_tier_sess_open(xf->tier);
    if (l->sess == NULL) {
        free(l);
        return NULL;
    }
    l->xf = xf;
    l->busy = 1;
    l->deadline_ns = lease_ns(xf, lease_ms);
    srv_lease_t *dead = NULL;
    bool full;
    pthread_mutex_lock(&xf->mu);
    sweep_locked(xf, &dead);
    full = xf->nleases >= SRV_XFER_MAX_LEASES;
    if (!full) {
        l->id = ++xf->next_lease;
        l->next = xf->leases;
        xf->leases = l;
        xf->nleases++;
    }
    pthread_mutex_unlock(&xf->mu);
    destroy_list(dead);
    if (full) {
        lease_destroy(l);
        return NULL;
    }
    atomic_fetch_add_explicit(&xf->leases_opened, 1, memory_order_relaxed);
    return l;
}

void srv_lease_put(srv_lease_t *l)
{
    srv_xfer_t *xf = l->xf;
    pthread_mutex_lock(&xf->mu);
    bool dead = --l->busy == 0 && l->doomed;
    pthread_mutex_unlock(&xf->mu);
    if (dead)
        lease_destroy(l);
}

/* Renews @l's session to @lease_ms from now; returns what it holds. */
static size_t lease_renew(srv_lease_t *l, uint32_t lease_ms)
{
    srv_xfer_t *xf = l->xf;
    size_t held = kvt_tier_sess_renew(xf->tier, l->sess, lease_ms);
    pthread_mutex_lock(&xf->mu);
    l->deadline_ns = lease_ns(xf, lease_ms);
    pthread_mutex_unlock(&xf->mu);
    return held;
}

void srv_xfer_leases_close(srv_xfer_t *xf)
{
    srv_lease_t *dead = NULL;
    pthread_mutex_lock(&xf->mu);
    while (xf->leases != NULL)
        unlink_locked(xf, &xf->leases, &dead);
    pthread_mutex_unlock(&xf->mu);
    destroy_list(dead);
}

uint32_t srv_xfer_nleases(srv_xfer_t *xf)
{
    pthread_mutex_lock(&xf->mu);
    uint32_t n = xf->nleases;
    pthread_mutex_unlock(&xf->mu);
    return n;
}

/* ---- checks ---------------------------------------------------------------------------- */

srv_xfer_t *srv_xfer_or_error(srv_req_t *rq, srv_result_t *res)
{
    srv_xfer_t *xf = rq->w->srv->xfer;
    if (xf == NULL)
        error(res, 501, KVT_ERR_UNSUPPORTED,
              "this kvtierd takes no part in transfers: it needs --ram-bytes and --ucx on, and "
              "UCX must start (see its log)");
    return xf;
}

/* False with an error answer when @inc is not this kvtierd's incarnation. */
static bool inc_ok(srv_req_t *rq, srv_result_t *res, uint64_t inc)
{
    uint64_t mine = rq->w->srv->incarnation;
    if (inc == mine)
        return true;
    kvt_errf(rq->err, rq->errlen,
             "stale incarnation %" PRIu64 ": this kvtierd is %" PRIu64 " (handshake again)", inc,
             mine);
    error(res, kvt_proto_http_status(KVT_ERR_STALE), KVT_ERR_STALE, rq->err);
    return false;
}

static bool decoded(srv_req_t *rq, srv_result_t *res, kvt_status_t st)
{
    if (st == KVT_OK)
        return true;
    error(res, kvt_proto_http_status(st), st, rq->err);
    return false;
}

/* Grows the worker's scratch to @n keys and @n u32s; false with an error answer. */
static bool scratch(srv_req_t *rq, srv_result_t *res, size_t n)
{
    kvt_srv_worker_t *w = rq->w;
    if (kvt_grow(&w->keys, &w->keys_cap, n, sizeof(uint64_t), 1024) &&
        kvt_grow(&w->tokens, &w->tokens_cap, n, sizeof(uint32_t), 1024))
        return true;
    error(res, 503, KVT_ERR_NO_MEM, "out of memory");
    return false;
}

/* The lease a PIN or RESERVE names (0: a new one), taken; NULL with an error answer. */
static srv_lease_t *lease_of(srv_req_t *rq, srv_result_t *res, srv_xfer_t *xf,
                             const kvt_proto_xfer_keys_t *k)
{
    srv_lease_t *l = k->lease == 0 ? lease_new(xf, k->lease_ms) : lease_get(xf, k->lease);
    if (l != NULL)
        return l;
    if (k->lease == 0) {
        error(res, 503, KVT_ERR_NO_MEM, "no lease: out of memory, or too many leases held");
    } else {
        kvt_errf(rq->err, rq->errlen, "lease %" PRIu64 " is not held (released or expired)",
                 k->lease);
        error(res, 404, KVT_ERR_NOT_FOUND, rq->err);
    }
    return NULL;
}

/* ---- XFER_HELLO ------------------------------------------------------------------------ */

void srv_h_xfer_hello(srv_req_t *rq, srv_result_t *res)
{
    srv_xfer_t *xf = srv_xfer_or_error(rq, res);
    if (xf == NULL)
        return;
    uint64_t expect;
    if (!decoded(rq, res,
                 kvt_proto_xfer_hello_req_decode(rq->body, rq->len, &expect, rq->err, rq->errlen)))
        return;
    if (expect != 0 && !inc_ok(rq, res, expect))
        return;
    kvt_proto_xfer_hello_ans_t h = {.incarnation = rq->w->srv->incarnation,
                                    .slot_bytes = xf->slot_bytes,
                                    .nslots = xf->nslots,
                                    .base = xf->base,
                                    .addr_len = (uint32_t)xf->addr_len,
                                    .addr = xf->addr,
                                    .rkey_len = (uint32_t)xf->rkey_len,
                                    .rkey = xf->rkey,
                                    .host = {xf->host, (uint16_t)strlen(xf->host)},
                                    .unix_path = {xf->unix_path, (uint16_t)strlen(xf->unix_path)}};
    kvt_status_t st = kvt_proto_xfer_hello_ans_encode(rq->wr, rq->req_id, &h);
    if (st != KVT_OK)
        error(res, kvt_proto_http_status(st), st, "xfer_hello: the answer cannot be encoded");
    else
        frames(res);
}

/* ---- XFER_PIN -------------------------------------------------------------------------- */

static void xpin_done(void *arg, const kvt_tier_pinned_t *out, size_t n)
{
    srv_job_t *job = arg;
    srv_xfer_call_t *xc = job->xc;
    srv_lease_t *l = xc->lease;
    srv_xfer_t *xf = l->xf;
    kvt_proto_xfer_pinned_t *pins = malloc((n > 0 ? n : 1) * sizeof(*pins));
    if (pins == NULL) {
        srv_xjob_error(job, KVT_ERR_NO_MEM, 503, "out of memory");
        srv_xjob_post(job);
        return;
    }
    uint64_t npinned = 0;
    for (size_t i = 0; i < n; i++) {
        if (out[i].slot == KVT_TIER_SLOT_NONE || out[i].len == 0) {
            pins[i] = (kvt_proto_xfer_pinned_t){.slot = KVT_PROTO_SLOT_NONE};
            continue;
        }
        /* the sum recorded when the block was stored, not one of the bytes now: a copy that
         * went bad since fails the receiver's check */
        pins[i] =
            (kvt_proto_xfer_pinned_t){.slot = out[i].slot, .len = out[i].len, .sum = out[i].sum};
        npinned++;
    }
    atomic_fetch_add_explicit(&xf->pinned_keys, npinned, memory_order_relaxed);
    lease_renew(l, xc->lease_ms);
    kvt_proto_wr_t wr;
    kvt_proto_wr_init(&wr);
    kvt_proto_xfer_slots_ans_t a = {.lease = l->id, .n = (uint32_t)n};
    kvt_status_t st = kvt_proto_xfer_pin_ans_encode(&wr, job->req_id, &a, pins);
    if (st != KVT_OK)
        srv_xjob_error(job, st, kvt_proto_http_status(st), "xfer_pin: answer not encoded");
    else
        srv_xjob_frame(job, &wr);
    kvt_proto_wr_cleanup(&wr);
    free(pins);
    srv_lease_put(l); /* the job's hold on it ends here */
    xc->lease = NULL;
    srv_xjob_post(job);
}

static void xpin_start(srv_job_t *job)
{
    srv_xfer_call_t *xc = job->xc;
    kvt_jbuf_init(&job->answer);
    kvt_status_t st = kvt_tier_pin(xc->lease->xf->tier, xc->lease->sess, xc->ns, xc->ns_len,
                                   xc->keys, xc->n, xpin_done, job);
    if (st != KVT_OK) {
        srv_xjob_error(job, st, kvt_proto_http_status(st), kvt_status_str(st));
        srv_xjob_post(job);
    }
}

void srv_h_xfer_pin(srv_req_t *rq, srv_result_t *res)
{
    srv_xfer_t *xf = srv_xfer_or_error(rq, res);
    if (xf == NULL)
        return;
    size_t cap = rq->len / 8 + 1;
    if (!scratch(rq, res, cap))
        return;
    kvt_proto_xfer_keys_t k;
    if (!decoded(rq, res,
                 kvt_proto_xfer_pin_req_decode(rq->body, rq->len, rq->w->keys, (uint32_t)cap, &k,
                                               rq->err, rq->errlen)) ||
        !inc_ok(rq, res, k.incarnation))
        return;
    srv_job_t *job = calloc(1, sizeof(*job));
    srv_xfer_call_t *xc = calloc(1, sizeof(*xc));
    uint64_t *keys = malloc(k.n * sizeof(uint64_t));
    if (job == NULL || xc == NULL || keys == NULL) {
        free(job);
        free(xc);
        free(keys);
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        return;
    }
    xc->lease = lease_of(rq, res, xf, &k);
    if (xc->lease == NULL) {
        free(job);
        free(xc);
        free(keys);
        return;
    }
    memcpy(keys, rq->w->keys, k.n * sizeof(uint64_t));
    xc->keys = keys;
    xc->n = k.n;
    xc->lease_ms = k.lease_ms;
    xc->ns_len = srv_tier_ns(k.model.p, k.model.len, k.lora.p, k.lora.len, false, xc->ns);
    job->kind = JOB_TIER;
    job->worker = rq->w;
    job->xc = xc;
    *res = (srv_result_t){.out = OUT_ASYNC, .status = 200, .job = job, .start = xpin_start};
}

/* ---- XFER_RENEW, XFER_RELEASE ---------------------------------------------------------- */

/* The transfer and *@lr of an XFER_RENEW or XFER_RELEASE that decodes and names this
 * incarnation; else NULL with the error answer set. */
static srv_xfer_t *lease_frame(srv_req_t *rq, srv_result_t *res, kvt_proto_xfer_lease_t *lr)
{
    srv_xfer_t *xf = srv_xfer_or_error(rq, res);
    if (xf == NULL ||
        !decoded(
            rq, res,
            kvt_proto_xfer_lease_req_decode(rq->op, rq->body, rq->len, lr, rq->err, rq->errlen)) ||
        !inc_ok(rq, res, lr->incarnation))
        return NULL;
    return xf;
}

void srv_h_xfer_renew(srv_req_t *rq, srv_result_t *res)
{
    kvt_proto_xfer_lease_t lr;
    srv_xfer_t *xf = lease_frame(rq, res, &lr);
    if (xf == NULL)
        return;
    size_t held = 0;
    srv_lease_t *l = lease_get(xf, lr.lease);
    if (l != NULL) {
        held = lease_renew(l, lr.lease_ms);
        srv_lease_put(l);
    }
    kvt_proto_count_ans_encode(rq->wr, rq->op, rq->req_id, (uint32_t)held);
    frames(res);
}

void srv_h_xfer_release(srv_req_t *rq, srv_result_t *res)
{
    kvt_proto_xfer_lease_t lr;
    srv_xfer_t *xf = lease_frame(rq, res, &lr);
    if (xf == NULL)
        return;
    size_t held = 0;
    srv_lease_t *l = lease_get(xf, lr.lease);
    if (l != NULL) {
        /* counted while taken; unlinked, the session closes with the last user (us, or a pin
         * still completing) */
        held = kvt_tier_sess_renew(xf->tier, l->sess, 0);
        srv_lease_t *dead = NULL;
        pthread_mutex_lock(&xf->mu);
        for (srv_lease_t **pp = &xf->leases; *pp != NULL; pp = &(*pp)->next)
            if (*pp == l) {
                unlink_locked(xf, pp, &dead);
                break;
            }
        pthread_mutex_unlock(&xf->mu);
        srv_lease_put(l);
    }
    kvt_proto_count_ans_encode(rq->wr, rq->op, rq->req_id, (uint32_t)held);
    frames(res);
}

/* ---- XFER_RESERVE ---------------------------------------------------------------------- */

static int resv_cmp(const void *a, const void *b)
{
    uint64_t x = ((const srv_resv_t *)a)->key, y = ((const srv_resv_t *)b)->key;
    return (x > y) - (x < y);
}

void srv_h_xfer_reserve(srv_req_t *rq, srv_result_t *res)
{
    srv_xfer_t *xf = srv_xfer_or_error(rq, res);
    if (xf == NULL)
        return;
    size_t cap = rq->len / 12 + 1; /* a key and its length take 12 bytes */
    if (!scratch(rq, res, 2 * cap))
        return;
    uint64_t *keys = rq->w->keys;
    uint32_t *lens = rq->w->tokens, *slots = rq->w->tokens + cap;
    kvt_proto_xfer_keys_t k;
    if (!decoded(rq, res,
                 kvt_proto_xfer_reserve_req_decode(rq->body, rq->len, keys, lens, (uint32_t)cap, &k,
                                                   rq->err, rq->errlen)) ||
        !inc_ok(rq, res, k.incarnation))
        return;
    for (uint32_t i = 0; i < k.n; i++)
        if (lens[i] > xf->block_bytes) {
            kvt_errf(rq->err, rq->errlen,
                     "xfer_reserve: len[%u] is %u bytes, above --block-bytes (%u)", i, lens[i],
                     xf->block_bytes);
            error(res, 413, KVT_ERR_TOO_BIG, rq->err);
            return;
        }
    char ns[KVT_TIER_NS_MAX];
    size_t ns_len = srv_tier_ns(k.model.p, k.model.len, k.lora.p, k.lora.len, false, ns);
    srv_lease_t *l = lease_of(rq, res, xf, &k);
    if (l == NULL)
        return;
    pthread_mutex_lock(&xf->mu);
    bool same = l->ns_len == 0 || (l->ns_len == ns_len && memcmp(l->ns, ns, ns_len) == 0);
    bool room = kvt_grow(&l->resv, &l->resv_cap, l->nresv + k.n, sizeof(srv_resv_t), 64);
    if (same && l->ns_len == 0) {
        memcpy(l->ns, ns, ns_len);
        l->ns_len = ns_len;
    }
    pthread_mutex_unlock(&xf->mu);
    if (!same || !room) {
        srv_lease_put(l);
        if (!same)
            error(res, 400, KVT_ERR_INVAL, "xfer_reserve: a lease reserves for one model and lora");
        else
            error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        return;
    }
    size_t nev = 0;
    kvt_status_t st =
        kvt_tier_reserve(xf->tier, l->sess, ns, ns_len, keys, k.n, slots, NULL, 0, &nev);
    if (st != KVT_OK) {
        srv_lease_put(l);
        error(res, kvt_proto_http_status(st), st, kvt_status_str(st));
        return;
    }
    uint64_t nres = 0;
    pthread_mutex_lock(&xf->mu);
    for (uint32_t i = 0; i < k.n; i++)
        if (slots[i] != KVT_TIER_SLOT_NONE) {
            l->resv[l->nresv++] = (srv_resv_t){.key = keys[i], .slot = slots[i], .len = lens[i]};
            nres++;
        }
    qsort(l->resv, l->nresv, sizeof(srv_resv_t), resv_cmp);
    pthread_mutex_unlock(&xf->mu);
    atomic_fetch_add_explicit(&xf->reserved_keys, nres, memory_order_relaxed);
    /* no slot: held here already, or no room */
    for (uint32_t i = 0; i < k.n; i++)
        if (slots[i] == KVT_TIER_SLOT_NONE &&
            kvt_tier_lookup(xf->tier, ns, ns_len, &keys[i], 1, NULL) == 1)
            slots[i] = KVT_PROTO_XFER_SLOT_HELD;
    lease_renew(l, k.lease_ms);
    kvt_proto_xfer_slots_ans_t a = {.lease = l->id, .n = k.n};
    srv_lease_put(l);
    kvt_proto_xfer_reserve_ans_encode(rq->wr, rq->req_id, &a, slots);
    frames(res);
}

/* ---- XFER_COMMIT ----------------------------------------------------------------------- */

void srv_h_xfer_commit(srv_req_t *rq, srv_result_t *res)
{
    srv_xfer_t *xf = srv_xfer_or_error(rq, res);
    if (xf == NULL)
        return;
    size_t cap = rq->len / 17 + 1; /* key, sum, ok */
    kvt_proto_xfer_landed_t *landed = malloc(cap * sizeof(*landed));
    srv_resv_t *mine = malloc(cap * sizeof(*mine));
    uint64_t *good = malloc(3 * cap * sizeof(uint64_t)); /* good keys, bad keys, good sums */
    uint64_t *gsum = good != NULL ? good + 2 * cap : NULL;
    uint32_t *glens = malloc(cap * sizeof(uint32_t));
    uint8_t *visible = malloc(cap);
    srv_lease_t *l = NULL;
    kvt_proto_xfer_commit_t c;
    if (landed == NULL || mine == NULL || good == NULL || glens == NULL || visible == NULL) {
        error(res, 503, KVT_ERR_NO_MEM, "out of memory");
        goto out;
    }
    if (!decoded(rq, res,
                 kvt_proto_xfer_commit_req_decode(rq->body, rq->len, landed, (uint32_t)cap, &c,
                                                  rq->err, rq->errlen)) ||
        !inc_ok(rq, res, c.incarnation))
        goto out;
    if ((l = lease_get(xf, c.lease)) == NULL) {
        kvt_errf(rq->err, rq->errlen, "lease %" PRIu64 " is not held (released or expired)",
                 c.lease);
        error(res, 404, KVT_ERR_NOT_FOUND, rq->err);
        goto out;
    }
    /* take the reservations named (a key named twice counts once) */
    char ns[KVT_TIER_NS_MAX];
    size_t ns_len;
    pthread_mutex_lock(&xf->mu);
    memcpy(ns, l->ns, l->ns_len);
    ns_len = l->ns_len;
    for (uint32_t i = 0; i < c.n; i++) {
        srv_resv_t key = {.key = landed[i].key};
        srv_resv_t *r =
            l->nresv > 0 ? bsearch(&key, l->resv, l->nresv, sizeof(srv_resv_t), resv_cmp) : NULL;
        mine[i] = (srv_resv_t){.slot = KVT_TIER_SLOT_NONE};
        if (r != NULL && r->slot != KVT_TIER_SLOT_NONE) {
            mine[i] = *r;
            r->slot = KVT_TIER_SLOT_NONE; /* taken: compacted below */
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < l->nresv; i++)
        if (l->resv[i].slot != KVT_TIER_SLOT_NONE)
            l->resv[kept++] = l->resv[i];
    l->nresv = kept;
    pthread_mutex_unlock(&xf->mu);
    /* outside the lock: the landed bytes must match the sender's sums */
    uint32_t ngood = 0, nbad = 0;
    uint64_t *bad = good + cap;
    for (uint32_t i = 0; i < c.n; i++) {
        visible[i] = 0;
        if (mine[i].slot == KVT_TIER_SLOT_NONE)
            continue;
        bool ok = landed[i].ok && XXH3_64bits(kvt_tier_slot_ptr(xf->tier, mine[i].slot),
                                              mine[i].len) == landed[i].sum;
        if (landed[i].ok && !ok)
            atomic_fetch_add_explicit(&xf->commit_bad_sum, 1, memory_order_relaxed);
        if (ok) {
            glens[ngood] = mine[i].len;
            gsum[ngood] = landed[i].sum;
            good[ngood++] = mine[i].key;
            visible[i] = 1;
        } else {
            bad[nbad++] = mine[i].key;
        }
    }
    kvt_status_t st = KVT_OK;
    size_t done = 0;
    if (ngood > 0)
        st = kvt_tier_commit_sums(xf->tier, l->sess, ns, ns_len, good, ngood, glens, gsum, &done);
    if (st == KVT_OK && done < ngood) {
        /* a reservation expired before its commit: that block is not visible here */
        for (uint32_t i = 0; i < c.n; i++)
            if (visible[i] && kvt_tier_lookup(xf->tier, ns, ns_len, &landed[i].key, 1, NULL) != 1)
                visible[i] = 0;
        ngood = (uint32_t)done;
    }
    if (nbad > 0)
        kvt_tier_commit(xf->tier, l->sess, ns, ns_len, bad, nbad, NULL, false, NULL);
    if (st != KVT_OK) {
        error(res, kvt_proto_http_status(st), st, "xfer_commit: a length is above --block-bytes");
        goto out;
    }
    atomic_fetch_add_explicit(&xf->committed, ngood, memory_order_relaxed);
    kvt_proto_xfer_commit_ans_encode(rq->wr, rq->req_id, visible, c.n);
    frames(res);
out:
    if (l != NULL)
        srv_lease_put(l);
    free(landed);
    free(mine);
    free(good);
    free(glens);
    free(visible);
}
