/*
 * server/blockq.h: the parts of a block API URL (/v1/blocks/{key}?model=M
 * [&lora=L][&durable=0|1]): pure functions, unit-tested and fuzzed on their
 * own (server/blocks.c uses them).
 */
#ifndef KVT_SERVER_BLOCKQ_H
#define KVT_SERVER_BLOCKQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kvindex/index.h"

/* A block key: an unsigned 64-bit decimal, 1..20 digits, nothing else (no sign, space or
 * leading '+'). True and *@key_p set, or false and *@key_p untouched. */
bool srv_block_key_parse(const char *s, uint64_t *key_p);

typedef struct srv_block_query {
    char model[KVT_IDX_MAX_NAME + 1]; /* percent-decoded, NUL-terminated, non-empty */
    char lora[KVT_IDX_MAX_NAME + 1];  /* "" when absent */
    bool durable;
    bool engine_keys; /* keys=engine: the key is an engine-hash id (ENGINE_KEYS) */
} srv_block_query_t;

/*
 * Parses the query string @query[0..len) (after '?', not decoded; NULL when
 * none): model (required), lora, durable (0, 1, false, true), keys
 * (sequence, engine), each value
 * percent-decoded and at most KVT_IDX_MAX_NAME bytes. KVT_OK and *@q_p set,
 * or KVT_ERR_INVAL with one line in @err (an unknown or repeated parameter, a
 * parameter without '=', a bad %-escape or %00, a missing model) and *@q_p
 * untouched.
 */
kvt_status_t srv_block_query_parse(const char *query, size_t len, srv_block_query_t *q_p, char *err,
                                   size_t errlen);

#endif
