/*
 * server/http.c: HTTP/1.1 request-head parser (RFC 9112), strict where a
 * lenient reading could desynchronise a keep-alive connection (message
 * length), lenient where curl-style clients differ (bare LF).
 */
#include "server/http.h"

#include <string.h>

#include "common/errtext.h"

/* RFC 9110 tchar */
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool ieq(const char *a, size_t alen, const char *lit)
{
    size_t n = strlen(lit);
    if (alen != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = a[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lit[i])
            return false;
    }
    return true;
}

/* Finds the end of the line starting at @p: *eol_p at '\n', content length excludes CR. */
static const char *line_end(const char *p, const char *end, size_t *content_p)
{
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (nl == NULL)
        return NULL;
    size_t n = (size_t)(nl - p);
    if (n > 0 && p[n - 1] == '\r')
        n--;
    *content_p = n;
    return nl;
}

static kvt_http_method_t method_of(const char *m, size_t n)
{
    static const struct {
        const char *name;
        kvt_http_method_t m;
    } tab[] = {{"GET", KVT_HTTP_GET},
               {"HEAD", KVT_HTTP_HEAD},
               {"POST", KVT_HTTP_POST},
               {"PUT", KVT_HTTP_PUT},
               {"DELETE", KVT_HTTP_DELETE}};
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
        if (strlen(tab[i].name) == n && memcmp(tab[i].name, m, n) == 0)
            return tab[i].m;
    return KVT_HTTP_OTHER;
}

/* Walks a comma-separated header value, calling back per trimmed token. */
static void each_token(const char *v, size_t n, void (*fn)(void *, const char *, size_t), void *arg)
{
    size_t i = 0;
    while (i < n) {
        size_t s = i;
        while (i < n && v[i] != ',')
            i++;
        size_t e = i;
        while (s < e && (v[s] == ' ' || v[s] == '\t'))
            s++;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e > s)
            fn(arg, v + s, e - s);
        i++;
    }
}

typedef struct conn_flags {
    bool close, keep;
} conn_flags_t;

static void conn_token(void *arg, const char *t, size_t n)
{
    conn_flags_t *f = arg;
    if (ieq(t, n, "close"))
        f->close = true;
    else if (ieq(t, n, "keep-alive"))
        f->keep = true;
}

/* Refuses the head with HTTP status @code and the reason @msg. Error path only. */
#define FAIL(code, msg)                                                                            \
    do {                                                                                           \
        *status_p = (code);                                                                        \
        kvt_errf(err, errlen, "%s", (msg));                                                        \
        return -1;                                                                                 \
    } while (0)

