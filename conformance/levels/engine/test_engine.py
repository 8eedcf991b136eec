"""Engine-level clauses: a real vLLM with the connector under test, against its own baseline.

Every scenario reads runs of one cell (see ``conformance.levels.engine.cell``): engines start once
per role and are shared. "Bit-identical" compares tokens and the float bits of logprobs (a prompt
vLLM computed apart from its loaded tokens to vLLM's own output with as many tokens not computed,
where the CPU makes that differ: ``compare_runs``), except where vLLM itself is not bit-reproducible across
a load: MLA on CPU, and a concurrent batch (vLLM is not batch-invariant, and an async load changes
the batch's composition). There tokens must
match and each logprob stay within a measured tolerance (``comparison_tolerance``), and the
message names it. Prompts served one by one are always compared as bits.

Over 450 lines: one short test per engine clause, each reading the same cell's runs; what they share
(the cell, the comparisons) lives in ``cell``, ``roles``, ``prompts`` and ``compare``. A ``NotRunnable``
raised anywhere below a test ends it Not runnable (the plugin maps it).
"""

import os

import pytest

from conformance.contract.spec import KVSpec
from conformance.levels.advice import advised, span_advice
from conformance.levels.capabilities import PRESSURE_FACTOR
from conformance.levels.diagnosis import cannot_run_here, missing_dependency, refuses_platform
from conformance.levels.engine.child import DRAIN_S
from conformance.levels.engine.compare import compare_runs, external_hits, external_hits_of
from conformance.levels.engine.prompts import (
    ADAPTED,
    ADAPTER_VERSION,
    AFTER_ABORT,
    BASE_ON_ADAPTER,
    BOUNDARIES,
    CONCURRENT,
    EMBEDS_AGAIN,
    EMBEDS_AS_TOKENS,
    EXTENDS,
    IMAGE_AGAIN,
    LOADED,
    OTHER_ADAPTER,
    OTHER_EMBEDS,
    OTHER_IMAGE,
    OTHER_TENANT,
    PRESSURE,
    PRESSURE_AGAIN,
    REUSED,
    SALT,
    SALTED,
    STORED,
    SYSTEM,
    THIRD_SALT,
    TOKENS_AS_EMBEDS,
    UNTENANTED,
    system_tokens,
)
from conformance.levels.engine.roles import (
    BLOCK_BASELINE,
    COLD_ROLES,
    EMBEDS,
    IMAGES,
    LORA,
    OWN_SETTINGS,
    PREFIX_ROLES,
    PRESSURE_ROLES,
    RETRAINED_LOAD,
    REUSE_ROLES,
    SAME_ENGINE,
    TP_BASELINE,
)
from conformance.levels.engine.specs import DEFAULT_MODEL_DTYPE
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import clause, count_load, observe
from conformance.verdict.guard import HarnessError
from conformance.verdict.status import NotRunnable, not_exercised, not_runnable
from conformance.vocabulary import TENSOR_PARALLEL


@pytest.fixture
def cell(engine_cell):
    """The session's engine cell (``plugin.fixtures.engine_cell``), by its short name."""
    return engine_cell


def _connector_run(cell, role, clause_id, cold_check=True):
    """A connector engine's run; its failure is the connector's (Fail), with the engine's log. The
    first engine over empty storage must claim no external hit (``cold_check``). None starts where
    vLLM cannot run the cell's settings without a connector (the baseline): Not runnable, as it would
    end anyway, without an engine start per clause (half a minute each on releases that spawn workers)."""
    cell.baseline()
    engine = _vetted(cell, cell.run(role), clause_id)
    # Its first batch: prompts served one by one that nothing over its storage had seen.
    first = next((r["batch"] for r in engine.phase(0).result.get("requests", ())), None)
    claimed = external_hits(engine.phase(0), first) if cold_check and role in COLD_ROLES and first else 0
    if claimed:
        raise ClauseViolation(clause_id, (
            f"{cell.connector.label} claims KV it never stored: engine {role}, the first over its empty storage, "
            f"counted {claimed:g} external prefix-cache hit tokens for prompts no engine over its storage had seen "
            f"(its first batch, {first!r}, served one by one); whatever it loaded there is not KV any engine computed "
            "over it"))
    return engine


