#!/bin/sh
# Smoke test of `kvtier-bench index`, and short runs of `kvtier-bench rpc`, `events`, `json` and
# `tiers`.
# usage: test_bench_smoke.sh KVTIER_BENCH SOURCE_DIR
#
# tests/fixtures/mini_trace.jsonl, by hand (a block is a hit iff its hash id
# appeared in an earlier request; the ids are prefix-consistent, so that is
# also the longest prefix some pod holds):
#   req  hash_ids        blocks  hits
#   1    1 2 3           3       0
#   2    1 2 4           3       2   (1 2)
#   3    1 2 3 5         4       3   (1 2 3)
#   4    6 7             2       0
#   5    6 7 8           3       2   (6 7)
#   6    1               1       1
#   7    9 10 11 12      4       0
#   8    1 2 4 13        4       3   (1 2 4)
#   9    (none)          0       0
#   total                24      11  -> ideal hit ratio 11/24 = 0.458333
# Whatever the route, the query covers all pods, so hit_ratio must be 11/24.
# The file also has a blank line, keys in another order, unknown keys with
# nested values, and extra spaces around a line.
#
# Speed is never asserted.

BENCH=$1
SRC=$2
if [ -z "$BENCH" ] || [ -z "$SRC" ]; then
    echo "usage: $0 KVTIER_BENCH SOURCE_DIR" >&2
    exit 2
fi
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then
    echo "skip: $PY not found" >&2
    exit 77
fi
MINI=$SRC/tests/fixtures/mini_trace.jsonl
CONV=$SRC/../shared/traces/conversation_trace.jsonl

. "$(dirname "$0")/../support/bench_lib.sh"

# check_json FILE PYTHON_CONDITION...: the last line of FILE is a JSON object
# (bound to j) for which the condition holds.
check_json() {
    file=$1
    cond=$2
    if ! tail -n 1 "$file" | "$PY" -c '
import json, sys
j = json.loads(sys.stdin.read())
assert isinstance(j, dict) and j.get("bench") == "index", "not an index result"
ok = eval(sys.argv[1])
if not ok:
    print("condition failed: " + sys.argv[1], file=sys.stderr)
    print(json.dumps(j, sort_keys=True), file=sys.stderr)
    sys.exit(1)
' "$cond"; then
        return 1
    fi
    return 0
}

# ---- the mini trace, each route ----
for route in best spread rr; do
    out=$TMP/mini_$route.out
    "$BENCH" index --trace "$MINI" --pods 4 --route "$route" >"$out" 2>"$TMP/err"
    st=$?
    if [ "$st" -ne 0 ]; then
        fail "mini trace, route $route: exit status $st"
        cat "$TMP/err" "$out" >&2
        continue
    fi
    check_json "$out" "j['route'] == '$route' and j['pods'] == 4 and j['requests'] == 9 \
        and j['block_size'] == 16 and j['hit_blocks'] == 11 and j['total_blocks'] == 24 \
        and j['hit_ratio'] == j['ideal_hit_ratio'] and abs(j['hit_ratio'] - 11/24) < 1e-6 \
        and j['naive_hit_blocks'] == 11 and j['agree'] is True \
        and 0 < j['chosen_hit_ratio'] <= j['hit_ratio'] and j['entries'] > 0 \
        and j['bytes'] > 0 and j['ops_per_sec'] > 0 and j['naive_ops_per_sec'] > 0 \
        and j['lookup_p50_ns'] <= j['lookup_p99_ns'] and 'speedup_vs_naive' in j \
        and 'memory_ratio_vs_naive' in j" || fail "mini trace, route $route: bad JSON result"
    grep -q '^naive and kvtier agree$' "$out" || fail "mini trace, route $route: no agreement line"
    if [ -s "$TMP/err" ]; then
        fail "mini trace, route $route: unexpected stderr"
        cat "$TMP/err" >&2
    fi
done

# best routing always lands on a pod holding the longest prefix
check_json "$TMP/mini_best.out" "j['chosen_hit_ratio'] == j['hit_ratio']" ||
    fail "route best did not pick the longest match"
