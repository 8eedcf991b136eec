"""Runs matrix cells, each in its own pytest process with a deadline.

A cell that crashes, hangs past its deadline or never writes results still yields a result
file: every clause Error, with the reason and the tail of the log, so nothing disappears from
the report. Results are keyed by cell and the suite's code (its version and files' hash): a rerun skips
cells that code already did.

Each file has one writer: the cell's pytest (the plugin) writes the suite's own verdicts to
``raw_path``; the runner reads them and writes the cell's result (``result_path``: the verdicts, the
cell, the expectations applied), the only file a report reads, and the only writer of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from conformance import __version__
from conformance.levels.engine import handover
from conformance.levels.engine.handover import AheadHost
from conformance.matrix import lane
from conformance.matrix.definition import Cell
from conformance.matrix.hosts import WarmHosts, hosts_for
from conformance.matrix.stacks import Provisioner, StackError, machine_platforms, requirements, satisfied_here
from conformance.util import procs
from conformance.util.identity import suite_digest
from conformance.verdict import results, secrets
from conformance.verdict.clauses import CLAUSES
from conformance.verdict.results import CellInfo, ResultsDocument, TestEntry
from conformance.verdict.status import Status

LOG_TAIL_CHARS = 4000
DEFAULT_STACKS_DIR = Path(".kvconform/stacks")


def result_path(results_dir: Path, cell: Cell) -> Path:
    """The cell's result, which the runner alone writes."""
    return Path(results_dir) / f"{cell.file_stem}.json"


def raw_path(results_dir: Path, cell: Cell) -> Path:
    """Where the cell's pytest writes the suite's own verdicts (``--kv-results``), which the runner
    reads into the cell's result and then removes. Beside the result, with the same stem: what the
    plugin keeps beside its results file (an engine cell's evidence) is the result's."""
    return Path(results_dir) / f"{cell.file_stem}.raw"


def baselines_dir(results_dir: Path) -> Path:
    """Where a run's engine cells share their no-connector baselines (conformance/levels/engine/baselines.py)."""
    return Path(results_dir).resolve() / "baselines"


