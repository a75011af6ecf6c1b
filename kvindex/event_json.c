/*
 * POST /v1/events decoder: JSON body -> kvt_evbatch_t, in one pass with the
 * pull parser (common/json.h), into one arena.
 *
 * Arena sizing. The arena is one malloc made before parsing, sized from the
 * body length so that it can never run out:
 *  - event slots (each with where its extra_keys lie): a decoded event is
 *    at least `{"type":"AllBlocksCleared"}`, 27 bytes, so len / 27 + 1 slots
 *    hold them all;
 *  - a bump region of 5 * len + 64 bytes for hash and token arrays and
 *    names. Every item costs at most 5x the body bytes it was read from: a
 *    k-element hash array takes >= 2k+1 bytes of text and 8k bytes plus at
 *    most 7 of alignment; tokens 4k plus 3; a string of r raw bytes decodes
 *    to at most r-1 bytes with its NUL; "[]" costs only alignment (<= 7 of
 *    its 10). The 64 bytes cover a "" model name. extra_keys, read last,
 *    keep 8 bytes per entry (>= 2 bytes of text each) and at most a salt;
 *    the strings hashed on the way are decoded in the free part past those
 *    (a string decodes to fewer bytes than its text), which the 5x leaves.
 * Both bounds are still checked as we go (an overrun would be a bug and
 * gives KVT_ERR_INTERNAL, never a write past the end).
 *
 * Field order inside an event is not fixed, so fields are read before the
 * event's "type" may be known. When a field fails to read before the type
 * is known, the event is scanned again for its type alone: an unknown type
 * is skipped (its fields may mean something else), a known one is parsed a
 * second time knowing the type, so the error is the same in any order.
 */
#include "kvindex/event.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/errtext.h"
#include "common/json.h"

#include "kvindex/event_json_int.h"

/* Fields of an event (bits), and which each type consumes. */
enum {
    KVT_EVJ_F_TYPE = 1u << 0,
    KVT_EVJ_F_HASHES = 1u << 1,
    KVT_EVJ_F_PARENT = 1u << 2,
    KVT_EVJ_F_TOKENS = 1u << 3,
    KVT_EVJ_F_BLOCK_SIZE = 1u << 4,
    KVT_EVJ_F_MEDIUM = 1u << 5,
    KVT_EVJ_F_LORA = 1u << 6,
    KVT_EVJ_F_IGNORED = 1u << 7, /* known vLLM fields kvtier does not use: skipped, not counted */
    KVT_EVJ_F_SALT = 1u << 8,
    KVT_EVJ_F_EXTRA = 1u << 9,
    KVT_EVJ_F_GROUP = 1u << 10,
    KVT_EVJ_F_KIND = 1u << 11,
    KVT_EVJ_F_LOCALITY = 1u << 12,
};
#define KVT_EVJ_STORED_FIELDS                                                                      \
    (KVT_EVJ_F_HASHES | KVT_EVJ_F_PARENT | KVT_EVJ_F_TOKENS | KVT_EVJ_F_BLOCK_SIZE |               \
     KVT_EVJ_F_MEDIUM | KVT_EVJ_F_LORA | KVT_EVJ_F_SALT | KVT_EVJ_F_EXTRA | KVT_EVJ_F_GROUP |      \
     KVT_EVJ_F_KIND | KVT_EVJ_F_LOCALITY)
#define KVT_EVJ_REMOVED_FIELDS                                                                     \
    (KVT_EVJ_F_HASHES | KVT_EVJ_F_MEDIUM | KVT_EVJ_F_GROUP | KVT_EVJ_F_LOCALITY)

/* Event type as decoded: 0 not seen yet, -1 unknown, else kvt_ev_type_t. */
#define KVT_EVJ_T_UNSEEN 0
#define KVT_EVJ_T_UNKNOWN (-1)

/* A smallest decodable event, which bounds the number of events. */
#define KVT_EVJ_MIN_EVENT_BYTES 27u

/*
 * Where an event's "extra_keys" lie in the body: read once the whole body is,
 * since the batch's "lora_name" (which extra keys may start with) can follow
 * "events". from == to: none to read.
 */

/* ---- errors --------------------------------------------------------------------------- */

/* Writes the message; with @in_event it starts "events[<idx>]: ". Error path only. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 0)))
#endif
static kvt_status_t
kvt_evj_vfail(kvt_evj_t *d, bool in_event, kvt_status_t st, const char *fmt, va_list ap)
{
    if (!in_event) {
        kvt_verrf(d->err, d->errlen, fmt, ap);
        return st;
    }
    if (d->err == NULL || d->errlen == 0)
        return st; /* no text wanted: skip formatting the part */
    char msg[512];
    kvt_verrf(msg, sizeof(msg), fmt, ap);
    kvt_errf(d->err, d->errlen, "events[%zu]: %s", d->idx, msg);
    return st;
}

kvt_status_t kvt_evj_fail(kvt_evj_t *d, kvt_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt_evj_vfail(d, false, st, fmt, ap);
    va_end(ap);
    return st;
}

/* Like kvt_evj_fail(), naming the event being decoded. */
kvt_status_t kvt_evj_ev_fail(kvt_evj_t *d, kvt_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt_evj_vfail(d, true, st, fmt, ap);
    va_end(ap);
    return st;
}

