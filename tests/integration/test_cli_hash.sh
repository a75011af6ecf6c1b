#!/bin/sh
# Black-box test of `kvtier hash`: output against the Python reference
# (tests/fixtures/hash_vectors.py), with and without --cache-salt, with --lora
# under --lora-keys dynamo (Dynamo's LoRA keys) and namespace, --tokens-file
# with a file and stdin, and the error contract (exit 2, one "kvtier: " line on
# stderr, nothing on stdout).
# Usage: test_cli_hash.sh path/to/kvtier     (exit 77 = skipped)
set -u

KVTIER=${1:?usage: test_cli_hash.sh path/to/kvtier}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
FIXTURE=$SRC/tests/fixtures/hash_vectors.py
PY=/usr/bin/python3

if [ ! -x "$KVTIER" ]; then
    echo "test_cli_hash: $KVTIER is not an executable" >&2
    exit 1
fi
if [ ! -x "$PY" ] || ! "$PY" "$FIXTURE" --check; then
    echo "test_cli_hash: SKIP: $PY with the xxhash module is needed" >&2
    exit 77
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt_cli_hash.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
failures=0
checks=0

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# same_as_python <block size> <seed or ""> <tokens> [extra kvtier args]
# Compares `kvtier hash` on --tokens with the fixture's JSON.
same_as_python() {
    bs=$1 seed=$2 toks=$3
    checks=$((checks + 1))
    if [ -n "$seed" ]; then
        want=$("$PY" "$FIXTURE" --block-size "$bs" --seed "$seed" --tokens "$toks") || {
            fail "fixture failed on bs=$bs"; return; }
        got=$("$KVTIER" hash --block-size "$bs" --seed "$seed" --tokens "$toks" 2>"$TMP/err")
    else
        want=$("$PY" "$FIXTURE" --block-size "$bs" --tokens "$toks") || {
            fail "fixture failed on bs=$bs"; return; }
        got=$("$KVTIER" hash --block-size "$bs" --tokens "$toks" 2>"$TMP/err")
    fi
    rc=$?
    if [ $rc -ne 0 ] || [ "$got" != "$want" ] || [ -s "$TMP/err" ]; then
        fail "bs=$bs seed=${seed:-default} tokens='$(printf '%.60s' "$toks")': rc=$rc"
        echo "  want: $(printf '%.200s' "$want")" >&2
        echo "  got:  $(printf '%.200s' "$got")" >&2
        sed 's/^/  stderr: /' "$TMP/err" >&2
    fi
}

# same_as_python_salted <block size> <salt> <tokens>: `kvtier hash --cache-salt` against
# the fixture's salted hashing.
same_as_python_salted() {
    bs=$1 salt=$2 toks=$3
    checks=$((checks + 1))
    want=$("$PY" "$FIXTURE" --block-size "$bs" --cache-salt "$salt" --tokens "$toks") || {
        fail "fixture failed on bs=$bs salt='$salt'"; return; }
    got=$("$KVTIER" hash --block-size "$bs" --cache-salt "$salt" --tokens "$toks" 2>"$TMP/err")
    rc=$?
    if [ $rc -ne 0 ] || [ "$got" != "$want" ] || [ -s "$TMP/err" ]; then
        fail "bs=$bs salt='$(printf '%.40s' "$salt")' tokens='$(printf '%.60s' "$toks")': rc=$rc"
        echo "  want: $(printf '%.200s' "$want")" >&2
        echo "  got:  $(printf '%.200s' "$got")" >&2
        sed 's/^/  stderr: /' "$TMP/err" >&2
    fi
}

# expect_output <expected stdout> <kvtier args...>: exit 0, exact stdout, empty stderr.
expect_output() {
    want=$1
    shift
    checks=$((checks + 1))
    got=$("$KVTIER" "$@" 2>"$TMP/err")
    rc=$?
    if [ $rc -ne 0 ] || [ "$got" != "$want" ] || [ -s "$TMP/err" ]; then
        fail "kvtier $*: rc=$rc"
        echo "  want: $(printf '%.200s' "$want")" >&2
        echo "  got:  $(printf '%.200s' "$got")" >&2
        sed 's/^/  stderr: /' "$TMP/err" >&2
    fi
}

