/*
 * kvindex/hash: the hashing standard against an independent Python
 * implementation (tests/fixtures/hash_vectors.py, xxhash module), against
 * vectors fixed in this file, and its chaining properties; the same for
 * cache-salted chains (kvt_hash_salt_seed, kvt_hash_seq_salted[_le]) and for
 * LoRA keys as NVIDIA Dynamo computes them (kvt_hash_lora_seed,
 * kvt_hash_seeds_lora, kvt_hash_seq_seeds[_le]; kvtierd --lora-keys dynamo).
 *
 * Without /usr/bin/python3 + xxhash the fixed tests still run; the program
 * then exits 77 (skip) because the vector comparison could not run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/errtext.h"
#include "kvindex/hash.h"
#include "tests/support/rng.h"

#define PYTHON "/usr/bin/python3"

#define MAX_SALT 255

typedef struct vec {
    uint32_t block_size;
    uint64_t seed;
    unsigned char salt[MAX_SALT]; /* cache salt; salt_len 0: none */
    size_t salt_len;
    unsigned char lora[MAX_SALT]; /* LoRA name, keyed Dynamo's way; lora_len 0: none */
    size_t lora_len;
    size_t ntokens;
    size_t nblocks;
    uint32_t *tokens;
    uint64_t *local;
    uint64_t *seq;
} vec_t;

static vec_t *g_vecs;
static size_t g_nvecs;

/* ---- fixture loading ------------------------------------------------------------------ */

static char g_fixture[4096];

/* Finds hash_vectors.py: $KVT_SOURCE_DIR (set by ctest), else next to this source file. */
static int find_fixture(void)
{
    const char *src = getenv("KVT_SOURCE_DIR");
    if (src != NULL && src[0] != '\0') {
        snprintf(g_fixture, sizeof(g_fixture), "%s/tests/fixtures/hash_vectors.py", src);
    } else {
        const char *self = __FILE__;
        const char *tail = strstr(self, "tests/unit/test_hash.c");
        if (tail == NULL)
            return -1;
        snprintf(g_fixture, sizeof(g_fixture), "%.*stests/fixtures/hash_vectors.py",
                 (int)(tail - self), self);
    }
    return access(g_fixture, R_OK) == 0 && strchr(g_fixture, '\'') == NULL ? 0 : -1;
}

/* Returns NULL when python or its xxhash module is unusable, with the reason in @err. */
static FILE *open_fixture(const char *args, char *err, size_t errlen)
{
    char cmd[8192];

    if (access(PYTHON, X_OK) != 0) {
        kvt_errf(err, errlen, "%s is missing", PYTHON);
        return NULL;
    }
    if (find_fixture() != 0) {
        kvt_errf(err, errlen, "cannot find tests/fixtures/hash_vectors.py (set KVT_SOURCE_DIR)");
        return NULL;
    }
    snprintf(cmd, sizeof(cmd), PYTHON " '%s' --check", g_fixture);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
        kvt_errf(err, errlen, "%s cannot import xxhash (python3-xxhash missing)", PYTHON);
        return NULL;
    }
    snprintf(cmd, sizeof(cmd), PYTHON " '%s' %s", g_fixture, args);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        kvt_errf(err, errlen, "cannot run %s: %s", PYTHON, strerror(errno));
    return f;
}

static int read_u64(FILE *f, uint64_t *v)
{
    return fscanf(f, "%" SCNu64, v) == 1 ? 0 : -1;
}

/* Reads a salt or LoRA word into @buf (MAX_SALT bytes): "-" (none) or its bytes in hex. */
static int read_hex(FILE *f, unsigned char *buf, size_t *len_p)
{
    char hex[2 * MAX_SALT + 2];
    if (fscanf(f, "%511s", hex) != 1)
        return -1;
    *len_p = 0;
    if (strcmp(hex, "-") == 0)
        return 0;
    size_t n = strlen(hex);
    if (n % 2 != 0 || n / 2 > MAX_SALT)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned b;
        if (sscanf(hex + 2 * i, "%2x", &b) != 1)
            return -1;
        buf[i] = (unsigned char)b;
    }
    *len_p = n / 2;
    return 0;
}

/*
 * Loads the vectors. Returns 1 when loaded, 0 when python is unusable (skip,
 * reason in @err), -1 when the fixture ran but its output is malformed (fail).
 */
