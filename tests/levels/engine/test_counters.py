"""The prefix-cache counters the engine child reads: every step's, not only the steps vLLM logged."""

from __future__ import annotations

from types import SimpleNamespace as NS

from conformance.levels.engine import counters
from conformance.levels.engine.counters import StepCounters


def _step(outputs: list[str], local: int = 0, external: int | None = None) -> NS:
    connector = None if external is None else NS(queries=128, hits=external)
    return NS(outputs=outputs, scheduler_stats=NS(prefix_cache_stats=NS(queries=128, hits=local),
                                                  connector_prefix_cache_stats=connector))


def test_a_step_that_produced_no_output_still_counts_the_hits_its_scheduler_recorded():
    # vLLM before 0.28 logs a step's stats only with request outputs: the step admitting a request
    # whose KV loads asynchronously has none, and its 64 external hits were lost.
    steps = iter([_step([], external=64), _step(["token"], local=32, external=0), NS(outputs=[], scheduler_stats=None)])
    client = NS(get_output=lambda: next(steps))
    counted = StepCounters(NS(llm_engine=NS(engine_core=client)))
    assert counted.stepped
    for _ in range(3):
        client.get_output()
    assert counted.read() == {"vllm:prefix_cache_queries": 256, "vllm:prefix_cache_hits": 32,
                              "vllm:external_prefix_cache_queries": 256, "vllm:external_prefix_cache_hits": 64}


def test_an_engine_client_without_get_output_falls_back_to_the_logged_counters(monkeypatch):
    monkeypatch.setattr(counters, "logged", lambda llm: {"vllm:external_prefix_cache_hits": 7.0})
    counted = StepCounters(NS(llm_engine=NS(engine_core=None)))
    assert not counted.stepped
    assert counted.read() == {"vllm:external_prefix_cache_hits": 7.0}


def test_stats_of_another_shape_fall_back_to_the_logged_counters_rather_than_count_nothing(monkeypatch):
    monkeypatch.setattr(counters, "logged", lambda llm: {"vllm:external_prefix_cache_hits": 64.0})
    client = NS(get_output=lambda: NS(outputs=[], scheduler_stats=NS(connector_cache_stats=NS(queries=1, hits=1))))
    counted = StepCounters(NS(llm_engine=NS(engine_core=client)))
    client.get_output()
    assert not counted.stepped
    assert counted.read() == {"vllm:external_prefix_cache_hits": 64.0}
