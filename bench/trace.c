/*
 * bench/trace: a small hand-written JSON reader for Mooncake traces.
 *
 * Each line is parsed on its own with a cursor bounded by the line's end, so
 * a malformed line can never run into the next one and every error names its
 * line. Only what the format needs is decoded (object keys, non-negative
 * integers, arrays of them); any other value is validated and skipped.
 */
#include "bench/trace.h"
#include "bench/trace_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"

/* Nesting allowed inside skipped values. */
#define TR_MAX_DEPTH 64

/* Growing arrays of the trace under construction. */
typedef struct tr_build {
    kvt_trace_req_t *reqs;
    size_t nreqs, reqs_cap;
    uint64_t *ids;
    size_t nids, ids_cap;
    int oom;
} tr_build_t;

__attribute__((format(printf, 2, 3))) int kvt_trace_fail(kvt_trace_cur_t *c, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    kvt_verrf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvt_errf(c->err, c->errlen, "line %zu: %s", c->line, msg);
    return -1;
}

static void tr_ws(kvt_trace_cur_t *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r'))
        c->p++;
}

/* Describes the byte at the cursor for error messages. */
static const char *tr_here(const kvt_trace_cur_t *c, char buf[8])
{
    if (c->p >= c->end)
        return "end of line";
    unsigned char ch = (unsigned char)*c->p;
    if (ch >= 0x20 && ch < 0x7f && ch != '\'')
        snprintf(buf, 8, "'%c'", ch);
    else
        snprintf(buf, 8, "0x%02x", ch);
    return buf;
}

static int tr_expect(kvt_trace_cur_t *c, char ch)
{
    tr_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 0;
    }
    char b[8];
    return kvt_trace_fail(c, "expected '%c', found %s", ch, tr_here(c, b));
}

static int tr_hex4(kvt_trace_cur_t *c, unsigned *v_p)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        if (c->p >= c->end)
            return kvt_trace_fail(c, "unterminated string");
        char ch = *c->p++;
        v <<= 4;
        if (ch >= '0' && ch <= '9')
            v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F')
            v |= (unsigned)(ch - 'A' + 10);
        else
            return kvt_trace_fail(c, "bad \\u escape in string");
    }
    *v_p = v;
    return 0;
}

/* FNV-1a over a session name's bytes, fed as they are decoded. */
#define TR_FNV_OFFSET 0xcbf29ce484222325ull
#define TR_FNV_PRIME 0x100000001b3ull

static void tr_fnv(uint64_t *h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        *h ^= p[i];
        *h *= TR_FNV_PRIME;
    }
}

/* splitmix64's finalizer: spreads FNV's weak high bits; 0 stays reserved for "none". */
static uint64_t tr_fnv_done(uint64_t h)
{
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h != 0 ? h : 1;
}

uint64_t kvt_trace_session_id(const char *s, size_t len)
{
    if (len == 0)
        return 0;
    uint64_t h = TR_FNV_OFFSET;
    tr_fnv(&h, (const unsigned char *)s, len);
    return tr_fnv_done(h);
}

/* Code point @v as UTF-8 (lone surrogates too, as 3 bytes) into @b; returns the length. */
static size_t tr_utf8(unsigned v, unsigned char b[4])
{
    if (v < 0x80) {
        b[0] = (unsigned char)v;
        return 1;
    }
    if (v < 0x800) {
        b[0] = (unsigned char)(0xc0 | (v >> 6));
        b[1] = (unsigned char)(0x80 | (v & 0x3f));
        return 2;
    }
    if (v < 0x10000) {
        b[0] = (unsigned char)(0xe0 | (v >> 12));
        b[1] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
        b[2] = (unsigned char)(0x80 | (v & 0x3f));
        return 3;
    }
    b[0] = (unsigned char)(0xf0 | (v >> 18));
    b[1] = (unsigned char)(0x80 | ((v >> 12) & 0x3f));
    b[2] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
    b[3] = (unsigned char)(0x80 | (v & 0x3f));
    return 4;
}

