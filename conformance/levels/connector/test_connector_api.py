"""Connector-API clauses: the connector under test driven through vLLM's hooks on synthetic caches.

Each example is two engine lifetimes without an engine (see ``conformance.levels.connector``): a
store run whose "model" wrote drawn bit patterns into a cache of a drawn layout and dtype, and a
load run of a fresh connector pair into another cache filled with other patterns. The load run
schedules a neighbour request first, so the loaded request's blocks differ from the stored ones.

Over 450 lines: one test per clause of the store-and-load family, sharing the draw and the two-run
shape at the top; the lifecycle, workload and P/D clauses have modules of their own.
"""

from __future__ import annotations

import functools
import uuid
from typing import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.contract.strategies import MODEL_DTYPE_TWINS, active_kv_cache_dtypes
from conformance.levels.advice import advised, settle_advice
from conformance.levels.connector import checks
from conformance.levels.connector.geometry import (
    block,
    block_sizes,
    kv_dtype,
    one_geometry_refuses,
    scenario_block,
    second_geometry,
)
from conformance.levels.connector.outcomes import connector_faults_fail as _connector_faults_fail
from conformance.levels.connector.outcomes import where as _where
from conformance.levels.connector.pair import DRAIN_S
from conformance.levels.connector.runs import ConnectorRaised, LayoutRefused, NotBuilt, Phase, Run
from conformance.levels.connector.scenarios import (
    MAX_PROMPT_BLOCKS,
    SPAN,
    TWINS,
    UNIQUE_PREFIX,
    axis_dtypes,
    filler,
    kv_cache_dtypes,
    prompts,
    seeded_fill,
    unique_prompts,
)
from conformance.levels.connector.session import LMCACHE_CHUNK_SIZE
from conformance.levels.engine.models import NO_OTHER_MODEL
from conformance.levels.subject import ConnectorChoice
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import clause, count_examples, observe, running
from conformance.verdict.profiles import costly_example_settings
from conformance.verdict.status import not_exercised, not_runnable


def _costly(test):
    """The active profile's settings without shrinking under ci (see conformance.verdict.profiles)."""
    return costly_example_settings()(test)


def _draw_case(data: st.DataObject, api, *, dtypes=(), min_len: int = 1, min_neighbour_len: int = 1):
    block_size = data.draw(st.sampled_from(block_sizes()), label="block_size")
    dtype = data.draw(kv_cache_dtypes(dtypes), label="kv_cache_dtype")
    layout = data.draw(st.sampled_from(api.era.layouts()), label="layout")
    ps = data.draw(prompts(vocab_size=api.vocab_size, max_len=MAX_PROMPT_BLOCKS * block_size, min_len=min_len,
                           min_neighbour_len=min_neighbour_len), label="prompts")
    return block_size, dtype, layout, ps


def _store_and_load(api, fills, *, block_size, layout, stored, load, dtype, load_dtype=None,
                    neighbour, control=False) -> tuple[Run, Run]:
    """A store run of ``stored``, then a load run of ``neighbour`` and ``load`` over the same storage;
    ``fills`` write each run's caches. ``control``: where ``load`` loaded nothing, ``stored`` itself
    is asked for too, until once in the clause it loads (``_control_load``)."""
    load_dtype = load_dtype or dtype
    storage = f"example-{uuid.uuid4().hex[:12]}"
    store = api.run(kv_cache_dtype=dtype, layout=layout, block_size=block_size, requests=[("stored", stored)],
                    fill=fills[0], storage=storage)
    loaded = api.run(kv_cache_dtype=load_dtype, layout=layout, block_size=block_size,
                     requests=[("neighbour", neighbour), ("load", load)], fill=fills[1], storage=storage)
    if control and not loaded.external_tokens.get("load"):
        _control_load(api, dtype=dtype, layout=layout, block_size=block_size, prompt=stored, storage=storage,
                      fill=fills[1])
    return store, loaded


def _control_load(api, *, dtype, layout, block_size, prompt, storage, fill) -> None:
    """The stored prompt asked for again over storage as it was stored, once per clause until it
    loads: a clause about what a load does where it must not (or cannot) load whole, a prefix
    another prompt shares or storage the suite damaged, compares something only where an intact
    load does. A connector that loads nothing here leaves the clause Not exercised (the harness
    counts what each run loads), never a Pass."""
    test = running()
    if test is not None and test.loaded:
        return
    api.run(kv_cache_dtype=dtype, layout=layout, block_size=block_size, requests=[("control", prompt)],
            fill=fill, storage=storage)


def _drawn_fills(data: st.DataObject, dtype: str, load_dtype: str | None = None):
    """Drawn bit patterns for the store run's caches and the load run's."""
    return filler(data, dtype), filler(data, load_dtype or dtype)


