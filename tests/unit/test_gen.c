/*
 * bench/gen: the trace generator. Every structural promise of gen.h is
 * checked on the output itself: Mooncake's prefix rule (by a naive map from
 * id to its position and parent), turns extending their session's previous
 * prompt, shared system prompts and templates, tool loops, counts, lengths,
 * the JSONL written, determinism by seed, and --from-azure keeping the CSV's
 * arrivals and lengths.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/gen.h"
#include "bench/trace.h"
#include "tests/support/rng.h"

static kvt_gen_t *gen_ok(const kvt_gen_config_t *cfg, const kvt_trace_t *arrivals)
{
    kvt_gen_t *g = NULL;
    char err[256] = "";
    kvt_status_t st = kvt_gen_create(cfg, arrivals, &g, err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("kvt_gen_create: %s", err);
    return g;
}

/* The JSONL @g writes, malloc'ed, its length in *@len_p. */
static char *written(const kvt_gen_t *g, size_t *len_p)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    char err[128];
    assert_int_equal(kvt_gen_write(g, f, err, sizeof(err)), KVT_OK);
    long n = ftell(f);
    assert_true(n >= 0);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    rewind(f);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len_p = (size_t)n;
    return buf;
}

/*
 * Mooncake's rule, naively: an id names one prefix, so wherever it appears it
 * sits at the same position behind the same parent id. Also: ids are numbered
 * 0, 1, ... in order of first appearance, and each request has
 * ceil(input_length / bt) of them.
 */
static void check_mooncake_rule(const kvt_gen_t *g, uint32_t bt)
{
    const kvt_trace_t *t = g->trace;
    uint64_t n = g->distinct_blocks;
    uint32_t *pos = malloc((n ? n : 1) * sizeof(*pos));
    uint64_t *parent = malloc((n ? n : 1) * sizeof(*parent)); /* id + 1; 0: none */
    assert_non_null(pos);
    assert_non_null(parent);
    uint64_t next = 0;
    for (size_t i = 0; i < t->nreqs; i++) {
        const kvt_trace_req_t *r = &t->reqs[i];
        assert_int_equal(r->nblocks, ((uint64_t)r->input_length + bt - 1) / bt);
        for (uint32_t k = 0; k < r->nblocks; k++) {
            uint64_t id = r->hash_ids[k], par = k ? r->hash_ids[k - 1] + 1 : 0;
            assert_true(id <= next);
            if (id == next) {
                pos[id] = k;
                parent[id] = par;
                next++;
            } else if (pos[id] != k || parent[id] != par) {
                fail_msg("request %zu: id %" PRIu64 " at %" PRIu32 " after %" PRIu64
                         ", first seen at %" PRIu32 " after %" PRIu64,
                         i, id, k, par, pos[id], parent[id]);
            }
        }
    }
    assert_int_equal(next, n);
    free(pos);
    free(parent);
}

/* Leading ids @a and @b share. */
static uint32_t common_prefix(const kvt_trace_req_t *a, const kvt_trace_req_t *b)
{
    uint32_t k = 0;
    while (k < a->nblocks && k < b->nblocks && a->hash_ids[k] == b->hash_ids[k])
        k++;
    return k;
}

static void assert_within(uint64_t v, uint64_t mean)
{
    uint64_t lo = mean - mean / 2, hi = mean + mean / 2;
    if (v < (lo ? lo : 1) || v > hi)
        fail_msg("%" PRIu64 " outside [%" PRIu64 ", %" PRIu64 "]", v, lo, hi);
}

/* Per session, its requests' indices in time order: first[s] .. via next[i]; UINT32_MAX ends. */
typedef struct sessions {
    size_t *first, *last, *next;
    uint32_t *count;
} sessions_t;

