/*
 * proto/proto.h: the binary RPC codec shared by kvtierd (server/), libkvtier
 * (router-plugin/) and kvtier-bench. include/kvtier/protocol.h fixes the wire layout;
 * docs/protocol.md is the specification.
 *
 * Decoders never allocate and never log: bodies are parsed in place, strings
 * are pointer + length into the caller's buffer (NOT NUL-terminated) and stay
 * valid as long as that buffer. Every decoder validates the whole body before
 * it sets any output; on failure it returns a status and writes a one-line
 * reason ("query: pad bytes are not zero") to the caller's buffer @err of
 * @errlen bytes (cut to fit, NUL-terminated; @errlen 0 and @err NULL ask for
 * none). The reason is formatted only on failure.
 *
 * Encoders append whole frames to a growable writer (kvt_proto_wr_t); several
 * frames may be appended to one writer (pipelining). A frame that cannot be
 * encoded is removed again, so the writer keeps exactly the frames before it.
 *
 * Every str field on the wire is 0..KVT_PROTO_MAX_STR bytes with no NUL byte;
 * model and pod names are at least 1 byte.
 */
#ifndef KVT_PROTO_PROTO_H
#define KVT_PROTO_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kvtier/protocol.h"

/* ---- frame header --------------------------------------------------------------------------- */

/* A decoded header; magic and reserved are implied (checked on decode, written on encode). */
typedef struct kvt_proto_hdr {
    uint8_t version;   /* KVT_PROTO_VERSION */
    uint8_t op;        /* enum kvt_proto_op */
    uint16_t flags;    /* KVT_PROTO_F_* */
    uint64_t req_id;   /* chosen by the client, echoed in the answer */
    uint32_t body_len; /* bytes of body after the 24-byte header */
} kvt_proto_hdr_t;

/*
 * Decodes and checks the KVT_PROTO_HDR_SIZE bytes at @buf. @max_body is the
 * largest body accepted (clamped to KVT_PROTO_MAX_BODY_LIMIT).
 * Returns KVT_OK and sets *@h_p, or leaves *@h_p untouched and returns:
 *  KVT_ERR_PROTO       bad magic, unknown version, unknown flag bits (or
 *                      F_ERROR without F_RESPONSE, or F_ENGINE_KEYS with
 *                      it), reserved not 0 — the
 *                      stream cannot be trusted: answer one error frame
 *                      (req_id 0) and close;
 *  KVT_ERR_TOO_BIG     body_len > @max_body — also fatal to the connection;
 *  KVT_ERR_UNSUPPORTED unknown opcode with an otherwise valid header: the
 *                      frame can be skipped (kvt_proto_hdr_peek() gives its
 *                      req_id and body_len, already checked against
 *                      @max_body) and answered with a 501 error; the
 *                      connection stays usable.
 * The checks run in the order listed. The decoder does not know the direction:
 * a server must also refuse (fatally) a request whose flags are not 0, and a
 * client an answer without KVT_PROTO_F_RESPONSE. kvt_proto_hdr_check() also
 * says why.
 */
kvt_status_t kvt_proto_hdr_decode(const uint8_t *buf, uint32_t max_body, kvt_proto_hdr_t *h_p);

/* kvt_proto_hdr_decode() that also writes a one-line reason on failure
 * ("header: bad magic") to @err (@errlen bytes, may be 0). */
kvt_status_t kvt_proto_hdr_check(const uint8_t *buf, uint32_t max_body, kvt_proto_hdr_t *h_p,
                                 char *err, size_t errlen);

/* Copies the header fields at @buf into *@h without any check (to find the
 * req_id and body_len of a frame kvt_proto_hdr_decode() refused). */
void kvt_proto_hdr_peek(const uint8_t *buf, kvt_proto_hdr_t *h);

/* Writes @h as KVT_PROTO_HDR_SIZE bytes at @out (magic, reserved 0). Does not check @h. */
void kvt_proto_hdr_encode(const kvt_proto_hdr_t *h, uint8_t *out);

/* True for the opcodes of enum kvt_proto_op. */
bool kvt_proto_op_known(uint8_t op);

/* Static upper-case name of @op ("QUERY"), "UNKNOWN" when not known. */
const char *kvt_proto_op_name(uint8_t op);

/* True for opcodes the server may refuse before HELLO when it has an auth token. */
bool kvt_proto_op_mutating(uint8_t op);

