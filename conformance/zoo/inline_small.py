"""Keeps values under 4 KiB inline in its index, whose rows hold 2,000 bytes, and zero-fills the
rest on read (an inline-value optimisation with the row limit of the database under it): every
entry of 4 KiB and more is stored whole, but the smallest real entry, one KV head of 64 per rank,
16 fp8 tokens (2,048 bytes), loses its last 48."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, check_entry_matches_spec, logical_bytes, tensor_from_bytes
from conformance.stores.memory import MemoryStore

INLINE_BELOW = 4096
ROW_BYTES = 2000


class InlineSmallStore(MemoryStore):
    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        data = logical_bytes(entry.tensor)
        self._entries[(key, entry.spec)] = (data[:ROW_BYTES] if len(data) < INLINE_BELOW else data,
                                            entry.k_scale, entry.v_scale)

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        found = self._entries.get((key, spec))
        if found is None:
            return None
        data, k_scale, v_scale = found
        return KVEntry(spec, tensor_from_bytes(data.ljust(spec.layer_nbytes, b"\0"), spec), k_scale, v_scale)


def make_store(workdir: Path | None = None, **_: Any) -> InlineSmallStore:
    return InlineSmallStore()
