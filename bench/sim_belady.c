/*
 * bench/sim_belady: one pod under Belady's farthest-next-use eviction, the
 * offline reference beside the ideal (sim.h's kvt_sim_belady).
 *
 * Every occurrence of a block gets the key of its next use, (request << 32 |
 * position in it), or UINT64_MAX when there is none. A cached block carries
 * the key of its latest occurrence; eviction takes the largest key first from
 * a max-heap whose stale entries (the block was touched again, or evicted)
 * are dropped when they surface. The position breaks ties between blocks
 * next used by the same request: the deeper one is worth less, since a
 * leading run ends at its first miss. On a trace whose ids name prefixes
 * (Mooncake's) the cache so stays prefix-closed.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sim.h"
#include "common/heap.h"

#define BEL_NEVER UINT64_MAX

typedef struct bel_ent {
    uint64_t key; /* the block's next use */
    uint32_t blk; /* dense block id */
} bel_ent_t;

#define BEL_FARTHER(a, b) ((a)->key > (b)->key)
KVT_HEAP_DEFINE(bel_heap, bel_ent_t, BEL_FARTHER)

typedef struct bel {
    uint32_t *dense;  /* per trace position: the block's dense id */
    uint64_t *next;   /* per trace position: key of the block's next use */
    uint64_t *cur;    /* per dense id: the key it is cached under */
    uint32_t *in_req; /* per dense id: the last request that touched it (+1; 0: none) */
    bool *cached;     /* per dense id */
    bel_ent_t *heap;  /* max-heap by key, stale entries included */
    size_t nheap;
    bel_ent_t *stash; /* the running request's own entries, popped while evicting */
} bel_t;

static int bel_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void bel_cleanup(bel_t *b)
{
    free(b->dense);
    free(b->next);
    free(b->cur);
    free(b->in_req);
    free(b->cached);
    free(b->heap);
    free(b->stash);
}

/* Dense ids and next-use keys for every trace position. */
static kvt_status_t bel_init(bel_t *b, const kvt_trace_t *t)
{
    size_t n = t->nids ? t->nids : 1, nd = 0;
    memset(b, 0, sizeof(*b));
    uint64_t *u = malloc(n * sizeof(*u));
    b->dense = malloc(n * sizeof(*b->dense));
    b->next = malloc(n * sizeof(*b->next));
    /* one entry per touch at most: one set aside goes back after it was popped */
    b->heap = malloc(n * sizeof(*b->heap));
    b->stash = malloc((t->max_blocks ? t->max_blocks : 1) * sizeof(*b->stash));
    if (u == NULL || b->dense == NULL || b->next == NULL || b->heap == NULL || b->stash == NULL)
        goto err_nomem;
    if (t->nids > 0)
        memcpy(u, t->ids, t->nids * sizeof(*u));
    qsort(u, t->nids, sizeof(*u), bel_cmp_u64);
    for (size_t i = 0; i < t->nids; i++)
        if (nd == 0 || u[nd - 1] != u[i])
            u[nd++] = u[i];
    for (size_t i = 0; i < t->nids; i++) {
        const uint64_t *hit = bsearch(&t->ids[i], u, nd, sizeof(*u), bel_cmp_u64);
        b->dense[i] = (uint32_t)(hit - u);
    }
    free(u);
    u = NULL;

    size_t nb = nd ? nd : 1;
    b->cur = malloc(nb * sizeof(*b->cur));
    b->in_req = calloc(nb, sizeof(*b->in_req));
    b->cached = calloc(nb, sizeof(*b->cached));
    if (b->cur == NULL || b->in_req == NULL || b->cached == NULL)
        goto err_nomem;
    /* backward over requests; cur[] holds each block's next use meanwhile */
    for (size_t d = 0; d < nd; d++)
        b->cur[d] = BEL_NEVER;
    for (size_t i = t->nreqs; i-- > 0;) {
        const kvt_trace_req_t *q = &t->reqs[i];
        size_t off = (size_t)(q->hash_ids - t->ids);
        for (uint32_t k = 0; k < q->nblocks; k++)
            b->next[off + k] = b->cur[b->dense[off + k]];
        for (uint32_t k = q->nblocks; k-- > 0;) /* a block twice in one request: its first */
            b->cur[b->dense[off + k]] = (uint64_t)i << 32 | k;
    }
    return KVT_OK;

err_nomem:
    free(u);
    bel_cleanup(b);
    return KVT_ERR_NO_MEM;
}

kvt_status_t kvt_sim_belady(const kvt_trace_t *t, uint64_t capacity, uint64_t *hit_p,
                            uint64_t *total_p)
{
    bel_t b;
    uint64_t hit = 0, total = 0, held = 0;
    uint64_t cap = capacity ? capacity : UINT64_MAX;

    if (t->nreqs >= UINT32_MAX)
        return KVT_ERR_INVAL;
    if (bel_init(&b, t) != KVT_OK)
        return KVT_ERR_NO_MEM;
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *q = &t->reqs[i];
        size_t off = (size_t)(q->hash_ids - t->ids);
        uint32_t n = q->nblocks, run = 0;
        uint32_t mark = (uint32_t)i + 1;

        while (run < n && b.cached[b.dense[off + run]])
            run++;
        hit += run;
        total += n;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t d = b.dense[off + k];
            if (!b.cached[d]) {
                b.cached[d] = true;
                held++;
            }
            if (b.in_req[d] == mark && b.cur[d] == b.next[off + k])
                continue; /* the same block twice in this request */
            b.cur[d] = b.next[off + k];
            b.in_req[d] = mark;
            bel_heap_push(b.heap, &b.nheap, (bel_ent_t){b.cur[d], d});
        }
        /* evict farthest first, sparing this request's blocks while others remain */
        uint32_t nstash = 0, s = 0;
        while (held > cap && b.nheap > 0) {
            bel_ent_t e = bel_heap_pop(b.heap, &b.nheap);
            if (!b.cached[e.blk] || b.cur[e.blk] != e.key)
                continue; /* stale */
            if (b.in_req[e.blk] == mark) {
                b.stash[nstash++] = e;
                continue;
            }
            b.cached[e.blk] = false;
            held--;
        }
        /* the stash holds this request's blocks farthest first */
        for (; held > cap && s < nstash; s++) {
            b.cached[b.stash[s].blk] = false;
            held--;
        }
        for (; s < nstash; s++)
            bel_heap_push(b.heap, &b.nheap, b.stash[s]);
    }
    bel_cleanup(&b);
    if (hit_p != NULL)
        *hit_p = hit;
    if (total_p != NULL)
        *total_p = total;
    return KVT_OK;
}
