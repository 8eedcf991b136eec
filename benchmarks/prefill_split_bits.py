"""Whether vLLM alone gives a prompt the same bits when it prefills it in chunks (no connector).

A load of N tokens has vLLM compute only the rest of the prompt. Where that changes vLLM's own
output bits, the engine level holds such a prompt to vLLM's own chunked prefill at N
(``conformance.levels.engine.compare.compare_runs``) instead of the one-pass baseline. This measures,
on this CPU, which chunkings keep a prompt's bits: each engine prefills every prompt in chunks of
``max_num_batched_tokens`` tokens; its first-token logprob bits and tokens are compared with an
engine that prefills in one pass. Writes ``benchmarks/results/prefill_split_bits.json``.

    python benchmarks/prefill_split_bits.py [--engine-python PY] [--model qwen3-tiny]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from conformance.levels.engine.cell import ENGINE_THREADS  # noqa: E402
from conformance.levels.engine.launch import EngineHost, run_engine  # noqa: E402
from conformance.levels.engine.prompts import prompt_batches  # noqa: E402
from conformance.levels.engine.specs import EngineSpec  # noqa: E402

LENGTHS = (64, 65, 96, 128)
CHUNKS = (32, 48, 60, 62, 63, 64, 95, 127)
ISA = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _model(python: str, name: str) -> str:
    code = "import sys; from conformance.levels.engine.models import materialise; print(materialise(sys.argv[1]))"
    return subprocess.run([python, "-c", code, name], capture_output=True, text=True, check=True,
                          cwd=HERE.parent).stdout.strip().splitlines()[-1]


def _cpu_flags() -> list[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in ISA if f in flags]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-python", default=sys.executable)
    parser.add_argument("--model", default="qwen3-tiny")
    args = parser.parse_args()
    rng = random.Random(0)
    boundaries = prompt_batches(32)["boundaries"]["prompts"]  # the engine level's own, at block size 32
    named = {**{f"random {n}": [rng.randrange(4, 2048) for _ in range(n)] for n in LENGTHS},
             **{f"boundaries[{i}]": boundaries[i] for i in (3, 4, 6)}}
    prompts = list(named.values())
    base: EngineSpec = {"model": _model(args.engine_python, args.model), "kv_cache_dtype": "auto", "block_size": 32,
                        "torch_threads": ENGINE_THREADS, "max_tokens": 3, "batches": [{"name": "p", "prompts": prompts}]}
    with tempfile.TemporaryDirectory() as tmp:
        host = EngineHost(args.engine_python, Path(tmp) / "host.log")
        try:
            runs = {chunk: run_engine({**base, "prefill_chunk": chunk} if chunk else base, Path(tmp),
                                      f"chunk{chunk}", timeout_s=300, python=args.engine_python, host=host)
                    for chunk in (0, *CHUNKS)}
        finally:
            host.close()
    failed = {c: r.error for c, r in runs.items() if not r.ok}
    if failed:
        raise SystemExit(f"engines failed: {failed}")
    one_pass = runs[0].requests("p")
    rows = []
    for chunk in CHUNKS:
        for name, want, got in zip(named, one_pass, runs[chunk].requests("p")):
            rows.append({"prompt": name, "prompt_len": want["prompt_len"], "chunk": chunk,
                         "chunks": -(-want["prompt_len"] // chunk),
                         "same_bits": got["tokens"] == want["tokens"] and got["steps"] == want["steps"],
                         "first_logprob": got["steps"][0]["logprob"], "one_pass": want["steps"][0]["logprob"]})
    out = {"model": args.model, "cpu_flags": _cpu_flags(), "versions": runs[0].result.get("versions"),
           "rows": rows}
    path = HERE / "results" / "prefill_split_bits.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    for row in rows:
        print(f"{row['prompt']:>15} ({row['prompt_len']:3d}) in chunks of {row['chunk']:3d}: "
              f"{'same' if row['same_bits'] else 'OTHER'} bits")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