# same_as_python_lora <block size> <lora> <salt> <tokens>: `kvtier hash --lora L
# --lora-keys dynamo [--cache-salt S]` against the fixture's Dynamo LoRA keys (--lora).
same_as_python_lora() {
    want=$("$PY" "$FIXTURE" --block-size "$1" --lora "$2" --cache-salt "$3" --tokens "$4") || {
        checks=$((checks + 1)); fail "fixture failed on bs=$1 lora='$2'"; return; }
    expect_output "$want" hash --block-size "$1" --lora "$2" --lora-keys dynamo \
        --cache-salt "$3" --tokens "$4"
}

# expect_usage_error <kvtier args...> (stdin from /dev/null unless redirected by caller)
expect_usage_error() {
    checks=$((checks + 1))
    "$KVTIER" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    lines=$(wc -l <"$TMP/err" | tr -d ' ')
    if [ $rc -ne 2 ]; then
        fail "kvtier $*: exit $rc, want 2"
    elif [ -s "$TMP/out" ]; then
        fail "kvtier $*: wrote to stdout: $(head -c 200 "$TMP/out")"
    elif [ "$lines" != 1 ]; then
        fail "kvtier $*: $lines stderr lines, want 1"
        sed 's/^/  stderr: /' "$TMP/err" >&2
    elif ! head -n 1 "$TMP/err" | grep -q '^kvtier: .'; then
        fail "kvtier $*: stderr does not start with 'kvtier: ': $(cat "$TMP/err")"
    elif [ "$(tail -c 1 "$TMP/err" | od -An -c | tr -d ' ')" != '\n' ]; then
        fail "kvtier $*: stderr line is not newline-terminated"
    fi
}

# ---- output matches the reference --------------------------------------------------------
same_as_python 1 "" "0,4294967295,1"
same_as_python 2 "" "1,2,3,4,5"
same_as_python 16 "" "$(seq -s, 1 48)"
same_as_python 16 "" "$(seq -s, 1 47)"
same_as_python 16 "" "$(seq -s, 1 15)"
same_as_python 16 "" ""
same_as_python 64 "" "$(seq -s, 1000 1200)"
same_as_python 512 "" "$(seq -s, 4294966000 4294967295)"
same_as_python 16 0 "$(seq -s, 0 31)"
same_as_python 16 18446744073709551615 "$(seq -s, 0 31)"
same_as_python 3 42 "7,8,9,10,11,12,13"
# A larger pseudo-random list (fixed LCG) at several block sizes.
"$PY" -c 'import random; r = random.Random(7); print(",".join(str(r.randrange(1 << 32)) for _ in range(5000)))' >"$TMP/rand.txt"
for bs in 1 7 16 32 64 128 512 1024 4999 5000 5001; do
    same_as_python "$bs" "" "$(cat "$TMP/rand.txt")"
done

# ---- --cache-salt: the salted chain against the reference ------------------------------
salt255=$(printf 'S%.0s' $(seq 1 255))
utf8_salt=$(printf 'm\303\274ller-\347\247\237\346\210\267')
for salt in tenant-a tenant-b x "$utf8_salt" "$salt255" "with space" "-"; do
    same_as_python_salted 2 "$salt" "1,2,3,4,5"
    same_as_python_salted 16 "$salt" "$(seq -s, 1 48)"
done
for bs in 1 7 16 64 512; do
    same_as_python_salted "$bs" tenant-a "$(cat "$TMP/rand.txt")"
done
same_as_python_salted 16 tenant-a "$(seq -s, 1 15)"
# The salt changes every key; the empty salt is no salt; another salt gives other keys.
plain=$("$KVTIER" hash --block-size 4 --tokens "$(seq -s, 1 32)")
salted_a=$("$KVTIER" hash --block-size 4 --cache-salt tenant-a --tokens "$(seq -s, 1 32)")
salted_b=$("$KVTIER" hash --block-size 4 --cache-salt tenant-b --tokens "$(seq -s, 1 32)")
checks=$((checks + 1))
"$PY" - "$plain" "$salted_a" "$salted_b" <<'PYEOF' || fail "salted keys are not pairwise different at every block"
import json, sys
p, a, b = (json.loads(x)["seq"] for x in sys.argv[1:4])
assert len(p) == len(a) == len(b) == 8
for i in range(8):
    assert len({p[i], a[i], b[i]}) == 3, i
