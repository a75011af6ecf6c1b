/*
 * test_tiers: the tier as the daemon uses it, on a real arena, a real
 * O_DIRECT store driven by io_uring and real RocksDB metadata in a temp dir:
 * the RAM tier's LRU, reservations, pins and leases, durable puts that
 * survive a close and a kill -9, promotion with checksums, corruption read
 * as a miss, and a random run against a model that allows a cache to forget
 * but never to return wrong bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "tests/support/rng.h"
#include "tiers/tiers.h"

#define BLK 16384u
#define NS "m"
#define NSL 1u

static char g_dir[256];

/* ---- helpers ---- */

static void pattern(uint64_t key, uint8_t *buf, size_t len)
{
    kvt_rng_t r = {.s = key * 0x9e3779b97f4a7c15ull + 1};
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = kvt_rng_next(&r);
        memcpy(buf + i, &v, len - i < 8 ? len - i : 8);
    }
}

static size_t blen(uint64_t key)
{
    return 1 + (size_t)(key * 7919u % BLK); /* 1 .. BLK bytes, varied */
}

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    kvt_status_t st;
    uint8_t buf[BLK];
    size_t len;
    kvt_tier_pinned_t out[64];
    size_t n;
} waiter_t;

static void w_init(waiter_t *w)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

static void w_fini(waiter_t *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static void w_signal(waiter_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void w_wait(waiter_t *w)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT)
            break;
    bool done = w->done;
    w->done = false;
    pthread_mutex_unlock(&w->mu);
    assert_true(done);
}

static void done_cb(void *arg, kvt_status_t st)
{
    waiter_t *w = arg;
    w->st = st;
    w_signal(w);
}

static void get_cb(void *arg, kvt_status_t st, const void *data, size_t len)
{
    waiter_t *w = arg;
    w->st = st;
    w->len = len;
    if (st == KVT_OK)
        memcpy(w->buf, data, len);
    w_signal(w);
}

static void pin_cb(void *arg, const kvt_tier_pinned_t *out, size_t n)
{
    waiter_t *w = arg;
    w->n = n;
    memcpy(w->out, out, n * sizeof(*out));
    w_signal(w);
}

/* Changes, recorded for the tests that check them. */
static pthread_mutex_t g_chg_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t g_stored[3], g_removed[3];

static void on_change(void *arg, const kvt_tier_change_t *ch, size_t n)
{
    (void)arg;
    pthread_mutex_lock(&g_chg_mu);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ch[i].ns_len, NSL);
        assert_memory_equal(ch[i].ns, NS, NSL);
        if (ch[i].stored)
            g_stored[ch[i].loc]++;
        else
            g_removed[ch[i].loc]++;
    }
    pthread_mutex_unlock(&g_chg_mu);
}

static void chg_reset(void)
{
    pthread_mutex_lock(&g_chg_mu);
    memset(g_stored, 0, sizeof(g_stored));
    memset(g_removed, 0, sizeof(g_removed));
    pthread_mutex_unlock(&g_chg_mu);
}

static size_t chg_get(bool stored, kvt_tier_loc_t loc)
{
    pthread_mutex_lock(&g_chg_mu);
    size_t v = stored ? g_stored[loc] : g_removed[loc];
    pthread_mutex_unlock(&g_chg_mu);
    return v;
}

static char g_disk[300], g_data[300];

static kvt_tier_cfg_t cfg_of(uint32_t ram_slots, uint32_t disk_slots, kvt_tier_admit_t admit)
{
    kvt_tier_cfg_t c = {.ram_bytes = (uint64_t)ram_slots * BLK,
                        .block_bytes = BLK,
                        .arena_name = "",
                        .io_depth = 8,
                        .admit = admit,
                        .on_change = on_change};
    if (disk_slots > 0) {
        c.disk_path = g_disk;
        c.disk_bytes = 4096 + (uint64_t)disk_slots * BLK;
        c.data_dir = g_data;
    }
    return c;
}

static kvt_tier_t *open_ok(const kvt_tier_cfg_t *c)
{
    char err[256] = "";
    kvt_tier_t *t = NULL;
    kvt_status_t st = kvt_tier_open(c, &t, err, sizeof(err));
    if (st != KVT_OK)
        fprintf(stderr, "kvt_tier_open: %s (%d)\n", err, st);
    assert_int_equal(st, KVT_OK);
    return t;
}

