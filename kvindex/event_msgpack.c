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
 */
#include "kvindex/event.h"

#include "common/bytes.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/* Checks that @buf[@len] is exactly one msgpack value; else the reason and offset. */
static kvt_status_t mp_check(const uint8_t *buf, size_t len, const char **why_p, size_t *at_p)
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
        *at_p = off;
        if (off >= len) {
            *why_p = "truncated";
            return KVT_ERR_PARSE;
        }
        uint8_t c = buf[off++];
        pending--;
        if (depth > 0)
            left[depth - 1]--;
        unsigned len_bytes, per_len;
        uint64_t fixed, children;
        bool container;
        if (!mp_shape(c, &len_bytes, &fixed, &per_len, &container, &children)) {
            *why_p = "reserved byte 0xc1";
            return KVT_ERR_PARSE;
        }
        uint64_t n = 0;
        if (len_bytes > 0) {
            if (len - off < len_bytes) {
                *why_p = "truncated";
                return KVT_ERR_PARSE;
            }
            n = kvt_load_be(buf + off, len_bytes);
            off += len_bytes;
        }
        if (container) {
            uint64_t kids = children + n * per_len;
            pending += kids;
            if (pending > len - off) {
                *why_p = "an array or map claims more elements than bytes remain";
                return KVT_ERR_PARSE;
            }
            if (kids > 0) {
                if (depth == MP_MAX_DEPTH) {
                    *why_p = "nested deeper than 24 arrays and maps";
                    return KVT_ERR_PARSE;
                }
                left[depth++] = kids;
            }
        } else {
            uint64_t skip = fixed + n * per_len;
            if (skip > len - off) {
                *why_p = "truncated";
                return KVT_ERR_PARSE;
            }
            off += (size_t)skip;
        }
    }
    if (off != len) {
        *at_p = off;
        *why_p = "trailing bytes after the batch";
        return KVT_ERR_PARSE;
    }
    return KVT_OK;
}

/* ---- 2. classify ---------------------------------------------------------------------------- */

/* Fields kvtier reads. MPF_IGNORED: known to vLLM, not used here; MPF_UNKNOWN: counted. */
enum {
    MPF_HASHES,
    MPF_PARENT,
    MPF_TOKENS,
    MPF_BLOCK_SIZE,
    MPF_MEDIUM,
    MPF_LORA,
    MPF_N,
    MPF_IGNORED = MPF_N,
    MPF_UNKNOWN,
};

static const char *const mpf_name[MPF_N] = {
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "lora_name"};

/*
 * Every field vLLM declares, in BlockStored's positional order, and what it
 * is in a BlockStored and in a BlockRemoved.
 */
static const struct {
    const char *name;
    uint8_t stored, removed;
} mp_fields[] = {
    {"block_hashes", MPF_HASHES, MPF_HASHES},
    {"parent_block_hash", MPF_PARENT, MPF_UNKNOWN},
    {"token_ids", MPF_TOKENS, MPF_UNKNOWN},
    {"block_size", MPF_BLOCK_SIZE, MPF_UNKNOWN},
    {"lora_id", MPF_IGNORED, MPF_UNKNOWN},
    {"medium", MPF_MEDIUM, MPF_MEDIUM},
    {"lora_name", MPF_LORA, MPF_UNKNOWN},
    {"extra_keys", MPF_IGNORED, MPF_UNKNOWN},
    {"group_idx", MPF_IGNORED, MPF_IGNORED},
    {"kv_cache_spec_kind", MPF_IGNORED, MPF_UNKNOWN},
    {"kv_cache_spec_sliding_window", MPF_IGNORED, MPF_UNKNOWN},
};
#define MP_NFIELDS (sizeof(mp_fields) / sizeof(mp_fields[0]))

/* BlockRemoved's positional order. */
static const uint8_t mp_removed_pos[] = {MPF_HASHES, MPF_MEDIUM, MPF_IGNORED /* group_idx */};

