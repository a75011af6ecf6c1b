/*
 * proto/proto.c: the binary RPC codec (proto.h, docs/protocol.md).
 *
 * Byte order is handled byte by byte, so the code is independent of the host
 * order and of alignment: bodies are parsed in place and their numbers may sit
 * at any address.
 */
#include "proto/proto.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"

/* ---- little-endian helpers ------------------------------------------------------------------ */

static uint16_t ld16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t ld64(const uint8_t *p)
{
    return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

static void st16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void st32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void st64(uint8_t *p, uint64_t v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, 8); /* gcc merges st32's bytes, not this loop's */
#else
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
#endif
}

/* ---- header --------------------------------------------------------------------------------- */

#define KVT_PROTO_F_KNOWN (KVT_PROTO_F_RESPONSE | KVT_PROTO_F_ERROR | KVT_PROTO_F_ENGINE_KEYS)

bool kvt_proto_op_known(uint8_t op)
{
    switch (op) {
    case KVT_PROTO_OP_HELLO:
    case KVT_PROTO_OP_PING:
    case KVT_PROTO_OP_QUERY:
    case KVT_PROTO_OP_EVENTS:
    case KVT_PROTO_OP_ENGINE_DROP:
    case KVT_PROTO_OP_ENGINE_ADD:
    case KVT_PROTO_OP_MODEL_DROP:
    case KVT_PROTO_OP_ROUTED:
    case KVT_PROTO_OP_STATS:
    case KVT_PROTO_OP_ATTACH:
    case KVT_PROTO_OP_LOOKUP:
    case KVT_PROTO_OP_RESERVE:
    case KVT_PROTO_OP_COMMIT:
    case KVT_PROTO_OP_PIN:
    case KVT_PROTO_OP_UNPIN:
    case KVT_PROTO_OP_PREFETCH:
    case KVT_PROTO_OP_BLOCK_PUT:
    case KVT_PROTO_OP_BLOCK_GET:
    case KVT_PROTO_OP_BLOCK_DELETE:
    case KVT_PROTO_OP_XFER_HELLO:
    case KVT_PROTO_OP_XFER_PIN:
    case KVT_PROTO_OP_XFER_RENEW:
    case KVT_PROTO_OP_XFER_RELEASE:
    case KVT_PROTO_OP_XFER_RESERVE:
    case KVT_PROTO_OP_XFER_COMMIT:
    case KVT_PROTO_OP_TRANSFER: return true;
    }
    return false;
}

const char *kvt_proto_op_name(uint8_t op)
{
    switch (op) {
    case KVT_PROTO_OP_HELLO: return "HELLO";
    case KVT_PROTO_OP_PING: return "PING";
    case KVT_PROTO_OP_QUERY: return "QUERY";
    case KVT_PROTO_OP_EVENTS: return "EVENTS";
    case KVT_PROTO_OP_ENGINE_DROP: return "ENGINE_DROP";
    case KVT_PROTO_OP_ENGINE_ADD: return "ENGINE_ADD";
    case KVT_PROTO_OP_MODEL_DROP: return "MODEL_DROP";
    case KVT_PROTO_OP_ROUTED: return "ROUTED";
    case KVT_PROTO_OP_STATS: return "STATS";
    case KVT_PROTO_OP_ATTACH: return "ATTACH";
    case KVT_PROTO_OP_LOOKUP: return "LOOKUP";
    case KVT_PROTO_OP_RESERVE: return "RESERVE";
    case KVT_PROTO_OP_COMMIT: return "COMMIT";
    case KVT_PROTO_OP_PIN: return "PIN";
    case KVT_PROTO_OP_UNPIN: return "UNPIN";
    case KVT_PROTO_OP_PREFETCH: return "PREFETCH";
    case KVT_PROTO_OP_BLOCK_PUT: return "BLOCK_PUT";
    case KVT_PROTO_OP_BLOCK_GET: return "BLOCK_GET";
    case KVT_PROTO_OP_BLOCK_DELETE: return "BLOCK_DELETE";
    case KVT_PROTO_OP_XFER_HELLO: return "XFER_HELLO";
    case KVT_PROTO_OP_XFER_PIN: return "XFER_PIN";
    case KVT_PROTO_OP_XFER_RENEW: return "XFER_RENEW";
    case KVT_PROTO_OP_XFER_RELEASE: return "XFER_RELEASE";
    case KVT_PROTO_OP_XFER_RESERVE: return "XFER_RESERVE";
    case KVT_PROTO_OP_XFER_COMMIT: return "XFER_COMMIT";
    case KVT_PROTO_OP_TRANSFER: return "TRANSFER";
    }
    return "UNKNOWN";
}

