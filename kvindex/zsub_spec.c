/*
 * kvindex/zsub_spec.c: engine specs (POST /v1/engines, --engine): their
 * checks, their JSON, and the endpoints of each data-parallel rank.
 */
#include "kvindex/zsub.h"

#include <stdio.h>
#include <string.h>

#include "common/errtext.h"
#include "common/json.h"
#include "kvindex/zsub_int.h"

/* ---- engine specs ---------------------------------------------------------------------------- */

/* Writes a reason (every caller has err and errlen in scope) and is KVT_ERR_INVAL. */
#define ZS_FAIL(...) (kvt_errf(err, errlen, __VA_ARGS__), KVT_ERR_INVAL)

/* The ":PORT" at the end of a tcp:// endpoint: its value, and where the digits start. */
static bool zs_tcp_port(const char *ep, unsigned *port_p, size_t *at_p)
{
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    const char *colon = strrchr(ep + 6, ':');
    if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) > 5)
        return false;
    unsigned v = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (unsigned)(*p - '0');
    }
    if (v == 0 || v > 65535)
        return false;
    *port_p = v;
    *at_p = (size_t)(colon + 1 - ep);
    return true;
}

kvt_status_t kvt_zsub_check_endpoint(const char *what, const char *ep, uint32_t dp_size, char *err,
                                     size_t errlen)
{
    if (strncmp(ep, "tcp://", 6) != 0 && strncmp(ep, "ipc://", 6) != 0 &&
        strncmp(ep, "inproc://", 9) != 0)
        return ZS_FAIL("%s: want tcp://, ipc:// or inproc://", what);
    if (strchr(ep, ' ') != NULL || strlen(ep) < 8)
        return ZS_FAIL("%s: not an endpoint", what);
    unsigned port;
    size_t at;
    if (dp_size > 1 && !zs_tcp_port(ep, &port, &at))
        return ZS_FAIL("%s: dp_size %u needs tcp://host:port (rank r uses port + r)", what,
                       dp_size);
    if (dp_size > 1 && port + dp_size - 1 > 65535)
        return ZS_FAIL("%s: port %u + %u ranks passes 65535", what, port, dp_size);
    return KVT_OK;
}

bool kvt_zsub_engine_binds(const kvt_zsub_engine_t *e)
{
    return e->bind || strncmp(e->endpoint, "tcp://*:", 8) == 0;
}

kvt_status_t kvt_zsub_engine_check(const kvt_zsub_engine_t *e, char *err, size_t errlen)
{
    if (e->pod[0] == '\0')
        return ZS_FAIL("field 'pod' is missing or empty");
    if (e->model[0] == '\0')
        return ZS_FAIL("field 'model' is missing or empty");
    if (e->endpoint[0] == '\0')
        return ZS_FAIL("field 'endpoint' is missing or empty");
    if (e->format != KVT_EV_FMT_VLLM && e->format != KVT_EV_FMT_SGLANG)
        return ZS_FAIL("field 'format': want \"vllm\" or \"sglang\"");
    if (e->dp_size < 1 || e->dp_size > KVT_ZSUB_MAX_RANKS)
        return ZS_FAIL("field 'dp_size': want 1..%d", KVT_ZSUB_MAX_RANKS);
    kvt_status_t st =
        kvt_zsub_check_endpoint("field 'endpoint'", e->endpoint, e->dp_size, err, errlen);
    if (st == KVT_OK && e->replay_endpoint[0] != '\0')
        st = kvt_zsub_check_endpoint("field 'replay_endpoint'", e->replay_endpoint, e->dp_size, err,
                                     errlen);
    return st;
}

/* Reads the string that is due into @buf (1..cap-1 bytes, no NUL; "" only with @empty_ok). */
static kvt_status_t zs_json_str(kvt_json_t *j, const char *field, char *buf, size_t cap,
                                bool empty_ok, char *err, size_t errlen)
{
    size_t n;
    if (kvt_json_peek(j) != KVT_JSON_STRING) {
        if (kvt_json_status(j) != KVT_OK)
            return ZS_FAIL("field '%s': %s", field, kvt_json_error(j));
        return ZS_FAIL("field '%s' must be a string", field);
    }
    if (kvt_json_string(j, buf, cap, &n) != KVT_OK) {
        if (kvt_json_status(j) == KVT_ERR_TOO_BIG)
            return ZS_FAIL("field '%s' is over %zu bytes", field, cap - 1);
        return ZS_FAIL("field '%s': %s", field, kvt_json_error(j));
    }
    if (memchr(buf, '\0', n) != NULL)
        return ZS_FAIL("field '%s' contains a NUL character", field);
    if (n == 0 && !empty_ok)
        return ZS_FAIL("field '%s' is empty", field);
    return KVT_OK;
}

