/*
 * server/xfer_pull.c: TRANSFER: the RPC handler hands the job to the xfer
 * thread, which runs a push (xfer_push.c) or a pull: it pins the keys at the
 * peer, reads them over UCX into slots reserved here, checks each block
 * against the sum the peer recorded when the block was stored, and commits
 * the good ones (the tier's changes index and publish them).
 */
#define KVT_LOG_COMPONENT "xfer"

#include "server/xfer_pull.h"

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/log.h"
#include "server/mailbox.h"
#include "server/tier.h"
#include "server/xfer_peer.h"

/* Moves the keys of r->transferred that this sidecar does not hold to r->failed ("error"). */
static void recheck(srv_xfer_t *xf, const char *ns, size_t ns_len, srv_xres_t *r)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < r->nt; i++) {
        if (kvt_tier_lookup(xf->tier, ns, ns_len, &r->transferred[i], 1, NULL) == 1)
            r->transferred[kept++] = r->transferred[i];
        else
            r->failed[r->nf++] =
                (kvt_proto_xfer_failed_t){r->transferred[i], KVT_PROTO_XFER_FAIL_ERROR};
    }
    r->nt = kept;
}

/*
 * The pull of @xc's keys from its peer into @r. The steps: a connection and
 * RPC HELLO; XFER_PIN (one re-handshake on a stale incarnation or a failed
 * endpoint); local reservations; one GET batch; sums; commit; XFER_RELEASE.
 */
