"""What a session of the project's own tests cost (CI runs them: `.ci/run`, 90 minutes at most), per
test file and for its slowest tests, from the JUnit XML pytest wrote for it:

    pytest -n 2 --dist loadgroup -m engine --junitxml=/tmp/engine.xml
    python benchmarks/test_session_cost.py /tmp/engine.xml --wall-s 2950 --label "engine session" \
        --out benchmarks/results/engine_session.json

Or from a CI log, which has no JUnit XML but pytest's ``--durations`` block and its summary line (the
slowest tests only; no per-file sums):

    python benchmarks/test_session_cost.py --log ci.log --label "engine session" \
        --out benchmarks/results/test_sessions.json

``--wall-s`` is the session's elapsed time as pytest printed it; the sum of the tests' times over it
is how well its workers were kept busy. The machine is recorded as the results files record theirs:
a CPU without AVX-512 refuses fp8 KV engines at once, so the same session is shorter there.
"""

from __future__ import annotations

import argparse
import json
import re
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


def from_log(log: Path) -> tuple[dict[str, Any], float]:
    """The slowest tests and the session's elapsed seconds, from the last session a pytest log shows."""
    text = log.read_text(errors="replace")
    block = text.rsplit("slowest ", 1)[-1].split("\n", 1)[-1]
    slowest = [(float(m[1]), m[2]) for m in re.finditer(r"^(\d+\.\d+)s call\s+(\S+)$", block, re.M)]
    summary = re.findall(r"=+ (.*?) in ([\d.]+)s", text)[-1]
    tests = sum(int(n) for n in re.findall(r"(\d+) (?:passed|failed|skipped|error)", summary[0]))
    return {"tests": tests, "slowest_s": {n: s for s, n in sorted(slowest, reverse=True)[:SLOWEST]}}, float(summary[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, nargs="?")
    parser.add_argument("--log", type=Path, help="a pytest log with --durations (instead of a JUnit XML)")
    parser.add_argument("--wall-s", type=float, help="the session's elapsed time, as pytest printed it")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.log is not None:
        summary, wall_s = from_log(args.log)
    elif args.junit is not None and args.wall_s is not None:
        summary, wall_s = cost(args.junit), args.wall_s
    else:
        parser.error("give a JUnit XML and --wall-s, or --log")
    busy = {"busy": round(summary["test_s"] / (wall_s * args.workers), 2)} if "test_s" in summary else {}
    doc = {"label": args.label, "cpu": cpu_model(), "cpu_features": cpu_features(), "workers": args.workers,
           "wall_s": wall_s, **busy, **summary}
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs = [r for r in previous.get("runs", []) if r.get("label") != args.label]
    args.out.write_text(json.dumps({"runs": [*runs, doc]}, indent=2) + "\n")
    print(f"{args.label}: {summary['tests']} tests, {wall_s / 60:.1f} min on {args.workers} workers, {doc['cpu']}")


if __name__ == "__main__":
    main()
