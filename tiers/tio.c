/*
 * tiers/tio.c: the tier's I/O thread. Each round it
 *   1. reaps finished reads (checked against their XXH3) and writes (whose
 *      records it then commits in one synced batch) and settles them;
 *   2. plans, under the lock: deletes of records whose slots are to be
 *      reused, promotions to read, durable puts and background demotions to
 *      write (taking a free disk slot, or evicting the NVMe tail: its record
 *      goes first);
 *   3. without the lock: registers new namespaces, deletes the records
 *      (synced), checksums the blocks to write, queues and submits the I/O.
 * It also expires leases every LEASE_TICK_MS.
 */
#define KVT_LOG_COMPONENT "tiers"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/grow.h"
#include "common/log.h"
#include "tiers/store_int.h"

#define LEASE_TICK_MS 100

/* One disk I/O of the thread's pool. */
typedef struct tio {
    kvt_disk_io_t io;
    uint32_t bi;
    uint32_t len; /* the block's bytes */
    uint64_t sum, gen;
    uint32_t ns_meta;
    bool done;
} tio_t;

/* A write planned under the lock: block, disk slot, and the record to delete first. */
typedef struct plan_wr {
    uint32_t bi, slot;
    uint32_t ns; /* the tier's namespace index */
    uint64_t gen;
    bool has_victim;
} plan_wr_t;

typedef struct io_state {
    kvt_tier_t *t;
    tio_t *pool;
    uint32_t *free; /* free pool entries */
    uint32_t nfree, depth;
    tio_t **fin; /* reaped this round */
    uint32_t nfin;
    tio_t *wdone; /* finished writes whose records are not committed yet */
    size_t nwdone, wdone_cap;
    tio_t *rdone; /* finished reads not checked yet */
    size_t nrdone, rdone_cap;
    plan_wr_t *wr;
    size_t nwr, wr_cap;
    tier_del_t *del;
    size_t ndel, del_cap;
    kvt_meta_rec_t *recs;
    size_t recs_cap;
    uint32_t *ns_new; /* namespaces the metadata does not know yet */
    size_t nns_new, ns_new_cap;
} io_state_t;

static unsigned hist_bucket(uint64_t us)
{
    unsigned b = us == 0 ? 0 : 64u - (unsigned)__builtin_clzll(us);
    return b < KVT_TIER_HIST ? b : KVT_TIER_HIST - 1;
}

static void reaped(void *arg, kvt_disk_io_t *io)
{
    io_state_t *s = arg;
    s->fin[s->nfin++] = (tio_t *)io;
}

void tier_wait_end(kvt_tier_t *t, uint32_t bi, bool ok, kvt_status_t st)
{
    tblk_t *b = &t->map.b[bi];
    tier_wait_t *w = b->wait;
    b->wait = NULL;
    while (w != NULL) {
        tier_wait_t *next = w->next;
        if (w->pin == NULL) {
            tier_cb(t, &(tier_cb_t){.kind = CB_DONE, .done = w->done, .arg = w->arg, .st = st});
            free(w);
        } else {
            pin_req_t *p = w->pin;
            if (ok && p->s != NULL && tier_lease_add(t, p->s, bi, true)) {
                if (b->pins++ == 0)
                    t->pinned++;
                p->out[w->i] = (kvt_tier_pinned_t){.slot = b->ram, .len = b->len, .sum = b->sum};
            }
            if (--p->waiting == 0) {
                if (p->s != NULL) {
                    pin_req_t **pp = &p->s->pending;
                    while (*pp != p)
                        pp = &(*pp)->snext;
                    *pp = p->snext;
                }
                free(p->w);
                p->w = NULL;
                tier_cb(t, &(tier_cb_t){.kind = CB_PIN, .pin = p});
            }
        }
        w = next;
    }
}

static bool del_push(tier_del_t **arr, size_t *n, size_t *cap, const tier_del_t *d)
{
    if (*n == *cap && !kvt_grow(arr, cap, *n + 1, sizeof(**arr), 16))
        return false;
    (*arr)[(*n)++] = *d;
    return true;
}

