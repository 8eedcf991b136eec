"""Keys KV by token ids alone where a request has images, as a cache that hashes the prompt's token
ids does: an image's placeholder tokens are the same ids whatever the image, so a request with
another image (or none) behind them is served the first image's KV."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class ImageBlindConnector(LifecycleConnector):
    KEY_IMAGES = False
