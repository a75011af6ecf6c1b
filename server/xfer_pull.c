/*
 * server/xfer_pull.c: TRANSFER, pull: the RPC handler hands the job to the
 * xfer thread, which pins the keys at the peer, reads them over UCX into
 * slots reserved here, checks each block against the peer's XXH3 and commits
 * the good ones (the tier's changes index and publish them).
 */
#define KVT_LOG_COMPONENT "xfer"

#include "server/xfer_pull.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/hostport.h"
#include "common/log.h"
#include "server/mailbox.h"
#include "server/tier.h"

/* ---- a small blocking RPC client to the peer ---------------------------------------- */

typedef struct cli {
    int fd;
    uint64_t next_id;
    kvt_proto_wr_t wr;
    uint8_t *body; /* the last answer's body (malloc'd) */
    uint32_t len;
    kvt_proto_err_t e; /* the last error answer */
} cli_t;

static bool io_all(int fd, void *buf, size_t n, bool wr)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = wr ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

/* Connects to "host:port" with @timeout_ms for the connection and each read or write. */
static kvt_status_t cli_open(cli_t *c, const char *peer, uint32_t timeout_ms, char *err,
                             size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    kvt_proto_wr_init(&c->wr);
    char host[256], port[8];
    uint16_t p;
    if (kvt_hostport_split(peer, host, sizeof(host), &p, false, err, errlen) != KVT_OK)
        return KVT_ERR_INVAL;
    snprintf(port, sizeof(port), "%u", p);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0) {
        kvt_errf(err, errlen, "peer %s: %s", peer, gai_strerror(gai));
        return KVT_ERR_PEER;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    for (struct addrinfo *a = ai; a != NULL && c->fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* connect() honours it */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            c->fd = fd;
        else
            close(fd);
    }
    freeaddrinfo(ai);
    if (c->fd < 0) {
        kvt_errf(err, errlen, "peer %s: cannot connect: %s", peer, strerror(errno));
        return KVT_ERR_PEER;
    }
    return KVT_OK;
}

static void cli_close(cli_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->body);
    c->body = NULL;
    kvt_proto_wr_cleanup(&c->wr);
}

/*
 * Sends the frame in c->wr and reads its answer into c->body/len: KVT_OK; the
 * peer's status for an error answer (c->e); KVT_ERR_PEER when the connection
 * fails or the answer is malformed.
 */
static kvt_status_t cli_call(cli_t *c, uint8_t op, uint64_t id, char *err, size_t errlen)
{
    free(c->body);
    c->body = NULL;
    c->len = 0;
    bool sent = !c->wr.oom && !c->wr.bad && io_all(c->fd, c->wr.buf, c->wr.len, true);
    kvt_proto_wr_reset(&c->wr);
    uint8_t hb[KVT_PROTO_HDR_SIZE];
    kvt_proto_hdr_t h;
    if (!sent || !io_all(c->fd, hb, sizeof(hb), false) ||
        kvt_proto_hdr_decode(hb, 64u << 20, &h) != KVT_OK || h.op != op || h.req_id != id) {
        kvt_errf(err, errlen, "peer: no answer to %s", kvt_proto_op_name(op));
        return KVT_ERR_PEER;
    }
    c->body = malloc(h.body_len > 0 ? h.body_len : 1);
    if (c->body == NULL || !io_all(c->fd, c->body, h.body_len, false)) {
        kvt_errf(err, errlen, "peer: %s answer cut", kvt_proto_op_name(op));
        return KVT_ERR_PEER;
    }
    c->len = h.body_len;
    if (h.flags & KVT_PROTO_F_ERROR) {
        if (kvt_proto_err_decode(c->body, c->len, &c->e, err, errlen) != KVT_OK)
            return KVT_ERR_PEER;
        kvt_errf(err, errlen, "peer: %s: %.*s", kvt_proto_op_name(op), (int)c->e.msg.len,
                 c->e.msg.p);
        return c->e.status < 0 ? (kvt_status_t)c->e.status : KVT_ERR_PEER;
    }
    return KVT_OK;
}

/* ---- peers: one UCX endpoint per peer address, from its XFER_HELLO ------------------- */

#define MAX_PEERS 16

typedef struct peer {
    char addr[300];
    kvt_xfer_peer_t *p;
    uint64_t inc;
    uint32_t slot_bytes, nslots;
} peer_t;

typedef struct peers {
    peer_t v[MAX_PEERS];
    uint32_t n;
} peers_t;

