/*
 * tiers/disk_int.h: the NVMe store's I/O. One file (preallocated with
 * fallocate) or a raw block device, opened O_DIRECT, cut into slots of the
 * arena's slot size, driven through io_uring: the file registered, the arena
 * registered as fixed buffers, I/O batched up to --io-depth, SQPOLL optional.
 * Bytes go straight between arena slots and the device: no bounce buffer.
 *
 * The first 4 KiB of the file or device is kvtier's header: magic, version,
 * slot size, slot count, and the store id (random, drawn when the store is
 * created, kept in the metadata too, so a data dir and a disk that do not
 * belong together are told apart). kvtierd creates a regular file with O_EXCL
 * or opens one that carries its header; a file or device without the header
 * is refused unless the caller asks to format a block device. Slot i lives at
 * byte 4096 + i * slot_bytes.
 *
 * Single-threaded: one owner thread calls everything but kvt_disk_event_fd()'s
 * poll.
 */
#ifndef KVT_TIERS_DISK_INT_H
#define KVT_TIERS_DISK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define KVT_DISK_MAGIC "KVTDISK1" /* 8 bytes at offset 0 */
#define KVT_DISK_HEADER 4096u     /* slot 0 starts here */

typedef struct kvt_disk_cfg {
    const char *path;    /* regular file (created when missing) or block device */
    uint64_t bytes;      /* file size to preallocate; a device's own size is used; 0: the
                            existing file's size */
    uint32_t slot_bytes; /* a multiple of 4096 (the arena's), up to 1 GiB */
    uint32_t io_depth;   /* I/Os in flight at most; the ring's size; >= 1 */
    bool sqpoll;         /* IORING_SETUP_SQPOLL (falls back to none, logged, where refused) */
    bool format_device;  /* a block device without kvtier's header may be formatted */
} kvt_disk_cfg_t;

typedef struct kvt_disk kvt_disk_t;

/* One read or write of a slot. The caller owns it until it comes back through reap. */
typedef struct kvt_disk_io {
    uint32_t slot;      /* disk slot */
    uint32_t len;       /* bytes: a multiple of 4096, <= slot_bytes */
    void *buf;          /* 4096-aligned; in the registered range, or any memory when none is */
    bool write;         /* writes are durable when they complete (RWF_DSYNC) */
    int res;            /* on completion: len, or -errno (a short transfer is retried for the
                           rest first; -EIO when the device returns 0) */
    uint64_t submit_ns; /* set by kvt_disk_queue(): CLOCK_MONOTONIC, for latency figures */
    void *arg;          /* the caller's */
} kvt_disk_io_t;

/*
 * Opens or creates the store (see above). Errors, with one line in @err:
 * KVT_ERR_INVAL (slot size, depth, path), KVT_ERR_EXISTS (a file or device
 * that is not a kvtier store, one made with another slot size, or one another
 * process holds: the store is flock()ed while open),
 * KVT_ERR_NO_SPACE (fallocate found no space, or fewer than one slot),
 * KVT_ERR_IO (open, O_DIRECT or fallocate not supported, io_uring
 * unavailable). A file created by a failed call is removed. An existing store
 * keeps its size and slot count whatever @cfg->bytes says.
 */
kvt_status_t kvt_disk_open(const kvt_disk_cfg_t *cfg, kvt_disk_t **disk_p, char *err,
                           size_t errlen);
/* Waits for the I/O in flight (handed to no callback), then closes. The store stays. */
void kvt_disk_close(kvt_disk_t *d);

uint32_t kvt_disk_nslots(const kvt_disk_t *d);
uint64_t kvt_disk_store_id(const kvt_disk_t *d);
bool kvt_disk_created(const kvt_disk_t *d); /* this open made the store */

/* Registers [@base, @base + @len) (the arena) as fixed buffers, in chunks the
 * kernel accepts. I/O on buffers inside it then uses fixed-buffer opcodes.
 * Once per store: KVT_ERR_INVAL when called again, @len is 0 or @base is not
 * 4096-aligned; KVT_ERR_TOO_BIG beyond io_uring's 16384 buffers of 1 GiB;
 * KVT_ERR_NO_MEM where the locked-memory limit refuses it; KVT_ERR_IO. */
kvt_status_t kvt_disk_register(kvt_disk_t *d, void *base, uint64_t len, char *err, size_t errlen);

/* Queues @io (submitted by kvt_disk_submit()). KVT_ERR_LIMIT when io_depth
 * I/Os are queued or in flight; KVT_ERR_INVAL for a bad slot, length or
 * alignment (@io is not queued). */
kvt_status_t kvt_disk_queue(kvt_disk_t *d, kvt_disk_io_t *io);

/* Submits what is queued with one system call (none under SQPOLL when the
 * poller is awake). */
void kvt_disk_submit(kvt_disk_t *d);

/* Hands each completed I/O to @done (res set), after waiting up to @wait_ms
 * for the first (0: no wait; -1: until one completes, when any is in
 * flight). Returns how many completed. @done may queue I/O, never reap. */
size_t kvt_disk_reap(kvt_disk_t *d, int wait_ms, void (*done)(void *arg, kvt_disk_io_t *io),
                     void *arg);

uint32_t kvt_disk_inflight(const kvt_disk_t *d); /* queued or in flight */

/* An eventfd that becomes readable when completions wait (for the owner's
 * poll; the owner reads it to clear it). */
int kvt_disk_event_fd(const kvt_disk_t *d);

#endif
