/*
 * tiers/meta_int.h: the NVMe store's metadata in RocksDB (C API), in
 * --data-dir. One record per block on disk:
 *
 *   key   'b' ns(u32 BE) key(u64 BE)                        13 bytes
 *   value version(u8 = 1) slot(u32) len(u32) sum(u64) gen(u64), little-endian, 25 bytes
 *
 * where ns is a namespace id this store assigned (records 'n' ns(u32 BE) ->
 * the namespace's name bytes), sum the block's XXH3-64 over its len bytes,
 * and gen a counter that grows with every write. One record 's' holds the
 * store id, slot size and slot count of the disk it belongs to.
 *
 * Every change is one WriteBatch written with sync = true: when a call
 * returns KVT_OK the change survives a crash; when it fails nothing of it was
 * applied. Single-threaded (the tier thread).
 */
#ifndef KVT_TIERS_META_INT_H
#define KVT_TIERS_META_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define KVT_META_KEY_BYTES 13u
#define KVT_META_VAL_BYTES 25u
#define KVT_META_NS_MAX 512u /* longest namespace name */

typedef struct kvt_meta kvt_meta_t;

typedef struct kvt_meta_rec {
    uint32_t ns;   /* namespace id (kvt_meta_ns()) */
    uint64_t key;  /* block key */
    uint32_t slot; /* disk slot */
    uint32_t len;  /* bytes of the block */
    uint64_t sum;  /* XXH3-64 of the len bytes */
    uint64_t gen;  /* write generation */
} kvt_meta_rec_t;

/* The codec, on its own for the tests and the fuzz target. decode returns
 * false for a key or value of the wrong size, tag or version. */
void kvt_meta_key_encode(uint32_t ns, uint64_t key, uint8_t out[KVT_META_KEY_BYTES]);
void kvt_meta_val_encode(const kvt_meta_rec_t *r, uint8_t out[KVT_META_VAL_BYTES]);
bool kvt_meta_rec_decode(const uint8_t *k, size_t klen, const uint8_t *v, size_t vlen,
                         kvt_meta_rec_t *r_p);

typedef struct kvt_meta_cfg {
    const char *dir;     /* created (one level) when missing */
    uint64_t store_id;   /* the disk's */
    uint32_t slot_bytes; /* the disk's */
    uint32_t nslots;     /* the disk's */
    bool fresh_disk;     /* the disk was just created: an existing database's records are
                            dropped (they named the old disk's slots) */
} kvt_meta_cfg_t;

/*
 * Opens (creating) the database. Errors, with one line in @err: KVT_ERR_IO (a
 * dir that cannot be made or read, or is read-only), KVT_ERR_EXISTS (locked by
 * another process: another kvtierd uses this data dir; or its store record
 * names another disk while fresh_disk is false), KVT_ERR_INTERNAL (RocksDB
 * reported corruption, or the store record is malformed while fresh_disk is
 * false), KVT_ERR_INVAL (no dir), KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_meta_open(const kvt_meta_cfg_t *cfg, kvt_meta_t **meta_p, char *err,
                           size_t errlen);
void kvt_meta_close(kvt_meta_t *m);

/* The id of namespace @name (@len bytes, 1..KVT_META_NS_MAX), made durable
 * first when new. */
kvt_status_t kvt_meta_ns(kvt_meta_t *m, const char *name, size_t len, uint32_t *ns_p, char *err,
                         size_t errlen);
/* The name of namespace @ns, its length in *@len_p; NULL when unknown. Valid until close. */
const char *kvt_meta_ns_name(const kvt_meta_t *m, uint32_t ns, size_t *len_p);

/* Puts @nput records and deletes @ndel (ns, key) pairs (given as records;
 * only ns and key are read) in one synced batch. The deletes apply first: a
 * key both deleted and put ends up put. */
kvt_status_t kvt_meta_write(kvt_meta_t *m, const kvt_meta_rec_t *put, size_t nput,
                            const kvt_meta_rec_t *del, size_t ndel, char *err, size_t errlen);

/* Calls @fn for every block record in key order; stops early when @fn
 * returns false. A record that does not decode is skipped and counted in
 * *@bad_p (may be NULL). */
kvt_status_t kvt_meta_scan(kvt_meta_t *m, bool (*fn)(void *arg, const kvt_meta_rec_t *r), void *arg,
                           uint64_t *bad_p, char *err, size_t errlen);

#endif
