/*
 * tiers/tmap.c: the tier's block table. A fixed pool of records (one per
 * block held: at most RAM slots + disk slots), an open-addressing hash from
 * (namespace, key) to a record, and two intrusive LRU lists.
 */
#include <stdlib.h>
#include <string.h>

#include "tiers/store_int.h"

static inline uint64_t mix(uint32_t ns, uint64_t key)
{
    uint64_t z = key ^ ((uint64_t)ns * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

kvt_status_t tmap_init(tmap_t *m, uint32_t cap)
{
    memset(m, 0, sizeof(*m));
    m->ram.head = m->ram.tail = TB_NONE;
    m->disk.head = m->disk.tail = TB_NONE;
    if (cap == 0 || cap > (UINT32_MAX >> 2))
        return KVT_ERR_RANGE;
    uint32_t hsize = 16;
    while (hsize < cap * 2u)
        hsize <<= 1;
    m->b = calloc(cap, sizeof(*m->b));
    m->free = malloc((size_t)cap * sizeof(uint32_t));
    m->h = malloc((size_t)hsize * sizeof(uint32_t));
    if (m->b == NULL || m->free == NULL || m->h == NULL) {
        tmap_cleanup(m);
        return KVT_ERR_NO_MEM;
    }
    memset(m->h, 0xff, (size_t)hsize * sizeof(uint32_t));
    m->hmask = hsize - 1;
    m->cap = cap;
    for (uint32_t i = 0; i < cap; i++)
        m->free[i] = cap - 1 - i;
    m->nfree = cap;
    return KVT_OK;
}

void tmap_cleanup(tmap_t *m)
{
    free(m->b);
    free(m->free);
    free(m->h);
    m->b = NULL;
    m->free = m->h = NULL;
    m->cap = m->nfree = 0;
}

uint32_t tmap_find(const tmap_t *m, uint32_t ns, uint64_t key)
{
    if (m->h == NULL)
        return TB_NONE;
    for (uint32_t i = (uint32_t)mix(ns, key) & m->hmask;; i = (i + 1) & m->hmask) {
        uint32_t bi = m->h[i];
        if (bi == TB_NONE)
            return TB_NONE;
        if (m->b[bi].key == key && m->b[bi].ns == ns)
            return bi;
    }
}

uint32_t tmap_add(tmap_t *m, uint32_t ns, uint64_t key)
{
    if (m->nfree == 0)
        return TB_NONE;
    uint32_t bi = m->free[--m->nfree];
    tblk_t *b = &m->b[bi];
    memset(b, 0, sizeof(*b));
    b->key = key;
    b->ns = ns;
    b->ram = b->disk = TB_NONE;
    b->rprev = b->rnext = b->dprev = b->dnext = TB_NONE;
    uint32_t i = (uint32_t)mix(ns, key) & m->hmask;
    while (m->h[i] != TB_NONE)
        i = (i + 1) & m->hmask;
    m->h[i] = bi;
    return bi;
}

void tmap_del(tmap_t *m, uint32_t bi)
{
    tblk_t *b = &m->b[bi];
    uint32_t i = (uint32_t)mix(b->ns, b->key) & m->hmask;
    while (m->h[i] != bi)
        i = (i + 1) & m->hmask;
    /* backward shift: move later entries of the run into the hole when their home allows */
    for (uint32_t j = (i + 1) & m->hmask;; j = (j + 1) & m->hmask) {
        uint32_t bj = m->h[j];
        if (bj == TB_NONE)
            break;
        uint32_t home = (uint32_t)mix(m->b[bj].ns, m->b[bj].key) & m->hmask;
        /* bj may fill hole i when its home is not in (i, j] (cyclically) */
        if (((j - home) & m->hmask) >= ((j - i) & m->hmask)) {
            m->h[i] = bj;
            i = j;
        }
    }
    m->h[i] = TB_NONE;
    b->flags = 0;
    m->free[m->nfree++] = bi;
}

static inline uint32_t *prevp(tmap_t *m, bool disk, uint32_t bi)
{
    return disk ? &m->b[bi].dprev : &m->b[bi].rprev;
}

static inline uint32_t *nextp(tmap_t *m, bool disk, uint32_t bi)
{
    return disk ? &m->b[bi].dnext : &m->b[bi].rnext;
}

void tlist_push(tmap_t *m, tlist_t *l, bool disk, uint32_t bi)
{
    *prevp(m, disk, bi) = TB_NONE;
    *nextp(m, disk, bi) = l->head;
    if (l->head != TB_NONE)
        *prevp(m, disk, l->head) = bi;
    else
        l->tail = bi;
    l->head = bi;
    l->n++;
}

void tlist_unlink(tmap_t *m, tlist_t *l, bool disk, uint32_t bi)
{
    uint32_t p = *prevp(m, disk, bi), n = *nextp(m, disk, bi);
    if (p != TB_NONE)
        *nextp(m, disk, p) = n;
    else
        l->head = n;
    if (n != TB_NONE)
        *prevp(m, disk, n) = p;
    else
        l->tail = p;
    *prevp(m, disk, bi) = *nextp(m, disk, bi) = TB_NONE;
    l->n--;
}

void tlist_touch(tmap_t *m, tlist_t *l, bool disk, uint32_t bi)
{
    if (l->head == bi)
        return;
    tlist_unlink(m, l, disk, bi);
    tlist_push(m, l, disk, bi);
}

void tlist_place(tmap_t *m, tlist_t *l, bool disk, uint32_t after, uint32_t bi)
{
    if (after == TB_NONE) {
        tlist_touch(m, l, disk, bi);
        return;
    }
    if (*nextp(m, disk, after) == bi)
        return;
    tlist_unlink(m, l, disk, bi);
    uint32_t next = *nextp(m, disk, after);
    *prevp(m, disk, bi) = after;
    *nextp(m, disk, bi) = next;
    *nextp(m, disk, after) = bi;
    if (next != TB_NONE)
        *prevp(m, disk, next) = bi;
    else
        l->tail = bi;
    l->n++;
}
