/* bench/trace: what the JSONL and CSV readers share (private to trace.c, trace_csv.c). */
#ifndef KVT_BENCH_TRACE_INT_H
#define KVT_BENCH_TRACE_INT_H

#include <stddef.h>

#include "bench/trace.h"
#include "common/status.h"

/* A cursor over one line of a trace file, bounded by the line's end. */
typedef struct kvt_trace_cur {
    const char *p;   /* next byte */
    const char *end; /* end of the line */
    size_t line;     /* 1-based */
    char *err;
    size_t errlen;
} kvt_trace_cur_t;

/* Writes "line N: <reason>" to @c's error buffer and returns -1. Error path only. */
__attribute__((format(printf, 2, 3))) int kvt_trace_fail(kvt_trace_cur_t *c, const char *fmt, ...);

typedef kvt_status_t (*kvt_trace_parse_fn)(const char *buf, size_t len, kvt_trace_t **t_p,
                                           char *err, size_t errlen);

/* Reads the file at @path whole and hands it to @parse (kvt_trace_load*()'s results). */
kvt_status_t kvt_trace_load_with(const char *path, kvt_trace_parse_fn parse, kvt_trace_t **t_p,
                                 char *err, size_t errlen);

#endif
