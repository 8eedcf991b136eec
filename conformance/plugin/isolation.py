"""Connector-level clause tests run in a child process their harness supervises.

A connector's hooks run native code; one that dies (a segfault, ``os._exit``, the OOM killer)
would otherwise end the pytest process, and with it every later verdict and the results file.
Here a test's whole body (all its Hypothesis examples, so their draws stay in one process) runs
in a forked child (``ConnectorHarness.isolated``); the examples it ran and the KV it loaded come
back with its outcome, for the verdict (``plugin/verdicts.py``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import pytest

COUNTS = "_kvconform_counts"  # what the child's RunningTest counted (its fields), carried on a raised exception too


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    from conformance.verdict.clauses import clause_of, running

    c = clause_of(pyfuncitem)
    harness = pyfuncitem.funcargs.get("connector_api")
    if c is None or c.level != "connector" or harness is None:
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    test = running()
    try:
        counts = harness.isolated(_counted, pyfuncitem.obj, kwargs, name=pyfuncitem.name)
    except BaseException as exc:
        counts = getattr(exc, COUNTS, None)
        raise
    finally:
        if test is not None and counts:
            for name, value in counts.items():
                setattr(test, name, value)
    return True


def _counted(test: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """In the child: run the test; what it counted goes back with what it returns or raises."""
    from conformance.verdict.clauses import running

    def counts() -> dict[str, Any]:
        now = running()
        return {name: value for name, value in vars(now).items() if name not in ("nodeid", "clause")} \
            if now is not None else {}

    _log_errors_as_deployed()
    try:
        test(**kwargs)
    except BaseException as exc:
        exc.__dict__[COUNTS] = counts()
        raise
    return counts()


def _log_errors_as_deployed() -> None:
    """In the child: a malformed log call of the connector's ("%d" given None) prints Python's
    "--- Logging error ---" and goes on, as in the engine it runs in; pytest's capture handler would
    raise it inside the connector's hook, a failure no deployment has."""
    import logging

    for handler in logging.getLogger().handlers:
        if type(handler).__name__ == "LogCaptureHandler":
            handler.handleError = functools.partial(logging.Handler.handleError, handler)  # type: ignore[method-assign]

