/*
 * kvindex/event_json: the POST /v1/events decoder. Every field and variant,
 * every error (with the batch left untouched and a message naming the
 * event), unknown counting, max_items, the arena (pointers inside it, the
 * worst cases of its size bound; ASan checks the rest), a batch of 10k
 * events, and random batches written as JSON in random field order with
 * random extra fields, decoded and compared with what was written.
 * KVT_TEST_SEED=<n> draws other random batches, or replays a printed seed
 * (tests/support/rng.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/json.h"
#include "kvindex/event.h"
#include "tests/support/rng.h"

#define BIG ((size_t)1 << 40)

/* ---- helpers -------------------------------------------------------------------------- */

/* Every pointer of @b lies inside its arena; names are NUL-terminated within it. */
static void check_inside(const kvt_evbatch_t *b)
{
    const char *lo = b->arena;
    size_t size = malloc_usable_size(b->arena);
    const char *hi = lo + size;
#define INSIDE(p, n) assert_true((const char *)(p) >= lo && (const char *)(p) + (n) <= hi)
    assert_non_null(b->arena);
    INSIDE(b->pod, strlen(b->pod) + 1);
    INSIDE(b->model, strlen(b->model) + 1);
    if (b->lora != NULL)
        INSIDE(b->lora, strlen(b->lora) + 1);
    if (b->nev > 0)
        INSIDE(b->ev, b->nev * sizeof(kvt_event_t));
    else
        assert_null(b->ev);
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        assert_true((e->hashes == NULL) == (e->nhashes == 0));
        assert_true((e->tokens == NULL) == (e->ntokens == 0));
        if (e->nhashes > 0)
            INSIDE(e->hashes, e->nhashes * sizeof(uint64_t));
        if (e->ntokens > 0) {
            INSIDE(e->tokens, e->ntokens * sizeof(uint32_t));
            assert_int_equal((uint64_t)e->ntokens, (uint64_t)e->block_size * e->nhashes);
        }
        if (e->lora_name != NULL)
            INSIDE(e->lora_name, strlen(e->lora_name) + 1);
        assert_true((uintptr_t)e->hashes % 8 == 0 && (uintptr_t)e->tokens % 4 == 0);
    }
#undef INSIDE
}

static void decode_ok_n(const char *body, size_t len, size_t max_items, kvt_evbatch_t *b)
{
    char err[256] = "unset";
    kvt_status_t st = kvt_ev_json_decode(body, len, max_items, b, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("decode: status %d (%s) for %.*s", st, err, (int)(len > 300 ? 300 : len), body);
    check_inside(b);
}

static void decode_ok(const char *body, kvt_evbatch_t *b)
{
    decode_ok_n(body, strlen(body), BIG, b);
}

/* Decoding @body fails with @want_st, a message containing @want_msg, and @b untouched. */
static void decode_err_max(const char *body, size_t max_items, kvt_status_t want_st,
                           const char *want_msg)
{
    kvt_evbatch_t b, pattern;
    char err[256];
    memset(&b, 0xa5, sizeof(b));
    memset(&pattern, 0xa5, sizeof(pattern));
    memset(err, 'x', sizeof(err));
    kvt_status_t st = kvt_ev_json_decode(body, strlen(body), max_items, &b, err, sizeof(err));
    if (st != want_st)
        fail_msg("body %s: status %d (%s), want %d", body, st, st == KVT_OK ? "ok" : err, want_st);
    assert_memory_equal(&b, &pattern, sizeof(b));
    assert_non_null(memchr(err, '\0', sizeof(err)));
    assert_true(err[0] != '\0');
    assert_null(strchr(err, '\n'));
    if (strstr(err, want_msg) == NULL)
        fail_msg("body %s: message \"%s\" lacks \"%s\"", body, err, want_msg);
}

static void decode_err(const char *body, kvt_status_t want_st, const char *want_msg)
{
    decode_err_max(body, BIG, want_st, want_msg);
}

#define HDR "{\"pod\":\"p\",\"model\":\"m\",\"events\":["
#define FTR "]}"

/* ---- fields and variants -------------------------------------------------------------- */

static void test_block_stored_full(void **state)
{
    (void)state;
    kvt_evbatch_t b;
    decode_ok("{\"pod\":\"pod-a\",\"model\":\"meta-llama/Llama-3.1-8B\",\"lora_name\":\"sql\","
              "\"dp_rank\":3,\"events\":[{\"type\":\"BlockStored\",\"block_hashes\":"
              "[18446744073709551615,-1,7],\"parent_block_hash\":-4658296946329380185,"
              "\"token_ids\":[1,2,3,4,5,6],\"block_size\":2,\"lora_id\":null,\"medium\":\"GPU\","
              "\"lora_name\":\"chat\",\"extra_keys\":[null,[\"x\",1],null],\"group_idx\":0,"
              "\"kv_cache_spec_kind\":\"full_attention\",\"kv_cache_spec_sliding_window\":null}]}",
              &b);
    assert_string_equal(b.pod, "pod-a");
    assert_string_equal(b.model, "meta-llama/Llama-3.1-8B");
    assert_string_equal(b.lora, "sql");
    assert_int_equal(b.dp_rank, 3);
    assert_int_equal(b.nev, 1);
    assert_int_equal(b.unknown, 0); /* the known-but-unused fields are not counted */
    const kvt_event_t *e = &b.ev[0];
    assert_int_equal(e->type, KVT_EV_STORED);
    assert_int_equal(e->tier, KVT_TIER_GPU);
    assert_int_equal(e->nhashes, 3);
    assert_true(e->hashes[0] == UINT64_MAX && e->hashes[1] == UINT64_MAX && e->hashes[2] == 7);
    assert_true(e->has_parent);
    assert_true(e->parent == (uint64_t)INT64_C(-4658296946329380185));
    assert_int_equal(e->ntokens, 6);
    const uint32_t want[] = {1, 2, 3, 4, 5, 6};
    assert_memory_equal(e->tokens, want, sizeof(want));
    assert_int_equal(e->block_size, 2);
    assert_string_equal(e->lora_name, "chat");
    kvt_evbatch_cleanup(&b);
    kvt_evbatch_t zero;
    memset(&zero, 0, sizeof(zero));
    assert_memory_equal(&b, &zero, sizeof(b));
}

static void test_block_stored_minimal(void **state)
{
    (void)state;
    kvt_evbatch_t b;
    /* Key order is free; absent fields take their defaults. */
    decode_ok("{\"events\":[{\"block_hashes\":[5],\"type\":\"BlockStored\"}],\"model\":\"m\","
              "\"pod\":\"p\"}",
              &b);
    assert_int_equal(b.dp_rank, 0);
    assert_null(b.lora);
    const kvt_event_t *e = &b.ev[0];
    assert_int_equal(e->type, KVT_EV_STORED);
    assert_int_equal(e->tier, KVT_TIER_GPU);
    assert_false(e->has_parent);
    assert_int_equal(e->ntokens, 0);
    assert_null(e->tokens);
    assert_int_equal(e->block_size, 0);
    assert_null(e->lora_name);
    kvt_evbatch_cleanup(&b);

    /* nulls are defaults too; tokens without block_size give block_size = ntokens/nhashes */
    decode_ok(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1,2],\"parent_block_hash\":null,"
                  "\"token_ids\":[1,2,3,4,5,6],\"medium\":null,\"lora_name\":null}" FTR,
              &b);
    e = &b.ev[0];
    assert_false(e->has_parent);
    assert_int_equal(e->block_size, 3);
    assert_int_equal(e->tier, KVT_TIER_GPU);
    assert_null(e->lora_name);
    kvt_evbatch_cleanup(&b);

    /* vLLM's CPU placeholder: no tokens, block_size 0 */
    decode_ok(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[9],\"token_ids\":[],"
                  "\"block_size\":0,\"medium\":\"CPU\"}" FTR,
              &b);
    e = &b.ev[0];
    assert_int_equal(e->ntokens, 0);
    assert_null(e->tokens);
    assert_int_equal(e->block_size, 0);
    assert_int_equal(e->tier, KVT_TIER_CPU);
    kvt_evbatch_cleanup(&b);

    /* block_size without tokens is kept */
    decode_ok(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[9],\"block_size\":16}" FTR, &b);
    assert_int_equal(b.ev[0].block_size, 16);
    kvt_evbatch_cleanup(&b);

    /* an empty lora_name is kept as "" (the base model) */
    decode_ok("{\"pod\":\"p\",\"model\":\"m\",\"lora_name\":\"\",\"events\":[{\"type\":"
              "\"BlockStored\",\"block_hashes\":[1],\"lora_name\":\"\"}]}",
              &b);
    assert_string_equal(b.lora, "");
    assert_string_equal(b.ev[0].lora_name, "");
    kvt_evbatch_cleanup(&b);
    decode_ok("{\"pod\":\"p\",\"model\":\"m\",\"lora_name\":null,\"events\":[]}", &b);
    assert_null(b.lora);
    kvt_evbatch_cleanup(&b);
}

