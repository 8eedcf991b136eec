"""A bounded cache that evicts by recycling an entry's space but keeps its index entry: the evicted
prompt's files are handed to the allocator (zeroed here, as a slab's reused pages are) while the
lookup still finds them. After eviction it claims the prompt and serves zeros (or, with a real
allocator, another prompt's KV). Only a cache filled past its capacity meets it."""

from __future__ import annotations

from pathlib import Path

import safetensors.torch
import torch

from conformance.zoo.good.bounded import BoundedConnector


class RecycledSlotConnector(BoundedConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._recycled: set[Path] = set()  # entries whose space was given to others

    def _entries(self) -> list[Path]:
        return [p for p in super()._entries() if p not in self._recycled]

    def _evict_entry(self, entry: Path) -> None:
        for f in entry.iterdir():
            kv = safetensors.torch.load_file(str(f))["kv_cache"]
            safetensors.torch.save_file({"kv_cache": torch.zeros_like(kv)}, str(f))
        self._recycled.add(entry)  # its space counts as free; its name still answers lookups
