"""An engine cell's roles: which engines a cell may start, what each stores or reads, in which
world (its own storage and servers) and which interpreter, and which run beside the rest.

Each role is one ``Role`` entry of ``ROLES``, the only place its facts are written; the sets the
cell and the clauses ask for (``COLD_ROLES``, ``SECOND_ENGINE``, ``NO_CONNECTOR``, ...) are read off
that table. What each role's engine serves is the cell's (``EngineCell._roles``).
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.levels.engine import separate

REUSE = "reuse"  # KV saved while vLLM reused its blocks at once, then loaded
AFTER_LOSS = ("after_loss", "after_loss_recompute")  # roles that run over storage the suite damaged
SAME_ENGINE = "same_engine"  # stores, resets its own prefix cache, loads again: no second engine
LORA = "lora"  # the same with LoRA enabled: stores for the base model, then asks under an adapter
EMBEDS = "embeds"  # the same with prompt embeddings enabled: stores embeddings, asks for them as token ids
IMAGES = "images"  # the same serving a vision-language model (models.IMAGE_MODEL): stores one image, asks another
STORED = ["boundaries", "concurrent"]  # what an engine stores (the first phase); a P/D producer prefills
# Conversations after one system prompt, stored and asked for by an engine pair of their own: a
# connector that mishandles vLLM's own hits (which may kill the engine) fails engine_shared_prefix alone.
PREFIX = "prefix"
# A bounded cache (capacity=BYTES) filled PRESSURE_FACTOR times over by one engine, every prompt then
# asked for by a fresh one, newest first (``pressure_batches``). Whether a cache degrades to empty, not
# to a miss, is the connector level's to judge (api_cache_pressure): a cache that evicts in the
# background (LMCache's eviction controller, above a watermark) drops stores made while it is full,
# and an engine asking again at once cannot tell that from degrading.
PRESSURE = "pressure"
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
class Role:
    """One engine a cell may start, and what the cell must know of it before it starts."""

    name: str
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
    damaged: bool = False  # runs over storage the suite damaged (afresh for each such engine)
    kv_role: str | None = None  # KVTransferConfig's kv_role (a P/D pair's); None: kv_both


def _pair(world: str, store: str, load: str, *, cold: bool = False, own_settings: bool = False,
          references: bool = True) -> tuple[Role, Role]:
    """A world's two engines: ``store`` fills its storage, then ``load``, a separately started
    process, reads it (its references from ``store``'s batches unless ``references`` is False)."""
    return (Role(store, world=world, cold=cold, own_settings=own_settings),
            Role(load, world=world, second=True, needs=(store,), stored_by=store if references else None))


_INTACT = ("store", "load", "twin_load", RETRAINED_LOAD)
ROLES = {role.name: role for role in (
    Role("baseline", connector=False),
    Role(SAME_ENGINE, world="same-engine", cold=True, stored_by=SAME_ENGINE),
    Role(LORA, world="lora", cold=True, own_settings=True),
    Role(EMBEDS, world="embeds", cold=True, own_settings=True),
    Role(IMAGES, world="images", cold=True, own_settings=True),
    Role("store", cold=True, intact=True),
    Role("load", second=True, needs=("store",), stored_by="store", intact=True),
    Role("twin_baseline", connector=False),
    Role("twin_load", second=True, needs=("store",), intact=True),
    # The other checkpoint's engine after the load engine: a connector blind to the model stores its
    # KV under the prompts' keys, which the load engine would then be served.
    Role(RETRAINED_LOAD, second=True, needs=("store", "load"), intact=True),
    *(Role(name, second=True, needs=_INTACT, damaged=True) for name in AFTER_LOSS),
    *_pair(REUSE, "reuse_store", "reuse_load", cold=True, own_settings=True, references=False),
    *_pair(PREFIX, "prefix_store", "prefix_load"),
    *_pair(PRESSURE, "pressure_store", "pressure_load"),
    # A P/D pair: the consumer runs while the producer serves.
    Role("producer", world="pd", kv_role="kv_producer"),
    Role("consumer", world="pd", second=True, kv_role="kv_consumer"),
    Role(TP_BASELINE, connector=False),
    *_pair(TP, "tp_store", "tp_load", cold=True),
    Role(BLOCK_BASELINE, connector=False),
    *_pair(BLOCK_SIZE, "bs_store", "bs_load", cold=True),
)}
COLD_ROLES = tuple(name for name, role in ROLES.items() if role.cold)
SECOND_ENGINE = tuple(name for name, role in ROLES.items() if role.second)
NO_CONNECTOR = tuple(name for name, role in ROLES.items() if not role.connector)  # vLLM alone
OWN_SETTINGS = tuple(name for name, role in ROLES.items() if role.own_settings)
STORED_BY = {name: role.stored_by for name, role in ROLES.items() if role.stored_by}


def in_world(world: str) -> tuple[str, ...]:
    """The roles of ``world``, in ``ROLES``'s order (a pair: its storing engine, then its loading one)."""
    return tuple(name for name, role in ROLES.items() if role.world == world)


REUSE_ROLES, PREFIX_ROLES, PRESSURE_ROLES = in_world(REUSE), in_world(PREFIX), in_world(PRESSURE)


def world_of(role: str) -> str:
    """The world of ``role``'s engine (a reference or control engine of another name: ACROSS)."""
    return ROLES[role].world if role in ROLES else ACROSS


def side_of(role: str) -> str:
    """The interpreter ``role``'s engine runs in: ``separate.SECOND`` for the engines that load what
    another stored, ``separate.FIRST`` for every other."""
    return separate.SECOND if role in ROLES and ROLES[role].second else separate.FIRST


WITHOUT_CONNECTOR = "_without_connector"  # the role name of an OWN_SETTINGS engine run without the connector
SPLIT_AT = "_split_at_"  # a baseline's engine with its prompts prefilled in chunks (references)
CACHED_AT = "_cached_"  # a baseline's engine with each prompt's first tokens in its prefix cache (references)
REPLAY = "_replayed"  # a load role's engine after its storing role's batches, no connector (references)
STORED_MARK = "#stored"  # the storing role's batches, renamed in a replay
# Roles no other role reads or damages the storage of (nor needs, but the one after it): with two
# lanes they run on the second, beside the rest, once the baseline has shown vLLM runs the cell.
# Per clause whose test asks for them (test_engine.py); a role asked for that is not here runs as
# before, on first use.
SECOND_LANE = {"engine_format_isolation": ("twin_baseline",), "engine_lora_isolation": (LORA,),
               "engine_prompt_embeds": (EMBEDS,), "engine_multimodal_isolation": (IMAGES,),
               "engine_block_reuse": REUSE_ROLES, "engine_shared_prefix": PREFIX_ROLES,
               "engine_cache_pressure": PRESSURE_ROLES, "engine_block_size": (BLOCK_BASELINE, *in_world(BLOCK_SIZE))}


def connected(role: str) -> bool:
    """Whether ``role``'s engine runs the connector (not a baseline, a control or a reference)."""
    return role not in NO_CONNECTOR and all(mark not in role for mark in (WITHOUT_CONNECTOR, SPLIT_AT, CACHED_AT, REPLAY))
