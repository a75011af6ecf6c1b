/*
 * tiers/disk: the NVMe store's I/O on a real O_DIRECT file (and, as root, a
 * loop device) through io_uring, in a temp dir: every slot written in batches
 * up to the depth and read back byte-exact into registered and unregistered
 * buffers (and I/O in the registered range shown to go through it), the store
 * kept across a reopen (id, slots, bytes), the lock against a second opener,
 * files that are not stores (or made with another slot size) refused and left
 * as they were, stores too small for a slot or for the file system never
 * created, bad I/O refused, short transfers at the end of a shortened file,
 * SQPOLL, and random reads and writes against a model of the device.
 *
 * Exits 77 (skip) where the kernel refuses io_uring or the temp dir's file
 * system refuses O_DIRECT.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/loop.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "tests/support/rng.h"
#include "tiers/tiers_test.h"

#define SLOT (64u * 1024)
#define NSLOTS 64u
#define DEPTH 8u
#define STORE_BYTES (KVT_DISK_HEADER + (uint64_t)NSLOTS * SLOT)

static char g_dir[128]; /* the test's scratch directory */

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static kvt_disk_cfg_t cfg_of(const char *path, uint64_t bytes, uint32_t slot, uint32_t depth)
{
    return (kvt_disk_cfg_t){.path = path, .bytes = bytes, .slot_bytes = slot, .io_depth = depth};
}

static kvt_disk_t *must_open(const kvt_disk_cfg_t *cfg)
{
    kvt_disk_t *d = NULL;
    char err[512] = "";
    kvt_status_t st = kvt_disk_open(cfg, &d, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("open %s: %s (%d)", cfg->path, err, st);
    return d;
}

/* Opens expecting @want; returns the error text in @err. */
static void open_fails(const kvt_disk_cfg_t *cfg, kvt_status_t want, char *err, size_t cap)
{
    kvt_disk_t *d = NULL;
    err[0] = '\0';
    assert_int_equal(kvt_disk_open(cfg, &d, err, cap), want);
    assert_null(d);
    assert_true(err[0] != '\0');
}

static void *must_align(size_t bytes)
{
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 4096, bytes), 0);
    return p;
}

static void fill(kvt_rng_t *rng, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = kvt_rng_next(rng);
        memcpy(p + i, &v, 8);
    }
}

/* Completions: counted, each checked to have moved all its bytes. */
typedef struct done_log {
    size_t n;
    size_t failed;
} done_log_t;

static void on_done(void *arg, kvt_disk_io_t *io)
{
    done_log_t *log = arg;
    log->n++;
    if (io->res != (int)io->len)
        log->failed++;
}

/*
 * Runs @n I/Os: queued until the depth refuses one (which it must do exactly
 * when DEPTH are in flight), submitted in batches, reaped. Every one must
 * complete in full.
 */
static void run_all(kvt_disk_t *d, kvt_disk_io_t *ios, size_t n, uint32_t depth)
{
    done_log_t log = {0};
    size_t next = 0;
    bool saw_limit = false;
    while (log.n < n) {
        while (next < n) {
            uint64_t before = kvt_clock_ns();
            kvt_status_t st = kvt_disk_queue(d, &ios[next]);
            if (st == KVT_ERR_LIMIT) {
                assert_int_equal(kvt_disk_inflight(d), depth);
                saw_limit = true;
                break;
            }
            assert_int_equal(st, KVT_OK);
            assert_true(ios[next].submit_ns >= before && ios[next].submit_ns <= kvt_clock_ns());
            next++;
        }
        kvt_disk_submit(d);
        size_t got = kvt_disk_reap(d, -1, on_done, &log);
        assert_true(got > 0);
    }
    assert_int_equal(log.n, n);
    assert_int_equal(log.failed, 0);
    assert_int_equal(kvt_disk_inflight(d), 0);
    assert_true(saw_limit || n <= depth);
}

static kvt_disk_io_t io_of(uint32_t slot, void *buf, uint32_t len, bool write)
{
    return (kvt_disk_io_t){.slot = slot, .buf = buf, .len = len, .write = write};
}