/* Drops the disk copy of block @bi, whose record goes in @s's delete batch (the slot with it,
 * unless @keep_slot: then the caller reuses it once the batch is synced). A block left with no
 * copy is freed. */
static void disk_drop(kvt_tier_t *t, io_state_t *s, uint32_t bi, bool keep_slot)
{
    tblk_t *b = &t->map.b[bi];
    tlist_unlink(&t->map, &t->map.disk, true, bi);
    tier_del_t d = {
        .ns_meta = t->ns[b->ns].meta, .key = b->key, .slot = keep_slot ? TB_NONE : b->disk};
    if (!del_push(&s->del, &s->ndel, &s->del_cap, &d)) {
        /* the record stays, so the slot does too: it is reclaimed at the next restart */
        kvt_log_error("out of memory: disk slot %u leaks until restart", b->disk);
    }
    b->disk = TB_NONE;
    b->flags &= ~(uint32_t)B_DISK;
    tier_change(t, b, KVT_TIER_LOC_DISK, false);
    if (!(b->flags & (B_RAM | B_PROMOTING | B_RESERVED))) {
        /* it leaves altogether: a drop (tiers.h), as when RAM evicts its last copy */
        t->st.drops++;
        tier_blk_free(t, bi);
    }
}

/* Settles a finished promotion (lock held). */
static void read_done(kvt_tier_t *t, io_state_t *s, tio_t *x, bool ok)
{
    tblk_t *b = &t->map.b[x->bi];
    b->flags &= ~(uint32_t)B_PROMOTING;
    if (ok) {
        b->flags |= B_RAM;
        tlist_push(&t->map, &t->map.ram, false, x->bi);
        tier_change(t, b, KVT_TIER_LOC_RAM, true);
        tier_wait_end(t, x->bi, true, KVT_OK);
        return;
    }
    kvt_slots_free(&t->ram_slots, b->ram);
    b->ram = TB_NONE;
    tier_wait_end(t, x->bi, false, KVT_ERR_IO);
    disk_drop(t, s, x->bi, false); /* frees the block: nothing else holds it */
}

/* Settles a finished write (lock held): @ok when its bytes and record are durable. */
static void write_done(kvt_tier_t *t, tio_t *x, bool ok)
{
    tblk_t *b = &t->map.b[x->bi];
    b->flags &= ~(uint32_t)(B_DEMOTING | B_DURABLE);
    if (ok) {
        b->flags |= B_DISK;
        b->disk = x->io.slot;
        b->sum = x->sum;
        b->gen = x->gen;
        tlist_push(&t->map, &t->map.disk, true, x->bi);
        tier_change(t, b, KVT_TIER_LOC_DISK, true);
        t->st.demotions++;
    } else {
        kvt_slots_free(&t->disk_slots, x->io.slot); /* no record names it */
    }
    tier_wait_end(t, x->bi, ok, ok ? KVT_OK : KVT_ERR_IO);
}

/*
 * Reaps what finished and frees its pool entries. Finished reads wait in
 * @s->rdone for check_reads(), finished writes in @s->wdone for
 * commit_writes(): the loop runs both after it has submitted the next I/O, so
 * the device works while the reads' checksums are computed and RocksDB syncs.
 */
static void reap(io_state_t *s, int wait_ms)
{
    kvt_tier_t *t = s->t;
    s->nfin = 0;
    kvt_disk_reap(t->disk, wait_ms, reaped, s);
    if (s->nfin == 0)
        return;
    uint64_t now = kvt_clock_ns();
    tier_lock(t);
    for (uint32_t i = 0; i < s->nfin; i++) {
        tio_t *x = s->fin[i];
        uint32_t want = (x->len + 4095u) & ~4095u;
        x->done = x->io.res == (int)want;
        uint64_t us = (now - x->io.submit_ns) / 1000u;
        if (x->io.res > 0)
            *(x->io.write ? &t->st.write_bytes : &t->st.read_bytes) += (uint64_t)x->io.res;
        (x->io.write ? t->st.write_hist : t->st.read_hist)[hist_bucket(us)]++;
        if (x->io.write && x->io.res < 0)
            t->st.io_errors++;
        tio_t **arr = x->io.write ? &s->wdone : &s->rdone;
        size_t *n = x->io.write ? &s->nwdone : &s->nrdone;
        size_t *cap = x->io.write ? &s->wdone_cap : &s->rdone_cap;
        if (*n == *cap && !kvt_grow(arr, cap, *n + 1, sizeof(**arr), 64)) {
            /* cannot remember it: the I/O counts as failed */
            if (x->io.write)
                write_done(t, x, false);
            else
                read_done(t, s, x, false);
        } else {
            (*arr)[(*n)++] = *x;
        }
        s->free[s->nfree++] = (uint32_t)(x - s->pool);
    }
    tier_unlock(t);
}

