#!/usr/bin/python3
"""Integration tests of the Python binding (kvtier, ctypes over libkvtier) against
the real kvtierd.

Usage: test_python_client.py path/to/kvtierd
The library is the one in $KVTIER_LIB, else the source tree's build/lib (the
binding's own lookup). Each test starts kvtierd on loopback ports in a temp dir
(kvtierd_fixture.Daemon) and compares what the binding returns with what the
HTTP API says for the same request: query() must return exactly the "pods" of
POST /v1/query, report_events()/drop_engine()/stats() the same JSON, and server
errors must raise kvtier.Error carrying the server's message.

TestCacheSalt checks cache-salt isolation both ways over HTTP, the binding, raw RPC
frames (QUERY kind 2) and the kvtier CLI (next to kvtierd), salted keys against an
independent implementation, every refusal, and runs the cache-salt examples of
docs/api.md and docs/cli.md.

TestLoraKeysDynamo runs kvtierd with --lora-keys dynamo: LoRA blocks stored through
events are found by keys computed Dynamo's way by the independent reference
(tests/fixtures/hash_vectors.py), by token queries with the LoRA (HTTP, the binding's
RPC, the CLI), and by hash_tokens(lora_keys="dynamo") / kvtier hash --lora-keys dynamo;
TestLoraKeysNamespace checks that the default daemon does not match those keys and keeps
the base model's behaviour.

TestTiers runs kvtierd with tiers (--ram-bytes, --block-bytes 64KiB, an NVMe store in a temp
dir on /tmp where io_uring and O_DIRECT allow one, the data plane on --rpc-unix): attach,
reserve, writes through the mapping, commit, lookup, pin (the bytes through the mapping),
unpin; the block API's round trip, not found, too big (the server's own error), durable puts
read back from NVMe through PIN; pins and reservations released when the engine's connection
closes (tiers.ram in GET /v1/stats). TestNoTiers: the tier calls against a kvtierd without them.
"""

import ctypes
import fcntl
import json
import os
import shlex
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "router-plugin", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures"))
import kvtierd_fixture as fx  # noqa: E402
import kvtier  # noqa: E402
import hash_vectors as hv  # noqa: E402

try:
    import xxhash
except ImportError:
    xxhash = None

BIN = None
CLI = None
SEED = 1337
TOK = list(range(100, 132))  # 8 blocks of 4
POD_KEYS = {"pod", "dp_rank", "matched_blocks", "gpu", "cpu", "disk", "score"}

# kvt_status_t values (common/status.h)
ST_INVAL, ST_NOT_FOUND, ST_IO, ST_TIMEOUT, ST_CLOSED = -100, -200, -400, -401, -502


def seq_keys(tokens, bs, salt=b""):
    """Block keys computed here from the hashing standard (python3-xxhash), independently. A
    cache salt seeds block 0 with XXH3_64(salt, 1337) (docs/api.md, "Cache salt")."""
    first = xxhash.xxh3_64_intdigest(salt, SEED) if salt else SEED
    keys, prev = [], None
    for i in range(len(tokens) // bs):
        block = struct.pack("<%dI" % bs, *tokens[i * bs:(i + 1) * bs])
        local = xxhash.xxh3_64_intdigest(block, first if i == 0 else SEED)
        if prev is None:
            prev = local
        else:
            prev = xxhash.xxh3_64_intdigest(struct.pack("<QQ", prev, local), SEED)
        keys.append(prev)
    return keys


stored = fx.stored


def batch(pod, events, model="m", **extra):
    b = {"pod": pod, "model": model, "lora_name": None, "events": events}
    b.update(extra)
    return b


free_port = fx.free_port


class Base(unittest.TestCase):
    flags = ()
    token = None

    def setUp(self):
        self.d = fx.Daemon(BIN, *self.flags, token=self.token)
        self.addr = "127.0.0.1:%d" % self.d.rpc_port
        self.clients = []

    def tearDown(self):
        for c in self.clients:
            c.close()
        rc = self.d.stop()
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors) or rc != 0:
            sys.stderr.write("---- kvtierd log ----\n" + self.d.read_log() + "\n")
        self.d.cleanup()
        self.assertEqual(rc, 0, "kvtierd did not exit 0 on SIGTERM")

    def client(self, **kw):
        kw.setdefault("timeout", 5.0)
        c = kvtier.Client(self.addr, **kw)
        self.clients.append(c)
        return c

    def http_query(self, **body):
        body.setdefault("model", "m")
        s, ans = self.d.http("POST", "/v1/query", body)
        self.assertEqual(s, 200, ans)
        return ans

    def http_events(self, body, token=None):
        headers = {"Authorization": "Bearer " + token} if token else None
        return self.d.http("POST", "/v1/events", body, headers)

    def raw_rpc_error(self, op, body):
        """Sends one frame over a raw socket (kvtierd_fixture's codec) and returns the
        error answer's (status, http_status, message); fails if the answer is not an error."""
        sock = self.d.connect()
        try:
            sock.sendall(fx.frame(op, 7, body))
            h, b = fx.read_frame(sock)
        finally:
            sock.close()
        self.assertTrue(h["flags"] & fx.F_ERROR, (h, b))
        return fx.parse_error(b)

    def assertServerError(self, e, op, body):
        """e (a kvtier.Error) carries exactly the status and message the server answers to
        the same request frame."""
        status, http, msg = self.raw_rpc_error(op, body)
        self.assertEqual(e.status, status)
        self.assertEqual(str(e), "%s: server: %s (%d)" % (self.addr, msg, http))
        return http, msg

    def wait_stats(self, pred, timeout=5.0):
        end = time.time() + timeout
        while True:
            s = self.d.stats()
            if pred(s):
                return s
            self.assertLess(time.time(), end, "stats never matched: %r" % s)
            time.sleep(0.02)

    def setup_pods(self, c):
        """A: 4 blocks on GPU; B rank 1: 2 on GPU; C: 3 on CPU; D: 8 blocks under LoRA ad1;
        E: 2 on GPU (ties with B's score)."""
        answers = [
            c.report_events(batch("A", [stored([1, 2, 3, 4], TOK[:16])])),
            c.report_events(batch("B", [stored([11, 12], TOK[:8])], dp_rank=1)),
            c.report_events(batch("C", [stored([21, 22, 23], TOK[:12], medium="CPU")])),
            c.report_events(batch("D", [stored(list(range(31, 39)), TOK, lora="ad1")])),
            c.report_events(batch("E", [stored([41, 42], TOK[:8])])),
        ]
        for a in answers:
            self.assertEqual(a["applied"], 1, a)


class TestVersion(unittest.TestCase):
    def test_versions_agree(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(root, "CMakeLists.txt")) as f:
            want = f.read().split("project(kvtier VERSION ", 1)[1].split()[0]
        self.assertEqual(kvtier.__version__, want)
        self.assertEqual(kvtier.library_version(), want)
        self.assertIn("__version__", kvtier.__all__)


