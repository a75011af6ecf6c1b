/*
 * tiers/arena.c: the host-RAM arena. The contract is in arena_int.h.
 *
 * Space is reserved with fallocate() before anything is mapped, so a short
 * /dev/shm (or too few huge pages) is ENOSPC here rather than SIGBUS on some
 * later write. A named file is held with flock() from creation to unlink: a
 * second kvtierd sees the lock, and one that finds the file unlocked knows
 * its owner is gone.
 */
#include "tiers/arena_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "common/errtext.h"
#include "common/log.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older headers lack it */
#endif
#define ARENA_HUGETLBFS_MAGIC 0x958458f6 /* linux/magic.h's HUGETLBFS_MAGIC */
#define ARENA_SHM_DIR "/dev/shm/"
#define ARENA_OPEN_TRIES 8 /* a file that vanishes between our open()s each time */

_Static_assert(sizeof(kvt_arena_hdr_t) == 32, "the header layout is a file format");
_Static_assert(sizeof(KVT_ARENA_MAGIC) - 1 == sizeof(((kvt_arena_hdr_t *)0)->magic),
               "magic fills its field");

/* A failed syscall's errno as a status: out of room is NO_SPACE, the rest IO. */
static kvt_status_t arena_errno_status(int e)
{
    if (e == ENOSPC || e == ENOMEM || e == EFBIG || e == EDQUOT)
        return KVT_ERR_NO_SPACE;
    return KVT_ERR_IO;
}

/* The file for @name (see arena_int.h) in @path[0..cap); "" for a memfd. */
static kvt_status_t arena_path(const char *name, char *path, size_t cap, char *err, size_t errlen)
{
    int n;
    if (name == NULL || name[0] == '\0') {
        path[0] = '\0';
        return KVT_OK;
    }
    if (name[0] == '/') {
        n = snprintf(path, cap, "%s", name);
    } else if (strchr(name, '/') != NULL || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
        kvt_errf(err, errlen,
                 "arena name '%s': give a plain file name (placed in /dev/shm) or an absolute "
                 "path",
                 name);
        return KVT_ERR_INVAL;
    } else {
        n = snprintf(path, cap, ARENA_SHM_DIR "%s", name);
    }
    if (n < 0 || (size_t)n >= cap) {
        path[0] = '\0';
        kvt_errf(err, errlen, "arena name '%s': the path is too long (at most %zu bytes)", name,
                 cap - 1);
        return KVT_ERR_INVAL;
    }
    return KVT_OK;
}

/* The header that says @a is this process's. */
static void arena_hdr_fill(const kvt_arena_t *a, kvt_arena_hdr_t *h)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, KVT_ARENA_MAGIC, sizeof(h->magic));
    h->version = KVT_ARENA_VERSION;
    h->slot_bytes = a->slot_bytes;
    h->nslots = a->nslots;
    h->pid = (int32_t)getpid();
    h->slot_off = a->slot_off;
}

/* Reads the header of @fd; false when the file is too short or lacks the magic. */
static bool arena_hdr_read(int fd, kvt_arena_hdr_t *h)
{
    ssize_t n = pread(fd, h, sizeof(*h), 0);
    return n == (ssize_t)sizeof(*h) && memcmp(h->magic, KVT_ARENA_MAGIC, sizeof(h->magic)) == 0;
}

/* Removes @path if it is still the file open as @fd; call it with the lock held. */
static void arena_unlink(int fd, const char *path)
{
    struct stat mine, there;
    if (fstat(fd, &mine) == 0 && stat(path, &there) == 0 && mine.st_dev == there.st_dev &&
        mine.st_ino == there.st_ino && unlink(path) != 0)
        kvt_log_errno(KVT_LOG_WARN, "cannot remove %s", path);
}

/*
 * Opens and locks @path: a new file (*@created_p true), or a leftover arena
 * that no live kvtierd holds. Anything else there is refused untouched.
 */
