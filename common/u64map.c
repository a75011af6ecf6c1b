/*
 * common/u64map.c: see u64map.h. Kept at most 3/4 full; a deletion moves
 * back the entries of its probe run that may sit in the freed slot, so a
 * lookup can stop at the first empty slot.
 */
#include "common/u64map.h"

#include <stdlib.h>

static size_t home(uint64_t key, size_t cap)
{
    key ^= key >> 33; /* a 64-bit mix (murmur3's finalizer): ids may share their low bits */
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

void kvt_u64map_free(kvt_u64map_t *m)
{
    free(m->keys);
    free(m->vals);
    *m = (kvt_u64map_t){0};
}

/* The slot of @key, or the empty slot where it would go. */
static size_t find(const kvt_u64map_t *m, uint64_t key)
{
    size_t i = home(key, m->cap);
    while (m->vals[i] != 0 && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

uint8_t kvt_u64map_get(const kvt_u64map_t *m, uint64_t key)
{
    if (m->n == 0)
        return 0;
    return m->vals[find(m, key)];
}

static bool grow(kvt_u64map_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    kvt_u64map_t g = {.keys = malloc(cap * sizeof(uint64_t)), .vals = calloc(cap, 1), .cap = cap};
    if (g.keys == NULL || g.vals == NULL) {
        kvt_u64map_free(&g);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->vals[i] != 0) {
            size_t j = find(&g, m->keys[i]);
            g.keys[j] = m->keys[i];
            g.vals[j] = m->vals[i];
            g.n++;
        }
    kvt_u64map_free(m);
    *m = g;
    return true;
}

/* Empties slot @i and moves back the entries after it that belong at or before it. */
static void erase(kvt_u64map_t *m, size_t i)
{
    size_t mask = m->cap - 1;
    size_t j = i;
    for (;;) {
        m->vals[i] = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (m->vals[j] == 0) {
                m->n--;
                return;
            }
            size_t h = home(m->keys[j], m->cap);
            /* j's entry may move to i when its home is not cyclically within (i, j] */
            if (i <= j ? (h <= i || h > j) : (h <= i && h > j))
                break;
        }
        m->keys[i] = m->keys[j];
        m->vals[i] = m->vals[j];
        i = j;
    }
}

bool kvt_u64map_put(kvt_u64map_t *m, uint64_t key, uint8_t val)
{
    if (val == 0) {
        if (m->n > 0) {
            size_t i = find(m, key);
            if (m->vals[i] != 0)
                erase(m, i);
        }
        return true;
    }
    if ((m->n + 1) * 4 > m->cap * 3 && !grow(m))
        return false;
    size_t i = find(m, key);
    if (m->vals[i] == 0) {
        m->keys[i] = key;
        m->n++;
    }
    m->vals[i] = val;
    return true;
}

size_t kvt_u64map_sweep(kvt_u64map_t *m, size_t *cursor, size_t max,
                        uint8_t (*fn)(void *arg, uint64_t key, uint8_t val), void *arg)
{
    size_t visited = 0;
    if (m->n == 0)
        return 0;
    size_t i = *cursor & (m->cap - 1);
    for (size_t slots = 0; slots < max && slots < m->cap && m->n > 0;) {
        if (m->vals[i] != 0) {
            visited++;
            uint8_t v = fn(arg, m->keys[i], m->vals[i]);
            if (v == 0) {
                erase(m, i); /* an entry may have moved into i: look at i again */
                continue;    /* (each erase shrinks n: this ends) */
            }
            m->vals[i] = v;
        }
        i = (i + 1) & (m->cap - 1);
        slots++;
    }
    *cursor = i;
    return visited;
}
