/*
 * kvindex/index_names.c: pods and namespaces: their name maps, creation, lookup, clearing and
 * dropping, and the per-namespace and per-pod figures the server reads.
 */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvindex/index_writer_int.h"

/* ---- names ----------------------------------------------------------------- */

static uint64_t name_hash(const char *a, const char *b, uint32_t n)
{
    XXH3_state_t s;
    XXH3_INITSTATE(&s);
    XXH3_64bits_reset_withSeed(&s, 0x6b7674u);
    XXH3_64bits_update(&s, a, strlen(a) + 1);
    XXH3_64bits_update(&s, b, strlen(b) + 1);
    XXH3_64bits_update(&s, &n, sizeof(n));
    return XXH3_64bits_digest(&s);
}

static size_t nmap_bytes(uint32_t cap)
{
    return (size_t)cap * (sizeof(uint64_t) + sizeof(uint32_t));
}

static kvt_status_t nmap_rebuild(kvt_idx_t *idx, name_map_t *m, uint32_t cap)
{
    uint8_t *mem = kvt_idx_acct_alloc(idx, nmap_bytes(cap));
    if (mem == NULL)
        return KVT_ERR_NO_MEM;
    uint64_t *hash = (uint64_t *)(void *)mem;
    uint32_t *id = (uint32_t *)(void *)(mem + (size_t)cap * sizeof(uint64_t));
    for (uint32_t i = 0; i < cap; i++)
        id[i] = NAME_EMPTY;
    for (uint32_t i = 0; m->mask && i <= m->mask; i++) {
        if (m->id[i] >= NAME_TOMB)
            continue;
        uint32_t j = (uint32_t)m->hash[i] & (cap - 1);
        while (id[j] != NAME_EMPTY)
            j = (j + 1) & (cap - 1);
        hash[j] = m->hash[i];
        id[j] = m->id[i];
    }
    if (m->mask)
        kvt_idx_acct_free(idx, m->hash, nmap_bytes(m->mask + 1));
    m->hash = hash;
    m->id = id;
    m->mask = cap - 1;
    m->tomb = 0;
    return KVT_OK;
}

/* Calls @eq for candidates with hash @h; returns the slot holding a match or KVT_NIL. */
typedef bool (*name_eq_fn)(kvt_idx_t *idx, uint32_t id, const char *a, const char *b, uint32_t n);

static uint32_t nmap_find(kvt_idx_t *idx, const name_map_t *m, uint64_t h, name_eq_fn eq,
                          const char *a, const char *b, uint32_t n)
{
    if (m->mask == 0)
        return KVT_NIL;
    for (uint32_t i = (uint32_t)h & m->mask;; i = (i + 1) & m->mask) {
        if (m->id[i] == NAME_EMPTY)
            return KVT_NIL;
        if (m->id[i] != NAME_TOMB && m->hash[i] == h && eq(idx, m->id[i], a, b, n))
            return i;
    }
}

/* Capacity the next nmap_add() on @m rebuilds it with, or 0 when it has room. */
static uint32_t nmap_grow_cap(const name_map_t *m)
{
    if (m->mask != 0 && (uint64_t)(m->live + m->tomb + 1) * 4 <= (uint64_t)(m->mask + 1) * 3)
        return 0;
    uint32_t cap = m->mask ? m->mask + 1 : 16;
    if ((uint64_t)(m->live + 1) * 2 > cap)
        cap *= 2;
    return cap;
}

/* Bytes the next nmap_add() on @m allocates (callers ask the budget for them first). */
static size_t nmap_grow_bytes(const name_map_t *m)
{
    uint32_t cap = nmap_grow_cap(m);
    return cap ? nmap_bytes(cap) : 0;
}

static kvt_status_t nmap_add(kvt_idx_t *idx, name_map_t *m, uint64_t h, uint32_t id)
{
    uint32_t cap = nmap_grow_cap(m);
    if (cap != 0) {
        kvt_status_t st = nmap_rebuild(idx, m, cap);
        if (st != KVT_OK)
            return st;
    }
    uint32_t i = (uint32_t)h & m->mask;
    while (m->id[i] < NAME_TOMB)
        i = (i + 1) & m->mask;
    if (m->id[i] == NAME_TOMB)
        m->tomb--;
    m->hash[i] = h;
    m->id[i] = id;
    m->live++;
    return KVT_OK;
}

