"""kvtier: Python binding of libkvtier, the client of kvtierd's binary RPC.

Standard library only (ctypes over libkvtier.so.0). Example::

    import kvtier

    with kvtier.Client("127.0.0.1:7420", timeout=1.0) as c:
        for p in c.query("llama-3-8b", [1, 2, 3, ...]):
            print(p["pod"], p["matched_blocks"], p["score"])
        c.query("llama-3-8b", [1, 2, 3, ...], cache_salt="tenant-a")  # vLLM/SGLang cache_salt
        c.report_events({"pod": "pod-a", "model": "llama-3-8b", "events": [...]})
        print(c.stats())

    # an engine beside a kvtierd with tiers (--ram-bytes), on its Unix socket
    with kvtier.Client("unix:/run/kvtier.sock") as c, c.attach() as arena:
        slots, evicted = c.reserve("llama-3-8b", keys)
        arena.slot(slots[0])[:n] = kv_bytes            # write the block into its slot
        c.commit("llama-3-8b", keys)
        pins = c.pin("llama-3-8b", keys)              # [(slot, length), ...] held in RAM
        c.unpin("llama-3-8b", keys)

The shared library is looked up, in order: the path in the environment
variable KVTIER_LIB; next to this package (kvtier/libkvtier.so.0); the build
tree of a source checkout (build/lib); the install tree
(<prefix>/lib/libkvtier.so.0 when this file is installed under
<prefix>/lib/kvtier/python/kvtier/); finally the system loader.

Errors raise kvtier.Error: the server's message (or the local one) with the
kvt_status_t code in .status. Bad argument types or values raise TypeError or
ValueError. A Client serializes its own calls with a lock, so it may be shared
between threads (each call still waits for the previous one).
"""

import array
import ctypes
import ctypes.util
import json
import mmap
import os
import threading

__all__ = ["Arena", "Client", "Error", "hash_tokens", "library_path", "library_version",
           "DEFAULT_ADDR", "__version__"]

# The project version this binding belongs to (CMakeLists.txt); library_version() is the
# loaded libkvtier's, which should be the same.
__version__ = "0.1.0"

DEFAULT_ADDR = "127.0.0.1:7420"

# kvt_status_t names (common/status.h), for messages.
_STATUS = {
    0: "ok",
    -100: "invalid argument",
    -101: "parse error",
    -102: "value out of range",
    -103: "input too large",
    -200: "not found",
    -201: "already exists",
    -300: "no space",
    -301: "out of memory",
    -302: "limit reached",
    -400: "i/o error",
    -401: "timed out",
    -500: "peer error",
    -501: "protocol error",
    -502: "connection closed",
    -503: "peer restarted",
    -600: "internal error",
    -601: "not supported",
}


def _json_body(value, what):
    """A request body: a dict as compact JSON, or JSON text given as str/bytes."""
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":")).encode("utf-8")
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise TypeError("%s must be a dict or a JSON str/bytes" % what)


class Error(Exception):
    """A failed call. .status is the kvt_status_t (negative int), .message the text."""

    def __init__(self, status, message):
        self.status = status
        self.message = message or _STATUS.get(status, "error %d" % status)
        super().__init__(self.message)

    @property
    def status_name(self):
        return _STATUS.get(self.status, "unknown status")


class _Opts(ctypes.Structure):
    _fields_ = [
        ("address", ctypes.c_char_p),
        ("connect_timeout_ms", ctypes.c_int),
        ("io_timeout_ms", ctypes.c_int),
        ("auth_token", ctypes.c_char_p),
        ("lazy_connect", ctypes.c_bool),
    ]


class _Pod(ctypes.Structure):
    _fields_ = [
        ("pod", ctypes.c_char * 256),
        ("dp_rank", ctypes.c_uint32),
        ("matched", ctypes.c_uint32),
        ("gpu", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("disk", ctypes.c_uint32),
        ("score", ctypes.c_double),
    ]


class _Result(ctypes.Structure):
    _fields_ = [
        ("block_size", ctypes.c_uint32),
        ("num_blocks", ctypes.c_uint32),
        ("npods", ctypes.c_size_t),
        ("pods", ctypes.POINTER(_Pod)),
        ("answered", ctypes.c_size_t),
        ("asked", ctypes.c_size_t),
    ]


class _Arena(ctypes.Structure):
    _fields_ = [
        ("base", ctypes.c_void_p),
        ("map_bytes", ctypes.c_size_t),
        ("slot_off", ctypes.c_size_t),
        ("slot_bytes", ctypes.c_uint32),
        ("nslots", ctypes.c_uint32),
        ("block_bytes", ctypes.c_uint32),
        ("disk_slots", ctypes.c_uint32),
        ("fd", ctypes.c_int),
    ]


class _Pinned(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_uint32), ("len", ctypes.c_uint32)]


