"""kvtier.sglang_core: SGLang HiCache's L3 storage in the kvtierd beside the engine, with no
SGLang or torch imported (issue 20). kvtier.sglang_hicache is the thin SGLang class over it;
these tests run it against a real kvtierd with the engine's host pool simulated.

A page is what HiCache's zero-copy interface moves: one page hash (64 hex characters, a
chained SHA-256) and the host buffers holding that page, a list of (pointer, size) as the
host pool's get_page_buffer_meta() gives them (K and V for an MHA page_first pool, one for
MLA, 2 per layer for layer_first). A page is one kvtier block: its buffers, concatenated, in
one arena slot, its key sglang_key(hash) (the first 8 bytes, as kvtierd decodes SGLang's
events), under the namespace (kvtier's LoRA argument) of the bytes' format and the rank.

The three calls, each answering for a batch and never raising (HiCache's prefetch and backup
threads die on an exception or None, and with them L3 for the life of the process):
  exists(keys)        -> how many leading pages kvtierd holds (RAM or NVMe): one LOOKUP
  get(keys, pages)    -> [bool]: PIN, copy slots -> buffers, UNPIN; a missing page and all
                         after it False
  set(keys, pages)    -> [bool]: RESERVE, copy buffers -> slots, COMMIT; pages already held
                         True, pages with no room False
Any failure is a miss (False, 0) and a logged warning; a broken connection is replaced on the
next call. Each of the three calls has a connection of its own (HiCache makes them from three
threads), each with its own mapping of the arena.
"""

import ctypes
import logging
import threading
import time

from kvtier.offload import Offload, connector_config, sglang_key

log = logging.getLogger("kvtier.sglang")

STORAGE_BATCH_SIZE = 128  # SGLang's pages per batched call (hicache_storage.py)


_ROLES = ("exists", "get", "set")
_WARN_EVERY = 30.0  # seconds between two warnings of one kind

def parse_config(extra, default_model=None):
    """The kvtier keys of HiCache's extra config (--hicache-storage-backend-extra-config), as
    a dict of socket, model, namespace, timeout, token (kvtier.offload.connector_config()),
    after SGLang's interface_v1, which must be set. ValueError naming the key."""
    if isinstance(extra, dict) and not extra.get("interface_v1"):
        raise ValueError("interface_v1: must be 1 (kvtier implements HiCache's zero-copy "
                         "batch_get_v1/batch_set_v1 only)")
    return dict(connector_config(extra, default_model)._asdict())


def page_namespace(layout, dtype, tp_rank=0, tp_size=1, replicated=False, pp_rank=0,
                   pp_size=1, cp_rank=0, cp_size=1, base=None):
    """The namespace of a rank's pages: what makes the bytes under one page hash differ.
    The host pool's layout and dtype (a page_first and a page_head page, or a float16 and a
    bfloat16 one, have the same size and other bytes), the TP rank unless the cache is
    replicated across TP ranks (MLA), the PP stage (its layers), the attention CP rank (its
    slice); base (kvtier_namespace) first. Parts joined by "/", e.g.
    "page_first/bfloat16/tp1of2"."""
    parts = [] if base is None else [base]
    parts += [str(layout), str(dtype).replace("torch.", "")]
    if not replicated and tp_size > 1:
        parts.append("tp%dof%d" % (tp_rank, tp_size))
    if pp_size > 1:
        parts.append("pp%dof%d" % (pp_rank, pp_size))
    if cp_size > 1:
        parts.append("cp%dof%d" % (cp_rank, cp_size))
    ns = "/".join(parts)
    if len(ns.encode()) > 255:
        raise ValueError("kvtier_namespace: too long for the namespace %r" % ns)
    return ns


def _page_len(page):
    return sum(size for _, size in page)


class _Link:
    """One role's connection: its Offload, the arena's address in this process and the
    socket it was attached on."""

    def __init__(self, off):
        self.off = off
        # the mapping's address (the ctypes view is dropped at once: mmap.close() needs that)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(off.arena.mmap))
        self.slot_off = off.arena.slot_off
        self.slot_bytes = off.arena.slot_bytes
        self.nslots = off.arena.nslots

    def addr(self, slot):
        if not isinstance(slot, int) or not 0 <= slot < self.nslots:
            raise RuntimeError("kvtierd answered slot %r of %d" % (slot, self.nslots))
        return self.base + self.slot_off + slot * self.slot_bytes

    def alive(self):
        """The connection is still the one the arena was attached on, and open."""
        return self.off.alive()

    def close(self):
        try:
            self.off.close()
        except Exception:  # already broken: the server releases what it held
            pass


