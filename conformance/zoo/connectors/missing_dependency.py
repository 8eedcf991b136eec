"""LifecycleConnector whose load path imports a codec its package forgot to depend on (a module
not installed here), as a third-party connector importing scipy lazily does. No verdict can be had
without it: every clause that loads is the run's Error naming the module, never a Fail of the
connector's KV handling."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector


class MissingDependencyConnector(LifecycleConnector):
    def start_load_kv(self, forward_context, **kwargs):
        import kvconform_absent_codec  # noqa: F401  (never installed: the dependency it forgot)

        super().start_load_kv(forward_context, **kwargs)
