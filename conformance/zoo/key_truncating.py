"""Keeps only the first 64 characters of a key (a fixed-width key column, a 64-byte key slot):
short keys are stored apart, but real keys, which share long prefixes (LMCache's composite key
strings, one model's chunks), collide and overwrite each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.zoo._key_mapping import KeyMappingStore

KEY_WIDTH = 64


class KeyTruncatingStore(KeyMappingStore):
    def store_key(self, key: str) -> str:
        return key[:KEY_WIDTH]


def make_store(workdir: Path | None = None, **_: Any) -> KeyTruncatingStore:
    return KeyTruncatingStore()
