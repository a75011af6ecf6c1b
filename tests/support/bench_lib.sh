# Shared by the kvtier-bench shell tests; sourced after BENCH is set.
# Gives TMP (removed on exit), fail, expect_exit and finish.

TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
FAILS=0

fail() {
    echo "FAIL: $*" >&2
    FAILS=$((FAILS + 1))
}

# expect_exit WANT SUBCOMMAND ARGS...: kvtier-bench SUBCOMMAND ARGS exits WANT,
# with one line on stderr (left in $TMP/err) and nothing on stdout.
expect_exit() {
    want=$1
    sub=$2
    shift 2
    "$BENCH" "$sub" "$@" >"$TMP/out" 2>"$TMP/err"
    got=$?
    if [ "$got" -ne "$want" ]; then
        fail "kvtier-bench $sub $*: exit $got, want $want"
        return
    fi
    lines=$(wc -l <"$TMP/err")
    if [ "$lines" -ne 1 ]; then
        fail "kvtier-bench $sub $*: $lines lines on stderr, want 1"
        cat "$TMP/err" >&2
    fi
    if [ -s "$TMP/out" ]; then
        fail "kvtier-bench $sub $*: wrote to stdout"
    fi
}

# finish NAME: the exit status of the test.
finish() {
    if [ "$FAILS" -ne 0 ]; then
        echo "$FAILS check(s) failed" >&2
        exit 1
    fi
    echo "$1: all checks passed"
    exit 0
}
