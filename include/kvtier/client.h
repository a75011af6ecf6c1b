/*
 * libkvtier: the C client of kvtierd's binary RPC (docs/protocol.md,
 * docs/client.md), for routers (queries, events) and engines (the tiers).
 * Link with -lkvtier (pkg-config kvtier, or CMake
 * find_package(kvtier) and target kvtier::kvtier).
 *
 * A kvt_client_t is one connection to one kvtierd, over TCP ("host:port") or
 * a Unix socket ("unix:/path"). Calls use blocking semantics with poll()
 * timeouts; the library starts no thread and installs no signal handler
 * (writes use MSG_NOSIGNAL). A client is not thread-safe: use one per thread,
 * or serialize calls. Different clients are independent.
 *
 * Connection life: every (re)connect sends HELLO (with the auth token when
 * one is set) and learns the server's frame limit. A refused token fails the
 * connect; without a token, a server that has one refuses the HELLO (401) but
 * still serves reads, so the client carries on (mutating calls then fail with
 * the server's 401). A call that finds the
 * connection broken closes it; the next call reconnects. Idempotent calls
 * (query, stats, ping and the tier calls named below) are retried once, on a
 * fresh connection, when a reused connection fails before the answer
 * arrives; report_events and drop_engine are never retried (they may or may
 * not have been applied).
 *
 * Errors: every function returns a kvt_status_t (common/status.h, installed
 * as kvtier/common/status.h): the server's own status for an error answer,
 * KVT_ERR_IO (connect/read/write failure), KVT_ERR_TIMEOUT, KVT_ERR_CLOSED
 * (the server closed the connection), KVT_ERR_PROTO (the server's bytes broke
 * the protocol), KVT_ERR_INVAL (bad argument), KVT_ERR_TOO_BIG (request over
 * the server's frame limit), KVT_ERR_NO_MEM. kvt_client_last_error() gives a
 * one-line message for the last failure.
 *
 * Sync and async: the blocking calls and the submit/progress pair share the
 * connection. A blocking call refuses to run (KVT_ERR_INVAL) while submitted
 * queries are still in flight.
 */
#ifndef KVTIER_CLIENT_H
#define KVTIER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default RPC address of kvtierd. */
#define KVT_CLIENT_DEFAULT_ADDR "127.0.0.1:7420"
/* Size of a pod name buffer in a result (names are at most 255 bytes + NUL). */
#define KVT_CLIENT_POD_NAME_SIZE 256

typedef struct kvt_client kvt_client_t;

typedef struct kvt_client_opts {
    const char *address;    /* "host:port", "[v6]:port" or "unix:/path"; NULL: the default */
    int connect_timeout_ms; /* per connect + HELLO; <= 0: 1000 */
    int io_timeout_ms;      /* per call, send to answer; <= 0: 1000 */
    const char *auth_token; /* sent in HELLO; NULL or "": none. At most 255 bytes */
    bool lazy_connect;      /* true: create does not connect; the first call does */
} kvt_client_opts_t;

/* One pod of a query answer. */
typedef struct kvt_client_pod {
    char pod[KVT_CLIENT_POD_NAME_SIZE]; /* NUL-terminated engine name */
    uint32_t dp_rank;                   /* data-parallel rank */
    uint32_t matched;                   /* consecutive blocks from block 0 held in any tier */
    uint32_t gpu, cpu, disk;            /* of those, blocks whose fastest tier is GPU/CPU/DISK */
    double score;                       /* higher is better */
} kvt_client_pod_t;

/* A query answer. Filled by the query calls; release with kvt_client_result_free(). */
typedef struct kvt_client_result {
    uint32_t block_size;    /* tokens per block of the model */
    uint32_t num_blocks;    /* full blocks in the query */
    size_t npods;           /* entries in pods */
    kvt_client_pod_t *pods; /* best first; malloc'd, NULL when npods is 0 */
    size_t answered;        /* fan-out: sidecars that answered (1 for a single query) */
    size_t asked;           /* fan-out: sidecars asked (1 for a single query) */
} kvt_client_result_t;

