/*
 * server/xfer_push.c: TRANSFER, push: the xfer thread pins the keys here
 * (a tier session of its own), reserves slots at the peer (XFER_RESERVE),
 * writes the blocks into them over UCX in one PUT batch and has the peer
 * check each against the sum recorded here when the block was stored and
 * make the good ones visible (XFER_COMMIT); then the pins go. A streaming
 * push (KVT_PROTO_XFER_STREAM) does that in rounds: what its engine commits
 * here during the call goes in the next round, until every key went or the
 * call's time is up.
 */
#define KVT_LOG_COMPONENT "xfer"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "server/tier.h"
#include "server/xfer_peer.h"

/* How often a streaming push looks for blocks committed here since its last round. */
#define SRV_PUSH_POLL_MS 2u

/* A local pin, waited for: its callback may run on the tier's I/O thread. */
typedef struct pin_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    kvt_tier_pinned_t *out; /* the caller's, n entries */
} pin_wait_t;

static void pin_done(void *arg, const kvt_tier_pinned_t *out, size_t n)
{
    pin_wait_t *pw = arg;
    pthread_mutex_lock(&pw->mu);
    memcpy(pw->out, out, n * sizeof(*out));
    pw->done = true;
    pthread_cond_signal(&pw->cv);
    pthread_mutex_unlock(&pw->mu);
}

/* Pins @keys in @s, promoting from NVMe first; waits for it (the tier ends every read). */
static kvt_status_t pin_local(srv_xfer_t *xf, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                              const uint64_t *keys, uint32_t n, kvt_tier_pinned_t *out)
{
    pin_wait_t pw = {.out = out};
    pthread_mutex_init(&pw.mu, NULL);
    pthread_cond_init(&pw.cv, NULL);
    kvt_status_t st = kvt_tier_pin(xf->tier, s, ns, ns_len, keys, n, pin_done, &pw);
    pthread_mutex_lock(&pw.mu);
    while (st == KVT_OK && !pw.done)
        pthread_cond_wait(&pw.cv, &pw.mu);
    pthread_mutex_unlock(&pw.mu);
    pthread_cond_destroy(&pw.cv);
    pthread_mutex_destroy(&pw.mu);
    return st;
}

/* XFER_RESERVE of @keys at the peer under *@lease_p (0: a new lease, set here), with one
 * re-handshake on a stale incarnation or a failed endpoint (a lease of the old incarnation is
 * gone with it). On KVT_OK *@p_p, @slots[0..n) and *@a_p. */
static kvt_status_t reserve(srv_xfer_t *xf, const srv_xfer_call_t *xc, srv_xcli_t *c,
                            uint32_t timeout, const uint64_t *keys, const uint32_t *lens,
                            uint32_t n, srv_xpeer_t **p_p, uint64_t *lease_p, uint32_t *slots,
                            kvt_proto_xfer_slots_ans_t *a_p, char *err, size_t errlen)
{
    kvt_status_t st = KVT_ERR_PEER;
    for (int attempt = 0; attempt < 2; attempt++) {
        st = attempt == 0 ? srv_xpeer_get(xf, c, xc->peer, p_p, err, errlen)
                          : srv_xpeer_hello(xf, c, xc->peer, p_p, err, errlen);
        if (st != KVT_OK)
            return st;
        if (attempt == 1)
            *lease_p = 0;
        kvt_proto_xfer_keys_t k = {.incarnation = (*p_p)->inc,
                                   .lease = *lease_p,
                                   .model = {xc->model, (uint16_t)strlen(xc->model)},
                                   .lora = {xc->lora, (uint16_t)strlen(xc->lora)},
                                   .lease_ms = srv_xpeer_lease_ms(xf, timeout),
                                   .n = n};
        uint64_t id = ++c->next_id;
        kvt_proto_xfer_reserve_req_encode(&c->wr, id, &k, keys, lens);
        st = srv_xcli_call(c, KVT_PROTO_OP_XFER_RESERVE, id, err, errlen);
        if (st == KVT_OK && kvt_proto_xfer_reserve_ans_decode(c->body, c->len, slots, n, a_p, err,
                                                              errlen) != KVT_OK)
            return KVT_ERR_PEER;
        if (st == KVT_OK && a_p->n != n) {
            kvt_errf(err, errlen, "peer: xfer_reserve answered %u of %u keys", a_p->n, n);
            return KVT_ERR_PEER;
        }
        if (st == KVT_OK && a_p->lease != 0)
            *lease_p = a_p->lease;
        if (st != KVT_ERR_STALE)
            return st;
    }
    return st;
}

