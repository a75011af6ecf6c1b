/*
 * Unit tests of kvindex/index: dropping namespaces (ids, slot reuse, salts,
 * what goes, stale ids), namespace and pod idle times, removals that report
 * what left, and the reference model's counterparts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/naive_index.h"
#include "kvindex/index.h"

typedef struct fx {
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
} fx_t;

static int setup(void **state)
{
    static fx_t f;
    memset(&f, 0, sizeof(f));
    assert_int_equal(kvt_idx_create(NULL, &f.idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(f.idx, &f.r), KVT_OK);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    kvt_idx_reader_destroy(f->r);
    kvt_idx_destroy(f->idx);
    return 0;
}

static uint32_t ns_of(fx_t *f, const char *model, const char *lora)
{
    uint32_t ns;
    assert_int_equal(kvt_idx_ns_get(f->idx, model, lora, 16, &ns), KVT_OK);
    return ns;
}

static uint32_t pod_of(fx_t *f, const char *name)
{
    uint32_t p;
    assert_int_equal(kvt_idx_pod_get(f->idx, name, 0, &p), KVT_OK);
    return p;
}

/* Blocks @p holds of chain @keys[0..n) in @ns (0 when @p is not in the answer). */
static uint32_t matched(fx_t *f, uint32_t ns, const uint64_t *keys, size_t n, uint32_t p)
{
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(f->r, ns, keys, n, NULL, 0, &res, &nres), KVT_OK);
    for (size_t i = 0; i < nres; i++)
        if (res[i].pod == p)
            return res[i].matched;
    return 0;
}

static size_t nresults(fx_t *f, uint32_t ns, const uint64_t *keys, size_t n)
{
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(f->r, ns, keys, n, NULL, 0, &res, &nres), KVT_OK);
    return nres;
}

static const uint64_t K[6] = {101, 102, 103, 104, 105, 106};

#define SLOT(id) ((id)&0xffffu)

/* Ids are slot numbers until a slot is reused; then a new generation; free slots are skipped. */
static void test_ns_ids_and_slots(void **state)
{
    fx_t *f = *state;
    uint32_t a = ns_of(f, "a", NULL), b = ns_of(f, "b", NULL), c = ns_of(f, "c", "lora");
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    assert_int_equal(c, 2);
    /* the very first namespace's keys are the sequence keys themselves */
    assert_int_equal(kvt_idx_salted_key(f->idx, a, 12345), 12345);
    assert_true(kvt_idx_salted_key(f->idx, b, 12345) != 12345);

    uint64_t blocks = 99;
    assert_int_equal(kvt_idx_ns_drop(f->idx, b, &blocks), KVT_OK);
    assert_int_equal(blocks, 0);
    assert_int_equal(kvt_idx_ns_drop(f->idx, b, NULL), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_idx_ns_count(f->idx), 3); /* slot 1 is free, slot 2 is not */
    assert_int_equal(kvt_idx_ns_id(f->idx, 0), a);
    assert_int_equal(kvt_idx_ns_id(f->idx, 1), KVT_IDX_NS_NONE);
    assert_int_equal(kvt_idx_ns_id(f->idx, 2), c);
    assert_int_equal(kvt_idx_ns_id(f->idx, 3), KVT_IDX_NS_NONE);
    assert_null(kvt_idx_ns_name(f->idx, b, NULL));
    assert_int_equal(kvt_idx_ns_block_size(f->idx, b), 0);
    assert_int_equal(kvt_idx_salted_key(f->idx, b, 7), 7);
    uint32_t again;
    assert_int_equal(kvt_idx_ns_get(f->idx, "b", NULL, 0, &again), KVT_ERR_NOT_FOUND);
    kvt_idx_stats_t st;
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.namespaces, 2);

    /* the lowest free slot is reused under a new id */
    uint32_t d = ns_of(f, "d", NULL);
    assert_int_equal(SLOT(d), 1);
    assert_true(d != b);
    assert_int_equal(kvt_idx_ns_id(f->idx, 1), d);
    const char *lora = "x";
    assert_string_equal(kvt_idx_ns_name(f->idx, d, &lora), "d");
    assert_string_equal(lora, "");
    /* "b" again: a new slot, a new id */
    uint32_t b2 = ns_of(f, "b", NULL);
    assert_int_equal(b2, 3);

    /* slot 0 reused: not salt 0 any more, and not the old id */
    assert_int_equal(kvt_idx_ns_drop(f->idx, a, NULL), KVT_OK);
    uint32_t a2 = ns_of(f, "a", NULL);
    assert_int_equal(SLOT(a2), 0);
    assert_true(a2 != a && a2 != d);
    assert_true(kvt_idx_salted_key(f->idx, a2, 12345) != 12345);

    /* iterating slots: every live namespace once, free slots skipped */
    int seen = 0;
    for (uint32_t s = 0; s < kvt_idx_ns_count(f->idx); s++) {
        uint32_t id = kvt_idx_ns_id(f->idx, s);
        if (id == KVT_IDX_NS_NONE)
            continue;
        assert_int_equal(SLOT(id), s);
        assert_non_null(kvt_idx_ns_name(f->idx, id, NULL));
        seen++;
    }
    assert_int_equal(seen, 4);
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.namespaces, 4);

    /* dropping the trailing slots shrinks the slot count */
    assert_int_equal(kvt_idx_ns_drop(f->idx, b2, NULL), KVT_OK);
    assert_int_equal(kvt_idx_ns_drop(f->idx, c, NULL), KVT_OK);
    assert_int_equal(kvt_idx_ns_count(f->idx), 2);
}