static int load_vectors(char *err, size_t errlen)
{
    FILE *f = open_fixture("--vectors --format c", err, errlen);
    char word[32];
    unsigned version;
    size_t count;

    if (f == NULL)
        return 0;
    if (fscanf(f, "%31s %u", word, &version) != 2 || strcmp(word, "kvtier-hash-vectors") != 0 ||
        version != 3)
        goto err_close;
    if (fscanf(f, "%31s %zu", word, &count) != 2 || strcmp(word, "count") != 0 || count == 0)
        goto err_close;
    g_vecs = calloc(count, sizeof(*g_vecs));
    if (g_vecs == NULL)
        goto err_close;
    for (size_t i = 0; i < count; i++) {
        vec_t *v = &g_vecs[i];
        uint64_t bs;
        if (fscanf(f, "%31s", word) != 1 || strcmp(word, "vec") != 0)
            goto err_close;
        if (read_u64(f, &bs) != 0 || read_u64(f, &v->seed) != 0 ||
            fscanf(f, "%zu %zu", &v->ntokens, &v->nblocks) != 2 ||
            read_hex(f, v->salt, &v->salt_len) != 0 || read_hex(f, v->lora, &v->lora_len) != 0 ||
            bs == 0 || bs > UINT32_MAX)
            goto err_close;
        v->block_size = (uint32_t)bs;
        v->tokens = malloc((v->ntokens + 1) * sizeof(uint32_t));
        v->local = malloc((v->nblocks + 1) * sizeof(uint64_t));
        v->seq = malloc((v->nblocks + 1) * sizeof(uint64_t));
        g_nvecs = i + 1;
        if (v->tokens == NULL || v->local == NULL || v->seq == NULL)
            goto err_close;
        for (size_t j = 0; j < v->ntokens; j++) {
            uint64_t t;
            if (read_u64(f, &t) != 0 || t > UINT32_MAX)
                goto err_close;
            v->tokens[j] = (uint32_t)t;
        }
        for (size_t j = 0; j < v->nblocks; j++)
            if (read_u64(f, &v->local[j]) != 0)
                goto err_close;
        for (size_t j = 0; j < v->nblocks; j++)
            if (read_u64(f, &v->seq[j]) != 0)
                goto err_close;
    }
    if (fscanf(f, "%31s", word) != 1 || strcmp(word, "end") != 0)
        goto err_close;
    if (pclose(f) != 0) {
        kvt_errf(err, errlen, "hash_vectors.py failed");
        return -1;
    }
    return 1;

err_close:
    pclose(f);
    kvt_errf(err, errlen, "malformed output from hash_vectors.py (vector %zu)", g_nvecs);
    return -1;
}

static void free_vectors(void)
{
    for (size_t i = 0; i < g_nvecs; i++) {
        free(g_vecs[i].tokens);
        free(g_vecs[i].local);
        free(g_vecs[i].seq);
    }
    free(g_vecs);
    g_vecs = NULL;
    g_nvecs = 0;
}

/* ---- tests ---------------------------------------------------------------------------- */

#define SENTINEL UINT64_C(0xa5a5a5a5a5a5a5a5)

/* Outputs for vector @v (room for a SENTINEL past its blocks) and its tokens as
 * little-endian bytes at an odd address (le + 1), as an RPC frame may hold them. */
typedef struct scratch {
    uint64_t *local, *seq;
    unsigned char *le;
} scratch_t;

static void scratch_init(scratch_t *x, const vec_t *v)
{
    x->local = malloc((v->nblocks + 1) * sizeof(uint64_t));
    x->seq = malloc((v->nblocks + 1) * sizeof(uint64_t));
    x->le = malloc(v->ntokens * 4 + 2);
    assert_non_null(x->local);
    assert_non_null(x->seq);
    assert_non_null(x->le);
    x->local[v->nblocks] = x->seq[v->nblocks] = SENTINEL;
    for (size_t i = 0; i < v->ntokens; i++)
        for (int b = 0; b < 4; b++)
            x->le[1 + 4 * i + (size_t)b] = (unsigned char)(v->tokens[i] >> (8 * b));
}

static void scratch_free(scratch_t *x)
{
    free(x->local);
    free(x->seq);
    free(x->le);
}

/* @n blocks were written: @v's count, its keys (and local hashes unless NULL), nothing past. */
static void assert_vector_out(const vec_t *v, size_t n, const uint64_t *local, const uint64_t *seq)
{
    assert_int_equal(n, v->nblocks);
    if (local != NULL) {
        assert_memory_equal(local, v->local, n * sizeof(uint64_t));
        assert_int_equal(local[n], SENTINEL);
    }
    assert_memory_equal(seq, v->seq, n * sizeof(uint64_t));
    assert_int_equal(seq[n], SENTINEL);
}

/* A salted vector: kvt_hash_seq_salted() and its _le twin, keys only and with a parent. */
static void check_salted_vector(const vec_t *v)
{
    scratch_t x;
    scratch_init(&x, v);
    assert_int_equal(v->seed, KVT_HASH_SEED);
    uint64_t first = kvt_hash_salt_seed(v->salt, v->salt_len);
    assert_int_equal(first, XXH3_64bits_withSeed(v->salt, v->salt_len, KVT_HASH_SEED));

    size_t n =
        kvt_hash_seq_salted(v->tokens, v->ntokens, v->block_size, first, NULL, x.local, x.seq);
    assert_vector_out(v, n, x.local, x.seq);
    if (n > 0)
        assert_int_equal(kvt_hash_block(v->tokens, v->block_size, first), v->local[0]);
    /* From little-endian bytes at an odd address (an RPC frame), keys only. */
    n = kvt_hash_seq_salted_le(x.le + 1, v->ntokens, v->block_size, first, NULL, NULL, x.seq);
    assert_vector_out(v, n, NULL, x.seq);
    /* Only block 0 carries the salt: the rest continues with the standard seed. */
    if (v->nblocks >= 2) {
        n = kvt_hash_seq(v->tokens + v->block_size, v->ntokens - v->block_size, v->block_size,
                         KVT_HASH_SEED, &v->seq[0], NULL, x.seq);
        assert_int_equal(n, v->nblocks - 1);
        assert_memory_equal(x.seq, v->seq + 1, n * sizeof(uint64_t));
    }
    scratch_free(&x);
}

