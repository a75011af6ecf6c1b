/*
 * kvindex/index_test.h: white-box views of the index for its unit tests;
 * not installed, not for the daemon (index_test.c is linked into kvt_kvindex
 * only, never into libkvtier_index).
 *
 * Tests that check how the index uses memory (the alias array, the key
 * table's size, directories given back, memory retired while a reader holds
 * it) read it here rather than through the writer's private headers, so
 * that those headers stay the index's own. Every function is called by the
 * writer thread (the test's main thread), like the index's writer calls.
 */
#ifndef KVT_KVINDEX_INDEX_TEST_H
#define KVT_KVINDEX_INDEX_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "kvindex/index.h"

/* "No record" in kvt_idx_test_alias_t.free (the index's KVT_NIL). */
#define KVT_IDX_TEST_NIL UINT32_MAX

/* The alias array (blocks a pod holds under another engine hash). */
typedef struct kvt_idx_test_alias {
    uint32_t used; /* records handed out so far */
    uint32_t cap;  /* records allocated */
    uint32_t free; /* head of the free list, or KVT_IDX_TEST_NIL */
} kvt_idx_test_alias_t;

void kvt_idx_test_alias(kvt_idx_t *idx, kvt_idx_test_alias_t *alias_p);

/* Bytes of an alias array of @n records (the array's allocation for @n). */
size_t kvt_idx_test_alias_bytes(uint32_t n);

/* Bytes of the key table as it is now (what a rebuild at this size allocates). */
size_t kvt_idx_test_ktab_bytes(kvt_idx_t *idx);

/* Bytes of a published directory of the smallest size (a trim's new directory). */
size_t kvt_idx_test_dir_min_bytes(void);

/* Sizes of the published directories (chunks in use). */
typedef struct kvt_idx_test_dirs {
    uint32_t nodes; /* node chunks */
    uint32_t sets;  /* holder-set chunks */
    uint32_t nss;   /* namespace chunks */
} kvt_idx_test_dirs_t;

void kvt_idx_test_dirs(kvt_idx_t *idx, kvt_idx_test_dirs_t *dirs_p);

/* Node chunks in one node slab (the first slab holds this many). */
uint32_t kvt_idx_test_node_slab_chunks(void);

/* Sets the memory budget of a created index (bytes; 0: none); the next write holds it. */
void kvt_idx_test_set_budget(kvt_idx_t *idx, uint64_t budget_bytes);

/* Bytes retired but not freed yet (readers may still hold them). */
uint64_t kvt_idx_test_limbo_bytes(kvt_idx_t *idx);

#endif
