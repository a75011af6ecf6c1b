/*
 * kvindex/names.c: the names readers resolve through (index.h, "Names for readers"), against
 * a naive reference under random pod and namespace churn; a read section keeps its snapshot
 * while the writer republishes; and readers on other threads never see a pod under a name
 * it does not have (this also runs under TSan).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/json.h"
#include "kvindex/index.h"
#include "tests/support/rng.h"

#define NNAMES 24
#define NRANKS 3
#define NMODELS 6
#define NLORAS 4

/* Names with every kind of byte JSON escapes. */
static const char *pod_name(int i, char *buf, size_t cap)
{
    static const char *const odd[] = {"q\"uote", "back\\slash", "tab\there", "nl\nx", "é-pod",
                                      "ctl\x01", "slash/x",     "%2F",       "sp ace"};
    if (i < (int)(sizeof(odd) / sizeof(odd[0])))
        snprintf(buf, cap, "%s", odd[i]);
    else
        snprintf(buf, cap, "pod-%d", i);
    return buf;
}

typedef struct ref {
    bool pod[NNAMES][NRANKS];
    uint32_t pod_id[NNAMES][NRANKS];
    bool ns[NMODELS][NLORAS];
    uint32_t ns_id[NMODELS][NLORAS];
    uint32_t ns_bs[NMODELS][NLORAS];
} ref_t;

static kvt_rng_t g_rng; /* the main thread's; started by each test that draws */

static uint32_t below(uint32_t n)
{
    return (uint32_t)kvt_rng_below(&g_rng, n);
}

static void model_name(int m, char *buf, size_t cap)
{
    snprintf(buf, cap, m == 0 ? "org/model-\"%d\"" : "model-%d", m);
}

static const char *lora_name(int l)
{
    static const char *const n[NLORAS] = {"", "ad1", "ad\\2", "ad 3"};
    return n[l];
}

/* Every name the reference holds is found, with its id, and nothing else is. */
static void check(kvt_idx_reader_t *r, const ref_t *ref)
{
    kvt_idx_read_begin(r);
    char buf[64];
    kvt_jbuf_t js;
    kvt_jbuf_init(&js);
    for (int i = 0; i < NNAMES; i++) {
        const char *n = pod_name(i, buf, sizeof(buf));
        uint32_t ids[8];
        size_t got = kvt_idx_pods_named(r, n, strlen(n), ids, 8);
        size_t want = 0;
        for (int k = 0; k < NRANKS; k++)
            want += ref->pod[i][k];
        assert_int_equal(got, want);
        for (size_t j = 0; j < got; j++) {
            kvt_idx_pod_view_t v;
            assert_true(kvt_idx_pod_view(r, ids[j], &v));
            assert_true(v.dp_rank < NRANKS && ref->pod[i][v.dp_rank]);
            assert_int_equal(ids[j], ref->pod_id[i][v.dp_rank]);
            assert_int_equal(v.name_len, strlen(n));
            assert_string_equal(v.name, n);
            kvt_jbuf_reset(&js);
            kvt_jbuf_str(&js, n, strlen(n));
            assert_int_equal(v.json_len, js.len);
            assert_memory_equal(v.json, js.buf, js.len);
        }
    }
    for (int m = 0; m < NMODELS; m++)
        for (int l = 0; l < NLORAS; l++) {
            model_name(m, buf, sizeof(buf));
            uint32_t ns = 0, bs = 0;
            bool found = kvt_idx_ns_lookup(r, buf, strlen(buf), lora_name(l), strlen(lora_name(l)),
                                           &ns, &bs);
            assert_int_equal(found, ref->ns[m][l]);
            if (found) {
                assert_int_equal(ns, ref->ns_id[m][l]);
                assert_int_equal(bs, ref->ns_bs[m][l]);
            }
        }
    /* an id the snapshot never named, and names no pod has */
    kvt_idx_pod_view_t v;
    assert_false(kvt_idx_pod_view(r, kvt_idx_names_pods(r), &v));
    uint32_t id;
    assert_int_equal(kvt_idx_pods_named(r, "nobody", 6, &id, 1), 0);
    assert_false(kvt_idx_ns_lookup(r, "model-1", 7, "ad", 2, &id, &id)); /* a prefix of a lora */
    assert_false(kvt_idx_ns_lookup(r, "model-", 6, "", 0, &id, &id));
    kvt_jbuf_cleanup(&js);
    kvt_idx_read_end(r);
}

