/*
 * tiers/plane.c: the engine's calls (lookup, reserve/commit, pin/unpin,
 * prefetch) and the block API (put, get, delete). Each takes the tier's lock
 * once for its whole batch; bytes are copied outside it.
 */
#define KVT_LOG_COMPONENT "tiers"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "tiers/store_int.h"

static inline bool held(const tblk_t *b)
{
    return (b->flags & (B_RAM | B_DISK)) != 0;
}

/* Moves the held blocks among @bis to the heads of their lists, last first, so
 * the batch's first key ends most recent and a chain's tail goes first. */
static void touch_batch(kvt_tier_t *t, const uint32_t *bis, size_t n)
{
    for (size_t i = n; i-- > 0;) {
        if (bis[i] == TB_NONE)
            continue;
        tblk_t *b = &t->map.b[bis[i]];
        if (b->flags & B_RAM)
            tlist_touch(&t->map, &t->map.ram, false, bis[i]);
        if (b->flags & B_DISK)
            tlist_touch(&t->map, &t->map.disk, true, bis[i]);
        b->flags &= ~(uint32_t)B_NOADMIT;
        tier_admit_touch(t, b);
    }
}

size_t kvt_tier_held(kvt_tier_t *t, const char *ns, size_t ns_len, const uint64_t *keys, size_t n,
                     bool *held_out)
{
    size_t count = 0;
    tier_lock(t);
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    for (size_t i = 0; i < n; i++) {
        uint32_t bi = nsi != TB_NONE ? tmap_find(&t->map, nsi, keys[i]) : TB_NONE;
        held_out[i] = bi != TB_NONE && held(&t->map.b[bi]);
        count += held_out[i];
    }
    tier_unlock(t);
    return count;
}

size_t kvt_tier_lookup(kvt_tier_t *t, const char *ns, size_t ns_len, const uint64_t *keys, size_t n,
                       uint8_t *loc)
{
    size_t hit = 0;
    tier_lock(t);
    t->st.lookups += n;
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    /* one probe a key: each hit goes right behind the one before it, the first to the head,
     * so the batch ends in order with its first key most recent (a chain's tail goes first) */
    uint32_t prev_r = TB_NONE, prev_d = TB_NONE;
    for (; nsi != TB_NONE && hit < n; hit++) {
        uint32_t bi = tmap_find(&t->map, nsi, keys[hit]);
        if (bi == TB_NONE || !held(&t->map.b[bi]))
            break;
        tblk_t *b = &t->map.b[bi];
        bool ram = (b->flags & B_RAM) != 0;
        if (loc != NULL)
            loc[hit] = ram ? KVT_TIER_LOC_RAM : KVT_TIER_LOC_DISK;
        if (ram) {
            t->st.hits_ram++;
            tlist_place(&t->map, &t->map.ram, false, prev_r, bi);
            prev_r = bi;
        } else {
            t->st.hits_disk++;
        }
        if (b->flags & B_DISK) {
            tlist_place(&t->map, &t->map.disk, true, prev_d, bi);
            prev_d = bi;
        }
        b->flags &= ~(uint32_t)B_NOADMIT;
        tier_admit_touch(t, b);
    }
    t->st.misses += n - hit;
    tier_unlock(t);
    return hit;
}

kvt_status_t kvt_tier_reserve(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                              const uint64_t *keys, size_t n, uint32_t *slots, uint64_t *evicted,
                              size_t evicted_cap, size_t *nevicted_p)
{
    size_t nev = 0;
    tier_lock(t);
    uint32_t nsi = tier_ns(t, ns, ns_len);
    if (nsi == TB_NONE) {
        tier_unlock(t);
        return ns_len == 0 || ns_len > KVT_TIER_NS_MAX ? KVT_ERR_INVAL : KVT_ERR_NO_MEM;
    }
    kvt_status_t st = KVT_OK;
    for (size_t i = 0; i < n; i++) {
        slots[i] = KVT_TIER_SLOT_NONE;
        if (tmap_find(&t->map, nsi, keys[i]) != TB_NONE)
            continue; /* held, or reserved already */
        uint32_t slot = tier_ram_take(t, evicted, evicted_cap, &nev);
        if (slot == KVT_SLOT_NONE)
            continue;
        uint32_t bi = tmap_add(&t->map, nsi, keys[i]);
        if (bi == TB_NONE) {
            kvt_slots_free(&t->ram_slots, slot);
            continue;
        }
        tblk_t *b = &t->map.b[bi];
        b->flags = B_RESERVED;
        b->ram = slot;
        if (!tier_lease_add(t, s, bi, false)) {
            kvt_slots_free(&t->ram_slots, slot);
            tier_blk_free(t, bi);
            st = KVT_ERR_NO_MEM;
            break;
        }
        t->reserved++;
        slots[i] = slot;
    }
    if (t->ram_slots.nfree < t->low_water)
        tier_wake(t);
    tier_unlock(t);
    if (nevicted_p != NULL)
        *nevicted_p = nev;
    return st;
}