/*
 * A vector on the standard seed through kvt_hash_seeds_lora() and the general loop
 * kvt_hash_seq_seeds[_le] (the only path for a LoRA keyed Dynamo's way; without a
 * LoRA it must agree with the standard's fast paths): keys and local hashes, from
 * LE bytes at an odd address, and the chain continued from block 0's key.
 */
static void check_seeds_vector(const vec_t *v)
{
    scratch_t x;
    scratch_init(&x, v);
    assert_int_equal(v->seed, KVT_HASH_SEED);
    kvt_hash_seeds_t s;
    kvt_hash_seeds_lora(v->salt, v->salt_len, v->lora, v->lora_len, &s);
    uint64_t term = v->lora_len > 0 ? XXH3_64bits_withSeed(v->lora, v->lora_len, 0) : 0;
    assert_int_equal(s.block, KVT_HASH_SEED + term);
    assert_int_equal(s.block, kvt_hash_lora_seed(v->lora, v->lora_len));
    assert_int_equal(s.first, kvt_hash_salt_seed(v->salt, v->salt_len) + term);
    assert_int_equal(s.chain, KVT_HASH_SEED);

    size_t n = kvt_hash_seq_seeds(v->tokens, v->ntokens, v->block_size, &s, NULL, x.local, x.seq);
    assert_vector_out(v, n, x.local, x.seq);
    n = kvt_hash_seq_seeds_le(x.le + 1, v->ntokens, v->block_size, &s, NULL, NULL, x.seq);
    assert_vector_out(v, n, NULL, x.seq);
    /* Block 0 alone carries the salt; a continued chain takes the block seed from block 0 on. */
    if (v->nblocks >= 2) {
        kvt_hash_seeds_t cont = {s.block, s.block, s.chain};
        n = kvt_hash_seq_seeds(v->tokens + v->block_size, v->ntokens - v->block_size, v->block_size,
                               &cont, &v->seq[0], x.local, x.seq);
        assert_int_equal(n, v->nblocks - 1);
        assert_memory_equal(x.seq, v->seq + 1, n * sizeof(uint64_t));
        assert_memory_equal(x.local, v->local + 1, n * sizeof(uint64_t));
    }
    scratch_free(&x);
}

static void test_python_vectors(void **state)
{
    (void)state;
    assert_true(g_nvecs >= 60);
    size_t salted = 0, lora = 0;
    for (size_t i = 0; i < g_nvecs; i++) {
        const vec_t *v = &g_vecs[i];
        if (v->seed == KVT_HASH_SEED)
            check_seeds_vector(v);
        if (v->lora_len > 0) {
            lora++;
            continue;
        }
        if (v->salt_len > 0) {
            check_salted_vector(v);
            salted++;
            continue;
        }
        uint64_t *local = malloc((v->nblocks + 1) * sizeof(uint64_t));
        uint64_t *seq = malloc((v->nblocks + 1) * sizeof(uint64_t));
        uint64_t *seq2 = malloc((v->nblocks + 1) * sizeof(uint64_t));
        assert_non_null(local);
        assert_non_null(seq);
        assert_non_null(seq2);
        local[v->nblocks] = seq[v->nblocks] = seq2[v->nblocks] = SENTINEL;

        size_t n = kvt_hash_seq(v->tokens, v->ntokens, v->block_size, v->seed, NULL, local, seq);
        assert_int_equal(n, v->nblocks);
        assert_int_equal(n, v->ntokens / v->block_size);
        for (size_t j = 0; j < n; j++) {
            assert_int_equal(local[j], v->local[j]);
            assert_int_equal(seq[j], v->seq[j]);
            assert_int_equal(kvt_hash_block(v->tokens + j * v->block_size, v->block_size, v->seed),
                             v->local[j]);
            if (j > 0)
                assert_int_equal(kvt_hash_chain(v->seq[j - 1], v->local[j], v->seed), v->seq[j]);
        }
        assert_int_equal(local[n], SENTINEL);
        assert_int_equal(seq[n], SENTINEL);

        /* Without local_out: same keys. */
        n = kvt_hash_seq(v->tokens, v->ntokens, v->block_size, v->seed, NULL, NULL, seq2);
        assert_int_equal(n, v->nblocks);
        assert_memory_equal(seq2, v->seq, n * sizeof(uint64_t));
        assert_int_equal(seq2[n], SENTINEL);
        /* The salted entry with no salt is the standard. */
        if (v->seed == KVT_HASH_SEED) {
            n = kvt_hash_seq_salted(v->tokens, v->ntokens, v->block_size, kvt_hash_salt_seed("", 0),
                                    NULL, local, seq2);
            assert_int_equal(n, v->nblocks);
            assert_memory_equal(seq2, v->seq, n * sizeof(uint64_t));
            assert_memory_equal(local, v->local, n * sizeof(uint64_t));
        }

        /* Continuing from a parent: the second half chains from the first half's last key. */
        if (v->nblocks >= 2) {
            size_t k = v->nblocks / 2;
            size_t off = k * v->block_size;
            n = kvt_hash_seq(v->tokens + off, v->ntokens - off, v->block_size, v->seed,
                             &v->seq[k - 1], local, seq2);
            assert_int_equal(n, v->nblocks - k);
            assert_memory_equal(seq2, v->seq + k, n * sizeof(uint64_t));
            assert_memory_equal(local, v->local + k, n * sizeof(uint64_t));
        }
        free(local);
        free(seq);
        free(seq2);
    }
    assert_true(salted >= 30);
    assert_true(lora >= 60);
}

