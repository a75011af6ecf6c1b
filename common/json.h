/*
 * common/json: a strict RFC 8259 pull parser that allocates nothing, and an
 * append-only writer.
 *
 * The parser walks the text in order; the caller asks for what it expects
 * next (an object, a key, an unsigned integer, a whole array of token ids)
 * and the value is decoded straight into the caller's variables. Accepted:
 * exactly RFC 8259 JSON in UTF-8. Strings must be valid UTF-8 (no overlong
 * forms, no encoded surrogates, nothing above U+10FFFF) and may not hold raw
 * control characters below 0x20; every escape is decoded, \uXXXX surrogate
 * pairs included, and a lone surrogate escape is an error. Numbers follow
 * the grammar (no leading zeros, no '+', no NaN or Infinity). Whitespace is
 * space, tab, CR and LF only. Nesting is limited (64 by default). Nothing
 * but whitespace may follow the top value (kvt_json_end()).
 *
 * Duplicate keys: an object that names a key twice is refused at the second
 * one (KVT_ERR_INVAL), whether it is read with kvt_json_object_next() or
 * skipped, so every decoder built on this parser gives a repeated field the
 * same answer. Keys are compared as decoded text ("a" and "\u0061" are one
 * key). The keys of every object open at the same time are remembered, at
 * most KVT_JSON_MEMBERS_MAX (64) of them (more is KVT_ERR_TOO_BIG): a new key
 * is compared with its own object's earlier keys only, by decoded length,
 * then by a seeded 32-bit hash, then byte by byte, so the check costs at most
 * KVT_JSON_MEMBERS_MAX cheap comparisons per key and never grows with the
 * object's size beyond that.
 *
 * Errors: the first error is kept (sticky): every later call returns the
 * same status (object/array_next return it as a negative int, peek returns
 * KVT_JSON_NONE), and kvt_json_error() gives a one-line message that starts
 * with the byte offset, e.g. "offset 17: expected ':', got '}'".
 *  - KVT_ERR_PARSE: the text is not JSON;
 *  - KVT_ERR_INVAL: valid text of another type than asked for ("offset 9:
 *    expected an unsigned integer, got a string"), a number with a fraction
 *    or exponent where an integer is asked for, a key repeated in its object
 *    ("offset 12: duplicate field 'pod'"), or calls out of order (a value
 *    asked for where a key is due);
 *  - KVT_ERR_RANGE: an integer outside the asked type (or a u32 array's max),
 *    a double that overflows;
 *  - KVT_ERR_TOO_BIG: nesting past the depth limit, a key over 255 bytes,
 *    more than KVT_JSON_MEMBERS_MAX members in the objects open at once, a
 *    string over the caller's buffer, an array over the caller's cap.
 *
 * The text is borrowed and must outlive the parser; it need not be
 * NUL-terminated and is never read at or past len. A kvt_json_t holds no
 * pointer into itself, so it may be copied by assignment to save a position
 * and restore it later (try one reading, fall back to another). Not
 * thread-safe; one parser per thread.
 */
#ifndef KVT_COMMON_JSON_H
#define KVT_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/status.h"

/* Default and largest nesting depth (objects plus arrays open at once). */
#define KVT_JSON_DEPTH_DEFAULT 64u
#define KVT_JSON_DEPTH_LIMIT 256u
/* Longest object key kvt_json_object_next() decodes, in bytes. */
#define KVT_JSON_KEY_MAX 255u
/* Keys remembered for the duplicate check: the members of all objects open at once. */
#define KVT_JSON_MEMBERS_MAX 64u

typedef enum kvt_json_type {
    KVT_JSON_NONE = 0,
    KVT_JSON_OBJECT,
    KVT_JSON_ARRAY,
    KVT_JSON_STRING,
    KVT_JSON_NUMBER,
    KVT_JSON_TRUE,
    KVT_JSON_FALSE,
    KVT_JSON_NULL,
} kvt_json_type_t;

