"""kvtier.vllm_spec: vLLM's OffloadingConnector storing KV blocks in the kvtierd beside the
engine (issue 20). The logic is kvtier.vllm_core's (tested without vLLM); this module adapts
it to vLLM's types and makes the CUDA copies.

Target: vLLM 0.26.0 (tag v0.26.0, commit 568afb3a13806beb53bb2e6bd518269357b237c0), whose
vllm/v1/kv_offload/base.py defines OffloadingSpec(config), get_manager(), get_worker(
kv_caches), OffloadingManager and OffloadingWorker as used here. Launch:

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"OffloadingConnector",
      "kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"KvtierOffloadingSpec",
      "spec_module_path":"kvtier.vllm_spec","kvtier_socket":"/run/kvtier/k.sock"}}'

Extra config keys: kvtier_socket (kvtierd's --rpc-unix, required), kvtier_model (default
vLLM's model name), kvtier_namespace (a namespace, e.g. per deployment), kvtier_timeout (seconds
per call, default 10), kvtier_token_file (kvtierd's auth token); vLLM's own block_size or
blocks_per_chunk set the chunk (default one GPU block).

PYTHONHASHSEED must be set to the same value for every start of the engine: vLLM derives
the hash of the first block (NONE_HASH) from it, and from random bytes without it, so the
keys of a restarted engine would differ from those it stored.

The scheduler (KvtierOffloadingManager) asks kvtierd over its Unix socket; each worker
(KvtierOffloadingWorker) maps kvtierd's host-RAM arena (ATTACH), registers it with CUDA
(cudaHostRegister, 1 GiB at a time) and copies between its GPU KV blocks and its part of
the slots with vLLM's batched copy (swap_blocks_batch) on its own CUDA streams. The
scheduler and its workers must be on kvtierd's host.
"""

import numpy as np
import torch

from vllm import _custom_ops as ops
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig

from kvtier import vllm_core
from kvtier.offload import Offload

logger = init_logger("vllm.kvtier")
vllm_core.log = logger  # the core's warnings in vLLM's log

GIB = 1 << 30


class KvtierLoadStoreSpec(BlockIDsLoadStoreSpec):
    """kvtier slots (block_ids, one per chunk) in the arena of the scheduler's session
    `session` ((arena_id, generation); None: no session)."""

    def __init__(self, block_ids, session):
        super().__init__(block_ids)
        self.session = session

    def __repr__(self):
        return "KvtierLoadStoreSpec(%r, session %s)" % (
            self.block_ids, None if self.session is None else self.session[1])