static void test_mediums(void **state)
{
    (void)state;
    static const struct {
        const char *medium;
        unsigned tier;
    } cases[] = {
        {"\"GPU\"", KVT_TIER_GPU},       {"\"gpu\"", KVT_TIER_GPU},   {"\"CPU\"", KVT_TIER_CPU},
        {"\"Cpu\"", KVT_TIER_CPU},       {"\"DISK\"", KVT_TIER_DISK}, {"\"disk\"", KVT_TIER_DISK},
        {"\"NVME\"", KVT_TIER_DISK},     {"\"NVMe\"", KVT_TIER_DISK}, {"null", KVT_TIER_GPU},
        {"\"\\u0047PU\"", KVT_TIER_GPU},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char body[256];
        kvt_evbatch_t b;
        snprintf(body, sizeof(body),
                 HDR "{\"type\":\"BlockRemoved\",\"block_hashes\":[1],\"medium\":%s}" FTR,
                 cases[i].medium);
        decode_ok(body, &b);
        assert_int_equal(b.ev[0].tier, cases[i].tier);
        kvt_evbatch_cleanup(&b);
    }
    /* unknown mediums: kept, skipped, named (cut to KVT_EV_MEDIUM_NAME_MAX bytes) */
    static const struct {
        const char *medium, *name;
    } skipped[] = {
        {"\"TPU\"", "TPU"},
        {"\"\"", "?"},
        {"\"GPU \"", "GPU "},
        {"\"a-very-long-medium-name-indeed\"", "a-very-long-medium-name-indeed"},
        {"\"a-medium-name-longer-than-32-bytes-is-cut\"", "a-medium-name-longer-than-32-byt"},
        {"\"\\u00e9-a-medium-name-longer-than-32-bytes\"",
         "\xc3\xa9-a-medium-name-longer-than-32-"},
        {"\"a-medium-name-of-31-bytes-then-\\u00e9\"", "a-medium-name-of-31-bytes-then-"},
    };
    for (size_t i = 0; i < sizeof(skipped) / sizeof(skipped[0]); i++) {
        char body[256];
        kvt_evbatch_t b;
        snprintf(body, sizeof(body),
                 HDR "{\"type\":\"BlockRemoved\",\"block_hashes\":[1],\"medium\":%s}" FTR,
                 skipped[i].medium);
        decode_ok(body, &b);
        assert_int_equal(b.nev, 1);
        assert_int_equal(b.ev[0].tier, 0);
        assert_int_equal(b.ev[0].skip, KVT_EV_SKIP_MEDIUM);
        assert_int_equal(b.ev[0].medium_len, strlen(skipped[i].name));
        assert_memory_equal(b.ev[0].medium, skipped[i].name, b.ev[0].medium_len);
        kvt_evbatch_cleanup(&b);
    }
    /* every medium name the engines use */
    static const struct {
        const char *name;
        unsigned tier;
    } engines[] = {{"GPU", KVT_TIER_GPU},        {"CPU", KVT_TIER_CPU},
                   {"CPU_PINNED", KVT_TIER_CPU}, {"STORAGE", KVT_TIER_DISK},
                   {"DISK", KVT_TIER_DISK},      {"EXTERNAL", KVT_TIER_DISK},
                   {"cpu_pinned", KVT_TIER_CPU}, {"NVME", KVT_TIER_DISK}};
    for (size_t i = 0; i < sizeof(engines) / sizeof(engines[0]); i++)
        assert_int_equal(kvt_ev_medium_tier(engines[i].name, strlen(engines[i].name)),
                         engines[i].tier);
    assert_int_equal(kvt_ev_medium_tier("CPU_PINNEDX", 11), 0);
    assert_int_equal(kvt_ev_medium_tier("CPU", 2), 0);
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"medium\":1}" FTR,
               KVT_ERR_INVAL, "medium' must be a string or null");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"medium\":\"GP\\u00\"}" FTR,
               KVT_ERR_PARSE, "events[0].medium: offset");
}

static void test_removed_and_cleared(void **state)
{
    (void)state;
    kvt_evbatch_t b;
    decode_ok(HDR "{\"type\":\"BlockRemoved\",\"block_hashes\":[1,-2],\"medium\":\"CPU\","
                  "\"group_idx\":1},"
                  "{\"type\":\"AllBlocksCleared\"},"
                  "{\"type\":\"BlockRemoved\",\"block_hashes\":[]}" FTR,
              &b);
    assert_int_equal(b.nev, 3);
    assert_int_equal(b.unknown, 0);
    assert_int_equal(b.ev[0].type, KVT_EV_REMOVED);
    assert_int_equal(b.ev[0].tier, KVT_TIER_CPU);
    assert_int_equal(b.ev[0].nhashes, 2);
    assert_true(b.ev[0].hashes[1] == (uint64_t)-2);
    assert_int_equal(b.ev[1].type, KVT_EV_CLEARED);
    assert_int_equal(b.ev[1].nhashes, 0);
    assert_null(b.ev[1].hashes);
    assert_int_equal(b.ev[2].type, KVT_EV_REMOVED);
    assert_int_equal(b.ev[2].nhashes, 0);
    assert_null(b.ev[2].hashes);
    kvt_evbatch_cleanup(&b);

    /* Fields another type uses are unknown here: counted and ignored. */
    decode_ok(HDR "{\"type\":\"BlockRemoved\",\"block_hashes\":[1],\"token_ids\":[1],"
                  "\"parent_block_hash\":3},"
                  "{\"token_ids\":[1,2],\"block_hashes\":[4],\"type\":\"BlockRemoved\"},"
                  "{\"type\":\"AllBlocksCleared\",\"medium\":\"CPU\",\"block_hashes\":[1]},"
                  "{\"block_hashes\":[1],\"medium\":\"CPU\",\"type\":\"AllBlocksCleared\"}" FTR,
              &b);
    assert_int_equal(b.nev, 4);
    assert_int_equal(b.unknown, 2 + 1 + 2 + 2);
    assert_int_equal(b.ev[0].ntokens, 0);
    assert_false(b.ev[0].has_parent);
    assert_int_equal(b.ev[1].ntokens, 0);
    assert_null(b.ev[1].tokens);
    assert_int_equal(b.ev[1].nhashes, 1);
    assert_int_equal(b.ev[3].nhashes, 0);
    assert_int_equal(b.ev[3].tier, KVT_TIER_GPU);
    kvt_evbatch_cleanup(&b);

    /* A batch without BlockStored may omit the model. */
    decode_ok("{\"pod\":\"p\",\"events\":[{\"type\":\"AllBlocksCleared\"}]}", &b);
    assert_string_equal(b.model, "");
    kvt_evbatch_cleanup(&b);
    decode_ok("{\"pod\":\"p\",\"events\":[]}", &b);
    assert_int_equal(b.nev, 0);
    assert_null(b.ev);
    kvt_evbatch_cleanup(&b);
}

