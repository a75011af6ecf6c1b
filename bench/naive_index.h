/*
 * bench/naive_index: a deliberately plain prefix-block index.
 *
 * It is the reference model the randomized tests check kvindex/index.c
 * against, operation by operation, and the naive yardstick kvtier-bench
 * compares speed and memory with: a chained hash map (ns, key) -> singly
 * linked list of (pod, tiers) holders, per pod a chained map engine hash ->
 * (ns, key, tiers), and per pod a list of speculative marks. One malloc per
 * node, no cleverness, no concurrency (one thread at a time).
 *
 * Model (the real index implements the same rules):
 * - An entry is (ns, key, pod). Per pod an engine hash (ehash) maps to exactly
 *   one (ns, key) and carries its own non-empty tier set; several ehashes of a
 *   pod may map to one (ns, key), whose tiers are then the OR of theirs. The
 *   entry exists while at least one ehash maps to it or while it has a live
 *   speculative mark.
 * - Pods and namespaces are small integers chosen by the caller; nothing has
 *   to be registered. Pod ids must be < KVT_NAIVE_MAX_PODS: a mutating call on
 *   a larger id changes nothing (its ehashes all count as unresolved).
 * - Tier arguments are masks of KVT_TIER_* bits; bits outside KVT_TIER_ALL are
 *   ignored.
 * - Keys and ehashes are arbitrary u64 values (0 and UINT64_MAX included).
 *
 * Allocation failure: this is a test model, so it prints a message to stderr
 * and calls abort() when malloc fails (kvt_naive_create() alone returns
 * KVT_ERR_NO_MEM).
 */
#ifndef KVT_BENCH_NAIVE_INDEX_H
#define KVT_BENCH_NAIVE_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kvindex/index.h"

/* Pod ids the model accepts: 0 .. KVT_NAIVE_MAX_PODS - 1. */
#define KVT_NAIVE_MAX_PODS 65536u

typedef struct kvt_naive kvt_naive_t;

/*
 * Creates an empty model with its clock at 0. On success *n_p is owned by the
 * caller, freed with kvt_naive_destroy().
 * Returns KVT_OK, KVT_ERR_INVAL (n_p NULL) or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_naive_create(kvt_naive_t **n_p);

/* Frees the model and everything in it. NULL is a no-op. */
void kvt_naive_destroy(kvt_naive_t *n);

/*
 * @pod holds blocks @keys[0..n) of namespace @ns in tier(s) @tier. For each i,
 * with h = ehashes ? ehashes[i] : keys[i]: if the pod maps h to another
 * (ns, key), that mapping is first dropped entirely; then h maps to
 * (ns, keys[i]) and gains @tier. Any store of (ns, key) on the pod cancels
 * ("confirms") the pod's speculative mark on it. @tier with no valid bit:
 * nothing happens.
 */
void kvt_naive_store(kvt_naive_t *n, uint32_t ns, uint32_t pod, unsigned tier, const uint64_t *keys,
                     const uint64_t *ehashes, size_t count);

/*
 * Adds @tier to every ehash of @ehashes[0..count) that @pod maps. Returns how
 * many ehashes the pod does not map (skipped). Does not touch speculative
 * marks.
 */
size_t kvt_naive_store_by_ehash(kvt_naive_t *n, uint32_t pod, unsigned tier,
                                const uint64_t *ehashes, size_t count);

/*
 * Removes @tiers from every ehash of @ehashes[0..count) that @pod maps; a
 * mapping left with no tier is dropped (and with it the entry, if nothing
 * else keeps it). Removing a tier the ehash lacks is a no-op. Returns how many
 * ehashes the pod does not map.
 */
size_t kvt_naive_remove(kvt_naive_t *n, uint32_t pod, unsigned tiers, const uint64_t *ehashes,
                        size_t count);

