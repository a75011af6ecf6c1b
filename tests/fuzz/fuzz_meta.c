/*
 * libFuzzer target for kvt_meta_rec_decode() (tiers/meta.c), the block-record
 * codec RocksDB's bytes go through at warm restart. The first byte picks where
 * the rest splits into key and value (each copied into an exactly sized heap
 * block). Invariants: a refusal leaves the record untouched; an accepted pair
 * is a 13-byte 'b' key and a 25-byte version-1 value, and encoding the
 * decoded record gives back exactly the bytes it came from.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/tiers_test.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t rest = size - 1;
    size_t klen = data[0] < rest ? data[0] : rest;
    uint8_t *k = fuzz_copy(data + 1, klen);
    uint8_t *v = fuzz_copy(data + 1 + klen, rest - klen);
    if (k == NULL || v == NULL)
        goto out;
    kvt_meta_rec_t r, sentinel;
    memset(&sentinel, 0x5a, sizeof(sentinel));
    r = sentinel;
    if (!kvt_meta_rec_decode(k, klen, v, rest - klen, &r)) {
        CHECK(memcmp(&r, &sentinel, sizeof(r)) == 0);
        goto out;
    }
    CHECK(klen == KVT_META_KEY_BYTES && rest - klen == KVT_META_VAL_BYTES);
    CHECK(k[0] == 'b' && v[0] == 1);
    uint8_t k2[KVT_META_KEY_BYTES], v2[KVT_META_VAL_BYTES];
    kvt_meta_key_encode(r.ns, r.key, k2);
    kvt_meta_val_encode(&r, v2);
    CHECK(memcmp(k2, k, sizeof(k2)) == 0);
    CHECK(memcmp(v2, v, sizeof(v2)) == 0);
out:
    free(k);
    free(v);
    return 0;
}
