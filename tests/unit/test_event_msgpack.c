/*
 * kvindex/event_msgpack: vLLM and SGLang KV-event batches. Both event forms
 * (positional arrays, maps), every hash form (uint64, int64, bytes under
 * each format), placeholders, defaults, unknown counting, every error (the
 * batch left untouched, a message naming the event), the raw-byte checks
 * that keep msgpack-c from huge allocations, and random batches packed in
 * random forms, decoded and compared with what was packed.
 * KVT_EVM_SEED=<n> replays a random run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvindex/event.h"

#define BIG ((size_t)1 << 40)

/* ---- packing ---------------------------------------------------------------------------- */

/*
 * Packs values by @fmt, one letter each (spaces ignored): a array (u32 size),
 * m map (u32 pairs), s str (const char *), u uint64, i int64, n nil,
 * d float64, f float32 (double arg), t true, b bin (const void *, size_t).
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

/* ---- fixed cases ------------------------------------------------------------------------- */

static void test_stored_array_form(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    /* vLLM <= v0.25: every positional field, then the batch's dp_rank */
    pk(&sb, "a d a a s a uu u a uuuu u n s s n u u n", 3, 1700000000.25, 1, 12, "BlockStored", 2,
       (uint64_t)11, UINT64_MAX, (uint64_t)10, 4, (uint64_t)1, (uint64_t)2, (uint64_t)3,
       (uint64_t)4, (uint64_t)2, "GPU", "adapter", (uint64_t)0, (uint64_t)0);
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
    kvt_evbatch_cleanup(&b);
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
    pk(&sb, "a s a u n u u u", 6, "BlockRemoved", 1, (uint64_t)1, (uint64_t)0, (uint64_t)0,
       (uint64_t)0); /* two extra positional fields: 2 */
    pk(&sb, "m s s s a u s u s s", 4, "type", "BlockRemoved", "block_hashes", 1, (uint64_t)2,
       "token_ids", (uint64_t)1, "new_field", "x"); /* token_ids means nothing here, new: 2 */
    pk(&sb, "a s a u n n n n s", 7, "BlockStored", 1, (uint64_t)3, "REMOTE");   /* medium: 1 */
    pk(&sb, "m s s s u", 2, "type", "AllBlocksCleared", "medium", (uint64_t)0); /* field: 1 */
    pk(&sb, "u s", (uint64_t)1, "extra batch field");                           /* 1 */
    kvt_evbatch_t b;
    decode_ok(&sb, &b);
    assert_int_equal(b.nev, 3);
    assert_int_equal(b.unknown, 9);
    assert_true(b.ev[0].type == KVT_EV_REMOVED && b.ev[0].hashes[0] == 1);
    assert_true(b.ev[1].type == KVT_EV_REMOVED && b.ev[1].hashes[0] == 2);
    assert_int_equal(b.ev[2].type, KVT_EV_CLEARED);
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

static void test_shape_errors(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
#define ERR(st, msg, ...)                                                                          \
    do {                                                                                           \
        msgpack_sbuffer_clear(&sb);                                                                \
        pk(&sb, __VA_ARGS__);                                                                      \
        decode_err(&sb, st, msg);                                                                  \
    } while (0)
    ERR(KVT_ERR_INVAL, "a batch is an array", "m", 0);
    ERR(KVT_ERR_INVAL, "a batch is an array", "a d", 1, 0.0);
    ERR(KVT_ERR_INVAL, "batch ts: want a number", "a s a", 2, "x", 0);
    ERR(KVT_ERR_INVAL, "batch events: want an array", "a d m", 2, 0.0, 0);
    ERR(KVT_ERR_INVAL, "batch dp_rank", "a d a i", 3, 0.0, 0, (int64_t)-1);
    ERR(KVT_ERR_INVAL, "batch dp_rank", "a d a u", 3, 0.0, 0, (uint64_t)1 << 32);
    ERR(KVT_ERR_INVAL, "events[0]: want an array or a map", "a d a n", 2, 0.0, 1);
    ERR(KVT_ERR_INVAL, "events[1]: an array event must start", "a d a a s a", 2, 0.0, 2, 1,
        "AllBlocksCleared", 0);
    ERR(KVT_ERR_INVAL, "events[0]: an array event must start", "a d a a u", 2, 0.0, 1, 1,
        (uint64_t)1);
    ERR(KVT_ERR_INVAL, "events[0]: missing field 'type'", "a d a m s a", 2, 0.0, 1, 1,
        "block_hashes", 0);
    ERR(KVT_ERR_INVAL, "events[0].type: want a string", "a d a m s u", 2, 0.0, 1, 1, "type",
        (uint64_t)1);
    ERR(KVT_ERR_INVAL, "field 'type' given twice", "a d a m s s s s", 2, 0.0, 1, 2, "type",
        "AllBlocksCleared", "type", "AllBlocksCleared");
    ERR(KVT_ERR_INVAL, "field 'block_hashes' given twice", "a d a m s s s a s a", 2, 0.0, 1, 3,
        "type", "BlockRemoved", "block_hashes", 0, "block_hashes", 0);
    ERR(KVT_ERR_INVAL, "events[0]: missing field 'block_hashes'", "a d a a s", 2, 0.0, 1, 1,
        "BlockStored");
    ERR(KVT_ERR_INVAL, "events[0]: missing field 'block_hashes'", "a d a m s s", 2, 0.0, 1, 1,
        "type", "BlockRemoved");
    ERR(KVT_ERR_INVAL, "events[0].block_hashes: want an array", "a d a a s u", 2, 0.0, 1, 2,
        "BlockRemoved", (uint64_t)1);
    ERR(KVT_ERR_INVAL, "events[0]: block_hashes is empty", "a d a a s a", 2, 0.0, 1, 2,
        "BlockStored", 0);
    ERR(KVT_ERR_INVAL, "events[0].block_hashes: want an integer or bytes", "a d a a s a s", 2, 0.0,
        1, 2, "BlockRemoved", 1, "abc");
    ERR(KVT_ERR_INVAL, "events[0].block_hashes: want an integer or bytes", "a d a a s a d", 2, 0.0,
        1, 2, "BlockRemoved", 1, 1.0);
    ERR(KVT_ERR_INVAL, "events[0].block_hashes: want an integer or bytes", "a d a a s a n", 2, 0.0,
        1, 2, "BlockRemoved", 1, 0);
    uint8_t big[65] = {0};
    ERR(KVT_ERR_INVAL, "a 0-byte hash", "a d a a s a b", 2, 0.0, 1, 2, "BlockRemoved", 1, big,
        (size_t)0);
    ERR(KVT_ERR_INVAL, "a 65-byte hash", "a d a a s a b", 2, 0.0, 1, 2, "BlockRemoved", 1, big,
        (size_t)65);
    ERR(KVT_ERR_INVAL, "events[0].parent_block_hash: want an integer or bytes", "a d a a s a u s",
        2, 0.0, 1, 3, "BlockStored", 1, (uint64_t)1, "x");
    ERR(KVT_ERR_INVAL, "events[0].token_ids: want an array", "a d a a s a u n u", 2, 0.0, 1, 4,
        "BlockStored", 1, (uint64_t)1, (uint64_t)1);
    ERR(KVT_ERR_INVAL, "events[0].token_ids: want an integer", "a d a a s a u n a i", 2, 0.0, 1, 4,
        "BlockStored", 1, (uint64_t)1, 1, (int64_t)-1);
    ERR(KVT_ERR_INVAL, "events[0].token_ids: want an integer", "a d a a s a u n a u", 2, 0.0, 1, 4,
        "BlockStored", 1, (uint64_t)1, 1, (uint64_t)1 << 32);
    ERR(KVT_ERR_INVAL, "events[0].block_size: want an integer", "a d a a s a u n a u s", 2, 0.0, 1,
        5, "BlockStored", 1, (uint64_t)1, 1, (uint64_t)1, "16");
    ERR(KVT_ERR_INVAL, "want block_size 2 x 1 block_hashes", "a d a a s a u n a u u", 2, 0.0, 1, 5,
        "BlockStored", 1, (uint64_t)1, 1, (uint64_t)1, (uint64_t)2);
    ERR(KVT_ERR_INVAL, "not a multiple of the 2 block_hashes", "a d a a s a uu n a uuu", 2, 0.0, 1,
        4, "BlockStored", 2, (uint64_t)1, (uint64_t)2, 3, (uint64_t)1, (uint64_t)1, (uint64_t)1);
    ERR(KVT_ERR_INVAL, "events[0].medium: want a string or nil", "a d a a s a u u", 2, 0.0, 1, 3,
        "BlockRemoved", 1, (uint64_t)1, (uint64_t)0);
    ERR(KVT_ERR_INVAL, "events[0].lora_name: want a string or nil", "a d a m s s s a u s u", 2, 0.0,
        1, 3, "type", "BlockStored", "block_hashes", 1, (uint64_t)1, "lora_name", (uint64_t)1);
    char name[300];
    memset(name, 'x', 256);
    name[256] = '\0';
    ERR(KVT_ERR_TOO_BIG, "events[0].lora_name: over 255 bytes", "a d a m s s s a u s s", 2, 0.0, 1,
        3, "type", "BlockStored", "block_hashes", 1, (uint64_t)1, "lora_name", name);
    /* a NUL inside a name: packed by hand */
    msgpack_sbuffer_clear(&sb);
    pk(&sb, "a d a m s s s a u s", 2, 0.0, 1, 3, "type", "BlockStored", "block_hashes", 1,
       (uint64_t)1, "lora_name");
    msgpack_sbuffer_write(&sb,
                          "\xa3"
                          "a\0b",
                          4);
    decode_err(&sb, KVT_ERR_INVAL, "events[0].lora_name: contains a NUL");
    /* the event index in messages counts skipped events too */
    ERR(KVT_ERR_INVAL, "events[2]: block_hashes is empty", "a d a a s a s a s a", 2, 0.0, 3, 1,
        "Unknown", 1, "AllBlocksCleared", 2, "BlockStored", 0);
#undef ERR
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
    raw_err(deep, 25, KVT_ERR_INVAL, "a batch is an array");
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
    kvt_ev_type_t type;
    unsigned tier;
    uint32_t nh, nt, bs;
    uint64_t h[8];
    uint32_t t[8 * 4];
    bool has_parent;
    uint64_t parent;
    char lora[8]; /* "" none */
} ref_ev_t;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Packs hash @v in a random form that decodes back to @v under @fmt. */
static void pack_hash(msgpack_packer *p, uint64_t *s, kvt_ev_format_t fmt, uint64_t v)
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

static const char *const medium_name[] = {"GPU", "CPU", "DISK", "gpu", "Cpu", "nvme"};
static const unsigned medium_tier[] = {KVT_TIER_GPU, KVT_TIER_CPU, KVT_TIER_DISK,
                                       KVT_TIER_GPU, KVT_TIER_CPU, KVT_TIER_DISK};

/* Packs @e as an array or a map, with nils, omissions and unknown fields at random; counts them. */
static void pack_event(msgpack_packer *p, uint64_t *s, kvt_ev_format_t fmt, ref_ev_t *e,
                       size_t *unknown)
{
    int medium = (int)(rnd(s) % 7) - 1; /* -1: absent */
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
    if (as_map) {
        bool extra = rnd(s) % 4 == 0;
        uint32_t n = 2 + (medium >= 0) + extra +
                     (stored ? (e->has_parent + (e->nt > 0) * 2 + (e->lora[0] != 0)) : 0);
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
        if (type_last) {
            pack_str(p, "type");
            pack_str(p, stored ? "BlockStored" : "BlockRemoved");
        }
        return;
    }
    /* positional: up to the last field that differs from its default, sometimes all */
    uint32_t last; /* number of fields after the type name */
    if (stored) {
        last = e->lora[0] ? 7 : medium >= 0 ? 6 : e->nt > 0 ? 4 : e->has_parent ? 2 : 1;
        if (rnd(s) % 3 == 0)
            last = 11;
    } else {
        last = medium >= 0 ? 2 : 1;
        if (rnd(s) % 3 == 0)
            last = 3;
    }
    uint32_t extra = rnd(s) % 4 == 0 ? 1 + (uint32_t)(rnd(s) % 2) : 0;
    if (extra && !((stored && last == 11) || (!stored && last == 3)))
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
            else if (f == 2)
                msgpack_pack_nil(p);
            else
                msgpack_pack_uint32(p, 0); /* group_idx */
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
            if (e->lora[0])
                pack_str(p, e->lora);
            else
                msgpack_pack_nil(p);
            break;
        default: msgpack_pack_nil(p); break; /* lora_id, extra_keys, group_idx, spec fields */
        }
    }
    for (uint32_t i = 0; i < extra; i++)
        msgpack_pack_uint32(p, 1);
    *unknown += extra;
}

