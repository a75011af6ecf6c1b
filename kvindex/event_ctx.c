/*
 * kvindex/event_ctx.c: what the event layer remembers across batches
 * (event.h, kvt_ev_ctx_t), on the writer thread:
 *
 *  - per pod id: a bit per KV cache group (0..63) known not to be indexed,
 *    and an epoch that invalidates the pod's removed mappings at once;
 *  - removed mappings: a FIFO ring of entries plus an open-addressing index
 *    (linear probing, backward-shift deletion) over (pod, engine hash), sized
 *    once from the byte budget. The oldest entry goes first: vLLM emits the
 *    CPU placeholder within a step or two of the GPU removal, so recency is
 *    all that matters, and a FIFO needs no per-entry links.
 */
#include <stdlib.h>
#include <string.h>

#include "kvindex/event.h"
#include "kvindex/event_int.h"

typedef struct rm_ent {
    uint64_t ehash;
    uint64_t key;
    uint64_t parent;
    uint32_t pod;
    uint32_t epoch; /* the pod's epoch when recorded; another means stale */
    uint32_t ns;
    uint8_t has_parent;
    uint8_t pad[3];
} rm_ent_t;

/* An entry, plus the two index slots that each entry has (rm_alloc()): what event.h promises. */
_Static_assert(sizeof(rm_ent_t) + 2 * sizeof(uint32_t) == KVT_EV_REMOVED_ENTRY_BYTES,
               "KVT_EV_REMOVED_ENTRY_BYTES is one rm_ent_t and two index slots");

struct kvt_ev_ctx {
    uint64_t *other;  /* per pod id: groups known not to be indexed */
    uint32_t *epoch;  /* per pod id */
    uint32_t npods;   /* entries of other[] and epoch[] */
    size_t budget;    /* bytes for the removed mappings */
    rm_ent_t *ring;   /* NULL until the first put */
    uint32_t cap;     /* ring entries */
    uint32_t head, n; /* FIFO: ring[head .. head + n) modulo cap */
    uint32_t *slot;   /* index: ring position + 1, 0 empty */
    uint32_t mask;    /* slots - 1 */
    uint64_t hits, evicted;
};

kvt_status_t kvt_ev_ctx_create(size_t removed_bytes, kvt_ev_ctx_t **ctx_p)
{
    kvt_ev_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVT_ERR_NO_MEM;
    c->budget = removed_bytes;
    *ctx_p = c;
    return KVT_OK;
}

void kvt_ev_ctx_destroy(kvt_ev_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    free(ctx->other);
    free(ctx->epoch);
    free(ctx->ring);
    free(ctx->slot);
    free(ctx);
}

kvt_status_t ev_ctx_pod(kvt_ev_ctx_t *ctx, uint32_t pod)
{
    if (ctx == NULL || pod < ctx->npods)
        return KVT_OK;
    if (pod >= KVT_IDX_MAX_PODS)
        return KVT_ERR_INVAL; /* no index hands out such an id; doubling to it would wrap */
    uint32_t n = ctx->npods ? ctx->npods : 64;
    while (n <= pod)
        n *= 2;
    uint64_t *o = realloc(ctx->other, (size_t)n * sizeof(*o));
    if (o == NULL)
        return KVT_ERR_NO_MEM;
    ctx->other = o;
    uint32_t *e = realloc(ctx->epoch, (size_t)n * sizeof(*e));
    if (e == NULL)
        return KVT_ERR_NO_MEM;
    ctx->epoch = e;
    memset(o + ctx->npods, 0, (size_t)(n - ctx->npods) * sizeof(*o));
    memset(e + ctx->npods, 0, (size_t)(n - ctx->npods) * sizeof(*e));
    ctx->npods = n;
    return KVT_OK;
}

void kvt_ev_ctx_pod_reset(kvt_ev_ctx_t *ctx, uint32_t pod)
{
    if (ctx == NULL || pod >= ctx->npods)
        return;
    ctx->other[pod] = 0;
    ctx->epoch[pod]++;
}

void ev_ctx_forget_removed(kvt_ev_ctx_t *ctx, uint32_t pod)
{
    if (ctx != NULL && pod < ctx->npods)
        ctx->epoch[pod]++;
}

void ev_ctx_group_learn(kvt_ev_ctx_t *ctx, uint32_t pod, int64_t group, bool other)
{
    if (ctx == NULL || pod >= ctx->npods || group < 0 || group > 63)
        return;
    uint64_t bit = 1ull << group;
    ctx->other[pod] = other ? ctx->other[pod] | bit : ctx->other[pod] & ~bit;
}

