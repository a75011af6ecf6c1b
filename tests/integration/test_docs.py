#!/usr/bin/python3
"""Runs the code blocks of README.md and docs/*.md, so that the docs cannot drift.

Usage: test_docs.py BUILD_DIR CMAKE KVTIERD KVTIER KVTIER_BENCH

Every fenced block of those files is accounted for here, in one of three ways:

- RUN: a block marked `<!-- doc-test: NAME -->` (the line before its fence; invisible when
  rendered) is run by the function registered under NAME below, as the doc writes it.
  What may change is only what a test must change: ports (kvtierd on 127.0.0.1 on
  ephemeral ports, `localhost:7421` becomes its port), hosts other than loopback
  (127.0.0.1 instead), `build/bin/` (this build's binaries), `/opt/kvtier` (a temporary
  install of this build), and, in sanitizer builds, the compiler flags.
  A session (`$ command` lines, each followed by the output it prints) must print exactly
  those lines; reads of state kvtierd updates asynchronously (metrics, a query after
  events went over ZMQ) are repeated until they do, for a bounded number of tries.
- ELSEWHERE: a marked block another test runs; that test must name the marker.
- NOT_RUN: an unmarked block, listed with its file, the start of its first line and the
  reason it is not run (synopses, formulas, fragments, engines or clusters this machine
  does not have, benchmarks of minutes).

The test fails when a marked block disappears, a marker has no runner, an unmarked block
is not listed, or a NOT_RUN entry matches no block.

Runs kvtierd and curl on loopback only. Needs curl, and /usr/bin/python3 with python3-zmq
(the stand-in engine of docs/quickstart.md) and python3-xxhash (the keys against Dynamo's
hashing); skips (77) without them.
"""

import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import kvtierd_fixture as fx  # noqa: E402

MARKER = re.compile(r"^<!-- doc-test: ([a-z0-9-]+) -->$")
POLL_TRIES = 100  # reads of asynchronously updated state, 0.1 s apart
POLL_SLEEP = 0.1

# Blocks another test runs: marker -> that test (which must contain the marker's name).
ELSEWHERE = {
    "api-cache-salt": "tests/integration/test_python_client.py",
    "cli-query-salted": "tests/integration/test_python_client.py",
    "protocol-xfer-pin": "tests/unit/test_proto_xfer.c",
    "api-transfer": "tests/unit/test_xfer_json.c",
    "api-transfer-answer": "tests/unit/test_xfer_json.c",
}

SYNOPSIS = ("a usage synopsis with placeholders, not a command "
            "(`kvtier help <subcommand>` prints it whole)")
C_FRAGMENT = ("a fragment of a router (its tokens, clients and callbacks are the reader's); "
              "tests/integration/test_client.c makes these calls against a real kvtierd")
# Unmarked blocks: (file, start of the block's first line, why it is not run).
NOT_RUN = [
    ("docs/connectors.md", "PYTHONHASHSEED=0 PYTHONPATH=/opt/kvtier",
     "vLLM itself is not on this machine; test_vllm_core.py runs the spec's logic against "
     "kvtierd, and test_vllm_spec.py the spec in vLLM where it imports"),
    ("docs/connectors.md", "PYTHONPATH=/opt/kvtier/lib/kvtier/python python -m sglang",
     "SGLang itself is not on this machine; test_sglang_core.py runs the backend's logic "
     "against kvtierd, and test_sglang_hicache.py the backend in SGLang where it imports"),
    ("docs/connectors.md", "build/bin/kvtier-cuda-check --socket",
     "needs a GPU; test_cuda_check.py runs it (exit 77 without one) and checks its refusals"),
    ("docs/architecture.md", "   kvtierd (server/main.c)",
     "a diagram; tests/integration/test_layout.py checks the include directions it draws"),
    ("docs/api.md", "lora_seed = 1337 + XXH3_64bits_withSeed",
     "a formula; test_hash.c checks it against tests/fixtures/hash_vectors.py --lora, which "
     "computes it independently, and docs/cli.md's cli-hash-lora block prints its keys"),
    ("docs/api.md", "seed_0 = XXH3_64bits_withSeed(salt bytes, 1337)",
     "a formula; test_hash.c's salted LoRA vectors (hash_vectors.py --lora --cache-salt) check "
     "it"),
    ("docs/client.md", "uint64_t keys[64];",
     "a fragment (tokens, n, c and r come from the surrounding program); test_client.c calls "
     "kvt_client_hash_tokens_lora and kvt_client_query_keys against kvtierd"),
    ("docs/api.md", "seed = XXH3_64bits_withSeed(enc(key_1)",
     "a formula; test_event_msgpack's test_extra_keys_json_agrees pins its bytes and checks that "
     "the JSON and msgpack decoders give the same seeds"),
    ("docs/performance.md", "build/bin/kvtier-bench json [--seconds",
     "a usage synopsis; tests/integration/test_bench_smoke.sh runs `kvtier-bench json` briefly"),
    ("README.md", "make run     #",
     "`make run` holds kvtierd in the foreground on the fixed default ports until Ctrl-C, and "
     "`make test` is this test suite (after installing Debian packages)"),
    ("README.md", "cmake --preset debug &&",
     "the build system's own commands: other build trees, fuzzing for minutes, benchmarks, "
     "reformatting the sources"),
    ("docs/quickstart.md", "make test     #", "`make test` is this test suite"),
    ("docs/quickstart.md", "build/bin/kvtier-bench index --trace",
     "replays the full conversation trace (minutes); tests/integration/test_bench_smoke.sh runs "
     "`kvtier-bench index` on tests/fixtures/mini_trace.jsonl"),
    ("docs/quickstart.md", "build/bin/kvtier-bench rpc --seconds 3",
     "a benchmark of tens of seconds with redis-benchmark; tests/integration/test_bench_smoke.sh "
     "runs `kvtier-bench rpc` with short parameters"),
    ("docs/quickstart.md", "build/bin/kvtier-bench latency",
     "a benchmark of about 35 s; tests/integration/test_bench_latency.sh runs a short one"),
    ("docs/performance.md", "build/bin/kvtier-bench index --trace",
     "replays the full conversation trace ten times (minutes); test_bench_smoke.sh runs the "
     "subcommand on tests/fixtures/mini_trace.jsonl"),
    ("docs/performance.md", "(ulimit -v 14000000; build/bin/kvtier-bench index --scale",
     "a benchmark of about 90 s and 5 GB of memory; tests/integration/test_bench_scale.py "
     "runs the scale mode at 100,000 entries"),
    ("docs/performance.md", "build/bin/kvtier-bench rpc --seconds 3",
     "a benchmark of tens of seconds with redis-benchmark; test_bench_smoke.sh runs a short one"),
    ("docs/performance.md", "build/bin/kvtier-bench tiers",
     "a benchmark of about a minute against fio and RocksDB; test_bench_smoke.sh runs "
     "`kvtier-bench tiers --quick`"),
    ("docs/performance.md", "build/bin/kvtier-bench latency",
     "two benchmarks of about 35 s each; test_bench_latency.sh runs a short one"),
    ("docs/api.md", "salt_seed = XXH3_64bits_withSeed",
     "a formula; tests/unit/test_hash.c and test_cli_hash.sh check it against an independent "
     "implementation"),
    ("docs/cli.md", "kvtier hash --block-size B", SYNOPSIS),
    ("docs/cli.md", '{"block_size":B,', "the shape of an output, with placeholders"),
    ("docs/cli.md", "local_i = XXH3_64bits_withSeed",
     "a formula; test_cli_hash.sh checks `kvtier hash` against tests/fixtures/hash_vectors.py"),
    ("docs/cli.md", "kvtier query [--addr A]", SYNOPSIS),
    ("docs/cli.md", "kvtier events [--addr A] FILE", SYNOPSIS),
    ("docs/cli.md", "kvtier subscribe [--addr A] FILE", SYNOPSIS),
    ("docs/cli.md", "kvtier drop-model [--addr A] MODEL", SYNOPSIS),
    ("docs/cli.md", "kvtier stats [--addr A]", SYNOPSIS),
    ("docs/cli.md", "kvtier ping [--addr A]", SYNOPSIS),
    ("docs/client.md", "kvt_client_opts_t o;", C_FRAGMENT),
    ("docs/client.md", "uint32_t tokens[] = {...};", C_FRAGMENT),
    ("docs/client.md", "kvt_client_query_salted(c,", C_FRAGMENT),
    ("docs/client.md", "static void on_answer(", C_FRAGMENT),
    ("docs/client.md", "kvt_client_t *sidecars[3]", C_FRAGMENT),
    ("docs/client.md", "kvt_client_arena_t a;",
     "a fragment of an engine's connector (its keys, blocks and counts are the reader's); "
     "tests/integration/test_client.c makes these calls against a kvtierd with tiers"),
    ("docs/client.md", "import kvtier   # PYTHONPATH",
     "a fragment (token_ids, the events list, keys and blocks are the reader's); "
     "tests/integration/test_python_client.py makes every one of these calls"),
    ("docs/configuration.md", "static const kvt_cfg_opt_t opts[]",
     "a fragment of the internal config API (common/config.h, not installed); "
     "tests/unit/test_config.c covers kvt_cfg_load()"),
    ("docs/benchmarks.md", "build/bin/kvtier-bench replay --mode live",
     "`make demo`'s measured output (about 75 s); tests/integration/test_live_mode.py runs live "
     "mode on 300 requests of the trace"),
    ("docs/deployment.md", "vllm serve", "needs vLLM and a GPU"),
    ("docs/benchmarks.md", "vllm bench serve --model MODEL",
     "needs vLLM or AIPerf, a model and a GPU; test_gen_replay.sh checks the file's keys, "
     "order and ids per line"),
    ("docs/deployment.md", "python -m sglang.launch_server", "needs SGLang and a GPU"),
    ("docs/deployment.md", "cmake --preset release && cmake --build",
     "installs into /usr as root and starts a systemd service; test_install.sh installs into "
     "a temporary prefix and checks the unit, the config and the installed kvtierd"),
    ("docs/deployment.md", "                    proxy (router)",
     "a diagram of the prefill/decode flow, not a command"),
    ("docs/deployment.md", "curl -s -X POST vllm-decode-0.vllm:7421/v1/transfer",
     "two sidecars on two hosts (a pull on the decode side, then a push); "
     "test_transfer_daemon.py and test_transfer_faults.py run both between two kvtierd on "
     "loopback"),
]