/* Bad ids: every call refuses or answers "nothing", and nothing changes. */
static void test_ns_stale_id_errors(void **state)
{
    fx_t *f = *state;
    uint32_t a = ns_of(f, "a", NULL), b = ns_of(f, "b", NULL);
    uint32_t p = pod_of(f, "p");
    assert_int_equal(kvt_idx_store(f->idx, b, p, KVT_TIER_GPU, NULL, K, NULL, 3), KVT_OK);
    assert_int_equal(kvt_idx_ns_drop(f->idx, b, NULL), KVT_OK);
    uint32_t bad[] = {b, KVT_IDX_NS_NONE, 7, (5u << 16) | SLOT(a), 0xffff};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint32_t id = bad[i];
        uint64_t key;
        assert_int_equal(kvt_idx_ns_drop(f->idx, id, NULL), KVT_ERR_NOT_FOUND);
        assert_int_equal(kvt_idx_store(f->idx, id, p, KVT_TIER_GPU, NULL, K, NULL, 3),
                         KVT_ERR_INVAL);
        assert_int_equal(kvt_idx_speculate(f->idx, id, p, K, 3, 10), KVT_ERR_INVAL);
        assert_int_equal(kvt_idx_pod_key(f->idx, p, id, K[0], &key), KVT_ERR_INVAL);
        assert_null(kvt_idx_ns_name(f->idx, id, NULL));
        assert_int_equal(kvt_idx_ns_blocks(f->idx, id), 0);
        assert_int_equal(kvt_idx_ns_last_use(f->idx, id), 0);
        assert_int_equal(kvt_idx_ns_block_size(f->idx, id), 0);
        assert_int_equal(nresults(f, id, K, 3), 0);
    }
    kvt_idx_stats_t st;
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(kvt_idx_pod_entries(f->idx, p), 0);
    assert_int_equal(st.namespaces, 1);
}

/*
 * Dropping a namespace removes every trace of it from every pod (entries,
 * holder sets, aliases, speculative marks, engine hashes) and leaves the
 * other namespaces, holding the very same sequence keys, untouched.
 */
