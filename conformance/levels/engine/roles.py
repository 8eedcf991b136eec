"""An engine cell's roles: which engines a cell may start, what each serves phase by phase and with
which settings, what it stores or reads, in which world (its own storage and servers) and which
interpreter, and which run beside the rest.

Each role is one ``Role`` entry of ``ROLES``, the only place its scenario is written; the sets the
cell and the clauses ask for (``COLD_ROLES``, ``SECOND_ENGINE``, ``NO_CONNECTOR``, ...) are read off
that table, and ``EngineCell.spec`` turns an entry into an engine's spec. The engines a cell starts
besides its roles (vLLM's own references, a role's engine without the connector) are ``Variant``s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from conformance.levels.engine import separate
from conformance.levels.engine.prompts import (
    ABORTED,
    ADAPTED,
    ADAPTER_STORED,
    ADAPTER_VERSION,
    AFTER_ABORT,
    BASE_ON_ADAPTER,
    BOUNDARIES,
    EMBEDS_AGAIN,
    EMBEDS_AS_TOKENS,
    EMBEDS_STORED,
    IMAGE_AGAIN,
    IMAGE_STORED,
    LOADED,
    OTHER_ADAPTER,
    OTHER_EMBEDS,
    OTHER_IMAGE,
    OTHER_TENANT,
    PRESSURE,
    PRESSURE_AGAIN,
    REUSED,
    SALTED,
    STORED,
    SYSTEM,
    TENANT,
    TOKENS_AS_EMBEDS,
    UNTENANTED,
)

REUSE = "reuse"  # KV saved while vLLM reused its blocks at once, then loaded
AFTER_LOSS = ("after_loss", "after_loss_recompute")  # roles that run over storage the suite damaged
SAME_ENGINE = "same_engine"  # stores, resets its own prefix cache, loads again: no second engine
LORA = "lora"  # the same with LoRA enabled: stores for the base model, then asks under an adapter
EMBEDS = "embeds"  # the same with prompt embeddings enabled: stores embeddings, asks for them as token ids
IMAGES = "images"  # the same serving a vision-language model (models.IMAGE_MODEL): stores one image, asks another
# Conversations after one system prompt, stored and asked for by an engine pair of their own: a
# connector that mishandles vLLM's own hits (which may kill the engine) fails engine_shared_prefix alone.
PREFIX = "prefix"
# A bounded cache (capacity=BYTES) filled PRESSURE_FACTOR times over by one engine, every prompt then
# asked for by a fresh one, newest first (``pressure_batches``). Whether a cache degrades to empty, not
# to a miss, is the connector level's to judge (api_cache_pressure): a cache that evicts in the
# background (LMCache's eviction controller, above a watermark) drops stores made while it is full,
# and an engine asking again at once cannot tell that from degrading.
PRESSURED = "pressure"
# Tensor parallelism (--kv-tensor-parallel N): the store and load engines again, and vLLM's own
# output, each engine with N ranks in worker processes, every rank its share of the KV heads.
TP = "tp"
TP_BASELINE = "tp_baseline"
# Another block size (twice the cell's): an engine stores at the cell's, a fresh one asks at the other, and
# vLLM's own output at the other is the reference.
BLOCK_SIZE = "block-size"
BLOCK_BASELINE = "bs_baseline"
# Another checkpoint of the model (same architecture and KV geometry, other weights, another directory:
# a fine-tune served beside its base): a fresh engine of it asks, one by one, for prompts only the store
# engine stored, none sharing a prefix with another: whatever it is served is the first model's KV.
RETRAINED_LOAD = "retrained_load"
# Each role's world: where its engines keep what they store, a directory under "{storage}" and, for a
# connector the suite starts LMCache's server for, a server of its own (``EngineCell.server``). The
# roles that must start cold or run on the second lane have one each, so none warms, empties or
# waits for another's; the cross-engine roles (store, load, the format twin, the other checkpoint, after a loss) share ACROSS.
ACROSS = ""


@dataclass(frozen=True)
class Settings:
    """What a role's engine runs with besides the cell's model, kv_cache_dtype and block size."""

    model: Literal["cell", "other checkpoint", "image"] = "cell"  # another checkpoint: engine_model_isolation's
    twin_format: bool = False  # the kv_cache_dtype of the cell's format twin (same width, another format)
    lora: bool = False  # LoRA on, with the suite's adapters (the child writes them)
    prompt_embeds: bool = False
    images: bool = False  # the image model's images (one per prompt)
    drain: bool = False  # steps after its batches until its saves are reported: a later engine reads them
    # A cache of one usable block more than a REUSED prompt takes (vLLM's null block besides), each
    # request ending in its prefill step: the next one is given the blocks it gave back.
    tight: bool = False
    tensor_parallel: bool = False  # the cell's tensor-parallel ranks (--kv-tensor-parallel)
    other_block_size: bool = False  # the cell's other block size (``EngineCell.other_block_size``)
    recompute: bool = False  # kv_load_failure_policy=recompute


DRAINED = Settings(drain=True)


@dataclass(frozen=True)
class Role:
    """One engine a cell may start: what it serves, and what the cell must know of it before it starts."""

    name: str
    # The batches it serves, phase by phase (``prompts``' names): before each later phase the engine
    # resets its own prefix cache, so what comes back then comes back through the connector.
    phases: tuple[tuple[str, ...], ...] = ((),)
    settings: Settings = Settings()
    # The engine clause whose test runs it on the second lane, once the baseline ran (``SECOND_LANE``).
    lane: str | None = None
    world: str = ACROSS
    connector: bool = True  # False: vLLM alone, a baseline shared between cells (``BaselineStore``)
    # Reads what another engine stored (or was handed: the P/D consumer), which in production is a
    # separately started process: it runs in an interpreter of its own, with another hash seed (``separate``).
    second: bool = False
    cold: bool = False  # the first engine over its (empty) storage: whatever it is served, it was never stored
    needs: tuple[str, ...] = ()  # the roles that run first: they store what it reads
    stored_by: str | None = None  # whose batches stored what it asks for (prefix-cache references)
    # Settings the baseline does not share (LoRA or prompt embeddings on; another model; a cache of a few
    # blocks): when it fails, the same engine without the connector says whether vLLM runs them here at all.
    own_settings: bool = False
    intact: bool = False  # reads the storage before the suite damages it
    damaged: bool = False  # runs over storage the suite damaged (``subject.damage_files``; afresh for each such engine)
    kv_role: str | None = None  # KVTransferConfig's kv_role (a P/D pair's); None: kv_both


def _pair(world: str, store: str, load: str, batches: tuple[str, ...], *, asked: tuple[str, ...] | None = None,
          settings: Settings = Settings(), load_settings: Settings = Settings(), cold: bool = False,
          own_settings: bool = False, references: bool = True, lane: str | None = None) -> tuple[Role, Role]:
    """A world's two engines: ``store`` serves ``batches`` (its saves drained), then ``load``, a
    separately started process, asks for them again (or for ``asked``) and reads its storage (its
    references from ``store``'s batches unless ``references`` is False)."""
    return (Role(store, world=world, cold=cold, own_settings=own_settings, phases=(batches,), lane=lane,
                 settings=replace(settings, drain=True)),
            Role(load, world=world, second=True, needs=(store,), stored_by=store if references else None,
                 phases=(asked or batches,), settings=load_settings, lane=lane))


_INTACT = ("store", "load", "twin_load", RETRAINED_LOAD)
_BASELINE = (*LOADED, AFTER_ABORT, REUSED, SYSTEM, PRESSURE_AGAIN)  # every batch a role's output is held to
ROLES = {role.name: role for role in (
    Role("baseline", connector=False, phases=(_BASELINE,)),
    # The format twin asks only for prompts none of which shares a prefix with another: whatever it is
    # served, the other format's engine stored (never its own KV of an earlier prompt).
    Role("twin_baseline", connector=False, phases=((BOUNDARIES,),), settings=Settings(twin_format=True),
         lane="engine_format_isolation"),
    Role(SAME_ENGINE, world="same-engine", cold=True, stored_by=SAME_ENGINE,
         phases=((*STORED, ABORTED, TENANT), (*LOADED, SALTED, UNTENANTED, OTHER_TENANT, AFTER_ABORT))),
    Role(LORA, world="lora", cold=True, own_settings=True, settings=Settings(lora=True), lane="engine_lora_isolation",
         phases=((BOUNDARIES, ADAPTER_STORED), (ADAPTED, BASE_ON_ADAPTER, OTHER_ADAPTER, BOUNDARIES),
                 (ADAPTER_VERSION,))),
    Role(EMBEDS, world="embeds", cold=True, own_settings=True, settings=Settings(prompt_embeds=True),
         lane="engine_prompt_embeds",
         phases=((EMBEDS_STORED,), (OTHER_EMBEDS, EMBEDS_AS_TOKENS, EMBEDS_AGAIN), (TOKENS_AS_EMBEDS,))),
    Role(IMAGES, world="images", cold=True, own_settings=True, settings=Settings(model="image", images=True),
         lane="engine_multimodal_isolation", phases=((IMAGE_STORED,), (OTHER_IMAGE, IMAGE_AGAIN))),
    Role("store", cold=True, intact=True, phases=(STORED,), settings=DRAINED),
    Role("load", second=True, needs=("store",), stored_by="store", intact=True, phases=(LOADED,)),
    Role("twin_load", second=True, needs=("store",), intact=True, phases=((BOUNDARIES,),),
         settings=Settings(twin_format=True)),
    # The other checkpoint's engine after the load engine: a connector blind to the model stores its
    # KV under the prompts' keys, which the load engine would then be served.
    Role(RETRAINED_LOAD, second=True, needs=("store", "load"), intact=True, phases=((BOUNDARIES,),),
         settings=Settings(model="other checkpoint")),
    Role(AFTER_LOSS[0], second=True, needs=_INTACT, damaged=True, phases=(LOADED,)),
    Role(AFTER_LOSS[1], second=True, needs=_INTACT, damaged=True, phases=(LOADED,), settings=Settings(recompute=True)),
    *_pair(REUSE, "reuse_store", "reuse_load", (REUSED,), settings=Settings(tight=True), cold=True, own_settings=True,
           references=False, lane="engine_block_reuse"),
    *_pair(PREFIX, "prefix_store", "prefix_load", (SYSTEM,), lane="engine_shared_prefix"),
    *_pair(PRESSURED, "pressure_store", "pressure_load", (PRESSURE,), asked=(PRESSURE_AGAIN,),
           lane="engine_cache_pressure"),
    # A P/D pair: the consumer runs while the producer serves (``EngineCell.run_pd``).
    Role("producer", world="pd", kv_role="kv_producer", phases=(STORED,)),
    Role("consumer", world="pd", second=True, kv_role="kv_consumer", phases=(STORED,)),
    Role(TP_BASELINE, connector=False, phases=(LOADED,), settings=Settings(tensor_parallel=True)),
    *_pair(TP, "tp_store", "tp_load", STORED, asked=LOADED, settings=Settings(tensor_parallel=True),
           load_settings=Settings(tensor_parallel=True), cold=True),
    Role(BLOCK_BASELINE, connector=False, phases=(LOADED,), settings=Settings(other_block_size=True),
         lane="engine_block_size"),
    *_pair(BLOCK_SIZE, "bs_store", "bs_load", STORED, asked=LOADED, load_settings=Settings(other_block_size=True),
           cold=True, lane="engine_block_size"),
)}
COLD_ROLES = tuple(name for name, role in ROLES.items() if role.cold)
SECOND_ENGINE = tuple(name for name, role in ROLES.items() if role.second)
NO_CONNECTOR = tuple(name for name, role in ROLES.items() if not role.connector)  # vLLM alone
OWN_SETTINGS = tuple(name for name, role in ROLES.items() if role.own_settings)
STORED_BY = {name: role.stored_by for name, role in ROLES.items() if role.stored_by}


def in_world(world: str) -> tuple[str, ...]:
    """The roles of ``world``, in ``ROLES``'s order (a pair: its storing engine, then its loading one)."""
    return tuple(name for name, role in ROLES.items() if role.world == world)


REUSE_ROLES, PREFIX_ROLES, PRESSURE_ROLES = in_world(REUSE), in_world(PREFIX), in_world(PRESSURED)


def world_of(role: str) -> str:
    """The world of ``role``'s engine (a reference or control engine of another name: ACROSS)."""
    return ROLES[role].world if role in ROLES else ACROSS


def side_of(role: str) -> str:
    """The interpreter ``role``'s engine runs in: ``separate.SECOND`` for the engines that load what
    another stored, ``separate.FIRST`` for every other."""
    return separate.SECOND if role in ROLES and ROLES[role].second else separate.FIRST


@dataclass(frozen=True)
class Variant:
    """An engine a cell starts besides its roles, never with the connector: a role's own engine
    without it (whether vLLM runs a role's own settings at all), vLLM's own output with a prompt's
    first ``tokens`` computed apart or in its prefix cache, or a load role's replay (its storing
    role's batches, then its own, in one engine: references, ``EngineCell.references``)."""

    role: str
    kind: Literal["without_connector", "split_at", "cached", "replayed"]
    tokens: int = 0

    @property
    def name(self) -> str:
        """Its run's name (evidence files and timings are kept under it)."""
        return f"{self.role}_{self.kind}" + (f"_{self.tokens}" if self.kind in ("split_at", "cached") else "")


STORED_MARK = "#stored"  # the storing role's batches, renamed in a replay
# Roles no other role reads or damages the storage of (nor needs, but the one after it): with two
# lanes they run on the second, beside the rest, once the baseline has shown vLLM runs the cell.
# Per clause whose test asks for them (``Role.lane``), in ROLES's order; a role asked for that is not
# here runs as before, on first use.
SECOND_LANE = {lane: tuple(name for name, role in ROLES.items() if role.lane == lane)
               for lane in dict.fromkeys(role.lane for role in ROLES.values() if role.lane)}


# The clauses whose promise is about a second KV geometry over one storage, and what it is: Not
# runnable for a connector that declares one-geometry (``EngineCell.one_geometry_refuses``).
SECOND_GEOMETRY = {"engine_format_isolation": "an engine of the format twin's kv_cache_dtype over storage an engine "
                                              "of the cell's wrote",
                   "engine_block_size": "an engine of twice the block size over storage an engine of the cell's wrote",
                   "engine_multimodal_isolation": "an engine of the image model (another model's KV geometry) beside "
                                                  "the cell's"}


def second_geometry(role: str) -> bool:
    """Whether ``role``'s engine shows the connector another geometry than the cell's (another
    kv_cache_dtype, block size or model), beside the engines of the cell's geometry."""
    settings = ROLES[role].settings
    return ROLES[role].connector and (settings.twin_format or settings.other_block_size or settings.model == "image")


def connected(run: str) -> bool:
    """Whether the engine run as ``run`` has the connector (a role's; never a baseline or a ``Variant``)."""
    return run in ROLES and ROLES[run].connector