# ---- the blocks ---------------------------------------------------------------------------------
class Block:
    def __init__(self, path, line, lang, name, lines):
        self.path = path  # relative to the repository
        self.line = line  # of the opening fence, from 1
        self.lang = lang
        self.name = name  # the doc-test marker, or None
        self.lines = lines

    @property
    def text(self):
        return "\n".join(self.lines) + "\n"

    def __repr__(self):
        return "%s:%d" % (self.path, self.line)


def doc_files():
    return ["README.md"] + sorted(os.path.relpath(p, REPO)
                                  for p in glob.glob(os.path.join(REPO, "docs", "*.md")))


def read_blocks():
    blocks = []
    for rel in doc_files():
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
            lines = f.read().split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            end = i + 1
            while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
                end += 1
            if end == len(lines):
                raise AssertionError("%s:%d: unterminated code block" % (rel, i + 1))
            mk = MARKER.match(lines[i - 1]) if i > 0 else None
            indent = len(m.group(1))
            body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1:end]]
            blocks.append(Block(rel, i + 1, m.group(2), mk.group(1) if mk else None, body))
            i = end + 1
        for n, ln in enumerate(lines):
            if ln.startswith("<!-- doc-test") and not MARKER.match(ln):
                raise AssertionError("%s:%d: malformed marker %r" % (rel, n + 1, ln))
    return blocks


# ---- sessions: `$ command` lines and the output each prints -------------------------------------
def incomplete(cmd):
    """True while @cmd continues on the next line: an open quote or a trailing backslash."""
    if cmd.endswith("\\"):
        return True
    try:
        shlex.split(cmd, comments=False)
    except ValueError:
        return True
    return False


def take_command(lines, i, first):
    """The command starting with @first (line i - 1) and the index after it: continuation
    lines while a quote is open or a line ends in a backslash, and a heredoc's body."""
    cmd = first
    while incomplete(cmd) and i < len(lines):
        cmd += "\n" + lines[i]
        i += 1
    hd = re.search(r"<<-?\s*(['\"]?)(\w+)\1", cmd)
    if hd:
        while i < len(lines) and lines[i] != hd.group(2):
            cmd += "\n" + lines[i]
            i += 1
        assert i < len(lines), "heredoc %s not closed" % hd.group(2)
        cmd += "\n" + lines[i]
        i += 1
    return cmd, i


def parse_session(block):
    """[(command, [expected output lines])] of a `$ ` session."""
    steps, i, lines = [], 0, block.lines
    while i < len(lines):
        assert lines[i].startswith("$ "), "%r: line %d is not a command: %r" % (
            block, i + 1, lines[i])
        cmd, i = take_command(lines, i + 1, lines[i][2:])
        out = []
        while i < len(lines) and not lines[i].startswith("$ "):
            out.append(lines[i])
            i += 1
        steps.append((cmd, out))
    return steps


def parse_script(block):
    """The commands of a block of commands without prompts or outputs (comment lines and
    blank lines dropped)."""
    cmds, i, lines = [], 0, block.lines
    while i < len(lines):
        if lines[i].strip() == "" or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        cmd, i = take_command(lines, i + 1, lines[i])
        cmds.append(cmd)
    return cmds


def substitute(text, subs):
    for old, new in subs:
        text = text.replace(old, new)
    return text


