"""How the connector level turns what a connector's hooks raise, and what vLLM refuses, into verdicts
(conformance/levels/connector/outcomes.py, scenarios.py); no vLLM needed."""

from __future__ import annotations

import pytest

from conformance.levels.connector import scenarios
from conformance.levels.connector.outcomes import connector_faults_fail
from conformance.levels.connector.runs import ConnectorRaised
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
