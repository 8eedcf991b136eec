"""The lifecycle control with a malformed log call in a hook (``%d`` given None, as a connector that
logs its device rank does on a CPU device): Python's logging prints "--- Logging error ---" and
the engine goes on, so the connector is judged as it runs, never refused for its log line."""

from __future__ import annotations

import logging

from conformance.zoo.good.lifecycle import LifecycleConnector

logger = logging.getLogger(__name__)


class MalformedLogConnector(LifecycleConnector):
    def register_kv_caches(self, kv_caches):
        logger.warning("registered %d layers on rank %d", len(kv_caches), None)
        super().register_kv_caches(kv_caches)