# rr: request k goes to pod (k-1) % 4; only request 6 (id 1) lands on a pod
# holding a prefix of it (pod 1, from request 2): 1 block of 24
check_json "$TMP/mini_rr.out" "abs(j['chosen_hit_ratio'] - 1/24) < 1e-6" ||
    fail "route rr: chosen hit ratio should be 1/24"

# one implementation at a time
for impl in kvtier naive; do
    out=$TMP/mini_$impl.out
    "$BENCH" index --trace "$MINI" --pods 3 --impl "$impl" --block-size 4 >"$out" 2>&1
    st=$?
    if [ "$st" -ne 0 ]; then
        fail "--impl $impl: exit status $st"
        cat "$out" >&2
        continue
    fi
    check_json "$out" "j['impl'] == '$impl' and j['hit_blocks'] == 11 and j['block_size'] == 4 \
        and ('naive_ops_per_sec' in j) == ('$impl' == 'naive') and 'speedup_vs_naive' not in j" ||
        fail "--impl $impl: bad JSON result"
done

# the floor replays kvtier's stores: same entries and blocks; with a budget it is not run
for impl in floor all; do
    out=$TMP/mini_$impl.out
    "$BENCH" index --trace "$MINI" --pods 3 --impl "$impl" --block-size 4 >"$out" 2>&1
    st=$?
    if [ "$st" -ne 0 ]; then
        fail "--impl $impl: exit status $st"
        cat "$out" >&2
        continue
    fi
    check_json "$out" "j['impl'] == 'kvtier' and j['floor_agree'] is True \
        and j['floor_events_per_sec'] > 0 and j['events_vs_floor'] > 0 \
        and ('naive_ops_per_sec' in j) == ('$impl' == 'all')" ||
        fail "--impl $impl: bad JSON result"
done
out=$TMP/mini_floor_budget.out
if "$BENCH" index --trace "$MINI" --pods 3 --impl floor --budget-bytes 64M >"$out" 2>&1; then
    check_json "$out" "'floor_events_per_sec' not in j" || fail "floor run under a budget"
    grep -q "floor not run" "$out" || fail "floor under a budget: no note"
else
    fail "--impl floor --budget-bytes 64M: exit status $?"
    cat "$out" >&2
fi

# several rounds: the best is reported, and the answers still agree
out=$TMP/mini_repeat.out
if "$BENCH" index --trace "$MINI" --pods 4 --repeat 2 >"$out" 2>&1; then
    check_json "$out" "j['repeat'] == 2 and j['hit_blocks'] == 11 and j['agree'] is True" ||
        fail "--repeat 2: bad JSON result"
else
    fail "--repeat 2: exit status $?"
    cat "$out" >&2
fi

# a budget: runs, and the naive model is not compared
out=$TMP/mini_budget.out
if "$BENCH" index --trace "$MINI" --pods 2 --budget-bytes 64M >"$out" 2>&1; then
    check_json "$out" "j['budget_bytes'] == 64 << 20 and 'agree' not in j" ||
        fail "--budget-bytes: bad JSON result"
else
    fail "--budget-bytes 64M: exit status $?"
    cat "$out" >&2
fi

# ---- the Mooncake conversation trace, when present ----
if [ -f "$CONV" ]; then
    out=$TMP/conv.out
    if "$BENCH" index --trace "$CONV" --pods 8 --route spread >"$out" 2>"$TMP/err"; then
        check_json "$out" "j['requests'] == 12031 and j['total_blocks'] == 288500 \
            and abs(j['hit_ratio'] - 0.3664) <= 0.0001 and j['hit_ratio'] == j['ideal_hit_ratio'] \
            and j['agree'] is True" || fail "conversation trace: bad JSON result"
    else
        fail "conversation trace: exit status $?"
        cat "$TMP/err" "$out" >&2
    fi
else
    echo "note: $CONV absent, conversation trace check skipped"
fi