static void test_ns_drop_removes_only_its_blocks(void **state)
{
    fx_t *f = *state;
    uint32_t a = ns_of(f, "m", NULL), b = ns_of(f, "m", "lora");
    uint32_t p1 = pod_of(f, "p1"), p2 = pod_of(f, "p2"), p3 = pod_of(f, "p3");
    const uint64_t ea[6] = {11, 12, 13, 14, 15, 16}, eb[6] = {21, 22, 23, 24, 25, 26};
    const uint64_t ea2[3] = {31, 32, 33}; /* a second hash of a's blocks on p1: aliases */
    kvt_idx_advance(f->idx, 10);
    /* both namespaces: the same keys on the same pods, under other engine hashes */
    for (int i = 0; i < 2; i++) {
        uint32_t ns = i ? b : a;
        const uint64_t *eh = i ? eb : ea;
        assert_int_equal(kvt_idx_store(f->idx, ns, p1, KVT_TIER_GPU, NULL, K, eh, 6), KVT_OK);
        assert_int_equal(kvt_idx_store(f->idx, ns, p2, KVT_TIER_CPU, NULL, K, eh, 4), KVT_OK);
        assert_int_equal(kvt_idx_speculate(f->idx, ns, p3, K, 5, 1000), KVT_OK);
    }
    assert_int_equal(kvt_idx_store(f->idx, a, p1, KVT_TIER_DISK, NULL, K, ea2, 3), KVT_OK);
    kvt_idx_stats_t st;
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.entries, 2 * (6 + 4 + 5));
    assert_int_equal(st.speculative, 10);
    assert_int_equal(kvt_idx_ns_blocks(f->idx, a), 6);
    assert_int_equal(kvt_idx_ns_blocks(f->idx, b), 6);
    uint32_t mb1 = matched(f, b, K, 6, p1), mb2 = matched(f, b, K, 6, p2),
             mb3 = matched(f, b, K, 6, p3);
    assert_int_equal(mb1, 6);
    assert_int_equal(mb2, 4);
    assert_int_equal(mb3, 5);

    uint64_t blocks = 0;
    assert_int_equal(kvt_idx_ns_drop(f->idx, a, &blocks), KVT_OK);
    assert_int_equal(blocks, 6);
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.entries, 6 + 4 + 5);
    assert_int_equal(st.blocks, 6);
    assert_int_equal(st.speculative, 5);
    assert_int_equal(st.tier_entries[0], 6);
    assert_int_equal(st.tier_entries[1], 4);
    assert_int_equal(st.tier_entries[2], 0); /* a's DISK aliases went */
    assert_int_equal(kvt_idx_pod_entries(f->idx, p1), 6);
    assert_int_equal(kvt_idx_pod_entries(f->idx, p2), 4);
    assert_int_equal(kvt_idx_pod_entries(f->idx, p3), 5);
    assert_int_equal(nresults(f, a, K, 6), 0);
    assert_int_equal(matched(f, b, K, 6, p1), mb1);
    assert_int_equal(matched(f, b, K, 6, p2), mb2);
    assert_int_equal(matched(f, b, K, 6, p3), mb3);
    /* the pods forgot a's engine hashes, and know b's */
    size_t unres = 0;
    uint64_t key;
    assert_int_equal(kvt_idx_store_by_ehash(f->idx, p1, KVT_TIER_CPU, ea, 6, &unres), KVT_OK);
    assert_int_equal(unres, 6);
    assert_int_equal(kvt_idx_store_by_ehash(f->idx, p1, KVT_TIER_CPU, ea2, 3, &unres), KVT_OK);
    assert_int_equal(unres, 3);
    assert_int_equal(kvt_idx_pod_key(f->idx, p1, b, eb[2], &key), KVT_OK);
    assert_int_equal(key, K[2]);
    /* speculative marks of a do not come back when the clock passes their expiry */
    kvt_idx_advance(f->idx, 5000);
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.speculative, 0);
    assert_int_equal(st.entries, 6 + 4);
    /* b can be dropped too, and a re-created empty */
    assert_int_equal(kvt_idx_ns_drop(f->idx, b, &blocks), KVT_OK);
    assert_int_equal(blocks, 6);
    uint32_t a2 = ns_of(f, "m", NULL);
    assert_int_equal(nresults(f, a2, K, 6), 0);
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.blocks, 0);
}

/*
 * A router's query with the id of a dropped namespace, whose slot another
 * model now uses with the same sequence keys, finds nothing; the new id finds
 * the new model's blocks.
 */
