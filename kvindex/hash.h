/*
 * kvindex/hash: the block hashing standard (DESIGN.md). With seed 1337 and no
 * salt, seq_i equals the sequence hash of NVIDIA Dynamo's KV router for
 * base-model text requests; LoRA requests keyed Dynamo's way are
 * kvt_hash_lora_seed() and kvt_hash_seq_seeds() below (Mooncake's conductor
 * and llm-d hash differently).
 *
 *   local_i = XXH3_64bits_withSeed(tokens[iB .. iB+B) as u32 little-endian, seed)
 *   seq_0   = local_0   (or chain(parent, local_0) when continuing a parent)
 *   seq_i   = XXH3_64bits_withSeed(le64(seq_{i-1}) || le64(local_i), seed)
 *
 * seq_i is the block's key in the index. Only full blocks are hashed.
 */
#ifndef KVT_KVINDEX_HASH_H
#define KVT_KVINDEX_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KVT_HASH_SEED 1337u

/*
 * Local hash of one block: XXH3-64 with @seed over @tokens[0..block_size) as
 * u32 little-endian bytes (whatever the host byte order). @tokens must hold
 * @block_size values; block_size 0 hashes the empty input. Pure, no allocation.
 */
uint64_t kvt_hash_block(const uint32_t *tokens, size_t block_size, uint64_t seed);

/*
 * Seq hash of a block whose predecessor has seq hash @prev and whose local hash
 * is @local: XXH3-64 with @seed over the 16 bytes le64(prev) || le64(local).
 */
uint64_t kvt_hash_chain(uint64_t prev, uint64_t local, uint64_t seed);

/*
 * Hashes every full block of @tokens[0..ntokens) with block size @block_size
 * (> 0). Writes ntokens / block_size values to @seq_out and, when not NULL,
 * to @local_out. With @parent not NULL the first block chains from *@parent.
 * Trailing tokens that do not fill a block are ignored. Returns the number of
 * blocks written (0 when block_size is 0). Does not allocate; thread-safe.
 */
size_t kvt_hash_seq(const uint32_t *tokens, size_t ntokens, uint32_t block_size, uint64_t seed,
                    const uint64_t *parent, uint64_t *local_out, uint64_t *seq_out);

/*
 * kvt_hash_seq() over tokens given as little-endian u32 bytes at any
 * alignment (as they arrive in a binary RPC frame): no copy on
 * little-endian hosts.
 */
size_t kvt_hash_seq_le(const void *le_tokens, size_t ntokens, uint32_t block_size, uint64_t seed,
                       const uint64_t *parent, uint64_t *local_out, uint64_t *seq_out);

/*
 * Cache salt (vLLM's and SGLang's per-request `cache_salt`, tenant isolation).
 * A salt enters the key through the first block of a chain: its local hash is
 * seeded with kvt_hash_salt_seed(salt) instead of KVT_HASH_SEED, so every seq
 * key of a salted prompt differs from the unsalted prompt's and from any other
 * salt's; blocks after the first, and the chain step, use KVT_HASH_SEED.
 *
 *   salt_seed = XXH3_64bits_withSeed(salt bytes, 1337)
 *   local_0   = XXH3_64bits_withSeed(tokens[0 .. B) as u32 LE, salt_seed)
 *
 * The empty salt is no salt: kvt_hash_salt_seed() returns KVT_HASH_SEED.
 */
uint64_t kvt_hash_salt_seed(const void *salt, size_t len);

/*
 * kvt_hash_seq() with seed KVT_HASH_SEED, except that the first block's local
 * hash is seeded with @first_seed (kvt_hash_salt_seed(); KVT_HASH_SEED gives
 * exactly kvt_hash_seq()). Meant for a chain's first block: with @parent not
 * NULL the salt is already in the parent's key, and callers pass KVT_HASH_SEED.
 */
size_t kvt_hash_seq_salted(const uint32_t *tokens, size_t ntokens, uint32_t block_size,
                           uint64_t first_seed, const uint64_t *parent, uint64_t *local_out,
                           uint64_t *seq_out);

