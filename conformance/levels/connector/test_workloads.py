"""Connector-API workload clauses: the traffic production produces and the other scenarios do not,
where connectors written elsewhere broke (issue 37): long shared system prompts, requests with local
and external hits at once, and a bounded cache under pressure.

Each is one connector pair's lifetime through vLLM's real scheduler, as in ``test_lifecycle``. A
token's KV is a function of the prefix it attends to, so a loaded token is judged against what some
request with the same prefix up to it computed (``checks.unsourced_tokens``): a connector that keeps
one copy of a shared system prompt is right, one that serves a conversation another's tail is not.
A workload that did not happen (nothing evicted, no local hit, nothing loaded) is Not exercised.
"""

from __future__ import annotations

import random
from typing import Sequence

from conformance.levels.capabilities import PRESSURE_FACTOR
from conformance.levels.connector import checks
from conformance.levels.connector.checks import Source
from conformance.levels.connector.geometry import scenario_block
from conformance.levels.connector.harness import ConnectorHarness
from conformance.levels.connector.outcomes import connector_faults_fail, where
from conformance.levels.connector.runs import Phase, Run
from conformance.levels.connector.scenarios import (
    LOW_TOKEN,
    SPAN,
    UNIQUE_PREFIX,
    Prompts,
    scenario_lifetime,
    seeded_fill,
    unique_prompts,
)
from conformance.levels.connector.slots import by_block
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import clause, observe
from conformance.verdict.status import not_exercised, not_runnable

SYSTEM_PROMPTS = (1024, 4096)  # shared system prompts of chat and agent traffic, in tokens
LOCAL_BLOCKS = 2  # the blocks of a stored prompt vLLM's own prefix cache holds in api_mixed_hits


def _judge_loads(cid: str, context: str, sources: Sequence[Source], loaded: Run, rid: str,
                 prompt: Sequence[int]) -> int:
    """The tokens ``rid`` loaded, after checking that each holds KV a source with its prefix computed
    and that the connector claimed no token no source shares with it; 0 when it claimed nothing."""
    local, claimed = loaded.claims.get(rid, (0, 0))
    if claimed <= 0:
        return 0
    shared = max((checks.common_prefix(prompt, s.prompt) for s in sources), default=0)
    if local + claimed > shared:
        raise ClauseViolation(cid, f"{context}request {rid!r} ({len(prompt)} tokens) was claimed {claimed} tokens beyond "
                                   f"the {local} vLLM's own prefix cache held, {local + claimed} in all, but no stored "
                                   f"prompt shares more than its first {shared} tokens: the connector serves KV of "
                                   f"another prompt {where(loaded, 'claim')}")
    problems = checks.unsourced_tokens(sources, loaded, rid, prompt, local, local + claimed)
    if problems:
        raise ClauseViolation(cid, f"{context}request {rid!r} loaded {claimed} tokens (after {local} local hits) "
                                   f"{where(loaded, 'load')}: " + "; ".join(problems))
    return claimed


def _served(run: Run, rid: str, prompt: Sequence[int]) -> Source:
    """``rid`` as a source of KV for later loads: the tokens it did not get from a cache it computed."""
    return Source(run, rid, prompt, sum(run.claims.get(rid, (0, 0))))


def _tokens(n: int, vocab_size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(LOW_TOKEN, vocab_size) for _ in range(n)]


