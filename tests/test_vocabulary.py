"""The ground floor's facts are each written once (#56): the level names a closed type every
level-name comparison is checked against, one torch pin, one list of recorded packages."""

from __future__ import annotations

from typing import get_args

from conformance.verdict.clauses import CLAUSES
from conformance.vocabulary import CONNECTOR_LEVELS, LEVELS, Level

from tests.conftest import REPO


def test_the_levels_are_one_closed_type_every_clause_names_one_of() -> None:
    assert LEVELS == get_args(Level) == ("store", "connector", "engine")
    assert set(CONNECTOR_LEVELS) < set(LEVELS)
    assert {c.level for c in CLAUSES.values()} == set(LEVELS)
    # mypy compares each Level with the strings it is compared to: a misspelt level is a lint error
    assert "strict_equality = true" in (REPO / "pyproject.toml").read_text()
