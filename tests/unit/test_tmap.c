/*
 * test_tmap: the tier's block table (tiers/tmap.c) against a naive model:
 * random adds, finds and deletes of (namespace, key) records in a small pool
 * (the hash's runs collide and wrap, deletes shift them back), and the two
 * LRU lists under random pushes, touches, placements after another member
 * and unlinks against plain arrays.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/rng.h"
#include "tiers/tiers_test.h"

#define CAP 64u

typedef struct model {
    bool used[CAP];
    uint32_t ns[CAP];
    uint64_t key[CAP];
    uint32_t bi[CAP]; /* the table's record for model slot i */
} model_t;

/* Index of (ns, key) in the model, or -1. */
static int model_find(const model_t *m, uint32_t ns, uint64_t key)
{
    for (unsigned i = 0; i < CAP; i++)
        if (m->used[i] && m->ns[i] == ns && m->key[i] == key)
            return (int)i;
    return -1;
}

static void test_table_random(void **state)
{
    (void)state;
    tmap_t t;
    assert_int_equal(tmap_init(&t, CAP), KVT_OK);
    model_t m;
    memset(&m, 0, sizeof(m));
    kvt_rng_t r;
    kvt_rng_init(&r, 3);
    size_t live = 0;
    for (int op = 0; op < 200000; op++) {
        /* few keys and namespaces, so adds, finds and deletes hit the same records */
        uint32_t ns = (uint32_t)kvt_rng_below(&r, 3);
        uint64_t key = kvt_rng_below(&r, 96);
        int mi = model_find(&m, ns, key);
        uint32_t bi = tmap_find(&t, ns, key);
        assert_int_equal(bi == TB_NONE, mi < 0);
        if (mi >= 0)
            assert_int_equal(bi, m.bi[mi]);
        if (mi < 0 && live < CAP && kvt_rng_below(&r, 2) == 0) {
            bi = tmap_add(&t, ns, key);
            assert_int_not_equal(bi, TB_NONE);
            unsigned slot = 0;
            while (m.used[slot])
                slot++;
            m.used[slot] = true;
            m.ns[slot] = ns;
            m.key[slot] = key;
            m.bi[slot] = bi;
            live++;
        } else if (mi >= 0 && kvt_rng_below(&r, 2) == 0) {
            tmap_del(&t, bi);
            m.used[mi] = false;
            live--;
        }
        if (live == CAP) /* the pool is out: an add must be refused */
            assert_int_equal(tmap_add(&t, 9, 12345), TB_NONE);
        assert_int_equal(t.nfree, CAP - live);
    }
    /* every live record is found, every other key is not */
    for (uint32_t ns = 0; ns < 3; ns++)
        for (uint64_t key = 0; key < 96; key++)
            assert_int_equal(tmap_find(&t, ns, key) == TB_NONE, model_find(&m, ns, key) < 0);
    tmap_cleanup(&t);
}

/* The list from head to tail, checked against the links the other way. */
static size_t list_walk(const tmap_t *t, const tlist_t *l, bool disk, uint32_t *out)
{
    size_t n = 0;
    uint32_t prev = TB_NONE;
    for (uint32_t bi = l->head; bi != TB_NONE; bi = disk ? t->b[bi].dnext : t->b[bi].rnext) {
        assert_int_equal(disk ? t->b[bi].dprev : t->b[bi].rprev, prev);
        out[n++] = bi;
        prev = bi;
        assert_true(n <= CAP);
    }
    assert_int_equal(l->tail, prev);
    assert_int_equal(l->n, n);
    return n;
}

static void test_lists_random(void **state)
{
    (void)state;
    tmap_t t;
    assert_int_equal(tmap_init(&t, CAP), KVT_OK);
    uint32_t bis[CAP];
    for (uint32_t i = 0; i < CAP; i++)
        bis[i] = tmap_add(&t, 0, i);
    /* naive lists: arrays from head to tail, one per list */
    uint32_t want[2][CAP];
    size_t nwant[2] = {0, 0};
    bool in[2][CAP];
    memset(in, 0, sizeof(in));
    kvt_rng_t r;
    kvt_rng_init(&r, 4);
    for (int op = 0; op < 100000; op++) {
        bool disk = kvt_rng_below(&r, 2) == 1;
        tlist_t *l = disk ? &t.disk : &t.ram;
        uint32_t i = (uint32_t)kvt_rng_below(&r, CAP);
        uint32_t *w = want[disk];
        size_t *nw = &nwant[disk];
        size_t at = SIZE_MAX;
        for (size_t k = 0; k < *nw; k++)
            if (w[k] == bis[i])
                at = k;
        if (!in[disk][i]) {
            tlist_push(&t, l, disk, bis[i]);
            memmove(w + 1, w, *nw * sizeof(*w));
            w[0] = bis[i];
            (*nw)++;
            in[disk][i] = true;
        } else if (kvt_rng_below(&r, 3) == 0) {
            tlist_touch(&t, l, disk, bis[i]);
            memmove(w + 1, w, at * sizeof(*w));
            w[0] = bis[i];
        } else if (kvt_rng_below(&r, 2) == 0 && *nw > 1) {
            /* right after another member (lookup's order) */
            size_t o = (size_t)kvt_rng_below(&r, *nw - 1);
            if (o >= at)
                o++;
            uint32_t after = w[o];
            tlist_place(&t, l, disk, after, bis[i]);
            memmove(w + at, w + at + 1, (*nw - at - 1) * sizeof(*w));
            size_t pos = 0;
            while (w[pos] != after)
                pos++;
            memmove(w + pos + 2, w + pos + 1, (*nw - 2 - pos) * sizeof(*w));
            w[pos + 1] = bis[i];
        } else {
            tlist_unlink(&t, l, disk, bis[i]);
            memmove(w + at, w + at + 1, (*nw - at - 1) * sizeof(*w));
            (*nw)--;
            in[disk][i] = false;
        }
        uint32_t got[CAP];
        size_t n = list_walk(&t, l, disk, got);
        assert_int_equal(n, *nw);
        assert_memory_equal(got, w, n * sizeof(*w));
    }
    tmap_cleanup(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_random),
        cmocka_unit_test(test_lists_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
