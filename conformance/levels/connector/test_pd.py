"""Connector-API P/D clauses: a producer engine hands KV to a consumer engine, per request.

vLLM's disaggregated prefill (``kv_role`` kv_producer / kv_consumer): the producer prefills a
request that carries ``do_remote_decode``; its connector's ``request_finished`` keeps the blocks and
returns kv_transfer_params, which vLLM's proxy hands to the consumer's request; the consumer's
connector loads from the producer (asynchronously, ``finished_recving``) and the producer frees the
blocks once its connector reports ``finished_sending``. ``ConnectorHarness.pd`` runs both connector
pairs side by side in this process; the producer's freed blocks are overwritten at once, as vLLM's
next request would, so a producer that lets vLLM free blocks it still serves is caught. Declared
with the ``pd`` capability; Disabled otherwise.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.contract.strategies import active_kv_cache_dtypes
from conformance.levels.connector import checks
from conformance.levels.connector.geometry import block, block_sizes, kv_dtype, one_geometry_refuses
from conformance.levels.connector.outcomes import connector_faults_fail, where
from conformance.levels.connector.runs import LayoutRefused, Run
from conformance.levels.connector.scenarios import (
    MAX_PROMPT_BLOCKS,
    TWINS,
    filler,
    kv_cache_dtypes,
    prompts,
    seeded_fill,
    unique_prompts,
)
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import clause, count_examples
from conformance.verdict.profiles import costly_example_settings

REMOTE = ("remote-0", "remote-1")  # prefilled by the producer, handed to the consumer
LOCAL = "local"  # the consumer's own request, handed no kv_transfer_params


def _pd(api, *, block_size: int, layout: str, dtype: str, stored: list[int], neighbour: list[int], fills,
        consumer_dtype: str | None = None, producer_gone: bool = False) -> tuple[Run, Run]:
    requests = [(REMOTE[0], stored), (REMOTE[1], neighbour), (LOCAL, stored[:1] + neighbour)]
    return api.pd(kv_cache_dtype=dtype, layout=layout, block_size=block_size, requests=requests, fills=fills,
                  storage=f"pd-{uuid.uuid4().hex[:12]}", consumer_dtype=consumer_dtype,
                  producer_gone=producer_gone)


def _width(kv_cache_dtype: str) -> int:
    return 1 if kv_cache_dtype.startswith("fp8") else 2


def _unclean(made: Run, loaded: Run, *, producer: bool = True) -> list[str]:
    """What either side's transfer reports and block accounting broke, in words."""
    sides = [("consumer", loaded)] + ([("producer", made)] if producer else [])
    return [f"{side}: {problem}" for side, run in sides for problem in run.misreports + run.held]


