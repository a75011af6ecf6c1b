/*
 * bench/floor_index: see floor_index.h. The tables are kvindex's group tables
 * (kvindex/gtab.h) with index_tab.c's growth rules (kvt_grp_room(),
 * kvt_grp_grow()), on purpose (a floor for *that* layout); the per-block work
 * is only what those tables need.
 */
#include "bench/floor_index.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kvindex/gtab.h"

#define FL_NIL UINT32_MAX
#define FL_SLAB_SHIFT 16u /* 65536 nodes of 32 bytes: one 2 MiB huge page */
#define FL_SLAB (1u << FL_SLAB_SHIFT)
#define FL_HUGE ((size_t)2 << 20)

typedef struct fl_node {
    uint64_t key;
    uint64_t ehash;
    uint32_t parent;
    uint32_t nchild;
    uint32_t stamp; /* store count at the last touch: the LRU stamp's write */
    uint32_t pod;   /* first holder */
} fl_node_t;

typedef struct fl_tab {
    kvt_group_t *g;
    uint32_t ngroups;
    uint32_t live;
} fl_tab_t;

struct kvt_floor {
    fl_node_t **slab;
    uint32_t nslabs, slab_cap;
    uint32_t nodes;
    uint32_t clock;
    fl_tab_t keys;
    fl_tab_t *pods;
    uint32_t npods;
    uint64_t entries;
    uint64_t bytes;
};

static inline fl_node_t *fl_node(const kvt_floor_t *f, uint32_t nid)
{
    return &f->slab[nid >> FL_SLAB_SHIFT][nid & (FL_SLAB - 1)];
}

static kvt_group_t *fl_groups_new(kvt_floor_t *f, uint32_t ngroups)
{
    size_t bytes = (size_t)ngroups * sizeof(kvt_group_t);
    void *p = NULL;
    if (posix_memalign(&p, bytes >= FL_HUGE ? FL_HUGE : 64, bytes) != 0)
        return NULL;
    if (bytes >= FL_HUGE)
        (void)madvise(p, bytes & ~(FL_HUGE - 1), MADV_HUGEPAGE);
    kvt_grp_init(p, ngroups);
    f->bytes += bytes;
    return p;
}

static void fl_groups_free(kvt_floor_t *f, fl_tab_t *t)
{
    f->bytes -= (uint64_t)t->ngroups * sizeof(kvt_group_t);
    free(t->g);
    t->g = NULL;
}

/* Key table: grows by half at 7/8 full, re-hashed from the node slabs in order. */
static kvt_status_t fl_keys_reserve(kvt_floor_t *f)
{
    fl_tab_t *t = &f->keys;
    if (kvt_grp_room(t->ngroups, t->live))
        return KVT_OK;
    uint32_t ng = kvt_grp_grow(t->ngroups);
    kvt_group_t *g = fl_groups_new(f, ng);
    if (g == NULL)
        return KVT_ERR_NO_MEM;
    enum { AHEAD = 16 };
    for (uint32_t i = 0; i < f->nodes; i++) {
        if (i + AHEAD < f->nodes)
            __builtin_prefetch(&g[kvt_grp_home(kvt_mix64(fl_node(f, i + AHEAD)->key), ng)]);
        kvt_grp_put(g, ng, kvt_mix64(fl_node(f, i)->key), i);
    }
    fl_groups_free(f, t);
    t->g = g;
    t->ngroups = ng;
    return KVT_OK;
}