/* An event as classified: its type and the objects of its fields (NULL: absent or nil). */
typedef struct mp_ev {
    kvt_ev_type_t type;
    uint32_t idx; /* in the batch's events, for messages */
    unsigned tier;
    const msgpack_object *f[MPF_N];
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

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static kvt_status_t
mp_fail(mp_dec_t *d, kvt_status_t st, const char *fmt, ...)
{
    if (d->err == NULL || d->errlen == 0)
        return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, d->errlen, fmt, ap);
    va_end(ap);
    return st;
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
    for (size_t i = 0; i < MP_NFIELDS; i++)
        if (mp_str_is(key, mp_fields[i].name))
            return t == KVT_EV_STORED ? mp_fields[i].stored : mp_fields[i].removed;
    return MPF_UNKNOWN;
}

/* Field at position @i (after the type name) of an array event of type @t. */
static unsigned mp_pos_field(kvt_ev_type_t t, uint32_t i)
{
    if (t == KVT_EV_STORED && i < MP_NFIELDS)
        return mp_fields[i].stored;
    if (t == KVT_EV_REMOVED && i < sizeof(mp_removed_pos))
        return mp_removed_pos[i];
    return MPF_UNKNOWN;
}

/* Sets field @f of @e to @v (nil: absent). */
static void mp_set(mp_ev_t *e, unsigned f, const msgpack_object *v)
{
    if (f < MPF_N)
        e->f[f] = v->type == MSGPACK_OBJECT_NIL ? NULL : v;
}

/*
 * "medium": absent is GPU; "GPU", "CPU", "DISK" or "NVME" in any case. Sets
 * *known_p to false for another name (the event is skipped). A medium that
 * is not a string is an error.
 */
static kvt_status_t mp_medium(mp_dec_t *d, const msgpack_object *o, unsigned *tier_p, bool *known_p)
{
    *known_p = true;
    *tier_p = KVT_TIER_GPU;
    if (o == NULL)
        return KVT_OK;
    if (o->type != MSGPACK_OBJECT_STR)
        return mp_fail(d, KVT_ERR_INVAL, "events[%zu].medium: want a string or nil", d->idx);
    const char *s = o->via.str.ptr;
    uint32_t n = o->via.str.size;
    if (n == 3 && strncasecmp(s, "GPU", 3) == 0)
        *tier_p = KVT_TIER_GPU;
    else if (n == 3 && strncasecmp(s, "CPU", 3) == 0)
        *tier_p = KVT_TIER_CPU;
    else if (n == 4 && (strncasecmp(s, "DISK", 4) == 0 || strncasecmp(s, "NVME", 4) == 0))
        *tier_p = KVT_TIER_DISK;
    else
        *known_p = false;
    return KVT_OK;
}

/*
 * Classifies event @o into *@e. Sets *keep_p to false for an event that is
 * skipped (unknown type or medium); it is counted.
 */
static kvt_status_t mp_classify(mp_dec_t *d, const msgpack_object *o, mp_ev_t *e, bool *keep_p)
{
    memset(e, 0, sizeof(*e));
    e->idx = (uint32_t)d->idx;
    *keep_p = false;
    bool hashes_seen = false;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *a = &o->via.array;
        if (a->size == 0 || a->ptr[0].type != MSGPACK_OBJECT_STR)
            return mp_fail(d, KVT_ERR_INVAL,
                           "events[%zu]: an array event must start with its type name", d->idx);
        e->type = mp_type(&a->ptr[0]);
        if (e->type == 0) {
            d->unknown++;
            return KVT_OK;
        }
        for (uint32_t i = 1; i < a->size; i++) {
            unsigned f = mp_pos_field(e->type, i - 1);
            if (f == MPF_UNKNOWN) {
                d->unknown += a->size - i; /* fields of a newer engine */
                break;
            }
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
                return mp_fail(d, KVT_ERR_INVAL, "events[%zu]: field 'type' given twice", d->idx);
            type = &m->ptr[i].val;
        }
        if (type == NULL)
            return mp_fail(d, KVT_ERR_INVAL, "events[%zu]: missing field 'type'", d->idx);
        if (type->type != MSGPACK_OBJECT_STR)
            return mp_fail(d, KVT_ERR_INVAL, "events[%zu].type: want a string", d->idx);
        e->type = mp_type(type);
        if (e->type == 0) {
            d->unknown++;
            return KVT_OK;
        }
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
                    return mp_fail(d, KVT_ERR_INVAL, "events[%zu]: field '%s' given twice", d->idx,
                                   mpf_name[f]);
                seen |= 1u << f;
            }
            mp_set(e, f, &m->ptr[i].val);
            hashes_seen |= f == MPF_HASHES;
        }
    } else {
        return mp_fail(d, KVT_ERR_INVAL, "events[%zu]: want an array or a map", d->idx);
    }
    if (e->type != KVT_EV_CLEARED && !hashes_seen)
        return mp_fail(d, KVT_ERR_INVAL, "events[%zu]: missing field 'block_hashes'", d->idx);
    bool known;
    kvt_status_t st = mp_medium(d, e->f[MPF_MEDIUM], &e->tier, &known);
    if (st != KVT_OK)
        return st;
    if (!known) {
        d->unknown++; /* a tier kvtier does not model */
        return KVT_OK;
    }
    *keep_p = true;
    return KVT_OK;
}

