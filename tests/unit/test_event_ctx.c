/*
 * kvindex/event_ctx: the removed-block mappings (a FIFO ring with an
 * open-addressing index) against a naive list, through random puts, gets and
 * pod resets; their sizing from the byte budget; pod ids past the index's
 * limit; and their use by kvt_ev_apply(): a CPU placeholder resolves through
 * a mapping, and one the index budget has no room for counts as dropped, not
 * recovered. (test_event_apply.c has the GPU removal followed by its CPU
 * placeholder, in one batch and across two.)
 * KVT_TEST_SEED=<n> draws other random runs, or replays a printed seed
 * (tests/support/rng.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvindex/event.h"
#include "kvindex/hash.h"
#include "tests/support/rng.h"

static uint64_t rnd(kvt_rng_t *s)
{
    return kvt_rng_next(s);
}

/* The reference: entries in insertion order, the oldest first out. */
typedef struct ref_ent {
    uint32_t pod, epoch, ns;
    uint64_t ehash, key, parent;
    bool has_parent;
} ref_ent_t;

typedef struct ref {
    ref_ent_t *e;
    size_t n, cap;
    uint32_t epoch[16];
    uint64_t evicted;
} ref_t;

static ref_ent_t *ref_find(ref_t *r, uint32_t pod, uint64_t ehash)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].pod == pod && r->e[i].ehash == ehash)
            return &r->e[i];
    return NULL;
}

static void ref_put(ref_t *r, uint32_t pod, uint64_t ehash, uint32_t ns, uint64_t key,
                    const uint64_t *parent)
{
    ref_ent_t v = {pod, r->epoch[pod], ns, ehash, key, parent ? *parent : 0, parent != NULL};
    ref_ent_t *old = ref_find(r, pod, ehash);
    if (old != NULL) {
        *old = v; /* replaced where it stands */
        return;
    }
    if (r->n == r->cap) {
        memmove(r->e, r->e + 1, (r->n - 1) * sizeof(*r->e));
        r->n--;
        r->evicted++;
    }
    r->e[r->n++] = v;
}

static void test_random_against_reference(void **state)
{
    (void)state;
    const uint64_t seed = kvt_test_seed(); /* named in a failure's message */
    kvt_rng_t s;
    kvt_rng_init(&s, 0);
    for (int round = 0; round < 20; round++) {
        size_t budget = 256 + (size_t)(rnd(&s) % 8192);
        kvt_ev_ctx_t *ctx;
        assert_int_equal(kvt_ev_ctx_create(budget, &ctx), KVT_OK);
        kvt_ev_ctx_stats_t st;
        kvt_ev_ctx_stats(ctx, &st);
        assert_int_equal(st.removed_capacity, 0); /* nothing allocated before the first put */
        ref_t r = {0};
        uint64_t pod_mask = 1 + rnd(&s) % 15, hash_mask = 1 + rnd(&s) % 255;
        for (int op = 0; op < 5000; op++) {
            uint32_t pod = (uint32_t)(rnd(&s) & pod_mask) % 16;
            uint64_t h = (rnd(&s) & hash_mask) * 0x9e3779b97f4a7c15ull; /* collide at random */
            uint64_t k = rnd(&s), pk = rnd(&s);
            switch (rnd(&s) % 8) {
            case 0:
                kvt_ev_ctx_pod_reset(ctx, pod);
                r.epoch[pod]++;
                break;
            case 1:
            case 2:
            case 3: {
                bool hp = rnd(&s) % 2;
                kvt_ev_ctx_removed_put(ctx, pod, h, (uint32_t)(k % 7), k, hp ? &pk : NULL);
                if (r.e == NULL) {
                    kvt_ev_ctx_stats(ctx, &st);
                    r.cap = st.removed_capacity;
                    assert_true(r.cap >= 1);
                    /* the largest power-of-two table that fits: more than half the budget */
                    assert_true(st.removed_bytes <= budget && st.removed_bytes > budget / 2);
                    assert_int_equal(st.removed_bytes, r.cap * KVT_EV_REMOVED_ENTRY_BYTES);
                    r.e = calloc(r.cap, sizeof(*r.e));
                    assert_non_null(r.e);
                }
                ref_put(&r, pod, h, (uint32_t)(k % 7), k, hp ? &pk : NULL);
                break;
            }
            default: {
                uint32_t ns = 99;
                uint64_t key = 0, parent = 0;
                bool has_parent = false;
                bool got = kvt_ev_ctx_removed_get(ctx, pod, h, &ns, &key, &has_parent, &parent);
                ref_ent_t *e = r.e ? ref_find(&r, pod, h) : NULL;
                bool want = e != NULL && e->epoch == r.epoch[pod];
                if (got != want)
                    fail_msg("seed %llu round %d op %d: get(%u, %llx) %d, want %d",
                             (unsigned long long)seed, round, op, pod, (unsigned long long)h, got,
                             want);
                if (got)
                    assert_true(ns == e->ns && key == e->key && has_parent == e->has_parent &&
                                (!has_parent || parent == e->parent));
                break;
            }
            }
            kvt_ev_ctx_stats(ctx, &st);
            assert_int_equal(st.removed_entries, r.n);
            assert_int_equal(st.removed_evicted, r.evicted);
        }
        free(r.e);
        kvt_ev_ctx_destroy(ctx);
    }
}