bool kvt_proto_op_mutating(uint8_t op)
{
    switch (op) {
    case KVT_PROTO_OP_EVENTS:
    case KVT_PROTO_OP_ENGINE_DROP:
    case KVT_PROTO_OP_ENGINE_ADD:
    case KVT_PROTO_OP_MODEL_DROP:
    case KVT_PROTO_OP_ROUTED:
    /* the tier's: an arena mapped read-write, slots taken or filled, blocks stored or dropped */
    case KVT_PROTO_OP_ATTACH:
    case KVT_PROTO_OP_RESERVE:
    case KVT_PROTO_OP_COMMIT:
    case KVT_PROTO_OP_BLOCK_PUT:
    case KVT_PROTO_OP_BLOCK_DELETE:
    /* the transfer's: XFER_HELLO hands out the arena's rkey, the others take, hold or fill
     * slots, TRANSFER stores blocks */
    case KVT_PROTO_OP_XFER_HELLO:
    case KVT_PROTO_OP_XFER_PIN:
    case KVT_PROTO_OP_XFER_RENEW:
    case KVT_PROTO_OP_XFER_RELEASE:
    case KVT_PROTO_OP_XFER_RESERVE:
    case KVT_PROTO_OP_XFER_COMMIT:
    case KVT_PROTO_OP_TRANSFER: return true;
    }
    return false;
}

uint16_t kvt_proto_http_status(kvt_status_t st)
{
    switch (st) {
    case KVT_ERR_INVAL:
    case KVT_ERR_PARSE:
    case KVT_ERR_RANGE:
    case KVT_ERR_PROTO: return 400;
    case KVT_ERR_NOT_FOUND: return 404;
    case KVT_ERR_EXISTS: return 409;
    case KVT_ERR_STALE: return 412; /* an incarnation the server no longer has */
    case KVT_ERR_TOO_BIG: return 413;
    case KVT_ERR_UNSUPPORTED: return 501;
    case KVT_ERR_LIMIT: /* a limit of the server (queue, connections, streams): retry later */
    case KVT_ERR_NO_SPACE:
    case KVT_ERR_NO_MEM:
    case KVT_ERR_TIMEOUT:
    case KVT_ERR_CLOSED:
    case KVT_ERR_PEER:
    case KVT_ERR_IO: return 503;
    default: return 500;
    }
}

void kvt_proto_hdr_peek(const uint8_t *buf, kvt_proto_hdr_t *h)
{
    h->version = buf[4];
    h->op = buf[5];
    h->flags = ld16(buf + 6);
    h->req_id = ld64(buf + 8);
    h->body_len = ld32(buf + 16);
}

kvt_status_t kvt_proto_hdr_check(const uint8_t *buf, uint32_t max_body, kvt_proto_hdr_t *h_p,
                                 char *err, size_t errlen)
{
    kvt_proto_hdr_t h;

    if (max_body > KVT_PROTO_MAX_BODY_LIMIT)
        max_body = KVT_PROTO_MAX_BODY_LIMIT;
    kvt_proto_hdr_peek(buf, &h);
    if (ld32(buf) != KVT_PROTO_MAGIC) {
        kvt_errf(err, errlen, "header: bad magic (not a kvtier frame)");
        return KVT_ERR_PROTO;
    }
    if (h.version != KVT_PROTO_VERSION) {
        kvt_errf(err, errlen, "header: unsupported protocol version");
        return KVT_ERR_PROTO;
    }
    if ((h.flags & ~KVT_PROTO_F_KNOWN) != 0) {
        kvt_errf(err, errlen, "header: unknown flag bits");
        return KVT_ERR_PROTO;
    }
    if ((h.flags & KVT_PROTO_F_ERROR) != 0 && (h.flags & KVT_PROTO_F_RESPONSE) == 0) {
        kvt_errf(err, errlen, "header: error flag on a request");
        return KVT_ERR_PROTO;
    }
    if ((h.flags & KVT_PROTO_F_ENGINE_KEYS) != 0 && (h.flags & KVT_PROTO_F_RESPONSE) != 0) {
        kvt_errf(err, errlen, "header: engine-keys flag on an answer");
        return KVT_ERR_PROTO;
    }
    if (ld32(buf + 20) != 0) {
        kvt_errf(err, errlen, "header: reserved field is not zero");
        return KVT_ERR_PROTO;
    }
    if (h.body_len > max_body) {
        kvt_errf(err, errlen, "header: body larger than the maximum frame size");
        return KVT_ERR_TOO_BIG;
    }
    if (!kvt_proto_op_known(h.op)) {
        kvt_errf(err, errlen, "header: unknown opcode");
        return KVT_ERR_UNSUPPORTED;
    }
    *h_p = h;
    return KVT_OK;
}

kvt_status_t kvt_proto_hdr_decode(const uint8_t *buf, uint32_t max_body, kvt_proto_hdr_t *h_p)
{
    return kvt_proto_hdr_check(buf, max_body, h_p, NULL, 0);
}

