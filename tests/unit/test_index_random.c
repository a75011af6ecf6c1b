/*
 * Randomized test: kvindex/index against the naive reference model
 * (bench/naive_index), operation by operation, over >= 1 M mixed operations:
 * store (whole chains and continuations), CPU placeholder stores, removals,
 * clears, pod drops, speculative marks, clock advances, queries with and
 * without a pod filter, and budget evictions (mirrored into the model through
 * the eviction callback, each checked to be a leaf).
 *
 * KVT_RANDOM_OPS overrides the number of operations; KVT_RANDOM_SEED the seed.
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

enum { NS = 2, PODS = 6, KEYS = 1500, MAXCHAIN = 24 };

typedef struct world {
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    kvt_naive_t *ref;
    uint32_t ns[NS];
    uint32_t pod[PODS];
    /* a random trie of keys: parent[i] < i or -1 */
    int parent[KEYS];
    uint64_t key[KEYS];
    int depth[KEYS];
    int *children[KEYS];
    int nchildren[KEYS];
    uint64_t salted[NS][KEYS];
    uint64_t rng;
    uint64_t now;
    uint64_t evictions;
    uint64_t eviction_checks;
} world_t;

static uint64_t rnd(world_t *w)
{
    /* splitmix64 */
    uint64_t z = (w->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t below(world_t *w, uint32_t n)
{
    return (uint32_t)(rnd(w) % n);
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

static world_t *g_world;

/* Called by the index for each evicted block: it must be a leaf; mirror it. */
static void on_evict(void *arg, uint64_t salted)
{
    world_t *w = arg;
    for (int ns = 0; ns < NS; ns++) {
        for (int i = 0; i < KEYS; i++) {
            if (w->salted[ns][i] != salted)
                continue;
            /* leaf check: no pod may hold any descendant (DFS over the trie) */
            int stack[KEYS], sp = 0;
            for (int c = 0; c < w->nchildren[i]; c++)
                stack[sp++] = w->children[i][c];
            while (sp > 0) {
                int d = stack[--sp];
                kvt_idx_match_t out[PODS];
                size_t n = kvt_naive_query(w->ref, w->ns[ns], &w->key[d], 1, NULL, 0, out, PODS);
                if (n != 0)
                    fail_msg("evicted key %d has a held descendant %d", i, d);
                for (int c = 0; c < w->nchildren[d]; c++)
                    stack[sp++] = w->children[d][c];
            }
            w->eviction_checks++;
            kvt_naive_evict(w->ref, w->ns[ns], w->key[i]);
            w->evictions++;
            return;
        }
    }
    fail_msg("evicted key %llx is not one of ours", (unsigned long long)salted);
}

static void build_world(world_t *w, uint64_t seed, uint64_t budget)
{
    memset(w, 0, sizeof(*w));
    w->rng = seed;
    kvt_idx_config_t cfg = {.budget_bytes = budget, .on_evict = on_evict, .on_evict_arg = w};
    assert_int_equal(kvt_idx_create(&cfg, &w->idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(w->idx, &w->r), KVT_OK);
    assert_int_equal(kvt_naive_create(&w->ref), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(w->idx, "model", NULL, 16, &w->ns[0]), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(w->idx, "model", "lora", 16, &w->ns[1]), KVT_OK);
    char name[16];
    for (int p = 0; p < PODS; p++) {
        snprintf(name, sizeof(name), "pod%d", p);
        assert_int_equal(kvt_idx_pod_get(w->idx, name, (uint32_t)p % 2, &w->pod[p]), KVT_OK);
    }
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
        for (int i = 0; i < KEYS; i++)
            w->salted[ns][i] = kvt_idx_salted_key(w->idx, w->ns[ns], w->key[i]);
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

static void compare_query(world_t *w, int ns, const uint64_t *keys, size_t n, const uint32_t *pods,
                          size_t npods, uint64_t op)
{
    kvt_idx_match_t want[PODS], got[PODS + 1];
    size_t nw = kvt_naive_query(w->ref, w->ns[ns], keys, n, pods, npods, want, PODS);
    const kvt_idx_match_t *res;
    size_t ng;
    assert_int_equal(kvt_idx_query(w->r, w->ns[ns], keys, n, pods, npods, &res, &ng), KVT_OK);
    if (ng != nw)
        fail_msg("op %llu: index answered %zu pods, model %zu", (unsigned long long)op, ng, nw);
    memcpy(got, res, ng * sizeof(*got));
    qsort(got, ng, sizeof(*got), cmp_match);
    for (size_t i = 0; i < nw; i++) {
        if (memcmp(&got[i], &want[i], sizeof(want[i])) != 0)
            fail_msg("op %llu pod %u: index m=%u g=%u c=%u d=%u, model pod %u m=%u g=%u c=%u d=%u",
                     (unsigned long long)op, got[i].pod, got[i].matched, got[i].gpu, got[i].cpu,
                     got[i].disk, want[i].pod, want[i].matched, want[i].gpu, want[i].cpu,
                     want[i].disk);
    }
}

static unsigned rand_tier(world_t *w)
{
    static const unsigned t[3] = {KVT_TIER_GPU, KVT_TIER_CPU, KVT_TIER_DISK};
    return t[below(w, 3)];
}

static void run(world_t *w, uint64_t ops, uint64_t budget)
{
    int idxs[MAXCHAIN];
    uint64_t keys[MAXCHAIN + 1], ehs[MAXCHAIN];
    for (uint64_t op = 0; op < ops; op++) {
        int ns = (int)below(w, NS);
        int p = (int)below(w, PODS);
        uint32_t pod = w->pod[p];
        int leaf = (int)below(w, KEYS);
        int n = chain(w, leaf, idxs);
        for (int j = 0; j < n; j++)
            keys[j] = w->key[idxs[j]];
        uint32_t r = below(w, 1000);
        if (r < 380) {
            /* store a whole chain, or the tail of one after its parent */
            unsigned tier = rand_tier(w);
            int variant = below(w, 10) == 0 ? 1 : below(w, 40) == 0 ? 2 : 0;
            int from = (n > 1 && below(w, 3) == 0) ? (int)below(w, (uint32_t)n) : 0;
            if (from > 0) {
                /* continue after a parent only where its block exists, as engines do */
                kvt_idx_match_t tmp[PODS];
                if (kvt_naive_query(w->ref, w->ns[ns], &keys[from - 1], 1, NULL, 0, tmp, PODS) == 0)
                    from = 0;
            }
            for (int j = 0; j < n; j++)
                ehs[j] = ehash_of(idxs[j], p, variant) + (uint64_t)ns * 0x100000000ull;
            if (below(w, 200) == 0 && n > 1)
                ehs[n - 1] = ehs[0]; /* the engine reuses a hash for another block */
            const uint64_t *parent = from > 0 ? &keys[from - 1] : NULL;
            assert_int_equal(kvt_idx_store(w->idx, w->ns[ns], pod, tier, parent, keys + from,
                                           ehs + from, (size_t)(n - from)),
                             KVT_OK);
            kvt_naive_store(w->ref, w->ns[ns], pod, tier, keys + from, ehs + from,
                            (size_t)(n - from));
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
            /* removals of a chain's tail, with one or several tiers */
            int variant = below(w, 6) == 0 ? 1 : below(w, 20) == 0 ? 2 : 0;
            int from = (int)below(w, (uint32_t)n);
            for (int j = 0; j < n; j++)
                ehs[j] = ehash_of(idxs[j], p, variant) + (uint64_t)ns * 0x100000000ull;
            unsigned tiers = below(w, 4) == 0 ? (1u + below(w, 7)) : rand_tier(w);
            size_t unres = 0;
            assert_int_equal(
                kvt_idx_remove(w->idx, pod, tiers, ehs + from, (size_t)(n - from), &unres), KVT_OK);
            assert_int_equal(unres,
                             kvt_naive_remove(w->ref, pod, tiers, ehs + from, (size_t)(n - from)));
        } else if (r < 650) {
            unsigned tiers = below(w, 3) == 0 ? KVT_TIER_ALL : KVT_TIER_GPU;
            assert_int_equal(kvt_idx_pod_clear(w->idx, pod, tiers), KVT_OK);
            kvt_naive_pod_clear(w->ref, pod, tiers);
        } else if (r < 652) {
            /* drop and re-register the pod: its id comes back, empty */
            uint32_t rank;
            char name[16];
            snprintf(name, sizeof(name), "%s", kvt_idx_pod_name(w->idx, pod, &rank));
            assert_int_equal(kvt_idx_pod_drop(w->idx, pod), KVT_OK);
            kvt_naive_pod_clear(w->ref, pod, KVT_TIER_ALL);
            uint32_t again;
            assert_int_equal(kvt_idx_pod_get(w->idx, name, rank, &again), KVT_OK);
            assert_int_equal(again, pod);
        } else if (r < 700) {
            uint32_t ttl = below(w, 50);
            assert_int_equal(kvt_idx_speculate(w->idx, w->ns[ns], pod, keys, (size_t)n, ttl),
                             KVT_OK);
            kvt_naive_speculate(w->ref, w->ns[ns], pod, keys, (size_t)n, ttl);
        } else if (r < 740) {
            w->now += below(w, 20);
            kvt_idx_advance(w->idx, w->now);
            kvt_naive_advance(w->ref, w->now);
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
            compare_query(w, ns, keys, qn, nf ? filt : NULL, nf, op);
        }
        if ((op & 1023) == 0 || budget != 0) {
            kvt_idx_stats_t st;
            kvt_idx_stats(w->idx, &st);
            if (st.entries != kvt_naive_entries(w->ref))
                fail_msg("op %llu: index has %llu entries, model %llu", (unsigned long long)op,
                         (unsigned long long)st.entries,
                         (unsigned long long)kvt_naive_entries(w->ref));
            if (budget != 0 && st.bytes > budget)
                fail_msg("op %llu: %llu bytes over the budget of %llu", (unsigned long long)op,
                         (unsigned long long)st.bytes, (unsigned long long)budget);
        }
        if ((op & 4095) == 0) {
            for (int q = 0; q < PODS; q++)
                assert_int_equal(kvt_idx_pod_entries(w->idx, w->pod[q]),
                                 kvt_naive_pod_entries(w->ref, w->pod[q]));
            kvt_idx_stats_t st;
            uint64_t want[3];
            kvt_idx_stats(w->idx, &st);
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

static void test_random_unbounded(void **state)
{
    (void)state;
    static world_t w;
    uint64_t seed = env_u64("KVT_RANDOM_SEED", 0x5eed);
    g_world = &w;
    build_world(&w, seed, 0);
    run(&w, env_u64("KVT_RANDOM_OPS", 700000), 0);
    assert_int_equal(w.evictions, 0);
    free_world(&w);
}

static void test_random_budget(void **state)
{
    (void)state;
    static world_t w;
    uint64_t seed = env_u64("KVT_RANDOM_SEED", 0x5eed) + 1;
    /* small enough that the index evicts often, big enough for its fixed part */
    const uint64_t budget = 200 * 1024;
    build_world(&w, seed, budget);
    run(&w, env_u64("KVT_RANDOM_OPS", 700000) / 2, budget);
    print_message("evictions mirrored: %llu (leaf checks %llu)\n", (unsigned long long)w.evictions,
                  (unsigned long long)w.eviction_checks);
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
