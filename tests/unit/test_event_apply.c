/*
 * kvindex/event: applying neutral event batches to a real index: chains,
 * placeholders, removals, clears; the strict (HTTP) and lenient (stream)
 * modes; KV cache groups; skipped and bad events; cache salts and extra
 * keys; LoRA keys Dynamo's way (KVT_EV_LORA_DYNAMO); blocks the budget had no
 * room for; running out of memory for the context's per-pod state.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "kvindex/event.h"
#include "kvindex/hash.h"
#include "tests/support/events.h"
#include "tests/support/fail_alloc.h"

typedef struct fix {
    kvt_idx_t *idx;
    kvt_idx_reader_t *rd;
    kvt_ev_ctx_t *ctx;
    uint32_t tok[64];
} fix_t;

static int setup(void **state)
{
    static fix_t f;
    memset(&f, 0, sizeof(f));
    if (kvt_idx_create(NULL, &f.idx) != KVT_OK || kvt_idx_reader_create(f.idx, &f.rd) != KVT_OK ||
        kvt_ev_ctx_create(1 << 20, &f.ctx) != KVT_OK)
        return -1;
    for (uint32_t i = 0; i < 64; i++)
        f.tok[i] = 1000 + i * 7;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fix_t *f = *state;
    kvt_idx_reader_destroy(f->rd);
    kvt_idx_destroy(f->idx);
    kvt_ev_ctx_destroy(f->ctx);
    return 0;
}

static kvt_status_t apply(fix_t *f, const char *pod, kvt_event_t *ev, size_t n,
                          kvt_ev_counters_t *c)
{
    kvt_evbatch_t b = {.pod = pod, .model = "m", .ev = ev, .nev = n};
    char err[200];
    return kvt_ev_apply(f->idx, NULL, &b, 4, KVT_EV_STRICT, c, err, sizeof(err));
}

/* As an engine stream applies: lenient, with the fixture's context. */
static kvt_status_t apply_stream(fix_t *f, const char *pod, kvt_event_t *ev, size_t n,
                                 kvt_ev_counters_t *c)
{
    kvt_evbatch_t b = {.pod = pod, .model = "m", .ev = ev, .nev = n};
    char err[200];
    return kvt_ev_apply(f->idx, f->ctx, &b, 4, 0, c, err, sizeof(err));
}

/* matched blocks of @pod for the fixture's tokens (first @ntok), -1 if absent; tiers split out */
static int matched(fix_t *f, const char *pod, size_t ntok, uint32_t *gpu, uint32_t *cpu)
{
    uint32_t ns, p;
    if (kvt_idx_ns_get(f->idx, "m", NULL, 0, &ns) != KVT_OK ||
        kvt_idx_pod_find(f->idx, pod, 0, &p) != KVT_OK)
        return -1;
    uint64_t keys[16];
    size_t nb = kvt_hash_seq(f->tok, ntok, 4, KVT_HASH_SEED, NULL, NULL, keys);
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(f->rd, ns, keys, nb, NULL, 0, &res, &nres), KVT_OK);
    for (size_t i = 0; i < nres; i++)
        if (res[i].pod == p) {
            if (gpu)
                *gpu = res[i].gpu;
            if (cpu)
                *cpu = res[i].cpu;
            return (int)res[i].matched;
        }
    return 0;
}

static void test_store_parent_remove_clear(void **state)
{
    fix_t *f = *state;
    kvt_ev_counters_t c = {0};
    uint64_t h1[] = {11, 12, 13};
    kvt_event_t e1 = test_stored(h1, 3, f->tok, 4);
    assert_int_equal(apply(f, "A", &e1, 1, &c), KVT_OK);
    assert_int_equal(matched(f, "A", 32, NULL, NULL), 3);
    /* the parent continues the chain */
    uint64_t h2[] = {14, 15};
    kvt_event_t e2 = test_stored(h2, 2, f->tok + 12, 4);
    e2.has_parent = true;
    e2.parent = 13;
    assert_int_equal(apply(f, "A", &e2, 1, &c), KVT_OK);
    assert_int_equal(matched(f, "A", 32, NULL, NULL), 5);
    assert_int_equal(c.orphans, 0);
    /* an unknown parent: chained from block 0, so it does not extend A's prefix */
    uint64_t h3[] = {16};
    kvt_event_t e3 = test_stored(h3, 1, f->tok + 20, 4);
    e3.has_parent = true;
    e3.parent = 999;
    assert_int_equal(apply(f, "A", &e3, 1, &c), KVT_OK);
    assert_int_equal(c.orphans, 1);
    assert_int_equal(matched(f, "A", 32, NULL, NULL), 5);
    /* CPU placeholders by engine hash; one unknown */
    uint64_t hp[] = {11, 12, 77};
    kvt_event_t ep = test_stored(hp, 3, NULL, 0);
    ep.tier = KVT_TIER_CPU;
    assert_int_equal(apply(f, "A", &ep, 1, &c), KVT_OK);
    assert_int_equal(c.unresolved, 1);
    /* remove GPU for 11, 12: they stay in CPU */
    uint64_t hr[] = {11, 12};
    kvt_event_t er = {.type = KVT_EV_REMOVED, .tier = KVT_TIER_GPU, .nhashes = 2, .hashes = hr};
    assert_int_equal(apply(f, "A", &er, 1, &c), KVT_OK);
    uint32_t g = 0, cp = 0;
    assert_int_equal(matched(f, "A", 32, &g, &cp), 5);
    assert_int_equal(g, 3);
    assert_int_equal(cp, 2);
    /* clear drops the GPU tier: the CPU prefix remains */
    kvt_event_t ec = {.type = KVT_EV_CLEARED};
    assert_int_equal(apply(f, "A", &ec, 1, &c), KVT_OK);
    assert_int_equal(matched(f, "A", 32, &g, &cp), 2);
    assert_int_equal(g, 0);
    assert_int_equal(c.events, 6);
    assert_int_equal(c.blocks, 3 + 2 + 1 + 3 + 2);
}

