#!/usr/bin/python3
"""`kvtier-bench index --scale` at a small size: its accounting and its JSON, and its refusals.

Usage: test_bench_scale.py KVTIER_BENCH

- 100,000 entries over 100 pods (checkpoints at 10,000 and 100,000): the index holds what
  the generated workload stored (entries, blocks, the pods' own counts), every stored block
  made one new entry, the figures agree with one another (bytes per entry, resident set per
  entry, ratios, the yardstick and final fields against the checkpoints), and the same
  seed gives the same workload while another seed gives another.
- Refusals: a size no budget fits, refused before any fill; a size whose resident set,
  projected from the yardstick, exceeds --max-rss, refused at the yardstick; bad options.

Times are never asserted (only that percentiles are ordered). Small: a few MB, seconds.
"""

import json
import subprocess
import sys

BENCH = None
FAILS = []

# the workload's longest event (bench/bench_index_int.h: 24-block prompt + 8 turns x 8)
EVENT_MAX = 24 + 8 * 8


def fail(msg):
    FAILS.append(msg)
    print("FAIL: " + msg, file=sys.stderr)


def run(*args):
    p = subprocess.run([BENCH, "index", "--scale"] + list(args), capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def result(args):
    rc, out, err = run(*args)
    if rc != 0:
        fail("%s: exit %d: %s" % (" ".join(args), rc, err.strip()))
        return None
    return json.loads(out.strip().splitlines()[-1])


def close(a, b, tol):
    return abs(a - b) <= tol


def check_point(name, p, j):
    """One checkpoint's own consistency."""
    if not close(p["bytes_per_entry"], p["bytes"] / p["entries"], 0.006):
        fail("%s: bytes_per_entry %s is not bytes / entries" % (name, p["bytes_per_entry"]))
    grown = max(p["rss_bytes"] - j["rss_base_bytes"], 0)
    if not close(p["rss_per_entry"], grown / p["entries"], 0.006):
        fail("%s: rss_per_entry %s is not (rss - base) / entries" % (name, p["rss_per_entry"]))
    if p["peak_rss_bytes"] < p["rss_bytes"]:
        fail("%s: peak resident set below the resident set" % name)
    if p["blocks"] > p["entries"]:
        fail("%s: more blocks than entries" % name)
    for q in ("lookup_", "chain_"):
        if not p[q + "p50_ns"] <= p[q + "p99_ns"] <= p[q + "p999_ns"]:
            fail("%s: %s percentiles out of order" % (name, q))
        if not j["query_min"] <= p[q + "query_blocks"] <= j["query_max"]:
            fail("%s: %squery_blocks %s outside the query lengths" %
                 (name, q, p[q + "query_blocks"]))
        if not 0 <= p[q + "query_hit_blocks"] <= p[q + "query_blocks"]:
            fail("%s: %squery_hit_blocks out of range" % (name, q))
        if not 0 <= p[q + "answer_pods"] <= j["pods"]:
            fail("%s: %sanswer_pods out of range" % (name, q))
    # chain queries are a session's own blocks: held by one pod, or two after a move
    if p["chain_answer_pods"] > 2:
        fail("%s: chain queries answered by %s pods" % (name, p["chain_answer_pods"]))
    if p["events_per_sec"] <= 0 or p["store_calls_per_sec"] <= 0 or p["batches"] <= 0:
        fail("%s: no events timed" % name)
    if p["batch_max_ns"] < p["batch_p99_ns"]:
        fail("%s: batch max below its p99" % name)


def test_small():
    args = ["--entries", "100000", "--pods", "100", "--yardstick", "10000", "--queries", "2000"]
    j = result(args)
    if j is None:
        return
    for k in ("bench", "mode", "entries", "blocks", "bytes_per_entry", "rss_bytes",
              "rss_per_entry", "peak_rss_bytes", "events_per_sec", "lookup_p50_ns",
              "lookup_p99_ns", "lookup_p999_ns", "yardstick_lookup_p99_ns", "lookup_p99_ratio",
              "chain_p99_ratio", "checkpoints", "entries_agree", "projected_rss_bytes"):
        if k not in j:
            fail("JSON has no %r" % k)
            return
    if j["bench"] != "index" or j["mode"] != "scale" or j["pods"] != 100:
        fail("bench, mode or pods: %r %r %r" % (j["bench"], j["mode"], j["pods"]))
    # the accounting: the index holds exactly what the workload stored
    if not (j["entries"] == j["expected_entries"] == j["pod_entries"]):
        fail("entries %d, expected %d, by pod %d" % (j["entries"], j["expected_entries"],
                                                      j["pod_entries"]))
    if j["blocks"] != j["expected_blocks"]:
        fail("blocks %d, expected %d" % (j["blocks"], j["expected_blocks"]))
    if j["entries_agree"] is not True:
        fail("entries_agree is not true")
    # every block an event carried was a new (block, pod) pair
    if j["total_block_events"] != j["entries"]:
        fail("%d blocks stored for %d entries" % (j["total_block_events"], j["entries"]))
    if not 100000 <= j["entries"] < 100000 + j["batch"] * EVENT_MAX:
        fail("filled to %d entries for a target of 100000" % j["entries"])
    cps = j["checkpoints"]
    if len(cps) != 2 or not 10000 <= cps[0]["entries"] < cps[1]["entries"]:
        fail("checkpoints: %r" % [c["entries"] for c in cps])
        return
    if sum(c["batches"] for c in cps) * j["batch"] != j["total_events"]:
        fail("batches x batch size is not total_events")
    for k, v in cps[-1].items():
        if k != "projected_rss_bytes" and j[k] != v:
            fail("final %s %r differs from the last checkpoint's %r" % (k, j[k], v))
    for k, v in cps[0].items():
        if k != "projected_rss_bytes" and j["yardstick_" + k] != v:
            fail("yardstick_%s %r differs from the first checkpoint's %r" %
                 (k, j["yardstick_" + k], v))
    for i, c in enumerate(cps):
        check_point("checkpoint %d" % i, c, j)
    if cps[1]["peak_rss_bytes"] < cps[0]["peak_rss_bytes"]:
        fail("peak resident set went down")
    if not close(j["lookup_p99_ratio"], j["lookup_p99_ns"] / j["yardstick_lookup_p99_ns"], 0.001):
        fail("lookup_p99_ratio %s" % j["lookup_p99_ratio"])
    if not close(j["chain_p99_ratio"], j["chain_p99_ns"] / j["yardstick_chain_p99_ns"], 0.001):
        fail("chain_p99_ratio %s" % j["chain_p99_ratio"])

    # deterministic from the seed
    again = result(args)
    other = result(args + ["--seed", "2"])
    if again is not None:
        for k in ("entries", "blocks", "sessions", "total_events"):
            if again[k] != j[k]:
                fail("same seed, different %s: %r and %r" % (k, j[k], again[k]))
    if other is not None and (other["blocks"], other["sessions"]) == (j["blocks"], j["sessions"]):
        fail("seed 2 generated the same workload as seed 1")
    return j


def test_refusals():
    # no budget fits 4e9 entries: refused before anything is filled
    rc, out, err = run("--entries", "4000000000", "--max-rss", "1G")
    if rc != 1 or "refusing --entries 4000000000" not in err or out.strip():
        fail("4e9 entries: exit %d, stderr %r, stdout %r" % (rc, err, out[:200]))
    # a limit the prior check (40 bytes an entry) lets through, but below the projection
    # from the yardstick: refused there, with the yardstick's row printed
    args = ["--entries", "200000", "--pods", "100", "--yardstick", "100000", "--queries", "500"]
    j = result(args)
    if j is None:
        return
    base = j["rss_base_bytes"]
    per = (j["checkpoints"][0]["projected_rss_bytes"] - base) / 200000  # +10% included
    n = 10000000
    if per <= 44:
        print("skip: the projection (%.1f bytes an entry) leaves no room below it" % per)
        return
    limit = int(base + n * (40 + per) / 2)
    rc, out, err = run("--entries", str(n), "--pods", "100", "--yardstick", "100000",
                       "--queries", "500", "--max-rss", str(limit))
    if rc != 1 or "refusing --entries %d" % n not in err or "projected" not in err:
        fail("projected refusal: exit %d, stderr %r" % (rc, err))
    if out.strip().splitlines()[-1].startswith("{"):
        fail("a refused run printed a JSON result")
    # bad command lines
    for bad in (["--pods", "10"], ["--entries", "10", "--query-min", "9", "--query-max", "8"],
                ["--entries", "0"], ["--entries", "10", "--pods", "0"]):
        rc, _, err = run(*bad)
        if rc != 2 or not err.startswith("kvtier-bench: "):
            fail("%s: exit %d, stderr %r" % (" ".join(bad), rc, err))


def main():
    global BENCH
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    BENCH = sys.argv[1]
    with open("/proc/meminfo") as f:
        if "MemAvailable" not in f.read():
            print("skip: no MemAvailable in /proc/meminfo")
            return 77
    test_small()
    test_refusals()
    if FAILS:
        print("%d failure(s)" % len(FAILS), file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
