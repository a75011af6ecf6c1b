#!/usr/bin/python3
"""Integration tests of TRANSFER between two kvtierd on loopback (issue 19): push, and the
faults: the peer down, a key gone at the source, a timeout (the peer stopped with SIGSTOP),
a block corrupted at the source after it was stored, the receiver killed; and the blocks
that arrive in the receiver's index and on its publisher.

In every case: the answer sorts each key, a failed key is never visible at the receiver
(a block GET is 404), nothing stays pinned or reserved on either side (/v1/stats), and both
daemons still answer.

Usage: test_transfer_faults.py path/to/kvtierd   (exit 77 = skipped: UCX does not start)
Blocks are small (16 KiB, an arena of 256 KiB). Waits are bounded polls, never timings.
"""

import os
import signal
import struct
import sys
import unittest

import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kvtierd_fixture as fx  # noqa: E402
import test_transfer_daemon as td  # noqa: E402
from test_transfer_daemon import (BB, MODEL, OP_TRANSFER, OP_XHELLO, OP_XPIN,  # noqa: E402
                                  OP_XRELEASE, blob, count, hello_ans, keys_req, lease_req,
                                  pin_ans, transfer_ans, transfer_req)

try:  # Debian's python3-zmq / python3-msgpack: the publisher's replay
    import msgpack
    import zmq
except ImportError:
    zmq = msgpack = None

PULL, PUSH = 0, 1
STREAM = 1  # KVT_PROTO_XFER_STREAM
PEER_DOWN, CHECKSUM, TIMEOUT = 1, 3, 4


class Faults(td.Base):
    def start(self, *flags, pod="sc"):
        d = fx.Daemon(td.BIN, "--ram-bytes", str(16 * BB), "--block-bytes", str(BB), "--pod", pod,
                      "--lease", "2s", *flags, env=td.ENV)
        self.addCleanup(d.cleanup)
        self.addCleanup(self.stopped, d)
        self.addCleanup(lambda: self.dump(d))
        return d

    def stopped(self, d):
        """SIGTERM (an ASan build checks for leaks then); a stopped one is continued first."""
        if d.alive():
            d.proc.send_signal(signal.SIGCONT)
        self.assertIn(d.stop(), (0, -signal.SIGKILL))

    def peer(self, d):
        return "127.0.0.1:%d" % d.rpc_port

    def transfer(self, d, peer, keys, direction=PULL, timeout_ms=10000, stream=False):
        return transfer_ans(self.rpc(d).ok(OP_TRANSFER, transfer_req(
            peer, keys, timeout_ms=timeout_ms, direction=direction, flags=STREAM if stream else 0)))

    def settled(self, *ds):
        """Nothing pinned or reserved, no lease held, and both front ends answer."""
        for d in ds:
            td.wait_for(lambda: self.held(d) == (0, 0), "nothing pinned or reserved")
            td.wait_for(lambda: d.stats()["transfer"]["leases"] == 0 or self.sweep(d),
                        "no lease held")
            self.assertEqual(d.http("GET", "/healthz")[0], 200)
            r = self.rpc(d)
            h, _ = r.call(fx.OP_PING)
            self.assertEqual(h["flags"], fx.F_RESPONSE)

    def sweep(self, d):
        """Leases expire lazily, at the next lease operation: one renew of a lease never held."""
        r = self.rpc(d)
        inc = hello_ans(r.ok(OP_XHELLO, struct.pack("<Q", 0)))["inc"]
        r.ok(td.OP_XRENEW, lease_req(inc, 1 << 60, 1000))
        return d.stats()["transfer"]["leases"] == 0

    def absent(self, d, keys):
        for k in keys:
            self.assertIsNone(self.get(d, k), "key %d visible" % k)


