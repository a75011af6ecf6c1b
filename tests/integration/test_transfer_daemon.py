#!/usr/bin/python3
"""Integration tests of kvtierd's side of the transfer between sidecars (issue 19): the
source-side frames XFER_HELLO, XFER_PIN, XFER_RENEW, XFER_RELEASE, XFER_RESERVE and
XFER_COMMIT spoken raw against one real kvtierd (UCX over tcp), and TRANSFER (pull)
between two kvtierd on loopback.

Usage: test_transfer_daemon.py path/to/kvtierd   (exit 77 = skipped: UCX does not start)
Blocks are small (16 KiB, an arena of 256 KiB). Waits are bounded polls, never timings.
"""

import os
import random
import struct
import sys
import unittest

import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "router-plugin", "python"))
import kvtierd_fixture as fx  # noqa: E402
import kvtier  # noqa: E402  (libkvtier from $KVTIER_LIB, else build/lib)

BIN = None
SANITIZED = False
BB = 16 * 1024
MODEL = "m"
ENV = {"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"}

OP_XHELLO, OP_XPIN, OP_XRENEW, OP_XRELEASE = 0x50, 0x51, 0x52, 0x53
OP_XRESERVE, OP_XCOMMIT, OP_TRANSFER = 0x54, 0x55, 0x56
SLOT_NONE, SLOT_HELD = 0xFFFFFFFF, 0xFFFFFFFE
ERR_NOT_FOUND, ERR_STALE, ERR_UNSUPPORTED = -200, -503, -601


def blob(key, n=BB):
    return random.Random(key * 7919).randbytes(n)


def wait_for(fn, what):
    return fx.wait_for(fn, 60.0 if SANITIZED else 20.0, what)


Rpc = fx.Rpc


# ---- bodies (docs/protocol.md, "Transfer") ----

def hello_ans(b):
    inc, slot_bytes, nslots, base, alen = struct.unpack_from("<QIIQI", b)
    off = 28 + alen
    (rlen,) = struct.unpack_from("<I", b, off)
    off += 4 + rlen
    strs = []
    for _ in range(2):  # host (the boot id), unix_path
        (n,) = struct.unpack_from("<H", b, off)
        strs.append(b[off + 2:off + 2 + n].decode())
        off += 2 + n
    assert alen >= 1 and rlen >= 1 and len(b) == off
    return {"inc": inc, "slot_bytes": slot_bytes, "nslots": nslots, "base": base,
            "host": strs[0], "unix_path": strs[1]}


def keys_req(inc, lease, keys, lease_ms=0, model=MODEL, lora="", lens=None):
    body = (struct.pack("<QQ", inc, lease) + fx.pstr(model) + fx.pstr(lora) +
            struct.pack("<II", lease_ms, len(keys)) + b"".join(struct.pack("<Q", k) for k in keys))
    if lens is not None:
        body += b"".join(struct.pack("<I", n) for n in lens)
    return body


def pin_ans(b):
    lease, n = struct.unpack_from("<QI", b)
    assert len(b) == 12 + 16 * n
    return lease, [struct.unpack_from("<IIQ", b, 12 + 16 * i) for i in range(n)]


def reserve_ans(b):
    lease, n = struct.unpack_from("<QI", b)
    assert len(b) == 12 + 4 * n
    return lease, list(struct.unpack_from("<%dI" % n, b, 12))


def lease_req(inc, lease, lease_ms=None):
    return struct.pack("<QQ", inc, lease) + (b"" if lease_ms is None else struct.pack("<I", lease_ms))


def count(b):
    assert len(b) == 4
    return struct.unpack("<I", b)[0]


def commit_req(inc, lease, landed):
    return (struct.pack("<QQI", inc, lease, len(landed)) +
            b"".join(struct.pack("<QQB", k, s, ok) for k, s, ok in landed))


def commit_ans(b):
    (n,) = struct.unpack_from("<I", b)
    assert len(b) == 4 + n
    return list(b[4:])