static void test_bad_batches_change_nothing(void **state)
{
    fix_t *f = *state;
    kvt_ev_counters_t c = {0};
    uint64_t h[] = {1, 2};
    kvt_event_t ok = test_stored(h, 2, f->tok, 4);
    assert_int_equal(apply(f, "B", &ok, 1, &c), KVT_OK);
    kvt_idx_stats_t s0;
    kvt_idx_stats(f->idx, &s0);
    /* block size 8 for a model created with 4; an earlier good event must not apply either */
    kvt_event_t two[2] = {test_stored(h, 2, f->tok, 4), test_stored(h, 2, f->tok, 8)};
    two[0].hashes = (const uint64_t[]){5, 6};
    assert_int_equal(apply(f, "NEW", two, 2, &c), KVT_ERR_INVAL);
    /* tokens but no model */
    kvt_evbatch_t b = {.pod = "NEW2", .model = "", .ev = &ok, .nev = 1};
    char err[200];
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &b, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(err, "model"));
    /* token count that does not fill the blocks */
    kvt_event_t odd = test_stored(h, 2, f->tok, 4);
    odd.ntokens = 7;
    assert_int_equal(apply(f, "NEW3", &odd, 1, &c), KVT_ERR_INVAL);
    kvt_idx_stats_t s1;
    kvt_idx_stats(f->idx, &s1);
    assert_memory_equal(&s0, &s1, sizeof(s0));
    uint32_t p;
    assert_int_equal(kvt_idx_pod_find(f->idx, "NEW", 0, &p), KVT_ERR_NOT_FOUND);
}

static void test_pod_key(void **state)
{
    fix_t *f = *state;
    kvt_ev_counters_t c = {0};
    uint64_t h[] = {41, 42};
    kvt_event_t e = test_stored(h, 2, f->tok, 4);
    assert_int_equal(apply(f, "C", &e, 1, &c), KVT_OK);
    uint32_t ns, p;
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", NULL, 0, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_find(f->idx, "C", 0, &p), KVT_OK);
    uint64_t keys[2], k;
    kvt_hash_seq(f->tok, 8, 4, KVT_HASH_SEED, NULL, NULL, keys);
    assert_int_equal(kvt_idx_pod_key(f->idx, p, ns, 42, &k), KVT_OK);
    assert_true(k == keys[1]);
    assert_int_equal(kvt_idx_pod_key(f->idx, p, ns, 43, &k), KVT_ERR_NOT_FOUND);
    assert_int_equal(kvt_idx_pod_key(f->idx, 9999, ns, 42, &k), KVT_ERR_INVAL);
}

/* A BlockStored longer than the apply chunk stays one chain (parent carried across chunks). */
/* Events of one batch in several LoRA namespaces each land in their own (the lookup is cached). */
static void test_lora_namespaces_in_one_batch(void **state)
{
    fix_t *f = *state;
    static const uint64_t h1[] = {1, 2}, h2[] = {11, 12}, h3[] = {21};
    char a1[] = "adapter-a", a2[] = "adapter-a"; /* equal names, different pointers */
    kvt_event_t ev[4] = {test_stored(h1, 2, f->tok, 4), test_stored(h2, 2, f->tok, 4),
                         test_stored(h3, 1, f->tok, 4), test_stored(h3, 1, f->tok, 4)};
    ev[1].lora_name = a1;
    ev[2].lora_name = a2;
    ev[3].lora_name = "adapter-b";
    kvt_ev_counters_t c = {0};
    assert_int_equal(apply(f, "p", ev, 4, &c), KVT_OK);
    uint32_t base, a, b, p;
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", NULL, 0, &base), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", "adapter-a", 0, &a), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", "adapter-b", 0, &b), KVT_OK);
    assert_true(base != a && a != b && base != b);
    assert_int_equal(kvt_idx_pod_find(f->idx, "p", 0, &p), KVT_OK);
    uint64_t keys[2];
    kvt_hash_seq(f->tok, 8, 4, KVT_HASH_SEED, NULL, NULL, keys);
    const uint32_t want[3] = {2, 2, 1};
    const uint32_t nss[3] = {base, a, b};
    for (int i = 0; i < 3; i++) {
        const kvt_idx_match_t *res;
        size_t nres;
        assert_int_equal(kvt_idx_query(f->rd, nss[i], keys, 2, NULL, 0, &res, &nres), KVT_OK);
        assert_int_equal(nres, 1);
        assert_int_equal(res[0].matched, want[i]);
    }
    /* a block size that differs from the namespace's, after a cached lookup: refused whole */
    kvt_event_t bad[2] = {test_stored(h2, 2, f->tok, 4), test_stored(h3, 1, f->tok, 8)};
    bad[0].lora_name = a1;
    bad[1].lora_name = a2;
    kvt_ev_counters_t before = c;
    char err[200];
    kvt_evbatch_t bb = {.pod = "p", .model = "m", .ev = bad, .nev = 2};
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &bb, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(err, "block_size 8, but model 'm' uses 4"));
    assert_memory_equal(&c, &before, sizeof(c));
    /* a namespace the batch creates takes its first event's block size: refused whole too */
    kvt_event_t mixed[2] = {test_stored(h1, 2, f->tok, 4), test_stored(h3, 1, f->tok, 8)};
    kvt_evbatch_t mb = {.pod = "p", .model = "m2", .ev = mixed, .nev = 2};
    kvt_idx_stats_t s0, s1;
    kvt_idx_stats(f->idx, &s0);
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &mb, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(err, "events[1]: block_size 8, but model 'm2' uses 4"));
    assert_memory_equal(&c, &before, sizeof(c));
    kvt_idx_stats(f->idx, &s1);
    assert_memory_equal(&s0, &s1, sizeof(s0));
    uint32_t ns;
    assert_int_equal(kvt_idx_ns_get(f->idx, "m2", NULL, 0, &ns), KVT_ERR_NOT_FOUND);
    /* "" is the base model too; a LoRA's new namespace is its own */
    kvt_event_t base2[3] = {test_stored(h1, 2, f->tok, 4), test_stored(h3, 1, f->tok, 4),
                            test_stored(h3, 1, f->tok, 8)};
    base2[1].lora_name = "";
    base2[2].lora_name = "adapter-c";
    mb.ev = base2;
    mb.nev = 3;
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &mb, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_OK);
    assert_int_equal(c.events, before.events + 3);
    base2[1].block_size = 8; /* in a new model too: null and "" name one namespace */
    base2[1].ntokens = 8;
    mb.model = "m3";
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &mb, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(err, "events[1]: block_size 8, but model 'm3' uses 4"));
    /* more new namespaces than the check remembers: the later ones are found by a scan */
    enum { NL = 40 };
    static kvt_event_t many[NL + 2];
    static char names[NL][16];
    for (int i = 0; i < NL; i++) {
        snprintf(names[i], sizeof(names[i]), "lora-%d", i);
        many[i] = test_stored(h3, 1, f->tok, i % 2 ? 4 : 8);
        many[i].lora_name = names[i];
    }
    for (int bad_lora = 3; bad_lora < NL; bad_lora += NL - 4) { /* remembered, then scanned */
        many[NL] = many[bad_lora];
        many[NL + 1] = test_stored(h3, 1, f->tok, bad_lora % 2 ? 8 : 4);
        many[NL + 1].lora_name = names[bad_lora];
        kvt_evbatch_t lb = {.pod = "p", .model = "m4", .ev = many, .nev = NL + 2};
        kvt_idx_stats(f->idx, &s0);
        assert_int_equal(kvt_ev_apply(f->idx, NULL, &lb, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                         KVT_ERR_INVAL);
        assert_non_null(strstr(err, "events[41]"));
        kvt_idx_stats(f->idx, &s1);
        assert_memory_equal(&s0, &s1, sizeof(s0));
    }
    many[NL + 1] = many[NL - 1];
    kvt_evbatch_t lb = {.pod = "p", .model = "m4", .ev = many, .nev = NL + 2};
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &lb, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_OK);
}