/* Fills @o with the defaults (default address, 1000 ms timeouts, no token, eager connect). */
void kvt_client_opts_default(kvt_client_opts_t *o);

/*
 * Creates a client for @o (NULL: defaults); the strings in @o are copied.
 * Unless o->lazy_connect, connects and says HELLO before returning.
 * Returns KVT_OK and sets *@c_p; or KVT_ERR_INVAL (bad address or token),
 * KVT_ERR_NO_MEM, or a connect/HELLO failure (KVT_ERR_IO, KVT_ERR_TIMEOUT,
 * KVT_ERR_CLOSED, KVT_ERR_PROTO, the server's status such as a 401's).
 * On failure nothing is allocated. kvt_client_create_msg() also writes the
 * failure's message, one line, to the caller's buffer @err of @errlen bytes
 * (cut to fit, NUL-terminated; @errlen 0 and @err NULL: no message), the way
 * every kvtier function hands back error text.
 */
kvt_status_t kvt_client_create(const kvt_client_opts_t *o, kvt_client_t **c_p);
kvt_status_t kvt_client_create_msg(const kvt_client_opts_t *o, kvt_client_t **c_p, char *err,
                                   size_t errlen);

/* Closes the connection and frees @c (NULL is a no-op). Queries still in flight are
 * dropped without callbacks. */
void kvt_client_destroy(kvt_client_t *c);

/* The message of the last failure on @c (owned by @c, valid until the next
 * call on it); "" when there was none. Inside a progress callback: the message of
 * the request being completed. */
const char *kvt_client_last_error(const kvt_client_t *c);

/* ---- blocking calls ------------------------------------------------------------------------- */

/*
 * Asks which pods hold the longest prefix of @tokens[0..@n) (u32 token ids;
 * kvtierd hashes them with the model's block size) of @model (1..255 bytes)
 * with LoRA @lora (NULL or "": base model). @pods/@npods: restrict the answer
 * to these pod names (NULL/0: every pod). On KVT_OK fills *@res_p, which the
 * caller releases with kvt_client_result_free(); on failure *@res_p is untouched.
 */
kvt_status_t kvt_client_query(kvt_client_t *c, const char *model, const char *lora,
                              const uint32_t *tokens, size_t n, const char *const *pods,
                              size_t npods, kvt_client_result_t *res_p);

/*
 * kvt_client_query() for a request that carries a cache salt (vLLM's and
 * SGLang's per-request `cache_salt`, tenant isolation): @cache_salt
 * (NUL-terminated, at most 255 bytes; NULL or "": no salt, exactly
 * kvt_client_query()) enters the block keys, so only prefixes stored with the
 * same salt match (docs/api.md, "POST /v1/query"). Sent as QUERY kind 2
 * (docs/protocol.md). KVT_ERR_INVAL for a salt over 255 bytes; otherwise as
 * kvt_client_query().
 */
kvt_status_t kvt_client_query_salted(kvt_client_t *c, const char *model, const char *lora,
                                     const char *cache_salt, const uint32_t *tokens, size_t n,
                                     const char *const *pods, size_t npods,
                                     kvt_client_result_t *res_p);

/* kvt_client_query() with @n block sequence keys (kvindex/hash.h) instead of tokens. Keys of a
 * salted request are those of kvt_client_hash_tokens_salted(): the salt is already in them. */
kvt_status_t kvt_client_query_keys(kvt_client_t *c, const char *model, const char *lora,
                                   const uint64_t *keys, size_t n, const char *const *pods,
                                   size_t npods, kvt_client_result_t *res_p);

/* Frees what a query put in @r and zeroes it; a zeroed result is a no-op. */
void kvt_client_result_free(kvt_client_result_t *r);

