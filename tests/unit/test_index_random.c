/*
 * Randomized test: kvindex/index against the naive reference model
 * (bench/naive_index), operation by operation, over >= 1 M mixed operations:
 * store (whole chains and continuations), CPU placeholder stores, removals
 * (some reporting what left, checked against the model and the chains),
 * clears, pod drops (re-registered at once, or forgotten for a while),
 * namespace drops (re-created later under a new id; queries with the old ids
 * must find nothing), speculative marks, clock advances, queries with and
 * without a pod filter, and budget evictions (mirrored into the model through
 * the eviction callback, each checked to be a leaf). Entry counts are
 * compared after every operation.
 *
 * KVT_RANDOM_OPS overrides the number of operations; KVT_TEST_SEED draws
 * other sequences (tests/support/rng.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/naive_index.h"
#include "kvindex/index.h"
#include "tests/support/rng.h"

enum { NS = 2, PODS = 6, KEYS = 1500, MAXCHAIN = 24, STALE = 8 };

#define NONE UINT32_MAX

typedef struct world {
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    kvt_naive_t *ref;
    uint32_t ns[NS];       /* current id, NONE while dropped */
    uint32_t pod[PODS];    /* current id, NONE while forgotten */
    uint32_t stale[STALE]; /* ids of dropped namespaces */
    /* a random trie of keys: parent[i] < i or -1 */
    int parent[KEYS];
    uint64_t key[KEYS];
    int depth[KEYS];
    int *children[KEYS];
    int nchildren[KEYS];
    uint64_t salted[NS][KEYS];
    kvt_rng_t rng;
    uint64_t now;
    uint64_t op; /* the operation running, for messages */
    uint64_t evictions;
    uint64_t eviction_checks;
    uint64_t ns_drops, pod_forgets, gone_checked, stale_queries;
    uint64_t refused; /* pods and namespaces the budget refused (the model never refuses) */
} world_t;

static const char *const ns_lora[NS] = {NULL, "lora"};

static uint64_t rnd(world_t *w)
{
    return kvt_rng_next(&w->rng);
}

static uint32_t below(world_t *w, uint32_t n)
{
    return (uint32_t)kvt_rng_below(&w->rng, n);
}

/* Engine hash of key i on pod p: usually the same on every pod, sometimes pod-specific. */
static uint64_t ehash_of(int i, int p, int variant)
{
    uint64_t base = 0x1000000ull + (uint64_t)i * 7919u;
    if (variant == 1)
        return base ^ ((uint64_t)(p + 1) << 40);
    if (variant == 2)
        return base ^ 0xdead0000000000ull; /* a second hash of the same block */
    return base;
}

/* Chain of trie node i from the root: writes depth[i]+1 indices into out. */
static int chain(world_t *w, int i, int *out)
{
    int d = w->depth[i];
    for (int j = i; j >= 0; j = w->parent[j])
        out[d--] = j;
    return w->depth[i] + 1;
}

/*
 * Called by the index for each evicted block: it must be a leaf; mirror it.
 * Leaf means no pod holds a descendant in the index itself, asked with a
 * query (index.h allows a callback to query; a hit would move a stamp, but a
 * hit already fails the test): the model may differ while the write runs
 * (writes reach the model after the index, so that evictions are mirrored in
 * order).
 */
static void on_evict(void *arg, uint64_t salted)
{
    world_t *w = arg;
    for (int ns = 0; ns < NS; ns++) {
        if (w->ns[ns] == NONE)
            continue;
        for (int i = 0; i < KEYS; i++) {
            if (w->salted[ns][i] != salted)
                continue;
            /* leaf check: no pod may hold any descendant (DFS over the trie) */
            int stack[KEYS], sp = 0;
            for (int c = 0; c < w->nchildren[i]; c++)
                stack[sp++] = w->children[i][c];
            while (sp > 0) {
                int d = stack[--sp];
                const kvt_idx_match_t *res;
                size_t n;
                assert_int_equal(kvt_idx_query(w->r, w->ns[ns], &w->key[d], 1, NULL, 0, &res, &n),
                                 KVT_OK);
                if (n != 0)
                    fail_msg("op %llu: evicted key %d has a held descendant %d",
                             (unsigned long long)w->op, i, d);
                for (int c = 0; c < w->nchildren[d]; c++)
                    stack[sp++] = w->children[d][c];
            }
            w->eviction_checks++;
            kvt_naive_evict(w->ref, w->ns[ns], w->key[i]);
            w->evictions++;
            return;
        }
    }
    fail_msg("op %llu: evicted key %llx is not one of ours", (unsigned long long)w->op,
             (unsigned long long)salted);
}

