#!/usr/bin/python3
"""kvtier.vllm_core, the logic of vLLM's offloading spec over kvtier (issue 20), against a
real kvtierd, through the calls vLLM 0.26's scheduler and workers make, in their order:

- a request's chunks stored (prepare_store, each worker's copies into its part of the slots
  through its own mapping, complete_store, the step's COMMIT); the slot layout checked
  byte by byte against one written out by hand;
- looked up as the scheduler does (lookup() per key in prefix order: a cold request is
  answered at once, a warm one is deferred one step and resolved by one LOOKUP, PREFETCH
  and PIN at the step's end), loaded (bytes equal, also from the middle of a chunk),
  released (the step's UNPIN);
- RPCs per step counted on the connection itself;
- prepare_store's answers: held, in flight, partial, no room (None), given back;
- eviction under pressure, and blocks on NVMe found through PREFETCH then pinned;
- an engine restart (a new core finds the blocks) and a kvtierd restart (the same core
  reconnects, the workers remap the new arena; with NVMe the durable blocks are found);
- kvtierd down: lookups miss, stores are skipped, nothing raises;
- pins given back when a request is scheduled without a load, finishes, or its answers
  expire; reset_cache's new session;
- bad configuration, more than one KV group, and chunks larger than kvtierd's slots refused.

Usage: test_vllm_core.py path/to/kvtierd
"""
import collections
import hashlib
import os
import random
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "router-plugin", "python"))
import kvtierd_fixture as fx  # noqa: E402
import kvtier  # noqa: E402
from kvtier import vllm_core as core  # noqa: E402
from kvtier.offload import Config, Offload, vllm_key  # noqa: E402

BB = 64 * 1024
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# two workers (TP 2), two canonical tensors each, 2 GPU blocks a chunk: a chunk is
# 16 KiB x 2 x 2 = 64 KiB, one kvtier block; each worker's tensors use 12 KiB of its 16 KiB
PAGES = [4096, 8192]
REFS = [(0, 4096), (1, 8000)]  # the second layer's un-padded page is shorter
WKB = 16384
WORLD = 2
BPC = 2
GPU_BLOCKS = 64
TIER_CALLS = ("attach", "lookup", "reserve", "commit", "pin", "unpin", "prefetch")


def okey(i, group=0, salt=b""):
    """An OffloadKey as vLLM makes it: a sha256 block hash and 4 bytes of group index."""
    return hashlib.sha256(b"block %d" % i + salt).digest() + group.to_bytes(4, "big")


class Counting:
    """A kvtier.Client that counts its tier calls."""

    def __init__(self, client, counts):
        self._inner, self._counts = client, counts

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in TIER_CALLS:
            return attr

        def call(*a, **kw):
            self._counts[name] += 1
            return attr(*a, **kw)
        return call


def prefix_lookup(mgr, keys, req):
    """vLLM's _maximal_prefix_lookup over the manager: the hits from the first key, or None
    when the request must wait a step."""
    hits, defer = 0, False
    for k in keys:
        r = mgr.lookup(k, req)
        if r == core.HIT:
            hits += 1
        elif r == core.HIT_PENDING:
            hits, defer = hits + 1, True
        elif r == core.RETRY:
            defer = True
        else:
            break
    return None if defer else hits


class Worker:
    """One simulated vLLM worker: its GPU KV tensors in host memory, its own connection and
    mapping of the arena (as KvtierOffloadingWorker), copies made from the core's plan."""

    def __init__(self, sock, rank, seed=0):
        self.sock, self.rank = sock, rank
        rnd = random.Random("%d/%d" % (seed, rank))
        self.gpu = [bytearray(rnd.randbytes(GPU_BLOCKS * p)) for p in PAGES]
        self.off = None
        self.attach()

    def attach(self):
        if self.off is not None:
            self.off.close()
        self.off = Offload(self.sock, MODEL, timeout=10.0)
        self.id = core.arena_id(self.off.arena)
        self.layout = core.SlotLayout.for_arena(self.off.arena, PAGES, WKB, BPC, self.rank,
                                                WORLD)

    def close(self):
        self.off.close()

    def page(self, t, b, n=None):
        p = PAGES[t]
        return bytes(self.gpu[t][b * p:b * p + (p if n is None else n)])

    def _plan(self, tag, slots, blocks, first):
        if tag[0] != self.id:  # kvtierd restarted: map its new arena
            self.attach()
        assert tag[0] == self.id, "the scheduler's arena is not this worker's"
        return self.layout.plan(slots, blocks, [len(blocks)], [first], REFS)

    def store(self, tag, slots, blocks, first):
        plan = self._plan(tag, slots, blocks, first)
        mem = self.off.arena.memory
        for host, t, b, n in plan.ops():
            mem[host:host + n] = self.page(t, b, n)
        mem.release()
        return plan

    def load(self, tag, slots, blocks, first):
        """Copies into fresh zeroed GPU tensors; returns them."""
        plan = self._plan(tag, slots, blocks, first)
        mem = self.off.arena.memory
        out = [bytearray(len(g)) for g in self.gpu]
        for host, t, b, n in plan.ops():
            out[t][b * PAGES[t]:b * PAGES[t] + n] = mem[host:host + n]
        mem.release()
        return out