/*
 * Sends @json[0..@len) as the EVENTS body (the JSON of HTTP POST /v1/events).
 * On KVT_OK and when @answer_p is not NULL, *@answer_p is the server's JSON
 * answer, NUL-terminated and malloc'd (caller frees with free()).
 */
kvt_status_t kvt_client_report_events(kvt_client_t *c, const char *json, size_t len,
                                      char **answer_p);

/*
 * Records where a router sent a request (RPC ROUTED, HTTP POST /v1/routed):
 * @json[0..@len) is that call's body ({"model", "lora_name"?, "cache_salt"?,
 * "token_ids" | "block_hashes", "pod", "dp_rank"?, "ttl_ms"?}, docs/api.md).
 * The pod's entries for those blocks count as GPU in queries until the
 * engine's own events store them or ttl_ms (default 2000, at most 60000)
 * passes: a second request for the same new prefix, arriving before the
 * engine's events, goes to the same pod. *@answer_p (when not NULL) receives
 * the JSON answer ({"blocks": n}) as for report_events. Not retried.
 */
kvt_status_t kvt_client_routed(kvt_client_t *c, const char *json, size_t len, char **answer_p);

/* Fetches the JSON of GET /v1/stats into *@json_p (malloc'd, NUL-terminated; free()). */
kvt_status_t kvt_client_stats(kvt_client_t *c, char **json_p);

/* Round trip with an empty body. */
kvt_status_t kvt_client_ping(kvt_client_t *c);

/*
 * Subscribes the server to an engine's KV-event stream: @json[0..@len) is the
 * body of POST /v1/engines ({"pod","model","endpoint",...}, docs/api.md).
 * *@answer_p (when not NULL) receives the JSON answer as for report_events.
 * KVT_ERR_EXISTS when the pod is already subscribed.
 */
kvt_status_t kvt_client_add_engine(kvt_client_t *c, const char *json, size_t len, char **answer_p);

/* Unsubscribes engine @pod and drops what it held (DELETE /v1/engines/{pod}).
 * *@answer_p (when not NULL) receives the JSON answer as for report_events. */
kvt_status_t kvt_client_drop_engine(kvt_client_t *c, const char *pod, char **answer_p);

/*
 * Drops every namespace of @model (its base model and its LoRAs) and all
 * their blocks from the index (DELETE /v1/models/{model}). KVT_ERR_NOT_FOUND
 * when the index has no such model. *@answer_p (when not NULL) receives the
 * JSON answer ({"model","namespaces","blocks"}) as for report_events. Not
 * retried (it may have been applied).
 */
kvt_status_t kvt_client_drop_model(kvt_client_t *c, const char *model, char **answer_p);

/* ---- tiers: the engine's data plane and the block API --------------------------------------- */

/*
 * A kvtierd started with --ram-bytes holds KV blocks itself, in a host-RAM
 * arena it owns and on NVMe behind it (docs/protocol.md, "Tiers";
 * docs/client.md, "Tiers"). These calls are one RPC round trip each, with
 * the errors of the blocking calls above; a server without tiers answers
 * them KVT_ERR_UNSUPPORTED (501). @model is 1..255 bytes, @lora NULL or ""
 * (the base model) or at most 255 bytes; key lists hold 1..2^32-1 keys (n 0
 * is KVT_ERR_INVAL, locally). Outputs are set only on KVT_OK.
 *
 * Sessions: reservations and pins belong to the connection. When it closes,
 * for any reason (kvt_client_destroy(), a call that fails with KVT_ERR_IO,
 * _TIMEOUT, _CLOSED or _PROTO, a server restart), the server releases every
 * pin and gives back every uncommitted reservation, and the next call
 * reconnects to a fresh session: a pin is good only as long as the
 * connection it was made on, and the server's --lease bounds it too. For
 * that reason RESERVE, COMMIT, PIN, UNPIN and BLOCK_DELETE are never retried
 * on a fresh connection; ATTACH, LOOKUP, PREFETCH, BLOCK_PUT (a key names one
 * content; a held key is not rewritten) and BLOCK_GET are, as query is.
 */

