/*
 * kvindex/event_msgpack.c: one ZMQ KV-event payload of vLLM or SGLang
 * (msgpack) -> kvt_evbatch_t. Formats: ../shared/WIRE-FORMATS.md.
 *
 * Three steps:
 *  1. mp_check() walks the raw bytes once: one complete value, no reserved
 *     byte, nothing after it, and no array or map that claims more elements
 *     than bytes remain. msgpack-c allocates a container's elements when it
 *     reads the header, so without this check a 5-byte header could make it
 *     ask for ~100 GB; with it the zone stays within a few times the payload.
 *  2. msgpack-c unpacks into a zone. Each event is classified (its type,
 *     which object holds which field) and the arena is sized exactly.
 *  3. One malloc holds the events and their arrays; values are converted
 *     with their type checks.
 * A value that fails a check in steps 2 or 3 spoils only its own event,
 * which becomes KVT_EV_BAD: engines' batches mix many requests' events, and
 * one bad event must not cost the others. Only a payload that is not a
 * batch at all (or over the item limit) fails as a whole.
 */
#include "kvindex/event.h"

#include "common/bytes.h"
#include "common/errtext.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kvindex/event_keys_int.h"

/* ---- 1. the raw bytes --------------------------------------------------------------------- */

/*
 * Bytes of a value that starts with byte c and has a fixed size (ints,
 * floats, nil, booleans, fixext); 0 for the others. Token ids are most of a
 * batch, so mp_check() skips these in a tight loop.
 */
static const uint8_t mp_fixed[256] = {
    [0x00 ... 0x7f] = 1, [0xc0] = 1,  [0xc2 ... 0xc3] = 1, [0xca] = 5,          [0xcb] = 9,
    [0xcc] = 2,          [0xcd] = 3,  [0xce] = 5,          [0xcf] = 9,          [0xd0] = 2,
    [0xd1] = 3,          [0xd2] = 5,  [0xd3] = 9,          [0xd4] = 3,          [0xd5] = 4,
    [0xd6] = 6,          [0xd7] = 10, [0xd8] = 18,         [0xe0 ... 0xff] = 1,
};

/*
 * What follows type byte @c: *len_bytes_p bytes of length (0: none), then
 * *fixed_p bytes of payload (plus the length's value times *per_len_p bytes,
 * for str, bin and ext), or *children_p values (plus the length's value times
 * *per_len_p values, for arrays and maps). Fixed-size types come from
 * mp_fixed. Returns false for 0xc1 (reserved).
 */
static bool mp_shape(uint8_t c, unsigned *len_bytes_p, uint64_t *fixed_p, unsigned *per_len_p,
                     bool *container_p, uint64_t *children_p)
{
    *len_bytes_p = 0;
    *fixed_p = 0;
    *per_len_p = 0;
    *container_p = false;
    *children_p = 0;
    if (mp_fixed[c] != 0) {
        *fixed_p = mp_fixed[c] - 1u;
        return true;
    }
    if (c <= 0x8f) {
        *container_p = true;
        *children_p = 2u * (c & 0x0fu);
        return true;
    }
    if (c <= 0x9f) {
        *container_p = true;
        *children_p = c & 0x0fu;
        return true;
    }
    if (c <= 0xbf) {
        *fixed_p = c & 0x1fu;
        return true;
    }
    static const unsigned pow2[4] = {1, 2, 4, 8};
    switch (c) {
    case 0xc4:
    case 0xc5:
    case 0xc6: /* bin 8/16/32 */
        *len_bytes_p = pow2[c - 0xc4];
        *per_len_p = 1;
        return true;
    case 0xc7:
    case 0xc8:
    case 0xc9: /* ext 8/16/32: the type byte, then the data */
        *len_bytes_p = pow2[c - 0xc7];
        *per_len_p = 1;
        *fixed_p = 1;
        return true;
    case 0xd9:
    case 0xda:
    case 0xdb: /* str 8/16/32 */
        *len_bytes_p = pow2[c - 0xd9];
        *per_len_p = 1;
        return true;
    case 0xdc:
    case 0xdd: /* array 16/32 */
        *len_bytes_p = c == 0xdc ? 2 : 4;
        *per_len_p = 1;
        *container_p = true;
        return true;
    case 0xde:
    case 0xdf: /* map 16/32 */
        *len_bytes_p = c == 0xde ? 2 : 4;
        *per_len_p = 2;
        *container_p = true;
        return true;
    default: return false; /* 0xc1, the one byte msgpack never uses */
    }
}

/* Containers nested deeper than this are refused (msgpack-c's own stack holds 32). */
#define MP_MAX_DEPTH 24

/* Refuses the value at byte @at of mp_check()'s input: KVT_ERR_PARSE with the reason. */
#define MP_CHECK_FAIL(at, why)                                                                     \
    (kvt_errf(err, errlen, "msgpack, offset %zu: %s", (at), (why)), KVT_ERR_PARSE)

/* Checks that @buf[@len] is exactly one msgpack value; else KVT_ERR_PARSE with the reason and
 * offset in @err (@errlen bytes). */
