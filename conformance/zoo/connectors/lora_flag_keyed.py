"""Keys stored KV by whether a request runs under a LoRA adapter, not by which one (a key with a
``has_lora`` flag, or the adapter's rank, or a shared adapter slot index): the base model and the
adapters are kept apart, but a prompt stored under one adapter is served to another's requests."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector


class LoraFlagKeyedConnector(LifecycleConnector):
    KEY_LORA = False  # the adapter's name is not in the key: only the flag below

    def _tags(self, request) -> list[str]:
        return super()._tags(request) + (["lora"] if request.lora_request else [])
