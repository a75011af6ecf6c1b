/*
 * bench/naive_index: the plain reference model (see naive_index.h).
 *
 * Layout:
 *   blocks:  chained table (ns, key) -> nv_block -> singly linked nv_holder list
 *   holder:  one (block, pod) entry; the ehash nodes mapping to it, its tiers
 *            (OR of theirs, kept up to date) and its speculative mark, if any
 *   pod:     chained table ehash -> nv_ehash, plus a list of nv_spec marks
 * Empty containers are freed at once (a holder with no ehash and no mark, a
 * block with no holder, a pod with no entry, bucket arrays with no node), so
 * an emptied model holds exactly what a new one does.
 */
#include "bench/naive_index.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct nv_block nv_block_t;
typedef struct nv_holder nv_holder_t;
typedef struct nv_ehash nv_ehash_t;
typedef struct nv_spec nv_spec_t;
typedef struct nv_pod nv_pod_t;

struct nv_block {
    nv_block_t *next;     /* bucket chain */
    nv_holder_t *holders; /* one per pod holding the block */
    uint64_t key;
    uint32_t ns;
};

struct nv_holder {
    nv_holder_t *next;   /* next holder of the same block */
    nv_block_t *block;   /* back pointer: (ns, key) */
    nv_ehash_t *ehashes; /* ehashes of the pod mapping here, via nv_ehash.hnext */
    nv_spec_t *spec;     /* speculative mark, or NULL */
    uint32_t pod;
    unsigned tiers; /* OR of the ehashes' tiers */
};

struct nv_ehash {
    nv_ehash_t *next;  /* bucket chain of the pod's map */
    nv_ehash_t *hnext; /* next ehash of the same holder */
    nv_holder_t *holder;
    uint64_t ehash;
    unsigned tiers; /* never empty while linked */
};

struct nv_spec {
    nv_spec_t *next; /* pod's mark list */
    nv_holder_t *holder;
    uint64_t expiry_ms;
};

struct nv_pod {
    nv_ehash_t **buckets; /* NULL while the pod maps no ehash */
    size_t nbuckets;
    size_t nehash;
    nv_spec_t *specs;
    uint64_t entries; /* holders of this pod */
    /* query scratch */
    uint64_t filter_gen; /* == query gen: pod passes the pods filter */
    uint64_t run_gen;    /* == query gen: run/gpu/cpu/disk are this query's */
    uint32_t run, gpu, cpu, disk;
};

struct kvt_naive {
    nv_block_t **buckets; /* NULL while there is no block */
    size_t nbuckets;
    size_t nblocks;
    nv_pod_t **pods; /* indexed by pod id, NULL for pods with no entry */
    uint32_t *qlist; /* query scratch: pods with a run, room for pods_cap */
    size_t pods_cap;
    size_t pods_live;
    uint64_t entries;
    uint64_t nspecs;
    uint64_t now_ms;
    uint64_t gen; /* query generation */
    uint64_t bytes;
};

/* ---- allocation, counted ---- */

static void nv_oom(size_t size)
{
    fprintf(stderr, "kvt_naive: out of memory allocating %zu bytes\n", size);
    abort();
}

static void *nv_calloc(kvt_naive_t *n, size_t count, size_t size)
{
    void *p = calloc(count, size);
    if (p == NULL)
        nv_oom(count * size);
    n->bytes += malloc_usable_size(p);
    return p;
}

static void nv_free(kvt_naive_t *n, void *p)
{
    if (p == NULL)
        return;
    n->bytes -= malloc_usable_size(p);
    free(p);
}

/* ---- hashing ---- */

static uint64_t nv_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static size_t nv_block_slot(const kvt_naive_t *n, uint32_t ns, uint64_t key)
{
    return (size_t)(nv_mix(key ^ ((uint64_t)ns * 0x9e3779b97f4a7c15ull)) & (n->nbuckets - 1));
}

static size_t nv_ehash_slot(const nv_pod_t *p, uint64_t ehash)
{
    return (size_t)(nv_mix(ehash) & (p->nbuckets - 1));
}

/* ---- blocks ---- */

static nv_block_t *nv_block_find(const kvt_naive_t *n, uint32_t ns, uint64_t key)
{
    if (n->buckets == NULL)
        return NULL;
    for (nv_block_t *b = n->buckets[nv_block_slot(n, ns, key)]; b != NULL; b = b->next)
        if (b->key == key && b->ns == ns)
            return b;
    return NULL;
}

