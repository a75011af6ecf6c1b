/*
 * tiers/store_int.h: the tier's state (tiers.h), shared by its files:
 *   tmap.c    the block table: records, the (ns, key) hash, the two LRU lists
 *   tiers.c   open, restore, close, sessions and leases, changes, stats
 *   plane.c   the engine's calls and the block API
 *   tio.c     the I/O thread: demotion, promotion, metadata batches
 *
 * Every field below the mutex is guarded by it, except where a comment says
 * the I/O thread owns it.
 */
#ifndef KVT_TIERS_STORE_INT_H
#define KVT_TIERS_STORE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiers/admit_int.h"
#include "tiers/arena_int.h"
#include "tiers/disk_int.h"
#include "tiers/meta_int.h"
#include "tiers/slots_int.h"
#include "tiers/tiers.h"

#define TB_NONE UINT32_MAX

/* Block flags. */
enum {
    B_RESERVED = 1u << 0,  /* a session reserved its RAM slot; bytes not committed */
    B_RAM = 1u << 1,       /* committed bytes in RAM slot ->ram */
    B_DISK = 1u << 2,      /* on NVMe in slot ->disk, metadata committed */
    B_DEMOTING = 1u << 3,  /* a write of the RAM copy is planned or in flight */
    B_PROMOTING = 1u << 4, /* a read into RAM slot ->ram is in flight */
    B_NOADMIT = 1u << 5,   /* the filter refused it; asked again after the next access */
    B_DURABLE = 1u << 6,   /* a durable put waits for it to reach NVMe */
};

struct tier_wait;

typedef struct tblk {
    uint64_t key;
    uint64_t sum;           /* XXH3 of the bytes, recorded when stored (commit, put, restore) */
    uint64_t gen;           /* the disk copy's write generation */
    uint32_t ns;            /* index into the tier's namespace table */
    uint32_t ram;           /* RAM slot or TB_NONE */
    uint32_t disk;          /* disk slot or TB_NONE */
    uint32_t len;           /* bytes */
    uint32_t pins;          /* pins held, all sessions */
    uint32_t flags;         /* B_* */
    uint32_t rprev, rnext;  /* RAM LRU links (while B_RAM) */
    uint32_t dprev, dnext;  /* disk LRU links (while B_DISK) */
    struct tier_wait *wait; /* pins and durable puts waiting on an I/O */
} tblk_t;

typedef struct tlist {
    uint32_t head, tail; /* head: most recent; tail: next to go */
    uint32_t n;
} tlist_t;

/* The block table. Records are a fixed pool; the hash is open addressing
 * over record indices (linear probing, deletion by backward shift). */
typedef struct tmap {
    tblk_t *b;
    uint32_t cap;   /* records */
    uint32_t nfree; /* free records */
    uint32_t *free; /* stack of free record indices */
    uint32_t *h;    /* hash slots: record index or TB_NONE */
    uint32_t hmask;
    tlist_t ram, disk;
} tmap_t;

kvt_status_t tmap_init(tmap_t *m, uint32_t cap);
void tmap_cleanup(tmap_t *m);
uint32_t tmap_find(const tmap_t *m, uint32_t ns, uint64_t key);
/* A new record for (ns, key), flags 0, no slots; TB_NONE when the pool is out. The key must
 * not be present. */
uint32_t tmap_add(tmap_t *m, uint32_t ns, uint64_t key);
/* Removes a record (out of both lists first: the caller's job) and frees it. */
void tmap_del(tmap_t *m, uint32_t bi);
/* List operations: push at the head (most recent), unlink, move to the head. */
void tlist_push(tmap_t *m, tlist_t *l, bool disk, uint32_t bi);
void tlist_unlink(tmap_t *m, tlist_t *l, bool disk, uint32_t bi);
void tlist_touch(tmap_t *m, tlist_t *l, bool disk, uint32_t bi);
/* Moves @bi (in @l) to right after @after (in @l, not @bi); to the head when @after is TB_NONE. */
void tlist_place(tmap_t *m, tlist_t *l, bool disk, uint32_t after, uint32_t bi);

typedef struct tier_ns {
    char *name;
    uint32_t len;
    uint32_t meta; /* the metadata's id, or TB_NONE while unknown to it (I/O thread sets) */
} tier_ns_t;

/* A lease: a pin or a reservation of one block by one session. */
typedef struct tlease {
    uint32_t bi;
    bool pin; /* false: a reservation */
    uint64_t deadline_ms;
} tlease_t;

struct kvt_tier_sess {
    struct kvt_tier_sess *prev, *next; /* the tier's sessions */
    tlease_t *lease;
    size_t nlease, cap;
    struct pin_req *pending; /* pins of this session still waiting on reads */
};

/* A pin that waits on reads. */
typedef struct pin_req {
    struct pin_req *snext; /* in the session's pending list */
    struct tier_wait *w;   /* one per key, for the keys that wait */
    kvt_tier_sess_t *s;    /* NULL once the session closed */
    kvt_tier_pin_cb done;
    void *arg;
    size_t n, waiting;
    kvt_tier_pinned_t *out;
} pin_req_t;

