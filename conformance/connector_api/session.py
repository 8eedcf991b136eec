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