/* Pod table: x4 while small, then by half, at 7/8 full; re-hashing reads each entry's node. */
static kvt_status_t fl_pod_reserve(kvt_floor_t *f, fl_tab_t *t)
{
    if (t->g != NULL && kvt_grp_room(t->ngroups, t->live))
        return KVT_OK;
    uint32_t ng = t->g == NULL ? 1 : t->ngroups < 8 ? t->ngroups * 4 : kvt_grp_grow(t->ngroups);
    kvt_group_t *g = fl_groups_new(f, ng);
    if (g == NULL)
        return KVT_ERR_NO_MEM;
    if (t->g != NULL) {
        /* batches of refs gathered on the stack, as ptab_rebuild() does */
        enum { BATCH = 256, AHEAD = 8 };
        uint32_t refs[BATCH];
        uint32_t gi = 0, m = ~kvt_grp_free(&t->g[0]) & ((1u << KVT_GRP_SLOTS) - 1);
        for (;;) {
            uint32_t nr = 0;
            while (nr < BATCH && gi < t->ngroups) {
                if (m == 0) {
                    if (++gi < t->ngroups)
                        m = ~kvt_grp_free(&t->g[gi]) & ((1u << KVT_GRP_SLOTS) - 1);
                    continue;
                }
                refs[nr++] = t->g[gi].slot[__builtin_ctz(m)];
                m &= m - 1;
            }
            if (nr == 0)
                break;
            for (uint32_t k = 0; k < nr; k++) {
                if (k + AHEAD < nr)
                    __builtin_prefetch(&fl_node(f, refs[k + AHEAD])->ehash);
                kvt_grp_put(g, ng, kvt_mix64(fl_node(f, refs[k])->ehash), refs[k]);
            }
        }
        fl_groups_free(f, t);
    }
    t->g = g;
    t->ngroups = ng;
    return KVT_OK;
}

static kvt_status_t fl_node_new(kvt_floor_t *f, uint32_t *nid_p)
{
    if ((f->nodes & (FL_SLAB - 1)) == 0) {
        if (f->nslabs == f->slab_cap) {
            uint32_t cap = f->slab_cap ? f->slab_cap * 2 : 16;
            fl_node_t **s = realloc(f->slab, cap * sizeof(*s));
            if (s == NULL)
                return KVT_ERR_NO_MEM;
            f->slab = s;
            f->slab_cap = cap;
        }
        void *p = NULL;
        if (posix_memalign(&p, FL_HUGE, FL_SLAB * sizeof(fl_node_t)) != 0)
            return KVT_ERR_NO_MEM;
        (void)madvise(p, FL_SLAB * sizeof(fl_node_t), MADV_HUGEPAGE);
        f->slab[f->nslabs++] = p;
        f->bytes += FL_SLAB * sizeof(fl_node_t);
    }
    *nid_p = f->nodes++;
    return KVT_OK;
}

/* Node of @key (hash @h) or FL_NIL. */
static inline uint32_t fl_find_key(const kvt_floor_t *f, uint64_t key, uint64_t h)
{
    const fl_tab_t *t = &f->keys;
    uint8_t tag = kvt_grp_tag(h);
    for (uint32_t gi = kvt_grp_home(h, t->ngroups);; gi = kvt_grp_next(gi, t->ngroups)) {
        const kvt_group_t *g = &t->g[gi];
        for (uint32_t m = kvt_grp_match(g, tag); m != 0; m &= m - 1) {
            uint32_t nid = g->slot[__builtin_ctz(m)];
            if (fl_node(f, nid)->key == key)
                return nid;
        }
        if (kvt_grp_match(g, KVT_GRP_EMPTY) != 0)
            return FL_NIL;
    }
}

/* True when pod table @t maps hash @h to node @nid. */
static inline bool fl_pod_has(const fl_tab_t *t, uint64_t h, uint32_t nid)
{
    if (t->g == NULL)
        return false;
    uint8_t tag = kvt_grp_tag(h);
    for (uint32_t gi = kvt_grp_home(h, t->ngroups);; gi = kvt_grp_next(gi, t->ngroups)) {
        const kvt_group_t *g = &t->g[gi];
        for (uint32_t m = kvt_grp_match(g, tag); m != 0; m &= m - 1)
            if (g->slot[__builtin_ctz(m)] == nid)
                return true;
        if (kvt_grp_match(g, KVT_GRP_EMPTY) != 0)
            return false;
    }
}

kvt_status_t kvt_floor_create(uint32_t npods, kvt_floor_t **f_p)
{
    if (npods == 0 || f_p == NULL)
        return KVT_ERR_INVAL;
    kvt_floor_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return KVT_ERR_NO_MEM;
    f->pods = calloc(npods, sizeof(*f->pods));
    f->keys.g = fl_groups_new(f, 1);
    if (f->pods == NULL || f->keys.g == NULL) {
        kvt_floor_destroy(f);
        return KVT_ERR_NO_MEM;
    }
    f->keys.ngroups = 1;
    f->npods = npods;
    *f_p = f;
    return KVT_OK;
}

