"""Keys a layer's KV without the tensor-parallel rank, as ExampleConnector does: the ranks of an
engine of two write one file per layer, each with its own share of the KV heads, and a later
engine's ranks are served whichever rank wrote last."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class RankBlindConnector(LifecycleConnector):
    KEY_RANK = False