static void test_random_against_reference(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 1);
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    assert_int_equal(kvt_idx_create(NULL, &idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(idx, &r), KVT_OK);
    ref_t ref;
    memset(&ref, 0, sizeof(ref));
    /* before a first publish readers find no names */
    kvt_idx_read_begin(r);
    uint32_t x;
    assert_false(kvt_idx_ns_lookup(r, "m", 1, "", 0, &x, &x));
    assert_int_equal(kvt_idx_names_pods(r), 0);
    kvt_idx_read_end(r);
    char buf[64];
    for (int round = 0; round < 400; round++) {
        int ops = 1 + (int)below(12);
        for (int o = 0; o < ops; o++) {
            uint32_t what = below(4);
            if (what == 0) {
                int i = (int)below(NNAMES), k = (int)below(NRANKS);
                uint32_t id;
                assert_int_equal(
                    kvt_idx_pod_get(idx, pod_name(i, buf, sizeof(buf)), (uint32_t)k, &id), KVT_OK);
                assert_true(!ref.pod[i][k] || ref.pod_id[i][k] == id);
                ref.pod[i][k] = true;
                ref.pod_id[i][k] = id;
            } else if (what == 1) {
                int i = (int)below(NNAMES), k = (int)below(NRANKS);
                if (ref.pod[i][k]) {
                    assert_int_equal(kvt_idx_pod_drop(idx, ref.pod_id[i][k]), KVT_OK);
                    ref.pod[i][k] = false;
                }
            } else if (what == 2) {
                int m = (int)below(NMODELS), l = (int)below(NLORAS);
                uint32_t bs = ref.ns[m][l] ? ref.ns_bs[m][l] : 4u << below(3), id;
                model_name(m, buf, sizeof(buf));
                assert_int_equal(kvt_idx_ns_get(idx, buf, l ? lora_name(l) : NULL, bs, &id),
                                 KVT_OK);
                ref.ns[m][l] = true;
                ref.ns_id[m][l] = id;
                ref.ns_bs[m][l] = bs;
            } else {
                int m = (int)below(NMODELS), l = (int)below(NLORAS);
                if (ref.ns[m][l]) {
                    assert_int_equal(kvt_idx_ns_drop(idx, ref.ns_id[m][l], NULL), KVT_OK);
                    ref.ns[m][l] = false;
                }
            }
        }
        assert_int_equal(kvt_idx_names_publish(idx), KVT_OK);
        check(r, &ref);
        kvt_idx_advance(idx, (uint64_t)round); /* frees retired snapshots */
    }
    kvt_idx_reader_destroy(r);
    kvt_idx_destroy(idx);
}

