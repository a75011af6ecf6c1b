/*
 * transfer/transfer.h: moving block bytes between two sidecars' arenas over UCX.
 *
 * One kvt_xfer_t is one UCP context and one worker (thread mode single): the
 * thread that creates it is its owner and makes every call below, callbacks
 * included; nothing here locks. The owner registers one region (the arena)
 * and hands its worker address and packed rkey to peers (through the binary
 * RPC, not this component's business); a peer opened from the other side's
 * address, rkey and region is an endpoint with peer error handling.
 *
 * I/O is in batches: kvt_xfer_submit() posts a list of {remote offset, local
 * pointer, length} entries, GET (peer -> here) or PUT (here -> peer), and the
 * batch's callback fires exactly once, always from kvt_xfer_progress() (never
 * from submit), when every entry has landed or failed: a GET entry is OK when
 * its bytes are in local memory, a PUT batch only after a flush, when its
 * bytes are visible at the peer. Each entry's status is written to the
 * caller's array, so the caller knows which blocks landed.
 *
 * Errors: a dead peer (its process killed, its connection reset) fails every
 * entry in flight to it (KVT_ERR_PEER), never hangs; a batch past its deadline
 * fails (KVT_ERR_TIMEOUT) by force-closing the peer's endpoint, which fails
 * the peer's other batches too (KVT_ERR_CLOSED): a peer that stops answering
 * is given up. A failed peer refuses new batches; close it and open a new one
 * (from a fresh handshake). Functions that can say why they fail take the
 * caller's `char *err, size_t errlen` last (common/errtext.h).
 *
 * Memory: every batch, entry context and peer comes from pools sized at
 * create (kvt_xfer_opts_t); submit and progress do not allocate.
 *
 * Mapped peers: a peer on the same host whose region is mapped here (its
 * arena's sealed memfd, passed over its Unix socket) is opened with
 * info.map; its batches are copies (memcpy), no UCX is involved, and their
 * callbacks fire from the next kvt_xfer_progress() as for any batch. A mapped
 * peer never fails by itself: the memory stays mapped after its owner dies,
 * and the caller learns of a restart from the RPC, as with UCX peers.
 *
 * Status of UCX itself: UCX reads its environment (UCX_TLS, UCX_NET_DEVICES,
 * ...) when the context is created; opts.tls overrides UCX_TLS.
 */
#ifndef KVT_TRANSFER_TRANSFER_H
#define KVT_TRANSFER_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kvt_xfer kvt_xfer_t;
typedef struct kvt_xfer_peer kvt_xfer_peer_t;

/* What kvt_xfer_create() takes; zero fields take the defaults named. */
typedef struct kvt_xfer_opts {
    const char *tls;       /* UCX transports ("tcp", "posix,cma,self"); NULL: UCX_TLS or UCX's
                              choice */
    uint32_t max_inflight; /* entries posted to UCX at once (default 1024); more wait in order */
    uint32_t max_batches;  /* batches submitted and not yet called back (default 256) */
    uint32_t max_peers;    /* peers open at once (default 64) */
    uint32_t timeout_ms;   /* a batch's deadline when submit names none (default 30000) */
} kvt_xfer_opts_t;

/* Direction of a batch. */
typedef enum kvt_xfer_op {
    KVT_XFER_GET = 0, /* peer's region -> local memory */
    KVT_XFER_PUT = 1, /* local memory -> peer's region, remotely visible at completion */
} kvt_xfer_op_t;

/* One entry of a batch. */
typedef struct kvt_xfer_iov {
    uint64_t remote_off; /* bytes from the peer's region base */
    void *local;         /* inside the region kvt_xfer_register() registered */
    uint64_t len;        /* bytes, >= 1 */
} kvt_xfer_iov_t;

/* What kvt_xfer_peer_open() needs of the other side (its handshake). */
typedef struct kvt_xfer_peer_info {
    const void *worker_addr; /* the peer's kvt_xfer_worker_address() bytes */
    size_t worker_addr_len;
    const void *rkey; /* the peer's kvt_xfer_rkey() bytes */
    size_t rkey_len;
    uint64_t remote_base; /* the peer's region address, as it registered it */
    uint64_t remote_len;  /* the peer's region length in bytes */
    uint64_t incarnation; /* the peer's start id: kept, reported, not interpreted */
    void *map; /* not NULL: the peer's region is mapped here at @map (remote_base is then only
                  reported); worker_addr and rkey are not used. The caller keeps it mapped
                  until kvt_xfer_peer_close(). */
} kvt_xfer_peer_info_t;

/*
 * A batch's completion: @st is KVT_OK when every entry succeeded, else the
 * first failure's status (KVT_ERR_TIMEOUT when the batch's deadline passed);
 * the per-entry statuses are in the array given to submit. Called once, from
 * kvt_xfer_progress() (or kvt_xfer_peer_close()/kvt_xfer_destroy(), see
 * there). It may submit new batches; it must not close the batch's peer or
 * destroy the context.
 */
typedef void (*kvt_xfer_cb_t)(void *arg, kvt_status_t st);

/*
 * Creates the UCP context (RMA and wakeup features) and its worker. @opts may
 * be NULL (all defaults). On KVT_OK *x_p is set; free it with
 * kvt_xfer_destroy(). KVT_ERR_INVAL for an absurd option, KVT_ERR_UNSUPPORTED
 * when UCX cannot create a context or worker here (no usable transport),
 * KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_xfer_create(const kvt_xfer_opts_t *opts, kvt_xfer_t **x_p, char *err,
                             size_t errlen);

/*
 * Force-closes every open peer, fails their batches (KVT_ERR_CLOSED; callbacks
 * fire before this returns), unregisters the region, and frees @x. NULL is a
 * no-op.
 */