/* Reads every slot into @buf (NSLOTS slots) and compares with @model. */
static void read_check_all(kvt_disk_t *d, uint8_t *buf, const uint8_t *model)
{
    kvt_disk_io_t ios[NSLOTS];
    memset(buf, 0, (size_t)NSLOTS * SLOT);
    for (uint32_t i = 0; i < NSLOTS; i++) /* into another slot of the buffer than its own */
        ios[i] = io_of(i, buf + (size_t)((i + 7) % NSLOTS) * SLOT, SLOT, false);
    run_all(d, ios, NSLOTS, DEPTH);
    for (uint32_t i = 0; i < NSLOTS; i++)
        assert_memory_equal(buf + (size_t)((i + 7) % NSLOTS) * SLOT, model + (size_t)i * SLOT,
                            SLOT);
}

static void test_write_read_reopen(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 1);
    char path[256];
    path_of(path, sizeof(path), "store");
    kvt_disk_cfg_t cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
    kvt_disk_t *d = must_open(&cfg);
    assert_true(kvt_disk_created(d));
    assert_int_equal(kvt_disk_nslots(d), NSLOTS);
    uint64_t id = kvt_disk_store_id(d);
    assert_true(id != 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, STORE_BYTES);
    assert_int_equal(st.st_mode & 0777, 0600);

    /* a second opener while this one holds the store */
    char err[512];
    open_fails(&cfg, KVT_ERR_EXISTS, err, sizeof(err));
    assert_non_null(strstr(err, "in use by another process"));

    const size_t bytes = (size_t)NSLOTS * SLOT;
    uint8_t *arena = must_align(bytes);
    uint8_t *model = malloc(bytes);
    assert_non_null(model);
    assert_int_equal(kvt_disk_register(d, arena, bytes, err, sizeof(err)), KVT_OK);
    /* once only */
    assert_int_equal(kvt_disk_register(d, arena, bytes, err, sizeof(err)), KVT_ERR_INVAL);

    fill(&rng, arena, bytes);
    memcpy(model, arena, bytes);
    kvt_disk_io_t ios[NSLOTS];
    for (uint32_t i = 0; i < NSLOTS; i++)
        ios[i] = io_of(i, arena + (size_t)i * SLOT, SLOT, true);
    run_all(d, ios, NSLOTS, DEPTH);

    /* the eventfd says completions came */
    struct pollfd pfd = {.fd = kvt_disk_event_fd(d), .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 0), 1);
    uint64_t count;
    assert_int_equal(read(pfd.fd, &count, sizeof(count)), (ssize_t)sizeof(count));
    assert_true(count > 0);
    assert_int_equal(poll(&pfd, 1, 0), 0);

    read_check_all(d, arena, model);

    /* memory outside the registered range: plain read and write opcodes */
    uint8_t *plain = must_align(4 * SLOT);
    for (uint32_t i = 0; i < 4; i++)
        ios[i] = io_of(NSLOTS - 1 - i, plain + (size_t)i * SLOT, SLOT, false);
    run_all(d, ios, 4, DEPTH);
    for (uint32_t i = 0; i < 4; i++)
        assert_memory_equal(plain + (size_t)i * SLOT, model + (size_t)(NSLOTS - 1 - i) * SLOT,
                            SLOT);
    fill(&rng, plain, 4 * SLOT);
    for (uint32_t i = 0; i < 4; i++) { /* part of a slot: its head only changes */
        uint32_t len = (i + 1) * 4096;
        ios[i] = io_of(i * 3, plain + (size_t)i * SLOT, len, true);
        memcpy(model + (size_t)i * 3 * SLOT, plain + (size_t)i * SLOT, len);
    }
    run_all(d, ios, 4, DEPTH);
    read_check_all(d, arena, model);
    kvt_disk_close(d);
    free(arena);

    /* reopened, larger size asked: the store as it was */
    cfg.bytes = STORE_BYTES * 2;
    d = must_open(&cfg);
    assert_false(kvt_disk_created(d));
    assert_int_equal(kvt_disk_nslots(d), NSLOTS);
    assert_int_equal(kvt_disk_store_id(d), id);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, STORE_BYTES);
    uint8_t *other = must_align(bytes); /* nothing registered this time */
    read_check_all(d, other, model);
    kvt_disk_close(d);
    free(other);

    /* and with no size at all */
    cfg.bytes = 0;
    d = must_open(&cfg);
    assert_int_equal(kvt_disk_store_id(d), id);
    kvt_disk_close(d);

    /* made again: a new store, with a new id */
    unlink(path);
    cfg.bytes = STORE_BYTES;
    d = must_open(&cfg);
    assert_true(kvt_disk_created(d));
    assert_true(kvt_disk_store_id(d) != id && kvt_disk_store_id(d) != 0);
    kvt_disk_close(d);

    free(plain);
    free(model);
    unlink(path);
}

