/*
 * kvindex/event.c: applies a decoded batch of engine events to the index
 * (writer thread). Decoders live in event_json.c and event_msgpack.c; the
 * memory that outlives a batch (groups, removed mappings) in event_ctx.c.
 */
#include <stdio.h>
#include <string.h>

#include "common/errtext.h"
#include "kvindex/event.h"
#include "kvindex/event_int.h"
#include "kvindex/hash.h"

static const char *ev_lora(const kvt_evbatch_t *b, const kvt_event_t *e)
{
    return e->lora_name != NULL ? e->lora_name : b->lora;
}

static uint32_t ev_block_size(const kvt_event_t *e, uint32_t def)
{
    return e->block_size != 0 ? e->block_size : def;
}

/* The last namespace a batch's events used: most batches have one (model, LoRA). */
typedef struct ev_ns_cache {
    bool valid;
    const char *lora; /* as ev_lora() gave it */
    uint32_t ns;
} ev_ns_cache_t;

/* kvt_idx_ns_get() for the batch's model and @lora, through @c. */
static kvt_status_t ev_ns(kvt_idx_t *idx, const kvt_evbatch_t *b, const char *lora, uint32_t bs,
                          ev_ns_cache_t *c, uint32_t *ns_p)
{
    if (c->valid &&
        (c->lora == lora || (c->lora != NULL && lora != NULL && strcmp(c->lora, lora) == 0))) {
        if (bs != 0 && kvt_idx_ns_block_size(idx, c->ns) != bs)
            return KVT_ERR_INVAL;
        *ns_p = c->ns;
        return KVT_OK;
    }
    kvt_status_t st = kvt_idx_ns_get(idx, b->model, lora, bs, ns_p);
    if (st == KVT_OK)
        *c = (ev_ns_cache_t){true, lora, *ns_p};
    return st;
}

/* Whether event @e is one whose keys are computed from its tokens (and so checked first). */
static bool ev_hashes_tokens(const kvt_event_t *e)
{
    return e->type == KVT_EV_STORED && e->ntokens > 0 && e->skip == KVT_EV_SKIP_NONE &&
           e->group_kind != KVT_EV_GROUP_OTHER;
}

/* Namespaces a strict batch would create, remembered by their first event's block size. */
#define EV_PENDING_MAX 32u

typedef struct ev_pending {
    uint32_t n;
    struct {
        const char *lora; /* NULL: the base model ("" is the base model too) */
        uint32_t bs;
    } ns[EV_PENDING_MAX];
} ev_pending_t;

