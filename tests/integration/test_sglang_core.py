#!/usr/bin/python3
"""The SGLang HiCache backend's SGLang-free core, kvtier.sglang_core (issue 20), against a real
kvtierd, with SGLang's host pool simulated in this process's memory: a page is the
(pointer, size) buffers get_page_buffer_meta() gives, K and V for an MHA page_first pool, one
for MLA. Covered, in HiCache's calls (batch_exists, batch_get_v1, batch_set_v1):

- set a sequence's pages, exists gives the prefix held, get copies the bytes back exactly
  (and kvtierd holds each page as its buffers concatenated, under sglang_key(hash));
- a partial hit: get answers True up to the first page not held, and leaves the rest untouched;
- batches over STORAGE_BATCH_SIZE; keys that are not page hashes;
- eviction under pressure (a small arena), and a set with no room answering False;
- an engine restart (a new core finds the pages) and kvtierd restarts: with NVMe the durable
  pages are found again; without, the core reconnects and writes into the new arena;
- kvtierd killed mid-use and a hung kvtierd: every call answers misses / False, never raises,
  never None, and works again once kvtierd is back;
- TP ranks' namespaces do not see each other's pages; MLA's rank > 0 reads rank 0's pages
  and writes nothing; a page stored with another size is a miss;
- a page over --block-bytes refused at registration; bad extra config refused.

Usage: test_sglang_core.py path/to/kvtierd
"""
import ctypes
import hashlib
import os
import random
import signal
import struct
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "router-plugin", "python"))
import kvtierd_fixture as fx  # noqa: E402
import kvtier  # noqa: E402
from kvtier.offload import sglang_key  # noqa: E402
from kvtier.sglang_core import (STORAGE_BATCH_SIZE, HiCacheCore, page_namespace,  # noqa: E402
                                parse_config)

BB = 64 * 1024  # --block-bytes
MODEL = "Qwen/Qwen3-8B"
NS0 = page_namespace("page_first", "torch.bfloat16", 0, 2)
NS1 = page_namespace("page_first", "torch.bfloat16", 1, 2)


def page_hashes(n, seed=0, page_size=4):
    """n chained page hashes as HiCache makes them: SHA-256 of the prior digest and the
    page's token ids (uint32, little-endian), 64 hex characters."""
    rng, prior, out = random.Random(seed), b"", []
    for _ in range(n):
        tokens = [rng.randrange(150000) for _ in range(page_size)]
        d = hashlib.sha256(prior + struct.pack("<%dI" % page_size, *tokens)).digest()
        out.append(d.hex())
        prior = d
    return out