static void sessions_index(const kvt_gen_t *g, sessions_t *s)
{
    size_t n = g->trace->nreqs;
    s->first = malloc((g->nsessions + 1) * sizeof(size_t));
    s->last = malloc((g->nsessions + 1) * sizeof(size_t));
    s->next = malloc((n + 1) * sizeof(size_t));
    s->count = calloc(g->nsessions + 1, sizeof(uint32_t));
    assert_true(s->first && s->last && s->next && s->count);
    for (size_t i = 0; i < n; i++) {
        uint32_t num = g->req_session[i];
        assert_true(num >= 1 && num <= g->nsessions);
        /* the turn numbers count up in time order */
        assert_int_equal(g->req_turn[i], s->count[num]);
        if (s->count[num]++ == 0)
            s->first[num] = i;
        else
            s->next[s->last[num]] = i;
        s->last[num] = i;
        s->next[i] = SIZE_MAX;
    }
}

static void sessions_free(sessions_t *s)
{
    free(s->first);
    free(s->last);
    free(s->next);
    free(s->count);
}

/* Properties every output has: sorted times, session names, the rule, the JSONL's round trip. */
static void check_common(const kvt_gen_t *g, uint32_t bt)
{
    const kvt_trace_t *t = g->trace;
    for (size_t i = 0; i < t->nreqs; i++) {
        char name[16];
        int n = snprintf(name, sizeof(name), "s%" PRIu32, g->req_session[i]);
        assert_int_equal(t->reqs[i].session, kvt_trace_session_id(name, (size_t)n));
        if (i > 0)
            assert_true(t->reqs[i - 1].timestamp_ms <= t->reqs[i].timestamp_ms);
    }
    check_mooncake_rule(g, bt);
    size_t len;
    char *text = written(g, &len);
    kvt_trace_t *back = NULL;
    char err[256] = "";
    assert_int_equal(kvt_trace_parse(text, len, &back, err, sizeof(err)), KVT_OK);
    assert_int_equal(back->nreqs, t->nreqs);
    assert_int_equal(back->nids, t->nids);
    for (size_t i = 0; i < t->nreqs; i++) {
        assert_int_equal(back->reqs[i].timestamp_ms, t->reqs[i].timestamp_ms);
        assert_int_equal(back->reqs[i].input_length, t->reqs[i].input_length);
        assert_int_equal(back->reqs[i].output_length, t->reqs[i].output_length);
        assert_int_equal(back->reqs[i].session, t->reqs[i].session);
    }
    assert_memory_equal(back->ids, t->ids, t->nids * sizeof(uint64_t));
    kvt_trace_free(back);
    free(text);
}

static kvt_gen_config_t small_config(void)
{
    kvt_gen_config_t c;
    kvt_gen_config_default(&c);
    c.sessions = 300;
    c.block_tokens = 64; /* many blocks from small lengths */
    c.first_tokens = 300;
    c.user_tokens = 100;
    c.tool_tokens = 40;
    c.output_tokens = 80;
    c.system_prompts = 3;
    c.system_blocks = 2;
    c.system_share = 0.5;
    c.tool_share = 0.3;
    c.turns = 3;
    c.tool_turns = 6;
    return c;
}

