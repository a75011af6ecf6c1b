/*
 * tiers/arena: geometry and mapping of memfd arenas (the fd maps the same memory, as an
 * engine maps it), named arenas in a temp dir (created 0600 with its header, held against a
 * second open, removed on close, reused when left by a dead kvtierd, never touching a file
 * that is not an arena), pre-faulting and THP off, refused names and sizes, /dev/shm names.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/rng.h"
#include "tiers/tiers_test.h"

static char tmpdir[256];
static const char *skipped; /* why a case was skipped: the run then exits 77 */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static int setup(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/kvt_arena_XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void tpath(char *out, size_t cap, const char *name)
{
    assert_true((size_t)snprintf(out, cap, "%s/%s", tmpdir, name) < cap);
}

/* Entries in @dir besides "." and "..". */
static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static bool exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static uint64_t word(uint32_t slot, uint64_t w, uint64_t salt)
{
    return kvt_rng_mix(((uint64_t)slot << 32) ^ w ^ salt);
}

/* Fills every slot through @a's mapping and reads each back through @other (another mapping
 * of the same file), then the other way round. */
static void check_shared(const kvt_arena_t *a, uint8_t *other)
{
    for (uint32_t i = 0; i < a->nslots; i++) {
        uint64_t *p = (uint64_t *)kvt_arena_slot(a, i);
        for (uint64_t w = 0; w < a->slot_bytes / 8; w++)
            p[w] = word(i, w, 1);
    }
    for (uint32_t i = 0; i < a->nslots; i++) {
        const uint64_t *q = (const uint64_t *)(other + a->slot_off + (uint64_t)i * a->slot_bytes);
        for (uint64_t w = 0; w < a->slot_bytes / 8; w++)
            if (q[w] != word(i, w, 1))
                fail_msg("slot %u word %" PRIu64 " differs in the second mapping", i, w);
        uint64_t *q2 = (uint64_t *)(other + a->slot_off + (uint64_t)i * a->slot_bytes);
        q2[0] = word(i, 0, 2);
        q2[a->slot_bytes / 8 - 1] = word(i, 0, 3);
    }
    for (uint32_t i = 0; i < a->nslots; i++) {
        const uint64_t *p = (const uint64_t *)kvt_arena_slot(a, i);
        assert_int_equal(p[0], word(i, 0, 2));
        assert_int_equal(p[a->slot_bytes / 8 - 1], word(i, 0, 3));
        if (i + 1 < a->nslots) /* slots do not overlap: the next one's first word is its own */
            assert_int_equal(p[a->slot_bytes / 8], word(i + 1, 0, 2));
    }
}

/* Slot pointers: 4 KiB-aligned, one after the other, the last ending inside the mapping. */
static void check_slots(const kvt_arena_t *a)
{
    for (uint32_t i = 0; i < a->nslots; i++) {
        const uint8_t *p = kvt_arena_slot(a, i);
        assert_int_equal((uintptr_t)p % KVT_ARENA_ALIGN, 0);
        assert_true(p >= a->base + a->slot_off);
        assert_true(p + a->slot_bytes <= a->base + a->map_bytes);
        assert_int_equal(p - a->base, a->slot_off + (uint64_t)i * a->slot_bytes);
    }
}

/* The kB of @base's mapping resident in this process and whether it has THP off, from
 * /proc/self/smaps; false when that cannot be read. */
static bool smaps_of(const void *base, long *rss_kb_p, bool *nohuge_p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL)
        return false;
    char *line = NULL;
    size_t cap = 0;
    bool in = false, found = false;
    *rss_kb_p = -1;
    *nohuge_p = false;
    while (getline(&line, &cap, f) > 0) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            in = lo == (uintptr_t)base;
            found |= in;
            continue;
        }
        if (!in)
            continue;
        long kb;
        if (sscanf(line, "Rss: %ld kB", &kb) == 1)
            *rss_kb_p = kb;
        if (strncmp(line, "VmFlags:", 8) == 0)
            *nohuge_p = strstr(line, " nh") != NULL;
    }
    free(line);
    fclose(f);
    return found && *rss_kb_p >= 0;
}

