"""Trusts its bytes at rest: no length check, no checksum, short payloads zero-filled.

Every round trip is exact; a truncated or bit-flipped file is served as KV.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.stores.file import FileStore

from ._tolerant import zero_filled_tensor


class UncheckedStore(FileStore):
    def verify(self, header: dict[str, Any], payload: bytes) -> None:
        pass

    def tensor(self, payload: bytes, spec: KVSpec) -> Any:
        return zero_filled_tensor(payload, spec)


def make_store(workdir: Path, **_: Any) -> UncheckedStore:
    return UncheckedStore(Path(workdir) / "unchecked")