/* Scratch of a push: n entries each. */
typedef struct push_buf {
    kvt_tier_pinned_t *pins;
    uint64_t *keys;               /* pinned here, then written */
    uint32_t *lens, *slots, *idx; /* idx: into pins */
    kvt_xfer_iov_t *iov;
    kvt_status_t *est;
    kvt_proto_xfer_landed_t *landed;
    uint8_t *visible;
    uint64_t *cand; /* a round's keys held here, to pin */
    bool *held;
} push_buf_t;

static bool push_buf_init(push_buf_t *b, uint32_t n)
{
    b->pins = malloc(n * sizeof(*b->pins));
    b->keys = malloc(n * sizeof(*b->keys));
    b->lens = malloc(n * sizeof(*b->lens));
    b->slots = malloc(n * sizeof(*b->slots));
    b->idx = malloc(n * sizeof(*b->idx));
    b->iov = malloc(n * sizeof(*b->iov));
    b->est = malloc(n * sizeof(*b->est));
    b->landed = malloc(n * sizeof(*b->landed));
    b->visible = malloc(n);
    b->cand = malloc(n * sizeof(*b->cand));
    b->held = malloc(n * sizeof(*b->held));
    return b->pins && b->keys && b->lens && b->slots && b->idx && b->iov && b->est && b->landed &&
           b->visible && b->cand && b->held;
}

static void push_buf_cleanup(push_buf_t *b)
{
    free(b->pins);
    free(b->keys);
    free(b->lens);
    free(b->slots);
    free(b->idx);
    free(b->iov);
    free(b->est);
    free(b->landed);
    free(b->visible);
    free(b->cand);
    free(b->held);
}

/* One PUT batch of the reserved blocks, then XFER_COMMIT; sorts them into @r. */
static void put_commit(srv_xfer_t *xf, srv_xcli_t *c, srv_xpeer_t *p, push_buf_t *b, uint32_t ni,
                       uint64_t lease, uint32_t timeout, srv_xres_t *r, char *err, size_t errlen)
{
    srv_xpeer_batch(xf, p, KVT_XFER_PUT, b->iov, ni, b->est, timeout, c, lease,
                    srv_xpeer_lease_ms(xf, timeout), err, errlen);
    for (uint32_t j = 0; j < ni; j++)
        b->landed[j] = (kvt_proto_xfer_landed_t){
            .key = b->keys[j], .sum = b->pins[b->idx[j]].sum, .ok = b->est[j] == KVT_OK};
    kvt_proto_xfer_commit_t cm = {.incarnation = p->inc, .lease = lease, .n = ni};
    uint64_t id = ++c->next_id;
    kvt_proto_xfer_commit_req_encode(&c->wr, id, &cm, b->landed);
    uint32_t nv = 0;
    kvt_status_t st = srv_xcli_call(c, KVT_PROTO_OP_XFER_COMMIT, id, err, errlen);
    if (st == KVT_OK && (kvt_proto_xfer_commit_ans_decode(c->body, c->len, b->visible, ni, &nv, err,
                                                          errlen) != KVT_OK ||
                         nv != ni))
        st = KVT_ERR_PEER;
    for (uint32_t j = 0; j < ni; j++) {
        uint8_t why = 0;
        if (b->est[j] != KVT_OK)
            why = srv_xfer_reason(b->est[j]);
        else if (st != KVT_OK)
            why = srv_xfer_reason(st); /* what the peer made visible is unknown: not counted */
        else if (!b->visible[j])
            why = KVT_PROTO_XFER_FAIL_CHECKSUM;
        if (why != 0) {
            r->failed[r->nf++] = (kvt_proto_xfer_failed_t){b->keys[j], why};
        } else {
            r->transferred[r->nt++] = b->keys[j];
            r->bytes += b->lens[j];
        }
    }
}

