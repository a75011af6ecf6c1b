"""kvtier.offload: an inference engine's KV offloading to the kvtierd beside it, with no engine
imported (issue 20). vLLM's OffloadingSpec and SGLang's HiCache backend are thin layers over
this core; its tests run against a real kvtierd in the order those engines call it.

One Offload is one connection on the sidecar's Unix socket (--rpc-unix) and the sidecar's
host-RAM arena mapped into this process (ATTACH). Keys are kvtier's 64-bit block keys; the
engines' own block hashes map to them as kvtierd's event decoders map them (vllm_key(),
sglang_key()), so the index, the tiers and the events agree on one key per block.

The calls, in the order an engine makes them:
  store   prepare_store(keys) -> slots to write (keys already held get none), then
          complete_store(keys) (or complete_store(keys, ok=False) to give the slots back)
  find    lookup(keys) -> how many leading keys the sidecar holds (RAM or NVMe)
  load    prepare_load(keys) -> the pinned slots to read, then complete_load(keys)
  events  take_events() -> what was stored and removed since the last call

Pins and reservations belong to the connection, and the slots to the arena mapped here:
if the connection breaks, kvtierd releases them all. The call that finds it broken raises
kvtier.Error; a call that ran on a new connection (libkvtier reconnects by itself, after a
kvtierd restart or an idle close) raises SessionLost and closes this Offload, since its
slots may name another arena's. A new Offload starts clean. Not thread-safe: one per
scheduler or worker thread.
"""

import collections
import collections.abc

import kvtier

_MASK64 = (1 << 64) - 1

# The keys both connectors take from the engine's extra config (docs/connectors.md).
CONFIG_KEYS = ("kvtier_socket", "kvtier_model", "kvtier_namespace", "kvtier_timeout",
               "kvtier_token_file")
Config = collections.namedtuple("Config", "socket model namespace timeout token")


class SessionLost(kvtier.Error):
    """The call ran on a new connection to kvtierd: this Offload's pins, reservations and
    arena mapping are stale, and it is closed. Open a new Offload."""

    def __init__(self):
        super().__init__(-504, "the connection to kvtierd was made anew (a restart or an "
                         "idle close): pins, reservations and the arena mapping are gone")


