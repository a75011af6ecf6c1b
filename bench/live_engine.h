/*
 * bench/live_engine: one simulated engine of `kvtier-bench replay --mode live`
 * (issue 18). It keeps the cache model of bench/sim_cache.h (one LRU of trace
 * blocks), a serial prefill clock (bench/sim_model.h) and publishes its
 * cache's changes as a vLLM engine does: a ZMQ PUB socket sending
 * [topic, seq (8 bytes big-endian), msgpack batch] and a ROUTER replay socket
 * answering [b"", start_seq] with the buffered batches from start_seq
 * ([b"", seq, payload] each, then [b"", 0xff x 8, b""]: vLLM <= 0.25).
 *
 * A block is a trace hash id. Its engine hash is kvt_sim_key(id) and its
 * tokens are kvt_live_block_tokens(id): functions of the id, so equal ids
 * give equal tokens and equal engine hashes on every engine.
 *
 * Time: the engine's clock is simulated (µs of trace time); a request's
 * batch is due when its prefill completes, in wall time t0 + done / speedup,
 * and kvt_live_engine_flush() sends the batches that are due, in order.
 */
#ifndef KVT_BENCH_LIVE_ENGINE_H
#define KVT_BENCH_LIVE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/sim_cache.h"
#include "bench/sim_model.h"
#include "common/status.h"

#define KVT_LIVE_ENDPOINT_MAX 64
#define KVT_LIVE_REPLAY_STEPS 2048 /* published batches kept for replay (vLLM: buffer_steps) */

/* One batch: published (seq < next_pub) or waiting for its due time. */
typedef struct kvt_live_batch {
    uint64_t due_ns; /* wall clock (kvt_clock_ns) when it may be sent */
    uint8_t *data;   /* msgpack payload; NULL once it left the replay window */
    size_t len;
} kvt_live_batch_t;

typedef struct kvt_live_engine {
    void *pub, *router; /* ZMQ sockets */
    char endpoint[KVT_LIVE_ENDPOINT_MAX], replay_endpoint[KVT_LIVE_ENDPOINT_MAX];
    char topic[128];
    uint32_t block_size; /* tokens per block in the events */
    uint32_t lose_every; /* test hook: every Nth batch skips the PUB (0: none; else >= 2) */
    kvt_sim_cache_t cache;
    double busy_until_us; /* simulated: when the engine's last admitted prefill completes */
    /* batches by seq: [0, next_pub) published, [next_pub, nbatches) waiting */
    kvt_live_batch_t *batches;
    size_t nbatches, cap, next_pub;
    uint64_t *evicted;  /* scratch: room for one request's blocks */
    uint32_t *tokens;   /* scratch: one request's tokens */
    uint64_t replays;   /* replay requests answered */
    uint64_t withheld;  /* batches the test hook kept off the PUB */
    bool last_lost;     /* the last batch sent was withheld (no later seq shows the gap yet) */
    uint64_t prefilled; /* blocks prefilled (not hit) */
    uint64_t routed;    /* blocks routed here */
    uint64_t evicted_blocks;
} kvt_live_engine_t;

/* Block @id's @bs tokens, into @out: a function of @id alone. */
void kvt_live_block_tokens(uint64_t id, uint32_t bs, uint32_t *out);

/*
 * Binds a PUB and a ROUTER on tcp://127.0.0.1:* in ZMQ context @zctx (borrowed),
 * publishing under @topic, with a cache of @capacity blocks for requests of at
 * most @room blocks, whose events carry @block_size tokens a block.
 * KVT_OK, KVT_ERR_NO_MEM or KVT_ERR_IO (@why says which); on error @e is
 * cleaned up.
 */
kvt_status_t kvt_live_engine_init(kvt_live_engine_t *e, void *zctx, const char *topic,
                                  uint64_t capacity, uint32_t room, uint32_t block_size, char *why,
                                  size_t whylen);

/* Closes the sockets and frees @e; a zeroed @e is fine. */
void kvt_live_engine_cleanup(kvt_live_engine_t *e);

/* Sends an empty batch [ts, []] now (a stream's first batches, while the subscriber joins). */
kvt_status_t kvt_live_engine_ping(kvt_live_engine_t *e);

/* What kvt_live_engine_admit() found for one request. */
typedef struct kvt_live_admit {
    uint32_t hit;     /* leading blocks the cache held */
    double ttft_us;   /* wait + prefill of the uncached blocks (simulated) */
    double done_us;   /* when its prefill completes (simulated) */
    uint32_t evicted; /* blocks it evicted */
    bool batch;       /* a batch was queued (false when nothing changed) */
} kvt_live_admit_t;

/*
 * A request of trace blocks @ids[0..n) arriving at simulated time
 * @arrival_us: its hit is the cache's leading run; its prefill starts at
 * max(arrival, busy_until) and takes kvt_sim_prefill_us() of the misses under
 * @m; then its blocks are cached (tail first) and the LRU evicted, as
 * kvt_sim_cache_insert() does. Its batch (BlockStored for blocks hit..n-1,
 * chained to block hit-1; BlockRemoved for the evictions) is queued, due at
 * @t0_ns + done_us * 1000 / @speedup. KVT_OK or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_live_engine_admit(kvt_live_engine_t *e, const kvt_sim_model_t *m,
                                   const uint64_t *ids, uint32_t n, double arrival_us,
                                   uint64_t t0_ns, double speedup, kvt_live_admit_t *out);

/*
 * Sends the waiting batches due by @now_ns (all of them when @all), in
 * order, and answers replay requests. KVT_OK or KVT_ERR_IO (ZMQ refused a
 * send).
 */
kvt_status_t kvt_live_engine_flush(kvt_live_engine_t *e, uint64_t now_ns, bool all);

/* When the next waiting batch is due (UINT64_MAX: none waits). */
uint64_t kvt_live_engine_next_due(const kvt_live_engine_t *e);

/* The last seq sent (published or withheld); -1 before the first. */
int64_t kvt_live_engine_last_seq(const kvt_live_engine_t *e);

/* Outstanding prefill at simulated time @now_us, in blocks of @m (0 when idle). */
double kvt_live_engine_load(const kvt_live_engine_t *e, const kvt_sim_model_t *m, double now_us);

#endif
