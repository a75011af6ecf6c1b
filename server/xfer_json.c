/*
 * server/xfer_json.c: the POST /v1/transfer body, read in one pass with the
 * pull parser (common/json.h) straight into the caller's key array, and the
 * call's answer, written.
 *
 * A field the parser reads as the wrong type, or a value out of its range,
 * gets a message of its own naming the field; a text that is not JSON keeps
 * the parser's message ("offset 17: expected ':', got '}'"), and so does a
 * repeated field ("offset 40: duplicate field 'peer'").
 */
#include "server/xfer_json.h"

#include <string.h>

#include "common/errtext.h"
#include "common/hostport.h"

/* How a field's reader ended: read, refused with its own message, or the JSON is broken. */
enum { F_OK, F_TOLD, F_JSON };

/*
 * A string field (@name) into @buf[0..cap): 1..cap-1 bytes (0 too when
 * @may_be_empty), no NUL; with @may_be_null, null reads as "". Refusals say
 * why in @err.
 */
static int str_field(kvt_json_t *j, const char *name, char *buf, size_t cap, size_t *len_p,
                     bool may_be_empty, bool may_be_null, char *err, size_t errlen)
{
    kvt_json_type_t t = kvt_json_peek(j);
    if (kvt_json_status(j) != KVT_OK)
        return F_JSON;
    if (t == KVT_JSON_NULL && may_be_null) {
        buf[0] = '\0';
        *len_p = 0;
        return kvt_json_null(j) == KVT_OK ? F_OK : F_JSON;
    }
    if (t != KVT_JSON_STRING) {
        kvt_errf(err, errlen, "\"%s\" must be a string%s", name, may_be_null ? " or null" : "");
        return F_TOLD;
    }
    kvt_status_t st = kvt_json_string(j, buf, cap, len_p);
    if (st == KVT_ERR_TOO_BIG) {
        kvt_errf(err, errlen, "\"%s\" is longer than %zu bytes", name, cap - 1);
        return F_TOLD;
    }
    if (st != KVT_OK)
        return F_JSON;
    if (memchr(buf, '\0', *len_p) != NULL || (*len_p == 0 && !may_be_empty)) {
        kvt_errf(err, errlen, "\"%s\" is empty or contains a NUL character", name);
        return F_TOLD;
    }
    return F_OK;
}

/* "keys": 1..@cap integers 0..2^64-1 into @keys. */
static int keys_field(kvt_json_t *j, const char *body, uint64_t *keys, size_t cap, size_t *n_p,
                      kvt_status_t *st_p, char *err, size_t errlen)
{
    if (kvt_json_peek(j) != KVT_JSON_ARRAY) {
        if (kvt_json_status(j) != KVT_OK)
            return F_JSON;
        kvt_errf(err, errlen, "\"keys\" must be an array of unsigned 64-bit decimals");
        return F_TOLD;
    }
    kvt_json_array_begin(j);
    size_t n = 0;
    int more;
    while ((more = kvt_json_array_next(j)) == 1) {
        if (n == cap) {
            *st_p = KVT_ERR_TOO_BIG;
            kvt_errf(err, errlen, "more than %zu keys in one transfer", cap);
            return F_TOLD;
        }
        kvt_json_type_t t = kvt_json_peek(j);
        if (kvt_json_status(j) != KVT_OK)
            return F_JSON;
        /* the parser reads "-0" as 0: an unsigned decimal has no sign */
        bool minus = t == KVT_JSON_NUMBER && body[kvt_json_offset(j)] == '-';
        kvt_status_t st =
            t == KVT_JSON_NUMBER && !minus ? kvt_json_u64(j, &keys[n]) : KVT_ERR_INVAL;
        if (st == KVT_ERR_PARSE)
            return F_JSON;
        if (st != KVT_OK) {
            kvt_errf(err, errlen, "\"keys\"[%zu] is not an unsigned 64-bit decimal", n);
            return F_TOLD;
        }
        n++;
    }
    if (more < 0)
        return F_JSON;
    if (n == 0) {
        kvt_errf(err, errlen, "\"keys\" is empty: a transfer moves at least one block");
        return F_TOLD;
    }
    *n_p = n;
    return F_OK;
}

