/*
 * `kvtier-bench events`: how fast a real kvtierd ingests engine KV events
 * (ZMQ receive -> msgpack decode -> index apply, on its writer thread).
 *
 * A second process publishes real vLLM-format batches on a ZMQ PUB socket
 * (bound on an ephemeral loopback port); kvtierd subscribes through
 * POST /v1/engines. Batches carry a cache's life: requests of 1024 tokens
 * stored as BlockStored events of B blocks (chained by parent hash), and,
 * once the cache holds --cache-blocks, the oldest request's blocks removed
 * as BlockRemoved events. The clock runs from the publisher's first timed
 * batch until /v1/stats shows the stream's last seq applied.
 *
 * Reported: block events (hashes in applied events) per second of wall
 * time and per second of the writer thread's CPU (the "one core" figure),
 * batches per second, the ZMQ I/O thread's CPU, and the yardstick measured
 * in the same run: the same payloads decoded and applied in-process on one
 * thread with no ZMQ. The last line is JSON.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <msgpack.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "kvindex/event.h"
#include "kvindex/index.h"

#define BE_TOKENS 1024u /* per request */
#define BE_BS 16u

typedef struct be_opts {
    const char *kvtierd;
    uint64_t blocks;    /* block events to publish */
    uint32_t per_event; /* blocks per event */
    uint32_t per_batch; /* events per batch */
    uint64_t cache_blocks;
    bool map_form;
    bool bytes_hash;
} be_opts_t;

static void be_usage(FILE *out)
{
    fprintf(out, "usage: kvtier-bench events [--kvtierd PATH] [--blocks N] [--blocks-per-event B]\n"
                 "                           [--events-per-batch E] [--cache-blocks C]\n"
                 "                           [--form array|map] [--hash uint|bytes]\n"
                 "\n"
                 "Starts kvtierd on loopback, subscribes it to a publisher in a second process,\n"
                 "and measures how fast it applies N block events (default 2000000) sent as\n"
                 "vLLM KV-event batches of E events (default 8) of B blocks (default 16), in the\n"
                 "positional (<= v0.25, default) or map (v0.26) form, with uint64 (default) or\n"
                 "32-byte hashes; once the cache holds C blocks (default 200000) the oldest\n"
                 "request is removed for each new one. The same payloads decoded and applied\n"
                 "in-process are the yardstick. The last line is JSON.\n");
}

static int be_parse(int argc, char **argv, be_opts_t *o)
{
    *o = (be_opts_t){NULL, 2000000, 16, 8, 200000, false, false};
    static const char *const forms[] = {"array", "map", NULL}, *const hashes[] = {"uint", "bytes",
                                                                                  NULL};
    uint32_t form = 0, hash = 0;
    const kvt_bench_arg_t args[] = {
        KVT_BENCH_ARG_STR("--kvtierd", &o->kvtierd),
        KVT_BENCH_ARG_CHOICE("--form", &form, forms),
        KVT_BENCH_ARG_CHOICE("--hash", &hash, hashes),
        KVT_BENCH_ARG_U64("--blocks", &o->blocks, 1000, 1000000000),
        KVT_BENCH_ARG_U32("--blocks-per-event", &o->per_event, 1, BE_TOKENS / BE_BS),
        KVT_BENCH_ARG_U32("--events-per-batch", &o->per_batch, 1, 4096),
        KVT_BENCH_ARG_U64("--cache-blocks", &o->cache_blocks, BE_TOKENS / BE_BS, 100000000),
    };
    int r = kvt_bench_parse_args(argc, argv, args, sizeof(args) / sizeof(args[0]));
    if (r > 0)
        be_usage(stdout);
    if (r != 0)
        return r;
    o->map_form = form == 1;
    o->bytes_hash = hash == 1;
    if ((BE_TOKENS / BE_BS) % o->per_event != 0) {
        fprintf(stderr, "kvtier-bench: --blocks-per-event must divide %u\n", BE_TOKENS / BE_BS);
        return -1;
    }
    if (o->kvtierd == NULL && (o->kvtierd = kvt_bench_default_kvtierd()) == NULL)
        return -1;
    return 0;
}

/* ---- the workload: a cache's life as vLLM batches ----------------------------------------- */

typedef struct be_gen {
    const be_opts_t *o;
    uint64_t req;       /* the request being stored */
    uint32_t req_block; /* its next block */
    uint64_t oldest;    /* oldest request still cached */
    uint32_t old_block; /* its next block to remove */
    uint64_t live;      /* blocks cached */
    uint64_t rng;
    uint32_t tok[BE_TOKENS];
} be_gen_t;