def _vetted(cell, engine, clause_id):
    """``engine``'s run, if it ran: one that could not start with the connector is Not runnable, one
    killed at its deadline an Error, any other failure the connector's (Fail, with the engine's log)."""
    if not engine.ok:
        _judgeable(cell, engine)
        raise ClauseViolation(clause_id, f"the engine with {cell.connector.label} failed: {engine.describe_failure()}")
    return engine


def _judgeable(cell, engine):
    """Return only if ``engine``'s failure is the connector's to answer for: raise the suite's Error
    for a failure that says nothing about it, and Not runnable where vLLM cannot run the engine's
    settings here, the connector could not start, or it asked for a device this machine lacks."""
    if engine.suite_error:
        raise HarnessError(engine.describe_failure())
    missing = missing_dependency(cell.connector.label, engine.error)
    if missing is not None:
        raise HarnessError(f"engine {engine.role}: {missing}")
    if engine.role in OWN_SETTINGS:  # settings the baseline does not vouch for: vLLM's own, or the connector's?
        control = cell.without_connector(engine.role)
        if not control.ok:
            raise NotRunnable(
                f"vLLM cannot run engine {engine.role}'s settings here without any connector either: "
                f"{control.error.splitlines()[0] if control.error else control.describe_failure()}")
    if "t_engine_start_s" not in engine.result and "vllm_version" in engine.result:  # vLLM ran; no KV moved
        raise NotRunnable(cannot_run_here(cell.connector.label, f"engine {engine.role}: {engine.error}"))
    if refuses_platform(engine.error):  # its data path asked for a device this machine lacks
        raise NotRunnable(f"{cell.connector.label} needs a device this machine lacks: engine "
                          f"{engine.role} failed with {engine.error.splitlines()[0] if engine.error else ''}")


def _pd_pair(cell, clause_id):
    """(baseline, producer, consumer) of the cell's P/D pair; Not runnable when vLLM cannot run the cell."""
    base = cell.baseline()
    producer, consumer = cell.run_pd()
    _vetted(cell, producer, clause_id)
    return base, producer, _vetted(cell, consumer, clause_id)


def _connector_engines(cell, clause_id):
    """The connector engines the cell runs anyway, for the clauses that check every engine: the
    same-engine one (a prefix cache), the store and load ones (persistent), the P/D pair."""
    applies = cell.connector.applies
    roles = ((SAME_ENGINE,) if "cache" in applies else ()) + (("store", "load") if "persistent" in applies else ())
    engines = [_connector_run(cell, role, clause_id, cold_check=False) for role in roles]
    if "pd" in applies:
        engines += _pd_pair(cell, clause_id)[1:]
    return engines


def _identical(cell, got, want, batches, clause_id, what, skip_failed=False):
    """Raise unless ``got``'s outputs match ``want``'s; ``skip_failed`` exempts requests the engine
    failed (finish_reason "error"): a clear failure, not an output."""
    count_load(sum(external_hits(got, b) for b in batches))
    problems = [p for b in batches for p in compare_runs(got, want, b, cell.tolerance(want, b), skip_failed,
                                                         references=lambda n, length: cell.references(
                                                             want, n, length, loaded=got.role))]
    if problems:
        raise ClauseViolation(clause_id, f"{what} differs from the no-connector baseline in "
                                         f"{len(problems)} request(s): " + "; ".join(problems[:3]))


def _why_nothing_loaded(cell) -> str:
    """What the suite saw of engine A when engine B loaded nothing: saves still unreported when its
    steps ran out, or every block back and still nothing found."""
    store = cell.run("store").result
    if store.get("drained") is False:
        return (f"engine A still held blocks {DRAIN_S:g}s after its last request, stepping with nothing else to "
                f"do: {cell.connector.label}'s saves were never reported in finished_sending (request_finished "
                "returned True), so engine B started before they were done, and vLLM never frees those blocks")
    return (f"engine A stepped until every block was back (its saves reported), and {cell.connector.label} "
            "found none of those prompts for engine B: it saved nothing it could find again")


