/*
 * libFuzzer target for kvt_srv_query_decode() (server/query_json.c), the POST /v1/query
 * body, and kvt_srv_routed_decode() (the POST /v1/routed body) on the same input, with
 * room for 64 tokens or keys so that "too many" is reachable.
 *
 * Invariants checked on every input:
 *  - the input is copied to an exactly-sized heap buffer (ASan sees overreads);
 *  - success: a non-empty model; model, LoRA and salt NUL-terminated at their lengths
 *    with no NUL inside; at most the cap of tokens or keys; no salt with keys; pod names
 *    of 1..255 bytes without NUL, at most KVT_SRV_QUERY_MAX_PODS of them;
 *  - failure: one of the documented statuses and a non-empty reason;
 *  - a second decode gives the same verdict and the same tokens or keys.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/query_json.h"

#include "tests/fuzz/fuzz_check.h"

#define CAP 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* @s[0..len] is a name: NUL at len, none before. */
static int name_ok(const char *s, size_t len)
{
    return len <= KVT_IDX_MAX_NAME && s[len] == '\0' && memchr(s, '\0', len) == NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_copy(data, size);
    if (s == NULL)
        return 0;
    static uint32_t tok[CAP], tok2[CAP];
    static uint64_t keys[CAP], keys2[CAP];
    static kvt_srv_query_body_t q, q2;
    char why[256] = "", why2[256] = "";
    kvt_status_t st = kvt_srv_query_decode(s, size, CAP, tok, keys, &q, why, sizeof(why));
    kvt_status_t st2 = kvt_srv_query_decode(s, size, CAP, tok2, keys2, &q2, why2, sizeof(why2));
    CHECK(st == st2);
    if (st == KVT_OK) {
        CHECK(q.model_len > 0 && name_ok(q.model, q.model_len));
        CHECK(name_ok(q.lora, q.lora_len) && name_ok(q.salt, q.salt_len));
        CHECK(q.n <= CAP && q.n == q2.n && q.by_keys == q2.by_keys);
        CHECK(!q.by_keys || q.salt_len == 0);
        if (q.by_keys)
            CHECK(memcmp(keys, keys2, q.n * sizeof(uint64_t)) == 0);
        else
            CHECK(memcmp(tok, tok2, q.n * sizeof(uint32_t)) == 0);
        CHECK(q.npods <= KVT_SRV_QUERY_MAX_PODS && q.npods == q2.npods);
        for (size_t i = 0; i < q.npods; i++)
            CHECK(q.pod_name_lens[i] >= 1 && q.pod_name_lens[i] <= KVT_IDX_MAX_NAME &&
                  memchr(q.pod_names[i], '\0', q.pod_name_lens[i]) == NULL);
    } else {
        CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_INVAL || st == KVT_ERR_RANGE ||
              st == KVT_ERR_TOO_BIG);
        CHECK(why[0] != '\0' && strchr(why, '\n') == NULL && strcmp(why, why2) == 0);
    }
    /* the same input as a POST /v1/routed body: its own fields in range, or a reason */
    static kvt_srv_routed_body_t r;
    why[0] = '\0';
    st = kvt_srv_routed_decode(s, size, CAP, tok, keys, &r, why, sizeof(why));
    if (st == KVT_OK) {
        CHECK(r.q.model_len > 0 && r.q.n <= CAP && r.q.npods == 0);
        CHECK(r.pod_len >= 1 && name_ok(r.pod, r.pod_len));
        CHECK(r.dp_rank <= KVT_SRV_ROUTED_MAX_DP_RANK);
        CHECK(r.ttl_ms >= 1 && r.ttl_ms <= KVT_SRV_ROUTED_MAX_TTL_MS);
    } else {
        CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_INVAL || st == KVT_ERR_RANGE ||
              st == KVT_ERR_TOO_BIG);
        CHECK(why[0] != '\0' && strchr(why, '\n') == NULL);
    }
    free(s);
    return 0;
}
