"""Stores at most 1 MiB of a value (memcached's default item size, a message frame) and
zero-fills the rest on read, silently: every payload the examples used to draw fits, but one
LMCache chunk of a real model's layer (256 tokens x 8 heads x 128 x K,V x 2 bytes) does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, check_entry_matches_spec, logical_bytes, tensor_from_bytes
from conformance.stores.memory import MemoryStore

VALUE_CAP = 1 << 20


class ValueCappedStore(MemoryStore):
    def kept(self, data: bytes) -> bytes:
        """What of a value's bytes it keeps (the rest reads back as zeros)."""
        return data[:VALUE_CAP]

    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        self._entries[(key, entry.spec)] = (self.kept(logical_bytes(entry.tensor)), entry.k_scale, entry.v_scale)

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        found = self._entries.get((key, spec))
        if found is None:
            return None
        data, k_scale, v_scale = found
        return KVEntry(spec, tensor_from_bytes(data.ljust(spec.layer_nbytes, b"\0"), spec), k_scale, v_scale)


def make_store(workdir: Path | None = None, **_: Any) -> ValueCappedStore:
    return ValueCappedStore()
