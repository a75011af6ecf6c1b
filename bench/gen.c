/*
 * bench/gen: the trace generator (gen.h).
 *
 * Sessions are built one after another as lists of block contents: a
 * content key names what a whole block holds (block j of system prompt k,
 * block j of group g's template, or text of its own). Once every request is
 * made, they are sorted by time and a trie from (parent id, content) to id
 * numbers the prefixes: that is Mooncake's rule by construction.
 */
#include "bench/gen.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"
#include "common/grow.h"

/* Content keys: the top two bits say what a block holds. */
#define GEN_SYS (1ull << 62) /* | prompt << 32 | block */
#define GEN_TPL (2ull << 62) /* | group << 32 | block */
#define GEN_OWN (3ull << 62) /* | serial: text no other block has */
#define GEN_NO_PARENT 0      /* the trie's parent of block 0; id + 1 after */
#define GEN_MAX_KEYS (1ull << 30)

void kvt_gen_config_default(kvt_gen_config_t *cfg)
{
    *cfg = (kvt_gen_config_t){
        .seed = 1,
        .block_tokens = 512,
        .sessions = 100,
        .rate = 0.5,
        .turns = 4,
        .turns_max = 0,
        .tool_turns = 8,
        .think_ms = 30000,
        .tool_think_ms = 2000,
        .first_tokens = 1024,
        .user_tokens = 256,
        .tool_tokens = 128,
        .output_tokens = 256,
        .tool_share = 0.2,
        .system_prompts = 4,
        .system_blocks = 4,
        .system_share = 0.8,
        .prefix_share = 0.0,
        .idle_ms = 600000,
    };
}

/* ---- building ------------------------------------------------------------------------------- */

typedef struct gen_req {
    uint64_t ts;
    uint64_t order; /* the tie-break after ts: session << 32 | turn, or the arrival's row */
    uint32_t session, turn;
    uint32_t input, output;
    size_t koff; /* its content keys: b->keys[koff .. koff + nkeys) */
    uint32_t nkeys;
} gen_req_t;

/* One session's context: the contents of its whole blocks and the tokens after them. */
typedef struct gen_ctx {
    uint64_t *full;
    size_t nfull, cap;
    uint32_t tail; /* tokens in the partial last block */
} gen_ctx_t;

typedef struct gen_build {
    const kvt_gen_config_t *cfg;
    uint64_t rng;
    uint64_t own; /* next GEN_OWN serial */
    gen_req_t *reqs;
    size_t nreqs, reqs_cap;
    uint64_t *keys;
    size_t nkeys, keys_cap;
    uint32_t *sess_system;
    uint8_t *sess_tool;
    uint32_t nsessions;
    size_t sys_cap, tool_cap;
    kvt_status_t st; /* why a step failed: KVT_ERR_NO_MEM or KVT_ERR_INVAL (a limit) */
    char *err;
    size_t errlen;
} gen_build_t;

