/*
 * One writer, several readers, no lock between them. The writer churns many
 * pods (stores, removals, clears, drops, speculative marks, table and set
 * growth, evictions under a budget); readers query all the while. A stable
 * chain held by pod "stable" is never touched by the writer: every reader
 * must always see it whole. Every answer must be well formed. A third run
 * drops namespaces and reuses their slots while readers query with stale
 * ids. Run under ASan here; the TSan build in `make test` runs it too.
 */
#include <pthread.h>
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

enum { READERS = 3, STABLE_LEN = 48, CHURN_PODS = 40, CHAINS = 400, LEN = 24 };

typedef struct shared {
    kvt_idx_t *idx;
    uint32_t ns;
    uint32_t stable_pod;
    uint64_t stable[STABLE_LEN];
    int done;
    int strict; /* no budget: the stable chain can never be evicted */
    uint64_t queries[READERS];
    uint64_t bad[READERS];
} shared_t;

typedef struct rarg {
    shared_t *sh;
    int id;
} rarg_t;

static uint64_t key_of(uint64_t chain, uint64_t i)
{
    return (chain * 0x100000001b3ull) ^ (i * 0x9e3779b97f4a7c15ull) ^ 77;
}

static void *reader_main(void *p)
{
    rarg_t *a = p;
    shared_t *sh = a->sh;
    kvt_idx_reader_t *r;
    if (kvt_idx_reader_create(sh->idx, &r) != KVT_OK) {
        sh->bad[a->id]++;
        return NULL;
    }
    uint64_t rng = (uint64_t)a->id * 1234567 + 1, keys[LEN + STABLE_LEN];
    while (!__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE)) {
        const kvt_idx_match_t *res;
        size_t nres;
        /* the stable chain, extended by a churned chain's keys that never match */
        memcpy(keys, sh->stable, sizeof(sh->stable));
        for (int i = 0; i < LEN; i++)
            keys[STABLE_LEN + i] = key_of(rng % CHAINS, (uint64_t)i);
        if (kvt_idx_query(r, sh->ns, keys, STABLE_LEN + LEN, NULL, 0, &res, &nres) != KVT_OK) {
            sh->bad[a->id]++;
            break;
        }
        int seen = 0;
        for (size_t i = 0; i < nres; i++) {
            if (res[i].matched != res[i].gpu + res[i].cpu + res[i].disk ||
                res[i].matched > STABLE_LEN + LEN || res[i].matched == 0)
                sh->bad[a->id]++;
            if (res[i].pod == sh->stable_pod) {
                seen++;
                /* under a budget LRU may shorten it, from its tail only */
                if (res[i].gpu != res[i].matched || res[i].matched > STABLE_LEN ||
                    (sh->strict && res[i].matched != STABLE_LEN))
                    sh->bad[a->id]++;
            }
        }
        if (seen > 1 || (sh->strict && seen != 1))
            sh->bad[a->id]++;
        /* a churned chain: whatever it says must be well formed */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t c = (rng >> 33) % CHAINS;
        for (int i = 0; i < LEN; i++)
            keys[i] = key_of(c, (uint64_t)i);
        if (kvt_idx_query(r, sh->ns, keys, LEN, NULL, 0, &res, &nres) != KVT_OK) {
            sh->bad[a->id]++;
            break;
        }
        for (size_t i = 0; i < nres; i++) {
            if (res[i].matched != res[i].gpu + res[i].cpu + res[i].disk || res[i].matched > LEN ||
                res[i].matched == 0 || res[i].pod == sh->stable_pod)
                sh->bad[a->id]++;
            for (size_t j = 0; j < i; j++)
                if (res[j].pod == res[i].pod)
                    sh->bad[a->id]++;
        }
        sh->queries[a->id] += 2;
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
    assert_int_equal(kvt_idx_create(&cfg, &sh.idx), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(sh.idx, "m", NULL, 16, &sh.ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(sh.idx, "stable", 0, &sh.stable_pod), KVT_OK);
    for (int i = 0; i < STABLE_LEN; i++)
        sh.stable[i] = key_of(1u << 30, (uint64_t)i);
    assert_int_equal(kvt_idx_store(sh.idx, sh.ns, sh.stable_pod, KVT_TIER_GPU, NULL, sh.stable,
                                   NULL, STABLE_LEN),
                     KVT_OK);

    pthread_t th[READERS];
    rarg_t args[READERS];
    for (int i = 0; i < READERS; i++) {
        args[i] = (rarg_t){&sh, i};
        assert_int_equal(pthread_create(&th[i], NULL, reader_main, &args[i]), 0);
    }

    uint32_t pods[CHURN_PODS];
    char name[16];
    for (int p = 0; p < CHURN_PODS; p++) {
        snprintf(name, sizeof(name), "c%d", p);
        assert_int_equal(kvt_idx_pod_get(sh.idx, name, 0, &pods[p]), KVT_OK);
    }
    uint64_t rng = 42, keys[LEN], eh[LEN], refused = 0;
    uint64_t t0 = kvt_clock_ns();
    for (uint64_t op = 0; op < ops; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t x = rng >> 20;
        int p = (int)(x % CHURN_PODS);
        uint64_t c = (x >> 8) % CHAINS;
        int n = 1 + (int)((x >> 20) % LEN);
        if (pods[p] == UINT32_MAX) {
            /* refused earlier: under the budget, retired memory readers still hold counts */
            snprintf(name, sizeof(name), "c%d", p);
            kvt_status_t st = kvt_idx_pod_get(sh.idx, name, 0, &pods[p]);
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
            assert_int_equal(kvt_idx_store(sh.idx, sh.ns, pods[p], tier, NULL, keys, eh, (size_t)n),
                             KVT_OK);
            break;
        case 7:
        case 8:
        case 9:
        case 10:
            assert_int_equal(kvt_idx_remove(sh.idx, pods[p], KVT_TIER_ALL, eh + n / 2,
                                            (size_t)(n - n / 2), NULL),
                             KVT_OK);
            break;
        case 11:
            assert_int_equal(kvt_idx_speculate(sh.idx, sh.ns, pods[p], keys, (size_t)n, 3), KVT_OK);
            break;
        case 12: assert_int_equal(kvt_idx_pod_clear(sh.idx, pods[p], KVT_TIER_GPU), KVT_OK); break;
        case 13:
            if ((x >> 44) % 16 == 0) {
                /* drop and re-add: ids and holder sets churn */
                snprintf(name, sizeof(name), "c%d", p);
                assert_int_equal(kvt_idx_pod_drop(sh.idx, pods[p]), KVT_OK);
                kvt_status_t st = kvt_idx_pod_get(sh.idx, name, 0, &pods[p]);
                if (st == KVT_ERR_NO_SPACE && budget != 0) {
                    pods[p] = UINT32_MAX;
                    refused++;
                    break;
                }
                assert_int_equal(st, KVT_OK);
            }
            break;
        default: kvt_idx_advance(sh.idx, op / 64 + 1); break;
        }
        if (budget != 0) {
            /* retired memory readers still hold counts, and every growth made room for it */
            kvt_idx_stats_t st;
            kvt_idx_stats(sh.idx, &st);
            if (st.bytes > budget)
                fail_msg("op %llu: %llu bytes > budget %llu", (unsigned long long)op,
                         (unsigned long long)st.bytes, (unsigned long long)budget);
        }
    }
    double secs = (double)(kvt_clock_ns() - t0) / 1e9;
    __atomic_store_n(&sh.done, 1, __ATOMIC_RELEASE);
    uint64_t total = 0, bad = 0;
    for (int i = 0; i < READERS; i++) {
        pthread_join(th[i], NULL);
        total += sh.queries[i];
        bad += sh.bad[i];
    }
    kvt_idx_stats_t st;
    kvt_idx_stats(sh.idx, &st);
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
    kvt_idx_destroy(sh.idx);
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
    kvt_idx_t *idx;
    uint32_t ids[MODELS];              /* current id of each model, NO_NS while dropped; atomic */
    int pod_model[MODELS * MPODS + 1]; /* by pod id */
    uint32_t npods;
    int done;
    uint64_t queries[READERS], hits[READERS], stale[READERS], bad[READERS];
} ns_shared_t;

static uint64_t chain_key(uint64_t c, uint64_t i)
{
    return key_of(c + 5000, i);
}

typedef struct nsarg {
    ns_shared_t *sh;
    int id;
} nsarg_t;

static void *ns_reader_main(void *p)
{
    nsarg_t *a = p;
    ns_shared_t *sh = a->sh;
    kvt_idx_reader_t *r;
    if (kvt_idx_reader_create(sh->idx, &r) != KVT_OK) {
        sh->bad[a->id]++;
        return NULL;
    }
    uint32_t old[OLD_IDS];
    int old_model[OLD_IDS];
    for (int i = 0; i < OLD_IDS; i++)
        old[i] = NO_NS;
    uint64_t rng = (uint64_t)a->id * 7777 + 3, keys[CLEN];
    while (!__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE)) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t x = rng >> 24;
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
            sh->bad[a->id]++;
            break;
        }
        for (size_t i = 0; i < nres; i++) {
            if (res[i].pod >= sh->npods || sh->pod_model[res[i].pod] != m || res[i].matched == 0 ||
                res[i].matched > CLEN || res[i].matched != res[i].gpu + res[i].cpu + res[i].disk)
                sh->bad[a->id]++;
        }
        sh->hits[a->id] += nres > 0;
        sh->queries[a->id]++;
    }
    kvt_idx_reader_destroy(r);
    return NULL;
}

