#!/usr/bin/python3
"""Integration tests of kvtierd's tiers: the real daemon, its host-RAM arena and its NVMe
store in a temp dir under /tmp (ext4 here: O_DIRECT works; never tmpfs for the store).

Usage: test_tiers.py path/to/kvtierd      (exit 77 = skipped: no O_DIRECT or io_uring)
Covers issue 17's "Bad input and faults" against the daemon: spill to NVMe and read
back, kill -9 in a burst of durable puts and a warm restart, a corrupted block, start-up
errors that touch nothing, a full disk, pins released with the engine's connection
(ATTACH's fd over SCM_RIGHTS, RESERVE/COMMIT/PIN on the mapped arena), bad input that
changes nothing, prefetch by tokens and keys, and the sidecar's pod in the index and on
the publisher. Sizes are small: blocks of 64 KiB, an arena of 1 MiB, a store of a few
MiB. Values are asserted exactly; waits are bounded polls, never timings.
"""

import hashlib
import http.client
import mmap
import os
import random
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import kvtierd_fixture as fx  # noqa: E402
import hash_vectors as hv  # noqa: E402

try:  # Debian's python3-zmq / python3-msgpack: the publisher's replay
    import msgpack
    import zmq
except ImportError:
    zmq = msgpack = None

BIN = None
SANITIZED = False  # the binary runs under ASan or TSan (set in main): longer waits
BB = 64 * 1024  # --block-bytes
POD = "sc"
MODEL = "m"
HEADER = 4096  # the store's header; slot i starts at HEADER + i * slot_bytes (tiers/disk.c)

OP_ATTACH, OP_LOOKUP, OP_RESERVE, OP_COMMIT, OP_PIN = 0x40, 0x41, 0x42, 0x43, 0x44
OP_UNPIN, OP_PREFETCH, OP_BLOCK_PUT, OP_BLOCK_GET, OP_BLOCK_DELETE = 0x45, 0x46, 0x47, 0x48, 0x49
LOC_RAM, LOC_DISK = 1, 2
SLOT_NONE = 0xFFFFFFFF
ERR_INVAL, ERR_TOO_BIG, ERR_NOT_FOUND, ERR_EXISTS = -100, -103, -200, -201


def blob(key, n=BB, tag=0):
    """The bytes a test stores as block @key: distinct per key (and per @tag)."""
    return random.Random(key * 1000003 + tag).randbytes(n)


def wait_for(fn, what):
    """fn() until it returns something true, for a bounded time (longer under a sanitizer)."""
    return fx.wait_for(fn, 60.0 if SANITIZED else 20.0, what)


# ---- RPC bodies (docs/protocol.md, "Tiers") ----

def keys_body(keys, model=MODEL, lora=""):
    return (fx.pstr(model) + fx.pstr(lora) + struct.pack("<I", len(keys)) +
            b"".join(struct.pack("<Q", k) for k in keys))


def key_body(key, model=MODEL, lora=""):
    return fx.pstr(model) + fx.pstr(lora) + struct.pack("<Q", key)


def commit_body(keys, lens=None, ok=1, model=MODEL, lora=""):
    lens = lens or [0] * len(keys)
    return (fx.pstr(model) + fx.pstr(lora) + bytes([ok, 0, 0, 0]) +
            struct.pack("<I", len(keys)) + b"".join(struct.pack("<Q", k) for k in keys) +
            b"".join(struct.pack("<I", n) for n in lens))


def block_put_body(key, data, durable=0, model=MODEL, lora="", length=None):
    return (fx.pstr(model) + fx.pstr(lora) + struct.pack("<QB3xI", key, durable,
                                                         len(data) if length is None else length)
            + data)


def count_of(body):
    (n,) = struct.unpack("<I", body)
    return n


def parse_lookup(body):
    (hit,) = struct.unpack_from("<I", body)
    assert len(body) == 4 + hit, "trailing bytes in a LOOKUP answer"
    return list(body[4:])


def parse_reserve(body):
    (n,) = struct.unpack_from("<I", body)
    slots = list(struct.unpack_from("<%dI" % n, body, 4))
    (nev,) = struct.unpack_from("<I", body, 4 + 4 * n)
    evicted = list(struct.unpack_from("<%dQ" % nev, body, 8 + 4 * n))
    assert len(body) == 8 + 4 * n + 8 * nev, "trailing bytes in a RESERVE answer"
    return slots, evicted


def parse_pin(body):
    (n,) = struct.unpack_from("<I", body)
    assert len(body) == 4 + 8 * n, "trailing bytes in a PIN answer"
    return [struct.unpack_from("<II", body, 4 + 8 * i) for i in range(n)]


def parse_attach(body):
    map_bytes, slot_off, slot_bytes, nslots, block_bytes, disk_slots, plen = \
        struct.unpack_from("<QQIIIIH", body)
    path = body[34:34 + plen].decode()
    assert len(body) == 34 + plen, "trailing bytes in an ATTACH answer"
    return {"map_bytes": map_bytes, "slot_off": slot_off, "slot_bytes": slot_bytes,
            "nslots": nslots, "block_bytes": block_bytes, "disk_slots": disk_slots,
            "arena_path": path}