static kvt_status_t put(kvt_tier_t *t, uint64_t key, bool durable)
{
    uint8_t buf[BLK];
    size_t len = blen(key);
    pattern(key, buf, len);
    waiter_t w;
    w_init(&w);
    kvt_status_t st = kvt_tier_put(t, NS, NSL, key, buf, len, durable, done_cb, &w);
    if (st == KVT_OK) {
        w_wait(&w);
        st = w.st;
    }
    w_fini(&w);
    return st;
}

/* KVT_OK when the block reads back byte-exact, KVT_ERR_NOT_FOUND when absent; anything
 * else (wrong bytes above all) fails the test. */
static kvt_status_t get_check(kvt_tier_t *t, uint64_t key)
{
    static waiter_t w;
    w_init(&w);
    assert_int_equal(kvt_tier_get(t, NS, NSL, key, get_cb, &w), KVT_OK);
    w_wait(&w);
    kvt_status_t st = w.st;
    if (st == KVT_OK) {
        uint8_t want[BLK];
        pattern(key, want, blen(key));
        assert_int_equal(w.len, blen(key));
        assert_memory_equal(w.buf, want, w.len);
    } else {
        assert_int_equal(st, KVT_ERR_NOT_FOUND);
    }
    w_fini(&w);
    return st;
}

static void wait_stat(kvt_tier_t *t, size_t off, uint64_t at_least)
{
    for (int i = 0; i < 2000; i++) {
        kvt_tier_stats_t s;
        kvt_tier_stats(t, &s);
        if (*(uint64_t *)((char *)&s + off) >= at_least)
            return;
        usleep(5000);
    }
    fail_msg("a tier counter did not reach %llu", (unsigned long long)at_least);
}

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/test_tiers.XXXXXX", tmp != NULL ? tmp : "/tmp");
    assert_non_null(mkdtemp(g_dir));
    snprintf(g_disk, sizeof(g_disk), "%s/store", g_dir);
    snprintf(g_data, sizeof(g_data), "%s/meta", g_dir);
    chg_reset();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- tests ---- */

static void test_ram_lru(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(8, 0, KVT_TIER_ADMIT_ALWAYS);
    kvt_tier_t *t = open_ok(&c);
    for (uint64_t k = 0; k < 8; k++)
        assert_int_equal(put(t, k, false), KVT_OK);
    for (uint64_t k = 4; k < 8; k++)
        assert_int_equal(get_check(t, k), KVT_OK);
    for (uint64_t k = 8; k < 12; k++)
        assert_int_equal(put(t, k, false), KVT_OK);
    /* 0..3 were least recently used */
    for (uint64_t k = 0; k < 4; k++)
        assert_int_equal(get_check(t, k), KVT_ERR_NOT_FOUND);
    for (uint64_t k = 4; k < 12; k++)
        assert_int_equal(get_check(t, k), KVT_OK);
    uint64_t keys[3] = {4, 5, 99};
    uint8_t loc[3];
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 3, loc), 2);
    assert_int_equal(loc[0], KVT_TIER_LOC_RAM);
    assert_int_equal(kvt_tier_lookup(t, "other", 5, keys, 3, loc), 0);
    /* held: which keys, in any order, without counting an access or moving the LRU */
    kvt_tier_stats_t before, after;
    kvt_tier_stats(t, &before);
    uint64_t some[4] = {99, 11, 0, 4};
    bool h[4];
    assert_int_equal(kvt_tier_held(t, NS, NSL, some, 4, h), 2);
    assert_true(!h[0] && h[1] && !h[2] && h[3]);
    assert_int_equal(kvt_tier_held(t, "other", 5, some, 4, h), 0);
    assert_true(!h[1] && !h[3]);
    kvt_tier_stats(t, &after);
    assert_true(after.lookups == before.lookups && after.misses == before.misses &&
                after.hits_ram == before.hits_ram);
    assert_int_equal(chg_get(true, KVT_TIER_LOC_RAM), 12);
    assert_int_equal(chg_get(false, KVT_TIER_LOC_RAM), 4);
    kvt_tier_stats_t s;
    kvt_tier_stats(t, &s);
    assert_int_equal(s.ram_used, 8);
    assert_int_equal(s.drops, 4);
    /* bad input changes nothing */
    uint8_t big[BLK + 1] = {0};
    assert_int_equal(kvt_tier_put(t, NS, NSL, 100, big, BLK + 1, false, done_cb, NULL),
                     KVT_ERR_TOO_BIG);
    assert_int_equal(kvt_tier_put(t, NS, NSL, 100, big, 0, false, done_cb, NULL), KVT_ERR_INVAL);
    assert_int_equal(kvt_tier_put(t, "", 0, 100, big, 10, false, done_cb, NULL), KVT_ERR_INVAL);
    assert_int_equal(kvt_tier_put(t, NS, NSL, 100, big, 10, true, done_cb, NULL),
                     KVT_ERR_UNSUPPORTED);
    assert_int_equal(kvt_tier_delete(t, NS, NSL, 100, done_cb, NULL), KVT_ERR_NOT_FOUND);
    kvt_tier_stats(t, &s);
    assert_int_equal(s.ram_used, 8);
    kvt_tier_close(t);
}