static void test_unknown_counting(void **state)
{
    (void)state;
    kvt_evbatch_t b;
    decode_ok(HDR "{\"type\":\"BlockMoved\",\"block_hashes\":[[1]],\"to\":\"x\"},"
                  "{\"block_hashes\":\"not-an-array\",\"token_ids\":{},\"type\":\"Future\"},"
                  "{\"block_hashes\":[1],\"type\":\"Future\",\"medium\":7},"
                  "{\"type\":\"A-type-name-much-longer-than-any-known-one\",\"x\":1},"
                  "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"new_field\":{\"a\":[1]},"
                  "\"another\":null},"
                  "{\"type\":\"AllBlocksCleared\",\"why\":\"reset\"},"
                  "{\"type\":\"blockstored\",\"block_hashes\":[1]}" FTR,
              &b);
    assert_int_equal(b.nev, 2);
    assert_int_equal(b.ev[0].type, KVT_EV_STORED);
    assert_int_equal(b.ev[1].type, KVT_EV_CLEARED);
    assert_int_equal(b.unknown, 5 + 2 + 1);
    kvt_evbatch_cleanup(&b);

    /* Unknown events do not use up max_items: 1 hash of the known one. */
    decode_ok_n(HDR "{\"type\":\"Future\",\"block_hashes\":[1,2,3,4]},"
                    "{\"block_hashes\":[1,2,3,4],\"type\":\"Future\"},"
                    "{\"type\":\"BlockStored\",\"block_hashes\":[1]}" FTR,
                strlen(HDR "{\"type\":\"Future\",\"block_hashes\":[1,2,3,4]},"
                           "{\"block_hashes\":[1,2,3,4],\"type\":\"Future\"},"
                           "{\"type\":\"BlockStored\",\"block_hashes\":[1]}" FTR),
                1, &b);
    assert_int_equal(b.nev, 1);
    assert_int_equal(b.unknown, 2);
    kvt_evbatch_cleanup(&b);
}

/* ---- errors --------------------------------------------------------------------------- */

static void test_event_errors(void **state)
{
    (void)state;
    /* token_ids length */
    decode_err(HDR "{\"type\":\"AllBlocksCleared\"},{\"type\":\"AllBlocksCleared\"},"
                   "{\"type\":\"AllBlocksCleared\"},{\"type\":\"BlockStored\",\"block_hashes\":"
                   "[1,2],\"block_size\":16,\"token_ids\":[" //
                   "0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,"
                   "8,9,0,1,2,3,4,5,6,7]}" FTR,
               KVT_ERR_INVAL, "events[3]: token_ids has 48 entries, want 32");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1,2],\"token_ids\":[1,2,3]}" FTR,
               KVT_ERR_INVAL, "events[0]: token_ids has 3 entries, not a multiple of the 2");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"token_ids\":[1],"
                   "\"block_size\":0}" FTR,
               KVT_ERR_INVAL, "token_ids has 1 entries, want 0");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"block_size\":4294967295,"
                   "\"token_ids\":[1]}" FTR,
               KVT_ERR_INVAL, "want 4294967295");
    /* required fields */
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[]}" FTR, KVT_ERR_INVAL,
               "events[0]: block_hashes is empty");
    decode_err(HDR "{\"type\":\"BlockStored\"}" FTR, KVT_ERR_INVAL,
               "events[0]: missing field 'block_hashes'");
    decode_err(HDR "{\"type\":\"BlockRemoved\",\"medium\":\"GPU\"}" FTR, KVT_ERR_INVAL,
               "events[0]: missing field 'block_hashes'");
    decode_err(HDR "{\"block_hashes\":[1]}" FTR, KVT_ERR_INVAL, "events[0]: missing field 'type'");
    decode_err(HDR "{}" FTR, KVT_ERR_INVAL, "events[0]: missing field 'type'");
    decode_err(HDR "{\"type\":7}" FTR, KVT_ERR_INVAL, "events[0]: field 'type' must be a string");
    decode_err(HDR "{\"block_hashes\":\"x\",\"type\":null}" FTR, KVT_ERR_INVAL,
               "events[0]: field 'type' must be a string");
    decode_err(HDR "{\"type\":\"BlockStored\",\"type\":\"BlockStored\",\"block_hashes\":[1]}" FTR,
               KVT_ERR_INVAL, "events[0]: offset 55: duplicate field 'type'");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"block_hashes\":[1]}" FTR,
               KVT_ERR_INVAL, "events[0]: offset 74: duplicate field 'block_hashes'");
    decode_err(HDR "[\"BlockStored\",[1]]" FTR, KVT_ERR_INVAL, "events[0]: an event must be an");
    decode_err(HDR "{\"type\":\"AllBlocksCleared\"},7" FTR, KVT_ERR_INVAL, "events[1]:");
    /* wrong types and values inside an event */
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1.5]}" FTR, KVT_ERR_INVAL,
               "events[0].block_hashes: offset 71: expected an integer hash, got a number with");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[18446744073709551616]}" FTR,
               KVT_ERR_INVAL, "events[0].block_hashes: offset 71:");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[-9223372036854775809]}" FTR,
               KVT_ERR_INVAL, "out of range");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[\"ab\"]}" FTR, KVT_ERR_INVAL,
               "got a string");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":1}" FTR, KVT_ERR_INVAL,
               "expected an array");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"token_ids\":[4294967296]}" FTR,
               KVT_ERR_INVAL, "events[0].token_ids:");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"token_ids\":[-1]}" FTR,
               KVT_ERR_INVAL, "events[0].token_ids:");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"block_size\":-1}" FTR,
               KVT_ERR_INVAL, "events[0].block_size:");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"block_size\":1.0}" FTR,
               KVT_ERR_INVAL, "events[0].block_size:");
    decode_err(HDR
               "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"parent_block_hash\":\"x\"}" FTR,
               KVT_ERR_INVAL, "events[0].parent_block_hash:");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"lora_name\":5}" FTR,
               KVT_ERR_INVAL, "events[0]: field 'lora_name' must be a string");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"lora_name\":\"a\\u0000\"}" FTR,
               KVT_ERR_INVAL, "NUL");
    /* the same field error whether "type" comes first or last */
    decode_err(HDR "{\"block_hashes\":[1],\"token_ids\":[1,2,3],\"block_size\":2,"
                   "\"type\":\"BlockStored\"}" FTR,
               KVT_ERR_INVAL, "events[0]: token_ids has 3 entries, want 2");
    decode_err(HDR "{\"block_hashes\":[\"x\"],\"type\":\"BlockStored\"}" FTR, KVT_ERR_INVAL,
               "events[0].block_hashes: offset 50: expected an integer hash, got a string");
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[\"x\"]}" FTR, KVT_ERR_INVAL,
               "events[0].block_hashes: offset 71: expected an integer hash, got a string");
    decode_err(HDR "{\"block_hashes\":[1],\"block_hashes\":[2],\"type\":\"BlockStored\"}" FTR,
               KVT_ERR_INVAL, "duplicate field 'block_hashes'");
    /* a syntax error is one whatever the event's type */
    decode_err(HDR "{\"block_hashes\":[1,],\"type\":\"Future\"}" FTR, KVT_ERR_PARSE,
               "events[0].block_hashes: offset 52: expected a value");
    decode_err(HDR "{\"type\":\"Future\",\"x\":[1,]}" FTR, KVT_ERR_PARSE, "events[0]: offset");
    decode_err(HDR "{\"type\":\"Future\",\"x\":\"\\ud800\"}" FTR, KVT_ERR_PARSE, "surrogate");
}