static void nv_block_rehash(kvt_naive_t *n, size_t nbuckets)
{
    nv_block_t **old = n->buckets;
    size_t oldn = n->nbuckets;
    n->buckets = nv_calloc(n, nbuckets, sizeof(*n->buckets));
    n->nbuckets = nbuckets;
    for (size_t i = 0; i < oldn; i++) {
        nv_block_t *b = old[i];
        while (b != NULL) {
            nv_block_t *next = b->next;
            size_t s = nv_block_slot(n, b->ns, b->key);
            b->next = n->buckets[s];
            n->buckets[s] = b;
            b = next;
        }
    }
    nv_free(n, old);
}

static nv_block_t *nv_block_get(kvt_naive_t *n, uint32_t ns, uint64_t key)
{
    nv_block_t *b = nv_block_find(n, ns, key);
    if (b != NULL)
        return b;
    if (n->buckets == NULL)
        nv_block_rehash(n, 16);
    else if (n->nblocks >= n->nbuckets)
        nv_block_rehash(n, n->nbuckets * 2);
    b = nv_calloc(n, 1, sizeof(*b));
    b->ns = ns;
    b->key = key;
    size_t s = nv_block_slot(n, ns, key);
    b->next = n->buckets[s];
    n->buckets[s] = b;
    n->nblocks++;
    return b;
}

static void nv_block_free(kvt_naive_t *n, nv_block_t *b)
{
    nv_block_t **pp = &n->buckets[nv_block_slot(n, b->ns, b->key)];
    while (*pp != b)
        pp = &(*pp)->next;
    *pp = b->next;
    nv_free(n, b);
    if (--n->nblocks == 0) {
        nv_free(n, n->buckets);
        n->buckets = NULL;
        n->nbuckets = 0;
    }
}

/* ---- pods ---- */

static nv_pod_t *nv_pod_find(const kvt_naive_t *n, uint32_t pod)
{
    return pod < n->pods_cap ? n->pods[pod] : NULL;
}

/* @pod < KVT_NAIVE_MAX_PODS. */
static nv_pod_t *nv_pod_get(kvt_naive_t *n, uint32_t pod)
{
    if (pod >= n->pods_cap) {
        size_t cap = n->pods_cap ? n->pods_cap : 8;
        while (cap <= pod)
            cap *= 2;
        if (cap > KVT_NAIVE_MAX_PODS)
            cap = KVT_NAIVE_MAX_PODS;
        nv_pod_t **pods = nv_calloc(n, cap, sizeof(*pods));
        uint32_t *qlist = nv_calloc(n, cap, sizeof(*qlist));
        if (n->pods != NULL)
            memcpy(pods, n->pods, n->pods_cap * sizeof(*pods));
        nv_free(n, n->pods);
        nv_free(n, n->qlist);
        n->pods = pods;
        n->qlist = qlist;
        n->pods_cap = cap;
    }
    if (n->pods[pod] == NULL) {
        n->pods[pod] = nv_calloc(n, 1, sizeof(nv_pod_t));
        n->pods_live++;
    }
    return n->pods[pod];
}

/* Frees @pod's state once it holds nothing; the pod arrays go with the last pod. */
static void nv_pod_maybe_free(kvt_naive_t *n, uint32_t pod)
{
    nv_pod_t *p = nv_pod_find(n, pod);
    if (p == NULL || p->entries != 0)
        return;
    /* no holder means no ehash and no mark */
    nv_free(n, p->buckets);
    nv_free(n, p);
    n->pods[pod] = NULL;
    if (--n->pods_live == 0) {
        nv_free(n, n->pods);
        nv_free(n, n->qlist);
        n->pods = NULL;
        n->qlist = NULL;
        n->pods_cap = 0;
    }
}

/* ---- holders ---- */

static nv_holder_t *nv_holder_find(const nv_block_t *b, uint32_t pod)
{
    for (nv_holder_t *h = b->holders; h != NULL; h = h->next)
        if (h->pod == pod)
            return h;
    return NULL;
}