def _drawn_roundtrip(api, data: st.DataObject, cid: str) -> tuple[Run, Run]:
    """A drawn case (block size, dtype, layout, prompts) stored, then loaded under the same prompt."""
    block_size, dtype, layout, ps = _draw_case(data, api)
    with _connector_faults_fail(cid):
        return _store_and_load(api, _drawn_fills(data, dtype), block_size=block_size, layout=layout,
                               stored=ps.stored, load=ps.stored, dtype=dtype, neighbour=ps.neighbour)


@clause("api_requirements")
def test_requirements(connector_api):
    from conformance.api_surface.requirements import check_requirements, connector_modules
    from conformance.api_surface.runtime import registered_module

    connector = connector_api.connector
    module = connector.module_path or registered_module(connector.name)
    if module is None:
        raise ClauseViolation("api_requirements", f"{connector.name!r} is not a connector the installed vLLM "
                                                  "registers; pass 'package.module:ClassName' for an external one")
    # A wrapper module's connector is read where its code is: every module of its classes outside vLLM.
    modules = connector_modules(module, connector.name) if connector.module_path else [module]
    for read in modules:
        missing = check_requirements(read)
        if missing:
            via = f" (read as the code {module}:{connector.name} runs)" if read != module else ""
            raise ClauseViolation("api_requirements", f"{read}{via} needs {len(missing)} name(s) the installed "
                                                      "vLLM lacks: " + "; ".join(map(str, missing)))
    observe(f"read {', '.join(modules)}")


@clause("api_save_load_roundtrip")
def test_save_load_roundtrip(connector_api):
    probe = _loads_something(connector_api)
    _loads_a_large_payload(connector_api, probe)
    _roundtrip_examples(connector_api)
    _every_dtype_once(connector_api)
    _across_block_sizes(connector_api)


def _across_block_sizes(api) -> None:
    """A prompt stored by a pair of 16-token blocks, asked for by a fresh pair of 32-token blocks over
    the same storage (an engine restarted with another block size): a token's KV does not depend on
    the block it sits in, so what loads is right token by token (or nothing loads); never bytes laid
    out for the other geometry."""
    cid = "api_save_load_roundtrip"
    if not second_geometry("the round trip from a pair of 16-token blocks to a fresh pair of 32-token blocks"):
        return
    ps = unique_prompts(api.vocab_size, 4 * 32 + 5, seed=70)
    storage, layout = f"geometry-{uuid.uuid4().hex[:12]}", api.era.layouts()[0]
    context = ("a prompt stored by a connector pair of 16-token blocks, then asked for by a fresh pair of 32-token "
               "blocks over the same storage (an engine restarted with another block size): ")
    try:
        with _connector_faults_fail(cid, context, declined=(NotBuilt, LayoutRefused)):
            store = api.run(kv_cache_dtype="auto", layout=layout, block_size=16, requests=[("stored", ps.stored)],
                            fill=seeded_fill(70), storage=storage)
            load = api.run(kv_cache_dtype="auto", layout=layout, block_size=32, requests=[("load", ps.stored)],
                           fill=seeded_fill(71), storage=storage)
    except (NotBuilt, LayoutRefused):  # a block size it declines: no such engine to restart
        return
    _as_saved(cid, store, load, context)


def _every_dtype_once(api) -> None:
    """After the drawn examples, one round trip per kv_cache_dtype of the axis (random bytes, so every
    format's special values among them): derandomized draws may miss a dtype."""
    cid = "api_save_load_roundtrip"
    for seed, dtype in enumerate(axis_dtypes(), 60):
        ps = unique_prompts(api.vocab_size, 3 * 16 + 5, seed=seed)
        context = f"the explicit example for kv_cache_dtype={dtype} (every dtype of the axis runs once): "
        try:
            with _connector_faults_fail(cid, context, declined=(NotBuilt, LayoutRefused)):
                store, load = _store_and_load(api, (seeded_fill(seed), seeded_fill(seed + 100)), block_size=block(16),
                                              layout=api.era.layouts()[0], stored=ps.stored, load=ps.stored,
                                              dtype=dtype, neighbour=ps.neighbour)
        except (NotBuilt, LayoutRefused):  # a dtype it declines, as a drawn example of it is rejected
            continue
        _as_saved(cid, store, load, context)


def _loads_something(api) -> Run:
    """A long prompt in the most common layout: a connector that never loads is not conformant."""
    cid = "api_save_load_roundtrip"
    ps = unique_prompts(api.vocab_size, 8 * 32 + 1, seed=1)
    prompt = ps.stored
    with _connector_faults_fail(cid):
        store, load = _store_and_load(api, (seeded_fill(1), seeded_fill(2)), block_size=block(32),
                                      layout=api.era.layouts()[0], stored=prompt, load=prompt, dtype=kv_dtype("auto"),
                                      neighbour=ps.neighbour)
    if load.external_tokens.get("load", 0) <= 0:
        raise ClauseViolation(cid, f"the second connector pair loaded nothing for a {len(prompt)}-token prompt "
                                   f"the first pair had been given to save {_where(load, 'probe')}: "
                                   + _why_nothing_loaded(api.connector, store, load))
    return load


