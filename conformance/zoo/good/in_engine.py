"""A cache that lives inside its engine: vLLM's ExampleConnector (its lifecycle put right:
``LifecycleConnector``) keeping what it stores under its
own engine's id (``kv_transfer_config.engine_id``, a fresh uuid per engine), as OffloadingConnector's
CPU tier or any in-memory backend keeps KV in the engine process. A fresh engine, or a fresh
connector pair, starts empty; within one engine it loads what it stored, byte for byte.

The positive control of the same-engine clauses: declared without ``persistent``, it must get no
Fail on any clause (the cross-engine ones are Disabled for it)."""

import os

from conformance.zoo.good.lifecycle import LifecycleConnector


class InEngineConnector(LifecycleConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._storage_path = os.path.join(self._storage_path, f"engine-{vllm_config.kv_transfer_config.engine_id}")