static kvt_status_t mp_check(const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    uint64_t left[MP_MAX_DEPTH]; /* values still due in each open container */
    int depth = 0;
    uint64_t pending = 1; /* values still due in all */
    size_t off = 0;
    while (pending > 0) {
        if (depth > 0) {
            /* the innermost container's fixed-size elements, without the general path */
            uint64_t l = left[depth - 1];
            while (l > 0 && off < len) {
                unsigned sz = mp_fixed[buf[off]];
                if (sz == 0 || sz > len - off)
                    break; /* the general path reads (or refuses) it */
                off += sz;
                l--;
                pending--;
            }
            left[depth - 1] = l;
            if (l == 0) {
                depth--; /* closed: its parent may be closed too */
                continue;
            }
        }
        size_t at = off; /* where the value starts: what a refusal names */
        if (off >= len)
            return MP_CHECK_FAIL(at, "truncated");
        uint8_t c = buf[off++];
        pending--;
        if (depth > 0)
            left[depth - 1]--;
        unsigned len_bytes, per_len;
        uint64_t fixed, children;
        bool container;
        if (!mp_shape(c, &len_bytes, &fixed, &per_len, &container, &children))
            return MP_CHECK_FAIL(at, "reserved byte 0xc1");
        uint64_t n = 0;
        if (len_bytes > 0) {
            if (len - off < len_bytes)
                return MP_CHECK_FAIL(at, "truncated");
            n = kvt_load_be(buf + off, len_bytes);
            off += len_bytes;
        }
        if (container) {
            uint64_t kids = children + n * per_len;
            pending += kids;
            if (pending > len - off)
                return MP_CHECK_FAIL(at, "an array or map claims more elements than bytes remain");
            if (kids > 0) {
                if (depth == MP_MAX_DEPTH)
                    return MP_CHECK_FAIL(at, "nested deeper than 24 arrays and maps");
                left[depth++] = kids;
            }
        } else {
            uint64_t skip = fixed + n * per_len;
            if (skip > len - off)
                return MP_CHECK_FAIL(at, "truncated");
            off += (size_t)skip;
        }
    }
    if (off != len)
        return MP_CHECK_FAIL(off, "trailing bytes after the batch");
    return KVT_OK;
}

/* ---- 2. classify ---------------------------------------------------------------------------- */

/* Fields kvtier reads. MPF_IGNORED: known to the engines, not used here; MPF_UNKNOWN: counted. */
enum {
    MPF_HASHES,
    MPF_PARENT,
    MPF_TOKENS,
    MPF_BLOCK_SIZE,
    MPF_LORA_ID,
    MPF_MEDIUM,
    MPF_LORA,
    MPF_EXTRA,
    MPF_GROUP,
    MPF_KIND,
    MPF_LOCALITY,
    MPF_META,
    MPF_N,
    MPF_IGNORED = MPF_N,
    MPF_UNKNOWN,
};

static const char *const mpf_name[MPF_N] = {
    "block_hashes", "parent_block_hash", "token_ids", "block_size",         "lora_id",  "medium",
    "lora_name",    "extra_keys",        "group_idx", "kv_cache_spec_kind", "locality", "metadata"};

/*
 * BlockStored's positional slots after the type tag (vLLM's order; the two
 * MPF_IGNORED are kv_cache_spec_sliding_window and ownership). Indexes here
 * start after the tag: [6] is what docs/api.md calls slot 7 (the tag is slot
 * 0), where SGLang's BlockStoredWithMetadata puts its metadata map.
 */
static const uint8_t mp_stored_pos[] = {
    MPF_HASHES, MPF_PARENT, MPF_TOKENS, MPF_BLOCK_SIZE, MPF_LORA_ID,  MPF_MEDIUM, MPF_LORA,
    MPF_EXTRA,  MPF_GROUP,  MPF_KIND,   MPF_IGNORED,    MPF_LOCALITY, MPF_IGNORED};
/* BlockRemoved's. */
static const uint8_t mp_removed_pos[] = {MPF_HASHES, MPF_MEDIUM, MPF_GROUP, MPF_LOCALITY,
                                         MPF_IGNORED /* ownership */};

/* Map keys, and what they are in a BlockStored and in a BlockRemoved. */
static const struct {
    const char *name;
    uint8_t stored, removed;
} mp_keys[] = {
    {"block_hashes", MPF_HASHES, MPF_HASHES},
    {"parent_block_hash", MPF_PARENT, MPF_UNKNOWN},
    {"token_ids", MPF_TOKENS, MPF_UNKNOWN},
    {"block_size", MPF_BLOCK_SIZE, MPF_UNKNOWN},
    {"lora_id", MPF_LORA_ID, MPF_UNKNOWN},
    {"medium", MPF_MEDIUM, MPF_MEDIUM},
    {"lora_name", MPF_LORA, MPF_UNKNOWN},
    {"extra_keys", MPF_EXTRA, MPF_UNKNOWN},
    {"group_idx", MPF_GROUP, MPF_GROUP},
    {"kv_cache_spec_kind", MPF_KIND, MPF_UNKNOWN},
    {"kv_cache_spec_sliding_window", MPF_IGNORED, MPF_UNKNOWN},
    {"locality", MPF_LOCALITY, MPF_LOCALITY},
    {"ownership", MPF_IGNORED, MPF_IGNORED},
    {"event_version", MPF_IGNORED, MPF_IGNORED},
    {"metadata", MPF_META, MPF_UNKNOWN},
};
#define MP_NKEYS (sizeof(mp_keys) / sizeof(mp_keys[0]))

/*
 * An event as classified: its type and the objects of its fields (NULL:
 * absent or nil), or why it is bad. What the convert step needs from the
 * extra keys and the metadata is worked out here, so the arena can be sized.
 */
