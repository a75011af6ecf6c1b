#!/usr/bin/python3
"""Integration tests of TRANSFER between two kvtierd on one host by the same-host path
(issue 19): each daemon has --rpc-unix, so the puller (or pusher) maps its peer's arena (the
sealed memfd ATTACH hands over) and copies, without UCX.

- Pull and push of a few hundred blocks of several sizes, byte-exact, through the mapping
  (/v1/stats "mapped_peers"), nothing held after.
- Every fault of test_transfer_faults.py again with both daemons on the same-host path, and
  every transfer that moved bytes checked to have gone through a mapping.
- A block corrupted in the source's memfd (written through an ATTACH mapping of this test).
- The fall-backs to UCX: the receiver's --shm off, a source without --rpc-unix, a named
  (unsealed) arena, a socket path that leads to another kvtierd.
- The source killed: the receiver unmaps its arena at once (/proc/PID/maps) and keeps no fd;
  the source restarted: a new mapping of the new arena, one handshake more.

Usage: test_transfer_shm.py path/to/kvtierd   (exit 77 = skipped: UCX does not start)
Waits are bounded polls, never timings.
"""

import os
import shutil
import signal
import struct
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kvtierd_fixture as fx  # noqa: E402
import test_transfer_daemon as td  # noqa: E402
import test_transfer_faults as tf  # noqa: E402
from test_transfer_daemon import BB, MODEL, OP_XHELLO, blob, hello_ans  # noqa: E402

CHECKSUM = 3


def unix_path(test):
    """A fresh socket path in a directory the test removes."""
    d = tempfile.mkdtemp(prefix="kvt_shm_")
    test.addCleanup(shutil.rmtree, d, True)
    return os.path.join(d, "k.sock")


def arena_maps(d):
    """How many mappings of a kvtier arena memfd the daemon has (its own is one)."""
    with open("/proc/%d/maps" % d.proc.pid) as f:
        return sum(1 for line in f if "memfd:kvtier-arena" in line)


class Shm:
    """Mixed into the fault classes: every daemon on the same-host path, and a transfer that
    moved bytes must have gone through a mapping."""

    def start(self, *flags, **kw):
        return super().start(*flags, "--rpc-unix", unix_path(self), **kw)

    def start_big(self, pod, *flags, lease="2s"):
        return super().start_big(pod, *flags, "--rpc-unix", unix_path(self), lease=lease)

    def transfer(self, d, peer, keys, direction=tf.PULL, timeout_ms=10000, stream=False):
        t = super().transfer(d, peer, keys, direction=direction, timeout_ms=timeout_ms,
                             stream=stream)
        if t["bytes"] > 0:  # /v1/stats is refreshed every --stats-period
            td.wait_for(lambda: d.stats()["transfer"]["mapped_peers"] >= 1,
                        "a mapping (bytes moved without one?)")
        return t


class TestPushShm(Shm, tf.TestPush):
    pass


class TestFaultsShm(Shm, tf.TestFaults):
    def test_corrupted_at_the_source(self):
        """The source's memfd written through an engine's mapping of it: the sum
        recorded at the put no longer matches, the receiver refuses the block."""
        a, b = self.start(), self.start()
        self.put(a, 331, blob(331))
        self.put(a, 332, blob(332))
        r = self.rpc(a)
        h = hello_ans(r.ok(OP_XHELLO, struct.pack("<Q", 0)))
        lease, pins = td.pin_ans(r.ok(td.OP_XPIN, td.keys_req(h["inc"], 0, [331])))
        self.assertEqual(td.count(r.ok(td.OP_XRELEASE, td.lease_req(h["inc"], lease))), 1)
        # the arena as an engine maps it (ATTACH on the socket XFER_HELLO named)
        c = td.kvtier.Client("unix:" + h["unix_path"], timeout=10.0)
        with c.attach() as arena:
            slot = arena.slot(pins[0][0])
            slot[100:164] = b"\xee" * 64
            slot.release()
        c.close()
        for direction in (tf.PULL, tf.PUSH):
            if direction == tf.PULL:
                t = self.transfer(b, self.peer(a), [331, 332])
            else:
                t = self.transfer(a, self.peer(b), [331], direction=tf.PUSH)
            self.assertEqual(t["failed"], {331: CHECKSUM}, (direction, t))
            self.absent(b, [331])
            self.settled(a, b)
        self.assertEqual(self.get(b, 332), blob(332))

class TestKilledMidTransferShm(Shm, tf.TestKilledMidTransfer):
    # the puller's --lease of 15 ms: over a mapping the 48 MiB are copied in one go, before a
    # renewal is due; every block still lands byte-exact
    RENEWS = False


class TestIndexShm(Shm, tf.TestIndex):
    pass


