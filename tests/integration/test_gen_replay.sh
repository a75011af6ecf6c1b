#!/bin/sh
# `kvtier-bench gen` then `kvtier-bench replay` on its output, small sizes:
# - the same seed writes the same bytes, another seed other bytes;
# - replay reads the sessions (the `session` policy is no longer round-robin),
#   its blocks and ideal ratio are gen's, the index agrees with the cache
#   model, and with one pod every policy hits the same;
# - --from-azure keeps the CSV's times and lengths, and `replay --trace F.csv`
#   is `replay` of `gen --from-azure F.csv` with the same seed;
# - bad options and bad CSV rows: one line on stderr, exit 2 or 1.
# usage: test_gen_replay.sh KVTIER_BENCH SOURCE_DIR
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
. "$(dirname "$0")/../support/bench_lib.sh"

# py CODE ARGS...: runs CODE (sys.argv[1:] = ARGS); its failure is a failed check.
py() {
    code=$1
    shift
    if ! "$PY" -c "import json, sys
$code" "$@"; then
        fail "check failed: $code"
    fi
}

# ---- gen: determinism ------------------------------------------------------------------------
GEN="gen --sessions 40 --turns 3 --tool-turns 5 --block-tokens 128 --first-tokens 400"
$BENCH $GEN --seed 7 --out "$TMP/a.jsonl" >"$TMP/a.out" 2>"$TMP/a.err" || fail "gen exited $?"
$BENCH $GEN --seed 7 --out "$TMP/b.jsonl" >/dev/null 2>&1 || fail "gen (again) exited $?"
$BENCH $GEN --seed 8 --out "$TMP/c.jsonl" >/dev/null 2>&1 || fail "gen --seed 8 exited $?"
cmp -s "$TMP/a.jsonl" "$TMP/b.jsonl" || fail "the same seed wrote different traces"
cmp -s "$TMP/a.jsonl" "$TMP/c.jsonl" && fail "seeds 7 and 8 wrote the same trace"
grep -q '^gen: .* requests, 40 sessions' "$TMP/a.err" || fail "no summary on stderr: $(cat "$TMP/a.err")"
$BENCH $GEN --seed 7 --out - 2>/dev/null | cmp -s - "$TMP/a.jsonl" || fail "--out - differs"
# every line: the four Mooncake keys, then the session; sorted by time
py '
lines = [json.loads(l) for l in open(sys.argv[1])]
assert all(list(l) == ["timestamp", "input_length", "output_length", "hash_ids", "session_id"]
           for l in lines)
