"""The cache layer of the original report: it hard-codes "KV is fp16".

It casts every put to fp16 and records fp16, parses fp16 bytes on get and casts them to what
the reader asks for, keys entries by token hash only, and drops k_scale/v_scale. With a bf16
or fp32 cache the cast loses values; with fp8 (uint8) caches the bytes happen to survive, but
the recorded format is wrong and e4m3/e5m2 entries collide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry


class NaiveFp16Store:
    capabilities = frozenset({"scales", "delete"})

    def __init__(self) -> None:
        self._blobs: dict[str, tuple[bytes, KVSpec]] = {}

    def put(self, key: str, entry: KVEntry) -> None:
        fp16 = entry.tensor.to(torch.float16).contiguous()
        recorded = entry.spec.replace(kv_cache_dtype="float16")
        self._blobs[key] = (fp16.view(torch.uint8).numpy().tobytes(), recorded)

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        if key not in self._blobs:
            return None
        data, recorded = self._blobs[key]
        fp16 = torch.frombuffer(bytearray(data), dtype=torch.float16).view(spec.layer_shape)
        return KVEntry(recorded, fp16.to(spec.storage_dtype))

    def contains(self, key: str, spec: KVSpec) -> bool:
        return key in self._blobs

    def delete(self, key: str, spec: KVSpec) -> bool:
        return self._blobs.pop(key, None) is not None

    def close(self) -> None:
        self._blobs.clear()


def make_store(workdir: Path | None = None, **_: Any) -> NaiveFp16Store:
    return NaiveFp16Store()
