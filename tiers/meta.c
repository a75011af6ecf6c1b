/*
 * tiers/meta.c: the NVMe store's metadata in RocksDB. The contract is in
 * meta_int.h. Besides the block records ('b') the database holds the store
 * record
 *
 *   key 's'   value version(u8 = 1) store_id(u64) slot_bytes(u32) nslots(u32), LE, 17 bytes
 *
 * and one namespace record per namespace ('n' ns(u32 BE) -> name bytes),
 * which are read into memory at open: ids are few and looked up often.
 * Beside RocksDB's files the directory holds kvtier.lock, flock()ed while
 * the database is open (meta_lock()).
 */
#include "tiers/meta_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <rocksdb/c.h>
#include <xxhash.h>

#include "common/bytes.h"
#include "common/errtext.h"
#include "common/grow.h"
#include "common/log.h"

#define META_VERSION 1u
#define META_STORE_VAL_BYTES 17u
#define META_NS_KEY_BYTES 5u
#define META_LOCK_FILE "kvtier.lock"

typedef struct meta_ns {
    char *name;    /* owned, NUL-terminated after len bytes */
    uint32_t len;  /* bytes of the name */
    uint32_t id;   /* its id */
    uint64_t hash; /* XXH3-64 of the name */
} meta_ns_t;

struct kvt_meta {
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_writeoptions_t *wsync; /* every write: synced WAL */
    rocksdb_readoptions_t *rget;   /* point reads */
    rocksdb_readoptions_t *rscan;  /* block records: keys in ["b", "c") */
    rocksdb_writebatch_t *batch;   /* reused by every kvt_meta_write() */
    meta_ns_t *ns;                 /* the namespaces in id order */
    size_t nns, ns_cap;
    uint32_t *by_name;  /* open addressing on the name hash: index into ns + 1; 0 is empty */
    size_t by_name_cap; /* a power of two, at least twice nns */
    uint32_t ns_max;    /* the highest namespace id on record; 0 when none */
    int lock_fd;        /* META_LOCK_FILE, flock()ed while open; -1 when not */
};

