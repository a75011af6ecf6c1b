/*
 * `kvtier-bench hash [--seconds S] [--mib M]`: throughput of kvt_hash_seq
 * (keys only, local_out NULL: the index's path) at block sizes 16, 64, 512,
 * against the ceiling of one XXH3_64bits call over the same buffer (libxxhash's
 * run-time dispatched XXH3_64bits_dispatch where it exists, the fastest XXH3
 * this machine has, so the ratio says how close block hashing gets to it).
 *
 * Measurements run round-robin (b16, b64, b512, ceiling, b16, ...) so that
 * noise from a shared machine hits all four alike; the headline figure is the
 * best round of each (least disturbed), the table also shows the median.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL /* the same XXH3 build that kvindex/hash.c uses */
#include <xxhash.h>

#if !defined(KVT_HASH_NO_DISPATCH) && defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
/* libxxhash's run-time SIMD dispatch, also used by kvindex/hash.c for long blocks. */
XXH64_hash_t XXH3_64bits_dispatch(const void *input, size_t len);
#define KVT_BH_CEILING XXH3_64bits_dispatch
#define KVT_BH_CEILING_NAME "XXH3_64bits_dispatch"
#endif
#endif
#ifndef KVT_BH_CEILING
#define KVT_BH_CEILING XXH3_64bits
#define KVT_BH_CEILING_NAME "XXH3_64bits"
#endif

#include "bench/bench.h"
#include "common/clock.h"
#include "kvindex/hash.h"

#define KVT_BH_NCASES 4 /* three block sizes, then the ceiling */
#define KVT_BH_MIN_ROUNDS 3
#define KVT_BH_MAX_ROUNDS 1000

static const uint32_t kvt_bh_block_sizes[KVT_BH_NCASES - 1] = {16, 64, 512};

static void kvt_bh_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier-bench hash [--seconds S] [--mib M]\n"
            "\n"
            "Hashes M MiB of pseudo-random tokens (fixed seed) with kvt_hash_seq at block\n"
            "sizes 16, 64 and 512 and with one XXH3_64bits call (the ceiling), in rounds,\n"
            "for about S seconds (at least %d rounds). Reports GB/s of token bytes, best\n"
            "and median round; the last line is JSON with the best figures.\n"
            "\n"
            "  --seconds S   time budget for the measured rounds (default 2, 0.01..600)\n"
            "  --mib M       token buffer size in MiB (default 64, 1..4096)\n",
            KVT_BH_MIN_ROUNDS);
}

/* xorshift64*: fixed-seed filler, so every run hashes the same tokens. */
static uint64_t kvt_bh_next(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * UINT64_C(2685821657736338717);
}

/* One timed run of case @c; returns elapsed ns and folds the result into *@sum. */
static uint64_t kvt_bh_run(int c, const uint32_t *tokens, size_t ntokens, uint64_t *seq,
                           uint64_t *sum)
{
    uint64_t t0 = kvt_clock_ns();
    if (c < KVT_BH_NCASES - 1) {
        size_t n =
            kvt_hash_seq(tokens, ntokens, kvt_bh_block_sizes[c], KVT_HASH_SEED, NULL, NULL, seq);
        *sum = *sum * UINT64_C(0x100000001b3) + seq[n - 1] + n;
    } else {
        *sum = *sum * UINT64_C(0x100000001b3) + KVT_BH_CEILING(tokens, ntokens * sizeof(uint32_t));
    }
    uint64_t t1 = kvt_clock_ns();
    return t1 > t0 ? t1 - t0 : 1;
}

