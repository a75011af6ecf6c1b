/*
 * tiers/tiers.h: the blocks this sidecar holds itself, in a host-RAM arena it
 * owns and on NVMe, and the data plane its engine uses on them.
 *
 * A block is named by a namespace (opaque bytes the caller chooses: kvtierd
 * uses the model and LoRA name) and a 64-bit key. Its bytes live in a RAM
 * slot of the arena, in a disk slot of the NVMe store, or both. Blocks are
 * immutable once committed: a key names one content.
 *
 * The engine's calls, batched (one call for a step's keys), mirror vLLM's
 * offloading manager:
 *   lookup           how many leading keys are held, and where;
 *   reserve/commit   free RAM slots for keys (evicting to make room), which
 *                    the engine fills, then makes visible (or gives back);
 *   pin/unpin        RAM slots of held keys, promoted from NVMe first; a
 *                    pinned slot is never evicted, reused or moved.
 * Reservations and pins are leases of a session (one per engine connection):
 * released by commit/unpin, when the session closes, or when they expire.
 *
 * Policies: RAM eviction takes the least recently used unpinned block, and a
 * batch's keys are touched last-to-first so a chain's tail goes before its
 * head. A background demoter keeps the RAM tail on NVMe ahead of need, for
 * blocks the admission filter (--disk-admit) lets in; evicting a block that
 * is also on NVMe only drops its RAM copy. NVMe evicts least recently used,
 * tail first too. Durability order: bytes on the device (RWF_DSYNC), then the
 * metadata (synced RocksDB batch), then the block counts as on disk; a disk
 * slot is reused only once its old record is deleted (synced). Every read
 * from NVMe is checked against the block's XXH3: a mismatch is a miss, the
 * block is dropped and counted. On open, the store is rebuilt from the
 * metadata and every block is reported on disk.
 *
 * Threads: every function may be called from any thread (one mutex guards the
 * block table; bytes are copied outside it). One I/O thread of the tier's own
 * runs the NVMe reads and writes and the metadata. Changes (a block stored or
 * removed, in RAM or on disk) go to the @on_change callback in the order they
 * happened, never under the tier's lock, from whichever thread caused them.
 */
#ifndef KVT_TIERS_TIERS_H
#define KVT_TIERS_TIERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Where a block is: the fastest place that holds it. */
typedef enum kvt_tier_loc {
    KVT_TIER_LOC_NONE = 0,
    KVT_TIER_LOC_RAM = 1,
    KVT_TIER_LOC_DISK = 2,
} kvt_tier_loc_t;

/* NVMe admission (--disk-admit). */
typedef enum kvt_tier_admit {
    KVT_TIER_ADMIT_ALWAYS = 0,
    KVT_TIER_ADMIT_SEEN_TWICE = 1, /* default */
    KVT_TIER_ADMIT_TINYLFU = 2,
} kvt_tier_admit_t;

/* "always", "seen-twice", "tinylfu"; KVT_ERR_INVAL for anything else. */
kvt_status_t kvt_tier_admit_parse(const char *s, kvt_tier_admit_t *admit_p);

#define KVT_TIER_NS_MAX 512u /* longest namespace, bytes */
#define KVT_TIER_SLOT_NONE UINT32_MAX

/* One change, as the index and the publisher want it. */
typedef struct kvt_tier_change {
    const char *ns; /* namespace bytes (not NUL-terminated); valid during the call */
    size_t ns_len;
    uint64_t key;
    kvt_tier_loc_t loc; /* RAM or DISK */
    bool stored;        /* true: now held there; false: no longer */
} kvt_tier_change_t;

typedef void (*kvt_tier_change_cb)(void *arg, const kvt_tier_change_t *ch, size_t n);

typedef struct kvt_tier_cfg {
    uint64_t ram_bytes;     /* arena bytes for slots; > 0 */
    uint32_t block_bytes;   /* largest block; a slot is this rounded up to 4 KiB */
    const char *arena_name; /* "" memfd, "NAME" /dev/shm/NAME, "/path" (hugetlbfs) */
    bool populate;          /* pre-fault the arena */
    const char *disk_path;  /* "" or NULL: no NVMe tier */
    uint64_t disk_bytes;    /* store size (regular file) */
    bool disk_format;       /* a block device without kvtier's header may be formatted */
    const char *data_dir;   /* RocksDB metadata; needed with a disk */
    uint32_t io_depth;      /* NVMe I/Os in flight at most */
    bool sqpoll;
    kvt_tier_admit_t admit;
    uint32_t lease_ms; /* pins and reservations expire after this; 0: 30 s */
    uint32_t grace_ms; /* pins and reservations a session did not end (closed, expired) are
                          held this much longer before their slots can be reused: an engine's
                          copy still in flight does not meet another block; 0: at once */
    kvt_tier_change_cb on_change;
    void *on_change_arg;
} kvt_tier_cfg_t;

