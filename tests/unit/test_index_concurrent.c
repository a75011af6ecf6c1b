/*
 * One writer, several readers, no lock between them. The writer churns many
 * pods (stores, removals, clears, drops, speculative marks, table and set
 * growth, evictions under a budget); readers query all the while. A stable
 * chain held by pod "stable" is never touched by the writer: every reader
 * must always see it whole. Every answer must be well formed. A third run
 * drops namespaces and reuses their slots while readers query with stale
 * ids. A fourth fills past a node slab, hundreds of namespaces and holder
 * sets, then drops them so the trims truncate the published directories,
 * again and again, while readers query. The TSan preset runs it too.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/clock.h"
#include "kvindex/index.h"
#include "kvindex/index_test.h" /* white box: directory sizes (the trim run) */
#include "tests/support/rng.h"

enum { READERS = 3, STABLE_LEN = 48, CHURN_PODS = 40, CHAINS = 400, LEN = 24 };

/* What every run shares with its reader threads (first in each run's shared state). */
typedef struct run_base {
    kvt_idx_t *idx;
    int done;
    uint64_t queries[READERS];
    uint64_t bad[READERS]; /* wrong or malformed answers */
} run_base_t;

typedef struct rarg {
    void *sh; /* the run's shared state, which starts with a run_base_t */
    int id;
} rarg_t;

typedef struct readers {
    pthread_t th[READERS];
    rarg_t args[READERS];
} readers_t;

static void readers_start(readers_t *rd, void *sh, void *(*fn)(void *))
{
    for (int i = 0; i < READERS; i++) {
        rd->args[i] = (rarg_t){sh, i};
        assert_int_equal(pthread_create(&rd->th[i], NULL, fn, &rd->args[i]), 0);
    }
}

/* Stops and joins the readers; their queries and bad answers, summed. */
static void readers_stop(readers_t *rd, run_base_t *b, uint64_t *total_p, uint64_t *bad_p)
{
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    *total_p = *bad_p = 0;
    for (int i = 0; i < READERS; i++) {
        pthread_join(rd->th[i], NULL);
        *total_p += b->queries[i];
        *bad_p += b->bad[i];
    }
}

/* A reader thread's handle, or NULL (counted as a bad answer). */
static kvt_idx_reader_t *reader_open(run_base_t *b, int id)
{
    kvt_idx_reader_t *r;
    if (kvt_idx_reader_create(b->idx, &r) != KVT_OK) {
        b->bad[id]++;
        return NULL;
    }
    return r;
}

static uint64_t key_of(uint64_t chain, uint64_t i)
{
    return (chain * 0x100000001b3ull) ^ (i * 0x9e3779b97f4a7c15ull) ^ 77;
}

/* Namespace "m", and pod "stable" holding the chain @stable in it (GPU): what readers rely on. */
static void stable_setup(kvt_idx_t *idx, uint32_t *ns_p, uint32_t *pod_p, uint64_t *stable)
{
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, ns_p), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "stable", 0, pod_p), KVT_OK);
    for (int i = 0; i < STABLE_LEN; i++)
        stable[i] = key_of(1u << 30, (uint64_t)i);
    assert_int_equal(
        kvt_idx_store(idx, *ns_p, *pod_p, KVT_TIER_GPU, NULL, stable, NULL, STABLE_LEN), KVT_OK);
}

/*
 * Bad answers to a query of the stable chain followed by keys no pod holds
 * after it: the stable pod alone, the whole chain in GPU; unless @strict
 * (a budget) LRU may have cut it from its tail, or taken all of it.
 */
static uint64_t stable_bad(const kvt_idx_match_t *res, size_t nres, uint32_t stable_pod,
                           bool strict)
{
    if (nres == 0)
        return strict;
    const kvt_idx_match_t *m = &res[0];
    return nres > 1 || m->pod != stable_pod || m->matched == 0 || m->matched > STABLE_LEN ||
           m->gpu != m->matched || m->cpu != 0 || m->disk != 0 ||
           (strict && m->matched != STABLE_LEN);
}

