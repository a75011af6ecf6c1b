#!/bin/sh
# Smoke test of `kvtier-bench latency`: a very short run against a real kvtierd
# (next to the bench) and a redis-server from PATH, checking the JSON line's
# shape and that the latencies are ordered; then kvtierd alone when the
# redis-server given does not exist, and bad options.
# usage: test_bench_latency.sh KVTIER_BENCH
#
# Speed is never asserted: every latency must be > 0 and p50 <= p99 <= p999
# <= max, each point must have answered without errors, and the ratios must be
# kvtierd's figure over redis's. Exit 77 (skip) without redis-server or
# /usr/bin/python3.

BENCH=$1
if [ -z "$BENCH" ]; then
    echo "usage: $0 KVTIER_BENCH" >&2
    exit 2
fi
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then
    echo "skip: $PY not found" >&2
    exit 77
fi
if ! command -v redis-server >/dev/null 2>&1; then
    echo "skip: redis-server not on PATH" >&2
    exit 77
fi

. "$(dirname "$0")/../support/bench_lib.sh"

# check FILE REDIS(True|False): the last line of FILE is the JSON of a run
# with one closed-loop point (1 connection) and one open-loop point.
check() {
    tail -n 1 "$1" | "$PY" -c '
import json, sys
j = json.loads(sys.stdin.read())
with_redis = sys.argv[1] == "True"
assert j["bench"] == "latency", j
assert j["redis_measured"] is with_redis, j
assert j["errors"] == 0, j
assert j["pool"] == 1 and j["base_per_sec"] > 0, j
pts = j["points"]
assert [p["mode"] for p in pts] == ["closed", "open"], pts
assert all(p["connections"] == 1 for p in pts), pts
# --max-others 100: no slice is measured again or counted as disturbed
assert all(p["retried"] == 0 and p["disturbed"] == 0 for p in pts), pts
assert abs(pts[1]["rate_per_sec"] - 0.5 * j["base_per_sec"]) <= 0.01 * j["base_per_sec"], pts[1]
assert pts[1]["fraction"] == 0.5, pts[1]
servers = ["kvtier", "redis"] if with_redis else ["kvtier"]
for p in pts:
    for s in servers:
        st = p[s]
        assert st["samples"] > 0 and st["per_sec"] > 0, (p["mode"], s, st)
        assert st["errors"] == 0 and st["lost"] == 0 and st["overloaded"] is False, (s, st)
        lat = [st["p50_us"], st["p99_us"], st["p999_us"], st["max_us"]]
        assert all(v > 0 for v in lat), (p["mode"], s, lat)
        assert lat == sorted(lat), (p["mode"], s, lat)
        assert st["server_cpu_us_per_req"] >= 0 and 0 <= st["others_cpu_pct"] <= 100, st
    if p["mode"] == "open":
        assert p["kvtier"]["lag_p99_us"] >= 0, p
    if with_redis:
        for q in ("p50", "p99", "p999", "max"):
            want = p["kvtier"][q + "_us"] / p["redis"][q + "_us"]
            assert abs(p["ratio"][q] - want) <= 0.002 * want + 0.001, (q, p)
    else:
        assert "redis" not in p and "ratio" not in p, p
if with_redis:
    worst = max(p["ratio"]["p99"] for p in pts)
    assert abs(j["worst_p99_ratio"] - worst) <= 0.002 * worst + 0.001, j
    assert j["within_1_5x"] == (j["worst_p99_ratio"] <= 1.5 and j["worst_p999_ratio"] <= 1.5), j
else:
    assert "redis-server" in j["redis_note"], j
' "$2"
}

SHORT="--seconds 0.2 --slices 2 --connections 1 --rates 0.5 --prompts 8 --pods 4 --max-others 100"

# ---- both servers ----
# shellcheck disable=SC2086
if "$BENCH" latency $SHORT >"$TMP/both" 2>"$TMP/err"; then
    check "$TMP/both" True || fail "kvtierd and redis: bad JSON line: $(tail -n 1 "$TMP/both")"
    grep -q '^closed, 1 conn ' "$TMP/both" || fail "kvtierd and redis: no closed-loop row"
    grep -q '^ *ratio ' "$TMP/both" || fail "kvtierd and redis: no ratio row"
else
    fail "kvtierd and redis: exit $?: $(cat "$TMP/err")"
fi

# ---- a redis-server that is not there: kvtierd alone, said so, exit 0 ----
# shellcheck disable=SC2086
if "$BENCH" latency $SHORT --redis-server "$TMP/no-redis-server" >"$TMP/alone" 2>"$TMP/err"; then
    check "$TMP/alone" False || fail "kvtierd alone: bad JSON line: $(tail -n 1 "$TMP/alone")"
    grep -q 'redis-server' "$TMP/err" || fail "kvtierd alone: stderr does not say why"
else
    fail "kvtierd alone: exit $?: $(cat "$TMP/err")"
fi

# ---- kvtierd's default worker count follows the CPUs it may run on ----
# (--workers 0: the bench passes none; on one allowed CPU kvtierd starts one worker)
if command -v taskset >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    if taskset -c 0 "$BENCH" latency $SHORT --workers 0 --no-redis >"$TMP/pinned" 2>"$TMP/err"; then
        tail -n 1 "$TMP/pinned" | "$PY" -c '
import json, sys
j = json.loads(sys.stdin.read())
assert j["workers"] == 1 and j["errors"] == 0, j
' || fail "kvtierd on one CPU: not one worker: $(tail -n 1 "$TMP/pinned")"
    else
        fail "kvtierd on one CPU: exit $?: $(cat "$TMP/err")"
    fi
else
    echo "note: taskset absent, the pinned worker count is not checked"
fi

# ---- bad options: one line on stderr, nothing on stdout, exit 2 ----
expect_exit 2 latency --seconds 0
expect_exit 2 latency --seconds abc
expect_exit 2 latency --connections 0
expect_exit 2 latency --connections 1,,4
expect_exit 2 latency --connections 1.5
expect_exit 2 latency --connections 1,2,3,4,5,6,7,8,9
expect_exit 2 latency --rates 0
expect_exit 2 latency --rates 0.5,
expect_exit 2 latency --rates-per-sec -5
expect_exit 2 latency --slices 0
expect_exit 2 latency --max-others 101
expect_exit 2 latency --retries 11
expect_exit 2 latency --workers
expect_exit 2 latency --no-redis --redis-server /usr/bin/redis-server
expect_exit 2 latency --frobnicate

"$BENCH" latency --help >"$TMP/out" 2>&1 || fail "--help: exit status $?"
grep -q -- '--rates-per-sec' "$TMP/out" || fail "--help: no usage text"

finish test_bench_latency
