/*
 * router-plugin/client_fanout.c: one query to several sidecars at once, their
 * answers merged per pod (client.h, kvt_client_fanout_query()).
 */
#include "kvtier/client.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "router-plugin/client_int.h"

/* ---- fan-out -------------------------------------------------------------------------------- */

typedef struct cl_fan_slot {
    kvt_client_t *c;
    uint64_t id;
    kvt_status_t st; /* KVT_OK once answered; 1 while waiting */
    kvt_client_result_t res;
} cl_fan_slot_t;

static void cl_fan_cb(void *arg, uint64_t req_id, kvt_status_t st, const kvt_client_result_t *res)
{
    cl_fan_slot_t *s = arg;
    if (req_id != s->id || s->st != (kvt_status_t)1)
        return;
    if (st == KVT_OK) {
        s->res = *res;
        s->res.pods = NULL;
        if (res->npods > 0) {
            s->res.pods = malloc(res->npods * sizeof(*res->pods));
            if (s->res.pods == NULL) {
                s->st = kvt_cl_fail(s->c, KVT_ERR_NO_MEM, "out of memory for %zu pods", res->npods);
                return;
            }
            memcpy(s->res.pods, res->pods, res->npods * sizeof(*res->pods));
        }
    }
    s->st = st;
}

static int cl_pod_cmp_name(const void *a, const void *b)
{
    const kvt_client_pod_t *x = a, *y = b;
    int r = strcmp(x->pod, y->pod);
    if (r != 0)
        return r;
    return x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
}

/* Better first: higher score, more matched, then name and rank for a stable order. */
static int cl_pod_cmp_rank(const void *a, const void *b)
{
    const kvt_client_pod_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->matched != y->matched)
        return x->matched > y->matched ? -1 : 1;
    return cl_pod_cmp_name(a, b);
}

static bool cl_pod_better(const kvt_client_pod_t *x, const kvt_client_pod_t *y)
{
    return x->score > y->score || (x->score == y->score && x->matched > y->matched);
}