/* Vectors computed once by hash_vectors.py and frozen here. */
static void test_fixed_vectors(void **state)
{
    (void)state;
    uint64_t local[4], seq[4];

    const uint32_t t1[] = {1, 2, 3, 4, 5};
    assert_int_equal(kvt_hash_seq(t1, 5, 2, 1337, NULL, local, seq), 2);
    assert_int_equal(local[0], UINT64_C(10773075109927122010));
    assert_int_equal(local[1], UINT64_C(2662118915037317746));
    assert_int_equal(seq[0], UINT64_C(10773075109927122010));
    assert_int_equal(seq[1], UINT64_C(5890102321129957602));

    const uint32_t t2[] = {0, 4294967295u};
    assert_int_equal(kvt_hash_seq(t2, 2, 1, KVT_HASH_SEED, NULL, local, seq), 2);
    assert_int_equal(local[0], UINT64_C(16451421758532862321));
    assert_int_equal(local[1], UINT64_C(3109405589439059943));
    assert_int_equal(seq[1], UINT64_C(4063556673497261720));

    uint32_t t3[48];
    for (uint32_t i = 0; i < 48; i++)
        t3[i] = i + 1;
    assert_int_equal(kvt_hash_seq(t3, 48, 16, KVT_HASH_SEED, NULL, local, seq), 3);
    assert_int_equal(local[0], UINT64_C(16863443419780771464));
    assert_int_equal(local[1], UINT64_C(2287610619914608821));
    assert_int_equal(local[2], UINT64_C(12129935312930971799));
    assert_int_equal(seq[0], UINT64_C(16863443419780771464));
    assert_int_equal(seq[1], UINT64_C(12466389667045779788));
    assert_int_equal(seq[2], UINT64_C(960926348267535642));

    uint32_t t4[32];
    for (uint32_t i = 0; i < 32; i++)
        t4[i] = i;
    assert_int_equal(kvt_hash_seq(t4, 32, 16, 0, NULL, local, seq), 2);
    assert_int_equal(seq[0], UINT64_C(8773583392624668237));
    assert_int_equal(seq[1], UINT64_C(14571380008329203442));
}

/*
 * Dynamo's KV router publishes these for tokens 1..12, block size 4 (its
 * compute_block_hash_for_seq and sequence hashes): kvtier's keys for a base-model
 * text request are exactly Dynamo's, local and chained.
 */
static void test_dynamo_vectors(void **state)
{
    (void)state;
    uint32_t t[12];
    for (uint32_t i = 0; i < 12; i++)
        t[i] = i + 1;
    uint64_t local[3], seq[3];
    assert_int_equal(kvt_hash_seq(t, 12, 4, KVT_HASH_SEED, NULL, local, seq), 3);
    assert_int_equal(local[0], UINT64_C(14643705804678351452));
    assert_int_equal(local[1], UINT64_C(16777012769546811212));
    assert_int_equal(local[2], UINT64_C(483935686894639516));
    assert_int_equal(seq[0], UINT64_C(14643705804678351452));
    assert_int_equal(seq[1], UINT64_C(4945711292740353085));
    assert_int_equal(seq[2], UINT64_C(12583592247330656132));
    /* the same through the little-endian entry (RPC frames) and with an empty salt */
    uint8_t le[48];
    for (int i = 0; i < 12; i++) {
        le[4 * i] = (uint8_t)(i + 1);
        le[4 * i + 1] = le[4 * i + 2] = le[4 * i + 3] = 0;
    }
    uint64_t seq2[3];
    assert_int_equal(kvt_hash_seq_le(le, 12, 4, KVT_HASH_SEED, NULL, NULL, seq2), 3);
    assert_memory_equal(seq2, seq, sizeof(seq));
    assert_int_equal(kvt_hash_seq_salted(t, 12, 4, kvt_hash_salt_seed(NULL, 0), NULL, NULL, seq2),
                     3);
    assert_memory_equal(seq2, seq, sizeof(seq));
}

