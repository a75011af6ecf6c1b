#!/usr/bin/python3
"""`kvtier-bench replay --out DIR`: the cache mode's plots are real PNGs whose data
files hold what the run printed (the per-pod load sums to the blocks prefilled, the
capacity sweep's last point at the run's own capacity agrees with the table when the
capacity is one of the sweep's), and a directory that cannot be made is an error."""
import json
import os
import subprocess
import sys
import tempfile

PNG = b"\x89PNG\r\n\x1a\n"


def main():
    bench = sys.argv[1]
    if subprocess.run(["sh", "-c", "command -v gnuplot"], capture_output=True).returncode != 0:
        print("gnuplot not installed: skip")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t.jsonl")
        subprocess.run([bench, "gen", "--sessions", "60", "--seed", "3", "--out", trace],
                       check=True, capture_output=True)
        out = os.path.join(tmp, "plots")
        r = subprocess.run([bench, "replay", "--trace", trace, "--pods", "4",
                            "--capacity-blocks", "40", "--policy", "round-robin,cost",
                            "--out", out], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout.strip().splitlines()[-1])["results"]
        for name in ("pod-load", "hit-ratio-vs-capacity"):
            with open(os.path.join(out, name + ".png"), "rb") as f:
                assert f.read(8) == PNG, name
        # pod-load.dat: one row per pod, one column per policy
        rows = [l.split() for l in open(os.path.join(out, "pod-load.dat")).read().splitlines()]
        assert rows[0] == ["x", '"round-robin"', '"cost"'], rows[0]
        assert len(rows) == 1 + 4, rows
        for k, pol in enumerate(res):
            prefilled = sum(float(row[1 + k]) for row in rows[1:])
            assert prefilled == pol["total_blocks"] - pol["hit_blocks"], (pol, prefilled)
        # hit-ratio-vs-capacity.dat: a block per policy and the ideal, six capacities each
        blocks = open(os.path.join(out, "hit-ratio-vs-capacity.dat")).read().strip().split("\n\n\n")
        assert [b.splitlines()[0] for b in blocks] == \
            ["# round-robin", "# cost", "# ideal (unbounded)", "# Belady, one pod"], blocks
        for b in blocks:
            pts = [tuple(map(float, l.split())) for l in b.splitlines()[1:]]
            assert len(pts) == 6 and all(0 <= y <= 1 for _, y in pts), pts
        ideal = [float(l.split()[1]) for l in blocks[2].splitlines()[1:]]
        assert all(abs(y - res[0]["ideal_hit_ratio"]) < 1e-6 for y in ideal), ideal
        belady = [float(l.split()[1]) for l in blocks[3].splitlines()[1:]]
        assert belady == sorted(belady) and belady[-1] <= ideal[0] + 1e-9, belady
        # a directory under a file cannot be made: an error, exit 1, no JSON line
        bad = os.path.join(trace, "sub")
        r = subprocess.run([bench, "replay", "--trace", trace, "--pods", "2",
                            "--capacity-blocks", "40", "--policy", "cost", "--out", bad],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "--out" in r.stderr, (r.returncode, r.stderr)
        # a bad --policy: exit 2 and the list of every policy, in each mode that parses it
        for mode in ("cache", "timed"):
            r = subprocess.run([bench, "replay", "--mode", mode, "--trace", trace,
                                "--policy", "cost,nope"], capture_output=True, text=True)
            assert r.returncode == 2 and "cost-tiers" in r.stderr and "'cost,nope'" in r.stderr, \
                (mode, r.returncode, r.stderr)
    print("test_replay_plots: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
