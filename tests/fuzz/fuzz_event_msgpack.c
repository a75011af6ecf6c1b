/*
 * libFuzzer target for kvt_ev_msgpack_decode() (kvindex/event_msgpack.c).
 *
 * Invariants checked on every input, under both formats:
 *  - the input is copied to an exactly-sized heap buffer, so ASan reports any
 *    read past len;
 *  - success: every array and name lies inside the arena, aligned; hashes
 *    and tokens are NULL exactly when their count is 0; ntokens is
 *    block_size * nhashes or 0; BlockStored has hashes, other types carry
 *    only what they may; a bad event carries nothing; tiers are single known
 *    bits, 0 only for an event skipped for its medium; pod and model are the
 *    caller's; the item count respects max_items;
 *  - failure: a documented status (never KVT_ERR_INTERNAL: the raw check
 *    and msgpack-c disagreed), a non-empty message, the batch untouched;
 *  - the verdict does not depend on the error buffer, and the two formats
 *    give the same verdict and the same number of events (they differ in
 *    bytes hashes and in what a map in slot 7 means);
 *  - without bad events, max_items equal to the batch's item count decodes,
 *    one less is KVT_ERR_TOO_BIG;
 *  - the batch packed again as maps decodes to the same batch.
 */
#include <malloc.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvindex/event.h"

#include "tests/fuzz/fuzz_event_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define UNLIMITED ((size_t)1 << 40)

static const char POD[] = "pod-f", MODEL[] = "model-f";

static bool inside(const kvt_evbatch_t *b, const void *p, size_t n)
{
    return fuzz_inside(b->arena, p, n);
}

static size_t check_batch(const kvt_evbatch_t *b)
{
    size_t items = 0;
    CHECK(b->arena != NULL && b->pod == POD && b->model == MODEL && b->lora == NULL);
    CHECK((b->ev == NULL) == (b->nev == 0));
    if (b->nev > 0)
        CHECK(inside(b, b->ev, b->nev * sizeof(kvt_event_t)));
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        CHECK(e->tier == KVT_TIER_GPU || e->tier == KVT_TIER_CPU || e->tier == KVT_TIER_DISK ||
              e->tier == 0);
        fuzz_check_event_arena(b->arena, e);
        CHECK((e->hashes == NULL) == (e->nhashes == 0));
        CHECK((e->tokens == NULL) == (e->ntokens == 0));
        if (e->nhashes > 0)
            CHECK(inside(b, e->hashes, e->nhashes * 8u) && (uintptr_t)e->hashes % 8 == 0);
        if (e->ntokens > 0)
            CHECK(inside(b, e->tokens, e->ntokens * 4u) && (uintptr_t)e->tokens % 4 == 0);
        CHECK(e->ntokens == 0 || (uint64_t)e->ntokens == (uint64_t)e->block_size * e->nhashes);
        if (e->lora_name != NULL) {
            size_t n = strnlen(e->lora_name, KVT_IDX_MAX_NAME + 1);
            CHECK(n <= KVT_IDX_MAX_NAME && inside(b, e->lora_name, n + 1));
        }
        fuzz_check_event_type(e);
        items += e->nhashes + e->ntokens;
    }
    return items;
}

/* Whether @b has a bad event. */
static bool has_bad(const kvt_evbatch_t *b)
{
    for (size_t i = 0; i < b->nev; i++)
        if (b->ev[i].type == KVT_EV_BAD)
            return true;
    return false;
}

/*
 * Same batch; hashes compared only when @hashes (bytes read differently by
 * format), and events whose types differ only when @types (the formats read
 * a map in slot 7 differently: SGLang's metadata, vLLM's bad lora_name).
 */
