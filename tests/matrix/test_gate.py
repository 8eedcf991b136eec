"""The PR gate as a connector repository adopts it: the reusable workflow's install and gate steps,
run as scripts over two commits of a vendor's repository, from a bare venv (a fresh runner's
setup-python: nothing but what the install step puts there)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.fresh import bare_venv, fresh_clone, runner_env

pytestmark = pytest.mark.xdist_group("gate-runner")  # one runner venv per worker that runs these

WORKFLOW = REPO / ".github" / "workflows" / "gate.yml"
GOOD = "from conformance.stores.file import make_store  # noqa: F401\n"
BAD = "from conformance.zoo.truncating import make_store  # noqa: F401\n"  # cuts the last bytes of every value


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def run_step(name: str, inputs: dict[str, str], cwd: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    """A step of the workflow as GitHub would run it: its env with the inputs (and their defaults)
    substituted, its script under bash with the runner venv's Python first on PATH, the job summary a file."""
    declared = workflow()[True]["workflow_call"]["inputs"]  # YAML reads the key `on` as True
    values = {name: str(spec.get("default", "")) for name, spec in declared.items()} | inputs
    (step,) = [s for s in workflow()["jobs"]["gate"]["steps"] if s.get("name") == name]
    env = {k: re.sub(r"\$\{\{\s*(?:inputs\.([\w-]+)|[^}]*)\s*\}\}", lambda m: values[m[1]] if m[1] else "", v)
           for k, v in step["env"].items()}
    summary = cwd / "summary.md"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", step["run"]], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, env=runner_env(bin_dir, **env, GITHUB_STEP_SUMMARY=str(summary)))


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Path:
    """A fresh runner's Python after the workflow's install step, the suite being this checkout (its
    `suite:` input) and the stack none (a store gate needs no vLLM): the bin/ of its venv."""
    bin_dir = bare_venv(tmp_path_factory.mktemp("runner") / "venv")
    suite = fresh_clone(tmp_path_factory.mktemp("suite"))
    proc = run_step("install kvconform and the stack", {"suite": str(suite), "stack": ""}, suite, bin_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return bin_dir


@pytest.fixture
def gate_step(runner):
    """The workflow's `kvconform gate` step, run from the runner's venv."""
    return lambda inputs, cwd: run_step("kvconform gate", inputs, cwd, runner)


def checkouts(tmp: Path, base: str, head: str) -> Path:
    """A vendor repository at two commits, checked out side by side as the workflow does."""
    repo = tmp / "repo"
    (repo / "acme_store").mkdir(parents=True)
    (repo / "acme_store" / "__init__.py").write_text("")
    git = lambda *a: subprocess.run(["git", "-c", "user.name=acme", "-c", "user.email=a@example.invalid", *a],  # noqa: E731
                                    cwd=repo, check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    shas = []
    for text in (base, head):
        (repo / "acme_store" / "store.py").write_text(text)
        git("add", ".")
        git("commit", "-qm", "change", "--allow-empty")
        shas.append(git("rev-parse", "HEAD"))
    job = tmp / "job"
    for side, sha in zip(("base", "head"), shas):
        subprocess.run(["git", "clone", "-q", str(repo), str(job / side)], check=True)
        subprocess.run(["git", "checkout", "-q", sha], cwd=job / side, check=True)
    return job


INPUTS = {"store": "acme_store.store:make_store", "kv-cache-dtypes": "auto", "suite-args": "-kbyte_exact_roundtrip"}


def test_the_gate_fails_a_head_that_regressed_and_says_where_in_the_job_summary(tmp_path, gate_step):
    job = checkouts(tmp_path, GOOD, BAD)
    proc = gate_step(INPUTS, job)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = (job / "summary.md").read_text()
    assert "byte_exact_roundtrip" in summary and "Pass" in summary and "Fail" in summary, summary
    assert "store(acme_store.store:make_store)" in summary and "--kv-store=acme_store.store:make_store" in summary


def test_the_gate_passes_a_change_that_keeps_every_verdict(tmp_path, gate_step):
    job = checkouts(tmp_path, GOOD, GOOD + "# a comment\n")
    proc = gate_step(INPUTS, job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no regression" in (job / "summary.md").read_text().lower()


def test_a_head_that_cannot_run_fails_the_gate(tmp_path, gate_step):
    job = checkouts(tmp_path, GOOD, "raise ImportError('acme_store needs libacme.so')\n")
    assert gate_step(INPUTS, job).returncode == 1


def test_a_missing_checkout_fails_closed(tmp_path, gate_step):
    job = checkouts(tmp_path, GOOD, GOOD)
    shutil.rmtree(job / "head")
    proc = gate_step(INPUTS, job)
    assert proc.returncode == 2 and "head head: not a directory" in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", ["connector", "store", "extra-config", "capabilities", "kv-cache-dtypes"])
def test_every_input_reaches_the_gate_as_a_variable_not_spliced_into_the_script(name):
    (step,) = [s for s in workflow()["jobs"]["gate"]["steps"] if s.get("name") == "kvconform gate"]
    assert "${{" not in step["run"]
    assert any(f"inputs.{name}" in value for value in step["env"].values())
