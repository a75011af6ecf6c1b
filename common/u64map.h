/*
 * common/u64map.h: a map from any 64-bit key to a non-zero byte, open
 * addressing with linear probing (deletion shifts back, no tombstones).
 * Small and single-threaded: kvtierd's writer keeps the engine-key tier
 * entries its index cannot place yet in one (server/tier.c).
 */
#ifndef KVT_COMMON_U64MAP_H
#define KVT_COMMON_U64MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvt_u64map {
    uint64_t *keys;
    uint8_t *vals; /* 0: the slot is empty */
    size_t cap;    /* slots, a power of two (0 before the first put) */
    size_t n;      /* live entries */
} kvt_u64map_t;

/* A zeroed map is empty and valid; kvt_u64map_free() returns its memory. */
void kvt_u64map_free(kvt_u64map_t *m);

/* The value of @key, 0 when absent. */
uint8_t kvt_u64map_get(const kvt_u64map_t *m, uint64_t key);

/* Sets @key to @val (0 deletes it). False when out of memory (nothing changed). */
bool kvt_u64map_put(kvt_u64map_t *m, uint64_t key, uint8_t val);

/*
 * Goes over up to @max slots (at most all) from *@cursor, wrapping, calling
 * @fn for each live entry; @fn returns the entry's new value (0 deletes it;
 * an entry that deletion moves back into the slot is visited too). *@cursor
 * is where the next call goes on, so calls in turn reach every entry; one
 * over every slot visits each entry at least once. Returns the calls of @fn.
 */
size_t kvt_u64map_sweep(kvt_u64map_t *m, size_t *cursor, size_t max,
                        uint8_t (*fn)(void *arg, uint64_t key, uint8_t val), void *arg);

#endif
