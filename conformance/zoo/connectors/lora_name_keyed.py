"""LifecycleConnector, one bug: its key holds the LoRA adapter's name but not its path, as vLLM's
own block hashes did before its adapter-version fix (vllm#42125, fixed by #48352): an adapter
whose weights were replaced under the same name (vLLM's ``load_inplace``, or a new directory
registered under the old name) is served the KV its previous weights computed. Every connector
that consumes those older block hashes inherits it."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector


class LoraNameKeyedConnector(LifecycleConnector):
    KEY_LORA_PATH = False
