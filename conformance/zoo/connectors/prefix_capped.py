"""Keys stored KV by the first 1024 tokens of a prompt only (a key-length cap: a fixed-width key
column, a hash over a bounded window, a chunk index that stops early). Every prompt the other
scenarios draw is shorter, so each gets a key of its own; conversations that share a long system
prompt and differ after it share one key, and one is served another's KV."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector

KEY_TOKENS = 1024


class PrefixCappedConnector(LifecycleConnector):
    def _generate_foldername_debug(self, token_ids, mm_hashes, create_folder=False):
        return super()._generate_foldername_debug(token_ids[:KEY_TOKENS], mm_hashes, create_folder=create_folder)
