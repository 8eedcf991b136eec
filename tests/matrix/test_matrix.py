"""matrix.yaml validation: its tiers, entries, cells and controls, each mistake one line. Its stacks:
test_matrix_stacks.py; its expectations: test_matrix_expectations.py; running its cells:
test_matrix_runs.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conformance.matrix import definition as matrix
from conformance.matrix import runner
from conformance.matrix.definition import MatrixError

from tests.conftest import REPO
from tests.matrix.matrix_texts import GOOD, write


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


def test_unknown_tier(tmp_path):
    with pytest.raises(MatrixError, match="tier 'nightly' is not defined; valid: quick"):
        matrix.load(write(tmp_path, GOOD)).cells("nightly")


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


def test_a_multiconnector_cell_names_its_children():
    """Two MultiConnector entries differ by their children: the connector coordinate (and so the cell
    id and the expectations' when:) says which."""
    from conformance.matrix.definition import connector_label

    children = {"connectors": [{"kv_connector": "LMCacheMPConnector"}, {"kv_connector": "ExampleConnector"}]}
    assert connector_label("MultiConnector", children) == "MultiConnector(LMCacheMPConnector+ExampleConnector)"
    assert connector_label("MultiConnector", None) == "MultiConnector"
    assert connector_label("ExampleConnector", children) == "ExampleConnector"
