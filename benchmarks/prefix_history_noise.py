"""How far vLLM alone moves a long prompt's output when its cached prefix was computed differently
(no connector): the noise a correct load of a long shared prefix may show on this CPU.

A connector stores KV as the storing engine computed it: a long system prompt as part of the first
conversation, a later conversation's tail after a local hit. Loaded into a fresh engine at its own
granularity (LMCache's chunks of two blocks), no engine of vLLM alone computes exactly that, and on
some CPUs a token's KV bits depend on the computation it was part of. This serves the engine
level's own conversations after a 4,098-token system prompt (``prompt_batches(...)["system"]``)
one by one as the baseline does, then again with vLLM's own prefix cache holding each
conversation's first N tokens computed alone (``cached_prefix``) for N around the prompt, and
records, per N, whether the tokens agree and the largest logprob difference over the steps.
Writes ``benchmarks/results/prefix_history_noise.json``.

    python benchmarks/prefix_history_noise.py [--engine-python PY] [--model qwen3-tiny]
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

from benchmarks.prefill_split_bits import _cpu_flags, _model  # noqa: E402
from conformance.levels.engine.cell import ENGINE_THREADS  # noqa: E402
from conformance.levels.engine.launch import EngineHost, run_engine  # noqa: E402
from conformance.levels.engine.prompts import prompt_batches  # noqa: E402
from conformance.levels.engine.specs import EngineSpec  # noqa: E402

CACHED = (4032, 4096, 4128, 4160, 4192)  # tokens of the prefix in vLLM's cache, computed alone
DTYPES = ("auto", "fp8_e5m2")


def _positions(model: str) -> int:
    return int(json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings", 1024))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-python", default=sys.executable)
    parser.add_argument("--model", default="qwen3-tiny")
    args = parser.parse_args()
    model = _model(args.engine_python, args.model)
    system = prompt_batches(32, positions=_positions(model))["system"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        host = EngineHost(args.engine_python, Path(tmp) / "host.log")
        try:
            for dtype in DTYPES:
                base: EngineSpec = {"model": model, "kv_cache_dtype": dtype, "block_size": 32, "torch_threads": ENGINE_THREADS,
                                    "max_model_len": _positions(model), "batches": [system]}
                runs = {n: run_engine({**base, "cached_prefix": n} if n else base, Path(tmp), f"{dtype}-{n}",
                                      timeout_s=600, python=args.engine_python, host=host) for n in (0, *CACHED)}
                if not runs[0].ok:
                    rows.append({"kv_cache_dtype": dtype, "not_run": runs[0].error.splitlines()[0][:200]})
                    continue
                for n in CACHED:
                    for want, got in zip(runs[0].requests("system"), runs[n].requests("system")):
                        if got["num_cached_tokens"] != n:
                            continue  # the prompt is not longer than n: vLLM computed it whole
                        deltas = [abs(float.fromhex(a["logprob"]) - float.fromhex(b["logprob"]))
                                  for a, b in zip(got["steps"], want["steps"])]
                        rows.append({"kv_cache_dtype": dtype, "prompt_len": want["prompt_len"], "cached": n,
                                     "same_tokens": got["tokens"] == want["tokens"],
                                     "same_bits": got["steps"] == want["steps"], "max_logprob_delta": max(deltas)})
        finally:
            host.close()
    out = {"model": args.model, "cpu_flags": _cpu_flags(), "rows": rows,
           "max_logprob_delta": {d: max((r["max_logprob_delta"] for r in rows if r.get("kv_cache_dtype") == d
                                         and "max_logprob_delta" in r), default=None) for d in DTYPES}}
    path = HERE / "results" / "prefix_history_noise.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    for row in rows:
        print(row)
    print(f"largest logprob delta per dtype: {out['max_logprob_delta']}; written to {path}")


if __name__ == "__main__":
    main()