/* A lookup touches its batch so the first key ends most recent: the chain's tail goes first. */
static void test_lookup_order(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(4, 0, KVT_TIER_ADMIT_ALWAYS);
    kvt_tier_t *t = open_ok(&c);
    for (uint64_t k = 0; k < 4; k++) /* 0 is now least recent */
        assert_int_equal(put(t, k, false), KVT_OK);
    uint64_t keys[4] = {0, 1, 2, 3};
    uint8_t loc[4];
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 4, loc), 4);
    assert_int_equal(loc[3], KVT_TIER_LOC_RAM);
    bool h;
    assert_int_equal(kvt_tier_held(t, NS, NSL, &keys[3], 1, &h), 1); /* not an access */
    assert_int_equal(put(t, 9, false), KVT_OK); /* evicts the batch's tail, block 3 */
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 4, NULL), 3);
    /* that lookup put 0, 1, 2 ahead of 9 again: 9 goes next */
    assert_int_equal(put(t, 10, false), KVT_OK);
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 4, NULL), 3);
    uint64_t nine = 9;
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, &nine, 1, NULL), 0);
    kvt_tier_close(t);
}

static void test_reserve_pin(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(8, 0, KVT_TIER_ADMIT_ALWAYS);
    kvt_tier_t *t = open_ok(&c);
    kvt_tier_sess_t *s = kvt_tier_sess_open(t);
    assert_non_null(s);
    uint64_t keys[4] = {10, 11, 12, 13};
    uint32_t slots[4], lens[4];
    uint64_t ev[8];
    size_t nev = 99;
    assert_int_equal(kvt_tier_reserve(t, s, NS, NSL, keys, 4, slots, ev, 8, &nev), KVT_OK);
    assert_int_equal(nev, 0);
    for (int i = 0; i < 4; i++) {
        assert_int_not_equal(slots[i], KVT_TIER_SLOT_NONE);
        lens[i] = (uint32_t)blen(keys[i]);
        pattern(keys[i], kvt_tier_slot_ptr(t, slots[i]), lens[i]);
    }
    /* reserved, not committed: invisible, and not reserved twice */
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 4, NULL), 0);
    uint32_t again[4];
    assert_int_equal(kvt_tier_reserve(t, s, NS, NSL, keys, 4, again, NULL, 0, NULL), KVT_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(again[i], KVT_TIER_SLOT_NONE);
    uint32_t bad[4] = {1, 1, BLK + 1, 1};
    assert_int_equal(kvt_tier_commit(t, s, NS, NSL, keys, 4, bad, true, NULL), KVT_ERR_INVAL);
    size_t done = 0;
    assert_int_equal(kvt_tier_commit(t, s, NS, NSL, keys, 4, lens, true, &done), KVT_OK);
    assert_int_equal(done, 4);
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 4, NULL), 4);
    /* pin two; fill the arena around them: the pinned stay, bytes untouched */
    waiter_t w;
    w_init(&w);
    assert_int_equal(kvt_tier_pin(t, s, NS, NSL, keys, 2, pin_cb, &w), KVT_OK);
    w_wait(&w);
    assert_int_equal(w.n, 2);
    assert_int_equal(w.out[0].slot, slots[0]);
    assert_int_equal(w.out[1].len, lens[1]);
    /* the sums recorded at the commit; they do not follow bytes changed since */
    for (int i = 0; i < 2; i++)
        assert_true(w.out[i].sum == XXH3_64bits(kvt_tier_slot_ptr(t, slots[i]), lens[i]));
    uint8_t *b3 = kvt_tier_slot_ptr(t, slots[3]);
    uint64_t sum3 = XXH3_64bits(b3, lens[3]);
    b3[0] ^= 0xff;
    assert_int_equal(kvt_tier_pin(t, s, NS, NSL, keys + 3, 1, pin_cb, &w), KVT_OK);
    w_wait(&w);
    assert_true(w.out[0].sum == sum3);
    b3[0] ^= 0xff;
    assert_int_equal(kvt_tier_unpin(t, s, NS, NSL, keys + 3, 1), 1);
    for (uint64_t k = 100; k < 130; k++)
        assert_int_equal(put(t, k, false), KVT_OK);
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 4, NULL), 2);
    uint64_t k129 = 129;
    assert_int_equal(kvt_tier_pin(t, s, NS, NSL, &k129, 1, pin_cb, &w), KVT_OK);
    w_wait(&w);
    uint8_t want129[BLK];
    pattern(k129, want129, blen(k129));
    assert_true(w.out[0].sum == XXH3_64bits(want129, blen(k129))); /* recorded at the put */
    assert_int_equal(kvt_tier_unpin(t, s, NS, NSL, &k129, 1), 1);
    for (int i = 0; i < 2; i++) {
        uint8_t want[BLK];
        pattern(keys[i], want, lens[i]);
        assert_memory_equal(kvt_tier_slot_ptr(t, slots[i]), want, lens[i]);
    }
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    assert_int_equal(st.ram_pinned, 2);
    assert_int_equal(kvt_tier_delete(t, NS, NSL, keys[0], done_cb, &w), KVT_ERR_EXISTS);
    assert_int_equal(kvt_tier_unpin(t, s, NS, NSL, keys, 1), 1);
    assert_int_equal(kvt_tier_unpin(t, s, NS, NSL, keys, 1), 0); /* not pinned twice */
    /* reserve, then give back; reserve, then close the session: both slots return */
    uint64_t k2[2] = {200, 201};
    uint32_t s2[2];
    assert_int_equal(kvt_tier_reserve(t, s, NS, NSL, k2, 1, s2, NULL, 0, NULL), KVT_OK);
    assert_int_equal(kvt_tier_commit(t, s, NS, NSL, k2, 1, NULL, false, &done), KVT_OK);
    assert_int_equal(done, 1);
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, k2, 1, NULL), 0);
    assert_int_equal(kvt_tier_reserve(t, s, NS, NSL, k2 + 1, 1, s2, NULL, 0, NULL), KVT_OK);
    kvt_tier_sess_close(t, s); /* releases keys[1]'s pin and 201's reservation */
    kvt_tier_stats(t, &st);
    assert_int_equal(st.ram_pinned, 0);
    assert_int_equal(st.ram_reserved, 0);
    /* another session's commit of keys it did not reserve does nothing */
    kvt_tier_sess_t *s3 = kvt_tier_sess_open(t);
    assert_int_equal(kvt_tier_commit(t, s3, NS, NSL, k2 + 1, 1, NULL, true, &done), KVT_OK);
    assert_int_equal(done, 0);
    kvt_tier_sess_close(t, s3);
    w_fini(&w);
    kvt_tier_close(t);
}

