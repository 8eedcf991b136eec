"""Writes ``numel`` bytes where it should write ``nbytes``, and zero-fills what is missing.

Byte-exact for one-byte formats (every fp8 cache), silently half-empty for bf16/fp16 and a
quarter full for fp32: the bug hides exactly where fp8-only testing would look.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, logical_bytes
from conformance.stores.file import FileStore

from ._tolerant import zero_filled_tensor


class TruncatingStore(FileStore):
    def payload(self, entry: KVEntry) -> bytes:
        return logical_bytes(entry.tensor)[: entry.tensor.numel()]

    def tensor(self, payload: bytes, spec: KVSpec) -> Any:
        return zero_filled_tensor(payload, spec)


def make_store(workdir: Path, **_: Any) -> TruncatingStore:
    return TruncatingStore(Path(workdir) / "truncating")
