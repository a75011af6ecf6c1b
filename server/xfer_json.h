/*
 * server/xfer_json: the JSON of POST /v1/transfer (xfer_json.c): its body,
 * decoded, and its answer, written. Pure functions, unit-tested and fuzzed on
 * their own; the binary twin is the TRANSFER frame (proto/proto_xfer.h).
 */
#ifndef KVT_SERVER_XFER_JSON_H
#define KVT_SERVER_XFER_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "common/json.h"
#include "common/status.h"
#include "proto/proto.h"

/* A decoded POST /v1/transfer body. Strings are decoded, NUL-terminated, without NUL inside. */
typedef struct kvt_srv_xfer_body {
    char peer[KVT_PROTO_MAX_STR + 1];  /* "host:port" (common/hostport.h), port 1..65535 */
    char model[KVT_PROTO_MAX_STR + 1]; /* 1..255 bytes */
    char lora[KVT_PROTO_MAX_STR + 1];  /* "lora_name"; "" when absent or null */
    size_t peer_len, model_len, lora_len;
    uint8_t direction;   /* KVT_PROTO_XFER_PULL (default) or KVT_PROTO_XFER_PUSH */
    bool stream;         /* "stream": true (a push only) */
    uint32_t timeout_ms; /* 1..KVT_PROTO_XFER_MAX_TIMEOUT_MS; 0 when absent (the server's) */
    size_t n;            /* keys written to the caller's array, >= 1 */
} kvt_srv_xfer_body_t;

/*
 * Decodes a POST /v1/transfer body
 *   {"peer": "host:port", "model": str, "lora_name"?: str|null, "keys": [u64..],
 *    "direction"?: "pull"|"push", "stream"?: bool (true only with "push"),
 *    "timeout_ms"?: uint}
 * into *@x and the keys into @keys[0..cap) (@cap at most
 * KVT_PROTO_XFER_MAX_KEYS counts). Keys are JSON integers 0..2^64-1 (no sign,
 * fraction, exponent or string). An unknown or repeated field, a missing
 * "peer", "model" or "keys", an empty "keys" and trailing bytes are errors.
 * Returns KVT_OK; or KVT_ERR_PARSE (not JSON), KVT_ERR_INVAL (a bad field),
 * KVT_ERR_TOO_BIG (more keys than @cap) with one line in @err naming the field
 * ("\"keys\"[2] is not an unsigned 64-bit decimal"); *@x and @keys may be
 * partly written then.
 */
kvt_status_t kvt_srv_xfer_decode(const char *body, size_t len, uint64_t *keys, size_t cap,
                                 kvt_srv_xfer_body_t *x, char *err, size_t errlen);

/*
 * Appends @x and its x->n @keys to @b as a body kvt_srv_xfer_decode() reads
 * back to the same: the fields in the order above, "lora_name" and
 * "timeout_ms" only when set, "direction" always.
 */
void kvt_srv_xfer_body_json(kvt_jbuf_t *b, const kvt_srv_xfer_body_t *x, const uint64_t *keys);

/*
 * Appends the answer of a transfer to @b:
 *   {"transferred":[k..],"missing":[k..],"failed":[{"key":k,"reason":"name"}..],
 *    "bytes":N,"seconds":S}
 * keys as decimals, reasons by kvt_proto_xfer_reason_name() ("error" for a
 * value it does not name), seconds from @a->ns as a JSON number.
 */
void kvt_srv_xfer_answer_json(kvt_jbuf_t *b, const kvt_proto_transfer_ans_t *a);

#endif