static uint64_t be_ehash(uint64_t req, uint32_t b)
{
    return req * 64 + b + 1;
}

static void be_pack_str(msgpack_packer *p, const char *s)
{
    msgpack_pack_str(p, strlen(s));
    msgpack_pack_str_body(p, s, strlen(s));
}

static void be_pack_hash(msgpack_packer *p, const be_opts_t *o, uint64_t h)
{
    if (!o->bytes_hash) {
        msgpack_pack_uint64(p, h);
        return;
    }
    uint8_t d[32] = {0};
    for (int i = 0; i < 8; i++)
        d[24 + i] = (uint8_t)(h >> (56 - 8 * i)); /* vLLM: the id is the last 8 bytes */
    msgpack_pack_bin(p, 32);
    msgpack_pack_bin_body(p, d, 32);
}

/* Packs the next event (stored or removed) into @p; returns its block count. */
static uint32_t be_event(be_gen_t *g, msgpack_packer *p)
{
    const be_opts_t *o = g->o;
    uint32_t n = o->per_event;
    bool remove = g->live >= o->cache_blocks && g->oldest < g->req;
    if (remove) {
        if (o->map_form) {
            msgpack_pack_map(p, 2);
            be_pack_str(p, "type");
            be_pack_str(p, "BlockRemoved");
            be_pack_str(p, "block_hashes");
        } else {
            msgpack_pack_array(p, 2);
            be_pack_str(p, "BlockRemoved");
        }
        msgpack_pack_array(p, n);
        for (uint32_t i = 0; i < n; i++)
            be_pack_hash(p, o, be_ehash(g->oldest, g->old_block + i));
        g->old_block += n;
        g->live -= n;
        if (g->old_block == BE_TOKENS / BE_BS) {
            g->oldest++;
            g->old_block = 0;
        }
        return n;
    }
    if (g->req_block == 0) {
        /* a new request: a 256-token prefix shared by groups of 16, then its own tokens */
        uint64_t x = 0x9e3779b97f4a7c15ull + (g->req / 16);
        for (uint32_t t = 0; t < BE_TOKENS; t++) {
            if (t == 256)
                x = 0x12345678ull + g->req * 0x9e3779b97f4a7c15ull;
            g->tok[t] = (uint32_t)(kvt_bench_rand(&x) % 128000u);
        }
    }
    uint32_t b0 = g->req_block;
    if (o->map_form) {
        msgpack_pack_map(p, b0 > 0 ? 5 : 4);
        be_pack_str(p, "type");
        be_pack_str(p, "BlockStored");
        be_pack_str(p, "block_hashes");
    } else {
        msgpack_pack_array(p, 5);
        be_pack_str(p, "BlockStored");
    }
    msgpack_pack_array(p, n);
    for (uint32_t i = 0; i < n; i++)
        be_pack_hash(p, o, be_ehash(g->req, b0 + i));
    if (o->map_form && b0 > 0)
        be_pack_str(p, "parent_block_hash");
    if (b0 > 0)
        be_pack_hash(p, o, be_ehash(g->req, b0 - 1));
    else if (!o->map_form)
        msgpack_pack_nil(p);
    if (o->map_form)
        be_pack_str(p, "token_ids");
    msgpack_pack_array(p, n * BE_BS);
    for (uint32_t t = 0; t < n * BE_BS; t++)
        msgpack_pack_uint32(p, g->tok[b0 * BE_BS + t]);
    if (o->map_form)
        be_pack_str(p, "block_size");
    msgpack_pack_uint32(p, BE_BS);
    g->req_block += n;
    g->live += n;
    if (g->req_block == BE_TOKENS / BE_BS) {
        g->req++;
        g->req_block = 0;
    }
    return n;
}

/* Packs the next batch [ts, events] into @sb (cleared first); returns its block count. */
static uint32_t be_batch(be_gen_t *g, msgpack_sbuffer *sb, double ts)
{
    msgpack_sbuffer_clear(sb);
    msgpack_packer p;
    msgpack_packer_init(&p, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 2);
    msgpack_pack_double(&p, ts);
    msgpack_pack_array(&p, g->o->per_batch);
    uint32_t blocks = 0;
    for (uint32_t e = 0; e < g->o->per_batch; e++)
        blocks += be_event(g, &p);
    return blocks;
}

/* The batches of a whole run, encoded once (both processes make the same ones). */
typedef struct be_payloads {
    char **data;
    size_t *len;
    size_t n;
    uint64_t blocks, bytes;
} be_payloads_t;