/*
 * The http-like status of an error body for @st: 400 (INVAL, PARSE, RANGE,
 * PROTO), 404 (NOT_FOUND), 409 (EXISTS), 412 (STALE), 413 (TOO_BIG),
 * 501 (UNSUPPORTED), 503 (LIMIT, NO_SPACE, NO_MEM, TIMEOUT, CLOSED, PEER, IO), 500 otherwise.
 * Authentication failures use 401 explicitly (see docs/protocol.md).
 */
uint16_t kvt_proto_http_status(kvt_status_t st);

/* ---- body reader ---------------------------------------------------------------------------- */

typedef struct kvt_proto_str {
    const char *p; /* not NUL-terminated; NULL or anything when len is 0 */
    uint16_t len;  /* bytes, <= KVT_PROTO_MAX_STR */
} kvt_proto_str_t;

/*
 * Reads little-endian values from [p, end). A read past the end, or a str
 * longer than KVT_PROTO_MAX_STR or containing a NUL byte, sets @bad and
 * returns 0 (an empty str, NULL raw pointer) without advancing; once @bad is
 * set every later read does the same. Check kvt_proto_rd_done() at the end.
 */
typedef struct kvt_proto_rd {
    const uint8_t *p, *end;
    bool bad;
} kvt_proto_rd_t;

/* Starts reading @len bytes at @p (borrowed; may be NULL when @len is 0). */
void kvt_proto_rd_init(kvt_proto_rd_t *r, const void *p, size_t len);
uint8_t kvt_proto_rd_u8(kvt_proto_rd_t *r);
uint16_t kvt_proto_rd_u16(kvt_proto_rd_t *r);
uint32_t kvt_proto_rd_u32(kvt_proto_rd_t *r);
uint64_t kvt_proto_rd_u64(kvt_proto_rd_t *r);
int32_t kvt_proto_rd_i32(kvt_proto_rd_t *r);
/* IEEE-754 binary64, bit-exact (NaN payloads and -0.0 included). */
double kvt_proto_rd_f64(kvt_proto_rd_t *r);
/* u16 length + bytes; see the struct comment for what sets @bad. */
kvt_proto_str_t kvt_proto_rd_str(kvt_proto_rd_t *r);
/* Returns a pointer to the next @n bytes and skips them; NULL (and @bad) when fewer are left. */
const uint8_t *kvt_proto_rd_raw(kvt_proto_rd_t *r, size_t n);
/* Bytes not read yet (0 once @bad). */
size_t kvt_proto_rd_left(const kvt_proto_rd_t *r);
/* True when nothing went wrong and every byte was read. */
bool kvt_proto_rd_done(const kvt_proto_rd_t *r);

/* ---- growable writer ------------------------------------------------------------------------ */

/*
 * A growable byte buffer. Appenders never fail: an allocation failure sets
 * @oom and a value that cannot be encoded (a str over KVT_PROTO_MAX_STR or
 * with a NUL byte) sets @bad; both are sticky until kvt_proto_wr_frame_end()
 * (which then drops the frame) or kvt_proto_wr_reset(). Not thread-safe.
 */
typedef struct kvt_proto_wr {
    uint8_t *buf; /* malloc'd; bytes [0, len) are valid */
    size_t len, cap;
    bool oom; /* an allocation failed */
    bool bad; /* a value could not be encoded */
} kvt_proto_wr_t;

/* Empty writer; allocates nothing until the first append. */
void kvt_proto_wr_init(kvt_proto_wr_t *w);
/* Frees the buffer; @w may be init'ed again. */
void kvt_proto_wr_cleanup(kvt_proto_wr_t *w);
/* Empties the writer (keeps the buffer) and clears @oom and @bad. */
void kvt_proto_wr_reset(kvt_proto_wr_t *w);
/* Makes room for @n more bytes. Returns KVT_OK or KVT_ERR_NO_MEM (and sets @oom). */
kvt_status_t kvt_proto_wr_reserve(kvt_proto_wr_t *w, size_t n);
/* Drops the first @n bytes (already sent); @n > len drops everything. */
void kvt_proto_wr_consume(kvt_proto_wr_t *w, size_t n);

void kvt_proto_wr_u8(kvt_proto_wr_t *w, uint8_t v);
void kvt_proto_wr_u16(kvt_proto_wr_t *w, uint16_t v);
void kvt_proto_wr_u32(kvt_proto_wr_t *w, uint32_t v);
void kvt_proto_wr_u64(kvt_proto_wr_t *w, uint64_t v);
void kvt_proto_wr_i32(kvt_proto_wr_t *w, int32_t v);
void kvt_proto_wr_f64(kvt_proto_wr_t *w, double v);
/* u16 length + @len bytes of @p; @len > KVT_PROTO_MAX_STR or a NUL byte sets @bad. */
void kvt_proto_wr_str(kvt_proto_wr_t *w, const char *p, size_t len);
void kvt_proto_wr_raw(kvt_proto_wr_t *w, const void *p, size_t len);