class Base(unittest.TestCase):
    def start(self, *flags, env=ENV):
        d = fx.Daemon(BIN, "--ram-bytes", str(16 * BB), "--block-bytes", str(BB), "--pod", "sc",
                      *flags, env=env)
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        self.addCleanup(lambda: self.dump(d))
        return d

    def dump(self, d):
        if any(e for e in (self._outcome.result.errors + self._outcome.result.failures)
               if e[0] is self):
            sys.stderr.write("---- kvtierd log ----\n" + d.read_log())

    def rpc(self, d):
        s = d.connect()
        self.addCleanup(s.close)
        return Rpc(s)

    def put(self, d, key, data, model=MODEL):
        s, a = d.http("PUT", "/v1/blocks/%d?model=%s" % (key, model), body=data,
                      headers={"Content-Type": "application/octet-stream"})
        self.assertEqual(s, 201, a)

    def get(self, d, key, model=MODEL):
        s, data, _ = d.http("GET", "/v1/blocks/%d?model=%s" % (key, model), raw=True)
        return data if s == 200 else None

    def held(self, d):
        r = d.stats()["tiers"]["ram"]
        return r["pinned"], r["reserved"]


class TestSource(Base):
    """The source-side frames against one kvtierd."""

    def test_stats_incarnation(self):
        d = self.start()
        st = d.stats()
        self.assertIsInstance(st["incarnation"], int)
        self.assertNotEqual(st["incarnation"], 0)
        self.assertTrue(st["transfer"]["ucx"])
        d2 = self.start("--ucx=off")
        st2 = d2.stats()
        self.assertIsNone(st2["transfer"])
        self.assertNotEqual(st2["incarnation"], st["incarnation"])
        self.assertEqual(self.rpc(d2).err(OP_XHELLO, struct.pack("<Q", 0))[0], ERR_UNSUPPORTED)
        # the user's call too, over RPC and HTTP: 501, with the reason
        peer = "127.0.0.1:%d" % d.rpc_port
        self.assertEqual(self.rpc(d2).err(OP_TRANSFER, transfer_req(peer, [1]))[0],
                         ERR_UNSUPPORTED)
        s, ans = d2.http("POST", "/v1/transfer", {"peer": peer, "model": MODEL, "keys": [1]})
        self.assertEqual(s, 501, ans)
        self.assertIn("--ucx", ans["error"])

    def test_pin_renew_release(self):
        d = self.start()
        r = self.rpc(d)
        h = hello_ans(r.ok(OP_XHELLO, struct.pack("<Q", 0)))
        inc = h["inc"]
        self.assertEqual(inc, d.stats()["incarnation"])
        self.assertEqual(h["slot_bytes"], BB)
        self.assertEqual(h["nslots"], 16)
        self.assertEqual(hello_ans(r.ok(OP_XHELLO, struct.pack("<Q", inc)))["inc"], inc)
        self.assertEqual(r.err(OP_XHELLO, struct.pack("<Q", inc ^ 1))[0], ERR_STALE)
        for k in (1, 2, 3):
            self.put(d, k, blob(k, BB - k))
        lease, pins = pin_ans(r.ok(OP_XPIN, keys_req(inc, 0, [1, 2, 9, 3], lease_ms=5000)))
        self.assertNotEqual(lease, 0)
        for k, (slot, n, s) in zip([1, 2, 9, 3], pins):
            if k == 9:
                self.assertEqual((slot, n, s), (SLOT_NONE, 0, 0))
            else:
                self.assertLess(slot, 16)
                self.assertEqual(n, BB - k)
                self.assertEqual(s, xxhash.xxh3_64_intdigest(blob(k, BB - k)))
        wait_for(lambda: self.held(d) == (3, 0), "3 pins")
        # a stale incarnation changes nothing
        for op, body in ((OP_XPIN, keys_req(inc + 1, 0, [1])),
                         (OP_XRENEW, lease_req(inc + 1, lease, 1000)),
                         (OP_XRELEASE, lease_req(inc + 1, lease)),
                         (OP_XRESERVE, keys_req(inc + 1, 0, [50], lens=[10])),
                         (OP_XCOMMIT, commit_req(inc + 1, lease, [(1, 0, 1)]))):
            st, http, msg = r.err(op, body)
            self.assertEqual((st, http), (ERR_STALE, 412), (op, msg))
        # more keys on the same lease
        lease2, pins = pin_ans(r.ok(OP_XPIN, keys_req(inc, lease, [1])))
        self.assertEqual(lease2, lease)
        self.assertEqual(count(r.ok(OP_XRENEW, lease_req(inc, lease, 60000))), 4)
        self.assertEqual(count(r.ok(OP_XRENEW, lease_req(inc, 12345, 60000))), 0)
        self.assertEqual(r.err(OP_XPIN, keys_req(inc, 12345, [1]))[0], ERR_NOT_FOUND)
        self.assertEqual(count(r.ok(OP_XRELEASE, lease_req(inc, lease))), 4)
        self.assertEqual(count(r.ok(OP_XRELEASE, lease_req(inc, lease))), 0)
        wait_for(lambda: self.held(d) == (0, 0), "pins released")
        wait_for(lambda: d.stats()["transfer"]["leases"] == 0, "no lease")

    def test_lease_expires(self):
        d = self.start()
        r = self.rpc(d)
        inc = hello_ans(r.ok(OP_XHELLO, struct.pack("<Q", 0)))["inc"]
        self.put(d, 5, blob(5))
        lease, _ = pin_ans(r.ok(OP_XPIN, keys_req(inc, 0, [5], lease_ms=200)))
        wait_for(lambda: self.held(d) == (1, 0), "a pin")
        # the tier expires the pin; the lease goes lazily, at the next frame
        wait_for(lambda: self.held(d) == (0, 0), "the pin expired")
        wait_for(lambda: count(r.ok(OP_XRENEW, lease_req(inc, lease, 1000))) == 0, "lease gone")
        self.assertEqual(r.err(OP_XPIN, keys_req(inc, lease, [5]))[0], ERR_NOT_FOUND)

    def test_reserve_commit(self):
        d = self.start()
        r = self.rpc(d)
        h = hello_ans(r.ok(OP_XHELLO, struct.pack("<Q", 0)))
        inc = h["inc"]
        self.put(d, 7, blob(7))
        keys = [20, 21, 22, 7]
        lens = [BB, 100, 200, BB]
        lease, slots = reserve_ans(r.ok(OP_XRESERVE, keys_req(inc, 0, keys, lens=lens)))
        self.assertNotEqual(lease, 0)
        self.assertEqual(slots[3], SLOT_HELD)
        self.assertTrue(all(s < 16 for s in slots[:3]))
        wait_for(lambda: self.held(d) == (0, 3), "3 reservations")
        self.assertEqual(r.err(OP_XRESERVE, keys_req(inc, 0, [30], lens=[BB + 1]))[1], 413)
        # here the refusals (a slot never written, ok=0, a key not reserved); the bytes land
        # through /dev/shm (--arena-name) in test_reserve_commit_bytes
        data = {k: blob(k, n) for k, n in zip(keys, lens)}
        vis = commit_ans(r.ok(OP_XCOMMIT, commit_req(inc, lease, [
            (20, xxhash.xxh3_64_intdigest(data[20]), 1),  # slot not written: sum mismatch
            (21, 0, 0),                                   # given back
            (99, 0, 1)])))                                # never reserved
        self.assertEqual(vis, [0, 0, 0])
        wait_for(lambda: self.held(d) == (0, 1), "one reservation left")
        self.assertIsNone(self.get(d, 20))
        self.assertEqual(count(r.ok(OP_XRELEASE, lease_req(inc, lease))), 1)
        wait_for(lambda: self.held(d) == (0, 0), "reservations released")
        wait_for(lambda: d.stats()["transfer"]["commit_bad_sum"] == 1, "a bad sum counted")

    def test_reserve_commit_bytes(self):
        name = "kvt_xfer_test_%d" % os.getpid()
        d = self.start("--arena-name", name)
        r = self.rpc(d)
        h = hello_ans(r.ok(OP_XHELLO, struct.pack("<Q", 0)))
        inc = h["inc"]
        keys, lens = [40, 41], [BB, 1000]
        lease, slots = reserve_ans(r.ok(OP_XRESERVE, keys_req(inc, 0, keys, lens=lens)))
        data = {k: blob(k, n) for k, n in zip(keys, lens)}
        # slot i at slot_off + i * slot_bytes of the arena file, slot_off one page of header
        # (tiers/arena.c; ATTACH would say so, over the Unix socket only)
        slot_off = os.sysconf("SC_PAGE_SIZE")
        with open("/dev/shm/" + name, "r+b") as f:
            for k, s, n in zip(keys, slots, lens):
                f.seek(slot_off + s * h["slot_bytes"])
                f.write(data[k])
        vis = commit_ans(r.ok(OP_XCOMMIT, commit_req(inc, lease, [
            (40, xxhash.xxh3_64_intdigest(data[40]), 1),
            (41, xxhash.xxh3_64_intdigest(data[41]) ^ 1, 1)])))
        self.assertEqual(vis, [1, 0])
        self.assertEqual(self.get(d, 40), data[40])
        self.assertIsNone(self.get(d, 41))
        wait_for(lambda: self.held(d) == (0, 0), "nothing held")
        self.assertEqual(count(r.ok(OP_XRELEASE, lease_req(inc, lease))), 0)