void kvt_proto_hdr_encode(const kvt_proto_hdr_t *h, uint8_t *out)
{
    st32(out, KVT_PROTO_MAGIC);
    out[4] = h->version;
    out[5] = h->op;
    st16(out + 6, h->flags);
    st64(out + 8, h->req_id);
    st32(out + 16, h->body_len);
    st32(out + 20, 0);
}

/* ---- reader --------------------------------------------------------------------------------- */

void kvt_proto_rd_init(kvt_proto_rd_t *r, const void *p, size_t len)
{
    /* NULL + 0 is undefined behaviour in C, so an empty body gets a dummy pointer. */
    static const uint8_t empty[1];
    r->p = p != NULL ? p : empty;
    r->end = r->p + (p != NULL ? len : 0);
    r->bad = false;
}

size_t kvt_proto_rd_left(const kvt_proto_rd_t *r)
{
    return r->bad ? 0 : (size_t)(r->end - r->p);
}

bool kvt_proto_rd_done(const kvt_proto_rd_t *r)
{
    return !r->bad && r->p == r->end;
}

const uint8_t *kvt_proto_rd_raw(kvt_proto_rd_t *r, size_t n)
{
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    return p;
}

uint8_t kvt_proto_rd_u8(kvt_proto_rd_t *r)
{
    const uint8_t *p = kvt_proto_rd_raw(r, 1);
    return p != NULL ? p[0] : 0;
}

uint16_t kvt_proto_rd_u16(kvt_proto_rd_t *r)
{
    const uint8_t *p = kvt_proto_rd_raw(r, 2);
    return p != NULL ? ld16(p) : 0;
}

uint32_t kvt_proto_rd_u32(kvt_proto_rd_t *r)
{
    const uint8_t *p = kvt_proto_rd_raw(r, 4);
    return p != NULL ? ld32(p) : 0;
}

uint64_t kvt_proto_rd_u64(kvt_proto_rd_t *r)
{
    const uint8_t *p = kvt_proto_rd_raw(r, 8);
    return p != NULL ? ld64(p) : 0;
}

int32_t kvt_proto_rd_i32(kvt_proto_rd_t *r)
{
    uint32_t u = kvt_proto_rd_u32(r);
    int32_t v;
    memcpy(&v, &u, sizeof(v)); /* two's complement without implementation-defined casts */
    return v;
}

