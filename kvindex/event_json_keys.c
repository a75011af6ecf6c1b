/*
 * kvindex/event_json_keys.c: vLLM's "extra_keys" in a JSON events body, read
 * after the rest of the body and hashed to each block's extra seed in the
 * canonical form the msgpack decoder uses too (event_keys_int.h).
 */
#include <math.h>
#include <string.h>

#include "common/json.h"
#include "kvindex/event_json_int.h"
#include "kvindex/event_keys_int.h"

/*
 * Feeds the number that is due in @x to @h in the canonical form
 * (event_keys_int.h): an integer in uint64 or int64 as such, any other number
 * as a double (one past a double's range as an infinity).
 */
static kvt_status_t kvt_evj_key_number(kvt_json_t *x, XXH3_state_t *h)
{
    kvt_json_mark_t m;
    kvt_json_mark(x, &m);
    uint64_t u;
    int64_t i;
    double f;
    if (kvt_json_u64(x, &u) == KVT_OK) {
        ev_key_u64(h, EV_KEY_UINT, u);
        return KVT_OK;
    }
    kvt_json_rewind(x, &m);
    if (kvt_json_i64(x, &i) == KVT_OK) {
        ev_key_u64(h, EV_KEY_NEG, (uint64_t)i); /* only a negative one gets here */
        return KVT_OK;
    }
    kvt_json_rewind(x, &m);
    if (kvt_json_double(x, &f) == KVT_OK) {
        ev_key_double(h, f);
        return KVT_OK;
    }
    kvt_json_rewind(x, &m); /* it overflows a double */
    bool neg = x->s[kvt_json_offset(x)] == '-';
    if (kvt_json_skip(x) != KVT_OK)
        return kvt_json_status(x);
    ev_key_double(h, neg ? -HUGE_VAL : HUGE_VAL);
    return KVT_OK;
}

/*
 * Feeds the value that is due in @x (checked JSON: a span the body's parse
 * already skipped) to @h in the canonical form, strings and keys decoded into
 * @buf[0..cap). Iterative: the parser's depth limit bounds the nesting.
 * KVT_ERR_INTERNAL when a string does not fit @buf (the arena's free part).
 */
static kvt_status_t kvt_evj_key_value(kvt_json_t *x, XXH3_state_t *h, char *buf, size_t cap)
{
    uint64_t is_obj = 0; /* bit k: the container k + 1 levels down is an object */
    unsigned depth = 0;
    size_t n;
    bool b;
    for (;;) {
        switch (kvt_json_peek(x)) { /* a value is due */
        case KVT_JSON_NULL:
            kvt_json_null(x);
            ev_key_tag(h, EV_KEY_NULL);
            break;
        case KVT_JSON_TRUE:
        case KVT_JSON_FALSE:
            if (kvt_json_bool(x, &b) == KVT_OK)
                ev_key_bool(h, b);
            break;
        case KVT_JSON_NUMBER: kvt_evj_key_number(x, h); break;
        case KVT_JSON_STRING:
            if (cap == 0 || kvt_json_string(x, buf, cap, &n) != KVT_OK)
                return cap == 0 || kvt_json_status(x) == KVT_ERR_TOO_BIG ? KVT_ERR_INTERNAL
                                                                         : kvt_json_status(x);
            ev_key_bytes(h, EV_KEY_STR, buf, (uint32_t)n);
            break;
        case KVT_JSON_ARRAY:
        case KVT_JSON_OBJECT: {
            bool obj = kvt_json_peek(x) == KVT_JSON_OBJECT;
            if ((obj ? kvt_json_object_begin(x) : kvt_json_array_begin(x)) != KVT_OK || depth >= 64)
                return KVT_ERR_INVAL;
            ev_key_tag(h, obj ? EV_KEY_MAP : EV_KEY_ARRAY);
            is_obj = obj ? is_obj | 1ull << depth : is_obj & ~(1ull << depth);
            depth++;
            break;
        }
        default: break; /* an error: returned below */
        }
        for (;;) { /* on to the next value due, closing the containers that end */
            if (kvt_json_status(x) != KVT_OK)
                return kvt_json_status(x);
            if (depth == 0)
                return KVT_OK;
            int r;
            if (is_obj >> (depth - 1) & 1) {
                if (cap == 0)
                    return KVT_ERR_INTERNAL;
                r = kvt_json_object_next_into(x, buf, cap, &n);
                if (r == 1)
                    ev_key_bytes(h, EV_KEY_STR, buf, (uint32_t)n); /* the key, then its value */
            } else {
                r = kvt_json_array_next(x);
            }
            if (r < 0)
                return r == KVT_ERR_TOO_BIG ? KVT_ERR_INTERNAL : (kvt_status_t)r;
            if (r == 1)
                break;
            ev_key_tag(h, EV_KEY_END);
            depth--;
        }
    }
}

/*
 * vLLM's "extra_keys" (one entry per block: null or an array of the block's
 * extra hash keys) of event @ev, read once the whole body is (the event's
 * lora_name and parent may follow them in the event, the batch's lora_name
 * may follow "events") from the text span x->from .. x->to of the body: the
 * LoRA leading an entry (the event's lora_name, else the batch's
 * @batch_lora; or its lora_id) is skipped, a lone string left on a chain's
 * first block is the cache salt (unless "cache_salt" gave one), anything
 * else becomes the block's extra seed, hashed in the canonical form the
 * msgpack decoder uses too (event_keys_int.h). Strings are decoded in the
 * arena's free part, past the seeds.
 */
