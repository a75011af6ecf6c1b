/*
 * server/registry.c: the pod and namespace registry workers resolve names
 * through: an immutable snapshot the writer builds from the index when names
 * change, read under the server's EBR (registry.h).
 */
#define KVT_LOG_COMPONENT "srv"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/registry.h"

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* Writer. Builds and publishes a snapshot of pods and namespaces. */
void srv_reg_publish(kvt_srv_t *srv)
{
    uint32_t npods = kvt_idx_pod_limit(srv->idx), nns = kvt_idx_ns_count(srv->idx);
    size_t names = 1;
    /* pod names rendered once as JSON strings, for the HTTP answers */
    kvt_jbuf_t js;
    kvt_jbuf_init(&js);
    uint32_t *js_off = malloc((npods + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < npods && js_off != NULL; i++) {
        const char *n = kvt_idx_pod_name(srv->idx, i, NULL);
        js_off[i] = (uint32_t)js.len;
        if (n != NULL) {
            names += strlen(n) + 1;
            kvt_jbuf_str(&js, n, strlen(n));
        }
    }
    if (js_off == NULL || js.oom || js.len > UINT32_MAX / 2) {
        kvt_log_warn("registry snapshot: out of memory; keeping the old one");
        free(js_off);
        kvt_jbuf_cleanup(&js);
        return;
    }
    js_off[npods] = (uint32_t)js.len;
    names += js.len;
    for (uint32_t i = 0; i < nns; i++) {
        const char *lora, *model = kvt_idx_ns_name(srv->idx, kvt_idx_ns_id(srv->idx, i), &lora);
        if (model != NULL) /* NULL: a dropped namespace's free slot */
            names += strlen(model) + strlen(lora) + 2;
    }
    uint32_t nb = 16;
    while (nb < npods * 2u)
        nb *= 2;
    size_t bytes = sizeof(kvt_srv_reg_t) + npods * sizeof(reg_pod_t) + nns * sizeof(reg_ns_t) +
                   nb * sizeof(uint32_t) + names;
    kvt_srv_reg_t *r = calloc(1, bytes);
    if (r == NULL) {
        kvt_log_warn("registry snapshot: out of memory; keeping the old one");
        free(js_off);
        kvt_jbuf_cleanup(&js);
        return;
    }
    r->bytes = bytes;
    r->npods = npods;
    r->nns = nns;
    r->nbucket = nb;
    r->pods = (reg_pod_t *)(void *)(r + 1);
    r->nss = (reg_ns_t *)(void *)(r->pods + npods);
    r->bucket = (uint32_t *)(void *)(r->nss + nns);
    r->names = (char *)(r->bucket + nb);
    memset(r->bucket, 0xff, nb * sizeof(uint32_t));
    size_t off = 1;
    if (js.len > 0)
        memcpy(r->names + off, js.buf, js.len);
    size_t js_base = off;
    off += js.len;
    for (uint32_t i = 0; i < npods; i++) {
        uint32_t rank = 0;
        const char *n = kvt_idx_pod_name(srv->idx, i, &rank);
        r->pods[i].next = UINT32_MAX;
        if (n == NULL)
            continue;
        size_t l = strlen(n);
        memcpy(r->names + off, n, l + 1);
        r->pods[i] = (reg_pod_t){(uint32_t)off,
                                 (uint32_t)l,
                                 (uint32_t)(js_base + js_off[i]),
                                 js_off[i + 1] - js_off[i],
                                 rank,
                                 1,
                                 UINT32_MAX};
        off += l + 1;
        uint32_t b = (uint32_t)name_hash(n, l) & (nb - 1);
        r->pods[i].next = r->bucket[b];
        r->bucket[b] = i;
    }
    uint32_t j = 0;
    for (uint32_t i = 0; i < nns; i++) {
        uint32_t id = kvt_idx_ns_id(srv->idx, i);
        const char *lora, *model = kvt_idx_ns_name(srv->idx, id, &lora);
        if (model == NULL)
            continue;
        size_t ml = strlen(model), ll = strlen(lora);
        r->nss[j].model_off = (uint32_t)off;
        memcpy(r->names + off, model, ml + 1);
        off += ml + 1;
        r->nss[j].lora_off = (uint32_t)off;
        memcpy(r->names + off, lora, ll + 1);
        off += ll + 1;
        r->nss[j].ns = id;
        r->nss[j].block_size = kvt_idx_ns_block_size(srv->idx, id);
        j++;
    }
    r->nns = j;
    srv->reg_pods = kvt_idx_pod_limit(srv->idx);
    srv->reg_nns = j; /* live namespaces, as kvt_idx_stats_t.namespaces counts them */
    srv->reg_live_pods = 0;
    for (uint32_t i = 0; i < npods; i++)
        srv->reg_live_pods += r->pods[i].live;
    free(js_off);
    kvt_jbuf_cleanup(&js);
    kvt_srv_reg_t *old = srv->reg;
    __atomic_store_n(&srv->reg, r, __ATOMIC_RELEASE);
    if (old != NULL)
        kvt_ebr_retire(&srv->ebr, old, old->bytes);
}

kvt_srv_reg_t *srv_reg_enter(kvt_srv_worker_t *w)
{
    kvt_ebr_enter(&w->srv->ebr, w->ebr_slot);
    return __atomic_load_n(&w->srv->reg, __ATOMIC_ACQUIRE);
}

void srv_reg_exit(kvt_srv_worker_t *w)
{
    kvt_ebr_exit(&w->srv->ebr, w->ebr_slot);
}

const reg_ns_t *srv_reg_ns(const kvt_srv_reg_t *r, const char *model, size_t mlen, const char *lora,
                           size_t llen)
{
    for (uint32_t i = 0; i < r->nns; i++) {
        const char *m = r->names + r->nss[i].model_off, *l = r->names + r->nss[i].lora_off;
        if (strlen(m) == mlen && memcmp(m, model, mlen) == 0 && strlen(l) == llen &&
            memcmp(l, lora, llen) == 0)
            return &r->nss[i];
    }
    return NULL;
}

size_t srv_reg_pods_named(const kvt_srv_reg_t *r, const char *name, size_t len, uint32_t *out,
                          size_t cap)
{
    size_t n = 0;
    uint32_t b = (uint32_t)name_hash(name, len) & (r->nbucket - 1);
    for (uint32_t id = r->bucket[b]; id != UINT32_MAX && n < cap; id = r->pods[id].next) {
        const char *s = r->names + r->pods[id].name_off;
        if (r->pods[id].name_len == len && memcmp(s, name, len) == 0)
            out[n++] = id;
    }
    return n;
}

/* ---- writer ---------------------------------------------------------------- */
