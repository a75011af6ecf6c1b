/* Clocks: monotonic time for timeouts, TTLs and benchmarks. */
#ifndef KVT_COMMON_CLOCK_H
#define KVT_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic time in nanoseconds (CLOCK_MONOTONIC); never goes backwards. */
static inline uint64_t kvt_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Monotonic time in milliseconds. */
static inline uint64_t kvt_clock_ms(void)
{
    return kvt_clock_ns() / 1000000u;
}

/* Wall-clock time in seconds since the epoch, as a double (for event timestamps). */
static inline double kvt_clock_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