void kvt_xfer_destroy(kvt_xfer_t *x);

/* The worker's address: *@len_p bytes at the returned pointer, valid until
 * kvt_xfer_destroy(). */
const void *kvt_xfer_worker_address(const kvt_xfer_t *x, size_t *len_p);

/*
 * Registers [@base, @base + @len) for local and remote access, once per
 * context: KVT_ERR_EXISTS on a second call, KVT_ERR_INVAL for NULL or 0,
 * KVT_ERR_IO when UCX refuses. Unregistered by kvt_xfer_destroy().
 */
kvt_status_t kvt_xfer_register(kvt_xfer_t *x, void *base, size_t len, char *err, size_t errlen);

/* The registered region's packed rkey for peers: *@len_p bytes, valid until
 * kvt_xfer_destroy(); NULL (and 0) before kvt_xfer_register(). */
const void *kvt_xfer_rkey(const kvt_xfer_t *x, size_t *len_p);

/*
 * The event fd of the worker, for the owner's event loop (epoll, libevent):
 * wait for it to be readable only after kvt_xfer_arm() returned true; after
 * a wake-up, call kvt_xfer_progress() until it reports no more work, then arm
 * again. Also wake up for kvt_xfer_next_deadline_ms(). -1 when UCX has none.
 */
int kvt_xfer_efd(const kvt_xfer_t *x);

/*
 * Arms the event fd. True: the owner may sleep on it; false: events are
 * already pending (or arming failed), call kvt_xfer_progress() first.
 */
bool kvt_xfer_arm(kvt_xfer_t *x);

/*
 * Drives UCX, fails batches past their deadline, posts waiting entries and
 * fires the callbacks of finished batches. Returns how many UCX events and
 * callbacks it handled: 0 when there was nothing to do.
 */
unsigned kvt_xfer_progress(kvt_xfer_t *x);

/*
 * Sleeps until the worker may have work, at most @timeout_ms (negative: no
 * bound) and never past the earliest batch deadline: arms the event fd and
 * waits on it; returns at once when events are already pending. Without an
 * event fd, sleeps up to 10 ms. Call kvt_xfer_progress() after it.
 */
void kvt_xfer_wait(kvt_xfer_t *x, int timeout_ms);

/* Milliseconds until the earliest deadline of a batch in flight (0 if one is
 * past it), or -1 when none is in flight: a poll() timeout for the owner. */
int kvt_xfer_next_deadline_ms(const kvt_xfer_t *x);

/* Batches submitted and not yet called back. */
uint32_t kvt_xfer_batches_inflight(const kvt_xfer_t *x);

/*
 * Opens a peer from its handshake @info (borrowed: copied or unpacked here):
 * an endpoint to its worker with peer error handling and its unpacked rkey,
 * or, with info.map, a mapped peer (see the file comment).
 * On KVT_OK *peer_p is set, valid until kvt_xfer_peer_close(). KVT_ERR_INVAL
 * for a malformed @info, KVT_ERR_LIMIT when max_peers are open, KVT_ERR_PEER
 * when UCX refuses the address or rkey.
 */
kvt_status_t kvt_xfer_peer_open(kvt_xfer_t *x, const kvt_xfer_peer_info_t *info,
                                kvt_xfer_peer_t **peer_p, char *err, size_t errlen);

/*
 * Force-closes the peer's endpoint (no wait for the other side), releases its
 * rkey and frees it. Batches still in flight to it fail with KVT_ERR_CLOSED
 * and their callbacks fire before this returns. NULL is a no-op.
 */
void kvt_xfer_peer_close(kvt_xfer_peer_t *peer);

/* True when @peer was opened with info.map. */
bool kvt_xfer_peer_mapped(const kvt_xfer_peer_t *peer);

/* True once the peer failed (UCX reported it, or a batch to it timed out);
 * *@why_p (when not NULL) is set to a static lowercase reason. */
bool kvt_xfer_peer_failed(const kvt_xfer_peer_t *peer, const char **why_p);

/* The incarnation the peer was opened with. */
uint64_t kvt_xfer_peer_incarnation(const kvt_xfer_peer_t *peer);

/*
 * Submits a batch of @n entries of @op to @peer. Every entry is checked
 * before anything is posted: length >= 1, [remote_off, remote_off + len)
 * inside the peer's region, [local, local + len) inside the registered
 * region; a bad one refuses the whole batch (KVT_ERR_RANGE for a range,
 * KVT_ERR_INVAL for the rest, with the entry's index in the text). Also
 * refused: a failed peer (KVT_ERR_PEER), no registered region (KVT_ERR_INVAL),
 * max_batches in flight (KVT_ERR_LIMIT). A refused batch never calls back.
 *
 * On KVT_OK the batch is in flight: entries are posted at once, up to
 * max_inflight across all batches, the rest in order as earlier ones finish;
 * @cb(@arg, st) fires exactly once from a later call (see kvt_xfer_cb_t).
 * @iov and @status (n entries: each entry's own result, written before the
 * callback; may be NULL) are borrowed until the callback. @timeout_ms 0
 * takes the context's default; past it the batch fails (KVT_ERR_TIMEOUT for
 * its unfinished entries) and the peer is force-closed.
 */
kvt_status_t kvt_xfer_submit(kvt_xfer_peer_t *peer, kvt_xfer_op_t op, const kvt_xfer_iov_t *iov,
                             uint32_t n, kvt_status_t *status, uint32_t timeout_ms,
                             kvt_xfer_cb_t cb, void *arg, char *err, size_t errlen);

#endif