/* The parser's status as this decoder reports it: a range error is a wrong shape here. */
static kvt_status_t kvt_evj_json_status(const kvt_evj_t *d)
{
    kvt_status_t st = kvt_json_status(&d->j);
    if (st == KVT_OK)
        return KVT_ERR_INTERNAL;
    return st == KVT_ERR_RANGE ? KVT_ERR_INVAL : st;
}

/* The parser failed outside the events: its message, after @ctx ("field 'pod'") if any. */
static kvt_status_t kvt_evj_json_fail(kvt_evj_t *d, const char *ctx)
{
    if (ctx == NULL)
        return kvt_evj_fail(d, kvt_evj_json_status(d), "%s", kvt_json_error(&d->j));
    return kvt_evj_fail(d, kvt_evj_json_status(d), "%s: %s", ctx, kvt_json_error(&d->j));
}

/* The parser failed in the event being decoded, in its @field when not NULL:
 * "events[3].token_ids: offset 120: ...". */
static kvt_status_t kvt_evj_ev_json_fail(kvt_evj_t *d, const char *field)
{
    if (field == NULL)
        return kvt_evj_ev_fail(d, kvt_evj_json_status(d), "%s", kvt_json_error(&d->j));
    return kvt_evj_fail(d, kvt_evj_json_status(d), "events[%zu].%s: %s", d->idx, field,
                        kvt_json_error(&d->j));
}

/* A key, made printable for a message: at most 40 bytes, others as '?'. */
static void kvt_evj_printable(const char *key, size_t klen, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < klen && o + 4 < cap; i++) {
        if (i == 40) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        unsigned char c = (unsigned char)key[i];
        out[o++] = c >= 0x20 && c < 0x7f && c != '\'' ? (char)c : '?';
    }
    out[o] = '\0';
}

static bool kvt_evj_key_is(const char *key, size_t klen, const char *name)
{
    size_t n = strlen(name);
    return klen == n && memcmp(key, name, n) == 0;
}

/* ---- arena ---------------------------------------------------------------------------- */

/* Aligns the bump pointer to @align; returns the room left in units of @align. */
size_t kvt_evj_align(kvt_evj_t *d, size_t align)
{
    size_t b = (d->bump + align - 1) & ~(align - 1);
    if (b > d->bump_end)
        b = d->bump_end;
    d->bump = b;
    return (d->bump_end - b) / align;
}

/*
 * Reads the string that is due into the arena: a name of at most
 * KVT_IDX_MAX_NAME bytes without NUL characters ("" only when @empty_ok).
 * @field names it in messages, inside the current event when @in_event.
 */
static kvt_status_t kvt_evj_name(kvt_evj_t *d, const char *field, bool in_event, bool empty_ok,
                                 const char **out_p)
{
    size_t room = d->bump_end - d->bump;
    size_t cap = room < KVT_IDX_MAX_NAME + 1 ? room : KVT_IDX_MAX_NAME + 1;
    char *dst = d->arena + d->bump;
    kvt_status_t st = KVT_OK;
    size_t n;

    if (kvt_json_peek(&d->j) != KVT_JSON_STRING && kvt_json_status(&d->j) == KVT_OK) {
        st = KVT_ERR_INVAL;
        if (in_event)
            return kvt_evj_ev_fail(d, st, "field '%s' must be a string", field);
        return kvt_evj_fail(d, st, "field '%s' must be a string", field);
    }
    if (kvt_json_string(&d->j, dst, cap, &n) != KVT_OK) {
        if (kvt_json_status(&d->j) == KVT_ERR_TOO_BIG && cap < KVT_IDX_MAX_NAME + 1)
            return kvt_evj_fail(d, KVT_ERR_INTERNAL, "field '%s': event arena exhausted", field);
        if (in_event)
            return kvt_evj_ev_json_fail(d, field);
        return kvt_evj_fail(d, kvt_evj_json_status(d), "field '%s': %s", field,
                            kvt_json_error(&d->j));
    }
    const char *why = NULL;
    if (memchr(dst, '\0', n) != NULL)
        why = "contains a NUL character";
    else if (n == 0 && !empty_ok)
        why = "is empty";
    if (why != NULL) {
        if (in_event)
            return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "field '%s' %s", field, why);
        return kvt_evj_fail(d, KVT_ERR_INVAL, "field '%s' %s", field, why);
    }
    d->bump += n + 1;
    *out_p = dst;
    return KVT_OK;
}

/* Room for more items: the lesser of the arena's @arena_cap and max_items. Sets
 * *by_limit when max_items is the tighter one. */
static size_t kvt_evj_item_cap(const kvt_evj_t *d, size_t arena_cap, bool *by_limit)
{
    size_t left = d->max_items - d->items;
    *by_limit = left <= arena_cap;
    return *by_limit ? left : arena_cap;
}

static kvt_status_t kvt_evj_too_many(kvt_evj_t *d, const char *field, bool by_limit)
{
    if (!by_limit)
        return kvt_evj_fail(d, KVT_ERR_INTERNAL, "events[%zu].%s: event arena exhausted", d->idx,
                            field);
    return kvt_evj_fail(d, KVT_ERR_TOO_BIG,
                        "events[%zu].%s: more than %zu hashes and tokens in all", d->idx, field,
                        d->max_items);
}