/* A store of @nb blocks of 2 tokens (@tok[0..2 @nb)), engine hashes @h0, @h0 + 1, ... in @h. */
static kvt_event_t long_stored(uint32_t *tok, uint64_t *h, uint32_t nb, uint64_t h0)
{
    for (uint32_t i = 0; i < nb * 2; i++)
        tok[i] = i * 31 + 7;
    for (uint32_t i = 0; i < nb; i++)
        h[i] = h0 + i;
    return test_stored(h, nb, tok, 2);
}

static void test_long_event(void **state)
{
    fix_t *f = *state;
    enum { NB = 300 };
    static uint32_t tok[NB * 2];
    static uint64_t h[NB], keys[NB];
    kvt_ev_counters_t c = {0};
    kvt_event_t e = long_stored(tok, h, NB, 5000);
    kvt_evbatch_t b = {.pod = "L", .model = "long", .ev = &e, .nev = 1};
    char err[200];
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &b, 2, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_OK);
    uint32_t ns, p;
    assert_int_equal(kvt_idx_ns_get(f->idx, "long", NULL, 0, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_find(f->idx, "L", 0, &p), KVT_OK);
    assert_int_equal(kvt_hash_seq(tok, NB * 2, 2, KVT_HASH_SEED, NULL, NULL, keys), NB);
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(f->rd, ns, keys, NB, NULL, 0, &res, &nres), KVT_OK);
    assert_int_equal(nres, 1);
    assert_int_equal(res[0].matched, NB);
    uint64_t k;
    assert_int_equal(kvt_idx_pod_key(f->idx, p, ns, h[NB - 1], &k), KVT_OK);
    assert_true(k == keys[NB - 1]);
}

/*
 * Hybrid models: only full-attention groups are indexed. A block a sliding
 * window group evicts stays matched while full attention holds it; the full
 * group's own removal removes it.
 */
