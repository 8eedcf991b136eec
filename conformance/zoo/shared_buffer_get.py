"""Copies on ``put`` but hands out its own buffer on ``get`` (a zero-copy read): the engine writes
into the KV it loaded (the next decode step's tokens land in those blocks), and the next request
served from the store reads what that engine wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, check_entry_matches_spec
from conformance.stores.memory import MemoryStore


class SharedBufferGetStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self._buffers: dict[tuple[str, KVSpec], KVEntry] = {}

    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        self._buffers[(key, entry.spec)] = KVEntry(entry.spec, entry.tensor.contiguous().clone(),
                                                   entry.k_scale, entry.v_scale)

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        return self._buffers.get((key, spec))  # its own tensor, not a copy

    def contains(self, key: str, spec: KVSpec) -> bool:
        return (key, spec) in self._buffers

    def delete(self, key: str, spec: KVSpec) -> bool:
        return self._buffers.pop((key, spec), None) is not None


def make_store(workdir: Path | None = None, **_: Any) -> SharedBufferGetStore:
    return SharedBufferGetStore()
