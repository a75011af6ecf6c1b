/*
 * transfer/xfer.c: the UCP context and worker, the registered region, peers.
 * Batches are in xfer_io.c.
 */
#define KVT_LOG_COMPONENT "transfer"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/errtext.h"
#include "common/log.h"
#include "transfer/xfer_int.h"

#define XFER_DEF_INFLIGHT 1024u
#define XFER_DEF_BATCHES 256u
#define XFER_DEF_PEERS 64u
#define XFER_DEF_TIMEOUT_MS 30000u
#define XFER_MAX_POOL (1u << 20)          /* bound on every pool option */
#define XFER_CLOSE_WAIT_NS 10000000000ull /* a force close that takes longer is a UCX bug */

static kvt_status_t resolve_opts(const kvt_xfer_opts_t *in, kvt_xfer_opts_t *out, char *err,
                                 size_t errlen)
{
    kvt_xfer_opts_t o = {0};
    if (in != NULL)
        o = *in;
    if (o.max_inflight == 0)
        o.max_inflight = XFER_DEF_INFLIGHT;
    if (o.max_batches == 0)
        o.max_batches = XFER_DEF_BATCHES;
    if (o.max_peers == 0)
        o.max_peers = XFER_DEF_PEERS;
    if (o.timeout_ms == 0)
        o.timeout_ms = XFER_DEF_TIMEOUT_MS;
    if (o.max_inflight > XFER_MAX_POOL || o.max_batches > XFER_MAX_POOL ||
        o.max_peers > XFER_MAX_POOL) {
        kvt_errf(err, errlen, "transfer: max_inflight, max_batches and max_peers must be <= %u",
                 XFER_MAX_POOL);
        return KVT_ERR_INVAL;
    }
    if (o.tls != NULL && o.tls[0] == '\0') {
        kvt_errf(err, errlen, "transfer: tls must name at least one transport");
        return KVT_ERR_INVAL;
    }
    *out = o;
    return KVT_OK;
}

static kvt_status_t alloc_pools(kvt_xfer_t *x)
{
    const kvt_xfer_opts_t *o = &x->opts;
    size_t nreq = (size_t)o->max_inflight + o->max_batches;
    x->reqs = calloc(nreq, sizeof(*x->reqs));
    x->batches = calloc(o->max_batches, sizeof(*x->batches));
    x->peers = calloc(o->max_peers, sizeof(*x->peers));
    if (x->reqs == NULL || x->batches == NULL || x->peers == NULL)
        return KVT_ERR_NO_MEM;
    for (size_t i = nreq; i-- > 0;) {
        x->reqs[i].next_free = x->free_reqs;
        x->free_reqs = &x->reqs[i];
    }
    for (size_t i = o->max_batches; i-- > 0;) {
        x->batches[i].next_free = x->free_batches;
        x->free_batches = &x->batches[i];
    }
    for (size_t i = o->max_peers; i-- > 0;) {
        x->peers[i].next_free = x->free_peers;
        x->free_peers = &x->peers[i];
    }
    return KVT_OK;
}

/* ucp_init() with @features; the config carries UCX's environment and opts.tls. */
static ucs_status_t init_context(const kvt_xfer_opts_t *o, uint64_t features, ucp_context_h *ctx_p,
                                 char *err, size_t errlen)
{
    ucp_config_t *cfg;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        kvt_errf(err, errlen, "transfer: reading the ucx configuration: %s", ucs_status_string(s));
        return s;
    }
    if (o->tls != NULL && (s = ucp_config_modify(cfg, "TLS", o->tls)) != UCS_OK) {
        kvt_errf(err, errlen, "transfer: tls \"%s\": %s", o->tls, ucs_status_string(s));
        ucp_config_release(cfg);
        return s;
    }
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = features,
        .mt_workers_shared = 0,
    };
    s = ucp_init(&p, cfg, ctx_p);
    ucp_config_release(cfg);
    if (s != UCS_OK)
        kvt_errf(err, errlen, "transfer: ucp_init: %s", ucs_status_string(s));
    return s;
}

static ucs_status_t create_worker(kvt_xfer_t *x, char *err, size_t errlen)
{
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    ucs_status_t s = ucp_worker_create(x->ctx, &wp, &x->worker);
    if (s != UCS_OK)
        kvt_errf(err, errlen, "transfer: ucp_worker_create: %s", ucs_status_string(s));
    return s;
}

