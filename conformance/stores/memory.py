"""A correct in-memory store: the simplest thing that satisfies every clause."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, check_entry_matches_spec, logical_bytes, tensor_from_bytes


class MemoryStore:
    """Entries keyed by (key, spec): a spec is part of an entry's identity, never a hint."""

    capabilities = frozenset({"scales", "delete"})

    def __init__(self) -> None:
        self._entries: dict[tuple[str, KVSpec], tuple[bytes, float, float]] = {}

    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        self._entries[(key, entry.spec)] = (logical_bytes(entry.tensor), entry.k_scale, entry.v_scale)

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        found = self._entries.get((key, spec))
        if found is None:
            return None
        data, k_scale, v_scale = found
        return KVEntry(spec, tensor_from_bytes(data, spec), k_scale, v_scale)

    def contains(self, key: str, spec: KVSpec) -> bool:
        return (key, spec) in self._entries

    def delete(self, key: str, spec: KVSpec) -> bool:
        return self._entries.pop((key, spec), None) is not None

    def close(self) -> None:
        self._entries.clear()


def make_store(workdir: Path | None = None, **_: Any) -> MemoryStore:
    return MemoryStore()
