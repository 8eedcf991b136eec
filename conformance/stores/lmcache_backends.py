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

How a kvconform entry maps onto LMCache, as LMCache's vLLM integration maps a chunk:

* **Metadata.** One ``LMCacheMetadata`` per spec, built as ``VllmServiceFactory`` builds it:
  ``kv_dtype`` is the spec's *storage* dtype, the torch dtype vLLM hands LMCache
  (``get_kv_cache_torch_dtype``: ``uint8`` for every vLLM fp8 string, the model dtype for
  ``auto``); ``kv_shape = (num_layers=1, 2 or 1 for MLA, chunk_size, num_kv_heads,
  head_size)``; ``use_mla`` for the MLA layout. The element format (e4m3 vs e5m2) has nowhere
  to go: LMCache has no field for it, so none is invented here.
* **Key.** ``CacheEngineKey(model_name, world_size=1, worker_id=0, chunk_hash, dtype=kv_dtype)``
  with ``chunk_hash`` a 64-bit integer hash of the kvconform key string (in vLLM it is the
  hash of a chunk's tokens). Nothing else goes into the key, because LMCache puts nothing else
  in it: two specs whose storage dtypes agree (fp8_e4m3 and fp8_e5m2, both ``uint8``) get the
  same key, and ``format_isolation`` is expected to fail on every adapter. That is the finding.
* **Bytes.** One layer's entry is one chunk of ``num_blocks * block_size`` tokens (the chunk
  size is set to that, so every entry is a full chunk). The entry's tensor, whatever its
  strides, is gathered into LMCache's ``KV_2LTD`` layout ``[2, 1, tokens, heads*head_size]``
  (``KV_MLA_FMT`` ``[1, 1, tokens, head_size]`` for MLA), the layout LMCache's vLLM GPU
  connectors produce, and moved into a ``MemoryObj`` allocated by the backend's allocator
  with LMCache's own host-copy helper ``gpu_ops.lmcache_memcpy_async_d2h``. That helper
  copies bytes and checks only their count: a tensor of another size is refused with its
  ``ValueError("Size mismatch ...")``; a tensor of another dtype of the same width is stored
  as bytes, as LMCache would store it. ``get`` reverses this through
  ``lmcache_memcpy_async_h2d`` and scatters the chunk back into the spec's layer layout.
* **Scales.** LMCache has no place for ``k_scale``/``v_scale`` (neither ``MemoryObj``
  metadata, ``RemoteMetadata`` nor the server protocol carries them), so no adapter claims
  ``scales``; ``get`` returns 1.0 for both.
* **Spec on get.** LMCache records dtype and shape, not the ``kv_cache_dtype`` string or the
  layout; the entry returned carries the reader's spec, as the reading engine would assume.
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
import hashlib
import logging
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from conformance.contract.spec import KVSpec, Layout
from conformance.contract.store import DAMAGE_KINDS, KVEntry, damaged
from conformance.stores import faults, lmcache_eras
from conformance.util import procs
from conformance.verdict.guard import HarnessError

log = logging.getLogger(__name__)

MODEL_NAME = "kvconform/lmcache-adapter"  # one model: twins differ only in kv_cache_dtype
WAIT_S = 20.0  # deadline for one LMCache put (below the suite's default --kv-timeout of 60 s)
CLOSE_S = 10.0  # deadline for each step of close()
_LOOP_STOP = "asyncio loop stop"
START_S = 30.0  # deadline for a child server to accept connections
CPU_POOL_GB = 0.0625  # LocalCPUBackend pool (allocated up front); the largest entry is 0.5 MiB


class LMCacheHang(HarnessError):
    """An LMCache call did not finish within its deadline: no verdict, an *Error*."""


class ServerGone(HarnessError):
    """The server behind the store died: LMCache turns that into misses, the suite into *Error*.

    A store that lost its data because its server died is an infrastructure fault, not a
    conformance verdict: neither a Fail ("stored entry lost") nor a Pass (an expected miss).
    """


# -- the mapping: spec -> LMCache metadata, key and chunk layout ------------------------------
@dataclass(frozen=True)
class ChunkLayout:
    """Where one layer's entry sits in LMCache: its metadata, memory format and token count."""

    metadata: Any  # LMCacheMetadata
    fmt: Any  # MemoryFormat
    num_tokens: int

    @property
    def shapes(self) -> list[torch.Size]:
        return self.metadata.get_shapes(self.num_tokens)

    @property
    def dtypes(self) -> list[torch.dtype]:
        return self.metadata.get_dtypes()


def lmcache_metadata(spec: KVSpec) -> ChunkLayout:
    """``LMCacheMetadata`` for ``spec`` as LMCache's vLLM integration builds it for a worker."""
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata

    mla = spec.layout is Layout.MLA
    tokens = spec.num_blocks * spec.block_size
    metadata = LMCacheMetadata(
        model_name=MODEL_NAME, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=spec.storage_dtype,  # uint8 for every vLLM fp8 string, as vLLM hands it over
        kv_shape=(1, 1 if mla else 2, tokens, spec.num_kv_heads, spec.head_size),
        use_mla=mla, chunk_size=tokens)
    return ChunkLayout(metadata, MemoryFormat.KV_MLA_FMT if mla else MemoryFormat.KV_2LTD, tokens)