static int be_make(const be_opts_t *o, be_payloads_t *pl)
{
    be_gen_t g = {.o = o, .rng = 1};
    size_t cap = (size_t)(o->blocks / ((uint64_t)o->per_event * o->per_batch)) + 1;
    pl->data = calloc(cap, sizeof(*pl->data));
    pl->len = calloc(cap, sizeof(*pl->len));
    if (pl->data == NULL || pl->len == NULL)
        return -1;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    while (pl->blocks < o->blocks && pl->n < cap) {
        pl->blocks += be_batch(&g, &sb, 1.7e9 + (double)pl->n * 0.01);
        pl->data[pl->n] = malloc(sb.size);
        if (pl->data[pl->n] == NULL)
            return -1;
        memcpy(pl->data[pl->n], sb.data, sb.size);
        pl->len[pl->n++] = sb.size;
        pl->bytes += sb.size;
    }
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

static void be_free(be_payloads_t *pl)
{
    for (size_t i = 0; i < pl->n; i++)
        free(pl->data[i]);
    free(pl->data);
    free(pl->len);
}

/* ---- the publisher (second process) --------------------------------------------------- */

static int be_send(void *pub, uint64_t seq, const void *data, size_t len)
{
    uint8_t s[8];
    kvt_store_be64(s, seq);
    if (zmq_send(pub, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(pub, s, 8, ZMQ_SNDMORE) < 0 ||
        zmq_send(pub, data, len, 0) < 0)
        return -1;
    return 0;
}

/*
 * Child: binds a PUB, writes its endpoint line to @out_fd, sends empty
 * batches until a byte arrives on @ctl_fd (kvtierd has joined), then sends
 * every payload and exits 0 once the parent closes @ctl_fd.
 */
static int be_publisher(const be_payloads_t *pl, int out_fd, int ctl_fd)
{
    void *ctx = zmq_ctx_new();
    void *pub = zmq_socket(ctx, ZMQ_PUB);
    int zero = 0;
    zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof(zero)); /* never drop: the bench counts all */
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(pub, "tcp://127.0.0.1:*") != 0)
        return 1;
    char ep[256];
    size_t n = sizeof(ep);
    zmq_getsockopt(pub, ZMQ_LAST_ENDPOINT, ep, &n);
    dprintf(out_fd, "%s\n", ep);
    static const uint8_t empty[] = {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90}; /* [0.0, []] */
    uint64_t seq = 0;
    char c;
    struct pollfd pfd = {ctl_fd, POLLIN, 0};
    while (poll(&pfd, 1, 5) == 0)
        be_send(pub, seq++, empty, sizeof(empty));
    if (read(ctl_fd, &c, 1) != 1)
        return 1;
    for (size_t i = 0; i < pl->n; i++)
        if (be_send(pub, seq++, pl->data[i], pl->len[i]) != 0)
            return 1;
    while (read(ctl_fd, &c, 1) > 0) /* the parent closes it when it is done */
        ;
    zmq_close(pub);
    zmq_ctx_term(ctx);
    return 0;
}

/* ---- measuring -------------------------------------------------------------------------- */

