"""``good/offloading_spec``, one bug: its manager sorts a load's chunk ids (to coalesce contiguous
host copies), which loses the pairing of chunk and block: with its top-down allocator a prompt's
chunks are stored in descending order, so a load of more than one chunk puts each chunk's KV in
another block."""

from __future__ import annotations

from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from conformance.zoo.good.offloading_spec import TopDownManager, TopDownOffloadingSpec


class SortedLoadManager(TopDownManager):
    def prepare_load(self, keys, req_context):
        spec = super().prepare_load(keys, req_context)
        return CPULoadStoreSpec(sorted(int(c) for c in spec.block_ids))


class SortedLoadSpec(TopDownOffloadingSpec):
    manager_class = SortedLoadManager