static void test_determinism(void **state)
{
    (void)state;
    kvt_gen_config_t c = small_config();
    c.seed = 42;
    kvt_gen_t *a = gen_ok(&c, NULL), *b = gen_ok(&c, NULL);
    size_t la, lb;
    char *ta = written(a, &la), *tb = written(b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(ta, tb, la);
    c.seed = 43;
    kvt_gen_t *d = gen_ok(&c, NULL);
    size_t ld;
    char *td = written(d, &ld);
    assert_true(ld != la || memcmp(ta, td, la) != 0);
    free(ta);
    free(tb);
    free(td);
    kvt_gen_destroy(a);
    kvt_gen_destroy(b);
    kvt_gen_destroy(d);
}

/* Turns, lengths, system prompts, tool loops and counts, as the config asks. */
static void test_structure(void **state)
{
    (void)state;
    kvt_gen_config_t c = small_config();
    kvt_gen_t *g = gen_ok(&c, NULL);
    const kvt_trace_t *t = g->trace;
    const uint32_t bt = c.block_tokens;
    check_common(g, bt);
    assert_int_equal(g->nsessions, c.sessions);
    sessions_t s;
    sessions_index(g, &s);
    uint32_t tools = 0, with_sys = 0;
    size_t total = 0;
    /* sys_first[k]: a request of a session with system prompt k (SIZE_MAX: none yet) */
    size_t sys_first[4] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    for (uint32_t num = 1; num <= g->nsessions; num++) {
        bool tool = g->session_tool[num - 1];
        uint32_t sys = g->session_system[num - 1];
        tools += tool;
        with_sys += sys != 0;
        assert_true(sys <= c.system_prompts);
        assert_int_equal(s.count[num], tool ? c.tool_turns : c.turns);
        total += s.count[num];
        const kvt_trace_req_t *r = &t->reqs[s.first[num]];
        /* the first prompt: the system prompt's blocks, then the first message */
        uint64_t sys_tokens = sys ? (uint64_t)c.system_blocks * bt : 0;
        assert_true(r->input_length > sys_tokens);
        assert_within(r->input_length - sys_tokens, c.first_tokens);
        if (sys != 0) {
            size_t o = sys_first[sys];
            if (o == SIZE_MAX)
                sys_first[sys] = s.first[num];
            else /* the same system prompt: the same leading blocks, and no more */
                assert_int_equal(common_prefix(r, &t->reqs[o]), c.system_blocks);
        }
        /* each turn re-sends the previous prompt and output, then new text */
        for (size_t i = s.first[num]; s.next[i] != SIZE_MAX; i = s.next[i]) {
            const kvt_trace_req_t *p = &t->reqs[i], *q = &t->reqs[s.next[i]];
            assert_true(q->timestamp_ms > p->timestamp_ms);
            assert_within(p->output_length, c.output_tokens);
            assert_true(q->input_length > (uint64_t)p->input_length + p->output_length);
            assert_within(q->input_length - p->input_length - p->output_length,
                          tool ? c.tool_tokens : c.user_tokens);
            assert_true(common_prefix(p, q) >= p->input_length / bt);
        }
    }
    assert_int_equal(total, t->nreqs);
    /* different system prompts share nothing; sessions without one share no block */
    for (uint32_t a = 1; a <= 3; a++)
        for (uint32_t b = a + 1; b <= 3; b++)
            if (sys_first[a] != SIZE_MAX && sys_first[b] != SIZE_MAX)
                assert_int_equal(common_prefix(&t->reqs[sys_first[a]], &t->reqs[sys_first[b]]), 0);
    for (uint32_t a = 1; a <= g->nsessions; a++) {
        if (g->session_system[a - 1] != 0)
            continue;
        for (uint32_t b = 1; b <= g->nsessions; b++)
            if (b != a)
                assert_int_equal(common_prefix(&t->reqs[s.first[a]], &t->reqs[s.first[b]]), 0);
    }
    /* the shares: 300 draws of p = 0.5 and 0.3 (6 standard deviations: about 52 and 48) */
    assert_in_range(with_sys, 150 - 52, 150 + 52);
    assert_in_range(tools, 90 - 48, 90 + 48);
    sessions_free(&s);
    kvt_gen_destroy(g);
}

/* --turns-max: chats take [turns, turns_max] turns; no system prompt, no tool loop. */
static void test_turn_range(void **state)
{
    (void)state;
    kvt_gen_config_t c = small_config();
    c.turns = 2;
    c.turns_max = 5;
    c.system_share = 0;
    c.tool_share = 0;
    kvt_gen_t *g = gen_ok(&c, NULL);
    check_common(g, c.block_tokens);
    sessions_t s;
    sessions_index(g, &s);
    uint32_t seen[6] = {0};
    for (uint32_t num = 1; num <= g->nsessions; num++) {
        assert_in_range(s.count[num], 2, 5);
        seen[s.count[num]]++;
        assert_int_equal(g->session_system[num - 1], 0);
        assert_int_equal(g->session_tool[num - 1], 0);
    }
    for (uint32_t k = 2; k <= 5; k++)
        assert_true(seen[k] > 0);
    sessions_free(&s);
    kvt_gen_destroy(g);
}

/* --prefix-share: the leading share of a first message's blocks is its group's template. */
static void test_prefix_share(void **state)
{
    (void)state;
    kvt_gen_config_t c = small_config();
    c.prefix_share = 0.5;
    c.tool_share = 0;
    kvt_gen_t *g = gen_ok(&c, NULL);
    const kvt_trace_t *t = g->trace;
    const uint32_t bt = c.block_tokens;
    check_common(g, bt);
    sessions_t s;
    sessions_index(g, &s);
    for (uint32_t a = 1; a <= g->nsessions; a++)
        for (uint32_t b = a + 1; b <= g->nsessions && b <= a + 20; b++) {
            const kvt_trace_req_t *ra = &t->reqs[s.first[a]], *rb = &t->reqs[s.first[b]];
            uint32_t sa = g->session_system[a - 1], sb = g->session_system[b - 1];
            uint32_t sys = sa ? c.system_blocks : 0;
            uint32_t ta = (uint32_t)(0.5 * ((ra->input_length - sys * bt) / bt));
            uint32_t tb = (uint32_t)(0.5 * ((rb->input_length - sys * bt) / bt));
            uint32_t want = sa == sb ? sys + (ta < tb ? ta : tb) : 0;
            /* at least the shared template; more only by way of it (own text is never shared) */
            assert_int_equal(common_prefix(ra, rb), want);
        }
    sessions_free(&s);
    kvt_gen_destroy(g);
}

/* Arrivals as the Azure CSV gives them: random times (with ties) and lengths. */
static kvt_trace_t *random_arrivals(size_t n)
{
    kvt_rng_t r;
    kvt_rng_init(&r, 18);
    kvt_trace_t *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    t->reqs = calloc(n, sizeof(*t->reqs));
    assert_non_null(t->reqs);
    t->nreqs = n;
    uint64_t ts = 0;
    for (size_t i = 0; i < n; i++) {
        ts += kvt_rng_below(&r, 3) ? kvt_rng_below(&r, 4000) : 0;
        t->reqs[i].timestamp_ms = ts;
        /* now and then one grows from a recent one, as a next turn would */
        if (i > 0 && kvt_rng_below(&r, 2))
            t->reqs[i].input_length =
                t->reqs[i - 1 - kvt_rng_below(&r, i < 5 ? i : 5)].input_length + 40 +
                (uint32_t)kvt_rng_below(&r, 900);
        else
            t->reqs[i].input_length = 1 + (uint32_t)kvt_rng_below(&r, 3000);
        t->reqs[i].output_length = (uint32_t)kvt_rng_below(&r, 60);
    }
    return t;
}

static void test_from_arrivals(void **state)
{
    (void)state;
    kvt_trace_t *arr = random_arrivals(1500);
    kvt_gen_config_t c;
    kvt_gen_config_default(&c);
    c.block_tokens = 128;
    c.turns = 4;
    c.turns_max = 6;
    c.sessions = 1; /* the synthetic options are not read */
    c.tool_share = 1.0;
    kvt_gen_t *g = gen_ok(&c, arr);
    const kvt_trace_t *t = g->trace;
    check_common(g, c.block_tokens);
    /* the arrivals' order, times and lengths, exactly */
    assert_int_equal(t->nreqs, arr->nreqs);
    for (size_t i = 0; i < t->nreqs; i++) {
        assert_int_equal(t->reqs[i].timestamp_ms, arr->reqs[i].timestamp_ms);
        assert_int_equal(t->reqs[i].input_length, arr->reqs[i].input_length);
        assert_int_equal(t->reqs[i].output_length, arr->reqs[i].output_length);
    }
    sessions_t s;
    sessions_index(g, &s);
    uint32_t multi = 0, with_sys = 0;
    for (uint32_t num = 1; num <= g->nsessions; num++) {
        assert_int_equal(g->session_tool[num - 1], 0);
        with_sys += g->session_system[num - 1] != 0;
        assert_in_range(s.count[num], 1, c.turns_max);
        multi += s.count[num] > 1;
        for (size_t i = s.first[num]; s.next[i] != SIZE_MAX; i = s.next[i]) {
            const kvt_trace_req_t *p = &t->reqs[i], *q = &t->reqs[s.next[i]];
            assert_true(q->timestamp_ms > p->timestamp_ms);
            assert_true(q->timestamp_ms - p->timestamp_ms <= c.idle_ms);
            assert_true(q->input_length >= (uint64_t)p->input_length + p->output_length);
            assert_true(common_prefix(p, q) >= p->input_length / c.block_tokens);
        }
    }
    assert_true(multi > 0);
    assert_true(with_sys > 0 && with_sys < g->nsessions);
    /* the same arrivals and seed: the same trace */
    kvt_gen_t *h = gen_ok(&c, arr);
    size_t la, lb;
    char *ta = written(g, &la), *tb = written(h, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(ta, tb, la);
    free(ta);
    free(tb);
    kvt_gen_destroy(h);
    sessions_free(&s);
    kvt_gen_destroy(g);
    kvt_trace_free(arr);
}

/* --turns 1: every arrival opens a session of its own. */
static void test_from_arrivals_single(void **state)
{
    (void)state;
    kvt_trace_t *arr = random_arrivals(200);
    kvt_gen_config_t c;
    kvt_gen_config_default(&c);
    c.turns = 1;
    c.system_share = 0;
    kvt_gen_t *g = gen_ok(&c, arr);
    check_common(g, c.block_tokens);
    assert_int_equal(g->nsessions, 200);
    /* no system prompt, no template: no request shares a block */
    assert_int_equal(g->distinct_blocks, g->trace->nids);
    kvt_gen_destroy(g);
    kvt_trace_free(arr);
}

static void test_bad_config(void **state)
{
    (void)state;
    kvt_gen_config_t d;
    kvt_gen_config_default(&d);
    kvt_gen_config_t c[20];
    const char *opt[20];
    size_t n = 0;
#define CASE(o, field, v)                                                                          \
    do {                                                                                           \
        c[n] = d;                                                                                  \
        c[n].field = v;                                                                            \
        opt[n++] = o;                                                                              \
    } while (0)
    CASE("--block-tokens", block_tokens, 0);
    CASE("--block-tokens", block_tokens, (1u << 20) + 1);
    CASE("--sessions", sessions, 0);
    CASE("--rate", rate, 0.0);
    CASE("--turns", turns, 0);
    CASE("--turns-max", turns_max, 2);
    CASE("--system-share", system_share, 1.5);
    CASE("--prefix-share", prefix_share, -0.1);
    CASE("--tool-share", tool_share, 2.0);
    CASE("--system-prompts", system_prompts, 0);
    CASE("--system-blocks", system_blocks, 0);
    CASE("--first-tokens", first_tokens, 0);
    CASE("--output-tokens", output_tokens, 1u << 25);
    CASE("--tool-turns", tool_turns, 0);
    CASE("2^32-1 tokens", turns, 1000);
    c[n - 1].user_tokens = 1u << 24;
    CASE("blocks", sessions, 100000000);
#undef CASE
    for (size_t i = 0; i < n; i++) {
        kvt_gen_t *g = NULL;
        char err[256] = "";
        kvt_status_t st = kvt_gen_create(&c[i], NULL, &g, err, sizeof(err));
        if (st != KVT_ERR_INVAL || g != NULL || strstr(err, opt[i]) == NULL)
            fail_msg("case %zu (%s): status %d, error '%s'", i, opt[i], (int)st, err);
    }
    kvt_gen_t *g = NULL;
    char err[64];
    assert_int_equal(kvt_gen_create(NULL, NULL, &g, err, sizeof(err)), KVT_ERR_INVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_determinism),   cmocka_unit_test(test_structure),
        cmocka_unit_test(test_turn_range),    cmocka_unit_test(test_prefix_share),
        cmocka_unit_test(test_from_arrivals), cmocka_unit_test(test_from_arrivals_single),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