static void test_stale_id_never_sees_the_new_namespace(void **state)
{
    fx_t *f = *state;
    uint32_t a = ns_of(f, "model-a", NULL);
    uint32_t pa = pod_of(f, "pa"), pc = pod_of(f, "pc");
    assert_int_equal(kvt_idx_store(f->idx, a, pa, KVT_TIER_GPU, NULL, K, NULL, 6), KVT_OK);
    assert_int_equal(matched(f, a, K, 6, pa), 6);
    assert_int_equal(kvt_idx_ns_drop(f->idx, a, NULL), KVT_OK);
    uint32_t c = ns_of(f, "model-c", NULL);
    assert_int_equal(SLOT(c), SLOT(a));
    assert_int_equal(kvt_idx_store(f->idx, c, pc, KVT_TIER_GPU, NULL, K, NULL, 6), KVT_OK);
    assert_int_equal(nresults(f, a, K, 6), 0);
    assert_int_equal(matched(f, c, K, 6, pc), 6);
    assert_int_equal(matched(f, c, K, 6, pa), 0);
    /* the same name again: a new id again; the older ids stay dead */
    assert_int_equal(kvt_idx_ns_drop(f->idx, c, NULL), KVT_OK);
    uint32_t a2 = ns_of(f, "model-a", NULL);
    assert_true(a2 != a && a2 != c);
    assert_int_equal(kvt_idx_store(f->idx, a2, pa, KVT_TIER_GPU, NULL, K, NULL, 6), KVT_OK);
    assert_int_equal(nresults(f, a, K, 6), 0);
    assert_int_equal(nresults(f, c, K, 6), 0);
    assert_int_equal(matched(f, a2, K, 6, pa), 6);
}

/* Last use of a namespace and last write of a pod follow the index clock. */
static void test_idle_times(void **state)
{
    fx_t *f = *state;
    kvt_idx_advance(f->idx, 5);
    uint32_t ns = ns_of(f, "m", NULL), other = ns_of(f, "o", NULL);
    uint32_t p = pod_of(f, "p"), q = pod_of(f, "q");
    assert_int_equal(kvt_idx_ns_last_use(f->idx, ns), 5);
    assert_int_equal(kvt_idx_pod_last_write(f->idx, p), 5);
    const uint64_t eh[3] = {7, 8, 9};
    kvt_idx_advance(f->idx, 10);
    assert_int_equal(kvt_idx_store(f->idx, ns, p, KVT_TIER_GPU, NULL, K, eh, 3), KVT_OK);
    assert_int_equal(kvt_idx_ns_blocks(f->idx, ns), 3);
    assert_int_equal(kvt_idx_ns_last_use(f->idx, ns), 10);
    assert_int_equal(kvt_idx_pod_last_write(f->idx, p), 10);
    assert_int_equal(kvt_idx_ns_last_use(f->idx, other), 5);
    assert_int_equal(kvt_idx_pod_last_write(f->idx, q), 5);
    /* queries are not writes */
    kvt_idx_advance(f->idx, 15);
    assert_int_equal(matched(f, ns, K, 3, p), 3);
    assert_int_equal(kvt_idx_ns_last_use(f->idx, ns), 10);
    assert_int_equal(kvt_idx_pod_last_write(f->idx, p), 10);
    kvt_idx_advance(f->idx, 20);
    assert_int_equal(kvt_idx_store_by_ehash(f->idx, p, KVT_TIER_CPU, eh, 1, NULL), KVT_OK);
    assert_int_equal(kvt_idx_pod_last_write(f->idx, p), 20);
    kvt_idx_advance(f->idx, 30);
    assert_int_equal(kvt_idx_remove(f->idx, p, KVT_TIER_GPU, &eh[2], 1, NULL), KVT_OK);
    assert_int_equal(kvt_idx_pod_last_write(f->idx, p), 30);
    kvt_idx_advance(f->idx, 40);
    assert_int_equal(kvt_idx_pod_clear(f->idx, q, KVT_TIER_GPU), KVT_OK); /* even with nothing */
    assert_int_equal(kvt_idx_pod_last_write(f->idx, q), 40);
    kvt_idx_advance(f->idx, 50);
    assert_int_equal(kvt_idx_speculate(f->idx, other, q, K, 2, 5), KVT_OK);
    assert_int_equal(kvt_idx_pod_last_write(f->idx, q), 50);
    assert_int_equal(kvt_idx_ns_last_use(f->idx, other), 50);
    kvt_idx_advance(f->idx, 60);
    uint32_t again;
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", NULL, 0, &again), KVT_OK);
    assert_int_equal(kvt_idx_ns_last_use(f->idx, ns), 60);
    /* blocks of a namespace: block nodes, chain links included (block 2 went at 30) */
    assert_int_equal(kvt_idx_ns_blocks(f->idx, ns), 2);
    assert_int_equal(kvt_idx_remove(f->idx, p, KVT_TIER_ALL, eh, 1, NULL), KVT_OK);
    assert_int_equal(kvt_idx_ns_blocks(f->idx, ns), 2); /* block 1 still extends block 0 */
    assert_int_equal(kvt_idx_pod_entries(f->idx, p), 1);
    assert_int_equal(kvt_idx_remove(f->idx, p, KVT_TIER_ALL, &eh[1], 1, NULL), KVT_OK);
    assert_int_equal(kvt_idx_ns_blocks(f->idx, ns), 0);
    /* unknown ids */
    assert_int_equal(kvt_idx_pod_last_write(f->idx, 999), 0);
    assert_int_equal(kvt_idx_pod_drop(f->idx, q), KVT_OK);
    assert_int_equal(kvt_idx_pod_last_write(f->idx, q), 0);
}