PYEOF
expect_output "$plain" hash --block-size 4 --cache-salt "" --tokens "$(seq -s, 1 32)"
expect_output "$plain" hash --block-size 4 --cache-salt= --tokens "$(seq -s, 1 32)"
expect_output "$salted_a" hash --block-size 4 --cache-salt=tenant-a --tokens "$(seq -s, 1 32)"
expect_output "$salted_a" hash --block-size 4 --seed 1337 --cache-salt tenant-a --tokens "$(seq -s, 1 32)"
# docs/cli.md's example
expect_output '{"block_size":2,"local":[11278602352658511512,2662118915037317746],"seq":[11278602352658511512,441160891942885791]}' \
    hash --block-size 2 --cache-salt tenant-a --tokens 1,2,3,4,5

# ---- --lora with --lora-keys dynamo: Dynamo's LoRA keys against the reference -----------
utf8_lora=$(printf '\303\251t\303\251-\351\200\202\351\205\215')
lora255=$(printf 'L%.0s' $(seq 1 255))
for lora in adapter-a adapter-b L "$utf8_lora" "$lora255" "with space" "-"; do
    same_as_python_lora 4 "$lora" "" "$(seq -s, 1 12)"
    same_as_python_lora 16 "$lora" "" "$(seq -s, 1 48)"
    same_as_python_lora 4 "$lora" tenant-a "$(seq -s, 1 12)"
done
for bs in 1 7 16 64 512; do
    same_as_python_lora "$bs" adapter-a "" "$(cat "$TMP/rand.txt")"
    same_as_python_lora "$bs" adapter-a "$utf8_salt" "$(cat "$TMP/rand.txt")"
done
same_as_python_lora 16 adapter-a "" "$(seq -s, 1 15)"
# test_hash.c's pinned vector (tokens 1..12, block size 4, LoRA adapter-a) and docs/cli.md's
lora_a='{"block_size":4,"local":[11381080598872079209,5698110331184095209,10923852707342720619],"seq":[11381080598872079209,17518568667535815909,12857975441449519705]}'
expect_output "$lora_a" hash --block-size 4 --lora adapter-a --lora-keys dynamo --tokens 1,2,3,4,5,6,7,8,9,10,11,12
expect_output "$lora_a" hash --lora-keys=dynamo --lora=adapter-a --block-size 4 --seed 1337 --tokens 1,2,3,4,5,6,7,8,9,10,11,12
expect_output '{"block_size":4,"local":[11840579665246437583,5698110331184095209,10923852707342720619],"seq":[11840579665246437583,7561070985513423015,5613698272698325407]}' \
    hash --block-size 4 --lora adapter-a --lora-keys dynamo --cache-salt tenant-a --tokens 1,2,3,4,5,6,7,8,9,10,11,12
# No LoRA, or the default --lora-keys namespace: the LoRA does not change the keys.
base12=$("$KVTIER" hash --block-size 4 --tokens "$(seq -s, 1 12)")
base12_salted=$("$KVTIER" hash --block-size 4 --cache-salt tenant-a --tokens "$(seq -s, 1 12)")
expect_output "$base12" hash --block-size 4 --lora adapter-a --tokens "$(seq -s, 1 12)"
expect_output "$base12" hash --block-size 4 --lora adapter-a --lora-keys namespace --tokens "$(seq -s, 1 12)"
expect_output "$base12" hash --block-size 4 --lora "" --lora-keys dynamo --tokens "$(seq -s, 1 12)"
expect_output "$base12" hash --block-size 4 --lora-keys dynamo --tokens "$(seq -s, 1 12)"
expect_output "$base12_salted" hash --block-size 4 --lora adapter-a --cache-salt tenant-a --tokens "$(seq -s, 1 12)"
expect_output "$base12_salted" hash --block-size 4 --lora-keys dynamo --cache-salt tenant-a --tokens "$(seq -s, 1 12)"
# Under namespace keys a LoRA goes with any seed, as the base model does.
expect_output "$("$KVTIER" hash --block-size 4 --seed 5 --tokens "$(seq -s, 1 12)")" \
    hash --block-size 4 --seed 5 --lora adapter-a --tokens "$(seq -s, 1 12)"