double kvt_proto_rd_f64(kvt_proto_rd_t *r)
{
    uint64_t u = kvt_proto_rd_u64(r);
    double v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

kvt_proto_str_t kvt_proto_rd_str(kvt_proto_rd_t *r)
{
    kvt_proto_str_t s = {NULL, 0};
    if (r->bad)
        return s;
    const uint8_t *start = r->p;
    uint16_t len = kvt_proto_rd_u16(r);
    const uint8_t *p = kvt_proto_rd_raw(r, len);
    if (p == NULL || len > KVT_PROTO_MAX_STR || memchr(p, '\0', len) != NULL) {
        r->p = start; /* a failed read does not advance */
        r->bad = true;
        return s;
    }
    s.p = (const char *)p;
    s.len = len;
    return s;
}

/* ---- writer --------------------------------------------------------------------------------- */

void kvt_proto_wr_init(kvt_proto_wr_t *w)
{
    memset(w, 0, sizeof(*w));
}

void kvt_proto_wr_cleanup(kvt_proto_wr_t *w)
{
    free(w->buf);
    memset(w, 0, sizeof(*w));
}

void kvt_proto_wr_reset(kvt_proto_wr_t *w)
{
    w->len = 0;
    w->oom = false;
    w->bad = false;
}

kvt_status_t kvt_proto_wr_reserve(kvt_proto_wr_t *w, size_t n)
{
    if (w->cap - w->len >= n)
        return KVT_OK;
    if (n > SIZE_MAX / 2 - w->len) {
        w->oom = true;
        return KVT_ERR_NO_MEM;
    }
    size_t cap = w->cap < 256 ? 256 : w->cap;
    while (cap - w->len < n)
        cap *= 2;
    uint8_t *buf = realloc(w->buf, cap);
    if (buf == NULL) {
        w->oom = true;
        return KVT_ERR_NO_MEM;
    }
    w->buf = buf;
    w->cap = cap;
    return KVT_OK;
}

void kvt_proto_wr_consume(kvt_proto_wr_t *w, size_t n)
{
    if (n >= w->len) {
        w->len = 0;
        return;
    }
    memmove(w->buf, w->buf + n, w->len - n);
    w->len -= n;
}

/* Returns where @n bytes may be written, or NULL after an allocation failure. */
static uint8_t *wr_room(kvt_proto_wr_t *w, size_t n)
{
    if (w->oom || kvt_proto_wr_reserve(w, n) != KVT_OK)
        return NULL;
    uint8_t *p = w->buf + w->len;
    w->len += n;
    return p;
}

void kvt_proto_wr_raw(kvt_proto_wr_t *w, const void *p, size_t len)
{
    if (len == 0)
        return;
    uint8_t *dst = wr_room(w, len);
    if (dst != NULL)
        memcpy(dst, p, len);
}

void kvt_proto_wr_u8(kvt_proto_wr_t *w, uint8_t v)
{
    uint8_t *p = wr_room(w, 1);
    if (p != NULL)
        p[0] = v;
}

void kvt_proto_wr_u16(kvt_proto_wr_t *w, uint16_t v)
{
    uint8_t *p = wr_room(w, 2);
    if (p != NULL)
        st16(p, v);
}

void kvt_proto_wr_u32(kvt_proto_wr_t *w, uint32_t v)
{
    uint8_t *p = wr_room(w, 4);
    if (p != NULL)
        st32(p, v);
}

void kvt_proto_wr_u64(kvt_proto_wr_t *w, uint64_t v)
{
    uint8_t *p = wr_room(w, 8);
    if (p != NULL)
        st64(p, v);
}

void kvt_proto_wr_i32(kvt_proto_wr_t *w, int32_t v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    kvt_proto_wr_u32(w, u);
}

void kvt_proto_wr_f64(kvt_proto_wr_t *w, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    kvt_proto_wr_u64(w, u);
}

void kvt_proto_wr_str(kvt_proto_wr_t *w, const char *p, size_t len)
{
    if (len > KVT_PROTO_MAX_STR || (len > 0 && (p == NULL || memchr(p, '\0', len) != NULL))) {
        w->bad = true;
        return;
    }
    kvt_proto_wr_u16(w, (uint16_t)len);
    kvt_proto_wr_raw(w, p, len);
}

size_t kvt_proto_wr_frame_begin(kvt_proto_wr_t *w, uint8_t op, uint16_t flags, uint64_t req_id)
{
    size_t off = w->len;
    kvt_proto_hdr_t h = {KVT_PROTO_VERSION, op, flags, req_id, 0};
    uint8_t *p = wr_room(w, KVT_PROTO_HDR_SIZE);
    if (p != NULL)
        kvt_proto_hdr_encode(&h, p);
    return off;
}

kvt_status_t kvt_proto_wr_frame_end(kvt_proto_wr_t *w, size_t off)
{
    kvt_status_t st = KVT_OK;

    if (w->oom)
        st = KVT_ERR_NO_MEM;
    else if (w->bad || off > w->len || w->len - off < KVT_PROTO_HDR_SIZE ||
             w->len - off - KVT_PROTO_HDR_SIZE > KVT_PROTO_MAX_BODY_LIMIT)
        st = KVT_ERR_TOO_BIG;
    if (st != KVT_OK) {
        if (off < w->len)
            w->len = off;
        w->oom = false;
        w->bad = false;
        return st;
    }
    st32(w->buf + off + 16, (uint32_t)(w->len - off - KVT_PROTO_HDR_SIZE));
    return KVT_OK;
}

kvt_status_t kvt_proto_raw_encode(kvt_proto_wr_t *w, uint8_t op, uint16_t flags, uint64_t req_id,
                                  const void *body, size_t len)
{
    if (len > KVT_PROTO_MAX_BODY_LIMIT)
        return KVT_ERR_TOO_BIG; /* before copying up to SIZE_MAX bytes */
    size_t off = kvt_proto_wr_frame_begin(w, op, flags, req_id);
    kvt_proto_wr_raw(w, body, len);
    return kvt_proto_wr_frame_end(w, off);
}

/* ---- HELLO ---------------------------------------------------------------------------------- */

kvt_status_t kvt_proto_hello_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                        const kvt_proto_hello_req_t *h)
{
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_HELLO, 0, req_id);
    kvt_proto_wr_u32(w, h->client_version);
    kvt_proto_wr_str(w, h->token.p, h->token.len);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_hello_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                        const kvt_proto_hello_ans_t *h)
{
    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_HELLO, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u32(w, h->server_version);
    kvt_proto_wr_u32(w, h->max_body);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_hello_req_decode(const uint8_t *body, size_t len, kvt_proto_hello_req_t *h_p,
                                        char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_hello_req_t h;

    kvt_proto_rd_init(&r, body, len);
    h.client_version = kvt_proto_rd_u32(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "hello: body shorter than its version field");
        return KVT_ERR_INVAL;
    }
    h.token = kvt_proto_rd_str(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "hello: bad auth token string (truncated, too long or NUL byte)");
        return KVT_ERR_INVAL;
    }
    if (!kvt_proto_rd_done(&r)) {
        kvt_errf(err, errlen, "hello: trailing bytes after the auth token");
        return KVT_ERR_INVAL;
    }
    *h_p = h;
    return KVT_OK;
}

