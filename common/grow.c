/* common/grow.c: growing arrays (grow.h). */
#include "common/grow.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

bool kvt_grow(void *arr_p, size_t *cap_p, size_t need, size_t elem, size_t first)
{
    if (need <= *cap_p)
        return true;
    size_t n = *cap_p != 0 ? *cap_p : (first != 0 ? first : 1);
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return false;
        n *= 2;
    }
    if (elem != 0 && n > SIZE_MAX / elem)
        return false;
    void *arr;
    memcpy(&arr, arr_p, sizeof(arr)); /* a T * read as void *, without type punning */
    void *grown = realloc(arr, n * elem);
    if (grown == NULL)
        return false;
    memcpy(arr_p, &grown, sizeof(grown));
    *cap_p = n;
    return true;
}