/* ---- one event ------------------------------------------------------------------------ */

static unsigned kvt_evj_field(const char *key, size_t klen)
{
    static const struct {
        const char *name;
        unsigned bit;
    } fields[] = {
        {"type", KVT_EVJ_F_TYPE},
        {"block_hashes", KVT_EVJ_F_HASHES},
        {"parent_block_hash", KVT_EVJ_F_PARENT},
        {"token_ids", KVT_EVJ_F_TOKENS},
        {"block_size", KVT_EVJ_F_BLOCK_SIZE},
        {"medium", KVT_EVJ_F_MEDIUM},
        {"lora_name", KVT_EVJ_F_LORA},
        {"cache_salt", KVT_EVJ_F_SALT},
        {"extra_keys", KVT_EVJ_F_EXTRA},
        {"group_idx", KVT_EVJ_F_GROUP},
        {"kv_cache_spec_kind", KVT_EVJ_F_KIND},
        {"locality", KVT_EVJ_F_LOCALITY},
        {"lora_id", KVT_EVJ_F_IGNORED},
        {"kv_cache_spec_sliding_window", KVT_EVJ_F_IGNORED},
        {"ownership", KVT_EVJ_F_IGNORED},
        {"event_version", KVT_EVJ_F_IGNORED},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if (kvt_evj_key_is(key, klen, fields[i].name))
            return fields[i].bit;
    return 0;
}

static unsigned kvt_evj_type_fields(int type)
{
    switch (type) {
    case KVT_EV_STORED: return KVT_EVJ_STORED_FIELDS;
    case KVT_EV_REMOVED: return KVT_EVJ_REMOVED_FIELDS;
    default: return 0;
    }
}

/*
 * Reads the "type" value that is due: sets *type_p to a kvt_ev_type_t or
 * KVT_EVJ_T_UNKNOWN. A string too long for any known type is an unknown
 * type, not an error.
 */
static kvt_status_t kvt_evj_type(kvt_evj_t *d, int *type_p)
{
    char name[24];
    size_t n;

    if (kvt_json_peek(&d->j) != KVT_JSON_STRING) {
        if (kvt_json_status(&d->j) != KVT_OK)
            return kvt_evj_ev_json_fail(d, NULL);
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "field 'type' must be a string");
    }
    kvt_json_mark_t save; /* TOO_BIG is sticky: come back and skip instead */
    kvt_json_mark(&d->j, &save);
    if (kvt_json_string(&d->j, name, sizeof(name), &n) != KVT_OK) {
        if (kvt_json_status(&d->j) != KVT_ERR_TOO_BIG)
            return kvt_evj_ev_json_fail(d, NULL);
        kvt_json_rewind(&d->j, &save);
        if (kvt_json_skip(&d->j) != KVT_OK)
            return kvt_evj_ev_json_fail(d, NULL);
        *type_p = KVT_EVJ_T_UNKNOWN;
        return KVT_OK;
    }
    if (kvt_evj_key_is(name, n, "BlockStored"))
        *type_p = KVT_EV_STORED;
    else if (kvt_evj_key_is(name, n, "BlockRemoved"))
        *type_p = KVT_EV_REMOVED;
    else if (kvt_evj_key_is(name, n, "AllBlocksCleared"))
        *type_p = KVT_EV_CLEARED;
    else
        *type_p = KVT_EVJ_T_UNKNOWN;
    return KVT_OK;
}

/* A JSON null where an optional field's value goes: consumed, and the field counts as absent. */
static kvt_status_t kvt_evj_opt_null(kvt_evj_t *d, const char *field, bool *null_p)
{
    *null_p = kvt_json_peek(&d->j) == KVT_JSON_NULL;
    if (*null_p && kvt_json_null(&d->j) != KVT_OK)
        return kvt_evj_ev_json_fail(d, field);
    return KVT_OK;
}

/*
 * "medium": null is GPU; otherwise a name kvt_ev_medium_tier() maps. Another
 * name is not an error: the event is kept, marked skipped, with the name
 * (cut by kvt_ev_medium_name_len(), as the msgpack decoder cuts it) for
 * counting; "" is counted as "?".
 */
static kvt_status_t kvt_evj_medium(kvt_evj_t *d, kvt_event_t *ev)
{
    bool null;
    ev->tier = KVT_TIER_GPU;
    kvt_status_t st = kvt_evj_opt_null(d, "medium", &null);
    if (st != KVT_OK || null)
        return st;
    if (kvt_json_peek(&d->j) != KVT_JSON_STRING) {
        if (kvt_json_status(&d->j) != KVT_OK)
            return kvt_evj_ev_json_fail(d, "medium");
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "field 'medium' must be a string or null");
    }
    /* Decoded where the arena is free (a string decodes to fewer bytes than its text); only
     * the part kept for an unknown medium is taken. */
    char *dst = d->arena + d->bump;
    size_t n;
    if (kvt_json_string(&d->j, dst, d->bump_end - d->bump, &n) != KVT_OK) {
        if (kvt_json_status(&d->j) == KVT_ERR_TOO_BIG)
            return kvt_evj_fail(d, KVT_ERR_INTERNAL, "event arena exhausted");
        return kvt_evj_ev_json_fail(d, "medium");
    }
    ev->tier = kvt_ev_medium_tier(dst, n);
    if (ev->tier != 0)
        return KVT_OK;
    ev->skip = KVT_EV_SKIP_MEDIUM;
    n = kvt_ev_medium_name_len(dst, n);
    if (n == 0)
        dst[n++] = '?'; /* the decoded "" left its NUL there: room for one byte */
    d->bump += n;
    ev->medium = dst;
    ev->medium_len = (uint32_t)n;
    return KVT_OK;
}

