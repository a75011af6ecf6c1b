/* bench/sim_cache: one pod's LRU block cache (sim_cache.h). */
#include "bench/sim_cache.h"

#include <stdlib.h>
#include <string.h>

uint64_t kvt_sim_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

kvt_status_t kvt_sim_cache_init(kvt_sim_cache_t *c, uint64_t cap, uint32_t room)
{
    memset(c, 0, sizeof(*c));
    if (cap == 0 || cap + room >= KVT_SIM_NONE - 1)
        return KVT_ERR_INVAL;
    uint64_t nodes = cap + room + 1;
    uint64_t nslots = 16;
    while (nslots < 2 * nodes)
        nslots <<= 1;
    c->nodes = malloc(nodes * sizeof(*c->nodes));
    c->slots = malloc(nslots * sizeof(*c->slots));
    if (c->nodes == NULL || c->slots == NULL) {
        free(c->nodes);
        free(c->slots);
        memset(c, 0, sizeof(*c));
        return KVT_ERR_NO_MEM;
    }
    memset(c->slots, 0xff, nslots * sizeof(*c->slots));
    for (uint64_t i = 0; i < nodes; i++)
        c->nodes[i].next = i + 1 < nodes ? (uint32_t)(i + 1) : KVT_SIM_NONE;
    c->mask = nslots - 1;
    c->nnodes = nodes;
    c->cap = cap;
    c->mru = c->lru = KVT_SIM_NONE;
    c->free_head = 0;
    return KVT_OK;
}

void kvt_sim_cache_cleanup(kvt_sim_cache_t *c)
{
    free(c->nodes);
    free(c->slots);
    memset(c, 0, sizeof(*c));
}

/* The slot holding @id, or the empty slot where it would go. */
static uint64_t cache_slot(const kvt_sim_cache_t *c, uint64_t id)
{
    uint64_t s = kvt_sim_mix(id) & c->mask;
    while (c->slots[s] != KVT_SIM_NONE && c->nodes[c->slots[s]].id != id)
        s = (s + 1) & c->mask;
    return s;
}

static void cache_unlink(kvt_sim_cache_t *c, uint32_t n)
{
    kvt_sim_node_t *x = &c->nodes[n];
    if (x->prev != KVT_SIM_NONE)
        c->nodes[x->prev].next = x->next;
    else
        c->mru = x->next;
    if (x->next != KVT_SIM_NONE)
        c->nodes[x->next].prev = x->prev;
    else
        c->lru = x->prev;
}

static void cache_push_mru(kvt_sim_cache_t *c, uint32_t n)
{
    c->nodes[n].prev = KVT_SIM_NONE;
    c->nodes[n].next = c->mru;
    if (c->mru != KVT_SIM_NONE)
        c->nodes[c->mru].prev = n;
    c->mru = n;
    if (c->lru == KVT_SIM_NONE)
        c->lru = n;
}

/* Removes the map's slot @s (backward-shift deletion: no tombstones). */
static void cache_slot_del(kvt_sim_cache_t *c, uint64_t s)
{
    uint64_t hole = s;
    for (uint64_t i = (s + 1) & c->mask; c->slots[i] != KVT_SIM_NONE; i = (i + 1) & c->mask) {
        uint64_t home = kvt_sim_mix(c->nodes[c->slots[i]].id) & c->mask;
        /* moves into the hole unless its home lies cyclically in (hole, i] */
        if (((i - home) & c->mask) >= ((i - hole) & c->mask)) {
            c->slots[hole] = c->slots[i];
            hole = i;
        }
    }
    c->slots[hole] = KVT_SIM_NONE;
}

bool kvt_sim_cache_has(const kvt_sim_cache_t *c, uint64_t id)
{
    return c->slots[cache_slot(c, id)] != KVT_SIM_NONE;
}

uint32_t kvt_sim_cache_hit(const kvt_sim_cache_t *c, const uint64_t *ids, uint32_t n)
{
    uint32_t b = 0;
    while (b < n && c->slots[cache_slot(c, ids[b])] != KVT_SIM_NONE)
        b++;
    return b;
}

void kvt_sim_cache_insert(kvt_sim_cache_t *c, const uint64_t *ids, uint32_t n, uint64_t *evicted,
                          uint32_t *nev_p)
{
    uint32_t nev = 0;
    for (uint32_t k = n; k-- > 0;) {
        uint64_t s = cache_slot(c, ids[k]);
        uint32_t node = c->slots[s];
        if (node != KVT_SIM_NONE) {
            cache_unlink(c, node);
            cache_push_mru(c, node);
            continue;
        }
        node = c->free_head;
        c->free_head = c->nodes[node].next;
        c->nodes[node].id = ids[k];
        c->nodes[node].pins = 0;
        c->slots[s] = node;
        cache_push_mru(c, node);
        c->held++;
    }
    while (c->held > c->cap) {
        uint32_t old = c->lru;
        evicted[nev++] = c->nodes[old].id;
        cache_slot_del(c, cache_slot(c, c->nodes[old].id));
        cache_unlink(c, old);
        c->nodes[old].next = c->free_head;
        c->free_head = old;
        c->held--;
    }
    *nev_p = nev;
}

