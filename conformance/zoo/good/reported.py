"""LifecycleConnector whose scheduler serves only what its workers reported stored, as connectors
that keep their index on the scheduler side and hear from their workers through vLLM's worker
metadata (``KVConnectorWorkerMetadata``, vLLM 0.32 on) do: each step a worker reports the folders
storage held at the end of its step before. A save is heard two steps after its write, and a fresh
engine hears what storage holds only once it served a request: legal, as an engine with traffic
hears it. Declared ``settle=0.1``, each pass that asks for stored KV comes after a request of the
pair's own, and it passes; undeclared, the round trips' fresh pairs load nothing (a Fail that
advises the declaration). Its tenant-leaking twin is ``connectors/reported_salt_blind``."""

from __future__ import annotations

import os

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

from conformance.zoo.good.lifecycle import LifecycleConnector


class Heard(KVConnectorWorkerMetadata):
    """The folders a worker found in storage (its step's report to the scheduler)."""

    def __init__(self, folders: frozenset[str]) -> None:
        self.folders = folders

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        return Heard(self.folders | other.folders) if isinstance(other, Heard) else self


class ReportedConnector(LifecycleConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._heard: set[str] = set()  # scheduler side: the folders its workers reported
        self._listed: frozenset[str] = frozenset()  # worker side: what storage held at the end of its last step

    # --- worker side
    def build_connector_worker_meta(self):
        report, self._listed = self._listed, self._folders()
        return Heard(report) if report else None

    def _folders(self) -> frozenset[str]:
        try:
            return frozenset(os.listdir(self._storage_path))
        except FileNotFoundError:
            return frozenset()

    # --- scheduler side
    def update_connector_output(self, connector_output):
        super().update_connector_output(connector_output)
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, Heard):
            self._heard |= meta.folders

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        found = super().get_num_new_matched_tokens(request, num_computed_tokens)
        return found if self._reported(request) else (0, False)

    def _reported(self, request) -> bool:
        return os.path.basename(self._lookup_folder(request)) in self._heard
