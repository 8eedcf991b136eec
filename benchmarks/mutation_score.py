"""The suite's mutation score: bugs from hands other than the clauses'.

The zoo's known-bad stores and connectors are written by the people who wrote the clauses, so they
hide where the clauses look. cosmic-ray's operators do not: each mutant of a reference store (every
mutant) or of the lifecycle control connector (a fixed sample) is run under the suite's ``ci``
profile, and a mutant the suite passes survives. Every survivor is triaged in
``benchmarks/mutation_triage.yaml``: equivalent (why), or a gap (the audit row that now draws it).

    nox -s mutation                       # or: python benchmarks/mutation_score.py [memory file lifecycle]
    python benchmarks/mutation_score.py --survivors file   # only the last run's survivors, after a fix

Writes ``benchmarks/results/mutation_score.json``. Run by hand (about 20 minutes for the stores
on 2 cores, the connector sample about as long): never a CI step. Mutants are applied to a copy of
the working tree, so the checkout is never touched.
"""

from __future__ import annotations

import json
import platform
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "mutation_score.json"
TRIAGE = ROOT / "benchmarks" / "mutation_triage.yaml"
COSMIC_RAY = shutil.which("cosmic-ray") or str(Path(sys.executable).with_name("cosmic-ray"))


class Target(NamedTuple):
    module: str  # the file mutated
    suite: str  # the suite's options that judge it
    sample: int | None = None  # mutants run (a seeded sample); None: all


TARGETS = {
    "memory": Target("conformance/stores/memory.py", "--kv-store=memory --kv-levels=store"),
    "file": Target("conformance/stores/file.py", "--kv-store=file --kv-levels=store"),
    "lifecycle": Target("conformance/zoo/good/lifecycle.py",
                        "--kv-connector=conformance.zoo.good.lifecycle:LifecycleConnector "
                        "--kv-connector-capabilities=persistent --kv-levels=connector "
                        "--kv-cache-dtypes=auto", sample=40),
}
SAMPLE_SEED = 53


def copy_tree(dest: Path) -> Path:
    """The working tree's tracked and untracked files (not .git, .nox, venvs) under ``dest``."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def run_target(name: str, target: Target, tree: Path, only: set[str] | None = None) -> dict[str, Any]:
    """Mutate ``target.module`` in ``tree`` and run the suite on each mutant (``only``: those ids)."""
    session = tree / f"{name}.sqlite"
    config = tree / f"{name}.toml"
    command = (f"{sys.executable} -m pytest --pyargs conformance -p no:cacheprovider -q -x --kv-profile=ci "
               f"{target.suite}")
    config.write_text(f'[cosmic-ray]\nmodule-path = "{target.module}"\ntimeout = 600.0\nexcluded-modules = []\n'
                      f'test-command = "{command}"\n\n[cosmic-ray.distributor]\nname = "local"\n')
    subprocess.run([COSMIC_RAY, "init", str(config), str(session)], cwd=tree, check=True)
    jobs = _jobs(session)
    total = len(jobs)
    if only is not None:
        _keep(session, {job for job, mutant in jobs.items() if mutant in only})
    elif target.sample is not None and total > target.sample:  # the same seeded sample every run
        _keep(session, set(random.Random(SAMPLE_SEED).sample(sorted(jobs), target.sample)))
    started = time.monotonic()
    subprocess.run([COSMIC_RAY, "exec", str(config), str(session)], cwd=tree, check=True)
    seconds = time.monotonic() - started
    mutants = _mutants(session)
    triage = (yaml.safe_load(TRIAGE.read_text()) or {}).get(name) or {} if TRIAGE.exists() else {}
    survivors = [m for m in mutants if m["outcome"] == "survived"]
    for m in survivors:
        m["triage"] = triage.get(m["id"]) or (ANNOTATION if _annotation_only(m["diff"]) else "untriaged")
    equivalent = sum(1 for m in survivors if str(m["triage"]).startswith("equivalent"))
    killed = sum(1 for m in mutants if m["outcome"] == "killed")
    judged = len(mutants) - equivalent
    return {"module": target.module, "suite": target.suite, "mutants_generated": total, "mutants_run": len(mutants),
            "killed": killed, "survived": len(survivors), "equivalent": equivalent,
            "score": _score(killed, judged), "seconds": round(seconds),
            "survivors": survivors}


ANNOTATION = ("equivalent: an operator inside a type annotation, which the module never evaluates "
              "(from __future__ import annotations)")


def _annotation_only(diff: str) -> bool:
    """Whether a mutant changed only a ``def`` line's annotation (``X | None`` made ``X + None``)."""
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if len(removed) != 1 or len(added) != 1 or not removed[0].startswith("def "):
        return False
    before, after = removed[0].split(" | "), added[0]
    return len(before) > 1 and any(f" {op} ".join(before) == after for op in _OPERATORS)