class Base(fx.SidecarCase):
    PREFIX = "kvt_vllm_"

    def setUp(self):
        self.calls = collections.Counter()
        super().setUp()

    def connect(self):
        o = Offload(self.sock, MODEL, timeout=10.0)
        o._client = Counting(o._client, self.calls)
        return o

    def manager(self, **kw):
        kw.setdefault("connect", self.connect)
        m = core.ManagerCore(self.sock, MODEL, WKB, WORLD, BPC, **kw)
        self.addCleanup(m.close)
        return m

    def workers(self, seed=0):
        ws = [Worker(self.sock, r, seed) for r in range(WORLD)]
        for w in ws:
            self.addCleanup(w.close)
        return ws

    def step(self):
        """The calls this step made to kvtierd, then cleared."""
        c = {k: v for k, v in self.calls.items() if v}
        self.calls.clear()
        return c

    def store(self, mgr, ws, keys, req, chunks=None):
        """vLLM's store of a request's chunks (chunk i = GPU blocks 2i, 2i+1 on every
        worker): prepare_store, the workers' copies, complete_store, the step's end."""
        chunks = list(range(len(keys))) if chunks is None else chunks
        got = mgr.prepare_store(keys, req)
        if got is None:
            return None
        pairs, tag = got
        if pairs:
            chunk_of = dict(zip(keys, chunks))
            stored = [chunk_of[k] for k, _ in pairs]
            blocks = [c * BPC + j for c in stored for j in range(BPC)]
            for w in ws:
                w.store(tag, [s for _, s in pairs], blocks, stored[0] * BPC)
            mgr.complete_store([k for k, _ in pairs])
        mgr.on_schedule_end()
        return [k for k, _ in pairs]

    def find(self, mgr, keys, req, steps=10):
        """The scheduler asks for req each step until it is not deferred; the hits."""
        for _ in range(steps):
            hits = prefix_lookup(mgr, keys, req)
            if hits is not None:
                return hits
            mgr.on_schedule_end()
        self.fail("request %s still deferred after %d steps" % (req, steps))

    def load(self, mgr, ws, keys, req, chunks=None, skip=0):
        """vLLM's load of keys (the request's chunks `chunks`) into their GPU blocks on each
        worker, less the first chunk's first `skip` blocks (held by the GPU already): the
        loaded tensors per worker, and the blocks loaded."""
        chunks = list(range(len(keys))) if chunks is None else chunks
        slots, tag = mgr.prepare_load(keys, req)
        blocks = [c * BPC + j for c in chunks for j in range(BPC)][skip:]
        out = [w.load(tag, slots, blocks, blocks[0]) for w in ws]
        mgr.complete_load(keys)
        return out, blocks

    def present(self, mgr, keys):
        """The keys whose chunks the manager finds, asked one by one."""
        found = []
        for k in keys:
            if self.find(mgr, [k], "one") == 1:
                found.append(k)
            mgr.on_request_finished("one")
        mgr.on_schedule_end()
        return found

    def assert_loaded(self, ws, out, blocks):
        for w, got in zip(ws, out):
            for t, n in REFS:
                p = PAGES[t]
                for b in blocks:
                    self.assertEqual(bytes(got[t][b * p:b * p + n]), w.page(t, b, n),
                                     "rank %d tensor %d block %d" % (w.rank, t, b))

    def held(self):
        r = self.d.stats()["tiers"]["ram"]
        return r["pinned"], r["reserved"]

    def disk_used(self):
        return self.d.stats()["tiers"]["disk"]["used"]


