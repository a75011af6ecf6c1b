#!/bin/sh
# Installs a build tree into a temporary prefix and uses it the way a router
# would: a tiny C consumer built with pkg-config (shared and static) and with
# CMake's find_package(kvtier) (kvtier::kvtier and kvtier::kvtier_static), the
# installed CLI, and the Python binding (ctypes). No kvtierd is needed: the
# consumers hash a token list with the library and check that a call to a
# socket nobody listens on fails with a message.
# Usage: test_install.sh BUILD_DIR [CMAKE]      (exit 77 = skipped)
set -u

BUILD=${1:?usage: test_install.sh BUILD_DIR [CMAKE]}
CMAKE=${2:-cmake}
PY=/usr/bin/python3

for tool in "$CMAKE" pkg-config; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "test_install: SKIP: $tool not found" >&2
        exit 77
    fi
done
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    echo "test_install: $BUILD is not a CMake build tree" >&2
    exit 1
fi
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -n 1; }
CC=$(cache CMAKE_C_COMPILER)
[ -n "$CC" ] || CC=cc
SANFLAGS=
case "$(cache KVT_ASAN)" in ON | on | TRUE | true | 1) SANFLAGS="-fsanitize=address,undefined" ;; esac
case "$(cache KVT_TSAN)" in ON | on | TRUE | true | 1) SANFLAGS="-fsanitize=thread" ;; esac

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt_install.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
PREFIX=$TMP/prefix
NOSOCK="unix:$TMP/nobody-listens.sock"
failures=0
checks=0

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# run_ok <what> <command...>: the command must exit 0; its output is shown on failure.
run_ok() {
    what=$1
    shift
    checks=$((checks + 1))
    if ! "$@" >"$TMP/log" 2>&1; then
        fail "$what"
        sed 's/^/  | /' "$TMP/log" | tail -n 30 >&2
        return 1
    fi
    return 0
}

# ---- install --------------------------------------------------------------------------------
if ! run_ok "cmake --install $BUILD --prefix $PREFIX" "$CMAKE" --install "$BUILD" --prefix "$PREFIX"; then
    echo "test_install: install failed" >&2
    exit 1
fi
LIBDIR=$(dirname "$(find "$PREFIX" -name 'libkvtier.so.0' | head -n 1)")
for f in "$LIBDIR/libkvtier.so.0" "$LIBDIR/libkvtier.so" "$LIBDIR/libkvtier.a" \
    "$PREFIX/include/kvtier/client.h" "$PREFIX/include/kvtier/protocol.h" \
    "$PREFIX/include/kvtier/proto.h" "$PREFIX/include/kvtier/common/status.h" \
    "$PREFIX/include/kvtier/kvindex/hash.h" "$PREFIX/include/kvtier/kvindex/score.h" \
    "$LIBDIR/pkgconfig/kvtier.pc" "$LIBDIR/cmake/kvtier/kvtierConfig.cmake" \
    "$LIBDIR/cmake/kvtier/kvtierConfigVersion.cmake" "$PREFIX/bin/kvtier" \
    "$LIBDIR/kvtier/python/kvtier/__init__.py"; do
    checks=$((checks + 1))
    [ -e "$f" ] || fail "not installed: ${f#"$PREFIX"/}"