/*
 * Parses a string at the cursor (after whitespace). When @out is not NULL,
 * writes up to @outlen - 1 decoded bytes and a NUL; non-ASCII escapes decode
 * to 0xff so they never match a known key; *@long_p is set if it did not fit.
 * When @h is not NULL, the decoded bytes (escapes as UTF-8, a surrogate pair
 * as one code point) are fed to FNV-1a state *@h and *@n_p counts them.
 */
static int tr_string(kvt_trace_cur_t *c, char *out, size_t outlen, int *long_p, uint64_t *h,
                     size_t *n_p)
{
    size_t n = 0, nh = 0;
    int too_long = 0;
    tr_ws(c);
    if (c->p >= c->end || *c->p != '"') {
        char b[8];
        return kvt_trace_fail(c, "expected a string, found %s", tr_here(c, b));
    }
    c->p++;
    for (;;) {
        if (c->p >= c->end)
            return kvt_trace_fail(c, "unterminated string");
        unsigned char ch = (unsigned char)*c->p++;
        unsigned char u8[4];
        size_t nu8 = 0; /* > 0: a \u escape, its UTF-8 bytes in u8 */
        if (ch == '"')
            break;
        if (ch < 0x20)
            return kvt_trace_fail(c, "control character in string");
        if (ch == '\\') {
            if (c->p >= c->end)
                return kvt_trace_fail(c, "unterminated string");
            char e = *c->p++;
            switch (e) {
            case '"':
            case '\\':
            case '/': ch = (unsigned char)e; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case 'n': ch = '\n'; break;
            case 'r': ch = '\r'; break;
            case 't': ch = '\t'; break;
            case 'u': {
                unsigned v = 0, lo = 0;
                if (tr_hex4(c, &v) != 0)
                    return -1;
                /* a high surrogate followed by \uDC00..\uDFFF is one code point */
                if (v >= 0xd800 && v < 0xdc00 && c->end - c->p >= 6 && c->p[0] == '\\' &&
                    c->p[1] == 'u') {
                    const char *save = c->p;
                    c->p += 2;
                    if (tr_hex4(c, &lo) != 0)
                        return -1;
                    if (lo >= 0xdc00 && lo < 0xe000)
                        v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
                    else
                        c->p = save;
                }
                ch = v < 0x80 ? (unsigned char)v : 0xff;
                nu8 = tr_utf8(v, u8);
                break;
            }
            default: return kvt_trace_fail(c, "bad escape '\\%c' in string", e);
            }
        }
        if (h != NULL) {
            if (nu8 > 0) {
                tr_fnv(h, u8, nu8);
                nh += nu8;
            } else {
                tr_fnv(h, &ch, 1);
                nh++;
            }
        }
        if (out != NULL) {
            if (n + 1 < outlen)
                out[n++] = (char)ch;
            else
                too_long = 1;
        }
    }
    if (out != NULL) {
        out[n] = '\0';
        *long_p = too_long;
    }
    if (n_p != NULL)
        *n_p = nh;
    return 0;
}

/* A non-negative integer no larger than @max. */
static int tr_uint(kvt_trace_cur_t *c, uint64_t max, const char *what, uint64_t *v_p)
{
    tr_ws(c);
    if (c->p < c->end && *c->p == '-')
        return kvt_trace_fail(c, "%s: negative number", what);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
        char b[8];
        return kvt_trace_fail(c, "%s: expected a non-negative integer, found %s", what,
                              tr_here(c, b));
    }
    if (*c->p == '0' && c->p + 1 < c->end && c->p[1] >= '0' && c->p[1] <= '9')
        return kvt_trace_fail(c, "%s: number with a leading zero", what);
    uint64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        unsigned d = (unsigned)(*c->p - '0');
        if (v > (max - d) / 10)
            return kvt_trace_fail(c, "%s: number out of range (max %llu)", what,
                                  (unsigned long long)max);
        v = v * 10 + d;
        c->p++;
    }
    if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E'))
        return kvt_trace_fail(c, "%s: not an integer", what);
    *v_p = v;
    return 0;
}

