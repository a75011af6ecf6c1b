/*
 * Strict JSON pull parser and writer. The parser is a hand-written scanner
 * over (s, len): every read is checked against len because HTTP bodies are
 * not NUL-terminated. The state machine in `expect` makes the parser reject
 * malformed text whatever order the caller asks in, so a caller mistake can
 * never make bad JSON look good.
 */
#include "common/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "common/bytes.h"

/* What may come next (kvt_json_t.expect). */
enum {
    KVT_JSON_X_VALUE = 0, /* a value: start, after ':', after array_next() == 1 */
    KVT_JSON_X_FIRST,     /* just after '{' or '[': the container's _next() */
    KVT_JSON_X_AFTER,     /* after a value inside a container: its _next() */
    KVT_JSON_X_DONE,      /* the top value is complete: kvt_json_end() */
};

#define KVT_JSON_IS_WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')
#define KVT_JSON_IS_DIGIT(c) ((unsigned char)((c) - '0') < 10u)

/* ---- errors --------------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static kvt_status_t
kvt_json_fail(kvt_json_t *j, kvt_status_t st, size_t off, const char *fmt, ...)
{
    if (j->err != KVT_OK)
        return j->err;
    int n = snprintf(j->msg, sizeof(j->msg), "offset %zu: ", off);
    if (n > 0 && (size_t)n < sizeof(j->msg)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->msg + n, sizeof(j->msg) - (size_t)n, fmt, ap);
        va_end(ap);
    }
    j->err = st;
    j->err_off = off;
    return st;
}

/* Describes the byte at @off for a message: "'x'", "byte 0xc3", "end of input". */
static const char *kvt_json_got(const kvt_json_t *j, size_t off, char *buf, size_t cap)
{
    if (off >= j->len)
        return "end of input";
    unsigned char c = (unsigned char)j->s[off];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, cap, "'%c'", c);
    else
        snprintf(buf, cap, "byte 0x%02x", c);
    return buf;
}

static kvt_status_t kvt_json_expected(kvt_json_t *j, size_t off, const char *what)
{
    char got[16];
    return kvt_json_fail(j, KVT_ERR_PARSE, off, "expected %s, got %s", what,
                         kvt_json_got(j, off, got, sizeof(got)));
}

/* ---- state helpers -------------------------------------------------------------------- */

static void kvt_json_skip_ws(kvt_json_t *j)
{
    size_t p = j->pos;
    while (p < j->len && KVT_JSON_IS_WS(j->s[p]))
        p++;
    j->pos = p;
}

static bool kvt_json_top_is_obj(const kvt_json_t *j)
{
    uint32_t d = j->depth - 1;
    return (j->is_obj[d / 64] >> (d % 64)) & 1u;
}

/* A value was consumed: the container, or the document, continues. */
static void kvt_json_value_done(kvt_json_t *j)
{
    j->expect = j->depth == 0 ? KVT_JSON_X_DONE : KVT_JSON_X_AFTER;
}

/*
 * Checks that a value is due and positions on its first byte. The end of the
 * input where a value is due is a parse error (the text is truncated).
 */
static kvt_status_t kvt_json_want_value(kvt_json_t *j)
{
    if (j->err != KVT_OK)
        return j->err;
    switch (j->expect) {
    case KVT_JSON_X_VALUE: break;
    case KVT_JSON_X_DONE:
        return kvt_json_fail(j, KVT_ERR_INVAL, j->pos, "no value expected after the top value");
    default:
        return kvt_json_fail(j, KVT_ERR_INVAL, j->pos,
                             "no value expected here: call kvt_json_%s_next() first",
                             kvt_json_top_is_obj(j) ? "object" : "array");
    }
    kvt_json_skip_ws(j);
    if (j->pos >= j->len)
        return kvt_json_expected(j, j->pos, "a value");
    return KVT_OK;
}

static kvt_json_type_t kvt_json_type_at(char c)
{
    switch (c) {
    case '{': return KVT_JSON_OBJECT;
    case '[': return KVT_JSON_ARRAY;
    case '"': return KVT_JSON_STRING;
    case 't': return KVT_JSON_TRUE;
    case 'f': return KVT_JSON_FALSE;
    case 'n': return KVT_JSON_NULL;
    case '-': return KVT_JSON_NUMBER;
    default: return KVT_JSON_IS_DIGIT(c) ? KVT_JSON_NUMBER : KVT_JSON_NONE;
    }
}

/* The value due is not of the type asked for: INVAL naming what it is, or
 * PARSE when the byte starts no value at all. */
static kvt_status_t kvt_json_type_error(kvt_json_t *j, const char *want)
{
    static const char *const names[] = {
        [KVT_JSON_OBJECT] = "an object", [KVT_JSON_ARRAY] = "an array",
        [KVT_JSON_STRING] = "a string",  [KVT_JSON_NUMBER] = "a number",
        [KVT_JSON_TRUE] = "true",        [KVT_JSON_FALSE] = "false",
        [KVT_JSON_NULL] = "null",
    };
    kvt_json_type_t t = kvt_json_type_at(j->s[j->pos]);
    if (t == KVT_JSON_NONE)
        return kvt_json_expected(j, j->pos, "a value");
    return kvt_json_fail(j, KVT_ERR_INVAL, j->pos, "expected %s, got %s", want, names[t]);
}

kvt_json_type_t kvt_json_peek(kvt_json_t *j)
{
    if (j->err != KVT_OK || j->expect != KVT_JSON_X_VALUE)
        return KVT_JSON_NONE;
    if (kvt_json_want_value(j) != KVT_OK)
        return KVT_JSON_NONE;
    kvt_json_type_t t = kvt_json_type_at(j->s[j->pos]);
    if (t == KVT_JSON_NONE)
        kvt_json_expected(j, j->pos, "a value");
    return t;
}

/* ---- init ----------------------------------------------------------------------------- */

void kvt_json_init(kvt_json_t *j, const char *text, size_t len)
{
    j->s = text;
    j->len = text == NULL ? 0 : len;
    j->pos = 0;
    j->err_off = 0;
    j->err = KVT_OK;
    j->depth = 0;
    j->max_depth = KVT_JSON_DEPTH_DEFAULT;
    j->expect = KVT_JSON_X_VALUE;
    memset(j->is_obj, 0, sizeof(j->is_obj));
    j->msg[0] = '\0';
    j->key[0] = '\0';
    j->key_len = 0;
    j->nmembers = 0;
}

void kvt_json_set_max_depth(kvt_json_t *j, unsigned max_depth)
{
    if (max_depth < 1)
        max_depth = 1;
    if (max_depth > KVT_JSON_DEPTH_LIMIT)
        max_depth = KVT_JSON_DEPTH_LIMIT;
    j->max_depth = max_depth;
}

kvt_status_t kvt_json_status(const kvt_json_t *j)
{
    return j->err;
}

const char *kvt_json_error(const kvt_json_t *j)
{
    return j->err == KVT_OK ? "" : j->msg;
}

size_t kvt_json_offset(const kvt_json_t *j)
{
    return j->err == KVT_OK ? j->pos : j->err_off;
}

void kvt_json_mark(const kvt_json_t *j, kvt_json_mark_t *m)
{
    *m = (kvt_json_mark_t){j->pos, j->depth, j->nmembers, j->expect};
}