def _why_nothing_loaded(connector: ConnectorChoice, store: Run, load: Run) -> str:
    """What the suite saw of a store followed by no load: saves still unreported when the storing
    pair's steps ran out (an async save slower than the bound), or a lookup that claimed nothing
    (and, where it declares no visibility delay, how to declare one)."""
    if store.held:
        return (f"the storing pair's saves were still unreported after {DRAIN_S:g}s of steps with nothing else to "
                f"do ({store.held[0]}); vLLM keeps stepping an engine whose requests wait for finished_sending, "
                "but a save that needs longer than that is not found by the next engine")
    asked = load.claims.get("load")
    return ("the storing pair's steps ended with every block given back, and the connector's lookup "
            f"(get_num_new_matched_tokens) {'claimed 0 tokens' if asked else 'was never answered with a count'} "
            "for it: what it saved (if anything) is not found under that prompt" + advised(settle_advice(connector)))


# One prompt's KV per layer past 16 MiB: where value-size caps, message frames, chunking and 32-bit
# length fields start to bite (a real model's LMCache chunk is megabytes per layer; the drawn
# examples stay under 512 KiB), prefilled in one step, in the largest block size of these that the
# connector accepts (LMCache's chunk must be a multiple of it); a one-geometry connector's own.
LARGE_LAYER_BYTES = 16 << 20
LARGE_BLOCK_SIZES = (64, 32, 16)


def _loads_a_large_payload(api, probe: Run) -> None:
    """The largest payload the level sends: a prompt whose KV is just over LARGE_LAYER_BYTES per layer
    (the model's geometry, measured on the probe's caches), saved by one pair and loaded by another."""
    cid = "api_save_load_roundtrip"
    capacity = api.connector.capacity_bytes
    if capacity is not None and LARGE_LAYER_BYTES * len(probe.caches) > capacity:
        return  # a bounded cache that declares it holds less evicts the payload whole: a miss is its right
    layer = next(iter(probe.caches.values()))
    token_bytes = layer.numel() * layer.element_size() // (probe.num_blocks * probe.block_size)
    for block_size in block_sizes(LARGE_BLOCK_SIZES):
        # past the size mid-block, as drawn prompts end (ExampleConnector misses a prompt one token
        # past a block boundary: api_partial_prefix's finding, not this probe's)
        tokens = LARGE_LAYER_BYTES // token_bytes + block_size // 2
        ps = unique_prompts(api.vocab_size, tokens - UNIQUE_PREFIX, seed=3)
        context = (f"a {len(ps.stored)}-token prompt ({len(ps.stored) * token_bytes / 2**20:.1f} MiB of KV per layer, "
                   f"{len(probe.caches)} layers, blocks of {block_size} tokens) saved by one pair and loaded by another")
        try:
            with _connector_faults_fail(cid, context + ": ", declined=(NotBuilt,)):
                store, load = _large_round_trip(api, ps.stored, block_size)
            break
        except NotBuilt:  # it declines this block size (it was built for the probe): the next one
            continue
    else:
        not_runnable(f"the connector declines every block size of {block_sizes(LARGE_BLOCK_SIZES)}")
    if load.external_tokens.get("load", 0) <= 0:
        # A cache bounded below the payload (a quota it keeps to itself, declared or not) may miss it:
        # a miss is never wrong bytes. What it does load is held to the bytes saved.
        observe(f"{context}: the second pair missed it (a cache bounded below {LARGE_LAYER_BYTES >> 20} MiB a layer "
                "may); the shorter prompts loaded")
        return
    _as_saved(cid, store, load, context + ": ")