/* Elements of array field @f of @e (0 when absent); an error when it is not an array. */
static kvt_status_t mp_array_len(mp_dec_t *d, const mp_ev_t *e, unsigned f, uint32_t *n_p)
{
    const msgpack_object *o = e->f[f];
    *n_p = 0;
    if (o == NULL)
        return KVT_OK;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return mp_fail(d, KVT_ERR_INVAL, "events[%zu].%s: want an array", d->idx, mpf_name[f]);
    *n_p = o->via.array.size;
    return KVT_OK;
}

/* Arena bytes that event @e needs beyond its slot; checks the item limit. */
static kvt_status_t mp_size(mp_dec_t *d, const mp_ev_t *e, size_t *bytes_p)
{
    uint32_t nh, nt;
    kvt_status_t st = mp_array_len(d, e, MPF_HASHES, &nh);
    if (st == KVT_OK)
        st = mp_array_len(d, e, MPF_TOKENS, &nt);
    if (st != KVT_OK)
        return st;
    if ((size_t)nh + nt > d->max_items - d->items)
        return mp_fail(d, KVT_ERR_TOO_BIG, "events[%zu]: more than %zu hashes and tokens in all",
                       d->idx, d->max_items);
    d->items += (size_t)nh + nt;
    size_t b = (size_t)nh * 8 + (((size_t)nt * 4 + 7) & ~(size_t)7);
    const msgpack_object *l = e->f[MPF_LORA];
    if (l != NULL && l->type == MSGPACK_OBJECT_STR)
        b += ((size_t)l->via.str.size + 8) & ~(size_t)7;
    *bytes_p = b;
    return KVT_OK;
}

/* ---- 3. convert ----------------------------------------------------------------------------- */

/* A block hash as an id: see kvt_ev_format_t. */
static kvt_status_t mp_hash(mp_dec_t *d, const msgpack_object *o, const char *field, uint64_t *h_p)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *h_p = o->via.u64; return KVT_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *h_p = (uint64_t)o->via.i64; return KVT_OK;
    case MSGPACK_OBJECT_BIN: {
        uint32_t n = o->via.bin.size;
        if (n == 0 || n > 64)
            return mp_fail(d, KVT_ERR_INVAL, "events[%zu].%s: a %u-byte hash (want 1..64 bytes)",
                           d->idx, field, n);
        const uint8_t *p = (const uint8_t *)o->via.bin.ptr;
        size_t take = n < 8 ? n : 8;
        *h_p = kvt_load_be(d->fmt == KVT_EV_FMT_SGLANG ? p : p + n - take, take);
        return KVT_OK;
    }
    default:
        return mp_fail(d, KVT_ERR_INVAL, "events[%zu].%s: want an integer or bytes", d->idx, field);
    }
}

static kvt_status_t mp_u32(mp_dec_t *d, const msgpack_object *o, const char *field, uint32_t *v_p)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
        return mp_fail(d, KVT_ERR_INVAL, "events[%zu].%s: want an integer in 0..4294967295", d->idx,
                       field);
    *v_p = (uint32_t)o->via.u64;
    return KVT_OK;
}