static void check_same(const kvt_evbatch_t *a, const kvt_evbatch_t *b, bool hashes, bool types)
{
    CHECK(a->dp_rank == b->dp_rank && a->nev == b->nev);
    CHECK(!types || a->unknown == b->unknown);
    for (size_t i = 0; i < a->nev; i++) {
        const kvt_event_t *x = &a->ev[i], *y = &b->ev[i];
        if (!types && x->type != y->type)
            continue;
        CHECK(x->type == y->type && x->tier == y->tier && x->nhashes == y->nhashes);
        CHECK(x->skip == y->skip && x->may_remove == y->may_remove && x->group == y->group &&
              x->group_kind == y->group_kind);
        CHECK(x->medium_len == y->medium_len &&
              (x->medium == NULL || memcmp(x->medium, y->medium, x->medium_len) == 0));
        CHECK((x->extra_seeds == NULL) == (y->extra_seeds == NULL));
        for (uint32_t k = 0; x->extra_seeds != NULL && k < x->nhashes; k++)
            CHECK((x->extra_seeds[k] == 0) == (y->extra_seeds[k] == 0));
        if (types)
            CHECK(x->cache_salt_len == y->cache_salt_len &&
                  (x->cache_salt == NULL || strcmp(x->cache_salt, y->cache_salt) == 0));
        CHECK(x->ntokens == y->ntokens && x->block_size == y->block_size);
        CHECK(x->has_parent == y->has_parent);
        CHECK((x->lora_name == NULL) == (y->lora_name == NULL));
        CHECK(x->lora_name == NULL || strcmp(x->lora_name, y->lora_name) == 0);
        CHECK(x->ntokens == 0 || memcmp(x->tokens, y->tokens, x->ntokens * 4u) == 0);
        if (hashes) {
            CHECK(x->parent == y->parent);
            CHECK(x->nhashes == 0 || memcmp(x->hashes, y->hashes, x->nhashes * 8u) == 0);
        }
    }
}

static void pack_str(msgpack_packer *p, const char *s)
{
    msgpack_pack_str(p, strlen(s));
    msgpack_pack_str_body(p, s, strlen(s));
}

/*
 * Packs @b as a v0.26 batch (maps, uint64 hashes) with all it carries: mediums
 * (a skipped one by its name), groups, locality, the salt as SGLang's metadata,
 * an extra key for each seeded block; a bad event as one that is bad the same
 * way. Unknowns are not carried over.
 */
