#!/usr/bin/python3
"""Integration tests of kvtierd's engine event streams: the real daemon, real ZMQ.

Usage: test_engines.py path/to/kvtierd      (exit 77 = skipped)
A Python publisher (tests/fixtures/kv_events.py) encodes batches exactly as
each engine version does: positional and map events, uint64/int64/bytes
hashes, DP ranks, both replay layouts. Checks: blocks become queryable;
removal and clear work; a dropped batch comes back through replay; an engine
restart clears stale entries; a gap beyond the replay buffer (or without a
replay endpoint, or a replay that times out) drops the pod's state; garbage
frames and truncated msgpack are counted and skipped; the API refuses bad
engines; /metrics carries the stream counters; with --lora-keys dynamo, LoRA
blocks from a stream are keyed as NVIDIA Dynamo keys them (TestLoraKeysDynamo).
"""

import json
import os
import socket
import struct
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import kvtierd_fixture as fx  # noqa: E402

try:
    import zmq
    import msgpack  # noqa: F401
    import kv_events as kv
except ImportError as e:  # Debian's python3-zmq / python3-msgpack missing
    print("skipped: %s" % e)
    sys.exit(77)

BIN = None
OP_ENGINE_ADD = 0x22
BS = 16


def tokens(seed, nblocks):
    return [(seed * 7919 + i * 31) % 128000 for i in range(nblocks * BS)]


wait_for = fx.wait_for


def free_port_pair():
    """A port p with p and p + 1 both free on 127.0.0.1 (DP ranks use port + rank)."""
    for _ in range(100):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p >= 65535:
            continue
        try:
            t = socket.socket()
            t.bind(("127.0.0.1", p + 1))
            t.close()
            return p
        except OSError:
            continue
    raise RuntimeError("no free port pair")


class Base(unittest.TestCase):
    flags = ("--stats-period", "20ms")

    def setUp(self):
        self.ctx = zmq.Context()
        self.pubs = []
        self.d = fx.Daemon(BIN, *self.flags)

    def tearDown(self):
        rc = self.d.stop()
        for p in self.pubs:
            p.close()
        self.ctx.term()
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors) or rc != 0:
            sys.stderr.write("---- kvtierd log ----\n" + self.d.read_log() + "\n")
        self.d.cleanup()
        self.assertEqual(rc, 0, "kvtierd did not exit 0 on SIGTERM")

    def publisher(self, layout=5, replay=True, buffer_steps=10000, topic=b"", endpoint=None,
                  replay_endpoint=None, bind=True):
        p = kv.Publisher(self.ctx, endpoint or "tcp://127.0.0.1:*",
                         (replay_endpoint or "tcp://127.0.0.1:*") if replay else None,
                         topic=topic, layout=layout, buffer_steps=buffer_steps, bind=bind)
        self.pubs.append(p)
        return p

    def mute_replay(self):
        """A replay endpoint that never answers: (its ROUTER, its address). Close it."""
        mute = self.ctx.socket(zmq.ROUTER)
        mute.setsockopt(zmq.LINGER, 0)
        mute.bind("tcp://127.0.0.1:*")
        return mute, mute.getsockopt(zmq.LAST_ENDPOINT).decode()

    def add_engine(self, pod, pub, expect=200, **extra):
        body = {"pod": pod, "model": "m", "endpoint": pub.endpoint}
        if pub.replay_endpoint:
            body["replay_endpoint"] = pub.replay_endpoint
        body.update(extra)
        s, a = self.d.http("POST", "/v1/engines", body)
        self.assertEqual(s, expect, a)
        return a

    def stream(self, pod, rank=0):
        for s in self.d.stats()["streams"]:
            if s["pod"] == pod and s["dp_rank"] == rank:
                return s
        return None

    def sync(self, pod, pub, rank=0, **encode):
        """Publishes empty batches until the stream has one: the SUB has joined."""
        def joined():
            pub.publish(kv.encode_batch([], **encode))
            s = self.stream(pod, rank)
            return s is not None and s["last_seq"] is not None and s
        return wait_for(joined, what="%s rank %d to join" % (pod, rank))

    def settle(self, pod, pub, rank=0):
        """Waits until the stream applied everything published (last_seq caught up, live)."""
        want = pub.seq - 1
        return wait_for(lambda: (lambda s: s if s and s["last_seq"] == want and
                                 s["state"] == "live" else None)(self.stream(pod, rank)),
                        what="%s rank %d to reach seq %d" % (pod, rank, want))

    def matched(self, toks, model="m"):
        s, ans = self.d.http("POST", "/v1/query", {"model": model, "token_ids": toks})
        self.assertEqual(s, 200, ans)
        return {(p["pod"], p["dp_rank"]): (p["matched_blocks"], p["gpu"], p["cpu"])
                for p in ans["pods"]}


