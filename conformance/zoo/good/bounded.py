"""The lifecycle control with a bounded cache: at most ``capacity_bytes`` (its extra config) of
stored files, the least recently used prompts (stored or loaded) evicted whole past it, as LMCache's
L1 LRU, OffloadingConnector's CPU tier or a disk quota evict. The positive control of
api_cache_pressure: an evicted prompt is a miss (its folder is gone, so the scheduler side claims
nothing for it), never other bytes. Declare it with ``capacity=BYTES``, the same number."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from conformance.zoo.good.lifecycle import LifecycleConnector


class BoundedConnector(LifecycleConnector):
    DEFAULT_CAPACITY = 0  # unbounded unless configured

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._capacity = int(self._kv_transfer_config.get_from_extra_config("capacity_bytes", self.DEFAULT_CAPACITY))

    # --- worker side
    def start_load_kv(self, forward_context, **kwargs) -> None:
        super().start_load_kv(forward_context, **kwargs)
        for request in self._get_connector_metadata().requests:
            if not request.is_store:  # a load is a use: it makes the entry the most recently used
                os.utime(self._generate_foldername_debug(request.token_ids, request.mm_hashes))

    def wait_for_save(self):
        super().wait_for_save()
        if self._capacity:
            self._evict()

    def _evict(self) -> None:
        """Evict the least recently used entries until what is stored fits the capacity."""
        entries = [(p.stat().st_mtime_ns, p) for p in self._entries()]
        sizes = {p: sum(f.stat().st_size for f in p.iterdir()) for _, p in entries}
        total = sum(sizes.values())
        for _, entry in sorted(entries):
            if total <= self._capacity:
                break
            total -= sizes[entry]
            self._evict_entry(entry)

    def _entries(self) -> list[Path]:
        """The stored entries whose space counts against the capacity: one folder per prompt."""
        root = Path(self._storage_path)
        return [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []

    def _evict_entry(self, entry: Path) -> None:
        shutil.rmtree(entry, ignore_errors=True)