static void test_budgets(void **state)
{
    (void)state;
    kvt_ev_ctx_t *ctx;
    kvt_ev_ctx_stats_t st;
    /* no budget: nothing is kept */
    assert_int_equal(kvt_ev_ctx_create(0, &ctx), KVT_OK);
    uint64_t k = 5;
    kvt_ev_ctx_removed_put(ctx, 0, 1, 0, k, NULL);
    uint32_t ns;
    uint64_t key, parent;
    bool hp;
    assert_false(kvt_ev_ctx_removed_get(ctx, 0, 1, &ns, &key, &hp, &parent));
    kvt_ev_ctx_stats(ctx, &st);
    assert_true(st.removed_capacity == 0 && st.removed_bytes == 0);
    kvt_ev_ctx_destroy(ctx);
    /* the default 8 MiB: about 8 MiB / 48 bytes mappings, within the budget */
    assert_int_equal(kvt_ev_ctx_create((size_t)8 << 20, &ctx), KVT_OK);
    kvt_ev_ctx_removed_put(ctx, 3, 7, 1, k, &k);
    kvt_ev_ctx_stats(ctx, &st);
    assert_true(st.removed_bytes <= (8u << 20) && st.removed_capacity >= (8u << 20) / 96);
    assert_true(kvt_ev_ctx_removed_get(ctx, 3, 7, &ns, &key, &hp, &parent));
    assert_true(ns == 1 && key == 5 && hp && parent == 5);
    assert_false(kvt_ev_ctx_removed_get(ctx, 2, 7, &ns, &key, &hp, &parent));
    kvt_ev_ctx_pod_reset(ctx, 3);
    assert_false(kvt_ev_ctx_removed_get(ctx, 3, 7, &ns, &key, &hp, &parent));
    kvt_ev_ctx_destroy(ctx);
    kvt_ev_ctx_destroy(NULL);
    kvt_ev_ctx_stats(NULL, &st);
    assert_int_equal(st.removed_entries, 0);
}

/* Pod ids no index hands out are refused, not grown to (doubling to 2^31 wrapped to 0). */
static void test_pod_ids_past_the_limit(void **state)
{
    (void)state;
    kvt_ev_ctx_t *ctx;
    assert_int_equal(kvt_ev_ctx_create((size_t)1 << 20, &ctx), KVT_OK);
    uint32_t ns;
    uint64_t k = 9, key, parent;
    bool hp;
    const uint32_t pods[] = {UINT32_MAX, 0x80000000u, KVT_IDX_MAX_PODS};
    for (size_t i = 0; i < sizeof(pods) / sizeof(pods[0]); i++) {
        kvt_ev_ctx_removed_put(ctx, pods[i], 1, 0, k, NULL);
        assert_false(kvt_ev_ctx_removed_get(ctx, pods[i], 1, &ns, &key, &hp, &parent));
        kvt_ev_ctx_pod_reset(ctx, pods[i]);
    }
    kvt_ev_ctx_removed_put(ctx, KVT_IDX_MAX_PODS - 1, 1, 0, k, NULL);
    assert_true(kvt_ev_ctx_removed_get(ctx, KVT_IDX_MAX_PODS - 1, 1, &ns, &key, &hp, &parent));
    assert_true(key == k && !hp);
    kvt_ev_ctx_stats_t st;
    kvt_ev_ctx_stats(ctx, &st);
    assert_int_equal(st.removed_entries, 1);
    kvt_ev_ctx_destroy(ctx);
}

