/*
 * bench/floor_index: the least work the index's store path can do with its
 * memory layout, as a yardstick for `kvtier-bench index`.
 *
 * It keeps the tables kvindex keeps, laid out and grown the same way: a key
 * table (key -> node) and one table per pod (engine hash -> node), both open
 * addressing over 64-byte groups of 12 slots, and 32-byte nodes in chunks of
 * 4096. It leaves out everything else a real index needs: concurrent readers
 * (seqlocks, atomics, deferred frees), holder sets (a node remembers its first
 * holder only; later holders are only in their pods' tables), tiers, engine
 * hashes reused for another block, speculative marks, LRU stamps in a heap,
 * the memory budget and its accounting. So its stores/s is a ceiling on what
 * kvindex's layout allows on the machine it runs on, not a competitor.
 *
 * Single-threaded. Stores only: there is no query, remove or clear.
 */
#ifndef KVT_BENCH_FLOOR_INDEX_H
#define KVT_BENCH_FLOOR_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kvt_floor kvt_floor_t;

/*
 * Creates an empty floor index for pods 0 .. @npods - 1. On success *@f_p is
 * owned by the caller, freed with kvt_floor_destroy().
 * Returns KVT_OK, KVT_ERR_INVAL (@npods 0 or @f_p NULL) or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_floor_create(uint32_t npods, kvt_floor_t **f_p);

/* Frees the index. NULL is a no-op. */
void kvt_floor_destroy(kvt_floor_t *f);

/*
 * @pod holds the chain @keys[0..n) (block i's parent is block i - 1), block i
 * under engine hash @ehashes[i]. A key seen before keeps its node; a pod that
 * already maps the node is not counted twice. Engine hashes must be one per
 * key (as in the bench): the floor does not handle a pod reusing one.
 * Returns KVT_OK, KVT_ERR_INVAL (bad pod, NULL arrays with n > 0) or
 * KVT_ERR_NO_MEM (the index is unchanged from the failing block on).
 */
kvt_status_t kvt_floor_store(kvt_floor_t *f, uint32_t pod, const uint64_t *keys,
                             const uint64_t *ehashes, size_t n);

/* Nodes (distinct keys) stored. */
uint64_t kvt_floor_blocks(const kvt_floor_t *f);

/* (block, pod) entries: the references in all pod tables. */
uint64_t kvt_floor_entries(const kvt_floor_t *f);

/* Bytes held by nodes and tables. */
uint64_t kvt_floor_bytes(const kvt_floor_t *f);

#endif
