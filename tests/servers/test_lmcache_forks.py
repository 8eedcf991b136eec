"""LMCache's servers forked from one fork server (the real LMCache): each its own process group and log,
each stopped as a server the suite spawned is; one the fork server cannot give starts fresh; a forked
child of the suite never writes to its parent's fork server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conformance.levels.services import LMCacheService
from conformance.servers.lmcache_forks import ForkServer

pytestmark = pytest.mark.engine


def test_servers_forked_from_one_fork_server_serve_and_stop(tmp_path):
    forks = ForkServer(sys.executable, tmp_path / "forks.log")
    services = [LMCacheService(tmp_path / f"server-{i}.log", chunk_size=32, forks=forks) for i in range(2)]
    try:
        for service in services:
            service.launch()  # asked before the fork server has imported anything: answered in order
        ports = [service.config()["lmcache.mp.port"] for service in services]
        pids = [service.server.proc.pid for service in services]
        assert len(set(ports)) == 2 and len(set(pids)) == 2
        for pid in pids:
            assert os.getpgid(pid) == pid  # a group of its own: stopped with it
            with open(f"/proc/{pid}/stat") as stat:
                assert int(stat.read().rsplit(")", 1)[1].split()[1]) == forks.proc.pid  # the fork server's child
        assert "LMCache HTTP server initialized" in (tmp_path / "server-0.log").read_text(errors="replace")
        LMCacheService.stop_all(services)
        assert all(service.server.proc.poll() is not None for service in services)
    finally:
        LMCacheService.stop_all(services)
        forks.stop()
    assert forks.proc.returncode is not None


@pytest.mark.parametrize("fault, said", [(signal.SIGKILL, "could not be forked (the LMCache fork server exited"),
                                          (signal.SIGSTOP, "could not be forked (the LMCache fork server did not answer "
                                                           "within 2s")], ids=["dies", "hangs"])
def test_a_server_the_fork_server_cannot_give_is_started_fresh_and_its_log_says_why(tmp_path, fault, said):
    """The fork server only makes a server quicker to start: when it dies or hangs before it forked
    a server it was asked for, that server starts as a fresh process, as without it."""
    forks = ForkServer(sys.executable, tmp_path / "forks.log", reply_s=2)
    service = LMCacheService(tmp_path / "server.log", chunk_size=32, forks=forks)
    try:
        service.launch()  # asked while the fork server imports (seconds)
        os.kill(forks.proc.pid, fault)
        assert service.config()["lmcache.mp.port"] and isinstance(service.server.proc, subprocess.Popen)
        assert said in (tmp_path / "server.log").read_text()
    finally:
        service.stop()
        forks.stop()


def test_a_forked_child_of_the_suite_spawns_its_own_server(tmp_path):
    """The connector level's supervised clauses run in forked children; a request of theirs on the
    parent's pipes would take a reply meant for the parent."""
    forks = ForkServer(sys.executable, tmp_path / "forks.log")
    try:
        assert forks.usable()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not forks.usable() else 1)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        forks.stop()


def test_a_server_never_asked_for_ends_with_its_fork_server(tmp_path):
    """A spare no role used is not asked to shut down (its pid would wait for the fork server, its
    SIGINT land in its start-up): it is killed with the fork server, and nothing is left running."""
    from conformance.util.procs import NotChild

    forks = ForkServer(sys.executable, tmp_path / "forks.log")
    used = LMCacheService(tmp_path / "used.log", chunk_size=32, forks=forks)
    spare = LMCacheService(tmp_path / "spare.log", chunk_size=32, forks=forks)
    try:
        used.launch()
        spare.launch()
        used.config()
        deadline = time.monotonic() + 30
        while len(pids := _children(forks.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the spare is forked after the server asked for first
        forked = [NotChild(pid) for pid in pids]
        assert len(forked) == 2 and not spare.server.proc.known
        LMCacheService.stop_all([used, spare])
        assert used.server.proc.poll() is not None and spare.server.proc.poll() is None  # not asked
    finally:
        forks.stop()
    assert all(proc.wait(timeout=30) == 0 for proc in forked)  # ended: nothing outlives the cell


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]
