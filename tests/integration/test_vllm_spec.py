#!/usr/bin/python3
"""kvtier.vllm_spec inside a real vLLM (0.26.0 targeted) with a real kvtierd and a small CUDA
KV cache (issue 20): the spec is loaded as vLLM loads it (OffloadingSpecFactory, by
spec_name and spec_module_path), its manager and worker make a request's store (GPU ->
slots: the bytes in kvtierd are the GPU's, rank 0's part of the layout), its lookup (a step
deferred, then HIT), its load back into other GPU blocks (also from the middle of a chunk),
and give every pin back; bad extra config and a second KV group are refused.

Exits 77 (skipped, with the reason) when torch, a CUDA device or vllm is not there.

Usage: test_vllm_spec.py path/to/kvtierd
"""
import dataclasses
import hashlib
import os
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "router-plugin", "python"))
import kvtierd_fixture as fx  # noqa: E402

BIN = None
torch = base = config = factory = None  # imports()
BB = 64 * 1024
MODEL = "test-model"
PAGES = [4096, 8192]          # two canonical KV tensors
REFS = [(0, 4096), (1, 8000)]  # the second's un-padded page is shorter
WKB = 16384                   # worker_kv_bytes_per_block (12 KiB used)
BPC = 2                       # 2 GPU blocks a chunk: 32 KiB, within the 64 KiB slots
NB = 64                       # GPU blocks


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


def imports():
    """Imports torch and vLLM's offloading API into this module, or exits 77."""
    global torch, base, config, factory
    try:
        import torch
    except ImportError as e:
        skip("no torch: %s" % e)
    if not torch.cuda.is_available():
        skip("no CUDA device")
    try:
        import vllm
        from vllm.v1.kv_offload import base, config, factory
    except ImportError as e:
        skip("no vllm: %s" % e)
    print("vllm %s, torch %s, %s" % (getattr(vllm, "__version__", "?"), torch.__version__,
                                     torch.cuda.get_device_name()))


def offloading_config(sock, extra=None, groups=1, parallel=None):
    c = config
    ex = {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm_spec",
          "kvtier_socket": sock, "blocks_per_chunk": BPC}
    ex.update(extra or {})
    return c.OffloadingConfig(
        groups=tuple(c.OffloadingGroupConfig(tokens_per_block=16,
                                             layer_names=("model.layers.%d.attn" % i,))
                     for i in range(groups)),
        worker_kv_bytes_per_block=WKB,
        enable_kv_cache_events=False,
        extra_config=ex,
        engine_id="kvtier-test",
        model=c.OffloadingModelConfig(name=MODEL, dtype="bfloat16"),
        cache=c.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=BPC),
        parallel=parallel or c.OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, is_parallelism_agnostic=True),
    )