static void test_memfd_geometry(void **state)
{
    (void)state;
    const uint32_t blocks[] = {4095, 4096, 4097, 1u << 20, 1};
    const uint64_t ram = (8u << 20) + 12345; /* not a whole number of slots */
    for (size_t k = 0; k < sizeof(blocks) / sizeof(blocks[0]); k++) {
        char err[256] = "";
        kvt_arena_t a;
        kvt_arena_cfg_t cfg = {.ram_bytes = ram, .block_bytes = blocks[k], .populate = k % 2 == 0};
        if (k == 4)
            cfg.name = ""; /* "" is NULL */
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
        uint64_t slot = (blocks[k] + 4095ull) / 4096 * 4096;
        assert_int_equal(a.slot_bytes, slot);
        assert_int_equal(a.nslots, ram / slot);
        assert_int_equal(a.slot_off, 0);
        assert_int_equal(a.map_bytes, (uint64_t)a.nslots * slot);
        assert_false(a.hugetlb);
        assert_string_equal(a.path, "");
        assert_true(a.fd >= 0);
        assert_true(fcntl(a.fd, F_GETFD) & FD_CLOEXEC);
        struct stat st;
        assert_int_equal(fstat(a.fd, &st), 0);
        assert_int_equal((uint64_t)st.st_size, a.map_bytes);
        /* sealed: whoever holds the fd cannot shrink the memory under kvtierd */
        assert_int_not_equal(ftruncate(a.fd, 0), 0);
        assert_int_equal(errno, EPERM);
        check_slots(&a);
        uint8_t *other = mmap(NULL, a.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
        assert_true(other != MAP_FAILED);
        check_shared(&a, other);
        munmap(other, a.map_bytes);
        kvt_arena_close(&a);
        assert_int_equal(a.fd, -1);
        assert_null(a.base);
        kvt_arena_close(&a); /* closed: harmless */
    }
}

/* populate pre-faults the whole mapping into this process, and THP is off either way. */
static void test_populate_and_thp(void **state)
{
    (void)state;
    char p[300];
    tpath(p, sizeof(p), "pop");
    for (int named = 0; named < 2; named++) {
        for (int pop = 0; pop < 2; pop++) {
            char err[256] = "";
            kvt_arena_t a;
            kvt_arena_cfg_t cfg = {.ram_bytes = 4u << 20,
                                   .block_bytes = 65536,
                                   .name = named ? p : NULL,
                                   .populate = pop};
            assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
            long rss = -1;
            bool nohuge = false;
            if (!smaps_of(a.base, &rss, &nohuge)) {
                kvt_arena_close(&a);
                skipped = "populate and THP: /proc/self/smaps does not show the mapping";
                skip();
            }
            assert_true(nohuge);
            if (pop)
                assert_int_equal((uint64_t)rss * 1024, a.map_bytes);
            else
                assert_true((uint64_t)rss * 1024 <= 4096); /* at most the header page */
            kvt_arena_close(&a);
        }
    }
}

static void test_geometry_refused(void **state)
{
    (void)state;
    char p[300];
    tpath(p, sizeof(p), "geo");
    const struct {
        uint64_t ram;
        uint32_t block;
    } bad[] = {
        {1u << 20, 0},                       /* no block size */
        {0, 4096},                           /* no RAM */
        {4096, 4097},                        /* less than one slot */
        {8191, 4097},                        /* still less than one slot */
        {UINT64_MAX, UINT32_MAX},            /* a slot past u32 */
        {UINT64_MAX, 0xFFFFF001u},           /* rounds up to 2^32 */
        {UINT64_MAX, 4096},                  /* 2^52 slots */
        {(uint64_t)UINT32_MAX * 4096, 4096}, /* UINT32_MAX slots: KVT_SLOT_NONE */
        {(uint64_t)UINT32_MAX * 0xFFFFF000u, 0xFFFFF000u},
    };
    /* should a huge geometry ever be accepted, sizing the file fails (EFBIG) at once rather
     * than filling memory with a memfd of terabytes */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 64u << 20;
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        for (int named = 0; named < 2; named++) {
            char err[256] = "";
            kvt_arena_t a = {.fd = 7, .base = (uint8_t *)&a};
            kvt_arena_cfg_t cfg = {
                .ram_bytes = bad[k].ram, .block_bytes = bad[k].block, .name = named ? p : NULL};
            assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_INVAL);
            assert_true(strlen(err) > 0);
            assert_null(strchr(err, '\n'));
            assert_int_equal(a.fd, -1); /* closed */
            assert_null(a.base);
            assert_false(exists(p));
        }
    }
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, oldsig);
    /* no room for the reason is fine */
    kvt_arena_t a;
    kvt_arena_cfg_t cfg = {.ram_bytes = 100, .block_bytes = 4096};
    assert_int_equal(kvt_arena_open(&a, &cfg, NULL, 0), KVT_ERR_INVAL);
    /* the smallest that is allowed: exactly one slot */
    cfg.ram_bytes = 8192;
    cfg.block_bytes = 4097;
    char err[256];
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
    assert_int_equal(a.nslots, 1);
    assert_int_equal(a.slot_bytes, 8192);
    kvt_arena_close(&a);
    assert_int_equal(dir_entries(tmpdir), 0);
}