/*
 * Engine keys: with @on, this client's tier calls (lookup, reserve, commit,
 * pin, unpin, prefetch, block_*) say that their keys are an engine's
 * block-hash ids (vLLM's hash by its last 8 bytes, SGLang's by its first 8,
 * big-endian: as kvtierd's event decoders read them), and name the
 * engine-keys namespace of (model, lora), apart from its sequence keys.
 * kvtierd then reports those blocks to the index as the engine's own blocks
 * under those hashes (docs/tiers.md, "Engine keys"). Off by default.
 */
void kvt_client_set_engine_keys(kvt_client_t *c, bool on);

/* Where kvt_client_lookup() says a block is: the fastest tier holding it. */
#define KVT_CLIENT_LOC_RAM 1u  /* in the arena */
#define KVT_CLIENT_LOC_DISK 2u /* on NVMe only: PIN reads it into the arena first */
/* The slot of a key that got none (kvt_client_reserve()) or is not held (kvt_client_pin()). */
#define KVT_CLIENT_SLOT_NONE 0xFFFFFFFFu

/*
 * The arena, mapped into this process by kvt_client_attach(). Slot i is
 * the block_bytes bytes at base + slot_off + i * slot_bytes
 * (kvt_client_arena_slot()). The mapping and the descriptor are the
 * caller's, independent of the client: they stay valid after
 * kvt_client_destroy() and across reconnects, until kvt_client_detach().
 * Which slot holds what is the server's business: read or write a slot only
 * while this connection holds it (reserved, not yet committed; or pinned).
 */
typedef struct kvt_client_arena {
    void *base;           /* the shared, read-write mapping; NULL when not attached */
    size_t map_bytes;     /* bytes mapped */
    size_t slot_off;      /* offset of slot 0 in the mapping, bytes */
    uint32_t slot_bytes;  /* distance between slots, bytes (a multiple of 4 KiB from kvtierd) */
    uint32_t nslots;      /* RAM slots */
    uint32_t block_bytes; /* the largest block, bytes: what a slot holds */
    uint32_t disk_slots;  /* blocks the NVMe store holds; 0 without one */
    int fd;               /* the arena's descriptor (close-on-exec); -1 when not attached */
} kvt_client_arena_t;

/* One key of a PIN answer. */
typedef struct kvt_client_pinned {
    uint32_t slot; /* the slot holding the block, pinned; KVT_CLIENT_SLOT_NONE: not held */
    uint32_t len;  /* bytes of the block (at most block_bytes) */
} kvt_client_pinned_t;

/*
 * ATTACH: asks for the arena, receives its descriptor with the answer
 * (SCM_RIGHTS; only a Unix-socket connection, "unix:/path", carries one:
 * over TCP KVT_ERR_INVAL, locally) and maps it shared, read-write. On KVT_OK
 * fills *@a_p, which the caller releases with kvt_client_detach(). Besides
 * the usual errors: KVT_ERR_PROTO when the answer came without a
 * descriptor, with a geometry past the mapping, or for a file shorter than
 * map_bytes (connection closed); KVT_ERR_IO when mmap() fails. Attaching
 * twice gives two independent mappings of the same arena.
 */
kvt_status_t kvt_client_attach(kvt_client_t *c, kvt_client_arena_t *a_p);

/* The first byte of slot @slot of @a, or NULL when @a is not attached or @slot >= a->nslots
 * (KVT_CLIENT_SLOT_NONE included). */
void *kvt_client_arena_slot(const kvt_client_arena_t *a, uint32_t slot);

/* Unmaps the arena, closes its descriptor and zeroes *@a (fd -1). Pins and reservations are
 * the connection's, not the mapping's: this releases none. NULL, a zeroed arena or one already
 * detached is a no-op. */