kvt_status_t kvt_xfer_create(const kvt_xfer_opts_t *opts, kvt_xfer_t **x_p, char *err,
                             size_t errlen)
{
    kvt_xfer_opts_t o;
    kvt_status_t st = resolve_opts(opts, &o, err, errlen);
    if (st != KVT_OK)
        return st;
    kvt_xfer_t *x = calloc(1, sizeof(*x));
    if (x == NULL) {
        kvt_errf(err, errlen, "transfer: out of memory");
        return KVT_ERR_NO_MEM;
    }
    x->opts = o;
    x->efd = -1;
    xfer_list_init(&x->active);
    xfer_list_init(&x->waiting);
    xfer_list_init(&x->done);
    if ((st = alloc_pools(x)) != KVT_OK) {
        kvt_errf(err, errlen, "transfer: out of memory for %u requests, %u batches, %u peers",
                 o.max_inflight, o.max_batches, o.max_peers);
        goto err_free;
    }

    /* Wakeup when the transports offer it; without it the owner polls (efd -1). */
    ucs_status_t s = init_context(&o, UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP, &x->ctx, err, errlen);
    if (s == UCS_OK && create_worker(x, err, errlen) != UCS_OK) {
        ucp_cleanup(x->ctx);
        s = UCS_ERR_UNSUPPORTED;
    }
    if (s != UCS_OK) {
        kvt_log_info("ucx context with wakeup failed, trying without: %s", err ? err : "");
        if ((s = init_context(&o, UCP_FEATURE_RMA, &x->ctx, err, errlen)) != UCS_OK) {
            st = s == UCS_ERR_NO_MEMORY ? KVT_ERR_NO_MEM : KVT_ERR_UNSUPPORTED;
            goto err_free;
        }
        if (create_worker(x, err, errlen) != UCS_OK) {
            st = KVT_ERR_UNSUPPORTED;
            goto err_cleanup;
        }
    } else if ((s = ucp_worker_get_efd(x->worker, &x->efd)) != UCS_OK) {
        kvt_log_info("ucx worker has no event fd: %s", ucs_status_string(s));
        x->efd = -1;
    }
    if ((s = ucp_worker_get_address(x->worker, &x->addr, &x->addr_len)) != UCS_OK) {
        kvt_errf(err, errlen, "transfer: ucp_worker_get_address: %s", ucs_status_string(s));
        st = KVT_ERR_UNSUPPORTED;
        goto err_worker;
    }
    kvt_log_debug("ucx worker ready: address %zu bytes, efd %d", x->addr_len, x->efd);
    *x_p = x;
    return KVT_OK;

err_worker:
    ucp_worker_destroy(x->worker);
err_cleanup:
    ucp_cleanup(x->ctx);
err_free:
    free(x->reqs);
    free(x->batches);
    free(x->peers);
    free(x);
    return st;
}

void kvt_xfer_destroy(kvt_xfer_t *x)
{
    if (x == NULL)
        return;
    for (uint32_t i = 0; i < x->opts.max_peers; i++)
        if (x->peers[i].in_use)
            kvt_xfer_peer_close(&x->peers[i]);
    xfer_deliver(x);
    if (x->nbatches != 0)
        kvt_log_error("transfer: %u batches still in flight at destroy", x->nbatches);
    if (x->rkey_buf != NULL)
        ucp_rkey_buffer_release(x->rkey_buf);
    if (x->memh != NULL)
        ucp_mem_unmap(x->ctx, x->memh);
    ucp_worker_release_address(x->worker, x->addr);
    ucp_worker_destroy(x->worker);
    ucp_cleanup(x->ctx);
    free(x->reqs);
    free(x->batches);
    free(x->peers);
    free(x);
}

const void *kvt_xfer_worker_address(const kvt_xfer_t *x, size_t *len_p)
{
    *len_p = x->addr_len;
    return x->addr;
}

