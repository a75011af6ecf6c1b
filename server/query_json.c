/*
 * server/query_json.c: the POST /v1/query body, read in one pass with the
 * pull parser (common/json.h) straight into the caller's token or key array.
 */
#include "server/query_json.h"

#include <string.h>

#include "common/errtext.h"
#include "common/json.h"

/* A JSON query's pod-name filter, per thread: the names are copied out of the body. */
static __thread const char *qj_name[KVT_SRV_QUERY_MAX_PODS];
static __thread size_t qj_len[KVT_SRV_QUERY_MAX_PODS];
static __thread char qj_buf[KVT_SRV_QUERY_MAX_PODS][KVT_IDX_MAX_NAME + 1];

/*
 * The value of a query's "cache_salt": a string of 1..@cap-1 bytes without
 * NUL into @buf (*@len_p its length), or "" / null for no salt (*@len_p 0).
 * Anything else is KVT_ERR_INVAL with *@told_p set and a reason in @err (the
 * same limits as the salt of an event and of an RPC query); a broken JSON text
 * returns the parser's status with *@told_p and @err untouched.
 */
static kvt_status_t query_salt_json(kvt_json_t *j, char *buf, size_t cap, size_t *len_p,
                                    bool *told_p, char *err, size_t errlen)
{
    kvt_json_type_t t = kvt_json_peek(j);
    if (t == KVT_JSON_NULL) {
        *len_p = 0;
        return kvt_json_null(j);
    }
    if (t != KVT_JSON_STRING) {
        if (kvt_json_status(j) != KVT_OK)
            return kvt_json_status(j); /* the JSON itself is broken: reported as such */
        *told_p = true;
        kvt_errf(err, errlen, "\"cache_salt\" must be a string or null");
        return KVT_ERR_INVAL;
    }
    size_t n = 0;
    kvt_status_t st = kvt_json_string(j, buf, cap, &n);
    if (st == KVT_ERR_TOO_BIG) {
        *told_p = true;
        kvt_errf(err, errlen, "\"cache_salt\" is longer than 255 bytes");
        return KVT_ERR_INVAL;
    }
    if (st != KVT_OK)
        return st;
    if (memchr(buf, '\0', n) != NULL) {
        *told_p = true;
        kvt_errf(err, errlen, "\"cache_salt\" contains a NUL character");
        return KVT_ERR_INVAL;
    }
    *len_p = n;
    return KVT_OK;
}

/*
 * The "pods" array that is due, into this thread's filter. A refused name or
 * count sets *@told_p and says why in @err; a broken JSON text returns the
 * parser's status with *@told_p and @err untouched.
 */
static kvt_status_t query_pods_json(kvt_json_t *j, size_t *npods_p, bool *told_p, char *err,
                                    size_t errlen)
{
    size_t npods = 0;
    int more = 0;
    kvt_status_t st = kvt_json_array_begin(j);
    while (st == KVT_OK && (more = kvt_json_array_next(j)) == 1) {
        if (npods == KVT_SRV_QUERY_MAX_PODS) {
            *told_p = true;
            kvt_errf(err, errlen, "more than %u pods in the filter", KVT_SRV_QUERY_MAX_PODS);
            return KVT_ERR_TOO_BIG;
        }
        st = kvt_json_string(j, qj_buf[npods], sizeof(qj_buf[npods]), &qj_len[npods]);
        if (st == KVT_OK &&
            (qj_len[npods] == 0 || memchr(qj_buf[npods], '\0', qj_len[npods]) != NULL)) {
            *told_p = true;
            kvt_errf(err, errlen, "a pod name in \"pods\" is empty or contains a NUL character");
            return KVT_ERR_INVAL;
        }
        qj_name[npods] = qj_buf[npods];
        npods++;
    }
    if (st == KVT_OK && more < 0)
        st = (kvt_status_t)more;
    *npods_p = npods;
    return st;
}

