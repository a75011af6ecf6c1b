/*
 * tiers/meta: the block-record codec (layout, round trip, every refusal) and
 * the RocksDB store in real temp directories: random batches of puts and
 * deletes against a sorted-array model across a reopen, records of
 * acknowledged writes surviving a kill -9 of the writer, the lock against a
 * second opener (same process and another), the store record (another disk
 * refused, a fresh disk drops blocks but keeps namespaces), namespace ids
 * stable across reopen, bad directories, malformed records skipped and
 * counted, early stop.
 *
 * The child processes exec this binary again (main's --child-* modes): a
 * forked copy of a process that has run RocksDB's background threads is not
 * a safe place to open a database.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rocksdb/c.h>

#include "common/clock.h"
#include "tests/support/rng.h"
#include "tiers/tiers_test.h"

#define SLOT_BYTES (1u << 20)
#define NSLOTS 4096u
#define STORE_A 0x0123456789abcdefull
#define STORE_B 0xfedcba9876543210ull
#define CRASH_BATCH 50u

static char g_base[128]; /* the test's scratch directory */
static int g_seq;        /* names the data dirs in it */

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_base, sizeof(g_base), "%s/kvt_meta_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(g_base) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "chmod -R u+rwx '%s' && rm -rf '%s'", g_base, g_base);
    return system(cmd) == 0 ? 0 : -1;
}

/* A data dir path not yet made. */
static void dir_new(char *out, size_t cap)
{
    snprintf(out, cap, "%s/data%d", g_base, g_seq++);
}

static kvt_meta_cfg_t cfg_of(const char *dir, uint64_t store, bool fresh)
{
    return (kvt_meta_cfg_t){.dir = dir,
                            .store_id = store,
                            .slot_bytes = SLOT_BYTES,
                            .nslots = NSLOTS,
                            .fresh_disk = fresh};
}

