"""LMCache's real storage backends (written for 0.5.6) behind the kvconform store protocol.

It also drives 0.3.x and 0.4.x: the one call that differs between eras (how a chunk is handed
to LMCache's host-copy helpers) is chosen by feature detection in ``lmcache_eras``, and an
LMCache the adapter cannot drive makes every clause Not runnable (docs/research/lmcache-versions.md).

Each factory builds one LMCache storage backend exactly as LMCache builds it for vLLM and
drives it through its own API, so the store clauses test what LMCache users run:

* ``make_local_cpu``: ``LocalCPUBackend`` (its hot cache; LRU).
* ``make_local_disk``: ``LocalDiskBackend`` (raw bytes in one file per key; shape, dtype and
  format kept in its in-memory index), with a ``LocalCPUBackend`` as allocator, as LMCache has.
* ``make_redis``: ``RemoteBackend`` with ``redis://`` against a ``redis-server`` that the
  factory starts on a free loopback port with its own data directory.
* ``make_lm_server``: ``RemoteBackend`` with ``lm://`` against LMCache's own server process
  (``python -m lmcache.v1.server HOST PORT cpu``), started by the factory.
* ``make_fs``: ``RemoteBackend`` with ``fs://`` (``FSConnector``: a metadata header and the
  bytes, one file per key).

How a kvconform entry maps onto an LMCache chunk (metadata, key, bytes, scales) is
``lmcache_chunks``. What each backend does with it:

* **Overwrite.** Whatever the backend does: ``LocalCPUBackend`` and ``LocalDiskBackend`` keep
  the first entry under a key (a put of a present key is a no-op); redis, ``lm://`` and
  ``fs://`` replace it.
* **Delete** is claimed where the backend removes: ``LocalCPUBackend.remove``,
  ``LocalDiskBackend.remove`` and ``FSConnector.remove_sync``. The redis and ``lm://``
  connectors do not implement ``remove_sync`` (``RemoteBackend.remove`` logs and returns False).
* **At rest.** ``damage`` is implemented where bytes rest somewhere a disk or a server can
  damage them: the file ``LocalDiskBackend`` wrote, the file ``FSConnector`` wrote, and the
  ``kv_bytes`` value in redis. ``lm://`` keeps bytes in the server's memory: no ``at_rest``.

Puts are waited for (disk and remote puts are asynchronous in LMCache): a failed put is logged
by LMCache and swallowed, exactly as in an engine, so a lost entry shows up as a miss (e.g. an
``int8`` cache on any remote backend: ``protocol.DTYPE_TO_INT`` has no ``torch.int8``, the put
raises ``KeyError: torch.int8``; the adapter keeps such errors in ``put_errors``). Every wait
has a deadline; a call that passes it raises ``LMCacheHang`` (an *Error*, not a Fail), and
``close`` never blocks past its deadlines: ``RedisConnector.close`` deadlocks its own event
loop (``await self.pq_executor.shutdown(wait=True)`` calls the *blocking* shutdown, which
waits on a coroutine scheduled on the loop it is blocking). What did not finish is recorded in
``close_report`` and ``close-report.txt``; child servers are stopped anyway, and die with the
test process if it is killed.

A dead server is an *Error*, not a verdict. LMCache swallows it: with the redis or ``lm://``
server killed, a put logs "Put task failed ... Connection closed by server" (``Broken pipe``
for ``lm://``), ``get_blocking`` logs "Error 111 connecting to ..." and returns None, and
``contains`` returns False, so a clause would read a lost entry as a Fail or an expected miss
as a Pass. The adapter checks its child server around every call and raises ``ServerGone``
("redis-server at 127.0.0.1:PORT stopped answering: ConnectionRefusedError ..."). To see this
happen, ``KVCONFORM_FAULT=kill-server-after-puts:K`` (``conformance.stores.faults``) kills the server
right after the K-th accepted put.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable

import torch

from conformance.contract.spec import KVSpec
from conformance.contract.store import DAMAGE_KINDS, KVEntry, damaged
from conformance.servers.child import ChildServer, start_server
from conformance.stores import faults, lmcache_eras
from conformance.stores.lmcache_chunks import cache_engine_key, from_chunk, lmcache_metadata, to_chunk
from conformance.util import procs
from conformance.verdict.guard import HarnessError

log = logging.getLogger(__name__)

WAIT_S = 20.0  # deadline for one LMCache put (below the suite's default --kv-timeout of 60 s)
CLOSE_S = 10.0  # deadline for each step of close()
_LOOP_STOP = "asyncio loop stop"
CPU_POOL_GB = 0.0625  # LocalCPUBackend pool (allocated up front); the largest entry is 0.5 MiB


class LMCacheHang(HarnessError):
    """An LMCache call did not finish within its deadline: no verdict, an *Error*."""


class ServerGone(HarnessError):
    """The server behind the store died: LMCache turns that into misses, the suite into *Error*.

    A store that lost its data because its server died is an infrastructure fault, not a
    conformance verdict: neither a Fail ("stored entry lost") nor a Pass (an expected miss).
    """


# -- the store --------------------------------------------------------------------------------
def _server_checked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Check the store's server before and after ``method``: no verdict on a dead server's answer.

    LMCache swallows a dead remote (a put logs "Put task failed", get returns None, contains
    False), so a dead server would otherwise read as lost or missing entries.
    """
    @functools.wraps(method)
    def checked(self: LMCacheBackendStore, *args: Any, **kwargs: Any) -> Any:
        self._check_server()
        try:
            result = method(self, *args, **kwargs)
        except Exception:
            self._check_server()  # failed because the server died: that is the error to report
            raise
        self._check_server()
        return result

    return checked


