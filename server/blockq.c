/*
 * server/blockq.c: a block API URL's key and query string (blockq.h).
 */
#include "server/blockq.h"

#include <string.h>

#include "common/errtext.h"
#include "server/http.h"

bool srv_block_key_parse(const char *s, uint64_t *key_p)
{
    uint64_t v = 0;
    size_t n = strlen(s);
    if (n == 0 || n > 20)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *key_p = v;
    return true;
}

/* At most 40 bytes of a parameter's name for a message, control bytes as '?' (one line). */
static const char *shown(const char *p, size_t n, char out[41])
{
    size_t k = n > 40 ? 40 : n;
    for (size_t i = 0; i < k; i++)
        out[i] = (unsigned char)p[i] < 0x20 || p[i] == 0x7f ? '?' : p[i];
    out[k] = '\0';
    return out;
}

kvt_status_t srv_block_query_parse(const char *query, size_t len, srv_block_query_t *q_p, char *err,
                                   size_t errlen)
{
    srv_block_query_t q;
    memset(&q, 0, sizeof(q));
    bool seen[4] = {false, false, false, false};
    char name[41];
    const char *p = query, *end = query != NULL ? query + len : NULL;
    while (p != NULL && p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *stop = amp != NULL ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        if (eq == NULL) {
            kvt_errf(err, errlen, "query parameter without a value: %s",
                     shown(p, (size_t)(stop - p), name));
            return KVT_ERR_INVAL;
        }
        size_t nlen = (size_t)(eq - p);
        int which = nlen == 5 && memcmp(p, "model", 5) == 0     ? 0
                    : nlen == 4 && memcmp(p, "lora", 4) == 0    ? 1
                    : nlen == 7 && memcmp(p, "durable", 7) == 0 ? 2
                    : nlen == 4 && memcmp(p, "keys", 4) == 0    ? 3
                                                                : -1;
        if (which < 0) {
            kvt_errf(err, errlen, "unknown query parameter %s (model, lora, durable and keys are known)",
                     shown(p, nlen, name));
            return KVT_ERR_INVAL;
        }
        if (seen[which]) {
            kvt_errf(err, errlen, "query parameter %s given twice", shown(p, nlen, name));
            return KVT_ERR_INVAL;
        }
        seen[which] = true;
        char val[KVT_IDX_MAX_NAME + 1];
        long vlen = kvt_http_pct_decode(eq + 1, (size_t)(stop - eq - 1), val, sizeof(val));
        if (vlen < 0) {
            kvt_errf(err, errlen, "query parameter %s: a bad %%-escape, %%00, or over %u bytes",
                     shown(p, nlen, name), KVT_IDX_MAX_NAME);
            return KVT_ERR_INVAL;
        }
        if (which == 0) {
            memcpy(q.model, val, (size_t)vlen + 1);
        } else if (which == 1) {
            memcpy(q.lora, val, (size_t)vlen + 1);
        } else if (which == 3) {
            if (strcmp(val, "engine") != 0 && strcmp(val, "sequence") != 0) {
                kvt_errf(err, errlen, "keys must be sequence or engine");
                return KVT_ERR_INVAL;
            }
            q.engine_keys = val[0] == 'e';
        } else if (strcmp(val, "1") == 0 || strcmp(val, "true") == 0) {
            q.durable = true;
        } else if (strcmp(val, "0") != 0 && strcmp(val, "false") != 0) {
            kvt_errf(err, errlen, "durable must be 0, 1, true or false");
            return KVT_ERR_INVAL;
        }
        p = amp != NULL ? amp + 1 : end;
    }
    if (q.model[0] == '\0') {
        kvt_errf(err, errlen, "?model= is required (the block's model)");
        return KVT_ERR_INVAL;
    }
    *q_p = q;
    return KVT_OK;
}