static kvt_meta_t *must_open(const kvt_meta_cfg_t *cfg)
{
    kvt_meta_t *m = NULL;
    char err[512] = "";
    kvt_status_t st = kvt_meta_open(cfg, &m, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("open %s: %d %s", cfg->dir, st, err);
    assert_non_null(m);
    return m;
}

/* kvt_meta_open()'s status; its error text in @err. */
static kvt_status_t try_open(const kvt_meta_cfg_t *cfg, char *err, size_t errlen)
{
    kvt_meta_t *m = (kvt_meta_t *)&g_seq; /* must stay as it is on failure */
    err[0] = '\0';
    kvt_status_t st = kvt_meta_open(cfg, &m, err, errlen);
    if (st == KVT_OK) {
        kvt_meta_close(m);
        return st;
    }
    assert_ptr_equal(m, (kvt_meta_t *)&g_seq);
    assert_true(err[0] != '\0' && strchr(err, '\n') == NULL);
    return st;
}

static void must_write(kvt_meta_t *m, const kvt_meta_rec_t *put, size_t nput,
                       const kvt_meta_rec_t *del, size_t ndel)
{
    char err[512] = "";
    kvt_status_t st = kvt_meta_write(m, put, nput, del, ndel, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("write: %d %s", st, err);
}

static uint32_t must_ns(kvt_meta_t *m, const char *name, size_t len)
{
    uint32_t id = 0;
    char err[256];
    assert_int_equal(kvt_meta_ns(m, name, len, &id, err, sizeof(err)), KVT_OK);
    return id;
}

static bool rec_eq(const kvt_meta_rec_t *a, const kvt_meta_rec_t *b)
{
    return a->ns == b->ns && a->key == b->key && a->slot == b->slot && a->len == b->len &&
           a->sum == b->sum && a->gen == b->gen;
}

static int rec_cmp(const void *pa, const void *pb)
{
    const kvt_meta_rec_t *a = pa, *b = pb;
    if (a->ns != b->ns)
        return a->ns < b->ns ? -1 : 1;
    return a->key < b->key ? -1 : a->key > b->key;
}

static kvt_meta_rec_t rec_random(kvt_rng_t *rng)
{
    uint64_t a = kvt_rng_next(rng), b = kvt_rng_next(rng);
    return (kvt_meta_rec_t){.ns = (uint32_t)a,
                            .key = kvt_rng_next(rng),
                            .slot = (uint32_t)(a >> 32),
                            .len = (uint32_t)b,
                            .sum = kvt_rng_next(rng),
                            .gen = kvt_rng_next(rng)};
}

/* What a scan gives: every record, in order, up to @stop of them (0: all). */
typedef struct scanned {
    kvt_meta_rec_t *r;
    size_t n, cap, stop;
} scanned_t;

static bool scan_collect(void *arg, const kvt_meta_rec_t *r)
{
    scanned_t *s = arg;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->r = realloc(s->r, s->cap * sizeof(*s->r));
        assert_non_null(s->r);
    }
    s->r[s->n++] = *r;
    return s->stop == 0 || s->n < s->stop;
}

static scanned_t must_scan(kvt_meta_t *m, size_t stop, uint64_t *bad_p)
{
    scanned_t s = {.stop = stop};
    char err[512] = "";
    kvt_status_t st = kvt_meta_scan(m, scan_collect, &s, bad_p, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("scan: %d %s", st, err);
    return s;
}

/* ---- codec ---- */

static void test_codec_layout(void **state)
{
    (void)state;
    kvt_meta_rec_t r = {.ns = 0x01020304,
                        .key = 0x1112131415161718ull,
                        .slot = 0x21222324,
                        .len = 0x31323334,
                        .sum = 0x4142434445464748ull,
                        .gen = 0x5152535455565758ull};
    uint8_t k[KVT_META_KEY_BYTES], v[KVT_META_VAL_BYTES];
    kvt_meta_key_encode(r.ns, r.key, k);
    kvt_meta_val_encode(&r, v);
    static const uint8_t k_want[] = {'b',  0x01, 0x02, 0x03, 0x04, 0x11, 0x12,
                                     0x13, 0x14, 0x15, 0x16, 0x17, 0x18};
    static const uint8_t v_want[] = {1,    0x24, 0x23, 0x22, 0x21, 0x34, 0x33, 0x32, 0x31,
                                     0x48, 0x47, 0x46, 0x45, 0x44, 0x43, 0x42, 0x41, 0x58,
                                     0x57, 0x56, 0x55, 0x54, 0x53, 0x52, 0x51};
    assert_memory_equal(k, k_want, sizeof(k_want));
    assert_memory_equal(v, v_want, sizeof(v_want));
}

static void test_codec_round_trip(void **state)
{
    (void)state;
    kvt_rng_t rng;
    kvt_rng_init(&rng, 1);
    for (int i = 0; i < 20000; i++) {
        kvt_meta_rec_t a = rec_random(&rng), b = rec_random(&rng), got;
        if (i & 1) /* near neighbours, so the order check sees equal prefixes */
            b.ns = a.ns;
        uint8_t ka[KVT_META_KEY_BYTES], va[KVT_META_VAL_BYTES], kb[KVT_META_KEY_BYTES];
        kvt_meta_key_encode(a.ns, a.key, ka);
        kvt_meta_val_encode(&a, va);
        assert_true(kvt_meta_rec_decode(ka, sizeof(ka), va, sizeof(va), &got));
        assert_true(rec_eq(&got, &a));
        /* byte order of the keys is (ns, key) order: a scan comes sorted */
        kvt_meta_key_encode(b.ns, b.key, kb);
        int c = memcmp(ka, kb, sizeof(ka));
        int want = rec_cmp(&a, &b);
        assert_true((c < 0) == (want < 0) && (c == 0) == (want == 0));
    }
}

static void test_codec_refusals(void **state)
{
    (void)state;
    kvt_meta_rec_t r = {.ns = 7, .key = 9, .slot = 3, .len = 4096, .sum = 5, .gen = 6};
    uint8_t k[KVT_META_KEY_BYTES + 1], v[KVT_META_VAL_BYTES + 1];
    kvt_meta_key_encode(r.ns, r.key, k);
    kvt_meta_val_encode(&r, v);
    k[KVT_META_KEY_BYTES] = 0;
    v[KVT_META_VAL_BYTES] = 0;
    kvt_meta_rec_t out, sentinel;
    memset(&sentinel, 0xa5, sizeof(sentinel));
    out = sentinel;
    assert_true(kvt_meta_rec_decode(k, KVT_META_KEY_BYTES, v, KVT_META_VAL_BYTES, &out));
    assert_true(rec_eq(&out, &r));

    /* wrong sizes */
    const size_t klens[] = {0, 1, 5, KVT_META_KEY_BYTES - 1, KVT_META_KEY_BYTES + 1};
    for (size_t i = 0; i < sizeof(klens) / sizeof(klens[0]); i++) {
        out = sentinel;
        assert_false(kvt_meta_rec_decode(k, klens[i], v, KVT_META_VAL_BYTES, &out));
        assert_memory_equal(&out, &sentinel, sizeof(out));
    }
    const size_t vlens[] = {0, 1, 17, KVT_META_VAL_BYTES - 1, KVT_META_VAL_BYTES + 1};
    for (size_t i = 0; i < sizeof(vlens) / sizeof(vlens[0]); i++) {
        out = sentinel;
        assert_false(kvt_meta_rec_decode(k, KVT_META_KEY_BYTES, v, vlens[i], &out));
        assert_memory_equal(&out, &sentinel, sizeof(out));
    }
    /* wrong tag */
    const uint8_t tags[] = {0, 'a', 'c', 'n', 's', 'B'};
    for (size_t i = 0; i < sizeof(tags); i++) {
        k[0] = tags[i];
        out = sentinel;
        assert_false(kvt_meta_rec_decode(k, KVT_META_KEY_BYTES, v, KVT_META_VAL_BYTES, &out));
        assert_memory_equal(&out, &sentinel, sizeof(out));
    }
    k[0] = 'b';
    /* wrong version */
    const uint8_t versions[] = {0, 2, 255};
    for (size_t i = 0; i < sizeof(versions); i++) {
        v[0] = versions[i];
        out = sentinel;
        assert_false(kvt_meta_rec_decode(k, KVT_META_KEY_BYTES, v, KVT_META_VAL_BYTES, &out));
        assert_memory_equal(&out, &sentinel, sizeof(out));
    }
}

/* ---- the store against a model ---- */

/* The model: an unsorted array of the records the store should hold. */
typedef struct model {
    kvt_meta_rec_t r[4096];
    size_t n;
} model_t;

static ptrdiff_t model_find(const model_t *md, uint32_t ns, uint64_t key)
{
    for (size_t i = 0; i < md->n; i++)
        if (md->r[i].ns == ns && md->r[i].key == key)
            return (ptrdiff_t)i;
    return -1;
}

static void model_del(model_t *md, uint32_t ns, uint64_t key)
{
    ptrdiff_t i = model_find(md, ns, key);
    if (i >= 0)
        md->r[i] = md->r[--md->n];
}

static void model_put(model_t *md, const kvt_meta_rec_t *r)
{
    ptrdiff_t i = model_find(md, r->ns, r->key);
    if (i >= 0) {
        md->r[i] = *r;
        return;
    }
    assert_true(md->n < sizeof(md->r) / sizeof(md->r[0]));
    md->r[md->n++] = *r;
}

static void model_check(model_t *md, kvt_meta_t *m)
{
    qsort(md->r, md->n, sizeof(md->r[0]), rec_cmp);
    uint64_t bad = 99;
    scanned_t s = must_scan(m, 0, &bad);
    assert_int_equal(bad, 0);
    assert_int_equal(s.n, md->n);
    for (size_t i = 0; i < s.n; i++)
        if (!rec_eq(&s.r[i], &md->r[i]))
            fail_msg("record %zu: got ns %u key %" PRIx64 " gen %" PRIu64
                     ", want ns %u key %" PRIx64 " gen %" PRIu64,
                     i, s.r[i].ns, s.r[i].key, s.r[i].gen, md->r[i].ns, md->r[i].key, md->r[i].gen);
    free(s.r);
}

static void test_model(void **state)
{
    (void)state;
    char dir[256];
    dir_new(dir, sizeof(dir));
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&cfg);
    static model_t md;
    md.n = 0;
    model_check(&md, m); /* a new store is empty */
    uint32_t ns[3] = {must_ns(m, "llama", 5), must_ns(m, "qwen", 4), must_ns(m, "m3", 2)};
    kvt_rng_t rng;
    kvt_rng_init(&rng, 2);
    uint64_t gen = 0;
    kvt_meta_rec_t put[200], del[100];
    for (int batch = 0; batch < 10; batch++) {
        size_t nput = kvt_rng_below(&rng, 200), ndel = kvt_rng_below(&rng, 100);
        /* deletes: mostly keys the model holds, some it does not */
        for (size_t i = 0; i < ndel; i++) {
            if (md.n > 0 && kvt_rng_below(&rng, 4) != 0) {
                del[i] = md.r[kvt_rng_below(&rng, md.n)];
            } else {
                del[i] = (kvt_meta_rec_t){.ns = ns[kvt_rng_below(&rng, 3)],
                                          .key = kvt_rng_below(&rng, 600)};
            }
        }
        /* puts: small keys (overwrites), keys with the top bit set (order is unsigned) */
        for (size_t i = 0; i < nput; i++) {
            put[i] = rec_random(&rng);
            put[i].ns = ns[kvt_rng_below(&rng, 3)];
            put[i].key = kvt_rng_below(&rng, 600) | (kvt_rng_below(&rng, 4) == 0 ? 1ull << 63 : 0);
            put[i].gen = ++gen;
            if (ndel > 0 && kvt_rng_below(&rng, 10) == 0) { /* deleted and put: ends up put */
                put[i].ns = del[0].ns;
                put[i].key = del[0].key;
            }
        }
        must_write(m, put, nput, del, ndel);
        for (size_t i = 0; i < ndel; i++)
            model_del(&md, del[i].ns, del[i].key);
        for (size_t i = 0; i < nput; i++)
            model_put(&md, &put[i]);
        if (batch % 3 == 0)
            model_check(&md, m);
    }
    must_write(m, NULL, 0, NULL, 0); /* nothing to do */
    model_check(&md, m);
    assert_true(md.n > 300);
    kvt_meta_close(m);
    m = must_open(&cfg);
    model_check(&md, m);
    kvt_meta_close(m);
}

/* ---- a writer killed after acknowledged writes ---- */

/* The child: opens @dir and writes batches of CRASH_BATCH records, batch b
 * holding keys b * CRASH_BATCH + j with gen b, acknowledging each on @fd once
 * kvt_meta_write() returned; until killed. */
static int child_write(const char *dir, int fd)
{
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = NULL;
    char err[512];
    if (kvt_meta_open(&cfg, &m, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "child: %s\n", err);
        return 1;
    }
    kvt_meta_rec_t put[CRASH_BATCH];
    for (uint32_t b = 0; b < 100000; b++) {
        for (uint32_t j = 0; j < CRASH_BATCH; j++)
            put[j] = (kvt_meta_rec_t){.ns = 1,
                                      .key = (uint64_t)b * CRASH_BATCH + j,
                                      .slot = b,
                                      .len = j,
                                      .sum = ~(uint64_t)b,
                                      .gen = b};
        if (kvt_meta_write(m, put, CRASH_BATCH, NULL, 0, err, sizeof(err)) != KVT_OK) {
            fprintf(stderr, "child: %s\n", err);
            return 1;
        }
        if (write(fd, &b, sizeof(b)) != sizeof(b))
            return 1;
    }
    return 0;
}

/* Runs this binary as a child in @mode on @dir, passing it @fd, and @stdin_fd
 * as its stdin when not -1. The test's pipes are all close-on-exec, so that the
 * child holds no end it was not given. */
static pid_t child_spawn(const char *mode, const char *dir, int fd, int stdin_fd)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char fds[16];
        snprintf(fds, sizeof(fds), "%d", fd);
        fcntl(fd, F_SETFD, 0); /* the one pipe end it keeps: the others close */
        if (stdin_fd >= 0)
            dup2(stdin_fd, 0);
        execl("/proc/self/exe", "test_meta", mode, dir, fds, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void test_crash_keeps_acknowledged(void **state)
{
    (void)state;
    char dir[256];
    dir_new(dir, sizeof(dir));
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = child_spawn("--child-write", dir, p[1], -1);
    close(p[1]);
    uint32_t acked = 0, b;
    size_t nacks = 0;
    while (nacks < 20) {
        ssize_t n = read(p[0], &b, sizeof(b));
        if (n != sizeof(b))
            fail_msg("the writer child stopped after %zu acks", nacks);
        assert_int_equal(b, nacks);
        acked = b;
        nacks++;
    }
    kill(pid, SIGKILL);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    close(p[0]);

    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&cfg);
    uint64_t bad = 99;
    scanned_t s = must_scan(m, 0, &bad);
    assert_int_equal(bad, 0);
    /* whole batches 0..k, k at least the last acknowledged: nothing torn */
    assert_int_equal(s.n % CRASH_BATCH, 0);
    assert_true(s.n >= (size_t)(acked + 1) * CRASH_BATCH);
    for (size_t i = 0; i < s.n; i++) {
        uint32_t bb = (uint32_t)(i / CRASH_BATCH), j = (uint32_t)(i % CRASH_BATCH);
        kvt_meta_rec_t want = {
            .ns = 1, .key = i, .slot = bb, .len = j, .sum = ~(uint64_t)bb, .gen = bb};
        assert_true(rec_eq(&s.r[i], &want));
    }
    fprintf(stderr, "crash: %u batches acknowledged, %zu found after kill -9\n", acked + 1,
            s.n / CRASH_BATCH);
    free(s.r);
    kvt_meta_close(m);
}

/* ---- the lock ---- */

/* The child: opens @dir, says 'r' on @fd (or 'f' when the open failed), holds it
 * until its stdin closes. */
static int child_hold(const char *dir, int fd)
{
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = NULL;
    char err[512];
    if (kvt_meta_open(&cfg, &m, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "child: %s\n", err);
        return write(fd, "f", 1) == 1 ? 1 : 2;
    }
    if (write(fd, "r", 1) != 1)
        return 1;
    char c;
    while (read(0, &c, 1) > 0)
        ;
    kvt_meta_close(m);
    return 0;
}

static void test_lock_same_process(void **state)
{
    (void)state;
    char dir[256], err[512];
    dir_new(dir, sizeof(dir));
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&cfg);
    assert_int_equal(try_open(&cfg, err, sizeof(err)), KVT_ERR_EXISTS);
    assert_non_null(strstr(err, "in use by another kvtierd"));
    assert_non_null(strstr(err, dir));
    kvt_meta_close(m);
    m = must_open(&cfg); /* released on close */
    kvt_meta_close(m);
}

