"""Round-trip examples per second per clause, for a store (default: the in-memory reference).

Runs the real suite (``pytest --pyargs conformance``) under a profile, reads the examples each
clause ran and its call duration from the results file, and writes
``benchmarks/results/store_clauses_<store>.json`` (``_<profile>`` added for a profile other than
deep). Durations include Hypothesis generation: that is the cost a connector developer pays per example.

    python benchmarks/bench_store_clauses.py [--store memory] [--profile deep] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_once(store: str, profile: str) -> tuple[dict[str, tuple[int, float]], dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance", "-q", "-p", "no:cacheprovider",
                        f"--kv-store={store}", f"--kv-profile={profile}", f"--kv-results={out}",
                        f"--basetemp={tmp}/base"], check=False, capture_output=True)
        doc = json.loads(out.read_text())
    return {t["clause"]: (t["examples"], t["duration_s"]) for t in doc["tests"] if t["status"] == "Pass"}, doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="memory")
    parser.add_argument("--profile", default="deep")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {}
    examples: dict[str, int] = {}
    env = None
    for _ in range(args.repeat):
        runs, doc = run_once(args.store, args.profile)
        env = doc["environment"]
        for clause, (n, seconds) in runs.items():
            rates.setdefault(clause, []).append(n / seconds if seconds else float("nan"))
            examples[clause] = n
    table = {c: {"examples": examples[c], "examples_per_s_median": round(statistics.median(r), 1),
                 "examples_per_s_min": round(min(r), 1)} for c, r in sorted(rates.items())}
    result = {"store": args.store, "profile": args.profile, "repeat": args.repeat,
              "environment": env, "clauses": table}
    suffix = "" if args.profile == "deep" else f"_{args.profile}"  # the deep run keeps its file
    path = HERE / "results" / f"store_clauses_{args.store}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    width = max(map(len, table))
    print(f"{'clause':<{width}}  examples  ex/s (median)  ex/s (min)")
    for clause, row in table.items():
        print(f"{clause:<{width}}  {row['examples']:>8}  {row['examples_per_s_median']:>13}  {row['examples_per_s_min']:>10}")
    print(f"written to {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