# ---- bad options: one line on stderr, exit 2 ----
expect_exit 2 index
expect_exit 2 index --pods 4
expect_exit 2 index --trace "$MINI"
expect_exit 2 index --trace "$MINI" --pods 0
expect_exit 2 index --trace "$MINI" --pods -1
expect_exit 2 index --trace "$MINI" --pods 4x
expect_exit 2 index --trace "$MINI" --pods 99999999999999999999999
expect_exit 2 index --trace "$MINI" --pods 70000
expect_exit 2 index --trace "$MINI" --pods
expect_exit 2 index --trace "$MINI" --pods 4 --route fastest
expect_exit 2 index --trace "$MINI" --pods 4 --block-size abc
expect_exit 2 index --trace "$MINI" --pods 4 --block-size 0
expect_exit 2 index --trace "$MINI" --pods 4 --budget-bytes 12Q
expect_exit 2 index --trace "$MINI" --pods 4 --budget-bytes -5
expect_exit 2 index --trace "$MINI" --pods 4 --impl both2
expect_exit 2 index --trace "$MINI" --pods 4 --load-weight -1
expect_exit 2 index --trace "$MINI" --pods 4 --load-weight nan
expect_exit 2 index --trace "$MINI" --pods 4 --load-weight 1x
expect_exit 2 index --trace "$MINI" --pods 4 --repeat 0
expect_exit 2 index --trace "$MINI" --pods 4 --repeat 101
expect_exit 2 index --trace "$MINI" --pods 4 --repeat two
expect_exit 2 index --trace "$MINI" --pods 4 --frobnicate
expect_exit 2 index --trace "$MINI" --pods=4 --route=spread extra

# ---- trace errors: message, exit 1 ----
expect_exit 1 index --trace "$TMP/does-not-exist.jsonl" --pods 4
printf '%s\n%s\n' \
    '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}' \
    '{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1, -2]}' >"$TMP/bad.jsonl"
expect_exit 1 index --trace "$TMP/bad.jsonl" --pods 4
grep -q 'line 2:' "$TMP/err" || fail "malformed trace: message does not name line 2"
printf '%s\n' '{"timestamp": 0, "input_length": 1, "hash_ids": [1]}' >"$TMP/missing.jsonl"
expect_exit 1 index --trace "$TMP/missing.jsonl" --pods 4
grep -q 'output_length' "$TMP/err" || fail "missing key: message does not name it"
: >"$TMP/empty.jsonl"
expect_exit 1 index --trace "$TMP/empty.jsonl" --pods 4

# --help succeeds
"$BENCH" index --help >"$TMP/out" 2>&1 || fail "--help: exit status $?"
grep -q -- '--trace' "$TMP/out" || fail "--help: no usage text"

# ---- rpc: one short run against a real kvtierd (next to the bench) ----
# Every phase must have answered, without errors; no rate is asserted.
if "$BENCH" rpc --seconds 0.3 --prompts 8 --pods 4 --conns 2 --depth 8 --batch 4 \
    --http-conns 2 --no-redis >"$TMP/rpc" 2>"$TMP/err"; then
    tail -n 1 "$TMP/rpc" | "$PY" -c '
import json, os, sys
j = json.loads(sys.stdin.read())
assert j["bench"] == "rpc", j
assert j["errors"] == 0, j
for k in ("rpc_queries_per_sec", "rpc_half_load_per_sec", "http_queries_per_sec",
          "rpc_ceiling_per_sec", "rpc_vs_ceiling", "rpc_p99_us"):
    assert j[k] > 0, (k, j)
assert abs(j["rpc_vs_ceiling"] - j["rpc_queries_per_sec"] / j["rpc_ceiling_per_sec"]) < 0.01, j
# the in-process yardstick did the work of kvtierd: byte-equal answers
assert j["inproc_agree"] is True, j
assert j["inproc_us_per_query"] > 0 and j["rpc_bound_per_sec"] > 0, j
cores = os.sysconf("SC_NPROCESSORS_ONLN")
per = j["inproc_us_per_query"] + j["ceiling_server_cpu_us_per_query"] + \
    j["ceiling_client_cpu_us_per_query"]
