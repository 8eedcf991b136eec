"""How an engine's outputs are compared with vLLM's own: bits, held to vLLM's own output with as
many tokens not computed where a load has it compute a prompt apart (``Reference``), or within a
tolerance measured where vLLM itself is not bit-reproducible (``Tolerance``); and what a run's
requests say they loaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from conformance.levels.engine.launch import EngineRun
from conformance.levels.engine.specs import Batch, Request, Step


@dataclass(frozen=True)
class Tolerance:
    """How far a logprob may move where vLLM itself is not bit-reproducible, and why."""
    logprob: float
    why: str


# vLLM-CPU's MLA computes a prefix it loaded through another kernel path (context-chunk SDPA plus
# an LSE merge) than one it recomputes, so a correct load is not bit-identical there. Measured on
# the smooth (initializer_range 0.02) MLA profile: a correct load moves a token's logprob by at
# most 0.0077 with the same tokens; KV poisoned at rest moves it by 0.12-0.28
# (docs/research/engine-prototype.md, sections 2 and 3). Between the two, with margin both ways:
MLA_CPU_LOGPROB_TOLERANCE = 0.05

# vLLM's kernels are not batch-invariant (``VLLM_BATCH_INVARIANT`` is Triton-only, and off by
# default): the same request decoded alone, in a pair or beside another's prefill gets other
# logprob bits. A connector that loads asynchronously (LMCacheMPConnector) parks each request
# until its KV arrives, so the loading engine runs a concurrent batch in other compositions than
# the baseline did. Measured with no connector at all (benchmarks/batch_composition_noise.py,
# benchmarks/results/batch_composition_noise.json, qwen3/llama3 x 6 dtypes): composition alone
# moves a logprob by at most 0.0004 (16-bit KV) and 0.030 (fp8 KV), and never a token. KV a
# connector failed to load for a batch-mate changes that request's first token, no near-tie
# (FirstLoadOnlyConnector, tests/levels/engine/test_engine_level.py). Prompts served one by one stay compared as
# bits, so a precision loss is still caught there. Above the noise, with a 3x margin:
BATCH_COMPOSITION_LOGPROB_TOLERANCE = 0.1


# A long prefix loaded at a connector's own granularity (LMCache's chunks of two blocks) holds KV
# computed as the storing engine computed it, which no engine of vLLM alone reproduces exactly, and
# on some CPUs a token's KV bits depend on the computation it was part of. Measured with no connector
# (benchmarks/prefix_history_noise.py, benchmarks/results/prefix_history_noise.json: the engine
# level's conversations after a 4,098-token system prompt, their first 4,032-4,192 tokens computed
# apart, AMX machine, auto and fp8_e5m2): a logprob moves by at most 0.032, never a token. Applied
# only to a load of at least LONG_PREFIX tokens whose bits match none of vLLM's own references, with a
# 3x margin (wrong KV for even one block moves a first token, as FirstLoadOnlyConnector's does):
PREFIX_HISTORY_LOGPROB_TOLERANCE = 0.1
LONG_PREFIX = 1024
PREFIX_HISTORY = Tolerance(PREFIX_HISTORY_LOGPROB_TOLERANCE, "the long-prefix tolerance: no engine of vLLM alone "
                           "computes a prefix exactly as the storing engine did")


def comparison_tolerance(run: EngineRun, batch: Batch) -> Tolerance | None:
    """None (compare bits) unless vLLM's own output for ``batch`` is not bit-reproducible across a
    load: MLA on CPU, or requests submitted together (their batch composition is the engine's)."""
    resolved = run.result.get("resolved") or {}
    found = []
    if resolved.get("use_mla") and resolved.get("device") == "cpu":
        found.append(Tolerance(MLA_CPU_LOGPROB_TOLERANCE, "the MLA-on-CPU tolerance"))
    if batch.get("together"):
        found.append(Tolerance(BATCH_COMPOSITION_LOGPROB_TOLERANCE, "the batch-composition tolerance"))
    return max(found, key=lambda t: t.logprob) if found else None


@dataclass(frozen=True)
class Reference:
    """vLLM's own output, no connector, for prompts whose first tokens it did not compute."""
    what: str  # how vLLM was made to skip them, for the message
    run: Callable[[], EngineRun | None]  # its engine, started when first asked; None: vLLM would not run it here
    from_cache: bool  # skipped through vLLM's prefix cache: a request that missed it is no reference

    def request(self, batch: str, i: int, cached: int) -> Request | None:
        """Request ``i`` of ``batch`` if it is a reference for ``cached`` tokens not computed."""
        run = self.run()
        if run is None:
            return None
        request = run.requests(batch)[i]
        return None if self.from_cache and request["num_cached_tokens"] != cached else request


def compare_runs(got: EngineRun, want: EngineRun, batch: str, tolerance: Tolerance | None = None,
                 skip_failed: bool = False,
                 references: Callable[[int, int], list[Reference]] | None = None) -> list[str]:
    """Differences between two runs' outputs for ``batch``, per prompt: tokens and logprob *bits*,
    or, given a ``tolerance``, ``within_tolerance``; ``skip_failed`` leaves out requests ``got``'s
    engine failed (finish_reason "error").

    A prompt served with its first N tokens loaded has vLLM compute only the rest, and on some CPUs
    (measured on an AMX machine: benchmarks/prefill_split_bits.py) the bits of a token depend
    on how many were computed with it, connector or not (docs/engine-level.md). Where the bits differ,
    ``references(N, prompt_len)`` are asked for vLLM's own output with N tokens not computed (the
    same computation, by vLLM alone): a prompt equal to one bit for bit loaded what vLLM computes.
    """
    problems = []
    for i, (g, w) in enumerate(zip(got.requests(batch), want.requests(batch), strict=True)):
        if skip_failed and g.get("finish_reason") == "error":
            continue
        where = f"{batch}[{g['idx']}] (prompt {g['prompt_len']} tokens, {g['num_cached_tokens']} cached)"
        if tolerance is not None:
            problem = within_tolerance(g["steps"], w["steps"], tolerance)
            if problem:
                problems.append(f"{where}: {problem}")
            continue
        problem = bits_differ(g, w)
        cached = not_computed(g)
        if problem and references is not None and 0 < cached:
            held, matched = [], False  # each reference in turn: its engine starts only if the ones before differ
            for ref in references(cached, g["prompt_len"]):
                request = ref.request(batch, i, cached)
                matched = request is not None and not bits_differ(g, request)
                if matched:
                    break
                held.append((ref, request))
            if matched:
                continue
            loose = within_tolerance(g["steps"], w["steps"], PREFIX_HISTORY) if cached >= LONG_PREFIX else None
            if cached >= LONG_PREFIX and loose is None:
                continue
            ran = [ref.what for ref, r in held if r is not None]
            unrun = [ref.what for ref, r in held if r is None]
            if ran:
                problem += ", nor is it " + " or ".join(ran)
            if unrun:
                problem += f" ({' or '.join(unrun)} could not be run here)"
            if loose is not None:
                problem += f"; nor within {PREFIX_HISTORY_LOGPROB_TOLERANCE:g} of it: {loose}"
        if problem:
            problems.append(f"{where}: {problem}")
    return problems


def request_outcome(request: Request) -> dict[str, Any]:
    """What one request came to, as the results keep it (no logprobs: the tokens say the outcome)."""
    return {"batch": request["batch"], "idx": request["idx"], "phase": request.get("phase", 0),
            "prompt_len": request["prompt_len"], "cached": request["num_cached_tokens"],
            "external": external_hits_of(request), "finish_reason": request.get("finish_reason"),
            "tokens": request.get("tokens")}


def external_hits_of(request: Request) -> int:
    """The external prefix-cache hits vLLM counted for a request served alone."""
    return int((request.get("counters_delta") or {}).get("external_prefix_cache_hits", 0))


def not_computed(request: Request) -> int:
    """The prompt tokens vLLM did not compute for a request served alone: its prefix-cache hits, or,
    where vLLM reports none (a P/D consumer's remote prefill), the external hits counted for it; a
    prompt loaded whole still has vLLM compute its last token."""
    return min(request["num_cached_tokens"] or external_hits_of(request), request["prompt_len"] - 1)


def bits_differ(got: Request, want: Request) -> str | None:
    """How one request's tokens or logprob bits differ from another's, or None."""
    if got["tokens"] != want["tokens"]:
        return f"tokens {got['tokens']}, but the baseline produced {want['tokens']}"
    for step, (a, b) in enumerate(zip(got["steps"], want["steps"])):
        if a["logprob"] != b["logprob"] or a["top"] != b["top"]:
            return (f"step {step} logprob bits {a['logprob']}, but the baseline has {b['logprob']} "
                    f"(top-k differs: {a['top'] != b['top']})")
    return None


def within_tolerance(got: list[Step], want: list[Step], tolerance: Tolerance) -> str | None:
    """Why two greedy decodes are more than rounding apart, or None.

    Each step's chosen-token logprob must be within ``tolerance`` of the baseline's. The decodes may
    part only at a near-tie: each run's token is in the other's top-k, within ``tolerance`` of the
    token it chose; after that they condition on different tokens and are not compared further.
    """
    limit = tolerance.logprob
    for step, (a, b) in enumerate(zip(got, want)):
        top_a = {int(t): float.fromhex(lp) for t, lp in a["top"]}
        top_b = {int(t): float.fromhex(lp) for t, lp in b["top"]}
        lp_a, lp_b = float.fromhex(a["logprob"]), float.fromhex(b["logprob"])
        if a["token"] != b["token"]:
            broken = _tie_broken(a, b, top_a, top_b, limit)
            if broken is None:  # a near-tie: after it the decodes condition on different tokens
                return None
            return (f"step {step} token {a['token']} (logprob {lp_a:.6g}), but the baseline chose {b['token']} "
                    f"(logprob {lp_b:.6g}), not a near-tie within {limit:g} ({tolerance.why}): a near-tie has each "
                    f"run's token in the other's top-{len(top_b)} within {limit:g} of the token it chose; " + broken)
        delta = abs(lp_a - lp_b)
        if not delta <= limit:  # NaN is never within
            return (f"step {step} logprob {lp_a:.6g}, but the baseline has {lp_b:.6g} "
                    f"(|delta| {delta:.3g} > {limit:g}, {tolerance.why})")
    return None


def _tie_broken(a: Step, b: Step, top_a: dict[int, float], top_b: dict[int, float],
                limit: float) -> str | None:
    """Which half of the near-tie rule two diverging steps break, in numbers; None where both hold
    (each run's token in the other's top-k, within ``limit`` of the token that run chose)."""
    for other, top, chosen, who in ((b, top_a, a, "this run's"), (a, top_b, b, "the baseline's")):
        if other["token"] not in top:
            return f"the other's token {other['token']} is not in {who} top-{len(top)}"
        gap = abs(top[other["token"]] - float.fromhex(chosen["logprob"]))
        if gap > limit:
            return f"in {who} top-k the other's token {other['token']} is {gap:.3g} below the one it chose"
    return None


def external_hits(run: EngineRun, batch: str | None = None) -> float:
    """External prefix-cache hits vLLM counted for ``batch`` (or all), each generate call once."""
    deltas = {(r["batch"], r.get("phase", 0), r["group"]): r["counters_delta"] for r in run.result.get("requests", [])
              if batch is None or r["batch"] == batch}
    return sum(d.get("external_prefix_cache_hits", 0) for d in deltas.values())