kvt_status_t kvt_proto_hello_ans_decode(const uint8_t *body, size_t len, kvt_proto_hello_ans_t *h_p,
                                        char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_hello_ans_t h;

    kvt_proto_rd_init(&r, body, len);
    h.server_version = kvt_proto_rd_u32(&r);
    h.max_body = kvt_proto_rd_u32(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "hello answer: body shorter than 8 bytes");
        return KVT_ERR_INVAL;
    }
    if (!kvt_proto_rd_done(&r)) {
        kvt_errf(err, errlen, "hello answer: trailing bytes");
        return KVT_ERR_INVAL;
    }
    *h_p = h;
    return KVT_OK;
}

/* ---- QUERY request -------------------------------------------------------------------------- */

bool kvt_proto_query_kind_tokens(uint8_t kind)
{
    return kind == KVT_PROTO_Q_TOKENS || kind == KVT_PROTO_Q_TOKENS_SALTED;
}

/*
 * Reads one str field of a QUERY request into *@s. False, with @bad_why (a
 * malformed str) or @empty_why (an empty one, when @empty_why is not NULL)
 * in @err (@errlen bytes), when it is refused.
 */
static bool query_str(kvt_proto_rd_t *r, kvt_proto_str_t *s, const char *bad_why,
                      const char *empty_why, char *err, size_t errlen)
{
    *s = kvt_proto_rd_str(r);
    if (r->bad) {
        kvt_errf(err, errlen, "%s", bad_why);
        return false;
    }
    if (s->len == 0 && empty_why != NULL) {
        kvt_errf(err, errlen, "%s", empty_why);
        return false;
    }
    return true;
}

kvt_status_t kvt_proto_query_decode(const uint8_t *body, size_t len, uint32_t max_items,
                                    kvt_proto_query_t *q_p, char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_query_t q;

    kvt_proto_rd_init(&r, body, len);
    if (!query_str(&r, &q.model, "query: bad model string (truncated, too long or NUL byte)",
                   "query: empty model name", err, errlen) ||
        !query_str(&r, &q.lora, "query: bad lora string (truncated, too long or NUL byte)", NULL,
                   err, errlen))
        return KVT_ERR_INVAL;
    q.kind = kvt_proto_rd_u8(&r);
    const uint8_t *pad = kvt_proto_rd_raw(&r, 3);
    if (r.bad) {
        kvt_errf(err, errlen, "query: body ends inside kind, pad or count");
        return KVT_ERR_INVAL;
    }
    if (q.kind != KVT_PROTO_Q_KEYS && !kvt_proto_query_kind_tokens(q.kind)) {
        kvt_errf(err, errlen, "query: unknown kind (0 tokens, 1 keys, 2 salted tokens)");
        return KVT_ERR_INVAL;
    }
    if (pad[0] != 0 || pad[1] != 0 || pad[2] != 0) {
        kvt_errf(err, errlen, "query: pad bytes are not zero");
        return KVT_ERR_INVAL;
    }
    q.salt = (kvt_proto_str_t){NULL, 0};
    /* one encoding per request: no salt is kind 0, never kind 2 with "" */
    if (q.kind == KVT_PROTO_Q_TOKENS_SALTED &&
        !query_str(&r, &q.salt, "query: bad cache salt string (truncated, too long or NUL byte)",
                   "query: empty cache salt under kind 2 (no salt is kind 0)", err, errlen))
        return KVT_ERR_INVAL;
    q.n = kvt_proto_rd_u32(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "query: body ends inside kind, pad or count");
        return KVT_ERR_INVAL;
    }
    if (q.n > max_items) {
        kvt_errf(err, errlen, "query: more tokens or keys than the server accepts");
        return KVT_ERR_TOO_BIG;
    }
    size_t width = q.kind == KVT_PROTO_Q_KEYS ? 8 : 4;
    if ((size_t)q.n > kvt_proto_rd_left(&r) / width) {
        kvt_errf(err, errlen, "query: body ends inside the values");
        return KVT_ERR_INVAL;
    }
    q.values = kvt_proto_rd_raw(&r, (size_t)q.n * width);
    q.npods = kvt_proto_rd_u32(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "query: body ends before the pod count");
        return KVT_ERR_INVAL;
    }
    q.pods = r.p;
    for (uint32_t i = 0; i < q.npods; i++) {
        kvt_proto_str_t pod;
        if (!query_str(&r, &pod, "query: bad pod name (truncated, too long or NUL byte)",
                       "query: empty pod name", err, errlen))
            return KVT_ERR_INVAL;
    }
    q.pods_len = (size_t)(r.p - q.pods);
    if (!kvt_proto_rd_done(&r)) {
        kvt_errf(err, errlen, "query: trailing bytes after the pod list");
        return KVT_ERR_INVAL;
    }
    *q_p = q;
    return KVT_OK;
}

