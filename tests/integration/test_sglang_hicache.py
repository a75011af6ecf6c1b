#!/usr/bin/python3
"""kvtier.sglang_hicache inside a real SGLang (issue 20; written for SGLang 0.5.18): the backend
built as `--hicache-storage-backend dynamic` builds it, through SGLang's StorageBackendFactory
and HiCacheController's register_mem_pool_host(), over SGLang's own CPU host pools (MHA
page_first and layer_first, MLA page_first), with a real kvtierd:

- batch_set_v1 of pages written into the host pool, batch_exists of the prefix, batch_get_v1
  into other host pages: the tensors equal;
- TP ranks (non-MLA) do not see each other's pages; an MLA rank > 0 reads rank 0's;
- a bad extra config and a page over --block-bytes refuse to start;
- kvtierd stopped: the calls answer misses, never raise;
- get_stats() gives SGLang's StorageMetrics with --enable-storage-metrics.

Exits 77 (skipped) where SGLang or torch cannot be imported.

Usage: test_sglang_hicache.py path/to/kvtierd
"""
import hashlib
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "router-plugin", "python"))
import kvtierd_fixture as fx  # noqa: E402

try:
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.mem_cache.storage import StorageBackendFactory
except (ImportError, OSError) as e:  # not installed, or its native libraries missing
    print("skipped: SGLang (with torch) cannot be imported here: %s" % e)
    sys.exit(77)

BIN = None
BB = 256 * 1024  # --block-bytes
PAGE = 4  # tokens per page
MODEL = "test-model"


def keys_of(n, seed=0):
    """n chained page hashes in HiCache's format (64 hex characters)."""
    prior, out = b"", []
    for i in range(n):
        prior = hashlib.sha256(prior + b"%d:%d" % (seed, i)).digest()
        out.append(prior.hex())
    return out