/*
 * LoRA keys as Dynamo computes them, frozen from hash_vectors.py --lora (tokens 1..12, block
 * size 4, LoRA "adapter-a"): every local hash seeded with 1337 + XXH3(lora, 0), the chain
 * with 1337. Then kvtier's rule with a cache salt too (block 0: salt seed + LoRA term).
 */
static void test_dynamo_lora_vectors(void **state)
{
    (void)state;
    uint32_t t[12];
    for (uint32_t i = 0; i < 12; i++)
        t[i] = i + 1;
    uint64_t local[3], seq[3], seq2[4] = {0, 0, 0, SENTINEL};
    uint64_t seed = kvt_hash_lora_seed("adapter-a", 9);
    assert_int_equal(seed, KVT_HASH_SEED + XXH3_64bits_withSeed("adapter-a", 9, 0));
    kvt_hash_seeds_t s;
    kvt_hash_seeds_lora(NULL, 0, "adapter-a", 9, &s);
    assert_int_equal(s.first, seed);
    assert_int_equal(s.block, seed);
    assert_int_equal(s.chain, KVT_HASH_SEED);
    assert_int_equal(kvt_hash_seq_seeds(t, 12, 4, &s, NULL, local, seq), 3);
    assert_int_equal(local[0], UINT64_C(11381080598872079209));
    assert_int_equal(local[1], UINT64_C(5698110331184095209));
    assert_int_equal(local[2], UINT64_C(10923852707342720619));
    assert_int_equal(seq[0], UINT64_C(11381080598872079209));
    assert_int_equal(seq[1], UINT64_C(17518568667535815909));
    assert_int_equal(seq[2], UINT64_C(12857975441449519705));
    assert_int_equal(kvt_hash_block(t + 4, 4, seed), local[1]);
    assert_int_equal(kvt_hash_chain(seq[0], local[1], KVT_HASH_SEED), seq[1]);
    /* the LoRA changes every key: none equals the base model's (test_dynamo_vectors) */
    assert_int_not_equal(seq[0], UINT64_C(14643705804678351452));
    assert_int_not_equal(seq[2], UINT64_C(12583592247330656132));
    /* the same from little-endian bytes (RPC frames) */
    uint8_t le[48];
    for (int i = 0; i < 12; i++) {
        le[4 * i] = (uint8_t)(i + 1);
        le[4 * i + 1] = le[4 * i + 2] = le[4 * i + 3] = 0;
    }
    assert_int_equal(kvt_hash_seq_seeds_le(le, 12, 4, &s, NULL, NULL, seq2), 3);
    assert_memory_equal(seq2, seq, sizeof(seq));
    assert_int_equal(seq2[3], SENTINEL);

    /* cache salt "tenant-a" too: block 0 only changes, its seed XXH3(salt, 1337) + the term */
    kvt_hash_seeds_lora("tenant-a", 8, "adapter-a", 9, &s);
    assert_int_equal(s.first, kvt_hash_salt_seed("tenant-a", 8) + (seed - KVT_HASH_SEED));
    assert_int_equal(s.block, seed);
    assert_int_equal(kvt_hash_seq_seeds(t, 12, 4, &s, NULL, local, seq), 3);
    assert_int_equal(local[0], UINT64_C(11840579665246437583));
    assert_int_equal(local[1], UINT64_C(5698110331184095209));
    assert_int_equal(seq[0], UINT64_C(11840579665246437583));
    assert_int_equal(seq[1], UINT64_C(7561070985513423015));
    assert_int_equal(seq[2], UINT64_C(5613698272698325407));

    /* no LoRA ("" or NULL): the standard's seeds, salted or not */
    assert_int_equal(kvt_hash_lora_seed("", 0), KVT_HASH_SEED);
    assert_int_equal(kvt_hash_lora_seed(NULL, 0), KVT_HASH_SEED);
    kvt_hash_seeds_lora("tenant-a", 8, "", 0, &s);
    assert_int_equal(s.first, kvt_hash_salt_seed("tenant-a", 8));
    assert_int_equal(s.block, KVT_HASH_SEED);
    assert_int_equal(s.chain, KVT_HASH_SEED);
    kvt_hash_seeds_lora(NULL, 0, NULL, 0, &s);
    assert_int_equal(kvt_hash_seq_seeds(t, 12, 4, &s, NULL, NULL, seq), 3);
    assert_int_equal(seq[2], UINT64_C(12583592247330656132));
    /* block size 0 and a partial block write nothing */
    seq2[0] = SENTINEL;
    assert_int_equal(kvt_hash_seq_seeds(t, 12, 0, &s, NULL, NULL, seq2), 0);
    assert_int_equal(kvt_hash_seq_seeds(t, 3, 4, &s, NULL, NULL, seq2), 0);
    assert_int_equal(kvt_hash_seq_seeds_le(le, 3, 4, &s, NULL, NULL, seq2), 0);
    assert_int_equal(seq2[0], SENTINEL);
}