/* "direction": "pull" or "push". */
static int direction_field(kvt_json_t *j, uint8_t *dir_p, char *err, size_t errlen)
{
    char buf[8];
    size_t len = 0;
    kvt_json_type_t t = kvt_json_peek(j);
    if (kvt_json_status(j) != KVT_OK)
        return F_JSON;
    kvt_status_t st = t == KVT_JSON_STRING ? kvt_json_string(j, buf, sizeof(buf), &len) : KVT_OK;
    if (st != KVT_OK && st != KVT_ERR_TOO_BIG)
        return F_JSON;
    if (t == KVT_JSON_STRING && st == KVT_OK && len == 4 && memcmp(buf, "pull", 4) == 0) {
        *dir_p = KVT_PROTO_XFER_PULL;
        return F_OK;
    }
    if (t == KVT_JSON_STRING && st == KVT_OK && len == 4 && memcmp(buf, "push", 4) == 0) {
        *dir_p = KVT_PROTO_XFER_PUSH;
        return F_OK;
    }
    kvt_errf(err, errlen, "\"direction\" must be \"pull\" or \"push\"");
    return F_TOLD;
}

/* "timeout_ms": 1..KVT_PROTO_XFER_MAX_TIMEOUT_MS. */
static int timeout_field(kvt_json_t *j, uint32_t *ms_p, char *err, size_t errlen)
{
    kvt_json_type_t t = kvt_json_peek(j);
    if (kvt_json_status(j) != KVT_OK)
        return F_JSON;
    uint32_t v = 0;
    kvt_status_t st = t == KVT_JSON_NUMBER ? kvt_json_u32(j, &v) : KVT_ERR_INVAL;
    if (st == KVT_ERR_PARSE)
        return F_JSON;
    if (st != KVT_OK || v < 1 || v > KVT_PROTO_XFER_MAX_TIMEOUT_MS) {
        kvt_errf(err, errlen, "\"timeout_ms\" must be an integer in 1..%u",
                 KVT_PROTO_XFER_MAX_TIMEOUT_MS);
        return F_TOLD;
    }
    *ms_p = v;
    return F_OK;
}

/* An unknown field's message: at most 64 bytes of @key, up to a NUL, control bytes as '?'. */
static void unknown_field(const char *key, size_t klen, char *err, size_t errlen)
{
    char shown[65];
    size_t n = 0;
    for (; n < klen && n < 64 && key[n] != '\0'; n++)
        shown[n] = (unsigned char)key[n] < 0x20 || key[n] == 0x7f ? '?' : key[n];
    shown[n] = '\0';
    kvt_errf(err, errlen, "unknown field '%s' in a transfer", shown);
}

static bool key_is(const char *key, size_t klen, const char *name)
{
    return klen == strlen(name) && memcmp(key, name, klen) == 0;
}

kvt_status_t kvt_srv_xfer_decode(const char *body, size_t len, uint64_t *keys, size_t cap,
                                 kvt_srv_xfer_body_t *x, char *err, size_t errlen)
{
    bool have_peer = false, have_model = false, have_keys = false;
    x->peer[0] = x->model[0] = x->lora[0] = '\0';
    x->peer_len = x->model_len = x->lora_len = x->n = 0;
    x->direction = KVT_PROTO_XFER_PULL;
    x->stream = false;
    x->timeout_ms = 0;
    if (cap > KVT_PROTO_XFER_MAX_KEYS)
        cap = KVT_PROTO_XFER_MAX_KEYS;

    kvt_json_t j;
    kvt_json_init(&j, body, len);
    kvt_status_t st = kvt_json_object_begin(&j), told_st = KVT_ERR_INVAL;
    const char *key;
    size_t klen;
    int more = 0, f = F_OK;
    while (st == KVT_OK && f == F_OK && (more = kvt_json_object_next(&j, &key, &klen)) == 1) {
        if (key_is(key, klen, "peer")) {
            f = str_field(&j, "peer", x->peer, sizeof(x->peer), &x->peer_len, false, false, err,
                          errlen);
            have_peer = true;
        } else if (key_is(key, klen, "model")) {
            f = str_field(&j, "model", x->model, sizeof(x->model), &x->model_len, false, false, err,
                          errlen);
            have_model = true;
        } else if (key_is(key, klen, "lora_name")) {
            f = str_field(&j, "lora_name", x->lora, sizeof(x->lora), &x->lora_len, true, true, err,
                          errlen);
        } else if (key_is(key, klen, "keys")) {
            f = keys_field(&j, body, keys, cap, &x->n, &told_st, err, errlen);
            have_keys = true;
        } else if (key_is(key, klen, "direction")) {
            f = direction_field(&j, &x->direction, err, errlen);
        } else if (key_is(key, klen, "timeout_ms")) {
            f = timeout_field(&j, &x->timeout_ms, err, errlen);
        } else if (key_is(key, klen, "stream")) {
            f = kvt_json_peek(&j) != KVT_JSON_TRUE && kvt_json_peek(&j) != KVT_JSON_FALSE ? F_TOLD
                : kvt_json_bool(&j, &x->stream) != KVT_OK                                 ? F_JSON
                                                                                          : F_OK;
            if (f == F_TOLD)
                kvt_errf(err, errlen, "\"stream\" must be true or false");
        } else {
            unknown_field(key, klen, err, errlen);
            return KVT_ERR_INVAL;
        }
    }
    if (f == F_TOLD)
        return told_st;
    if (f == F_OK && more < 0)
        st = (kvt_status_t)more;
    if (f == F_OK && st == KVT_OK)
        st = kvt_json_end(&j);
    if (f == F_JSON || st != KVT_OK) {
        st = kvt_json_status(&j) != KVT_OK ? kvt_json_status(&j) : st;
        kvt_errf(err, errlen, "%s",
                 kvt_json_error(&j)[0] ? kvt_json_error(&j) : kvt_status_str(st));
        return st;
    }
    if (x->stream && x->direction != KVT_PROTO_XFER_PUSH) {
        kvt_errf(err, errlen, "\"stream\" is for a push");
        return KVT_ERR_INVAL;
    }
    if (!have_peer || !have_model || !have_keys) {
        kvt_errf(err, errlen, "a transfer needs \"%s\"",
                 !have_peer    ? "peer"
                 : !have_model ? "model"
                               : "keys");
        return KVT_ERR_INVAL;
    }
    char host[KVT_PROTO_MAX_STR + 1], why[128];
    uint16_t port;
    if (kvt_hostport_split(x->peer, host, sizeof(host), &port, false, why, sizeof(why)) != KVT_OK) {
        kvt_errf(err, errlen, "\"peer\" is not a host:port: %s", why);
        return KVT_ERR_INVAL;
    }
    return KVT_OK;
}