static void test_top_level_errors(void **state)
{
    (void)state;
    char body[1024];
    decode_err("", KVT_ERR_PARSE, "offset 0: expected a value");
    decode_err("  ", KVT_ERR_PARSE, "offset 2:");
    decode_err("{\"pod\":\"p\",", KVT_ERR_PARSE, "offset 11: expected a key");
    decode_err("{\"pod\":\"p\",\"events\":[]} x", KVT_ERR_PARSE,
               "offset 24: expected end of input");
    decode_err("{\"pod\":\"p\",\"events\":[]}{}", KVT_ERR_PARSE, "offset 23:");
    decode_err("[]", KVT_ERR_INVAL, "the body must be a JSON object");
    decode_err("null", KVT_ERR_INVAL, "the body must be a JSON object");
    decode_err("{\"pod\":\"p\",\"events\":[],\"ts\":1.5}", KVT_ERR_INVAL, "unknown field 'ts'");
    decode_err("{\"Pod\":\"p\",\"events\":[]}", KVT_ERR_INVAL, "unknown field 'Pod'");
    decode_err("{\"po\\u0000d\":\"p\"}", KVT_ERR_INVAL, "unknown field 'po?d'");
    decode_err("{\"pod\":\"p\",\"pod\":\"q\",\"events\":[]}", KVT_ERR_INVAL,
               "duplicate field 'pod'");
    decode_err("{\"pod\":\"p\",\"events\":[],\"events\":[]}", KVT_ERR_INVAL,
               "duplicate field 'events'");
    decode_err("{\"events\":[]}", KVT_ERR_INVAL, "missing field 'pod'");
    decode_err("{\"pod\":\"p\"}", KVT_ERR_INVAL, "missing field 'events'");
    decode_err("{\"pod\":\"\",\"events\":[]}", KVT_ERR_INVAL, "field 'pod' is empty");
    decode_err("{\"pod\":7,\"events\":[]}", KVT_ERR_INVAL, "field 'pod' must be a string");
    decode_err("{\"pod\":null,\"events\":[]}", KVT_ERR_INVAL, "field 'pod' must be a string");
    decode_err("{\"pod\":\"a\\u0000b\",\"events\":[]}", KVT_ERR_INVAL, "NUL");
    decode_err("{\"pod\":\"p\",\"model\":null,\"events\":[]}", KVT_ERR_INVAL,
               "field 'model' must be a string");
    decode_err("{\"pod\":\"p\",\"lora_name\":[],\"events\":[]}", KVT_ERR_INVAL,
               "field 'lora_name' must be a string");
    decode_err("{\"pod\":\"p\",\"events\":{}}", KVT_ERR_INVAL, "field 'events' must be an array");
    decode_err("{\"pod\":\"p\",\"dp_rank\":-1,\"events\":[]}", KVT_ERR_INVAL, "field 'dp_rank'");
    decode_err("{\"pod\":\"p\",\"dp_rank\":4294967296,\"events\":[]}", KVT_ERR_INVAL,
               "field 'dp_rank'");
    decode_err("{\"pod\":\"p\",\"dp_rank\":\"0\",\"events\":[]}", KVT_ERR_INVAL, "field 'dp_rank'");
    decode_err("{\"pod\":\"p\",\"events\":[{\"type\":\"BlockStored\",\"block_hashes\":[1]}]}",
               KVT_ERR_INVAL, "missing field 'model'");
    decode_err("{\"pod\":\"p\",\"model\":\"\",\"events\":[{\"type\":\"BlockStored\","
               "\"block_hashes\":[1]}]}",
               KVT_ERR_INVAL, "empty field 'model'");
    /* Names: 255 bytes fit, 256 are TOO_BIG (for pod, model and LoRA names). */
    static const char *const fields[] = {"pod", "model", "lora_name"};
    for (size_t f = 0; f < 3; f++) {
        for (size_t len = 255; len <= 256; len++) {
            int n = snprintf(body, sizeof(body), "{\"events\":[],\"%s\":\"", fields[f]);
            memset(body + n, 'n', len);
            n += (int)len;
            snprintf(body + n, sizeof(body) - (size_t)n, "\"%s}", f == 0 ? "" : ",\"pod\":\"p\"");
            if (len == 255) {
                kvt_evbatch_t b;
                decode_ok(body, &b);
                kvt_evbatch_cleanup(&b);
            } else {
                decode_err(body, KVT_ERR_TOO_BIG, "longer than 255 bytes");
            }
        }
    }
    /* 255 bytes of multi-byte characters fit too (85 x 3 bytes) */
    int n = snprintf(body, sizeof(body), "{\"events\":[],\"pod\":\"");
    for (int k = 0; k < 85; k++)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "\\u20ac");
    snprintf(body + n, sizeof(body) - (size_t)n, "\"}");
    kvt_evbatch_t b;
    decode_ok(body, &b);
    assert_int_equal(strlen(b.pod), 255);
    kvt_evbatch_cleanup(&b);
    /* depth: unknown event fields may nest, within the parser's limit */
    n = snprintf(body, sizeof(body), HDR "{\"type\":\"AllBlocksCleared\",\"x\":");
    for (int k = 0; k < 61; k++)
        body[n++] = '[';
    for (int k = 0; k < 61; k++)
        body[n++] = ']';
    snprintf(body + n, sizeof(body) - (size_t)n, "}" FTR);
    decode_ok(body, &b);
    assert_int_equal(b.unknown, 1);
    kvt_evbatch_cleanup(&b);
    n = snprintf(body, sizeof(body), HDR "{\"type\":\"AllBlocksCleared\",\"x\":");
    for (int k = 0; k < 62; k++)
        body[n++] = '[';
    for (int k = 0; k < 62; k++)
        body[n++] = ']';
    snprintf(body + n, sizeof(body) - (size_t)n, "}" FTR);
    decode_err(body, KVT_ERR_TOO_BIG, "nesting deeper than 64");
}