def transfer_req(peer, keys, timeout_ms=10000, model=MODEL, lora="", direction=0, flags=0):
    return (fx.pstr(peer) + fx.pstr(model) + fx.pstr(lora) + struct.pack("<BB2xII", direction,
            flags, timeout_ms, len(keys)) + b"".join(struct.pack("<Q", k) for k in keys))


def transfer_ans(b):
    nbytes, ns = struct.unpack_from("<QQ", b)
    off = 16
    out = []
    for _ in range(2):
        (n,) = struct.unpack_from("<I", b, off)
        out.append(list(struct.unpack_from("<%dQ" % n, b, off + 4)))
        off += 4 + 8 * n
    (n,) = struct.unpack_from("<I", b, off)
    failed = {}
    for i in range(n):
        k, why = struct.unpack_from("<QB", b, off + 4 + 9 * i)
        failed[k] = why
    assert len(b) == off + 4 + 9 * n
    return {"bytes": nbytes, "transferred": out[0], "missing": out[1], "failed": failed}


FAIL_PEER_DOWN = 1


class TestPull(Base):
    """TRANSFER, pull: B reads blocks from A over UCX (tcp on loopback)."""

    def test_pull(self):
        a, b = self.start(), self.start()
        keys = [101, 102, 103, 104]
        for k in keys[:3]:
            self.put(a, k, blob(k, BB - 3 * k))
        rb = self.rpc(b)
        peer = "127.0.0.1:%d" % a.rpc_port
        t = transfer_ans(rb.ok(OP_TRANSFER, transfer_req(peer, keys)))
        self.assertEqual(sorted(t["transferred"]), keys[:3])
        self.assertEqual(t["missing"], [104])
        self.assertEqual(t["failed"], {})
        self.assertEqual(t["bytes"], sum(BB - 3 * k for k in keys[:3]))
        for k in keys[:3]:
            self.assertEqual(self.get(b, k), blob(k, BB - 3 * k))
        for d in (a, b):
            wait_for(lambda: self.held(d) == (0, 0), "nothing held")
        wait_for(lambda: a.stats()["transfer"]["leases"] == 0, "the source's lease released")
        # held already: transferred again, nothing moved
        t = transfer_ans(rb.ok(OP_TRANSFER, transfer_req(peer, keys[:1])))
        self.assertEqual((t["transferred"], t["bytes"]), (keys[:1], 0))

        # the source killed: peer_down, and B keeps serving
        a_port = a.rpc_port
        a.proc.kill()
        a.proc.wait()
        self.put(b, 900, blob(900))  # B still takes puts
        t = transfer_ans(rb.ok(OP_TRANSFER, transfer_req(peer, [105], timeout_ms=3000)))
        self.assertEqual(t["failed"], {105: FAIL_PEER_DOWN})
        self.assertEqual(self.get(b, 900), blob(900))

        # a new source on the same port: a new incarnation, one re-handshake
        a2 = None
        for _ in range(20):
            try:
                a2 = self.start_on(a_port)
                break
            except RuntimeError:
                pass
        self.assertIsNotNone(a2, "the source could not restart on its port")
        self.put(a2, 105, blob(105))
        hs = b.stats()["transfer"]["handshakes"]
        t = transfer_ans(rb.ok(OP_TRANSFER, transfer_req(peer, [105])))
        self.assertEqual(t["transferred"], [105], t)
        self.assertEqual(self.get(b, 105), blob(105))
        wait_for(lambda: b.stats()["transfer"]["handshakes"] == hs + 1, "one re-handshake")
        for d in (a2, b):
            wait_for(lambda: self.held(d) == (0, 0), "nothing held")

    def test_pull_http(self):
        """POST /v1/transfer: the same pull with a JSON body and answer; bad bodies are 400."""
        a, b = self.start(), self.start()
        for k in (201, 202):
            self.put(a, k, blob(k, BB - k))
        peer = "127.0.0.1:%d" % a.rpc_port
        s, t = b.http("POST", "/v1/transfer",
                      {"peer": peer, "model": MODEL, "keys": [201, 202, 203], "timeout_ms": 10000})
        self.assertEqual(s, 200, t)
        self.assertEqual(sorted(t["transferred"]), [201, 202])
        self.assertEqual((t["missing"], t["failed"]), ([203], []))
        self.assertEqual(t["bytes"], 2 * BB - 201 - 202)
        self.assertGreater(t["seconds"], 0)
        self.assertEqual(self.get(b, 202), blob(202, BB - 202))
        for body, why in [({"model": MODEL, "keys": [1]}, "peer"),
                          ({"peer": peer, "model": MODEL, "keys": []}, "keys"),
                          ({"peer": peer, "model": MODEL, "keys": [1], "direction": "up"},
                           "direction")]:
            s, ans = b.http("POST", "/v1/transfer", body)
            self.assertEqual(s, 400, (body, ans))
            self.assertIn(why, ans["error"])
        # a push over HTTP: B sends a block of its own to A
        self.put(b, 210, blob(210))
        s, t = b.http("POST", "/v1/transfer", {"peer": peer, "model": MODEL, "keys": [210],
                                                "direction": "push", "timeout_ms": 10000})
        self.assertEqual(s, 200, t)
        self.assertEqual((t["transferred"], t["failed"], t["bytes"]), ([210], [], BB))
        self.assertEqual(self.get(a, 210), blob(210))
        # a peer nobody listens on: every key failed, peer_down, as JSON
        s, t = b.http("POST", "/v1/transfer",
                      {"peer": "127.0.0.1:1", "model": MODEL, "keys": [7], "timeout_ms": 2000})
        self.assertEqual(s, 200, t)
        self.assertEqual(t["failed"], [{"key": 7, "reason": "peer_down"}])
        for d in (a, b):
            wait_for(lambda: self.held(d) == (0, 0), "nothing held")

    def test_pull_client(self):
        """libkvtier's kvt_client_transfer() through the Python binding's Client.transfer()."""
        a, b = self.start(), self.start()
        for k in (301, 302):
            self.put(a, k, blob(k))
        c = kvtier.Client("127.0.0.1:%d" % b.rpc_port)
        self.addCleanup(c.close)
        t = c.transfer("127.0.0.1:%d" % a.rpc_port, MODEL, [301, 302, 303], timeout_ms=10000)
        self.assertEqual(sorted(t["transferred"]), [301, 302])
        self.assertEqual((t["missing"], t["failed"], t["bytes"]), ([303], [], 2 * BB))
        self.assertEqual(self.get(b, 301), blob(301))
        t = c.transfer("127.0.0.1:1", MODEL, [9], timeout_ms=2000)
        self.assertEqual(t["failed"], [(9, "peer_down")])
        # a streaming push from B back to A: 301 is held, 304 never comes within 200 ms
        t = c.transfer("127.0.0.1:%d" % a.rpc_port, MODEL, [301, 304], push=True, stream=True,
                       timeout_ms=200)
        self.assertEqual((t["transferred"], t["missing"], t["failed"]), ([301], [304], []))
        with self.assertRaises(kvtier.Error):  # stream is for a push
            c.transfer("127.0.0.1:%d" % a.rpc_port, MODEL, [301], stream=True)
        with self.assertRaises(ValueError):
            c.transfer("127.0.0.1:1", MODEL, [])
        with self.assertRaises(kvtier.Error):
            c.transfer("no-port", MODEL, [1])

    def start_on(self, port):
        d = fx.Daemon(BIN, "--ram-bytes", str(16 * BB), "--block-bytes", str(BB), "--pod", "sc2",
                      "--rpc-listen", "127.0.0.1:%d" % port, env=ENV)
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        self.addCleanup(lambda: self.dump(d))
        return d


def setup(script):
    """Sets BIN and SANITIZED from the command line; exits 77 when kvtierd does not start or
    runs without transfers (UCX does not start here)."""
    global BIN, SANITIZED
    # A sanitizer runtime preloaded for this interpreter (to load an ASan libkvtier) is not
    # kvtierd's: the daemon links its own.
    os.environ.pop("LD_PRELOAD", None)
    BIN, SANITIZED = fx.binary_from_argv(script)
    try:
        probe = fx.Daemon(BIN, "--ram-bytes", str(4 * BB), "--block-bytes", str(BB), env=ENV)
        ucx = probe.stats()["transfer"] is not None
        probe.stop()
        probe.cleanup()
    except RuntimeError as e:
        print("SKIP: kvtierd did not start: %s" % e)
        sys.exit(77)
    if not ucx:
        print("SKIP: UCX does not start here (kvtierd runs without transfers)")
        sys.exit(77)


if __name__ == "__main__":
    setup("test_transfer_daemon.py")
    unittest.main(verbosity=2)
