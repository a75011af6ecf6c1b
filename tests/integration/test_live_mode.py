#!/usr/bin/python3
"""`kvtier-bench replay --mode live` against a real kvtierd on ephemeral ports.

usage: test_live_mode.py KVTIER_BENCH KVTIERD SOURCE_DIR

On the first 300 requests of the conversation trace (exit 77 when it is absent):
 - every policy, 2 engines, every 7th batch of each engine kept off its PUB (the
   daemon must ask the engine's replay socket): the JSON fields, each policy's hit
   ratio within [0, ideal], no state dropped, and the daemon's final view of each
   engine equal to the engine's cache (the bench's own check, and here again: the
   daemon's entries per engine equal the dumped blocks, each found by a query);
 - one engine: live mode's hits equal cache mode's, request by request (the cache
   model does not depend on timing);
 - the bench starting its own kvtierd (--kvtierd).
No wall-time assertion; the daemon is stopped on every path.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

BENCH, KVTIERD, SRC = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_fixture import Daemon  # noqa: E402

FIELDS = ("policy", "hit_ratio", "ideal_hit_ratio", "load_imbalance", "hit_blocks",
          "total_blocks", "ttft_p50_ms", "ttft_p99_ms", "query_p50_us", "query_p99_us",
          "stale_requests", "stale_ratio", "final_view_mismatch")
POLICIES = ("random", "round-robin", "least-loaded", "session", "prefix", "cost",
            "approx-prefix")


def trace_path():
    for d in (os.environ.get("KVT_TRACES"), os.path.join(SRC, "..", "shared", "traces"),
              os.path.join(SRC, "..", "..", "shared", "traces")):
        if d and os.path.exists(os.path.join(d, "conversation_trace.jsonl")):
            return os.path.join(d, "conversation_trace.jsonl")
    print("skip: conversation_trace.jsonl not found")
    sys.exit(77)


def bench(*args):
    p = subprocess.run([BENCH, "replay", *args], capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        raise AssertionError(f"replay {args}: rc {p.returncode}\n{p.stdout}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def results(j):
    return j["results"] if "results" in j else [j]


def per_request(path):
    out = {}
    with open(path) as f:
        for line in f:
            w = line.split()
            out.setdefault(w[0], []).append((int(w[2]), int(w[3]), int(w[4])))
    return out


def check_fields(j, pods):
    for r in results(j):
        missing = [f for f in FIELDS if f not in r]
        assert not missing, (r["policy"], missing)
        assert 0 <= r["hit_blocks"] <= r["total_blocks"], r
        assert -1e-9 <= r["hit_ratio"] <= r["ideal_hit_ratio"] + 1e-9, r
        assert r["final_view_mismatch"] == 0, r
        assert r["state_drops"] == 0, r
        assert r["ttft_p50_ms"] <= r["ttft_p99_ms"], r
        assert 0 < r["query_p50_us"] <= r["query_p99_us"], r
        assert r["held_blocks"] <= pods * j["capacity_blocks"], r


def check_view(d, dump):
    """The daemon's entries of each engine are exactly the blocks the bench dumped."""
    engines = {e["pod"]: e["entries"] for e in d.stats()["engines"]}
    n = 0
    with open(dump) as f:
        for line in f:
            model, pod, *keys = line.split()
            assert engines.get(pod, 0) == len(keys), (pod, engines.get(pod), len(keys))
            for k in keys:
                s, ans = d.http("POST", "/v1/query",
                                {"model": model, "block_hashes": [int(k)], "pods": [pod]})
                assert s == 200, (s, ans)
                assert [p["matched_blocks"] for p in ans["pods"]] == [1], (pod, k, ans)
                n += 1
    return n