# Exact expected output, frozen (computed by the fixture).
expect_output '{"block_size":2,"local":[10773075109927122010,2662118915037317746],"seq":[10773075109927122010,5890102321129957602]}' \
    hash --block-size 2 --tokens 1,2,3,4,5
expect_output '{"block_size":16,"local":[],"seq":[]}' hash --block-size 16 --tokens 1,2,3

# ---- option syntax and token list forms --------------------------------------------------
want=$("$PY" "$FIXTURE" --block-size 2 --tokens 1,2,3,4,5)
expect_output "$want" hash --block-size=2 --tokens=1,2,3,4,5
expect_output "$want" hash --tokens 1,2,3,4,5 --block-size 2
expect_output "$want" hash --block-size 2 --seed 1337 --tokens 1,2,3,4,5
expect_output "$want" hash --seed=1337 --block-size=2 --tokens '[1, 2, 3, 4, 5]'
expect_output "$want" hash --block-size 2 --tokens ' 1 2	3
4 5 '

# ---- --tokens-file: a file and stdin -----------------------------------------------------
printf '[1, 2,\n 3, 4,\n 5]\n' >"$TMP/toks.json"
expect_output "$want" hash --block-size 2 --tokens-file "$TMP/toks.json"
expect_output "$want" hash --block-size 2 --tokens-file="$TMP/toks.json"
checks=$((checks + 1))
got=$(printf '1 2 3 4 5\n' | "$KVTIER" hash --block-size 2 --tokens-file - 2>"$TMP/err")
[ $? -eq 0 ] && [ "$got" = "$want" ] && [ ! -s "$TMP/err" ] || fail "--tokens-file - (stdin): got '$got'"
want_rand=$("$PY" "$FIXTURE" --block-size 16 --tokens "$(cat "$TMP/rand.txt")")
expect_output "$want_rand" hash --block-size 16 --tokens-file "$TMP/rand.txt"
checks=$((checks + 1))
got=$("$KVTIER" hash --block-size 16 --tokens-file - <"$TMP/rand.txt" 2>"$TMP/err")
[ $? -eq 0 ] && [ "$got" = "$want_rand" ] || fail "--tokens-file - with a large stdin"
: >"$TMP/empty"
expect_output '{"block_size":4,"local":[],"seq":[]}' hash --block-size 4 --tokens-file "$TMP/empty"

# ---- help --------------------------------------------------------------------------------
for args in "--help" "help" "-h" "hash --help" "help hash"; do
    checks=$((checks + 1))
    # shellcheck disable=SC2086
    "$KVTIER" $args >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ $rc -ne 0 ] || ! grep -q 'usage: kvtier' "$TMP/out" || [ -s "$TMP/err" ]; then
        fail "kvtier $args: rc=$rc, want usage on stdout"
    fi
done

# ---- version: the project's, one line on stdout ----------------------------------------
checks=$((checks + 1))
want_version=$(sed -n 's/^project(kvtier VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
"$KVTIER" --version >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -ne 0 ] || [ -s "$TMP/err" ] || [ "$(wc -l <"$TMP/out")" -ne 1 ] ||
    ! grep -Eq "^kvtier $want_version \([^,]+, [^,]*, (gcc|clang) [0-9.]+\)\$" "$TMP/out"; then
    fail "kvtier --version: rc=$rc, got '$(cat "$TMP/out")', want version $want_version"
fi

