"""The kvconform plugin's fixtures: the store, the connector-level harness and the engine cell
under test, built from the options ``conformance.plugin`` adds."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conformance.plugin import options
from conformance.plugin.options import (
    ENGINE_EVIDENCE,
    ENGINE_TIMINGS,
    ENGINE_VERSIONS,
    GEOMETRY,
    evidence_dir,
    session_state,
)


@pytest.fixture(scope="session")
def kv_store_factory(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    """Builds fresh, guarded stores of the chosen kind, each in its own directory; closes them all."""
    from conformance.stores import loader
    from conformance.verdict.guard import GuardedStore

    state = session_state(request.config)
    timeout = request.config.getoption(options.TIMEOUT)
    built: list[GuardedStore] = []

    def make() -> GuardedStore:
        workdir = tmp_path_factory.mktemp("kvstore")  # per xdist worker: no shared paths
        try:
            store = loader.build(state.choice, workdir)
        except loader.StoreLoadError as exc:
            pytest.exit(str(exc), returncode=4)
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
    """The engine-level cell for the chosen connector, model and kv_cache_dtype (engines start lazily)."""
    import sys
    import time

    from conformance.levels.engine.baselines import BaselineStore
    from conformance.levels.engine.cell import EngineCell
    from conformance.verdict.clauses import clause_of, disabled_reason

    opt = request.config.getoption
    connector = connector_choice(request.config)
    python = opt(options.ENGINE_PYTHON) or sys.executable
    shared = opt(options.ENGINE_BASELINES)
    # The engine clauses this session runs and that apply to the connector: what a second lane may start ahead.
    selected = {c.id for item in request.session.items if (c := clause_of(item)) is not None and c.level == "engine"
                and disabled_reason(c, connector.applies, connector.label) is None}
    model = opt(options.MODEL)
    started = time.monotonic()
    model_dir = _model_dir(model, python)
    cell = EngineCell(connector=connector, model=model_dir, recipe=None if Path(model).is_dir() else model,
                      kv_cache_dtype=opt(options.CACHE_DTYPE), block_size=opt(options.BLOCK_SIZE),
                      workdir=tmp_path_factory.mktemp("engine"), timeout_s=opt(options.ENGINE_TIMEOUT),
                      python=python, baselines=BaselineStore(Path(shared)) if shared else None,
                      hosted=opt(options.ENGINE_START) == "host", lanes=opt(options.ENGINE_LANES),
                      clauses=selected, tensor_parallel=opt(options.TENSOR_PARALLEL),
                      other_model=other_model(request.config))
    if cell.models.recipe is not None:  # the cell's own model, materialised from its recipe
        cell.models.made(model, time.monotonic() - started)
    if "one-geometry" in connector.capabilities:
        request.config.stash[GEOMETRY] = {"block_size": cell.block_size, "kv_cache_dtype": cell.kv_cache_dtype}
    yield cell
    cell.close()
    request.config.stash[ENGINE_TIMINGS] = cell.timings()
    request.config.stash[ENGINE_VERSIONS] = cell.versions()
    results = opt(options.RESULTS)
    if results:  # the engines' logs and per-request outcomes, beside the results file
        where = Path(results).resolve()
        request.config.stash[ENGINE_EVIDENCE] = cell.keep_evidence(evidence_dir(where) / "engine", where.parent)


@pytest.fixture(scope="session")
def connector_api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The connector level's harness for the chosen connector and model (Not runnable when no
    shim covers the installed vLLM, or the suite cannot start the server it needs: NotRunnable)."""
    from conformance.levels.connector.scenarios import PINNED
    from conformance.levels.connector.session import open_harness

    opt = request.config.getoption
    connector = connector_choice(request.config)
    try:
        harness, close = open_harness(connector, opt(options.MODEL), tmp_path_factory.mktemp("connector-api"),
                                      timeout_s=opt(options.TIMEOUT), other_model=other_model(request.config),
                                      block_size=opt(options.BLOCK_SIZE))
    except ValueError as exc:
        pytest.exit(f"kvconform: {exc}", returncode=4)
    if PINNED:
        request.config.stash[GEOMETRY] = dataclasses.asdict(PINNED[0])
    yield harness
    close()


def connector_choice(config: pytest.Config) -> Any:
    """The connector under test as the options give it; a malformed choice ends the run (exit 4)."""
    from conformance.levels.subject import ConnectorChoice

    state = session_state(config)
    if state.connector is None:
        opt = config.getoption
        try:
            state.connector = ConnectorChoice.parse(state.connector_spec or "", opt(options.EXTRA_CONFIG),
                                                    opt(options.ROLE), opt(options.CAPABILITIES),
                                                    opt(options.STORAGE_HOOK), opt(options.ENGINE_ENV),
                                                    opt(options.TRANSFER_CONFIG), opt(options.LMCACHE_SERVER_ARG))
        except ValueError as exc:
            pytest.exit(f"kvconform: {exc}", returncode=4)
    return state.connector


def other_model(config: pytest.Config) -> Path | None:
    """The other checkpoint the user gave (``--kv-other-model``); one that is no model directory, or is the
    model under test itself, ends the run (exit 4): the model-isolation clauses would judge nothing."""
    given = config.getoption(options.OTHER_MODEL)
    if not given:
        return None
    path = Path(given)
    if not (path / "config.json").is_file():
        raise pytest.exit.Exception(f"kvconform: {options.OTHER_MODEL} {given!r}: not a model directory "
                                    "(no config.json in it)", returncode=4)
    model = config.getoption(options.MODEL)
    if Path(model).is_dir() and path.resolve() == Path(model).resolve():
        raise pytest.exit.Exception(f"kvconform: {options.OTHER_MODEL} {given!r} is {options.MODEL} itself: "
                                    "give another checkpoint of it", returncode=4)
    return path


def _model_dir(model: str, python: str) -> Path:
    """A model directory: a path as given, or a recipe's model generated (once) with the engine's Python."""
    from conformance.levels.engine.models import materialise_in

    if Path(model).is_dir():
        return Path(model)
    made = materialise_in(python, model)
    if isinstance(made, Path):
        return made
    raise pytest.exit.Exception(f"kvconform: {options.MODEL} {model!r}: {made}", returncode=4)