/* "locality": null or a string; "REMOTE" (any case) marks the event skipped. */
static kvt_status_t kvt_evj_locality(kvt_evj_t *d, kvt_event_t *ev)
{
    char name[8];
    size_t n;
    bool null;
    kvt_status_t st = kvt_evj_opt_null(d, "locality", &null);
    if (st != KVT_OK || null)
        return st;
    if (kvt_json_peek(&d->j) != KVT_JSON_STRING) {
        if (kvt_json_status(&d->j) != KVT_OK)
            return kvt_evj_ev_json_fail(d, "locality");
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "field 'locality' must be a string or null");
    }
    kvt_json_mark_t save;
    kvt_json_mark(&d->j, &save);
    if (kvt_json_string(&d->j, name, sizeof(name), &n) != KVT_OK) {
        if (kvt_json_status(&d->j) != KVT_ERR_TOO_BIG)
            return kvt_evj_ev_json_fail(d, "locality");
        kvt_json_rewind(&d->j, &save); /* longer than "REMOTE": some other locality */
        return kvt_json_skip(&d->j) == KVT_OK ? KVT_OK : kvt_evj_ev_json_fail(d, "locality");
    }
    if (n == 6 && strncasecmp(name, "REMOTE", 6) == 0 && ev->skip == KVT_EV_SKIP_NONE)
        ev->skip = KVT_EV_SKIP_REMOTE;
    return KVT_OK;
}

/* "kv_cache_spec_kind": null or a string, classified by kvt_ev_group_kind(). */
static kvt_status_t kvt_evj_kind(kvt_evj_t *d, kvt_event_t *ev)
{
    char name[40];
    size_t n;
    bool null;
    kvt_status_t st = kvt_evj_opt_null(d, "kv_cache_spec_kind", &null);
    if (st != KVT_OK || null)
        return st;
    if (kvt_json_peek(&d->j) != KVT_JSON_STRING) {
        if (kvt_json_status(&d->j) != KVT_OK)
            return kvt_evj_ev_json_fail(d, "kv_cache_spec_kind");
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL,
                               "field 'kv_cache_spec_kind' must be a string or null");
    }
    kvt_json_mark_t save;
    kvt_json_mark(&d->j, &save);
    if (kvt_json_string(&d->j, name, sizeof(name), &n) != KVT_OK) {
        if (kvt_json_status(&d->j) != KVT_ERR_TOO_BIG)
            return kvt_evj_ev_json_fail(d, "kv_cache_spec_kind");
        kvt_json_rewind(&d->j, &save); /* longer than any kind kvtier knows */
        return kvt_json_skip(&d->j) == KVT_OK ? KVT_OK
                                              : kvt_evj_ev_json_fail(d, "kv_cache_spec_kind");
    }
    ev->group_kind = kvt_ev_group_kind(name, n);
    return KVT_OK;
}

/* Checks the decoded fields of a known event against its type. */
static kvt_status_t kvt_evj_finish(kvt_evj_t *d, int type, unsigned seen, kvt_event_t *ev)
{
    ev->type = (kvt_ev_type_t)type;
    if ((type == KVT_EV_STORED || type == KVT_EV_REMOVED) && !(seen & KVT_EVJ_F_HASHES))
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "missing field 'block_hashes'");
    if (type != KVT_EV_STORED)
        return KVT_OK;
    if (ev->nhashes == 0)
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "block_hashes is empty");
    if (ev->ntokens == 0)
        return KVT_OK;
    if (seen & KVT_EVJ_F_BLOCK_SIZE) {
        uint64_t want = (uint64_t)ev->block_size * ev->nhashes;
        if (want != ev->ntokens)
            return kvt_evj_ev_fail(d, KVT_ERR_INVAL,
                                   "token_ids has %u entries, want %llu (block_size %u x %u "
                                   "block_hashes)",
                                   ev->ntokens, (unsigned long long)want, ev->block_size,
                                   ev->nhashes);
    } else {
        if (ev->ntokens % ev->nhashes != 0)
            return kvt_evj_ev_fail(d, KVT_ERR_INVAL,
                                   "token_ids has %u entries, not a multiple of the %u "
                                   "block_hashes",
                                   ev->ntokens, ev->nhashes);
        ev->block_size = ev->ntokens / ev->nhashes;
    }
    return KVT_OK;
}

/*
 * Parses the event object that is due (the caller checked it is an object)
 * into *ev. @given is its type when already known (second pass), else
 * KVT_EVJ_T_UNSEEN. Sets *type_p to the type as far as it was known when it
 * returned (also on error), and *consumed_p to false for an event that is
 * skipped (unknown type).
 */
