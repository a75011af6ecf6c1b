#!/usr/bin/python3
"""Integration tests of kvtierd: the real daemon on loopback ports in a temp dir.

Usage: test_daemon.py path/to/kvtierd      (exit 77 = skipped)
Feeds events over HTTP and the binary RPC, queries both ways, checks /metrics
parses as Prometheus text, sends every kind of bad input and checks the daemon
still answers with unchanged state, and stops it with SIGTERM.
"""

import json
import os
import re
import signal
import socket
import stat
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
    import xxhash
except ImportError:
    xxhash = None

try:  # Debian's python3-zmq / python3-msgpack: a real ZMQ publisher for the ipc tests
    import zmq
    import kv_events as kv
except ImportError:
    zmq = kv = None

BIN = None
SANITIZED = False  # the binary runs under ASan or TSan (set in main)
SEED = 1337
M64 = (1 << 64) - 1


def seq_keys(tokens, bs, parent=None):
    keys, prev = [], parent
    for i in range(len(tokens) // bs):
        local = xxhash.xxh3_64_intdigest(struct.pack("<%dI" % bs, *tokens[i * bs:(i + 1) * bs]), SEED)
        prev = local if prev is None else xxhash.xxh3_64_intdigest(struct.pack("<QQ", prev, local), SEED)
        keys.append(prev)
    return keys


stored = fx.stored


def wait_stats(d, pred, timeout=5.0):
    end = time.time() + timeout
    while True:
        s = d.stats()
        if pred(s) or time.time() > end:
            return s
        time.sleep(0.05)


TOK = list(range(100, 132))  # 8 blocks of 4


class Base(unittest.TestCase):
    flags = ()
    token = None

    def setUp(self):
        self.d = fx.Daemon(BIN, *self.flags, token=self.token)

    def tearDown(self):
        rc = self.d.stop()
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors) or rc != 0:
            sys.stderr.write("---- kvtierd log ----\n" + self.d.read_log() + "\n")
        self.d.cleanup()
        self.assertEqual(rc, 0, "kvtierd did not exit 0 on SIGTERM")

    def post_events(self, pod, events, model="m", headers=None, **extra):
        body = {"pod": pod, "model": model, "events": events}
        body.update(extra)
        return self.d.http("POST", "/v1/events", body, headers)

    def query(self, tokens=None, model="m", **kw):
        body = {"model": model}
        if tokens is not None:
            body["token_ids"] = tokens
        body.update(kw)
        s, ans = self.d.http("POST", "/v1/query", body)
        self.assertEqual(s, 200, ans)
        return ans

    def matched(self, ans):
        return {(p["pod"], p["dp_rank"]): p["matched_blocks"] for p in ans["pods"]}

    def rpc(self, sock, op, req_id, body=b""):
        sock.sendall(fx.frame(op, req_id, body))
        return fx.read_frame(sock)


