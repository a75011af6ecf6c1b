/*
 * kvindex/event_msgpack: vLLM and SGLang KV-event batches. Every batch form
 * (arrays with and without dp_rank, maps), both event forms (positional
 * arrays per format, maps), every hash form (uint64, int64, bytes under each
 * format), SGLang's metadata, extra keys and cache salts, mediums, groups and
 * locality, placeholders, defaults, unknown counting, every malformed event
 * (skipped alone as KVT_EV_BAD, marked when it may have been a removal),
 * every batch-level error (the batch left untouched), the raw-byte checks
 * that keep msgpack-c from huge allocations, random batches packed in
 * random forms, decoded and compared with what was packed, and extra keys
 * that give the same seeds as the same keys in a JSON event (docs/api.md's
 * canonical form).
 * KVT_TEST_SEED=<n> draws other random batches, or replays a printed seed
 * (tests/support/rng.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvindex/event.h"
#include "tests/support/rng.h"

#include <xxhash.h>

#define BIG ((size_t)1 << 40)

/* ---- packing ---------------------------------------------------------------------------- */

/*
 * Packs values by @fmt, one letter each (spaces ignored): a array (u32 size),
 * m map (u32 pairs), s str (const char *), u uint64, i int64, n nil,
 * d float64, f float32 (double arg), t true, F false, b bin (const void *, size_t).
 */
static void pk(msgpack_sbuffer *sb, const char *fmt, ...)
{
    msgpack_packer p;
    msgpack_packer_init(&p, sb, msgpack_sbuffer_write);
    va_list ap;
    va_start(ap, fmt);
    for (const char *c = fmt; *c; c++) {
        switch (*c) {
        case ' ': break;
        case 'a': msgpack_pack_array(&p, va_arg(ap, uint32_t)); break;
        case 'm': msgpack_pack_map(&p, va_arg(ap, uint32_t)); break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            msgpack_pack_str(&p, strlen(s));
            msgpack_pack_str_body(&p, s, strlen(s));
            break;
        }
        case 'u': msgpack_pack_uint64(&p, va_arg(ap, uint64_t)); break;
        case 'i': msgpack_pack_int64(&p, va_arg(ap, int64_t)); break;
        case 'n': msgpack_pack_nil(&p); break;
        case 'd': msgpack_pack_double(&p, va_arg(ap, double)); break;
        case 'f': msgpack_pack_float(&p, (float)va_arg(ap, double)); break;
        case 't': msgpack_pack_true(&p); break;
        case 'F': msgpack_pack_false(&p); break;
        case 'b': {
            const void *v = va_arg(ap, const void *);
            size_t n = va_arg(ap, size_t);
            msgpack_pack_bin(&p, n);
            msgpack_pack_bin_body(&p, v, n);
            break;
        }
        default: fail_msg("pk: bad letter '%c'", *c);
        }
    }
    va_end(ap);
}

static void decode_fmt_ok(const msgpack_sbuffer *sb, kvt_ev_format_t fmt, kvt_evbatch_t *b)
{
    char err[256] = "unset";
    kvt_status_t st =
        kvt_ev_msgpack_decode(sb->data, sb->size, fmt, "pod-a", "m", 7, BIG, b, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("decode: status %d (%s)", st, err);
    assert_string_equal(b->pod, "pod-a");
    assert_string_equal(b->model, "m");
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        assert_true((e->hashes == NULL) == (e->nhashes == 0));
        assert_true((e->tokens == NULL) == (e->ntokens == 0));
        assert_true((uintptr_t)e->hashes % 8 == 0 && (uintptr_t)e->tokens % 4 == 0);
        if (e->ntokens > 0)
            assert_int_equal((uint64_t)e->ntokens, (uint64_t)e->block_size * e->nhashes);
    }
}

static void decode_ok(const msgpack_sbuffer *sb, kvt_evbatch_t *b)
{
    decode_fmt_ok(sb, KVT_EV_FMT_VLLM, b);
}

/* Decoding @sb fails with @want_st, a message containing @want_msg, and the batch untouched. */
static void decode_err_max(const msgpack_sbuffer *sb, size_t max_items, kvt_status_t want_st,
                           const char *want_msg)
{
    kvt_evbatch_t b;
    memset(&b, 0xa5, sizeof(b));
    kvt_evbatch_t before = b;
    char err[256] = "unset";
    kvt_status_t st = kvt_ev_msgpack_decode(sb->data, sb->size, KVT_EV_FMT_VLLM, "p", "m", 0,
                                            max_items, &b, err, sizeof(err));
    if (st != want_st || strstr(err, want_msg) == NULL)
        fail_msg("want status %d with '%s', got %d '%s'", want_st, want_msg, st, err);
    assert_memory_equal(&b, &before, sizeof(b));
}

static void decode_err(const msgpack_sbuffer *sb, kvt_status_t want_st, const char *want_msg)
{
    decode_err_max(sb, BIG, want_st, want_msg);
}

/* Decoding raw bytes @p[@n] fails with @want_st and @want_msg. */
static void raw_err(const char *p, size_t n, kvt_status_t want_st, const char *want_msg)
{
    msgpack_sbuffer sb = {.size = n, .data = (char *)(uintptr_t)p, .alloc = n};
    decode_err(&sb, want_st, want_msg);
}

/*
 * Decoding @sb succeeds; event @i is KVT_EV_BAD with @may_remove, the message
 * contains @want_msg, and @nev events came out.
 */
static void decode_bad_fmt(const msgpack_sbuffer *sb, kvt_ev_format_t fmt, size_t nev, size_t i,
                           bool may_remove, const char *want_msg)
{
    kvt_evbatch_t b;
    char err[256] = "unset";
    kvt_status_t st =
        kvt_ev_msgpack_decode(sb->data, sb->size, fmt, "p", "m", 0, BIG, &b, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("decode: status %d (%s), want a bad event '%s'", st, err, want_msg);
    if (b.nev != nev || b.ev[i].type != KVT_EV_BAD || b.ev[i].may_remove != may_remove ||
        strstr(err, want_msg) == NULL)
        fail_msg("want %zu events, [%zu] bad (may_remove %d) with '%s'; got %zu, type %d (%d) '%s'",
                 nev, i, may_remove, want_msg, b.nev, i < b.nev ? (int)b.ev[i].type : -1,
                 i < b.nev ? (int)b.ev[i].may_remove : -1, err);
    assert_int_equal(b.ev[i].nhashes, 0);
    kvt_evbatch_cleanup(&b);
}

static void decode_bad(const msgpack_sbuffer *sb, size_t nev, size_t i, bool may_remove,
                       const char *want_msg)
{
    decode_bad_fmt(sb, KVT_EV_FMT_VLLM, nev, i, may_remove, want_msg);
}

/* ---- fixed cases ------------------------------------------------------------------------- */

static void test_stored_array_form(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    /* vLLM <= v0.25: every positional field, then the batch's dp_rank */
    pk(&sb, "a d a a s a uu u a uuuu u n s s n u s n", 3, 1700000000.25, 1, 12, "BlockStored", 2,
       (uint64_t)11, UINT64_MAX, (uint64_t)10, 4, (uint64_t)1, (uint64_t)2, (uint64_t)3,
       (uint64_t)4, (uint64_t)2, "GPU", "adapter", (uint64_t)0, "full_attention");
    pk(&sb, "u", (uint64_t)3);
    kvt_evbatch_t b;
    decode_ok(&sb, &b);
    assert_int_equal(b.dp_rank, 3);
    assert_int_equal(b.nev, 1);
    assert_int_equal(b.unknown, 0);
    const kvt_event_t *e = &b.ev[0];
    assert_int_equal(e->type, KVT_EV_STORED);
    assert_int_equal(e->tier, KVT_TIER_GPU);
    assert_int_equal(e->nhashes, 2);
    assert_true(e->hashes[0] == 11 && e->hashes[1] == UINT64_MAX);
    assert_true(e->has_parent && e->parent == 10);
    assert_int_equal(e->ntokens, 4);
    assert_int_equal(e->tokens[3], 4);
    assert_int_equal(e->block_size, 2);
    assert_string_equal(e->lora_name, "adapter");
    assert_int_equal(e->group, 0);
    assert_int_equal(e->group_kind, KVT_EV_GROUP_FULL);
    assert_int_equal(e->skip, KVT_EV_SKIP_NONE);
    assert_null(e->cache_salt);
    assert_null(e->extra_seeds);
    assert_null(b.lora);
    kvt_evbatch_cleanup(&b);
    assert_null(b.arena);

    /* trailing defaults omitted; no dp_rank: the stream's */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u", 2, 1.0, 1, 2, "BlockStored", 1, (uint64_t)5);
    decode_ok(&sb, &b);
    assert_int_equal(b.dp_rank, 7);
    e = &b.ev[0];
    assert_true(e->nhashes == 1 && e->hashes[0] == 5 && !e->has_parent && e->ntokens == 0);
    assert_int_equal(e->block_size, 0);
    assert_null(e->lora_name);
    assert_int_equal(e->group, -1);
    assert_int_equal(e->group_kind, KVT_EV_GROUP_ANY);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_destroy(&sb);
}

static void test_batch_forms(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    kvt_evbatch_t b;
    /* vLLM's EventBatch without array_like: a map, events as maps, keys in any order */
    pk(&sb, "m s a m s s s a u s d s u", 3, "events", 1, 2, "type", "BlockRemoved", "block_hashes",
       1, (uint64_t)8, "ts", 12.5, "data_parallel_rank", (uint64_t)2);
    decode_ok(&sb, &b);
    assert_int_equal(b.dp_rank, 2);
    assert_true(b.nev == 1 && b.ev[0].type == KVT_EV_REMOVED && b.ev[0].hashes[0] == 8);
    kvt_evbatch_cleanup(&b);
    /* ... with positional events, no rank (the stream's), an unknown key counted */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s u s a a s s n", 3, "ts", (uint64_t)5, "events", 1, 1, "AllBlocksCleared",
       "x_batch_field", "data_parallel_rank");
    decode_ok(&sb, &b);
    assert_int_equal(b.dp_rank, 7);
    assert_int_equal(b.unknown, 1);
    assert_true(b.nev == 1 && b.ev[0].type == KVT_EV_CLEARED);
    kvt_evbatch_cleanup(&b);
    /* SGLang names the rank attn_dp_rank; a nil rank keeps the stream's */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s d s a s u", 3, "ts", 0.0, "events", 0, "attn_dp_rank", (uint64_t)4);
    decode_ok(&sb, &b);
    assert_true(b.dp_rank == 4 && b.nev == 0);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s d s a s n", 3, "ts", 0.0, "events", 0, "data_parallel_rank");
    decode_ok(&sb, &b);
    assert_int_equal(b.dp_rank, 7);
    kvt_evbatch_cleanup(&b);
    /* array batches: [ts, events], [ts, events, rank], a nil rank, extra fields counted */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a u a m s s", 2, (uint64_t)1, 1, 1, "type", "AllBlocksCleared");
    decode_ok(&sb, &b);
    assert_true(b.dp_rank == 7 && b.nev == 1);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a i a n s", 4, (int64_t)-1, 0, "extra");
    decode_ok(&sb, &b);
    assert_true(b.dp_rank == 7 && b.unknown == 1);
    kvt_evbatch_cleanup(&b);
    /* batch-level errors: the whole batch is refused */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s d", 1, "ts", 0.0);
    decode_err(&sb, KVT_ERR_INVAL, "a batch map needs \"ts\" and \"events\"");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s a", 1, "events", 0);
    decode_err(&sb, KVT_ERR_INVAL, "needs \"ts\"");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s d s a s a", 3, "ts", 0.0, "events", 0, "events", 0);
    decode_err(&sb, KVT_ERR_INVAL, "batch field 'events' given twice");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s s s a", 2, "ts", "now", "events", 0);
    decode_err(&sb, KVT_ERR_INVAL, "batch ts: want a number");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s d s m", 2, "ts", 0.0, "events", 0);
    decode_err(&sb, KVT_ERR_INVAL, "batch events: want an array");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "m s d s a s s", 3, "ts", 0.0, "events", 0, "data_parallel_rank", "0");
    decode_err(&sb, KVT_ERR_INVAL, "batch dp_rank");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "s", "batch");
    decode_err(&sb, KVT_ERR_INVAL, "a batch is an array [ts, events, dp_rank?] or a map");
    msgpack_sbuffer_destroy(&sb);
}

