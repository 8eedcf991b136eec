"""The kvconform pytest plugin (entry point ``pytest11``).

It loads in every pytest session of an environment where kvconform is installed, so it stays
inert unless asked: options are only added, Hypothesis profiles are only loaded and the store
is only resolved when ``--kv-store``/``KVCONFORM_STORE`` or ``--kv-profile`` is given, or when
a kvconform clause is collected.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

KV_STORE_OPTION = "--kv-store"
KV_PROFILE_OPTION = "--kv-profile"
KV_TIMEOUT_OPTION = "--kv-timeout"
KV_RESULTS_OPTION = "--kv-results"
KV_DTYPES_OPTION = "--kv-cache-dtypes"
KV_CONNECTOR_OPTION = "--kv-connector"
KV_TIERS_OPTION = "--kv-tiers"
TIERS = ("store", "connector", "engine")
_STATE = "_kvconform_state"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvconform", "kvconform: KV-cache connector conformance")
    group.addoption(KV_STORE_OPTION, default=None, metavar="STORE",
                    help="store under test: 'module:factory' or a name registered in the "
                         "'kvconform.stores' entry-point group (default: $KVCONFORM_STORE)")
    group.addoption(KV_PROFILE_OPTION, default=None, choices=["dev", "ci", "deep", "certify"],
                    help="Hypothesis profile (default: ci when $CI is set, else dev)")
    group.addoption(KV_TIMEOUT_OPTION, type=float, default=60.0, metavar="SECONDS",
                    help="a store call that takes longer is an Error (default: 60)")
    group.addoption(KV_DTYPES_OPTION, default=None, metavar="LIST",
                    help="comma-separated kv_cache_dtype strings to draw specs from, e.g. "
                         "'fp8,fp8_e4m3,fp8_e5m2' (default: every string vLLM knows)")
    engine = parser.getgroup("kvconform-engine", "kvconform: the engine tier (a real vLLM)")
    engine.addoption(KV_CONNECTOR_OPTION, default=None, metavar="CONNECTOR",
                     help="connector under test, as vLLM chooses it: a registry name (ExampleConnector, "
                          "LMCacheMPConnector) or 'package.module:ClassName' (default: $KVCONFORM_CONNECTOR)")
    engine.addoption("--kv-connector-extra-config", default=None, metavar="JSON",
                     help="kv_connector_extra_config as JSON")
    engine.addoption("--kv-role", default="kv_both", choices=["kv_both", "kv_producer", "kv_consumer"])
    engine.addoption("--kv-cache-dtype", default="auto", metavar="DTYPE", help="the engines' kv_cache_dtype")
    engine.addoption("--model", default="qwen3-tiny", metavar="PROFILE|PATH",
                     help="a profile of fixtures/models (generated locally) or a model directory")
    engine.addoption("--kv-block-size", type=int, default=32, help="block size (a multiple of 32 on CPU)")
    engine.addoption("--kv-engine-python", default=os.environ.get("KVCONFORM_ENGINE_PYTHON"), metavar="PYTHON",
                     help="the Python with vLLM installed that runs engines (default: "
                          "$KVCONFORM_ENGINE_PYTHON, else this one)")
    engine.addoption("--kv-engine-timeout", type=float, default=420.0, metavar="SECONDS",
                     help="an engine that takes longer is killed and its scenarios are Error")
    engine.addoption("--kv-engine-baselines", default=None, metavar="DIR",
                     help="share no-connector baseline runs through DIR across cells (a matrix run passes "
                          "its results' baselines/); default: every cell starts its own")
    group.addoption(KV_TIERS_OPTION, default=None, metavar="LIST",
                    help="comma-separated tiers to run among store, connector (the connector-API tier) and "
                         "engine (default: every tier whose implementation is chosen)")
    group.addoption(KV_RESULTS_OPTION, default=None, metavar="PATH",
                    help="write the results JSON (schema kvconform.results/1) to PATH")


class _State:
    """Per-session plugin state (kept on the config, never in module globals)."""

    def __init__(self, config: pytest.Config) -> None:
        self.store_spec: str | None = config.getoption(KV_STORE_OPTION) or os.environ.get("KVCONFORM_STORE")
        explicit_profile = config.getoption(KV_PROFILE_OPTION)
        self.connector_spec: str | None = (config.getoption(KV_CONNECTOR_OPTION)
                                           or os.environ.get("KVCONFORM_CONNECTOR"))
        self.active = bool(self.store_spec or explicit_profile or self.connector_spec)
        self.profile: str = explicit_profile or ("ci" if os.environ.get("CI") else "dev")
        dtypes = config.getoption(KV_DTYPES_OPTION)
        self.kv_cache_dtypes: list[str] | None = [d.strip() for d in dtypes.split(",")] if dtypes else None
        self.active = self.active or bool(dtypes)
        self.choice: Any = None


def _state(config: pytest.Config) -> _State:
    return getattr(config, _STATE)


def pytest_configure(config: pytest.Config) -> None:
    from conformance.clauses import CLAUSE_MARK

    config.addinivalue_line("markers", f"{CLAUSE_MARK}(id): the kvconform clause this test checks")
    state = _State(config)
    setattr(config, _STATE, state)
    config.pluginmanager.register(_Recorder(config), "kvconform-recorder")
    if state.active:
        _activate(state)


def _activate(state: _State) -> None:
    from hypothesis import settings

    from conformance import loader, profiles

    from conformance.strategies import restrict_kv_cache_dtypes

    profiles.register_profiles()
    settings.load_profile(state.profile)
    profiles.ACTIVE[0] = state.profile
    state.active = True
    if state.kv_cache_dtypes:
        try:
            restrict_kv_cache_dtypes(state.kv_cache_dtypes)
        except ValueError as exc:
            raise pytest.UsageError(f"kvconform: {KV_DTYPES_OPTION}: {exc}") from None
    if state.store_spec and state.choice is None:
        try:
            state.choice = loader.resolve(state.store_spec)
        except loader.StoreLoadError as exc:
            raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from conformance.clauses import clause_of

    state = _state(config)
    tiers = {id(item): c.tier for item in items if (c := clause_of(item)) is not None}
    if not tiers:
        return
    chosen = {"store": bool(state.store_spec), "engine": bool(state.connector_spec),
              "connector": bool(state.connector_spec)}
    if not any(chosen.values()):
        raise pytest.UsageError(
            "kvconform: no store chosen: pass --kv-store module:factory (or a registered name "
            "such as 'memory'), or set KVCONFORM_STORE; for the connector-API and engine tiers pass --kv-connector")
    wanted = config.getoption(KV_TIERS_OPTION)
    if wanted:
        names = [t.strip() for t in wanted.split(",") if t.strip()]
        unknown = [t for t in names if t not in TIERS]
        if unknown:
            raise pytest.UsageError(f"kvconform: {KV_TIERS_OPTION}: unknown tier {unknown[0]!r}; valid: {', '.join(TIERS)}")
        chosen = {t: ok and t in names for t, ok in chosen.items()}
    # A tier whose implementation was not chosen is not collected (like -k), not failed.
    keep = [item for item in items if chosen.get(tiers.get(id(item), ""), True)]
    dropped = [item for item in items if item not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    _activate(state)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = _state(config)
    if not state.active:
        return None
    from conformance import __version__
    from conformance.profiles import describe
    from conformance.results import package_versions

    lines = [f"kvconform {__version__}: Hypothesis profile {describe(state.profile)}"]
    if state.choice is not None:
        lines.append(f"kvconform store: {state.choice.spec} -> {state.choice.target} "
                     f"[{state.choice.distribution_version}]")
    if state.connector_spec:
        opt = config.getoption
        lines.append(f"kvconform connector: {state.connector_spec} role={opt('--kv-role')} "
                     f"kv_cache_dtype={opt('--kv-cache-dtype')} model={opt('--model')} "
                     f"block_size={opt('--kv-block-size')} engine python={opt('--kv-engine-python') or 'this'}")
    if state.kv_cache_dtypes:
        lines.append(f"kvconform kv_cache_dtypes: {', '.join(state.kv_cache_dtypes)}")
    lines.append("kvconform versions: " + ", ".join(f"{k} {v}" for k, v in package_versions().items()))
    env = {k: v for k, v in os.environ.items() if k.startswith("KVCONFORM_")}
    if env:  # printed so that a typo in a variable name is visible
        lines.append("kvconform env: " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    return lines


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def kv_store_factory(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    """Builds fresh, guarded stores of the chosen kind, each in its own directory; closes them all."""
    from conformance import loader
    from conformance.guard import GuardedStore
    from conformance.status import NOT_RUNNABLE_PREFIX
    from conformance.store import StoreNotRunnable

    state = _state(request.config)
    timeout = request.config.getoption(KV_TIMEOUT_OPTION)
    built: list[GuardedStore] = []

    def make() -> GuardedStore:
        workdir = tmp_path_factory.mktemp("kvstore")  # per xdist worker: no shared paths
        try:
            store = loader.build(state.choice, workdir)
        except loader.StoreLoadError as exc:
            pytest.exit(str(exc), returncode=4)
        except StoreNotRunnable as exc:  # every clause that needs the store: Not runnable
            pytest.skip(f"{NOT_RUNNABLE_PREFIX}{exc}")
        guarded = GuardedStore(store, name=state.choice.target, timeout_s=timeout)
        built.append(guarded)
        return guarded

    yield make
    for store in built:
        store.close()


@pytest.fixture(scope="session")
def kv_store(kv_store_factory: Callable[[], Any]) -> Any:
    """The store under test, shared by the session's examples (keys are unique per example)."""
    return kv_store_factory()


