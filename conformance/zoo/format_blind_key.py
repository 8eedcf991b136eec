"""Addresses entries by key alone, the way a cache keyed on the torch dtype does.

vLLM's fp8 strings are all ``uint8`` tensors, so a key that records the torch dtype (or none)
gives fp8_e4m3 and fp8_e5m2 the same address: one engine reads the other's bytes as its own
format. It returns the bytes under the *reader's* spec, as such caches do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry
from conformance.stores.file import FileStore, split_blob


class FormatBlindKeyStore(FileStore):
    def _path(self, key: str, spec: KVSpec) -> Path:
        return self.root / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".kv")

    def decode(self, blob: bytes, key: str, spec: KVSpec) -> KVEntry | None:
        header, payload = split_blob(blob)
        self.verify(header, payload)
        return KVEntry(spec, self.tensor(payload, spec), header["k_scale"], header["v_scale"])


def make_store(workdir: Path, **_: Any) -> FormatBlindKeyStore:
    return FormatBlindKeyStore(Path(workdir) / "format-blind")