/*
 * I/O inside the registered range goes through the registration. Registering
 * pins the range's pages; MADV_DONTNEED then gives the process fresh zero
 * pages while the kernel keeps the pinned ones. So a fixed-buffer write sends
 * what the range held before, and a fixed-buffer read lands where the process
 * no longer looks; plain opcodes would use the new pages.
 */
static void test_fixed_buffers(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 6);
    char path[256], err[512];
    path_of(path, sizeof(path), "fixed");
    kvt_disk_cfg_t cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
    kvt_disk_t *d = must_open(&cfg);
    const size_t n = 4 * (size_t)SLOT;
    uint8_t *reg = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(reg != MAP_FAILED);
    uint8_t *pinned = must_align(n), *plain = must_align(n), *seen = must_align(n);
    fill(&rng, reg, n);
    memcpy(pinned, reg, n);
    assert_int_equal(kvt_disk_register(d, reg, n, err, sizeof(err)), KVT_OK);
    assert_int_equal(madvise(reg, n, MADV_DONTNEED), 0);
    fill(&rng, reg, n); /* the process's new pages, not the pinned ones */
    memcpy(seen, reg, n);

    kvt_disk_io_t ios[4];
    for (uint32_t i = 0; i < 4; i++) /* fixed writes: the pinned bytes reach the disk */
        ios[i] = io_of(10 + i, reg + (size_t)i * SLOT, SLOT, true);
    run_all(d, ios, 4, DEPTH);
    for (uint32_t i = 0; i < 4; i++)
        ios[i] = io_of(10 + i, plain + (size_t)i * SLOT, SLOT, false);
    run_all(d, ios, 4, DEPTH);
    assert_memory_equal(plain, pinned, n);

    /* fixed reads, of part of a slot at an offset inside the range: into the pinned pages */
    for (uint32_t i = 0; i < 4; i++)
        ios[i] = io_of(20 + i, reg + (size_t)i * SLOT + 4096, SLOT - 4096, false);
    run_all(d, ios, 4, DEPTH);
    assert_memory_equal(reg, seen, n);

    kvt_disk_close(d);
    assert_int_equal(munmap(reg, n), 0);
    free(seen);
    free(pinned);
    free(plain);
    unlink(path);
}

static void write_file(const char *path, const uint8_t *p, size_t n)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, p, n), (ssize_t)n);
    close(fd);
}

/* The file's bytes (at most @cap), or -1 when it is missing. */
static ssize_t read_file(const char *path, uint8_t *p, size_t cap)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, p, cap);
    close(fd);
    return n;
}

