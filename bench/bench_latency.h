/*
 * bench/bench_latency.h: what the files of `kvtier-bench latency` share:
 * bench_latency.c (options, the servers and their protocols, points, the
 * report) and bench_latency_loop.c (the client loop: closed and open loop
 * slices, with the scheduler's figures of both sides).
 */
#ifndef KVT_BENCH_BENCH_LATENCY_H
#define KVT_BENCH_BENCH_LATENCY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define BL_MAX_CONNS 8       /* entries of --connections */
#define BL_MAX_RATES 16      /* entries of --rates */
#define BL_MAX_POOL 256      /* connections at one point */
#define BL_IN_CAP 65536u     /* bytes of answer buffered per connection (an answer is ~2.5 KiB) */
#define BL_MAX_QUEUED 65536u /* open loop: requests waiting for a connection (else overloaded) */
#define BL_MAX_SAMPLES (1u << 24) /* per server and point */
#define BL_DRAIN_NS                                                                                \
    2000000000ull /* open loop: how long answers are awaited after the last arrival */
#define BL_WARMUP_NS 30000000ull          /* untimed closed loop on fresh connections */
#define BL_REDIS_VALUE "kvtier-bench-val" /* 16 bytes */
#define BL_REDIS_KEY "kvtier-bench:key"

/*
 * What differs between the servers: the bytes of request number @seq, and
 * the parser of answers. answer() returns the length of the first whole
 * answer in @buf[0..n), 0 when it is not whole yet, or -1 when the bytes are
 * no answer at all (the stream is lost); *@ok_p says whether it is the right
 * answer to request @seq (else it counts as an error).
 */
typedef struct bl_proto bl_proto_t;
struct bl_proto {
    const char *name;
    pid_t pid;
    uint16_t port;
    uint8_t **reqs; /* kvtierd: one QUERY frame per prompt; redis: one GET */
    size_t *reqlen;
    uint32_t nreqs;
    const uint8_t *(*request)(bl_proto_t *p, uint64_t seq, size_t *len_p);
    long (*answer)(const uint8_t *buf, size_t n, uint64_t seq, bool *ok_p);
};

typedef struct bl_samples {
    uint64_t *v;
    size_t n, cap;
} bl_samples_t;

/* One server's results at one point, summed over its slices. */
typedef struct bl_result {
    bl_samples_t lat; /* ns, scheduled (or sent) -> answered */
    bl_samples_t lag; /* open loop: ns, scheduled -> written */
    uint64_t done, errors, lost;
    uint64_t ans_bytes;              /* of the last answer */
    double secs;                     /* timed */
    double server_cpu, client_cpu;   /* seconds in the timed windows (schedstat) */
    double server_wait, client_wait; /* run-queue wait, seconds */
    uint64_t server_vol, server_invol, client_vol, client_invol;
    double others_cpu; /* CPU seconds of every other process (approximate: clock ticks) */
    double wall;       /* seconds of the timed windows, for others_cpu */
    bool overloaded;
} bl_result_t;

/* Frees @r's samples and zeroes it. */
void kvt_bl_result_drop(bl_result_t *r);

/* Adds @src (a slice) to @dst (its point) and drops @src. */
void kvt_bl_result_move(bl_result_t *dst, bl_result_t *src);

/*
 * kvtierd's query workers: its threads named as its main thread, besides that
 * one (the writer is "kvt-writer", libzmq's threads "ZMQbg/..."); 0 if unknown.
 */
uint32_t kvt_bl_kvtierd_workers(pid_t pid);

/*
 * One slice of a point for server @p: fresh connections, a warm-up, then
 * @ns of closed loop (@rate 0) or open loop. The CPU both sides used in the
 * timed part is added to @res. 0 or -1.
 */
int kvt_bl_slice(bl_proto_t *p, uint32_t nc, double rate, uint64_t ns, uint64_t seed,
                 bl_result_t *res);

#endif