static kvt_status_t kvt_evj_event(kvt_evj_t *d, int given, kvt_event_t *ev, kvt_evj_extra_t *xs,
                                  int *type_p, bool *consumed_p)
{
    int type = given;
    unsigned seen = 0, unknown = 0;
    const char *key;
    size_t klen;
    int r;
    kvt_status_t st;

    size_t extra_from = 0, extra_to = 0; /* the text of "extra_keys", read at the end */
    bool has_lora_id = false;
    uint64_t lora_id = 0;
    *type_p = type;
    memset(ev, 0, sizeof(*ev));
    ev->tier = KVT_TIER_GPU;
    ev->group = -1;
    kvt_json_object_begin(&d->j);
    while ((r = kvt_json_object_next(&d->j, &key, &klen)) == 1) {
        unsigned f = kvt_evj_field(key, klen);
        bool wanted = f != 0 && f != KVT_EVJ_F_IGNORED &&
                      (f == KVT_EVJ_F_TYPE || type == KVT_EVJ_T_UNSEEN ||
                       (kvt_evj_type_fields(type) & f) != 0);
        if (!wanted) {
            /* Unknown, ignored, or not a field of this type. */
            if (f != KVT_EVJ_F_IGNORED)
                unknown++;
            if (kvt_evj_key_is(key, klen, "lora_id") && kvt_json_peek(&d->j) == KVT_JSON_NUMBER) {
                kvt_json_mark_t m; /* an id may lead extra_keys (older vLLM), as a name does */
                kvt_json_mark(&d->j, &m);
                if (kvt_json_u64(&d->j, &lora_id) == KVT_OK) {
                    has_lora_id = true;
                    continue;
                }
                kvt_json_rewind(&d->j, &m);
            }
            if (kvt_json_skip(&d->j) != KVT_OK)
                return kvt_evj_ev_json_fail(d, NULL);
            continue;
        }
        seen |= f; /* each field has one key, and the reader refuses a key given twice */
        switch (f) {
        case KVT_EVJ_F_TYPE:
            st = kvt_evj_type(d, &type);
            if (st != KVT_OK)
                return st;
            *type_p = type;
            if (type == KVT_EVJ_T_UNKNOWN) {
                /* The rest may follow another schema: skip it unread. */
                while ((r = kvt_json_object_next(&d->j, NULL, NULL)) == 1)
                    if (kvt_json_skip(&d->j) != KVT_OK)
                        return kvt_evj_ev_json_fail(d, NULL);
                if (r < 0)
                    return kvt_evj_ev_json_fail(d, NULL);
                *consumed_p = false;
                return KVT_OK;
            }
            break;
        case KVT_EVJ_F_HASHES: {
            bool by_limit;
            size_t cap = kvt_evj_item_cap(d, kvt_evj_align(d, 8), &by_limit), n;
            uint64_t *out = (uint64_t *)(void *)(d->arena + d->bump);
            if (kvt_json_hash_array(&d->j, out, cap, &n) != KVT_OK) {
                /* A flat array this shallow is TOO_BIG only for its cap. */
                if (kvt_json_status(&d->j) == KVT_ERR_TOO_BIG)
                    return kvt_evj_too_many(d, "block_hashes", by_limit);
                return kvt_evj_ev_json_fail(d, "block_hashes");
            }
            if (n > UINT32_MAX)
                return kvt_evj_ev_fail(d, KVT_ERR_TOO_BIG, "too many block_hashes");
            d->bump += n * sizeof(uint64_t);
            d->items += n;
            ev->nhashes = (uint32_t)n;
            ev->hashes = n > 0 ? out : NULL;
            break;
        }
        case KVT_EVJ_F_TOKENS: {
            bool by_limit, null;
            if ((st = kvt_evj_opt_null(d, "token_ids", &null)) != KVT_OK)
                return st;
            if (null)
                break; /* as if absent: a placeholder without tokens */
            size_t cap = kvt_evj_item_cap(d, kvt_evj_align(d, 4), &by_limit), n;
            uint32_t *out = (uint32_t *)(void *)(d->arena + d->bump);
            if (kvt_json_u32_array(&d->j, out, cap, UINT32_MAX, &n) != KVT_OK) {
                if (kvt_json_status(&d->j) == KVT_ERR_TOO_BIG)
                    return kvt_evj_too_many(d, "token_ids", by_limit);
                return kvt_evj_ev_json_fail(d, "token_ids");
            }
            if (n > UINT32_MAX)
                return kvt_evj_ev_fail(d, KVT_ERR_TOO_BIG, "too many token_ids");
            d->bump += n * sizeof(uint32_t);
            d->items += n;
            ev->ntokens = (uint32_t)n;
            ev->tokens = n > 0 ? out : NULL;
            break;
        }
        case KVT_EVJ_F_PARENT: {
            bool null;
            if ((st = kvt_evj_opt_null(d, "parent_block_hash", &null)) != KVT_OK)
                return st;
            if (!null) {
                if (kvt_json_hash(&d->j, &ev->parent) != KVT_OK)
                    return kvt_evj_ev_json_fail(d, "parent_block_hash");
                ev->has_parent = true;
            }
            break;
        }
        case KVT_EVJ_F_BLOCK_SIZE: {
            bool null;
            if ((st = kvt_evj_opt_null(d, "block_size", &null)) != KVT_OK)
                return st;
            if (!null && kvt_json_u32(&d->j, &ev->block_size) != KVT_OK)
                return kvt_evj_ev_json_fail(d, "block_size");
            break;
        }
        case KVT_EVJ_F_MEDIUM:
            st = kvt_evj_medium(d, ev);
            if (st != KVT_OK)
                return st;
            break;
        case KVT_EVJ_F_LOCALITY:
            if ((st = kvt_evj_locality(d, ev)) != KVT_OK)
                return st;
            break;
        case KVT_EVJ_F_KIND:
            if ((st = kvt_evj_kind(d, ev)) != KVT_OK)
                return st;
            break;
        case KVT_EVJ_F_GROUP: {
            bool null;
            uint32_t g;
            if ((st = kvt_evj_opt_null(d, "group_idx", &null)) != KVT_OK)
                return st;
            if (!null) {
                if (kvt_json_u32(&d->j, &g) != KVT_OK)
                    return kvt_evj_ev_json_fail(d, "group_idx");
                ev->group = g;
            }
            break;
        }
        case KVT_EVJ_F_EXTRA: {
            bool null;
            if ((st = kvt_evj_opt_null(d, "extra_keys", &null)) != KVT_OK)
                return st;
            if (!null) {
                extra_from = kvt_json_offset(&d->j);
                if (kvt_json_skip(&d->j) != KVT_OK)
                    return kvt_evj_ev_json_fail(d, "extra_keys");
                extra_to = kvt_json_offset(&d->j);
            }
            break;
        }
        case KVT_EVJ_F_LORA: {
            bool null;
            if ((st = kvt_evj_opt_null(d, "lora_name", &null)) != KVT_OK)
                return st;
            if (null)
                ev->lora_name = NULL;
            else if ((st = kvt_evj_name(d, "lora_name", true, true, &ev->lora_name)) != KVT_OK)
                return st;
            break;
        }
        case KVT_EVJ_F_SALT: {
            bool null;
            const char *salt = NULL;
            if ((st = kvt_evj_opt_null(d, "cache_salt", &null)) != KVT_OK)
                return st;
            if (!null && (st = kvt_evj_name(d, "cache_salt", true, true, &salt)) != KVT_OK)
                return st;
            if (salt != NULL && salt[0] != '\0') { /* "" is no salt, as in vLLM */
                ev->cache_salt = salt;
                ev->cache_salt_len = (uint32_t)strlen(salt);
            }
            break;
        }
        default: return kvt_evj_ev_fail(d, KVT_ERR_INTERNAL, "unhandled field '%s'", key);
        }
    }
    if (r < 0)
        return kvt_evj_ev_json_fail(d, NULL);
    if (type == KVT_EVJ_T_UNSEEN)
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "missing field 'type'");

    /* Fields read before the type was known that this type does not use: unknown. */
    unsigned extra = seen & ~(kvt_evj_type_fields(type) | KVT_EVJ_F_TYPE);
    if (extra != 0) {
        for (unsigned f = extra; f != 0; f &= f - 1)
            unknown++;
        kvt_event_t clean;
        memset(&clean, 0, sizeof(clean));
        clean.tier = KVT_TIER_GPU;
        clean.group = -1;
        if (!(extra & KVT_EVJ_F_HASHES)) {
            clean.nhashes = ev->nhashes;
            clean.hashes = ev->hashes;
        }
        if (!(extra & KVT_EVJ_F_MEDIUM)) {
            clean.tier = ev->tier;
            clean.medium = ev->medium;
            clean.medium_len = ev->medium_len;
            if (ev->skip == KVT_EV_SKIP_MEDIUM)
                clean.skip = KVT_EV_SKIP_MEDIUM;
        }
        if (!(extra & KVT_EVJ_F_LOCALITY) && ev->skip == KVT_EV_SKIP_REMOTE)
            clean.skip = KVT_EV_SKIP_REMOTE;
        if (!(extra & KVT_EVJ_F_GROUP))
            clean.group = ev->group;
        /* A type without them (BlockRemoved, AllBlocksCleared) keeps nothing else. */
        *ev = clean;
    }
    st = kvt_evj_finish(d, type, seen & ~extra, ev);
    if (st != KVT_OK)
        return st;
    *xs = (kvt_evj_extra_t){.idx = d->idx};
    if (type == KVT_EV_STORED && extra_to > extra_from && ev->skip == KVT_EV_SKIP_NONE)
        *xs =
            (kvt_evj_extra_t){extra_from, extra_to, d->idx, has_lora_id, lora_id}; /* read by
                                                                                    kvt_evj_top() */
    d->unknown += unknown;
    *consumed_p = true;
    return KVT_OK;
}

