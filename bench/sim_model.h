/*
 * bench/sim_model: the engine's time model of the timed and live replay modes
 * (issue 18): what a prefill and a decode step cost. The defaults and where
 * they come from are in docs/benchmarks.md ("Timed mode"): Llama-3.1-8B in
 * BF16 on one H100 SXM, host RAM over PCIe Gen5 x16, one NVMe drive.
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
    uint32_t batch_tokens;       /* tokens to compute one prefill batch holds at most */
} kvt_sim_model_t;

/*
 * Fills @m with the defaults (docs/benchmarks.md derives them):
 *   prefill 40 us/token   ~19 GFLOP a token at 50% of the H100's 989 TFLOPS BF16
 *   cpu     2.6 us/token  128 KiB of KV a token at 50 GB/s host to device
 *   disk    18.7 us/token 128 KiB at 7 GB/s NVMe read
 *   decode  15 ms/token   weights and a batch's KV read from 3.35 TB/s HBM
 *   batch   8192 tokens   vLLM's --max-num-batched-tokens as commonly set
 */
static inline void kvt_sim_model_default(kvt_sim_model_t *m)
{
    m->block_tokens = 512;
    m->prefill_us_per_token = 40.0;
    m->cpu_us_per_token = 2.6;
    m->disk_us_per_token = 18.7;
    m->decode_us_per_token = 15000.0;
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

/*
 * Prefill time (µs) of a prompt of @tokens tokens whose leading @gpu + @cpu
 * + @disk blocks are cached in those tiers: the tokens after them computed,
 * the CPU and DISK blocks loaded (the timed mode's cost).
 */
static inline double kvt_sim_prefill_tok_us(const kvt_sim_model_t *m, uint32_t tokens, uint32_t gpu,
                                            uint32_t cpu, uint32_t disk)
{
    uint64_t cached = (uint64_t)(gpu + cpu + disk) * m->block_tokens;
    uint64_t miss = tokens > cached ? tokens - cached : 0;
    return (double)miss * m->prefill_us_per_token +
           (double)m->block_tokens * (cpu * m->cpu_us_per_token + disk * m->disk_us_per_token);
}

/* Tokens a prompt of @tokens tokens computes when @hit blocks are cached. */
static inline uint32_t kvt_sim_miss_tokens(const kvt_sim_model_t *m, uint32_t tokens, uint32_t hit)
{
    uint64_t cached = (uint64_t)hit * m->block_tokens;
    return tokens > cached ? (uint32_t)(tokens - cached) : 0;
}

#endif
