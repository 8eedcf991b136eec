"""The golden required-test list and the vendor's PRODUCT.yaml: load, validate, compare.

Both are schema-checked with one-line errors, like matrix.yaml. Required test ids read
``level:clause`` and must name a clause the suite defines, so the list cannot rot.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Mapping, cast

import yaml

from conformance.contract.spec import KV_CACHE_DTYPES
from conformance.verdict import secrets
from conformance.verdict.clauses import CLAUSES
from conformance.vocabulary import DEFAULT_MODEL, LEVELS, Level

GOLDEN_SCHEMA = "kvconform.golden/3"
SHIPPED_GOLDEN = Path(str(files("conformance.certify") / "required-tests.yaml"))
PRODUCT_REQUIRED = ("vendor", "name", "version", "contact_email", "badges")
# What is certified: a store (``store: module:factory``) or a vLLM connector (``connector:``, its
# registry name or ``module:Class``, or a mapping with its extra config and declared capabilities).
SUBJECTS = ("store", "connector")
PRODUCT_OPTIONAL = ("description", "website_url", "repo_url", "documentation_url", "model", "other_model",
                    "distribution", *SUBJECTS)
CONNECTOR_KEYS = ("name", "extra_config", "capabilities", "role")


class GoldenError(ValueError):
    """A golden list or PRODUCT.yaml is malformed; one line."""


@dataclass(frozen=True)
class Badge:
    name: str
    subject: str  # what it certifies: a store or a connector
    description: str
    kv_cache_dtypes: tuple[str, ...] | None
    required: tuple[str, ...]

    @property
    def levels(self) -> tuple[Level, ...]:
        """The levels its required tests run at, in the suite's order."""
        return tuple(level for level in LEVELS if any(level_of(t) == level for t in self.required))


@dataclass(frozen=True)
class Golden:
    suite_version: str
    badges: Mapping[str, Badge]
    sha256: str


def test_id(level: Level, clause: str) -> str:
    return f"{level}:{clause}"


def level_of(test: str) -> Level:
    """The level of a test id (``level:clause``) of ``known_test_ids``."""
    return cast(Level, test.partition(":")[0])


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
        _need(isinstance(spec, dict) and set(spec) == {"subject", "description", "kv_cache_dtypes", "required"},
              path, where, "exactly the keys subject, description, kv_cache_dtypes, required")
        _need(spec["subject"] in SUBJECTS, path, f"{where}.subject", f"one of {list(SUBJECTS)}")
        dtypes = spec["kv_cache_dtypes"]
        _need(dtypes is None or (isinstance(dtypes, list) and set(dtypes) <= set(KV_CACHE_DTYPES)), path,
              f"{where}.kv_cache_dtypes", f"null or a list from {list(KV_CACHE_DTYPES)}")
        required = spec["required"]
        _need(isinstance(required, list) and required, path, f"{where}.required", "a non-empty list of test ids")
        for i, tid in enumerate(required):
            _need(tid in known_test_ids(), path, f"{where}.required[{i}]",
                  f"a test id of this suite (level:clause), got {tid!r}")
        _need(all((level_of(tid) == "store") == (spec["subject"] == "store") for tid in required), path,
              f"{where}.required", f"tests of the {spec['subject']} subject's levels only")
        badges[name] = Badge(name, spec["subject"], spec["description"], tuple(dtypes) if dtypes else None,
                             tuple(required))
    _need(bool(badges), path, "badges", "at least one badge")
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return Golden(str(data["suite_version"]), badges, digest)


def load_product(path: Path, golden: Golden) -> dict[str, Any]:
    """PRODUCT.yaml, validated against ``golden``, with ``connector`` normalised to a mapping of
    CONNECTOR_KEYS and ``model`` defaulted. Its secrets are registered (``secrets.register_config``):
    what the runs echo of them is masked in the bundle."""
    data = _read_yaml(path)
    secrets.register_config(data)
    _need(isinstance(data, dict), path, "(top level)", f"a mapping with keys {list(PRODUCT_REQUIRED)}")
    data = {k: v for k, v in data.items() if v is not None}  # a key left empty is a key not given
    for key in PRODUCT_REQUIRED:
        _need(key in data and data[key] not in (None, "", []), path, key, "a value (required)")
    unknown = sorted(set(data) - set(PRODUCT_REQUIRED) - set(PRODUCT_OPTIONAL))
    _need(not unknown, path, unknown[0] if unknown else "", f"one of {list(PRODUCT_REQUIRED + PRODUCT_OPTIONAL)}")
    _need(isinstance(data["badges"], list), path, "badges", "a list of badge names")
    for i, name in enumerate(data["badges"]):
        _need(name in golden.badges, path, f"badges[{i}]", f"one of {list(golden.badges)}, got {name!r}")
    _need("@" in str(data["contact_email"]), path, "contact_email", "an e-mail address")
    subjects = {golden.badges[name].subject for name in data["badges"]}
    _need(len(subjects) == 1, path, "badges", "badges of one subject (a store's or a connector's), not both")
    (subject,) = subjects
    other = "connector" if subject == "store" else "store"
    hint = (" (`connector:` names a vLLM connector; a store's module:factory goes under `store:`)"
            if subject == "store" and isinstance(data.get("connector"), str) else "")
    _need(data.get(subject), path, subject, f"the {subject} under test: badge {data['badges'][0]} certifies a "
                                            f"{subject}{hint}")
    _need(other not in data, path, other, f"nothing: the badges claimed certify a {subject}")
    if subject == "store":
        _need(isinstance(data["store"], str) and ":" in data["store"], path, "store", "'module:factory'")
    else:
        data["connector"] = _connector(path, data["connector"])
    data.setdefault("model", DEFAULT_MODEL)
    _need(isinstance(data["model"], str), path, "model", "a model shipped with kvconform, or a model directory")
    _need(isinstance(data.get("other_model", ""), str), path, "other_model",
          "a directory: another checkpoint of the model directory (the model-isolation clauses need one)")
    return data


def _connector(path: Path, value: Any) -> dict[str, Any]:
    spec = {"name": value} if isinstance(value, str) else value
    _need(isinstance(spec, dict) and isinstance(spec.get("name"), str) and spec["name"], path, "connector",
          "a registry name or 'module:Class', or a mapping with name and optionally extra_config, capabilities, role")
    unknown = sorted(set(spec) - set(CONNECTOR_KEYS))
    _need(not unknown, path, f"connector.{unknown[0]}" if unknown else "connector", f"one of {list(CONNECTOR_KEYS)}")
    extra = spec.get("extra_config") or {}
    _need(isinstance(extra, dict), path, "connector.extra_config", "a mapping (kv_connector_extra_config)")
    caps = spec.get("capabilities") or []
    _need(isinstance(caps, list) and all(isinstance(c, str) for c in caps), path, "connector.capabilities",
          "a list such as [persistent] or ['lossy=0.05']")
    from conformance.levels.capabilities import parse_capabilities

    try:
        parse_capabilities(",".join(caps))
    except ValueError as exc:
        raise GoldenError(f"{path}: connector.capabilities: {exc}") from None
    return {"name": spec["name"], "extra_config": extra, "capabilities": sorted(caps),
            "role": spec.get("role") or "kv_both"}
