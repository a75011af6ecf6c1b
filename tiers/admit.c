/*
 * tiers/admit.c: the NVMe admission filter (admit_int.h).
 *
 * seen-twice keeps two generations of two bloom filters: "once" (the block
 * was accessed) and "twice" (it was accessed again while remembered). A
 * generation takes capacity insertions, then the older one is cleared and
 * becomes the new one, so a block is remembered over capacity to 2 x capacity
 * insertions. Bloom filters rather than a table of 2-bit counters: a counter
 * table indexed by one hash needs ~100 slots a key for a 1% collision rate,
 * a bloom filter ~10 bits; and a filter never forgets a key early, so two
 * accesses within capacity insertions always admit.
 *
 * tinylfu is a count-min sketch (4 rows of 4-bit counters, 16 a word, with
 * conservative increment: only the rows at the minimum grow) behind a
 * doorkeeper bloom filter that absorbs each block's first access in a sample
 * period. Every 10 x capacity accesses the counters halve and the doorkeeper
 * is cleared, so old popularity fades. A row has 4 x capacity counters (as
 * Caffeine's sketch: 16 a block in all, 8 bytes): with 1 x, a zipf workload
 * over 100 x capacity keys had ~5% of keys seen once pass as seen twice (all
 * four counters taken by others), with 4 x ~0.1%.
 *
 * The bloom filters are blocked: a key's bits all lie in one 64-byte block,
 * one cache miss a probe. Sizes are powers of two (masks, not divisions).
 * Rotation and halving rewrite the tables: O(capacity) once every capacity
 * (resp. 10 x capacity) accesses, O(1) amortized; nothing else loops.
 */
#include "tiers/admit_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define XXH_INLINE_ALL /* one-shot hashes of 8 bytes: XXH3's short path, inlined */
#include <xxhash.h>

#define ADMIT_BLOOM_K 6        /* bits a key sets, 9 bits of hash each */
#define ADMIT_SEEN_BITS 10     /* seen-twice: bloom bits a remembered key (~1% false positives) */
#define ADMIT_DOOR_BITS 8      /* doorkeeper bits a sampled access (~2% when all are distinct) */
#define ADMIT_SKETCH_ROWS 4    /* count-min depth */
#define ADMIT_WIDTH_FACTOR 4   /* counters a row: this x capacity, rounded up to a power of two */
#define ADMIT_SAMPLE_FACTOR 10 /* tinylfu halves every this many x capacity accesses */
#define ADMIT_COUNTER_MAX 15u  /* 4-bit counters */
#define ADMIT_MAX_CAPACITY UINT32_MAX

/* A blocked bloom filter: blocks of 8 words (512 bits, one cache line). */
typedef struct admit_bloom {
    uint64_t *w;   /* 8 x (mask + 1) words */
    uint64_t mask; /* blocks - 1; blocks is a power of two */
} admit_bloom_t;

/* Where a key's bits lie in a filter of a given size: its block, a mask a word. */
typedef struct admit_probe {
    uint64_t blk;  /* first word of the block */
    uint64_t m[8]; /* bits to test or set in each of its words */
} admit_probe_t;

struct kvt_admit {
    kvt_admit_kind_t kind;
    uint64_t cap; /* capacity in blocks, at least KVT_ADMIT_MIN_CAPACITY */

    /* seen-twice: [gen] with gen = cur (filling) or !cur (the older) */
    admit_bloom_t once[2], twice[2];
    unsigned cur;
    uint64_t gen_adds; /* insertions into generation cur */

    /* tinylfu */
    uint64_t *sketch;    /* ADMIT_SKETCH_ROWS rows of row_words words, 16 counters each */
    uint64_t row_words;  /* words a row */
    uint64_t width_mask; /* counters a row - 1; a power of two */
    admit_bloom_t door;
    uint64_t touches; /* accesses since the last halving */
    uint64_t sample;  /* accesses between halvings */

    uint64_t *mem; /* every table above, one 64-byte aligned allocation */
};