static void test_refusals(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 2);
    char path[256], err[512];
    const size_t n = 1 << 20;
    uint8_t *before = malloc(n), *after = malloc(n);
    assert_non_null(before);
    assert_non_null(after);

    /* not a store: random bytes, a large file and one shorter than a header */
    path_of(path, sizeof(path), "random");
    size_t sizes[] = {n, 100};
    for (size_t k = 0; k < 2; k++) {
        fill(&rng, before, n);
        write_file(path, before, sizes[k]);
        kvt_disk_cfg_t cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
        open_fails(&cfg, KVT_ERR_EXISTS, err, sizeof(err));
        assert_non_null(strstr(err, "not a kvtier store"));
        assert_int_equal(read_file(path, after, n), (ssize_t)sizes[k]);
        assert_memory_equal(before, after, sizes[k]);
    }
    unlink(path);

    /* a store made with another slot size: refused, both sizes named */
    path_of(path, sizeof(path), "store64k");
    kvt_disk_cfg_t cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
    kvt_disk_close(must_open(&cfg));
    ssize_t len = read_file(path, before, n);
    cfg.slot_bytes = 2 * SLOT;
    open_fails(&cfg, KVT_ERR_EXISTS, err, sizeof(err));
    assert_non_null(strstr(err, "65536"));
    assert_non_null(strstr(err, "131072"));
    assert_non_null(strstr(err, "--block-bytes"));
    assert_int_equal(read_file(path, after, n), len);
    assert_memory_equal(before, after, (size_t)len);

    /* a damaged header (one byte of the slot count): not a store any more */
    cfg.slot_bytes = SLOT;
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b = 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, 17), 1);
    close(fd);
    open_fails(&cfg, KVT_ERR_EXISTS, err, sizeof(err));
    assert_non_null(strstr(err, "not a kvtier store"));
    unlink(path);

    /* a store cut short: its header counts slots the file no longer holds */
    kvt_disk_close(must_open(&cfg));
    assert_int_equal(truncate(path, STORE_BYTES - SLOT), 0);
    open_fails(&cfg, KVT_ERR_EXISTS, err, sizeof(err));
    assert_non_null(strstr(err, "damaged"));
    unlink(path);

    /* too small for one slot, or no size for a missing file: nothing created */
    path_of(path, sizeof(path), "small");
    cfg = cfg_of(path, KVT_DISK_HEADER + SLOT - 1, SLOT, DEPTH);
    open_fails(&cfg, KVT_ERR_NO_SPACE, err, sizeof(err));
    assert_non_null(strstr(err, "too small for one slot"));
    assert_int_equal(read_file(path, after, n), -1);
    cfg.bytes = 0;
    open_fails(&cfg, KVT_ERR_INVAL, err, sizeof(err));
    assert_int_equal(read_file(path, after, n), -1);
    /* exactly one slot is enough */
    cfg.bytes = KVT_DISK_HEADER + SLOT;
    kvt_disk_t *d = must_open(&cfg);
    assert_int_equal(kvt_disk_nslots(d), 1);
    kvt_disk_close(d);
    unlink(path);

    /* fallocate refused for size (a file-size limit below the store: EFBIG, as a file
     * system's own maximum gives): no space, nothing left */
    path_of(path, sizeof(path), "huge");
    struct rlimit old_fsize, fsize;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old_fsize), 0);
    fsize = old_fsize;
    fsize.rlim_cur = 1 << 20;
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &fsize), 0);
    cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
    kvt_disk_t *huge = NULL;
    kvt_status_t huge_st = kvt_disk_open(&cfg, &huge, err, sizeof(err));
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old_fsize), 0);
    signal(SIGXFSZ, old_sig);
    assert_int_equal(huge_st, KVT_ERR_NO_SPACE);
    assert_null(huge);
    assert_non_null(strstr(err, "preallocating"));
    assert_int_equal(read_file(path, after, n), -1);

    /* a missing directory on the way: an I/O error, nothing left */
    path_of(path, sizeof(path), "nodir/store");
    cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
    open_fails(&cfg, KVT_ERR_IO, err, sizeof(err));

    /* a directory, a fifo, a symbolic link to a store */
    cfg.path = g_dir;
    open_fails(&cfg, KVT_ERR_INVAL, err, sizeof(err));
    assert_non_null(strstr(err, "directory"));
    path_of(path, sizeof(path), "fifo");
    assert_int_equal(mkfifo(path, 0600), 0);
    cfg.path = path;
    open_fails(&cfg, KVT_ERR_INVAL, err, sizeof(err));
    unlink(path);
    char target[256];
    path_of(target, sizeof(target), "target");
    cfg.path = target;
    kvt_disk_close(must_open(&cfg));
    path_of(path, sizeof(path), "link");
    assert_int_equal(symlink(target, path), 0);
    cfg.path = path;
    open_fails(&cfg, KVT_ERR_INVAL, err, sizeof(err));
    assert_non_null(strstr(err, "symbolic link"));
    unlink(path);
    unlink(target);

    /* a configuration that cannot work */
    path_of(path, sizeof(path), "cfg");
    uint32_t slots[] = {0, 1000, 4096 + 512, (1u << 30) + 4096};
    for (size_t k = 0; k < sizeof(slots) / sizeof(slots[0]); k++) {
        cfg = cfg_of(path, STORE_BYTES, slots[k], DEPTH);
        open_fails(&cfg, KVT_ERR_INVAL, err, sizeof(err));
    }
    cfg = cfg_of(path, STORE_BYTES, SLOT, 0);
    open_fails(&cfg, KVT_ERR_INVAL, err, sizeof(err));
    cfg = cfg_of("", STORE_BYTES, SLOT, DEPTH);
    open_fails(&cfg, KVT_ERR_INVAL, err, sizeof(err));
    assert_int_equal(read_file(path, after, n), -1);
    free(before);
    free(after);
}