static void pack_batch(const kvt_evbatch_t *b, msgpack_sbuffer *sb)
{
    static const char *const types[] = {"", "BlockStored", "BlockRemoved", "AllBlocksCleared"};
    static const char *const kinds[] = {NULL, "full_attention", "sliding_window"};
    msgpack_packer p;
    msgpack_packer_init(&p, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.0);
    msgpack_pack_array(&p, (uint32_t)b->nev);
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        if (e->type == KVT_EV_BAD) {
            if (e->may_remove) {
                msgpack_pack_nil(&p);
            } else { /* a store without hashes */
                msgpack_pack_map(&p, 1);
                pack_str(&p, "type");
                pack_str(&p, "BlockStored");
            }
            continue;
        }
        bool st = e->type == KVT_EV_STORED && e->skip == KVT_EV_SKIP_NONE;
        bool group = e->group >= 0, kind = e->group_kind != KVT_EV_GROUP_ANY;
        bool remote = e->skip == KVT_EV_SKIP_REMOTE;
        uint32_t n = 1 + (e->type != KVT_EV_CLEARED) * (2 + group + remote) +
                     (e->type == KVT_EV_STORED) * kind +
                     st * (3 + (e->lora_name != NULL) + (e->cache_salt != NULL) +
                           (e->extra_seeds != NULL));
        msgpack_pack_map(&p, n);
        pack_str(&p, "type");
        pack_str(&p, types[e->type]);
        if (e->type != KVT_EV_CLEARED) {
            pack_str(&p, "block_hashes");
            msgpack_pack_array(&p, e->nhashes);
            for (uint32_t k = 0; k < e->nhashes; k++)
                msgpack_pack_uint64(&p, e->hashes[k]);
            pack_str(&p, "medium");
            if (e->skip == KVT_EV_SKIP_MEDIUM)
                msgpack_pack_str_with_body(&p, e->medium, e->medium_len);
            else
                pack_str(&p, e->tier == KVT_TIER_CPU    ? "CPU"
                             : e->tier == KVT_TIER_DISK ? "DISK"
                                                        : "GPU");
            if (group) {
                pack_str(&p, "group_idx");
                msgpack_pack_uint64(&p, (uint64_t)e->group);
            }
            if (remote) {
                pack_str(&p, "locality");
                pack_str(&p, "REMOTE");
            }
        }
        if (e->type == KVT_EV_STORED && kind) {
            pack_str(&p, "kv_cache_spec_kind");
            pack_str(&p, kinds[e->group_kind]);
        }
        if (st) {
            pack_str(&p, "parent_block_hash");
            if (e->has_parent)
                msgpack_pack_uint64(&p, e->parent);
            else
                msgpack_pack_nil(&p);
            pack_str(&p, "token_ids");
            msgpack_pack_array(&p, e->ntokens);
            for (uint32_t k = 0; k < e->ntokens; k++)
                msgpack_pack_uint32(&p, e->tokens[k]);
            pack_str(&p, "block_size");
            msgpack_pack_uint32(&p, e->block_size);
            if (e->lora_name != NULL) {
                pack_str(&p, "lora_name");
                pack_str(&p, e->lora_name);
            }
            if (e->cache_salt != NULL) {
                pack_str(&p, "metadata");
                msgpack_pack_map(&p, 1);
                pack_str(&p, "cache_salt");
                msgpack_pack_str_with_body(&p, e->cache_salt, e->cache_salt_len);
            }
            if (e->extra_seeds != NULL) {
                pack_str(&p, "extra_keys");
                msgpack_pack_array(&p, e->nhashes);
                for (uint32_t k = 0; k < e->nhashes; k++) {
                    if (e->extra_seeds[k] == 0) {
                        msgpack_pack_nil(&p);
                        continue;
                    }
                    msgpack_pack_array(&p, 1); /* an opaque key: never taken for a salt */
                    msgpack_pack_uint64(&p, e->extra_seeds[k]);
                }
            }
        }
    }
    msgpack_pack_uint32(&p, b->dp_rank);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *s = fuzz_copy(data, size);
    if (s == NULL)
        return 0;

    kvt_evbatch_t b[2], pattern;
    kvt_status_t st[2];
    memset(&pattern, 0x5a, sizeof(pattern));
    for (int f = 0; f < 2; f++) {
        kvt_ev_format_t fmt = f == 0 ? KVT_EV_FMT_VLLM : KVT_EV_FMT_SGLANG;
        memcpy(&b[f], &pattern, sizeof(pattern));
        char err[200];
        memset(err, 'x', sizeof(err));
        st[f] =
            kvt_ev_msgpack_decode(s, size, fmt, POD, MODEL, 3, UNLIMITED, &b[f], err, sizeof(err));
        CHECK(memchr(err, '\0', sizeof(err)) != NULL);
        kvt_evbatch_t b2;
        CHECK(kvt_ev_msgpack_decode(s, size, fmt, POD, MODEL, 3, UNLIMITED, &b2, NULL, 0) == st[f]);
        if (st[f] == KVT_OK)
            kvt_evbatch_cleanup(&b2);
        if (st[f] != KVT_OK) {
            CHECK(st[f] == KVT_ERR_PARSE || st[f] == KVT_ERR_INVAL || st[f] == KVT_ERR_TOO_BIG ||
                  st[f] == KVT_ERR_NO_MEM);
            CHECK(err[0] != '\0');
            CHECK(memcmp(&b[f], &pattern, sizeof(pattern)) == 0);
        }
    }
    CHECK(st[0] == st[1]);
    if (st[0] != KVT_OK) {
        free(s);
        return 0;
    }
    check_same(&b[0], &b[1], false, false);
    size_t items = check_batch(&b[0]);
    check_batch(&b[1]);

    kvt_evbatch_t c;
    if (!has_bad(&b[0])) { /* a bad event's arrays count against the limit, unread */
        CHECK(kvt_ev_msgpack_decode(s, size, KVT_EV_FMT_VLLM, POD, MODEL, 3, items, &c, NULL, 0) ==
              KVT_OK);
        check_same(&b[0], &c, true, true);
        kvt_evbatch_cleanup(&c);
        if (items > 0)
            CHECK(kvt_ev_msgpack_decode(s, size, KVT_EV_FMT_VLLM, POD, MODEL, 3, items - 1, &c,
                                        NULL, 0) == KVT_ERR_TOO_BIG);
    }

    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_batch(&b[0], &sb);
    CHECK(kvt_ev_msgpack_decode(sb.data, sb.size, KVT_EV_FMT_VLLM, POD, MODEL, 3, UNLIMITED, &c,
                                NULL, 0) == KVT_OK);
    b[0].unknown = c.unknown = 0;
    check_same(&b[0], &c, true, true);
    kvt_evbatch_cleanup(&c);
    msgpack_sbuffer_destroy(&sb);
    kvt_evbatch_cleanup(&b[0]);
    kvt_evbatch_cleanup(&b[1]);
    free(s);
    return 0;
}