/* Removes the name in slot @i; an emptied map is freed, a sparse one shrinks. */
static void nmap_del(kvt_idx_t *idx, name_map_t *m, uint32_t i)
{
    m->id[i] = NAME_TOMB;
    m->live--;
    m->tomb++;
    uint32_t cap = m->mask + 1;
    if (m->live == 0) {
        kvt_idx_acct_free(idx, m->hash, nmap_bytes(cap));
        memset(m, 0, sizeof(*m));
        return;
    }
    if (cap > 16 && (uint64_t)m->live * 8 <= cap) {
        uint32_t ncap = 16;
        while ((uint64_t)(m->live + 1) * 2 > ncap)
            ncap *= 2;
        nmap_rebuild(idx, m, ncap); /* on failure the bigger map stays */
    }
}

static bool pod_eq(kvt_idx_t *idx, uint32_t id, const char *a, const char *b, uint32_t n)
{
    (void)b;
    kvt_pod_t *p = &idx->pods[id];
    return p->name != NULL && p->dp_rank == n && strcmp(p->name, a) == 0;
}

static bool ns_eq(kvt_idx_t *idx, uint32_t slot, const char *a, const char *b, uint32_t n)
{
    (void)n;
    const ns_w_t *w = &idx->nsw[slot];
    return w->model != NULL && strcmp(w->model, a) == 0 && strcmp(w->lora, b) == 0;
}

static char *acct_strdup(kvt_idx_t *idx, const char *s, size_t *bytes_p)
{
    size_t len = strlen(s) + 1;
    char *d = kvt_idx_acct_alloc(idx, len);
    if (d != NULL) {
        memcpy(d, s, len);
        *bytes_p = len;
    }
    return d;
}

static void acct_strfree(kvt_idx_t *idx, char *s)
{
    if (s != NULL)
        kvt_idx_acct_free(idx, s, strlen(s) + 1);
}

kvt_status_t kvt_idx_ns_get(kvt_idx_t *idx, const char *model, const char *lora,
                            uint32_t block_size, uint32_t *ns_p)
{
    if (model == NULL || model[0] == '\0')
        return KVT_ERR_INVAL;
    if (lora == NULL)
        lora = "";
    if (strlen(model) > KVT_IDX_MAX_NAME || strlen(lora) > KVT_IDX_MAX_NAME)
        return KVT_ERR_TOO_BIG;
    uint64_t h = name_hash(model, lora, 0);
    uint32_t found = nmap_find(idx, &idx->ns_map, h, ns_eq, model, lora, 0);
    if (found != KVT_NIL) {
        ns_w_t *w = &idx->nsw[idx->ns_map.id[found]];
        if (block_size != 0 && block_size != w->block_size)
            return KVT_ERR_INVAL;
        w->last_use = idx->now_ms;
        *ns_p = w->id;
        return KVT_OK;
    }
    if (block_size == 0)
        return KVT_ERR_NOT_FOUND;
    if (idx->ns_live >= KVT_IDX_MAX_NS)
        return KVT_ERR_LIMIT;
    /* the lowest free slot, so trailing slots stay free and can be given back */
    uint32_t slot = idx->ns_hint;
    while (slot < idx->sh.nns && idx->nsw[slot].model != NULL)
        slot++;
    idx->ns_hint = slot;
    bool new_chunk = (slot >> NS_CHUNK_SHIFT) >= idx->sh.nss->n;
    uint32_t wcap = idx->nsw_cap;
    if (slot >= wcap)
        wcap = wcap ? wcap * 2 : 16;
    size_t need = strlen(model) + strlen(lora) + 2 + nmap_grow_bytes(&idx->ns_map) +
                  (wcap != idx->nsw_cap ? (size_t)wcap * sizeof(ns_w_t) : 0) +
                  (new_chunk ? NS_CHUNK * sizeof(kvt_ns_t) + dir_grow_bytes(idx->sh.nss) : 0);
    if (!kvt_idx_room_admin(idx, need)) {
        idx->refused++;
        return KVT_ERR_NO_SPACE;
    }
    if (wcap != idx->nsw_cap) {
        if (kvt_idx_acct_resize(idx, (void **)&idx->nsw, sizeof(ns_w_t), idx->sh.nns, idx->nsw_cap,
                                wcap) != KVT_OK)
            return KVT_ERR_NO_MEM;
        idx->nsw_cap = wcap;
    }
    if (new_chunk) {
        kvt_ns_t *c = kvt_idx_acct_alloc(idx, NS_CHUNK * sizeof(kvt_ns_t));
        if (c == NULL)
            return KVT_ERR_NO_MEM;
        for (uint32_t i = 0; i < NS_CHUNK; i++)
            c[i] = (kvt_ns_t){0, NS_ID_FREE, 0};
        if (kvt_idx_dir_append(idx, &idx->sh.nss, c) != KVT_OK) {
            kvt_idx_acct_free(idx, c, NS_CHUNK * sizeof(kvt_ns_t));
            return KVT_ERR_NO_MEM;
        }
    }
    size_t b1 = 0, b2 = 0;
    char *m = acct_strdup(idx, model, &b1), *l = acct_strdup(idx, lora, &b2);
    if (m == NULL || l == NULL || nmap_add(idx, &idx->ns_map, h, slot) != KVT_OK)
        goto err_names;
    uint32_t gen = 0;
    if (slot < idx->ns_hw) {
        /* a reused slot: ids handed out for it before must not match */
        idx->ns_gen = idx->ns_gen >= NS_GEN_MAX ? 1 : idx->ns_gen + 1;
        gen = idx->ns_gen;
    }
    /* the very first namespace has salt 0: its keys are the sequence keys themselves */
    uint64_t salt = idx->ns_hw == 0 ? 0 : kvt_mix64(h | 1);
    uint32_t id = NS_ID(gen, slot);
    idx->nsw[slot] = (ns_w_t){m, l, salt, 0, idx->now_ms, id, block_size};
    kvt_ns_t *r = dir_ns(idx->sh.nss, slot);
    /* the slot reads free (since its drop or its chunk's creation) while the salt changes */
    __atomic_store_n(&r->id, NS_ID_FREE, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&r->salt, salt, __ATOMIC_RELAXED);
    __atomic_store_n(&r->id, id, __ATOMIC_RELEASE);
    if (slot >= idx->sh.nns)
        __atomic_store_n(&idx->sh.nns, slot + 1, __ATOMIC_RELEASE);
    if (slot >= idx->ns_hw)
        idx->ns_hw = slot + 1;
    idx->ns_hint = slot + 1;
    idx->ns_live++;
    kvt_idx_names_changed(idx);
    *ns_p = id;
    return KVT_OK;

err_names:
    kvt_idx_acct_free(idx, m, b1);
    kvt_idx_acct_free(idx, l, b2);
    return KVT_ERR_NO_MEM;
}

