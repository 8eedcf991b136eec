"""The lifecycle control (``LifecycleConnector``) reporting transfer statistics as vLLM expects of a
connector that has them: the worker's ``get_kv_connector_stats`` counts the tokens each step saved and
loaded, and the class rebuilds them from their data dict (``build_kv_connector_stats``), which is how
vLLM's frontend, in another process, logs them. The positive control of ``api_connector_stats``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from conformance.zoo.good.lifecycle import LifecycleConnector

COUNTERS = ("tokens_saved", "tokens_loaded")


@dataclass
class TransferStats(KVConnectorStats):
    def __post_init__(self) -> None:
        for name in COUNTERS:
            self.data.setdefault(name, 0)

    def reset(self) -> None:
        self.data = dict.fromkeys(COUNTERS, 0)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name in COUNTERS:
            self.data[name] += other.data.get(name, 0)
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


class StatsConnector(LifecycleConnector):
    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self.role != KVConnectorRole.WORKER or not self.has_connector_metadata():
            return None
        stats = TransferStats()
        for request in self._get_connector_metadata().requests:
            stats.data["tokens_saved" if request.is_store else "tokens_loaded"] += len(request.token_ids)
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return TransferStats(data=dict(data or {}))