void kvt_client_detach(kvt_client_arena_t *a);

/*
 * LOOKUP: how many of @keys[0..@n), from the first, the sidecar holds
 * (committed, in RAM or on NVMe): *@hit_p, and in @loc_out[0..hit) where
 * each is (KVT_CLIENT_LOC_RAM or _DISK). @loc_out has room for @n. Counts
 * as an access of each block (eviction order, disk admission).
 */
kvt_status_t kvt_client_lookup(kvt_client_t *c, const char *model, const char *lora,
                               const uint64_t *keys, size_t n, uint8_t *loc_out, uint32_t *hit_p);

/*
 * RESERVE: a free RAM slot for each of @keys[0..@n), in @slots_out[0..n):
 * its slot, or KVT_CLIENT_SLOT_NONE when the key is already held or
 * reserved or no slot could be freed. The engine writes each block into its
 * slot (kvt_client_arena_slot()), then calls kvt_client_commit(). The keys
 * of blocks evicted from the sidecar altogether to make room: their number
 * in *@nevicted_p (may be NULL), the first @evicted_cap of them in
 * @evicted (NULL when @evicted_cap is 0). Reservations are this
 * connection's (see "Sessions") and expire after the server's --lease.
 */
kvt_status_t kvt_client_reserve(kvt_client_t *c, const char *model, const char *lora,
                                const uint64_t *keys, size_t n, uint32_t *slots_out,
                                uint64_t *evicted, size_t evicted_cap, size_t *nevicted_p);

/*
 * COMMIT: ends this connection's reservations of @keys[0..@n) (keys it did
 * not reserve are skipped). With @ok the blocks, of @lens[i] bytes each
 * (0, or @lens NULL: block_bytes), become visible; without, their slots are
 * given back. *@done_p (may be NULL): the reservations ended. A length above
 * block_bytes: the server's KVT_ERR_INVAL, nothing changed.
 */
kvt_status_t kvt_client_commit(kvt_client_t *c, const char *model, const char *lora,
                               const uint64_t *keys, size_t n, const uint32_t *lens, bool ok,
                               uint32_t *done_p);

/*
 * PIN: pins each of @keys[0..@n) in RAM for this connection, reading from
 * NVMe (checked against its checksum) the blocks held only there; answered
 * once every block is in RAM. @out[0..n) (room for @n): each key's slot and
 * length, slot KVT_CLIENT_SLOT_NONE when the block is not held or its read
 * failed. A pinned slot is never evicted, reused or moved until
 * kvt_client_unpin(), the connection's end or the server's --lease.
 */
kvt_status_t kvt_client_pin(kvt_client_t *c, const char *model, const char *lora,
                            const uint64_t *keys, size_t n, kvt_client_pinned_t *out);

/* UNPIN: releases one pin of this connection on each of @keys[0..@n) (keys it has not pinned
 * are skipped); *@done_p (may be NULL): the pins released. */
kvt_status_t kvt_client_unpin(kvt_client_t *c, const char *model, const char *lora,
                              const uint64_t *keys, size_t n, uint32_t *done_p);

/* PREFETCH: starts reading into RAM, without pinning, the blocks of @keys[0..@n) held only on
 * NVMe (a router does this before it sends a request here); *@started_p (may be NULL): the
 * reads started. */
kvt_status_t kvt_client_prefetch(kvt_client_t *c, const char *model, const char *lora,
                                 const uint64_t *keys, size_t n, uint32_t *started_p);

/* A TRANSFER request: move blocks between the server and its peer sidecar over UCX. */
typedef struct kvt_client_transfer {
    const char *peer;  /* the other sidecar's RPC address, "host:port" */
    const char *model; /* the blocks' model */
    const char *lora;  /* NULL or "": the base model */
    const uint64_t *keys;
    size_t n;            /* 1..65536 keys */
    bool push;           /* false: the server pulls from the peer; true: pushes to it */
    uint32_t timeout_ms; /* 0: the server's (30 s); at most 600000 */
    bool stream;         /* with push: keys the server does not hold yet are waited for, up
                            to the timeout, and each sent as soon as it is committed there */
} kvt_client_transfer_t;