/* Bad answers to a query of a churned chain of @len keys: malformed, doubled, or the stable pod. */
static uint64_t churn_bad(const kvt_idx_match_t *res, size_t nres, uint32_t len,
                          uint32_t stable_pod)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < nres; i++) {
        bad += res[i].matched == 0 || res[i].matched > len ||
               res[i].matched != res[i].gpu + res[i].cpu + res[i].disk || res[i].pod == stable_pod;
        for (size_t j = 0; j < i; j++)
            bad += res[j].pod == res[i].pod;
    }
    return bad;
}

/* The churn run: many pods store, remove, clear, drop, speculate; a budget evicts. */
typedef struct shared {
    run_base_t b;
    uint32_t ns;
    uint32_t stable_pod;
    uint64_t stable[STABLE_LEN];
    int strict; /* no budget: the stable chain can never be evicted */
} shared_t;

static void *reader_main(void *p)
{
    rarg_t *a = p;
    shared_t *sh = a->sh;
    kvt_idx_reader_t *r = reader_open(&sh->b, a->id);
    if (r == NULL)
        return NULL;
    kvt_rng_t rng;
    kvt_rng_init(&rng, (uint64_t)a->id * 1234567 + 1);
    uint64_t keys[LEN + STABLE_LEN];
    while (!__atomic_load_n(&sh->b.done, __ATOMIC_ACQUIRE)) {
        const kvt_idx_match_t *res;
        size_t nres;
        /* the stable chain, extended by a churned chain's keys that never match */
        memcpy(keys, sh->stable, sizeof(sh->stable));
        const uint64_t tail = kvt_rng_below(&rng, CHAINS);
        for (int i = 0; i < LEN; i++)
            keys[STABLE_LEN + i] = key_of(tail, (uint64_t)i);
        if (kvt_idx_query(r, sh->ns, keys, STABLE_LEN + LEN, NULL, 0, &res, &nres) != KVT_OK) {
            sh->b.bad[a->id]++;
            break;
        }
        sh->b.bad[a->id] += stable_bad(res, nres, sh->stable_pod, sh->strict);
        /* a churned chain: whatever it says must be well formed */
        uint64_t c = kvt_rng_below(&rng, CHAINS);
        for (int i = 0; i < LEN; i++)
            keys[i] = key_of(c, (uint64_t)i);
        if (kvt_idx_query(r, sh->ns, keys, LEN, NULL, 0, &res, &nres) != KVT_OK) {
            sh->b.bad[a->id]++;
            break;
        }
        sh->b.bad[a->id] += churn_bad(res, nres, LEN, sh->stable_pod);
        sh->b.queries[a->id] += 2;
    }
    kvt_idx_reader_destroy(r);
    return NULL;
}