void kvt_json_rewind(kvt_json_t *j, const kvt_json_mark_t *m)
{
    /* the open containers' is_obj bits and remembered keys below the mark are intact */
    j->pos = m->pos;
    j->depth = m->depth;
    j->nmembers = m->nmembers;
    j->expect = m->expect;
    j->err = KVT_OK;
    j->err_off = 0;
    j->msg[0] = '\0';
}

/* ---- strings -------------------------------------------------------------------------- */

/*
 * Length of the valid UTF-8 sequence at s[0..n) (2 to 4; the caller handles
 * ASCII), or 0 when it is invalid: a stray continuation byte, an overlong
 * form, an encoded surrogate, a code point above U+10FFFF, or a truncation.
 * Ranges from Unicode's table of well-formed byte sequences.
 */
static size_t kvt_json_utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    unsigned char lo = 0x80, hi = 0xbf;
    size_t k;

    if (c >= 0xc2 && c <= 0xdf) {
        k = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        k = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        k = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return 0;
    }
    if (n < k || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < k; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return k;
}

/* Four hex digits at s[p..p+4) (the caller checked bounds), or -1. */
static long kvt_json_hex4(const char *s, size_t p)
{
    long v = 0;
    for (size_t i = 0; i < 4; i++) {
        unsigned char c = (unsigned char)s[p + i];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A \u escape at s[p] ('\\'): sets *cp and *end (past it and any low half). */
static kvt_status_t kvt_json_unicode_escape(kvt_json_t *j, size_t p, uint32_t *cp, size_t *end)
{
    if (j->len - p < 6)
        return kvt_json_fail(j, KVT_ERR_PARSE, p, "truncated \\u escape");
    long hi = kvt_json_hex4(j->s, p + 2);
    if (hi < 0)
        return kvt_json_fail(j, KVT_ERR_PARSE, p, "invalid \\u escape: need 4 hex digits");
    if (hi >= 0xdc00 && hi <= 0xdfff)
        return kvt_json_fail(j, KVT_ERR_PARSE, p, "lone low surrogate \\u%04lx", hi);
    if (hi < 0xd800 || hi > 0xdbff) {
        *cp = (uint32_t)hi;
        *end = p + 6;
        return KVT_OK;
    }
    /* A high surrogate must be followed by an escaped low one. */
    size_t q = p + 6;
    long lo = -1;
    if (j->len - q >= 6 && j->s[q] == '\\' && j->s[q + 1] == 'u')
        lo = kvt_json_hex4(j->s, q + 2);
    if (lo < 0xdc00 || lo > 0xdfff)
        return kvt_json_fail(j, KVT_ERR_PARSE, p, "lone high surrogate \\u%04lx", hi);
    *cp = 0x10000u + (((uint32_t)hi - 0xd800u) << 10) + ((uint32_t)lo - 0xdc00u);
    *end = q + 6;
    return KVT_OK;
}

static size_t kvt_json_utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/*
 * Decodes the string at j->pos ('"') into out[0..cap) (NUL-terminated), or
 * only checks it when @out is NULL. @what names it in the TOO_BIG message.
 * On success moves past the closing quote and sets *@len_p.
 */
static kvt_status_t kvt_json_scan_string(kvt_json_t *j, char *out, size_t cap, const char *what,
                                         size_t *len_p)
{
    const char *s = j->s;
    const size_t len = j->len, start = j->pos;
    const size_t room = out == NULL ? SIZE_MAX : cap - 1; /* bytes that fit before the NUL */
    size_t p = start + 1, o = 0;

    for (;;) {
        /* The common case: a run of printable ASCII. */
        size_t q = p;
        while (q < len) {
            unsigned char c = (unsigned char)s[q];
            if (c < 0x20 || c == '"' || c == '\\' || c >= 0x80)
                break;
            q++;
        }
        if (q > p) {
            if (q - p > room - o)
                goto too_big;
            if (out != NULL)
                memcpy(out + o, s + p, q - p);
            o += q - p;
            p = q;
        }
        if (p >= len)
            return kvt_json_fail(j, KVT_ERR_PARSE, len, "unterminated string (opened at %zu)",
                                 start);
        unsigned char c = (unsigned char)s[p];
        char tmp[4];
        size_t k;
        if (c == '"') {
            break;
        } else if (c == '\\') {
            if (p + 1 >= len)
                return kvt_json_fail(j, KVT_ERR_PARSE, len, "unterminated string (opened at %zu)",
                                     start);
            char e = s[p + 1];
            k = 1;
            switch (e) {
            case '"': tmp[0] = '"'; break;
            case '\\': tmp[0] = '\\'; break;
            case '/': tmp[0] = '/'; break;
            case 'b': tmp[0] = '\b'; break;
            case 'f': tmp[0] = '\f'; break;
            case 'n': tmp[0] = '\n'; break;
            case 'r': tmp[0] = '\r'; break;
            case 't': tmp[0] = '\t'; break;
            case 'u': {
                uint32_t cp = 0;
                size_t end = p;
                kvt_status_t st = kvt_json_unicode_escape(j, p, &cp, &end);
                if (st != KVT_OK)
                    return st;
                k = kvt_json_utf8_put(cp, tmp);
                if (k > room - o)
                    goto too_big;
                if (out != NULL)
                    memcpy(out + o, tmp, k);
                o += k;
                p = end;
                continue;
            }
            default: {
                char got[16];
                return kvt_json_fail(j, KVT_ERR_PARSE, p, "invalid escape: '\\' then %s",
                                     kvt_json_got(j, p + 1, got, sizeof(got)));
            }
            }
            if (k > room - o)
                goto too_big;
            if (out != NULL)
                out[o] = tmp[0];
            o++;
            p += 2;
        } else if (c < 0x20) {
            return kvt_json_fail(j, KVT_ERR_PARSE, p, "control byte 0x%02x in a string", c);
        } else {
            k = kvt_json_utf8_len((const unsigned char *)s + p, len - p);
            if (k == 0)
                return kvt_json_fail(j, KVT_ERR_PARSE, p, "invalid UTF-8 in a string");
            if (k > room - o)
                goto too_big;
            if (out != NULL)
                memcpy(out + o, s + p, k);
            o += k;
            p += k;
        }
    }
    if (out != NULL)
        out[o] = '\0';
    j->pos = p + 1;
    if (len_p != NULL)
        *len_p = o;
    return KVT_OK;

too_big:
    return kvt_json_fail(j, KVT_ERR_TOO_BIG, start, "%s longer than %zu bytes", what, room);
}

kvt_status_t kvt_json_string(kvt_json_t *j, char *buf, size_t cap, size_t *len_p)
{
    kvt_status_t st = kvt_json_want_value(j);
    if (st != KVT_OK)
        return st;
    if (buf == NULL || cap == 0)
        return kvt_json_fail(j, KVT_ERR_INVAL, j->pos, "kvt_json_string() needs a buffer");
    if (j->s[j->pos] != '"')
        return kvt_json_type_error(j, "a string");
    size_t n;
    st = kvt_json_scan_string(j, buf, cap, "string", &n);
    if (st != KVT_OK)
        return st;
    kvt_json_value_done(j);
    if (len_p != NULL)
        *len_p = n;
    return KVT_OK;
}

/* ---- numbers -------------------------------------------------------------------------- */

typedef struct kvt_json_num {
    size_t start, end; /* the number's text */
    bool neg;          /* leading '-' */
    bool frac_or_exp;  /* has a fraction or an exponent: not an integer literal */
    bool ovf;          /* the integer part does not fit 64 bits */
    uint64_t mag;      /* the integer part's magnitude when !ovf */
} kvt_json_num_t;

/* Scans the number at j->pos by RFC 8259's grammar; does not move. */
static kvt_status_t kvt_json_scan_number(kvt_json_t *j, kvt_json_num_t *n)
{
    const char *s = j->s;
    const size_t len = j->len;
    size_t p = j->pos;

    n->start = p;
    n->neg = false;
    n->frac_or_exp = false;
    n->ovf = false;
    n->mag = 0;
    if (s[p] == '-') {
        n->neg = true;
        p++;
    }
    if (p >= len || !KVT_JSON_IS_DIGIT(s[p]))
        return kvt_json_expected(j, p, "a digit");
    if (s[p] == '0') {
        p++;
        if (p < len && KVT_JSON_IS_DIGIT(s[p]))
            return kvt_json_fail(j, KVT_ERR_PARSE, n->start, "leading zeros are not allowed");
    } else {
        uint64_t m = 0;
        while (p < len && KVT_JSON_IS_DIGIT(s[p])) {
            unsigned d = (unsigned)(s[p] - '0');
            if (m > (UINT64_MAX - d) / 10)
                n->ovf = true;
            else
                m = m * 10 + d;
            p++;
        }
        n->mag = m;
    }
    if (p < len && s[p] == '.') {
        p++;
        if (p >= len || !KVT_JSON_IS_DIGIT(s[p]))
            return kvt_json_expected(j, p, "a digit after '.'");
        while (p < len && KVT_JSON_IS_DIGIT(s[p]))
            p++;
        n->frac_or_exp = true;
    }
    if (p < len && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        if (p < len && (s[p] == '+' || s[p] == '-'))
            p++;
        if (p >= len || !KVT_JSON_IS_DIGIT(s[p]))
            return kvt_json_expected(j, p, "a digit in the exponent");
        while (p < len && KVT_JSON_IS_DIGIT(s[p]))
            p++;
        n->frac_or_exp = true;
    }
    n->end = p;
    return KVT_OK;
}

static kvt_status_t kvt_json_range_error(kvt_json_t *j, const kvt_json_num_t *n, const char *type)
{
    size_t w = n->end - n->start;
    return kvt_json_fail(j, KVT_ERR_RANGE, n->start, "%.*s%s is out of range for %s",
                         (int)(w > 24 ? 24 : w), j->s + n->start, w > 24 ? "..." : "", type);
}

/* Scans an integer literal that is due; @want names the type for messages. */
static kvt_status_t kvt_json_int_literal(kvt_json_t *j, const char *want, kvt_json_num_t *n)
{
    kvt_status_t st = kvt_json_want_value(j);
    if (st != KVT_OK)
        return st;
    char c = j->s[j->pos];
    if (c != '-' && !KVT_JSON_IS_DIGIT(c))
        return kvt_json_type_error(j, want);
    st = kvt_json_scan_number(j, n);
    if (st != KVT_OK)
        return st;
    if (n->frac_or_exp)
        return kvt_json_fail(j, KVT_ERR_INVAL, n->start,
                             "expected %s, got a number with a fraction or exponent", want);
    return KVT_OK;
}

/* An unsigned integer in [0, max]; @type names it in range errors. */
static kvt_status_t kvt_json_read_uint(kvt_json_t *j, uint64_t max, const char *type, uint64_t *v_p)
{
    kvt_json_num_t n;
    kvt_status_t st = kvt_json_int_literal(j, "an unsigned integer", &n);
    if (st != KVT_OK)
        return st;
    if (n.ovf || n.mag > max || (n.neg && n.mag != 0))
        return kvt_json_range_error(j, &n, type);
    j->pos = n.end;
    kvt_json_value_done(j);
    *v_p = n.mag;
    return KVT_OK;
}

kvt_status_t kvt_json_u64(kvt_json_t *j, uint64_t *v_p)
{
    return kvt_json_read_uint(j, UINT64_MAX, "a u64", v_p);
}

kvt_status_t kvt_json_u32(kvt_json_t *j, uint32_t *v_p)
{
    uint64_t v = 0;
    kvt_status_t st = kvt_json_read_uint(j, UINT32_MAX, "a u32", &v);
    if (st == KVT_OK)
        *v_p = (uint32_t)v;
    return st;
}

kvt_status_t kvt_json_i64(kvt_json_t *j, int64_t *v_p)
{
    kvt_json_num_t n;
    kvt_status_t st = kvt_json_int_literal(j, "an integer", &n);
    if (st != KVT_OK)
        return st;
    uint64_t lim = n.neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (n.ovf || n.mag > lim)
        return kvt_json_range_error(j, &n, "an i64");
    j->pos = n.end;
    kvt_json_value_done(j);
    /* -(2^63) has no positive int64 counterpart: negate in unsigned arithmetic. */
    *v_p = n.neg ? (int64_t)(0 - n.mag) : (int64_t)n.mag;
    return KVT_OK;
}

kvt_status_t kvt_json_hash(kvt_json_t *j, uint64_t *v_p)
{
    kvt_json_num_t n;
    kvt_status_t st = kvt_json_int_literal(j, "an integer hash", &n);
    if (st != KVT_OK)
        return st;
    if (n.ovf || (n.neg && n.mag > (uint64_t)INT64_MAX + 1))
        return kvt_json_range_error(j, &n, "a hash (u64 or i64)");
    j->pos = n.end;
    kvt_json_value_done(j);
    *v_p = n.neg ? 0 - n.mag : n.mag;
    return KVT_OK;
}

/*
 * Converts a checked number to a double. strtod() wants a NUL-terminated
 * string and honours the locale's decimal point, so the number is rewritten
 * as "[-]DIGITSeEXP" in a local buffer. Only the first 780 significant
 * digits are kept, with a trailing 1 standing in for any nonzero digit after
 * them; 780 exceeds the 767 digits a correctly rounded decision can depend on.
 */
static kvt_status_t kvt_json_num_to_double(kvt_json_t *j, const kvt_json_num_t *n, double *v_p)
{
    enum { KEEP = 780 };
    char buf[KEEP + 40];
    const char *s = j->s;
    size_t p = n->start, o = 0, kept = 0;
    int64_t exp10 = 0; /* value = digits * 10^exp10 */
    bool sticky = false, seen_nonzero = false, in_frac = false;

    if (n->neg) {
        buf[o++] = '-';
        p++;
    }
    for (; p < n->end; p++) {
        char c = s[p];
        if (c == '.') {
            in_frac = true;
            continue;
        }
        if (!KVT_JSON_IS_DIGIT(c))
            break;
        if (in_frac)
            exp10--;
        if (c == '0' && !seen_nonzero)
            continue; /* leading zeros carry no digits */
        seen_nonzero = true;
        if (kept < KEEP) {
            buf[o++] = c;
            kept++;
        } else {
            exp10++; /* a dropped digit still scales the ones kept */
            if (c != '0')
                sticky = true;
        }
    }
    if (sticky) {
        buf[o++] = '1';
        exp10--;
    }
    if (kept == 0)
        buf[o++] = '0';
    if (p < n->end) {
        /* Exponent, saturated: anything past 10^9 is 0 or infinity anyway. */
        p++;
        bool eneg = false;
        if (s[p] == '+' || s[p] == '-')
            eneg = s[p++] == '-';
        int64_t e = 0;
        for (; p < n->end; p++)
            if (e < 1000000000)
                e = e * 10 + (s[p] - '0');
        exp10 += eneg ? -e : e;
    }
    if (exp10 > 2000000000)
        exp10 = 2000000000;
    if (exp10 < -2000000000)
        exp10 = -2000000000;
    snprintf(buf + o, sizeof(buf) - o, "e%lld", (long long)exp10);
    double v = strtod(buf, NULL);
    if (isinf(v))
        return kvt_json_range_error(j, n, "a double");
    *v_p = v;
    return KVT_OK;
}

kvt_status_t kvt_json_double(kvt_json_t *j, double *v_p)
{
    kvt_status_t st = kvt_json_want_value(j);
    if (st != KVT_OK)
        return st;
    if (kvt_json_type_at(j->s[j->pos]) != KVT_JSON_NUMBER)
        return kvt_json_type_error(j, "a number");
    kvt_json_num_t n;
    double v;
    st = kvt_json_scan_number(j, &n);
    if (st == KVT_OK)
        st = kvt_json_num_to_double(j, &n, &v);
    if (st != KVT_OK)
        return st;
    j->pos = n.end;
    kvt_json_value_done(j);
    *v_p = v;
    return KVT_OK;
}

/* ---- literals ------------------------------------------------------------------------- */

static kvt_status_t kvt_json_literal(kvt_json_t *j, const char *word, size_t n)
{
    if (j->len - j->pos < n || memcmp(j->s + j->pos, word, n) != 0)
        return kvt_json_fail(j, KVT_ERR_PARSE, j->pos, "invalid literal (expected %s)", word);
    j->pos += n;
    kvt_json_value_done(j);
    return KVT_OK;
}

kvt_status_t kvt_json_bool(kvt_json_t *j, bool *v_p)
{
    kvt_status_t st = kvt_json_want_value(j);
    if (st != KVT_OK)
        return st;
    char c = j->s[j->pos];
    if (c == 't')
        st = kvt_json_literal(j, "true", 4);
    else if (c == 'f')
        st = kvt_json_literal(j, "false", 5);
    else
        return kvt_json_type_error(j, "a boolean");
    if (st == KVT_OK)
        *v_p = c == 't';
    return st;
}

kvt_status_t kvt_json_null(kvt_json_t *j)
{
    kvt_status_t st = kvt_json_want_value(j);
    if (st != KVT_OK)
        return st;
    if (j->s[j->pos] != 'n')
        return kvt_json_type_error(j, "null");
    return kvt_json_literal(j, "null", 4);
}

/* ---- containers ----------------------------------------------------------------------- */

/* Opens the container at j->pos (its bracket already checked). */
static kvt_status_t kvt_json_open(kvt_json_t *j, bool obj)
{
    if (j->depth >= j->max_depth)
        return kvt_json_fail(j, KVT_ERR_TOO_BIG, j->pos, "nesting deeper than %u", j->max_depth);
    uint32_t d = j->depth;
    if (obj)
        j->is_obj[d / 64] |= UINT64_C(1) << (d % 64);
    else
        j->is_obj[d / 64] &= ~(UINT64_C(1) << (d % 64));
    j->depth++;
    j->pos++;
    j->expect = KVT_JSON_X_FIRST;
    return KVT_OK;
}

static void kvt_json_close(kvt_json_t *j)
{
    while (j->nmembers > 0 && j->members[j->nmembers - 1].depth == j->depth)
        j->nmembers--; /* a closing object's keys are forgotten */
    j->pos++;
    j->depth--;
    kvt_json_value_done(j);
}

kvt_status_t kvt_json_object_begin(kvt_json_t *j)
{
    kvt_status_t st = kvt_json_want_value(j);
    if (st != KVT_OK)
        return st;
    if (j->s[j->pos] != '{')
        return kvt_json_type_error(j, "an object");
    return kvt_json_open(j, true);
}

kvt_status_t kvt_json_array_begin(kvt_json_t *j)
{
    kvt_status_t st = kvt_json_want_value(j);
    if (st != KVT_OK)
        return st;
    if (j->s[j->pos] != '[')
        return kvt_json_type_error(j, "an array");
    return kvt_json_open(j, false);
}

/* The container's _next() is due and the innermost container is of the kind
 * asked for; otherwise a usage error. */
static kvt_status_t kvt_json_want_next(kvt_json_t *j, bool obj)
{
    if (j->err != KVT_OK)
        return j->err;
    if (j->depth == 0 || kvt_json_top_is_obj(j) != obj)
        return kvt_json_fail(j, KVT_ERR_INVAL, j->pos, "not inside an %s",
                             obj ? "object" : "array");
    if (j->expect == KVT_JSON_X_VALUE)
        return kvt_json_fail(j, KVT_ERR_INVAL, j->pos, "the %s value was not read",
                             obj ? "member's" : "element's");
    return KVT_OK;
}

/*
 * Duplicate keys. A key is remembered by the offset of its text, so any two
 * keys can be compared exactly after decoding, whatever their length (skipped
 * objects' keys are not decoded into j->key). The helpers below read strings
 * that kvt_json_scan_string() has already checked, so they need no bounds or
 * syntax checks of their own.
 */

/* The next decoded bytes (1..4) of the checked string text at *@p, moving past
 * them; 0 at the closing quote. Raw UTF-8 comes one byte a call. */
static size_t kvt_json_str_unit(const char *s, size_t *p, char out[4])
{
    char c = s[*p];
    if (c == '"')
        return 0;
    if (c != '\\') {
        out[0] = c;
        (*p)++;
        return 1;
    }
    char e = s[*p + 1];
    if (e == 'u') {
        uint32_t cp = (uint32_t)kvt_json_hex4(s, *p + 2);
        *p += 6;
        if (cp >= 0xd800 && cp <= 0xdbff) { /* checked: an escaped low half follows */
            uint32_t lo = (uint32_t)kvt_json_hex4(s, *p + 2);
            *p += 6;
            cp = 0x10000u + ((cp - 0xd800u) << 10) + (lo - 0xdc00u);
        }
        return kvt_json_utf8_put(cp, out);
    }
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *at = strchr(from, e);
    out[0] = at != NULL ? to[at - from] : e;
    *p += 2;
    return 1;
}

/* A remembered key's length word: its decoded length (saturated: a filter only), and
 * whether its text holds escapes (decoded != raw). */
#define KVT_JSON_KEY_ESCAPED 0x8000u
#define KVT_JSON_KEY_LEN_MAX 0x7fffu

/*
 * The key hash: every decoded byte, a word at a time, from a per-process seed
 * (where the loader put this code: ASLR), so a client cannot choose keys that
 * all collide and make every comparison an exact one. Computed only for keys
 * whose lengths match (most objects have none), and never 0 (0: not computed
 * yet). Only a filter: equal hashes are confirmed by kvt_json_key_eq().
 */
static uint64_t kvt_json_key_seed(void)
{
    static const char anchor;
    return (uint64_t)(uintptr_t)&anchor * UINT64_C(0xff51afd7ed558ccd);
}

static uint64_t kvt_json_key_round(uint64_t h, uint64_t w)
{
    h = (h ^ w) * UINT64_C(0x9e3779b97f4a7c15);
    return h ^ (h >> 29);
}

static uint32_t kvt_json_key_final(uint64_t h, uint64_t w, size_t n)
{
    h = kvt_json_key_round(h, w ^ ((uint64_t)n << 56));
    h *= UINT64_C(0xc2b2ae3d27d4eb4f);
    return (uint32_t)(h >> 32) | 1u;
}

/* The hash of the decoded key @k[0..n). */
static uint32_t kvt_json_key_hash(const char *k, size_t n)
{
    uint64_t h = kvt_json_key_seed(), w = 0;
    size_t i = 0;
    /* little-endian words: the byte order kvt_json_key_hash_text() accumulates in */
    for (; i + 8 <= n; i += 8)
        h = kvt_json_key_round(h, kvt_load_le(k + i, 8));
    size_t rem = n - i; /* the last rem bytes as the low bytes of w, by fixed-size loads */
    if (rem > 0 && n >= 8) {
        w = kvt_load_le(k + n - 8, 8) >> (8 * (8 - rem));
    } else if (rem >= 4) {
        w = kvt_load_le(k + i, 4) | (kvt_load_le(k + n - 4, 4) >> (8 * (8 - rem))) << 32;
    } else {
        for (unsigned b = 0; i < n; i++, b++)
            w |= (uint64_t)(unsigned char)k[i] << (8 * b);
    }
    return kvt_json_key_final(h, w, n);
}

/* kvt_json_key_hash() of the key text at @p with its escapes decoded (any length). */
static uint32_t kvt_json_key_hash_text(const char *s, size_t p)
{
    uint64_t h = kvt_json_key_seed(), w = 0;
    size_t n = 0, k;
    char u[4];
    while ((k = kvt_json_str_unit(s, &p, u)) > 0)
        for (size_t i = 0; i < k; i++, n++) {
            w |= (uint64_t)(unsigned char)u[i] << (8 * (n % 8));
            if (n % 8 == 7) {
                h = kvt_json_key_round(h, w);
                w = 0;
            }
        }
    return kvt_json_key_final(h, w, n);
}

/* The decoded length of the key text at @p. */
static size_t kvt_json_key_len_text(const char *s, size_t p)
{
    size_t n = 0, k;
    char u[4];
    while ((k = kvt_json_str_unit(s, &p, u)) > 0)
        n += k;
    return n;
}

/* Whether the key texts at @a and @b (after their '"') decode to the same bytes;
 * @esc_a / @esc_b: whether each holds escapes. */
static bool kvt_json_key_eq(const kvt_json_t *j, size_t a, bool esc_a, size_t b, bool esc_b)
{
    const char *s = j->s;
    if (!esc_a && !esc_b) {
        /* no escapes: the text is the key, and it ends at the first quote */
        const char *ea = memchr(s + a, '"', j->len - a), *eb = memchr(s + b, '"', j->len - b);
        return ea - (s + a) == eb - (s + b) && memcmp(s + a, s + b, (size_t)(ea - (s + a))) == 0;
    }
    char ua[4], ub[4];
    size_t na = 0, ia = 0, nb = 0, ib = 0;
    for (;;) {
        if (ia == na) {
            na = kvt_json_str_unit(s, &a, ua);
            ia = 0;
        }
        if (ib == nb) {
            nb = kvt_json_str_unit(s, &b, ub);
            ib = 0;
        }
        if (na == 0 || nb == 0)
            return na == 0 && nb == 0;
        if (ua[ia++] != ub[ib++])
            return false;
    }
}

/* The decoded key at @p for a one-line message: control bytes and quotes as '?',
 * cut (at a UTF-8 boundary) to fit @cap. */
static void kvt_json_key_shown(const char *s, size_t p, char *out, size_t cap)
{
    size_t o = 0, n;
    char u[4];
    bool cut = false;
    while ((n = kvt_json_str_unit(s, &p, u)) > 0) {
        if (o + n + 4 > cap) {
            cut = true;
            break;
        }
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)u[i];
            out[o++] = c < 0x20 || c == 0x7f || c == '\'' ? '?' : (char)c;
        }
    }
    if (cut) {
        /* drop a multi-byte character the cut may have split (raw UTF-8 comes bytewise) */
        while (o > 0 && ((unsigned char)out[o - 1] & 0xc0) == 0x80)
            o--;
        if (o > 0 && (unsigned char)out[o - 1] >= 0xc0)
            o--;
        out[o++] = '.', out[o++] = '.', out[o++] = '.';
    }
    out[o] = '\0';
}

