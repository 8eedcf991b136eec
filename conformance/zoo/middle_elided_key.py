"""Shortens a key past 200 bytes to its first and last 96 characters around an ellipsis (a file
name kept under 255 bytes, a log-friendly id): keys that differ at their end (a chunk hash, a layer)
stay apart, but two long keys that differ only in a middle field, such as the model path of a
tenant's fine-tune under a long snapshot directory, become one entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.zoo._key_mapping import KeyMappingStore

LONG = 200
KEPT = 96


class MiddleElidedKeyStore(KeyMappingStore):
    def store_key(self, key: str) -> str:
        return key if len(key) <= LONG else f"{key[:KEPT]}...{key[-KEPT:]}"


def make_store(workdir: Path | None = None, **_: Any) -> MiddleElidedKeyStore:
    return MiddleElidedKeyStore()