static peers_t *peers_of(srv_xfer_t *xf)
{
    if (xf->peers == NULL)
        xf->peers = calloc(1, sizeof(peers_t));
    return xf->peers;
}

static void peer_drop(peers_t *ps, peer_t *p)
{
    kvt_xfer_peer_close(p->p);
    *p = ps->v[--ps->n];
}

void srv_xfer_pull_cleanup(srv_xfer_t *xf)
{
    peers_t *ps = xf->peers;
    while (ps != NULL && ps->n > 0)
        peer_drop(ps, &ps->v[0]);
    free(ps);
    xf->peers = NULL;
}

/* XFER_HELLO on @c and a UCX endpoint from it, cached (replacing @addr's old one). */
static peer_t *peer_hello(srv_xfer_t *xf, cli_t *c, const char *addr, char *err, size_t errlen)
{
    peers_t *ps = peers_of(xf);
    if (ps == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return NULL;
    }
    for (uint32_t i = 0; i < ps->n; i++)
        if (strcmp(ps->v[i].addr, addr) == 0) {
            peer_drop(ps, &ps->v[i]);
            break;
        }
    if (ps->n == MAX_PEERS)
        peer_drop(ps, &ps->v[0]);
    uint64_t id = ++c->next_id;
    kvt_proto_xfer_hello_req_encode(&c->wr, id, 0);
    kvt_proto_xfer_hello_ans_t h;
    if (cli_call(c, KVT_PROTO_OP_XFER_HELLO, id, err, errlen) != KVT_OK ||
        kvt_proto_xfer_hello_ans_decode(c->body, c->len, &h, err, errlen) != KVT_OK)
        return NULL;
    atomic_fetch_add_explicit(&xf->handshakes, 1, memory_order_relaxed);
    kvt_xfer_peer_info_t info = {.worker_addr = h.addr,
                                 .worker_addr_len = h.addr_len,
                                 .rkey = h.rkey,
                                 .rkey_len = h.rkey_len,
                                 .remote_base = h.base,
                                 .remote_len = (uint64_t)h.nslots * h.slot_bytes,
                                 .incarnation = h.incarnation};
    peer_t *p = &ps->v[ps->n];
    *p = (peer_t){.inc = h.incarnation, .slot_bytes = h.slot_bytes, .nslots = h.nslots};
    if (kvt_xfer_peer_open(xf->x, &info, &p->p, err, errlen) != KVT_OK)
        return NULL;
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    ps->n++;
    return p;
}

/* The cached peer at @addr when it has not failed, else a fresh handshake. */
static peer_t *peer_get(srv_xfer_t *xf, cli_t *c, const char *addr, char *err, size_t errlen)
{
    peers_t *ps = peers_of(xf);
    for (uint32_t i = 0; ps != NULL && i < ps->n; i++)
        if (strcmp(ps->v[i].addr, addr) == 0 && !kvt_xfer_peer_failed(ps->v[i].p, NULL))
            return &ps->v[i];
    return peer_hello(xf, c, addr, err, errlen);
}

/* ---- the pull ------------------------------------------------------------------------- */

typedef struct batch_wait {
    bool done;
    kvt_status_t st;
} batch_wait_t;

static void batch_done(void *arg, kvt_status_t st)
{
    batch_wait_t *bw = arg;
    bw->done = true;
    bw->st = st;
}

/* Drives UCX until @bw is done (the batch's deadline bounds it). */
static void batch_wait(srv_xfer_t *xf, batch_wait_t *bw)
{
    int efd = kvt_xfer_efd(xf->x);
    while (!bw->done) {
        if (kvt_xfer_progress(xf->x) > 0 || bw->done || !kvt_xfer_arm(xf->x))
            continue;
        int timeout = kvt_xfer_next_deadline_ms(xf->x);
        if (efd < 0 && (timeout < 0 || timeout > 10))
            timeout = 10;
        struct pollfd pfd = {.fd = efd, .events = POLLIN};
        if (efd >= 0)
            poll(&pfd, 1, timeout);
        else
            poll(NULL, 0, timeout);
    }
}

static uint8_t reason_of(kvt_status_t st)
{
    switch (st) {
    case KVT_ERR_PEER:
    case KVT_ERR_CLOSED: return KVT_PROTO_XFER_FAIL_PEER_DOWN;
    case KVT_ERR_TIMEOUT: return KVT_PROTO_XFER_FAIL_TIMEOUT;
    default: return KVT_PROTO_XFER_FAIL_ERROR;
    }
}