static void test_concurrent_ns_drop(void **state)
{
    (void)state;
    static ns_shared_t sh;
    memset(&sh, 0, sizeof(sh));
    assert_int_equal(kvt_idx_create(NULL, &sh.idx), KVT_OK);
    uint32_t pods[MODELS][MPODS];
    char name[32];
    for (int m = 0; m < MODELS; m++) {
        sh.ids[m] = NO_NS;
        for (int q = 0; q < MPODS; q++) {
            snprintf(name, sizeof(name), "m%d-pod%d", m, q);
            assert_int_equal(kvt_idx_pod_get(sh.idx, name, 0, &pods[m][q]), KVT_OK);
            assert_true(pods[m][q] < MODELS * MPODS);
            sh.pod_model[pods[m][q]] = m;
        }
    }
    sh.npods = MODELS * MPODS;
    pthread_t th[READERS];
    nsarg_t args[READERS];
    for (int i = 0; i < READERS; i++) {
        args[i] = (nsarg_t){&sh, i};
        assert_int_equal(pthread_create(&th[i], NULL, ns_reader_main, &args[i]), 0);
    }
    int slot_model[MODELS + 1]; /* the model that last had each slot */
    for (int i = 0; i <= MODELS; i++)
        slot_model[i] = -1;
    uint64_t ops = ops_from_env() / 4, rng = 99, keys[CLEN], eh[CLEN];
    uint64_t drops = 0, reuses = 0;
    for (uint64_t op = 0; op < ops; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t x = rng >> 20;
        int m = (int)(x % MODELS);
        uint32_t id = sh.ids[m];
        if (id == NO_NS) {
            snprintf(name, sizeof(name), "model-%d", m);
            assert_int_equal(kvt_idx_ns_get(sh.idx, name, NULL, 16, &id), KVT_OK);
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
            assert_int_equal(kvt_idx_ns_drop(sh.idx, id, NULL), KVT_OK);
            __atomic_store_n(&sh.ids[m], NO_NS, __ATOMIC_RELEASE);
            drops++;
            break;
        case 1:
        case 2:
            assert_int_equal(
                kvt_idx_remove(sh.idx, pod, KVT_TIER_ALL, eh + CLEN / 2, CLEN - CLEN / 2, NULL),
                KVT_OK);
            break;
        case 3: assert_int_equal(kvt_idx_speculate(sh.idx, id, pod, keys, CLEN, 5), KVT_OK); break;
        case 4: kvt_idx_advance(sh.idx, op / 32 + 1); break;
        default:
            assert_int_equal(
                kvt_idx_store(sh.idx, id, pod, 1u << ((x >> 24) % 3), NULL, keys, eh, CLEN),
                KVT_OK);
            break;
        }
    }
    __atomic_store_n(&sh.done, 1, __ATOMIC_RELEASE);
    uint64_t total = 0, hits = 0, stale = 0, bad = 0;
    for (int i = 0; i < READERS; i++) {
        pthread_join(th[i], NULL);
        total += sh.queries[i];
        hits += sh.hits[i];
        stale += sh.stale[i];
        bad += sh.bad[i];
    }
    print_message("%llu writer ops, %llu namespace drops, %llu slots reused by another model; "
                  "%llu queries (%llu with a stale id, %llu answered)\n",
                  (unsigned long long)ops, (unsigned long long)drops, (unsigned long long)reuses,
                  (unsigned long long)total, (unsigned long long)stale, (unsigned long long)hits);
    assert_int_equal(bad, 0);
    assert_true(drops > 50 && reuses > 10);
    assert_true(total > 0 && hits > 0 && stale > 0);
    kvt_idx_destroy(sh.idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_unbounded),
        cmocka_unit_test(test_concurrent_budget),
        cmocka_unit_test(test_concurrent_ns_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
