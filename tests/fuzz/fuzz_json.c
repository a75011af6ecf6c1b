/*
 * libFuzzer target for the pull parser and the writer (common/json*.c).
 *
 * Invariants checked on every input:
 *  - the input is copied to an exactly-sized heap buffer, so ASan reports any
 *    read past len;
 *  - a typed walk (peek, object/array, string, the number readers with
 *    fallbacks, bool, null) and a plain kvt_json_skip() agree: both accept,
 *    or both fail with the same status at the same offset (the walk may also
 *    fail alone with TOO_BIG on a key over 255 bytes, which skip accepts);
 *  - every error is sticky, names an offset <= len in a one-line message;
 *  - the number readers agree with each other (u64, u32, i64, hash);
 *  - kvt_json_u32_array / kvt_json_hash_array agree with reading the same
 *    array element by element (status, offset, values, final position);
 *  - a string read into a small buffer is TOO_BIG exactly when it does not fit;
 *  - duplicate keys, against a naive model: a key object_next() returns is
 *    unlike every earlier key of its object; a "duplicate" refusal names a
 *    key (decoded again at the error's offset) that the object already had;
 *    a "members" refusal comes with exactly KVT_JSON_MEMBERS_MAX keys open;
 *  - a document the walk accepts, written again with the kvt_jbuf_* writer,
 *    parses to the same sequence of tokens.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum {
    T_OBJ,
    T_END_OBJ,
    T_ARR,
    T_END_ARR,
    T_KEY,
    T_STR,
    T_U64,
    T_I64,
    T_F64,
    T_RAW,
    T_BOOL,
    T_NULL
};

typedef struct tok {
    int kind;
    uint64_t u;
    int64_t i;
    double d;
    size_t off, len; /* T_KEY, T_STR, T_RAW: bytes in the pool */
} tok_t;

typedef struct toks {
    tok_t *v;
    size_t n, cap;
    char *pool;
    size_t plen, pcap;
} toks_t;

static uint64_t g_rng;

static uint64_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * UINT64_C(2685821657736338717);
}

static tok_t *push(toks_t *t, int kind)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->v = realloc(t->v, t->cap * sizeof(tok_t));
        CHECK(t->v != NULL);
    }
    tok_t *k = &t->v[t->n++];
    memset(k, 0, sizeof(*k));
    k->kind = kind;
    return k;
}

static void push_bytes(toks_t *t, tok_t *k, const char *s, size_t n)
{
    if (t->pool == NULL || t->plen + n > t->pcap) {
        t->pcap = (t->plen + n) * 2 + 64;
        t->pool = realloc(t->pool, t->pcap);
        CHECK(t->pool != NULL);
    }
    if (n > 0)
        memcpy(t->pool + t->plen, s, n);
    k->off = t->plen;
    k->len = n;
    t->plen += n;
}

/* The error state is well formed and sticky. */
static void check_error(kvt_json_t *j, size_t len)
{
    kvt_status_t st = kvt_json_status(j);
    CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_INVAL || st == KVT_ERR_RANGE ||
          st == KVT_ERR_TOO_BIG);
    const char *msg = kvt_json_error(j);
    unsigned long long off = 0;
    int used = 0;
    CHECK(sscanf(msg, "offset %llu: %n", &off, &used) == 1 && used > 0);
    CHECK(msg[used] != '\0');
    CHECK(strchr(msg, '\n') == NULL);
    CHECK(off <= len && off == kvt_json_offset(j));
    uint64_t u = 5;
    CHECK(kvt_json_u64(j, &u) == st && u == 5);
    CHECK(kvt_json_peek(j) == KVT_JSON_NONE);
    CHECK(kvt_json_array_next(j) == (int)st);
    CHECK(kvt_json_end(j) == st);
    CHECK(kvt_json_offset(j) == off);
}

/*
 * Reads an array of hashes (or u32 <= max) element by element, as the array
 * readers promise to. Errors decided here rather than by the parser (a value
 * over @max, more than @cap elements) set *@own_off to the element's offset.
 */
