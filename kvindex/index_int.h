/*
 * kvindex private layout, shared by index.c (the writer) and query.c (readers).
 * docs/architecture.md explains the design; the short version:
 *
 * - Block nodes (32 bytes) live in a chunked slab and never move; a node is
 *   named by its 32-bit slab index. Keys are salted per namespace
 *   (key ^ ns salt) so one key table serves every namespace.
 * - The key table maps a salted key to a node index: open addressing, one
 *   control byte (empty, tombstone or a 7-bit tag) plus a 4-byte node index
 *   per slot. Readers probe it without locks; the writer publishes a slot by
 *   storing its control byte last, and replaces whole tables through EBR.
 * - A node's holders are (pod, tiers) elements, kept in the node itself when
 *   there is one holder, else in an overflow set sorted by pod id.
 * - Writers bump a striped sequence counter around every change to a node;
 *   readers copy a node's holders and retry if the counter moved.
 * - Each pod has a private (writer-only) table engine hash -> node, which is
 *   also the reverse index used by clear and drop.
 * - A writer-only side array, parallel to the node slab, gives each node's
 *   namespace slot (u16): what dropping a namespace and reporting removals
 *   need, kept out of the 32-byte node.
 */
#ifndef KVT_KVINDEX_INDEX_INT_H
#define KVT_KVINDEX_INDEX_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kvindex/ebr.h"
#include "kvindex/index.h"

#define KVT_NIL UINT32_MAX

/* Tier bit for speculative entries (never passed in by callers). */
#define KVT_TIER_SPEC (1u << 3)

/*
 * A holder element, 32 bits:
 *   bits 0-15  pod id
 *   bits 16-19 effective tiers (main | every alias of this pod), SPEC included
 *   bits 20-23 tiers of the main reference (the pod maps node->ehash to the node)
 *   bits 24-30 number of alias references of this pod on this node
 *   bit  31    0 (distinguishes an inline element from an overflow handle)
 */
typedef uint32_t kvt_elem_t;

#define ELEM_POD(e) ((e)&0xffffu)
#define ELEM_TIERS(e) (((e) >> 16) & 0xfu)
#define ELEM_MAIN(e) (((e) >> 20) & 0xfu)
#define ELEM_NALIAS(e) (((e) >> 24) & 0x7fu)
#define ELEM_MAKE(pod, tiers, main, nalias)                                                        \
    ((uint32_t)(pod) | ((uint32_t)(tiers) << 16) | ((uint32_t)(main) << 20) |                      \
     ((uint32_t)(nalias) << 24))
#define ELEM_MAX_ALIAS 0x7fu

/* node->pods values besides an inline element */
#define PODS_SET_BIT 0x80000000u /* low 31 bits: overflow set handle */
#define PODS_EMPTY 0x0000ffffu   /* live node with no holder */
#define PODS_FREE 0xffffffffu    /* node on the free list */

typedef struct kvt_node {
    uint64_t key;    /* salted key; readers load it atomically */
    uint64_t ehash;  /* engine hash of the first holder: the pods' "main" reference */
    uint32_t parent; /* node index, or KVT_NIL; free-list link when free */
    uint32_t nchild; /* live nodes whose parent is this node */
    uint32_t stamp;  /* index clock (ms, truncated) of the last store or query hit */
    uint32_t pods;   /* inline element, PODS_SET_BIT|handle, PODS_EMPTY or PODS_FREE */
} kvt_node_t;

/* Overflow holder set; replaced (never resized in place) when it must grow. */
typedef struct kvt_podset {
    uint32_t n;          /* elements in use */
    uint32_t cap;        /* elements allocated; fixed for the object's life */
    uint32_t alias_head; /* first alias record of the node, or KVT_NIL */
    uint32_t pad;
    kvt_elem_t e[]; /* sorted by pod id */
} kvt_podset_t;

/* Chunked array: a published directory of fixed-size chunks that never move. */
#define NODE_CHUNK_SHIFT 12u
#define NODE_CHUNK (1u << NODE_CHUNK_SHIFT)
#define SET_CHUNK_SHIFT 10u
#define SET_CHUNK (1u << SET_CHUNK_SHIFT)

typedef struct kvt_dir {
    uint32_t n;    /* chunks in use */
    uint32_t cap;  /* chunk pointers allocated */
    void *chunk[]; /* readers load entries atomically */
} kvt_dir_t;