int kvt_bench_hash_main(int argc, char **argv)
{
    double seconds = 2.0;
    uint64_t mib = 64;
    int rc = 1;

    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_DOUBLE("--seconds", &seconds, 0.01, 600),
        KVT_BENCH_ARG_U64("--mib", &mib, 1, 4096),
    };
    int r = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (r > 0)
        kvt_bh_usage(stdout);
    if (r != 0)
        return r > 0 ? 0 : 2;

    size_t bytes = (size_t)mib << 20;
    size_t ntokens = bytes / sizeof(uint32_t);
    size_t max_blocks = ntokens / kvt_bh_block_sizes[0];
    uint32_t *tokens = malloc(bytes);
    uint64_t *seq = malloc(max_blocks * sizeof(uint64_t));
    uint64_t *times = malloc((size_t)KVT_BH_NCASES * KVT_BH_MAX_ROUNDS * sizeof(uint64_t));
    if (tokens == NULL || seq == NULL || times == NULL) {
        fprintf(stderr, "kvtier-bench: hash: out of memory for %" PRIu64 " MiB\n", mib);
        goto err_free;
    }

    uint64_t x = UINT64_C(0x9E3779B97F4A7C15);
    for (size_t i = 0; i < ntokens; i++)
        tokens[i] = (uint32_t)(kvt_bh_next(&x) >> 32);
    memset(seq, 0, max_blocks * sizeof(uint64_t)); /* fault the pages in before timing */

    uint64_t sum = 0;
    for (int c = 0; c < KVT_BH_NCASES; c++) /* warm-up round, not counted */
        (void)kvt_bh_run(c, tokens, ntokens, seq, &sum);

    uint64_t budget = (uint64_t)(seconds * 1e9);
    uint64_t start = kvt_clock_ns();
    size_t rounds = 0;
    while (rounds < KVT_BH_MAX_ROUNDS &&
           (rounds < KVT_BH_MIN_ROUNDS || kvt_clock_ns() - start < budget)) {
        for (int c = 0; c < KVT_BH_NCASES; c++)
            times[(size_t)c * KVT_BH_MAX_ROUNDS + rounds] =
                kvt_bh_run(c, tokens, ntokens, seq, &sum);
        rounds++;
    }

    double best[KVT_BH_NCASES], median[KVT_BH_NCASES];
    for (int c = 0; c < KVT_BH_NCASES; c++) {
        uint64_t *t = &times[(size_t)c * KVT_BH_MAX_ROUNDS];
        kvt_bench_sort_u64(t, rounds);
        best[c] = (double)bytes / (double)t[0]; /* bytes per ns = GB/s */
        median[c] = (double)bytes / kvt_bench_percentile(t, rounds, 50.0);
    }
    double ceiling = best[KVT_BH_NCASES - 1];

    printf("kvtier-bench hash: %" PRIu64 " MiB of tokens (%zu u32), %zu rounds in %.2f s,"
           " one core\n",
           mib, ntokens, rounds, (double)(kvt_clock_ns() - start) * 1e-9);
    printf("%-22s %12s %12s %14s %10s\n", "case", "blocks", "best GB/s", "median GB/s",
           "best/ceil");
    for (int c = 0; c < KVT_BH_NCASES - 1; c++) {
        char name[32];
        snprintf(name, sizeof(name), "kvt_hash_seq B=%u", kvt_bh_block_sizes[c]);
        printf("%-22s %12zu %12.2f %14.2f %10.3f\n", name, ntokens / kvt_bh_block_sizes[c], best[c],
               median[c], best[c] / ceiling);
    }
    printf("%-22s %12d %12.2f %14.2f %10.3f\n", "ceiling: one XXH3 call", 1, ceiling,
           median[KVT_BH_NCASES - 1], 1.0);
    printf("ceiling = %s over the whole buffer; checksum %016" PRIx64 "\n", KVT_BH_CEILING_NAME,
           sum);
    printf("{\"bench\":\"hash\",\"bytes\":%zu,\"gbps_b16\":%.3f,\"gbps_b64\":%.3f,"
           "\"gbps_b512\":%.3f,\"ceiling_gbps\":%.3f,\"ratio_b16\":%.4f,\"ratio_b512\":%.4f,"
           "\"stat\":\"best\",\"rounds\":%zu}\n",
           bytes, best[0], best[1], best[2], ceiling, best[0] / ceiling, best[2] / ceiling, rounds);
    rc = fflush(stdout) == 0 ? 0 : 1;

err_free:
    free(times);
    free(seq);
    free(tokens);
    return rc;
}