typedef struct mp_ev {
    kvt_ev_type_t type; /* KVT_EV_BAD when it did not decode */
    uint32_t idx;       /* in the batch's events, for messages */
    unsigned tier;
    uint8_t skip;
    bool may_remove;
    const msgpack_object *f[MPF_N];
    const msgpack_object *salt; /* str: the cache salt (metadata, or block 0's extra keys) */
    bool extras;                /* some block has extra keys besides the LoRA name and the salt */
    bool meta_lenient;          /* vLLM format, a map past the last slot: a bad salt is unknown */
} mp_ev_t;

typedef struct mp_dec {
    kvt_ev_format_t fmt;
    size_t max_items;
    size_t items;   /* hashes and tokens so far */
    size_t unknown; /* skipped events and fields */
    size_t idx;     /* event being decoded, for messages */
    char *err;
    size_t errlen;
} mp_dec_t;

/* Writes a reason to the decoder's error buffer and is @st. Error path only. */
#define MP_FAIL(d, st, ...) (kvt_errf((d)->err, (d)->errlen, __VA_ARGS__), (st))

/*
 * Marks event @e bad: it is skipped, and the batch decodes on. The first
 * reason is kept in d->err (the caller logs it). Returns KVT_OK, so the
 * event's own checks can `return mp_bad(...)`.
 */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static kvt_status_t
mp_bad(mp_dec_t *d, mp_ev_t *e, const char *fmt, ...)
{
    e->may_remove = e->type != KVT_EV_STORED; /* unknown, removed or cleared */
    e->type = KVT_EV_BAD;
    e->skip = KVT_EV_SKIP_NONE;
    if (d->err == NULL || d->errlen == 0 || d->err[0] != '\0')
        return KVT_OK;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    kvt_verrf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvt_errf(d->err, d->errlen, "events[%u]: %s", e->idx, msg);
    return KVT_OK;
}

static bool mp_str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

/* The event type named by @o (a str), or 0 for a name kvtier does not know. */
static kvt_ev_type_t mp_type(const msgpack_object *o)
{
    if (mp_str_is(o, "BlockStored"))
        return KVT_EV_STORED;
    if (mp_str_is(o, "BlockRemoved"))
        return KVT_EV_REMOVED;
    if (mp_str_is(o, "AllBlocksCleared"))
        return KVT_EV_CLEARED;
    return 0;
}

/* A map key's field for an event of type @t. */
static unsigned mp_map_field(kvt_ev_type_t t, const msgpack_object *key)
{
    if (t == KVT_EV_CLEARED)
        return MPF_UNKNOWN;
    for (size_t i = 0; i < MP_NKEYS; i++)
        if (mp_str_is(key, mp_keys[i].name))
            return t == KVT_EV_STORED ? mp_keys[i].stored : mp_keys[i].removed;
    return MPF_UNKNOWN;
}

/* Field of slot @i (after the type tag) of an array event of type @t holding @v. */
static unsigned mp_pos_field(const mp_dec_t *d, kvt_ev_type_t t, uint32_t i,
                             const msgpack_object *v)
{
    bool map = v->type == MSGPACK_OBJECT_MAP;
    if (t == KVT_EV_STORED) {
        /* SGLang's BlockStoredWithMetadata: the metadata map follows the fields it has (slot
         * 7, or past vLLM's last in its vLLM-aligned layout, where kvtierd's publisher puts a
         * cache salt too: read there in either format) */
        if (map && ((d->fmt == KVT_EV_FMT_SGLANG && i == 6) || i >= sizeof(mp_stored_pos)))
            return MPF_META;
        return i < sizeof(mp_stored_pos) ? mp_stored_pos[i] : MPF_UNKNOWN;
    }
    if (t == KVT_EV_REMOVED)
        return i < sizeof(mp_removed_pos) ? mp_removed_pos[i] : MPF_UNKNOWN;
    return MPF_UNKNOWN;
}

/* Sets field @f of @e to @v (nil: absent). */
static void mp_set(mp_ev_t *e, unsigned f, const msgpack_object *v)
{
    if (f < MPF_N)
        e->f[f] = v->type == MSGPACK_OBJECT_NIL ? NULL : v;
}