uint32_t kvt_proto_query_token(const kvt_proto_query_t *q, uint32_t i)
{
    return ld32(q->values + (size_t)i * 4);
}

uint64_t kvt_proto_query_key(const kvt_proto_query_t *q, uint32_t i)
{
    return ld64(q->values + (size_t)i * 8);
}

void kvt_proto_query_values(const kvt_proto_query_t *q, void *out)
{
    size_t w = q->kind == KVT_PROTO_Q_KEYS ? 8 : 4;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(out, q->values, (size_t)q->n * w); /* the wire order is the host's */
#else
    for (uint32_t i = 0; i < q->n; i++) {
        if (w == 8)
            ((uint64_t *)out)[i] = ld64(q->values + (size_t)i * 8);
        else
            ((uint32_t *)out)[i] = ld32(q->values + (size_t)i * 4);
    }
#endif
}

kvt_status_t kvt_proto_query_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                        const kvt_proto_query_req_t *q)
{
    bool by_tokens = kvt_proto_query_kind_tokens(q->kind);
    if (q->kind != KVT_PROTO_Q_KEYS && !by_tokens)
        return KVT_ERR_INVAL;
    if (q->model.len == 0)
        return KVT_ERR_INVAL;
    /* kind 2 always carries a salt and the others never do: a salt is not silently dropped */
    if ((q->kind == KVT_PROTO_Q_TOKENS_SALTED) != (q->salt.len > 0))
        return KVT_ERR_INVAL;
    const void *vals = by_tokens ? (const void *)q->tokens : q->keys;
    if (q->n > 0 && vals == NULL)
        return KVT_ERR_INVAL;
    if (q->npods > 0 && q->pods == NULL)
        return KVT_ERR_INVAL;
    for (uint32_t i = 0; i < q->npods; i++)
        if (q->pods[i].len == 0)
            return KVT_ERR_INVAL;
    size_t width = by_tokens ? 4 : 8;
    if ((size_t)q->n > KVT_PROTO_MAX_BODY_LIMIT / width)
        return KVT_ERR_TOO_BIG;

    size_t off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_QUERY, 0, req_id);
    kvt_proto_wr_str(w, q->model.p, q->model.len);
    kvt_proto_wr_str(w, q->lora.p, q->lora.len);
    kvt_proto_wr_u8(w, q->kind);
    kvt_proto_wr_raw(w, "\0\0\0", 3);
    if (q->kind == KVT_PROTO_Q_TOKENS_SALTED)
        kvt_proto_wr_str(w, q->salt.p, q->salt.len);
    kvt_proto_wr_u32(w, q->n);
    /* One reservation, then direct stores: the values are the bulk of the frame. */
    uint8_t *dst = wr_room(w, (size_t)q->n * width);
    if (dst != NULL) {
        if (by_tokens)
            for (uint32_t i = 0; i < q->n; i++)
                st32(dst + (size_t)i * 4, q->tokens[i]);
        else
            for (uint32_t i = 0; i < q->n; i++)
                st64(dst + (size_t)i * 8, q->keys[i]);
    }
    kvt_proto_wr_u32(w, q->npods);
    for (uint32_t i = 0; i < q->npods; i++)
        kvt_proto_wr_str(w, q->pods[i].p, q->pods[i].len);
    return kvt_proto_wr_frame_end(w, off);
}

/* ---- QUERY answer --------------------------------------------------------------------------- */

void kvt_proto_query_ans_begin(kvt_proto_wr_t *w, uint64_t req_id, uint32_t block_size,
                               uint32_t num_blocks, kvt_proto_query_ans_enc_t *e)
{
    e->frame_off = kvt_proto_wr_frame_begin(w, KVT_PROTO_OP_QUERY, KVT_PROTO_F_RESPONSE, req_id);
    kvt_proto_wr_u32(w, block_size);
    kvt_proto_wr_u32(w, num_blocks);
    e->npods_off = w->len;
    kvt_proto_wr_u32(w, 0);
    e->npods = 0;
}

enum { POD_ANS_FIXED = 2 + 28 }; /* name length, then 5 x u32 + f64 around the name */

uint8_t *kvt_proto_query_ans_put(kvt_proto_query_ans_enc_t *e, uint8_t *p,
                                 const kvt_proto_pod_ans_t *pod)
{
    st16(p, (uint16_t)pod->pod.len);
    memcpy(p + 2, pod->pod.p, pod->pod.len);
    p += 2 + pod->pod.len;
    st32(p, pod->dp_rank);
    st32(p + 4, pod->matched);
    st32(p + 8, pod->gpu);
    st32(p + 12, pod->cpu);
    st32(p + 16, pod->disk);
    uint64_t u;
    memcpy(&u, &pod->score, sizeof(u));
    st64(p + 20, u);
    e->npods++;
    return p + 28;
}