static void test_bad_io(void **state)
{
    (void)state;
    char path[256], err[512];
    path_of(path, sizeof(path), "badio");
    kvt_disk_cfg_t cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
    kvt_disk_t *d = must_open(&cfg);
    uint8_t *buf = must_align(2 * SLOT);
    assert_int_equal(kvt_disk_register(d, buf, 2 * SLOT, err, sizeof(err)), KVT_OK);
    kvt_disk_io_t bad[] = {
        io_of(NSLOTS, buf, SLOT, false),  io_of(UINT32_MAX, buf, SLOT, true),
        io_of(0, buf, 0, false),          io_of(0, buf, 4095, true),
        io_of(0, buf, 4096 + 512, false), io_of(0, buf, SLOT + 4096, false),
        io_of(0, buf + 512, 4096, true),  io_of(0, buf + 2048, 4096, false),
        io_of(0, NULL, 4096, false),
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(kvt_disk_queue(d, &bad[i]), KVT_ERR_INVAL);
        assert_int_equal(kvt_disk_inflight(d), 0);
    }
    /* nothing in flight: reaping returns at once, whatever the wait */
    done_log_t log = {0};
    assert_int_equal(kvt_disk_reap(d, -1, on_done, &log), 0);
    assert_int_equal(kvt_disk_reap(d, 0, on_done, &log), 0);
    /* one I/O queued but not submitted: no wait finds nothing; a timed wait submits it */
    kvt_disk_io_t io = io_of(NSLOTS - 1, buf, SLOT, true);
    assert_int_equal(kvt_disk_queue(d, &io), KVT_OK);
    uint64_t t0 = kvt_clock_ns();
    assert_int_equal(kvt_disk_reap(d, 0, on_done, &log), 0);
    assert_true(kvt_clock_ns() - t0 < 50000000ull);
    assert_int_equal(kvt_disk_inflight(d), 1);
    size_t got = 0;
    for (int i = 0; i < 100 && got == 0; i++)
        got = kvt_disk_reap(d, 100, on_done, &log);
    assert_int_equal(got, 1);
    assert_int_equal(log.failed, 0);
    /* buffers misaligned, empty or too many are not registered */
    kvt_disk_close(d);
    d = must_open(&cfg);
    assert_int_equal(kvt_disk_register(d, buf + 512, SLOT, err, sizeof(err)), KVT_ERR_INVAL);
    assert_int_equal(kvt_disk_register(d, buf, 0, err, sizeof(err)), KVT_ERR_INVAL);
    /* more than 16384 buffers of 1 GiB: refused before the kernel sees (or pins) any of it */
    assert_int_equal(kvt_disk_register(d, buf, 1ull << 45, err, sizeof(err)), KVT_ERR_TOO_BIG);
    /* and still free to register what it can */
    assert_int_equal(kvt_disk_register(d, buf, 2 * SLOT, err, sizeof(err)), KVT_OK);
    kvt_disk_close(d);
    free(buf);
    unlink(path);
}

