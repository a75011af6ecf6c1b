/*
 * bench/trace_csv: the Azure LLM inference trace (TIMESTAMP,ContextTokens,
 * GeneratedTokens). Each line is checked whole, with a cursor bounded by its
 * end, so every error names its line and nothing of a bad file is returned.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace.h"
#include "bench/trace_int.h"
#include "common/errtext.h"
#include "common/grow.h"

#define CSV_HEADER "TIMESTAMP,ContextTokens,GeneratedTokens"

/* Exactly @n decimal digits as a number. */
static int csv_digits(kvt_trace_cur_t *c, int n, unsigned *v_p)
{
    unsigned v = 0;
    for (int i = 0; i < n; i++, c->p++) {
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return -1;
        v = v * 10 + (unsigned)(*c->p - '0');
    }
    *v_p = v;
    return 0;
}

static int csv_sep(kvt_trace_cur_t *c, char ch)
{
    if (c->p >= c->end || *c->p != ch)
        return -1;
    c->p++;
    return 0;
}

/* Days from 1970-01-01 to @y-@m-@d of the proleptic Gregorian calendar. */
static int64_t csv_days(int64_t y, int64_t m, int64_t d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static unsigned csv_month_days(unsigned y, unsigned m)
{
    static const unsigned days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

/* "YYYY-MM-DD HH:MM:SS[.fraction]" as microseconds since 1970. */
static int csv_time(kvt_trace_cur_t *c, int64_t *us_p)
{
    unsigned y, mo, d, h, mi, s, frac = 0;
    if (csv_digits(c, 4, &y) != 0 || csv_sep(c, '-') != 0 || csv_digits(c, 2, &mo) != 0 ||
        csv_sep(c, '-') != 0 || csv_digits(c, 2, &d) != 0 || csv_sep(c, ' ') != 0 ||
        csv_digits(c, 2, &h) != 0 || csv_sep(c, ':') != 0 || csv_digits(c, 2, &mi) != 0 ||
        csv_sep(c, ':') != 0 || csv_digits(c, 2, &s) != 0)
        return kvt_trace_fail(c, "TIMESTAMP: expected YYYY-MM-DD HH:MM:SS[.fraction]");
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        int n = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (n < 6)
                frac = frac * 10 + (unsigned)(*c->p - '0');
            n++;
            c->p++;
        }
        if (n == 0 || n > 9)
            return kvt_trace_fail(c, "TIMESTAMP: a fraction of 1 to 9 digits expected");
        for (int i = n; i < 6; i++)
            frac *= 10;
    }
    if (mo < 1 || mo > 12 || d < 1 || d > csv_month_days(y, mo) || h > 23 || mi > 59 || s > 59)
        return kvt_trace_fail(c, "TIMESTAMP: no such date or time");
    int64_t secs = csv_days(y, mo, d) * 86400 + (int64_t)h * 3600 + mi * 60 + s;
    *us_p = secs * 1000000 + frac;
    return 0;
}

/* A non-negative integer that fits 32 bits. */
static int csv_u32(kvt_trace_cur_t *c, const char *what, uint32_t *v_p)
{
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return kvt_trace_fail(c, "%s: expected a non-negative integer", what);
    uint64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        v = v * 10 + (uint64_t)(*c->p - '0');
        if (v > UINT32_MAX)
            return kvt_trace_fail(c, "%s: number out of range (max %u)", what, UINT32_MAX);
        c->p++;
    }
    *v_p = (uint32_t)v;
    return 0;
}

kvt_status_t kvt_trace_parse_csv(const char *buf, size_t len, kvt_trace_t **t_p, char *err,
                                 size_t errlen)
{
    if ((buf == NULL && len > 0) || t_p == NULL) {
        kvt_errf(err, errlen, "kvt_trace_parse_csv: NULL argument");
        return KVT_ERR_INVAL;
    }
    kvt_trace_req_t *reqs = NULL;
    size_t n = 0, cap = 0;
    int64_t first_us = 0;
    bool header = false;
    kvt_trace_cur_t c = {.err = err, .errlen = errlen};
    const char *p = buf, *end = buf + len;
    if (len >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0)
        p += 3;
    for (size_t line = 1; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        c.p = p;
        c.end = le > p && le[-1] == '\r' ? le - 1 : le;
        c.line = line;
        p = nl != NULL ? nl + 1 : end;
        if (c.p == c.end)
            continue;
        if (!header) {
            size_t hl = strlen(CSV_HEADER);
            if ((size_t)(c.end - c.p) != hl || memcmp(c.p, CSV_HEADER, hl) != 0) {
                kvt_trace_fail(&c, "expected the header " CSV_HEADER);
                goto err_parse;
            }
            header = true;
            continue;
        }
        kvt_trace_req_t r = {0};
        int64_t us = 0;
        if (csv_time(&c, &us) != 0)
            goto err_parse;
        if (csv_sep(&c, ',') != 0) {
            kvt_trace_fail(&c, "expected ',' after TIMESTAMP");
            goto err_parse;
        }
        if (csv_u32(&c, "ContextTokens", &r.input_length) != 0)
            goto err_parse;
        if (csv_sep(&c, ',') != 0) {
            kvt_trace_fail(&c, "expected ',' after ContextTokens");
            goto err_parse;
        }
        if (csv_u32(&c, "GeneratedTokens", &r.output_length) != 0)
            goto err_parse;
        if (c.p != c.end) {
            kvt_trace_fail(&c, "expected the end of the row after GeneratedTokens");
            goto err_parse;
        }
        if (n == 0)
            first_us = us;
        if (us < first_us) {
            kvt_trace_fail(&c, "TIMESTAMP before the first row's");
            goto err_parse;
        }
        r.timestamp_ms = (uint64_t)(us - first_us) / 1000;
        if (!kvt_grow(&reqs, &cap, n + 1, sizeof(*reqs), 1024)) {
            kvt_errf(err, errlen, "out of memory");
            free(reqs);
            return KVT_ERR_NO_MEM;
        }
        reqs[n++] = r;
    }
    if (!header) {
        c.line = 1;
        kvt_trace_fail(&c, "expected the header " CSV_HEADER ", found an empty file");
        goto err_parse;
    }
    kvt_trace_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        kvt_errf(err, errlen, "out of memory");
        free(reqs);
        return KVT_ERR_NO_MEM;
    }
    t->reqs = reqs;
    t->nreqs = n;
    *t_p = t;
    return KVT_OK;

err_parse:
    free(reqs);
    return KVT_ERR_PARSE;
}

kvt_status_t kvt_trace_load_csv(const char *path, kvt_trace_t **t_p, char *err, size_t errlen)
{
    return kvt_trace_load_with(path, kvt_trace_parse_csv, t_p, err, errlen);
}