/*
 * The sums of the reserved blocks among @keys, into @sums, their slots into
 * @slots (TB_NONE for the others): hashed outside the lock, since a reserved
 * slot's bytes are its writer's and the slot stays put until the commit.
 */
static void commit_sums(kvt_tier_t *t, const char *ns, size_t ns_len, const uint64_t *keys,
                        size_t n, const uint32_t *lens, uint64_t *sums, uint32_t *slots)
{
    tier_lock(t);
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    for (size_t i = 0; i < n; i++) {
        uint32_t bi = nsi != TB_NONE ? tmap_find(&t->map, nsi, keys[i]) : TB_NONE;
        slots[i] = bi != TB_NONE && (t->map.b[bi].flags & B_RESERVED) ? t->map.b[bi].ram : TB_NONE;
    }
    tier_unlock(t);
    for (size_t i = 0; i < n; i++)
        if (slots[i] != TB_NONE)
            sums[i] = tier_sum(kvt_arena_slot(&t->arena, slots[i]),
                               lens != NULL ? lens[i] : t->cfg.block_bytes);
}

/* kvt_tier_commit() and, with @given (the blocks' sums, vouched for by the caller),
 * kvt_tier_commit_sums(). */
static kvt_status_t tier_commit(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                                const uint64_t *keys, size_t n, const uint32_t *lens, bool ok,
                                const uint64_t *given, size_t *done_p)
{
    if (ok && lens != NULL)
        for (size_t i = 0; i < n; i++)
            if (lens[i] == 0 || lens[i] > t->cfg.block_bytes)
                return KVT_ERR_INVAL;
    uint64_t *sums = NULL;
    uint32_t *slots = NULL;
    if (ok && n > 0 && given == NULL) {
        sums = malloc(n * sizeof(*sums));
        slots = malloc(n * sizeof(*slots));
        if (sums == NULL || slots == NULL) {
            free(sums);
            free(slots);
            return KVT_ERR_NO_MEM;
        }
        commit_sums(t, ns, ns_len, keys, n, lens, sums, slots);
    }
    size_t done = 0;
    tier_lock(t);
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    /* last to first, so the first key ends most recent */
    for (size_t i = n; nsi != TB_NONE && i-- > 0;) {
        uint32_t bi = tmap_find(&t->map, nsi, keys[i]);
        if (bi == TB_NONE || !(t->map.b[bi].flags & B_RESERVED) ||
            !tier_lease_take(t, s, bi, false))
            continue;
        tblk_t *b = &t->map.b[bi];
        done++;
        if (!ok) {
            kvt_slots_free(&t->ram_slots, b->ram);
            tier_blk_free(t, bi);
            continue;
        }
        b->flags = B_RAM;
        b->len = lens != NULL ? lens[i] : t->cfg.block_bytes;
        /* a slot not seen by commit_sums (reserved since) is hashed here, rarely */
        if (given != NULL)
            b->sum = given[i];
        else
            b->sum =
                slots[i] == b->ram ? sums[i] : tier_sum(kvt_arena_slot(&t->arena, b->ram), b->len);
        tlist_push(&t->map, &t->map.ram, false, bi);
        tier_admit_touch(t, b);
        tier_change(t, b, KVT_TIER_LOC_RAM, true);
        t->st.puts++;
    }
    if (t->ram_slots.nfree < t->low_water)
        tier_wake(t);
    tier_unlock(t);
    free(sums);
    free(slots);
    if (done_p != NULL)
        *done_p = done;
    return KVT_OK;
}

kvt_status_t kvt_tier_commit(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                             const uint64_t *keys, size_t n, const uint32_t *lens, bool ok,
                             size_t *done_p)
{
    return tier_commit(t, s, ns, ns_len, keys, n, lens, ok, NULL, done_p);
}