/* The hash of remembered key @i, computed on first use. */
static uint32_t kvt_json_member_hash(kvt_json_t *j, uint32_t i)
{
    if (j->members[i].hash == 0) {
        uint32_t len = j->members[i].len;
        size_t off = j->members[i].off;
        /* the text is the key when it has no escapes, unless the length saturated */
        j->members[i].hash = len < KVT_JSON_KEY_LEN_MAX ? kvt_json_key_hash(j->s + off, len)
                                                        : kvt_json_key_hash_text(j->s, off);
    }
    return j->members[i].hash;
}

/*
 * Remembers the key of the innermost object whose text is @kpos ('"') to
 * j->pos (past its closing quote), refusing one the object already has. With
 * @decoded the key is also in j->key (key_len bytes). Keys are told apart by
 * their decoded lengths first, then by hash, and only equal hashes are
 * compared byte by byte.
 */
static kvt_status_t kvt_json_member_add(kvt_json_t *j, size_t kpos, bool decoded)
{
    const char *raw = j->s + kpos + 1;
    size_t raw_len = j->pos - kpos - 2, dlen;
    bool esc;
    if (decoded) {
        dlen = j->key_len;
        esc = raw_len != dlen; /* every escape is longer than what it decodes to */
    } else {
        esc = memchr(raw, '\\', raw_len) != NULL;
        dlen = esc ? kvt_json_key_len_text(j->s, kpos + 1) : raw_len;
    }
    uint16_t len = dlen > KVT_JSON_KEY_LEN_MAX ? KVT_JSON_KEY_LEN_MAX : (uint16_t)dlen;
    uint32_t h = 0; /* this key's hash, once a length matches */
    for (uint32_t i = j->nmembers; i-- > 0 && j->members[i].depth == j->depth;) {
        if ((j->members[i].len & KVT_JSON_KEY_LEN_MAX) != len)
            continue;
        if (h == 0)
            h = decoded ? kvt_json_key_hash(j->key, dlen)
                : esc   ? kvt_json_key_hash_text(j->s, kpos + 1)
                        : kvt_json_key_hash(raw, raw_len);
        if (kvt_json_member_hash(j, i) == h &&
            kvt_json_key_eq(j, j->members[i].off, (j->members[i].len & KVT_JSON_KEY_ESCAPED) != 0,
                            kpos + 1, esc)) {
            char shown[48];
            kvt_json_key_shown(j->s, kpos + 1, shown, sizeof(shown));
            return kvt_json_fail(j, KVT_ERR_INVAL, kpos, "duplicate field '%s'", shown);
        }
    }
    if (j->nmembers >= KVT_JSON_MEMBERS_MAX)
        return kvt_json_fail(j, KVT_ERR_TOO_BIG, kpos,
                             "more than %u members in the objects open at once",
                             KVT_JSON_MEMBERS_MAX);
    j->members[j->nmembers++] = (struct kvt_json_member){
        (uint16_t)j->depth, (uint16_t)(len | (esc ? KVT_JSON_KEY_ESCAPED : 0)), h, kpos + 1};
    return KVT_OK;
}