_OPERATORS = ("+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "^")


def _mutant_id(operator: str, row: int, occurrence: int) -> str:
    """A mutant's name that stays the same from run to run of the same file: operator @ line # occurrence."""
    return f"{operator}@{row}#{occurrence}"


def _jobs(session: Path) -> dict[str, str]:
    """The session's work items: job id -> mutant id."""
    with sqlite3.connect(session) as db:
        rows = db.execute("SELECT job_id, operator_name, start_pos_row, occurrence FROM mutation_specs").fetchall()
    return {job: _mutant_id(operator, row, occurrence) for job, operator, row, occurrence in rows}


def _keep(session: Path, keep: set[str]) -> None:
    """Drop every work item but the jobs ``keep`` names."""
    with sqlite3.connect(session) as db:
        for job in set(_jobs(session)) - keep:
            db.execute("DELETE FROM mutation_specs WHERE job_id = ?", (job,))
            db.execute("DELETE FROM work_items WHERE job_id = ?", (job,))


def _score(killed: int, judged: int) -> float | None:
    """Killed mutants over the non-equivalent ones."""
    return round(killed / judged, 4) if judged else None


def _merged(before: dict[str, Any], rerun: dict[str, Any]) -> dict[str, Any]:
    """A target's result after re-running its survivors: the mutants killed before stay killed."""
    killed = before["killed"] + rerun["killed"]
    judged = before["mutants_run"] - rerun["equivalent"]
    return {**before, "killed": killed, "survived": rerun["survived"], "equivalent": rerun["equivalent"],
            "score": _score(killed, judged), "survivors": rerun["survivors"],
            "rerun_of_survivors": {"mutants": rerun["mutants_run"], "killed": rerun["killed"], "seconds": rerun["seconds"]}}


def _mutants(session: Path) -> list[dict[str, Any]]:
    """Each mutant run: a stable id (operator, line, occurrence), its outcome, its diff."""
    dump = subprocess.run([COSMIC_RAY, "dump", str(session)], check=True, capture_output=True, text=True).stdout
    out = []
    for line in dump.splitlines():
        item, result = json.loads(line)
        if result is None:
            continue
        (spec,) = item["mutations"]
        out.append({"id": _mutant_id(spec["operator_name"], spec["start_pos"][0], spec["occurrence"]),
                    "outcome": result["test_outcome"], "diff": result.get("diff", "")})
    return sorted(out, key=lambda m: m["id"])


def main(args: list[str]) -> int:
    survivors = "--survivors" in args
    chosen = [a for a in args if a != "--survivors"] or list(TARGETS)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    targets = dict(previous.get("targets", {}))
    with tempfile.TemporaryDirectory(prefix="kvconform-mutation-") as tmp:
        tree = copy_tree(Path(tmp))
        for n in chosen:
            if survivors:
                before = targets[n]
                targets[n] = _merged(before, run_target(n, TARGETS[n], tree, {m["id"] for m in before["survivors"]}))
            else:
                targets[n] = run_target(n, TARGETS[n], tree)
    RESULTS.write_text(json.dumps({"cpu": platform.processor() or _cpu(), "tool": "cosmic-ray", "profile": "ci",
                                   "targets": targets}, indent=1) + "\n")
    for n in chosen:
        t = targets[n]
        print(f"{n}: {t['killed']}/{t['mutants_run'] - t['equivalent']} killed (score {t['score']}), "
              f"{t['survived']} survived ({t['equivalent']} equivalent), {t['seconds']} s")
    return 0


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
