"""Shared no-connector baselines: reused only for the very same engine spec and Python, never a failure."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from conformance.levels.engine.baselines import BaselineStore
from conformance.levels.engine.launch import EngineRun

SPEC = {"model": "/models/qwen3-tiny-0123", "kv_cache_dtype": "fp8_e5m2", "block_size": 32,
        "batches": [{"name": "b", "prompts": [[5, 6, 7]]}]}


def runner(ok: bool = True):
    calls = []

    def run() -> EngineRun:
        calls.append(1)
        request: Any = {"tokens": [1, 2]}  # what the store keeps is opaque to it
        return EngineRun("baseline", ok, {"requests": [request]} if ok else {}, "" if ok else "boom",
                         "log", 9.5)
    return run, calls


def test_a_baseline_runs_once_and_is_then_reused_with_its_origin(tmp_path):
    store = BaselineStore(tmp_path)
    run, calls = runner()
    first = store.get_or_run(SPEC, "/venv/bin/python", run)
    again = store.get_or_run(dict(SPEC), "/venv/bin/python", run)
    assert len(calls) == 1 and first.ok and again.ok
    assert again.result["requests"] == first.result["requests"] and again.wall_s == 9.5
    assert again.result["reused_from"].startswith(str(tmp_path)) and "reused_from" not in first.result


@pytest.mark.parametrize("change", [{"kv_cache_dtype": "fp8_e4m3"}, {"block_size": 64},
                                   {"model": "/models/qwen3-tiny-4567"}, {"batches": []}])
def test_any_other_spec_is_another_baseline(tmp_path, change):
    store = BaselineStore(tmp_path)
    run, calls = runner()
    store.get_or_run(SPEC, "/venv/bin/python", run)
    store.get_or_run({**SPEC, **change}, "/venv/bin/python", run)
    store.get_or_run(SPEC, "/other-stack/bin/python", run)
    assert len(calls) == 3


def test_a_failed_baseline_is_never_kept(tmp_path):
    store = BaselineStore(tmp_path)
    run, calls = runner(ok=False)
    assert not store.get_or_run(SPEC, "/venv/bin/python", run).ok
    assert not store.get_or_run(SPEC, "/venv/bin/python", run).ok
    assert len(calls) == 2 and not list(tmp_path.iterdir())


def test_a_damaged_kept_baseline_is_run_again(tmp_path):
    store = BaselineStore(tmp_path)
    run, calls = runner()
    store.get_or_run(SPEC, "/venv/bin/python", run)
    (kept,) = tmp_path.iterdir()
    kept.write_text('{"role": "baseline", "ok": tr')
    assert store.get_or_run(SPEC, "/venv/bin/python", run).ok and len(calls) == 2


def test_runs_with_a_connector_are_never_shared(tmp_path):
    with pytest.raises(ValueError, match="only no-connector runs"):
        BaselineStore(tmp_path).key({**SPEC, "connector": {"kv_connector": "ExampleConnector"}}, "python")


def test_two_venvs_of_one_interpreter_never_share_a_baseline(tmp_path):
    # A venv's bin/python is a symlink to its base interpreter: each stack's venv is still its own vLLM.
    for stack in ("vllm-0.28.0", "vllm-0.31.0"):
        (tmp_path / stack / "bin").mkdir(parents=True)
        (tmp_path / stack / "bin" / "python").symlink_to(sys.executable)
    store = BaselineStore(tmp_path / "baselines")
    run, calls = runner()
    store.get_or_run(SPEC, str(tmp_path / "vllm-0.28.0" / "bin" / "python"), run)
    store.get_or_run(SPEC, str(tmp_path / "vllm-0.31.0" / "bin" / "python"), run)
    assert len(calls) == 2
