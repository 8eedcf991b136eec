"""Keeps a reference to the tensor ``put`` was given instead of its bytes, as a connector whose
asynchronous save reads the paged block only later does: by then vLLM has reused the block for
another request, and the stored "KV" is someone else's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, check_entry_matches_spec
from conformance.stores.memory import MemoryStore


class ReferencingPutStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self._kept: dict[tuple[str, KVSpec], KVEntry] = {}

    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        self._kept[(key, entry.spec)] = entry  # the caller's tensor itself

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        kept = self._kept.get((key, spec))
        if kept is None:
            return None
        return KVEntry(spec, kept.tensor.contiguous().clone(), kept.k_scale, kept.v_scale)

    def contains(self, key: str, spec: KVSpec) -> bool:
        return (key, spec) in self._kept

    def delete(self, key: str, spec: KVSpec) -> bool:
        return self._kept.pop((key, spec), None) is not None


def make_store(workdir: Path | None = None, **_: Any) -> ReferencingPutStore:
    return ReferencingPutStore()
