"""The transfer worker of the suite's OffloadingConnector specs (offloading_cpu.py's
``CPUOnlyOffloadingSpec`` and ``OnSuiteWorker``, offloading_tiering.py's
``TieringCPUOnlyOffloadingSpec``): synchronous ``torch`` copies of raw bytes between the engine's
paged cache (on CPU) and an offload buffer, and the KV cache layouts it can copy (``check_layout``).
Both spec modules import it; it imports neither.

Geometry (what vLLM's ``OffloadingConnectorWorker.register_kv_caches`` hands over): each
``CanonicalKVCacheTensor`` is an int8 ``(num_blocks, page_bytes)`` view, one row per engine
block (a whole cross-layer block for block-outermost layouts); a data ref says which tensor a
layer uses and how many leading bytes of a row are real KV. The offload buffer of a tensor
holds ``num_chunks`` rows of ``blocks_per_chunk * page_bytes``: engine block ``j`` of a chunk
lives at row ``chunk * blocks_per_chunk + j`` of its ``(num_chunks * blocks_per_chunk,
page_bytes)`` view, as in vLLM's CUDA worker.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

__all__ = ["TorchCPUOffloadingWorker", "check_layout"]


def check_layout(name: str | None) -> None:
    """vLLM's worker hands over one ``(num_blocks, page)`` row per block. That is right when a
    layer's block is one contiguous run (L and B outermost) or the block is outermost (whole
    cross-layer blocks); a layout with heads outside blocks (``LHBNC``) scatters each block,
    and vLLM's own view of it would alias other blocks' bytes, so decline it."""
    if name is None:
        return  # unresolved: vLLM resolves it to this connector's required LBHNC
    from vllm.config.cache import _layout_from_name

    layout = _layout_from_name(name)
    if not (layout.is_block_compact or layout.is_block_outermost):
        raise NotImplementedError(
            f"CPUOnlyOffloadingSpec: KV cache layout {layout.name} does not keep a block's bytes "
            f"together (OffloadingConnector requires {KVCacheLayout.LBHNC.name})")


class TorchCPUOffloadingWorker(OffloadingWorker):
    """Synchronous block copies, both directions, between CPU paged caches and an offload buffer."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int) -> None:
        self.blocks_per_chunk = blocks_per_chunk
        self.engine: list[torch.Tensor] = []  # (num_blocks, page) uint8 views of the paged caches
        self.offload: list[torch.Tensor] = []  # (num_chunks * blocks_per_chunk, page) uint8
        for t in kv_caches.tensors:
            view = t.tensor.view(torch.uint8)
            if view.device.type != "cpu" or view.ndim != 2 or view.shape[1] != t.page_size_bytes \
                    or view.stride(1) != 1:
                raise NotImplementedError(
                    f"CPUOnlyOffloadingSpec: expects CPU (num_blocks, page) byte views, got "
                    f"{tuple(view.shape)} stride {view.stride()} on {view.device}")
            self.engine.append(view)
            self.offload.append(torch.zeros((num_chunks * blocks_per_chunk, t.page_size_bytes),
                                            dtype=torch.uint8))
        # Per KV cache group: tensor index -> leading bytes of a row that hold KV (layers that
        # alias one tensor share a ref; padding past the un-padded page is never copied).
        self.group_bytes: list[dict[int, int]] = []
        for refs in kv_caches.group_data_refs:
            spans: dict[int, int] = {}
            for ref in refs:
                spans[ref.tensor_idx] = max(spans.get(ref.tensor_idx, 0), ref.page_size_bytes)
            self.group_bytes.append(spans)
        self._finished: list[TransferResult] = []

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._transfer(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._transfer(job_id, dst_spec, src_spec, store=False)

    def _transfer(self, job_id: int, engine_spec: GPULoadStoreSpec, chunk_spec: LoadStoreSpec,
                  *, store: bool) -> bool:
        assert isinstance(engine_spec, GPULoadStoreSpec) and isinstance(chunk_spec, BlockIDsLoadStoreSpec)
        assert len(engine_spec.group_sizes) == len(self.group_bytes)
        start = time.perf_counter()
        num_bytes = 0
        block_ids, chunk_ids = engine_spec.block_ids, chunk_spec.block_ids
        b_at = c_at = 0
        for g, (size, first_block) in enumerate(zip(engine_spec.group_sizes, engine_spec.block_indices)):
            if size == 0:
                continue
            # A group's first engine block may sit mid-chunk (a request's blocks are logically
            # contiguous from block index ``first_block``): skip that many sub-blocks of the chunk.
            skip = first_block % self.blocks_per_chunk
            n_chunks = -(-(size + skip) // self.blocks_per_chunk)
            chunks = chunk_ids[c_at:c_at + n_chunks].astype(np.int64)
            rows = (chunks[:, None] * self.blocks_per_chunk + np.arange(self.blocks_per_chunk)).ravel()
            rows = torch.from_numpy(rows[skip:skip + size].copy())
            blocks = torch.from_numpy(block_ids[b_at:b_at + size].astype(np.int64))
            assert len(rows) == len(blocks) == size
            for t, nbytes in self.group_bytes[g].items():
                engine, offload = self.engine[t][:, :nbytes], self.offload[t][:, :nbytes]
                if store:
                    offload.index_copy_(0, rows, engine.index_select(0, blocks))
                else:
                    engine.index_copy_(0, blocks, offload.index_select(0, rows))
                num_bytes += size * nbytes
            b_at, c_at = b_at + size, c_at + n_chunks
        assert b_at == len(block_ids) and c_at == len(chunk_ids)
        self._finished.append(TransferResult(job_id=job_id, success=True, transfer_size=num_bytes,
                                             transfer_time=time.perf_counter() - start))
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return  # every copy completed inside its submit call

    def shutdown(self) -> None:
        self.engine.clear()
        self.offload.clear()