/* Checks the finished reads against their checksums and settles them. */
static void check_reads(io_state_t *s)
{
    kvt_tier_t *t = s->t;
    if (s->nrdone == 0)
        return;
    for (size_t i = 0; i < s->nrdone; i++) {
        tio_t *x = &s->rdone[i];
        /* the slot is the block's until it is settled: nothing else writes it */
        if (x->done && tier_sum(x->io.buf, x->len) != x->sum) {
            x->done = false;
            x->io.res = 0; /* marks a checksum failure, not an I/O error */
        }
    }
    tier_lock(t);
    for (size_t i = 0; i < s->nrdone; i++) {
        tio_t *x = &s->rdone[i];
        if (x->io.res == 0)
            t->st.checksum_failures++;
        else if (!x->done)
            t->st.io_errors++;
        if (!x->done)
            kvt_log_warn("block %016llx: %s; dropped, a miss",
                         (unsigned long long)t->map.b[x->bi].key,
                         x->io.res == 0 ? "checksum mismatch on read" : "read failed");
        read_done(t, s, x, x->done);
    }
    s->nrdone = 0;
    tier_unlock(t);
}

/* Commits the records of the writes that finished whole, in one synced batch, then settles
 * every finished write: on NVMe once its record is durable, else failed. */
static void commit_writes(io_state_t *s)
{
    kvt_tier_t *t = s->t;
    if (s->nwdone == 0)
        return;
    size_t nrec = 0;
    bool meta_ok = true;
    if (s->recs_cap < s->nwdone &&
        !kvt_grow(&s->recs, &s->recs_cap, s->nwdone, sizeof(*s->recs), 64)) {
        meta_ok = false; /* out of memory: the writes count as failed */
    } else {
        for (size_t i = 0; i < s->nwdone; i++) {
            tio_t *x = &s->wdone[i];
            if (x->done)
                s->recs[nrec++] = (kvt_meta_rec_t){.ns = x->ns_meta,
                                                   .key = t->map.b[x->bi].key,
                                                   .slot = x->io.slot,
                                                   .len = x->len,
                                                   .sum = x->sum,
                                                   .gen = x->gen};
        }
        char err[256];
        if (nrec > 0 &&
            kvt_meta_write(t->meta, s->recs, nrec, NULL, 0, err, sizeof(err)) != KVT_OK) {
            kvt_log_error("committing %zu block records: %s", nrec, err);
            meta_ok = false;
        }
    }
    tier_lock(t);
    for (size_t i = 0; i < s->nwdone; i++)
        write_done(t, &s->wdone[i], s->wdone[i].done && meta_ok);
    s->nwdone = 0;
    tier_unlock(t);
}

/* Whether @bi may be demoted in the background now. */
static bool demotable(const tblk_t *b)
{
    return (b->flags & B_RAM) && !(b->flags & (B_DISK | B_DEMOTING | B_NOADMIT)) && b->pins == 0;
}

/* A disk slot for a write: a free one, or the NVMe tail's (its record is deleted first).
 * TB_NONE when nothing can go. Lock held. */
static uint32_t disk_take(kvt_tier_t *t, io_state_t *s, bool *victim_p)
{
    uint32_t slot = kvt_slots_alloc(&t->disk_slots);
    *victim_p = false;
    if (slot != KVT_SLOT_NONE)
        return slot;
    for (uint32_t bi = t->map.disk.tail; bi != TB_NONE; bi = t->map.b[bi].dprev) {
        const tblk_t *b = &t->map.b[bi];
        if (b->flags & B_PROMOTING)
            continue;
        slot = b->disk;
        disk_drop(t, s, bi, true);
        t->st.disk_evictions++;
        *victim_p = true;
        return slot;
    }
    return TB_NONE;
}

