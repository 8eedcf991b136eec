"""The engine level's time to verdict and engine starts per cell.

Runs the real engine level (``pytest --pyargs conformance --kv-connector ...``) for each cell
given, reads the engine timings from the results file, and writes
``benchmarks/results/engine_tier.json``: per cell, the wall time to a verdict, how many
engines were started and how many times vLLM was imported (once per cell with an engine host),
each engine's process wall time and vLLM start time.

    python benchmarks/bench_engine_tier.py [--cell ExampleConnector,auto,persistent ...] [--engine-python PY]
        [--engine-start host|fresh] [--engine-lanes 1|2]

A cell is ``CONNECTOR,KV_CACHE_DTYPE[,CAPABILITIES[,MODEL]]`` (capabilities as
``--kv-connector-capabilities`` takes them, ``+``-separated; the model recipe, default qwen3-tiny):
a connector declared without ``persistent`` runs the same-engine role only, one declared ``pd`` the
producer and consumer engines. Rows of cells not run this time are kept.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_cell(connector: str, dtype: str, capabilities: str, model: str, python: str, engine_start: str,
             lanes: int = 1) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance", "-q", "-p", "no:cacheprovider",
                        f"--kv-connector={connector}", f"--kv-cache-dtype={dtype}", f"--kv-engine-python={python}",
                        f"--kv-connector-capabilities={capabilities.replace('+', ',')}", "--kv-levels=engine",
                        f"--kv-model={model or 'qwen3-tiny'}", f"--kv-engine-start={engine_start}",
                        f"--kv-engine-lanes={lanes}",
                        f"--kv-results={out}", f"--basetemp={tmp}/base"], cwd=HERE.parent, capture_output=True)
        wall = time.monotonic() - started
        doc = json.loads(out.read_text())
    timings = doc["connector"]["engine_timings"]
    engines = {k: v for k, v in timings.items() if isinstance(v, dict) and "wall_s" in v}
    return {"connector": connector, "kv_cache_dtype": dtype, "capabilities": capabilities,
            "model": model or "qwen3-tiny", "engine_start": engine_start, "lanes": timings.get("lanes", 1),
            "time_to_verdict_s": round(wall, 1),
            "engine_starts": len(engines), "vllm_imports": timings.get("vllm_imports"),
            "engine_host": timings.get("engine_host"), "engines": engines,
            "lmcache_servers_ready_s": timings.get("lmcache_servers_ready_s"),
            "verdicts": {t["clause"]: t["status"] for t in doc["tests"]},
            "packages": doc["environment"]["packages"], "cpu": doc["environment"]["cpu"]}


def _key(row: dict) -> tuple[str, ...]:
    # A row from before the engine host started every engine as a fresh process.
    return (row["connector"], row["kv_cache_dtype"], row["capabilities"], row.get("model", "qwen3-tiny"),
            row.get("engine_start", "fresh"), row.get("lanes", 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", action="append", default=None, metavar="CONNECTOR,DTYPE[,CAPABILITIES]")
    parser.add_argument("--engine-python", default=sys.executable)
    parser.add_argument("--engine-start", choices=["host", "fresh"], default="host",
                        help="as --kv-engine-start: engines forked from one host per cell, or fresh processes")
    parser.add_argument("--engine-lanes", type=int, choices=[1, 2], default=2,
                        help="as --kv-engine-lanes: one engine at a time, or the independent roles on a second lane")
    args = parser.parse_args()
    cells = args.cell or ["ExampleConnector,auto,persistent", "ExampleConnector,fp8_e5m2,persistent",
                          "LMCacheMPConnector,auto,persistent", "LMCacheMPConnector,fp8_e5m2,persistent",
                          "conformance.zoo.good.in_engine:InEngineConnector,auto", "DecodeBenchConnector,auto",
                          "NixlConnector,auto,pd", "NixlConnector,auto,pd+hma,gemma3-hybrid-tiny"]
    fields = [(c.split(",") + ["", ""])[:4] for c in cells]  # connector, dtype, capabilities, model
    rows = [run_cell(f[0], f[1], f[2], f[3], args.engine_python, args.engine_start, args.engine_lanes) for f in fields]
    path = HERE / "results" / "engine_tier.json"
    kept = json.loads(path.read_text()) if path.is_file() else []
    ran = {_key(r) for r in rows}
    path.write_text(json.dumps([r for r in kept if _key(r) not in ran] + rows, indent=2) + "\n")
    for r in rows:
        print(f"{r['connector'][-32:]:<32} {r['kv_cache_dtype']:<9} {r['time_to_verdict_s']:>7}s to verdict, "
              f"{r['engine_starts']} engine starts, {r['vllm_imports']} vLLM imports ({r['engine_start']}, "
              f"{r['lanes']} lane(s))")
    print(f"written to {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
