"""How a kvconform test's outcome becomes a verdict on the status lattice, and the record of
them all: the terminal summary and the results file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pytest

from conformance.plugin import options
from conformance.plugin.fixtures import connector_choice
from conformance.plugin.options import ENGINE_EVIDENCE, ENGINE_TIMINGS, ENGINE_VERSIONS, GEOMETRY, session_state
from conformance.vocabulary import CONNECTOR_LEVELS, Level

if TYPE_CHECKING:
    from conformance.util.identity import Identity


@pytest.fixture(autouse=True)
def _kvconform_clause_gate(request: pytest.FixtureRequest) -> Iterator[None]:
    """Marks the clause test as running (its examples are counted, its violations name its clause);
    a clause the store cannot claim is Disabled (a skip with that reason), never a Fail."""
    from conformance.verdict.clauses import clause_of, disabled_reason, end_test, start_test
    from conformance.verdict.status import disabled

    c = clause_of(request.node)
    if c is None:
        yield
        return
    token = start_test(request.node.nodeid, c.id)
    try:
        if c.level == "store":
            caps = request.getfixturevalue("kv_capabilities")
            request.node.user_properties.append(("kvconform.capabilities", ",".join(sorted(caps))))
            reason = disabled_reason(c, caps, session_state(request.config).choice.target)
        else:
            connector = connector_choice(request.config)
            reason = disabled_reason(c, connector.applies, connector.label)
            if reason and c.requires - connector.applies:  # a capability left out, not a lossy declaration
                reason += f" (declare it with {options.CAPABILITIES} if it does)"
        if reason:
            disabled(reason)
        yield
    finally:
        end_test(token)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """After a clause ran: where a server the suite supplied for its connector (LMCache's, started in
    the user's place) logged an error while serving, up to now, the clause is an Error naming the
    line, whatever it came to itself (a Pass, a Fail, Not exercised: each may rest on a server that
    stored nothing). Up to now: an engine cell's runs are shared by its clauses, so every clause
    after the error is one too. A user's own server is never read."""
    from conformance.verdict.clauses import clause_of
    from conformance.verdict.guard import HarnessError

    ended: BaseException | None = None
    try:
        result = yield
    except (KeyboardInterrupt, SystemExit, pytest.exit.Exception):
        raise
    except BaseException as exc:  # noqa: BLE001 (a skip too: the server's error comes first)
        ended = exc
    error = _supplied_server_error(item) if clause_of(item) is not None else None
    if error is not None:  # raised apart from the clause's own ending: no status of its is read from the chain
        raise HarnessError(error + (f" (The clause itself ended: {type(ended).__name__}: {str(ended)[:300]})"
                                    if ended is not None else ""))
    if ended is not None:
        raise ended
    return result


def _supplied_server_error(item: pytest.Item) -> str | None:
    """Why no verdict holds, from the servers the suite supplied for the item's engine cell or
    connector harness (None: none supplied, or none logged an error while serving)."""
    funcargs = getattr(item, "funcargs", {})
    cell, harness = funcargs.get("engine_cell"), funcargs.get("connector_api")
    supplied = getattr(getattr(cell, "worlds", None), "supplied_error", None) if cell is not None \
        else getattr(harness, "supplied_error", None)
    return supplied() if supplied is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    from hypothesis.errors import FailedHealthCheck

    from conformance.verdict.asserts import ClauseViolation
    from conformance.verdict.clauses import clause_of, running
    from conformance.verdict.guard import HarnessError
    from conformance.verdict.status import Status

    report = yield
    c = clause_of(item)
    status = _status_of(report, call, c.level) if c is not None else None
    test = running()
    if test is not None and test.nodeid != item.nodeid:
        test = None  # set until the test's fixtures are torn down
    if status is Status.NOT_RUNNABLE and report.failed:
        _not_runnable(report, item, call)
    elif status is Status.ERROR and test is not None and test.declined and _found(call.excinfo, FailedHealthCheck):
        status = _declined_most(report, item, test.declined, connector_choice(item.config))
    elif status is Status.PASS and c is not None and c.needs_load and test is not None and not test.loaded:
        status = _not_exercised(report, item, c.id, _loaded_nothing(item.config, test.longest_asked))
    elif status is Status.PASS and test is not None and test.within and not test.coded:
        status = _not_exercised(report, item, c.id if c else item.name, (
            f"but every one of the {test.within} loaded token rows it compared (layer by layer) was byte for byte what "
            "was stored: the lossy codec the connector declares was in no load's path (a memory tier served "
            "them?), so its tolerance was never tried"))
    if c is not None and status is not None:
        report.user_properties.append(("kvconform.clause", c.id))
        report.user_properties.append(("kvconform.status", status.value))
        if test is not None:
            report.user_properties.append(("kvconform.examples", test.examples))
            if test.passes:  # the connector level's per-request outcomes (JSON: xdist carries strings)
                report.user_properties.append(("kvconform.evidence", json.dumps(test.passes)))
        kind = HarnessError if status is Status.ERROR else ClauseViolation
        violations = _found(call.excinfo, kind) if report.when == "call" else []
        if violations:
            # Hypothesis may raise a group of distinct failures: name every clause message.
            report.user_properties.append(("kvconform.message", "\n".join(dict.fromkeys(map(str, violations)))))
        elif status is Status.PASS and test is not None and test.observed:  # what the workload did
            report.user_properties.append(("kvconform.message", test.observed))
    return report


def _not_runnable(report: pytest.TestReport, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """A test ended by ``NotRunnable`` (in a fixture or the test): reported as a skip (JUnit too)
    that says Not runnable and why, as ``status.not_runnable`` would have."""
    from conformance.verdict.status import NotRunnable, Status

    why = "; ".join(dict.fromkeys(map(str, _found(call.excinfo, NotRunnable))))
    report.outcome = "skipped"
    report.longrepr = (str(item.path), (item.location[1] or 0) + 1, f"{Status.NOT_RUNNABLE.value}: {why}")


def _loaded_nothing(config: pytest.Config, longest_asked: int) -> str:
    """Why a clause that compares loaded KV compared nothing, with the advice what the run saw supports."""
    from conformance.levels.advice import advised, settle_advice, span_advice

    connector = connector_choice(config)
    return ("without comparing anything: the connector loaded no KV in any of its runs (it declined every lookup), "
            "so no loaded byte was checked" + advised(span_advice(connector, longest_asked), settle_advice(connector)))


def _declined_most(report: pytest.TestReport, item: pytest.Item, declined: str, connector: Any) -> Any:
    """Hypothesis gave up drawing because the connector, once built in this process, declined most drawn
    configurations: Not runnable as declared, with what it said and what would let it be judged."""
    from conformance.levels.advice import advised, geometry_advice
    from conformance.verdict.status import Status

    report.outcome = "skipped"
    report.longrepr = (str(item.path), (item.location[1] or 0) + 1, (
        f"{Status.NOT_RUNNABLE.value}: the connector declined most drawn examples' configurations after a pair of "
        f"another was built in the same process (the first: {declined}), so too few could be drawn"
        + advised(geometry_advice(connector))))
    return Status.NOT_RUNNABLE


def _not_exercised(report: pytest.TestReport, item: pytest.Item, clause_id: str, why: str) -> Any:
    """A pass that never tried what it promises (``why``): reported as a skip (JUnit too) with the
    Not exercised status, never as a Pass."""
    from conformance.verdict.status import Status

    report.outcome = "skipped"
    report.longrepr = (str(item.path), (item.location[1] or 0) + 1, f"{Status.NOT_EXERCISED.value}: {clause_id} passed {why}")
    return Status.NOT_EXERCISED


# Levels whose tests call the implementation only through wrappers that turn its faults into a
# ClauseViolation (the connector level's hooks; the engine level's engines, judged by _vetted):
# anything else that fails there is the suite's own fault, an Error (an LMCache server of the
# suite's answering its health check in ZMQ's bytes was once a connector's Fail).
STRICT_FAIL_LEVELS: tuple[Level, ...] = CONNECTOR_LEVELS


def _status_of(report: pytest.TestReport, call: pytest.CallInfo[None], level: Level = "store") -> Any:
    """The lattice status decided by this phase's report, or None when the phase decides nothing."""
    from conformance.verdict.asserts import ClauseViolation
    from conformance.verdict.guard import HarnessError
    from conformance.verdict.status import NotRunnable, Status, carried

    if report.failed and _found(call.excinfo, NotRunnable):  # in the test or a fixture: never the clause's
        return Status.NOT_RUNNABLE
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return Status.XFAIL if report.skipped else Status.XPASS
        if report.passed:
            return Status.PASS
        if report.failed:
            if _found(call.excinfo, HarnessError):
                return Status.ERROR
            if level in STRICT_FAIL_LEVELS and not _found(call.excinfo, ClauseViolation):
                return Status.ERROR
            return Status.FAIL
    if report.skipped:  # the status a skip carries (status.skip_as), never read from its words
        return carried(call.excinfo.value if call.excinfo else None) or Status.SKIP
    if report.failed:  # setup or teardown: the harness, not the clause
        return Status.ERROR
    return None


def _found(excinfo: Any, kind: type[BaseException]) -> list[BaseException]:
    """Every ``kind`` in the raised exception, its causes, and its group members."""
    if excinfo is None:
        return []
    seen: set[int] = set()
    found: list[BaseException] = []
    todo: list[BaseException] = [excinfo.value]
    while todo:
        exc = todo.pop(0)
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, kind):
            found.append(exc)
        todo.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
        todo.extend(getattr(exc, "exceptions", ()))
    return found


def _message(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    crash = getattr(report.longrepr, "reprcrash", None)
    return crash.message if crash is not None else str(report.longrepr or "")[-2000:]


class Recorder:
    """Collects verdicts where reports arrive (the controller, under pytest-xdist)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[Any] = []
        self.capabilities: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if props.get("kvconform.capabilities"):
            self.capabilities.update(props["kvconform.capabilities"].split(","))
        if "kvconform.status" not in props:
            return
        from conformance.verdict.results import TestRecord

        self.records.append(TestRecord(
            nodeid=report.nodeid, clause=props["kvconform.clause"], status=props["kvconform.status"],
            duration_s=round(report.duration, 4), examples=int(props.get("kvconform.examples", 0)),
            evidence=json.loads(props["kvconform.evidence"]) if props.get("kvconform.evidence") else None,
            message=props.get("kvconform.message")
            or (_message(report).removeprefix("Skipped: ") if (report.failed or report.skipped) else "")))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.records:
            return
        from collections import Counter

        from conformance.verdict.status import is_red

        counts = Counter(r.status for r in self.records)
        terminalreporter.write_sep("-", "kvconform verdicts")
        terminalreporter.write_line("kvconform: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        for r in self.records:
            if is_red(r.status):
                first = r.message.splitlines()[0] if r.message else ""
                terminalreporter.write_line(f"  {r.status} {r.clause}: {first}")
        path = self.config.getoption(options.RESULTS)
        if path:
            self._write(Path(path))
            terminalreporter.write_line(f"kvconform: results written to {path}")

    def _write(self, path: Path) -> None:
        from hypothesis import settings

        from conformance.util.identity import identify
        from conformance.verdict import profiles, results

        state = session_state(self.config)
        current = settings.default
        choice = state.choice
        opt = self.config.getoption
        connector = None
        if state.connector_spec:
            connector = {"spec": state.connector_spec, "role": opt(options.ROLE),
                         "identity": _connector_identity(state.connector_spec),
                         "capabilities": sorted(state.connector.capabilities) if state.connector else [],
                         "lossy_tolerance": state.connector.lossy_tolerance if state.connector else None,
                         "capacity_bytes": state.connector.capacity_bytes if state.connector else None,
                         # what the suite started in the user's place (LMCache's server, bounded by capacity)
                         "supplied": _supplied(state.connector) if state.connector else [],
                         "extra_config": json.loads(opt(options.EXTRA_CONFIG) or "{}"),
                         # the KVTransferConfig fields it ran with besides (--kv-transfer-config)
                         "transfer_config": dict(state.connector.transfer_fields) if state.connector else {},
                         # what its engines ran with (--kv-engine-env): names, and only safe values
                         "engine_env": results.recorded_env(dict(state.connector.engine_env) if state.connector else {}),
                         "kv_cache_dtype": opt(options.CACHE_DTYPE),
                         "model": opt(options.MODEL), "block_size": opt(options.BLOCK_SIZE),
                         # one-geometry: the one geometry it was shown (None: every one the level draws)
                         "geometry": self.config.stash.get(GEOMETRY, None),
                         "other_model": opt(options.OTHER_MODEL),  # the user's second checkpoint, if any
                         "engine_timings": self.config.stash.get(ENGINE_TIMINGS, None),
                         "engine_versions": self.config.stash.get(ENGINE_VERSIONS, None),
                         # per engine role: its log's copy beside the results, what each request came to
                         "engine_evidence": self.config.stash.get(ENGINE_EVIDENCE, None)}
        results.write(path, results.build(
            store={"spec": state.store_spec, "target": choice.target if choice else None,
                   "version": choice.distribution_version if choice else None,
                   "identity": identify(choice.target.split(":", 1)[0]) if choice else None,
                   "capabilities": sorted(self.capabilities)},
            connector=connector,
            profile=state.profile,
            kv_cache_dtypes=state.kv_cache_dtypes,
            hypothesis_settings=profiles.recorded(current),
            records=self.records))


def _connector_identity(spec: str) -> Identity:
    """What code the connector ``spec`` is: its module's, or for a registry name the module vLLM's
    factory imports for it (vLLM itself when vLLM is not loaded in this process: the engine level)."""
    import sys

    from conformance.util.identity import identify

    module, _, name = spec.rpartition(":")
    if not module and "vllm" in sys.modules:
        from conformance.api_surface.runtime import registered_module

        module = registered_module(name) or ""
    return identify(module or "vllm")


def _supplied(connector: Any) -> list[str]:
    """What the suite supplies for ``connector`` instead of the user (its servers, its transfer
    worker), in words."""
    from conformance.levels.services import LMCacheService
    from conformance.levels.subject import offloading_worker

    return ([LMCacheService.describe(connector)] if LMCacheService.wanted_by(connector) else []) + [
        said for child in [connector.extra_config, *connector.children] if (said := offloading_worker(child))]
