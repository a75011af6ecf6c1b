/*
 * bench/bench_tiers_restore.c: phases 3 and 4 of `kvtier-bench tiers` (bench_tiers.c has
 * the rest). Restore: M block records written straight into a data dir through the
 * metadata module, then kvt_tier_open() on them, against a bare RocksDB iteration over the
 * same, compacted, database. Reload: for each block size, a few durable puts, the tier
 * reopened, and the median time of one get (NVMe read, checksum, promotion).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rocksdb/c.h>

#include "bench/bench.h"
#include "bench/bench_tiers_int.h"
#include "common/clock.h"
#include "common/errtext.h"
#include "tiers/tiers.h"
#include "tiers/tiers_test.h"

#define BT_META_BATCH 65536u /* records per metadata batch */

const uint32_t kvt_bt_reload_sizes[BT_NRELOAD] = {256u << 10, 512u << 10, 1u << 20, 2u << 20,
                                                  4u << 20};

/* ---- 3. restore -------------------------------------------------------------------------- */

/* A bijection of 64-bit numbers (splitmix64's finalizer): block keys in no particular order. */
static uint64_t bt_key(uint64_t i)
{
    uint64_t z = i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Says what RocksDB reported doing @what on @data, and frees its text; -1. */
static int bt_rocks_fail(const char *what, const char *data, char *e)
{
    fprintf(stderr, "kvtier-bench: tiers: %s %s: %s\n", what, data, e);
    rocksdb_free(e);
    return -1;
}

/* A store of @m 4096-byte slots at @store and a data dir @data naming every slot. */
static int bt_restore_make(uint32_t m, const char *store, const char *data)
{
    char err[512];
    kvt_disk_cfg_t dc = {.path = store,
                         .bytes = KVT_DISK_HEADER + (uint64_t)m * BT_ALIGN,
                         .slot_bytes = BT_ALIGN,
                         .io_depth = 1};
    kvt_disk_t *d = NULL;
    kvt_status_t st = kvt_disk_open(&dc, &d, err, sizeof(err));
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: tiers: restore store: %s\n", err);
        return -1;
    }
    kvt_meta_cfg_t mc = {.dir = data,
                         .store_id = kvt_disk_store_id(d),
                         .slot_bytes = BT_ALIGN,
                         .nslots = kvt_disk_nslots(d),
                         .fresh_disk = kvt_disk_created(d)};
    kvt_disk_close(d);
    kvt_meta_t *meta = NULL;
    kvt_meta_rec_t *recs = malloc(BT_META_BATCH * sizeof(*recs));
    uint32_t ns = 0;
    if (recs == NULL) {
        kvt_errf(err, sizeof(err), "out of memory");
        st = KVT_ERR_NO_MEM;
    } else if ((st = kvt_meta_open(&mc, &meta, err, sizeof(err))) == KVT_OK) {
        st = kvt_meta_ns(meta, BT_NS, BT_NS_LEN, &ns, err, sizeof(err));
    }
    for (uint32_t i = 0; i < m && st == KVT_OK;) {
        uint32_t n = m - i < BT_META_BATCH ? m - i : BT_META_BATCH;
        for (uint32_t k = 0; k < n; k++, i++)
            recs[k] = (kvt_meta_rec_t){
                .ns = ns, .key = bt_key(i), .slot = i, .len = BT_ALIGN, .sum = i, .gen = i + 1};
        st = kvt_meta_write(meta, recs, n, NULL, 0, err, sizeof(err));
    }
    kvt_meta_close(meta);
    free(recs);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier-bench: tiers: restore records: %s\n", err);
        return -1;
    }
    /* compacted, as a store that has run a while is: no log to replay, no compaction left to
     * run beside the timed opens */
    char *e = NULL;
    rocksdb_options_t *opts = rocksdb_options_create();
    rocksdb_t *db = rocksdb_open(opts, data, &e);
    if (e == NULL)
        rocksdb_compact_range(db, NULL, 0, NULL, 0);
    if (db != NULL)
        rocksdb_close(db);
    rocksdb_options_destroy(opts);
    return e != NULL ? bt_rocks_fail("compacting", data, e) : 0;
}

/* A bare RocksDB pass over the block records of @data: read-only open, then every key
 * counted. Sets the open and iteration times; -1 after a line on stderr. */