/*
 * (Re)creates namespace @ns; false when the budget refused it (counted: the
 * model never refuses, so the operation that needed it is skipped).
 */
static bool ns_create(world_t *w, int ns)
{
    uint32_t id;
    kvt_status_t st = kvt_idx_ns_get(w->idx, "model", ns_lora[ns], 16, &id);
    if (st == KVT_ERR_NO_SPACE) {
        w->refused++;
        return false;
    }
    assert_int_equal(st, KVT_OK);
    for (int s = 0; s < STALE; s++)
        if (w->stale[s] == id)
            fail_msg("op %llu: namespace id %u handed out again", (unsigned long long)w->op, id);
    assert_int_equal(kvt_idx_ns_blocks(w->idx, id), 0);
    assert_int_equal(kvt_idx_ns_last_use(w->idx, id), w->now);
    w->ns[ns] = id;
    for (int i = 0; i < KEYS; i++)
        w->salted[ns][i] = kvt_idx_salted_key(w->idx, id, w->key[i]);
    return true;
}

/* Registers pod @p; false when the budget refused it (counted, as ns_create()). */
static bool pod_register(world_t *w, int p)
{
    char name[16];
    snprintf(name, sizeof(name), "pod%d", p);
    uint32_t id;
    kvt_status_t st = kvt_idx_pod_get(w->idx, name, (uint32_t)p % 2, &id);
    if (st == KVT_ERR_NO_SPACE) {
        w->refused++;
        return false;
    }
    assert_int_equal(st, KVT_OK);
    assert_int_equal(kvt_idx_pod_entries(w->idx, id), 0);
    assert_int_equal(kvt_naive_pod_entries(w->ref, id), 0); /* a reused id starts empty */
    assert_int_equal(kvt_idx_pod_last_write(w->idx, id), w->now);
    w->pod[p] = id;
    return true;
}