/* Parser state. Fields are private: use the functions below. */
typedef struct kvt_json {
    const char *s;                              /* the text (borrowed) */
    size_t len;                                 /* its length in bytes */
    size_t pos;                                 /* next byte to read, <= len */
    size_t err_off;                             /* byte offset of the first error */
    kvt_status_t err;                           /* KVT_OK until the first error, then that error */
    uint32_t depth;                             /* containers open */
    uint32_t max_depth;                         /* limit on depth */
    int expect;                                 /* what may come next (private enum, json_int.h) */
    uint64_t is_obj[KVT_JSON_DEPTH_LIMIT / 64]; /* bit d: container at depth d+1 is an object */
    char msg[128];                              /* error message; "" when none */
    char key[KVT_JSON_KEY_MAX + 1];             /* the last key, decoded */
    size_t key_len;                             /* its length in bytes */
    uint32_t nmembers;                          /* keys remembered in members[] */
    struct kvt_json_member {
        uint16_t depth; /* of its object: the innermost object's keys are the top run */
        uint16_t len;   /* decoded length, saturated; bit 15: the text has escapes */
        uint32_t hash;  /* seeded hash of the decoded key; 0 until a length matches */
        size_t off;     /* offset of the key's text (after its '"') */
    } members[KVT_JSON_MEMBERS_MAX]; /* keys of the open objects, outermost first */
} kvt_json_t;

/* Starts parsing @text[0..len) (borrowed; NULL is allowed when @len is 0). */
void kvt_json_init(kvt_json_t *j, const char *text, size_t len);

/* Sets the nesting limit; clamped to [1, KVT_JSON_DEPTH_LIMIT]. Call before parsing. */
void kvt_json_set_max_depth(kvt_json_t *j, unsigned max_depth);

/*
 * Type of the next value, skipping whitespace. A value is next at the start,
 * after a key (kvt_json_object_next() returned 1) and after
 * kvt_json_array_next() returned 1. Returns KVT_JSON_NONE where no value is
 * next (inside a container before its _next call, after the top value) and
 * after an error. A byte that cannot start a value, or the end of the input
 * where a value is due, becomes a KVT_ERR_PARSE error and gives NONE. Only
 * the first byte is looked at: the value itself is checked when it is read.
 */
kvt_json_type_t kvt_json_peek(kvt_json_t *j);

/* Consumes '{' where a value is due. KVT_ERR_INVAL for another type,
 * KVT_ERR_TOO_BIG past the depth limit. */
kvt_status_t kvt_json_object_begin(kvt_json_t *j);

/*
 * Next member of the object opened last. Returns 1 with *@key_p / *@klen_p
 * set to the decoded key (NUL-terminated, inside @j, valid until the next
 * call; it may contain NUL bytes from \u0000, hence the length), and the
 * cursor on the member's value, which the caller must read or skip before
 * the next call. Returns 0 when the object ended ('}' consumed), or a
 * negative kvt_status_t (KVT_ERR_TOO_BIG for a key over KVT_JSON_KEY_MAX
 * bytes or past KVT_JSON_MEMBERS_MAX, KVT_ERR_INVAL for a key the object
 * already has). Handles the commas and the ':'. @key_p and @klen_p may be NULL.
 */
int kvt_json_object_next(kvt_json_t *j, const char **key_p, size_t *klen_p);

/*
 * kvt_json_object_next() that decodes the key into @buf[0..cap) instead
 * (NUL-terminated; *@klen_p, may be NULL, gets its length), so that a key of
 * any length can be read: KVT_ERR_TOO_BIG only when it needs more than
 * @cap - 1 bytes (@buf then holds a prefix); KVT_ERR_INVAL when @buf is NULL
 * or @cap is 0. The duplicate check is the same.
 */
int kvt_json_object_next_into(kvt_json_t *j, char *buf, size_t cap, size_t *klen_p);

/* Consumes '[' where a value is due. Errors as kvt_json_object_begin(). */
kvt_status_t kvt_json_array_begin(kvt_json_t *j);

/*
 * Next element of the array opened last: 1 when one follows (the cursor is
 * on it; read or skip it before the next call), 0 at ']' (consumed), or a
 * negative kvt_status_t.
 */
int kvt_json_array_next(kvt_json_t *j);

/* Scalars. Each reads the value that is due; on success sets *v_p and moves
 * past it, on error leaves *v_p alone. Integers accept only integer syntax
 * (no fraction or exponent: KVT_ERR_INVAL); "-0" is 0. */

/* An integer in [0, 2^64-1]; KVT_ERR_RANGE outside. */
kvt_status_t kvt_json_u64(kvt_json_t *j, uint64_t *v_p);
/* An integer in [-2^63, 2^63-1]; KVT_ERR_RANGE outside. */
kvt_status_t kvt_json_i64(kvt_json_t *j, int64_t *v_p);
/* An integer in [0, 2^32-1]; KVT_ERR_RANGE outside. */
kvt_status_t kvt_json_u32(kvt_json_t *j, uint32_t *v_p);
/* An engine block hash: an integer in [0, 2^64-1], or in [-2^63, -1] taken
 * as its two's complement (SGLang's signed ids); KVT_ERR_RANGE outside. */