/* A session that pins block 1 (stored first) and reserves key 2 (t has room for both). */
static kvt_tier_sess_t *pin_1_reserve_2(kvt_tier_t *t, waiter_t *w)
{
    uint64_t keys[2] = {1, 2};
    uint32_t slot;
    kvt_tier_sess_t *s = kvt_tier_sess_open(t);
    assert_non_null(s);
    assert_int_equal(put(t, 1, false), KVT_OK);
    assert_int_equal(kvt_tier_pin(t, s, NS, NSL, keys, 1, pin_cb, w), KVT_OK);
    w_wait(w);
    assert_int_equal(kvt_tier_reserve(t, s, NS, NSL, keys + 1, 1, &slot, NULL, 0, NULL), KVT_OK);
    assert_true(slot != KVT_TIER_SLOT_NONE);
    return s;
}

/* Pins and reservations a session leaves behind hold their slots for grace_ms: its block is
 * not evicted, its reserved key not given to another session; then both go. */
static void test_release_grace(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(4, 0, KVT_TIER_ADMIT_ALWAYS);
    c.grace_ms = 300;
    kvt_tier_t *t = open_ok(&c);
    uint64_t keys[2] = {1, 2};
    uint32_t slots[2];
    waiter_t w;
    w_init(&w);
    kvt_tier_sess_t *s = pin_1_reserve_2(t, &w);
    kvt_tier_sess_close(t, s); /* an engine gone with a copy perhaps in flight */
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    assert_int_equal(st.ram_pinned, 1);
    assert_int_equal(st.ram_reserved, 1);
    kvt_tier_sess_t *s2 = kvt_tier_sess_open(t);
    assert_int_equal(kvt_tier_reserve(t, s2, NS, NSL, keys + 1, 1, slots, NULL, 0, NULL), KVT_OK);
    assert_int_equal(slots[0], KVT_TIER_SLOT_NONE); /* still reserved */
    for (uint64_t k = 10; k < 16; k++)              /* fill the other slots, and more */
        put(t, k, false);
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 1, NULL), 1); /* pinned: not evicted */
    for (int i = 0; i < 400; i++) { /* the expiry tick ends them after grace_ms */
        kvt_tier_stats(t, &st);
        if (st.ram_pinned == 0 && st.ram_reserved == 0)
            break;
        usleep(5000);
    }
    assert_int_equal(st.ram_pinned, 0);
    assert_int_equal(st.ram_reserved, 0);
    assert_int_equal(kvt_tier_reserve(t, s2, NS, NSL, keys + 1, 1, slots, NULL, 0, NULL), KVT_OK);
    assert_true(slots[0] != KVT_TIER_SLOT_NONE); /* the key's slot is free for a new writer */
    kvt_tier_sess_close(t, s2);
    w_fini(&w);
    kvt_tier_close(t);
}