class TestPush(Faults):
    def test_push(self):
        a, b = self.start(), self.start()
        keys = [201, 202, 203, 204]
        for k in keys[:3]:
            self.put(a, k, blob(k, BB - 5 * k))
        t = self.transfer(a, self.peer(b), keys, direction=PUSH)
        self.assertEqual(sorted(t["transferred"]), keys[:3], t)
        self.assertEqual((t["missing"], t["failed"]), ([204], {}))
        self.assertEqual(t["bytes"], sum(BB - 5 * k for k in keys[:3]))
        for k in keys[:3]:
            self.assertEqual(self.get(b, k), blob(k, BB - 5 * k))
        self.absent(b, [204])
        # held there already: transferred, nothing moved
        t = self.transfer(a, self.peer(b), keys[:2], direction=PUSH)
        self.assertEqual((sorted(t["transferred"]), t["bytes"]), (keys[:2], 0))
        self.settled(a, b)
        def counted():  # /v1/stats is refreshed every --stats-period
            st = a.stats()["transfer"]
            return (st["transferred"], st["missing"], st["failed"]) == (5, 1, 0)
        td.wait_for(counted, "the pusher's counters")

    def test_streaming_push(self):
        """A push with stream set, made before the prefill has written every block: what is
        held goes at once, the rest as each block is committed here, and the call answers
        when the last one went; a key never written is missing when the time is up."""
        import threading
        a, b = self.start(), self.start()
        keys = [221, 222, 223, 224, 225]
        for k in keys[:2]:
            self.put(a, k, blob(k, BB - k))
        out = {}
        th = threading.Thread(target=lambda: out.setdefault("t", self.transfer(
            a, self.peer(b), keys, direction=PUSH, timeout_ms=20000, stream=True)))
        th.start()
        td.wait_for(lambda: self.get(b, 222) is not None, "the first round at the receiver")
        self.assertTrue(th.is_alive(), "the push ended before the rest was written")
        self.absent(b, keys[2:])
        for k in keys[2:]:  # the engine commits the rest, one block at a time
            self.put(a, k, blob(k, BB - k))
        th.join(60)
        self.assertFalse(th.is_alive())
        t = out["t"]
        self.assertEqual((sorted(t["transferred"]), t["missing"], t["failed"]), (keys, [], {}), t)
        self.assertEqual(t["bytes"], sum(BB - k for k in keys))
        for k in keys:
            self.assertEqual(self.get(b, k), blob(k, BB - k))
        # a key that never comes: missing once the call's time is up; the held one went; the
        # polling for it is not a lookup (no misses in the tier's stats)
        def counts():
            st = a.stats()
            return st["transfer"]["transfers"], st["tiers"]["misses"]
        _, misses = td.wait_for(lambda: (lambda c: c if c[0] == 1 else None)(counts()),
                                 "the first push counted")
        t = self.transfer(a, self.peer(b), [221, 229], direction=PUSH, timeout_ms=300,
                          stream=True)
        self.assertEqual((t["transferred"], t["missing"], t["failed"]), ([221], [229], {}), t)
        self.assertEqual(td.wait_for(lambda: (lambda c: c if c[0] == 2 else None)(counts()),
                                     "the second push counted")[1], misses)
        self.absent(b, [229])
        # stream is for a push: a pull that asks for it is refused
        s, ans = a.http("POST", "/v1/transfer", {"peer": self.peer(b), "model": MODEL,
                                                 "keys": [1], "stream": True})
        self.assertEqual(s, 400, ans)
        self.assertIn("stream", ans["error"])
        self.settled(a, b)

    def test_receiver_killed(self):
        a, b = self.start(), self.start()
        for k in (211, 212):
            self.put(a, k, blob(k))
        t = self.transfer(a, self.peer(b), [211], direction=PUSH)
        self.assertEqual(t["transferred"], [211])  # the endpoint is cached now
        b.proc.kill()
        b.proc.wait()
        t = self.transfer(a, self.peer(b), [212], direction=PUSH, timeout_ms=3000)
        self.assertEqual(t["failed"], {212: PEER_DOWN}, t)
        self.settled(a)
        self.assertEqual(self.get(a, 212), blob(212))


