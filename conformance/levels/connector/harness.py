"""Drives the connector under test through one engine's lifetime, without an engine.

A *run* is what one engine would do: a fresh ``VllmConfig``, KV caches allocated by vLLM in
the drawn layout and filled with drawn bit patterns (what "the model computed"), the real
vLLM scheduler with the scheduler-side connector, a worker-side connector registered on the
caches, and model-runner steps until every request finished. The store run and the load run
are two runs: nothing is shared between them but the connector's own storage.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from conformance.levels.connector.bench import Bench
from conformance.levels.connector.pair import Pair
from conformance.levels.connector.runs import Filler, PhantomHit, Phase, Run
from conformance.levels.subject import damage_files, unreachable_storage
from conformance.verdict.clauses import count_load, note_asked, record_pass
from conformance.verdict.forked import beat, call_forked
from conformance.verdict.guard import HarnessError, StoreTimeout


@dataclass
class ConnectorHarness(Bench):
    """The connector under test on one model geometry, run after run."""

    lose_remote: Callable[[], str] | None = None  # loses a server's content; says how
    retrained: Callable[[], Path] | None = None  # another checkpoint of the model (None: the user's directory)
    # Why no verdict holds, where a server the suite supplied logged an error while serving (None: none supplied)
    supplied_error: Callable[[], str | None] | None = None
    _used: set[str] = field(default_factory=set)  # storages a run has used (a first run is cold)
    _hung: str | None = None  # the hang that ended the connector: every later test is an Error at once
    _ended_at: float = 0.0  # when the last pass ended (its saves reported): ``settle`` counts from it

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
                if runs or not cold:  # it asks for what was stored: once the saves are visible (settle=SECONDS)
                    self.settle()
                    if self.connector.settle_s and phase.fresh:
                        self._traffic(pair, number)
                run = pair.begin(phase, number)
                note_asked(max((len(request[1]) for request in phase.requests), default=0))
                while pair.step():
                    pass
                pair.end(keep=number < len(phases))
                self._ended_at = time.monotonic()
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

    def _traffic(self, pair: Pair, number: int) -> None:
        """Before a pass that asks for what was stored, for a connector that declares a visibility
        delay: one request of the pair's own, the traffic an engine serves meanwhile, so a connector
        whose scheduler hears of saves from its workers (a step later, through vLLM's worker metadata)
        has heard them, in a fresh pair too. Not judged."""
        tokens = torch.randint(2, self.vocab_size, (2 * pair.block_size + 1,),
                               generator=torch.Generator().manual_seed(time.monotonic_ns())).tolist()
        pair.begin(Phase([(f"traffic-before-pass-{number}", tokens)], _zeros), number)
        while pair.step():
            pass
        pair.end(keep=False)

    def settle(self) -> None:
        """Wait out the visibility delay the connector declares (settle=SECONDS) since the last pass
        ended: an eventually consistent store is asked only once what it saved can be seen."""
        if self.connector.settle_s:
            beat()
        self.connector.wait_settled(self._ended_at)

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


def _zeros(raw: torch.Tensor, allocated: torch.dtype, model_dtype: str) -> None:
    """The traffic request's fill: what it computes is never compared."""
    raw.zero_()


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