static void test_lease_expiry(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(4, 0, KVT_TIER_ADMIT_ALWAYS);
    c.lease_ms = 50;
    kvt_tier_t *t = open_ok(&c);
    uint64_t keys[2] = {1, 2};
    waiter_t w;
    w_init(&w);
    kvt_tier_sess_t *s = pin_1_reserve_2(t, &w);
    wait_stat(t, offsetof(kvt_tier_stats_t, lease_expired), 2);
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    assert_int_equal(st.ram_pinned, 0);
    assert_int_equal(st.ram_reserved, 0);
    assert_int_equal(kvt_tier_unpin(t, s, NS, NSL, keys, 1), 0);
    kvt_tier_sess_close(t, s);
    w_fini(&w);
    kvt_tier_close(t);
}

/* kvt_tier_commit_sums() records the caller's sums as they are (no second hash of the bytes). */
static void test_commit_sums(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(4, 0, KVT_TIER_ADMIT_ALWAYS);
    kvt_tier_t *t = open_ok(&c);
    kvt_tier_sess_t *s = kvt_tier_sess_open(t);
    uint64_t keys[2] = {40, 41};
    uint32_t slots[2], lens[2];
    assert_int_equal(kvt_tier_reserve(t, s, NS, NSL, keys, 2, slots, NULL, 0, NULL), KVT_OK);
    for (int i = 0; i < 2; i++) {
        lens[i] = (uint32_t)blen(keys[i]);
        pattern(keys[i], kvt_tier_slot_ptr(t, slots[i]), lens[i]);
    }
    uint64_t sums[2] = {XXH3_64bits(kvt_tier_slot_ptr(t, slots[0]), lens[0]), 0x1234};
    assert_int_equal(kvt_tier_commit_sums(t, s, NS, NSL, keys, 2, lens, NULL, NULL), KVT_ERR_INVAL);
    size_t done = 0;
    assert_int_equal(kvt_tier_commit_sums(t, s, NS, NSL, keys, 2, lens, sums, &done), KVT_OK);
    assert_int_equal(done, 2);
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 2, NULL), 2);
    waiter_t w;
    w_init(&w);
    assert_int_equal(kvt_tier_pin(t, s, NS, NSL, keys, 2, pin_cb, &w), KVT_OK);
    w_wait(&w);
    assert_true(w.out[0].sum == sums[0]);
    assert_true(w.out[1].sum == 0x1234); /* as given: the caller vouched for it */
    kvt_tier_sess_close(t, s);
    w_fini(&w);
    kvt_tier_close(t);
}

