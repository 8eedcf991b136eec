"""Folds every key to lower case, as a store on a case-insensitive file system does (a file store
on macOS's or Windows' default volumes, where ``Model-A/`` and ``model-a/`` are one directory) or
a key normaliser that calls ``lower()``: keys that differ only in case, such as two model
directories whose names differ only in case or base64 chunk hashes, serve each other's KV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.zoo._key_mapping import KeyMappingStore


class CaseFoldingStore(KeyMappingStore):
    def store_key(self, key: str) -> str:
        return key.lower()


def make_store(workdir: Path | None = None, **_: Any) -> CaseFoldingStore:
    return CaseFoldingStore()