/* Reads the type and the fields of event @o into *@e; a malformed event is marked bad. */
static kvt_status_t mp_fields(mp_dec_t *d, const msgpack_object *o, mp_ev_t *e)
{
    bool hashes_seen = false;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *a = &o->via.array;
        if (a->size == 0 || a->ptr[0].type != MSGPACK_OBJECT_STR)
            return mp_bad(d, e, "an array event must start with its type name");
        e->type = mp_type(&a->ptr[0]);
        if (e->type == 0)
            return KVT_OK; /* counted by the caller */
        for (uint32_t i = 1; i < a->size; i++) {
            unsigned f = mp_pos_field(d, e->type, i - 1, &a->ptr[i]);
            if (f == MPF_UNKNOWN) {
                d->unknown++; /* a field of a newer engine */
                continue;
            }
            if (f == MPF_META && e->f[MPF_META] != NULL) {
                d->unknown++;
                continue;
            }
            if (f == MPF_META)
                e->meta_lenient = d->fmt == KVT_EV_FMT_VLLM; /* it was unknown there before */
            mp_set(e, f, &a->ptr[i]);
            hashes_seen |= f == MPF_HASHES;
        }
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        const msgpack_object_map *m = &o->via.map;
        const msgpack_object *type = NULL;
        for (uint32_t i = 0; i < m->size; i++) {
            if (!mp_str_is(&m->ptr[i].key, "type"))
                continue;
            if (type != NULL)
                return mp_bad(d, e, "field 'type' given twice");
            type = &m->ptr[i].val;
        }
        if (type == NULL)
            return mp_bad(d, e, "missing field 'type'");
        if (type->type != MSGPACK_OBJECT_STR)
            return mp_bad(d, e, "field 'type': want a string");
        e->type = mp_type(type);
        if (e->type == 0)
            return KVT_OK;
        unsigned seen = 0;
        for (uint32_t i = 0; i < m->size; i++) {
            const msgpack_object *k = &m->ptr[i].key;
            if (mp_str_is(k, "type"))
                continue;
            unsigned f = mp_map_field(e->type, k);
            if (f == MPF_UNKNOWN) {
                d->unknown++;
                continue;
            }
            if (f < MPF_N) {
                if (seen & (1u << f))
                    return mp_bad(d, e, "field '%s' given twice", mpf_name[f]);
                seen |= 1u << f;
            }
            mp_set(e, f, &m->ptr[i].val);
            hashes_seen |= f == MPF_HASHES;
        }
    } else {
        return mp_bad(d, e, "want an array or a map");
    }
    if (e->type != KVT_EV_CLEARED && !hashes_seen)
        return mp_bad(d, e, "missing field 'block_hashes'");
    if (e->type != KVT_EV_CLEARED &&
        (e->f[MPF_HASHES] == NULL || e->f[MPF_HASHES]->type != MSGPACK_OBJECT_ARRAY))
        return mp_bad(d, e, "block_hashes: want an array");
    return KVT_OK;
}

/* Whether @o is a str of 1..@max bytes without NUL. */
static bool mp_is_name(const msgpack_object *o, uint32_t max)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size >= 1 && o->via.str.size <= max &&
           memchr(o->via.str.ptr, '\0', o->via.str.size) == NULL;
}

/* Whether @o can be a cache salt: a non-empty string without NUL. */
static bool mp_is_salt(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size > 0 &&
           memchr(o->via.str.ptr, '\0', o->via.str.size) == NULL;
}

/*
 * Whether extra key @o, left alone on a chain's first block, is its cache
 * salt: a salt a query can give (1..KVT_IDX_MAX_NAME bytes, no NUL), as the
 * JSON decoder reads it; a longer string is a key like any other.
 */
static bool mp_is_key_salt(const msgpack_object *o)
{
    return mp_is_name(o, KVT_IDX_MAX_NAME);
}

/* Whether @o is the LoRA the event names (its lora_name, or lora_id in older vLLM). */
static bool mp_is_lora(const mp_ev_t *e, const msgpack_object *o)
{
    const msgpack_object *ln = e->f[MPF_LORA], *li = e->f[MPF_LORA_ID];
    if (ln != NULL && ln->type == MSGPACK_OBJECT_STR && o->type == MSGPACK_OBJECT_STR)
        return o->via.str.size == ln->via.str.size &&
               memcmp(o->via.str.ptr, ln->via.str.ptr, ln->via.str.size) == 0;
    if (li != NULL && li->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
        o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return o->via.u64 == li->via.u64;
    return false;
}

/*
 * vLLM's extra_keys: one entry per block, nil or an array of the block's
 * extra hash keys in vLLM's order: the LoRA name (lora_id in older
 * versions), multimodal keys, the cache salt (the request's first block
 * only), prompt-embedding hashes. Finds the salt (a lone string left on a
 * chain's first block) and whether any block has other keys.
 */
static kvt_status_t mp_extras(mp_dec_t *d, mp_ev_t *e, uint32_t nhashes)
{
    const msgpack_object *x = e->f[MPF_EXTRA];
    if (x == NULL)
        return KVT_OK;
    if (x->type != MSGPACK_OBJECT_ARRAY)
        return mp_bad(d, e, "extra_keys: want an array or nil");
    if (x->via.array.size != nhashes)
        return mp_bad(d, e, "extra_keys has %u entries for %u block_hashes", x->via.array.size,
                      nhashes);
    for (uint32_t i = 0; i < x->via.array.size; i++) {
        const msgpack_object *k = &x->via.array.ptr[i];
        if (k->type == MSGPACK_OBJECT_NIL)
            continue;
        if (k->type != MSGPACK_OBJECT_ARRAY)
            return mp_bad(d, e, "extra_keys[%u]: want an array or nil", i);
        uint32_t from = k->via.array.size > 0 && mp_is_lora(e, &k->via.array.ptr[0]) ? 1 : 0;
        uint32_t left = k->via.array.size - from;
        if (left == 0)
            continue;
        const msgpack_object *only = &k->via.array.ptr[from];
        if (i == 0 && e->f[MPF_PARENT] == NULL && left == 1 && mp_is_key_salt(only)) {
            if (e->salt == NULL)
                e->salt = only;
            continue;
        }
        e->extras = true;
    }
    return KVT_OK;
}

/* The metadata map of SGLang's BlockStoredWithMetadata: {"cache_salt": str}. */
static kvt_status_t mp_meta(mp_dec_t *d, mp_ev_t *e)
{
    const msgpack_object *m = e->f[MPF_META];
    if (m == NULL)
        return KVT_OK;
    if (m->type != MSGPACK_OBJECT_MAP)
        return mp_bad(d, e, "metadata: want a map or nil");
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        if (!mp_str_is(&m->via.map.ptr[i].key, "cache_salt"))
            continue; /* other metadata: nothing kvtier keys on */
        const msgpack_object *v = &m->via.map.ptr[i].val;
        if (v->type == MSGPACK_OBJECT_NIL ||
            (v->type == MSGPACK_OBJECT_STR && v->via.str.size == 0))
            continue;
        if (!mp_is_salt(v) && e->meta_lenient) {
            d->unknown++; /* not kvtier's: some other engine's map */
            continue;
        }
        if (!mp_is_salt(v))
            return mp_bad(d, e, "metadata.cache_salt: want a string without NUL");
        e->salt = v; /* the typed field wins over extra_keys */
    }
    return KVT_OK;
}

