/*
 * The block hashing standard (DESIGN.md, "Hashing standard").
 *
 * xxHash is compiled into this file (XXH_INLINE_ALL) so the one-shot XXH3
 * calls inline: blocks of up to 240 bytes (60 tokens) and the 16-byte chain
 * input take XXH3's scalar short paths, which gain nothing from SIMD.
 *
 * Longer blocks take XXH3's vectorized long path. Inlined, that is compiled
 * for the baseline ISA (SSE2 on x86-64); on x86-64 libxxhash also exports
 * XXH3_64bits_withSeed_dispatch, which picks SSE2/AVX2/AVX-512 at run time
 * and measured 25% faster on 2 KiB blocks on an AVX-512 Xeon, so it is used
 * for those. Same function, same result: only the speed differs. Define
 * KVT_HASH_NO_DISPATCH to build without it (e.g. against a libxxhash.a, which
 * lacks it).
 */
#include "kvindex/hash.h"

#include <stdbool.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) &&                                 \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVT_HASH_LE 1
#elif defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) &&                                  \
    __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define KVT_HASH_LE 0
#else
#error "kvindex/hash.c: unknown byte order"
#endif

#if !defined(KVT_HASH_NO_DISPATCH) && defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#define KVT_HASH_DISPATCH 1
/*
 * Declared here rather than by including <xxh_x86dispatch.h>, which cannot be
 * combined with XXH_INLINE_ALL (it re-declares the inlined names).
 */
XXH64_hash_t XXH3_64bits_withSeed_dispatch(const void *input, size_t len, XXH64_hash_t seed);
#endif
#endif
#ifndef KVT_HASH_DISPATCH
#define KVT_HASH_DISPATCH 0
#endif

/* Inputs longer than this take XXH3's long (SIMD) path. */
#define KVT_HASH_MIDSIZE_MAX 240

#if defined(__GNUC__)
#define KVT_HASH_INLINE static inline __attribute__((always_inline))
#else
#define KVT_HASH_INLINE static inline
#endif

#if !KVT_HASH_LE
/* Tokens swapped per round on big-endian hosts; the XXH3 stream makes any block size work. */
#define KVT_HASH_SWAP_CHUNK 256

static uint32_t kvt_hash_bswap32(uint32_t v)
{
    return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}

static uint64_t kvt_hash_bswap64(uint64_t v)
{
    return ((uint64_t)kvt_hash_bswap32((uint32_t)v) << 32) | kvt_hash_bswap32((uint32_t)(v >> 32));
}

static uint64_t kvt_hash_block_be(const uint32_t *tokens, size_t block_size, uint64_t seed)
{
    uint32_t buf[KVT_HASH_SWAP_CHUNK];
    XXH3_state_t st;
    size_t done = 0;

    XXH3_INITSTATE(&st); /* a stack state must be marked fresh before its first reset */
    XXH3_64bits_reset_withSeed(&st, seed);
    while (done < block_size) {
        size_t n = block_size - done;
        if (n > KVT_HASH_SWAP_CHUNK)
            n = KVT_HASH_SWAP_CHUNK;
        for (size_t i = 0; i < n; i++)
            buf[i] = kvt_hash_bswap32(tokens[done + i]);
        XXH3_64bits_update(&st, buf, n * sizeof(buf[0]));
        done += n;
    }
    return XXH3_64bits_digest(&st);
}
#endif

/* Same as kvt_hash_block(); forced inline so kvt_hash_seq's loop has no calls but XXH3's. */
/* @tokens: host-order u32s; on little-endian hosts also any little-endian bytes, any alignment. */
KVT_HASH_INLINE uint64_t kvt_hash_block_inl(const void *tokens, size_t block_size, uint64_t seed)
{
#if KVT_HASH_LE
    size_t len = block_size * sizeof(uint32_t);
#if KVT_HASH_DISPATCH
    if (len > KVT_HASH_MIDSIZE_MAX)
        return XXH3_64bits_withSeed_dispatch(tokens, len, seed);
#endif
    return XXH3_64bits_withSeed(tokens, len, seed);
#else
    return kvt_hash_block_be(tokens, block_size, seed);
#endif
}

KVT_HASH_INLINE uint64_t kvt_hash_chain_inl(uint64_t prev, uint64_t local, uint64_t seed)
{
    uint64_t in[2];

#if KVT_HASH_LE
    in[0] = prev;
    in[1] = local;
#else
    in[0] = kvt_hash_bswap64(prev);
    in[1] = kvt_hash_bswap64(local);
#endif
    return XXH3_64bits_withSeed(in, sizeof(in), seed);
}

uint64_t kvt_hash_block(const uint32_t *tokens, size_t block_size, uint64_t seed)
{
    return kvt_hash_block_inl(tokens, block_size, seed);
}

uint64_t kvt_hash_chain(uint64_t prev, uint64_t local, uint64_t seed)
{
    return kvt_hash_chain_inl(prev, local, seed);
}