kvt_status_t kvt_tier_commit_sums(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                                  const uint64_t *keys, size_t n, const uint32_t *lens,
                                  const uint64_t *sums, size_t *done_p)
{
    if (sums == NULL && n > 0)
        return KVT_ERR_INVAL;
    return tier_commit(t, s, ns, ns_len, keys, n, lens, true, sums, done_p);
}

/* Pins held RAM block @bi for @s; false when out of memory. */
static bool pin_now(kvt_tier_t *t, kvt_tier_sess_t *s, uint32_t bi)
{
    if (!tier_lease_add(t, s, bi, true))
        return false;
    if (t->map.b[bi].pins++ == 0)
        t->pinned++;
    return true;
}

/* Starts promoting disk-only block @bi: a RAM slot, then a read. False when no slot. */
static bool promote(kvt_tier_t *t, uint32_t bi)
{
    if (t->npromo == t->promo_cap &&
        !kvt_grow(&t->promo, &t->promo_cap, t->npromo + 1, sizeof(*t->promo), 64))
        return false;
    uint32_t slot = tier_ram_take(t, NULL, 0, NULL);
    if (slot == KVT_SLOT_NONE)
        return false;
    tblk_t *b = &t->map.b[bi];
    b->ram = slot;
    b->flags |= B_PROMOTING;
    t->promo[t->npromo++] = bi;
    t->st.promotions++;
    return true;
}

kvt_status_t kvt_tier_pin(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                          const uint64_t *keys, size_t n, kvt_tier_pin_cb done, void *arg)
{
    pin_req_t *req = calloc(1, sizeof(*req));
    kvt_tier_pinned_t *out = malloc((n > 0 ? n : 1) * sizeof(*out));
    tier_wait_t *w = calloc(n > 0 ? n : 1, sizeof(*w));
    uint32_t *bis = malloc((n > 0 ? n : 1) * sizeof(*bis));
    if (req == NULL || out == NULL || w == NULL || bis == NULL) {
        free(req);
        free(out);
        free(w);
        free(bis);
        return KVT_ERR_NO_MEM;
    }
    *req = (pin_req_t){.s = s, .done = done, .arg = arg, .n = n, .out = out, .w = w};
    tier_lock(t);
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    for (size_t i = 0; i < n; i++) {
        out[i] = (kvt_tier_pinned_t){.slot = KVT_TIER_SLOT_NONE, .len = 0};
        bis[i] = nsi != TB_NONE ? tmap_find(&t->map, nsi, keys[i]) : TB_NONE;
        if (bis[i] == TB_NONE || !held(&t->map.b[bis[i]])) {
            bis[i] = TB_NONE;
            t->st.misses++;
            continue;
        }
        tblk_t *b = &t->map.b[bis[i]];
        if ((b->flags & B_RAM) && pin_now(t, s, bis[i])) {
            out[i] = (kvt_tier_pinned_t){.slot = b->ram, .len = b->len, .sum = b->sum};
            t->st.hits_ram++;
            continue;
        }
        if ((b->flags & B_RAM) || (!(b->flags & B_PROMOTING) && !promote(t, bis[i]))) {
            t->st.misses++; /* out of memory, or no RAM slot to promote into */
            continue;
        }
        t->st.hits_disk++;
        w[i] = (tier_wait_t){.next = b->wait, .pin = req, .i = i};
        b->wait = &w[i];
        req->waiting++;
    }
    touch_batch(t, bis, n);
    if (req->waiting == 0) {
        tier_cb(t, &(tier_cb_t){.kind = CB_PIN, .pin = req});
    } else {
        req->snext = s->pending;
        s->pending = req;
        tier_wake(t);
    }
    tier_unlock(t);
    free(bis);
    return KVT_OK;
}

size_t kvt_tier_unpin(kvt_tier_t *t, kvt_tier_sess_t *s, const char *ns, size_t ns_len,
                      const uint64_t *keys, size_t n)
{
    size_t done = 0;
    tier_lock(t);
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    for (size_t i = 0; nsi != TB_NONE && i < n; i++) {
        uint32_t bi = tmap_find(&t->map, nsi, keys[i]);
        if (bi != TB_NONE && tier_lease_take(t, s, bi, true))
            done++;
    }
    tier_unlock(t);
    return done;
}