/* More than the machine's memory: refused with KVT_ERR_NO_SPACE before anything is reserved
 * (a memfd or /dev/shm arena past memory would bring the OOM killer, not ENOSPC). */
static void test_more_than_memory(void **state)
{
    (void)state;
    char p[300];
    tpath(p, sizeof(p), "huge");
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    assert_true(pages > 0 && psize > 0);
    uint64_t twice = (uint64_t)pages * (uint64_t)psize * 2u;
    /* should the check ever go, sizing fails at the file-size limit instead of filling memory */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 64u << 20;
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    for (int named = 0; named < 2; named++) {
        char err[256] = "";
        kvt_arena_t a;
        kvt_arena_cfg_t cfg = {
            .ram_bytes = twice, .block_bytes = 1u << 20, .name = named ? p : NULL};
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_NO_SPACE);
        assert_non_null(strstr(err, "memory available"));
        assert_int_equal(a.fd, -1);
        assert_false(exists(p));
    }
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, oldsig);
}

static void test_names_refused(void **state)
{
    (void)state;
    char longname[400], longpath[600];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    snprintf(longpath, sizeof(longpath), "%s/%0300d", tmpdir, 0);
    const char *bad[] = {"a/b", "./x", "x/", "..", ".", "../kvt_arena_escape", longname, longpath};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        char err[256] = "";
        kvt_arena_t a;
        kvt_arena_cfg_t cfg = {.ram_bytes = 1u << 20, .block_bytes = 4096, .name = bad[k]};
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_INVAL);
        assert_true(strlen(err) > 0);
        assert_int_equal(a.fd, -1);
    }
    /* one byte shorter than path[] is the longest name that fits */
    kvt_arena_t a;
    char fits[sizeof(a.path)];
    size_t dl = strlen(tmpdir);
    memcpy(fits, tmpdir, dl);
    fits[dl] = '/';
    memset(fits + dl + 1, 'f', sizeof(fits) - dl - 2);
    fits[sizeof(fits) - 1] = '\0';
    char err[256] = "";
    kvt_arena_cfg_t cfg = {.ram_bytes = 1u << 20, .block_bytes = 4096, .name = fits};
    kvt_status_t st = kvt_arena_open(&a, &cfg, err, sizeof(err));
    if (st == KVT_OK) {
        assert_string_equal(a.path, fits);
        kvt_arena_close(&a);
    } else { /* a file name past NAME_MAX: refused by the file system, not by length */
        assert_int_not_equal(st, KVT_ERR_INVAL);
    }
    fits[sizeof(fits) - 1] = 'f';
    char toolong[sizeof(a.path) + 1];
    memcpy(toolong, fits, sizeof(fits));
    toolong[sizeof(a.path)] = '\0';
    cfg.name = toolong;
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_INVAL);
    assert_int_equal(dir_entries(tmpdir), 0);
}

static void read_hdr(const char *p, kvt_arena_hdr_t *h)
{
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, h, sizeof(*h), 0), sizeof(*h));
    close(fd);
}

static void check_hdr(const char *p, const kvt_arena_t *a, pid_t pid)
{
    kvt_arena_hdr_t h;
    read_hdr(p, &h);
    assert_memory_equal(h.magic, KVT_ARENA_MAGIC, 8);
    assert_int_equal(h.version, KVT_ARENA_VERSION);
    assert_int_equal(h.slot_bytes, a->slot_bytes);
    assert_int_equal(h.nslots, a->nslots);
    assert_int_equal(h.slot_off, a->slot_off);
    assert_int_equal(h.pid, pid);
}