static int tr_skip_value(kvt_trace_cur_t *c, int depth);

/* Skips a JSON number (any sign, fraction, exponent). */
static int tr_skip_number(kvt_trace_cur_t *c)
{
    if (c->p < c->end && *c->p == '-')
        c->p++;
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return kvt_trace_fail(c, "malformed number");
    if (*c->p == '0')
        c->p++;
    else
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
            c->p++;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return kvt_trace_fail(c, "malformed number");
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
            c->p++;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            c->p++;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return kvt_trace_fail(c, "malformed number");
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
            c->p++;
    }
    return 0;
}

static int tr_skip_container(kvt_trace_cur_t *c, int depth, char close)
{
    if (depth >= TR_MAX_DEPTH)
        return kvt_trace_fail(c, "nesting deeper than %d", TR_MAX_DEPTH);
    c->p++; /* the opening bracket */
    tr_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    for (;;) {
        if (close == '}') {
            if (tr_string(c, NULL, 0, NULL, NULL, NULL) != 0 || tr_expect(c, ':') != 0)
                return -1;
        }
        if (tr_skip_value(c, depth + 1) != 0)
            return -1;
        tr_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        return tr_expect(c, close);
    }
}

static int tr_skip_value(kvt_trace_cur_t *c, int depth)
{
    static const char *const lits[] = {"true", "false", "null"};
    tr_ws(c);
    if (c->p >= c->end)
        return kvt_trace_fail(c, "expected a value, found end of line");
    switch (*c->p) {
    case '"': return tr_string(c, NULL, 0, NULL, NULL, NULL);
    case '{': return tr_skip_container(c, depth, '}');
    case '[': return tr_skip_container(c, depth, ']');
    default: break;
    }
    if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))
        return tr_skip_number(c);
    for (size_t i = 0; i < sizeof(lits) / sizeof(lits[0]); i++) {
        size_t n = strlen(lits[i]);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, lits[i], n) == 0) {
            c->p += n;
            return 0;
        }
    }
    char b[8];
    return kvt_trace_fail(c, "expected a value, found %s", tr_here(c, b));
}

static int tr_push_id(tr_build_t *b, uint64_t id)
{
    if (b->nids == b->ids_cap) {
        size_t cap = b->ids_cap ? b->ids_cap * 2 : 4096;
        uint64_t *ids = realloc(b->ids, cap * sizeof(*ids));
        if (ids == NULL) {
            b->oom = 1;
            return -1;
        }
        b->ids = ids;
        b->ids_cap = cap;
    }
    b->ids[b->nids++] = id;
    return 0;
}

/* "hash_ids": [ id, ... ] appended to @b; *@n_p receives the count. */
static int tr_ids(kvt_trace_cur_t *c, tr_build_t *b, uint32_t *n_p)
{
    size_t start = b->nids;
    if (tr_expect(c, '[') != 0)
        return -1;
    tr_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        *n_p = 0;
        return 0;
    }
    for (;;) {
        uint64_t id;
        if (tr_uint(c, UINT64_MAX, "hash_ids", &id) != 0)
            return -1;
        if (b->nids - start >= UINT32_MAX)
            return kvt_trace_fail(c, "hash_ids: too many ids");
        if (tr_push_id(b, id) != 0)
            return kvt_trace_fail(c, "out of memory");
        tr_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (tr_expect(c, ']') != 0)
            return -1;
        *n_p = (uint32_t)(b->nids - start);
        return 0;
    }
}

/*
 * "session_id": a string, a non-negative integer (its decimal digits name the
 * session) or null (none). Writes kvt_trace_session_id() of the name.
 */
