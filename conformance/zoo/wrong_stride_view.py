"""Saves whatever memory the tensor starts at, then ``view``s it back with the logical shape.

Correct for contiguous tensors, wrong for every HND view, pool slice or padded row: the shape
matches, the stride does not, and the bytes come back scrambled or with padding in them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from conformance.contract.store import KVEntry
from conformance.stores.memory import MemoryStore


class WrongStrideViewStore(MemoryStore):
    def put(self, key: str, entry: KVEntry) -> None:
        t = entry.tensor
        span = torch.as_strided(t, (t.numel(),), (1,), t.storage_offset())  # ignores t.stride()
        super().put(key, KVEntry(entry.spec, span.view(t.shape), entry.k_scale, entry.v_scale))


def make_store(workdir: Path | None = None, **_: Any) -> WrongStrideViewStore:
    return WrongStrideViewStore()
