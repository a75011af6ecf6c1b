/*
 * bench/bench_index_int.h: what the files of `kvtier-bench index` share
 * (bench_index.c: the trace replay; bench_index_scale.c: the scale run;
 * bench_index_gen.c: the scale run's generated workload).
 */
#ifndef KVT_BENCH_BENCH_INDEX_INT_H
#define KVT_BENCH_BENCH_INDEX_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* `kvtier-bench index --scale ...` (bench_index_scale.c): argv as kvt_bench_index_main() got it. */
int kvt_bench_index_scale_main(int argc, char **argv);

/* kvt_bench_arg_t parser for a byte count, suffix K/M/G (binary) allowed, at least 1. */
int kvt_bench_index_size_arg(const char *opt, const char *val, void *dst);

/* ---- the scale run's workload (bench_index_gen.c) ---- */

#define KVT_SGEN_PROMPT_MIN 4u /* blocks of a system prompt: 4..24 */
#define KVT_SGEN_PROMPT_MAX 24u
#define KVT_SGEN_TURNS_MAX 8u /* turns of a session: 1..8 */
#define KVT_SGEN_NEW_MIN 2u   /* new blocks a turn adds (user message, answer): 2..8 */
#define KVT_SGEN_NEW_MAX 8u
/* Longest store event: a whole context (prompt and every turn) on a pod that holds none of it. */
#define KVT_SGEN_EVENT_MAX (KVT_SGEN_PROMPT_MAX + KVT_SGEN_TURNS_MAX * KVT_SGEN_NEW_MAX)

typedef struct kvt_sgen_config {
    uint64_t seed;
    uint32_t pods;     /* pod indices 0 .. pods - 1 */
    uint32_t prompts;  /* system prompts, Zipf(1) popularity */
    uint32_t active;   /* sessions in progress at once, interleaved */
    uint32_t move_pct; /* percent of later turns that go to the session's next pod */
} kvt_sgen_config_t;

/* One BlockStored event: @n blocks @keys stored on pod index @pod, the first extending
 * @parent when @has_parent. */
typedef struct kvt_sgen_event {
    uint32_t pod;
    uint32_t n;
    bool has_parent;
    uint64_t parent;
    uint64_t keys[KVT_SGEN_EVENT_MAX];
} kvt_sgen_event_t;

typedef struct kvt_sgen kvt_sgen_t;

/*
 * Creates the workload; NULL when out of memory. Deterministic from @cfg:
 * two generators of the same config give the same events and queries.
 */
kvt_sgen_t *kvt_sgen_create(const kvt_sgen_config_t *cfg);
void kvt_sgen_destroy(kvt_sgen_t *g);

/*
 * The next event: a turn of one of the active sessions. Every (block, pod)
 * pair it stores is new to the index (a pod gets a prompt once; a session's
 * pods are distinct), so the counters below are what the index must hold.
 */
void kvt_sgen_next(kvt_sgen_t *g, kvt_sgen_event_t *ev);

/* (block, pod) entries and distinct blocks the events so far stored; sessions started. */
uint64_t kvt_sgen_entries(const kvt_sgen_t *g);
uint64_t kvt_sgen_blocks(const kvt_sgen_t *g);
uint64_t kvt_sgen_sessions(const kvt_sgen_t *g);

/* What kvt_sgen_query() draws. */
typedef enum kvt_sgen_qkind {
    /* a router's query: the next request of an active session (its context and the new
     * blocks of its next turn) or, one time in five, a new session's (a prompt, new blocks) */
    KVT_SGEN_Q_REQUEST,
    /* an active session's own blocks, without its prompt (then its next turn's): a chain one
     * or two pods hold, so the time is the tables', not the answer's width */
    KVT_SGEN_Q_CHAIN,
} kvt_sgen_qkind_t;

/*
 * A query of kind @kind, drawn with the caller's generator state *@rng (not
 * the events' stream, so queries never change what is stored), cut to @max
 * blocks and lengthened with new blocks to @min. Writes @out (capacity
 * @max), returns the length.
 */
size_t kvt_sgen_query(const kvt_sgen_t *g, kvt_sgen_qkind_t kind, uint64_t *rng, uint64_t *out,
                      size_t min, size_t max);

/* The engine's hash for @key (what vLLM would send; the same on every pod). */
uint64_t kvt_sgen_ehash(uint64_t key);

#endif