static void test_mediums(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        unsigned tier;
    } known[] = {{"GPU", KVT_TIER_GPU},        {"CPU", KVT_TIER_CPU},   {"STORAGE", KVT_TIER_DISK},
                 {"CPU_PINNED", KVT_TIER_CPU}, {"DISK", KVT_TIER_DISK}, {"EXTERNAL", KVT_TIER_DISK},
                 {"gpu", KVT_TIER_GPU},        {"NVMe", KVT_TIER_DISK}};
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    kvt_evbatch_t b;
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        msgpack_sbuffer_clear(&sb);
        pk(&sb, "a d a a s a u s", 2, 0.0, 1, 3, "BlockRemoved", 1, (uint64_t)1, known[i].name);
        decode_fmt_ok(&sb, i % 2 ? KVT_EV_FMT_SGLANG : KVT_EV_FMT_VLLM, &b);
        assert_int_equal(b.ev[0].tier, known[i].tier);
        assert_int_equal(b.ev[0].skip, KVT_EV_SKIP_NONE);
        kvt_evbatch_cleanup(&b);
    }
    /* an unknown medium skips that event only; its name is kept (cut to 32 bytes) for counting */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a", 2, 0.0, 4);
    pk(&sb, "a s a u s", 3, "BlockRemoved", 1, (uint64_t)1, "HBM3");
    pk(&sb, "a s a u n a u u n s", 7, "BlockStored", 1, (uint64_t)2, 1, (uint64_t)1, (uint64_t)1,
       "A_MEDIUM_NAME_OF_MORE_THAN_32_BYTES");
    pk(&sb, "m s s s a u s s", 3, "type", "BlockStored", "block_hashes", 1, (uint64_t)3, "medium",
       "TAPE");
    pk(&sb, "a s a u s", 3, "BlockRemoved", 1, (uint64_t)4, "CPU");
    decode_ok(&sb, &b);
    assert_int_equal(b.nev, 4);
    assert_int_equal(b.unknown, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(b.ev[i].skip, KVT_EV_SKIP_MEDIUM);
        assert_int_equal(b.ev[i].tier, 0);
        assert_int_equal(b.ev[i].nhashes, 0);
    }
    assert_true(b.ev[0].medium_len == 4 && memcmp(b.ev[0].medium, "HBM3", 4) == 0);
    assert_true(b.ev[1].medium_len == KVT_EV_MEDIUM_NAME_MAX &&
                memcmp(b.ev[1].medium, "A_MEDIUM_NAME_OF_MORE_THAN_32_BY", 32) == 0);
    assert_true(b.ev[2].medium_len == 4 && memcmp(b.ev[2].medium, "TAPE", 4) == 0);
    assert_true(b.ev[3].tier == KVT_TIER_CPU && b.ev[3].hashes[0] == 4);
    kvt_evbatch_cleanup(&b);
    /* not inside a UTF-8 character: as the JSON decoder cuts it */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u s", 2, 0.0, 1, 3, "BlockRemoved", 1, (uint64_t)1,
       "a-medium-name-of-31-bytes-then-\xc3\xa9");
    decode_ok(&sb, &b);
    assert_true(b.ev[0].medium_len == 31 &&
                memcmp(b.ev[0].medium, "a-medium-name-of-31-bytes-then-", 31) == 0);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_destroy(&sb);
}

static void test_groups_and_locality(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    kvt_evbatch_t b;
    static const struct {
        const char *kind;
        uint8_t want;
    } kinds[] = {
        {"full_attention", KVT_EV_GROUP_FULL},           {"mla_attention", KVT_EV_GROUP_FULL},
        {"sink_full_attention", KVT_EV_GROUP_FULL},      {"sliding_window", KVT_EV_GROUP_OTHER},
        {"sliding_window_mla", KVT_EV_GROUP_OTHER},      {"mamba", KVT_EV_GROUP_OTHER},
        {"chunked_local_attention", KVT_EV_GROUP_OTHER}, {"unknown", KVT_EV_GROUP_ANY},
        {"some_future_kind", KVT_EV_GROUP_ANY}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        msgpack_sbuffer_clear(&sb);
        /* vLLM's positional BlockStored to kv_cache_spec_kind, and the map form */
        pk(&sb, "a d a", 2, 0.0, 2);
        pk(&sb, "a s a u n a u u n n n n u s", 11, "BlockStored", 1, (uint64_t)1, 1, (uint64_t)5,
           (uint64_t)1, (uint64_t)3, kinds[i].kind);
        pk(&sb, "m s s s a u s u s s", 4, "type", "BlockStored", "block_hashes", 1, (uint64_t)2,
           "group_idx", (uint64_t)1, "kv_cache_spec_kind", kinds[i].kind);
        decode_ok(&sb, &b);
        assert_true(b.ev[0].group == 3 && b.ev[0].group_kind == kinds[i].want);
        assert_true(b.ev[1].group == 1 && b.ev[1].group_kind == kinds[i].want);
        kvt_evbatch_cleanup(&b);
    }
    /* BlockRemoved: [type, hashes, medium, group_idx, locality, ownership] */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a", 2, 0.0, 4);
    pk(&sb, "a s a u n u", 4, "BlockRemoved", 1, (uint64_t)1, (uint64_t)2);
    pk(&sb, "a s a u s u s s", 6, "BlockRemoved", 1, (uint64_t)2, "GPU", (uint64_t)0, "REMOTE",
       "owner");
    pk(&sb, "a s a u n n n n n n n n n n s", 13, "BlockStored", 1, (uint64_t)3, "remote");
    pk(&sb, "m s s s a u s s", 3, "type", "BlockStored", "block_hashes", 1, (uint64_t)4, "locality",
       "LOCAL");
    decode_ok(&sb, &b);
    assert_int_equal(b.unknown, 0);
    assert_true(b.ev[0].group == 2 && b.ev[0].skip == KVT_EV_SKIP_NONE);
    assert_true(b.ev[1].group == 0 && b.ev[1].skip == KVT_EV_SKIP_REMOTE);
    assert_int_equal(b.ev[2].skip, KVT_EV_SKIP_REMOTE);
    assert_true(b.ev[3].skip == KVT_EV_SKIP_NONE && b.ev[3].hashes[0] == 4);
    kvt_evbatch_cleanup(&b);
    /* wrong types make the event bad */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n i", 2, 0.0, 1, 4, "BlockRemoved", 1, (uint64_t)1, (int64_t)-1);
    decode_bad(&sb, 1, 0, true, "group_idx: want a non-negative integer");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n n u", 2, 0.0, 1, 5, "BlockRemoved", 1, (uint64_t)1, (uint64_t)1);
    decode_bad(&sb, 1, 0, true, "locality: want a string");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a u s u", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)1, "kv_cache_spec_kind", (uint64_t)1);
    decode_bad(&sb, 1, 0, false, "kv_cache_spec_kind: want a string");
    msgpack_sbuffer_destroy(&sb);
}