class _Transfer(ctypes.Structure):
    _fields_ = [
        ("peer", ctypes.c_char_p),
        ("model", ctypes.c_char_p),
        ("lora", ctypes.c_char_p),
        ("keys", ctypes.POINTER(ctypes.c_uint64)),
        ("n", ctypes.c_size_t),
        ("push", ctypes.c_bool),
        ("timeout_ms", ctypes.c_uint32),
        ("stream", ctypes.c_bool),
    ]


class _TransferOut(ctypes.Structure):
    _fields_ = [
        ("transferred", ctypes.POINTER(ctypes.c_uint64)),
        ("missing", ctypes.POINTER(ctypes.c_uint64)),
        ("failed", ctypes.POINTER(ctypes.c_uint64)),
        ("reasons", ctypes.POINTER(ctypes.c_uint8)),
        ("ntransferred", ctypes.c_size_t),
        ("nmissing", ctypes.c_size_t),
        ("nfailed", ctypes.c_size_t),
        ("bytes", ctypes.c_uint64),
        ("ns", ctypes.c_uint64),
    ]


# kvt_client_lookup()'s locations (KVT_CLIENT_LOC_*) and the slot of a key that got none.
_LOC_NAMES = {1: "ram", 2: "disk"}
_SLOT_NONE = 0xFFFFFFFF


def _candidates():
    env = os.environ.get("KVTIER_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libkvtier.so.0", "libkvtier.so"):
        yield os.path.join(here, name)
    # Source checkout: router-plugin/python/kvtier/ -> <repo>/build/lib
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
    yield os.path.join(repo, "build", "lib", "libkvtier.so.0")
    # Install tree: <prefix>/lib/kvtier/python/kvtier/ -> <prefix>/lib
    libdir = os.path.normpath(os.path.join(here, "..", "..", ".."))
    yield os.path.join(libdir, "libkvtier.so.0")
    found = ctypes.util.find_library("kvtier")
    yield found or "libkvtier.so.0"


_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def _load():
    global _lib, _lib_path
    with _lib_lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                errors.append("%s: %s" % (path, e))
                continue
            _declare(lib)
            _lib, _lib_path = lib, path
            return lib
        raise Error(-400, "cannot load libkvtier (set KVTIER_LIB): " + ("; ".join(errors) or "not found"))


