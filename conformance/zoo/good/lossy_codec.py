"""A lossy codec: vLLM's ExampleConnector storing 16-bit KV quantized to 5 significant bits
(``zoo.quantizing``: about 1.5% relative error at most, value by value, subnormals too), fp8 KV
as it is: a stand-in for any quantizing codec. Declared as it should be
(``--kv-connector-capabilities persistent,lossy=0.1``), its loads are held to that tolerance at
the connector level (fp8 ones, byte for byte what was stored, leave it Not exercised: no codec in
their path) and its logprobs at the engine level; declared with less loss than it makes (0.001),
or undeclared, it fails. The positive control of ``lossy``."""

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

from conformance.zoo.quantizing import quantized


class LossyCodecConnector(ExampleConnector):
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if not any(request.is_store for request in self._get_connector_metadata().requests):
            return  # a step that saves nothing: no copy of the whole cache to quantize (most steps decode)
        super().save_kv_layer(layer_name, quantized(kv_layer), attn_metadata, **kwargs)  # a copy: the cache keeps its bits