/* What kvt_idx_remove_report() reports, and what it does not. */
static void test_remove_report(void **state)
{
    fx_t *f = *state;
    uint32_t first = ns_of(f, "first", NULL);
    uint32_t ns = ns_of(f, "m", "lora"); /* a salted namespace: keys come back unsalted */
    uint32_t p = pod_of(f, "p"), other = pod_of(f, "other");
    const uint64_t eh[4] = {51, 52, 53, 54}, alt = 99;
    assert_int_equal(kvt_idx_store(f->idx, ns, p, KVT_TIER_GPU, NULL, K, eh, 4), KVT_OK);
    assert_int_equal(kvt_idx_store(f->idx, ns, p, KVT_TIER_CPU, NULL, K, eh, 2), KVT_OK);
    assert_int_equal(kvt_idx_store(f->idx, ns, other, KVT_TIER_GPU, NULL, K, NULL, 4), KVT_OK);
    /* block 3 under a second engine hash too: an alias of the same entry */
    assert_int_equal(kvt_idx_store(f->idx, ns, p, KVT_TIER_DISK, &K[2], &K[3], &alt, 1), KVT_OK);

    kvt_idx_gone_t gone[8];
    size_t ngone = 99, unres = 99;
    /* GPU off blocks 0-1 (CPU stays): nothing left the pod */
    assert_int_equal(kvt_idx_remove_report(f->idx, p, KVT_TIER_GPU, eh, 2, &unres, gone, &ngone),
                     KVT_OK);
    assert_int_equal(ngone, 0);
    assert_int_equal(unres, 0);
    /* block 1's last tier, block 2, an unknown hash, block 1 again (unknown now) */
    const uint64_t batch[4] = {eh[1], eh[2], 12345, eh[1]};
    assert_int_equal(kvt_idx_remove_report(f->idx, p, KVT_TIER_ALL, batch, 4, &unres, gone, &ngone),
                     KVT_OK);
    assert_int_equal(unres, 2);
    assert_int_equal(ngone, 2);
    assert_int_equal(gone[0].ehash, eh[1]);
    assert_int_equal(gone[0].key, K[1]);
    assert_int_equal(gone[0].ns, ns);
    assert_int_equal(gone[0].has_parent, 1);
    assert_int_equal(gone[0].parent_key, K[0]);
    assert_int_equal(gone[1].ehash, eh[2]);
    assert_int_equal(gone[1].key, K[2]);
    assert_int_equal(gone[1].parent_key, K[1]);
    /* the other pod still holds them: only p's entries went */
    assert_int_equal(matched(f, ns, K, 4, other), 4);
    /* block 0: no parent */
    assert_int_equal(kvt_idx_remove_report(f->idx, p, KVT_TIER_CPU, eh, 1, &unres, gone, &ngone),
                     KVT_OK);
    assert_int_equal(ngone, 1);
    assert_int_equal(gone[0].key, K[0]);
    assert_int_equal(gone[0].has_parent, 0);
    assert_int_equal(gone[0].parent_key, 0);
    /* the GPU hash of block 3 goes; the entry stays through the alias, the hash is reported */
    uint64_t before = kvt_idx_pod_entries(f->idx, p);
    assert_int_equal(
        kvt_idx_remove_report(f->idx, p, KVT_TIER_GPU, &eh[3], 1, &unres, gone, &ngone), KVT_OK);
    assert_int_equal(ngone, 1);
    assert_int_equal(gone[0].ehash, eh[3]);
    assert_int_equal(gone[0].key, K[3]);
    assert_int_equal(kvt_idx_pod_entries(f->idx, p), before);
    /* no report wanted: the same as kvt_idx_remove */
    assert_int_equal(kvt_idx_remove_report(f->idx, p, KVT_TIER_DISK, &alt, 1, &unres, NULL, NULL),
                     KVT_OK);
    assert_int_equal(unres, 0);
    assert_int_equal(kvt_idx_pod_entries(f->idx, p), 0);
    /* the first namespace (salt 0) and a reused slot report their ids */
    assert_int_equal(kvt_idx_store(f->idx, first, p, KVT_TIER_GPU, NULL, K, eh, 2), KVT_OK);
    assert_int_equal(
        kvt_idx_remove_report(f->idx, p, KVT_TIER_GPU, &eh[1], 1, &unres, gone, &ngone), KVT_OK);
    assert_int_equal(ngone, 1);
    assert_int_equal(gone[0].ns, first);
    assert_int_equal(gone[0].key, K[1]);
    assert_int_equal(kvt_idx_ns_drop(f->idx, first, NULL), KVT_OK);
    uint32_t reused = ns_of(f, "reused", NULL);
    assert_int_equal(SLOT(reused), SLOT(first));
    assert_int_equal(kvt_idx_store(f->idx, reused, p, KVT_TIER_GPU, NULL, K, eh, 2), KVT_OK);
    assert_int_equal(
        kvt_idx_remove_report(f->idx, p, KVT_TIER_GPU, &eh[1], 1, &unres, gone, &ngone), KVT_OK);
    assert_int_equal(ngone, 1);
    assert_int_equal(gone[0].ns, reused);
    assert_int_equal(gone[0].key, K[1]);
    assert_int_equal(gone[0].parent_key, K[0]);
    /* bad input changes nothing */
    assert_int_equal(kvt_idx_remove_report(f->idx, p, 0, eh, 1, &unres, gone, &ngone),
                     KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_remove_report(f->idx, p, 16, eh, 1, &unres, gone, &ngone),
                     KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_remove_report(f->idx, 999, KVT_TIER_GPU, eh, 1, &unres, gone, &ngone),
                     KVT_ERR_INVAL);
    assert_int_equal(kvt_idx_remove_report(f->idx, p, KVT_TIER_GPU, NULL, 1, &unres, gone, &ngone),
                     KVT_ERR_INVAL);
    assert_int_equal(matched(f, reused, K, 2, p), 1);
    ngone = 99;
    assert_int_equal(kvt_idx_remove_report(f->idx, p, KVT_TIER_GPU, NULL, 0, NULL, gone, &ngone),
                     KVT_OK);
    assert_int_equal(ngone, 0);
}

