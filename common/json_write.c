/*
 * The JSON writer (kvt_jbuf_t): strings escaped and checked as UTF-8, integers and
 * doubles in their shortest exact form.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/json_int.h"

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
