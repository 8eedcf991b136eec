"""Keys KV by token ids, salt and adapter, but a prompt given as embeddings has no token ids: vLLM's
placeholders (zeros) stand in, so every embeddings prompt of one length is one key, and each is
served the KV of whichever was stored first, as is a token-id prompt of zeros."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class EmbedsBlindConnector(LifecycleConnector):
    KEY_EMBEDS = False