@clause("api_shared_prefix")
def test_shared_prefix(connector_api):
    bs = scenario_block()
    cid = "api_shared_prefix"
    api, loaded_any = connector_api, 0
    for length in SYSTEM_PROMPTS:
        system = unique_prompts(api.vocab_size, length, seed=length).stored
        tail = 2 * bs + 5  # what each conversation adds after the system prompt
        a, b = (system + _tokens(tail, api.vocab_size, seed) for seed in (length + 1, length + 2))
        # c is a but for its last whole block and the tokens after it; d extends a; e shares only
        # the system prompt with them (and its first tail token with no one).
        cut = (len(a) // bs - 1) * bs
        c = a[:cut] + _tokens(len(a) - cut, api.vocab_size, length + 3)
        d = a + _tokens(3 * bs, api.vocab_size, length + 4)
        e = system + _tokens(tail, api.vocab_size, length + 5)
        # Near misses (#53): a but for its first token (every block after it shared, none as a prefix), and
        # a but for one token mid-way through the system prompt (a sampled or elided hash of a long prompt).
        twins = Prompts(a, [], api.vocab_size)
        f, g = twins.twin(0), twins.twin(len(system) // 2)
        asked = {"b-again": b, "c-again": c, "a-again": a, "d-extends-a": d, "e-shares-the-system-prompt": e,
                 "f-a-but-its-first-token": f, "g-a-but-one-middle-token": g}
        stored = {"a": a, "b": b, "c": c}
        phases = [Phase([(rid, p)], seeded_fill(length + i)) for i, (rid, p) in enumerate(stored.items())]
        phases += [Phase([(rid, p)], seeded_fill(length + 10 + i)) for i, (rid, p) in enumerate(asked.items())]
        longest = max(map(len, asked.values())) + bs
        context = (f"with conversations that share a {len(system)}-token system prompt and differ after it (each "
                   f"stored alone, then asked for again alone, with prompts extending or sharing only part of them): ")
        with connector_faults_fail(cid, context):
            runs = scenario_lifetime(api, phases, num_blocks=-(-longest // bs) + 2,
                                     scheduling={"max_model_len": longest, "max_num_batched_tokens": longest})
        sources: list[Source] = []  # each request, in turn, is judged by those before it, then is one
        for run, (rid, prompt) in zip(runs, {**stored, **asked}.items()):
            loaded_any += _judge_loads(cid, context, sources, run, rid, prompt)
            sources.append(_served(run, rid, prompt))
    if not loaded_any:
        not_exercised("the connector loaded nothing for prompts that share a long system prompt "
                      "with stored ones, or are stored ones: no loaded byte was compared")


@clause("api_mixed_hits")
def test_mixed_hits(connector_api):
    bs = scenario_block()
    cid = "api_mixed_hits"
    api = connector_api
    ps = unique_prompts(api.vocab_size, 5 * bs + 3, 3 * bs, seed=61)
    stored, local = ps.stored, ps.stored[:LOCAL_BLOCKS * bs + 1]
    extended = stored + ps.neighbour[UNIQUE_PREFIX:]
    # "local" leaves the stored prompt's first blocks in vLLM's own prefix cache (its KV there is
    # its own); the next phase keeps that cache, so vLLM asks the connector for the rest only.
    phases = [Phase([("stored", stored)], seeded_fill(61)),
              Phase([("local", local)], seeded_fill(62)),
              Phase([("mixed", stored)], seeded_fill(63), fresh=False),
              Phase([("local-again", local)], seeded_fill(64)),
              Phase([("extended", extended)], seeded_fill(65), fresh=False)]
    context = (f"with the first {LOCAL_BLOCKS} blocks of a stored {len(stored)}-token prompt in vLLM's own prefix "
               "cache (a request of those tokens ran since), that prompt and one extending it asked for: ")
    # the cache holds the extending prompt beside the blocks vLLM keeps (a declared min span lengthens both)
    blocks = max(api.num_blocks, -(-len(extended) // bs) + LOCAL_BLOCKS + 2)
    with connector_faults_fail(cid, context):
        first, one, mixed, two, extension = scenario_lifetime(api, phases, num_blocks=blocks)
    sources = [_served(first, "stored", stored), _served(one, "local", local), _served(two, "local-again", local)]
    judged = []
    for run, rid, prompt in ((mixed, "mixed", stored), (extension, "extended", extended)):
        local_hits = run.claims.get(rid, (0, 0))[0]
        if local_hits and _judge_loads(cid, context, sources, run, rid, prompt):
            judged.append(f"{rid}: {local_hits} local, {run.claims[rid][1]} external")
    if not judged:
        hits = {rid: run.claims.get(rid) for run, rid in ((mixed, "mixed"), (extension, "extended"))}
        not_exercised(f"no request had both local and external hits ((local hits, tokens "
                      f"claimed) per request: {hits}): nothing loaded beyond vLLM's own prefix cache was compared")
    observe("requests with local and external hits: " + "; ".join(judged))


PRESSURE_BATCH = 4  # prompts a phase admits together
MAX_PRESSURE_PROMPTS = 48
PRESSURE_PROMPT_BLOCKS = (2, 64)  # each prompt's length, in blocks, at least and at most
# The workload every cache meets, capacity declared or not: prompts of 16 blocks, 12 MiB of KV on the
# suite's models in bf16 (6 MiB in fp8), more than a small cache (a 4 MiB LRU, a disk quota) holds.
REUSE_PROMPTS = 24
REUSE_PROMPT_BLOCKS = 16


@clause("api_cache_pressure")
def test_cache_pressure(connector_api):
    bs = scenario_block()
    cid = "api_cache_pressure"
    api: ConnectorHarness = connector_api
    capacity = api.connector.capacity_bytes
    assert capacity is not None  # the clause requires capacity=BYTES
    token_bytes = _kv_bytes_per_token(api, cid)
    low, high = PRESSURE_PROMPT_BLOCKS
    blocks = min(high, max(low, capacity // (8 * token_bytes * bs)))
    length = blocks * bs + 3 + SPAN[0]
    count = -(-PRESSURE_FACTOR * capacity // (length * token_bytes))
    if count > MAX_PRESSURE_PROMPTS:
        not_runnable(f"the declared capacity ({capacity} bytes) holds more than "
                     f"{MAX_PRESSURE_PROMPTS} prompts of {length} tokens ({length * token_bytes} bytes of KV each) can "
                     f"fill {PRESSURE_FACTOR} times over: configure the connector with a smaller bound for this run "
                     "and declare that capacity")
    stored_kv = count * length * token_bytes
    context = (f"with {count} prompts of {length} tokens ({stored_kv / 2**20:.1f} MiB of KV, {stored_kv / capacity:.1f} "
               f"times the declared capacity of {capacity} bytes) stored {PRESSURE_BATCH} at a time, then each asked "
               "for again, newest first: ")
    missed = _pressure(api, cid, context, count, length, newest_first=True)
    if not missed:
        not_exercised(f"{context}every prompt loaded back whole: nothing was evicted (is the "
                      "declared capacity what the connector's configuration holds?)")
    observe(f"{len(missed)} of {count} prompts evicted or partly missed ({', '.join(missed[:6])}"
            f"{', ...' if len(missed) > 6 else ''}), {count - len(missed)} loaded whole; "
            f"{stored_kv / capacity:.1f}x the declared capacity stored")


@clause("api_reuse_distance")
def test_reuse_distance(connector_api):
    bs = scenario_block()
    cid = "api_reuse_distance"
    api: ConnectorHarness = connector_api
    length = REUSE_PROMPT_BLOCKS * bs + 3 + SPAN[0]
    stored_kv = REUSE_PROMPTS * length * _kv_bytes_per_token(api, cid)
    context = (f"with {REUSE_PROMPTS} prompts of {length} tokens ({stored_kv / 2**20:.1f} MiB of KV; no capacity "
               f"declared, none assumed) stored {PRESSURE_BATCH} at a time, then each asked for again, oldest first "
               f"(the first after {REUSE_PROMPTS - 1} others were stored): ")
    missed = _pressure(api, cid, context, REUSE_PROMPTS, length, newest_first=False)
    observe(f"{len(missed)} of {REUSE_PROMPTS} prompts evicted or partly missed, {REUSE_PROMPTS - len(missed)} loaded "
            f"whole, after {stored_kv / 2**20:.1f} MiB of KV stored")


def _pressure(api: ConnectorHarness, cid: str, context: str, count: int, length: int, *, newest_first: bool) -> list[str]:
    """Store ``count`` prompts of ``length`` tokens, ask for each again (newest or oldest first), then the
    last asked once more each: every load is byte for byte a source's, and the last asked still load.
    The prompts that missed or loaded in part, oldest first."""
    bs = scenario_block()
    prompts = {f"p{i}": unique_prompts(api.vocab_size, length - UNIQUE_PREFIX, seed=700 + i, spanned=False).stored
               for i in range(count)}
    order = list(prompts)
    again = order[::-1] if newest_first else order
    batches = [order[i:i + PRESSURE_BATCH] for i in range(0, count, PRESSURE_BATCH)]
    asks = [again[i:i + PRESSURE_BATCH] for i in range(0, count, PRESSURE_BATCH)]
    phases = [Phase([(rid, prompts[rid]) for rid in batch], seeded_fill(800 + n)) for n, batch in enumerate(batches)]
    phases += [Phase([(f"{rid}-again", prompts[rid]) for rid in batch], seeded_fill(900 + n))
               for n, batch in enumerate(asks)]
    # The prompts of the last batch, each asked for once more in a phase of its own: a store that
    # completes asynchronously has the phases before its turn to land.
    recent = asks[-1]
    phases += [Phase([(f"{rid}-recent", prompts[rid])], seeded_fill(990 + n)) for n, rid in enumerate(recent)]
    knobs = {"max_model_len": length + bs, "max_num_batched_tokens": PRESSURE_BATCH * (length + bs)}
    with connector_faults_fail(cid, context):
        runs = scenario_lifetime(api, phases, num_blocks=PRESSURE_BATCH * (length // bs + 2) + 2, scheduling=knobs)
    stored_runs, asked_runs, finals = runs[:len(batches)], runs[len(batches):-len(recent)], runs[-len(recent):]
    sources = {rid: [_served(run, rid, prompts[rid])] for run, batch in zip(stored_runs, batches) for rid in batch}
    claimed = {}
    for run, batch in zip(asked_runs, asks):
        for rid in batch:
            claimed[rid] = _judge_loads(cid, context, sources[rid], run, f"{rid}-again", prompts[rid])
            sources[rid].append(_served(run, f"{rid}-again", prompts[rid]))
    whole = max(_judge_loads(cid, context, sources[rid], run, f"{rid}-recent", prompts[rid])
                for run, rid in zip(finals, recent))
    if not whole and not any(claimed.values()):
        not_exercised(f"{context}the connector loaded nothing for any prompt asked for again: no loaded byte was "
                      "compared, and a cache that never loads cannot be told from one that evicted everything")
    if not whole:
        raise ClauseViolation(cid, f"{context}then the {len(recent)} prompts asked for last ({', '.join(recent)}: just "
                                   f"loaded or stored again) were each asked for once more, and the connector claimed "
                                   f"nothing for any {where(finals[-1], 'recent prompts')}: under pressure it degrades "
                                   "to empty, not to a "
                                   f"miss of what it evicted (tokens loaded per prompt asked for again, in order: "
                                   f"{', '.join(f'{rid} {claimed[rid]}' for rid in again)})")
    return sorted((rid for rid, n in claimed.items() if n < whole), key=order.index)


def _kv_bytes_per_token(api: ConnectorHarness, cid: str) -> int:
    """Bytes of KV a token takes over every layer of the model's caches, read off a one-block probe."""
    bs = scenario_block()
    probe = unique_prompts(api.vocab_size, bs, seed=7).stored
    with connector_faults_fail(cid, "measuring a token's KV with a one-block prompt: "):
        (run,) = scenario_lifetime(api, [Phase([("probe", probe)], seeded_fill(7))])
    per_block = sum(by_block(view)[0].numel() * view.element_size() for view in run.caches.values())
    return max(1, per_block // run.block_size)