ts = [l["timestamp"] for l in lines]
assert ts == sorted(ts)
assert len({l["session_id"] for l in lines}) == 40
assert all(len(l["hash_ids"]) == -(-l["input_length"] // 128) for l in lines)
' "$TMP/a.jsonl"

# ---- replay of the generated trace -----------------------------------------------------------
$BENCH replay --trace "$TMP/a.jsonl" --pods 4 --capacity-blocks 64 >"$TMP/r.out" 2>&1 ||
    fail "replay exited $?: $(tail -n 3 "$TMP/r.out")"
py '
g = json.loads(open(sys.argv[1]).read().splitlines()[-1])
r = json.loads(open(sys.argv[2]).read().splitlines()[-1])
res = {x["policy"]: x for x in r["results"]}
assert all(x["index_mismatch"] == 0 for x in res.values()), res
assert all(x["total_blocks"] == g["total_blocks"] for x in res.values()), (g, res)
assert abs(r["ideal_hit_ratio"] - g["ideal_hit_ratio"]) < 1e-6, (g, r)
# sticky sessions: no longer the round-robin fallback
assert res["session"]["hit_blocks"] != res["round-robin"]["hit_blocks"], res
' "$TMP/a.out" "$TMP/r.out"
$BENCH replay --trace "$TMP/a.jsonl" --pods 1 --capacity-blocks 64 >"$TMP/r1.out" 2>&1 ||
    fail "replay --pods 1 exited $?"
py '
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert len({x["hit_blocks"] for x in r["results"]}) == 1, r
' "$TMP/r1.out"

# ---- --from-azure --------------------------------------------------------------------------------
AZURE=$SRC/../shared/traces/AzureLLMInferenceTrace_code.csv
if [ -r "$AZURE" ]; then
    head -n 301 "$AZURE" >"$TMP/az.csv"
else
    printf 'TIMESTAMP,ContextTokens,GeneratedTokens\r\n' >"$TMP/az.csv"
    for i in 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29; do
        printf '2023-11-16 18:17:%s.500000,%s,%s\r\n' "$i" "$((i * 97))" "$((i % 7))" >>"$TMP/az.csv"
    done
fi
$BENCH gen --from-azure "$TMP/az.csv" --seed 3 --out "$TMP/az.jsonl" >/dev/null 2>"$TMP/az.err" ||
    fail "gen --from-azure exited $?: $(cat "$TMP/az.err")"
py '
import datetime
rows = [l.strip().split(",") for l in open(sys.argv[1])][1:]
t0 = datetime.datetime.fromisoformat(rows[0][0][:26])
lines = [json.loads(l) for l in open(sys.argv[2])]
assert len(lines) == len(rows), (len(lines), len(rows))
for r, l in zip(rows, lines):
    ms = (datetime.datetime.fromisoformat(r[0][:26]) - t0) // datetime.timedelta(milliseconds=1)
    assert (l["timestamp"], l["input_length"], l["output_length"]) == (ms, int(r[1]), int(r[2])), (r, l)
    assert len(l["hash_ids"]) == -(-l["input_length"] // 512), l
' "$TMP/az.csv" "$TMP/az.jsonl"
$BENCH replay --trace "$TMP/az.csv" --seed 3 --pods 4 --capacity-blocks 100 >"$TMP/rc.out" 2>&1 ||
    fail "replay --trace .csv exited $?: $(tail -n 3 "$TMP/rc.out")"
$BENCH replay --trace "$TMP/az.jsonl" --seed 3 --pods 4 --capacity-blocks 100 >"$TMP/rj.out" 2>&1 ||
    fail "replay of gen --from-azure exited $?"
py '
a = json.loads(open(sys.argv[1]).read().splitlines()[-1])
b = json.loads(open(sys.argv[2]).read().splitlines()[-1])
assert a == b, (a, b)
' "$TMP/rc.out" "$TMP/rj.out"

# ---- errors --------------------------------------------------------------------------------------
expect_exit 2 gen --sessions 3
expect_exit 2 gen --out "$TMP/x.jsonl" --sessions 0
expect_exit 2 gen --out "$TMP/x.jsonl" --turns 3 --turns-max 2
expect_exit 2 gen --out "$TMP/x.jsonl" --system-share 1.5
expect_exit 2 gen --out "$TMP/x.jsonl" --idle-ms 5
expect_exit 2 gen --out "$TMP/x.jsonl" --from-azure "$TMP/az.csv" --sessions 5
grep -q -- "--sessions does not apply with --from-azure" "$TMP/err" || fail "$(cat "$TMP/err")"
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,2\n2023-11-16 18:17:04,1\n' \
    >"$TMP/bad.csv"
expect_exit 1 gen --out "$TMP/x.jsonl" --from-azure "$TMP/bad.csv"
grep -q "bad.csv: line 3: " "$TMP/err" || fail "no line number: $(cat "$TMP/err")"
[ -e "$TMP/x.jsonl" ] && fail "gen wrote a trace from a bad CSV"
expect_exit 1 replay --trace "$TMP/bad.csv"
grep -q "bad.csv: line 3: " "$TMP/err" || fail "no line number: $(cat "$TMP/err")"
printf '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0], "session_id": [1]}\n' \
    >"$TMP/bad.jsonl"
expect_exit 1 replay --trace "$TMP/bad.jsonl"
grep -q "bad.jsonl: line 1: session_id" "$TMP/err" || fail "$(cat "$TMP/err")"

finish test_gen_replay