class Rpc(fx.Rpc):
    """fx.Rpc and the ATTACH call, whose answer carries a descriptor."""

    def attach(self):
        """ATTACH; returns (geometry, fd) with the fd received by SCM_RIGHTS."""
        rid = self.next_id
        self.next_id += 1
        self.s.sendall(fx.frame(OP_ATTACH, rid))
        buf, fds = b"", []
        while len(buf) < fx.HDR.size:
            data, got, _, _ = socket.recv_fds(self.s, fx.HDR.size - len(buf), 4)
            if not data:
                raise ConnectionError("closed in an ATTACH answer")
            buf += data
            fds += got
        h = fx.HDR.unpack(buf)
        body = fx.recv_exact(self.s, h[5])
        assert (h[2], h[3], h[4]) == (OP_ATTACH, fx.F_RESPONSE, rid), (h, body)
        assert len(fds) == 1, "ATTACH brought %d fds" % len(fds)
        return parse_attach(body), fds[0]

    def close(self):
        self.s.close()


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvtier_tiers_", dir="/tmp")
        self.data_dir = os.path.join(self.tmp, "data")
        self.store = os.path.join(self.tmp, "store")
        self.sock_path = os.path.join(self.tmp, "rpc.sock")
        self.daemons = []

    def tearDown(self):
        failed = any(t is self for t, _ in
                     self._outcome.result.failures + self._outcome.result.errors)
        bad_exit = []
        for d in self.daemons:
            rc = d.stop()
            if rc != 0 and not getattr(d, "killed", False):
                bad_exit.append(rc)
            if failed or (rc != 0 and not getattr(d, "killed", False)):
                sys.stderr.write("---- kvtierd log (%s) ----\n%s\n" % (" ".join(d.tier_flags),
                                                                        d.read_log()))
            d.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertEqual(bad_exit, [], "kvtierd did not exit 0 on SIGTERM")

    # ---- the daemon ----
    def tier_flags(self, ram="1MiB", disk_bytes="8MiB", admit="always", disk=True, extra=()):
        flags = ["--ram-bytes", ram, "--block-bytes", str(BB), "--pod", POD, "--disk-admit",
                 admit, "--rpc-unix", self.sock_path, "--stats-period", "10ms"]
        if disk:
            flags += ["--disk-path", self.store, "--disk-bytes", str(disk_bytes)]
        return flags + list(extra)

    def start(self, **kw):
        flags = self.tier_flags(**kw)
        d = fx.Daemon(BIN, *flags, data_dir=self.data_dir)
        d.tier_flags = flags
        self.daemons.append(d)
        return d

    def restart(self, d):
        """Stops @d (SIGTERM, exit 0; or it was killed) and starts it again on the same
        store and data dir."""
        rc = d.stop()
        if not getattr(d, "killed", False):
            self.assertEqual(rc, 0)
        d2 = fx.Daemon(BIN, *d.tier_flags, data_dir=self.data_dir)
        d2.tier_flags = d.tier_flags
        self.daemons.append(d2)
        return d2

    def kill9(self, d):
        d.killed = True
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(20)

    # ---- blocks over HTTP ----
    def put(self, d, key, data, model=MODEL, durable=False, lora=None, query=None):
        q = query if query is not None else "model=" + model + ("&lora=" + lora if lora else "") + \
            ("&durable=1" if durable else "")
        return d.http("PUT", "/v1/blocks/%s?%s" % (key, q), body=data,
                      headers={"Content-Type": "application/octet-stream"})

    def put_ok(self, d, key, data, durable=False, **kw):
        s, a = self.put(d, key, data, durable=durable, **kw)
        self.assertEqual((s, a), (201, {"key": key, "stored": "disk" if durable else "ram"}))

    def get(self, d, key, model=MODEL, lora=None):
        q = "model=" + model + ("&lora=" + lora if lora else "")
        s, data, headers = d.http("GET", "/v1/blocks/%s?%s" % (key, q), raw=True)
        if s == 200:
            self.assertEqual(headers.get("Content-Type"), "application/octet-stream")
        return s, data

    def assert_block(self, d, key, want, **kw):
        s, data = self.get(d, key, **kw)
        self.assertEqual(s, 200, (key, data[:200]))
        self.assertTrue(data == want, "block %d: %d bytes back, not the %d stored" %
                        (key, len(data), len(want)))

    def assert_missing(self, d, key, **kw):
        s, data = self.get(d, key, **kw)
        self.assertEqual(s, 404, (key, len(data)))
        self.assertIn(b'"error"', data)

    def tiers(self, d):
        """/v1/stats "tiers" as they are now. The stats are a snapshot kept for up to
        --stats-period and made on a request: the next one with another uptime was made
        after this call began, so after everything the test did before it."""
        u = d.stats()["uptime_s"]
        return wait_for(lambda: (lambda s: s["tiers"] if s["uptime_s"] != u else None)(
            d.stats()), "a fresh stats snapshot")

    def wait_tiers(self, d, pred, what):
        """Polls until pred(tiers); then the values of a fresh snapshot, which must agree."""
        wait_for(lambda: pred(d.stats()["tiers"]), what)
        t = self.tiers(d)
        self.assertTrue(pred(t), (what, t))
        return t

    def pod_in_query(self, d, keys, model=MODEL, lora=None):
        body = {"model": model, "block_hashes": keys}
        if lora:
            body["lora_name"] = lora
        s, ans = d.http("POST", "/v1/query", body)
        self.assertEqual(s, 200, ans)
        got = [p for p in ans["pods"] if p["pod"] == POD]
        return got[0] if got else None

    def wait_pod(self, d, keys, want, **kw):
        """Polls the query until the pod's (matched_blocks, gpu, cpu, disk) are @want
        ((0, 0, 0, 0): the pod is not listed)."""
        def now():
            p = self.pod_in_query(d, keys, **kw)
            return (p["matched_blocks"], p["gpu"], p["cpu"], p["disk"]) if p else (0, 0, 0, 0)
        try:
            wait_for(lambda: now() == want, "the pod's entries %r" % (want,))
        except AssertionError:
            self.assertEqual(now(), want)

    def unix(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(self.sock_path)
        return Rpc(s)

    def tcp(self, d):
        return Rpc(d.connect())


class TestSpill(Base):
    def room_for_one(self, d):
        """Waits until a put or a promotion cannot cost a block: a free RAM slot, or a RAM
        block that is on NVMe too (blocks - demotions are the blocks only in RAM while
        nothing has left the store)."""
        room = (lambda t: t["ram"]["used"] < t["ram"]["slots"] or
                t["blocks"] - t["demotions"] < t["ram"]["used"])
        wait_for(lambda: room(self.tiers(d)), "a RAM block on NVMe (the demoter)")

    def test_spill_and_read_back(self):
        """4x more blocks than RAM holds, one in four durable: every one reads back
        byte-exact, promoted from NVMe; nothing is dropped."""
        d = self.start(ram="1MiB", disk_bytes="8MiB")
        t = self.tiers(d)
        self.assertEqual((t["ram"]["slots"], t["disk"]["slots"]), (16, 127))
        self.assertEqual((t["block_bytes"], t["slot_bytes"]), (BB, BB))
        n = 4 * 16
        want = {}
        for i in range(n):
            key = 1000 + i
            want[key] = blob(key, BB - (i % 3) * 1000)  # some lengths not 4 KiB multiples
            self.room_for_one(d)
            self.put_ok(d, key, want[key], durable=i % 4 == 0)
        t = self.tiers(d)
        self.assertEqual((t["puts"], t["blocks"], t["drops"], t["ram"]["used"]),
                         (n, n, 0, 16), t)
        self.assertEqual(t["ram_evictions"], n - 16)
        self.assertEqual((t["disk_evictions"], t["io_errors"], t["restored"]), (0, 0, 0))
        for key in sorted(want):
            self.room_for_one(d)
            self.assert_block(d, key, want[key])
        t = self.tiers(d)
        self.assertEqual((t["gets"], t["hits_ram"] + t["hits_disk"], t["misses"]), (n, n, 0), t)
        self.assertGreaterEqual(t["hits_disk"], n - 16)
        self.assertEqual(t["promotions"], t["hits_disk"])
        self.assertEqual((t["drops"], t["checksum_failures"], t["io_errors"]), (0, 0, 0))
        self.assertEqual(t["read_bytes"] % 4096, 0)
        self.assertGreater(sum(t["read_us_log2"]), 0)
        # /metrics says the same as /v1/stats (a snapshot too: one made after the gets)
        def metrics():
            s, text = d.http("GET", "/metrics")
            self.assertEqual(s, 200)
            m = fx.parse_prometheus(text)
            return m if m[0][("kvtier_tier_hits_total", (("tier", "disk"),))] == \
                t["hits_disk"] else None
        samples, types = wait_for(metrics, "/metrics to show the gets")
        self.assertEqual(samples[("kvtier_tier_slots", (("tier", "ram"),))], 16)
        self.assertEqual(samples[("kvtier_tier_slots", (("tier", "disk"),))], 127)
        self.assertEqual(samples[("kvtier_tier_hits_total", (("tier", "disk"),))], t["hits_disk"])
        self.assertEqual(samples[("kvtier_tier_checksum_failures_total", ())], 0)
        self.assertEqual(types["kvtier_tier_read_seconds"], "histogram")
        self.assertEqual(samples[("kvtier_tier_read_seconds_count", ())], sum(t["read_us_log2"]))


class TestCrash(Base):
    def test_kill9_in_a_burst_of_durable_puts(self):
        """SIGKILL after 40 acknowledged durable puts from 4 threads; the restart reloads
        every acknowledged block byte-exact, nothing comes back wrong, and the pod's
        entries are back in the index on DISK (warm restart)."""
        d = self.start(ram="1MiB", disk_bytes="16MiB")  # 255 slots: nothing evicted
        self.assertEqual(self.tiers(d)["disk"]["slots"], 255)
        acked, tried, errors, lock = [], {}, [], threading.Lock()
        stop = threading.Event()
        d.killed = False

        def writer(base):
            for j in range(60):
                key = base + j
                with lock:
                    tried[key] = blob(key)
                try:
                    s, a = self.put(d, key, tried[key], durable=True)
                except (OSError, http.client.HTTPException):
                    return  # the daemon is gone
                if s != 201 or a != {"key": key, "stored": "disk"}:
                    with lock:
                        tried[key] = None  # refused: must not come back at all
                        if not stop.is_set():
                            errors.append((key, s, a))
                    return
                with lock:
                    acked.append(key)
                    if len(acked) == 40:  # the kill, right here: the others are mid-put
                        d.killed = True
                        os.kill(d.proc.pid, signal.SIGKILL)
                        stop.set()
                if stop.is_set():
                    return

        threads = [threading.Thread(target=writer, args=(10000 * (i + 1),)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        if not d.killed:
            self.kill9(d)
        d.proc.wait(20)
        self.assertEqual(d.proc.returncode, -signal.SIGKILL)
        self.assertEqual(errors, [], "durable puts refused before the kill")
        with lock:
            acked = list(acked)
        self.assertGreaterEqual(len(acked), 40)
        self.assertLess(len(acked), 240, "the kill came after the burst")

        self.assertTrue(stat.S_ISSOCK(os.lstat(self.sock_path).st_mode), "a stale socket left")
        d2 = self.restart(d)  # on the same --rpc-unix: the stale socket goes
        e = self.unix()
        self.assertEqual(e.ok(fx.OP_PING), b"")
        e.close()
        t = self.tiers(d2)
        self.assertEqual((t["restore_bad"], t["ram"]["used"], t["checksum_failures"]), (0, 0, 0))
        self.assertGreaterEqual(t["restored"], len(acked))
        self.assertEqual((t["blocks"], t["disk"]["used"]), (t["restored"], t["restored"]))
        # warm restart: the pod's entries for the reloaded keys are back, on DISK
        self.wait_pod(d2, acked, (len(acked), 0, 0, len(acked)))
        for key in acked:
            self.assert_block(d2, key, tried[key])
        extra = 0
        for key, data in tried.items():
            if key in acked:
                continue
            s, got = self.get(d2, key)
            self.assertIn(s, (200, 404), key)
            if s == 200:
                self.assertIsNotNone(data, "block %d was refused yet came back" % key)
                self.assertTrue(got == data, "block %d came back with other bytes" % key)
                extra += 1
        # every reloaded block is an acknowledged one or one whose put was cut short
        self.assertEqual(t["restored"], len(acked) + extra)
        self.assertEqual(self.tiers(d2)["checksum_failures"], 0)


class TestCorruption(Base):
    def find_slot(self, data):
        """The offset of the store slot that holds @data (4 KiB-aligned), exactly one."""
        with open(self.store, "rb") as f:
            image = f.read()
        offs = [o for o in range(HEADER, len(image) - len(data) + 1, 4096)
                if image[o:o + len(data)] == data]
        self.assertEqual(len(offs), 1, "the block is in the store once")
        self.assertEqual((offs[0] - HEADER) % BB, 0, "at a slot's start")
        return offs[0]

    def flip(self, off):
        with open(self.store, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))
            f.flush()
            os.fsync(f.fileno())

    def test_a_corrupt_block_is_a_miss_never_wrong_bytes(self):
        d = self.start()
        want = {k: blob(k) for k in (1, 2, 3, 4)}
        for k, v in want.items():
            self.put_ok(d, k, v, durable=True)
        self.assertEqual(d.stop(), 0)
        self.flip(self.find_slot(want[2]) + 12345)
        self.flip(self.find_slot(want[3]) + BB - 1)  # the last byte of the block
        d = self.restart(d)
        t = self.tiers(d)
        self.assertEqual((t["restored"], t["blocks"], t["ram"]["used"]), (4, 4, 0))
        self.wait_pod(d, [2], (1, 0, 0, 1))
        # a GET reads block 2 from NVMe: the checksum fails, a 404, never the bytes
        self.assert_missing(d, 2)
        t = self.tiers(d)
        self.assertEqual((t["checksum_failures"], t["io_errors"], t["blocks"], t["drops"]),
                         (1, 0, 3, 1), t)
        self.assert_missing(d, 2)  # dropped: a plain miss now, not read again
        self.assertEqual(self.tiers(d)["checksum_failures"], 1)
        self.wait_pod(d, [2], (0, 0, 0, 0))  # and gone from the index
        # a prefetch of block 3 reads it, finds it corrupt and drops it
        s, a = d.http("POST", "/v1/prefetch", {"model": MODEL, "keys": [3]})
        self.assertEqual((s, a), (200, {"blocks": 1, "started": 1}))
        t = self.wait_tiers(d, lambda t: t["checksum_failures"] == 2, "the prefetch's check")
        self.assertEqual((t["blocks"], t["ram"]["used"]), (2, 0), t)
        self.assert_missing(d, 3)
        for k in (1, 4):
            self.assert_block(d, k, want[k])
        t = self.tiers(d)
        self.assertEqual((t["checksum_failures"], t["blocks"]), (2, 2), t)
        # the dropped blocks' records were deleted: the next start reloads the other two
        d = self.restart(d)
        t = self.tiers(d)
        self.assertEqual((t["restored"], t["restore_bad"], t["checksum_failures"]), (2, 0, 0))
        for k in (2, 3):
            self.assert_missing(d, k)
        for k in (1, 4):
            self.assert_block(d, k, want[k])


class TestStartErrors(Base):
    """Each start is refused with exit 1 and one clear stderr line; files it did not create
    are left as they were, and what it created is gone."""

    def run_daemon(self, flags, data_dir=None, preexec_fn=None, ipc_dir=None):
        args = [BIN, "--http-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
                "--data-dir", data_dir or self.data_dir, "--workers", "1"]
        if ipc_dir:
            args += ["--ipc-dir", ipc_dir]
        p = subprocess.run(args + flags, capture_output=True, text=True, timeout=60,
                           preexec_fn=preexec_fn)
        self.assertNotIn("kvtierd listening", p.stdout)
        return p

    def refused(self, flags, *needles, **kw):
        """Runs a start that must fail: exit 1, one error line naming every needle."""
        p = self.run_daemon(flags, **kw)
        self.assertEqual(p.returncode, 1, p.stderr)
        errors = [ln for ln in p.stderr.splitlines() if "Z error " in ln]
        self.assertEqual(len(errors), 1, p.stderr)
        for n in needles:
            self.assertIn(n, errors[0])
        self.assertIn("kvtierd: cannot start", p.stderr)
        self.assertNotIn("Sanitizer", p.stderr)
        return p

    def snapshot(self, path):
        st = os.lstat(path)
        with open(path, "rb") as f:
            return (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns,
                    hashlib.sha256(f.read()).hexdigest())

    def tier(self, **kw):
        return ["--ram-bytes", "1MiB", "--block-bytes", str(BB), "--disk-path", self.store,
                "--disk-bytes", "4MiB", "--disk-admit", "always"] + \
            [x for k, v in kw.items() for x in ("--" + k.replace("_", "-"), v)]

    def test_disk_too_small(self):
        self.refused(self.tier(disk_bytes="4096"), "too small for one slot")
        self.assertFalse(os.path.exists(self.store))
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "tiers")))
        # one byte short of a slot and its header: the same
        self.refused(self.tier(disk_bytes=str(HEADER + BB - 1)), "too small for one slot")
        self.assertFalse(os.path.exists(self.store))

    def test_bad_disk_admit(self):
        self.refused(self.tier(disk_admit="bogus"), "--disk-admit", "bogus")
        self.assertFalse(os.path.exists(self.store))
        self.refused(self.tier(disk_admit=""), "--disk-admit")

    def test_bad_release_grace(self):
        self.refused(self.tier(release_grace="11m"), "--release-grace", "10 minutes")
        self.assertFalse(os.path.exists(self.store))

    def test_a_data_dir_that_cannot_be(self):
        """A data dir under a regular file: refused, the file untouched."""
        plain = os.path.join(self.tmp, "plain")
        with open(plain, "wb") as f:
            f.write(b"not a directory\n")
        before = self.snapshot(plain)
        self.refused(self.tier(), "cannot create data dir", "Not a directory",
                     data_dir=os.path.join(plain, "data"))
        self.assertEqual(self.snapshot(plain), before)
        self.assertFalse(os.path.exists(self.store))

    def test_a_read_only_data_dir(self):
        """A data dir kvtierd may not write. As root a mode means nothing, so the daemon
        runs as nobody (its own dirs handed to nobody); not as root, the mode alone. The
        store it created before it found out is removed."""
        os.chmod(self.tmp, 0o755)  # nobody passes through
        data = os.path.join(self.tmp, "ro-data")
        ipc = os.path.join(self.tmp, "ipc")
        disk_dir = os.path.join(self.tmp, "disk")
        for p in (data, ipc, disk_dir):
            os.mkdir(p, 0o700)
        store = os.path.join(disk_dir, "store")
        preexec = None
        if os.geteuid() == 0:
            nobody = 65534
            for p in (data, ipc, disk_dir):
                os.chown(p, nobody, nobody)

            def preexec():
                os.setgroups([])
                os.setgid(nobody)
                os.setuid(nobody)
        os.chmod(data, 0o500)
        flags = ["--ram-bytes", "1MiB", "--block-bytes", str(BB), "--disk-path", store,
                 "--disk-bytes", "4MiB"]
        p = self.refused(flags, "Permission denied", data_dir=data, preexec_fn=preexec,
                         ipc_dir=ipc)
        self.assertIn("cannot create data dir %s/tiers" % data, p.stderr)
        self.assertFalse(os.path.exists(store), "the store it created is left behind")
        self.assertEqual(os.listdir(data), [])
        self.assertEqual(stat.S_IMODE(os.stat(data).st_mode), 0o500)
        os.chmod(data, 0o700)

    def test_a_second_kvtierd_on_the_same_store_and_data_dir(self):
        d = self.start(disk_bytes="4MiB")
        self.put_ok(d, 5, blob(5), durable=True)
        before = self.snapshot(self.store)
        listing = sorted(os.listdir(os.path.join(self.data_dir, "tiers")))
        # the same store: its lock
        self.refused(self.tier(), "disk store %s is in use by another process" % self.store)
        self.assertEqual(self.snapshot(self.store), before)
        # another store, the same metadata: RocksDB's lock; the new store is removed
        other = os.path.join(self.tmp, "store2")
        self.refused(self.tier()[:4] + ["--disk-path", other, "--disk-bytes", "4MiB"],
                     "data dir %s/tiers is in use by another kvtierd" % self.data_dir)
        self.assertFalse(os.path.exists(other))
        self.assertEqual(sorted(os.listdir(os.path.join(self.data_dir, "tiers"))), listing)
        # the first one serves on, its block intact
        self.assertTrue(d.alive())
        self.assert_block(d, 5, blob(5))
        self.put_ok(d, 6, blob(6), durable=True)
        self.assert_block(d, 6, blob(6))
        t = self.tiers(d)
        self.assertEqual((t["blocks"], t["io_errors"]), (2, 0))

    def test_a_second_kvtierd_on_the_same_unix_socket(self):
        """The engine's socket stays with the kvtierd that serves it; a file --rpc-unix
        names by mistake is not removed."""
        d = self.start()
        ino = os.lstat(self.sock_path).st_ino
        self.refused(["--ram-bytes", "1MiB", "--block-bytes", str(BB), "--rpc-unix",
                      self.sock_path], "unix socket %s is in use by another process" %
                     self.sock_path, data_dir=os.path.join(self.tmp, "data2"))
        self.assertEqual(os.lstat(self.sock_path).st_ino, ino)
        e = self.unix()
        geom, fd = e.attach()
        os.close(fd)
        self.assertEqual(geom["disk_slots"], self.tiers(d)["disk"]["slots"])  # the first one's
        e.close()
        plain = os.path.join(self.tmp, "plain")
        with open(plain, "wb") as f:
            f.write(b"not a socket\n")
        before = self.snapshot(plain)
        self.refused(["--rpc-unix", plain], "is not a socket; refusing to remove it",
                     data_dir=os.path.join(self.tmp, "data3"))
        self.assertEqual(self.snapshot(plain), before)

    def test_a_foreign_store_file_is_refused_untouched(self):
        with open(self.store, "wb") as f:
            f.write(random.Random(7).randbytes(1 << 20))
        before = self.snapshot(self.store)
        self.refused(self.tier(), "is not a kvtier store; refusing to touch it")
        self.assertEqual(self.snapshot(self.store), before)
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "tiers")))
        # a directory is refused too
        os.unlink(self.store)
        os.mkdir(self.store)
        self.refused(self.tier(), "is a directory")
        self.assertEqual(os.listdir(self.store), [])

    def test_a_store_of_another_block_size_is_refused_untouched(self):
        d = self.start(disk_bytes="4MiB")
        self.put_ok(d, 9, blob(9), durable=True)
        self.assertEqual(d.stop(), 0)
        before = self.snapshot(self.store)
        self.refused(["--ram-bytes", "1MiB", "--block-bytes", "128KiB", "--disk-path",
                      self.store, "--disk-bytes", "4MiB"], "--block-bytes must match")
        self.assertEqual(self.snapshot(self.store), before)
        d = self.restart(d)  # the store and its block are still good
        self.assert_block(d, 9, blob(9))

    def test_a_foreign_arena_file_is_refused_untouched(self):
        arena = os.path.join(self.tmp, "arena")
        with open(arena, "wb") as f:
            f.write(b"someone else's file\n" * 100)
        before = self.snapshot(arena)
        self.refused(["--ram-bytes", "1MiB", "--block-bytes", str(BB), "--arena-name", arena],
                     "arena %s" % arena, "refusing to touch it")
        self.assertEqual(self.snapshot(arena), before)
        self.refused(["--ram-bytes", "1MiB", "--block-bytes", str(BB), "--arena-name", "a/b"],
                     "give a plain file name")


