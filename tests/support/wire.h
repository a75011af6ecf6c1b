/*
 * tests/support/wire.h: the codec tests' reference encoding (header only; include after
 * <cmocka.h>): bytes written one field at a time, as docs/protocol.md lays them out, to compare
 * with what the codec writes.
 */
#ifndef KVT_TESTS_WIRE_H
#define KVT_TESTS_WIRE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvt_wire {
    uint8_t b[16384];
    size_t n; /* bytes written */
} kvt_wire_t;

/* @width little-endian bytes of @v. */
static inline void kvt_wire_put(kvt_wire_t *o, uint64_t v, unsigned width)
{
    assert_true(o->n + width <= sizeof(o->b));
    for (unsigned i = 0; i < width; i++)
        o->b[o->n++] = (uint8_t)(v >> (8 * i));
}

static inline void kvt_wire_raw(kvt_wire_t *o, const void *p, size_t len)
{
    assert_true(o->n + len <= sizeof(o->b));
    if (len > 0)
        memcpy(o->b + o->n, p, len);
    o->n += len;
}

/* A str: u16 length, then the bytes. */
static inline void kvt_wire_str(kvt_wire_t *o, const void *p, size_t len)
{
    kvt_wire_put(o, len, 2);
    kvt_wire_raw(o, p, len);
}

/* @len bytes at @p in a heap block of exactly that size (1 when empty), so that ASan reports a
 * decoder reading past them. The caller frees it. */
static inline uint8_t *kvt_wire_dup(const uint8_t *p, size_t len)
{
    uint8_t *d = malloc(len > 0 ? len : 1);
    assert_non_null(d);
    if (len > 0)
        memcpy(d, p, len);
    return d;
}

#endif
