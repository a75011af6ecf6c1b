/*
 * bench/bench_tiers_int.h: what the files of `kvtier-bench tiers` share. bench_tiers.c:
 * options, the completions and tier helpers every phase uses, the RAM and NVMe phases
 * against memcpy and fio, the report and main; bench_tiers_restore.c: the restore phase
 * (against a bare RocksDB iteration) and the reload phase. Private to the bench.
 */
#ifndef KVT_BENCH_TIERS_INT_H
#define KVT_BENCH_TIERS_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "tiers/tiers.h"

#define BT_NS "bench"
#define BT_NS_LEN 5u
#define BT_ALIGN 4096u
#define BT_NRELOAD 5
#define BT_RELOAD_MAX (4u << 20)
#define BT_PATH 4096
#define BT_CHECK 64u /* leading bytes a disk get compares */

/* The reload phase's block sizes, 256 KiB .. 4 MiB (bench_tiers_restore.c). */
extern const uint32_t kvt_bt_reload_sizes[BT_NRELOAD];

typedef struct bt_opts {
    const char *dir, *fio;
    uint32_t block_bytes, blocks, depth, restore_blocks;
    bool quick;
} bt_opts_t;

typedef struct bt_res {
    double memcpy_gbps, ram_put_gbps, ram_get_gbps;
    double disk_write_gbps, disk_read_gbps;
    const char *fio; /* "ok", "missing", "failed" */
    double fio_write_gbps, fio_write_nosync_gbps, fio_read_gbps;
    double restore_ms, restore_per_sec;
    double rocks_open_ms, rocks_iter_ms, rocks_per_sec;
    double reload_us[BT_NRELOAD];
} bt_res_t;

typedef struct bt {
    bt_opts_t o;
    uint32_t rounds;         /* RAM and restore rounds */
    uint32_t reload_blocks;  /* blocks per reload size */
    char dir[BT_PATH - 128]; /* the bench's temp dir: room for a file name after it */
    uint8_t *src, *dst;      /* N x B each */
    uint8_t *rbuf;           /* the reloaded blocks' bytes, BT_RELOAD_MAX */
    bt_res_t r;
} bt_t;

/* ---- files (bench_tiers.c) ---- */

/* Removes @path and everything under it; a missing @path is fine. */
void kvt_bt_rmtree(const char *path);

/* @name inside the bench's temp dir, into @out (BT_PATH bytes). */
void kvt_bt_path(const bt_t *b, const char *name, char *out);

/* ---- completions (bench_tiers.c) ---- */

/* Operations in flight, ended by callbacks that may run on the tier's I/O thread. */
typedef struct bt_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t inflight;
    uint64_t ok, failed;
    kvt_status_t first; /* the first failure's status */
} bt_wait_t;

void kvt_bt_wait_init(bt_wait_t *w);
void kvt_bt_wait_cleanup(bt_wait_t *w);

/* Waits for room (fewer than @depth in flight), then counts one more. */
void kvt_bt_acquire(bt_wait_t *w, uint32_t depth);

/* Gives back a slot whose call failed (its callback does not run). */
void kvt_bt_release(bt_wait_t *w);

/* Waits until nothing is in flight. */
void kvt_bt_drain(bt_wait_t *w);

/* One get: its bytes are checked (length, first BT_CHECK bytes), not copied. */
typedef struct bt_get {
    bt_wait_t *w;
    const uint8_t *want;
    uint32_t len;
} bt_get_t;

/* A get's callback: @arg is a bt_get_t; wrong bytes count as a failure. */
void kvt_bt_got(void *arg, kvt_status_t st, const void *data, size_t len);

/* ---- the tier (bench_tiers.c) ---- */

/* Opens a tier of @ram_slots slots of @block bytes, with a store of @disk_slots slots at @store
 * (none when NULL) and its metadata in @data. NULL after a line on stderr. */
kvt_tier_t *kvt_bt_open(uint32_t block, uint32_t ram_slots, const char *store, uint32_t disk_slots,
                        const char *data, uint32_t depth);

/* Reopens @store: NULL (after a line on stderr) unless it restores exactly @want blocks. */
kvt_tier_t *kvt_bt_reopen(uint32_t block, uint32_t ram_slots, const char *store, const char *data,
                          uint32_t depth, uint64_t want);

/* Durable puts of keys [0, n), @depth in flight, block i's bytes at @data + i * @stride; 0 or
 * -1 after a line on stderr. @w (nothing in flight) counts them; its owner destroys it only
 * once the tier is closed, when no callback can still be returning from it. */
int kvt_bt_put_durable(kvt_tier_t *t, bt_wait_t *w, uint32_t n, const uint8_t *data, size_t stride,
                       uint32_t len, uint32_t depth);

/* ---- phases 3 and 4 (bench_tiers_restore.c): 0, or -1 after a line on stderr ---- */

/* M block records restored by kvt_tier_open() against a RocksDB iteration: fills b->r.restore_*
 * and b->r.rocks_*. */
int kvt_bt_restore(bt_t *b);

/* The median reload time from NVMe per block size: fills b->r.reload_us. */
int kvt_bt_reload(bt_t *b);

#endif
