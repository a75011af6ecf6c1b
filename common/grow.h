/*
 * common/grow.h: the one way a growable array grows (doubling, overflow-checked,
 * realloc keeping the contents), for the arrays kvtier keeps beside its own
 * structures: worker scratch, stream and socket tables, in-flight queries.
 */
#ifndef KVT_COMMON_GROW_H
#define KVT_COMMON_GROW_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Makes room for @need elements of @elem bytes in the array whose pointer is
 * at @arr_p (the address of any T *), *@cap_p of them allocated: the capacity
 * doubles, from @first when it is 0, until it holds @need. Returns false when
 * the size overflows or memory runs out; the array and *@cap_p are then as
 * they were.
 */
bool kvt_grow(void *arr_p, size_t *cap_p, size_t need, size_t elem, size_t first);

#endif
