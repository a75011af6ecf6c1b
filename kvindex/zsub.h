/*
 * kvindex/zsub: engines' ZMQ KV-event streams (vLLM, SGLang) applied to the
 * index, with stream health. Formats: ../shared/WIRE-FORMATS.md.
 *
 * One stream per (engine, DP rank): a SUB socket on the engine's endpoint
 * (rank r on port + r) and, when the engine has a replay endpoint, a DEALER
 * for replays. Per stream the last seq is kept:
 *  - seq = last + 1: applied;
 *  - a gap: the missing batches are asked from the replay endpoint; live
 *    batches that arrive meanwhile are held, then applied in order;
 *  - seq <= last: the engine restarted: the pod's engine-reported state
 *    (its GPU, CPU and DISK tiers on that rank) is dropped, and the stream
 *    starts over;
 *  - a gap that replay cannot fill (no replay endpoint, the buffer no longer
 *    holds it, a timeout, too many held batches) drops that state too, rather
 *    than serve hits that may be stale; failed replays back off (doubling).
 * Decoding is per event (kvindex/event.h): an event that does not decode
 * is skipped, and when it was (or may have been) a removal or a clear the
 * rank's state is dropped as for an unfilled gap. A payload that is not a
 * batch at all drops that state too (it may have held removals). A message
 * that is not [topic, seq, payload] is counted and skipped. Warnings are
 * rate-limited per stream and per kind (one line a minute each), so one
 * noisy kind never hides another.
 *
 * Single-threaded: every call runs on the index writer's thread.
 */
#ifndef KVT_KVINDEX_ZSUB_H
#define KVT_KVINDEX_ZSUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kvindex/event.h"
#include "kvindex/index.h"

#define KVT_ZSUB_MAX_ENDPOINT 255 /* bytes of an endpoint or topic */
#define KVT_ZSUB_MAX_RANKS 256

/* An engine to subscribe to (POST /v1/engines, --engine). */
typedef struct kvt_zsub_engine {
    char pod[KVT_IDX_MAX_NAME + 1];
    char model[KVT_IDX_MAX_NAME + 1];
    char endpoint[KVT_ZSUB_MAX_ENDPOINT + 1];        /* tcp://host:port, ipc://path, inproc:// */
    char replay_endpoint[KVT_ZSUB_MAX_ENDPOINT + 1]; /* "": none */
    char topic[KVT_ZSUB_MAX_ENDPOINT + 1];           /* subscription prefix; "": all */
    kvt_ev_format_t format;
    uint32_t dp_size; /* ranks 0..dp_size-1, 1..KVT_ZSUB_MAX_RANKS */
    bool bind;        /* bind the SUB and let engines dial in (also when the host is "*"); engines
                         given the same bound endpoint share it, told apart by their topics */
} kvt_zsub_engine_t;

typedef struct kvt_zsub_config {
    uint32_t default_block_size; /* for events with tokens but no block_size */
    size_t max_items;            /* hashes plus tokens in one batch */
    uint64_t max_msg_bytes;      /* larger messages are dropped by ZMQ (a gap) */
    uint64_t replay_timeout_ms;  /* a replay not ended by then has failed */
    uint64_t backoff_min_ms;     /* after a failed replay, gaps drop state this long */
    uint64_t backoff_max_ms;     /* doubling up to this */
    uint32_t max_held;           /* live batches held during a replay */
    kvt_ev_ctx_t *ev_ctx;        /* the writer's event context (groups, removed hashes); may
                                    be NULL; borrowed, must outlive the subscriber set */
    unsigned ev_flags;   /* kvt_ev_apply() flags for every stream batch (KVT_EV_LORA_DYNAMO; a
                            KVT_EV_STRICT here is dropped: streams are applied leniently) */
    const char *ipc_dir; /* ipc:// binds go here (common/ipcdir.h); NULL or "": none allowed.
                            Borrowed: must outlive the kvt_zsub_t */
} kvt_zsub_config_t;

/* Sets @cfg to the defaults (block size 16, 4 Mi items, 64 MiB, 2 s, 1 s..60 s, 10000). */
void kvt_zsub_config_default(kvt_zsub_config_t *cfg);

/* Mediums kvtier does not model, counted by name per stream (the rest in `other`). */
#define KVT_ZSUB_MEDIUM_NAMES 4

