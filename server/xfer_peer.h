/*
 * server/xfer_peer.h: what a TRANSFER (pull, xfer_pull.c; push, xfer_push.c)
 * needs of its peer, on the xfer thread: a small blocking RPC client, the
 * cached UCX endpoints keyed by the peer's address with its incarnation, one
 * batch of UCX I/O driven to its end, and the answer being built.
 */
#ifndef KVT_SERVER_XFER_PEER_H
#define KVT_SERVER_XFER_PEER_H

#include <poll.h>

#include "server/xfer_int.h"

/* A blocking RPC connection to the peer. */
typedef struct srv_xcli {
    int fd;
    int pass_fd;         /* a descriptor that came with an answer (ATTACH, Unix socket), or -1 */
    srv_xfer_t *xf;      /* whose UCX worker is progressed while an answer is awaited */
    uint32_t timeout_ms; /* for each answer */
    uint64_t next_id;
    kvt_proto_wr_t wr;
    uint8_t *body; /* the last answer's body (malloc'd) */
    uint32_t len;
    kvt_proto_err_t e; /* the last error answer */
} srv_xcli_t;

/* A client not connected yet: srv_xcli_close() is safe on it, srv_xcli_open() connects it. */
void srv_xcli_init(srv_xfer_t *xf, srv_xcli_t *c, uint32_t timeout_ms);

/*
 * Connects to @peer ("host:port") with @timeout_ms for the connection and each
 * read or write, and says HELLO (with this kvtierd's --auth-token). KVT_ERR_PEER
 * when it cannot connect or the answer is missing, KVT_ERR_TIMEOUT when the
 * answer did not come in time, the peer's status for its error answer,
 * KVT_ERR_INVAL for a bad address. srv_xcli_close() in every case.
 */
kvt_status_t srv_xcli_open(srv_xfer_t *xf, srv_xcli_t *c, const char *peer, uint32_t timeout_ms,
                           char *err, size_t errlen);

/* The same over the Unix socket at @path (srv_xcli_close() in every case). */
kvt_status_t srv_xcli_open_unix(srv_xfer_t *xf, srv_xcli_t *c, const char *path,
                                uint32_t timeout_ms, char *err, size_t errlen);

void srv_xcli_close(srv_xcli_t *c);

/*
 * Sends the frame in c->wr (request @id of @op) and reads its answer into
 * c->body/len: KVT_OK; the peer's status for an error answer (c->e);
 * KVT_ERR_TIMEOUT when no answer came within the timeout; KVT_ERR_PEER when
 * the connection fails or the answer is malformed.
 */
kvt_status_t srv_xcli_call(srv_xcli_t *c, uint8_t op, uint64_t id, char *err, size_t errlen);

/* Peers cached at once (the oldest goes to make room). */
#define SRV_XPEER_MAX 16

/* A peer's UCX endpoint from its XFER_HELLO. */
typedef struct srv_xpeer {
    char addr[300];
    kvt_xfer_peer_t *p;
    uint64_t inc;
    uint32_t slot_bytes, nslots;
    /* a peer on this host: its arena mapped here, and the Unix connection that watches it
     * (closed by the peer when it exits or finds the connection idle) */
    void *map;
    size_t map_len;
    int watch_fd;
} srv_xpeer_t;

/* XFER_HELLO on @c and an endpoint from it, cached (replacing @addr's old one): KVT_OK and
 * *@p_p, valid until the next srv_xpeer_* call; else as srv_xcli_call(), with @err. */
kvt_status_t srv_xpeer_hello(srv_xfer_t *xf, srv_xcli_t *c, const char *addr, srv_xpeer_t **p_p,
                             char *err, size_t errlen);

/* The cached endpoint of @addr when it has not failed, else srv_xpeer_hello(). */
kvt_status_t srv_xpeer_get(srv_xfer_t *xf, srv_xcli_t *c, const char *addr, srv_xpeer_t **p_p,
                           char *err, size_t errlen);

/* Closes @p's endpoint and forgets it. */
void srv_xpeer_drop(srv_xfer_t *xf, srv_xpeer_t *p);

/* Puts the watched connections of mapped peers in @pf (at most @max): the xfer thread wakes
 * when one closes. Returns how many. */
uint32_t srv_xpeers_watch(srv_xfer_t *xf, struct pollfd *pf, uint32_t max);

/* Forgets (and unmaps) the mapped peers whose connection closed: a peer that exited, or
 * restarted, leaves no arena of its mapped here. */
void srv_xpeers_reap(srv_xfer_t *xf);

/* Closes every cached endpoint (xfer thread, before the UCX context goes). */
void srv_xpeers_cleanup(srv_xfer_t *xf);

/* The lease time asked of the peer for a transfer of @timeout_ms: this sidecar's --lease,
 * or the transfer's time and a little more when that is shorter. */
uint32_t srv_xpeer_lease_ms(const srv_xfer_t *xf, uint32_t timeout_ms);

/* XFER_RELEASE of @lease at @p, best effort (else it expires there). */
void srv_xpeer_release(srv_xcli_t *c, const srv_xpeer_t *p, uint64_t lease);

/* Submits one batch of @op to @p and drives UCX until it ends: each entry's status in @est
 * (all of them the submit's error when it is refused). Meanwhile @lease (when not 0) at @p
 * is renewed for @lease_ms over @c every third of @lease_ms. */
void srv_xpeer_batch(srv_xfer_t *xf, srv_xpeer_t *p, kvt_xfer_op_t op, const kvt_xfer_iov_t *iov,
                     uint32_t n, kvt_status_t *est, uint32_t timeout_ms, srv_xcli_t *c,
                     uint64_t lease, uint32_t lease_ms, char *err, size_t errlen);

/* Waits @ms, driving UCX meanwhile (this thread is its only driver); renews @lease at @p
 * (when there is one) over @c for @lease_ms once *@renew_at has passed, then sets it a third
 * of @lease_ms later. */
void srv_xpeer_idle(srv_xfer_t *xf, srv_xcli_t *c, const srv_xpeer_t *p, uint64_t lease,
                    uint32_t lease_ms, uint64_t *renew_at, uint32_t ms);

/* The TRANSFER failure reason (KVT_PROTO_XFER_FAIL_*) for status @st. */
uint8_t srv_xfer_reason(kvt_status_t st);

/* A TRANSFER's answer as it is built: arrays of xc->n entries each. */
typedef struct srv_xres {
    uint64_t *transferred, *missing;
    kvt_proto_xfer_failed_t *failed;
    uint32_t nt, nm, nf;
    uint64_t bytes;
} srv_xres_t;

/* Adds @keys[0..n) to r->failed with @reason. */
void srv_xres_fail(srv_xres_t *r, const uint64_t *keys, uint32_t n, uint8_t reason);

/* TRANSFER, push (xfer_push.c): @xc's keys from here to its peer, into @r; the first
 * failure's text in @err. */
void srv_xfer_push(srv_xfer_t *xf, const srv_xfer_call_t *xc, srv_xres_t *r, char *err,
                   size_t errlen);

#endif
