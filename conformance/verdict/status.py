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
from typing import Any, Iterable, NoReturn


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


# The attribute of a skip that carries its status (the verdict reads it, never the message's words).
STATUS_ATTR = "kvconform_status"


def skip_as(status: Status, reason: str) -> NoReturn:
    """End the test with ``status`` (Not runnable, Disabled, Not exercised): a pytest skip (JUnit
    says skipped) whose message opens with the status in words and which carries it as data."""
    import pytest

    exc = pytest.skip.Exception(f"{status.value}: {reason}", allow_module_level=True)
    setattr(exc, STATUS_ATTR, status.value)
    raise exc


class NotRunnable(Exception):
    """The platform, the installed version or the subject's shape cannot run this clause here; the
    message says why. Raised anywhere below a test (a fixture, a helper, a store factory), it ends
    the test as Not runnable: the plugin maps it, as it maps ``HarnessError`` to Error, so nobody
    translates it by hand."""


def not_runnable(reason: str) -> NoReturn:
    """The platform, the installed version or the connector's shape cannot run this clause here."""
    skip_as(Status.NOT_RUNNABLE, reason)


def disabled(reason: str) -> NoReturn:
    """The clause needs a capability the subject does not claim."""
    skip_as(Status.DISABLED, reason)


def not_exercised(reason: str) -> NoReturn:
    """The clause ran but compared nothing."""
    skip_as(Status.NOT_EXERCISED, reason)


def carried(exc: BaseException | None) -> Status | None:
    """The status a skip raised by ``skip_as`` carries (None for any other exception)."""
    value: Any = getattr(exc, STATUS_ATTR, None)
    return Status(value) if value is not None else None


_RED_VALUES = frozenset(s.value for s in Status if s.is_red)
