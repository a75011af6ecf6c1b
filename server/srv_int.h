/*
 * server private layout. docs/architecture.md ("kvtierd threads") explains it:
 *
 * - N worker threads, each with its own libevent base and its own listening
 *   sockets (SO_REUSEPORT: the kernel spreads connections), serve HTTP and
 *   the binary RPC. Queries run entirely on the worker, through the worker's
 *   own index reader: no lock shared with the writer.
 * - One writer thread owns every write to the index. Workers hand it jobs
 *   (decoded event batches, engine adds and drops) through a mutex-protected
 *   mailbox (mailbox.h) woken by an eventfd; the writer polls that eventfd
 *   together with the engines' ZMQ event streams (kvindex/zsub), which it
 *   applies itself; the writer posts each answer to its worker's box, which
 *   wakes the worker's base. Acknowledged means applied.
 * - Names (pods, namespaces) the workers resolve through the index itself
 *   (kvt_idx_names_publish(), kvt_idx_read_begin()); counters for
 *   /v1/stats and /metrics are a copy published every stats period under a
 *   mutex that queries never take. Their answer bodies are encoded once per
 *   published copy and shared by every request (srv_blob_t).
 */
#ifndef KVT_SERVER_SRV_INT_H
#define KVT_SERVER_SRV_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>

#include "common/ipcdir.h"
#include "common/json.h"
#include "common/u64map.h"
#include "kvindex/event.h"
#include "kvindex/index.h"
#include "kvindex/score.h"
#include "kvindex/zsub.h"
#include "proto/proto.h"
#include "server/mailbox.h"
#include "server/srv.h"

typedef struct kvt_srv_worker kvt_srv_worker_t;
typedef struct kvt_srv_conn kvt_srv_conn_t;

/* ---- metrics ---------------------------------------------------------------- */

enum srv_call {
    CALL_HEALTHZ,
    CALL_READYZ,
    CALL_METRICS,
    CALL_STATS,
    CALL_EVENTS,
    CALL_QUERY,
    CALL_ENGINES,
    CALL_MODELS,
    CALL_ROUTED, /* POST /v1/routed; ROUTED */
    CALL_HELLO,
    CALL_PING,
    CALL_BLOCKS,   /* PUT, GET, DELETE /v1/blocks/{key}; BLOCK_PUT, BLOCK_GET, BLOCK_DELETE */
    CALL_PREFETCH, /* POST /v1/prefetch; PREFETCH */
    CALL_ATTACH,   /* the engine's data plane (RPC only) */
    CALL_LOOKUP,
    CALL_RESERVE,
    CALL_COMMIT,
    CALL_PIN,
    CALL_UNPIN,
    CALL_XFER,     /* a peer's XFER_HELLO..XFER_COMMIT (RPC only) */
    CALL_TRANSFER, /* TRANSFER */
    CALL_OTHER,
    NCALLS
};
enum srv_proto { PROTO_HTTP, PROTO_RPC, NPROTOS };
enum srv_class { CLASS_2XX, CLASS_4XX, CLASS_5XX, NCLASSES };
#define NBUCKETS 18 /* latency histogram: bounds in metrics.c, +Inf last */

/*
 * An answer body encoded once and shared by every request for it until the
 * writer publishes new counters or --stats-period passes (GET /v1/stats and
 * RPC STATS, GET /metrics):
 * immutable once made; each holder (the server's cache slot, every output
 * buffer that still has to send it) owns one reference, and the last drop
 * frees it. Sending it costs a reference, not a copy or an encoding.
 */
typedef struct srv_blob {
    atomic_uint refs;
    uint64_t gen;     /* kvt_srv_t.st_gen of the counters it shows */
    uint64_t made_ns; /* when it was encoded: renewed after --stats-period even if gen stays */
    size_t len;       /* bytes of data */
    char data[];
} srv_blob_t;

enum srv_blob_kind { BLOB_STATS, BLOB_METRICS, NBLOBS };

/* Per-worker counters: written by that worker only (relaxed atomics), summed at scrape. */
typedef struct srv_counters {
    uint64_t requests[NPROTOS][NCALLS][NCLASSES];
    uint64_t hist[NPROTOS][NCALLS][NBUCKETS];
    uint64_t lat_sum_ns[NPROTOS][NCALLS];
    uint64_t conns_accepted[NPROTOS];
    uint64_t conns_refused[NPROTOS]; /* over --max-connections */
    uint64_t timeouts[NPROTOS];
    uint64_t bad_frames; /* connection-fatal RPC errors */
} srv_counters_t;

