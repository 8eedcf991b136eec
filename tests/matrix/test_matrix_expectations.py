"""matrix.yaml's expectations: known failures as XFail, stale ones as XPass, intermittent ones
never red, conditional on a cell's coordinates, and applied again to kept results."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.matrix import definition as matrix
from conformance.matrix import runner
from conformance.matrix.definition import Cell, MatrixError, Tier

from tests.conftest import REPO
from tests.matrix.matrix_texts import STACKS, write


def _doc(statuses: dict[str, str]) -> dict:
    return {"tests": [{"clause": c, "status": s, "message": ""} for c, s in statuses.items()]}


def test_expectations_turn_known_failures_into_xfail_and_stale_ones_into_xpass():
    cell = Cell("zoo.x", "store", (), Tier("quick", "ci", 1), {}, {"shape_preserved": "bug", "state_machine": "bug"})
    doc = _doc({"shape_preserved": "Fail", "state_machine": "Pass", "dtype_preserved": "Fail"})
    runner.apply_expectations(doc, cell)
    assert {t["clause"]: t["status"] for t in doc["tests"]} == {
        "shape_preserved": "XFail", "state_machine": "XPass", "dtype_preserved": "Fail"}
    assert "stale" in doc["tests"][1]["message"]


def test_engine_cells_and_conditional_expectations():
    m = matrix.load(REPO / "matrix.yaml")
    cells = {c.id: c for c in m.cells("standard") if c.level == "engine"}
    example = cells["cell(vllm-0.32.0, lmcache-0.5.6, qwen3-tiny, fp8_e5m2, ExampleConnector)"]
    assert "--kv-connector=ExampleConnector" in example.args and "--kv-cache-dtype=fp8_e5m2" in example.args
    assert set(example.expected_failures) == {"engine_format_isolation", "engine_load_failure_recompute",
                                              "engine_cache_salt", "engine_lora_isolation", "engine_shared_prefix",
                                              "engine_prompt_embeds", "engine_block_size", "engine_model_isolation"}
    # LMCache's expectations are conditional on the dtype: uint8 keys for fp8, a scheduler crash for auto.
    auto = cells["cell(vllm-0.32.0, lmcache-0.5.6, qwen3-tiny, auto, LMCacheMPConnector)"].expected_failures
    fp8 = cells["cell(vllm-0.32.0, lmcache-0.5.6, qwen3-tiny, fp8_e5m2, LMCacheMPConnector)"].expected_failures
    assert set(auto) == set(fp8) == {"engine_format_isolation", "engine_lora_isolation", "engine_prompt_embeds",
                                     "engine_block_size"}
    assert "scheduler" in auto["engine_format_isolation"] and "uint8" in fp8["engine_format_isolation"]


def test_intermittent_expectations_never_turn_red():
    cell = Cell("zoo.y", "store", (), Tier("quick", "ci", 1), {}, {}, {"state_machine": "maybe"})
    failing, passing = _doc({"state_machine": "Fail"}), _doc({"state_machine": "Pass"})
    runner.apply_expectations(failing, cell)
    runner.apply_expectations(passing, cell)
    assert failing["tests"][0]["status"] == "XFail" and passing["tests"][0]["status"] == "Pass"


def test_expectations_can_be_conditional_on_the_stack_versions(tmp_path):
    text = STACKS + """expectations:
  - {when: {vllm: "0.28.0"}, clauses: [engine_store_then_load], reason: old}
"""
    cells = {c.name: c for c in matrix.load(write(tmp_path, text)).cells("quick")}
    assert cells["ex-qwen3-tiny-auto@v28"].expected_failures == {"engine_store_then_load": "old"}
    assert cells["ex-qwen3-tiny-auto@v32"].expected_failures == {}


def test_an_intermittent_expectation_from_matrix_yaml_never_turns_red_and_yields_to_a_known_failure(tmp_path):
    text = STACKS + """expectations:
  - {when: {vllm: "0.28.0"}, intermittent: true, clauses: [engine_store_then_load, engine_cache_salt], reason: vllm}
  - {when: {vllm: "0.28.0"}, clauses: [engine_cache_salt], reason: keyed by tokens}
