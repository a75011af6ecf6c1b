/* tiers/admit: the admission filter's names, always, seen-twice's memory and its forgetting,
 * and tinylfu against an exact model of its counting (doorkeeper, 4-bit cap, halving).
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/rng.h"
#include "tiers/tiers_test.h"

static kvt_admit_t *admit_new(kvt_admit_kind_t kind, uint64_t capacity)
{
    kvt_admit_t *a = NULL;
    assert_int_equal(kvt_admit_new(kind, capacity, &a), KVT_OK);
    assert_non_null(a);
    return a;
}

static void test_names(void **state)
{
    (void)state;
    static const kvt_admit_kind_t kinds[] = {KVT_ADMIT_ALWAYS, KVT_ADMIT_SEEN_TWICE,
                                             KVT_ADMIT_TINYLFU};
    static const char *const names[] = {"always", "seen-twice", "tinylfu"};
    for (int i = 0; i < 3; i++) {
        kvt_admit_kind_t k = (kvt_admit_kind_t)99;
        assert_int_equal(kvt_admit_parse(names[i], &k), KVT_OK);
        assert_int_equal(k, kinds[i]);
        assert_string_equal(kvt_admit_name(k), names[i]);
    }
    static const char *const bad[] = {
        "",        "Always",       "seen_twice",  "seentwice", "tinylfu ", " always",
        "TinyLFU", "seen-twice\n", "seen-twice2", "alway",     "lru"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvt_admit_kind_t k = (kvt_admit_kind_t)99;
        assert_int_equal(kvt_admit_parse(bad[i], &k), KVT_ERR_INVAL);
        assert_int_equal(k, 99); /* untouched */
    }
    kvt_admit_kind_t k = (kvt_admit_kind_t)99;
    assert_int_equal(kvt_admit_parse(NULL, &k), KVT_ERR_INVAL);
    assert_int_equal(k, 99);
    assert_string_equal(kvt_admit_name((kvt_admit_kind_t)7), "unknown");
}

static void test_new_refused(void **state)
{
    (void)state;
    kvt_admit_t *a = (kvt_admit_t *)&a; /* untouched on failure */
    kvt_admit_t *const was = a;
    assert_int_equal(kvt_admit_new((kvt_admit_kind_t)3, 1024, &a), KVT_ERR_INVAL);
    assert_ptr_equal(a, was);
    assert_int_equal(kvt_admit_new(KVT_ADMIT_SEEN_TWICE, (uint64_t)UINT32_MAX + 1, &a),
                     KVT_ERR_RANGE);
    assert_ptr_equal(a, was);
    assert_int_equal(kvt_admit_new(KVT_ADMIT_TINYLFU, UINT64_MAX, &a), KVT_ERR_RANGE);
    assert_ptr_equal(a, was);
    kvt_admit_free(NULL);
}

static void test_always(void **state)
{
    (void)state;
    kvt_admit_t *a = admit_new(KVT_ADMIT_ALWAYS, 0);
    kvt_rng_t rng;
    kvt_rng_init(&rng, 1);
    for (int i = 0; i < 1000; i++) {
        uint64_t h = kvt_rng_next(&rng), v = kvt_rng_next(&rng);
        if (i % 2)
            kvt_admit_touch(a, h);
        assert_true(kvt_admit_ok(a, h, false, v));
        assert_true(kvt_admit_ok(a, h, true, v));
        assert_int_equal(kvt_admit_estimate(a, h), 0);
    }
    kvt_admit_free(a);
}

/* seen-twice ----------------------------------------------------------------------------------- */

static void test_seen_twice_basic(void **state)
{
    (void)state;
    kvt_admit_t *a = admit_new(KVT_ADMIT_SEEN_TWICE, 0); /* 0 counts as the minimum */
    kvt_rng_t rng;
    kvt_rng_init(&rng, 2);
    int refused = 0;
    for (int i = 0; i < 200; i++) {
        uint64_t h = kvt_rng_next(&rng), v = kvt_rng_next(&rng);
        refused += kvt_admit_estimate(a, h) == 0;
        kvt_admit_touch(a, h);
        refused += kvt_admit_estimate(a, h) == 1 && !kvt_admit_ok(a, h, false, v);
        kvt_admit_touch(a, h);
        assert_int_equal(kvt_admit_estimate(a, h), 2);
        assert_true(kvt_admit_ok(a, h, false, v));
        assert_true(kvt_admit_ok(a, h, true, v)); /* full or not: the same rule */
    }
    /* a bloom filter may take a new key for an old one: rarely, in 400 tries at ~400 keys */
    assert_true(refused >= 390);
    kvt_admit_free(a);
}

