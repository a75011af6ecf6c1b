#!/usr/bin/python3
"""kvtier-cuda-check against a real kvtierd (issue 20): HBM -> arena -> HBM through RESERVE,
COMMIT, PIN and UNPIN, bytes compared, rates against cudaMallocHost'd memory. Exits 77 where
no GPU is usable (the check's own 77), as on the CPU-only build machines; on a GPU machine it
checks the JSON line and that nothing stays pinned or reserved.

Usage: test_cuda_check.py path/to/kvtierd path/to/kvtier-cuda-check
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kvtierd_fixture as fx  # noqa: E402

BB = 256 * 1024


def main():
    kvtierd, check = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="kvt_cuda_")
    sock = os.path.join(tmp, "k.sock")
    d = fx.Daemon(kvtierd, "--ram-bytes", str(128 * BB), "--block-bytes", str(BB),
                  "--rpc-unix", sock)
    try:
        # bad arguments are refused (exit 2, one line) before any GPU is looked for
        for args, why in ((["--blocks", "0"], "--blocks"), (["--rounds", "x"], "--rounds"),
                          (["--frobnicate", "1"], "unknown option"), (["--socket"], "usage"),
                          ([], "usage")):
            r = subprocess.run([check] + args + (["--socket", sock] if args and
                               args[0] != "--socket" else []), capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 2 and why in r.stderr, (args, r.returncode, r.stderr)
        r = subprocess.run([check, "--socket", sock, "--blocks", "64", "--rounds", "3"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 77:
            print("SKIP: " + r.stderr.strip())
            return 77
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        j = json.loads(r.stdout.strip().splitlines()[-1])
        assert j["bench"] == "cuda-check" and j["blocks"] == 64 and j["block_bytes"] == BB, j
        for k in ("d2h_gbps", "d2h_pinned_gbps", "h2d_gbps", "h2d_pinned_gbps"):
            assert j[k] > 0, j
        ram = fx.wait_for(lambda: d.stats()["tiers"]["ram"], what="stats")
        assert (ram["pinned"], ram["reserved"]) == (0, 0), ram
        # bad arguments: a clear refusal, nothing touched
        r = subprocess.run([check, "--socket", sock, "--blocks", "1000"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1 and "slots" in r.stderr, (r.returncode, r.stderr)
        print(r.stdout)
        print("test_cuda_check: ok")
        return 0
    finally:
        d.stop()
        d.cleanup()
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    sys.exit(main())