/* Isolation by LoRA under Dynamo's keys: per LoRA, per salt, pairwise different keys. */
static void test_lora_isolation(void **state)
{
    (void)state;
    enum { B = 16, NB = 6 };
    uint32_t toks[B * NB];
    for (size_t i = 0; i < B * NB; i++)
        toks[i] = (uint32_t)(i * 2246822519u);
    static const char *const loras[] = {"", "adapter-a", "adapter-b", "adapter-a ", "a"};
    static const char *const salts[] = {"", "tenant-a"};
    enum { NL = sizeof(loras) / sizeof(loras[0]), NS = 2 };
    uint64_t keys[NL * NS][NB];
    for (size_t l = 0; l < NL; l++)
        for (size_t k = 0; k < NS; k++) {
            kvt_hash_seeds_t s;
            kvt_hash_seeds_lora(salts[k], strlen(salts[k]), loras[l], strlen(loras[l]), &s);
            assert_int_equal(kvt_hash_seq_seeds(toks, B * NB, B, &s, NULL, NULL, keys[l * NS + k]),
                             NB);
        }
    for (size_t a = 0; a < NL * NS; a++)
        for (size_t b = a + 1; b < NL * NS; b++)
            for (size_t i = 0; i < NB; i++)
                assert_int_not_equal(keys[a][i], keys[b][i]);
    /* no LoRA: exactly the standard, salted and not */
    uint64_t plain[NB];
    assert_int_equal(kvt_hash_seq(toks, B * NB, B, KVT_HASH_SEED, NULL, NULL, plain), NB);
    assert_memory_equal(keys[0], plain, sizeof(plain));
    uint64_t salted[NB];
    assert_int_equal(
        kvt_hash_seq_salted(toks, B * NB, B, kvt_hash_salt_seed("tenant-a", 8), NULL, NULL, salted),
        NB);
    assert_memory_equal(keys[1], salted, sizeof(salted));
}

/* The standard spelled out with byte arrays, independent of host byte order. */
static void test_little_endian_bytes(void **state)
{
    (void)state;
    const uint32_t toks[4] = {0x01020304u, 0xa0b0c0d0u, 0, 0xffffffffu};
    const uint8_t bytes[16] = {0x04, 0x03, 0x02, 0x01, 0xd0, 0xc0, 0xb0, 0xa0,
                               0,    0,    0,    0,    0xff, 0xff, 0xff, 0xff};
    assert_int_equal(kvt_hash_block(toks, 4, 1337), XXH3_64bits_withSeed(bytes, 16, 1337));

    uint64_t prev = UINT64_C(0x0102030405060708), local = UINT64_C(0x1112131415161718);
    uint8_t in[16];
    for (int i = 0; i < 8; i++) {
        in[i] = (uint8_t)(prev >> (8 * i));
        in[8 + i] = (uint8_t)(local >> (8 * i));
    }
    assert_int_equal(kvt_hash_chain(prev, local, 1337), XXH3_64bits_withSeed(in, 16, 1337));

    /* Long blocks take XXH3's > 240-byte path. */
    uint32_t big[600];
    uint8_t big_bytes[sizeof(big)];
    for (uint32_t i = 0; i < 600; i++) {
        big[i] = i * 2654435761u;
        for (int b = 0; b < 4; b++)
            big_bytes[4 * i + (uint32_t)b] = (uint8_t)(big[i] >> (8 * b));
    }
    assert_int_equal(kvt_hash_block(big, 600, 99), XXH3_64bits_withSeed(big_bytes, 2400, 99));
}

static void test_parent_chaining(void **state)
{
    (void)state;
    enum { B = 16, NB = 10 };
    uint32_t toks[B * NB];
    uint64_t whole[NB], half[NB], local[NB];
    for (size_t i = 0; i < B * NB; i++)
        toks[i] = (uint32_t)(i * 7919u + 13u);

    assert_int_equal(kvt_hash_seq(toks, B * NB, B, KVT_HASH_SEED, NULL, local, whole), NB);
    assert_int_equal(whole[0], local[0]);
    for (size_t split = 1; split < NB; split++) {
        size_t n = kvt_hash_seq(toks + split * B, (NB - split) * B, B, KVT_HASH_SEED,
                                &whole[split - 1], NULL, half);
        assert_int_equal(n, NB - split);
        assert_memory_equal(half, whole + split, n * sizeof(uint64_t));
    }
    /* A parent makes block 0 differ from its local hash. */
    uint64_t parent = 12345;
    assert_int_equal(kvt_hash_seq(toks, B, B, KVT_HASH_SEED, &parent, local, half), 1);
    assert_int_not_equal(half[0], local[0]);
    assert_int_equal(half[0], kvt_hash_chain(parent, local[0], KVT_HASH_SEED));
}