static void test_lock_other_process(void **state)
{
    (void)state;
    char dir[256], err[512];
    dir_new(dir, sizeof(dir));
    int ready[2], hold[2];
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    assert_int_equal(pipe2(hold, O_CLOEXEC), 0);
    pid_t pid = child_spawn("--child-hold", dir, ready[1], hold[0]);
    close(ready[1]);
    close(hold[0]);
    char c = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, 'r');
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    assert_int_equal(try_open(&cfg, err, sizeof(err)), KVT_ERR_EXISTS);
    assert_non_null(strstr(err, "in use by another kvtierd"));
    close(hold[1]); /* the child closes and exits */
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    close(ready[0]);
    kvt_meta_t *m = must_open(&cfg);
    kvt_meta_close(m);
}

/* ---- the store record ---- */

static void test_store_mismatch(void **state)
{
    (void)state;
    char dir[256], err[512];
    dir_new(dir, sizeof(dir));
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&cfg);
    kvt_meta_rec_t r = {
        .ns = must_ns(m, "x", 1), .key = 5, .slot = 6, .len = 7, .sum = 8, .gen = 9};
    must_write(m, &r, 1, NULL, 0);
    kvt_meta_close(m);

    kvt_meta_cfg_t other = cfg_of(dir, STORE_B, false);
    assert_int_equal(try_open(&other, err, sizeof(err)), KVT_ERR_EXISTS);
    assert_non_null(strstr(err, "another disk store"));
    assert_non_null(strstr(err, "0123456789abcdef"));
    assert_non_null(strstr(err, "fedcba9876543210"));
    assert_non_null(strstr(err, "--disk-path"));
    other = cfg_of(dir, STORE_A, false);
    other.slot_bytes = SLOT_BYTES / 2;
    assert_int_equal(try_open(&other, err, sizeof(err)), KVT_ERR_EXISTS);
    other = cfg_of(dir, STORE_A, false);
    other.nslots = NSLOTS + 1;
    assert_int_equal(try_open(&other, err, sizeof(err)), KVT_ERR_EXISTS);

    /* the refusals changed nothing */
    m = must_open(&cfg);
    scanned_t s = must_scan(m, 0, NULL);
    assert_int_equal(s.n, 1);
    assert_true(rec_eq(&s.r[0], &r));
    free(s.r);
    kvt_meta_close(m);
}