static bool plan_write(kvt_tier_t *t, io_state_t *s, uint32_t bi)
{
    if (s->nwr == s->wr_cap && !kvt_grow(&s->wr, &s->wr_cap, s->nwr + 1, sizeof(*s->wr), 16))
        return false;
    bool victim;
    uint32_t slot = disk_take(t, s, &victim);
    if (slot == TB_NONE)
        return false;
    tblk_t *b = &t->map.b[bi];
    b->flags |= B_DEMOTING;
    s->wr[s->nwr++] =
        (plan_wr_t){.bi = bi, .slot = slot, .ns = b->ns, .gen = t->gen++, .has_victim = victim};
    if (t->ns[b->ns].meta == TB_NONE) {
        bool known = false;
        for (size_t i = 0; i < s->nns_new; i++)
            known |= s->ns_new[i] == b->ns;
        if (!known && (s->nns_new < s->ns_new_cap ||
                       kvt_grow(&s->ns_new, &s->ns_new_cap, s->nns_new + 1, sizeof(*s->ns_new), 4)))
            s->ns_new[s->nns_new++] = b->ns;
    }
    return true;
}

/* Under the lock: takes the deletes, starts reads, plans writes. */
static void plan(io_state_t *s)
{
    kvt_tier_t *t = s->t;
    uint32_t room = s->nfree;
    /* records to delete: user deletes and dropped corrupt blocks */
    for (size_t i = 0; i < t->ndel; i++)
        if (!del_push(&s->del, &s->ndel, &s->del_cap, &t->del[i]))
            break;
    t->ndel = 0;
    /* promotions first: someone waits on them */
    size_t p = 0;
    for (; p < t->npromo && room > 0; p++, room--) {
        uint32_t bi = t->promo[p];
        tblk_t *b = &t->map.b[bi];
        tio_t *x = &s->pool[s->free[--s->nfree]];
        *x = (tio_t){.bi = bi, .len = b->len, .sum = b->sum};
        x->io = (kvt_disk_io_t){.slot = b->disk,
                                .len = (b->len + 4095u) & ~4095u,
                                .buf = kvt_arena_slot(&t->arena, b->ram),
                                .write = false,
                                .arg = x};
        if (kvt_disk_queue(t->disk, &x->io) != KVT_OK) {
            s->free[s->nfree++] = (uint32_t)(x - s->pool);
            break;
        }
    }
    if (p > 0) {
        memmove(t->promo, t->promo + p, (t->npromo - p) * sizeof(*t->promo));
        t->npromo -= p;
    }
    /* durable puts */
    size_t d = 0;
    for (; d < t->ndurable && room > 0; d++, room--) {
        if (!plan_write(t, s, t->durable[d])) {
            /* the disk has no slot to give: the put fails */
            tblk_t *b = &t->map.b[t->durable[d]];
            b->flags &= ~(uint32_t)(B_DEMOTING | B_DURABLE);
            tier_wait_end(t, t->durable[d], false, KVT_ERR_NO_SPACE);
            room++;
        }
    }
    if (d > 0) {
        memmove(t->durable, t->durable + d, (t->ndurable - d) * sizeof(*t->durable));
        t->ndurable -= d;
    }
    /* background: keep the RAM tail on NVMe while free slots run low */
    if (t->ram_slots.nfree >= t->low_water)
        return;
    uint32_t window = t->low_water * 2, seen = 0;
    for (uint32_t bi = t->map.ram.tail; bi != TB_NONE && seen < window && room > 0;
         bi = t->map.b[bi].rprev, seen++) {
        tblk_t *b = &t->map.b[bi];
        if (!demotable(b))
            continue;
        bool full = t->disk_slots.nfree == 0;
        uint32_t vi = t->map.disk.tail;
        uint64_t h = b->key ^ ((uint64_t)b->ns * 0x9e3779b97f4a7c15ull);
        uint64_t vh = vi != TB_NONE
                          ? t->map.b[vi].key ^ ((uint64_t)t->map.b[vi].ns * 0x9e3779b97f4a7c15ull)
                          : 0;
        if (!kvt_admit_ok(t->admit, h, full && vi != TB_NONE, vh)) {
            b->flags |= B_NOADMIT;
            t->st.rejected++;
            continue;
        }
        if (!plan_write(t, s, bi))
            break;
        t->st.admitted++;
        room--;
    }
}