class TestFlow(Base):
    def test_store_lookup_load(self):
        ws = self.workers()
        m = self.manager()
        self.step()
        keys = [okey(i) for i in range(4)]
        # a cold request: one LOOKUP, answered at once
        self.assertEqual(prefix_lookup(m, keys, "r1"), 0)
        self.assertEqual(self.step(), {"lookup": 1})
        self.assertEqual(self.store(m, ws, keys, "r1"), keys)
        self.assertEqual(self.step(), {"reserve": 1, "commit": 1})
        m.on_request_finished("r1")
        # the layout, written out by hand: [rank 0 | rank 1], each [tensor 0 | tensor 1]
        eng = kvtier.Client("unix:" + self.sock, timeout=5.0, engine_keys=True)
        self.addCleanup(eng.close)
        for c, k in enumerate(keys):
            blob = eng.block_get(MODEL, vllm_key(k[:-4]))
            self.assertEqual(len(blob), BB)
            for w in ws:
                at = w.rank * WKB * BPC
                for t, n in REFS:
                    for j in range(BPC):
                        self.assertEqual(blob[at + j * PAGES[t]:at + j * PAGES[t] + n],
                                         w.page(t, c * BPC + j, n))
                    at += PAGES[t] * BPC
        self.step()
        # a warm request: deferred one step, then four hits with no more calls
        self.assertIsNone(prefix_lookup(m, keys + [okey(99)], "r2"))
        self.assertEqual(self.step(), {"lookup": 1})
        self.assertTrue(m.has_pending_work())
        m.on_schedule_end()
        self.assertEqual(self.step(), {"lookup": 1, "pin": 1})
        self.assertFalse(m.has_pending_work())
        self.assertEqual(prefix_lookup(m, keys + [okey(99)], "r2"), 4)
        self.assertEqual(self.step(), {})
        out, blocks = self.load(m, ws, keys, "r2")
        self.assert_loaded(ws, out, blocks)
        self.assertEqual(self.step(), {})
        fx.wait_for(lambda: self.held() == (4, 0), what="pinned until the step ends")
        m.on_schedule_end()
        self.assertEqual(self.step(), {"unpin": 1})
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned or reserved")

    def test_load_from_the_middle_of_a_chunk(self):
        """The GPU already holds 3 blocks: vLLM loads chunks 1.. into blocks 3..7, the first
        chunk's second page only."""
        ws = self.workers(seed=1)
        m = self.manager()
        keys = [okey(i, salt=b"mid") for i in range(4)]
        self.store(m, ws, keys, "r1")
        self.assertEqual(self.find(m, keys[1:], "r2"), 3)
        out, blocks = self.load(m, ws, keys[1:], "r2", chunks=[1, 2, 3], skip=1)
        self.assertEqual(blocks, [3, 4, 5, 6, 7])
        self.assert_loaded(ws, out, blocks)
        for got in out:  # block 2 (the first chunk's first page) untouched
            self.assertEqual(bytes(got[0][2 * PAGES[0]:3 * PAGES[0]]), bytes(PAGES[0]))
        m.on_schedule_end()
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned")

    def test_rpcs_per_step(self):
        """Three warm requests found, loaded and released, and three stores committed: three
        calls per request (the first key's LOOKUP, then LOOKUP and PIN; no PREFETCH, as all
        are in RAM), one RESERVE per store, one COMMIT and one UNPIN for the step."""
        ws = self.workers()
        m = self.manager()
        reqs = {r: [okey(i, salt=r.encode()) for i in range(3)] for r in ("a", "b", "c")}
        for r, keys in reqs.items():
            self.assertEqual(prefix_lookup(m, keys, r), 0)
            got, tag = m.prepare_store(keys, r)
            blocks = list(range(len(keys) * BPC))
            for w in ws:
                w.store(tag, [s for _, s in got], blocks, 0)
        for r, keys in reqs.items():
            m.complete_store(keys)
        self.step()
        m.on_schedule_end()
        self.assertEqual(self.step(), {"commit": 1})
        for r, keys in reqs.items():
            self.assertIsNone(prefix_lookup(m, keys, r + "2"))
        self.assertEqual(self.step(), {"lookup": 3})
        m.on_schedule_end()
        self.assertEqual(self.step(), {"lookup": 3, "pin": 3})  # all in RAM: no PREFETCH
        for r, keys in reqs.items():
            self.assertEqual(prefix_lookup(m, keys, r + "2"), 3)
            out, blocks = self.load(m, ws, keys, r + "2")
            self.assert_loaded(ws, out, blocks)
        m.on_schedule_end()
        self.assertEqual(self.step(), {"unpin": 1})
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned")

    def test_lookup_waits_for_a_store_in_flight(self):
        """A chunk this engine is storing answers HIT_PENDING, then HIT once committed."""
        ws = self.workers()
        m = self.manager()
        keys = [okey(i, salt=b"fl") for i in range(2)]
        got, tag = m.prepare_store(keys, "w")
        self.step()
        self.assertEqual(m.lookup(keys[0], "r"), core.HIT_PENDING)
        self.assertEqual(m.lookup(keys[1], "r"), core.RETRY)
        self.assertEqual(self.step(), {})
        m.on_schedule_end()  # LOOKUP: none held yet, the first being stored: wait
        self.assertEqual(m.lookup(keys[0], "r"), core.HIT_PENDING)
        for w in ws:
            w.store(tag, [s for _, s in got], [0, 1, 2, 3], 0)
        m.complete_store(keys)
        m.on_schedule_end()  # COMMIT, then the lookup finds and pins them
        self.assertEqual(self.find(m, keys, "r"), 2)
        out, blocks = self.load(m, ws, keys, "r")
        self.assert_loaded(ws, out, blocks)