/*
 * Classifies event @o into *@e: its type, fields, tier, skip reason. A
 * malformed event is marked bad; one of an unknown type gets type 0.
 */
static kvt_status_t mp_classify(mp_dec_t *d, const msgpack_object *o, mp_ev_t *e)
{
    memset(e, 0, sizeof(*e));
    e->idx = (uint32_t)d->idx;
    e->tier = KVT_TIER_GPU;
    kvt_status_t st = mp_fields(d, o, e);
    if (st != KVT_OK || e->type == KVT_EV_BAD || e->type == 0 || e->type == KVT_EV_CLEARED)
        return st;
    const msgpack_object *md = e->f[MPF_MEDIUM];
    if (md != NULL) {
        if (md->type != MSGPACK_OBJECT_STR)
            return mp_bad(d, e, "medium: want a string or nil");
        e->tier = kvt_ev_medium_tier(md->via.str.ptr, md->via.str.size);
        if (e->tier == 0)
            e->skip = KVT_EV_SKIP_MEDIUM;
    }
    const msgpack_object *lo = e->f[MPF_LOCALITY];
    if (lo != NULL) {
        if (lo->type != MSGPACK_OBJECT_STR)
            return mp_bad(d, e, "locality: want a string or nil");
        if (lo->via.str.size == 6 && strncasecmp(lo->via.str.ptr, "REMOTE", 6) == 0 &&
            e->skip == KVT_EV_SKIP_NONE)
            e->skip = KVT_EV_SKIP_REMOTE;
    }
    const msgpack_object *g = e->f[MPF_GROUP];
    if (g != NULL && (g->type != MSGPACK_OBJECT_POSITIVE_INTEGER || g->via.u64 > INT64_MAX))
        return mp_bad(d, e, "group_idx: want a non-negative integer or nil");
    const msgpack_object *k = e->f[MPF_KIND];
    if (k != NULL && k->type != MSGPACK_OBJECT_STR)
        return mp_bad(d, e, "kv_cache_spec_kind: want a string or nil");
    if (e->type != KVT_EV_STORED || e->skip != KVT_EV_SKIP_NONE)
        return KVT_OK;
    const msgpack_object *h = e->f[MPF_HASHES];
    const msgpack_object *l = e->f[MPF_LORA];
    if (l != NULL && !mp_is_name(l, KVT_IDX_MAX_NAME))
        return mp_bad(d, e, "lora_name: want a string of 1..%u bytes without NUL, or nil",
                      KVT_IDX_MAX_NAME);
    if ((st = mp_meta(d, e)) != KVT_OK || e->type == KVT_EV_BAD)
        return st;
    return mp_extras(d, e, h->via.array.size);
}

/* Elements of array field @f of @e (0 when absent); a non-array makes the event bad. */
static bool mp_array_len(mp_dec_t *d, mp_ev_t *e, unsigned f, uint32_t *n_p)
{
    const msgpack_object *o = e->f[f];
    *n_p = 0;
    if (o == NULL)
        return true;
    if (o->type != MSGPACK_OBJECT_ARRAY) {
        mp_bad(d, e, "%s: want an array", mpf_name[f]);
        return false;
    }
    *n_p = o->via.array.size;
    return true;
}

static size_t mp_round8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* Arena bytes that event @e needs beyond its slot; checks the item limit. */
static kvt_status_t mp_size(mp_dec_t *d, mp_ev_t *e, size_t *bytes_p)
{
    *bytes_p = 0;
    if (e->skip == KVT_EV_SKIP_MEDIUM) {
        *bytes_p = KVT_EV_MEDIUM_NAME_MAX; /* the name, for counting */
        return KVT_OK;
    }
    if (e->type == KVT_EV_BAD || e->type == KVT_EV_CLEARED || e->skip != KVT_EV_SKIP_NONE)
        return KVT_OK;
    uint32_t nh, nt = 0;
    if (!mp_array_len(d, e, MPF_HASHES, &nh) ||
        (e->type == KVT_EV_STORED && !mp_array_len(d, e, MPF_TOKENS, &nt)))
        return KVT_OK;
    if ((size_t)nh + nt > d->max_items - d->items)
        return MP_FAIL(d, KVT_ERR_TOO_BIG, "events[%zu]: more than %zu hashes and tokens in all",
                       d->idx, d->max_items);
    d->items += (size_t)nh + nt;
    size_t b = (size_t)nh * 8 + mp_round8((size_t)nt * 4);
    const msgpack_object *l = e->f[MPF_LORA];
    if (e->type == KVT_EV_STORED && l != NULL)
        b += mp_round8((size_t)l->via.str.size + 1);
    if (e->salt != NULL)
        b += mp_round8((size_t)e->salt->via.str.size + 1);
    if (e->extras)
        b += (size_t)nh * 8;
    *bytes_p = b;
    return KVT_OK;
}

