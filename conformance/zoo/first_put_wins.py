"""Keeps the first entry put under a key: a put of a present key is a no-op, as LMCache's
LocalCPU and LocalDisk backends do (``if key in self.hot_cache: return``), so an engine that
recomputes a block and saves it again is served the old bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.store import KVEntry
from conformance.stores.memory import MemoryStore


class FirstPutWinsStore(MemoryStore):
    def put(self, key: str, entry: KVEntry) -> None:
        if not self.contains(key, entry.spec):
            super().put(key, entry)


def make_store(workdir: Path | None = None, **_: Any) -> FirstPutWinsStore:
    return FirstPutWinsStore()