class TestSpec(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvt_vllm_spec_", dir="/tmp")
        self.addCleanup(self.tmp.cleanup)
        self.sock = os.path.join(self.tmp.name, "k.sock")
        self.d = fx.Daemon(BIN, "--ram-bytes", str(16 * BB), "--block-bytes", str(BB),
                           "--rpc-unix", self.sock, "--pod", "engine",
                           data_dir=os.path.join(self.tmp.name, "data"))
        self.addCleanup(self.d.cleanup)
        self.addCleanup(self.d.stop)

    def kv_caches(self):
        g = torch.Generator(device="cuda").manual_seed(7)
        ts = [torch.randint(-128, 128, (NB, p), dtype=torch.int8, device="cuda", generator=g)
              for p in PAGES]
        return ts, base.CanonicalKVCaches(
            tensors=[base.CanonicalKVCacheTensor(tensor=t, page_size_bytes=p)
                     for t, p in zip(ts, PAGES)],
            group_data_refs=[[base.CanonicalKVCacheRef(tensor_idx=t, page_size_bytes=n)
                              for t, n in REFS]])

    def finish(self, worker, job_id):
        worker.wait({job_id})
        for _ in range(1000):
            for r in worker.get_finished():
                if r.job_id == job_id:
                    return r
            time.sleep(0.001)
        self.fail("job %d never finished" % job_id)

    def test_store_lookup_load(self):
        from kvtier.vllm_spec import KvtierOffloadingSpec
        from kvtier.offload import vllm_key
        import kvtier
        spec = factory.OffloadingSpecFactory.create_spec(offloading_config(self.sock))
        self.assertIsInstance(spec, KvtierOffloadingSpec)
        self.assertEqual(spec.blocks_per_chunk, BPC)
        mgr = spec.get_manager()
        self.addCleanup(mgr.shutdown)
        ts, kv = self.kv_caches()
        worker = spec.get_worker(kv)
        self.addCleanup(worker.shutdown)
        keys = [base.make_offload_key(hashlib.sha256(b"block %d" % i).digest(), 0)
                for i in range(4)]
        r1 = base.ReqContext(req_id="r1")
        mgr.on_new_request(r1)
        self.assertEqual(mgr.lookup(keys[0], r1), base.LookupResult.MISS)
        out = mgr.prepare_store(keys, r1)
        self.assertEqual(out.keys_to_store, keys)
        src = base.GPULoadStoreSpec(list(range(8)), group_sizes=[8], block_indices=[0])
        self.assertTrue(worker.submit_store(1, src, out.store_spec))
        res = self.finish(worker, 1)
        self.assertTrue(res.success)
        self.assertEqual(res.transfer_size, 8 * sum(n for _, n in REFS))
        mgr.complete_store(set(keys), r1)
        mgr.on_schedule_end(base.ScheduleEndContext(new_req_ids=["r1"], preempted_req_ids=()))
        mgr.on_request_finished(r1)
        # in kvtierd: rank 0's part, [tensor 0's 2 pages | tensor 1's 2 pages]
        eng = kvtier.Client("unix:" + self.sock, timeout=5.0, engine_keys=True)
        self.addCleanup(eng.close)
        host = [t.cpu() for t in ts]
        for c, k in enumerate(keys):
            blob = eng.block_get(MODEL, vllm_key(base.get_offload_block_hash(k)))
            self.assertEqual(len(blob), WKB * BPC)
            at = 0
            for t, n in REFS:
                for j in range(BPC):
                    want = host[t][c * BPC + j, :n].numpy().tobytes()
                    self.assertEqual(blob[at + j * PAGES[t]:at + j * PAGES[t] + n], want)
                at += PAGES[t] * BPC
        # all held: nothing to store
        again = mgr.prepare_store(keys, base.ReqContext(req_id="r9"))
        self.assertIsNotNone(again)
        self.assertEqual(again.keys_to_store, [])
        # a new request: deferred a step, then four hits
        r2 = base.ReqContext(req_id="r2")
        answers = [mgr.lookup(k, r2) for k in keys]
        self.assertIn(base.LookupResult.HIT_PENDING, answers)
        self.assertTrue(mgr.has_pending_work())
        for _ in range(10):
            mgr.on_schedule_end(base.ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
            answers = [mgr.lookup(k, r2) for k in keys]
            if answers == [base.LookupResult.HIT] * 4:
                break
        self.assertEqual(answers, [base.LookupResult.HIT] * 4)
        load = mgr.prepare_load(keys, r2)
        dst = base.GPULoadStoreSpec(list(range(16, 24)), group_sizes=[8], block_indices=[0])
        self.assertTrue(worker.submit_load(2, load, dst))
        self.assertTrue(self.finish(worker, 2).success)
        for t, n in REFS:
            self.assertTrue(torch.equal(ts[t][16:24, :n], ts[t][0:8, :n]), "tensor %d" % t)
        mgr.complete_load(set(keys), r2)
        # from the middle of a chunk: the GPU holds 3 blocks; chunks 1..3 into blocks 40..44
        r3 = base.ReqContext(req_id="r3")
        for _ in range(10):
            answers = [mgr.lookup(k, r3) for k in keys[1:]]
            if answers == [base.LookupResult.HIT] * 3:
                break
            mgr.on_schedule_end(base.ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
        load = mgr.prepare_load(keys[1:], r3)
        dst = base.GPULoadStoreSpec(list(range(40, 45)), group_sizes=[5], block_indices=[3])
        self.assertTrue(worker.submit_load(3, load, dst))
        self.finish(worker, 3)
        for t, n in REFS:
            self.assertTrue(torch.equal(ts[t][40:45, :n], ts[t][3:8, :n]), "tensor %d" % t)
        mgr.complete_load(set(keys[1:]), r3)
        mgr.on_schedule_end(base.ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
        self.assertFalse(mgr.has_pending_work())
        fx.wait_for(lambda: self.d.stats()["tiers"]["ram"]["pinned"] == 0,
                    what="every pin given back")

    def test_refusals(self):
        for extra, name in (({"kvtier_socket": None}, "kvtier_socket"),
                            ({"kvtier_timeout": -1}, "kvtier_timeout")):
            with self.assertRaises(ValueError) as e:
                factory.OffloadingSpecFactory.create_spec(offloading_config(self.sock, extra))
            self.assertIn(name, str(e.exception))
        with self.assertRaises(ValueError) as e:
            factory.OffloadingSpecFactory.create_spec(offloading_config(self.sock, groups=2))
        self.assertIn("KV-cache group", str(e.exception))
        # chunks larger than kvtierd's slots: refused when the manager connects
        big = dataclasses.replace(offloading_config(self.sock, {"blocks_per_chunk": 8}),
                                  cache=config.OffloadingCacheConfig(tokens_per_hash=16,
                                                                     blocks_per_chunk=8))
        spec = factory.OffloadingSpecFactory.create_spec(big)
        with self.assertRaises(ValueError) as e:
            spec.get_manager()
        self.assertIn("--block-bytes", str(e.exception))


if __name__ == "__main__":
    os.environ.pop("LD_PRELOAD", None)
    BIN, _ = fx.binary_from_argv("test_vllm_spec.py")
    imports()
    unittest.main(verbosity=2)