/*
 * A namespace stored after another, then dropped: its nodes fill the slab's
 * last 2 MiB slabs, which go back, while the first namespace's stay.
 */
static void test_ns_drop_gives_back_tail_slabs(void **state)
{
    fx_t *f = *state;
    uint32_t a = ns_of(f, "a", NULL), b = ns_of(f, "b", NULL);
    uint32_t p = pod_of(f, "p");
    enum { LEN = 1000, A = 70, B = 150 }; /* chains of LEN blocks: 70 k and 150 k blocks */
    uint64_t *k = malloc(LEN * sizeof(uint64_t));
    for (int c = 0; c < A + B; c++) {
        for (int i = 0; i < LEN; i++)
            k[i] = ((uint64_t)c << 32) | (uint64_t)i;
        assert_int_equal(kvt_idx_store(f->idx, c < A ? a : b, p, KVT_TIER_GPU, NULL, k, NULL, LEN),
                         KVT_OK);
    }
    kvt_idx_stats_t st;
    kvt_idx_stats(f->idx, &st);
    uint64_t full = st.bytes;
    assert_int_equal(st.blocks, (A + B) * LEN);
    assert_int_equal(kvt_idx_ns_drop(f->idx, b, NULL), KVT_OK);
    kvt_idx_advance(f->idx, 1); /* no reader is in a query: retired slabs are freed */
    kvt_idx_stats(f->idx, &st);
    print_message("%d k + %d k blocks: %llu bytes; without the second namespace: %llu\n", A, B,
                  (unsigned long long)full, (unsigned long long)st.bytes);
    assert_int_equal(st.blocks, A * LEN);
    /*
     * Slab 1 (nodes 65536..131071) holds a's last blocks and stays; the
     * slabs above go: 22 node chunks of 4096 (16 + 6 handed out), 2.9 MiB
     * with their side arrays.
     */
    assert_true(full - st.bytes > 2900000);
    for (int i = 0; i < LEN; i++)
        k[i] = ((uint64_t)(A - 1) << 32) | (uint64_t)i;
    assert_int_equal(matched(f, a, k, LEN, p), LEN);
    /* it grows again where it shrank */
    for (int c = 0; c < 80; c++) {
        for (int i = 0; i < LEN; i++)
            k[i] = ((uint64_t)(1000 + c) << 32) | (uint64_t)i;
        assert_int_equal(kvt_idx_store(f->idx, a, p, KVT_TIER_GPU, NULL, k, NULL, LEN), KVT_OK);
    }
    assert_int_equal(matched(f, a, k, LEN, p), LEN);
    kvt_idx_stats(f->idx, &st);
    assert_int_equal(st.blocks, (A + 80) * LEN);
    free(k);
}

