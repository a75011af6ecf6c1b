/*
 * bench/progress: a progress bar on stderr when stderr is a terminal, a few
 * plain lines otherwise (at 25%, 50%, 75% and the end), so logs stay short.
 */
#ifndef KVT_BENCH_PROGRESS_H
#define KVT_BENCH_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct kvt_progress {
    FILE *out;
    bool tty; /* redraw one line in place */
    char label[48];
    uint64_t total;
    uint64_t start_ns;
    uint64_t last_ns; /* last redraw (tty) */
    unsigned quarter; /* plain lines printed so far (non-tty) */
} kvt_progress_t;

/*
 * Starts a bar named @label over @total steps on @out (NULL: stderr). @tty:
 * 1 draws a bar, 0 prints plain lines, -1 asks isatty(@out).
 */
void kvt_progress_start(kvt_progress_t *p, FILE *out, int tty, const char *label, uint64_t total);

/* @done steps of the total are done; redraws at most ten times a second. Cheap to call often. */
void kvt_progress_update(kvt_progress_t *p, uint64_t done);

/* Ends the bar: the last line shows the total and the elapsed time. */
void kvt_progress_end(kvt_progress_t *p);

#endif