done
checks=$((checks + 1))
soname=$(readelf -d "$LIBDIR/libkvtier.so.0" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')
[ "$soname" = libkvtier.so.0 ] || fail "SONAME is '$soname', want libkvtier.so.0"

# ---- the consumer -------------------------------------------------------------------------------
cat >"$TMP/consumer.c" <<'EOF'
/* A router's first steps with libkvtier, without a server. */
#include <stdio.h>
#include <string.h>

#include <kvtier/client.h>
#include <kvtier/proto.h>
#include <kvtier/protocol.h>

#include "kvindex/score.h"

int main(int argc, char **argv)
{
    const uint32_t toks[5] = {1, 2, 3, 4, 5};
    uint64_t keys[2];
    kvt_client_opts_t o;
    kvt_client_t *c = NULL;
    kvt_score_weights_t w;
    int bad = 0;

    /* The hashing standard, in-process (values from docs/cli.md). */
    if (kvt_client_hash_tokens(toks, 5, 2, keys) != 2 || keys[0] != 10773075109927122010ull ||
        keys[1] != 5890102321129957602ull) {
        fprintf(stderr, "hash_tokens gave wrong keys\n");
        bad = 1;
    }
    kvt_score_weights_default(&w);
    if (w.gpu != 1.0) {
        fprintf(stderr, "score weights: gpu %g\n", w.gpu);
        bad = 1;
    }
    /* The codec: a header round trip. */
    uint8_t hdr[KVT_PROTO_HDR_SIZE];
    kvt_proto_hdr_t h = {KVT_PROTO_VERSION, KVT_PROTO_OP_PING, 0, 7, 0}, back;
    kvt_proto_hdr_encode(&h, hdr);
    if (kvt_proto_hdr_decode(hdr, KVT_PROTO_MAX_BODY_DEFAULT, &back) != KVT_OK || back.req_id != 7) {
        fprintf(stderr, "codec round trip failed\n");
        bad = 1;
    }
    /* A client for an address nobody listens on: created lazily, the call fails cleanly. */
    kvt_client_opts_default(&o);
    o.address = argc > 1 ? argv[1] : "unix:/nonexistent/kvtier.sock";
    o.lazy_connect = true;
    o.connect_timeout_ms = 200;
    if (kvt_client_create(&o, &c) != KVT_OK) {
        fprintf(stderr, "create failed\n");
        return 1;
    }
    kvt_status_t st = kvt_client_ping(c);
    if (st != KVT_ERR_IO || strstr(kvt_client_last_error(c), "connect") == NULL) {
        fprintf(stderr, "ping: status %d (%s), message '%s'\n", st, kvt_status_str(st),
                kvt_client_last_error(c));
        bad = 1;
    }
    kvt_client_destroy(c);
    printf("consumer ok: libkvtier %s\n", kvt_client_version());
    return bad;
}
EOF

export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
if run_ok "pkg-config --cflags --libs kvtier" pkg-config --cflags --libs kvtier; then
    PCFLAGS=$(pkg-config --cflags kvtier)
    PLIBS=$(pkg-config --libs kvtier)
    # shellcheck disable=SC2086
    run_ok "pkg-config consumer (shared) builds" \
        "$CC" $SANFLAGS -std=c11 -Wall -Wextra -Werror "$TMP/consumer.c" $PCFLAGS $PLIBS \
        -Wl,-rpath,"$LIBDIR" -o "$TMP/consumer_pc" &&
        run_ok "pkg-config consumer (shared) runs" "$TMP/consumer_pc" "$NOSOCK"
    checks=$((checks + 1))
    readelf -d "$TMP/consumer_pc" 2>/dev/null | grep -q 'NEEDED.*libkvtier.so.0' ||
        fail "consumer_pc does not load libkvtier.so.0"
    # Static: the archive plus what pkg-config --static adds (libxxhash).
    SLIBS=$(pkg-config --static --libs-only-l kvtier | sed 's/-lkvtier//')
    # shellcheck disable=SC2086
    run_ok "pkg-config consumer (static) builds" \
        "$CC" $SANFLAGS -std=c11 -Wall -Wextra -Werror "$TMP/consumer.c" $PCFLAGS \
        "$LIBDIR/libkvtier.a" $SLIBS -o "$TMP/consumer_static" &&
        run_ok "pkg-config consumer (static) runs" "$TMP/consumer_static" "$NOSOCK"
    checks=$((checks + 1))
    if readelf -d "$TMP/consumer_static" 2>/dev/null | grep -q 'NEEDED.*libkvtier'; then
        fail "consumer_static still needs libkvtier.so"
    fi
fi

# ---- CMake find_package --------------------------------------------------------------------------
mkdir -p "$TMP/cmake_consumer"
cp "$TMP/consumer.c" "$TMP/cmake_consumer/"
cat >"$TMP/cmake_consumer/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.21)
project(kvtier_consumer LANGUAGES C)
find_package(kvtier 0.1 REQUIRED)
add_executable(consumer_shared consumer.c)
target_link_libraries(consumer_shared PRIVATE kvtier::kvtier)
add_executable(consumer_static consumer.c)
target_link_libraries(consumer_static PRIVATE kvtier::kvtier_static)
foreach(t consumer_shared consumer_static)
  target_compile_options(\${t} PRIVATE -Wall -Wextra -Werror $SANFLAGS)
  target_link_options(\${t} PRIVATE $SANFLAGS)
endforeach()
EOF
GEN=
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
# shellcheck disable=SC2086
if run_ok "find_package(kvtier) configures" "$CMAKE" -S "$TMP/cmake_consumer" -B "$TMP/cmake_build" \
    $GEN -DCMAKE_C_COMPILER="$CC" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release &&
    run_ok "find_package(kvtier) consumers build" "$CMAKE" --build "$TMP/cmake_build"; then
    run_ok "kvtier::kvtier consumer runs" "$TMP/cmake_build/consumer_shared" "$NOSOCK"
    run_ok "kvtier::kvtier_static consumer runs" "$TMP/cmake_build/consumer_static" "$NOSOCK"
    checks=$((checks + 1))
    readelf -d "$TMP/cmake_build/consumer_shared" 2>/dev/null | grep -q 'NEEDED.*libkvtier.so.0' ||
        fail "kvtier::kvtier consumer does not load libkvtier.so.0"
fi

# ---- the installed CLI -----------------------------------------------------------------------------
KV=$PREFIX/bin/kvtier
checks=$((checks + 1))
out=$("$KV" hash --block-size 2 --tokens 1,2,3,4,5 2>&1)
[ "$out" = '{"block_size":2,"local":[10773075109927122010,2662118915037317746],"seq":[10773075109927122010,5890102321129957602]}' ] ||
    fail "installed kvtier hash: $out"
# expect_exit <code> <args...>: exit code, nothing on stdout, one "kvtier: " line on stderr.
expect_exit() {
    want=$1
    shift
    checks=$((checks + 1))
    "$KV" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    rc=$?
    if [ $rc -ne "$want" ] || [ -s "$TMP/out" ] || [ "$(wc -l <"$TMP/err" | tr -d ' ')" != 1 ] ||
        ! grep -q '^kvtier: ' "$TMP/err"; then
        fail "kvtier $*: exit $rc (want $want), stdout $(wc -c <"$TMP/out") bytes, stderr: $(cat "$TMP/err")"
    fi
}
expect_exit 1 query --addr "$NOSOCK" --model m --tokens 1,2,3 --timeout 200
expect_exit 1 stats --addr "$NOSOCK" --timeout 200
expect_exit 1 ping --addr "$NOSOCK" --timeout 200
echo '{"pod":"a","model":"m","events":[]}' >"$TMP/events.json"
expect_exit 1 events --addr "$NOSOCK" --timeout 200 "$TMP/events.json"
expect_exit 2 query --addr "$NOSOCK" --model m
expect_exit 2 query --addr "$NOSOCK" --tokens 1
expect_exit 2 query --addr "$NOSOCK" --model m --tokens 1 --keys 2
expect_exit 2 query --addr "$NOSOCK" --model m --keys 1,-2
expect_exit 2 query --addr "$NOSOCK" --model m --tokens 1 --pods a,,b
expect_exit 2 query --addr nohost --model m --tokens 1
expect_exit 2 query --addr 127.0.0.1:0 --model m --tokens 1
expect_exit 2 query --addr 127.0.0.1:7420 --model m --tokens 1 --timeout 0
expect_exit 2 events --addr "$NOSOCK"
expect_exit 2 events --addr "$NOSOCK" "$TMP/no-such-file.json"
expect_exit 2 stats --addr "$NOSOCK" extra
expect_exit 2 stats --bogus
checks=$((checks + 1))
KVTIER_ADDR=$NOSOCK "$KV" stats --timeout 200 >/dev/null 2>"$TMP/err"
grep -q "nobody-listens" "$TMP/err" || fail "KVTIER_ADDR not used: $(cat "$TMP/err")"
for sub in query events stats ping; do
    checks=$((checks + 1))
    "$KV" help "$sub" >"$TMP/out" 2>&1 && grep -q "usage: kvtier $sub" "$TMP/out" ||
        fail "kvtier help $sub"
done

# ---- the Python binding --------------------------------------------------------------------------
if [ -n "$SANFLAGS" ]; then
    echo "test_install: python binding not checked in a sanitizer build" >&2
elif [ ! -x "$PY" ]; then
    echo "test_install: python binding not checked: no $PY" >&2
else
    cat >"$TMP/use_binding.py" <<EOF
import sys
sys.path.insert(0, "$LIBDIR/kvtier/python")
import kvtier
assert kvtier.library_path().startswith("$PREFIX"), kvtier.library_path()
assert kvtier.hash_tokens([1, 2, 3, 4, 5], 2) == [10773075109927122010, 5890102321129957602]
c = kvtier.Client("$NOSOCK", timeout=0.2, lazy=True)
try:
    c.query("m", [1, 2, 3])
    raise SystemExit("query to nobody succeeded")
except kvtier.Error as e:
    assert e.status == -400 and "connect" in str(e), (e.status, str(e))
try:
    c.query("m", [-1])
    raise SystemExit("negative token accepted")
except ValueError:
    pass
c.close()
try:
    c.ping()
    raise SystemExit("closed client answered")
except kvtier.Error:
    pass
try:
    kvtier.Client("$NOSOCK", timeout=0.2)
    raise SystemExit("eager connect to nobody succeeded")
except kvtier.Error as e:
    assert e.status == -400, e.status
with kvtier.Client("$NOSOCK", lazy=True) as c2:
    assert "nobody-listens" in repr(c2)
try:
    kvtier.Client("no-port", lazy=True)
    raise SystemExit("bad address accepted")
except kvtier.Error as e:
    assert e.status == -100, e.status
print("python ok")
EOF
    run_ok "python binding (install tree lookup)" env -u KVTIER_LIB "$PY" "$TMP/use_binding.py"
fi

if [ $failures -ne 0 ]; then
    echo "test_install: $failures of $checks checks failed" >&2
    exit 1
fi
echo "test_install: all $checks checks passed"
exit 0