/*
 * Scans the event object that is due for its "type" alone (a second look
 * after a field error). Sets *type_p; fails on a syntax error and on a
 * missing or non-string type.
 */
static kvt_status_t kvt_evj_find_type(kvt_evj_t *d, int *type_p)
{
    const char *key;
    size_t klen;
    int r, type = KVT_EVJ_T_UNSEEN;

    kvt_json_object_begin(&d->j);
    while ((r = kvt_json_object_next(&d->j, &key, &klen)) == 1) {
        if (kvt_evj_key_is(key, klen, "type")) {
            kvt_status_t st = kvt_evj_type(d, &type);
            if (st != KVT_OK)
                return st;
        } else if (kvt_json_skip(&d->j) != KVT_OK) {
            return kvt_evj_ev_json_fail(d, NULL);
        }
    }
    if (r < 0)
        return kvt_evj_ev_json_fail(d, NULL);
    if (type == KVT_EVJ_T_UNSEEN)
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "missing field 'type'");
    *type_p = type;
    return KVT_OK;
}

/* Decodes one element of "events" and appends it, or counts it as unknown. */
static kvt_status_t kvt_evj_one(kvt_evj_t *d)
{
    if (kvt_json_peek(&d->j) != KVT_JSON_OBJECT) {
        if (kvt_json_status(&d->j) != KVT_OK)
            return kvt_evj_ev_json_fail(d, NULL);
        return kvt_evj_ev_fail(d, KVT_ERR_INVAL, "an event must be an object");
    }
    kvt_json_mark_t save;
    kvt_json_mark(&d->j, &save);
    const size_t bump0 = d->bump, items0 = d->items;
    kvt_event_t ev;
    kvt_evj_extra_t xs = {.idx = d->idx};
    int type;
    bool consumed = false;

    kvt_status_t st = kvt_evj_event(d, KVT_EVJ_T_UNSEEN, &ev, &xs, &type, &consumed);
    if (st != KVT_OK && type == KVT_EVJ_T_UNSEEN && kvt_json_status(&d->j) != KVT_ERR_PARSE) {
        /* A field failed before the type was known: does the type care? A syntax
         * error is fatal whatever the type, so it skips this. */
        kvt_json_rewind(&d->j, &save);
        st = kvt_evj_find_type(d, &type);
        if (st != KVT_OK)
            return st;
        if (type == KVT_EVJ_T_UNKNOWN) {
            consumed = false;
        } else {
            kvt_json_rewind(&d->j, &save);
            d->bump = bump0;
            d->items = items0;
            st = kvt_evj_event(d, type, &ev, &xs, &type, &consumed);
        }
    }
    if (st != KVT_OK)
        return st;
    if (!consumed) {
        d->bump = bump0; /* give back what the unknown event's fields took */
        d->items = items0;
        d->unknown++;
        return KVT_OK;
    }
    if (d->nev >= d->ev_cap)
        return kvt_evj_ev_fail(d, KVT_ERR_INTERNAL, "event arena exhausted");
    d->extra[d->nev] = xs;
    d->ev[d->nev++] = ev;
    return KVT_OK;
}