/* Without the lock: namespaces, record deletes, checksums, writes. */
static void execute(io_state_t *s)
{
    kvt_tier_t *t = s->t;
    char err[256];
    /* namespaces new to the metadata, made durable before records name them */
    for (size_t i = 0; i < s->nns_new; i++) {
        uint32_t ns = s->ns_new[i], id;
        /* the name never moves: the table only grows, entries keep their pointer */
        tier_lock(t);
        const char *name = t->ns[ns].name;
        size_t len = t->ns[ns].len;
        pthread_mutex_unlock(&t->mu);
        if (kvt_meta_ns(t->meta, name, len, &id, err, sizeof(err)) != KVT_OK) {
            kvt_log_error("namespace record: %s", err);
            continue;
        }
        tier_lock(t);
        t->ns[ns].meta = id;
        pthread_mutex_unlock(&t->mu);
    }
    s->nns_new = 0;
    bool del_ok = true;
    if (s->ndel > 0) {
        /* records are rebuilt from the del list: ns and key */
        if (s->recs_cap < s->ndel &&
            !kvt_grow(&s->recs, &s->recs_cap, s->ndel, sizeof(*s->recs), 64)) {
            del_ok = false;
        } else {
            for (size_t i = 0; i < s->ndel; i++)
                s->recs[i] = (kvt_meta_rec_t){.ns = s->del[i].ns_meta, .key = s->del[i].key};
            if (kvt_meta_write(t->meta, NULL, 0, s->recs, s->ndel, err, sizeof(err)) != KVT_OK) {
                kvt_log_error("deleting %zu block records: %s", s->ndel, err);
                del_ok = false;
            }
        }
    }
    tier_lock(t);
    for (size_t i = 0; i < s->ndel; i++) {
        tier_del_t *d = &s->del[i];
        if (del_ok && d->slot != TB_NONE)
            kvt_slots_free(&t->disk_slots, d->slot);
        else if (!del_ok && d->slot != TB_NONE)
            kvt_log_error("disk slot %u stays out of use until restart", d->slot);
        if (d->done != NULL)
            tier_cb(t, &(tier_cb_t){.kind = CB_DONE,
                                    .done = d->done,
                                    .arg = d->arg,
                                    .st = del_ok ? KVT_OK : KVT_ERR_IO});
    }
    s->ndel = 0;
    /* a write whose slot's old record could not be deleted must not go ahead */
    size_t go = 0;
    for (size_t i = 0; i < s->nwr; i++) {
        plan_wr_t *w = &s->wr[i];
        if ((w->has_victim && !del_ok) || t->ns[w->ns].meta == TB_NONE) {
            tblk_t *b = &t->map.b[w->bi];
            b->flags &= ~(uint32_t)(B_DEMOTING | B_DURABLE);
            if (!w->has_victim)
                kvt_slots_free(&t->disk_slots, w->slot);
            t->st.io_errors++;
            tier_wait_end(t, w->bi, false, KVT_ERR_IO);
            continue;
        }
        s->wr[go++] = *w;
    }
    s->nwr = go;
    tier_unlock(t);
    /* the bytes of a block being demoted do not change and its slot is not reused */
    for (size_t i = 0; i < s->nwr; i++) {
        plan_wr_t *w = &s->wr[i];
        tblk_t *b = &t->map.b[w->bi];
        tio_t *x = &s->pool[s->free[--s->nfree]];
        uint8_t *buf = kvt_arena_slot(&t->arena, b->ram);
        *x = (tio_t){.bi = w->bi,
                     .len = b->len,
                     .sum = b->sum, /* recorded when stored: a RAM copy gone bad stays bad */
                     .gen = w->gen,
                     .ns_meta = t->ns[w->ns].meta};
        x->io = (kvt_disk_io_t){
            .slot = w->slot, .len = (b->len + 4095u) & ~4095u, .buf = buf, .write = true, .arg = x};
        if (kvt_disk_queue(t->disk, &x->io) != KVT_OK) {
            s->free[s->nfree++] = (uint32_t)(x - s->pool);
            tier_lock(t);
            write_done(t, x, false);
            tier_unlock(t);
        }
    }
    s->nwr = 0;
    kvt_disk_submit(t->disk);
}

