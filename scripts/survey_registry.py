"""What the suite does with every connector the installed vLLM registers, on this machine.

For each registry name, runs the connector level's same-engine clause (every connector gets it,
whatever it declares) and ``api_requirements`` with the connector as vLLM would build it from its
name alone (no extra config), and records each verdict with its first message line. Writes
``docs/research/registry-survey.json``; docs/connector-level.md's registry table is read from it.

    python scripts/survey_registry.py [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def survey(name: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "-q", "-p", "no:cacheprovider",
               f"--kv-connector={name}", "--kv-levels=connector", "--kv-profile=dev", f"--kv-results={out}",
               "-k", "same_engine or requirements", f"--basetemp={tmp}/base"]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"connector": name, "outcome": f"no verdict within {timeout:g}s"}
        if not out.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
            return {"connector": name, "outcome": f"exit {proc.returncode}: {tail[0][:300]}"}
        tests = json.loads(out.read_text())["tests"]
    return {"connector": name, "outcome": "verdicts",
            "verdicts": {t["clause"]: {"status": t["status"], "message": (t["message"] or "").splitlines()[0][:300]
                                       if t["message"] else ""} for t in tests}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    import vllm

    from conformance.api_surface.runtime import registered_names

    rows = [survey(name, args.timeout) for name in sorted(registered_names())]
    doc = {"vllm": vllm.__version__, "connectors": rows}
    path = ROOT / "docs" / "research" / "registry-survey.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    for r in rows:
        print(r["connector"], r["outcome"], {c: v["status"] for c, v in r.get("verdicts", {}).items()})


if __name__ == "__main__":
    main()
