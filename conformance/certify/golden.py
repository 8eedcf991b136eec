"""The golden required-test list and the vendor's PRODUCT.yaml: load, validate, compare.

Both are schema-checked with one-line errors, like matrix.yaml. Required test ids read
``level:clause`` and must name a clause the suite defines, so the list cannot rot.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Mapping

import yaml

from conformance.contract.spec import KV_CACHE_DTYPES
from conformance.verdict.clauses import CLAUSES

GOLDEN_SCHEMA = "kvconform.golden/2"
SHIPPED_GOLDEN = Path(str(files("conformance.certify") / "required-tests.yaml"))
PRODUCT_REQUIRED = ("vendor", "name", "version", "connector", "contact_email", "badges")
PRODUCT_OPTIONAL = ("description", "website_url", "repo_url", "documentation_url")


class GoldenError(ValueError):
    """A golden list or PRODUCT.yaml is malformed; one line."""


@dataclass(frozen=True)
class Badge:
    name: str
    description: str
    kv_cache_dtypes: tuple[str, ...] | None
    required: tuple[str, ...]


@dataclass(frozen=True)
class Golden:
    suite_version: str
    badges: Mapping[str, Badge]
    sha256: str


def test_id(level: str, clause: str) -> str:
    return f"{level}:{clause}"


def known_test_ids() -> set[str]:
    return {test_id(c.level, c.id) for c in CLAUSES.values()}


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise GoldenError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise GoldenError(f"{path}: not valid YAML ({getattr(exc, 'problem', exc)})") from None


def _need(cond: object, path: Path, where: str, what: str) -> None:
    if not cond:
        raise GoldenError(f"{path}: {where}: expected {what}")


def load_golden(path: Path = SHIPPED_GOLDEN) -> Golden:
    data = _read_yaml(path)
    _need(isinstance(data, dict) and set(data) == {"schema", "suite_version", "badges"}, path,
          "(top level)", "exactly the keys schema, suite_version, badges")
    _need(data["schema"] == GOLDEN_SCHEMA, path, "schema", repr(GOLDEN_SCHEMA))
    badges = {}
    for name, spec in (data["badges"] or {}).items():
        where = f"badges.{name}"
        _need(isinstance(spec, dict) and set(spec) == {"description", "kv_cache_dtypes", "required"},
              path, where, "exactly the keys description, kv_cache_dtypes, required")
        dtypes = spec["kv_cache_dtypes"]
        _need(dtypes is None or (isinstance(dtypes, list) and set(dtypes) <= set(KV_CACHE_DTYPES)), path,
              f"{where}.kv_cache_dtypes", f"null or a list from {list(KV_CACHE_DTYPES)}")
        required = spec["required"]
        _need(isinstance(required, list) and required, path, f"{where}.required", "a non-empty list of test ids")
        for i, tid in enumerate(required):
            _need(tid in known_test_ids(), path, f"{where}.required[{i}]",
                  f"a test id of this suite (level:clause), got {tid!r}")
        badges[name] = Badge(name, spec["description"], tuple(dtypes) if dtypes else None, tuple(required))
    _need(bool(badges), path, "badges", "at least one badge")
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return Golden(str(data["suite_version"]), badges, digest)


def load_product(path: Path, golden: Golden) -> dict[str, Any]:
    data = _read_yaml(path)
    _need(isinstance(data, dict), path, "(top level)", f"a mapping with keys {list(PRODUCT_REQUIRED)}")
    for key in PRODUCT_REQUIRED:
        _need(key in data and data[key] not in (None, "", []), path, key, "a value (required)")
    unknown = sorted(set(data) - set(PRODUCT_REQUIRED) - set(PRODUCT_OPTIONAL))
    _need(not unknown, path, unknown[0] if unknown else "", f"one of {list(PRODUCT_REQUIRED + PRODUCT_OPTIONAL)}")
    _need(isinstance(data["badges"], list), path, "badges", "a list of badge names")
    for i, name in enumerate(data["badges"]):
        _need(name in golden.badges, path, f"badges[{i}]", f"one of {list(golden.badges)}, got {name!r}")
    _need("@" in str(data["contact_email"]), path, "contact_email", "an e-mail address")
    return data