class KvtierOffloadingManager(OffloadingManager):
    """The scheduler's side: vllm_core.ManagerCore with vLLM's types."""

    def __init__(self, core):
        self.core = core

    def lookup(self, key, req_context: ReqContext) -> LookupResult:
        return LookupResult[self.core.lookup(key, req_context.req_id)]

    def prepare_load(self, keys, req_context: ReqContext) -> LoadStoreSpec:
        slots, session = self.core.prepare_load(list(keys), req_context.req_id)
        return KvtierLoadStoreSpec(slots, session)

    def complete_load(self, keys, req_context: ReqContext):
        self.core.complete_load(keys)

    def prepare_store(self, keys, req_context: ReqContext) -> PrepareStoreOutput | None:
        got = self.core.prepare_store(list(keys), req_context.req_id)
        if got is None:
            return None
        pairs, session = got
        return PrepareStoreOutput(keys_to_store=[k for k, _ in pairs],
                                  store_spec=KvtierLoadStoreSpec([s for _, s in pairs],
                                                                 session),
                                  evicted_keys=[])

    def complete_store(self, keys, req_context: ReqContext, success: bool = True):
        self.core.complete_store(keys, ok=success)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.core.on_request_finished(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self.core.on_schedule_end(context.new_req_ids, context.preempted_req_ids)

    def has_pending_work(self) -> bool:
        return self.core.has_pending_work()

    def reset_cache(self) -> None:
        self.core.reset()

    def shutdown(self) -> None:
        self.core.close()


def _cuda_code(r):
    return int(getattr(r, "value", r))


def _host_register(ptr, nbytes):
    """cudaHostRegister of [ptr, ptr + nbytes) in pieces of at most 1 GiB: the pieces' start
    addresses. RuntimeError (nothing left registered) when CUDA refuses one."""
    cudart = torch.cuda.cudart()
    done = []
    try:
        for off in range(0, nbytes, GIB):
            n = min(GIB, nbytes - off)
            code = _cuda_code(cudart.cudaHostRegister(ptr + off, n, 0))
            if code != 0:
                raise RuntimeError(
                    "kvtier: cudaHostRegister of kvtierd's arena failed (CUDA error %d) for "
                    "bytes %d..%d of %d at %#x: the copies need the whole arena page-locked "
                    "(does kvtierd's --ram-bytes fit this host's memory?)"
                    % (code, off, off + n, nbytes, ptr))
            done.append(ptr + off)
    except BaseException:
        _host_unregister(done)
        raise
    return done


def _host_unregister(pieces):
    cudart = torch.cuda.cudart()
    for p in pieces:
        cudart.cudaHostUnregister(p)
    del pieces[:]


class _Arena:
    """One kvtierd arena mapped in this worker: its connection (ATTACH), a CPU tensor over
    the mapping, registered with CUDA, this rank's SlotLayout and, per canonical tensor, an
    int8 view of its part of every slot (nslots x page_size_bytes * blocks_per_chunk)."""

    def __init__(self, cfg, pages, worker_kv_bytes_per_block, blocks_per_chunk, rank,
                 world_size):
        self.off = Offload(cfg.socket, cfg.model, lora=cfg.namespace, timeout=cfg.timeout,
                           token=cfg.token)
        self.pieces = []
        try:
            a = self.off.arena
            self.id = vllm_core.arena_id(a)
            self.layout = vllm_core.SlotLayout.for_arena(a, pages, worker_kv_bytes_per_block,
                                                         blocks_per_chunk, rank, world_size)
            self.host = torch.frombuffer(a.mmap, dtype=torch.int8)
            self.base = self.host.data_ptr()
            self.pieces = _host_register(self.base, a.map_bytes)
            self.views = [torch.as_strided(self.host, (a.nslots, p * blocks_per_chunk),
                                           (a.slot_bytes, 1), self.layout.view_offset(t))
                          for t, p in enumerate(self.layout.pages)]
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.pieces:
            _host_unregister(self.pieces)
        self.views = self.host = None
        try:
            self.off.close()
        except BufferError:  # a tensor over the mapping is still alive: unmapped with it
            logger.debug("kvtier: arena mapping still in use at close")


class _Done:
    """A transfer's CUDA events, as vllm_core.JobTracker wants them."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def query(self):
        return self.end.query()

    def synchronize(self):
        self.end.synchronize()

    def seconds(self):
        return self.start.elapsed_time(self.end) / 1000.0


class KvtierOffloadingWorker(OffloadingWorker):
    """A worker's side: copies between its GPU KV blocks and its part of kvtier's slots."""

    def __init__(self, cfg, kv_caches: CanonicalKVCaches, worker_kv_bytes_per_block,
                 blocks_per_chunk, rank, world_size):
        vllm_core.check_groups(len(kv_caches.group_data_refs))
        self.cfg = cfg
        self.refs = [(r.tensor_idx, r.page_size_bytes) for r in kv_caches.group_data_refs[0]]
        self.geometry = (worker_kv_bytes_per_block, blocks_per_chunk, rank, world_size)
        self.pages, self.gptr, self.gstride = [], [], []
        for t in kv_caches.tensors:
            g = t.tensor if t.tensor.dtype == torch.int8 else t.tensor.view(torch.int8)
            if not g.is_cuda:
                raise ValueError("kvtier offloading copies from CUDA KV tensors, got %s"
                                 % g.device)
            stride = g.stride(0) * g.element_size()
            if t.page_size_bytes > stride:
                raise ValueError("a KV page of %d bytes in blocks %d bytes apart"
                                 % (t.page_size_bytes, stride))
            self.pages.append(t.page_size_bytes)
            self.gptr.append(g.data_ptr())
            self.gstride.append(stride)
        self.kv_caches = kv_caches  # keeps the GPU tensors alive
        self.tracker = vllm_core.JobTracker()
        self.sessions = vllm_core.WorkerSessions()
        self.streams = {"store": torch.cuda.Stream(), "load": torch.cuda.Stream()}
        first = self._attach()
        self.arenas = {first.id: first}
        self.unreachable = set()

    def _attach(self):
        return _Arena(self.cfg, self.pages, *self.geometry)

    def _arena(self, session):
        """The mapping of the session's arena, attaching kvtierd's current one when it is
        not mapped; None when that is not it either (each unknown arena is tried once)."""
        aid = tuple(session[0])
        a = self.arenas.get(aid)
        if a is not None or aid in self.unreachable:
            return a
        a = self._attach()
        if a.id in self.arenas:
            a.close()
        else:
            self.arenas[a.id] = a
        if a.id != aid:
            self.unreachable.add(aid)
            logger.warning("kvtier: the scheduler's arena is not kvtierd's now (restarted "
                           "since, or another host's kvtierd)")
            return None
        return a

    def _submit(self, job_id, kind, arena, slots, gpu_spec):
        plan = arena.layout.plan(slots, gpu_spec.block_ids, gpu_spec.group_sizes,
                                 gpu_spec.block_indices, self.refs)
        lay = arena.layout
        rows = np.asarray(plan.rows, dtype=np.int64)[None, :]
        subs = np.asarray(plan.subs, dtype=np.int64)[None, :]
        blocks = np.asarray(plan.blocks, dtype=np.int64)[None, :]
        col = lambda xs: np.asarray(xs, dtype=np.int64)[:, None]  # noqa: E731
        host = (arena.base + rows + col([lay.tensor_off[t] for t in plan.tensors])
                + subs * col([lay.pages[t] for t in plan.tensors]))
        gpu = (col([self.gptr[t] for t in plan.tensors])
               + blocks * col([self.gstride[t] for t in plan.tensors]))
        sizes = np.broadcast_to(col(plan.sizes), host.shape)
        store = kind == "store"
        src, dst = (gpu, host) if store else (host, gpu)
        src_t, dst_t, size_t = (torch.from_numpy(np.ascontiguousarray(x).reshape(-1))
                                for x in (src, dst, sizes))
        stream = self.streams[kind]
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if store:  # the model's writes to these blocks come first
            stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            start.record(stream)
            if len(plan):
                ops.swap_blocks_batch(src_t, dst_t, size_t, is_src_access_order_any=not store)
            end.record(stream)
        self.tracker.submit(job_id, kind, plan.nbytes, _Done(start, end), arena=arena.id,
                            keep=(src_t, dst_t, size_t))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        session = getattr(dst_spec, "session", None)
        arena = self._arena(session) if self.sessions.store_live(session) else None
        if arena is None:  # a dead session's reservations: nothing to write
            self.tracker.submit(job_id, "store", 0, None)
            return True
        return self._submit(job_id, "store", arena, dst_spec.block_ids, src_spec)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec,
                    dst_spec: GPULoadStoreSpec) -> bool:
        session = getattr(src_spec, "session", None)
        if session is None:
            raise RuntimeError("kvtier: a load without a kvtier session (%r)" % (src_spec,))
        self.sessions.note(session)
        arena = self._arena(session)
        if arena is None:
            raise RuntimeError("kvtier: cannot load job %d: its blocks are pinned in an arena "
                               "this worker cannot map (the scheduler and its workers must "
                               "use one kvtierd, on their host)" % job_id)
        return self._submit(job_id, "load", arena, src_spec.block_ids, dst_spec)

    def get_finished(self) -> list[TransferResult]:
        out = [TransferResult(job_id=f.job_id, success=True, transfer_size=f.nbytes,
                              transfer_time=f.seconds) for f in self.tracker.finished()]
        for aid in self.sessions.retired(list(self.arenas), self.tracker):
            self.arenas.pop(aid).close()
        return out

    def wait(self, job_ids: set[int]) -> None:
        self.tracker.wait(job_ids)

    def shutdown(self) -> None:
        self.tracker.drain()
        for a in self.arenas.values():
            a.close()
        self.arenas = {}


class KvtierOffloadingSpec(OffloadingSpec):
    """vLLM's OffloadingSpec over kvtier: see the module."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        self.kvtier = vllm_core.parse_extra_config(self.extra_config, config.model.name)
        vllm_core.check_groups(len(config.groups))
        self._manager = None
        self._worker = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            c, p = self.kvtier, self.config.parallel
            core = vllm_core.ManagerCore(
                c.socket, c.model, self.config.worker_kv_bytes_per_block, p.world_size,
                self.blocks_per_chunk, lora=c.namespace, timeout=c.timeout, token=c.token)
            logger.info("kvtier: offloading %d-byte chunks to kvtierd at %s (model %s%s)",
                        core.chunk_bytes, c.socket, c.model,
                        ", namespace %s" % c.namespace if c.namespace else "")
            self._manager = KvtierOffloadingManager(core)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            p = self.config.parallel
            self._worker = KvtierOffloadingWorker(
                self.kvtier, kv_caches, self.config.worker_kv_bytes_per_block,
                self.blocks_per_chunk, p.rank, p.world_size)
        return self._worker

