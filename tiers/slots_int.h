/*
 * tiers/slots_int.h: a fixed-count slot allocator, one for the RAM arena and
 * one for the NVMe store. Slots are numbered 0..n-1; alloc and free are O(1)
 * (a stack of free slots plus each slot's place in it), and a chosen slot can
 * be taken out of the free set (the store's restore marks the slots its
 * metadata names). No allocation after init.
 */
#ifndef KVT_TIERS_SLOTS_INT_H
#define KVT_TIERS_SLOTS_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

#define KVT_SLOT_NONE UINT32_MAX

typedef struct kvt_slots {
    uint32_t n;     /* slots in all */
    uint32_t nfree; /* free[0..nfree) are the free slots */
    uint32_t *free; /* stack of free slots; the top is free[nfree - 1] */
    uint32_t *pos;  /* pos[s]: s's index in free[], or KVT_SLOT_NONE when s is used */
} kvt_slots_t;

/* Every slot free; the first allocs return 0, 1, 2, ... KVT_ERR_NO_MEM, or
 * KVT_ERR_RANGE for n == KVT_SLOT_NONE. */
kvt_status_t kvt_slots_init(kvt_slots_t *s, uint32_t n);
void kvt_slots_cleanup(kvt_slots_t *s);

/* A free slot, now used; KVT_SLOT_NONE when none is free. */
uint32_t kvt_slots_alloc(kvt_slots_t *s);

/* Returns used slot @slot to the free set. False (and nothing changes) when
 * @slot is out of range or already free. */
bool kvt_slots_free(kvt_slots_t *s, uint32_t slot);

/* Takes the chosen free slot @slot. False (and nothing changes) when it is
 * out of range or already used. */
bool kvt_slots_take(kvt_slots_t *s, uint32_t slot);

static inline bool kvt_slots_used(const kvt_slots_t *s, uint32_t slot)
{
    return slot < s->n && s->pos[slot] == KVT_SLOT_NONE;
}

#endif