/*
 * The loop behind kvt_hash_seq, inlined per call site so that a constant
 * @block_size lets the compiler drop XXH3's length dispatch from the loop.
 *
 * The local hashes are independent of each other; only the 16-byte chain step
 * is serial, so out-of-order execution overlaps block i+1's local hash with
 * block i's chain step.
 */
KVT_HASH_INLINE void kvt_hash_seq_inl(const void *tokens, size_t nblocks, size_t block_size,
                                      uint64_t seed, const uint64_t *parent, uint64_t *local_out,
                                      uint64_t *seq_out)
{
    const size_t stride = block_size * sizeof(uint32_t);
    /* Block 0 is peeled so the loop body has no parent test. */
    uint64_t local = kvt_hash_block_inl(tokens, block_size, seed);
    uint64_t seq = parent != NULL ? kvt_hash_chain_inl(*parent, local, seed) : local;
    seq_out[0] = seq;
    if (local_out != NULL)
        local_out[0] = local;

    const unsigned char *p = tokens;
    if (local_out != NULL) {
        for (size_t i = 1; i < nblocks; i++) {
            p += stride;
            local = kvt_hash_block_inl(p, block_size, seed);
            seq = kvt_hash_chain_inl(seq, local, seed);
            local_out[i] = local;
            seq_out[i] = seq;
        }
    } else {
        for (size_t i = 1; i < nblocks; i++) {
            p += stride;
            local = kvt_hash_block_inl(p, block_size, seed);
            seq = kvt_hash_chain_inl(seq, local, seed);
            seq_out[i] = seq;
        }
    }
}

/* One body for both entry points: @tokens as kvt_hash_block_inl() takes them. */
KVT_HASH_INLINE size_t kvt_hash_seq_any(const void *tokens, size_t ntokens, uint32_t block_size,
                                        uint64_t seed, const uint64_t *parent, uint64_t *local_out,
                                        uint64_t *seq_out)
{
    if (block_size == 0)
        return 0;

    size_t nblocks = ntokens / block_size;
    if (nblocks == 0)
        return 0;

    /* Specialized copies for the block sizes engines use most (vLLM's default is 16). */
    switch (block_size) {
    case 16: kvt_hash_seq_inl(tokens, nblocks, 16, seed, parent, local_out, seq_out); break;
    case 32: kvt_hash_seq_inl(tokens, nblocks, 32, seed, parent, local_out, seq_out); break;
    default: kvt_hash_seq_inl(tokens, nblocks, block_size, seed, parent, local_out, seq_out); break;
    }
    return nblocks;
}

size_t kvt_hash_seq(const uint32_t *tokens, size_t ntokens, uint32_t block_size, uint64_t seed,
                    const uint64_t *parent, uint64_t *local_out, uint64_t *seq_out)
{
    return kvt_hash_seq_any(tokens, ntokens, block_size, seed, parent, local_out, seq_out);
}

size_t kvt_hash_seq_le(const void *le_tokens, size_t ntokens, uint32_t block_size, uint64_t seed,
                       const uint64_t *parent, uint64_t *local_out, uint64_t *seq_out)
{
#if KVT_HASH_LE
    /* the bytes are what the standard hashes: no copy */
    return kvt_hash_seq_any(le_tokens, ntokens, block_size, seed, parent, local_out, seq_out);
#else
    /* XXH3 reads bytes, so the little-endian bytes hash as they are on any host */
    if (block_size == 0)
        return 0;
    size_t nblocks = ntokens / block_size, stride = (size_t)block_size * 4;
    const unsigned char *b = le_tokens;
    for (size_t i = 0; i < nblocks; i++) {
        uint64_t local = XXH3_64bits_withSeed(b + i * stride, stride, seed);
        uint64_t seq = i > 0    ? kvt_hash_chain_inl(seq_out[i - 1], local, seed)
                       : parent ? kvt_hash_chain_inl(*parent, local, seed)
                                : local;
        if (local_out != NULL)
            local_out[i] = local;
        seq_out[i] = seq;
    }
    return nblocks;
#endif
}

uint64_t kvt_hash_salt_seed(const void *salt, size_t len)
{
    return len == 0 ? KVT_HASH_SEED : XXH3_64bits_withSeed(salt, len, KVT_HASH_SEED);
}

/*
 * The first block with its own seed, then the rest as a chain continuing it:
 * the unsalted path (most calls) is kvt_hash_seq_any() unchanged. @le: the
 * tokens are little-endian bytes (RPC frames) rather than host-order u32s.
 */