/* kvt_json_object_next() that decodes the key when @want_key (else only checks it). */
static int kvt_json_obj_next(kvt_json_t *j, bool want_key)
{
    kvt_status_t st = kvt_json_want_next(j, true);
    if (st != KVT_OK)
        return st;
    kvt_json_skip_ws(j);
    if (j->pos < j->len && j->s[j->pos] == '}') {
        kvt_json_close(j);
        return 0;
    }
    if (j->expect == KVT_JSON_X_AFTER) {
        if (j->pos >= j->len || j->s[j->pos] != ',')
            return kvt_json_expected(j, j->pos, "',' or '}'");
        j->pos++;
        kvt_json_skip_ws(j);
        if (j->pos >= j->len || j->s[j->pos] != '"')
            return kvt_json_expected(j, j->pos, "a key");
    } else if (j->pos >= j->len || j->s[j->pos] != '"') {
        return kvt_json_expected(j, j->pos, "a key or '}'");
    }
    size_t klen = 0, kpos = j->pos;
    st = kvt_json_scan_string(j, want_key ? j->key : NULL, sizeof(j->key), "key", &klen);
    if (st != KVT_OK)
        return st;
    j->key_len = klen;
    st = kvt_json_member_add(j, kpos, want_key);
    if (st != KVT_OK)
        return st;
    kvt_json_skip_ws(j);
    if (j->pos >= j->len || j->s[j->pos] != ':')
        return kvt_json_expected(j, j->pos, "':'");
    j->pos++;
    j->expect = KVT_JSON_X_VALUE;
    return 1;
}