kvt_status_t kvt_json_hash(kvt_json_t *j, uint64_t *v_p);
/* Any number, correctly rounded; KVT_ERR_RANGE when it overflows a double
 * (underflow gives 0 or a subnormal). */
kvt_status_t kvt_json_double(kvt_json_t *j, double *v_p);
/* true or false. */
kvt_status_t kvt_json_bool(kvt_json_t *j, bool *v_p);
/* null. */
kvt_status_t kvt_json_null(kvt_json_t *j);

/*
 * A string, decoded into @buf[0..cap) and NUL-terminated; *@len_p (may be
 * NULL) gets its length without the NUL (it may contain NUL bytes from
 * \u0000). KVT_ERR_TOO_BIG when it needs more than @cap-1 bytes (@buf then
 * holds a prefix); KVT_ERR_INVAL when @buf is NULL or @cap is 0.
 */
kvt_status_t kvt_json_string(kvt_json_t *j, char *buf, size_t cap, size_t *len_p);

/* Skips the value that is due, of any type, checking it fully (nesting is
 * bounded by the depth limit; keys of any length are fine, duplicate keys
 * are not). */
kvt_status_t kvt_json_skip(kvt_json_t *j);

/* After the top value: only whitespace may remain (else KVT_ERR_PARSE).
 * KVT_ERR_INVAL when the top value has not been read completely. */
kvt_status_t kvt_json_end(kvt_json_t *j);

/*
 * Reads a whole array of integers in [0, @max] (@max <= 2^32-1 in effect)
 * into @out[0..cap) and sets *@n_p to their count. KVT_ERR_TOO_BIG when it
 * has more than @cap elements, KVT_ERR_RANGE when one exceeds @max; other
 * errors as kvt_json_u32(). On error @out may hold a prefix and *@n_p is
 * untouched. A cap from a byte bound is safe: N numbers take >= 2N-1 bytes.
 */
kvt_status_t kvt_json_u32_array(kvt_json_t *j, uint32_t *out, size_t cap, uint32_t max,
                                size_t *n_p);

/* Reads a whole array of hashes (as kvt_json_hash()) into @out[0..cap).
 * Errors as kvt_json_u32_array(). */
kvt_status_t kvt_json_hash_array(kvt_json_t *j, uint64_t *out, size_t cap, size_t *n_p);

/* KVT_OK, or the first error. */
kvt_status_t kvt_json_status(const kvt_json_t *j);

/* The first error's message ("offset N: ..."); "" when there was none.
 * Points into @j. */
const char *kvt_json_error(const kvt_json_t *j);

/* Byte offset of the first error, or of the cursor when there is none. */
size_t kvt_json_offset(const kvt_json_t *j);

/*
 * A place in the text to come back to with kvt_json_rewind(): a few words,
 * where copying the whole reader costs more than a kilobyte.
 */
typedef struct kvt_json_mark {
    size_t pos;
    uint32_t depth;
    uint32_t nmembers;
    int expect;
} kvt_json_mark_t;

/* Remembers where @j is (it must not be in error). */
void kvt_json_mark(const kvt_json_t *j, kvt_json_mark_t *m);

/*
 * Returns @j to mark @m and forgets any error since. Valid while every
 * container open at @m is still open (the reader may be deeper inside them,
 * or have opened and closed others): e.g. to read a value again, or to skip
 * a string that kvt_json_string() found too long for its buffer.
 */
void kvt_json_rewind(kvt_json_t *j, const kvt_json_mark_t *m);

/*
 * Writer: an append-only growing buffer. buf is NUL-terminated whenever it
 * is not NULL (the NUL is not counted in len). The first failed allocation
 * sets oom; from then on appends do nothing until kvt_jbuf_reset(). The
 * caller owns buf between init and cleanup (it may take it and re-init).
 */
typedef struct kvt_jbuf {
    char *buf;  /* malloc'd, NULL until the first append */
    size_t len; /* bytes written */
    size_t cap; /* bytes allocated */
    bool oom;   /* an allocation failed: the content is incomplete */
} kvt_jbuf_t;