static kvt_status_t cl_fanout(kvt_client_t *const *cs, size_t n, const cl_q_t *q, int timeout_ms,
                              kvt_client_result_t *res_p)
{
    const kvt_status_t waiting = (kvt_status_t)1;
    if (cs == NULL || n == 0 || res_p == NULL)
        return KVT_ERR_INVAL;
    cl_fan_slot_t *slots = calloc(n, sizeof(*slots));
    struct pollfd *pfd = calloc(n, sizeof(*pfd));
    if (slots == NULL || pfd == NULL) {
        free(slots);
        free(pfd);
        return KVT_ERR_NO_MEM;
    }
    if (timeout_ms <= 0)
        for (size_t i = 0; i < n; i++)
            if (cs[i] != NULL && cs[i]->io_ms > timeout_ms)
                timeout_ms = cs[i]->io_ms;
    uint64_t deadline = kvt_clock_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);

    for (size_t i = 0; i < n; i++) {
        slots[i].c = cs[i];
        if (cs[i] == NULL) {
            slots[i].st = KVT_ERR_INVAL;
        } else if (cs[i]->nfl > 0) {
            slots[i].st = kvt_cl_fail(cs[i], KVT_ERR_INVAL,
                                      "fan-out: %zu queries already in flight", cs[i]->nfl);
        } else {
            slots[i].st = kvt_cl_submit(cs[i], q, deadline, &slots[i].id);
            if (slots[i].st == KVT_OK)
                slots[i].st = waiting;
        }
    }
    for (;;) {
        nfds_t np = 0;
        for (size_t i = 0; i < n; i++) {
            if (slots[i].st != waiting)
                continue;
            kvt_client_t *c = slots[i].c;
            /* An answer may already sit in the buffer; progress() picks it up. */
            pfd[np].fd = c->fd;
            pfd[np].events = (short)(POLLIN | (kvt_client_want_write(c) ? POLLOUT : 0));
            pfd[np].revents = 0;
            np++;
        }
        if (np == 0)
            break;
        int left = kvt_cl_left(deadline);
        if (left == 0)
            break;
        int r = poll(pfd, np, left);
        if (r < 0 && errno != EINTR)
            break;
        nfds_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (slots[i].st != waiting)
                continue;
            if (pfd[k++].revents == 0)
                continue;
            kvt_status_t st = kvt_client_progress(slots[i].c, cl_fan_cb, &slots[i]);
            if (st != KVT_OK && slots[i].st == waiting)
                slots[i].st = st;
        }
    }

    /* Merge; close connections that still wait (their answers would be stale). */
    size_t total = 0, answered = 0, first = n;
    kvt_status_t first_err = KVT_OK;
    for (size_t i = 0; i < n; i++) {
        if (slots[i].st == waiting) {
            kvt_client_t *c = slots[i].c;
            kvt_cl_fail(c, KVT_ERR_TIMEOUT, "fan-out: no answer within %d ms", timeout_ms);
            c->nfl = 0;
            kvt_cl_close(c);
            slots[i].st = KVT_ERR_TIMEOUT;
        }
        if (slots[i].st == KVT_OK) {
            answered++;
            total += slots[i].res.npods;
            if (first == n)
                first = i;
        } else if (first_err == KVT_OK) {
            first_err = slots[i].st;
        }
    }
    kvt_status_t st = KVT_OK;
    kvt_client_pod_t *all = NULL;
    if (answered == 0) {
        st = first_err != KVT_OK ? first_err : KVT_ERR_PEER;
        goto out;
    }
    if (total > 0) {
        all = malloc(total * sizeof(*all));
        if (all == NULL) {
            st = KVT_ERR_NO_MEM;
            goto out;
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (slots[i].st == KVT_OK && slots[i].res.npods > 0) {
            memcpy(all + m, slots[i].res.pods, slots[i].res.npods * sizeof(*all));
            m += slots[i].res.npods;
        }
    size_t u = 0;
    if (m > 0) {
        qsort(all, m, sizeof(*all), cl_pod_cmp_name);
        for (size_t i = 0; i < m; i++) {
            if (u > 0 && cl_pod_cmp_name(&all[u - 1], &all[i]) == 0) {
                if (cl_pod_better(&all[i], &all[u - 1]))
                    all[u - 1] = all[i];
                continue;
            }
            all[u++] = all[i];
        }
        qsort(all, u, sizeof(*all), cl_pod_cmp_rank);
    }
    res_p->block_size = slots[first].res.block_size;
    res_p->num_blocks = slots[first].res.num_blocks;
    res_p->npods = u;
    res_p->pods = u > 0 ? all : NULL;
    if (u == 0)
        free(all);
    res_p->answered = answered;
    res_p->asked = n;
out:
    for (size_t i = 0; i < n; i++)
        free(slots[i].res.pods);
    free(slots);
    free(pfd);
    return st;
}

kvt_status_t kvt_client_fanout_query(kvt_client_t *const *cs, size_t n, const char *model,
                                     const char *lora, const uint32_t *tokens, size_t ntokens,
                                     const char *const *pods, size_t npods, int timeout_ms,
                                     kvt_client_result_t *res_p)
{
    return kvt_client_fanout_query_salted(cs, n, model, lora, NULL, tokens, ntokens, pods, npods,
                                          timeout_ms, res_p);
}

kvt_status_t kvt_client_fanout_query_salted(kvt_client_t *const *cs, size_t n, const char *model,
                                            const char *lora, const char *cache_salt,
                                            const uint32_t *tokens, size_t ntokens,
                                            const char *const *pods, size_t npods, int timeout_ms,
                                            kvt_client_result_t *res_p)
{
    cl_q_t q = {model, lora, cache_salt, KVT_PROTO_Q_TOKENS, tokens, ntokens, pods, npods};
    return cl_fanout(cs, n, &q, timeout_ms, res_p);
}

kvt_status_t kvt_client_fanout_query_keys(kvt_client_t *const *cs, size_t n, const char *model,
                                          const char *lora, const uint64_t *keys, size_t nkeys,
                                          const char *const *pods, size_t npods, int timeout_ms,
                                          kvt_client_result_t *res_p)
{
    cl_q_t q = {model, lora, NULL, KVT_PROTO_Q_KEYS, keys, nkeys, pods, npods};
    return cl_fanout(cs, n, &q, timeout_ms, res_p);
}
