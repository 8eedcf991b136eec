"""The base of the known-bad stores that file an entry under another key than the one it was
given (cut to a width, folded to one case): distinct keys that map to one are one entry to them."""

from __future__ import annotations

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry
from conformance.stores.memory import MemoryStore


class KeyMappingStore(MemoryStore):
    """A correct memory store but for ``store_key``, which every operation goes through."""

    def store_key(self, key: str) -> str:
        raise NotImplementedError

    def put(self, key: str, entry: KVEntry) -> None:
        super().put(self.store_key(key), entry)

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        return super().get(self.store_key(key), spec)

    def contains(self, key: str, spec: KVSpec) -> bool:
        return super().contains(self.store_key(key), spec)

    def delete(self, key: str, spec: KVSpec) -> bool:
        return super().delete(self.store_key(key), spec)