class TestStore(Base):
    DISK = False

    def test_prepare_store_answers(self):
        ws = self.workers()
        m = self.manager()
        keys = [okey(i, salt=b"st") for i in range(6)]
        self.store(m, ws, keys[:3], "r1")
        self.step()
        # all held: nothing to store (RESERVE, then a LOOKUP to tell held from no room)
        self.assertEqual(m.prepare_store(keys[:3], "r2"), ([], m.tag))
        self.assertEqual(self.step(), {"reserve": 1, "lookup": 1})
        # partial: the keys not held, in input order
        got, tag = m.prepare_store([keys[4], keys[1], keys[3]], "r2")
        self.assertEqual([k for k, _ in got], [keys[4], keys[3]])
        self.assertEqual(len({s for _, s in got}), 2)
        # being stored: left out with no call
        self.step()
        self.assertEqual(m.prepare_store([keys[4], keys[3]], "r3"), ([], m.tag))
        self.assertEqual(self.step(), {})
        # given up: the slots go back, nothing is held
        m.complete_store([keys[4], keys[3]], ok=False)
        m.on_schedule_end()
        self.assertEqual(self.step(), {"commit": 1})
        self.assertEqual(prefix_lookup(m, [keys[3]], "r4"), 0)
        fx.wait_for(lambda: self.held() == (0, 0), what="the slots given back")

    def test_no_room_is_none(self):
        """Every slot reserved: a store of other keys is None (vLLM retries next step);
        once the slots are committed, old blocks are evicted for it."""
        ws = self.workers()
        m = self.manager()
        full = [okey(i, salt=b"full") for i in range(16)]
        got, tag = m.prepare_store(full, "r1")
        self.assertEqual(len(got), 16)
        self.assertIsNone(m.prepare_store([okey(100)], "r2"))
        blocks = list(range(32))
        for w in ws:
            w.store(tag, [s for _, s in got], blocks, 0)
        m.complete_store(full)
        m.on_schedule_end()
        got2, _ = m.prepare_store([okey(100)], "r2")
        self.assertEqual([k for k, _ in got2], [okey(100)])

    def test_evict_under_pressure(self):
        ws = self.workers()
        m = self.manager()
        first = [okey(i, salt=b"ev1") for i in range(16)]  # the arena's 16 slots
        second = [okey(i, salt=b"ev2") for i in range(8)]
        self.store(m, ws, first, "r1")
        self.assertEqual(self.store(m, ws, second, "r2", chunks=list(range(16, 24))), second)
        # the new chunks are all there and load byte-exact; 8 of the old ones left
        self.assertEqual(self.find(m, second, "r4"), 8)
        out, blocks = self.load(m, ws, second, "r4", chunks=list(range(16, 24)))
        self.assert_loaded(ws, out, blocks)
        m.on_schedule_end()
        left = self.present(m, first)
        self.assertEqual(len(left), 8)
        lead = 0
        while lead < 16 and first[lead] in left:
            lead += 1
        self.assertEqual(self.find(m, first, "r5"), lead)  # a prefix: up to the first gone

    def test_other_geometry_is_a_miss(self):
        """Chunks of another layout under the same model (here 2 blocks a chunk against 1)
        are not loaded: their length is not this engine's chunk."""
        ws = self.workers()
        m = self.manager()
        keys = [okey(i, salt=b"geo") for i in range(2)]
        self.store(m, ws, keys, "r1")
        other = core.ManagerCore(self.sock, MODEL, WKB, WORLD, 1, connect=self.connect)
        self.addCleanup(other.close)
        self.assertEqual(self.find(other, keys, "r2"), 0)
        other.on_schedule_end()
        fx.wait_for(lambda: self.held() == (0, 0), what="the other layout's pins released")


