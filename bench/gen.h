/*
 * bench/gen: a seeded generator of request traces with prefix structure
 * (`kvtier-bench gen`), written as Mooncake-format JSONL that `kvtier-bench
 * replay`, vLLM's `bench serve --dataset-name timed_trace` and AIPerf's
 * mooncake_trace read.
 *
 * A trace is sessions of turns. Each turn's prompt re-sends its session's
 * whole context: the previous turn's prompt, that turn's output, and the new
 * text (a user message in a chat, a tool result in a tool-agent loop). A
 * session may open with one of a few shared system prompts (whole blocks),
 * and its first user message may open with a template its group shares
 * (prefix_share). Everything else is text of its own.
 *
 * Hash ids follow Mooncake's rule: id k at position i names the whole prefix
 * of blocks 0..i, so two requests share an id only where they share every
 * block before it. A prompt's last, partial block is text no other request
 * has, so it gets an id of its own. Ids are numbered from 0 in the order of
 * their first appearance in the (time-sorted) trace.
 *
 * Two sources of arrivals and lengths:
 * - synthetic: sessions start as a Poisson process (rate per second); turns
 *   follow after exponential think times; lengths are drawn uniformly within
 *   +-50% of their means;
 * - a trace without prefix structure (the Azure CSV, kvt_trace_load_csv()):
 *   its arrival times and lengths are kept exactly (input_length, and
 *   ceil(input_length / block_tokens) ids), and each row either starts a
 *   session or continues an open one whose context (previous prompt plus
 *   output) fits in the row's input_length. Tool loops are not generated
 *   there: the trace's lengths decide each turn.
 */
#ifndef KVT_BENCH_GEN_H
#define KVT_BENCH_GEN_H

#include <stdint.h>
#include <stdio.h>

#include "bench/trace.h"
#include "common/status.h"

typedef struct kvt_gen_config {
    uint64_t seed;         /* the only source of randomness; 0 is taken as 1 */
    uint32_t block_tokens; /* tokens per hash id (Mooncake: 512) */
    /* synthetic only */
    uint32_t sessions;      /* sessions to generate */
    double rate;            /* new sessions per second (Poisson arrivals) */
    uint32_t turns;         /* a chat session's turns ... */
    uint32_t turns_max;     /* ... or uniform in [turns, turns_max] when larger */
    uint32_t tool_turns;    /* a tool-agent loop's turns */
    uint32_t think_ms;      /* mean gap between a chat's turns (exponential, >= 1 ms) */
    uint32_t tool_think_ms; /* mean gap between a tool loop's turns */
    uint32_t first_tokens;  /* mean tokens of a session's first user message */
    uint32_t user_tokens;   /* mean tokens of a later user message */
    uint32_t tool_tokens;   /* mean tokens of a tool result */
    uint32_t output_tokens; /* mean output tokens */
    double tool_share;      /* share of sessions that are tool-agent loops */
    /* both sources */
    uint32_t system_prompts; /* distinct shared system prompts */
    uint32_t system_blocks;  /* blocks of each */
    double system_share;     /* share of sessions that open with one (uniformly chosen) */
    /*
     * Share of a first user message's whole blocks (after the system prompt)
     * that is a template common to the sessions of its group (those with the
     * same system prompt, or none): 0 keeps first messages apart.
     */
    double prefix_share;
    /* with arrivals: a session continues with probability 1 - 1/turns per row, and
     * at most turns_max turns (0: no limit), while it has idled less than idle_ms */
    uint32_t idle_ms;
} kvt_gen_config_t;

/* The defaults (`kvtier-bench gen --help` shows them). */
void kvt_gen_config_default(kvt_gen_config_t *cfg);

typedef struct kvt_gen {
    /* the requests sorted by timestamp; ids as above; reqs[i].session is
     * kvt_trace_session_id() of "s<N>", N its session's number */
    kvt_trace_t *trace;
    uint32_t *req_session; /* per request: its session's number, 1.. */
    uint32_t *req_turn;    /* per request: its turn in the session, 0.. */
    uint32_t nsessions;
    uint32_t *session_system; /* [N - 1]: session N's system prompt, 1..system_prompts; 0: none */
    uint8_t *session_tool;    /* [N - 1]: 1 when session N is a tool-agent loop */
    uint64_t distinct_blocks; /* ids 0..distinct_blocks-1 */
} kvt_gen_t;

/*
 * Generates a trace under @cfg: synthetic when @arrivals is NULL, otherwise
 * from @arrivals' timestamps and lengths (borrowed; its hash ids and sessions
 * are not read). On KVT_OK *@g_p is the caller's, freed with
 * kvt_gen_destroy(). KVT_ERR_INVAL with a one-line @err naming the option for
 * a bad configuration (or one whose prompts would outgrow 32 bits or
 * memory), KVT_ERR_NO_MEM. Deterministic: the same config and arrivals give
 * the same trace.
 */
kvt_status_t kvt_gen_create(const kvt_gen_config_t *cfg, const kvt_trace_t *arrivals,
                            kvt_gen_t **g_p, char *err, size_t errlen);

/*
 * Writes @g as Mooncake-format JSONL to @f, one request a line:
 *   {"timestamp": ms, "input_length": n, "output_length": m,
 *    "hash_ids": [...], "session_id": "s<N>"}
 * KVT_OK, or KVT_ERR_IO with @err set.
 */
kvt_status_t kvt_gen_write(const kvt_gen_t *g, FILE *f, char *err, size_t errlen);

/* Frees @g and its trace. NULL is a no-op. */
void kvt_gen_destroy(kvt_gen_t *g);

#endif