def seq_keys(toks, salt=""):
    """The block keys of @toks (DESIGN.md's hashing standard), the first block's local hash
    seeded with XXH3(salt, 1337) when a cache salt is given (docs/api.md)."""
    import xxhash
    first = xxhash.xxh3_64_intdigest(salt.encode(), seed=1337) if salt else 1337
    keys, prev = [], None
    for i in range(len(toks) // BS):
        blk = struct.pack("<%dI" % BS, *toks[i * BS:(i + 1) * BS])
        local = xxhash.xxh3_64_intdigest(blk, seed=first if i == 0 else 1337)
        prev = local if prev is None else xxhash.xxh3_64_intdigest(
            struct.pack("<QQ", prev, local), seed=1337)
        keys.append(prev)
    return keys


class TestIngest(Base):
    def check_forms(self, pod, layout, form, hash_form, engine="vllm", fmt=None):
        pub = self.publisher(layout=layout)
        extra = {"format": fmt} if fmt else {}
        self.add_engine(pod, pub, **extra)
        enc = dict(form=form, hash_form=hash_form, engine=engine)
        self.sync(pod, pub, **enc)
        t = tokens(len(pod), 6)
        h = [1000 + i for i in range(6)]
        pub.publish(kv.encode_batch([kv.stored(h[:4], t[:64], BS)], **enc))
        pub.publish(kv.encode_batch([kv.stored(h[4:], t[64:], BS, parent=h[3])], dp_rank=0,
                                    **enc))
        self.settle(pod, pub)
        self.assertEqual(self.matched(t)[(pod, 0)], (6, 6, 0))
        # removal by engine hash, in the same wire form
        pub.publish(kv.encode_batch([kv.removed(h[2:3])], **enc))
        self.settle(pod, pub)
        self.assertEqual(self.matched(t)[(pod, 0)], (2, 2, 0))
        pub.publish(kv.encode_batch([kv.cleared()], **enc))
        self.settle(pod, pub)
        self.assertNotIn((pod, 0), self.matched(t))
        s = self.stream(pod)
        self.assertEqual((s["undecodable"], s["gaps"], s["restarts"]), (0, 0, 0), s)
        self.assertEqual(s["events"], 4)
        self.assertEqual(s["blocks"], 7)

    def test_vllm_v025_positional_uint(self):
        self.check_forms("v025", 4, "array", "uint")

    def test_vllm_v026_map_uint(self):
        self.check_forms("v026", 5, "map", "uint")

    def test_vllm_bytes_hashes(self):
        self.check_forms("b32", 5, "map", "bytes32")
        self.check_forms("b16", 4, "array", "bytes16")

    def test_sglang_int64_and_bytes(self):
        self.check_forms("sgl", 4, "array", "int", engine="sglang", fmt="sglang")
        self.check_forms("sglb", 4, "array", "bytes32", engine="sglang", fmt="sglang")

    def test_cpu_placeholders_and_unknowns(self):
        pub = self.publisher()
        self.add_engine("cpu", pub)
        self.sync("cpu", pub)
        t = tokens(3, 4)
        h = [77, 78, 79, 80]
        pub.publish(kv.encode_batch([kv.stored(h, t, BS)], hash_form="uint"))
        # vLLM's CPU offload: token_ids [], block_size 0, raw bytes hashes, medium CPU
        pub.publish(kv.encode_batch([kv.stored(h[:3], [], 0, medium="CPU"),
                                     kv.stored([999], [], 0, medium="CPU"),
                                     {"type": "BlockMoved", "x": 1}], form="map",
                                    hash_form="bytes32"))
        pub.publish(kv.encode_batch([kv.removed(h, medium="GPU")], form="map"))
        self.settle("cpu", pub)
        self.assertEqual(self.matched(t)[("cpu", 0)], (3, 0, 3))
        s = self.stream("cpu")
        self.assertEqual(s["unresolved"], 1, s)  # hash 999 was never stored with tokens
        self.assertEqual(s["ignored"], 1, s)     # the unknown event type

    def test_cpu_store_after_gpu_eviction(self):
        # vLLM under memory pressure: BlockRemoved GPU, then the offloading connector's
        # token-less CPU BlockStored for the same hashes, in the same batch or the next one
        pub = self.publisher()
        self.add_engine("ev", pub)
        self.sync("ev", pub)
        t = tokens(4, 4)
        h = [81, 82, 83, 84]
        pub.publish(kv.encode_batch([kv.stored(h, t, BS)], form="map"))
        pub.publish(kv.encode_batch([kv.removed(h[2:], medium="GPU"),
                                     kv.stored(h[2:], [], 0, medium="CPU")], form="map",
                                    hash_form="bytes32"))
        self.settle("ev", pub)
        self.assertEqual(self.matched(t)[("ev", 0)], (4, 2, 2))
        pub.publish(kv.encode_batch([kv.removed(h[:2], medium="GPU")], form="map"))
        pub.publish(kv.encode_batch([kv.stored(h[:2], [], 0, medium="CPU")], form="map",
                                    hash_form="bytes32"))
        self.settle("ev", pub)
        self.assertEqual(self.matched(t)[("ev", 0)], (4, 0, 4))
        s = self.stream("ev")
        self.assertEqual((s["unresolved"], s["recovered"]), (0, 4), s)

    def test_dp_ranks_on_port_plus_rank(self):
        port = free_port_pair()
        rport = free_port_pair()
        pubs = [self.publisher(endpoint="tcp://127.0.0.1:%d" % (port + r),
                               replay_endpoint="tcp://127.0.0.1:%d" % (rport + r))
                for r in range(2)]
        a = self.add_engine("dp", pubs[0], dp_size=2)
        self.assertEqual(a["endpoints"], ["tcp://127.0.0.1:%d" % port,
                                          "tcp://127.0.0.1:%d" % (port + 1)])
        for r in range(2):
            self.sync("dp", pubs[r], rank=r, dp_rank=r)
        t = tokens(5, 4)
        pubs[0].publish(kv.encode_batch([kv.stored([1, 2, 3, 4], t, BS)], dp_rank=0))
        # the stream names the rank: a payload that says otherwise does not move the blocks
        pubs[1].publish(kv.encode_batch([kv.stored([1, 2], t[:32], BS)], dp_rank=5))
        for r in range(2):
            self.settle("dp", pubs[r], rank=r)
        m = self.matched(t)
        self.assertEqual(m[("dp", 0)][0], 4)
        self.assertEqual(m[("dp", 1)][0], 2)

    def test_kvtierd_binds_and_engines_dial_in(self):
        s, a = self.d.http("POST", "/v1/engines", {"pod": "dial", "model": "m", "bind": True,
                                                   "endpoint": "tcp://127.0.0.1:*"})
        self.assertEqual(s, 200, a)
        ep = a["endpoints"][0]
        self.assertRegex(ep, r"^tcp://127\.0\.0\.1:\d+$")
        pub = self.publisher(endpoint=ep, replay=False, bind=False)
        self.sync("dial", pub)
        t = tokens(9, 2)
        pub.publish(kv.encode_batch([kv.stored([5, 6], t, BS)]))
        self.settle("dial", pub)
        self.assertEqual(self.matched(t)[("dial", 0)][0], 2)

    def test_engines_dial_into_one_bound_port(self):
        # llm-d's layout: every engine connects to the indexer's one port, named by its topic
        port = free_port_pair()
        ep = "tcp://127.0.0.1:%d" % port
        pubs = {}
        for pod in ("A", "B"):
            pubs[pod] = self.publisher(endpoint=ep, bind=False, topic=b"kv@%s@m" % pod.encode())
            s, a = self.d.http("POST", "/v1/engines", {
                "pod": pod, "model": "m", "endpoint": ep, "bind": True,
                "topic": "kv@%s@m" % pod, "replay_endpoint": pubs[pod].replay_endpoint})
            self.assertEqual((s, a.get("endpoints")), (200, [ep]), a)
        for topic in ("kv@A", "", "kv@B@m@x"):
            s, a = self.d.http("POST", "/v1/engines", {"pod": "C", "model": "m", "endpoint": ep,
                                                       "bind": True, "topic": topic})
            self.assertEqual(s, 400, (topic, a))
            self.assertIn("do not start one another", a["error"])
        for pod in ("A", "B"):
            self.sync(pod, pubs[pod])
        ta, tb, ta2 = tokens(40, 2), tokens(41, 2), tokens(42, 2)
        pubs["A"].publish(kv.encode_batch([kv.stored([1, 2], ta, BS)]))
        pubs["A"].publish(kv.encode_batch([kv.stored([3, 4], ta2, BS)]), send=False)
        pubs["B"].publish(kv.encode_batch([kv.stored([1, 2], tb, BS)]))
        pubs["A"].publish(kv.encode_batch([kv.removed([1])]))
        for pod in ("A", "B"):
            self.settle(pod, pubs[pod])
        self.assertNotIn(("A", 0), self.matched(ta))
        self.assertEqual(self.matched(ta2)[("A", 0)][0], 2, "A's gap replayed from A")
        self.assertEqual(self.matched(tb)[("B", 0)][0], 2)
        sa, sb = self.stream("A"), self.stream("B")
        self.assertEqual((sa["gaps"], sa["replays"], sa["state_drops"]), (1, 1, 0), sa)
        self.assertEqual((sb["gaps"], sb["replays"], sb["state_drops"]), (0, 0, 0), sb)
        # A leaves: B keeps the port, A's messages are no longer applied
        self.assertEqual(self.d.http("DELETE", "/v1/engines/A")[0], 200)
        pubs["A"].publish(kv.encode_batch([kv.stored([5, 6], ta, BS)]))
        pubs["B"].publish(kv.encode_batch([kv.stored([5, 6], ta, BS)]))
        self.settle("B", pubs["B"])
        self.assertEqual(set(self.matched(ta)), {("B", 0)})
        self.assertEqual(self.stream("B")["gaps"], 0)

    def test_engine_flag_and_topic(self):
        pub = self.publisher(topic=b"kv@flag@m")
        other = fx.Daemon(BIN, "--engine", json.dumps(
            {"pod": "flag", "model": "m", "endpoint": pub.endpoint, "topic": "kv@flag@m",
             "replay_endpoint": pub.replay_endpoint}))
        try:
            def joined():
                pub.publish(kv.encode_batch([]))
                st = [s for s in other.stats()["streams"] if s["pod"] == "flag"]
                return st and st[0]["last_seq"] is not None
            wait_for(joined, what="the --engine stream to join")
            t = tokens(11, 2)
            pub.publish(kv.encode_batch([kv.stored([8, 9], t, BS)]))
            wait_for(lambda: [p for p in other.http("POST", "/v1/query",
                                                    {"model": "m", "token_ids": t})[1]["pods"]
                              if p["pod"] == "flag" and p["matched_blocks"] == 2],
                     what="blocks from the --engine stream")
        finally:
            self.assertEqual(other.stop(), 0)
            other.cleanup()


class TestHealth(Base):
    flags = ("--stats-period", "20ms", "--replay-timeout", "300ms")

    def store_chain(self, pub, seed, n=2, send=True):
        t = tokens(seed, n)
        pub.publish(kv.encode_batch([kv.stored([seed * 100 + i for i in range(n)], t, BS)]),
                    send=send)
        return t

    def check_gap_replayed(self, layout):
        pub = self.publisher(layout=layout)
        self.add_engine("g", pub)
        self.sync("g", pub)
        t1 = self.store_chain(pub, 1)
        t2 = self.store_chain(pub, 2, send=False)  # the subscriber misses this one
        t3 = self.store_chain(pub, 3)
        self.settle("g", pub)
        m = self.matched(t2)
        self.assertEqual(m[("g", 0)][0], 2, "the missed batch came back through replay")
        for t in (t1, t3):
            self.assertEqual(self.matched(t)[("g", 0)][0], 2)
        s = self.stream("g")
        self.assertEqual((s["gaps"], s["replays"], s["replay_failures"], s["state_drops"]),
                         (1, 1, 0, 0), s)
        self.assertGreaterEqual(s["replayed"], 1)
        self.assertEqual(pub.replays, 1)

    def test_gap_replayed_4_frames(self):
        self.check_gap_replayed(4)

    def test_gap_replayed_5_frames(self):
        self.check_gap_replayed(5)

    def test_restart_clears_stale_entries(self):
        pub = self.publisher()
        self.add_engine("r", pub)
        self.sync("r", pub)
        old = self.store_chain(pub, 4)
        self.settle("r", pub)
        self.assertIn(("r", 0), self.matched(old))
        pub.restart()  # seq back to 0, an empty cache
        new = self.store_chain(pub, 5)
        self.settle("r", pub)
        self.assertNotIn(("r", 0), self.matched(old), "stale entries after a restart")
        self.assertEqual(self.matched(new)[("r", 0)][0], 2)
        s = self.stream("r")
        self.assertEqual((s["restarts"], s["state_drops"], s["last_seq"]), (1, 1, 0), s)

    def test_engine_process_restart_on_the_same_port(self):
        # a new process binds the same port: the SUB reconnects once, nothing arrives twice
        port = free_port_pair()
        ep = "tcp://127.0.0.1:%d" % port
        first = self.publisher(endpoint=ep, replay=False)
        self.add_engine("p", first)
        self.sync("p", first)
        old = self.store_chain(first, 26)
        for _ in range(50):  # a seq the new process will not reach before the SUB reconnects
            first.publish(kv.encode_batch([]))
        self.settle("p", first)
        first.close()

        def rebind():  # libzmq releases the port shortly after close
            try:
                return self.publisher(endpoint=ep, replay=False)
            except zmq.ZMQError:
                return None
        second = wait_for(rebind, what="the port to be free again")

        def dropped():  # a seq back to 0, or ahead when the first batches went by unseen
            second.publish(kv.encode_batch([]))
            return self.stream("p")["state_drops"] >= 1
        wait_for(dropped, what="the stream to see the new process")
        new = [self.store_chain(second, 27 + i) for i in range(3)]
        s = self.settle("p", second)
        # a batch delivered twice would read as one more restart
        self.assertEqual((s["restarts"] + s["gaps"], s["state_drops"]), (1, 1), s)
        self.assertNotIn(("p", 0), self.matched(old))
        for t in new:
            self.assertEqual(self.matched(t)[("p", 0)][0], 2)

    def test_gap_beyond_replay_buffer_drops_state(self):
        pub = self.publisher(buffer_steps=2)
        self.add_engine("b", pub)
        self.sync("b", pub)
        old = self.store_chain(pub, 6)
        for i in range(5):
            self.store_chain(pub, 20 + i, send=False)  # 5 missed: the buffer keeps 2
        new = self.store_chain(pub, 7)
        self.settle("b", pub)
        self.assertNotIn(("b", 0), self.matched(old), "served state across an unfilled gap")
        self.assertEqual(self.matched(new)[("b", 0)][0], 2)
        s = self.stream("b")
        self.assertEqual((s["gaps"], s["replays"], s["replay_failures"], s["state_drops"]),
                         (1, 1, 1, 1), s)

    def test_replay_of_an_emptied_buffer_drops_state(self):
        pub = self.publisher(buffer_steps=0)  # answers every replay with the end marker alone
        self.add_engine("e", pub)
        self.sync("e", pub)
        old = self.store_chain(pub, 23)
        self.store_chain(pub, 24, send=False)
        new = self.store_chain(pub, 25)
        self.settle("e", pub)
        self.assertNotIn(("e", 0), self.matched(old))
        self.assertEqual(self.matched(new)[("e", 0)][0], 2)
        s = self.stream("e")
        self.assertEqual((s["replays"], s["replay_failures"], s["state_drops"]), (1, 1, 1), s)
        self.assertIn("ended before seq", self.d.read_log())

    def test_gap_without_replay_endpoint_drops_state(self):
        pub = self.publisher(replay=False)
        self.add_engine("n", pub)
        self.sync("n", pub)
        old = self.store_chain(pub, 8)
        self.store_chain(pub, 9, send=False)
        new = self.store_chain(pub, 10)
        self.settle("n", pub)
        self.assertNotIn(("n", 0), self.matched(old))
        self.assertEqual(self.matched(new)[("n", 0)][0], 2)
        s = self.stream("n")
        self.assertEqual((s["gaps"], s["replays"], s["state_drops"]), (1, 0, 1), s)

    def test_replay_timeout_drops_state_and_backs_off(self):
        pub = self.publisher(replay=False)
        mute, mute_ep = self.mute_replay()
        try:
            self.add_engine("t", pub, replay_endpoint=mute_ep)
            self.sync("t", pub)
            old = self.store_chain(pub, 11)
            self.store_chain(pub, 12, send=False)
            new = self.store_chain(pub, 13)
            s = wait_for(lambda: (lambda s: s if s["replay_failures"] == 1 else None)(
                self.stream("t")), what="the replay to time out")
            self.assertEqual(s["state_drops"], 1, s)
            self.settle("t", pub)
            self.assertNotIn(("t", 0), self.matched(old))
            self.assertEqual(self.matched(new)[("t", 0)][0], 2)
            # within the back-off a new gap drops state at once, without a replay
            self.store_chain(pub, 14, send=False)
            self.store_chain(pub, 15)
            s = self.settle("t", pub)
            self.assertEqual((s["gaps"], s["replays"], s["state_drops"]), (2, 1, 2), s)
        finally:
            mute.close(0)

    def test_garbage_is_counted_and_skipped(self):
        pub = self.publisher()
        self.add_engine("x", pub)
        self.sync("x", pub)
        good = self.store_chain(pub, 16)
        payload = kv.encode_batch([kv.stored([1, 2], tokens(17, 2), BS)])
        for bad in (b"\xc1", payload[:-3], b"\x93\xcb" + b"\0" * 8 + b"\xdd\xff\xff\xff\xff",
                    msgpack.packb({"not": "a batch"}),
                    msgpack.packb([0.0, [["BlockStored", [1], None, [1, 2, 3], 16]]])):
            pub.publish(bad)
        pub.pub.send_multipart([b"", b"\x00\x01"])                 # 2 frames
        pub.pub.send_multipart([b"", b"\x00" * 4, payload])        # a 4-byte seq
        pub.pub.send_multipart([b"", b"\x00" * 8, payload, b"x"])  # 4 frames
        after = self.store_chain(pub, 18)
        s = self.settle("x", pub)
        # four payloads are no batch: each may have held removals, so each drops the state;
        # the fifth is a batch whose one event is bad: a store, skipped alone
        self.assertEqual(s["undecodable"], 4, s)
        self.assertEqual(s["bad_frames"], 3, s)
        self.assertEqual((s["gaps"], s["restarts"], s["state_drops"]), (0, 0, 4), s)
        self.assertNotIn(("x", 0), self.matched(good))
        self.assertEqual(self.matched(after)[("x", 0)][0], 2)
        log = self.d.read_log()
        self.assertIn("is not a batch", log)
        self.assertIn("1 events skipped", log)
        # one line per kind (no batch, bad event, bad frame) a minute, not one per bad message
        self.assertEqual(log.count("engine x rank 0:"), 3, log)


class TestForms(Base):
    """Every form the engines emit, through real ZMQ: batch maps, SGLang's layout with its
    metadata map and mediums, vLLM's extra_keys, hybrid models' groups, locality, and
    batches with one bad event."""

    def by_keys(self, keys, model="m"):
        s, ans = self.d.http("POST", "/v1/query", {"model": model, "block_hashes": keys})
        self.assertEqual(s, 200, ans)
        return {(p["pod"], p["dp_rank"]): (p["matched_blocks"], p["gpu"], p["cpu"], p["disk"])
                for p in ans["pods"]}

    def test_batch_map_form(self):
        pub = self.publisher()
        self.add_engine("bm", pub)
        self.sync("bm", pub, batch="map")
        t1, t2 = tokens(70, 2), tokens(71, 3)
        pub.publish(kv.encode_batch([kv.stored([1, 2], t1, BS)], form="map", batch="map",
                                    dp_rank=0))
        pub.publish(kv.encode_batch([kv.stored([3, 4, 5], t2, BS)], form="array", batch="map"))
        self.settle("bm", pub)
        self.assertEqual(self.matched(t1)[("bm", 0)][0], 2)
        self.assertEqual(self.matched(t2)[("bm", 0)][0], 3)
        s = self.stream("bm")
        self.assertEqual((s["undecodable"], s["state_drops"]), (0, 0), s)

    def test_sglang_metadata_salt_and_mediums(self):
        pub = self.publisher(layout=4)
        self.add_engine("sg", pub, format="sglang")
        enc = dict(engine="sglang", hash_form="int")
        self.sync("sg", pub, **enc)
        t = tokens(80, 4)
        h = [-5, -6, 7, 8]
        pub.publish(kv.encode_batch([kv.stored(h[:2], t[:32], BS, cache_salt="tenant-a"),
                                     kv.stored(h[2:], t[32:], BS, parent=h[1],
                                               cache_salt="tenant-a")], **enc))
        pub.publish(kv.encode_batch([kv.stored(h[:1], [], 0, medium="CPU_PINNED"),
                                     kv.stored(h[1:2], [], 0, medium="EXTERNAL"),
                                     kv.stored(h[2:3], [], 0, medium="DISK"),
                                     kv.stored(h[3:], [], 0, medium="HBM9")], **enc))
        self.settle("sg", pub)
        salted = seq_keys(t, "tenant-a")
        self.assertEqual(self.by_keys(salted)[("sg", 0)], (4, 4, 0, 0))
        # a salted prefix never matches an unsalted query, nor another tenant's
        self.assertNotIn(("sg", 0), self.matched(t))
        self.assertNotIn(("sg", 0), self.by_keys(seq_keys(t, "tenant-b")))
        pub.publish(kv.encode_batch([kv.removed(h, medium="GPU")], **enc))
        self.settle("sg", pub)
        # CPU_PINNED -> CPU; EXTERNAL and DISK -> DISK; HBM9 is no medium kvtier models
        self.assertEqual(self.by_keys(salted)[("sg", 0)], (3, 0, 1, 2))
        s = self.stream("sg")
        self.assertEqual((s["undecodable"], s["state_drops"], s["unresolved"]), (0, 0, 0), s)
        self.assertEqual((s["unknown_medium"], s["mediums"]), (1, {"HBM9": 1}), s)
        samples, _ = fx.parse_prometheus(self.d.http("GET", "/metrics")[1])
        self.assertEqual(samples[("kvtier_stream_medium_events_total",
                                  (("pod", "sg"), ("dp_rank", "0"), ("medium", "HBM9")))], 1)

    def test_vllm_extra_keys_salt(self):
        pub = self.publisher()
        self.add_engine("vs", pub)
        self.sync("vs", pub)
        t = tokens(90, 3)
        pub.publish(kv.encode_batch([kv.stored([1, 2, 3], t, BS, cache_salt="s1")], form="map",
                                    hash_form="bytes32"))
        pub.publish(kv.encode_batch([kv.stored([4, 5], t[:32], BS, cache_salt="s1",
                                               lora_name="ad")], form="array"))
        self.settle("vs", pub)
        self.assertEqual(self.by_keys(seq_keys(t, "s1"))[("vs", 0)][0], 3)
        self.assertNotIn(("vs", 0), self.matched(t))
        self.assertEqual(self.by_keys(seq_keys(t, "s1"), model="m")[("vs", 0)][0], 3)
        s, ans = self.d.http("POST", "/v1/query", {"model": "m", "lora_name": "ad",
                                                   "block_hashes": seq_keys(t, "s1")})
        self.assertEqual([(p["pod"], p["matched_blocks"]) for p in ans["pods"]], [("vs", 2)])

    def test_hybrid_model_groups(self):
        pub = self.publisher()
        self.add_engine("hy", pub)
        self.sync("hy", pub)
        t = tokens(100, 3)
        h = [11, 12, 13]
        full = dict(group_idx=0, kv_cache_spec_kind="full_attention")
        swa = dict(group_idx=1, kv_cache_spec_kind="sliding_window",
                   kv_cache_spec_sliding_window=1024)
        pub.publish(kv.encode_batch([kv.stored(h, t, BS, **full), kv.stored(h, t, BS, **swa)]))
        # the sliding window moves on: group 1 evicts the first blocks; full attention keeps them
        pub.publish(kv.encode_batch([kv.removed(h[:2], group_idx=1)], form="map"))
        self.settle("hy", pub)
        self.assertEqual(self.matched(t)[("hy", 0)][0], 3)
        pub.publish(kv.encode_batch([kv.removed(h[1:2], group_idx=0)]))
        self.settle("hy", pub)
        self.assertEqual(self.matched(t)[("hy", 0)][0], 1)
        self.assertEqual(self.stream("hy")["other_groups"], 2)

    def test_remote_blocks_are_not_local(self):
        pub = self.publisher()
        self.add_engine("rm", pub)
        self.sync("rm", pub)
        t = tokens(110, 2)
        pub.publish(kv.encode_batch([kv.stored([1, 2], t, BS, locality="REMOTE")], form="map"))
        pub.publish(kv.encode_batch([kv.stored([1, 2], t, BS, locality="REMOTE")]))
        self.settle("rm", pub)
        self.assertNotIn(("rm", 0), self.matched(t))
        pub.publish(kv.encode_batch([kv.stored([1, 2], t, BS, locality="LOCAL")]))
        self.settle("rm", pub)
        self.assertEqual(self.matched(t)[("rm", 0)][0], 2)
        self.assertEqual(self.stream("rm")["remote"], 2)

    def test_one_bad_event_never_drops_its_batch(self):
        pub = self.publisher()
        self.add_engine("be", pub)
        self.sync("be", pub)
        ta, tb, tc = tokens(120, 2), tokens(121, 2), tokens(122, 2)
        pub.publish(kv.encode_batch([kv.stored([1, 2], ta, BS)]))
        self.settle("be", pub)
        # a bad store (SGLang's EAGLE token pairs) is skipped alone
        pairs = [[x, x + 1] for x in tb]
        pub.publish(msgpack.packb([0.0, [["BlockStored", [3, 4], None, pairs, BS],
                                         kv.encode_event(kv.stored([5, 6], tc, BS))]]))
        self.settle("be", pub)
        self.assertEqual(self.matched(ta)[("be", 0)][0], 2)
        self.assertEqual(self.matched(tc)[("be", 0)][0], 2)
        self.assertNotIn(("be", 0), self.matched(tb))
        self.assertEqual(self.stream("be")["state_drops"], 0)
        # an event whose type cannot be read may have been a removal: the state before it is
        # dropped, what follows it in the batch applies
        pub.publish(msgpack.packb([0.0, [kv.encode_event(kv.stored([7, 8], tb, BS)), None,
                                         kv.encode_event(kv.stored([9, 10], tc, BS))]]))
        self.settle("be", pub)
        self.assertNotIn(("be", 0), self.matched(ta))
        self.assertNotIn(("be", 0), self.matched(tb))
        self.assertEqual(self.matched(tc)[("be", 0)][0], 2)
        s = self.stream("be")
        self.assertEqual((s["undecodable"], s["batches"] >= 3), (0, True), s)
        self.assertEqual((s["bad_events"], s["state_drops"]), (2, 1), s)
        log = self.d.read_log()
        self.assertIn("may have been a removal: state dropped", log)


class TestLoraKeysDynamo(Base):
    """--lora-keys dynamo reaches the stream subscriber: a LoRA's blocks published over ZMQ
    (vLLM positional and map forms, SGLang; continued through a parent; with a salt) get
    the keys Dynamo's router computes (tests/fixtures/hash_vectors.py), the base model's
    stay the standard's."""
    flags = ("--stats-period", "20ms", "--lora-keys", "dynamo")

    def by_keys(self, keys, lora=None):
        body = {"model": "m", "block_hashes": keys}
        if lora is not None:
            body["lora_name"] = lora
        s, ans = self.d.http("POST", "/v1/query", body)
        self.assertEqual(s, 200, ans)
        return sorted((p["pod"], p["matched_blocks"]) for p in ans["pods"])

    def by_tokens(self, toks, lora=None, salt=None):
        body = {"model": "m", "token_ids": toks}
        if lora is not None:
            body["lora_name"] = lora
        if salt is not None:
            body["cache_salt"] = salt
        s, ans = self.d.http("POST", "/v1/query", body)
        self.assertEqual(s, 200, ans)
        return sorted((p["pod"], p["matched_blocks"]) for p in ans["pods"])

    def test_stream_lora_blocks_take_dynamo_keys(self):
        try:
            import hash_vectors as hv
            import xxhash  # noqa: F401
        except ImportError as e:
            self.skipTest("reference keys need xxhash: %s" % e)
        pubs = {}
        for pod, fmt in (("va", "vllm"), ("vm", "vllm"), ("sg", "sglang")):
            pubs[pod] = self.publisher(layout=4 if fmt == "sglang" else 5)
            self.add_engine(pod, pubs[pod], format=fmt)
        enc = {"va": dict(form="array"), "vm": dict(form="map"),
               "sg": dict(engine="sglang", hash_form="int", form="map")}
        for pod, pub in pubs.items():
            self.sync(pod, pub, **enc[pod])
        t = tokens(120, 4)
        # va: LoRA ad-1 in two events through the parent, and the base model; vm: LoRA ad-1
        # salted (vLLM's extra_keys); sg: LoRA ad-2 (SGLang, map events)
        pubs["va"].publish(kv.encode_batch([kv.stored([1, 2], t[:32], BS, lora_name="ad-1"),
                                            kv.stored([3, 4], t[32:], BS, parent=2,
                                                      lora_name="ad-1"),
                                            kv.stored([5, 6, 7, 8], t, BS)], **enc["va"]))
        pubs["vm"].publish(kv.encode_batch([kv.stored([1, 2, 3, 4], t, BS, lora_name="ad-1",
                                                      cache_salt="tenant-a")], **enc["vm"]))
        pubs["sg"].publish(kv.encode_batch([kv.stored([-1, -2, -3], t[:48], BS,
                                                      lora_name="ad-2")], **enc["sg"]))
        for pod, pub in pubs.items():
            self.settle(pod, pub)
        ad1 = hv.hash_seq(t, BS, lora=b"ad-1")[1]
        ad1_salted = hv.hash_seq(t, BS, salt=b"tenant-a", lora=b"ad-1")[1]
        ad2 = hv.hash_seq(t, BS, lora=b"ad-2")[1]
        std = seq_keys(t)
        self.assertEqual(self.by_keys(ad1, "ad-1"), [("va", 4)])
        self.assertEqual(self.by_keys(ad1_salted, "ad-1"), [("vm", 4)])
        self.assertEqual(self.by_keys(ad2, "ad-2"), [("sg", 3)])
        self.assertEqual(self.by_keys(std, "ad-1"), [])
        self.assertEqual(self.by_keys(std), [("va", 4)])  # the base model: the standard
        self.assertEqual(self.by_keys(ad1), [])
        self.assertEqual(self.by_tokens(t, "ad-1"), [("va", 4)])
        self.assertEqual(self.by_tokens(t, "ad-1", "tenant-a"), [("vm", 4)])
        self.assertEqual(self.by_tokens(t, "ad-2"), [("sg", 3)])
        self.assertEqual(self.by_tokens(t), [("va", 4)])
        for pod in pubs:
            s = self.stream(pod)
            self.assertEqual((s["undecodable"], s["bad_events"], s["orphans"]), (0, 0, 0), s)


class TestLimits(Base):
    flags = ("--stats-period", "20ms", "--replay-timeout", "10s", "--replay-hold", "2",
             "--event-max-message", "4KiB")

    def test_too_many_batches_held_fails_the_replay(self):
        pub = self.publisher(replay=False)
        mute, mute_ep = self.mute_replay()
        try:
            self.add_engine("h", pub, replay_endpoint=mute_ep)
            self.sync("h", pub)
            old = tokens(60, 2)
            pub.publish(kv.encode_batch([kv.stored([1, 2], old, BS)]))
            pub.publish(kv.encode_batch([kv.stored([3, 4], tokens(61, 2), BS)]), send=False)
            new = [tokens(62 + i, 1) for i in range(3)]
            for i, t in enumerate(new):  # the first starts the replay; the third overflows
                pub.publish(kv.encode_batch([kv.stored([10 + i], t, BS)]))
            s = self.settle("h", pub)  # long before the 10 s timeout
            self.assertEqual((s["gaps"], s["replays"], s["replay_failures"], s["state_drops"]),
                             (1, 1, 1, 1), s)
            self.assertNotIn(("h", 0), self.matched(old))
            for t in new:  # held and then applied, in order
                self.assertEqual(self.matched(t)[("h", 0)][0], 1)
            self.assertIn("too many live batches held", self.d.read_log())
        finally:
            mute.close(0)

    def test_oversized_message_is_a_gap(self):
        pub = self.publisher(replay=False)
        self.add_engine("big", pub)
        self.sync("big", pub)
        old = tokens(70, 2)
        pub.publish(kv.encode_batch([kv.stored([1, 2], old, BS)]))
        self.settle("big", pub)
        n = 1024 // BS  # 1024 tokens: well over 4 KiB of msgpack
        pub.publish(kv.encode_batch([kv.stored(list(range(100, 100 + n)), tokens(71, n), BS)]))
        big_seq = pub.seq - 1
        t = tokens(72, 1)

        def past_it():  # ZMQ dropped the peer; the SUB reconnects and sees the gap
            pub.publish(kv.encode_batch([kv.stored([9], t, BS)]))
            s = self.stream("big")
            return s if s["last_seq"] > big_seq else None
        s = wait_for(past_it, what="the stream to pass the oversized batch")
        self.assertEqual((s["gaps"], s["state_drops"], s["undecodable"]), (1, 1, 0), s)
        self.assertNotIn(("big", 0), self.matched(old))
        self.assertEqual(self.matched(t)[("big", 0)][0], 1)


class TestPublish(Base):
    flags = ("--stats-period", "20ms", "--publish", "tcp://127.0.0.1:*", "--publish-replay",
             "tcp://127.0.0.1:*", "--publish-buffer", "3")

    def post(self, d, events, pod="A", **extra):
        body = {"pod": pod, "model": "m", "events": events}
        body.update(extra)
        s, a = d.http("POST", "/v1/events", body)
        self.assertEqual(s, 200, a)

    def test_one_kvtierd_subscribes_to_another(self):
        pubinfo = self.d.stats()["publisher"]
        self.assertRegex(pubinfo["endpoint"], r"^tcp://127\.0\.0\.1:\d+$")
        b = fx.Daemon(BIN, "--stats-period", "20ms")
        try:
            s, a = b.http("POST", "/v1/engines", {"pod": "A", "model": "m",
                                                  "endpoint": pubinfo["endpoint"],
                                                  "replay_endpoint": pubinfo["replay_endpoint"],
                                                  "topic": "kv@A@m"})
            self.assertEqual(s, 200, a)

            def stream_b(pod="A"):
                return [x for x in b.stats()["streams"] if x["pod"] == pod][0]

            def joined():
                self.post(self.d, [])
                return stream_b()["last_seq"] is not None
            wait_for(joined, what="kvtierd B to join A's stream")
            t = tokens(30, 4)
            h = [501, 502, 503, 504]
            self.post(self.d, [fx.stored(h, t, bs=BS)], lora_name=None)
            self.post(self.d, [fx.stored([h[0]], [], bs=0, medium="CPU")])
            self.post(self.d, [{"type": "BlockRemoved", "block_hashes": [h[3]]}])

            def b_matched(toks):
                s, ans = b.http("POST", "/v1/query", {"model": "m", "token_ids": toks})
                return {p["pod"]: (p["matched_blocks"], p["gpu"], p["cpu"]) for p in ans["pods"]}
            wait_for(lambda: b_matched(t).get("A") == (3, 3, 0), what="A's events in B")
            st = stream_b()
            self.assertEqual((st["gaps"], st["undecodable"], st["restarts"]), (0, 0, 0), st)
            # pod S from now on (each topic's seqs run on only while one pod posts)
            s, a = b.http("POST", "/v1/engines", {"pod": "S", "model": "m",
                                                  "endpoint": pubinfo["endpoint"],
                                                  "topic": "kv@S@m"})
            self.assertEqual(s, 200, a)

            def s_joined():
                self.post(self.d, [], pod="S")
                return stream_b("S")["last_seq"] is not None
            wait_for(s_joined, what="kvtierd B to join S's stream")
            # a salted prefix stays salted downstream, also an orphan's (a parent nobody knows:
            # its first block is salted); a group kvtier does not index is republished and
            # skipped in B too; an unknown medium and a REMOTE store are not republished
            ts_, to = tokens(31, 2), tokens(34, 2)
            orphan = fx.stored([701, 702], to, bs=BS, parent=999)
            self.post(self.d, [dict(fx.stored([601, 602], ts_, bs=BS), cache_salt="t-1"),
                               dict(orphan, cache_salt="t-2"),
                               dict(fx.stored([603], ts_[:BS], bs=BS), group_idx=1,
                                    kv_cache_spec_kind="sliding_window"),
                               dict(fx.stored([604], ts_[:BS], bs=BS), medium="HBM9"),
                               dict(fx.stored([605], ts_[:BS], bs=BS), locality="REMOTE")],
                      pod="S")
            st = wait_for(lambda: (lambda x: x if x["other_groups"] == 1 else None)(stream_b("S")),
                          what="S's batch in B")
            self.assertEqual((st["unknown_medium"], st["remote"], st["orphans"], st["blocks"]),
                             (0, 0, 1, 4), st)
            self.assertEqual((st["gaps"], st["undecodable"], st["restarts"]), (0, 0, 0), st)
            for toks, salt in ((ts_, "t-1"), (to, "t-2")):
                s, ans = b.http("POST", "/v1/query", {"model": "m",
                                                      "block_hashes": seq_keys(toks, salt)})
                self.assertEqual([(p["pod"], p["matched_blocks"]) for p in ans["pods"]],
                                 [("S", 2)], (salt, ans))
                self.assertNotIn("S", b_matched(toks), salt)
        finally:
            self.assertEqual(b.stop(), 0)
            b.cleanup()

    def live_sub(self):
        """A SUB on kvtierd's publisher that has joined (every message before now read)."""
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.d.stats()["publisher"]["endpoint"])

        def got_one():
            self.post(self.d, [])
            return sub.poll(50) and sub.recv_multipart()
        wait_for(got_one, what="a live message")
        while sub.poll(100):
            sub.recv_multipart()
        return sub

    def test_live_format_and_replay_layout(self):
        pubinfo = self.d.stats()["publisher"]
        sub = self.live_sub()
        try:
            t = tokens(32, 2)
            self.post(self.d, [fx.stored([9, 10], t, bs=BS, parent=None, lora="ad")], dp_rank=2)
            topic, seq, payload = sub.recv_multipart()
            self.assertEqual(topic, b"kv@A@m")
            self.assertEqual(len(seq), 8)
            ts, events, rank = msgpack.unpackb(payload)
            self.assertIsInstance(ts, float)
            self.assertEqual(rank, 2)
            self.assertEqual(events, [["BlockStored", [9, 10], None, t, BS, None, "GPU", "ad"]])
            last = struct.unpack(">Q", seq)[0]
            self.post(self.d, [{"type": "BlockRemoved", "block_hashes": [9], "medium": "CPU"},
                               {"type": "AllBlocksCleared"}])
            topic, seq, payload = sub.recv_multipart()
            self.assertEqual(msgpack.unpackb(payload)[1],
                             [["BlockRemoved", [9], "CPU"], ["AllBlocksCleared"]])
        finally:
            sub.close(0)
        # replay: the last 3 batches (--publish-buffer 3), <= v0.25 layout, then the end marker
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(pubinfo["replay_endpoint"])
        try:
            dealer.send_multipart([b"", struct.pack(">Q", 0)])
            got = []
            while True:
                self.assertTrue(dealer.poll(5000), "no replay answer")
                f = dealer.recv_multipart()
                self.assertEqual(len(f), 3, f)
                self.assertEqual(f[0], b"")
                if f[1] == b"\xff" * 8:
                    self.assertEqual(f[2], b"")
                    break
                got.append(struct.unpack(">Q", f[1])[0])
            self.assertEqual(got, [last - 1, last, last + 1])
            dealer.send_multipart([b"", struct.pack(">Q", last + 1)])
            f = dealer.recv_multipart()
            self.assertEqual(struct.unpack(">Q", f[1])[0], last + 1)
            self.assertEqual(dealer.recv_multipart()[1], b"\xff" * 8)
            dealer.send_multipart([b"", b"short"])  # a bad request: no answer, counted
            self.assertFalse(dealer.poll(300))
        finally:
            dealer.close(0)
        st = wait_for(lambda: (lambda p: p if p["bad_requests"] == 1 else None)(
            self.d.stats()["publisher"]), what="the bad request to be counted")
        self.assertEqual((st["replays"], st["replayed"], st["buffered"]), (2, 4, 3), st)
        samples, _ = fx.parse_prometheus(self.d.http("GET", "/metrics")[1])
        self.assertEqual(samples[("kvtier_publish_replays_total", ())], 2)
        self.assertEqual(samples[("kvtier_publish_batches_total", ())], st["batches"])

    def test_salt_groups_and_skips_as_published(self):
        sub = self.live_sub()
        try:
            t = tokens(33, 2)
            self.post(self.d, [dict(fx.stored([1, 2], t, bs=BS), cache_salt="t-1"),
                               dict(fx.stored([3], t[:BS], bs=BS, parent=2), cache_salt="t-1"),
                               dict(fx.stored([4], t[:BS], bs=BS), group_idx=1,
                                    kv_cache_spec_kind="sliding_window"),
                               dict(fx.stored([5], t[:BS], bs=BS), medium="HBM9"),
                               dict(fx.stored([6], t[:BS], bs=BS), locality="REMOTE"),
                               {"type": "BlockRemoved", "block_hashes": [4], "group_idx": 1}])
            _, _, payload = sub.recv_multipart()
            self.assertEqual(msgpack.unpackb(payload)[1], [
                ["BlockStored", [1, 2], None, t, BS, None, "GPU", None, [["t-1"], None]],
                # with a parent the salt rides past ownership (a subscriber that does not know
                # the parent salts the first block, as the publisher did)
                ["BlockStored", [3], 2, t[:BS], BS, None, "GPU", None, None, None, None, None,
                 None, None, {"cache_salt": "t-1"}],
                ["BlockStored", [4], None, t[:BS], BS, None, "GPU", None, None, 1,
                 "sliding_window"],
                ["BlockRemoved", [4], "GPU", 1]])
        finally:
            sub.close(0)

    def test_remote_binds_need_allow_remote(self):
        p = subprocess.run([BIN, "--http-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
                            "--data-dir", os.path.join(self.d.dir.name, "x"),
                            "--publish", "tcp://*:0"], capture_output=True, text=True, timeout=20)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("needs --allow-remote", p.stderr)
        for flags, msg in [(["--allow-remote", "--publish", "http://x:1"],
                            "--publish: publish endpoint"),
                           (["--publish", "tcp://127.0.0.1:*", "--publish-buffer", "0"],
                            "publish-buffer must be > 0"),
                           (["--replay-hold", "0"], "replay-hold")]:
            p = subprocess.run([BIN, "--http-listen", "127.0.0.1:0", "--rpc-listen",
                                "127.0.0.1:0", "--data-dir", os.path.join(self.d.dir.name, "x"),
                                *flags], capture_output=True, text=True, timeout=20)
            self.assertEqual(p.returncode, 1, (flags, p.stderr))
            self.assertIn(msg, p.stderr)
        s, a = self.d.http("POST", "/v1/engines", {"pod": "w", "model": "m",
                                                   "endpoint": "tcp://*:5557"})
        self.assertEqual(s, 400, a)
        self.assertIn("--allow-remote", a["error"])


