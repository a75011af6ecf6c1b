/* Shared by the fuzz targets: an invariant check that aborts (libFuzzer saves the input). */
#ifndef KVT_FUZZ_CHECK_H
#define KVT_FUZZ_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/*
 * The input copied into a heap block of exactly @size bytes (1 when empty), so ASan reports
 * any read past it; NULL when memory runs out. The caller frees it.
 */
static inline void *fuzz_copy(const uint8_t *data, size_t size)
{
    void *s = malloc(size > 0 ? size : 1);
    if (s != NULL && size > 0)
        memcpy(s, data, size);
    return s;
}

#endif
