/*
 * tiers/disk.c: the NVMe store's I/O (O_DIRECT file or block device, io_uring).
 * The contract is in disk_int.h.
 */
#include "tiers/disk_int.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <liburing.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/errtext.h"
#include "common/log.h"

#define DISK_VERSION 1u
#define DISK_ALIGN 4096u
#define DISK_SLOT_MAX (1u << 30)    /* a completion's res is an int: keep a slot far below */
#define DISK_DEPTH_MAX 32768u       /* the kernel's IORING_MAX_ENTRIES */
#define DISK_REG_CHUNK (1ull << 30) /* bytes per registered buffer */
#define DISK_REG_MAX 16384u         /* the kernel's IORING_MAX_REG_BUFFERS */

/* The header's fields, little-endian; the checksum (XXH3-64) covers the bytes before it. */
#define HDR_VERSION 8 /* u32 */
#define HDR_SLOT 12   /* u32 slot_bytes */
#define HDR_NSLOTS 16 /* u64 */
#define HDR_ID 24     /* u64 store id */
#define HDR_SUM 32    /* u64 */

struct kvt_disk {
    struct io_uring ring;
    int fd;  /* the file or device, O_DIRECT; flock()ed; registered as file 0 */
    int efd; /* eventfd signalled on completions */
    uint32_t slot_bytes;
    uint32_t nslots;
    uint32_t io_depth;
    uint32_t inflight; /* queued or in flight */
    uint64_t store_id;
    bool created;
    /* The registered range: buffer i is [reg_base + i * reg_step, + min(1 GiB, rest)).
     * Consecutive buffers overlap by a slot where slots are small enough, so that any
     * I/O inside the range lies within one of them. */
    uint8_t *reg_base;
    uint64_t reg_len;
    uint64_t reg_step;
    uint32_t nregs;
};

