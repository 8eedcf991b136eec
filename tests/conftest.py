"""Helpers for testing the suite itself: run it the way a user does, in a process of its own (forked
from one that imported what every run imports: ``conformance.matrix.lane``)."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pytest

from conformance.levels.engine import handover, separate
from conformance.matrix import lane
from conformance.matrix.hosts import hosts_take_none
from conformance.report.render import clause_statuses

REPO = Path(__file__).resolve().parents[1]
REQUIRE_TOOLS = "KVCONFORM_REQUIRE_SYSTEM_TOOLS"  # the noxfile's test sessions set it


def require_tool(command: str) -> str:
    """The path of a system ``command`` a test needs (constraints/system.txt names its package). A
    missing one fails the test under the README's test command (nox sets REQUIRE_TOOLS) and in CI,
    naming the line that installs it; a bare pytest run skips it, saying the same."""
    found = shutil.which(command)
    if found:
        return found
    lines = (line.split() for line in (REPO / "constraints" / "system.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    package = dict(lines).get(command, command)
    why = f"{command} is not installed: sudo apt-get install -y {package}"
    required = os.environ.get(REQUIRE_TOOLS) or os.environ.get("CI")
    raise pytest.fail.Exception(why) if required else pytest.skip.Exception(why)
@dataclass
class SuiteRun:
    returncode: int
    output: str
    results: dict[str, Any] | None
    results_path: Path

    def statuses(self) -> dict[str, str]:
        assert self.results is not None, self.output[-3000:]
        return clause_statuses(self.results["tests"])

    def failed_clauses(self) -> set[str]:
        return {c for c, s in self.statuses().items() if s == "Fail"}


class _LentHosts:
    """Engine hosts of this test worker, lent to each of its suite runs at the engine level and taken
    back after it (``conformance.levels.engine.handover``), as a matrix run lends them to its cells: a
    host imports vLLM once per worker, not once per run (about 9 s each, 160 runs in the engine session)."""

    def __init__(self) -> None:
        self._hosts: dict[str, list[handover.AheadHost]] = {}
        self._logs = Path(tempfile.mkdtemp(prefix="kvconform-hosts-"))
        atexit.register(self.close)

    def lend(self, args: Sequence[str]) -> list[handover.AheadHost]:
        """The hosts a run of ``args`` borrows: both sides' for an engine-level run that takes hosts, in
        the engine Python it names; none for any other run."""
        if ("--kv-levels=engine" not in args or hosts_take_none(args)) or not hasattr(os, "pidfd_open"):
            return []
        named = [a.split("=", 1)[1] for a in args if a.startswith("--kv-engine-python=")]
        python = named[-1] if named else os.environ.get("KVCONFORM_ENGINE_PYTHON", sys.executable)
        if python not in self._hosts:
            self._hosts[python] = [handover.AheadHost(python, self._logs / f"host-{len(self._hosts)}-{side}.log",
                                                      os.environ) for side in separate.SIDES]
        return self._hosts[python]

    def give_back(self, hosts: Sequence[handover.AheadHost]) -> None:
        if hosts and not all([host.reclaim() for host in hosts]):  # one that cannot serve on: both anew
            for host in hosts:
                host.stop()
            self._hosts.pop(hosts[0].python, None)

    def close(self) -> None:
        for hosts in self._hosts.values():
            for host in hosts:
                host.stop()
        self._hosts.clear()
        shutil.rmtree(self._logs, ignore_errors=True)


_HOSTS = _LentHosts()


def _pytest(args: list[str], env: dict[str, str], log: Path, timeout: float, lend: bool = True) -> int:
    """``python -m pytest ARGS`` in REPO: forked from the preloaded process, or started afresh where
    ``env`` sets what only an interpreter's start reads (PYTHONHASHSEED, PYTHONPATH, ...). A forked
    engine-level run borrows this worker's engine hosts where ``lend`` allows."""
    if not lane.forkable(env):
        with open(log, "w") as out:
            return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=REPO, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout).returncode
    hosts = _HOSTS.lend(args) if lend else []
    try:
        code = lane.run_pytest(args, env, REPO, log, timeout, hosts)
    finally:
        _HOSTS.give_back(hosts)
    if code is None:
        raise subprocess.TimeoutExpired(["pytest", *args], timeout)
    return code


@pytest.fixture
def run_suite(tmp_path: Path):
    """Run ``pytest --pyargs conformance`` against a store; return exit code, output, results."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> SuiteRun:
        n = len(list(tmp_path.iterdir()))
        results, log = tmp_path / f"results-{n}.json", tmp_path / f"output-{n}.txt"
        argv = ["--pyargs", "conformance", "-p", "no:cacheprovider", "-q", f"--kv-results={results}",
                f"--basetemp={tmp_path / 'base'}", *args]
        full_env = {**os.environ, **(env or {})}
        full_env.pop("KVCONFORM_STORE", None) if env is None or "KVCONFORM_STORE" not in env else None
        code = _pytest(argv, full_env, log, timeout, lend=env is None)  # hosts start with this worker's env
        data = json.loads(results.read_text()) if results.exists() else None
        return SuiteRun(code, log.read_text(errors="replace"), data, results)

    return run
