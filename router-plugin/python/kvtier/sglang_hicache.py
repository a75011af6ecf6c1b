"""kvtier.sglang_hicache: an SGLang HiCache L3 storage backend in the kvtierd beside the engine
(issue 20). Target release: SGLang 0.5.18 (tag v0.5.18, commit
71de97b264b04dcd514cf904003028aefe9775c8). An unmodified SGLang loads it with:

  --enable-hierarchical-cache --hicache-storage-backend dynamic
  --hicache-storage-backend-extra-config '{"backend_name":"kvtier",
    "module_path":"kvtier.sglang_hicache","class_name":"KvtierHiCacheStorage",
    "interface_v1":1,"kvtier_socket":"/run/kvtier/k.sock"}'

Extra config: kvtier_socket (kvtierd's --rpc-unix, required), kvtier_model (default SGLang's
served model name), kvtier_namespace (a prefix of the namespace, to keep deployments apart),
kvtier_timeout (seconds per kvtierd call, default 10), kvtier_token_file (kvtierd's auth
token). interface_v1 must be 1: only the zero-copy calls are implemented.

This module only adapts SGLang's objects (the host pool's page buffers, its config) to
kvtier.sglang_core, where the logic and its tests are. Configuration errors raise at start;
after that every call answers, a failure as a miss, never an exception or None.
"""

import logging

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult

from kvtier.sglang_core import HiCacheCore, page_namespace, parse_config

log = logging.getLogger("kvtier.sglang")


