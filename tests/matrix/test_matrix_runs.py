"""Running a matrix's cells: secrets masked in every file, one run per results directory, a
crashed or hung cell still a result, cells in parallel, exclusions, `kvconform run --cell/--list`
and the report of a run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conformance.matrix import definition as matrix
from conformance.matrix import runner
from conformance.matrix.definition import Cell, MatrixError, Tier
from conformance.report import render as report
from conformance.verdict import secrets

from tests.conftest import REPO
from tests.matrix.matrix_texts import GOOD, write


def test_planted_secrets_reach_no_file_a_run_writes(tmp_path, monkeypatch):
    # A store's errors with a URL's credentials and every secret it was configured with: secret-named
    # KVCONFORM_* variables, a token in one's URL, a nested extra config key, an engine env value.
    # Results (the child's), log, JUnit (the runner's), the cell's command and every report file must mask them all.
    from tests.stores_for_tests import PLANTED, planted_configuration

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(secrets, "KNOWN", secrets.SecretValues())  # only the runner's own registering
    env, options = planted_configuration()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = ("--kv-store=tests.stores_for_tests:secret_leaking_store", "--kv-no-shrink", "-k", "roundtrip")
    cell = Cell("leaky", "store", (*store, *options), Tier("quick", "ci", 300))
    doc = runner.run_cell(cell, tmp_path)
    said = [t["message"] for t in doc["tests"] if "cannot reach" in t["message"]]  # the suite's own results file
    assert said and all("redis://svc:***@10.0.0.1:6379/0 configured with [" in m for m in said), doc["tests"]
    report.render(tmp_path, tmp_path / "report")
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.suffix for p in written} >= {".json", ".log", ".xml", ".md", ".html"}
    for path in written:
        text = path.read_text(errors="replace")
        assert not [s for s in PLANTED if s in text], f"{path.name} leaks a secret"
    assert "redis://svc:***@" in json.dumps(doc)
    assert '"secret_key": "***"' in doc["cell"]["command"] and "--kv-engine-env=S3_CREDS=***" in doc["cell"]["command"]


def test_a_second_run_into_the_same_results_is_refused_in_one_line_and_leaves_the_first_alone(tmp_path):
    # Once, a second run there removed the first's warm hosts and the first died with a traceback.
    results = tmp_path / "results"
    with runner.only_run_in(results):
        held = (results / ".lock").read_text()
        proc = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--matrix", str(write(tmp_path, GOOD)),
                               "--results", str(results)], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
        assert f"another kvconform run ({held}) is writing to {results}" in proc.stderr and "--results DIR" in proc.stderr
        assert not list(results.glob("*.json"))
    assert held.startswith(f"pid {os.getpid()}, since ")
    with runner.only_run_in(results):  # let go at the end of the run that held it
        pass


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
    assert report.any_red(rendered) and "store(broken)" in (tmp_path / "out" / "matrix.md").read_text()


def test_cells_run_concurrently_come_back_in_matrix_order(tmp_path, monkeypatch):
    cells = [Cell(f"c{i}", "store", (), Tier("quick", "ci", 60)) for i in range(5)]
    ran: list[str] = []

    def fake_run_cell(cell, results_dir, stacks, **_):
        import time
        time.sleep(0.05 * (5 - int(cell.name[1:])))  # the first cells finish last
        ran.append(cell.name)
        return {"cell": {"wall_s": 0.0}, "summary": {"Pass": 1}, "name": cell.name}

    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    said: list[str] = []
    docs = runner.run_cells(cells, tmp_path, jobs=3, stacks=object(), say=said.append)
    assert [d["name"] for d in docs] == [c.name for c in cells]
    assert ran != [c.name for c in cells] and len(said) == 10


def test_progress_lines_from_parallel_cells_never_run_together(capsys):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: runner.say_line(f"[{i}] cell({'x' * 200}) running"), range(400)))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 400 and all(line.endswith(") running") and line.count("[") == 1 for line in lines)


EXCLUDING = GOOD.replace("memory: {target: memory, tiers: [quick]}", """memory: {target: memory, tiers: [quick]}
  file: {target: file, tiers: [quick]}