/* What a TRANSFER answered: every key is in exactly one of the three lists. The caller gives
 * the arrays, each with room for the request's n keys. */
typedef struct kvt_client_transfer_out {
    uint64_t *transferred; /* now held by the receiving sidecar */
    uint64_t *missing;     /* the source does not hold them */
    uint64_t *failed;      /* tried and failed: reasons[i] says why */
    uint8_t *reasons;      /* may be NULL; kvt_client_transfer_reason() names each */
    size_t ntransferred, nmissing, nfailed;
    uint64_t bytes; /* moved */
    uint64_t ns;    /* the server's time for the whole call */
} kvt_client_transfer_out_t;

/*
 * TRANSFER (docs/api.md, "POST /v1/transfer"): the server pulls @t's keys
 * from its peer (or pushes them to it) and answers once they landed or
 * failed; a block becomes visible at the receiver only when all its bytes
 * arrived and its checksum matched. Waits up to the transfer's timeout plus
 * the I/O timeout. KVT_ERR_UNSUPPORTED from a server that takes no part in
 * transfers.
 */
kvt_status_t kvt_client_transfer(kvt_client_t *c, const kvt_client_transfer_t *t,
                                 kvt_client_transfer_out_t *out);

/* The name of a failed key's reason: "peer_down", "peer_restarted", "checksum", "timeout",
 * "no_room", "evicted" or "error". */
const char *kvt_client_transfer_reason(uint8_t reason);

/*
 * BLOCK_PUT: stores @data[0..@len) (1..block_bytes bytes: more is the
 * server's KVT_ERR_TOO_BIG) as block @key. Answered once it is in RAM, or
 * with @durable once it is on NVMe with its metadata committed
 * (KVT_ERR_UNSUPPORTED from a server without --disk-path). A key already
 * held is not rewritten. The request (the block and at most 530 bytes more)
 * must fit in the server's frame limit (HELLO's max_body): a larger one is
 * KVT_ERR_TOO_BIG, locally.
 */
kvt_status_t kvt_client_block_put(kvt_client_t *c, const char *model, const char *lora,
                                  uint64_t key, const void *data, size_t len, bool durable);

/*
 * BLOCK_GET: copies block @key into @buf (@cap bytes) and sets *@len_p to
 * its length. KVT_ERR_NOT_FOUND when the sidecar does not hold it (or its
 * NVMe copy failed its checksum). KVT_ERR_TOO_BIG when @cap is short: then,
 * unlike other failures, *@len_p is set to the block's length (@buf is
 * untouched), so a caller can size its buffer (@buf NULL with @cap 0 asks
 * for the length alone).
 */
kvt_status_t kvt_client_block_get(kvt_client_t *c, const char *model, const char *lora,
                                  uint64_t key, void *buf, size_t cap, size_t *len_p);

/* BLOCK_DELETE: drops block @key from RAM and NVMe. KVT_ERR_NOT_FOUND when it is not held,
 * KVT_ERR_EXISTS while a connection pins or reserves it. */
kvt_status_t kvt_client_block_delete(kvt_client_t *c, const char *model, const char *lora,
                                     uint64_t key);

/* ---- asynchronous queries (event-loop routers) ---------------------------------------------- */

/*
 * Completion of a submitted query. @st is KVT_OK with @res the answer, or an
 * error with @res NULL (kvt_client_last_error() has the message). @res and
 * its pods are owned by the client and valid only during the callback. The
 * callback must not call kvt_client_destroy() nor blocking calls on @c; it
 * may submit new queries.
 */
typedef void (*kvt_client_cb)(void *arg, uint64_t req_id, kvt_status_t st,
                              const kvt_client_result_t *res);