static void test_partial_block_ignored(void **state)
{
    (void)state;
    enum { B = 16 };
    uint32_t toks[3 * B];
    uint64_t a[4], b[4];
    for (size_t i = 0; i < 3 * B; i++)
        toks[i] = (uint32_t)i;

    a[2] = b[2] = SENTINEL;
    assert_int_equal(kvt_hash_seq(toks, 2 * B, B, KVT_HASH_SEED, NULL, NULL, a), 2);
    for (size_t extra = 1; extra < B; extra++) {
        assert_int_equal(kvt_hash_seq(toks, 2 * B + extra, B, KVT_HASH_SEED, NULL, NULL, b), 2);
        assert_memory_equal(a, b, 2 * sizeof(uint64_t));
        assert_int_equal(b[2], SENTINEL);
    }
    /* Fewer tokens than one block: nothing written. */
    b[0] = SENTINEL;
    assert_int_equal(kvt_hash_seq(toks, B - 1, B, KVT_HASH_SEED, NULL, NULL, b), 0);
    assert_int_equal(b[0], SENTINEL);
}

static void test_seed_changes_result(void **state)
{
    (void)state;
    const uint32_t toks[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    uint64_t h1337 = kvt_hash_block(toks, 16, 1337);
    assert_int_not_equal(h1337, kvt_hash_block(toks, 16, 1338));
    assert_int_not_equal(h1337, kvt_hash_block(toks, 16, 0));
    assert_int_not_equal(kvt_hash_chain(1, 2, 1337), kvt_hash_chain(1, 2, 1338));
    /* The chain is ordered: (a, b) and (b, a) differ. */
    assert_int_not_equal(kvt_hash_chain(1, 2, 1337), kvt_hash_chain(2, 1, 1337));
    /* One token changed changes the block. */
    uint32_t other[16];
    memcpy(other, toks, sizeof(other));
    other[15] ^= 1;
    assert_int_not_equal(h1337, kvt_hash_block(other, 16, 1337));
}

static void test_empty(void **state)
{
    (void)state;
    uint64_t out[1] = {SENTINEL}, local[1] = {SENTINEL};
    const uint32_t toks[1] = {5};

    assert_int_equal(kvt_hash_seq(NULL, 0, 16, KVT_HASH_SEED, NULL, local, out), 0);
    assert_int_equal(kvt_hash_seq(toks, 0, 1, KVT_HASH_SEED, NULL, local, out), 0);
    /* block_size 0 is refused without writing or reading. */
    assert_int_equal(kvt_hash_seq(toks, 1, 0, KVT_HASH_SEED, NULL, local, out), 0);
    assert_int_equal(out[0], SENTINEL);
    assert_int_equal(local[0], SENTINEL);
}

/* kvt_hash_seq_le() over LE bytes at every misalignment equals kvt_hash_seq(), and likewise
 * kvt_hash_seq_salted_le() and kvt_hash_seq_salted() with a cache salt. */
static void test_le_bytes_entry(void **state)
{
    (void)state;
    enum { N = 200 };
    uint32_t tok[N];
    unsigned char raw[N * 4 + 8];
    kvt_rng_t rng;
    kvt_rng_init(&rng, 42);
    for (size_t i = 0; i < N; i++)
        tok[i] = (uint32_t)kvt_rng_next(&rng);
    static const uint32_t sizes[] = {1, 3, 16, 32, 33, 64, 200};
    const uint64_t salt_seed = kvt_hash_salt_seed("tenant-a", 8);
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        for (size_t off = 0; off < 8; off++) {
            for (size_t i = 0; i < N; i++)
                for (int b = 0; b < 4; b++)
                    raw[off + i * 4 + (size_t)b] = (unsigned char)(tok[i] >> (8 * b));
            uint64_t parent = 0x1234567890abcdefull;
            for (int with_parent = 0; with_parent < 2; with_parent++) {
                uint64_t l1[N], s1[N], l2[N], s2[N];
                const uint64_t *pp = with_parent ? &parent : NULL;
                size_t n1 = kvt_hash_seq(tok, N, sizes[si], 1337, pp, l1, s1);
                size_t n2 = kvt_hash_seq_le(raw + off, N, sizes[si], 1337, pp, l2, s2);
                assert_int_equal(n1, n2);
                assert_memory_equal(l1, l2, n1 * sizeof(uint64_t));
                assert_memory_equal(s1, s2, n1 * sizeof(uint64_t));
                /* salted: the first block's seed differs, the rest continues as above */
                n1 = kvt_hash_seq_salted(tok, N, sizes[si], salt_seed, pp, l1, s1);
                n2 = kvt_hash_seq_salted_le(raw + off, N, sizes[si], salt_seed, pp, l2, s2);
                assert_int_equal(n1, N / sizes[si]);
                assert_int_equal(n1, n2);
                assert_memory_equal(l1, l2, n1 * sizeof(uint64_t));
                assert_memory_equal(s1, s2, n1 * sizeof(uint64_t));
                assert_int_equal(l1[0], kvt_hash_block(tok, sizes[si], salt_seed));
            }
        }
    }
}