/* A renewed lease outlives the tier's lease_ms; a renewal to a short time expires it soon. */
static void test_lease_renew(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(4, 0, KVT_TIER_ADMIT_ALWAYS);
    c.lease_ms = 100;
    kvt_tier_t *t = open_ok(&c);
    kvt_tier_sess_t *s = kvt_tier_sess_open(t);
    assert_int_equal(put(t, 1, false), KVT_OK);
    uint64_t keys[1] = {1};
    waiter_t w;
    w_init(&w);
    assert_int_equal(kvt_tier_pin(t, s, NS, NSL, keys, 1, pin_cb, &w), KVT_OK);
    w_wait(&w);
    assert_int_equal(kvt_tier_sess_renew(t, s, 60000), 1);
    /* well past the tier's 100 ms: an expiry pass releases nothing */
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_int_equal(kvt_tier_expire(t), 0);
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    assert_int_equal(st.ram_pinned, 1);
    /* renewed to 1 ms: the next pass after it releases the pin */
    assert_int_equal(kvt_tier_sess_renew(t, s, 1), 1);
    wait_stat(t, offsetof(kvt_tier_stats_t, lease_expired), 1);
    kvt_tier_stats(t, &st);
    assert_int_equal(st.ram_pinned, 0);
    assert_int_equal(kvt_tier_sess_renew(t, s, 0), 0);
    kvt_tier_sess_close(t, s);
    w_fini(&w);
    kvt_tier_close(t);
}

static void test_durable_restart(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(8, 64, KVT_TIER_ADMIT_SEEN_TWICE);
    kvt_tier_t *t = open_ok(&c);
    for (uint64_t k = 0; k < 20; k++)
        assert_int_equal(put(t, k, true), KVT_OK);
    assert_int_equal(put(t, 3, true), KVT_OK); /* again: already durable */
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    assert_int_equal(st.disk_used, 20);
    assert_int_equal(chg_get(true, KVT_TIER_LOC_DISK), 20);
    /* all 20 readable: 8 in RAM, the rest promoted from NVMe */
    for (uint64_t k = 0; k < 20; k++)
        assert_int_equal(get_check(t, k), KVT_OK);
    kvt_tier_close(t);

    chg_reset();
    t = open_ok(&c);
    assert_int_equal(chg_get(true, KVT_TIER_LOC_DISK), 20); /* reported before open returned */
    kvt_tier_stats(t, &st);
    assert_int_equal(st.restored, 20);
    uint64_t keys[20];
    uint8_t loc[20];
    for (uint64_t k = 0; k < 20; k++)
        keys[k] = k;
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, keys, 20, loc), 20);
    assert_int_equal(loc[0], KVT_TIER_LOC_DISK);
    for (uint64_t k = 0; k < 20; k++)
        assert_int_equal(get_check(t, k), KVT_OK);
    /* a delete is gone after a restart too */
    waiter_t w;
    w_init(&w);
    assert_int_equal(kvt_tier_delete(t, NS, NSL, 5, done_cb, &w), KVT_OK);
    w_wait(&w);
    assert_int_equal(w.st, KVT_OK);
    w_fini(&w);
    kvt_tier_close(t);
    t = open_ok(&c);
    assert_int_equal(get_check(t, 5), KVT_ERR_NOT_FOUND);
    assert_int_equal(get_check(t, 6), KVT_OK);
    /* the store is ours: a second tier on it is refused */
    char err[256];
    kvt_tier_t *t2 = NULL;
    assert_int_not_equal(kvt_tier_open(&c, &t2, err, sizeof(err)), KVT_OK);
    assert_null(t2);
    kvt_tier_close(t);
}

static void test_spill_background(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(8, 64, KVT_TIER_ADMIT_ALWAYS);
    kvt_tier_t *t = open_ok(&c);
    for (uint64_t k = 0; k < 40; k++) {
        assert_int_equal(put(t, k, false), KVT_OK);
        if (k >= 8) /* give the demoter a moment, as engines' steps do */
            wait_stat(t, offsetof(kvt_tier_stats_t, demotions), k - 7);
    }
    size_t found = 0;
    for (uint64_t k = 0; k < 40; k++)
        found += get_check(t, k) == KVT_OK;
    assert_true(found >= 32); /* every block the demoter wrote, at least */
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    assert_true(st.admitted >= 32);
    assert_true(st.read_hist[KVT_TIER_HIST - 1] + st.read_bytes > 0);
    kvt_tier_close(t);
}

static void test_seen_twice_rejects_one_offs(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(8, 64, KVT_TIER_ADMIT_SEEN_TWICE);
    kvt_tier_t *t = open_ok(&c);
    for (uint64_t k = 0; k < 40; k++)
        assert_int_equal(put(t, k, false), KVT_OK);
    wait_stat(t, offsetof(kvt_tier_stats_t, rejected), 1);
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    assert_int_equal(st.admitted, 0);
    assert_int_equal(st.disk_used, 0);
    kvt_tier_close(t);
}

