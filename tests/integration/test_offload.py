#!/usr/bin/python3
"""The engine connectors' vLLM-free core, kvtier.offload (issue 20), against a real kvtierd,
through every call vLLM's scheduler and worker make, in the order they make them:

- store a request's blocks (prepare_store, write the slots, complete_store) and see them in
  take_events(); a second store of the same keys reserves nothing;
- look them up (lookup counts the leading keys held), load them (prepare_load pins, the
  bytes read through the mapping are the ones written, complete_load unpins);
- evict under pressure (a small arena: storing more blocks than it has slots evicts the
  oldest, reported "removed"; they are then not found, or found on NVMe where there is one);
- a load of a block that went away answers None and leaves nothing pinned;
- restart the engine process (a new Offload: the blocks are still found and load);
- restart kvtierd (the blocks demoted to NVMe are found again and load byte-exact);
- the engine hashes' ids are the event decoders' (kvindex/event.h).

Usage: test_offload.py path/to/kvtierd
"""
import os
import random
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "router-plugin", "python"))
import kvtierd_fixture as fx  # noqa: E402
import kvtier  # noqa: E402
from kvtier import offload  # noqa: E402
from kvtier.offload import Offload, sglang_key, vllm_key  # noqa: E402

BB = 64 * 1024
MODEL = "m"


def data(key, n=BB):
    return random.Random(key).randbytes(n)


class Base(fx.SidecarCase):
    PREFIX = "kvt_offload_"

    def offload(self):
        o = Offload(self.sock, MODEL, timeout=10.0)
        self.addCleanup(o.close)
        return o

    def store(self, o, keys):
        """vLLM's store of a request's blocks: prepare_store, the worker's copies, complete."""
        todo, evicted = o.prepare_store(keys)
        for k, s in todo:
            o.slot(s)[:] = data(k)
        o.complete_store([k for k, _ in todo])
        return todo, evicted

    def load(self, o, keys):
        """vLLM's load: prepare_load, the worker's copies out of the slots, complete_load."""
        pins = o.prepare_load(keys)
        if pins is None:
            return None
        got = [bytes(o.slot(s, n)) for s, n in pins]
        o.complete_load(keys)
        return got

    def held(self):
        r = self.d.stats()["tiers"]["ram"]
        return r["pinned"], r["reserved"]