/* A counter of the calling worker (others read it at scrape time). */
#define CTR_INC(x) __atomic_fetch_add(&(x), 1, __ATOMIC_RELAXED)

/* ---- jobs for the writer ---------------------------------------------------- */

typedef enum job_kind {
    JOB_EVENTS = 1,
    JOB_DROP,
    JOB_ENGINE_ADD,
    JOB_MODEL_DROP,
    JOB_TIER_CHANGES, /* the tier's changes for the index and the publisher (no connection) */
    JOB_TIER,         /* a tier call that answers later (server/blocks.c); not for the writer */
    JOB_ROUTED,       /* a router's decision: speculative entries (POST /v1/routed, ROUTED) */
} job_kind_t;

struct srv_tier_call;
struct srv_xfer_call;

/* JOB_ROUTED: where a router sent a request, keyed as the worker hashed it. */
typedef struct srv_routed {
    char model[KVT_IDX_MAX_NAME + 1];
    char lora[KVT_IDX_MAX_NAME + 1]; /* "" for the base model */
    uint32_t block_size;             /* tokens; the namespace's, or --block-size for a new one */
    uint32_t dp_rank;
    uint32_t ttl_ms; /* 1..KVT_SRV_ROUTED_MAX_TTL_MS */
    size_t n;        /* keys */
    uint64_t keys[]; /* the chain from block 0 */
} srv_routed_t;

typedef struct srv_job {
    struct srv_job *next;
    job_kind_t kind;
    kvt_srv_worker_t *worker;        /* whose done-queue gets the answer */
    kvt_srv_conn_t *conn;            /* holds a reference until the answer is delivered */
    uint64_t req_id;                 /* RPC request id (0 for HTTP) */
    uint64_t t0_ns;                  /* for the latency histogram */
    enum srv_call call;              /* the route\'s, for metrics */
    uint8_t op;                      /* the route\'s RPC opcode (for the answer frame) */
    kvt_evbatch_t batch;             /* JOB_EVENTS, JOB_TIER_CHANGES; owned */
    bool engine_keys;                /* JOB_TIER_CHANGES: the keys are engine-hash ids */
    char name[KVT_IDX_MAX_NAME + 1]; /* JOB_DROP, JOB_ROUTED: the pod; JOB_MODEL_DROP: the model */
    kvt_zsub_engine_t *engine;       /* JOB_ENGINE_ADD; owned */
    struct srv_tier_call *tc;        /* JOB_TIER; owned */
    struct srv_xfer_call *xc;        /* JOB_TIER of server/xfer_*.c; owned */
    srv_routed_t *routed;            /* JOB_ROUTED; owned */
    const char *ctype;               /* HTTP content type of the answer; NULL: JSON */
    /* the writer's answer */
    int http_status;
    kvt_status_t st;
    kvt_jbuf_t answer; /* JSON body */
    char errmsg[320];  /* plain-text reason when http_status is not 200 (RPC error body) */
} srv_job_t;

/* ---- threads ---------------------------------------------------------------- */

typedef struct listen_arg {
    kvt_srv_worker_t *w;
    enum srv_proto proto; /* NPROTOS: the Unix socket (RPC) */
} listen_arg_t;

struct kvt_srv_worker {
    kvt_srv_t *srv;
    int id;
    pthread_t thread;
    struct event_base *base;
    struct evconnlistener *l_http, *l_rpc, *l_unix;
    listen_arg_t listen_args[3];
    kvt_srv_conn_t *conns; /* open connections, for shutdown */
    struct event *wake;    /* activated by posts to box and by stop */
    kvt_idx_reader_t *reader;
    /* jobs the writer finished, and sockets other workers accepted for this one */
    srv_mbox_t box;
    /* query scratch, grown as needed */
    uint64_t *keys;
    size_t keys_cap;
    uint32_t *tokens;
    size_t tokens_cap;
    uint32_t *filter;
    size_t filter_cap;
    kvt_scored_t *scored;
    kvt_idx_pod_view_t *views; /* the names of scored[i], for the answer */
    size_t scored_cap;         /* of both */
    kvt_jbuf_t out;            /* answer scratch */
    kvt_proto_wr_t rpc_out;    /* RPC answers not yet sent, all for rpc_owner */
    kvt_srv_conn_t *rpc_owner; /* NULL while rpc_out is empty */
    srv_counters_t ctr;
};

