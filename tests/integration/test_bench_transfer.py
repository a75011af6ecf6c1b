#!/usr/bin/python3
"""`kvtier-bench transfer` end to end on tcp: a second process, real UCX pulls, the JSON
last line holding one result per (block size, batch) that fits, each with a positive
rate and ordered latency percentiles; with --daemons the same points through two real
kvtierd (every call moved every block: the bench checks it); a bad --sizes list is refused
with exit 2. The same with --tls shm, kvtierd's same-host path, which also reports its
memcpy bound."""
import json
import subprocess
import sys


def main():
    bench = sys.argv[1]
    r = subprocess.run([bench, "transfer", "--tls", "tcp", "--sizes", "64K,1M", "--batches",
                        "1,4", "--seconds", "0.05", "--region-mib", "2", "--perftest", "none"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 and "UCX" in r.stderr and "context" in r.stderr:
        print("UCX cannot create a context here: skip\n" + r.stderr)
        return 77
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["bench"] == "transfer" and j["transport"] == "tcp", j
    # 1 MiB x 4 does not fit a 2 MiB region: skipped
    got = [(p["block_bytes"], p["batch"]) for p in j["results"]]
    assert got == [(65536, 1), (65536, 4), (1048576, 1)], got
    for p in j["results"]:
        assert p["gbps"] > 0 and 0 < p["p50_us"] <= p["p99_us"], p
        assert p["perftest_gbps"] == -1 and p["ratio"] == -1, p
    # --daemons: the same points through two kvtierd (one TRANSFER per batch)
    r = subprocess.run([bench, "transfer", "--tls", "tcp", "--sizes", "64K", "--batches", "1,3",
                        "--seconds", "0.05", "--region-mib", "2", "--perftest", "none",
                        "--daemons"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(p["block_bytes"], p["batch"]) for p in j["results"]] == [(65536, 1), (65536, 3)], j
    for p in j["results"]:
        assert p["daemon_gbps"] > 0 and 0 < p["daemon_p50_us"] <= p["daemon_p99_us"], p
    # --tls shm: the same-host path (a mapped peer), with its memcpy bound, and through two
    # kvtierd that map each other's arena
    r = subprocess.run([bench, "transfer", "--tls", "shm", "--sizes", "64K,1M", "--batches",
                        "1,2", "--seconds", "0.05", "--region-mib", "2", "--perftest", "none",
                        "--daemons"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["transport"] == "shm", j
    got = [(p["block_bytes"], p["batch"]) for p in j["results"]]
    assert got == [(65536, 1), (65536, 2), (1048576, 1), (1048576, 2)], got
    for p in j["results"]:
        assert p["gbps"] > 0 and p["memcpy_gbps"] > 0 and p["daemon_gbps"] > 0, p
        assert 0 < p["p50_us"] <= p["p99_us"], p
    r = subprocess.run([bench, "transfer", "--sizes", "64K,,1M"], capture_output=True, text=True)
    assert r.returncode == 2 and "--sizes" in r.stderr, (r.returncode, r.stderr)
    print("test_bench_transfer: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
