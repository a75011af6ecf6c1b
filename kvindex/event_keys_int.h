/*
 * kvindex/event private: the one canonical form in which both decoders hash
 * a block's extra keys into its extra seed (kvt_event_t.extra_seeds), so the
 * same logical keys give the same seed over HTTP/RPC (JSON) and over ZMQ
 * (msgpack). docs/api.md ("Extra keys") states it for users:
 *
 *   seed = XXH3_64bits_withSeed(enc(key) for each key kept, KVT_EV_EXTRA_SEED), 1 if 0
 *   null 00 | false/true 01 00/01 | integer >= 0: 02 le64 | integer < 0: 03 le64
 *   float: 04 le64(IEEE double) | string: 05 le32(bytes) bytes | bytes: 06 le32 bytes
 *   array: 07 elements 0a | map: 08 (key value)... 0a | ext: 09 type le32 data
 */
#ifndef KVT_KVINDEX_EVENT_KEYS_INT_H
#define KVT_KVINDEX_EVENT_KEYS_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvindex/event.h"

enum {
    EV_KEY_NULL = 0x00,
    EV_KEY_BOOL = 0x01,
    EV_KEY_UINT = 0x02,  /* an integer >= 0 */
    EV_KEY_NEG = 0x03,   /* an integer < 0, as its two's complement */
    EV_KEY_FLOAT = 0x04, /* any other number, as a double */
    EV_KEY_STR = 0x05,
    EV_KEY_BIN = 0x06,
    EV_KEY_ARRAY = 0x07,
    EV_KEY_MAP = 0x08,
    EV_KEY_EXT = 0x09,
    EV_KEY_END = 0x0a, /* closes an array or a map */
};

static inline void ev_key_begin(XXH3_state_t *s)
{
    XXH3_INITSTATE(s);
    XXH3_64bits_reset_withSeed(s, KVT_EV_EXTRA_SEED);
}

/* The seed of what was fed since ev_key_begin(); never 0 (0 means "no extra keys"). */
static inline uint64_t ev_key_seed(XXH3_state_t *s)
{
    uint64_t v = XXH3_64bits_digest(s);
    return v != 0 ? v : 1;
}

/* A tag alone (null, array and map openers, their end). */
static inline void ev_key_tag(XXH3_state_t *s, uint8_t tag)
{
    XXH3_64bits_update(s, &tag, 1);
}

static inline void ev_key_bool(XXH3_state_t *s, bool v)
{
    uint8_t b[2] = {EV_KEY_BOOL, v ? 1 : 0};
    XXH3_64bits_update(s, b, 2);
}

/* EV_KEY_UINT, EV_KEY_NEG or EV_KEY_FLOAT with its 8 bytes, little-endian. */
static inline void ev_key_u64(XXH3_state_t *s, uint8_t tag, uint64_t v)
{
    uint8_t b[9] = {tag};
    for (int i = 0; i < 8; i++)
        b[1 + i] = (uint8_t)(v >> (8 * i));
    XXH3_64bits_update(s, b, 9);
}

static inline void ev_key_double(XXH3_state_t *s, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof(bits));
    ev_key_u64(s, EV_KEY_FLOAT, bits);
}

/* EV_KEY_STR or EV_KEY_BIN: its length (le32), then its @n bytes. */
static inline void ev_key_bytes(XXH3_state_t *s, uint8_t tag, const void *p, uint32_t n)
{
    uint8_t b[5] = {tag, (uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
    XXH3_64bits_update(s, b, 5);
    XXH3_64bits_update(s, p, n);
}

#endif