static void test_kv_cache_groups(void **state)
{
    fix_t *f = *state;
    kvt_ev_counters_t c = {0};
    uint64_t h[] = {101, 102};
    kvt_event_t full = test_stored(h, 2, f->tok, 4), swa = test_stored(h, 2, f->tok, 4);
    full.group = 0;
    full.group_kind = KVT_EV_GROUP_FULL;
    swa.group = 1;
    swa.group_kind = KVT_EV_GROUP_OTHER;
    kvt_event_t both[2] = {full, swa};
    assert_int_equal(apply_stream(f, "H", both, 2, &c), KVT_OK);
    assert_int_equal(c.other_groups, 1);
    assert_int_equal(matched(f, "H", 8, NULL, NULL), 2);
    /* the sliding window group evicts block 102: a removal naming only group 1 */
    uint64_t hr[] = {102};
    kvt_event_t rm = {
        .type = KVT_EV_REMOVED, .tier = KVT_TIER_GPU, .nhashes = 1, .hashes = hr, .group = 1};
    assert_int_equal(apply_stream(f, "H", &rm, 1, &c), KVT_OK);
    assert_int_equal(c.other_groups, 2);
    assert_int_equal(matched(f, "H", 8, NULL, NULL), 2);
    /* a removal without group_idx, or of the full group, removes it */
    rm.group = -1;
    assert_int_equal(apply_stream(f, "H", &rm, 1, &c), KVT_OK);
    assert_int_equal(matched(f, "H", 8, NULL, NULL), 1);
    assert_int_equal(c.other_groups, 2);
    assert_int_equal(apply_stream(f, "H", both, 2, &c), KVT_OK);
    assert_int_equal(matched(f, "H", 8, NULL, NULL), 2);
    rm.group = 0;
    assert_int_equal(apply_stream(f, "H", &rm, 1, &c), KVT_OK);
    assert_int_equal(matched(f, "H", 8, NULL, NULL), 1);
    /* stores with no kind: a group known as sliding window stays unindexed, others are */
    uint64_t h2[] = {201};
    kvt_event_t k1 = test_stored(h2, 1, f->tok + 32, 4), k3 = test_stored(h2, 1, f->tok + 32, 4);
    k1.group = 1;
    k3.group = 3;
    uint64_t before = c.other_groups;
    assert_int_equal(apply_stream(f, "H", &k1, 1, &c), KVT_OK);
    assert_int_equal(c.other_groups, before + 1);
    assert_int_equal(apply_stream(f, "H", &k3, 1, &c), KVT_OK);
    assert_int_equal(c.other_groups, before + 1);
    /* a group learned as full again (a group index reused after a restart) is indexed */
    swa.group_kind = KVT_EV_GROUP_FULL;
    assert_int_equal(apply_stream(f, "H", &swa, 1, &c), KVT_OK);
    rm.group = 1;
    hr[0] = 101;
    assert_int_equal(apply_stream(f, "H", &rm, 1, &c), KVT_OK);
    assert_int_equal(matched(f, "H", 8, NULL, NULL), 0);
    /* pod reset forgets the groups */
    uint32_t p;
    assert_int_equal(kvt_idx_pod_find(f->idx, "H", 0, &p), KVT_OK);
    swa.group_kind = KVT_EV_GROUP_OTHER;
    assert_int_equal(apply_stream(f, "H", &swa, 1, &c), KVT_OK);
    kvt_ev_ctx_pod_reset(f->ctx, p);
    before = c.other_groups;
    assert_int_equal(apply_stream(f, "H", &k1, 1, &c), KVT_OK); /* group 1, no kind: unknown */
    assert_int_equal(c.other_groups, before);
    /* without a context a store of another kind is still skipped; removals all apply */
    kvt_evbatch_t b = {.pod = "H2", .model = "m", .ev = &swa, .nev = 1};
    char err[200];
    before = c.other_groups;
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &b, 4, 0, &c, err, sizeof(err)), KVT_OK);
    assert_int_equal(c.other_groups, before + 1);
    assert_int_equal(matched(f, "H2", 8, NULL, NULL), 0);
}

/*
 * A bad event that may have been a removal drops the pod's engine-reported
 * state where it stood: events before it are lost with the state, events
 * after it apply. A bad store is skipped alone.
 */
static void test_bad_events_and_skips(void **state)
{
    fix_t *f = *state;
    kvt_ev_counters_t c = {0};
    uint64_t h1[] = {1, 2}, h2[] = {3, 4};
    kvt_event_t ev[3] = {test_stored(h1, 2, f->tok, 4),
                         {.type = KVT_EV_BAD, .may_remove = false},
                         test_stored(h2, 2, f->tok + 16, 4)};
    assert_int_equal(apply_stream(f, "B", ev, 3, &c), KVT_OK);
    assert_int_equal(c.bad, 1);
    assert_int_equal(c.state_drops, 0);
    assert_int_equal(matched(f, "B", 8, NULL, NULL), 2);
    /* DISK and speculative entries go too (the router's guesses were about that state) */
    kvt_event_t disk = test_stored(h2, 2, NULL, 0);
    disk.tier = KVT_TIER_DISK;
    assert_int_equal(apply_stream(f, "B", &disk, 1, &c), KVT_OK);
    uint32_t p, ns;
    assert_int_equal(kvt_idx_pod_find(f->idx, "B", 0, &p), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", NULL, 0, &ns), KVT_OK);
    uint64_t spec[2];
    kvt_hash_seq(f->tok + 32, 8, 4, KVT_HASH_SEED, NULL, NULL, spec);
    assert_int_equal(kvt_idx_speculate(f->idx, ns, p, spec, 2, 60000), KVT_OK);
    kvt_idx_stats_t s0;
    kvt_idx_stats(f->idx, &s0);
    assert_int_equal(s0.speculative, 2);
    assert_int_equal(s0.tier_entries[2], 2); /* the DISK store resolved */
    kvt_event_t removal = {.type = KVT_EV_BAD, .may_remove = true};
    assert_int_equal(apply_stream(f, "B", &removal, 1, &c), KVT_OK);
    assert_int_equal(c.state_drops, 1);
    assert_int_equal(matched(f, "B", 8, NULL, NULL), 0);
    assert_int_equal(kvt_idx_pod_entries(f->idx, p), 0);
    kvt_idx_stats(f->idx, &s0);
    assert_true(s0.speculative == 0 && s0.tier_entries[2] == 0);
    /* the drop happens where the bad event stands: what follows it applies */
    kvt_event_t after[2] = {removal, test_stored(h1, 2, f->tok, 4)};
    assert_int_equal(apply_stream(f, "B", after, 2, &c), KVT_OK);
    assert_int_equal(matched(f, "B", 8, NULL, NULL), 2);
    /* REMOTE and unknown mediums are skipped and counted, nothing else */
    kvt_event_t remote = test_stored(h2, 2, f->tok, 4), tape = test_stored(h2, 2, f->tok, 4);
    remote.skip = KVT_EV_SKIP_REMOTE;
    tape.skip = KVT_EV_SKIP_MEDIUM;
    tape.tier = 0;
    kvt_event_t skips[2] = {remote, tape};
    kvt_idx_stats_t s1;
    kvt_idx_stats(f->idx, &s0);
    assert_int_equal(apply_stream(f, "B", skips, 2, &c), KVT_OK);
    kvt_idx_stats(f->idx, &s1);
    assert_true(c.remote == 1 && c.unknown_medium == 1);
    assert_int_equal(s1.entries, s0.entries);
    /* strict mode (HTTP) refuses a bad block size whole; the stream skips that store alone */
    kvt_event_t mixed[2] = {test_stored(h2, 2, f->tok + 16, 4), test_stored(h1, 1, f->tok, 8)};
    kvt_ev_counters_t before = c;
    assert_int_equal(apply(f, "S", mixed, 2, &c), KVT_ERR_INVAL);
    assert_memory_equal(&c, &before, sizeof(c));
    assert_int_equal(apply_stream(f, "S", mixed, 2, &c), KVT_OK);
    assert_int_equal(c.bad, before.bad + 1);
    assert_int_equal(c.events, before.events + 1);
    assert_int_equal(matched(f, "S", 8, NULL, NULL), 0); /* the prefix of tok+16: not tok's */
}

/* Keys of @ntok tokens of the fixture from block 0 with cache salt @salt ("" none). */
static size_t salted_keys(fix_t *f, size_t ntok, const char *salt, uint64_t *keys)
{
    return kvt_hash_seq_salted(f->tok, ntok, 4, kvt_hash_salt_seed(salt, strlen(salt)), NULL, NULL,
                               keys);
}

/* Matched blocks of @pod in namespace (m, @lora) for @keys[0..n); 0 when either is unknown. */
static uint32_t matched_ns(fix_t *f, const char *lora, const char *pod, const uint64_t *keys,
                           size_t n)
{
    uint32_t ns, p;
    if (kvt_idx_ns_get(f->idx, "m", lora, 0, &ns) != KVT_OK ||
        kvt_idx_pod_find(f->idx, pod, 0, &p) != KVT_OK)
        return 0;
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(f->rd, ns, keys, n, NULL, 0, &res, &nres), KVT_OK);
    for (size_t i = 0; i < nres; i++)
        if (res[i].pod == p)
            return res[i].matched;
    return 0;
}

