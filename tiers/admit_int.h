/*
 * tiers/admit_int.h: the NVMe admission filter (--disk-admit), so that blocks
 * nobody reads twice do not wear the SSD.
 *
 *   always      every block the RAM tier evicts goes to NVMe;
 *   seen-twice  a block goes to NVMe when it was accessed at least twice (a
 *               put and a later hit, two hits) within the filter's memory;
 *   tinylfu     TinyLFU: a count-min sketch of 4-bit counters (halved every
 *               sample period of 10 x capacity accesses) behind a doorkeeper
 *               bloom filter; a candidate is admitted when the disk has room
 *               and it was seen twice, or when it is full and the candidate's
 *               estimated frequency beats the victim's.
 *
 * Memory is fixed at init (proportional to the capacity in blocks); no
 * allocation per call. Keys are block keys (already well mixed hashes).
 */
#ifndef KVT_TIERS_ADMIT_INT_H
#define KVT_TIERS_ADMIT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum kvt_admit_kind {
    KVT_ADMIT_ALWAYS = 0,
    KVT_ADMIT_SEEN_TWICE = 1,
    KVT_ADMIT_TINYLFU = 2,
} kvt_admit_kind_t;

typedef struct kvt_admit kvt_admit_t;

/* "always", "seen-twice", "tinylfu" -> kind; KVT_ERR_INVAL otherwise. */
kvt_status_t kvt_admit_parse(const char *s, kvt_admit_kind_t *kind_p);
const char *kvt_admit_name(kvt_admit_kind_t kind);

/* Capacities below this count as this. */
#define KVT_ADMIT_MIN_CAPACITY 1024u

/*
 * @capacity: blocks the disk holds (sizes the filter; at most UINT32_MAX).
 * seen-twice remembers an access for at least the next capacity accesses,
 * and forgets it within 2 x capacity accesses to blocks it does not already
 * count as seen twice; tinylfu halves its counts every 10 x capacity
 * accesses. The caller frees *a_p with kvt_admit_free(). KVT_ERR_INVAL
 * (unknown kind), KVT_ERR_RANGE (capacity), KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_admit_new(kvt_admit_kind_t kind, uint64_t capacity, kvt_admit_t **a_p);
void kvt_admit_free(kvt_admit_t *a);

/* An access to block @h (a put, a lookup hit, a pin). */
void kvt_admit_touch(kvt_admit_t *a, uint64_t h);

/* Whether block @cand goes to NVMe. @full: the disk has no free slot, and
 * @victim is the block that would leave to make room. */
bool kvt_admit_ok(kvt_admit_t *a, uint64_t cand, bool full, uint64_t victim);

/*
 * What the filter knows of @h's accesses. tinylfu: the doorkeeper's bit plus
 * the sketch's 4-bit minimum (at most 16); never below the exact count, which
 * is 1 for the first access since the last halving plus the later accesses
 * (counted up to 15; a halving halves that count and drops the first's 1).
 * seen-twice: 0 (not remembered), 1 (once) or 2 (twice or more). always: 0.
 */
uint32_t kvt_admit_estimate(const kvt_admit_t *a, uint64_t h);

#endif