/* A push's state across its rounds. */
typedef struct push {
    srv_xcli_t c;      /* the RPC connection to the peer, opened with the first round */
    srv_xpeer_t *p;    /* the peer, from the last reserve */
    uint64_t lease;    /* the peer's lease over every round's reservations; 0: none yet */
    uint64_t renew_at; /* when the peer's lease is renewed next, while waiting */
    bool down;         /* the peer failed: later rounds fail at once */
    kvt_status_t down_st;
} push_t;

/*
 * One round: the @np blocks pinned here (b->keys, b->lens, b->idx into
 * b->pins) go to the peer: XFER_RESERVE (the peer's lease, one re-handshake
 * on a stale incarnation), one PUT batch, XFER_COMMIT with the recorded sums.
 */
static void push_round(srv_xfer_t *xf, const srv_xfer_call_t *xc, push_t *ps, push_buf_t *b,
                       uint32_t np, uint32_t timeout, srv_xres_t *r, char *err, size_t errlen)
{
    kvt_status_t st = ps->down ? ps->down_st : KVT_OK;
    if (st == KVT_OK && ps->c.fd < 0)
        st = srv_xcli_open(xf, &ps->c, xc->peer, timeout, err, errlen);
    kvt_proto_xfer_slots_ans_t a = {0};
    if (st == KVT_OK)
        st = reserve(xf, xc, &ps->c, timeout, b->keys, b->lens, np, &ps->p, &ps->lease, b->slots,
                     &a, err, errlen);
    if (st != KVT_OK) {
        /* a refused request fails these keys; a peer that is gone fails the later rounds too */
        if (st != KVT_ERR_INVAL) {
            ps->down = true;
            ps->down_st = st;
        }
        srv_xres_fail(r, b->keys, np,
                      st == KVT_ERR_INVAL ? KVT_PROTO_XFER_FAIL_ERROR : srv_xfer_reason(st));
        return;
    }
    srv_xpeer_t *p = ps->p;
    uint32_t ni = 0;
    for (uint32_t j = 0; j < np; j++) {
        const kvt_tier_pinned_t *pin = &b->pins[b->idx[j]];
        uint32_t slot = b->slots[j];
        if (slot == KVT_PROTO_XFER_SLOT_HELD) {
            r->transferred[r->nt++] = b->keys[j]; /* there already: nothing to move */
            continue;
        }
        if (slot == KVT_PROTO_SLOT_NONE || slot >= p->nslots || pin->len > p->slot_bytes) {
            r->failed[r->nf++] = (kvt_proto_xfer_failed_t){
                b->keys[j], slot == KVT_PROTO_SLOT_NONE ? KVT_PROTO_XFER_FAIL_NO_ROOM
                                                        : KVT_PROTO_XFER_FAIL_ERROR};
            continue;
        }
        b->iov[ni] = (kvt_xfer_iov_t){.remote_off = (uint64_t)slot * p->slot_bytes,
                                      .local = kvt_tier_slot_ptr(xf->tier, pin->slot),
                                      .len = pin->len};
        b->idx[ni] = b->idx[j];
        b->lens[ni] = b->lens[j];
        b->keys[ni++] = b->keys[j];
    }
    if (ni > 0)
        put_commit(xf, &ps->c, p, b, ni, ps->lease, timeout, r, err, errlen);
    if (kvt_xfer_peer_failed(p->p, NULL)) {
        srv_xpeer_drop(xf, p);
        ps->p = NULL;
        ps->down = true;
        ps->down_st = KVT_ERR_PEER;
    }
}