typedef struct kvt_tier kvt_tier_t;
typedef struct kvt_tier_sess kvt_tier_sess_t;

/*
 * Creates the arena, opens the NVMe store and its metadata, rebuilds the
 * store (reporting every reloaded block through on_change, before returning)
 * and starts the I/O thread. Errors come with one line in @err (see the
 * modules: KVT_ERR_INVAL, KVT_ERR_EXISTS, KVT_ERR_NO_SPACE, KVT_ERR_IO);
 * nothing is left open or created then.
 */
kvt_status_t kvt_tier_open(const kvt_tier_cfg_t *cfg, kvt_tier_t **tier_p, char *err,
                           size_t errlen);

/* Stops the I/O thread (waiting for I/O in flight), closes the store and
 * removes the arena. Every session must be closed first. */
void kvt_tier_close(kvt_tier_t *t);

/* The arena, for ATTACH: an engine maps @fd's first @map_bytes bytes; slot i
 * is at offset slot_off + i * slot_bytes. */
typedef struct kvt_tier_geom {
    int fd;
    uint64_t map_bytes;
    uint64_t slot_off;
    uint32_t slot_bytes;
    uint32_t nslots;
    uint32_t block_bytes;
    uint32_t disk_slots; /* 0 without a disk */
} kvt_tier_geom_t;
void kvt_tier_geom(const kvt_tier_t *t, kvt_tier_geom_t *g_p);

/* A slot's bytes in kvtierd's own mapping (for the block API's copies). */
uint8_t *kvt_tier_slot_ptr(const kvt_tier_t *t, uint32_t slot);

/* Sessions hold leases; NULL when out of memory. Closing releases its pins
 * and drops its uncommitted reservations. */
/*
 * Which of @keys are held (committed, in RAM or on disk): held[i] for each;
 * returns how many. Not an access: no LRU move, no admission count, no
 * hit or miss in the stats (a caller polling for keys that are still being
 * written, like a streaming push).
 */
size_t kvt_tier_held(kvt_tier_t *t, const char *ns, size_t ns_len, const uint64_t *keys, size_t n,
                     bool *held);

kvt_tier_sess_t *kvt_tier_sess_open(kvt_tier_t *t);
void kvt_tier_sess_close(kvt_tier_t *t, kvt_tier_sess_t *s);

/*
 * How many of @keys, from the first, are held (committed, in RAM or on
 * disk); loc[i] (a kvt_tier_loc_t value, one byte) for each of those. Counts
 * as an access of each (LRU, admission). @loc may be NULL.
 */
size_t kvt_tier_lookup(kvt_tier_t *t, const char *ns, size_t ns_len, const uint64_t *keys, size_t n,
                       uint8_t *loc);

/*
 * Reserves a RAM slot for each key: slots[i] is the slot, or
 * KVT_TIER_SLOT_NONE when the key is already held or reserved, or when no
 * slot could be freed (every other one pinned or reserved). Evicting to make
 * room drops blocks from RAM; the keys of blocks that left this sidecar
 * altogether are written to @evicted (room for @evicted_cap; the count in
 * *@nevicted_p, which may exceed the room: the rest are not listed).
 * KVT_ERR_INVAL for a bad namespace; KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_tier_reserve(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                              const uint64_t *keys, size_t n, uint32_t *slots, uint64_t *evicted,
                              size_t evicted_cap, size_t *nevicted_p);

/*
 * Ends reservations of @s: with @ok, the blocks (of @lens[i] bytes, or
 * block_bytes each when @lens is NULL) become visible in RAM, each with the
 * XXH3 of its bytes recorded (hashed here, outside the lock); without, the
 * slots are freed. Keys @s has not reserved are skipped; the number of
 * reservations ended in *@done_p (may be NULL). KVT_ERR_INVAL for a length
 * of 0 or above block_bytes, KVT_ERR_NO_MEM (nothing changes).
 */
kvt_status_t kvt_tier_commit(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                             const uint64_t *keys, size_t n, const uint32_t *lens, bool ok,
                             size_t *done_p);

/*
 * kvt_tier_commit() with @ok, for a caller that has just hashed each block's
 * bytes itself (a transfer checks every landed block): @sums[i] is taken as
 * the XXH3-64 of block i's bytes instead of hashing them again. The caller
 * vouches for them: a wrong one makes the block read as corrupt later.
 */
kvt_status_t kvt_tier_commit_sums(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                                  const uint64_t *keys, size_t n, const uint32_t *lens,
                                  const uint64_t *sums, size_t *done_p);

/* A pin's answer for one key. */
typedef struct kvt_tier_pinned {
    uint32_t slot; /* KVT_TIER_SLOT_NONE: not held (or lost to a failed read) */
    uint32_t len;
    uint64_t sum; /* XXH3-64 of the block's bytes, recorded when it was stored (commit, put):
                     a transfer's receiver checks the bytes it got against it */
} kvt_tier_pinned_t;