static size_t kvt_hash_seq_first(const void *tokens, size_t ntokens, uint32_t block_size,
                                 uint64_t first_seed, const uint64_t *parent, uint64_t *local_out,
                                 uint64_t *seq_out, bool le)
{
    if (block_size == 0 || ntokens < block_size)
        return 0;
    if (first_seed == KVT_HASH_SEED)
        return le ? kvt_hash_seq_le(tokens, ntokens, block_size, KVT_HASH_SEED, parent, local_out,
                                    seq_out)
                  : kvt_hash_seq_any(tokens, ntokens, block_size, KVT_HASH_SEED, parent, local_out,
                                     seq_out);
#if KVT_HASH_LE
    uint64_t local = kvt_hash_block_inl(tokens, block_size, first_seed);
#else
    uint64_t local = le ? XXH3_64bits_withSeed(tokens, (size_t)block_size * 4, first_seed)
                        : kvt_hash_block_be(tokens, block_size, first_seed);
#endif
    uint64_t seq = parent != NULL ? kvt_hash_chain_inl(*parent, local, KVT_HASH_SEED) : local;
    seq_out[0] = seq;
    if (local_out != NULL)
        local_out[0] = local;
    const unsigned char *rest = (const unsigned char *)tokens + (size_t)block_size * 4;
    size_t more = le ? kvt_hash_seq_le(rest, ntokens - block_size, block_size, KVT_HASH_SEED, &seq,
                                       local_out ? local_out + 1 : NULL, seq_out + 1)
                     : kvt_hash_seq_any(rest, ntokens - block_size, block_size, KVT_HASH_SEED, &seq,
                                        local_out ? local_out + 1 : NULL, seq_out + 1);
    return 1 + more;
}

size_t kvt_hash_seq_salted(const uint32_t *tokens, size_t ntokens, uint32_t block_size,
                           uint64_t first_seed, const uint64_t *parent, uint64_t *local_out,
                           uint64_t *seq_out)
{
    return kvt_hash_seq_first(tokens, ntokens, block_size, first_seed, parent, local_out, seq_out,
                              false);
}

size_t kvt_hash_seq_salted_le(const void *le_tokens, size_t ntokens, uint32_t block_size,
                              uint64_t first_seed, const uint64_t *parent, uint64_t *local_out,
                              uint64_t *seq_out)
{
    return kvt_hash_seq_first(le_tokens, ntokens, block_size, first_seed, parent, local_out,
                              seq_out, true);
}

uint64_t kvt_hash_lora_seed(const void *lora, size_t len)
{
    /* Dynamo's term is seeded 0, and added with u64 wrap-around */
    return len == 0 ? KVT_HASH_SEED : KVT_HASH_SEED + XXH3_64bits_withSeed(lora, len, 0);
}

void kvt_hash_seeds_lora(const void *salt, size_t salt_len, const void *lora, size_t lora_len,
                         kvt_hash_seeds_t *seeds_p)
{
    uint64_t block = kvt_hash_lora_seed(lora, lora_len);
    *seeds_p = (kvt_hash_seeds_t){kvt_hash_salt_seed(salt, salt_len) + (block - KVT_HASH_SEED),
                                  block, KVT_HASH_SEED};
}

/*
 * The loop behind kvt_hash_seq_seeds[_le]. @le: the tokens are
 * little-endian bytes (RPC frames) rather than host-order u32s, which only
 * matters on big-endian hosts.
 */
static size_t kvt_hash_seq_seeds_any(const void *tokens, size_t ntokens, uint32_t block_size,
                                     const kvt_hash_seeds_t *s, const uint64_t *parent,
                                     uint64_t *local_out, uint64_t *seq_out, bool le)
{
    if (block_size == 0)
        return 0;
    const size_t nblocks = ntokens / block_size, stride = (size_t)block_size * 4;
    const unsigned char *p = tokens;
    uint64_t seq = 0;
    (void)le;
    for (size_t i = 0; i < nblocks; i++, p += stride) {
        uint64_t seed = i == 0 ? s->first : s->block;
#if KVT_HASH_LE
        uint64_t local = kvt_hash_block_inl(p, block_size, seed);
#else
        uint64_t local =
            le ? XXH3_64bits_withSeed(p, stride, seed)
               : kvt_hash_block_be((const uint32_t *)(const void *)p, block_size, seed);
#endif
        seq = i > 0            ? kvt_hash_chain_inl(seq, local, s->chain)
              : parent != NULL ? kvt_hash_chain_inl(*parent, local, s->chain)
                               : local;
        if (local_out != NULL)
            local_out[i] = local;
        seq_out[i] = seq;
    }
    return nblocks;
}

size_t kvt_hash_seq_seeds(const uint32_t *tokens, size_t ntokens, uint32_t block_size,
                          const kvt_hash_seeds_t *seeds, const uint64_t *parent,
                          uint64_t *local_out, uint64_t *seq_out)
{
    return kvt_hash_seq_seeds_any(tokens, ntokens, block_size, seeds, parent, local_out, seq_out,
                                  false);
}

size_t kvt_hash_seq_seeds_le(const void *le_tokens, size_t ntokens, uint32_t block_size,
                             const kvt_hash_seeds_t *seeds, const uint64_t *parent,
                             uint64_t *local_out, uint64_t *seq_out)
{
    return kvt_hash_seq_seeds_any(le_tokens, ntokens, block_size, seeds, parent, local_out, seq_out,
                                  true);
}