/*
 * Group tables (key table and per-pod tables): open addressing over 64-byte
 * groups, each one cache line with 12 control bytes and 12 slots, so a probe
 * usually costs one miss. ctrl: 0 empty, 1 tombstone (also the 4 padding
 * bytes), 0x80|7-bit tag live. A probe scans groups from grp_home() onward
 * and stops at the first group holding an empty slot. Group counts are not
 * powers of two (the home group is a multiply-shift of the hash's high
 * bits), so tables grow by half and stay about 3/4 full.
 */
#define CTRL_EMPTY 0u
#define CTRL_TOMB 1u
#define GSLOTS 12u

typedef struct kvt_group {
    uint8_t ctrl[16]; /* [12..15] stay CTRL_TOMB */
    uint32_t slot[GSLOTS];
} __attribute__((aligned(64))) kvt_group_t;

/* Key table: salted key -> node index. Readers probe it without locks. */
typedef struct kvt_ktab {
    uint32_t ngroups; /* any count >= 1: see grp_home() */
    uint32_t pad[15];
    kvt_group_t g[]; /* 64-byte aligned */
} kvt_ktab_t;

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
static inline uint32_t grp_match(const kvt_group_t *g, uint8_t c)
{
    __m128i v = _mm_load_si128((const __m128i *)(const void *)g->ctrl);
    __m128i m = _mm_cmpeq_epi8(v, _mm_set1_epi8((char)c));
    return (uint32_t)_mm_movemask_epi8(m) & ((1u << GSLOTS) - 1);
}

/* Slots that are empty or tombstones (control byte < 0x80). */
static inline uint32_t grp_free(const kvt_group_t *g)
{
    __m128i v = _mm_load_si128((const __m128i *)(const void *)g->ctrl);
    return ~(uint32_t)_mm_movemask_epi8(v) & ((1u << GSLOTS) - 1);
}
#else
/* Bit i set when group slot i has control byte @c (atomic loads: readers race the writer). */
static inline uint32_t grp_match(const kvt_group_t *g, uint8_t c)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < GSLOTS; i++)
        m |= (uint32_t)(__atomic_load_n(&g->ctrl[i], __ATOMIC_RELAXED) == c) << i;
    return m;
}

static inline uint32_t grp_free(const kvt_group_t *g)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < GSLOTS; i++)
        m |= (uint32_t)(__atomic_load_n(&g->ctrl[i], __ATOMIC_RELAXED) < 0x80u) << i;
    return m;
}
#endif

static inline void grp_init(kvt_group_t *g, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        memset(g[i].ctrl, CTRL_EMPTY, GSLOTS);
        memset(g[i].ctrl + GSLOTS, CTRL_TOMB, sizeof(g[i].ctrl) - GSLOTS);
    }
}

/*
 * Namespace records readers need (the rest is writer-only, in index.c),
 * in chunks of NS_CHUNK. A namespace id is (generation << 16 | slot); a
 * record's id is the id of the namespace in its slot, or NS_ID_FREE. The
 * writer frees a slot by setting its id to NS_ID_FREE (then a release
 * fence) and fills a reused slot's salt before publishing the new id, so a
 * reader that sees the same id before and after loading the salt has the
 * salt of that id (ns_read_salt()).
 */
#define NS_CHUNK_SHIFT 8u
#define NS_CHUNK (1u << NS_CHUNK_SHIFT)
#define NS_SLOT_BITS 16u
#define NS_SLOT(id) ((id) & ((1u << NS_SLOT_BITS) - 1))
#define NS_ID(gen, slot) (((uint32_t)(gen) << NS_SLOT_BITS) | (uint32_t)(slot))
#define NS_ID_FREE KVT_IDX_NS_NONE
#define NS_GEN_MAX 0xfffeu /* generations 0..NS_GEN_MAX: an id is never NS_ID_FREE */

typedef struct kvt_ns {
    uint64_t salt; /* readers load it atomically */
    uint32_t id;   /* readers load it atomically; NS_ID_FREE while the slot is free */
    uint32_t pad;
} kvt_ns_t;

/* Striped sequence counters: node i uses stripe i & (NSTRIPES - 1). */
#define NSTRIPES 4096u