assert abs(j["rpc_bound_per_sec"] - 1e6 * cores / per) <= 0.01 * j["rpc_bound_per_sec"] + 1, j
assert j["steal_pct"] == -1 or 0 <= j["steal_pct"] <= 100, j
' || fail "kvtier-bench rpc: bad JSON line: $(tail -n 1 "$TMP/rpc")"
else
    fail "kvtier-bench rpc: exit $?: $(cat "$TMP/err")"
fi

# ---- events: a short run of the ingest bench (a publisher process, a real kvtierd) ----
for form in "--form array --hash uint" "--form map --hash bytes"; do
    # shellcheck disable=SC2086
    if "$BENCH" events --blocks 20000 --cache-blocks 4096 $form >"$TMP/ev" 2>"$TMP/err"; then
        tail -n 1 "$TMP/ev" | "$PY" -c '
import json, sys
j = json.loads(sys.stdin.read())
assert j["bench"] == "events", j
assert j["errors"] == 0, j
assert j["block_events"] >= 20000 and j["batches"] > 0, j
for k in ("block_events_per_sec", "batches_per_sec", "inproc_block_events_per_sec"):
    assert j[k] > 0, (k, j)
assert abs(j["block_events_per_sec"] - j["block_events"] / j["seconds"]) <= 0.01 * j["block_events_per_sec"], j
assert abs(j["vs_inproc"] - j["block_events_per_sec"] / j["inproc_block_events_per_sec"]) < 0.01, j
' || fail "kvtier-bench events $form: bad JSON line: $(tail -n 1 "$TMP/ev")"
    else
        fail "kvtier-bench events $form: exit $?: $(cat "$TMP/err")"
    fi
done
expect_exit 2 events --blocks-per-event 7
grep -q "must divide" "$TMP/err" || fail "events: no reason for a bad --blocks-per-event"
# the other subcommands' tables (bench/kvtier_bench.c: kvt_bench_parse_args)
expect_exit 2 events --form xml
expect_exit 2 events --hash
expect_exit 2 events --blocks 10
expect_exit 2 events --kvtierd=
expect_exit 2 rpc --batch 64 --depth 8
expect_exit 2 rpc --conns 0
expect_exit 2 rpc --no-redis=1
expect_exit 2 rpc extra
expect_exit 2 hash --mib 0
expect_exit 2 hash --seconds nan
expect_exit 2 hash --frobnicate
# an option at most once; a value is never the next option; numbers are plain decimals
expect_exit 2 index --trace "$MINI" --pods 4 --pods 5
grep -q -- '--pods given twice' "$TMP/err" || fail "a repeated option: no reason"
expect_exit 2 index --trace "$MINI" --trace "$MINI" --pods 4
expect_exit 2 index --trace "$MINI" --pods 4 --route best --route=spread
expect_exit 2 rpc --no-redis --no-redis
expect_exit 2 latency --kvtierd --no-redis
grep -q -- "got option '--no-redis'" "$TMP/err" || fail "a value that is an option: no reason"
expect_exit 2 events --kvtierd=--blocks
expect_exit 2 index --pods 4 --trace --route best
expect_exit 2 hash --seconds 0x1p0
expect_exit 2 hash --seconds ' 1'
expect_exit 2 hash --seconds "$(printf '\t1')"
expect_exit 2 hash --seconds .
expect_exit 2 hash --seconds 1e
expect_exit 2 hash --seconds inf
expect_exit 2 index --trace "$MINI" --pods 4 --load-weight +1
expect_exit 2 latency --rates 0.5 --rates-per-sec 100
grep -q 'exclude each other' "$TMP/err" || fail "--rates with --rates-per-sec: no reason"
# plain decimals with a fraction or an exponent are numbers
for w in 0.5 .5 2 1e0 2.5E-1; do
    "$BENCH" index --trace "$MINI" --pods 2 --impl kvtier --load-weight "$w" >"$TMP/out" 2>&1 ||
        fail "--load-weight $w refused: $(cat "$TMP/out")"
done

# ---- json: short runs of kvtier's decoders against jansson ----
# The bench itself fails when the two sides extract different fields; here the JSON line
# must hold every figure, its ratios must follow from its times, and the probes must say
# what each parser does with a hash above 2^63 and with a repeated key.
for dups in reject keep; do
    if "$BENCH" json --seconds 0.05 --tokens 64 --events 2 --blocks 2 --jansson-dups "$dups" \
        >"$TMP/json" 2>"$TMP/err"; then
        tail -n 1 "$TMP/json" | "$PY" -c '
