"""kvtier.vllm_core: the logic of vLLM's offloading spec over kvtier (issue 20), with neither
vLLM nor torch imported, so that it runs and is tested against a real kvtierd anywhere.
kvtier.vllm_spec is the thin vLLM-facing layer over it.

Scheduler side, ManagerCore (one per engine, over kvtier.offload.Offload):
  - Keys. vLLM names a chunk by an OffloadKey: the block hash of its last block and 4 bytes
    of KV-group index. kvtier's key is vllm_key() of the hash (its last 8 bytes, big-endian),
    as kvtierd's event decoder reads vLLM's hashes; the group index is dropped, so only
    one KV group is supported (check_groups()).
  - Lookups are batched. vLLM asks lookup(key) one key at a time in prefix order. The first
    key of a request is asked at once (one LOOKUP): a miss answers MISS, so a cold request
    is not delayed. After a hit, every key asked answers RETRY (or HIT_PENDING) and is
    queued; vLLM then retries the request at its next step, and on_schedule_end() resolves
    each request's queue in one LOOKUP and one PIN (a PREFETCH instead of the PIN while some
    are only on NVMe). The answers are kept per
    request until it loads, is scheduled, finishes, or they are older than lookup_ttl.
  - Hits are pinned when found, not when loaded: vLLM's prepare_load() cannot fail, so a
    block it is told is there must stay there until the copy. Blocks only on NVMe are
    prefetched and answer HIT_PENDING until they are in RAM (the scheduler never waits on
    a disk read). prepare_load() takes the request's pins (no RPC); the pins it does not
    take go back.
  - prepare_store() reserves slots (one RESERVE): the keys that got one, in input order.
    A key already held, or being stored by this engine, is left out; when no key got a slot,
    None if one of them is not held (no room: vLLM retries at its next step), else nothing.
  - complete_store() and complete_load() are queued and sent once a step (one COMMIT with
    every block's length, one UNPIN).
  - Sessions. Each connection is a session, (arena_id, generation); specs carry it, so
    the workers map the arena it names and skip stores of a lost one. A call that fails, or
    that libkvtier made on a new connection by itself (kvtierd restarted, or closed an idle
    connection), ends the session: kvtierd has dropped its pins and reservations, so its
    state is dropped too and a new session is made (once a second at most while kvtierd
    is down: meanwhile lookups miss and stores are skipped). Transfers of a lost session
    still running are waited for: their keys are not reserved again, and their completions
    release nothing of the new session.

Worker side: SlotLayout (where each rank's part of each canonical KV tensor lies in a slot,
and the copy plan of a transfer), JobTracker (transfers in flight, in submission order) and
WorkerSessions (which session is the newest). The CUDA calls are kvtier.vllm_spec's.

A slot holds a chunk of blocks_per_chunk GPU blocks for all world_size workers:
[rank 0 | rank 1 | ...], each rank's part worker_kv_bytes_per_block * blocks_per_chunk
bytes of [tensor 0 pages | tensor 1 pages | ...], tensor t's part blocks_per_chunk pages of
its page_size_bytes.
"""

import collections
import logging
import os
import time

import kvtier
from kvtier.offload import Offload, connector_config, vllm_key

log = logging.getLogger("kvtier.vllm")

# lookup() answers, the names of vLLM's LookupResult
MISS, HIT, HIT_PENDING, RETRY = "MISS", "HIT", "HIT_PENDING", "RETRY"

# a request's key, by what is known of it
_NEW, _WAIT, _HIT, _MISS = 0, 1, 2, 3
_ANSWER = {_NEW: RETRY, _WAIT: HIT_PENDING, _HIT: HIT, _MISS: MISS}

LOOKUP_TTL = 10.0     # seconds a request's lookup answers (and pins) are kept: under --lease
RETRY_INTERVAL = 1.0  # seconds between attempts to reach kvtierd while it is down
MAX_ROUNDS = 8        # steps a request waits for blocks to reach RAM, then they are pinned
RETIRE_STEPS = 4      # steps a session given up by reset() stays open for transfers in flight
DEAD_TTL = 60.0       # seconds a lost session's transfers are waited for (their completions)