typedef struct kvt_zsub_medium {
    char name[KVT_EV_MEDIUM_NAME_MAX + 1]; /* "" for an unused entry */
    uint64_t events;
} kvt_zsub_medium_t;

/* What a stream did; counters only grow. */
typedef struct kvt_zsub_counters {
    kvt_ev_counters_t ev; /* applied, unresolved, orphans; bad events, state drops they caused,
                             remote, other groups, unknown mediums, recovered placeholders */
    uint64_t batches;     /* applied (live and replayed) */
    uint64_t ignored;     /* unknown events and fields skipped */
    uint64_t undecodable; /* batches not applied whole, the state dropped: payloads that were
                             not a batch, and batches the index refused (a hard error) */
    kvt_zsub_medium_t mediums[KVT_ZSUB_MEDIUM_NAMES]; /* events on unknown mediums, by name */
    uint64_t mediums_other;                           /* ... on further names */
    uint64_t bad_frames; /* messages not shaped [topic, seq(8), payload] */
    uint64_t gaps;       /* times a seq was missed */
    uint64_t replays;    /* replay requests sent */
    uint64_t replayed;   /* batches applied from replays */
    uint64_t replay_failures;
    uint64_t restarts;    /* seq went backwards */
    uint64_t state_drops; /* engine state dropped (restart, unfilled gap, undecodable batch;
                             bad removal events count in ev.state_drops) */
} kvt_zsub_counters_t;

/* One stream as kvt_zsub_streams() reports it. */
typedef struct kvt_zsub_stream_info {
    char pod[KVT_IDX_MAX_NAME + 1];
    char model[KVT_IDX_MAX_NAME + 1];
    char endpoint[KVT_ZSUB_MAX_ENDPOINT + 1]; /* this rank's; the bound address when bound */
    uint32_t rank;
    const char *state; /* "waiting" (no batch yet), "live", "replaying"; static */
    bool have_seq;
    uint64_t last_seq;
    kvt_zsub_counters_t c;
} kvt_zsub_stream_info_t;

typedef struct kvt_zsub kvt_zsub_t;

/* Creates the subscriber set for @idx (borrowed; must outlive it). KVT_ERR_NO_MEM, KVT_ERR_IO. */
kvt_status_t kvt_zsub_create(kvt_idx_t *idx, const kvt_zsub_config_t *cfg, kvt_zsub_t **z_p);

/* Closes every socket and frees @z (NULL is fine). Index entries stay. */
void kvt_zsub_destroy(kvt_zsub_t *z);

/*
 * Subscribes to engine @e: opens and connects (or binds) its streams. A
 * bind on an endpoint another engine bound (the same text, a fixed port)
 * shares that socket: every engine on it needs a topic that no other's
 * starts, and each message goes to the engine whose topic starts its topic.
 * Returns KVT_OK, KVT_ERR_INVAL (a bad field, a clashing topic, or an
 * endpoint ZMQ will not bind or connect, e.g. an address in use: @err says
 * which), KVT_ERR_EXISTS (the pod is already subscribed), KVT_ERR_LIMIT (too
 * many streams), KVT_ERR_IO (no ZMQ socket could be made) or KVT_ERR_NO_MEM;
 * every error with a one-line reason in @err (@errlen bytes, common/errtext.h).
 * On error nothing is left open.
 */
kvt_status_t kvt_zsub_add(kvt_zsub_t *z, const kvt_zsub_engine_t *e, char *err, size_t errlen);

/* Unsubscribes from @pod's streams; true when it was subscribed. Index entries stay. */
bool kvt_zsub_remove(kvt_zsub_t *z, const char *pod);

/* Whether engine @pod is subscribed (its streams feed the index). */
bool kvt_zsub_subscribed(const kvt_zsub_t *z, const char *pod);

/*
 * Waits up to @timeout_ms (-1: no limit; shortened to the next replay
 * deadline) for messages on every stream or for @fd (-1: none) to become
 * readable, then applies what arrived (a bounded number of messages per
 * stream, so @fd is not starved). Returns 1 when @fd is readable, 0 when not,
 * KVT_ERR_IO when polling failed (EINTR returns 0), KVT_ERR_NO_MEM when its
 * poll list could not grow for streams added since the last call (nothing
 * was polled; the next call tries again).
 */
int kvt_zsub_poll(kvt_zsub_t *z, int fd, long timeout_ms);

