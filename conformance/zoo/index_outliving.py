"""A bounded store (an LRU of 32 MiB, declared nowhere) that frees the bytes it evicts but keeps
their index entry, as a slab reused under a stale index does: ``contains`` still says yes, and
``get`` serves zeros of the entry's shape. Only a read after more puts than it holds shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.zoo.good.bounded_store import BoundedStore


class IndexOutlivingStore(BoundedStore):
    def evict(self, where: tuple[str, KVSpec]) -> None:
        data, k_scale, v_scale = self._entries[where]
        self._held -= len(data) if data is not None else 0
        self._entries[where] = (None, k_scale, v_scale)  # the bytes go; the index entry stays
        self._entries.move_to_end(where, last=False)


def make_store(workdir: Path | None = None, **_: Any) -> IndexOutlivingStore:
    return IndexOutlivingStore()