kvt_status_t kvt_idx_ns_drop(kvt_idx_t *idx, uint32_t ns, uint64_t *blocks_p)
{
    uint32_t slot;
    if (!ns_slot(idx, ns, &slot))
        return KVT_ERR_NOT_FOUND;
    uint64_t blocks = idx->nsw[slot].blocks;
    /* from here on queries with the id answer nothing, rather than a namespace half gone */
    kvt_ns_t *r = dir_ns(idx->sh.nss, slot);
    __atomic_store_n(&r->id, NS_ID_FREE, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    /*
     * Nodes do not list their namespace's other nodes: scan the slab. A node
     * whose holders are gone frees itself once childless, and so do its
     * ancestors. Chains stay within a namespace (a parent is looked up with
     * the store's own salt), so once the count is 0 nothing is left; a node
     * of another namespace linked to one of these (a salted-key collision)
     * is unlinked.
     */
    for (uint32_t nid = 0; nid < idx->nodes_used && idx->nsw[slot].blocks > 0; nid++) {
        kvt_node_t *n = N(idx, nid);
        if (n->pods == PODS_FREE)
            continue;
        if (*node_ns(idx, nid) == slot) {
            kvt_idx_node_strip(idx, nid);
            kvt_idx_node_maybe_free(idx, nid); /* one that held nothing; a no-op once freed */
        } else if (n->parent != KVT_NIL && *node_ns(idx, n->parent) == slot) {
            uint32_t parent = n->parent;
            n->parent = KVT_NIL;
            N(idx, parent)->nchild--;
            kvt_idx_node_maybe_free(idx, parent);
        }
    }
    ns_w_t *w = &idx->nsw[slot];
    uint32_t mi =
        nmap_find(idx, &idx->ns_map, name_hash(w->model, w->lora, 0), ns_eq, w->model, w->lora, 0);
    if (mi != KVT_NIL)
        nmap_del(idx, &idx->ns_map, mi);
    acct_strfree(idx, w->model);
    acct_strfree(idx, w->lora);
    *w = (ns_w_t){NULL, NULL, 0, 0, 0, NS_ID_FREE, 0};
    idx->ns_live--;
    kvt_idx_names_changed(idx);
    if (slot < idx->ns_hint)
        idx->ns_hint = slot;
    kvt_idx_ns_trim(idx);
    kvt_idx_trim(idx);
    if (blocks_p != NULL)
        *blocks_p = blocks;
    return KVT_OK;
}

uint32_t kvt_idx_ns_count(const kvt_idx_t *idx)
{
    return __atomic_load_n(&idx_shared((kvt_idx_t *)idx)->nns, __ATOMIC_ACQUIRE);
}

uint32_t kvt_idx_ns_id(const kvt_idx_t *idx, uint32_t slot)
{
    return slot < idx->sh.nns ? idx->nsw[slot].id : KVT_IDX_NS_NONE;
}

const char *kvt_idx_ns_name(const kvt_idx_t *idx, uint32_t ns, const char **lora_p)
{
    uint32_t slot;
    if (!ns_slot(idx, ns, &slot))
        return NULL;
    if (lora_p != NULL)
        *lora_p = idx->nsw[slot].lora;
    return idx->nsw[slot].model;
}

uint64_t kvt_idx_ns_blocks(const kvt_idx_t *idx, uint32_t ns)
{
    uint32_t slot;
    return ns_slot(idx, ns, &slot) ? idx->nsw[slot].blocks : 0;
}

uint64_t kvt_idx_ns_last_use(const kvt_idx_t *idx, uint32_t ns)
{
    uint32_t slot;
    return ns_slot(idx, ns, &slot) ? idx->nsw[slot].last_use : 0;
}

uint32_t kvt_idx_pod_limit(const kvt_idx_t *idx)
{
    return idx->pod_hi;
}

uint32_t kvt_idx_ns_block_size(const kvt_idx_t *idx, uint32_t ns)
{
    uint32_t slot;
    return ns_slot(idx, ns, &slot) ? idx->nsw[slot].block_size : 0;
}

uint64_t kvt_idx_salted_key(const kvt_idx_t *idx, uint32_t ns, uint64_t key)
{
    uint32_t slot;
    return ns_slot(idx, ns, &slot) ? key ^ idx->nsw[slot].salt : key;
}

kvt_status_t kvt_idx_pod_find(const kvt_idx_t *cidx, const char *name, uint32_t dp_rank,
                              uint32_t *pod_p)
{
    kvt_idx_t *idx = (kvt_idx_t *)cidx;
    if (name == NULL)
        return KVT_ERR_INVAL;
    uint32_t slot =
        nmap_find(idx, &idx->pod_map, name_hash(name, "", dp_rank), pod_eq, name, "", dp_rank);
    if (slot == KVT_NIL)
        return KVT_ERR_NOT_FOUND;
    *pod_p = idx->pod_map.id[slot];
    return KVT_OK;
}

kvt_status_t kvt_idx_pod_get(kvt_idx_t *idx, const char *name, uint32_t dp_rank, uint32_t *pod_p)
{
    if (name == NULL || name[0] == '\0')
        return KVT_ERR_INVAL;
    if (strlen(name) > KVT_IDX_MAX_NAME)
        return KVT_ERR_TOO_BIG;
    if (kvt_idx_pod_find(idx, name, dp_rank, pod_p) == KVT_OK)
        return KVT_OK;
    bool fresh = idx->npod_free == 0;
    if (fresh && idx->pod_hi >= KVT_IDX_MAX_PODS)
        return KVT_ERR_LIMIT;
    uint32_t cap = idx->pods_alloc;
    if (fresh && idx->pod_hi == cap)
        cap = cap ? cap * 2 : 16;
    size_t need =
        strlen(name) + 1 + nmap_grow_bytes(&idx->pod_map) +
        (cap != idx->pods_alloc ? (size_t)cap * (sizeof(kvt_pod_t) + sizeof(uint32_t)) : 0);
    if (!kvt_idx_room_admin(idx, need)) {
        idx->refused++;
        return KVT_ERR_NO_SPACE;
    }
    if (cap != idx->pods_alloc && kvt_idx_pods_resize(idx, cap) != KVT_OK)
        return KVT_ERR_NO_MEM;
    uint32_t id = fresh ? idx->pod_hi : idx->pod_free[idx->npod_free - 1];
    kvt_pod_t *p = &idx->pods[id];
    memset(p, 0, sizeof(*p)); /* an entry past pod_hi may be uninitialized */
    p->name = acct_strdup(idx, name, &p->name_bytes);
    if (p->name == NULL)
        return KVT_ERR_NO_MEM;
    p->dp_rank = dp_rank;
    p->last_write = idx->now_ms;
    if (nmap_add(idx, &idx->pod_map, name_hash(name, "", dp_rank), id) != KVT_OK) {
        kvt_idx_acct_free(idx, p->name, p->name_bytes);
        p->name = NULL;
        return KVT_ERR_NO_MEM;
    }
    if (fresh) {
        idx->pod_hi++;
        if (idx->pod_hi > idx->sh.pod_cap)
            __atomic_store_n(&idx->sh.pod_cap, idx->pod_hi, __ATOMIC_RELEASE);
    } else {
        idx->npod_free--;
    }
    idx->npods_live++;
    kvt_idx_names_changed(idx);
    *pod_p = id;
    return KVT_OK;
}

const char *kvt_idx_pod_name(const kvt_idx_t *idx, uint32_t pod, uint32_t *dp_rank_p)
{
    kvt_pod_t *p = pod_live((kvt_idx_t *)idx, pod);
    if (p == NULL)
        return NULL;
    if (dp_rank_p != NULL)
        *dp_rank_p = p->dp_rank;
    return p->name;
}

uint64_t kvt_idx_pod_entries(const kvt_idx_t *idx, uint32_t pod)
{
    kvt_pod_t *p = pod_live((kvt_idx_t *)idx, pod);
    return p ? p->entries : 0;
}

uint64_t kvt_idx_pod_last_write(const kvt_idx_t *idx, uint32_t pod)
{
    kvt_pod_t *p = pod_live((kvt_idx_t *)idx, pod);
    return p ? p->last_write : 0;
}

kvt_status_t kvt_idx_pod_key(const kvt_idx_t *cidx, uint32_t pod, uint32_t ns, uint64_t ehash,
                             uint64_t *key_p)
{
    kvt_idx_t *idx = (kvt_idx_t *)cidx;
    kvt_pod_t *p = pod_live(idx, pod);
    uint32_t slot;
    if (p == NULL || !ns_slot(idx, ns, &slot))
        return KVT_ERR_INVAL;
    uint32_t ps = ptab_find(idx, p, ehash, false);
    if (ps == KVT_NIL)
        return KVT_ERR_NOT_FOUND;
    kvt_node_t *n = N(idx, ref_node(idx, PREF(p, ps)));
    *key_p = n->key ^ idx->nsw[slot].salt;
    return KVT_OK;
}

kvt_status_t kvt_idx_pod_clear(kvt_idx_t *idx, uint32_t pod, unsigned tiers)
{
    kvt_pod_t *p = pod_live(idx, pod);
    if (p == NULL || (tiers & ~KVT_TIER_ALL) != 0)
        return KVT_ERR_INVAL;
    p->last_write = idx->now_ms;
    for (uint32_t i = 0; p->g != NULL && i < PSLOT(p->ngroups, 0); i++) {
        if ((i & 15u) >= KVT_GRP_SLOTS || p->g[i >> 4].ctrl[i & 15u] < 0x80u)
            continue;
        uint32_t ref = PREF(p, i);
        if ((ref & ALIAS_BIT) && (idx->alias[ref & ~ALIAS_BIT].flags & ALIAS_SPEC)) {
            if (tiers == KVT_TIER_ALL)
                kvt_idx_ref_drop(idx, pod, i);
        } else {
            kvt_idx_ref_clear_tiers(idx, pod, i, tiers);
        }
    }
    kvt_idx_ptab_maybe_shrink(idx, p);
    return KVT_OK;
}

kvt_status_t kvt_idx_pod_drop(kvt_idx_t *idx, uint32_t pod)
{
    kvt_pod_t *p = pod_live(idx, pod);
    if (p == NULL)
        return KVT_ERR_NOT_FOUND;
    kvt_idx_pod_clear(idx, pod, KVT_TIER_ALL);
    uint32_t slot = nmap_find(idx, &idx->pod_map, name_hash(p->name, "", p->dp_rank), pod_eq,
                              p->name, "", p->dp_rank);
    if (slot != KVT_NIL)
        nmap_del(idx, &idx->pod_map, slot);
    if (p->g != NULL)
        kvt_idx_acct_free(idx, p->g, ptab_bytes(p->ngroups));
    kvt_idx_acct_free(idx, p->name, p->name_bytes);
    memset(p, 0, sizeof(*p));
    idx->pod_free[idx->npod_free++] = pod;
    idx->npods_live--;
    kvt_idx_names_changed(idx);
    kvt_idx_pods_trim(idx);
    kvt_idx_trim(idx);
    return KVT_OK;
}