def _span_advice(cell, run) -> str:
    """For a connector that loaded nothing: the min-span advice the prompts ``run`` asked for support."""
    return advised(span_advice(cell.connector, max((r["prompt_len"] for r in run.result["requests"]), default=0)))


def _stored_then_loaded(cell, clause_id, pair=("store", "load")):
    """(baseline, load) runs, after the ``pair``'s store engine ran; Not runnable when vLLM cannot run the cell."""
    base = cell.baseline()
    _connector_run(cell, pair[0], clause_id)
    return base, _connector_run(cell, pair[1], clause_id)


@clause("engine_tensor_parallel")
def test_engine_tensor_parallel(cell):
    # Each rank holds its share of the KV heads: a key without the rank (or the world size) has the
    # ranks overwrite each other's KV, or serve one rank another's heads.
    cid = "engine_tensor_parallel"
    ranks, cores = cell.tensor_parallel, len(os.sched_getaffinity(0))
    if ranks < 2:
        pytest.skip(f"asked for with {TENSOR_PARALLEL} N (N > 1): three more engines of N ranks each")
    if cores < ranks:
        raise NotRunnable(f"an engine of {ranks} tensor-parallel ranks binds each rank to a core of its own; "
                          f"this machine gives this run {cores}")
    base = cell.baseline(TP_BASELINE)
    _connector_run(cell, "tp_store", cid)
    load = _connector_run(cell, "tp_load", cid)
    _identical(cell, load, base, LOADED, cid,
               f"engine B of {ranks} tensor-parallel ranks ({external_hits(load):g} external hit tokens), loading what "
               f"engine A of {ranks} ranks stored,")


@clause("engine_block_size")
def test_engine_block_size(cell):
    # A token's KV does not depend on the block it sits in: an engine restarted with another block size
    # over the same storage is served each token's own KV, or nothing; never rows of the old geometry.
    # A miss passes only where the same block size loads (engine_store_then_load's engine B: shared).
    cid = "engine_block_size"
    cell.one_geometry_refuses(cid)
    base = cell.baseline(BLOCK_BASELINE)
    store = _connector_run(cell, "bs_store", cid)
    load = _connector_run(cell, "bs_load", cid)
    stored, asked = (run.result.get("resolved", {}).get("block_size") for run in (store, load))
    if stored == asked:
        not_exercised(f"vLLM ran both engines at block size {stored}, asked for {cell.block_size} "
                      f"and {cell.other_block_size}: this model's attention backend here takes no other")
    what = (f"engine B at block size {asked} ({external_hits(load):g} external hit tokens), asking for what "
            f"engine A stored at block size {stored},")
    try:
        _identical(cell, load, base, LOADED, cid, what)
    except ClauseViolation as exc:
        raise ClauseViolation(cid, exc.detail + _block_size_not_codec(cell, stored)) from None
    count_load(external_hits(_connector_run(cell, "load", cid)))


def _block_size_not_codec(cell, stored) -> str:
    """Under a lossy connector's tolerance, a block-size failure is not its codec's loss where the same
    connector's loads at the storing block size are within it: say so, or nothing."""
    tolerance, same, base = cell.connector_tolerance, cell.run("load"), cell.baseline()
    if tolerance is None or not same.ok or not external_hits(same) or any(
            compare_runs(same, base, b, cell.tolerance(base, b)) for b in LOADED):
        return ""
    return (f". The cause is the block size, not the codec: at block size {stored} the same connector's loads "
            f"(engine_store_then_load's engine B, {external_hits(same):g} external hit tokens) are within "
            f"{tolerance.why}, so the rows served here were laid out for another block size")


@clause("engine_same_engine_reload")
def test_engine_same_engine_reload(cell):
    cid = "engine_same_engine_reload"
    base = cell.baseline()
    engine = _connector_run(cell, SAME_ENGINE, cid)
    if not all(engine.result.get("prefix_cache_resets", [False])):
        raise HarnessError(f"engine {SAME_ENGINE}: vLLM did not reset its prefix cache between the passes "
                           "(requests still held blocks), so the reload proves nothing")
    reload = engine.phase(1)
    hits = external_hits(reload)
    if hits <= 0:
        raise ClauseViolation(cid, (
            f"the engine loaded nothing: 0 external prefix-cache hits over {len(reload.result['requests'])} "
            f"requests whose prefixes it had served before its prefix cache was reset: {cell.connector.label} "
            f"found none of them{_span_advice(cell, reload)}"))
    _identical(cell, reload, base, LOADED, cid,
               f"the engine reloading after reset_prefix_cache ({hits:g} external hit tokens)")


