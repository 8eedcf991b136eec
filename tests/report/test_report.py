"""The diff gate and the report's files, rendered from result files. The answer grids:
test_report_answers.py; index.html in real headless Chromium: test_report_page.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.report import diff
from conformance.report import render as report
from conformance.verdict import results

from tests.report.report_cells import write_cell, write_stack_cell


def test_diff_flags_regressions_and_compares_only_aligned_cells(two_runs):
    result = diff.compare(*two_runs)
    assert result.compared == 2 and result.regressed
    assert [(c.cell, c.clause, c.base, c.head) for c in result.newly_failing] == [
        ("store(a) [quick]", "format_isolation", "Pass", "Fail")]
    assert [c.clause for c in result.newly_passing] == ["stride_contract"]
    assert result.cells_gone == ["store(gone) [quick]"] and result.cells_new == ["store(new) [quick]"]
    text = diff.markdown(result)
    assert "| store(a) [quick] | `format_isolation` | Pass | Fail |" in text and "REGRESSION" in text


def test_diff_cli_exit_codes(two_runs):
    base, head = two_runs
    cmd = [sys.executable, "-m", "conformance.cli", "diff"]
    assert subprocess.run(cmd + [str(base), str(head)], capture_output=True).returncode == 1
    assert subprocess.run(cmd + [str(head), str(head)], capture_output=True).returncode == 0


def _diff_cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conformance.cli", "diff", *map(str, args)],
                          capture_output=True, text=True)


def test_diff_rows_carry_the_failure_message_and_the_repro_command(two_runs):
    text = diff.markdown(diff.compare(*two_runs))
    row = next(line for line in text.splitlines() if "`format_isolation`" in line)
    assert "[format_isolation] </script><b>x</b>" in row and "`python -m pytest --pyargs conformance --kv-store=store(a)`" in row


@pytest.mark.parametrize("make_head, says", [
    (lambda d: d / "nowhere", "does not exist"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "no results files"),
    (lambda d: (d / "file").write_text("x") and d / "file", "not a directory"),
])
def test_diff_fails_closed_on_a_head_with_nothing_to_compare(two_runs, tmp_path, make_head, says):
    proc = _diff_cli(two_runs[0], make_head(tmp_path))
    assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_diff_fails_closed_on_a_truncated_file_and_an_unknown_status(two_runs):
    base, head = two_runs
    path = next(head.glob("store_a_.json"))
    path.write_text(path.read_text()[:200])
    proc = _diff_cli(base, head)
    assert proc.returncode == 2 and "unreadable or truncated results file" in proc.stderr, proc.stderr
    write_cell(head, "store(a)", {"format_isolation": "Kaput"})
    proc = _diff_cli(base, head)
    assert proc.returncode == 2 and "unknown status 'Kaput'" in proc.stderr, proc.stderr


def test_lost_coverage_fails_the_gate_unless_allowed(tmp_path):
    base, head = tmp_path / "base", tmp_path / "head"
    write_cell(base, "store(a)", {})
    write_cell(base, "store(b)", {"stride_contract": "Fail"}, "[stride_contract] broken")
    write_cell(base, "store(c)", {})
    write_cell(head, "store(a)", {"scales_roundtrip": "Disabled"})
    write_cell(head, "store(b)", {"stride_contract": "Not runnable"}, "Not runnable: gone quiet")
    write_cell(head, "store(c)", {"byte_exact_roundtrip": "Not exercised"}, "Not exercised: loaded nothing")
    result = diff.compare(base, head)
    assert not result.regressed and [(c.cell, c.clause, c.head) for c in result.lost] == [
        ("store(a) [quick]", "scales_roundtrip", "Disabled"), ("store(b) [quick]", "stride_contract", "Not runnable"),
        ("store(c) [quick]", "byte_exact_roundtrip", "Not exercised")]
    assert _diff_cli(base, head).returncode == 1 and "COVERAGE LOST" in _diff_cli(base, head).stdout
    assert _diff_cli(base, head, "--allow-lost").returncode == 0
    assert json.loads(_diff_cli(base, head, "--format", "json").stdout)["failed"] is True
    (head / "store_b_.json").unlink()  # a cell gone is lost coverage too
    assert diff.compare(base, head).cells_gone == ["store(b) [quick]"] and _diff_cli(base, head).returncode == 1


def test_markdown_and_json(two_runs, tmp_path):
    matrix = report.render(two_runs[1], tmp_path / "out")
    assert report.any_red(matrix)
    md = (tmp_path / "out" / "matrix.md").read_text()
    assert "| store(a) | quick |" in md and "repro: `python -m pytest" in md
    assert json.loads((tmp_path / "out" / "matrix.json").read_text())["cells"][0]["statuses"]


def test_each_cell_carries_its_cost_and_the_page_its_line_and_seconds_per_clause(tmp_path):
    """The cost model (``verdict.cost``), derived from the results the report reads: matrix.json's cells
    carry it, and the page's cell detail has its line and each clause's seconds."""
    from conformance.report.html import page_data

    out = tmp_path / "results"
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass")
    (path,) = out.glob("*.json")
    doc = json.loads(path.read_text())
    doc["connector"]["engine_timings"].update({"store": {"wall_s": 2.0}, "engine_starts": 1, "vllm_imports": 1})
    results.write(path, doc)
    matrix = report.render(out, tmp_path / "out")
    cost = json.loads((tmp_path / "out" / "matrix.json").read_text())["cells"][0]["cost"]
    assert cost["wall_s"] == 1.0 and cost["engines_started"] == 1 and cost["roles_s"] == {"store": 2.0}
    assert cost["clauses_s"]["engine_store_then_load"] == 0.1
    (cell,) = page_data(matrix)["cells"]
    assert cell["cost_line"].startswith("1.0 s wall, 1 engine started, 1 vLLM import; slowest clauses: "), cell
    assert cell["clause_s"]["engine_store_then_load"] == 0.1


def test_no_path_of_the_machine_that_ran_a_cell_reaches_its_report():
    """A stack's traceback names vLLM's own file; where that machine keeps its venvs, its checkout
    or its temporary directories is nobody's business."""
    text = ('File "/work/stacks/vllm-0.19.1/lib/python3.11/site-packages/vllm/v1/worker.py", line 3\n'
            f"from '{Path.cwd()}/.kvconform/stacks/vllm-0.28.0/lib/python3.12/site-packages/vllm/fa_utils.py'"
            f" in {Path.cwd()}/conformance/x.py under /tmp/pytest-of-root/x")
    assert report.portable(text) == ('File "<site-packages>/vllm/v1/worker.py", line 3\n'
                                     "from '<site-packages>/vllm/fa_utils.py' in ./conformance/x.py under <tmp>")