static void test_stored_map_form(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    /* v0.26+: keys in any order, defaults left out, a nil dp_rank */
    pk(&sb, "a d a m s a uuuu s s s a u s u s u", 3, 2.5, 1, 5, "token_ids", 4, (uint64_t)9,
       (uint64_t)8, (uint64_t)7, (uint64_t)6, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)42, "block_size", (uint64_t)4, "group_idx", (uint64_t)1);
    pk(&sb, "n");
    kvt_evbatch_t b;
    decode_ok(&sb, &b);
    assert_int_equal(b.dp_rank, 7);
    assert_int_equal(b.nev, 1);
    assert_int_equal(b.unknown, 0); /* group_idx is known, not used */
    const kvt_event_t *e = &b.ev[0];
    assert_true(e->type == KVT_EV_STORED && e->nhashes == 1 && e->hashes[0] == 42);
    assert_true(e->ntokens == 4 && e->tokens[0] == 9 && e->block_size == 4 && !e->has_parent);
    kvt_evbatch_cleanup(&b);

    /* block_size left out: derived from token_ids / block_hashes; a float32 ts */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a f a m s s s a uu s a uuuuuu", 2, 1.5, 1, 3, "type", "BlockStored", "block_hashes", 2,
       (uint64_t)1, (uint64_t)2, "token_ids", 6, (uint64_t)1, (uint64_t)2, (uint64_t)3, (uint64_t)4,
       (uint64_t)5, (uint64_t)6);
    decode_ok(&sb, &b);
    assert_int_equal(b.ev[0].block_size, 3);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_destroy(&sb);
}

static void test_hash_forms(void **state)
{
    (void)state;
    uint8_t d32[32], d16[16];
    for (int i = 0; i < 32; i++)
        d32[i] = (uint8_t)(0x10 + i);
    for (int i = 0; i < 16; i++)
        d16[i] = (uint8_t)(0xf0 + i);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pk(&sb, "a d a a s a i b b b u", 2, 0.0, 1, 2, "BlockRemoved", 5, (int64_t)-2, d32, (size_t)32,
       d16, (size_t)16, d32, (size_t)3, (uint64_t)1 << 63);
    kvt_evbatch_t b;
    decode_fmt_ok(&sb, KVT_EV_FMT_VLLM, &b);
    const uint64_t *h = b.ev[0].hashes;
    assert_true(h[0] == UINT64_MAX - 1);        /* two's complement */
    assert_true(h[1] == 0x28292a2b2c2d2e2full); /* the last 8 bytes, big-endian */
    assert_true(h[2] == 0xf8f9fafbfcfdfeffull); /* 16-byte xxhash digest likewise */
    assert_true(h[3] == 0x101112ull);           /* fewer than 8: all of them */
    assert_true(h[4] == (uint64_t)1 << 63);
    kvt_evbatch_cleanup(&b);
    decode_fmt_ok(&sb, KVT_EV_FMT_SGLANG, &b);
    h = b.ev[0].hashes;
    assert_true(h[0] == UINT64_MAX - 1);
    assert_true(h[1] == 0x1011121314151617ull); /* SGLang: the first 8 bytes */
    assert_true(h[2] == 0xf0f1f2f3f4f5f6f7ull);
    assert_true(h[3] == 0x101112ull);
    kvt_evbatch_cleanup(&b);

    /* a parent as bytes or int64 too */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u b", 2, 0.0, 1, 3, "BlockStored", 1, (uint64_t)1, d32, (size_t)32);
    decode_ok(&sb, &b);
    assert_true(b.ev[0].has_parent && b.ev[0].parent == 0x28292a2b2c2d2e2full);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_destroy(&sb);
}

static void test_placeholder_removed_cleared(void **state)
{
    (void)state;
    uint8_t d32[32] = {0};
    d32[31] = 9;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    /* vLLM CPU offload: token_ids [], block_size 0, raw bytes, medium "CPU" */
    pk(&sb, "a d a", 3, 0.0, 4);
    pk(&sb, "a s a b n a u n s", 7, "BlockStored", 1, d32, (size_t)32, 0, (uint64_t)0, "CPU");
    pk(&sb, "m s s s a u s s", 3, "type", "BlockRemoved", "block_hashes", 1, (uint64_t)4, "medium",
       "cpu");
    pk(&sb, "a s a u s u", 4, "BlockRemoved", 1, (uint64_t)5, "DISK", (uint64_t)0);
    pk(&sb, "a s", 1, "AllBlocksCleared");
    pk(&sb, "u", (uint64_t)0);
    kvt_evbatch_t b;
    decode_ok(&sb, &b);
    assert_int_equal(b.nev, 4);
    assert_int_equal(b.dp_rank, 0);
    assert_true(b.ev[0].type == KVT_EV_STORED && b.ev[0].tier == KVT_TIER_CPU);
    assert_true(b.ev[0].ntokens == 0 && b.ev[0].block_size == 0 && b.ev[0].hashes[0] == 9);
    assert_true(b.ev[1].type == KVT_EV_REMOVED && b.ev[1].tier == KVT_TIER_CPU);
    assert_true(b.ev[1].hashes[0] == 4);
    assert_true(b.ev[2].type == KVT_EV_REMOVED && b.ev[2].tier == KVT_TIER_DISK);
    assert_true(b.ev[3].type == KVT_EV_CLEARED && b.ev[3].nhashes == 0);
    kvt_evbatch_cleanup(&b);

    /* an empty events array, and an empty BlockRemoved */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a", 2, 0.0, 0);
    decode_ok(&sb, &b);
    assert_true(b.nev == 0 && b.ev == NULL);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a", 2, 0.0, 1, 2, "BlockRemoved", 0);
    decode_ok(&sb, &b);
    assert_true(b.nev == 1 && b.ev[0].nhashes == 0);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_destroy(&sb);
}

static void test_unknown_counting(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pk(&sb, "a d a", 4, 0.0, 6);
    pk(&sb, "a s u", 2, "BlockMoved", (uint64_t)1);              /* unknown type: 1 */
    pk(&sb, "m s s s u", 2, "type", "Future", "x", (uint64_t)1); /* unknown type: 1 */
    pk(&sb, "a s a u n u n n u u", 8, "BlockRemoved", 1, (uint64_t)1, (uint64_t)0, (uint64_t)0,
       (uint64_t)0); /* two fields past ownership: 2 */
    pk(&sb, "m s s s a u s u s s", 4, "type", "BlockRemoved", "block_hashes", 1, (uint64_t)2,
       "token_ids", (uint64_t)1, "new_field", "x"); /* token_ids means nothing here, new: 2 */
    pk(&sb, "a s a u n n n n s", 7, "BlockStored", 1, (uint64_t)3, "REMOTE");   /* kept, skipped */
    pk(&sb, "m s s s u", 2, "type", "AllBlocksCleared", "medium", (uint64_t)0); /* field: 1 */
    pk(&sb, "u s", (uint64_t)1, "extra batch field");                           /* 1 */
    kvt_evbatch_t b;
    decode_ok(&sb, &b);
    assert_int_equal(b.nev, 4);
    assert_int_equal(b.unknown, 8);
    assert_true(b.ev[0].type == KVT_EV_REMOVED && b.ev[0].hashes[0] == 1);
    assert_true(b.ev[1].type == KVT_EV_REMOVED && b.ev[1].hashes[0] == 2);
    assert_true(b.ev[2].type == KVT_EV_STORED && b.ev[2].skip == KVT_EV_SKIP_MEDIUM);
    assert_int_equal(b.ev[3].type, KVT_EV_CLEARED);
    kvt_evbatch_cleanup(&b);

    /* every known-but-unused BlockStored field, as map keys and positions: not counted */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a", 2, 0.0, 2);
    pk(&sb, "m s s s a u s u s n s u s s s u", 7, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)1, "lora_id", (uint64_t)3, "extra_keys", "group_idx", (uint64_t)0,
       "kv_cache_spec_kind", "full", "kv_cache_spec_sliding_window", (uint64_t)0);
    pk(&sb, "a s a u n a n u n n a n u s u", 12, "BlockStored", 1, (uint64_t)1, 0, (uint64_t)5, 1,
       (uint64_t)0, "full", (uint64_t)0);
    decode_ok(&sb, &b);
    assert_int_equal(b.nev, 2);
    assert_int_equal(b.unknown, 0);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_destroy(&sb);
}

/*
 * A malformed event is skipped alone (KVT_EV_BAD, the batch decodes on); it is
 * marked may_remove unless it was known to be a BlockStored.
 */
