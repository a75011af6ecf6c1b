/*
 * tiers/tiers.c: opening the tier (arena, NVMe store, metadata, restore),
 * closing it, sessions and their leases, the ordered delivery of changes and
 * completions, statistics.
 */
#define KVT_LOG_COMPONENT "tiers"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <xxhash.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#define TIER_SUM XXH3_64bits_dispatch
#endif
#endif
#ifndef TIER_SUM
#define TIER_SUM XXH3_64bits
#endif

#include "common/clock.h"
#include "common/errtext.h"
#include "common/grow.h"
#include "common/log.h"
#include "tiers/store_int.h"

#define LEASE_DEFAULT_MS 30000u
#define IO_DEPTH_DEFAULT 32u

static __thread bool in_deliver; /* this thread runs deliveries: no nested one */

uint64_t tier_sum(const void *p, size_t len)
{
    return TIER_SUM(p, len);
}

kvt_status_t kvt_tier_admit_parse(const char *s, kvt_tier_admit_t *admit_p)
{
    kvt_admit_kind_t k;
    kvt_status_t st = kvt_admit_parse(s, &k);
    if (st == KVT_OK)
        *admit_p = (kvt_tier_admit_t)k;
    return st;
}

void tier_lock(kvt_tier_t *t)
{
    pthread_mutex_lock(&t->mu);
}

static void deliver(kvt_tier_t *t)
{
    for (;;) {
        pthread_mutex_lock(&t->mu);
        size_t nchg = t->nchg, ncbs = t->ncbs;
        if (nchg == 0 && ncbs == 0) {
            pthread_mutex_unlock(&t->mu);
            return;
        }
        /* swap the buffers: the next changes go to the other one */
        tier_chg_t *c = t->chg;
        size_t ccap = t->chg_cap;
        t->chg = t->dchg;
        t->chg_cap = t->dchg_cap;
        t->dchg = c;
        t->dchg_cap = ccap;
        t->nchg = 0;
        tier_cb_t *cb = t->cbs;
        size_t bcap = t->cbs_cap;
        t->cbs = t->dcbs;
        t->cbs_cap = t->dcbs_cap;
        t->dcbs = cb;
        t->dcbs_cap = bcap;
        t->ncbs = 0;
        pthread_mutex_unlock(&t->mu);

        if (nchg > 0 && t->cfg.on_change != NULL) {
            if (t->dout_cap < nchg &&
                !kvt_grow(&t->dout, &t->dout_cap, nchg, sizeof(*t->dout), 256)) {
                kvt_log_error("out of memory: %zu tier changes not reported", nchg);
            } else {
                /* names stay put while the tier is open: the table only grows */
                for (size_t i = 0; i < nchg; i++) {
                    const tier_chg_t *x = &t->dchg[i];
                    t->dout[i] = (kvt_tier_change_t){.ns = t->ns[x->ns].name,
                                                     .ns_len = t->ns[x->ns].len,
                                                     .key = x->key,
                                                     .loc = (kvt_tier_loc_t)x->loc,
                                                     .stored = x->stored};
                }
                t->cfg.on_change(t->cfg.on_change_arg, t->dout, nchg);
            }
        }
        for (size_t i = 0; i < ncbs; i++) {
            tier_cb_t *x = &t->dcbs[i];
            if (x->kind == CB_PIN) {
                x->pin->done(x->pin->arg, x->pin->out, x->pin->n);
                free(x->pin->out);
                free(x->pin->w);
                free(x->pin);
            } else {
                x->done(x->arg, x->st);
            }
        }
    }
}

void tier_unlock(kvt_tier_t *t)
{
    bool work = t->nchg > 0 || t->ncbs > 0;
    pthread_mutex_unlock(&t->mu);
    if (!work || in_deliver)
        return; /* a delivery running on this thread picks them up */
    pthread_mutex_lock(&t->deliver_mu);
    in_deliver = true;
    deliver(t);
    in_deliver = false;
    pthread_mutex_unlock(&t->deliver_mu);
}

void tier_change(kvt_tier_t *t, const tblk_t *b, kvt_tier_loc_t loc, bool stored)
{
    if (t->cfg.on_change == NULL)
        return;
    if (t->nchg == t->chg_cap &&
        !kvt_grow(&t->chg, &t->chg_cap, t->nchg + 1, sizeof(*t->chg), 256)) {
        kvt_log_error("out of memory: a tier change is not reported");
        return;
    }
    t->chg[t->nchg++] =
        (tier_chg_t){.ns = b->ns, .key = b->key, .loc = (uint8_t)loc, .stored = stored};
}