class TestPins(Base):
    DISK = False

    def setUp(self):
        super().setUp()
        self.ws = self.workers()
        self.now = [0.0]
        self.m = self.manager(clock=lambda: self.now[0])
        self.keys = [okey(i, salt=b"pin") for i in range(3)]
        self.store(self.m, self.ws, self.keys, "w")

    def pinned(self, req):
        self.assertEqual(self.find(self.m, self.keys, req), 3)
        fx.wait_for(lambda: self.held() == (3, 0), what="the lookup's pins")

    def test_scheduled_without_load(self):
        self.pinned("r")
        self.m.on_schedule_end(new_req_ids=["r"])
        fx.wait_for(lambda: self.held() == (0, 0), what="pins given back")

    def test_finished(self):
        self.pinned("r")
        self.m.on_request_finished("r")
        self.m.on_schedule_end()
        fx.wait_for(lambda: self.held() == (0, 0), what="pins given back")

    def test_answers_expire(self):
        self.pinned("r")
        self.now[0] += core.LOOKUP_TTL + 1
        self.step()
        self.assertIsNone(prefix_lookup(self.m, self.keys, "r"))  # asked anew
        self.assertEqual(self.step(), {"lookup": 1})
        self.m.on_schedule_end()
        fx.wait_for(lambda: self.held() == (3, 0), what="the old pins back, new ones taken")

    def test_answers_not_asked_again(self):
        """A request left waiting, not asked again: its pins go back once its answers are
        older than LOOKUP_TTL (before kvtierd's --lease would take them)."""
        self.pinned("r")
        self.m.on_schedule_end()
        self.now[0] += core.LOOKUP_TTL + 1
        self.m.on_schedule_end()
        fx.wait_for(lambda: self.held() == (0, 0), what="pins given back")

    def test_partial_load_gives_back_the_rest(self):
        self.pinned("r")
        slots, tag = self.m.prepare_load(self.keys[:2], "r")
        self.assertEqual(len(slots), 2)
        self.m.on_schedule_end()
        fx.wait_for(lambda: self.held() == (2, 0), what="the unused pin given back")
        self.m.complete_load(self.keys[:2])
        self.m.on_schedule_end()
        fx.wait_for(lambda: self.held() == (0, 0), what="the load's pins given back")

    def test_load_of_a_key_not_found(self):
        self.assertEqual(self.m.lookup(okey(500), "r"), core.MISS)
        with self.assertRaises(core.LoadError):
            self.m.prepare_load([okey(500)], "r")

    def test_reset(self):
        self.pinned("r")
        got, _ = self.m.prepare_store([okey(7, salt=b"rs")], "w2")
        old = self.m.tag
        self.m.reset()
        self.assertEqual(self.m.tag[1], old[1] + 1)
        self.assertEqual(self.m.tag[0], old[0])  # the same kvtierd, a new session
        self.assertTrue(self.m.has_pending_work())
        for _ in range(core.RETIRE_STEPS - 1):
            self.m.on_schedule_end()
        fx.wait_for(lambda: self.held() == (3, 1), what="the old session holding them")
        self.m.on_schedule_end()
        fx.wait_for(lambda: self.held() == (0, 0), what="the old session closed")
        self.assertFalse(self.m.has_pending_work())
        self.assertEqual(self.find(self.m, self.keys, "r"), 3)  # the blocks stay


