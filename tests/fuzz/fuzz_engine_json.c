/*
 * libFuzzer target for kvt_zsub_engine_json_decode() (kvindex/zsub_spec.c), the
 * POST /v1/engines body.
 *
 * Invariants checked on every input:
 *  - the input is copied to an exactly-sized heap buffer (ASan sees overreads);
 *  - success: every string is NUL-terminated within its field, pod, model
 *    and endpoint are non-empty, and kvt_zsub_engine_check() agrees;
 *  - failure: KVT_ERR_PARSE or KVT_ERR_INVAL, a non-empty message, and the
 *    output untouched;
 *  - the verdict does not depend on the error buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvindex/zsub.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_copy(data, size);
    if (s == NULL)
        return 0;
    kvt_zsub_engine_t e, pattern;
    memset(&pattern, 0x5a, sizeof(pattern));
    memcpy(&e, &pattern, sizeof(e));
    char err[200];
    memset(err, 'x', sizeof(err));
    kvt_status_t st = kvt_zsub_engine_json_decode(s, size, &e, err, sizeof(err));
    CHECK(memchr(err, '\0', sizeof(err)) != NULL);
    kvt_zsub_engine_t e2;
    CHECK(kvt_zsub_engine_json_decode(s, size, &e2, NULL, 0) == st);
    if (st == KVT_OK) {
        CHECK(memchr(e.pod, '\0', sizeof(e.pod)) && memchr(e.model, '\0', sizeof(e.model)));
        CHECK(memchr(e.endpoint, '\0', sizeof(e.endpoint)) &&
              memchr(e.replay_endpoint, '\0', sizeof(e.replay_endpoint)) &&
              memchr(e.topic, '\0', sizeof(e.topic)));
        CHECK(e.pod[0] && e.model[0] && e.endpoint[0]);
        CHECK(kvt_zsub_engine_check(&e, NULL, 0) == KVT_OK);
        CHECK(memcmp(&e, &e2, sizeof(e)) == 0);
    } else {
        CHECK(st == KVT_ERR_PARSE || st == KVT_ERR_INVAL);
        CHECK(err[0] != '\0');
        CHECK(memcmp(&e, &pattern, sizeof(e)) == 0);
    }
    free(s);
    return 0;
}
