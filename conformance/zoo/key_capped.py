"""Cuts every key to 250 bytes, memcached's key limit (a client that cuts a long key to fit
instead of hashing it; a store that names a file after its key meets the same at 255 bytes).
Keys up to 250 bytes are stored apart, but LMCache's keys under a long model path (a local
snapshot directory, a tenant's fine-tune) run past it and differ only at the end (the chunk
hash, the layer id): all of a chunk's layers, or all of a model's chunks, become one entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.zoo._key_mapping import KeyMappingStore

KEY_BYTES = 250


class KeyCappedStore(KeyMappingStore):
    def store_key(self, key: str) -> str:
        return key.encode()[:KEY_BYTES].decode(errors="ignore")


def make_store(workdir: Path | None = None, **_: Any) -> KeyCappedStore:
    return KeyCappedStore()