/*
 * kvt_naive_remove(), and for every ehash whose mapping it drops (no tier
 * left), in order, one element of @gone (room for @count; NULL: no report):
 * ehash, ns and key of the block it mapped; has_parent and parent_key are 0
 * (the model keeps no chains). *@ngone_p (may be NULL) gets the count.
 * Returns what kvt_naive_remove() returns.
 */
size_t kvt_naive_remove_report(kvt_naive_t *n, uint32_t pod, unsigned tiers,
                               const uint64_t *ehashes, size_t count, kvt_idx_gone_t *gone,
                               size_t *ngone_p);

/*
 * Every pod forgets every block of namespace @ns: all its ehashes mapping to
 * one and its speculative marks on them. Returns the number of blocks of @ns
 * that had an entry.
 */
uint64_t kvt_naive_ns_drop(kvt_naive_t *n, uint32_t ns);

/*
 * kvt_naive_remove(@pod, @tiers, h) for every ehash h of the pod; with
 * @tiers == KVT_TIER_ALL it also drops all the pod's speculative marks.
 */
void kvt_naive_pod_clear(kvt_naive_t *n, uint32_t pod, unsigned tiers);

/*
 * Router's announcement: for each key of @keys[0..count), unless @pod has an
 * entry for (ns, key) from an ehash, or already a speculative mark on it (its
 * expiry is NOT extended), adds a mark expiring at now + @ttl_ms, where now is
 * the last kvt_naive_advance() value (0 initially). Saturates at UINT64_MAX.
 */
void kvt_naive_speculate(kvt_naive_t *n, uint32_t ns, uint32_t pod, const uint64_t *keys,
                         size_t count, uint32_t ttl_ms);

/*
 * If @now_ms is later than the model's clock: sets the clock to it and drops
 * every speculative mark whose expiry is <= @now_ms. An earlier or equal
 * value changes nothing (so a mark made with TTL 0 lives until the clock
 * moves forward).
 */
void kvt_naive_advance(kvt_naive_t *n, uint64_t now_ms);

/* Every pod forgets (ns, key): all its ehashes mapping to it and its speculative mark. */
void kvt_naive_evict(kvt_naive_t *n, uint32_t ns, uint64_t key);

/*
 * For every pod (only those in @pods[0..npods) when @pods is not NULL; ids may
 * repeat or be unknown, the list is a set), matched = the largest m such that
 * the pod has an entry for each of (ns, keys[0..m)). Pods with matched 0 are
 * left out. gpu/cpu/disk count, among those m blocks, the fastest tier of the
 * pod's entry: GPU if its tiers have GPU or it has a speculative mark, else
 * CPU if they have CPU, else DISK; gpu + cpu + disk == matched.
 * Writes at most @cap results to @out in ascending pod order (the first @cap
 * pods when more match; pass cap >= number of pod ids in use to get all).
 * Returns the number written. Does not change the model or its byte count.
 */
size_t kvt_naive_query(kvt_naive_t *n, uint32_t ns, const uint64_t *keys, size_t count,
                       const uint32_t *pods, size_t npods, kvt_idx_match_t *out, size_t cap);

/* Number of (block, pod) entries, speculative-only ones included. */
uint64_t kvt_naive_entries(const kvt_naive_t *n);

/* Number of distinct (ns, key) blocks with at least one entry. */
uint64_t kvt_naive_blocks(const kvt_naive_t *n);

/*
 * Bytes allocated: the sum of malloc_usable_size() over every live
 * allocation of the model (the handle included). An emptied model (every
 * entry removed, evicted or expired) returns to the value of a new one.
 */
uint64_t kvt_naive_bytes(const kvt_naive_t *n);

/* Number of entries @pod has, speculative-only ones included; 0 for unknown pods. */
uint64_t kvt_naive_pod_entries(const kvt_naive_t *n, uint32_t pod);
/* Holders whose tiers include GPU, CPU, DISK ([0] [1] [2]); O(entries). */
void kvt_naive_tier_entries(const kvt_naive_t *n, uint64_t out[3]);

#endif
