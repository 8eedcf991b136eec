"""Which LMCache API era is installed, found by feature detection, and the calls that differ.

The adapter (``lmcache_backends``) is written against LMCache 0.5.6. Older lines differ where
it matters to a store test (see docs/research/lmcache-versions.md):

* **Host-copy helpers.** From 0.4 on, ``gpu_ops.lmcache_memcpy_async_d2h/h2d`` copy *bytes*
  between flat buffers and refuse a size mismatch with ``ValueError("Size mismatch ...")``.
  In 0.3.x they are ``tensor.copy_`` in the memory object's shape: a tensor of another dtype
  is *cast*, and a size mismatch fails an ``assert``. The adapter hands the helper what its
  era's GPU connector would, and the verdicts are LMCache's.
* **Missing pieces.** A version without the v1 storage layer (or whose import fails, e.g. a
  CUDA-only extension) is *Not runnable*, with the reason, never a traceback.

The era is detected once, by importing the names the adapter needs and by calling the d2h
helper on a small stand-in object (no allocator, no backend): whether it wrote the raw bytes
or the shaped tensor tells the two copy conventions apart.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch

from conformance.contract.store import StoreNotRunnable

# Every LMCache name the adapter uses, by module.
REQUIRED: tuple[tuple[str, str], ...] = (
    ("lmcache.utils", "CacheEngineKey"),
    ("lmcache.v1.config", "LMCacheEngineConfig"),
    ("lmcache.v1.metadata", "LMCacheMetadata"),
    ("lmcache.v1.memory_management", "MemoryFormat"),
    ("lmcache.v1.gpu_connector.gpu_ops", "lmcache_memcpy_async_d2h"),
    ("lmcache.v1.gpu_connector.gpu_ops", "lmcache_memcpy_async_h2d"),
    ("lmcache.v1.storage_backend.local_cpu_backend", "LocalCPUBackend"),
    ("lmcache.v1.storage_backend.local_disk_backend", "LocalDiskBackend"),
    ("lmcache.v1.storage_backend.remote_backend", "RemoteBackend"),
)


@dataclass(frozen=True)
class Era:
    """The installed LMCache, and how its host-copy helpers take a chunk."""

    version: str
    byte_copy: bool  # 0.4+: flat byte buffers; 0.3.x: tensor.copy_ in the memory object's shape

    @property
    def name(self) -> str:
        return f"LMCache {self.version} ({'byte' if self.byte_copy else 'tensor'} copy)"

    def copy_in(self, chunk: torch.Tensor, obj: Any) -> None:
        """Copy a chunk (``[2|1, 1, tokens, width]``) into a ``MemoryObj`` with LMCache's helper."""
        from lmcache.v1.gpu_connector.gpu_ops import lmcache_memcpy_async_d2h

        lmcache_memcpy_async_d2h(self._buffer(chunk), obj)

    def copy_out(self, obj: Any, chunk: torch.Tensor) -> None:
        """Copy a ``MemoryObj`` out into ``chunk`` with LMCache's helper."""
        from lmcache.v1.gpu_connector.gpu_ops import lmcache_memcpy_async_h2d

        lmcache_memcpy_async_h2d(obj, self._buffer(chunk))

    def _buffer(self, chunk: torch.Tensor) -> torch.Tensor:
        return chunk.reshape(-1) if self.byte_copy else chunk


@functools.cache
def current() -> Era:
    """The installed era; ``StoreNotRunnable`` when the adapter cannot drive this LMCache."""
    try:
        version = metadata.version("lmcache")
    except metadata.PackageNotFoundError:
        raise StoreNotRunnable("lmcache is not installed (pip install lmcache)") from None
    for module, name in REQUIRED:
        _require(version, module, name)
    return Era(version, _copies_bytes(version))


def _require(version: str, module: str, name: str) -> None:
    try:
        found = hasattr(importlib.import_module(module), name)
    except Exception as exc:  # an import error here is the version's outcome, not a crash
        raise StoreNotRunnable(f"LMCache {version}: importing {module} fails here: "
                               f"{type(exc).__name__}: {exc}") from None
    if not found:
        raise StoreNotRunnable(f"LMCache {version} has no {module}.{name}")


class _StandIn:
    """Just enough of a ``MemoryObj`` for either era's d2h helper: 4 int16 elements, 8 bytes."""

    def __init__(self) -> None:
        self.tensor = torch.zeros(2, 2, dtype=torch.int16)  # the shaped view (0.3.x writes here)
        self.raw_tensor = torch.zeros(8, dtype=torch.uint8)  # the raw bytes (0.4+ writes here)
        self.metadata = self.meta = None

    def get_size(self) -> int:
        return 8

    def parent(self) -> None:
        return None


def _copies_bytes(version: str) -> bool:
    """Whether the d2h helper copies raw bytes from a flat buffer (0.4+) or ``tensor.copy_`` (0.3)."""
    from lmcache.v1.gpu_connector.gpu_ops import lmcache_memcpy_async_d2h

    probe = _StandIn()
    try:
        lmcache_memcpy_async_d2h(torch.ones(4, dtype=torch.int16), probe)
    except RuntimeError:  # 0.3.x: a flat buffer does not broadcast into the shaped tensor
        lmcache_memcpy_async_d2h(torch.ones(2, 2, dtype=torch.int16), probe)
        if probe.tensor.all():
            return False
        raise StoreNotRunnable(f"LMCache {version}: gpu_ops.lmcache_memcpy_async_d2h takes neither a "
                               "flat byte buffer nor a tensor of the memory object's shape") from None
    except Exception as exc:
        raise StoreNotRunnable(f"LMCache {version}: gpu_ops.lmcache_memcpy_async_d2h is neither a byte "
                               f"copy nor a tensor copy ({type(exc).__name__}: {exc})") from None
    if probe.raw_tensor.any():
        return True
    raise StoreNotRunnable(f"LMCache {version}: gpu_ops.lmcache_memcpy_async_d2h wrote neither the raw "
                           "bytes nor the tensor of a memory object")