static void test_named(void **state)
{
    (void)state;
    char p[300], err[256] = "";
    tpath(p, sizeof(p), "arena");
    kvt_arena_t a, b;
    kvt_arena_cfg_t cfg = {.ram_bytes = (1u << 20) + 1, .block_bytes = 100000, .name = p};
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
    assert_string_equal(a.path, p);
    assert_int_equal(a.slot_bytes, 102400);
    assert_int_equal(a.nslots, 10);
    assert_int_equal(a.slot_off, 4096);
    assert_int_equal(a.map_bytes, 4096 + 10 * 102400);
    assert_false(a.hugetlb);
    assert_true(fcntl(a.fd, F_GETFD) & FD_CLOEXEC);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal((uint64_t)st.st_size, a.map_bytes);
    check_hdr(p, &a, getpid());
    check_slots(&a);

    /* an engine that maps the file by its name sees the same memory */
    int efd = open(p, O_RDWR);
    assert_true(efd >= 0);
    uint8_t *other = mmap(NULL, a.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, efd, 0);
    assert_true(other != MAP_FAILED);
    close(efd);
    check_shared(&a, other);
    munmap(other, a.map_bytes);
    check_hdr(p, &a, getpid()); /* the slots leave the header alone */

    /* a second open, even in this process (flock is per open file description), is refused */
    char want[64];
    snprintf(want, sizeof(want), "(pid %d)", (int)getpid());
    for (int k = 0; k < 2; k++) {
        kvt_arena_cfg_t c2 = cfg;
        c2.ram_bytes = k ? 1u << 22 : cfg.ram_bytes; /* a different size changes nothing */
        assert_int_equal(kvt_arena_open(&b, &c2, err, sizeof(err)), KVT_ERR_EXISTS);
        assert_non_null(strstr(err, want));
        assert_non_null(strstr(err, "held by a running kvtierd"));
        assert_int_equal(b.fd, -1);
        assert_int_equal(lstat(p, &st), 0);
        assert_int_equal((uint64_t)st.st_size, a.map_bytes);
        check_hdr(p, &a, getpid());
    }
    /* the first is intact */
    assert_int_equal(((const uint64_t *)kvt_arena_slot(&a, 3))[0], word(3, 0, 2));

    kvt_arena_close(&a);
    assert_false(exists(p));
    assert_int_equal(a.fd, -1);
    assert_null(a.base);
    kvt_arena_close(&a);

    /* the name is free again */
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
    assert_true(exists(p));
    kvt_arena_close(&a);
    assert_false(exists(p));
}

/* A kvtierd that holds the arena, then dies without closing it (as after kill -9): while it
 * lives the file is refused, naming its pid; after, it is reused. */
static void test_leftover_after_crash(void **state)
{
    (void)state;
    char p[300], err[256] = "";
    tpath(p, sizeof(p), "crashed");
    kvt_arena_cfg_t cfg = {.ram_bytes = 2u << 20, .block_bytes = 65536, .name = p};
    int ready[2], hold[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(hold), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(ready[0]);
        close(hold[1]);
        kvt_arena_t c;
        char cerr[256];
        char ok = kvt_arena_open(&c, &cfg, cerr, sizeof(cerr)) == KVT_OK ? 'y' : 'n';
        if (ok == 'y')
            memset(kvt_arena_slot(&c, 0), 0xab, c.slot_bytes);
        if (write(ready[1], &ok, 1) != 1)
            _exit(2);
        char x;
        while (read(hold[0], &x, 1) > 0) /* until the parent closes its end */
            ;
        _exit(ok == 'y' ? 0 : 1);
    }
    close(ready[1]);
    close(hold[0]);
    char ok = 0;
    assert_int_equal(read(ready[0], &ok, 1), 1);
    assert_int_equal(ok, 'y');
    kvt_arena_t a;
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_EXISTS);
    char want[64];
    snprintf(want, sizeof(want), "held by a running kvtierd (pid %d)", (int)child);
    assert_non_null(strstr(err, want));
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal((uint64_t)st.st_size, 4096 + (2u << 20));

    close(hold[1]); /* the child exits without kvt_arena_close() */
    int ws;
    assert_int_equal(waitpid(child, &ws, 0), child);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    close(ready[0]);
    assert_true(exists(p)); /* left behind */

    /* a process that shares the dead kvtierd's open file (an engine given its fd) still holds
     * the lock: refused, saying the kvtierd is gone */
    int efd = open(p, O_RDWR);
    assert_true(efd >= 0);
    assert_int_equal(flock(efd, LOCK_EX | LOCK_NB), 0);
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_EXISTS);
    snprintf(want, sizeof(want), "its kvtierd (pid %d) is gone", (int)child);
    assert_non_null(strstr(err, want));
    close(efd);

    /* reused, at other sizes: smaller, then larger than it was */
    const uint64_t rams[] = {1u << 20, 3u << 20};
    for (int k = 0; k < 2; k++) {
        cfg.ram_bytes = rams[k];
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
        assert_int_equal(a.nslots, rams[k] / 65536);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal((uint64_t)st.st_size, a.map_bytes);
        check_hdr(p, &a, getpid());
        check_slots(&a);
        memset(kvt_arena_slot(&a, a.nslots - 1), 0x5a, a.slot_bytes); /* all of it is usable */
        if (k == 0) {
            /* left behind again, as a crash leaves it: unmapped and unlocked, not removed */
            int fd = a.fd;
            munmap(a.base, a.map_bytes);
            close(fd);
        } else {
            kvt_arena_close(&a);
        }
    }
    assert_false(exists(p));
}