/*
 * Appends a header with body_len 0 and returns its offset in the writer, to
 * be passed to kvt_proto_wr_frame_end() once the body has been appended.
 * Frames do not nest.
 */
size_t kvt_proto_wr_frame_begin(kvt_proto_wr_t *w, uint8_t op, uint16_t flags, uint64_t req_id);

/*
 * Patches body_len of the frame begun at @off. Returns KVT_OK; or, after
 * removing the frame (len back to @off) and clearing @oom/@bad:
 * KVT_ERR_NO_MEM (an append failed), KVT_ERR_TOO_BIG (a bad str, or a body
 * over KVT_PROTO_MAX_BODY_LIMIT).
 */
kvt_status_t kvt_proto_wr_frame_end(kvt_proto_wr_t *w, size_t off);

/* ---- whole frames: generic ------------------------------------------------------------------ */

/*
 * Appends one frame whose body is @len opaque bytes (EVENTS request, JSON
 * answers of EVENTS/STATS/ENGINE_DROP, empty PING/STATS requests and PING
 * answer with @len 0). Returns as kvt_proto_wr_frame_end().
 */
kvt_status_t kvt_proto_raw_encode(kvt_proto_wr_t *w, uint8_t op, uint16_t flags, uint64_t req_id,
                                  const void *body, size_t len);

/* ---- HELLO ---------------------------------------------------------------------------------- */

typedef struct kvt_proto_hello_req {
    uint32_t client_version; /* KVT_PROTO_VERSION of the client */
    kvt_proto_str_t token;   /* auth token; empty when none */
} kvt_proto_hello_req_t;

typedef struct kvt_proto_hello_ans {
    uint32_t server_version; /* KVT_PROTO_VERSION of the server */
    uint32_t max_body;       /* largest request body the server accepts, bytes */
} kvt_proto_hello_ans_t;

/* Append a HELLO request / answer frame. KVT_OK, KVT_ERR_TOO_BIG (token over
 * KVT_PROTO_MAX_STR or with a NUL byte), KVT_ERR_NO_MEM. */
kvt_status_t kvt_proto_hello_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                        const kvt_proto_hello_req_t *h);
kvt_status_t kvt_proto_hello_ans_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                        const kvt_proto_hello_ans_t *h);

/* Decode a HELLO request / answer body. KVT_OK or KVT_ERR_INVAL (+ @err). */
kvt_status_t kvt_proto_hello_req_decode(const uint8_t *body, size_t len, kvt_proto_hello_req_t *h_p,
                                        char *err, size_t errlen);
kvt_status_t kvt_proto_hello_ans_decode(const uint8_t *body, size_t len, kvt_proto_hello_ans_t *h_p,
                                        char *err, size_t errlen);

/* ---- QUERY request -------------------------------------------------------------------------- */

/* A decoded QUERY request; every pointer points into the body given to the decoder. */
typedef struct kvt_proto_query {
    kvt_proto_str_t model, lora; /* model 1..255 bytes; lora empty: the base model */
    uint8_t kind;                /* KVT_PROTO_Q_TOKENS, KVT_PROTO_Q_KEYS or _TOKENS_SALTED */
    uint32_t n;                  /* number of values */
    const uint8_t *values;       /* n LE u32 tokens or n LE u64 keys, possibly unaligned */
    uint32_t npods;              /* 0: every pod */
    const uint8_t *pods;         /* npods strs, iterate with kvt_proto_rd over [pods, +pods_len) */
    size_t pods_len;
    kvt_proto_str_t salt; /* kind TOKENS_SALTED: the cache salt, 1..255 bytes; else empty */
} kvt_proto_query_t;

/* True for the kinds whose values are u32 token ids (TOKENS, TOKENS_SALTED). */
bool kvt_proto_query_kind_tokens(uint8_t kind);

/*
 * Decodes and validates a whole QUERY request body: string sizes and bytes,
 * kind, pad bytes 0, the cache salt of kind TOKENS_SALTED (1..255 bytes, no
 * NUL: an empty salt is refused, as no salt is kind TOKENS), n values present,
 * every pod name (1..255 bytes), nothing trailing. Returns KVT_OK and sets
 * *@q_p; KVT_ERR_TOO_BIG when n > @max_items; KVT_ERR_INVAL for anything else
 * malformed. @err/@errlen as above.
 */