static kvt_status_t kvt_evj_events(kvt_evj_t *d)
{
    if (kvt_json_peek(&d->j) != KVT_JSON_ARRAY) {
        if (kvt_json_status(&d->j) != KVT_OK)
            return kvt_evj_json_fail(d, "field 'events'");
        return kvt_evj_fail(d, KVT_ERR_INVAL, "field 'events' must be an array");
    }
    kvt_json_array_begin(&d->j);
    int r;
    for (d->idx = 0; (r = kvt_json_array_next(&d->j)) == 1; d->idx++) {
        kvt_status_t st = kvt_evj_one(d);
        if (st != KVT_OK)
            return st;
    }
    if (r < 0)
        return kvt_evj_json_fail(d, "field 'events'");
    return KVT_OK;
}

/* ---- the batch ------------------------------------------------------------------------ */

/* Top-level fields (bits), to catch missing ones (the reader refuses duplicate keys). */
enum {
    KVT_EVJ_TOP_POD = 1u << 0,
    KVT_EVJ_TOP_MODEL = 1u << 1,
    KVT_EVJ_TOP_LORA = 1u << 2,
    KVT_EVJ_TOP_DP_RANK = 1u << 3,
    KVT_EVJ_TOP_EVENTS = 1u << 4,
};

static kvt_status_t kvt_evj_top(kvt_evj_t *d, kvt_evbatch_t *out)
{
    static const struct {
        const char *name;
        unsigned bit;
    } fields[] = {
        {"pod", KVT_EVJ_TOP_POD},        {"model", KVT_EVJ_TOP_MODEL},
        {"lora_name", KVT_EVJ_TOP_LORA}, {"dp_rank", KVT_EVJ_TOP_DP_RANK},
        {"events", KVT_EVJ_TOP_EVENTS},
    };
    unsigned seen = 0;
    const char *key;
    size_t klen;
    int r;
    kvt_status_t st;

    if (kvt_json_peek(&d->j) != KVT_JSON_OBJECT) {
        if (kvt_json_status(&d->j) != KVT_OK)
            return kvt_evj_json_fail(d, NULL);
        return kvt_evj_fail(d, KVT_ERR_INVAL, "the body must be a JSON object");
    }
    kvt_json_object_begin(&d->j);
    while ((r = kvt_json_object_next(&d->j, &key, &klen)) == 1) {
        unsigned f = 0;
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            if (kvt_evj_key_is(key, klen, fields[i].name))
                f = fields[i].bit;
        if (f == 0) {
            char shown[48];
            kvt_evj_printable(key, klen, shown, sizeof(shown));
            return kvt_evj_fail(d, KVT_ERR_INVAL, "unknown field '%s'", shown);
        }
        seen |= f;
        switch (f) {
        case KVT_EVJ_TOP_POD: st = kvt_evj_name(d, "pod", false, false, &out->pod); break;
        case KVT_EVJ_TOP_MODEL: st = kvt_evj_name(d, "model", false, true, &out->model); break;
        case KVT_EVJ_TOP_LORA:
            if (kvt_json_peek(&d->j) == KVT_JSON_NULL) {
                st = kvt_json_null(&d->j) == KVT_OK ? KVT_OK
                                                    : kvt_evj_json_fail(d, "field 'lora_name'");
                out->lora = NULL;
            } else {
                st = kvt_evj_name(d, "lora_name", false, true, &out->lora);
            }
            break;
        case KVT_EVJ_TOP_DP_RANK:
            st = kvt_json_u32(&d->j, &out->dp_rank) == KVT_OK
                     ? KVT_OK
                     : kvt_evj_json_fail(d, "field 'dp_rank'");
            if (st == KVT_OK && out->dp_rank > KVT_EV_MAX_DP_RANK)
                st = kvt_evj_fail(d, KVT_ERR_INVAL, "field 'dp_rank': want 0..%u",
                                  KVT_EV_MAX_DP_RANK);
            break;
        default: st = kvt_evj_events(d); break;
        }
        if (st != KVT_OK)
            return st;
    }
    if (r < 0)
        return kvt_evj_json_fail(d, NULL);
    if (kvt_json_end(&d->j) != KVT_OK)
        return kvt_evj_json_fail(d, NULL);
    if (!(seen & KVT_EVJ_TOP_POD))
        return kvt_evj_fail(d, KVT_ERR_INVAL, "missing field 'pod'");
    if (!(seen & KVT_EVJ_TOP_EVENTS))
        return kvt_evj_fail(d, KVT_ERR_INVAL, "missing field 'events'");
    if (!(seen & KVT_EVJ_TOP_MODEL)) {
        char *empty = d->arena + d->bump;
        if (d->bump >= d->bump_end)
            return kvt_evj_fail(d, KVT_ERR_INTERNAL, "event arena exhausted");
        *empty = '\0';
        d->bump++;
        out->model = empty;
    }
    if (out->model[0] == '\0') {
        for (size_t i = 0; i < d->nev; i++)
            if (d->ev[i].type == KVT_EV_STORED)
                return kvt_evj_fail(d, KVT_ERR_INVAL, "%s field 'model' (events[] has BlockStored)",
                                    (seen & KVT_EVJ_TOP_MODEL) ? "empty" : "missing");
    }
    for (size_t i = 0; i < d->nev; i++)
        if (d->extra[i].to > d->extra[i].from &&
            (st = kvt_evj_extras(d, &d->extra[i], &d->ev[i], out->lora)) != KVT_OK)
            return st;
    return KVT_OK;
}