/* A file that carries an arena header, as a dead kvtierd leaves it, is reused whatever its
 * size; a file with the magic but shorter than the header is not. */
static void test_leftover_header_copy(void **state)
{
    (void)state;
    char p[300], q[300], err[256] = "";
    tpath(p, sizeof(p), "orig");
    tpath(q, sizeof(q), "copy");
    kvt_arena_cfg_t cfg = {.ram_bytes = 1u << 20, .block_bytes = 4096, .name = p};
    kvt_arena_t a;
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
    uint8_t page[4096];
    memcpy(page, a.base, sizeof(page));
    kvt_arena_close(&a);
    assert_false(exists(p));

    const size_t lens[] = {sizeof(page), sizeof(kvt_arena_hdr_t)};
    for (int k = 0; k < 2; k++) {
        int fd = open(q, O_CREAT | O_EXCL | O_WRONLY, 0644);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, page, lens[k]), (ssize_t)lens[k]);
        close(fd);
        cfg.name = q;
        cfg.block_bytes = 8192;
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
        check_hdr(q, &a, getpid());
        assert_int_equal(a.nslots, 128);
        struct stat st;
        assert_int_equal(stat(q, &st), 0);
        assert_int_equal((uint64_t)st.st_size, a.map_bytes);
        kvt_arena_close(&a);
        assert_false(exists(q));
    }

    /* the magic alone, or a header cut short */
    const size_t shorts[] = {8, sizeof(kvt_arena_hdr_t) - 1};
    for (int k = 0; k < 2; k++) {
        int fd = open(q, O_CREAT | O_TRUNC | O_WRONLY, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, page, shorts[k]), (ssize_t)shorts[k]);
        close(fd);
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_EXISTS);
        assert_non_null(strstr(err, "not a kvtier arena"));
        struct stat st;
        assert_int_equal(stat(q, &st), 0);
        assert_int_equal((uint64_t)st.st_size, shorts[k]);
    }
}

