/*
 * transfer/xfer_io.c: batches. Submit checks every entry, then the pump posts
 * entries (ucp_get_nbx / ucp_put_nbx, then one ucp_ep_flush_nbx for a PUT
 * batch) while fewer than max_inflight are in UCX; UCX's completions only
 * count down and move a finished batch to the done list, and the callbacks
 * fire from there at a point where the caller may submit again.
 */
#define KVT_LOG_COMPONENT "transfer"

#include <poll.h>
#include <string.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/log.h"
#include "transfer/xfer_int.h"

/* ucp_worker_progress() calls per kvt_xfer_progress() at most, so deadlines are checked
 * under a steady stream of completions too. */
#define XFER_PROGRESS_ROUNDS 64

kvt_status_t xfer_status_from_ucs(const xfer_batch_t *b, ucs_status_t s)
{
    if (s == UCS_OK)
        return KVT_OK;
    if (b->timed_out)
        return KVT_ERR_TIMEOUT;
    if (b->peer != NULL && b->peer->ucx_failed)
        return KVT_ERR_PEER;
    switch (s) {
    case UCS_ERR_CANCELED: return KVT_ERR_CLOSED;
    case UCS_ERR_NO_MEMORY: return KVT_ERR_NO_MEM;
    case UCS_ERR_INVALID_PARAM: return KVT_ERR_INVAL;
    default: return KVT_ERR_PEER;
    }
}

/* The status of entries that can no longer be posted to @b's peer. */
static kvt_status_t lost_status(const xfer_batch_t *b)
{
    if (b->timed_out)
        return KVT_ERR_TIMEOUT;
    if (b->peer != NULL && b->peer->ucx_failed)
        return KVT_ERR_PEER;
    return KVT_ERR_CLOSED;
}

static void fail_entry(xfer_batch_t *b, uint32_t i, kvt_status_t st)
{
    if (b->status != NULL)
        b->status[i] = st;
    if (b->st == KVT_OK)
        b->st = st;
}

/* Moves @b to the done list once nothing of it is left to post or to complete. */
static void maybe_finish(xfer_batch_t *b)
{
    if (b->finished || b->next < b->n || b->outstanding != 0)
        return;
    if (b->op == KVT_XFER_PUT && !b->flush_posted && !b->timed_out && b->peer != NULL &&
        b->peer->ep != NULL && !b->peer->failed)
        return; /* the pump posts the flush */
    if (b->op == KVT_XFER_PUT && !b->flush_ok) {
        /* Without a flush, bytes that left here may not be at the peer. */
        kvt_status_t st = b->st != KVT_OK ? b->st : lost_status(b);
        b->st = st;
        if (b->status != NULL)
            for (uint32_t i = 0; i < b->n; i++)
                if (b->status[i] == KVT_OK)
                    b->status[i] = st;
    }
    b->finished = true;
    xfer_list_del(&b->link);
    xfer_list_push(&b->x->done, &b->link);
}

static void req_done(xfer_req_t *r, ucs_status_t s)
{
    xfer_batch_t *b = r->batch;
    kvt_xfer_t *x = b->x;
    kvt_status_t st = xfer_status_from_ucs(b, s);
    if (r->idx == XFER_FLUSH) {
        b->flush_ok = st == KVT_OK;
        if (st != KVT_OK && b->st == KVT_OK)
            b->st = st;
    } else {
        x->inflight--;
        if (st == KVT_OK) {
            if (b->status != NULL)
                b->status[r->idx] = KVT_OK;
        } else {
            fail_entry(b, r->idx, st);
        }
    }
    b->outstanding--;
    if (b->peer != NULL)
        b->peer->outstanding--;
    r->next_free = x->free_reqs;
    x->free_reqs = r;
    maybe_finish(b);
}

/* UCX's completion of a request: runs inside ucp_worker_progress() or a force close. */
static void send_cb(void *request, ucs_status_t s, void *user_data)
{
    req_done(user_data, s);
    ucp_request_free(request);
}

/* Posts entry @b->next (or the flush when @flush); takes a request context from the pool. */
static void post(xfer_batch_t *b, bool flush)
{
    kvt_xfer_t *x = b->x;
    kvt_xfer_peer_t *peer = b->peer;
    xfer_req_t *r = x->free_reqs;
    x->free_reqs = r->next_free;
    r->batch = b;
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = send_cb,
        .user_data = r,
    };
    b->outstanding++;
    peer->outstanding++;
    ucs_status_ptr_t sp;
    if (flush) {
        r->idx = XFER_FLUSH;
        b->flush_posted = true;
        sp = ucp_ep_flush_nbx(peer->ep, &p);
    } else {
        const kvt_xfer_iov_t *v = &b->iov[b->next];
        r->idx = b->next++;
        x->inflight++;
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p.memh = x->memh;
        uint64_t raddr = peer->remote_base + v->remote_off;
        if (b->op == KVT_XFER_GET)
            sp = ucp_get_nbx(peer->ep, v->local, v->len, raddr, peer->rkey, &p);
        else
            sp = ucp_put_nbx(peer->ep, v->local, v->len, raddr, peer->rkey, &p);
    }
    if (sp == NULL)
        req_done(r, UCS_OK);
    else if (UCS_PTR_IS_ERR(sp))
        req_done(r, UCS_PTR_STATUS(sp));
    /* else UCX calls send_cb later */
}

