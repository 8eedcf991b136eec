"""SelfServedConnector with its daemon scoped one level too wide: keyed by the directory *above*
its configured one (a default socket path, a per-host server), so two caches configured side by
side share one server and one disk tier. Each engine alone works; a fresh cache is served what
another one stored ("claims KV it never stored", for the first engine over its own empty storage)."""

from __future__ import annotations

from pathlib import Path

from conformance.zoo.good.self_served import SelfServedConnector


class SharedDaemonConnector(SelfServedConnector):
    @staticmethod
    def _home(configured: Path) -> Path:
        return configured.parent
