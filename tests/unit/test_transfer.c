/*
 * test_transfer: transfer/ over real UCX on loopback. The far side is this
 * same binary run as a server ("--serve", exec'd after fork so that it starts
 * UCX in a clean process): it creates its own context and worker, registers a
 * region filled with a pattern, sends its worker address, rkey and region
 * over a socketpair, then serves (waiting on the worker's event fd) and checks
 * pushed bytes on request. The test side pulls and pushes a few hundred blocks
 * of 4 KiB .. 4 MiB under tcp (and shared memory where UCX allows it with
 * peer failure handling) and checks every byte;
 * and through a mapped peer (the server's sealed memfd passed over the
 * socketpair, as kvtierd maps a same-host peer's arena), also after the
 * server was killed;
 * kills the server mid-batch (SIGKILL) and opens a new one; stops it (SIGSTOP)
 * so a batch times out; and feeds submit bad entries.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/fdpass.h"
#include "tests/support/rng.h"
#include "transfer/transfer.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#define NBLOCKS 300u
#define WAIT_S 60 /* generous: only there so a bug fails instead of hanging */
#define TLS_SHM "posix,cma,self"

static const char *skipped; /* why a case was skipped: the run then exits 77 */
static const char *g_self;  /* this binary, for the server */

/* ---- the pattern: byte o of a region filled with seed s ---- */

static uint64_t pat_word(uint64_t seed, uint64_t w)
{
    return kvt_rng_mix(seed * 0x9e3779b97f4a7c15ull + w);
}

/* Fills @len bytes at @p as region offset @off (8-byte aligned) of seed @seed. */
static void pat_fill(uint8_t *p, uint64_t off, uint64_t len, uint64_t seed)
{
    for (uint64_t i = 0; i < len; i += 8) {
        uint64_t v = pat_word(seed, (off + i) / 8);
        memcpy(p + i, &v, len - i < 8 ? len - i : 8);
    }
}

static bool pat_check(const uint8_t *p, uint64_t off, uint64_t len, uint64_t seed)
{
    for (uint64_t i = 0; i < len; i += 8) {
        uint64_t v = pat_word(seed, (off + i) / 8);
        if (memcmp(p + i, &v, len - i < 8 ? len - i : 8) != 0)
            return false;
    }
    return true;
}

/* ---- socket helpers ---- */

static bool write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        p += k;
        len -= (size_t)k;
    }
    return true;
}

static bool read_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = read(fd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        p += k;
        len -= (size_t)k;
    }
    return true;
}

/* What the server sends first: this header, then the address and rkey bytes. */
typedef struct hello {
    uint64_t addr_len, rkey_len, base, len, incarnation;
} hello_t;

/* A request to the server: 'V' (check @n ranges against @seed, then the ranges follow as
 * u64 pairs; answer one byte, 1 good) or 'Q' (quit). */
typedef struct cmd {
    uint64_t op, seed, n;
} cmd_t;