/* The reference model's counterparts, on hand-checked cases. */
static void test_naive_drop_and_report(void **state)
{
    (void)state;
    kvt_naive_t *n;
    assert_int_equal(kvt_naive_create(&n), KVT_OK);
    uint64_t empty = kvt_naive_bytes(n);
    const uint64_t eh[3] = {7, 8, 9};
    kvt_naive_store(n, 1, 0, KVT_TIER_GPU | KVT_TIER_CPU, K, eh, 3);
    kvt_naive_store(n, 2, 0, KVT_TIER_GPU, K, NULL, 2);
    kvt_naive_speculate(n, 1, 5, K, 2, 10);
    kvt_idx_gone_t gone[4];
    size_t ngone = 99;
    const uint64_t rm[3] = {7, 8, 1234};
    assert_int_equal(kvt_naive_remove_report(n, 0, KVT_TIER_GPU, rm, 3, gone, &ngone), 1);
    assert_int_equal(ngone, 0); /* CPU stays */
    assert_int_equal(kvt_naive_remove_report(n, 0, KVT_TIER_CPU, rm, 2, gone, &ngone), 0);
    assert_int_equal(ngone, 2);
    assert_int_equal(gone[0].ehash, 7);
    assert_int_equal(gone[0].key, K[0]);
    assert_int_equal(gone[0].ns, 1);
    assert_int_equal(gone[0].has_parent, 0);
    assert_int_equal(gone[1].key, K[1]);
    assert_int_equal(kvt_naive_entries(n), 1 + 2 + 2);
    /* namespace 1: block 2 of pod 0 and two marks of pod 5 */
    assert_int_equal(kvt_naive_ns_drop(n, 1), 3);
    assert_int_equal(kvt_naive_entries(n), 2);
    assert_int_equal(kvt_naive_pod_entries(n, 5), 0);
    assert_int_equal(kvt_naive_ns_drop(n, 1), 0);
    assert_int_equal(kvt_naive_ns_drop(n, 2), 2);
    assert_int_equal(kvt_naive_entries(n), 0);
    assert_int_equal(kvt_naive_bytes(n), empty);
    kvt_naive_destroy(n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ns_ids_and_slots, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ns_stale_id_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ns_drop_removes_only_its_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_id_never_sees_the_new_namespace, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_idle_times, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_report, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ns_drop_gives_back_tail_slabs, setup, teardown),
        cmocka_unit_test(test_naive_drop_and_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