class TestApi(Base):
    def test_healthz_and_unknown_model(self):
        self.assertEqual(self.d.http("GET", "/healthz"), (200, {"status": "ok"}))
        ans = self.query(TOK, model="nobody")
        self.assertEqual(ans, {"block_size": 16, "num_blocks": 2, "pods": []})

    def test_store_query_remove_clear(self):
        s, a = self.post_events("A", [stored([1, 2, 3, 4], TOK[:16])])
        self.assertEqual(s, 200, a)
        self.assertEqual(a["applied"], 1)
        self.assertEqual(a["blocks"], 4)
        s, a = self.post_events("B", [stored([11, 12], TOK[:8])], dp_rank=1)
        self.assertEqual(s, 200, a)
        ans = self.query(TOK)
        self.assertEqual(ans["block_size"], 4)
        self.assertEqual(ans["num_blocks"], 8)
        self.assertEqual(self.matched(ans), {("A", 0): 4, ("B", 1): 2})
        self.assertEqual(ans["pods"][0]["pod"], "A", "best first")
        self.assertEqual(ans["pods"][0]["gpu"], 4)
        self.assertGreater(ans["pods"][0]["score"], ans["pods"][1]["score"])
        # the same answer by sequence keys computed independently (python3-xxhash)
        if xxhash is not None:
            ans2 = self.query(None, block_hashes=seq_keys(TOK, 4))
            self.assertEqual(self.matched(ans2), self.matched(ans))
        # pod filter
        self.assertEqual(self.matched(self.query(TOK, pods=["B"])), {("B", 1): 2})
        self.assertEqual(self.query(TOK, pods=["nope"])["pods"], [])
        # a parent continues the chain from the parent's key
        s, a = self.post_events("A", [stored([5, 6], TOK[16:24], parent=4)])
        self.assertEqual((s, a["orphans"]), (200, 0))
        self.assertEqual(self.matched(self.query(TOK))[("A", 0)], 6)
        # CPU placeholder for known hashes (no tokens), one unknown
        s, a = self.post_events("A", [{"type": "BlockStored", "block_hashes": [1, 2, 99],
                                       "token_ids": [], "block_size": 0, "medium": "CPU"}])
        self.assertEqual((s, a["unresolved"]), (200, 1))
        # removal from GPU: blocks 1,2 stay in CPU, the run continues through them
        s, a = self.post_events("A", [{"type": "BlockRemoved", "block_hashes": [1, 2]}])
        self.assertEqual(s, 200, a)
        p = [x for x in self.query(TOK)["pods"] if x["pod"] == "A"][0]
        self.assertEqual((p["matched_blocks"], p["gpu"], p["cpu"]), (6, 4, 2))
        # a score with a fraction (CPU weight 0.8) reads back exactly
        self.assertEqual(p["score"], 4 * 1.0 + 2 * 0.8 + 0 * 0.5)
        # removing block 3 cuts the run at 2
        self.post_events("A", [{"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"}])
        self.assertEqual(self.matched(self.query(TOK))[("A", 0)], 2)
        # AllBlocksCleared drops the GPU tier only
        self.post_events("A", [{"type": "AllBlocksCleared"}])
        p = [x for x in self.query(TOK)["pods"] if x["pod"] == "A"][0]
        self.assertEqual((p["matched_blocks"], p["gpu"], p["cpu"]), (2, 0, 2))
        self.assertEqual(p["score"], 0 * 1.0 + 2 * 0.8 + 0 * 0.5)
        st = wait_stats(self.d, lambda s: s["events"]["batches"] >= 7)
        self.assertEqual(st["events"]["batches"], 7)
        self.assertEqual(st["index"]["pods"], 2)
        # per-tier usage: B's two GPU blocks, A's blocks 1 and 2 left in CPU
        self.assertEqual(st["index"]["tiers"], {"gpu": 2, "cpu": 2, "disk": 0})
        self.assertEqual(st["index"]["entries"], 4)

    def test_lora_is_a_separate_namespace(self):
        self.post_events("A", [stored([1, 2], TOK[:8], lora="ad1")])
        self.assertEqual(self.query(TOK)["pods"], [])
        self.assertEqual(self.matched(self.query(TOK, lora_name="ad1")), {("A", 0): 2})

    def test_drop_engine(self):
        self.post_events("A", [stored([1, 2], TOK[:8])])
        self.post_events("A", [stored([1, 2], TOK[:8])], dp_rank=3)
        self.assertEqual(len(self.query(TOK)["pods"]), 2)
        s, a = self.d.http("DELETE", "/v1/engines/A")
        self.assertEqual(s, 200, a)
        self.assertEqual((a["pod"], a["dp_ranks"], a["entries"]), ("A", 2, 4))
        self.assertEqual(self.query(TOK)["pods"], [])
        s, a = self.d.http("DELETE", "/v1/engines/A")
        self.assertEqual(s, 404, a)
        self.assertIn("error", a)

    def test_drop_model(self):
        self.post_events("A", [stored([1, 2], TOK[:8])])
        self.post_events("A", [stored([11, 12], TOK[:8], lora="ad")])  # LoRAs hash apart
        self.post_events("B", [stored([1, 2, 3], TOK[:12])], model="org/model-2")
        st = wait_stats(self.d, lambda s: s["index"]["namespaces"] == 3)
        self.assertEqual(st["index"]["namespaces"], 3, st)
        s, a = self.d.http("DELETE", "/v1/models/m")
        self.assertEqual(s, 200, a)
        self.assertEqual(a, {"model": "m", "namespaces": 2, "blocks": 4})
        self.assertEqual(self.query(TOK)["pods"], [])
        self.assertEqual(self.query(TOK, lora_name="ad")["pods"], [])
        self.assertEqual(self.matched(self.query(TOK, model="org/model-2")), {("B", 0): 3})
        self.assertEqual(self.d.http("DELETE", "/v1/models/m")[0], 404)
        # a model name with '/' is sent escaped; a raw '/' is another path
        self.assertEqual(self.d.http("DELETE", "/v1/models/org/model-2")[0], 404)
        s, a = self.d.http("DELETE", "/v1/models/org%2Fmodel-2")
        self.assertEqual((s, a.get("blocks")), (200, 3), a)
        self.assertEqual(self.query(TOK, model="org/model-2")["pods"], [])
        for bad in ("/v1/models/", "/v1/models/%zz", "/v1/models/a%00b"):
            s, a = self.d.http("DELETE", bad)
            self.assertEqual(s, 400, (bad, a))
        self.assertEqual(self.d.http("GET", "/v1/models/x")[0], 405)
        # the model can be reported again, with another block size even
        self.assertEqual(self.post_events("A", [stored([1], TOK[:8], bs=8)])[0], 200)
        self.assertEqual(self.matched(self.query(TOK)), {("A", 0): 1})
        st = wait_stats(self.d, lambda s: s["index"]["namespaces"] == 1)
        self.assertEqual(st["index"]["namespaces"], 1, st)
        # over the RPC too
        r = self.d.connect()
        r.sendall(fx.frame(0x23, 7, fx.pstr("m")))
        h, b = fx.read_frame(r)
        self.assertEqual((h["req_id"], json.loads(b)["namespaces"]), (7, 1))
        r.sendall(fx.frame(0x23, 8, fx.pstr("m")))
        h, b = fx.read_frame(r)
        self.assertEqual(fx.parse_error(b)[1], 404)
        r.sendall(fx.frame(0x23, 9, fx.pstr("")))
        h, b = fx.read_frame(r)
        self.assertEqual(fx.parse_error(b)[1], 400)
        r.close()

    def test_metrics_parse(self):
        self.post_events("pod\"x", [stored([1, 2], TOK[:8])])
        # the answer carries the name escaped once by the registry
        self.assertEqual([p["pod"] for p in self.query(TOK)["pods"]], ['pod"x'])
        wait_stats(self.d, lambda s: s["index"]["entries"] == 2)
        s, text, hdrs = self.d.http("GET", "/metrics", raw=True)
        self.assertEqual(s, 200)
        self.assertTrue(hdrs["Content-Type"].startswith("text/plain; version=0.0.4"))
        samples, types = fx.parse_prometheus(text.decode())
        self.assertEqual(samples[("kvtier_index_entries", ())], 2)
        self.assertEqual(samples[("kvtier_index_tier_entries", (("tier", "gpu"),))], 2)
        self.assertEqual(samples[("kvtier_index_tier_entries", (("tier", "cpu"),))], 0)
        self.assertEqual(samples[("kvtier_pod_entries", (("pod", 'pod\\"x'), ("dp_rank", "0")))], 2)
        self.assertEqual(types["kvtier_request_duration_seconds"], "histogram")
        q = (("proto", "http"), ("call", "query"), ("code", "2xx"))
        self.assertGreaterEqual(samples[("kvtier_requests_total", q)], 1)
        inf = samples[("kvtier_request_duration_seconds_bucket",
                       (("proto", "http"), ("call", "query"), ("le", "+Inf")))]
        self.assertEqual(inf, samples[("kvtier_request_duration_seconds_count",
                                       (("proto", "http"), ("call", "query")))])
        # kvtier's own, and the process figures under the names Prometheus clients use
        process = {"process_resident_memory_bytes", "process_open_fds", "process_max_fds",
                   "process_cpu_seconds_total", "process_start_time_seconds"}
        for name, t in types.items():
            self.assertTrue(name.startswith("kvtier_") or name in process, name)
        self.assertTrue(process <= set(types), process - set(types))

    def test_expect_continue_and_keep_alive_pipelining(self):
        body = json.dumps({"model": "m", "token_ids": TOK}).encode()
        s = self.d.connect(self.d.http_port)
        s.sendall(b"POST /v1/query HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
                  % len(body))
        self.assertEqual(s.recv(4096), b"HTTP/1.1 100 Continue\r\n\r\n")
        # the body, then two more requests in the same write: three answers, in order
        s.sendall(body + b"GET /healthz HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 3:
            chunk = s.recv(65536)
            self.assertTrue(chunk, "connection closed early: %r" % data)
            data += chunk
        self.assertEqual(re.findall(rb"HTTP/1\.1 (\d{3}) ", data), [b"200", b"200", b"404"])
        s.close()

    def test_not_implemented_yet(self):
        # without --ram-bytes: no tiers, and so no transfers
        for m, p in [("GET", "/v1/blocks/1"), ("POST", "/v1/prefetch"), ("POST", "/v1/transfer")]:
            s, a = self.d.http(m, p, {})
            self.assertEqual(s, 501, (m, p, a))


class TestRpc(Base):
    def test_query_events_stats_pipelining(self):
        s = self.d.connect()
        h, b = self.rpc(s, fx.OP_HELLO, 1, struct.pack("<I", 1) + fx.pstr(""))
        self.assertEqual((h["flags"], h["req_id"]), (fx.F_RESPONSE, 1))
        self.assertEqual(struct.unpack("<II", b)[0], 1)
        ev = json.dumps({"pod": "R", "model": "m", "events": [stored([7, 8, 9], TOK[:12])]})
        h, b = self.rpc(s, fx.OP_EVENTS, 2, ev.encode())
        self.assertEqual(h["flags"], fx.F_RESPONSE, b)
        self.assertEqual(json.loads(b)["applied"], 1)
        h, b = self.rpc(s, fx.OP_QUERY, 3, fx.query_body("m", tokens=TOK))
        self.assertEqual((h["req_id"], h["flags"]), (3, fx.F_RESPONSE))
        ans = fx.parse_query_answer(b)
        http_ans = self.query(TOK)
        self.assertEqual(ans["pods"], http_ans["pods"])
        self.assertEqual((ans["block_size"], ans["num_blocks"]), (4, 8))
        if xxhash is not None:
            h, b = self.rpc(s, fx.OP_QUERY, 4, fx.query_body("m", keys=seq_keys(TOK, 4)))
            self.assertEqual(fx.parse_query_answer(b)["pods"], ans["pods"])
        # pipelining: 100 requests in one write, answers matched by id
        burst = b"".join(fx.frame(fx.OP_QUERY, 1000 + i, fx.query_body("m", tokens=TOK))
                         for i in range(100))
        s.sendall(burst + fx.frame(fx.OP_PING, 5000))
        ids = set()
        for _ in range(101):
            h, b = fx.read_frame(s)
            ids.add(h["req_id"])
            if h["op"] == fx.OP_QUERY:
                self.assertEqual(fx.parse_query_answer(b)["pods"], ans["pods"])
        self.assertEqual(ids, set(range(1000, 1100)) | {5000})
        # stats are a snapshot republished every --stats-period: ask until it shows the pod
        end = time.time() + 5.0
        while True:
            h, b = self.rpc(s, fx.OP_STATS, 6)
            self.assertEqual((h["req_id"], h["flags"]), (6, fx.F_RESPONSE))
            if json.loads(b)["index"]["pods"] == 1 or time.time() > end:
                break
            time.sleep(0.05)
        self.assertEqual(json.loads(b)["index"]["pods"], 1)
        h, b = self.rpc(s, fx.OP_ENGINE_DROP, 7, fx.pstr("R"))
        self.assertEqual(json.loads(b)["dp_ranks"], 1)
        s.close()

    def test_large_pipelined_burst(self):
        # ~6 MiB of queries in flight on one connection: more than the daemon reads per
        # callback (256 KiB) and than it buffers for output (--conn-buffer), so reads
        # pause and resume while the client is still writing; every answer arrives once
        import threading
        long_tok = [(i * 7919) % 50000 for i in range(1024)]
        self.post_events("B", [stored(list(range(1, 257)), long_tok)])
        s = self.d.connect()
        h, b = self.rpc(s, fx.OP_QUERY, 1, fx.query_body("m", tokens=long_tok))
        want = fx.parse_query_answer(b)["pods"]
        self.assertEqual([p["pod"] for p in want], ["B"])
        n = 1500
        burst = b"".join(fx.frame(fx.OP_QUERY, 10 + i, fx.query_body("m", tokens=long_tok))
                         for i in range(n))
        sender = threading.Thread(target=s.sendall, args=(burst,))
        sender.start()
        seen = []
        for _ in range(n):
            h, b = fx.read_frame(s)
            self.assertEqual(h["flags"], fx.F_RESPONSE, b)
            self.assertEqual(fx.parse_query_answer(b)["pods"], want)
            seen.append(h["req_id"])
        sender.join()
        self.assertEqual(sorted(seen), list(range(10, 10 + n)))  # each once, matched by id
        s.close()


class TestRouted(Base):
    """POST /v1/routed and RPC ROUTED: a router's decision as speculative entries."""

    def routed(self, body, want=200):
        s, a = self.d.http("POST", "/v1/routed", body)
        self.assertEqual(s, want, (body, a))
        return a

    def spec(self, pred):
        return wait_stats(self.d, lambda s: pred(s["index"]["speculative"]))["index"]["speculative"]

    def test_routed_ranks_expires_and_is_replaced(self):
        self.post_events("A", [stored([1, 2], TOK[:8])])
        self.assertEqual(self.query(TOK)["pods"][0]["pod"], "A")
        # the router sent the whole prompt to B: B is first for it before B's events come
        self.assertEqual(self.routed({"model": "m", "token_ids": TOK, "pod": "B", "ttl_ms": 800}),
                         {"blocks": 8})
        top = self.query(TOK)["pods"][0]
        self.assertEqual((top["pod"], top["dp_rank"], top["matched_blocks"], top["gpu"]),
                         ("B", 0, 8, 8))
        self.assertEqual(self.spec(lambda n: n == 8), 8)
        # B's own events for the same blocks replace the speculative entries: they outlive the TTL
        self.post_events("B", [stored([21, 22, 23, 24, 25, 26, 27, 28], TOK)])
        self.assertEqual(self.spec(lambda n: n == 0), 0)
        time.sleep(1.0)
        self.assertEqual(self.matched(self.query(TOK))[("B", 0)], 8)
        # an unconfirmed decision expires after its TTL (polled)
        other = list(range(500, 516))
        self.routed({"model": "m", "token_ids": other, "pod": "C", "dp_rank": 3, "ttl_ms": 300})
        self.assertEqual(self.matched(self.query(other)), {("C", 3): 4})
        end = time.time() + 10
        while self.query(other)["pods"] and time.time() < end:
            time.sleep(0.05)
        self.assertEqual(self.query(other)["pods"], [])
        self.assertEqual(self.spec(lambda n: n == 0), 0)
        # a cache salt keys the blocks as a salted query does; block_hashes are keys as they are
        self.routed({"model": "m", "token_ids": other, "pod": "C", "cache_salt": "t1"})
        self.assertEqual(self.query(other)["pods"], [])
        self.assertEqual(self.matched(self.query(other, cache_salt="t1")), {("C", 0): 4})
        # a model no engine reported yet: nothing marked (its block size is not known yet)
        self.assertEqual(self.routed({"model": "m2", "block_hashes": [7, 8, 9], "pod": "D"}),
                         {"blocks": 0})
        self.assertEqual(self.query(None, model="m2", block_hashes=[7, 8, 9])["pods"], [])
        self.post_events("Z", [stored([1], TOK[:4])], model="m2")
        self.assertEqual(self.routed({"model": "m2", "block_hashes": [7, 8, 9], "pod": "D"}),
                         {"blocks": 3})
        self.assertEqual(self.matched(self.query(None, model="m2", block_hashes=[7, 8, 9])),
                         {("D", 0): 3})
        # shorter than a block: nothing marked
        self.assertEqual(self.routed({"model": "m", "token_ids": [1, 2], "pod": "E"}),
                         {"blocks": 0})
        if xxhash is not None:  # the keys the server hashed are the standard's
            keys = seq_keys(other, 4)
            self.assertEqual(self.matched(self.query(None, block_hashes=keys)), {})
            self.routed({"model": "m", "block_hashes": keys[:2], "pod": "F"})
            self.assertEqual(self.matched(self.query(other)), {("F", 0): 2})

    def test_routed_over_rpc(self):
        self.post_events("A", [stored([1], TOK[:4])])
        r = self.d.connect()
        body = json.dumps({"model": "m", "block_hashes": [31, 32], "pod": "R"}).encode()
        h, b = self.rpc(r, fx.OP_ROUTED, 5, body)
        self.assertEqual((h["req_id"], h["flags"]), (5, fx.F_RESPONSE), b)
        self.assertEqual(json.loads(b), {"blocks": 2})
        self.assertEqual(self.matched(self.query(None, block_hashes=[31, 32])), {("R", 0): 2})
        h, b = self.rpc(r, fx.OP_ROUTED, 6, b'{"model":"m","block_hashes":[1]}')
        self.assertTrue(h["flags"] & fx.F_ERROR)
        self.assertEqual(fx.parse_error(b)[1], 400)
        r.close()

    def test_bad_routed_bodies_change_nothing(self):
        self.post_events("A", [stored([1, 2], TOK[:8])])
        wait_stats(self.d, lambda s: s["index"]["entries"] == 2)
        before = (wait_stats(self.d, lambda s: True)["index"], self.query(TOK))
        bad = [
            {"model": "m", "token_ids": TOK},  # no pod
            {"model": "m", "token_ids": TOK, "pod": ""},
            {"model": "m", "token_ids": TOK, "block_hashes": [1], "pod": "B"},
            {"model": "m", "pod": "B"},
            {"model": "m", "token_ids": TOK, "pod": "B", "ttl_ms": 60001},
            {"model": "m", "token_ids": TOK, "pod": "B", "ttl_ms": 0},
            {"model": "m", "token_ids": TOK, "pod": "B", "ttl_ms": -1},
            {"model": "m", "token_ids": TOK, "pod": "B", "ttl_ms": "2000"},
            {"model": "m", "token_ids": TOK, "pod": "B", "dp_rank": 256},
            {"model": "m", "token_ids": TOK, "pod": "B", "pods": ["B"]},
            {"model": "m", "block_hashes": [1], "pod": "B", "cache_salt": "s"},
            {"token_ids": TOK, "pod": "B"},
            {"model": "m", "token_ids": TOK, "pod": 5},
        ]
        for body in bad:
            a = self.routed(body, 400)
            self.assertTrue(a.get("error"), (body, a))
        for raw in ('{"model":"m","token_ids":[1],"pod":"B","pod":"C"}', "{broken", ""):
            self.assertEqual(self.d.http("POST", "/v1/routed", raw)[0], 400, raw)
        self.assertEqual(self.d.http("GET", "/v1/routed")[0], 405)
        time.sleep(0.1)
        after = (wait_stats(self.d, lambda s: True)["index"], self.query(TOK))
        self.assertEqual(after, before)


class TestBadInput(Base):
    flags = ("--max-body", "64KiB", "--max-header", "2KiB")

    def snapshot(self):
        st = wait_stats(self.d, lambda s: True)
        return st["index"], self.query(TOK)

    def test_everything_bad_changes_nothing(self):
        self.post_events("A", [stored([1, 2, 3], TOK[:12])])
        wait_stats(self.d, lambda s: s["index"]["entries"] == 3)
        before = self.snapshot()
        bad_http = [
            ("POST", "/v1/events", "{not json", 400),
            ("POST", "/v1/events", '{"pod":"A","model":"m","events":[{"type":"BlockStored",'
                                   '"block_hashes":[5],"token_ids":[1,2,3],"block_size":4}]}', 400),
            ("POST", "/v1/events", '{"pod":"A","model":"m","events":[{"type":"BlockStored",'
                                   '"block_hashes":[5],"token_ids":[1,2,3,4,5,6,7,8],'
                                   '"block_size":8}]}', 400),  # block size differs from the model's
            ("POST", "/v1/events", '{"pod":"A","model":"m","events":[],"bogus":1}', 400),
            ("POST", "/v1/events", '{"pod":5,"model":"m","events":[]}', 400),
            ("POST", "/v1/events", '{"pod":"A","model":"m","events":{}}', 400),
            ("POST", "/v1/events", '{"pod":"","model":"m","events":[]}', 400),
            ("POST", "/v1/events", '{"pod":"A","model":"m","events":[{"type":"BlockStored",'
                                   '"block_hashes":[5],"token_ids":[1,2,3,4],"block_size":4,'
                                   '"extra_keys":[null,null]}]}', 400),  # one entry per block
            ("POST", "/v1/events", '{"pod":"A","model":"m","dp_rank":256,"events":[]}', 400),
            ("POST", "/v1/events", '{"pod":"A","model":"m","events":[{"type":"BlockStored",'
                                   '"block_hashes":[18446744073709551616],"token_ids":[]}]}', 400),
            ("POST", "/v1/events", '{"pod":"A","model":"m","events":[]} trailing', 400),
            ("POST", "/v1/query", '{"model":"m","token_ids":[1,-2]}', 400),
            ("POST", "/v1/query", '{"model":"m","token_ids":[1],"block_hashes":[1]}', 400),
            ("POST", "/v1/query", '{"model":"m","tokens":[1]}', 400),
            ("POST", "/v1/query", '{"token_ids":[1]}', 400),
            ("POST", "/v1/query", '[1,2]', 400),
            ("POST", "/v1/query", '', 400),
            ("GET", "/v1/query", None, 405),
            ("POST", "/healthz", "{}", 405),
            ("GET", "/nope", None, 404),
            ("POST", "/v1/events", "x" * 70000, 413),
        ]
        for m, p, body, want in bad_http:
            s, a = self.d.http(m, p, body)
            self.assertEqual(s, want, (m, p, body[:80] if body else body, a))
            self.assertIsInstance(a, dict, a)
            self.assertIn("error", a)
            self.assertTrue(a["error"])
        # raw HTTP garbage
        raw = [
            (b"GARBAGE\r\n\r\n", b" 400 "),
            (b"GET /healthz HTTP/2.0\r\n\r\n", b" 505 "),
            (b"POST /v1/events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b" 501 "),
            (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 3000 + b"\r\n\r\n", b" 431 "),
            (b"GET /healthz HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", b" 400 "),
            (b"GET /healthz HTTP/1.1\r\n folded: x\r\n\r\n", b" 400 "),
        ]
        for req, want in raw:
            s = self.d.connect(self.d.http_port)
            s.sendall(req)
            data = s.recv(4096)
            self.assertIn(want, data.split(b"\r\n")[0], (req[:60], data[:100]))
            s.close()
        # binary RPC garbage: connection-fatal header errors get one error frame, then close
        for blob in [b"\x00" * 24, fx.frame(fx.OP_PING, 9, magic=0x12345678),
                     fx.frame(fx.OP_PING, 9, version=7), fx.frame(fx.OP_PING, 9, reserved=1),
                     fx.frame(fx.OP_PING, 9, flags=0x80),
                     fx.frame(fx.OP_EVENTS, 9, body_len=1 << 30)]:
            s = self.d.connect()
            s.sendall(blob)
            h, b = fx.read_frame(s)
            self.assertTrue(h["flags"] & fx.F_ERROR)
            st, http_st, msg = fx.parse_error(b)
            self.assertLess(st, 0)
            self.assertIn(http_st, (400, 413))
            self.assertTrue(msg)
            self.assertEqual(s.recv(1), b"", "connection must close after a bad header")
            s.close()
        # per-request errors keep the connection usable
        s = self.d.connect()
        for i, (op, body) in enumerate([
                (fx.OP_QUERY, b"\x01"),
                (fx.OP_QUERY, fx.query_body("m", tokens=[1]) + b"x"),
                (fx.OP_EVENTS, b"{broken"),
                (fx.OP_ENGINE_DROP, b"\x05\x00ab"),
                (0x7f, b""),
                (fx.OP_HELLO, b"\x01")]):
            s.sendall(fx.frame(op, 100 + i, body))
            h, b = fx.read_frame(s)
            self.assertEqual(h["req_id"], 100 + i)
            self.assertTrue(h["flags"] & fx.F_ERROR, (op, b))
        s.sendall(fx.frame(fx.OP_PING, 200))
        h, b = fx.read_frame(s)
        self.assertEqual((h["req_id"], h["flags"], b), (200, fx.F_RESPONSE, b""))
        # a truncated frame followed by a close is harmless
        s.sendall(fx.frame(fx.OP_QUERY, 300, fx.query_body("m", tokens=TOK))[:30])
        s.close()
        self.assertTrue(self.d.alive())
        self.assertEqual(self.snapshot(), before)


class TestLimits(Base):
    flags = ("--request-timeout", "400ms", "--max-connections", "6", "--max-query-tokens", "64")

    def test_query_token_limit_same_words(self):
        # over --max-query-tokens: 413 over HTTP, TOO_BIG over RPC, the same message
        s, a = self.d.http("POST", "/v1/query", json.dumps({"model": "m", "token_ids": [1] * 65}))
        self.assertEqual(s, 413, a)
        self.assertIn("more than 64 tokens or keys in one query", a["error"])
        r = self.d.connect()
        r.sendall(fx.frame(fx.OP_QUERY, 9, fx.query_body("m", tokens=[1] * 65)))
        h, b = fx.read_frame(r)
        self.assertEqual((h["req_id"], h["flags"] & fx.F_ERROR), (9, fx.F_ERROR))
        st, http_status, msg = fx.parse_error(b)
        self.assertEqual(http_status, 413)
        self.assertIn("more than 64 tokens or keys in one query", msg)
        r.close()
        self.assertEqual(self.query([1] * 64)["num_blocks"], 4)  # at the limit: answered

    def test_slow_clients_time_out(self):
        s = self.d.connect(self.d.http_port)
        s.sendall(b"POST /v1/query HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"mo")
        time.sleep(1.0)
        data = s.recv(4096)
        self.assertIn(b" 408 ", data.split(b"\r\n")[0])
        s.close()
        s = self.d.connect(self.d.http_port)
        s.sendall(b"POST /v1/query HTT")  # a stalled head
        time.sleep(1.0)
        self.assertIn(b" 408 ", s.recv(4096).split(b"\r\n")[0])
        s.close()
        r = self.d.connect()
        r.sendall(fx.frame(fx.OP_PING, 1)[:10])
        time.sleep(1.0)
        self.assertEqual(r.recv(1), b"", "a stalled RPC frame must be dropped")
        r.close()
        # a whole frame is answered; the partial one after it still runs out of time
        r = self.d.connect()
        r.sendall(fx.frame(fx.OP_PING, 2) + fx.frame(fx.OP_QUERY, 3, b"x" * 64)[:40])
        h, _ = fx.read_frame(r)
        self.assertEqual(h["req_id"], 2)
        time.sleep(1.0)
        self.assertEqual(r.recv(1), b"", "a stalled RPC body must be dropped")
        r.close()
        self.assertEqual(self.d.http("GET", "/healthz")[0], 200)


class TestIdle(Base):
    flags = ("--idle-timeout", "500ms")

    def test_idle_connections_close_and_half_close_is_answered(self):
        idle = self.d.connect(self.d.http_port)
        idle_rpc = self.d.connect()
        busy = self.d.connect(self.d.http_port)
        # a connection that keeps talking outlives the idle timeout
        for _ in range(4):
            busy.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertIn(b" 200 ", busy.recv(4096))
            time.sleep(0.3)
        idle.settimeout(5)
        idle_rpc.settimeout(5)
        self.assertEqual(idle.recv(1), b"", "an idle HTTP connection must be closed")
        self.assertEqual(idle_rpc.recv(1), b"", "an idle RPC connection must be closed")
        busy.close()
        # a request followed by the client's FIN is answered, then the connection closes
        h = self.d.connect(self.d.http_port)
        h.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        h.shutdown(socket.SHUT_WR)
        h.settimeout(5)
        data = b""
        while True:
            chunk = h.recv(4096)
            if not chunk:
                break
            data += chunk
        self.assertIn(b" 200 ", data.split(b"\r\n")[0])
        h.close()
        r = self.d.connect()
        r.sendall(fx.frame(fx.OP_PING, 5))
        r.shutdown(socket.SHUT_WR)
        h, _ = fx.read_frame(r)
        self.assertEqual(h["req_id"], 5)
        r.close()
        samples, _ = fx.parse_prometheus(self.d.http("GET", "/metrics", raw=True)[1].decode())
        timeouts = sum(v for (name, labels), v in samples.items()
                       if name == "kvtier_request_timeouts_total")
        self.assertGreaterEqual(timeouts, 2)


class TestAuth(Base):
    token = "s3cret"

    def test_token_required_for_writes(self):
        ev = [stored([1], TOK[:4])]
        self.assertEqual(self.post_events("A", ev)[0], 401)
        self.assertEqual(self.post_events("A", ev, headers={"Authorization": "Bearer nope"})[0], 401)
        self.assertEqual(self.d.http("DELETE", "/v1/engines/A")[0], 401)
        self.assertEqual(self.d.http("DELETE", "/v1/models/m")[0], 401)
        routed = {"model": "m", "token_ids": TOK, "pod": "C"}
        self.assertEqual(self.d.http("POST", "/v1/routed", routed)[0], 401)
        s, a = self.post_events("A", ev, headers={"Authorization": "Bearer s3cret"})
        self.assertEqual(s, 200, a)
        self.assertEqual(len(self.query(TOK)["pods"]), 1)  # reads need no token
        s, a = self.d.http("POST", "/v1/routed", routed, {"Authorization": "Bearer s3cret"})
        self.assertEqual((s, a), (200, {"blocks": 8}))
        self.assertEqual(self.matched(self.query(TOK)), {("A", 0): 1, ("C", 0): 8})
        r = self.d.connect()
        body = json.dumps({"pod": "B", "model": "m", "events": ev}).encode()
        r.sendall(fx.frame(fx.OP_EVENTS, 1, body))
        h, b = fx.read_frame(r)
        self.assertEqual(fx.parse_error(b)[1], 401)
        r.sendall(fx.frame(fx.OP_ROUTED, 9, json.dumps(routed).encode()))
        h, b = fx.read_frame(r)
        self.assertEqual(fx.parse_error(b)[1], 401)
        r.sendall(fx.frame(fx.OP_HELLO, 2, struct.pack("<I", 1) + fx.pstr("wrong")))
        h, b = fx.read_frame(r)
        self.assertEqual(fx.parse_error(b)[1], 401)
        r.sendall(fx.frame(fx.OP_HELLO, 3, struct.pack("<I", 1) + fx.pstr("s3cret")))
        h, b = fx.read_frame(r)
        self.assertEqual(h["flags"], fx.F_RESPONSE)
        r.sendall(fx.frame(fx.OP_EVENTS, 4, body))
        h, b = fx.read_frame(r)
        self.assertEqual(json.loads(b)["applied"], 1)
        r.close()


def recv_all(sock, timeout=10.0):
    """Everything @sock sends until it closes (bounded by @timeout)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def http_answers(sock, n, timeout=30.0):
    """Reads @n pipelined HTTP answers from @sock: [(status, body bytes)], in order."""
    sock.settimeout(timeout)
    buf, out = b"", []
    while len(out) < n:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed after %d of %d answers" % (len(out), n))
            buf += chunk
            continue
        head = buf[:end].decode("latin-1").split("\r\n")
        length = [int(h.split(":", 1)[1]) for h in head if h.lower().startswith("content-length:")]
        assert len(length) == 1, head
        while len(buf) < end + 4 + length[0]:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed inside answer %d" % len(out))
            buf += chunk
        out.append((int(head[0].split()[1]), buf[end + 4:end + 4 + length[0]]))
        buf = buf[end + 4 + length[0]:]
    return out


def metric(d, name, labels=()):
    samples, _ = fx.parse_prometheus(d.http("GET", "/metrics", raw=True)[1].decode())
    return samples.get((name, tuple(labels)), 0)


class Flood(Base):
    def flood(self, bodies):
        """Sends every EVENTS body pipelined on one RPC connection; returns the index of the
        first refusal (its error says the budget) or None."""
        r = self.d.connect(timeout=60)
        try:
            r.sendall(b"".join(fx.frame(fx.OP_EVENTS, i + 1, json.dumps(b).encode())
                               for i, b in enumerate(bodies)))
            first = None
            for _ in bodies:
                h, b = fx.read_frame(r)
                if h["flags"] & fx.F_ERROR:
                    st, http_status, msg = fx.parse_error(b)
                    self.assertEqual(http_status, 503, msg)
                    self.assertIn("no space", msg.lower())
                    if first is None or h["req_id"] - 1 < first:
                        first = h["req_id"] - 1
        finally:
            r.close()
        return first


NAME = "x" * 200


def empty_pod(i, model="m"):
    """An EVENTS body for a pod that holds nothing (a removal registers it)."""
    return {"pod": "%s-%06d" % (NAME, i), "model": model,
            "events": [{"type": "BlockRemoved", "block_hashes": [1]}]}


class TestFloods(Flood):
    """A flood of names (pods, models) fills the budget and is refused with a reason; dropping
    models gives the room back without a restart. Nothing is forgotten here, so the outcome
    does not hang on how fast the daemon runs (sanitizers make it 10x slower)."""
    flags = ("--index-budget", "2MiB", "--forget-idle", "0", "--stats-period", "20ms")

    def test_pods_and_models_flood(self):
        first = self.flood([empty_pod(i) for i in range(10000)])
        self.assertIsNotNone(first, "no pod was refused")
        self.assertGreater(first, 100)
        st = wait_stats(self.d, lambda s: s["index"]["refused"] > 0)
        self.assertGreater(st["index"]["refused"], 0, st)
        self.assertEqual(st["index"]["forgotten"], 0, st)
        self.assertGreater(st["index"]["bytes"], 2 * 1024 * 1024 * 9 // 10, st)
        self.assertEqual(st["index"]["pods"], first, st)
        self.assertTrue(self.d.alive())

    def test_models_flood_then_drop(self):
        models = ["%s-%06d" % (NAME, i) for i in range(10000)]
        first = self.flood([{"pod": "p", "model": m, "events": [stored([7], TOK[:4])]}
                            for m in models])
        self.assertIsNotNone(first, "no model was refused")
        self.assertGreater(first, 10)
        self.assertEqual(self.post_events("p", [stored([7], TOK[:4])], model="fresh")[0], 503)
        before = self.d.stats()["index"]
        gone = models[:first // 2]  # pipelined on one connection: cheap under sanitizers too
        h = self.d.connect(self.d.http_port, timeout=60)
        try:
            h.sendall(b"".join(b"DELETE /v1/models/%s HTTP/1.1\r\n\r\n" % m.encode()
                               for m in gone))
            answers = http_answers(h, len(gone), timeout=60)
        finally:
            h.close()
        self.assertEqual([s for s, _ in answers], [200] * len(gone), answers[:3])
        want = before["namespaces"] - len(gone)
        st = wait_stats(self.d, lambda s: s["index"]["namespaces"] == want)
        self.assertEqual(st["index"]["namespaces"], want, (before, st))
        self.assertLess(st["index"]["bytes"], before["bytes"], (before, st))
        self.assertEqual(self.post_events("p", [stored([7], TOK[:4])], model="fresh")[0], 200)
        self.assertEqual(self.matched(self.query(TOK[:4], model="fresh")), {("p", 0): 1})
        self.assertTrue(self.d.alive())


class TestForget(Flood):
    """Empty idle pods and namespaces are forgotten after --forget-idle: their memory comes
    back and new names are welcome again."""
    flags = ("--index-budget", "2MiB", "--forget-idle", "2s", "--stats-period", "20ms")

    def test_idle_pods_and_namespaces_are_forgotten(self):
        base = wait_stats(self.d, lambda s: True)["index"]["bytes"]
        n = 3000  # about half the budget: none refused however slowly they arrive
        self.assertIsNone(self.flood([empty_pod(i) for i in range(n)]))
        st = wait_stats(self.d, lambda s: s["index"]["pods"] == 0, timeout=30)
        self.assertEqual(st["index"]["pods"], 0, st)
        self.assertEqual(st["index"]["forgotten"], n, st)
        self.assertEqual(st["index"]["refused"], 0, st)
        self.assertLess(st["index"]["bytes"], base + 256 * 1024, st)
        self.assertEqual(self.post_events("after", [stored([1, 2], TOK[:8])])[0], 200)
        self.assertEqual(self.matched(self.query(TOK)), {("after", 0): 2})
        # a model whose blocks all went is forgotten too (its namespace was empty and idle)
        self.assertEqual(self.post_events("p", [stored([7], TOK[:4])], model="fresh")[0], 200)
        self.post_events("p", [{"type": "BlockRemoved", "block_hashes": [7]}], model="fresh")
        st = wait_stats(self.d, lambda s: s["index"]["namespaces"] == 1, timeout=30)
        self.assertEqual(st["index"]["namespaces"], 1, st)  # "m", of "after", stays
        self.assertTrue(self.d.alive())


class TestOutputBudget(Base):
    """Answers a client does not read cost bounded memory (--conn-buffer), whatever they are."""
    flags = ("--conn-buffer", "1MiB", "--stats-period", "50ms")
    N_RPC = 100000  # STATS requests, 24 bytes each: ~2.3 MiB in, ~70 MiB of answers
    N_HTTP = 90000  # GET /v1/stats, 27 bytes each: ~2.3 MiB in, ~75 MiB of answers

    def settled(self, proto):
        """Waits until the daemon stops answering (the count of stats answers holds still)."""
        key = (("proto", proto), ("call", "stats"), ("code", "2xx"))
        last, same = -1, 0
        for _ in range(100):
            time.sleep(0.1)
            n = metric(self.d, "kvtier_requests_total", key)
            same = same + 1 if n == last else 0
            last = n
            if same >= 3:
                break
        return last

    def test_unread_answers_are_bounded_then_all_arrive(self):
        import threading
        self.post_events("A", [stored([1, 2], TOK[:8])])
        stats_len = len(json.dumps(self.d.stats()))
        base = self.d.status_kib("VmHWM")
        # RPC: pipelined STATS and a final PING from a client that reads nothing yet
        r = self.d.connect()
        rpc_burst = b"".join(fx.frame(fx.OP_STATS, 1 + i) for i in range(self.N_RPC))
        rpc_burst += fx.frame(fx.OP_PING, self.N_RPC + 1)
        # HTTP: pipelined GET /v1/stats and a final GET /healthz
        h = self.d.connect(self.d.http_port)
        http_burst = b"GET /v1/stats HTTP/1.1\r\n\r\n" * self.N_HTTP + b"GET /healthz HTTP/1.1\r\n\r\n"
        senders = [threading.Thread(target=r.sendall, args=(rpc_burst,)),
                   threading.Thread(target=h.sendall, args=(http_burst,))]
        for t in senders:
            t.start()
        answered_rpc, answered_http = self.settled("rpc"), self.settled("http")
        grew_kib = self.d.status_kib("VmHWM") - base
        sys.stderr.write("peak RSS grew %d KiB; answered %d RPC, %d HTTP before the client read\n"
                         % (grew_kib, answered_rpc, answered_http))
        # Bound: each connection buffers what it was sent (at most the burst) and about
        # --conn-buffer of unsent answers plus the one that crossed it; 16 MiB of slack for
        # allocator arenas and libevent chains. Without the budget the daemon answers every
        # buffered request at once: ~55 MiB per connection (--conn-buffer is 1 MiB).
        bound_kib = (len(rpc_burst) + len(http_burst) + 2 * (2 * 1024 * 1024 + stats_len)) // 1024
        bound_kib += 16 * 1024
        if SANITIZED:  # shadow memory and quarantines make RSS say little there
            bound_kib = 1 << 40
        self.assertLess(grew_kib, bound_kib,
                        "peak RSS grew %d KiB with unread answers (bound %d KiB)" % (grew_kib,
                                                                                   bound_kib))
        # processing stopped at the budget: far fewer answers than requests so far
        self.assertLess(answered_rpc, self.N_RPC // 4)
        self.assertLess(answered_http, self.N_HTTP // 4)
        # the client reads: every answer arrives, whole and in order
        for i in range(self.N_RPC):
            hd, body = fx.read_frame(r)
            self.assertEqual((hd["op"], hd["req_id"], hd["flags"]), (fx.OP_STATS, 1 + i,
                                                                      fx.F_RESPONSE))
            self.assertEqual(json.loads(body)["index"]["pods"], 1)
        hd, body = fx.read_frame(r)
        self.assertEqual((hd["op"], hd["req_id"], body), (fx.OP_PING, self.N_RPC + 1, b""))
        answers = http_answers(h, self.N_HTTP + 1)
        for st, body in answers[:-1]:
            self.assertEqual(st, 200)
            self.assertEqual(json.loads(body)["index"]["pods"], 1)
        self.assertEqual(answers[-1], (200, b'{"status":"ok"}'))
        for t in senders:
            t.join()
        # and still within the bound while they were sent
        self.assertLess(self.d.status_kib("VmHWM") - base, bound_kib)
        r.close()
        h.close()


class TestSilentAndProbes(Base):
    flags = ("--request-timeout", "400ms", "--max-connections", "4")

    def test_silent_connections_are_closed(self):
        # never a byte: closed after --request-timeout (--idle-timeout is 120 s here)
        h = self.d.connect(self.d.http_port)
        r = self.d.connect()
        data = recv_all(h)
        self.assertIn(b" 408 ", data.split(b"\r\n")[0])
        self.assertEqual(recv_all(r), b"")
        h.close()
        r.close()
        self.assertGreaterEqual(metric(self.d, "kvtier_request_timeouts_total",
                                       (("proto", "rpc"),)), 1)
        # a connection that sends its request in time is served and stays open between requests
        h = self.d.connect(self.d.http_port)
        h.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        self.assertEqual(http_answers(h, 1), [(200, b'{"status":"ok"}')])
        time.sleep(0.8)  # twice the request timeout, idle between requests
        h.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        self.assertEqual(http_answers(h, 1), [(200, b'{"status":"ok"}')])
        # a request that stalls after answered ones: 408, then closed (the slot comes back)
        h.sendall(b"GET /healthz HTTP/1.1\r\nHost: x")
        data = recv_all(h)
        self.assertIn(b" 408 ", data.split(b"\r\n")[0])
        h.close()


class TestProbeReserve(Base):
    flags = ("--request-timeout", "30s", "--max-connections", "4")

    def fill(self):
        """Holds every slot with silent connections (two HTTP, two RPC), returned once the
        daemon has accepted them all (its open descriptors say so): a connection made after
        that lands in the probe reserve."""
        base = self.d.open_fds()
        held = [self.d.connect(self.d.http_port) for _ in range(2)] + \
            [self.d.connect() for _ in range(2)]
        for _ in range(200):
            if self.d.open_fds() >= base + 4:
                break
            time.sleep(0.02)
        self.assertEqual(self.d.open_fds(), base + 4)
        s = self.d.connect(self.d.http_port)
        s.sendall(b"GET /v1/stats HTTP/1.1\r\n\r\n")
        data = recv_all(s)
        s.close()
        self.assertIn(b" 503 ", data.split(b"\r\n")[0])
        self.assertIn(b"too many connections", data)
        return held

    def test_healthz_answers_with_every_slot_taken(self):
        held = self.fill()
        for path, want in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
            s = self.d.connect(self.d.http_port)
            s.sendall(("GET %s HTTP/1.1\r\n\r\n" % path).encode())
            data = recv_all(s)  # one probe per reserve connection: closed after it
            self.assertIn(b" 200 ", data.split(b"\r\n")[0], data)
            self.assertEqual(json.loads(data.split(b"\r\n\r\n", 1)[1]), want)
            s.close()
        # anything else in the reserve: 503, closed
        s = self.d.connect(self.d.http_port)
        s.sendall(b"POST /v1/query HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
        self.assertIn(b" 503 ", recv_all(s).split(b"\r\n")[0])
        s.close()
        # RPC has no reserve: refused at once
        r = self.d.connect()
        h, b = fx.read_frame(r)
        self.assertEqual((h["flags"] & fx.F_ERROR, fx.parse_error(b)[1]), (fx.F_ERROR, 503))
        self.assertEqual(recv_all(r), b"")
        r.close()
        # the reserve is bounded too: 16 silent connections fill it, the next is refused at once
        base = self.d.open_fds()
        reserve = [self.d.connect(self.d.http_port) for _ in range(16)]
        for _ in range(200):
            if self.d.open_fds() >= base + 16:
                break
            time.sleep(0.02)
        self.assertEqual(self.d.open_fds(), base + 16)
        s = self.d.connect(self.d.http_port)  # refused on accept: it answers before a request
        self.assertIn(b" 503 ", recv_all(s).split(b"\r\n")[0])
        s.close()
        # ... and a silent one there lasts a second at most, not --request-timeout (30 s)
        for x in reserve:
            self.assertIn(b" 408 ", recv_all(x, timeout=5).split(b"\r\n")[0])
            x.close()
        s = self.d.connect(self.d.http_port)
        s.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        self.assertIn(b" 200 ", recv_all(s).split(b"\r\n")[0])
        s.close()
        for x in held:
            x.close()
        time.sleep(0.3)
        self.assertEqual(self.d.http("GET", "/healthz")[0], 200)
        samples, _ = fx.parse_prometheus(self.d.http("GET", "/metrics", raw=True)[1].decode())
        for proto in ("http", "rpc"):
            self.assertGreaterEqual(
                samples[("kvtier_connections_refused_total", (("proto", proto),))], 1)


class TestReadiness(Base):
    def test_readyz(self):
        self.assertEqual(self.d.http("GET", "/readyz"), (200, {"status": "ready"}))
        self.assertEqual(self.d.http("POST", "/readyz", "{}")[0], 405)
        samples, _ = fx.parse_prometheus(self.d.http("GET", "/metrics", raw=True)[1].decode())
        self.assertGreaterEqual(samples[("kvtier_requests_total", (("proto", "http"),
                                                                  ("call", "readyz"),
                                                                  ("code", "2xx")))], 1)

    def test_a_stalled_writer_is_not_ready_but_alive(self):
        # --writer-stall 1ms: the idle writer comes round every 5 ms, so most reads see it late
        d = fx.Daemon(BIN, "--writer-stall", "1ms")
        try:
            seen = None
            for _ in range(200):
                st, body = d.http("GET", "/readyz")
                self.assertIn(st, (200, 503))
                self.assertEqual(d.http("GET", "/healthz"), (200, {"status": "ok"}))
                if st == 503:
                    seen = body
                    break
            self.assertIsNotNone(seen, "/readyz never reported the stall")
            self.assertEqual(seen["status"], "not ready")
            self.assertIn("writer has made no progress", seen["reason"])
        finally:
            self.assertEqual(d.stop(), 0)
            d.cleanup()


def project_version():
    """The version CMakeLists.txt gives the project."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        return re.search(r"project\(kvtier VERSION (\d+\.\d+\.\d+)", f.read()).group(1)


VERSION_LINE = re.compile(r"^kvtierd (\d+\.\d+\.\d+) \(([^,]+), ([^,]*), ((?:gcc|clang) [\d.]+)\)$")


class TestBuildAndProcess(Base):
    flags = ("--stats-period", "50ms")

    def version(self):
        p = subprocess.run([BIN, "--version", "--no-such-flag"], capture_output=True, text=True,
                           timeout=20)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        m = VERSION_LINE.match(p.stdout.rstrip("\n"))
        self.assertIsNotNone(m, p.stdout)
        return m.groups()

    def test_version_everywhere(self):
        version, rev, build_type, compiler = self.version()
        self.assertEqual(version, project_version())
        s, st = self.d.http("GET", "/v1/stats")
        self.assertEqual(s, 200)
        self.assertEqual(st["build"], {"version": version, "revision": rev,
                                       "build_type": build_type if build_type != "no build type"
                                       else "", "compiler": compiler})
        samples, types = fx.parse_prometheus(self.d.http("GET", "/metrics", raw=True)[1].decode())
        info = [(k, v) for k, v in samples.items() if k[0] == "kvtier_build_info"]
        self.assertEqual(info, [(("kvtier_build_info", (("version", version), ("revision", rev),
                                                        ("build_type", st["build"]["build_type"]),
                                                        ("compiler", compiler))), 1)])

    def test_process_figures_follow_the_process(self):
        def figures():
            st = self.d.http("GET", "/v1/stats")[1]["process"]
            samples, _ = fx.parse_prometheus(
                self.d.http("GET", "/metrics", raw=True)[1].decode())
            return st, samples
        st, samples = figures()
        rss = self.d.status_kib("VmRSS") * 1024
        self.assertLess(abs(st["rss_bytes"] - rss), rss // 2 + (4 << 20), (st, rss))
        self.assertGreater(samples[("process_resident_memory_bytes", ())], 1 << 20)
        self.assertGreater(samples[("process_max_fds", ())], 0)
        self.assertGreater(samples[("process_start_time_seconds", ())], time.time() - 600)
        self.assertLessEqual(samples[("process_start_time_seconds", ())], time.time())
        # the figures' own HTTP connections close a moment after their answers (later under
        # TSan): the baseline is the fewest fds seen over a few samples
        base = self.d.open_fds()
        for _ in range(10):
            time.sleep(0.02)
            base = min(base, self.d.open_fds())
        self.assertLessEqual(abs(st["open_fds"] - base), 2, (st, base))
        # 8 more connections held open: both bodies count them once renewed (every 50 ms)
        held = [self.d.connect(self.d.http_port) for _ in range(8)]
        try:
            for _ in range(200):
                if self.d.open_fds() >= base + 8:
                    break
                time.sleep(0.01)
            for _ in range(200):
                st, samples = figures()
                if st["open_fds"] >= base + 8 and samples[("process_open_fds", ())] >= base + 8:
                    break
                time.sleep(0.02)
            self.assertGreaterEqual(st["open_fds"], base + 8)
            self.assertGreaterEqual(samples[("process_open_fds", ())], base + 8)
            self.assertGreaterEqual(self.d.http("GET", "/v1/stats")[1]["connections"]["open"], 8)
        finally:
            for h in held:
                h.close()


class TestProtocolAsDocumented(Base):
    def test_ping_and_stats_bodies_refused_connection_kept(self):
        s = self.d.connect()
        for i, op in enumerate((fx.OP_PING, fx.OP_STATS)):
            h, b = self.rpc(s, op, 10 + i, b"x")
            self.assertEqual((h["req_id"], h["flags"]), (10 + i, fx.F_RESPONSE | fx.F_ERROR))
            st, http_st, msg = fx.parse_error(b)
            self.assertEqual(http_st, 400)
            self.assertIn("takes no body", msg)
        h, b = self.rpc(s, fx.OP_PING, 20)
        self.assertEqual((h["req_id"], h["flags"], b), (20, fx.F_RESPONSE, b""))
        h, b = self.rpc(s, fx.OP_STATS, 21)
        self.assertEqual(h["flags"], fx.F_RESPONSE)
        self.assertIn("index", json.loads(b))
        s.close()

    def test_duplicate_keys_always_400(self):
        self.post_events("A", [stored([1, 2], TOK[:8])])
        wait_stats(self.d, lambda st: st["index"]["entries"] == 2)
        before = self.d.stats()["index"], self.query(TOK)
        bodies = [
            ("/v1/query", '{"model":"m","model":"x","token_ids":[1,2,3,4]}'),
            ("/v1/query", '{"model":"m","token_ids":[1],"pods":["A"],"\\u0070ods":["B"]}'),
            ("/v1/events", '{"pod":"A","pod":"B","model":"m","events":[]}'),
            ("/v1/events", '{"pod":"A","model":"m","events":[{"type":"AllBlocksCleared",'
                           '"type":"AllBlocksCleared"}]}'),
            ("/v1/events", '{"pod":"A","model":"m","events":[{"type":"Future","x":{"k":1,"k":2}}]}'),
            ("/v1/engines", '{"pod":"q","pod":"q2","model":"m","endpoint":"tcp://127.0.0.1:1"}'),
            ("/v1/engines", '{"pod":"q","model":"m","endpoint":"tcp://127.0.0.1:1",'
                            '"endpoint":"tcp://127.0.0.1:2"}'),
        ]
        for path, body in bodies:
            answers = [self.d.http("POST", path, body) for _ in range(3)]
            self.assertEqual(answers[0][0], 400, (path, body, answers[0]))
            self.assertIn("duplicate field", answers[0][1]["error"])
            self.assertEqual(answers[1:], answers[:1] * 2, "not the same answer every time")
        # the binary RPC carries the same JSON bodies: the same refusal
        s = self.d.connect()
        for i, (op, body) in enumerate([(fx.OP_EVENTS, bodies[2][1]), (0x22, bodies[5][1])]):
            h, b = self.rpc(s, op, 30 + i, body.encode())
            self.assertEqual(fx.parse_error(b)[1], 400)
            self.assertIn("duplicate field", fx.parse_error(b)[2])
        s.close()
        self.assertEqual(self.d.stats()["streams"], [])
        self.assertEqual((wait_stats(self.d, lambda st: True)["index"], self.query(TOK)), before)

    def test_empty_and_nul_names_refused_everywhere(self):
        self.post_events("A", [stored([1, 2], TOK[:8])])
        wait_stats(self.d, lambda st: st["index"]["entries"] == 2)
        before = self.query(TOK)
        ep = "tcp://127.0.0.1:1"
        bad_http = [
            ("POST", "/v1/events", {"pod": "", "model": "m", "events": []}),
            ("POST", "/v1/events", {"pod": "A\u0000", "model": "m", "events": []}),
            ("POST", "/v1/events", {"pod": "A", "model": "m\u0000", "events": []}),
            ("POST", "/v1/events", {"pod": "A", "model": "m", "lora_name": "l\u0000",
                                    "events": []}),
            ("POST", "/v1/events", {"pod": "A", "model": "m", "events": [
                stored([3], TOK[:4], lora="l\u0000")]}),
            ("POST", "/v1/engines", {"pod": "", "model": "m", "endpoint": ep}),
            ("POST", "/v1/engines", {"pod": "p\u0000", "model": "m", "endpoint": ep}),
            ("POST", "/v1/engines", {"pod": "p", "model": "\u0000", "endpoint": ep}),
            ("POST", "/v1/query", {"model": "m\u0000", "token_ids": TOK}),
            ("POST", "/v1/query", {"model": "m", "lora_name": "\u0000", "token_ids": TOK}),
            ("POST", "/v1/query", {"model": "m", "token_ids": TOK, "pods": [""]}),
            ("POST", "/v1/query", {"model": "m", "token_ids": TOK, "pods": ["A\u0000"]}),
            ("DELETE", "/v1/engines/", None),
            ("DELETE", "/v1/engines/A%00", None),
        ]
        for m, p, body in bad_http:
            st, a = self.d.http(m, p, body)
            self.assertEqual(st, 400, (m, p, body, a))
            self.assertTrue(a["error"])
        s = self.d.connect()
        for i, body in enumerate([fx.query_body(b"m\x00", tokens=TOK),
                                  fx.query_body("m", tokens=TOK, lora=b"\x00"),
                                  fx.query_body("m", tokens=TOK, pods=[b""]),
                                  fx.query_body("m", tokens=TOK, pods=[b"A\x00"])]):
            h, b = self.rpc(s, fx.OP_QUERY, 40 + i, body)
            self.assertEqual((h["req_id"], fx.parse_error(b)[1]), (40 + i, 400))
        for i, name in enumerate([b"", b"A\x00"]):
            h, b = self.rpc(s, fx.OP_ENGINE_DROP, 50 + i, fx.pstr(name))
            self.assertEqual(fx.parse_error(b)[1], 400)
        s.close()
        self.assertEqual(self.query(TOK), before)
        self.assertEqual(self.d.stats()["streams"], [])

    def test_any_name_created_can_be_deleted(self):
        from urllib.parse import quote
        names = ["a/b", "50%", "with space", "what?", "tag#1", "gr\u00fc\u00df-\u6f22\u5b57",
                 "%2F", "/", "a/../b"]
        for n in names:
            s, a = self.post_events(n, [stored([1, 2], TOK[:8])])
            self.assertEqual(s, 200, (n, a))
        self.assertEqual({p["pod"] for p in self.query(TOK)["pods"]}, set(names))
        # a raw '/' ends the segment: no such path, nothing dropped
        self.assertEqual(self.d.http("DELETE", "/v1/engines/a/b")[0], 404)
        for n in names:
            s, a = self.d.http("DELETE", "/v1/engines/" + quote(n, safe=""))
            self.assertEqual((s, a.get("pod"), a.get("dp_ranks")), (200, n, 1), (n, a))
        self.assertEqual(self.query(TOK)["pods"], [])


@unittest.skipIf(zmq is None, "python3-zmq / python3-msgpack missing")
class TestIpcDir(Base):
    """ipc:// binds stay inside kvtierd's --ipc-dir; a file elsewhere is never touched."""

    def setUp(self):
        super().setUp()
        self.ctx = zmq.Context()
        self.pubs = []

    def tearDown(self):
        for p in self.pubs:
            p.close()
        self.ctx.term()
        super().tearDown()

    def untouched(self, path, ino, data):
        st = os.lstat(path)
        self.assertTrue(stat.S_ISREG(st.st_mode), path + " is no longer a regular file")
        self.assertEqual(st.st_ino, ino)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), data)

    def test_binds_outside_are_refused_and_touch_nothing(self):
        st = os.stat(self.d.ipc_dir)
        self.assertTrue(stat.S_ISDIR(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o700)
        victim = os.path.join(self.d.dir.name, "victim.txt")
        inside = os.path.join(self.d.ipc_dir, "regular")
        outside_dir = os.path.join(self.d.dir.name, "elsewhere")
        os.mkdir(outside_dir)
        os.symlink(outside_dir, os.path.join(self.d.ipc_dir, "link"))
        files = {}
        for path in (victim, inside, os.path.join(outside_dir, "x")):
            with open(path, "wb") as f:
                f.write(b"precious bytes\n")
            files[path] = os.stat(path).st_ino
        bad = [("ipc://" + victim, "ipc dir"),
               ("ipc://" + self.d.ipc_dir + "/../victim.txt", "plain"),
               ("ipc://" + self.d.ipc_dir + "/link/x", "ipc dir"),
               ("ipc://../victim.txt", "no '/'"),
               ("ipc://sub/x", "no '/'"),
               ("ipc://..", "name"),
               ("ipc://a b", "endpoint"),
               ("ipc://a*", "name"),
               ("ipc://regular", "not a socket"),
               ("ipc://" + inside, "not a socket")]
        for ep, why in bad:
            s, a = self.d.http("POST", "/v1/engines", {"pod": "p", "model": "m", "endpoint": ep,
                                                       "bind": True})
            self.assertEqual(s, 400, (ep, a))
            self.assertIn(why, a["error"], ep)
        for path, ino in files.items():
            self.untouched(path, ino, b"precious bytes\n")
        self.assertEqual(self.d.stats()["streams"], [])
        # an ipc *connect* creates nothing: allowed anywhere, the file stays as it is
        s, a = self.d.http("POST", "/v1/engines", {"pod": "c", "model": "m",
                                                   "endpoint": "ipc://" + victim})
        self.assertEqual(s, 200, a)
        self.assertEqual(self.d.http("DELETE", "/v1/engines/c")[0], 200)
        self.untouched(victim, files[victim], b"precious bytes\n")
        # the same rule at start: --engine and --publish refuse to bind outside, touch nothing
        for flags in (["--engine", json.dumps({"pod": "p", "model": "m", "bind": True,
                                               "endpoint": "ipc://" + victim})],
                      ["--publish", "ipc://" + victim],
                      ["--publish", "ipc://pub", "--publish-replay", "ipc://" + victim]):
            p = subprocess.run([BIN, "--http-listen", "127.0.0.1:0", "--rpc-listen",
                                "127.0.0.1:0", "--data-dir", self.d.data_dir + "2"] + flags,
                               capture_output=True, text=True, timeout=20)
            self.assertEqual(p.returncode, 1, (flags, p.stderr))
            self.assertIn("ipc dir", p.stderr)
            self.untouched(victim, files[victim], b"precious bytes\n")
            self.assertFalse(os.path.exists(os.path.join(self.d.data_dir + "2", "ipc", "pub")))

    def test_an_ipc_dir_open_to_others_stops_the_start_untouched(self):
        shared = os.path.join(self.d.dir.name, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o755)
        p = subprocess.run([BIN, "--http-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
                            "--data-dir", self.d.data_dir + "3", "--ipc-dir", shared],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("open to other users", p.stderr)
        self.assertEqual(stat.S_IMODE(os.stat(shared).st_mode), 0o755)  # not chmod'ed
        self.assertEqual(os.listdir(shared), [])

    def wait_blocks(self, toks, pod, n):
        end = time.time() + 10
        while time.time() < end:
            got = [p["matched_blocks"] for p in self.query(toks)["pods"] if p["pod"] == pod]
            if got == [n]:
                return
            time.sleep(0.02)
        self.fail("%s never held %d blocks" % (pod, n))

    def test_bind_inside_end_to_end_and_sockets_removed(self):
        sock = os.path.join(self.d.ipc_dir, "events")
        for ep, pod in (("ipc://events", "rel"), ("ipc://" + sock + "2", "abs")):
            s, a = self.d.http("POST", "/v1/engines", {"pod": pod, "model": "m", "endpoint": ep,
                                                       "bind": True})
            self.assertEqual(s, 200, a)
            path = a["endpoints"][0][len("ipc://"):]
            self.assertEqual(os.path.dirname(path), os.path.realpath(self.d.ipc_dir))
            self.assertTrue(stat.S_ISSOCK(os.lstat(path).st_mode))
            # an engine dials in (a real ZMQ PUB, vLLM's wire format) and its blocks arrive
            pub = kv.Publisher(self.ctx, a["endpoints"][0], bind=False)
            self.pubs.append(pub)
            toks = list(range(7, 7 + 32))
            end = time.time() + 10
            while time.time() < end:  # a SUB drops what comes before the connection is up
                pub.publish(kv.encode_batch([kv.stored([11, 12], toks, 16)]))
                got = [p for p in self.query(toks)["pods"] if p["pod"] == pod]
                if got:
                    break
                time.sleep(0.05)
            self.wait_blocks(toks, pod, 2)
        # unsubscribe: the socket file goes with the socket
        self.assertEqual(self.d.http("DELETE", "/v1/engines/rel")[0], 200)
        self.assertFalse(os.path.lexists(sock))
        self.assertTrue(os.path.lexists(sock + "2"))
        # a publisher over ipc too
        d2 = fx.Daemon(BIN, "--publish", "ipc://pub", "--publish-replay", "ipc://pub-replay")
        try:
            pub_path = os.path.join(d2.ipc_dir, "pub")
            self.assertTrue(stat.S_ISSOCK(os.lstat(pub_path).st_mode))
            self.assertTrue(stat.S_ISSOCK(os.lstat(pub_path + "-replay").st_mode))
            self.assertEqual(d2.stats()["publisher"]["endpoint"],
                             "ipc://" + os.path.realpath(pub_path))
        finally:
            self.assertEqual(d2.stop(), 0)
        self.assertFalse(os.path.lexists(pub_path))
        self.assertFalse(os.path.lexists(pub_path + "-replay"))
        d2.cleanup()
        # shutdown removes the sockets still bound
        self.assertEqual(self.d.stop(), 0)
        self.assertFalse(os.path.lexists(sock + "2"))
        self.assertEqual(os.listdir(self.d.ipc_dir), [])

    def test_ipc_dir_flag_env_and_dump(self):
        custom = os.path.join(self.d.dir.name, "my", "ipc")
        d2 = fx.Daemon(BIN, env={"KVTIER_IPC_DIR": custom})
        try:
            st = os.stat(custom)
            self.assertEqual(stat.S_IMODE(st.st_mode), 0o700)
            s, a = d2.http("POST", "/v1/engines", {"pod": "p", "model": "m", "bind": True,
                                                   "endpoint": "ipc://ev"})
            self.assertEqual((s, a["endpoints"]), (200, ["ipc://" + os.path.realpath(custom) +
                                                         "/ev"]), a)
        finally:
            self.assertEqual(d2.stop(), 0)
            d2.cleanup()
        self.assertEqual(os.listdir(custom), [])
        p = subprocess.run([BIN, "--dump-config", "--ipc-dir", custom], capture_output=True,
                           text=True, timeout=20)
        self.assertIn("ipc-dir = " + custom, p.stdout)
        self.assertIn("writer-stall = 5s", p.stdout)


class TestCommandLine(unittest.TestCase):
    def test_refuses_remote_bind_and_bad_config(self):
        p = subprocess.run([BIN, "--http-listen", "0.0.0.0:0", "--rpc-listen", "127.0.0.1:0",
                            "--data-dir", "/tmp/kvtierd_remote_test"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--allow-remote", p.stderr)
        p = subprocess.run([BIN, "--workers", "x"], capture_output=True, text=True, timeout=20)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--workers", p.stderr)
        p = subprocess.run([BIN, "--dump-config", "--block-size", "32"], capture_output=True,
                           text=True, timeout=20)
        self.assertEqual(p.returncode, 0)
        self.assertIn("block-size = 32", p.stdout)
        self.assertIn("http-listen = ", p.stdout)

    def test_lora_keys_option(self):
        """--lora-keys: namespace (the default) or dynamo, from a flag or KVTIER_LORA_KEYS,
        in the dump; anything else stops the start with one line naming the flag."""
        def dump(*args, env=None):
            p = subprocess.run([BIN, "--dump-config", *args], capture_output=True, text=True,
                               timeout=20, env=None if env is None else dict(os.environ, **env))
            self.assertEqual(p.returncode, 0, p.stderr)
            return p.stdout
        self.assertIn("lora-keys = namespace\n", dump())
        self.assertIn("lora-keys = dynamo\n", dump("--lora-keys", "dynamo"))
        self.assertIn("lora-keys = dynamo\n", dump("--lora-keys=dynamo"))
        self.assertIn("lora-keys = dynamo\n", dump(env={"KVTIER_LORA_KEYS": "dynamo"}))
        self.assertIn("lora-keys = namespace\n",
                      dump("--lora-keys", "namespace", env={"KVTIER_LORA_KEYS": "dynamo"}))
        for bad in ("Dynamo", "", "vllm", "dynamo "):
            p = subprocess.run([BIN, "--lora-keys", bad, "--dump-config"], capture_output=True,
                               text=True, timeout=20)
            self.assertEqual(p.returncode, 2, (bad, p.stderr))
            self.assertEqual(p.stdout, "")
            self.assertIn("--lora-keys", p.stderr)
            self.assertIn("expected namespace or dynamo", p.stderr)


if __name__ == "__main__":
    BIN, SANITIZED = fx.binary_from_argv("test_daemon.py")
    unittest.main(verbosity=2)
