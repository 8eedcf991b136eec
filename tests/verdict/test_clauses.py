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


# Clauses of the groups about what a load does that are exercised without one, each with why.
EXERCISED_WITHOUT_A_LOAD = {
    "engine_effective_dtype": "it reads the KV dtype vLLM resolved in every connector engine",
    "engine_hma_groups": "it reads the KV cache groups vLLM built in every connector engine",
    "api_pd_format_isolation": "a P/D consumer's load is api_pd_roundtrip's to show; this judges the handover",
    "api_pd_lost_peer": "a P/D consumer's load is api_pd_roundtrip's to show; this judges a lost producer",
}
ABOUT_LOADS = ("loads correctly", "format isolation", "damaged or lost storage")


def test_a_clause_about_what_a_load_does_is_not_exercised_where_nothing_loaded():
    """No vacuous Pass: every connector- or engine-level clause whose group asks what a load does
    compares loaded KV (or a control load of the intact storage) before it can pass."""
    from conformance.verdict.clauses import GROUP_OF

    about_loads = {c.id for c in CLAUSES.values() if c.level != "store" and GROUP_OF[c.id] in ABOUT_LOADS}
    assert {c for c in about_loads if not CLAUSES[c].needs_load} == set(EXERCISED_WITHOUT_A_LOAD)