typedef struct pull {
    uint64_t *transferred, *missing;
    kvt_proto_xfer_failed_t *failed;
    uint32_t nt, nm, nf;
    uint64_t bytes;
} pull_t;

static void fail_all(pull_t *r, const uint64_t *keys, uint32_t n, uint8_t reason)
{
    for (uint32_t i = 0; i < n; i++)
        r->failed[r->nf++] = (kvt_proto_xfer_failed_t){.key = keys[i], .reason = reason};
}

/*
 * The pull of @xc's keys from its peer into @r. The steps: a connection and
 * RPC HELLO; XFER_PIN (one re-handshake on a stale incarnation or a failed
 * endpoint); local reservations; one GET batch; sums; commit; XFER_RELEASE.
 */
static void pull(srv_xfer_t *xf, const srv_xfer_call_t *xc, pull_t *r, char *err, size_t errlen)
{
    uint32_t n = xc->n;
    uint32_t timeout = xc->timeout_ms != 0 ? xc->timeout_ms : 30000;
    cli_t c;
    if (cli_open(&c, xc->peer, timeout, err, errlen) != KVT_OK) {
        fail_all(r, xc->keys, n, KVT_PROTO_XFER_FAIL_PEER_DOWN);
        cli_close(&c);
        return;
    }
    const char *tok = xf->srv->auth_token != NULL ? xf->srv->auth_token : "";
    kvt_proto_hello_req_t hr = {KVT_PROTO_VERSION, {tok, (uint16_t)strlen(tok)}};
    uint64_t id = ++c.next_id;
    kvt_proto_hello_req_encode(&c.wr, id, &hr);
    kvt_proto_xfer_pinned_t *pins = malloc(n * sizeof(*pins));
    uint32_t *slots = malloc(n * sizeof(uint32_t));
    uint32_t *lens = malloc(n * sizeof(uint32_t));
    uint64_t *pkeys = malloc(2 * n * sizeof(uint64_t));
    uint32_t *pidx = malloc(n * sizeof(uint32_t));
    kvt_xfer_iov_t *iov = malloc(n * sizeof(*iov));
    kvt_status_t *est = malloc(n * sizeof(*est));
    kvt_tier_sess_t *s = kvt_tier_sess_open(xf->tier);
    kvt_proto_xfer_slots_ans_t pa = {0};
    peer_t *p = NULL;
    if (!pins || !slots || !lens || !pkeys || !pidx || !iov || !est || !s) {
        fail_all(r, xc->keys, n, KVT_PROTO_XFER_FAIL_ERROR);
        kvt_errf(err, errlen, "out of memory");
        goto out;
    }
    if (cli_call(&c, KVT_PROTO_OP_HELLO, id, err, errlen) != KVT_OK) {
        fail_all(r, xc->keys, n, KVT_PROTO_XFER_FAIL_PEER_DOWN);
        goto out;
    }
    kvt_status_t st = KVT_ERR_PEER;
    for (int attempt = 0; attempt < 2; attempt++) {
        p = attempt == 0 ? peer_get(xf, &c, xc->peer, err, errlen)
                         : peer_hello(xf, &c, xc->peer, err, errlen);
        if (p == NULL) {
            st = KVT_ERR_PEER;
            break;
        }
        kvt_proto_xfer_keys_t k = {.incarnation = p->inc,
                                   .model = {xc->model, (uint16_t)strlen(xc->model)},
                                   .lora = {xc->lora, (uint16_t)strlen(xc->lora)},
                                   .lease_ms = timeout + 5000 < KVT_PROTO_XFER_MAX_LEASE_MS
                                                   ? timeout + 5000
                                                   : KVT_PROTO_XFER_MAX_LEASE_MS,
                                   .n = n};
        id = ++c.next_id;
        kvt_proto_xfer_pin_req_encode(&c.wr, id, &k, xc->keys);
        st = cli_call(&c, KVT_PROTO_OP_XFER_PIN, id, err, errlen);
        if (st == KVT_OK)
            st = kvt_proto_xfer_pin_ans_decode(c.body, c.len, pins, n, &pa, err, errlen);
        if (st != KVT_ERR_STALE)
            break;
        p = NULL; /* the peer restarted: one more handshake */
    }
    if (st != KVT_OK || pa.n != n) {
        fail_all(r, xc->keys, n,
                 st == KVT_ERR_STALE ? KVT_PROTO_XFER_FAIL_PEER_RESTARTED
                                     : KVT_PROTO_XFER_FAIL_PEER_DOWN);
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
    size_t ns_len = srv_tier_ns(xc->model, strlen(xc->model), xc->lora, strlen(xc->lora), ns);
    size_t nev = 0;
    if (np > 0 &&
        kvt_tier_reserve(xf->tier, s, ns, ns_len, pkeys, np, slots, NULL, 0, &nev) != KVT_OK) {
        fail_all(r, pkeys, np, KVT_PROTO_XFER_FAIL_ERROR);
        np = 0;
    }
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
        batch_wait_t bw = {0};
        for (uint32_t j = 0; j < ni; j++)
            est[j] = KVT_ERR_INTERNAL;
        kvt_status_t sst = kvt_xfer_submit(p->p, KVT_XFER_GET, iov, ni, est, timeout, batch_done,
                                           &bw, err, errlen);
        if (sst != KVT_OK) {
            for (uint32_t j = 0; j < ni; j++)
                est[j] = sst;
        } else {
            batch_wait(xf, &bw);
        }
        /* check each landed block against the source's sum; commit the good ones */
        uint64_t *bad = pkeys + n;
        uint32_t ngood = 0, nbad = 0;
        for (uint32_t j = 0; j < ni; j++) {
            const kvt_proto_xfer_pinned_t *pin = &pins[pidx[j]];
            uint8_t why = 0;
            if (est[j] != KVT_OK)
                why = reason_of(est[j]);
            else if (XXH3_64bits(iov[j].local, pin->len) != pin->sum)
                why = KVT_PROTO_XFER_FAIL_CHECKSUM;
            if (why != 0) {
                bad[nbad++] = pkeys[j];
                r->failed[r->nf++] = (kvt_proto_xfer_failed_t){pkeys[j], why};
            } else {
                lens[ngood] = pin->len;
                r->bytes += pin->len;
                pkeys[ngood] = pkeys[j];
                r->transferred[r->nt++] = pkeys[ngood++];
            }
        }
        if (ngood > 0)
            kvt_tier_commit(xf->tier, s, ns, ns_len, pkeys, ngood, lens, true, NULL);
        if (nbad > 0)
            kvt_tier_commit(xf->tier, s, ns, ns_len, bad, nbad, NULL, false, NULL);
    }
    if (kvt_xfer_peer_failed(p->p, NULL)) {
        peer_drop(peers_of(xf), p);
    } else if (pa.lease != 0) {
        kvt_proto_xfer_lease_t lr = {.incarnation = p->inc, .lease = pa.lease};
        id = ++c.next_id;
        kvt_proto_xfer_lease_req_encode(&c.wr, KVT_PROTO_OP_XFER_RELEASE, id, &lr);
        char e2[200];
        cli_call(&c, KVT_PROTO_OP_XFER_RELEASE, id, e2, sizeof(e2)); /* else it expires there */
    }
out:
    if (s != NULL)
        kvt_tier_sess_close(xf->tier, s);
    cli_close(&c);
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
    pull_t r = {.transferred = malloc(xc->n * sizeof(uint64_t)),
                .missing = malloc(xc->n * sizeof(uint64_t)),
                .failed = malloc(xc->n * sizeof(kvt_proto_xfer_failed_t))};
    char err[320] = "";
    if (r.transferred == NULL || r.missing == NULL || r.failed == NULL) {
        srv_xjob_error(job, KVT_ERR_NO_MEM, 503, "out of memory");
    } else {
        pull(xf, xc, &r, err, sizeof(err));
        if (r.nf > 0)
            kvt_log_info("transfer from %s: %u of %u keys failed (%s)", xc->peer, r.nf, xc->n,
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
    srv_xfer_t *xf = rq->w->srv->xfer;
    if (xf == NULL) {
        *res = (srv_result_t){.out = OUT_ERROR,
                              .status = 501,
                              .st = KVT_ERR_UNSUPPORTED,
                              .msg = "this kvtierd takes no part in transfers: it needs "
                                     "--ram-bytes and --ucx on, and UCX must start (see its log)"};
        return;
    }
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
    if (st == KVT_OK && t.direction != KVT_PROTO_XFER_PULL) {
        st = KVT_ERR_UNSUPPORTED;
        kvt_errf(rq->err, rq->errlen, "transfer: push is not served yet");
    }
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
    xc->timeout_ms = t.timeout_ms;
    xc->keys = keys;
    xc->n = t.n;
    job->kind = JOB_TIER;
    job->worker = rq->w;
    job->xc = xc;
    *res = (srv_result_t){.out = OUT_ASYNC, .status = 200, .job = job, .start = srv_xfer_start_job};
}