/* Pumps one batch: false when it must wait for request contexts. */
static bool pump_batch(xfer_batch_t *b)
{
    kvt_xfer_t *x = b->x;
    kvt_xfer_peer_t *peer = b->peer;
    bool usable = peer != NULL && peer->ep != NULL && !peer->failed && !b->timed_out;
    if (!usable) {
        kvt_status_t st = lost_status(b);
        while (b->next < b->n)
            fail_entry(b, b->next++, st);
    }
    while (b->next < b->n) {
        if (x->inflight >= x->opts.max_inflight)
            return false;
        post(b, false);
        if (peer->failed) /* an immediate error can mark it failed */
            return pump_batch(b);
    }
    xfer_list_del(&b->wait_link);
    if (b->op == KVT_XFER_PUT && !b->flush_posted && usable && !peer->failed)
        post(b, true); /* covers every operation posted on the endpoint before it */
    maybe_finish(b);
    return true;
}

void xfer_pump(kvt_xfer_t *x)
{
    bool room = true;
    xfer_link_t *l = x->waiting.next;
    while (l != &x->waiting) {
        xfer_batch_t *b = XFER_CONTAINER(l, xfer_batch_t, wait_link);
        l = l->next;
        kvt_xfer_peer_t *peer = b->peer;
        bool dead = peer == NULL || peer->ep == NULL || peer->failed || b->timed_out;
        if (room || dead) /* in submit order; dead batches fail without waiting */
            room = pump_batch(b) && room;
    }
}

unsigned xfer_deliver(kvt_xfer_t *x)
{
    unsigned n = 0;
    while (!xfer_list_empty(&x->done)) {
        xfer_batch_t *b = XFER_CONTAINER(x->done.next, xfer_batch_t, link);
        xfer_list_del(&b->link);
        if (b->peer != NULL)
            xfer_list_del(&b->peer_link);
        kvt_xfer_cb_t cb = b->cb;
        void *arg = b->arg;
        kvt_status_t st = b->st;
        b->next_free = x->free_batches;
        x->free_batches = b;
        x->nbatches--;
        cb(arg, st);
        n++;
    }
    return n;
}

/* Fails the batches past their deadline: entries still waiting at once, those in UCX by
 * force-closing the endpoint (UCX cannot cancel an RMA operation otherwise). */
static unsigned expire(kvt_xfer_t *x)
{
    unsigned n = 0;
    uint64_t now = 0;
    xfer_link_t *l = x->active.next;
    while (l != &x->active) {
        xfer_batch_t *b = XFER_CONTAINER(l, xfer_batch_t, link);
        l = l->next;
        if (now == 0)
            now = kvt_clock_ns();
        if (b->timed_out || now < b->deadline_ns)
            continue;
        b->timed_out = true;
        if (b->st == KVT_OK)
            b->st = KVT_ERR_TIMEOUT;
        n++;
        kvt_log_warn("transfer batch of %u entries timed out (%u posted, %u in flight)", b->n,
                     b->next, b->outstanding);
        if (b->outstanding != 0 && b->peer != NULL && b->peer->ep != NULL) {
            xfer_peer_abort(b->peer, "a transfer timed out");
            l = x->active.next; /* the abort finished batches: walk again */
        } else {
            xfer_pump(x);
            maybe_finish(b);
            l = x->active.next;
        }
    }
    return n;
}

unsigned kvt_xfer_progress(kvt_xfer_t *x)
{
    unsigned n = 0, k;
    for (int round = 0; round < XFER_PROGRESS_ROUNDS; round++) {
        if ((k = ucp_worker_progress(x->worker)) == 0)
            break;
        n += k;
    }
    if (!xfer_list_empty(&x->active))
        n += expire(x);
    if (!xfer_list_empty(&x->waiting))
        xfer_pump(x);
    return n + xfer_deliver(x);
}

void kvt_xfer_wait(kvt_xfer_t *x, int timeout_ms)
{
    int dl = kvt_xfer_next_deadline_ms(x);
    if (dl >= 0 && (timeout_ms < 0 || dl < timeout_ms))
        timeout_ms = dl;
    if (x->efd < 0) {
        poll(NULL, 0, timeout_ms < 0 || timeout_ms > 10 ? 10 : timeout_ms);
        return;
    }
    if (!kvt_xfer_arm(x))
        return; /* events pending */
    struct pollfd pf = {.fd = x->efd, .events = POLLIN};
    poll(&pf, 1, timeout_ms);
}