/*
 * The steps: pin here what is held (the rest is missing); push those in one
 * round; with xc->stream, pin again every few milliseconds until the
 * deadline and push what was committed here since, round after round, the
 * peer's lease renewed meanwhile; then XFER_RELEASE of that lease, and the
 * pins here go with the session.
 */
void srv_xfer_push(srv_xfer_t *xf, const srv_xfer_call_t *xc, srv_xres_t *r, char *err,
                   size_t errlen)
{
    uint32_t n = xc->n;
    uint32_t timeout = xc->timeout_ms != 0 ? xc->timeout_ms : 30000;
    uint64_t deadline = kvt_clock_ms() + timeout;
    push_buf_t b = {0};
    push_t ps = {0};
    srv_xcli_init(xf, &ps.c, timeout);
    kvt_tier_sess_t *s = kvt_tier_sess_open(xf->tier);
    uint64_t *want = malloc(n * sizeof(*want)); /* keys not held here yet */
    char ns[KVT_TIER_NS_MAX];
    size_t ns_len = srv_tier_ns(xc->model, strlen(xc->model), xc->lora, strlen(xc->lora), false, ns);
    if (s == NULL || want == NULL || !push_buf_init(&b, n)) {
        srv_xres_fail(r, xc->keys, n, KVT_PROTO_XFER_FAIL_ERROR);
        kvt_errf(err, errlen, "out of memory");
        goto out;
    }
    /* the pins are read by UCX until the last batch ends: they must outlive it */
    kvt_tier_sess_renew(xf->tier, s, timeout + 2000u);
    memcpy(want, xc->keys, n * sizeof(*want));
    uint32_t nwant = n, lease_ms = srv_xpeer_lease_ms(xf, timeout);
    for (;;) {
        /* what is committed here now gets pinned; looking is not an access (a stream polls) */
        uint32_t nc = 0, left = 0, np = 0;
        kvt_tier_held(xf->tier, ns, ns_len, want, nwant, b.held);
        for (uint32_t i = 0; i < nwant; i++) {
            if (b.held[i])
                b.cand[nc++] = want[i];
            else
                want[left++] = want[i];
        }
        nwant = left;
        if (nc > 0 && pin_local(xf, s, ns, ns_len, b.cand, nc, b.pins) != KVT_OK) {
            srv_xres_fail(r, b.cand, nc, KVT_PROTO_XFER_FAIL_ERROR);
            break;
        }
        for (uint32_t i = 0; i < nc; i++) {
            if (b.pins[i].slot == KVT_TIER_SLOT_NONE || b.pins[i].len == 0) {
                want[nwant++] = b.cand[i]; /* gone between the look and the pin */
                continue;
            }
            b.idx[np] = i;
            b.lens[np] = b.pins[i].len;
            b.keys[np++] = b.cand[i];
        }
        if (np > 0) {
            push_round(xf, xc, &ps, &b, np, timeout, r, err, errlen);
            ps.renew_at = kvt_clock_ms() + lease_ms / 3;
        }
        uint64_t now = kvt_clock_ms();
        if (!xc->stream || nwant == 0 || now >= deadline)
            break;
        /* the engine is still committing: look again soon */
        uint64_t wait = deadline - now < SRV_PUSH_POLL_MS ? deadline - now : SRV_PUSH_POLL_MS;
        srv_xpeer_idle(xf, &ps.c, ps.p, ps.lease, lease_ms, &ps.renew_at, (uint32_t)wait);
    }
    for (uint32_t i = 0; i < nwant; i++)
        r->missing[r->nm++] = want[i];
    if (ps.p != NULL)
        srv_xpeer_release(&ps.c, ps.p, ps.lease); /* when the RPC is gone, it expires there */
out:
    if (s != NULL)
        kvt_tier_sess_close(xf->tier, s); /* the pins here go */
    srv_xcli_close(&ps.c);
    push_buf_cleanup(&b);
    free(want);
}