def is_done(path: Path) -> bool:
    """A result of this suite's code (its version and the hash of its files: a result made before
    the code changed is run again) that ran: a placeholder (an excluded cell, a platform this
    machine lacks) is written again or replaced by a run on the next pass."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return (doc.get("suite_version") == __version__ and doc.get("suite_digest") == suite_digest()
            and doc.get("schema") == results.SCHEMA
            and doc.get("cell", {}).get("ran", True))


def suite_command(args: Sequence[str], profile: str, out: Path, junit: Path,
                  kv_cache_dtypes: Sequence[str] | None = None, python: str = sys.executable) -> list[str]:
    """The pytest command line that runs the conformance suite on one implementation (``args``)."""
    cmd = [python, "-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider", "-q", *args,
           f"--kv-profile={profile}", f"--kv-results={out}", f"--junitxml={junit}"]
    if kv_cache_dtypes:
        cmd.append(f"--kv-cache-dtypes={','.join(kv_cache_dtypes)}")
    return cmd


def run_cell(cell: Cell, results_dir: Path, stacks: Provisioner | None = None,
             env: Mapping[str, str] | None = None, hosts: WarmHosts | None = None) -> ResultsDocument:
    """Run one cell (in its stack's Python, provisioned by ``stacks``; ``env`` added to its environment;
    an engine cell with the engine host ``hosts`` has warm for it); always returns and writes its results."""
    out, raw = result_path(results_dir, cell), raw_path(results_dir, cell)
    junit = out.with_suffix(".junit.xml")
    log = out.with_suffix(".log")
    out.unlink(missing_ok=True)
    raw.unlink(missing_ok=True)
    missing = machine_platforms().get(cell.tier.platform)
    if missing is not None:  # a GPU tier on a CPU machine: reported, never attempted
        doc = _uniform_document(cell, Status.NOT_RUNNABLE, f"tier {cell.tier.name!r} runs on "
                                                           f"{cell.tier.platform}: {missing}")
        doc["cell"] = _cell_record(cell, None, None, 0.0, ran=False)
        results.write(out, doc)
        return doc
    python, stack, failed = _stack_python(cell, stacks)
    started = time.monotonic()  # after provisioning: the stack records its own install_s
    args = (*cell.args, *([f"--kv-engine-baselines={baselines_dir(results_dir)}"] if cell.level == "engine" else []))
    cmd = suite_command(args, cell.tier.profile, raw, junit, python=python)
    secrets.register_args(cmd)  # what the child echoes of its config is masked here too
    if failed is None:
        run_env = cell_env(python, stack is not None, env)
        secrets.register_environment(run_env)
        handed = hosts.take(cell, python, run_env) if hosts else []
        host_logs: list[Path] = []
        try:
            output, problem = _run_pytest(cmd, raw, log, cell.tier.timeout_s, run_env, handed)
        finally:
            if hosts:
                host_logs = hosts.give_back(handed, out.with_suffix(".host.log"))
        for written in (log, junit, *host_logs):  # what a connector or store printed
            if written.exists():
                written.write_text(results.redact_text(written.read_text(errors="replace")))
        output = results.redact_text(output)
    else:
        output, problem = failed.log, failed.reason
        log.write_text(output)
    doc = json.loads(raw.read_text()) if problem is None else _error_document(cell, problem, output)
    raw.unlink(missing_ok=True)  # read: the result written below carries all of it
    shown = "python" if python == sys.executable else os.path.relpath(python)
    command = (" ".join([shown, *cmd[1:]]).replace(str(raw), "RESULTS.json").replace(str(junit), "JUNIT.xml")
               .replace(str(Path.cwd()) + os.sep, ""))  # a repro command is relative to the checkout
    doc["cell"] = _cell_record(cell, stack, results.redact_text(command), time.monotonic() - started)
    apply_expectations(doc, cell)
    results.write(out, doc)
    return doc


def cell_env(python: str, stacked: bool, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a cell's pytest runs with in ``python`` (a ``stacked`` cell's names it for its engines),
    ``env`` added; the engine hosts lent to it were started with it too."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **({"KVCONFORM_ENGINE_PYTHON": python} if stacked else {}),
            **(env or {})}


def _cell_record(cell: Cell, stack: dict[str, Any] | None, command: str | None, wall_s: float,
                 ran: bool = True, excluded: str | None = None) -> CellInfo:
    """What a result says of its cell: where it sits in the matrix, what ran it, how long it took."""
    record: CellInfo = {"id": cell.id, "name": cell.name, "level": cell.level, "coordinates": dict(cell.coordinates),
                        "tier": cell.tier.name, "stack": stack, "command": command, "wall_s": round(wall_s, 2)}
    if cell.headline:
        record["headline"] = cell.headline
    if not ran:
        record["ran"] = False
    if excluded is not None:
        record["excluded"] = excluded
    return record


def _stack_python(cell: Cell, stacks: Provisioner | None) -> tuple[str, dict[str, Any] | None, StackError | None]:
    """The Python the cell runs in and its stack's record; a stack that failed to install is returned, not raised."""
    if cell.stack is None:
        return sys.executable, None, None
    try:
        found = (stacks or default_provisioner()).env(cell.stack)
    except StackError as exc:
        return sys.executable, {"name": cell.stack.name, "install": list(requirements(cell.stack, cell.tier.platform)),
                                "error": exc.reason}, exc
    return found.python, found.record(cell.stack), None


def platform_notice(cells: Sequence[Cell]) -> str | None:
    """For cells on a platform this machine lacks: what would run, on which stacks, and why it cannot
    here (None when every cell can run). Said once, before the cells are recorded Not runnable."""
    missing = machine_platforms()  # asked once: it looks for an NVIDIA driver and nvidia-smi
    lacking = [c for c in cells if missing.get(c.tier.platform) is not None]
    if not lacking:
        return None
    platform = lacking[0].tier.platform
    stacks = Counter((c.stack.name, " ".join(requirements(c.stack, platform))) if c.stack else ("no stack", "")
                     for c in lacking)
    lines = [f"kvconform: {len(lacking)} cells run on {platform}, and this machine cannot: "
             f"{missing[platform]}. What they would run:"]
    lines += [f"  {n} cells on {name}" + (f" ({install})" if install else "") for (name, install), n in sorted(stacks.items())]
    lines.append(f"  Each is recorded Not runnable; nothing is attempted. On a {platform} machine, install a stack's "
                 f"{platform} list into the Python that runs kvconform (or nox -s \"stack(NAME)\" -- --tier TIER) "
                 f"and run again: these cells are not counted as finished.")
    return "\n".join(lines)


