/*
 * bench/sim_model: the engine's time model of the timed and live replay modes
 * (issue 18): what a prefill and a decode step cost. The defaults and where
 * they come from are in docs/benchmarks.md ("The timed model").
 */
#ifndef KVT_BENCH_SIM_MODEL_H
#define KVT_BENCH_SIM_MODEL_H

#include <stdint.h>

typedef struct kvt_sim_model {
    uint32_t block_tokens;       /* tokens per trace block (Mooncake: 512) */
    double prefill_us_per_token; /* computing one uncached prompt token */
    double cpu_us_per_token;     /* loading one cached token from the host-RAM tier */
    double disk_us_per_token;    /* loading one cached token from the NVMe tier */
    double decode_us_per_token;  /* one output token of one request (time per output token) */
    uint32_t batch_tokens;       /* prompt tokens one prefill batch holds at most */
} kvt_sim_model_t;

/* Fills @m with the defaults (see docs/benchmarks.md). */
static inline void kvt_sim_model_default(kvt_sim_model_t *m)
{
    m->block_tokens = 512;
    m->prefill_us_per_token = 60.0;
    m->cpu_us_per_token = 5.0;
    m->disk_us_per_token = 25.0;
    m->decode_us_per_token = 20000.0;
    m->batch_tokens = 8192;
}

/* Prefill time (µs) of a prompt of @blocks blocks, @gpu, @cpu, @disk of them cached there. */
static inline double kvt_sim_prefill_us(const kvt_sim_model_t *m, uint32_t blocks, uint32_t gpu,
                                        uint32_t cpu, uint32_t disk)
{
    uint32_t miss = blocks - gpu - cpu - disk;
    return (double)m->block_tokens * (miss * m->prefill_us_per_token + cpu * m->cpu_us_per_token +
                                      disk * m->disk_us_per_token);
}

#endif