static void put_le(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void hdr_build(uint8_t *hdr, uint32_t slot_bytes, uint64_t nslots, uint64_t id)
{
    memset(hdr, 0, KVT_DISK_HEADER);
    memcpy(hdr, KVT_DISK_MAGIC, 8);
    put_le(hdr + HDR_VERSION, DISK_VERSION, 4);
    put_le(hdr + HDR_SLOT, slot_bytes, 4);
    put_le(hdr + HDR_NSLOTS, nslots, 8);
    put_le(hdr + HDR_ID, id, 8);
    put_le(hdr + HDR_SUM, XXH3_64bits(hdr, HDR_SUM), 8);
}

/*
 * Reads and checks the header against the configured slot size and @size,
 * the bytes the file or device holds. KVT_ERR_NOT_FOUND (no message): no
 * kvtier header there. KVT_ERR_EXISTS: a kvtier header this store cannot use.
 */
static kvt_status_t hdr_load(kvt_disk_t *d, const char *path, uint8_t *hdr, uint64_t size,
                             char *err, size_t errlen)
{
    ssize_t n = pread(d->fd, hdr, KVT_DISK_HEADER, 0);
    if (n < 0) {
        kvt_errf(err, errlen, "disk store %s: reading the header: %s", path, strerror(errno));
        return KVT_ERR_IO;
    }
    if ((size_t)n < KVT_DISK_HEADER || memcmp(hdr, KVT_DISK_MAGIC, 8) != 0 ||
        kvt_load_le(hdr + HDR_SUM, 8) != XXH3_64bits(hdr, HDR_SUM))
        return KVT_ERR_NOT_FOUND;
    uint32_t version = (uint32_t)kvt_load_le(hdr + HDR_VERSION, 4);
    uint32_t slot_bytes = (uint32_t)kvt_load_le(hdr + HDR_SLOT, 4);
    uint64_t nslots = kvt_load_le(hdr + HDR_NSLOTS, 8);
    if (version != DISK_VERSION) {
        kvt_errf(err, errlen, "disk store %s has header version %u, this kvtierd reads %u", path,
                 version, DISK_VERSION);
        return KVT_ERR_EXISTS;
    }
    if (slot_bytes != d->slot_bytes) {
        kvt_errf(err, errlen,
                 "disk store %s has %u-byte slots, not %u: --block-bytes must match the "
                 "store's, or remove the store",
                 path, slot_bytes, d->slot_bytes);
        return KVT_ERR_EXISTS;
    }
    if (nslots == 0 || nslots > UINT32_MAX || (size - KVT_DISK_HEADER) / slot_bytes < nslots) {
        kvt_errf(err, errlen,
                 "disk store %s is damaged: its header counts %llu slots, it holds %llu bytes",
                 path, (unsigned long long)nslots, (unsigned long long)size);
        return KVT_ERR_EXISTS;
    }
    d->nslots = (uint32_t)nslots;
    d->store_id = kvt_load_le(hdr + HDR_ID, 8);
    return KVT_OK;
}

/* Writes a new header for the slots that fit in @size bytes, durably. */
static kvt_status_t hdr_write(kvt_disk_t *d, const char *path, uint8_t *hdr, uint64_t size,
                              char *err, size_t errlen)
{
    uint64_t nslots = (size - KVT_DISK_HEADER) / d->slot_bytes;
    uint64_t id = 0;
    while (id == 0) { /* 0 is left for "no store" */
        if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
            kvt_errf(err, errlen, "disk store %s: getrandom: %s", path, strerror(errno));
            return KVT_ERR_IO;
        }
    }
    d->nslots = nslots > UINT32_MAX ? UINT32_MAX : (uint32_t)nslots;
    d->store_id = id;
    hdr_build(hdr, d->slot_bytes, d->nslots, id);
    ssize_t n = pwrite(d->fd, hdr, KVT_DISK_HEADER, 0);
    if (n != (ssize_t)KVT_DISK_HEADER || fdatasync(d->fd) != 0) {
        kvt_errf(err, errlen, "disk store %s: writing the header: %s", path,
                 n < 0 || n == (ssize_t)KVT_DISK_HEADER ? strerror(errno) : "short write");
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

static kvt_status_t disk_lock(kvt_disk_t *d, const char *path, char *err, size_t errlen)
{
    /* a process that just died may hold the lock a moment longer: the kernel tears its
     * io_uring (which holds the file) down after the exit, so a restart waits that out */
    for (int tries = 0; tries < 50; tries++) {
        if (flock(d->fd, LOCK_EX | LOCK_NB) == 0)
            return KVT_OK;
        if (errno != EWOULDBLOCK)
            break;
        usleep(20000);
    }
    if (errno == EWOULDBLOCK) {
        kvt_errf(err, errlen, "disk store %s is in use by another process", path);
        return KVT_ERR_EXISTS;
    }
    kvt_errf(err, errlen, "disk store %s: flock: %s", path, strerror(errno));
    return KVT_ERR_IO;
}

static kvt_status_t open_failed(const char *path, int e, char *err, size_t errlen)
{
    if (e == EINVAL) {
        kvt_errf(err, errlen, "disk store %s: the file system does not support O_DIRECT", path);
        return KVT_ERR_IO;
    }
    kvt_errf(err, errlen, "disk store %s: open: %s", path, strerror(e));
    return KVT_ERR_IO;
}

/* Makes the new file's name durable: fsync of its directory. */
static kvt_status_t sync_dir(const char *path, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        kvt_errf(err, errlen, "disk store %s: syncing its directory: %s", path, strerror(errno));
        if (dfd >= 0)
            close(dfd);
        return KVT_ERR_IO;
    }
    close(dfd);
    return KVT_OK;
}

static kvt_status_t open_file(kvt_disk_t *d, const kvt_disk_cfg_t *cfg, uint8_t *hdr, char *err,
                              size_t errlen);

/*
 * A new store file: created (O_EXCL) without O_DIRECT, which is then set
 * with fcntl, so that a refusal leaves no doubt whose file to remove.
 */
static kvt_status_t create_file(kvt_disk_t *d, const kvt_disk_cfg_t *cfg, uint8_t *hdr, char *err,
                                size_t errlen)
{
    const char *path = cfg->path;
    if (cfg->bytes == 0) {
        kvt_errf(err, errlen, "disk store %s does not exist and no size was given to create it",
                 path);
        return KVT_ERR_INVAL;
    }
    if (cfg->bytes < (uint64_t)KVT_DISK_HEADER + cfg->slot_bytes) {
        kvt_errf(err, errlen,
                 "disk store %s: %llu bytes is too small for one slot (%u bytes and a %u-byte "
                 "header)",
                 path, (unsigned long long)cfg->bytes, cfg->slot_bytes, KVT_DISK_HEADER);
        return KVT_ERR_NO_SPACE;
    }
    d->fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (d->fd < 0 && errno == EEXIST) /* another creator got there between stat and open */
        return open_file(d, cfg, hdr, err, errlen);
    if (d->fd < 0) {
        kvt_errf(err, errlen, "disk store %s: cannot create it: %s", path, strerror(errno));
        return KVT_ERR_IO;
    }
    d->created = true;
    kvt_status_t st;
    if (fcntl(d->fd, F_SETFL, O_DIRECT) != 0) {
        st = open_failed(path, errno, err, errlen);
        goto err_unlink;
    }
    st = disk_lock(d, path, err, errlen);
    if (st != KVT_OK)
        goto err_unlink;
    /* preallocate only what whole slots use (slot numbers are 32 bits) */
    uint64_t used = KVT_DISK_HEADER + (uint64_t)UINT32_MAX * cfg->slot_bytes;
    uint64_t bytes = cfg->bytes < used ? cfg->bytes : used;
    if (fallocate(d->fd, 0, 0, (off_t)bytes) != 0) {
        int e = errno;
        if (e == EOPNOTSUPP) {
            kvt_errf(err, errlen, "disk store %s: the file system cannot preallocate", path);
            st = KVT_ERR_IO;
        } else {
            kvt_errf(err, errlen, "disk store %s: preallocating %llu bytes: %s", path,
                     (unsigned long long)bytes, strerror(e));
            st = e == ENOSPC || e == EFBIG ? KVT_ERR_NO_SPACE : KVT_ERR_IO;
        }
        goto err_unlink;
    }
    st = hdr_write(d, path, hdr, bytes, err, errlen);
    if (st == KVT_OK)
        st = sync_dir(path, err, errlen);
    if (st != KVT_OK)
        goto err_unlink;
    kvt_log_info("disk store %s created: %u slots of %u bytes", path, d->nslots, d->slot_bytes);
    return KVT_OK;

err_unlink:
    unlink(path);
    close(d->fd);
    d->fd = -1;
    d->created = false;
    return st;
}

/* An existing file: it must carry a kvtier header made with the same slot size. */
static kvt_status_t open_file(kvt_disk_t *d, const kvt_disk_cfg_t *cfg, uint8_t *hdr, char *err,
                              size_t errlen)
{
    const char *path = cfg->path;
    d->fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
    if (d->fd < 0 && errno == ELOOP) {
        kvt_errf(err, errlen, "disk store %s is a symbolic link: give the file's own path", path);
        return KVT_ERR_INVAL;
    }
    if (d->fd < 0)
        return open_failed(path, errno, err, errlen);
    struct stat st;
    kvt_status_t s;
    if (fstat(d->fd, &st) != 0) {
        kvt_errf(err, errlen, "disk store %s: fstat: %s", path, strerror(errno));
        s = KVT_ERR_IO;
        goto err_close;
    }
    if (!S_ISREG(st.st_mode)) { /* replaced since stat() */
        kvt_errf(err, errlen, "disk store %s is not a regular file", path);
        s = KVT_ERR_INVAL;
        goto err_close;
    }
    s = disk_lock(d, path, err, errlen);
    if (s != KVT_OK)
        goto err_close;
    s = hdr_load(d, path, hdr, (uint64_t)st.st_size, err, errlen);
    if (s == KVT_ERR_NOT_FOUND) {
        kvt_errf(err, errlen, "%s is not a kvtier store; refusing to touch it", path);
        s = KVT_ERR_EXISTS;
    }
    if (s != KVT_OK)
        goto err_close;
    if (cfg->bytes != 0 && cfg->bytes != (uint64_t)st.st_size)
        kvt_log_info("disk store %s keeps its size of %llu bytes (%u slots), not the %llu "
                     "configured",
                     path, (unsigned long long)st.st_size, d->nslots,
                     (unsigned long long)cfg->bytes);
    return KVT_OK;

err_close:
    close(d->fd);
    d->fd = -1;
    return s;
}

/* A block device: its header, or a fresh one where it has none and formatting is allowed. */
static kvt_status_t open_device(kvt_disk_t *d, const kvt_disk_cfg_t *cfg, uint8_t *hdr, char *err,
                                size_t errlen)
{
    const char *path = cfg->path;
    /* O_EXCL on a block device: EBUSY while it is mounted or held exclusively */
    d->fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC | O_EXCL);
    if (d->fd < 0 && errno == EBUSY) {
        kvt_errf(err, errlen, "disk store %s is in use (mounted, or held by another program)",
                 path);
        return KVT_ERR_EXISTS;
    }
    if (d->fd < 0)
        return open_failed(path, errno, err, errlen);
    uint64_t size = 0;
    kvt_status_t s;
    if (ioctl(d->fd, BLKGETSIZE64, &size) != 0) {
        kvt_errf(err, errlen, "disk store %s: BLKGETSIZE64: %s", path, strerror(errno));
        s = KVT_ERR_IO;
        goto err_close;
    }
    if (size < (uint64_t)KVT_DISK_HEADER + d->slot_bytes) {
        kvt_errf(err, errlen, "disk store %s: the device's %llu bytes are too small for one slot",
                 path, (unsigned long long)size);
        s = KVT_ERR_NO_SPACE;
        goto err_close;
    }
    s = disk_lock(d, path, err, errlen);
    if (s != KVT_OK)
        goto err_close;
    s = hdr_load(d, path, hdr, size, err, errlen);
    if (s == KVT_ERR_NOT_FOUND && cfg->format_device) {
        s = hdr_write(d, path, hdr, size, err, errlen);
        if (s == KVT_OK) {
            d->created = true;
            kvt_log_info("disk store %s formatted: %u slots of %u bytes", path, d->nslots,
                         d->slot_bytes);
        }
    } else if (s == KVT_ERR_NOT_FOUND) {
        kvt_errf(err, errlen,
                 "device %s has no kvtier header; refusing to touch it (a device is formatted "
                 "only when asked to)",
                 path);
        s = KVT_ERR_EXISTS;
    }
    if (s != KVT_OK)
        goto err_close;
    return KVT_OK;

err_close:
    close(d->fd);
    d->fd = -1;
    return s;
}