static void test_bad_events(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
#define BAD(may_remove, msg, ...)                                                                  \
    do {                                                                                           \
        msgpack_sbuffer_clear(&sb);                                                                \
        pk(&sb, __VA_ARGS__);                                                                      \
        decode_bad(&sb, 1, 0, may_remove, msg);                                                    \
    } while (0)
    /* the type cannot be told: it may have been a removal */
    BAD(true, "events[0]: want an array or a map", "a d a n", 2, 0.0, 1);
    BAD(true, "events[0]: an array event must start", "a d a a u", 2, 0.0, 1, 1, (uint64_t)1);
    BAD(true, "events[0]: an array event must start", "a d a a", 2, 0.0, 1, 0);
    BAD(true, "events[0]: missing field 'type'", "a d a m s a", 2, 0.0, 1, 1, "block_hashes", 0);
    BAD(true, "events[0]: field 'type': want a string", "a d a m s u", 2, 0.0, 1, 1, "type",
        (uint64_t)1);
    BAD(true, "field 'type' given twice", "a d a m s s s s", 2, 0.0, 1, 2, "type",
        "AllBlocksCleared", "type", "AllBlocksCleared");
    /* removals */
    BAD(true, "field 'block_hashes' given twice", "a d a m s s s a s a", 2, 0.0, 1, 3, "type",
        "BlockRemoved", "block_hashes", 0, "block_hashes", 0);
    BAD(true, "events[0]: missing field 'block_hashes'", "a d a m s s", 2, 0.0, 1, 1, "type",
        "BlockRemoved");
    BAD(true, "events[0]: block_hashes: want an array", "a d a a s u", 2, 0.0, 1, 2, "BlockRemoved",
        (uint64_t)1);
    BAD(true, "block_hashes[0]: want an integer or 1..64 bytes", "a d a a s a s", 2, 0.0, 1, 2,
        "BlockRemoved", 1, "abc");
    BAD(true, "block_hashes[1]: want an integer", "a d a a s a u d", 2, 0.0, 1, 2, "BlockRemoved",
        2, (uint64_t)1, 1.0);
    BAD(true, "block_hashes[0]", "a d a a s a n", 2, 0.0, 1, 2, "BlockRemoved", 1, 0);
    uint8_t big[65] = {0};
    BAD(true, "block_hashes[0]", "a d a a s a b", 2, 0.0, 1, 2, "BlockRemoved", 1, big, (size_t)0);
    BAD(true, "block_hashes[0]", "a d a a s a b", 2, 0.0, 1, 2, "BlockRemoved", 1, big, (size_t)65);
    BAD(true, "events[0]: medium: want a string or nil", "a d a a s a u u", 2, 0.0, 1, 3,
        "BlockRemoved", 1, (uint64_t)1, (uint64_t)0);
    /* stores: skipping one loses a hit at worst */
    BAD(false, "events[0]: missing field 'block_hashes'", "a d a a s", 2, 0.0, 1, 1, "BlockStored");
    BAD(false, "events[0]: block_hashes is empty", "a d a a s a", 2, 0.0, 1, 2, "BlockStored", 0);
    BAD(false, "events[0]: block_hashes: want an array", "a d a a s n", 2, 0.0, 1, 2,
        "BlockStored");
    BAD(true, "events[0]: block_hashes: want an array", "a d a m s s s n", 2, 0.0, 1, 2, "type",
        "BlockRemoved", "block_hashes");
    BAD(false, "parent_block_hash: want an integer or 1..64 bytes", "a d a a s a u s", 2, 0.0, 1, 3,
        "BlockStored", 1, (uint64_t)1, "x");
    BAD(false, "events[0]: token_ids: want an array", "a d a a s a u n u", 2, 0.0, 1, 4,
        "BlockStored", 1, (uint64_t)1, (uint64_t)1);
    BAD(false, "token_ids[0]: want an integer", "a d a a s a u n a i", 2, 0.0, 1, 4, "BlockStored",
        1, (uint64_t)1, 1, (int64_t)-1);
    BAD(false, "token_ids[0]: want an integer", "a d a a s a u n a u", 2, 0.0, 1, 4, "BlockStored",
        1, (uint64_t)1, 1, (uint64_t)1 << 32);
    /* SGLang's EAGLE bigram pages: token pairs, not ids */
    BAD(false, "token_ids[0]: want an integer", "a d a a s a u n a a uu u", 2, 0.0, 1, 5,
        "BlockStored", 1, (uint64_t)1, 1, 2, (uint64_t)1, (uint64_t)2, (uint64_t)1);
    BAD(false, "block_size: want an integer", "a d a a s a u n a u s", 2, 0.0, 1, 5, "BlockStored",
        1, (uint64_t)1, 1, (uint64_t)1, "16");
    BAD(false, "want block_size 2 x 1 block_hashes", "a d a a s a u n a u u", 2, 0.0, 1, 5,
        "BlockStored", 1, (uint64_t)1, 1, (uint64_t)1, (uint64_t)2);
    BAD(false, "not a multiple of the 2 block_hashes", "a d a a s a uu n a uuu", 2, 0.0, 1, 4,
        "BlockStored", 2, (uint64_t)1, (uint64_t)2, 3, (uint64_t)1, (uint64_t)1, (uint64_t)1);
    BAD(false, "lora_name: want a string of 1..255 bytes", "a d a m s s s a u s u", 2, 0.0, 1, 3,
        "type", "BlockStored", "block_hashes", 1, (uint64_t)1, "lora_name", (uint64_t)1);
    char name[300];
    memset(name, 'x', 256);
    name[256] = '\0';
    BAD(false, "lora_name: want a string of 1..255 bytes", "a d a m s s s a u s s", 2, 0.0, 1, 3,
        "type", "BlockStored", "block_hashes", 1, (uint64_t)1, "lora_name", name);
    /* a NUL inside a name: packed by hand */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a u s", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)1, "lora_name");
    msgpack_sbuffer_write(&sb,
                          "\xa3"
                          "a\0b",
                          4);
    decode_bad(&sb, 1, 0, false, "lora_name: want a string of 1..255 bytes without NUL");
    /* one bad event among good ones: the others decode, the index counts skipped events */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a s a s a u a s a", 2, 0.0, 5, 1, "Unknown", 1, "AllBlocksCleared", 2,
       "BlockRemoved", 1, (uint64_t)9, 2, "BlockStored", 0);
    pk(&sb, "a s a u", 2, "BlockRemoved", 1, (uint64_t)10);
    kvt_evbatch_t b;
    char err[256];
    assert_int_equal(kvt_ev_msgpack_decode(sb.data, sb.size, KVT_EV_FMT_VLLM, "p", "m", 0, BIG, &b,
                                           err, sizeof(err)),
                     KVT_OK);
    assert_int_equal(b.nev, 4);
    assert_int_equal(b.unknown, 1);
    assert_true(b.ev[0].type == KVT_EV_CLEARED && b.ev[1].hashes[0] == 9);
    assert_true(b.ev[2].type == KVT_EV_BAD && !b.ev[2].may_remove);
    assert_true(b.ev[3].type == KVT_EV_REMOVED && b.ev[3].hashes[0] == 10);
    assert_non_null(strstr(err, "events[3]: block_hashes is empty"));
    kvt_evbatch_cleanup(&b);
    /* the first bad event's reason is the one reported */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a n a u", 2, 0.0, 2, 1, (uint64_t)1);
    decode_bad(&sb, 2, 1, true, "events[0]: want an array or a map");
#undef BAD
    msgpack_sbuffer_destroy(&sb);
}

/* SGLang's positional layout: slot 7 may hold BlockStoredWithMetadata's metadata map. */
static void test_sglang_metadata(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    kvt_evbatch_t b;
    /* ["BlockStored", hashes, parent, tokens, block_size, lora_id, medium, {"cache_salt"}] */
    pk(&sb, "a d a a s a u n a uu u n s m s s u", 3, 0.0, 1, 8, "BlockStored", 1, (uint64_t)1, 2,
       (uint64_t)1, (uint64_t)2, (uint64_t)2, "GPU", 1, "cache_salt", "tenant-a", (uint64_t)0);
    decode_fmt_ok(&sb, KVT_EV_FMT_SGLANG, &b);
    assert_true(b.nev == 1 && b.ev[0].type == KVT_EV_STORED && b.ev[0].ntokens == 2);
    assert_true(b.ev[0].cache_salt_len == 8 && strcmp(b.ev[0].cache_salt, "tenant-a") == 0);
    assert_null(b.ev[0].lora_name);
    assert_int_equal(b.unknown, 0);
    kvt_evbatch_cleanup(&b);
    /* as vLLM's, slot 7 is lora_name: a map there is a bad store */
    decode_bad_fmt(&sb, KVT_EV_FMT_VLLM, 1, 0, false, "lora_name: want a string");
    /* the salt applies where a chain starts, parent or not (SGLang salts every event) */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u u a uu u n s m ssss", 2, 0.0, 1, 8, "BlockStored", 1, (uint64_t)2,
       (uint64_t)1, 2, (uint64_t)3, (uint64_t)4, (uint64_t)2, "CPU_PINNED", 2, "cache_salt", "t",
       "other", "x");
    decode_fmt_ok(&sb, KVT_EV_FMT_SGLANG, &b);
    assert_true(b.ev[0].has_parent && b.ev[0].tier == KVT_TIER_CPU);
    assert_string_equal(b.ev[0].cache_salt, "t");
    kvt_evbatch_cleanup(&b);
    /* the vLLM-aligned layout newer SGLang sends: lora_name, extra_keys ..., metadata last */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n a u u n s n a a s n n n n n m s s", 2, 0.0, 1, 15, "BlockStored", 1,
       (uint64_t)5, 1, (uint64_t)7, (uint64_t)1, "GPU", 1, 1, "t2", 1, "cache_salt", "t2");
    decode_fmt_ok(&sb, KVT_EV_FMT_SGLANG, &b);
    assert_string_equal(b.ev[0].cache_salt, "t2");
    assert_int_equal(b.unknown, 0);
    kvt_evbatch_cleanup(&b);
    /* an empty or nil salt is none; another type is a bad store */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n a u u n n m s s", 2, 0.0, 1, 8, "BlockStored", 1, (uint64_t)5, 1,
       (uint64_t)7, (uint64_t)1, 1, "cache_salt", "");
    decode_fmt_ok(&sb, KVT_EV_FMT_SGLANG, &b);
    assert_null(b.ev[0].cache_salt);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n a u u n n m s u", 2, 0.0, 1, 8, "BlockStored", 1, (uint64_t)5, 1,
       (uint64_t)7, (uint64_t)1, 1, "cache_salt", (uint64_t)7);
    decode_bad_fmt(&sb, KVT_EV_FMT_SGLANG, 1, 0, false, "metadata.cache_salt: want a string");
    /* past ownership (slot 14 on) a map is the metadata in a vLLM stream too (kvtierd's
     * publisher puts a salt there); a cache_salt there that is no string is unknown, not bad */
    for (int bad = 0; bad < 2; bad++) {
        msgpack_sbuffer_clear(&sb);
        pk(&sb, "a d a a s a u u a u u n s n n n n n n n m s", 2, 0.0, 1, 15, "BlockStored", 1,
           (uint64_t)5, (uint64_t)4, 1, (uint64_t)7, (uint64_t)1, "GPU", 1, "cache_salt");
        if (bad)
            pk(&sb, "u", (uint64_t)7);
        else
            pk(&sb, "s", "t4");
        decode_ok(&sb, &b);
        assert_true(b.nev == 1 && b.ev[0].type == KVT_EV_STORED && b.ev[0].has_parent);
        if (bad)
            assert_null(b.ev[0].cache_salt);
        else
            assert_string_equal(b.ev[0].cache_salt, "t4");
        assert_int_equal(b.unknown, bad);
        kvt_evbatch_cleanup(&b);
    }
    /* map events name it "metadata" in either format */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a u s m s s", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)5, "metadata", 1, "cache_salt", "t3");
    decode_ok(&sb, &b);
    assert_string_equal(b.ev[0].cache_salt, "t3");
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_destroy(&sb);
}