static kvt_status_t arena_file_open(const char *path, int *fd_p, bool *created_p, char *err,
                                    size_t errlen)
{
    for (int tries = 0; tries < ARENA_OPEN_TRIES; tries++) {
        int fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0) {
            if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
                int e = errno;
                arena_unlink(fd, path);
                close(fd);
                kvt_errf(err, errlen, "arena %s: cannot lock the new file: %s", path, strerror(e));
                return e == EWOULDBLOCK ? KVT_ERR_EXISTS : KVT_ERR_IO;
            }
            *fd_p = fd;
            *created_p = true;
            return KVT_OK;
        }
        if (errno != EEXIST) {
            int e = errno;
            kvt_errf(err, errlen, "arena %s: cannot create: %s", path, strerror(e));
            return arena_errno_status(e);
        }
        fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == ENOENT) /* removed since the O_EXCL open: create it anew */
                continue;
            kvt_errf(err, errlen, "arena %s: exists and cannot be opened: %s; refusing to touch it",
                     path, strerror(e));
            return e == ELOOP || e == EISDIR || e == EACCES || e == EPERM || e == ENXIO
                       ? KVT_ERR_EXISTS
                       : KVT_ERR_IO;
        }
        struct stat st, now;
        kvt_arena_hdr_t h;
        if (fstat(fd, &st) != 0) {
            kvt_errf(err, errlen, "arena %s: fstat: %s", path, strerror(errno));
            close(fd);
            return KVT_ERR_IO;
        }
        if (!S_ISREG(st.st_mode)) {
            kvt_errf(err, errlen,
                     "arena %s: exists and is not a regular file; refusing to touch it", path);
            close(fd);
            return KVT_ERR_EXISTS;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            if (e != EWOULDBLOCK)
                kvt_errf(err, errlen, "arena %s: flock: %s", path, strerror(e));
            else if (!arena_hdr_read(fd, &h))
                kvt_errf(err, errlen,
                         "arena %s: exists, is locked by another process and is not a kvtier "
                         "arena; refusing to touch it",
                         path);
            else if (h.pid > 0 && (kill(h.pid, 0) == 0 || errno == EPERM))
                kvt_errf(err, errlen, "arena %s: held by a running kvtierd (pid %d)", path,
                         (int)h.pid);
            else /* the lock lives on in a process that shares the open file (arena_int.h) */
                kvt_errf(err, errlen,
                         "arena %s: its kvtierd (pid %d) is gone but another process still "
                         "holds it locked",
                         path, (int)h.pid);
            close(fd);
            return e == EWOULDBLOCK ? KVT_ERR_EXISTS : KVT_ERR_IO;
        }
        /* the owner unlinks before it lets go of the lock: a lock on a file no longer at
         * @path is on an orphan */
        if (stat(path, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
            close(fd);
            continue;
        }
        if (!arena_hdr_read(fd, &h)) {
            kvt_errf(err, errlen,
                     "arena %s: exists and is not a kvtier arena; refusing to touch it", path);
            close(fd);
            return KVT_ERR_EXISTS;
        }
        kvt_log_info("reusing %s, left behind by pid %d", path, (int)h.pid);
        *fd_p = fd;
        *created_p = false;
        return KVT_OK;
    }
    kvt_errf(err, errlen, "arena %s: the file keeps vanishing while it is opened", path);
    return KVT_ERR_IO;
}

/* Pre-faults every page of the mapping, writable. */
static kvt_status_t arena_populate(const kvt_arena_t *a, uint64_t page, char *err, size_t errlen)
{
    if (madvise(a->base, a->map_bytes, MADV_POPULATE_WRITE) == 0)
        return KVT_OK;
    int e = errno;
    if (e == EINVAL) { /* before Linux 5.14: touch each page, keeping what is there */
        for (uint64_t off = 0; off < a->map_bytes; off += page) {
            volatile uint8_t *p = a->base + off;
            *p = *p;
        }
        return KVT_OK;
    }
    kvt_errf(err, errlen, "arena %s: pre-faulting %llu bytes: %s", a->path[0] ? a->path : "(memfd)",
             (unsigned long long)a->map_bytes, strerror(e));
    /* EFAULT: a page could not be had (SIGBUS had it been touched) */
    return e == EFAULT ? KVT_ERR_NO_SPACE : arena_errno_status(e);
}

/* MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read. */
static uint64_t arena_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (f == NULL)
        return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024u;
}

kvt_status_t kvt_arena_open(kvt_arena_t *a, const kvt_arena_cfg_t *cfg, char *err, size_t errlen)
{
    kvt_arena_t r = {.fd = -1};
    kvt_status_t st;
    bool created = false;
    const char *what = "(memfd)";
    *a = r;

    if (cfg->block_bytes == 0) {
        kvt_errf(err, errlen, "arena: block size 0");
        return KVT_ERR_INVAL;
    }
    uint64_t slot_bytes =
        ((uint64_t)cfg->block_bytes + KVT_ARENA_ALIGN - 1) / KVT_ARENA_ALIGN * KVT_ARENA_ALIGN;
    if (slot_bytes > UINT32_MAX) {
        kvt_errf(err, errlen, "arena: block size %u is too large", cfg->block_bytes);
        return KVT_ERR_INVAL;
    }
    uint64_t nslots = cfg->ram_bytes / slot_bytes;
    /* slot numbers stop below KVT_SLOT_NONE (UINT32_MAX), the allocator's "none" */
    if (nslots == 0 || nslots >= UINT32_MAX) {
        kvt_errf(err, errlen, "arena: %llu bytes make %llu slots of %llu bytes; need 1 to %u slots",
                 (unsigned long long)cfg->ram_bytes, (unsigned long long)nslots,
                 (unsigned long long)slot_bytes, UINT32_MAX - 1);
        return KVT_ERR_INVAL;
    }
    r.slot_bytes = (uint32_t)slot_bytes;
    r.nslots = (uint32_t)nslots;
    st = arena_path(cfg->name, r.path, sizeof(r.path), err, errlen);
    if (st != KVT_OK)
        return st;

    uint64_t page = KVT_ARENA_ALIGN;
    if (r.path[0] == '\0') {
        /* sealing keeps an engine holding the fd from shrinking the memory under kvtierd */
        r.fd = memfd_create("kvtier-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (r.fd < 0) {
            int e = errno;
            kvt_errf(err, errlen, "arena: memfd_create: %s", strerror(e));
            return arena_errno_status(e);
        }
    } else {
        what = r.path;
        st = arena_file_open(r.path, &r.fd, &created, err, errlen);
        if (st != KVT_OK)
            return st;
        struct statfs sfs;
        struct stat sb;
        if (fstatfs(r.fd, &sfs) != 0 || fstat(r.fd, &sb) != 0) {
            kvt_errf(err, errlen, "arena %s: fstatfs: %s", what, strerror(errno));
            st = KVT_ERR_IO;
            goto err_close;
        }
        r.hugetlb = (unsigned long)sfs.f_type == ARENA_HUGETLBFS_MAGIC;
        /* hugetlbfs gives its huge page size as the block size */
        if (r.hugetlb && sb.st_blksize > (blksize_t)KVT_ARENA_ALIGN)
            page = (uint64_t)sb.st_blksize;
        r.slot_off = page; /* one (huge) page of header */
    }
    uint64_t slots_total = nslots * slot_bytes; /* < 2^64: both factors < 2^32 */
    if (slots_total > (uint64_t)INT64_MAX - r.slot_off - page) {
        kvt_errf(err, errlen, "arena %s: %llu bytes do not fit in a file", what,
                 (unsigned long long)slots_total);
        st = KVT_ERR_INVAL;
        goto err_close;
    }
    r.map_bytes = (r.slot_off + slots_total + page - 1) / page * page;

    if (!r.hugetlb) {
        /* shmem pages are real memory: reserving more than the machine has would bring the
         * OOM killer, not ENOSPC; a reused file's own pages are already counted as used */
        uint64_t have = arena_mem_available();
        struct stat sb;
        uint64_t own = fstat(r.fd, &sb) == 0 ? (uint64_t)sb.st_blocks * 512u : 0;
        if (have != 0 && r.map_bytes > have + own) {
            kvt_errf(err, errlen,
                     "arena %s: %llu bytes are more than the %llu bytes of memory available", what,
                     (unsigned long long)r.map_bytes, (unsigned long long)(have + own));
            st = KVT_ERR_NO_SPACE;
            goto err_close;
        }
    }
    if (r.path[0] != '\0' && !r.hugetlb) {
        /* the header first, so a new file is recognizable as an arena as early as can be;
         * hugetlbfs takes no write(): it gets its header through the mapping below */
        kvt_arena_hdr_t h;
        arena_hdr_fill(&r, &h);
        ssize_t n = pwrite(r.fd, &h, sizeof(h), 0);
        if (n != (ssize_t)sizeof(h)) {
            int e = n < 0 ? errno : ENOSPC;
            kvt_errf(err, errlen, "arena %s: writing the header: %s", what, strerror(e));
            st = arena_errno_status(e);
            goto err_close;
        }
    }
    if (ftruncate(r.fd, (off_t)r.map_bytes) != 0) {
        int e = errno;
        kvt_errf(err, errlen, "arena %s: sizing to %llu bytes: %s", what,
                 (unsigned long long)r.map_bytes, strerror(e));
        st = arena_errno_status(e);
        goto err_close;
    }
    int rc;
    do
        rc = fallocate(r.fd, 0, 0, (off_t)r.map_bytes);
    while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EOPNOTSUPP) { /* a file system without it faults pages in later */
        int e = errno;
        kvt_errf(err, errlen, "arena %s: reserving %llu bytes: %s", what,
                 (unsigned long long)r.map_bytes, strerror(e));
        st = arena_errno_status(e); /* ENOSPC: /dev/shm or the huge page pool is short */
        goto err_close;
    }
    if (r.path[0] == '\0' &&
        fcntl(r.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        kvt_errf(err, errlen, "arena: sealing the memfd: %s", strerror(errno));
        st = KVT_ERR_IO;
        goto err_close;
    }
    void *base = mmap(NULL, r.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        kvt_errf(err, errlen, "arena %s: mmap of %llu bytes: %s", what,
                 (unsigned long long)r.map_bytes, strerror(e));
        st = arena_errno_status(e);
        goto err_close;
    }
    r.base = base;
    /* EINVAL: a kernel without THP, nothing to turn off */
    if (!r.hugetlb && madvise(r.base, r.map_bytes, MADV_NOHUGEPAGE) != 0 && errno != EINVAL) {
        kvt_errf(err, errlen, "arena %s: madvise(MADV_NOHUGEPAGE): %s", what, strerror(errno));
        st = KVT_ERR_IO;
        goto err_unmap;
    }
    if (r.hugetlb) {
        kvt_arena_hdr_t h;
        arena_hdr_fill(&r, &h);
        memcpy(r.base, &h, sizeof(h));
    }
    if (cfg->populate) {
        st = arena_populate(&r, page, err, errlen);
        if (st != KVT_OK)
            goto err_unmap;
    }
    *a = r;
    return KVT_OK;

err_unmap:
    munmap(r.base, r.map_bytes);
err_close:
    if (created)
        arena_unlink(r.fd, r.path);
    close(r.fd);
    return st;
}

void kvt_arena_close(kvt_arena_t *a)
{
    if (a->base == NULL) /* closed: an open arena always has its mapping */
        return;
    if (a->path[0] != '\0')
        arena_unlink(a->fd, a->path);
    munmap(a->base, a->map_bytes);
    close(a->fd);
    a->fd = -1;
    a->base = NULL;
    a->map_bytes = 0;
    a->path[0] = '\0';
}