def chunk_hash(key: str) -> int:
    """The chunk hash standing in for a token-chunk hash: 64 bits of BLAKE2b of the key."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def cache_engine_key(key: str, spec: KVSpec) -> Any:
    """``CacheEngineKey`` as LMCache builds it: model, world size, worker, chunk hash, kv_dtype."""
    from lmcache.utils import CacheEngineKey

    return CacheEngineKey(MODEL_NAME, 1, 0, chunk_hash(key), spec.storage_dtype)


def to_chunk(tensor: torch.Tensor, spec: KVSpec) -> torch.Tensor:
    """The layer's logical content in LMCache's chunk layout, contiguous.

    ``[2, 1, tokens, heads*head_size]`` (``KV_2LTD``) or ``[1, 1, tokens, head_size]`` for MLA.
    The block count comes from the tensor itself, so a tensor of another shape than its spec
    gives a chunk of another size (which LMCache's copy then refuses).
    """
    t = tensor.detach()
    if spec.layout is Layout.KV_FIRST:  # (2, B, N, H, D)
        kv = t
    elif spec.layout is Layout.BLOCKS_FIRST:  # (B, 2, N, H, D)
        kv = t.transpose(0, 1)
    elif spec.layout is Layout.FUSED:  # (B, H, N, 2D): K | V in the last dim
        d = t.shape[-1] // 2
        kv = torch.stack((t[..., :d], t[..., d:])).permute(0, 1, 3, 2, 4)  # (2, B, N, H, D)
    else:  # MLA (B, N, D)
        return t.reshape(1, 1, -1, t.shape[-1]).contiguous()
    return kv.reshape(2, 1, -1, kv.shape[-2] * kv.shape[-1]).contiguous()


def from_chunk(chunk: torch.Tensor, spec: KVSpec) -> torch.Tensor:
    """The inverse of ``to_chunk``: a contiguous tensor of the spec's layer shape."""
    b, n, h, d = spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size
    if spec.layout is Layout.MLA:
        return chunk.reshape(b, n, d).contiguous()
    kv = chunk.reshape(2, b, n, h, d)
    if spec.layout is Layout.KV_FIRST:
        return kv.contiguous()
    if spec.layout is Layout.BLOCKS_FIRST:
        return kv.transpose(0, 1).contiguous()
    k, v = kv.permute(0, 1, 3, 2, 4)  # each (B, H, N, D)
    return torch.cat((k, v), dim=-1).contiguous()


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


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on "
                               f"127.0.0.1:{port}; log {log_path}: {_tail(log_path)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    _stop(proc)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {START_S:g}s; "
                       f"log {log_path}: {_tail(log_path)}")


def _tail(path: Path, n: int = 400) -> str:
    return procs.log_tail(path, n).strip() or "(empty)"


def _stop(proc: subprocess.Popen) -> None:
    procs.stop(proc, grace_s=5)


class ChildServer:
    """A server process a factory started, and whether it is still there to answer."""

    def __init__(self, what: str, port: int, proc: subprocess.Popen) -> None:
        self.what = what
        self.port = port
        self.proc = proc
        self.killed_by = ""  # why the suite killed it (fault injection), if it did
        self._gone: str | None = None

    def gone(self) -> str | None:
        """Why the server can no longer be trusted, or None while its process runs.

        A dead process is permanent, so the text is computed once: every later call raises
        the same message. A server that runs but hangs is the watchdog's (``--kv-timeout``).
        """
        if self._gone is None and self.proc.poll() is not None:
            code = self.proc.returncode
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            why = f"; {self.killed_by}" if self.killed_by else ""
            self._gone = (f"{self.what} at 127.0.0.1:{self.port} stopped answering: "
                          f"{_connect_error(self.port)} (pid {self.proc.pid} {how}{why})")
        return self._gone

    def kill(self, reason: str) -> None:
        """SIGKILL the server and reap it, so the next call sees it dead (fault injection)."""
        self.killed_by = reason
        log.warning("%s: %s", self.what, reason)
        self.proc.kill()
        self.proc.wait(5)

    def stop(self) -> None:
        _stop(self.proc)


def _connect_error(port: int) -> str:
    """What a client gets now from 127.0.0.1:PORT, e.g. ``ConnectionRefusedError: ...``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return "the port still accepts connections (another process holds it)"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _start(argv: list[str], what: str, workdir: Path, port: int) -> ChildServer:
    """Start a child server logging to ``workdir/WHAT.log``; return once it accepts connections."""
    log_path = workdir / f"{what}.log"
    proc = procs.spawn(argv, log_path, cwd=workdir, die_with_parent=True)
    _wait_for_port(port, proc, what, log_path)
    return ChildServer(what, port, proc)


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
    server = _start([exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data),
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
    server = _start([sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"],
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


__all__ = ["ChildServer", "LMCacheBackendStore", "LMCacheHang", "ServerGone", "make_fs",
           "make_lm_server", "make_local_cpu", "make_local_disk", "make_redis", "lmcache_metadata",
           "cache_engine_key", "chunk_hash", "to_chunk", "from_chunk"]
