"""Starts a real kvtierd for integration tests and talks to it (stdlib only).

Run under Debian's /usr/bin/python3. The daemon binds 127.0.0.1 on ephemeral
ports in a temp dir; its log is printed when a test fails.
"""

import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

MAGIC = 0x3154564B
HDR = struct.Struct("<IBBHQII")  # magic, version, op, flags, req_id, body_len, reserved
OP_HELLO, OP_PING, OP_QUERY, OP_EVENTS, OP_ENGINE_DROP, OP_STATS = 0x01, 0x02, 0x10, 0x20, 0x21, 0x30
OP_ROUTED = 0x24
F_RESPONSE, F_ERROR = 1, 2


class Daemon:
    def __init__(self, binary, *flags, token=None, env=None, data_dir=None):
        """data_dir: an existing --data-dir to reuse (a restart); default a new one here."""
        self.dir = tempfile.TemporaryDirectory(prefix="kvtierd_test_")
        self.log_path = os.path.join(self.dir.name, "kvtierd.log")
        self.data_dir = data_dir or os.path.join(self.dir.name, "data")
        self.ipc_dir = os.path.join(self.data_dir, "ipc")  # the default --ipc-dir
        args = [binary, "--http-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
                "--data-dir", self.data_dir, "--workers", "2"]
        if token is not None:
            path = os.path.join(self.dir.name, "token")
            with open(path, "w") as f:
                f.write(token + "\n")
            args += ["--auth-token-file", path]
        args += list(flags)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=None if env is None else dict(os.environ, **env))
        line = self.proc.stdout.readline()
        if not line.startswith("kvtierd listening"):
            self.stop()
            raise RuntimeError("kvtierd did not start: %r\n%s" % (line, self.read_log()))
        parts = dict(kv.split("=") for kv in line.split()[2:])
        self.http_port = int(parts["http"])
        self.rpc_port = int(parts["rpc"])

    def read_log(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def open_fds(self):
        """How many file descriptors the daemon has open (accepted sockets among them)."""
        return len(os.listdir("/proc/%d/fd" % self.proc.pid))

    def status_kib(self, field):
        """A memory figure of the daemon from /proc/<pid>/status, in KiB (VmRSS, VmHWM...)."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise KeyError(field)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def cleanup(self):
        self.dir.cleanup()

    # ---- HTTP ----
    def http(self, method, path, body=None, headers=None, raw=False):
        c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        try:
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            if raw:
                return r.status, data, dict(r.getheaders())
            try:
                return r.status, json.loads(data) if data else None
            except ValueError:
                return r.status, data.decode("utf-8", "replace")
        finally:
            c.close()

    def stats(self):
        s, body = self.http("GET", "/v1/stats")
        assert s == 200, (s, body)
        return body

    # ---- raw sockets ----
    def connect(self, port=None, timeout=10):
        s = socket.create_connection(("127.0.0.1", port or self.rpc_port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s


def wait_for(pred, timeout=10.0, what="condition"):
    """pred() until it returns something true (returned); AssertionError after @timeout s."""
    end = time.time() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.time() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


def binary_from_argv(script):
    """The kvtierd path a test script takes as argv[1] (removed, for unittest), and whether
    that binary runs under ASan or TSan."""
    if len(sys.argv) < 2:
        sys.exit("usage: %s path/to/kvtierd" % script)
    path = sys.argv.pop(1)
    with open(path, "rb") as f:
        image = f.read()
    return path, b"__asan_init" in image or b"__tsan_init" in image


def free_port():
    """A loopback TCP port nobody listened on a moment ago (for endpoints a test names)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def frame(op, req_id, body=b"", flags=0, magic=MAGIC, version=1, reserved=0, body_len=None):
    return HDR.pack(magic, version, op, flags, req_id,
                    len(body) if body_len is None else body_len, reserved) + body


def pstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<H", len(b)) + b


class Rpc:
    """One RPC connection (TCP or the Unix socket): requests answered in order here."""

    def __init__(self, sock):
        self.s = sock
        self.next_id = 1

    def call(self, op, body=b""):
        rid = self.next_id
        self.next_id += 1
        self.s.sendall(frame(op, rid, body))
        h, b = read_frame(self.s)
        assert (h["op"], h["req_id"]) == (op, rid), (h, op, rid)
        return h, b

    def ok(self, op, body=b""):
        h, b = self.call(op, body)
        assert h["flags"] == F_RESPONSE, (op, parse_error(b) if h["flags"] & 2 else b)
        return b

    def err(self, op, body=b""):
        """The error answer of a request that must fail: (status, http, message)."""
        h, b = self.call(op, body)
        assert h["flags"] == F_RESPONSE | F_ERROR, (op, h, b[:64])
        return parse_error(b)


def query_body(model, tokens=None, keys=None, lora="", pods=()):
    if keys is not None:
        b = pstr(model) + pstr(lora) + bytes([1, 0, 0, 0]) + struct.pack("<I", len(keys))
        b += b"".join(struct.pack("<Q", k) for k in keys)
    else:
        b = pstr(model) + pstr(lora) + bytes([0, 0, 0, 0]) + struct.pack("<I", len(tokens))
        b += b"".join(struct.pack("<I", t) for t in tokens)
    b += struct.pack("<I", len(pods)) + b"".join(pstr(p) for p in pods)
    return b


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def read_frame(sock):
    h = HDR.unpack(recv_exact(sock, HDR.size))
    body = recv_exact(sock, h[5]) if h[5] else b""
    return {"magic": h[0], "version": h[1], "op": h[2], "flags": h[3], "req_id": h[4]}, body


def parse_error(body):
    status, http_status, n = struct.unpack_from("<iHH", body)
    return status, http_status, body[8:8 + n].decode()


def parse_query_answer(body):
    bs, nb, npods = struct.unpack_from("<III", body)
    off, pods = 12, []
    for _ in range(npods):
        (n,) = struct.unpack_from("<H", body, off)
        name = body[off + 2:off + 2 + n].decode()
        off += 2 + n
        rank, m, g, c, d = struct.unpack_from("<IIIII", body, off)
        (score,) = struct.unpack_from("<d", body, off + 20)
        off += 28
        pods.append({"pod": name, "dp_rank": rank, "matched_blocks": m, "gpu": g, "cpu": c,
                     "disk": d, "score": score})
    assert off == len(body), "trailing bytes in a query answer"
    return {"block_size": bs, "num_blocks": nb, "pods": pods}


def parse_prometheus(text):
    """Strict-enough parser of the text exposition format: returns {(name, labels): value}."""
    import re
    samples, types = {}, {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')
    for ln in text.split("\n"):
        if ln == "":
            continue
        if ln.startswith("# HELP ") or ln.startswith("# TYPE "):
            parts = ln.split(" ", 3)
            if parts[1] == "TYPE":
                assert parts[3] in ("counter", "gauge", "histogram", "summary", "untyped"), ln
                types[parts[2]] = parts[3]
            continue
        assert not ln.startswith("#"), "bad comment line: " + ln
        m = line_re.match(ln)
        assert m, "bad sample line: " + ln
        labels = ()
        if m.group(3):
            pos, items = 0, []
            while pos < len(m.group(3)):
                lm = label_re.match(m.group(3), pos)
                assert lm, "bad labels: " + ln
                items.append((lm.group(1), lm.group(2)))
                pos = lm.end()
            labels = tuple(items)
        v = m.group(4)
        value = float("inf") if v == "+Inf" else float(v)
        samples[(m.group(1), labels)] = value
    return samples, types


def stored(hashes, tokens, bs=4, parent=None, medium=None, lora=None):
    """A BlockStored event with vLLM's field names."""
    e = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
         "token_ids": tokens, "block_size": bs}
    if medium is not None:
        e["medium"] = medium
    if lora is not None:
        e["lora_name"] = lora
    return e


class SidecarCase(unittest.TestCase):
    """A test case with a kvtierd that has tiers, beside an engine: a Unix socket (self.sock),
    a data dir and, where this machine runs one (self.nodisk is None) and DISK asks for it, an
    NVMe store that admits every block. The engine-connector tests set BIN from argv."""

    BIN = None
    PREFIX = "kvt_sidecar_"
    SLOTS = 16          # arena slots
    BLOCK = 64 * 1024   # --block-bytes
    DISK = True

    def setUp(self):
        from test_python_client import disk_unsupported
        self.tmp = tempfile.TemporaryDirectory(prefix=self.PREFIX, dir="/tmp")
        self.addCleanup(self.tmp.cleanup)
        self.sock = os.path.join(self.tmp.name, "k.sock")
        self.data_dir = os.path.join(self.tmp.name, "data")
        self.nodisk = disk_unsupported(self.tmp.name) if self.DISK else "no store asked"
        self.flags = ["--ram-bytes", str(self.SLOTS * self.BLOCK), "--block-bytes",
                      str(self.BLOCK), "--rpc-unix", self.sock, "--pod", "engine"]
        if self.nodisk is None:
            self.flags += ["--disk-path", os.path.join(self.tmp.name, "disk"), "--disk-bytes",
                           "8MiB", "--disk-admit", "always"]
        self.d = self.daemon()

    def daemon(self):
        """Starts kvtierd with self.flags on the same data dir (a restart after the first)."""
        d = Daemon(SidecarCase.BIN, *self.flags, data_dir=self.data_dir)
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        return d