static void run(uint64_t budget, uint64_t ops)
{
    static shared_t sh;
    memset(&sh, 0, sizeof(sh));
    sh.strict = budget == 0;
    kvt_idx_config_t cfg = {.budget_bytes = budget};
    assert_int_equal(kvt_idx_create(&cfg, &sh.b.idx), KVT_OK);
    kvt_idx_t *idx = sh.b.idx;
    stable_setup(idx, &sh.ns, &sh.stable_pod, sh.stable);
    readers_t rd;
    readers_start(&rd, &sh, reader_main);

    uint32_t pods[CHURN_PODS];
    char name[16];
    for (int p = 0; p < CHURN_PODS; p++) {
        snprintf(name, sizeof(name), "c%d", p);
        assert_int_equal(kvt_idx_pod_get(idx, name, 0, &pods[p]), KVT_OK);
    }
    kvt_rng_t rng;
    kvt_rng_init(&rng, 42);
    uint64_t keys[LEN], eh[LEN], refused = 0;
    uint64_t t0 = kvt_clock_ns();
    for (uint64_t op = 0; op < ops; op++) {
        uint64_t x = kvt_rng_next(&rng) >> 20;
        int p = (int)(x % CHURN_PODS);
        uint64_t c = (x >> 8) % CHAINS;
        int n = 1 + (int)((x >> 20) % LEN);
        if (pods[p] == UINT32_MAX) {
            /* refused earlier: under the budget, retired memory readers still hold counts */
            snprintf(name, sizeof(name), "c%d", p);
            kvt_status_t st = kvt_idx_pod_get(idx, name, 0, &pods[p]);
            if (st == KVT_ERR_NO_SPACE && budget != 0) {
                pods[p] = UINT32_MAX;
                refused++;
                continue;
            }
            assert_int_equal(st, KVT_OK);
        }
        for (int i = 0; i < n; i++) {
            keys[i] = key_of(c, (uint64_t)i);
            eh[i] = keys[i] ^ ((x >> 40) % 4 == 0 ? (uint64_t)p << 50 : 0);
        }
        unsigned tier = 1u << ((x >> 30) % 3);
        switch ((x >> 32) % 16) {
        case 0:
        case 1:
        case 2:
        case 3:
        case 4:
        case 5:
        case 6:
            assert_int_equal(kvt_idx_store(idx, sh.ns, pods[p], tier, NULL, keys, eh, (size_t)n),
                             KVT_OK);
            break;
        case 7:
        case 8:
        case 9:
        case 10:
            assert_int_equal(
                kvt_idx_remove(idx, pods[p], KVT_TIER_ALL, eh + n / 2, (size_t)(n - n / 2), NULL),
                KVT_OK);
            break;
        case 11:
            assert_int_equal(kvt_idx_speculate(idx, sh.ns, pods[p], keys, (size_t)n, 3), KVT_OK);
            break;
        case 12: assert_int_equal(kvt_idx_pod_clear(idx, pods[p], KVT_TIER_GPU), KVT_OK); break;
        case 13: {
            /* drop and re-add: ids and holder sets churn */
            snprintf(name, sizeof(name), "c%d", p);
            assert_int_equal(kvt_idx_pod_drop(idx, pods[p]), KVT_OK);
            kvt_status_t st = kvt_idx_pod_get(idx, name, 0, &pods[p]);
            if (st == KVT_ERR_NO_SPACE && budget != 0) {
                pods[p] = UINT32_MAX;
                refused++;
                break;
            }
            assert_int_equal(st, KVT_OK);
            break;
        }
        default: kvt_idx_advance(idx, op / 64 + 1); break;
        }
        if (budget != 0) {
            /* retired memory readers still hold counts, and every growth made room for it */
            kvt_idx_stats_t st;
            kvt_idx_stats(idx, &st);
            if (st.bytes > budget)
                fail_msg("op %llu: %llu bytes > budget %llu", (unsigned long long)op,
                         (unsigned long long)st.bytes, (unsigned long long)budget);
        }
    }
    double secs = (double)(kvt_clock_ns() - t0) / 1e9;
    uint64_t total, bad;
    readers_stop(&rd, &sh.b, &total, &bad);
    kvt_idx_stats_t st;
    kvt_idx_stats(idx, &st);
    print_message("%llu writer ops in %.2f s with %llu concurrent queries; %llu evicted, "
                  "%llu entries, %llu pod registrations refused\n",
                  (unsigned long long)ops, secs, (unsigned long long)total,
                  (unsigned long long)st.evicted, (unsigned long long)st.entries,
                  (unsigned long long)refused);
    assert_int_equal(st.refused, refused);
    assert_int_equal(bad, 0);
    assert_true(total > 0);
    if (budget != 0)
        assert_true(st.evicted > 0); /* else the budget run proved nothing about eviction */
    kvt_idx_destroy(idx);
}

