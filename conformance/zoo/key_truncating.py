"""Keeps only the first 64 characters of a key (a fixed-width key column, a 64-byte key slot):
short keys are stored apart, but real keys, which share long prefixes (LMCache's composite key
strings, one model's chunks), collide and overwrite each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry
from conformance.stores.memory import MemoryStore

KEY_WIDTH = 64


class KeyTruncatingStore(MemoryStore):
    def put(self, key: str, entry: KVEntry) -> None:
        super().put(key[:KEY_WIDTH], entry)

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        return super().get(key[:KEY_WIDTH], spec)

    def contains(self, key: str, spec: KVSpec) -> bool:
        return super().contains(key[:KEY_WIDTH], spec)

    def delete(self, key: str, spec: KVSpec) -> bool:
        return super().delete(key[:KEY_WIDTH], spec)


def make_store(workdir: Path | None = None, **_: Any) -> KeyTruncatingStore:
    return KeyTruncatingStore()