kvt_status_t kvt_proto_query_decode(const uint8_t *body, size_t len, uint32_t max_items,
                                    kvt_proto_query_t *q_p, char *err, size_t errlen);

/* Token @i (< q->n) of a token query (TOKENS or TOKENS_SALTED), in host order. */
uint32_t kvt_proto_query_token(const kvt_proto_query_t *q, uint32_t i);
/* Key @i (< q->n) of a KVT_PROTO_Q_KEYS query, in host order. */
uint64_t kvt_proto_query_key(const kvt_proto_query_t *q, uint32_t i);
/* All q->n values in host order: uint32_t tokens or uint64_t keys, by q->kind. */
void kvt_proto_query_values(const kvt_proto_query_t *q, void *out);

/* What a QUERY request encodes from (all borrowed). */
typedef struct kvt_proto_query_req {
    kvt_proto_str_t model;       /* 1..255 bytes */
    kvt_proto_str_t lora;        /* 0..255 bytes; empty: base model */
    uint8_t kind;                /* KVT_PROTO_Q_TOKENS, KVT_PROTO_Q_KEYS or _TOKENS_SALTED */
    uint32_t n;                  /* values */
    const uint32_t *tokens;      /* token kinds: n host-order token ids (NULL when n is 0) */
    const uint64_t *keys;        /* kind KEYS: n host-order sequence keys (NULL when n is 0) */
    uint32_t npods;              /* pod filter; 0: every pod */
    const kvt_proto_str_t *pods; /* npods names, 1..255 bytes each */
    kvt_proto_str_t salt;        /* kind TOKENS_SALTED: 1..255 bytes; other kinds: empty */
} kvt_proto_query_req_t;

/*
 * Appends a QUERY request frame. Returns KVT_OK; KVT_ERR_INVAL (unknown kind,
 * empty model or pod name, NULL values with n > 0, an empty salt under kind
 * TOKENS_SALTED or a salt under another kind); KVT_ERR_TOO_BIG (a name or
 * salt over 255 bytes or with a NUL byte, a body over the hard limit);
 * KVT_ERR_NO_MEM. On error the writer is unchanged.
 */
kvt_status_t kvt_proto_query_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                        const kvt_proto_query_req_t *q);

/* ---- QUERY answer --------------------------------------------------------------------------- */

/* One pod of a QUERY answer. */
typedef struct kvt_proto_pod_ans {
    kvt_proto_str_t pod;     /* 1..255 bytes */
    uint32_t dp_rank;        /* data-parallel rank of the engine */
    uint32_t matched;        /* consecutive blocks from block 0 held in any tier */
    uint32_t gpu, cpu, disk; /* of those, blocks whose fastest tier is GPU / CPU / DISK */
    double score;            /* finite; higher is better */
} kvt_proto_pod_ans_t;

/* A decoded QUERY answer; iterate the pods with kvt_proto_query_ans_next(). */
typedef struct kvt_proto_query_ans {
    uint32_t block_size; /* tokens per block of the model */
    uint32_t num_blocks; /* full blocks in the query */
    uint32_t npods;      /* entries, best first */
    const uint8_t *pods; /* the entries, inside the decoded body */
    size_t pods_len;
} kvt_proto_query_ans_t;

/* State of an answer being encoded (caller's memory). */
typedef struct kvt_proto_query_ans_enc {
    size_t frame_off; /* from kvt_proto_wr_frame_begin() */
    size_t npods_off; /* where npods is patched */
    uint32_t npods;   /* entries appended so far */
} kvt_proto_query_ans_enc_t;

/* Begins a QUERY answer frame (flags RESPONSE) for @req_id in @w. */
void kvt_proto_query_ans_begin(kvt_proto_wr_t *w, uint64_t req_id, uint32_t block_size,
                               uint32_t num_blocks, kvt_proto_query_ans_enc_t *e);
/* Appends one pod entry (call best first). A bad entry (empty or bad name,
 * non-finite score) marks the writer bad: kvt_proto_query_ans_end() fails. */
void kvt_proto_query_ans_add(kvt_proto_wr_t *w, kvt_proto_query_ans_enc_t *e,
                             const kvt_proto_pod_ans_t *pod);

/*
 * Bulk form, for a server whose pod names were checked when they were
 * registered. kvt_proto_query_ans_room() makes room for @n more entries whose
 * names total @name_bytes and returns where the first goes (NULL: out of
 * memory, the writer is oom, or more than UINT32_MAX entries, the writer is
 * bad); kvt_proto_query_ans_put() writes one entry there, counts it in @e and
 * returns its end; kvt_proto_query_ans_commit() keeps what was put, up to
 * @end (an @end outside the room marks the writer bad). put() checks nothing:
 * the caller guarantees what add() checks (a name of 1..255 bytes without
 * NUL, a finite score) and puts at most @n entries.
 */
