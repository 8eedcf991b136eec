"""Keeps at most 4 MiB of each layer's KV per prompt (a value-size cap, a message frame, a 32-bit
length field counted in the wrong unit): past it, what it loads back is zeros, and it still claims
the whole prompt. Every example the level draws is far below the cap; only a payload as large as
a real model's crosses it."""

import safetensors.torch
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

CAP_BYTES = 4 << 20


class SizeCappedConnector(ExampleConnector):
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        for request in self._get_connector_metadata().requests:
            if not request.is_store:
                continue
            filename = self._generate_filename_debug(layer_name, request.token_ids, request.mm_hashes)
            kv = safetensors.torch.load_file(filename)["kv_cache"]
            raw = kv.contiguous().view(torch.uint8).flatten()
            if raw.numel() > CAP_BYTES:
                raw[CAP_BYTES:] = 0  # what was past the cap never arrived
                safetensors.torch.save_file({"kv_cache": raw.view(kv.dtype).view(kv.shape)}, filename)