import json, sys
j = json.loads(sys.stdin.read())
assert j["bench"] == "json" and j["agree"] is True and j["stat"] == "best", j
assert j["jansson_dups"] == sys.argv[1] and j["rounds"] >= 3, j
for s in ("query", "events", "engine"):
    assert j[s + "_bytes"] > 0 and j[s + "_jansson_allocs"] > 0, (s, j)
    for w in ("", "_skip"):
        for k in ("kvtier_ns", "jansson_ns", "kvtier_mbps", "jansson_mbps", "speed_ratio"):
            assert j[s + w + "_" + k] > 0, (s + w + "_" + k, j)
        r = j[s + w + "_jansson_ns"] / j[s + w + "_kvtier_ns"]
        assert abs(j[s + w + "_speed_ratio"] - r) <= 0.01 * r + 0.001, (s + w, j)
        mb = j[s + "_bytes"] / j[s + w + "_kvtier_ns"] * 1e3
        assert abs(j[s + w + "_kvtier_mbps"] - mb) <= 0.01 * mb + 0.1, (s + w, j)
assert j["hash_above_2p63"] == {"kvtier": "exact", "jansson": "refused",
                                "jansson_as_real": "inexact"}, j
assert j["repeated_key"] == {"kvtier": "refused", "jansson": "last wins",
                             "jansson_reject": "refused"}, j
' "$dups" || fail "kvtier-bench json --jansson-dups $dups: bad JSON line: $(tail -n 1 "$TMP/json")"
        grep -q '^agree: ' "$TMP/json" || fail "kvtier-bench json: no agreement line"
    else
        fail "kvtier-bench json --jansson-dups $dups: exit $?: $(cat "$TMP/err")"
    fi
done
"$BENCH" json --help >"$TMP/out" 2>&1 || fail "json --help: exit status $?"
grep -q -- '--jansson-dups' "$TMP/out" || fail "json --help: no usage text"
expect_exit 2 json --seconds 0
expect_exit 2 json --seconds nan
expect_exit 2 json --tokens 0
expect_exit 2 json --tokens 131073
expect_exit 2 json --events 4097
expect_exit 2 json --blocks x
expect_exit 2 json --jansson-dups maybe
expect_exit 2 json --frobnicate
expect_exit 2 json extra

# ---- tiers: quick runs (tiny sizes) on a file system with O_DIRECT ----
# The bench keeps its files in a temp dir of its own under --dir and removes it. tmpfs has no
# O_DIRECT: then the build tree (next to the bench) holds them.
TDIR=$TMP
if [ "$(stat -f -c %T "$TMP" 2>/dev/null)" = tmpfs ]; then
    TDIR=$(cd "$(dirname "$BENCH")" && pwd)