static uint32_t matched_keys(fix_t *f, const char *pod, const uint64_t *keys, size_t n)
{
    return matched_ns(f, NULL, pod, keys, n);
}

/* A salted prefix matches only queries with the same salt, and extends through parents. */
static void test_cache_salt_and_extra_keys(void **state)
{
    fix_t *f = *state;
    kvt_ev_counters_t c = {0};
    uint64_t h[] = {31, 32}, h2[] = {33};
    kvt_event_t e = test_stored(h, 2, f->tok, 4);
    e.cache_salt = "tenant-a";
    e.cache_salt_len = 8;
    assert_int_equal(apply_stream(f, "T", &e, 1, &c), KVT_OK);
    /* continued through the parent: the salt is already in the chain */
    kvt_event_t e2 = test_stored(h2, 1, f->tok + 8, 4);
    e2.has_parent = true;
    e2.parent = 32;
    assert_int_equal(apply_stream(f, "T", &e2, 1, &c), KVT_OK);
    uint64_t k_a[3], k_none[3], k_b[3];
    salted_keys(f, 12, "tenant-a", k_a);
    salted_keys(f, 12, "", k_none);
    salted_keys(f, 12, "tenant-b", k_b);
    assert_int_equal(matched_keys(f, "T", k_a, 3), 3);
    assert_int_equal(matched_keys(f, "T", k_none, 3), 0);
    assert_int_equal(matched_keys(f, "T", k_b, 3), 0);
    /* and the other way: an unsalted prefix never matches a salted query */
    kvt_event_t u = test_stored(h, 2, f->tok, 4);
    assert_int_equal(apply_stream(f, "U", &u, 1, &c), KVT_OK);
    assert_int_equal(matched_keys(f, "U", k_none, 3), 2);
    assert_int_equal(matched_keys(f, "U", k_a, 3), 0);
    /* an orphan (unknown parent) with a salt starts a salted chain at its first block */
    kvt_event_t o = test_stored(h, 2, f->tok, 4);
    o.has_parent = true;
    o.parent = 12345;
    o.cache_salt = "tenant-a";
    o.cache_salt_len = 8;
    assert_int_equal(apply_stream(f, "O", &o, 1, &c), KVT_OK);
    assert_int_equal(matched_keys(f, "O", k_a, 3), 2);
    /* a block with other extra keys (multimodal): no token query matches it or its children */
    uint64_t seeds[2] = {0, 0xabcdefull};
    kvt_event_t m = test_stored(h, 2, f->tok, 4);
    m.extra_seeds = seeds;
    kvt_event_t m2 = test_stored(h2, 1, f->tok + 8, 4);
    m2.has_parent = true;
    m2.parent = 32;
    kvt_event_t mm[2] = {m, m2};
    assert_int_equal(apply_stream(f, "M", mm, 2, &c), KVT_OK);
    assert_int_equal(matched_keys(f, "M", k_none, 3), 1); /* block 0 had no extra key */
    uint32_t ns, p;
    uint64_t key1, key2;
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", NULL, 0, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_find(f->idx, "M", 0, &p), KVT_OK);
    assert_int_equal(kvt_idx_pod_key(f->idx, p, ns, 32, &key1), KVT_OK);
    assert_int_equal(kvt_idx_pod_key(f->idx, p, ns, 33, &key2), KVT_OK);
    uint64_t l1 = kvt_hash_block(f->tok + 4, 4, KVT_HASH_SEED ^ 0xabcdefull);
    assert_true(key1 == kvt_hash_chain(k_none[0], l1, KVT_HASH_SEED));
    assert_true(key2 ==
                kvt_hash_chain(key1, kvt_hash_block(f->tok + 8, 4, KVT_HASH_SEED), KVT_HASH_SEED));
}

/* Applies @ev[0..n) of @pod with @flags; the batch's LoRA is @batch_lora. */
static kvt_status_t apply_flags(fix_t *f, const char *pod, const char *batch_lora, kvt_event_t *ev,
                                size_t n, unsigned flags, kvt_ev_counters_t *c)
{
    kvt_evbatch_t b = {.pod = pod, .model = "m", .lora = batch_lora, .ev = ev, .nev = n};
    char err[200];
    return kvt_ev_apply(f->idx, f->ctx, &b, 4, flags, c, err, sizeof(err));
}

