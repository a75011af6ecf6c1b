/*
 * libFuzzer target for kvt_ev_json_decode() (kvindex/event_json.c).
 *
 * Invariants checked on every input:
 *  - the input is copied to an exactly-sized heap buffer, so ASan reports any
 *    read past len;
 *  - success: the batch is well formed: names are 1..255 (pod) or 0..255
 *    bytes, NUL-terminated, inside the arena; every pointer and array lies
 *    inside the arena and is aligned; hashes/tokens are NULL exactly when
 *    their count is 0; ntokens is block_size * nhashes or 0; BlockStored has
 *    hashes, other types carry only what they may; tiers are single known
 *    bits; a batch with BlockStored has a model; counts respect max_items;
 *  - failure: a documented status (never KVT_ERR_INTERNAL, which would mean
 *    the arena bound is wrong), a non-empty one-line message, and the batch
 *    untouched;
 *  - the verdict does not depend on the error buffer;
 *  - max_items equal to the batch's item count decodes the same batch, one
 *    less is KVT_ERR_TOO_BIG;
 *  - the batch written back as JSON decodes to the same batch.
 */
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "kvindex/event.h"

#include "tests/fuzz/fuzz_event_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define UNLIMITED ((size_t)1 << 40)

static bool inside(const kvt_evbatch_t *b, const void *p, size_t n)
{
    return fuzz_inside(b->arena, p, n);
}

static void check_name(const kvt_evbatch_t *b, const char *s, size_t min)
{
    CHECK(s != NULL);
    size_t n = strnlen(s, KVT_IDX_MAX_NAME + 1);
    CHECK(n >= min && n <= KVT_IDX_MAX_NAME);
    CHECK(inside(b, s, n + 1));
}

static bool one_tier(unsigned t)
{
    return t == KVT_TIER_GPU || t == KVT_TIER_CPU || t == KVT_TIER_DISK;
}

/* Checks the batch's invariants; returns its hash and token count. */
static size_t check_batch(const kvt_evbatch_t *b, size_t len)
{
    size_t items = 0;
    bool stored = false;

    CHECK(b->arena != NULL);
    check_name(b, b->pod, 1);
    check_name(b, b->model, 0);
    if (b->lora != NULL)
        check_name(b, b->lora, 0);
    CHECK((b->ev == NULL) == (b->nev == 0));
    CHECK(b->nev <= len / 27 + 1);
    if (b->nev > 0)
        CHECK(inside(b, b->ev, b->nev * sizeof(kvt_event_t)));
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        CHECK(one_tier(e->tier) || (e->tier == 0 && e->skip == KVT_EV_SKIP_MEDIUM));
        fuzz_check_event_arena(b->arena, e);
        CHECK((e->hashes == NULL) == (e->nhashes == 0));
        CHECK((e->tokens == NULL) == (e->ntokens == 0));
        if (e->nhashes > 0)
            CHECK(inside(b, e->hashes, e->nhashes * sizeof(uint64_t)) &&
                  (uintptr_t)e->hashes % 8 == 0);
        if (e->ntokens > 0)
            CHECK(inside(b, e->tokens, e->ntokens * sizeof(uint32_t)) &&
                  (uintptr_t)e->tokens % 4 == 0);
        CHECK(e->ntokens == 0 || (uint64_t)e->ntokens == (uint64_t)e->block_size * e->nhashes);
        if (e->lora_name != NULL)
            check_name(b, e->lora_name, 0);
        stored |= e->type == KVT_EV_STORED;
        fuzz_check_event_type(e);
        items += e->nhashes + e->ntokens;
    }
    if (stored)
        CHECK(b->model[0] != '\0');
    return items;
}

static bool same_name(const char *a, const char *b)
{
    return (a == NULL) == (b == NULL) && (a == NULL || strcmp(a, b) == 0);
}

