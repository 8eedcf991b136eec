"""Opens the connector-API level's harness: era, model, and the servers a connector needs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from conformance.levels.connector.eras import select_era
from conformance.levels.connector.harness import ConnectorHarness
from conformance.levels.subject import ConnectorChoice, LMCacheService

LMCACHE_CHUNK_SIZE = 64  # a multiple of every block size the level draws


def open_harness(connector: ConnectorChoice, model: str, workdir: Path,
                 timeout_s: float) -> tuple[ConnectorHarness, Callable[[], None]]:
    """The harness and what closes it; EraUnavailable when no shim covers the installed vLLM."""
    from conformance.levels.engine.models import materialise

    era = select_era()
    _check_resolvable(connector)
    model_dir = Path(model) if Path(model).is_dir() else materialise(model)
    extra, close, lose = {}, (lambda: None), None
    if LMCacheService.wanted_by(connector):
        service = LMCacheService(workdir / "lmcache-server.log", chunk_size=LMCACHE_CHUNK_SIZE)
        extra, close = service.config(), service.stop

        def lose() -> str:
            how = service.lose()
            extra.update(service.config())  # new ports
            return how

    return ConnectorHarness(era, connector, model_dir, workdir, timeout_s=timeout_s, extra_config=extra,
                            lose_remote=lose), close


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