class TestFaults(Faults):
    def test_peer_down(self):
        a = self.start()
        self.put(a, 301, blob(301))
        nobody = "127.0.0.1:%d" % fx.free_port()
        for direction in (PULL, PUSH):
            t = self.transfer(a, nobody, [301], direction=direction, timeout_ms=2000)
            self.assertEqual(t["failed"], {301: PEER_DOWN}, (direction, t))
        self.settled(a)

    def test_key_gone_at_the_source(self):
        a, b = self.start(), self.start()
        keys = [311, 312]
        for k in keys:
            self.put(a, k, blob(k))
        # deleted between a lookup (the router's query finds both) and the pull
        def found():  # the index learns the puts through the writer: a moment later
            s, ans = a.http("POST", "/v1/query", {"model": MODEL, "block_hashes": keys})
            return s == 200 and [p["cpu"] for p in ans["pods"] if p["pod"] == "sc"] == [2]
        td.wait_for(found, "the query finds both blocks on the source")
        s, body = a.http("DELETE", "/v1/blocks/311?model=" + MODEL)
        self.assertEqual(s, 200, body)
        # evicted: 16 more blocks fill the 16 slots of the source's RAM
        for k in range(400, 416):
            self.put(a, k, blob(k))
        t = self.transfer(b, self.peer(a), keys)
        self.assertEqual(sorted(t["missing"]), keys, t)
        self.absent(b, keys)
        self.settled(a, b)

    def test_timeout(self):
        a, b = self.start(), self.start()
        self.put(a, 321, blob(321))
        a.proc.send_signal(signal.SIGSTOP)
        try:
            t = self.transfer(b, self.peer(a), [321], timeout_ms=1000)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        self.assertEqual(t["failed"], {321: TIMEOUT}, t)
        self.absent(b, [321])
        self.settled(a, b)
        # the source serves again: the same pull now succeeds
        t = self.transfer(b, self.peer(a), [321])
        self.assertEqual(t["transferred"], [321], t)
        self.assertEqual(self.get(b, 321), blob(321))
        self.settled(a, b)

    def test_corrupted_at_the_source(self):
        name = "kvt_xfer_faults_%d" % os.getpid()
        self.addCleanup(lambda: os.path.exists("/dev/shm/" + name) and os.unlink("/dev/shm/" + name))
        a, b = self.start("--arena-name", name), self.start()
        self.put(a, 331, blob(331))
        self.put(a, 332, blob(332))
        # where 331 lies: pinned once through the raw frames, then released
        r = self.rpc(a)
        h = hello_ans(r.ok(OP_XHELLO, struct.pack("<Q", 0)))
        lease, pins = pin_ans(r.ok(OP_XPIN, keys_req(h["inc"], 0, [331])))
        self.assertEqual(pins[0][2], xxhash.xxh3_64_intdigest(blob(331)))  # the recorded sum
        self.assertEqual(count(r.ok(OP_XRELEASE, lease_req(h["inc"], lease))), 1)
        with open("/dev/shm/" + name, "r+b") as f:
            f.seek(os.sysconf("SC_PAGE_SIZE") + pins[0][0] * h["slot_bytes"] + 100)
            f.write(b"\xee" * 64)
        # the source still hands out the sum recorded at the put: the receiver sees the damage
        for direction, (src, dst) in ((PULL, (a, b)), (PUSH, (a, b))):
            if direction == PULL:
                t = self.transfer(dst, self.peer(src), [331, 332])
            else:
                t = self.transfer(src, self.peer(dst), [331], direction=PUSH)
            self.assertEqual(t["failed"], {331: CHECKSUM}, (direction, t))
            self.absent(b, [331])
            self.settled(a, b)
        self.assertEqual(self.get(b, 332), blob(332))


