"""Drives the connector under test through one engine's lifetime, without an engine.

A *run* is what one engine would do: a fresh ``VllmConfig``, KV caches allocated by vLLM in
the drawn layout and filled with drawn bit patterns (what "the model computed"), the real
vLLM scheduler with the scheduler-side connector, a worker-side connector registered on the
caches, and model-runner steps until every request finished. The store run and the load run
are two runs: nothing is shared between them but the connector's own storage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from conformance.levels.connector.eras import Era
from conformance.levels.connector.pair import Pair
from conformance.levels.connector.runs import (
    ConnectorRaised,
    Filler,
    LayoutRefused,
    NegativeClaim,
    NotBuilt,
    PhantomHit,
    Phase,
    Run,
)
from conformance.levels.connector.slots import copy_tokens
from conformance.levels.subject import (
    ConnectorChoice,
    damage_files,
    unreachable_storage,
)
from conformance.verdict.clauses import count_load, record_pass
from conformance.verdict.forked import beat, call_forked
from conformance.verdict.guard import Guarded, HarnessError, StoreTimeout, call_within


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
        return model_vocab_size(self.model)

    def run(self, *, kv_cache_dtype: str, layout: str, block_size: int,
            requests: Sequence[tuple[Any, ...]], fill: Filler, storage: str, model: Path | None = None,
            model_dtype: str | None = None) -> Run:
        """One engine's lifetime: ``requests`` scheduled in order, each prefilled and finished."""
        (run,) = self.lifetime(kv_cache_dtype=kv_cache_dtype, layout=layout, block_size=block_size,
                               phases=[Phase(requests, fill)], storage=storage, model=model, model_dtype=model_dtype)
        return run

    def lifetime(self, *, kv_cache_dtype: str, layout: str, block_size: int, phases: Sequence[Phase], storage: str,
                 scheduling: Mapping[str, int] | None = None, num_blocks: int | None = None,
                 model: Path | None = None, model_dtype: str | None = None) -> list[Run]:
        """One engine's lifetime in phases, one Run each. Between phases every request has finished;
        the engine's own prefix cache is then reset and the next phase's fill overwrites every block
        (as vLLM reuses freed blocks), so a later phase can only get earlier KV back through the
        connector, within the same connector pair (a cache that lives inside its engine).
        ``scheduling`` overrides vLLM's scheduler knobs (a small token budget: chunked prefill);
        ``num_blocks`` shrinks the cache (too few blocks: preemptions); ``model`` serves another model
        directory than the harness's, ``model_dtype`` the model in another dtype."""
        beat()  # a lifetime begins: the supervising parent sees progress
        cold = storage not in self._used
        self._used.add(storage)
        pair = Pair(self, kv_cache_dtype=kv_cache_dtype, layout=layout, block_size=block_size, storage=storage,
                     scheduling=scheduling, num_blocks=num_blocks or self.num_blocks, model=model, model_dtype=model_dtype,
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
        producer = Pair(self, kv_cache_dtype=kv_cache_dtype, layout=layout, block_size=block_size,
                         storage=storage, role="kv_producer")
        consumer: Pair | None = None
        try:
            made = producer.begin(Phase(remote, fills[0], transfer={rid: {"do_remote_decode": True} for rid, _ in remote},
                                        reuse_freed=True), 1)
            while producer.step(drain=None, until_finished=True):
                pass
            if producer_gone:
                producer.end(keep=True)
                producer.close(quiet=False)
            handed = {rid: made.transfer_params[rid] for rid, _ in remote if rid in made.transfer_params}
            consumer = Pair(self, kv_cache_dtype=consumer_dtype or kv_cache_dtype, layout=layout,
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
            # What the connector loaded: the computed tokens less vLLM's own prefix-cache hits (a batch-mate
            # sharing a prefix hits the blocks another request of the same step is computing).
            run.external_tokens[new.req_id] = new.num_computed_tokens - run.claims.get(new.req_id, (0, 0))[0]
            if new.prompt_token_ids and (new.num_computed_tokens + out.num_scheduled_tokens.get(new.req_id, 0)
                                         >= len(new.prompt_token_ids)):
                run.whole.add(new.req_id)
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


# Where a model's config.json keeps its vocabulary: at the top (a text model), or in the config of the
# language model inside a vision-language one (Idefics3, LLaVA: text_config; InternVL: llm_config).
_TEXT_CONFIGS = ("text_config", "language_config", "llm_config")


def model_vocab_size(model: Path) -> int:
    """The token ids a prompt of ``model`` may hold: its config's ``vocab_size``, at the top or in its text
    model's config (a ``HarnessError`` naming where it looked when neither has one)."""
    config = json.loads((model / "config.json").read_text())
    for where in (config, *(config.get(name) or {} for name in _TEXT_CONFIGS)):
        if isinstance(where, dict) and isinstance(where.get("vocab_size"), int):
            return where["vocab_size"]
    raise HarnessError(f"{model / 'config.json'} has no vocab_size at its top or in {', '.join(_TEXT_CONFIGS)}: "
                       "the connector level draws prompts of token ids below it")

