"""Claims to keep scales, but writes the default 1.0: fp8 bytes then decode to wrong numbers."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from conformance.contract.store import KVEntry
from conformance.stores.file import FileStore


class ScaleDroppingStore(FileStore):
    def encode(self, key: str, entry: KVEntry) -> bytes:
        return super().encode(key, dataclasses.replace(entry, k_scale=1.0, v_scale=1.0))


def make_store(workdir: Path, **_: Any) -> ScaleDroppingStore:
    return ScaleDroppingStore(Path(workdir) / "scale-dropping")