def mha_pool(layout="page_first", layers=4, heads=2, dim=64):
    """SGLang's MHA host pool on the CPU: a page is 2 * layers * PAGE * heads * dim * 2 bytes
    (float16)."""
    dev = MHATokenToKVPool(size=PAGE * 16, page_size=PAGE, dtype=torch.float16, head_num=heads,
                           head_dim=dim, layer_num=layers, device="cpu",
                           enable_memory_saver=False)
    return MHATokenToKVPoolHost(dev, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu")


def mla_pool(layers=4):
    dev = MLATokenToKVPool(size=PAGE * 16, page_size=PAGE, dtype=torch.bfloat16,
                           kv_lora_rank=64, qk_rope_head_dim=16, layer_num=layers,
                           device="cpu", enable_memory_saver=False)
    return MLATokenToKVPoolHost(dev, 2.0, 0, PAGE, "page_first", pin_memory=False,
                                device="cpu")


class Test(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvt_sglang_hc_", dir="/tmp")
        self.addCleanup(self.tmp.cleanup)
        self.sock = os.path.join(self.tmp.name, "k.sock")
        self.d = fx.Daemon(BIN, "--ram-bytes", str(64 * BB), "--block-bytes", str(BB),
                           "--rpc-unix", self.sock, "--pod", "engine")
        self.addCleanup(self.d.cleanup)
        self.addCleanup(self.d.stop)

    def extra(self, **kw):
        e = {"backend_name": "kvtier", "module_path": "kvtier.sglang_hicache",
             "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
             "kvtier_socket": self.sock, "kvtier_timeout": 2}
        e.update(kw)
        return e

    def backend(self, pool, tp_rank=0, tp_size=1, mla=False, metrics=False, extra=None):
        """As HiCacheController.attach_storage_backend() does: the factory, then
        register_mem_pool_host()."""
        cfg = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                   attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
                                   enable_storage_metrics=metrics,
                                   is_page_first_layout=pool.layout == "page_first",
                                   model_name=MODEL,
                                   extra_config=self.extra() if extra is None else extra)
        b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
        b.register_mem_pool_host(pool)
        self.addCleanup(b.close)
        return b

    @staticmethod
    def fill(pool, n, seed):
        """n pages of random data written into the host pool: their host indices."""
        idx = pool.alloc(n * PAGE)
        g = torch.Generator().manual_seed(seed)
        for i in range(n):
            page = pool.get_data_page(int(idx[i * PAGE]), flat=True)
            pool.set_from_flat_data_page(
                int(idx[i * PAGE]),
                torch.randn(page.shape, generator=g).to(page.dtype))
        return idx

    def pages(self, pool, idx):
        return [pool.get_data_page(int(idx[i]), flat=True).clone()
                for i in range(0, len(idx), PAGE)]

    def round_trip(self, pool, **kw):
        b = self.backend(pool, **kw)
        keys = keys_of(5, seed=1)
        src = self.fill(pool, 5, seed=1)
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_set_v1(keys, src), [True] * 5)
        self.assertEqual(b.batch_exists(keys), 5)
        self.assertEqual(b.batch_exists(keys[:3] + keys_of(1, seed=99) + keys[3:]), 3)
        self.assertTrue(b.exists(keys[0]))
        dst = pool.alloc(5 * PAGE)
        self.assertEqual(b.batch_get_v1(keys, dst), [True] * 5)
        for a, c in zip(self.pages(pool, src), self.pages(pool, dst)):
            self.assertTrue(torch.equal(a, c))
        return b, keys

    def test_mha_page_first(self):
        self.round_trip(mha_pool())

    def test_mha_layer_first(self):
        self.round_trip(mha_pool("layer_first"))

    def test_mla(self):
        pool = mla_pool()
        b, keys = self.round_trip(pool, mla=True)
        r1 = self.backend(pool, tp_rank=1, tp_size=2, mla=True)  # reads rank 0's pages
        self.assertEqual(r1.batch_exists(keys), 5)
        dst = pool.alloc(5 * PAGE)
        self.assertEqual(r1.batch_get_v1(keys, dst), [True] * 5)

    def test_tp_ranks(self):
        pool = mha_pool()
        r0 = self.backend(pool, tp_rank=0, tp_size=2)
        r1 = self.backend(pool, tp_rank=1, tp_size=2)
        keys = keys_of(3, seed=7)
        src = self.fill(pool, 3, seed=2)
        self.assertEqual(r0.batch_set_v1(keys, src), [True] * 3)
        self.assertEqual((r0.batch_exists(keys), r1.batch_exists(keys)), (3, 0))

    def test_refusals(self):
        pool = mha_pool()
        for extra, key in ((self.extra(kvtier_socket=None), "kvtier_socket"),
                           (self.extra(interface_v1=0), "interface_v1"),
                           (self.extra(kvtier_timeout=-1), "kvtier_timeout")):
            with self.assertRaisesRegex(ValueError, key):
                self.backend(pool, extra=extra)
        with self.assertRaisesRegex(ValueError, "--block-bytes"):
            self.backend(mha_pool(layers=64, heads=8, dim=128))  # 1 MiB pages
        # the calls SGLang makes only without interface_v1: misses, not exceptions
        b = self.backend(pool)
        with self.assertRaisesRegex(ValueError, "hybrid"):  # HybridCacheController's pools
            b.register_mem_host_pool_v2(pool, "mamba")
        self.assertEqual(b.batch_get(keys_of(2), [None, None]), [None, None])
        self.assertIs(b.batch_set(keys_of(2), [None, None]), False)

    def test_kvtierd_down(self):
        pool = mha_pool()
        b = self.backend(pool)
        keys = keys_of(3, seed=3)
        idx = self.fill(pool, 3, seed=3)
        self.assertEqual(b.batch_set_v1(keys, idx), [True] * 3)
        self.d.stop()
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_get_v1(keys, idx), [False] * 3)
        self.assertEqual(b.batch_set_v1(keys, idx), [False] * 3)

    def test_stats(self):
        pool = mha_pool()
        b = self.backend(pool, metrics=True)
        keys = keys_of(2, seed=4)
        idx = self.fill(pool, 2, seed=4)
        b.batch_set_v1(keys, idx)
        b.batch_get_v1(keys, idx)
        m = b.get_stats()
        self.assertEqual((m.backup_pgs, m.prefetch_pgs), ([2], [2]))
        self.assertIsNone(self.backend(pool).get_stats())


if __name__ == "__main__":
    os.environ.pop("LD_PRELOAD", None)
    BIN, _ = fx.binary_from_argv("test_sglang_hicache.py")
    unittest.main(verbosity=2)