int kvt_json_object_next(kvt_json_t *j, const char **key_p, size_t *klen_p)
{
    int r = kvt_json_obj_next(j, true);
    if (r == 1) {
        if (key_p != NULL)
            *key_p = j->key;
        if (klen_p != NULL)
            *klen_p = j->key_len;
    }
    return r;
}

int kvt_json_array_next(kvt_json_t *j)
{
    kvt_status_t st = kvt_json_want_next(j, false);
    if (st != KVT_OK)
        return st;
    kvt_json_skip_ws(j);
    if (j->pos < j->len && j->s[j->pos] == ']') {
        kvt_json_close(j);
        return 0;
    }
    if (j->expect == KVT_JSON_X_AFTER) {
        if (j->pos >= j->len || j->s[j->pos] != ',')
            return kvt_json_expected(j, j->pos, "',' or ']'");
        j->pos++;
    }
    j->expect = KVT_JSON_X_VALUE;
    return 1;
}

/* ---- skip ----------------------------------------------------------------------------- */

/* Consumes the scalar due at j->pos, or opens the container there. */
static kvt_status_t kvt_json_skip_one(kvt_json_t *j)
{
    kvt_status_t st = kvt_json_want_value(j);
    if (st != KVT_OK)
        return st;
    switch (j->s[j->pos]) {
    case '{': return kvt_json_open(j, true);
    case '[': return kvt_json_open(j, false);
    case '"': st = kvt_json_scan_string(j, NULL, 0, "string", NULL); break;
    case 't': return kvt_json_literal(j, "true", 4);
    case 'f': return kvt_json_literal(j, "false", 5);
    case 'n': return kvt_json_literal(j, "null", 4);
    default:
        if (j->s[j->pos] != '-' && !KVT_JSON_IS_DIGIT(j->s[j->pos]))
            return kvt_json_expected(j, j->pos, "a value");
        kvt_json_num_t n;
        st = kvt_json_scan_number(j, &n);
        if (st == KVT_OK)
            j->pos = n.end;
        break;
    }
    if (st == KVT_OK)
        kvt_json_value_done(j);
    return st;
}