/* A file shortened under an open store: a read across its end is short, and the rest,
 * retried, finds nothing: -EIO, never a partial success. */
static void test_short_transfer(void **state)
{
    (void)state;
    char path[256];
    path_of(path, sizeof(path), "short");
    kvt_disk_cfg_t cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
    kvt_disk_t *d = must_open(&cfg);
    uint8_t *buf = must_align(3 * SLOT);
    assert_int_equal(truncate(path, KVT_DISK_HEADER + 2 * SLOT + 16384), 0);
    kvt_disk_io_t ios[3] = {io_of(1, buf, SLOT, false), io_of(2, buf + SLOT, SLOT, false),
                            io_of(5, buf + 2 * SLOT, SLOT, false)};
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvt_disk_queue(d, &ios[i]), KVT_OK);
    kvt_disk_submit(d);
    done_log_t log = {0};
    while (log.n < 3)
        kvt_disk_reap(d, -1, on_done, &log);
    assert_int_equal(ios[0].res, (int)SLOT);
    assert_int_equal(ios[1].res, -EIO);
    assert_int_equal(ios[2].res, -EIO);
    kvt_disk_close(d);
    free(buf);
    unlink(path);
}

static void test_sqpoll(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 3);
    char path[256], err[512];
    path_of(path, sizeof(path), "sqpoll");
    kvt_disk_cfg_t cfg = cfg_of(path, STORE_BYTES, SLOT, DEPTH);
    cfg.sqpoll = true; /* taken, or refused and logged: either way the store works */
    kvt_disk_t *d = must_open(&cfg);
    uint8_t *buf = must_align(16 * SLOT);
    assert_int_equal(kvt_disk_register(d, buf, 8 * SLOT, err, sizeof(err)), KVT_OK);
    fill(&rng, buf, 8 * SLOT);
    kvt_disk_io_t ios[8];
    for (uint32_t i = 0; i < 8; i++)
        ios[i] = io_of(i * 5, buf + (size_t)i * SLOT, SLOT, true);
    run_all(d, ios, 8, DEPTH);
    for (uint32_t i = 0; i < 8; i++)
        ios[i] = io_of(i * 5, buf + (size_t)(8 + i) * SLOT, SLOT, false);
    run_all(d, ios, 8, DEPTH);
    assert_memory_equal(buf, buf + 8 * SLOT, 8 * SLOT);
    kvt_disk_close(d);
    free(buf);
    unlink(path);
}

/*
 * Random reads and writes, random lengths, random buffers (registered or not),
 * submits and reaps at random, against a model of the device's bytes. An I/O
 * is only queued on a slot and a buffer no other I/O in flight touches, so the
 * model's answer is the only right one.
 */
#define R_SLOT (16u * 1024)
#define R_NSLOTS 24u
#define R_NBUF 32u /* the first half registered */
#define R_OPS 2500

typedef struct rmodel {
    uint8_t *dev;  /* R_NSLOTS * R_SLOT: the device's bytes */
    uint8_t *bufs; /* R_NBUF * R_SLOT */
    bool slot_busy[R_NSLOTS];
    bool buf_busy[R_NBUF];
    kvt_disk_io_t ios[R_NBUF]; /* one per buffer: ios[b] uses buffer b */
    uint32_t reads_checked;
} rmodel_t;

static void r_done(void *arg, kvt_disk_io_t *io)
{
    rmodel_t *m = arg;
    uint32_t b = (uint32_t)(io - m->ios);
    assert_int_equal(io->res, (int)io->len);
    if (!io->write) {
        assert_memory_equal(io->buf, m->dev + (size_t)io->slot * R_SLOT, io->len);
        m->reads_checked++;
    }
    m->slot_busy[io->slot] = false;
    m->buf_busy[b] = false;
}

