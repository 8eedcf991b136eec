"""Opens the connector-API tier's harness: era, model, and the servers a connector needs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from conformance.connector_api.eras import select_era
from conformance.connector_api.harness import ConnectorHarness
from conformance.engine.cell import ConnectorChoice

LMCACHE_CHUNK_SIZE = 64  # a multiple of every block size the tier draws


def open_harness(connector: ConnectorChoice, model: str, workdir: Path,
                 timeout_s: float) -> tuple[ConnectorHarness, Callable[[], None]]:
    """The harness and what closes it; EraUnavailable when no shim covers the installed vLLM."""
    from conformance.engine.models import materialise

    era = select_era()
    _check_resolvable(connector)
    model_dir = Path(model) if Path(model).is_dir() else materialise(model)
    extra, close, lose = {}, (lambda: None), None
    if connector.name == "LMCacheMPConnector" and "lmcache.mp.port" not in connector.extra_config:
        from conformance.engine.lmcache_server import LMCacheServer

        server = LMCacheServer(workdir / "lmcache-server.log", chunk_size=LMCACHE_CHUNK_SIZE).start()
        extra, close = server.connector_config(), server.stop

        def lose() -> str:
            server.restart()
            extra.update(server.connector_config())  # new ports
            return "restarted the LMCache server (its L1 store is lost)"

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