/* A new key that the stream has not drawn before (distinct with probability 1 - 2^-40 or so). */
static uint64_t fresh(kvt_rng_t *rng)
{
    return kvt_rng_next(rng);
}

/*
 * Rounds of capacity/4 new keys, a fifth of them accessed twice, in a shuffled order, so
 * that a key's two accesses lie within capacity/2 others. After each round: every key
 * accessed twice is admitted; keys accessed once rarely are.
 */
static void test_seen_twice_stream(void **state)
{
    (void)state;
    enum { CAP = 4096, ROUND = CAP / 4 };
    kvt_admit_t *a = admit_new(KVT_ADMIT_SEEN_TWICE, CAP);
    kvt_rng_t rng;
    kvt_rng_init(&rng, 3);
    uint64_t keys[ROUND], order[ROUND + ROUND / 5 + 1];
    bool twice[ROUND];
    long one_offs = 0, one_offs_ok = 0, repeats = 0, repeats_ok = 0;
    while (one_offs < 100000) {
        size_t n = 0, nrep = 0;
        for (size_t i = 0; i < ROUND; i++) {
            keys[i] = fresh(&rng);
            twice[i] = nrep < ROUND / 5 && kvt_rng_below(&rng, 5) == 0;
            nrep += twice[i];
            order[n++] = keys[i];
        }
        for (size_t i = 0; i < ROUND; i++)
            if (twice[i])
                order[n++] = keys[i];
        for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
            size_t j = (size_t)kvt_rng_below(&rng, i + 1);
            uint64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (size_t i = 0; i < n; i++)
            kvt_admit_touch(a, order[i]);
        for (size_t i = 0; i < ROUND; i++) {
            bool ok = kvt_admit_ok(a, keys[i], false, 0);
            if (twice[i]) {
                repeats++;
                repeats_ok += ok;
            } else {
                one_offs++;
                one_offs_ok += ok;
            }
        }
    }
    print_message("seen-twice: %ld of %ld one-off keys admitted, %ld of %ld repeated\n",
                  one_offs_ok, one_offs, repeats_ok, repeats);
    assert_true(one_offs_ok * 20 < one_offs); /* < 5% */
    assert_int_equal(repeats_ok, repeats);    /* a bloom filter has no false negatives */
    kvt_admit_free(a);
}

/*
 * Keys accessed once (or twice), then 3 x capacity other one-off keys, then once more: the
 * filter has forgotten them, so they are new again and not admitted, but for the filters'
 * false positives. Capacity 0 counts as the minimum, and forgets at that scale.
 */
static void test_seen_twice_forgets(void **state)
{
    (void)state;
    enum { PROBES = 400 };
    static const uint64_t caps[] = {0, 3000};
    kvt_rng_t rng;
    kvt_rng_init(&rng, 4);
    for (size_t c = 0; c < 2; c++) {
        uint64_t cap = caps[c] < KVT_ADMIT_MIN_CAPACITY ? KVT_ADMIT_MIN_CAPACITY : caps[c];
        kvt_admit_t *a = admit_new(KVT_ADMIT_SEEN_TWICE, caps[c]);
        uint64_t probe[PROBES];
        for (int i = 0; i < PROBES; i++) {
            probe[i] = fresh(&rng);
            kvt_admit_touch(a, probe[i]);
            if (i % 2) /* odd probes were admitted before they were forgotten */
                kvt_admit_touch(a, probe[i]);
        }
        for (int i = 0; i < PROBES; i++)
            assert_int_equal(kvt_admit_estimate(a, probe[i]), i % 2 ? 2 : 1);
        for (uint64_t i = 0; i < 3 * cap; i++)
            kvt_admit_touch(a, fresh(&rng));
        int remembered = 0, admitted = 0;
        for (int i = 0; i < PROBES; i++) {
            remembered += kvt_admit_estimate(a, probe[i]) != 0;
            kvt_admit_touch(a, probe[i]);
            admitted += kvt_admit_ok(a, probe[i], false, 0);
        }
        print_message("seen-twice capacity %" PRIu64 ": after 3 x capacity others, %d of %d "
                      "remembered, %d admitted on one more access\n",
                      caps[c], remembered, PROBES, admitted);
        assert_true(remembered * 20 < PROBES);
        assert_true(admitted * 20 < PROBES);
        kvt_admit_free(a);
    }
}

/* tinylfu ------------------------------------------------------------------------------------- */

/*
 * What tinylfu counts, exactly: per key a doorkeeper bit (the first access after a halving)
 * and a count of the later ones, capped at 15; both halve (the bit clears) every
 * 10 x capacity accesses. The sketch may only count more than this (collisions, bloom false
 * positives), never less.
 */