/* kvt_hash_seq_salted() over little-endian u32 bytes at any alignment (RPC frames). */
size_t kvt_hash_seq_salted_le(const void *le_tokens, size_t ntokens, uint32_t block_size,
                              uint64_t first_seed, const uint64_t *parent, uint64_t *local_out,
                              uint64_t *seq_out);

/*
 * LoRA keys as NVIDIA Dynamo's KV router computes them (kvtierd --lora-keys
 * dynamo). Dynamo folds the adapter's name into the seed of every block's
 * local hash and keeps the chain step on the standard seed:
 *
 *   lora_seed = 1337 + XXH3_64bits_withSeed(lora name bytes, 0)   (u64, wrapping)
 *   local_i   = XXH3_64bits_withSeed(tokens[iB .. iB+B) as u32 LE, lora_seed)   every i
 *   seq_i     = XXH3_64bits_withSeed(le64(seq_{i-1}) || le64(local_i), 1337)
 *
 * The empty name is no LoRA: kvt_hash_lora_seed() returns KVT_HASH_SEED, and
 * the keys are the standard's. @lora need not be NUL-terminated (NULL with
 * @len 0 is fine). Pure.
 */
uint64_t kvt_hash_lora_seed(const void *lora, size_t len);

/*
 * The seeds of one chain: @first seeds block 0's local hash, @block every
 * later block's, @chain every chain step. {s, KVT_HASH_SEED, KVT_HASH_SEED}
 * is kvt_hash_seq_salted() with first seed s.
 */
typedef struct kvt_hash_seeds {
    uint64_t first; /* local hash of the call's block 0 */
    uint64_t block; /* local hashes of blocks 1.. */
    uint64_t chain; /* every chain step (Dynamo and kvtier: KVT_HASH_SEED) */
} kvt_hash_seeds_t;

/*
 * The seeds of a request with cache salt @salt[0..@salt_len) and LoRA
 * @lora[0..@lora_len) keyed Dynamo's way (either may be empty: none):
 *
 *   block = kvt_hash_lora_seed(lora)                               (Dynamo's)
 *   first = kvt_hash_salt_seed(salt) + (block - 1337)   (u64, wrapping; kvtier's rule)
 *   chain = 1337
 *
 * The salt+LoRA rule is kvtier's own, not Dynamo's (whose router has no
 * per-request salt and folds its cache namespace into every block's seed):
 * a salt seeds block 0 only, as in vLLM, and the LoRA term is added to
 * whichever seed a block has. Without a salt @first is @block, Dynamo's keys
 * exactly; without a LoRA the seeds are kvt_hash_seq_salted()'s. Pure.
 */
void kvt_hash_seeds_lora(const void *salt, size_t salt_len, const void *lora, size_t lora_len,
                         kvt_hash_seeds_t *seeds_p);

/*
 * kvt_hash_seq() with separate seeds (@seeds): block 0 of this call is
 * seeded with seeds->first, later blocks with seeds->block, chain steps with
 * seeds->chain. With @parent not NULL block 0 chains from *@parent; callers
 * continuing a chain pass first == block (the salt is in the parent's key).
 * Returns the blocks written (0 when block_size is 0). Does not allocate;
 * thread-safe. A general loop, for LoRA keys under --lora-keys dynamo: the
 * standard's fast paths are kvt_hash_seq() and kvt_hash_seq_salted().
 */
size_t kvt_hash_seq_seeds(const uint32_t *tokens, size_t ntokens, uint32_t block_size,
                          const kvt_hash_seeds_t *seeds, const uint64_t *parent,
                          uint64_t *local_out, uint64_t *seq_out);

/* kvt_hash_seq_seeds() over little-endian u32 bytes at any alignment (RPC frames). */
size_t kvt_hash_seq_seeds_le(const void *le_tokens, size_t ntokens, uint32_t block_size,
                             const kvt_hash_seeds_t *seeds, const uint64_t *parent,
                             uint64_t *local_out, uint64_t *seq_out);

#endif