static void put_le(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_be32(uint8_t *p, uint32_t v)
{
    for (size_t i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}

void kvt_meta_key_encode(uint32_t ns, uint64_t key, uint8_t out[KVT_META_KEY_BYTES])
{
    out[0] = 'b';
    put_be32(out + 1, ns);
    kvt_store_be64(out + 5, key);
}

void kvt_meta_val_encode(const kvt_meta_rec_t *r, uint8_t out[KVT_META_VAL_BYTES])
{
    out[0] = META_VERSION;
    put_le(out + 1, r->slot, 4);
    put_le(out + 5, r->len, 4);
    put_le(out + 9, r->sum, 8);
    put_le(out + 17, r->gen, 8);
}

bool kvt_meta_rec_decode(const uint8_t *k, size_t klen, const uint8_t *v, size_t vlen,
                         kvt_meta_rec_t *r_p)
{
    if (klen != KVT_META_KEY_BYTES || k[0] != 'b' || vlen != KVT_META_VAL_BYTES ||
        v[0] != META_VERSION)
        return false;
    r_p->ns = (uint32_t)kvt_load_be(k + 1, 4);
    r_p->key = kvt_load_be(k + 5, 8);
    r_p->slot = (uint32_t)kvt_load_le(v + 1, 4);
    r_p->len = (uint32_t)kvt_load_le(v + 5, 4);
    r_p->sum = kvt_load_le(v + 9, 8);
    r_p->gen = kvt_load_le(v + 17, 8);
    return true;
}

/* The store record of @cfg. */
static void store_encode(const kvt_meta_cfg_t *cfg, uint8_t out[META_STORE_VAL_BYTES])
{
    out[0] = META_VERSION;
    put_le(out + 1, cfg->store_id, 8);
    put_le(out + 9, cfg->slot_bytes, 4);
    put_le(out + 13, cfg->nslots, 4);
}

/* RocksDB's error text to a status: the lock messages mean another opener (RocksDB
 * 7.8: "While lock file: ..." across processes, "lock hold by current process" within
 * one); a permission or read-only failure is I/O even when it names the LOCK file. */
static kvt_status_t meta_open_status(const char *e)
{
    if (strstr(e, "Corruption") != NULL)
        return KVT_ERR_INTERNAL;
    if (strstr(e, "Permission denied") != NULL || strstr(e, "Read-only file system") != NULL)
        return KVT_ERR_IO;
    if (strstr(e, "While lock file") != NULL || strstr(e, "lock hold by current process") != NULL)
        return KVT_ERR_EXISTS;
    return KVT_ERR_IO;
}

/* Makes @dir (one level) when missing; refuses what is not a directory. */
static kvt_status_t meta_mkdir(const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0700) == 0)
        return KVT_OK;
    int e = errno;
    if (e != EEXIST) {
        kvt_errf(err, errlen, "cannot create data dir %s: %s%s", dir, strerror(e),
                 e == ENOENT ? " (its parent is missing)" : "");
        return KVT_ERR_IO;
    }
    struct stat st;
    if (stat(dir, &st) != 0) {
        kvt_errf(err, errlen, "data dir %s: %s", dir, strerror(errno));
        return KVT_ERR_IO;
    }
    if (!S_ISDIR(st.st_mode)) {
        kvt_errf(err, errlen, "data dir %s is not a directory", dir);
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

/*
 * Takes the data dir's own lock, before RocksDB opens it. RocksDB (7.8) renames
 * the LOG of a database before it finds the database's lock held by another
 * process, so a second kvtierd on this data dir would rename the first one's
 * info log on its way to the refusal: a file it did not create, touched. This
 * lock refuses it first, with RocksDB's lock left as the second guard.
 */
static kvt_status_t meta_lock(kvt_meta_t *m, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    int n = snprintf(path, sizeof(path), "%s/" META_LOCK_FILE, dir);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        kvt_errf(err, errlen, "data dir %s: the path is too long", dir);
        return KVT_ERR_INVAL;
    }
    m->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (m->lock_fd < 0) {
        kvt_errf(err, errlen, "data dir %s: cannot open its metadata: %s", dir, strerror(errno));
        return KVT_ERR_IO;
    }
    if (flock(m->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e == EWOULDBLOCK)
            kvt_errf(err, errlen, "data dir %s is in use by another kvtierd (%s is locked)", dir,
                     path);
        else
            kvt_errf(err, errlen, "data dir %s: flock %s: %s", dir, path, strerror(e));
        close(m->lock_fd);
        m->lock_fd = -1;
        return e == EWOULDBLOCK ? KVT_ERR_EXISTS : KVT_ERR_IO;
    }
    return KVT_OK;
}

/* Index of the namespace called @name in m->ns, or -1. */
static ptrdiff_t ns_find(const kvt_meta_t *m, const char *name, size_t len, uint64_t h)
{
    if (m->by_name_cap == 0)
        return -1;
    size_t mask = m->by_name_cap - 1;
    for (size_t i = h & mask; m->by_name[i] != 0; i = (i + 1) & mask) {
        const meta_ns_t *e = &m->ns[m->by_name[i] - 1];
        if (e->hash == h && e->len == len && memcmp(e->name, name, len) == 0)
            return (ptrdiff_t)(m->by_name[i] - 1);
    }
    return -1;
}

static void ns_table_put(uint32_t *tab, size_t cap, uint64_t h, uint32_t idx1)
{
    size_t i = h & (cap - 1);
    while (tab[i] != 0)
        i = (i + 1) & (cap - 1);
    tab[i] = idx1;
}

/* Room for one more namespace, so that adding it cannot fail. */
static kvt_status_t ns_reserve(kvt_meta_t *m)
{
    if (!kvt_grow(&m->ns, &m->ns_cap, m->nns + 1, sizeof(*m->ns), 16))
        return KVT_ERR_NO_MEM;
    if ((m->nns + 1) * 2 <= m->by_name_cap)
        return KVT_OK;
    size_t cap = m->by_name_cap ? m->by_name_cap * 2 : 32;
    uint32_t *tab = calloc(cap, sizeof(*tab));
    if (tab == NULL)
        return KVT_ERR_NO_MEM;
    for (size_t i = 0; i < m->nns; i++)
        ns_table_put(tab, cap, m->ns[i].hash, (uint32_t)i + 1);
    free(m->by_name);
    m->by_name = tab;
    m->by_name_cap = cap;
    return KVT_OK;
}

/* Adds a namespace after ns_reserve(); takes ownership of @name. Ids arrive in order. */
static void ns_insert(kvt_meta_t *m, uint32_t id, char *name, uint32_t len, uint64_t h)
{
    m->ns[m->nns] = (meta_ns_t){.name = name, .len = len, .id = id, .hash = h};
    m->nns++;
    ns_table_put(m->by_name, m->by_name_cap, h, (uint32_t)m->nns);
}

/* Reads every namespace record. A malformed one is skipped with a warning (its
 * id is still never given out again); of two with one name the first is kept. */
static kvt_status_t ns_load(kvt_meta_t *m, const char *dir, char *err, size_t errlen)
{
    kvt_status_t st = KVT_OK;
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_iterate_upper_bound(ro, "o", 1);
    rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, ro);
    for (rocksdb_iter_seek(it, "n", 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        if (kl != META_NS_KEY_BYTES) {
            kvt_log_warn("data dir %s: namespace record with a %zu-byte key skipped", dir, kl);
            continue;
        }
        uint32_t id = (uint32_t)kvt_load_be(k + 1, 4);
        if (id > m->ns_max)
            m->ns_max = id;
        uint64_t h = XXH3_64bits(v, vl);
        if (vl == 0 || vl > KVT_META_NS_MAX || ns_find(m, v, vl, h) >= 0) {
            kvt_log_warn("data dir %s: namespace %" PRIu32 " skipped: %s", dir, id,
                         vl == 0 || vl > KVT_META_NS_MAX ? "bad name length" : "name taken");
            continue;
        }
        char *name = malloc(vl + 1);
        if (name == NULL || (st = ns_reserve(m)) != KVT_OK) {
            free(name);
            kvt_errf(err, errlen, "data dir %s: out of memory loading namespaces", dir);
            st = KVT_ERR_NO_MEM;
            goto out;
        }
        memcpy(name, v, vl);
        name[vl] = '\0';
        ns_insert(m, id, name, (uint32_t)vl, h);
    }
    char *e = NULL;
    rocksdb_iter_get_error(it, &e);
    if (e != NULL) {
        kvt_errf(err, errlen, "data dir %s: reading namespaces: %s", dir, e);
        rocksdb_free(e);
        st = KVT_ERR_IO;
    }
out:
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return st;
}

/* Checks the store record against @cfg, or (a new database, or a fresh disk)
 * drops every block record and writes it, in one synced batch. */
static kvt_status_t store_check(kvt_meta_t *m, const kvt_meta_cfg_t *cfg, char *err, size_t errlen)
{
    char *e = NULL;
    size_t vl = 0;
    char *v = rocksdb_get(m->db, m->rget, "s", 1, &vl, &e);
    if (e != NULL) {
        kvt_errf(err, errlen, "data dir %s: reading the store record: %s", cfg->dir, e);
        rocksdb_free(e);
        return KVT_ERR_IO;
    }
    uint8_t want[META_STORE_VAL_BYTES];
    store_encode(cfg, want);
    if (v != NULL && !cfg->fresh_disk) {
        const uint8_t *p = (const uint8_t *)v;
        kvt_status_t st = KVT_OK;
        if (vl != META_STORE_VAL_BYTES || p[0] != META_VERSION) {
            kvt_errf(err, errlen, "data dir %s: the store record is malformed (%zu bytes)",
                     cfg->dir, vl);
            st = KVT_ERR_INTERNAL;
        } else if (memcmp(p, want, sizeof(want)) != 0) {
            kvt_errf(err, errlen,
                     "data dir %s holds the metadata of another disk store (store %016" PRIx64
                     ", %" PRIu64 " slots of %" PRIu64 " bytes; this disk: store %016" PRIx64
                     ", %" PRIu32 " slots of %" PRIu32 " bytes): remove the data dir, or point "
                     "--disk-path at the matching store",
                     cfg->dir, kvt_load_le(p + 1, 8), kvt_load_le(p + 13, 4), kvt_load_le(p + 9, 4),
                     cfg->store_id, cfg->nslots, cfg->slot_bytes);
            st = KVT_ERR_EXISTS;
        }
        rocksdb_free(v);
        return st;
    }
    if (v != NULL) {
        kvt_log_info("data dir %s: the disk is new: dropping the block records of the old one",
                     cfg->dir);
        rocksdb_free(v);
    }
    /* no store record: any block records name no known disk */
    rocksdb_writebatch_clear(m->batch);
    rocksdb_writebatch_delete_range(m->batch, "b", 1, "c", 1);
    rocksdb_writebatch_put(m->batch, "s", 1, (const char *)want, sizeof(want));
    rocksdb_write(m->db, m->wsync, m->batch, &e);
    if (e != NULL) {
        kvt_errf(err, errlen, "data dir %s: writing the store record: %s", cfg->dir, e);
        rocksdb_free(e);
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

kvt_status_t kvt_meta_open(const kvt_meta_cfg_t *cfg, kvt_meta_t **meta_p, char *err, size_t errlen)
{
    if (cfg->dir == NULL || cfg->dir[0] == '\0') {
        kvt_errf(err, errlen, "no data dir given");
        return KVT_ERR_INVAL;
    }
    kvt_status_t st = meta_mkdir(cfg->dir, err, errlen);
    if (st != KVT_OK)
        return st;
    kvt_meta_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        kvt_errf(err, errlen, "data dir %s: out of memory", cfg->dir);
        return KVT_ERR_NO_MEM;
    }
    m->lock_fd = -1;
    m->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(m->opts, 1);
    rocksdb_options_set_write_buffer_size(m->opts, 16u << 20);
    rocksdb_options_set_compression(m->opts, rocksdb_no_compression);
    rocksdb_options_set_max_open_files(m->opts, 256);
    rocksdb_options_set_max_log_file_size(m->opts, 1u << 20);
    rocksdb_options_set_keep_log_file_num(m->opts, 2);
    m->wsync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(m->wsync, 1);
    m->rget = rocksdb_readoptions_create();
    m->rscan = rocksdb_readoptions_create();
    rocksdb_readoptions_set_iterate_upper_bound(m->rscan, "c", 1);
    rocksdb_readoptions_set_fill_cache(m->rscan, 0); /* one pass at start: keep the cache */
    m->batch = rocksdb_writebatch_create();

    if ((st = meta_lock(m, cfg->dir, err, errlen)) != KVT_OK)
        goto err_meta;
    char *e = NULL;
    m->db = rocksdb_open(m->opts, cfg->dir, &e);
    if (e != NULL) {
        st = meta_open_status(e);
        if (st == KVT_ERR_EXISTS)
            kvt_errf(err, errlen, "data dir %s is in use by another kvtierd (%s)", cfg->dir, e);
        else
            kvt_errf(err, errlen, "data dir %s: cannot open its metadata: %s", cfg->dir, e);
        rocksdb_free(e);
        m->db = NULL;
        goto err_meta;
    }
    if ((st = store_check(m, cfg, err, errlen)) != KVT_OK ||
        (st = ns_load(m, cfg->dir, err, errlen)) != KVT_OK)
        goto err_meta;
    *meta_p = m;
    return KVT_OK;

err_meta:
    kvt_meta_close(m);
    return st;
}

void kvt_meta_close(kvt_meta_t *m)
{
    if (m == NULL)
        return;
    if (m->db != NULL)
        rocksdb_close(m->db);
    rocksdb_writebatch_destroy(m->batch);
    rocksdb_readoptions_destroy(m->rscan);
    rocksdb_readoptions_destroy(m->rget);
    rocksdb_writeoptions_destroy(m->wsync);
    rocksdb_options_destroy(m->opts);
    for (size_t i = 0; i < m->nns; i++)
        free(m->ns[i].name);
    free(m->ns);
    free(m->by_name);
    if (m->lock_fd >= 0)
        close(m->lock_fd); /* after RocksDB's close: the lock outlives the database */
    free(m);
}

kvt_status_t kvt_meta_ns(kvt_meta_t *m, const char *name, size_t len, uint32_t *ns_p, char *err,
                         size_t errlen)
{
    if (len == 0 || len > KVT_META_NS_MAX) {
        kvt_errf(err, errlen, "namespace name of %zu bytes: must be 1..%u", len, KVT_META_NS_MAX);
        return KVT_ERR_INVAL;
    }
    uint64_t h = XXH3_64bits(name, len);
    ptrdiff_t i = ns_find(m, name, len, h);
    if (i >= 0) {
        *ns_p = m->ns[i].id;
        return KVT_OK;
    }
    if (m->ns_max == UINT32_MAX) {
        kvt_errf(err, errlen, "no namespace id left");
        return KVT_ERR_NO_SPACE;
    }
    char *copy = malloc(len + 1);
    if (copy == NULL || ns_reserve(m) != KVT_OK) {
        free(copy);
        kvt_errf(err, errlen, "out of memory adding a namespace");
        return KVT_ERR_NO_MEM;
    }
    memcpy(copy, name, len);
    copy[len] = '\0';
    uint32_t id = m->ns_max + 1;
    uint8_t key[META_NS_KEY_BYTES] = {'n'};
    put_be32(key + 1, id);
    char *e = NULL;
    rocksdb_put(m->db, m->wsync, (const char *)key, sizeof(key), name, len, &e);
    if (e != NULL) {
        kvt_errf(err, errlen, "writing namespace %" PRIu32 ": %s", id, e);
        rocksdb_free(e);
        free(copy);
        return KVT_ERR_IO;
    }
    ns_insert(m, id, copy, (uint32_t)len, h);
    m->ns_max = id;
    *ns_p = id;
    return KVT_OK;
}

const char *kvt_meta_ns_name(const kvt_meta_t *m, uint32_t ns, size_t *len_p)
{
    /* ids given out here are dense from 1; a gap (a skipped record) costs a search */
    size_t lo = 0, hi = m->nns;
    if (ns >= 1 && ns - 1 < m->nns && m->ns[ns - 1].id == ns) {
        lo = ns - 1;
    } else {
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (m->ns[mid].id < ns)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == m->nns || m->ns[lo].id != ns)
            return NULL;
    }
    *len_p = m->ns[lo].len;
    return m->ns[lo].name;
}

kvt_status_t kvt_meta_write(kvt_meta_t *m, const kvt_meta_rec_t *put, size_t nput,
                            const kvt_meta_rec_t *del, size_t ndel, char *err, size_t errlen)
{
    if (nput == 0 && ndel == 0)
        return KVT_OK;
    uint8_t k[KVT_META_KEY_BYTES], v[KVT_META_VAL_BYTES];
    rocksdb_writebatch_clear(m->batch);
    for (size_t i = 0; i < ndel; i++) {
        kvt_meta_key_encode(del[i].ns, del[i].key, k);
        rocksdb_writebatch_delete(m->batch, (const char *)k, sizeof(k));
    }
    for (size_t i = 0; i < nput; i++) {
        kvt_meta_key_encode(put[i].ns, put[i].key, k);
        kvt_meta_val_encode(&put[i], v);
        rocksdb_writebatch_put(m->batch, (const char *)k, sizeof(k), (const char *)v, sizeof(v));
    }
    char *e = NULL;
    rocksdb_write(m->db, m->wsync, m->batch, &e);
    if (e != NULL) {
        kvt_errf(err, errlen, "writing %zu block records: %s", nput + ndel, e);
        rocksdb_free(e);
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

kvt_status_t kvt_meta_scan(kvt_meta_t *m, bool (*fn)(void *arg, const kvt_meta_rec_t *r), void *arg,
                           uint64_t *bad_p, char *err, size_t errlen)
{
    uint64_t bad = 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->rscan);
    for (rocksdb_iter_seek(it, "b", 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &kl);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vl);
        kvt_meta_rec_t r;
        if (!kvt_meta_rec_decode(k, kl, v, vl, &r)) {
            bad++;
            continue;
        }
        if (!fn(arg, &r))
            break;
    }
    char *e = NULL;
    rocksdb_iter_get_error(it, &e);
    rocksdb_iter_destroy(it);
    if (e != NULL) {
        kvt_errf(err, errlen, "reading block records: %s", e);
        rocksdb_free(e);
        return KVT_ERR_IO;
    }
    if (bad_p != NULL)
        *bad_p = bad;
    return KVT_OK;
}