/*
 * A "pod", "dp_rank" or "ttl_ms" field of a POST /v1/routed body (@key, @klen) into *@r.
 * Returns 1 when @key is one of them (*@st_p its status, *@told_p set when @err says why),
 * 0 when it is not.
 */
static int routed_field_json(kvt_json_t *j, const char *key, size_t klen, kvt_srv_routed_body_t *r,
                             kvt_status_t *st_p, bool *told_p, char *err, size_t errlen)
{
    if (klen == 3 && memcmp(key, "pod", 3) == 0) {
        *st_p = kvt_json_string(j, r->pod, sizeof(r->pod), &r->pod_len);
        if (*st_p == KVT_OK && (r->pod_len == 0 || memchr(r->pod, '\0', r->pod_len) != NULL)) {
            *told_p = true;
            kvt_errf(err, errlen, "\"pod\" is empty or contains a NUL character");
            *st_p = KVT_ERR_INVAL;
        }
        r->have_pod = *st_p == KVT_OK;
        return 1;
    }
    bool dp = klen == 7 && memcmp(key, "dp_rank", 7) == 0;
    if (!dp && !(klen == 6 && memcmp(key, "ttl_ms", 6) == 0))
        return 0;
    uint32_t v = 0;
    uint32_t lo = dp ? 0 : 1, hi = dp ? KVT_SRV_ROUTED_MAX_DP_RANK : KVT_SRV_ROUTED_MAX_TTL_MS;
    bool number = kvt_json_peek(j) == KVT_JSON_NUMBER;
    if (kvt_json_status(j) != KVT_OK) {
        *st_p = kvt_json_status(j); /* the JSON itself is broken: reported as such */
        return 1;
    }
    *st_p = number ? kvt_json_u32(j, &v) : KVT_ERR_INVAL;
    if (*st_p != KVT_OK || v < lo || v > hi) {
        *told_p = true;
        kvt_errf(err, errlen, "\"%s\" must be an integer in %u..%u", dp ? "dp_rank" : "ttl_ms", lo,
                 hi);
        *st_p = KVT_ERR_INVAL;
        return 1;
    }
    if (dp)
        r->dp_rank = v;
    else
        r->ttl_ms = v;
    return 1;
}

/*
 * Both bodies: a query's (@r NULL: "pods" allowed) and a routed call's (@r: "pod", "dp_rank",
 * "ttl_ms" allowed into *@r, "pods" not).
 */
