#include "kvindex/ebr.h"

#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

kvt_status_t kvt_ebr_init(kvt_ebr_t *ebr, uint32_t nslots)
{
    memset(ebr, 0, sizeof(*ebr));
    ebr->slots = aligned_alloc(64, sizeof(kvt_ebr_slot_t) * nslots);
    if (ebr->slots == NULL)
        return KVT_ERR_NO_MEM;
    memset(ebr->slots, 0, sizeof(kvt_ebr_slot_t) * nslots);
    ebr->nslots = nslots;
    ebr->global = 1;
    return KVT_OK;
}

void kvt_ebr_cleanup(kvt_ebr_t *ebr)
{
    for (size_t i = 0; i < ebr->nlimbo; i++)
        free(ebr->limbo[i].ptr);
    free(ebr->limbo);
    free(ebr->slots);
    memset(ebr, 0, sizeof(*ebr));
}

int kvt_ebr_slot_acquire(kvt_ebr_t *ebr)
{
    for (uint32_t i = 0; i < ebr->nslots; i++) {
        uint32_t expect = 0;
        if (__atomic_compare_exchange_n(&ebr->slots[i].used, &expect, 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return (int)i;
    }
    return -1;
}

void kvt_ebr_slot_release(kvt_ebr_t *ebr, int slot)
{
    __atomic_store_n(&ebr->slots[slot].epoch, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&ebr->slots[slot].used, 0, __ATOMIC_RELEASE);
}

/* True when no reader is inside a critical section of an epoch older than the current one. */
static bool ebr_all_caught_up(kvt_ebr_t *ebr, uint64_t global)
{
    for (uint32_t i = 0; i < ebr->nslots; i++) {
        uint64_t e = __atomic_load_n(&ebr->slots[i].epoch, __ATOMIC_SEQ_CST);
        if (e != 0 && e != global)
            return false;
    }
    return true;
}

static void ebr_free_safe(kvt_ebr_t *ebr)
{
    uint64_t global = ebr->global;
    size_t keep = 0;
    for (size_t i = 0; i < ebr->nlimbo; i++) {
        kvt_ebr_item_t *it = &ebr->limbo[i];
        /* Retired at epoch E: readers of E are gone once the epoch reached E + 2. */
        if (it->epoch + 2 <= global) {
            free(it->ptr);
            ebr->limbo_bytes -= it->bytes;
        } else {
            ebr->limbo[keep++] = *it;
        }
    }
    ebr->nlimbo = keep;
}

void kvt_ebr_reclaim(kvt_ebr_t *ebr)
{
    if (ebr->nlimbo == 0)
        return;
    /* Two advances free everything retired so far when readers are idle. */
    for (int round = 0; round < 2; round++) {
        uint64_t global = ebr->global;
        if (!ebr_all_caught_up(ebr, global))
            break;
        __atomic_store_n(&ebr->global, global + 1, __ATOMIC_SEQ_CST);
    }
    ebr_free_safe(ebr);
}

void kvt_ebr_retire(kvt_ebr_t *ebr, void *ptr, size_t bytes)
{
    if (ptr == NULL)
        return;
    if (ebr->nlimbo == ebr->caplimbo) {
        size_t cap = ebr->caplimbo ? ebr->caplimbo * 2 : 64;
        kvt_ebr_item_t *l = realloc(ebr->limbo, cap * sizeof(*l));
        if (l == NULL) {
            /* No room to defer: wait until readers have moved on, then free now. */
            uint64_t target = ebr->global + 2;
            while (ebr->global < target) {
                if (ebr_all_caught_up(ebr, ebr->global))
                    __atomic_store_n(&ebr->global, ebr->global + 1, __ATOMIC_SEQ_CST);
                else
                    sched_yield();
            }
            ebr_free_safe(ebr);
            free(ptr);
            return;
        }
        ebr->limbo = l;
        ebr->caplimbo = cap;
    }
    ebr->limbo[ebr->nlimbo++] = (kvt_ebr_item_t){ptr, bytes, ebr->global};
    ebr->limbo_bytes += bytes;
    kvt_ebr_reclaim(ebr);
}
