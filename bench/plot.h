/*
 * bench/plot: PNG plots through gnuplot (`kvtier-bench replay --out DIR`).
 * Each plot leaves three files in DIR: NAME.dat (the numbers, one block per
 * series), NAME.gp (the gnuplot script, to re-plot by hand) and NAME.png.
 */
#ifndef KVT_BENCH_PLOT_H
#define KVT_BENCH_PLOT_H

#include <stdbool.h>
#include <stddef.h>

typedef enum kvt_plot_kind {
    KVT_PLOT_LINES, /* a line with points per series */
    KVT_PLOT_STEPS, /* a step line per series (a CDF) */
    KVT_PLOT_BARS,  /* clustered bars: every series has the same x values, one bar group each */
} kvt_plot_kind_t;

typedef struct kvt_plot_series {
    const char *label;
    size_t n;
    const double *x, *y;
} kvt_plot_series_t;

typedef struct kvt_plot {
    const char *name; /* file stem: letters, digits, '-', '_' */
    const char *title, *xlabel, *ylabel;
    kvt_plot_kind_t kind;
    bool logx;
} kvt_plot_t;

/*
 * Writes @plot's files in directory @dir (created if absent, one level) from
 * @series[0..n) and runs gnuplot on the script (the `gnuplot` on PATH, or
 * $KVT_GNUPLOT). Returns 0, or -1 with one line in @err (bad name, a file
 * that cannot be written, gnuplot missing or failing).
 */
int kvt_plot_write(const char *dir, const kvt_plot_t *plot, const kvt_plot_series_t *series,
                   size_t n, char *err, size_t errlen);

#endif
