"""The bounded control as most bounded caches ship: a quota of its own (4 MiB of stored files unless
configured), least recently used prompts evicted whole past it, and nothing declared to the suite.
The positive control of api_reuse_distance: a cache that evicts without saying so misses, never lies."""

from __future__ import annotations

from conformance.zoo.good.bounded import BoundedConnector


class QuotaConnector(BoundedConnector):
    DEFAULT_CAPACITY = 4 << 20