class LMCacheBackendStore:
    """One LMCache storage backend driven through its own API (see the module docstring)."""

    def __init__(self, name: str, backend: Any, allocator: Any, *, capabilities: frozenset[str],
                 damage: Callable[[Any, KVSpec, str], None] | None = None,
                 cleanups: list[tuple[str, Callable[[], None]]] | None = None,
                 workdir: Path | None = None, server: ChildServer | None = None) -> None:
        self.name = name
        self.workdir = workdir
        self.backend = backend
        self.allocator = allocator  # the LocalCPUBackend every LMCache backend allocates from
        self.capabilities = capabilities
        self._damage = damage
        self._cleanups = cleanups or []
        self._closed = False
        self.put_errors: list[str] = []  # puts LMCache failed and swallowed (logged, not raised)
        self.close_report: list[str] = []  # what close() did, hung or failed
        self.server = server  # the child server the factory started, if any
        self.puts = 0  # puts LMCache accepted (counted for KVCONFORM_FAULT)
        self.fault = faults.from_env()
        if self.fault is not None and server is None:
            self.close()
            raise ValueError(f"{self.fault}: {name} starts no server to kill; use lmcache-redis "
                             "or lmcache-lm")

    # -- the protocol ---------------------------------------------------------------------
    @_server_checked
    def put(self, key: str, entry: KVEntry) -> None:
        layout = lmcache_metadata(entry.spec)
        chunk = to_chunk(entry.tensor, entry.spec)
        obj = self.allocator.allocate(layout.shapes, layout.dtypes, layout.fmt, busy_loop=False)
        if obj is None:
            raise MemoryError(f"{self.name}: LMCache could not allocate {layout.shapes} {layout.dtypes}")
        try:
            lmcache_eras.current().copy_in(chunk, obj)  # 0.4+: ValueError on a size mismatch
            self._submit(cache_engine_key(key, entry.spec), obj)
        finally:
            obj.ref_count_down()  # as StorageManager.batched_put does after submitting
        self._count_put()

    @_server_checked
    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        layout = lmcache_metadata(spec)
        obj = self.backend.get_blocking(cache_engine_key(key, spec))
        if obj is None:
            return None
        try:
            chunk = torch.empty(layout.shapes[0], dtype=spec.storage_dtype)
            lmcache_eras.current().copy_out(obj, chunk)
        finally:
            obj.ref_count_down()
        return KVEntry(spec, from_chunk(chunk, spec))

    @_server_checked
    def contains(self, key: str, spec: KVSpec) -> bool:
        return bool(self.backend.contains(cache_engine_key(key, spec)))

    @_server_checked
    def delete(self, key: str, spec: KVSpec) -> bool:
        return bool(self.backend.remove(cache_engine_key(key, spec)))

    @_server_checked
    def damage(self, key: str, spec: KVSpec, how: str) -> None:
        """Damage the bytes LMCache keeps at rest for (key, spec) (test hook for ``at_rest``)."""
        if how not in DAMAGE_KINDS:
            raise ValueError(f"how={how!r}, but valid: {', '.join(DAMAGE_KINDS)}")
        if self._damage is None:
            raise NotImplementedError(f"{self.name} keeps no bytes at rest to damage")
        self._damage(cache_engine_key(key, spec), spec, how)

    def close(self) -> None:
        """Close the backend and its allocator, then stop helpers; never blocks past deadlines.

        A step that hangs is left on a daemon thread and reported in ``close_report`` (and
        ``close-report.txt`` in the workdir); if the backend's own close hung, its event loop
        is blocked too, so stopping the loop is skipped, while child servers are always stopped.
        """
        if self._closed:
            return
        self._closed = True
        backend_step = f"{type(self.backend).__name__}.close()"
        self.close_report.append(_bounded(backend_step, self.backend.close, CLOSE_S))
        backend_hung = " hung " in self.close_report[-1]
        steps = [] if self.allocator is self.backend else [("LocalCPUBackend.close()", self.allocator.close)]
        for label, step in steps + self._cleanups:
            if backend_hung and label == _LOOP_STOP:
                self.close_report.append(f"{label} skipped (the loop is blocked by the hung close)")
                continue
            self.close_report.append(_bounded(label, step, CLOSE_S))
        if self.workdir is not None:
            (self.workdir / "close-report.txt").write_text("\n".join(self.close_report) + "\n")
        if any(" hung " in line or " raised " in line for line in self.close_report):
            log.warning("%s close: %s", self.name, "; ".join(self.close_report))

    def _count_put(self) -> None:
        """Count an accepted put; at ``KVCONFORM_FAULT``'s count, kill the server (fault injection)."""
        self.puts += 1
        if self.fault is not None and self.server is not None and self.puts == self.fault.count:
            self.server.kill(f"{self.fault} fired after put {self.puts}")

    def _check_server(self) -> None:
        """Raise ``ServerGone`` once the child server is dead (one raise site, for Hypothesis)."""
        gone = self.server.gone() if self.server is not None else None
        if gone is not None:
            raise ServerGone(f"{self.name}: {gone}; no verdict is possible on its answers")

    # -- waiting for LMCache's asynchronous puts ------------------------------------------
    def _submit(self, key: Any, obj: Any) -> None:
        result = self.backend.submit_put_task(key, obj)
        if isinstance(result, Future):  # RemoteBackend: the connector's put coroutine
            try:
                result.result(WAIT_S)
            except FutureTimeout:
                raise LMCacheHang(f"{self.name}: put did not finish within {WAIT_S:g}s") from None
            except Exception as exc:  # LMCache logs this and carries on: so do we
                self.put_errors.append(f"{type(exc).__name__}: {exc}")
            return
        if hasattr(self.backend, "disk_worker"):  # LocalDiskBackend: a write task on its loop
            deadline = time.monotonic() + WAIT_S
            while self.backend.exists_in_put_tasks(key):
                if time.monotonic() > deadline:
                    raise LMCacheHang(f"{self.name}: disk write did not finish within {WAIT_S:g}s")
                time.sleep(0.001)


