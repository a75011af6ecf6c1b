/*
 * common/heap.h: the one binary heap (header only), for any element type.
 *
 * KVT_HEAP_DEFINE(prefix, type, before), at file scope and with no semicolon
 * after it, defines static inline functions over an array of @type, where
 * before(a, b) (a function or a function-like macro taking two const type *)
 * is true when *a belongs nearer the top than *b: a strict weak order, so
 * before(x, x) is false. "<" on a field gives a min-heap, ">" a max-heap.
 * before is called directly, where the compiler can inline it, not through a
 * pointer; elements move by assignment into a hole, not by swaps or memcpy.
 * The array and its count are the caller's; nothing allocates.
 *
 * Defined (unused ones cost nothing and do not warn):
 *
 *   void prefix_up(type *a, size_t i)
 *       The array is a heap except that a[i] may belong higher (after it is
 *       appended, or its key moves towards the top): moves it up.
 *   void prefix_down(type *a, size_t n, size_t i)
 *       a[0..n) is a heap except that a[i] may belong lower: moves it down.
 *   void prefix_make(type *a, size_t n)
 *       Makes a[0..n) a heap, in O(n).
 *   void prefix_push(type *a, size_t *n_p, type x)
 *       Adds x to the heap a[0..*n_p) and counts it; a must have room for
 *       *n_p + 1 elements.
 *   type prefix_pop(type *a, size_t *n_p)
 *       Removes and returns the top of the heap a[0..*n_p); *n_p must be > 0.
 *   void prefix_sort(type *a, size_t n)
 *       Heap sort in place: the element that would be popped first ends last,
 *       so a max-heap's order sorts ascending. Not stable.
 */
#ifndef KVT_COMMON_HEAP_H
#define KVT_COMMON_HEAP_H

#include <stddef.h>

#define KVT_HEAP_FN_ static inline __attribute__((unused))

#define KVT_HEAP_DEFINE(prefix, type, before)                                                      \
    /* Fills the hole at @i of the heap a[0..n) with @x, moving children up past it. */            \
    KVT_HEAP_FN_ void prefix##_hole_down_(type *a, size_t n, size_t i, type x)                     \
    {                                                                                              \
        for (;;) {                                                                                 \
            size_t c = 2 * i + 1;                                                                  \
            if (c >= n)                                                                            \
                break;                                                                             \
            if (c + 1 < n && before(&a[c + 1], &a[c]))                                             \
                c++;                                                                               \
            if (!before(&a[c], &x))                                                                \
                break;                                                                             \
            a[i] = a[c];                                                                           \
            i = c;                                                                                 \
        }                                                                                          \
        a[i] = x;                                                                                  \
    }                                                                                              \
                                                                                                   \
    /* Fills the hole at @i, below the heap a[0..i), with @x, moving parents down past it. */      \
    KVT_HEAP_FN_ void prefix##_hole_up_(type *a, size_t i, type x)                                 \
    {                                                                                              \
        while (i > 0) {                                                                            \
            size_t p = (i - 1) / 2;                                                                \
            if (!before(&x, &a[p]))                                                                \
                break;                                                                             \
            a[i] = a[p];                                                                           \
            i = p;                                                                                 \
        }                                                                                          \
        a[i] = x;                                                                                  \
    }                                                                                              \
                                                                                                   \
    KVT_HEAP_FN_ void prefix##_up(type *a, size_t i)                                               \
    {                                                                                              \
        prefix##_hole_up_(a, i, a[i]);                                                             \
    }                                                                                              \
                                                                                                   \
    KVT_HEAP_FN_ void prefix##_down(type *a, size_t n, size_t i)                                   \
    {                                                                                              \
        prefix##_hole_down_(a, n, i, a[i]);                                                        \
    }                                                                                              \
                                                                                                   \
    KVT_HEAP_FN_ void prefix##_make(type *a, size_t n)                                             \
    {                                                                                              \
        for (size_t i = n / 2; i-- > 0;)                                                           \
            prefix##_hole_down_(a, n, i, a[i]);                                                    \
    }                                                                                              \
                                                                                                   \
    KVT_HEAP_FN_ void prefix##_push(type *a, size_t *n_p, type x)                                  \
    {                                                                                              \
        prefix##_hole_up_(a, (*n_p)++, x);                                                         \
    }                                                                                              \
                                                                                                   \
    KVT_HEAP_FN_ type prefix##_pop(type *a, size_t *n_p)                                           \
    {                                                                                              \
        type top = a[0];                                                                           \
        size_t n = --*n_p;                                                                         \
        if (n > 0)                                                                                 \
            prefix##_hole_down_(a, n, 0, a[n]);                                                    \
        return top;                                                                                \
    }                                                                                              \
                                                                                                   \
    KVT_HEAP_FN_ void prefix##_sort(type *a, size_t n)                                             \
    {                                                                                              \
        prefix##_make(a, n);                                                                       \
        for (size_t end = n; end > 1; end--) {                                                     \
            type top = a[0];                                                                       \
            prefix##_hole_down_(a, end - 1, 0, a[end - 1]);                                        \
            a[end - 1] = top;                                                                      \
        }                                                                                          \
    }

#endif