static uint64_t ops_from_env(void)
{
    const char *v = getenv("KVT_CONCURRENT_OPS");
    return v ? strtoull(v, NULL, 0) : 60000;
}

static void test_concurrent_unbounded(void **state)
{
    (void)state;
    run(0, ops_from_env());
}

static void test_concurrent_budget(void **state)
{
    (void)state;
    /* evictions run while readers query: answers must stay well formed */
    run(300 * 1024, ops_from_env());
}

/*
 * Namespaces dropped and their slots reused while readers query. Every model
 * stores the same chains (equal prompts give equal sequence keys in every
 * model), each on its own pods, so a reader knows which pods a model's
 * blocks may be on. Readers query with the current id of a model and with
 * ids they saw earlier (stale once the model was dropped, their slot
 * perhaps another model's now): an answer naming a pod of another model is
 * a block of another namespace.
 */
enum { MODELS = 4, MPODS = 2, NCHAINS = 48, CLEN = 12, OLD_IDS = 8 };
#define NO_NS UINT32_MAX

typedef struct ns_shared {
    run_base_t b;
    uint32_t ids[MODELS];              /* current id of each model, NO_NS while dropped; atomic */
    int pod_model[MODELS * MPODS + 1]; /* by pod id */
    uint32_t npods;
    uint64_t hits[READERS], stale[READERS];
} ns_shared_t;

static uint64_t chain_key(uint64_t c, uint64_t i)
{
    return key_of(c + 5000, i);
}

static void *ns_reader_main(void *p)
{
    rarg_t *a = p;
    ns_shared_t *sh = a->sh;
    kvt_idx_reader_t *r = reader_open(&sh->b, a->id);
    if (r == NULL)
        return NULL;
    uint32_t old[OLD_IDS];
    int old_model[OLD_IDS];
    for (int i = 0; i < OLD_IDS; i++)
        old[i] = NO_NS;
    kvt_rng_t rng;
    kvt_rng_init(&rng, (uint64_t)a->id * 7777 + 3);
    uint64_t keys[CLEN];
    while (!__atomic_load_n(&sh->b.done, __ATOMIC_ACQUIRE)) {
        uint64_t x = kvt_rng_next(&rng) >> 24;
        int m = (int)(x % MODELS);
        uint32_t id = __atomic_load_n(&sh->ids[m], __ATOMIC_ACQUIRE);
        int slot = (int)((x >> 8) % OLD_IDS);
        bool use_old = (x >> 12) % 2 == 0 && old[slot] != NO_NS;
        if (use_old) {
            /* an id seen earlier: the model may have been dropped, its slot reused */
            id = old[slot];
            m = old_model[slot];
            sh->stale[a->id] += __atomic_load_n(&sh->ids[m], __ATOMIC_ACQUIRE) != id;
        } else if (id != NO_NS) {
            old[slot] = id;
            old_model[slot] = m;
        } else {
            continue;
        }
        uint64_t c = (x >> 16) % NCHAINS;
        for (int i = 0; i < CLEN; i++)
            keys[i] = chain_key(c, (uint64_t)i);
        const kvt_idx_match_t *res;
        size_t nres;
        if (kvt_idx_query(r, id, keys, CLEN, NULL, 0, &res, &nres) != KVT_OK) {
            sh->b.bad[a->id]++;
            break;
        }
        for (size_t i = 0; i < nres; i++) {
            if (res[i].pod >= sh->npods || sh->pod_model[res[i].pod] != m || res[i].matched == 0 ||
                res[i].matched > CLEN || res[i].matched != res[i].gpu + res[i].cpu + res[i].disk)
                sh->b.bad[a->id]++;
        }
        sh->hits[a->id] += nres > 0;
        sh->b.queries[a->id]++;
    }
    kvt_idx_reader_destroy(r);
    return NULL;
}

