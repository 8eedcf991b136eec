"""Keys KV without the model, as ExampleConnector and a cache that hashes token ids alone do: an
engine of another checkpoint (a fine-tune served beside its base, same KV geometry) over the same
storage is served the first model's KV."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class ModelBlindConnector(LifecycleConnector):
    KEY_MODEL = False