/*
 * A placeholder (token-less CPU store) of pod "a" for engine hash 77, which
 * @ctx maps to a removed block, applied to a new index of @budget bytes.
 */
static void apply_recovered(uint64_t budget, kvt_ev_counters_t *c, kvt_idx_stats_t *st,
                            kvt_ev_ctx_stats_t *cs)
{
    kvt_idx_config_t cfg = {.budget_bytes = budget};
    kvt_idx_t *idx;
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    uint32_t ns, pod;
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 4, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_OK);
    kvt_ev_ctx_t *ctx;
    assert_int_equal(kvt_ev_ctx_create((size_t)1 << 20, &ctx), KVT_OK);
    kvt_ev_ctx_removed_put(ctx, pod, 77, ns, 1234, NULL);
    uint64_t h = 77;
    kvt_event_t e = {
        .type = KVT_EV_STORED, .tier = KVT_TIER_CPU, .nhashes = 1, .hashes = &h, .group = -1};
    kvt_evbatch_t b = {.pod = "a", .model = "m", .ev = &e, .nev = 1};
    char err[200];
    memset(c, 0, sizeof(*c));
    assert_int_equal(kvt_ev_apply(idx, ctx, &b, 4, 0, c, err, sizeof(err)), KVT_OK);
    kvt_idx_stats(idx, st);
    kvt_ev_ctx_stats(ctx, cs);
    kvt_ev_ctx_destroy(ctx);
    kvt_idx_destroy(idx);
}

/* A mapping resolves a placeholder; one the budget has no room for is dropped, not recovered. */
static void test_apply_recovers_through_mappings(void **state)
{
    (void)state;
    kvt_ev_counters_t c;
    kvt_idx_stats_t st;
    kvt_ev_ctx_stats_t cs;
    apply_recovered(0, &c, &st, &cs); /* no budget */
    assert_true(c.recovered == 1 && c.events == 1 && c.blocks == 1 && c.dropped == 0);
    assert_true(st.entries == 1 && st.tier_entries[1] == 1 && cs.removed_hits == 1);
    /* room for the pod and the namespace only (the least budget that takes both, besides
     * the room the index keeps for its key table): the block cannot be stored */
    kvt_idx_t *idx;
    assert_int_equal(kvt_idx_create(NULL, &idx), KVT_OK);
    uint32_t ns, pod;
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 4, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &pod), KVT_OK);
    kvt_idx_stats(idx, &st);
    kvt_idx_destroy(idx);
    uint64_t budget = st.bytes;
    for (;; budget += 64) {
        kvt_idx_config_t cfg = {.budget_bytes = budget};
        assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
        bool fits = kvt_idx_ns_get(idx, "m", NULL, 4, &ns) == KVT_OK &&
                    kvt_idx_pod_get(idx, "a", 0, &pod) == KVT_OK;
        kvt_idx_destroy(idx);
        if (fits)
            break;
        assert_true(budget < st.bytes + (1u << 20)); /* the key table's room is far less */
    }
    apply_recovered(budget, &c, &st, &cs);
    assert_true(st.entries == 0 && st.dropped == 1);
    assert_true(c.recovered == 0 && c.dropped == 1 && c.events == 0 && c.blocks == 0);
    assert_int_equal(cs.removed_hits, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budgets),
        cmocka_unit_test(test_pod_ids_past_the_limit),
        cmocka_unit_test(test_apply_recovers_through_mappings),
        cmocka_unit_test(test_random_against_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