def default_provisioner(root: Path = DEFAULT_STACKS_DIR, provision: bool = True, platform: str = "cpu",
                        constraints: Path | None = None) -> Provisioner:
    """Venvs under ``root``, with the kvconform that runs here (its checkout, or its installed wheel)."""
    return Provisioner(root, constraints=constraints, provision=provision, platform=platform)


def _run_pytest(cmd: list[str], out: Path, log: Path, timeout_s: float, env: dict[str, str],
                handed: Sequence[AheadHost] = ()) -> tuple[str, str | None]:
    """(output, problem): problem is None when pytest wrote its results (``out``) in time. Its output goes to
    ``log``; at the deadline its whole process group is killed (what it started in it too). The engine
    hosts ``handed`` to it are lent: the caller takes them back. In the runner's own Python it is forked
    from the lane (``lane``: its imports paid once per run), in any other spawned."""
    if cmd[0] == sys.executable and cmd[1:3] == ["-m", "pytest"] and lane.forkable(env):
        code = lane.run_pytest(cmd[3:], env, Path.cwd(), log, timeout_s, handed)
    else:
        handover_env, fds = handover.spawn_with(handed)
        proc = procs.spawn(cmd, log, env={**env, **handover_env}, pass_fds=fds)
        code = proc.returncode if procs.finished_within(proc, timeout_s) else None
        procs.kill_group(proc)
        proc.wait()
    output = log.read_text(errors="replace") if log.exists() else ""  # none: it died before it began
    if code is None:
        return output, f"cell exceeded its {timeout_s:g}s deadline and was killed"
    return output, None if out.exists() else f"pytest exited {code} without writing results"


def _error_document(cell: Cell, problem: str, output: str) -> ResultsDocument:
    return _uniform_document(cell, Status.ERROR, f"{problem}\n--- log tail ---\n{output[-LOG_TAIL_CHARS:]}")


def _uniform_document(cell: Cell, status: Status, message: str) -> ResultsDocument:
    """A result for a cell that ran no test: every clause of its tier gets ``status`` and ``message``."""
    records = [results.TestRecord(nodeid="", clause=c.id, status=status.value, duration_s=0.0, examples=0,
                                  message=message) for c in CLAUSES.values() if c.level == cell.level]
    return results.build(store={"spec": " ".join(cell.args), "target": None, "version": None,
                                "capabilities": []},
                         profile=cell.tier.profile, hypothesis_settings={}, records=records)


def apply_expectations(doc: ResultsDocument, cell: Cell) -> None:
    """Known failures become XFail; a known failure that passed becomes XPass (a stale expectation).

    An intermittent one (may pass, may fail) becomes XFail when it fails and stays Pass otherwise;
    a clause that is also a known failure is judged as the known failure.
    The status the suite gave is kept as ``raw_status``, so the expectations matrix.yaml has *now*
    can be applied again to a kept result (an edited expectation needs no rerun).
    """
    for test in doc["tests"]:
        raw = _raw_status(test)
        test["raw_status"], test["status"] = raw, raw
        if "raw_message" in test:
            test["message"] = test.pop("raw_message")
        test.pop("expected", None)
        maybe = cell.intermittent.get(test["clause"])
        if maybe is not None and raw == Status.FAIL.value and test["clause"] not in cell.expected_failures:
            test["status"], test["expected"] = Status.XFAIL.value, maybe
            continue
        reason = cell.expected_failures.get(test["clause"])
        if reason is None:
            continue
        if raw == Status.FAIL.value:
            test["status"] = Status.XFAIL.value
            test["expected"] = reason
        elif raw == Status.PASS.value:
            test["status"] = Status.XPASS.value
            test["raw_message"] = test.get("message", "")
            test["message"] = f"expected to fail ({reason}) but passed: the expectation is stale"
    doc["summary"] = dict(sorted(Counter(t["status"] for t in doc["tests"]).items()))


def _raw_status(test: TestEntry) -> str:
    """The suite's own verdict. A result written before ``raw_status`` existed is read back from
    what an expectation made of it; an XFail the suite itself gave (an xfail file) stays one."""
    if "raw_status" in test:
        return test["raw_status"]
    if test["status"] == Status.XFAIL.value and "expected" in test:
        return Status.FAIL.value
    if test["status"] == Status.XPASS.value and (test.get("message") or "").endswith("the expectation is stale"):
        return Status.PASS.value
    return test["status"]


