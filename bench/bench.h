/*
 * bench: `kvtier-bench <subcommand> [options]`. Each subcommand is one
 * kvt_bench_<name>_main(); kvtier_bench.c dispatches and holds the helpers
 * declared here.
 *
 * Conventions for subcommands: argv[0] is the subcommand's name; a human
 * table goes to stdout and the LAST stdout line is one JSON object with a
 * "bench" key; bad options print one "kvtier-bench: <message>" line on stderr
 * and return 2; runtime failures return 1; run time is bounded by options.
 */
#ifndef KVT_BENCH_BENCH_H
#define KVT_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* `kvtier-bench hash`: block-hashing throughput against XXH3's ceiling (bench_hash.c). */
int kvt_bench_hash_main(int argc, char **argv);

/* `kvtier-bench index`: index and query benchmarks (bench_index.c; docs/performance.md). */
int kvt_bench_index_main(int argc, char **argv);

/* `kvtier-bench rpc`: a real kvtierd's query throughput and latency (bench_rpc.c). */
int kvt_bench_rpc_main(int argc, char **argv);

/*
 * The RPC transport ceiling (rpc_ceiling.c): forks a server on 127.0.0.1
 * (an ephemeral port, in *@port_p) that answers every RPC frame with
 * @answers[req_id % @n] (frames of @anslen bytes; the request's id is copied
 * in) on @threads epoll threads, doing no other work. Returns 0, or -1 with
 * nothing started. kvt_bench_ceiling_stop() kills and reaps it.
 */
int kvt_bench_ceiling_start(uint32_t threads, uint8_t *const *answers, const size_t *anslen,
                            size_t n, pid_t *pid_p, uint16_t *port_p);
void kvt_bench_ceiling_stop(pid_t pid);

/* `kvtier-bench latency`: kvtierd's latency as a router sees it, redis GET beside
 * (bench_latency.c). */
int kvt_bench_latency_main(int argc, char **argv);

/* `kvtier-bench events`: a real kvtierd's ingest of ZMQ KV events (bench_events.c). */
int kvt_bench_events_main(int argc, char **argv);

/* `kvtier-bench json`: kvtier's JSON decoders against jansson on the API's bodies (bench_json.c).
 */
int kvt_bench_json_main(int argc, char **argv);

/* `kvtier-bench tiers`: the RAM and NVMe tiers against memcpy and fio, the restore at open
 * against a RocksDB iteration, the reload of a block from NVMe (bench_tiers.c). */
int kvt_bench_tiers_main(int argc, char **argv);

/* `kvtier-bench replay`: a trace over simulated pods, the routers' policies side by side
 * (bench_replay.c, bench/sim.h). */
int kvt_bench_replay_main(int argc, char **argv);
/* `kvtier-bench replay --mode timed` (replay_timed.c, bench/sim_timed.h). */
int kvt_bench_replay_timed_main(int argc, char **argv);

/* `kvtier-bench gen`: a synthetic Mooncake-format trace with sessions, or the Azure CSV given
 * prefix structure (bench_gen.c, bench/gen.h). */
int kvt_bench_gen_main(int argc, char **argv);

/* `kvtier-bench transfer`: transfer/'s UCX pulls between two processes against ucx_perftest
 * (bench_transfer.c). */
int kvt_bench_transfer_main(int argc, char **argv);

/* `kvtier-bench connector`: an engine connector's load cycle against PING (bench_connector.c). */
int kvt_bench_connector_main(int argc, char **argv);

/* ---- the daemon benches' helpers (bench_daemon.c) ---- */

/* A blocking TCP connection to 127.0.0.1:@port (TCP_NODELAY), or -1. */
int kvt_bench_connect(uint16_t port);

/* Writes or reads exactly @n bytes (retrying EINTR); 0 or -1. */
int kvt_bench_write_all(int fd, const void *p, size_t n);
int kvt_bench_read_all(int fd, void *p, size_t n);

/*
 * One HTTP/1.1 request to 127.0.0.1:@port (Connection: close). Returns the
 * status, or -1. When @out is not NULL, the answer's body (NUL-terminated,
 * cut to @outcap - 1 bytes) is written there.
 */