/* What is at the path and is not an arena is refused and left exactly as it was. */
static void test_foreign_refused(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 3);
    char p[300], err[256];
    tpath(p, sizeof(p), "foreign");
    kvt_arena_cfg_t cfg = {.ram_bytes = 1u << 20, .block_bytes = 4096, .name = p};
    kvt_arena_t a;
    const size_t sizes[] = {10000, 0, 3, 4096, 100};
    static uint8_t data[10000], back[10000 + 1];
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        for (size_t i = 0; i < sizeof(data); i++)
            data[i] = (uint8_t)kvt_rng_next(&rng);
        if (k == 4)
            memcpy(data, "KVTARENX", 8); /* almost the magic */
        int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, data, sizes[k]), (ssize_t)sizes[k]);
        close(fd);
        err[0] = '\0';
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_EXISTS);
        assert_non_null(strstr(err, "exists and is not a kvtier arena; refusing to touch it"));
        assert_int_equal(a.fd, -1);
        fd = open(p, O_RDONLY);
        assert_true(fd >= 0);
        assert_int_equal(read(fd, back, sizeof(back)), (ssize_t)sizes[k]);
        close(fd);
        if (sizes[k] > 0)
            assert_memory_equal(back, data, sizes[k]);
    }
    assert_int_equal(unlink(p), 0);

    /* a file another process holds locked: refused, unnamed pid */
    {
        int fd = open(p, O_CREAT | O_EXCL | O_RDWR, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, data, 100), 100);
        assert_int_equal(flock(fd, LOCK_EX), 0);
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_EXISTS);
        assert_null(strstr(err, "pid"));
        close(fd);
        assert_int_equal(unlink(p), 0);
    }

    /* not a regular file: a directory, a FIFO, a symlink (even to an arena-like file) */
    char t[300];
    tpath(t, sizeof(t), "target");
    int fd = open(t, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    kvt_arena_hdr_t h = {.version = KVT_ARENA_VERSION, .slot_bytes = 4096, .nslots = 1};
    memcpy(h.magic, KVT_ARENA_MAGIC, 8);
    assert_int_equal(write(fd, &h, sizeof(h)), sizeof(h));
    close(fd);
    for (int k = 0; k < 3; k++) {
        if (k == 0)
            assert_int_equal(mkdir(p, 0700), 0);
        else if (k == 1)
            assert_int_equal(mkfifo(p, 0600), 0);
        else
            assert_int_equal(symlink(t, p), 0);
        assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_ERR_EXISTS);
        assert_non_null(strstr(err, "refusing to touch it"));
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        assert_int_equal(st.st_mode & S_IFMT, k == 0 ? S_IFDIR : k == 1 ? S_IFIFO : S_IFLNK);
        assert_int_equal(remove(p), 0);
    }
    struct stat st;
    assert_int_equal(stat(t, &st), 0);
    assert_int_equal(st.st_size, sizeof(h)); /* the symlink's target untouched */
}

/* A failure after the file exists removes it when this call created it, and leaves a reused
 * one in place. The file size limit stands in for a full file system. */
static void test_failure_cleans_up(void **state)
{
    (void)state;
    char p[300], err[256];
    tpath(p, sizeof(p), "big");
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 64 * 1024;
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    kvt_arena_cfg_t cfg = {.ram_bytes = 1u << 20, .block_bytes = 4096, .name = p};
    kvt_arena_t a;
    kvt_status_t st = kvt_arena_open(&a, &cfg, err, sizeof(err));
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_int_equal(st, KVT_ERR_NO_SPACE);
    assert_int_equal(a.fd, -1);
    assert_false(exists(p));

    /* a leftover, reused and then failed: still there, still an arena */
    cfg.ram_bytes = 16384;
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
    munmap(a.base, a.map_bytes);
    close(a.fd);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    cfg.ram_bytes = 1u << 20;
    st = kvt_arena_open(&a, &cfg, err, sizeof(err));
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, oldsig);
    assert_int_equal(st, KVT_ERR_NO_SPACE);
    assert_true(exists(p));
    cfg.ram_bytes = 8192;
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
    kvt_arena_close(&a);
    assert_false(exists(p));
}

/* A plain name is a file in /dev/shm, there while the arena is open and gone after. */
static void test_dev_shm(void **state)
{
    (void)state;
    struct stat st;
    if (stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode) || access("/dev/shm", W_OK) != 0) {
        skipped = "/dev/shm names: /dev/shm is not a writable directory";
        skip();
    }
    char name[64], p[128], err[256] = "";
    snprintf(name, sizeof(name), "kvt-test-arena-%d", (int)getpid());
    snprintf(p, sizeof(p), "/dev/shm/%s", name);
    unlink(p);
    kvt_arena_cfg_t cfg = {.ram_bytes = 1u << 20, .block_bytes = 4096, .name = name};
    kvt_arena_t a;
    assert_int_equal(kvt_arena_open(&a, &cfg, err, sizeof(err)), KVT_OK);
    assert_string_equal(a.path, p);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal((uint64_t)st.st_size, a.map_bytes);
    check_hdr(p, &a, getpid());
    check_slots(&a);
    kvt_arena_close(&a);
    assert_false(exists(p));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_memfd_geometry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_populate_and_thp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_geometry_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_more_than_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_named, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leftover_after_crash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leftover_header_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_cleans_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dev_shm, setup, teardown),
    };
    if (cmocka_run_group_tests(tests, NULL, NULL) != 0)
        return 1;
    if (skipped != NULL) {
        fprintf(stderr, "test_arena: SKIP %s\n", skipped);
        return 77;
    }
    return 0;
}