class TestClient(Base):
    def test_query_is_exactly_http(self):
        c = self.client()
        # Unknown model: no pods, the default block size, as over HTTP.
        self.assertEqual(c.query_answer("m", TOK), self.http_query(token_ids=TOK))
        self.assertEqual(c.query_answer("m", TOK)["block_size"], 16)
        self.setup_pods(c)
        filters = [None, ["B", "C"], ["nope"], ["A", "A", "E"], ["D"]]
        for n in list(range(0, 33, 4)) + [3, 13, 31]:
            toks = TOK[:n]
            for pods in filters:
                body = {"token_ids": toks}
                if pods is not None:
                    body["pods"] = pods
                want = self.http_query(**body)
                got = c.query("m", toks, pods=pods)
                self.assertEqual(got, want["pods"], (n, pods))
                self.assertEqual(c.query_answer("m", toks, pods=pods), want, (n, pods))
                for p in got:
                    self.assertEqual(set(p), POD_KEYS)
                    self.assertIsInstance(p["pod"], str)
                    self.assertIsInstance(p["score"], float)
                    for k in POD_KEYS - {"pod", "score"}:
                        self.assertIsInstance(p[k], int)
        full = c.query("m", TOK)
        self.assertEqual([(p["pod"], p["matched_blocks"]) for p in full][:2], [("A", 4), ("C", 3)])
        self.assertEqual(sorted((p["pod"], p["dp_rank"]) for p in full[2:]), [("B", 1), ("E", 0)])
        self.assertEqual((full[1]["cpu"], full[1]["gpu"]), (3, 0))
        scores = [p["score"] for p in full]
        self.assertEqual(scores, sorted(scores, reverse=True), "best first")
        # LoRA namespace, with and without a filter
        for pods in (None, ["D"], ["A"]):
            body = {"token_ids": TOK, "lora_name": "ad1"}
            if pods:
                body["pods"] = pods
            self.assertEqual(c.query("m", TOK, lora="ad1", pods=pods),
                             self.http_query(**body)["pods"])
        self.assertEqual(c.query("m", TOK, lora="ad1")[0]["matched_blocks"], 8)
        # empty pods list = no filter
        self.assertEqual(c.query("m", TOK, pods=[]), self.http_query(token_ids=TOK)["pods"])

    def test_query_keys(self):
        c = self.client()
        self.setup_pods(c)
        keys = kvtier.hash_tokens(TOK, 4)
        self.assertEqual(len(keys), 8)
        self.assertEqual(kvtier.hash_tokens(TOK[:3], 4), [])
        if xxhash is not None:
            self.assertEqual(keys, seq_keys(TOK, 4), "hash_tokens differs from the standard")
        for n in range(0, 9):
            for pods in (None, ["C", "E"]):
                body = {"block_hashes": keys[:n]}
                if pods:
                    body["pods"] = pods
                want = self.http_query(**body)
                self.assertEqual(c.query_keys("m", keys[:n], pods=pods), want["pods"], (n, pods))
                self.assertEqual(c.query_keys_answer("m", keys[:n], pods=pods), want)
                self.assertEqual(c.query_keys("m", keys[:n], pods=pods),
                                 c.query("m", TOK[:4 * n], pods=pods))
        self.assertEqual(c.query_keys("m", [1, 2, 2**64 - 1]), [])

    def test_report_events_answers_as_http(self):
        c = self.client()
        events = [
            stored([1, 2, 3], TOK[:12]),
            stored([4], TOK[12:16], medium="CPU"),
            {"type": "BlockStored", "block_hashes": [1, 2, 99], "token_ids": [], "block_size": 0,
             "medium": "CPU"},
            {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"},
            {"type": "SomethingNew", "x": 1},
            {"type": "AllBlocksCleared"},
        ]
        ans_dict = c.report_events(batch("X", events))
        s, ans_http = self.http_events(batch("Y", events))
        self.assertEqual(s, 200, ans_http)
        self.assertEqual(ans_dict, ans_http)
        self.assertEqual(ans_dict["ignored"], 1)
        self.assertEqual(ans_dict["unresolved"], 1)
        # str and bytes bodies, as sent
        ans_str = c.report_events(json.dumps(batch("Z", events)))
        ans_bytes = c.report_events(json.dumps(batch("W", events)).encode())
        self.assertEqual(ans_str, ans_http)
        self.assertEqual(ans_bytes, ans_http)
        # the four pods are alike
        got = c.query("m", TOK)
        self.assertEqual(got, self.http_query(token_ids=TOK)["pods"])
        self.assertEqual(sorted(p["pod"] for p in got), ["W", "X", "Y", "Z"])
        self.assertEqual(len({(p["matched_blocks"], p["gpu"], p["cpu"]) for p in got}), 1)

    def test_stats(self):
        c = self.client()
        self.setup_pods(c)
        want_entries = 4 + 2 + 3 + 8 + 2
        http = self.wait_stats(lambda s: s["index"]["entries"] == want_entries)
        st = c.stats()
        for k in ("uptime_s", "index", "events", "connections", "engines"):
            self.assertIn(k, st)
        self.assertEqual(st["index"], http["index"])
        self.assertEqual(st["index"]["pods"], 5)
        self.assertEqual(st["index"]["namespaces"], 2)
        self.assertEqual(st["events"]["batches"], 5)
        self.assertEqual(st["events"]["blocks"], want_entries)
        engines = {(e["pod"], e["dp_rank"]): e["entries"] for e in st["engines"]}
        self.assertEqual(engines, {("A", 0): 4, ("B", 1): 2, ("C", 0): 3, ("D", 0): 8, ("E", 0): 2})

    def test_add_engine(self):
        c = self.client()
        spec = {"pod": "E", "model": "m", "endpoint": "tcp://127.0.0.1:1",
                "replay_endpoint": "tcp://127.0.0.1:2"}
        ans = c.add_engine(spec)
        self.assertEqual(ans, {"pod": "E", "dp_size": 1, "endpoints": ["tcp://127.0.0.1:1"]})
        st = self.d.stats()
        self.assertEqual([(s["pod"], s["state"]) for s in st["streams"]], [("E", "waiting")])
        with self.assertRaises(kvtier.Error) as e:
            c.add_engine(json.dumps(spec))
        self.assertIn("already subscribed", str(e.exception))
        with self.assertRaises(kvtier.Error) as e:
            c.add_engine(b'{"pod":"F"}')
        self.assertIn("'model'", str(e.exception))
        with self.assertRaises(TypeError):
            c.add_engine(["not", "a", "dict"])
        self.assertEqual(c.drop_engine("E")["unsubscribed"], True)

    def test_drop_model(self):
        c = self.client()
        c.report_events(batch("A", [stored([1, 2], TOK[:8])]))
        c.report_events(dict(batch("A", [stored([3, 4], TOK[:8])]), lora_name="ad"))
        c.report_events(dict(batch("A", [stored([1], TOK[:4])]), model="other/model"))
        self.assertEqual(c.drop_model("m"), {"model": "m", "namespaces": 2, "blocks": 4})
        self.assertEqual(c.query("m", TOK), [])
        self.assertEqual([p["pod"] for p in c.query_answer("other/model", TOK)["pods"]], ["A"])
        with self.assertRaises(kvtier.Error) as e:
            c.drop_model("m")
        self.assertIn("unknown model", str(e.exception))
        with self.assertRaises(ValueError):
            c.drop_model("")
        self.assertEqual(c.drop_model("other/model")["blocks"], 1)
        # the CLI, as documented in docs/cli.md
        p = subprocess.run([CLI, "drop-model", "--addr", "127.0.0.1:%d" % self.d.rpc_port, "m"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(p.returncode, 1, p)
        self.assertIn("unknown model", p.stderr)
        c.report_events(batch("A", [stored([1, 2], TOK[:8])]))
        p = subprocess.run([CLI, "drop-model", "--addr", "127.0.0.1:%d" % self.d.rpc_port, "m"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(p.returncode, 0, p)
        self.assertEqual(json.loads(p.stdout), {"model": "m", "namespaces": 1, "blocks": 2})

    def test_routed(self):
        c = self.client()
        c.report_events(batch("A", [stored([1, 2], TOK[:8])]))
        # the answer and the index's state are those of POST /v1/routed
        self.assertEqual(c.routed("m", "B", token_ids=TOK, ttl_ms=60000), {"blocks": len(TOK) // 4})
        top = c.query("m", TOK)[0]
        self.assertEqual((top["pod"], top["matched_blocks"], top["gpu"]), ("B", len(TOK) // 4,
                                                                          len(TOK) // 4))
        keys = kvtier.hash_tokens(TOK[:8], 4, cache_salt="t")
        self.assertEqual(c.routed("m", "C", block_hashes=keys, dp_rank=2, ttl_ms=300),
                         {"blocks": 2})
        self.assertEqual([(p["pod"], p["dp_rank"]) for p in c.query("m", TOK, cache_salt="t")],
                         [("C", 2)])
        end = time.time() + 10
        while c.query("m", TOK, cache_salt="t") and time.time() < end:
            time.sleep(0.05)
        self.assertEqual(c.query("m", TOK, cache_salt="t"), [])  # expired
        with self.assertRaises(kvtier.Error) as e:
            c.routed("m", "B", token_ids=TOK, ttl_ms=60001)
        self.assertIn("ttl_ms", str(e.exception))
        with self.assertRaises(ValueError):
            c.routed("m", "B")
        with self.assertRaises(ValueError):
            c.routed("m", "B", token_ids=TOK, block_hashes=keys)
        with self.assertRaises(ValueError):
            c.routed("m", "", token_ids=TOK)

    def test_drop_engine(self):
        c = self.client()
        for pod in ("A", "A2"):
            c.report_events(batch(pod, [stored([1, 2], TOK[:8])]))
            c.report_events(batch(pod, [stored([1, 2, 3], TOK[:12])], dp_rank=3))
        ans = c.drop_engine("A")
        s, http_ans = self.d.http("DELETE", "/v1/engines/A2")
        self.assertEqual(s, 200, http_ans)
        self.assertEqual(ans, dict(http_ans, pod="A"))
        self.assertEqual((ans["pod"], ans["dp_ranks"], ans["entries"]), ("A", 2, 5))
        self.assertEqual(c.query("m", TOK), [])
        # unknown pod: kvtier.Error with the server's message and status
        s, http_err = self.d.http("DELETE", "/v1/engines/A")
        self.assertEqual(s, 404)
        with self.assertRaises(kvtier.Error) as cm:
            c.drop_engine("A")
        self.assertEqual(cm.exception.status, ST_NOT_FOUND)
        self.assertIn(http_err["error"], str(cm.exception))
        self.assertIn("(404)", str(cm.exception))
        self.assertTrue(str(cm.exception).startswith(self.addr), str(cm.exception))
        self.assertServerError(cm.exception, fx.OP_ENGINE_DROP, fx.pstr("A"))
        c.ping()  # the connection survives error answers

    def test_server_errors_raise_with_the_servers_message(self):
        c = self.client()
        c.report_events(batch("A", [stored([1, 2, 3], TOK[:12])]))
        before = self.http_query(token_ids=TOK)
        bad = [
            "{not json",
            batch("A", [{"type": "BlockStored", "block_hashes": [5], "token_ids": [1, 2, 3],
                         "block_size": 4}]),
            batch("A", [stored([5], TOK[:8], bs=8)]),  # block size differs from the model's
            dict(batch("A", []), bogus=1),
            {"pod": 5, "model": "m", "events": []},
            {"pod": "A", "model": "m", "events": {}},
            {"pod": "", "model": "m", "events": []},
            batch("A", [dict(stored([5], TOK[:4]), extra_keys=[None, None])]),  # one per block
            '{"pod":"A","model":"m","events":[{"type":"BlockStored",'
            '"block_hashes":[18446744073709551616],"token_ids":[]}]}',
            '{"pod":"A","model":"m","events":[]} trailing',
        ]
        for body in bad:
            s, http_err = self.http_events(body)
            self.assertEqual(s, 400, (body, http_err))
            with self.assertRaises(kvtier.Error, msg=repr(body)) as cm:
                c.report_events(body)
            e = cm.exception
            self.assertLess(e.status, 0)
            self.assertNotIn(e.status, (ST_IO, ST_TIMEOUT, ST_CLOSED))
            self.assertEqual(e.message, str(e))
            self.assertIn(http_err["error"], str(e), body)
            self.assertIn("(400)", str(e))
            self.assertNotIn("\n", str(e))
            raw = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
            self.assertServerError(e, fx.OP_EVENTS, raw.encode())
        c.ping()
        self.assertEqual(self.http_query(token_ids=TOK), before,
                         "a refused batch changed the index")
        self.assertEqual(c.query("m", TOK), before["pods"])

    def test_local_argument_errors(self):
        c = self.client()
        for args in [("m", [1, -2]), ("m", [2**32]), ("", TOK), ("x" * 256, TOK), ("m\0", TOK)]:
            with self.assertRaises(ValueError, msg=repr(args[0][:10])):
                c.query(*args)
        with self.assertRaises(TypeError):
            c.query("m", TOK, pods="A")
        with self.assertRaises(TypeError):
            c.query(5, TOK)
        with self.assertRaises(ValueError):
            c.query_keys("m", [2**64])
        with self.assertRaises(ValueError):
            c.query("m", TOK, pods=[""])
        with self.assertRaises(TypeError):
            c.report_events([1, 2])
        with self.assertRaises(ValueError):
            kvtier.hash_tokens(TOK, 0)
        with self.assertRaises(ValueError):
            kvtier.Client(self.addr, timeout=0)
        c.ping()
        with self.assertRaises(kvtier.Error) as cm:
            kvtier.Client("no-port-here")
        self.assertEqual(cm.exception.status, ST_INVAL)
        self.assertIn("bad address", str(cm.exception))
        with self.assertRaises(kvtier.Error) as cm:
            kvtier.Client("127.0.0.1:%d" % free_port())
        self.assertEqual(cm.exception.status, ST_IO)
        self.assertIn("connect", str(cm.exception))

    def test_close_and_context_manager(self):
        http_open = self.wait_stats(lambda s: True)["connections"]["open"]
        with kvtier.Client(self.addr, timeout=5.0) as c:
            self.assertIs(c.__enter__(), c)
            c.ping()
            self.wait_stats(lambda s: s["connections"]["open"] == http_open + 1)
            self.assertIn("127.0.0.1", repr(c))
        # closed on exit: calls raise, the server sees the connection go
        with self.assertRaises(kvtier.Error) as cm:
            c.ping()
        self.assertEqual(cm.exception.status, ST_CLOSED)
        for call in (lambda: c.query("m", TOK), lambda: c.stats(), lambda: c.drop_engine("A"),
                     lambda: c.report_events(batch("A", [])), lambda: c.query_keys("m", [1])):
            with self.assertRaises(kvtier.Error):
                call()
        self.assertIn("closed", repr(c))
        c.close()  # idempotent
        self.wait_stats(lambda s: s["connections"]["open"] == http_open)
        # close() without the context manager; an exception inside `with` still closes
        d = kvtier.Client(self.addr, timeout=5.0)
        d.ping()
        d.close()
        with self.assertRaises(kvtier.Error):
            d.ping()
        with self.assertRaises(RuntimeError):
            with kvtier.Client(self.addr, timeout=5.0) as e:
                raise RuntimeError("inside")
        with self.assertRaises(kvtier.Error):
            e.ping()
        self.wait_stats(lambda s: s["connections"]["open"] == http_open)
        # lazy: nothing connects before the first call
        f = kvtier.Client("127.0.0.1:%d" % free_port(), lazy=True, timeout=1.0)
        with self.assertRaises(kvtier.Error) as cm:
            f.ping()
        self.assertEqual(cm.exception.status, ST_IO)
        f.close()

    def test_many_pods_and_long_names(self):
        # More pods than a reader's first scratch (64) and an answer over the client's 64 KiB
        # read chunk: 300 pods with 255-byte names, each holding blocks 0..1.
        c = self.client()
        names = ["%03d" % i + "n" * 252 for i in range(300)]
        for n in names:
            c.report_events(batch(n, [stored([1, 2], TOK[:8])], model="many"))
        for _ in range(3):
            got = c.query("many", TOK)
            self.assertEqual(len(got), 300, "query answered %d of the 300 pods" % len(got))
            self.assertTrue(sorted(p["pod"] for p in got) == names, "pod names differ")
            self.assertEqual({(p["matched_blocks"], p["gpu"]) for p in got}, {(2, 2)})
            self.assertEqual(got, self.http_query(model="many", token_ids=TOK)["pods"])

    def test_threads_share_a_client(self):
        c = self.client()
        self.setup_pods(c)
        want = {n: self.http_query(token_ids=TOK[:n])["pods"] for n in range(0, 33, 4)}
        errors = []

        def run(seed):
            try:
                for i in range(60):
                    n = 4 * ((seed + i) % 9)
                    if c.query("m", TOK[:n]) != want[n]:
                        errors.append("thread %d query %d: wrong answer" % (seed, i))
            except Exception as e:  # reported below
                errors.append("thread %d: %r" % (seed, e))

        threads = [threading.Thread(target=run, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(errors, [])

    def test_reconnects_after_a_restart(self):
        c = self.client()
        self.setup_pods(c)
        port = self.d.rpc_port
        self.assertEqual(self.d.stop(), 0)
        with self.assertRaises(kvtier.Error) as cm:
            c.query("m", TOK)
        self.assertEqual(cm.exception.status, ST_IO)
        self.d.cleanup()
        self.d = fx.Daemon(BIN, "--rpc-listen", "127.0.0.1:%d" % port)
        self.assertEqual(self.d.rpc_port, port)
        self.assertEqual(c.query("m", TOK), [])  # a fresh, empty daemon
        c.report_events(batch("A", [stored([1], TOK[:4])]))
        self.assertEqual(c.query("m", TOK), self.http_query(token_ids=TOK)["pods"])


class TestTimeout(unittest.TestCase):
    def test_socket_that_never_answers(self):
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(8)
        addr = "127.0.0.1:%d" % ls.getsockname()[1]
        try:
            t0 = time.monotonic()
            with self.assertRaises(kvtier.Error) as cm:
                kvtier.Client(addr, timeout=0.3)
            took = time.monotonic() - t0
            self.assertEqual(cm.exception.status, ST_TIMEOUT)
            self.assertTrue(0.28 <= took < 1.3, took)
            c = kvtier.Client(addr, timeout=0.3, lazy=True)
            t0 = time.monotonic()
            with self.assertRaises(kvtier.Error) as cm:
                c.query("m", TOK)
            took = time.monotonic() - t0
            self.assertEqual(cm.exception.status, ST_TIMEOUT)
            self.assertIn("timed out", str(cm.exception))
            self.assertTrue(0.28 <= took < 1.3, took)
            c.close()
        finally:
            ls.close()


class TestAuth(Base):
    token = "s3cret"

    def test_token(self):
        anon = self.client()
        owner = self.client(token="s3cret")
        owner.report_events(batch("A", [stored([1, 2], TOK[:8])]))
        self.assertEqual(anon.query("m", TOK), self.http_query(token_ids=TOK)["pods"])
        self.assertEqual(len(anon.query("m", TOK)), 1)
        self.assertIn("index", anon.stats())  # reads need no token
        ev = batch("B", [stored([1], TOK[:4])])
        with self.assertRaises(kvtier.Error) as cm:
            anon.report_events(ev)
        self.assertIn("token", str(cm.exception))
        self.assertIn("(401)", str(cm.exception))
        self.assertLess(cm.exception.status, 0)
        self.assertServerError(cm.exception, fx.OP_EVENTS,
                               json.dumps(ev, separators=(",", ":")).encode())
        with self.assertRaises(kvtier.Error) as cm:
            anon.drop_engine("A")
        self.assertIn("(401)", str(cm.exception))
        self.assertEqual(len(anon.query("m", TOK)), 1, "a refused call changed the index")
        with self.assertRaises(kvtier.Error) as cm:
            kvtier.Client(self.addr, token="wrong", timeout=5.0)
        self.assertIn("hello refused", str(cm.exception))
        self.assertIn("(401)", str(cm.exception))
        self.assertEqual(owner.drop_engine("A")["dp_ranks"], 1)
        self.assertEqual(anon.query("m", TOK), [])


# ---- cache salt ------------------------------------------------------------------------------

SALT_A = "tenant-a"
SALT_U = "m\u00fcller-\u79df\u6237"  # UTF-8, 15 bytes
SALT_255 = "s" * 255


def salted_body(model, tokens, salt, lora="", pods=(), kind=2):
    """A QUERY body of kind 2 (token ids with a cache salt; salt as bytes or str)."""
    b = fx.pstr(model) + fx.pstr(lora) + bytes([kind, 0, 0, 0]) + fx.pstr(salt)
    b += struct.pack("<I", len(tokens)) + b"".join(struct.pack("<I", t) for t in tokens)
    return b + struct.pack("<I", len(pods)) + b"".join(fx.pstr(p) for p in pods)


def salted(event, salt):
    event = dict(event)
    event["cache_salt"] = salt
    return event


class TestCacheSalt(Base):
    # What each query sees once setup_salted() ran: {salt: [(pod, matched), ...]} for TOK.
    SEES = {
        SALT_A: [("S", 4)],
        SALT_U: [("T", 3)],
        None: [("U", 2), ("E", 1), ("N", 1)],
    }

    def setup_salted(self):
        """Over HTTP POST /v1/events: S stores 4 blocks salted tenant-a; T 3 blocks (CPU)
        salted SALT_U; U 2 blocks without a salt, N 1 with "cache_salt": null and E 1 with "".
        U also stores, with salt tenant-a, the first block of another prompt."""
        other = [7] * 4
        for b in [batch("S", [salted(stored([1, 2, 3, 4], TOK[:16]), SALT_A)]),
                  batch("T", [salted(stored([11, 12, 13], TOK[:12], medium="CPU"), SALT_U)]),
                  batch("U", [stored([21, 22], TOK[:8]), salted(stored([29], other), SALT_A)]),
                  batch("N", [salted(stored([31], TOK[:4]), None)]),
                  batch("E", [salted(stored([41], TOK[:4]), "")])]:
            s, ans = self.http_events(b)
            self.assertEqual(s, 200, ans)
            self.assertEqual(ans["applied"], len(b["events"]), ans)

    def rpc(self, sock, op, body, req_id=9):
        sock.sendall(fx.frame(op, req_id, body))
        h, b = fx.read_frame(sock)
        self.assertEqual(h["req_id"], req_id)
        return h, b

    def rpc_query(self, sock, toks, salt, pods=()):
        """The answer to a raw QUERY frame: kind 2 with a salt, kind 0 without."""
        body = (salted_body("m", toks, salt, pods=pods) if salt
                else fx.query_body("m", tokens=toks, pods=pods))
        h, b = self.rpc(sock, fx.OP_QUERY, body)
        self.assertFalse(h["flags"] & fx.F_ERROR, b)
        return fx.parse_query_answer(b)

    def cli(self, *args, check=True):
        p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=30)
        if check:
            self.assertEqual(p.returncode, 0, (args, p.stderr))
            self.assertEqual(p.stderr, "")
        return p

    def assertSees(self, pods, want):
        self.assertEqual(sorted((p["pod"], p["matched_blocks"]) for p in pods), sorted(want))

    def test_isolation_everywhere(self):
        """Each salt, and no salt, sees only its own prefixes over HTTP, the binding, raw
        RPC frames and the CLI, which all give the same answer."""
        self.setup_salted()
        c = self.client()
        sock = self.d.connect()
        try:
            for salt in [None, "", SALT_A, SALT_U, "tenant-b", "tenant-a ", SALT_255]:
                for n in (0, 3, 4, 8, 13, 16, 32):
                    toks = TOK[:n]
                    body = {"token_ids": toks}
                    if salt is not None:
                        body["cache_salt"] = salt
                    want = self.http_query(**body)
                    self.assertEqual(c.query_answer("m", toks, cache_salt=salt), want, (salt, n))
                    self.assertEqual(c.query("m", toks, cache_salt=salt), want["pods"])
                    if salt:
                        self.assertEqual(c.query("m", toks, cache_salt=salt.encode()),
                                         want["pods"])
                    self.assertEqual(self.rpc_query(sock, toks, salt), want, (salt, n))
                    if n == 32:
                        self.assertSees(want["pods"], self.SEES.get(salt or None, []))
                args = ["query", "--addr", self.addr, "--model", "m", "--tokens",
                        ",".join(map(str, TOK))]
                if salt is not None:
                    args += ["--cache-salt", salt]
                p = self.cli(*args)
                self.assertEqual(json.loads(p.stdout), self.http_query(
                    token_ids=TOK, **({"cache_salt": salt} if salt is not None else {})))
            # null is no salt; a pod filter and a LoRA apply within the salt
            self.assertEqual(self.http_query(token_ids=TOK, cache_salt=None),
                             self.http_query(token_ids=TOK))
            self.assertSees(self.http_query(token_ids=TOK, cache_salt=SALT_A, pods=["U"])["pods"],
                            [])
            self.assertSees(c.query("m", TOK, cache_salt=SALT_A, pods=["S", "U"]), [("S", 4)])
            self.assertSees(self.rpc_query(sock, TOK, SALT_A, pods=["S"])["pods"], [("S", 4)])
            self.assertEqual(c.query("m", TOK, lora="ad1", cache_salt=SALT_A), [])
            # U's salted block of the other prompt: found with the salt only
            self.assertSees(c.query("m", [7] * 4, cache_salt=SALT_A), [("U", 1)])
            self.assertSees(c.query("m", [7] * 4), [])
        finally:
            sock.close()

    def test_salted_keys(self):
        """hash_tokens(cache_salt=), kvtier hash --cache-salt and an independent
        implementation agree, and the server stored exactly those keys."""
        self.setup_salted()
        c = self.client()
        for salt in (SALT_A, SALT_U):
            keys = kvtier.hash_tokens(TOK, 4, cache_salt=salt)
            self.assertEqual(len(keys), 8)
            if xxhash is not None:
                self.assertEqual(keys, seq_keys(TOK, 4, salt.encode()))
            self.assertEqual(kvtier.hash_tokens(TOK, 4, cache_salt=salt.encode()), keys)
            p = self.cli("hash", "--block-size", "4", "--cache-salt", salt, "--tokens",
                         ",".join(map(str, TOK)))
            self.assertEqual(json.loads(p.stdout)["seq"], keys)
            plain = kvtier.hash_tokens(TOK, 4)
            self.assertTrue(all(a != b for a, b in zip(keys, plain)))
            got = self.http_query(block_hashes=keys)
            self.assertSees(got["pods"], self.SEES[salt])
            self.assertEqual(c.query_keys_answer("m", keys), got)
            self.assertEqual(c.query_keys("m", keys), c.query("m", TOK, cache_salt=salt))
            p = self.cli("query", "--addr", self.addr, "--model", "m", "--keys",
                         ",".join(map(str, keys)))
            self.assertEqual(json.loads(p.stdout), got)
        self.assertEqual(kvtier.hash_tokens(TOK, 4, cache_salt=""), kvtier.hash_tokens(TOK, 4))
        self.assertEqual(kvtier.hash_tokens(TOK, 4, cache_salt=None), kvtier.hash_tokens(TOK, 4))
        self.assertEqual(kvtier.hash_tokens(TOK[:3], 4, cache_salt=SALT_A), [])
        self.assertSees(self.http_query(block_hashes=kvtier.hash_tokens(TOK, 4))["pods"],
                        self.SEES[None])
        # "" and null next to block_hashes are no salt
        keys = kvtier.hash_tokens(TOK, 4, cache_salt=SALT_A)
        for salt in ("", None):
            self.assertSees(self.http_query(block_hashes=keys, cache_salt=salt)["pods"],
                            [("S", 4)])

    def test_refusals(self):
        """Every malformed salt is refused with a clear reason (HTTP 400, RPC error answer,
        ValueError/TypeError, CLI exit 2) and nothing changes."""
        self.setup_salted()
        # 12 entries: S 4, T 3, U 3, N 1, E 1 (stats refresh every --stats-period)
        before = self.wait_stats(lambda st: st["index"]["entries"] == 12)["index"]
        answers = {salt: self.http_query(token_ids=TOK, cache_salt=salt)
                   for salt in (None, SALT_A, SALT_U)}
        c = self.client()
        keys = kvtier.hash_tokens(TOK, 4, cache_salt=SALT_A)
        bad_http = [
            ({"block_hashes": keys, "cache_salt": SALT_A}, "block_hashes"),
            ({"token_ids": TOK, "cache_salt": "x" * 256}, "255 bytes"),
            ({"token_ids": TOK, "cache_salt": "a\u0000b"}, "NUL"),
            ({"token_ids": TOK, "cache_salt": 5}, "string or null"),
            ({"token_ids": TOK, "cache_salt": ["tenant-a"]}, "string or null"),
            ({"token_ids": TOK, "cache_salt": {"a": 1}}, "string or null"),
            ({"token_ids": TOK, "cache_salt": True}, "string or null"),
        ]
        for body, why in bad_http:
            body["model"] = "m"
            s, ans = self.d.http("POST", "/v1/query", body)
            self.assertEqual(s, 400, (body, ans))
            self.assertIn("cache_salt", ans["error"])
            self.assertIn(why, ans["error"])
        s, ans = self.d.http("POST", "/v1/query", '{"model":"m","cache_salt":"abc')
        self.assertEqual(s, 400, ans)
        s, ans = self.d.http("POST", "/v1/query",
                             b'{"model":"m","token_ids":[1],"cache_salt":"\xff\xfe"}')
        self.assertEqual(s, 400, ans)
        # RPC: every malformed kind-2 body gets an error answer; the connection stays usable
        sock = self.d.connect()
        try:
            good = salted_body("m", TOK, SALT_A)
            bad_rpc = [
                (salted_body("m", TOK, ""), "empty cache salt"),
                (salted_body("m", TOK, b"a\0b"), "salt"),
                (salted_body("m", TOK, "x" * 256), "salt"),
                (good + b"\0", "trailing"),
                (good[:len(good) - 5], ""),
                (fx.pstr("m") + fx.pstr("") + bytes([2, 0, 0, 0]) + b"\x08\x00ten", "salt"),
                (fx.pstr("m") + fx.pstr("") + bytes([2, 0, 1, 0]) + fx.pstr("s") + bytes(8),
                 "pad"),
                (fx.pstr("m") + fx.pstr("") + bytes([3, 0, 0, 0]) + bytes(8), "kind"),
            ]
            for body, why in bad_rpc:
                h, b = self.rpc(sock, fx.OP_QUERY, body)
                self.assertTrue(h["flags"] & fx.F_ERROR, (body, b))
                status, http, msg = fx.parse_error(b)
                self.assertEqual((status, http), (ST_INVAL, 400), msg)
                self.assertIn(why, msg)
            self.assertSees(self.rpc_query(sock, TOK, SALT_A)["pods"], [("S", 4)])
        finally:
            sock.close()
        # the binding refuses locally
        for salt, exc in [("x" * 256, ValueError), ("a\0b", ValueError), (5, TypeError),
                          (["a"], TypeError)]:
            with self.assertRaises(exc, msg=repr(salt)[:20]):
                c.query("m", TOK, cache_salt=salt)
            with self.assertRaises(exc, msg=repr(salt)[:20]):
                kvtier.hash_tokens(TOK, 4, cache_salt=salt)
        # the CLI: usage errors, one line, nothing on stdout
        for args in [["--cache-salt", SALT_A, "--keys", "1,2"],
                     ["--cache-salt", "x" * 256, "--tokens", "1,2"],
                     ["--cache-salt", "a", "--cache-salt", "b", "--tokens", "1"]]:
            p = self.cli("query", "--addr", self.addr, "--model", "m", *args, check=False)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertEqual(p.stdout, "")
            self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
            self.assertTrue(p.stderr.startswith("kvtier: query: "), p.stderr)
        c.ping()
        for salt, want in answers.items():
            self.assertEqual(self.http_query(token_ids=TOK, cache_salt=salt), want,
                             "a refused query changed the index")
        self.assertEqual(self.d.stats()["index"]["entries"], before["entries"])

    def test_doc_examples(self):
        """The cache-salt worked example of docs/api.md and the salted kvtier query lines of
        docs/cli.md, run as written against the daemon."""
        steps = doc_block(os.path.join(REPO, "docs", "api.md"), "api-cache-salt")
        self.assertGreaterEqual(len(steps), 8)
        for i in range(0, len(steps), 2):
            req, ans = steps[i], steps[i + 1]
            if req.startswith("$ kvtier "):
                p = self.cli(*shlex.split(req)[2:])
                self.assertEqual(p.stdout.rstrip("\n"), ans, req)
                continue
            method, path, body = req.split(" ", 2)
            status, text = ans.split(" ", 1)
            s, got, _ = self.d.http(method, path, body, raw=True)
            self.assertEqual((s, got.decode()), (int(status), text), req)
        lines = doc_block(os.path.join(REPO, "docs", "cli.md"), "cli-query-salted")
        self.assertGreaterEqual(len(lines), 6)
        for i in range(0, len(lines), 2):
            p = self.cli(*shlex.split(lines[i])[2:], "--addr", self.addr)
            self.assertEqual(p.stdout.rstrip("\n"), lines[i + 1], lines[i])


def doc_block(path, name):
    """The lines of the fenced block of @path marked `<!-- doc-test: @name -->` (the marker
    tests/integration/test_docs.py accounts for: it lists this test as the block's runner)."""
    with open(path, encoding="utf-8") as f:
        text = f.read().split("\n")
    marker = "<!-- doc-test: %s -->" % name
    for i, line in enumerate(text):
        if line == marker and i + 1 < len(text) and text[i + 1].startswith("```"):
            end = text.index("```", i + 2)
            return text[i + 2:end]
    raise AssertionError("%s: no code block marked %r" % (path, marker))


# ---- LoRA keys (--lora-keys) ------------------------------------------------------------------

LORA_A, LORA_B = "adapter-a", "adapter-b"


def dynamo_keys(tokens, bs, lora, salt=""):
    """Keys Dynamo's router computes for a LoRA request, from the independent reference
    (hash_vectors.py: XXH3 with seed 1337 + XXH3(lora, 0) per block, chain 1337; a salt
    adds its seed to block 0's, kvtier's rule)."""
    return hv.hash_seq(tokens, bs, salt=salt.encode(), lora=lora.encode())[1]


class LoraBase(Base):
    """Stores, over HTTP POST /v1/events, TOK's 8 blocks (block size 4) as: L under LORA_A,
    S under LORA_A with cache salt tenant-a, P under LORA_A in two events (the second
    continues the first through its parent), B in the base model; and Dynamo's published
    prompt (tokens 1..12) as D under LORA_A."""

    def setUp(self):
        if xxhash is None:
            self.skipTest("the xxhash module is needed for the reference keys")
        super().setUp()
        h = list(range(1, 9))
        for b in [batch("L", [stored(h, TOK, lora=LORA_A)]),
                  batch("S", [salted(stored(h, TOK, lora=LORA_A), "tenant-a")]),
                  batch("P", [stored(h[:3], TOK[:12])], lora_name=LORA_A),
                  batch("P", [stored(h[3:], TOK[12:], parent=3)], lora_name=LORA_A),
                  batch("B", [stored(h, TOK)]),
                  batch("D", [stored([91, 92, 93], list(range(1, 13)), lora=LORA_A)])]:
            s, ans = self.http_events(b)
            self.assertEqual(s, 200, ans)
            self.assertEqual((ans["applied"], ans["orphans"]), (len(b["events"]), 0), ans)

    def sees(self, lora=None, **body):
        body.setdefault("model", "m")
        if lora is not None:
            body["lora_name"] = lora
        return sorted((p["pod"], p["matched_blocks"]) for p in self.http_query(**body)["pods"])

    def assertSees(self, pods, want):
        self.assertEqual(sorted((p["pod"], p["matched_blocks"]) for p in pods), sorted(want))


class TestLoraKeysDynamo(LoraBase):
    flags = ("--lora-keys", "dynamo")

    def test_dynamo_keys_and_token_queries_find_lora_blocks(self):
        c = self.client()
        keys = dynamo_keys(TOK, 4, LORA_A)
        std = seq_keys(TOK, 4)
        self.assertTrue(all(a != b for a, b in zip(keys, std)))
        # a Dynamo frontend's keys, as they are: the LoRA's blocks, in the LoRA's namespace
        self.assertEqual(self.sees(LORA_A, block_hashes=keys), [("L", 8), ("P", 8)])
        self.assertSees(c.query_keys("m", keys, lora=LORA_A), [("L", 8), ("P", 8)])
        self.assertEqual(self.sees(None, block_hashes=keys), [])  # namespaces stay apart
        self.assertEqual(self.sees(LORA_B, block_hashes=keys), [])
        self.assertEqual(self.sees(LORA_A, block_hashes=std), [])
        # token queries with the LoRA hash Dynamo's way: HTTP, RPC (binding), CLI
        want = self.http_query(token_ids=TOK, lora_name=LORA_A)
        self.assertEqual(sorted((p["pod"], p["matched_blocks"]) for p in want["pods"]),
                         [("L", 8), ("P", 8)])
        self.assertEqual(c.query_answer("m", TOK, lora=LORA_A), want)
        for n in (0, 3, 4, 13, 16):
            self.assertEqual(c.query_answer("m", TOK[:n], lora=LORA_A),
                             self.http_query(token_ids=TOK[:n], lora_name=LORA_A))
        p = subprocess.run([CLI, "query", "--addr", self.addr, "--model", "m", "--lora", LORA_A,
                            "--tokens", ",".join(map(str, TOK))],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        self.assertEqual(json.loads(p.stdout), want)
        self.assertEqual(self.sees(LORA_B, token_ids=TOK), [])
        # the client side computes the same keys: binding and CLI
        self.assertEqual(kvtier.hash_tokens(TOK, 4, lora=LORA_A, lora_keys="dynamo"), keys)
        self.assertEqual(kvtier.hash_tokens(TOK, 4, lora=LORA_A.encode(), lora_keys="dynamo"),
                         keys)
        p = subprocess.run([CLI, "hash", "--block-size", "4", "--lora", LORA_A, "--lora-keys",
                            "dynamo", "--tokens", ",".join(map(str, TOK))],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        self.assertEqual(json.loads(p.stdout)["seq"], keys)
        # Dynamo's prompt of test_hash.c's pinned vector (tokens 1..12, block size 4)
        pinned = [11381080598872079209, 17518568667535815909, 12857975441449519705]
        self.assertEqual(dynamo_keys(list(range(1, 13)), 4, LORA_A), pinned)
        self.assertEqual(self.sees(LORA_A, block_hashes=pinned), [("D", 3)])
        self.assertEqual(self.sees(LORA_A, token_ids=list(range(1, 13))), [("D", 3)])

    def test_salt_and_lora(self):
        """kvtier's rule: block 0 takes the salt's seed plus the LoRA term."""
        c = self.client()
        keys = dynamo_keys(TOK, 4, LORA_A, "tenant-a")
        self.assertEqual(self.sees(LORA_A, block_hashes=keys), [("S", 8)])
        self.assertEqual(self.sees(LORA_A, token_ids=TOK, cache_salt="tenant-a"), [("S", 8)])
        self.assertSees(c.query("m", TOK, lora=LORA_A, cache_salt="tenant-a"), [("S", 8)])
        self.assertEqual(kvtier.hash_tokens(TOK, 4, cache_salt="tenant-a", lora=LORA_A,
                                            lora_keys="dynamo"), keys)
        self.assertEqual(self.sees(LORA_A, token_ids=TOK, cache_salt="tenant-b"), [])
        self.assertEqual(self.sees(LORA_A, block_hashes=dynamo_keys(TOK, 4, LORA_A)),
                         [("L", 8), ("P", 8)])

    def test_base_model_unchanged(self):
        c = self.client()
        std = seq_keys(TOK, 4)
        self.assertEqual(dynamo_keys(TOK, 4, ""), std)
        self.assertEqual(self.sees(None, token_ids=TOK), [("B", 8)])
        self.assertEqual(self.sees(None, block_hashes=std), [("B", 8)])
        self.assertSees(c.query("m", TOK), [("B", 8)])
        self.assertSees(c.query("m", TOK, lora=""), [("B", 8)])
        self.assertEqual(kvtier.hash_tokens(TOK, 4, lora_keys="dynamo"), std)
        self.assertEqual(kvtier.hash_tokens(TOK, 4, lora="", lora_keys="dynamo"), std)


class TestLoraKeysNamespace(LoraBase):
    """The default daemon: a LoRA's keys are the standard's in its own namespace."""

    def test_dynamo_keys_do_not_match(self):
        c = self.client()
        keys = dynamo_keys(TOK, 4, LORA_A)
        std = seq_keys(TOK, 4)
        self.assertEqual(self.sees(LORA_A, block_hashes=keys), [])
        self.assertEqual(c.query_keys("m", keys, lora=LORA_A), [])
        self.assertEqual(self.sees(LORA_A, block_hashes=std), [("L", 8), ("P", 8)])
        self.assertEqual(self.sees(LORA_A, token_ids=TOK), [("L", 8), ("P", 8)])
        self.assertSees(c.query("m", TOK, lora=LORA_A), [("L", 8), ("P", 8)])
        self.assertEqual(self.sees(LORA_A, token_ids=TOK, cache_salt="tenant-a"), [("S", 8)])
        self.assertEqual(self.sees(None, token_ids=TOK), [("B", 8)])
        self.assertEqual(kvtier.hash_tokens(TOK, 4, lora=LORA_A), std)
        self.assertEqual(kvtier.hash_tokens(TOK, 4, lora=LORA_A, lora_keys="namespace"), std)
        self.assertEqual(self.sees(LORA_A, block_hashes=[11381080598872079209]), [])

    def test_hash_tokens_refusals(self):
        for kw, exc in [({"lora_keys": "Dynamo"}, ValueError), ({"lora_keys": None}, ValueError),
                        ({"lora": "x" * 256, "lora_keys": "dynamo"}, ValueError),
                        ({"lora": "a\0b", "lora_keys": "dynamo"}, ValueError),
                        ({"lora": 5, "lora_keys": "dynamo"}, TypeError)]:
            with self.assertRaises(exc, msg=repr(kw)[:40]):
                kvtier.hash_tokens(TOK, 4, **kw)


class TestServerLimits(Base):
    flags = ("--max-query-tokens", "64")

    def test_query_error_message(self):
        c = self.client()
        toks = list(range(100))
        s, http_err = self.d.http("POST", "/v1/query", {"model": "m", "token_ids": toks})
        self.assertEqual(s, 413, http_err)
        with self.assertRaises(kvtier.Error) as cm:
            c.query("m", toks)
        http, msg = self.assertServerError(cm.exception, fx.OP_QUERY,
                                           fx.query_body("m", tokens=toks))
        self.assertEqual(http, 413)
        self.assertTrue(msg)
        with self.assertRaises(kvtier.Error) as cm:
            c.query_keys("m", list(range(65)))
        self.assertServerError(cm.exception, fx.OP_QUERY, fx.query_body("m", keys=list(range(65))))
        self.assertEqual(c.query("m", toks[:64]), [])
        c.ping()


# ---- tiers: the engine's data plane and the block API ------------------------------------------

OP_BLOCK_PUT, OP_BLOCK_GET = 0x47, 0x48
ST_TOO_BIG, ST_EXISTS, ST_UNSUPPORTED = -103, -201, -601
TBLOCK = 64 * 1024  # --block-bytes


def disk_unsupported(tmpdir):
    """Why kvtierd cannot keep an NVMe store in tmpdir here (io_uring refused, a file system
    without O_DIRECT), or None."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    ring = libc.syscall(425, 2, params)  # io_uring_setup: 425 on every architecture but alpha
    if ring < 0:
        return "io_uring refused: %s" % os.strerror(ctypes.get_errno())
    os.close(ring)
    with tempfile.NamedTemporaryFile(dir=tmpdir) as f:
        try:
            fcntl.fcntl(f.fileno(), fcntl.F_SETFL, os.O_DIRECT)  # what the disk store does
        except OSError as e:
            return "O_DIRECT refused in %s: %s" % (tmpdir, e)
    return None


def block_bytes(key, n=TBLOCK):
    """Block key's bytes: a pattern of its own."""
    return (struct.pack("<Q", key * 0x9E3779B97F4A7C15 % 2**64) * (n // 8 + 1))[:n]


def block_put_body(model, key, data, durable=0, lora=""):
    return (fx.pstr(model) + fx.pstr(lora) + struct.pack("<QB3xI", key, durable, len(data)) +
            data)


class TestTiers(Base):
    """A kvtierd with tiers: --ram-bytes 1MiB of --block-bytes 64KiB slots, an NVMe store in a
    temp dir on /tmp (where this machine allows one), the data plane on --rpc-unix."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvtier_tiers_", dir="/tmp")
        self.sock = os.path.join(self.tmp.name, "k.sock")
        self.nodisk = disk_unsupported(self.tmp.name)
        self.flags = ["--ram-bytes", "1MiB", "--block-bytes", "64KiB", "--rpc-unix", self.sock]
        if self.nodisk is None:
            self.flags += ["--disk-path", os.path.join(self.tmp.name, "disk"),
                           "--disk-bytes", "8MiB"]
        super().setUp()

    def tearDown(self):
        try:
            super().tearDown()
        finally:
            self.tmp.cleanup()

    def engine(self):
        """A client on the Unix socket, as an engine's connector is."""
        c = kvtier.Client("unix:" + self.sock, timeout=5.0)
        self.clients.append(c)
        return c

    def ram(self):
        return self.d.stats()["tiers"]["ram"]

    def wait_ram(self, **want):
        """Polls GET /v1/stats until tiers.ram has the counts want (pinned=..., reserved=...)."""
        self.wait_stats(lambda s: all(s["tiers"]["ram"][k] == v for k, v in want.items()))

    def test_attach_reserve_commit_pin(self):
        c = self.engine()
        with self.assertRaises(kvtier.Error) as cm:
            self.client().attach()  # TCP carries no descriptor
        self.assertEqual(cm.exception.status, ST_INVAL)
        self.assertIn("Unix socket", str(cm.exception))
        with c.attach() as arena:
            self.assertEqual((arena.block_bytes, arena.nslots), (TBLOCK, 16))
            self.assertGreaterEqual(arena.slot_bytes, TBLOCK)
            self.assertEqual(arena.slot_bytes % 4096, 0)
            self.assertLessEqual(arena.slot_off + arena.nslots * arena.slot_bytes, arena.map_bytes)
            self.assertEqual(arena.disk_slots > 0, self.nodisk is None)
            self.assertEqual(len(arena.mmap), arena.map_bytes)
            stats = self.d.stats()["tiers"]
            self.assertEqual((stats["block_bytes"], stats["slot_bytes"], stats["ram"]["slots"]),
                             (arena.block_bytes, arena.slot_bytes, arena.nslots))
            keys = [0x1001, 0x1002, 0x1003, 0x1004]
            lens = [TBLOCK, 1000, 0, TBLOCK]  # 0: block_bytes
            self.assertEqual(c.lookup("tm", keys), [])
            slots, evicted = c.reserve("tm", keys)
            self.assertEqual(evicted, [])
            self.assertEqual(len(set(slots)), 4)
            self.assertTrue(all(0 <= s < arena.nslots for s in slots), slots)
            self.assertEqual(c.reserve("tm", keys), ([None] * 4, []))  # reserved already
            self.wait_ram(reserved=4)
            self.assertEqual(c.lookup("tm", keys), [])  # not before the commit
            for k, s, n in zip(keys, slots, lens):
                arena.slot(s, n or TBLOCK)[:] = block_bytes(k, n or TBLOCK)
            self.assertEqual(c.commit("tm", keys, lens=lens), 4)
            self.assertEqual(c.commit("tm", keys), 0)
            self.wait_ram(reserved=0)
            self.assertEqual(c.lookup("tm", keys), ["ram"] * 4)
            self.assertEqual(c.lookup("tm", [keys[0], 0xDEAD, keys[2]]), ["ram"])
            self.assertEqual(c.lookup("tm", keys, lora="other"), [])
            pins = c.pin("tm", keys + [0xDEAD])
            self.assertEqual(pins[4], (None, 0))
            for k, (s, n), want in zip(keys, pins, lens):
                self.assertEqual(n, want or TBLOCK)
                self.assertEqual(bytes(arena.slot(s, n)), block_bytes(k, n), "key %#x" % k)
            self.wait_ram(pinned=4)
            # the block API reads what was written through the mapping
            self.assertEqual(self.client().block_get("tm", keys[1]), block_bytes(keys[1], 1000))
            with self.assertRaises(kvtier.Error) as cm:
                c.block_delete("tm", keys[0])
            self.assertEqual(cm.exception.status, ST_EXISTS)
            self.assertEqual(c.unpin("tm", keys), 4)
            self.assertEqual(c.unpin("tm", keys), 0)
            self.wait_ram(pinned=0)
            # reserve, then give the slot back
            (s,), _ = c.reserve("tm", [0x1005])
            self.assertIsNotNone(s)
            self.assertEqual(c.commit("tm", [0x1005], ok=False), 1)
            self.assertEqual(c.lookup("tm", [0x1005]), [])
            self.assertEqual(c.prefetch("tm", keys), 0)  # all in RAM: nothing to read
            # a view keeps the mapping: close() refuses until it is released
            view = arena.slot(slots[0])
            with self.assertRaises(BufferError):
                arena.close()
            view.release()
        self.assertTrue(arena.closed)
        with self.assertRaises(ValueError):
            arena.memory
        arena.close()  # idempotent

    def test_block_round_trip(self):
        c = self.client()  # the block API works over TCP too
        data = block_bytes(0x2001)
        c.block_put("tm", 0x2001, data)
        c.block_put("tm", 0x2001, data)  # a key already held: kept
        self.assertEqual(c.block_get("tm", 0x2001), data)
        self.assertEqual(self.engine().lookup("tm", [0x2001]), ["ram"])
        c.block_put("tm", 0x2002, bytearray(b"\x01\x02\x03"), lora="ad1")
        c.block_put("tm", 0x2003, memoryview(data)[:777])
        self.assertEqual(c.block_get("tm", 0x2002, lora="ad1"), b"\x01\x02\x03")
        self.assertEqual(c.block_get("tm", 0x2003), data[:777])
        # a buffer shorter than the block: the binding asks again with the block's size
        c._get_cap = 16
        self.assertEqual(c.block_get("tm", 0x2001), data)
        self.assertEqual(c._get_cap, TBLOCK)
        c.block_delete("tm", 0x2001)
        for fn in (c.block_get, c.block_delete):
            with self.assertRaises(kvtier.Error) as cm:
                fn("tm", 0x2001)
            self.assertEqual(cm.exception.status, ST_NOT_FOUND)
            self.assertIn("(404)", str(cm.exception))
        with self.assertRaises(kvtier.Error) as cm:
            c.block_get("other-model", 0x2003)
        self.assertEqual(cm.exception.status, ST_NOT_FOUND)
        with self.assertRaises(kvtier.Error) as cm:
            c.block_get("tm", 0x2002)  # the base model's namespace, not ad1's
        self.assertEqual(cm.exception.status, ST_NOT_FOUND)
        # larger than a slot: the server's message and status, exactly; nothing stored
        big = block_bytes(0x2004, TBLOCK + 1)
        with self.assertRaises(kvtier.Error) as cm:
            c.block_put("tm", 0x2004, big)
        self.assertEqual(cm.exception.status, ST_TOO_BIG)
        http, _ = self.assertServerError(cm.exception, OP_BLOCK_PUT,
                                         block_put_body("tm", 0x2004, big))
        self.assertEqual(http, 413)
        with self.assertRaises(kvtier.Error):
            c.block_get("tm", 0x2004)
        # HTTP sees what the binding stored
        s, body, _ = self.d.http("GET", "/v1/blocks/%d?model=tm" % 0x2003, raw=True)
        self.assertEqual((s, body), (200, data[:777]))

    def test_durable_put(self):
        c = self.client()
        data = block_bytes(0x3001)
        if self.nodisk is not None:
            with self.assertRaises(kvtier.Error) as cm:
                c.block_put("tm", 0x3001, data, durable=True)
            self.assertEqual(cm.exception.status, ST_UNSUPPORTED)
            self.skipTest("no NVMe store here: %s" % self.nodisk)
        c.block_put("tm", 0x3001, data, durable=True)
        self.wait_stats(lambda s: s["tiers"]["disk"]["used"] == 1)
        # other blocks push it out of RAM; PIN reads it back from NVMe, byte-exact
        e = self.engine()
        for k in range(0x4000, 0x4000 + 64):
            if e.lookup("tm", [0x3001]) == ["disk"]:
                break
            c.block_put("tm", k, block_bytes(k))
        self.assertEqual(e.lookup("tm", [0x3001]), ["disk"])
        with e.attach() as arena:
            [(slot, n)] = e.pin("tm", [0x3001])
            self.assertEqual(n, TBLOCK)
            self.assertEqual(bytes(arena.slot(slot)), data)
            self.assertEqual(e.lookup("tm", [0x3001]), ["ram"])
            self.assertEqual(e.unpin("tm", [0x3001]), 1)
        self.assertEqual(c.block_get("tm", 0x3001), data)

    def test_closed_connection_releases_pins(self):
        keys = [0x5001, 0x5002]
        w = self.client()
        for k in keys:
            w.block_put("tm", k, block_bytes(k))
        e = self.engine()
        self.assertTrue(all(s is not None for s, _ in e.pin("tm", keys)))
        (slot,), _ = e.reserve("tm", [0x5003])
        self.assertIsNotNone(slot)
        self.wait_ram(pinned=2, reserved=1)
        with self.assertRaises(kvtier.Error) as cm:
            w.block_delete("tm", keys[0])
        self.assertEqual(cm.exception.status, ST_EXISTS)
        e.close()  # the engine goes away holding its pins and a reservation
        self.wait_ram(pinned=0, reserved=0)
        w.block_delete("tm", keys[0])
        self.assertEqual(w.lookup("tm", [0x5003]), [])

    def test_argument_errors(self):
        c = self.engine()
        for call, exc in [(lambda: c.lookup("tm", []), ValueError),
                          (lambda: c.lookup("", [1]), ValueError),
                          (lambda: c.lookup("tm", [-1]), ValueError),
                          (lambda: c.reserve("tm", ["x"]), ValueError),
                          (lambda: c.pin("tm", [1], lora="x" * 256), ValueError),
                          (lambda: c.commit("tm", [1, 2], lens=[0]), ValueError),
                          (lambda: c.block_put("tm", 1, b""), ValueError),
                          (lambda: c.block_put("tm", 1, "text"), TypeError),
                          (lambda: c.block_get("tm", "1"), TypeError),
                          (lambda: c.block_get("tm", 2**64), ValueError),
                          (lambda: c.block_delete("tm", True), TypeError)]:
            with self.assertRaises(exc):
                call()
        with c.attach() as arena:
            for bad in (-1, arena.nslots, None):
                with self.assertRaises(IndexError):
                    arena.slot(bad)
            with self.assertRaises(ValueError):
                arena.slot(0, TBLOCK + 1)
        c.close()
        with self.assertRaises(kvtier.Error) as cm:
            c.lookup("tm", [1])
        self.assertEqual(cm.exception.status, ST_CLOSED)


class TestNoTiers(Base):
    def test_tier_calls_unsupported(self):
        c = self.client()
        for call in (lambda: c.lookup("tm", [1]), lambda: c.block_get("tm", 1),
                     lambda: c.block_put("tm", 1, b"x"), lambda: c.prefetch("tm", [1])):
            with self.assertRaises(kvtier.Error) as cm:
                call()
            self.assertEqual(cm.exception.status, ST_UNSUPPORTED)
            self.assertIn("(501)", str(cm.exception))
        c.ping()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_python_client.py path/to/kvtierd")
    BIN = sys.argv.pop(1)
    CLI = os.path.join(os.path.dirname(BIN), "kvtier")  # the kvtier CLI is built beside it
    # A sanitizer runtime preloaded for this interpreter (to load an ASan libkvtier) is not
    # kvtierd's: the daemon links its own.
    os.environ.pop("LD_PRELOAD", None)
    try:
        sys.stderr.write("libkvtier: %s\n" % kvtier.library_path())
    except kvtier.Error as e:
        sys.exit("cannot load libkvtier (set KVTIER_LIB or build build/lib): %s" % e)
    unittest.main(verbosity=2)