/* Called once when a pin completes: out[i] for each key, in order. */
typedef void (*kvt_tier_pin_cb)(void *arg, const kvt_tier_pinned_t *out, size_t n);

/*
 * Pins @keys for @s: RAM blocks at once, disk blocks once promoted (read and
 * checked). @done runs exactly once, from this call when nothing has to be
 * read, else from the I/O thread. KVT_ERR_INVAL, KVT_ERR_NO_MEM: @done does
 * not run.
 */
kvt_status_t kvt_tier_pin(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                          const uint64_t *keys, size_t n, kvt_tier_pin_cb done, void *arg);

/* Releases one pin of @s on each key; keys it has not pinned are skipped. */
size_t kvt_tier_unpin(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                      const uint64_t *keys, size_t n);

/* Promotes the disk-only blocks among @keys into RAM, without pins; returns
 * how many reads were started. */
size_t kvt_tier_prefetch(kvt_tier_t *t, const char *ns, size_t ns_len, const uint64_t *keys,
                         size_t n);

/* Called when a put or a delete completes. */
typedef void (*kvt_tier_done_cb)(void *arg, kvt_status_t st);

/*
 * Stores @len bytes as block @key. Once in RAM (or, with @durable, once on
 * NVMe with its metadata committed) @done runs with KVT_OK; a key already
 * held is not rewritten (KVT_OK, and with @durable it is made durable).
 * Errors: KVT_ERR_TOO_BIG (len > block_bytes), KVT_ERR_INVAL, KVT_ERR_NO_SPACE
 * (no RAM slot could be freed), KVT_ERR_UNSUPPORTED (durable without a
 * disk): @done does not run. A durable put whose write fails gets
 * KVT_ERR_IO through @done.
 */
kvt_status_t kvt_tier_put(kvt_tier_t *t, const char *ns, size_t ns_len, uint64_t key,
                          const void *data, size_t len, bool durable, kvt_tier_done_cb done,
                          void *arg);

/* Called once by a get: KVT_OK with the block's bytes (pinned for the call only: copy them
 * out), or KVT_ERR_NOT_FOUND (@data NULL). */
typedef void (*kvt_tier_get_cb)(void *arg, kvt_status_t st, const void *data, size_t len);

/* Reads block @key, promoting it from NVMe first (checked). @cb runs exactly once, from this
 * call when nothing has to be read, else from the I/O thread. KVT_ERR_NO_MEM: @cb does not
 * run. */
kvt_status_t kvt_tier_get(kvt_tier_t *t, const char *ns, size_t ns_len, uint64_t key,
                          kvt_tier_get_cb cb, void *arg);

/* Drops block @key from RAM and NVMe (its metadata deleted, synced, before
 * @done runs). KVT_ERR_NOT_FOUND, KVT_ERR_EXISTS (pinned or reserved): @done
 * does not run. */
kvt_status_t kvt_tier_delete(kvt_tier_t *t, const char *ns, size_t ns_len, uint64_t key,
                             kvt_tier_done_cb done, void *arg);

/* Sets every lease @s holds to expire @lease_ms from now (0: the tier's
 * lease_ms), shorter or longer than before; returns how many it holds. A
 * transfer's source renews its pins while the transfer runs. */
size_t kvt_tier_sess_renew(kvt_tier_t *t, kvt_tier_sess_t *s, uint32_t lease_ms);

/* Expires leases older than lease_ms; the I/O thread calls it too. Returns
 * how many pins and reservations it released. */
size_t kvt_tier_expire(kvt_tier_t *t);

/* Counters since open. Histograms: I/O latency, bucket i counts I/Os that
 * took < 2^i microseconds (the last bucket: the rest). */
#define KVT_TIER_HIST 24
typedef struct kvt_tier_stats {
    uint32_t ram_slots, ram_used, ram_pinned, ram_reserved;
    uint32_t disk_slots, disk_used;
    uint64_t blocks;  /* held, in RAM or on disk */
    uint64_t lookups; /* keys looked up */
    uint64_t hits_ram, hits_disk, misses;
    uint64_t puts, gets, deletes;
    uint64_t ram_evictions;      /* RAM copies dropped */
    uint64_t drops;              /* blocks that left altogether */
    uint64_t disk_evictions;     /* NVMe copies dropped to make room */
    uint64_t admitted, rejected; /* demotion decisions */
    uint64_t demotions, promotions, prefetches;
    uint64_t checksum_failures;
    uint64_t io_errors;
    uint64_t lease_expired;
    uint64_t restored;    /* blocks reloaded at open */
    uint64_t restore_bad; /* records skipped at open */
    uint64_t read_hist[KVT_TIER_HIST], write_hist[KVT_TIER_HIST];
    uint64_t read_bytes, write_bytes;
} kvt_tier_stats_t;
void kvt_tier_stats(kvt_tier_t *t, kvt_tier_stats_t *st_p);

#endif
