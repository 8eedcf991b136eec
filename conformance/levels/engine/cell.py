"""One engine-level cell: a connector, a model, a kv_cache_dtype, and the engines that test them.

Engines are expensive (seconds each on two cores), so a cell starts each *role* once and every
scenario reads the same runs: a no-connector baseline, one engine that stores, resets its own
prefix cache and loads again (every connector), and for a connector whose cache outlives its
engine: a store engine, a fresh load engine, a load engine under the format twin (plus its baseline)
and one of another checkpoint of the model, and a load engine after the storage was damaged. Runs
happen on first use, in dependency order (with two lanes, the roles no other role touches start beside the rest once the
baseline ran: ``SECOND_LANE``), and are kept with their timings; the no-connector baselines may come from a
matrix run's ``BaselineStore`` instead (same spec, same Python: the same run).

Over 450 lines: ``EngineCell`` is one object because its roles share one life (the lanes, the
hosts, the servers per world, the runs each started once, a hang that ends the rest); what it
starts is ``roles``, what it asks ``prompts``, how outputs are judged ``compare``.
"""

from __future__ import annotations

import json
import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Collection, Literal, TypedDict

from conformance.contract.spec import same_width_twin
from conformance.levels.engine import separate
from conformance.levels.engine.baselines import BaselineStore
from conformance.levels.engine.compare import Reference, Tolerance, comparison_tolerance, request_outcome
from conformance.levels.engine.launch import EngineHost, EngineRun, run_engine, serving_engine
from conformance.levels.engine.models import IMAGE_MODEL, NO_OTHER_MODEL, load_recipe, materialise_in
from conformance.levels.engine.prompts import (
    DEFAULT_MODEL_LEN,
    OUTPUT_ROOM,
    REUSED_BLOCKS,
    pressure_batches,
    prompt_batches,
)
from conformance.levels.engine.roles import (
    ACROSS,
    AFTER_LOSS,
    BLOCK_BASELINE,
    CACHED_AT,
    EMBEDS,
    IMAGES,
    LORA,
    NO_CONNECTOR,
    REPLAY,
    RETRAINED_LOAD,
    ROLES,
    SAME_ENGINE,
    SECOND_LANE,
    SPLIT_AT,
    STORED,
    STORED_BY,
    STORED_MARK,
    TP_BASELINE,
    WITHOUT_CONNECTOR,
    connected,
    side_of,
    world_of,
)
from conformance.levels.engine.specs import Batch, EngineSpec
from conformance.levels.services import LMCacheService
from conformance.levels.subject import ConnectorChoice, damage_files, side_channel_ports, span_pad, unreachable_storage
from conformance.servers.lmcache_forks import ForkServer
from conformance.servers.lmcache_server import UndrivableServer
from conformance.verdict.clauses import CLAUSES
from conformance.verdict.guard import HarnessError
from conformance.verdict.status import not_runnable

EVIDENCE_LOG_BYTES = 64 << 10  # of each engine's log kept beside the results


class NotRunnable(Exception):
    """This platform or vLLM cannot run what the scenario needs; the reason is vLLM's own."""


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


class Process(TypedDict):
    """How an engine is started: the host of its interpreter (None: a fresh process), its environment."""

    host: EngineHost | None
    env: dict[str, str]


class RoleEvidence(TypedDict, total=False):
    """What a role's engine came to, kept beside the results: whether it ran, why not, each request's
    outcome, vLLM's prefix-cache counters (as summed from every step, and as vLLM logged them), and
    where its log's copy is."""

    ok: bool
    error: str
    requests: list[dict[str, Any]]
    counters: dict[str, float]
    counters_logged: dict[str, float]
    log: str


NOT_STARTED = "not started: "  # a role's run after another engine of the cell hung (``_hung_run``)