/* Fills @ev from @e; its arrays and name go at *@bump (advanced). */
static kvt_status_t mp_convert(mp_dec_t *d, const mp_ev_t *e, kvt_event_t *ev, char **bump)
{
    memset(ev, 0, sizeof(*ev));
    ev->type = e->type;
    ev->tier = e->tier;
    kvt_status_t st;
    if (e->f[MPF_HASHES] != NULL) {
        const msgpack_object_array *a = &e->f[MPF_HASHES]->via.array;
        uint64_t *h = (uint64_t *)(void *)*bump;
        for (uint32_t i = 0; i < a->size; i++)
            if ((st = mp_hash(d, &a->ptr[i], "block_hashes", &h[i])) != KVT_OK)
                return st;
        ev->nhashes = a->size;
        ev->hashes = a->size ? h : NULL;
        *bump += (size_t)a->size * 8;
    }
    if (e->type != KVT_EV_STORED)
        return KVT_OK;
    if (ev->nhashes == 0)
        return mp_fail(d, KVT_ERR_INVAL, "events[%zu]: block_hashes is empty", d->idx);
    if (e->f[MPF_PARENT] != NULL) {
        if ((st = mp_hash(d, e->f[MPF_PARENT], "parent_block_hash", &ev->parent)) != KVT_OK)
            return st;
        ev->has_parent = true;
    }
    if (e->f[MPF_TOKENS] != NULL) {
        const msgpack_object_array *a = &e->f[MPF_TOKENS]->via.array;
        uint32_t *t = (uint32_t *)(void *)*bump;
        for (uint32_t i = 0; i < a->size; i++)
            if ((st = mp_u32(d, &a->ptr[i], "token_ids", &t[i])) != KVT_OK)
                return st;
        ev->ntokens = a->size;
        ev->tokens = a->size ? t : NULL;
        *bump += ((size_t)a->size * 4 + 7) & ~(size_t)7;
    }
    bool has_bs = e->f[MPF_BLOCK_SIZE] != NULL;
    if (has_bs && (st = mp_u32(d, e->f[MPF_BLOCK_SIZE], "block_size", &ev->block_size)) != KVT_OK)
        return st;
    if (e->f[MPF_LORA] != NULL) {
        const msgpack_object *l = e->f[MPF_LORA];
        if (l->type != MSGPACK_OBJECT_STR)
            return mp_fail(d, KVT_ERR_INVAL, "events[%zu].lora_name: want a string or nil", d->idx);
        if (l->via.str.size > KVT_IDX_MAX_NAME)
            return mp_fail(d, KVT_ERR_TOO_BIG, "events[%zu].lora_name: over %d bytes", d->idx,
                           KVT_IDX_MAX_NAME);
        if (memchr(l->via.str.ptr, '\0', l->via.str.size) != NULL)
            return mp_fail(d, KVT_ERR_INVAL, "events[%zu].lora_name: contains a NUL character",
                           d->idx);
        memcpy(*bump, l->via.str.ptr, l->via.str.size);
        (*bump)[l->via.str.size] = '\0';
        ev->lora_name = *bump;
        *bump += ((size_t)l->via.str.size + 8) & ~(size_t)7;
    }
    if (ev->ntokens == 0)
        return KVT_OK; /* a placeholder: resolved through the pod's engine hashes */
    if (has_bs) {
        if ((uint64_t)ev->block_size * ev->nhashes != ev->ntokens)
            return mp_fail(d, KVT_ERR_INVAL,
                           "events[%zu]: token_ids has %u entries, want block_size %u x %u "
                           "block_hashes",
                           d->idx, ev->ntokens, ev->block_size, ev->nhashes);
    } else {
        if (ev->ntokens % ev->nhashes != 0)
            return mp_fail(d, KVT_ERR_INVAL,
                           "events[%zu]: token_ids has %u entries, not a multiple of the %u "
                           "block_hashes",
                           d->idx, ev->ntokens, ev->nhashes);
        ev->block_size = ev->ntokens / ev->nhashes;
    }
    return KVT_OK;
}

/* ---- the batch ------------------------------------------------------------------------------ */