class TestKilledMidTransfer(Faults):
    BIG = 1 << 20  # 48 blocks of 1 MiB: 48 MB over loopback tcp
    NKEYS = 48

    RENEWS = True  # a pull longer than the lease renews it (not so a copy from a mapping)

    def start_big(self, pod, *flags, lease="2s"):
        d = fx.Daemon(td.BIN, "--ram-bytes", str((self.NKEYS + 8) * self.BIG), "--block-bytes",
                      str(self.BIG), "--pod", pod, "--lease", lease, "--stats-period", "1ms",
                      *flags, env=td.ENV)
        self.addCleanup(d.cleanup)
        self.addCleanup(self.stopped, d)
        self.addCleanup(lambda: self.dump(d))
        return d

    def killed_while(self, call, victim, busy):
        """Runs @call in a thread, SIGKILLs @victim once busy(stats) holds, and returns the
        call's answer."""
        import threading
        out = {}
        th = threading.Thread(target=lambda: out.setdefault("t", call()))
        th.start()
        td.wait_for(lambda: busy(victim.stats()["tiers"]["ram"]) or not th.is_alive(),
                    "the transfer under way (or over)")
        victim.proc.kill()
        victim.proc.wait()
        th.join(60)
        self.assertFalse(th.is_alive(), "the transfer did not return")
        return out["t"]

    def test_receiver_killed_during_a_push(self):
        """The receiver is killed once it has reserved the push's slots: every key comes
        back transferred or failed, and the sender unpins all of them."""
        big, keys = self.BIG, list(range(800, 800 + self.NKEYS))
        a, b = self.start_big("src"), self.start_big("dst")
        for k in keys:
            self.put(a, k, blob(k, big))
        t = self.killed_while(
            lambda: self.transfer(a, self.peer(b), keys, direction=PUSH, timeout_ms=20000), b,
            lambda ram: ram["reserved"] > 0)
        self.assertEqual(sorted(t["transferred"] + list(t["failed"])), keys, t)
        self.assertTrue(all(why in (PEER_DOWN, TIMEOUT) for why in t["failed"].values()), t)
        td.wait_for(lambda: self.held(a) == (0, 0), "nothing pinned at the sender")
        self.assertEqual(a.http("GET", "/healthz")[0], 200)
        sys.stderr.write("killed mid-push: %d transferred, %d failed\n"
                         % (len(t["transferred"]), len(t["failed"])))

    def test_lease_renewed_during_a_pull(self):
        """A pull longer than the puller's --lease: the source's lease is asked for that
        long and renewed (XFER_RENEW) every third of it while the bytes cross."""
        big, keys = self.BIG, list(range(900, 900 + self.NKEYS))
        a, b = self.start_big("src"), self.start_big("dst", lease="15ms")
        for k in keys:
            self.put(a, k, blob(k, big))
        t = self.transfer(b, self.peer(a), keys, timeout_ms=20000)
        self.assertEqual(sorted(t["transferred"]), keys, t)
        for k in keys[::7]:
            self.assertEqual(self.get(b, k), blob(k, big), "key %d" % k)
        if self.RENEWS:  # the stats are a snapshot refreshed every --stats-period: poll
            td.wait_for(lambda: b.stats()["transfer"]["renewals"] > 0,
                        "the lease renewed (transfer.renewals)")
        self.settled(a)

    def test_two_sidecars_pull_from_each_other(self):
        """A pulls from B while B pulls from A, 24 MiB each way at once: both end complete,
        byte-exact, well inside their timeouts."""
        big, n = self.BIG, self.NKEYS // 2
        a, b = self.start_big("a"), self.start_big("b")
        ka, kb = list(range(1000, 1000 + n)), list(range(2000, 2000 + n))
        for k in ka:
            self.put(a, k, blob(k, big))
        for k in kb:
            self.put(b, k, blob(k, big))
        import threading
        out = {}
        ths = [threading.Thread(target=lambda: out.setdefault(
                   "b", self.transfer(b, self.peer(a), ka, timeout_ms=15000))),
               threading.Thread(target=lambda: out.setdefault(
                   "a", self.transfer(a, self.peer(b), kb, timeout_ms=15000)))]
        for th in ths:
            th.start()
        for th in ths:
            th.join(60)
        self.assertEqual(sorted(out["b"]["transferred"]), ka, out["b"])
        self.assertEqual(sorted(out["a"]["transferred"]), kb, out["a"])
        self.assertEqual(self.get(b, ka[-1]), blob(ka[-1], big))
        self.assertEqual(self.get(a, kb[0]), blob(kb[0], big))

    def test_source_killed_during_a_pull(self):
        """The source is killed (SIGKILL) the moment it has pinned the pull's blocks, while
        their bytes cross or just after: whatever the moment, every key comes back as
        transferred (and byte-exact at the receiver) or failed (and absent there), the
        receiver holds nothing pinned or reserved, and it keeps serving."""
        big, keys = self.BIG, list(range(700, 700 + self.NKEYS))
        a, b = self.start_big("src"), self.start_big("dst")
        for k in keys:
            self.put(a, k, blob(k, big))
        t = self.killed_while(lambda: self.transfer(b, self.peer(a), keys, timeout_ms=20000), a,
                              lambda ram: ram["pinned"] > 0)
        got = sorted(t["transferred"]) + sorted(t["failed"]) + sorted(t["missing"])
        self.assertEqual(sorted(got), keys, t)
        self.assertEqual(t["missing"], [], t)
        for k in t["transferred"]:
            self.assertEqual(self.get(b, k), blob(k, big), "key %d" % k)
        self.absent(b, t["failed"])
        self.assertTrue(all(why in (PEER_DOWN, TIMEOUT) for why in t["failed"].values()), t)
        td.wait_for(lambda: self.held(b) == (0, 0), "nothing pinned or reserved at the receiver")
        self.assertEqual(b.http("GET", "/healthz")[0], 200)
        sys.stderr.write("killed mid-pull: %d transferred, %d failed\n"
                         % (len(t["transferred"]), len(t["failed"])))


