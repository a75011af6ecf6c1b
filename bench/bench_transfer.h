/*
 * bench/bench_transfer.h: what `kvtier-bench transfer` (bench_transfer.c, the
 * UCX core against ucx_perftest) shares with its --daemons part
 * (bench_transfer_daemons.c, the same points through two kvtierd).
 */
#ifndef KVT_BENCH_BENCH_TRANSFER_H
#define KVT_BENCH_BENCH_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

/* One point: a block size and a batch, and what each way of moving them measured. */
typedef struct kvt_bench_xpoint {
    uint64_t block, batch;
    double gbps, perftest_gbps, p50_us, p99_us; /* the core, ucx_perftest */
    uint64_t batches;
    double memcpy_gbps; /* --tls shm: memcpy() of the same blocks, the same way (-1: none) */
    double daemon_gbps, daemon_p50_us, daemon_p99_us; /* --daemons: one TRANSFER per batch */
} kvt_bench_xpoint_t;

/*
 * --daemons: measures @pts[0..n) (ordered by block size) through two kvtierd
 * (@kvtierd, NULL: the one next to kvtier-bench) on @tls, @seconds a point.
 * 0, or -1 after a line on stderr.
 */
int kvt_bench_transfer_daemons(const char *kvtierd, const char *tls, kvt_bench_xpoint_t *pts,
                               size_t n, double seconds);

#endif
