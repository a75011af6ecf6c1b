/* Shared by the event decoders' fuzz targets: what a decoded event may carry. */
#ifndef KVT_FUZZ_EVENT_CHECK_H
#define KVT_FUZZ_EVENT_CHECK_H

#include "kvindex/event.h"
#include "tests/fuzz/fuzz_check.h"

/* Aborts unless @e's fields fit its type: BlockStored has hashes, the others only theirs. */
static inline void fuzz_check_event_type(const kvt_event_t *e)
{
    switch (e->type) {
    case KVT_EV_STORED: CHECK(e->nhashes >= 1); break;
    case KVT_EV_REMOVED:
        CHECK(e->ntokens == 0 && !e->has_parent && e->block_size == 0 && e->lora_name == NULL);
        break;
    case KVT_EV_CLEARED:
        CHECK(e->nhashes == 0 && e->ntokens == 0 && !e->has_parent && e->block_size == 0 &&
              e->lora_name == NULL && e->tier == KVT_TIER_GPU);
        break;
    default: CHECK(!"unknown event type in a batch");
    }
}

#endif