struct kvt_idx_reader {
    kvt_idx_t *idx;
    int slot;
    uint32_t qgen;
    uint32_t cap;         /* pods the scratch arrays cover */
    uint32_t *allow;      /* per pod: generation when listed in the query's filter */
    uint32_t *alive;      /* indices into res of pods still extending their run */
    uint8_t *atier;       /* its tier class (first_tier()) in the last block merged */
    kvt_idx_match_t *res; /* results, in pod order */
    kvt_elem_t *snap;     /* copy of one node's holders */
    kvt_elem_t *snap2;    /* the holders of the last block merged (same capacity) */
    uint32_t snapcap;
};

/* Fields readers touch; the rest of struct kvt_idx is private to index.c. */
typedef struct kvt_idx_shared {
    kvt_ebr_t ebr;
    kvt_ktab_t *ktab; /* published */
    kvt_dir_t *nodes; /* published; chunks of kvt_node_t */
    kvt_dir_t *sets;  /* published; chunks of kvt_podset_t * */
    kvt_dir_t *nss; /* published; chunks of kvt_ns_t; a chunk past the last live slot's is freed */
    uint32_t nns;   /* namespace slots: every live namespace's slot is below */
    uint32_t pod_cap; /* highest pod id + 1 ever used */
    uint32_t clock32; /* index clock, ms truncated */
    uint32_t pad;
    uint32_t stripes[NSTRIPES];
} kvt_idx_shared_t;

/* Every index starts with the shared part so query.c can reach it. */
static inline kvt_idx_shared_t *idx_shared(kvt_idx_t *idx)
{
    return (kvt_idx_shared_t *)(void *)idx;
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

/* Tag from the low bits: independent of grp_home(), which uses the high ones. */
static inline uint8_t ktab_tag(uint64_t h)
{
    return (uint8_t)(0x80u | (h & 0x7fu));
}

static inline uint32_t grp_home(uint64_t h, uint32_t ngroups)
{
    return (uint32_t)(((h >> 32) * (uint64_t)ngroups) >> 32);
}

static inline uint32_t grp_next(uint32_t gi, uint32_t ngroups)
{
    return gi + 1 == ngroups ? 0 : gi + 1;
}

/* Group count after growing by half (at least one more). */
static inline uint32_t grp_grow(uint32_t ngroups)
{
    return ngroups + (ngroups / 2 ? ngroups / 2 : 1);
}

/* Atomic accessors for chunked arrays (reader side). */
static inline kvt_node_t *dir_node(kvt_dir_t *d, uint32_t i)
{
    kvt_node_t *c =
        __atomic_load_n((kvt_node_t **)&d->chunk[i >> NODE_CHUNK_SHIFT], __ATOMIC_ACQUIRE);
    return &c[i & (NODE_CHUNK - 1)];
}

static inline kvt_podset_t **dir_set(kvt_dir_t *d, uint32_t h)
{
    kvt_podset_t **c =
        __atomic_load_n((kvt_podset_t ***)&d->chunk[h >> SET_CHUNK_SHIFT], __ATOMIC_ACQUIRE);
    return &c[h & (SET_CHUNK - 1)];
}

static inline kvt_ns_t *dir_ns(kvt_dir_t *d, uint32_t i)
{
    kvt_ns_t *c = __atomic_load_n((kvt_ns_t **)&d->chunk[i >> NS_CHUNK_SHIFT], __ATOMIC_ACQUIRE);
    return &c[i & (NS_CHUNK - 1)];
}

/*
 * Reader, inside an EBR critical section: the salt of namespace id @id into
 * *@salt_p, or false when @id is not current (dropped, reused or never
 * created). Trailing chunks of free slots may be gone: a NULL chunk means no
 * namespace.
 */
static inline bool ns_read_salt(kvt_idx_shared_t *sh, uint32_t id, uint64_t *salt_p)
{
    uint32_t slot = NS_SLOT(id);
    kvt_dir_t *d = __atomic_load_n(&sh->nss, __ATOMIC_ACQUIRE);
    if ((slot >> NS_CHUNK_SHIFT) >= d->cap)
        return false;
    kvt_ns_t *c = __atomic_load_n((kvt_ns_t **)&d->chunk[slot >> NS_CHUNK_SHIFT], __ATOMIC_ACQUIRE);
    if (c == NULL)
        return false;
    kvt_ns_t *r = &c[slot & (NS_CHUNK - 1)];
    if (__atomic_load_n(&r->id, __ATOMIC_ACQUIRE) != id)
        return false;
    uint64_t salt = __atomic_load_n(&r->salt, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->id, __ATOMIC_RELAXED) != id)
        return false; /* dropped meanwhile: the salt may be the next namespace's */
    *salt_p = salt;
    return true;
}

#endif
