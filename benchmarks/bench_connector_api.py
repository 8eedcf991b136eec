"""The connector-API level's time to verdict per connector, and its cost per example.

Runs ``pytest --pyargs conformance --kv-connector C --kv-levels connector`` under a profile for
each connector given and writes ``benchmarks/results/connector_api.json``: wall time to a
verdict, per clause its duration, examples and seconds per example (one example = a store run
and a load run, i.e. two connector pairs over caches vLLM allocated), and the peak RSS of the
pytest process.

    python benchmarks/bench_connector_api.py [--connector ExampleConnector ...] [--profile ci]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CONNECTORS = ("ExampleConnector", "LMCacheMPConnector")


def run_connector(connector: str, profile: str, capabilities: str = "persistent") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance", "-q", "-p", "no:cacheprovider",
                        f"--kv-connector={connector}", "--kv-levels=connector", f"--kv-profile={profile}",
                        f"--kv-connector-capabilities={capabilities}",
                        f"--kv-results={out}", f"--basetemp={tmp}/base"], cwd=HERE.parent, capture_output=True)
        wall = time.monotonic() - started
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        doc = json.loads(out.read_text())
    clauses = {t["clause"]: {"status": t["status"], "duration_s": t["duration_s"], "examples": t["examples"],
                             "s_per_example": round(t["duration_s"] / t["examples"], 3) if t["examples"] else None}
               for t in doc["tests"]}
    return {"connector": connector, "profile": profile, "time_to_verdict_s": round(wall, 1),
            "peak_rss_mib": round(max(peak_kib, before) / 1024) if peak_kib > before else None,
            "clauses": clauses, "packages": doc["environment"]["packages"], "cpu": doc["environment"]["cpu"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connector", action="append", default=None)
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--capabilities", default="persistent", help="what every connector given declares")
    args = parser.parse_args()
    rows = [run_connector(c, args.profile, args.capabilities) for c in args.connector or DEFAULT_CONNECTORS]
    path = HERE / "results" / "connector_api.json"
    path.write_text(json.dumps(rows, indent=2) + "\n")
    for r in rows:
        per = ", ".join(f"{c} {v['s_per_example']}s/ex" for c, v in r["clauses"].items() if v["s_per_example"])
        print(f"{r['connector']:<20} {r['time_to_verdict_s']:>6}s to verdict, peak RSS {r['peak_rss_mib']} MiB; {per}")
    print(f"written to {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
