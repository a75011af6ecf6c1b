/*
 * bench/trace: loaders for request traces: Mooncake-format JSONL
 * (WIRE-FORMATS.md) and the Azure LLM inference CSV.
 *
 * Mooncake JSONL, one JSON object per line:
 *   {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [..],
 *    "session_id": "abc"}
 * Keys may come in any order; unknown keys are skipped whatever their value;
 * blank lines are skipped. The first four keys are required, each at most
 * once; their numbers must be non-negative integers (no sign, fraction or
 * exponent) that fit their field.
 *
 * "session_id" is optional, at most once: a string (AIPerf's mooncake_trace
 * form), a non-negative integer, or null. Its id is
 * kvt_trace_session_id() of the string, or of the integer's decimal digits
 * (so 7 and "7" are one session); null and "" mean none (AIPerf gives each
 * such line a session of its own). vLLM's timed_trace reads no session key.
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
    uint64_t session;         /* kvt_trace_session_id() of "session_id"; 0: none */
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

/*
 * The Azure LLM inference trace CSV (AzurePublicDataset, 2023):
 *   TIMESTAMP,ContextTokens,GeneratedTokens
 *   2023-11-16 18:17:03.9799600,4808,10
 * The header line must be exactly that (a UTF-8 byte order mark and CR line
 * ends are accepted); blank lines are skipped. A row's timestamp is
 * "YYYY-MM-DD HH:MM:SS" with an optional fraction of up to 9 digits; its
 * timestamp_ms is the milliseconds since the first row's (rounded down; an
 * earlier row is an error). ContextTokens is input_length, GeneratedTokens
 * output_length; no row has hash ids or a session (nblocks 0, hash_ids NULL,
 * session 0): bench/gen.h gives them prefix structure.
 * Results as kvt_trace_load(); a malformed row's error is "line N: reason".
 */
kvt_status_t kvt_trace_load_csv(const char *path, kvt_trace_t **t_p, char *err, size_t errlen);

/* Parses CSV text @buf[0..len) (same format and results as kvt_trace_load_csv()). */
kvt_status_t kvt_trace_parse_csv(const char *buf, size_t len, kvt_trace_t **t_p, char *err,
                                 size_t errlen);

/*
 * The session id of session name @s[0..len) (its bytes, UTF-8 for a JSON
 * string): 0 for an empty name, otherwise a nonzero 64-bit hash (FNV-1a,
 * then splitmix64's finalizer); equal names give equal ids.
 */
uint64_t kvt_trace_session_id(const char *s, size_t len);

/* Frees a trace. NULL is a no-op. */
void kvt_trace_free(kvt_trace_t *t);

#endif
