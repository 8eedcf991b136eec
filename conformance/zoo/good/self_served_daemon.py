"""The daemon of ``self_served.SelfServedConnector``: LMCache's multiprocess server for one directory
(a memory tier, then LMCache's ``fs`` disk tier in ``DIR/tier``), its ports in ``DIR/server.json``,
ended GRACE_S after no process holds ``DIR/clients.lock`` any more. No vLLM import: it starts fast.

``python -m conformance.zoo.good.self_served_daemon DIR``
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conformance.util import procs

CHUNK_SIZE = 64  # tokens per LMCache chunk: a multiple of every block size vLLM-CPU uses
L1_GB = 0.0625  # a small memory tier: the disk tier is the one that persists
GRACE_S = 10.0  # how long the daemon outlives the last process that used it (a later one reads the disk tier)


def running(home: Path) -> int | None:
    """The port of the daemon ``home/server.json`` names, if it is alive and ready."""
    try:
        state = json.loads((home / "server.json").read_text())
        os.kill(state["pid"], 0)
    except (OSError, ValueError, KeyError):
        return None
    return int(state["port"]) if _healthy(state["http_port"]) else None


def _healthy(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def main(home: Path) -> None:
    port, http_port, prometheus = procs.free_ports(3)
    tier = home / "tier"
    tier.mkdir(exist_ok=True)
    server = subprocess.Popen(
        [sys.executable, "-m", "lmcache.v1.multiprocess.http_server", "--host", "127.0.0.1", "--port", str(port),
         "--http-host", "127.0.0.1", "--http-port", str(http_port), "--prometheus-port", str(prometheus),
         "--chunk-size", str(CHUNK_SIZE), "--l1-size-gb", str(L1_GB), "--eviction-policy", "LRU",
         "--supported-transfer-mode", "auto", "--l2-adapter", json.dumps({"type": "fs", "base_path": str(tier)})],
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        while server.poll() is None and not _healthy(http_port):
            time.sleep(0.2)
        (home / "server.json.tmp").write_text(json.dumps({"pid": os.getpid(), "port": port, "http_port": http_port}))
        os.replace(home / "server.json.tmp", home / "server.json")
        _serve_while_used(home, server)
        with open(home / "start.lock", "a") as start:  # no connector finds it while it stops
            fcntl.flock(start, fcntl.LOCK_EX)
            (home / "server.json").unlink(missing_ok=True)
            _stop(server)
    finally:
        # Whatever ended the daemon, its server ends with it: a directory removed under it (a test's
        # temporary one) once left the server orphaned, 530 MiB each, for the rest of the session.
        _stop(server)


def _stop(server: subprocess.Popen) -> None:
    """Not ``procs.stop``, which signals a process group: the server stays in the daemon's, so that
    whatever kills that group (a test's timeout, the runner's) ends the server too."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def _serve_while_used(home: Path, server: subprocess.Popen) -> None:
    """Return once the server died or no process held ``clients.lock`` for GRACE_S."""
    idle_since = None
    with open(home / "clients.lock", "a") as clients:
        while server.poll() is None:
            try:
                fcntl.flock(clients, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(clients, fcntl.LOCK_UN)
                idle_since = idle_since or time.monotonic()
            except BlockingIOError:
                idle_since = None
            if idle_since is not None and time.monotonic() - idle_since > GRACE_S:
                return
            time.sleep(1.0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
