"""The README's commands and the workflows' fresh-runner steps, run as a newcomer and a fresh
GitHub runner run them (#52): from a bare venv with only nox and pyyaml, never this machine's
Python. release.yml's build-and-check (`nox -s dist`) runs from such a venv in .ci/run, and
gate.yml's install and gate steps in tests/matrix/test_gate.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.fresh import bare_venv, fresh_clone, runner_env

MATRIX_WORKFLOW = REPO / ".github" / "workflows" / "matrix.yml"
README_COMMANDS = REPO / "scripts" / "readme_commands.py"


def readme_command(name: str) -> str:
    return subprocess.run([sys.executable, str(README_COMMANDS), name], check=True, capture_output=True,
                          text=True).stdout.strip()


def workflow_steps(job: str) -> list[dict]:
    return yaml.safe_load(MATRIX_WORKFLOW.read_text())["jobs"][job]["steps"]


def run_step(script: str, cwd: Path, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    """A workflow's ``run:`` script under bash, as GitHub runs it (``inputs.tier`` is blank: quick)."""
    script = script.replace("${{ inputs.tier || 'quick' }}", "quick")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory) -> Path:
    """The bin/ of a bare venv with what the README's commands and the workflows install first."""
    return bare_venv(tmp_path_factory.mktemp("newcomer") / "venv", "nox", "pyyaml")


def test_the_readme_commands_make_a_bare_venv_and_install_only_nox_and_pyyaml():
    for name in ("main", "tests"):
        command = readme_command(name)
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install nox pyyaml && .venv/bin/python -m nox -s ")
    assert readme_command("main").endswith("-s quick")
    assert readme_command("tests").endswith("-s lint tests engine")


def test_nox_lists_its_sessions_in_a_bare_venv(newcomer):
    proc = subprocess.run([str(newcomer / "python"), "-m", "nox", "-l"], cwd=REPO, capture_output=True, text=True,
                          env=runner_env(newcomer), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for session in ("quick", "lint", "tests", "engine", "report", "dist"):
        assert re.search(rf"^[*-] {session}( \[\w+\])? -> ", proc.stdout, re.M), proc.stdout


def test_the_matrix_workflows_plan_job_runs_in_a_bare_venv(newcomer, tmp_path):
    """matrix.yml's plan job: its install step, then its plan step, which writes the jobs."""
    output = tmp_path / "github_output"
    for step in workflow_steps("plan"):
        if "run" in step:
            proc = run_step(step["run"], REPO, runner_env(newcomer, GITHUB_OUTPUT=str(output)), timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = json.loads(output.read_text().removeprefix("jobs="))
    assert jobs and all({"id", "stack", "cells"} <= set(job) for job in jobs), jobs


FRAMEWORK_BLOCK = ("import sys, runpy\n"
                   "for name in ('pytest', '_pytest', 'hypothesis'): sys.modules[name] = None\n"
                   "sys.argv = ['kvconform', *sys.argv[1:]]\n"
                   "runpy.run_module('conformance.cli', run_name='__main__')\n")


@pytest.mark.parametrize("args, code", [
    (["plan", "--tier", "quick"], 0),
    (["clauses"], 0),
    (["diff", "{results}", "{results}"], 0),
    (["report", "{results}"], 0),
    (["verify", "{missing}"], 1),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_kvconform_commands_that_run_no_tests_import_no_test_framework(tmp_path, args, code):
    """plan, diff, report and verify work where pytest and Hypothesis cannot be imported."""
    from tests.report.test_report import write_cell

    results = tmp_path / "results"
    write_cell(results, "store(a)", {"byte_exact_roundtrip": "Fail"})
    args = [a.format(results=results, missing=tmp_path / "no-bundle") for a in args]
    proc = subprocess.run([sys.executable, "-c", FRAMEWORK_BLOCK, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "No module named" not in proc.stderr and "halted; None in sys.modules" not in proc.stderr, proc.stderr


@pytest.mark.engine
def test_the_main_job_and_the_matrix_workflows_cell_and_report_jobs_on_a_fresh_clone(newcomer, tmp_path):
    """A fresh clone: the README's main command (its quick tier cut to one cell by nox's posargs)
    makes results/quick/report; then matrix.yml's cell job (one quick-tier job, `nox -s stack(...)`)
    and report job (`nox -s report`), each from the bare venv, as a fresh runner runs them."""
    clone = fresh_clone(tmp_path / "clone")
    env = runner_env(newcomer)
    main = readme_command("main").split(" && ")[-1]  # the venv is the fixture's, made the same way
    main = main.replace(".venv/bin/python", str(newcomer / "python"))
    proc = run_step(f"{main} -- --cell memory", clone, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (clone / "results" / "quick" / "report" / "index.html").is_file(), proc.stdout[-3000:]
    # The cell job restores .nox from its actions/cache: here the stack venv the main job just made.
    (clone / ".nox" / "stack-default").symlink_to(clone / ".nox" / "quick")
    (cell_step,) = [s for s in workflow_steps("cell") if s.get("name") == "run the job's cells"]
    script = cell_step["run"].replace("${{ matrix.job.stack }}", "default")
    proc = run_step(script, clone, {**env, "CELLS": "file"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report_step,) = [s for s in workflow_steps("report") if "nox -s report" in s.get("run", "")]
    proc = run_step(report_step["run"], clone, {**env, **report_step.get("env", {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    matrix = json.loads((clone / "results" / "quick" / "report" / "matrix.json").read_text())
    assert {"memory", "file"} <= {cell["name"] for cell in matrix["cells"]}, matrix["cells"]


def test_the_test_sessions_stop_at_once_naming_the_apt_line_when_a_system_tool_is_missing(monkeypatch, tmp_path):
    """constraints/system.txt's tools missing: the noxfile's check stops the session with the one line
    that installs them, before anything is installed or run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kv_noxfile", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    assert set(noxfile.system_tools()) == {"chromium", "redis-server", "ssh-keygen", "git"}

    class Session:
        def error(self, message: str):
            raise SystemExit(message)

    monkeypatch.setenv("PATH", str(tmp_path))  # a machine with none of them
    with pytest.raises(SystemExit, match=r"sudo apt-get install -y chromium git openssh-client redis-server$"):
        noxfile._require_system_tools(Session())


def test_a_test_missing_a_system_tool_fails_under_the_readme_command_and_skips_only_in_a_bare_pytest(monkeypatch, tmp_path):
    from tests.conftest import REQUIRE_TOOLS, require_tool

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv(REQUIRE_TOOLS, "1")
    with pytest.raises(pytest.fail.Exception, match=r"redis-server is not installed: sudo apt-get install -y redis-server"):
        require_tool("redis-server")
    monkeypatch.delenv(REQUIRE_TOOLS)
    with pytest.raises(pytest.skip.Exception, match=r"sudo apt-get install -y openssh-client"):
        require_tool("ssh-keygen")
