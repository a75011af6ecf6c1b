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
import struct
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvtierd_fixture as fx  # noqa: E402

try:
    import xxhash
except ImportError:
    xxhash = None

BIN = None
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
        for name, t in types.items():
            self.assertTrue(name.startswith("kvtier_"), name)

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
        for m, p in [("GET", "/v1/blocks/1"), ("POST", "/v1/prefetch"), ("POST", "/v1/transfer")]:
            s, a = self.d.http(m, p, {})
            self.assertEqual(s, 501, (m, p, a))


class TestRpc(Base):
    def rpc(self, sock, op, req_id, body=b""):
        sock.sendall(fx.frame(op, req_id, body))
        return fx.read_frame(sock)

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

    def test_connection_limit(self):
        held = [self.d.connect(self.d.http_port) for _ in range(6)]
        time.sleep(0.2)
        extra = self.d.connect(self.d.http_port)
        data = extra.recv(4096)
        self.assertIn(b" 503 ", data.split(b"\r\n")[0])
        extra.close()
        for s in held:
            s.close()
        time.sleep(0.3)
        self.assertEqual(self.d.http("GET", "/healthz")[0], 200)
        samples, _ = fx.parse_prometheus(self.d.http("GET", "/metrics", raw=True)[1].decode())
        self.assertGreaterEqual(samples[("kvtier_connections_refused_total", (("proto", "http"),))], 1)


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
        s, a = self.post_events("A", ev, headers={"Authorization": "Bearer s3cret"})
        self.assertEqual(s, 200, a)
        self.assertEqual(len(self.query(TOK)["pods"]), 1)  # reads need no token
        r = self.d.connect()
        body = json.dumps({"pod": "B", "model": "m", "events": ev}).encode()
        r.sendall(fx.frame(fx.OP_EVENTS, 1, body))
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


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_daemon.py path/to/kvtierd")
    BIN = sys.argv.pop(1)
    unittest.main(verbosity=2)