static void check_same(const kvt_evbatch_t *a, const kvt_evbatch_t *b)
{
    CHECK(strcmp(a->pod, b->pod) == 0 && strcmp(a->model, b->model) == 0);
    CHECK(same_name(a->lora, b->lora) && a->dp_rank == b->dp_rank && a->nev == b->nev);
    for (size_t i = 0; i < a->nev; i++) {
        const kvt_event_t *x = &a->ev[i], *y = &b->ev[i];
        CHECK(x->type == y->type && x->tier == y->tier && x->nhashes == y->nhashes);
        CHECK(x->skip == y->skip && x->group == y->group && x->group_kind == y->group_kind);
        CHECK(x->medium_len == y->medium_len &&
              (x->medium == NULL || memcmp(x->medium, y->medium, x->medium_len) == 0));
        CHECK(x->cache_salt_len == y->cache_salt_len &&
              (x->cache_salt == NULL || strcmp(x->cache_salt, y->cache_salt) == 0));
        CHECK((x->extra_seeds == NULL) == (y->extra_seeds == NULL));
        for (uint32_t k = 0; x->extra_seeds != NULL && k < x->nhashes; k++)
            CHECK((x->extra_seeds[k] == 0) == (y->extra_seeds[k] == 0));
        CHECK(x->ntokens == y->ntokens && x->block_size == y->block_size);
        CHECK(x->has_parent == y->has_parent && x->parent == y->parent);
        CHECK(same_name(x->lora_name, y->lora_name));
        CHECK(x->nhashes == 0 || memcmp(x->hashes, y->hashes, x->nhashes * 8) == 0);
        CHECK(x->ntokens == 0 || memcmp(x->tokens, y->tokens, x->ntokens * 4) == 0);
    }
}