int kvt_http_parse_head(const char *buf, size_t len, size_t max_head, kvt_http_req_t *req,
                        int *status_p, char *err, size_t errlen)
{
    size_t scan = len < max_head ? len : max_head;
    const char *p = buf, *end = buf + scan;
    size_t n;
    const char *nl;

    /* skip blank lines before the request line */
    while ((nl = line_end(p, end, &n)) != NULL && n == 0)
        p = nl + 1;
    if (nl == NULL) {
        if (len >= max_head)
            FAIL(431, "request head too large");
        return 0;
    }
    /* the head is complete once an empty line follows */
    const char *q = nl + 1, *head_end = NULL;
    for (;;) {
        size_t hn;
        const char *hnl = line_end(q, end, &hn);
        if (hnl == NULL)
            break;
        if (hn == 0) {
            head_end = hnl + 1;
            break;
        }
        q = hnl + 1;
    }
    if (head_end == NULL) {
        if (len >= max_head)
            FAIL(431, "request head too large");
        return 0;
    }

    kvt_http_req_t r;
    memset(&r, 0, sizeof(r));
    /* request line: method SP target SP version */
    const char *line = p, *sp1 = memchr(line, ' ', n);
    if (sp1 == NULL || sp1 == line)
        FAIL(400, "malformed request line");
    for (const char *c = line; c < sp1; c++)
        if (!is_tchar((unsigned char)*c))
            FAIL(400, "malformed method");
    r.method = method_of(line, (size_t)(sp1 - line));
    const char *tgt = sp1 + 1, *lend = line + n;
    const char *sp2 = memchr(tgt, ' ', (size_t)(lend - tgt));
    if (sp2 == NULL || sp2 == tgt)
        FAIL(400, "malformed request line");
    if (*tgt != '/')
        FAIL(400, "request target must be an absolute path");
    for (const char *c = tgt; c < sp2; c++)
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
            FAIL(400, "bad character in request target");
    const char *ver = sp2 + 1;
    size_t vlen = (size_t)(lend - ver);
    if (vlen != 8 || memcmp(ver, "HTTP/1.", 7) != 0) {
        if (vlen >= 5 && memcmp(ver, "HTTP/", 5) == 0)
            FAIL(505, "only HTTP/1.0 and HTTP/1.1 are supported");
        FAIL(400, "malformed HTTP version");
    }
    if (ver[7] != '0' && ver[7] != '1')
        FAIL(505, "only HTTP/1.0 and HTTP/1.1 are supported");
    r.minor = (unsigned)(ver[7] - '0');
    const char *qm = memchr(tgt, '?', (size_t)(sp2 - tgt));
    r.path = tgt;
    r.path_len = (size_t)((qm ? qm : sp2) - tgt);
    if (qm != NULL) {
        r.query = qm + 1;
        r.query_len = (size_t)(sp2 - qm - 1);
    }

    /* header fields */
    bool have_len = false;
    conn_flags_t cf = {false, false};
    const char *h = nl + 1;
    for (;;) {
        size_t hn = 0;
        const char *hnl = line_end(h, head_end, &hn);
        if (hnl == NULL || hn == 0)
            break; /* the empty line that ends the head */
        if (*h == ' ' || *h == '\t')
            FAIL(400, "obsolete header line folding");
        const char *colon = memchr(h, ':', hn);
        if (colon == NULL || colon == h)
            FAIL(400, "malformed header field");
        for (const char *c = h; c < colon; c++)
            if (!is_tchar((unsigned char)*c))
                FAIL(400, "malformed header name");
        size_t nlen = (size_t)(colon - h);
        const char *v = colon + 1, *ve = h + hn;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        for (const char *c = v; c < ve; c++)
            if ((unsigned char)*c < 0x20 && *c != '\t')
                FAIL(400, "control character in header value");
        size_t vl = (size_t)(ve - v);
        if (ieq(h, nlen, "content-length")) {
            uint64_t x = 0;
            if (vl == 0 || vl > 19)
                FAIL(400, "bad Content-Length");
            for (size_t i = 0; i < vl; i++) {
                if (v[i] < '0' || v[i] > '9')
                    FAIL(400, "bad Content-Length");
                x = x * 10 + (uint64_t)(v[i] - '0');
            }
            if (have_len && x != r.body_len)
                FAIL(400, "conflicting Content-Length headers");
            have_len = true;
            r.body_len = x;
        } else if (ieq(h, nlen, "transfer-encoding")) {
            FAIL(501, "Transfer-Encoding is not supported: send Content-Length");
        } else if (ieq(h, nlen, "connection")) {
            each_token(v, vl, conn_token, &cf);
        } else if (ieq(h, nlen, "authorization")) {
            r.auth = v;
            r.auth_len = vl;
        } else if (ieq(h, nlen, "expect")) {
            if (!ieq(v, vl, "100-continue"))
                FAIL(417, "unsupported Expect value");
            r.expect_continue = true;
        }
        h = hnl + 1;
    }
    r.keep_alive = r.minor == 1 ? !cf.close : (cf.keep && !cf.close);
    r.head_len = (size_t)(head_end - buf);
    *req = r;
    return 1;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

long kvt_http_pct_decode(const char *src, size_t len, char *dst, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = src[i];
        if (c == '%') {
            if (i + 2 >= len)
                return -1;
            int hi = hexval(src[i + 1]), lo = hexval(src[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return -1;
            c = (char)(hi * 16 + lo);
            i += 2;
        }
        if (o + 1 >= cap)
            return -1;
        dst[o++] = c;
    }
    if (cap == 0)
        return -1;
    dst[o] = '\0';
    return (long)o;
}

const char *kvt_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