class TestIndex(Faults):
    def test_pulled_blocks_indexed_and_published(self):
        a = self.start()
        extra = []
        if zmq is not None:
            pub, rep = fx.free_port(), fx.free_port()
            extra = ["--publish", "tcp://127.0.0.1:%d" % pub,
                     "--publish-replay", "tcp://127.0.0.1:%d" % rep]
        b = self.start(*extra, pod="dec")
        keys = [501, 502, 503]
        for k in keys:
            self.put(a, k, blob(k))
        t = self.transfer(b, self.peer(a), keys)
        self.assertEqual(sorted(t["transferred"]), keys, t)

        def dec():
            s, ans = b.http("POST", "/v1/query", {"model": MODEL, "block_hashes": keys})
            self.assertEqual(s, 200, ans)
            p = [p for p in ans["pods"] if p["pod"] == "dec"]
            return (p[0]["matched_blocks"], p[0]["cpu"]) if p else None
        td.wait_for(lambda: dec() == (3, 3), "the receiving pod holds the keys in cpu")
        if zmq is not None:
            got = td.wait_for(lambda: self.stored_cpu(rep, keys), "BlockStored published")
            self.assertEqual(sorted(got), keys)

    def stored_cpu(self, rep, keys):
        """The keys of the publisher's BlockStored events on CPU (replayed), once all are."""
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect("tcp://127.0.0.1:%d" % rep)
        got = []
        try:
            dealer.send_multipart([b"", struct.pack(">Q", 0)])
            while True:
                self.assertTrue(dealer.poll(10000), "no replay answer")
                f = dealer.recv_multipart()
                if f[-2] == b"\xff" * 8:
                    break
                for ev in msgpack.unpackb(f[-1])[1]:
                    if ev[0] == "BlockStored" and "CPU" in ev:
                        got += ev[1]
        finally:
            dealer.close(0)
        return got if sorted(got) == keys else None


if __name__ == "__main__":
    td.setup("test_transfer_faults.py")
    unittest.main(verbosity=2)
