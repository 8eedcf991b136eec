"""Where an engine cell's engines live: the interpreters they run in (each with its own hash seed
and the environment the connector declares, hosted or a fresh process each), and the worlds of
``roles``: each world's storage under "{storage}", its LMCache server where the connector needs
one, and the damage the suite does to the cross-engine world's storage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, TypedDict

from conformance.levels.engine import separate
from conformance.levels.engine.launch import EngineHost
from conformance.levels.engine.roles import ACROSS, AFTER_LOSS, ROLES, SAME_ENGINE, side_of, world_of
from conformance.levels.services import LMCacheService
from conformance.levels.subject import ConnectorChoice, damage_files, unreachable_storage
from conformance.servers.lmcache_forks import ForkServer
from conformance.verdict.clauses import CLAUSES
from conformance.verdict.guard import HarnessError
from conformance.verdict.status import NotRunnable


class Process(TypedDict):
    """How an engine is started: the host of its interpreter (None: a fresh process), its environment."""

    host: EngineHost | None
    env: dict[str, str]


class Worlds:
    """The interpreters, hosts, servers and storage of one cell's engines, started as they are asked for."""

    def __init__(self, connector: ConnectorChoice, workdir: Path, python: str, block_size: int, *,
                 hosted: bool = True, clauses: Collection[str] = ()) -> None:
        self.connector, self.workdir, self.python, self.block_size = connector, workdir, python, block_size
        # vLLM imported once per interpreter of the cell's engines (``side_of``), each started with
        # its own hash seed and the environment the connector declares; hosted=False: each engine a
        # fresh process, started the same way. The hosts a matrix runner handed over are taken in
        # ``separate.SIDES`` order (unless the connector declares an environment they were not started with).
        declared = dict(connector.engine_env)
        self.interpreters = {separate.FIRST: separate.interpreter_env(separate.draw_seed(), declared)}
        self.hosts: dict[str, EngineHost] = {}
        if hosted:
            first = self.hosts[separate.FIRST] = EngineHost(python, workdir / "engine-host.log", adopt=not declared,
                                                            env=self.interpreters[separate.FIRST])
            first.launch()
            if first.handed and first.hash_seed:
                self.interpreters[separate.FIRST] = separate.interpreter_env(first.hash_seed, declared)
        taken = {separate.seed_of(self.interpreters[separate.FIRST]) or ""}
        self.interpreters[separate.SECOND] = separate.interpreter_env(separate.draw_seed(taken), declared)
        if hosted:
            second = self.hosts[separate.SECOND] = EngineHost(python, workdir / "engine-host-second.log",
                                                              adopt=not declared, side=separate.SECOND,
                                                              env=self.interpreters[separate.SECOND])
            if any(CLAUSES[c].requires & separate.CROSS_ENGINE for c in clauses if c in CLAUSES):
                second.launch()  # imported ahead, or beside the first host and the baseline: not before a load engine
            if second.handed and second.hash_seed:
                self.interpreters[separate.SECOND] = separate.interpreter_env(second.hash_seed, declared)
        # LMCache's servers the suite starts, one per world (``server``), each forked from one process
        # that imported LMCache once (a world's server costs a fork, not an import); none for other connectors.
        self.servers: dict[str, LMCacheService] | None = None
        self._forks: ForkServer | None = None
        if LMCacheService.wanted_by(connector):
            self.servers, self._forks = {}, ForkServer(python, workdir / "lmcache-forks.log")
        for world in (world_of(SAME_ENGINE), ACROSS):  # the first worlds asked for: up while the baseline runs
            self.server(world)
        self.loss = ""  # how the suite last damaged the storage (``lose_storage``); "" while intact
        self.storage = self.storage_of(ACROSS)  # what the store engine writes and lose_storage damages

    def process(self, role: str, env: dict[str, str]) -> Process:
        """How ``role``'s engine is started: the host of its interpreter (``side_of``), and ``env`` with
        that interpreter's (a fresh process, where no host runs it, is started with the same hash seed)."""
        side = side_of(role)
        return {"host": self.hosts.get(side), "env": {**env, **self.interpreters[side]}}

    def storage_of(self, world: str) -> Path:
        """Where the connector keeps what ``world``'s engines store ("{storage}" in its extra config)."""
        return self.workdir / ("storage" + (f"-{world}" if world else ""))

    def server(self, world: str) -> LMCacheService | None:
        """``world``'s LMCache server (None for a connector that needs none), launched on the first ask
        (forked from the cell's fork server; spawned where that fails, then ending with the asking
        thread); its ``config`` waits until it is up. The cross-engine world keeps a spare:
        lose_storage switches to it."""
        if self.servers is None:
            return None
        service = self.servers.get(world)
        if service is None:
            log = self.workdir / f"lmcache-server{f'-{world}' if world else ''}.log"
            service = self.servers[world] = LMCacheService(log, chunk_size=2 * self.block_size, python=self.python,
                                                           l1_bytes=self.connector.capacity_bytes,
                                                           spare=world == ACROSS, forks=self._forks,
                                                           args=self.connector.server_args)
            service.launch()
        return service

    def connector_extra(self, role: str) -> dict[str, Any]:
        """What the suite started for the connector (its world's LMCache server), empty where nothing is needed."""
        service = self.server(world_of(role))
        if service is None:
            return {}
        try:
            return service.config()
        except (RuntimeError, OSError) as exc:  # TimeoutError too: the suite's server, never the connector's verdict
            raise HarnessError(f"the LMCache server the suite starts did not come up: {exc}") from None

    def supplied_error(self) -> str | None:
        """Why no verdict of the cell holds, where a server the suite supplied (every world's, its
        spares, those lose_storage retired) logged an error while serving; None while none did."""
        return LMCacheService.first_error((self.servers or {}).values())

    def lose_storage(self) -> str:
        """Damage what the store engine wrote; say how (a storage hook the user gave does it instead).
        Not runnable for storage we cannot reach."""
        hooked = self.connector.damage_with_hook(str(self.storage), "truncate")
        if hooked is not None:
            return hooked
        done = [d for d in (damage_files(self.storage, "halve"),) if d is not None]
        across = (self.servers or {}).get(ACROSS)
        if across is not None and across.started:  # both, when both hold KV (MultiConnector)
            done.append(across.lose())
        if done:
            return " and ".join(done)
        raise NotRunnable(unreachable_storage(self.connector))

    def damage_for(self, role: str) -> None:
        """Before ``role``'s engine: damage the storage afresh where it runs over damaged storage (the
        engine before may have stored its recomputed KV); refuse where it must read it intact."""
        facts = ROLES[role]
        if facts.damaged:
            self.loss = self.lose_storage()
        if facts.intact and self.loss:
            raise HarnessError(f"engine {role} would read storage already damaged for {'/'.join(AFTER_LOSS)}")

    def describe(self) -> dict[str, Any]:
        """What the cell's hosts and servers cost, and the hash seed each interpreter was started with."""
        hosts = {side: host.describe() for side, host in self.hosts.items() if host.launched}
        return {"lmcache_servers_ready_s": {world or "across": s.ready_s for world, s in (self.servers or {}).items()
                                            if s.ready_s is not None} or None,
                "engine_host": hosts.get(separate.FIRST), "second_engine_host": hosts.get(separate.SECOND),
                # the hash seed each interpreter was started with (a drawn one, or the connector's own)
                "hash_seeds": {side: separate.seed_of(env) for side, env in self.interpreters.items()}}

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()
        if self.servers:
            LMCacheService.stop_all(self.servers.values())
        if self._forks is not None:
            self._forks.stop()
