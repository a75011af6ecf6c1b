/*
 * common/json_int.h: what the JSON reader's files (json.c: values and
 * containers; json_str.c: strings and keys; json_array.c: number arrays;
 * json_write.c: the writer) share. Private to common/.
 */
#ifndef KVT_COMMON_JSON_INT_H
#define KVT_COMMON_JSON_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/json.h"

/* What may come next (kvt_json_t.expect). */
enum {
    KVT_JSON_X_VALUE = 0, /* a value: start, after ':', after array_next() == 1 */
    KVT_JSON_X_FIRST,     /* just after '{' or '[': the container's _next() */
    KVT_JSON_X_AFTER,     /* after a value inside a container: its _next() */
    KVT_JSON_X_DONE,      /* the top value is complete: kvt_json_end() */
};

#define KVT_JSON_IS_WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')
#define KVT_JSON_IS_DIGIT(c) ((unsigned char)((c) - '0') < 10u)

/* A value was consumed: the container, or the document, continues. */
static inline void kvt_json_value_done(kvt_json_t *j)
{
    j->expect = j->depth == 0 ? KVT_JSON_X_DONE : KVT_JSON_X_AFTER;
}

/* The first error wins: records @st and the message at byte @off unless an error is
 * already recorded; returns the recorded error. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
kvt_status_t
kvt_json_fail(kvt_json_t *j, kvt_status_t st, size_t off, const char *fmt, ...);

/* Describes the byte at @off for a message: "'x'", "byte 0xc3", "end of input". */
const char *kvt_json_got(const kvt_json_t *j, size_t off, char *buf, size_t cap);

/* KVT_ERR_PARSE "expected @what, got <the byte at @off>". */
kvt_status_t kvt_json_expected(kvt_json_t *j, size_t off, const char *what);

/* Checks that a value is due and positions on its first byte. */
kvt_status_t kvt_json_want_value(kvt_json_t *j);

/* The value due is not of the type @want: INVAL naming what it is, or PARSE when the
 * byte starts no value at all. */
kvt_status_t kvt_json_type_error(kvt_json_t *j, const char *want);

/* Reads the string whose '"' is at j->pos into @out (NULL: check only; @cap bytes with
 * the NUL), moving past its closing quote; @what names it in messages. */
kvt_status_t kvt_json_scan_string(kvt_json_t *j, char *out, size_t cap, const char *what,
                                  size_t *len_p);

/* Length of the valid UTF-8 sequence at s[0..n) (2 to 4), or 0 when it is invalid. */
size_t kvt_json_utf8_len(const unsigned char *s, size_t n);

/* Remembers the innermost object's key whose text runs from @kpos ('"') to j->pos,
 * refusing a duplicate; @decoded: the key is also in j->key. */
kvt_status_t kvt_json_member_add(kvt_json_t *j, size_t kpos, bool decoded);

/* Closes the innermost container, whose closing bracket is at j->pos. */
void kvt_json_close(kvt_json_t *j);

/* An unsigned integer in [0, max]; @type names it in range errors. */
kvt_status_t kvt_json_read_uint(kvt_json_t *j, uint64_t max, const char *type, uint64_t *v_p);

#endif
