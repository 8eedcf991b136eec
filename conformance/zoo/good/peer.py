"""A prefill/decode connector: the positive control of the P/D clauses (``--kv-connector-capabilities pd``).

It follows the protocol vLLM's NixlConnector follows (vLLM 0.32, ``nixl/pull_scheduler.py``), over
a TCP socket instead of NIXL, so that it runs on a CPU-only machine:

- a **producer** (``kv_producer``) prefills a request that carries ``do_remote_decode``; its
  ``request_finished`` keeps the request's blocks (returns True) and hands back kv_transfer_params
  naming its side channel (host, port), its engine, the request and its block ids. Its worker serves
  those blocks' bytes until the consumer says it has them, then reports the request in
  ``finished_sending`` (or, as Nixl's abort timeout does, after ``release_after_s``).
- a **consumer** (``kv_consumer``) handed those params claims the prompt's tokens as an async load
  (``get_num_new_matched_tokens`` -> (n, True)), pulls the blocks into its own in a worker thread and
  reports the request in ``finished_recving``. A producer that is gone, or that serves another
  kv_cache_dtype, is a failed load: the blocks are reported (``get_block_ids_with_load_errors``) and
  vLLM recomputes them.

The producer's worker publishes its port in the ``rendezvous`` directory of its extra config (the
suite passes ``{storage}``; ``shared_storage_path`` is read when it is absent), where its scheduler
side reads it: in vLLM they may be different processes. Caches are block-major (each layer's tensor
indexed by block id first, as vLLM's CPU backend allocates them). It supports vLLM's hybrid KV
cache manager (``SupportsHMA``): block ids travel per KV cache group, each layer is read and written
through its own group's blocks, and a sliding-window group's null blocks (outside the window) are
skipped.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)

HOST = "127.0.0.1"
NULL_BLOCK = 0  # vLLM's null block: a sliding-window group's slot outside the window


@dataclass
class PeerMetadata(KVConnectorMetadata):
    loads: list[dict[str, Any]] = field(default_factory=list)  # one per request to pull this step


class PeerConnector(KVConnectorBase_V1, SupportsHMA):
    DELAY_FREE = True  # the producer keeps a request's blocks until its consumer has them
    CHECK_DTYPE = True  # the producer refuses a consumer of another kv_cache_dtype
    SAFE_PULL = True  # a pull that fails is a reported load error, never an exception

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        extra = transfer.kv_connector_extra_config or {}
        self._rendezvous = extra.get("rendezvous") or extra["shared_storage_path"]
        self._release_after_s = float(extra.get("release_after_s", 60))
        self._engine_id = transfer.engine_id
        self._producer, self._consumer = transfer.is_kv_producer, transfer.is_kv_consumer
        self._block_size = vllm_config.cache_config.block_size
        self._dtype = str(vllm_config.cache_config.cache_dtype)
        # scheduler side
        self._pending: dict[str, int] = {}  # request id -> tokens computed locally when it was looked up
        self._loads: list[dict[str, Any]] = []
        # worker side
        self._caches: dict[str, torch.Tensor] = {}
        groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        self._group_of = {name: g for g, group in enumerate(groups) for name in group.layer_names}
        self._lock = threading.Lock()
        self._pulled: set[str] = set()  # producer: requests whose consumer has them
        self._finished_at: dict[str, float] = {}  # producer: when vLLM said the request finished
        self._received: set[str] = set()  # consumer: pulls done (or failed)
        self._failed: set[int] = set()  # consumer: blocks a pull could not fill
        self._failed_requests: set[str] = set()  # consumer: requests whose pull failed
        self._errors: set[int] = set()  # consumer: failed blocks reported in this step
        self._errors_by_request: set[str] = set()  # consumer: failed requests reported in this step
        self._server: socket.socket | None = None

    # --- scheduler side -----------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        params = request.kv_transfer_params or {}
        if not (self._consumer and params.get("do_remote_prefill")):
            return 0, False
        count = len(request.prompt_token_ids or []) - num_computed_tokens
        if count <= 0:
            return 0, False
        self._pending[request.request_id] = num_computed_tokens
        return count, True

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        local = self._pending.pop(request.request_id, None)
        params = request.kv_transfer_params or {}
        if local is None or num_external_tokens <= 0:
            return
        first = local // self._block_size
        count = -(-len(request.prompt_token_ids) // self._block_size) - first
        # per group, the (local, remote) block pairs to copy: a null block on either side (a sliding
        # window's slot outside the window) has nothing to copy
        pairs = [[(lo, re) for lo, re in zip(list(mine)[first:first + count], list(theirs)[first:first + count])
                  if NULL_BLOCK not in (lo, re)]
                 for mine, theirs in zip(blocks.get_block_ids(), params["remote_block_ids"])]
        self._loads.append({"request_id": request.request_id, "params": dict(params),
                            "local": [[lo for lo, _ in group] for group in pairs],
                            "remote": [[re for _, re in group] for group in pairs]})
        params["do_remote_prefill"] = False  # loaded once: a re-admitted request recomputes

    def build_connector_meta(self, scheduler_output):
        meta, self._loads = PeerMetadata(self._loads), []
        return meta

    def request_finished(self, request, block_ids):
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids):
        params = request.kv_transfer_params or {}
        if not (self._producer and params.get("do_remote_decode")):
            return False, None
        if request.status.name not in ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED"):
            return False, None  # aborted: nothing to hand over (as NixlConnector)
        with open(os.path.join(self._rendezvous, f"peer-{self._engine_id}.port")) as f:
            port = int(f.read())
        return self.DELAY_FREE, {"do_remote_prefill": True, "do_remote_decode": False,
                                 "remote_engine_id": self._engine_id, "remote_request_id": request.request_id,
                                 "remote_host": HOST, "remote_port": port,
                                 "remote_block_ids": [list(ids) for ids in block_ids]}

    # --- worker side --------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        self._caches = dict(kv_caches)
        if not self._producer:
            return
        server = socket.create_server((HOST, 0))
        self._server = server
        port_file = os.path.join(self._rendezvous, f"peer-{self._engine_id}.port")
        os.makedirs(self._rendezvous, exist_ok=True)
        with open(port_file + ".tmp", "w") as f:
            f.write(str(server.getsockname()[1]))
        os.replace(port_file + ".tmp", port_file)
        threading.Thread(target=self._serve, args=(server,), daemon=True, name="peer-server").start()

    def _serve(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # shut down
            with conn, conn.makefile("rwb") as stream:
                try:
                    self._answer(stream)
                except (OSError, ValueError):
                    continue

    def _answer(self, stream) -> None:
        ask = json.loads(stream.readline())
        if self.CHECK_DTYPE and ask["kv_cache_dtype"] != self._dtype:
            stream.write(json.dumps({"ok": False, "error": f"producer KV is {self._dtype}, "
                                     f"consumer asked for {ask['kv_cache_dtype']}"}).encode() + b"\n")
            stream.flush()
        else:
            chunks = [self._caches[name][self._index(ask["block_ids"], name)].contiguous().view(torch.uint8)
                      .flatten().numpy().tobytes() for name in sorted(self._caches)]
            stream.write(json.dumps({"ok": True, "sizes": [len(c) for c in chunks]}).encode() + b"\n")
            for chunk in chunks:
                stream.write(chunk)
            stream.flush()
            stream.readline()  # the consumer's "done": it has the bytes
        with self._lock:
            self._pulled.add(ask["request_id"])

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        for load in meta.loads:
            if self.SAFE_PULL:
                threading.Thread(target=self._pull_safely, args=(load,), daemon=True, name="peer-pull").start()
            else:
                self._pull(load)
                with self._lock:
                    self._received.add(load["request_id"])

    def _pull_safely(self, load: dict[str, Any]) -> None:
        failed: set[int] = set()
        try:
            self._pull(load)
        except Exception:  # whatever went wrong, the blocks are reported and vLLM recomputes them
            failed = {block for group in load["local"] for block in group}
        with self._lock:  # the failed blocks are reported no later than the finished load
            self._failed |= failed
            if failed:
                self._failed_requests.add(load["request_id"])
            self._received.add(load["request_id"])

    def _pull(self, load: dict[str, Any]) -> None:
        params = load["params"]
        with socket.create_connection((params["remote_host"], params["remote_port"]), timeout=30) as conn, \
                conn.makefile("rwb") as stream:
            stream.write(json.dumps({"request_id": params["remote_request_id"], "block_ids": load["remote"],
                                     "kv_cache_dtype": self._dtype}).encode() + b"\n")
            stream.flush()
            head = json.loads(stream.readline())
            if not head["ok"]:
                raise ValueError(head["error"])
            for name, size in zip(sorted(self._caches), head["sizes"]):
                data = stream.read(size)
                if len(data) != size:
                    raise ValueError(f"{name}: {len(data)} of {size} bytes")
                cache, index = self._caches[name], self._index(load["local"], name)
                if not size:
                    continue
                block = cache[index]
                cache[index] = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(cache.dtype).view(block.shape)
            stream.write(b"done\n")
            stream.flush()

    def _index(self, per_group: list[list[int]], name: str) -> torch.Tensor:
        """The block ids of the layer's own KV cache group."""
        return torch.tensor(per_group[self._group_of.get(name, 0)], dtype=torch.long)

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids):
        now = time.monotonic()
        with self._lock:
            for rid in finished_req_ids:
                self._finished_at.setdefault(rid, now)
            late = {rid for rid, at in self._finished_at.items() if now - at > self._release_after_s}
            sending = (self._pulled & set(self._finished_at)) | late
            for rid in sending:
                self._finished_at.pop(rid, None)
            self._pulled -= sending
            recving, self._received = self._received, set()
            self._errors |= self._failed
            self._errors_by_request |= self._failed_requests & recving
            self._failed, self._failed_requests = set(), self._failed_requests - recving
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids):
        """vLLM >= 0.32: with several KV cache groups a block id names no request, so a failed load is
        reported per request (``failed_recving``, beside ``finished_recving``), not by block."""
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

        sending, recving = self.get_finished(finished_req_ids)
        failed: set[str] = set()
        if len(set(self._group_of.values())) > 1:
            with self._lock:
                failed, self._errors_by_request, self._errors = self._errors_by_request, set(), set()
        return KVConnectorTransferResults(finished_sending=set(sending or ()), finished_recving=set(recving or ()),
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self):
        with self._lock:
            errors, self._errors, self._errors_by_request = self._errors, set(), set()
        return errors

    def shutdown(self):
        if self._server is not None:
            try:
                self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone may not)
            except OSError:
                pass
            self._server.close()
            self._server = None