class KvtierHiCacheStorage(HiCacheStorage):
    """HiCache storage in kvtierd: see the module."""

    def __init__(self, storage_config, kwargs=None):
        """storage_config: SGLang's HiCacheStorageConfig; kwargs: the factory's extra
        arguments (none used). ValueError for a bad extra config."""
        self.storage_config = storage_config
        self.conf = parse_config(storage_config.extra_config, storage_config.model_name)
        if getattr(storage_config, "should_split_heads", False):
            raise ValueError("tp_lcm_size: splitting a page's heads between TP sizes is not "
                             "supported by the kvtier backend")
        self.mem_pool_host = None
        self.core = None
        self._refused = set()

    def register_mem_pool_host(self, mem_pool_host):
        """Takes the host pool, connects to kvtierd and checks that a page fits its slots.
        Raises when it cannot work (SGLang then refuses to start)."""
        pool = mem_pool_host
        if getattr(pool, "kv_buffer", None) is None or not hasattr(pool, "get_page_buffer_meta"):
            raise ValueError("the kvtier backend needs a host KV pool with page buffers "
                             "(get_page_buffer_meta); %s has none" % type(pool).__name__)
        if getattr(pool, "dcp_size", 1) > 1:
            raise ValueError("the kvtier backend does not support decode context parallelism "
                             "(dcp_size %d)" % pool.dcp_size)
        ptrs, sizes = pool.get_page_buffer_meta(torch.arange(pool.page_size, dtype=torch.int64))
        if not ptrs or len(ptrs) != len(sizes):
            raise ValueError("the host pool gave no page buffers")
        cfg = self.storage_config
        ns = page_namespace(pool.layout, pool.dtype, cfg.tp_rank, cfg.tp_size, cfg.is_mla_model,
                            cfg.pp_rank, cfg.pp_size, getattr(cfg, "attn_cp_rank", 0),
                            getattr(cfg, "attn_cp_size", 1), base=self.conf["namespace"])
        core = HiCacheCore(self.conf["socket"], self.conf["model"], namespace=ns,
                           writer=not (cfg.is_mla_model and cfg.tp_rank != 0),
                           timeout=self.conf["timeout"], token=self.conf["token"],
                           samples=bool(cfg.enable_storage_metrics))
        block = core.register(int(sum(sizes)))
        super().register_mem_pool_host(pool)
        self.core = core
        log.info("kvtier: HiCache pages of %d bytes (%d buffers) in kvtierd %s, model %r, "
                 "namespace %r (slots of %d bytes)%s", sum(sizes), len(ptrs),
                 self.conf["socket"], self.conf["model"], ns, block,
                 "" if core.writer else "; this rank reads only (MLA, TP rank > 0)")

    def _pages(self, keys, host_indices):
        """Each key's page as [(pointer, size)], from the host pool (page i's tokens start at
        host_indices[i * page_size])."""
        pool, n = self.mem_pool_host, len(keys)
        if n == 0:
            return []
        if host_indices.numel() != n * pool.page_size:
            raise ValueError("%d host indices for %d pages of %d tokens"
                             % (host_indices.numel(), n, pool.page_size))
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        per = len(ptrs) // n
        if per < 1 or per * n != len(ptrs) or len(sizes) != len(ptrs):
            raise ValueError("%d page buffers for %d pages" % (len(ptrs), n))
        return [list(zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per]))
                for i in range(n)]

    # ---- the zero-copy calls HiCache makes (interface_v1) ----

    def batch_exists(self, keys, extra_info=None):
        """How many of keys, from the first, kvtierd holds; 0 on any failure."""
        try:
            return self.core.exists(keys)
        except Exception as e:
            log.warning("kvtier: batch_exists failed, a miss: %s", e)
            return 0

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Loads the pages of keys into the host pool at host_indices: [bool] per page."""
        try:
            return self.core.get(keys, self._pages(keys, host_indices))
        except Exception as e:
            log.warning("kvtier: batch_get_v1 failed, all misses: %s", e)
            return _falses(keys)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Stores the pages of keys from the host pool at host_indices: [bool] per page."""
        try:
            return self.core.set(keys, self._pages(keys, host_indices))
        except Exception as e:
            log.warning("kvtier: batch_set_v1 failed, all false: %s", e)
            return _falses(keys)

    # ---- the per-key and flat-page calls: not implemented (misses) ----

    def exists(self, key):
        return self.batch_exists([key]) == 1

    def _refuse(self, call):
        if call not in self._refused:
            self._refused.add(call)
            log.warning("kvtier: %s is not implemented (only interface_v1's zero-copy calls): "
                        "answered as a miss", call)

    def get(self, key, target_location=None, target_sizes=None):
        self._refuse("get")
        return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        self._refuse("batch_get")
        return [None] * len(keys)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        self._refuse("set")
        return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        self._refuse("batch_set")
        return False

    # ---- the multi-pool calls (hybrid models): refused at start, misses if called ----

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        raise ValueError("the kvtier backend does not store extra host pools (%s): hybrid "
                         "models (Mamba, SWA, DSA indexer) are not supported" % host_pool_name)

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        return PoolTransferResult(0 if pool_transfers else self.batch_exists(keys), {})

    def batch_get_v2(self, transfers, extra_info=None):
        self._refuse("batch_get_v2")
        return {t.name: _falses(t.keys or []) for t in transfers}

    def batch_set_v2(self, transfers, extra_info=None):
        self._refuse("batch_set_v2")
        return {t.name: _falses(t.keys or []) for t in transfers}

    # ---- management ----

    def clear(self):
        """Not supported: kvtierd's blocks are shared with its other users and age out by
        LRU. SGLang's clear_storage_backend() reports the failure."""
        raise NotImplementedError("kvtier does not clear its blocks for an engine; they age "
                                  "out by LRU (restart kvtierd without --disk-path to drop them)")

    def close(self):
        if self.core is not None:
            self.core.close()

    def get_stats(self):
        """SGLang's StorageMetrics of the batches since the last call (with
        --enable-storage-metrics), else None. kvtier's own counters: self.core.stats()."""
        try:
            samples = self.core.take_samples() if self.core is not None else None
            if samples is None:
                return None
            from sglang.srt.observability.metrics_collector import StorageMetrics
            m = StorageMetrics()
            for k, v in samples.items():
                getattr(m, k).extend(v)
            return m
        except Exception as e:
            log.warning("kvtier: get_stats failed: %s", e)
            return None


def _falses(keys):
    try:
        return [False] * len(keys)
    except Exception:
        return []
