"""Keeps a reference to the tensor ``put`` was given until the key's first read, and copies its
bytes only then (a write-behind store: put returns at once, the copy is made lazily, by the first
get or a background flush that runs late). Every read after the first is of its own copy, so a
caller that reuses its tensor only after reading the entry back sees nothing wrong; one that
reuses it between put and the first read (vLLM freeing a block for the next request while the
save is still pending) has the next request's bytes stored as this one's KV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, check_entry_matches_spec
from conformance.stores.memory import MemoryStore


class WriteBehindStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self._pending: dict[tuple[str, KVSpec], KVEntry] = {}

    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        super().delete(key, entry.spec)  # the pending entry replaces whatever was stored
        self._pending[(key, entry.spec)] = entry  # the caller's tensor itself, until the flush

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        self._flush(key, spec)
        return super().get(key, spec)

    def contains(self, key: str, spec: KVSpec) -> bool:
        return (key, spec) in self._pending or super().contains(key, spec)

    def delete(self, key: str, spec: KVSpec) -> bool:
        pending = self._pending.pop((key, spec), None) is not None
        return super().delete(key, spec) or pending

    def _flush(self, key: str, spec: KVSpec) -> None:
        """Copy a pending entry's bytes, as they are now, into the store."""
        pending = self._pending.pop((key, spec), None)
        if pending is not None:
            super().put(key, pending)


def make_store(workdir: Path | None = None, **_: Any) -> WriteBehindStore:
    return WriteBehindStore()