/* CPU seconds of @pid's threads named @comm (prefix match), from /proc. */
static double be_thread_cpu(pid_t pid, const char *comm)
{
    double total = 0;
    char path[128];
    long hz = sysconf(_SC_CLK_TCK);
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    if (dir == NULL)
        return 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.20s/comm", (int)pid, de->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        char name[64] = "";
        if (fgets(name, sizeof(name), f) == NULL)
            name[0] = '\0';
        fclose(f);
        if (strncmp(name, comm, strlen(comm)) != 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.20s/stat", (int)pid, de->d_name);
        f = fopen(path, "r");
        if (f == NULL)
            continue;
        char buf[1024];
        size_t r = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[r] = '\0';
        const char *p = strrchr(buf, ')'); /* after the name: state, then utime is field 14 */
        unsigned long long ut = 0, st = 0;
        if (p &&
            sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
            total += (double)(ut + st) / (double)hz;
    }
    closedir(dir);
    return total;
}

/* The bench stream's fields from /v1/stats: last_seq (-1: none yet), blocks, errors. */
static int be_stream(uint16_t http, int64_t *last_p, uint64_t *blocks_p, uint64_t *bad_p)
{
    static char body[1 << 16];
    if (kvt_bench_http(http, "GET", "/v1/stats", "", 0, body, sizeof(body)) != 200)
        return -1;
    const char *s = strstr(body, "\"pod\":\"bench\",\"dp_rank\":0");
    const char *seq = s ? strstr(s, "\"last_seq\":") : NULL;
    const char *blk = s ? strstr(s, "\"blocks\":") : NULL;
    if (seq == NULL || blk == NULL)
        return -1;
    *last_p = strncmp(seq + 11, "null", 4) == 0 ? -1 : strtoll(seq + 11, NULL, 10);
    *blocks_p = strtoull(blk + 9, NULL, 10);
    uint64_t bad = 0;
    static const char *const keys[] = {
        "\"undecodable\":", "\"bad_frames\":", "\"gaps\":", "\"restarts\":"};
    for (size_t k = 0; k < 4; k++) {
        const char *v = strstr(s, keys[k]);
        bad += v ? strtoull(v + strlen(keys[k]), NULL, 10) : 1;
    }
    *bad_p = bad;
    return 0;
}

/* The yardstick: decode and apply every payload on this thread, no ZMQ. Seconds, or -1. */
static double be_inproc(const be_payloads_t *pl, uint64_t *blocks_p)
{
    kvt_idx_t *idx;
    kvt_idx_config_t cfg = {0};
    if (kvt_idx_create(&cfg, &idx) != KVT_OK)
        return -1;
    kvt_ev_ctx_t *ctx; /* what kvtierd's writer applies with (its default removed-map size) */
    if (kvt_ev_ctx_create((size_t)8 << 20, &ctx) != KVT_OK) {
        kvt_idx_destroy(idx);
        return -1;
    }
    kvt_ev_counters_t c = {0};
    char err[256];
    uint64_t t0 = kvt_clock_ns();
    for (size_t i = 0; i < pl->n; i++) {
        kvt_evbatch_t b;
        if (kvt_ev_msgpack_decode(pl->data[i], pl->len[i], KVT_EV_FMT_VLLM, "bench", "bench", 0,
                                  (size_t)1 << 30, &b, err, sizeof(err)) != KVT_OK ||
            kvt_ev_apply(idx, ctx, &b, BE_BS, 0, &c, err, sizeof(err)) != KVT_OK) {
            fprintf(stderr, "kvtier-bench: in-process batch %zu: %s\n", i, err);
            kvt_ev_ctx_destroy(ctx);
            kvt_idx_destroy(idx);
            return -1;
        }
        kvt_evbatch_cleanup(&b);
    }
    double s = (double)(kvt_clock_ns() - t0) / 1e9;
    *blocks_p = c.blocks;
    kvt_ev_ctx_destroy(ctx);
    kvt_idx_destroy(idx);
    return s;
}

int kvt_bench_events_main(int argc, char **argv)
{
    be_opts_t o;
    int pr = be_parse(argc, argv, &o);
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    be_payloads_t pl = {0};
    if (be_make(&o, &pl) != 0) {
        fprintf(stderr, "kvtier-bench: out of memory making %" PRIu64 " block events\n", o.blocks);
        return 1;
    }
    printf("workload: %zu batches, %" PRIu64 " block events, %.1f MB of msgpack (%s form, %s "
           "hashes, %u events of %u blocks per batch)\n",
           pl.n, pl.blocks, (double)pl.bytes / 1e6, o.map_form ? "map" : "array",
           o.bytes_hash ? "32-byte" : "uint64", o.per_batch, o.per_event);

    uint64_t in_blocks = 0;
    double in_s = be_inproc(&pl, &in_blocks);
    if (in_s < 0 || in_blocks != pl.blocks) {
        fprintf(stderr,
                "kvtier-bench: the in-process yardstick applied %" PRIu64 " of %" PRIu64
                " block events\n",
                in_blocks, pl.blocks);
        be_free(&pl);
        return 1;
    }

    kvt_bench_daemon_t d = {0};
    const char *args[] = {"--workers", "1", "--stats-period", "5ms", NULL};
    int out[2], ctl[2];
    /* close-on-exec: kvtierd must not hold the control pipe open */
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(ctl, O_CLOEXEC) != 0 ||
        kvt_bench_daemon_start(o.kvtierd, args, &d) != 0) {
        kvt_bench_daemon_stop(&d);
        be_free(&pl);
        return 1;
    }
    pid_t pub = fork();
    if (pub == 0) {
        close(out[0]);
        close(ctl[1]);
        _exit(be_publisher(&pl, out[1], ctl[0]));
    }
    close(out[1]);
    close(ctl[0]);
    char ep[256];
    size_t n = 0;
    while (n < sizeof(ep) - 1 && read(out[0], ep + n, 1) == 1 && ep[n] != '\n')
        n++;
    ep[n] = '\0';
    close(out[0]);
    int rc = 1;
    char body[512];
    int bl = snprintf(body, sizeof(body),
                      "{\"pod\":\"bench\",\"model\":\"bench\",\"endpoint\":\"%s\"}", ep);
    int64_t last = -1;
    uint64_t blocks = 0, bad = 0;
    if (strncmp(ep, "tcp://", 6) != 0 ||
        kvt_bench_http(d.http, "POST", "/v1/engines", body, (size_t)bl, NULL, 0) != 200) {
        fprintf(stderr, "kvtier-bench: could not subscribe kvtierd to '%s'\n", ep);
        goto out;
    }
    uint64_t deadline = kvt_clock_ns() + 20000000000ull;
    while ((be_stream(d.http, &last, &blocks, &bad) != 0 || last < 0) && kvt_clock_ns() < deadline)
        usleep(2000);
    if (last < 0) {
        fprintf(stderr, "kvtier-bench: kvtierd did not join the stream\n");
        goto out;
    }
    double cpu0 = be_thread_cpu(d.pid, "kvt-writer"), io0 = be_thread_cpu(d.pid, "ZMQbg/IO");
    uint64_t blocks0 = blocks;
    uint64_t t0 = kvt_clock_ns();
    if (write(ctl[1], "g", 1) != 1)
        goto out;
    /* the joining empty batches took seqs 0..last (and maybe a few more): wait for ours */
    uint64_t done_at = 0;
    deadline = t0 + 600000000000ull;
    while (kvt_clock_ns() < deadline) {
        if (be_stream(d.http, &last, &blocks, &bad) == 0 && blocks - blocks0 >= pl.blocks) {
            done_at = kvt_clock_ns();
            break;
        }
        usleep(1000);
    }
    double cpu = be_thread_cpu(d.pid, "kvt-writer") - cpu0;
    double io = be_thread_cpu(d.pid, "ZMQbg/IO") - io0;
    if (done_at == 0) {
        fprintf(stderr,
                "kvtier-bench: kvtierd applied %" PRIu64 " of %" PRIu64 " block events in 600 s\n",
                blocks - blocks0, pl.blocks);
        goto out;
    }
    double secs = (double)(done_at - t0) / 1e9;
    double bps = (double)pl.blocks / secs, per_core = cpu > 0 ? (double)pl.blocks / cpu : 0;
    double in_bps = (double)pl.blocks / in_s;
    printf("block events, kvtierd over ZMQ      %10.0f /s  (%" PRIu64 " in %.3f s)\n", bps,
           pl.blocks, secs);
    printf("batches, kvtierd over ZMQ           %10.0f /s\n", (double)pl.n / secs);
    printf("per second of writer-thread CPU     %10.0f /s  (writer %.3f s, zmq io thread %.3f s)\n",
           per_core, cpu, io);
    printf("block events, in-process yardstick  %10.0f /s  (decode + apply, one thread, no ZMQ)\n",
           in_bps);
    printf("stream errors (undecodable, bad frames, gaps, restarts): %" PRIu64 "\n", bad);
    printf("{\"bench\":\"events\",\"block_events_per_sec\":%.0f,\"batches_per_sec\":%.0f,"
           "\"events_per_sec\":%.0f,\"block_events\":%" PRIu64 ",\"batches\":%zu,\"seconds\":%.4f,"
           "\"writer_cpu_s\":%.3f,\"block_events_per_writer_cpu_sec\":%.0f,\"zmq_io_cpu_s\":%.3f,"
           "\"inproc_block_events_per_sec\":%.0f,\"vs_inproc\":%.3f,\"form\":\"%s\","
           "\"hash\":\"%s\",\"blocks_per_event\":%u,\"events_per_batch\":%u,\"bytes\":%" PRIu64
           ",\"errors\":%" PRIu64 "}\n",
           bps, (double)pl.n / secs, (double)pl.n * o.per_batch / secs, pl.blocks, pl.n, secs, cpu,
           per_core, io, in_bps, bps / in_bps, o.map_form ? "map" : "array",
           o.bytes_hash ? "bytes" : "uint", o.per_event, o.per_batch, pl.bytes, bad);
    rc = bad == 0 ? 0 : 1;
out:
    close(ctl[1]); /* the publisher exits */
    waitpid(pub, NULL, 0);
    kvt_bench_daemon_stop(&d);
    be_free(&pl);
    return rc;
}