void tier_cb(kvt_tier_t *t, const tier_cb_t *cb)
{
    /* completions must run: grow, and on failure run it late rather than never */
    while (t->ncbs == t->cbs_cap &&
           !kvt_grow(&t->cbs, &t->cbs_cap, t->ncbs + 1, sizeof(*t->cbs), 64)) {
        kvt_log_error("out of memory queueing a completion; retrying");
        pthread_mutex_unlock(&t->mu);
        usleep(1000);
        pthread_mutex_lock(&t->mu);
    }
    t->cbs[t->ncbs++] = *cb;
}

void tier_wake(kvt_tier_t *t)
{
    uint64_t one = 1;
    if (write(t->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        kvt_log_warn("waking the i/o thread: %s", strerror(errno));
}

uint32_t tier_ns_find(const kvt_tier_t *t, const char *ns, size_t len)
{
    if (ns == NULL || len == 0 || len > KVT_TIER_NS_MAX)
        return TB_NONE;
    for (size_t i = 0; i < t->nns; i++)
        if (t->ns[i].len == len && memcmp(t->ns[i].name, ns, len) == 0)
            return (uint32_t)i;
    return TB_NONE;
}

uint32_t tier_ns(kvt_tier_t *t, const char *ns, size_t len)
{
    uint32_t found = tier_ns_find(t, ns, len);
    if (found != TB_NONE || ns == NULL || len == 0 || len > KVT_TIER_NS_MAX)
        return found;
    if (t->nns == t->ns_cap && !kvt_grow(&t->ns, &t->ns_cap, t->nns + 1, sizeof(*t->ns), 8))
        return TB_NONE;
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return TB_NONE;
    memcpy(copy, ns, len);
    copy[len] = '\0';
    t->ns[t->nns] = (tier_ns_t){.name = copy, .len = (uint32_t)len, .meta = TB_NONE};
    return (uint32_t)t->nns++;
}

void tier_admit_touch(kvt_tier_t *t, const tblk_t *b)
{
    if (t->admit != NULL)
        kvt_admit_touch(t->admit, b->key ^ ((uint64_t)b->ns * 0x9e3779b97f4a7c15ull));
}

void tier_blk_free(kvt_tier_t *t, uint32_t bi)
{
    tmap_del(&t->map, bi);
}

void tier_ram_drop(kvt_tier_t *t, uint32_t bi, uint64_t *ev, size_t ev_cap, size_t *nev)
{
    tblk_t *b = &t->map.b[bi];
    tlist_unlink(&t->map, &t->map.ram, false, bi);
    kvt_slots_free(&t->ram_slots, b->ram);
    b->ram = TB_NONE;
    b->flags &= ~(uint32_t)(B_RAM | B_NOADMIT);
    tier_change(t, b, KVT_TIER_LOC_RAM, false);
    t->st.ram_evictions++;
    if (!(b->flags & B_DISK)) {
        t->st.drops++;
        if (nev != NULL) {
            if (*nev < ev_cap)
                ev[*nev] = b->key;
            (*nev)++;
        }
        tier_blk_free(t, bi);
    }
}

uint32_t tier_ram_take(kvt_tier_t *t, uint64_t *ev, size_t ev_cap, size_t *nev)
{
    uint32_t slot = kvt_slots_alloc(&t->ram_slots);
    if (slot != KVT_SLOT_NONE)
        return slot;
    /* prefer a block that is also on NVMe: dropping it loses nothing */
    uint32_t dirty = TB_NONE, walked = 0;
    for (uint32_t bi = t->map.ram.tail; bi != TB_NONE; bi = t->map.b[bi].rprev) {
        const tblk_t *b = &t->map.b[bi];
        if (b->pins > 0 || (b->flags & (B_DEMOTING | B_PROMOTING | B_RESERVED)))
            continue;
        if (b->flags & B_DISK) {
            tier_ram_drop(t, bi, ev, ev_cap, nev);
            return kvt_slots_alloc(&t->ram_slots);
        }
        if (dirty == TB_NONE)
            dirty = bi;
        if (++walked == 64)
            break; /* bounded: the demoter keeps clean blocks near the tail */
    }
    if (dirty == TB_NONE)
        return TB_NONE;
    tier_ram_drop(t, dirty, ev, ev_cap, nev);
    return kvt_slots_alloc(&t->ram_slots);
}

/* ---- sessions and leases ---- */

kvt_tier_sess_t *kvt_tier_sess_open(kvt_tier_t *t)
{
    kvt_tier_sess_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    tier_lock(t);
    s->next = t->sess;
    if (t->sess != NULL)
        t->sess->prev = s;
    t->sess = s;
    tier_unlock(t);
    return s;
}

bool tier_lease_add(kvt_tier_t *t, kvt_tier_sess_t *s, uint32_t bi, bool pin)
{
    if (s->nlease == s->cap && !kvt_grow(&s->lease, &s->cap, s->nlease + 1, sizeof(*s->lease), 16))
        return false;
    s->lease[s->nlease++] =
        (tlease_t){.bi = bi, .pin = pin, .deadline_ms = kvt_clock_ms() + t->lease_ms};
    return true;
}

/* Ends lease @i of @s (swapped with the last). */
static void lease_end(kvt_tier_t *t, kvt_tier_sess_t *s, size_t i)
{
    tlease_t l = s->lease[i];
    s->lease[i] = s->lease[--s->nlease];
    tblk_t *b = &t->map.b[l.bi];
    if (l.pin) {
        if (--b->pins == 0)
            t->pinned--;
        return;
    }
    /* a reservation never committed: the slot goes back, the block never existed */
    kvt_slots_free(&t->ram_slots, b->ram);
    t->reserved--;
    tier_blk_free(t, l.bi);
}

/*
 * Ends lease @i of @s that its holder did not end (the session closed, or the lease
 * expired): with a grace, it moves to the cooling session for grace_ms first, so that a
 * copy the holder still runs into or out of the slot does not meet another block there.
 */
static void lease_drop(kvt_tier_t *t, kvt_tier_sess_t *s, size_t i)
{
    kvt_tier_sess_t *c = t->cool_sess;
    if (t->grace_ms == 0 || c == NULL || s == c ||
        (c->nlease == c->cap && !kvt_grow(&c->lease, &c->cap, c->nlease + 1, sizeof(*c->lease), 16))) {
        lease_end(t, s, i);
        return;
    }
    tlease_t l = s->lease[i];
    s->lease[i] = s->lease[--s->nlease];
    l.deadline_ms = kvt_clock_ms() + t->grace_ms;
    c->lease[c->nlease++] = l;
}

/* Finds @s's lease of kind @pin on block @bi, from the newest. */
static size_t lease_find(const kvt_tier_sess_t *s, uint32_t bi, bool pin)
{
    for (size_t i = s->nlease; i-- > 0;)
        if (s->lease[i].bi == bi && s->lease[i].pin == pin)
            return i;
    return SIZE_MAX;
}

bool tier_lease_take(kvt_tier_t *t, kvt_tier_sess_t *s, uint32_t bi, bool pin)
{
    size_t i = lease_find(s, bi, pin);
    if (i == SIZE_MAX)
        return false;
    if (pin) {
        lease_end(t, s, i);
    } else {
        s->lease[i] = s->lease[--s->nlease];
        t->reserved--;
    }
    return true;
}

void kvt_tier_sess_close(kvt_tier_t *t, kvt_tier_sess_t *s)
{
    if (s == NULL)
        return;
    tier_lock(t);
    while (s->nlease > 0)
        lease_drop(t, s, s->nlease - 1);
    for (pin_req_t *p = s->pending; p != NULL; p = p->snext)
        p->s = NULL; /* its reads finish without pinning */
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        t->sess = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    tier_unlock(t);
    free(s->lease);
    free(s);
}

size_t kvt_tier_sess_renew(kvt_tier_t *t, kvt_tier_sess_t *s, uint32_t lease_ms)
{
    tier_lock(t);
    uint64_t deadline = kvt_clock_ms() + (lease_ms != 0 ? lease_ms : t->lease_ms);
    for (size_t i = 0; i < s->nlease; i++)
        s->lease[i].deadline_ms = deadline;
    size_t n = s->nlease;
    tier_unlock(t);
    return n;
}

size_t kvt_tier_expire(kvt_tier_t *t)
{
    uint64_t now = kvt_clock_ms();
    size_t n = 0;
    tier_lock(t);
    for (kvt_tier_sess_t *s = t->sess; s != NULL; s = s->next) {
        if (s == t->cool_sess)
            continue;
        for (size_t i = s->nlease; i-- > 0;) {
            if (s->lease[i].deadline_ms <= now) {
                lease_drop(t, s, i);
                n++;
            }
        }
    }
    kvt_tier_sess_t *c = t->cool_sess; /* after the others: what just moved waits its grace */
    for (size_t i = c != NULL ? c->nlease : 0; i-- > 0;)
        if (c->lease[i].deadline_ms <= now)
            lease_end(t, c, i);
    t->st.lease_expired += n;
    tier_unlock(t);
    if (n > 0)
        kvt_log_warn("%zu leases expired (pins or reservations an engine held past %u ms)", n,
                     t->lease_ms);
    return n;
}

/* ---- open, restore, close ---- */

static char *dup_or_empty(const char *s)
{
    return strdup(s != NULL ? s : "");
}

typedef struct restore {
    kvt_tier_t *t;
    kvt_meta_rec_t *bad;
    size_t nbad, bad_cap;
    bool oom;
} restore_t;

static void restore_bad(restore_t *r, const kvt_meta_rec_t *rec)
{
    if (r->nbad == r->bad_cap &&
        !kvt_grow(&r->bad, &r->bad_cap, r->nbad + 1, sizeof(*r->bad), 16)) {
        r->oom = true;
        return;
    }
    r->bad[r->nbad++] = *rec;
}

static bool restore_one(void *arg, const kvt_meta_rec_t *rec)
{
    restore_t *r = arg;
    kvt_tier_t *t = r->t;
    size_t nlen = 0;
    const char *name = kvt_meta_ns_name(t->meta, rec->ns, &nlen);
    if (name == NULL || rec->len == 0 || rec->len > t->cfg.block_bytes ||
        !kvt_slots_take(&t->disk_slots, rec->slot)) {
        /* no namespace, a bad length, or a slot out of range or named twice */
        t->st.restore_bad++;
        restore_bad(r, rec);
        return !r->oom;
    }
    /* (ns, key) is unique: the records are keyed by it and names map to ids one to one */
    uint32_t ns = tier_ns(t, name, nlen);
    if (ns == TB_NONE) {
        kvt_slots_free(&t->disk_slots, rec->slot);
        r->oom = true;
        return false;
    }
    t->ns[ns].meta = rec->ns;
    uint32_t bi = tmap_add(&t->map, ns, rec->key);
    tblk_t *b = &t->map.b[bi];
    b->flags = B_DISK;
    b->disk = rec->slot;
    b->len = rec->len;
    b->sum = rec->sum;
    b->gen = rec->gen;
    /* scan order is key order, not recency: the first reloaded go first */
    tlist_push(&t->map, &t->map.disk, true, bi);
    if (rec->gen >= t->gen)
        t->gen = rec->gen + 1;
    t->st.restored++;
    tier_change(t, b, KVT_TIER_LOC_DISK, true);
    return true;
}

static kvt_status_t restore(kvt_tier_t *t, char *err, size_t errlen)
{
    restore_t r = {.t = t};
    uint64_t bad = 0;
    uint64_t t0 = kvt_clock_ns();
    kvt_status_t st = kvt_meta_scan(t->meta, restore_one, &r, &bad, err, errlen);
    if (st == KVT_OK && r.oom) {
        kvt_errf(err, errlen, "out of memory restoring the store");
        st = KVT_ERR_NO_MEM;
    }
    t->st.restore_bad += bad;
    if (st == KVT_OK && r.nbad > 0) {
        /* records that named a slot twice, or nothing usable: deleted so a slot is never
         * claimed twice; their slots stay with the records that were kept */
        st = kvt_meta_write(t->meta, NULL, 0, r.bad, r.nbad, err, errlen);
        kvt_log_warn("restore: %zu metadata records were unusable and are deleted", r.nbad);
    }
    free(r.bad);
    if (st == KVT_OK)
        kvt_log_info("restore: %" PRIu64 " blocks from %s in %.3f s", t->st.restored, t->data_dir,
                     (double)(kvt_clock_ns() - t0) / 1e9);
    return st;
}

static void tier_free(kvt_tier_t *t)
{
    if (t->admit != NULL)
        kvt_admit_free(t->admit);
    if (t->meta != NULL)
        kvt_meta_close(t->meta);
    if (t->disk != NULL)
        kvt_disk_close(t->disk);
    kvt_arena_close(&t->arena);
    kvt_slots_cleanup(&t->ram_slots);
    kvt_slots_cleanup(&t->disk_slots);
    tmap_cleanup(&t->map);
    for (size_t i = 0; i < t->nns; i++)
        free(t->ns[i].name);
    free(t->ns);
    free(t->chg);
    free(t->dchg);
    free(t->cbs);
    free(t->dcbs);
    free(t->dout);
    free(t->promo);
    free(t->durable);
    free(t->del);
    if (t->get_sess != NULL) {
        free(t->get_sess->lease);
        free(t->get_sess);
    }
    if (t->cool_sess != NULL) {
        free(t->cool_sess->lease);
        free(t->cool_sess);
    }
    if (t->wake_fd >= 0)
        close(t->wake_fd);
    free(t->arena_name);
    free(t->disk_path);
    free(t->data_dir);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->deliver_mu);
    free(t);
}

kvt_status_t kvt_tier_open(const kvt_tier_cfg_t *cfg, kvt_tier_t **tier_p, char *err, size_t errlen)
{
    if (errlen > 0)
        err[0] = '\0';
    if (cfg->block_bytes == 0 || cfg->ram_bytes == 0) {
        kvt_errf(err, errlen, "the RAM tier needs a block size and a size above 0");
        return KVT_ERR_INVAL;
    }
    bool disk = cfg->disk_path != NULL && cfg->disk_path[0] != '\0';
    if (disk && (cfg->data_dir == NULL || cfg->data_dir[0] == '\0')) {
        kvt_errf(err, errlen, "an NVMe tier needs a data dir for its metadata");
        return KVT_ERR_INVAL;
    }
    kvt_tier_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    t->wake_fd = -1;
    t->arena.fd = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->deliver_mu, NULL);
    t->cfg = *cfg;
    t->arena_name = dup_or_empty(cfg->arena_name);
    t->disk_path = dup_or_empty(cfg->disk_path);
    t->data_dir = dup_or_empty(cfg->data_dir);
    if (t->arena_name == NULL || t->disk_path == NULL || t->data_dir == NULL) {
        kvt_errf(err, errlen, "out of memory");
        tier_free(t);
        return KVT_ERR_NO_MEM;
    }
    t->cfg.arena_name = t->arena_name;
    t->cfg.disk_path = t->disk_path;
    t->cfg.data_dir = t->data_dir;
    t->lease_ms = cfg->lease_ms != 0 ? cfg->lease_ms : LEASE_DEFAULT_MS;
    t->grace_ms = cfg->grace_ms;
    if (t->cfg.io_depth == 0)
        t->cfg.io_depth = IO_DEPTH_DEFAULT;

    kvt_arena_cfg_t acfg = {.ram_bytes = cfg->ram_bytes,
                            .block_bytes = cfg->block_bytes,
                            .name = t->arena_name,
                            .populate = cfg->populate};
    kvt_status_t st = kvt_arena_open(&t->arena, &acfg, err, errlen);
    if (st != KVT_OK)
        goto err_free;
    uint32_t disk_slots = 0;
    if (disk) {
        kvt_disk_cfg_t dcfg = {.path = t->disk_path,
                               .bytes = cfg->disk_bytes,
                               .slot_bytes = t->arena.slot_bytes,
                               .io_depth = t->cfg.io_depth,
                               .sqpoll = cfg->sqpoll,
                               .format_device = cfg->disk_format};
        st = kvt_disk_open(&dcfg, &t->disk, err, errlen);
        if (st != KVT_OK)
            goto err_free;
        st = kvt_disk_register(t->disk, t->arena.base, t->arena.map_bytes, err, errlen);
        if (st != KVT_OK)
            goto err_free;
        disk_slots = kvt_disk_nslots(t->disk);
        kvt_meta_cfg_t mcfg = {.dir = t->data_dir,
                               .store_id = kvt_disk_store_id(t->disk),
                               .slot_bytes = t->arena.slot_bytes,
                               .nslots = disk_slots,
                               .fresh_disk = kvt_disk_created(t->disk)};
        st = kvt_meta_open(&mcfg, &t->meta, err, errlen);
        if (st != KVT_OK)
            goto err_free;
        st = kvt_admit_new((kvt_admit_kind_t)cfg->admit, disk_slots, &t->admit);
        if (st != KVT_OK) {
            kvt_errf(err, errlen, "out of memory for the admission filter");
            goto err_free;
        }
    }
    if (kvt_slots_init(&t->ram_slots, t->arena.nslots) != KVT_OK ||
        kvt_slots_init(&t->disk_slots, disk_slots) != KVT_OK ||
        tmap_init(&t->map, t->arena.nslots + disk_slots) != KVT_OK) {
        kvt_errf(err, errlen, "out of memory for %u RAM and %u disk slots", t->arena.nslots,
                 disk_slots);
        st = KVT_ERR_NO_MEM;
        goto err_free;
    }
    t->low_water = t->arena.nslots / 8;
    if (t->low_water == 0)
        t->low_water = 1;
    t->st.ram_slots = t->arena.nslots;
    t->st.disk_slots = disk_slots;
    if (t->meta != NULL) {
        st = restore(t, err, errlen);
        if (st != KVT_OK)
            goto err_free;
    }
    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->wake_fd < 0) {
        kvt_errf(err, errlen, "eventfd: %s", strerror(errno));
        st = KVT_ERR_IO;
        goto err_free;
    }
    t->get_sess = kvt_tier_sess_open(t);
    t->cool_sess = kvt_tier_sess_open(t);
    if (t->get_sess == NULL || t->cool_sess == NULL) {
        kvt_errf(err, errlen, "out of memory");
        st = KVT_ERR_NO_MEM;
        goto err_free;
    }
    {
        int rc = pthread_create(&t->io_thread, NULL, tier_io_main, t);
        if (rc != 0) {
            kvt_errf(err, errlen, "starting the i/o thread: %s", strerror(rc));
            st = KVT_ERR_IO;
            goto err_free;
        }
        t->io_started = true;
    }
    /* the reloaded blocks, reported before open returns */
    tier_lock(t);
    tier_unlock(t);
    *tier_p = t;
    return KVT_OK;