static void *map_region(uint64_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- the server (a separate process) ---- */

static int serve_cmd(int sock, const uint8_t *base)
{
    cmd_t c;
    if (!read_all(sock, &c, sizeof(c)) || c.op == 'Q')
        return 1;
    bool good = true;
    for (uint64_t i = 0; i < c.n; i++) {
        uint64_t r[2];
        if (!read_all(sock, r, sizeof(r)))
            return 1;
        if (good && !pat_check(base + r[0], r[0], r[1], c.seed)) {
            fprintf(stderr, "serve: range %" PRIu64 " +%" PRIu64 " differs\n", r[0], r[1]);
            good = false;
        }
    }
    uint8_t a = good;
    return write_all(sock, &a, 1) ? 0 : 1;
}

/* A region in a memfd sealed against shrinking, as kvtierd's arena: *@fd_p is its fd. */
static uint8_t *map_memfd(uint64_t len, int *fd_p)
{
    int fd = memfd_create("test-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        return NULL;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    *fd_p = fd;
    return p == MAP_FAILED ? NULL : p;
}

/* One byte with @fd beside it (SCM_RIGHTS). */
static bool send_fd(int sock, int fd)
{
    return kvt_fd_send(sock, "F", 1, 0, fd) == 1;
}

static int recv_fd(int sock)
{
    char one;
    int fd = -1;
    return kvt_fd_recv(sock, &one, 1, 0, &fd) == 1 ? fd : -1;
}

/* "mapped": the server's region is a sealed memfd it passes to the test side, which opens a
 * mapped peer on it (no UCX between the two; the server's context is on tcp). */
#define TLS_MAPPED "mapped"

static int serve(int sock, const char *tls, uint64_t len, uint64_t seed)
{
    char err[256];
    bool mapped = strcmp(tls, TLS_MAPPED) == 0;
    kvt_xfer_opts_t o = {.tls = mapped ? "tcp" : tls[0] != '\0' ? tls : NULL};
    kvt_xfer_t *x;
    if (kvt_xfer_create(&o, &x, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "serve: %s\n", err);
        return 3;
    }
    int mfd = -1;
    uint8_t *base = mapped ? map_memfd(len, &mfd) : map_region(len);
    if (base == NULL)
        return 3;
    pat_fill(base, 0, len, seed);
    if (kvt_xfer_register(x, base, len, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "serve: %s\n", err);
        return 3;
    }
    size_t alen, rlen;
    const void *addr = kvt_xfer_worker_address(x, &alen);
    const void *rkey = kvt_xfer_rkey(x, &rlen);
    hello_t h = {alen, rlen, (uint64_t)(uintptr_t)base, len, seed ^ 0x1234};
    if (!write_all(sock, &h, sizeof(h)) || !write_all(sock, addr, alen) ||
        !write_all(sock, rkey, rlen) || (mapped && !send_fd(sock, mfd)))
        return 3;
    for (;;) {
        while (kvt_xfer_progress(x) != 0) {
        }
        int efd = kvt_xfer_efd(x);
        struct pollfd pf[2] = {{.fd = sock, .events = POLLIN}, {.fd = efd, .events = POLLIN}};
        bool armed = efd >= 0 && kvt_xfer_arm(x);
        if (efd >= 0 && !armed)
            continue;
        int k = poll(pf, armed ? 2 : 1, armed ? 1000 : 1);
        if (k > 0 && (pf[0].revents & (POLLIN | POLLHUP))) {
            if (serve_cmd(sock, base) != 0)
                break;
        }
    }
    kvt_xfer_destroy(x);
    munmap(base, len);
    return 0;
}

/* ---- the test side ---- */

typedef struct server {
    pid_t pid;
    int sock;
    kvt_xfer_peer_t *peer;
    uint64_t seed;
    void *map; /* TLS_MAPPED: the server's region, mapped here */
    uint64_t map_len;
} server_t;

/* Starts a server on @tls with a region of @len bytes filled with @seed and opens a peer to
 * it from @x: KVT_OK, or peer_open's refusal (its text in @err; the server runs). */
static kvt_status_t server_try(kvt_xfer_t *x, const char *tls, uint64_t len, uint64_t seed,
                               server_t *s, char *err, size_t errlen)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = dup(sv[1]); /* without CLOEXEC */
        char fds[16], lens[32], seeds[32];
        snprintf(fds, sizeof(fds), "%d", fd);
        snprintf(lens, sizeof(lens), "%" PRIu64, len);
        snprintf(seeds, sizeof(seeds), "%" PRIu64, seed);
        execl(g_self, g_self, "--serve", fds, tls, lens, seeds, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    s->pid = pid;
    s->sock = sv[0];
    s->seed = seed;
    hello_t h;
    assert_true(read_all(s->sock, &h, sizeof(h)));
    assert_true(h.addr_len > 0 && h.addr_len < 65536 && h.rkey_len > 0 && h.rkey_len < 65536);
    void *addr = malloc(h.addr_len), *rkey = malloc(h.rkey_len);
    assert_true(read_all(s->sock, addr, h.addr_len) && read_all(s->sock, rkey, h.rkey_len));
    kvt_xfer_peer_info_t info = {addr,   h.addr_len, rkey,          h.rkey_len,
                                 h.base, h.len,      h.incarnation, NULL};
    s->map = NULL;
    if (strcmp(tls, TLS_MAPPED) == 0) {
        int fd = recv_fd(s->sock);
        assert_true(fd >= 0);
        s->map = mmap(NULL, h.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(s->map != MAP_FAILED);
        close(fd);
        s->map_len = h.len;
        info.map = s->map;
    }
    s->peer = NULL;
    kvt_status_t st = kvt_xfer_peer_open(x, &info, &s->peer, err, errlen);
    free(addr);
    free(rkey);
    if (st == KVT_OK) {
        assert_int_equal(kvt_xfer_peer_incarnation(s->peer), seed ^ 0x1234);
        assert_true(kvt_xfer_peer_mapped(s->peer) == (s->map != NULL));
    }
    return st;
}

static void server_start(kvt_xfer_t *x, const char *tls, uint64_t len, uint64_t seed, server_t *s)
{
    char err[256] = "";
    kvt_status_t st = server_try(x, tls, len, seed, s, err, sizeof(err));
    if (st != KVT_OK)
        fprintf(stderr, "peer_open: %s\n", err);
    assert_int_equal(st, KVT_OK);
}

/* Ends the server (asks it to quit, or kills it when @sig) and closes the peer. */
static void server_stop(server_t *s, int sig)
{
    if (sig != 0) {
        kill(s->pid, sig);
    } else {
        cmd_t c = {'Q', 0, 0};
        write_all(s->sock, &c, sizeof(c));
    }
    int wst;
    assert_int_equal(waitpid(s->pid, &wst, 0), s->pid);
    if (sig == 0)
        assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    close(s->sock);
    kvt_xfer_peer_close(s->peer);
    if (s->map != NULL)
        munmap(s->map, s->map_len);
}

/* Asks the server whether ranges (remote offsets and lengths of @iov) hold @seed's pattern. */
static bool server_check(server_t *s, const kvt_xfer_iov_t *iov, uint32_t n, uint64_t seed)
{
    cmd_t c = {'V', seed, n};
    if (!write_all(s->sock, &c, sizeof(c)))
        return false;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t r[2] = {iov[i].remote_off, iov[i].len};
        if (!write_all(s->sock, r, sizeof(r)))
            return false;
    }
    uint8_t a = 0;
    return read_all(s->sock, &a, 1) && a == 1;
}

/* A batch's callback record. */
typedef struct done {
    int calls;
    kvt_status_t st;
} done_t;

static void on_done(void *arg, kvt_status_t st)
{
    done_t *d = arg;
    d->calls++;
    d->st = st;
}

/* Progresses @x until @d[0..n) have all been called back, or WAIT_S pass (then fails). */
static void wait_done(kvt_xfer_t *x, done_t *d, uint32_t n)
{
    uint64_t limit = kvt_clock_ns() + WAIT_S * 1000000000ull;
    for (;;) {
        uint32_t called = 0;
        for (uint32_t i = 0; i < n; i++)
            called += d[i].calls > 0;
        if (called == n)
            return;
        assert_true(kvt_clock_ns() < limit);
        if (kvt_xfer_progress(x) == 0)
            kvt_xfer_wait(x, 100);
    }
}

/* The blocks: NBLOCKS of 4 KiB .. 4 MiB, laid out one after another (4 KiB aligned) in the
 * remote region and in a shuffled order in the local one. */
typedef struct layout {
    kvt_xfer_iov_t iov[NBLOCKS];
    uint64_t bytes; /* each region's length */
} layout_t;

static void make_layout(layout_t *l, uint8_t *local_base, uint64_t stream)
{
    static const uint64_t small[] = {4 * KIB, 8 * KIB, 16 * KIB, 64 * KIB, 256 * KIB};
    kvt_rng_t r;
    kvt_rng_init(&r, stream);
    uint64_t len[NBLOCKS], perm[NBLOCKS];
    for (uint32_t i = 0; i < NBLOCKS; i++) {
        len[i] = i < 2 ? 4 * MIB : i < 6 ? MIB : small[kvt_rng_below(&r, 5)];
        perm[i] = i;
    }
    for (uint32_t i = NBLOCKS - 1; i > 0; i--) {
        uint64_t j = kvt_rng_below(&r, i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    uint64_t off = 0;
    for (uint32_t i = 0; i < NBLOCKS; i++) {
        l->iov[i].remote_off = off;
        l->iov[i].len = len[i];
        off += len[i];
    }
    l->bytes = off;
    if (local_base == NULL)
        return;
    uint64_t loff = 0;
    for (uint32_t k = 0; k < NBLOCKS; k++) {
        uint64_t i = perm[k];
        l->iov[i].local = local_base + loff;
        loff += len[i];
    }
}

/* Creates a context on @tls; NULL and a skip note when UCX cannot here. */
static kvt_xfer_t *create_or_skip(const char *tls, uint32_t max_inflight)
{
    char err[256];
    kvt_xfer_opts_t o = {.tls = tls != NULL && tls[0] != '\0' ? tls : NULL,
                         .max_inflight = max_inflight};
    kvt_xfer_t *x = NULL;
    kvt_status_t st = kvt_xfer_create(&o, &x, err, sizeof(err));
    if (st == KVT_ERR_UNSUPPORTED) {
        fprintf(stderr, "tls %s: %s\n", tls ? tls : "(default)", err);
        skipped = "ucx cannot create a context on these transports here";
        return NULL;
    }
    if (st != KVT_OK)
        fprintf(stderr, "create: %s\n", err);
    assert_int_equal(st, KVT_OK);
    return x;
}

/* Pull and push of NBLOCKS blocks in batches of @per, byte-exact, on @tls. With @may_refuse,
 * a peer_open refused for want of peer failure handling ends the case early: false. */
static bool pull_push(const char *tls, uint32_t max_inflight, uint32_t per, bool may_refuse)
{
    kvt_xfer_t *x = create_or_skip(strcmp(tls, TLS_MAPPED) == 0 ? "tcp" : tls, max_inflight);
    if (x == NULL)
        return true;
    layout_t *l = calloc(1, sizeof(*l));
    make_layout(l, NULL, 1);
    uint8_t *local = map_region(l->bytes);
    assert_non_null(local);
    make_layout(l, local, 1);
    char err[256];
    assert_int_equal(kvt_xfer_register(x, local, l->bytes, err, sizeof(err)), KVT_OK);
    server_t s;
    if (may_refuse) {
        kvt_status_t st = server_try(x, tls, l->bytes, 77, &s, err, sizeof(err));
        if (st != KVT_OK) {
            fprintf(stderr, "tls %s: peer refused: %s\n", tls, err);
            assert_int_equal(st, KVT_ERR_PEER);
            assert_non_null(strstr(err, "peer failures"));
            server_stop(&s, 0);
            kvt_xfer_destroy(x);
            munmap(local, l->bytes);
            free(l);
            return false;
        }
    } else {
        server_start(x, tls, l->bytes, 77, &s);
    }

    /* pull everything, several batches in flight at once */
    uint32_t nb = (NBLOCKS + per - 1) / per;
    done_t d[NBLOCKS] = {{0}};
    kvt_status_t *status = malloc(NBLOCKS * sizeof(*status));
    for (uint32_t i = 0; i < NBLOCKS; i++)
        status[i] = (kvt_status_t)1;
    for (uint32_t b = 0; b < nb; b++) {
        uint32_t first = b * per, n = NBLOCKS - first < per ? NBLOCKS - first : per;
        assert_int_equal(kvt_xfer_submit(s.peer, KVT_XFER_GET, &l->iov[first], n, &status[first], 0,
                                         on_done, &d[b], err, sizeof(err)),
                         KVT_OK);
    }
    wait_done(x, d, nb);
    for (uint32_t b = 0; b < nb; b++) {
        assert_int_equal(d[b].calls, 1);
        assert_int_equal(d[b].st, KVT_OK);
    }
    for (uint32_t i = 0; i < NBLOCKS; i++) {
        assert_int_equal(status[i], KVT_OK);
        assert_true(pat_check(l->iov[i].local, l->iov[i].remote_off, l->iov[i].len, 77));
    }

    /* push new bytes back, then the server checks them */
    for (uint32_t i = 0; i < NBLOCKS; i++) {
        pat_fill(l->iov[i].local, l->iov[i].remote_off, l->iov[i].len, 99);
        status[i] = (kvt_status_t)1;
    }
    memset(d, 0, sizeof(d));
    for (uint32_t b = 0; b < nb; b++) {
        uint32_t first = b * per, n = NBLOCKS - first < per ? NBLOCKS - first : per;
        assert_int_equal(kvt_xfer_submit(s.peer, KVT_XFER_PUT, &l->iov[first], n, &status[first], 0,
                                         on_done, &d[b], err, sizeof(err)),
                         KVT_OK);
    }
    wait_done(x, d, nb);
    for (uint32_t b = 0; b < nb; b++)
        assert_int_equal(d[b].st, KVT_OK);
    for (uint32_t i = 0; i < NBLOCKS; i++)
        assert_int_equal(status[i], KVT_OK);
    assert_true(server_check(&s, l->iov, NBLOCKS, 99));
    assert_int_equal(kvt_xfer_batches_inflight(x), 0);
    assert_false(kvt_xfer_peer_failed(s.peer, NULL));

    server_stop(&s, 0);
    kvt_xfer_destroy(x);
    munmap(local, l->bytes);
    free(status);
    free(l);
    return true;
}

static void test_pull_push_tcp(void **state)
{
    (void)state;
    pull_push("tcp", 0, 64, false);
}

/* Shared memory alone, chosen through UCX_TLS (both processes read it): UCX 1.13's
 * shared-memory transports have no peer failure handling, so peer_open refuses them with a
 * reason (a later UCX may accept them: then the pull and push run). With tcp beside them in
 * opts.tls, UCX picks what handles failures, and the transfer works. */
static void test_pull_push_shm(void **state)
{
    (void)state;
    assert_int_equal(setenv("UCX_TLS", TLS_SHM, 1), 0);
    bool ran = pull_push("", 0, 64, true);
    unsetenv("UCX_TLS");
    if (!ran)
        fprintf(stderr, "UCX_TLS=%s: refused as documented\n", TLS_SHM);
    pull_push("tcp," TLS_SHM, 0, 64, false);
}

/* A mapped peer (kvtierd's same-host path): the server's sealed memfd mapped here; batches
 * are copies, called back from progress like UCX's. */
static void test_pull_push_mapped(void **state)
{
    (void)state;
    pull_push(TLS_MAPPED, 0, 64, false);
}

/* A mapped peer's process killed: the mapping stays valid, so a pull after the kill still
 * lands its bytes (the caller learns of the death from its RPC, not from the copy), and
 * nothing faults. */
static void test_mapped_peer_killed(void **state)
{
    (void)state;
    kvt_xfer_t *x = create_or_skip("tcp", 0);
    if (x == NULL)
        return;
    uint64_t len = 4 * MIB;
    uint8_t *local = map_region(len);
    assert_non_null(local);
    char err[256];
    assert_int_equal(kvt_xfer_register(x, local, len, err, sizeof(err)), KVT_OK);
    server_t s;
    server_start(x, TLS_MAPPED, len, 5, &s);
    kill(s.pid, SIGKILL);
    int wst;
    assert_int_equal(waitpid(s.pid, &wst, 0), s.pid);
    kvt_xfer_iov_t iov = {.remote_off = 4096, .local = local, .len = MIB};
    kvt_status_t est = (kvt_status_t)1;
    done_t d = {0};
    assert_int_equal(
        kvt_xfer_submit(s.peer, KVT_XFER_GET, &iov, 1, &est, 0, on_done, &d, err, sizeof(err)),
        KVT_OK);
    assert_int_equal(d.calls, 0); /* never from submit */
    wait_done(x, &d, 1);
    assert_int_equal(d.st, KVT_OK);
    assert_int_equal(est, KVT_OK);
    assert_true(pat_check(local, 4096, MIB, 5));
    /* a range past the region is refused as for any peer */
    iov.remote_off = len - 4096;
    iov.len = 8192;
    assert_int_equal(
        kvt_xfer_submit(s.peer, KVT_XFER_GET, &iov, 1, &est, 0, on_done, &d, err, sizeof(err)),
        KVT_ERR_RANGE);
    close(s.sock);
    kvt_xfer_peer_close(s.peer);
    munmap(s.map, s.map_len);
    kvt_xfer_destroy(x);
    munmap(local, len);
}

/* Few request contexts: most entries wait for room, in order, across batches. */
static void test_pull_push_narrow(void **state)
{
    (void)state;
    pull_push("tcp", 4, 37, false);
}

/* The server killed mid-batch: the batch fails (peer error, not the deadline), every entry
 * says whether it landed, the landed ones are exact; a new server can be opened after. */
static void test_peer_killed(void **state)
{
    (void)state;
    kvt_xfer_t *x = create_or_skip("tcp", 8);
    if (x == NULL)
        return;
    layout_t *l = calloc(1, sizeof(*l));
    make_layout(l, NULL, 2);
    uint8_t *local = map_region(l->bytes);
    make_layout(l, local, 2);
    char err[256];
    assert_int_equal(kvt_xfer_register(x, local, l->bytes, err, sizeof(err)), KVT_OK);
    server_t s;
    server_start(x, "tcp", l->bytes, 5, &s);

    kvt_status_t status[NBLOCKS];
    for (uint32_t i = 0; i < NBLOCKS; i++)
        status[i] = (kvt_status_t)1;
    done_t d = {0};
    assert_int_equal(kvt_xfer_submit(s.peer, KVT_XFER_GET, l->iov, NBLOCKS, status, 20000, on_done,
                                     &d, err, sizeof(err)),
                     KVT_OK);
    /* until the first entries land (8 in flight: the batch is far from done) */
    uint64_t limit = kvt_clock_ns() + WAIT_S * 1000000000ull;
    bool some = false;
    while (!some) {
        assert_true(kvt_clock_ns() < limit);
        kvt_xfer_progress(x);
        for (uint32_t i = 0; i < NBLOCKS && !some; i++)
            some = status[i] == KVT_OK;
    }
    assert_int_equal(d.calls, 0);
    kill(s.pid, SIGKILL);
    wait_done(x, &d, 1);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.st, KVT_ERR_PEER);
    uint32_t ok = 0, failed = 0;
    for (uint32_t i = 0; i < NBLOCKS; i++) {
        if (status[i] == KVT_OK) {
            ok++;
            assert_true(pat_check(l->iov[i].local, l->iov[i].remote_off, l->iov[i].len, 5));
        } else {
            assert_int_equal(status[i], KVT_ERR_PEER);
            failed++;
        }
    }
    assert_true(ok > 0 && failed > 0);
    const char *why = NULL;
    assert_true(kvt_xfer_peer_failed(s.peer, &why));
    assert_non_null(why);
    /* a failed peer refuses new batches */
    assert_int_equal(
        kvt_xfer_submit(s.peer, KVT_XFER_GET, l->iov, 1, NULL, 0, on_done, &d, err, sizeof(err)),
        KVT_ERR_PEER);
    server_stop(&s, SIGKILL);
    for (int i = 0; i < 100; i++) /* nothing fires twice */
        kvt_xfer_progress(x);
    assert_int_equal(d.calls, 1);

    /* a new server on the same context */
    server_start(x, "tcp", l->bytes, 6, &s);
    done_t d2 = {0};
    assert_int_equal(kvt_xfer_submit(s.peer, KVT_XFER_GET, l->iov, 20, status, 0, on_done, &d2, err,
                                     sizeof(err)),
                     KVT_OK);
    wait_done(x, &d2, 1);
    assert_int_equal(d2.st, KVT_OK);
    for (uint32_t i = 0; i < 20; i++)
        assert_true(pat_check(l->iov[i].local, l->iov[i].remote_off, l->iov[i].len, 6));
    server_stop(&s, 0);
    kvt_xfer_destroy(x);
    munmap(local, l->bytes);
    free(l);
}

/* The server stopped (SIGSTOP): a batch past its deadline fails once with KVT_ERR_TIMEOUT, the
 * peer is given up, and its other batch fails as closed. */
static void test_timeout(void **state)
{
    (void)state;
    kvt_xfer_t *x = create_or_skip("tcp", 0);
    if (x == NULL)
        return;
    layout_t *l = calloc(1, sizeof(*l));
    make_layout(l, NULL, 3);
    uint8_t *local = map_region(l->bytes);
    make_layout(l, local, 3);
    char err[256];
    assert_int_equal(kvt_xfer_register(x, local, l->bytes, err, sizeof(err)), KVT_OK);
    server_t s;
    server_start(x, "tcp", l->bytes, 7, &s);
    assert_int_equal(kill(s.pid, SIGSTOP), 0);

    kvt_status_t st1[NBLOCKS], st2[10];
    done_t d[2] = {{0}};
    assert_int_equal(kvt_xfer_submit(s.peer, KVT_XFER_GET, l->iov, NBLOCKS, st1, 300, on_done,
                                     &d[0], err, sizeof(err)),
                     KVT_OK);
    assert_int_equal(kvt_xfer_submit(s.peer, KVT_XFER_PUT, l->iov, 10, st2, 600000, on_done, &d[1],
                                     err, sizeof(err)),
                     KVT_OK);
    int ms = kvt_xfer_next_deadline_ms(x);
    assert_true(ms >= 0 && ms <= 300);
    wait_done(x, d, 2);
    assert_int_equal(d[0].calls, 1);
    assert_int_equal(d[0].st, KVT_ERR_TIMEOUT);
    assert_int_equal(d[1].st, KVT_ERR_CLOSED);
    for (uint32_t i = 0; i < NBLOCKS; i++)
        assert_int_equal(st1[i], KVT_ERR_TIMEOUT);
    for (uint32_t i = 0; i < 10; i++)
        assert_int_equal(st2[i], KVT_ERR_CLOSED);
    assert_true(kvt_xfer_peer_failed(s.peer, NULL));
    assert_int_equal(kvt_xfer_next_deadline_ms(x), -1);
    for (int i = 0; i < 100; i++)
        kvt_xfer_progress(x);
    assert_int_equal(d[0].calls, 1);
    assert_int_equal(d[1].calls, 1);
    assert_int_equal(kvt_xfer_batches_inflight(x), 0);
    server_stop(&s, SIGKILL);
    kvt_xfer_destroy(x);
    munmap(local, l->bytes);
    free(l);
}

/* A batch whose entries all wait for room (max_inflight 1, the one request stuck at a stopped
 * server) times out alone: the peer stays open, and the stuck batch completes once the server
 * runs again. */
static void test_timeout_waiting(void **state)
{
    (void)state;
    kvt_xfer_t *x = create_or_skip("tcp", 1);
    if (x == NULL)
        return;
    layout_t *l = calloc(1, sizeof(*l));
    make_layout(l, NULL, 4);
    uint8_t *local = map_region(l->bytes);
    make_layout(l, local, 4);
    char err[256];
    assert_int_equal(kvt_xfer_register(x, local, l->bytes, err, sizeof(err)), KVT_OK);
    server_t s;
    server_start(x, "tcp", l->bytes, 8, &s);
    assert_int_equal(kill(s.pid, SIGSTOP), 0);

    kvt_status_t st1[4], st2[4];
    done_t d[2] = {{0}};
    assert_int_equal(kvt_xfer_submit(s.peer, KVT_XFER_GET, l->iov, 4, st1, 600000, on_done, &d[0],
                                     err, sizeof(err)),
                     KVT_OK);
    assert_int_equal(kvt_xfer_submit(s.peer, KVT_XFER_PUT, &l->iov[4], 4, st2, 100, on_done, &d[1],
                                     err, sizeof(err)),
                     KVT_OK);
    wait_done(x, &d[1], 1);
    assert_int_equal(d[1].st, KVT_ERR_TIMEOUT);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(st2[i], KVT_ERR_TIMEOUT);
    assert_int_equal(d[0].calls, 0);
    assert_false(kvt_xfer_peer_failed(s.peer, NULL));

    assert_int_equal(kill(s.pid, SIGCONT), 0);
    wait_done(x, &d[0], 1);
    assert_int_equal(d[0].st, KVT_OK);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(st1[i], KVT_OK);
        assert_true(pat_check(l->iov[i].local, l->iov[i].remote_off, l->iov[i].len, 8));
    }
    assert_int_equal(d[1].calls, 1);
    server_stop(&s, 0);
    kvt_xfer_destroy(x);
    munmap(local, l->bytes);
    free(l);
}

/* Refusals, each with a reason and without a callback, on two contexts of this process. */
static void test_bad_args(void **state)
{
    (void)state;
    kvt_xfer_t *a = create_or_skip("tcp", 0), *b;
    if (a == NULL)
        return;
    char err[256];
    kvt_xfer_opts_t o = {.tls = "tcp", .max_batches = 2, .max_peers = 1};
    assert_int_equal(kvt_xfer_create(&o, &b, err, sizeof(err)), KVT_OK);
    o.max_inflight = 1u << 30;
    kvt_xfer_t *bad;
    assert_int_equal(kvt_xfer_create(&o, &bad, err, sizeof(err)), KVT_ERR_INVAL);
    o = (kvt_xfer_opts_t){.tls = ""};
    assert_int_equal(kvt_xfer_create(&o, &bad, err, sizeof(err)), KVT_ERR_INVAL);

    const uint64_t len = 256 * KIB;
    uint8_t *ra = map_region(len), *rb = map_region(len);
    size_t rl;
    assert_null(kvt_xfer_rkey(a, &rl));
    assert_int_equal(rl, 0);
    assert_int_equal(kvt_xfer_register(a, NULL, len, err, sizeof(err)), KVT_ERR_INVAL);
    assert_int_equal(kvt_xfer_register(a, ra, len, err, sizeof(err)), KVT_OK);
    assert_int_equal(kvt_xfer_register(a, ra, len, err, sizeof(err)), KVT_ERR_EXISTS);
    assert_non_null(strstr(err, "already registered"));

    size_t al;
    const void *addr = kvt_xfer_worker_address(a, &al);
    const void *rkey = kvt_xfer_rkey(a, &rl);
    kvt_xfer_peer_info_t info = {addr, al, rkey, rl, (uint64_t)(uintptr_t)ra, len, 42, NULL};
    kvt_xfer_peer_t *p, *q;
    kvt_xfer_peer_info_t empty = info;
    empty.rkey_len = 0;
    assert_int_equal(kvt_xfer_peer_open(b, &empty, &p, err, sizeof(err)), KVT_ERR_INVAL);
    empty = info;
    empty.remote_len = 0;
    assert_int_equal(kvt_xfer_peer_open(b, &empty, &p, err, sizeof(err)), KVT_ERR_INVAL);
    assert_int_equal(kvt_xfer_peer_open(b, &info, &p, err, sizeof(err)), KVT_OK);
    assert_int_equal(kvt_xfer_peer_open(b, &info, &q, err, sizeof(err)), KVT_ERR_LIMIT);

    done_t d[3] = {{0}};
    kvt_xfer_iov_t iov[2] = {{0, rb, 4096}, {4096, rb + 4096, 4096}};
    /* b has no region yet */
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_GET, iov, 2, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_ERR_INVAL);
    assert_non_null(strstr(err, "no region"));
    assert_int_equal(kvt_xfer_register(b, rb, len, err, sizeof(err)), KVT_OK);

    iov[1].remote_off = len - 4095; /* one byte past the peer's region */
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_GET, iov, 2, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_ERR_RANGE);
    assert_non_null(strstr(err, "iov[1]"));
    assert_non_null(strstr(err, "outside the peer's region"));
    iov[1].remote_off = UINT64_MAX - 10; /* wraps */
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_PUT, iov, 2, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_ERR_RANGE);
    iov[1].remote_off = 4096;
    iov[1].local = rb + len - 4095; /* one byte past the registered region */
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_GET, iov, 2, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_ERR_RANGE);
    assert_non_null(strstr(err, "outside the registered region"));
    iov[1].local = ra; /* another context's region */
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_GET, iov, 2, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_ERR_RANGE);
    iov[1].local = rb + 4096;
    iov[1].len = 0;
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_GET, iov, 2, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_ERR_INVAL);
    assert_non_null(strstr(err, "length 0"));
    iov[1].len = 4096;
    assert_int_equal(
        kvt_xfer_submit(p, (kvt_xfer_op_t)7, iov, 2, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_ERR_INVAL);
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_GET, iov, 0, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_ERR_INVAL);

    /* max_batches 2: the third waits for a callback; a and b progress each other (one thread) */
    pat_fill(ra, 0, len, 3);
    pat_fill(rb + 4096, 4096, 4096, 4);
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_GET, iov, 1, NULL, 0, on_done, &d[0], err, sizeof(err)),
        KVT_OK);
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_PUT, &iov[1], 1, NULL, 0, on_done, &d[1], err, sizeof(err)),
        KVT_OK);
    assert_int_equal(
        kvt_xfer_submit(p, KVT_XFER_GET, iov, 1, NULL, 0, on_done, &d[2], err, sizeof(err)),
        KVT_ERR_LIMIT);
    assert_int_equal(d[0].calls + d[1].calls + d[2].calls, 0); /* never from submit */
    uint64_t limit = kvt_clock_ns() + WAIT_S * 1000000000ull;
    while (d[0].calls == 0 || d[1].calls == 0) {
        assert_true(kvt_clock_ns() < limit);
        kvt_xfer_progress(a);
        kvt_xfer_progress(b);
    }
    assert_int_equal(d[0].st, KVT_OK);
    assert_int_equal(d[1].st, KVT_OK);
    assert_int_equal(d[2].calls, 0);
    assert_true(pat_check(rb, 0, 4096, 3));
    assert_true(pat_check(ra + 4096, 4096, 4096, 4)); /* pushed into a's region */

    kvt_xfer_peer_close(p);
    kvt_xfer_destroy(b);
    kvt_xfer_destroy(a);
    munmap(ra, len);
    munmap(rb, len);
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--serve") == 0)
        return serve(atoi(argv[2]), argv[3], strtoull(argv[4], NULL, 10),
                     strtoull(argv[5], NULL, 10));
    g_self = "/proc/self/exe";
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_args),           cmocka_unit_test(test_pull_push_tcp),
        cmocka_unit_test(test_pull_push_shm),      cmocka_unit_test(test_pull_push_narrow),
        cmocka_unit_test(test_peer_killed),        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_timeout_waiting),    cmocka_unit_test(test_pull_push_mapped),
        cmocka_unit_test(test_mapped_peer_killed),
    };
    if (cmocka_run_group_tests(tests, NULL, NULL) != 0)
        return 1;
    if (skipped != NULL) {
        fprintf(stderr, "test_transfer: SKIP %s\n", skipped);
        return 77;
    }
    return 0;
}