static bool ev_same_lora(const char *a, const char *b)
{
    a = a != NULL && a[0] != '\0' ? a : NULL;
    b = b != NULL && b[0] != '\0' ? b : NULL;
    return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/*
 * The block size the batch's first event in namespace @lora (one that does
 * not exist yet) gave it, for stored event @i of @b; 0 when @i is that first
 * event. Namespaces past EV_PENDING_MAX are found again by a scan of the
 * events before @i (a batch naming that many new LoRAs pays for it alone).
 */
static uint32_t ev_pending_bs(ev_pending_t *p, const kvt_evbatch_t *b, size_t i, const char *lora,
                              uint32_t bs, uint32_t def)
{
    for (uint32_t k = 0; k < p->n; k++)
        if (ev_same_lora(p->ns[k].lora, lora))
            return p->ns[k].bs;
    if (p->n == EV_PENDING_MAX) {
        for (size_t j = 0; j < i; j++)
            if (ev_hashes_tokens(&b->ev[j]) && ev_same_lora(ev_lora(b, &b->ev[j]), lora))
                return ev_block_size(&b->ev[j], def);
        return 0;
    }
    p->ns[p->n].lora = lora;
    p->ns[p->n++].bs = bs;
    return 0;
}

/*
 * Checks stored event @i (with tokens) against its namespace: a model is
 * named and the block size is the namespace's. With @pending (the strict
 * check, before anything is applied) a namespace that does not exist yet
 * takes the block size of the batch's first event in it, as applying the
 * batch would create it. KVT_ERR_INVAL with a reason.
 */
static kvt_status_t ev_check_one(kvt_idx_t *idx, const kvt_evbatch_t *b, size_t i, uint32_t def,
                                 ev_ns_cache_t *cache, ev_pending_t *pending, char *err,
                                 size_t errlen)
{
    const kvt_event_t *e = &b->ev[i];
    uint32_t bs = ev_block_size(e, def);
    if (b->model == NULL || b->model[0] == '\0') {
        kvt_errf(err, errlen, "events[%zu]: BlockStored with token_ids needs \"model\"", i);
        return KVT_ERR_INVAL;
    }
    if (bs == 0 || (uint64_t)bs * e->nhashes != e->ntokens) {
        kvt_errf(err, errlen, "events[%zu]: %u token_ids do not fill %u blocks of %u", i,
                 e->ntokens, e->nhashes, bs);
        return KVT_ERR_INVAL;
    }
    uint32_t ns, want = 0;
    if (ev_ns(idx, b, ev_lora(b, e), 0, cache, &ns) == KVT_OK)
        want = kvt_idx_ns_block_size(idx, ns);
    else if (pending != NULL)
        want = ev_pending_bs(pending, b, i, ev_lora(b, e), bs, def);
    if (want != 0 && want != bs) {
        kvt_errf(err, errlen, "events[%zu]: block_size %u, but model '%s' uses %u", i, bs, b->model,
                 want);
        return KVT_ERR_INVAL;
    }
    return KVT_OK;
}

/* Keys are hashed and stored this many blocks at a time (on the stack: no malloc per batch). */
#define EV_CHUNK 128u

/*
 * Keys of blocks @from .. @from + @n of @e, chained from *@parent (NULL: the
 * chain starts at @from, and block @from takes @s->first: the event's cache
 * salt). Blocks with extra keys mix their extra seed into the local hash
 * (kvt_event_t.extra_seeds), xor'd into whichever seed the block has.
 */
static void ev_keys(const kvt_event_t *e, const kvt_hash_seeds_t *s, uint32_t bs, uint32_t from,
                    uint32_t n, const uint64_t *parent, uint64_t *keys)
{
    const uint32_t *tok = e->tokens + (size_t)from * bs;
    uint64_t first = parent == NULL && from == 0 ? s->first : s->block;
    if (e->extra_seeds == NULL) {
        if (s->block == KVT_HASH_SEED) /* the standard: every base-model and namespace-keyed one */
            kvt_hash_seq_salted(tok, (size_t)n * bs, bs, first, parent, NULL, keys);
        else
            kvt_hash_seq_seeds(tok, (size_t)n * bs, bs,
                               &(kvt_hash_seeds_t){first, s->block, s->chain}, parent, NULL, keys);
        return;
    }
    for (uint32_t j = 0; j < n; j++) {
        uint64_t seed = (j == 0 ? first : s->block) ^ e->extra_seeds[from + j];
        uint64_t local = kvt_hash_block(tok + (size_t)j * bs, bs, seed);
        const uint64_t *prev = j > 0 ? &keys[j - 1] : parent;
        keys[j] = prev != NULL ? kvt_hash_chain(*prev, local, s->chain) : local;
    }
}

/*
 * A BlockStored with tokens: its keys, chained from its parent's when the pod knows it. With
 * KVT_EV_LORA_DYNAMO in @flags a LoRA's keys are Dynamo's (kvt_hash_seeds_lora()).
 */
static kvt_status_t ev_stored_tokens(kvt_idx_t *idx, const kvt_evbatch_t *b, const kvt_event_t *e,
                                     uint32_t pod, uint32_t def, unsigned flags,
                                     ev_ns_cache_t *cache, kvt_ev_counters_t *c)
{
    uint32_t bs = ev_block_size(e, def);
    uint32_t ns;
    const char *lora = ev_lora(b, e);
    kvt_status_t st = ev_ns(idx, b, lora, bs, cache, &ns);
    if (st != KVT_OK)
        return st;
    size_t lora_len = (flags & KVT_EV_LORA_DYNAMO) != 0 && lora != NULL ? strlen(lora) : 0;
    kvt_hash_seeds_t seeds; /* of the chain's first block; a chunk after it continues it */
    kvt_hash_seeds_lora(e->cache_salt, e->cache_salt_len, lora, lora_len, &seeds);
    uint64_t parent_key;
    const uint64_t *parent = NULL;
    if (e->has_parent) {
        if (kvt_idx_pod_key(idx, pod, ns, e->parent, &parent_key) == KVT_OK)
            parent = &parent_key;
        else
            c->orphans++; /* the chain is recomputed from the tokens alone */
    }
    uint64_t keys[EV_CHUNK];
    for (uint32_t i = 0; i < e->nhashes && st == KVT_OK; i += EV_CHUNK) {
        uint32_t n = e->nhashes - i < EV_CHUNK ? e->nhashes - i : EV_CHUNK;
        ev_keys(e, &seeds, bs, i, n, parent, keys);
        st = kvt_idx_store(idx, ns, pod, e->tier, parent, keys, e->hashes + i, n);
        parent_key = keys[n - 1]; /* the next chunk continues this chain */
        parent = &parent_key;
    }
    return st;
}

/* A BlockStored; *@dropped_p: its blocks the index had no room for. */
static kvt_status_t ev_stored(kvt_idx_t *idx, kvt_ev_ctx_t *ctx, const kvt_evbatch_t *b,
                              const kvt_event_t *e, uint32_t pod, uint32_t def, unsigned flags,
                              ev_ns_cache_t *cache, kvt_ev_counters_t *c, uint64_t *dropped_p)
{
    kvt_idx_stats_t before, after;
    kvt_idx_stats(idx, &before);
    kvt_status_t st = e->ntokens == 0 ? ev_ctx_placeholder(ctx, idx, pod, e, c) /* CPU offload */
                                      : ev_stored_tokens(idx, b, e, pod, def, flags, cache, c);
    kvt_idx_stats(idx, &after);
    *dropped_p = after.dropped - before.dropped;
    c->dropped += *dropped_p;
    return st;
}

/*
 * Whether event @e of @pod belongs to a KV cache group kvtier indexes. A
 * match means the full-attention group holds the block (as llm-d and Dynamo
 * index it): stores of other groups are skipped and their group remembered
 * (a BlockRemoved names only its group_idx), so evicting a block from a
 * sliding-window group leaves it matched while full attention still holds it.
 */
static bool ev_group_indexed(kvt_ev_ctx_t *ctx, uint32_t pod, const kvt_event_t *e)
{
    if (e->group < 0 || e->type == KVT_EV_CLEARED)
        return true;
    if (e->type == KVT_EV_STORED && e->group_kind != KVT_EV_GROUP_ANY) {
        ev_ctx_group_learn(ctx, pod, e->group, e->group_kind == KVT_EV_GROUP_OTHER);
        return e->group_kind == KVT_EV_GROUP_FULL;
    }
    return !ev_ctx_group_other(ctx, pod, e->group); /* unknown groups: applied, a miss at worst */
}

/* Clears what @pod's engine reported, and what @ctx remembers of its removed blocks. */
static void ev_state_clear(kvt_idx_t *idx, kvt_ev_ctx_t *ctx, uint32_t pod)
{
    kvt_idx_pod_clear(idx, pod, KVT_EV_ENGINE_TIERS);
    ev_ctx_forget_removed(ctx, pod);
}

/* Drops what @pod's engine reported: a bad removal or a failed apply left it unknown. */
static void ev_state_drop(kvt_idx_t *idx, kvt_ev_ctx_t *ctx, uint32_t pod, kvt_ev_counters_t *c)
{
    ev_state_clear(idx, ctx, pod);
    c->state_drops++;
}

bool kvt_ev_drop_state(kvt_idx_t *idx, kvt_ev_ctx_t *ctx, const char *pod, uint32_t dp_rank)
{
    uint32_t id;
    if (kvt_idx_pod_find(idx, pod, dp_rank, &id) != KVT_OK)
        return false;
    ev_state_clear(idx, ctx, id);
    return true;
}

kvt_status_t kvt_ev_apply(kvt_idx_t *idx, kvt_ev_ctx_t *ctx, const kvt_evbatch_t *b,
                          uint32_t default_block_size, unsigned flags, kvt_ev_counters_t *c,
                          char *err, size_t errlen)
{
    const bool strict = (flags & KVT_EV_STRICT) != 0;
    if (errlen > 0)
        err[0] = '\0';
    ev_ns_cache_t cache = {false, NULL, 0};
    ev_pending_t pending = {.n = 0};
    kvt_status_t st;
    for (size_t i = 0; strict && i < b->nev; i++)
        if (ev_hashes_tokens(&b->ev[i]) && (st = ev_check_one(idx, b, i, default_block_size, &cache,
                                                              &pending, err, errlen)) != KVT_OK)
            return st; /* the whole batch is refused before anything changes */
    uint32_t pod;
    st = kvt_idx_pod_get(idx, b->pod, b->dp_rank, &pod);
    if (st != KVT_OK) {
        kvt_errf(err, errlen, "pod '%s': %s", b->pod, kvt_status_str(st));
        return st;
    }
    if ((st = ev_ctx_pod(ctx, pod)) != KVT_OK) {
        kvt_errf(err, errlen, "pod '%s': %s", b->pod, kvt_status_str(st));
        if (!strict)
            ev_state_drop(idx, ctx, pod, c); /* as for any hard error: the batch is lost */
        return st;
    }
    for (size_t i = 0; i < b->nev && st == KVT_OK; i++) {
        const kvt_event_t *e = &b->ev[i];
        if (e->type == KVT_EV_BAD) {
            c->bad++;
            if (e->may_remove)
                ev_state_drop(idx, ctx, pod, c);
            continue;
        }
        if (e->skip != KVT_EV_SKIP_NONE) {
            if (e->skip == KVT_EV_SKIP_MEDIUM)
                c->unknown_medium++;
            else
                c->remote++;
            continue;
        }
        if (!ev_group_indexed(ctx, pod, e)) {
            c->other_groups++;
            continue;
        }
        if (!strict && ev_hashes_tokens(e) &&
            ev_check_one(idx, b, i, default_block_size, &cache, NULL, err, errlen) != KVT_OK) {
            c->bad++; /* a store: skipping it loses a hit at worst */
            continue;
        }
        uint64_t dropped = 0;
        switch (e->type) {
        case KVT_EV_STORED:
            st = ev_stored(idx, ctx, b, e, pod, default_block_size, flags, &cache, c, &dropped);
            break;
        case KVT_EV_REMOVED: st = ev_ctx_remove(ctx, idx, pod, e, c); break;
        case KVT_EV_CLEARED: st = kvt_idx_pod_clear(idx, pod, KVT_TIER_GPU); break;
        default: break;
        }
        if (st == KVT_OK) {
            c->events += dropped == 0; /* one the index had no room for is not applied */
            c->blocks += e->nhashes - dropped;
        } else {
            kvt_errf(err, errlen, "events[%zu]: %s", i, kvt_status_str(st));
            if (!strict)
                ev_state_drop(idx, ctx, pod, c); /* what follows may have held removals */
        }
    }
    return st;
}
