"""Fingerprint files: write them stably, read them back with one-line errors, find the committed ones.

Committed fingerprints live in ``fixtures/api/vllm-<version>.json`` (installed as package data,
``conformance/data/api``), one per vLLM release the suite knows, and are the history that says in which
release a name was last seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conformance.api_surface import SCHEMA
from conformance.data import data_dir
from conformance.util.versions import version_key

SECTIONS = ("connector", "kv_transfer_config", "registry", "dtype_map", "cache_dtype", "layout_api", "backends",
            "exports")
# How a fingerprint was made and from what: not part of the surface itself.
PROVENANCE = ("obtained_by", "source")
COMMITTED = data_dir("api")


class FingerprintError(ValueError):
    """A fingerprint file is unreadable or not a kvconform fingerprint; the message is one line."""


def dumps(fp: dict[str, Any]) -> str:
    return json.dumps(fp, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def write(fp: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(fp), encoding="utf-8")


def load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise FingerprintError(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise FingerprintError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise FingerprintError(f"{path}: schema: expected {SCHEMA!r}, got {got!r}")
    missing = [s for s in ("vllm_version", *SECTIONS) if s not in doc]
    if missing:
        raise FingerprintError(f"{path}: missing section {missing[0]!r}")
    return doc


def surface(fp: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint without its provenance: what two ways of reading one release must agree on."""
    return {k: v for k, v in fp.items() if k not in PROVENANCE}


def committed(directory: Path = COMMITTED) -> list[dict[str, Any]]:
    """The committed fingerprints, oldest release first."""
    return sorted((load(p) for p in directory.glob("vllm-*.json")), key=lambda fp: version_key(fp["vllm_version"]))


def committed_path(version: str, directory: Path = COMMITTED) -> Path:
    return directory / f"vllm-{version.split('+')[0]}.json"
