/* Shared by the event decoders' fuzz targets: what a decoded event may carry. */
#ifndef KVT_FUZZ_EVENT_CHECK_H
#define KVT_FUZZ_EVENT_CHECK_H

#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kvindex/event.h"
#include "tests/fuzz/fuzz_check.h"

/*
 * Aborts unless @e's fields fit its type: BlockStored has hashes (unless it is
 * skipped), the others only theirs; a bad event carries nothing; a skipped one
 * says why, and only one skipped for its medium has tier 0 and the medium's name.
 */
static inline void fuzz_check_event_type(const kvt_event_t *e)
{
    bool only_hashes = e->ntokens == 0 && !e->has_parent && e->block_size == 0 &&
                       e->lora_name == NULL && e->cache_salt == NULL && e->extra_seeds == NULL;
    CHECK(e->skip <= KVT_EV_SKIP_REMOTE && e->group_kind <= KVT_EV_GROUP_OTHER && e->group >= -1);
    CHECK((e->skip == KVT_EV_SKIP_MEDIUM || e->type == KVT_EV_BAD) == (e->tier == 0));
    CHECK((e->skip == KVT_EV_SKIP_MEDIUM) == (e->medium != NULL));
    CHECK(e->medium == NULL || (e->medium_len >= 1 && e->medium_len <= KVT_EV_MEDIUM_NAME_MAX));
    CHECK(e->type == KVT_EV_BAD || !e->may_remove);
    CHECK((e->cache_salt == NULL) == (e->cache_salt_len == 0));
    CHECK(e->cache_salt == NULL || strlen(e->cache_salt) == e->cache_salt_len);
    switch (e->type) {
    case KVT_EV_STORED: CHECK(e->nhashes >= 1 || e->skip != KVT_EV_SKIP_NONE); break;
    case KVT_EV_REMOVED: CHECK(only_hashes && e->group_kind == KVT_EV_GROUP_ANY); break;
    case KVT_EV_CLEARED:
        CHECK(e->nhashes == 0 && only_hashes && e->tier == KVT_TIER_GPU && e->group == -1 &&
              e->skip == KVT_EV_SKIP_NONE);
        break;
    case KVT_EV_BAD:
        CHECK(e->nhashes == 0 && only_hashes && e->skip == KVT_EV_SKIP_NONE && e->group == -1 &&
              e->group_kind == KVT_EV_GROUP_ANY);
        break;
    default: CHECK(!"unknown event type in a batch");
    }
}

/* Whether @p[0..n) lies inside the malloc'd block @arena. */
static inline bool fuzz_inside(const void *arena, const void *p, size_t n)
{
    const char *lo = arena, *hi = lo + malloc_usable_size((void *)(uintptr_t)arena);
    return (const char *)p >= lo && n <= (size_t)(hi - (const char *)p);
}

/* Aborts unless @e's medium name, cache salt and extra seeds lie inside @arena, aligned. */
static inline void fuzz_check_event_arena(const void *arena, const kvt_event_t *e)
{
    if (e->medium != NULL)
        CHECK(fuzz_inside(arena, e->medium, e->medium_len));
    if (e->cache_salt != NULL)
        CHECK(fuzz_inside(arena, e->cache_salt, e->cache_salt_len + 1));
    if (e->extra_seeds != NULL)
        CHECK(fuzz_inside(arena, e->extra_seeds, e->nhashes * 8u) &&
              (uintptr_t)e->extra_seeds % 8 == 0);
}

#endif