/* An empty buffer; allocates nothing. */
void kvt_jbuf_init(kvt_jbuf_t *b);
/* Frees the memory and re-inits @b. */
void kvt_jbuf_cleanup(kvt_jbuf_t *b);
/* len = 0 and oom = false; keeps the memory. */
void kvt_jbuf_reset(kvt_jbuf_t *b);
/* kvt_jbuf_raw() when the buffer must grow (or is out of memory). */
void kvt_jbuf_raw_slow(kvt_jbuf_t *b, const char *s, size_t n);
/* Appends @n bytes as they are. Inline: answers append many short pieces. */
static inline void kvt_jbuf_raw(kvt_jbuf_t *b, const char *s, size_t n)
{
    if (!b->oom && b->cap > b->len && n < b->cap - b->len) {
        memcpy(b->buf + b->len, s, n);
        b->len += n;
        b->buf[b->len] = '\0';
        return;
    }
    kvt_jbuf_raw_slow(b, s, n);
}
/* Appends the NUL-terminated @s as it is. */
static inline void kvt_jbuf_cstr(kvt_jbuf_t *b, const char *s)
{
    kvt_jbuf_raw(b, s, strlen(s)); /* inline: a literal's length is known at compile time */
}
/* Appends @s[0..n) as a quoted JSON string: '"', '\\' and control bytes are
 * escaped; valid UTF-8 is copied; each byte of invalid UTF-8 becomes \ufffd. */
void kvt_jbuf_str(kvt_jbuf_t *b, const char *s, size_t n);
/* kvt_jbuf_u64() for any value and any buffer state. */
void kvt_jbuf_u64_slow(kvt_jbuf_t *b, uint64_t v);
/* Appends a decimal integer. Inline for 0..99, the usual block counts of an answer. */
static inline void kvt_jbuf_u64(kvt_jbuf_t *b, uint64_t v);
void kvt_jbuf_i64(kvt_jbuf_t *b, int64_t v);
/* Appends the shortest text that reads back as exactly @v; NaN and
 * infinities (not JSON) are written as null. */
void kvt_jbuf_f64(kvt_jbuf_t *b, double v);
/*
 * Writing many small pieces with one bounds check: kvt_jbuf_room() returns
 * where the next @n bytes go (NULL, and oom, when the buffer cannot grow);
 * the caller writes at most @n bytes there with the kvt_json_put_* helpers
 * and then calls kvt_jbuf_commit() with the end it reached.
 */
char *kvt_jbuf_room(kvt_jbuf_t *b, size_t n);
static inline void kvt_jbuf_commit(kvt_jbuf_t *b, char *end)
{
    b->len = (size_t)(end - b->buf);
    b->buf[b->len] = '\0';
}
/* Longest text of kvt_json_put_u64/i64 and kvt_json_put_f64. */
#define KVT_JSON_U64_MAX_LEN 20
#define KVT_JSON_F64_MAX_LEN 32
/* kvt_json_put_u64() for any value. */
char *kvt_json_put_u64_slow(char *o, uint64_t v);
/* Writes @v in decimal at @o; returns the end. Inline for 0..99. */
static inline char *kvt_json_put_u64(char *o, uint64_t v)
{
    if (v < 10) {
        *o = (char)('0' + v);
        return o + 1;
    }
    if (v < 100) {
        o[0] = (char)('0' + v / 10);
        o[1] = (char)('0' + v % 10);
        return o + 2;
    }
    return kvt_json_put_u64_slow(o, v);
}
char *kvt_json_put_i64(char *o, int64_t v);
/* Writes kvt_jbuf_f64()'s text for @v at @o; returns the end. */
char *kvt_json_put_f64(char *o, double v);
/* Copies @n bytes to @o; returns the end. */
static inline char *kvt_json_put_raw(char *o, const char *s, size_t n)
{
    memcpy(o, s, n);
    return o + n;
}
/* A string literal's bytes (no NUL). */
#define KVT_JSON_PUT_LIT(o, lit) kvt_json_put_raw((o), (lit), sizeof(lit) - 1)

static inline void kvt_jbuf_u64(kvt_jbuf_t *b, uint64_t v)
{
    if (v < 100 && !b->oom && b->cap > b->len && b->cap - b->len > 3) {
        kvt_jbuf_commit(b, kvt_json_put_u64(b->buf + b->len, v));
        return;
    }
    kvt_jbuf_u64_slow(b, v);
}
/* Appends printf-formatted text as it is (no escaping). */
void kvt_jbuf_printf(kvt_jbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