/*
 * Dynamo's keys of the fixture's first @nb blocks for LoRA @lora, built here block by
 * block: every local hash seeded 1337 + XXH3(lora, 0) (xor @extra at block @xblock), block
 * 0's with the salt's seed plus that term, the chain with 1337.
 */
static void dynamo_keys(fix_t *f, size_t nb, const char *lora, const char *salt, uint32_t xblock,
                        uint64_t extra, uint64_t *keys)
{
    uint64_t seed = kvt_hash_lora_seed(lora, strlen(lora));
    for (size_t i = 0; i < nb; i++) {
        uint64_t s =
            i == 0 ? kvt_hash_salt_seed(salt, strlen(salt)) + (seed - KVT_HASH_SEED) : seed;
        uint64_t local = kvt_hash_block(f->tok + 4 * i, 4, i == xblock ? s ^ extra : s);
        keys[i] = i == 0 ? local : kvt_hash_chain(keys[i - 1], local, KVT_HASH_SEED);
    }
}

/*
 * KVT_EV_LORA_DYNAMO: a LoRA's blocks (the event's lora_name or the batch's) are keyed as
 * Dynamo keys them, in strict and stream mode, through parents, chunks, salts and extra
 * keys; without the flag and for the base model the keys are the standard's.
 */
static void test_lora_dynamo_keys(void **state)
{
    fix_t *f = *state;
    const unsigned dyn = KVT_EV_LORA_DYNAMO;
    kvt_ev_counters_t c = {0};
    uint64_t std_keys[3], dk[3], dk_salt[3], dk_b[3];
    kvt_hash_seq(f->tok, 12, 4, KVT_HASH_SEED, NULL, NULL, std_keys);
    dynamo_keys(f, 3, "adapter-a", "", 99, 0, dk);
    dynamo_keys(f, 3, "adapter-a", "tenant-a", 99, 0, dk_salt);
    dynamo_keys(f, 3, "adapter-b", "", 99, 0, dk_b);
    for (int i = 0; i < 3; i++)
        assert_true(dk[i] != std_keys[i] && dk[i] != dk_salt[i] && dk[i] != dk_b[i]);

    /* HTTP-like (strict) store of 2 blocks, then a stream continuing through the parent */
    uint64_t h[] = {51, 52}, h2[] = {53};
    kvt_event_t e = test_stored(h, 2, f->tok, 4);
    e.lora_name = "adapter-a";
    assert_int_equal(apply_flags(f, "D", NULL, &e, 1, KVT_EV_STRICT | dyn, &c), KVT_OK);
    kvt_event_t e2 = test_stored(h2, 1, f->tok + 8, 4);
    e2.has_parent = true;
    e2.parent = 52;
    assert_int_equal(apply_flags(f, "D", "adapter-a", &e2, 1, dyn, &c), KVT_OK); /* batch LoRA */
    assert_int_equal(c.orphans, 0);
    assert_int_equal(matched_ns(f, "adapter-a", "D", dk, 3), 3);
    assert_int_equal(matched_ns(f, "adapter-a", "D", std_keys, 3), 0);
    assert_int_equal(matched_ns(f, "adapter-a", "D", dk_b, 3), 0);
    assert_int_equal(matched_ns(f, NULL, "D", dk, 3), 0); /* namespaces stay apart */
    uint32_t ns_a, pd;
    uint64_t k;
    assert_int_equal(kvt_idx_ns_get(f->idx, "m", "adapter-a", 0, &ns_a), KVT_OK);
    assert_int_equal(kvt_idx_pod_find(f->idx, "D", 0, &pd), KVT_OK);
    assert_int_equal(kvt_idx_pod_key(f->idx, pd, ns_a, 53, &k), KVT_OK);
    assert_true(k == dk[2]);

    /* without the flag: the standard's keys in the LoRA's namespace */
    kvt_event_t n = test_stored(h, 2, f->tok, 4);
    assert_int_equal(apply_flags(f, "N", "adapter-a", &n, 1, KVT_EV_STRICT, &c), KVT_OK);
    assert_int_equal(matched_ns(f, "adapter-a", "N", std_keys, 3), 2);
    assert_int_equal(matched_ns(f, "adapter-a", "N", dk, 3), 0);

    /* the base model ("" or none) under the flag: the standard's keys */
    kvt_event_t base[2] = {test_stored(h, 2, f->tok, 4), test_stored(h2, 1, f->tok + 8, 4)};
    base[1].has_parent = true;
    base[1].parent = 52;
    base[1].lora_name = "";
    assert_int_equal(apply_flags(f, "B", NULL, base, 2, KVT_EV_STRICT | dyn, &c), KVT_OK);
    assert_int_equal(matched_ns(f, NULL, "B", std_keys, 3), 3);

    /* a cache salt with the LoRA: block 0 takes both (kvtier's rule); orphans start over */
    kvt_event_t sa = test_stored(h, 2, f->tok, 4);
    sa.lora_name = "adapter-a";
    sa.cache_salt = "tenant-a";
    sa.cache_salt_len = 8;
    kvt_event_t so = test_stored(h2, 1, f->tok, 4);
    so.lora_name = "adapter-a";
    so.has_parent = true;
    so.parent = 777; /* unknown: chained from block 0, salted */
    so.cache_salt = "tenant-a";
    so.cache_salt_len = 8;
    assert_int_equal(apply_flags(f, "S", NULL, &sa, 1, dyn, &c), KVT_OK);
    assert_int_equal(apply_flags(f, "O", NULL, &so, 1, dyn, &c), KVT_OK);
    assert_int_equal(matched_ns(f, "adapter-a", "S", dk_salt, 3), 2);
    assert_int_equal(matched_ns(f, "adapter-a", "S", dk, 3), 0);
    assert_int_equal(matched_ns(f, "adapter-a", "O", dk_salt, 3), 1);

    /* extra keys xor into the LoRA's seed: block 1's key, and its child's through the chain */
    uint64_t seeds[2] = {0, 0xabcdefull}, dk_x[3];
    kvt_event_t x = test_stored(h, 2, f->tok, 4);
    x.lora_name = "adapter-b";
    x.extra_seeds = seeds;
    kvt_event_t x2 = test_stored(h2, 1, f->tok + 8, 4);
    x2.lora_name = "adapter-b";
    x2.has_parent = true;
    x2.parent = 52;
    kvt_event_t xx[2] = {x, x2};
    assert_int_equal(apply_flags(f, "X", NULL, xx, 2, dyn, &c), KVT_OK);
    dynamo_keys(f, 3, "adapter-b", "", 1, 0xabcdefull, dk_x);
    assert_int_equal(matched_ns(f, "adapter-b", "X", dk_b, 3), 1);
    assert_int_equal(matched_ns(f, "adapter-b", "X", dk_x, 3), 3);

    /* an event longer than the apply chunk stays one Dynamo chain */
    enum { NB = 300 };
    static uint32_t tok[NB * 2];
    static uint64_t hl[NB], keys[NB];
    kvt_event_t l = long_stored(tok, hl, NB, 9000);
    l.lora_name = "adapter-a";
    kvt_evbatch_t lb = {.pod = "L", .model = "long", .ev = &l, .nev = 1};
    char err[200];
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &lb, 2, dyn, &c, err, sizeof(err)), KVT_OK);
    kvt_hash_seeds_t sd;
    kvt_hash_seeds_lora(NULL, 0, "adapter-a", 9, &sd);
    assert_int_equal(kvt_hash_seq_seeds(tok, NB * 2, 2, &sd, NULL, NULL, keys), NB);
    uint32_t ns, p;
    assert_int_equal(kvt_idx_ns_get(f->idx, "long", "adapter-a", 0, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_find(f->idx, "L", 0, &p), KVT_OK);
    const kvt_idx_match_t *res;
    size_t nres;
    assert_int_equal(kvt_idx_query(f->rd, ns, keys, NB, NULL, 0, &res, &nres), KVT_OK);
    assert_int_equal(nres, 1);
    assert_int_equal(res[0].matched, NB);
}