static void pull(srv_xfer_t *xf, const srv_xfer_call_t *xc, srv_xres_t *r, char *err, size_t errlen)
{
    uint32_t n = xc->n;
    uint32_t timeout = xc->timeout_ms != 0 ? xc->timeout_ms : 30000;
    srv_xcli_t c;
    kvt_status_t st = srv_xcli_open(xf, &c, xc->peer, timeout, err, errlen);
    if (st != KVT_OK) {
        srv_xres_fail(r, xc->keys, n, srv_xfer_reason(st));
        srv_xcli_close(&c);
        return;
    }
    uint64_t id;
    kvt_proto_xfer_pinned_t *pins = malloc(n * sizeof(*pins));
    uint32_t *slots = malloc(n * sizeof(uint32_t));
    uint32_t *lens = malloc(n * sizeof(uint32_t));
    uint64_t *pkeys = malloc(2 * n * sizeof(uint64_t));
    uint32_t *pidx = malloc(n * sizeof(uint32_t));
    kvt_xfer_iov_t *iov = malloc(n * sizeof(*iov));
    kvt_status_t *est = malloc(n * sizeof(*est));
    kvt_tier_sess_t *s = kvt_tier_sess_open(xf->tier);
    kvt_proto_xfer_slots_ans_t pa = {0};
    srv_xpeer_t *p = NULL;
    if (!pins || !slots || !lens || !pkeys || !pidx || !iov || !est || !s) {
        srv_xres_fail(r, xc->keys, n, KVT_PROTO_XFER_FAIL_ERROR);
        kvt_errf(err, errlen, "out of memory");
        goto out;
    }
    st = KVT_ERR_PEER;
    for (int attempt = 0; attempt < 2; attempt++) {
        st = attempt == 0 ? srv_xpeer_get(xf, &c, xc->peer, &p, err, errlen)
                          : srv_xpeer_hello(xf, &c, xc->peer, &p, err, errlen);
        if (st != KVT_OK)
            break;
        kvt_proto_xfer_keys_t k = {.incarnation = p->inc,
                                   .model = {xc->model, (uint16_t)strlen(xc->model)},
                                   .lora = {xc->lora, (uint16_t)strlen(xc->lora)},
                                   .lease_ms = srv_xpeer_lease_ms(xf, timeout),
                                   .n = n};
        id = ++c.next_id;
        kvt_proto_xfer_pin_req_encode(&c.wr, id, &k, xc->keys);
        st = srv_xcli_call(&c, KVT_PROTO_OP_XFER_PIN, id, err, errlen);
        if (st == KVT_OK)
            st = kvt_proto_xfer_pin_ans_decode(c.body, c.len, pins, n, &pa, err, errlen);
        if (st != KVT_ERR_STALE)
            break;
        p = NULL; /* the peer restarted: one more handshake */
    }
    if (st != KVT_OK || pa.n != n) {
        srv_xres_fail(r, xc->keys, n,
                      st == KVT_OK || st == KVT_ERR_INVAL ? KVT_PROTO_XFER_FAIL_PEER_DOWN
                                                          : srv_xfer_reason(st));
        goto out;
    }
    /* what the peer holds, checked against its arena and ours */
    uint32_t np = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (pins[i].slot == KVT_PROTO_SLOT_NONE) {
            r->missing[r->nm++] = xc->keys[i];
        } else if (pins[i].slot >= p->nslots || pins[i].len > p->slot_bytes ||
                   pins[i].len > xf->block_bytes) {
            r->failed[r->nf++] = (kvt_proto_xfer_failed_t){xc->keys[i], KVT_PROTO_XFER_FAIL_ERROR};
        } else {
            pidx[np] = i;
            pkeys[np++] = xc->keys[i];
        }
    }
    char ns[KVT_TIER_NS_MAX];
    size_t ns_len = srv_tier_ns(xc->model, strlen(xc->model), xc->lora, strlen(xc->lora), false, ns);
    size_t nev = 0;
    if (np > 0 &&
        kvt_tier_reserve(xf->tier, s, ns, ns_len, pkeys, np, slots, NULL, 0, &nev) != KVT_OK) {
        srv_xres_fail(r, pkeys, np, KVT_PROTO_XFER_FAIL_ERROR);
        np = 0;
    }
    /* the reservations are written by UCX until the batch ends: they must outlive it (a slot
     * whose reservation expired could be given to another block meanwhile) */
    kvt_tier_sess_renew(xf->tier, s, timeout + 2000u);
    uint32_t ni = 0;
    for (uint32_t j = 0; j < np; j++) {
        const kvt_proto_xfer_pinned_t *pin = &pins[pidx[j]];
        if (slots[j] == KVT_TIER_SLOT_NONE) {
            if (kvt_tier_lookup(xf->tier, ns, ns_len, &pkeys[j], 1, NULL) == 1)
                r->transferred[r->nt++] = pkeys[j]; /* here already */
            else
                r->failed[r->nf++] =
                    (kvt_proto_xfer_failed_t){pkeys[j], KVT_PROTO_XFER_FAIL_NO_ROOM};
            continue;
        }
        iov[ni] = (kvt_xfer_iov_t){.remote_off = (uint64_t)pin->slot * p->slot_bytes,
                                   .local = kvt_tier_slot_ptr(xf->tier, slots[j]),
                                   .len = pin->len};
        pidx[ni] = pidx[j];
        slots[ni] = slots[j];
        pkeys[ni++] = pkeys[j];
    }
    if (ni > 0) {
        srv_xpeer_batch(xf, p, KVT_XFER_GET, iov, ni, est, timeout, &c, pa.lease,
                        srv_xpeer_lease_ms(xf, timeout), err, errlen);
        /* check each landed block against the source's sum; commit the good ones with it */
        uint64_t *bad = pkeys + n;
        uint64_t *gsum = malloc(ni * sizeof(*gsum));
        uint32_t ngood = 0, nbad = 0;
        for (uint32_t j = 0; j < ni; j++) {
            const kvt_proto_xfer_pinned_t *pin = &pins[pidx[j]];
            uint8_t why = 0;
            if (est[j] != KVT_OK)
                why = srv_xfer_reason(est[j]);
            else if (XXH3_64bits(iov[j].local, pin->len) != pin->sum)
                why = KVT_PROTO_XFER_FAIL_CHECKSUM;
            if (why != 0) {
                bad[nbad++] = pkeys[j];
                r->failed[r->nf++] = (kvt_proto_xfer_failed_t){pkeys[j], why};
            } else {
                if (gsum != NULL)
                    gsum[ngood] = pin->sum;
                lens[ngood] = pin->len;
                r->bytes += pin->len;
                pkeys[ngood] = pkeys[j];
                r->transferred[r->nt++] = pkeys[ngood++];
            }
        }
        size_t done = 0;
        if (ngood > 0 && gsum != NULL) /* the sums were just checked: no second hash */
            kvt_tier_commit_sums(xf->tier, s, ns, ns_len, pkeys, ngood, lens, gsum, &done);
        else if (ngood > 0)
            kvt_tier_commit(xf->tier, s, ns, ns_len, pkeys, ngood, lens, true, &done);
        free(gsum);
        if (done < ngood) /* a reservation was lost (expired): those blocks are not here */
            recheck(xf, ns, ns_len, r);
        if (nbad > 0)
            kvt_tier_commit(xf->tier, s, ns, ns_len, bad, nbad, NULL, false, NULL);
    }
    srv_xpeer_release(&c, p, pa.lease); /* when the RPC is gone, the lease expires there */
    if (kvt_xfer_peer_failed(p->p, NULL))
        srv_xpeer_drop(xf, p);
