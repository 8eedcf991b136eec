"""The servers the suite starts for a connector that needs one and was not pointed at one: LMCache's
multiprocess server for LMCacheMPConnector (both levels use it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable

from conformance.levels.subject import ConnectorChoice
from conformance.servers.lmcache_forks import ForkServer
from conformance.servers.lmcache_log import ServedLog
from conformance.servers.lmcache_server import CHILD_LOG, LMCacheServer
from conformance.verdict.status import NotRunnable

DEFAULT_L1_GB = 0.25  # the L1 of the servers the suite starts, unless a declared capacity bounds it


class LMCacheService:
    """LMCache's multiprocess server for an LMCacheMPConnector the user did not point at one:
    started on first use, restarted to lose its content, stopped at the end.

    ``spare``: a second server is launched as soon as one is in use, so that losing the content is
    a switch to a server that started while the engines ran, not a restart waited for (4-8 s each, a
    handful per engine cell). Both are launched from the caller's thread (each ends with the thread
    that started it); a forked child (the connector level's supervised clauses) restarts instead."""

    LOST = "restarted the LMCache server (its L1 store is lost)"

    def __init__(self, log: Path, *, chunk_size: int, python: str | None = None, spare: bool = False,
                 forks: ForkServer | None = None, l1_bytes: int | None = None, args: tuple[str, ...] = ()) -> None:
        self._log, self._chunk_size, self._python, self._args = log, chunk_size, python or sys.executable, args
        # A connector that declares capacity=BYTES is judged bounded: its server's L1 holds that much
        # (the suite supplies the server, so the suite bounds it; the results' ``connector.supplied`` says so).
        self._l1_gb = (l1_bytes / 2**30) if l1_bytes else DEFAULT_L1_GB
        self._forks = forks  # where its servers are forked from, if anywhere (``LMCacheServer``)
        self.server = self._new(log)
        self.started = False
        self._spare: LMCacheServer | None = None
        self._keeps_spare = spare
        self._retired: list[LMCacheServer] = []  # interrupted, reaped at stop()
        self._count = 0
        self._read: dict[Path, ServedLog] = {}  # each server's log, as far as ``error`` read it

    def _new(self, log: Path) -> LMCacheServer:
        return LMCacheServer(log, chunk_size=self._chunk_size, l1_size_gb=self._l1_gb, python=self._python,
                             forks=self._forks, extra_args=self._args)

    @staticmethod
    def describe(connector: ConnectorChoice) -> str:
        """What the suite supplies in the user's place, in words (the results' ``connector.supplied``)."""
        l1 = connector.capacity_bytes or int(DEFAULT_L1_GB * 2**30)
        yours = f", with your arguments {' '.join(connector.server_args)}" if connector.server_args else ""
        return (f"LMCache's multiprocess server, started by the suite: L1 {l1} bytes"
                f"{' (the declared capacity)' if connector.capacity_bytes else ''}, LRU eviction{yours}")

    @staticmethod
    def wanted_by(connector: ConnectorChoice) -> bool:
        """An LMCacheMPConnector (or a subclass, or a MultiConnector child) not pointed at a server
        (``lmcache.mp.port`` in its extra config) and not declared ``own-server``."""
        if "own-server" in connector.capabilities:
            return False
        if connector.is_a("LMCacheMPConnector"):
            return "lmcache.mp.port" not in connector.extra_config
        return any(child.get("kv_connector") == "LMCacheMPConnector"
                   and "lmcache.mp.port" not in (child.get("kv_connector_extra_config") or {})
                   for child in connector.children)

    def launch(self) -> None:
        """Start the first server now, awaited at the first ``config``: it comes up while the engines
        without a connector run. Best effort: what stops it is raised by ``config``, where it is asked for."""
        try:
            self.server.launch()
        except (RuntimeError, OSError, NotRunnable):
            pass  # not launched (no process): ``config`` starts it and raises why

    def config(self) -> dict[str, Any]:
        """The connector's extra config that points it at the server (started on first call)."""
        if not self.started:
            if self.server.proc is not None:  # launched ahead
                self.server.ready()
            else:
                self.server.start()
            self.started = True
            self._launch_spare()
        return self.server.connector_config()

    def lose(self) -> str:
        """Lose what the server holds (a restart: its L1 store is memory; or the switch to the spare,
        which never held anything); say how."""
        if self._spare is None or self._spare.owner != os.getpid():
            self.server.restart()
            return self.LOST
        old, self.server, self._spare = self.server, self._spare, None
        old.interrupt()
        self._retired.append(old)
        self.server.ready()
        self._launch_spare()
        return self.LOST

    def _launch_spare(self) -> None:
        if self._keeps_spare:
            self._count += 1
            self._spare = self._new(self._log.with_name(f"{self._log.stem}-{self._count}{self._log.suffix}"))
            self._spare.launch()

    def error(self) -> str | None:
        """Why no verdict on its connector holds, where a server of it (every one it started: the
        retired, the spare, and those a forked child restarted into logs of its own) logged an error
        while serving (``lmcache_log``); None while none did. The suite supplied the server, so what it
        logged is no verdict on the connector: an Error of the suite, naming the line."""
        children = self._log.parent.glob(CHILD_LOG.format(stem=self._log.stem, pid="*", suffix=self._log.suffix))
        servers = (*self._retired, self.server, *([self._spare] if self._spare else []))
        for log in dict.fromkeys([*(server.log_path for server in servers), *sorted(children)]):
            found = self._read.setdefault(log, ServedLog(log)).first_error()
            if found is not None:
                yours = (f" It ran with your arguments ({' '.join(self._args)}): the error may be theirs."
                         if self._args else "")
                return ("the LMCache server the suite supplied (kvconform started it in place of a server of "
                        "yours, so this is no verdict on the connector) logged an error while serving: "
                        f"{found}.{yours}")
        return None

    @staticmethod
    def first_error(services: Iterable[LMCacheService]) -> str | None:
        """The first ``error`` of ``services``, if any."""
        return next((found for service in services if (found := service.error()) is not None), None)

    @property
    def ready_s(self) -> float | None:
        return self.server.ready_s if self.started else None

    def stop(self) -> None:
        """Stop every server it started (``stop_all``)."""
        self.stop_all([self])

    @staticmethod
    def stop_all(services: Iterable[LMCacheService]) -> None:
        """Stop every server of ``services``: all asked at once, then each reaped (an idle server takes
        4 s to shut down on two cores: one after another, the spare and the server in use cost a cell 8 s)."""
        servers = [server for service in services
                   for server in (*service._retired, *([service._spare] if service._spare else []), service.server)]
        for server in servers:
            server.interrupt()
        for server in servers:
            server.stop()  # a server never started or already gone: nothing to do
