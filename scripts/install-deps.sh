#!/usr/bin/env bash
# Installs the Debian packages kvtier needs to build and test; idempotent.
# Only packages that dpkg reports as not installed are fetched, so a machine
# that already has everything is left untouched (no apt-get update, no root).
set -euo pipefail

packages=(
    build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
    liburing-dev libxxhash-dev libucx-dev librocksdb-dev libevent-dev libzmq3-dev
    libmsgpack-dev libcmocka-dev
    # jansson: only kvtier-bench links it: `json` as the yardstick for kvtier's own JSON
    # reader (docs/architecture.md, "JSON: own parser or jansson"), `tiers` for fio's
    # report; kvtierd does not.
    libjansson-dev
    python3 python3-zmq python3-msgpack python3-xxhash
    fio ucx-utils redis-server redis-tools
    # gnuplot: `kvtier-bench replay --out DIR` draws its plots with it (bench/plot.c)
    gnuplot-nox
)

die() {
    echo "install-deps: error: $*" >&2
    exit 1
}

command -v dpkg-query >/dev/null 2>&1 ||
    die "dpkg-query not found; kvtier expects Debian 12 (install the packages listed in $0 by hand)"

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
    # "ii " means installed and configured; anything else counts as missing.
    if [[ "$status" != ii* ]]; then
        missing+=("$pkg")
    fi
done

if ((${#missing[@]} == 0)); then
    echo "install-deps: all ${#packages[@]} packages are installed"
    exit 0
fi

echo "install-deps: missing: ${missing[*]}"

sudo=()
if ((EUID != 0)); then
    command -v sudo >/dev/null 2>&1 ||
        die "not root and sudo is not available; as root run: apt-get install -y ${missing[*]}"
    sudo=(sudo)
fi
command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install by hand: ${missing[*]}"

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update ||
    die "apt-get update failed (is a Debian mirror reachable?)"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}" ||
    die "apt-get install failed for: ${missing[*]}"

echo "install-deps: installed: ${missing[*]}"
