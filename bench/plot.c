/* bench/plot: PNG plots through gnuplot (plot.h). */
#include "bench/plot.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errtext.h"

static bool plot_name_ok(const char *s)
{
    if (s == NULL || *s == '\0' || strlen(s) > 64)
        return false;
    for (; *s != '\0'; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_'))
            return false;
    return true;
}

/* @s as a gnuplot single-quoted string ('' stands for '), control bytes as '?'. */
static void plot_quote(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; s != NULL && *s != '\0'; s++) {
        if (*s == '\'')
            fputs("''", f);
        else
            fputc((unsigned char)*s < 0x20 ? '?' : *s, f);
    }
    fputc('\'', f);
}

static int plot_data(const char *path, const kvt_plot_t *plot, const kvt_plot_series_t *series,
                     size_t n)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    if (plot->kind == KVT_PLOT_BARS) {
        /* one row per x, one column per series */
        fputs("x", f);
        for (size_t s = 0; s < n; s++) {
            /* a data file's column header: double quotes, none inside */
            fputs("\t\"", f);
            for (const char *c = series[s].label; c != NULL && *c != '\0'; c++)
                fputc(*c == '"' || (unsigned char)*c < 0x20 ? '\'' : *c, f);
            fputc('"', f);
        }
        fputc('\n', f);
        for (size_t i = 0; i < series[0].n; i++) {
            fprintf(f, "%.10g", series[0].x[i]);
            for (size_t s = 0; s < n; s++)
                fprintf(f, "\t%.10g", series[s].y[i]);
            fputc('\n', f);
        }
    } else {
        /* one block per series, two blank lines apart (gnuplot's `index`) */
        for (size_t s = 0; s < n; s++) {
            fprintf(f, "# %s\n", series[s].label);
            for (size_t i = 0; i < series[s].n; i++)
                fprintf(f, "%.10g\t%.10g\n", series[s].x[i], series[s].y[i]);
            fputs("\n\n", f);
        }
    }
    int bad = ferror(f);
    return fclose(f) == 0 && !bad ? 0 : -1;
}

/* Twelve distinguishable colours (gnuplot's own cycle repeats after eight). */
static const char *const plot_colors[] = {
    "#9400d3", "#009e73", "#56b4e9", "#e69f00", "#c8b400", "#0072b2",
    "#e51e10", "#000000", "#808080", "#a0522d", "#ff69b4", "#2e8b57",
};

static int plot_script(const char *path, const char *dat, const char *png, const kvt_plot_t *plot,
                       const kvt_plot_series_t *series, size_t n)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fputs("set terminal pngcairo size 900,560 noenhanced\nset output ", f);
    plot_quote(f, png);
    fputs("\nset title ", f);
    plot_quote(f, plot->title);
    fputs("\nset xlabel ", f);
    plot_quote(f, plot->xlabel);
    fputs("\nset ylabel ", f);
    plot_quote(f, plot->ylabel);
    fputs("\nset grid\nset key outside right\n", f);
    size_t ncolors = sizeof(plot_colors) / sizeof(plot_colors[0]);
    for (size_t i = 0; i < ncolors; i++)
        fprintf(f, "set linetype %zu lc rgb '%s'\n", i + 1, plot_colors[i]);
    fprintf(f, "set linetype cycle %zu\n", ncolors);
    if (plot->logx)
        fputs("set logscale x\n", f);
    if (plot->kind == KVT_PLOT_BARS) {
        fputs("set style data histograms\nset style histogram clustered gap 1\n"
              "set style fill solid 0.8 border -1\nset boxwidth 0.9\nset yrange [0:*]\n",
              f);
        fprintf(f, "plot for [i=2:%zu] ", n + 1);
        plot_quote(f, dat);
        fputs(" using i:xtic(1) title columnheader(i)\n", f);
    } else {
        const char *with = plot->kind == KVT_PLOT_STEPS ? "steps" : "linespoints";
        fputs("plot ", f);
        for (size_t s = 0; s < n; s++) {
            if (s > 0)
                fputs(", \\\n     ", f);
            plot_quote(f, dat);
            fprintf(f, " index %zu using 1:2 with %s lw 2 title ", s, with);
            plot_quote(f, series[s].label);
        }
        fputc('\n', f);
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* Runs gnuplot on @script; 0 when it exits 0. */
static int plot_run(const char *script, char *err, size_t errlen)
{
    const char *gp = getenv("KVT_GNUPLOT");
    if (gp == NULL || *gp == '\0')
        gp = "gnuplot";
    pid_t pid = fork();
    if (pid < 0) {
        kvt_errf(err, errlen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        execlp(gp, gp, script, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            kvt_errf(err, errlen, "waitpid: %s", strerror(errno));
            return -1;
        }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        kvt_errf(err, errlen, "%s not found (Debian: apt-get install gnuplot-nox)", gp);
        return -1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        kvt_errf(err, errlen, "%s %s failed", gp, script);
        return -1;
    }
    return 0;
}

int kvt_plot_write(const char *dir, const kvt_plot_t *plot, const kvt_plot_series_t *series,
                   size_t n, char *err, size_t errlen)
{
    if (dir == NULL || *dir == '\0' || plot == NULL || !plot_name_ok(plot->name) ||
        series == NULL || n == 0) {
        kvt_errf(err, errlen, "plot: bad arguments");
        return -1;
    }
    for (size_t s = 0; s < n; s++)
        if (plot->kind == KVT_PLOT_BARS && series[s].n != series[0].n) {
            kvt_errf(err, errlen, "plot %s: bar series of different lengths", plot->name);
            return -1;
        }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        kvt_errf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    char dat[4096], gp[4096], png[4096];
    if ((size_t)snprintf(dat, sizeof(dat), "%s/%s.dat", dir, plot->name) >= sizeof(dat) ||
        (size_t)snprintf(gp, sizeof(gp), "%s/%s.gp", dir, plot->name) >= sizeof(gp) ||
        (size_t)snprintf(png, sizeof(png), "%s/%s.png", dir, plot->name) >= sizeof(png)) {
        kvt_errf(err, errlen, "%s: path too long", dir);
        return -1;
    }
    if (plot_data(dat, plot, series, n) != 0) {
        kvt_errf(err, errlen, "%s: %s", dat, strerror(errno));
        return -1;
    }
    if (plot_script(gp, dat, png, plot, series, n) != 0) {
        kvt_errf(err, errlen, "%s: %s", gp, strerror(errno));
        return -1;
    }
    return plot_run(gp, err, errlen);
}