typedef struct naive_lfu {
    size_t n;
    bool *door;
    uint8_t *cnt;
    uint64_t touches, sample;
} naive_lfu_t;

static void naive_init(naive_lfu_t *m, size_t n, uint64_t capacity)
{
    m->n = n;
    m->door = calloc(n, sizeof(*m->door));
    m->cnt = calloc(n, sizeof(*m->cnt));
    assert_non_null(m->door);
    assert_non_null(m->cnt);
    m->touches = 0;
    m->sample = 10 * (capacity < KVT_ADMIT_MIN_CAPACITY ? KVT_ADMIT_MIN_CAPACITY : capacity);
}

static void naive_cleanup(naive_lfu_t *m)
{
    free(m->door);
    free(m->cnt);
}

static void naive_touch(naive_lfu_t *m, size_t k)
{
    if (!m->door[k])
        m->door[k] = true;
    else if (m->cnt[k] < 15)
        m->cnt[k]++;
    if (++m->touches == m->sample) {
        for (size_t i = 0; i < m->n; i++) {
            m->door[i] = false;
            m->cnt[i] >>= 1;
        }
        m->touches = 0;
    }
}

static uint32_t naive_count(const naive_lfu_t *m, size_t k)
{
    return m->cnt[k] + (m->door[k] ? 1u : 0u);
}

/* Zipf(1) over n ranks: the cumulative weights 1/1 + 1/2 + ... for an inverse-CDF draw. */
static double *zipf_cdf(size_t n)
{
    double *cdf = malloc(n * sizeof(*cdf));
    assert_non_null(cdf);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        cdf[i] = sum += 1.0 / (double)(i + 1);
    return cdf;
}

