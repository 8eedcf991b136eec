"""The connector under test: chosen exactly as vLLM chooses it, and the servers the suite starts
for it (both the connector-API and the engine level use them)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.stores.lmcache_server import LMCacheServer


@dataclass(frozen=True)
class ConnectorChoice:
    """The connector under test, chosen exactly as vLLM chooses it."""

    name: str  # registry name, or the class name when module_path is set
    module_path: str | None = None
    extra_config: dict[str, Any] = field(default_factory=dict)
    role: str = "kv_both"

    @classmethod
    def parse(cls, spec: str, extra_json: str | None = None, role: str = "kv_both") -> ConnectorChoice:
        """``Name`` (vLLM's registry) or ``package.module:ClassName`` (kv_connector_module_path)."""
        try:
            extra = json.loads(extra_json) if extra_json else {}
        except ValueError as exc:
            raise ValueError(f"--kv-connector-extra-config is not JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise ValueError("--kv-connector-extra-config must be a JSON object")
        module, _, name = spec.rpartition(":")
        return cls(name=name, module_path=module or None, extra_config=extra, role=role)

    @property
    def label(self) -> str:
        return f"{self.module_path}:{self.name}" if self.module_path else self.name

    def transfer_config(self, extra: dict[str, Any]) -> dict[str, Any]:
        cfg: dict[str, Any] = {"kv_connector": self.name, "kv_role": self.role,
                               "kv_connector_extra_config": {**extra, **self.extra_config}}
        if self.module_path:
            cfg["kv_connector_module_path"] = self.module_path
        return cfg


class LMCacheService:
    """LMCache's multiprocess server for an LMCacheMPConnector the user did not point at one:
    started on first use, restarted to lose its content, stopped at the end."""

    LOST = "restarted the LMCache server (its L1 store is lost)"

    def __init__(self, log: Path, *, chunk_size: int, python: str | None = None) -> None:
        self.server = LMCacheServer(log, chunk_size=chunk_size, python=python or sys.executable)
        self.started = False

    @staticmethod
    def wanted_by(connector: ConnectorChoice) -> bool:
        return connector.name == "LMCacheMPConnector" and "lmcache.mp.port" not in connector.extra_config

    def config(self) -> dict[str, Any]:
        """The connector's extra config that points it at the server (started on first call)."""
        if not self.started:
            self.server.start()
            self.started = True
        return self.server.connector_config()

    def lose(self) -> str:
        """Lose what the server holds (a restart: its L1 store is memory); say how."""
        self.server.restart()
        return self.LOST

    @property
    def ready_s(self) -> float | None:
        return self.server.ready_s if self.started else None

    def stop(self) -> None:
        if self.started:
            self.server.stop()