static kvt_status_t elementwise(kvt_json_t *j, bool hash, uint64_t *out, size_t cap, uint32_t max,
                                size_t *n_p, size_t *own_off)
{
    kvt_status_t st = kvt_json_array_begin(j);
    size_t n = 0;
    int r;
    if (st != KVT_OK)
        return st;
    while ((r = kvt_json_array_next(j)) == 1) {
        kvt_json_t at = *j;
        uint64_t v;
        kvt_json_peek(&at); /* moves to the element's first byte */
        if (hash) {
            st = kvt_json_hash(j, &v);
        } else {
            uint32_t v32;
            st = kvt_json_u32(j, &v32);
            v = v32;
        }
        if (st != KVT_OK)
            return st;
        if (!hash && v > max) {
            *own_off = kvt_json_offset(&at);
            return KVT_ERR_RANGE;
        }
        if (n >= cap) {
            *own_off = kvt_json_offset(&at);
            return KVT_ERR_TOO_BIG;
        }
        out[n++] = v;
    }
    if (r < 0)
        return (kvt_status_t)r;
    *n_p = n;
    return KVT_OK;
}

/* Compares the fast array readers with elementwise() on the array due at *j0. */
static void check_arrays(const kvt_json_t *j0, size_t len)
{
    for (int pass = 0; pass < 2; pass++) {
        bool hash = pass == 0;
        size_t cap = (rnd() & 3) == 0 ? (size_t)(rnd() % 5) : len;
        uint32_t max = (rnd() & 1) ? UINT32_MAX : (uint32_t)(rnd() % 1000);
        kvt_json_t a = *j0, b = *j0;
        uint64_t *va = malloc((cap + 1) * sizeof(uint64_t));
        uint64_t *vb = malloc((cap + 1) * sizeof(uint64_t));
        uint32_t *v32 = malloc((cap + 1) * sizeof(uint32_t));
        CHECK(va != NULL && vb != NULL && v32 != NULL);
        size_t na = 7777, nb = 8888, own_off = SIZE_MAX;
        kvt_status_t sa;
        if (hash) {
            sa = kvt_json_hash_array(&a, va, cap, &na);
        } else {
            sa = kvt_json_u32_array(&a, v32, cap, max, &na);
            if (sa == KVT_OK)
                for (size_t k = 0; k < na; k++)
                    va[k] = v32[k];
        }
        kvt_status_t sb = elementwise(&b, hash, vb, cap, max, &nb, &own_off);
        CHECK(sa == sb);
        if (sa == KVT_OK) {
            CHECK(na == nb && na <= cap);
            CHECK(na == 0 || memcmp(va, vb, na * sizeof(uint64_t)) == 0);
            CHECK(kvt_json_offset(&a) == kvt_json_offset(&b));
        } else {
            CHECK(na == 7777);
            CHECK(kvt_json_offset(&a) == (own_off != SIZE_MAX ? own_off : kvt_json_offset(&b)));
            check_error(&a, len);
        }
        free(va);
        free(vb);
        free(v32);
    }
}

static const char *g_text; /* the document being walked */
static size_t g_open_keys; /* keys of the objects the walk has open (the naive model's count) */

/* The key whose '"' is at @off in g_text[0..len), decoded into @buf; its length or -1. */
static long key_at(size_t off, size_t len, char *buf, size_t cap)
{
    kvt_json_t k;
    size_t n;
    kvt_json_init(&k, g_text + off, len - off);
    if (kvt_json_string(&k, buf, cap, &n) != KVT_OK)
        return -1;
    return (long)n;
}

/* Whether key @k[0..klen) equals one of an object's keys so far: the T_KEY tokens of @t
 * at indices @keys[0..nkeys). */
static bool key_seen(const toks_t *t, const size_t *keys, size_t nkeys, const char *k, size_t klen)
{
    for (size_t i = 0; i < nkeys; i++) {
        const tok_t *o = &t->v[keys[i]];
        if (o->len == klen && (klen == 0 || memcmp(t->pool + o->off, k, klen) == 0))
            return true;
    }
    return false;
}