def connector_config(extra, default_model):
    """The kvtier keys of an engine's extra config as a Config; ValueError starting with the
    key that is missing or bad, or with an unknown kvtier_* key (other keys are the
    engine's). kvtier_socket: kvtierd's --rpc-unix path ("unix:" prefix optional; required);
    kvtier_model: the model blocks are stored under (default default_model); kvtier_namespace:
    kvtier's LoRA name for them (default none); kvtier_timeout: seconds per call (0.001..3600,
    default 10); kvtier_token_file: a file holding kvtierd's auth token."""
    if not isinstance(extra, collections.abc.Mapping):  # vLLM hands a Mapping, SGLang a dict
        raise ValueError("the extra config must be a JSON object with kvtier_socket")
    for k in extra:
        if isinstance(k, str) and k.startswith("kvtier_") and k not in CONFIG_KEYS:
            raise ValueError("%s: unknown key (known: %s)" % (k, ", ".join(CONFIG_KEYS)))

    def text(key, value, limit=255):
        if not isinstance(value, str) or not value or len(value.encode()) > limit \
                or "\0" in value:
            raise ValueError("%s: must be a string of 1..%d bytes, not %r" % (key, limit, value))
        return value

    if "kvtier_socket" not in extra:
        raise ValueError("kvtier_socket: missing (kvtierd's --rpc-unix path)")
    socket = text("kvtier_socket", extra["kvtier_socket"], 4096)
    path = socket[5:] if socket.startswith("unix:") else socket
    if not path.strip():
        raise ValueError("kvtier_socket: empty path")
    model = extra.get("kvtier_model", default_model)
    if model is None:
        raise ValueError("kvtier_model: missing, and the engine gave no model name")
    model = text("kvtier_model", model)
    namespace = extra.get("kvtier_namespace")
    if namespace is not None:
        namespace = text("kvtier_namespace", namespace, 128)
    timeout = extra.get("kvtier_timeout", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0.001 <= timeout <= 3600:
        raise ValueError("kvtier_timeout: must be seconds in 0.001..3600, not %r" % (timeout,))
    token = None
    if "kvtier_token_file" in extra:
        tf = text("kvtier_token_file", extra["kvtier_token_file"], 4096)
        try:
            token = read_token_file(tf)
        except ValueError as e:
            raise ValueError("kvtier_token_file: %s" % e) from None
    return Config(path, model, namespace, float(timeout), token)


def read_token_file(path):
    """kvtierd's auth token from the file at path (its --auth-token-file), stripped;
    ValueError saying why when it cannot be read or is empty."""
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        raise ValueError(str(e)) from None
    if not token:
        raise ValueError("%s is empty" % path)
    return token


def vllm_key(block_hash):
    """kvtier's key of a vLLM block hash: an int as is (two's complement for a negative one),
    bytes by their last 8, big-endian, as kvtierd decodes vLLM's BlockStored events."""
    if isinstance(block_hash, int) and not isinstance(block_hash, bool):
        return block_hash & _MASK64
    b = bytes(block_hash)
    if not 1 <= len(b) <= 64:
        raise ValueError("a block hash has 1..64 bytes, not %d" % len(b))
    return int.from_bytes(b[-8:], "big")


def sglang_key(page_hash):
    """kvtier's key of an SGLang page hash: an int as is (two's complement), bytes by their
    first 8, big-endian, and a hex string (HiCache's keys) as those bytes, as kvtierd decodes
    SGLang's events."""
    if isinstance(page_hash, int) and not isinstance(page_hash, bool):
        return page_hash & _MASK64
    if isinstance(page_hash, str):
        b = bytes.fromhex(page_hash)
    else:
        b = bytes(page_hash)
    if not 1 <= len(b) <= 64:
        raise ValueError("a page hash has 1..64 bytes, not %d" % len(b))
    return int.from_bytes(b[:8], "big")


class Offload:
    """The engine's side of kvtier's tiers for one model (and LoRA adapter): see the module."""

    def __init__(self, socket, model, lora=None, timeout=10.0, token=None, engine_keys=True):
        """socket: kvtierd's --rpc-unix path ("unix:" prefix optional). timeout: seconds per
        call. token: kvtierd's auth token, when it has one. engine_keys: the keys are engine
        block-hash ids (vllm_key(), sglang_key()); False: kvtier's sequence keys."""
        addr = socket if socket.startswith("unix:") else "unix:" + socket
        self.model, self.lora = model, lora
        self._client = kvtier.Client(addr, timeout=timeout, token=token, engine_keys=engine_keys)
        try:
            self.arena = self._client.attach()
        except Exception:
            self._client.close()
            raise
        self.block_bytes = self.arena.block_bytes
        self._connects = self._client.connects
        self.closed = False
        self._reserved = {}  # key -> slot, between prepare_store and complete_store
        self._pinned = {}    # key -> pins taken by prepare_load, not yet completed
        self._events = []    # ("stored" | "removed", [keys]) in order

    def alive(self):
        """False when this Offload is closed, or its connection is known to be gone (so the
        next call would raise SessionLost): no round trip."""
        return not self.closed and self._client.connected

    def _call(self, fn, *args, **kw):
        """fn(*args, **kw) on this Offload's session; SessionLost (and closed) when it ran on
        a new connection."""
        if self.closed:
            raise kvtier.Error(-502, "this Offload is closed")
        try:
            out = fn(*args, **kw)
        except kvtier.Error:
            if self._client.connects == self._connects:
                raise
            out = None
        if self._client.connects != self._connects:
            self.close()
            raise SessionLost()
        return out

    # ---- the scheduler's side ----

    def lookup(self, keys):
        """How many of keys, from the first, the sidecar holds (in RAM or on NVMe). Counts as
        an access of each block (eviction order)."""
        return len(self.locate(keys))

    def locate(self, keys):
        """lookup() with where each leading key held is: "ram" or "disk" (only on NVMe)."""
        keys = list(keys)
        if not keys:
            return []
        return self._call(self._client.lookup, self.model, keys, self.lora)

    def prefetch(self, keys):
        """Starts reading into RAM the blocks of keys held only on NVMe (no pins); returns
        the reads started."""
        keys = list(keys)
        if not keys:
            return 0
        return self._call(self._client.prefetch, self.model, keys, self.lora)

    def touch(self, keys):
        """Marks keys as recently used (a LOOKUP, whose answer is not needed)."""
        self.lookup(keys)

    def prepare_store(self, keys):
        """Reserves a slot for each key: a list of (key, slot) for the keys to write now (a
        key already held or being written, or one no slot could be freed for, gets none and
        is left out), and the keys of blocks evicted from the sidecar to make room (also in
        take_events() as "removed")."""
        keys = list(keys)
        if not keys:
            return [], []
        slots, evicted = self._call(self._client.reserve, self.model, keys, self.lora)
        todo = []
        for k, s in zip(keys, slots):
            if s is not None:
                self._reserved[k] = s
                todo.append((k, s))
        if evicted:
            self._events.append(("removed", list(evicted)))
        return todo, list(evicted)

    def complete_store(self, keys, ok=True, lens=None):
        """Ends the reservations of keys (keys not reserved here are skipped): with ok their
        blocks (lens[i] bytes each; None: block_bytes) become visible and are reported
        "stored"; without, the slots go back. Returns the keys completed."""
        keys = [k for k in keys if k in self._reserved]
        if not keys:
            return []
        if lens is not None and len(lens) != len(keys):
            raise ValueError("lens must have one length per reserved key")
        self._call(self._client.commit, self.model, keys, lens=lens, ok=ok, lora=self.lora)
        for k in keys:
            del self._reserved[k]
        if ok:
            self._events.append(("stored", keys))
        return keys

    def prepare_load(self, keys):
        """Pins keys in RAM (reading from NVMe first those only there) and returns a list of
        (slot, length) to read, or None when one of them is not held any more (then nothing
        stays pinned: the caller recomputes those blocks)."""
        keys = list(keys)
        if not keys:
            return []
        pins = self._call(self._client.pin, self.model, keys, self.lora)
        if any(s is None for s, _ in pins):
            held = [k for k, (s, _) in zip(keys, pins) if s is not None]
            if held:
                self._call(self._client.unpin, self.model, held, self.lora)
            return None
        for k in keys:
            self._pinned[k] = self._pinned.get(k, 0) + 1
        return pins

    def complete_load(self, keys):
        """Releases the pins prepare_load() took on keys (one each; others are skipped)."""
        keys = [k for k in keys if self._pinned.get(k, 0) > 0]
        if not keys:
            return 0
        n = self._call(self._client.unpin, self.model, keys, self.lora)
        for k in keys:
            self._pinned[k] -= 1
            if self._pinned[k] == 0:
                del self._pinned[k]
        return n

    def take_events(self):
        """The ("stored" | "removed", keys) changes since the last call, oldest first."""
        ev, self._events = self._events, []
        return ev

    # ---- the worker's side: the arena's bytes ----

    def slot(self, i, length=None):
        """Slot i of the arena as a writable memoryview (see kvtier.Arena.slot())."""
        return self.arena.slot(i, length)

    def close(self):
        """Closes the connection (kvtierd releases its pins and reservations) and unmaps the
        arena."""
        if self.closed:
            return
        self.closed = True
        self._reserved.clear()
        self._pinned.clear()
        self._client.close()
        self.arena.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
