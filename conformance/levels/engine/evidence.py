"""What an engine cell leaves beside its results: each engine's log (redacted) and per-request
outcomes, the package versions its engines ran with, and what each engine cost.

A user checks a verdict by these, kept past pytest's rotating temp directories.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, TypedDict

from conformance.levels.engine.compare import request_outcome
from conformance.levels.engine.launch import EngineRun
from conformance.levels.engine.worlds import Worlds

EVIDENCE_LOG_BYTES = 64 << 10  # of each engine's log kept beside the results


class RoleEvidence(TypedDict, total=False):
    """What a role's engine came to, kept beside the results: whether it ran, why not, each request's
    outcome, vLLM's prefix-cache counters (as summed from every step, and as vLLM logged them), and
    where its log's copy is."""

    ok: bool
    error: str
    requests: list[dict[str, Any]]
    counters: dict[str, float]
    counters_logged: dict[str, float]
    log: str


def keep(runs: Mapping[str, EngineRun], logs: Path, into: Path, base: Path) -> dict[str, RoleEvidence]:
    """Copy what each engine of ``runs`` logged under ``logs`` (its last ``EVIDENCE_LOG_BYTES``,
    redacted) into ``into``, and return, per role, where that copy is (relative to ``base``, the
    results file's directory) and what each request came to (prompt length, cached and external
    hits, finish reason, tokens)."""
    from conformance.verdict.results import redact_text

    into.mkdir(parents=True, exist_ok=True)
    kept: dict[str, RoleEvidence] = {}
    for role, run in runs.items():
        entry: RoleEvidence = {"ok": run.ok, **({"error": redact_text(run.error.splitlines()[0])}
                                                 if run.error else {}),
                               "requests": [request_outcome(r) for r in run.result.get("requests", ())]}
        if "counters" in run.result:
            entry["counters"] = run.result["counters"]
            entry["counters_logged"] = run.result.get("counters_logged", {})
        log = logs / f"{role}.log"
        if log.is_file():
            data = log.read_bytes()[-EVIDENCE_LOG_BYTES:].decode(errors="replace")
            (into / f"{role}.log").write_text(redact_text(data))
            entry["log"] = str((into / f"{role}.log").relative_to(base))
        kept[role] = entry
    return kept


def versions(runs: Mapping[str, EngineRun]) -> dict[str, str]:
    """Package versions reported by the engines (vLLM, LMCache, torch as the engine saw them)."""
    for run in runs.values():
        if run.result.get("versions"):
            return run.result["versions"]
    return {}


def timings(runs: Mapping[str, EngineRun], worlds: Worlds, lanes: int) -> dict[str, Any]:
    """Per role, its engine's wall and vLLM start times (and the baseline it reused); what the cell
    cost in engine processes and vLLM imports (its hosts' one each, unless a cell before it paid for
    the host it was lent, plus each engine's own)."""
    started = [r for r in runs.values() if "reused_from" not in r.result and r.wall_s]
    described = worlds.describe()
    hosts = [described[side] for side in ("engine_host", "second_engine_host") if described[side]]
    return {role: {"wall_s": r.wall_s, "engine_start_s": r.result.get("t_engine_start_s"),
                   "batches_s": r.result.get("t_batches_s"),
                   # which interpreter it ran in: its PID, hash seed, hash() probe and vLLM's NONE_HASH
                   **({"process": r.result["process"]} if "process" in r.result else {}),
                   **({"reused_from": r.result["reused_from"]} if "reused_from" in r.result else {})}
            for role, r in runs.items()} | described | {
        "engine_starts": len(started), "lanes": lanes,
        "vllm_imports": sum(r.result.get("imported_vllm") is True for r in started)
        + sum(host.get("ready_s") is not None and not host.get("lent") for host in hosts)}