/* Streams (all engines, rank order) into @out[0..cap); returns how many exist. */
size_t kvt_zsub_streams(const kvt_zsub_t *z, kvt_zsub_stream_info_t *out, size_t cap);

/* Whether @e binds its SUB (engines dial in): "bind", or a tcp endpoint on host "*". */
bool kvt_zsub_engine_binds(const kvt_zsub_engine_t *e);

/*
 * The publisher: kvtierd's own changes as a vLLM KV-event stream, so that
 * another kvtierd (index role), llm-d or Dynamo can subscribe to it.
 * Messages are [topic "kv@<pod>@<model>", seq (8 bytes BE), payload]; the
 * payload is a positional batch [ts, events, dp_rank] with uint64 hashes (the
 * form every consumer reads; docs/api.md gives the slots); one seq counter
 * for the whole stream, from 0.
 * A ROUTER on @replay_endpoint (may be "") answers [b"", start_seq] with the
 * buffered batches from start_seq as [b"", seq, payload] and then
 * [b"", 0xff x 8, b""] (the <= v0.25 layout). At most @buffer_steps batches
 * are kept. Endpoints are bound ("tcp://127.0.0.1:*" picks a port).
 * Returns KVT_OK, KVT_ERR_EXISTS (already open), KVT_ERR_INVAL, KVT_ERR_IO or
 * KVT_ERR_NO_MEM, each with a one-line reason in @err (@errlen bytes,
 * common/errtext.h); nothing is left open on error.
 */
kvt_status_t kvt_zsub_publish_open(kvt_zsub_t *z, const char *endpoint, const char *replay_endpoint,
                                   uint32_t buffer_steps, char *err, size_t errlen);

/*
 * Publishes @b (decoded from any source) as the next batch: its events but
 * those kvt_ev_apply() skips for what they are (KVT_EV_BAD, an unknown
 * medium, REMOTE); placeholders and stores of groups kvtier does not index
 * are kept. Returns KVT_OK, KVT_ERR_IO (ZMQ refused it: the batch still takes
 * its seq and sits in the buffer, so subscribers see a gap they can replay)
 * or KVT_ERR_NO_MEM (it could not be encoded: nothing is sent or buffered,
 * but its seq is spent, so subscribers see a gap that no replay fills and
 * drop the pod's state). Both count in send_failures. A no-op without a
 * publisher.
 */
kvt_status_t kvt_zsub_publish(kvt_zsub_t *z, const kvt_evbatch_t *b);

/* What the publisher did. */
typedef struct kvt_zsub_pub_info {
    bool open;
    char endpoint[KVT_ZSUB_MAX_ENDPOINT + 1]; /* as bound */
    char replay_endpoint[KVT_ZSUB_MAX_ENDPOINT + 1];
    uint64_t batches;       /* published; the next seq */
    uint64_t send_failures; /* batches ZMQ refused (buffered anyway) or not encoded (memory:
                               not buffered, their seq spent) */
    uint64_t replays;       /* replay requests answered */
    uint64_t replayed;      /* batches sent in replays */
    uint64_t bad_requests;  /* replay requests not shaped [b"", seq(8)] */
    uint32_t buffered;      /* batches in the replay buffer */
} kvt_zsub_pub_info_t;

void kvt_zsub_publish_info(const kvt_zsub_t *z, kvt_zsub_pub_info_t *info);

/*
 * Decodes a POST /v1/engines body into *@e:
 *   {"pod": str, "model": str, "endpoint": str, "replay_endpoint"?: str|null,
 *    "topic"?: str|null, "format"?: "vllm"|"sglang" (default vllm),
 *    "dp_size"?: uint, "bind"?: bool}
 * Checks what can be checked without ZMQ (names, lengths, transports, the
 * port for dp_size > 1). Returns KVT_OK, KVT_ERR_PARSE (not JSON) or
 * KVT_ERR_INVAL (a wrong or missing field, unknown fields included), with a
 * one-line reason in @err; *@e is untouched on error.
 */
kvt_status_t kvt_zsub_engine_json_decode(const char *body, size_t len, kvt_zsub_engine_t *e,
                                         char *err, size_t errlen);

/* Checks @e as kvt_zsub_engine_json_decode() does; KVT_ERR_INVAL with a reason. */
kvt_status_t kvt_zsub_engine_check(const kvt_zsub_engine_t *e, char *err, size_t errlen);

#endif