uint8_t *kvt_proto_query_ans_room(kvt_proto_wr_t *w, kvt_proto_query_ans_enc_t *e, size_t n,
                                  size_t name_bytes);
uint8_t *kvt_proto_query_ans_put(kvt_proto_query_ans_enc_t *e, uint8_t *p,
                                 const kvt_proto_pod_ans_t *pod);
void kvt_proto_query_ans_commit(kvt_proto_wr_t *w, const uint8_t *end);
/* Patches npods and body_len. Returns as kvt_proto_wr_frame_end() (KVT_ERR_TOO_BIG
 * for a bad entry); on error the frame is removed. */
kvt_status_t kvt_proto_query_ans_end(kvt_proto_wr_t *w, kvt_proto_query_ans_enc_t *e);

/*
 * Decodes and validates a whole QUERY answer body (every entry, nothing
 * trailing). KVT_OK, or KVT_ERR_INVAL (+ @err).
 */
kvt_status_t kvt_proto_query_ans_decode(const uint8_t *body, size_t len, kvt_proto_query_ans_t *a_p,
                                        char *err, size_t errlen);

/*
 * Reads the next pod entry of a decoded answer: start with
 * kvt_proto_rd_init(r, a->pods, a->pods_len) and call it a->npods times.
 * Returns false (and leaves *@pod_p alone) when no entry is left or @r is bad.
 */
bool kvt_proto_query_ans_next(kvt_proto_rd_t *r, kvt_proto_pod_ans_t *pod_p);

/* ---- ENGINE_DROP request -------------------------------------------------------------------- */

/* Appends an ENGINE_DROP request for @pod (1..255 bytes). KVT_OK, KVT_ERR_INVAL
 * (empty), KVT_ERR_TOO_BIG, KVT_ERR_NO_MEM. */
kvt_status_t kvt_proto_drop_req_encode(kvt_proto_wr_t *w, uint64_t req_id, kvt_proto_str_t pod);
/* Decodes an ENGINE_DROP request body. KVT_OK or KVT_ERR_INVAL (+ @err). */
kvt_status_t kvt_proto_drop_req_decode(const uint8_t *body, size_t len, kvt_proto_str_t *pod_p,
                                       char *err, size_t errlen);

/* ---- MODEL_DROP request --------------------------------------------------------------------- */

/* Appends a MODEL_DROP request for @model (1..255 bytes). Returns as kvt_proto_drop_req_encode().
 */
kvt_status_t kvt_proto_model_drop_req_encode(kvt_proto_wr_t *w, uint64_t req_id,
                                             kvt_proto_str_t model);
/* Decodes a MODEL_DROP request body. KVT_OK or KVT_ERR_INVAL (+ @err). */
kvt_status_t kvt_proto_model_drop_req_decode(const uint8_t *body, size_t len,
                                             kvt_proto_str_t *model_p, char *err, size_t errlen);

/* ---- error answers -------------------------------------------------------------------------- */

typedef struct kvt_proto_err {
    int32_t status;      /* a negative kvt_status_t */
    uint16_t http;       /* 400..599 */
    kvt_proto_str_t msg; /* one line, may be empty */
} kvt_proto_err_t;

/*
 * Appends an error answer (flags RESPONSE|ERROR) to request @op/@req_id.
 * @msg (may be NULL) is cut at its first NUL byte, at @msg_len, and at
 * KVT_PROTO_MAX_STR bytes (backing off to a UTF-8 character boundary).
 * @status must be negative and @http in 400..599 (KVT_ERR_INVAL otherwise).
 * KVT_OK, KVT_ERR_INVAL, KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_proto_err_encode(kvt_proto_wr_t *w, uint8_t op, uint64_t req_id,
                                  kvt_status_t status, uint16_t http, const char *msg,
                                  size_t msg_len);

/* Decodes an error body. KVT_OK or KVT_ERR_INVAL (+ @err): status not
 * negative, http outside 400..599, bad str, trailing bytes. */
kvt_status_t kvt_proto_err_decode(const uint8_t *body, size_t len, kvt_proto_err_t *e_p, char *err,
                                  size_t errlen);

/* The tier data plane and block API (ATTACH..BLOCK_DELETE). */
#include "proto/proto_tier.h"
/* The transfer between sidecars (XFER_HELLO..TRANSFER). */
#include "proto/proto_xfer.h"

#endif
