/*
 * server/xfer_int.h: the transfer's private state (server/xfer_*.c).
 *
 * Leases: a peer's pins (XFER_PIN) or reservations (XFER_RESERVE) are held
 * in a tier session of their own, one per lease id, in a small table under
 * one mutex. A handler takes a lease (busy count) while it uses the session
 * outside the mutex; a lease released or expired while busy is closed by its
 * last user. Expiry is lazy: every table operation drops the idle leases past
 * their deadline (the tier expired their pins and reservations already).
 */
#ifndef KVT_SERVER_XFER_INT_H
#define KVT_SERVER_XFER_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "server/srv_int.h"
#include "server/xfer.h"
#include "tiers/tiers.h"
#include "transfer/transfer.h"

#define SRV_XFER_MAX_LEASES 4096u

/* A reservation a lease holds: what XFER_COMMIT needs that its frame does not carry. */
typedef struct srv_resv {
    uint64_t key;
    uint32_t slot;
    uint32_t len; /* bytes the peer said it will write */
} srv_resv_t;

typedef struct srv_lease {
    struct srv_lease *next;
    struct srv_xfer *xf;
    uint64_t id;
    kvt_tier_sess_t *sess;
    uint64_t deadline_ns;     /* the last renewal plus its lease time */
    uint32_t busy;            /* handlers using the session now */
    bool doomed;              /* released or expired while busy: the last user closes it */
    char ns[KVT_TIER_NS_MAX]; /* the reservations' namespace (XFER_RESERVE) */
    size_t ns_len;            /* 0: none yet */
    srv_resv_t *resv;         /* sorted by key */
    size_t nresv, resv_cap;
} srv_lease_t;

typedef struct srv_xfer {
    kvt_srv_t *srv;
    kvt_tier_t *tier;
    /* the handshake, fixed once the thread started */
    uint8_t *addr, *rkey;
    size_t addr_len, rkey_len;
    uint64_t base; /* address of slot 0 */
    uint32_t slot_bytes, nslots, block_bytes;
    char host[64];       /* the kernel's boot id: peers with the same one share this host */
    char unix_path[256]; /* --rpc-unix, absolute; "" when off */

    /* leases */
    pthread_mutex_t mu;
    srv_lease_t *leases;
    uint32_t nleases;
    uint64_t next_lease;

    /* the xfer thread: owns x; takes TRANSFER jobs from inbox, woken through job_efd */
    pthread_t thread;
    bool thread_on;
    kvt_xfer_t *x;
    int job_efd;
    srv_mbox_t inbox;
    atomic_bool stop;
    pthread_mutex_t start_mu;
    pthread_cond_t start_cv;
    int start_state; /* 0 starting, 1 running, -1 failed */
    void *peers;     /* xfer_run.c's peer cache (xfer thread) */

    /* counters (relaxed atomics) */
    atomic_uint_fast64_t leases_opened, leases_expired, pinned_keys, reserved_keys, committed,
        commit_bad_sum;
    atomic_uint_fast64_t transfers, transferred, missing, failed, bytes, handshakes, renewals,
        mapped_peers;
} srv_xfer_t;

/* What a job of the transfer carries (XFER_PIN, TRANSFER). */
typedef struct srv_xfer_call {
    srv_lease_t *lease; /* XFER_PIN: taken (busy) until the pin completes */
    uint32_t lease_ms;
    char ns[KVT_TIER_NS_MAX];
    size_t ns_len;
    uint64_t *keys;
    uint32_t n;
    /* TRANSFER */
    char peer[300];
    char model[256], lora[256];
    uint8_t direction;
    bool stream; /* a push that waits for keys not held yet (KVT_PROTO_XFER_STREAM) */
    uint32_t timeout_ms;
    bool http; /* POST /v1/transfer: answer in JSON (srv_xfer_answer) */
} srv_xfer_call_t;

/* ---- leases (xfer_src.c) ---- */

/* Ends one use of @l taken by srv_lease_get() or srv_lease_new(). */
void srv_lease_put(srv_lease_t *l);

/* Drops every lease (their sessions close now or with their last user). */
void srv_xfer_leases_close(srv_xfer_t *xf);

/* Leases held now. */
uint32_t srv_xfer_nleases(srv_xfer_t *xf);

/* ---- answering a job of the transfer (xfer_src.c) ---- */

/* Sets @job's error answer. */
void srv_xjob_error(srv_job_t *job, kvt_status_t st, int http, const char *msg);

/* Sets @job's answer to the body of the one frame in @wr (its header dropped: the front end
 * writes its own), or an out-of-memory error. */
void srv_xjob_frame(srv_job_t *job, const kvt_proto_wr_t *wr);

/* Posts @job, answered, to its worker's box. */
void srv_xjob_post(srv_job_t *job);

/* The transfer, or NULL with a 501 answer in @res when this kvtierd takes no part in them. */
srv_xfer_t *srv_xfer_or_error(srv_req_t *rq, srv_result_t *res);

/* Answers @rq asynchronously with the TRANSFER @xc (its keys decoded) as @job: the xfer thread
 * runs it (xfer_pull.c). */
void srv_xfer_accept(srv_req_t *rq, srv_result_t *res, srv_job_t *job, srv_xfer_call_t *xc);

/* Hands a TRANSFER job to the xfer thread (the OUT_ASYNC start of RPC TRANSFER and POST
 * /v1/transfer; xfer_pull.c). */
void srv_xfer_start_job(srv_job_t *job);

/* A TRANSFER's answer @a into @job: the frame's body, or for POST /v1/transfer its JSON
 * (xfer_http.c). */
void srv_xfer_answer(srv_job_t *job, const kvt_proto_transfer_ans_t *a);

/* ---- the thread (xfer_run.c) ---- */

/* Starts the thread and waits until it has the UCX context, or failed (KVT_ERR_UNSUPPORTED). */
kvt_status_t srv_xfer_thread_start(srv_xfer_t *xf, char *err, size_t errlen);

/* Stops and joins it; its UCX context is destroyed. */
void srv_xfer_thread_stop(srv_xfer_t *xf);

#endif
