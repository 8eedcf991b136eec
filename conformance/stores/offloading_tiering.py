"""A CPU-only worker side for vLLM's tiered ``OffloadingConnector`` (``TieringOffloadingSpec``).

Why this exists: vLLM 0.32's ``TieringOffloadingSpec`` (``vllm/v1/kv_offload/tiering/spec.py``)
puts secondary tiers (``"fs"``: one file per chunk under ``root_dir``, a cache that outlives the
engine) behind the CPU primary tier. It inherits ``get_worker`` from ``CPUOffloadingSpec``, which
refuses a CPU-only vLLM ("CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"),
and its ``create_worker`` builds the CUDA ``CPUOffloadingWorker``. This spec keeps everything the
scheduler side uses unmodified (the ``TieringOffloadingManager``, the primary tier, the fs tier and
its thread pool) and swaps only the transfer worker for the suite's ``TorchCPUOffloadingWorker``.

The one thing the worker must get right is *where* it puts offloaded bytes. The tiers never see
the worker: the scheduler opens ``SharedOffloadRegion`` (``/dev/shm/vllm_offload_{engine_id}.mmap``,
``rank=None``) and hands secondary tiers a memoryview of it, ``(num_chunks, row_stride)``; the fs
tier writes chunk ``c``'s file from ``view[c]`` and promotes a file back into it. So the worker
must read and write that same region (as vLLM's ``TieringOffloadingSpec.create_worker`` maps it,
``rank=0``), not a private buffer. In a row, tensor ``t`` owns ``blocks_per_chunk * page_t`` bytes
after the tensors before it (``SharedOffloadRegion.create_next_worker_view``). With one engine
block per chunk (the default: no ``block_size`` in the extra config) that view is exactly the
``(rows, page)`` buffer ``TorchCPUOffloadingWorker`` indexes, so it uses the region directly. With
larger chunks the rows are not one stride apart: the worker keeps its private buffer and mirrors
the chunks of each job into the region (after a store, before a load).

Load it through vLLM's out-of-tree spec hook::

    kv_connector_extra_config = {"spec_name": "TieringCPUOnlyOffloadingSpec",
                                 "spec_module_path": "conformance.stores.offloading_tiering",
                                 "cpu_bytes_to_use": 100_000_000,
                                 "secondary_tiers": [{"type": "fs", "root_dir": "{storage}/fs"}]}
"""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from conformance.stores.offloading_worker import TorchCPUOffloadingWorker, check_layout

__all__ = ["SharedRegionTorchWorker", "TieringCPUOnlyOffloadingSpec"]


class TieringCPUOnlyOffloadingSpec(TieringOffloadingSpec):
    """vLLM's ``TieringOffloadingSpec`` with a torch-on-CPU transfer worker over its shared region."""

    _torch_worker: SharedRegionTorchWorker | None = None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._torch_worker is None:
            check_layout(self.config.kv_cache_layout)
            if self.config.canonical_layout:
                raise ValueError("TieringCPUOnlyOffloadingSpec copies raw pages: remove canonical_layout")
            # As TieringOffloadingSpec.create_worker maps it (no barrier: the scheduler joins it).
            region = SharedOffloadRegion(
                engine_id=self._engine_id, num_chunks=self.num_chunks,
                rank=0 if self.replicated_layout else self.config.parallel.rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk, cpu_page_size=self.cpu_page_size_per_worker)
            try:
                self._torch_worker = SharedRegionTorchWorker(kv_caches, self.blocks_per_chunk, self.num_chunks,
                                                             region)
            except BaseException:
                region.cleanup()
                raise
        return self._torch_worker


class SharedRegionTorchWorker(TorchCPUOffloadingWorker):
    """``TorchCPUOffloadingWorker`` whose offload buffer is (or is mirrored into) the shared region."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int,
                 region: SharedOffloadRegion) -> None:
        super().__init__(kv_caches, blocks_per_chunk, num_chunks)
        self.region = region
        self.mirrors: list[tuple[torch.Tensor, torch.Tensor]] = []  # (private chunk rows, region rows)
        for t, kv in enumerate(kv_caches.tensors):
            shared = region.create_next_worker_view(kv.page_size_bytes * blocks_per_chunk).view(torch.uint8)
            if blocks_per_chunk == 1:
                self.offload[t] = shared  # row c is chunk c: the region itself, stride row_stride
            else:
                self.mirrors.append((self.offload[t].view(num_chunks, -1), shared))

    def _mirror(self, chunk_spec: LoadStoreSpec, *, to_region: bool) -> None:
        if not self.mirrors:
            return
        assert isinstance(chunk_spec, BlockIDsLoadStoreSpec)  # CPULoadStoreSpec: primary-tier chunk ids
        chunks = torch.from_numpy(chunk_spec.block_ids.astype(np.int64))
        for private, shared in self.mirrors:
            src, dst = (private, shared) if to_region else (shared, private)
            dst.index_copy_(0, chunks, src.index_select(0, chunks))

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        done = super().submit_store(job_id, src_spec, dst_spec)
        self._mirror(dst_spec, to_region=True)  # before get_finished: the scheduler cascades from the region
        return done

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        self._mirror(src_spec, to_region=False)  # a promotion from disk landed in the region
        return super().submit_load(job_id, src_spec, dst_spec)

    def shutdown(self) -> None:
        super().shutdown()
        self.mirrors.clear()  # drop every view of the mmap before it is closed
        self.region.cleanup()