static kvt_status_t open_store(kvt_disk_t *d, const kvt_disk_cfg_t *cfg, uint8_t *hdr, char *err,
                               size_t errlen)
{
    struct stat st;
    if (stat(cfg->path, &st) != 0) {
        if (errno == ENOENT)
            return create_file(d, cfg, hdr, err, errlen);
        kvt_errf(err, errlen, "disk store %s: %s", cfg->path, strerror(errno));
        return KVT_ERR_IO;
    }
    if (S_ISREG(st.st_mode))
        return open_file(d, cfg, hdr, err, errlen);
    if (S_ISBLK(st.st_mode))
        return open_device(d, cfg, hdr, err, errlen);
    kvt_errf(err, errlen, "disk store %s is %s", cfg->path,
             S_ISDIR(st.st_mode) ? "a directory" : "not a regular file or block device");
    return KVT_ERR_INVAL;
}

static kvt_status_t ring_init(kvt_disk_t *d, const kvt_disk_cfg_t *cfg, char *err, size_t errlen)
{
    struct io_uring_params p = {.flags = cfg->sqpoll ? IORING_SETUP_SQPOLL : 0};
    int rc = io_uring_queue_init_params(cfg->io_depth, &d->ring, &p);
    if (rc < 0 && cfg->sqpoll && (rc == -EPERM || rc == -EINVAL)) {
        kvt_log_warn("disk store %s: io_uring refused sqpoll (%s); submitting without it",
                     cfg->path, strerror(-rc));
        memset(&p, 0, sizeof(p));
        rc = io_uring_queue_init_params(cfg->io_depth, &d->ring, &p);
    }
    if (rc < 0) {
        kvt_errf(err, errlen, "disk store %s: io_uring unavailable: %s", cfg->path, strerror(-rc));
        return KVT_ERR_IO;
    }
    const char *what = "registering the file";
    rc = io_uring_register_files(&d->ring, &d->fd, 1);
    if (rc < 0)
        goto err_ring;
    what = "eventfd";
    d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->efd < 0) {
        rc = -errno;
        goto err_ring;
    }
    what = "registering the eventfd";
    rc = io_uring_register_eventfd(&d->ring, d->efd);
    if (rc < 0)
        goto err_efd;
    return KVT_OK;