kvt_status_t kvt_xfer_register(kvt_xfer_t *x, void *base, size_t len, char *err, size_t errlen)
{
    if (x->memh != NULL) {
        kvt_errf(err, errlen, "transfer: a region is already registered");
        return KVT_ERR_EXISTS;
    }
    if (base == NULL || len == 0 || (uintptr_t)base + len < (uintptr_t)base) {
        kvt_errf(err, errlen, "transfer: register needs a non-empty region");
        return KVT_ERR_INVAL;
    }
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = base,
        .length = len,
    };
    ucs_status_t s = ucp_mem_map(x->ctx, &mp, &x->memh);
    if (s != UCS_OK) {
        kvt_errf(err, errlen, "transfer: ucp_mem_map of %zu bytes: %s", len, ucs_status_string(s));
        x->memh = NULL;
        return KVT_ERR_IO;
    }
    if ((s = ucp_rkey_pack(x->ctx, x->memh, &x->rkey_buf, &x->rkey_len)) != UCS_OK) {
        kvt_errf(err, errlen, "transfer: ucp_rkey_pack: %s", ucs_status_string(s));
        ucp_mem_unmap(x->ctx, x->memh);
        x->memh = NULL;
        x->rkey_buf = NULL;
        return KVT_ERR_IO;
    }
    x->base = base;
    x->len = len;
    return KVT_OK;
}

const void *kvt_xfer_rkey(const kvt_xfer_t *x, size_t *len_p)
{
    *len_p = x->rkey_buf != NULL ? x->rkey_len : 0;
    return x->rkey_buf;
}

int kvt_xfer_efd(const kvt_xfer_t *x)
{
    return x->efd;
}

bool kvt_xfer_arm(kvt_xfer_t *x)
{
    if (x->efd < 0 || !xfer_list_empty(&x->done))
        return false;
    ucs_status_t s = ucp_worker_arm(x->worker);
    if (s == UCS_OK)
        return true;
    if (s != UCS_ERR_BUSY)
        kvt_log_warn("ucp_worker_arm: %s", ucs_status_string(s));
    return false;
}

/* UCX's error handler of a peer's endpoint: runs inside ucp_worker_progress(); UCX fails the
 * endpoint's requests itself, the endpoint is closed by kvt_xfer_peer_close(). */
static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t s)
{
    kvt_xfer_peer_t *peer = arg;
    (void)ep;
    if (!peer->failed) {
        peer->why = ucs_status_string(s);
        kvt_log_warn("peer (incarnation %016llx) failed: %s", (unsigned long long)peer->incarnation,
                     peer->why);
    }
    peer->failed = true;
    peer->ucx_failed = true;
}

kvt_status_t kvt_xfer_peer_open(kvt_xfer_t *x, const kvt_xfer_peer_info_t *info,
                                kvt_xfer_peer_t **peer_p, char *err, size_t errlen)
{
    if (info->map == NULL && (info->worker_addr == NULL || info->worker_addr_len == 0 ||
                              info->rkey == NULL || info->rkey_len == 0)) {
        kvt_errf(err, errlen, "transfer: a peer needs its worker address and rkey");
        return KVT_ERR_INVAL;
    }
    if (info->remote_len == 0 || info->remote_base + info->remote_len < info->remote_base) {
        kvt_errf(err, errlen, "transfer: peer region [%llu, +%llu) is empty or wraps",
                 (unsigned long long)info->remote_base, (unsigned long long)info->remote_len);
        return KVT_ERR_INVAL;
    }
    kvt_xfer_peer_t *peer = x->free_peers;
    if (peer == NULL) {
        kvt_errf(err, errlen, "transfer: %u peers open already", x->opts.max_peers);
        return KVT_ERR_LIMIT;
    }
    kvt_xfer_peer_t *next_free = peer->next_free;
    memset(peer, 0, sizeof(*peer));
    peer->next_free = next_free; /* still on the free list until it opens */
    peer->x = x;
    peer->remote_base = info->remote_base;
    peer->remote_len = info->remote_len;
    peer->incarnation = info->incarnation;
    xfer_list_init(&peer->batches);
    if (info->map != NULL) {
        peer->map = info->map;
        x->free_peers = next_free;
        peer->in_use = true;
        *peer_p = peer;
        return KVT_OK;
    }

    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = info->worker_addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = peer_err_cb, .arg = peer},
    };
    ucs_status_t s = ucp_ep_create(x->worker, &ep, &peer->ep);
    if (s == UCS_ERR_UNREACHABLE) {
        /* UCX 1.13's shared-memory transports have no peer failure handling */
        kvt_errf(err, errlen,
                 "transfer: no transport to the peer handles peer failures (shared memory alone "
                 "does not in this ucx: add tcp to UCX_TLS)");
        return KVT_ERR_PEER;
    }
    if (s != UCS_OK) {
        kvt_errf(err, errlen, "transfer: ucp_ep_create: %s", ucs_status_string(s));
        return KVT_ERR_PEER;
    }
    if ((s = ucp_ep_rkey_unpack(peer->ep, info->rkey, &peer->rkey)) != UCS_OK) {
        kvt_errf(err, errlen, "transfer: ucp_ep_rkey_unpack: %s", ucs_status_string(s));
        peer->rkey = NULL;
        xfer_peer_abort(peer, "rkey refused");
        return KVT_ERR_PEER;
    }
    x->free_peers = next_free;
    peer->in_use = true;
    *peer_p = peer;
    return KVT_OK;
}