/* Something waiting on a block's I/O: one key of a pin, or a durable put. */
typedef struct tier_wait {
    struct tier_wait *next;
    pin_req_t *pin; /* NULL: a durable put */
    size_t i;       /* the key's place in pin->out */
    kvt_tier_done_cb done;
    void *arg;
} tier_wait_t;

/* A completion to run once the lock is dropped. */
typedef struct tier_cb {
    enum { CB_PIN, CB_DONE } kind;
    pin_req_t *pin;
    kvt_tier_done_cb done;
    void *arg;
    kvt_status_t st;
} tier_cb_t;

typedef struct tier_chg {
    uint32_t ns;
    uint64_t key;
    uint8_t loc;
    bool stored;
} tier_chg_t;

/* A disk slot whose record must be deleted (synced) before it is reused. */
typedef struct tier_del {
    uint32_t ns_meta;
    uint64_t key;
    uint32_t slot;
    kvt_tier_done_cb done; /* a user's delete waits for it, or NULL */
    void *arg;
} tier_del_t;

struct kvt_tier {
    kvt_tier_cfg_t cfg;
    char *arena_name, *disk_path, *data_dir; /* copies of cfg's strings */
    kvt_arena_t arena;
    kvt_disk_t *disk; /* NULL without NVMe */
    kvt_meta_t *meta;
    uint32_t lease_ms;
    uint32_t grace_ms;

    pthread_mutex_t mu;
    tmap_t map;
    kvt_slots_t ram_slots, disk_slots;
    kvt_admit_t *admit;
    tier_ns_t *ns;
    size_t nns, ns_cap;
    kvt_tier_sess_t *sess;     /* open sessions */
    uint64_t gen;              /* next write generation */
    uint32_t low_water;        /* demote when fewer RAM slots than this are free or clean */
    uint32_t reserved, pinned; /* RAM blocks reserved, pinned */
    tier_chg_t *chg;           /* changes not yet delivered */
    size_t nchg, chg_cap;
    tier_cb_t *cbs; /* completions not yet run */
    size_t ncbs, cbs_cap;
    uint32_t *promo; /* blocks whose reads the I/O thread is to queue */
    size_t npromo, promo_cap;
    uint32_t *durable; /* blocks a durable put waits on, not yet planned */
    size_t ndurable, durable_cap;
    tier_del_t *del; /* records to delete before their slots are free */
    size_t ndel, del_cap;
    kvt_tier_stats_t st;
    bool stop;

    pthread_mutex_t deliver_mu; /* one deliverer at a time, so changes keep their order */
    tier_chg_t *dchg;           /* the deliverer's swapped-out buffers */
    size_t dchg_cap;
    tier_cb_t *dcbs;
    size_t dcbs_cap;
    kvt_tier_change_t *dout;
    size_t dout_cap;

    kvt_tier_sess_t *get_sess;  /* the block API's gets pin through it */
    kvt_tier_sess_t *cool_sess; /* leases of closed or expired sessions, for grace_ms */

    pthread_t io_thread;
    bool io_started;
    int wake_fd; /* eventfd: work for the I/O thread */
};

/* tiers.c */
void tier_lock(kvt_tier_t *t);
/* Unlocks, then delivers the changes and runs the completions queued so far. */
void tier_unlock(kvt_tier_t *t);
/* Finds or adds namespace @ns; TB_NONE when invalid or out of memory. */
uint32_t tier_ns(kvt_tier_t *t, const char *ns, size_t len);
void tier_change(kvt_tier_t *t, const tblk_t *b, kvt_tier_loc_t loc, bool stored);
void tier_cb(kvt_tier_t *t, const tier_cb_t *cb);
bool tier_lease_add(kvt_tier_t *t, kvt_tier_sess_t *s, uint32_t bi, bool pin);
/* Ends @s's pin (@pin) or reservation of block @bi (a reservation: only the lease; the caller
 * commits or frees the block). False when @s holds none. */
bool tier_lease_take(kvt_tier_t *t, kvt_tier_sess_t *s, uint32_t bi, bool pin);
/* Namespace @ns if the tier knows it, else TB_NONE. */
uint32_t tier_ns_find(const kvt_tier_t *t, const char *ns, size_t len);
void tier_wake(kvt_tier_t *t);
/* Frees a block with no copies left, reporting nothing; the caller reported. */
void tier_blk_free(kvt_tier_t *t, uint32_t bi);
/* Drops the RAM copy of unpinned, idle block @bi; if it had no disk copy the block is gone
 * (its key added to @ev). Reports the change. */
void tier_ram_drop(kvt_tier_t *t, uint32_t bi, uint64_t *ev, size_t ev_cap, size_t *nev);
/* A free RAM slot, evicting from the RAM LRU tail when none is; TB_NONE when nothing can go. */
uint32_t tier_ram_take(kvt_tier_t *t, uint64_t *ev, size_t ev_cap, size_t *nev);
void tier_admit_touch(kvt_tier_t *t, const tblk_t *b);
uint64_t tier_sum(const void *p, size_t len);

/* tio.c */
void *tier_io_main(void *arg);
/* Ends waits on block @bi with @ok (slot @slot for pins); queued as completions. */
void tier_wait_end(kvt_tier_t *t, uint32_t bi, bool ok, kvt_status_t st);

#endif
