"""LifecycleConnector, one bug: it stores a request's blocks as raw pages (each block's bytes as the
paged cache lays them out, ``[heads, block_size, head_dim]``) and loads them back page by page,
keyed by the tokens alone. Right while every engine has the same block size; an engine restarted
with another one is handed pages of the old geometry as raw bytes, each token's KV scattered over
other tokens' and heads' slots. Its key should carry the block size, or its pages be read token by
token."""

from __future__ import annotations

import safetensors.torch
import torch

from conformance.zoo.good.lifecycle import LifecycleConnector


class PageCopyingConnector(LifecycleConnector):
    KEY_BLOCK_SIZE = False  # keyed by the tokens alone, as its bug needs (the control keys the block size)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        for request in self._get_connector_metadata().requests:
            if request.is_store:
                pages = kv_layer[self._blocks_of(request)].contiguous()
                safetensors.torch.save_file({"pages": pages.view(torch.uint8).flatten()},
                                            self._generate_filename_debug(layer_name, request.token_ids,
                                                                          request.mm_hashes))

    def start_load_kv(self, forward_context, **kwargs):
        for request in self._get_connector_metadata().requests:
            if request.is_store:
                continue
            for layer_name, layer in forward_context.no_compile_layers.items():
                kv_layer = getattr(layer, "kv_cache", None)
                if kv_layer is None:
                    continue
                saved = safetensors.torch.load_file(
                    self._generate_filename_debug(layer_name, request.token_ids, request.mm_hashes))["pages"]
                blocks = self._blocks_of(request)
                pages = kv_layer[blocks].contiguous()
                raw = pages.view(torch.uint8).flatten()
                n = min(raw.numel(), saved.numel())
                raw[:n] = saved[:n]  # the stored pages' bytes, as they were laid out
                kv_layer[blocks] = raw.view(pages.dtype).view(pages.shape)

    def _blocks_of(self, request) -> torch.Tensor:
        return torch.unique_consecutive(request.slot_mapping // self._block_size)