static void test_max_items(void **state)
{
    (void)state;
    const char *body = HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1,2],\"token_ids\":[1,2,3,"
                           "4]},{\"type\":\"BlockRemoved\",\"block_hashes\":[1]}" FTR;
    kvt_evbatch_t b;
    decode_ok_n(body, strlen(body), 7, &b);
    kvt_evbatch_cleanup(&b);
    decode_err_max(body, 6, KVT_ERR_TOO_BIG, "events[1].block_hashes: more than 6 hashes");
    decode_err_max(body, 5, KVT_ERR_TOO_BIG, "events[0].token_ids: more than 5");
    decode_err_max(body, 2, KVT_ERR_TOO_BIG, "events[0].token_ids: more than 2");
    decode_err_max(body, 1, KVT_ERR_TOO_BIG, "events[0].block_hashes: more than 1");
    decode_err_max(body, 0, KVT_ERR_TOO_BIG, "events[0].block_hashes: more than 0");
    decode_ok_n(HDR "{\"type\":\"AllBlocksCleared\"}" FTR,
                strlen(HDR "{\"type\":\"AllBlocksCleared\"}" FTR), 0, &b);
    kvt_evbatch_cleanup(&b);
}

static void test_args_and_cleanup(void **state)
{
    (void)state;
    kvt_evbatch_t b;
    char err[64];
    memset(&b, 0, sizeof(b));
    kvt_evbatch_cleanup(&b); /* zeroed: no-op */
    kvt_evbatch_cleanup(NULL);
    assert_int_equal(kvt_ev_json_decode(NULL, 0, 10, &b, err, sizeof(err)), KVT_ERR_PARSE);
    assert_int_equal(kvt_ev_json_decode(NULL, 5, 10, &b, err, sizeof(err)), KVT_ERR_INVAL);
    assert_int_equal(kvt_ev_json_decode("{}", 2, 10, NULL, err, sizeof(err)), KVT_ERR_INVAL);
    /* No error buffer, or a tiny one. */
    assert_int_equal(kvt_ev_json_decode("[]", 2, 10, &b, NULL, 0), KVT_ERR_INVAL);
    char tiny[1] = {'x'};
    assert_int_equal(kvt_ev_json_decode("[]", 2, 10, &b, tiny, 1), KVT_ERR_INVAL);
    assert_int_equal(tiny[0], '\0');
    char small[12];
    assert_int_equal(kvt_ev_json_decode("{\"x\":1}", 7, 10, &b, small, sizeof(small)),
                     KVT_ERR_INVAL);
    assert_string_equal(small, "unknown fie");
    /* Not NUL-terminated: only len bytes are read. */
    const char *body = "{\"pod\":\"p\",\"events\":[]}trailing";
    decode_ok_n(body, 23, 10, &b);
    kvt_evbatch_cleanup(&b);
}

/* ---- the arena ------------------------------------------------------------------------ */

/* Bodies that use the most arena per byte: the size bound must hold (no INTERNAL). */
static void test_arena_worst_cases(void **state)
{
    (void)state;
    kvt_jbuf_t j;
    kvt_evbatch_t b;
    kvt_jbuf_init(&j);

    for (int shape = 0; shape < 6; shape++) {
        kvt_jbuf_reset(&j);
        kvt_jbuf_cstr(&j, "{\"pod\":\"p\",\"model\":\"m\",\"events\":[");
        for (int i = 0; i < 2000; i++) {
            if (i > 0)
                kvt_jbuf_cstr(&j, ",");
            switch (shape) {
            case 0: kvt_jbuf_cstr(&j, "{\"type\":\"AllBlocksCleared\"}"); break;
            case 1: /* tiny hash arrays after 1-byte names: the most alignment */
                kvt_jbuf_cstr(&j, "{\"lora_name\":\"\",\"block_hashes\":[1],\"type\":"
                                  "\"BlockStored\",\"token_ids\":[1]}");
                break;
            case 2: kvt_jbuf_cstr(&j, "{\"type\":\"BlockRemoved\",\"block_hashes\":[]}"); break;
            case 3: /* long arrays of one-digit hashes */
                kvt_jbuf_cstr(&j, "{\"type\":\"BlockRemoved\",\"block_hashes\":[1");
                for (int k = 0; k < 200; k++)
                    kvt_jbuf_cstr(&j, ",1");
                kvt_jbuf_cstr(&j, "]}");
                break;
            case 4: /* unknown events between known ones */
                kvt_jbuf_cstr(&j, "{\"block_hashes\":[1,2,3],\"type\":\"X\"},"
                                  "{\"type\":\"AllBlocksCleared\"}");
                break;
            default: /* names that decode to more bytes per escape: \u20ac is 6 -> 3 */
                kvt_jbuf_cstr(&j, "{\"type\":\"BlockStored\",\"block_hashes\":[0],"
                                  "\"lora_name\":\"\\u20ac\\u20ac\"}");
                break;
            }
        }
        kvt_jbuf_cstr(&j, "]}");
        assert_false(j.oom);
        decode_ok_n(j.buf, j.len, BIG, &b);
        assert_int_equal(b.nev, 2000);
        kvt_evbatch_cleanup(&b);
    }
    kvt_jbuf_cleanup(&j);
}

static void test_big_batch(void **state)
{
    (void)state;
    kvt_jbuf_t j;
    kvt_evbatch_t b;
    const size_t nev = 10000, bs = 16;

    kvt_jbuf_init(&j);
    kvt_jbuf_cstr(&j,
                  "{\"pod\":\"decode-7\",\"model\":\"Qwen/Qwen3-32B\",\"dp_rank\":1,\"events\":[");
    for (size_t i = 0; i < nev; i++) {
        if (i > 0)
            kvt_jbuf_cstr(&j, ",");
        if (i % 10 == 9) {
            kvt_jbuf_cstr(&j, "{\"type\":\"BlockRemoved\",\"block_hashes\":[");
            kvt_jbuf_u64(&j, i * UINT64_C(0x9e3779b97f4a7c15));
            kvt_jbuf_cstr(&j, "]}");
            continue;
        }
        kvt_jbuf_cstr(&j, "{\"type\":\"BlockStored\",\"block_hashes\":[");
        kvt_jbuf_u64(&j, i * UINT64_C(0x9e3779b97f4a7c15));
        kvt_jbuf_cstr(&j, "],\"parent_block_hash\":");
        kvt_jbuf_i64(&j, -(int64_t)i);
        kvt_jbuf_cstr(&j, ",\"token_ids\":[");
        for (size_t k = 0; k < bs; k++) {
            if (k > 0)
                kvt_jbuf_cstr(&j, ",");
            kvt_jbuf_u64(&j, (i * bs + k) % 151936);
        }
        kvt_jbuf_cstr(&j, "],\"block_size\":16,\"lora_id\":null,\"medium\":\"GPU\","
                          "\"lora_name\":null,\"extra_keys\":null}");
    }
    kvt_jbuf_cstr(&j, "]}");
    assert_false(j.oom);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    decode_ok_n(j.buf, j.len, BIG, &b);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("big batch: %zu events, %zu bytes, decoded in %.2f ms (%.0f MB/s)\n", nev, j.len,
           sec * 1e3, (double)j.len / sec / 1e6);

    assert_int_equal(b.nev, nev);
    assert_int_equal(b.unknown, 0);
    assert_int_equal(b.dp_rank, 1);
    for (size_t i = 0; i < nev; i++) {
        const kvt_event_t *e = &b.ev[i];
        assert_int_equal(e->nhashes, 1);
        assert_true(e->hashes[0] == i * UINT64_C(0x9e3779b97f4a7c15));
        if (i % 10 == 9) {
            assert_int_equal(e->type, KVT_EV_REMOVED);
            continue;
        }
        assert_int_equal(e->type, KVT_EV_STORED);
        assert_true(e->has_parent && e->parent == (uint64_t) - (int64_t)i);
        assert_int_equal(e->ntokens, bs);
        assert_int_equal(e->block_size, bs);
        for (size_t k = 0; k < bs; k++)
            assert_int_equal(e->tokens[k], (i * bs + k) % 151936);
    }
    kvt_evbatch_cleanup(&b);
    kvt_jbuf_cleanup(&j);
}