err_efd:
    close(d->efd);
    d->efd = -1;
err_ring:
    io_uring_queue_exit(&d->ring);
    kvt_errf(err, errlen, "disk store %s: io_uring %s: %s", cfg->path, what, strerror(-rc));
    return KVT_ERR_IO;
}

kvt_status_t kvt_disk_open(const kvt_disk_cfg_t *cfg, kvt_disk_t **disk_p, char *err, size_t errlen)
{
    if (cfg == NULL || cfg->path == NULL || cfg->path[0] == '\0' || strlen(cfg->path) >= PATH_MAX) {
        kvt_errf(err, errlen, "disk store: no path, or one too long");
        return KVT_ERR_INVAL;
    }
    if (cfg->slot_bytes == 0 || cfg->slot_bytes % DISK_ALIGN != 0 ||
        cfg->slot_bytes > DISK_SLOT_MAX) {
        kvt_errf(err, errlen, "disk store %s: slot size %u is not a multiple of %u up to %u",
                 cfg->path, cfg->slot_bytes, DISK_ALIGN, DISK_SLOT_MAX);
        return KVT_ERR_INVAL;
    }
    if (cfg->io_depth == 0 || cfg->io_depth > DISK_DEPTH_MAX) {
        kvt_errf(err, errlen, "disk store %s: io depth %u is not in 1..%u", cfg->path,
                 cfg->io_depth, DISK_DEPTH_MAX);
        return KVT_ERR_INVAL;
    }
    kvt_disk_t *d = calloc(1, sizeof(*d));
    void *hdr = NULL;
    if (d == NULL || posix_memalign(&hdr, DISK_ALIGN, KVT_DISK_HEADER) != 0) {
        free(d);
        kvt_errf(err, errlen, "disk store %s: out of memory", cfg->path);
        return KVT_ERR_NO_MEM;
    }
    d->fd = -1;
    d->efd = -1;
    d->slot_bytes = cfg->slot_bytes;
    d->io_depth = cfg->io_depth;
    kvt_status_t st = open_store(d, cfg, hdr, err, errlen);
    if (st != KVT_OK)
        goto err_free;
    st = ring_init(d, cfg, err, errlen);
    if (st != KVT_OK)
        goto err_store;
    free(hdr);
    *disk_p = d;
    return KVT_OK;

err_store:
    if (d->created) {
        struct stat sb;
        if (fstat(d->fd, &sb) == 0 && S_ISREG(sb.st_mode))
            unlink(cfg->path);
    }
    close(d->fd);
err_free:
    free(hdr);
    free(d);
    return st;
}