def test_the_report_names_the_platform_each_run_was_made_on(tmp_path):
    """The CPU features that decide what vLLM-CPU runs (fp8 KV in engines needs AVX-512 or AMX) and the
    GPU, recorded in each results file, head the report; a file from before they were recorded names
    its CPU alone."""
    out = tmp_path / "results"
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass")
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector")
    first, second = sorted(out.glob("*.json"))
    for path, env in ((first, {"cpu": "Xeon", "cpu_features": ["AVX2"], "gpu": "none"}), (second, {"cpu": "Old"})):
        doc = json.loads(path.read_text())
        doc["environment"] = {**{k: v for k, v in doc["environment"].items() if k not in ("cpu_features", "gpu")},
                              **env}
        results.write(path, doc)
    matrix = report.render(out, tmp_path / "out")
    assert matrix["platforms"] == ["Old", "Xeon (AVX2), GPU: none"]
    assert "Run on: Old; Xeon (AVX2), GPU: none." in (tmp_path / "out" / "matrix.md").read_text()


def test_a_store_rows_summary_says_what_a_store_row_is_not_a_blank_dtype(tmp_path):
    """A store runs in no engine: its row has no kv_cache_dtype, and its sentences say so (#52: they
    read "passes on this machine for -.")."""
    out = tmp_path / "results"
    write_cell(out, "memory", {"byte_exact_roundtrip": "Fail"})
    path = next(out.glob("*.json"))
    doc = json.loads(path.read_text())
    doc["cell"]["coordinates"] = {"store": "memory"}  # as the runner records a store cell
    path.write_text(json.dumps(doc))
    matrix = report.render(out, tmp_path / "out")
    (subject,) = matrix["answers"]["subjects"]
    assert subject["summary"], subject
    for line in subject["summary"]:
        assert " for -" not in line and "a store judged alone, in no engine" in line, line
