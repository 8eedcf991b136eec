"""A correct file-backed store: a self-describing header, then the raw bytes.

File layout (little-endian)::

    b"KVCF" | u16 version | u32 header length | header JSON | payload

The header records the full spec, the scales, the key, the payload length and its SHA-256, so
a reader can tell "not mine" (another spec under a colliding name: a miss) from "damaged"
(short payload, checksum mismatch: ``KVCorruptionError``), and never returns garbage.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import (
    DAMAGE_KINDS,
    KVCorruptionError,
    KVEntry,
    check_entry_matches_spec,
    damaged,
    logical_bytes,
    tensor_from_bytes,
)

MAGIC = b"KVCF"
VERSION = 1
_PREFIX = struct.Struct("<4sHI")


def entry_name(key: str, spec: KVSpec) -> str:
    """File name for (key, spec): the spec is part of the address, so formats never collide."""
    canonical = json.dumps({"key": key, "spec": spec.to_dict()}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:40] + ".kv"


class FileStore:
    capabilities = frozenset({"scales", "delete", "at_rest"})

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # -- the protocol ---------------------------------------------------------------------
    def put(self, key: str, entry: KVEntry) -> None:
        check_entry_matches_spec(entry)
        path = self._path(key, entry.spec)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(self.encode(key, entry))
        os.replace(tmp, path)  # readers never see a half-written entry

    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        try:
            blob = self._path(key, spec).read_bytes()
        except FileNotFoundError:
            return None
        return self.decode(blob, key, spec)

    def contains(self, key: str, spec: KVSpec) -> bool:
        return self._path(key, spec).exists()

    def delete(self, key: str, spec: KVSpec) -> bool:
        try:
            self._path(key, spec).unlink()
        except FileNotFoundError:
            return False
        return True

    def close(self) -> None:
        pass

    def damage(self, key: str, spec: KVSpec, how: str) -> None:
        """Damage the bytes at rest as a disk or a network would (test hook for ``at_rest``)."""
        if how not in DAMAGE_KINDS:
            raise ValueError(f"how={how!r}, but valid: {', '.join(DAMAGE_KINDS)}")
        path = self._path(key, spec)
        path.write_bytes(damaged(path.read_bytes(), how, element_size=spec.storage_dtype.itemsize))

    # -- the encoding (overridden by the known-bad stores in conformance/zoo) ------------------
    def _path(self, key: str, spec: KVSpec) -> Path:
        return self.root / entry_name(key, spec)

    def payload(self, entry: KVEntry) -> bytes:
        return logical_bytes(entry.tensor)

    def encode(self, key: str, entry: KVEntry) -> bytes:
        payload = self.payload(entry)
        header = json.dumps({
            "key": key,
            "spec": entry.spec.to_dict(),
            "k_scale": entry.k_scale,
            "v_scale": entry.v_scale,
            "nbytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }, sort_keys=True).encode()
        return _PREFIX.pack(MAGIC, VERSION, len(header)) + header + payload

    def decode(self, blob: bytes, key: str, spec: KVSpec) -> KVEntry | None:
        header, payload = split_blob(blob)
        if header.get("key") != key or header.get("spec") != spec.to_dict():
            return None  # another entry behind a colliding name: a miss, never its bytes
        self.verify(header, payload)
        return KVEntry(spec, self.tensor(payload, spec), header["k_scale"], header["v_scale"])

    def verify(self, header: dict[str, Any], payload: bytes) -> None:
        if len(payload) != header["nbytes"]:
            raise KVCorruptionError(f"truncated entry: payload is {len(payload)} bytes, header "
                                    f"says {header['nbytes']}")
        if hashlib.sha256(payload).hexdigest() != header["sha256"]:
            raise KVCorruptionError("corrupt entry: payload SHA-256 does not match its header")

    def tensor(self, payload: bytes, spec: KVSpec) -> Any:
        return tensor_from_bytes(payload, spec)


def split_blob(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, payload) of a stored blob; ``KVCorruptionError`` if the framing is damaged."""
    if len(blob) < _PREFIX.size:
        raise KVCorruptionError(f"truncated entry: {len(blob)} bytes, shorter than its prefix")
    magic, version, header_len = _PREFIX.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise KVCorruptionError(f"not a kvconform entry (magic={magic!r}, version={version})")
    end = _PREFIX.size + header_len
    try:
        header = json.loads(blob[_PREFIX.size:end])
    except ValueError as exc:
        raise KVCorruptionError(f"corrupt entry header: {exc}") from None
    return header, blob[end:]


def make_store(workdir: Path, **_: Any) -> FileStore:
    return FileStore(Path(workdir) / "kvconform-file-store")