/* The registered buffer holding [buf, buf + len), or -1. */
static int reg_index(const kvt_disk_t *d, const uint8_t *buf, uint32_t len)
{
    if (d->nregs == 0 || buf < d->reg_base)
        return -1;
    uint64_t off = (uint64_t)(buf - d->reg_base);
    if (off >= d->reg_len || len > d->reg_len - off)
        return -1;
    uint64_t i = off / d->reg_step;
    if (i >= d->nregs) /* the tail of the last buffer */
        i = d->nregs - 1;
    uint64_t start = i * d->reg_step;
    uint64_t end =
        start + (d->reg_len - start < DISK_REG_CHUNK ? d->reg_len - start : DISK_REG_CHUNK);
    return off + len <= end ? (int)i : -1;
}

kvt_status_t kvt_disk_register(kvt_disk_t *d, void *base, uint64_t len, char *err, size_t errlen)
{
    if (d->nregs != 0) {
        kvt_errf(err, errlen, "disk store: buffers are registered already");
        return KVT_ERR_INVAL;
    }
    if (base == NULL || len == 0 || (uintptr_t)base % DISK_ALIGN != 0) {
        kvt_errf(err, errlen, "disk store: buffers to register must be %u-aligned and not empty",
                 DISK_ALIGN);
        return KVT_ERR_INVAL;
    }
    uint64_t step = DISK_REG_CHUNK;
    if (d->slot_bytes <= DISK_REG_CHUNK / 2)
        step = DISK_REG_CHUNK - d->slot_bytes;
    uint64_t n = len <= DISK_REG_CHUNK ? 1 : 1 + (len - DISK_REG_CHUNK + step - 1) / step;
    if (n > DISK_REG_MAX) {
        kvt_errf(err, errlen, "disk store: %llu bytes of buffers is more than io_uring registers",
                 (unsigned long long)len);
        return KVT_ERR_TOO_BIG;
    }
    struct iovec *iov = calloc(n, sizeof(*iov));
    if (iov == NULL) {
        kvt_errf(err, errlen, "disk store: out of memory");
        return KVT_ERR_NO_MEM;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t off = i * step;
        iov[i].iov_base = (uint8_t *)base + off;
        iov[i].iov_len = len - off < DISK_REG_CHUNK ? len - off : DISK_REG_CHUNK;
    }
    int rc = io_uring_register_buffers(&d->ring, iov, (unsigned)n);
    free(iov);
    if (rc < 0) {
        kvt_errf(err, errlen, "disk store: registering %llu bytes of buffers with io_uring: %s%s",
                 (unsigned long long)len, strerror(-rc),
                 rc == -ENOMEM ? " (is the locked-memory limit, ulimit -l, too low?)" : "");
        return rc == -ENOMEM ? KVT_ERR_NO_MEM : KVT_ERR_IO;
    }
    d->reg_base = base;
    d->reg_len = len;
    d->reg_step = step;
    d->nregs = (uint32_t)n;
    return KVT_OK;
}