/* Reads the null that is due (an optional field left out). */
static kvt_status_t zs_json_null(kvt_json_t *j, const char *field, char *err, size_t errlen)
{
    if (kvt_json_null(j) != KVT_OK)
        return ZS_FAIL("field '%s': %s", field, kvt_json_error(j));
    return KVT_OK;
}

kvt_status_t kvt_zsub_engine_json_decode(const char *body, size_t len, kvt_zsub_engine_t *out,
                                         char *err, size_t errlen)
{
    kvt_zsub_engine_t e;
    memset(&e, 0, sizeof(e));
    e.format = KVT_EV_FMT_VLLM;
    e.dp_size = 1;
    kvt_json_t j;
    kvt_json_init(&j, body, len);
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (kvt_json_peek(&j) != KVT_JSON_OBJECT) {
        if (kvt_json_status(&j) != KVT_OK) {
            kvt_errf(err, errlen, "%s", kvt_json_error(&j));
            return KVT_ERR_PARSE;
        }
        return ZS_FAIL("the body must be a JSON object");
    }
    kvt_json_object_begin(&j);
    const char *key;
    size_t klen;
    int r;
    kvt_status_t st = KVT_OK;
    while (st == KVT_OK && (r = kvt_json_object_next(&j, &key, &klen)) == 1) {
        bool null = kvt_json_peek(&j) == KVT_JSON_NULL;
        if (strcmp(key, "pod") == 0 && klen == 3) {
            st = zs_json_str(&j, "pod", e.pod, sizeof(e.pod), false, err, errlen);
        } else if (strcmp(key, "model") == 0 && klen == 5) {
            st = zs_json_str(&j, "model", e.model, sizeof(e.model), false, err, errlen);
        } else if (strcmp(key, "endpoint") == 0 && klen == 8) {
            st = zs_json_str(&j, "endpoint", e.endpoint, sizeof(e.endpoint), false, err, errlen);
        } else if (strcmp(key, "replay_endpoint") == 0 && klen == 15) {
            st = null ? zs_json_null(&j, "replay_endpoint", err, errlen)
                      : zs_json_str(&j, "replay_endpoint", e.replay_endpoint,
                                    sizeof(e.replay_endpoint), true, err, errlen);
        } else if (strcmp(key, "topic") == 0 && klen == 5) {
            st = null ? zs_json_null(&j, "topic", err, errlen)
                      : zs_json_str(&j, "topic", e.topic, sizeof(e.topic), true, err, errlen);
        } else if (strcmp(key, "format") == 0 && klen == 6) {
            char f[16];
            st = zs_json_str(&j, "format", f, sizeof(f), false, err, errlen);
            if (st == KVT_OK && strcmp(f, "vllm") == 0)
                e.format = KVT_EV_FMT_VLLM;
            else if (st == KVT_OK && strcmp(f, "sglang") == 0)
                e.format = KVT_EV_FMT_SGLANG;
            else if (st == KVT_OK)
                st = ZS_FAIL("field 'format': want \"vllm\" or \"sglang\"");
            else if (kvt_json_status(&j) == KVT_OK)
                st = ZS_FAIL("field 'format': want \"vllm\" or \"sglang\"");
        } else if (strcmp(key, "dp_size") == 0 && klen == 7) {
            if (kvt_json_u32(&j, &e.dp_size) != KVT_OK)
                st = ZS_FAIL("field 'dp_size': want an integer (%s)", kvt_json_error(&j));
        } else if (strcmp(key, "bind") == 0 && klen == 4) {
            if (kvt_json_bool(&j, &e.bind) != KVT_OK)
                st = ZS_FAIL("field 'bind': want true or false");
        } else {
            char shown[48];
            snprintf(shown, sizeof(shown), "%.40s", key);
            for (char *p = shown; *p; p++)
                if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f || *p == '\'')
                    *p = '?';
            st = ZS_FAIL("unknown field '%s'", shown);
        }
    }
    if (st == KVT_OK && r < 0)
        st = ZS_FAIL("%s", kvt_json_error(&j));
    if (st == KVT_OK && kvt_json_end(&j) != KVT_OK)
        st = ZS_FAIL("%s", kvt_json_error(&j));
    if (st != KVT_OK)
        return kvt_json_status(&j) == KVT_ERR_PARSE ? KVT_ERR_PARSE : KVT_ERR_INVAL;
    if ((st = kvt_zsub_engine_check(&e, err, errlen)) != KVT_OK)
        return st;
    *out = e;
    return KVT_OK;
}

void kvt_zsub_rank_endpoint(const char *ep, uint32_t rank, char *out, size_t cap)
{
    unsigned port;
    size_t at;
    if (rank == 0 || !zs_tcp_port(ep, &port, &at)) {
        snprintf(out, cap, "%s", ep);
        return;
    }
    snprintf(out, cap, "%.*s%u", (int)at, ep, port + rank);
}