/*
 * A store the budget has no room for says so: its blocks that did not fit are
 * counted as dropped (and in the index's stats), and the event is not applied.
 */
static void test_dropped_blocks(void **state)
{
    (void)state;
    enum { NB = 6000 }; /* more than one chunk of nodes (4096) */
    static uint32_t tok[4 * NB];
    static uint64_t h[NB];
    for (uint32_t i = 0; i < NB; i++)
        h[i] = 900 + i;
    for (uint32_t i = 0; i < 4 * NB; i++)
        tok[i] = i;
    kvt_event_t one = test_stored(h, 1, tok, 4), many = test_stored(h + 1, NB - 1, tok + 4, 4);
    many.has_parent = true;
    many.parent = h[0];
    kvt_evbatch_t b1 = {.pod = "D", .model = "m", .ev = &one, .nev = 1};
    kvt_evbatch_t b2 = {.pod = "D", .model = "m", .ev = &many, .nev = 1};
    char err[200];
    /* what one block costs with the pod and namespace registered, unbounded */
    kvt_idx_t *idx;
    assert_int_equal(kvt_idx_create(NULL, &idx), KVT_OK);
    kvt_ev_counters_t c = {0};
    assert_int_equal(kvt_ev_apply(idx, NULL, &b1, 4, KVT_EV_STRICT, &c, err, sizeof(err)), KVT_OK);
    kvt_idx_stats_t s;
    kvt_idx_stats(idx, &s);
    kvt_idx_destroy(idx);
    /*
     * a budget with room for that and some KiB more (the index also keeps its
     * key table's size free, to rebuild it): the long chain cannot fit
     */
    kvt_idx_config_t cfg = {.budget_bytes = s.bytes + 16384};
    assert_int_equal(kvt_idx_create(&cfg, &idx), KVT_OK);
    memset(&c, 0, sizeof(c));
    assert_int_equal(kvt_ev_apply(idx, NULL, &b1, 4, KVT_EV_STRICT, &c, err, sizeof(err)), KVT_OK);
    assert_true(c.events == 1 && c.dropped == 0);
    assert_int_equal(kvt_ev_apply(idx, NULL, &b2, 4, KVT_EV_STRICT, &c, err, sizeof(err)), KVT_OK);
    kvt_idx_stats(idx, &s);
    assert_true(c.dropped > 0 && c.dropped == s.dropped);
    assert_int_equal(c.events, 1); /* the long store is not counted as applied */
    assert_int_equal(c.blocks + c.dropped, NB);
    kvt_idx_destroy(idx);
}

/*
 * vLLM under memory pressure: a block leaves HBM (BlockRemoved GPU) in the
 * same batch as, or a batch before, the token-less CPU store its offloading
 * connector emits. The store still resolves, to the same key and chain.
 */
