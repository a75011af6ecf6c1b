/*
 * kvindex/event_form.c: the neutral event form's helpers that every decoder
 * shares (kvindex/event.h): the medium and group-kind names engines use, and
 * freeing a batch.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kvindex/event.h"

void kvt_evbatch_cleanup(kvt_evbatch_t *b)
{
    if (b == NULL)
        return;
    free(b->arena);
    memset(b, 0, sizeof(*b));
}

unsigned kvt_ev_medium_tier(const char *name, size_t len)
{
    static const struct {
        const char *name;
        unsigned tier;
    } mediums[] = {
        {"GPU", KVT_TIER_GPU},       {"CPU", KVT_TIER_CPU},   {"CPU_PINNED", KVT_TIER_CPU},
        {"DISK", KVT_TIER_DISK},     {"NVME", KVT_TIER_DISK}, {"STORAGE", KVT_TIER_DISK},
        {"EXTERNAL", KVT_TIER_DISK},
    };
    for (size_t i = 0; i < sizeof(mediums) / sizeof(mediums[0]); i++)
        if (strlen(mediums[i].name) == len && strncasecmp(name, mediums[i].name, len) == 0)
            return mediums[i].tier;
    return 0;
}

uint32_t kvt_ev_medium_name_len(const char *name, size_t len)
{
    if (len <= KVT_EV_MEDIUM_NAME_MAX)
        return (uint32_t)len;
    uint32_t n = KVT_EV_MEDIUM_NAME_MAX;
    /* name[n] continues a character (10xxxxxx): back to where it starts, at most 3 bytes */
    for (int k = 0; k < 3 && ((unsigned char)name[n] & 0xc0u) == 0x80u; k++)
        n--;
    return n;
}

uint8_t kvt_ev_group_kind(const char *name, size_t len)
{
    static const struct {
        const char *name;
        uint8_t kind;
    } kinds[] = {
        {"full_attention", KVT_EV_GROUP_FULL},
        {"mla_attention", KVT_EV_GROUP_FULL},
        {"sink_full_attention", KVT_EV_GROUP_FULL},
        {"sliding_window", KVT_EV_GROUP_OTHER},
        {"sliding_window_mla", KVT_EV_GROUP_OTHER},
        {"chunked_local_attention", KVT_EV_GROUP_OTHER},
        {"mamba", KVT_EV_GROUP_OTHER},
    };
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (strlen(kinds[i].name) == len && strncasecmp(name, kinds[i].name, len) == 0)
            return kinds[i].kind;
    return KVT_EV_GROUP_ANY;
}

_Static_assert(sizeof(kvt_ev_counters_t) == 11 * sizeof(uint64_t),
               "kvt_ev_counters_add() adds uint64_t fields: keep kvt_ev_counters_t all of them");

void kvt_ev_counters_add(kvt_ev_counters_t *a, const kvt_ev_counters_t *b)
{
    /* every field is a uint64_t counter */
    uint64_t *d = (uint64_t *)(void *)a;
    const uint64_t *v = (const uint64_t *)(const void *)b;
    for (size_t i = 0; i < sizeof(*a) / sizeof(uint64_t); i++)
        d[i] += v[i];
}