def _declare(lib):
    P = ctypes.POINTER
    c_client = ctypes.c_void_p
    st = ctypes.c_int
    cstrs = P(ctypes.c_char_p)
    u64s = P(ctypes.c_uint64)
    sigs = {
        "kvt_client_opts_default": (None, [P(_Opts)]),
        "kvt_client_create_msg": (st, [P(_Opts), P(c_client), ctypes.c_char_p, ctypes.c_size_t]),
        "kvt_client_destroy": (None, [c_client]),
        "kvt_client_last_error": (ctypes.c_char_p, [c_client]),
        "kvt_client_query": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, P(ctypes.c_uint32),
                                  ctypes.c_size_t, cstrs, ctypes.c_size_t, P(_Result)]),
        "kvt_client_query_salted": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_char_p, P(ctypes.c_uint32), ctypes.c_size_t,
                                         cstrs, ctypes.c_size_t, P(_Result)]),
        "kvt_client_query_keys": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p,
                                       P(ctypes.c_uint64), ctypes.c_size_t, cstrs,
                                       ctypes.c_size_t, P(_Result)]),
        "kvt_client_result_free": (None, [P(_Result)]),
        "kvt_client_report_events": (st, [c_client, ctypes.c_char_p, ctypes.c_size_t,
                                          P(ctypes.c_void_p)]),
        "kvt_client_routed": (st, [c_client, ctypes.c_char_p, ctypes.c_size_t,
                                   P(ctypes.c_void_p)]),
        "kvt_client_stats": (st, [c_client, P(ctypes.c_void_p)]),
        "kvt_client_ping": (st, [c_client]),
        "kvt_client_drop_engine": (st, [c_client, ctypes.c_char_p, P(ctypes.c_void_p)]),
        "kvt_client_drop_model": (st, [c_client, ctypes.c_char_p, P(ctypes.c_void_p)]),
        "kvt_client_add_engine": (st, [c_client, ctypes.c_char_p, ctypes.c_size_t,
                                       P(ctypes.c_void_p)]),
        "kvt_client_hash_tokens": (ctypes.c_size_t, [P(ctypes.c_uint32), ctypes.c_size_t,
                                                     ctypes.c_uint32, P(ctypes.c_uint64)]),
        "kvt_client_hash_tokens_salted": (ctypes.c_size_t, [P(ctypes.c_uint32), ctypes.c_size_t,
                                                            ctypes.c_uint32, ctypes.c_char_p,
                                                            P(ctypes.c_uint64)]),
        "kvt_client_hash_tokens_lora": (ctypes.c_size_t, [P(ctypes.c_uint32), ctypes.c_size_t,
                                                          ctypes.c_uint32, ctypes.c_char_p,
                                                          ctypes.c_char_p, ctypes.c_int,
                                                          P(ctypes.c_uint64)]),
        "kvt_client_attach": (st, [c_client, P(_Arena)]),
        "kvt_client_detach": (None, [P(_Arena)]),
        "kvt_client_set_engine_keys": (None, [c_client, ctypes.c_bool]),
        "kvt_client_connects": (ctypes.c_uint64, [c_client]),
        "kvt_client_connected": (ctypes.c_bool, [c_client]),
        "kvt_client_lookup": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, u64s,
                                   ctypes.c_size_t, P(ctypes.c_uint8), P(ctypes.c_uint32)]),
        "kvt_client_reserve": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, u64s,
                                    ctypes.c_size_t, P(ctypes.c_uint32), u64s, ctypes.c_size_t,
                                    P(ctypes.c_size_t)]),
        "kvt_client_commit": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, u64s,
                                   ctypes.c_size_t, P(ctypes.c_uint32), ctypes.c_bool,
                                   P(ctypes.c_uint32)]),
        "kvt_client_pin": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, u64s, ctypes.c_size_t,
                                P(_Pinned)]),
        "kvt_client_unpin": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, u64s,
                                  ctypes.c_size_t, P(ctypes.c_uint32)]),
        "kvt_client_prefetch": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, u64s,
                                     ctypes.c_size_t, P(ctypes.c_uint32)]),
        "kvt_client_block_put": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_bool]),
        "kvt_client_block_get": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                                      ctypes.c_void_p, ctypes.c_size_t, P(ctypes.c_size_t)]),
        "kvt_client_block_delete": (st, [c_client, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_uint64]),
        "kvt_client_transfer": (st, [c_client, P(_Transfer), P(_TransferOut)]),
        "kvt_client_transfer_reason": (ctypes.c_char_p, [ctypes.c_uint8]),
        "kvt_client_free": (None, [ctypes.c_void_p]),
        "kvt_client_version": (ctypes.c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def library_path():
    """The path of the libkvtier that was loaded (loads it if needed)."""
    _load()
    return _lib_path


def library_version():
    """The version of the libkvtier that was loaded ("0.1.0"; loads it if needed)."""
    return _load().kvt_client_version().decode()


def _u32_array(values, what):
    try:
        arr = array.array("I", values)
    except (OverflowError, TypeError) as e:
        raise ValueError("%s must be integers in 0..4294967295: %s" % (what, e)) from None
    if arr.itemsize != 4:  # pragma: no cover (every Linux ABI has 4-byte unsigned int)
        arr = array.array("L", values)
    return arr


def _u64_array(values, what):
    try:
        return array.array("Q", values)
    except (OverflowError, TypeError) as e:
        raise ValueError("%s must be integers in 0..2**64-1: %s" % (what, e)) from None


def _ptr(arr, ctype):
    if len(arr) == 0:
        return None
    return (ctype * len(arr)).from_buffer(arr)


def _name(s, what, allow_empty=False):
    if s is None:
        return None
    if isinstance(s, str):
        s = s.encode("utf-8")
    if not isinstance(s, (bytes, bytearray)):
        raise TypeError("%s must be a str" % what)
    if (not s and not allow_empty) or len(s) > 255 or b"\0" in s:
        raise ValueError("%s must be 1..255 bytes without NUL" % what)
    return bytes(s)


def _salt(cache_salt):
    """A request's cache salt as bytes (str is UTF-8 encoded), or None for no salt (None, "")."""
    return _name(cache_salt, "cache_salt", allow_empty=True) or None


# kvtierd's --lora-keys modes (kvt_client_lora_keys_t).
LORA_KEYS = {"namespace": 0, "dynamo": 1}


def hash_tokens(token_ids, block_size, cache_salt=None, lora=None, lora_keys="namespace"):
    """Block keys of token_ids under kvtier's hashing standard (XXH3-64, seed 1337,
    chained), as query_keys() takes them. Trailing tokens that fill no block are ignored.
    cache_salt (str or bytes, 1..255 bytes without NUL; None or "": none) is a request's
    vLLM/SGLang cache salt: it seeds the first block's hash, as kvtierd does for events and
    queries that carry it. lora (str or bytes, 1..255 bytes; None or "": the base model) is
    the request's LoRA adapter and lora_keys the kvtierd --lora-keys it is keyed under:
    "namespace" (default) leaves the keys unchanged, "dynamo" gives NVIDIA Dynamo's
    KV-router keys (every block seeded with 1337 + XXH3-64(lora, 0); with a salt, block 0
    also takes the salt's seed: kvtier's rule, docs/api.md "LoRA keys")."""
    lib = _load()
    if not isinstance(block_size, int) or not 0 < block_size < 2**32:
        raise ValueError("block_size must be an integer in 1..4294967295")
    if lora_keys not in LORA_KEYS:
        raise ValueError("lora_keys must be 'namespace' or 'dynamo'")
    salt_b = _salt(cache_salt)
    lora_b = _name(lora, "lora", allow_empty=True) or None
    toks = _u32_array(token_ids, "token_ids")
    nblocks = len(toks) // block_size
    if nblocks == 0:
        return []
    out = (ctypes.c_uint64 * nblocks)()
    n = lib.kvt_client_hash_tokens_lora(_ptr(toks, ctypes.c_uint32), len(toks), block_size,
                                        salt_b, lora_b, LORA_KEYS[lora_keys], out)
    return list(out[:n])


class Arena:
    """The sidecar's host-RAM arena, mapped into this process (Client.attach()).

    mmap is the shared, read-write mapping (an mmap.mmap of map_bytes bytes) and memory a
    writable memoryview of it; slot(i) is slot i's block_bytes bytes, a memoryview into it
    (what the slot numbers of reserve() and pin() index). The geometry is the server's, as
    kvt_client_attach() gives it: map_bytes, slot_off, slot_bytes (distance between slots),
    nslots, block_bytes (what a slot holds), disk_slots (0 without NVMe). fd is the arena's
    descriptor, this object's own.

    Read or write a slot only while your connection holds it: reserved and not yet
    committed, or pinned. The mapping does not depend on the Client (it stays valid after
    the Client is closed). close() unmaps it and closes fd; it raises BufferError while
    memoryviews of it are alive (release them first). An Arena is a context manager.
    """

    def __init__(self, fd, geometry):
        """Maps fd (taken over only once the mapping exists) with the server's geometry."""
        self.fd, self.mmap = -1, None
        (self.map_bytes, self.slot_off, self.slot_bytes, self.nslots, self.block_bytes,
         self.disk_slots) = geometry
        self.mmap = mmap.mmap(fd, self.map_bytes, flags=mmap.MAP_SHARED,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.fd = fd

    @property
    def closed(self):
        return self.mmap is None

    @property
    def memory(self):
        """A writable memoryview of the whole mapping (release it before close())."""
        if self.mmap is None:
            raise ValueError("arena is closed")
        return memoryview(self.mmap)

    def slot(self, i, length=None):
        """Slot i's bytes as a writable memoryview: block_bytes of them, or the first length.
        IndexError for a slot past nslots (or None, a key that got no slot)."""
        if not isinstance(i, int) or not 0 <= i < self.nslots:
            raise IndexError("slot %r is not in 0..%d" % (i, self.nslots - 1))
        n = self.block_bytes if length is None else int(length)
        if not 0 <= n <= self.block_bytes:
            raise ValueError("length must be in 0..%d" % self.block_bytes)
        off = self.slot_off + i * self.slot_bytes
        return self.memory[off:off + n]

    def close(self):
        """Unmaps the arena and closes its descriptor (pins stay the connection's). Idempotent;
        BufferError while memoryviews of the mapping are alive."""
        if self.mmap is None:
            return
        self.mmap.close()  # BufferError while views are exported: nothing changed then
        self.mmap = None
        os.close(self.fd)
        self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if getattr(self, "mmap", None) is not None:
                self.close()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self):
        return "kvtier.Arena(%d slots of %d bytes%s)" % (
            self.nslots, self.block_bytes, ", closed" if self.mmap is None else "")


def _u64(value, what):
    """One u64 (a key) for ctypes; ValueError outside 0..2**64-1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s must be an int" % what)
    if not 0 <= value < 2**64:
        raise ValueError("%s must be in 0..2**64-1" % what)
    return value


class Client:
    """One connection to one kvtierd ("host:port", "[v6]:port" or "unix:/path").

    timeout: seconds, for connecting and for each call. token: the auth token
    sent in HELLO (needed for report_events/add_engine/drop_engine on servers that have
    one). lazy: do not connect before the first call. The connection is
    re-established on the next call after it breaks. The tier calls (attach, lookup,
    reserve, commit, pin, unpin, prefetch, block_put, block_get, block_delete) need a
    kvtierd started with --ram-bytes; attach needs a "unix:/path" address. engine_keys:
    the tier calls' keys are an engine's block-hash ids (kvtier.offload.vllm_key(),
    sglang_key()), in a namespace apart from the sequence keys (docs/tiers.md, "Engine
    keys").
    """

    def __init__(self, addr=DEFAULT_ADDR, timeout=1.0, token=None, lazy=False,
                 engine_keys=False):
        lib = _load()
        self._lib = lib
        self._c = ctypes.c_void_p()
        self._lock = threading.Lock()
        self._get_cap = 65536  # block_get's first buffer: the largest block seen so far
        o = _Opts()
        lib.kvt_client_opts_default(ctypes.byref(o))
        o.address = _name(addr, "addr")
        ms = int(round(float(timeout) * 1000))
        if ms < 1:
            raise ValueError("timeout must be at least 0.001 s")
        o.connect_timeout_ms = o.io_timeout_ms = min(ms, 2**31 - 1)
        o.auth_token = _name(token, "token", allow_empty=True) if token else None
        o.lazy_connect = bool(lazy)
        msg = ctypes.create_string_buffer(512)
        st = lib.kvt_client_create_msg(ctypes.byref(o), ctypes.byref(self._c), msg, len(msg))
        if st != 0:
            self._c = ctypes.c_void_p()
            raise Error(st, msg.value.decode("utf-8", "replace"))
        self.addr = addr
        self.engine_keys = bool(engine_keys)
        lib.kvt_client_set_engine_keys(self._c, self.engine_keys)

    # -- plumbing --------------------------------------------------------------------------
    def _handle(self):
        if not self._c:
            raise Error(-502, "client is closed")
        return self._c

    def _raise(self, st):
        msg = self._lib.kvt_client_last_error(self._c) or b""
        raise Error(st, msg.decode("utf-8", "replace"))

    def _take_string(self, ptr):
        try:
            return ctypes.string_at(ptr.value).decode("utf-8", "replace")
        finally:
            self._lib.kvt_client_free(ptr)

    @staticmethod
    def _pods_arg(pods):
        if pods is None:
            return None, 0, None
        if isinstance(pods, (str, bytes)):
            raise TypeError("pods must be a list of names, not a single string")
        names = [_name(p, "pod name") for p in pods]
        if not names:
            return None, 0, None
        arr = (ctypes.c_char_p * len(names))(*names)
        return arr, len(names), names

    def _query(self, fn, model, values, ctype, lora, pods, extra=()):
        """fn(client, model, lora, *extra, values, n, pods, npods, result)."""
        model_b = _name(model, "model")
        lora_b = _name(lora, "lora", allow_empty=True) if lora else None
        parr, npods, _keep = self._pods_arg(pods)
        res = _Result()
        with self._lock:
            c = self._handle()
            st = fn(c, model_b, lora_b, *extra, _ptr(values, ctype), len(values), parr, npods,
                    ctypes.byref(res))
            if st != 0:
                self._raise(st)
        try:
            out = {
                "block_size": res.block_size,
                "num_blocks": res.num_blocks,
                "pods": [
                    {
                        "pod": p.pod.decode("utf-8", "replace"),
                        "dp_rank": p.dp_rank,
                        "matched_blocks": p.matched,
                        "gpu": p.gpu,
                        "cpu": p.cpu,
                        "disk": p.disk,
                        "score": p.score,
                    }
                    for p in (res.pods[i] for i in range(res.npods))
                ],
            }
        finally:
            self._lib.kvt_client_result_free(ctypes.byref(res))
        return out

    # -- calls -----------------------------------------------------------------------------
    def query_answer(self, model, token_ids, lora=None, pods=None, cache_salt=None):
        """Like query() but returns the whole answer, shaped as POST /v1/query's:
        {"block_size", "num_blocks", "pods": [...]}."""
        salt_b = _salt(cache_salt)  # None: kvt_client_query_salted is kvt_client_query
        toks = _u32_array(token_ids, "token_ids")
        return self._query(self._lib.kvt_client_query_salted, model, toks, ctypes.c_uint32, lora,
                           pods, (salt_b,))

    def query(self, model, token_ids, lora=None, pods=None, cache_salt=None):
        """Which pods hold the longest prefix of token_ids: a list of dicts
        {"pod","dp_rank","matched_blocks","gpu","cpu","disk","score"}, best first.
        pods: only rank these pod names (None: every pod). cache_salt: the request's
        vLLM/SGLang cache salt (str or bytes, 1..255 bytes; None or "": none); only
        prefixes stored with the same salt match."""
        return self.query_answer(model, token_ids, lora, pods, cache_salt)["pods"]

    def query_keys_answer(self, model, keys, lora=None, pods=None):
        """query_answer() with block sequence keys (see hash_tokens) instead of tokens.
        Keys of a salted request come from hash_tokens(..., cache_salt=): the salt is in them."""
        ks = _u64_array(keys, "keys")
        return self._query(self._lib.kvt_client_query_keys, model, ks, ctypes.c_uint64, lora, pods)

    def query_keys(self, model, keys, lora=None, pods=None):
        """query() with block sequence keys (see hash_tokens) instead of tokens."""
        return self.query_keys_answer(model, keys, lora, pods)["pods"]

    def _json_call(self, fn, body):
        """fn(c, body, len, &answer): a call with a JSON body and a JSON answer, as a dict."""
        out = ctypes.c_void_p()
        with self._lock:
            c = self._handle()
            st = fn(c, body, len(body), ctypes.byref(out))
            if st != 0:
                self._raise(st)
        return json.loads(self._take_string(out))

    def report_events(self, events):
        """Sends events (a dict, or its JSON as str/bytes) as POST /v1/events does;
        returns the server's answer as a dict."""
        body = _json_body(events, "events")
        return self._json_call(self._lib.kvt_client_report_events, body)

    def routed(self, model, pod, token_ids=None, block_hashes=None, lora=None, cache_salt=None,
               dp_rank=None, ttl_ms=None):
        """Records that a request went to pod (as POST /v1/routed does): until the engine's
        own events store its blocks or ttl_ms passes (None: the server's 2000; at most
        60000), queries count them on pod as GPU blocks, so a second request for the same
        new prefix goes there too. Exactly one of token_ids (hashed by the server as a
        query's, with cache_salt and lora) and block_hashes (keys, see hash_tokens).
        Returns the answer as a dict ({"blocks": n})."""
        if (token_ids is None) == (block_hashes is None):
            raise ValueError("give exactly one of token_ids and block_hashes")
        body = {"model": _name(model, "model").decode("utf-8"),
                "pod": _name(pod, "pod").decode("utf-8")}
        if lora:
            body["lora_name"] = _name(lora, "lora").decode("utf-8")
        salt = _salt(cache_salt)
        if salt is not None:
            body["cache_salt"] = salt.decode("utf-8")
        if token_ids is not None:
            body["token_ids"] = list(_u32_array(token_ids, "token_ids"))
        else:
            body["block_hashes"] = list(_u64_array(block_hashes, "block_hashes"))
        if dp_rank is not None:
            body["dp_rank"] = int(dp_rank)
        if ttl_ms is not None:
            body["ttl_ms"] = int(ttl_ms)
        data = _json_body(body, "body")
        return self._json_call(self._lib.kvt_client_routed, data)

    def stats(self):
        """The JSON of GET /v1/stats, as a dict."""
        out = ctypes.c_void_p()
        with self._lock:
            c = self._handle()
            st = self._lib.kvt_client_stats(c, ctypes.byref(out))
            if st != 0:
                self._raise(st)
        return json.loads(self._take_string(out))

    def ping(self):
        """A round trip; raises Error when the server does not answer."""
        with self._lock:
            c = self._handle()
            st = self._lib.kvt_client_ping(c)
            if st != 0:
                self._raise(st)

    def add_engine(self, spec):
        """Subscribes the server to an engine's KV-event stream, as POST /v1/engines
        does (spec: a dict, or its JSON as str/bytes); returns the answer as a dict."""
        body = _json_body(spec, "spec")
        return self._json_call(self._lib.kvt_client_add_engine, body)

    def _drop(self, fn, name):
        out = ctypes.c_void_p()
        with self._lock:
            c = self._handle()
            st = fn(c, name, ctypes.byref(out))
            if st != 0:
                self._raise(st)
        return json.loads(self._take_string(out))

    def drop_engine(self, pod):
        """Unsubscribes engine pod and drops what it held; returns the answer as a dict."""
        return self._drop(self._lib.kvt_client_drop_engine, _name(pod, "pod"))

    def drop_model(self, model):
        """Drops every namespace of model (base and LoRAs) and their blocks from the index;
        returns the answer as a dict ({"model", "namespaces", "blocks"}). Error 404 (status
        KVT_ERR_NOT_FOUND) for a model the index does not have."""
        return self._drop(self._lib.kvt_client_drop_model, _name(model, "model"))

    # -- tiers: the engine's data plane and the block API ---------------------------------
    # A kvtierd started with --ram-bytes holds KV blocks itself (docs/client.md, "Tiers").
    # keys: block keys (ints, 1 or more) in prompt order; lora: None or "" for the base
    # model. Reservations and pins belong to the connection: they are released when it
    # closes (close(), a call that fails with a connection error, a server restart).

    def _keys_args(self, model, keys, lora):
        model_b = _name(model, "model")
        lora_b = _name(lora, "lora", allow_empty=True) if lora else None
        ks = _u64_array(keys, "keys")
        if len(ks) == 0:
            raise ValueError("keys must not be empty")
        return model_b, lora_b, ks

    def _call(self, fn, *args):
        with self._lock:
            c = self._handle()
            st = fn(c, *args)
            if st != 0:
                self._raise(st)

    @property
    def connects(self):
        """Connections made so far. The calls reconnect by themselves after a connection
        broke or kvtierd closed an idle one: a count that changed across a call says the call
        ran on a new connection, in a new tier session (pins and reservations of the old one
        are gone; a restarted kvtierd may have a new arena)."""
        with self._lock:
            return self._lib.kvt_client_connects(self._handle())

    @property
    def connected(self):
        """False when not connected, or the idle connection is known to be closed (the next
        call reconnects); no round trip."""
        with self._lock:
            return bool(self._lib.kvt_client_connected(self._handle()))

    def attach(self):
        """ATTACH: maps the sidecar's host-RAM arena into this process and returns an Arena
        (its mmap/memoryview, slot(i) and geometry). Only over a Unix socket ("unix:/path"),
        which carries the arena's descriptor: Error (status -100) over TCP."""
        a = _Arena()
        self._call(self._lib.kvt_client_attach, ctypes.byref(a))
        geometry = (a.map_bytes, a.slot_off, a.slot_bytes, a.nslots, a.block_bytes,
                    a.disk_slots)
        try:
            fd = os.dup(a.fd)  # the Arena's own; Python's mmap gives safe views of it
        finally:
            self._lib.kvt_client_detach(ctypes.byref(a))
        try:
            return Arena(fd, geometry)
        except (OSError, ValueError) as e:
            os.close(fd)
            raise Error(-400, "attach: mmap: %s" % e) from None

    def lookup(self, model, keys, lora=None):
        """LOOKUP: how many of keys, from the first, the sidecar holds, and where: a list
        with "ram" or "disk" (on NVMe only) for each leading key held (its length is the
        hit count). Counts as an access of each block."""
        model_b, lora_b, ks = self._keys_args(model, keys, lora)
        loc = (ctypes.c_uint8 * len(ks))()
        hit = ctypes.c_uint32()
        self._call(self._lib.kvt_client_lookup, model_b, lora_b, _ptr(ks, ctypes.c_uint64),
                   len(ks), loc, ctypes.byref(hit))
        return [_LOC_NAMES[loc[i]] for i in range(hit.value)]

    def reserve(self, model, keys, lora=None):
        """RESERVE: a free RAM slot for each key, to write its block into (Arena.slot()) and
        then commit(). Returns (slots, evicted): slots[i] is key i's slot, or None when it
        is already held or reserved or no slot could be freed; evicted lists the keys of
        blocks that left the sidecar altogether to make room (kvtierd lists at most one per
        key asked). Reservations expire after the server's --lease."""
        model_b, lora_b, ks = self._keys_args(model, keys, lora)
        n = len(ks)
        slots = (ctypes.c_uint32 * n)()
        evicted = (ctypes.c_uint64 * n)()
        nevicted = ctypes.c_size_t()
        self._call(self._lib.kvt_client_reserve, model_b, lora_b, _ptr(ks, ctypes.c_uint64), n,
                   slots, evicted, n, ctypes.byref(nevicted))
        return ([None if s == _SLOT_NONE else s for s in slots],
                list(evicted[:min(nevicted.value, n)]))

    def commit(self, model, keys, lens=None, ok=True, lora=None):
        """COMMIT: ends this connection's reservations of keys (others are skipped). With
        ok the blocks become visible, lens[i] bytes each (None, or 0 in it: block_bytes);
        with ok=False their slots are given back. Returns the reservations ended."""
        model_b, lora_b, ks = self._keys_args(model, keys, lora)
        ls = None
        if lens is not None:
            ls = _u32_array(lens, "lens")
            if len(ls) != len(ks):
                raise ValueError("lens must have one length per key")
        done = ctypes.c_uint32()
        self._call(self._lib.kvt_client_commit, model_b, lora_b, _ptr(ks, ctypes.c_uint64),
                   len(ks), _ptr(ls, ctypes.c_uint32) if ls is not None else None, bool(ok),
                   ctypes.byref(done))
        return done.value

    def pin(self, model, keys, lora=None):
        """PIN: pins each key's block in RAM for this connection, reading from NVMe first the
        blocks only there; returns once all are in RAM: a list of (slot, length), slot None
        for a block not held. A pinned slot is never evicted, reused or moved until unpin(),
        this connection's end or the server's --lease."""
        model_b, lora_b, ks = self._keys_args(model, keys, lora)
        out = (_Pinned * len(ks))()
        self._call(self._lib.kvt_client_pin, model_b, lora_b, _ptr(ks, ctypes.c_uint64),
                   len(ks), out)
        return [(None if p.slot == _SLOT_NONE else p.slot, p.len) for p in out]

    def transfer(self, peer, model, keys, push=False, timeout_ms=0, lora=None, stream=False):
        """TRANSFER (POST /v1/transfer): the server pulls the blocks of keys from its peer
        sidecar ("host:port", the peer's RPC address) over UCX, or with push=True sends them
        there; returns once they landed or failed: {"transferred": [..], "missing": [..],
        "failed": [(key, reason), ..], "bytes": n, "seconds": s}. timeout_ms 0: the
        server's (30 s). stream=True (with push): keys the server does not hold yet are
        waited for, up to the timeout, and each sent as soon as it is committed there."""
        model_b, lora_b, ks = self._keys_args(model, keys, lora)
        n = len(ks)
        t = _Transfer(_name(peer, "peer"), model_b, lora_b, _ptr(ks, ctypes.c_uint64), n,
                      bool(push), int(timeout_ms), bool(stream))
        tr, mi, fa = (ctypes.c_uint64 * n)(), (ctypes.c_uint64 * n)(), (ctypes.c_uint64 * n)()
        rs = (ctypes.c_uint8 * n)()
        out = _TransferOut(tr, mi, fa, rs)
        self._call(self._lib.kvt_client_transfer, ctypes.byref(t), ctypes.byref(out))
        name = self._lib.kvt_client_transfer_reason
        return {"transferred": list(tr[:out.ntransferred]),
                "missing": list(mi[:out.nmissing]),
                "failed": [(fa[i], name(rs[i]).decode()) for i in range(out.nfailed)],
                "bytes": out.bytes, "seconds": out.ns / 1e9}

    def unpin(self, model, keys, lora=None):
        """UNPIN: releases one pin of this connection on each key (keys it has not pinned
        are skipped); returns the pins released."""
        model_b, lora_b, ks = self._keys_args(model, keys, lora)
        done = ctypes.c_uint32()
        self._call(self._lib.kvt_client_unpin, model_b, lora_b, _ptr(ks, ctypes.c_uint64),
                   len(ks), ctypes.byref(done))
        return done.value

    def prefetch(self, model, keys, lora=None):
        """PREFETCH: starts reading into RAM, without pinning, the blocks held only on NVMe
        (a router does this before it sends a request here); returns the reads started."""
        model_b, lora_b, ks = self._keys_args(model, keys, lora)
        started = ctypes.c_uint32()
        self._call(self._lib.kvt_client_prefetch, model_b, lora_b, _ptr(ks, ctypes.c_uint64),
                   len(ks), ctypes.byref(started))
        return started.value

    def block_put(self, model, key, data, durable=False, lora=None):
        """BLOCK_PUT: stores data (bytes-like, 1..block_bytes bytes) as block key; returns once
        it is in RAM, or with durable=True once it is on NVMe with its metadata committed. A
        key already held is not rewritten. Error -103 (too big) over block_bytes."""
        model_b = _name(model, "model")
        lora_b = _name(lora, "lora", allow_empty=True) if lora else None
        k = _u64(key, "key")
        if isinstance(data, bytes):
            ptr, n = data, len(data)
        else:
            mv = memoryview(data).cast("B")
            n = len(mv)
            if mv.readonly:
                ptr = bytes(mv)  # ctypes points only into writable buffers
            else:
                ptr = (ctypes.c_char * n).from_buffer(mv) if n else None
        if n == 0:
            raise ValueError("data must not be empty")
        self._call(self._lib.kvt_client_block_put, model_b, lora_b, k, ptr, n, bool(durable))

    def block_get(self, model, key, lora=None):
        """BLOCK_GET: block key's bytes. Error with status -200 (not found) when the sidecar
        does not hold it."""
        model_b = _name(model, "model")
        lora_b = _name(lora, "lora", allow_empty=True) if lora else None
        k = _u64(key, "key")
        cap = self._get_cap
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = ctypes.c_size_t(0)
            with self._lock:
                c = self._handle()
                st = self._lib.kvt_client_block_get(c, model_b, lora_b, k, buf, cap,
                                                    ctypes.byref(n))
                if st == 0:
                    return ctypes.string_at(buf, n.value)
                if st != -103 or n.value <= cap:
                    self._raise(st)
            cap = self._get_cap = n.value  # the block is larger than the last buffer
        raise Error(-501, "block_get: the block kept growing")  # a key names one content

    def block_delete(self, model, key, lora=None):
        """BLOCK_DELETE: drops block key from RAM and NVMe. Error -200 (not found) when it is
        not held, -201 (exists) while a connection pins or reserves it."""
        model_b = _name(model, "model")
        lora_b = _name(lora, "lora", allow_empty=True) if lora else None
        self._call(self._lib.kvt_client_block_delete, model_b, lora_b, _u64(key, "key"))

    def close(self):
        """Closes the connection; later calls raise Error. Idempotent."""
        with self._lock:
            if self._c:
                self._lib.kvt_client_destroy(self._c)
                self._c = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if getattr(self, "_c", None):
                self._lib.kvt_client_destroy(self._c)
                self._c = ctypes.c_void_p()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self):
        return "kvtier.Client(%r%s)" % (getattr(self, "addr", "?"), "" if self._c else ", closed")
