"""Loads asynchronously but only in a step with a forward pass: its ``start_load_kv`` returns early
when there is no attention metadata (the guard vLLM's ExampleConnector has, harmless for its
synchronous loads). A request parked for its async load is the only work vLLM has, so every step
until the load is reported runs without a forward pass: the load never runs and the request waits
forever."""

from conformance.zoo.good.async_load import AsyncLoadConnector


class ForwardOnlyLoadConnector(AsyncLoadConnector):
    def start_load_kv(self, forward_context, **kwargs):
        if forward_context.attn_metadata is None:
            return
        super().start_load_kv(forward_context, **kwargs)
