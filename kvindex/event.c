/*
 * kvindex/event.c: applies a decoded batch of engine events to the index
 * (writer thread). Decoders live in event_json.c (and the msgpack codec).
 */
#include <stdio.h>
#include <string.h>

#include "kvindex/event.h"
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

/* Refuses the batch before anything changes; see kvt_ev_apply(). */
static kvt_status_t ev_check(kvt_idx_t *idx, const kvt_evbatch_t *b, uint32_t def,
                             ev_ns_cache_t *cache, char *err, size_t errlen)
{
    for (size_t i = 0; i < b->nev; i++) {
        const kvt_event_t *e = &b->ev[i];
        if (e->type != KVT_EV_STORED || e->ntokens == 0)
            continue;
        uint32_t bs = ev_block_size(e, def);
        if (b->model == NULL || b->model[0] == '\0') {
            snprintf(err, errlen, "events[%zu]: BlockStored with token_ids needs \"model\"", i);
            return KVT_ERR_INVAL;
        }
        if (bs == 0 || (uint64_t)bs * e->nhashes != e->ntokens) {
            snprintf(err, errlen, "events[%zu]: %u token_ids do not fill %u blocks of %u", i,
                     e->ntokens, e->nhashes, bs);
            return KVT_ERR_INVAL;
        }
        uint32_t ns;
        if (ev_ns(idx, b, ev_lora(b, e), 0, cache, &ns) == KVT_OK &&
            kvt_idx_ns_block_size(idx, ns) != bs) {
            snprintf(err, errlen, "events[%zu]: block_size %u, but model '%s' uses %u", i, bs,
                     b->model, kvt_idx_ns_block_size(idx, ns));
            return KVT_ERR_INVAL;
        }
    }
    return KVT_OK;
}

/* Keys are hashed and stored this many blocks at a time (on the stack: no malloc per batch). */
#define EV_CHUNK 128u

static kvt_status_t ev_stored(kvt_idx_t *idx, const kvt_evbatch_t *b, const kvt_event_t *e,
                              uint32_t pod, uint32_t def, ev_ns_cache_t *cache,
                              kvt_ev_counters_t *c)
{
    if (e->ntokens == 0) {
        /* a placeholder (vLLM CPU offload): only hashes the pod already knows */
        size_t unresolved = 0;
        kvt_status_t st =
            kvt_idx_store_by_ehash(idx, pod, e->tier, e->hashes, e->nhashes, &unresolved);
        c->unresolved += unresolved;
        return st;
    }
    uint32_t bs = ev_block_size(e, def);
    uint32_t ns;
    kvt_status_t st = ev_ns(idx, b, ev_lora(b, e), bs, cache, &ns);
    if (st != KVT_OK)
        return st;
    uint64_t parent_key;
    const uint64_t *parent = NULL;
    if (e->has_parent) {
        if (kvt_idx_pod_key(idx, pod, ns, e->parent, &parent_key) == KVT_OK)
            parent = &parent_key;
        else
            c->orphans++; /* the chain is recomputed from the tokens alone */
    }
    /* a chain that starts here carries the request's cache salt in its first block */
    uint64_t first_seed =
        parent == NULL ? kvt_hash_salt_seed(e->cache_salt, e->cache_salt_len) : KVT_HASH_SEED;
    uint64_t keys[EV_CHUNK];
    for (uint32_t i = 0; i < e->nhashes && st == KVT_OK; i += EV_CHUNK) {
        uint32_t n = e->nhashes - i < EV_CHUNK ? e->nhashes - i : EV_CHUNK;
        kvt_hash_seq_salted(e->tokens + (size_t)i * bs, (size_t)n * bs, bs,
                            i == 0 ? first_seed : KVT_HASH_SEED, parent, NULL, keys);
        st = kvt_idx_store(idx, ns, pod, e->tier, parent, keys, e->hashes + i, n);
        parent_key = keys[n - 1]; /* the next chunk continues this chain */
        parent = &parent_key;
    }
    return st;
}

kvt_status_t kvt_ev_apply(kvt_idx_t *idx, const kvt_evbatch_t *b, uint32_t default_block_size,
                          kvt_ev_counters_t *c, char *err, size_t errlen)
{
    if (errlen > 0)
        err[0] = '\0';
    ev_ns_cache_t cache = {false, NULL, 0};
    kvt_status_t st = ev_check(idx, b, default_block_size, &cache, err, errlen);
    if (st != KVT_OK)
        return st;
    uint32_t pod;
    st = kvt_idx_pod_get(idx, b->pod, b->dp_rank, &pod);
    if (st != KVT_OK) {
        snprintf(err, errlen, "pod '%s': %s", b->pod, kvt_status_str(st));
        return st;
    }
    for (size_t i = 0; i < b->nev && st == KVT_OK; i++) {
        const kvt_event_t *e = &b->ev[i];
        size_t unresolved = 0;
        switch (e->type) {
        case KVT_EV_STORED: st = ev_stored(idx, b, e, pod, default_block_size, &cache, c); break;
        case KVT_EV_REMOVED:
            st = kvt_idx_remove(idx, pod, e->tier, e->hashes, e->nhashes, &unresolved);
            c->unresolved += unresolved;
            break;
        case KVT_EV_CLEARED: st = kvt_idx_pod_clear(idx, pod, KVT_TIER_GPU); break;
        }
        if (st == KVT_OK) {
            c->events++;
            c->blocks += e->nhashes;
        } else {
            snprintf(err, errlen, "events[%zu]: %s", i, kvt_status_str(st));
        }
    }
    return st;
}