def write_excluded(cell: Cell, reason: str, results_dir: Path) -> ResultsDocument:
    """The result of a cell matrix.yaml excludes: every clause Skip with the reason, so it stays in the report."""
    doc = _uniform_document(cell, Status.SKIP, f"excluded by the matrix: {reason}")
    doc["cell"] = _cell_record(cell, None, None, 0.0, ran=False, excluded=reason)
    Path(results_dir).mkdir(parents=True, exist_ok=True)
    results.write(result_path(results_dir, cell), doc)
    return doc


def _summary(doc: ResultsDocument) -> str:
    return ", ".join(f"{n} {s}" for s, n in doc["summary"].items())


_SAY_LOCK = threading.Lock()


def say_line(line: str) -> None:
    """One progress line, whole: ``print`` writes the text and its newline separately, so lines from
    parallel cells ran together."""
    with _SAY_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class ResultsInUse(RuntimeError):
    """Another run is writing to the results directory: a second one there once removed the first's
    warm hosts under it, and the first died."""


@contextlib.contextmanager
def only_run_in(results_dir: Path) -> Iterator[None]:
    """Hold ``results_dir`` for this run (a lock on ``.lock`` in it, let go when the process ends), or
    raise ResultsInUse naming the run that holds it."""
    Path(results_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(results_dir) / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            raise ResultsInUse(f"another kvconform run ({holder}) is writing to {results_dir}: wait for it to end, "
                               "or give this one a directory of its own (--results DIR)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        yield
    finally:
        os.close(fd)


def run_cells(cells: list[Cell], results_dir: Path, *, rerun: bool = False, stacks: Provisioner | None = None,
              jobs: int = 1, say: Callable[[str], None] = say_line) -> list[ResultsDocument]:
    """Run ``cells``, ``jobs`` at a time, skipping those already done; report progress as it goes.
    Raises ResultsInUse while another run writes to ``results_dir``.

    Results come back in ``cells`` order whatever the order they finish in.
    """
    with only_run_in(results_dir):
        return _run_cells(cells, results_dir, rerun, stacks, jobs, say)


def _run_cells(cells: list[Cell], results_dir: Path, rerun: bool, stacks: Provisioner | None, jobs: int,
               say: Callable[[str], None]) -> list[ResultsDocument]:
    if rerun:  # a rerun re-earns everything, the shared engine baselines included
        shutil.rmtree(baselines_dir(results_dir), ignore_errors=True)
    started, stacks = time.monotonic(), stacks or default_provisioner()
    done = {c.id for c in cells if not rerun and is_done(result_path(results_dir, c))}
    platforms = machine_platforms()
    running = [c for c in cells if c.id not in done and platforms.get(c.tier.platform) is None]
    # The stacks that run in this Python: their hosts start now, their imports beside the first cells.
    engine_stacks = {c.stack.name: c.stack for c in running if hosts_for(c) and c.stack is not None}
    here = {name for name, stack in engine_stacks.items() if satisfied_here(requirements(stack, stacks.platform))}
    hosts = WarmHosts(running, Path(results_dir) / ".hosts", jobs,
                      {"": (sys.executable, cell_env(sys.executable, False)),
                       **{name: (sys.executable, cell_env(sys.executable, True)) for name in here}})

    def one(i: int, cell: Cell) -> ResultsDocument:
        path = result_path(results_dir, cell)
        prefix = f"[{i}/{len(cells)}] {cell.id}"
        if cell.id in done:
            doc = json.loads(path.read_text())
            before = doc["summary"]
            apply_expectations(doc, cell)  # matrix.yaml's expectations as they are now
            if doc["summary"] == before:
                say(f"{prefix}: already done, kept")
            else:
                results.write(path, doc)
                say(f"{prefix}: already done, kept (expectations now make it {_summary(doc)})")
            return doc
        say(f"{prefix} ({time.monotonic() - started:.0f}s elapsed): running on tier {cell.tier.name} "
            f"({cell.tier.profile})")
        doc = run_cell(cell, results_dir, stacks, hosts=hosts)
        say(f"{prefix}: {_summary(doc)} ({doc['cell']['wall_s']:.0f}s)")
        return doc

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, range(1, len(cells) + 1), cells))
    finally:
        hosts.close()
