"""Fingerprint files: write them stably, read them back with one-line errors, find the committed ones.

Committed fingerprints live in ``fixtures/api/vllm-<version>.json`` (installed as package data,
``conformance/data/api``), one per vLLM release the suite knows, and are the history that says in which
release a name was last seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict, cast

from conformance.api_surface import SCHEMA
from conformance.data import data_dir
from conformance.util.versions import version_key

SECTIONS = ("connector", "kv_transfer_config", "registry", "dtype_map", "cache_dtype", "layout_api", "backends",
            "exports")
class Param(TypedDict):
    name: str
    kind: str  # inspect.Parameter.kind's name, lower case
    annotation: str | None  # source text
    default: str | None


class _Def(TypedDict):
    kind: str  # function, method, classmethod, staticmethod, property
    abstract: bool
    params: list[Param]
    returns: str | None


class DefEntry(_Def, total=False):
    """A def as data; a backend method's also has what it returns, a layout helper's its place."""

    return_exprs: list[str] | None  # None: too many or too long to keep
    module: str
    qualname: str


class ClassEntry(TypedDict):
    """A layout helper that is a class (an enum: its members with their values as source text)."""

    module: str
    qualname: str
    kind: str  # "class"
    bases: list[str]
    members: dict[str, str]


Place = DefEntry | ClassEntry  # where a layout helper is defined, and what it is there


class Members(TypedDict):
    module: str | None
    members: dict[str, str]


# Sections with a "class" key, which the class syntax cannot name.
ConnectorSection = TypedDict("ConnectorSection", {"module": str | None, "class": str, "methods": dict[str, DefEntry],
                                                  "role": Members})
Registered = TypedDict("Registered", {"module": str | None, "class": str | None})


class Field(TypedDict):
    annotation: str | None
    default: str | None


class ConfigSection(TypedDict):
    module: str | None
    fields: dict[str, Field]


class RegistrySection(TypedDict):
    module: str | None
    connectors: dict[str, Registered]


class DtypeMapSection(TypedDict):
    module: str | None
    name: str
    entries: dict[str, str]


class CacheDtypeSection(TypedDict):
    module: str | None
    values: list[str]


class ExportsSection(TypedDict):
    covered: list[str]
    modules: dict[str, list[str]]
    all_modules: list[str]


class Fingerprint(TypedDict):
    """A vLLM release's connector-facing surface (``SECTIONS``), with how it was read (``PROVENANCE``)."""

    schema: str
    vllm_version: str
    obtained_by: str
    source: dict[str, Any]
    connector: ConnectorSection
    kv_transfer_config: ConfigSection
    registry: RegistrySection
    dtype_map: DtypeMapSection
    cache_dtype: CacheDtypeSection
    layout_api: dict[str, list[Place]]
    backends: dict[str, dict[str, DefEntry]]  # "module:Class" -> method -> entry
    exports: ExportsSection


# How a fingerprint was made and from what: not part of the surface itself.
PROVENANCE = ("obtained_by", "source")
COMMITTED = data_dir("api")


class FingerprintError(ValueError):
    """A fingerprint file is unreadable or not a kvconform fingerprint; the message is one line."""


def dumps(fp: Fingerprint) -> str:
    return json.dumps(fp, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def write(fp: Fingerprint, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(fp), encoding="utf-8")


def load(path: Path) -> Fingerprint:
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
    return cast(Fingerprint, doc)


def surface(fp: Fingerprint) -> dict[str, Any]:
    """The fingerprint without its provenance: what two ways of reading one release must agree on."""
    return {k: v for k, v in fp.items() if k not in PROVENANCE}


def committed(directory: Path = COMMITTED) -> list[Fingerprint]:
    """The committed fingerprints, oldest release first."""
    return sorted((load(p) for p in directory.glob("vllm-*.json")), key=lambda fp: version_key(fp["vllm_version"]))


def committed_path(version: str, directory: Path = COMMITTED) -> Path:
    return directory / f"vllm-{version.split('+')[0]}.json"
