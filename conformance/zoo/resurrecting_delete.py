"""``delete`` forgets the index entry but not the bytes, and ``get`` reads the bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry
from conformance.stores.memory import MemoryStore


class ResurrectingDeleteStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self._index: set[tuple[str, KVSpec]] = set()

    def put(self, key: str, entry: KVEntry) -> None:
        super().put(key, entry)
        self._index.add((key, entry.spec))

    def contains(self, key: str, spec: KVSpec) -> bool:
        return (key, spec) in self._index

    def delete(self, key: str, spec: KVSpec) -> bool:
        present = (key, spec) in self._index
        self._index.discard((key, spec))
        return present


def make_store(workdir: Path | None = None, **_: Any) -> ResurrectingDeleteStore:
    return ResurrectingDeleteStore()