static void test_fresh_disk(void **state)
{
    (void)state;
    char dir[256], err[512];
    dir_new(dir, sizeof(dir));
    kvt_meta_cfg_t a = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&a);
    uint32_t n1 = must_ns(m, "one", 3), n2 = must_ns(m, "two", 3);
    kvt_meta_rec_t r[2] = {{.ns = n1, .key = 1, .len = 10}, {.ns = n2, .key = 2, .len = 20}};
    must_write(m, r, 2, NULL, 0);
    kvt_meta_close(m);

    /* a new disk B in the place of A: block records go, namespaces stay */
    kvt_meta_cfg_t b = cfg_of(dir, STORE_B, true);
    m = must_open(&b);
    scanned_t s = must_scan(m, 0, NULL);
    assert_int_equal(s.n, 0);
    free(s.r);
    assert_int_equal(must_ns(m, "two", 3), n2);
    assert_int_equal(must_ns(m, "one", 3), n1);
    assert_int_equal(must_ns(m, "three", 5), n2 + 1);
    must_write(m, r, 1, NULL, 0);
    kvt_meta_close(m);

    /* B's records are B's now */
    b.fresh_disk = false;
    m = must_open(&b);
    s = must_scan(m, 0, NULL);
    assert_int_equal(s.n, 1);
    assert_true(rec_eq(&s.r[0], &r[0]));
    free(s.r);
    kvt_meta_close(m);
    assert_int_equal(try_open(&a, err, sizeof(err)), KVT_ERR_EXISTS);

    /* fresh with the same id drops them too */
    b.fresh_disk = true;
    m = must_open(&b);
    s = must_scan(m, 0, NULL);
    assert_int_equal(s.n, 0);
    free(s.r);
    kvt_meta_close(m);
}