kvt_status_t kvt_json_skip(kvt_json_t *j)
{
    const uint32_t base = j->depth;
    /* Iterative, so the depth limit bounds the work, not the C stack. */
    do {
        if (j->err != KVT_OK)
            return j->err;
        if (j->expect == KVT_JSON_X_VALUE) {
            kvt_json_skip_one(j);
        } else if (j->depth > base) {
            if (kvt_json_top_is_obj(j))
                kvt_json_obj_next(j, false);
            else
                kvt_json_array_next(j);
        } else {
            return kvt_json_want_value(j); /* nothing due to skip: the usage error */
        }
    } while (j->depth > base);
    return j->err;
}

kvt_status_t kvt_json_end(kvt_json_t *j)
{
    if (j->err != KVT_OK)
        return j->err;
    if (j->expect != KVT_JSON_X_DONE)
        return kvt_json_fail(j, KVT_ERR_INVAL, j->pos, "the top value was not read to its end");
    kvt_json_skip_ws(j);
    if (j->pos < j->len)
        return kvt_json_expected(j, j->pos, "end of input");
    return KVT_OK;
}

/* ---- number arrays -------------------------------------------------------------------- */

/*
 * Number of leading ASCII digits in the eight bytes at @s (8: all of them).
 * a = byte ^ '0' is 0..9 for a digit; a + 0x76 sets the high bit from 10
 * up, and a high bit already set marks the rest. Carries only reach bytes
 * after the first non-digit, which do not count.
 */
static inline unsigned kvt_json_digit_run(const char *s)
{
    uint64_t x;
    memcpy(&x, s, 8);
    uint64_t a = x ^ 0x3030303030303030ull;
    uint64_t nd = (a | (a + 0x7676767676767676ull)) & 0x8080808080808080ull;
    return nd ? (unsigned)__builtin_ctzll(nd) >> 3 : 8;
}

/* Value of the @k (1..8) ASCII digits at @s; eight bytes must be readable there. */
static inline uint32_t kvt_json_swar_digits(const char *s, unsigned k)
{
    uint64_t a;
    memcpy(&a, s, 8);
    a ^= 0x3030303030303030ull; /* digit bytes to 0..9 */
    /* the k digit values to the last k bytes (zeros lead), then fold 2, 4, 8 */
    a <<= 8 * (8 - k);
    a = (a * 2561) >> 8;
    a = ((a & 0x00FF00FF00FF00FFull) * 6553601) >> 16;
    a = ((a & 0x0000FFFF0000FFFFull) * 42949672960001ull) >> 32;
    return (uint32_t)a;
}

#ifdef __SSE2__
/* Bits of the 16 bytes in @x equal to @c. */
static inline uint64_t kvt_json_eq16(__m128i x, char c)
{
    return (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(c)));
}

/*
 * Token ids, 64 bytes at a time while 72 are readable, for bodies of a few
 * thousand ids. Masks of the window's digits, commas and spaces show where
 * every element "digits ',' [' ']" starts and ends, so the elements are
 * converted independently of one another: no element waits for the scan of
 * the one before. Takes elements up to the first byte that breaks that shape
 * (another byte, a comma or a space out of place); stops at an element of
 * over 8 digits, with a leading zero, over @max or past @cap, untaken, so
 * that the caller's loops read it (errors included). Returns the new position.
 */