# ---- every malformed input: exit 2, one 'kvtier: ' line, nothing on stdout ---------------
printf '1,2,,3' >"$TMP/bad.txt"
printf '1,2\0003' >"$TMP/nul.txt"
printf '1\n2\n4294967296\n' >"$TMP/big.txt"
mkdir "$TMP/dir"
expect_usage_error
expect_usage_error nosuchcommand
expect_usage_error --nosuchoption
expect_usage_error help nosuchcommand
expect_usage_error hash
expect_usage_error hash --tokens 1,2
expect_usage_error hash --block-size 2
expect_usage_error hash --block-size 2 --tokens 1 --tokens-file "$TMP/toks.json"
expect_usage_error hash --block-size 2 --tokens 1 --tokens 2
expect_usage_error hash --block-size 2 --block-size 2 --tokens 1
expect_usage_error hash --block-size 2 --seed 1 --seed=1 --tokens 1
expect_usage_error hash --block-size 2 --tokens 1 --bogus 3
expect_usage_error hash --block-size 2 --tokens 1 --bogus=3
expect_usage_error hash --block-size 2 --tokens 1 extra
expect_usage_error hash --block-size 2 --tokens 1 -x
expect_usage_error hash --block-size 2 --tokens
expect_usage_error hash --tokens 1 --block-size
for bs in 0 -1 +2 1048577 99999999999999999999 2x 0x10 "" " 2" 1.5; do
    expect_usage_error hash --block-size "$bs" --tokens 1,2
done
for seed in -1 18446744073709551616 abc "" 1e3 " 1"; do
    expect_usage_error hash --block-size 2 --seed "$seed" --tokens 1,2
done
expect_usage_error hash --block-size 2 --seed= --tokens 1,2
expect_usage_error hash --block-size 2 --cache-salt "${salt255}S" --tokens 1,2
expect_usage_error hash --block-size 2 --cache-salt a --cache-salt b --tokens 1,2
expect_usage_error hash --block-size 2 --cache-salt a --seed 5 --tokens 1,2
expect_usage_error hash --block-size 2 --seed 0 --cache-salt=a --tokens 1,2
expect_usage_error hash --block-size 2 --tokens 1,2 --cache-salt
expect_usage_error hash --block-size 2 --lora "${lora255}L" --tokens 1,2
expect_usage_error hash --block-size 2 --lora a --lora b --tokens 1,2
expect_usage_error hash --block-size 2 --lora a --lora-keys dynamo --lora-keys dynamo --tokens 1,2
for mode in "" Dynamo dyn namespace, "dynamo " none; do
    expect_usage_error hash --block-size 2 --lora a --lora-keys "$mode" --tokens 1,2
done
expect_usage_error hash --block-size 2 --lora a --lora-keys dynamo --seed 5 --tokens 1,2
expect_usage_error hash --block-size 2 --seed 0 --lora=a --lora-keys=dynamo --tokens 1,2
expect_usage_error hash --block-size 2 --tokens 1,2 --lora
expect_usage_error hash --block-size 2 --tokens 1,2 --lora-keys
for toks in "1,,2" "1,2," ",1" "-1" "+1" "0x10" "1.5" "4294967296" "[1,2" "1,2]" "[[1]]" "abc" "1;2" "1 a"; do
    expect_usage_error hash --block-size 2 --tokens "$toks"
done
expect_usage_error hash --block-size 2 --tokens-file "$TMP/bad.txt"
expect_usage_error hash --block-size 2 --tokens-file "$TMP/nul.txt"
expect_usage_error hash --block-size 2 --tokens-file "$TMP/big.txt"
expect_usage_error hash --block-size 2 --tokens-file "$TMP/does-not-exist"
expect_usage_error hash --block-size 2 --tokens-file "$TMP/dir"
expect_usage_error hash --block-size 2 --tokens-file "$TMP/new
line"
checks=$((checks + 1))
printf '1,x' | "$KVTIER" hash --block-size 2 --tokens-file - >"$TMP/out" 2>"$TMP/err"
rc=$?
[ $rc -eq 2 ] && [ ! -s "$TMP/out" ] && [ "$(wc -l <"$TMP/err" | tr -d ' ')" = 1 ] ||
    fail "bad list on stdin: rc=$rc"

if [ $failures -ne 0 ]; then
    echo "test_cli_hash: $failures of $checks checks failed" >&2
    exit 1
fi
echo "test_cli_hash: all $checks checks passed"
exit 0
