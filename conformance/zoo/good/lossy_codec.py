"""A lossy codec: vLLM's ExampleConnector storing 16-bit KV with its two lowest mantissa bits
cleared (a stand-in for any quantizing codec), fp8 KV as it is. Declared as it should be
(``--kv-connector-capabilities persistent,lossy=0.1``), its byte-exact clauses are Disabled and
the engine level compares within the declared tolerance; undeclared, the engine level must catch
the changed bits. The positive control of ``lossy``."""

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

MANTISSA_MASK = ~0x3  # the two lowest bits of a bf16/fp16 element


class LossyCodecConnector(ExampleConnector):
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if kv_layer.element_size() == 2:
            kv_layer = (kv_layer.view(torch.int16) & MANTISSA_MASK).view(kv_layer.dtype)  # a copy: the cache keeps its bits
        super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