/* The connected socket, to watch for POLLIN (and POLLOUT while
 * kvt_client_want_write()); -1 when not connected. It may change after any
 * call: read it again after each one. */
int kvt_client_fd(const kvt_client_t *c);

/* Connections this client has made so far (each counted once its HELLO is
 * answered). Calls reconnect by themselves after a connection broke or the
 * server closed an idle one: a count that changed between two calls says the
 * second ran on a new connection, so in a new tier session (the old one's
 * pins and reservations are gone, and a restarted kvtierd may have a new
 * arena). */
uint64_t kvt_client_connects(const kvt_client_t *c);

/* False when the client is not connected, or its idle connection is known to
 * be closed or broken (the next call reconnects): a check without a round
 * trip. Call it only with no submitted query in flight. */
bool kvt_client_connected(kvt_client_t *c);

/* True while submitted bytes wait to be written (the socket was full). */
bool kvt_client_want_write(const kvt_client_t *c);

/* Submitted queries that have not been completed yet. */
size_t kvt_client_inflight(const kvt_client_t *c);

/*
 * Queues a query (arguments as kvt_client_query()) and writes as much of it as
 * the socket takes without blocking. Sets *@req_id_p to the id its completion
 * will carry. Reconnects first (blocking, up to the connect timeout) when the
 * connection is down. Returns KVT_OK, or an error (nothing was queued).
 */
kvt_status_t kvt_client_query_submit(kvt_client_t *c, const char *model, const char *lora,
                                     const uint32_t *tokens, size_t n, const char *const *pods,
                                     size_t npods, uint64_t *req_id_p);
/* kvt_client_query_submit() with a cache salt, as kvt_client_query_salted(). */
kvt_status_t kvt_client_query_salted_submit(kvt_client_t *c, const char *model, const char *lora,
                                            const char *cache_salt, const uint32_t *tokens,
                                            size_t n, const char *const *pods, size_t npods,
                                            uint64_t *req_id_p);
kvt_status_t kvt_client_query_keys_submit(kvt_client_t *c, const char *model, const char *lora,
                                          const uint64_t *keys, size_t n, const char *const *pods,
                                          size_t npods, uint64_t *req_id_p);

/*
 * Without blocking: writes pending bytes, reads whatever answers have arrived
 * and calls @cb(@arg, ...) once for each completed query. Returns KVT_OK; or,
 * when the connection broke or the server broke the protocol, closes it,
 * completes every query in flight with that error through @cb, and returns
 * the error.
 */
kvt_status_t kvt_client_progress(kvt_client_t *c, kvt_client_cb cb, void *arg);

/* ---- fan-out over several sidecars ---------------------------------------------------------- */

/*
 * Sends the same query to the @n clients @cs at once (pipelined submit on
 * each, then one poll() over all sockets) and merges the answers into
 * *@res_p: a pod (name, dp_rank) reported by several sidecars keeps its best
 * entry (higher score, then more matched blocks); pods are ordered best first
 * by score, ties by matched blocks, then by name. block_size and num_blocks
 * come from the first client (in @cs order) that answered. res->asked is @n,
 * res->answered the number of sidecars that answered within @timeout_ms
 * (<= 0: each client's io timeout, the largest). Sidecars that fail or time
 * out are skipped (a timed-out connection is closed and reconnects next
 * time); clients with queries in flight count as failed.
 * Returns KVT_OK when at least one sidecar answered; otherwise the first
 * sidecar's error (KVT_ERR_INVAL for bad arguments or @n 0) and *@res_p is
 * untouched.
 */
kvt_status_t kvt_client_fanout_query(kvt_client_t *const *cs, size_t n, const char *model,
                                     const char *lora, const uint32_t *tokens, size_t ntokens,
                                     const char *const *pods, size_t npods, int timeout_ms,
                                     kvt_client_result_t *res_p);
