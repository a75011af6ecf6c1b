/*
 * bench/sim_cache: one simulated pod's block cache, an LRU list over an
 * open-addressing map (bench/sim.h's cache model; the timed and live modes
 * use it too).
 */
#ifndef KVT_BENCH_SIM_CACHE_H
#define KVT_BENCH_SIM_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

#define KVT_SIM_NONE UINT32_MAX

typedef struct kvt_sim_node {
    uint64_t id;
    uint32_t prev, next; /* toward MRU, toward LRU; KVT_SIM_NONE at the ends */
    uint32_t pins;       /* > 0: off the LRU list, never evicted (kvt_sim_cache_put) */
} kvt_sim_node_t;

typedef struct kvt_sim_cache {
    kvt_sim_node_t *nodes; /* cap + room: a request's new blocks go in before the evictions */
    uint32_t *slots;       /* node index or KVT_SIM_NONE */
    uint64_t mask;         /* slots - 1 */
    uint64_t nnodes;       /* entries of nodes */
    uint64_t cap;          /* blocks held at most */
    uint64_t held;
    uint32_t mru, lru, free_head; /* free nodes chained through next */
} kvt_sim_cache_t;

/* splitmix64's finaliser: the simulator's one hash. */
uint64_t kvt_sim_mix(uint64_t x);

/* The index key of trace hash id @id. */
static inline uint64_t kvt_sim_key(uint64_t id)
{
    return kvt_sim_mix(id ^ 0x6b76746965722d73ull);
}

/*
 * A cache of @cap (>= 1) blocks, for requests of at most @room blocks.
 * KVT_OK, KVT_ERR_INVAL or KVT_ERR_NO_MEM (then @c is zeroed).
 */
kvt_status_t kvt_sim_cache_init(kvt_sim_cache_t *c, uint64_t cap, uint32_t room);

/* Frees @c; a zeroed @c is fine. */
void kvt_sim_cache_cleanup(kvt_sim_cache_t *c);

/* Whether @c holds @id. */
bool kvt_sim_cache_has(const kvt_sim_cache_t *c, uint64_t id);

/* Blocks of @ids[0..n) held from block 0 on. */
uint32_t kvt_sim_cache_hit(const kvt_sim_cache_t *c, const uint64_t *ids, uint32_t n);

/*
 * Caches @ids[0..n) (n <= the init's @room), touched tail first; then evicts
 * least recently used blocks down to the capacity, appending them to
 * @evicted (room for @n) and counting them in *@nev_p. Evicting after the
 * request, not block by block, is what an engine does: the request's own
 * blocks are pinned while it runs, so only other blocks make room (and its
 * own only when it alone is larger than the cache: then its tail goes).
 */
void kvt_sim_cache_insert(kvt_sim_cache_t *c, const uint64_t *ids, uint32_t n, uint64_t *evicted,
                          uint32_t *nev_p);

/*
 * Pinned entries (the timed mode: blocks of running requests). A pinned
 * entry is off the LRU list and never evicted; unpinned to 0 it becomes the
 * most recently used. Capacity may be exceeded while too much is pinned.
 */

/*
 * Adds @id with @pins pins (at the MRU end when 0), or, when held, adds
 * @pins to its pins and touches it. Never evicts (kvt_sim_cache_evict());
 * grows the cache's arrays past the init's room. KVT_OK or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_sim_cache_put(kvt_sim_cache_t *c, uint64_t id, uint32_t pins);

/* Removes @id; returns whether it was held and, in *@pins_p (may be NULL), its pins. */
bool kvt_sim_cache_remove(kvt_sim_cache_t *c, uint64_t id, uint32_t *pins_p);

/* Pins (@delta 1) or unpins (@delta -1) held block @id; false when not held or not pinned. */
bool kvt_sim_cache_pin(kvt_sim_cache_t *c, uint64_t id, int delta);

/*
 * When @c holds more than its capacity and an unpinned block exists: evicts
 * the least recently used one into *@id_p and returns true.
 */
bool kvt_sim_cache_evict(kvt_sim_cache_t *c, uint64_t *id_p);

#endif
