/*
 * bench/trace: loader for Mooncake-format request traces (WIRE-FORMATS.md).
 *
 * One JSON object per line:
 *   {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [..]}
 * Keys may come in any order; unknown keys are skipped whatever their value;
 * blank lines are skipped. The four keys above are required, each at most
 * once; their numbers must be non-negative integers (no sign, fraction or
 * exponent) that fit their field.
 */
#ifndef KVT_BENCH_TRACE_H
#define KVT_BENCH_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kvt_trace_req {
    uint64_t timestamp_ms;
    uint32_t input_length;    /* prompt tokens */
    uint32_t output_length;   /* generated tokens */
    uint32_t nblocks;         /* entries of hash_ids */
    const uint64_t *hash_ids; /* points into kvt_trace_t.ids */
} kvt_trace_req_t;

typedef struct kvt_trace {
    kvt_trace_req_t *reqs; /* in file order */
    size_t nreqs;
    uint64_t *ids; /* every request's hash ids, back to back */
    size_t nids;
    uint32_t max_blocks; /* largest nblocks */
} kvt_trace_t;

/*
 * Loads the trace at @path. On success *@t_p is owned by the caller, freed
 * with kvt_trace_free(). On error @err (when not NULL and @errlen > 0)
 * receives a one-line message, "line N: reason" for a malformed line.
 * Returns KVT_OK, KVT_ERR_INVAL (NULL arguments), KVT_ERR_IO (cannot read the
 * file), KVT_ERR_PARSE (malformed line, missing key, number out of range) or
 * KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_trace_load(const char *path, kvt_trace_t **t_p, char *err, size_t errlen);

/*
 * Parses trace text @buf[0..len) (same format and results as
 * kvt_trace_load(); used by it and by tests).
 */
kvt_status_t kvt_trace_parse(const char *buf, size_t len, kvt_trace_t **t_p, char *err,
                             size_t errlen);

/* Frees a trace. NULL is a no-op. */
void kvt_trace_free(kvt_trace_t *t);

#endif