@clause("engine_abort")
def test_engine_abort(cell):
    cid = "engine_abort"
    base = cell.baseline()
    # Judged before the engine's own fate: blocks an abort never gave back are why vLLM fails later.
    abandoned = (cell.run(SAME_ENGINE).result.get("aborted") or {}).get("aborted")
    what = abandoned and (f"{abandoned['aborted']} requests aborted through the engine's abort_request "
                          f"{abandoned['steps']} step(s) after they were added")
    if abandoned and abandoned["aborted"] and not (abandoned["drained"] and abandoned["blocks_back"]):
        raise ClauseViolation(cid, (
            f"after {what}, " + ("the engine still held them 60 s later" if not abandoned["drained"] else
                                 "vLLM refused to reset its prefix cache for 60 s: their blocks were never given back")
            + f". vLLM calls request_finished for an aborted request too; if {cell.connector.label} keeps the "
            "blocks for an async save (returns True), it must report the request in finished_sending"))
    engine = _connector_run(cell, SAME_ENGINE, cid)
    if not abandoned:
        raise HarnessError(f"engine {SAME_ENGINE} recorded no aborted batch: the suite's engine child did not run it")
    if not abandoned["aborted"]:
        not_runnable(f"all {abandoned['requests']} requests finished within "
                     f"{abandoned['steps']} engine step(s), before the abort: nothing was aborted")
    _identical(cell, engine.phase(1), base, [AFTER_ABORT], cid,
               f"after {what}, the same prompts asked for again (after a prefix-cache reset)")


@clause("engine_lora_isolation")
def test_engine_lora_isolation(cell):
    cid = "engine_lora_isolation"
    engine = _connector_run(cell, LORA, cid)
    count_load(external_hits(engine.phase(1), BOUNDARIES))
    # Every way: base-model prompts asked for under the adapter, the adapter's asked for by the base model,
    # under a second adapter, and (a phase of its own) under the adapter's next version.
    crossings = {ADAPTED: (1, "requests under a LoRA adapter", "only base-model requests had stored",
                             "the base model's KV"),
                 BASE_ON_ADAPTER: (1, "base-model requests", "only requests under the LoRA adapter had stored",
                                     "the adapter's KV"),
                 OTHER_ADAPTER: (1, "requests under a second LoRA adapter", "only requests under the first "
                                   "adapter had stored", "the first adapter's KV"),
                 ADAPTER_VERSION: (2, "requests under the adapter's next version (its name, other weights from "
                                     "another directory, loaded in place as vLLM's load_inplace does)",
                                     "only its previous version had stored", "its previous weights' KV")}
    for batch, (phase, who, stored, served) in crossings.items():
        hits = external_hits(engine.phase(phase), batch)
        if hits > 0:
            raise ClauseViolation(cid, (
                f"the engine served {hits:g} external prefix-cache hit tokens to {len(cell.batches[batch]['prompts'])} "
                f"{who} (the adapter is rank 8 on every layer's KV projections, so their K and V differ) for "
                f"prompts {stored}: they were served {served}. {cell.connector.label} must key stored KV by the "
                "request's LoRA adapter too, its name and its path"))


@clause("engine_prompt_embeds")
def test_engine_prompt_embeds(cell):
    cid = "engine_prompt_embeds"
    engine = _connector_run(cell, EMBEDS, cid)
    # Every way: another prompt's embeddings and vLLM's placeholder token ids (zeros) asked for after
    # one prompt's embeddings were stored, then embeddings asked for after the zeros were stored.
    crossings = {OTHER_EMBEDS: (1, "a prompt of other embeddings", "one prompt's embeddings"),
                 EMBEDS_AS_TOKENS: (1, "a prompt of token ids (the zeros vLLM puts in place of embeddings)",
                                      "one prompt's embeddings"),
                 TOKENS_AS_EMBEDS: (2, "a prompt of embeddings", "a prompt of token ids (zeros)")}
    for batch, (phase, who, stored) in crossings.items():
        hits = external_hits(engine.phase(phase), batch)
        if hits > 0:
            raise ClauseViolation(cid, (
                f"the engine served {hits:g} external prefix-cache hit tokens to {who} of the same length, after "
                f"{stored} had been stored: keyed by token ids, every prompt of embeddings of one length is the "
                f"prompt of zeros. {cell.connector.label} must key stored KV by the prompt's embeddings too (vLLM "
                "puts their hash in the block hashes), and never fall back to the token ids on a miss"))
    count_load(external_hits(engine.phase(1), EMBEDS_AGAIN))