/* Seeds that make each row, and the bloom probe, hash the key differently. */
static const uint64_t admit_row_seed[ADMIT_SKETCH_ROWS] = {
    0x9e3779b97f4a7c15ull,
    0xc2b2ae3d27d4eb4full,
    0x165667b19e3779f9ull,
    0xd6e8feb86659fd93ull,
};
#define ADMIT_BLOOM_SEED 0x27d4eb2f165667c5ull

/* XXH3 under a seed: keys are mixed already, but the rows must not share bits. */
static inline uint64_t admit_hash(uint64_t h, uint64_t seed)
{
    return XXH3_64bits_withSeed(&h, sizeof(h), seed);
}

static uint64_t admit_pow2(uint64_t x)
{
    uint64_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

/* Words of a filter for @keys keys at @bits bits each; at least one block. */
static uint64_t admit_bloom_words(uint64_t keys, uint64_t bits)
{
    uint64_t words = admit_pow2((keys * bits + 63) / 64);
    return words < 8 ? 8 : words;
}

static void admit_bloom_init(admit_bloom_t *b, uint64_t *w, uint64_t words)
{
    b->w = w;
    b->mask = words / 8 - 1;
}

static void admit_probe(const admit_bloom_t *b, uint64_t h, admit_probe_t *p)
{
    XXH128_hash_t x = XXH3_128bits_withSeed(&h, sizeof(h), ADMIT_BLOOM_SEED);
    uint64_t bits = x.high64;
    p->blk = (x.low64 & b->mask) * 8;
    memset(p->m, 0, sizeof(p->m));
    for (int i = 0; i < ADMIT_BLOOM_K; i++, bits >>= 9)
        p->m[(bits & 511) >> 6] |= 1ull << (bits & 63);
}

static bool admit_bloom_has(const admit_bloom_t *b, const admit_probe_t *p)
{
    const uint64_t *w = b->w + p->blk;
    uint64_t miss = 0;
    for (int i = 0; i < 8; i++)
        miss |= p->m[i] & ~w[i];
    return miss == 0;
}

static void admit_bloom_add(admit_bloom_t *b, const admit_probe_t *p)
{
    uint64_t *w = b->w + p->blk;
    for (int i = 0; i < 8; i++)
        w[i] |= p->m[i];
}

static void admit_bloom_clear(admit_bloom_t *b)
{
    memset(b->w, 0, (b->mask + 1) * 8 * sizeof(uint64_t));
}

kvt_status_t kvt_admit_parse(const char *s, kvt_admit_kind_t *kind_p)
{
    static const kvt_admit_kind_t kinds[] = {KVT_ADMIT_ALWAYS, KVT_ADMIT_SEEN_TWICE,
                                             KVT_ADMIT_TINYLFU};
    if (s == NULL)
        return KVT_ERR_INVAL;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (strcmp(s, kvt_admit_name(kinds[i])) == 0) {
            *kind_p = kinds[i];
            return KVT_OK;
        }
    }
    return KVT_ERR_INVAL;
}

const char *kvt_admit_name(kvt_admit_kind_t kind)
{
    switch (kind) {
    case KVT_ADMIT_ALWAYS: return "always";
    case KVT_ADMIT_SEEN_TWICE: return "seen-twice";
    case KVT_ADMIT_TINYLFU: return "tinylfu";
    }
    return "unknown";
}

