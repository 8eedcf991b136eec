"""The lifecycle control (``LifecycleConnector``) emitting KV cache events as vLLM expects of a
connector that has them: when the scheduler side schedules a save, a ``BlockStored`` for each whole
block of the prompt, named by vLLM's own block hashes (``request.block_hashes``, as vLLM's KV events
carry them), handed over by ``take_events``. The positive control of ``api_kv_events``."""

from __future__ import annotations

from vllm.distributed.kv_events import BlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from conformance.zoo.good.lifecycle import LifecycleConnector


class EventsConnector(LifecycleConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._events: list[BlockStored] = []

    def _add(self, meta, rid: str, *, is_store: bool) -> None:
        super()._add(meta, rid, is_store=is_store)
        if is_store:
            request = self._admitted[rid]
            whole = self._whole_blocks(request)
            hashes = [self._event_hash(h) for h in request.block_hashes[:whole]]
            if hashes:
                self._events.append(BlockStored(
                    block_hashes=hashes, parent_block_hash=None,
                    token_ids=self._prompt(request)[:whole * self._block_size], block_size=self._block_size,
                    lora_id=None, medium="DISK", lora_name=None))

    def _event_hash(self, block_hash):
        return maybe_convert_block_hash(block_hash)

    def take_events(self):
        events, self._events = self._events, []
        return events