/* ---- 3. convert ----------------------------------------------------------------------------- */

/* A block hash as an id: see kvt_ev_format_t. False when @o is not a hash. */
static bool mp_hash(const mp_dec_t *d, const msgpack_object *o, uint64_t *h_p)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *h_p = o->via.u64; return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *h_p = (uint64_t)o->via.i64; return true;
    case MSGPACK_OBJECT_BIN: {
        uint32_t n = o->via.bin.size;
        if (n == 0 || n > 64)
            return false;
        const uint8_t *p = (const uint8_t *)o->via.bin.ptr;
        size_t take = n < 8 ? n : 8;
        *h_p = kvt_load_be(d->fmt == KVT_EV_FMT_SGLANG ? p : p + n - take, take);
        return true;
    }
    default: return false;
    }
}

static bool mp_u32(const msgpack_object *o, uint32_t *v_p)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
        return false;
    *v_p = (uint32_t)o->via.u64;
    return true;
}

/*
 * Feeds msgpack value @o to @s in the canonical form (event_keys_int.h): the
 * same value gives the same seed however it was packed (int widths, str8 or
 * str16, float32 or float64 of one double), and as its JSON text would.
 */
static void mp_feed(XXH3_state_t *s, const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: ev_key_tag(s, EV_KEY_NULL); break;
    case MSGPACK_OBJECT_BOOLEAN: ev_key_bool(s, o->via.boolean); break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: ev_key_u64(s, EV_KEY_UINT, o->via.u64); break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: ev_key_u64(s, EV_KEY_NEG, (uint64_t)o->via.i64); break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: ev_key_double(s, o->via.f64); break;
    case MSGPACK_OBJECT_STR: ev_key_bytes(s, EV_KEY_STR, o->via.str.ptr, o->via.str.size); break;
    case MSGPACK_OBJECT_BIN: ev_key_bytes(s, EV_KEY_BIN, o->via.bin.ptr, o->via.bin.size); break;
    case MSGPACK_OBJECT_EXT:
        ev_key_tag(s, EV_KEY_EXT); /* then its type byte where a tag goes, its length, its data */
        ev_key_bytes(s, (uint8_t)o->via.ext.type, o->via.ext.ptr, o->via.ext.size);
        break;
    case MSGPACK_OBJECT_ARRAY:
        ev_key_tag(s, EV_KEY_ARRAY);
        for (uint32_t i = 0; i < o->via.array.size; i++)
            mp_feed(s, &o->via.array.ptr[i]); /* depth is bounded by mp_check() */
        ev_key_tag(s, EV_KEY_END);
        break;
    case MSGPACK_OBJECT_MAP:
        ev_key_tag(s, EV_KEY_MAP);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            mp_feed(s, &o->via.map.ptr[i].key);
            mp_feed(s, &o->via.map.ptr[i].val);
        }
        ev_key_tag(s, EV_KEY_END);
        break;
    default: break;
    }
}

/* The extra seed of block entry @k (an array of its extra keys from @from on); never 0. */
static uint64_t mp_extra_seed(const msgpack_object *k, uint32_t from)
{
    XXH3_state_t s;
    ev_key_begin(&s);
    for (uint32_t i = from; i < k->via.array.size; i++)
        mp_feed(&s, &k->via.array.ptr[i]);
    return ev_key_seed(&s);
}

/* Copies str @o into *@bump as a NUL-terminated string; returns it. */
static const char *mp_copy_str(const msgpack_object *o, char **bump)
{
    char *s = *bump;
    memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    *bump += mp_round8((size_t)o->via.str.size + 1);
    return s;
}

/* The common fields of @e in @ev. */
static void mp_convert_head(const mp_ev_t *e, kvt_event_t *ev)
{
    memset(ev, 0, sizeof(*ev));
    ev->type = e->type;
    if (e->type == KVT_EV_BAD) { /* nothing of it is trusted */
        ev->may_remove = e->may_remove;
        ev->group = -1;
        return;
    }
    ev->tier = e->skip == KVT_EV_SKIP_MEDIUM ? 0 : e->tier;
    ev->skip = e->skip;
    ev->may_remove = e->may_remove;
    ev->group = e->f[MPF_GROUP] != NULL ? (int64_t)e->f[MPF_GROUP]->via.u64 : -1;
    const msgpack_object *k = e->f[MPF_KIND];
    ev->group_kind =
        k != NULL ? kvt_ev_group_kind(k->via.str.ptr, k->via.str.size) : KVT_EV_GROUP_ANY;
}