class TestFullDisk(Base):
    def test_durable_puts_past_the_last_slot_evict_the_oldest(self):
        """A store of 4 slots and 10 durable puts: every put succeeds; each one past the
        fourth takes the NVMe LRU tail's slot (tiers/tio.c disk_take: its record is deleted,
        synced, before the slot is written again). The evicted blocks stay in RAM while
        there is room, so all 10 read back; after a restart only the last 4 are left."""
        d = self.start(ram="1MiB", disk_bytes=str(HEADER + 4 * BB))
        self.assertEqual(self.tiers(d)["disk"]["slots"], 4)
        for k in range(10):
            self.put_ok(d, 100 + k, blob(100 + k), durable=True)
        t = self.tiers(d)
        self.assertEqual((t["puts"], t["demotions"], t["disk_evictions"], t["disk"]["used"]),
                         (10, 10, 6, 4), t)
        self.assertEqual((t["blocks"], t["ram"]["used"], t["drops"], t["io_errors"]),
                         (10, 10, 0, 0), t)
        self.wait_pod(d, [100 + k for k in range(10)], (10, 0, 10, 0))
        for k in range(10):
            self.assert_block(d, 100 + k, blob(100 + k))
        d = self.restart(d)
        t = self.tiers(d)
        self.assertEqual((t["restored"], t["restore_bad"]), (4, 0), t)
        for k in range(6):
            self.assert_missing(d, 100 + k)
        for k in range(6, 10):
            self.assert_block(d, 100 + k, blob(100 + k))
        self.assertEqual(self.tiers(d)["checksum_failures"], 0)

    def test_ram_and_disk_both_full(self):
        """4 RAM slots and 4 disk slots, 12 durable puts: a block that leaves both is gone
        (404), the last 4 are in both; no GET returns other bytes."""
        d = self.start(ram=str(4 * BB), disk_bytes=str(HEADER + 4 * BB))
        t = self.tiers(d)
        self.assertEqual((t["ram"]["slots"], t["disk"]["slots"]), (4, 4))
        for k in range(12):
            self.put_ok(d, 200 + k, blob(200 + k), durable=True)
        t = self.tiers(d)
        self.assertEqual((t["puts"], t["demotions"], t["disk_evictions"], t["drops"]),
                         (12, 12, 8, 8), t)
        self.assertEqual((t["blocks"], t["ram"]["used"], t["disk"]["used"]), (4, 4, 4), t)
        for k in range(8):
            self.assert_missing(d, 200 + k)
        for k in range(8, 12):
            self.assert_block(d, 200 + k, blob(200 + k))
        self.wait_pod(d, [200 + k for k in range(8, 12)], (4, 0, 4, 0))
        self.wait_pod(d, [200], (0, 0, 0, 0))


