/*
 * kvindex/names.c: the index's names as readers resolve them (index.h,
 * "Names for readers"). The writer builds an immutable snapshot of every pod
 * (name, DP rank, the name as a JSON string) and every namespace (model,
 * LoRA, block size), hashed by name, and publishes it when names changed;
 * readers look names up inside a read section, under the index's EBR, so a
 * query goes from the API down to the index and never up into the server.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common/json.h"
#include "kvindex/index_writer_int.h"

typedef struct nm_pod {
    uint32_t name_off, name_len; /* into text; 0, 0 for a free id */
    uint32_t json_off, json_len; /* the name as a quoted, escaped JSON string */
    uint32_t dp_rank;
    uint32_t live;
    uint32_t next; /* next pod id in the same bucket, or UINT32_MAX */
} nm_pod_t;

typedef struct nm_ns {
    uint32_t model_off, model_len, lora_off, lora_len; /* lora "" for the base model */
    uint32_t ns, block_size;
    uint32_t next; /* next entry in the same bucket, or UINT32_MAX */
} nm_ns_t;

struct kvt_names {
    size_t bytes;     /* of the whole block */
    uint32_t npods;   /* pod ids < npods */
    uint32_t nns;     /* live namespaces */
    uint32_t nbucket; /* power of two, for both tables */
    nm_pod_t *pods;
    nm_ns_t *nss;
    uint32_t *pod_bucket, *ns_bucket; /* first index with that hash, or UINT32_MAX */
    char *text;                       /* names; offset 0 is "" */
};

/* Bucket hash of (@a, @b): XXH3 of each, combined (buckets only: the names are compared). */
static uint32_t nm_hash(const char *a, size_t an, const char *b, size_t bn)
{
    uint64_t h = XXH3_64bits(a, an) ^ kvt_mix64(XXH3_64bits(b, bn) + 1);
    return (uint32_t)(h ^ (h >> 32));
}

void kvt_idx_names_changed(kvt_idx_t *idx)
{
    idx->names_gen++;
}

/* Builds the snapshot of what the index names now; NULL when out of memory. */
static kvt_names_t *nm_build(kvt_idx_t *idx)
{
    uint32_t npods = kvt_idx_pod_limit(idx), nslots = kvt_idx_ns_count(idx);
    kvt_jbuf_t js; /* pod names rendered once as JSON strings, for the HTTP answers */
    kvt_jbuf_init(&js);
    uint32_t *js_off = malloc(((size_t)npods + 1) * sizeof(uint32_t)); /* pod i's is [i, i+1) */
    size_t text = 1;
    for (uint32_t i = 0; i < npods && js_off != NULL; i++) {
        const char *n = kvt_idx_pod_name(idx, i, NULL);
        js_off[i] = (uint32_t)js.len;
        if (n != NULL) {
            text += strlen(n) + 1;
            kvt_jbuf_str(&js, n, strlen(n));
        }
    }
    if (js_off != NULL)
        js_off[npods] = (uint32_t)js.len;
    uint32_t nns = 0;
    for (uint32_t s = 0; s < nslots; s++) {
        const char *lora, *model = kvt_idx_ns_name(idx, kvt_idx_ns_id(idx, s), &lora);
        if (model != NULL) { /* NULL: a dropped namespace's free slot */
            text += strlen(model) + strlen(lora) + 2;
            nns++;
        }
    }
    uint32_t nb = 16;
    while (nb < 2u * (npods > nns ? npods : nns) && nb < (1u << 30))
        nb *= 2;
    size_t bytes = sizeof(kvt_names_t) + (size_t)npods * sizeof(nm_pod_t) +
                   (size_t)nns * sizeof(nm_ns_t) + 2 * (size_t)nb * sizeof(uint32_t) + text +
                   js.len;
    kvt_names_t *nm =
        js_off == NULL || js.oom || text + js.len > UINT32_MAX ? NULL : calloc(1, bytes);
    if (nm == NULL) {
        free(js_off);
        kvt_jbuf_cleanup(&js);
        return NULL;
    }
    nm->bytes = bytes;
    nm->npods = npods;
    nm->nns = nns;
    nm->nbucket = nb;
    nm->pods = (nm_pod_t *)(void *)(nm + 1);
    nm->nss = (nm_ns_t *)(void *)(nm->pods + npods);
    nm->pod_bucket = (uint32_t *)(void *)(nm->nss + nns);
    nm->ns_bucket = nm->pod_bucket + nb;
    nm->text = (char *)(nm->ns_bucket + nb);
    memset(nm->pod_bucket, 0xff, 2 * (size_t)nb * sizeof(uint32_t));
    size_t off = 1, jsbase = text;
    if (js.len > 0)
        memcpy(nm->text + jsbase, js.buf, js.len);
    for (uint32_t i = 0; i < npods; i++) {
        uint32_t rank = 0;
        const char *n = kvt_idx_pod_name(idx, i, &rank);
        nm->pods[i].next = UINT32_MAX;
        if (n == NULL)
            continue;
        size_t l = strlen(n);
        memcpy(nm->text + off, n, l + 1);
        nm->pods[i] = (nm_pod_t){(uint32_t)off,
                                 (uint32_t)l,
                                 (uint32_t)(jsbase + js_off[i]),
                                 js_off[i + 1] - js_off[i],
                                 rank,
                                 1,
                                 UINT32_MAX};
        off += l + 1;
        uint32_t b = nm_hash(n, l, NULL, 0) & (nb - 1);
        nm->pods[i].next = nm->pod_bucket[b];
        nm->pod_bucket[b] = i;
    }
    uint32_t j = 0;
    for (uint32_t s = 0; s < nslots; s++) {
        uint32_t id = kvt_idx_ns_id(idx, s);
        const char *lora, *model = kvt_idx_ns_name(idx, id, &lora);
        if (model == NULL)
            continue;
        size_t ml = strlen(model), ll = strlen(lora);
        nm_ns_t *e = &nm->nss[j];
        e->model_off = (uint32_t)off;
        e->model_len = (uint32_t)ml;
        memcpy(nm->text + off, model, ml + 1);
        off += ml + 1;
        e->lora_off = (uint32_t)off;
        e->lora_len = (uint32_t)ll;
        memcpy(nm->text + off, lora, ll + 1);
        off += ll + 1;
        e->ns = id;
        e->block_size = kvt_idx_ns_block_size(idx, id);
        uint32_t b = nm_hash(model, ml, lora, ll) & (nb - 1);
        e->next = nm->ns_bucket[b];
        nm->ns_bucket[b] = j++;
    }
    free(js_off);
    kvt_jbuf_cleanup(&js);
    return nm;
}