class HostPool:
    """A host KV pool in this process's memory, as get_page_buffer_meta() sees it: kind "mha"
    (page_first: a K region and a V region, 2 buffers per page of half bytes each) or "mla"
    (one buffer per page)."""

    def __init__(self, kind="mha", pages=64, page_bytes=48 * 1024):
        self.kind, self.pages, self.page_bytes = kind, pages, page_bytes
        self.buf = ctypes.create_string_buffer(pages * page_bytes)
        self.base = ctypes.addressof(self.buf)

    def meta(self, idx):
        """The pages at pool positions idx, each a list of (pointer, size)."""
        if self.kind == "mla":
            return [[(self.base + i * self.page_bytes, self.page_bytes)] for i in idx]
        half = self.page_bytes // 2
        v = self.base + self.pages * half  # the V region follows the K region
        return [[(self.base + i * half, half), (v + i * half, half)] for i in idx]

    def fill(self, i, data):
        for (ptr, size), off in zip(self.meta([i])[0], (0, self.page_bytes // 2)):
            ctypes.memmove(ptr, data[off:off + size], size)

    def read(self, i):
        return b"".join(ctypes.string_at(ptr, size) for ptr, size in self.meta([i])[0])


def page_data(key, n=48 * 1024, tag=""):
    return random.Random(key + tag).randbytes(n)


class Base(fx.SidecarCase):
    PREFIX = "kvt_sglang_"
    SLOTS = 320  # arena slots
    DISK = False  # an NVMe store (--disk-admit always)

    def core(self, namespace=NS0, page_bytes=48 * 1024, **kw):
        kw.setdefault("reconnect", 0.0)
        c = HiCacheCore(self.sock, MODEL, namespace=namespace, timeout=5.0, **kw)
        self.addCleanup(c.close)
        self.assertEqual(c.register(page_bytes), BB)
        return c

    def store(self, core, pool, keys, first=0, tag=""):
        """Fills pool pages first.. with each key's bytes and sets them: set()'s answer."""
        for i, k in enumerate(keys):
            pool.fill(first + i, page_data(k, pool.page_bytes, tag))
        return core.set(keys, pool.meta(range(first, first + len(keys))))

    def held(self):
        r = self.d.stats()["tiers"]["ram"]
        return r["pinned"], r["reserved"]

    @staticmethod
    def stopped(pid):
        """Whether every thread of pid is stopped (SIGSTOP is delivered asynchronously)."""
        tasks = os.listdir("/proc/%d/task" % pid)
        states = []
        for t in tasks:
            with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        return all(st in ("T", "t") for st in states)

    def assert_miss_answers(self, core, keys, pool):
        """Every call answers a miss of the right type, none raises."""
        self.assertEqual(core.exists(keys), 0)
        self.assertEqual(core.get(keys, pool.meta(range(len(keys)))), [False] * len(keys))
        self.assertEqual(core.set(keys, pool.meta(range(len(keys)))), [False] * len(keys))


class TestCore(Base):
    def test_set_exists_get(self):
        c = self.core()
        src, dst = HostPool(), HostPool()
        keys = page_hashes(6)
        self.assertEqual(c.exists(keys), 0)
        self.assertEqual(self.store(c, src, keys), [True] * 6)
        self.assertEqual(c.exists(keys), 6)
        self.assertEqual(c.exists(keys + page_hashes(2, seed=9)), 6)
        self.assertEqual(c.exists(page_hashes(1, seed=9) + keys), 0)
        self.assertEqual(c.exists([]), 0)
        # loaded at other pool positions, byte-exact
        self.assertEqual(c.get(keys, dst.meta(range(10, 16))), [True] * 6)
        for i, k in enumerate(keys):
            self.assertEqual(dst.read(10 + i), page_data(k))
        # kvtierd holds a page as its buffers concatenated (K then V), under its engine key
        with kvtier.Client("unix:" + self.sock, timeout=5.0, engine_keys=True) as cl:
            self.assertEqual(cl.block_get(MODEL, sglang_key(keys[2]), lora=NS0),
                             page_data(keys[2]))
        # stored again: already held, True, nothing written
        s0 = c.stats()
        self.assertEqual(self.store(c, src, keys), [True] * 6)
        s1 = c.stats()
        self.assertEqual((s1["set_written"], s1["set_held"]), (6, 6))
        self.assertEqual((s0["get_ok"], s0["bytes_read"]), (6, 6 * 48 * 1024))
        self.assertEqual(s1["bytes_written"], 6 * 48 * 1024)
        self.assertEqual(s1["errors"], 0)
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned or reserved")

    def test_partial_hit(self):
        c = self.core()
        src, dst = HostPool(), HostPool()
        keys = page_hashes(6, seed=1)
        self.assertEqual(self.store(c, src, keys[:4]), [True] * 4)
        self.assertEqual(c.exists(keys), 4)
        for i in range(6):
            dst.fill(i, b"\xee" * dst.page_bytes)
        self.assertEqual(c.get(keys, dst.meta(range(6))), [True] * 4 + [False] * 2)
        for i in range(4):
            self.assertEqual(dst.read(i), page_data(keys[i]))
        for i in (4, 5):  # pages not held: untouched
            self.assertEqual(dst.read(i), b"\xee" * dst.page_bytes)
        # a page missing in the middle: it and every page after it False
        mid = [keys[0], keys[5], keys[2]]
        self.assertEqual(c.get(mid, dst.meta(range(3))), [True, False, False])
        self.assertEqual(c.get(keys[4:], dst.meta(range(2))), [False, False])
        self.assertEqual(c.stats()["get_failed"], 2 + 2 + 2)
        fx.wait_for(lambda: self.held() == (0, 0), what="no pin left by partial gets")

    def test_batches(self):
        """More than STORAGE_BATCH_SIZE pages in one call: batched, the answers in order."""
        c = self.core(page_bytes=16 * 1024)
        n = STORAGE_BATCH_SIZE * 2 + 44
        src, dst = HostPool(pages=n, page_bytes=16 * 1024), HostPool(pages=n, page_bytes=16 * 1024)
        keys = page_hashes(n, seed=2)
        self.assertEqual(self.store(c, src, keys), [True] * n)
        self.assertEqual(c.exists(keys), n)
        self.assertEqual(c.exists(keys[:200] + page_hashes(1, seed=99) + keys[200:]), 200)
        self.assertEqual(c.get(keys, dst.meta(range(n))), [True] * n)
        self.assertEqual([dst.read(i) for i in range(n)],
                         [page_data(k, 16 * 1024) for k in keys])

    def test_bad_keys(self):
        """A key that is not a page hash is a miss, as is every page after it."""
        c = self.core()
        pool = HostPool()
        keys = page_hashes(4, seed=3)
        self.assertEqual(self.store(c, pool, keys), [True] * 4)
        self.assertEqual(c.exists(keys[:2] + ["not-hex"] + keys[2:]), 2)
        self.assertEqual(c.get(keys[:1] + [None] + keys[1:2], pool.meta(range(3))),
                         [True, False, False])
        new = page_hashes(2, seed=4)
        self.assertEqual(c.set([new[0], "zz", new[1]], pool.meta(range(3))), [True, False, False])
        self.assertEqual(c.exists(new), 1)
        # keys and pages that do not pair up: misses
        self.assertEqual(c.get(keys, pool.meta(range(3))), [False] * 4)
        self.assertEqual(c.set(keys, pool.meta(range(3))), [False] * 4)

    def test_mla_ranks(self):
        """MLA: the ranks share a namespace (the cache is replicated); rank 0 writes, rank 1
        reads rank 0's pages and its set writes nothing."""
        ns = page_namespace("page_first", "bfloat16", 0, 4, replicated=True)
        self.assertEqual(ns, page_namespace("page_first", "bfloat16", 3, 4, replicated=True))
        r0 = self.core(namespace=ns, page_bytes=40 * 1024)
        r1 = self.core(namespace=ns, page_bytes=40 * 1024, writer=False)
        src, dst = HostPool("mla", page_bytes=40 * 1024), HostPool("mla", page_bytes=40 * 1024)
        keys = page_hashes(5, seed=5)
        self.assertEqual(self.store(r0, src, keys), [True] * 5)
        self.assertEqual(r1.exists(keys), 5)
        self.assertEqual(r1.get(keys, dst.meta(range(5))), [True] * 5)
        self.assertEqual([dst.read(i) for i in range(5)], [page_data(k, 40 * 1024) for k in keys])
        other = page_hashes(3, seed=6)
        self.assertEqual(self.store(r1, src, other), [True] * 3)  # rank 0 writes those
        self.assertEqual((r0.exists(other), r1.stats()["set_skipped"]), (0, 3))

    def test_tp_namespaces(self):
        """Non-MLA TP ranks hold other bytes under one page hash: each rank's pages are its
        own, and a page stored with another size is a miss."""
        self.assertNotEqual(NS0, NS1)
        r0, r1 = self.core(namespace=NS0), self.core(namespace=NS1)
        p0, p1, dst = HostPool(), HostPool(), HostPool()
        keys = page_hashes(4, seed=7)
        self.assertEqual(self.store(r0, p0, keys, tag="rank0"), [True] * 4)
        self.assertEqual(r1.exists(keys), 0)
        self.assertEqual(r1.get(keys, dst.meta(range(4))), [False] * 4)
        self.assertEqual(self.store(r1, p1, keys, tag="rank1"), [True] * 4)
        self.assertEqual(r1.get(keys, dst.meta(range(4))), [True] * 4)
        self.assertEqual(dst.read(3), page_data(keys[3], tag="rank1"))
        self.assertEqual(r0.get(keys, dst.meta(range(4))), [True] * 4)
        self.assertEqual(dst.read(3), page_data(keys[3], tag="rank0"))
        # another dtype or layout is another namespace
        self.assertNotEqual(page_namespace("page_first", "float16", 0, 2), NS0)
        self.assertNotEqual(page_namespace("page_head", "bfloat16", 0, 2), NS0)
        self.assertEqual(page_namespace("layer_first", "torch.float16", 1, 2, pp_rank=1,
                                        pp_size=2, cp_rank=0, cp_size=2, base="prod"),
                         "prod/layer_first/float16/tp1of2/pp1of2/cp0of2")
        # the same hash stored at another page size (same namespace): a miss, not a copy
        small = self.core(namespace=NS0, page_bytes=32 * 1024)
        sp = HostPool(page_bytes=32 * 1024)
        self.assertEqual(small.exists(keys), 4)
        self.assertEqual(small.get(keys, sp.meta(range(4))), [False] * 4)

    def test_samples(self):
        c = self.core(samples=True)
        pool = HostPool()
        keys = page_hashes(3, seed=8)
        self.store(c, pool, keys)
        c.get(keys, pool.meta(range(3)))
        s = c.take_samples()
        self.assertEqual((s["backup_pgs"], s["prefetch_pgs"]), ([3], [3]))
        self.assertTrue(s["backup_bandwidth"][0] > 0 and s["prefetch_bandwidth"][0] > 0)
        self.assertEqual(c.take_samples()["backup_pgs"], [])
        self.assertIsNone(self.core().take_samples())

    def test_engine_restart(self):
        c = self.core()
        pool, dst = HostPool(), HostPool()
        keys = page_hashes(5, seed=10)
        self.assertEqual(self.store(c, pool, keys), [True] * 5)
        c.close()
        c2 = self.core()
        self.assertEqual(c2.exists(keys), 5)
        self.assertEqual(c2.get(keys, dst.meta(range(5))), [True] * 5)
        self.assertEqual(dst.read(4), page_data(keys[4]))

    def test_kvtierd_restart_reconnects(self):
        """kvtierd restarted (no NVMe: its RAM is gone) while the core is idle: the next calls
        reconnect and use the new arena (not the old mapping: what is written is read back
        through another connection)."""
        c = self.core()
        pool, dst = HostPool(), HostPool()
        keys = page_hashes(4, seed=11)
        self.assertEqual(self.store(c, pool, keys), [True] * 4)
        self.assertEqual(c.exists(keys), 4)
        self.assertEqual(c.get(keys, dst.meta(range(4))), [True] * 4)
        self.d.stop()
        self.d = self.daemon()
        self.assertEqual(c.exists(keys), 0)
        self.assertEqual(self.store(c, pool, keys, tag="again"), [True] * 4)
        with kvtier.Client("unix:" + self.sock, timeout=5.0, engine_keys=True) as cl:
            self.assertEqual(cl.block_get(MODEL, sglang_key(keys[1]), lora=NS0),
                             page_data(keys[1], tag="again"))
        self.assertEqual(c.get(keys, dst.meta(range(4))), [True] * 4)
        self.assertEqual(dst.read(0), page_data(keys[0], tag="again"))
        self.assertGreaterEqual(c.stats()["connects"], 6)  # three roles, twice

    def test_restart_between_check_and_call(self):
        """kvtierd restarted between the core's liveness check and its call (libkvtier then
        reconnects inside the call, to an arena this process has not mapped): the call
        answers misses, writes nothing, and the next one works on the new arena."""
        c = self.core()
        pool, dst = HostPool(), HostPool()
        keys = page_hashes(3, seed=17)
        self.assertEqual(self.store(c, pool, keys), [True] * 3)
        self.assertEqual(c.get(keys, dst.meta(range(3))), [True] * 3)
        self.d.stop()
        self.d = self.daemon()
        with kvtier.Client("unix:" + self.sock, timeout=5.0, engine_keys=True) as cl:
            cl.block_put(MODEL, sglang_key(keys[0]), page_data(keys[0], tag="new"), lora=NS0)
            for r in ("get", "set"):  # the race: the check passes, the call reconnects
                c._links[r].alive = lambda: True
            self.assertEqual(c.get(keys[:1], dst.meta([0])), [False])
            self.assertEqual(dst.read(0), page_data(keys[0]))  # not the old mapping's slot
            self.assertEqual(self.store(c, pool, keys[1:], tag="new"), [False, False])
            self.assertEqual(cl.lookup(MODEL, [sglang_key(k) for k in keys[1:]], lora=NS0), [])
        # the lost session's reservations hold their slots for kvtierd's --release-grace
        fx.wait_for(lambda: self.held() == (0, 0), what="the lost session's slots released")
        self.assertEqual(self.store(c, pool, keys[1:], first=1, tag="new"), [True, True])
        self.assertEqual(c.get(keys, dst.meta(range(3))), [True] * 3)
        self.assertEqual([dst.read(i) for i in range(3)],
                         [page_data(k, tag="new") for k in keys])
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned or reserved")

    def test_kvtierd_killed_mid_use(self):
        """SIGKILL while three threads call as HiCache's do: every answer is a miss of the
        right type, nothing raises; once kvtierd is back the calls work again."""
        c = self.core()
        keys = page_hashes(8, seed=12)
        answers, errors, stop = [], [], threading.Event()

        def loop(call):
            pool = HostPool()
            while not stop.is_set():
                try:
                    if call == "exists":
                        a = c.exists(keys)
                        ok = isinstance(a, int) and 0 <= a <= 8
                    else:
                        if call == "set":
                            for i, k in enumerate(keys):
                                pool.fill(i, page_data(k))
                        a = getattr(c, call)(keys, pool.meta(range(8)))
                        ok = isinstance(a, list) and len(a) == 8 and \
                            all(isinstance(x, bool) for x in a)
                        if call == "get":  # a page said loaded has its bytes
                            ok = ok and all(pool.read(i) == page_data(keys[i])
                                            for i in range(8) if a[i])
                    answers.append((call, a))
                    if not ok:
                        errors.append((call, a))
                except BaseException as e:  # noqa: B902 (what the test looks for)
                    errors.append((call, e))
                time.sleep(0.001)  # reconnect=0 here: no back-off between attempts

        threads = [threading.Thread(target=loop, args=(r,)) for r in ("set", "get", "exists")]
        for t in threads:
            t.start()
        fx.wait_for(lambda: any(r == "get" and a == [True] * 8 for r, a in answers),
                    what="a whole get before the kill")
        self.d.proc.send_signal(signal.SIGKILL)
        self.d.proc.wait()
        killed = len(answers)
        for miss in (("exists", 0), ("get", [False] * 8), ("set", [False] * 8)):
            fx.wait_for(lambda: miss in answers[killed:], what="%s answered while down" % miss[0])
        self.d = self.daemon()
        fx.wait_for(lambda: any(r == "get" and a == [True] * 8 for r, a in answers[killed:]),
                    timeout=20, what="a whole get after kvtierd came back")
        stop.set()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertGreater(c.stats()["errors"], 0)
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned or reserved")

    def test_kvtierd_hung(self):
        """A stopped kvtierd: calls answer misses after the timeout, then work once it runs."""
        c = HiCacheCore(self.sock, MODEL, namespace=NS0, timeout=0.5, reconnect=0.0)
        self.addCleanup(c.close)
        c.register(48 * 1024)
        pool = HostPool()
        keys = page_hashes(3, seed=13)
        self.assertEqual(self.store(c, pool, keys), [True] * 3)
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        try:
            fx.wait_for(lambda: self.stopped(self.d.proc.pid), what="kvtierd stopped")
            t0 = time.monotonic()
            self.assertEqual(c.exists(keys), 0)
            self.assertEqual(c.get(keys, pool.meta(range(3))), [False] * 3)
            self.assertEqual(c.set(page_hashes(1, seed=14), pool.meta([0])), [False])
            self.assertLess(time.monotonic() - t0, 10)
        finally:
            os.kill(self.d.proc.pid, signal.SIGCONT)
        fx.wait_for(lambda: c.exists(keys) == 3, what="the calls back after SIGCONT")
        self.assertEqual(c.get(keys, pool.meta(range(3))), [True] * 3)

    def test_down_at_start_and_refusals(self):
        """register() raises when kvtierd cannot be reached or a page does not fit a slot; the
        calls of a core that could not register answer misses."""
        gone = HiCacheCore(os.path.join(self.tmp.name, "nobody.sock"), MODEL, namespace=NS0,
                           timeout=1.0)
        self.addCleanup(gone.close)
        with self.assertRaises(kvtier.Error):
            gone.register(1024)
        self.assert_miss_answers(gone, page_hashes(2), HostPool())
        big = HiCacheCore(self.sock, MODEL, namespace=NS0)
        self.addCleanup(big.close)
        with self.assertRaisesRegex(ValueError, "--block-bytes %d" % BB):
            big.register(BB + 1)
        self.assertEqual(big.page_bytes, None)
        with self.assertRaises(ValueError):
            big.register(0)
        self.assertEqual(big.register(BB), BB)  # a page of exactly a slot fits
        pool = HostPool(page_bytes=BB)
        keys = page_hashes(2, seed=15)
        self.assertEqual(self.store(big, pool, keys), [True, True])
        dst = HostPool(page_bytes=BB)
        self.assertEqual(big.get(keys, dst.meta(range(2))), [True, True])
        self.assertEqual(dst.read(1), page_data(keys[1], BB))
        # a page bigger than a slot in a call: refused, the others stored
        odd = [[(0, BB + 1)]]
        self.assertEqual(big.set(page_hashes(1, seed=16), odd), [False])


class TestPressure(Base):
    SLOTS = 16
    DISK = True

    def test_eviction_and_no_room(self):
        c = self.core()
        pool, dst = HostPool(), HostPool()
        first, more = page_hashes(16, seed=20), page_hashes(8, seed=21)
        self.assertEqual(self.store(c, pool, first), [True] * 16)
        if self.nodisk is None:  # RAM full: the background pass demotes its tail
            fx.wait_for(lambda: self.d.stats()["tiers"]["disk"]["used"] >= 4,
                        what="demotions to NVMe")
        self.assertEqual(self.store(c, pool, more, first=16), [True] * 8)
        self.assertEqual(c.exists(more), 8)
        self.assertEqual(c.get(more, dst.meta(range(8))), [True] * 8)
        self.assertEqual(dst.read(7), page_data(more[7]))
        found = [k for k in first if c.exists([k]) == 1]
        if self.nodisk is not None:
            self.assertEqual(len(found), 8)  # the oldest 8 evicted
        else:
            self.assertGreaterEqual(len(found), 8)
        for k in found:  # what is still held (RAM or NVMe) loads byte-exact
            self.assertEqual(c.get([k], dst.meta([0])), [True])
            self.assertEqual(dst.read(0), page_data(k))
        gone = [k for k in first if k not in found]
        if gone:
            self.assertEqual(c.get(gone[:1], dst.meta([0])), [False])
        # no room: every RAM slot reserved by another connection; the set answers False
        with kvtier.Client("unix:" + self.sock, timeout=5.0, engine_keys=True) as cl:
            taken, key = [], 1
            while len(taken) < 16 and key < 2000:  # RAM blocks leave as slots are taken
                ks = list(range(key, key + 16 - len(taken)))
                key += len(ks)
                slots, _ = cl.reserve(MODEL, ks, lora="filler")
                taken += [k for k, sl in zip(ks, slots) if sl is not None]
            self.assertEqual(len(taken), 16)
            late = page_hashes(2, seed=22)
            self.assertEqual(self.store(c, pool, late), [False, False])
            self.assertEqual(c.exists(late), 0)
            self.assertEqual(c.stats()["set_failed"], 2)
            cl.commit(MODEL, taken, ok=False, lora="filler")
        late = page_hashes(2, seed=23)
        self.assertEqual(self.store(c, pool, late), [True, True])


class TestKvtierdRestartNvme(Base):
    SLOTS = 16
    DISK = True

    def test_durable_pages_found(self):
        if self.nodisk is not None:
            self.skipTest("no NVMe store here: " + self.nodisk)
        c = self.core()
        pool, dst = HostPool(), HostPool()
        keys = page_hashes(16, seed=30)
        self.assertEqual(self.store(c, pool, keys), [True] * 16)
        fx.wait_for(lambda: self.d.stats()["tiers"]["disk"]["used"] >= 4,
                    what="demotions to NVMe")
        durable = self.d.stats()["tiers"]["disk"]["used"]
        self.d.stop()
        self.d = self.daemon()
        # the same core: it reconnects; the pages on NVMe are found and load byte-exact
        found = [k for k in keys if c.exists([k]) == 1]
        self.assertEqual(len(found), durable)
        for k in found:
            self.assertEqual(c.get([k], dst.meta([0])), [True])
            self.assertEqual(dst.read(0), page_data(k))
        # and a new engine finds them too
        self.assertEqual(sum(self.core().exists([k]) for k in keys), durable)


class TestConfig(unittest.TestCase):
    BASE = {"backend_name": "kvtier", "module_path": "kvtier.sglang_hicache",
            "class_name": "KvtierHiCacheStorage", "interface_v1": 1}

    def conf(self, **kw):
        d = dict(self.BASE, kvtier_socket="/run/kvtier/k.sock")
        d.update(kw)
        return d

    def refused(self, extra, key, model="m"):
        with self.assertRaisesRegex(ValueError, "^" + key) as cm:
            parse_config(extra, model)
        return str(cm.exception)

    def test_good(self):
        self.assertEqual(parse_config(self.conf(), "meta-llama/Llama-3.1-8B"),
                         {"socket": "/run/kvtier/k.sock", "model": "meta-llama/Llama-3.1-8B",
                          "namespace": None, "timeout": 10.0, "token": None})
        with tempfile.NamedTemporaryFile("w", dir="/tmp") as f:
            f.write("s3cret\n")
            f.flush()
            got = parse_config(self.conf(kvtier_socket="unix:/k.sock", kvtier_model="x",
                                         kvtier_namespace="blue", kvtier_timeout=2,
                                         kvtier_token_file=f.name, allocator="shm"), None)
        self.assertEqual(got, {"socket": "/k.sock", "model": "x", "namespace": "blue",
                               "timeout": 2.0, "token": "s3cret"})

    def test_bad(self):
        c = dict(self.conf())
        del c["kvtier_socket"]
        self.refused(c, "kvtier_socket")
        self.refused(self.conf(kvtier_socket=7), "kvtier_socket")
        self.refused(self.conf(kvtier_socket="unix:"), "kvtier_socket")
        self.refused(self.conf(interface_v1=0), "interface_v1")
        c = dict(self.conf())
        del c["interface_v1"]
        self.refused(c, "interface_v1")
        for t in (0, -1, "5", True, None, 1e9):
            self.refused(self.conf(kvtier_timeout=t), "kvtier_timeout")
        self.refused(self.conf(kvtier_model=""), "kvtier_model")
        self.refused(self.conf(kvtier_model="x" * 256), "kvtier_model")
        self.refused(self.conf(), "kvtier_model", model=None)
        self.refused(self.conf(kvtier_namespace=3), "kvtier_namespace")
        self.assertIn("known:", self.refused(self.conf(kvtier_sock="/k"), "kvtier_sock"))
        self.refused(self.conf(kvtier_token_file="/nonexistent/token"), "kvtier_token_file")
        with tempfile.NamedTemporaryFile("w", dir="/tmp") as f:
            self.refused(self.conf(kvtier_token_file=f.name), "kvtier_token_file")
        with self.assertRaises(ValueError):
            parse_config(None)
        with self.assertRaisesRegex(ValueError, "kvtier_namespace"):
            page_namespace("page_first", "bfloat16", base="n" * 250)


if __name__ == "__main__":
    # a sanitizer runtime preloaded for this interpreter (an ASan libkvtier) is not kvtierd's
    os.environ.pop("LD_PRELOAD", None)
    fx.SidecarCase.BIN, _ = fx.binary_from_argv("test_sglang_core.py")
    unittest.main(verbosity=2)
