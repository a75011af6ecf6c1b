/*
 * server/routes: the one route table. Its entries agree with each other and with the
 * protocol: every opcode and every documented path has one route, mutating calls need the
 * token on both front ends, routes of one call share one metrics label, and the lookups
 * find exactly the paths the table names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server/routes.h"

static const uint8_t ops[] = {
    KVT_PROTO_OP_HELLO,       KVT_PROTO_OP_PING,         KVT_PROTO_OP_QUERY,
    KVT_PROTO_OP_EVENTS,      KVT_PROTO_OP_ENGINE_DROP,  KVT_PROTO_OP_ENGINE_ADD,
    KVT_PROTO_OP_MODEL_DROP,  KVT_PROTO_OP_STATS,        KVT_PROTO_OP_ATTACH,
    KVT_PROTO_OP_LOOKUP,      KVT_PROTO_OP_RESERVE,      KVT_PROTO_OP_COMMIT,
    KVT_PROTO_OP_PIN,         KVT_PROTO_OP_UNPIN,        KVT_PROTO_OP_PREFETCH,
    KVT_PROTO_OP_BLOCK_PUT,   KVT_PROTO_OP_BLOCK_GET,    KVT_PROTO_OP_BLOCK_DELETE,
    KVT_PROTO_OP_ROUTED,      KVT_PROTO_OP_XFER_HELLO,   KVT_PROTO_OP_XFER_PIN,
    KVT_PROTO_OP_XFER_RENEW,  KVT_PROTO_OP_XFER_RELEASE, KVT_PROTO_OP_XFER_RESERVE,
    KVT_PROTO_OP_XFER_COMMIT, KVT_PROTO_OP_TRANSFER};

static void test_every_opcode_once(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(ops); i++) {
        const srv_route_t *r = srv_route_rpc(ops[i]);
        assert_non_null(r);
        assert_non_null(r->rpc);
        assert_int_equal(r->op, ops[i]);
        size_t n = 0;
        for (size_t k = 0; k < srv_nroutes; k++)
            n += srv_routes[k].op == ops[i];
        assert_int_equal(n, 1);
        /* the server asks for the token exactly where clients know a call mutates */
        assert_int_equal(r->auth, kvt_proto_op_mutating(ops[i]));
    }
    /* every route with an opcode is one of the protocol's */
    for (size_t k = 0; k < srv_nroutes; k++) {
        if (srv_routes[k].op == 0) {
            assert_null(srv_routes[k].rpc);
            continue;
        }
        assert_non_null(memchr(ops, srv_routes[k].op, sizeof(ops)));
    }
    assert_null(srv_route_rpc(0));
    assert_null(srv_route_rpc(0x7f));
    assert_null(srv_route_rpc(0xff));
}

static void test_routes_agree(void **state)
{
    (void)state;
    for (size_t i = 0; i < srv_nroutes; i++) {
        const srv_route_t *a = &srv_routes[i];
        assert_true(a->http != NULL || a->rpc != NULL);
        assert_int_equal(a->http != NULL, a->path != NULL);
        assert_int_equal(a->path_len, a->path ? strlen(a->path) : 0);
        assert_int_equal(a->path != NULL, a->method != KVT_HTTP_OTHER);
        if (a->name_what != NULL)
            assert_int_equal(a->path[strlen(a->path) - 1], '/');
        /* writes come from the API's users, and only with the token */
        if (a->writes)
            assert_true(a->auth);
        /* the probe reserve serves only GET probes */
        if (a->probe)
            assert_int_equal(a->method, KVT_HTTP_GET);
        assert_string_equal(a->label, srv_call_label(a->call));
        for (size_t k = i + 1; k < srv_nroutes; k++) {
            const srv_route_t *b = &srv_routes[k];
            if (a->path != NULL && b->path != NULL)
                assert_string_not_equal(a->path, b->path);
            /* one label per call, one call per label */
            assert_int_equal(a->call == b->call, strcmp(a->label, b->label) == 0);
        }
    }
    /* every call but CALL_OTHER has a route, so a label of its own */
    for (int c = 0; c < NCALLS; c++)
        if (c != CALL_OTHER)
            assert_string_not_equal(srv_call_label((enum srv_call)c), "other");
    assert_string_equal(srv_call_label(CALL_OTHER), "other");
    assert_string_equal(srv_call_label(CALL_QUERY), "query");
}

static const srv_route_t *http(const char *path)
{
    return srv_route_http(path, strlen(path));
}

static void test_http_lookup(void **state)
{
    (void)state;
    static const struct {
        const char *path;
        enum srv_call call;
        kvt_http_method_t method;
    } want[] = {
        {"/healthz", CALL_HEALTHZ, KVT_HTTP_GET},
        {"/readyz", CALL_READYZ, KVT_HTTP_GET},
        {"/metrics", CALL_METRICS, KVT_HTTP_GET},
        {"/v1/stats", CALL_STATS, KVT_HTTP_GET},
        {"/v1/query", CALL_QUERY, KVT_HTTP_POST},
        {"/v1/events", CALL_EVENTS, KVT_HTTP_POST},
        {"/v1/engines", CALL_ENGINES, KVT_HTTP_POST},
        {"/v1/engines/vllm-0", CALL_ENGINES, KVT_HTTP_DELETE},
        {"/v1/engines/", CALL_ENGINES, KVT_HTTP_DELETE}, /* the empty name: refused later */
        {"/v1/models/org%2Fmodel", CALL_MODELS, KVT_HTTP_DELETE},
        {"/v1/blocks/12", CALL_BLOCKS, SRV_ANY_METHOD}, /* PUT, GET, DELETE: the handler's */
        {"/v1/prefetch", CALL_PREFETCH, KVT_HTTP_POST},
        {"/v1/routed", CALL_ROUTED, KVT_HTTP_POST},
        {"/v1/transfer", CALL_TRANSFER, KVT_HTTP_POST},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const srv_route_t *r = http(want[i].path);
        if (r == NULL)
            fail_msg("%s: no route", want[i].path);
        assert_int_equal(r->call, want[i].call);
        assert_int_equal(r->method, want[i].method);
        assert_non_null(r->http);
    }
    assert_string_equal(http("/v1/engines/x")->name_what, "pod");
    assert_string_equal(http("/v1/models/x")->name_what, "model");
    assert_null(http("/v1/engines")->name_what);
    /* exact paths only, except a name route's prefix; RPC-only calls have no path */
    const char *none[] = {"/",          "/v1",       "/v1/",         "/healthzz",  "/v1/query/",
                          "/v1/querys", "/V1/query", "/v1/enginesX", "/v1/models", "/v1/stats/",
                          "/hello",     "/ping",     "/v1/blocks",   "",           "/v1/prefetch/x",
                          "/metrics/",  "/readyz?",  "/v1/events/x"};
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++)
        if (http(none[i]) != NULL)
            fail_msg("'%s' found a route", none[i]);
    /* lengths count, not NUL bytes: a prefix of a path is not that path */
    assert_null(srv_route_http("/v1/queryX", 9 + 1));
    assert_non_null(srv_route_http("/v1/queryX", 9));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_opcode_once),
        cmocka_unit_test(test_routes_agree),
        cmocka_unit_test(test_http_lookup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