static void io_loop(io_state_t *s)
{
    kvt_tier_t *t = s->t;
    uint64_t next_tick = kvt_clock_ms() + LEASE_TICK_MS;
    for (;;) {
        struct pollfd pfd[2] = {
            {.fd = t->wake_fd, .events = POLLIN},
            {.fd = t->disk != NULL ? kvt_disk_event_fd(t->disk) : -1, .events = POLLIN}};
        uint64_t now = kvt_clock_ms();
        int timeout = next_tick > now ? (int)(next_tick - now) : 0;
        if (poll(pfd, 2, timeout) < 0 && errno != EINTR)
            kvt_log_error("poll: %s", strerror(errno));
        uint64_t v;
        for (int i = 0; i < 2; i++)
            if (pfd[i].fd >= 0 && (pfd[i].revents & POLLIN))
                while (read(pfd[i].fd, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
                }
        if (kvt_clock_ms() >= next_tick) {
            kvt_tier_expire(t);
            next_tick = kvt_clock_ms() + LEASE_TICK_MS;
        }
        if (t->disk != NULL)
            reap(s, 0);
        tier_lock(t);
        bool stop = t->stop;
        if (t->disk != NULL && !stop)
            plan(s);
        tier_unlock(t);
        if (t->disk != NULL) {
            execute(s);
            check_reads(s);
            commit_writes(s);
        }
        if (stop)
            return;
    }
}

/* At close: every wait still open fails, the deletes asked for are still done. */
static void io_drain(io_state_t *s)
{
    kvt_tier_t *t = s->t;
    while (t->disk != NULL && s->nfree < s->depth)
        reap(s, -1);
    if (t->disk != NULL) {
        check_reads(s);
        commit_writes(s);
    }
    tier_lock(t);
    for (size_t i = 0; i < t->npromo; i++) {
        tblk_t *b = &t->map.b[t->promo[i]];
        b->flags &= ~(uint32_t)B_PROMOTING;
        kvt_slots_free(&t->ram_slots, b->ram);
        b->ram = TB_NONE;
        tier_wait_end(t, t->promo[i], false, KVT_ERR_CLOSED);
    }
    t->npromo = 0;
    for (size_t i = 0; i < t->ndurable; i++) {
        t->map.b[t->durable[i]].flags &= ~(uint32_t)(B_DEMOTING | B_DURABLE);
        tier_wait_end(t, t->durable[i], false, KVT_ERR_CLOSED);
    }
    t->ndurable = 0;
    for (size_t i = 0; i < t->ndel; i++)
        del_push(&s->del, &s->ndel, &s->del_cap, &t->del[i]);
    t->ndel = 0;
    tier_unlock(t);
    if (t->disk != NULL)
        execute(s);
}

void *tier_io_main(void *arg)
{
    kvt_tier_t *t = arg;
    io_state_t s = {.t = t, .depth = t->cfg.io_depth};
    s.pool = calloc(s.depth, sizeof(*s.pool));
    s.free = malloc(s.depth * sizeof(*s.free));
    s.fin = malloc(s.depth * sizeof(*s.fin));
    if (s.pool == NULL || s.free == NULL || s.fin == NULL) {
        kvt_log_error("out of memory: the tier's i/o thread cannot start; NVMe is not used");
        s.depth = 0;
    }
    for (uint32_t i = 0; i < s.depth; i++)
        s.free[s.nfree++] = s.depth - 1 - i;
    io_loop(&s);
    io_drain(&s);
    free(s.pool);
    free(s.free);
    free(s.fin);
    free(s.wr);
    free(s.del);
    free(s.recs);
    free(s.wdone);
    free(s.rdone);
    free(s.ns_new);
    return NULL;
}