/* Finds the 4 KiB-aligned offset of block @key's first bytes in the store file. */
static off_t find_block(uint64_t key)
{
    uint8_t want[64], buf[4096];
    pattern(key, want, sizeof(want));
    int fd = open(g_disk, O_RDONLY);
    assert_true(fd >= 0);
    off_t at = -1;
    for (off_t off = 4096; pread(fd, buf, sizeof(buf), off) == (ssize_t)sizeof(buf); off += 4096)
        if (memcmp(buf, want, sizeof(want)) == 0) {
            at = off;
            break;
        }
    close(fd);
    return at;
}

static void test_corruption_is_a_miss(void **state)
{
    (void)state;
    kvt_tier_cfg_t c = cfg_of(8, 16, KVT_TIER_ADMIT_ALWAYS);
    kvt_tier_t *t = open_ok(&c);
    assert_int_equal(put(t, 42, true), KVT_OK);
    assert_int_equal(put(t, 43, true), KVT_OK);
    kvt_tier_close(t);
    off_t at = find_block(42);
    assert_true(at > 0);
    int fd = open(g_disk, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, at + 100), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, at + 100), 1);
    fsync(fd);
    close(fd);

    chg_reset();
    t = open_ok(&c);
    assert_int_equal(get_check(t, 42), KVT_ERR_NOT_FOUND);
    assert_int_equal(get_check(t, 43), KVT_OK);
    kvt_tier_stats_t st;
    kvt_tier_stats(t, &st);
    assert_int_equal(st.checksum_failures, 1);
    uint64_t k = 42;
    assert_int_equal(kvt_tier_lookup(t, NS, NSL, &k, 1, NULL), 0);
    assert_int_equal(chg_get(false, KVT_TIER_LOC_DISK), 1);
    kvt_tier_close(t);
    /* and its record is gone for good */
    t = open_ok(&c);
    kvt_tier_stats(t, &st);
    assert_int_equal(st.restored, 1);
    kvt_tier_close(t);
}

#if defined(__SANITIZE_THREAD__)
#define TIERS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TIERS_TSAN 1
#endif
#endif

static void test_kill9_keeps_acknowledged(void **state)
{
    (void)state;
#ifdef TIERS_TSAN
    /* ThreadSanitizer does not support starting threads in a forked child */
    skip();
#endif
    kvt_tier_cfg_t c = cfg_of(8, 256, KVT_TIER_ADMIT_SEEN_TWICE);
    c.on_change = NULL;
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        char err[256];
        kvt_tier_t *t = NULL;
        if (kvt_tier_open(&c, &t, err, sizeof(err)) != KVT_OK)
            _exit(3);
        for (uint64_t k = 1000;; k++) {
            if (put(t, k, true) != KVT_OK)
                _exit(4);
            if (write(pfd[1], &k, sizeof(k)) != (ssize_t)sizeof(k))
                _exit(5);
        }
    }
    close(pfd[1]);
    uint64_t last = 0, k;
    size_t acked = 0;
    while (acked < 40 && read(pfd[0], &k, sizeof(k)) == (ssize_t)sizeof(k)) {
        last = k;
        acked++;
    }
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    close(pfd[0]);
    assert_int_equal(acked, 40);
    assert_true(WIFSIGNALED(status));

    c.on_change = on_change;
    kvt_tier_t *t = open_ok(&c);
    for (k = 1000; k <= last; k++)
        assert_int_equal(get_check(t, k), KVT_OK);
    /* a block in flight at the kill is there whole, or not at all */
    for (k = last + 1; k < last + 8; k++)
        get_check(t, k);
    kvt_tier_close(t);
}

static void test_open_errors(void **state)
{
    (void)state;
    char err[256];
    kvt_tier_t *t = NULL;
    kvt_tier_cfg_t c = cfg_of(8, 16, KVT_TIER_ADMIT_ALWAYS);
    c.data_dir = "";
    assert_int_equal(kvt_tier_open(&c, &t, err, sizeof(err)), KVT_ERR_INVAL);
    assert_true(strlen(err) > 0);
    c = cfg_of(8, 16, KVT_TIER_ADMIT_ALWAYS);
    c.disk_bytes = 4096; /* no room for a slot */
    assert_int_equal(kvt_tier_open(&c, &t, err, sizeof(err)), KVT_ERR_NO_SPACE);
    assert_int_equal(access(g_disk, F_OK), -1); /* nothing left behind */
    c = cfg_of(8, 16, KVT_TIER_ADMIT_ALWAYS);
    char missing[400];
    snprintf(missing, sizeof(missing), "%s/no/such/dir", g_dir);
    c.data_dir = missing;
    assert_int_equal(kvt_tier_open(&c, &t, err, sizeof(err)), KVT_ERR_IO);
    assert_null(t);
    assert_int_equal(access(g_disk, F_OK), -1); /* the store it made is removed again */
    c = cfg_of(0, 0, KVT_TIER_ADMIT_ALWAYS);
    assert_int_equal(kvt_tier_open(&c, &t, err, sizeof(err)), KVT_ERR_INVAL);
}