/* ---- random batches against what was written ------------------------------------------ */

static kvt_rng_t g_rng;

static uint64_t rnd(void)
{
    return kvt_rng_next(&g_rng);
}

static size_t rnd_below(size_t n)
{
    return (size_t)kvt_rng_below(&g_rng, n);
}

/* A reference event, as written. */
typedef struct ref_ev {
    int type; /* kvt_ev_type_t, or 0 for an unknown type */
    unsigned tier;
    uint32_t nhashes;
    uint64_t hashes[8];
    bool has_parent;
    uint64_t parent;
    uint32_t ntokens;
    uint32_t tokens[64];
    uint32_t block_size;
    bool bs_written;
    char lora[16];
    bool has_lora;
    size_t unknown; /* unknown fields written */
} ref_ev_t;

static void write_event(kvt_jbuf_t *j, ref_ev_t *r)
{
    /* Fields in random order: each is a small writer. */
    enum { F_TYPE, F_HASHES, F_PARENT, F_TOKENS, F_BS, F_MEDIUM, F_LORA, F_IGN, F_UNK, NF };
    int order[NF];
    for (int i = 0; i < NF; i++)
        order[i] = i;
    for (int i = NF - 1; i > 0; i--) {
        int k = (int)rnd_below((size_t)i + 1), t = order[i];
        order[i] = order[k];
        order[k] = t;
    }
    static const char *const medium_names[] = {"GPU", "cpu", "Disk", "NVME"};
    static const unsigned medium_tiers[] = {KVT_TIER_GPU, KVT_TIER_CPU, KVT_TIER_DISK,
                                            KVT_TIER_DISK};
    bool first = true;
    kvt_jbuf_cstr(j, "{");
    for (int i = 0; i < NF; i++) {
        size_t mark = j->len;
        if (!first)
            kvt_jbuf_cstr(j, ",");
        bool wrote = true;
        switch (order[i]) {
        case F_TYPE:
            kvt_jbuf_cstr(j, "\"type\":");
            kvt_jbuf_cstr(j, r->type == KVT_EV_STORED    ? "\"BlockStored\""
                             : r->type == KVT_EV_REMOVED ? "\"BlockRemoved\""
                             : r->type == KVT_EV_CLEARED ? "\"AllBlocksCleared\""
                                                         : "\"SomethingNew\"");
            break;
        case F_HASHES:
            if (r->type == KVT_EV_CLEARED || (r->type == 0 && rnd_below(2))) {
                wrote = false;
                break;
            }
            kvt_jbuf_cstr(j, "\"block_hashes\":[");
            for (uint32_t k = 0; k < r->nhashes; k++) {
                if (k > 0)
                    kvt_jbuf_cstr(j, ", ");
                if ((int64_t)r->hashes[k] < 0 && rnd_below(2))
                    kvt_jbuf_i64(j, (int64_t)r->hashes[k]);
                else
                    kvt_jbuf_u64(j, r->hashes[k]);
            }
            kvt_jbuf_cstr(j, "]");
            break;
        case F_PARENT:
            if (r->type != KVT_EV_STORED) {
                wrote = false;
            } else if (r->has_parent) {
                kvt_jbuf_cstr(j, "\"parent_block_hash\":");
                kvt_jbuf_u64(j, r->parent);
            } else if (rnd_below(2)) {
                kvt_jbuf_cstr(j, "\"parent_block_hash\":null");
            } else {
                wrote = false;
            }
            break;
        case F_TOKENS:
            if (r->type != KVT_EV_STORED || (r->ntokens == 0 && rnd_below(2))) {
                wrote = false;
                break;
            }
            kvt_jbuf_cstr(j, "\"token_ids\":[");
            for (uint32_t k = 0; k < r->ntokens; k++) {
                if (k > 0)
                    kvt_jbuf_cstr(j, ",");
                kvt_jbuf_u64(j, r->tokens[k]);
            }
            kvt_jbuf_cstr(j, "]");
            break;
        case F_BS:
            if (r->type != KVT_EV_STORED || !r->bs_written) {
                wrote = false;
                break;
            }
            kvt_jbuf_printf(j, "\"block_size\":%u", r->block_size);
            break;
        case F_MEDIUM:
            if (r->type != KVT_EV_STORED && r->type != KVT_EV_REMOVED) {
                wrote = false;
            } else if (r->tier == KVT_TIER_GPU && rnd_below(2)) {
                kvt_jbuf_cstr(j, rnd_below(2) ? "\"medium\":null" : "\"medium\":\"GPU\"");
            } else if (r->tier == KVT_TIER_GPU) {
                wrote = false;
            } else {
                size_t m = r->tier == KVT_TIER_CPU ? 1 : 2 + rnd_below(2);
                kvt_jbuf_printf(j, "\"medium\":\"%s\"", medium_names[m]);
                assert_int_equal(medium_tiers[m], r->tier);
            }
            break;
        case F_LORA:
            if (r->type != KVT_EV_STORED) {
                wrote = false;
            } else if (r->has_lora) {
                kvt_jbuf_cstr(j, "\"lora_name\":");
                kvt_jbuf_str(j, r->lora, strlen(r->lora));
            } else if (rnd_below(2)) {
                kvt_jbuf_cstr(j, "\"lora_name\":null");
            } else {
                wrote = false;
            }
            break;
        case F_IGN:
            if (rnd_below(2)) {
                wrote = false;
                break;
            }
            /* fields of vLLM's that kvtier reads nowhere, in any event type */
            kvt_jbuf_cstr(j, rnd_below(2) ? "\"kv_cache_spec_sliding_window\":4096"
                                          : "\"ownership\":\"x\",\"lora_id\":null");
            break;
        default:
            if (r->type == 0 || rnd_below(2)) {
                wrote = false;
                break;
            }
            kvt_jbuf_cstr(j, "\"x_new_field\":{\"nested\":[1,2,{\"token_ids\":\"no\"}]}");
            r->unknown++;
            break;
        }
        if (wrote)
            first = false;
        else
            j->len = mark; /* take back the comma */
    }
    kvt_jbuf_cstr(j, "}");
}

