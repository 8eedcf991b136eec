"""Keys KV by token ids and cache_salt but not by LoRA adapter (as vLLM's ExampleConnector and
every key of token ids alone): a request of another adapter, or of the base model, is served the
KV an adapter's request stored for the same prompt."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class LoraBlindConnector(LifecycleConnector):
    KEY_LORA = False
