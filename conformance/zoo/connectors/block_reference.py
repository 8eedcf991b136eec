"""An in-engine cache that remembers *where* a request's KV was (its slots in the paged cache)
instead of copying it, trusting that freed blocks keep their bytes. They do until vLLM hands them
to another request: the reload then copies whatever KV is there now. An engine with room to spare
may never show it; the same-engine clause, which overwrites freed blocks as vLLM's reuse does,
must."""

import safetensors.torch
import torch

from conformance.zoo.good.in_engine import InEngineConnector


class BlockReferenceConnector(InEngineConnector):
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        for request in self._get_connector_metadata().requests:
            if request.is_store:
                filename = self._generate_filename_debug(layer_name, request.token_ids, request.mm_hashes)
                safetensors.torch.save_file({"slots": request.slot_mapping.cpu().contiguous()}, filename)

    def start_load_kv(self, forward_context, **kwargs):
        for request in self._get_connector_metadata().requests:
            if request.is_store:
                continue
            for layer_name, layer in forward_context.no_compile_layers.items():
                cache = getattr(layer, "kv_cache", None)
                if cache is None:
                    continue
                filename = self._generate_filename_debug(layer_name, request.token_ids, request.mm_hashes)
                src = safetensors.torch.load_file(filename)["slots"].to(torch.long)
                dst = request.slot_mapping.to(torch.long)
                bs = self._block_size
                cache[dst // bs, :, dst % bs] = cache[src // bs, :, src % bs]  # [B, H, N, C] views
