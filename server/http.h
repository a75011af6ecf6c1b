/*
 * server/http: HTTP/1.1 request heads, parsed in place. Pure functions (no
 * sockets, no allocation), so they are unit-tested and fuzzed on their own;
 * the connection layer (server/conn.c) feeds them bytes and reads bodies.
 *
 * Supported: request line "METHOD /path[?query] HTTP/1.0|1.1", headers
 * without obsolete line folding, bodies by Content-Length. Chunked request
 * bodies are refused (501): every client kvtier targets (curl, Python,
 * libkvtier, routers) sends Content-Length for a JSON body.
 */
#ifndef KVT_SERVER_HTTP_H
#define KVT_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kvt_http_method {
    KVT_HTTP_OTHER = 0,
    KVT_HTTP_GET,
    KVT_HTTP_HEAD,
    KVT_HTTP_POST,
    KVT_HTTP_PUT,
    KVT_HTTP_DELETE,
} kvt_http_method_t;

/* A parsed request head. Pointers point into the caller's buffer. */
typedef struct kvt_http_req {
    kvt_http_method_t method;
    const char *path; /* starts with '/'; no query; not decoded */
    size_t path_len;
    const char *query; /* after '?', NULL when absent */
    size_t query_len;
    unsigned minor;       /* HTTP/1.<minor>: 0 or 1 */
    bool keep_alive;      /* after Connection: and the version's default */
    bool expect_continue; /* "Expect: 100-continue" */
    uint64_t body_len;    /* Content-Length; 0 when absent */
    const char *auth;     /* Authorization value (trimmed), NULL when absent */
    size_t auth_len;
    size_t head_len; /* bytes of the head, final empty line included */
} kvt_http_req_t;

/*
 * Parses the request head at the start of @buf[0..len). Returns 1 when the
 * head is complete (*@req filled), 0 when more bytes are needed (and fewer
 * than @max_head were seen), or -1 on error: then *@status_p is the HTTP
 * status to answer (400 malformed, 431 head longer than @max_head, 501 a
 * chunked body or an unknown transfer coding, 505 not HTTP/1.x) and a
 * one-line reason is in @err (@errlen bytes, may be 0; common/errtext.h).
 * Blank lines before the request line are skipped (RFC 9112 2.2); lines may
 * end in CRLF or LF.
 */
int kvt_http_parse_head(const char *buf, size_t len, size_t max_head, kvt_http_req_t *req,
                        int *status_p, char *err, size_t errlen);

/*
 * Percent-decodes @src[0..len) into @dst (@cap bytes, NUL-terminated).
 * Returns the decoded length, or -1 for a bad escape, a decoded NUL byte or
 * a result that does not fit.
 */
long kvt_http_pct_decode(const char *src, size_t len, char *dst, size_t cap);

/* Reason phrase of @status ("Not Found"); "Unknown" for codes kvtier does not send. */
const char *kvt_http_reason(int status);

#endif