def _bounded(label: str, fn: Callable[[], None], timeout_s: float) -> str:
    """Run ``fn`` on a daemon thread for at most ``timeout_s``; say how it went."""
    outcome: list[str] = []

    def run() -> None:
        try:
            fn()
            outcome.append("ok")
        except BaseException as exc:  # reported, never raised: close must finish
            outcome.append(f"raised {type(exc).__name__}: {exc}")

    start = time.monotonic()
    worker = threading.Thread(target=run, name=f"lmcache-close-{label}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    took = time.monotonic() - start
    if not outcome:
        return f"{label} hung (no return after {timeout_s:g}s; left on a daemon thread)"
    return f"{label} {outcome[0]} in {took:.2f}s"


# -- LMCache plumbing -------------------------------------------------------------------------
_DEFAULT_SPEC = KVSpec()  # only sizes the backends' construction-time metadata


def _config(**overrides: Any) -> Any:
    """Every factory starts here, so an LMCache the adapter cannot drive is Not runnable first."""
    lmcache_eras.current()
    from lmcache.v1.config import LMCacheEngineConfig

    return LMCacheEngineConfig.from_defaults(max_local_cpu_size=CPU_POOL_GB, **overrides)


def _allocator(config: Any) -> Any:
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    return LocalCPUBackend(config, lmcache_metadata(_DEFAULT_SPEC).metadata, dst_device="cpu")


class _LoopThread:
    """The asyncio loop LMCache's disk and remote backends schedule their work on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="lmcache-loop", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CLOSE_S)
        if self.thread.is_alive():
            raise TimeoutError("the asyncio loop did not stop")


def _damage_file(path: Path, spec: KVSpec, how: str) -> None:
    path.write_bytes(damaged(path.read_bytes(), how, element_size=spec.storage_dtype.itemsize))


def _remote_store(name: str, workdir: Path, url: str, *, capabilities: frozenset[str],
                  damage_factory: Callable[[Any], Callable[[Any, KVSpec, str], None]] | None,
                  cleanups: list[tuple[str, Callable[[], None]]], extra_config: dict | None = None,
                  server: ChildServer | None = None) -> LMCacheBackendStore:
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend

    config = _config(local_cpu=False, remote_url=url, remote_serde="naive",
                     extra_config=extra_config)
    allocator = _allocator(config)
    loop = _LoopThread()
    try:
        backend = RemoteBackend(config, lmcache_metadata(_DEFAULT_SPEC).metadata, loop.loop,
                                allocator, dst_device="cpu")
    except BaseException:
        loop.stop()
        allocator.close()
        raise
    if backend.connection is None:  # RemoteBackend logs a failed connect and carries on
        loop.stop()
        allocator.close()
        raise ConnectionError(f"LMCache RemoteBackend could not connect to {url}")
    damage = damage_factory(backend) if damage_factory is not None else None
    return LMCacheBackendStore(name, backend, allocator, capabilities=capabilities, damage=damage,
                               cleanups=[(_LOOP_STOP, loop.stop)] + cleanups,
                               workdir=Path(workdir), server=server)


# -- factories --------------------------------------------------------------------------------
def make_local_cpu(workdir: Path) -> LMCacheBackendStore:
    """``LocalCPUBackend``: LMCache's hot cache, which is also its own allocator."""
    backend = _allocator(_config(local_cpu=True))
    return LMCacheBackendStore("lmcache LocalCPUBackend", backend, backend,
                               capabilities=frozenset({"delete"}), workdir=Path(workdir))


def make_local_disk(workdir: Path) -> LMCacheBackendStore:
    """``LocalDiskBackend`` under ``workdir/lmcache-disk`` (disk only: no CPU hot cache)."""
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    root = Path(workdir) / "lmcache-disk"
    root.mkdir(parents=True, exist_ok=True)
    config = _config(local_cpu=False, local_disk=f"file://{root}/", max_local_disk_size=1.0)
    allocator = _allocator(config)
    loop = _LoopThread()
    backend = LocalDiskBackend(config, loop.loop, allocator, dst_device="cpu",
                               metadata=lmcache_metadata(_DEFAULT_SPEC).metadata)

    def damage(key: Any, spec: KVSpec, how: str) -> None:
        _damage_file(Path(backend._key_to_path(key)), spec, how)

    return LMCacheBackendStore("lmcache LocalDiskBackend", backend, allocator,
                               capabilities=frozenset({"delete", "at_rest"}), damage=damage,
                               cleanups=[(_LOOP_STOP, loop.stop)], workdir=Path(workdir))


def make_redis(workdir: Path) -> LMCacheBackendStore:
    """``RemoteBackend`` with ``redis://`` against a private ``redis-server`` on loopback."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server not found on PATH (Debian: apt-get install redis-server)")
    data = Path(workdir) / "redis-data"
    data.mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    server = start_server([exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data),
                     "--save", "", "--appendonly", "no", "--daemonize", "no"],
                    "redis-server", Path(workdir), port)
    cleanups = [("redis-server stop", server.stop)]

    def damage_factory(backend: Any) -> Callable[[Any, KVSpec, str], None]:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=WAIT_S)
        cleanups.insert(0, ("redis client close", client.close))

        def damage(key: Any, spec: KVSpec, how: str) -> None:
            name = key.to_string() + "kv_bytes"  # where RedisConnector._put writes the bytes
            blob = client.get(name)
            if blob is None:
                raise KeyError(f"no {name!r} in redis")
            client.set(name, damaged(blob, how, element_size=spec.storage_dtype.itemsize))

        return damage

    try:
        return _remote_store("lmcache RemoteBackend redis://", workdir, f"redis://127.0.0.1:{port}",
                             capabilities=frozenset({"at_rest"}), damage_factory=damage_factory,
                             cleanups=cleanups, server=server)
    except BaseException:
        server.stop()
        raise


def make_lm_server(workdir: Path) -> LMCacheBackendStore:
    """``RemoteBackend`` with ``lm://`` against ``python -m lmcache.v1.server 127.0.0.1 PORT cpu``."""
    port = procs.free_port()
    server = start_server([sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"],
                    "lmcache-server", Path(workdir), port)
    try:
        return _remote_store("lmcache RemoteBackend lm://", workdir, f"lm://127.0.0.1:{port}",
                             capabilities=frozenset(), damage_factory=None,
                             cleanups=[("lmcache server stop", server.stop)], server=server)
    except BaseException:
        server.stop()
        raise


def make_fs(workdir: Path) -> LMCacheBackendStore:
    """``RemoteBackend`` with ``fs://`` (``FSConnector``) under ``workdir/lmcache-fs``."""
    root = Path(workdir) / "lmcache-fs"
    root.mkdir(parents=True, exist_ok=True)

    def damage_factory(backend: Any) -> Callable[[Any, KVSpec, str], None]:
        def damage(key: Any, spec: KVSpec, how: str) -> None:
            connector = getattr(backend.connection, "_connector", backend.connection)
            _damage_file(Path(connector._get_file_path(key)), spec, how)  # FSConnector's name
        return damage

    return _remote_store("lmcache RemoteBackend fs://", workdir, f"fs://localhost:0{root}/",
                         capabilities=frozenset({"delete", "at_rest"}),
                         damage_factory=damage_factory, cleanups=[])


__all__ = ["LMCacheBackendStore", "LMCacheHang", "ServerGone", "make_fs",
           "make_lm_server", "make_local_cpu", "make_local_disk", "make_redis"]