void kvt_srv_xfer_body_json(kvt_jbuf_t *b, const kvt_srv_xfer_body_t *x, const uint64_t *keys)
{
    kvt_jbuf_cstr(b, "{\"peer\":");
    kvt_jbuf_str(b, x->peer, x->peer_len);
    kvt_jbuf_cstr(b, ",\"model\":");
    kvt_jbuf_str(b, x->model, x->model_len);
    if (x->lora_len > 0) {
        kvt_jbuf_cstr(b, ",\"lora_name\":");
        kvt_jbuf_str(b, x->lora, x->lora_len);
    }
    kvt_jbuf_cstr(b, ",\"keys\":[");
    for (size_t i = 0; i < x->n; i++) {
        if (i > 0)
            kvt_jbuf_raw(b, ",", 1);
        kvt_jbuf_u64(b, keys[i]);
    }
    kvt_jbuf_cstr(b, x->direction == KVT_PROTO_XFER_PUSH ? "],\"direction\":\"push\""
                                                         : "],\"direction\":\"pull\"");
    if (x->stream)
        kvt_jbuf_cstr(b, ",\"stream\":true");
    if (x->timeout_ms > 0) {
        kvt_jbuf_cstr(b, ",\"timeout_ms\":");
        kvt_jbuf_u64(b, x->timeout_ms);
    }
    kvt_jbuf_raw(b, "}", 1);
}

/* "[k,k,..]" */
static void key_list(kvt_jbuf_t *b, const uint64_t *keys, uint32_t n)
{
    kvt_jbuf_raw(b, "[", 1);
    for (uint32_t i = 0; i < n; i++) {
        if (i > 0)
            kvt_jbuf_raw(b, ",", 1);
        kvt_jbuf_u64(b, keys[i]);
    }
    kvt_jbuf_raw(b, "]", 1);
}

void kvt_srv_xfer_answer_json(kvt_jbuf_t *b, const kvt_proto_transfer_ans_t *a)
{
    kvt_jbuf_cstr(b, "{\"transferred\":");
    key_list(b, a->transferred, a->ntransferred);
    kvt_jbuf_cstr(b, ",\"missing\":");
    key_list(b, a->missing, a->nmissing);
    kvt_jbuf_cstr(b, ",\"failed\":[");
    for (uint32_t i = 0; i < a->nfailed; i++) {
        const char *reason = kvt_proto_xfer_reason_name(a->failed[i].reason);
        kvt_jbuf_cstr(b, i > 0 ? ",{\"key\":" : "{\"key\":");
        kvt_jbuf_u64(b, a->failed[i].key);
        kvt_jbuf_cstr(b, ",\"reason\":\"");
        kvt_jbuf_cstr(b, reason != NULL ? reason : "error");
        kvt_jbuf_cstr(b, "\"}");
    }
    kvt_jbuf_cstr(b, "],\"bytes\":");
    kvt_jbuf_u64(b, a->bytes);
    kvt_jbuf_cstr(b, ",\"seconds\":");
    kvt_jbuf_f64(b, (double)a->ns / 1e9);
    kvt_jbuf_raw(b, "}", 1);
}