/* ---- directories ---- */

/* The child: becomes nobody, opens @dir, writes its status (int32) and error text on @fd. */
static int child_ro(const char *dir, int fd)
{
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) {
        perror("child: becoming nobody");
        return 1;
    }
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = NULL;
    char err[512] = "";
    int32_t st = kvt_meta_open(&cfg, &m, err, sizeof(err));
    if (st == KVT_OK)
        kvt_meta_close(m);
    size_t n = strlen(err);
    if (write(fd, &st, sizeof(st)) != sizeof(st) || write(fd, err, n) != (ssize_t)n)
        return 1;
    return 0;
}

/* kvt_meta_open()'s status on @dir for a user the directory's mode applies to: this
 * process, or when it is root a child that has become nobody. */
static kvt_status_t ro_open(const char *dir, char *err, size_t errlen)
{
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    if (geteuid() != 0)
        return try_open(&cfg, err, errlen);
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = child_spawn("--child-ro", dir, p[1], -1);
    close(p[1]);
    int32_t st = 1;
    assert_int_equal(read(p[0], &st, sizeof(st)), sizeof(st));
    ssize_t n = read(p[0], err, errlen - 1);
    assert_true(n > 0);
    err[n] = '\0';
    close(p[0]);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    return (kvt_status_t)st;
}