int kvt_xfer_next_deadline_ms(const kvt_xfer_t *x)
{
    if (xfer_list_empty(&x->active))
        return -1;
    uint64_t first = UINT64_MAX;
    for (const xfer_link_t *l = x->active.next; l != &x->active; l = l->next) {
        const xfer_batch_t *b = XFER_CONTAINER(l, xfer_batch_t, link);
        if (!b->timed_out && b->deadline_ns < first)
            first = b->deadline_ns;
    }
    if (first == UINT64_MAX)
        return 0; /* timed out, waiting for UCX: keep progressing */
    uint64_t now = kvt_clock_ns();
    if (first <= now)
        return 0;
    uint64_t ms = (first - now + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

uint32_t kvt_xfer_batches_inflight(const kvt_xfer_t *x)
{
    return x->nbatches;
}

/* Checks entry @i of a batch against both regions. */
static kvt_status_t check_iov(const kvt_xfer_t *x, const kvt_xfer_peer_t *peer,
                              const kvt_xfer_iov_t *v, uint32_t i, char *err, size_t errlen)
{
    if (v->len == 0 || v->local == NULL) {
        kvt_errf(err, errlen, "transfer: iov[%u]: %s", i,
                 v->len == 0 ? "length 0" : "local pointer NULL");
        return KVT_ERR_INVAL;
    }
    if (v->remote_off >= peer->remote_len || v->len > peer->remote_len - v->remote_off) {
        kvt_errf(err, errlen,
                 "transfer: iov[%u]: remote [%llu, +%llu) is outside the peer's region of %llu "
                 "bytes",
                 i, (unsigned long long)v->remote_off, (unsigned long long)v->len,
                 (unsigned long long)peer->remote_len);
        return KVT_ERR_RANGE;
    }
    uintptr_t p = (uintptr_t)v->local, base = (uintptr_t)x->base;
    if (p < base || p - base >= x->len || v->len > x->len - (p - base)) {
        kvt_errf(err, errlen,
                 "transfer: iov[%u]: local %p +%llu is outside the registered region %p +%zu", i,
                 v->local, (unsigned long long)v->len, (void *)x->base, x->len);
        return KVT_ERR_RANGE;
    }
    return KVT_OK;
}

/* A mapped peer's batch: every entry copied now; the callback fires from the next progress. */
static void copy_batch(xfer_batch_t *b)
{
    uint8_t *map = b->peer->map;
    for (uint32_t i = 0; i < b->n; i++) {
        const kvt_xfer_iov_t *v = &b->iov[i];
        if (b->op == KVT_XFER_GET)
            memcpy(v->local, map + v->remote_off, v->len);
        else
            memcpy(map + v->remote_off, v->local, v->len);
        if (b->status != NULL)
            b->status[i] = KVT_OK;
    }
    b->next = b->n;
    b->flush_posted = b->flush_ok = true;
    xfer_list_init(&b->wait_link);
    maybe_finish(b);
}

kvt_status_t kvt_xfer_submit(kvt_xfer_peer_t *peer, kvt_xfer_op_t op, const kvt_xfer_iov_t *iov,
                             uint32_t n, kvt_status_t *status, uint32_t timeout_ms,
                             kvt_xfer_cb_t cb, void *arg, char *err, size_t errlen)
{
    kvt_xfer_t *x = peer->x;
    if ((op != KVT_XFER_GET && op != KVT_XFER_PUT) || cb == NULL || n == 0 || iov == NULL) {
        kvt_errf(err, errlen, "transfer: submit needs GET or PUT, a callback and entries");
        return KVT_ERR_INVAL;
    }
    if (x->memh == NULL) {
        kvt_errf(err, errlen, "transfer: no region registered");
        return KVT_ERR_INVAL;
    }
    if (peer->failed || (peer->ep == NULL && peer->map == NULL)) {
        kvt_errf(err, errlen, "transfer: peer failed: %s", peer->why ? peer->why : "closed");
        return KVT_ERR_PEER;
    }
    for (uint32_t i = 0; i < n; i++) {
        kvt_status_t st = check_iov(x, peer, &iov[i], i, err, errlen);
        if (st != KVT_OK)
            return st;
    }
    xfer_batch_t *b = x->free_batches;
    if (b == NULL) {
        kvt_errf(err, errlen, "transfer: %u batches in flight already", x->opts.max_batches);
        return KVT_ERR_LIMIT;
    }
    x->free_batches = b->next_free;
    x->nbatches++;
    memset(b, 0, sizeof(*b));
    b->x = x;
    b->peer = peer;
    b->iov = iov;
    b->status = status;
    b->n = n;
    b->op = op;
    b->cb = cb;
    b->arg = arg;
    b->deadline_ns =
        kvt_clock_ns() + (uint64_t)(timeout_ms != 0 ? timeout_ms : x->opts.timeout_ms) * 1000000u;
    xfer_list_push(&x->active, &b->link);
    xfer_list_push(&peer->batches, &b->peer_link);
    if (peer->map != NULL) {
        copy_batch(b);
        return KVT_OK;
    }
    xfer_list_push(&x->waiting, &b->wait_link);
    xfer_pump(x); /* posts now what fits behind earlier batches that wait for room */
    return KVT_OK;
}
