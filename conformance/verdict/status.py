"""One status lattice for every level, every tier and every report.

Error is kept apart from Fail, as in the OCI distribution-spec conformance: Fail means the
connector broke a clause; Error means the suite could not reach a verdict (a hang, a crash,
an install or infrastructure fault). Aggregation takes the most severe status.

Not exercised sits above Pass: a clause that ran but compared nothing (a connector that loaded
nothing, so no loaded byte was checked) is not a pass, and a cell with one shows it. It is not
red either (the connector broke nothing the run could see); certification and the PR gate treat
it as not passed.
"""

from __future__ import annotations

import enum
from typing import Iterable


class Status(str, enum.Enum):
    # Declared from least to most severe: aggregation takes the maximum.
    DISABLED = "Disabled"  # the clause needs a capability the connector does not claim
    SKIP = "Skip"
    NOT_RUNNABLE = "Not runnable"  # the platform or installed version cannot run it
    PASS = "Pass"
    NOT_EXERCISED = "Not exercised"  # it ran, but compared nothing (the connector loaded nothing)
    XFAIL = "XFail"  # a known failure, expected by the matrix's expectations
    XPASS = "XPass"  # a known failure that passed: the expectation is stale
    FAIL = "Fail"
    ERROR = "Error"

    @property
    def severity(self) -> int:
        return list(Status).index(self)

    @property
    def is_red(self) -> bool:
        """Fails a run and its gates: a broken clause, no verdict, or a stale expectation."""
        return self in (Status.FAIL, Status.ERROR, Status.XPASS)


def is_red(value: str) -> bool:
    """``Status(value).is_red`` for a status as results files write it (anything else is not red)."""
    return value in _RED_VALUES


def worst(statuses: Iterable[Status]) -> Status | None:
    return max(statuses, key=lambda s: s.severity, default=None)


DISABLED_PREFIX = "Disabled: "
NOT_RUNNABLE_PREFIX = "Not runnable: "
NOT_EXERCISED_PREFIX = "Not exercised: "


_RED_VALUES = frozenset(s.value for s in Status if s.is_red)