uint8_t *kvt_proto_query_ans_room(kvt_proto_wr_t *w, kvt_proto_query_ans_enc_t *e, size_t n,
                                  size_t name_bytes)
{
    if (n > UINT32_MAX - e->npods) {
        w->bad = true; /* npods is a u32 on the wire */
        return NULL;
    }
    if (name_bytes > SIZE_MAX / 4 || n > SIZE_MAX / 4 / POD_ANS_FIXED) {
        w->oom = true;
        return NULL;
    }
    if (w->oom || kvt_proto_wr_reserve(w, n * POD_ANS_FIXED + name_bytes) != KVT_OK)
        return NULL;
    return w->buf + w->len;
}

void kvt_proto_query_ans_commit(kvt_proto_wr_t *w, const uint8_t *end)
{
    if (w->buf == NULL || end < w->buf + w->len || end > w->buf + w->cap) {
        w->bad = true;
        return;
    }
    w->len = (size_t)(end - w->buf);
}

void kvt_proto_query_ans_add(kvt_proto_wr_t *w, kvt_proto_query_ans_enc_t *e,
                             const kvt_proto_pod_ans_t *pod)
{
    if (pod->pod.len == 0 || !isfinite(pod->score) || pod->pod.len > KVT_PROTO_MAX_STR ||
        pod->pod.p == NULL || memchr(pod->pod.p, '\0', pod->pod.len) != NULL) {
        w->bad = true;
        return;
    }
    uint8_t *p = kvt_proto_query_ans_room(w, e, 1, pod->pod.len);
    if (p != NULL)
        kvt_proto_query_ans_commit(w, kvt_proto_query_ans_put(e, p, pod));
}

kvt_status_t kvt_proto_query_ans_end(kvt_proto_wr_t *w, kvt_proto_query_ans_enc_t *e)
{
    if (!w->oom && !w->bad && e->npods_off + 4 <= w->len)
        st32(w->buf + e->npods_off, e->npods);
    return kvt_proto_wr_frame_end(w, e->frame_off);
}

/* Reads one entry; false when it is truncated or invalid (@r may then be bad or not). */
static bool read_pod(kvt_proto_rd_t *r, kvt_proto_pod_ans_t *pod, char *err, size_t errlen)
{
    pod->pod = kvt_proto_rd_str(r);
    if (r->bad) {
        kvt_errf(err, errlen, "query answer: bad pod name (truncated, too long or NUL byte)");
        return false;
    }
    if (pod->pod.len == 0) {
        kvt_errf(err, errlen, "query answer: empty pod name");
        return false;
    }
    pod->dp_rank = kvt_proto_rd_u32(r);
    pod->matched = kvt_proto_rd_u32(r);
    pod->gpu = kvt_proto_rd_u32(r);
    pod->cpu = kvt_proto_rd_u32(r);
    pod->disk = kvt_proto_rd_u32(r);
    pod->score = kvt_proto_rd_f64(r);
    if (r->bad) {
        kvt_errf(err, errlen, "query answer: body ends inside a pod entry");
        return false;
    }
    if (!isfinite(pod->score)) {
        kvt_errf(err, errlen, "query answer: score is not a finite number");
        return false;
    }
    return true;
}

kvt_status_t kvt_proto_query_ans_decode(const uint8_t *body, size_t len, kvt_proto_query_ans_t *a_p,
                                        char *err, size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_query_ans_t a;
    kvt_proto_pod_ans_t pod;

    kvt_proto_rd_init(&r, body, len);
    a.block_size = kvt_proto_rd_u32(&r);
    a.num_blocks = kvt_proto_rd_u32(&r);
    a.npods = kvt_proto_rd_u32(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "query answer: body shorter than 12 bytes");
        return KVT_ERR_INVAL;
    }
    a.pods = r.p;
    for (uint32_t i = 0; i < a.npods; i++)
        if (!read_pod(&r, &pod, err, errlen))
            return KVT_ERR_INVAL;
    a.pods_len = (size_t)(r.p - a.pods);
    if (!kvt_proto_rd_done(&r)) {
        kvt_errf(err, errlen, "query answer: trailing bytes after the pod entries");
        return KVT_ERR_INVAL;
    }
    *a_p = a;
    return KVT_OK;
}

bool kvt_proto_query_ans_next(kvt_proto_rd_t *r, kvt_proto_pod_ans_t *pod_p)
{
    kvt_proto_rd_t save = *r;
    kvt_proto_pod_ans_t pod;

    if (r->bad || r->p == r->end)
        return false;
    if (!read_pod(r, &pod, NULL, 0)) {
        *r = save;
        r->bad = true;
        return false;
    }
    *pod_p = pod;
    return true;
}

/* ---- ENGINE_DROP and MODEL_DROP: a body of one name ------------------------------------------ */