/* Doubles the nodes (and the map when it would pass half full). */
static kvt_status_t cache_grow(kvt_sim_cache_t *c)
{
    uint64_t n = c->nnodes * 2;
    if (n >= KVT_SIM_NONE - 1)
        return KVT_ERR_NO_MEM;
    kvt_sim_node_t *nodes = realloc(c->nodes, n * sizeof(*nodes));
    if (nodes == NULL)
        return KVT_ERR_NO_MEM;
    c->nodes = nodes;
    for (uint64_t i = c->nnodes; i < n; i++)
        nodes[i].next = i + 1 < n ? (uint32_t)(i + 1) : c->free_head;
    c->free_head = (uint32_t)c->nnodes;
    c->nnodes = n;
    if (2 * n <= c->mask + 1)
        return KVT_OK;
    uint64_t nslots = (c->mask + 1) * 2;
    while (nslots < 2 * n)
        nslots <<= 1;
    uint32_t *slots = malloc(nslots * sizeof(*slots));
    if (slots == NULL)
        return KVT_ERR_NO_MEM;
    uint32_t *old = c->slots;
    uint64_t oldn = c->mask + 1;
    memset(slots, 0xff, nslots * sizeof(*slots));
    c->slots = slots;
    c->mask = nslots - 1;
    for (uint64_t i = 0; i < oldn; i++)
        if (old[i] != KVT_SIM_NONE)
            c->slots[cache_slot(c, c->nodes[old[i]].id)] = old[i];
    free(old);
    return KVT_OK;
}

kvt_status_t kvt_sim_cache_put(kvt_sim_cache_t *c, uint64_t id, uint32_t pins)
{
    uint64_t s = cache_slot(c, id);
    uint32_t node = c->slots[s];
    if (node != KVT_SIM_NONE) {
        kvt_sim_node_t *x = &c->nodes[node];
        if (x->pins == 0)
            cache_unlink(c, node);
        x->pins += pins;
        if (x->pins == 0)
            cache_push_mru(c, node);
        return KVT_OK;
    }
    if (c->free_head == KVT_SIM_NONE) {
        kvt_status_t st = cache_grow(c);
        if (st != KVT_OK)
            return st;
        s = cache_slot(c, id);
    }
    node = c->free_head;
    c->free_head = c->nodes[node].next;
    c->nodes[node].id = id;
    c->nodes[node].pins = pins;
    c->slots[s] = node;
    if (pins == 0)
        cache_push_mru(c, node);
    c->held++;
    return KVT_OK;
}

/* Frees node @node, held in slot @s. */
static void cache_drop(kvt_sim_cache_t *c, uint64_t s, uint32_t node)
{
    cache_slot_del(c, s);
    if (c->nodes[node].pins == 0)
        cache_unlink(c, node);
    c->nodes[node].next = c->free_head;
    c->free_head = node;
    c->held--;
}

bool kvt_sim_cache_remove(kvt_sim_cache_t *c, uint64_t id, uint32_t *pins_p)
{
    uint64_t s = cache_slot(c, id);
    uint32_t node = c->slots[s];
    if (node == KVT_SIM_NONE)
        return false;
    if (pins_p != NULL)
        *pins_p = c->nodes[node].pins;
    cache_drop(c, s, node);
    return true;
}

bool kvt_sim_cache_pin(kvt_sim_cache_t *c, uint64_t id, int delta)
{
    uint32_t node = c->slots[cache_slot(c, id)];
    if (node == KVT_SIM_NONE)
        return false;
    kvt_sim_node_t *x = &c->nodes[node];
    if (delta > 0) {
        if (x->pins++ == 0)
            cache_unlink(c, node);
        return true;
    }
    if (x->pins == 0)
        return false;
    if (--x->pins == 0)
        cache_push_mru(c, node);
    return true;
}

bool kvt_sim_cache_evict(kvt_sim_cache_t *c, uint64_t *id_p)
{
    if (c->held <= c->cap || c->lru == KVT_SIM_NONE)
        return false;
    uint32_t old = c->lru;
    *id_p = c->nodes[old].id;
    cache_drop(c, cache_slot(c, c->nodes[old].id), old);
    return true;
}
