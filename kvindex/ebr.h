/*
 * kvindex/ebr: epoch-based reclamation for one writer and many readers.
 *
 * Readers bracket every access to shared structures with kvt_ebr_enter() /
 * kvt_ebr_exit() on their own slot. The writer unpublishes an object, then
 * retires it; the object is freed once every reader that could have seen it
 * has left its critical section (two epoch advances later). Readers never
 * block the writer and take no lock; the writer never waits for readers.
 */
#ifndef KVT_KVINDEX_EBR_H
#define KVT_KVINDEX_EBR_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kvt_ebr_slot {
    uint64_t epoch; /* 0: not in a critical section; else the epoch entered */
    uint32_t used;  /* 1 while a reader handle owns the slot */
    char pad[64 - sizeof(uint64_t) - sizeof(uint32_t)];
} kvt_ebr_slot_t;

typedef struct kvt_ebr_item {
    void *ptr;
    size_t bytes;
    uint64_t epoch;
} kvt_ebr_item_t;

typedef struct kvt_ebr {
    uint64_t global; /* current epoch, starts at 1 */
    uint32_t nslots;
    kvt_ebr_slot_t *slots;
    /* writer-only limbo list, in retire order */
    kvt_ebr_item_t *limbo;
    size_t nlimbo, caplimbo;
    size_t limbo_bytes; /* bytes retired but not freed yet */
} kvt_ebr_t;

/* Prepares @ebr for @nslots readers. KVT_ERR_NO_MEM on failure. */
kvt_status_t kvt_ebr_init(kvt_ebr_t *ebr, uint32_t nslots);

/* Frees everything still in limbo. No reader may be inside a critical section. */
void kvt_ebr_cleanup(kvt_ebr_t *ebr);

/* Any thread. Claims a free slot; returns its number or -1 when all are taken. */
int kvt_ebr_slot_acquire(kvt_ebr_t *ebr);
void kvt_ebr_slot_release(kvt_ebr_t *ebr, int slot);

/* Reader. Enters a critical section: pointers loaded after this stay valid until exit. */
static inline void kvt_ebr_enter(kvt_ebr_t *ebr, int slot)
{
    kvt_ebr_slot_t *s = &ebr->slots[slot];
    uint64_t e = __atomic_load_n(&ebr->global, __ATOMIC_ACQUIRE);
    for (;;) {
        __atomic_store_n(&s->epoch, e, __ATOMIC_SEQ_CST);
        /* Re-check: if the writer advanced meanwhile, announce the newer epoch. */
        uint64_t again = __atomic_load_n(&ebr->global, __ATOMIC_SEQ_CST);
        if (again == e)
            break;
        e = again;
    }
}

/* Reader. Leaves the critical section. */
static inline void kvt_ebr_exit(kvt_ebr_t *ebr, int slot)
{
    __atomic_store_n(&ebr->slots[slot].epoch, 0, __ATOMIC_RELEASE);
}

/*
 * Writer. @ptr (malloc'd, @bytes long, already unreachable for new readers)
 * is freed with free() once no reader can hold it. If the limbo list cannot
 * grow, waits for readers to drain instead of failing (never loses memory).
 */
void kvt_ebr_retire(kvt_ebr_t *ebr, void *ptr, size_t bytes);

/* Writer. Advances the epoch when every active reader has seen it, and frees what is safe. */
void kvt_ebr_reclaim(kvt_ebr_t *ebr);

#endif