static size_t zipf_draw(kvt_rng_t *rng, const double *cdf, size_t n)
{
    double u = (double)(kvt_rng_next(rng) >> 11) * 0x1p-53 * cdf[n - 1];
    size_t lo = 0, hi = n - 1; /* the first rank whose cumulative weight passes u */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cdf[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Key of rank @k: ranks are small numbers, keys are hashes. */
static uint64_t lfu_key(size_t k)
{
    return kvt_rng_mix(k + 0x5bd1e995u);
}

/*
 * Every estimate is at least the exact count, and few are far above it: a key's four counters
 * all shared with busier keys is rare (over 30 seeds, at most 7 of the 100000 keys here were
 * 4 or more over).
 */
static void check_estimates(const kvt_admit_t *a, const naive_lfu_t *m)
{
    size_t far = 0;
    for (size_t k = 0; k < m->n; k++) {
        uint32_t est = kvt_admit_estimate(a, lfu_key(k)), want = naive_count(m, k);
        if (est < want)
            fail_msg("rank %zu: estimate %u below the exact count %u", k, est, want);
        assert_true(est <= 16);
        far += est >= want + 4;
    }
    if (far > 20)
        fail_msg("%zu keys with an estimate 4 or more above the exact count", far);
}

/*
 * A zipf workload over 100000 keys on a filter for 1024 blocks (halving every 10240
 * accesses, four times over, then half a period more): the estimate never falls below the exact
 * count and is rarely far above it; for random pairs whose exact counts differ by 3 or more, the
 * admission decision when the disk is full agrees with comparing the exact counts at least 90% of
 * the time; hot keys beat keys accessed once, and keys accessed once are not admitted to a disk
 * with room.
 */
static void test_tinylfu_vs_exact(void **state)
{
    (void)state;
    enum { CAP = 1024, N = 100000 };
    kvt_admit_t *a = admit_new(KVT_ADMIT_TINYLFU, CAP);
    naive_lfu_t m;
    naive_init(&m, N, CAP);
    double *cdf = zipf_cdf(N);
    kvt_rng_t rng;
    kvt_rng_init(&rng, 5);
    const uint64_t total = 4 * m.sample + m.sample / 2; /* ends mid-period */
    for (uint64_t t = 1; t <= total; t++) {
        size_t k = zipf_draw(&rng, cdf, N);
        kvt_admit_touch(a, lfu_key(k));
        naive_touch(&m, k);
        if (t % 7919 == 0 || t % m.sample == 0 || t % m.sample == m.sample - 1)
            check_estimates(a, &m);
    }
    check_estimates(a, &m);

    long pairs = 0, agree = 0;
    while (pairs < 20000) {
        size_t c = zipf_draw(&rng, cdf, N), v = zipf_draw(&rng, cdf, N);
        uint32_t tc = naive_count(&m, c), tv = naive_count(&m, v);
        if (tc + 3 > tv && tv + 3 > tc)
            continue;
        pairs++;
        agree += kvt_admit_ok(a, lfu_key(c), true, lfu_key(v)) == (tc > tv);
    }
    print_message("tinylfu: full-disk decision agrees with the exact counts in %ld of %ld pairs\n",
                  agree, pairs);
    assert_true(agree * 10 >= pairs * 9);

    /* the 20 hottest keys against 1000 keys accessed once (fresh: never drawn above) */
    enum { HOT = 20, ONCE = 1000 };
    kvt_rng_t frng;
    kvt_rng_init(&frng, 6);
    uint64_t once[ONCE];
    for (int i = 0; i < ONCE; i++) {
        once[i] = fresh(&frng);
        kvt_admit_touch(a, once[i]);
    }
    long once_beats = 0, hot_beats = 0, once_room = 0;
    for (int i = 0; i < ONCE; i++) {
        once_room += kvt_admit_ok(a, once[i], false, 0);
        for (size_t k = 0; k < HOT; k++) {
            once_beats += kvt_admit_ok(a, once[i], true, lfu_key(k));
            hot_beats += kvt_admit_ok(a, lfu_key(k), true, once[i]);
        }
    }
    print_message("tinylfu: one-off over hot %ld, hot over one-off %ld of %d; one-off admitted "
                  "with room %ld of %d\n",
                  once_beats, hot_beats, HOT * ONCE, once_room, ONCE);
    assert_int_equal(once_beats, 0);
    assert_int_equal(hot_beats, HOT * ONCE);
    assert_true(once_room * 20 < ONCE);
    for (int i = 0; i < ONCE; i++) { /* a second access: admitted with room, always */
        kvt_admit_touch(a, once[i]);
        assert_true(kvt_admit_ok(a, once[i], false, 0));
    }

    free(cdf);
    naive_cleanup(&m);
    kvt_admit_free(a);
}

/*
 * Exact counts around a halving: keys accessed 12 and 7 times and one filler key, up to the
 * last access of the period, then the one that ends it. Capacity 0 halves at the minimum's
 * period.
 */
static void test_tinylfu_halving(void **state)
{
    (void)state;
    static const uint64_t caps[] = {0, 1024, 3000};
    kvt_rng_t rng;
    kvt_rng_init(&rng, 7);
    for (size_t c = 0; c < 3; c++) {
        uint64_t cap = caps[c] < KVT_ADMIT_MIN_CAPACITY ? KVT_ADMIT_MIN_CAPACITY : caps[c];
        uint64_t sample = 10 * cap, touches = 0;
        kvt_admit_t *a = admit_new(KVT_ADMIT_TINYLFU, caps[c]);
        uint64_t x = fresh(&rng), y = fresh(&rng), filler = fresh(&rng);
        for (int i = 0; i < 12; i++, touches++)
            kvt_admit_touch(a, x);
        for (int i = 0; i < 7; i++, touches++)
            kvt_admit_touch(a, y);
        assert_int_equal(kvt_admit_estimate(a, x), 12);
        assert_int_equal(kvt_admit_estimate(a, y), 7);
        assert_int_equal(kvt_admit_estimate(a, filler), 0);
        for (; touches < sample - 1; touches++)
            kvt_admit_touch(a, filler);
        assert_int_equal(kvt_admit_estimate(a, x), 12);
        assert_int_equal(kvt_admit_estimate(a, y), 7);
        assert_int_equal(kvt_admit_estimate(a, filler), 16); /* 15, the cap, and the doorkeeper */
        assert_false(kvt_admit_ok(a, y, true, x));
        kvt_admit_touch(a, filler); /* the period's last access: counts halve, doorkeeper clears */
        assert_int_equal(kvt_admit_estimate(a, x), 11 / 2);
        assert_int_equal(kvt_admit_estimate(a, y), 6 / 2);
        assert_int_equal(kvt_admit_estimate(a, filler), 15 / 2);
        kvt_admit_touch(a, y); /* doorkeeper again, then the sketch */
        assert_int_equal(kvt_admit_estimate(a, y), 4);
        kvt_admit_touch(a, y);
        assert_int_equal(kvt_admit_estimate(a, y), 5);
        assert_false(kvt_admit_ok(a, y, true, x)); /* 5 against 5 */
        kvt_admit_touch(a, y);
        assert_true(kvt_admit_ok(a, y, true, x)); /* 6 against 5 */
        kvt_admit_free(a);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_new_refused),
        cmocka_unit_test(test_always),
        cmocka_unit_test(test_seen_twice_basic),
        cmocka_unit_test(test_seen_twice_stream),
        cmocka_unit_test(test_seen_twice_forgets),
        cmocka_unit_test(test_tinylfu_vs_exact),
        cmocka_unit_test(test_tinylfu_halving),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