@clause("engine_multimodal_isolation")
def test_engine_multimodal_isolation(cell):
    cid = "engine_multimodal_isolation"
    cell.one_geometry_refuses(cid)
    model = cell.models.image.name
    engine = _connector_run(cell, IMAGES, cid)
    hits = external_hits(engine.phase(1), OTHER_IMAGE)
    if hits > 0:
        raise ClauseViolation(cid, (
            f"the engine ({model}) served {hits:g} external prefix-cache hit tokens to a prompt of another image "
            "behind the same placeholder tokens, after only the first image's prompt had been stored: the image opens "
            "the prompt, so every token's KV depends on it, and the request was served the first image's KV. "
            f"{cell.connector.label} must key stored KV by the request's multimodal inputs too (each mm_features "
            "entry's identifier, which vLLM's block hashes carry)"))
    count_load(external_hits(engine.phase(1), IMAGE_AGAIN))


@clause("engine_cache_salt")
def test_engine_cache_salt(cell):
    cid = "engine_cache_salt"
    engine = _connector_run(cell, SAME_ENGINE, cid)
    reload = engine.phase(1)
    # Both ways: unsalted prompts asked for by a tenant, and a tenant's prompts asked for with no salt
    # and by a third tenant.
    crossings = {SALTED: f"requests of cache_salt={SALT!r} for prompts only unsalted requests had stored",
                 UNTENANTED: f"unsalted requests for prompts only requests of cache_salt={SALT!r} had stored",
                 OTHER_TENANT: f"requests of cache_salt={THIRD_SALT!r} for prompts only requests of "
                                 f"cache_salt={SALT!r} had stored"}
    count_load(external_hits(reload) - sum(external_hits(reload, batch) for batch in crossings))
    for batch, who in crossings.items():
        hits = external_hits(reload, batch)
        if hits > 0:
            raise ClauseViolation(cid, (
                f"the engine served {hits:g} external prefix-cache hit tokens to {len(cell.batches[batch]['prompts'])} "
                f"{who}: one tenant is served another's KV. {cell.connector.label} must key stored KV by the "
                "request's cache_salt too, and never fall back to another tenant's KV on a miss"))


@clause("engine_store_then_load")
def test_engine_store_then_load(cell):
    base, load = _stored_then_loaded(cell, "engine_store_then_load")
    hits = external_hits(load)
    if hits <= 0:
        raise ClauseViolation("engine_store_then_load", (
            f"engine B loaded nothing: 0 external prefix-cache hits over {len(load.result['requests'])} "
            f"requests whose prefixes engine A served; " + _why_nothing_loaded(cell) + _span_advice(cell, load)))
    _identical(cell, load, base, LOADED, "engine_store_then_load",
               f"engine B ({hits:g} external hit tokens)")


@clause("engine_block_reuse")
def test_engine_block_reuse(cell):
    cid = "engine_block_reuse"
    base, load = _stored_then_loaded(cell, cid, REUSE_ROLES)
    prompts = len(cell.batches[REUSED]["prompts"])
    _identical(cell, load, base, [REUSED], cid,
               f"a fresh engine's reload ({external_hits(load, REUSED):g} external hit tokens) of {prompts} "
               f"prompts of {cell.reused_blocks} blocks that an engine of {cell.reused_blocks + 1} usable blocks stored, one "
               "by one, each given the blocks the one before it gave back as soon as it ended (a connector that "
               "still reads a request's blocks once request_finished let vLLM free them stores the next request's "
               "KV for it)")