static size_t kvt_json_u32_windows(const char *s, size_t len, size_t p, uint32_t *o, size_t *n_p,
                                   size_t cap, uint64_t max)
{
    size_t n = *n_p;
    while (len - p >= 72 && KVT_JSON_IS_DIGIT(s[p])) {
        uint64_t dig = 0, com = 0, spc = 0;
        for (int q = 0; q < 4; q++) {
            __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + p + 16 * q));
            __m128i t = _mm_sub_epi8(x, _mm_set1_epi8('0'));
            __m128i d = _mm_cmpeq_epi8(_mm_min_epu8(t, _mm_set1_epi8(9)), t);
            dig |= (uint64_t)(uint16_t)_mm_movemask_epi8(d) << (16 * q);
            com |= kvt_json_eq16(x, ',') << (16 * q);
            spc |= kvt_json_eq16(x, ' ') << (16 * q);
        }
        /* first byte out of shape: another byte, a comma after no digit, a space after no comma */
        uint64_t bad = ~(dig | com | spc) | (com & ~(dig << 1)) | (spc & ~(com << 1));
        uint64_t keep = bad ? ((uint64_t)1 << __builtin_ctzll(bad)) - 1 : ~(uint64_t)0;
        uint64_t ends = com & keep, starts = dig & ~(dig << 1) & keep;
        if (ends == 0)
            break;
        size_t next = p;
        for (; ends != 0; ends &= ends - 1, starts &= starts - 1) {
            unsigned b = (unsigned)__builtin_ctzll(starts), k = (unsigned)__builtin_ctzll(ends) - b;
            const char *e = s + p + b;
            if (k > 8 || (k > 1 && e[0] == '0') || n >= cap)
                break;
            uint32_t v = kvt_json_swar_digits(e, k);
            if (v > max)
                break;
            o[n++] = v;
            next = p + b + k + 1;
        }
        if (ends != 0) {
            p += __builtin_ctzll(starts); /* the element that stopped the run */
            break;
        }
        p = next + (s[next] == ' ');
    }
    *n_p = n;
    return p;
}
#endif

/*
 * Fast path for one integer literal at s[p]: up to 20 digits with an
 * optional '-', not followed by '.', 'e', 'E' or another digit. Returns 1
 * with the magnitude in *mag and the end in *end; 0 for anything else (a
 * leading zero, overflow, a fraction, another type), which the caller hands
 * to the full scanner so that errors read the same either way.
 */
static inline int kvt_json_fast_int(const char *s, size_t len, size_t p, bool *neg, uint64_t *mag,
                                    size_t *end)
{
    *neg = false;
    if (p < len && s[p] == '-') {
        *neg = true;
        p++;
    }
    if (p >= len || !KVT_JSON_IS_DIGIT(s[p]))
        return 0;
    if (len - p >= 8) {
        /* up to 7 digits (token ids): eight bytes at once */
        unsigned k = kvt_json_digit_run(s + p);
        if (k < 8 && (k == 1 || s[p] != '0')) {
            char c = s[p + k];
            if (c == '.' || c == 'e' || c == 'E')
                return 0;
            *mag = kvt_json_swar_digits(s + p, k);
            *end = p + k;
            return 1;
        }
    }
    uint64_t v = (uint64_t)(s[p] - '0');
    size_t q = p + 1;
    if (v != 0) {
        size_t lim = len - q < 18 ? len : q + 18; /* 19 digits cannot overflow */
        while (q < lim && KVT_JSON_IS_DIGIT(s[q]))
            v = v * 10 + (uint64_t)(s[q++] - '0');
        if (q < len && KVT_JSON_IS_DIGIT(s[q])) {
            uint64_t d = (uint64_t)(s[q] - '0');
            if (v > (UINT64_MAX - d) / 10)
                return 0;
            v = v * 10 + d;
            q++;
        }
    }
    if (q < len && (KVT_JSON_IS_DIGIT(s[q]) || s[q] == '.' || s[q] == 'e' || s[q] == 'E'))
        return 0;
    *mag = v;
    *end = q;
    return 1;
}

/*
 * Both array readers: @hash selects kvt_json_hash() semantics (negatives
 * wrap) and u64 output, else unsigned in [0, max] and u32 output.
 */
static kvt_status_t kvt_json_int_array(kvt_json_t *j, bool hash, void *out, size_t cap,
                                       uint64_t max, size_t *n_p)
{
    kvt_status_t st = kvt_json_array_begin(j);
    if (st != KVT_OK)
        return st;
    const char *s = j->s;
    const size_t len = j->len;
    size_t p = j->pos, n = 0;

    while (p < len && KVT_JSON_IS_WS(s[p]))
        p++;
    if (p < len && s[p] == ']') {
        j->pos = p;
        kvt_json_close(j);
        *n_p = 0;
        return KVT_OK;
    }
    if (!hash) {
        /*
         * Token ids: digits then ',' and at most one space, taken by 64-byte
         * windows where SSE2 is there (1..8 digits), then eight bytes at a
         * time while 16 are readable (1..7 digits). Anything else (the last
         * element, other whitespace, a leading zero, a fraction, a value
         * over @max, a full @out) stops here untaken, and the loop below
         * reads it, errors included.
         */
        uint32_t *o = out;
#ifdef __SSE2__
        p = kvt_json_u32_windows(s, len, p, o, &n, cap, max);
#endif
        while (len - p >= 16 && n < cap) {
            unsigned k = kvt_json_digit_run(s + p);
            if (k == 0 || k == 8 || s[p + k] != ',' || (k > 1 && s[p] == '0'))
                break;
            uint32_t v = kvt_json_swar_digits(s + p, k);
            if (v > max)
                break;
            o[n++] = v;
            p += k + 1;
            p += s[p] == ' ';
        }
        while (p < len && KVT_JSON_IS_WS(s[p]))
            p++;
    }
    for (;;) {
        /* One element at p (after whitespace). */
        bool neg;
        uint64_t mag = 0, v = 0;
        size_t end, start = p;
        if (kvt_json_fast_int(s, len, p, &neg, &mag, &end) &&
            (hash ? !neg || mag <= (uint64_t)INT64_MAX + 1 : !neg || mag == 0)) {
            v = neg ? 0 - mag : mag;
            p = end;
        } else {
            /* Slow path: the full reader decides, or fails with its message. */
            j->pos = p;
            j->expect = KVT_JSON_X_VALUE;
            st = hash ? kvt_json_hash(j, &v) : kvt_json_read_uint(j, UINT32_MAX, "a u32", &v);
            if (st != KVT_OK)
                return st;
            p = j->pos;
        }
        if (!hash && v > max)
            return kvt_json_fail(j, KVT_ERR_RANGE, start, "%llu is above the limit %llu",
                                 (unsigned long long)v, (unsigned long long)max);
        if (n >= cap)
            return kvt_json_fail(j, KVT_ERR_TOO_BIG, start, "array has more than %zu elements",
                                 cap);
        if (hash)
            ((uint64_t *)out)[n++] = v;
        else
            ((uint32_t *)out)[n++] = (uint32_t)v;

        while (p < len && KVT_JSON_IS_WS(s[p]))
            p++;
        if (p < len && s[p] == ',') {
            p++;
            while (p < len && KVT_JSON_IS_WS(s[p]))
                p++;
            continue;
        }
        if (p < len && s[p] == ']')
            break;
        j->pos = p;
        return kvt_json_expected(j, p, "',' or ']'");
    }
    j->pos = p;
    kvt_json_close(j);
    *n_p = n;
    return KVT_OK;
}

kvt_status_t kvt_json_u32_array(kvt_json_t *j, uint32_t *out, size_t cap, uint32_t max, size_t *n_p)
{
    return kvt_json_int_array(j, false, out, cap, max, n_p);
}

kvt_status_t kvt_json_hash_array(kvt_json_t *j, uint64_t *out, size_t cap, size_t *n_p)
{
    return kvt_json_int_array(j, true, out, cap, UINT64_MAX, n_p);
}

/* ---- writer --------------------------------------------------------------------------- */

void kvt_jbuf_init(kvt_jbuf_t *b)
{
    b->buf = NULL;
    b->len = 0;
    b->cap = 0;
    b->oom = false;
}

