/*
 * kvindex/index_test.c: white-box views of the index for its unit tests
 * (index_test.h). Linked into kvt_kvindex only.
 */
#include "kvindex/index_test.h"

#include "kvindex/index_writer_int.h"

_Static_assert(KVT_IDX_TEST_NIL == KVT_NIL, "index_test.h's NIL is the index's");

void kvt_idx_test_alias(kvt_idx_t *idx, kvt_idx_test_alias_t *alias_p)
{
    alias_p->used = idx->alias_used;
    alias_p->cap = idx->alias_cap;
    alias_p->free = idx->alias_free;
}

size_t kvt_idx_test_alias_bytes(uint32_t n)
{
    return (size_t)n * sizeof(kvt_alias_t);
}

size_t kvt_idx_test_ktab_bytes(kvt_idx_t *idx)
{
    return ktab_bytes(idx->sh.ktab->ngroups);
}

size_t kvt_idx_test_dir_min_bytes(void)
{
    return dir_bytes(DIR_MIN);
}

void kvt_idx_test_dirs(kvt_idx_t *idx, kvt_idx_test_dirs_t *dirs_p)
{
    dirs_p->nodes = idx->sh.nodes->n;
    dirs_p->sets = idx->sh.sets->n;
    dirs_p->nss = idx->sh.nss->n;
}

uint32_t kvt_idx_test_node_slab_chunks(void)
{
    return NODE_SLAB_CHUNKS;
}

void kvt_idx_test_set_budget(kvt_idx_t *idx, uint64_t budget_bytes)
{
    idx->cfg.budget_bytes = budget_bytes;
}

uint64_t kvt_idx_test_limbo_bytes(kvt_idx_t *idx)
{
    return idx->sh.ebr.limbo_bytes;
}
