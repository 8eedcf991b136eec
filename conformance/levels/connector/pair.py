"""One engine's connector pair without an engine (``Pair``): vLLM's config with the connector,
caches allocated as the model runner allocates them, the worker-side connector and the scheduler
with its own, stepped one model-runner step at a time. What the harness runs an engine lifetime
with; it reads the caches as the forward pass would and records what each step did to them."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from conformance.contract.spec import resolve_kv_cache_dtype
from conformance.levels.connector.bench import Bench, hook, setup
from conformance.levels.connector.eras import Era, EraUnavailable
from conformance.levels.connector.geometry import Geometry, within_pin
from conformance.levels.connector.ledger import WAITING_FOR_LOAD, Ledger
from conformance.levels.connector.runs import (
    SAMPLED_TOKEN,
    ConnectorRaised,
    DtypeFallback,
    EmbedsTwin,
    LayoutRefused,
    NegativeClaim,
    NotJudged,
    OverClaim,
    Phase,
    Run,
    TransferStalled,
    judged_with,
)
from conformance.levels.connector.slots import backing_bytes, by_block, copy_tokens, scatter_bytes, views_over
from conformance.levels.diagnosis import heard_degradation, runs_degraded
from conformance.levels.subject import side_channel_ports
from conformance.verdict.guard import Guarded, HarnessError

IDLE_STEP_PAUSE_S = 0.002  # a step that scheduled nothing is waiting on an async transfer
DRAIN_S = 5.0  # how long a phase whose requests all ended waits for the transfers still holding blocks


def built_here() -> bool:
    """Whether this process built a connector pair: the connector can be built here at all."""
    return Pair.built > 0


class Pair:
    """One engine's connector pair, without an engine (the module's docstring): the worker-side
    connector built and registered first, then the scheduler with its own."""

    built = 0  # pairs this process built: a connector that can be built here at all

    def __init__(self, bench: Bench, *, kv_cache_dtype: str, layout: str, block_size: int,
                 storage: str, model: Path | None = None, scheduling: Mapping[str, int] | None = None,
                 num_blocks: int | None = None, role: str | None = None, serves: frozenset[str] = frozenset(),
                 model_dtype: str | None = None) -> None:
        within_pin(Geometry(block_size, kv_cache_dtype, layout), model_dtype)
        if "events" in bench.connector.capabilities:  # an engine whose operator turned KV events on
            serves |= {"events"}
        self.bench, era = bench, bench.era
        self.kv_cache_dtype, self.layout = kv_cache_dtype, layout
        model = model or bench.model
        transfer = bench.connector.transfer_config(dict(bench.extra_config), str(bench.workdir / storage),
                                                   model=model, role=role)
        self.config = config = setup("configuring vLLM with the connector", lambda: era.make_config(
            model=str(model), transfer=transfer, kv_cache_dtype=kv_cache_dtype, layout=layout,
            block_size=block_size, scheduling=scheduling, serves=serves, model_dtype=model_dtype))
        resolved = config.cache_config.cache_dtype
        if resolved != kv_cache_dtype:  # vLLM's own choice for this platform: no such KV cache to judge
            raise DtypeFallback(f"vLLM {era.vllm_version} runs kv_cache_dtype={kv_cache_dtype} as {resolved!r} on "
                                "this platform (its config falls back), so no such KV cache exists to judge")
        required = setup("asking the connector for its KV cache layout", era.required_layout, config)
        if required is not None and required != layout:  # vLLM allocates the required one: never this draw
            raise LayoutRefused("get_required_kvcache_layout", NotImplementedError(
                f"the connector requires the {required} KV cache layout, so vLLM never gives it {layout}"))
        self.mla = bool(config.model_config.use_mla)
        self.block_size = config.cache_config.block_size  # vLLM may override it (CPU MLA needs 16)
        # The caller sized the cache in blocks of the size it asked for: where vLLM chose another,
        # the same number of tokens (4x the blocks of 16 for 64 asked: a prompt sized to fill the
        # cache would otherwise wait forever for blocks the scheduler never has).
        blocks = -(-(num_blocks or bench.num_blocks) * block_size // self.block_size)
        layer_names = [f"model.layers.{i}.self_attn.attn"
                       for i in range(config.model_config.get_num_layers(config.parallel_config))]
        kv_cache_config, self.caches = era.allocate(config, layer_names, blocks, self.mla)
        self.groups = {name: g for g, group in enumerate(kv_cache_config.kv_cache_groups) for name in group.layer_names}
        judged_with(len(kv_cache_config.kv_cache_groups))
        self.model_dtype = str(config.model_config.dtype).removeprefix("torch.")
        # vLLM's order: the worker builds its connector and registers the caches, then the engine
        # core builds the scheduler (whose connector may wait for a service the worker started) and
        # hands it the worker's handshake metadata. Each pair has its own side-channel ports, as
        # the engines of a P/D pair on two hosts would.
        os.environ.update(side_channel_ports())
        with heard_degradation() as degraded:  # a connector that chose to run without its cache here
            with era.worker_setup(config):
                self.worker = bench.build("worker connector", era.make_worker_connector, config, kv_cache_config)
            self.scheduler: Guarded | None = None
            try:
                with era.worker_setup(config):
                    setup("register_kv_caches", self.worker.register_kv_caches, self.caches)
                self.scheduler = bench.build("scheduler", era.make_scheduler, config, kv_cache_config)
                if "images" in serves:
                    self._take_images(config)
                setup("handing the worker's handshake metadata to the scheduler", era.relay_handshake,
                      self.worker.inner, self.scheduler.inner)
                if degraded:
                    raise NotJudged(runs_degraded(bench.connector.label, degraded))
            except BaseException:
                self.close(quiet=True)
                raise
        Pair.built += 1
        self.free_at_start = self.scheduler.inner.kv_cache_manager.block_pool.get_num_free_blocks()
        self.ledger = Ledger()
        self.runner = bench.guarded(era, "worker step")  # vLLM's runner code checks the connector's type
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
            self.bench.era.take_images(self.scheduler.inner, config.scheduler_config.max_num_batched_tokens)
        except EraUnavailable as exc:
            raise NotJudged(f"vLLM {self.bench.era.vllm_version} cannot be given requests with images here: "
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
                self.run.asked_at.setdefault(request.request_id, self.step_no)
                if claimed > 0 and num_computed_tokens + claimed > request.num_tokens:
                    raise OverClaim(request.request_id, num_computed_tokens, claimed, request.num_tokens)
            return answer

        connector.get_num_new_matched_tokens = asked

    def begin(self, phase: Phase, number: int) -> Run:
        """Start a phase: the prefix cache reset (after the first), the fill written, its requests
        admitted; the phase's clock starts."""
        h, era, assert_scheduler = self.bench, self.bench.era, self.scheduler
        assert assert_scheduler is not None
        self.ledger.phase = number
        if self.runs and phase.fresh:
            hook("scheduler", assert_scheduler.reset_prefix_cache)
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
            hook("scheduler", assert_scheduler.add_request, request)
        self.phase, self.step_no = phase, 0
        self.drained_by: float | None = None
        self.extend()
        return run

    def _embeds(self, phase: Phase, request_id: str, length: int) -> torch.Tensor | None:
        """The request's prompt embeddings (seeded, in the model's dtype), if the phase gives it any."""
        spec = phase.embeds.get(request_id)
        if spec is None:
            return None
        seed, row = (spec.seed, spec.row) if isinstance(spec, EmbedsTwin) else (spec, None)
        hidden = self.config.model_config.get_hidden_size()
        embeds = torch.randn(length, hidden, generator=torch.Generator().manual_seed(seed)).to(self.config.model_config.dtype)
        if row is not None:  # one element one unit in the last place away (its bits as an integer, plus one)
            embeds[row].view({2: torch.int16, 4: torch.int32}[embeds.element_size()])[hidden // 2] += 1
        return embeds

    def extend(self) -> None:
        """Restart the phase's clock (a producer waiting for its consumer)."""
        self.deadline = time.monotonic() + self.bench.timeout_s

    def step(self, *, drain: float | None = DRAIN_S, until_finished: bool = False) -> bool:
        """One step; False once the phase is over: every request ended and its blocks came back, or
        ``drain`` seconds after every request ended (``Run.held`` names the blocks still held; None:
        not yet draining), or (``until_finished``) once every request ended. HarnessError at the
        phase's deadline while a request has not ended."""
        h, run, phase, scheduler = self.bench, self.run, self.phase, self.scheduler
        assert run is not None and scheduler is not None
        inner = scheduler.inner
        for rid, after in phase.aborts.items():  # the aborts due at this step
            if after == self.step_no and rid not in run.aborted:
                run.aborted.add(rid)
                hook("scheduler", h.era.abort, inner, rid)
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
        out = hook("scheduler", scheduler.schedule)
        run.async_loads |= {rid for rid, request in inner.requests.items() if request.status.name == WAITING_FOR_LOAD}
        if not out.total_num_scheduled_tokens:
            time.sleep(IDLE_STEP_PAUSE_S)
        track_blocks(h.era, out, run)
        reallocated = self._reallocated(out, run) if phase.reuse_reallocated else []
        forward = (lambda: self._overwrite(reallocated, run)) if reallocated else None
        prefixes = self._prefix_blocks(out, run)
        connector_output = hook("worker hooks", self.runner.run_worker_step, self.worker.inner, out,
                                run.caches, run.mla, self.config, forward,
                                (lambda layer: self._read(layer, prefixes, run)) if prefixes else None)
        self._sort_load_errors(out, connector_output, inner, run, prefixes)
        self.ledger.vet(connector_output, inner, self.step_no)
        result = h.era.model_runner_output(inner, out, connector_output, SAMPLED_TOKEN)
        outputs = hook("scheduler", scheduler.update_from_output, out, result)
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
        resumed = self.bench.era.resumed(out)
        for i, rid in enumerate(cached.req_ids):
            if rid in resumed:  # its blocks are the ones this step re-admits it with (track_blocks)
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
        h, left = self.bench, sorted(scheduler.requests)
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
                hook("shutdown", part.shutdown)
            except (ConnectorRaised, HarnessError):
                if not quiet:
                    raise
        self.worker = self.scheduler = None  # type: ignore[assignment]


def track_blocks(era: Era, out: Any, run: Run) -> None:
    """Where each scheduled request's KV lives; a request re-admitted after a preemption gets new
    blocks, and the tokens it recomputes there get the bytes it computed the first time (as a
    deterministic model writes them), so its KV stays comparable with ``Run.origin``."""
    for new in out.scheduled_new_reqs:
        if new.num_computed_tokens < 0:
            raise NegativeClaim(new.req_id, new.num_computed_tokens)
        run.blocks[new.req_id] = list(new.block_ids[0])
        run.origin[new.req_id] = list(new.block_ids[0])
        run.group_blocks[new.req_id] = [list(ids) for ids in new.block_ids]
        # What the connector loaded: the computed tokens less vLLM's own prefix-cache hits (a batch-mate
        # sharing a prefix hits the blocks another request of the same step is computing).
        run.external_tokens[new.req_id] = new.num_computed_tokens - run.claims.get(new.req_id, (0, 0))[0]
        if new.prompt_token_ids and (new.num_computed_tokens + out.num_scheduled_tokens.get(new.req_id, 0)
                                     >= len(new.prompt_token_ids)):
            run.whole.add(new.req_id)
    cached = out.scheduled_cached_reqs
    resumed = era.resumed(out)
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


def _held(scheduler: Any, free_at_start: int) -> list[str]:
    """Blocks not given back once every request of a phase ended and its transfers drained."""
    held = [f"request {rid!r} ({request.status.name}) still holds its blocks: request_finished returned "
            "True (an async transfer) and get_finished never reported it, so vLLM never frees them"
            for rid, request in sorted(scheduler.requests.items())]
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    if not held and free != free_at_start:
        held.append(f"{free_at_start - free} block(s) of {free_at_start} are not free once every request ended")
    return held
