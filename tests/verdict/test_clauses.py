"""Clauses are data: every clause has exactly one test, and the README explains each one."""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter

import pytest

import conformance.levels
from conformance.verdict.clauses import CLAUSE_MARK, CLAUSES, clause

from tests.conftest import REPO


def tagged_tests() -> Counter[str]:
    found: Counter[str] = Counter()
    for info in pkgutil.walk_packages(conformance.levels.__path__, "conformance.levels."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("test_"):
                for mark in getattr(obj, "pytestmark", []):
                    if mark.name == CLAUSE_MARK:
                        found[mark.args[0]] += 1
    return found


def test_every_clause_has_exactly_one_test():
    assert tagged_tests() == Counter({c: 1 for c in CLAUSES})


def test_readme_explains_every_clause():
    readme = (REPO / "README.md").read_text()
    missing = [c for c in CLAUSES if f"`{c}`" not in readme]
    assert not missing, f"README.md does not explain: {missing}"


def test_unknown_clause_id_is_rejected():
    with pytest.raises(ValueError, match="clause 'byte_exact' is unknown; valid: byte_exact_roundtrip"):
        clause("byte_exact")