static void test_random_batches(void **state)
{
    (void)state;
    const char *env = getenv("KVT_EVM_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    uint64_t s = seed | 1;
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
        msgpack_pack_array(&p, with_rank ? 3 : 2);
        msgpack_pack_double(&p, (double)round);
        msgpack_pack_array(&p, nev);
        for (uint32_t i = 0; i < nev; i++) {
            ref_ev_t *e = &ref[i];
            memset(e, 0, sizeof(*e));
            e->type = (kvt_ev_type_t)(1 + rnd(&s) % 3);
            e->nh = e->type == KVT_EV_CLEARED ? 0 : 1 + (uint32_t)(rnd(&s) % 8);
            for (uint32_t j = 0; j < e->nh; j++)
                e->h[j] = rnd(&s) >> (rnd(&s) % 64);
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
            }
            pack_event(&p, &s, fmt, e, &unknown);
        }
        uint32_t rank = 7;
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
            if (e->type != r->type || e->nhashes != r->nh || e->tier != r->tier)
                fail_msg("seed %llu round %d event %u: type %d/%d hashes %u/%u tier %u/%u",
                         (unsigned long long)seed, round, i, e->type, r->type, e->nhashes, r->nh,
                         e->tier, r->tier);
            for (uint32_t j = 0; j < r->nh; j++)
                assert_true(e->hashes[j] == r->h[j]);
            if (r->type != KVT_EV_STORED)
                continue;
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
        cmocka_unit_test(test_shape_errors),
        cmocka_unit_test(test_raw_errors),
        cmocka_unit_test(test_max_items_and_args),
        cmocka_unit_test(test_random_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