static int tr_session(kvt_trace_cur_t *c, uint64_t *id_p)
{
    tr_ws(c);
    if (c->p < c->end && *c->p == '"') {
        uint64_t h = TR_FNV_OFFSET;
        size_t n = 0;
        if (tr_string(c, NULL, 0, NULL, &h, &n) != 0)
            return -1;
        *id_p = n == 0 ? 0 : tr_fnv_done(h);
        return 0;
    }
    if ((size_t)(c->end - c->p) >= 4 && memcmp(c->p, "null", 4) == 0) {
        c->p += 4;
        *id_p = 0;
        return 0;
    }
    if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
        uint64_t v;
        char digits[24];
        if (tr_uint(c, UINT64_MAX, "session_id", &v) != 0)
            return -1;
        int n = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)v);
        *id_p = kvt_trace_session_id(digits, (size_t)n);
        return 0;
    }
    char b[8];
    return kvt_trace_fail(c,
                          "session_id: expected a string, a non-negative integer or null, found %s",
                          tr_here(c, b));
}

enum { K_TS = 1, K_IN = 2, K_OUT = 4, K_IDS = 8, K_ALL = 15, K_SESSION = 16 };

/* Parses one non-blank line into a new request of @b. */
static int tr_line(kvt_trace_cur_t *c, tr_build_t *b)
{
    kvt_trace_req_t r = {0};
    unsigned seen = 0;
    if (tr_expect(c, '{') != 0)
        return -1;
    tr_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
    } else {
        for (;;) {
            char key[32];
            int too_long;
            if (tr_string(c, key, sizeof(key), &too_long, NULL, NULL) != 0 ||
                tr_expect(c, ':') != 0)
                return -1;
            unsigned k = 0;
            if (!too_long) {
                if (strcmp(key, "timestamp") == 0)
                    k = K_TS;
                else if (strcmp(key, "input_length") == 0)
                    k = K_IN;
                else if (strcmp(key, "output_length") == 0)
                    k = K_OUT;
                else if (strcmp(key, "hash_ids") == 0)
                    k = K_IDS;
                else if (strcmp(key, "session_id") == 0)
                    k = K_SESSION;
            }
            if (k & seen)
                return kvt_trace_fail(c, "duplicate key \"%s\"", key);
            seen |= k;
            uint64_t v;
            int rc;
            switch (k) {
            case K_TS: rc = tr_uint(c, UINT64_MAX, "timestamp", &r.timestamp_ms); break;
            case K_IN:
                rc = tr_uint(c, UINT32_MAX, "input_length", &v);
                r.input_length = (uint32_t)v;
                break;
            case K_OUT:
                rc = tr_uint(c, UINT32_MAX, "output_length", &v);
                r.output_length = (uint32_t)v;
                break;
            case K_IDS: rc = tr_ids(c, b, &r.nblocks); break;
            case K_SESSION: rc = tr_session(c, &r.session); break;
            default: rc = tr_skip_value(c, 0); break;
            }
            if (rc != 0)
                return -1;
            tr_ws(c);
            if (c->p < c->end && *c->p == ',') {
                c->p++;
                continue;
            }
            if (tr_expect(c, '}') != 0)
                return -1;
            break;
        }
    }
    tr_ws(c);
    if (c->p < c->end) {
        char bb[8];
        return kvt_trace_fail(c, "unexpected %s after the object", tr_here(c, bb));
    }
    if ((seen & K_ALL) != K_ALL) {
        const char *miss = !(seen & K_TS)    ? "timestamp"
                           : !(seen & K_IN)  ? "input_length"
                           : !(seen & K_OUT) ? "output_length"
                                             : "hash_ids";
        return kvt_trace_fail(c, "missing key \"%s\"", miss);
    }
    if (b->nreqs == b->reqs_cap) {
        size_t cap = b->reqs_cap ? b->reqs_cap * 2 : 1024;
        kvt_trace_req_t *reqs = realloc(b->reqs, cap * sizeof(*reqs));
        if (reqs == NULL) {
            b->oom = 1;
            return kvt_trace_fail(c, "out of memory");
        }
        b->reqs = reqs;
        b->reqs_cap = cap;
    }
    b->reqs[b->nreqs++] = r;
    return 0;
}

