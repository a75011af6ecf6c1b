#!/bin/sh
# Installs a build tree into a temporary prefix and uses it the way a router
# would: a tiny C consumer built with pkg-config (shared and static) and with
# CMake's find_package(kvtier) (kvtier::kvtier, kvtier::kvtier_static and
# kvtier::index), the installed CLI, and the Python binding (ctypes). The
# consumers hash a token list with the library and check that a call to a
# socket nobody listens on fails with a message. Then the service: the
# installed kvtierd, its systemd unit (paths of this prefix; systemd-analyze
# verify where the tool exists) and the example config, which the installed
# kvtierd loads and starts with (listeners moved to 127.0.0.1:0, its data in
# the temp dir), answers GET /healthz, and exits 0 on SIGTERM; a reinstall
# keeps an edited config.
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
    "$PREFIX/include/kvtier/proto.h" "$PREFIX/include/kvtier/proto/proto_tier.h" \
    "$PREFIX/include/kvtier/proto/proto_xfer.h" \
    "$PREFIX/include/kvtier/common/status.h" \
    "$PREFIX/include/kvtier/kvindex/hash.h" "$PREFIX/include/kvtier/kvindex/score.h" \
    "$LIBDIR/pkgconfig/kvtier.pc" "$LIBDIR/cmake/kvtier/kvtierConfig.cmake" \
    "$LIBDIR/cmake/kvtier/kvtierConfigVersion.cmake" "$PREFIX/bin/kvtier" \
    "$LIBDIR/kvtier/python/kvtier/__init__.py" "$LIBDIR/libkvtier_index.a" \
    "$LIBDIR/pkgconfig/kvtier-index.pc" "$PREFIX/include/kvtier/kvindex/index.h" \
    "$PREFIX/include/kvtier/kvindex/tokens.h" "$PREFIX/bin/kvtierd" \
    "$PREFIX/lib/systemd/system/kvtierd.service" "$PREFIX/etc/kvtier/kvtierd.conf" \
    "$PREFIX/share/doc/kvtier/examples/kvtierd.conf" "$PREFIX/share/doc/kvtier/deployment.md"; do
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
    /* The tier data plane's codec comes with proto.h (kvtier/proto/proto_tier.h). */
    kvt_proto_wr_t wr;
    uint32_t done = 0;
    kvt_proto_wr_init(&wr);
    if (kvt_proto_count_ans_encode(&wr, KVT_PROTO_OP_UNPIN, 8, 3) != KVT_OK ||
        kvt_proto_count_ans_decode(wr.buf + KVT_PROTO_HDR_SIZE, wr.len - KVT_PROTO_HDR_SIZE, &done,
                                   NULL, 0) != KVT_OK ||
        done != 3) {
        fprintf(stderr, "tier codec round trip failed\n");
        bad = 1;
    }
    kvt_proto_wr_cleanup(&wr);
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
# kvtier::index: the index in-process (test_docs.py builds docs/quickstart.md's longer
# example with pkg-config).
cat >"$TMP/cmake_consumer/index_consumer.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>

#include "kvindex/hash.h"
#include "kvindex/index.h"
#include "kvindex/tokens.h"

int main(void)
{
    uint32_t *toks;
    size_t n;
    char err[128];
    if (kvt_tokens_parse("[1, 2, 3, 4, 5]", 15, &toks, &n, err, sizeof(err)) != KVT_OK || n != 5) {
        fprintf(stderr, "tokens: %s\n", err);
        return 1;
    }
    uint64_t keys[2];
    size_t nk = kvt_hash_seq(toks, n, 2, KVT_HASH_SEED, NULL, NULL, keys);
    free(toks);
    kvt_idx_t *idx;
    kvt_idx_reader_t *r;
    uint32_t ns, pod;
    const kvt_idx_match_t *m;
    size_t nm;
    if (nk != 2 || keys[1] != 5890102321129957602ull || kvt_idx_create(NULL, &idx) != KVT_OK ||
        kvt_idx_reader_create(idx, &r) != KVT_OK || kvt_idx_ns_get(idx, "m", NULL, 2, &ns) != KVT_OK ||
        kvt_idx_pod_get(idx, "p", 0, &pod) != KVT_OK ||
        kvt_idx_store(idx, ns, pod, KVT_TIER_CPU, NULL, keys, NULL, nk) != KVT_OK ||
        kvt_idx_query(r, ns, keys, nk, NULL, 0, &m, &nm) != KVT_OK || nm != 1 || m[0].cpu != 2) {
        fprintf(stderr, "index consumer failed\n");
        return 1;
    }
    kvt_idx_reader_destroy(r);
    kvt_idx_destroy(idx);
    printf("index consumer ok: %s\n", kvt_status_str(KVT_OK));
    return 0;
}
EOF
cat >"$TMP/cmake_consumer/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.21)
project(kvtier_consumer LANGUAGES C)
find_package(kvtier 0.1 REQUIRED)
add_executable(consumer_shared consumer.c)
target_link_libraries(consumer_shared PRIVATE kvtier::kvtier)
add_executable(consumer_static consumer.c)
target_link_libraries(consumer_static PRIVATE kvtier::kvtier_static)
add_executable(index_consumer index_consumer.c)
target_link_libraries(index_consumer PRIVATE kvtier::index)
foreach(t consumer_shared consumer_static index_consumer)
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
    run_ok "kvtier::index consumer runs" "$TMP/cmake_build/index_consumer"
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