/* Prepares the rest of @io (io->res bytes are done) in @sqe. */
static void prep(const kvt_disk_t *d, struct io_uring_sqe *sqe, kvt_disk_io_t *io)
{
    uint32_t done = (uint32_t)io->res;
    uint8_t *buf = (uint8_t *)io->buf + done;
    uint32_t len = io->len - done;
    uint64_t off = KVT_DISK_HEADER + (uint64_t)io->slot * d->slot_bytes + done;
    int idx = reg_index(d, buf, len);
    if (io->write) {
        if (idx >= 0)
            io_uring_prep_write_fixed(sqe, 0, buf, len, off, idx);
        else
            io_uring_prep_write(sqe, 0, buf, len, off);
    } else if (idx >= 0) {
        io_uring_prep_read_fixed(sqe, 0, buf, len, off, idx);
    } else {
        io_uring_prep_read(sqe, 0, buf, len, off);
    }
    if (io->write)
        sqe->rw_flags = RWF_DSYNC; /* durable when it completes */
    io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    io_uring_sqe_set_data(sqe, io);
}

/* An SQE; none free (the ring is never fuller than inflight) is handled anyway. */
static struct io_uring_sqe *get_sqe(kvt_disk_t *d)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
    if (sqe == NULL) {
        io_uring_submit(&d->ring);
        sqe = io_uring_get_sqe(&d->ring);
    }
    return sqe;
}

kvt_status_t kvt_disk_queue(kvt_disk_t *d, kvt_disk_io_t *io)
{
    if (io->slot >= d->nslots || io->len == 0 || io->len % DISK_ALIGN != 0 ||
        io->len > d->slot_bytes || io->buf == NULL || (uintptr_t)io->buf % DISK_ALIGN != 0)
        return KVT_ERR_INVAL;
    if (d->inflight >= d->io_depth)
        return KVT_ERR_LIMIT;
    struct io_uring_sqe *sqe = get_sqe(d);
    if (sqe == NULL)
        return KVT_ERR_LIMIT;
    io->res = 0; /* bytes done, until it completes */
    io->submit_ns = kvt_clock_ns();
    prep(d, sqe, io);
    d->inflight++;
    return KVT_OK;
}

void kvt_disk_submit(kvt_disk_t *d)
{
    int rc = io_uring_submit(&d->ring);
    /* what the kernel did not take stays in the ring for the next submit */
    if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && rc != -EINTR)
        kvt_log_warn("disk store: io_uring submit: %s", strerror(-rc));
}

/* Takes @res for @io: true when @io is complete, false when the rest of a short transfer
 * was queued again. */