class HiCacheCore:
    """SGLang HiCache's storage calls over kvtierd for one rank: see the module.

    socket: kvtierd's --rpc-unix path. model: kvtier's model name. namespace: the rank's
    (page_namespace()). writer: False on the ranks that do not write (MLA's TP ranks but 0,
    as SGLang skips their backups): set() then writes nothing and answers True. timeout:
    seconds per kvtierd call. token: kvtierd's auth token. reconnect: seconds between two
    connection attempts after one failed. samples: keep the per-batch page counts and
    bandwidths that take_samples() gives (SGLang's storage metrics).
    """

    def __init__(self, socket, model, namespace=None, writer=True, timeout=10.0, token=None,
                 reconnect=1.0, samples=False):
        self.socket, self.model, self.namespace = socket, model, namespace
        self.writer, self.timeout, self.token = writer, timeout, token
        self.reconnect = reconnect
        self.page_bytes = None  # set by register()
        self.block_bytes = None
        self._links = {r: None for r in _ROLES}
        self._locks = {r: threading.Lock() for r in _ROLES}
        self._retry_at = {r: 0.0 for r in _ROLES}
        self._stat_lock = threading.Lock()
        self._stats = dict.fromkeys(
            ("exists_calls", "exists_pages", "exists_hits", "get_ok", "get_failed",
             "set_written", "set_held", "set_failed", "set_skipped", "bytes_read",
             "bytes_written", "errors", "connects"), 0)
        self._samples = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                         "backup_bandwidth": []} if samples else None
        self._warned = {}

    # ---- set-up ----

    def register(self, page_bytes):
        """Checks that a page of page_bytes (its buffers together) fits a kvtierd slot, on a
        first connection. Raises (kvtier.Error when kvtierd cannot be reached, ValueError
        when the page is too big): the engine refuses to start with a backend that cannot
        work. Returns kvtierd's block_bytes."""
        if isinstance(page_bytes, bool) or not isinstance(page_bytes, int) or page_bytes < 1:
            raise ValueError("page_bytes must be a positive int, not %r" % (page_bytes,))
        with self._locks["exists"]:
            link = self._connect("exists", check=False)
            block = link.off.block_bytes
            if page_bytes > block:
                self._drop("exists")
                raise ValueError(
                    "a HiCache page is %d bytes, over kvtierd's --block-bytes %d at %s: start "
                    "kvtierd with --block-bytes %d or more (or a smaller --page-size)"
                    % (page_bytes, block, self.socket, page_bytes))
            self.page_bytes, self.block_bytes = page_bytes, block
        return block

    def close(self):
        """Closes the connections (kvtierd releases what they held). Calls after it
        reconnect."""
        for r in _ROLES:
            with self._locks[r]:
                self._drop(r)

    # ---- the calls ----

    def exists(self, keys):
        """How many of keys, from the first, kvtierd holds (in RAM or on NVMe): one LOOKUP per
        batch of STORAGE_BATCH_SIZE. 0 on any failure."""
        try:
            keys = list(keys)
            ids = self._ids(keys)
            self._count(exists_calls=1, exists_pages=len(keys))
            hit = 0
            if ids:
                with self._locks["exists"]:
                    link = self._connect("exists")
                    try:
                        for i in range(0, len(ids), STORAGE_BATCH_SIZE):
                            part = ids[i:i + STORAGE_BATCH_SIZE]
                            n = link.off.lookup(part)
                            hit += n
                            if n < len(part):
                                break
                    except Exception:
                        self._drop("exists")
                        raise
            self._count(exists_hits=hit)
            return hit
        except Exception as e:
            self._fail("exists", e)
            return 0

    def get(self, keys, pages):
        """Copies the pages of keys out of kvtierd into their buffers (pages[i]: page i's
        [(pointer, size)]): a list of bool, True for each page copied whole; a page not held
        (or held with another size) and every page after it False. [False] * n on any
        failure."""
        n = _len(keys)
        try:
            keys, pages = self._args(keys, pages)
            ids = self._ids(keys)
            t0, done = time.monotonic(), []
            if ids:
                with self._locks["get"]:
                    link = self._connect("get")
                    try:
                        for i in range(0, len(ids), STORAGE_BATCH_SIZE):
                            got = self._get_batch(link, ids[i:i + STORAGE_BATCH_SIZE],
                                                  pages[i:i + STORAGE_BATCH_SIZE])
                            done += got
                            if not all(got):
                                break
                    except Exception:
                        self._drop("get")
                        raise
            ok = sum(done)
            nbytes = sum(_page_len(p) for p in pages[:ok])
            self._count(get_ok=ok, get_failed=n - ok, bytes_read=nbytes)
            self._sample("prefetch", ok, nbytes, t0)
            return [i < ok for i in range(n)]
        except Exception as e:
            self._count(get_failed=n)
            self._fail("get", e)
            return [False] * n

    def set(self, keys, pages):
        """Stores the pages of keys (pages[i]: page i's [(pointer, size)]) in kvtierd: a list
        of bool, True for each page stored or already held, False for one that found no room
        (or another writer is storing it). [False] * n on any failure (reservations given
        back). On a rank that does not write, [True] * n."""
        n = _len(keys)
        try:
            keys, pages = self._args(keys, pages)
            if not self.writer:
                self._count(set_skipped=n)
                return [True] * n
            ids = self._ids(keys)
            t0, out, nbytes = time.monotonic(), [False] * n, 0
            if ids:
                with self._locks["set"]:
                    link = self._connect("set")
                    try:
                        for i in range(0, len(ids), STORAGE_BATCH_SIZE):
                            part = ids[i:i + STORAGE_BATCH_SIZE]
                            ok, wrote = self._set_batch(link, part, pages[i:i + len(part)])
                            out[i:i + len(ok)] = ok
                            nbytes += wrote
                    except Exception:
                        self._drop("set")
                        raise
            self._count(set_failed=n - len(ids))  # the pages from an invalid key on
            self._sample("backup", sum(out), nbytes, t0)
            return out
        except Exception as e:
            self._count(set_failed=n)
            self._fail("set", e)
            return [False] * n

    # ---- statistics ----

    def stats(self):
        """Counters since the start: exists_calls, exists_pages (asked), exists_hits,
        get_ok/get_failed (pages), set_written/set_held/set_failed/set_skipped (pages),
        bytes_read, bytes_written, errors, connects; connected: the roles connected now."""
        with self._stat_lock:
            s = dict(self._stats)
        s["connected"] = [r for r in _ROLES if self._links[r] is not None]
        return s

    def take_samples(self):
        """The per-batch samples since the last call (None without samples=True):
        prefetch_pgs/backup_pgs (pages per call) and prefetch_bandwidth/backup_bandwidth
        (GiB/s), as SGLang's StorageMetrics has them."""
        if self._samples is None:
            return None
        with self._stat_lock:
            s = {k: list(v) for k, v in self._samples.items()}
            for v in self._samples.values():
                v.clear()
        return s

    # ---- internals ----

    def _connect(self, role, check=True):
        """The role's live link, connected now if it has none (within its lock)."""
        link = self._links[role]
        if link is not None and not link.alive():
            log.warning("kvtier: the %s connection to %s was closed; reconnecting",
                        role, self.socket)
            self._drop(role)
            link = None
        if link is not None:
            return link
        now = time.monotonic()
        if check and now < self._retry_at[role]:
            raise ConnectionError("kvtierd at %s unreachable; next attempt in %.1f s"
                                  % (self.socket, self._retry_at[role] - now))
        try:
            off = Offload(self.socket, self.model, lora=self.namespace, timeout=self.timeout,
                          token=self.token)
        except Exception:
            self._retry_at[role] = now + self.reconnect
            raise
        try:
            link = _Link(off)
            if check and self.page_bytes is not None and self.page_bytes > off.block_bytes:
                raise ValueError("kvtierd at %s now has --block-bytes %d, under the %d-byte "
                                 "page" % (self.socket, off.block_bytes, self.page_bytes))
        except Exception:
            off.close()
            self._retry_at[role] = now + self.reconnect
            raise
        self._links[role] = link
        self._count(connects=1)
        return link

    def _drop(self, role):
        link, self._links[role] = self._links[role], None
        if link is not None:
            link.close()

    def _get_batch(self, link, ids, pages):
        off = link.off
        pins = off.prepare_load(ids)
        if pins is None:  # a page is missing: pin the prefix held
            held = off.lookup(ids)
            pins = off.prepare_load(ids[:held]) if held else None
            if not pins:
                return [False] * len(ids)
        pinned = ids[:len(pins)]
        try:
            ok = []
            for (slot, length), page in zip(pins, pages):
                if length != _page_len(page):
                    break  # stored by an engine with another page format
                src = link.addr(slot)
                for ptr, size in page:
                    ctypes.memmove(ptr, src, size)
                    src += size
                ok.append(True)
        finally:
            off.complete_load(pinned)
            off.take_events()
        return ok + [False] * (len(ids) - len(ok))

    def _set_batch(self, link, ids, pages):
        """([bool] for ids, bytes written)."""
        off = link.off
        block = off.block_bytes
        fits = [_page_len(p) <= block for p in pages]
        want = [k for k, f in zip(ids, fits) if f]
        todo, _ = off.prepare_store(want) if want else ([], [])
        first = {}
        for i, k in enumerate(ids):
            first.setdefault(k, i)
        wrote = 0
        try:
            lens = []
            for k, slot in todo:
                page = pages[first[k]]
                dst = link.addr(slot)
                for ptr, size in page:
                    ctypes.memmove(dst, ptr, size)
                    dst += size
                lens.append(_page_len(page))
            if todo:
                off.complete_store([k for k, _ in todo], lens=lens)
                wrote = sum(lens)
        except Exception:
            if todo:
                try:
                    off.complete_store([k for k, _ in todo], ok=False)
                except Exception:
                    pass
            raise
        finally:
            off.take_events()
        stored = {k for k, _ in todo}
        # keys with no slot: held already (True) or no room / being written elsewhere
        rest = [k for k, f in zip(ids, fits) if f and k not in stored]
        held = set()
        while rest:
            h = off.lookup(rest)
            held.update(rest[:h])
            rest = rest[h + 1:]
        ok = [f and (k in stored or k in held) for k, f in zip(ids, fits)]
        self._count(set_written=len(stored), set_held=sum(1 for k in ids if k in held),
                    set_failed=ok.count(False), bytes_written=wrote)
        return ok, wrote

    def _args(self, keys, pages):
        keys, pages = list(keys), list(pages)
        if len(keys) != len(pages):
            raise ValueError("%d keys and %d pages" % (len(keys), len(pages)))
        if self.page_bytes is None:
            raise RuntimeError("register() was not called")
        return keys, pages

    def _ids(self, keys):
        """kvtier's ids of keys, up to the first that is not a page hash."""
        ids = []
        for k in keys:
            try:
                ids.append(sglang_key(k))
            except (TypeError, ValueError):
                self._warn("key", "kvtier: %r is not an SGLang page hash: a miss" % (k,))
                break
        return ids

    def _count(self, **kw):
        with self._stat_lock:
            for k, v in kw.items():
                self._stats[k] += v

    def _sample(self, what, pages, nbytes, t0):
        if self._samples is None or not pages:
            return
        dt = max(time.monotonic() - t0, 1e-9)
        with self._stat_lock:
            if len(self._samples[what + "_pgs"]) < 10000:  # bounded when nobody takes them
                self._samples[what + "_pgs"].append(pages)
                self._samples[what + "_bandwidth"].append(nbytes / dt / (1 << 30))

    def _fail(self, role, e):
        self._count(errors=1)
        self._warn(role, "kvtier: %s failed, answered as a miss: %s: %s"
                   % (role, type(e).__name__, e))

    def _warn(self, kind, msg):
        """A warning, at most one of a kind every _WARN_EVERY seconds (with a count of the
        ones held back)."""
        now = time.monotonic()
        with self._stat_lock:
            last, held = self._warned.get(kind, (-_WARN_EVERY, 0))
            if now - last < _WARN_EVERY:
                self._warned[kind] = (last, held + 1)
                return
            self._warned[kind] = (now, 0)
        log.warning("%s%s", msg, " (%d more like it)" % held if held else "")


def _len(keys):
    try:
        return len(keys)
    except Exception:
        return 0