class TestSameHost(tf.Faults):
    def start_with(self, *flags, ram_blocks=16, pod="sc"):
        d = fx.Daemon(td.BIN, "--ram-bytes", str(ram_blocks * BB), "--block-bytes", str(BB),
                      "--pod", pod, "--lease", "2s", *flags, env=td.ENV)
        self.addCleanup(d.cleanup)
        self.addCleanup(self.stopped, d)
        self.addCleanup(lambda: self.dump(d))
        return d

    def counters(self, d, mapped, handshakes):
        """Waits for /v1/stats (refreshed every --stats-period) to show these counts."""
        def now():
            st = d.stats()["transfer"]
            return st["mapped_peers"], st["handshakes"]
        td.wait_for(lambda: now() == (mapped, handshakes), "mapped_peers, handshakes == %d, %d"
                    % (mapped, handshakes))

    def test_many_blocks_both_ways(self):
        """300 blocks of 1 byte .. 16 KiB: 150 pulled, 150 pushed, byte-exact; one mapping
        serves both directions."""
        a = self.start_with("--rpc-unix", unix_path(self), ram_blocks=320, pod="a")
        b = self.start_with("--rpc-unix", unix_path(self), ram_blocks=320, pod="b")
        sizes = [1, 7, 4096, 5000, BB - 1, BB]
        pull = list(range(10000, 10150))
        push = list(range(20000, 20150))
        for i, k in enumerate(pull):
            self.put(a, k, blob(k, sizes[i % len(sizes)]))
        for i, k in enumerate(push):
            self.put(b, k, blob(k, sizes[i % len(sizes)]))
        t = self.transfer(b, self.peer(a), pull)
        self.assertEqual((sorted(t["transferred"]), t["failed"]), (pull, {}))
        t = self.transfer(b, self.peer(a), push, direction=tf.PUSH)
        self.assertEqual((sorted(t["transferred"]), t["failed"]), (push, {}))
        self.assertEqual(t["bytes"], sum(sizes[i % len(sizes)] for i in range(150)))
        for i, k in enumerate(pull):
            self.assertEqual(self.get(b, k), blob(k, sizes[i % len(sizes)]), k)
        for i, k in enumerate(push):
            self.assertEqual(self.get(a, k), blob(k, sizes[i % len(sizes)]), k)
        self.counters(b, 1, 1)
        self.assertEqual(arena_maps(b), 2)  # its own and a's
        self.settled(a, b)

    def test_falls_back_to_ucx(self):
        """Where the arena may not be mapped, the transfer takes UCX, and works."""
        name = "kvt_shm_named_%d" % os.getpid()
        self.addCleanup(lambda: os.path.exists("/dev/shm/" + name) and
                        os.unlink("/dev/shm/" + name))
        src = self.start_with("--rpc-unix", unix_path(self), pod="src")
        cases = {
            "the receiver's --shm off": (src, self.start_with("--shm=off", pod="r1")),
            "a source without --rpc-unix": (self.start_with(pod="s2"), self.start_with(pod="r2")),
            "a named arena (not a sealed memfd)":
                (self.start_with("--rpc-unix", unix_path(self), "--arena-name", name, pod="s3"),
                 self.start_with(pod="r3")),
        }
        # a socket path that leads to another kvtierd: the source's socket moved away, and
        # another daemon listening where the source says its socket is
        path = unix_path(self)
        s4 = self.start_with("--rpc-unix", path, pod="s4")
        os.rename(path, path + ".moved")
        self.start_with("--rpc-unix", path, pod="other")
        cases["a socket that leads to another kvtierd"] = (s4, self.start_with(pod="r4"))
        for why, (s, r) in cases.items():
            k = 600 + len(why)
            self.put(s, k, blob(k))
            t = self.transfer(r, self.peer(s), [k])
            self.assertEqual(t["transferred"], [k], (why, t))
            self.assertEqual(self.get(r, k), blob(k), why)
            self.counters(r, 0, 1)
            self.settled(s, r)

    def test_source_killed_then_restarted(self):
        """The source killed: the receiver drops its mapping at once (no transfer needed) and
        keeps no descriptor of it; a pull then fails peer_down. A new source on the same
        port and socket: one handshake more, a new mapping, exact bytes."""
        path = unix_path(self)
        a = self.start_with("--rpc-unix", path, pod="a")
        b = self.start_with("--rpc-unix", unix_path(self), pod="b")
        self.put(a, 701, blob(701))
        t = self.transfer(b, self.peer(a), [701])
        self.assertEqual(t["transferred"], [701])
        fds = b.open_fds()  # the watched socket among them
        self.counters(b, 1, 1)
        self.assertEqual(arena_maps(b), 2)
        port = a.rpc_port
        a.proc.kill()
        a.proc.wait()
        td.wait_for(lambda: arena_maps(b) == 1, "the dead source's arena unmapped")
        td.wait_for(lambda: b.open_fds() == fds - 1, "its socket closed")
        t = self.transfer(b, self.peer(a), [702], timeout_ms=3000)
        self.assertEqual(t["failed"], {702: tf.PEER_DOWN}, t)
        if os.path.exists(path):
            os.unlink(path)  # a killed kvtierd leaves its socket file
        a2 = None
        for _ in range(20):
            try:
                a2 = self.start_with("--rpc-unix", path, "--rpc-listen", "127.0.0.1:%d" % port,
                                     pod="a2")
                break
            except RuntimeError:
                pass
        self.assertIsNotNone(a2, "the source could not restart on its port")
        self.put(a2, 702, blob(702, 999))
        t = self.transfer(b, self.peer(a2), [702])
        self.assertEqual(t["transferred"], [702], t)
        self.assertEqual(self.get(b, 702), blob(702, 999))
        self.counters(b, 2, 2)
        self.assertEqual(arena_maps(b), 2)
        self.settled(a2, b)
        # the receiver stopped cleanly with a mapping held: nothing leaks (ASan checks)
        self.assertEqual(b.stop(), 0)


if __name__ == "__main__":
    td.setup("test_transfer_shm.py")
    unittest.main(verbosity=2)