kvt_status_t kvt_evj_extras(kvt_evj_t *d, const kvt_evj_extra_t *xs, kvt_event_t *ev,
                            const char *batch_lora)
{
    const char *lora_name = ev->lora_name != NULL ? ev->lora_name : batch_lora;
    size_t lora_len = lora_name != NULL ? strlen(lora_name) : 0;
    kvt_json_t x;
    d->idx = xs->idx;
    kvt_json_init(&x, d->j.s + xs->from, xs->to - xs->from);
    if (kvt_json_peek(&x) != KVT_JSON_ARRAY)
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "field 'extra_keys' must be an array or null");
    if (kvt_evj_align(d, 8) < ev->nhashes) /* 8 bytes per block: < 5x its text */
        return kvt_evj_fail(d, KVT_ERR_INTERNAL, "event arena exhausted");
    uint64_t *seeds = (uint64_t *)(void *)(d->arena + d->bump);
    bool any = false;
    uint32_t nblk = 0;
    int r;
    kvt_status_t st = KVT_OK;
    kvt_json_array_begin(&x);
    while ((r = kvt_json_array_next(&x)) == 1) {
        if (nblk == ev->nhashes)
            return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "extra_keys has more entries than blocks");
        char *buf = (char *)(seeds + ev->nhashes);
        size_t cap = (size_t)(d->arena + d->bump_end - buf);
        uint64_t seed = 0;
        if (kvt_json_peek(&x) == KVT_JSON_NULL) {
            kvt_json_null(&x);
            seeds[nblk++] = 0;
            continue;
        }
        if (kvt_json_peek(&x) != KVT_JSON_ARRAY)
            return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "extra_keys[%u] must be an array or null",
                                   nblk);
        kvt_json_array_begin(&x);
        XXH3_state_t h;
        ev_key_begin(&h);
        uint32_t nkey = 0, nkept = 0;
        size_t lone_len = 0; /* the kept string's length, decoded in buf */
        bool lone = false;
        while (st == KVT_OK && (r = kvt_json_array_next(&x)) == 1) {
            kvt_json_type_t t = kvt_json_peek(&x);
            size_t n;
            if (t == KVT_JSON_STRING) {
                if (cap == 0 || kvt_json_string(&x, buf, cap, &n) != KVT_OK) {
                    st = cap == 0 || kvt_json_status(&x) == KVT_ERR_TOO_BIG ? KVT_ERR_INTERNAL
                                                                            : kvt_json_status(&x);
                    break;
                }
                if (nkey++ == 0 && lora_len > 0 && n == lora_len && memcmp(buf, lora_name, n) == 0)
                    continue; /* the LoRA's name */
                ev_key_bytes(&h, EV_KEY_STR, buf, (uint32_t)n);
                /* a salt as a query gives it: 1..255 bytes, no NUL */
                lone = n > 0 && n <= KVT_IDX_MAX_NAME && memchr(buf, '\0', n) == NULL;
                lone_len = n;
                nkept++;
                continue;
            }
            if (t == KVT_JSON_NUMBER && nkey == 0 && xs->has_lora_id) {
                kvt_json_mark_t m;
                kvt_json_mark(&x, &m);
                uint64_t id;
                if (kvt_json_u64(&x, &id) == KVT_OK && id == xs->lora_id) {
                    nkey++;
                    continue; /* the LoRA's id (older vLLM) */
                }
                kvt_json_rewind(&x, &m);
            }
            nkey++;
            nkept += 2; /* never a salt */
            st = kvt_evj_key_value(&x, &h, buf, cap);
        }
        if (st == KVT_ERR_INTERNAL)
            return kvt_evj_fail(d, st, "events[%zu].extra_keys: event arena exhausted", d->idx);
        if (st != KVT_OK || r < 0 || kvt_json_status(&x) != KVT_OK)
            return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "extra_keys[%u]: %s", nblk,
                                   kvt_json_error(&x));
        if (nkept == 1 && lone && nblk == 0 && !ev->has_parent) {
            if (ev->cache_salt == NULL) {
                /* the salt, still in buf, goes where the seeds were to start: they move past it */
                char *dst = d->arena + d->bump;
                memmove(dst, buf, lone_len);
                dst[lone_len] = '\0';
                d->bump += lone_len + 1;
                if (kvt_evj_align(d, 8) < ev->nhashes)
                    return kvt_evj_fail(d, KVT_ERR_INTERNAL, "event arena exhausted");
                seeds = (uint64_t *)(void *)(d->arena + d->bump);
                ev->cache_salt = dst;
                ev->cache_salt_len = (uint32_t)lone_len;
            }
        } else if (nkept > 0) {
            seed = ev_key_seed(&h);
            any = true;
        }
        seeds[nblk++] = seed;
    }
    if (r < 0 || kvt_json_end(&x) != KVT_OK)
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "extra_keys: %s", kvt_json_error(&x));
    if (nblk != ev->nhashes)
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "extra_keys has %u entries for %u block_hashes",
                               nblk, ev->nhashes);
    if (any) {
        ev->extra_seeds = seeds;
        d->bump += (size_t)nblk * 8;
    }
    return KVT_OK;
}
