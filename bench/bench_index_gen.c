/*
 * The scale run's workload (bench/bench_index_int.h), generated in-process
 * from a seed: no trace file.
 *
 * Keys are chained as sequence keys are (each mixes its parent's key with
 * the block's content, here a number drawn from the seed), so a block's key
 * names its whole prefix. System prompts are chains of their own; a
 * session's blocks continue its prompt's chain. A session lives on pod
 * (home + hop) % pods: a turn on the same pod stores only its new blocks
 * (vLLM's BlockStored carries the blocks a step filled, with the parent's
 * hash); a session's first turn, or one that moves on to the next pod, stores
 * the context the pod does not hold yet (the prompt unless the pod has it
 * already, the session's blocks so far, the new ones) as one event.
 */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_index_int.h"

typedef struct sgen_sess {
    uint64_t id;      /* session number: salts its blocks' contents */
    uint64_t last;    /* key of its last block stored (the prompt's last before any) */
    uint32_t prompt;  /* its system prompt */
    uint32_t nblocks; /* its own blocks stored so far, past the prompt */
    uint32_t turns;   /* turns left */
    uint32_t home;    /* first pod index */
    uint32_t hop;     /* its pod is (home + hop) % pods; hops stay below pods */
    uint32_t started; /* 1 once its first turn stored */
} sgen_sess_t;

struct kvt_sgen {
    kvt_sgen_config_t cfg;
    uint64_t rng;     /* the events' stream */
    uint64_t salt;    /* contents of session blocks */
    uint64_t *pkeys;  /* prompt p's keys: pkeys[p * KVT_SGEN_PROMPT_MAX ...] */
    uint32_t *plen;   /* prompt p's length in blocks */
    double *pcdf;     /* Zipf(1) popularity, cumulative */
    uint8_t *pheld;   /* bit p * pods + pod: that pod holds prompt p */
    uint8_t *pseen;   /* prompt p stored on some pod */
    sgen_sess_t *act; /* the active sessions */
    uint64_t next_id; /* next session number */
    uint64_t entries, blocks;
};

static uint64_t sgen_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The key of a block with content @content after the block keyed @parent. */
static uint64_t sgen_chain(uint64_t parent, uint64_t content)
{
    return sgen_mix(parent ^ sgen_mix(content));
}

/* Uniform in [lo, hi]. */
static uint32_t sgen_range(uint64_t *rng, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(kvt_bench_rand(rng) % (uint64_t)(hi - lo + 1));
}