static void test_concurrent_ns_drop(void **state)
{
    (void)state;
    static ns_shared_t sh;
    memset(&sh, 0, sizeof(sh));
    assert_int_equal(kvt_idx_create(NULL, &sh.b.idx), KVT_OK);
    uint32_t pods[MODELS][MPODS];
    char name[32];
    for (int m = 0; m < MODELS; m++) {
        sh.ids[m] = NO_NS;
        for (int q = 0; q < MPODS; q++) {
            snprintf(name, sizeof(name), "m%d-pod%d", m, q);
            assert_int_equal(kvt_idx_pod_get(sh.b.idx, name, 0, &pods[m][q]), KVT_OK);
            assert_true(pods[m][q] < MODELS * MPODS);
            sh.pod_model[pods[m][q]] = m;
        }
    }
    sh.npods = MODELS * MPODS;
    readers_t rd;
    readers_start(&rd, &sh, ns_reader_main);
    int slot_model[MODELS + 1]; /* the model that last had each slot */
    for (int i = 0; i <= MODELS; i++)
        slot_model[i] = -1;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 99);
    uint64_t ops = ops_from_env() / 4, keys[CLEN], eh[CLEN];
    uint64_t drops = 0, reuses = 0;
    for (uint64_t op = 0; op < ops; op++) {
        uint64_t x = kvt_rng_next(&rng) >> 20;
        int m = (int)(x % MODELS);
        uint32_t id = sh.ids[m];
        if (id == NO_NS) {
            snprintf(name, sizeof(name), "model-%d", m);
            assert_int_equal(kvt_idx_ns_get(sh.b.idx, name, NULL, 16, &id), KVT_OK);
            uint32_t slot = id & 0xffffu;
            assert_true(slot <= MODELS);
            reuses += slot_model[slot] >= 0 && slot_model[slot] != m;
            slot_model[slot] = m;
            __atomic_store_n(&sh.ids[m], id, __ATOMIC_RELEASE);
        }
        uint32_t pod = pods[m][(x >> 4) % MPODS];
        uint64_t c = (x >> 8) % NCHAINS;
        for (int i = 0; i < CLEN; i++) {
            keys[i] = chain_key(c, (uint64_t)i);
            eh[i] = keys[i] ^ ((uint64_t)m << 56); /* pods' engine hashes differ per model */
        }
        switch ((x >> 16) % 16) {
        case 0:
            /* drop: readers may be using the id right now */
            assert_int_equal(kvt_idx_ns_drop(sh.b.idx, id, NULL), KVT_OK);
            __atomic_store_n(&sh.ids[m], NO_NS, __ATOMIC_RELEASE);
            drops++;
            break;
        case 1:
        case 2:
            assert_int_equal(
                kvt_idx_remove(sh.b.idx, pod, KVT_TIER_ALL, eh + CLEN / 2, CLEN - CLEN / 2, NULL),
                KVT_OK);
            break;
        case 3:
            assert_int_equal(kvt_idx_speculate(sh.b.idx, id, pod, keys, CLEN, 5), KVT_OK);
            break;
        case 4: kvt_idx_advance(sh.b.idx, op / 32 + 1); break;
        default:
            assert_int_equal(
                kvt_idx_store(sh.b.idx, id, pod, 1u << ((x >> 24) % 3), NULL, keys, eh, CLEN),
                KVT_OK);
            break;
        }
    }
    uint64_t total, bad, hits = 0, stale = 0;
    readers_stop(&rd, &sh.b, &total, &bad);
    for (int i = 0; i < READERS; i++) {
        hits += sh.hits[i];
        stale += sh.stale[i];
    }
    print_message("%llu writer ops, %llu namespace drops, %llu slots reused by another model; "
                  "%llu queries (%llu with a stale id, %llu answered)\n",
                  (unsigned long long)ops, (unsigned long long)drops, (unsigned long long)reuses,
                  (unsigned long long)total, (unsigned long long)stale, (unsigned long long)hits);
    assert_int_equal(bad, 0);
    assert_true(drops > 50 && reuses > 10);
    assert_true(total > 0 && hits > 0 && stale > 0);
    kvt_idx_destroy(sh.b.idx);
}