/* vLLM's extra_keys: the first block's lone string is the cache salt; other keys seed blocks. */
static void test_extra_keys(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    kvt_evbatch_t b;
    /* [["salt"], None]: a salted request's first two blocks */
    pk(&sb, "a d a m s s s a uu s a uu s u s a a s n", 2, 0.0, 1, 5, "type", "BlockStored",
       "block_hashes", 2, (uint64_t)1, (uint64_t)2, "token_ids", 2, (uint64_t)1, (uint64_t)2,
       "block_size", (uint64_t)1, "extra_keys", 2, 1, "salt-1");
    decode_ok(&sb, &b);
    assert_true(b.ev[0].cache_salt_len == 6 && strcmp(b.ev[0].cache_salt, "salt-1") == 0);
    assert_null(b.ev[0].extra_seeds);
    kvt_evbatch_cleanup(&b);
    /* with a LoRA: its name leads the tuple (lora_id in older vLLM) */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n a u u n n s a a ss", 2, 0.0, 1, 9, "BlockStored", 1, (uint64_t)1, 1,
       (uint64_t)1, (uint64_t)1, "ad", 1, 2, "ad", "salt-2");
    decode_ok(&sb, &b);
    assert_string_equal(b.ev[0].lora_name, "ad");
    assert_string_equal(b.ev[0].cache_salt, "salt-2");
    assert_null(b.ev[0].extra_seeds);
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n a u u u n n a a us", 2, 0.0, 1, 9, "BlockStored", 1, (uint64_t)1, 1,
       (uint64_t)1, (uint64_t)1, (uint64_t)3, 1, 2, (uint64_t)3, "salt-3");
    decode_ok(&sb, &b);
    assert_string_equal(b.ev[0].cache_salt, "salt-3");
    kvt_evbatch_cleanup(&b);
    /* the LoRA name alone is no salt and no extra key */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n a u u n n s a a s", 2, 0.0, 1, 9, "BlockStored", 1, (uint64_t)1, 1,
       (uint64_t)1, (uint64_t)1, "ad", 1, 1, "ad");
    decode_ok(&sb, &b);
    assert_null(b.ev[0].cache_salt);
    assert_null(b.ev[0].extra_seeds);
    kvt_evbatch_cleanup(&b);
    /* with a parent the block is not the request's first: a lone string is another key */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u u a u u n n n a a s", 2, 0.0, 1, 9, "BlockStored", 1, (uint64_t)1,
       (uint64_t)9, 1, (uint64_t)1, (uint64_t)1, 1, 1, "mm-hash");
    decode_ok(&sb, &b);
    assert_null(b.ev[0].cache_salt);
    assert_non_null(b.ev[0].extra_seeds);
    uint64_t seed_str = b.ev[0].extra_seeds[0];
    assert_true(seed_str != 0);
    kvt_evbatch_cleanup(&b);
    /* multimodal keys (identifier, offset) and prompt-embedding bytes seed their blocks; equal
     * keys give equal seeds however the ints were packed, other keys other seeds */
    uint64_t seeds[4];
    for (int form = 0; form < 4; form++) {
        msgpack_sbuffer_clear(&sb);
        pk(&sb, "a d a a s a uu n a uu u n n n a n a a s", 2, 0.0, 1, 9, "BlockStored", 2,
           (uint64_t)1, (uint64_t)2, 2, (uint64_t)1, (uint64_t)2, (uint64_t)1, 2, 1, 2, "img-1");
        msgpack_packer p;
        msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
        if (form == 0)
            msgpack_pack_uint8(&p, 3);
        else if (form == 1)
            msgpack_pack_uint64(&p, 3);
        else if (form == 2)
            msgpack_pack_uint8(&p, 4);
        else
            msgpack_pack_int8(&p, -3);
        decode_ok(&sb, &b);
        assert_null(b.ev[0].cache_salt);
        assert_non_null(b.ev[0].extra_seeds);
        assert_true(b.ev[0].extra_seeds[0] == 0);
        seeds[form] = b.ev[0].extra_seeds[1];
        assert_true(seeds[form] != 0);
        kvt_evbatch_cleanup(&b);
    }
    assert_true(seeds[0] == seeds[1] && seeds[0] != seeds[2] && seeds[0] != seeds[3]);
    /* a salt next to a multimodal key on block 0: no lone salt, the block is seeded */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a a s a u n a u u n n n a a a su s", 2, 0.0, 1, 9, "BlockStored", 1, (uint64_t)1,
       1, (uint64_t)1, (uint64_t)1, 1, 2, 2, "img", (uint64_t)0, "salt");
    decode_ok(&sb, &b);
    assert_null(b.ev[0].cache_salt);
    assert_true(b.ev[0].extra_seeds != NULL && b.ev[0].extra_seeds[0] != 0);
    kvt_evbatch_cleanup(&b);
    /* SGLang's metadata salt wins over extra_keys */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a u s a a s s m s s", 2, 0.0, 1, 4, "type", "BlockStored",
       "block_hashes", 1, (uint64_t)1, "extra_keys", 1, 1, "from-keys", "metadata", 1, "cache_salt",
       "from-meta");
    decode_ok(&sb, &b);
    assert_string_equal(b.ev[0].cache_salt, "from-meta");
    kvt_evbatch_cleanup(&b);
    /* malformed extra_keys make the store bad */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a uu s a n", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 2,
       (uint64_t)1, (uint64_t)2, "extra_keys", 1);
    decode_bad(&sb, 1, 0, false, "extra_keys has 1 entries for 2 block_hashes");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a u s s", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)1, "extra_keys", "x");
    decode_bad(&sb, 1, 0, false, "extra_keys: want an array or nil");
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a u s a u", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)1, "extra_keys", 1, (uint64_t)1);
    decode_bad(&sb, 1, 0, false, "extra_keys[0]: want an array or nil");
    msgpack_sbuffer_destroy(&sb);
}

/* @json (a POST /v1/events body) and @sb (its events, packed) give the same salts and seeds. */
static void same_as_json(const char *json, const msgpack_sbuffer *sb)
{
    kvt_evbatch_t bj, bm;
    char err[256];
    if (kvt_ev_json_decode(json, strlen(json), BIG, &bj, err, sizeof(err)) != KVT_OK)
        fail_msg("json: %s", err);
    decode_ok(sb, &bm);
    assert_int_equal(bj.nev, bm.nev);
    for (size_t i = 0; i < bj.nev; i++) {
        const kvt_event_t *a = &bj.ev[i], *b = &bm.ev[i];
        assert_int_equal(a->nhashes, b->nhashes);
        assert_true((a->cache_salt == NULL) == (b->cache_salt == NULL));
        if (a->cache_salt != NULL)
            assert_string_equal(a->cache_salt, b->cache_salt);
        assert_true((a->extra_seeds == NULL) == (b->extra_seeds == NULL));
        for (uint32_t k = 0; a->extra_seeds != NULL && k < a->nhashes; k++)
            if (a->extra_seeds[k] != b->extra_seeds[k])
                fail_msg("event %zu block %u: json seed %llx, msgpack %llx", i, k,
                         (unsigned long long)a->extra_seeds[k],
                         (unsigned long long)b->extra_seeds[k]);
    }
    kvt_evbatch_cleanup(&bj);
    kvt_evbatch_cleanup(&bm);
}

/*
 * Extra keys hash to the same seeds over HTTP (JSON) and over ZMQ (msgpack):
 * every kind of value, a LoRA named by the batch (JSON) or the event, one
 * named by its id, strings and map keys of any length; and the seed is the
 * documented canonical form.
 */
