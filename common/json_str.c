/*
 * JSON strings (escapes, UTF-8 checks) and object keys: a duplicate key in
 * one object is refused, on every call, whatever its escapes.
 */
#include <stdint.h>
#include <string.h>

#include "common/bytes.h"
#include "common/json.h"
#include "common/json_int.h"

/* ---- strings -------------------------------------------------------------------------- */

/*
 * Length of the valid UTF-8 sequence at s[0..n) (2 to 4; the caller handles
 * ASCII), or 0 when it is invalid: a stray continuation byte, an overlong
 * form, an encoded surrogate, a code point above U+10FFFF, or a truncation.
 * Ranges from Unicode's table of well-formed byte sequences.
 */
size_t kvt_json_utf8_len(const unsigned char *s, size_t n)
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
kvt_status_t kvt_json_scan_string(kvt_json_t *j, char *out, size_t cap, const char *what,
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

/* The decoded key at @p for a one-line message: control bytes, DEL and single quotes
 * (the message quotes it with them) as '?', cut (at a UTF-8 boundary) to fit @cap. */
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
        /* drop a multi-byte character the cut split (raw UTF-8 comes bytewise); keep a whole one */
        size_t lead = o, cont = 0;
        while (lead > 0 && cont < 3 && ((unsigned char)out[lead - 1] & 0xc0) == 0x80)
            lead--, cont++;
        if (lead > 0 && (unsigned char)out[lead - 1] >= 0xc0) {
            unsigned char b = (unsigned char)out[lead - 1];
            size_t want = b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : 1;
            if (cont < want)
                o = lead - 1;
        }
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
kvt_status_t kvt_json_member_add(kvt_json_t *j, size_t kpos, bool decoded)
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
