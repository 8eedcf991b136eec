"""Saves a request's blocks in reverse order (a gather over the block table walked backwards)
and loads them in order: every shape, dtype and hit count is right, the KV of block i lands in
block n-1-i."""

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class ReversedBlocksConnector(ExampleConnector):
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        originals = []
        for request in self._get_connector_metadata().requests:
            originals.append(request.slot_mapping)
            if request.is_store and len(request.slot_mapping):
                request.slot_mapping = request.slot_mapping.view(-1, self._block_size).flip(0).reshape(-1)
        try:
            super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        finally:
            for request, slots in zip(self._get_connector_metadata().requests, originals):
                request.slot_mapping = slots