static nv_holder_t *nv_holder_get(kvt_naive_t *n, nv_pod_t *p, uint32_t ns, uint64_t key,
                                  uint32_t pod)
{
    nv_block_t *b = nv_block_get(n, ns, key);
    nv_holder_t *h = nv_holder_find(b, pod);
    if (h != NULL)
        return h;
    h = nv_calloc(n, 1, sizeof(*h));
    h->block = b;
    h->pod = pod;
    h->next = b->holders;
    b->holders = h;
    p->entries++;
    n->entries++;
    return h;
}

/* Frees @h (and its block when it was the last holder) once nothing keeps it. */
static void nv_holder_maybe_free(kvt_naive_t *n, nv_pod_t *p, nv_holder_t *h)
{
    if (h->ehashes != NULL || h->spec != NULL)
        return;
    nv_block_t *b = h->block;
    nv_holder_t **pp = &b->holders;
    while (*pp != h)
        pp = &(*pp)->next;
    *pp = h->next;
    nv_free(n, h);
    p->entries--;
    n->entries--;
    if (b->holders == NULL)
        nv_block_free(n, b);
}

static void nv_holder_retier(nv_holder_t *h)
{
    unsigned t = 0;
    for (nv_ehash_t *e = h->ehashes; e != NULL; e = e->hnext)
        t |= e->tiers;
    h->tiers = t;
}

/* ---- speculative marks ---- */

/* Unlinks and frees @h's mark; the caller then calls nv_holder_maybe_free(). */
static void nv_spec_drop(kvt_naive_t *n, nv_pod_t *p, nv_holder_t *h)
{
    nv_spec_t **pp = &p->specs;
    while (*pp != h->spec)
        pp = &(*pp)->next;
    *pp = h->spec->next;
    nv_free(n, h->spec);
    h->spec = NULL;
    n->nspecs--;
}

/* ---- ehash map ---- */

static nv_ehash_t *nv_ehash_find(const nv_pod_t *p, uint64_t ehash)
{
    if (p->buckets == NULL)
        return NULL;
    for (nv_ehash_t *e = p->buckets[nv_ehash_slot(p, ehash)]; e != NULL; e = e->next)
        if (e->ehash == ehash)
            return e;
    return NULL;
}

static void nv_ehash_rehash(kvt_naive_t *n, nv_pod_t *p, size_t nbuckets)
{
    nv_ehash_t **old = p->buckets;
    size_t oldn = p->nbuckets;
    p->buckets = nv_calloc(n, nbuckets, sizeof(*p->buckets));
    p->nbuckets = nbuckets;
    for (size_t i = 0; i < oldn; i++) {
        nv_ehash_t *e = old[i];
        while (e != NULL) {
            nv_ehash_t *next = e->next;
            size_t s = nv_ehash_slot(p, e->ehash);
            e->next = p->buckets[s];
            p->buckets[s] = e;
            e = next;
        }
    }
    nv_free(n, old);
}

/* Maps a new @ehash of pod @p to holder @h, with no tier yet. */
static nv_ehash_t *nv_ehash_add(kvt_naive_t *n, nv_pod_t *p, nv_holder_t *h, uint64_t ehash)
{
    if (p->buckets == NULL)
        nv_ehash_rehash(n, p, 8);
    else if (p->nehash >= p->nbuckets)
        nv_ehash_rehash(n, p, p->nbuckets * 2);
    nv_ehash_t *e = nv_calloc(n, 1, sizeof(*e));
    e->ehash = ehash;
    e->holder = h;
    size_t s = nv_ehash_slot(p, ehash);
    e->next = p->buckets[s];
    p->buckets[s] = e;
    e->hnext = h->ehashes;
    h->ehashes = e;
    p->nehash++;
    return e;
}

