/*
 * libFuzzer target for kvt_ev_msgpack_decode() (kvindex/event_msgpack.c).
 *
 * Invariants checked on every input, under both formats:
 *  - the input is copied to an exactly-sized heap buffer, so ASan reports any
 *    read past len;
 *  - success: every array and name lies inside the arena, aligned; hashes
 *    and tokens are NULL exactly when their count is 0; ntokens is
 *    block_size * nhashes or 0; BlockStored has hashes, other types carry
 *    only what they may; tiers are single known bits; pod and model are the
 *    caller's; the item count respects max_items;
 *  - failure: a documented status (never KVT_ERR_INTERNAL: the raw check
 *    and msgpack-c disagreed), a non-empty message, the batch untouched;
 *  - the verdict does not depend on the error buffer, and the two formats
 *    give the same verdict and the same batch except for bytes hashes;
 *  - max_items equal to the batch's item count decodes, one less is
 *    KVT_ERR_TOO_BIG;
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
    const char *lo = b->arena, *hi = lo + malloc_usable_size(b->arena);
    return (const char *)p >= lo && n <= (size_t)(hi - (const char *)p);
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
        CHECK(e->tier == KVT_TIER_GPU || e->tier == KVT_TIER_CPU || e->tier == KVT_TIER_DISK);
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

/* Same batch; hashes compared only when @hashes (bytes read differently by format). */
static void check_same(const kvt_evbatch_t *a, const kvt_evbatch_t *b, bool hashes)
{
    CHECK(a->dp_rank == b->dp_rank && a->nev == b->nev && a->unknown == b->unknown);
    for (size_t i = 0; i < a->nev; i++) {
        const kvt_event_t *x = &a->ev[i], *y = &b->ev[i];
        CHECK(x->type == y->type && x->tier == y->tier && x->nhashes == y->nhashes);
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

/* Packs @b as a v0.26 batch (maps, uint64 hashes). Unknowns are not carried over. */
static void pack_batch(const kvt_evbatch_t *b, msgpack_sbuffer *sb)
{
    static const char *const types[] = {"", "BlockStored", "BlockRemoved", "AllBlocksCleared"};
    msgpack_packer p;
    msgpack_packer_init(&p, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.0);
    msgpack_pack_array(&p, (uint32_t)b->nev);
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        bool st = e->type == KVT_EV_STORED;
        uint32_t n = 1 + (e->type != KVT_EV_CLEARED) * 2 + st * (3 + (e->lora_name != NULL));
        msgpack_pack_map(&p, n);
        pack_str(&p, "type");
        pack_str(&p, types[e->type]);
        if (e->type != KVT_EV_CLEARED) {
            pack_str(&p, "block_hashes");
            msgpack_pack_array(&p, e->nhashes);
            for (uint32_t k = 0; k < e->nhashes; k++)
                msgpack_pack_uint64(&p, e->hashes[k]);
            pack_str(&p, "medium");
            pack_str(&p, e->tier == KVT_TIER_CPU    ? "CPU"
                         : e->tier == KVT_TIER_DISK ? "DISK"
                                                    : "GPU");
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
    check_same(&b[0], &b[1], false);
    size_t items = check_batch(&b[0]);
    check_batch(&b[1]);

    kvt_evbatch_t c;
    CHECK(kvt_ev_msgpack_decode(s, size, KVT_EV_FMT_VLLM, POD, MODEL, 3, items, &c, NULL, 0) ==
          KVT_OK);
    check_same(&b[0], &c, true);
    kvt_evbatch_cleanup(&c);
    if (items > 0)
        CHECK(kvt_ev_msgpack_decode(s, size, KVT_EV_FMT_VLLM, POD, MODEL, 3, items - 1, &c, NULL,
                                    0) == KVT_ERR_TOO_BIG);

    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_batch(&b[0], &sb);
    CHECK(kvt_ev_msgpack_decode(sb.data, sb.size, KVT_EV_FMT_VLLM, POD, MODEL, 3, UNLIMITED, &c,
                                NULL, 0) == KVT_OK);
    b[0].unknown = c.unknown = 0;
    check_same(&b[0], &c, true);
    kvt_evbatch_cleanup(&c);
    msgpack_sbuffer_destroy(&sb);
    kvt_evbatch_cleanup(&b[0]);
    kvt_evbatch_cleanup(&b[1]);
    free(s);
    return 0;
}
