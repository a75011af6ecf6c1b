/*
 * tiers/slots.c: the fixed-count slot allocator. The contract is in slots_int.h.
 *
 * free[0..nfree) holds the free slots and pos[] each free slot's index there,
 * so take() can pull a slot from the middle of the stack by moving the top
 * one into its place.
 */
#include "tiers/slots_int.h"

#include <stdlib.h>

kvt_status_t kvt_slots_init(kvt_slots_t *s, uint32_t n)
{
    if (n == KVT_SLOT_NONE) /* pos[] uses it to mark a used slot */
        return KVT_ERR_RANGE;
    /* n == 0 is a valid empty allocator; keep the arrays non-NULL all the same */
    size_t cap = n ? n : 1;
    uint32_t *fr = malloc(cap * sizeof(*fr));
    if (fr == NULL)
        return KVT_ERR_NO_MEM;
    uint32_t *pos = malloc(cap * sizeof(*pos));
    if (pos == NULL)
        goto err_free;
    /* the stack's top is slot 0, so the first allocs return 0, 1, 2, ... */
    for (uint32_t i = 0; i < n; i++) {
        fr[i] = n - 1 - i;
        pos[n - 1 - i] = i;
    }
    s->n = n;
    s->nfree = n;
    s->free = fr;
    s->pos = pos;
    return KVT_OK;

err_free:
    free(fr);
    return KVT_ERR_NO_MEM;
}

void kvt_slots_cleanup(kvt_slots_t *s)
{
    free(s->free);
    free(s->pos);
    s->free = NULL;
    s->pos = NULL;
    s->n = 0;
    s->nfree = 0;
}

uint32_t kvt_slots_alloc(kvt_slots_t *s)
{
    if (s->nfree == 0)
        return KVT_SLOT_NONE;
    uint32_t slot = s->free[--s->nfree];
    s->pos[slot] = KVT_SLOT_NONE;
    return slot;
}

bool kvt_slots_free(kvt_slots_t *s, uint32_t slot)
{
    if (slot >= s->n || s->pos[slot] != KVT_SLOT_NONE)
        return false;
    s->pos[slot] = s->nfree;
    s->free[s->nfree++] = slot;
    return true;
}

bool kvt_slots_take(kvt_slots_t *s, uint32_t slot)
{
    if (slot >= s->n || s->pos[slot] == KVT_SLOT_NONE)
        return false;
    uint32_t i = s->pos[slot];
    uint32_t top = s->free[--s->nfree];
    s->free[i] = top; /* a no-op when @slot was the top */
    s->pos[top] = i;
    s->pos[slot] = KVT_SLOT_NONE;
    return true;
}