/* A read section keeps the snapshot it opened with; the next one sees the new names. */
static void test_section_keeps_its_snapshot(void **state)
{
    (void)state;
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    assert_int_equal(kvt_idx_create(NULL, &idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(idx, &r), KVT_OK);
    uint32_t a, b, id, bs;
    assert_int_equal(kvt_idx_pod_get(idx, "a", 0, &a), KVT_OK);
    assert_int_equal(kvt_idx_names_publish(idx), KVT_OK);
    assert_int_equal(kvt_idx_names_publish(idx), KVT_OK); /* nothing changed: cheap, the same */
    kvt_idx_read_begin(r);
    kvt_idx_pod_view_t v;
    assert_true(kvt_idx_pod_view(r, a, &v));
    const char *held = v.name;
    /* the writer drops "a", adds "b" (which may take a's id) and republishes */
    assert_int_equal(kvt_idx_pod_drop(idx, a), KVT_OK);
    assert_int_equal(kvt_idx_pod_get(idx, "b", 0, &b), KVT_OK);
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 16, &id), KVT_OK);
    assert_int_equal(kvt_idx_names_publish(idx), KVT_OK);
    kvt_idx_advance(idx, 1); /* reclaiming must not free what the section holds */
    kvt_idx_advance(idx, 2);
    assert_true(kvt_idx_pod_view(r, a, &v));
    assert_ptr_equal(v.name, held);
    assert_string_equal(v.name, "a");
    assert_int_equal(kvt_idx_pods_named(r, "b", 1, &id, 1), 0);
    assert_false(kvt_idx_ns_lookup(r, "m", 1, "", 0, &id, &bs));
    kvt_idx_read_end(r);
    kvt_idx_read_begin(r);
    assert_int_equal(kvt_idx_pods_named(r, "a", 1, &id, 1), 0);
    assert_int_equal(kvt_idx_pods_named(r, "b", 1, &id, 1), 1);
    assert_int_equal(id, b);
    assert_true(kvt_idx_ns_lookup(r, "m", 1, "", 0, &id, &bs));
    assert_int_equal(bs, 16);
    kvt_idx_read_end(r);
    kvt_idx_reader_destroy(r);
    kvt_idx_destroy(idx);
}

typedef struct shared {
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    int stop;          /* atomic */
    uint64_t sections; /* read sections done (atomic) */
} shared_t;

static void *reader_main(void *arg)
{
    shared_t *s = arg;
    char buf[64];
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        kvt_idx_read_begin(s->r);
        for (int i = 0; i < NNAMES; i++) {
            const char *n = pod_name(i, buf, sizeof(buf));
            uint32_t ids[NRANKS + 1];
            size_t got = kvt_idx_pods_named(s->r, n, strlen(n), ids, NRANKS + 1);
            if (got > NRANKS)
                fail_msg("%zu pods named '%s'", got, n);
            for (size_t j = 0; j < got; j++) {
                kvt_idx_pod_view_t v;
                if (!kvt_idx_pod_view(s->r, ids[j], &v) || strcmp(v.name, n) != 0)
                    fail_msg("pod %u found as '%s' is named otherwise", ids[j], n);
            }
        }
        kvt_idx_read_end(s->r);
        __atomic_fetch_add(&s->sections, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void test_readers_on_other_threads(void **state)
{
    (void)state;
    kvt_rng_init(&g_rng, 2);
    shared_t s = {0};
    assert_int_equal(kvt_idx_create(NULL, &s.idx), KVT_OK);
    assert_int_equal(kvt_idx_reader_create(s.idx, &s.r), KVT_OK);
    assert_int_equal(kvt_idx_names_publish(s.idx), KVT_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_main, &s), 0);
    char buf[64];
    uint32_t ids[NNAMES];
    bool live[NNAMES] = {false};
    /* churn until the reader has come round often enough (bounded in rounds, not time) */
    int round = 0;
    for (;
         round < 2000000 && (round < 3000 || __atomic_load_n(&s.sections, __ATOMIC_ACQUIRE) < 200);
         round++) {
        int i = (int)below(NNAMES);
        if (live[i]) {
            assert_int_equal(kvt_idx_pod_drop(s.idx, ids[i]), KVT_OK);
        } else {
            assert_int_equal(kvt_idx_pod_get(s.idx, pod_name(i, buf, sizeof(buf)), 0, &ids[i]),
                             KVT_OK);
        }
        live[i] = !live[i];
        assert_int_equal(kvt_idx_names_publish(s.idx), KVT_OK);
        kvt_idx_advance(s.idx, (uint64_t)round);
    }
    __atomic_store_n(&s.stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    assert_true(__atomic_load_n(&s.sections, __ATOMIC_ACQUIRE) >= 200);
    kvt_idx_reader_destroy(s.r);
    kvt_idx_destroy(s.idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_section_keeps_its_snapshot),
        cmocka_unit_test(test_readers_on_other_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