static void test_random_model(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 4);
    char path[256], err[512];
    path_of(path, sizeof(path), "random_model");
    uint32_t depth = 1 + (uint32_t)kvt_rng_below(&rng, 16);
    kvt_disk_cfg_t cfg = cfg_of(path, KVT_DISK_HEADER + (uint64_t)R_NSLOTS * R_SLOT, R_SLOT, depth);
    kvt_disk_t *d = must_open(&cfg);
    rmodel_t *m = calloc(1, sizeof(*m));
    assert_non_null(m);
    m->dev = calloc(R_NSLOTS, R_SLOT); /* a preallocated file reads as zeros */
    m->bufs = must_align((size_t)R_NBUF * R_SLOT);
    assert_non_null(m->dev);
    assert_int_equal(kvt_disk_register(d, m->bufs, (uint64_t)R_NBUF / 2 * R_SLOT, err, sizeof(err)),
                     KVT_OK);
    for (int op = 0; op < R_OPS; op++) {
        uint64_t what = kvt_rng_below(&rng, 10);
        if (what < 6) { /* queue a read or a write */
            uint32_t s = (uint32_t)kvt_rng_below(&rng, R_NSLOTS);
            uint32_t b = (uint32_t)kvt_rng_below(&rng, R_NBUF);
            if (m->slot_busy[s] || m->buf_busy[b])
                continue;
            bool write = kvt_rng_below(&rng, 2) == 0;
            uint32_t len = 4096 * (1 + (uint32_t)kvt_rng_below(&rng, R_SLOT / 4096));
            uint8_t *buf = m->bufs + (size_t)b * R_SLOT;
            m->ios[b] = io_of(s, buf, len, write);
            if (write)
                fill(&rng, buf, len);
            else
                memset(buf, 0xee, len);
            uint32_t inflight = kvt_disk_inflight(d);
            kvt_status_t st = kvt_disk_queue(d, &m->ios[b]);
            if (inflight == depth) {
                assert_int_equal(st, KVT_ERR_LIMIT);
                continue;
            }
            assert_int_equal(st, KVT_OK);
            if (write) /* nothing else touches slot s until this completes */
                memcpy(m->dev + (size_t)s * R_SLOT, buf, len);
            m->slot_busy[s] = true;
            m->buf_busy[b] = true;
        } else if (what < 8) {
            kvt_disk_submit(d);
        } else {
            kvt_disk_submit(d);
            int wait_ms = what == 8 ? 0 : kvt_rng_below(&rng, 2) == 0 ? -1 : 5;
            kvt_disk_reap(d, wait_ms, r_done, m);
        }
    }
    kvt_disk_submit(d);
    while (kvt_disk_inflight(d) > 0)
        kvt_disk_reap(d, -1, r_done, m);
    /* the whole device, read once more */
    for (uint32_t s = 0; s < R_NSLOTS; s++) {
        uint8_t *buf = m->bufs + (size_t)(s % R_NBUF) * R_SLOT;
        m->ios[s % R_NBUF] = io_of(s, buf, R_SLOT, false);
        assert_int_equal(kvt_disk_queue(d, &m->ios[s % R_NBUF]), KVT_OK);
        kvt_disk_submit(d);
        kvt_disk_reap(d, -1, r_done, m);
    }
    assert_true(m->reads_checked > R_OPS / 50); /* how many hangs on timing; far more */
    kvt_disk_close(d);
    free(m->bufs);
    free(m->dev);
    free(m);
    unlink(path);
}

/*
 * A block device (a loop device over a file in the temp dir, as root): no
 * header refused and left alone, formatted only when asked, kept across a
 * reopen, held by one opener. Skipped where loop devices cannot be made.
 */