/* splitmix64 */
static uint64_t gen_rand(gen_build_t *b)
{
    uint64_t z = (b->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double gen_u01(gen_build_t *b)
{
    return (double)(gen_rand(b) >> 11) * (1.0 / 9007199254740992.0);
}

static bool gen_coin(gen_build_t *b, double p)
{
    return gen_u01(b) < p;
}

/* A length uniform in [m - m/2, m + m/2], at least 1. */
static uint32_t gen_len(gen_build_t *b, uint32_t m)
{
    uint32_t lo = m - m / 2, hi = m + m / 2;
    uint32_t v = lo + (uint32_t)(gen_rand(b) % ((uint64_t)hi - lo + 1));
    return v ? v : 1;
}

/* Exponential with mean @mean_ms, rounded to whole ms. */
static uint64_t gen_exp_ms(gen_build_t *b, double mean_ms)
{
    double x = -mean_ms * log(1.0 - gen_u01(b));
    return x < 1e15 ? (uint64_t)(x + 0.5) : (uint64_t)1e15;
}

static int gen_oom(gen_build_t *b)
{
    b->st = KVT_ERR_NO_MEM;
    kvt_errf(b->err, b->errlen, "out of memory");
    return -1;
}

static int gen_ctx_push(gen_build_t *b, gen_ctx_t *c, uint64_t key)
{
    if (!kvt_grow(&c->full, &c->cap, c->nfull + 1, sizeof(*c->full), 64))
        return gen_oom(b);
    c->full[c->nfull++] = key;
    return 0;
}

/* Appends @n tokens of the session's own text (the partial tail block becomes new text too). */
static int gen_ctx_own(gen_build_t *b, gen_ctx_t *c, uint64_t n)
{
    uint64_t total = c->tail + n;
    for (uint64_t k = total / b->cfg->block_tokens; k > 0; k--)
        if (gen_ctx_push(b, c, GEN_OWN | b->own++) != 0)
            return -1;
    c->tail = (uint32_t)(total % b->cfg->block_tokens);
    return 0;
}

static uint64_t gen_ctx_tokens(const gen_build_t *b, const gen_ctx_t *c)
{
    return (uint64_t)c->nfull * b->cfg->block_tokens + c->tail;
}

/*
 * A session's opening: system prompt @sys's blocks (0: none; as many as fit
 * in @max_tokens), then a first user message of @max_tokens - that: its
 * group's template for prefix_share of its whole blocks, then its own text.
 */
static int gen_ctx_open(gen_build_t *b, gen_ctx_t *c, uint32_t sys, uint64_t first_tokens)
{
    const kvt_gen_config_t *cfg = b->cfg;
    uint32_t bt = cfg->block_tokens;
    c->nfull = 0;
    c->tail = 0;
    if (sys > 0) {
        uint64_t s = cfg->system_blocks;
        if (s > first_tokens / bt)
            s = first_tokens / bt;
        for (uint64_t j = 0; j < s; j++)
            if (gen_ctx_push(b, c, GEN_SYS | (uint64_t)sys << 32 | j) != 0)
                return -1;
        first_tokens -= s * bt;
    }
    uint64_t tpl = (uint64_t)(cfg->prefix_share * (double)(first_tokens / bt));
    for (uint64_t j = 0; j < tpl; j++)
        if (gen_ctx_push(b, c, GEN_TPL | (uint64_t)sys << 32 | j) != 0)
            return -1;
    return gen_ctx_own(b, c, first_tokens - tpl * bt);
}

/* Records a request whose prompt is @c as it stands. */
static int gen_emit(gen_build_t *b, const gen_ctx_t *c, uint64_t ts, uint64_t order,
                    uint32_t session, uint32_t turn, uint32_t output)
{
    uint64_t tokens = gen_ctx_tokens(b, c);
    if (tokens > UINT32_MAX) {
        b->st = KVT_ERR_INVAL;
        kvt_errf(b->err, b->errlen, "session %" PRIu32 "'s prompt outgrew 2^32-1 tokens", session);
        return -1;
    }
    size_t n = c->nfull + (c->tail > 0);
    if (b->nkeys + n > GEN_MAX_KEYS) {
        b->st = KVT_ERR_INVAL;
        kvt_errf(b->err, b->errlen,
                 "the trace outgrew %llu blocks: ask for fewer or shorter "
                 "sessions",
                 (unsigned long long)GEN_MAX_KEYS);
        return -1;
    }
    if (!kvt_grow(&b->keys, &b->keys_cap, b->nkeys + n, sizeof(*b->keys), 4096) ||
        !kvt_grow(&b->reqs, &b->reqs_cap, b->nreqs + 1, sizeof(*b->reqs), 1024))
        return gen_oom(b);
    gen_req_t *r = &b->reqs[b->nreqs++];
    *r = (gen_req_t){.ts = ts,
                     .order = order,
                     .session = session,
                     .turn = turn,
                     .input = (uint32_t)tokens,
                     .output = output,
                     .koff = b->nkeys,
                     .nkeys = (uint32_t)n};
    if (c->nfull > 0)
        memcpy(b->keys + b->nkeys, c->full, c->nfull * sizeof(*c->full));
    b->nkeys += c->nfull;
    if (c->tail > 0)
        b->keys[b->nkeys++] = GEN_OWN | b->own++;
    return 0;
}

/* A new session: its number (1..), its system prompt (0: none) drawn from the config. */
static int gen_session(gen_build_t *b, bool tool, uint32_t *num_p, uint32_t *sys_p)
{
    const kvt_gen_config_t *cfg = b->cfg;
    uint32_t sys = 0;
    if (gen_coin(b, cfg->system_share))
        sys = 1 + (uint32_t)(gen_rand(b) % cfg->system_prompts);
    if (!kvt_grow(&b->sess_system, &b->sys_cap, b->nsessions + 1, sizeof(*b->sess_system), 256) ||
        !kvt_grow(&b->sess_tool, &b->tool_cap, b->nsessions + 1, sizeof(*b->sess_tool), 256))
        return gen_oom(b);
    b->sess_system[b->nsessions] = sys;
    b->sess_tool[b->nsessions] = tool;
    *num_p = ++b->nsessions;
    *sys_p = sys;
    return 0;
}

/* ---- the two sources ------------------------------------------------------------------------ */

static int gen_synthetic(gen_build_t *b)
{
    const kvt_gen_config_t *cfg = b->cfg;
    gen_ctx_t c = {0};
    uint64_t start = 0;
    int rc = -1;
    for (uint32_t s = 0; s < cfg->sessions; s++) {
        if (s > 0)
            start += gen_exp_ms(b, 1000.0 / cfg->rate);
        bool tool = gen_coin(b, cfg->tool_share);
        uint32_t num, sys;
        if (gen_session(b, tool, &num, &sys) != 0)
            goto out;
        uint32_t turns = cfg->turns;
        if (tool)
            turns = cfg->tool_turns;
        else if (cfg->turns_max > cfg->turns)
            turns += (uint32_t)(gen_rand(b) % (cfg->turns_max - cfg->turns + 1));
        uint64_t sys_tokens = sys > 0 ? (uint64_t)cfg->system_blocks * cfg->block_tokens : 0;
        if (gen_ctx_open(b, &c, sys, sys_tokens + gen_len(b, cfg->first_tokens)) != 0)
            goto out;
        uint64_t ts = start;
        for (uint32_t k = 0; k < turns; k++) {
            uint32_t out = gen_len(b, cfg->output_tokens);
            if (gen_emit(b, &c, ts, (uint64_t)num << 32 | k, num, k, out) != 0)
                goto out;
            if (k + 1 == turns)
                break;
            /* the next prompt: this one, its output, then the user's or the tool's text */
            uint32_t more = gen_len(b, tool ? cfg->tool_tokens : cfg->user_tokens);
            if (gen_ctx_own(b, &c, (uint64_t)out + more) != 0)
                goto out;
            uint64_t gap = gen_exp_ms(b, tool ? cfg->tool_think_ms : cfg->think_ms);
            ts += gap > 0 ? gap : 1;
        }
    }
    rc = 0;
out:
    free(c.full);
    return rc;
}

typedef struct gen_open {
    gen_ctx_t ctx;
    uint64_t last_ts;
    uint64_t need; /* previous prompt + output: the least input that continues it */
    uint32_t num, turns;
} gen_open_t;

static int gen_cmp_row(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b; /* {ts, row} */
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

static int gen_from_arrivals(gen_build_t *b, const kvt_trace_t *arr)
{
    const kvt_gen_config_t *cfg = b->cfg;
    double p_cont = 1.0 - 1.0 / cfg->turns;
    int rc = -1;
    gen_open_t *open = NULL;
    size_t nopen = 0, open_cap = 0;
    uint64_t *rows = malloc((arr->nreqs ? arr->nreqs : 1) * 2 * sizeof(*rows));
    if (rows == NULL)
        return gen_oom(b);
    for (size_t i = 0; i < arr->nreqs; i++) {
        rows[2 * i] = arr->reqs[i].timestamp_ms;
        rows[2 * i + 1] = i;
    }
    qsort(rows, arr->nreqs, 2 * sizeof(*rows), gen_cmp_row);
    for (size_t i = 0; i < arr->nreqs; i++) {
        const kvt_trace_req_t *q = &arr->reqs[rows[2 * i + 1]];
        uint64_t ts = q->timestamp_ms;
        /* sessions idle too long take no more turns */
        size_t w = 0;
        for (size_t o = 0; o < nopen; o++) {
            if (open[o].last_ts + cfg->idle_ms < ts)
                free(open[o].ctx.full);
            else
                open[w++] = open[o];
        }
        nopen = w;
        gen_open_t *best = NULL;
        if (gen_coin(b, p_cont))
            for (size_t o = 0; o < nopen; o++) {
                gen_open_t *s = &open[o];
                if (s->last_ts >= ts || s->need > q->input_length ||
                    (cfg->turns_max > 0 && s->turns >= cfg->turns_max))
                    continue;
                if (best == NULL || s->need > best->need)
                    best = s; /* the tightest fit: the most shared (ties: the older session) */
            }
        if (best != NULL) {
            if (gen_ctx_own(b, &best->ctx, q->input_length - gen_ctx_tokens(b, &best->ctx)) != 0)
                goto out;
        } else {
            if (!kvt_grow(&open, &open_cap, nopen + 1, sizeof(*open), 64)) {
                gen_oom(b);
                goto out;
            }
            best = &open[nopen++];
            *best = (gen_open_t){0};
            uint32_t sys;
            if (gen_session(b, false, &best->num, &sys) != 0 ||
                gen_ctx_open(b, &best->ctx, sys, q->input_length) != 0)
                goto out;
        }
        if (gen_emit(b, &best->ctx, ts, rows[2 * i + 1], best->num, best->turns,
                     q->output_length) != 0)
            goto out;
        best->last_ts = ts;
        best->need = (uint64_t)q->input_length + q->output_length;
        best->turns++;
    }
    rc = 0;
out:
    for (size_t o = 0; o < nopen; o++)
        free(open[o].ctx.full);
    free(open);
    free(rows);
    return rc;
}

/* ---- numbering: the trie of prefixes -------------------------------------------------------- */

/* Parents are 0 for block 0 and id + 1 after; a slot stores parent + 1 so 0 marks it empty. */
typedef struct gen_trie {
    uint64_t *slots; /* 3 words a slot: parent + 1, content, id */
    size_t mask, n;
} gen_trie_t;

static size_t gen_trie_slot(uint64_t parent, uint64_t content, size_t mask)
{
    uint64_t h = parent * 0x9e3779b97f4a7c15ull ^ content;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (size_t)h & mask;
}

static int gen_trie_grow(gen_trie_t *t)
{
    size_t cap = t->slots ? (t->mask + 1) * 2 : 1 << 12;
    uint64_t *s = calloc(cap * 3, sizeof(*s));
    if (s == NULL)
        return -1;
    for (size_t i = 0; t->slots != NULL && i <= t->mask; i++) {
        const uint64_t *e = &t->slots[3 * i];
        if (e[0] == 0)
            continue;
        size_t j = gen_trie_slot(e[0], e[1], cap - 1);
        while (s[3 * j] != 0)
            j = (j + 1) & (cap - 1);
        memcpy(&s[3 * j], e, 3 * sizeof(*e));
    }
    free(t->slots);
    t->slots = s;
    t->mask = cap - 1;
    return 0;
}

/* The id of (@parent, @content), numbering a new one *@next; -1 out of memory. */
static int gen_trie_id(gen_trie_t *t, uint64_t parent, uint64_t content, uint64_t *next,
                       uint64_t *id_p)
{
    if (t->slots == NULL || 2 * (t->n + 1) > t->mask + 1)
        if (gen_trie_grow(t) != 0)
            return -1;
    uint64_t key = parent + 1;
    size_t j = gen_trie_slot(key, content, t->mask);
    for (;; j = (j + 1) & t->mask) {
        uint64_t *e = &t->slots[3 * j];
        if (e[0] == 0) {
            e[0] = key;
            e[1] = content;
            e[2] = (*next)++;
            t->n++;
            *id_p = e[2];
            return 0;
        }
        if (e[0] == key && e[1] == content) {
            *id_p = e[2];
            return 0;
        }
    }
}

static int gen_cmp_req(const void *a, const void *b)
{
    const gen_req_t *x = a, *y = b;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* Sorts @b's requests by time and numbers their prefixes into a new kvt_gen_t. */
static int gen_finish(gen_build_t *b, kvt_gen_t *g)
{
    qsort(b->reqs, b->nreqs, sizeof(*b->reqs), gen_cmp_req);
    kvt_trace_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return gen_oom(b);
    g->trace = t;
    t->reqs = calloc(b->nreqs ? b->nreqs : 1, sizeof(*t->reqs));
    t->ids = malloc((b->nkeys ? b->nkeys : 1) * sizeof(*t->ids));
    g->req_session = malloc((b->nreqs ? b->nreqs : 1) * sizeof(*g->req_session));
    g->req_turn = malloc((b->nreqs ? b->nreqs : 1) * sizeof(*g->req_turn));
    if (t->reqs == NULL || t->ids == NULL || g->req_session == NULL || g->req_turn == NULL)
        return gen_oom(b);
    gen_trie_t trie = {0};
    uint64_t next = 0;
    size_t off = 0;
    for (size_t i = 0; i < b->nreqs; i++) {
        const gen_req_t *r = &b->reqs[i];
        kvt_trace_req_t *q = &t->reqs[i];
        uint64_t parent = GEN_NO_PARENT;
        for (uint32_t k = 0; k < r->nkeys; k++) {
            uint64_t id;
            if (gen_trie_id(&trie, parent, b->keys[r->koff + k], &next, &id) != 0) {
                free(trie.slots);
                return gen_oom(b);
            }
            t->ids[off + k] = id;
            parent = id + 1;
        }
        char name[16];
        int n = snprintf(name, sizeof(name), "s%" PRIu32, r->session);
        *q = (kvt_trace_req_t){.timestamp_ms = r->ts,
                               .input_length = r->input,
                               .output_length = r->output,
                               .nblocks = r->nkeys,
                               .hash_ids = r->nkeys ? t->ids + off : NULL,
                               .session = kvt_trace_session_id(name, (size_t)n)};
        off += r->nkeys;
        if (r->nkeys > t->max_blocks)
            t->max_blocks = r->nkeys;
        g->req_session[i] = r->session;
        g->req_turn[i] = r->turn;
    }
    free(trie.slots);
    t->nreqs = b->nreqs;
    t->nids = off;
    g->distinct_blocks = next;
    return 0;
}

/* ---- the API -------------------------------------------------------------------------------- */

static bool gen_share_ok(double v)
{
    return v >= 0.0 && v <= 1.0; /* false for NaN too */
}

/* One line naming the option (as `kvtier-bench gen` spells it) for a bad @cfg. */
static int gen_check(const kvt_gen_config_t *cfg, bool synthetic, char *err, size_t errlen)
{
    const char *bad = NULL;
    if (cfg->block_tokens < 1 || cfg->block_tokens > (1u << 20))
        bad = "--block-tokens must be in [1, 1048576]";
    else if (!gen_share_ok(cfg->system_share))
        bad = "--system-share must be in [0, 1]";
    else if (!gen_share_ok(cfg->prefix_share))
        bad = "--prefix-share must be in [0, 1]";
    else if (cfg->system_share > 0 && (cfg->system_prompts < 1 || cfg->system_prompts > (1u << 24)))
        bad = "--system-prompts must be in [1, 16777216] when --system-share > 0";
    else if (cfg->system_share > 0 && (cfg->system_blocks < 1 || cfg->system_blocks > (1u << 20)))
        bad = "--system-blocks must be in [1, 1048576] when --system-share > 0";
    else if (cfg->turns < 1)
        bad = "--turns must be at least 1";
    else if (cfg->turns_max != 0 && cfg->turns_max < cfg->turns)
        bad = "--turns-max must be 0 or at least --turns";
    if (bad == NULL && synthetic) {
        if (cfg->sessions < 1)
            bad = "--sessions must be at least 1";
        else if (!(cfg->rate > 0.0 && cfg->rate <= 1e6))
            bad = "--rate must be in (0, 1e6] sessions per second";
        else if (!gen_share_ok(cfg->tool_share))
            bad = "--tool-share must be in [0, 1]";
        else if (cfg->tool_share > 0 && cfg->tool_turns < 1)
            bad = "--tool-turns must be at least 1 when --tool-share > 0";
        else if (cfg->first_tokens < 1 || cfg->user_tokens < 1 || cfg->tool_tokens < 1 ||
                 cfg->output_tokens < 1 || cfg->first_tokens > (1u << 24) ||
                 cfg->user_tokens > (1u << 24) || cfg->tool_tokens > (1u << 24) ||
                 cfg->output_tokens > (1u << 24))
            bad = "--first-tokens, --user-tokens, --tool-tokens and --output-tokens must be in "
                  "[1, 16777216]";
    }
    if (bad != NULL) {
        kvt_errf(err, errlen, "%s", bad);
        return -1;
    }
    if (!synthetic)
        return 0;
    /* the longest prompt and all blocks, bounded from above before building anything */
    double turns = cfg->turns_max > cfg->turns ? cfg->turns_max : cfg->turns;
    double chat =
        1.5 * cfg->first_tokens + (turns - 1) * 1.5 * (cfg->user_tokens + cfg->output_tokens);
    double tool = cfg->tool_share > 0
                      ? 1.5 * cfg->first_tokens +
                            (cfg->tool_turns - 1.0) * 1.5 * (cfg->tool_tokens + cfg->output_tokens)
                      : 0;
    double longest = (double)cfg->system_blocks * cfg->block_tokens + (chat > tool ? chat : tool);
    double most_turns = turns > cfg->tool_turns || cfg->tool_share <= 0 ? turns : cfg->tool_turns;
    if (longest > UINT32_MAX) {
        kvt_errf(err, errlen,
                 "prompts could outgrow 2^32-1 tokens: fewer turns or shorter messages");
        return -1;
    }
    if ((double)cfg->sessions * most_turns * (longest / cfg->block_tokens + 1) >
        (double)GEN_MAX_KEYS) {
        kvt_errf(err, errlen, "the trace could outgrow %llu blocks: fewer or shorter sessions",
                 (unsigned long long)GEN_MAX_KEYS);
        return -1;
    }
    return 0;
}

kvt_status_t kvt_gen_create(const kvt_gen_config_t *cfg, const kvt_trace_t *arrivals,
                            kvt_gen_t **g_p, char *err, size_t errlen)
{
    if (cfg == NULL || g_p == NULL) {
        kvt_errf(err, errlen, "kvt_gen_create: NULL argument");
        return KVT_ERR_INVAL;
    }
    if (gen_check(cfg, arrivals == NULL, err, errlen) != 0)
        return KVT_ERR_INVAL;
    gen_build_t b = {.cfg = cfg, .rng = cfg->seed ? cfg->seed : 1, .err = err, .errlen = errlen};
    kvt_gen_t *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        gen_oom(&b);
        return KVT_ERR_NO_MEM;
    }
    int rc = arrivals == NULL ? gen_synthetic(&b) : gen_from_arrivals(&b, arrivals);
    if (rc != 0 || gen_finish(&b, g) != 0)
        goto err_build;
    g->nsessions = b.nsessions;
    g->session_system = b.sess_system;
    g->session_tool = b.sess_tool;
    free(b.reqs);
    free(b.keys);
    *g_p = g;
    return KVT_OK;

err_build:
    free(b.reqs);
    free(b.keys);
    free(b.sess_system);
    free(b.sess_tool);
    kvt_gen_destroy(g);
    return b.st;
}

kvt_status_t kvt_gen_write(const kvt_gen_t *g, FILE *f, char *err, size_t errlen)
{
    if (g == NULL || f == NULL) {
        kvt_errf(err, errlen, "kvt_gen_write: NULL argument");
        return KVT_ERR_INVAL;
    }
    const kvt_trace_t *t = g->trace;
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *r = &t->reqs[i];
        fprintf(f,
                "{\"timestamp\": %" PRIu64 ", \"input_length\": %" PRIu32
                ", \"output_length\": %" PRIu32 ", \"hash_ids\": [",
                r->timestamp_ms, r->input_length, r->output_length);
        for (uint32_t k = 0; k < r->nblocks; k++) {
            if (k > 0)
                fputs(", ", f);
            fprintf(f, "%" PRIu64, r->hash_ids[k]);
        }
        fprintf(f, "], \"session_id\": \"s%" PRIu32 "\"}\n", g->req_session[i]);
    }
    if (fflush(f) != 0 || ferror(f)) {
        kvt_errf(err, errlen, "write error");
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

void kvt_gen_destroy(kvt_gen_t *g)
{
    if (g == NULL)
        return;
    kvt_trace_free(g->trace);
    free(g->req_session);
    free(g->req_turn);
    free(g->session_system);
    free(g->session_tool);
    free(g);
}
