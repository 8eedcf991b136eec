"""How a kvconform entry maps onto an LMCache chunk, as LMCache's vLLM integration maps one:

* **Metadata.** One ``LMCacheMetadata`` per spec, built as ``VllmServiceFactory`` builds it:
  ``kv_dtype`` is the spec's *storage* dtype, the torch dtype vLLM hands LMCache
  (``get_kv_cache_torch_dtype``: ``uint8`` for every vLLM fp8 string, the model dtype for
  ``auto``); ``kv_shape = (num_layers=1, 2 or 1 for MLA, chunk_size, num_kv_heads,
  head_size)``; ``use_mla`` for the MLA layout. The element format (e4m3 vs e5m2) has nowhere
  to go: LMCache has no field for it, so none is invented here.
* **Key.** ``CacheEngineKey(model_name, world_size=1, worker_id=0, chunk_hash, dtype=kv_dtype)``
  with ``chunk_hash`` a 64-bit integer hash of the kvconform key string (in vLLM it is the
  hash of a chunk's tokens). Nothing else goes into the key, because LMCache puts nothing else
  in it: two specs whose storage dtypes agree (fp8_e4m3 and fp8_e5m2, both ``uint8``) get the
  same key, and ``format_isolation`` is expected to fail on every adapter. That is the finding.
* **Bytes.** One layer's entry is one chunk of ``num_blocks * block_size`` tokens (the chunk
  size is set to that, so every entry is a full chunk). The entry's tensor, whatever its
  strides, is gathered into LMCache's ``KV_2LTD`` layout ``[2, 1, tokens, heads*head_size]``
  (``KV_MLA_FMT`` ``[1, 1, tokens, head_size]`` for MLA), the layout LMCache's vLLM GPU
  connectors produce, and moved into a ``MemoryObj`` allocated by the backend's allocator
  with LMCache's own host-copy helper ``gpu_ops.lmcache_memcpy_async_d2h``. That helper
  copies bytes and checks only their count: a tensor of another size is refused with its
  ``ValueError("Size mismatch ...")``; a tensor of another dtype of the same width is stored
  as bytes, as LMCache would store it. ``get`` reverses this through
  ``lmcache_memcpy_async_h2d`` and scatters the chunk back into the spec's layer layout.
* **Scales.** LMCache has no place for ``k_scale``/``v_scale`` (neither ``MemoryObj``
  metadata, ``RemoteMetadata`` nor the server protocol carries them), so no adapter claims
  ``scales``; ``get`` returns 1.0 for both.
* **Spec on get.** LMCache records dtype and shape, not the ``kv_cache_dtype`` string or the
  layout; the entry returned carries the reader's spec, as the reading engine would assume.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from conformance.contract.spec import KVSpec, Layout

MODEL_NAME = "kvconform/lmcache-adapter"  # one model: twins differ only in kv_cache_dtype


@dataclass(frozen=True)
class ChunkLayout:
    """Where one layer's entry sits in LMCache: its metadata, memory format and token count."""

    metadata: Any  # LMCacheMetadata
    fmt: Any  # MemoryFormat
    num_tokens: int

    @property
    def shapes(self) -> list[torch.Size]:
        return self.metadata.get_shapes(self.num_tokens)

    @property
    def dtypes(self) -> list[torch.dtype]:
        return self.metadata.get_dtypes()


def lmcache_metadata(spec: KVSpec) -> ChunkLayout:
    """``LMCacheMetadata`` for ``spec`` as LMCache's vLLM integration builds it for a worker."""
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata

    mla = spec.layout is Layout.MLA
    tokens = spec.num_blocks * spec.block_size
    metadata = LMCacheMetadata(
        model_name=MODEL_NAME, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=spec.storage_dtype,  # uint8 for every vLLM fp8 string, as vLLM hands it over
        kv_shape=(1, 1 if mla else 2, tokens, spec.num_kv_heads, spec.head_size),
        use_mla=mla, chunk_size=tokens)
    return ChunkLayout(metadata, MemoryFormat.KV_MLA_FMT if mla else MemoryFormat.KV_2LTD, tokens)


def chunk_hash(key: str) -> int:
    """The chunk hash standing in for a token-chunk hash: 64 bits of BLAKE2b of the key."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def cache_engine_key(key: str, spec: KVSpec) -> Any:
    """``CacheEngineKey`` as LMCache builds it: model, world size, worker, chunk hash, kv_dtype."""
    from lmcache.utils import CacheEngineKey

    return CacheEngineKey(MODEL_NAME, 1, 0, chunk_hash(key), spec.storage_dtype)


def to_chunk(tensor: torch.Tensor, spec: KVSpec) -> torch.Tensor:
    """The layer's logical content in LMCache's chunk layout, contiguous.

    ``[2, 1, tokens, heads*head_size]`` (``KV_2LTD``) or ``[1, 1, tokens, head_size]`` for MLA.
    The block count comes from the tensor itself, so a tensor of another shape than its spec
    gives a chunk of another size (which LMCache's copy then refuses).
    """
    t = tensor.detach()
    if spec.layout is Layout.KV_FIRST:  # (2, B, N, H, D)
        kv = t
    elif spec.layout is Layout.BLOCKS_FIRST:  # (B, 2, N, H, D)
        kv = t.transpose(0, 1)
    elif spec.layout is Layout.FUSED:  # (B, H, N, 2D): K | V in the last dim
        d = t.shape[-1] // 2
        kv = torch.stack((t[..., :d], t[..., d:])).permute(0, 1, 3, 2, 4)  # (2, B, N, H, D)
    else:  # MLA (B, N, D)
        return t.reshape(1, 1, -1, t.shape[-1]).contiguous()
    return kv.reshape(2, 1, -1, kv.shape[-2] * kv.shape[-1]).contiguous()


def from_chunk(chunk: torch.Tensor, spec: KVSpec) -> torch.Tensor:
    """The inverse of ``to_chunk``: a contiguous tensor of the spec's layer shape."""
    b, n, h, d = spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size
    if spec.layout is Layout.MLA:
        return chunk.reshape(b, n, d).contiguous()
    kv = chunk.reshape(2, b, n, h, d)
    if spec.layout is Layout.KV_FIRST:
        return kv.contiguous()
    if spec.layout is Layout.BLOCKS_FIRST:
        return kv.transpose(0, 1).contiguous()
    k, v = kv.permute(0, 1, 3, 2, 4)  # each (B, H, N, D)
    return torch.cat((k, v), dim=-1).contiguous()