size_t kvt_tier_prefetch(kvt_tier_t *t, const char *ns, size_t ns_len, const uint64_t *keys,
                         size_t n)
{
    size_t started = 0;
    tier_lock(t);
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    for (size_t i = 0; nsi != TB_NONE && i < n; i++) {
        uint32_t bi = tmap_find(&t->map, nsi, keys[i]);
        if (bi == TB_NONE)
            continue;
        const tblk_t *b = &t->map.b[bi];
        if ((b->flags & B_DISK) && !(b->flags & (B_RAM | B_PROMOTING)) && promote(t, bi))
            started++;
    }
    t->st.prefetches += started;
    if (started > 0)
        tier_wake(t);
    tier_unlock(t);
    return started;
}

/* Queues a durable wait on RAM block @bi and asks the I/O thread to write it. */
static kvt_status_t want_durable(kvt_tier_t *t, uint32_t bi, tier_wait_t *w)
{
    tblk_t *b = &t->map.b[bi];
    if (!(b->flags & B_DEMOTING)) {
        if (t->ndurable == t->durable_cap &&
            !kvt_grow(&t->durable, &t->durable_cap, t->ndurable + 1, sizeof(*t->durable), 16))
            return KVT_ERR_NO_MEM;
        t->durable[t->ndurable++] = bi;
        b->flags |= B_DEMOTING | B_DURABLE;
    }
    w->next = b->wait;
    b->wait = w;
    tier_wake(t);
    return KVT_OK;
}

kvt_status_t kvt_tier_put(kvt_tier_t *t, const char *ns, size_t ns_len, uint64_t key,
                          const void *data, size_t len, bool durable, kvt_tier_done_cb done,
                          void *arg)
{
    if (len > t->cfg.block_bytes)
        return KVT_ERR_TOO_BIG;
    if (len == 0 || ns_len == 0 || ns_len > KVT_TIER_NS_MAX)
        return KVT_ERR_INVAL;
    if (durable && t->disk == NULL)
        return KVT_ERR_UNSUPPORTED;
    tier_wait_t *w = NULL;
    if (durable && (w = calloc(1, sizeof(*w))) == NULL)
        return KVT_ERR_NO_MEM;
    if (w != NULL)
        *w = (tier_wait_t){.done = done, .arg = arg};
    kvt_status_t st = KVT_OK;
    tier_lock(t);
    uint32_t nsi = tier_ns(t, ns, ns_len);
    uint32_t bi = nsi != TB_NONE ? tmap_find(&t->map, nsi, key) : TB_NONE;
    if (nsi == TB_NONE) {
        st = KVT_ERR_NO_MEM;
    } else if (bi != TB_NONE) {
        tblk_t *b = &t->map.b[bi];
        if (b->flags & B_RESERVED) {
            st = KVT_ERR_EXISTS; /* an engine is writing it */
        } else if (!durable || (b->flags & B_DISK)) {
            tier_cb(t, &(tier_cb_t){.kind = CB_DONE, .done = done, .arg = arg, .st = KVT_OK});
        } else if ((st = want_durable(t, bi, w)) == KVT_OK) {
            w = NULL;
        }
    } else {
        uint32_t slot = tier_ram_take(t, NULL, 0, NULL);
        bi = slot != KVT_SLOT_NONE ? tmap_add(&t->map, nsi, key) : TB_NONE;
        if (bi == TB_NONE) {
            if (slot != KVT_SLOT_NONE)
                kvt_slots_free(&t->ram_slots, slot);
            st = KVT_ERR_NO_SPACE;
        } else {
            /* reserved while the bytes are copied without the lock */
            t->map.b[bi].flags = B_RESERVED;
            t->map.b[bi].ram = slot;
            t->reserved++;
            pthread_mutex_unlock(&t->mu);
            memcpy(kvt_arena_slot(&t->arena, slot), data, len);
            uint64_t sum = tier_sum(data, len);
            tier_lock(t);
            tblk_t *b = &t->map.b[bi];
            t->reserved--;
            b->flags = B_RAM;
            b->len = (uint32_t)len;
            b->sum = sum;
            tlist_push(&t->map, &t->map.ram, false, bi);
            tier_admit_touch(t, b);
            tier_change(t, b, KVT_TIER_LOC_RAM, true);
            t->st.puts++;
            if (!durable)
                tier_cb(t, &(tier_cb_t){.kind = CB_DONE, .done = done, .arg = arg, .st = KVT_OK});
            else if (want_durable(t, bi, w) == KVT_OK)
                w = NULL;
            else /* in RAM, but its durable write could not be queued */
                tier_cb(t, &(tier_cb_t){
                               .kind = CB_DONE, .done = done, .arg = arg, .st = KVT_ERR_NO_MEM});
            if (t->ram_slots.nfree < t->low_water)
                tier_wake(t);
        }
    }
    tier_unlock(t);
    free(w);
    return st;
}

