"""Which status a test gets: by level for a failure (a level that reaches the implementation only
through wrappers calls anything but a ClauseViolation the suite's own fault), and for a skip the
status it carries as data (status.skip_as), never one read from its message."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.plugin.verdicts import _status_of
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.forked import call_forked
from conformance.verdict.status import Status, disabled, not_exercised, not_runnable


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


def skipped_with(exc: BaseException) -> tuple[SimpleNamespace, SimpleNamespace]:
    report = SimpleNamespace(when="call", passed=False, failed=False, skipped=True)
    return report, SimpleNamespace(excinfo=SimpleNamespace(value=exc))


def raised(call, *args) -> BaseException:
    with pytest.raises(BaseException) as caught:
        call(*args)
    return caught.value


@pytest.mark.parametrize("end, status", [(not_runnable, Status.NOT_RUNNABLE), (disabled, Status.DISABLED),
                                         (not_exercised, Status.NOT_EXERCISED)])
def test_a_skips_status_is_the_data_it_carries_and_its_words_say_it(end, status):
    exc = raised(end, "no fp8 KV on this CPU")
    assert _status_of(*skipped_with(exc)) is status
    assert str(exc) == f"{status.value}: no fp8 KV on this CPU"  # what JUnit and the report show


def test_words_alone_make_no_status():
    """A skip that only says "Not runnable: " (a connector's own pytest.skip, a clause's plain skip) is a Skip."""
    assert _status_of(*skipped_with(raised(pytest.skip, "Not runnable: said, not carried"))) is Status.SKIP


def test_a_status_comes_back_from_the_forked_child(tmp_path):
    outcome = call_forked(not_runnable, "vLLM declines this platform", name="the clause", deadline_s=30.0,
                          log=tmp_path / "child.log")
    assert _status_of(*skipped_with(raised(outcome.unwrap))) is Status.NOT_RUNNABLE