"""
    cell = {c.name: c for c in matrix.load(write(tmp_path, text)).cells("quick")}["ex-qwen3-tiny-auto@v28"]
    assert cell.intermittent == {"engine_store_then_load": "vllm", "engine_cache_salt": "vllm"}
    doc = _doc({"engine_store_then_load": "Fail", "engine_cache_salt": "Pass"})
    runner.apply_expectations(doc, cell)
    assert {t["clause"]: t["status"] for t in doc["tests"]} == {"engine_store_then_load": "XFail",
                                                                 "engine_cache_salt": "XPass"}
    with pytest.raises(MatrixError, match="intermittent: expected true or false"):
        matrix.load(write(tmp_path, text.replace("intermittent: true", "intermittent: sometimes")))


def test_kept_results_take_the_expectations_matrix_yaml_has_now(tmp_path):
    """Editing an expectation needs no rerun: a kept result is re-judged, from the suite's own verdicts."""
    cell = Cell("c", "store", (), Tier("quick", "ci", 60))
    doc = {"suite_version": runner.__version__, "suite_digest": runner.suite_digest(), "schema": runner.results.SCHEMA,
           "cell": {"wall_s": 1.0},
           **_doc({"shape_preserved": "Fail", "state_machine": "Pass", "dtype_preserved": "Fail"})}
    runner.apply_expectations(doc, cell)
    runner.results.write(runner.result_path(tmp_path, cell), doc)
    said: list[str] = []
    expecting = replace(cell, expected_failures={"shape_preserved": "bug", "state_machine": "bug"})
    [kept] = runner.run_cells([expecting], tmp_path, stacks=object(), say=said.append)
    assert {t["clause"]: t["status"] for t in kept["tests"]} == {
        "shape_preserved": "XFail", "state_machine": "XPass", "dtype_preserved": "Fail"}
    assert "expectations now make it" in said[0]
    # The expectation dropped again: the suite's own verdicts come back, messages included.
    [back] = runner.run_cells([cell], tmp_path, stacks=object(), say=said.append)
    assert {t["clause"]: t["status"] for t in back["tests"]} == {
        "shape_preserved": "Fail", "state_machine": "Pass", "dtype_preserved": "Fail"}
    assert back["tests"][1]["message"] == "" and "expected" not in back["tests"][0]


def test_results_from_before_raw_statuses_are_read_back():
    cell = Cell("c", "store", (), Tier("quick", "ci", 60))
    old = {"tests": [{"clause": "a", "status": "XFail", "expected": "bug", "message": "m"},
                     {"clause": "b", "status": "XPass", "message": "expected to fail (bug) but passed: the expectation is stale"},
                     {"clause": "c", "status": "XFail", "message": "the implementer's xfail file"}]}
    runner.apply_expectations(old, cell)
    assert [t["status"] for t in old["tests"]] == ["Fail", "Pass", "XFail"]


def test_a_result_made_by_other_code_is_run_again(tmp_path):
    """A kept result counts as done only for the suite's code as it is now (its files' hash), not
    just its version string, which stays the same from commit to commit."""
    path = tmp_path / "c.json"
    doc = {"suite_version": runner.__version__, "suite_digest": runner.suite_digest(), "schema": runner.results.SCHEMA,
           "cell": {"wall_s": 1.0}, **_doc({"shape_preserved": "Pass"})}
    runner.results.write(path, doc)
    assert runner.is_done(path)
    runner.results.write(path, {**doc, "suite_digest": "0" * 64})
    assert not runner.is_done(path)
    runner.results.write(path, {k: v for k, v in doc.items() if k != "suite_digest"})
    assert not runner.is_done(path)
