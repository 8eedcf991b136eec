"""Keys a prompt's KV without the block size, as ExampleConnector and LMCache do: what it stores is
the layer tensor's rows at the request's slots, laid out for the engine's block size (on vLLM-CPU
each head's block holds its keys, then its values, so a row is not one token's KV), and an engine
restarted with another block size over the same storage is served rows of the old geometry."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class BlockSizeBlindConnector(LifecycleConnector):
    KEY_BLOCK_SIZE = False