int kvt_bench_http(uint16_t port, const char *method, const char *path, const char *body,
                   size_t len, char *out, size_t outcap);

/* build/bin/kvtierd next to this kvtier-bench, or NULL; a static buffer. */
const char *kvt_bench_default_kvtierd(void);

/* A libkvtier client of @addr ("host:port" or "unix:/path") with @io_timeout_ms for each call,
 * or NULL after a line on stderr. */
struct kvt_client;
struct kvt_client *kvt_bench_client(const char *addr, uint32_t io_timeout_ms);

/* A kvtierd started by kvt_bench_daemon_start(). */
typedef struct kvt_bench_daemon {
    pid_t pid;
    uint16_t http, rpc; /* its ephemeral ports */
    char dir[64];       /* its temp dir, removed by kvt_bench_daemon_stop() */
    bool unix_sock;     /* set before start: --rpc-unix DIR/rpc.sock too */
} kvt_bench_daemon_t;

/*
 * Starts @kvtierd on ephemeral loopback ports in a new temp dir, with log
 * level warn and the extra flags @args (NULL-terminated; may be NULL), and
 * waits for its "kvtierd listening" line. 0, or -1 (a line on stderr).
 */
int kvt_bench_daemon_start(const char *kvtierd, const char *const *args, kvt_bench_daemon_t *d);

/* Stops it with SIGTERM (SIGSTOPped or not), reaps it and removes its dir. A zeroed @d is fine. */
void kvt_bench_daemon_stop(kvt_bench_daemon_t *d);

/*
 * The router workload of the daemon benches (bench_rpc.c, bench_latency.c):
 * K prompts of N tokens (block size 16) on P pods.
 *
 * kvt_bench_prompt() writes prompt @i's @n tokens to @out: a 256-token system
 * prefix shared by every prompt, then tokens of its own.
 * kvt_bench_holder() says where prompt @i's blocks live: copy 0, all of them,
 * on one pod; copy 1, the first half, on the next pod. Returns the pod and
 * sets *@blocks_p. kvt_bench_ehash() is the engine's hash of block @b of
 * prompt @i.
 * kvt_bench_load() stores both copies of every prompt in the kvtierd at
 * @http_port through POST /v1/events (@tok: scratch of @tokens ids); 0, or
 * -1 with a line on stderr. Every query then matches all @pods pods on the
 * shared prefix and two pods beyond it.
 * kvt_bench_query_frame() returns prompt @i's QUERY request frame for model
 * "bench" (req_id 0: patch bytes 8..15), malloc'ed, its length in *@len_p,
 * or NULL; @tok is left holding the prompt.
 */
void kvt_bench_prompt(uint32_t i, uint32_t n, uint32_t *out);
uint32_t kvt_bench_holder(uint32_t pods, uint32_t tokens, uint32_t i, uint32_t copy,
                          uint32_t *blocks_p);
uint64_t kvt_bench_ehash(uint32_t i, uint32_t b);
int kvt_bench_load(uint16_t http_port, uint32_t pods, uint32_t prompts, uint32_t tokens,
                   uint32_t *tok);
uint8_t *kvt_bench_query_frame(uint32_t i, uint32_t tokens, uint32_t *tok, size_t *len_p);

/*
 * CPU seconds (user + system) process @pid has used so far, from
 * /proc/PID/stat; -1 when it cannot be read. Per-request CPU is steadier than
 * requests/s on a shared machine: it does not count time the process waited.
 */
double kvt_bench_proc_cpu(pid_t pid);

/*
 * The machine's "steal" and total CPU ticks so far (/proc/stat): time a
 * virtual machine's CPUs were ready but the host ran something else. A run
 * with much of it measured a busy host, not kvtierd. False if unreadable.
 */
bool kvt_bench_steal(uint64_t *steal_p, uint64_t *total_p);

/* xorshift64: the benches' deterministic workload generator (*@x must not be 0). */
static inline uint64_t kvt_bench_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Sorts @v[0..n) ascending in place. */
void kvt_bench_sort_u64(uint64_t *v, size_t n);

/*
 * The @p-th percentile (0 <= p <= 100) of @sorted[0..n) (ascending), by
 * linear interpolation between closest ranks: p=0 is the minimum, p=50 the
 * median, p=100 the maximum. Returns 0 when n is 0; p is clamped to [0, 100].
 */