kvt_status_t kvt_admit_new(kvt_admit_kind_t kind, uint64_t capacity, kvt_admit_t **a_p)
{
    if (kind != KVT_ADMIT_ALWAYS && kind != KVT_ADMIT_SEEN_TWICE && kind != KVT_ADMIT_TINYLFU)
        return KVT_ERR_INVAL;
    if (capacity > ADMIT_MAX_CAPACITY) {
        kvt_log_error("admission filter for %" PRIu64 " blocks: more than %" PRIu32 " blocks",
                      capacity, (uint32_t)ADMIT_MAX_CAPACITY);
        return KVT_ERR_RANGE;
    }
    kvt_admit_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        goto err_nomem;
    a->kind = kind;
    a->cap = capacity < KVT_ADMIT_MIN_CAPACITY ? KVT_ADMIT_MIN_CAPACITY : capacity;

    /* The tables' sizes in words (capacity < 2^32 keeps every product in range). */
    uint64_t seen_words = 0, row_words = 0, door_words = 0;
    if (kind == KVT_ADMIT_SEEN_TWICE) {
        seen_words = admit_bloom_words(a->cap, ADMIT_SEEN_BITS);
    } else if (kind == KVT_ADMIT_TINYLFU) {
        uint64_t width = admit_pow2(a->cap) * ADMIT_WIDTH_FACTOR;
        a->width_mask = width - 1;
        a->row_words = row_words = width / 16;
        a->sample = ADMIT_SAMPLE_FACTOR * a->cap;
        door_words = admit_bloom_words(a->sample, ADMIT_DOOR_BITS);
    }
    uint64_t words = 4 * seen_words + ADMIT_SKETCH_ROWS * row_words + door_words;
    if (words > SIZE_MAX / sizeof(uint64_t))
        goto err_free_a;
    if (words != 0) {
        size_t bytes = (size_t)words * sizeof(uint64_t); /* a multiple of 64 */
        a->mem = aligned_alloc(64, bytes);
        if (a->mem == NULL)
            goto err_free_a;
        memset(a->mem, 0, bytes);
    }
    uint64_t *w = a->mem;
    if (kind == KVT_ADMIT_SEEN_TWICE) {
        for (int g = 0; g < 2; g++) {
            admit_bloom_init(&a->once[g], w, seen_words);
            w += seen_words;
            admit_bloom_init(&a->twice[g], w, seen_words);
            w += seen_words;
        }
    } else if (kind == KVT_ADMIT_TINYLFU) {
        a->sketch = w;
        w += ADMIT_SKETCH_ROWS * row_words;
        admit_bloom_init(&a->door, w, door_words);
    }
    *a_p = a;
    return KVT_OK;

err_free_a:
    free(a);
err_nomem:
    kvt_log_error("admission filter %s for %" PRIu64 " blocks: out of memory", kvt_admit_name(kind),
                  capacity);
    return KVT_ERR_NO_MEM;
}

void kvt_admit_free(kvt_admit_t *a)
{
    if (a == NULL)
        return;
    free(a->mem);
    free(a);
}

/* seen-twice */

static void admit_seen_touch(kvt_admit_t *a, uint64_t h)
{
    admit_probe_t p;
    unsigned cur = a->cur, old = !cur;
    admit_probe(&a->once[cur], h, &p); /* every filter has the same size */
    if (admit_bloom_has(&a->twice[cur], &p))
        return; /* nothing more to learn this generation */
    if (admit_bloom_has(&a->once[cur], &p) || admit_bloom_has(&a->once[old], &p) ||
        admit_bloom_has(&a->twice[old], &p))
        admit_bloom_add(&a->twice[cur], &p); /* seen before, or seen twice before: renew */
    else
        admit_bloom_add(&a->once[cur], &p);
    if (++a->gen_adds >= a->cap) { /* the older generation is forgotten */
        admit_bloom_clear(&a->once[old]);
        admit_bloom_clear(&a->twice[old]);
        a->cur = old;
        a->gen_adds = 0;
    }
}

static uint32_t admit_seen_estimate(const kvt_admit_t *a, uint64_t h)
{
    admit_probe_t p;
    admit_probe(&a->once[0], h, &p);
    if (admit_bloom_has(&a->twice[0], &p) || admit_bloom_has(&a->twice[1], &p))
        return 2;
    if (admit_bloom_has(&a->once[0], &p) || admit_bloom_has(&a->once[1], &p))
        return 1;
    return 0;
}

/* tinylfu */

