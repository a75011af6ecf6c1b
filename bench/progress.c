/* bench/progress: a terminal progress bar or plain lines (progress.h). */
#include "bench/progress.h"

#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"

#define PROGRESS_WIDTH 30
#define PROGRESS_REDRAW_NS 100000000ull /* 0.1 s */

void kvt_progress_start(kvt_progress_t *p, FILE *out, int tty, const char *label, uint64_t total)
{
    memset(p, 0, sizeof(*p));
    p->out = out != NULL ? out : stderr;
    p->tty = tty < 0 ? isatty(fileno(p->out)) == 1 : tty != 0;
    snprintf(p->label, sizeof(p->label), "%s", label);
    p->total = total;
    p->start_ns = kvt_clock_ns();
}

static void progress_draw(kvt_progress_t *p, uint64_t done, uint64_t now)
{
    uint64_t total = p->total ? p->total : 1;
    if (done > total)
        done = total;
    double frac = (double)done / (double)total;
    double secs = (double)(now - p->start_ns) / 1e9;
    if (p->tty) {
        char bar[PROGRESS_WIDTH + 1];
        unsigned fill = (unsigned)(frac * PROGRESS_WIDTH);
        memset(bar, '#', fill);
        memset(bar + fill, '.', PROGRESS_WIDTH - fill);
        bar[PROGRESS_WIDTH] = '\0';
        fprintf(p->out, "\r%-14s [%s] %5.1f%% %" PRIu64 "/%" PRIu64 " %.1fs", p->label, bar,
                100.0 * frac, done, p->total, secs);
    } else {
        fprintf(p->out, "%s: %3.0f%% %" PRIu64 "/%" PRIu64 " %.1fs\n", p->label, 100.0 * frac, done,
                p->total, secs);
    }
    fflush(p->out);
}

void kvt_progress_update(kvt_progress_t *p, uint64_t done)
{
    if (p->tty) {
        uint64_t now = kvt_clock_ns();
        if (now - p->last_ns < PROGRESS_REDRAW_NS)
            return;
        p->last_ns = now;
        progress_draw(p, done, now);
        return;
    }
    /* plain lines at each quarter passed, the last one by kvt_progress_end() */
    uint64_t total = p->total ? p->total : 1;
    unsigned q = (unsigned)(done * 4 / total);
    if (q > p->quarter && q < 4) {
        p->quarter = q;
        progress_draw(p, done, kvt_clock_ns());
    }
}

void kvt_progress_end(kvt_progress_t *p)
{
    progress_draw(p, p->total, kvt_clock_ns());
    if (p->tty)
        fputc('\n', p->out);
    fflush(p->out);
}