out:
    if (s != NULL)
        kvt_tier_sess_close(xf->tier, s);
    srv_xcli_close(&c);
    free(pins);
    free(slots);
    free(lens);
    free(pkeys);
    free(pidx);
    free(iov);
    free(est);
}

void srv_xfer_pull_run(srv_xfer_t *xf, srv_job_t *job)
{
    srv_xfer_call_t *xc = job->xc;
    uint64_t t0 = kvt_clock_ns();
    srv_xres_t r = {.transferred = malloc(xc->n * sizeof(uint64_t)),
                    .missing = malloc(xc->n * sizeof(uint64_t)),
                    .failed = malloc(xc->n * sizeof(kvt_proto_xfer_failed_t))};
    char err[320] = "";
    if (r.transferred == NULL || r.missing == NULL || r.failed == NULL) {
        srv_xjob_error(job, KVT_ERR_NO_MEM, 503, "out of memory");
    } else {
        bool push = xc->direction == KVT_PROTO_XFER_PUSH;
        if (push)
            srv_xfer_push(xf, xc, &r, err, sizeof(err));
        else
            pull(xf, xc, &r, err, sizeof(err));
        if (r.nf > 0)
            kvt_log_info("transfer %s %s: %u of %u keys failed (%s)", push ? "to" : "from",
                         xc->peer, r.nf, xc->n,
                         err[0] ? err : kvt_proto_xfer_reason_name(r.failed[0].reason));
        atomic_fetch_add_explicit(&xf->transfers, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&xf->transferred, r.nt, memory_order_relaxed);
        atomic_fetch_add_explicit(&xf->missing, r.nm, memory_order_relaxed);
        atomic_fetch_add_explicit(&xf->failed, r.nf, memory_order_relaxed);
        atomic_fetch_add_explicit(&xf->bytes, r.bytes, memory_order_relaxed);
        kvt_proto_transfer_ans_t a = {.bytes = r.bytes,
                                      .ns = kvt_clock_ns() - t0,
                                      .ntransferred = r.nt,
                                      .nmissing = r.nm,
                                      .nfailed = r.nf,
                                      .transferred = r.transferred,
                                      .missing = r.missing,
                                      .failed = r.failed};
        srv_xfer_answer(job, &a);
    }
    free(r.transferred);
    free(r.missing);
    free(r.failed);
}

void srv_xfer_start_job(srv_job_t *job)
{
    kvt_jbuf_init(&job->answer);
    srv_xfer_t *xf = job->worker->srv->xfer;
    if (srv_mbox_post(&xf->inbox, job) != KVT_OK) {
        srv_xjob_error(job, KVT_ERR_LIMIT, 503, "too many transfers waiting, or stopping");
        srv_xjob_post(job);
    }
}

void srv_h_transfer(srv_req_t *rq, srv_result_t *res)
{
    if (srv_xfer_or_error(rq, res) == NULL)
        return;
    size_t cap = rq->len / 8 + 1;
    srv_job_t *job = calloc(1, sizeof(*job));
    srv_xfer_call_t *xc = calloc(1, sizeof(*xc));
    uint64_t *keys = malloc(cap * sizeof(uint64_t));
    kvt_proto_transfer_req_t t;
    kvt_status_t st = KVT_ERR_NO_MEM;
    if (job != NULL && xc != NULL && keys != NULL)
        st = kvt_proto_transfer_req_decode(rq->body, rq->len, keys, (uint32_t)cap, &t, rq->err,
                                           rq->errlen);
    else
        kvt_errf(rq->err, rq->errlen, "out of memory");
    if (st != KVT_OK) {
        free(job);
        free(xc);
        free(keys);
        *res = (srv_result_t){
            .out = OUT_ERROR, .status = kvt_proto_http_status(st), .st = st, .msg = rq->err};
        return;
    }
    memcpy(xc->peer, t.peer.p, t.peer.len);
    memcpy(xc->model, t.model.p, t.model.len);
    memcpy(xc->lora, t.lora.p, t.lora.len);
    xc->direction = t.direction;
    xc->stream = (t.flags & KVT_PROTO_XFER_STREAM) != 0;
    xc->timeout_ms = t.timeout_ms;
    xc->keys = keys;
    xc->n = t.n;
    srv_xfer_accept(rq, res, job, xc);
}

void srv_xfer_accept(srv_req_t *rq, srv_result_t *res, srv_job_t *job, srv_xfer_call_t *xc)
{
    job->kind = JOB_TIER;
    job->worker = rq->w;
    job->xc = xc;
    *res = (srv_result_t){.out = OUT_ASYNC, .status = 200, .job = job, .start = srv_xfer_start_job};
}