/* Word and shift of @h's counter in each row. */
static void admit_sketch_at(const kvt_admit_t *a, uint64_t h, uint64_t *word, unsigned *shift)
{
    for (int r = 0; r < ADMIT_SKETCH_ROWS; r++) {
        uint64_t i = admit_hash(h, admit_row_seed[r]) & a->width_mask;
        word[r] = (uint64_t)r * a->row_words + i / 16;
        shift[r] = (unsigned)(i % 16) * 4;
    }
}

static uint32_t admit_sketch_min(const kvt_admit_t *a, const uint64_t *word, const unsigned *shift)
{
    uint32_t min = ADMIT_COUNTER_MAX;
    for (int r = 0; r < ADMIT_SKETCH_ROWS; r++) {
        uint32_t c = (uint32_t)(a->sketch[word[r]] >> shift[r]) & 15u;
        if (c < min)
            min = c;
    }
    return min;
}

static void admit_lfu_reset(kvt_admit_t *a)
{
    uint64_t n = ADMIT_SKETCH_ROWS * a->row_words;
    for (uint64_t i = 0; i < n; i++) /* every 4-bit counter halves; no bit crosses counters */
        a->sketch[i] = (a->sketch[i] >> 1) & 0x7777777777777777ull;
    admit_bloom_clear(&a->door);
    a->touches = 0;
}

static void admit_lfu_touch(kvt_admit_t *a, uint64_t h)
{
    admit_probe_t p;
    admit_probe(&a->door, h, &p);
    if (!admit_bloom_has(&a->door, &p)) {
        admit_bloom_add(&a->door, &p); /* a first access counts in the doorkeeper only */
    } else {
        uint64_t word[ADMIT_SKETCH_ROWS];
        unsigned shift[ADMIT_SKETCH_ROWS];
        admit_sketch_at(a, h, word, shift);
        uint32_t min = admit_sketch_min(a, word, shift);
        if (min < ADMIT_COUNTER_MAX) { /* conservative: only the rows at the minimum grow */
            for (int r = 0; r < ADMIT_SKETCH_ROWS; r++)
                if (((a->sketch[word[r]] >> shift[r]) & 15u) == min)
                    a->sketch[word[r]] += 1ull << shift[r];
        }
    }
    if (++a->touches >= a->sample)
        admit_lfu_reset(a);
}

static uint32_t admit_lfu_estimate(const kvt_admit_t *a, uint64_t h)
{
    admit_probe_t p;
    uint64_t word[ADMIT_SKETCH_ROWS];
    unsigned shift[ADMIT_SKETCH_ROWS];
    admit_probe(&a->door, h, &p);
    admit_sketch_at(a, h, word, shift);
    return admit_sketch_min(a, word, shift) + (admit_bloom_has(&a->door, &p) ? 1u : 0u);
}

void kvt_admit_touch(kvt_admit_t *a, uint64_t h)
{
    switch (a->kind) {
    case KVT_ADMIT_ALWAYS: return;
    case KVT_ADMIT_SEEN_TWICE: admit_seen_touch(a, h); return;
    case KVT_ADMIT_TINYLFU: admit_lfu_touch(a, h); return;
    }
}

uint32_t kvt_admit_estimate(const kvt_admit_t *a, uint64_t h)
{
    switch (a->kind) {
    case KVT_ADMIT_ALWAYS: return 0;
    case KVT_ADMIT_SEEN_TWICE: return admit_seen_estimate(a, h);
    case KVT_ADMIT_TINYLFU: return admit_lfu_estimate(a, h);
    }
    return 0;
}

bool kvt_admit_ok(kvt_admit_t *a, uint64_t cand, bool full, uint64_t victim)
{
    switch (a->kind) {
    case KVT_ADMIT_ALWAYS: return true;
    case KVT_ADMIT_SEEN_TWICE: return admit_seen_estimate(a, cand) == 2;
    case KVT_ADMIT_TINYLFU:
        if (!full)
            return admit_lfu_estimate(a, cand) >= 2;
        return admit_lfu_estimate(a, cand) > admit_lfu_estimate(a, victim);
    }
    return true;
}
