"""The lifecycle control (``LifecycleConnector``) loading asynchronously, as offloading and P/D
connectors do: ``get_num_new_matched_tokens`` says ``load_async=True``, vLLM parks the request
(WAITING_FOR_REMOTE_KVS) with its blocks allocated, the next step's metadata carries the load, and the
worker reports it in ``finished_recving``. Such a step has nothing else to compute, so vLLM runs it
without a forward pass (no attention metadata, no layer hook): the load runs from ``start_load_kv``
regardless. The positive control of ``api_async_load`` (non-MLA models: it injects as ExampleConnector
does for them)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from conformance.zoo.good.lifecycle import LifecycleConnector


class AsyncLoadConnector(LifecycleConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pending: list[str] = []  # scheduler: async loads the next metadata carries
        self._loaded: set[str] = set()  # worker: loads done, reported by the next get_finished

    # --- scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        count, _ = super().get_num_new_matched_tokens(request, num_computed_tokens)
        return count, bool(count)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens > 0:
            self._blocks[request.request_id] = list(blocks.get_block_ids()[0])
            self._pending.append(request.request_id)

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        loads, self._pending = self._pending, []
        for rid in loads:
            self._add(meta, rid, is_store=False)
        meta.async_loads = loads
        return meta

    # --- worker side
    def start_load_kv(self, forward_context, **kwargs):
        loads = getattr(self._get_connector_metadata(), "async_loads", [])
        if loads and forward_context.attn_metadata is None:  # a step without a forward pass
            layers = {name: SimpleNamespace() for name in forward_context.no_compile_layers}
            forward_context = dataclasses.replace(forward_context, attn_metadata=layers)
        super().start_load_kv(forward_context, **kwargs)
        self._loaded |= set(loads)

    def get_finished(self, finished_req_ids):
        sending, _ = super().get_finished(finished_req_ids)
        recving, self._loaded = self._loaded or None, set()
        return sending, recving
