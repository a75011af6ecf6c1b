/*
 * server/query_json: the POST /v1/query body, decoded (query_json.c). kvtierd's
 * JSON front end (api.c) runs what it decodes; kvtier-bench json measures it
 * against jansson, so both run this one decoder.
 */
#ifndef KVT_SERVER_QUERY_JSON_H
#define KVT_SERVER_QUERY_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kvindex/index.h"

/* Pod names in one query's filter ("pods"). */
#define KVT_SRV_QUERY_MAX_PODS 1024u

/* A decoded query body. Names are decoded, NUL-terminated, without NUL inside. */
typedef struct kvt_srv_query_body {
    char model[KVT_IDX_MAX_NAME + 1];     /* 1..255 bytes */
    char lora[KVT_IDX_MAX_NAME + 1];      /* "lora_name"; "" when absent or null */
    char salt[KVT_IDX_MAX_NAME + 1];      /* "cache_salt"; "" when absent, null or "" */
    size_t model_len, lora_len, salt_len; /* bytes */
    bool by_keys;                         /* "block_hashes" were given (else "token_ids") */
    size_t n;                             /* token ids written to @tokens, or keys to @keys */
    size_t npods;                         /* names in the pod filter; 0: every pod */
    /* The filter's names and lengths: per-thread storage of query_json.c, valid until this
     * thread's next kvt_srv_query_decode(). */
    const char *const *pod_names;
    const size_t *pod_name_lens;
} kvt_srv_query_body_t;

/*
 * Decodes a POST /v1/query body
 *   {"model": str, "lora_name"?: str|null, "cache_salt"?: str|null,
 *    "token_ids": [u32..] | "block_hashes": [h..], "pods"?: [str..]}
 * into *@q, the token ids into @tokens[0..cap) or the block hashes (as
 * kvt_json_hash()) into @keys[0..cap). Exactly one of token_ids and
 * block_hashes; cache_salt only with token_ids; an unknown field, a
 * duplicate key or trailing bytes are errors. Returns KVT_OK, or
 * KVT_ERR_PARSE, KVT_ERR_INVAL, KVT_ERR_RANGE or KVT_ERR_TOO_BIG (more than
 * @cap tokens or keys, more than KVT_SRV_QUERY_MAX_PODS pods) with a one-line
 * reason in @err (@errlen bytes, may be 0; common/errtext.h). *@q may be
 * partly written on error. One thread's calls must not overlap (the pod
 * filter is per thread).
 */
kvt_status_t kvt_srv_query_decode(const char *body, size_t len, size_t cap, uint32_t *tokens,
                                  uint64_t *keys, kvt_srv_query_body_t *q, char *err,
                                  size_t errlen);

/* POST /v1/routed: the speculative entries' default lifetime (llm-d's) and the longest one. */
#define KVT_SRV_ROUTED_TTL_MS 2000u
#define KVT_SRV_ROUTED_MAX_TTL_MS 60000u
/* Largest "dp_rank" of a routed call (as of an events batch). */
#define KVT_SRV_ROUTED_MAX_DP_RANK 255u

/* A decoded POST /v1/routed body: a query's fields (no "pods") and where the request went. */
typedef struct kvt_srv_routed_body {
    kvt_srv_query_body_t q;         /* model, lora_name, cache_salt, token_ids | block_hashes */
    char pod[KVT_IDX_MAX_NAME + 1]; /* "pod": 1..255 bytes, no NUL */
    size_t pod_len;                 /* bytes */
    bool have_pod;                  /* "pod" was given */
    uint32_t dp_rank;               /* "dp_rank", 0..KVT_SRV_ROUTED_MAX_DP_RANK; 0 when absent */
    uint32_t ttl_ms;                /* "ttl_ms", 1..KVT_SRV_ROUTED_MAX_TTL_MS; default
                                       KVT_SRV_ROUTED_TTL_MS */
} kvt_srv_routed_body_t;

/*
 * Decodes a POST /v1/routed body (also the RPC ROUTED body)
 *   {"model": str, "lora_name"?: str|null, "cache_salt"?: str|null,
 *    "token_ids": [u32..] | "block_hashes": [h..], "pod": str, "dp_rank"?: uint,
 *    "ttl_ms"?: uint}
 * under the rules of kvt_srv_query_decode() (a "pods" filter is an unknown
 * field here); "pod" is required, "dp_rank" and "ttl_ms" are checked against
 * their ranges (KVT_ERR_INVAL). Returns and errors as kvt_srv_query_decode().
 */
kvt_status_t kvt_srv_routed_decode(const char *body, size_t len, size_t cap, uint32_t *tokens,
                                   uint64_t *keys, kvt_srv_routed_body_t *r, char *err,
                                   size_t errlen);

#endif