class Shell:
    """Runs commands one by one as a shell session would: each sees the exit status, the
    exported variables and the working directory the previous one left."""

    def __init__(self, ctx, cwd, env=None):
        self.ctx = ctx
        self.cwd = cwd
        self.env = dict(ctx.env, **(env or {}))
        self.rc = 0
        self.state = tempfile.mkdtemp(prefix="sh_", dir=ctx.tmp)

    def run(self, cmd, timeout=300):
        envf, cwdf = os.path.join(self.state, "env"), os.path.join(self.state, "cwd")
        script = "(exit %d)\n%s\n__rc=$?\nenv -0 >'%s'\npwd >'%s'\nexit $__rc\n" % (
            self.rc, cmd, envf, cwdf)
        p = subprocess.run(["/bin/sh", "-c", script], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env,
                           timeout=timeout)
        self.rc = p.returncode
        with open(envf, "rb") as f:
            pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
        self.env = {k.decode(): v.decode() for k, v in pairs if k != b"__rc"}
        with open(cwdf) as f:
            self.cwd = f.read().rstrip("\n")
        out = p.stdout.decode("utf-8", "replace")
        if out.endswith("\n"):
            out = out[:-1]
        return p.returncode, out.split("\n") if out else []

    def session(self, steps, subs=(), poll=lambda cmd: False):
        """Runs (command, expected) steps with @subs applied to both; a step whose command
        @poll accepts is repeated until its output matches."""
        for cmd, want in steps:
            real = substitute(cmd, subs)
            want = [substitute(w, subs) for w in want]
            tries = POLL_TRIES if poll(cmd) else 1
            for _ in range(tries):
                rc, got = self.run(real)
                if got == want:
                    break
                time.sleep(POLL_SLEEP)
            if got != want:
                raise AssertionError("`%s` printed:\n%s\nthe doc shows:\n%s" % (
                    real, "\n".join("  | " + g for g in got) or "  (nothing)",
                    "\n".join("  | " + w for w in want) or "  (nothing)"))

    def script(self, cmds, subs=()):
        """Runs commands that print nothing the doc shows; each must exit 0."""
        outs = []
        for cmd in cmds:
            real = substitute(cmd, subs)
            rc, out = self.run(real)
            if rc != 0:
                raise AssertionError("`%s` exited %d:\n%s" % (real, rc, "\n".join(out)))
            outs.append(out)
        return outs


# ---- the context: binaries, a temporary install, daemons ----------------------------------------
free_port = fx.free_port


def cache_value(build, key):
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                m = re.match(r"^%s:[A-Z]*=(.*)$" % re.escape(key), line.rstrip("\n"))
                if m:
                    return m.group(1)
    except OSError:
        pass
    return ""


