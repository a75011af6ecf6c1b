/*
 * kvindex/zsub_pub: kvtierd's own KV-event stream, read back with a ZMQ SUB
 * and kvindex's msgpack decoder. Which events are republished and how (cache
 * salts with and without a parent, extra seeds, groups); an orphan with a
 * salt gets the same keys downstream as here; a batch whose encoding runs out
 * of memory is neither sent nor buffered, is counted, and spends its seq.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>
#include <zmq.h>

#include "kvindex/event.h"
#include "kvindex/zsub.h"
#include "tests/support/events.h"
#include "tests/support/fail_alloc.h"

#define BIG ((size_t)1 << 40)

typedef struct fix {
    kvt_idx_t *idx;
    kvt_zsub_t *z;
    void *zctx, *sub;
    uint32_t tok[4096];
} fix_t;

static kvt_evbatch_t batch_of(kvt_event_t *ev, size_t n)
{
    return (kvt_evbatch_t){.pod = "a", .model = "m", .ev = ev, .nev = n};
}

/*
 * The next message on the SUB within @timeout_ms, decoded into *@b (vLLM
 * format) with its seq; false when none came.
 */
static bool recv_batch(fix_t *f, int timeout_ms, uint64_t *seq_p, kvt_evbatch_t *b)
{
    zmq_pollitem_t it = {f->sub, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return false;
    zmq_msg_t m[3];
    for (int i = 0; i < 3; i++) {
        zmq_msg_init(&m[i]);
        assert_true(zmq_msg_recv(&m[i], f->sub, 0) >= 0);
        assert_int_equal(zmq_msg_more(&m[i]), i < 2);
    }
    assert_int_equal(zmq_msg_size(&m[1]), 8);
    const uint8_t *s8 = zmq_msg_data(&m[1]);
    uint64_t seq = 0;
    for (int i = 0; i < 8; i++)
        seq = seq << 8 | s8[i];
    *seq_p = seq;
    char err[256];
    kvt_status_t st = kvt_ev_msgpack_decode(zmq_msg_data(&m[2]), zmq_msg_size(&m[2]),
                                            KVT_EV_FMT_VLLM, "a", "m", 0, BIG, b, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("published payload does not decode: %s", err);
    assert_string_equal(err, "");
    for (int i = 0; i < 3; i++)
        zmq_msg_close(&m[i]);
    return true;
}

static int setup(void **state)
{
    static fix_t f;
    memset(&f, 0, sizeof(f));
    kvt_zsub_config_t cfg;
    kvt_zsub_config_default(&cfg);
    char err[256];
    if (kvt_idx_create(NULL, &f.idx) != KVT_OK || kvt_zsub_create(f.idx, &cfg, &f.z) != KVT_OK ||
        kvt_zsub_publish_open(f.z, "tcp://127.0.0.1:*", "", 8, err, sizeof(err)) != KVT_OK)
        return -1;
    kvt_zsub_pub_info_t info;
    kvt_zsub_publish_info(f.z, &info);
    int zero = 0;
    f.zctx = zmq_ctx_new();
    f.sub = zmq_socket(f.zctx, ZMQ_SUB);
    if (f.sub == NULL || zmq_setsockopt(f.sub, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(f.sub, ZMQ_SUBSCRIBE, "", 0) != 0 || zmq_connect(f.sub, info.endpoint) != 0)
        return -1;
    for (uint32_t i = 0; i < 4096; i++)
        f.tok[i] = 7 + i * 13;
    /* the SUB has joined once an empty batch comes through; then nothing is left to read */
    kvt_evbatch_t empty = batch_of(NULL, 0), got;
    uint64_t seq;
    bool joined = false;
    for (int i = 0; i < 200 && !joined; i++) {
        kvt_zsub_publish(f.z, &empty);
        joined = recv_batch(&f, 50, &seq, &got);
        if (joined)
            kvt_evbatch_cleanup(&got);
    }
    while (recv_batch(&f, 100, &seq, &got))
        kvt_evbatch_cleanup(&got);
    *state = &f;
    return joined ? 0 : -1;
}

static int teardown(void **state)
{
    fix_t *f = *state;
    zmq_close(f->sub);
    zmq_ctx_term(f->zctx);
    kvt_zsub_destroy(f->z);
    kvt_idx_destroy(f->idx);
    return 0;
}

/* What is republished, as the decoder reads it back. */
static void test_events_as_published(void **state)
{
    fix_t *f = *state;
    static const uint64_t h01[] = {1, 2}, h2[] = {3}, h3[] = {4}, h4[] = {5};
    static const uint64_t seeds[] = {0xabcull};
    kvt_event_t ev[8] = {
        test_stored(h01, 2, f->tok, 4),
        test_stored(h2, 1, f->tok + 8, 4),
        test_stored(h3, 1, f->tok, 4),
        {.type = KVT_EV_BAD, .may_remove = true, .group = -1},
        test_stored(h4, 1, f->tok, 4),
        test_stored(h4, 1, f->tok, 4),
        test_stored(h4, 1, f->tok, 4),
        {.type = KVT_EV_REMOVED, .tier = KVT_TIER_CPU, .nhashes = 1, .hashes = h4, .group = 1}};
    ev[0].cache_salt = ev[1].cache_salt = "t-1";
    ev[0].cache_salt_len = ev[1].cache_salt_len = 3;
    ev[1].has_parent = true;
    ev[1].parent = 2;
    ev[2].extra_seeds = seeds;
    ev[4].skip = KVT_EV_SKIP_MEDIUM;
    ev[4].tier = 0;
    ev[5].skip = KVT_EV_SKIP_REMOTE;
    ev[6].group = 1;
    ev[6].group_kind = KVT_EV_GROUP_OTHER;
    kvt_evbatch_t b = batch_of(ev, 8);
    assert_int_equal(kvt_zsub_publish(f->z, &b), KVT_OK);
    kvt_evbatch_t got;
    uint64_t seq;
    assert_true(recv_batch(f, 5000, &seq, &got));
    assert_int_equal(got.nev, 5); /* not the bad, unknown-medium and REMOTE events */
    assert_int_equal(got.unknown, 0);
    const kvt_event_t *g = got.ev;
    assert_true(g[0].type == KVT_EV_STORED && !g[0].has_parent && g[0].nhashes == 2);
    assert_string_equal(g[0].cache_salt, "t-1");
    assert_null(g[0].extra_seeds);
    /* a salt with a parent too: a subscriber that does not know the parent needs it */
    assert_true(g[1].has_parent && g[1].parent == 2);
    assert_non_null(g[1].cache_salt);
    assert_string_equal(g[1].cache_salt, "t-1");
    assert_true(g[2].cache_salt == NULL && g[2].extra_seeds != NULL && g[2].extra_seeds[0] != 0);
    assert_true(g[3].type == KVT_EV_STORED && g[3].group == 1 &&
                g[3].group_kind == KVT_EV_GROUP_OTHER);
    assert_true(g[4].type == KVT_EV_REMOVED && g[4].group == 1 && g[4].tier == KVT_TIER_CPU);
    kvt_evbatch_cleanup(&got);
}

/* The key pod "a" has for engine hash @h in @idx (base namespace of "m"). */
static uint64_t key_of(kvt_idx_t *idx, uint64_t h)
{
    uint32_t ns, pod;
    uint64_t k = 0;
    assert_int_equal(kvt_idx_ns_get(idx, "m", NULL, 0, &ns), KVT_OK);
    assert_int_equal(kvt_idx_pod_find(idx, "a", 0, &pod), KVT_OK);
    assert_int_equal(kvt_idx_pod_key(idx, pod, ns, h, &k), KVT_OK);
    return k;
}

/* An orphan with a salt is salted here; a subscriber gets the same keys. */
static void test_orphan_salt_downstream(void **state)
{
    fix_t *f = *state;
    static const uint64_t h[] = {11, 12};
    kvt_event_t e = test_stored(h, 2, f->tok, 4);
    e.has_parent = true;
    e.parent = 999; /* no pod knows it */
    e.cache_salt = "tenant";
    e.cache_salt_len = 6;
    kvt_evbatch_t b = batch_of(&e, 1);
    kvt_ev_counters_t c = {0};
    char err[200];
    assert_int_equal(kvt_ev_apply(f->idx, NULL, &b, 4, KVT_EV_STRICT, &c, err, sizeof(err)),
                     KVT_OK);
    assert_int_equal(c.orphans, 1);
    assert_int_equal(kvt_zsub_publish(f->z, &b), KVT_OK);
    kvt_evbatch_t got;
    uint64_t seq;
    assert_true(recv_batch(f, 5000, &seq, &got));
    kvt_idx_t *down;
    assert_int_equal(kvt_idx_create(NULL, &down), KVT_OK);
    memset(&c, 0, sizeof(c));
    assert_int_equal(kvt_ev_apply(down, NULL, &got, 4, 0, &c, err, sizeof(err)), KVT_OK);
    assert_int_equal(c.orphans, 1);
    assert_true(key_of(down, 11) == key_of(f->idx, 11));
    assert_true(key_of(down, 12) == key_of(f->idx, 12));
    kvt_idx_destroy(down);
    kvt_evbatch_cleanup(&got);
}

/* The buffer cannot grow mid-batch: nothing is sent or buffered, the seq is spent. */
static void test_encode_out_of_memory(void **state)
{
    fix_t *f = *state;
    static uint64_t h[256];
    for (uint32_t i = 0; i < 256; i++)
        h[i] = 100 + i;
    kvt_event_t small = test_stored(h, 1, f->tok, 16), big = test_stored(h, 256, f->tok, 16);
    kvt_evbatch_t bs = batch_of(&small, 1), bb = batch_of(&big, 1), got;
    uint64_t seq, first;
    assert_int_equal(kvt_zsub_publish(f->z, &bs), KVT_OK); /* the buffer holds 8 KiB now */
    assert_true(recv_batch(f, 5000, &first, &got));
    kvt_evbatch_cleanup(&got);
    kvt_zsub_pub_info_t before, after;
    kvt_zsub_publish_info(f->z, &before);
    unsigned long failed = fail_alloc_failed;
    fail_alloc_at(1); /* ~12 KiB of tokens: the buffer grows mid-batch, and cannot */
    assert_int_equal(kvt_zsub_publish(f->z, &bb), KVT_ERR_NO_MEM);
    assert_int_equal(fail_alloc_failed, failed + 1);
    kvt_zsub_publish_info(f->z, &after);
    assert_int_equal(after.send_failures, before.send_failures + 1);
    assert_int_equal(after.batches, before.batches + 1);
    assert_int_equal(after.buffered, before.buffered);
    assert_false(recv_batch(f, 200, &seq, &got));
    /* the next batch goes out after a gap; the big one fits once memory is back */
    assert_int_equal(kvt_zsub_publish(f->z, &bs), KVT_OK);
    assert_true(recv_batch(f, 5000, &seq, &got));
    assert_true(seq == first + 2);
    kvt_evbatch_cleanup(&got);
    assert_int_equal(kvt_zsub_publish(f->z, &bb), KVT_OK);
    assert_true(recv_batch(f, 5000, &seq, &got));
    assert_true(seq == first + 3 && got.nev == 1 && got.ev[0].ntokens == 4096);
    assert_memory_equal(got.ev[0].tokens, f->tok, 4096 * sizeof(uint32_t));
    kvt_evbatch_cleanup(&got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_events_as_published, setup, teardown),
        cmocka_unit_test_setup_teardown(test_orphan_salt_downstream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_encode_out_of_memory, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
