/*
 * kvindex/gtab.h: group tables, the open-addressing layout of the index's key
 * table and per-pod tables, for code that must build the same layout (the
 * index; bench/floor_index, the floor it is measured against). Tables are
 * arrays of kvt_group_t; what a slot holds (a u32) and when to grow is the
 * user's. Header-only: every probe step is inlined where it is used.
 */
#ifndef KVT_KVINDEX_GTAB_H
#define KVT_KVINDEX_GTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/*
 * Group tables (key table and per-pod tables): open addressing over 64-byte
 * groups, each one cache line with 12 control bytes and 12 slots, so a probe
 * usually costs one miss. ctrl: 0 empty, 1 tombstone (also the 4 padding
 * bytes), 0x80|7-bit tag live. A probe scans groups from kvt_grp_home() onward
 * and stops at the first group holding an empty slot. Group counts are not
 * powers of two (the home group is a multiply-shift of the hash's high
 * bits), so tables grow by half and stay about 3/4 full.
 */
#define KVT_GRP_EMPTY 0u
#define KVT_GRP_TOMB 1u
#define KVT_GRP_SLOTS 12u

typedef struct kvt_group {
    uint8_t ctrl[16]; /* [12..15] stay KVT_GRP_TOMB */
    uint32_t slot[KVT_GRP_SLOTS];
} __attribute__((aligned(64))) kvt_group_t;

#if defined(__SANITIZE_THREAD__)
#define KVT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVT_TSAN 1
#endif
#endif

#if defined(__SSE2__) && !defined(KVT_TSAN)
#include <emmintrin.h>
/*
 * Bit i set when group slot i has control byte @c. One 16-byte load: a
 * reader may race the writer's single-byte stores, which x86 keeps coherent
 * byte by byte; the slot is then read with acquire after a fence, and its
 * node's key is checked anyway. TSan builds use the atomic loop below.
 */
static inline uint32_t kvt_grp_match(const kvt_group_t *g, uint8_t c)
{
    __m128i v = _mm_load_si128((const __m128i *)(const void *)g->ctrl);
    __m128i m = _mm_cmpeq_epi8(v, _mm_set1_epi8((char)c));
    return (uint32_t)_mm_movemask_epi8(m) & ((1u << KVT_GRP_SLOTS) - 1);
}

/* Slots that are empty or tombstones (control byte < 0x80). */
static inline uint32_t kvt_grp_free(const kvt_group_t *g)
{
    __m128i v = _mm_load_si128((const __m128i *)(const void *)g->ctrl);
    return ~(uint32_t)_mm_movemask_epi8(v) & ((1u << KVT_GRP_SLOTS) - 1);
}
#else
/* Bit i set when group slot i has control byte @c (atomic loads: readers race the writer). */
static inline uint32_t kvt_grp_match(const kvt_group_t *g, uint8_t c)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < KVT_GRP_SLOTS; i++)
        m |= (uint32_t)(__atomic_load_n(&g->ctrl[i], __ATOMIC_RELAXED) == c) << i;
    return m;
}

static inline uint32_t kvt_grp_free(const kvt_group_t *g)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < KVT_GRP_SLOTS; i++)
        m |= (uint32_t)(__atomic_load_n(&g->ctrl[i], __ATOMIC_RELAXED) < 0x80u) << i;
    return m;
}
#endif

static inline void kvt_grp_init(kvt_group_t *g, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        memset(g[i].ctrl, KVT_GRP_EMPTY, KVT_GRP_SLOTS);
        memset(g[i].ctrl + KVT_GRP_SLOTS, KVT_GRP_TOMB, sizeof(g[i].ctrl) - KVT_GRP_SLOTS);
    }
}

static inline uint64_t kvt_mix64(uint64_t x)
{
    /* murmur3 finalizer: spreads any 64-bit id over the table */
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Tag from the low bits: independent of kvt_grp_home(), which uses the high ones. */
static inline uint8_t kvt_grp_tag(uint64_t h)
{
    return (uint8_t)(0x80u | (h & 0x7fu));
}

static inline uint32_t kvt_grp_home(uint64_t h, uint32_t ngroups)
{
    return (uint32_t)(((h >> 32) * (uint64_t)ngroups) >> 32);
}

static inline uint32_t kvt_grp_next(uint32_t gi, uint32_t ngroups)
{
    return gi + 1 == ngroups ? 0 : gi + 1;
}

/*
 * True when a table of @ngroups groups has room for one more entry beside
 * @used taken slots (live entries and tombstones): tables fill to 7/8, then
 * grow (or are rebuilt to drop tombstones). The index and bench/floor_index
 * both decide by this, so the floor grows as the index does.
 */
static inline bool kvt_grp_room(uint32_t ngroups, uint64_t used)
{
    return (used + 1) * 8 <= (uint64_t)ngroups * KVT_GRP_SLOTS * 7;
}

/* Group count after growing by half (at least one more). */
static inline uint32_t kvt_grp_grow(uint32_t ngroups)
{
    return ngroups + (ngroups / 2 ? ngroups / 2 : 1);
}

/*
 * Both group tables: puts @v at the first free slot of hash @h's probe
 * sequence, publishing the control byte last (readers of the key table rely
 * on that; the writer-only pod tables do not mind).
 */
static inline void kvt_grp_put(kvt_group_t *groups, uint32_t ngroups, uint64_t h, uint32_t v)
{
    for (uint32_t gi = kvt_grp_home(h, ngroups);; gi = kvt_grp_next(gi, ngroups)) {
        kvt_group_t *g = &groups[gi];
        uint32_t m = kvt_grp_free(g);
        if (m == 0)
            continue;
        uint32_t si = (uint32_t)__builtin_ctz(m);
        __atomic_store_n(&g->slot[si], v, __ATOMIC_RELEASE);
        __atomic_store_n(&g->ctrl[si], kvt_grp_tag(h), __ATOMIC_RELEASE);
        return;
    }
}

/*
 * Both group tables: frees slot @si of group @g. A group that still has an
 * empty slot never overflowed, so no probe passes it and the slot can become
 * empty; otherwise it becomes a tombstone. Returns true for a tombstone.
 */
static inline bool kvt_grp_erase(kvt_group_t *g, uint32_t si)
{
    bool tomb = kvt_grp_match(g, KVT_GRP_EMPTY) == 0;
    __atomic_store_n(&g->ctrl[si], tomb ? KVT_GRP_TOMB : KVT_GRP_EMPTY, __ATOMIC_RELEASE);
    return tomb;
}

#endif
