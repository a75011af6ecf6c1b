/*
 * tiers/tiers_test.h: the tiers' modules as the unit tests and benchmarks see
 * them (the allocator, the arena, the disk I/O, the metadata, the admission
 * filter, the tier's block table), so that nothing outside tiers/ includes a *_int.h.
 */
#ifndef KVT_TIERS_TEST_H
#define KVT_TIERS_TEST_H

#include "tiers/admit_int.h"
#include "tiers/arena_int.h"
#include "tiers/disk_int.h"
#include "tiers/meta_int.h"
#include "tiers/slots_int.h"
#include "tiers/store_int.h"

#endif