kvt_status_t kvt_idx_names_publish(kvt_idx_t *idx)
{
    if (idx->sh.names != NULL && idx->names_pub_gen == idx->names_gen)
        return KVT_OK;
    kvt_names_t *nm = nm_build(idx);
    if (nm == NULL)
        return KVT_ERR_NO_MEM; /* the old snapshot stays */
    kvt_names_t *old = idx->sh.names;
    __atomic_store_n(&idx->sh.names, nm, __ATOMIC_RELEASE);
    if (old != NULL)
        kvt_ebr_retire(&idx->sh.ebr, old, 0); /* not counted (index.h) */
    idx->names_pub_gen = idx->names_gen;
    return KVT_OK;
}

void kvt_idx_names_free(kvt_idx_t *idx)
{
    free(idx->sh.names);
    idx->sh.names = NULL;
}

/* ---- readers ------------------------------------------------------------------------ */

void kvt_idx_read_begin(kvt_idx_reader_t *r)
{
    kvt_idx_shared_t *sh = idx_shared(r->idx);
    kvt_ebr_enter(&sh->ebr, r->slot);
    r->pinned = true;
    r->names = __atomic_load_n(&sh->names, __ATOMIC_ACQUIRE);
}

void kvt_idx_read_end(kvt_idx_reader_t *r)
{
    r->names = NULL;
    r->pinned = false;
    kvt_ebr_exit(&(idx_shared(r->idx))->ebr, r->slot);
}

bool kvt_idx_ns_lookup(const kvt_idx_reader_t *r, const char *model, size_t mlen, const char *lora,
                       size_t llen, uint32_t *ns_p, uint32_t *block_size_p)
{
    const kvt_names_t *nm = r->names;
    if (nm == NULL)
        return false;
    uint32_t b = nm_hash(model, mlen, lora, llen) & (nm->nbucket - 1);
    for (uint32_t i = nm->ns_bucket[b]; i != UINT32_MAX; i = nm->nss[i].next) {
        const nm_ns_t *e = &nm->nss[i];
        if (e->model_len == mlen && e->lora_len == llen &&
            memcmp(nm->text + e->model_off, model, mlen) == 0 &&
            memcmp(nm->text + e->lora_off, lora, llen) == 0) {
            *ns_p = e->ns;
            *block_size_p = e->block_size;
            return true;
        }
    }
    return false;
}

size_t kvt_idx_pods_named(const kvt_idx_reader_t *r, const char *name, size_t len, uint32_t *out,
                          size_t cap)
{
    const kvt_names_t *nm = r->names;
    size_t n = 0;
    if (nm == NULL)
        return 0;
    uint32_t b = nm_hash(name, len, NULL, 0) & (nm->nbucket - 1);
    for (uint32_t id = nm->pod_bucket[b]; id != UINT32_MAX && n < cap; id = nm->pods[id].next) {
        const nm_pod_t *p = &nm->pods[id];
        if (p->name_len == len && memcmp(nm->text + p->name_off, name, len) == 0)
            out[n++] = id;
    }
    return n;
}

bool kvt_idx_pod_view(const kvt_idx_reader_t *r, uint32_t pod, kvt_idx_pod_view_t *v)
{
    const kvt_names_t *nm = r->names;
    if (nm == NULL || pod >= nm->npods || !nm->pods[pod].live)
        return false;
    const nm_pod_t *p = &nm->pods[pod];
    *v = (kvt_idx_pod_view_t){nm->text + p->name_off, p->name_len, nm->text + p->json_off,
                              p->json_len, p->dp_rank};
    return true;
}

uint32_t kvt_idx_names_pods(const kvt_idx_reader_t *r)
{
    return r->names != NULL ? r->names->npods : 0;
}