/* Fills @ev from @e; its arrays and names go at *@bump (advanced). A bad value makes it bad. */
static void mp_convert(mp_dec_t *d, mp_ev_t *e, kvt_event_t *ev, char **bump)
{
    mp_convert_head(e, ev);
    if (e->skip == KVT_EV_SKIP_MEDIUM) {
        const msgpack_object *m = e->f[MPF_MEDIUM];
        uint32_t n = kvt_ev_medium_name_len(m->via.str.ptr, m->via.str.size);
        if (n > 0)
            memcpy(*bump, m->via.str.ptr, n);
        else
            (*bump)[n++] = '?'; /* an empty name, counted as "?" (as the JSON decoder does) */
        ev->medium = *bump;
        ev->medium_len = n;
        *bump += KVT_EV_MEDIUM_NAME_MAX;
        return;
    }
    if (e->type == KVT_EV_BAD || e->type == KVT_EV_CLEARED || e->skip != KVT_EV_SKIP_NONE)
        return;
    const msgpack_object_array *a = &e->f[MPF_HASHES]->via.array;
    uint64_t *h = (uint64_t *)(void *)*bump;
    for (uint32_t i = 0; i < a->size; i++)
        if (!mp_hash(d, &a->ptr[i], &h[i])) {
            mp_bad(d, e, "block_hashes[%u]: want an integer or 1..64 bytes", i);
            goto bad;
        }
    ev->nhashes = a->size;
    ev->hashes = a->size ? h : NULL;
    *bump += (size_t)a->size * 8;
    if (e->type != KVT_EV_STORED)
        return;
    if (ev->nhashes == 0) {
        mp_bad(d, e, "block_hashes is empty");
        goto bad;
    }
    if (e->f[MPF_PARENT] != NULL) {
        if (!mp_hash(d, e->f[MPF_PARENT], &ev->parent)) {
            mp_bad(d, e, "parent_block_hash: want an integer or 1..64 bytes");
            goto bad;
        }
        ev->has_parent = true;
    }
    if (e->f[MPF_TOKENS] != NULL) {
        const msgpack_object_array *t = &e->f[MPF_TOKENS]->via.array;
        uint32_t *tok = (uint32_t *)(void *)*bump;
        for (uint32_t i = 0; i < t->size; i++)
            if (!mp_u32(&t->ptr[i], &tok[i])) {
                mp_bad(d, e, "token_ids[%u]: want an integer in 0..4294967295", i);
                goto bad;
            }
        ev->ntokens = t->size;
        ev->tokens = t->size ? tok : NULL;
        *bump += mp_round8((size_t)t->size * 4);
    }
    bool has_bs = e->f[MPF_BLOCK_SIZE] != NULL;
    if (has_bs && !mp_u32(e->f[MPF_BLOCK_SIZE], &ev->block_size)) {
        mp_bad(d, e, "block_size: want an integer in 0..4294967295");
        goto bad;
    }
    if (e->f[MPF_LORA] != NULL)
        ev->lora_name = mp_copy_str(e->f[MPF_LORA], bump);
    if (e->salt != NULL) {
        ev->cache_salt_len = e->salt->via.str.size;
        ev->cache_salt = mp_copy_str(e->salt, bump);
    }
    if (e->extras) {
        uint64_t *x = (uint64_t *)(void *)*bump;
        const msgpack_object_array *xa = &e->f[MPF_EXTRA]->via.array;
        for (uint32_t i = 0; i < xa->size; i++) {
            const msgpack_object *k = &xa->ptr[i];
            x[i] = 0;
            if (k->type != MSGPACK_OBJECT_ARRAY)
                continue;
            uint32_t from = k->via.array.size > 0 && mp_is_lora(e, &k->via.array.ptr[0]) ? 1 : 0;
            bool salt_only = i == 0 && e->f[MPF_PARENT] == NULL && k->via.array.size == from + 1 &&
                             mp_is_key_salt(&k->via.array.ptr[from]);
            if (k->via.array.size > from && !salt_only)
                x[i] = mp_extra_seed(k, from);
        }
        ev->extra_seeds = x;
        *bump += (size_t)xa->size * 8;
    }
    if (ev->ntokens == 0)
        return; /* a placeholder: resolved through the pod's engine hashes */
    if (has_bs) {
        if ((uint64_t)ev->block_size * ev->nhashes != ev->ntokens) {
            mp_bad(d, e, "token_ids has %u entries, want block_size %u x %u block_hashes",
                   ev->ntokens, ev->block_size, ev->nhashes);
            goto bad;
        }
    } else {
        if (ev->ntokens % ev->nhashes != 0) {
            mp_bad(d, e, "token_ids has %u entries, not a multiple of the %u block_hashes",
                   ev->ntokens, ev->nhashes);
            goto bad;
        }
        ev->block_size = ev->ntokens / ev->nhashes;
    }
    return;
bad:
    mp_convert_head(e, ev); /* the arena space it took stays unused */
}

/* ---- the batch ------------------------------------------------------------------------------ */

static bool mp_is_number(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32 ||
           o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}

/* A batch's dp_rank: nil (keep @dp_rank_p) or an integer in u32. */
static kvt_status_t mp_rank(mp_dec_t *d, const msgpack_object *o, uint32_t *dp_rank_p)
{
    if (o == NULL || o->type == MSGPACK_OBJECT_NIL)
        return KVT_OK;
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
        return MP_FAIL(d, KVT_ERR_INVAL, "batch dp_rank: want an integer in 0..4294967295");
    *dp_rank_p = (uint32_t)o->via.u64;
    return KVT_OK;
}

/*
 * Reads the batch @root: [ts, events, dp_rank?] (array_like: vLLM <= 0.25 and
 * SGLang), or {"ts", "events", "data_parallel_rank"?} (vLLM's EventBatch
 * without array_like; SGLang's rank is "attn_dp_rank").
 */