# ---- configuration and geometry ----

def parse_extra_config(extra, default_model):
    """The kvtier keys of kv_connector_extra_config (kvtier.offload.connector_config(); the
    model defaults to vLLM's); ValueError naming the key that is missing or bad."""
    return connector_config(extra if extra is not None else {}, default_model)


def check_groups(ngroups):
    """vLLM's KV-cache groups: exactly one (kvtier's 64-bit key drops the group index of an
    OffloadKey, so the blocks of two groups would collide)."""
    if ngroups != 1:
        raise ValueError("kvtier offloading supports models with one KV-cache group, this one "
                         "has %d (hybrid attention, e.g. sliding window + full): kvtier's key "
                         "drops vLLM's group index" % ngroups)


def chunk_bytes(worker_kv_bytes_per_block, world_size, blocks_per_chunk):
    """The bytes of one offloaded chunk, every worker's part:
    worker_kv_bytes_per_block * world_size * blocks_per_chunk."""
    for name, v in (("worker_kv_bytes_per_block", worker_kv_bytes_per_block),
                    ("world_size", world_size), ("blocks_per_chunk", blocks_per_chunk)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError("kvtier offloading: %s must be a positive int, got %r" % (name, v))
    return worker_kv_bytes_per_block * world_size * blocks_per_chunk


def check_geometry(worker_kv_bytes_per_block, world_size, blocks_per_chunk, block_bytes):
    """A chunk must fit a kvtier slot: returns its bytes, or ValueError naming both numbers
    and the kvtierd flag to change."""
    n = chunk_bytes(worker_kv_bytes_per_block, world_size, blocks_per_chunk)
    if n > block_bytes:
        raise ValueError(
            "a vLLM chunk is %d bytes (worker_kv_bytes_per_block %d x world_size %d x "
            "blocks_per_chunk %d) but kvtierd's slots hold %d (block_bytes): start kvtierd with "
            "--block-bytes %d or more, or offload smaller chunks"
            % (n, worker_kv_bytes_per_block, world_size, blocks_per_chunk, block_bytes, n))
    return n


def offload_key_id(key):
    """kvtier's key of a vLLM OffloadKey (block hash + 4-byte big-endian group index):
    vllm_key() of the hash; ValueError for a group other than 0. An int is taken as the
    key itself."""
    if isinstance(key, int) and not isinstance(key, bool):
        return vllm_key(key)
    b = bytes(key)
    if len(b) < 5:
        raise ValueError("an OffloadKey is a block hash and 4 bytes of group, not %d bytes"
                         % len(b))
    group = int.from_bytes(b[-4:], "big")
    if group != 0:
        raise ValueError("OffloadKey of KV-cache group %d: kvtier offloads one group only"
                         % group)
    return vllm_key(b[:-4])


def arena_id(arena):
    """The identity of a mapped kvtierd arena, the same in every process that ATTACHed it
    and different after kvtierd restarts: its file's device and inode, and its geometry."""
    st = os.fstat(arena.fd)
    return (st.st_dev, st.st_ino, arena.map_bytes, arena.slot_off, arena.slot_bytes,
            arena.nslots)


# ---- the scheduler side ----

class _Down(Exception):
    """kvtierd cannot be reached now."""


class LoadError(RuntimeError):
    """prepare_load() of a key whose block this manager did not pin (vLLM cannot take a
    failed load; it never asks one that lookup() did not answer HIT)."""


class _Req:
    """What a request's lookups found: each key's state in the order vLLM asked them, the
    slot of each pinned one, the session (tag) the pins belong to."""

    __slots__ = ("t0", "order", "state", "slot", "tag", "rounds")

    def __init__(self, t0):
        self.t0, self.order, self.state, self.slot = t0, [], {}, {}
        self.tag, self.rounds = None, 0

    def set(self, u, s):
        if u not in self.state:
            self.order.append(u)
        self.state[u] = s

    def todo(self):
        return [u for u in self.order if self.state[u] in (_NEW, _WAIT)]


class ManagerCore:
    """The scheduler's side of vLLM's offloading over one kvtierd (see the module). Keys are
    OffloadKeys (bytes) or kvtier keys (ints); req_id names vLLM's request. Not
    thread-safe (vLLM's scheduler is one thread)."""

    def __init__(self, socket, model, worker_kv_bytes_per_block, world_size=1,
                 blocks_per_chunk=1, lora=None, timeout=10.0, token=None, connect=None,
                 lookup_ttl=LOOKUP_TTL, retry_interval=RETRY_INTERVAL, max_rounds=MAX_ROUNDS,
                 retire_steps=RETIRE_STEPS, clock=time.monotonic):
        """Connects (kvtier.Error when kvtierd is not there) and checks that a chunk fits
        a slot (ValueError). connect: a function returning a new Offload (tests)."""
        self.chunk_bytes = chunk_bytes(worker_kv_bytes_per_block, world_size, blocks_per_chunk)
        self._geometry = (worker_kv_bytes_per_block, world_size, blocks_per_chunk)
        self._connect_fn = connect or (lambda: Offload(socket, model, lora=lora,
                                                        timeout=timeout, token=token))
        self.socket = socket
        self.lookup_ttl, self.retry_interval = lookup_ttl, retry_interval
        self.max_rounds, self.retire_steps, self._clock = max_rounds, retire_steps, clock
        self.rpcs = collections.Counter()  # calls made to kvtierd, by Offload method
        self._off, self.tag, self._gen = None, None, 0
        self._next_try = 0.0
        self._reqs = {}                    # req_id -> _Req
        self._reserved = {}                # key -> slot: stores in flight (this session)
        self._commits = collections.OrderedDict()  # key -> ok: stores done, to COMMIT
        self._unpins = collections.Counter()       # key -> pins to release
        self._load_pins = collections.Counter()    # key -> pins owned by loads in flight
        # transfers of a lost session whose completion vLLM has not reported yet: a key is
        # not reserved again before its old store completes, and the completion of an old
        # load does not release a new load's pin
        self._dead_stores, self._dead_loads, self._dead_since = {}, collections.Counter(), 0.0
        self._retired = []                 # [offload, steps left]: sessions reset() gave up
        try:
            off = self._connect_fn()
        except kvtier.Error as e:
            raise kvtier.Error(e.status, "kvtier: cannot reach kvtierd at %s (kvtier_socket; "
                               "kvtierd's --rpc-unix): %s" % (socket, e.message)) from None
        try:
            self._use(off)
        except Exception:
            off.close()
            raise

    # ---- sessions ----

    def _use(self, off):
        check_geometry(*self._geometry, off.block_bytes)
        self._gen += 1
        self._off, self.tag = off, (arena_id(off.arena), self._gen)

    def _drop_session(self, why):
        """Forgets the session: kvtierd has dropped (or will drop) its pins and
        reservations. Its stores and loads in flight are remembered until vLLM reports them
        done. Request answers stay until the step ends: a prepare_load() of this step still
        gets the slots its lookups pinned (a restarted kvtierd writes no more into the old
        arena the workers still map)."""
        if self._off is not None:
            log.warning("kvtier: lost kvtierd at %s (%s); reconnecting", self.socket, why)
            try:
                self._off.close()
            except Exception:  # already broken
                pass
        self._off = None
        now = self._clock()
        for u in self._reserved:
            if u not in self._commits:
                self._dead_stores[u] = now
        self._dead_loads.update(self._load_pins)
        self._dead_since = now
        self._reserved.clear()
        self._commits.clear()
        self._unpins.clear()
        self._load_pins.clear()

    def _up(self):
        """The live Offload, reconnecting when the last attempt is old enough; None while
        kvtierd is down."""
        if self._off is not None and not self._off.alive():
            self._drop_session("the connection was closed")
        if self._off is not None:
            return self._off
        now = self._clock()
        if now < self._next_try:
            return None
        self._next_try = now + self.retry_interval
        try:
            off = self._connect_fn()
        except (kvtier.Error, OSError) as e:
            log.debug("kvtier: kvtierd at %s still down: %s", self.socket, e)
            return None
        try:
            self._use(off)
        except ValueError as e:  # restarted with slots too small
            log.error("kvtier: %s", e)
            off.close()
            return None
        log.warning("kvtier: reconnected to kvtierd at %s (session %d)", self.socket, self._gen)
        return self._off

    def _call(self, name, *args, **kw):
        """Offload.name(*args) on the live session. A failure drops the session and tries
        once on a new one; raises _Down when kvtierd cannot be reached."""
        for attempt in (0, 1):
            off = self._up()
            if off is None:
                raise _Down()
            self.rpcs[name] += 1
            try:
                return getattr(off, name)(*args, **kw)
            except kvtier.Error as e:  # SessionLost too: the session (maybe the arena) changed
                why = e
            self._drop_session(why)
            if attempt == 0:
                self._next_try = 0.0
        raise _Down()

    @property
    def connected(self):
        return self._off is not None

    # ---- lookups ----

    def _req(self, req_id):
        st = self._reqs.get(req_id)
        now = self._clock()
        if st is not None and (now - st.t0 > self.lookup_ttl
                               or st.tag is not None and st.tag != self.tag):
            self._forget(req_id)  # old answers, or pins of a dead session: ask again
            st = None
        if st is None:
            st = self._reqs[req_id] = _Req(now)
        return st

    def _forget(self, req_id):
        """Drops a request's answers, its pins going back."""
        st = self._reqs.pop(req_id, None)
        if st is not None and st.slot and st.tag == self.tag:
            self._unpins.update(st.slot.keys())

    def lookup(self, key, req_id):
        """Is key's chunk offloaded and loadable: HIT, MISS, HIT_PENDING (held, not yet in
        RAM: ask again next step) or RETRY (not known yet: ask again next step)."""
        u = offload_key_id(key)
        st = self._req(req_id)
        s = st.state.get(u)
        if s is not None:
            return _ANSWER[s]
        if st.state:  # not the request's first key: found at the end of the step
            st.set(u, _NEW)
            return RETRY
        if u in self._reserved:  # this engine is storing it
            st.set(u, _WAIT)
            return HIT_PENDING
        try:
            held = self._call("lookup", [u])
        except _Down:
            held = 0
        st.set(u, _WAIT if held else _MISS)
        return HIT_PENDING if held else MISS

    def _round(self, st):
        """Finds a request's queued keys: one LOOKUP, a PREFETCH when some held are only on
        NVMe, else one PIN. Keys not ready stay queued (at most max_rounds steps)."""
        if st.tag is not None and st.tag != self.tag:  # pins of a dead session
            for u in st.slot:
                st.state[u] = _NEW
            st.slot.clear()
            st.tag = None
        todo = st.todo()
        if not todo:
            return
        last = st.rounds >= self.max_rounds
        locs = self._call("locate", todo)
        held, rest = todo[:len(locs)], todo[len(locs):]
        wait = bool(rest) and rest[0] in self._reserved and not last  # being stored here
        for u in rest:
            st.state[u] = _WAIT if wait else _MISS
        waiting = wait
        if held:
            if not last and "disk" in locs and self._call("prefetch", held) > 0:
                for u in held:  # reads from NVMe started: pin them next step
                    st.state[u] = _WAIT
                waiting = True
            else:
                pins = self._call("prepare_load", held)
                if pins is None:  # one went away between LOOKUP and PIN: look again
                    for u in held + rest:
                        st.state[u] = _MISS if last else _NEW
                    waiting = not last
                else:
                    tag = self.tag
                    if st.slot and st.tag != tag:  # the session changed during this round
                        for u in st.slot:
                            st.state[u] = _NEW
                        st.slot.clear()
                        waiting = True
                    st.tag = tag
                    ok = len(held)
                    for i, (slot, length) in enumerate(pins):
                        if length != self.chunk_bytes:  # another engine's layout: not ours
                            ok = i
                            break
                    for u, (slot, _) in zip(held[:ok], pins[:ok]):
                        st.state[u] = _HIT
                        st.slot[u] = slot
                    if ok < len(held):
                        log.warning("kvtier: a block of %d bytes under a key of this model "
                                    "(this engine's chunks are %d): another geometry shares "
                                    "the namespace; give each its own kvtier_namespace",
                                    pins[ok][1], self.chunk_bytes)
                        self._unpins.update(held[ok:])
                        for u in held[ok:] + rest:
                            st.state[u] = _MISS
                        waiting = False
        if waiting:
            st.rounds += 1

    # ---- loads ----

    def prepare_load(self, keys, req_id):
        """The pinned slots of keys (all answered HIT by lookup() for req_id), in order, and
        the session they are in. The request's other pins go back; its answers are dropped.
        LoadError for a key that was not pinned."""
        us = [offload_key_id(k) for k in keys]
        st = self._reqs.pop(req_id, None)
        if not us:
            if st is not None and st.tag == self.tag:
                self._unpins.update(st.slot.keys())
            return [], self.tag
        missing = [u for u in us if st is None or u not in st.slot]
        if missing or len(set(us)) != len(us):
            if st is not None:
                self._reqs[req_id] = st
            raise LoadError("kvtier: prepare_load of keys this manager did not find and pin "
                            "for request %r: %s" % (req_id, ", ".join("%#018x" % u
                                                                      for u in missing[:4])))
        slots = [st.slot.pop(u) for u in us]
        if st.tag == self.tag:  # a live session's pins: released by complete_load()
            self._load_pins.update(us)
            self._unpins.update(st.slot.keys())
        return slots, st.tag

    def complete_load(self, keys):
        """The load of keys is done: their pins go back at the end of the step."""
        for u in {offload_key_id(k) for k in keys}:
            if self._dead_loads[u] > 0:  # a lost session's load (it came first)
                self._dead_loads[u] -= 1
                if self._dead_loads[u] == 0:
                    del self._dead_loads[u]
            elif self._load_pins[u] > 0:
                self._load_pins[u] -= 1
                self._unpins[u] += 1
            if self._load_pins[u] == 0:
                del self._load_pins[u]

    # ---- stores ----

    def prepare_store(self, keys, req_id=None):
        """Reserves a slot for each key not held: ([(key, slot)] in input order, session);
        ([], session) when all are held or being stored; None when no key got a slot and one
        is not held (no room now: ask again later). While kvtierd is down: ([], None)."""
        todo, seen = [], set()
        for k in keys:
            u = offload_key_id(k)
            if u not in self._reserved and u not in self._dead_stores and u not in seen:
                seen.add(u)
                todo.append((k, u))
        if not todo:
            return [], self.tag
        us = [u for _, u in todo]
        try:
            got, _ = self._call("prepare_store", us)
            self._off.take_events()  # kvtierd publishes the tiers' changes itself
        except _Down:
            return [], None
        slot_of = dict(got)
        out = [(k, slot_of[u]) for k, u in todo if u in slot_of]
        for u, s in got:
            self._reserved[u] = s
        if out:
            return out, self.tag
        try:
            held = self._call("lookup", us)
        except _Down:
            return [], None
        return ([], self.tag) if held == len(us) else None

    def complete_store(self, keys, ok=True):
        """The copy into the slots of keys is done (ok) or given up: COMMIT at the end of
        the step, each block chunk_bytes long. Keys not reserved here are skipped."""
        for k in keys:
            u = offload_key_id(k)
            if self._dead_stores.pop(u, None) is not None:
                continue  # a lost session's reservation: gone with it
            if u in self._reserved and u not in self._commits:
                self._commits[u] = bool(ok)

    # ---- the scheduler's step ----

    def on_request_finished(self, req_id):
        """No more lookups or loads for req_id: its unused pins go back."""
        self._forget(req_id)

    def on_schedule_end(self, new_req_ids=(), preempted_req_ids=()):
        """The end of a scheduler step: requests scheduled (new_req_ids) or preempted give
        back the pins no load took; then one COMMIT, one UNPIN, and the queued lookups."""
        for r in list(new_req_ids) + list(preempted_req_ids):
            self._forget(r)
        now = self._clock()
        for r, st in list(self._reqs.items()):
            if st.tag is not None and st.tag != self.tag:
                del self._reqs[r]  # pins of a dead session
            elif now - st.t0 > self.lookup_ttl:
                self._forget(r)  # not asked again: its pins go back before --lease
        if (self._dead_stores or self._dead_loads) and now - self._dead_since > DEAD_TTL:
            self._dead_stores.clear()
            self._dead_loads.clear()
        for entry in self._retired:
            entry[1] -= 1
        for off, _ in [e for e in self._retired if e[1] <= 0]:
            off.close()
        self._retired = [e for e in self._retired if e[1] > 0]
        if self._off is None and self._up() is None:
            self._down_answers()
            return
        try:
            self._flush()
            for st in list(self._reqs.values()):
                self._round(st)
        except _Down:
            self._down_answers()

    def _flush(self):
        if self._commits:
            for ok in (True, False):
                ks = [u for u, o in self._commits.items() if o is ok]
                if ks:
                    self._call("complete_store", ks, ok=ok,
                               lens=[self.chunk_bytes] * len(ks) if ok else None)
                    self._off.take_events()
                    for u in ks:  # (a new session has cleared both)
                        self._reserved.pop(u, None)
                        self._commits.pop(u, None)
        while self._unpins:  # a key at most once a call
            ks = list(self._unpins)
            self._call("complete_load", ks)
            self._unpins.subtract(ks)
            self._unpins = +self._unpins

    def _down_answers(self):
        """kvtierd is down: queued lookups are misses (vLLM must not wait on them)."""
        for st in self._reqs.values():
            for u in st.todo():
                st.state[u] = _MISS

    def has_pending_work(self):
        """Whether vLLM must keep stepping: lookups queued, commits or unpins to send,
        sessions to close."""
        return bool(self._commits or self._unpins or self._retired
                    or any(st.todo() for st in self._reqs.values()))

    def reset(self):
        """vLLM's reset_cache: forget every request and transfer of this session and start
        a new one. The old one stays open for retire_steps steps (the transfers vLLM
        flushes still read and write its slots), then closes and kvtierd releases its pins
        and reservations. The blocks kvtierd holds stay: they are shared and durable."""
        old = self._off
        self._reqs.clear()
        self._reserved.clear()
        self._commits.clear()
        self._unpins.clear()
        self._load_pins.clear()
        self._dead_stores.clear()  # vLLM reports no transfer from before a reset
        self._dead_loads.clear()
        self._off, self._next_try = None, 0.0
        if old is not None:
            self._retired.append([old, self.retire_steps])
        self._up()

    def close(self):
        """Commits the stores done, then closes every connection."""
        if self._off is not None:
            try:
                self._unpins.clear()
                self._flush()
            except _Down:
                pass
        for off in [self._off] + [e[0] for e in self._retired]:
            if off is not None:
                try:
                    off.close()
                except Exception:
                    pass
        self._off, self._retired = None, []
        self._reqs.clear()


# ---- the worker side ----

class CopyPlan:
    """The copies of one transfer between a worker's GPU blocks and kvtier slots, as byte
    offsets: for each GPU block i, rows[i] is the offset in the arena mapping of its slot's
    rank part and subs[i] its page within the chunk; tensors[r], sizes[r] say which canonical
    tensor reference r copies and how many bytes. ops() lists them all."""

    def __init__(self, layout, rows, subs, blocks, refs):
        self.layout, self.rows, self.subs, self.blocks = layout, rows, subs, blocks
        self.tensors = [t for t, _ in refs]
        self.sizes = [n for _, n in refs]
        self.nbytes = len(blocks) * sum(self.sizes)

    def __len__(self):
        return len(self.blocks) * len(self.sizes)

    def ops(self):
        """(host offset in the mapping, tensor index, GPU block id, bytes) per copy."""
        lay = self.layout
        for t, n in zip(self.tensors, self.sizes):
            off, page = lay.tensor_off[t], lay.pages[t]
            for row, sub, b in zip(self.rows, self.subs, self.blocks):
                yield row + off + sub * page, t, b, n


class SlotLayout:
    """Where worker `rank`'s canonical KV tensors (pages: page_size_bytes of each) lie in a
    kvtier slot (see the module), checked against the arena's geometry."""

    def __init__(self, pages, worker_kv_bytes_per_block, blocks_per_chunk, rank, world_size,
                 slot_off, slot_bytes, block_bytes, nslots):
        self.chunk_bytes = check_geometry(worker_kv_bytes_per_block, world_size,
                                          blocks_per_chunk, block_bytes)
        if not 0 <= rank < world_size:
            raise ValueError("rank %r is not in 0..%d" % (rank, world_size - 1))
        self.pages = [int(p) for p in pages]
        if not self.pages or min(self.pages) <= 0:
            raise ValueError("kvtier offloading needs KV tensors with pages > 0 bytes: %r"
                             % (pages,))
        self.per_worker = worker_kv_bytes_per_block * blocks_per_chunk
        used = sum(self.pages) * blocks_per_chunk
        if used > self.per_worker:
            raise ValueError("this worker's KV pages take %d bytes a chunk, more than its "
                             "share %d (worker_kv_bytes_per_block %d x blocks_per_chunk %d)"
                             % (used, self.per_worker, worker_kv_bytes_per_block,
                                blocks_per_chunk))
        self.blocks_per_chunk, self.rank, self.world_size = blocks_per_chunk, rank, world_size
        self.slot_off, self.slot_bytes, self.nslots = slot_off, slot_bytes, nslots
        self.tensor_off, off = [], rank * self.per_worker
        for p in self.pages:
            self.tensor_off.append(off)
            off += p * blocks_per_chunk

    @classmethod
    def for_arena(cls, arena, pages, worker_kv_bytes_per_block, blocks_per_chunk, rank,
                  world_size):
        return cls(pages, worker_kv_bytes_per_block, blocks_per_chunk, rank, world_size,
                   arena.slot_off, arena.slot_bytes, arena.block_bytes, arena.nslots)

    def view_offset(self, t):
        """The offset in the mapping of tensor t's part of slot 0 (slot s: + s * slot_bytes;
        its page j: + j * pages[t])."""
        return self.slot_off + self.tensor_off[t]

    def offset(self, slot, t, sub=0):
        """The offset in the mapping of page sub of tensor t in slot."""
        return self.slot_off + slot * self.slot_bytes + self.tensor_off[t] + sub * self.pages[t]

    def plan(self, slots, block_ids, group_sizes, block_indices, refs):
        """The copies between GPU blocks block_ids and the chunks in slots, as vLLM's
        GPULoadStoreSpec gives them: one group of group_sizes[0] blocks whose first is block
        block_indices[0] of the request, so it starts at page block_indices[0] %
        blocks_per_chunk of the first chunk. refs: (tensor index, bytes) per layer reference
        of the group (vLLM's CanonicalKVCacheRef)."""
        slots, block_ids = [int(s) for s in slots], [int(b) for b in block_ids]
        if len(group_sizes) != 1 or len(block_indices) != 1:
            raise ValueError("one KV-cache group expected, got group_sizes %r"
                             % (list(group_sizes),))
        n = int(group_sizes[0])
        if n != len(block_ids):
            raise ValueError("group size %d for %d GPU blocks" % (n, len(block_ids)))
        bpc = self.blocks_per_chunk
        skip = int(block_indices[0]) % bpc
        if len(slots) != (n + skip + bpc - 1) // bpc:
            raise ValueError("%d slots for %d GPU blocks starting at page %d of a chunk of %d"
                             % (len(slots), n, skip, bpc))
        for s in slots:
            if not 0 <= s < self.nslots:
                raise ValueError("slot %d is not in the arena's 0..%d" % (s, self.nslots - 1))
        refs = [(int(t), int(size)) for t, size in refs]
        for t, size in refs:
            if not 0 <= t < len(self.pages) or not 0 < size <= self.pages[t]:
                raise ValueError("reference (tensor %d, %d bytes) does not fit pages %r"
                                 % (t, size, self.pages))
        rows, subs = [], []
        base = self.slot_off
        for i in range(n):
            q = skip + i
            rows.append(base + slots[q // bpc] * self.slot_bytes)
            subs.append(q % bpc)
        return CopyPlan(self, rows, subs, block_ids, refs)


Finished = collections.namedtuple("Finished", "job_id nbytes seconds")


class JobTracker:
    """A worker's transfers in flight, by direction, in submission order (each direction's
    copies run in order on one stream). A transfer's `done` has query() (finished?),
    synchronize() (wait) and seconds(); None: nothing to copy (done at once)."""

    def __init__(self):
        self._queues = {"store": collections.deque(), "load": collections.deque()}
        self._by_id = {}
        self._ready = []

    def submit(self, job_id, kind, nbytes, done, arena=None, keep=None):
        """Records transfer job_id ("store" or "load") of nbytes on arena; keep: what must
        live until it is done (the pointer tensors)."""
        if job_id in self._by_id or any(f.job_id == job_id for f in self._ready):
            raise ValueError("job %r is already in flight" % (job_id,))
        if done is None:
            self._ready.append(Finished(job_id, 0, 0.0))
            return
        entry = (job_id, nbytes, done, arena, keep)
        self._queues[kind].append(entry)
        self._by_id[job_id] = entry

    def finished(self):
        """The transfers done since the last call, each direction's in order."""
        out, self._ready = self._ready, []
        for q in self._queues.values():
            while q and q[0][2].query():
                job_id, nbytes, done, _, _ = q.popleft()
                del self._by_id[job_id]
                out.append(Finished(job_id, nbytes, done.seconds()))
        return out

    def wait(self, job_ids):
        """Blocks until the transfers job_ids (those in flight) are done."""
        for j in job_ids:
            entry = self._by_id.get(j)
            if entry is not None:
                entry[2].synchronize()

    def in_flight(self, arena=None):
        """Transfers not reported yet (on arena, when given)."""
        return sum(1 for e in self._by_id.values() if arena is None or e[3] == arena)

    def drain(self):
        """Waits for every transfer and forgets them."""
        for q in self._queues.values():
            while q:
                q.popleft()[2].synchronize()
        self._by_id.clear()
        self._ready = []


class WorkerSessions:
    """Which scheduler session (arena_id, generation) is the newest a worker has seen. A
    store for an older one is skipped: its reservations died with it, and the slots may
    hold other blocks now. A load always reads the arena it names (pinned there)."""

    def __init__(self):
        self.newest = None

    def note(self, tag):
        if tag is not None and (self.newest is None or tag[1] > self.newest[1]):
            self.newest = tuple(tag)
        return self.newest

    def store_live(self, tag):
        """Whether a store for session tag is to be copied."""
        if tag is None:
            return False
        self.note(tag)
        return tag[1] >= self.newest[1]

    def retired(self, arena_ids, tracker):
        """The arenas among arena_ids that no session uses any more and no transfer reads
        (none before a session is seen)."""
        if self.newest is None:
            return []
        return [a for a in arena_ids if a != self.newest[0] and tracker.in_flight(a) == 0]