kvt_status_t kvt_trace_parse(const char *buf, size_t len, kvt_trace_t **t_p, char *err,
                             size_t errlen)
{
    if ((buf == NULL && len > 0) || t_p == NULL) {
        kvt_errf(err, errlen, "kvt_trace_parse: NULL argument");
        return KVT_ERR_INVAL;
    }
    tr_build_t b = {0};
    kvt_status_t st;
    kvt_trace_cur_t c = {.err = err, .errlen = errlen};
    const char *p = buf, *end = buf + len;
    for (size_t line = 1; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        c.p = p;
        c.end = le;
        c.line = line;
        tr_ws(&c);
        if (c.p < c.end && tr_line(&c, &b) != 0) {
            st = b.oom ? KVT_ERR_NO_MEM : KVT_ERR_PARSE;
            goto err_build;
        }
        p = nl != NULL ? nl + 1 : end;
    }
    kvt_trace_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        kvt_errf(err, errlen, "out of memory");
        st = KVT_ERR_NO_MEM;
        goto err_build;
    }
    /* ids are back to back in request order: fix the pointers now that they stopped moving */
    size_t off = 0;
    for (size_t i = 0; i < b.nreqs; i++) {
        b.reqs[i].hash_ids = b.ids != NULL ? b.ids + off : NULL; /* no ids at all: NULL */
        off += b.reqs[i].nblocks;
        if (b.reqs[i].nblocks > t->max_blocks)
            t->max_blocks = b.reqs[i].nblocks;
    }
    t->reqs = b.reqs;
    t->nreqs = b.nreqs;
    t->ids = b.ids;
    t->nids = b.nids;
    *t_p = t;
    return KVT_OK;

err_build:
    free(b.reqs);
    free(b.ids);
    return st;
}

static kvt_status_t tr_read_file(const char *path, char **buf_p, size_t *len_p, char *err,
                                 size_t errlen)
{
    kvt_status_t st;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        kvt_errf(err, errlen, "cannot open: %s", strerror(errno));
        return KVT_ERR_IO;
    }
    size_t len = 0, cap = 1 << 20;
    char *buf = malloc(cap);
    if (buf == NULL) {
        st = KVT_ERR_NO_MEM;
        kvt_errf(err, errlen, "out of memory");
        goto err_file;
    }
    for (;;) {
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                st = KVT_ERR_NO_MEM;
                kvt_errf(err, errlen, "out of memory");
                goto err_buf;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        st = KVT_ERR_IO;
        kvt_errf(err, errlen, "read error");
        goto err_buf;
    }
    fclose(f);
    *buf_p = buf;
    *len_p = len;
    return KVT_OK;

err_buf:
    free(buf);
err_file:
    fclose(f);
    return st;
}

kvt_status_t kvt_trace_load_with(const char *path, kvt_trace_parse_fn parse, kvt_trace_t **t_p,
                                 char *err, size_t errlen)
{
    if (path == NULL || t_p == NULL) {
        kvt_errf(err, errlen, "loading a trace: NULL argument");
        return KVT_ERR_INVAL;
    }
    char *buf;
    size_t len;
    kvt_status_t st = tr_read_file(path, &buf, &len, err, errlen);
    if (st != KVT_OK)
        return st;
    st = parse(buf, len, t_p, err, errlen);
    free(buf);
    return st;
}

kvt_status_t kvt_trace_load(const char *path, kvt_trace_t **t_p, char *err, size_t errlen)
{
    return kvt_trace_load_with(path, kvt_trace_parse, t_p, err, errlen);
}

void kvt_trace_free(kvt_trace_t *t)
{
    if (t == NULL)
        return;
    free(t->reqs);
    free(t->ids);
    free(t);
}