typedef struct get_ctx {
    kvt_tier_t *t;
    kvt_tier_get_cb cb;
    void *arg;
    uint32_t nsi;
    uint64_t key;
} get_ctx_t;

static void get_pinned(void *arg, const kvt_tier_pinned_t *out, size_t n)
{
    get_ctx_t *g = arg;
    kvt_tier_t *t = g->t;
    if (n != 1 || out[0].slot == KVT_TIER_SLOT_NONE) {
        g->cb(g->arg, KVT_ERR_NOT_FOUND, NULL, 0);
    } else {
        g->cb(g->arg, KVT_OK, kvt_arena_slot(&t->arena, out[0].slot), out[0].len);
        tier_lock(t);
        uint32_t bi = tmap_find(&t->map, g->nsi, g->key);
        if (bi != TB_NONE)
            tier_lease_take(t, t->get_sess, bi, true);
        tier_unlock(t);
    }
    free(g);
}

kvt_status_t kvt_tier_get(kvt_tier_t *t, const char *ns, size_t ns_len, uint64_t key,
                          kvt_tier_get_cb cb, void *arg)
{
    get_ctx_t *g = malloc(sizeof(*g));
    if (g == NULL)
        return KVT_ERR_NO_MEM;
    tier_lock(t);
    t->st.gets++;
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    pthread_mutex_unlock(&t->mu);
    *g = (get_ctx_t){.t = t, .cb = cb, .arg = arg, .nsi = nsi, .key = key};
    kvt_status_t st = kvt_tier_pin(t, t->get_sess, ns, ns_len, &key, 1, get_pinned, g);
    if (st != KVT_OK)
        free(g);
    return st;
}

kvt_status_t kvt_tier_delete(kvt_tier_t *t, const char *ns, size_t ns_len, uint64_t key,
                             kvt_tier_done_cb done, void *arg)
{
    kvt_status_t st = KVT_OK;
    tier_lock(t);
    uint32_t nsi = tier_ns_find(t, ns, ns_len);
    uint32_t bi = nsi != TB_NONE ? tmap_find(&t->map, nsi, key) : TB_NONE;
    tblk_t *b = bi != TB_NONE ? &t->map.b[bi] : NULL;
    if (b == NULL || !held(b)) {
        st = b == NULL ? KVT_ERR_NOT_FOUND : KVT_ERR_EXISTS;
    } else if (b->pins > 0 || (b->flags & (B_RESERVED | B_DEMOTING | B_PROMOTING))) {
        st = KVT_ERR_EXISTS;
    } else if ((b->flags & B_DISK) && t->ndel == t->del_cap &&
               !kvt_grow(&t->del, &t->del_cap, t->ndel + 1, sizeof(*t->del), 16)) {
        st = KVT_ERR_NO_MEM;
    } else {
        if (b->flags & B_RAM) {
            tlist_unlink(&t->map, &t->map.ram, false, bi);
            kvt_slots_free(&t->ram_slots, b->ram);
            tier_change(t, b, KVT_TIER_LOC_RAM, false);
        }
        if (b->flags & B_DISK) {
            /* the slot stays taken until the record is gone; @done runs then */
            tlist_unlink(&t->map, &t->map.disk, true, bi);
            tier_change(t, b, KVT_TIER_LOC_DISK, false);
            t->del[t->ndel++] = (tier_del_t){.ns_meta = t->ns[b->ns].meta,
                                             .key = key,
                                             .slot = b->disk,
                                             .done = done,
                                             .arg = arg};
            tier_wake(t);
        } else {
            tier_cb(t, &(tier_cb_t){.kind = CB_DONE, .done = done, .arg = arg, .st = KVT_OK});
        }
        tier_blk_free(t, bi);
        t->st.deletes++;
    }
    tier_unlock(t);
    return st;
}