class Ctx:
    def __init__(self, build, cmake, kvtierd, kvtier, bench, tmp):
        self.build, self.cmake, self.tmp = build, cmake, tmp
        self.kvtierd, self.kvtier, self.bench = kvtierd, kvtier, bench
        # The docs call the binaries `kvtier...` (on PATH) or `build/bin/kvtier...`.
        self.bindir = os.path.join(tmp, "bin")
        os.mkdir(self.bindir)
        for name, path in (("kvtierd", kvtierd), ("kvtier", kvtier), ("kvtier-bench", bench)):
            os.symlink(os.path.abspath(path), os.path.join(self.bindir, name))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_")}
        self.env["PATH"] = self.bindir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
        self.cc = cache_value(build, "CMAKE_C_COMPILER") or "cc"
        self.sanflags = ""
        if cache_value(build, "KVT_ASAN").upper() in ("ON", "TRUE", "1"):
            self.sanflags = "-fsanitize=address,undefined"
        elif cache_value(build, "KVT_TSAN").upper() in ("ON", "TRUE", "1"):
            self.sanflags = "-fsanitize=thread"
        self.prefix = None
        self.daemons = []

    def dir(self, name):
        path = tempfile.mkdtemp(prefix=name + "_", dir=self.tmp)
        return path

    def build_bin_subs(self):
        return [("build/bin/", self.bindir + "/")]

    def cc_subs(self, first_arg):
        """In a sanitizer build the doc's `cc FIRST_ARG` needs the build's compiler and flags."""
        if not self.sanflags:
            return []
        return [("cc " + first_arg, "%s %s %s" % (self.cc, self.sanflags, first_arg))]

    def install(self):
        """This build installed into a temporary prefix (once); the doc's /opt/kvtier/lib
        becomes its library directory."""
        if self.prefix is None:
            prefix = os.path.join(self.tmp, "prefix")
            p = subprocess.run([self.cmake, "--install", self.build, "--prefix", prefix],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if p.returncode != 0:
                raise AssertionError("cmake --install failed:\n" + p.stdout.decode())
            pcs = glob.glob(os.path.join(prefix, "**", "kvtier-index.pc"), recursive=True)
            assert len(pcs) == 1, pcs
            self.libdir = os.path.dirname(os.path.dirname(pcs[0]))
            self.prefix = prefix
        return [("/opt/kvtier/lib", self.libdir), ("/opt/kvtier", self.prefix)]

    def daemon(self, *flags):
        d = fx.Daemon(self.kvtierd, *flags)
        self.daemons.append(d)
        return d

    def stop_daemons(self, failed):
        bad = []
        for d in self.daemons:
            rc = d.stop()
            if failed or rc != 0:
                sys.stderr.write("---- kvtierd log (exit %s) ----\n%s\n" % (rc, d.read_log()))
            if rc != 0:
                bad.append(rc)
            d.cleanup()
        self.daemons = []
        if bad and not failed:
            raise AssertionError("kvtierd exited %s on SIGTERM, not 0" % bad)


def daemon_subs(d):
    return [("localhost:7421", "localhost:%d" % d.http_port)]


def post_ok(d, path, body):
    s, ans = d.http("POST", path, body)
    assert s == 200, (path, body, s, ans)
    return ans


def start_process(ctx, cmd, env_extra, cwd):
    """Starts a documented kvtierd command line through the shell (exec'ed, so SIGTERM
    reaches kvtierd) and waits for its "kvtierd listening" line."""
    log = open(os.path.join(cwd, "kvtierd.log"), "w")
    p = subprocess.Popen(["/bin/sh", "-c", "exec " + cmd], stdout=subprocess.PIPE, stderr=log,
                         cwd=cwd, env=dict(ctx.env, **env_extra), text=True)
    line = p.stdout.readline()
    if not line.startswith("kvtierd listening"):
        p.kill()
        p.wait()
        log.close()
        with open(log.name) as f:
            raise AssertionError("`%s` did not start: %r\n%s" % (cmd, line, f.read()))
    ports = dict(kv.split("=") for kv in line.split()[2:])
    return p, log, int(ports["http"])


class Http:
    """The HTTP helpers of kvtierd_fixture.Daemon for a kvtierd this test did not start."""
    http = fx.Daemon.http
    stats = fx.Daemon.stats

    def __init__(self, port):
        self.http_port = port


def stop_process(p, log):
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    p.stdout.close()
    log.close()
    if rc != 0:
        with open(log.name) as f:
            raise AssertionError("kvtierd exited %d on SIGTERM:\n%s" % (rc, f.read()))


def loopback_env(ctx, name):
    """KVTIER_* variables that move a documented kvtierd command line onto ephemeral
    loopback ports and a temp data dir (variables beat a config file, flags beat them)."""
    return {"KVTIER_HTTP_LISTEN": "127.0.0.1:0", "KVTIER_RPC_LISTEN": "127.0.0.1:0",
            "KVTIER_DATA_DIR": os.path.join(ctx.dir(name), "data")}


def parse_conf(text):
    """{key: [values]} of a config file, by the rules of docs/configuration.md."""
    conf = {}
    for n, raw in enumerate(text.split("\n")):
        line = raw.strip()
        if line == "" or line.startswith("#"):
            continue
        key, sep, val = line.partition("=")
        assert sep, "line %d: no '='" % (n + 1)
        key, val = key.strip().replace("_", "-"), val.lstrip()
        if val.startswith('"'):
            out, i = "", 1
            esc = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
            while val[i] != '"':
                if val[i] == "\\":
                    out += esc[val[i + 1]]
                    i += 2
                else:
                    out += val[i]
                    i += 1
            rest = val[i + 1:].strip()
            assert rest == "" or rest.startswith("#"), "line %d: text after the quote" % (n + 1)
            val = out
        else:
            val = re.split(r"(^|\s)#", val, maxsplit=1)[0].rstrip()
        conf.setdefault(key, []).append(val)
    return conf


def dynamo_seq_hashes(tokens, block_size):
    """Dynamo's KV-router sequence hashes (lib/llm/src/kv_router: compute_block_hash_for_seq,
    then compute_seq_hash_for_block): XXH3-64 seed 1337 over each full block's u32 LE
    tokens, chained over [parent, local] as u64 LE with the same seed."""
    import struct
    import xxhash
    local = [xxhash.xxh3_64_intdigest(struct.pack("<%dI" % block_size,
                                                  *tokens[i:i + block_size]), 1337)
             for i in range(0, len(tokens) - block_size + 1, block_size)]
    seq = []
    for h in local:
        seq.append(xxhash.xxh3_64_intdigest(struct.pack("<QQ", seq[-1], h), 1337) if seq else h)
    return seq


def check_dynamo(cli_line):
    """The `kvtier hash` JSON line's seq equals Dynamo's sequence hashes (README's claim)."""
    m = re.search(r"--block-size (\d+) --tokens ([\d,]+)", cli_line[0])
    seq = json.loads(cli_line[1])["seq"]
    toks = [int(t) for t in m.group(2).split(",")]
    assert seq == dynamo_seq_hashes(toks, int(m.group(1))), "keys differ from Dynamo's"


# ---- runners, one per marker --------------------------------------------------------------------
RUN = {}


def runs(*names):
    def reg(fn):
        for n in names:
            assert n not in RUN
            RUN[n] = fn
        return fn
    return reg


@runs("readme-try-it")
def readme_try_it(ctx, blocks):
    d = ctx.daemon()
    Shell(ctx, ctx.dir("readme")).session(parse_session(blocks["readme-try-it"]), daemon_subs(d),
                                          poll=lambda c: "/metrics" in c)


@runs("readme-subscribe")
def readme_subscribe(ctx, blocks):
    d = ctx.daemon()
    subs = daemon_subs(d) + [("127.0.0.1:5557", "127.0.0.1:%d" % free_port()),
                             ("127.0.0.1:5558", "127.0.0.1:%d" % free_port())]
    Shell(ctx, ctx.dir("readme")).session(parse_session(blocks["readme-subscribe"]), subs)


@runs("readme-hash", "quickstart-hash")
def hash_sessions(ctx, blocks):
    for name in ("readme-hash", "quickstart-hash"):
        steps = parse_session(blocks[name])
        Shell(ctx, REPO).session(steps, ctx.build_bin_subs())
        check_dynamo([steps[0][0], steps[0][1][0]])


@runs("quickstart-engine")
def quickstart_engine(ctx, blocks):
    d = ctx.daemon()
    subs = daemon_subs(d) + [("127.0.0.1:5557", "127.0.0.1:%d" % free_port()),
                             ("127.0.0.1:5558", "127.0.0.1:%d" % free_port())]
    # From the source tree (the publisher is tests/fixtures/kv_events.py).
    Shell(ctx, REPO).session(parse_session(blocks["quickstart-engine"]), subs,
                             poll=lambda c: "/v1/query" in c)


@runs("quickstart-c", "quickstart-c-build")
def quickstart_c(ctx, blocks):
    subs = ctx.install() + ctx.cc_subs("-std=c11")
    work = ctx.dir("quickstart")
    with open(os.path.join(work, "quickstart.c"), "w") as f:
        f.write(blocks["quickstart-c"].text)
    steps = parse_session(blocks["quickstart-c-build"])
    Shell(ctx, work).session(steps, subs)
    # The prose: the keys are those `kvtier hash` prints for the same tokens.
    keys = steps[-1][1][0].split("keys ")[1].split()
    p = subprocess.run([ctx.kvtier, "hash", "--block-size", "16", "--tokens",
                        ",".join(str(t) for t in range(9000, 9040))], stdout=subprocess.PIPE,
                       check=True, text=True)
    assert json.loads(p.stdout)["seq"] == [int(k) for k in keys], p.stdout


@runs("config-dump-roundtrip")
def config_dump_roundtrip(ctx, blocks):
    work = ctx.dir("conf")
    dump, start = parse_script(blocks["config-dump-roundtrip"])
    Shell(ctx, work).script([dump])
    with open(os.path.join(work, "kvtier.conf")) as f:
        first = f.read()
    assert "block-size = 16" in first.split("\n"), first
    # "starts with exactly the same settings": the file's dump is the dump...
    p = subprocess.run([ctx.kvtierd, "--config", "kvtier.conf", "--dump-config"], cwd=work,
                       env=ctx.env, stdout=subprocess.PIPE, text=True, check=True)
    assert p.stdout == first, p.stdout
    # ...and kvtierd starts with it (listeners and data moved by KVTIER_* variables).
    proc, log, http_port = start_process(ctx, start, loopback_env(ctx, "conf"), work)
    try:
        assert Http(http_port).http("GET", "/healthz") == (200, {"status": "ok"})
    finally:
        stop_process(proc, log)


@runs("config-file")
def config_file(ctx, blocks):
    work = ctx.dir("conf")
    path = os.path.join(work, "example.conf")
    with open(path, "w") as f:
        f.write(blocks["config-file"].text)
    p = subprocess.run([ctx.kvtierd, "--config", path, "--dump-config"], env=ctx.env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr)
    want, dump = parse_conf(blocks["config-file"].text), parse_conf(p.stdout)
    assert want, "the example sets nothing"
    for key, values in want.items():
        assert dump.get(key) == values, (key, values, dump.get(key))


@runs("config-errors")
def config_errors(ctx, blocks):
    work = ctx.dir("conferr")
    for line in blocks["config-errors"].lines:
        env, args = {}, []
        m = re.match(r"^flag --([a-z-]+): bad value '([^']*)'", line)
        if m:
            args = ["--" + m.group(1), m.group(2)]
        m = re.match(r"^file (\S+) line (\d+): unknown key '([^']*)'", line)
        if m:
            path = os.path.join(work, "kvtier.conf")
            with open(path, "w") as f:
                f.write("# comment\n" * (int(m.group(2)) - 1) + m.group(3) + " = 16\n")
            args = ["--config", path]
            line = line.replace(m.group(1), path)
        m = re.match(r"^env (KVTIER_[A-Z_]+): bad value '([^']*)'", line)
        if m:
            env = {m.group(1): m.group(2)}
        assert args or env, "no scenario for: " + line
        p = subprocess.run([ctx.kvtierd] + args + ["--dump-config"], env=dict(ctx.env, **env),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert (p.returncode, p.stdout, p.stderr) == (2, "", "kvtierd: %s\n" % line), (
            line, p.returncode, p.stdout, p.stderr)


@runs("cli-overview")
def cli_overview(ctx, blocks):
    run = lambda *a: subprocess.run([ctx.kvtier] + list(a), stdout=subprocess.PIPE,  # noqa: E731
                                    stderr=subprocess.PIPE, text=True, env=ctx.env)
    helps = [run(*a) for a in (["--help"], ["help"], ["-h"])]
    for p in helps:
        assert p.returncode == 0 and p.stdout == helps[0].stdout and p.stderr == "", p
    listed = [re.match(r"^\s*(\S+)\s", ln).group(1)
              for ln in helps[0].stdout.split("\n") if re.match(r"^  [a-z]", ln)]
    for ln in blocks["cli-overview"].lines:
        words = ln.split()
        assert words[0] == "kvtier", ln
        if words[1] == "help":
            a, b = run("help", "hash"), run("hash", "--help")
            assert a.returncode == 0 and a.stdout == b.stdout and "usage: kvtier hash" in a.stdout
        elif words[1] == "--version":
            v = run("--version")
            with open(os.path.join(REPO, "CMakeLists.txt")) as f:
                version = re.search(r"project\(kvtier VERSION ([0-9.]+)", f.read()).group(1)
            assert re.match(r"^kvtier %s \([^,]+, [^,]+, [^)]+\)\n$" % re.escape(version),
                            v.stdout), v.stdout
        elif not words[1].startswith("-"):
            assert words[1] in listed, (words[1], listed)
            assert run("help", words[1]).returncode == 0, words[1]


@runs("cli-usage-error", "cli-hash", "cli-hash-salted", "cli-hash-lora")
def cli_sessions(ctx, blocks):
    for name in ("cli-usage-error", "cli-hash", "cli-hash-salted", "cli-hash-lora"):
        Shell(ctx, ctx.dir("cli")).session(parse_session(blocks[name]))


@runs("cli-runtime-error")
def cli_runtime_error(ctx, blocks):
    refused, unknown = parse_session(blocks["cli-runtime-error"])
    dead = free_port()  # nothing listens there
    Shell(ctx, ctx.dir("cli"), {"KVTIER_ADDR": "127.0.0.1:%d" % dead}).session(
        [refused], [("127.0.0.1:7420", "127.0.0.1:%d" % dead)])
    d = ctx.daemon()
    addr = "127.0.0.1:%d" % d.rpc_port
    Shell(ctx, ctx.dir("cli"), {"KVTIER_ADDR": addr}).session([unknown], [("127.0.0.1:7420", addr)])


def protocol_state(ctx):
    """kvtierd in the state of docs/protocol.md's worked example: model llama, block size 4;
    pod-a (rank 0) holds both blocks of tokens 1..8 on GPU, pod-b (rank 1) the first on CPU."""
    d = ctx.daemon()
    post_ok(d, "/v1/events", {"pod": "pod-a", "model": "llama",
                              "events": [fx.stored([11, 12], list(range(1, 9)), 4)]})
    post_ok(d, "/v1/events", {"pod": "pod-b", "model": "llama", "dp_rank": 1,
                              "events": [fx.stored([21], [1, 2, 3, 4], 4, medium="CPU")]})
    return d


@runs("cli-query")
def cli_query(ctx, blocks):
    d = protocol_state(ctx)
    work = ctx.dir("cli")
    with open(os.path.join(work, "prompt.txt"), "w") as f:
        f.write("1 2 3 4 5 6 7 8\n")
    Shell(ctx, work, {"KVTIER_ADDR": "127.0.0.1:%d" % d.rpc_port}).session(
        parse_session(blocks["cli-query"]))


@runs("cli-subscribe")
def cli_subscribe(ctx, blocks):
    d = ctx.daemon()
    Shell(ctx, ctx.dir("cli"), {"KVTIER_ADDR": "127.0.0.1:%d" % d.rpc_port}).session(
        parse_session(blocks["cli-subscribe"]), [("127.0.0.1:5557", "127.0.0.1:%d" % free_port())])


@runs("cli-bench-overview")
def cli_bench_overview(ctx, blocks):
    p = subprocess.run([ctx.bench, "--help"], stdout=subprocess.PIPE, text=True, env=ctx.env)
    assert p.returncode == 0, p
    shown = set()
    for ln in blocks["cli-bench-overview"].lines:
        sub = ln.split()[1]
        if not sub.startswith("-"):
            assert re.search(r"^  %s\s" % re.escape(sub), p.stdout, re.M), (sub, p.stdout)
            shown.add(sub)
    # and every subcommand the binary has is in the doc
    listed = set(re.findall(r"^  (\w+)\s", p.stdout.split("subcommands:", 1)[1], re.M))
    assert listed == shown, (sorted(listed), sorted(shown))


@runs("cli-bench-hash-json")
def cli_bench_hash_json(ctx, blocks):
    shown = json.loads(" ".join(blocks["cli-bench-hash-json"].lines))
    # The shape of the line with a short run (options of docs/cli.md); perf-hash runs the
    # default one.
    p = subprocess.run([ctx.bench, "hash", "--seconds", "0.05", "--mib", "1"],
                       stdout=subprocess.PIPE, text=True, env=ctx.env)
    assert p.returncode == 0, p
    got = json.loads(p.stdout.rstrip("\n").split("\n")[-1])
    assert sorted(got) == sorted(shown), (sorted(got), sorted(shown))
    assert got["bench"] == "hash" and got["stat"] == "best" and got["bytes"] == 1 << 20, got


@runs("cli-bench-tiers-json")
def cli_bench_tiers_json(ctx, blocks):
    shown = json.loads(" ".join(blocks["cli-bench-tiers-json"].lines))
    # The shape of the line with a quick run, on a file system with O_DIRECT (not tmpfs).
    where = ctx.dir("tiers")
    if subprocess.run(["stat", "-f", "-c", "%T", where], stdout=subprocess.PIPE,
                      text=True).stdout.strip() == "tmpfs":
        where = ctx.build
    p = subprocess.run([ctx.bench, "tiers", "--quick", "--dir", where],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ctx.env)
    if p.returncode == 1 and ("io_uring" in p.stderr or "O_DIRECT" in p.stderr):
        print("note: cli-bench-tiers-json: the shape is not checked here: " + p.stderr.strip())
        return
    assert p.returncode == 0, p
    got = json.loads(p.stdout.rstrip("\n").split("\n")[-1])
    assert sorted(got) == sorted(shown), (sorted(got), sorted(shown))
    assert sorted(got["reload_us"]) == sorted(shown["reload_us"]), got
    assert got["bench"] == "tiers" and got["quick"] is True, got


@runs("perf-hash")
def perf_hash(ctx, blocks):
    (cmd,) = parse_script(blocks["perf-hash"])
    (out,) = Shell(ctx, REPO).script([cmd], ctx.build_bin_subs())
    assert json.loads(out[-1])["bench"] == "hash", out[-1]


@runs("api-events", "api-engines", "api-query", "api-query-answer", "api-stats")
def api_bodies(ctx, blocks):
    d = ctx.daemon()
    ans = post_ok(d, "/v1/events", blocks["api-events"].text)
    assert ans["applied"] == 3, ans
    subs = [("10.0.0.5:5557", "127.0.0.1:%d" % free_port()),
            ("10.0.0.5:5600", "127.0.0.1:%d" % free_port())]
    ans = post_ok(d, "/v1/engines", substitute(blocks["api-engines"].text, subs))
    assert ans["pod"] == "vllm-0" and ans["dp_size"] == 2 and len(ans["endpoints"]) == 2, ans
    for line in blocks["api-query"].lines:
        post_ok(d, "/v1/query", line)
    # The answer shown: a pod holding two blocks of 4 of a 12-token prompt (README's).
    post_ok(d, "/v1/events", {"pod": "vllm-0", "model": "llama-3-8b",
                              "events": [fx.stored([101, 102], list(range(1, 9)), 4)]})
    ans = post_ok(d, "/v1/query", {"model": "llama-3-8b", "token_ids": list(range(1, 13))})
    assert ans == json.loads(blocks["api-query-answer"].text), ans
    # /v1/stats has the members the example shows, at every level.
    shown = json.loads(blocks["api-stats"].text)
    same_shape(d.stats(), shown, "stats")


def same_shape(got, shown, where):
    """Objects have the same members at every level (the values are an example's);
    "mediums" is keyed by medium names, so only its presence counts."""
    if isinstance(shown, dict):
        assert isinstance(got, dict), (where, got)
        assert sorted(got) == sorted(shown), (where, sorted(got), sorted(shown))
        for k in shown:
            if k != "mediums":
                same_shape(got[k], shown[k], where + "." + k)
    elif isinstance(shown, list) and shown and got:
        same_shape(got[0], shown[0], where + "[0]")


@runs("protocol-hello", "protocol-query", "protocol-answer", "protocol-error", "protocol-salted")
def protocol_frames(ctx, blocks):
    def frame(name):
        data = b""
        for ln in blocks[name].lines:
            m = re.match(r"^([0-9a-f]{4})  ((?:[0-9a-f]{2} )*[0-9a-f]{2})(?:  |$)", ln)
            assert m and int(m.group(1), 16) == len(data), (name, ln)
            data += bytes.fromhex(m.group(2))
        return data

    d = protocol_state(ctx)
    s = d.connect()
    try:
        s.sendall(frame("protocol-hello"))
        h, body = fx.read_frame(s)
        assert (h["op"], h["flags"], h["req_id"]) == (fx.OP_HELLO, fx.F_RESPONSE, 1), h
        # The query, and kvtierd's answer byte for byte.
        s.sendall(frame("protocol-query"))
        want = frame("protocol-answer")
        got = fx.recv_exact(s, len(want))
        assert got == want, "answer:\n  got  %s\n  want %s" % (got.hex(), want.hex())
        # The error example: kvtierd words its own message; the header, status and HTTP
        # status are the example's.
        err = frame("protocol-error")
        s.sendall(fx.frame(fx.OP_QUERY, 1, fx.query_body("", tokens=list(range(1, 9)))))
        h, body = fx.read_frame(s)
        assert fx.HDR.pack(fx.MAGIC, 1, h["op"], h["flags"], h["req_id"], 0, 0)[:16] == err[:16]
        assert fx.parse_error(body)[:2] == fx.parse_error(err[24:])[:2], fx.parse_error(body)
        # The salted query: nobody stored these blocks under tenant-a.
        s.sendall(frame("protocol-salted"))
        h, body = fx.read_frame(s)
        assert (h["flags"], h["req_id"]) == (fx.F_RESPONSE, 2), h
        assert fx.parse_query_answer(body) == {"block_size": 4, "num_blocks": 2, "pods": []}
    finally:
        s.close()


@runs("client-pkg-config", "client-cmake")
def client_build(ctx, blocks):
    subs = ctx.install() + ctx.cc_subs("router.c")
    work = ctx.dir("client")
    with open(os.path.join(work, "router.c"), "w") as f:
        f.write(ROUTER_C)
    sh = Shell(ctx, work)
    for cmd in parse_script(blocks["client-pkg-config"]):
        sh.script([cmd], subs)
        if cmd.startswith("cc "):
            (out,) = sh.script(["./a.out"])
            assert out == ["router ok"], out
    # The CMake lines in a project of their own.
    with open(os.path.join(work, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.21)\nproject(router LANGUAGES C)\n"
                "add_executable(router router.c)\n" + blocks["client-cmake"].text)
    flags = ["-DCMAKE_C_FLAGS=" + ctx.sanflags, "-DCMAKE_EXE_LINKER_FLAGS=" + ctx.sanflags]
    sh.script([shlex.join([ctx.cmake, "-S", ".", "-B", "b", "-DCMAKE_PREFIX_PATH=" + ctx.prefix,
                           "-DCMAKE_C_COMPILER=" + ctx.cc] + flags),
               shlex.join([ctx.cmake, "--build", "b"])])
    (out,) = sh.script(["b/router"])
    assert out == ["router ok"], out


ROUTER_C = r"""/* A router's first lines, built by docs/client.md's commands: hash in-process. */
#include <stdio.h>

#include <kvtier/client.h>

int main(void)
{
    const uint32_t toks[4] = {1, 2, 3, 4};
    uint64_t keys[2];
    if (kvt_client_hash_tokens(toks, 4, 2, keys) != 2)
        return 1;
    printf("router ok\n");
    return 0;
}
"""


@runs("tiers-start", "tiers-session")
def tiers_docs(ctx, blocks):
    """The sidecar with tiers as docs/tiers.md starts it (its /var/lib/kvtier a temp dir),
    then the block API session against it."""
    (cmd,) = parse_script(blocks["tiers-start"])
    work = ctx.dir("tiers")
    cmd = substitute(cmd, ctx.build_bin_subs() + [("/var/lib/kvtier", work)])
    proc, log, http_port = start_process(ctx, cmd, loopback_env(ctx, "tiers"), work)
    try:
        Shell(ctx, work).session(parse_session(blocks["tiers-session"]),
                                 [("localhost:7421", "localhost:%d" % http_port)],
                                 poll=lambda c: "/v1/query" in c)
    finally:
        stop_process(proc, log)


@runs("connectors-kvtierd", "connectors-vllm-geometry", "sglang-page-check")
def connectors_docs(ctx, blocks):
    """docs/connectors.md: the sidecar it starts (its /var/lib/kvtier a temp dir), vLLM's
    chunk check, and SGLang's page check against that sidecar, with the kvtier package of
    this tree on Debian's python3."""
    (cmd,) = parse_script(blocks["connectors-kvtierd"])
    work = ctx.dir("connectors")
    subs = ctx.build_bin_subs() + [("/var/lib/kvtier", work)]
    proc, log, _ = start_process(ctx, substitute(cmd, subs), loopback_env(ctx, "connectors"),
                                 work)
    env = {"PYTHONPATH": os.path.join(REPO, "router-plugin", "python"),
           "KVTIER_LIB": os.path.join(os.path.abspath(ctx.build), "lib", "libkvtier.so.0")}
    if os.environ.get("KVT_DOCS_PY_PRELOAD"):  # an ASan libkvtier in the interpreter
        env.update(LD_PRELOAD=os.environ["KVT_DOCS_PY_PRELOAD"], ASAN_OPTIONS="detect_leaks=0")
    try:
        Shell(ctx, work, env).session(parse_session(blocks["connectors-vllm-geometry"]),
                                      [("python3 -c", "/usr/bin/python3 -c")])
        code = substitute("\n".join(blocks["sglang-page-check"].lines), subs)
        p = subprocess.run(["/usr/bin/python3", "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, cwd=work, env=dict(ctx.env, **env),
                           timeout=60, text=True)
        # the page of the doc's example fills one of the sidecar's 8 MiB slots exactly
        assert (p.returncode, p.stdout) == (0, "8388608\n"), (p.returncode, p.stdout)
    finally:
        stop_process(proc, log)


@runs("deploy-engine-flag")
def deploy_engine_flag(ctx, blocks):
    (cmd,) = parse_script(blocks["deploy-engine-flag"])
    subs = [("127.0.0.1:5557", "127.0.0.1:%d" % free_port()),
            ("127.0.0.1:5558", "127.0.0.1:%d" % free_port())]
    work = ctx.dir("deploy")
    proc, log, http_port = start_process(ctx, substitute(cmd, subs), loopback_env(ctx, "deploy"),
                                         work)
    try:
        streams = Http(http_port).stats()["streams"]
        assert [(s["pod"], s["model"]) for s in streams] == [
            ("vllm-0", "meta-llama/Llama-3.1-8B-Instruct")], streams
    finally:
        stop_process(proc, log)


@runs("deploy-engines-curl")
def deploy_engines_curl(ctx, blocks):
    d = ctx.daemon()
    live = free_port()
    subs = daemon_subs(d) + [("10.0.3.17:5557", "127.0.0.1:%d" % live),
                             ("10.0.3.17:5558", "127.0.0.1:%d" % (live + 1)),  # DP rank 1
                             ("10.0.3.17:5600", "127.0.0.1:%d" % free_port())]
    Shell(ctx, ctx.dir("deploy")).session(parse_session(blocks["deploy-engines-curl"]), subs)


@runs("deploy-bind")
def deploy_bind(ctx, blocks):
    d = ctx.daemon()
    subs = daemon_subs(d) + [("tcp://*:5557", "tcp://127.0.0.1:%d" % free_port()),
                             ("10.0.3.17:5558", "127.0.0.1:%d" % free_port()),
                             ("10.0.3.18:5558", "127.0.0.1:%d" % free_port())]
    Shell(ctx, ctx.dir("deploy")).session(parse_session(blocks["deploy-bind"]), subs)


def k8s_container(lines, name):
    """The lines of container @name of a pod template written as in docs/deployment.md."""
    start = lines.index("      - name: %s" % name)
    end = start + 1
    while end < len(lines) and not lines[end].startswith("      - name:") and \
            not lines[end].startswith("      volumes:"):
        end += 1
    return lines[start:end]


def k8s_args(c, subs):
    """A container's args, trailing comments dropped, @subs applied."""
    i = c.index("        args:") + 1
    out = []
    while i < len(c) and c[i].startswith("        - "):
        out.append(substitute(re.sub(r"\s+#.*$", "", c[i][10:]), subs))
        i += 1
    return out


def k8s_env(c, subs):
    """A container's env entries written {name: N, value: V} (V unquoted or '...' or "...")."""
    env = {}
    for ln in c:
        m = re.match(r"^\s*- \{name: ([A-Z_]+), value: ('(.*)'|\"(.*)\"|[^}]*)\}$", ln)
        if m:
            v = m.group(3) if m.group(3) is not None else \
                m.group(4) if m.group(4) is not None else m.group(2)
            env[m.group(1)] = substitute(v, subs)
    return env


def kvtierd_dump(ctx, c, subs):
    """kvtierd's configuration (--dump-config) from container @c's args and KVTIER_* env."""
    env = {k: v for k, v in k8s_env(c, subs).items() if k.startswith("KVTIER_")}
    p = subprocess.run([ctx.kvtierd] + k8s_args(c, subs) + ["--dump-config"],
                       env=dict(ctx.env, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr)
    return parse_conf(p.stdout)


@runs("deploy-k8s")
def deploy_k8s(ctx, blocks):
    """The kvtierd container's args and KVTIER_ENGINE load (--dump-config); its engine is the
    vllm container's publisher. (Kubernetes itself is not here.)"""
    lines = blocks["deploy-k8s"].lines
    pod = {"$(POD_NAME)": "vllm-0"}

    def container(name):
        return k8s_container(lines, name)

    def args(c):
        return k8s_args(c, pod.items())

    kv = container("kvtierd")
    env = {}
    for ln in kv:
        m = re.match(r"^\s*- \{name: (KVTIER_[A-Z_]+), value: '(.*)'\}$", ln)
        if m:
            env[m.group(1)] = substitute(m.group(2), pod.items())
    assert "KVTIER_ENGINE" in env, kv
    p = subprocess.run([ctx.kvtierd] + args(kv) + ["--dump-config"], env=dict(ctx.env, **env),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr)
    dump = parse_conf(p.stdout)
    engine = json.loads(dump["engine"][0])
    assert dump["allow-remote"] == ["true"] and engine["pod"] == "vllm-0", dump
    # The engine the sidecar subscribes to is the one vLLM publishes.
    (events,) = [a for a in args(container("vllm")) if a.startswith("--kv-events-config=")]
    pub = json.loads(events.split("=", 1)[1])
    assert pub["endpoint"].rsplit(":", 1)[1] == engine["endpoint"].rsplit(":", 1)[1], (pub, engine)
    assert pub["replay_endpoint"].rsplit(":", 1)[1] == \
        engine["replay_endpoint"].rsplit(":", 1)[1], (pub, engine)


@runs("deploy-vllm-offload", "deploy-sglang-hicache")
def deploy_offload(ctx, blocks):
    """Section 8's pods: kvtierd's args and engine load (--dump-config) with its tiers and
    socket, the engine's plug-in config names a module and class of the installed kvtier
    package and kvtierd's socket, both containers mount the socket's directory, and the
    engine's PYTHONPATH is where `cmake --install` puts the package. (No Kubernetes, vLLM or
    SGLang here.)"""
    import ast
    subs = [("$(POD_NAME)", "p-0")]
    install = dict(ctx.install())
    cases = (("deploy-vllm-offload", "vllm", "--kv-transfer-config=",
              lambda c: (c["kv_connector_extra_config"]["spec_module_path"],
                         c["kv_connector_extra_config"]["spec_name"],
                         c["kv_connector_extra_config"])),
             ("deploy-sglang-hicache", "sglang", "--hicache-storage-backend-extra-config=",
              lambda c: (c["module_path"], c["class_name"], c)))
    for marker, engine, flag, plug in cases:
        lines = blocks[marker].lines
        kv, eng = k8s_container(lines, "kvtierd"), k8s_container(lines, engine)
        dump = kvtierd_dump(ctx, kv, subs)
        sock = dump["rpc-unix"][0]
        assert dump["pod"] == ["p-0"] and dump["ram-bytes"] != ["0"], dump
        assert json.loads(dump["engine"][0])["pod"] == "p-0", dump["engine"]
        (cfg,) = [json.loads(a[len(flag):]) for a in k8s_args(eng, subs) if a.startswith(flag)]
        module, cls, extra = plug(cfg)
        assert extra["kvtier_socket"] == sock, (extra, sock)
        pypath = k8s_env(eng, subs)["PYTHONPATH"]
        path = os.path.join(substitute(pypath, [("/opt/kvtier", install["/opt/kvtier"])]),
                            *module.split(".")) + ".py"
        with open(path) as f:
            tree = ast.parse(f.read())
        assert cls in [n.name for n in tree.body if isinstance(n, ast.ClassDef)], (path, cls)
        mount = "{name: kvtier-run, mountPath: %s}" % os.path.dirname(sock)
        for c in (kv, eng):
            assert any(mount in ln for ln in c), (c[0], mount)
        # the engine's calls need kvtierd's token where it has one (ATTACH, RESERVE, COMMIT)
        assert extra.get("kvtier_token_file", "") == dump["auth-token-file"][0], (extra, dump)


@runs("deploy-index-role")
def deploy_index_role(ctx, blocks):
    """Its flags load (--dump-config): it binds 0.0.0.0 and names hosts of a cluster."""
    (cmd,) = parse_script(blocks["deploy-index-role"])
    (out,) = Shell(ctx, ctx.dir("deploy")).script([cmd + " --dump-config"])
    dump = parse_conf("\n".join(out))
    assert [json.loads(e)["pod"] for e in dump["engine"]] == ["vllm-0", "vllm-1"], dump


def doc_tables(path, after_line):
    """The markdown tables of @path after line @after_line: [[row cells, ...], ...]."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        lines = f.read().split("\n")[after_line:]
    tables, cur = [], None
    for ln in lines:
        if ln.startswith("|") and not ln.startswith("|---"):
            cells = [c.strip() for c in ln.strip("|").split("|")]
            if cur is None:
                cur = []
                tables.append(cur)
            elif cells[0] != "policy":
                cur.append(cells)
        elif not ln.startswith("|"):
            cur = None
    return tables


@runs("traces-gen", "traces-replay")
def traces(ctx, blocks):
    """gen's session as written; each replay's figures are those of the table that follows."""
    work = ctx.dir("traces")
    subs = [("/tmp/chat.jsonl", os.path.join(work, "chat.jsonl"))] + ctx.build_bin_subs()
    sh = Shell(ctx, REPO)
    sh.session(parse_session(blocks["traces-gen"]), subs)
    rblock = blocks["traces-replay"]
    tables = doc_tables(rblock.path, rblock.line)
    with open(os.path.join(REPO, rblock.path), encoding="utf-8") as f:
        text = f.read()
    for i, cmd in enumerate(parse_script(rblock)):
        trace = cmd.split("--trace ")[1].split()[0]
        if trace.startswith("../") and not os.path.exists(os.path.join(REPO, trace)):
            print("note: traces-replay: %s is not in this checkout; not run" % trace)
            continue
        (out,) = sh.script([cmd], subs)
        j = json.loads(out[-1])
        assert "ideal %.2f%%." % (100 * j["ideal_hit_ratio"]) in text, j["ideal_hit_ratio"]
        got = [[r["policy"], "%.2f%%" % (100 * r["hit_ratio"]),
                "%.1f%%" % (100 * r["hit_ratio"] / j["ideal_hit_ratio"]),
                "%.3f" % r["load_imbalance"],
                "{:,}".format(r["hit_blocks"])] for r in j["results"]]
        assert got == tables[i], "%s:\nmeasured %s\nthe doc shows %s" % (cmd, got, tables[i])


# ---- main ---------------------------------------------------------------------------------------
def account(blocks):
    """Every block is run here, run elsewhere or deliberately not run: the problems."""
    problems = []
    seen = {}
    for b in blocks:
        if b.name is None:
            continue
        if b.name in seen:
            problems.append("%r: marker %s also at %r" % (b, b.name, seen[b.name]))
        seen[b.name] = b
        if b.name not in RUN and b.name not in ELSEWHERE:
            problems.append("%r: marker %s has no runner" % (b, b.name))
    for name in list(RUN) + list(ELSEWHERE):
        if name not in seen:
            problems.append("no block is marked `<!-- doc-test: %s -->` any more" % name)
    for name, test in ELSEWHERE.items():
        with open(os.path.join(REPO, test), encoding="utf-8") as f:
            if '"%s"' % name not in f.read():
                problems.append("%s does not run the block marked %s" % (test, name))
    used = set()
    for b in blocks:
        if b.name is not None:
            continue
        first = b.lines[0] if b.lines else ""
        hits = [i for i, (path, start, _) in enumerate(NOT_RUN)
                if path == b.path and first.startswith(start)]
        if len(hits) != 1:
            problems.append("%r: a block without a doc-test marker, %s NOT_RUN entry: %r" % (
                b, "in no" if not hits else "in more than one", first))
        used.update(hits)
    for i, (path, start, _) in enumerate(NOT_RUN):
        if i not in used:
            problems.append("NOT_RUN entry matches no block: %s %r" % (path, start))
    return problems, seen


def main():
    if len(sys.argv) != 6:
        sys.stderr.write(__doc__)
        return 2
    build, kvtierd, kvtier, bench = (os.path.abspath(a) for a in sys.argv[1:2] + sys.argv[3:6])
    cmake = sys.argv[2]
    try:
        import xxhash  # noqa: F401  (the Dynamo cross-check)
        import zmq  # noqa: F401  (docs/quickstart.md's stand-in engine)
    except ImportError as e:
        print("test_docs: SKIP: %s needs python3-zmq and python3-xxhash: %s" % (sys.executable, e))
        return 77
    if shutil.which("curl") is None:
        print("test_docs: SKIP: the docs' sessions use curl, which is not on PATH")
        return 77
    blocks = read_blocks()
    problems, named = account(blocks)
    for p in problems:
        print("FAIL: " + p)
    failures = len(problems)
    with tempfile.TemporaryDirectory(prefix="kvt_docs_") as tmp:
        ctx = Ctx(build, cmake, kvtierd, kvtier, bench, tmp)
        done = set()
        order = sorted((named[n].path, named[n].line, n) for n in RUN if n in named)
        for _, _, name in order:
            fn = RUN[name]
            if fn in done or any(n not in named for n in RUN if RUN[n] is fn):
                continue
            done.add(fn)
            group = sorted(n for n in RUN if RUN[n] is fn)
            where = ", ".join("%s (%r)" % (n, named[n]) for n in group)
            failed = False
            try:
                fn(ctx, {n: named[n] for n in group})
                print("ok: " + where)
            except Exception:
                failed = True
                failures += 1
                print("FAIL: " + where)
                traceback.print_exc(file=sys.stdout)
            try:
                ctx.stop_daemons(failed)
            except AssertionError as e:
                failures += 1
                print("FAIL: %s: %s" % (where, e))
    print("test_docs: %d blocks: %d run here, %d by other tests, %d deliberately not run" % (
        len(blocks), sum(1 for b in blocks if b.name in RUN),
        sum(1 for b in blocks if b.name in ELSEWHERE), sum(1 for b in blocks if b.name is None)))
    if failures:
        print("test_docs: %d failures" % failures)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