static kvt_status_t name_req_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                    kvt_proto_str_t name)
{
    if (name.len == 0)
        return KVT_ERR_INVAL;
    size_t off = kvt_proto_wr_frame_begin(w, op, 0, req_id);
    kvt_proto_wr_str(w, name.p, name.len);
    return kvt_proto_wr_frame_end(w, off);
}

/* A body that is one name; @bad, @empty and @trailing are the messages for its three faults. */
static kvt_status_t name_req_decode(const uint8_t *body, size_t len, const char *bad,
                                    const char *empty, const char *trailing,
                                    kvt_proto_str_t *name_p, char *err, size_t errlen)
{
    kvt_proto_rd_t r;

    kvt_proto_rd_init(&r, body, len);
    kvt_proto_str_t name = kvt_proto_rd_str(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "%s", bad);
        return KVT_ERR_INVAL;
    }
    if (name.len == 0) {
        kvt_errf(err, errlen, "%s", empty);
        return KVT_ERR_INVAL;
    }
    if (!kvt_proto_rd_done(&r)) {
        kvt_errf(err, errlen, "%s", trailing);
        return KVT_ERR_INVAL;
    }
    *name_p = name;
    return KVT_OK;
}

kvt_status_t kvt_proto_drop_req_encode(kvt_proto_wr_t *w, uint64_t req_id, kvt_proto_str_t pod)
{
    return name_req_encode(w, KVT_PROTO_OP_ENGINE_DROP, req_id, pod);
}

kvt_status_t kvt_proto_drop_req_decode(const uint8_t *body, size_t len, kvt_proto_str_t *pod_p,
                                       char *err, size_t errlen)
{
    return name_req_decode(body, len, "engine drop: bad pod name (truncated, too long or NUL byte)",
                           "engine drop: empty pod name",
                           "engine drop: trailing bytes after the pod name", pod_p, err, errlen);
}

kvt_status_t kvt_proto_model_drop_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                             kvt_proto_str_t model)
{
    return name_req_encode(w, KVT_PROTO_OP_MODEL_DROP, req_id, model);
}

kvt_status_t kvt_proto_model_drop_req_decode(const uint8_t *body, size_t len,
                                             kvt_proto_str_t *model_p, char *err, size_t errlen)
{
    return name_req_decode(body, len,
                           "model drop: bad model name (truncated, too long or NUL byte)",
                           "model drop: empty model name",
                           "model drop: trailing bytes after the model name", model_p, err, errlen);
}

/* ---- error answers -------------------------------------------------------------------------- */

kvt_status_t kvt_proto_err_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                  kvt_status_t status, uint16_t http, const char *msg,
                                  size_t msg_len)
{
    if ((int)status >= 0 || http < 400 || http > 599)
        return KVT_ERR_INVAL;
    if (msg == NULL)
        msg_len = 0;
    const char *nul = msg_len > 0 ? memchr(msg, '\0', msg_len) : NULL;
    if (nul != NULL)
        msg_len = (size_t)(nul - msg);
    if (msg_len > KVT_PROTO_MAX_STR) {
        msg_len = KVT_PROTO_MAX_STR;
        /* Do not split a UTF-8 sequence: back off over continuation bytes. */
        while (msg_len > 0 && ((unsigned char)msg[msg_len] & 0xC0) == 0x80)
            msg_len--;
    }
    size_t off = kvt_proto_wr_frame_begin(w, op, KVT_PROTO_F_RESPONSE | KVT_PROTO_F_ERROR, req_id);
    kvt_proto_wr_i32(w, (int32_t)status);
    kvt_proto_wr_u16(w, http);
    kvt_proto_wr_str(w, msg, msg_len);
    return kvt_proto_wr_frame_end(w, off);
}

kvt_status_t kvt_proto_err_decode(const uint8_t *body, size_t len, kvt_proto_err_t *e_p, char *err,
                                  size_t errlen)
{
    kvt_proto_rd_t r;
    kvt_proto_err_t e;

    kvt_proto_rd_init(&r, body, len);
    e.status = kvt_proto_rd_i32(&r);
    e.http = kvt_proto_rd_u16(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "error answer: body shorter than 6 bytes");
        return KVT_ERR_INVAL;
    }
    if (e.status >= 0) {
        kvt_errf(err, errlen, "error answer: status is not negative");
        return KVT_ERR_INVAL;
    }
    if (e.http < 400 || e.http > 599) {
        kvt_errf(err, errlen, "error answer: http status outside 400..599");
        return KVT_ERR_INVAL;
    }
    e.msg = kvt_proto_rd_str(&r);
    if (r.bad) {
        kvt_errf(err, errlen, "error answer: bad message string (truncated, too long or NUL byte)");
        return KVT_ERR_INVAL;
    }
    if (!kvt_proto_rd_done(&r)) {
        kvt_errf(err, errlen, "error answer: trailing bytes after the message");
        return KVT_ERR_INVAL;
    }
    *e_p = e;
    return KVT_OK;
}