@clause("engine_effective_dtype")
def test_engine_effective_dtype(cell):
    cell.baseline()
    want = KVSpec(kv_cache_dtype=cell.kv_cache_dtype, model_dtype=DEFAULT_MODEL_DTYPE).storage_dtype
    engines = _connector_engines(cell, "engine_effective_dtype")
    for engine in engines:  # the connector engines the cell runs anyway
        role = engine.role
        resolved = engine.result["resolved"]
        if resolved["cache_dtype"] != cell.kv_cache_dtype:
            raise ClauseViolation("engine_effective_dtype", (
                f"engine {role}: vLLM resolved cache_dtype={resolved['cache_dtype']!r}, but "
                f"{cell.kv_cache_dtype!r} was requested (a silent fallback)"))
        tensor = resolved["kv_tensor_dtype"]
        if not tensor.startswith("unknown") and tensor != str(want):
            raise ClauseViolation("engine_effective_dtype", (
                f"engine {role}: KV tensors are {tensor}, but kv_cache_dtype={cell.kv_cache_dtype} "
                f"stores {want}"))


@clause("engine_format_isolation")
def test_engine_format_isolation(cell):
    cell.one_geometry_refuses("engine_format_isolation")
    cell.baseline()
    twin_base = cell.baseline("twin_baseline")
    _connector_run(cell, "store", "engine_format_isolation")
    twin = cell.run("twin_load")
    if not twin.ok:
        _judgeable(cell, twin)
        raise ClauseViolation("engine_format_isolation", (
            f"an engine with kv_cache_dtype={cell.twin_dtype} over storage written with "
            f"{cell.kv_cache_dtype} crashed instead of missing: {twin.describe_failure()}"))
    # Its prompts, served one by one, share no prefix with each other: whatever it is served was stored
    # by the first format's engine (never its own KV of an earlier prompt, whose bits depend on the pass
    # that computed them on a CPU, and which vLLM's own baseline never computed that way).
    hits = external_hits(twin)
    if hits > 0:
        # A request vLLM failed because the connector reported its load failed was refused, cleanly:
        # what the clause asks for. Only what the twin engine served is compared.
        refused = sum(r.get("finish_reason") == "error" for r in twin.result["requests"])
        _identical(cell, twin, twin_base, [BOUNDARIES], "engine_format_isolation",
                   f"an engine with kv_cache_dtype={cell.twin_dtype} was served {hits:g} tokens of KV written with "
                   f"kv_cache_dtype={cell.kv_cache_dtype} ({refused} request(s) vLLM failed on a load the connector "
                   "reported failed count as refusals); its output", skip_failed=True)
    # The twin's miss (or refusal) proves isolation only where the same format loads: a connector that
    # loads nothing misses for every format (Not exercised, never a Pass).
    same = cell.run("load")
    count_load(external_hits(same) if same.ok else 0)


@clause("engine_model_isolation")
def test_engine_model_isolation(cell):
    cid = "engine_model_isolation"
    other_model = cell.models.retrained.name
    _connector_run(cell, "store", cid)
    other = cell.run(RETRAINED_LOAD)
    what = (f"a fresh engine of another checkpoint of the model ({other_model}: the same architecture and KV "
            f"geometry, other weights, another directory) over the storage an engine of {cell.model.name} wrote")
    if not other.ok:
        _judgeable(cell, other)
        raise ClauseViolation(cid, f"{what} crashed instead of missing: {other.describe_failure()}")
    # Its prompts, served one by one, share no prefix with each other: whatever it is served was stored
    # by an engine of the first model. A request vLLM failed on a load the connector reported failed is
    # a refusal, not a hit.
    asked = other.requests(BOUNDARIES)
    served = [(i, r) for i, r in enumerate(asked) if external_hits_of(r) > 0 and r.get("finish_reason") != "error"]
    if served:
        i, first = served[0]
        raise ClauseViolation(cid, (
            f"{what} was served {sum(external_hits_of(r) for _, r in served):g} external prefix-cache hit tokens for "
            f"{len(served)} of its {len(asked)} prompts (e.g. boundaries[{i}]: {external_hits_of(first)} of "
            f"{first['prompt_len']} tokens), which only the first model's engine had stored: it was served the first "
            f"model's KV, which another checkpoint's weights never computed. {cell.connector.label} must key stored "
            "KV by the model too (the served model's name or path, model_config.model), or, where each model's "
            "engines get storage of their own, say so with '{model}' in the extra config where it names the place "
            "(the suite fills it with the served model's directory name)"))
    # The other checkpoint's miss proves isolation only where the model's own fresh engine loads: a
    # connector that loads nothing misses for every model (Not exercised, never a Pass).
    same = cell.run("load")
    count_load(external_hits(same) if same.ok else 0)