/* Reads [ts, events, dp_rank?] from @root. */
static kvt_status_t mp_batch(mp_dec_t *d, const msgpack_object *root,
                             const msgpack_object_array **events_p, uint32_t *dp_rank_p)
{
    if (root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size < 2)
        return mp_fail(d, KVT_ERR_INVAL, "a batch is an array [ts, events, dp_rank?]");
    const msgpack_object *f = root->via.array.ptr;
    if (f[0].type != MSGPACK_OBJECT_FLOAT64 && f[0].type != MSGPACK_OBJECT_FLOAT32 &&
        f[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
        f[0].type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return mp_fail(d, KVT_ERR_INVAL, "batch ts: want a number");
    if (f[1].type != MSGPACK_OBJECT_ARRAY)
        return mp_fail(d, KVT_ERR_INVAL, "batch events: want an array");
    *events_p = &f[1].via.array;
    if (root->via.array.size >= 3 && f[2].type != MSGPACK_OBJECT_NIL) {
        if (f[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER || f[2].via.u64 > UINT32_MAX)
            return mp_fail(d, KVT_ERR_INVAL, "batch dp_rank: want an integer in 0..4294967295");
        *dp_rank_p = (uint32_t)f[2].via.u64;
    }
    if (root->via.array.size > 3)
        d->unknown += root->via.array.size - 3;
    return KVT_OK;
}

kvt_status_t kvt_ev_msgpack_decode(const void *payload, size_t len, kvt_ev_format_t fmt,
                                   const char *pod, const char *model, uint32_t dp_rank,
                                   size_t max_items, kvt_evbatch_t *b, char *err, size_t errlen)
{
    mp_dec_t d = {.fmt = fmt, .max_items = max_items, .err = err, .errlen = errlen};
    if (errlen > 0)
        err[0] = '\0';
    if (fmt != KVT_EV_FMT_VLLM && fmt != KVT_EV_FMT_SGLANG)
        return mp_fail(&d, KVT_ERR_INVAL, "unknown event format %d", (int)fmt);
    const char *why;
    size_t at;
    if (payload == NULL && len != 0)
        return mp_fail(&d, KVT_ERR_INVAL, "no payload");
    if (mp_check(payload, len, &why, &at) != KVT_OK)
        return mp_fail(&d, KVT_ERR_PARSE, "msgpack, offset %zu: %s", at, why);

    msgpack_zone zone;
    if (!msgpack_zone_init(&zone, len < 4096 ? 4096 : len * 2))
        return mp_fail(&d, KVT_ERR_NO_MEM, "out of memory");
    kvt_status_t st = KVT_OK;
    mp_ev_t *cls = NULL;
    char *arena = NULL;
    msgpack_object root;
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack(payload, len, &off, &zone, &root);
    if (ur != MSGPACK_UNPACK_SUCCESS) {
        /* mp_check() passed (shape, lengths, depth), so only memory can fail here */
        st =
            mp_fail(&d, ur == MSGPACK_UNPACK_NOMEM_ERROR ? KVT_ERR_NO_MEM : KVT_ERR_INTERNAL,
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
        st = mp_fail(&d, KVT_ERR_NO_MEM, "out of memory");
        goto out;
    }
    size_t nkeep = 0, bytes = 0;
    for (uint32_t i = 0; i < events->size; i++) {
        bool keep;
        d.idx = i;
        if ((st = mp_classify(&d, &events->ptr[i], &cls[nkeep], &keep)) != KVT_OK)
            goto out;
        if (!keep)
            continue;
        size_t eb = 0;
        if ((st = mp_size(&d, &cls[nkeep], &eb)) != KVT_OK)
            goto out;
        bytes += eb;
        nkeep++;
    }
    size_t ev_bytes = nkeep * sizeof(kvt_event_t);
    arena = malloc(ev_bytes + bytes + 8);
    if (arena == NULL) {
        st = mp_fail(&d, KVT_ERR_NO_MEM, "out of memory");
        goto out;
    }
    kvt_event_t *ev = (kvt_event_t *)(void *)arena;
    char *bump = arena + ev_bytes;
    for (size_t i = 0; i < nkeep; i++) {
        d.idx = cls[i].idx;
        if ((st = mp_convert(&d, &cls[i], &ev[i], &bump)) != KVT_OK)
            goto out;
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