class TestEngineSession(Base):
    def test_attach_reserve_commit_pin_and_release_on_close(self):
        d = self.start()
        t = self.tiers(d)
        e = self.unix()
        h, b = e.call(fx.OP_HELLO, struct.pack("<I", 1) + fx.pstr(""))
        self.assertEqual(struct.unpack_from("<I", b)[0], 1)
        geom, fd = e.attach()
        try:
            self.assertEqual((geom["slot_bytes"], geom["block_bytes"], geom["nslots"],
                              geom["disk_slots"], geom["arena_path"]),
                             (BB, BB, t["ram"]["slots"], t["disk"]["slots"], ""))
            self.assertEqual(geom["slot_off"] % 4096, 0)
            self.assertLessEqual(geom["slot_off"] + geom["nslots"] * geom["slot_bytes"],
                                 geom["map_bytes"])
            self.assertEqual(os.fstat(fd).st_size, geom["map_bytes"])
            mm = mmap.mmap(fd, geom["map_bytes"], mmap.MAP_SHARED,
                           mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

        def at(slot, n=BB):
            off = geom["slot_off"] + slot * geom["slot_bytes"]
            return mm[off:off + n]

        def write(slot, data):
            off = geom["slot_off"] + slot * geom["slot_bytes"]
            mm[off:off + len(data)] = data

        keys = [501, 502, 503]
        lens = [BB, 0, 1000]  # 0: the block size
        slots, evicted = parse_reserve(e.ok(OP_RESERVE, keys_body(keys)))
        self.assertEqual(evicted, [])
        self.assertEqual(len(set(slots)), 3)
        self.assertNotIn(SLOT_NONE, slots)
        self.assertTrue(all(s < geom["nslots"] for s in slots))
        self.assertEqual(self.tiers(d)["ram"]["reserved"], 3)
        # reserved is not held: LOOKUP and GET do not see it, a second RESERVE gets none
        self.assertEqual(parse_lookup(e.ok(OP_LOOKUP, keys_body(keys))), [])
        self.assert_missing(d, 501)
        self.assertEqual(parse_reserve(e.ok(OP_RESERVE, keys_body([501]))), ([SLOT_NONE], []))
        for k, s, n in zip(keys, slots, lens):
            write(s, blob(k, n or BB))
        self.assertEqual(count_of(e.ok(OP_COMMIT, commit_body(keys, lens))), 3)
        self.assertEqual(count_of(e.ok(OP_COMMIT, commit_body(keys, lens))), 0)  # done already
        t = self.tiers(d)
        self.assertEqual((t["ram"]["reserved"], t["ram"]["used"], t["blocks"], t["puts"]),
                         (0, 3, 3, 3), t)
        self.assertEqual(parse_lookup(e.ok(OP_LOOKUP, keys_body(keys + [504]))), [LOC_RAM] * 3)
        self.assertEqual(parse_lookup(e.ok(OP_LOOKUP, keys_body([504] + keys))), [])
        pins = parse_pin(e.ok(OP_PIN, keys_body(keys)))
        self.assertEqual(pins, [(s, n or BB) for s, n in zip(slots, lens)])
        for k, s, n in zip(keys, slots, lens):
            self.assertTrue(at(s, n or BB) == blob(k, n or BB), k)
        self.assert_block(d, 503, blob(503, 1000))  # the HTTP API sees the engine's bytes
        self.assertEqual(self.tiers(d)["ram"]["pinned"], 3)
        s, a = d.http("DELETE", "/v1/blocks/501?model=" + MODEL)
        self.assertEqual(s, 409, a)
        r = self.tcp(d)
        self.assertEqual(r.err(OP_BLOCK_DELETE, key_body(501))[:2], (ERR_EXISTS, 409))
        r.close()
        # a block PUT over HTTP shows in the engine's mapping once pinned
        self.put_ok(d, 505, blob(505))
        [(s505, n505)] = parse_pin(e.ok(OP_PIN, keys_body([505])))
        self.assertEqual(n505, BB)
        self.assertNotIn(s505, slots)
        self.assertTrue(at(s505) == blob(505))
        # a key not held: no slot
        self.assertEqual(parse_pin(e.ok(OP_PIN, keys_body([999]))), [(SLOT_NONE, 0)])
        self.assertEqual(self.tiers(d)["ram"]["pinned"], 4)
        # UNPIN on another connection releases nothing of this one
        other = self.unix()
        self.assertEqual(count_of(other.ok(OP_UNPIN, keys_body(keys))), 0)
        pins2 = parse_pin(other.ok(OP_PIN, keys_body([502])))
        self.assertEqual(pins2, [(slots[1], BB)])
        self.assertEqual(count_of(other.ok(OP_UNPIN, keys_body([502]))), 1)
        self.assertEqual(count_of(other.ok(OP_UNPIN, keys_body([502]))), 0)
        self.assertEqual(self.tiers(d)["ram"]["pinned"], 4)
        # a reservation left uncommitted
        [s506], _ = parse_reserve(e.ok(OP_RESERVE, keys_body([506])))
        self.assertNotEqual(s506, SLOT_NONE)
        t = self.tiers(d)
        self.assertEqual((t["ram"]["pinned"], t["ram"]["reserved"]), (4, 1))
        # the engine dies: its pins and its reservation go with the connection
        mm.close()
        e.close()
        t = self.wait_tiers(d, lambda t: t["ram"]["pinned"] == 0 and t["ram"]["reserved"] == 0,
                            "the closed session's pins and reservation released")
        self.assertEqual((t["blocks"], t["ram"]["used"], t["lease_expired"]), (4, 4, 0), t)
        self.assertEqual(parse_lookup(other.ok(OP_LOOKUP, keys_body([506]))), [])
        self.assertEqual(parse_lookup(other.ok(OP_LOOKUP, keys_body(keys + [505]))),
                         [LOC_RAM] * 4)
        s, a = d.http("DELETE", "/v1/blocks/501?model=" + MODEL)
        self.assertEqual((s, a), (200, {"deleted": True}))
        self.assert_missing(d, 501)
        other.close()
        # ATTACH over TCP: no fd can travel there
        r = self.tcp(d)
        st, code, msg = r.err(OP_ATTACH)
        self.assertEqual((st, code), (ERR_INVAL, 400))
        self.assertIn("Unix socket", msg)
        r.ok(fx.OP_PING)
        r.close()

    def test_block_api_over_rpc(self):
        d = self.start()
        for key, r in ((700, self.tcp(d)), (710, self.unix())):
            data = blob(key, 3000)
            self.assertEqual(r.ok(OP_BLOCK_PUT, block_put_body(key, data)), b"")
            self.assertEqual(r.ok(OP_BLOCK_GET, key_body(key)), data)
            self.assert_block(d, key, data)
            self.assertEqual(r.ok(OP_BLOCK_PUT, block_put_body(key + 1, blob(key + 1), 1)), b"")
            self.assertEqual(r.ok(OP_BLOCK_DELETE, key_body(key)), b"")
            st, code, _ = r.err(OP_BLOCK_GET, key_body(key))
            self.assertEqual((st, code), (ERR_NOT_FOUND, 404))
            st, code, _ = r.err(OP_BLOCK_DELETE, key_body(key))
            self.assertEqual((st, code), (ERR_NOT_FOUND, 404))
            self.assertEqual(count_of(r.ok(OP_PREFETCH, keys_body([key + 1]))), 0)  # in RAM
            r.close()
        t = self.tiers(d)
        self.assertEqual((t["blocks"], t["deletes"], t["disk"]["used"]), (2, 2, 2), t)
        self.assert_block(d, 711, blob(711))


class TestBadInput(Base):
    def test_bad_requests_change_nothing(self):
        d = self.start()
        self.put_ok(d, 7, blob(7, 5000))
        before = self.tiers(d)
        # ---- HTTP ----
        s, a = self.put(d, 8, blob(8, BB + 1))
        self.assertEqual(s, 413, a)
        self.assertIn("--block-bytes", a["error"])
        for q in ("", "lora=x", "model=", "model=m&foo=1", "model=m&durable=2",
                  "model=m&durable=", "model=m&durable", "model=m&model", "model=a%zz"):
            s, a = self.put(d, 8, blob(8, 100), query=q)
            self.assertEqual(s, 400, (q, a))
            self.assertIn("error", a)
        for key in ("abc", "-1", "18446744073709551616", "99999999999999999999999", "1.5",
                    "0x10", "+1", "1e3", "1%00"):
            s, a = self.put(d, key, blob(8, 100))
            self.assertEqual(s, 400, (key, a))
            s, a = d.http("GET", "/v1/blocks/%s?model=m" % key)
            self.assertEqual(s, 400, (key, a))
        s, a = self.put(d, 8, b"")
        self.assertEqual(s, 400, a)
        s, a = d.http("GET", "/v1/blocks/7?model=m&durable=1")
        self.assertEqual(s, 400, a)
        s, a = d.http("POST", "/v1/blocks/7?model=m", body=b"x")
        self.assertEqual(s, 405, a)
        self.assert_missing(d, 7, model="other")
        self.assert_missing(d, 7, lora="ad")
        self.assert_missing(d, 8)
        s, a = d.http("DELETE", "/v1/blocks/8?model=m")
        self.assertEqual(s, 404, a)
        s, a = d.http("DELETE", "/v1/blocks/7?model=other")
        self.assertEqual(s, 404, a)
        for body in ({"model": "m"}, {"model": "m", "keys": [1], "token_ids": [1]},
                     {"keys": [7]}, {"model": "", "keys": [7]}, {"model": "m", "keys": ["x"]},
                     {"model": "m", "keys": [1.5]}, {"model": "m", "token_ids": [-1]}, "[1]",
                     "{"):
            s, a = d.http("POST", "/v1/prefetch", body)
            self.assertEqual(s, 400, (body, a))
        # ---- RPC: each malformed body gets a 400 and the connection goes on ----
        r = self.tcp(d)
        trunc = keys_body([1, 2, 3])[:-8]
        bad = [(OP_LOOKUP, fx.pstr(MODEL) + fx.pstr("") + struct.pack("<I", 0)),
               (OP_LOOKUP, trunc),
               (OP_PIN, keys_body([1]) + b"\0"),
               (OP_RESERVE, keys_body([1], model="")),
               (OP_UNPIN, b""),
               (OP_PREFETCH, fx.pstr(MODEL)),
               (OP_COMMIT, commit_body([1], ok=2)),
               (OP_COMMIT, commit_body([1])[:-1]),
               (OP_BLOCK_PUT, block_put_body(8, blob(8, 100), durable=2)),
               (OP_BLOCK_PUT, block_put_body(8, b"")),
               (OP_BLOCK_PUT, block_put_body(8, blob(8, 100), length=101)),
               (OP_BLOCK_PUT, block_put_body(8, blob(8, 100), length=99)),
               (OP_BLOCK_GET, key_body(7)[:-1]),
               (OP_BLOCK_GET, key_body(7, model="")),
               (OP_BLOCK_DELETE, key_body(7) + b"\0"),
               (OP_ATTACH, b"\0")]
        for op, body in bad:
            st, code, msg = r.err(op, body)
            self.assertEqual((st, code), (ERR_INVAL, 400), (hex(op), msg))
            self.assertEqual(r.ok(fx.OP_PING), b"")
        st, code, msg = r.err(OP_BLOCK_PUT, block_put_body(8, blob(8, BB + 1)))
        self.assertEqual((st, code), (ERR_TOO_BIG, 413), msg)
        st, code, _ = r.err(OP_BLOCK_GET, key_body(7, model="other"))
        self.assertEqual((st, code), (ERR_NOT_FOUND, 404))
        # well-formed calls that name nothing held change nothing either
        self.assertEqual(count_of(r.ok(OP_COMMIT, commit_body([7, 8]))), 0)
        self.assertEqual(count_of(r.ok(OP_UNPIN, keys_body([7]))), 0)
        self.assertEqual(count_of(r.ok(OP_PREFETCH, keys_body([8]))), 0)
        self.assertEqual(r.ok(fx.OP_PING), b"")
        r.close()
        after = self.tiers(d)
        for k in ("ram", "disk", "blocks", "puts", "deletes", "demotions", "drops",
                  "ram_evictions", "promotions", "prefetches", "io_errors", "write_bytes"):
            self.assertEqual(after[k], before[k], k)
        self.assertEqual((after["blocks"], after["puts"], after["ram"]["used"]), (1, 1, 1))
        self.assert_block(d, 7, blob(7, 5000))

    def test_durable_without_a_disk(self):
        d = self.start(disk=False)
        s, a = self.put(d, 1, blob(1), durable=True)
        self.assertEqual(s, 501, a)
        self.assertIn("--disk-path", a["error"])
        self.assert_missing(d, 1)
        t = self.tiers(d)
        self.assertEqual((t["blocks"], t["puts"], t["disk"]["slots"]), (0, 0, 0), t)
        s, a = d.http("POST", "/v1/prefetch", {"model": MODEL, "keys": [1]})
        self.assertEqual((s, a), (200, {"blocks": 1, "started": 0}))

    def test_no_tiers_answers_501(self):
        d = fx.Daemon(BIN)
        d.tier_flags = []
        self.daemons.append(d)
        self.assertIsNone(d.stats()["tiers"])
        s, a = self.put(d, 1, b"x")
        self.assertEqual(s, 501, a)
        r = self.tcp(d)
        st, code, _ = r.err(OP_LOOKUP, keys_body([1]))
        self.assertEqual(code, 501)
        r.close()


@unittest.skipIf(hv.xxhash is None, "python3-xxhash is needed for the standard's keys")
class TestPrefetch(Base):
    def test_prefetch_by_tokens_and_keys_after_a_restart(self):
        d = self.start()
        toks = list(range(5000, 5000 + 16 * 4 + 5))  # 4 full blocks of 16 and a tail
        _, chain = hv.hash_seq(toks, 16)
        self.assertEqual(len(chain), 4)
        lkeys = [9001, 9002, 9003]
        for k in chain:
            self.put_ok(d, k, blob(k), durable=True)
        for k in lkeys:
            self.put_ok(d, k, blob(k, 7000), durable=True, lora="ad1")
        d = self.restart(d)
        t = self.tiers(d)
        self.assertEqual((t["restored"], t["ram"]["used"]), (7, 0))
        s, a = d.http("POST", "/v1/prefetch", {"model": MODEL, "token_ids": toks})
        self.assertEqual((s, a), (200, {"blocks": 4, "started": 4}))
        t = self.wait_tiers(d, lambda t: t["ram"]["used"] == 4, "4 blocks promoted")
        self.assertEqual((t["prefetches"], t["promotions"], t["checksum_failures"]), (4, 4, 0))
        s, a = d.http("POST", "/v1/prefetch", {"model": MODEL, "token_ids": toks})
        self.assertEqual((s, a), (200, {"blocks": 4, "started": 0}))  # in RAM already
        s, a = d.http("POST", "/v1/prefetch", {"model": MODEL, "keys": lkeys})
        self.assertEqual((s, a), (200, {"blocks": 3, "started": 0}))  # another namespace
        s, a = d.http("POST", "/v1/prefetch", {"model": "nobody", "token_ids": toks})
        self.assertEqual((s, a), (200, {"blocks": 4, "started": 0}))
        s, a = d.http("POST", "/v1/prefetch", {"model": MODEL, "lora_name": "ad1",
                                               "keys": lkeys + [1]})
        self.assertEqual((s, a), (200, {"blocks": 4, "started": 3}))
        t = self.wait_tiers(d, lambda t: t["ram"]["used"] == 7, "7 blocks promoted")
        self.assertEqual((t["prefetches"], t["promotions"]), (7, 7))
        for k in chain:
            self.assert_block(d, k, blob(k))
        for k in lkeys:
            self.assert_block(d, k, blob(k, 7000), lora="ad1")
        t = self.tiers(d)
        self.assertEqual((t["hits_ram"], t["hits_disk"], t["promotions"]), (7, 0, 7), t)
        # again cold: PREFETCH over RPC, and PIN promotes from NVMe before it answers
        d = self.restart(d)
        r = self.tcp(d)
        self.assertEqual(count_of(r.ok(OP_PREFETCH, keys_body(chain))), 4)
        r.close()
        t = self.wait_tiers(d, lambda t: t["ram"]["used"] == 4, "4 blocks promoted")
        e = self.unix()
        geom, fd = e.attach()
        mm = mmap.mmap(fd, geom["map_bytes"], mmap.MAP_SHARED, mmap.PROT_READ)
        os.close(fd)
        self.assertEqual(parse_lookup(e.ok(OP_LOOKUP, keys_body(lkeys, lora="ad1"))),
                         [LOC_DISK] * 3)
        pins = parse_pin(e.ok(OP_PIN, keys_body(lkeys, lora="ad1")))
        self.assertEqual([n for _, n in pins], [7000] * 3)
        for k, (slot, n) in zip(lkeys, pins):
            off = geom["slot_off"] + slot * geom["slot_bytes"]
            self.assertTrue(mm[off:off + n] == blob(k, 7000), k)
        t = self.tiers(d)
        # the LOOKUP and the PIN each found the three on NVMe
        self.assertEqual((t["ram"]["used"], t["ram"]["pinned"], t["lookups"], t["hits_disk"]),
                         (7, 3, 3, 6), t)
        mm.close()
        e.close()
        self.wait_tiers(d, lambda t: t["ram"]["pinned"] == 0, "pins released")


class Publishing:
    """A kvtierd that publishes, and what it published (with Base)."""

    def replay(self, endpoint):
        """The events of every batch the publisher still holds, oldest first."""
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint)
        try:
            dealer.send_multipart([b"", struct.pack(">Q", 0)])
            got = []
            while True:
                self.assertTrue(dealer.poll(10000), "no replay answer")
                f = dealer.recv_multipart()
                if f[-2] == b"\xff" * 8:
                    return got
                got.append(msgpack.unpackb(f[-1])[1])
        finally:
            dealer.close(0)

    def stored_on(self, batches, medium):
        keys = []
        for events in batches:
            for ev in events:
                if ev[0] == "BlockStored" and medium in ev:
                    keys += ev[1]
        return keys

    def start_publishing(self):
        """A kvtierd that publishes (where python3-zmq is), and its replay port (or None)."""
        if zmq is None:
            return self.start(), None
        pub, rep = fx.free_port(), fx.free_port()
        return self.start(extra=["--publish", "tcp://127.0.0.1:%d" % pub,
                                 "--publish-replay", "tcp://127.0.0.1:%d" % rep]), rep


