"""Files an entry under its key and its spec as the engine's config names it, without the model's
dtype (a cache that records ``kv_cache_dtype`` as the entry's format): every explicit format is
told apart, but under ``kv_cache_dtype="auto"`` a bf16 model's cache and an fp16 model's are one
format to it, and one model is served the other's bytes as its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, check_entry_matches_spec, logical_bytes, tensor_from_bytes
from conformance.stores.memory import MemoryStore


def _config_spec(spec: KVSpec) -> KVSpec:
    return spec.replace(model_dtype="bfloat16")


class ConfigStringKeyStore(MemoryStore):
    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        self._entries[(key, _config_spec(entry.spec))] = (logical_bytes(entry.tensor), entry.k_scale, entry.v_scale)

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        found = self._entries.get((key, _config_spec(spec)))
        if found is None:
            return None
        data, k_scale, v_scale = found
        if len(data) != spec.layer_nbytes:  # another width: it cannot even read it as this spec
            return None
        return KVEntry(spec, tensor_from_bytes(data, spec), k_scale, v_scale)

    def contains(self, key: str, spec: KVSpec) -> bool:
        return (key, _config_spec(spec)) in self._entries

    def delete(self, key: str, spec: KVSpec) -> bool:
        return self._entries.pop((key, _config_spec(spec)), None) is not None


def make_store(workdir: Path | None = None, **_: Any) -> ConfigStringKeyStore:
    return ConfigStringKeyStore()