class TestRestarts(Base):
    def test_engine_restart(self):
        ws = self.workers()
        m = self.manager()
        keys = [okey(i, salt=b"er") for i in range(4)]
        self.store(m, ws, keys, "r1")
        self.find(m, keys, "r2")  # the engine dies holding pins
        m.close()
        for w in ws:
            w.close()
        fx.wait_for(lambda: self.held() == (0, 0), what="the dead engine's pins released")
        ws = self.workers()
        m2 = self.manager()
        self.assertEqual(self.find(m2, keys, "r3"), 4)
        out, blocks = self.load(m2, ws, keys, "r3")
        self.assert_loaded(ws, out, blocks)

    def test_kvtierd_restart(self):
        ws = self.workers()
        m = self.manager()
        keys = [okey(i, salt=b"kr") for i in range(16)]
        self.store(m, ws, keys, "r1")
        durable = 0
        if self.nodisk is None:
            fx.wait_for(lambda: self.disk_used() >= 4, what="demotions to NVMe")
            durable = self.disk_used()
        old = m.tag
        self.d.stop()
        self.d = self.daemon()
        # the same core: its next call finds the connection dead and makes a new one
        self.assertIn(m.lookup(keys[0], "r2"), (core.HIT_PENDING, core.MISS))
        self.assertTrue(m.connected)
        self.assertNotEqual(m.tag[0], old[0])  # a new arena
        self.assertEqual(m.tag[1], old[1] + 1)
        m.on_request_finished("r2")
        m.on_schedule_end()
        # RAM does not survive a restart; every block the NVMe store held comes back
        eng = kvtier.Client("unix:" + self.sock, timeout=5.0, engine_keys=True)
        self.addCleanup(eng.close)
        found = [k for k in keys if eng.lookup(MODEL, [vllm_key(k[:-4])]) == ["disk"]]
        self.assertEqual(len(found), durable)
        if found:
            # only on NVMe: the first step's PREFETCH starts the reads and the request
            # waits; a later step pins them in RAM
            self.step()
            self.assertIsNone(prefix_lookup(m, found, "r3"))
            m.on_schedule_end()
            self.assertEqual(self.step(), {"lookup": 2, "prefetch": 1})
            self.assertIsNone(prefix_lookup(m, found, "r3"))
            self.assertEqual(self.find(m, found, "r3"), len(found))
            self.assertEqual(self.step()["pin"], 1)
            idx = [keys.index(k) for k in found]
            out, blocks = self.load(m, ws, found, "r3", chunks=idx)  # the workers remap
            self.assertNotEqual(ws[0].id, old[0])
            self.assert_loaded(ws, out, blocks)
            m.on_schedule_end()
        # stores go on in the new arena
        more = [okey(i, salt=b"kr2") for i in range(2)]
        self.assertEqual(self.store(m, ws, more, "r4"), more)
        self.assertEqual(self.find(m, more, "r5"), 2)
        # and a new engine (a new core) finds the durable ones too
        m2 = self.manager()
        self.assertEqual(self.present(m2, found), found)

    def test_transfers_across_a_lost_session(self):
        """Transfers in flight when kvtierd restarts: a key whose old store has not completed
        is not reserved again (its completion would commit the new slot unwritten), and the
        completion of an old load does not release a new load's pin."""
        ws = self.workers()
        m = self.manager()
        k = [okey(i, salt=b"ls") for i in range(4)]
        self.store(m, ws, k[:2], "w1")
        self.assertEqual(self.find(m, k[:2], "r1"), 2)
        m.prepare_load(k[:2], "r1")  # its copy runs on
        got, _ = m.prepare_store([k[2]], "w2")  # and this one's
        self.assertEqual(len(got), 1)
        self.d.stop()
        self.d = self.daemon()
        got, tag = m.prepare_store([k[2], k[3]], "w3")
        self.assertEqual([x for x, _ in got], [k[3]])  # k2's old store not done yet
        self.assertEqual(tag[1], 2)
        self.store(m, ws, k[:2], "w4")
        self.assertEqual(self.find(m, k[:2], "r2"), 2)
        m.prepare_load(k[:2], "r2")
        self.step()
        m.complete_load(k[:2])  # r1's load (the lost session's)
        m.complete_store([k[2]])  # w2's store (the lost session's)
        m.on_schedule_end()
        self.assertEqual(self.step(), {})  # no UNPIN of r2's pins, no COMMIT of k2
        fx.wait_for(lambda: self.held()[0] == 2, what="r2's pins")
        m.complete_load(k[:2])  # r2's load
        m.on_schedule_end()
        self.assertEqual(self.step(), {"unpin": 1})
        self.assertEqual([x for x, _ in m.prepare_store([k[2]], "w5")[0]], [k[2]])

    def test_kvtierd_down(self):
        ws = self.workers()
        m = self.manager(retry_interval=0.0)
        keys = [okey(i, salt=b"dn") for i in range(2)]
        self.store(m, ws, keys, "r1")
        self.d.stop()
        self.assertEqual(prefix_lookup(m, keys, "r2"), 0)
        self.assertFalse(m.connected)
        self.assertEqual(m.prepare_store([okey(9)], "r3"), ([], None))
        m.complete_store([okey(9)])
        m.on_schedule_end()
        self.assertFalse(m.has_pending_work())
        self.d = self.daemon()
        more = [okey(i, salt=b"dn2") for i in range(2)]
        self.assertEqual(self.store(m, ws, more, "r4"), more)
        self.assertTrue(m.connected)
        self.assertEqual(self.find(m, more, "r5"), 2)


