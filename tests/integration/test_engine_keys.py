#!/usr/bin/python3
"""Engine keys in the index (docs/tiers.md, "Engine keys"), against a real kvtierd: blocks the
engine connectors store under an engine's block-hash ids (the ENGINE_KEYS flag, ?keys=engine)
add kvtierd's tier to the block the engine reported under that hash, in a namespace apart from
the sequence keys; the publisher sends the engine's hash; a hash the pod has not reported yet
waits (tiers.unresolved) and joins once the engine reports it, after a restart too.

Usage: test_engine_keys.py path/to/kvtierd (the tiers' test set-up, test_tiers.py's Base)
"""
import os
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import kvtierd_fixture as fx  # noqa: E402
import hash_vectors as hv  # noqa: E402
import test_tiers as tt  # noqa: E402
from test_tiers import MODEL, OP_BLOCK_PUT, POD, BB, blob, zmq  # noqa: E402


class TestEngineKeys(tt.Publishing, tt.Base):
    @unittest.skipIf(hv.xxhash is None, "python3-xxhash is needed for the standard's keys")
    def test_engine_keys_add_a_tier_to_the_engines_own_blocks(self):
        """Blocks stored under an engine's block-hash ids (ENGINE_KEYS; ?keys=engine) land on
        the blocks the engine reported under those hashes, as its own CPU stores would: the
        index, the tiers and the publisher agree on one block. Their namespace is apart from
        the sequence keys'; hashes the pod never reported are counted, not indexed."""
        d, rep = self.start_publishing()
        toks = list(range(1000, 1048))
        _, keys = hv.hash_seq(toks, 16)
        ehash = [0xE000000000000001, 0xE000000000000002, 0xE000000000000003]
        ev = {"pod": POD, "model": MODEL, "events": [
            {"type": "BlockStored", "block_hashes": ehash, "parent_block_hash": None,
             "token_ids": toks, "block_size": 16, "medium": "GPU"}]}
        s, a = d.http("POST", "/v1/events", ev)
        self.assertEqual(s, 200, a)
        self.wait_pod(d, keys, (3, 3, 0, 0))
        for e in ehash[:2]:  # over HTTP
            self.put_ok(d, e, blob(e), query="model=%s&keys=engine" % MODEL)
        rpc = self.unix()  # and over RPC, with the flag in the header
        body = fx.pstr(MODEL) + fx.pstr("") + struct.pack("<QB3xI", ehash[2], 0, BB) + blob(ehash[2])
        rpc.s.sendall(fx.frame(OP_BLOCK_PUT, 7, body, flags=4))
        h, b = fx.read_frame(rpc.s)
        self.assertEqual((h["op"], h["flags"]), (OP_BLOCK_PUT, fx.F_RESPONSE), b)
        self.wait_tiers(d, lambda t: t["blocks"] == 3, "three blocks")
        # the engine drops them from HBM: what is left of its blocks is the sidecar's copy
        ev["events"] = [{"type": "BlockRemoved", "block_hashes": ehash, "medium": "GPU"}]
        s, a = d.http("POST", "/v1/events", ev)
        self.assertEqual(s, 200, a)
        self.wait_pod(d, keys, (3, 0, 3, 0))
        # one block each: under the engine's hash, not under a sequence key
        self.assert_block(d, ehash[2], blob(ehash[2]), model=MODEL + "&keys=engine")
        self.assert_missing(d, ehash[0])
        self.assert_missing(d, keys[0], model=MODEL + "&keys=engine")
        # a hash the pod never reported is held, counted, and indexed nowhere
        self.put_ok(d, 77, blob(77), query="model=%s&keys=engine" % MODEL)
        self.wait_tiers(d, lambda t: t["unresolved"] == 1, "one unresolved engine key")
        self.wait_pod(d, [77], (0, 0, 0, 0))
        s, a = d.http("DELETE", "/v1/blocks/%d?model=%s&keys=engine" % (ehash[1], MODEL))
        self.assertEqual(s, 200, a)
        self.wait_pod(d, keys, (1, 0, 1, 0))
        # the flag on a call without tier keys: refused, the connection stays
        rpc.s.sendall(fx.frame(0x02, 8, b"", flags=4))
        h, b = fx.read_frame(rpc.s)
        self.assertEqual(h["flags"], fx.F_RESPONSE | fx.F_ERROR)
        self.assertIn("ENGINE_KEYS", fx.parse_error(b)[2])
        self.assertEqual(rpc.call(0x02)[0]["flags"], fx.F_RESPONSE)  # PING still answered
        rpc.close()
        if zmq is not None:
            batches = self.replay("tcp://127.0.0.1:%d" % rep)
            self.assertEqual(sorted(self.stored_on(batches, "CPU")), [77] + ehash)

    @unittest.skipIf(hv.xxhash is None, "python3-xxhash is needed for the standard's keys")
    def test_engine_keys_the_pod_reports_later(self):
        """An engine-key block whose hash the pod has not reported waits, held and counted in
        unresolved, and joins the pod's entries once the engine reports the hash: a store
        that beat the engine's event, and blocks reloaded from NVMe after a restart (the
        index starts empty)."""
        d = self.start()
        toks = list(range(2000, 2032))
        _, keys = hv.hash_seq(toks, 16)
        ehash = [0xE100000000000001, 0xE100000000000002]
        for e in ehash:
            self.put_ok(d, e, blob(e), durable=True, query="model=%s&keys=engine&durable=1"
                        % MODEL)
        self.wait_tiers(d, lambda t: t["unresolved"] == 2, "two unresolved engine keys")
        self.wait_pod(d, keys, (0, 0, 0, 0))
        stored = {"pod": POD, "model": MODEL, "events": [
            {"type": "BlockStored", "block_hashes": ehash, "parent_block_hash": None,
             "token_ids": toks, "block_size": 16, "medium": "GPU"}]}
        removed = {"pod": POD, "model": MODEL, "events": [
            {"type": "BlockRemoved", "block_hashes": ehash, "medium": "GPU"}]}
        for ev in (stored, removed):
            s, a = d.http("POST", "/v1/events", ev)
            self.assertEqual(s, 200, a)
        self.wait_pod(d, keys, (2, 0, 2, 0))  # in RAM and on NVMe: RAM counts
        self.wait_tiers(d, lambda t: t["unresolved"] == 0, "the keys resolved")
        d = self.restart(d)
        self.wait_tiers(d, lambda t: t["unresolved"] == 2 and t["restored"] == 2,
                        "two blocks reloaded, not in the index yet")
        self.wait_pod(d, keys, (0, 0, 0, 0))
        for ev in (stored, removed):
            s, a = d.http("POST", "/v1/events", ev)
            self.assertEqual(s, 200, a)
        self.wait_pod(d, keys, (2, 0, 0, 2))
        self.wait_tiers(d, lambda t: t["unresolved"] == 0, "the keys resolved")
        # a pending key that leaves the tiers leaves the table too; its namespace (a connector's
        # per-rank one here) is no namespace of the index's
        spaces = d.stats()["index"]["namespaces"]
        self.put_ok(d, 99, blob(99), query="model=%s&lora=tp0of2&keys=engine" % MODEL)
        st = tt.wait_for(lambda: (lambda x: x if x["tiers"]["unresolved"] == 1 else None)(
            d.stats()), "one pending")
        self.assertEqual(st["index"]["namespaces"], spaces)  # the same snapshot
        s, a = d.http("DELETE", "/v1/blocks/99?model=%s&lora=tp0of2&keys=engine" % MODEL)
        self.assertEqual(s, 200, a)
        self.wait_tiers(d, lambda t: t["unresolved"] == 0, "none pending")



if __name__ == "__main__":
    tt.BIN, tt.SANITIZED = fx.binary_from_argv("test_engine_keys.py")
    why = tt.probe()
    if why:
        print("SKIP: " + why)
        sys.exit(77)
    unittest.main(verbosity=2)