class TestCore(Base):
    def test_store_lookup_load(self):
        o = self.offload()
        keys = [101, 102, 103, 104]
        todo, evicted = self.store(o, keys)
        self.assertEqual(([k for k, _ in todo], evicted), (keys, []))
        self.assertEqual(o.take_events(), [("stored", keys)])
        self.assertEqual(o.take_events(), [])
        # stored again: every key is held, nothing to write, no event
        self.assertEqual(o.prepare_store(keys), ([], []))
        self.assertEqual(o.complete_store(keys), [])
        self.assertEqual(o.take_events(), [])
        self.assertEqual(o.lookup(keys + [999]), 4)
        self.assertEqual(o.lookup([999] + keys), 0)
        o.touch(keys)
        self.assertEqual(self.load(o, keys), [data(k) for k in keys])
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned or reserved")
        # a store given up: the slots go back, nothing is held, no event
        todo, _ = o.prepare_store([201, 202])
        self.assertEqual(len(todo), 2)
        o.complete_store([201, 202], ok=False)
        self.assertEqual((o.lookup([201]), o.take_events()), (0, []))
        # partial blocks (the last block of a prompt): lens
        todo, _ = o.prepare_store([301])
        o.slot(todo[0][1])[:100] = data(301, 100)
        o.complete_store([301], lens=[100])
        self.assertEqual(self.load(o, [301]), [data(301, 100)])

    def disk_used(self):
        return self.d.stats()["tiers"]["disk"]["used"]

    def test_evict_under_pressure(self):
        o = self.offload()
        first = list(range(1000, 1016))  # the arena's 16 slots
        self.store(o, first)
        o.take_events()
        if self.nodisk is None:  # RAM is full: the background pass demotes its tail (2 x 1/8)
            fx.wait_for(lambda: self.disk_used() >= 4, what="demotions to NVMe")
        _, evicted = self.store(o, list(range(2000, 2008)))
        ev = o.take_events()
        self.assertEqual(ev[-1][0], "stored")
        if evicted:
            # blocks that left the sidecar: "removed", then not found, and a load fails
            self.assertEqual(ev[0], ("removed", evicted))
            self.assertTrue(set(evicted) <= set(first))
            self.assertEqual(o.lookup(evicted[:1]), 0)
            self.assertIsNone(o.prepare_load(evicted[:1] + [2000]))
        if self.nodisk is not None:
            self.assertEqual(len(evicted), 8)
        else:
            # demoted blocks are still held: found, and they load byte-exact through PIN
            on_disk = [k for k in first if o.lookup([k]) == 1]
            self.assertGreaterEqual(len(on_disk), 4, evicted)
            self.assertEqual(self.load(o, on_disk), [data(k) for k in on_disk])
        # a load that finds a key gone pins nothing
        self.assertIsNone(o.prepare_load([2000, 424242]))
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned after a failed load")

    def test_engine_restart(self):
        o = self.offload()
        keys = [5, 6, 7]
        self.store(o, keys)
        pins = o.prepare_load(keys)  # the engine dies holding pins
        self.assertIsNotNone(pins)
        o.close()
        fx.wait_for(lambda: self.held() == (0, 0), what="the dead engine's pins released")
        o2 = self.offload()
        self.assertEqual(o2.lookup(keys), 3)
        self.assertEqual(self.load(o2, keys), [data(k) for k in keys])

    def test_engine_keys_namespace(self):
        """An Offload's keys are engine ids (ENGINE_KEYS): kvtier's sequence keys of the same
        model do not see them, a client in engine-keys mode does."""
        o = self.offload()
        self.store(o, [41, 42])
        seq = kvtier.Client("unix:" + self.sock, timeout=5.0)
        eng = kvtier.Client("unix:" + self.sock, timeout=5.0, engine_keys=True)
        self.addCleanup(seq.close)
        self.addCleanup(eng.close)
        self.assertEqual(seq.lookup(MODEL, [41, 42]), [])
        self.assertEqual(len(eng.lookup(MODEL, [41, 42])), 2)
        self.assertEqual(eng.block_get(MODEL, 42), data(42))
        seq.block_put(MODEL, 41, b"other")  # a sequence key 41 is another block
        self.assertEqual(seq.block_get(MODEL, 41), b"other")
        self.assertEqual(self.load(o, [41]), [data(41)])
        o2 = Offload(self.sock, MODEL, timeout=10.0, engine_keys=False)
        self.addCleanup(o2.close)
        self.assertEqual(o2.lookup([41, 42]), 1)

    def test_session_lost(self):
        """A call that libkvtier ran on a new connection (kvtierd restarted, or closed the
        idle one) raises SessionLost and closes the Offload: its slots may name another
        arena's. A new Offload works."""
        o = self.offload()
        self.store(o, [61])
        self.d.stop()
        self.d = self.daemon()
        with self.assertRaises(offload.SessionLost):
            o.lookup([61])
        self.assertTrue(o.closed)
        with self.assertRaises(kvtier.Error):
            o.prepare_store([62])
        o2 = self.offload()
        self.assertEqual(self.store(o2, [62])[0][0][0], 62)
        self.d.stop()
        self.flags += ["--idle-timeout", "1s"]
        self.d = self.daemon()
        o3 = self.offload()
        self.store(o3, [63])
        time.sleep(2.0)  # past --idle-timeout: kvtierd closes the connection
        with self.assertRaises(offload.SessionLost):
            o3.prepare_load([63])
        fx.wait_for(lambda: self.held() == (0, 0), what="the lost session's pin released")

    def test_kvtierd_restart(self):
        if self.nodisk is not None:
            self.skipTest("no NVMe store here: " + self.nodisk)
        o = self.offload()
        keys = list(range(3000, 3016))
        self.store(o, keys)
        fx.wait_for(lambda: self.disk_used() >= 4, what="demotions to NVMe")
        durable = self.disk_used()
        o.close()
        self.d.stop()
        self.d = self.daemon()
        o2 = self.offload()
        # RAM does not survive a restart; every block the NVMe store held comes back
        found = [k for k in keys if o2.lookup([k]) == 1]
        self.assertEqual(len(found), durable)
        self.assertEqual(self.load(o2, found), [data(k) for k in found])
        fx.wait_for(lambda: self.held() == (0, 0), what="nothing pinned")

    def test_refusals(self):
        with self.assertRaises(kvtier.Error):
            Offload(os.path.join(self.tmp.name, "nobody.sock"), MODEL, timeout=1.0)
        o = self.offload()
        self.assertEqual([k for k, _ in o.prepare_store([1])[0]], [1])
        with self.assertRaises(ValueError):  # one length per reserved key
            o.complete_store([1], lens=[1, 2])
        with self.assertRaises(kvtier.Error):  # a length past block_bytes: the server's refusal
            o.complete_store([1], lens=[BB + 1])
        self.assertEqual(o.complete_store([1], ok=False), [1])  # still reserved: given back
        self.assertEqual(o.lookup([1]), 0)
        self.assertEqual(o.complete_load([77]), 0)  # never pinned: skipped
        with self.assertRaises(ValueError):
            vllm_key(b"")
        with self.assertRaises(ValueError):
            sglang_key("zz")


class TestKeys(unittest.TestCase):
    def test_engine_hash_ids(self):
        """The ids kvtierd's event decoders give raw engine hashes (kvindex/event.h): vLLM's
        bytes by their last 8, SGLang's by their first 8, big-endian; ints as u64."""
        self.assertEqual(vllm_key(-1), 2**64 - 1)
        self.assertEqual(vllm_key(7), 7)
        self.assertEqual(vllm_key(b"\x01" * 24 + b"\x00" * 7 + b"\x2a"), 42)
        self.assertEqual(sglang_key(bytes.fromhex("00000000000000ff") + b"\xab" * 24), 255)
        self.assertEqual(sglang_key("00000000000000ff" + "ab" * 24), 255)
        self.assertEqual(sglang_key(-2), 2**64 - 2)


if __name__ == "__main__":
    # a sanitizer runtime preloaded for this interpreter (an ASan libkvtier) is not kvtierd's
    os.environ.pop("LD_PRELOAD", None)
    fx.SidecarCase.BIN, _ = fx.binary_from_argv("test_offload.py")
    unittest.main(verbosity=2)
