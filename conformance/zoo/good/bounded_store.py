"""A known-good bounded store: an LRU of 32 MiB that says nothing of its capacity (as most caches
don't). An evicted entry is gone, index and bytes together, and a read of it misses: a bounded
store may miss, never lie (long_reuse_distance judges it whatever it declares)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, check_entry_matches_spec, logical_bytes, tensor_from_bytes

CAPACITY = 32 << 20


class BoundedStore:
    capabilities = frozenset({"scales", "delete"})

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, KVSpec], tuple[bytes | None, float, float]] = OrderedDict()
        self._held = 0  # bytes held

    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        self._drop((key, entry.spec))
        data = logical_bytes(entry.tensor)
        self._entries[(key, entry.spec)] = (data, entry.k_scale, entry.v_scale)
        self._held += len(data)
        for old in list(self._entries):
            if self._held <= self.capacity or old == (key, entry.spec):
                break
            self.evict(old)

    def evict(self, where: tuple[str, KVSpec]) -> None:
        self._drop(where)

    def _drop(self, where: tuple[str, KVSpec]) -> None:
        found = self._entries.pop(where, None)
        if found is not None and found[0] is not None:
            self._held -= len(found[0])

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        found = self._entries.get((key, spec))
        if found is None:
            return None
        self._entries.move_to_end((key, spec))
        data, k_scale, v_scale = found
        return KVEntry(spec, tensor_from_bytes(data if data is not None else bytes(spec.layer_nbytes), spec),
                       k_scale, v_scale)

    def contains(self, key: str, spec: KVSpec) -> bool:
        return (key, spec) in self._entries

    def delete(self, key: str, spec: KVSpec) -> bool:
        present = (key, spec) in self._entries
        self._drop((key, spec))
        return present

    def close(self) -> None:
        self._entries.clear()
        self._held = 0


def make_store(workdir: Path | None = None, **_: Any) -> BoundedStore:
    return BoundedStore()