bool ev_ctx_group_other(const kvt_ev_ctx_t *ctx, uint32_t pod, int64_t group)
{
    return ctx != NULL && pod < ctx->npods && group >= 0 && group <= 63 &&
           (ctx->other[pod] >> group & 1u) != 0;
}

void kvt_ev_ctx_stats(const kvt_ev_ctx_t *ctx, kvt_ev_ctx_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    if (ctx == NULL)
        return;
    st->removed_capacity = ctx->cap;
    st->removed_entries = ctx->n;
    st->removed_bytes =
        ctx->ring ? (uint64_t)ctx->cap * sizeof(rm_ent_t) + (uint64_t)(ctx->mask + 1) * 4 : 0;
    st->removed_hits = ctx->hits;
    st->removed_evicted = ctx->evicted;
}

/* ---- removed mappings -------------------------------------------------------------------- */

static uint32_t rm_home(const kvt_ev_ctx_t *c, uint32_t pod, uint64_t ehash)
{
    uint64_t x = ehash ^ ((uint64_t)pod * 0x9e3779b97f4a7c15ull);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x & c->mask;
}

/* Sizes the table from the budget: the most slots (a power of two) with one entry per two. */
static bool rm_alloc(kvt_ev_ctx_t *c)
{
    const size_t per_slot = sizeof(uint32_t) + sizeof(rm_ent_t) / 2;
    size_t slots = 1;
    while (slots * 2 * per_slot <= c->budget && slots < ((size_t)1 << 30))
        slots *= 2;
    if (slots < 2 || slots * per_slot > c->budget)
        return false;
    c->ring = malloc(slots / 2 * sizeof(rm_ent_t));
    c->slot = calloc(slots, sizeof(uint32_t));
    if (c->ring == NULL || c->slot == NULL) {
        free(c->ring);
        free(c->slot);
        c->ring = NULL;
        c->slot = NULL;
        c->budget = 0; /* no memory: keep none rather than retry on every removal */
        return false;
    }
    c->cap = (uint32_t)(slots / 2);
    c->mask = (uint32_t)slots - 1;
    return true;
}

/* The index slot holding (pod, ehash), or the empty slot where it would go. */
static uint32_t rm_find(const kvt_ev_ctx_t *c, uint32_t pod, uint64_t ehash)
{
    uint32_t i = rm_home(c, pod, ehash);
    for (;;) {
        uint32_t v = c->slot[i];
        if (v == 0)
            return i;
        const rm_ent_t *e = &c->ring[v - 1];
        if (e->ehash == ehash && e->pod == pod)
            return i;
        i = (i + 1) & c->mask;
    }
}

/* Empties index slot @i, moving later entries of its run back (linear probing stays whole). */
static void rm_unslot(kvt_ev_ctx_t *c, uint32_t i)
{
    uint32_t j = i;
    for (;;) {
        c->slot[i] = 0;
        for (;;) {
            j = (j + 1) & c->mask;
            uint32_t v = c->slot[j];
            if (v == 0)
                return;
            const rm_ent_t *e = &c->ring[v - 1];
            uint32_t h = rm_home(c, e->pod, e->ehash);
            /* move it back unless its home lies cyclically in (i, j] */
            bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
            if (!stays) {
                c->slot[i] = v;
                i = j;
                break;
            }
        }
    }
}

void kvt_ev_ctx_removed_put(kvt_ev_ctx_t *ctx, uint32_t pod, uint64_t ehash, uint32_t ns,
                            uint64_t key, const uint64_t *parent_key)
{
    if (ctx == NULL || ctx->budget == 0 || (ctx->ring == NULL && !rm_alloc(ctx)))
        return;
    if (ev_ctx_pod(ctx, pod) != KVT_OK)
        return;
    rm_ent_t v = {.ehash = ehash,
                  .key = key,
                  .parent = parent_key ? *parent_key : 0,
                  .pod = pod,
                  .epoch = ctx->epoch[pod],
                  .ns = ns,
                  .has_parent = parent_key != NULL};
    uint32_t i = rm_find(ctx, pod, ehash);
    if (ctx->slot[i] != 0) {
        ctx->ring[ctx->slot[i] - 1] = v; /* newer facts about the same block; its age stays */
        return;
    }
    if (ctx->n == ctx->cap) {
        const rm_ent_t *old = &ctx->ring[ctx->head];
        rm_unslot(ctx, rm_find(ctx, old->pod, old->ehash));
        ctx->head = ctx->head + 1 == ctx->cap ? 0 : ctx->head + 1;
        ctx->n--;
        ctx->evicted++;
        i = rm_find(ctx, pod, ehash); /* the shift may have moved the empty slot */
    }
    uint32_t at = ctx->head + ctx->n;
    if (at >= ctx->cap)
        at -= ctx->cap;
    ctx->ring[at] = v;
    ctx->slot[i] = at + 1;
    ctx->n++;
}