/* Reads the number due at *j: u64, else i64, else double, else its raw text.
 * The integer readers must agree with each other on every input. */
static kvt_status_t walk_number(kvt_json_t *j, toks_t *t)
{
    const kvt_json_t save = *j;
    kvt_json_t uj = save, hj = save;
    uint64_t u, h;
    int64_t i;
    uint32_t u32;
    double d;

    kvt_status_t su = kvt_json_u64(j, &u);
    kvt_status_t sh = kvt_json_hash(&hj, &h);
    kvt_status_t s32 = kvt_json_u32(&uj, &u32);
    if (su == KVT_OK) {
        CHECK(sh == KVT_OK && h == u);
        CHECK((s32 == KVT_OK) == (u <= UINT32_MAX));
        CHECK(s32 != KVT_OK || u32 == u);
        push(t, T_U64)->u = u;
        return KVT_OK;
    }
    CHECK(s32 == su);
    *j = save;
    kvt_status_t si = kvt_json_i64(j, &i);
    if (su == KVT_ERR_RANGE)
        CHECK(si == KVT_OK || si == KVT_ERR_RANGE);
    else
        CHECK(si == su);
    CHECK(sh == si);
    if (si == KVT_OK) {
        CHECK(i < 0 && h == (uint64_t)i);
        push(t, T_I64)->i = i;
        return KVT_OK;
    }
    *j = save;
    if (kvt_json_double(j, &d) == KVT_OK) {
        CHECK(isfinite(d));
        push(t, T_F64)->d = d;
        return KVT_OK;
    }
    /* Out of a double's range (or malformed): keep the text. */
    *j = save;
    kvt_json_peek(j);
    size_t start = kvt_json_offset(j);
    kvt_status_t st = kvt_json_skip(j);
    if (st != KVT_OK)
        return st;
    tok_t *tk = push(t, T_RAW);
    push_bytes(t, tk, g_text + start, kvt_json_offset(j) - start);
    return KVT_OK;
}