class TestRefusals(unittest.TestCase):
    def test_extra_config(self):
        cfg = core.parse_extra_config({"kvtier_socket": "/run/kvtier/k.sock"}, "m")
        self.assertEqual(cfg, Config("/run/kvtier/k.sock", "m", None, 10.0, None))
        cfg = core.parse_extra_config({"kvtier_socket": "/s", "kvtier_model": "x",
                                       "kvtier_namespace": "prod", "kvtier_timeout": 2.5}, "m")
        self.assertEqual(cfg, Config("/s", "x", "prod", 2.5, None))
        bad = [({}, "kvtier_socket"), ({"kvtier_socket": ""}, "kvtier_socket"),
               ({"kvtier_socket": 5}, "kvtier_socket"),
               ({"kvtier_socket": "/s", "kvtier_timeout": 0}, "kvtier_timeout"),
               ({"kvtier_socket": "/s", "kvtier_timeout": "soon"}, "kvtier_timeout"),
               ({"kvtier_socket": "/s", "kvtier_model": ""}, "kvtier_model"),
               ({"kvtier_socket": "/s", "kvtier_namespace": 3}, "kvtier_namespace"),
               ({"kvtier_socket": "/s", "kvtier_lora": "x"}, "kvtier_lora"),  # unknown key
               ({"kvtier_socket": "/s", "kvtier_token_file": "/nonexistent/t"},
                "kvtier_token_file")]
        for extra, name in bad:
            with self.assertRaises(ValueError) as e:
                core.parse_extra_config(extra, "m")
            self.assertIn(name, str(e.exception))
        with tempfile.NamedTemporaryFile("w") as f:
            f.write("s3cret\n")
            f.flush()
            cfg = core.parse_extra_config({"kvtier_socket": "/s", "kvtier_token_file": f.name},
                                          "m")
            self.assertEqual(cfg.token, "s3cret")

    def test_groups(self):
        core.check_groups(1)
        for n in (0, 2):
            with self.assertRaises(ValueError) as e:
                core.check_groups(n)
            self.assertIn("one KV-cache group", str(e.exception))
        self.assertEqual(core.offload_key_id(b"\x00" * 24 + b"\x00" * 7 + b"\x2a" + b"\0" * 4),
                         42)
        with self.assertRaises(ValueError):
            core.offload_key_id(okey(1, group=1))

    def test_geometry(self):
        self.assertEqual(core.check_geometry(WKB, WORLD, BPC, BB), BB)
        with self.assertRaises(ValueError) as e:
            core.check_geometry(WKB, WORLD, 4, BB)
        msg = str(e.exception)
        for s in ("131072", "65536", "--block-bytes"):
            self.assertIn(s, msg)
        for args in ((0, 1, 1), (1, 0, 1), (1, 1, True)):
            with self.assertRaises(ValueError):
                core.chunk_bytes(*args)
        with self.assertRaises(ValueError) as e:  # this worker's pages overflow its share
            core.SlotLayout([8192, 16384], WKB, BPC, 0, WORLD, 0, BB, BB, 16)
        self.assertIn("share", str(e.exception))
        with self.assertRaises(ValueError):
            core.SlotLayout(PAGES, WKB, BPC, 2, WORLD, 0, BB, BB, 16)

    def test_plan(self):
        lay = core.SlotLayout(PAGES, WKB, BPC, 1, WORLD, 4096, BB + 4096, BB, 16)
        self.assertEqual(lay.tensor_off, [WKB * BPC, WKB * BPC + PAGES[0] * BPC])
        plan = lay.plan([5, 9], [30, 31, 32], [3], [7], REFS)  # from page 1 of slot 5
        self.assertEqual(plan.nbytes, 3 * (4096 + 8000))
        ops = list(plan.ops())
        self.assertEqual(len(ops), len(plan))
        self.assertEqual(ops[0], (4096 + 5 * (BB + 4096) + WKB * BPC + 4096, 0, 30, 4096))
        self.assertEqual(ops[1][0], 4096 + 9 * (BB + 4096) + WKB * BPC)
        self.assertEqual(ops[3], (4096 + 5 * (BB + 4096) + WKB * BPC + 8192 + 8192, 1, 30,
                                  8000))
        self.assertEqual(lay.offset(9, 1, 1), ops[5][0])
        for bad in (([5], [30, 31, 32], [3], [7]), ([5, 9], [30, 31], [3], [7]),
                    ([5, 99], [30, 31, 32], [3], [7]), ([5, 9], [30, 31, 32], [3, 0], [7, 0])):
            with self.assertRaises(ValueError):
                lay.plan(*bad, REFS)

    def test_no_kvtierd(self):
        with self.assertRaises(kvtier.Error) as e:
            core.ManagerCore("/nonexistent/k.sock", MODEL, WKB, timeout=1.0)
        self.assertIn("kvtier_socket", str(e.exception))