exclusions:
  - when: {store: file}
    reason: the file store is under repair
    link: https://example.org/issue/1""")


def test_excluded_cells_are_not_run_but_reported_as_skip_with_the_reason(tmp_path):
    loaded = matrix.load(write(tmp_path, EXCLUDING))
    assert [c.name for c in loaded.cells("quick")] == ["memory"]
    [(cell, reason)] = loaded.excluded("quick")
    assert cell.name == "file" and reason == "the file store is under repair (https://example.org/issue/1)"
    doc = runner.write_excluded(cell, reason, tmp_path / "results")
    assert {t["status"] for t in doc["tests"]} == {"Skip"}
    assert all("excluded by the matrix: the file store is under repair" in t["message"] for t in doc["tests"])
    # An exclusion's placeholder never counts as done: drop the exclusion and the cell runs.
    assert not runner.is_done(runner.result_path(tmp_path / "results", cell))
    report.render(tmp_path / "results", tmp_path / "out")
    assert "the file store is under repair" in (tmp_path / "out" / "matrix.md").read_text()


def test_asking_for_an_excluded_cell_says_why(tmp_path):
    proc = _cli_run(tmp_path, write(tmp_path, EXCLUDING), "--cell", "file")
    assert proc.returncode == 2 and "cell 'file' is excluded: the file store is under repair" in proc.stderr


def _cli_run(tmp_path, path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--matrix", str(path), "--tier", "quick",
                           *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_an_unknown_cell_names_the_closest_ones_not_the_whole_tier(tmp_path):
    path = write(tmp_path, EXCLUDING)
    proc = _cli_run(tmp_path, path, "--cell", "memroy")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith("has no cell 'memroy'; did you mean 'memory'? "
                                        "`kvconform run --tier quick --list` lists its 1 cells"), proc.stderr


def test_list_prints_the_tiers_cells_and_the_excluded_ones_with_why(tmp_path):
    proc = _cli_run(tmp_path, write(tmp_path, EXCLUDING), "--list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["memory\tstore(memory)",
                                        "file\tstore(file)\texcluded: the file store is under repair "
                                        "(https://example.org/issue/1)"]
    assert not (tmp_path / "results").exists()  # listing runs nothing


@pytest.mark.parametrize("when, says", [
    ("{stor: file}", "exclusions[0].when.stor: expected a coordinate, one of ['store', 'connector'"),
    ("{vllm: 0.30}", "exclusions[0].when.vllm: expected a string or a list of strings (quote versions: '0.30.0'), got 0.3"),
    ("{}", "exclusions[0].when: expected a mapping of coordinates"),
])
def test_malformed_exclusions_are_one_line(tmp_path, when, says):
    with pytest.raises(MatrixError, match=re.escape(says)):
        matrix.load(write(tmp_path, EXCLUDING.replace("{store: file}", when)))
    with pytest.raises(MatrixError, match=re.escape("exclusions[0].reason: expected a non-empty reason")):
        matrix.load(write(tmp_path, EXCLUDING.replace("the file store is under repair", "''")))


def test_the_report_of_a_run_leaves_out_results_of_cells_the_matrix_no_longer_has(tmp_path):
    def run(text: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--matrix", str(write(tmp_path, text)),
                               "--tier", "quick", "--results", "res", "--report", "rep"], capture_output=True,
                              text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})

    first = run(EXCLUDING)
    assert first.returncode == 0, first.stderr
    assert "store(file)" in (tmp_path / "rep" / "matrix.md").read_text()
    second = run(GOOD)  # the file entry and its exclusion are gone; memory's result is kept, not rerun
    assert "left out of the report, no longer cells of tier 'quick': file" in second.stdout
    assert "already done, kept" in second.stdout
    md = (tmp_path / "rep" / "matrix.md").read_text()
    assert "store(memory)" in md and "store(file)" not in md and (tmp_path / "res" / "file.json").exists()
