"""matrix.yaml validation, the cell runner's crash handling, expectations and the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conformance import matrix, report, runner
from conformance.matrix import Cell, MatrixError, Tier

from .conftest import REPO

GOOD = """schema: kvconform.matrix/1
tiers:
  quick: {profile: ci, timeout_s: 300}
stores:
  memory: {target: memory, tiers: [quick]}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


def test_repo_matrix_is_valid_and_quick_tier_has_controls():
    cells = matrix.load(REPO / "matrix.yaml").cells("quick")
    names = {c.name for c in cells}
    assert {"memory", "file", "zoo.naive_fp16"} <= names
    assert all(c.expected_failures for c in cells if c.name.startswith("zoo."))


@pytest.mark.parametrize("text, says", [
    (GOOD.replace("target: memory", "targt: memory"), "stores.memory.targt: expected one of ['target', 'tiers'] (unknown key)"),
    (GOOD.replace("profile: ci", "profile: fast"), "tiers.quick.profile: expected one of ['dev', 'ci', 'deep', 'certify']"),
    (GOOD.replace("tiers: [quick]", "tiers: [quik]"), "stores.memory.tiers[0]: expected one of ['quick'], got 'quik'"),
    (GOOD.replace("kvconform.matrix/1", "kvconform.matrix/9"), "schema: expected 'kvconform.matrix/1'"),
    (GOOD + "  bad: [", "not valid YAML"),
])
def test_malformed_matrix_is_one_line(tmp_path, text, says):
    path = write(tmp_path, text)
    with pytest.raises(MatrixError) as info:
        matrix.load(path)
    assert says in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--matrix", str(path)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr


def test_unknown_tier(tmp_path):
    with pytest.raises(MatrixError, match="tier 'nightly' is not defined; valid: quick"):
        matrix.load(write(tmp_path, GOOD)).cells("nightly")


@pytest.mark.parametrize("factory, says, timeout", [
    ("tests.stores_for_tests:crashing_factory", "without writing results", 300),
    ("tests.stores_for_tests:sleeping_factory", "exceeded its 20s deadline", 20),
])
def test_crashed_or_hung_cell_still_yields_a_result(tmp_path, monkeypatch, factory, says, timeout):
    monkeypatch.chdir(REPO)
    cell = Cell("broken", "store", (f"--kv-store={factory}",), Tier("quick", "ci", timeout))
    doc = runner.run_cell(cell, tmp_path)
    assert {t["status"] for t in doc["tests"]} == {"Error"}
    assert all(says in t["message"] and "log tail" in t["message"] for t in doc["tests"])
    assert runner.is_done(runner.result_path(tmp_path, cell))
    rendered = report.render(tmp_path, tmp_path / "out")
    assert report.is_red(rendered) and "store(broken)" in (tmp_path / "out" / "matrix.md").read_text()


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
    cells = {c.id: c for c in m.cells("standard") if c.kind == "engine"}
    example = cells["engine(ExampleConnector, qwen3-tiny, fp8_e5m2)"]
    assert "--kv-connector=ExampleConnector" in example.args and "--kv-cache-dtype=fp8_e5m2" in example.args
    assert set(example.expected_failures) == {"engine_format_isolation"}
    # The LMCache expectation is conditional on the fp8 formats: its auto cell expects nothing.
    assert cells["engine(LMCacheMPConnector, qwen3-tiny, auto)"].expected_failures == {}
    assert set(cells["engine(LMCacheMPConnector, qwen3-tiny, fp8_e5m2)"].expected_failures) == {"engine_format_isolation"}


ENGINE = GOOD + """connectors:
  ex: {connector: ExampleConnector, models: [qwen3-tiny], kv_cache_dtypes: [auto], tiers: [quick]}
"""


@pytest.mark.parametrize("text, says", [
    (ENGINE.replace("qwen3-tiny", "qwen9"), "connectors.ex.models[0]: expected one of ['deepseek-v2-lite-tiny', 'llama3-tiny', 'qwen3-tiny'], got 'qwen9'"),
    (ENGINE.replace("[auto]", "[fp8_e5m3]"), "connectors.ex.kv_cache_dtypes[0]: expected one of"),
    (ENGINE + "expectations:\n  - {when: {connector: ex}, clauses: [engine_magic], reason: x}\n",
     "expectations[0].clauses[0]: expected a clause id, got 'engine_magic'"),
])
def test_malformed_engine_matrix(tmp_path, text, says):
    path = write(tmp_path, text)
    (tmp_path / "fixtures").symlink_to(REPO / "fixtures")
    with pytest.raises(MatrixError) as info:
        matrix.load(path)
    assert says in str(info.value)


def test_matrix_loads_without_torch_or_pytest():
    # The noxfile expands matrix.yaml in the Python that runs nox, which has neither.
    code = ("import sys; sys.modules['torch'] = None; sys.modules['pytest'] = None; "
            "from conformance.matrix import load; print(len(load('matrix.yaml').cells('quick')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_intermittent_expectations_never_turn_red():
    cell = Cell("zoo.y", "store", (), Tier("quick", "ci", 1), {}, {}, {"state_machine": "maybe"})
    failing, passing = _doc({"state_machine": "Fail"}), _doc({"state_machine": "Pass"})
    runner.apply_expectations(failing, cell)
    runner.apply_expectations(passing, cell)
    assert failing["tests"][0]["status"] == "XFail" and passing["tests"][0]["status"] == "Pass"