class Done:
    def __init__(self, done=False):
        self.done, self.waited = done, False

    def query(self):
        return self.done

    def synchronize(self):
        self.done = self.waited = True

    def seconds(self):
        return 0.5


class TestWorkerBookkeeping(unittest.TestCase):
    def test_jobs(self):
        t = core.JobTracker()
        a, b, c = Done(), Done(True), Done(True)
        t.submit(1, "store", 100, a, arena="A")
        t.submit(2, "store", 200, b, arena="A")  # done, but after 1 on its stream
        t.submit(3, "load", 300, c, arena="B")
        t.submit(4, "store", 0, None)  # nothing to copy
        with self.assertRaises(ValueError):
            t.submit(1, "load", 1, Done())
        self.assertEqual(sorted(t.finished()), [(3, 300, 0.5), (4, 0, 0.0)])
        self.assertEqual((t.in_flight(), t.in_flight("A"), t.in_flight("B")), (2, 2, 0))
        t.wait({1, 77})
        self.assertTrue(a.waited)
        self.assertEqual(t.finished(), [(1, 100, 0.5), (2, 200, 0.5)])
        self.assertEqual((t.finished(), t.in_flight()), ([], 0))

    def test_sessions(self):
        s, t = core.WorkerSessions(), core.JobTracker()
        self.assertEqual(s.retired(["A"], t), [])  # no session seen: keep what is mapped
        self.assertTrue(s.store_live(("A", 1)))
        self.assertTrue(s.store_live(("A", 2)))
        self.assertFalse(s.store_live(("A", 1)))  # its reservations died with session 1
        self.assertFalse(s.store_live(None))
        s.note(("B", 3))
        t.submit(1, "load", 1, Done(), arena="A")
        self.assertEqual(s.retired(["A", "B"], t), [])  # A still read by a load
        t.wait({1})
        t.finished()
        self.assertEqual(s.retired(["A", "B"], t), ["A"])


if __name__ == "__main__":
    # a sanitizer runtime preloaded for this interpreter (an ASan libkvtier) is not kvtierd's
    os.environ.pop("LD_PRELOAD", None)
    fx.SidecarCase.BIN, _ = fx.binary_from_argv("test_vllm_core.py")
    unittest.main(verbosity=2)
