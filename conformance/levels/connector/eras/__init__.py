"""One shim per vLLM connector-API era; the installed vLLM picks its era by what it has.

The hooks a connector implements barely changed, but how vLLM builds what the connector sees
did: the config classes, the KV cache allocator and its layouts, the forward context. Each era
module knows one way; a vLLM no era covers is *Not runnable* with the reason, never a crash.
"""

from __future__ import annotations

from conformance.levels.connector.eras.base import Era, EraUnavailable

__all__ = ["Era", "EraUnavailable", "select_era"]


def select_era() -> Era:
    """The era of the installed vLLM; EraUnavailable names what is missing for every era."""
    from conformance.levels.connector.eras import backend_stride_order, layout_enum

    reasons = []
    for module in (layout_enum, backend_stride_order):
        try:
            return module.load()
        except EraUnavailable as exc:
            reasons.append(f"{module.ERA}: {exc}")
    raise EraUnavailable("no connector-API era covers the installed vLLM (" + "; ".join(reasons) + ")")
