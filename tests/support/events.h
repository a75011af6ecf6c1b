/*
 * tests/support/events.h: neutral events (kvindex/event.h) built by hand, for
 * the tests that apply or publish them without a decoder.
 */
#ifndef KVT_TESTS_EVENTS_H
#define KVT_TESTS_EVENTS_H

#include "kvindex/event.h"

/*
 * A GPU BlockStored of hashes @h[0..n) (borrowed) with @tok's first @n * @bs
 * tokens (NULL: a placeholder without tokens), no group.
 */
static inline kvt_event_t test_stored(const uint64_t *h, uint32_t n, const uint32_t *tok,
                                      uint32_t bs)
{
    return (kvt_event_t){.type = KVT_EV_STORED,
                         .tier = KVT_TIER_GPU,
                         .nhashes = n,
                         .hashes = h,
                         .ntokens = tok ? n * bs : 0,
                         .tokens = tok,
                         .block_size = bs,
                         .group = -1};
}

#endif