static void test_bad_dirs(void **state)
{
    (void)state;
    char dir[300], err[512];
    snprintf(dir, sizeof(dir), "%s/missing/data", g_base);
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    assert_int_equal(try_open(&cfg, err, sizeof(err)), KVT_ERR_IO);
    assert_non_null(strstr(err, "cannot create"));
    assert_non_null(strstr(err, dir));

    snprintf(dir, sizeof(dir), "%s/plain_file", g_base);
    FILE *f = fopen(dir, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(try_open(&cfg, err, sizeof(err)), KVT_ERR_IO);
    assert_non_null(strstr(err, "not a directory"));

    cfg.dir = "";
    assert_int_equal(try_open(&cfg, err, sizeof(err)), KVT_ERR_INVAL);

    /* corruption RocksDB reports */
    dir_new(dir, sizeof(dir));
    cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_close(must_open(&cfg));
    char path[400];
    snprintf(path, sizeof(path), "%s/CURRENT", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("garbage", f); /* no newline: RocksDB calls that corruption */
    fclose(f);
    assert_int_equal(try_open(&cfg, err, sizeof(err)), KVT_ERR_INTERNAL);
    assert_non_null(strstr(err, "Corruption"));

    /* read-only: a fresh one, and one holding a database (mode 0555 does not stop root:
     * as root the open runs in a child that has become nobody) */
    assert_int_equal(chmod(g_base, 0711), 0);
    dir_new(dir, sizeof(dir));
    assert_int_equal(mkdir(dir, 0555), 0);
    assert_int_equal(ro_open(dir, err, sizeof(err)), KVT_ERR_IO);
    assert_non_null(strstr(err, "Permission denied"));
    assert_non_null(strstr(err, dir));
    dir_new(dir, sizeof(dir));
    cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_close(must_open(&cfg));
    assert_int_equal(chmod(dir, 0555), 0);
    assert_int_equal(ro_open(dir, err, sizeof(err)), KVT_ERR_IO);
    assert_non_null(strstr(err, dir));
    assert_int_equal(chmod(g_base, 0700), 0);
}

/* ---- namespaces ---- */

static void test_namespaces(void **state)
{
    (void)state;
    char dir[256], err[512];
    dir_new(dir, sizeof(dir));
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&cfg);
    size_t len = 0;
    assert_null(kvt_meta_ns_name(m, 1, &len));
    assert_int_equal(must_ns(m, "alpha", 5), 1);
    assert_int_equal(must_ns(m, "beta", 4), 2);
    assert_int_equal(must_ns(m, "alpha", 5), 1);
    assert_int_equal(must_ns(m, "alph", 4), 3); /* a prefix is another name */
    assert_int_equal(must_ns(m, "a\0b", 3), 4); /* names are bytes */
    assert_int_equal(must_ns(m, "a", 1), 5);

    uint32_t id = 77;
    static char big[KVT_META_NS_MAX + 1];
    memset(big, 'z', sizeof(big));
    assert_int_equal(kvt_meta_ns(m, big, 0, &id, err, sizeof(err)), KVT_ERR_INVAL);
    assert_int_equal(kvt_meta_ns(m, big, KVT_META_NS_MAX + 1, &id, err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_int_equal(id, 77);
    assert_non_null(strstr(err, "namespace"));
    assert_int_equal(must_ns(m, big, KVT_META_NS_MAX), 6);
    /* enough to grow the tables several times */
    char name[32];
    for (uint32_t i = 0; i < 300; i++) {
        int n = snprintf(name, sizeof(name), "model-%u", i);
        assert_int_equal(must_ns(m, name, (size_t)n), 7 + i);
    }
    for (int round = 0; round < 2; round++) {
        const char *s = kvt_meta_ns_name(m, 4, &len);
        assert_non_null(s);
        assert_int_equal(len, 3);
        assert_memory_equal(s, "a\0b", 3);
        s = kvt_meta_ns_name(m, 6, &len);
        assert_int_equal(len, KVT_META_NS_MAX);
        assert_memory_equal(s, big, KVT_META_NS_MAX);
        for (uint32_t i = 0; i < 300; i++) {
            int n = snprintf(name, sizeof(name), "model-%u", i);
            s = kvt_meta_ns_name(m, 7 + i, &len);
            assert_non_null(s);
            assert_int_equal(len, (size_t)n);
            assert_memory_equal(s, name, len);
            assert_int_equal(must_ns(m, name, (size_t)n), 7 + i);
        }
        assert_null(kvt_meta_ns_name(m, 0, &len));
        assert_null(kvt_meta_ns_name(m, 307, &len));
        assert_null(kvt_meta_ns_name(m, UINT32_MAX, &len));
        /* the same ids after a reopen, and new ones after them */
        kvt_meta_close(m);
        m = must_open(&cfg);
        assert_int_equal(must_ns(m, "alpha", 5), 1);
        assert_int_equal(must_ns(m, "a", 1), 5);
    }
    assert_int_equal(must_ns(m, "late", 4), 307);
    assert_int_equal(must_ns(m, "later", 5), 308);
    kvt_meta_close(m);
}

/* ---- scan ---- */

static void test_scan_stop(void **state)
{
    (void)state;
    char dir[256];
    dir_new(dir, sizeof(dir));
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&cfg);
    uint32_t ns = must_ns(m, "n", 1);
    kvt_meta_rec_t r[100];
    for (int i = 0; i < 100; i++)
        r[i] = (kvt_meta_rec_t){.ns = ns, .key = 1000 - (uint64_t)i * 7, .gen = (uint64_t)i};
    must_write(m, r, 100, NULL, 0);
    uint64_t bad = 99;
    scanned_t s = must_scan(m, 10, &bad);
    assert_int_equal(s.n, 10);
    assert_int_equal(bad, 0);
    for (int i = 0; i < 10; i++) /* the ten smallest keys, in order */
        assert_true(rec_eq(&s.r[i], &r[99 - i]));
    free(s.r);
    kvt_meta_close(m);
}

/* Restoring 100k records: every one comes back, and the time it took goes to stderr. */
static bool scan_count(void *arg, const kvt_meta_rec_t *r)
{
    uint64_t *n = arg;
    if (r->key != *n || r->gen != *n)
        fail_msg("record %" PRIu64 ": key %" PRIu64 " gen %" PRIu64, *n, r->key, r->gen);
    (*n)++;
    return true;
}

static void test_scan_100k(void **state)
{
    (void)state;
    char dir[256], err[256];
    dir_new(dir, sizeof(dir));
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&cfg);
    uint32_t ns = must_ns(m, "llama", 5);
    static kvt_meta_rec_t r[1000];
    for (uint64_t b = 0; b < 100; b++) {
        for (uint64_t i = 0; i < 1000; i++) {
            uint64_t k = b * 1000 + i;
            r[i] = (kvt_meta_rec_t){
                .ns = ns, .key = k, .slot = (uint32_t)k, .len = 1u << 20, .sum = ~k, .gen = k};
        }
        must_write(m, r, 1000, NULL, 0);
    }
    kvt_meta_close(m);
    uint64_t t0 = kvt_clock_ns();
    m = must_open(&cfg);
    uint64_t t1 = kvt_clock_ns(), n = 0, bad = 99;
    assert_int_equal(kvt_meta_scan(m, scan_count, &n, &bad, err, sizeof(err)), KVT_OK);
    uint64_t t2 = kvt_clock_ns();
    assert_int_equal(n, 100000);
    assert_int_equal(bad, 0);
    fprintf(stderr, "restore: open %.1f ms, scan of 100000 records %.1f ms (%.2f M records/s)\n",
            (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
            1e5 / ((double)(t2 - t1) / 1e9) / 1e6);
    kvt_meta_close(m);
}

/* Writes raw key/value pairs into the RocksDB at @dir (the store closed). */
static void raw_put(const char *dir, const char *const *kv, const size_t *len, size_t n)
{
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    char *e = NULL;
    rocksdb_t *db = rocksdb_open(o, dir, &e);
    if (e != NULL)
        fail_msg("raw open: %s", e);
    for (size_t i = 0; i < n; i++) {
        rocksdb_put(db, wo, kv[2 * i], len[2 * i], kv[2 * i + 1], len[2 * i + 1], &e);
        if (e != NULL)
            fail_msg("raw put: %s", e);
    }
    rocksdb_close(db);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_options_destroy(o);
}

static void test_malformed_records(void **state)
{
    (void)state;
    char dir[256], err[512];
    dir_new(dir, sizeof(dir));
    kvt_meta_cfg_t cfg = cfg_of(dir, STORE_A, false);
    kvt_meta_t *m = must_open(&cfg);
    uint32_t ns = must_ns(m, "good", 4);
    kvt_meta_rec_t r[3] = {{.ns = ns, .key = 1, .gen = 1},
                           {.ns = ns, .key = 3, .gen = 3},
                           {.ns = ns, .key = 5, .gen = 5}};
    must_write(m, r, 3, NULL, 0);
    kvt_meta_close(m);

    uint8_t k[KVT_META_KEY_BYTES + 1] = {0}, v[KVT_META_VAL_BYTES + 1] = {0},
                                   kv2[KVT_META_VAL_BYTES];
    kvt_meta_rec_t r2 = {.ns = ns, .key = 2, .gen = 2}, r4 = {.ns = ns, .key = 4, .gen = 4};
    kvt_meta_key_encode(ns, 2, k);
    kvt_meta_val_encode(&r2, v);
    kvt_meta_val_encode(&r4, kv2);
    uint8_t k4[KVT_META_KEY_BYTES], k6[KVT_META_KEY_BYTES], v6[KVT_META_VAL_BYTES];
    kvt_meta_key_encode(ns, 4, k4);
    kvt_meta_key_encode(ns, 6, k6);
    memcpy(v6, kv2, sizeof(v6));
    v6[0] = 2; /* a version this code does not know */
    const char *kv[] = {
        (const char *)k,
        (const char *)v, /* key 12 bytes */
        (const char *)k4,
        (const char *)kv2, /* fine, written past the store */
        (const char *)k4,
        (const char *)kv2, /* again: a put over it */
        (const char *)k6,
        (const char *)v6, /* version 2 */
        "b\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07\x00",
        (const char *)kv2, /* key 14 bytes */
        "b\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x08",
        (const char *)v, /* value 26 bytes */
        "b\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x09",
        (const char *)v, /* value 24 bytes */
        "n\x00\x00\x00",
        "short key", /* a namespace record with a 4-byte key */
        "n\x00\x00\x00\x09",
        "", /* namespace 9, empty name */
        "n\x00\x00\x00\x08",
        "good", /* namespace 8, a name already taken */
    };
    const size_t len[] = {KVT_META_KEY_BYTES - 1,
                          KVT_META_VAL_BYTES,
                          KVT_META_KEY_BYTES,
                          KVT_META_VAL_BYTES,
                          KVT_META_KEY_BYTES,
                          KVT_META_VAL_BYTES,
                          KVT_META_KEY_BYTES,
                          KVT_META_VAL_BYTES,
                          KVT_META_KEY_BYTES + 1,
                          KVT_META_VAL_BYTES,
                          KVT_META_KEY_BYTES,
                          KVT_META_VAL_BYTES + 1,
                          KVT_META_KEY_BYTES,
                          KVT_META_VAL_BYTES - 1,
                          4,
                          9,
                          5,
                          0,
                          5,
                          4};
    raw_put(dir, kv, len, sizeof(len) / sizeof(len[0]) / 2);

    m = must_open(&cfg);
    uint64_t bad = 0;
    scanned_t s = must_scan(m, 0, &bad);
    assert_int_equal(bad, 5);
    assert_int_equal(s.n, 4);
    assert_true(rec_eq(&s.r[0], &r[0]));
    assert_true(rec_eq(&s.r[1], &r[1]));
    assert_true(rec_eq(&s.r[2], &r4));
    assert_true(rec_eq(&s.r[3], &r[2]));
    free(s.r);
    /* the skipped namespaces: unknown, their ids never given out again */
    size_t nl;
    assert_null(kvt_meta_ns_name(m, 9, &nl));
    assert_null(kvt_meta_ns_name(m, 8, &nl));
    const char *name = kvt_meta_ns_name(m, ns, &nl);
    assert_non_null(name);
    assert_int_equal(nl, 4);
    assert_int_equal(must_ns(m, "good", 4), ns);
    assert_int_equal(must_ns(m, "next", 4), 10);
    kvt_meta_close(m);

    /* a malformed store record is corruption, unless the disk is new */
    const char *skv[] = {"s", "\x01short"};
    const size_t slen[] = {1, 6};
    raw_put(dir, skv, slen, 1);
    assert_int_equal(try_open(&cfg, err, sizeof(err)), KVT_ERR_INTERNAL);
    assert_non_null(strstr(err, "store record"));
    cfg.fresh_disk = true;
    m = must_open(&cfg);
    kvt_meta_close(m);
    cfg.fresh_disk = false;
    m = must_open(&cfg);
    assert_int_equal(must_ns(m, "next", 4), 10);
    kvt_meta_close(m);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--child-write") == 0)
        return child_write(argv[2], atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "--child-hold") == 0)
        return child_hold(argv[2], atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "--child-ro") == 0)
        return child_ro(argv[2], atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_layout),
        cmocka_unit_test(test_codec_round_trip),
        cmocka_unit_test(test_codec_refusals),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_crash_keeps_acknowledged),
        cmocka_unit_test(test_lock_same_process),
        cmocka_unit_test(test_lock_other_process),
        cmocka_unit_test(test_store_mismatch),
        cmocka_unit_test(test_fresh_disk),
        cmocka_unit_test(test_bad_dirs),
        cmocka_unit_test(test_namespaces),
        cmocka_unit_test(test_scan_stop),
        cmocka_unit_test(test_scan_100k),
        cmocka_unit_test(test_malformed_records),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
