/* bench/replay_plot: the replay's plots (replay_plot.h). */
#include "bench/replay_plot.h"

#include <stdlib.h>
#include <string.h>

#include "bench/plot.h"
#include "bench/progress.h"
#include "common/errtext.h"

/* Points a CDF keeps at most (evenly spaced ranks). */
#define REPLAY_CDF_POINTS 2000

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

uint64_t kvt_replay_distinct_blocks(const kvt_trace_t *t)
{
    if (t->nids == 0)
        return 0;
    uint64_t *v = malloc(t->nids * sizeof(*v));
    if (v == NULL)
        return UINT64_MAX;
    memcpy(v, t->ids, t->nids * sizeof(*v));
    qsort(v, t->nids, sizeof(*v), cmp_u64);
    uint64_t n = 1;
    for (size_t i = 1; i < t->nids; i++)
        n += v[i] != v[i - 1];
    free(v);
    return n;
}

int kvt_replay_plot_capacity(const char *dir, const kvt_trace_t *t, const kvt_sim_config_t *base,
                             const kvt_sim_policy_t *pol, size_t npol, const double *fracs,
                             size_t nf, char *err, size_t errlen)
{
    int rc = -1;
    uint64_t distinct = kvt_replay_distinct_blocks(t), ihit = 0, itotal = 0;
    double *x = calloc(nf ? nf : 1, sizeof(*x));
    double *y = calloc((npol + 2) * (nf ? nf : 1), sizeof(*y));
    kvt_plot_series_t *s = calloc(npol + 2, sizeof(*s));
    if (distinct == UINT64_MAX || x == NULL || y == NULL || s == NULL ||
        kvt_sim_ideal(t, &ihit, &itotal) != KVT_OK) {
        kvt_errf(err, errlen, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nf; i++)
        x[i] = 100.0 * fracs[i];
    kvt_progress_t prog;
    kvt_progress_start(&prog, NULL, -1, "capacity sweep", npol * nf);
    for (size_t k = 0; k < npol; k++) {
        for (size_t i = 0; i < nf; i++) {
            kvt_sim_config_t cfg = *base;
            kvt_sim_result_t r;
            cfg.policy = pol[k];
            cfg.capacity_blocks = (uint64_t)(fracs[i] * (double)distinct);
            if (cfg.capacity_blocks == 0)
                cfg.capacity_blocks = 1;
            char why[256] = "";
            if (kvt_sim_run(t, &cfg, &r, why, sizeof(why)) != KVT_OK) {
                kvt_errf(err, errlen, "%s: %s", kvt_sim_policy_name(pol[k]), why);
                goto out;
            }
            y[k * nf + i] = r.hit_ratio;
            kvt_sim_result_cleanup(&r);
            kvt_progress_update(&prog, k * nf + i + 1);
        }
        s[k] = (kvt_plot_series_t){kvt_sim_policy_name(pol[k]), nf, x, y + k * nf};
    }
    kvt_progress_end(&prog);
    for (size_t i = 0; i < nf; i++) {
        uint64_t cap = (uint64_t)(fracs[i] * (double)distinct), bhit = 0, btotal = 0;
        if (kvt_sim_belady(t, cap ? cap : 1, &bhit, &btotal) != KVT_OK) {
            kvt_errf(err, errlen, "out of memory");
            goto out;
        }
        y[npol * nf + i] = itotal ? (double)ihit / (double)itotal : 0.0;
        y[(npol + 1) * nf + i] = btotal ? (double)bhit / (double)btotal : 0.0;
    }
    s[npol] = (kvt_plot_series_t){"ideal (unbounded)", nf, x, y + npol * nf};
    s[npol + 1] = (kvt_plot_series_t){"Belady, one pod", nf, x, y + (npol + 1) * nf};
    kvt_plot_t p = {"hit-ratio-vs-capacity",
                    "Hit ratio against per-pod capacity",
                    "per-pod capacity (% of the trace's distinct blocks)",
                    "hit ratio (blocks)",
                    KVT_PLOT_LINES,
                    true};
    rc = kvt_plot_write(dir, &p, s, npol + 2, err, errlen);
out:
    free(x);
    free(y);
    free(s);
    return rc;
}

int kvt_replay_plot_load(const char *dir, const char *const *labels, const double *const *load,
                         size_t npol, uint32_t pods, const char *what, char *err, size_t errlen)
{
    double *x = calloc(pods ? pods : 1, sizeof(*x));
    kvt_plot_series_t *s = calloc(npol ? npol : 1, sizeof(*s));
    int rc = -1;
    if (x == NULL || s == NULL) {
        kvt_errf(err, errlen, "out of memory");
        goto out;
    }
    for (uint32_t p = 0; p < pods; p++)
        x[p] = p;
    for (size_t k = 0; k < npol; k++)
        s[k] = (kvt_plot_series_t){labels[k], pods, x, load[k]};
    kvt_plot_t pl = {"pod-load", "Load per pod", "pod", what, KVT_PLOT_BARS, false};
    rc = kvt_plot_write(dir, &pl, s, npol, err, errlen);
out:
    free(x);
    free(s);
    return rc;
}

int kvt_replay_plot_ttft(const char *dir, const char *const *labels, const double *const *ttft_ms,
                         const size_t *n, size_t npol, char *err, size_t errlen)
{
    int rc = -1;
    kvt_plot_series_t *s = calloc(npol ? npol : 1, sizeof(*s));
    double *buf = calloc(npol ? npol : 1, 2 * REPLAY_CDF_POINTS * sizeof(*buf));
    double *sorted = NULL;
    if (s == NULL || buf == NULL) {
        kvt_errf(err, errlen, "out of memory");
        goto out;
    }
    for (size_t k = 0; k < npol; k++) {
        double *x = buf + k * 2 * REPLAY_CDF_POINTS, *y = x + REPLAY_CDF_POINTS;
        size_t m = 0;
        if (n[k] > 0) {
            free(sorted);
            if ((sorted = malloc(n[k] * sizeof(*sorted))) == NULL) {
                kvt_errf(err, errlen, "out of memory");
                goto out;
            }
            memcpy(sorted, ttft_ms[k], n[k] * sizeof(*sorted));
            qsort(sorted, n[k], sizeof(*sorted), cmp_double);
            /* evenly spaced ranks, the last one always kept */
            size_t pts = n[k] < REPLAY_CDF_POINTS ? n[k] : REPLAY_CDF_POINTS;
            for (size_t j = 0; j < pts; j++) {
                size_t rank = pts == 1 ? n[k] - 1 : j * (n[k] - 1) / (pts - 1);
                x[m] = sorted[rank] > 0.01 ? sorted[rank] : 0.01; /* log axis */
                y[m++] = (double)(rank + 1) / (double)n[k];
            }
        }
        s[k] = (kvt_plot_series_t){labels[k], m, x, y};
    }
    kvt_plot_t p = {"ttft-cdf",     "Time to first token, CDF",
                    "TTFT (ms)",    "fraction of requests",
                    KVT_PLOT_STEPS, true};
    rc = kvt_plot_write(dir, &p, s, npol, err, errlen);
out:
    free(sorted);
    free(s);
    free(buf);
    return rc;
}