def _claimed_unread(loaded: Run) -> dict[str, int]:
    """Tokens claimed for a handed-over request outside the blocks reported as failed loads."""
    out = {}
    for rid in REMOTE:
        n = loaded.external_tokens.get(rid, 0)
        blocks = loaded.blocks.get(rid, [])[: -(-n // loaded.block_size)] if n else []
        if n and not set(blocks) <= loaded.load_errors:
            out[rid] = n
    return out


@clause("api_pd_roundtrip")
def test_pd_roundtrip(connector_api):
    _pd_probe(connector_api)
    _pd_examples(connector_api)


def _pd_probe(api) -> None:
    """A fixed pair first (block size 32 or the pinned one, the first layout the connector takes): a connector that
    cannot be built at all here is Not runnable on it, and one that can may then decline drawn
    configurations it refuses (a block size) without losing the clause."""
    ps = unique_prompts(api.vocab_size, 3 * 32 + 5, 2 * 32, seed=45)
    for layout in api.era.layouts():
        try:
            _judged_pd(api, block_size=block(32), layout=layout, dtype=kv_dtype("auto"), ps=ps,
                       fills=(seeded_fill(45), seeded_fill(46)), declined=(LayoutRefused,))
            return
        except LayoutRefused:
            continue


@count_examples
@costly_example_settings()
@given(data=st.data())
def _pd_examples(connector_api, data):
    block_size = data.draw(st.sampled_from(block_sizes()), label="block_size")
    dtype = data.draw(kv_cache_dtypes(), label="kv_cache_dtype")
    layout = data.draw(st.sampled_from(connector_api.era.layouts()), label="layout")
    ps = data.draw(prompts(vocab_size=connector_api.vocab_size, max_len=MAX_PROMPT_BLOCKS * block_size),
                   label="prompts")
    _judged_pd(connector_api, block_size=block_size, layout=layout, dtype=dtype, ps=ps,
               fills=(filler(data, dtype), filler(data, dtype)))


def _judged_pd(api, *, block_size, layout, dtype, ps, fills, declined=()) -> None:
    cid = "api_pd_roundtrip"
    with connector_faults_fail(cid, "in a P/D pair, ", declined):
        made, loaded = _pd(api, block_size=block_size, layout=layout, dtype=dtype, stored=ps.stored,
                           neighbour=ps.neighbour, fills=fills)
    context = where(loaded, "P/D")
    unhanded = [rid for rid in REMOTE if rid not in made.transfer_params]
    if unhanded:
        raise ClauseViolation(cid, f"the producer's request_finished returned no kv_transfer_params for "
                                   f"{unhanded}, prefilled with do_remote_decode: vLLM has nothing to hand the "
                                   f"consumer {context}")
    if loaded.external_tokens.get(LOCAL):
        raise ClauseViolation(cid, f"the consumer claimed {loaded.external_tokens[LOCAL]} tokens for request "
                                   f"{LOCAL!r}, which was handed no kv_transfer_params: KV nobody sent it {context}")
    for rid in REMOTE:
        n = loaded.external_tokens.get(rid, 0)
        problems = checks.loaded_differences(made, rid, loaded, rid, n)
        if problems:
            reused = sorted(made.reused & set(made.origin.get(rid, ())))
            why = (f"; the producer's blocks {reused[:8]} had been given back to vLLM (and reused) with no "
                   "finished_sending: request_finished must keep them (return True) until finished_sending "
                   "reports the request" if rid in made.freed_unsent else "")
            raise ClauseViolation(cid, f"request {rid!r}: the consumer loaded {n} tokens that differ from what the "
                                       f"producer computed {context}: " + "; ".join(problems) + why)
    unclean = _unclean(made, loaded)
    if unclean:
        raise ClauseViolation(cid, f"transfers did not end cleanly {context}: " + "; ".join(unclean[:3]))


@clause("api_pd_format_isolation")
def test_pd_format_isolation(connector_api):
    cid = "api_pd_format_isolation"
    one_geometry_refuses("a consumer of another kv_cache_dtype than its producer's")
    layout = connector_api.era.layouts()[0]
    ps = unique_prompts(connector_api.vocab_size, 3 * 32 + 5, 2 * 32, seed=41)
    twins = [d for d in TWINS if d in active_kv_cache_dtypes()]
    if not twins:
        pytest.skip("no kv_cache_dtype with a twin format in --kv-cache-dtypes")
    # one producer dtype per width (16-bit, fp8): each consumer is a pair of its own
    for dtype in dict.fromkeys(next(d for d in twins if _width(d) == w) for w in map(_width, twins)):
        twin = TWINS[dtype]
        with connector_faults_fail(cid, f"a {twin} consumer of a {dtype} producer: "):
            made, loaded = _pd(connector_api, block_size=32, layout=layout, dtype=dtype, stored=ps.stored,
                               neighbour=ps.neighbour, fills=(seeded_fill(41), seeded_fill(42)),
                               consumer_dtype=twin)
        claimed = _claimed_unread(loaded)
        if claimed:
            raise ClauseViolation(cid, f"a kv_cache_dtype={twin} consumer handed a {dtype} producer's "
                                       f"kv_transfer_params claimed {claimed} tokens and reported none of their "
                                       f"blocks failed: it took the other format's bytes as its own; refuse a "
                                       f"producer of another kv_cache_dtype (load nothing, or report the blocks) "
                                       + where(loaded, "P/D twin consumer"))
        unclean = _unclean(made, loaded)
        if unclean:
            raise ClauseViolation(cid, f"transfers did not end cleanly {where(loaded, 'P/D twin consumer')}: "
                                  + "; ".join(unclean[:3]))


@clause("api_pd_lost_peer")
def test_pd_lost_peer(connector_api):
    cid = "api_pd_lost_peer"
    ps = unique_prompts(connector_api.vocab_size, 3 * 32 + 5, 2 * 32, seed=43)
    context = "the producer was shut down before the consumer pulled: "
    with connector_faults_fail(cid, context):
        made, loaded = _pd(connector_api, block_size=block(32), layout=connector_api.era.layouts()[0],
                           dtype=kv_dtype("auto"), stored=ps.stored, neighbour=ps.neighbour,
                           fills=(seeded_fill(43), seeded_fill(44)), producer_gone=True)
    for rid in REMOTE:
        n = loaded.external_tokens.get(rid, 0)
        problems = checks.loaded_differences(made, rid, loaded, rid, n)
        if problems:
            raise ClauseViolation(cid, f"{context}the consumer claimed {n} tokens for {rid!r} whose bytes are not "
                                       "the producer's, and reported none of their blocks failed "
                                       "(get_block_ids_with_load_errors): vLLM computes on bytes nobody wrote "
                                       f"{where(loaded, 'lost producer')}: " + "; ".join(problems))
    unclean = _unclean(made, loaded, producer=False)
    if unclean:
        raise ClauseViolation(cid, context + "; ".join(unclean[:3]) + " " + where(loaded, "lost producer"))