struct kvt_srv {
    kvt_srv_config_t cfg;
    char *auth_token; /* NULL: no token required */
    kvt_idx_t *idx;
    kvt_score_weights_t weights;
    int nworkers;
    kvt_srv_worker_t *workers;
    int fd_http, fd_rpc, fd_unix; /* the first listeners (port known before workers start) */
    uint16_t http_port, rpc_port;
    atomic_int nconns;
    atomic_int nprobes; /* connections in the probe reserve (over --max-connections) */
    atomic_bool stopping;
    atomic_bool draining;    /* stop asked: /readyz says not ready */
    uint64_t writer_beat_ns; /* when the writer last came round its loop (atomic); 0: not yet */
    char ipc_dir[KVT_IPCDIR_MAX_PATH + 1]; /* canonical; "" when ipc binds are off */
    atomic_uint next_worker;               /* round-robin target for the next accepted connection */
    uint64_t started_ns;
    double started_wall_s; /* the same instant, seconds since the epoch */

    /* writer */
    pthread_t writer;
    kvt_zsub_t *zsub;     /* engines' event streams, polled by the writer */
    kvt_ev_ctx_t *ev_ctx; /* what applying events remembers across batches (writer) */
    int q_efd;            /* eventfd: a post to inbox wakes the writer's poll */
    srv_mbox_t inbox;     /* write jobs from the workers (--writer-queue); closed at stop */
    bool inbox_ready;     /* inbox initialised (srv_writer_init()) */

    /* published counters (stats_mu); written by the writer every stats period */
    pthread_mutex_t stats_mu;
    kvt_idx_stats_t st_idx;
    kvt_ev_counters_t st_ev; /* writer-only running total, copied below */
    kvt_ev_counters_t st_ev_pub;
    uint64_t st_batches, st_batches_pub;     /* event batches applied */
    uint64_t st_rejected, st_rejected_pub;   /* batches refused as bad input */
    uint64_t st_drops, st_drops_pub;         /* engines dropped */
    uint64_t st_forgotten, st_forgotten_pub; /* idle, empty pods and namespaces forgotten */
    kvt_zsub_pub_info_t st_pub;              /* the publisher, published copy */
    kvt_ev_ctx_stats_t st_evctx;             /* removed-block mappings, published copy */
    uint64_t *st_pod_entries;                /* per pod id, published copy */
    uint32_t st_npods;
    kvt_zsub_stream_info_t *st_streams; /* engines' streams, published copy */
    size_t st_nstreams;
    uint64_t st_gen; /* bumped by every publish (written under stats_mu, read atomically) */

    /* the sidecar's own tiers (server/tier.c); NULL when --ram-bytes is 0 */
    struct kvt_tier *tier;
    char *pod;                      /* this sidecar's pod (--pod): tier changes are its */
    atomic_uint_fast64_t tier_lost; /* tier changes the writer's queue could not take */
    atomic_uint_fast64_t tier_unresolved; /* tier_pending's entries, for the stats */
    kvt_u64map_t tier_pending; /* writer: engine key -> tiers --pod has not reported it in */
    size_t tier_pending_cursor;
    uint64_t tier_pending_ns;  /* writer: the last retry (kvt_clock_ns()) */
    uint64_t incarnation;           /* drawn at start (getrandom), never 0: names this run */
    struct srv_xfer *xfer; /* the transfer (server/xfer.h); NULL: --ucx off, no tiers, no UCX */

    /* answer bodies shared within one st_gen (srv_blob_t) */
    pthread_mutex_t blob_mu;
    srv_blob_t *blobs[NBLOBS];
};

/*
 * Probe reserve: HTTP connections past --max-connections still get one of
 * these slots, for GET /healthz and GET /readyz only (anything else: 503),
 * so a liveness probe answers while clients hold every ordinary slot. One
 * request each (Connection: close), no body, and a deadline of
 * min(--request-timeout, SRV_PROBE_TIMEOUT_MS): a probe sends its request at once.
 */
#define SRV_PROBE_SLOTS 16
#define SRV_PROBE_TIMEOUT_MS 1000u

/* Frees @job (its batch, answer and engine). NULL is a no-op. Any thread. (mailbox.c) */
void srv_job_free(srv_job_t *job);

#endif