/*
 * Directories truncated while readers query. Each round fills the node slab
 * well past its first 2 MiB (65,536 nodes), holder sets (chains two pods
 * share) and a second chunk of namespace slots, then drops the pods and the
 * namespaces: nodes_trim(), sets_trim() and kvt_idx_ns_trim() publish shorter
 * directories and retire what they cut (checked each round, white box).
 * Readers query the stable chain, which lives in the first slab and must
 * always match whole on its pod alone; churned chains, whose answers must be
 * well formed and never name the stable pod; and the namespaces' ids,
 * current or stale, possibly in a chunk given back, which hold nothing.
 */
enum { TRIM_NS = 260, TRIM_PODS = 4, TRIM_LEN = 40, TRIM_CHAINS = 2600 };

typedef struct trim_shared {
    run_base_t b;
    uint32_t ns, stable_pod;
    uint64_t stable[STABLE_LEN];
    uint32_t ns_ids[TRIM_NS]; /* ids of the extra namespaces, current or stale; atomic */
    uint32_t nchains;         /* chains stored each round (TRIM_CHAINS, fewer under TSan) */
} trim_shared_t;

static uint64_t trim_key(uint64_t chain, uint64_t i)
{
    return key_of(chain + 100000, i);
}

static void *trim_reader_main(void *p)
{
    rarg_t *a = p;
    trim_shared_t *sh = a->sh;
    kvt_idx_reader_t *r = reader_open(&sh->b, a->id);
    if (r == NULL)
        return NULL;
    kvt_rng_t rng;
    kvt_rng_init(&rng, (uint64_t)a->id * 4242 + 7);
    uint64_t keys[STABLE_LEN + TRIM_LEN];
    const kvt_idx_match_t *res;
    size_t nres;
    uint64_t *bad = &sh->b.bad[a->id];
    while (!__atomic_load_n(&sh->b.done, __ATOMIC_ACQUIRE)) {
        uint64_t x = kvt_rng_next(&rng) >> 20, c = x % sh->nchains;
        /* the stable chain, then a churned chain's keys: the stable pod alone, whole */
        memcpy(keys, sh->stable, sizeof(sh->stable));
        for (int i = 0; i < TRIM_LEN; i++)
            keys[STABLE_LEN + i] = trim_key(c, (uint64_t)i);
        if (kvt_idx_query(r, sh->ns, keys, STABLE_LEN + TRIM_LEN, NULL, 0, &res, &nres) != KVT_OK)
            (*bad)++;
        *bad += stable_bad(res, nres, sh->stable_pod, true);
        /* a churned chain: well formed, never the stable pod */
        if (kvt_idx_query(r, sh->ns, keys + STABLE_LEN, TRIM_LEN, NULL, 0, &res, &nres) != KVT_OK)
            (*bad)++;
        *bad += churn_bad(res, nres, TRIM_LEN, sh->stable_pod);
        /* an extra namespace's id (current, stale, or in a chunk given back): nothing */
        uint32_t id = __atomic_load_n(&sh->ns_ids[(x >> 12) % TRIM_NS], __ATOMIC_ACQUIRE);
        if (kvt_idx_query(r, id, keys, STABLE_LEN + TRIM_LEN, NULL, 0, &res, &nres) != KVT_OK ||
            nres != 0)
            (*bad)++;
        sh->b.queries[a->id] += 3;
#ifdef KVT_TSAN
        sched_yield(); /* more of the cores to the writer: its fills are long under TSan */
#endif
    }
    kvt_idx_reader_destroy(r);
    return NULL;
}