@pytest.fixture(scope="session")
def kv_capabilities(kv_store: Any) -> frozenset[str]:
    return frozenset(kv_store.capabilities)


@pytest.fixture(scope="session")
def engine_cell(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The engine-tier cell for the chosen connector, model and kv_cache_dtype (engines start lazily)."""
    import sys

    from conformance.engine.baselines import BaselineStore
    from conformance.engine.cell import EngineCell

    opt = request.config.getoption
    connector = _connector_choice(request.config)
    python = opt("--kv-engine-python") or sys.executable
    shared = opt("--kv-engine-baselines")
    cell = EngineCell(connector=connector, model=_model_dir(opt("--model"), python),
                      kv_cache_dtype=opt("--kv-cache-dtype"), block_size=opt("--kv-block-size"),
                      workdir=tmp_path_factory.mktemp("engine"), timeout_s=opt("--kv-engine-timeout"),
                      python=python, baselines=BaselineStore(Path(shared)) if shared else None)
    yield cell
    cell.close()
    request.config.stash[_TIMINGS] = cell.timings()
    request.config.stash[_VERSIONS] = cell.versions()


@pytest.fixture(scope="session")
def connector_api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The connector-API tier's harness for the chosen connector and model (Not runnable when no
    shim covers the installed vLLM)."""
    from conformance.connector_api.eras import EraUnavailable
    from conformance.connector_api.session import open_harness
    from conformance.status import NOT_RUNNABLE_PREFIX

    opt = request.config.getoption
    connector = _connector_choice(request.config)
    try:
        harness, close = open_harness(connector, opt("--model"), tmp_path_factory.mktemp("connector-api"),
                                      timeout_s=opt(KV_TIMEOUT_OPTION))
    except EraUnavailable as exc:
        pytest.skip(f"{NOT_RUNNABLE_PREFIX}{exc}")
    except ValueError as exc:
        pytest.exit(f"kvconform: {exc}", returncode=4)
    yield harness
    close()


def _connector_choice(config: pytest.Config) -> Any:
    """The connector under test as the options give it; a malformed choice ends the run (exit 4)."""
    from conformance.engine.cell import ConnectorChoice

    opt = config.getoption
    try:
        return ConnectorChoice.parse(_state(config).connector_spec, opt("--kv-connector-extra-config"),
                                     opt("--kv-role"))
    except ValueError as exc:
        pytest.exit(f"kvconform: {exc}", returncode=4)


def _model_dir(model: str, python: str) -> Path:
    """A model directory: a path as given, or a profile generated (once) with the engine's Python."""
    import subprocess

    if Path(model).is_dir():
        return Path(model)
    code = "import sys; from conformance.engine.models import materialise; print(materialise(sys.argv[1]))"
    proc = subprocess.run([python, "-c", code, model], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.exit(f"kvconform: --model {model!r}: {proc.stderr.strip().splitlines()[-1] if proc.stderr else 'failed'}",
                    returncode=4)
    return Path(proc.stdout.strip().splitlines()[-1])


_TIMINGS = pytest.StashKey[dict]()
_VERSIONS = pytest.StashKey[dict]()


# -- verdicts ---------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _kvconform_clause_gate(request: pytest.FixtureRequest) -> None:
    """A clause the store cannot claim is Disabled (a skip with that reason), never a Fail."""
    from conformance.clauses import clause_of, disabled_reason, set_current_test

    c = clause_of(request.node)
    if c is None:
        return
    set_current_test(request.node.nodeid)  # examples are counted for every tier
    if c.tier != "store":
        return
    caps = request.getfixturevalue("kv_capabilities")
    request.node.user_properties.append(("kvconform.capabilities", ",".join(sorted(caps))))
    reason = disabled_reason(c, caps, _state(request.config).choice.target)
    if reason:
        pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    from conformance.asserts import ClauseViolation
    from conformance.clauses import EXAMPLES, clause_of
    from conformance.guard import HarnessError
    from conformance.status import Status

    report = yield
    c = clause_of(item)
    status = _status_of(report, call, c.tier) if c is not None else None
    if status is not None:
        report.user_properties.append(("kvconform.clause", c.id))
        report.user_properties.append(("kvconform.status", status.value))
        report.user_properties.append(("kvconform.examples", EXAMPLES.get(item.nodeid, 0)))
        kind = HarnessError if status is Status.ERROR else ClauseViolation
        violations = _found(call.excinfo, kind) if report.when == "call" else []
        if violations:
            # Hypothesis may raise a group of distinct failures: name every clause message.
            report.user_properties.append(("kvconform.message", "\n".join(dict.fromkeys(map(str, violations)))))
    return report


# Tiers whose tests call the implementation only through wrappers that turn its faults into a
# ClauseViolation: anything else that fails there is the suite's own fault, an Error.
STRICT_FAIL_TIERS = ("connector",)


def _status_of(report: pytest.TestReport, call: pytest.CallInfo[None], tier: str = "store") -> Any:
    """The lattice status decided by this phase's report, or None when the phase decides nothing."""
    from conformance.asserts import ClauseViolation
    from conformance.guard import HarnessError
    from conformance.status import DISABLED_PREFIX, NOT_RUNNABLE_PREFIX, Status

    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return Status.XFAIL if report.skipped else Status.XPASS
        if report.passed:
            return Status.PASS
        if report.failed:
            if _found(call.excinfo, HarnessError):
                return Status.ERROR
            if tier in STRICT_FAIL_TIERS and not _found(call.excinfo, ClauseViolation):
                return Status.ERROR
            return Status.FAIL
    if report.skipped:
        reason = _message(report).removeprefix("Skipped: ")
        if reason.startswith(DISABLED_PREFIX):
            return Status.DISABLED
        if reason.startswith(NOT_RUNNABLE_PREFIX):
            return Status.NOT_RUNNABLE
        return Status.SKIP
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


class _Recorder:
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
        from conformance.results import TestRecord

        self.records.append(TestRecord(
            nodeid=report.nodeid, clause=props["kvconform.clause"], status=props["kvconform.status"],
            duration_s=round(report.duration, 4), examples=int(props.get("kvconform.examples", 0)),
            message=props.get("kvconform.message")
            or (_message(report) if (report.failed or report.skipped) else "")))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.records:
            return
        from collections import Counter

        counts = Counter(r.status for r in self.records)
        terminalreporter.write_sep("-", "kvconform verdicts")
        terminalreporter.write_line("kvconform: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        for r in self.records:
            if r.status in ("Fail", "Error", "XPass"):
                first = r.message.splitlines()[0] if r.message else ""
                terminalreporter.write_line(f"  {r.status} {r.clause}: {first}")
        path = self.config.getoption(KV_RESULTS_OPTION)
        if path:
            self._write(Path(path))
            terminalreporter.write_line(f"kvconform: results written to {path}")

    def _write(self, path: Path) -> None:
        from hypothesis import settings

        from conformance import results

        state = _state(self.config)
        current = settings.default
        choice = state.choice
        opt = self.config.getoption
        connector = None
        if state.connector_spec:
            connector = {"spec": state.connector_spec, "role": opt("--kv-role"),
                         "extra_config": json.loads(opt("--kv-connector-extra-config") or "{}"),
                         "kv_cache_dtype": opt("--kv-cache-dtype"),
                         "model": opt("--model"), "block_size": opt("--kv-block-size"),
                         "engine_timings": self.config.stash.get(_TIMINGS, None),
                         "engine_versions": self.config.stash.get(_VERSIONS, None)}
        results.write(path, results.build(
            store={"spec": state.store_spec, "target": choice.target if choice else None,
                   "version": choice.distribution_version if choice else None,
                   "capabilities": sorted(self.capabilities)},
            connector=connector,
            profile=state.profile,
            kv_cache_dtypes=state.kv_cache_dtypes,
            hypothesis_settings={"max_examples": current.max_examples,
                                 "derandomize": current.derandomize,
                                 "stateful_step_count": current.stateful_step_count},
            records=self.records))