static kvt_status_t walk(kvt_json_t *j, size_t len, toks_t *t, char *buf, size_t cap, bool checks)
{
    switch (kvt_json_peek(j)) {
    case KVT_JSON_OBJECT: {
        const char *key;
        size_t klen;
        int r;
        size_t *keys = NULL, nkeys = 0, open0 = g_open_keys;
        if (kvt_json_object_begin(j) != KVT_OK)
            return kvt_json_status(j);
        push(t, T_OBJ);
        while ((r = kvt_json_object_next(j, &key, &klen)) == 1) {
            CHECK(klen <= KVT_JSON_KEY_MAX && key[klen] == '\0');
            CHECK(!key_seen(t, keys, nkeys, key, klen));
            CHECK(g_open_keys < KVT_JSON_MEMBERS_MAX);
            g_open_keys++;
            keys = realloc(keys, (nkeys + 1) * sizeof(*keys));
            CHECK(keys != NULL);
            keys[nkeys++] = t->n;
            push_bytes(t, push(t, T_KEY), key, klen);
            kvt_status_t st = walk(j, len, t, buf, cap, checks);
            if (st != KVT_OK) {
                free(keys);
                return st;
            }
        }
        if (r == KVT_ERR_INVAL && strstr(kvt_json_error(j), "duplicate field") != NULL) {
            char k[KVT_JSON_KEY_MAX + 1];
            long kl = key_at(kvt_json_offset(j), len, k, sizeof(k));
            CHECK(kl >= 0 && key_seen(t, keys, nkeys, k, (size_t)kl));
        } else if (r == KVT_ERR_TOO_BIG && strstr(kvt_json_error(j), "members") != NULL) {
            CHECK(g_open_keys == KVT_JSON_MEMBERS_MAX);
        }
        free(keys);
        g_open_keys = open0;
        if (r < 0)
            return (kvt_status_t)r;
        push(t, T_END_OBJ);
        return KVT_OK;
    }
    case KVT_JSON_ARRAY: {
        int r;
        if (checks)
            check_arrays(j, len);
        if (kvt_json_array_begin(j) != KVT_OK)
            return kvt_json_status(j);
        push(t, T_ARR);
        while ((r = kvt_json_array_next(j)) == 1) {
            kvt_status_t st = walk(j, len, t, buf, cap, checks);
            if (st != KVT_OK)
                return st;
        }
        if (r < 0)
            return (kvt_status_t)r;
        push(t, T_END_ARR);
        return KVT_OK;
    }
    case KVT_JSON_STRING: {
        size_t n = 0;
        if (checks) {
            /* A small buffer: TOO_BIG exactly when the string does not fit. */
            kvt_json_t small = *j;
            char sbuf[8];
            size_t scap = 1 + (size_t)(rnd() % sizeof(sbuf)), sn = 0;
            kvt_status_t ss = kvt_json_string(&small, sbuf, scap, &sn);
            kvt_json_t full = *j;
            kvt_status_t sf = kvt_json_string(&full, buf, cap, &n);
            if (sf == KVT_OK) {
                CHECK(ss == (n < scap ? KVT_OK : KVT_ERR_TOO_BIG));
                if (ss == KVT_OK)
                    CHECK(sn == n && memcmp(sbuf, buf, n + 1) == 0);
            } else {
                CHECK(ss == sf || ss == KVT_ERR_TOO_BIG);
            }
        }
        if (kvt_json_string(j, buf, cap, &n) != KVT_OK)
            return kvt_json_status(j);
        CHECK(n < cap && buf[n] == '\0');
        push_bytes(t, push(t, T_STR), buf, n);
        return KVT_OK;
    }
    case KVT_JSON_NUMBER: return walk_number(j, t);
    case KVT_JSON_TRUE:
    case KVT_JSON_FALSE: {
        bool b;
        if (kvt_json_bool(j, &b) != KVT_OK)
            return kvt_json_status(j);
        push(t, T_BOOL)->u = b;
        return KVT_OK;
    }
    case KVT_JSON_NULL:
        if (kvt_json_null(j) != KVT_OK)
            return kvt_json_status(j);
        push(t, T_NULL);
        return KVT_OK;
    default: CHECK(kvt_json_status(j) != KVT_OK); return kvt_json_status(j);
    }
}

static void serialise(const toks_t *t, kvt_jbuf_t *b)
{
    for (size_t i = 0; i < t->n; i++) {
        const tok_t *k = &t->v[i];
        bool closing = k->kind == T_END_OBJ || k->kind == T_END_ARR;
        if (i > 0 && !closing) {
            int p = t->v[i - 1].kind;
            if (p != T_OBJ && p != T_ARR && p != T_KEY)
                kvt_jbuf_cstr(b, ",");
        }
        switch (k->kind) {
        case T_OBJ: kvt_jbuf_cstr(b, "{"); break;
        case T_END_OBJ: kvt_jbuf_cstr(b, "}"); break;
        case T_ARR: kvt_jbuf_cstr(b, "["); break;
        case T_END_ARR: kvt_jbuf_cstr(b, "]"); break;
        case T_KEY:
            kvt_jbuf_str(b, t->pool + k->off, k->len);
            kvt_jbuf_cstr(b, ":");
            break;
        case T_STR: kvt_jbuf_str(b, t->pool + k->off, k->len); break;
        case T_U64: kvt_jbuf_u64(b, k->u); break;
        case T_I64: kvt_jbuf_i64(b, k->i); break;
        case T_F64: kvt_jbuf_f64(b, k->d); break;
        case T_RAW: kvt_jbuf_raw(b, t->pool + k->off, k->len); break;
        case T_BOOL: kvt_jbuf_cstr(b, k->u ? "true" : "false"); break;
        default: kvt_jbuf_cstr(b, "null"); break;
        }
    }
}

static bool is_int(int kind)
{
    return kind == T_U64 || kind == T_I64;
}