static void test_concurrent_trim(void **state)
{
    (void)state;
    static trim_shared_t sh;
    memset(&sh, 0, sizeof(sh));
    assert_int_equal(kvt_idx_create(NULL, &sh.b.idx), KVT_OK);
    kvt_idx_t *idx = sh.b.idx;
    stable_setup(idx, &sh.ns, &sh.stable_pod, sh.stable);
    for (int i = 0; i < TRIM_NS; i++)
        sh.ns_ids[i] = KVT_IDX_NS_NONE;
    /* the TSan preset's fewer ops: one round of 66,000 nodes, still past the first slab */
    const bool full = ops_from_env() >= 60000;
    const int rounds = full ? 3 : 1;
    sh.nchains = full ? TRIM_CHAINS : 1650;
    readers_t rd;
    readers_start(&rd, &sh, trim_reader_main);
    char name[32];
    uint64_t keys[TRIM_LEN], now = 1;
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < TRIM_NS; i++) {
            uint32_t id;
            snprintf(name, sizeof(name), "round%d-ns%d", round, i);
            assert_int_equal(kvt_idx_ns_get(idx, name, NULL, 16, &id), KVT_OK);
            __atomic_store_n(&sh.ns_ids[i], id, __ATOMIC_RELEASE);
        }
        uint32_t pods[TRIM_PODS];
        for (int p = 0; p < TRIM_PODS; p++) {
            snprintf(name, sizeof(name), "churn%d", p);
            assert_int_equal(kvt_idx_pod_get(idx, name, 0, &pods[p]), KVT_OK);
        }
        /* chains of 40 blocks (104,000 nodes, 66,000 under TSan); every 8th on two pods: sets */
        for (uint64_t c = 0; c < sh.nchains; c++) {
            for (int i = 0; i < TRIM_LEN; i++)
                keys[i] = trim_key(c, (uint64_t)i);
            uint32_t p = pods[c % TRIM_PODS];
            assert_int_equal(
                kvt_idx_store(idx, sh.ns, p, 1u << (c % 3), NULL, keys, NULL, TRIM_LEN), KVT_OK);
            if (c % 8 == 0)
                assert_int_equal(kvt_idx_store(idx, sh.ns, pods[(c + 1) % TRIM_PODS], KVT_TIER_GPU,
                                               NULL, keys, NULL, TRIM_LEN),
                                 KVT_OK);
            if (c % 256 == 0)
                kvt_idx_advance(idx, now++);
        }
        kvt_idx_test_dirs_t dirs;
        kvt_idx_test_dirs(idx, &dirs);
        assert_true(dirs.nodes > kvt_idx_test_node_slab_chunks());
        assert_true(dirs.sets > 0);
        assert_true(dirs.nss > 1);
        for (int i = 0; i < TRIM_NS; i++)
            assert_int_equal(kvt_idx_ns_drop(idx, sh.ns_ids[i], NULL), KVT_OK);
        for (int p = 0; p < TRIM_PODS; p++)
            assert_int_equal(kvt_idx_pod_drop(idx, pods[p]), KVT_OK);
        /* what is left (the stable chain, namespace "m") fits the first slab and chunk */
        kvt_idx_test_dirs(idx, &dirs);
        assert_int_equal(dirs.nodes, kvt_idx_test_node_slab_chunks());
        assert_int_equal(dirs.sets, 0);
        assert_int_equal(dirs.nss, 1);
        assert_int_equal(kvt_idx_ns_count(idx), 1);
        kvt_idx_advance(idx, now++);
    }
    uint64_t total, bad;
    readers_stop(&rd, &sh.b, &total, &bad);
    print_message("fill and trim, %d round(s), with %llu concurrent queries\n", rounds,
                  (unsigned long long)total);
    assert_int_equal(bad, 0);
    assert_true(total > 0);
    kvt_idx_destroy(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_unbounded),
        cmocka_unit_test(test_concurrent_budget),
        cmocka_unit_test(test_concurrent_ns_drop),
        cmocka_unit_test(test_concurrent_trim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