/* Waits for the force close request @req (NULL, an error, or a pointer); the requests of the
 * endpoint are completed (cancelled) along the way. */
static void wait_close(kvt_xfer_t *x, ucs_status_ptr_t req)
{
    if (req == NULL)
        return;
    if (UCS_PTR_IS_ERR(req)) {
        kvt_log_warn("ucp_ep_close_nbx: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        return;
    }
    uint64_t limit = kvt_clock_ns() + XFER_CLOSE_WAIT_NS;
    ucs_status_t s;
    while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        ucp_worker_progress(x->worker);
        if (kvt_clock_ns() > limit) {
            kvt_log_error("ucp_ep_close_nbx: force close did not finish, request leaked");
            return;
        }
    }
    if (s != UCS_OK && s != UCS_ERR_CANCELED && s != UCS_ERR_CONNECTION_RESET)
        kvt_log_debug("force close: %s", ucs_status_string(s));
    ucp_request_free(req);
}

void xfer_peer_abort(kvt_xfer_peer_t *peer, const char *why)
{
    kvt_xfer_t *x = peer->x;
    if (!peer->failed) {
        peer->why = why;
        if (strcmp(why, "closed") != 0)
            kvt_log_warn("peer (incarnation %016llx) given up: %s",
                         (unsigned long long)peer->incarnation, why);
    }
    peer->failed = true;
    /* An rkey is released after its operations are flushed and before its endpoint goes; when
     * operations are in flight, the force close cancels them first. */
    if (peer->outstanding == 0 && peer->rkey != NULL) {
        ucp_rkey_destroy(peer->rkey);
        peer->rkey = NULL;
    }
    if (peer->ep != NULL) {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucp_ep_h ep = peer->ep;
        peer->ep = NULL;
        wait_close(x, ucp_ep_close_nbx(ep, &p));
    }
    if (peer->outstanding != 0)
        kvt_log_error("transfer: %u requests to a closed peer did not complete", peer->outstanding);
    if (peer->rkey != NULL) {
        ucp_rkey_destroy(peer->rkey);
        peer->rkey = NULL;
    }
    xfer_pump(x); /* fails the entries that were waiting for this peer */
}

void kvt_xfer_peer_close(kvt_xfer_peer_t *peer)
{
    if (peer == NULL)
        return;
    kvt_xfer_t *x = peer->x;
    if (peer->ep != NULL || peer->rkey != NULL)
        xfer_peer_abort(peer, "closed");
    while (!xfer_list_empty(&peer->batches)) {
        xfer_batch_t *b = XFER_CONTAINER(peer->batches.next, xfer_batch_t, peer_link);
        xfer_list_del(&b->peer_link);
        b->peer = NULL;
    }
    peer->in_use = false;
    peer->next_free = x->free_peers;
    x->free_peers = peer;
    xfer_deliver(x);
}

bool kvt_xfer_peer_mapped(const kvt_xfer_peer_t *peer)
{
    return peer->map != NULL;
}

bool kvt_xfer_peer_failed(const kvt_xfer_peer_t *peer, const char **why_p)
{
    if (why_p != NULL)
        *why_p = peer->failed ? peer->why : NULL;
    return peer->failed;
}

uint64_t kvt_xfer_peer_incarnation(const kvt_xfer_peer_t *peer)
{
    return peer->incarnation;
}
