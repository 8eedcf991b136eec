"""Keys stored KV by the prompt less its first token, as a cache that strips the BOS token every
prompt "starts with" before hashing: two prompts that differ only in their first token share a
key, and one is served the other's KV, every token of which the first changed. Prompts that share
a prefix, or nothing, are told apart as the lifecycle control tells them; only the near miss at
the start (``Prompts.twin(0)``, api_partial_prefix) finds it."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector


class FirstTokenBlindConnector(LifecycleConnector):
    def _generate_foldername_debug(self, token_ids, *args, **kwargs):
        return super()._generate_foldername_debug(token_ids[1:], *args, **kwargs)