/* Frozen salted vectors (computed by hash_vectors.py; docs/cli.md shows the first). */
static void test_salted_fixed(void **state)
{
    (void)state;
    uint64_t local[4], seq[4];
    const uint32_t t1[] = {1, 2, 3, 4, 5};
    uint64_t first = kvt_hash_salt_seed("tenant-a", 8);
    assert_int_equal(kvt_hash_seq_salted(t1, 5, 2, first, NULL, local, seq), 2);
    assert_int_equal(local[0], UINT64_C(11278602352658511512));
    assert_int_equal(local[1], UINT64_C(2662118915037317746)); /* unsalted block 1 */
    assert_int_equal(seq[0], UINT64_C(11278602352658511512));
    assert_int_equal(seq[1], UINT64_C(441160891942885791));
    /* The empty salt is no salt: the seed is the standard's, the keys unchanged. */
    assert_int_equal(kvt_hash_salt_seed("", 0), KVT_HASH_SEED);
    assert_int_equal(kvt_hash_salt_seed(NULL, 0), KVT_HASH_SEED);
    assert_int_equal(kvt_hash_seq_salted(t1, 5, 2, KVT_HASH_SEED, NULL, local, seq), 2);
    assert_int_equal(seq[1], UINT64_C(5890102321129957602));
}

/*
 * Isolation: for a prompt, the keys with no salt, salt A and salt B are pairwise different at
 * every block (the salt reaches every key through the chain); the same salt gives the same keys.
 */
static void test_salt_isolation(void **state)
{
    (void)state;
    enum { B = 16, NB = 8 };
    uint32_t toks[B * NB];
    for (size_t i = 0; i < B * NB; i++)
        toks[i] = (uint32_t)(i * 2654435761u);
    static const char *const salts[] = {"", "tenant-a", "tenant-b", "tenant-a ", "a", "b"};
    enum { NS = sizeof(salts) / sizeof(salts[0]) };
    uint64_t keys[NS][NB], again[NB];
    for (size_t s = 0; s < NS; s++) {
        uint64_t first = kvt_hash_salt_seed(salts[s], strlen(salts[s]));
        assert_int_equal(kvt_hash_seq_salted(toks, B * NB, B, first, NULL, NULL, keys[s]), NB);
        assert_int_equal(kvt_hash_seq_salted(toks, B * NB, B, first, NULL, NULL, again), NB);
        assert_memory_equal(keys[s], again, sizeof(again));
    }
    uint64_t plain[NB];
    assert_int_equal(kvt_hash_seq(toks, B * NB, B, KVT_HASH_SEED, NULL, NULL, plain), NB);
    assert_memory_equal(keys[0], plain, sizeof(plain));
    for (size_t a = 0; a < NS; a++)
        for (size_t b = a + 1; b < NS; b++)
            for (size_t i = 0; i < NB; i++)
                assert_int_not_equal(keys[a][i], keys[b][i]);
    /* A salt seeds the chain's first block only: with a parent the caller passes the standard
     * seed, and a salted first seed with a parent is chained from it like any block. */
    uint64_t parent = keys[1][3], cont[NB];
    assert_int_equal(
        kvt_hash_seq_salted(toks + 4 * B, 4 * B, B, KVT_HASH_SEED, &parent, NULL, cont), 4);
    assert_memory_equal(cont, keys[1] + 4, 4 * sizeof(uint64_t));
    uint64_t first = kvt_hash_salt_seed("tenant-b", 8);
    assert_int_equal(kvt_hash_seq_salted(toks, B, B, first, &parent, NULL, cont), 1);
    assert_int_equal(cont[0],
                     kvt_hash_chain(parent, kvt_hash_block(toks, B, first), KVT_HASH_SEED));
    /* Fewer tokens than a block: nothing is written, salted or not. */
    cont[0] = SENTINEL;
    assert_int_equal(kvt_hash_seq_salted(toks, B - 1, B, first, NULL, NULL, cont), 0);
    assert_int_equal(kvt_hash_seq_salted_le(toks, B - 1, B, first, NULL, NULL, cont), 0);
    assert_int_equal(kvt_hash_seq_salted(toks, B, 0, first, NULL, NULL, cont), 0);
    assert_int_equal(cont[0], SENTINEL);
}

int main(void)
{
    char why[512] = "";
    int loaded = load_vectors(why, sizeof(why));
    if (loaded < 0) {
        fprintf(stderr, "test_hash: %s\n", why);
        free_vectors();
        return 1;
    }

    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_fixed_vectors),         cmocka_unit_test(test_dynamo_vectors),
        cmocka_unit_test(test_dynamo_lora_vectors),   cmocka_unit_test(test_lora_isolation),
        cmocka_unit_test(test_little_endian_bytes),   cmocka_unit_test(test_parent_chaining),
        cmocka_unit_test(test_partial_block_ignored), cmocka_unit_test(test_seed_changes_result),
        cmocka_unit_test(test_le_bytes_entry),        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_salted_fixed),          cmocka_unit_test(test_salt_isolation),
    };
    const struct CMUnitTest python[] = {
        cmocka_unit_test(test_python_vectors),
    };
    int failed = cmocka_run_group_tests_name("hash", fixed, NULL, NULL);
    if (loaded)
        failed += cmocka_run_group_tests_name("hash_python_vectors", python, NULL, NULL);
    free_vectors();
    if (failed)
        return 1;
    if (!loaded) {
        fprintf(stderr, "test_hash: SKIP python vector comparison: %s\n", why);
        return 77;
    }
    return 0;
}