static void test_extra_keys_json_agrees(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    /* every kind of value, nested; whitespace is no part of a key */
    pk(&sb, "a d a m s s s a uu s a n a", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 2,
       (uint64_t)1, (uint64_t)2, "extra_keys", 2, 12);
    pk(&sb, "a su s n t F i u d d d s m s a u m s n", 2, "img-1", (uint64_t)3, "s", (int64_t)-7,
       UINT64_MAX, 1.5, -0.25, HUGE_VAL, "x\xc3\xa9", 1, "k", 2, (uint64_t)1, 1, "z");
    same_as_json("{\"pod\":\"p\",\"model\":\"m\",\"events\":[{\"type\":\"BlockStored\","
                 "\"block_hashes\":[1,2],\"extra_keys\":[null, [ [\"img-1\" , 3],\"s\",null,true,"
                 "false,-7,18446744073709551615,1.5,-25e-2,1e400,\"x\\u00e9\","
                 "{\"k\":[1,{\"z\":null}]} ] ]}]}",
                 &sb);
    /* a LoRA leads the entries; the salt; strings and map keys longer than 255 bytes */
    char longs[301], json[2048];
    memset(longs, 'y', 300);
    longs[300] = '\0';
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a uuuu s s s a a ss a s a su a s a m s u", 2, 0.0, 1, 4, "type",
       "BlockStored", "block_hashes", 4, (uint64_t)1, (uint64_t)2, (uint64_t)3, (uint64_t)4,
       "lora_name", "ad", "extra_keys", 4, 2, "ad", "salt-x", 2, "ad", 2, "mm", (uint64_t)5, 1,
       longs, 1, 1, longs, (uint64_t)1);
    snprintf(json, sizeof(json),
             "{\"pod\":\"p\",\"model\":\"m\",\"events\":[{\"type\":\"BlockStored\","
             "\"block_hashes\":[1,2,3,4],\"extra_keys\":[[\"ad\",\"salt-x\"],[\"ad\",[\"mm\",5]],"
             "[\"%s\"],[{\"%s\":1}]]}],\"lora_name\":\"ad\"}",
             longs, longs);
    same_as_json(json, &sb);
    kvt_evbatch_t b;
    decode_ok(&sb, &b);
    assert_string_equal(b.ev[0].cache_salt, "salt-x");
    assert_true(b.ev[0].extra_seeds[0] == 0 && b.ev[0].extra_seeds[1] != 0);
    kvt_evbatch_cleanup(&b);
    /* a lone string too long for a salt (255 bytes at most) is a key */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a uu s a a s n", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 2,
       (uint64_t)1, (uint64_t)2, "extra_keys", 2, 1, longs);
    snprintf(json, sizeof(json),
             "{\"pod\":\"p\",\"model\":\"m\",\"events\":[{\"type\":\"BlockStored\","
             "\"block_hashes\":[1,2],\"extra_keys\":[[\"%s\"],null]}]}",
             longs);
    same_as_json(json, &sb);
    decode_ok(&sb, &b);
    assert_true(b.ev[0].cache_salt == NULL && b.ev[0].extra_seeds[0] != 0);
    kvt_evbatch_cleanup(&b);
    /* older vLLM's lora_id leads them instead */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a uu s u s a a us a uu", 2, 0.0, 1, 4, "type", "BlockStored",
       "block_hashes", 2, (uint64_t)1, (uint64_t)2, "lora_id", (uint64_t)3, "extra_keys", 2, 2,
       (uint64_t)3, "salt", 2, (uint64_t)3, (uint64_t)7);
    same_as_json("{\"pod\":\"p\",\"model\":\"m\",\"events\":[{\"type\":\"BlockStored\","
                 "\"lora_id\":3,\"block_hashes\":[1,2],\"extra_keys\":[[3,\"salt\"],[3,7]]}]}",
                 &sb);
    /* the canonical form, byte by byte: [["img", 3]] is one key, an array */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a u s a a a su", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)1, "extra_keys", 1, 1, 2, "img", (uint64_t)3);
    decode_ok(&sb, &b);
    static const uint8_t enc[] = {
        0x07,                               /* an array */
        0x05, 3, 0, 0, 0, 'i', 'm', 'g',    /* a str of 3 bytes */
        0x02, 3, 0, 0, 0, 0,   0,   0,   0, /* the uint 3 */
        0x0a,                               /* its end */
    };
    assert_true(b.ev[0].extra_seeds[0] ==
                XXH3_64bits_withSeed(enc, sizeof(enc), KVT_EV_EXTRA_SEED));
    kvt_evbatch_cleanup(&b);
    msgpack_sbuffer_destroy(&sb);
}

static void test_raw_errors(void **state)
{
    (void)state;
    raw_err("", 0, KVT_ERR_PARSE, "offset 0: truncated");
    raw_err("\x91\xcb", 2, KVT_ERR_PARSE, "offset 1: truncated");
    raw_err("\x92\xc1\x90", 3, KVT_ERR_PARSE, "reserved byte 0xc1");
    raw_err("\x92\x00\x90\x00", 4, KVT_ERR_PARSE, "offset 3: trailing bytes");
    raw_err("\xa5"
            "abc",
            4, KVT_ERR_PARSE, "truncated");
    raw_err("\xdb\xff\xff\xff\xff", 5, KVT_ERR_PARSE, "truncated");
    raw_err("\xdb\xff\xff", 3, KVT_ERR_PARSE, "truncated");
    /* containers that claim more elements than bytes remain: msgpack-c never sees them */
    raw_err("\xdd\xff\xff\xff\xff", 5, KVT_ERR_PARSE, "claims more elements");
    raw_err("\xdf\x7f\xff\xff\xff\x00", 6, KVT_ERR_PARSE, "claims more elements");
    raw_err("\x92\x00\xdc\x00\x03\x00\x00", 7, KVT_ERR_PARSE, "claims more elements");
    raw_err("\x82\x00\x00\x00", 4, KVT_ERR_PARSE, "claims more elements");
    /* every fixed-size type's length is checked */
#define R(lit)                                                                                     \
    {                                                                                              \
        lit, sizeof(lit) - 1                                                                       \
    }
    static const struct {
        const char *p;
        size_t n;
    } cut[] = {R("\xca\x00\x00\x00"),
               R("\xcb\x00"),
               R("\xcc"),
               R("\xcd\x00"),
               R("\xce\x00"),
               R("\xcf\x00"),
               R("\xd0"),
               R("\xd1\x00"),
               R("\xd2\x00"),
               R("\xd3\x00"),
               R("\xd4\x00"),
               R("\xd5\x00\x00"),
               R("\xd6\x00\x00\x00\x00"),
               R("\xd7\x00"),
               R("\xd8\x00"),
               R("\xc7\x05\x00\x00"),
               R("\xc8\x00"),
               R("\xc9\x00\x00\x00\x02\x00\x00"),
               R("\xc4\x02\x00"),
               R("\xc5\x00\x02\x00"),
               R("\xd9\x02\x00"),
               R("\xda\x00"),
               R("\xdc\x00"),
               R("\xde\x00")};
#undef R
    for (size_t i = 0; i < sizeof(cut) / sizeof(cut[0]); i++)
        raw_err(cut[i].p, cut[i].n, KVT_ERR_PARSE, "truncated");
    /* nesting: 24 arrays pass the raw check (then fail on shape), 25 do not */
    char deep[26];
    memset(deep, 0x91, sizeof(deep));
    deep[24] = 0;
    raw_err(deep, 25, KVT_ERR_INVAL, "a batch array is [ts, events, dp_rank?]");
    deep[24] = (char)0x91;
    deep[25] = 0;
    raw_err(deep, 26, KVT_ERR_PARSE, "offset 24: nested deeper than 24");
    /* wide is fine, and closed containers do not count */
    char wide[64];
    memset(wide, 0x90, sizeof(wide));
    wide[0] = (char)0xdc;
    wide[1] = 0;
    wide[2] = 61;
    raw_err(wide, sizeof(wide), KVT_ERR_INVAL, "batch ts: want a number");
}