static kvt_status_t mp_batch(mp_dec_t *d, const msgpack_object *root,
                             const msgpack_object_array **events_p, uint32_t *dp_rank_p)
{
    const msgpack_object *ts = NULL, *events = NULL, *rank = NULL;
    if (root->type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *a = &root->via.array;
        if (a->size < 2)
            return MP_FAIL(d, KVT_ERR_INVAL, "a batch array is [ts, events, dp_rank?]");
        ts = &a->ptr[0];
        events = &a->ptr[1];
        rank = a->size >= 3 ? &a->ptr[2] : NULL;
        if (a->size > 3)
            d->unknown += a->size - 3;
    } else if (root->type == MSGPACK_OBJECT_MAP) {
        const msgpack_object_map *m = &root->via.map;
        for (uint32_t i = 0; i < m->size; i++) {
            const msgpack_object *k = &m->ptr[i].key, *v = &m->ptr[i].val;
            const msgpack_object **slot = mp_str_is(k, "ts")                   ? &ts
                                          : mp_str_is(k, "events")             ? &events
                                          : mp_str_is(k, "data_parallel_rank") ? &rank
                                          : mp_str_is(k, "attn_dp_rank")       ? &rank
                                                                               : NULL;
            if (slot == NULL) {
                d->unknown++;
                continue;
            }
            if (*slot != NULL)
                return MP_FAIL(d, KVT_ERR_INVAL, "batch field '%.*s' given twice",
                               (int)k->via.str.size, k->via.str.ptr);
            *slot = v;
        }
        if (ts == NULL || events == NULL)
            return MP_FAIL(d, KVT_ERR_INVAL, "a batch map needs \"ts\" and \"events\"");
    } else {
        return MP_FAIL(d, KVT_ERR_INVAL,
                       "a batch is an array [ts, events, dp_rank?] or a map {ts, events, ...}");
    }
    if (!mp_is_number(ts))
        return MP_FAIL(d, KVT_ERR_INVAL, "batch ts: want a number");
    if (events->type != MSGPACK_OBJECT_ARRAY)
        return MP_FAIL(d, KVT_ERR_INVAL, "batch events: want an array");
    *events_p = &events->via.array;
    return mp_rank(d, rank, dp_rank_p);
}

kvt_status_t kvt_ev_msgpack_decode(const void *payload, size_t len, kvt_ev_format_t fmt,
                                   const char *pod, const char *model, uint32_t dp_rank,
                                   size_t max_items, kvt_evbatch_t *b, char *err, size_t errlen)
{
    mp_dec_t d = {.fmt = fmt, .max_items = max_items, .err = err, .errlen = errlen};
    if (errlen > 0)
        err[0] = '\0';
    if (fmt != KVT_EV_FMT_VLLM && fmt != KVT_EV_FMT_SGLANG)
        return MP_FAIL(&d, KVT_ERR_INVAL, "unknown event format %d", (int)fmt);
    if (payload == NULL && len != 0)
        return MP_FAIL(&d, KVT_ERR_INVAL, "no payload");
    if (mp_check(payload, len, err, errlen) != KVT_OK)
        return KVT_ERR_PARSE;

    msgpack_zone zone;
    if (!msgpack_zone_init(&zone, len < 4096 ? 4096 : len * 2))
        return MP_FAIL(&d, KVT_ERR_NO_MEM, "out of memory");
    kvt_status_t st = KVT_OK;
    mp_ev_t *cls = NULL;
    char *arena = NULL;
    msgpack_object root;
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack(payload, len, &off, &zone, &root);
    if (ur != MSGPACK_UNPACK_SUCCESS) {
        /* mp_check() passed (shape, lengths, depth), so only memory can fail here */
        st =
            MP_FAIL(&d, ur == MSGPACK_UNPACK_NOMEM_ERROR ? KVT_ERR_NO_MEM : KVT_ERR_INTERNAL,
                    "msgpack-c: %s",
                    ur == MSGPACK_UNPACK_NOMEM_ERROR ? "out of memory" : "refused a checked value");
        goto out;
    }
    const msgpack_object_array *events = NULL;
    uint32_t rank = dp_rank;
    if ((st = mp_batch(&d, &root, &events, &rank)) != KVT_OK)
        goto out;

    cls = malloc((events->size ? events->size : 1) * sizeof(*cls));
    if (cls == NULL) {
        st = MP_FAIL(&d, KVT_ERR_NO_MEM, "out of memory");
        goto out;
    }
    size_t nkeep = 0, bytes = 0;
    for (uint32_t i = 0; i < events->size; i++) {
        d.idx = i;
        if ((st = mp_classify(&d, &events->ptr[i], &cls[nkeep])) != KVT_OK)
            goto out;
        if (cls[nkeep].type == 0) {
            d.unknown++; /* a type kvtier does not know */
            continue;
        }
        size_t eb = 0;
        if ((st = mp_size(&d, &cls[nkeep], &eb)) != KVT_OK)
            goto out;
        bytes += eb;
        nkeep++;
    }
    size_t ev_bytes = nkeep * sizeof(kvt_event_t);
    arena = malloc(ev_bytes + bytes + 8);
    if (arena == NULL) {
        st = MP_FAIL(&d, KVT_ERR_NO_MEM, "out of memory");
        goto out;
    }
    kvt_event_t *ev = (kvt_event_t *)(void *)arena;
    char *bump = arena + ev_bytes;
    for (size_t i = 0; i < nkeep; i++) {
        d.idx = cls[i].idx;
        mp_convert(&d, &cls[i], &ev[i], &bump);
    }
    *b = (kvt_evbatch_t){.pod = pod,
                         .dp_rank = rank,
                         .model = model ? model : "",
                         .lora = NULL,
                         .ev = nkeep ? ev : NULL,
                         .nev = nkeep,
                         .unknown = d.unknown,
                         .arena = arena};
    arena = NULL;
out:
    free(arena);
    free(cls);
    msgpack_zone_destroy(&zone);
    return st;
}
