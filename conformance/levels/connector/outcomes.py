"""How a connector-level example ends in a verdict: the connector's own exceptions are its Fail, a
layout it declines is rejected, a connector that cannot be built here is Not runnable (and one
that was built here before, but refuses this example's configuration, declines the example)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from hypothesis import reject

from conformance.levels.connector.pair import built_here
from conformance.levels.connector.runs import (
    ConnectorRaised,
    LayoutRefused,
    NegativeClaim,
    NotBuilt,
    NotJudged,
    OverClaim,
    PhantomHit,
    Run,
)
from conformance.levels.diagnosis import cannot_run_here, missing_dependency, refuses_platform
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import note_declined
from conformance.verdict.guard import HarnessError
from conformance.verdict.status import not_runnable


@contextmanager
def connector_faults_fail(clause_id: str, context: str = "",
                          declined: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """An exception from the connector's own hooks is the connector's failure (Fail), with its
    words; ``context`` says what the scenario was doing. ``declined`` are passed through to the
    caller (a probe that tries the next layout) instead of rejecting the example."""
    try:
        yield
    except declined:
        raise
    except LayoutRefused:
        reject()  # a layout this connector declines up front is not one vLLM would give it
    except NotJudged as exc:
        not_runnable(f"{exc}")
    except (PhantomHit, NegativeClaim) as exc:
        raise ClauseViolation(clause_id, f"{context}{exc}") from exc
    except NotBuilt as exc:
        _raise_if_missing_dependency(exc)
        if built_here():  # built here before: it declines this example's configuration (a block size)
            note_declined(str(exc))
            reject()
        not_runnable(f"{cannot_run_here('the connector', str(exc))}")
    except ConnectorRaised as exc:
        _raise_if_missing_dependency(exc)
        if isinstance(exc.exc, OverClaim):  # raised by the harness inside vLLM's scheduler: a claim, not a crash
            raise ClauseViolation(clause_id, f"{context}{exc.exc}") from exc
        if refuses_platform(str(exc)):  # its data path asked for a device this machine (or process) lacks
            not_runnable(f"the connector needs a device this machine lacks: it raised in {exc}")
        raise ClauseViolation(clause_id, f"{context}the connector raised in {exc}") from exc


def _raise_if_missing_dependency(exc: ConnectorRaised) -> None:
    """A connector whose own dependency is not installed here is the run's Error, never its Fail."""
    said = missing_dependency("the connector", f"{type(exc.exc).__name__}: {exc.exc}")
    if said is not None:
        raise HarnessError(said) from exc


def where(run: Run, what: str) -> str:
    """The run's coordinates, for a message: what happened, dtype, layout, block size."""
    return f"[{what}; kv_cache_dtype={run.kv_cache_dtype}, layout={run.layout}, block_size={run.block_size}]"