void kvt_jbuf_cleanup(kvt_jbuf_t *b)
{
    free(b->buf);
    kvt_jbuf_init(b);
}

void kvt_jbuf_reset(kvt_jbuf_t *b)
{
    b->len = 0;
    b->oom = false;
    if (b->buf != NULL)
        b->buf[0] = '\0';
}

/* Room for @n more bytes plus the NUL; false (and oom) when it cannot grow. */
static bool kvt_jbuf_reserve(kvt_jbuf_t *b, size_t n)
{
    if (b->oom)
        return false;
    if (b->cap > b->len && n < b->cap - b->len)
        return true;
    if (n > SIZE_MAX / 2 - b->len - 1) {
        b->oom = true;
        return false;
    }
    size_t need = b->len + n + 1;
    size_t cap = b->cap < 64 ? 64 : b->cap;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->buf, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->buf = p;
    b->cap = cap;
    return true;
}

void kvt_jbuf_raw_slow(kvt_jbuf_t *b, const char *s, size_t n)
{
    if (!kvt_jbuf_reserve(b, n))
        return;
    if (n > 0)
        memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

void kvt_jbuf_str(kvt_jbuf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    /* Worst case 6 output bytes per input byte, plus the quotes. */
    if (n > (SIZE_MAX - 2) / 6) {
        b->oom = true;
        return;
    }
    if (!kvt_jbuf_reserve(b, 6 * n + 2))
        return;
    char *o = b->buf + b->len;
    const unsigned char *u = (const unsigned char *)s;
    *o++ = '"';
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *o++ = (char)c;
            i++;
            continue;
        }
        if (c >= 0x80) {
            size_t k = kvt_json_utf8_len(u + i, n - i);
            if (k == 0) {
                memcpy(o, "\\ufffd", 6);
                o += 6;
                i++;
            } else {
                memcpy(o, u + i, k);
                o += k;
                i += k;
            }
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
            break;
        }
        i++;
    }
    *o++ = '"';
    b->len = (size_t)(o - b->buf);
    b->buf[b->len] = '\0';
}

/* Writes @v in decimal ending at @end (exclusive); returns the first byte. Two digits per
 * step from a table: the division count, not the stores, is what costs. */
static char *kvt_json_fmt_u64(uint64_t v, char *end)
{
    static const char pairs[] = "00010203040506070809101112131415161718192021222324"
                                "25262728293031323334353637383940414243444546474849"
                                "50515253545556575859606162636465666768697071727374"
                                "75767778798081828384858687888990919293949596979899";
    char *o = end;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        o -= 2;
        o[0] = pairs[2 * r];
        o[1] = pairs[2 * r + 1];
    }
    if (v >= 10) {
        o -= 2;
        o[0] = pairs[2 * v];
        o[1] = pairs[2 * v + 1];
    } else {
        *--o = (char)('0' + v);
    }
    return o;
}

void kvt_jbuf_u64_slow(kvt_jbuf_t *b, uint64_t v)
{
    char *o = kvt_jbuf_room(b, KVT_JSON_U64_MAX_LEN);
    if (o != NULL)
        kvt_jbuf_commit(b, kvt_json_put_u64(o, v));
}

void kvt_jbuf_i64(kvt_jbuf_t *b, int64_t v)
{
    char *o = kvt_jbuf_room(b, KVT_JSON_U64_MAX_LEN + 1);
    if (o != NULL)
        kvt_jbuf_commit(b, kvt_json_put_i64(o, v));
}

/*
 * @v as a plain decimal of at most six fraction digits, the usual score
 * (block counts times tier weights), when one reads back as exactly @v:
 * the fewest digits that do, which is also what "%.15g" prints. r / 10^d in
 * doubles is the double nearest the decimal (both exact, the division
 * correctly rounded), the one a reader makes of the text. Returns the length
 * written to @out (24 bytes), or 0 to leave it to the slow path.
 */
static size_t kvt_json_fmt_short_decimal(double v, char *out)
{
    static const double p10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6};
    double a = fabs(v);
    if (!(a >= 1e-3 && a < 1e9))
        return 0;
    for (unsigned d = 1; d <= 6; d++) {
        uint64_t u = (uint64_t)(a * p10[d] + 0.5), pd = (uint64_t)p10[d];
        if ((double)u / p10[d] != a)
            continue;
        uint64_t ip = u / pd, fp = u % pd;
        char tmp[24];
        char *p = tmp + sizeof(tmp);
        if (fp != 0) {
            for (unsigned i = 0; i < d; i++, fp /= 10)
                *--p = (char)('0' + fp % 10);
            *--p = '.';
        }
        p = kvt_json_fmt_u64(ip, p);
        if (v < 0)
            *--p = '-';
        size_t n = (size_t)(tmp + sizeof(tmp) - p);
        memcpy(out, p, n);
        return n;
    }
    return 0;
}

char *kvt_json_put_f64(char *o, double v)
{
    if (!isfinite(v))
        return KVT_JSON_PUT_LIT(o, "null");
    /* whole numbers below 1e15 print as integers under "%.15g" too (but -0 keeps its sign) */
    if (v > -1e15 && v < 1e15 && (double)(int64_t)v == v && (v != 0 || !signbit(v)))
        return kvt_json_put_i64(o, (int64_t)v);
    size_t n = kvt_json_fmt_short_decimal(v, o);
    if (n > 0)
        return o + n;
    /* The shortest of 15..17 significant digits that reads back exactly. */
    char tmp[40];
    int len = 0;
    for (int prec = 15; prec <= 17; prec++) {
        len = snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (prec == 17 || strtod(tmp, NULL) == v)
            break;
    }
    if (len <= 0 || (size_t)len > KVT_JSON_F64_MAX_LEN)
        return KVT_JSON_PUT_LIT(o, "null"); /* cannot happen: at most 24 bytes */
    /* A locale may print ',' for the point; JSON wants '.'. */
    for (int i = 0; i < len; i++)
        if (!KVT_JSON_IS_DIGIT(tmp[i]) && tmp[i] != '-' && tmp[i] != '+' && tmp[i] != 'e')
            tmp[i] = '.';
    return kvt_json_put_raw(o, tmp, (size_t)len);
}

void kvt_jbuf_f64(kvt_jbuf_t *b, double v)
{
    char *o = kvt_jbuf_room(b, KVT_JSON_F64_MAX_LEN);
    if (o != NULL)
        kvt_jbuf_commit(b, kvt_json_put_f64(o, v));
}

char *kvt_json_put_u64_slow(char *o, uint64_t v)
{
    char tmp[KVT_JSON_U64_MAX_LEN];
    char *p = kvt_json_fmt_u64(v, tmp + sizeof(tmp));
    return kvt_json_put_raw(o, p, (size_t)(tmp + sizeof(tmp) - p));
}

char *kvt_json_put_i64(char *o, int64_t v)
{
    if (v < 0) {
        *o++ = '-';
        return kvt_json_put_u64(o, 0 - (uint64_t)v);
    }
    return kvt_json_put_u64(o, (uint64_t)v);
}

char *kvt_jbuf_room(kvt_jbuf_t *b, size_t n)
{
    if (!kvt_jbuf_reserve(b, n))
        return NULL;
    return b->buf + b->len;
}

void kvt_jbuf_printf(kvt_jbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    char tmp[256];

    if (b->oom)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        kvt_jbuf_raw(b, tmp, (size_t)n);
        return;
    }
    if (!kvt_jbuf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}