static uint32_t sgen_zipf(const kvt_sgen_t *g, uint64_t *rng)
{
    double u = (double)(kvt_bench_rand(rng) >> 11) * 0x1.0p-53;
    uint32_t lo = 0, hi = g->cfg.prompts - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (g->pcdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static const uint64_t *sgen_prompt(const kvt_sgen_t *g, uint32_t p)
{
    return g->pkeys + (size_t)p * KVT_SGEN_PROMPT_MAX;
}

/* Writes session @id's blocks [from, from + n) to @out, @prev being block from - 1's key. */
static void sgen_sess_keys(const kvt_sgen_t *g, uint64_t id, uint64_t prev, uint32_t from,
                           uint32_t n, uint64_t *out)
{
    for (uint32_t j = 0; j < n; j++) {
        prev = sgen_chain(prev, g->salt ^ (id << 16) ^ (uint64_t)(from + j));
        out[j] = prev;
    }
}

static void sgen_sess_new(kvt_sgen_t *g, sgen_sess_t *s)
{
    s->id = g->next_id++;
    s->prompt = sgen_zipf(g, &g->rng);
    s->last = sgen_prompt(g, s->prompt)[g->plen[s->prompt] - 1];
    s->nblocks = 0;
    s->turns = sgen_range(&g->rng, 1, KVT_SGEN_TURNS_MAX);
    s->home = sgen_range(&g->rng, 0, g->cfg.pods - 1);
    s->hop = 0;
    s->started = 0;
}

kvt_sgen_t *kvt_sgen_create(const kvt_sgen_config_t *cfg)
{
    if (cfg->pods == 0 || cfg->prompts == 0 || cfg->active == 0)
        return NULL;
    kvt_sgen_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    g->cfg = *cfg;
    size_t np = cfg->prompts;
    size_t held = (np * cfg->pods + 7) / 8;
    g->pkeys = malloc(np * KVT_SGEN_PROMPT_MAX * sizeof(uint64_t));
    g->plen = malloc(np * sizeof(uint32_t));
    g->pcdf = malloc(np * sizeof(double));
    g->pheld = calloc(held, 1);
    g->pseen = calloc(np, 1);
    g->act = malloc((size_t)cfg->active * sizeof(sgen_sess_t));
    if (g->pkeys == NULL || g->plen == NULL || g->pcdf == NULL || g->pheld == NULL ||
        g->pseen == NULL || g->act == NULL) {
        kvt_sgen_destroy(g);
        return NULL;
    }
    g->rng = sgen_mix(cfg->seed) | 1;
    g->salt = sgen_mix(cfg->seed ^ 0x73657373696f6eull);
    double sum = 0;
    for (size_t p = 0; p < np; p++) {
        g->plen[p] = sgen_range(&g->rng, KVT_SGEN_PROMPT_MIN, KVT_SGEN_PROMPT_MAX);
        uint64_t prev = sgen_mix(cfg->seed ^ (0x70726f6d7074ull << 16) ^ p);
        for (uint32_t j = 0; j < g->plen[p]; j++) {
            prev = sgen_chain(prev, kvt_bench_rand(&g->rng));
            g->pkeys[p * KVT_SGEN_PROMPT_MAX + j] = prev;
        }
        sum += 1.0 / (double)(p + 1);
        g->pcdf[p] = sum;
    }
    for (size_t p = 0; p < np; p++)
        g->pcdf[p] /= sum;
    g->pcdf[np - 1] = 1.0;
    for (uint32_t i = 0; i < cfg->active; i++)
        sgen_sess_new(g, &g->act[i]);
    return g;
}

void kvt_sgen_destroy(kvt_sgen_t *g)
{
    if (g == NULL)
        return;
    free(g->pkeys);
    free(g->plen);
    free(g->pcdf);
    free(g->pheld);
    free(g->pseen);
    free(g->act);
    free(g);
}

void kvt_sgen_next(kvt_sgen_t *g, kvt_sgen_event_t *ev)
{
    sgen_sess_t *s = &g->act[kvt_bench_rand(&g->rng) % g->cfg.active];
    uint32_t pods = g->cfg.pods;
    bool whole = !s->started;
    if (s->started && s->hop + 1 < pods && kvt_bench_rand(&g->rng) % 100 < g->cfg.move_pct) {
        s->hop++;
        whole = true;
    }
    uint32_t pod = (uint32_t)(((uint64_t)s->home + s->hop) % pods);
    const uint64_t *pk = sgen_prompt(g, s->prompt);
    uint32_t plen = g->plen[s->prompt];
    uint32_t n = 0;
    ev->pod = pod;
    ev->has_parent = true;
    ev->parent = s->last;
    if (whole) {
        size_t bit = (size_t)s->prompt * pods + pod;
        if ((g->pheld[bit / 8] & (1u << (bit % 8))) == 0) {
            g->pheld[bit / 8] |= (uint8_t)(1u << (bit % 8));
            memcpy(ev->keys, pk, plen * sizeof(uint64_t));
            n = plen;
            ev->has_parent = false;
            g->entries += plen;
            if (!g->pseen[s->prompt]) {
                g->pseen[s->prompt] = 1;
                g->blocks += plen;
            }
        } else {
            ev->parent = pk[plen - 1];
        }
        /* the session's blocks so far: new to this pod, known to the index */
        sgen_sess_keys(g, s->id, pk[plen - 1], 0, s->nblocks, ev->keys + n);
        n += s->nblocks;
        g->entries += s->nblocks;
    }
    uint32_t add = sgen_range(&g->rng, KVT_SGEN_NEW_MIN, KVT_SGEN_NEW_MAX);
    sgen_sess_keys(g, s->id, s->last, s->nblocks, add, ev->keys + n);
    n += add;
    g->entries += add;
    g->blocks += add;
    s->nblocks += add;
    s->last = ev->keys[n - 1];
    s->started = 1;
    ev->n = n;
    if (--s->turns == 0)
        sgen_sess_new(g, s);
}

uint64_t kvt_sgen_entries(const kvt_sgen_t *g)
{
    return g->entries;
}

uint64_t kvt_sgen_blocks(const kvt_sgen_t *g)
{
    return g->blocks;
}

uint64_t kvt_sgen_sessions(const kvt_sgen_t *g)
{
    return g->next_id;
}

size_t kvt_sgen_query(const kvt_sgen_t *g, kvt_sgen_qkind_t kind, uint64_t *rng, uint64_t *out,
                      size_t min, size_t max)
{
    const sgen_sess_t *s = &g->act[kvt_bench_rand(rng) % g->cfg.active];
    /* a chain query wants a session with blocks of its own: a few more draws */
    for (int i = 0; kind == KVT_SGEN_Q_CHAIN && s->nblocks == 0 && i < 64; i++)
        s = &g->act[kvt_bench_rand(rng) % g->cfg.active];
    uint32_t prompt = s->prompt, nblocks = s->nblocks;
    uint64_t id = s->id;
    if (kind == KVT_SGEN_Q_REQUEST && kvt_bench_rand(rng) % 5 == 0) {
        /* a new session: numbers from 2^47 up are never the fill's */
        prompt = sgen_zipf(g, rng);
        id = (1ull << 47) | (kvt_bench_rand(rng) & ((1ull << 40) - 1));
        nblocks = 0;
    }
    const uint64_t *pk = sgen_prompt(g, prompt);
    uint32_t plen = g->plen[prompt];
    uint32_t add = sgen_range(rng, KVT_SGEN_NEW_MIN, KVT_SGEN_NEW_MAX);
    size_t n = 0;
    for (uint32_t j = 0; kind == KVT_SGEN_Q_REQUEST && j < plen && n < max; j++)
        out[n++] = pk[j];
    /* context, then the next turn's blocks (not stored yet), then more new ones up to @min */
    uint64_t prev = pk[plen - 1];
    for (uint32_t j = 0; n < max && (j < nblocks + add || n < min); j++) {
        prev = sgen_chain(prev, g->salt ^ (id << 16) ^ (uint64_t)j);
        out[n++] = prev;
    }
    return n;
}

uint64_t kvt_sgen_ehash(uint64_t key)
{
    return sgen_mix(key ^ 0x6b7674696572ull);
}
