"""Keys KV by token ids alone, as vLLM's ExampleConnector does (vLLM #53495): a tenant whose
``cache_salt`` differs is served another tenant's KV for the same prompt."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class SaltBlindConnector(LifecycleConnector):
    KEY_SALT = False