static void test_random_batches(void **state)
{
    (void)state;
    const uint64_t seed = kvt_test_seed(); /* named in a failure's message */
    kvt_rng_init(&g_rng, 0);
    kvt_jbuf_t j;
    kvt_jbuf_init(&j);
    ref_ev_t *refs = calloc(64, sizeof(ref_ev_t));
    assert_non_null(refs);
    size_t total_events = 0;

    for (int round = 0; round < 2000; round++) {
        size_t n = rnd_below(64);
        size_t want_unknown = 0, want_nev = 0;
        bool any_stored = false;
        memset(refs, 0, 64 * sizeof(ref_ev_t));
        for (size_t i = 0; i < n; i++) {
            ref_ev_t *r = &refs[i];
            size_t t = rnd_below(8);
            r->type = t < 4 ? KVT_EV_STORED : t < 6 ? KVT_EV_REMOVED : t < 7 ? KVT_EV_CLEARED : 0;
            r->tier = r->type == KVT_EV_CLEARED || r->type == 0
                          ? KVT_TIER_GPU
                          : (unsigned[]){KVT_TIER_GPU, KVT_TIER_CPU, KVT_TIER_DISK}[rnd_below(3)];
            if (r->type == KVT_EV_STORED || r->type == KVT_EV_REMOVED || r->type == 0) {
                r->nhashes = (uint32_t)(r->type == KVT_EV_STORED ? 1 : 0) + (uint32_t)rnd_below(8);
                for (uint32_t k = 0; k < r->nhashes; k++)
                    r->hashes[k] = rnd() >> rnd_below(64);
            }
            if (r->type == KVT_EV_STORED) {
                any_stored = true;
                r->has_parent = rnd_below(2);
                r->parent = r->has_parent ? rnd() : 0;
                uint32_t bs = (uint32_t)rnd_below(8);
                r->bs_written = rnd_below(3) != 0 || bs == 0;
                if (bs > 0 && bs * r->nhashes <= 64 && rnd_below(3) != 0) {
                    r->ntokens = bs * r->nhashes;
                    for (uint32_t k = 0; k < r->ntokens; k++)
                        r->tokens[k] = (uint32_t)rnd();
                    r->block_size = bs;
                } else {
                    r->block_size = r->bs_written ? bs : 0;
                }
                if (r->ntokens == 0 && !r->bs_written)
                    r->block_size = 0;
                if (r->ntokens > 0 && !r->bs_written)
                    r->block_size = r->ntokens / r->nhashes;
                r->has_lora = rnd_below(3) == 0;
                snprintf(r->lora, sizeof(r->lora), "lora-%u", (unsigned)rnd_below(100));
            }
        }
        kvt_jbuf_reset(&j);
        kvt_jbuf_cstr(&j, "{\"pod\":\"pod-x\"");
        kvt_jbuf_cstr(&j, ",\"events\":[");
        for (size_t i = 0; i < n; i++) {
            if (i > 0)
                kvt_jbuf_cstr(&j, ",");
            write_event(&j, &refs[i]);
            if (refs[i].type == 0) {
                want_unknown++;
            } else {
                want_nev++;
                want_unknown += refs[i].unknown;
            }
        }
        kvt_jbuf_cstr(&j, "]");
        if (any_stored || rnd_below(2))
            kvt_jbuf_cstr(&j, ",\"model\":\"m\"");
        kvt_jbuf_cstr(&j, "}");
        assert_false(j.oom);

        kvt_evbatch_t b;
        decode_ok_n(j.buf, j.len, BIG, &b);
        assert_int_equal(b.nev, want_nev);
        assert_int_equal(b.unknown, want_unknown);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            const ref_ev_t *r = &refs[i];
            if (r->type == 0)
                continue;
            const kvt_event_t *e = &b.ev[k++];
            if ((int)e->type != r->type || e->tier != r->tier || e->nhashes != r->nhashes ||
                e->ntokens != r->ntokens || e->block_size != r->block_size ||
                e->has_parent != r->has_parent || (r->has_parent && e->parent != r->parent))
                fail_msg("round %d event %zu differs (seed %" PRIu64 "): %s", round, i, seed,
                         j.buf);
            if (r->nhashes > 0)
                assert_memory_equal(e->hashes, r->hashes, r->nhashes * sizeof(uint64_t));
            if (r->ntokens > 0)
                assert_memory_equal(e->tokens, r->tokens, r->ntokens * sizeof(uint32_t));
            if (r->has_lora)
                assert_string_equal(e->lora_name, r->lora);
            else
                assert_null(e->lora_name);
        }
        total_events += n;
        kvt_evbatch_cleanup(&b);
    }
    printf("random batches: 2000 bodies, %zu events, seed %" PRIu64 "\n", total_events, seed);
    free(refs);
    kvt_jbuf_cleanup(&j);
}

/* null for token_ids, block_size, parent_block_hash, lora_name, medium reads as absent */
static void test_nulls_read_as_absent(void **state)
{
    (void)state;
    kvt_evbatch_t b;
    decode_ok("{\"pod\":\"p\",\"model\":\"m\",\"events\":[{\"type\":\"BlockStored\","
              "\"block_hashes\":[1,2],\"token_ids\":null,\"block_size\":null,"
              "\"parent_block_hash\":null,\"lora_name\":null,\"medium\":null}]}",
              &b);
    assert_int_equal(b.nev, 1);
    assert_int_equal(b.ev[0].nhashes, 2);
    assert_int_equal(b.ev[0].ntokens, 0);
    assert_null(b.ev[0].tokens);
    assert_int_equal(b.ev[0].block_size, 0);
    assert_false(b.ev[0].has_parent);
    assert_null(b.ev[0].lora_name);
    assert_int_equal(b.ev[0].tier, KVT_TIER_GPU);
    kvt_evbatch_cleanup(&b);
    /* a broken null is still an error */
    decode_err(HDR "{\"type\":\"BlockStored\",\"block_hashes\":[1],\"token_ids\":nul}" FTR,
               KVT_ERR_PARSE, "events[0].token_ids:");
}

