"""vLLM's LMCacheMPConnector as third-party subclasses ship it: it starts the LMCache server it needs
by itself, with its own tiers, and no one passes it ``lmcache.mp.*``. The positive control of
"judge what the user runs": declared ``own-server``, the suite starts no server for it, and what it
stores lands in its own disk tier (LMCache's ``fs`` L2 adapter under ``self_served.dir``), which a
server of the suite's would never fill.

Its server is a daemon per ``self_served.dir`` (``self_served_daemon``), found again by every connector instance (scheduler
and worker sides, a later engine) through ``server.json`` there. The daemon ends a grace period
after the last connector using it shut down or its process ended (each process using it holds a
shared lock on ``clients.lock``; left held until its exit, a test process running many engines kept
a daemon of ~350 MiB alive per storage directory it ever used, dozens at once): what it held
stays in the disk tier, which the next daemon for the directory reads back at its start.

Run: ``--kv-connector conformance.zoo.good.self_served:SelfServedConnector
--kv-connector-capabilities own-server,persistent --kv-connector-extra-config '{"self_served.dir": "{storage}"}'``
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector import LMCacheMPConnector

from conformance.zoo.good import self_served_daemon as daemon

DIR_KEY = "self_served.dir"
READY_S = 180.0  # how long a connector waits for a daemon it started
# this process's shared locks on its servers' clients.lock, with how many live connectors use each:
# released when the last one shuts down (or the process exits), so a daemon no one uses ends.
_HELD: dict[Path, tuple[IO[Any], int]] = {}


class SelfServedConnector(LMCacheMPConnector):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        if DIR_KEY not in extra:
            raise ValueError(f"SelfServedConnector needs {DIR_KEY!r} in its extra config: the directory of its server")
        self._served = self._home(Path(extra[DIR_KEY]))
        port = serve(self._served)
        extra.update({"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": port})
        super().__init__(vllm_config, role, kv_cache_config)

    def shutdown(self) -> None:
        """LMCache's shutdown, then this instance no longer counts as using its daemon."""
        try:
            super().shutdown()
        finally:
            release(self._served)

    @staticmethod
    def _home(configured: Path) -> Path:
        """The directory of the daemon that serves this cache: the one configured."""
        return configured


def serve(home: Path) -> int:
    """The port of the daemon serving ``home``, started first if none is; this process counts as
    using it until ``release`` (or its exit)."""
    home.mkdir(parents=True, exist_ok=True)
    held, users = _HELD.get(home, (None, 0))
    if held is None:
        held = open(home / "clients.lock", "a")
        fcntl.flock(held, fcntl.LOCK_SH)
    _HELD[home] = (held, users + 1)
    try:
        return _started(home)
    except BaseException:
        release(home)
        raise


def _started(home: Path) -> int:
    """The running daemon's port, or a new daemon's once it is ready."""
    with open(home / "start.lock", "a") as start:
        fcntl.flock(start, fcntl.LOCK_EX)
        running = daemon.running(home)
        if running is not None:
            return running
        with open(home / "daemon.log", "ab") as log:
            subprocess.Popen([sys.executable, "-m", daemon.__name__, str(home)], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            running = daemon.running(home)
            if running is not None:
                return running
            time.sleep(0.2)
    raise RuntimeError(f"the self-served LMCache server for {home} was not ready within {READY_S:g}s: see {home}/daemon.log")


def release(home: Path) -> None:
    """One user of ``home``'s daemon in this process fewer; the last lets go of its lock."""
    held, users = _HELD.pop(home, (None, 0))
    if held is None:
        return
    if users > 1:
        _HELD[home] = (held, users - 1)
    else:
        held.close()
