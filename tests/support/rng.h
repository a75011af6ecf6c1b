/*
 * tests/support/rng.h: the tests' one random generator (header only).
 *
 * splitmix64: any seed is good (0 included), every state gives a different
 * stream, and it is fast enough for the randomized tests' millions of draws.
 * A generator is started on a stream number of the test's choosing (one per
 * sequence the test needs: a phase, a thread, a round) mixed with the run's
 * seed: 0 by default, so every run draws the same sequences, or the
 * environment variable KVT_TEST_SEED (decimal, or hexadecimal with 0x) when
 * set, to try others. The first generator started prints the seed to stderr,
 * so a failure can be replayed with KVT_TEST_SEED set to it.
 *
 * Thread safe as far as the tests need: each thread starts and draws from
 * its own kvt_rng_t.
 */
#ifndef KVT_TESTS_RNG_H
#define KVT_TESTS_RNG_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct kvt_rng {
    uint64_t s;
} kvt_rng_t;

/* splitmix64's output function: a bijection of u64 that mixes every bit. */
static inline uint64_t kvt_rng_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/*
 * The run's seed: KVT_TEST_SEED when set, else 0. A value that is not a
 * number ends the program (exit 2), rather than quietly running the default.
 * Printed once per process.
 */
static inline uint64_t kvt_test_seed(void)
{
    static int printed; /* atomically: generators may be started in threads */
    const char *env = getenv("KVT_TEST_SEED");
    uint64_t seed = 0;
    if (env != NULL && *env != '\0') {
        char *end;
        seed = strtoull(env, &end, 0);
        if (*end != '\0') {
            fprintf(stderr, "KVT_TEST_SEED=%s: not a number\n", env);
            exit(2);
        }
    }
    if (!__atomic_exchange_n(&printed, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "test seed: KVT_TEST_SEED=%" PRIu64 " replays this run\n", seed);
    return seed;
}

/* Starts @r on stream @stream of the run's seed (same stream, same seed: same sequence). */
static inline void kvt_rng_init(kvt_rng_t *r, uint64_t stream)
{
    r->s = kvt_rng_mix(kvt_test_seed() ^ kvt_rng_mix(stream + 0x9e3779b97f4a7c15ull));
}

/* The next 64 random bits. */
static inline uint64_t kvt_rng_next(kvt_rng_t *r)
{
    return kvt_rng_mix(r->s += 0x9e3779b97f4a7c15ull);
}

/*
 * Uniform in [0, @n) without modulo bias (draws below 2^64 mod @n are
 * redrawn, fewer than one in 2^32 for @n below 2^32); 0 when @n is 0.
 */
static inline uint64_t kvt_rng_below(kvt_rng_t *r, uint64_t n)
{
    if (n == 0)
        return 0;
    const uint64_t reject = -n % n; /* 2^64 mod n */
    uint64_t x;
    do
        x = kvt_rng_next(r);
    while (x < reject);
    return x % n;
}

#endif
