/*
 * Fuzz target for the block API URL's parsers (server/blockq.c): the first
 * byte splits the input into a key and a query string. Checks that what
 * parses is well-formed (a key prints back to itself; a model is non-empty,
 * without NUL, within the name limit) and that a refusal says why in one line.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fuzz_check.h"
#include "server/blockq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t cut = data[0] < size ? data[0] : size - 1;
    char key[256];
    size_t klen = cut < sizeof(key) - 1 ? cut : sizeof(key) - 1;
    memcpy(key, data + 1, klen > size - 1 ? size - 1 : klen);
    key[klen > size - 1 ? size - 1 : klen] = '\0';
    uint64_t k;
    if (srv_block_key_parse(key, &k)) {
        uint64_t k2;
        char s[32];
        snprintf(s, sizeof(s), "%llu", (unsigned long long)k);
        CHECK(srv_block_key_parse(s, &k2) && k2 == k);
    }
    const char *q = (const char *)data + 1 + cut;
    size_t qlen = size - 1 - cut;
    srv_block_query_t out, again;
    char err[128] = "";
    kvt_status_t st = srv_block_query_parse(qlen ? q : NULL, qlen, &out, err, sizeof(err));
    if (st == KVT_OK) {
        size_t m = strnlen(out.model, sizeof(out.model));
        CHECK(m > 0 && m < sizeof(out.model));
        CHECK(strnlen(out.lora, sizeof(out.lora)) < sizeof(out.lora));
        CHECK(srv_block_query_parse(qlen ? q : NULL, qlen, &again, NULL, 0) == KVT_OK);
        CHECK(memcmp(&out, &again, sizeof(out)) == 0);
    } else {
        CHECK(st == KVT_ERR_INVAL && err[0] != '\0' && strchr(err, '\n') == NULL);
    }
    return 0;
}