/* kvt_client_fanout_query() with a cache salt, as kvt_client_query_salted(). */
kvt_status_t kvt_client_fanout_query_salted(kvt_client_t *const *cs, size_t n, const char *model,
                                            const char *lora, const char *cache_salt,
                                            const uint32_t *tokens, size_t ntokens,
                                            const char *const *pods, size_t npods, int timeout_ms,
                                            kvt_client_result_t *res_p);
kvt_status_t kvt_client_fanout_query_keys(kvt_client_t *const *cs, size_t n, const char *model,
                                          const char *lora, const uint64_t *keys, size_t nkeys,
                                          const char *const *pods, size_t npods, int timeout_ms,
                                          kvt_client_result_t *res_p);

/* ---- in-process helpers --------------------------------------------------------------------- */

/*
 * Block keys of @tokens[0..@n) under kvtier's hashing standard (DESIGN.md:
 * XXH3-64, seed 1337, chained), for kvt_client_query_keys(): writes
 * @n / @block_size keys to @keys_out and returns that count (0 when
 * @block_size is 0). The full API is in kvtier/kvindex/hash.h.
 */
size_t kvt_client_hash_tokens(const uint32_t *tokens, size_t n, uint32_t block_size,
                              uint64_t *keys_out);

/*
 * kvt_client_hash_tokens() for a request with cache salt @cache_salt
 * (NUL-terminated; NULL or "": no salt, the same keys as
 * kvt_client_hash_tokens()): the first block's local hash is seeded with
 * XXH3_64bits_withSeed(salt bytes, 1337) instead of 1337, everything else is
 * the standard. These are the keys kvtierd stores for events that carry the
 * same salt and the keys it looks up for a salted query. Any salt length is
 * hashed; servers accept salts of 1..255 bytes.
 */
size_t kvt_client_hash_tokens_salted(const uint32_t *tokens, size_t n, uint32_t block_size,
                                     const char *cache_salt, uint64_t *keys_out);

/* How a LoRA request's blocks are keyed: kvtierd's --lora-keys, which the keys must match. */
typedef enum kvt_client_lora_keys {
    KVT_CLIENT_LORA_KEYS_NAMESPACE = 0, /* kvtierd's default: the LoRA does not enter the keys */
    KVT_CLIENT_LORA_KEYS_DYNAMO = 1,    /* NVIDIA Dynamo's: the LoRA seeds every block */
} kvt_client_lora_keys_t;

/*
 * kvt_client_hash_tokens_salted() for a request with LoRA @lora (NUL-terminated;
 * NULL or "": the base model, exactly kvt_client_hash_tokens_salted()) under
 * kvtierd's --lora-keys @mode. KVT_CLIENT_LORA_KEYS_NAMESPACE: the LoRA does not
 * change the keys (it names the namespace the query goes to). KVT_CLIENT_LORA_KEYS_DYNAMO:
 * Dynamo's KV-router keys, every block's local hash seeded with
 * 1337 + XXH3_64bits_withSeed(lora bytes, 0) (u64, wrapping), the chain with 1337; a
 * cache salt then seeds block 0 with XXH3_64bits_withSeed(salt, 1337) plus that LoRA term
 * (kvtier's own rule: Dynamo has no per-request salt). Pass the keys to
 * kvt_client_query_keys() with the same @lora. Returns the keys written (0 when
 * @block_size is 0 or @mode is unknown).
 */
size_t kvt_client_hash_tokens_lora(const uint32_t *tokens, size_t n, uint32_t block_size,
                                   const char *cache_salt, const char *lora,
                                   kvt_client_lora_keys_t mode, uint64_t *keys_out);

/* free() for the strings the library returns (for bindings that cannot call libc's). */
void kvt_client_free(void *p);

/* The library's version string ("0.1.0"). */
const char *kvt_client_version(void);

#ifdef __cplusplus
}
#endif

#endif
