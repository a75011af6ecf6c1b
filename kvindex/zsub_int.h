/*
 * kvindex/zsub_int.h: what the files of the ZMQ streams share: zsub.c
 * (subscriptions, streams, replay, polling), zsub_spec.c (engine specs and
 * their JSON), zsub_pub.c (kvtierd's own event stream). Private to kvindex.
 */
#ifndef KVT_KVINDEX_ZSUB_INT_H
#define KVT_KVINDEX_ZSUB_INT_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "kvindex/zsub.h"

enum { ZS_WAITING, ZS_LIVE, ZS_REPLAYING };

#define ZS_END_SEQ UINT64_MAX /* seq of the replay's end marker: 8 bytes of 0xff */
#define ZS_BUDGET 256         /* messages per socket per poll round */
#define ZS_LOG_EVERY_NS 60000000000ull

/* Kinds of stream warnings, each rate-limited on its own. */
enum {
    ZW_FRAME,       /* a message not shaped [topic, seq, payload] */
    ZW_UNDECODABLE, /* a payload that is not a batch */
    ZW_BAD_EVENT,   /* a store that does not decode or apply: skipped */
    ZW_BAD_REMOVAL, /* an event that may have been a removal does not decode: state dropped */
    ZW_MEDIUM,      /* events on a medium kvtier does not model */
    ZW_APPLY,       /* the index refused a batch (memory, limits) */
    ZW_GAP,         /* missed batches */
    ZW_RESTART,     /* seq went back */
    ZW_REPLAY,      /* a replay failed */
    ZW_KINDS
};

typedef struct zs_held {
    uint64_t seq;
    size_t len;
    void *data; /* malloc'd copy of the payload */
} zs_held_t;

typedef struct zs_engine zs_engine_t;
typedef struct zs_stream zs_stream_t;

/*
 * A SUB socket: one stream's own, or shared by the engines that dial into one
 * bound endpoint (llm-d's layout: every engine connects to the indexer's port
 * and names itself in the topic). A shared socket's messages go to the stream
 * whose topic starts the message's topic; topics there may not prefix one another.
 */
typedef struct zs_sock {
    void *sock;
    char want[KVT_ZSUB_MAX_ENDPOINT + 1]; /* the endpoint as asked: later binds match it */
    char addr[KVT_ZSUB_MAX_ENDPOINT + 1]; /* as connected or bound */
    bool bound;
    void *mon;       /* PAIR reading the SUB's disconnect events (connecting SUBs only), or NULL */
    uint64_t log_ns; /* rate limit of its warnings */
    zs_stream_t **streams; /* those reading it */
    size_t n, cap;
} zs_sock_t;

struct zs_stream {
    zs_engine_t *eng;
    uint32_t rank;
    zs_sock_t *sub;
    void *dealer; /* NULL until a replay is needed; closed after a failed one */
    char endpoint[KVT_ZSUB_MAX_ENDPOINT + 1];
    char replay_endpoint[KVT_ZSUB_MAX_ENDPOINT + 1]; /* "": none */
    int state;
    bool have_seq;
    uint64_t last_seq;
    uint64_t replay_target; /* the replay is whole once last_seq reaches it */
    uint64_t replay_from;   /* first seq asked; held batches in [from, last_seq] came by replay */
    bool dups;              /* replay_from is in effect (until the next batch in order) */
    uint64_t replay_deadline_ns;
    uint64_t backoff_ms, backoff_until_ns;
    zs_held_t *held; /* FIFO: [head, head + n) of cap */
    size_t held_head, held_n, held_cap;
    uint64_t log_ns[ZW_KINDS], log_quiet[ZW_KINDS]; /* rate limit of warnings, per kind */
    kvt_zsub_counters_t c;
};

struct zs_engine {
    kvt_zsub_engine_t spec;
    zs_stream_t *streams; /* [spec.dp_size] */
};

/* The publisher (kvt_zsub_publish_open()). */
typedef struct zs_pub {
    void *pub, *router; /* router NULL without a replay endpoint */
    kvt_zsub_pub_info_t info;
    zs_held_t *ring; /* the last info.buffered batches, oldest at head */
    uint32_t cap, head;
    msgpack_sbuffer sb; /* encoding scratch */
} zs_pub_t;

struct kvt_zsub {
    kvt_idx_t *idx;
    zs_pub_t *pub;
    kvt_zsub_config_t cfg;
    void *ctx;
    zs_engine_t **eng;
    size_t neng, eng_cap;
    zs_sock_t **socks; /* every SUB */
    size_t nsocks, socks_cap;
    uint64_t unmatched, unmatched_log_ns; /* shared-socket messages no stream's topic starts */
    zmq_pollitem_t *items;                /* scratch for kvt_zsub_poll() */
    zs_stream_t **item_stream;            /* the DEALER's stream, or NULL */
    zs_sock_t **item_sock;                /* the SUB, or NULL */
    size_t items_cap;
};

/* ---- engine specs: zsub_spec.c ---- */

/* Checks one endpoint field: a transport kvtier speaks, and a port when ranks need one. */
kvt_status_t kvt_zsub_check_endpoint(const char *what, const char *ep, uint32_t dp_size, char *err,
                                     size_t errlen);

/* Rank @rank's copy of @ep: the port plus the rank for tcp, else @ep itself. */
void kvt_zsub_rank_endpoint(const char *ep, uint32_t rank, char *out, size_t cap);

/* ---- streams: zsub.c ---- */

void kvt_zsub_sock_close(void **sock);

/* Reads one whole multipart message into @f (at most @cap frames); returns the count or -1. */
int kvt_zsub_msg_recv(void *sock, zmq_msg_t *f, int cap, bool *more_frames_p);

bool kvt_zsub_msg_seq(zmq_msg_t *m, uint64_t *seq_p);

/* ---- the publisher: zsub_pub.c ---- */

void kvt_zsub_pub_free(zs_pub_t *p);

/* Answers replay requests [id, "", start_seq(8)] waiting on the ROUTER. */
void kvt_zsub_pub_serve(zs_pub_t *p);

#endif