fi
tiers_check() {
    tail -n 1 "$1" | "$PY" -c '
import json, sys
j = json.loads(sys.stdin.read())
assert j["bench"] == "tiers" and j["quick"] is True, j
assert j["block_bytes"] == 65536 and j["blocks"] == 16 and j["depth"] == 4, j
assert j["restore_blocks"] == 2000 and j["reload_blocks"] == 2, j
for k in ("ram_put_gbps", "ram_get_gbps", "memcpy_gbps", "disk_write_gbps", "disk_read_gbps",
          "restore_blocks_per_sec", "rocksdb_iter_per_sec", "restore_ms", "rocksdb_iter_ms"):
    assert j[k] > 0, (k, j)
fio = sys.argv[1]
assert j["fio"] == fio or (fio == "any" and j["fio"] in ("ok", "missing", "failed")), j
for k in ("fio_write_gbps", "fio_write_nosync_gbps", "fio_read_gbps"):
    assert (j[k] > 0) == (j["fio"] == "ok"), (k, j)
def near(a, b):
    return abs(a - b) <= 0.01 * abs(b) + 0.002
assert near(j["ram_put_vs_memcpy"], j["ram_put_gbps"] / j["memcpy_gbps"]), j
assert near(j["ram_get_vs_memcpy"], j["ram_get_gbps"] / j["memcpy_gbps"]), j
assert near(j["restore_vs_rocksdb"], j["restore_blocks_per_sec"] / j["rocksdb_iter_per_sec"]), j
for k, f in (("disk_write_vs_fio", "fio_write_gbps"), ("disk_read_vs_fio", "fio_read_gbps")):
    d = "disk_" + k.split("_")[1] + "_gbps"
    assert near(j[k], j[d] / j[f] if j[f] > 0 else 0), (k, j)
assert sorted(j["reload_us"], key=int) == [str(s << 10) for s in (256, 512, 1024, 2048, 4096)], j
assert all(v > 0 for v in j["reload_us"].values()), j
' "$2"
}
if "$BENCH" tiers --quick --dir "$TDIR" >"$TMP/tiers" 2>"$TMP/err"; then
    tiers_check "$TMP/tiers" any || fail "kvtier-bench tiers --quick: bad JSON line: $(tail -n 1 "$TMP/tiers")"
    if [ -s "$TMP/err" ]; then
        fail "kvtier-bench tiers --quick: unexpected stderr"
        cat "$TMP/err" >&2
    fi
    # without fio: a note, fio's figures 0, still a result
    if "$BENCH" tiers --quick --dir "$TDIR" --fio "$TMP/no-such-fio" >"$TMP/tiers" 2>"$TMP/err"; then
        tiers_check "$TMP/tiers" missing || fail "kvtier-bench tiers without fio: bad JSON line"
        grep -q "^note: .*no-such-fio not found" "$TMP/tiers" || fail "tiers without fio: no note"
    else
        fail "kvtier-bench tiers --fio (missing): exit $?: $(cat "$TMP/err")"
    fi
    ls -d "$TDIR"/kvtier-bench-tiers.* >/dev/null 2>&1 && fail "kvtier-bench tiers left its files"
elif grep -q -e "io_uring" -e "O_DIRECT" "$TMP/err"; then
    echo "note: kvtier-bench tiers not checked here: $(cat "$TMP/err")"
else
    fail "kvtier-bench tiers --quick: exit $?: $(cat "$TMP/err")"
fi
"$BENCH" tiers --help >"$TMP/out" 2>&1 || fail "tiers --help: exit status $?"
grep -q -- '--restore-blocks' "$TMP/out" || fail "tiers --help: no usage text"
expect_exit 1 tiers --quick --dir "$TMP/no-such-dir"
expect_exit 2 tiers --block-bytes 5000
expect_exit 2 tiers --block-bytes 0
expect_exit 2 tiers --blocks 0
expect_exit 2 tiers --blocks 2048
expect_exit 2 tiers --depth 0
expect_exit 2 tiers --depth 257
expect_exit 2 tiers --restore-blocks 1000001
expect_exit 2 tiers --dir=
expect_exit 2 tiers --quick --quick
expect_exit 2 tiers --frobnicate
expect_exit 2 tiers extra

# ---- connector: an engine's LOOKUP + PIN + UNPIN against PING through a real kvtierd ----
"$BENCH" connector --seconds 0.05 --blocks 8 --block-bytes 4096 >"$TMP/conn" 2>"$TMP/err" ||
    fail "kvtier-bench connector: $(cat "$TMP/err")"
/usr/bin/python3 - "$TMP/conn" <<'PY' || fail "kvtier-bench connector: bad JSON line: $(tail -n 1 "$TMP/conn")"
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert j["bench"] == "connector" and j["blocks"] == 8 and j["cycles"] >= 20, j
assert 0 < j["ping_p50_us"] <= j["ping_p99_us"] and 0 < j["cycle_p50_us"] <= j["cycle_p99_us"], j
assert abs(j["ratio_p50"] - j["cycle_p50_us"] / j["ping_p50_us"]) < 0.01, j
PY
expect_exit 2 connector --blocks 0
expect_exit 2 connector --block-bytes 100

finish bench_index_smoke
