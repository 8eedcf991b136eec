"""A fresh runner, for the tests of what a newcomer and each workflow run (#52): a venv made with
``python3 -m venv`` (no system site-packages) holding only what a step installs, and a copy of the
checkout as a clean clone has it. This machine's own packages can then hide no missing step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

FRAMEWORKS = ("pytest", "hypothesis")  # what a bare venv must not have, or it proves nothing


def bare_venv(where: Path, *requirements: str) -> Path:
    """A venv at ``where`` with only ``requirements`` installed (nox and pyyaml: what the README and
    every workflow install first); its bin/ directory."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True)
    bin_dir = where / "bin"
    if requirements:
        subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", *requirements], check=True,
                       capture_output=True, text=True, timeout=900)
    for framework in FRAMEWORKS:
        has = subprocess.run([str(bin_dir / "python"), "-c", f"import {framework}"], capture_output=True)
        assert has.returncode != 0, f"the bare venv has {framework}: it would hide a missing install step"
    return bin_dir


def fresh_clone(dest: Path) -> Path:
    """The checkout's files as a clean clone holds them (tracked and not ignored, this change's
    edits included; no .nox, results or venvs), copied to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        source, target = REPO / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # conformance/data's links to fixtures/, as git checks them out
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)
    return dest


def runner_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a workflow step run from ``bin_dir``'s venv (its bin first on PATH, as
    setup-python puts it), without the variables of the test session that runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "KVCONFORM", "VIRTUAL_ENV", "NOX", "PYTHONPATH"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return {**env, **extra}