static double num_value(const tok_t *k)
{
    return k->kind == T_U64 ? (double)k->u : k->kind == T_I64 ? (double)k->i : k->d;
}

static bool same_tok(const toks_t *ta, const tok_t *a, const toks_t *tb, const tok_t *b)
{
    if (is_int(a->kind) && is_int(b->kind))
        return a->kind == b->kind && a->u == b->u && a->i == b->i;
    if ((is_int(a->kind) || a->kind == T_F64) && (is_int(b->kind) || b->kind == T_F64))
        return num_value(a) == num_value(b);
    if (a->kind != b->kind)
        return false;
    switch (a->kind) {
    case T_KEY:
    case T_STR:
    case T_RAW:
        return a->len == b->len &&
               (a->len == 0 || memcmp(ta->pool + a->off, tb->pool + b->off, a->len) == 0);
    case T_BOOL: return a->u == b->u;
    default: return true;
    }
}

static void toks_free(toks_t *t)
{
    free(t->v);
    free(t->pool);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size > 0 ? size : 1);
    if (s == NULL)
        return 0;
    if (size > 0)
        memcpy(s, data, size);
    g_rng = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < size; i++)
        g_rng = (g_rng ^ data[i]) * 0x100000001b3u;
    if (g_rng == 0)
        g_rng = 1;

    char *buf = malloc(size + 1);
    CHECK(buf != NULL);
    toks_t t1;
    memset(&t1, 0, sizeof(t1));

    /* The typed walk. */
    kvt_json_t j;
    kvt_json_init(&j, s, size);
    g_text = s;
    g_open_keys = 0;
    kvt_status_t sw = walk(&j, size, &t1, buf, size + 1, true);
    if (sw == KVT_OK)
        sw = kvt_json_end(&j);
    if (sw != KVT_OK) {
        CHECK(sw == kvt_json_status(&j));
        check_error(&j, size);
    }

    /* Skip must agree. */
    kvt_json_t k;
    kvt_json_init(&k, s, size);
    kvt_status_t sk = kvt_json_skip(&k);
    if (sk == KVT_OK)
        sk = kvt_json_end(&k);
    if (sk != KVT_OK)
        check_error(&k, size);
    if (sw == KVT_ERR_TOO_BIG && strstr(kvt_json_error(&j), "key longer") != NULL) {
        CHECK(sk == KVT_OK || kvt_json_offset(&k) >= kvt_json_offset(&j));
    } else {
        CHECK(sw == sk);
        if (sw != KVT_OK)
            CHECK(kvt_json_offset(&j) == kvt_json_offset(&k));
    }

    if (sw == KVT_OK) {
        /* Write the tokens back out and parse them again. */
        kvt_jbuf_t b;
        kvt_jbuf_init(&b);
        serialise(&t1, &b);
        CHECK(!b.oom);
        char *again = malloc(b.len + 1);
        char *buf2 = malloc(b.len + 1);
        CHECK(again != NULL && buf2 != NULL);
        memcpy(again, b.buf, b.len);
        toks_t t2;
        memset(&t2, 0, sizeof(t2));
        kvt_json_init(&j, again, b.len);
        g_text = again;
        g_open_keys = 0;
        kvt_status_t s2 = walk(&j, b.len, &t2, buf2, b.len + 1, false);
        if (s2 == KVT_OK)
            s2 = kvt_json_end(&j);
        if (s2 != KVT_OK) {
            fprintf(stderr, "rewritten document rejected: %s\n%.*s\n", kvt_json_error(&j),
                    (int)b.len, b.buf);
            CHECK(s2 == KVT_OK);
        }
        CHECK(t2.n == t1.n);
        for (size_t i = 0; i < t1.n; i++)
            CHECK(same_tok(&t1, &t1.v[i], &t2, &t2.v[i]));
        toks_free(&t2);
        free(again);
        free(buf2);
        kvt_jbuf_cleanup(&b);
    }
    toks_free(&t1);
    free(buf);
    free(s);
    return 0;
}