/*
 * Random puts (some durable), gets, deletes, lookups and pins over a small
 * key space, against a model: a durable block that was not deleted must come
 * back; any block that comes back must be byte-exact; a deleted block must not.
 */
static void test_random_model(void **state)
{
    (void)state;
    enum { KEYS = 48, OPS = 1500 };
    kvt_tier_cfg_t c = cfg_of(6, 64, KVT_TIER_ADMIT_SEEN_TWICE);
    kvt_tier_t *t = open_ok(&c);
    kvt_tier_sess_t *s = kvt_tier_sess_open(t);
    bool must[KEYS] = {false}, gone[KEYS] = {false};
    kvt_rng_t r;
    kvt_rng_init(&r, 17);
    waiter_t w;
    w_init(&w);
    for (int op = 0; op < OPS; op++) {
        uint64_t k = kvt_rng_next(&r) % KEYS;
        switch (kvt_rng_next(&r) % 6) {
        case 0:
        case 1: {
            bool durable = kvt_rng_next(&r) % 3 == 0;
            kvt_status_t st = put(t, k, durable);
            assert_true(st == KVT_OK || st == KVT_ERR_NO_SPACE);
            if (st == KVT_OK) {
                gone[k] = false;
                must[k] = must[k] || durable;
            }
            break;
        }
        case 2:
        case 3: {
            kvt_status_t st = get_check(t, k);
            if (must[k])
                assert_int_equal(st, KVT_OK);
            if (gone[k])
                assert_int_equal(st, KVT_ERR_NOT_FOUND);
            break;
        }
        case 4: {
            kvt_status_t st = kvt_tier_delete(t, NS, NSL, k, done_cb, &w);
            if (st == KVT_OK) {
                w_wait(&w);
                assert_int_equal(w.st, KVT_OK);
                must[k] = false;
                gone[k] = true;
            } else {
                assert_true(st == KVT_ERR_NOT_FOUND || st == KVT_ERR_EXISTS);
                if (st == KVT_ERR_NOT_FOUND)
                    assert_false(must[k]);
            }
            break;
        }
        default: {
            uint64_t keys[4];
            for (int i = 0; i < 4; i++)
                keys[i] = (k + (uint64_t)i) % KEYS;
            assert_int_equal(kvt_tier_pin(t, s, NS, NSL, keys, 4, pin_cb, &w), KVT_OK);
            w_wait(&w);
            for (int i = 0; i < 4; i++) {
                if (w.out[i].slot == KVT_TIER_SLOT_NONE) {
                    if (gone[keys[i]] || !must[keys[i]])
                        continue;
                    /* a durable block is only refused when RAM has no slot to promote into */
                    kvt_tier_stats_t st;
                    kvt_tier_stats(t, &st);
                    assert_true(st.ram_pinned + st.ram_reserved + 4 >= st.ram_slots);
                    continue;
                }
                uint8_t want[BLK];
                pattern(keys[i], want, blen(keys[i]));
                assert_int_equal(w.out[i].len, blen(keys[i]));
                assert_memory_equal(kvt_tier_slot_ptr(t, w.out[i].slot), want, w.out[i].len);
            }
            kvt_tier_unpin(t, s, NS, NSL, keys, 4);
            break;
        }
        }
    }
    kvt_tier_sess_close(t, s);
    kvt_tier_close(t);
    /* after a restart every durable block that was not deleted is back, byte-exact */
    t = open_ok(&c);
    for (uint64_t k = 0; k < KEYS; k++) {
        kvt_status_t st = get_check(t, k);
        if (must[k])
            assert_int_equal(st, KVT_OK);
        if (gone[k])
            assert_int_equal(st, KVT_ERR_NOT_FOUND);
    }
    kvt_tier_close(t);
    w_fini(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ram_lru, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserve_pin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_expiry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_grace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_renew, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_sums, setup, teardown),
        cmocka_unit_test_setup_teardown(test_durable_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spill_background, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seen_twice_rejects_one_offs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corruption_is_a_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill9_keeps_acknowledged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_model, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