double kvt_bench_percentile(const uint64_t *sorted, size_t n, double p);

/* What an option of a subcommand takes, and where it goes (kvt_bench_arg_t.dst). */
typedef enum kvt_bench_arg_kind {
    KVT_BENCH_FLAG,   /* bool *: set to true; takes no value */
    KVT_BENCH_STR,    /* const char **: the value, not empty */
    KVT_BENCH_U32,    /* uint32_t *: an integer in [min, max] */
    KVT_BENCH_U64,    /* uint64_t *: an integer in [min, max] */
    KVT_BENCH_DOUBLE, /* double *: a finite number in [lo, hi] */
    KVT_BENCH_CHOICE, /* uint32_t *: the index of the value in @choices (NULL-terminated) */
    KVT_BENCH_CUSTOM, /* parse(name, value, dst): 0, or -1 after printing why */
} kvt_bench_arg_kind_t;

/* One option of a subcommand's table. */
typedef struct kvt_bench_arg {
    const char *name; /* "--pods" */
    kvt_bench_arg_kind_t kind;
    void *dst;
    uint64_t min, max;                                          /* U32, U64 */
    double lo, hi;                                              /* DOUBLE */
    const char *const *choices;                                 /* CHOICE */
    int (*parse)(const char *name, const char *val, void *dst); /* CUSTOM */
} kvt_bench_arg_t;

/* Table entries, one per kind. */
#define KVT_BENCH_ARG_FLAG(n, d)                                                                   \
    {                                                                                              \
        .name = (n), .kind = KVT_BENCH_FLAG, .dst = (d)                                            \
    }
#define KVT_BENCH_ARG_STR(n, d)                                                                    \
    {                                                                                              \
        .name = (n), .kind = KVT_BENCH_STR, .dst = (d)                                             \
    }
#define KVT_BENCH_ARG_U32(n, d, mn, mx)                                                            \
    {                                                                                              \
        .name = (n), .kind = KVT_BENCH_U32, .dst = (d), .min = (mn), .max = (mx)                   \
    }
#define KVT_BENCH_ARG_U64(n, d, mn, mx)                                                            \
    {                                                                                              \
        .name = (n), .kind = KVT_BENCH_U64, .dst = (d), .min = (mn), .max = (mx)                   \
    }
#define KVT_BENCH_ARG_DOUBLE(n, d, l, h)                                                           \
    {                                                                                              \
        .name = (n), .kind = KVT_BENCH_DOUBLE, .dst = (d), .lo = (l), .hi = (h)                    \
    }
#define KVT_BENCH_ARG_CHOICE(n, d, c)                                                              \
    {                                                                                              \
        .name = (n), .kind = KVT_BENCH_CHOICE, .dst = (d), .choices = (c)                          \
    }
#define KVT_BENCH_ARG_CUSTOM(n, d, f)                                                              \
    {                                                                                              \
        .name = (n), .kind = KVT_BENCH_CUSTOM, .dst = (d), .parse = (f)                            \
    }

/*
 * Parses argv[1..argc) against the @n (at most 64) options of @args, each
 * given as "--name V" or "--name=V" (a FLAG as "--name"), at most once. A
 * value never starts with "--" (that is the next option: the value is
 * missing). Returns 0 when all are parsed, 1 on "--help" or "-h" (the caller
 * prints its usage), and -1 after printing one line "kvtier-bench: ..." on
 * stderr for an unknown option, a repeated one, a missing value or a bad one.
 */
int kvt_bench_parse_args(int argc, char **argv, const kvt_bench_arg_t *args, size_t n);

/*
 * Strict parsers for option values: unsigned decimal (no sign, no spaces)
 * within [lo, hi], or a plain decimal number within [lo, hi] (digits with an
 * optional point, fraction and exponent, optionally negative: "2", "0.5",
 * "1e6"; no spaces, hex, "inf" or "nan"). Return 0 and set *@out_p, or print
 * "kvtier-bench: <opt>: ..." on stderr and return -1.
 */
int kvt_bench_parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out_p);
int kvt_bench_parse_double(const char *opt, const char *s, double lo, double hi, double *out_p);

#endif
