/*
 * Strict JSON pull parser: values, containers, skipping. The parser is a
 * hand-written scanner over (s, len): every read is checked against len
 * because HTTP bodies are not NUL-terminated. The state machine in `expect`
 * makes the parser reject malformed text whatever order the caller asks in,
 * so a caller mistake can never make bad JSON look good. Strings and keys are
 * in json_str.c, number arrays in json_array.c, the writer in json_write.c.
 */
#include "common/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_int.h"

/* ---- errors --------------------------------------------------------------------------- */

kvt_status_t kvt_json_fail(kvt_json_t *j, kvt_status_t st, size_t off, const char *fmt, ...)
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
const char *kvt_json_got(const kvt_json_t *j, size_t off, char *buf, size_t cap)
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

kvt_status_t kvt_json_expected(kvt_json_t *j, size_t off, const char *what)
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

/*
 * Checks that a value is due and positions on its first byte. The end of the
 * input where a value is due is a parse error (the text is truncated).
 */
kvt_status_t kvt_json_want_value(kvt_json_t *j)
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
kvt_status_t kvt_json_type_error(kvt_json_t *j, const char *want)
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
kvt_status_t kvt_json_read_uint(kvt_json_t *j, uint64_t max, const char *type, uint64_t *v_p)
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

void kvt_json_close(kvt_json_t *j)
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

/* kvt_json_object_next() that decodes the key into @out[0..cap) (NULL: only checks it). */
static int kvt_json_obj_next(kvt_json_t *j, char *out, size_t cap)
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
    st = kvt_json_scan_string(j, out, cap, "key", &klen);
    if (st != KVT_OK)
        return st;
    j->key_len = klen;
    st = kvt_json_member_add(j, kpos, out == j->key);
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
    int r = kvt_json_obj_next(j, j->key, sizeof(j->key));
    if (r == 1) {
        if (key_p != NULL)
            *key_p = j->key;
        if (klen_p != NULL)
            *klen_p = j->key_len;
    }
    return r;
}

int kvt_json_object_next_into(kvt_json_t *j, char *buf, size_t cap, size_t *klen_p)
{
    if (buf == NULL || cap == 0) {
        kvt_status_t st = kvt_json_want_next(j, true);
        if (st != KVT_OK)
            return st;
        return kvt_json_fail(j, KVT_ERR_INVAL, j->pos,
                             "kvt_json_object_next_into() needs a buffer");
    }
    int r = kvt_json_obj_next(j, buf, cap);
    if (r == 1 && klen_p != NULL)
        *klen_p = j->key_len;
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
                kvt_json_obj_next(j, NULL, 0);
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