class TestApi(Base):
    def test_bad_engines_are_refused(self):
        pub = self.publisher()
        ok = {"pod": "e", "model": "m", "endpoint": pub.endpoint}
        bad = [
            ("{", 400, "offset"),
            ("nope", 400, "must be a JSON object"),
            ('{"pod":"e","model":"m","endpoint":"tcp://h:1","topic":nulm}', 400, "field 'topic'"),
            ([1], 400, "must be a JSON object"),
            ({"model": "m", "endpoint": pub.endpoint}, 400, "'pod'"),
            (dict(ok, pod=""), 400, "'pod' is empty"),
            (dict(ok, pod="x" * 256), 400, "over 255 bytes"),
            (dict(ok, model=None), 400, "'model' must be a string"),
            (dict(ok, endpoint="http://h:1"), 400, "tcp://, ipc:// or inproc://"),
            (dict(ok, endpoint="ipc:///tmp/x", dp_size=2), 400, "needs tcp://host:port"),
            (dict(ok, endpoint="tcp://127.0.0.1:65535", dp_size=2), 400, "passes 65535"),
            (dict(ok, dp_size=0), 400, "'dp_size'"),
            (dict(ok, dp_size=257), 400, "'dp_size'"),
            (dict(ok, format="tgi"), 400, "'format'"),
            (dict(ok, bind="yes"), 400, "'bind'"),
            (dict(ok, extra=1), 400, "unknown field 'extra'"),
            (dict(ok, bind=True), 400, "in use"),  # the publisher holds the port
        ]
        for body, status, msg in bad:
            s, a = self.d.http("POST", "/v1/engines", body)
            self.assertEqual(s, status, (body, a))
            self.assertIn(msg, a["error"], body)
        self.assertEqual(self.d.stats()["streams"], [])
        self.assertEqual(self.d.http("POST", "/v1/engines", ok)[0], 200)
        s, a = self.d.http("POST", "/v1/engines", ok)
        self.assertEqual(s, 409, a)
        self.assertIn("already subscribed", a["error"])
        self.assertEqual(len(self.d.stats()["streams"]), 1)

    def test_cli_subscribe_and_unsubscribe(self):
        cli = os.path.join(os.path.dirname(BIN), "kvtier")
        addr = ["--addr", "127.0.0.1:%d" % self.d.rpc_port]
        pub = self.publisher()
        spec = json.dumps({"pod": "cli", "model": "m", "endpoint": pub.endpoint,
                           "replay_endpoint": pub.replay_endpoint})

        def run(*args, stdin=None):
            return subprocess.run([cli, *args], input=stdin, capture_output=True, text=True,
                                  timeout=20)
        p = run("subscribe", *addr, "-", stdin=spec)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["endpoints"], [pub.endpoint])
        p = run("subscribe", *addr, "-", stdin=spec)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("already subscribed", p.stderr)
        p = run("subscribe", *addr, "-", stdin='{"pod":"x"}')
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("'model'", p.stderr)
        self.assertEqual(run("subscribe", *addr).returncode, 2)
        self.sync("cli", pub)
        t = tokens(50, 1)
        pub.publish(kv.encode_batch([kv.stored([1], t, BS)]))
        self.settle("cli", pub)
        p = run("stats", *addr)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([s["pod"] for s in json.loads(p.stdout)["streams"]], ["cli"])
        p = run("unsubscribe", *addr, "cli")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual((json.loads(p.stdout)["unsubscribed"], json.loads(p.stdout)["entries"]),
                         (True, 1))
        p = run("unsubscribe", *addr, "cli")
        self.assertEqual(p.returncode, 1)
        self.assertIn("unknown pod", p.stderr)
        self.assertEqual(self.d.stats()["streams"], [])

    def test_bad_engine_flag_stops_the_start(self):
        for flag, msg in [('{"pod":"a"}', "field 'model' is missing"), ("nope", "--engine 1"),
                          ('{"pod":"a","model":"m","endpoint":"tcp://*:1","bind":true}',
                           "needs kvtierd --allow-remote")]:
            p = subprocess.run([BIN, "--http-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
                                "--data-dir", os.path.join(self.d.dir.name, "y"), "--engine",
                                flag], capture_output=True, text=True, timeout=20)
            self.assertEqual(p.returncode, 1, (flag, p.stderr))
            self.assertIn(msg, p.stderr)

    def test_delete_unsubscribes_and_drops(self):
        pub = self.publisher()
        self.add_engine("del", pub)
        self.sync("del", pub)
        t = tokens(19, 2)
        pub.publish(kv.encode_batch([kv.stored([1, 2], t, BS)]))
        self.settle("del", pub)
        self.assertIn(("del", 0), self.matched(t))
        s, a = self.d.http("DELETE", "/v1/engines/del")
        self.assertEqual(s, 200, a)
        self.assertEqual((a["unsubscribed"], a["entries"]), (True, 2), a)
        self.assertEqual(self.d.stats()["streams"], [])
        pub.publish(kv.encode_batch([kv.stored([3, 4], t, BS)]))
        time.sleep(0.2)
        self.assertNotIn(("del", 0), self.matched(t), "events after DELETE were applied")
        self.assertEqual(self.d.http("DELETE", "/v1/engines/del")[0], 404)
        # subscribed but never sent anything: DELETE still finds it
        self.add_engine("quiet", self.publisher())
        s, a = self.d.http("DELETE", "/v1/engines/quiet")
        self.assertEqual((s, a["unsubscribed"], a["entries"]), (200, True, 0), a)

    def test_rpc_engine_add_and_metrics(self):
        pub = self.publisher()
        r = self.d.connect()
        body = json.dumps({"pod": "rpc", "model": "m", "endpoint": pub.endpoint,
                           "replay_endpoint": pub.replay_endpoint}).encode()
        r.sendall(fx.frame(OP_ENGINE_ADD, 7, body))
        h, b = fx.read_frame(r)
        self.assertEqual((h["op"], h["req_id"], h["flags"]), (OP_ENGINE_ADD, 7, fx.F_RESPONSE), b)
        self.assertEqual(json.loads(b)["endpoints"], [pub.endpoint])
        r.sendall(fx.frame(OP_ENGINE_ADD, 8, b"{"))
        h, b = fx.read_frame(r)
        self.assertEqual(h["flags"], fx.F_RESPONSE | fx.F_ERROR)
        self.assertEqual(fx.parse_error(b)[1], 400)
        r.close()
        self.sync("rpc", pub)
        pub.publish(kv.encode_batch([kv.stored([1], tokens(20, 1), BS)]))
        pub.publish(kv.encode_batch([kv.stored([2], tokens(21, 1), BS)]), send=False)
        pub.publish(kv.encode_batch([kv.stored([3], tokens(22, 1), BS)]))
        self.settle("rpc", pub)
        time.sleep(0.1)  # one more stats period
        s, text = self.d.http("GET", "/metrics")
        self.assertEqual(s, 200)
        samples, types = fx.parse_prometheus(text)
        lab = (("pod", "rpc"), ("dp_rank", "0"))
        self.assertEqual(samples[("kvtier_streams", ())], 1)
        self.assertEqual(samples[("kvtier_stream_gaps_total", lab)], 1)
        self.assertEqual(samples[("kvtier_stream_replays_total", lab)], 1)
        self.assertEqual(samples[("kvtier_stream_last_seq", lab)], pub.seq - 1)
        self.assertEqual(samples[("kvtier_stream_replaying", lab)], 0)
        self.assertGreaterEqual(samples[("kvtier_stream_batches_total", lab)], 3)
        self.assertEqual(types["kvtier_stream_replay_failures_total"], "counter")
        st = self.d.stats()
        self.assertEqual([e["source"] for e in st["engines"] if e["pod"] == "rpc"], ["zmq"])
        self.assertGreaterEqual(st["events"]["applied"], 3)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_engines.py path/to/kvtierd")
    BIN = sys.argv.pop(1)
    unittest.main(verbosity=2)