/* @stream: the world's random stream (tests/support/rng.h). */
static void build_world(world_t *w, uint64_t stream, uint64_t budget)
{
    memset(w, 0, sizeof(*w));
    kvt_rng_init(&w->rng, stream);
    for (int s = 0; s < STALE; s++)
        w->stale[s] = NONE;
    kvt_idx_config_t cfg = {.budget_bytes = budget, .on_evict = on_evict, .on_evict_arg = w};
    assert_int_equal(kvt_idx_create(&cfg, &w->idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(w->idx, &w->r), KVT_OK);
    assert_int_equal(kvt_naive_create(&w->ref), KVT_OK);
    for (int i = 0; i < KEYS; i++) {
        /* shallow fan-out near the root, long chains below, some special keys */
        int par = -1;
        if (i >= 8 && below(w, 10) != 0) {
            par = (int)below(w, (uint32_t)i);
            if (w->depth[par] >= MAXCHAIN - 1)
                par = -1;
        }
        w->parent[i] = par;
        w->depth[i] = par < 0 ? 0 : w->depth[par] + 1;
        w->key[i] = i == 0 ? 0 : i == 1 ? UINT64_MAX : rnd(w);
        if (par >= 0) {
            w->children[par] = realloc(w->children[par], sizeof(int) * (w->nchildren[par] + 1));
            w->children[par][w->nchildren[par]++] = i;
        }
    }
    for (int ns = 0; ns < NS; ns++)
        assert_true(ns_create(w, ns));
    assert_int_equal(w->ns[0], 0); /* the first namespace: id 0, salt 0 */
    assert_int_equal(w->salted[0][5], w->key[5]);
    for (int p = 0; p < PODS; p++)
        assert_true(pod_register(w, p));
}

static void free_world(world_t *w)
{
    for (int i = 0; i < KEYS; i++)
        free(w->children[i]);
    kvt_idx_reader_destroy(w->r);
    kvt_idx_destroy(w->idx);
    kvt_naive_destroy(w->ref);
}

static int cmp_match(const void *a, const void *b)
{
    const kvt_idx_match_t *x = a, *y = b;
    return x->pod < y->pod ? -1 : x->pod > y->pod;
}

static void compare_query(world_t *w, uint32_t ns, const uint64_t *keys, size_t n,
                          const uint32_t *pods, size_t npods)
{
    kvt_idx_match_t want[PODS], got[PODS + 1];
    size_t nw = kvt_naive_query(w->ref, ns, keys, n, pods, npods, want, PODS);
    const kvt_idx_match_t *res;
    size_t ng;
    assert_int_equal(kvt_idx_query(w->r, ns, keys, n, pods, npods, &res, &ng), KVT_OK);
    if (ng != nw)
        fail_msg("op %llu: index answered %zu pods, model %zu", (unsigned long long)w->op, ng, nw);
    memcpy(got, res, ng * sizeof(*got));
    qsort(got, ng, sizeof(*got), cmp_match);
    for (size_t i = 0; i < nw; i++) {
        if (memcmp(&got[i], &want[i], sizeof(want[i])) != 0)
            fail_msg("op %llu pod %u: index m=%u g=%u c=%u d=%u, model pod %u m=%u g=%u c=%u d=%u",
                     (unsigned long long)w->op, got[i].pod, got[i].matched, got[i].gpu, got[i].cpu,
                     got[i].disk, want[i].pod, want[i].matched, want[i].gpu, want[i].cpu,
                     want[i].disk);
    }
}

static unsigned rand_tier(world_t *w)
{
    static const unsigned t[3] = {KVT_TIER_GPU, KVT_TIER_CPU, KVT_TIER_DISK};
    return t[below(w, 3)];
}

/* Trie index of @key in namespace slot @ns, looking in @idxs[0..n) first. */
static int key_index(const world_t *w, uint64_t key, const int *idxs, int n)
{
    for (int j = 0; j < n; j++)
        if (w->key[idxs[j]] == key)
            return idxs[j];
    for (int i = 0; i < KEYS; i++)
        if (w->key[i] == key)
            return i;
    return -1;
}

/*
 * Removal with a report: the index and the model must name the same
 * hashes, blocks and namespaces, in order; the index's parents must be the
 * trie's (every chain here is stored from its root or after its parent).
 */
static void remove_reported(world_t *w, uint32_t pod, unsigned tiers, const uint64_t *ehs, size_t n,
                            const int *idxs, int nidx)
{
    kvt_idx_gone_t got[MAXCHAIN], want[MAXCHAIN];
    size_t unres = 0, ngot = 99, nwant = 99;
    size_t wunres = kvt_naive_remove_report(w->ref, pod, tiers, ehs, n, want, &nwant);
    assert_int_equal(kvt_idx_remove_report(w->idx, pod, tiers, ehs, n, &unres, got, &ngot), KVT_OK);
    assert_int_equal(unres, wunres);
    if (ngot != nwant)
        fail_msg("op %llu: index reports %zu gone, model %zu", (unsigned long long)w->op, ngot,
                 nwant);
    for (size_t i = 0; i < ngot; i++) {
        if (got[i].ehash != want[i].ehash || got[i].key != want[i].key || got[i].ns != want[i].ns)
            fail_msg("op %llu gone %zu: index %llx key %llx ns %u, model %llx key %llx ns %u",
                     (unsigned long long)w->op, i, (unsigned long long)got[i].ehash,
                     (unsigned long long)got[i].key, got[i].ns, (unsigned long long)want[i].ehash,
                     (unsigned long long)want[i].key, want[i].ns);
        int k = key_index(w, got[i].key, idxs, nidx);
        assert_true(k >= 0);
        int par = w->parent[k];
        if (got[i].has_parent != (par >= 0) || (par >= 0 && got[i].parent_key != w->key[par]))
            fail_msg("op %llu: key %d reported with parent %u/%llx, trie parent %d",
                     (unsigned long long)w->op, k, got[i].has_parent,
                     (unsigned long long)got[i].parent_key, par);
        w->gone_checked++;
    }
}

/* Drops namespace @ns in both; its id becomes stale. */
static void ns_drop(world_t *w, int ns)
{
    uint32_t id = w->ns[ns];
    uint64_t blocks = 99, before = kvt_idx_ns_blocks(w->idx, id);
    uint64_t held = kvt_naive_ns_drop(w->ref, id);
    assert_int_equal(kvt_idx_ns_drop(w->idx, id, &blocks), KVT_OK);
    assert_int_equal(blocks, before);
    assert_true(blocks >= held); /* chain links kept for held blocks count too */
    assert_int_equal(kvt_idx_ns_drop(w->idx, id, NULL), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_idx_ns_blocks(w->idx, id), 0);
    assert_null(kvt_idx_ns_name(w->idx, id, NULL));
    w->stale[w->ns_drops % STALE] = id;
    w->ns[ns] = NONE;
    w->ns_drops++;
}

static void run(world_t *w, uint64_t ops, uint64_t budget)
{
    int idxs[MAXCHAIN];
    uint64_t keys[MAXCHAIN + 1], ehs[MAXCHAIN];
    for (uint64_t op = 0; op < ops; op++) {
        w->op = op;
        int ns = (int)below(w, NS);
        int p = (int)below(w, PODS);
        int leaf = (int)below(w, KEYS);
        int n = chain(w, leaf, idxs);
        for (int j = 0; j < n; j++)
            keys[j] = w->key[idxs[j]];
        uint32_t r = below(w, 1000);
        /* a dropped namespace or forgotten pod comes back when an operation needs it */
        if (w->ns[ns] == NONE && !ns_create(w, ns))
            continue;
        if (w->pod[p] == NONE && !pod_register(w, p))
            continue;
        uint32_t nsid = w->ns[ns];
        uint32_t pod = w->pod[p];
        if (r < 380) {
            /* store a whole chain, or the tail of one after its parent */
            unsigned tier = rand_tier(w);
            int variant = below(w, 10) == 0 ? 1 : below(w, 40) == 0 ? 2 : 0;
            int from = (n > 1 && below(w, 3) == 0) ? (int)below(w, (uint32_t)n) : 0;
            if (from > 0) {
                /* continue after a parent only where its block exists, as engines do */
                kvt_idx_match_t tmp[PODS];
                if (kvt_naive_query(w->ref, nsid, &keys[from - 1], 1, NULL, 0, tmp, PODS) == 0)
                    from = 0;
            }
            for (int j = 0; j < n; j++)
                ehs[j] = ehash_of(idxs[j], p, variant) + (uint64_t)ns * 0x100000000ull;
            if (below(w, 200) == 0 && n > 1)
                ehs[n - 1] = ehs[0]; /* the engine reuses a hash for another block */
            const uint64_t *parent = from > 0 ? &keys[from - 1] : NULL;
            assert_int_equal(kvt_idx_store(w->idx, nsid, pod, tier, parent, keys + from, ehs + from,
                                           (size_t)(n - from)),
                             KVT_OK);
            kvt_naive_store(w->ref, nsid, pod, tier, keys + from, ehs + from, (size_t)(n - from));
            assert_int_equal(kvt_idx_pod_last_write(w->idx, pod), w->now);
            assert_int_equal(kvt_idx_ns_last_use(w->idx, nsid), w->now);
        } else if (r < 470) {
            /* CPU placeholder stores: engine hashes only, some unknown */
            for (int j = 0; j < n; j++)
                ehs[j] = below(w, 8) == 0 ? rnd(w)
                                          : ehash_of(idxs[j], p, 0) + (uint64_t)ns * 0x100000000ull;
            unsigned tier = rand_tier(w);
            size_t unres = 0;
            assert_int_equal(kvt_idx_store_by_ehash(w->idx, pod, tier, ehs, (size_t)n, &unres),
                             KVT_OK);
            assert_int_equal(unres, kvt_naive_store_by_ehash(w->ref, pod, tier, ehs, (size_t)n));
        } else if (r < 640) {
            /* removals of a chain's tail, with one or several tiers; half report what left */
            int variant = below(w, 6) == 0 ? 1 : below(w, 20) == 0 ? 2 : 0;
            int from = (int)below(w, (uint32_t)n);
            for (int j = 0; j < n; j++)
                ehs[j] = ehash_of(idxs[j], p, variant) + (uint64_t)ns * 0x100000000ull;
            unsigned tiers = below(w, 4) == 0 ? (1u + below(w, 7)) : rand_tier(w);
            if (below(w, 2) == 0) {
                remove_reported(w, pod, tiers, ehs + from, (size_t)(n - from), idxs, n);
            } else {
                size_t unres = 0;
                assert_int_equal(
                    kvt_idx_remove(w->idx, pod, tiers, ehs + from, (size_t)(n - from), &unres),
                    KVT_OK);
                assert_int_equal(
                    unres, kvt_naive_remove(w->ref, pod, tiers, ehs + from, (size_t)(n - from)));
            }
            assert_int_equal(kvt_idx_pod_last_write(w->idx, pod), w->now);
        } else if (r < 650) {
            unsigned tiers = below(w, 3) == 0 ? KVT_TIER_ALL : KVT_TIER_GPU;
            assert_int_equal(kvt_idx_pod_clear(w->idx, pod, tiers), KVT_OK);
            kvt_naive_pod_clear(w->ref, pod, tiers);
        } else if (r < 652) {
            /*
             * drop and re-register the pod: it comes back empty (under its
             * id, if no other is free), or stays forgotten if the budget
             * refuses it
             */
            bool others_free = false;
            for (int q = 0; q < PODS; q++)
                others_free |= w->pod[q] == NONE;
            assert_int_equal(kvt_idx_pod_drop(w->idx, pod), KVT_OK);
            kvt_naive_pod_clear(w->ref, pod, KVT_TIER_ALL);
            w->pod[p] = NONE;
            if (pod_register(w, p) && !others_free)
                assert_int_equal(w->pod[p], pod);
        } else if (r < 654) {
            /* forget the pod; it comes back (maybe under another id) when next needed */
            assert_int_equal(kvt_idx_pod_drop(w->idx, pod), KVT_OK);
            kvt_naive_pod_clear(w->ref, pod, KVT_TIER_ALL);
            assert_null(kvt_idx_pod_name(w->idx, pod, NULL));
            assert_int_equal(kvt_idx_pod_drop(w->idx, pod), KVT_ERR_NOT_FOUND);
            w->pod[p] = NONE;
            w->pod_forgets++;
            for (int q = 0; q < PODS; q++)
                if (w->pod[q] != NONE)
                    assert_true(w->pod[q] < kvt_idx_pod_limit(w->idx));
        } else if (r < 656) {
            /* drop the namespace; queries with its old id must find nothing from now on */
            ns_drop(w, ns);
            compare_query(w, nsid, keys, (size_t)n, NULL, 0);
        } else if (r < 700) {
            uint32_t ttl = below(w, 50);
            assert_int_equal(kvt_idx_speculate(w->idx, nsid, pod, keys, (size_t)n, ttl), KVT_OK);
            kvt_naive_speculate(w->ref, nsid, pod, keys, (size_t)n, ttl);
        } else if (r < 740) {
            w->now += below(w, 20);
            kvt_idx_advance(w->idx, w->now);
            kvt_naive_advance(w->ref, w->now);
        } else if (r < 750) {
            /* a router still holding a dropped namespace's id */
            uint32_t old = w->stale[below(w, STALE)];
            if (old != NONE) {
                compare_query(w, old, keys, (size_t)n, NULL, 0);
                w->stale_queries++;
            }
        } else {
            /* queries: sometimes with a filter, sometimes past a chain's end */
            size_t qn = (size_t)n;
            if (below(w, 4) == 0)
                keys[qn++] = rnd(w);
            uint32_t filt[4];
            size_t nf = 0;
            if (below(w, 4) == 0) {
                nf = 1 + below(w, 4);
                for (size_t j = 0; j < nf; j++)
                    filt[j] = below(w, 10) == 0 ? 999 : w->pod[below(w, PODS)];
            }
            compare_query(w, nsid, keys, qn, nf ? filt : NULL, nf);
        }
        kvt_idx_stats_t st;
        kvt_idx_stats(w->idx, &st);
        if (st.entries != kvt_naive_entries(w->ref))
            fail_msg("op %llu: index has %llu entries, model %llu", (unsigned long long)op,
                     (unsigned long long)st.entries, (unsigned long long)kvt_naive_entries(w->ref));
        if (st.dropped != 0)
            fail_msg("op %llu: %llu blocks dropped: the model cannot follow",
                     (unsigned long long)op, (unsigned long long)st.dropped);
        if (st.refused != w->refused)
            fail_msg("op %llu: the index counts %llu pods/namespaces refused, the test saw %llu",
                     (unsigned long long)op, (unsigned long long)st.refused,
                     (unsigned long long)w->refused);
        if (budget != 0 && st.bytes > budget)
            fail_msg("op %llu: %llu bytes over the budget of %llu", (unsigned long long)op,
                     (unsigned long long)st.bytes, (unsigned long long)budget);
        for (int q = 0; q < PODS; q++)
            if (w->pod[q] != NONE)
                assert_int_equal(kvt_idx_pod_entries(w->idx, w->pod[q]),
                                 kvt_naive_pod_entries(w->ref, w->pod[q]));
        if ((op & 4095) == 0) {
            uint64_t want[3];
            kvt_naive_tier_entries(w->ref, want);
            for (int t = 0; t < 3; t++)
                if (st.tier_entries[t] != want[t])
                    fail_msg("op %llu: tier %d has %llu entries, model %llu",
                             (unsigned long long)op, t, (unsigned long long)st.tier_entries[t],
                             (unsigned long long)want[t]);
        }
    }
}

static uint64_t env_u64(const char *name, uint64_t def)
{
    const char *v = getenv(name);
    return v ? strtoull(v, NULL, 0) : def;
}

static void report(const world_t *w)
{
    print_message("evictions mirrored %llu (leaf checks %llu); namespace drops %llu, stale-id "
                  "queries %llu, pods forgotten %llu, removals reported %llu, pods and "
                  "namespaces refused %llu\n",
                  (unsigned long long)w->evictions, (unsigned long long)w->eviction_checks,
                  (unsigned long long)w->ns_drops, (unsigned long long)w->stale_queries,
                  (unsigned long long)w->pod_forgets, (unsigned long long)w->gone_checked,
                  (unsigned long long)w->refused);
}

static void test_random_unbounded(void **state)
{
    (void)state;
    static world_t w;
    build_world(&w, 0x5eed, 0);
    run(&w, env_u64("KVT_RANDOM_OPS", 700000), 0);
    report(&w);
    assert_int_equal(w.evictions, 0);
    assert_true(w.ns_drops > 100 && w.stale_queries > 1000 && w.pod_forgets > 100 &&
                w.gone_checked > 2000);
    free_world(&w);
}

static void test_random_budget(void **state)
{
    (void)state;
    static world_t w;
    /* small enough that the index evicts often, big enough for its fixed part */
    const uint64_t budget = 200 * 1024;
    build_world(&w, 0x5eed + 1, budget);
    run(&w, env_u64("KVT_RANDOM_OPS", 700000) / 2, budget);
    report(&w);
    assert_true(w.evictions > 1000);
    free_world(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_unbounded),
        cmocka_unit_test(test_random_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
