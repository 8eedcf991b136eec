"""Emits a BlockStored for each stored block, as the known-good ``EventsConnector`` does, but names
each block by a hash of its own (its token ids, hashed by Python) instead of vLLM's block hash: a
router indexes the events, matches a request's vLLM block hashes against them, and never finds this
engine's cache."""

from conformance.zoo.good.events import EventsConnector


class OwnHashEventsConnector(EventsConnector):
    def _event_hash(self, block_hash):
        return abs(hash(bytes(block_hash))) % (1 << 63)
