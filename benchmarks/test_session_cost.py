"""What a session of the project's own tests cost (CI runs them: `.ci/run`, 90 minutes at most), per
test file and for its slowest tests, from the JUnit XML pytest wrote for it:

    pytest -n 2 --dist loadgroup -m engine --junitxml=/tmp/engine.xml
    python benchmarks/test_session_cost.py /tmp/engine.xml --wall-s 2950 --label "engine session" \
        --out benchmarks/results/engine_session.json

``--wall-s`` is the session's elapsed time as pytest printed it; the sum of the tests' times over it
is how well its workers were kept busy. The machine is recorded as the results files record theirs:
a CPU without AVX-512 refuses fp8 KV engines at once, so the same session is shorter there.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

from conformance.verdict.results import cpu_features, cpu_model

SLOWEST = 25


def cost(junit: Path) -> dict[str, Any]:
    """Seconds per test file and the slowest tests of a JUnit XML (setup and teardown included)."""
    tests = [(float(case.get("time") or 0), f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}")
             for case in ET.parse(junit).getroot().iter("testcase")]
    per_file: dict[str, float] = defaultdict(float)
    for seconds, name in tests:
        per_file[name.split("::")[0]] += seconds
    return {"tests": len(tests), "test_s": round(sum(s for s, _ in tests), 1),
            "per_file_s": {f: round(s, 1) for f, s in sorted(per_file.items(), key=lambda kv: -kv[1])},
            "slowest_s": {n: round(s, 1) for s, n in sorted(tests, reverse=True)[:SLOWEST]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--wall-s", type=float, required=True, help="the session's elapsed time, as pytest printed it")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    summary = cost(args.junit)
    doc = {"label": args.label, "cpu": cpu_model(), "cpu_features": cpu_features(), "workers": args.workers,
           "wall_s": args.wall_s, "busy": round(summary["test_s"] / (args.wall_s * args.workers), 2), **summary}
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs = [r for r in previous.get("runs", []) if r.get("label") != args.label]
    args.out.write_text(json.dumps({"runs": [*runs, doc]}, indent=2) + "\n")
    print(f"{args.label}: {summary['tests']} tests, {args.wall_s / 60:.1f} min on {args.workers} workers "
          f"({doc['busy']:.0%} busy), {doc['cpu']}")


if __name__ == "__main__":
    main()
