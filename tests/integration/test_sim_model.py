#!/usr/bin/python3
"""`kvtier-bench replay --mode cache` against tests/fixtures/sim_model.py.

usage: test_sim_model.py KVTIER_BENCH SOURCE_DIR [conversation]

On a generated trace (4 pods, 60 blocks each, every policy), the Python model
replays each policy's choices of pod and must find the same hit on every
request; it routes round-robin and least-loaded itself and must choose the same
pods; with --pods 1 every policy gives the same hits. The mini fixture's ideal
is 11/24. With "conversation": the ideal of the Mooncake conversation trace is
36.64% (exit 77 when the trace is absent).
"""
import json
import os
import subprocess
import sys
import tempfile

SRC = sys.argv[2]
sys.path.insert(0, os.path.join(SRC, "tests", "fixtures"))
import sim_model  # noqa: E402

BENCH = sys.argv[1]


def bench(*args):
    p = subprocess.run([BENCH, "replay", "--mode", "cache", *args], capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"FAIL: replay {args}: rc {p.returncode}\n{p.stdout}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def per_request(path):
    out = {}
    with open(path) as f:
        for line in f:
            pol, i, pod, hit, n = line.split()
            out.setdefault(pol, []).append((int(pod), int(hit), int(n)))
    return out


def conversation():
    for d in (os.environ.get("KVT_TRACES"), os.path.join(SRC, "..", "shared", "traces"),
              os.path.join(SRC, "..", "..", "shared", "traces")):
        if d and os.path.exists(os.path.join(d, "conversation_trace.jsonl")):
            path = os.path.join(d, "conversation_trace.jsonl")
            break
    else:
        print("skip: conversation_trace.jsonl not found")
        sys.exit(77)
    j = bench("--trace", path, "--pods", "1", "--policy", "round-robin")
    got = round(100 * j["ideal_hit_ratio"], 2)
    assert got == 36.64, f"conversation ideal {got}% != 36.64%"
    reqs = sim_model.load(path)
    h, t = sim_model.ideal(reqs)
    assert (h, t) == (j["hit_blocks"], j["total_blocks"]), ((h, t), j)
    print(f"ok: conversation ideal {got}% ({h}/{t}), Python model agrees")


def main():
    if len(sys.argv) > 3 and sys.argv[3] == "conversation":
        conversation()
        return
    mini = os.path.join(SRC, "tests", "fixtures", "mini_trace.jsonl")
    j = bench("--trace", mini, "--pods", "1", "--policy", "round-robin")
    assert (j["hit_blocks"], j["total_blocks"]) == (11, 24), j

    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "gen.jsonl")
        sim_model.generate(trace, seed=18)
        reqs = sim_model.load(trace)
        pods, cap = 4, 60
        pr = os.path.join(tmp, "per_request.txt")
        j = bench("--trace", trace, "--pods", str(pods), "--capacity-blocks", str(cap),
                  "--policy", "all", "--per-request", pr)
        ih, it = sim_model.ideal(reqs)
        assert abs(j["ideal_hit_ratio"] - ih / it) < 1e-6, (j["ideal_hit_ratio"], ih, it)
        rows = per_request(pr)
        results = {r["policy"]: r for r in j["results"]}
        assert set(rows) == set(results), sorted(rows)
        assert {"random", "round-robin", "least-loaded", "session", "prefix", "cost",
                "approx-prefix", "cost-tiers"} <= set(rows), sorted(rows)
        for pol, got in rows.items():
            assert len(got) == len(reqs)
            chosen = [g[0] for g in got]
            hits, _ = sim_model.replay(reqs, pods, cap, lambda i, pf: chosen[i])
            for i, (g, h) in enumerate(zip(got, hits)):
                assert g[1] == h and g[2] == len(reqs[i]), f"{pol} request {i}: bench {g}, model {h}"
            assert sum(hits) == results[pol]["hit_blocks"], pol
            assert results[pol]["index_mismatch"] == 0, pol
            print(f"ok: {pol}: {sum(hits)} of {it} blocks hit, the model agrees on every request")
        for pol, route in (("round-robin", sim_model.round_robin(pods)),
                           ("least-loaded", sim_model.least_loaded)):
            hits, chosen = sim_model.replay(reqs, pods, cap, route)
            assert chosen == [g[0] for g in rows[pol]], f"{pol}: other pods chosen"
        # the evictions matter in this run: a bounded cache loses against unbounded
        assert results["round-robin"]["evicted_blocks"] > 0

        j = bench("--trace", trace, "--pods", "1", "--capacity-blocks", str(cap), "--policy",
                  "all", "--per-request", pr)
        rows = per_request(pr)
        ref = rows["round-robin"]
        for pol, got in rows.items():
            assert got == ref, f"--pods 1: {pol} differs from round-robin"
        ratios = {r["hit_ratio"] for r in j["results"]}
        assert len(ratios) == 1, ratios
        hits, _ = sim_model.replay(reqs, 1, cap, lambda i, pf: 0)
        assert sum(hits) == j["results"][0]["hit_blocks"]
        print(f"ok: --pods 1: every policy {sum(hits)}/{it}")


if __name__ == "__main__":
    main()