def _large_round_trip(api, prompt: list[int], block_size: int) -> tuple[Run, Run]:
    blocks = -(-len(prompt) // block_size) + 2
    knobs = {"max_model_len": blocks * block_size, "max_num_batched_tokens": blocks * block_size}
    storage = f"large-{uuid.uuid4().hex[:12]}"
    runs = [api.lifetime(kv_cache_dtype=kv_dtype("auto"), layout=api.era.layouts()[0], block_size=block_size,
                         phases=[Phase([(rid, prompt)], seeded_fill(seed))], storage=storage, scheduling=knobs,
                         num_blocks=blocks)[0] for rid, seed in (("stored", 3), ("load", 4))]
    return runs[0], runs[1]


@count_examples
@_costly
@given(data=st.data())
def _roundtrip_examples(connector_api, data):
    cid = "api_save_load_roundtrip"
    store, load = _drawn_roundtrip(connector_api, data, cid)
    _as_saved(cid, store, load)


def _as_saved(cid: str, store: Run, load: Run, context: str = "") -> None:
    """Raise unless what the load run loaded for request "load" is what the store run saved for "stored"."""
    n = load.external_tokens.get("load", 0)
    problems = checks.loaded_differences(store, "stored", load, "load", n)
    if problems:
        raise ClauseViolation(cid, f"{context}loaded bytes differ from the saved ones "
                                   f"{_where(load, f'{n} tokens loaded')}: " + "; ".join(problems))


def _same_engine(api, fills, *, block_size, layout, ps, dtype) -> tuple[Run, Run]:
    """One connector pair: ``ps.stored`` stored; then, with the prefix cache reset and every block
    overwritten, the neighbour and the stored prompt again."""
    return api.lifetime(kv_cache_dtype=dtype, layout=layout, block_size=block_size,
                        phases=[Phase([("stored", ps.stored)], fills[0]),
                                Phase([("neighbour", ps.neighbour), ("load", ps.stored)], fills[1])],
                        storage=f"same-engine-{uuid.uuid4().hex[:12]}")


@clause("api_same_engine_roundtrip")
def test_same_engine_roundtrip(connector_api):
    cid = "api_same_engine_roundtrip"
    ps = unique_prompts(connector_api.vocab_size, 8 * 32 + 1, seed=5)
    with _connector_faults_fail(cid):
        store, load = _same_engine(connector_api, (seeded_fill(5), seeded_fill(6)), block_size=block(32),
                                   layout=connector_api.era.layouts()[0], ps=ps, dtype=kv_dtype("auto"))
    if load.external_tokens.get("load", 0) <= 0:
        raise ClauseViolation(cid, f"the connector pair given a {len(ps.stored)}-token prompt to save loaded nothing "
                                   f"for it once its blocks were freed {_where(load, 'probe')}: "
                                   + _why_nothing_loaded(connector_api.connector, store, load))
    _same_engine_examples(connector_api)


@count_examples
@_costly
@given(data=st.data())
def _same_engine_examples(connector_api, data):
    cid = "api_same_engine_roundtrip"
    block_size, dtype, layout, ps = _draw_case(data, connector_api)
    with _connector_faults_fail(cid):
        store, load = _same_engine(connector_api, _drawn_fills(data, dtype), block_size=block_size, layout=layout,
                                   ps=ps, dtype=dtype)
    n = load.external_tokens.get("load", 0)
    problems = checks.loaded_differences(store, "stored", load, "load", n)
    if problems:
        raise ClauseViolation(cid, "within one connector pair, after the prefix cache was reset and every block "
                                   f"overwritten, the reloaded bytes differ from the saved ones "
                                   f"{_where(load, f'{n} tokens loaded')}: " + "; ".join(problems))


@clause("api_no_collateral_writes")
@_costly
@given(data=st.data())
def test_no_collateral_writes(connector_api, data):
    cid = "api_no_collateral_writes"
    store, load = _drawn_roundtrip(connector_api, data, cid)
    saved = checks.changed_blocks(store, range(store.num_blocks))
    if saved:
        raise ClauseViolation(cid, f"saving changed the paged cache {_where(store, 'store run')}: "
                                   + "; ".join(saved))
    foreign = checks.changed_blocks(load, checks.unowned_blocks(load, "load"))
    if foreign:
        raise ClauseViolation(cid, "loading wrote outside the loaded request's blocks "
                                   f"{load.blocks.get('load')} (neighbour's: {load.blocks.get('neighbour')}) "
                                   f"{_where(load, 'load run')}: " + "; ".join(foreign))


def _edge(block_size: int) -> int:
    """The length of the stored prompt of the edges: whole blocks, longer than two of the chunks a
    chunked store keeps whole (the suite's LMCache server chunks by LMCACHE_CHUNK_SIZE), so each
    prompt asked at its edges has KV to load."""
    return (2 * LMCACHE_CHUNK_SIZE // block_size + 1) * block_size


def _edges(block_size: int) -> tuple[tuple[int, int], ...]:
    """Prompts at a stored prompt's block edges: (shared tokens, asked-for tokens). The next turn of a
    chat extends a prompt by a few tokens; one token past a whole block is where a lookup and a load
    that round a prompt's length to blocks differently part (ExampleConnector looks up the prompt less
    its last token, but loads the whole prompt's blocks: it claims a folder, then opens one never written)."""
    edge = _edge(block_size)
    return ((edge, edge + 1),  # the stored prompt and one token more
            (edge - block_size + 3, edge + 1),  # one token past its blocks, diverging in its last block
            (edge - block_size, edge),  # diverging at a block edge
            (edge - 1, edge - 1))  # the stored prompt less its last token


def _prompt_twins(block_size: int) -> tuple[tuple[int, int, str], ...]:
    """Near misses (#53): the stored prompt itself, but for one token or one block, early, in the middle
    or late (``Prompts.twin``; a negative position counts from the end). A key that skips or samples
    part of the prompt serves it the stored prompt's KV. (position, width, what changed)"""
    return ((0, 1, "its first token"), (2 * block_size, block_size, "its third block"),
            (-2, 1, "its next-to-last token"))


@clause("api_partial_prefix")
def test_partial_prefix(connector_api):
    bs = scenario_block()
    for i, (shared, length) in enumerate(_edges(bs)):
        ps = _edge_prompts(connector_api, seed=90 + i)
        # The declared min span lengthens every prompt by whole blocks: the edges stay edges.
        k = shared + SPAN[0]
        asked = ps.diverging(k, length - shared)[: length + SPAN[0]]
        _ask_partial(connector_api, ps, asked, k, seed=90 + i,
                     context=f"a {len(asked)}-token prompt sharing its first {k} tokens with a stored "
                             f"{len(ps.stored)}-token one (blocks of {bs}): ")
    for i, (position, width, where) in enumerate(_prompt_twins(bs)):
        ps = _edge_prompts(connector_api, seed=80 + i)
        position = position if position >= 0 else len(ps.stored) + position
        _ask_partial(connector_api, ps, ps.twin(position, width), position, seed=80 + i,
                     context=f"the stored {len(ps.stored)}-token prompt with {where} changed (tokens {position}.."
                             f"{position + width - 1}; blocks of {bs}), sharing its first {position} tokens: ")
    _partial_prefix_examples(connector_api)


def _edge_prompts(api, *, seed: int):
    """A stored prompt of the edges' length and its neighbour."""
    return unique_prompts(api.vocab_size, _edge(scenario_block()) - UNIQUE_PREFIX, 2 * scenario_block(), seed=seed)


def _ask_partial(api, ps, asked: list[int], k: int, *, seed: int, context: str) -> None:
    """``ps.stored`` stored, then ``asked`` (which shares its first ``k`` tokens) loaded: at most those."""
    cid = "api_partial_prefix"
    with _connector_faults_fail(cid, context):
        store, load = _store_and_load(api, (seeded_fill(seed), seeded_fill(seed + 5)), block_size=scenario_block(),
                                      layout=api.era.layouts()[0], stored=ps.stored, load=asked, dtype=kv_dtype("auto"),
                                      neighbour=ps.neighbour, control=True)
    _only_the_shared_prefix(cid, store, load, k, len(ps.stored), context)


@functools.partial(count_examples, seed_name="api_partial_prefix")  # the draws it made before its edges
@_costly
@given(data=st.data())
def _partial_prefix_examples(connector_api, data):
    cid = "api_partial_prefix"
    block_size, dtype, layout, ps = _draw_case(data, connector_api, min_len=2)
    k = data.draw(st.integers(0, len(ps.stored) - 1), label="shared_tokens")
    partial = ps.diverging(k, tail_len=data.draw(st.integers(1, 2 * block_size), label="tail_len"))
    with _connector_faults_fail(cid):
        store, load = _store_and_load(connector_api, _drawn_fills(data, dtype), block_size=block_size,
                                      layout=layout, stored=ps.stored, load=partial, dtype=dtype,
                                      neighbour=ps.neighbour, control=True)
    _only_the_shared_prefix(cid, store, load, k, len(ps.stored))


def _only_the_shared_prefix(cid: str, store: Run, load: Run, k: int, stored: int, context: str = "") -> None:
    """Raise unless request "load", sharing the first ``k`` of the ``stored`` tokens of "stored",
    loaded at most those, byte for byte as saved."""
    n = load.external_tokens.get("load", 0)
    what = f"{k} of {stored} tokens shared, {n} loaded"
    if n > k:
        raise ClauseViolation(cid, f"{context}loaded {n} tokens for a prompt that shares only its first {k} with the "
                                   f"stored one: tokens {k}..{n - 1} are another prompt's KV {_where(load, what)}")
    problems = checks.loaded_differences(store, "stored", load, "load", n)
    if problems:
        raise ClauseViolation(cid, f"{context}the shared prefix loaded other bytes {_where(load, what)}: "
                                   + "; ".join(problems))


def _batch_twins(block_size: int) -> tuple[tuple[int, int, str], ...]:
    """Batch-mates that are near misses of each other (#53): a prompt and its twin but for its first token
    (no prefix shared: every block of one in the other's place), or its last block (all but it shared),
    admitted in one step. A key that skips or samples part of a prompt files both under one name."""
    return (0, 1, "their first token"), (-block_size, block_size, "their last block")


@clause("api_concurrent_loads")
def test_concurrent_loads(connector_api):
    bs = scenario_block()
    for i, (position, width, where) in enumerate(_batch_twins(bs)):
        ps = _edge_prompts(connector_api, seed=60 + i)
        position = position if position >= 0 else len(ps.stored) + position
        _load_together(connector_api, [("first", ps.stored), ("twin", ps.twin(position, width))],
                       (seeded_fill(60 + i), seeded_fill(65 + i)), block_size=bs, dtype=kv_dtype("auto"),
                       layout=connector_api.era.layouts()[0],
                       context=f"two {len(ps.stored)}-token prompts that differ only in {where} (tokens {position}.."
                               f"{position + width - 1}), admitted in one step: ")
    _concurrent_examples(connector_api)


@functools.partial(count_examples, seed_name="api_concurrent_loads")
@_costly
@given(data=st.data())
def _concurrent_examples(connector_api, data):
    # Both prompts span whole blocks of every block size, so each has KV to load in every example.
    span = max(block_sizes())
    block_size, dtype, layout, ps = _draw_case(data, connector_api, min_len=span, min_neighbour_len=span)
    _load_together(connector_api, [("first", ps.stored), ("second", ps.neighbour)], _drawn_fills(data, dtype),
                   block_size=block_size, dtype=dtype, layout=layout)


def _load_together(api, batch: list[tuple[str, list[int]]], fills, *, block_size: int, dtype: str, layout,
                   context: str = "") -> None:
    """``batch`` admitted in one step, saved, then loaded together in the other order (so each request's
    blocks differ from the ones it saved from): each loads only KV a request with its prefix computed."""
    cid = "api_concurrent_loads"
    storage = f"concurrent-{uuid.uuid4().hex[:12]}"
    with _connector_faults_fail(cid, context):
        store = api.run(kv_cache_dtype=dtype, layout=layout, block_size=block_size, requests=batch,
                        fill=fills[0], storage=storage)
        load = api.run(kv_cache_dtype=dtype, layout=layout, block_size=block_size, requests=batch[::-1],
                       fill=fills[1], storage=storage)
    sources = [checks.Source(store, rid, prompt) for rid, prompt in batch]
    for rid, prompt in batch:
        n = load.external_tokens.get(rid, 0)
        problems = checks.unsourced_tokens(sources, load, rid, prompt, 0, n)
        if problems:
            loaded = {r: load.external_tokens.get(r, 0) for r, _ in batch}
            raise ClauseViolation(cid, f"{context}of {len(batch)} requests loading in one step ({loaded} tokens), the "
                                       f"{rid} request's loaded bytes are not what a request with its prefix saved "
                                       f"{_where(load, f'{n} tokens loaded')}: " + "; ".join(problems))


def _stored_then_damaged(api, cid: str, dtype: str, how: str, *, seeds: tuple[int, int, int]):
    """A 257-token prompt stored (block size 32 or the pinned one, the first layout) and asked for again intact, then
    what the store run left damaged ``how`` (``ConnectorHarness.damage``): (the store run, what the
    suite did, the load run of the prompt over the damaged storage, to call, the tokens the intact
    load loaded). Not runnable when the suite cannot reach the storage; the load run's exceptions
    are the caller's to judge. ``seeds``: the prompts' and the two fills'."""
    block_size, layout = block(32), api.era.layouts()[0]
    ps = unique_prompts(api.vocab_size, 8 * 32 + 1, seed=seeds[0])
    storage = f"damaged-{uuid.uuid4().hex[:12]}"
    with _connector_faults_fail(cid):
        store = api.run(kv_cache_dtype=dtype, layout=layout, block_size=block_size,
                        requests=[("stored", ps.stored)], fill=seeded_fill(seeds[1]), storage=storage)
        intact = api.run(kv_cache_dtype=dtype, layout=layout, block_size=block_size, requests=[("control", ps.stored)],
                         fill=seeded_fill(seeds[2]), storage=storage).external_tokens.get("control", 0)
    try:
        done = api.damage(storage, how)
    except NotImplementedError as exc:
        not_runnable(str(exc))

    def load_again() -> Run:
        return api.run(kv_cache_dtype=dtype, layout=layout, block_size=block_size,
                       requests=[("neighbour", ps.neighbour), ("load", ps.stored)], fill=seeded_fill(seeds[2]),
                       storage=storage)

    return store, done, load_again, intact


def _damage_was_read(how: str, load: Run, intact: int) -> None:
    """Not exercised where no load read what the suite damaged: the load after it took every token the
    intact load took, byte for byte, and reported no failed block (a copy the suite never touched
    served it), so what the connector does with damage was never tried. Read: a reported failed
    load, or a miss where the intact load hit."""
    n = load.external_tokens.get("load", 0)
    if intact and n >= intact and not load.load_errors:
        not_exercised(f"after the suite {how}, the connector loaded all {n} tokens an intact load takes, byte for "
                      "byte as stored, and reported no failed block: no load read the damaged object (a copy the suite "
                      "did not damage served them: a server's memory tier?), so what it does with damage was not tried")


@clause("api_damaged_storage")
@pytest.mark.parametrize("dtype", ["auto", "fp8_e5m2"])
def test_damaged_storage(connector_api, dtype):
    cid = "api_damaged_storage"
    if dtype not in active_kv_cache_dtypes():
        pytest.skip(f"kv_cache_dtype {dtype} is not in --kv-cache-dtypes")
    if kv_dtype(dtype) != dtype:
        one_geometry_refuses(f"storage written with kv_cache_dtype={dtype}, another geometry")
    store, how, load_again, intact = _stored_then_damaged(connector_api, cid, dtype, "flip_middle", seeds=(2, 3, 4))
    try:
        load = load_again()
    except ConnectorRaised as exc:
        raise ClauseViolation(cid, f"after the suite {how}, the connector raised in {exc} instead of "
                                   "reporting the damaged blocks (get_block_ids_with_load_errors): in an "
                                   "engine that exception kills the worker and every request with it") from exc
    n = load.external_tokens.get("load", 0)
    problems = checks.loaded_differences(store, "stored", load, "load", n)
    if problems:
        raise ClauseViolation(cid, f"after the suite {how}, the connector loaded {n} tokens and reported "
                                   f"{len(load.load_errors)} failed block(s): it served damaged bytes as KV "
                                   f"{_where(load, 'load after damage')}: " + "; ".join(problems))
    _damage_was_read(how, load, intact)


@clause("api_format_isolation")
def test_format_isolation(connector_api):
    one_geometry_refuses("two formats (kv_cache_dtypes, or model dtypes under auto) over one storage")
    twins = [d for d in TWINS if d in active_kv_cache_dtypes()]
    if not twins and "auto" not in active_kv_cache_dtypes():
        pytest.skip("no kv_cache_dtype with a twin format in --kv-cache-dtypes")
    evidence = {"same_format_loaded": False}
    if "auto" in active_kv_cache_dtypes():
        _model_dtype_twins(connector_api, evidence)
    if twins:
        _format_isolation_examples(connector_api, twins, evidence)


def _model_dtype_twins(api, evidence: dict[str, bool]) -> None:
    """Near misses (#53) of the format twins: under kv_cache_dtype=auto the cache takes the model's dtype,
    so the model served as bf16 and as fp16 (or fp32) writes other bytes under one config string. A
    pair of each twin over the same storage: the second loads nothing or reports the load failed."""
    cid = "api_format_isolation"
    block_size, layout = scenario_block(), api.era.layouts()[0]
    for i, (first, second) in enumerate(MODEL_DTYPE_TWINS):
        ps = _edge_prompts(api, seed=40 + i)
        storage = f"model-dtype-{uuid.uuid4().hex[:12]}"
        context = (f"kv_cache_dtype=auto with the model served as {first}, then as {second} over the same storage "
                   f"(one config string, other bytes): ")
        with _connector_faults_fail(cid, context):
            api.run(kv_cache_dtype="auto", layout=layout, block_size=block_size, requests=[("stored", ps.stored)],
                    fill=seeded_fill(40 + i), storage=storage, model_dtype=first)
            load = api.run(kv_cache_dtype="auto", layout=layout, block_size=block_size, model_dtype=second,
                           requests=[("neighbour", ps.neighbour), ("load", ps.stored)], fill=seeded_fill(45 + i),
                           storage=storage)
        control = functools.partial(api.run, kv_cache_dtype="auto", layout=layout, block_size=block_size,
                                    model_dtype=first, requests=[("load", ps.stored)], fill=seeded_fill(45 + i),
                                    storage=storage)
        _judge_twin_load(cid, load, block_size, evidence, f"the {first} pair", f"the {second} pair", control, context)


def _judge_twin_load(cid: str, load: Run, block_size: int, evidence: dict[str, bool], stored: str, asked: str,
                     control: Callable[[], Run], context: str = "") -> None:
    """``asked``, a pair of the twin format, asked for what ``stored`` stored (request "load"): it loaded
    nothing, or reported every block it claimed as a failed load. The twin's miss isolates only where the
    same format loads: a connector that loads nothing misses for every format (Not exercised, never a Pass;
    the harness counts what a run loads), so ``control``, the same format asked again, runs after a miss
    until once in the clause it loads."""
    n = load.external_tokens.get("load", 0)
    if n > 0 and not set(load.blocks.get("load", ())[: -(-n // block_size)]) <= load.load_errors:
        raise ClauseViolation(cid, f"{context}{asked} loaded {n} tokens that {stored} stored: it was served the "
                                   f"other format's bytes {_where(load, 'twin load')}")
    if n == 0 and not evidence["same_format_loaded"]:
        with _connector_faults_fail(cid, context):
            same = control()
        evidence["same_format_loaded"] = same.external_tokens.get("load", 0) > 0


@count_examples
@_costly
@given(data=st.data())
def _format_isolation_examples(connector_api, twins, evidence, data):
    cid = "api_format_isolation"
    block_size, dtype, layout, ps = _draw_case(data, connector_api, dtypes=twins,
                                               min_len=2 * max(block_sizes()))
    twin = TWINS[dtype]
    case = dict(block_size=block_size, layout=layout, stored=ps.stored, load=ps.stored, dtype=dtype,
                neighbour=ps.neighbour)
    with _connector_faults_fail(cid):
        store, load = _store_and_load(connector_api, _drawn_fills(data, dtype, twin), load_dtype=twin, **case)
    _judge_twin_load(cid, load, block_size, evidence, f"a {dtype} pair", f"a {twin} connector pair",
                     lambda: _store_and_load(connector_api, _drawn_fills(data, dtype), **case)[1])


@clause("api_model_isolation")
def test_model_isolation(connector_api):
    # A prompt stored by an engine of the model, asked for by an engine of another checkpoint of it
    # (same architecture and KV geometry, other weights, another directory: a fine-tune served beside
    # its base) over the same storage, then by the model's engine again.
    cid = "api_model_isolation"
    if connector_api.retrained is None:
        not_runnable(NO_OTHER_MODEL)
    other = connector_api.retrained()
    ps = unique_prompts(connector_api.vocab_size, 4 * 16 + 5, seed=80)
    storage, layout = f"models-{uuid.uuid4().hex[:12]}", connector_api.era.layouts()[0]
    bs, dtype = block(16), kv_dtype("auto")
    context = ("a prompt stored by an engine of the model, then asked for by an engine of another checkpoint of it "
               f"({other.name}: the same architecture, other weights, another directory) over the same storage: ")
    with _connector_faults_fail(cid, context):
        store = connector_api.run(kv_cache_dtype=dtype, layout=layout, block_size=bs,
                                  requests=[("stored", ps.stored)], fill=seeded_fill(80), storage=storage)
        crossed = connector_api.run(kv_cache_dtype=dtype, layout=layout, block_size=bs,
                                    requests=[("other-model", ps.stored)], fill=seeded_fill(81), storage=storage,
                                    model=other)
        again = connector_api.run(kv_cache_dtype=dtype, layout=layout, block_size=bs,
                                  requests=[("load", ps.stored)], fill=seeded_fill(82), storage=storage)
    n = crossed.external_tokens.get("other-model", 0)
    if n > 0 and not set(crossed.blocks.get("other-model", ())[: -(-n // bs)]) <= crossed.load_errors:
        raise ClauseViolation(cid, f"{context}it loaded {n} tokens of the first model's KV: another model's weights "
                                   "give every layer other K and V, so its requests are served wrong KV. Key stored "
                                   "KV by the model too (the served model's name or path, as vLLM's config gives it "
                                   "in model_config.model); or, where each model's engines get storage of their own, "
                                   "say so in the extra config: '{model}' where it names the place (e.g. "
                                   "\"shared_storage_path\": \"{storage}/{model}\"), which the suite fills with the "
                                   f"served model's directory name {_where(crossed, 'load by the other checkpoint')}")
    _as_saved(cid, store, again, context + "then asked for by the model's engine again")


@clause("api_load_errors_reported")
def test_load_errors_reported(connector_api):
    cid = "api_load_errors_reported"
    stored, how, load_again, intact = _stored_then_damaged(connector_api, cid, kv_dtype("auto"), "truncate",
                                                           seeds=(33, 33, 34))
    context = f"after the suite {how}, "
    with _connector_faults_fail(cid, context + "instead of reporting the blocks it could not read "
                                               "(get_block_ids_with_load_errors), which in an engine kills the worker: "):
        loaded = load_again()
    n = loaded.external_tokens.get("load", 0)
    if loaded.late_load_errors:
        raise ClauseViolation(cid, f"{context}the connector reported its failed blocks too late: "
                                   + "; ".join(loaded.late_load_errors[:2]) + ". By then the request had gone on "
                                   "with what the blocks held; report them from get_block_ids_with_load_errors in the "
                                   f"step of the load (or of its finished_recving) {_where(loaded, 'load of unreadable files')}")
    problems = checks.loaded_differences(stored, "stored", loaded, "load", n)
    if problems:
        raise ClauseViolation(cid, f"{context}the connector claimed {n} tokens and reported {len(loaded.load_errors)} "
                                   "failed block(s), yet the blocks hold bytes it never read: a load error it "
                                   f"swallowed {_where(loaded, 'load of unreadable files')}: " + "; ".join(problems))
    _damage_was_read(how, loaded, intact)
