/*
 * kvindex private layout, shared by the writer (index_writer_int.h and the
 * files it lists) and query.c (readers).
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
#include "kvindex/gtab.h"
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

/* Key table: salted key -> node index. Readers probe it without locks. */
typedef struct kvt_ktab {
    uint32_t ngroups; /* any count >= 1: see kvt_grp_home() */
    uint32_t pad[15];
    kvt_group_t g[]; /* 64-byte aligned */
} kvt_ktab_t;

/*
 * Namespace records readers need (the rest is writer-only: ns_w_t),
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
    bool pinned;                   /* inside kvt_idx_read_begin() .. end() */
    const struct kvt_names *names; /* the snapshot the section holds */
};

/* Fields readers touch; the rest of struct kvt_idx is the writer's (index_writer_int.h). */
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
    struct kvt_names *names; /* published names snapshot (names.c) */
} kvt_idx_shared_t;

/* Every index starts with the shared part so query.c can reach it. */
static inline kvt_idx_shared_t *idx_shared(kvt_idx_t *idx)
{
    return (kvt_idx_shared_t *)(void *)idx;
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