static int bt_rocks_iter(const char *data, uint64_t want, uint64_t *open_ns, uint64_t *iter_ns)
{
    char *e = NULL;
    rocksdb_options_t *opts = rocksdb_options_create();
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_iterate_upper_bound(ro, "c", 1);
    rocksdb_readoptions_set_fill_cache(ro, 0);
    uint64_t t0 = kvt_clock_ns();
    rocksdb_t *db = rocksdb_open_for_read_only(opts, data, 0, &e);
    uint64_t t1 = kvt_clock_ns();
    uint64_t n = 0, bytes = 0;
    if (e == NULL) {
        rocksdb_iterator_t *it = rocksdb_create_iterator(db, ro);
        for (rocksdb_iter_seek(it, "b", 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl, vl;
            rocksdb_iter_key(it, &kl);
            rocksdb_iter_value(it, &vl);
            bytes += kl + vl;
            n++;
        }
        rocksdb_iter_get_error(it, &e);
        rocksdb_iter_destroy(it);
    }
    uint64_t t2 = kvt_clock_ns();
    if (db != NULL)
        rocksdb_close(db);
    rocksdb_readoptions_destroy(ro);
    rocksdb_options_destroy(opts);
    if (e != NULL)
        return bt_rocks_fail("iterating", data, e);
    if (n != want || bytes != want * (KVT_META_KEY_BYTES + KVT_META_VAL_BYTES)) {
        fprintf(stderr,
                "kvtier-bench: tiers: rocksdb iterated %" PRIu64 " records, want %" PRIu64 "\n", n,
                want);
        return -1;
    }
    *open_ns = t1 - t0;
    *iter_ns = t2 - t1;
    return 0;
}

int kvt_bt_restore(bt_t *b)
{
    uint32_t M = b->o.restore_blocks;
    char store[BT_PATH], data[BT_PATH];
    kvt_bt_path(b, "restore.store", store);
    kvt_bt_path(b, "restore.meta", data);
    int rc = bt_restore_make(M, store, data);
    uint64_t best_tier = UINT64_MAX, best_open = UINT64_MAX, best_iter = UINT64_MAX;
    /* round 0 is a warm-up: the first open also replays the records' log into tables */
    for (uint32_t r = 0; rc == 0 && r <= b->rounds; r++) {
        uint64_t t0 = kvt_clock_ns();
        kvt_tier_t *t = kvt_bt_reopen(BT_ALIGN, 8, store, data, 0, M);
        uint64_t t1 = kvt_clock_ns();
        if (t == NULL) {
            rc = -1;
            break;
        }
        kvt_tier_close(t);
        uint64_t o = 0, it = 0;
        rc = bt_rocks_iter(data, M, &o, &it);
        if (r > 0) {
            best_tier = t1 - t0 < best_tier ? t1 - t0 : best_tier;
            best_open = o < best_open ? o : best_open;
            best_iter = it < best_iter ? it : best_iter;
        }
    }
    unlink(store);
    kvt_bt_rmtree(data);
    if (rc != 0)
        return -1;
    b->r.restore_ms = (double)best_tier / 1e6;
    b->r.restore_per_sec = (double)M * 1e9 / (double)best_tier;
    b->r.rocks_open_ms = (double)best_open / 1e6;
    b->r.rocks_iter_ms = (double)best_iter / 1e6;
    b->r.rocks_per_sec = (double)M * 1e9 / (double)best_iter;
    return 0;
}

/* ---- 4. reload --------------------------------------------------------------------------- */

/* The median get time of @k durable blocks of @size bytes after a reopen, in *@us_p. */
static int bt_reload_one(bt_t *b, uint32_t size, uint32_t k, double *us_p)
{
    char store[BT_PATH], data[BT_PATH];
    kvt_bt_path(b, "reload.store", store);
    kvt_bt_path(b, "reload.meta", data);
    int rc = -1;
    uint64_t *ns = calloc(k, sizeof(*ns));
    bt_wait_t w;
    kvt_bt_wait_init(&w);
    kvt_tier_t *t = NULL;
    if (ns == NULL) {
        fprintf(stderr, "kvtier-bench: tiers: out of memory\n");
        goto out;
    }
    if ((t = kvt_bt_open(size, 4, store, k, data, 4)) == NULL ||
        kvt_bt_put_durable(t, &w, k, b->rbuf, 0, size, 1) != 0)
        goto out;
    kvt_tier_close(t);
    if ((t = kvt_bt_reopen(size, 4, store, data, 4, k)) == NULL)
        goto out;
    for (uint32_t i = 0; i < k; i++) {
        bt_get_t g = {.w = &w, .want = b->rbuf, .len = size};
        kvt_bt_acquire(&w, 1);
        uint64_t t0 = kvt_clock_ns();
        kvt_status_t st = kvt_tier_get(t, BT_NS, BT_NS_LEN, i, kvt_bt_got, &g);
        if (st != KVT_OK)
            kvt_bt_release(&w);
        kvt_bt_drain(&w);
        ns[i] = kvt_clock_ns() - t0;
        if (st == KVT_OK && w.failed > 0)
            st = w.first;
        if (st != KVT_OK) {
            fprintf(stderr, "kvtier-bench: tiers: reload of a %u-byte block: %s\n", size,
                    kvt_status_str(st));
            goto out;
        }
    }
    kvt_bench_sort_u64(ns, k);
    *us_p = kvt_bench_percentile(ns, k, 50.0) / 1e3;
    rc = 0;

out:
    kvt_tier_close(t);
    kvt_bt_wait_cleanup(&w);
    free(ns);
    unlink(store);
    kvt_bt_rmtree(data);
    return rc;
}

int kvt_bt_reload(bt_t *b)
{
    for (int i = 0; i < BT_NRELOAD; i++)
        if (bt_reload_one(b, kvt_bt_reload_sizes[i], b->reload_blocks, &b->r.reload_us[i]) != 0)
            return -1;
    return 0;
}
