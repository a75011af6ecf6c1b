/* Byte order: big-endian fields of wire formats (ZMQ sequence numbers, hash digests), and
 * little-endian word loads. */
#ifndef KVT_COMMON_BYTES_H
#define KVT_COMMON_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The big-endian unsigned value of @p[0..n), n <= 8. */
static inline uint64_t kvt_load_be(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* The little-endian unsigned value of @p[0..n), n <= 8: one load where @n is a constant
 * (inlined) on a little-endian host. */
static inline uint64_t kvt_load_le(const void *p, size_t n)
{
    uint64_t v = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(&v, p, n);
#else
    for (size_t i = n; i-- > 0;)
        v = v << 8 | ((const uint8_t *)p)[i];
#endif
    return v;
}

/* Writes @v as 8 big-endian bytes. */
static inline void kvt_store_be64(uint8_t out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(v >> (56 - 8 * i));
}

#endif
