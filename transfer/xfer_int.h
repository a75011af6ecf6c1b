/*
 * transfer/xfer_int.h: what xfer.c (context, region, peers) and xfer_io.c
 * (batches) share. Private to transfer/.
 */
#ifndef KVT_TRANSFER_XFER_INT_H
#define KVT_TRANSFER_XFER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "transfer/transfer.h"

/* A circular doubly linked list; a head is a link that points at itself when empty. */
typedef struct xfer_link {
    struct xfer_link *prev, *next;
} xfer_link_t;

static inline void xfer_list_init(xfer_link_t *h)
{
    h->prev = h->next = h;
}

static inline bool xfer_list_empty(const xfer_link_t *h)
{
    return h->next == h;
}

static inline void xfer_list_push(xfer_link_t *h, xfer_link_t *l)
{
    l->prev = h->prev;
    l->next = h;
    h->prev->next = l;
    h->prev = l;
}

static inline void xfer_list_del(xfer_link_t *l)
{
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = l;
}

#define XFER_CONTAINER(ptr, type, field) ((type *)(void *)((char *)(ptr)-offsetof(type, field)))

#define XFER_FLUSH UINT32_MAX /* xfer_req_t.idx of a batch's flush */

typedef struct xfer_batch xfer_batch_t;

/* The context of one UCX request: an entry of a batch, or its flush. */
typedef struct xfer_req {
    xfer_batch_t *batch;
    uint32_t idx; /* entry index, or XFER_FLUSH */
    struct xfer_req *next_free;
} xfer_req_t;

struct xfer_batch {
    xfer_link_t link;      /* x->active while in flight, x->done once finished */
    xfer_link_t wait_link; /* x->waiting while entries are left to post */
    xfer_link_t peer_link; /* peer->batches while the peer is open */
    kvt_xfer_t *x;
    kvt_xfer_peer_t *peer; /* NULL once the peer is closed */
    const kvt_xfer_iov_t *iov;
    kvt_status_t *status; /* caller's per-entry results, or NULL */
    uint32_t n;
    uint32_t next;        /* entries [0, next) are posted or failed */
    uint32_t outstanding; /* UCX requests not completed (entries and flush) */
    uint64_t deadline_ns; /* kvt_clock_ns() past which the batch fails */
    kvt_status_t st;      /* the first failure, or KVT_OK */
    kvt_xfer_op_t op;
    bool flush_posted, flush_ok, timed_out, finished;
    kvt_xfer_cb_t cb;
    void *arg;
    xfer_batch_t *next_free;
};

struct kvt_xfer_peer {
    kvt_xfer_t *x;
    ucp_ep_h ep;     /* NULL once force-closed */
    ucp_rkey_h rkey; /* NULL once released */
    uint8_t *map;    /* a mapped peer's region (no ep, no rkey), or NULL */
    uint64_t remote_base, remote_len, incarnation;
    xfer_link_t batches;  /* open batches to this peer */
    uint32_t outstanding; /* UCX requests in flight on ep */
    const char *why;      /* static reason, set when it failed */
    bool failed, ucx_failed, in_use;
    kvt_xfer_peer_t *next_free;
};

struct kvt_xfer {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int efd; /* -1 without wakeup */

    ucp_mem_h memh; /* the registered region, or NULL */
    uint8_t *base;
    size_t len;
    void *rkey_buf;
    size_t rkey_len;

    kvt_xfer_opts_t opts; /* defaults resolved */

    xfer_req_t *reqs; /* max_inflight + max_batches */
    xfer_req_t *free_reqs;
    xfer_batch_t *batches; /* max_batches */
    xfer_batch_t *free_batches;
    kvt_xfer_peer_t *peers; /* max_peers */
    kvt_xfer_peer_t *free_peers;

    xfer_link_t active;  /* batches in flight, in submit order */
    xfer_link_t waiting; /* batches with entries not yet posted, in submit order */
    xfer_link_t done;    /* finished batches whose callbacks are due */
    uint32_t inflight;   /* entry requests posted to UCX */
    uint32_t nbatches;   /* batches submitted and not called back */
};

/* xfer_io.c: posts waiting entries as capacity allows; fails those of dead peers. */
void xfer_pump(kvt_xfer_t *x);

/* xfer_io.c: fires the callbacks of finished batches; returns how many. */
unsigned xfer_deliver(kvt_xfer_t *x);

/* xfer_io.c: the status of an entry that UCX completed with @s. */
kvt_status_t xfer_status_from_ucs(const xfer_batch_t *b, ucs_status_t s);

/* xfer.c: gives @peer up: marks it failed with @why, force-closes its endpoint and releases
 * its rkey; its in-flight requests complete (with errors) before this returns. */
void xfer_peer_abort(kvt_xfer_peer_t *peer, const char *why);

#endif