/* Drops mapping @e of pod @p entirely; frees its holder if nothing else keeps it. */
static void nv_ehash_drop(kvt_naive_t *n, nv_pod_t *p, nv_ehash_t *e)
{
    nv_ehash_t **pp = &p->buckets[nv_ehash_slot(p, e->ehash)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    if (--p->nehash == 0) {
        nv_free(n, p->buckets);
        p->buckets = NULL;
        p->nbuckets = 0;
    }
    nv_holder_t *h = e->holder;
    pp = &h->ehashes;
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    nv_free(n, e);
    nv_holder_retier(h);
    nv_holder_maybe_free(n, p, h);
}

/* Removes @tiers from mapping @e; drops it when no tier is left. */
static void nv_ehash_untier(kvt_naive_t *n, nv_pod_t *p, nv_ehash_t *e, unsigned tiers)
{
    if ((e->tiers & tiers) == 0)
        return;
    e->tiers &= ~tiers;
    if (e->tiers == 0) {
        nv_ehash_drop(n, p, e);
        return;
    }
    nv_holder_retier(e->holder);
}

/* ---- public API ---- */

kvt_status_t kvt_naive_create(kvt_naive_t **n_p)
{
    if (n_p == NULL)
        return KVT_ERR_INVAL;
    kvt_naive_t *n = calloc(1, sizeof(*n));
    if (n == NULL)
        return KVT_ERR_NO_MEM;
    n->bytes = malloc_usable_size(n);
    *n_p = n;
    return KVT_OK;
}

void kvt_naive_destroy(kvt_naive_t *n)
{
    if (n == NULL)
        return;
    for (size_t i = 0; i < n->nbuckets; i++) {
        nv_block_t *b = n->buckets[i];
        while (b != NULL) {
            nv_block_t *bnext = b->next;
            nv_holder_t *h = b->holders;
            while (h != NULL) {
                nv_holder_t *hnext = h->next;
                nv_ehash_t *e = h->ehashes;
                while (e != NULL) {
                    nv_ehash_t *enext = e->hnext;
                    free(e);
                    e = enext;
                }
                free(h->spec);
                free(h);
                h = hnext;
            }
            free(b);
            b = bnext;
        }
    }
    free(n->buckets);
    for (size_t i = 0; i < n->pods_cap; i++) {
        if (n->pods[i] != NULL) {
            free(n->pods[i]->buckets);
            free(n->pods[i]);
        }
    }
    free(n->pods);
    free(n->qlist);
    free(n);
}

void kvt_naive_store(kvt_naive_t *n, uint32_t ns, uint32_t pod, unsigned tier, const uint64_t *keys,
                     const uint64_t *ehashes, size_t count)
{
    tier &= KVT_TIER_ALL;
    if (tier == 0 || pod >= KVT_NAIVE_MAX_PODS || count == 0)
        return;
    nv_pod_t *p = nv_pod_get(n, pod);
    for (size_t i = 0; i < count; i++) {
        uint64_t hv = ehashes != NULL ? ehashes[i] : keys[i];
        nv_ehash_t *e = nv_ehash_find(p, hv);
        if (e != NULL && (e->holder->block->ns != ns || e->holder->block->key != keys[i])) {
            nv_ehash_drop(n, p, e);
            e = NULL;
        }
        nv_holder_t *h;
        if (e == NULL) {
            h = nv_holder_get(n, p, ns, keys[i], pod);
            e = nv_ehash_add(n, p, h, hv);
        } else {
            h = e->holder;
        }
        e->tiers |= tier;
        h->tiers |= tier;
        if (h->spec != NULL)
            nv_spec_drop(n, p, h);
    }
}

size_t kvt_naive_store_by_ehash(kvt_naive_t *n, uint32_t pod, unsigned tier,
                                const uint64_t *ehashes, size_t count)
{
    nv_pod_t *p = nv_pod_find(n, pod);
    size_t unresolved = 0;
    tier &= KVT_TIER_ALL;
    for (size_t i = 0; i < count; i++) {
        nv_ehash_t *e = p != NULL ? nv_ehash_find(p, ehashes[i]) : NULL;
        if (e == NULL) {
            unresolved++;
            continue;
        }
        e->tiers |= tier;
        e->holder->tiers |= tier;
    }
    return unresolved;
}

size_t kvt_naive_remove_report(kvt_naive_t *n, uint32_t pod, unsigned tiers,
                               const uint64_t *ehashes, size_t count, kvt_idx_gone_t *gone,
                               size_t *ngone_p)
{
    size_t unresolved = 0, ngone = 0;
    tiers &= KVT_TIER_ALL;
    for (size_t i = 0; i < count; i++) {
        /* the pod may be freed by the previous iteration */
        nv_pod_t *p = nv_pod_find(n, pod);
        nv_ehash_t *e = p != NULL ? nv_ehash_find(p, ehashes[i]) : NULL;
        if (e == NULL) {
            unresolved++;
            continue;
        }
        if (gone != NULL && (e->tiers & tiers) != 0 && (e->tiers & ~tiers) == 0)
            gone[ngone++] =
                (kvt_idx_gone_t){ehashes[i], e->holder->block->key, 0, e->holder->block->ns, 0};
        nv_ehash_untier(n, p, e, tiers);
        nv_pod_maybe_free(n, pod);
    }
    if (ngone_p != NULL)
        *ngone_p = ngone;
    return unresolved;
}

size_t kvt_naive_remove(kvt_naive_t *n, uint32_t pod, unsigned tiers, const uint64_t *ehashes,
                        size_t count)
{
    return kvt_naive_remove_report(n, pod, tiers, ehashes, count, NULL, NULL);
}

uint64_t kvt_naive_ns_drop(kvt_naive_t *n, uint32_t ns)
{
    /* collect first: evicting frees blocks and may resize the bucket array */
    uint64_t *keys = NULL;
    size_t nk = 0, cap = 0;
    for (size_t b = 0; n->buckets != NULL && b < n->nbuckets; b++) {
        for (const nv_block_t *blk = n->buckets[b]; blk != NULL; blk = blk->next) {
            if (blk->ns != ns)
                continue;
            if (nk == cap) {
                cap = cap ? cap * 2 : 64;
                uint64_t *k2 = realloc(keys, cap * sizeof(*keys));
                if (k2 == NULL)
                    nv_oom(cap * sizeof(*keys));
                keys = k2;
            }
            keys[nk++] = blk->key;
        }
    }
    for (size_t i = 0; i < nk; i++)
        kvt_naive_evict(n, ns, keys[i]);
    free(keys);
    return nk;
}

void kvt_naive_pod_clear(kvt_naive_t *n, uint32_t pod, unsigned tiers)
{
    nv_pod_t *p = nv_pod_find(n, pod);
    tiers &= KVT_TIER_ALL;
    if (p == NULL || tiers == 0)
        return;
    /* Walk the bucket array by index; it may be freed when the last ehash goes. */
    for (size_t i = 0; p->buckets != NULL && i < p->nbuckets; i++) {
        nv_ehash_t *e = p->buckets[i];
        while (e != NULL) {
            nv_ehash_t *next = e->next; /* e may be freed; other nodes stay */
            nv_ehash_untier(n, p, e, tiers);
            e = next;
        }
    }
    if (tiers == KVT_TIER_ALL) {
        while (p->specs != NULL) {
            nv_holder_t *h = p->specs->holder;
            nv_spec_drop(n, p, h);
            nv_holder_maybe_free(n, p, h);
        }
    }
    nv_pod_maybe_free(n, pod);
}

void kvt_naive_speculate(kvt_naive_t *n, uint32_t ns, uint32_t pod, const uint64_t *keys,
                         size_t count, uint32_t ttl_ms)
{
    if (pod >= KVT_NAIVE_MAX_PODS || count == 0)
        return;
    uint64_t expiry = n->now_ms + ttl_ms;
    if (expiry < n->now_ms)
        expiry = UINT64_MAX;
    nv_pod_t *p = nv_pod_get(n, pod);
    for (size_t i = 0; i < count; i++) {
        nv_holder_t *h = nv_holder_get(n, p, ns, keys[i], pod);
        if (h->ehashes != NULL || h->spec != NULL)
            continue;
        nv_spec_t *s = nv_calloc(n, 1, sizeof(*s));
        s->holder = h;
        s->expiry_ms = expiry;
        s->next = p->specs;
        p->specs = s;
        h->spec = s;
        n->nspecs++;
    }
}

void kvt_naive_advance(kvt_naive_t *n, uint64_t now_ms)
{
    if (now_ms <= n->now_ms)
        return;
    n->now_ms = now_ms;
    for (size_t pod = 0; n->nspecs > 0 && pod < n->pods_cap; pod++) {
        nv_pod_t *p = n->pods[pod];
        if (p == NULL)
            continue;
        nv_spec_t **pp = &p->specs;
        while (*pp != NULL) {
            nv_spec_t *s = *pp;
            if (s->expiry_ms > now_ms) {
                pp = &s->next;
                continue;
            }
            *pp = s->next;
            nv_holder_t *h = s->holder;
            h->spec = NULL;
            nv_free(n, s);
            n->nspecs--;
            nv_holder_maybe_free(n, p, h);
        }
        nv_pod_maybe_free(n, (uint32_t)pod); /* may free n->pods: loop rechecks pods_cap */
    }
}

void kvt_naive_evict(kvt_naive_t *n, uint32_t ns, uint64_t key)
{
    nv_block_t *b;
    /* Each pass removes one holder; the block goes with the last one. */
    while ((b = nv_block_find(n, ns, key)) != NULL) {
        nv_holder_t *h = b->holders;
        uint32_t pod = h->pod;
        nv_pod_t *p = n->pods[pod];
        if (h->spec != NULL)
            nv_spec_drop(n, p, h);
        if (h->ehashes == NULL) {
            nv_holder_maybe_free(n, p, h);
        } else {
            while (h->ehashes->hnext != NULL)
                nv_ehash_drop(n, p, h->ehashes);
            nv_ehash_drop(n, p, h->ehashes); /* the last one frees h */
        }
        nv_pod_maybe_free(n, pod);
    }
}

static int nv_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Counts block @h of a run under its fastest tier. */
static void nv_count_tier(nv_pod_t *p, const nv_holder_t *h)
{
    if ((h->tiers & KVT_TIER_GPU) || h->spec != NULL)
        p->gpu++;
    else if (h->tiers & KVT_TIER_CPU)
        p->cpu++;
    else
        p->disk++;
}

size_t kvt_naive_query(kvt_naive_t *n, uint32_t ns, const uint64_t *keys, size_t count,
                       const uint32_t *pods, size_t npods, kvt_idx_match_t *out, size_t cap)
{
    if (count == 0 || n->pods_live == 0)
        return 0;
    uint64_t gen = ++n->gen;
    if (pods != NULL) {
        for (size_t i = 0; i < npods; i++) {
            nv_pod_t *p = nv_pod_find(n, pods[i]);
            if (p != NULL)
                p->filter_gen = gen;
        }
    }
    /* Block 0 starts a run on each (admitted) holder; block i extends runs of length i. */
    size_t nrun = 0;
    for (size_t i = 0; i < count && i < UINT32_MAX; i++) {
        nv_block_t *b = nv_block_find(n, ns, keys[i]);
        if (b == NULL)
            break;
        int extended = 0;
        for (nv_holder_t *h = b->holders; h != NULL; h = h->next) {
            nv_pod_t *p = n->pods[h->pod];
            if (i == 0) {
                if (pods != NULL && p->filter_gen != gen)
                    continue;
                p->run_gen = gen;
                p->run = p->gpu = p->cpu = p->disk = 0;
                n->qlist[nrun++] = h->pod;
            } else if (p->run_gen != gen || p->run != i) {
                continue;
            }
            p->run++;
            nv_count_tier(p, h);
            extended = 1;
        }
        if (!extended)
            break;
    }
    qsort(n->qlist, nrun, sizeof(*n->qlist), nv_cmp_u32);
    size_t nout = nrun < cap ? nrun : cap;
    for (size_t i = 0; i < nout; i++) {
        const nv_pod_t *p = n->pods[n->qlist[i]];
        out[i].pod = n->qlist[i];
        out[i].matched = p->run;
        out[i].gpu = p->gpu;
        out[i].cpu = p->cpu;
        out[i].disk = p->disk;
    }
    return nout;
}

uint64_t kvt_naive_entries(const kvt_naive_t *n)
{
    return n->entries;
}

uint64_t kvt_naive_blocks(const kvt_naive_t *n)
{
    return n->nblocks;
}

uint64_t kvt_naive_bytes(const kvt_naive_t *n)
{
    return n->bytes;
}

uint64_t kvt_naive_pod_entries(const kvt_naive_t *n, uint32_t pod)
{
    const nv_pod_t *p = nv_pod_find(n, pod);
    return p != NULL ? p->entries : 0;
}

void kvt_naive_tier_entries(const kvt_naive_t *n, uint64_t out[3])
{
    out[0] = out[1] = out[2] = 0;
    for (size_t b = 0; n->buckets != NULL && b < n->nbuckets; b++)
        for (const nv_block_t *blk = n->buckets[b]; blk != NULL; blk = blk->next)
            for (const nv_holder_t *h = blk->holders; h != NULL; h = h->next)
                for (unsigned t = 0; t < 3; t++)
                    out[t] += (h->tiers >> t) & 1u;
}