bool kvt_ev_ctx_removed_get(kvt_ev_ctx_t *ctx, uint32_t pod, uint64_t ehash, uint32_t *ns_p,
                            uint64_t *key_p, bool *has_parent_p, uint64_t *parent_p)
{
    if (ctx == NULL || ctx->n == 0 || pod >= ctx->npods)
        return false;
    uint32_t v = ctx->slot[rm_find(ctx, pod, ehash)];
    if (v == 0)
        return false;
    const rm_ent_t *e = &ctx->ring[v - 1];
    if (e->epoch != ctx->epoch[pod])
        return false; /* recorded before the pod's state was dropped */
    *ns_p = e->ns;
    *key_p = e->key;
    *has_parent_p = e->has_parent != 0;
    *parent_p = e->parent;
    return true;
}

/* ---- the event paths that use them -------------------------------------------------------- */

#define CTX_CHUNK 128u

kvt_status_t ev_ctx_placeholder(kvt_ev_ctx_t *ctx, kvt_idx_t *idx, uint32_t pod,
                                const kvt_event_t *e, kvt_ev_counters_t *c)
{
    size_t unresolved = 0;
    if (ctx == NULL || ctx->n == 0) {
        kvt_status_t st =
            kvt_idx_store_by_ehash(idx, pod, e->tier, e->hashes, e->nhashes, &unresolved);
        c->unresolved += unresolved;
        return st;
    }
    uint64_t rest[CTX_CHUNK];
    size_t nrest = 0;
    kvt_status_t st = KVT_OK;
    for (uint32_t i = 0; i <= e->nhashes && st == KVT_OK; i++) {
        if (i == e->nhashes || nrest == CTX_CHUNK) {
            st = kvt_idx_store_by_ehash(idx, pod, e->tier, rest, nrest, &unresolved);
            c->unresolved += unresolved;
            nrest = 0;
            if (i == e->nhashes)
                break;
        }
        uint32_t ns;
        uint64_t key, parent;
        bool has_parent;
        if (!kvt_ev_ctx_removed_get(ctx, pod, e->hashes[i], &ns, &key, &has_parent, &parent)) {
            rest[nrest++] = e->hashes[i];
            continue;
        }
        kvt_idx_stats_t before, after;
        kvt_idx_stats(idx, &before);
        st = kvt_idx_store(idx, ns, pod, e->tier, has_parent ? &parent : NULL, &key, &e->hashes[i],
                           1);
        kvt_idx_stats(idx, &after);
        if (st == KVT_ERR_INVAL) {
            c->unresolved++; /* its namespace is gone */
            st = KVT_OK;
        } else if (st == KVT_OK && after.dropped == before.dropped) {
            c->recovered++; /* one the budget had no room for is the caller's dropped */
            ctx->hits++;
        }
    }
    return st;
}

kvt_status_t ev_ctx_remove(kvt_ev_ctx_t *ctx, kvt_idx_t *idx, uint32_t pod, const kvt_event_t *e,
                           kvt_ev_counters_t *c)
{
    size_t unresolved = 0;
    if (ctx == NULL || ctx->budget == 0) {
        kvt_status_t st = kvt_idx_remove(idx, pod, e->tier, e->hashes, e->nhashes, &unresolved);
        c->unresolved += unresolved;
        return st;
    }
    kvt_idx_gone_t gone[CTX_CHUNK]; /* on the stack: no malloc per removal */
    kvt_status_t st = KVT_OK;
    for (uint32_t i = 0; i < e->nhashes && st == KVT_OK; i += CTX_CHUNK) {
        size_t n = e->nhashes - i < CTX_CHUNK ? e->nhashes - i : CTX_CHUNK, ngone = 0;
        st = kvt_idx_remove_report(idx, pod, e->tier, e->hashes + i, n, &unresolved, gone, &ngone);
        c->unresolved += unresolved;
        for (size_t k = 0; k < ngone; k++)
            kvt_ev_ctx_removed_put(ctx, pod, gone[k].ehash, gone[k].ns, gone[k].key,
                                   gone[k].has_parent ? &gone[k].parent_key : NULL);
    }
    return st;
}
