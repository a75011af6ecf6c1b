/*
 * tests/support/sim_trace.h: tiny Mooncake traces built in memory, for the
 * bench/sim tests (header only; include after <cmocka.h>).
 */
#ifndef KVT_TESTS_SIM_TRACE_H
#define KVT_TESTS_SIM_TRACE_H

#include <stdio.h>
#include <stdlib.h>

#include "bench/trace.h"

/* A trace of @n requests; @reqs[i] lists request i's hash ids, ended by -1. */
static inline kvt_trace_t *test_sim_trace(const int *const *reqs, size_t n)
{
    size_t cap = 1, len = 0;
    for (size_t i = 0; i < n; i++)
        for (const int *h = reqs[i]; *h >= -1; h++) { /* 12 bytes per id, 96 per line */
            cap += *h >= 0 ? 12 : 96;
            if (*h < 0)
                break;
        }
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(buf + len, cap - len,
                                "{\"timestamp\": %zu, \"input_length\": 1, \"output_length\": 1, "
                                "\"hash_ids\": [",
                                i);
        for (const int *h = reqs[i]; *h >= 0; h++)
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", h == reqs[i] ? "" : ", ", *h);
        len += (size_t)snprintf(buf + len, cap - len, "]}\n");
        assert_true(len < cap);
    }
    kvt_trace_t *t = NULL;
    char err[128] = "";
    assert_int_equal(kvt_trace_parse(buf, len, &t, err, sizeof(err)), KVT_OK);
    free(buf);
    return t;
}

#endif