static void test_max_items_and_args(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pk(&sb, "a d a a s a uu n a uuuu a s a u", 2, 0.0, 2, 4, "BlockStored", 2, (uint64_t)1,
       (uint64_t)2, 4, (uint64_t)1, (uint64_t)2, (uint64_t)3, (uint64_t)4, 2, "BlockRemoved", 1,
       (uint64_t)1);
    kvt_evbatch_t b;
    char err[128];
    assert_int_equal(kvt_ev_msgpack_decode(sb.data, sb.size, KVT_EV_FMT_VLLM, "p", "m", 0, 7, &b,
                                           err, sizeof(err)),
                     KVT_OK);
    kvt_evbatch_cleanup(&b);
    decode_err_max(&sb, 6, KVT_ERR_TOO_BIG, "events[1]: more than 6 hashes and tokens");
    decode_err_max(&sb, 5, KVT_ERR_TOO_BIG, "events[0]: more than 5 hashes and tokens");
    assert_int_equal(kvt_ev_msgpack_decode(sb.data, sb.size, (kvt_ev_format_t)3, "p", "m", 0, BIG,
                                           &b, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_non_null(strstr(err, "unknown event format"));
    /* no room for a message is fine */
    assert_int_equal(
        kvt_ev_msgpack_decode(sb.data, 3, KVT_EV_FMT_VLLM, "p", "m", 0, BIG, &b, NULL, 0),
        KVT_ERR_PARSE);
    kvt_evbatch_cleanup(NULL);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- random batches against what was packed ----------------------------------------------- */

typedef struct ref_ev {
    kvt_ev_type_t type; /* KVT_EV_BAD: packed malformed */
    bool may_remove;
    unsigned tier; /* 0: an unknown medium (skipped) */
    uint32_t nh, nt, bs;
    uint64_t h[8];
    uint32_t t[8 * 4];
    bool has_parent;
    uint64_t parent;
    char lora[8];  /* "" none */
    char salt[8];  /* "" none */
    int64_t group; /* -1 none */
    int kind;      /* index into kind_name, -1 none */
} ref_ev_t;

static uint64_t rnd(kvt_rng_t *s)
{
    return kvt_rng_next(s);
}

/* Packs hash @v in a random form that decodes back to @v under @fmt. */
static void pack_hash(msgpack_packer *p, kvt_rng_t *s, kvt_ev_format_t fmt, uint64_t v)
{
    uint8_t d[32];
    switch (rnd(s) % 3) {
    case 0: msgpack_pack_uint64(p, v); return;
    case 1: msgpack_pack_int64(p, (int64_t)v); return;
    default: break;
    }
    size_t n = rnd(s) % 2 ? 32 : 16;
    for (size_t i = 0; i < n; i++)
        d[i] = (uint8_t)rnd(s);
    uint8_t *at = fmt == KVT_EV_FMT_SGLANG ? d : d + n - 8;
    for (int i = 0; i < 8; i++)
        at[i] = (uint8_t)(v >> (56 - 8 * i));
    msgpack_pack_bin(p, n);
    msgpack_pack_bin_body(p, d, n);
}

static void pack_str(msgpack_packer *p, const char *s)
{
    msgpack_pack_str(p, strlen(s));
    msgpack_pack_str_body(p, s, strlen(s));
}

static const char *const medium_name[] = {"GPU",  "CPU",        "DISK",    "gpu",      "Cpu",
                                          "nvme", "CPU_PINNED", "STORAGE", "EXTERNAL", "HBM9"};
static const unsigned medium_tier[] = {
    KVT_TIER_GPU,  KVT_TIER_CPU, KVT_TIER_DISK, KVT_TIER_GPU,  KVT_TIER_CPU,
    KVT_TIER_DISK, KVT_TIER_CPU, KVT_TIER_DISK, KVT_TIER_DISK, 0};
#define NMEDIUMS ((int)(sizeof(medium_name) / sizeof(medium_name[0])))
static const char *const kind_name[] = {"full_attention", "sliding_window", "mamba", "unknown"};
static const uint8_t kind_class[] = {KVT_EV_GROUP_FULL, KVT_EV_GROUP_OTHER, KVT_EV_GROUP_OTHER,
                                     KVT_EV_GROUP_ANY};

/* extra_keys for @e: [[salt], nil, ...] (the LoRA's name first when it has one). */
static void pack_extra_keys(msgpack_packer *p, const ref_ev_t *e)
{
    msgpack_pack_array(p, e->nh);
    for (uint32_t i = 0; i < e->nh; i++) {
        if (i > 0 || !e->salt[0]) {
            msgpack_pack_nil(p);
            continue;
        }
        msgpack_pack_array(p, e->lora[0] ? 2 : 1);
        if (e->lora[0])
            pack_str(p, e->lora);
        pack_str(p, e->salt);
    }
}

static void pack_meta(msgpack_packer *p, const ref_ev_t *e)
{
    msgpack_pack_map(p, 1);
    pack_str(p, "cache_salt");
    pack_str(p, e->salt);
}

/* Packs @e malformed (it decodes to KVT_EV_BAD): what can go wrong with each type. */
static void pack_bad(msgpack_packer *p, kvt_rng_t *s, ref_ev_t *e)
{
    switch (rnd(s) % 4) {
    case 0: /* not an event: it may have been anything */
        msgpack_pack_nil(p);
        e->may_remove = true;
        break;
    case 1: /* a removal whose medium is no string */
        msgpack_pack_array(p, 3);
        pack_str(p, "BlockRemoved");
        msgpack_pack_array(p, 0);
        msgpack_pack_uint32(p, 1);
        e->may_remove = true;
        break;
    case 2: /* a store whose hashes are no array */
        msgpack_pack_map(p, 2);
        pack_str(p, "type");
        pack_str(p, "BlockStored");
        pack_str(p, "block_hashes");
        pack_str(p, "1,2");
        e->may_remove = false;
        break;
    default: /* a clear given its type twice */
        msgpack_pack_map(p, 2);
        pack_str(p, "type");
        pack_str(p, "AllBlocksCleared");
        pack_str(p, "type");
        pack_str(p, "AllBlocksCleared");
        e->may_remove = true;
        break;
    }
}

/* Packs @e as an array or a map, with nils, omissions and unknown fields at random; counts them. */
static void pack_event(msgpack_packer *p, kvt_rng_t *s, kvt_ev_format_t fmt, ref_ev_t *e,
                       size_t *unknown)
{
    if (e->type == KVT_EV_BAD) {
        pack_bad(p, s, e);
        return;
    }
    int medium = (int)(rnd(s) % (NMEDIUMS + 1)) - 1; /* -1: absent */
    e->tier = medium < 0 ? KVT_TIER_GPU : medium_tier[medium];
    bool as_map = rnd(s) % 2;
    if (e->type == KVT_EV_CLEARED) {
        if (as_map) {
            msgpack_pack_map(p, 1);
            pack_str(p, "type");
        } else {
            msgpack_pack_array(p, 1);
        }
        pack_str(p, "AllBlocksCleared");
        e->tier = KVT_TIER_GPU;
        return;
    }
    bool stored = e->type == KVT_EV_STORED;
    bool has_group = e->group >= 0, has_kind = stored && e->kind >= 0;
    if (as_map) {
        bool extra = rnd(s) % 4 == 0;
        bool salt = stored && e->salt[0];
        uint32_t n = 2 + (medium >= 0) + extra + has_group + has_kind +
                     (stored ? (e->has_parent + (e->nt > 0) * 2 + (e->lora[0] != 0) + salt) : 0);
        msgpack_pack_map(p, n);
        /* "type" last half the time: the order of keys is free */
        bool type_last = rnd(s) % 2;
        if (!type_last) {
            pack_str(p, "type");
            pack_str(p, stored ? "BlockStored" : "BlockRemoved");
        }
        pack_str(p, "block_hashes");
        msgpack_pack_array(p, e->nh);
        for (uint32_t i = 0; i < e->nh; i++)
            pack_hash(p, s, fmt, e->h[i]);
        if (medium >= 0) {
            pack_str(p, "medium");
            pack_str(p, medium_name[medium]);
        }
        if (extra) {
            pack_str(p, "x_future");
            msgpack_pack_array(p, 0);
            (*unknown)++;
        }
        if (has_group) {
            pack_str(p, "group_idx");
            msgpack_pack_int64(p, e->group);
        }
        if (has_kind) {
            pack_str(p, "kv_cache_spec_kind");
            pack_str(p, kind_name[e->kind]);
        }
        if (stored && e->has_parent) {
            pack_str(p, "parent_block_hash");
            pack_hash(p, s, fmt, e->parent);
        }
        if (stored && e->nt > 0) {
            pack_str(p, "token_ids");
            msgpack_pack_array(p, e->nt);
            for (uint32_t i = 0; i < e->nt; i++)
                msgpack_pack_uint32(p, e->t[i]);
            pack_str(p, "block_size");
            msgpack_pack_uint32(p, e->bs);
        }
        if (stored && e->lora[0]) {
            pack_str(p, "lora_name");
            pack_str(p, e->lora);
        }
        if (salt) {
            if (rnd(s) % 2) {
                pack_str(p, "extra_keys");
                pack_extra_keys(p, e);
            } else {
                pack_str(p, "metadata");
                pack_meta(p, e);
            }
        }
        if (type_last) {
            pack_str(p, "type");
            pack_str(p, stored ? "BlockStored" : "BlockRemoved");
        }
        return;
    }
    /*
     * Positional: up to the last field that differs from its default, sometimes
     * all 13 (BlockStored) or 5 (BlockRemoved). An SGLang store with a salt and
     * no LoRA carries it as the metadata map in slot 7; otherwise in extra_keys.
     */
    bool meta7 = stored && fmt == KVT_EV_FMT_SGLANG && e->salt[0] && !e->lora[0] && rnd(s) % 2;
    uint32_t last; /* number of fields after the type name */
    if (stored) {
        last = has_kind               ? 10
               : has_group            ? 9
               : e->salt[0] && !meta7 ? 8
               : e->lora[0] || meta7  ? 7
               : medium >= 0          ? 6
               : e->nt > 0            ? 4
               : e->has_parent        ? 2
                                      : 1;
        if (rnd(s) % 3 == 0)
            last = 13;
    } else {
        last = has_group ? 3 : medium >= 0 ? 2 : 1;
        if (rnd(s) % 3 == 0)
            last = 5;
    }
    uint32_t extra = rnd(s) % 4 == 0 ? 1 + (uint32_t)(rnd(s) % 2) : 0;
    if (extra && !((stored && last == 13) || (!stored && last == 5)))
        extra = 0; /* extra fields only after every known one */
    msgpack_pack_array(p, 1 + last + extra);
    pack_str(p, stored ? "BlockStored" : "BlockRemoved");
    msgpack_pack_array(p, e->nh);
    for (uint32_t i = 0; i < e->nh; i++)
        pack_hash(p, s, fmt, e->h[i]);
    for (uint32_t f = 2; f <= last; f++) {
        if (!stored) {
            if (f == 2 && medium >= 0)
                pack_str(p, medium_name[medium]);
            else if (f == 3 && has_group)
                msgpack_pack_int64(p, e->group);
            else
                msgpack_pack_nil(p); /* medium, group_idx, locality, ownership */
            continue;
        }
        switch (f) {
        case 2:
            if (e->has_parent)
                pack_hash(p, s, fmt, e->parent);
            else
                msgpack_pack_nil(p);
            break;
        case 3:
            msgpack_pack_array(p, e->nt);
            for (uint32_t i = 0; i < e->nt; i++)
                msgpack_pack_uint32(p, e->t[i]);
            break;
        case 4:
            if (e->nt > 0)
                msgpack_pack_uint32(p, e->bs);
            else
                msgpack_pack_uint32(p, 0);
            break;
        case 6:
            if (medium >= 0)
                pack_str(p, medium_name[medium]);
            else
                msgpack_pack_nil(p);
            break;
        case 7:
            if (meta7)
                pack_meta(p, e);
            else if (e->lora[0])
                pack_str(p, e->lora);
            else
                msgpack_pack_nil(p);
            break;
        case 8:
            if (e->salt[0] && !meta7)
                pack_extra_keys(p, e);
            else
                msgpack_pack_nil(p);
            break;
        case 9:
            if (has_group)
                msgpack_pack_int64(p, e->group);
            else
                msgpack_pack_nil(p);
            break;
        case 10:
            if (has_kind)
                pack_str(p, kind_name[e->kind]);
            else
                msgpack_pack_nil(p);
            break;
        default: msgpack_pack_nil(p); break; /* lora_id, window, locality, ownership */
        }
    }
    for (uint32_t i = 0; i < extra; i++)
        msgpack_pack_uint32(p, 1);
    *unknown += extra;
}

static void test_random_batches(void **state)
{
    (void)state;
    const uint64_t seed = kvt_test_seed(); /* named in a failure's message */
    kvt_rng_t s;
    kvt_rng_init(&s, 0);
    enum { ROUNDS = 400 };
    ref_ev_t *ref = malloc(64 * sizeof(*ref));
    assert_non_null(ref);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    for (int round = 0; round < ROUNDS; round++) {
        kvt_ev_format_t fmt = rnd(&s) % 2 ? KVT_EV_FMT_VLLM : KVT_EV_FMT_SGLANG;
        uint32_t nev = (uint32_t)(rnd(&s) % 64);
        size_t unknown = 0;
        msgpack_sbuffer_clear(&sb);
        msgpack_packer p;
        msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
        int with_rank = (int)(rnd(&s) % 3); /* absent, nil, a value */
        bool batch_map = rnd(&s) % 3 == 0;
        if (batch_map) {
            msgpack_pack_map(&p, with_rank ? 3 : 2);
            pack_str(&p, "ts");
            msgpack_pack_double(&p, (double)round);
            pack_str(&p, "events");
        } else {
            msgpack_pack_array(&p, with_rank ? 3 : 2);
            msgpack_pack_double(&p, (double)round);
        }
        msgpack_pack_array(&p, nev);
        for (uint32_t i = 0; i < nev; i++) {
            ref_ev_t *e = &ref[i];
            memset(e, 0, sizeof(*e));
            e->group = -1;
            e->kind = -1;
            e->type = (kvt_ev_type_t)(1 + rnd(&s) % 3);
            if (rnd(&s) % 16 == 0)
                e->type = KVT_EV_BAD;
            e->nh = e->type == KVT_EV_CLEARED || e->type == KVT_EV_BAD
                        ? 0
                        : 1 + (uint32_t)(rnd(&s) % 8);
            for (uint32_t j = 0; j < e->nh; j++)
                e->h[j] = rnd(&s) >> (rnd(&s) % 64);
            if (e->type != KVT_EV_CLEARED && rnd(&s) % 4 == 0)
                e->group = (int64_t)(rnd(&s) % 4);
            if (e->type == KVT_EV_STORED) {
                e->has_parent = rnd(&s) % 2;
                e->parent = rnd(&s);
                if (rnd(&s) % 4 != 0) {
                    e->bs = 1 + (uint32_t)(rnd(&s) % 4);
                    e->nt = e->bs * e->nh;
                    for (uint32_t j = 0; j < e->nt; j++)
                        e->t[j] = (uint32_t)(rnd(&s) >> (rnd(&s) % 64));
                }
                if (rnd(&s) % 3 == 0)
                    snprintf(e->lora, sizeof(e->lora), "l%u", (unsigned)(rnd(&s) % 100));
                if (!e->has_parent && rnd(&s) % 3 == 0)
                    snprintf(e->salt, sizeof(e->salt), "s%u", (unsigned)(rnd(&s) % 100));
                if (e->group >= 0 && rnd(&s) % 2)
                    e->kind = (int)(rnd(&s) % 4);
            }
            pack_event(&p, &s, fmt, e, &unknown);
        }
        uint32_t rank = 7;
        if (with_rank && batch_map)
            pack_str(&p, rnd(&s) % 2 ? "data_parallel_rank" : "attn_dp_rank");
        if (with_rank == 1) {
            msgpack_pack_nil(&p);
        } else if (with_rank == 2) {
            rank = (uint32_t)(rnd(&s) % 16);
            msgpack_pack_uint32(&p, rank);
        }
        kvt_evbatch_t b;
        char err[256];
        kvt_status_t st = kvt_ev_msgpack_decode(sb.data, sb.size, fmt, "pod-a", "m", 7, BIG, &b,
                                                err, sizeof(err));
        if (st != KVT_OK)
            fail_msg("seed %llu round %d: %d %s", (unsigned long long)seed, round, st, err);
        assert_int_equal(b.nev, nev);
        assert_int_equal(b.unknown, unknown);
        assert_int_equal(b.dp_rank, rank);
        for (uint32_t i = 0; i < nev; i++) {
            const ref_ev_t *r = &ref[i];
            const kvt_event_t *e = &b.ev[i];
            if (r->type == KVT_EV_BAD) {
                if (e->type != KVT_EV_BAD || e->may_remove != r->may_remove)
                    fail_msg("seed %llu round %d event %u: type %d may_remove %d, want bad %d",
                             (unsigned long long)seed, round, i, e->type, e->may_remove,
                             r->may_remove);
                continue;
            }
            if (r->type != KVT_EV_CLEARED && r->tier == 0) {
                assert_true(e->type == r->type && e->skip == KVT_EV_SKIP_MEDIUM && e->tier == 0);
                assert_true(e->medium_len == 4 && memcmp(e->medium, "HBM9", 4) == 0);
                continue;
            }
            if (e->type != r->type || e->nhashes != r->nh || e->tier != r->tier)
                fail_msg("seed %llu round %d event %u: type %d/%d hashes %u/%u tier %u/%u",
                         (unsigned long long)seed, round, i, e->type, r->type, e->nhashes, r->nh,
                         e->tier, r->tier);
            assert_int_equal(e->skip, KVT_EV_SKIP_NONE);
            for (uint32_t j = 0; j < r->nh; j++)
                assert_true(e->hashes[j] == r->h[j]);
            assert_true(e->group == (r->type == KVT_EV_CLEARED ? -1 : r->group));
            if (r->type != KVT_EV_STORED)
                continue;
            assert_int_equal(e->group_kind, r->kind >= 0 ? kind_class[r->kind] : KVT_EV_GROUP_ANY);
            assert_int_equal(e->has_parent, r->has_parent);
            if (r->has_parent)
                assert_true(e->parent == r->parent);
            assert_int_equal(e->ntokens, r->nt);
            assert_int_equal(e->block_size, r->bs);
            if (r->nt > 0)
                assert_memory_equal(e->tokens, r->t, r->nt * sizeof(uint32_t));
            if (r->lora[0])
                assert_string_equal(e->lora_name, r->lora);
            else
                assert_null(e->lora_name);
            if (r->salt[0])
                assert_string_equal(e->cache_salt, r->salt);
            else
                assert_null(e->cache_salt);
            assert_null(e->extra_seeds);
        }
        kvt_evbatch_cleanup(&b);

        /* the same bytes cut short or with one byte changed: decoded or refused, never more */
        size_t cut = sb.size ? (size_t)(rnd(&s) % sb.size) : 0;
        st = kvt_ev_msgpack_decode(sb.data, cut, fmt, "p", "m", 0, BIG, &b, err, sizeof(err));
        assert_int_not_equal(st, KVT_OK); /* one value cut short is never whole */
        if (sb.size > 0) {
            size_t at = (size_t)(rnd(&s) % sb.size);
            sb.data[at] = (char)rnd(&s);
            st = kvt_ev_msgpack_decode(sb.data, sb.size, fmt, "p", "m", 0, BIG, &b, err,
                                       sizeof(err));
            if (st == KVT_OK)
                kvt_evbatch_cleanup(&b);
            else
                assert_true(err[0] != '\0');
        }
    }
    msgpack_sbuffer_destroy(&sb);
    free(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stored_array_form),
        cmocka_unit_test(test_stored_map_form),
        cmocka_unit_test(test_hash_forms),
        cmocka_unit_test(test_placeholder_removed_cleared),
        cmocka_unit_test(test_unknown_counting),
        cmocka_unit_test(test_batch_forms),
        cmocka_unit_test(test_mediums),
        cmocka_unit_test(test_groups_and_locality),
        cmocka_unit_test(test_bad_events),
        cmocka_unit_test(test_sglang_metadata),
        cmocka_unit_test(test_extra_keys),
        cmocka_unit_test(test_extra_keys_json_agrees),
        cmocka_unit_test(test_raw_errors),
        cmocka_unit_test(test_max_items_and_args),
        cmocka_unit_test(test_random_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