err_free:
    if (t->disk != NULL && kvt_disk_created(t->disk)) {
        /* made by this call: nothing stays behind (closed first, then removed) */
        kvt_disk_close(t->disk);
        t->disk = NULL;
        unlink(t->disk_path);
    }
    tier_free(t);
    return st;
}

void kvt_tier_close(kvt_tier_t *t)
{
    if (t == NULL)
        return;
    if (t->io_started) {
        tier_lock(t);
        t->stop = true;
        pthread_mutex_unlock(&t->mu);
        tier_wake(t);
        pthread_join(t->io_thread, NULL);
    }
    kvt_tier_sess_close(t, t->get_sess);
    t->get_sess = NULL;
    kvt_tier_sess_close(t, t->cool_sess); /* its leases end at once (s == cool_sess) */
    t->cool_sess = NULL;
    /* pins still waiting (sessions closed) get their answers */
    tier_lock(t);
    tier_unlock(t);
    tier_free(t);
}

void kvt_tier_geom(const kvt_tier_t *t, kvt_tier_geom_t *g_p)
{
    *g_p = (kvt_tier_geom_t){.fd = t->arena.fd,
                             .map_bytes = t->arena.map_bytes,
                             .slot_off = t->arena.slot_off,
                             .slot_bytes = t->arena.slot_bytes,
                             .nslots = t->arena.nslots,
                             .block_bytes = t->cfg.block_bytes,
                             .disk_slots = t->st.disk_slots};
}

uint8_t *kvt_tier_slot_ptr(const kvt_tier_t *t, uint32_t slot)
{
    return kvt_arena_slot(&t->arena, slot);
}

void kvt_tier_stats(kvt_tier_t *t, kvt_tier_stats_t *st_p)
{
    tier_lock(t);
    *st_p = t->st;
    st_p->ram_used = t->ram_slots.n - t->ram_slots.nfree;
    st_p->ram_pinned = t->pinned;
    st_p->ram_reserved = t->reserved;
    st_p->disk_used = t->disk_slots.n - t->disk_slots.nfree;
    st_p->blocks = t->map.cap - t->map.nfree - t->reserved;
    pthread_mutex_unlock(&t->mu);
}
