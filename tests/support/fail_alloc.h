/*
 * tests/support/fail_alloc.h: makes a chosen realloc() fail, to test the
 * paths that handle running out of memory. Include it in exactly one file of
 * a test program linked with -Wl,--wrap=realloc (tests/CMakeLists.txt:
 * kvt_test_fail_alloc()); only code linked statically into the program (the
 * kvtier libraries, msgpack-c's inline buffer code) goes through the wrapper.
 */
#ifndef KVT_TESTS_FAIL_ALLOC_H
#define KVT_TESTS_FAIL_ALLOC_H

#include <stddef.h>

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

/* Calls left until the one that fails; 0: none fails. */
static unsigned long fail_alloc_countdown;
/* reallocs failed so far. */
static unsigned long fail_alloc_failed;

/* The @n-th realloc() from now (1: the next) returns NULL; later ones succeed again. */
static inline void fail_alloc_at(unsigned long n)
{
    fail_alloc_countdown = n;
}

void *__wrap_realloc(void *p, size_t n)
{
    if (fail_alloc_countdown > 0 && --fail_alloc_countdown == 0) {
        fail_alloc_failed++;
        return NULL;
    }
    return __real_realloc(p, n);
}

#endif
