"""Which status a failed test gets, by level: a level that reaches the implementation only through
wrappers calls anything but a ClauseViolation the suite's own fault."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.plugin.verdicts import _status_of
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.status import Status


def failed_with(exc: BaseException) -> tuple[SimpleNamespace, SimpleNamespace]:
    report = SimpleNamespace(when="call", passed=False, failed=True, skipped=False)
    return report, SimpleNamespace(excinfo=SimpleNamespace(value=exc))


@pytest.mark.parametrize("level, exc, status", [
    ("engine", ClauseViolation("engine_store_then_load", "engine B differs"), Status.FAIL),
    # The suite's LMCache server answering its health check in ZMQ's bytes: never the connector's Fail.
    ("engine", OSError("http.client.BadStatusLine: \\xff"), Status.ERROR),
    ("connector", KeyError("slot"), Status.ERROR),
    ("store", AssertionError("bytes differ"), Status.FAIL),  # a store's own methods raise into its clauses
])
def test_only_a_clause_violation_is_a_fail_where_the_implementation_is_reached_through_wrappers(level, exc, status):
    assert _status_of(*failed_with(exc), level=level) is status
