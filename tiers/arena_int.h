/*
 * tiers/arena_int.h: the host-RAM arena. kvtierd creates it at start and owns
 * it; engines map it through the fd (SCM_RIGHTS) or the file's stable name,
 * and copy HBM <-> slots themselves.
 *
 * Backing, by --arena-name:
 *   ""                  an anonymous memfd ("kvtier-arena"), reachable only through the fd;
 *   "NAME" (no '/')     /dev/shm/NAME;
 *   "/abs/path"         that file, e.g. on a hugetlbfs mount.
 *
 * A named file starts with one 4 KiB header page (magic, version, geometry,
 * owner pid) and is held with flock(LOCK_EX). kvtierd creates it with O_EXCL,
 * or reuses one that carries its magic and that no live kvtierd holds (left
 * behind by a kill -9); any other existing file is refused, never truncated.
 * The lock belongs to the open file, so a process that shares kvtierd's
 * (an fd passed with SCM_RIGHTS, or inherited) keeps the arena held after
 * kvtierd is gone: hand engines of a named arena a new open() of the path.
 * The slots follow the header: slot i lives at byte slot_off + i * slot_bytes
 * of the file, and slot_bytes is block_bytes rounded up to 4 KiB, so every
 * slot goes to NVMe in one O_DIRECT I/O. The contents do not survive a
 * kvtierd restart (the NVMe store does); kvt_arena_close() unlinks a file it
 * opened, so nothing stays behind in /dev/shm after a clean stop.
 *
 * The mapping is MAP_SHARED, MADV_NOHUGEPAGE (io_uring and UCX pin it; THP
 * would split and compact under the pins), pre-faulted with
 * MADV_POPULATE_WRITE (or a write per page where the kernel lacks it), so the
 * first put does not pay page faults and a short /dev/shm fails at start, not
 * with SIGBUS on a later write.
 */
#ifndef KVT_TIERS_ARENA_INT_H
#define KVT_TIERS_ARENA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define KVT_ARENA_ALIGN 4096u
#define KVT_ARENA_MAGIC "KVTARENA" /* 8 bytes at offset 0 of a named arena file */
#define KVT_ARENA_VERSION 1u

/* The start of a named arena's header page (host byte order; the rest of the page is zero). */
typedef struct kvt_arena_hdr {
    char magic[8];       /* KVT_ARENA_MAGIC, without its NUL */
    uint32_t version;    /* KVT_ARENA_VERSION */
    uint32_t slot_bytes; /* as in kvt_arena_t */
    uint32_t nslots;
    int32_t pid;       /* the kvtierd that opened it last */
    uint64_t slot_off; /* file offset of slot 0 */
} kvt_arena_hdr_t;

typedef struct kvt_arena_cfg {
    uint64_t ram_bytes;   /* bytes for slots (rounded down to whole slots); the file is larger
                             by the header page */
    uint32_t block_bytes; /* largest block; > 0 */
    const char *name;     /* see above; NULL is "" */
    bool populate;        /* pre-fault every page at open */
} kvt_arena_cfg_t;

typedef struct kvt_arena {
    int fd;              /* memfd or file; -1 when closed */
    uint8_t *base;       /* MAP_SHARED mapping of the whole file */
    uint64_t map_bytes;  /* length of the mapping (= file size) */
    uint64_t slot_off;   /* file offset of slot 0: 0 for a memfd, 4096 for a named file
                            (rounded up to the huge page size on hugetlbfs) */
    uint32_t slot_bytes; /* block_bytes rounded up to KVT_ARENA_ALIGN */
    uint32_t nslots;     /* >= 1 */
    bool hugetlb;        /* the file is on hugetlbfs */
    char path[256];      /* the file's path; "" for a memfd */
} kvt_arena_t;

/*
 * Creates (or reuses, see above) the arena. On error returns KVT_ERR_INVAL
 * (bad geometry, a name that is too long, fewer than one slot), KVT_ERR_EXISTS
 * (a file that is not a kvtierd arena, or one a live kvtierd holds),
 * KVT_ERR_NO_SPACE (the file system or the memory cannot hold it) or
 * KVT_ERR_IO, with one line in @err; *@a is then closed (fd -1) and no file
 * created by this call is left behind.
 */
kvt_status_t kvt_arena_open(kvt_arena_t *a, const kvt_arena_cfg_t *cfg, char *err, size_t errlen);

/* Unmaps, closes, and unlinks a named file. Safe on a closed arena. */
void kvt_arena_close(kvt_arena_t *a);

static inline uint8_t *kvt_arena_slot(const kvt_arena_t *a, uint32_t slot)
{
    return a->base + a->slot_off + (uint64_t)slot * a->slot_bytes;
}

#endif