@clause("engine_block_boundaries")
def test_engine_block_boundaries(cell):
    base, load = _stored_then_loaded(cell, "engine_block_boundaries")
    _identical(cell, load, base, [BOUNDARIES, EXTENDS], "engine_block_boundaries",
               f"with block size {cell.block_size}, engine B")


@clause("engine_shared_prefix")
def test_engine_shared_prefix(cell):
    cid = "engine_shared_prefix"
    base, load = _stored_then_loaded(cell, cid, PREFIX_ROLES)
    mixed = sum(0 < external_hits_of(r) < r["num_cached_tokens"] for r in load.requests(SYSTEM))
    _identical(cell, load, base, [SYSTEM], cid,
               f"with conversations after a {system_tokens(cell.positions)}-token system prompt, engine B ({mixed} "
               "request(s) with local and external hits)")
    observe(f"{mixed} of {len(load.requests(SYSTEM))} conversations had local and external hits in one request")


@clause("engine_cache_pressure")
def test_engine_cache_pressure(cell):
    cid = "engine_cache_pressure"
    if cell.pressure is not None:
        raise NotRunnable(cell.pressure)
    base, load = _stored_then_loaded(cell, cid, PRESSURE_ROLES)
    prompts = cell.batches[PRESSURE]["prompts"]
    what = (f"{len(prompts)} prompts of {len(prompts[0])} tokens, {PRESSURE_FACTOR} times the declared capacity of "
            f"{cell.connector.capacity_bytes} bytes, stored one by one by engine A and asked for again by engine B, "
            "newest first")
    _identical(cell, load, base, [PRESSURE_AGAIN], cid, f"with {what}, engine B")
    loaded = [external_hits_of(r) for r in load.requests(PRESSURE_AGAIN)]
    whole = max(loaded)
    missed = sum(n < whole for n in loaded)
    if not missed:
        not_exercised(f"with {what}, every prompt loaded back whole: nothing was evicted (is the "
                      "declared capacity what the connector's configuration holds?)")
    observe(f"{missed} of {len(loaded)} prompts evicted or partly missed, {len(loaded) - missed} loaded whole")


@clause("engine_concurrent_requests")
def test_engine_concurrent_requests(cell):
    base, load = _stored_then_loaded(cell, "engine_concurrent_requests")
    _identical(cell, load, base, [CONCURRENT], "engine_concurrent_requests",
               "a batch of concurrent requests in engine B")


def _after_loss(cell, role):
    """(baseline, the ``role`` engine run over storage the suite damaged); a hang is the harness's."""
    base = cell.baseline()
    store = cell.run("store")
    if not store.ok:  # nothing stored to damage: say why, before the suite finds no storage
        _judgeable(cell, store)
    engine = cell.run(role)
    if not engine.ok and engine.suite_error:
        raise HarnessError(engine.describe_failure())
    # The control: what the intact storage loaded (engine load, before the damage). A connector that
    # loads nothing there is judged on nothing here (Not exercised), whatever it does with damage.
    intact = cell.runs.get("load")
    count_load(external_hits(intact) if intact is not None and intact.ok else 0)
    return base, engine


@clause("engine_lost_storage")
def test_engine_lost_storage(cell):
    base, engine = _after_loss(cell, "after_loss")
    if not engine.ok:
        _judgeable(cell, engine)  # an engine the connector could not even start in judges nothing
        # No output at all, so nothing to compare; whether it survives is engine_load_failure_recompute's.
        not_exercised(f"after the suite {cell.loss}, engine D died before serving a request "
                      f"(engine_load_failure_recompute judges that): {engine.describe_failure().splitlines()[0]}")
    _identical(cell, engine, base, LOADED, "engine_lost_storage",
               f"after the suite {cell.loss}, engine D", skip_failed=True)
    _loss_was_read(cell, engine)


