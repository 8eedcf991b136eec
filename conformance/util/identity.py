"""What code was tested: the distribution, version and file hashes behind a module.

A verdict is worth only as much as the tie between it and the code it judged. For a module
installed from a wheel that is its distribution, version and the SHA-256 of the wheel's RECORD,
with every file of the module's package checked against RECORD (an installed file edited after
the install is named); for a module in a source tree it is the git commit, whether the module's
directory has uncommitted changes, and a hash of that directory's files.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, TypedDict

from conformance.util import distributions


class Identity(TypedDict, total=False):
    """What code a module was loaded from: a wheel's distribution, version and RECORD (and the files
    edited since), or a source tree's directory hash and git commit; ``problems``: what makes it
    irreproducible."""

    module: str
    problems: list[str]
    distribution: str
    version: str
    record_sha256: str
    modified: list[str]
    source_tree: str
    tree_sha256: str
    git_commit: str | None
    dirty: bool


def identify(module: str) -> Identity:
    """The identity of the code ``module`` is loaded from, without importing it (its parent
    packages are imported to find it). ``problems`` lists what makes it irreproducible."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return {"module": module, "problems": [f"module {module!r} is not importable here: nothing to identify"]}
    origin = Path(spec.origin).resolve()
    installed = _installed(module.split(".", 1)[0], origin)
    return {"module": module, **(installed if installed is not None else _source_tree(origin.parent))}


def reproducibility_problems(identity: Identity | None) -> list[str]:
    """Why the tested code cannot be told apart from other code (empty: it can)."""
    if not identity:
        return ["no identity of the tested code recorded"]
    return list(identity.get("problems") or [])


def _installed(top: str, origin: Path) -> Identity | None:
    """The distribution whose RECORD lists ``origin``; None for code not installed from a wheel
    (an editable install's RECORD lists only its finder)."""
    for name in distributions.providing(top):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        base = Path(str(dist.locate_file(""))).resolve()
        if not origin.is_relative_to(base):
            continue
        listed = {Path(str(f)): f for f in dist.files or []}
        mine = listed.get(origin.relative_to(base))
        if mine is None or mine.hash is None:  # not from this wheel, or an egg-info without hashes
            continue
        record = next((f for f in listed.values() if f.name == "RECORD" and f.parent.name.endswith(".dist-info")),
                      None)
        record_text = (record.read_text() or "") if record is not None else ""
        modified = sorted(str(rel) for rel, f in listed.items()
                          if rel.parent == Path(mine.parent) and f.hash is not None and _differs(base / rel, f.hash))
        problems = [f"{name}: {f} differs from the installed wheel's RECORD (edited after install)" for f in modified]
        return {"distribution": dist.metadata["Name"], "version": dist.version,
                "record_sha256": hashlib.sha256(record_text.encode()).hexdigest(), "modified": modified,
                "problems": problems}
    return None


def _differs(path: Path, recorded: Any) -> bool:
    if recorded.mode != "sha256" or not path.is_file():
        return False
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    return digest != recorded.value


def tree_sha256(directory: Path) -> str:
    """A hash of every file under ``directory`` (their paths and bytes; bytecode caches left out)."""
    tree = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        tree.update(str(path.relative_to(directory)).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return tree.hexdigest()


@functools.cache
def suite_digest() -> str:
    """The hash of this suite's own files as they run now: a result, or a shared baseline, made by
    other code than this is not this code's (the version string alone does not change per commit)."""
    return tree_sha256(Path(__file__).resolve().parents[1])


def _source_tree(directory: Path) -> Identity:
    """A module in a source tree: its git commit and dirty flag, and a hash of its directory."""
    found: Identity = {"source_tree": directory.name, "tree_sha256": tree_sha256(directory)}
    head = _git(directory, "rev-parse", "HEAD")
    if head is None:
        return {**found, "git_commit": None,
                "problems": [f"{directory.name}/ is neither installed from a wheel nor in a git checkout: the tested "
                             "code has no version (build a wheel, or certify from a committed checkout)"]}
    status = _git(directory, "status", "--porcelain", "--untracked-files=all", "--", ".") or ""
    changed = sorted(line.split(maxsplit=1)[-1] for line in status.splitlines() if line.strip())  # 'XY path'
    problems = [f"{directory.name}/ has uncommitted changes ({', '.join(changed[:5])}"
                f"{', ...' if len(changed) > 5 else ''}): the tested code is not commit {head[:12]}"] if changed else []
    return {**found, "git_commit": head, "dirty": bool(changed), "problems": problems}


def _git(directory: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None