void kvt_floor_destroy(kvt_floor_t *f)
{
    if (f == NULL)
        return;
    for (uint32_t i = 0; i < f->nslabs; i++)
        free(f->slab[i]);
    free(f->slab);
    if (f->pods != NULL)
        for (uint32_t p = 0; p < f->npods; p++)
            free(f->pods[p].g);
    free(f->pods);
    free(f->keys.g);
    free(f);
}

/* Same chunking and prefetch distances as kvt_idx_store(). */
enum { FL_CHUNK = 32, FL_NODE_AHEAD = 4 };

kvt_status_t kvt_floor_store(kvt_floor_t *f, uint32_t pod, const uint64_t *keys,
                             const uint64_t *ehashes, size_t n)
{
    if (pod >= f->npods || (n > 0 && (keys == NULL || ehashes == NULL)))
        return KVT_ERR_INVAL;
    fl_tab_t *pt = &f->pods[pod];
    uint32_t parent = FL_NIL;
    uint64_t hk[FL_CHUNK], hp[FL_CHUNK];
    f->clock++;
    for (size_t c0 = 0; c0 < n; c0 += FL_CHUNK) {
        size_t cn = n - c0 < FL_CHUNK ? n - c0 : FL_CHUNK;
        for (size_t j = 0; j < cn; j++) {
            hk[j] = kvt_mix64(keys[c0 + j]);
            hp[j] = kvt_mix64(ehashes[c0 + j]);
            __builtin_prefetch(&f->keys.g[kvt_grp_home(hk[j], f->keys.ngroups)]);
            if (pt->g != NULL)
                __builtin_prefetch(&pt->g[kvt_grp_home(hp[j], pt->ngroups)]);
        }
        for (size_t j = 0; j < cn; j++) {
            if (j + FL_NODE_AHEAD < cn) {
                uint64_t ha = hk[j + FL_NODE_AHEAD];
                const kvt_group_t *g = &f->keys.g[kvt_grp_home(ha, f->keys.ngroups)];
                uint32_t m = kvt_grp_match(g, kvt_grp_tag(ha));
                if (m != 0)
                    __builtin_prefetch(fl_node(f, g->slot[__builtin_ctz(m)]));
            }
            uint64_t key = keys[c0 + j];
            uint32_t nid = fl_find_key(f, key, hk[j]);
            kvt_status_t st;
            if (nid != FL_NIL) {
                fl_node_t *nd = fl_node(f, nid);
                nd->stamp = f->clock;
                if (nd->pod != pod && !fl_pod_has(pt, hp[j], nid)) {
                    if ((st = fl_pod_reserve(f, pt)) != KVT_OK)
                        return st;
                    kvt_grp_put(pt->g, pt->ngroups, hp[j], nid);
                    pt->live++;
                    f->entries++;
                }
                parent = nid;
                continue;
            }
            if ((st = fl_pod_reserve(f, pt)) != KVT_OK || (st = fl_keys_reserve(f)) != KVT_OK ||
                (st = fl_node_new(f, &nid)) != KVT_OK)
                return st;
            fl_node_t *nd = fl_node(f, nid);
            *nd = (fl_node_t){.key = key,
                              .ehash = ehashes[c0 + j],
                              .parent = parent,
                              .stamp = f->clock,
                              .pod = pod};
            if (parent != FL_NIL)
                fl_node(f, parent)->nchild++;
            kvt_grp_put(f->keys.g, f->keys.ngroups, hk[j], nid);
            f->keys.live++;
            kvt_grp_put(pt->g, pt->ngroups, hp[j], nid);
            pt->live++;
            f->entries++;
            parent = nid;
        }
    }
    return KVT_OK;
}

uint64_t kvt_floor_blocks(const kvt_floor_t *f)
{
    return f->nodes;
}

uint64_t kvt_floor_entries(const kvt_floor_t *f)
{
    return f->entries;
}

uint64_t kvt_floor_bytes(const kvt_floor_t *f)
{
    return f->bytes;
}