@clause("engine_load_failure_recompute")
def test_engine_load_failure_recompute(cell):
    cid = "engine_load_failure_recompute"
    base, engine = _after_loss(cell, "after_loss_recompute")
    if not engine.ok:
        if "kv_load_failure_policy" in engine.error:
            raise NotRunnable(f"this vLLM has no kv_load_failure_policy: {engine.error}")
        _judgeable(cell, engine)
        raise ClauseViolation(cid, (
            f"after the suite {cell.loss}, the engine with {cell.connector.label} and "
            f"kv_load_failure_policy=recompute died instead of recomputing: a connector must miss, or report "
            f"what it cannot load (get_block_ids_with_load_errors), not raise; in a server that kills every "
            f"request in flight. {engine.describe_failure()}"))
    failed = [f"{r['batch']}[{r['idx']}]" for r in engine.result["requests"] if r.get("finish_reason") == "error"]
    if failed:
        raise ClauseViolation(cid, (
            f"after the suite {cell.loss}, with kv_load_failure_policy=recompute, vLLM still failed "
            f"{len(failed)} request(s) ({', '.join(failed[:5])}) instead of recomputing their KV"))
    _identical(cell, engine, base, LOADED, cid,
               f"after the suite {cell.loss}, the engine recomputing with kv_load_failure_policy=recompute")


def _loss_was_read(cell, engine):
    """Not exercised where no load read what the suite damaged: ``engine`` took every token engine B took
    over the intact storage and vLLM failed none of its requests (a copy the suite never touched served
    them), so what the connector does with lost storage was never tried. Read: a failed load, or a miss
    where engine B hit."""
    intact = cell.runs.get("load")
    hits = external_hits(engine)
    failed = any(r.get("finish_reason") == "error" for r in engine.result["requests"])
    if intact is not None and intact.ok and external_hits(intact) and hits >= external_hits(intact) and not failed:
        not_exercised(f"after the suite {cell.loss}, engine D loaded {hits:g} tokens, all engine B loaded over the "
                      "intact storage, and vLLM failed none of its requests: no load read what the suite damaged (a "
                      "copy it did not damage served them: a server's memory tier?), so what the connector does with "
                      "lost storage was not tried")


@clause("engine_pd_roundtrip")
def test_engine_pd_roundtrip(cell):
    cid = "engine_pd_roundtrip"
    base, producer, consumer = _pd_pair(cell, cid)
    unhanded = [f"{r['batch']}[{r['idx']}]" for b in STORED for r in producer.requests(b) if not r["kv_transfer_params"]]
    if unhanded:
        raise ClauseViolation(cid, (
            f"the producer engine returned no kv_transfer_params for {len(unhanded)} request(s) it prefilled with "
            f"do_remote_decode ({', '.join(unhanded[:4])}): vLLM's proxy has nothing to hand the consumer"))
    hits = external_hits(consumer)
    _identical(cell, consumer, base, STORED, cid,
               f"the consumer engine, handed the producer's kv_transfer_params ({hits:g} external hit tokens),")


@clause("engine_hma_groups")
def test_engine_hma_groups(cell):
    cid = "engine_hma_groups"
    base = cell.baseline()
    want = base.result["resolved"].get("kv_cache_groups")
    if not isinstance(want, list):
        raise HarnessError(f"the baseline engine's KV cache groups could not be read: {want}")
    if len(want) < 2:
        raise NotRunnable(f"{cell.model.name} has one KV cache group ({want[0]}): the hybrid KV cache "
                          "manager needs a hybrid model, e.g. --kv-model gemma3-hybrid-tiny")
    for engine in _connector_engines(cell, cid):
        got = engine.result["resolved"].get("kv_cache_groups")
        if got != want:
            raise ClauseViolation(cid, (
                f"engine {engine.role}: KV cache groups {got}, but the no-connector baseline has {want}: vLLM "
                f"turned its hybrid KV cache manager off for {cell.connector.label}, which declares hma (vLLM "
                "keeps it on only for a connector that subclasses SupportsHMA)"))
