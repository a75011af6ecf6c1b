/*
 * Token-list parser. A hand-written scanner: the grammar is tiny, and every
 * read is bounds-checked against len because callers (the fuzz target, files
 * read into memory) do not NUL-terminate.
 */
#include "kvindex/tokens.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/errtext.h"

typedef struct kvt_tokens_parser {
    const char *s;
    size_t len;
    size_t pos; /* next byte to read, <= len */
    uint32_t *v;
    size_t n;
    size_t cap;
    size_t max; /* most tokens allowed, <= KVT_TOKENS_MAX */
    char *err;
    size_t errlen;
} kvt_tokens_parser_t;

/* Byte classes; macros so that unoptimized (sanitizer) builds stay fast too. */
#define KVT_TOKENS_IS_WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')
#define KVT_TOKENS_IS_DIGIT(c) ((unsigned char)((c) - '0') < 10u)

static void kvt_tokens_skip_ws(kvt_tokens_parser_t *p)
{
    while (p->pos < p->len && KVT_TOKENS_IS_WS(p->s[p->pos]))
        p->pos++;
}

/* Writes a reason to the parser's error buffer and is @st. Error path only. */
#define KVT_TOKENS_FAIL(p, st, ...) (kvt_errf((p)->err, (p)->errlen, __VA_ARGS__), (st))

/* Fails with "byte <p->pos>: expected <what>, got <the byte at pos><hint>". */
static kvt_status_t kvt_tokens_expected(kvt_tokens_parser_t *p, const char *what)
{
    char got[32];
    const char *hint = "";

    if (p->pos >= p->len) {
        snprintf(got, sizeof(got), "end of input");
    } else {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == 0)
            snprintf(got, sizeof(got), "a NUL byte");
        else if (c >= 0x20 && c < 0x7f)
            snprintf(got, sizeof(got), "'%c'", c);
        else
            snprintf(got, sizeof(got), "byte 0x%02x", c);
        if (c == '-' || c == '+')
            hint = " (signs are not allowed)";
        else if (c == '.' || c == 'e' || c == 'E')
            hint = " (only integers are allowed)";
        else if (c == 'x' || c == 'X')
            hint = " (only decimal is allowed)";
    }
    return KVT_TOKENS_FAIL(p, KVT_ERR_PARSE, "byte %zu: expected %s, got %s%s", p->pos, what, got,
                           hint);
}

/* Appends @value (from byte @at) when the array is full: grows it or fails. */
static kvt_status_t kvt_tokens_push(kvt_tokens_parser_t *p, uint32_t value, size_t at)
{
    if (p->n == p->cap) {
        if (p->cap >= p->max)
            return KVT_TOKENS_FAIL(p, KVT_ERR_TOO_BIG, "byte %zu: more than %zu tokens", at,
                                   p->max);
        size_t cap = p->cap == 0 ? 256 : p->cap * 2;
        if (cap > p->max)
            cap = p->max;
        uint32_t *v = realloc(p->v, cap * sizeof(*v));
        if (v == NULL)
            return KVT_TOKENS_FAIL(p, KVT_ERR_NO_MEM, "byte %zu: out of memory for %zu tokens", at,
                                   cap);
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = value;
    return KVT_OK;
}

/*
 * Parses the elements of a list; stops at end of input or at ']' (not
 * consumed). The loop keeps its position in a local (cheaper than p->pos in
 * the per-byte loops) and stores it to p->pos before the returns that need
 * it: the caller and kvt_tokens_expected() read it.
 */
static kvt_status_t kvt_tokens_elements(kvt_tokens_parser_t *p, int bracket)
{
    const char *s = p->s;
    const size_t len = p->len;
    size_t pos = p->pos;
    kvt_status_t st;

    if (pos == len || (bracket && s[pos] == ']')) {
        if (bracket && pos == len)
            return kvt_tokens_expected(p, "a token id or ']'");
        return KVT_OK; /* empty list */
    }
    if (!KVT_TOKENS_IS_DIGIT(s[pos]))
        return kvt_tokens_expected(p, bracket ? "a token id or ']'" : "a token id");

    for (;;) {
        /* s[pos] is a digit. */
        size_t start = pos;
        uint64_t value = 0;
        do {
            value = value * 10 + (uint64_t)(s[pos] - '0');
            if (value > UINT32_MAX)
                return KVT_TOKENS_FAIL(p, KVT_ERR_RANGE, "byte %zu: token id exceeds 4294967295",
                                       start);
            pos++;
        } while (pos < len && KVT_TOKENS_IS_DIGIT(s[pos]));
        if (p->n < p->cap) {
            p->v[p->n++] = (uint32_t)value;
        } else if ((st = kvt_tokens_push(p, (uint32_t)value, start)) != KVT_OK) {
            return st;
        }

        size_t after = pos;
        while (pos < len && KVT_TOKENS_IS_WS(s[pos]))
            pos++;
        p->pos = pos;
        if (pos == len)
            return bracket ? kvt_tokens_expected(p, "',' or ']'") : KVT_OK;
        char c = s[pos];
        if (c == ',') {
            pos++;
            while (pos < len && KVT_TOKENS_IS_WS(s[pos]))
                pos++;
            if (pos == len || !KVT_TOKENS_IS_DIGIT(s[pos])) {
                p->pos = pos;
                return kvt_tokens_expected(p, "a token id after ','");
            }
            continue;
        }
        if (c == ']' && bracket)
            return KVT_OK;
        if (KVT_TOKENS_IS_DIGIT(c) && pos > after)
            continue; /* whitespace-separated */
        if (pos == after)
            return kvt_tokens_expected(p, bracket ? "a digit, ',', whitespace or ']'"
                                                  : "a digit, ',' or whitespace");
        return kvt_tokens_expected(p, bracket ? "a token id, ',' or ']'"
                                              : "a token id, ',' or end of input");
    }
}

kvt_status_t kvt_tokens_parse(const char *s, size_t len, uint32_t **tokens_p, size_t *n_p,
                              char *err, size_t errlen)
{
    return kvt_tokens_parse_max(s, len, KVT_TOKENS_MAX, tokens_p, n_p, err, errlen);
}

kvt_status_t kvt_tokens_parse_max(const char *s, size_t len, size_t max_tokens, uint32_t **tokens_p,
                                  size_t *n_p, char *err, size_t errlen)
{
    kvt_tokens_parser_t p = {.s = s,
                             .len = len,
                             .max = max_tokens < KVT_TOKENS_MAX ? max_tokens : KVT_TOKENS_MAX,
                             .err = err,
                             .errlen = errlen};
    kvt_status_t st;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (tokens_p == NULL || n_p == NULL || (s == NULL && len > 0))
        return KVT_TOKENS_FAIL(&p, KVT_ERR_INVAL, "invalid arguments");

    kvt_tokens_skip_ws(&p);
    int bracket = p.pos < len && s[p.pos] == '[';
    if (bracket) {
        p.pos++;
        kvt_tokens_skip_ws(&p);
    }
    st = kvt_tokens_elements(&p, bracket);
    if (st != KVT_OK)
        goto err_free;
    if (bracket)
        p.pos++; /* the ']' kvt_tokens_elements stopped at */
    kvt_tokens_skip_ws(&p);
    if (p.pos != len) {
        st = kvt_tokens_expected(&p, bracket ? "end of input after ']'" : "end of input");
        goto err_free;
    }

    if (p.n == 0) {
        free(p.v);
        p.v = NULL;
    }
    *tokens_p = p.v;
    *n_p = p.n;
    return KVT_OK;

err_free:
    free(p.v);
    return st;
}