class EngineCell:
    def __init__(self, *, connector: ConnectorChoice, model: Path, kv_cache_dtype: str, block_size: int,
                 workdir: Path, timeout_s: float, python: str, baselines: BaselineStore | None = None,
                 hosted: bool = True, lanes: int = 1, clauses: Collection[str] = (), tensor_parallel: int = 1,
                 recipe: str | None = None, other_model: Path | None = None) -> None:
        self.connector, self.model, self.kv_cache_dtype = connector, model, kv_cache_dtype
        # The recipe ``model`` was made from (None: the user's directory), and the other models the
        # cell's roles serve, made on first ask by whichever lane asks first (``_made``).
        self.recipe = recipe
        self.other_model = other_model  # the other checkpoint the user gave (--kv-other-model)
        self._models: dict[tuple[str, int], Path] = {}
        self._models_lock = threading.Lock()
        self.tensor_parallel = tensor_parallel
        self.block_size, self.workdir, self.timeout_s, self.python = block_size, workdir, timeout_s, python
        workdir.mkdir(parents=True, exist_ok=True)
        # vLLM imported once per interpreter of the cell's engines (``side_of``), each started with
        # its own hash seed and the environment the connector declares; hosted=False: each engine a
        # fresh process, started the same way. The hosts a matrix runner handed over are taken in
        # ``separate.SIDES`` order (unless the connector declares an environment they were not started with).
        declared = dict(connector.engine_env)
        self.interpreters = {separate.FIRST: separate.interpreter_env(separate.draw_seed(), declared)}
        self.hosts: dict[str, EngineHost] = {}
        if hosted:
            first = self.hosts[separate.FIRST] = EngineHost(python, workdir / "engine-host.log", adopt=not declared,
                                                            env=self.interpreters[separate.FIRST])
            first.launch()
            if first.handed and first.hash_seed:
                self.interpreters[separate.FIRST] = separate.interpreter_env(first.hash_seed, declared)
        taken = {separate.seed_of(self.interpreters[separate.FIRST]) or ""}
        self.interpreters[separate.SECOND] = separate.interpreter_env(separate.draw_seed(taken), declared)
        if hosted:
            second = self.hosts[separate.SECOND] = EngineHost(python, workdir / "engine-host-second.log",
                                                              adopt=not declared, side=separate.SECOND,
                                                              env=self.interpreters[separate.SECOND])
            if any(CLAUSES[c].requires & separate.CROSS_ENGINE for c in clauses if c in CLAUSES):
                second.launch()  # imported ahead, or beside the first host and the baseline: not before a load engine
            if second.handed and second.hash_seed:
                self.interpreters[separate.SECOND] = separate.interpreter_env(second.hash_seed, declared)
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
        # LMCache's servers the suite starts, one per world (``server``), each forked from one process
        # that imported LMCache once (a world's server costs a fork, not an import); none for other connectors.
        self.servers: dict[str, LMCacheService] | None = None
        self._forks: ForkServer | None = None
        if LMCacheService.wanted_by(connector):
            self.servers, self._forks = {}, ForkServer(python, workdir / "lmcache-forks.log")
        for world in (world_of(SAME_ENGINE), ACROSS):  # the first worlds asked for: up while the baseline runs
            self.server(world)
        self.loss = ""  # how the suite last damaged the storage (lose_storage); "" while intact
        self.storage = self.storage_of(ACROSS)  # what the store engine writes and lose_storage damages
        # Two lanes: the SECOND_LANE roles of the clauses selected (``clauses``) run beside the rest,
        # in SECOND_LANE's order (never the selection's: a set's order changes with the hash seed,
        # and with it which engine a hanging connector stalls first).
        self.lanes = lanes
        self._ahead_roles = list(dict.fromkeys(r for c, roles in SECOND_LANE.items() if c in clauses for r in roles))
        self._ahead: dict[str, Future[EngineRun]] = {}
        self._lane: ThreadPoolExecutor | None = None

    # -- connector infrastructure ---------------------------------------------------------------
    def storage_of(self, world: str) -> Path:
        """Where the connector keeps what ``world``'s engines store ("{storage}" in its extra config)."""
        return self.workdir / ("storage" + (f"-{world}" if world else ""))

    def server(self, world: str) -> LMCacheService | None:
        """``world``'s LMCache server (None for a connector that needs none), launched on the first ask
        (forked from the cell's fork server; spawned where that fails, then ending with the asking
        thread); its ``config`` waits until it is up. The cross-engine world keeps a spare:
        lose_storage switches to it."""
        if self.servers is None:
            return None
        service = self.servers.get(world)
        if service is None:
            log = self.workdir / f"lmcache-server{f'-{world}' if world else ''}.log"
            service = self.servers[world] = LMCacheService(log, chunk_size=2 * self.block_size, python=self.python,
                                                           l1_bytes=self.connector.capacity_bytes,
                                                           spare=world == ACROSS, forks=self._forks,
                                                           args=self.connector.server_args)
            service.launch()
        return service

    def _connector_extra(self, role: str) -> dict[str, Any]:
        """What the suite started for the connector (its world's LMCache server), empty where nothing is needed."""
        service = self.server(world_of(role))
        if service is None:
            return {}
        try:
            return service.config()
        except UndrivableServer as exc:
            not_runnable(str(exc))
        except (RuntimeError, OSError) as exc:  # TimeoutError too: the suite's server, never the connector's verdict
            raise HarnessError(f"the LMCache server the suite starts did not come up: {exc}") from None

    def lose_storage(self) -> str:
        """Damage what the store engine wrote; say how (a storage hook the user gave does it instead).
        Not runnable for storage we cannot reach."""
        hooked = self.connector.damage_with_hook(str(self.storage), "truncate")
        if hooked is not None:
            return hooked
        done = [d for d in (damage_files(self.storage, "halve"),) if d is not None]
        across = (self.servers or {}).get(ACROSS)
        if across is not None and across.started:  # both, when both hold KV (MultiConnector)
            done.append(across.lose())
        if done:
            return " and ".join(done)
        raise NotRunnable(unreachable_storage(self.connector))

    def close(self) -> None:
        if self._lane is not None:  # its engines end by their own deadline at the latest
            self._lane.shutdown(wait=True, cancel_futures=True)
        for host in self.hosts.values():
            host.close()
        if self.servers:
            LMCacheService.stop_all(self.servers.values())
        if self._forks is not None:
            self._forks.stop()

    @property
    def reused_blocks(self) -> int:
        """The blocks of each "reused" prompt: REUSED_BLOCKS, and a declared min span's."""
        return REUSED_BLOCKS + self.pad // self.block_size

    # -- engines --------------------------------------------------------------------------------
    def _spec(self, kv_cache_dtype: str, role: str | None, batches: list[str],
              load_failure_policy: str | None = None, reload: list[str] | None = None,
              then: list[str] | None = None, model: Path | None = None) -> EngineSpec:
        """An engine's spec: no connector when ``role`` is None; ``reload`` batches run after the
        engine reset its own prefix cache (a second phase), ``then`` after it reset it again (a third);
        ``model``: another directory than the cell's model."""
        phases = [batches, reload or [], then or []]
        model = model or self.model
        spec: EngineSpec = {"model": str(model), "kv_cache_dtype": kv_cache_dtype,
                                "block_size": self.block_size, "torch_threads": ENGINE_THREADS,
                                "batches": [{**self.batches[b], "phase": i} if i else self.batches[b]
                                            for i, names in enumerate(phases) for b in names]}
        longest = max((len(p) for b in spec["batches"] for p in b["prompts"]), default=0)
        if longest + OUTPUT_ROOM > DEFAULT_MODEL_LEN:  # the long system prompt: as long as the model allows
            spec["max_model_len"] = self.positions
        if role is not None:
            storage = self.storage_of(world_of(role))
            storage.mkdir(parents=True, exist_ok=True)
            spec["connector"] = self.connector.transfer_config(self._connector_extra(role), str(storage),
                                                               role=ROLES[role].kv_role if role in ROLES else None,
                                                               model=model.name)
            if load_failure_policy:
                spec["connector"]["kv_load_failure_policy"] = load_failure_policy
        return spec

    def _roles(self, connected: bool = True) -> dict[str, Callable[[], EngineSpec]]:
        """Each role's engine spec; ``connected=False``: the same engines without the connector."""
        load = ["extends", "boundaries", "concurrent"]
        dtype = self.kv_cache_dtype

        def using(role: str) -> str | None:
            return role if connected else None

        return {
            "baseline": lambda: self._spec(dtype, None, [*load, "after_abort", "reused", "system",
                                                         *(["pressure_again"] if "pressure" in self.batches else ())]),
            SAME_ENGINE: lambda: self._spec(dtype, using(SAME_ENGINE), [*STORED, "aborted", "tenant"],
                                            reload=[*load, "salted", "untenanted", "other_tenant", "after_abort"]),
            LORA: lambda: {**self._spec(dtype, using(LORA), ["boundaries", "adapter_stored"],
                                        reload=["adapted", "base_on_adapter", "other_adapter", "boundaries"],
                                        then=["adapter_version"]),
                           "lora_adapter": str(self.workdir / "lora-adapter")},
            EMBEDS: lambda: {**self._spec(dtype, using(EMBEDS), ["embeds_stored"],
                                          reload=["other_embeds", "embeds_as_tokens", "embeds_again"],
                                          then=["tokens_as_embeds"]),
                             "prompt_embeds": True},
            IMAGES: lambda: {**self._spec(dtype, using(IMAGES), ["image_stored"], reload=["other_image", "image_again"],
                                          model=self.image_model),
                             "images": load_recipe(IMAGE_MODEL)["images"]},
            "store": lambda: {**self._spec(dtype, using("store"), STORED), "drain": True},
            "load": lambda: self._spec(dtype, "load", load),
            # The format twin asks only for prompts none of which shares a prefix with another: whatever it
            # is served, the other format's engine stored (never its own KV of an earlier prompt).
            "twin_baseline": lambda: self._spec(self.twin_dtype, None, ["boundaries"]),
            "twin_load": lambda: self._spec(self.twin_dtype, "twin_load", ["boundaries"]),
            RETRAINED_LOAD: lambda: self._spec(dtype, RETRAINED_LOAD, ["boundaries"], model=self.retrained_model),
            "after_loss": lambda: self._spec(dtype, "after_loss", load),
            "after_loss_recompute": lambda: self._spec(dtype, "after_loss_recompute", load, "recompute"),
            # A cache of one usable block more than a "reused" prompt takes (vLLM's null block besides),
            # each request ending in its prefill step: the next one is given the blocks it gave back.
            "reuse_store": lambda: {**self._spec(dtype, using("reuse_store"), ["reused"]), "max_tokens": 1, "drain": True,
                                    "num_blocks": self.reused_blocks + 2,
                                    "max_model_len": (self.reused_blocks + 1) * self.block_size},
            "reuse_load": lambda: self._spec(dtype, "reuse_load", ["reused"]),
            "prefix_store": lambda: {**self._spec(dtype, using("prefix_store"), ["system"]), "drain": True},
            "prefix_load": lambda: self._spec(dtype, "prefix_load", ["system"]),
            "pressure_store": lambda: {**self._spec(dtype, using("pressure_store"), ["pressure"]), "drain": True},
            "pressure_load": lambda: self._spec(dtype, "pressure_load", ["pressure_again"]),
            TP_BASELINE: lambda: {**self._spec(dtype, None, load), "tensor_parallel_size": self.tensor_parallel},
            "tp_store": lambda: {**self._spec(dtype, using("tp_store"), STORED), "drain": True,
                                 "tensor_parallel_size": self.tensor_parallel},
            "tp_load": lambda: {**self._spec(dtype, "tp_load", load), "tensor_parallel_size": self.tensor_parallel},
            BLOCK_BASELINE: lambda: {**self._spec(dtype, None, load), "block_size": self.other_block_size},
            "bs_store": lambda: {**self._spec(dtype, using("bs_store"), STORED), "drain": True},
            "bs_load": lambda: {**self._spec(dtype, "bs_load", load), "block_size": self.other_block_size},
        }

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
    def retrained_model(self) -> Path:
        """Another checkpoint of the cell's model (engine_model_isolation): the one the user gave, else
        the recipe's weights drawn from another seed."""
        if self.other_model is not None:
            return self.other_model
        if self.recipe is None:
            raise NotRunnable(NO_OTHER_MODEL)
        made = self._made(self.recipe, retrained=1)
        if isinstance(made, str):
            raise HarnessError(f"the suite could not make another checkpoint of {self.recipe}: {made}")
        return made

    @property
    def image_model(self) -> Path:
        """The vision-language model the multimodal role serves (engine_multimodal_isolation)."""
        made = self._made(IMAGE_MODEL)
        if isinstance(made, str):
            raise NotRunnable(f"the suite's multimodal model ({IMAGE_MODEL}) cannot be made with this Python's "
                              f"transformers: {made}")
        return made

    def _made(self, recipe: str, retrained: int = 0) -> Path | str:
        """``recipe``'s model directory, made once by the engine's Python (or why it could not be)."""
        with self._models_lock:
            if (recipe, retrained) not in self._models:
                made = materialise_in(self.python, recipe, retrained=retrained)
                if isinstance(made, str):
                    return made
                self._models[recipe, retrained] = made
            return self._models[recipe, retrained]

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
        """The model's dtype, what ``auto`` resolves to (a model directory without one is bfloat16)."""
        dtype = self.model_config.get("torch_dtype")
        return dtype if isinstance(dtype, str) else "bfloat16"

    def run(self, role: str) -> EngineRun:
        """The run of ``role``, started (after what it depends on) on first use, or the one the
        second lane started ahead (waited for, raising what it raised)."""
        if role in self.runs:
            return self.runs[role]
        ahead = self._ahead.get(role)
        return ahead.result() if ahead is not None else self._start(role)

    def _run_ahead(self) -> None:
        """Start the second lane's roles, in order, on a thread of their own (once)."""
        if self.lanes < 2 or self._lane is not None or not self._ahead_roles:
            return
        for role in self._ahead_roles:  # their servers from this thread, which outlives the lane's
            if connected(role):
                self.server(world_of(role))
        self._lane = ThreadPoolExecutor(1, thread_name_prefix=LANE_THREAD)
        for role in self._ahead_roles:  # each registered before any runs: never started twice
            self._ahead[role] = self._lane.submit(self._start, role)

    def _start(self, role: str) -> EngineRun:
        facts = ROLES[role]
        for dep in facts.needs:
            try:
                self.run(dep)
            except NotRunnable:
                pass
        if facts.damaged:
            # Damaged afresh for each such engine: the one before may have stored its recomputed KV.
            self.loss = self.lose_storage()
        if facts.intact and self.loss:
            raise HarnessError(f"engine {role} would read storage already damaged for {'/'.join(AFTER_LOSS)}")
        spec = self._roles()[role]()
        hung = self._hung_run(role) if spec.get("connector") else None
        if hung is not None:
            self.runs[role] = hung
            return hung

        self.runs[role] = self._launch(spec, role, shared=role in NO_CONNECTOR)
        return self.runs[role]

    def _launch(self, spec: EngineSpec, name: str, shared: bool) -> EngineRun:
        """An engine of ``spec`` run as ``name``; a no-connector one (``shared``) taken from, or
        kept in, the matrix run's baselines when there are any."""
        def start() -> EngineRun:
            return run_engine(spec, self.workdir / "engines", name, timeout_s=self.timeout_s, python=self.python,
                              **self._process(name, lane_binding(spec.get("tensor_parallel_size", 1))))

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
                                   lambda: self._reference(baseline, CACHED_AT, cached, "cached_prefix"),
                                   from_cache=True))
        if prompt_len - cached <= cached:
            found.append(Reference(f"vLLM's own output with the first {cached} tokens computed apart",
                                   lambda: self._reference(baseline, SPLIT_AT, cached, "prefill_chunk"),
                                   from_cache=False))
        return found

    def _replay(self, loaded: str) -> EngineRun | None:
        """The storing role's batches, then ``loaded``'s, in one engine without the connector or a
        prefix-cache reset: what a connector that loads exactly vLLM's own hits would have it serve.
        The stored batches are renamed (``STORED_MARK``): ``loaded``'s keep their names."""
        name = f"{loaded}{REPLAY}"
        if name not in self.runs:
            roles = self._roles(connected=False)
            store, load = roles[STORED_BY[loaded]](), roles[loaded]()
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

    def _reference(self, baseline: EngineRun, mark: str, cached: int,
                   setting: Literal["cached_prefix", "prefill_chunk"]) -> EngineRun | None:
        name = f"{baseline.role}{mark}{cached}"
        if name not in self.runs:
            spec = self._roles()[baseline.role]()
            spec[setting] = cached
            self.runs[name] = self._launch(spec, name, shared=True)
        run = self.runs[name]
        return run if run.ok else None

    def without_connector(self, role: str) -> EngineRun:
        """``role``'s engine with no connector (shared like the baselines): whether vLLM itself runs
        the settings of a role the baseline does not vouch for (``OWN_SETTINGS``), asked once that
        role's engine failed."""
        name = f"{role}{WITHOUT_CONNECTOR}"
        if name not in self.runs:
            self.runs[name] = self._launch(self._roles(connected=False)[role](), name, shared=True)
        return self.runs[name]

    def run_pd(self) -> tuple[EngineRun, EngineRun | None]:
        """A P/D pair, as vLLM's disaggregated proxy drives it: the producer engine (kv_producer)
        prefills the stored batches, each request with ``do_remote_decode`` and one token; while it
        keeps serving, the consumer engine (kv_consumer) runs the same prompts, each handed the
        kv_transfer_params the producer's output returned. Each engine gets its own side-channel
        ports (``side_channel_ports``). No consumer (None) when the producer failed."""
        if "producer" in self.runs:
            return self.runs["producer"], self.runs.get("consumer")
        hung = self._hung_run("producer")
        if hung is not None:
            self.runs["producer"] = hung
            return hung, None
        producer_spec: EngineSpec = {**self._spec(self.kv_cache_dtype, "producer", STORED), "max_tokens": 1,
                                     "kv_transfer_params": {"do_remote_decode": True}}
        engines = self.workdir / "engines"
        with serving_engine(producer_spec, engines, "producer", timeout_s=self.timeout_s, python=self.python,
                            **self._process("producer", side_channel_ports())) as producer:
            self.runs["producer"] = producer
            if not producer.ok:
                return producer, None
            spec = self._spec(self.kv_cache_dtype, "consumer", STORED)
            for batch in spec["batches"]:
                batch["kv_transfer_params"] = [r["kv_transfer_params"] for r in producer.requests(batch["name"])]
            self.runs["consumer"] = run_engine(spec, engines, "consumer", timeout_s=self.timeout_s,
                                               python=self.python, **self._process("consumer", side_channel_ports()))
        return producer, self.runs["consumer"]

    def _process(self, role: str, env: dict[str, str]) -> Process:
        """How ``role``'s engine is started: the host of its interpreter (``side_of``), and ``env`` with
        that interpreter's (a fresh process, where no host runs it, is started with the same hash seed)."""
        side = side_of(role)
        return {"host": self.hosts.get(side), "env": {**env, **self.interpreters[side]}}

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

    def keep_evidence(self, into: Path, base: Path) -> dict[str, RoleEvidence]:
        """Copy what each engine of the cell logged (its last ``EVIDENCE_LOG_BYTES``, redacted) into
        ``into``, and return, per role, where that copy is (relative to ``base``, the results file's
        directory) and what each request came to (prompt length, cached and external hits, finish
        reason, tokens): what a user checks a verdict by, kept past pytest's rotating temp directories."""
        from conformance.verdict.results import redact_text

        into.mkdir(parents=True, exist_ok=True)
        kept: dict[str, RoleEvidence] = {}
        for role, run in self.runs.items():
            entry: RoleEvidence = {"ok": run.ok, **({"error": redact_text(run.error.splitlines()[0])}
                                                     if run.error else {}),
                                     "requests": [request_outcome(r) for r in run.result.get("requests", ())]}
            if "counters" in run.result:
                entry["counters"] = run.result["counters"]
                entry["counters_logged"] = run.result.get("counters_logged", {})
            log = self.workdir / "engines" / f"{role}.log"
            if log.is_file():
                data = log.read_bytes()[-EVIDENCE_LOG_BYTES:].decode(errors="replace")
                (into / f"{role}.log").write_text(redact_text(data))
                entry["log"] = str((into / f"{role}.log").relative_to(base))
            kept[role] = entry
        return kept

    def versions(self) -> dict[str, str]:
        """Package versions reported by the engines (vLLM, LMCache, torch as the engine saw them)."""
        for run in self.runs.values():
            if run.result.get("versions"):
                return run.result["versions"]
        return {}

    def timings(self) -> dict[str, Any]:
        """Per role, its engine's wall and vLLM start times (and the baseline it reused); what the cell
        cost in engine processes and vLLM imports (its host's one, plus each engine's own)."""
        started = [r for r in self.runs.values() if "reused_from" not in r.result and r.wall_s]
        hosts = {side: host.describe() for side, host in self.hosts.items() if host.launched}
        return {role: {"wall_s": r.wall_s, "engine_start_s": r.result.get("t_engine_start_s"),
                       "batches_s": r.result.get("t_batches_s"),
                       # which interpreter it ran in: its PID, hash seed, hash() probe and vLLM's NONE_HASH
                       **({"process": r.result["process"]} if "process" in r.result else {}),
                       **({"reused_from": r.result["reused_from"]} if "reused_from" in r.result else {})}
                for role, r in self.runs.items()} | {
            "lmcache_servers_ready_s": {world or "across": s.ready_s for world, s in (self.servers or {}).items()
                                        if s.ready_s is not None} or None,
            "engine_host": hosts.get(separate.FIRST), "second_engine_host": hosts.get(separate.SECOND),
            # the hash seed each interpreter was started with (a drawn one, or the connector's own)
            "hash_seeds": {side: separate.seed_of(env) for side, env in self.interpreters.items()},
            "engine_starts": len(started), "lanes": self.lanes,
            "vllm_imports": sum(r.result.get("imported_vllm") is True for r in started)
            + sum(h.get("ready_s") is not None for h in hosts.values())}