def main():
    src = trace_path()
    with tempfile.TemporaryDirectory(prefix="kvt_live_") as tmp:
        trace = os.path.join(tmp, "slice.jsonl")
        with open(src) as f, open(trace, "w") as out:
            for _, line in zip(range(300), f):
                out.write(line)
        d = Daemon(KVTIERD, "--stats-period", "10ms")
        try:
            addr = "127.0.0.1:%d" % d.rpc_port
            dump, pr = os.path.join(tmp, "held.txt"), os.path.join(tmp, "per_request.txt")
            j = bench("--mode", "live", "--trace", trace, "--pods", "2", "--capacity-blocks",
                      "150", "--policy", "all", "--speedup", "400", "--connect", addr,
                      "--lose-every", "7", "--keep-engines", "--dump-held", dump,
                      "--per-request", pr, "--tag", "t2")
            assert [r["policy"] for r in results(j)] == list(POLICIES), j
            check_fields(j, 2)
            assert all(r["gaps"] > 0 and r["replays"] >= r["gaps"] for r in results(j)), j
            rows = per_request(pr)
            for r in results(j):
                got = rows[r["policy"]]
                assert len(got) == 300 and sum(h for _, h, _ in got) == r["hit_blocks"], r
            blocks = check_view(d, dump)
            assert blocks == sum(r["held_blocks"] for r in results(j)), blocks
            print(f"ok: 2 engines, every policy: view == caches ({blocks} blocks), replays "
                  f"{sum(r['replays'] for r in results(j))}")

            # one engine: live mode's hits are cache mode's, request by request
            cpr = os.path.join(tmp, "cache_pr.txt")
            c = bench("--mode", "cache", "--trace", trace, "--pods", "1", "--capacity-blocks",
                      "150", "--policy", "round-robin", "--per-request", cpr)
            lpr = os.path.join(tmp, "live1_pr.txt")
            j1 = bench("--mode", "live", "--trace", trace, "--pods", "1", "--capacity-blocks",
                       "150", "--policy", "round-robin,cost", "--speedup", "400", "--connect",
                       addr, "--per-request", lpr, "--tag", "t1")
            check_fields(j1, 1)
            want = [h for _, h, _ in per_request(cpr)["round-robin"]]
            live1 = per_request(lpr)
            for r in results(j1):
                assert r["hit_blocks"] == c["hit_blocks"], (r, c)
                assert [h for _, h, _ in live1[r["policy"]]] == want, r["policy"]
            stats = d.stats()
            assert not any(e["pod"].startswith("t1-") for e in stats["engines"]), \
                "engines left without --keep-engines"
            print(f"ok: 1 engine: live hits == cache mode's ({c['hit_blocks']} blocks)")
        except BaseException:
            print(d.read_log())
            raise
        finally:
            d.stop()
            d.cleanup()

        # the bench's own kvtierd (stopped by the bench, or with it)
        plots = os.path.join(tmp, "plots")
        j = bench("--mode", "live", "--trace", trace, "--requests", "100", "--pods", "2",
                  "--capacity-blocks", "100", "--policy", "prefix", "--speedup", "400",
                  "--kvtierd", KVTIERD, "--out", plots)
        check_fields(j, 2)
        assert j["requests"] == 100 and j["routed_calls"] == 100, j
        print("ok: --kvtierd")
        # --out: the TTFT CDF ends at 1 with the run's slowest request; the load sums up
        if shutil.which("gnuplot"):
            for name in ("ttft-cdf", "pod-load"):
                with open(os.path.join(plots, name + ".png"), "rb") as f:
                    assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
            cdf = [tuple(map(float, l.split())) for l in
                   open(os.path.join(plots, "ttft-cdf.dat")).read().splitlines()[1:] if l]
            assert len(cdf) == 100 and cdf[-1][1] == 1.0, cdf[-3:]
            assert all(a[0] <= b[0] and a[1] < b[1] for a, b in zip(cdf, cdf[1:])), cdf
            assert abs(cdf[98][0] - j["ttft_p99_ms"]) < 1e-6 or cdf[98][0] <= j["ttft_p99_ms"]
            rows = open(os.path.join(plots, "pod-load.dat")).read().splitlines()[1:]
            assert sum(float(r.split()[1]) for r in rows) == j["total_blocks"] - j["hit_blocks"]
            print("ok: --out")


if __name__ == "__main__":
    main()
