"""The input audit is complete and tied to the code that runs: every clause has rows, every reach is
drawn, not applicable (why) or a gap (what it lets through), and every ``drawn_by`` exists and is
reached from the clause's own test module."""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

from conformance.verdict.audit import AUDIT, FIELDS, Gap, gaps
from conformance.verdict.clauses import CLAUSES

LEVELS = Path(str(importlib.import_module("conformance.levels").__file__)).parent  # imports nothing heavy


def test_every_clause_is_audited():
    assert sorted(AUDIT) == sorted(CLAUSES)
    assert all(AUDIT[cid] for cid in CLAUSES), [cid for cid in CLAUSES if not AUDIT[cid]]


@pytest.mark.parametrize("cid", sorted(CLAUSES))
def test_every_reach_is_drawn_explained_or_a_named_gap(cid):
    for twin in AUDIT[cid]:
        assert twin.field in FIELDS, f"{cid}: field {twin.field!r}; valid: {', '.join(FIELDS)}"
        for name, reach in zip(("early", "late", "slight", "large"), (twin.early, twin.late, twin.slight, twin.large)):
            assert reach is True or (isinstance(reach, str) and len(reach) > 10), \
                f"{cid}/{twin.field}/{name}: {reach!r} is neither drawn nor explained"


@pytest.mark.parametrize("cid", sorted(CLAUSES))
def test_drawn_by_exists_and_the_clause_reaches_it(cid):
    module = _clause_module(cid)
    reachable = _source(module) + "".join(_source(m) for m in _imported(module))
    for twin in AUDIT[cid]:
        path, _, name = twin.drawn_by.partition(":")
        assert name in _top_level_names(path), f"{cid}: {twin.drawn_by} does not exist"
        assert path == module or re.search(rf"\b{re.escape(name)}\b", reachable), \
            f"{cid}: {twin.drawn_by} is not reached from {module} or the modules it imports"


def test_a_gap_is_shown_as_one():
    from conformance.verdict.audit import render

    table = render()
    assert len(gaps()) == table.count("**gap**")
    assert all(isinstance(g, Gap) for *_, g in gaps())


@cache
def _clause_modules() -> dict[str, str]:
    """Clause id -> the test module whose ``@clause`` names it (directly or through a constant)."""
    found: dict[str, str] = {}
    for path in LEVELS.rglob("test_*.py"):
        text = path.read_text()
        module = "conformance." + ".".join(path.relative_to(LEVELS.parent).with_suffix("").parts)
        for cid in CLAUSES:
            if f'"{cid}"' in text and "@clause(" in text:
                found.setdefault(cid, module)
    return found


def _clause_module(cid: str) -> str:
    modules = _clause_modules()
    assert cid in modules, f"{cid}: no test module under conformance/levels names it"
    return modules[cid]


def _path(module: str) -> Path:
    """A conformance module's file, found without importing it (the levels' modules import vLLM)."""
    base = LEVELS.parent.parent.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


@cache
def _source(module: str) -> str:
    return _path(module).read_text()


def _top_level_names(module: str) -> set[str]:
    names = set()
    for node in ast.parse(_source(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _imported(module: str) -> list[str]:
    """The conformance modules ``module`` imports (``from conformance.x import y`` names x, and x.y
    where that is a module)."""
    out = []
    for node in ast.walk(ast.parse(_source(module))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("conformance"):
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("conformance")]
    return out


def _is_module(name: str) -> bool:
    return _path(name).is_file()