static bool take(kvt_disk_t *d, kvt_disk_io_t *io, int res)
{
    if (res > 0 && (uint32_t)res < io->len - (uint32_t)io->res) {
        io->res += res;
        struct io_uring_sqe *sqe = get_sqe(d);
        if (sqe != NULL) {
            prep(d, sqe, io);
            return false;
        }
        res = -EIO;
    }
    io->res = res > 0 ? (int)io->len : res == 0 ? -EIO : res;
    return true;
}

/* The first completion, waiting up to @wait_ms: 0, or -errno (-EAGAIN, -ETIME, -EINTR). */
static int wait_first(kvt_disk_t *d, int wait_ms, struct io_uring_cqe **cqe_p)
{
    int rc = io_uring_peek_cqe(&d->ring, cqe_p);
    if (rc != -EAGAIN || wait_ms == 0)
        return rc;
    if (io_uring_sq_ready(&d->ring) > 0) /* queued, never submitted: would never complete */
        io_uring_submit(&d->ring);
    if (wait_ms < 0)
        return io_uring_wait_cqe(&d->ring, cqe_p);
    struct __kernel_timespec ts = {.tv_sec = wait_ms / 1000,
                                   .tv_nsec = (long long)(wait_ms % 1000) * 1000000};
    return io_uring_wait_cqe_timeout(&d->ring, cqe_p, &ts);
}

/* Hands out @cqe and every completion already there; returns how many completed, and sets
 * *@requeued_p when the rest of a short transfer was queued again (not yet submitted). */
static size_t drain(kvt_disk_t *d, struct io_uring_cqe *cqe,
                    void (*done)(void *arg, kvt_disk_io_t *io), void *arg, bool *requeued_p)
{
    size_t n = 0;
    do {
        kvt_disk_io_t *io = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&d->ring, cqe); /* before @done, which may queue more */
        if (!take(d, io, res)) {
            *requeued_p = true;
            continue;
        }
        d->inflight--;
        n++;
        done(arg, io);
    } while (io_uring_peek_cqe(&d->ring, &cqe) == 0);
    return n;
}

size_t kvt_disk_reap(kvt_disk_t *d, int wait_ms, void (*done)(void *arg, kvt_disk_io_t *io),
                     void *arg)
{
    size_t n = 0;
    while (d->inflight > 0) {
        struct io_uring_cqe *cqe;
        if (wait_first(d, wait_ms, &cqe) != 0)
            break;
        bool requeued = false;
        n += drain(d, cqe, done, arg, &requeued);
        if (requeued)
            io_uring_submit(&d->ring);
        if (n > 0 || wait_ms >= 0) /* only short transfers came back: -1 waits on */
            break;
    }
    return n;
}

uint32_t kvt_disk_inflight(const kvt_disk_t *d)
{
    return d->inflight;
}

static void drop(void *arg, kvt_disk_io_t *io)
{
    (void)arg;
    (void)io;
}

void kvt_disk_close(kvt_disk_t *d)
{
    if (d == NULL)
        return;
    /* the kernel may still be writing the callers' buffers: let it finish */
    while (d->inflight > 0) {
        struct io_uring_cqe *cqe;
        int rc = wait_first(d, -1, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc != 0) {
            kvt_log_warn("disk store: %u I/Os still in flight at close: %s", d->inflight,
                         strerror(-rc));
            break;
        }
        bool requeued = false;
        drain(d, cqe, drop, NULL, &requeued);
        if (requeued)
            io_uring_submit(&d->ring);
    }
    io_uring_unregister_eventfd(&d->ring);
    if (d->nregs != 0)
        io_uring_unregister_buffers(&d->ring);
    io_uring_unregister_files(&d->ring);
    io_uring_queue_exit(&d->ring);
    close(d->efd);
    close(d->fd); /* and with it the flock */
    free(d);
}

uint32_t kvt_disk_nslots(const kvt_disk_t *d)
{
    return d->nslots;
}

uint64_t kvt_disk_store_id(const kvt_disk_t *d)
{
    return d->store_id;
}

bool kvt_disk_created(const kvt_disk_t *d)
{
    return d->created;
}

int kvt_disk_event_fd(const kvt_disk_t *d)
{
    return d->efd;
}