/* Writes @b as a POST /v1/events body. */
static void write_batch(const kvt_evbatch_t *b, kvt_jbuf_t *j)
{
    static const char *const types[] = {"", "BlockStored", "BlockRemoved", "AllBlocksCleared"};
    kvt_jbuf_cstr(j, "{\"pod\":");
    kvt_jbuf_str(j, b->pod, strlen(b->pod));
    kvt_jbuf_cstr(j, ",\"model\":");
    kvt_jbuf_str(j, b->model, strlen(b->model));
    if (b->lora != NULL) {
        kvt_jbuf_cstr(j, ",\"lora_name\":");
        kvt_jbuf_str(j, b->lora, strlen(b->lora));
    }
    kvt_jbuf_printf(j, ",\"dp_rank\":%u,\"events\":[", b->dp_rank);
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        kvt_jbuf_printf(j, "%s{\"type\":\"%s\"", i > 0 ? "," : "", types[e->type]);
        if (e->type != KVT_EV_CLEARED) {
            kvt_jbuf_cstr(j, ",\"block_hashes\":[");
            for (uint32_t k = 0; k < e->nhashes; k++) {
                if (k > 0)
                    kvt_jbuf_cstr(j, ",");
                kvt_jbuf_u64(j, e->hashes[k]);
            }
            kvt_jbuf_cstr(j, "],\"medium\":");
            if (e->skip == KVT_EV_SKIP_MEDIUM)
                kvt_jbuf_str(j, e->medium, e->medium_len);
            else
                kvt_jbuf_cstr(j, e->tier == KVT_TIER_CPU    ? "\"CPU\""
                                 : e->tier == KVT_TIER_DISK ? "\"DISK\""
                                                            : "\"GPU\"");
            if (e->skip == KVT_EV_SKIP_REMOTE)
                kvt_jbuf_cstr(j, ",\"locality\":\"REMOTE\"");
            if (e->group >= 0)
                kvt_jbuf_printf(j, ",\"group_idx\":%lld", (long long)e->group);
        }
        if (e->type == KVT_EV_STORED && e->group_kind != KVT_EV_GROUP_ANY)
            kvt_jbuf_cstr(j, e->group_kind == KVT_EV_GROUP_FULL
                                 ? ",\"kv_cache_spec_kind\":\"full_attention\""
                                 : ",\"kv_cache_spec_kind\":\"mamba\"");
        if (e->type == KVT_EV_STORED) {
            if (e->has_parent) {
                kvt_jbuf_cstr(j, ",\"parent_block_hash\":");
                kvt_jbuf_i64(j, (int64_t)e->parent);
            }
            kvt_jbuf_printf(j, ",\"block_size\":%u,\"token_ids\":[", e->block_size);
            for (uint32_t k = 0; k < e->ntokens; k++) {
                if (k > 0)
                    kvt_jbuf_cstr(j, ",");
                kvt_jbuf_u64(j, e->tokens[k]);
            }
            kvt_jbuf_cstr(j, "]");
            if (e->lora_name != NULL) {
                kvt_jbuf_cstr(j, ",\"lora_name\":");
                kvt_jbuf_str(j, e->lora_name, strlen(e->lora_name));
            }
            if (e->cache_salt != NULL) {
                kvt_jbuf_cstr(j, ",\"cache_salt\":");
                kvt_jbuf_str(j, e->cache_salt, e->cache_salt_len);
            }
            if (e->extra_seeds != NULL) {
                kvt_jbuf_cstr(j, ",\"extra_keys\":[");
                for (uint32_t k = 0; k < e->nhashes; k++) {
                    if (k > 0)
                        kvt_jbuf_cstr(j, ",");
                    if (e->extra_seeds[k] == 0) {
                        kvt_jbuf_cstr(j, "null");
                    } else { /* an opaque number key: never taken for a salt */
                        kvt_jbuf_cstr(j, "[");
                        kvt_jbuf_u64(j, e->extra_seeds[k]);
                        kvt_jbuf_cstr(j, "]");
                    }
                }
                kvt_jbuf_cstr(j, "]");
            }
        }
        kvt_jbuf_cstr(j, "}");
    }
    kvt_jbuf_cstr(j, "]}");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size > 0 ? size : 1);
    if (s == NULL)
        return 0;
    if (size > 0)
        memcpy(s, data, size);

    kvt_evbatch_t b, pattern;
    memset(&b, 0x5a, sizeof(b));
    memset(&pattern, 0x5a, sizeof(pattern));
    char err[200];
    memset(err, 'x', sizeof(err));
    kvt_status_t st = kvt_ev_json_decode(s, size, UNLIMITED, &b, err, sizeof(err));
    CHECK(memchr(err, '\0', sizeof(err)) != NULL);

    /* The verdict does not depend on the error buffer. */
    kvt_evbatch_t b2;
    kvt_status_t st2 = kvt_ev_json_decode(s, size, UNLIMITED, &b2, NULL, 0);
    CHECK(st2 == st);
    if (st2 == KVT_OK)
        kvt_evbatch_cleanup(&b2);

    if (st != KVT_OK) {
        CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_INVAL || st == KVT_ERR_TOO_BIG ||
              st == KVT_ERR_NO_MEM);
        CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
        CHECK(memcmp(&b, &pattern, sizeof(b)) == 0);
        free(s);
        return 0;
    }
    size_t items = check_batch(&b, size);

    /* max_items at the batch's count: the same batch; one less: TOO_BIG. */
    st2 = kvt_ev_json_decode(s, size, items, &b2, err, sizeof(err));
    CHECK(st2 == KVT_OK);
    check_same(&b, &b2);
    kvt_evbatch_cleanup(&b2);
    if (items > 0) {
        memset(&b2, 0x5a, sizeof(b2));
        st2 = kvt_ev_json_decode(s, size, items - 1, &b2, err, sizeof(err));
        CHECK(st2 == KVT_ERR_TOO_BIG);
        CHECK(memcmp(&b2, &pattern, sizeof(b2)) == 0);
    }

    /* Written back as JSON, the batch decodes the same. */
    kvt_jbuf_t j;
    kvt_jbuf_init(&j);
    write_batch(&b, &j);
    CHECK(!j.oom);
    st2 = kvt_ev_json_decode(j.buf, j.len, items, &b2, err, sizeof(err));
    if (st2 != KVT_OK) {
        fprintf(stderr, "rewritten batch rejected: %s\n%s\n", err, j.buf);
        CHECK(st2 == KVT_OK);
    }
    check_same(&b, &b2);
    CHECK(b2.unknown == 0);
    kvt_evbatch_cleanup(&b2);
    kvt_jbuf_cleanup(&j);

    kvt_evbatch_cleanup(&b);
    CHECK(b.arena == NULL && b.nev == 0);
    free(s);
    return 0;
}