kvt_status_t kvt_ev_json_decode(const char *body, size_t len, size_t max_items, kvt_evbatch_t *b,
                                char *err, size_t errlen)
{
    kvt_evj_t d;
    kvt_evbatch_t out;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (b == NULL || (body == NULL && len > 0)) {
        kvt_errf(err, errlen, "kvt_ev_json_decode: NULL argument");
        return KVT_ERR_INVAL;
    }
    /* The arena is about 8x the body; refuse what could overflow its size. */
    if (len > (SIZE_MAX - 4096) / 16) {
        kvt_errf(err, errlen, "body of %zu bytes is too large", len);
        return KVT_ERR_TOO_BIG;
    }
    memset(&d, 0, sizeof(d));
    d.ev_cap = len / KVT_EVJ_MIN_EVENT_BYTES + 1;
    size_t ev_bytes = d.ev_cap * (sizeof(kvt_event_t) + sizeof(kvt_evj_extra_t));
    ev_bytes = (ev_bytes + 7) & ~(size_t)7;
    d.bump = ev_bytes;
    d.bump_end = ev_bytes + 5 * len + 64;
    d.arena = malloc(d.bump_end);
    if (d.arena == NULL) {
        kvt_errf(err, errlen, "out of memory for a %zu-byte body", len);
        return KVT_ERR_NO_MEM;
    }
    d.ev = (kvt_event_t *)(void *)d.arena;
    d.extra = (kvt_evj_extra_t *)(void *)(d.arena + d.ev_cap * sizeof(kvt_event_t));
    d.max_items = max_items;
    d.err = err;
    d.errlen = errlen;
    memset(&out, 0, sizeof(out));
    kvt_json_init(&d.j, body, len);

    kvt_status_t st = kvt_evj_top(&d, &out);
    if (st != KVT_OK) {
        if (err != NULL && errlen > 0 && err[0] == '\0')
            kvt_errf(err, errlen, "%s", kvt_status_str(st));
        free(d.arena);
        return st;
    }
    out.ev = d.nev > 0 ? d.ev : NULL;
    out.nev = d.nev;
    out.unknown = d.unknown;
    out.arena = d.arena;
    *b = out;
    return KVT_OK;
}