# ---- the service: kvtierd, its systemd unit and the example config ---------------------------------
KVTIERD=$PREFIX/bin/kvtierd
UNIT=$PREFIX/lib/systemd/system/kvtierd.service
CONF=$PREFIX/etc/kvtier/kvtierd.conf
checks=$((checks + 1))
grep -qx "ExecStart=$KVTIERD --config $CONF" "$UNIT" ||
    fail "kvtierd.service: ExecStart is not '$KVTIERD --config $CONF': $(grep ExecStart "$UNIT")"
for want in DynamicUser=yes StateDirectory=kvtier RuntimeDirectory=kvtier Restart=on-failure \
    "WantedBy=multi-user.target"; do
    checks=$((checks + 1))
    grep -qx "$want" "$UNIT" || fail "kvtierd.service has no '$want'"
done
checks=$((checks + 1))
grep -q '^LimitNOFILE=[0-9]' "$UNIT" || fail "kvtierd.service has no LimitNOFILE"
checks=$((checks + 1))
cmp -s "$CONF" "$PREFIX/share/doc/kvtier/examples/kvtierd.conf" ||
    fail "the installed config differs from the example in share/doc/kvtier/examples"
if command -v systemd-analyze >/dev/null 2>&1; then
    # verify reports some mistakes (a bad value, "ignoring") only as a message: both count.
    checks=$((checks + 1))
    if ! systemd-analyze verify "$UNIT" >"$TMP/verify" 2>&1 || [ -s "$TMP/verify" ]; then
        fail "systemd-analyze verify kvtierd.service"
        sed 's/^/  | /' "$TMP/verify" >&2
    fi
else
    echo "test_install: systemd-analyze not found: the unit is not verified" >&2
fi
run_ok "installed kvtierd --config <installed example> --dump-config" \
    "$KVTIERD" --config "$CONF" --dump-config
checks=$((checks + 1))
grep -qx 'data-dir = /var/lib/kvtier' "$TMP/log" || fail "the example config's data-dir is not the unit's StateDirectory"

# Start the installed kvtierd with the installed config, listeners moved to ephemeral
# loopback ports and its data in the temp dir (flags override the file).
mkdir -p "$TMP/state"
"$KVTIERD" --config "$CONF" --http-listen 127.0.0.1:0 --rpc-listen 127.0.0.1:0 --rpc-unix "" \
    --data-dir "$TMP/state/data" >"$TMP/kvtierd.out" 2>"$TMP/kvtierd.log" &
KVTIERD_PID=$!
trap 'kill "$KVTIERD_PID" 2>/dev/null; rm -rf "$TMP"' EXIT INT TERM
tries=0
while ! grep -q '^kvtierd listening' "$TMP/kvtierd.out" && kill -0 "$KVTIERD_PID" 2>/dev/null &&
    [ $tries -lt 600 ]; do
    sleep 0.1
    tries=$((tries + 1))
done
HTTP_PORT=$(sed -n 's/^kvtierd listening http=\([0-9]*\) rpc=\([0-9]*\)$/\1/p' "$TMP/kvtierd.out")
RPC_PORT=$(sed -n 's/^kvtierd listening http=\([0-9]*\) rpc=\([0-9]*\)$/\2/p' "$TMP/kvtierd.out")
checks=$((checks + 1))
if [ -z "$HTTP_PORT" ] || [ -z "$RPC_PORT" ]; then
    fail "installed kvtierd did not start with the installed config"
    sed 's/^/  | /' "$TMP/kvtierd.out" "$TMP/kvtierd.log" >&2
else
    checks=$((checks + 1))
    if command -v curl >/dev/null 2>&1; then
        out=$(curl -s "http://127.0.0.1:$HTTP_PORT/healthz")
        [ "$out" = '{"status":"ok"}' ] || fail "GET /healthz answered '$out'"
    else
        out=$("$KV" ping --addr "127.0.0.1:$RPC_PORT" 2>&1)
        case "$out" in '{"ok":true,'*) ;; *) fail "kvtier ping: $out" ;; esac
    fi
    [ -d "$TMP/state/data" ] || fail "kvtierd did not create its --data-dir"
fi
kill -TERM "$KVTIERD_PID" 2>/dev/null
wait "$KVTIERD_PID"
rc=$?
checks=$((checks + 1))
if [ $rc -ne 0 ]; then
    fail "installed kvtierd exited $rc on SIGTERM (want 0)"
    sed 's/^/  | /' "$TMP/kvtierd.log" | tail -n 30 >&2
fi
trap 'rm -rf "$TMP"' EXIT INT TERM

# A reinstall keeps the admin's config (the example stays in share/doc).
echo "block-size = 32" >>"$CONF"
run_ok "cmake --install again" "$CMAKE" --install "$BUILD" --prefix "$PREFIX"
checks=$((checks + 1))
tail -n 1 "$CONF" | grep -qx 'block-size = 32' || fail "a reinstall overwrote the edited kvtierd.conf"

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
