# Thin wrapper over the CMake presets (CMakePresets.json); every target is phony.
#   make / make build   install missing Debian packages, configure and build the release tree
#   make test           all tests (release), the unit tests again under ASan+UBSan, and the
#                       concurrency test under TSan
#   make bench          the benchmarks (hash, index, rpc, latency, events, json, tiers, transfer,
#                       replay); logs in build/bench/
#   make fuzz           every libFuzzer target for FUZZ_SECONDS on a copy of its seed corpus
#   make format         clang-format -i on every .c/.h outside build/
#   make clean          remove build/
#   make demo           build kvtier-bench and kvtierd, then the live replay of the conversation
#                       trace: 4 simulated engines publishing vLLM KV events to one index-role
#                       kvtierd, the routers' policies side by side (about 75 s at DEMO_SPEEDUP)
#   make run            install, build, then run kvtierd in the foreground on its defaults
#                       (HTTP 127.0.0.1:7421, RPC 127.0.0.1:7420; Ctrl-C stops it)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

CMAKE ?= cmake
CTEST ?= ctest
CLANG_FORMAT ?= clang-format
# Parallel build jobs; empty lets ninja choose (number of cores + 2).
JOBS ?=
TRACE ?= ../shared/traces/conversation_trace.jsonl
FUZZ_SECONDS ?= 60
# make demo: trace seconds per wall second (the trace spans 3,537 s) and the policies shown
DEMO_SPEEDUP ?= 200
DEMO_POLICIES ?= round-robin,least-loaded,prefix,cost

JOBS_FLAG := $(if $(JOBS),-j $(JOBS),)

.PHONY: all build deps configure run demo test test-asan bench fuzz format clean

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	$(CMAKE) --preset release

build: configure
	$(CMAKE) --build --preset release $(JOBS_FLAG)

# Extra daemon flags: make run ARGS="--log-level debug"
run: build
	exec build/bin/kvtierd $(ARGS)

# 4 engines, each caching 2% of the trace's distinct blocks (3,655), one kvtierd on ephemeral
# loopback ports in a temp dir (docs/benchmarks.md, "Live mode").
demo: configure
	$(CMAKE) --build --preset release $(JOBS_FLAG) --target kvtier-bench kvtierd
	build/bin/kvtier-bench replay --mode live --trace $(TRACE) --pods 4 --capacity-blocks 3655 \
	    --policy $(DEMO_POLICIES) --speedup $(DEMO_SPEEDUP)

# Release first (all tests), then the unit tests (named test_*) again under ASan+UBSan,
# then the one-writer/many-readers test under ThreadSanitizer; one recipe so the order
# holds under make -j too.
test: build
	$(CTEST) --preset release
	$(CMAKE) --preset asan
	$(CMAKE) --build --preset asan $(JOBS_FLAG)
	$(CTEST) --preset asan-unit
	$(CMAKE) --preset tsan
	$(CMAKE) --build --preset tsan $(JOBS_FLAG)
	$(CTEST) --preset tsan-concurrency

# Just the ASan+UBSan half of `make test`.
test-asan: deps
	$(CMAKE) --preset asan
	$(CMAKE) --build --preset asan $(JOBS_FLAG)
	$(CTEST) --preset asan-unit

bench: build
	mkdir -p build/bench
	build/bin/kvtier-bench hash | tee build/bench/hash.log
	build/bin/kvtier-bench index --trace $(TRACE) --pods 1000 --route spread \
	    | tee build/bench/index.log
	build/bin/kvtier-bench rpc --seconds 3 | tee build/bench/rpc.log
	build/bin/kvtier-bench latency | tee build/bench/latency.log
	build/bin/kvtier-bench events | tee build/bench/events.log
	build/bin/kvtier-bench json | tee build/bench/json.log
	build/bin/kvtier-bench tiers | tee build/bench/tiers.log
	build/bin/kvtier-bench transfer --tls tcp | tee build/bench/transfer.log
	build/bin/kvtier-bench transfer --tls shm | tee build/bench/transfer_shm.log
	build/bin/kvtier-bench connector | tee build/bench/connector.log
	build/bin/kvtier-bench replay --trace $(TRACE) --pods 8 --capacity-blocks 3655 \
	    --out build/bench/replay | tee build/bench/replay.log

# Each fuzzer runs on build/fuzz/corpus/<name>, seeded from tests/fuzz/corpus/<name>
# (or tests/fuzz/corpus/<name without fuzz_>), so the checked-in corpus never changes.
# Crash artifacts go to build/fuzz/artifacts/.  Fails if any fuzzer fails.
fuzz: deps
	$(CMAKE) --preset fuzz
	$(CMAKE) --build --preset fuzz $(JOBS_FLAG)
	@shopt -s nullglob; \
	fuzzers=(build/fuzz/bin/fuzz_*); \
	if (( $${#fuzzers[@]} == 0 )); then echo "fuzz: no build/fuzz/bin/fuzz_* targets" >&2; exit 1; fi; \
	mkdir -p build/fuzz/artifacts; failed=(); \
	for f in "$${fuzzers[@]}"; do \
	    [[ -x "$$f" ]] || continue; \
	    name=$${f##*/}; corpus=build/fuzz/corpus/$$name; mkdir -p "$$corpus"; \
	    for seed in tests/fuzz/corpus/$$name tests/fuzz/corpus/$${name#fuzz_}; do \
	        if [[ -d "$$seed" ]]; then cp -R "$$seed"/. "$$corpus"/; break; fi; \
	    done; \
	    echo "== $$name ($(FUZZ_SECONDS)s)"; \
	    "$$f" -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=build/fuzz/artifacts/$$name- "$$corpus" || failed+=("$$name"); \
	done; \
	if (( $${#failed[@]} )); then echo "fuzz: failed: $${failed[*]}" >&2; exit 1; fi; \
	echo "fuzz: all $${#fuzzers[@]} targets ran $(FUZZ_SECONDS)s without a finding"

format:
	find . \( -path ./build -o -path ./.git \) -prune -o \( -name '*.c' -o -name '*.h' \) -print0 \
	    | xargs -0 -r $(CLANG_FORMAT) -i

clean:
	rm -rf build