static void test_cpu_store_after_gpu_removal(void **state)
{
    fix_t *f = *state;
    kvt_ev_counters_t c = {0};
    uint64_t h[] = {71, 72, 73};
    kvt_event_t st = test_stored(h, 3, f->tok, 4);
    assert_int_equal(apply_stream(f, "V", &st, 1, &c), KVT_OK);
    /* the same batch: 72 and 73 leave the GPU, then come back as CPU placeholders */
    kvt_event_t rm = {
        .type = KVT_EV_REMOVED, .tier = KVT_TIER_GPU, .nhashes = 2, .hashes = h + 1, .group = -1};
    kvt_event_t cpu = test_stored(h + 1, 2, NULL, 0);
    cpu.tier = KVT_TIER_CPU;
    kvt_event_t same[2] = {rm, cpu};
    assert_int_equal(apply_stream(f, "V", same, 2, &c), KVT_OK);
    assert_int_equal(c.recovered, 2);
    assert_int_equal(c.unresolved, 0);
    uint32_t g = 0, cp = 0;
    assert_int_equal(matched(f, "V", 12, &g, &cp), 3);
    assert_true(g == 1 && cp == 2);
    /* a batch later: 71 goes, and its CPU store follows in the next batch */
    rm.hashes = h;
    rm.nhashes = 1;
    assert_int_equal(apply_stream(f, "V", &rm, 1, &c), KVT_OK);
    assert_int_equal(matched(f, "V", 12, &g, &cp), 0); /* block 0 gone: no prefix */
    cpu.hashes = h;
    cpu.nhashes = 1;
    assert_int_equal(apply_stream(f, "V", &cpu, 1, &c), KVT_OK);
    assert_int_equal(c.recovered, 3);
    assert_int_equal(matched(f, "V", 12, &g, &cp), 3);
    assert_true(g == 0 && cp == 3);
    /* what the pod still knows needs no recovery; a hash never seen stays unresolved */
    uint64_t more[] = {71, 999};
    kvt_event_t disk = test_stored(more, 2, NULL, 0);
    disk.tier = KVT_TIER_DISK;
    assert_int_equal(apply_stream(f, "V", &disk, 1, &c), KVT_OK);
    assert_int_equal(c.unresolved, 1);
    /* after the pod's state is dropped its mappings are forgotten */
    kvt_event_t all = {
        .type = KVT_EV_REMOVED, .tier = KVT_TIER_ALL, .nhashes = 3, .hashes = h, .group = -1};
    assert_int_equal(apply_stream(f, "V", &all, 1, &c), KVT_OK);
    assert_true(kvt_ev_drop_state(f->idx, f->ctx, "V", 0));
    cpu.hashes = h;
    cpu.nhashes = 3;
    uint64_t unresolved = c.unresolved;
    assert_int_equal(apply_stream(f, "V", &cpu, 1, &c), KVT_OK);
    assert_int_equal(c.unresolved, unresolved + 3);
    assert_int_equal(matched(f, "V", 12, NULL, NULL), 0);
    /* without a context nothing is remembered */
    kvt_event_t st2 = test_stored(h, 3, f->tok, 4);
    kvt_event_t again[3] = {st2, rm, cpu};
    again[2].nhashes = 1;
    kvt_evbatch_t b = {.pod = "W", .model = "m", .ev = again, .nev = 3};
    char err[200];
    kvt_ev_counters_t c2 = {0};
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &b, 4, 0, &c2, err, sizeof(err)), KVT_OK);
    assert_true(c2.unresolved == 1 && c2.recovered == 0);
    kvt_ev_ctx_stats_t cs;
    kvt_ev_ctx_stats(f->ctx, &cs);
    /* 71's DISK store resolved through its mapping too (it is looked up first) */
    assert_true(cs.removed_hits == c.recovered && c.recovered == 4);
    assert_true(cs.removed_entries >= 3);
}

/*
 * The context cannot grow for a pod (no memory): the stream's batch fails and
 * the pod's state is dropped, as for any hard error without KVT_EV_STRICT;
 * with it, nothing is applied and the state stays.
 */
static void test_ctx_out_of_memory(void **state)
{
    fix_t *f = *state;
    kvt_ev_counters_t c = {0};
    uint64_t h[] = {81, 82}, h2[] = {83};
    kvt_event_t e = test_stored(h, 2, f->tok, 4);
    assert_int_equal(apply(f, "Q", &e, 1, &c), KVT_OK); /* no context: nothing allocated */
    assert_int_equal(matched(f, "Q", 8, NULL, NULL), 2);
    kvt_ev_ctx_t *ctx;
    assert_int_equal(kvt_ev_ctx_create(1 << 20, &ctx), KVT_OK);
    kvt_event_t more = test_stored(h2, 1, f->tok + 8, 4);
    more.has_parent = true;
    more.parent = 82;
    kvt_evbatch_t b = {.pod = "Q", .model = "m", .ev = &more, .nev = 1};
    char err[200];
    unsigned long failed = fail_alloc_failed;
    fail_alloc_at(1); /* the context's per-pod arrays: the first allocation the apply makes */
    assert_int_equal(kvt_ev_apply(f->idx, ctx, &b, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_ERR_NO_MEM);
    assert_int_equal(fail_alloc_failed, failed + 1);
    assert_non_null(strstr(err, "pod 'Q'"));
    assert_true(c.events == 1 && c.state_drops == 0);
    assert_int_equal(matched(f, "Q", 12, NULL, NULL), 2);
    fail_alloc_at(1);
    assert_int_equal(kvt_ev_apply(f->idx, ctx, &b, 4, 0, &c, err, sizeof(err)), KVT_ERR_NO_MEM);
    assert_int_equal(fail_alloc_failed, failed + 2);
    assert_true(c.events == 1 && c.state_drops == 1);
    assert_int_equal(matched(f, "Q", 12, NULL, NULL), 0);
    uint32_t p;
    assert_int_equal(kvt_idx_pod_find(f->idx, "Q", 0, &p), KVT_OK);
    assert_int_equal(kvt_idx_pod_entries(f->idx, p), 0);
    /* memory again: the stream goes on */
    assert_int_equal(kvt_ev_apply(f->idx, ctx, &b, 4, 0, &c, err, sizeof(err)), KVT_OK);
    assert_true(c.events == 2 && c.orphans == 1);
    kvt_ev_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_store_parent_remove_clear, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_batches_change_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pod_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_event, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kv_cache_groups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_events_and_skips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_salt_and_extra_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lora_dynamo_keys, setup, teardown),
        cmocka_unit_test(test_dropped_blocks),
        cmocka_unit_test_setup_teardown(test_cpu_store_after_gpu_removal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lora_namespaces_in_one_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ctx_out_of_memory, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