/* vLLM's fields past lora_name: extra_keys, group_idx, kv_cache_spec_kind, locality. */
static void test_salt_groups_locality(void **state)
{
    (void)state;
    kvt_evbatch_t b;
#define ST                                                                                         \
    "{\"type\":\"BlockStored\",\"block_hashes\":[1,2],\"token_ids\":[1,2,3,4],\"block_size\":2"
    /* "cache_salt" given directly; "" and null are no salt */
    decode_ok(HDR ST ",\"cache_salt\":\"tenant-a\"}" FTR, &b);
    assert_true(b.ev[0].cache_salt_len == 8 && strcmp(b.ev[0].cache_salt, "tenant-a") == 0);
    kvt_evbatch_cleanup(&b);
    decode_ok(HDR ST ",\"cache_salt\":\"\"}," ST ",\"cache_salt\":null}" FTR, &b);
    assert_true(b.ev[0].cache_salt == NULL && b.ev[1].cache_salt == NULL);
    kvt_evbatch_cleanup(&b);
    /* vLLM's extra_keys: the first block's lone string, after the LoRA name, is the salt */
    decode_ok(HDR ST ",\"extra_keys\":[[\"s1\"],null]}," ST
                     ",\"extra_keys\":[[\"ad\",\"s2\"],null],\"lora_name\":\"ad\"}," ST
                     ",\"lora_name\":\"ad\",\"extra_keys\":[[\"ad\"],null]}" FTR,
              &b);
    assert_string_equal(b.ev[0].cache_salt, "s1");
    assert_string_equal(b.ev[1].cache_salt, "s2");
    assert_null(b.ev[2].cache_salt);
    for (int i = 0; i < 3; i++)
        assert_null(b.ev[i].extra_seeds);
    kvt_evbatch_cleanup(&b);
    /* "cache_salt" wins; after a parent a lone string is another key; others seed blocks */
    decode_ok(HDR ST ",\"cache_salt\":\"x\",\"extra_keys\":[[\"y\"],null]}," ST
                     ",\"parent_block_hash\":7,\"extra_keys\":[[\"mm\"],null]}," ST
                     ",\"extra_keys\":[null,[[\"img\",0],\"s\"]]}," ST
                     ",\"extra_keys\":[null, [ [ \"img\" , 0 ] , \"s\" ] ]}" FTR,
              &b);
    assert_string_equal(b.ev[0].cache_salt, "x");
    assert_null(b.ev[0].extra_seeds);
    assert_null(b.ev[1].cache_salt);
    assert_true(b.ev[1].extra_seeds != NULL && b.ev[1].extra_seeds[0] != 0 &&
                b.ev[1].extra_seeds[1] == 0);
    assert_true(b.ev[2].extra_seeds != NULL && b.ev[2].extra_seeds[0] == 0 &&
                b.ev[2].extra_seeds[1] != 0);
    assert_true(b.ev[3].extra_seeds != NULL && b.ev[3].extra_seeds[0] == 0 &&
                b.ev[3].extra_seeds[1] == b.ev[2].extra_seeds[1]); /* whitespace is no key */
    kvt_evbatch_cleanup(&b);
    /* a LoRA named only by the batch leads the entries too, before or after "events"; an
     * event's own lora_name replaces the batch's */
    static const char *const lora_bodies[] = {
        "{\"pod\":\"p\",\"model\":\"m\",\"events\":[" ST
        ",\"extra_keys\":[[\"ad\",\"s1\"],null]}," ST
        ",\"lora_name\":\"x\",\"extra_keys\":[[\"ad\",\"s1\"],null]}],\"lora_name\":\"ad\"}",
        "{\"pod\":\"p\",\"lora_name\":\"ad\",\"model\":\"m\",\"events\":[" ST
        ",\"extra_keys\":[[\"ad\",\"s1\"],null]}," ST
        ",\"lora_name\":\"x\",\"extra_keys\":[[\"ad\",\"s1\"],null]}]}",
    };
    for (int i = 0; i < 2; i++) {
        decode_ok(lora_bodies[i], &b);
        assert_string_equal(b.lora, "ad");
        assert_string_equal(b.ev[0].cache_salt, "s1");
        assert_null(b.ev[0].extra_seeds);
        assert_null(b.ev[1].cache_salt);
        assert_true(b.ev[1].extra_seeds != NULL && b.ev[1].extra_seeds[0] != 0);
        kvt_evbatch_cleanup(&b);
    }
    /* an extra_keys error names its event, after an unknown one */
    decode_err(HDR "{\"type\":\"Other\"}," ST ",\"extra_keys\":[null]}" FTR, KVT_ERR_INVAL,
               "events[1]: extra_keys has 1 entries for 2 block_hashes");
    /* groups, kinds, locality; a removal's too */
    decode_ok(HDR ST ",\"group_idx\":2,\"kv_cache_spec_kind\":\"sliding_window\"},"
                     "{\"type\":\"BlockRemoved\",\"block_hashes\":[1],\"group_idx\":1,"
                     "\"locality\":\"REMOTE\"}," ST ",\"locality\":\"LOCAL\",\"group_idx\":null,"
                     "\"kv_cache_spec_kind\":\"a_kind_name_longer_than_forty_bytes_is_any\"}"
                     ",{\"type\":\"AllBlocksCleared\",\"group_idx\":0}" FTR,
              &b);
    assert_true(b.ev[0].group == 2 && b.ev[0].group_kind == KVT_EV_GROUP_OTHER);
    assert_true(b.ev[1].group == 1 && b.ev[1].skip == KVT_EV_SKIP_REMOTE);
    assert_true(b.ev[2].group == -1 && b.ev[2].skip == KVT_EV_SKIP_NONE &&
                b.ev[2].group_kind == KVT_EV_GROUP_ANY);
    assert_int_equal(b.unknown, 1); /* group_idx means nothing to a clear */
    kvt_evbatch_cleanup(&b);
    /* wrong shapes are errors (the HTTP API refuses the request) */
    decode_err(HDR ST ",\"extra_keys\":[null]}" FTR, KVT_ERR_INVAL,
               "extra_keys has 1 entries for 2 block_hashes");
    decode_err(HDR ST ",\"extra_keys\":[null,null,null]}" FTR, KVT_ERR_INVAL,
               "extra_keys has more entries than blocks");
    decode_err(HDR ST ",\"extra_keys\":[1,null]}" FTR, KVT_ERR_INVAL,
               "extra_keys[0] must be an array or null");
    decode_err(HDR ST ",\"extra_keys\":{}}" FTR, KVT_ERR_INVAL, "must be an array or null");
    decode_err(HDR ST ",\"group_idx\":-1}" FTR, KVT_ERR_INVAL, "group_idx");
    decode_err(HDR ST ",\"locality\":1}" FTR, KVT_ERR_INVAL, "'locality' must be a string");
    decode_err(HDR ST ",\"kv_cache_spec_kind\":[]}" FTR, KVT_ERR_INVAL,
               "'kv_cache_spec_kind' must be a string");
    decode_err(HDR ST ",\"cache_salt\":5}" FTR, KVT_ERR_INVAL, "'cache_salt' must be a string");
    decode_err("{\"pod\":\"p\",\"model\":\"m\",\"dp_rank\":256,\"events\":[]}", KVT_ERR_INVAL,
               "field 'dp_rank': want 0..255");
    decode_ok("{\"pod\":\"p\",\"model\":\"m\",\"dp_rank\":255,\"events\":[]}", &b);
    assert_int_equal(b.dp_rank, 255);
    kvt_evbatch_cleanup(&b);
#undef ST
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_stored_full),
        cmocka_unit_test(test_block_stored_minimal),
        cmocka_unit_test(test_mediums),
        cmocka_unit_test(test_salt_groups_locality),
        cmocka_unit_test(test_removed_and_cleared),
        cmocka_unit_test(test_unknown_counting),
        cmocka_unit_test(test_event_errors),
        cmocka_unit_test(test_nulls_read_as_absent),
        cmocka_unit_test(test_top_level_errors),
        cmocka_unit_test(test_max_items),
        cmocka_unit_test(test_args_and_cleanup),
        cmocka_unit_test(test_arena_worst_cases),
        cmocka_unit_test(test_big_batch),
        cmocka_unit_test(test_random_batches),
    };
    return cmocka_run_group_tests_name("event_json", tests, NULL, NULL);
}