static void test_block_device(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "block device: not root, skipped\n");
        skip();
    }
    char back[256], dev[64], err[512];
    path_of(back, sizeof(back), "loop_backing");
    const size_t size = 4u << 20;
    uint8_t *zero = calloc(1, size), *after = malloc(size);
    assert_non_null(zero);
    assert_non_null(after);
    write_file(back, zero, size);
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    int num = ctl >= 0 ? ioctl(ctl, LOOP_CTL_GET_FREE) : -1;
    if (ctl >= 0)
        close(ctl);
    snprintf(dev, sizeof(dev), "/dev/loop%d", num);
    int lfd = num >= 0 ? open(dev, O_RDWR | O_CLOEXEC) : -1;
    int bfd = open(back, O_RDWR | O_CLOEXEC);
    assert_true(bfd >= 0);
    /* autoclear: the device goes when its last opener closes, even if this test dies */
    struct loop_config lc = {.fd = (uint32_t)bfd, .block_size = 4096};
    lc.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    if (lfd < 0 || ioctl(lfd, LOOP_CONFIGURE, &lc) != 0) {
        fprintf(stderr, "block device: no loop device here (%s), skipped\n", strerror(errno));
        if (lfd >= 0)
            close(lfd);
        close(bfd);
        unlink(back);
        free(zero);
        free(after);
        skip();
    }
    close(bfd);

    kvt_disk_cfg_t cfg = cfg_of(dev, 0, SLOT, DEPTH);
    open_fails(&cfg, KVT_ERR_EXISTS, err, sizeof(err));
    assert_non_null(strstr(err, "no kvtier header"));
    assert_int_equal(read_file(back, after, size), (ssize_t)size);
    assert_memory_equal(after, zero, size);

    cfg.format_device = true;
    kvt_disk_t *d = must_open(&cfg);
    assert_true(kvt_disk_created(d));
    assert_int_equal(kvt_disk_nslots(d), (size - KVT_DISK_HEADER) / SLOT);
    uint64_t id = kvt_disk_store_id(d);
    open_fails(&cfg, KVT_ERR_EXISTS, err, sizeof(err)); /* held */
    uint8_t *buf = must_align(4 * SLOT);
    kvt_rng_t rng;
    kvt_rng_init(&rng, 5);
    fill(&rng, buf, 2 * SLOT);
    kvt_disk_io_t ios[2] = {io_of(0, buf, SLOT, true), io_of(62, buf + SLOT, SLOT, true)};
    run_all(d, ios, 2, DEPTH);
    kvt_disk_close(d);

    /* formatted already: format_device changes nothing */
    d = must_open(&cfg);
    assert_false(kvt_disk_created(d));
    assert_int_equal(kvt_disk_store_id(d), id);
    ios[0] = io_of(0, buf + 2 * SLOT, SLOT, false);
    ios[1] = io_of(62, buf + 3 * SLOT, SLOT, false);
    run_all(d, ios, 2, DEPTH);
    assert_memory_equal(buf, buf + 2 * SLOT, 2 * SLOT);
    kvt_disk_close(d);

    /* with another slot size: refused */
    cfg.slot_bytes = 2 * SLOT;
    open_fails(&cfg, KVT_ERR_EXISTS, err, sizeof(err));
    ioctl(lfd, LOOP_CLR_FD);
    close(lfd);
    free(buf);
    free(zero);
    free(after);
    unlink(back);
}

/* Why this machine cannot run the tests, or NULL. */
static const char *unsupported(char *why, size_t cap)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(2, &ring, 0);
    if (rc < 0) {
        snprintf(why, cap, "io_uring refused: %s", strerror(-rc));
        return why;
    }
    io_uring_queue_exit(&ring);
    char path[256];
    path_of(path, sizeof(path), "probe");
    int fd = open(path, O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, cap, "O_DIRECT refused in %s: %s", g_dir, strerror(errno));
        unlink(path);
        return why;
    }
    close(fd);
    unlink(path);
    return NULL;
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/kvt_disk_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char why[300];
    if (unsupported(why, sizeof(why)) != NULL) {
        fprintf(stderr, "test_disk skipped: %s\n", why);
        rmdir(g_dir);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read_reopen), cmocka_unit_test(test_fixed_buffers),
        cmocka_unit_test(test_refusals),          cmocka_unit_test(test_bad_io),
        cmocka_unit_test(test_short_transfer),    cmocka_unit_test(test_sqpoll),
        cmocka_unit_test(test_random_model),      cmocka_unit_test(test_block_device),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return failed;
}