static kvt_status_t body_decode(const char *body, size_t len, size_t cap, uint32_t *tokens,
                                uint64_t *keys, kvt_srv_query_body_t *q, kvt_srv_routed_body_t *r,
                                char *err, size_t errlen)
{
    const char *what = r != NULL ? "routed call" : "query";
    bool have_model = false, have_tokens = false, have_keys = false;
    q->model[0] = q->lora[0] = q->salt[0] = '\0';
    q->model_len = q->lora_len = q->salt_len = q->n = q->npods = 0;
    q->pod_names = qj_name;
    q->pod_name_lens = qj_len;

    kvt_json_t j;
    kvt_json_init(&j, body, len);
    kvt_status_t st = kvt_json_object_begin(&j);
    const char *key;
    size_t klen;
    int more = 0;
    while (st == KVT_OK && (more = kvt_json_object_next(&j, &key, &klen)) == 1) {
        bool told = false; /* a field's helper refused it and said why in @err */
        if (klen == 5 && memcmp(key, "model", 5) == 0) {
            st = kvt_json_string(&j, q->model, sizeof(q->model), &q->model_len);
            have_model = true;
        } else if (klen == 9 && memcmp(key, "lora_name", 9) == 0) {
            if (kvt_json_peek(&j) == KVT_JSON_NULL)
                st = kvt_json_null(&j);
            else
                st = kvt_json_string(&j, q->lora, sizeof(q->lora), &q->lora_len);
        } else if (klen == 10 && memcmp(key, "cache_salt", 10) == 0) {
            st = query_salt_json(&j, q->salt, sizeof(q->salt), &q->salt_len, &told, err, errlen);
        } else if (klen == 9 && memcmp(key, "token_ids", 9) == 0) {
            st = kvt_json_u32_array(&j, tokens, cap, UINT32_MAX, &q->n);
            have_tokens = true;
        } else if (klen == 12 && memcmp(key, "block_hashes", 12) == 0) {
            st = kvt_json_hash_array(&j, keys, cap, &q->n);
            have_keys = true;
        } else if (r == NULL && klen == 4 && memcmp(key, "pods", 4) == 0) {
            st = query_pods_json(&j, &q->npods, &told, err, errlen);
        } else if (r != NULL && routed_field_json(&j, key, klen, r, &st, &told, err, errlen)) {
            /* read into *r */
        } else {
            /* at most 64 bytes of the key, up to a NUL; control bytes as '?': one line */
            char shown[65];
            size_t n = 0;
            for (; n < klen && n < 64 && key[n] != '\0'; n++)
                shown[n] = (unsigned char)key[n] < 0x20 || key[n] == 0x7f ? '?' : key[n];
            shown[n] = '\0';
            kvt_errf(err, errlen, "unknown field '%s' in %s", shown, what);
            return KVT_ERR_INVAL;
        }
        if (told)
            return st;
    }
    if (st == KVT_OK && more < 0)
        st = (kvt_status_t)more;
    if (st == KVT_OK)
        st = kvt_json_end(&j);
    if (st != KVT_OK) {
        if (st == KVT_ERR_TOO_BIG && kvt_json_status(&j) == KVT_ERR_TOO_BIG && q->n == 0 &&
            (have_tokens || have_keys))
            kvt_errf(err, errlen, "more than %zu tokens or keys in one %s", cap, what);
        else
            kvt_errf(err, errlen, "%s",
                     kvt_json_error(&j)[0] ? kvt_json_error(&j) : kvt_status_str(st));
        return st;
    }
    if (!have_model || q->model_len == 0) {
        kvt_errf(err, errlen, "%s needs a non-empty \"model\"", what);
        return KVT_ERR_INVAL;
    }
    if (memchr(q->model, '\0', q->model_len) != NULL ||
        memchr(q->lora, '\0', q->lora_len) != NULL) {
        kvt_errf(err, errlen, "\"model\" or \"lora_name\" contains a NUL character");
        return KVT_ERR_INVAL;
    }
    if (have_tokens == have_keys) {
        kvt_errf(err, errlen, "%s needs exactly one of \"token_ids\" and \"block_hashes\"", what);
        return KVT_ERR_INVAL;
    }
    if (have_keys && q->salt_len > 0) {
        kvt_errf(err, errlen,
                 "\"cache_salt\" goes with \"token_ids\": \"block_hashes\" are keys that already "
                 "carry their salt");
        return KVT_ERR_INVAL;
    }
    if (r != NULL && !r->have_pod) {
        kvt_errf(err, errlen, "routed call needs a non-empty \"pod\"");
        return KVT_ERR_INVAL;
    }
    q->by_keys = have_keys;
    return KVT_OK;
}

kvt_status_t kvt_srv_query_decode(const char *body, size_t len, size_t cap, uint32_t *tokens,
                                  uint64_t *keys, kvt_srv_query_body_t *q, char *err, size_t errlen)
{
    return body_decode(body, len, cap, tokens, keys, q, NULL, err, errlen);
}

kvt_status_t kvt_srv_routed_decode(const char *body, size_t len, size_t cap, uint32_t *tokens,
                                   uint64_t *keys, kvt_srv_routed_body_t *r, char *err,
                                   size_t errlen)
{
    r->pod[0] = '\0';
    r->pod_len = 0;
    r->have_pod = false;
    r->dp_rank = 0;
    r->ttl_ms = KVT_SRV_ROUTED_TTL_MS;
    return body_decode(body, len, cap, tokens, keys, &r->q, r, err, errlen);
}