class TestIndex(Publishing, Base):
    def test_the_pods_tiers_in_the_index_and_on_the_publisher(self):
        d, rep = self.start_publishing()
        for k in (11, 12, 13):
            self.put_ok(d, k, blob(k))
        self.wait_pod(d, [11, 12, 13], (3, 0, 3, 0))
        self.put_ok(d, 11, blob(11, tag=1))  # held already: not rewritten
        self.assert_block(d, 11, blob(11))
        self.put_ok(d, 31, blob(31), lora="ad")
        self.wait_pod(d, [31], (1, 0, 1, 0), lora="ad")
        self.wait_pod(d, [31], (0, 0, 0, 0))
        s, a = d.http("DELETE", "/v1/blocks/12?model=" + MODEL)
        self.assertEqual(s, 200, a)
        self.wait_pod(d, [11, 12, 13], (1, 0, 1, 0))
        for k in (21, 22):
            self.put_ok(d, k, blob(k), durable=True)
        self.wait_pod(d, [21, 22], (2, 0, 2, 0))  # in RAM too: the fastest tier counts
        st = self.tiers(d)
        self.assertEqual(st["changes_lost"], 0)
        if zmq is not None:
            batches = self.replay("tcp://127.0.0.1:%d" % rep)
            self.assertEqual(sorted(self.stored_on(batches, "CPU")), [11, 12, 13, 21, 22, 31])
            self.assertEqual(sorted(self.stored_on(batches, "DISK")), [21, 22])
        # warm restart: what is on NVMe is back on DISK, in the index and published
        d = self.restart(d)
        self.wait_pod(d, [21, 22], (2, 0, 0, 2))
        self.wait_pod(d, [11], (0, 0, 0, 0))
        if zmq is not None:
            batches = self.replay("tcp://127.0.0.1:%d" % rep)
            self.assertEqual(sorted(self.stored_on(batches, "DISK")), [21, 22])
        self.assert_block(d, 21, blob(21))  # promoted: now in RAM and on NVMe
        self.wait_pod(d, [21, 22], (2, 0, 1, 1))
        if zmq is not None:
            batches = self.replay("tcp://127.0.0.1:%d" % rep)
            self.assertEqual(self.stored_on(batches, "CPU"), [21])


def probe():
    """None when this machine runs the store (O_DIRECT in /tmp, io_uring), else why not."""
    fd = None
    path = tempfile.mktemp(prefix="kvtier_odirect_", dir="/tmp")
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    except OSError as e:
        return "no O_DIRECT in /tmp: %s" % e
    finally:
        if fd is not None:
            os.close(fd)
        if os.path.exists(path):
            os.unlink(path)
    tmp = tempfile.mkdtemp(prefix="kvtier_probe_", dir="/tmp")
    try:
        d = fx.Daemon(BIN, "--ram-bytes", "1MiB", "--block-bytes", str(BB), "--disk-path",
                      os.path.join(tmp, "store"), "--disk-bytes", "1MiB",
                      data_dir=os.path.join(tmp, "data"))
        d.stop()
        d.cleanup()
    except RuntimeError as e:
        if "io_uring" in str(e) or "O_DIRECT" in str(e):
            return "the NVMe store cannot run here: %s" % str(e).splitlines()[-1]
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return None


if __name__ == "__main__":
    BIN, SANITIZED = fx.binary_from_argv("test_tiers.py")
    why = probe()
    if why:
        print("SKIP: " + why)
        sys.exit(77)
    unittest.main(verbosity=2)
