"""Saves a step late from blocks it gave back: each layer's save is queued and written at the next
step's ``wait_for_save`` (after that step's forward pass), while ``request_finished`` returns False
(blocks free at once). vLLM gives a freed block to the next request, whose forward pass writes it
before the queue drains, so what is stored as the prompt's KV is that request's: the classic
asynchronous-save bug, the reason for vLLM's delayed-free path (return True, report the request in
finished_sending)."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class LateSaveConnector(LifecycleConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._queued: list = []  # (layer, paged KV view, attention metadata, the step's connector metadata)
        self._due: list = []  # last step's queue: written at this step's end

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self._queued.append((layer_name, kv_layer, attn_metadata, self._get_connector_metadata()))

    def wait_for_save(self):
        due, self._due, self._queued = self._due, self._queued, []
        bound = self._connector_metadata
        try:
            for layer_name, kv_layer, attn_metadata, meta in due:
                self._connector_metadata = meta
                super().save_kv_layer(layer_name, kv_layer, attn_metadata)
        finally:
            self._connector_metadata = bound

    def request_finished(self, request, block_ids):
        super().request_finished(request, block_ids)
        return False, None  # "nothing in flight": vLLM frees the blocks now

    def get_finished(self, finished_req_ids):
        return None, None
