"""An engine cell's roles: which engines a cell may start, what each stores or reads, in which
world (its own storage and servers) and which interpreter, and which run beside the rest."""

from __future__ import annotations

from conformance.levels.engine import separate

REUSE_ROLES = ("reuse_store", "reuse_load")  # KV saved while vLLM reused its blocks at once, then loaded
AFTER_LOSS = ("after_loss", "after_loss_recompute")  # roles that run over storage the suite damaged
SAME_ENGINE = "same_engine"  # stores, resets its own prefix cache, loads again: no second engine
LORA = "lora"  # the same with LoRA enabled: stores for the base model, then asks under an adapter
EMBEDS = "embeds"  # the same with prompt embeddings enabled: stores embeddings, asks for them as token ids
IMAGES = "images"  # the same serving a vision-language model (models.IMAGE_MODEL): stores one image, asks another
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
PD_ROLES = ("producer", "consumer")  # a P/D pair: the consumer runs while the producer serves
# Tensor parallelism (--kv-tensor-parallel N): the store and load engines again, and vLLM's own
# output, each engine with N ranks in worker processes, every rank its share of the KV heads.
TP_ROLES = ("tp_store", "tp_load")
TP_BASELINE = "tp_baseline"
# Another block size (twice the cell's): an engine stores at the cell's, a fresh one asks at the other, and
# vLLM's own output at the other is the reference.
BLOCK_ROLES = ("bs_store", "bs_load")
BLOCK_BASELINE = "bs_baseline"
# Another checkpoint of the model (same architecture and KV geometry, other weights, another directory:
# a fine-tune served beside its base): a fresh engine of it asks, one by one, for prompts only the store
# engine stored, none sharing a prefix with another: whatever it is served is the first model's KV.
RETRAINED_LOAD = "retrained_load"
# The first engine over its (empty) storage:
COLD_ROLES = (SAME_ENGINE, "store", LORA, EMBEDS, IMAGES, "reuse_store", "tp_store", "bs_store")
# Each role's world: where its engines keep what they store, a directory under "{storage}" and, for a
# connector the suite starts LMCache's server for, a server of its own (``EngineCell.server``). The
# roles that must start cold or run on the second lane have one each, so none warms, empties or
# waits for another's; the cross-engine roles (store, load, the format twin, the other checkpoint, after a loss) share ACROSS.
ACROSS = ""
WORLDS = {SAME_ENGINE: "same-engine", LORA: "lora", EMBEDS: "embeds", IMAGES: "images", **dict.fromkeys(PD_ROLES, "pd"),
          **dict.fromkeys(REUSE_ROLES, "reuse"), **dict.fromkeys(PREFIX_ROLES, "prefix"),
          **dict.fromkeys(PRESSURE_ROLES, "pressure"), **dict.fromkeys(TP_ROLES, "tp"),
          **dict.fromkeys(BLOCK_ROLES, "block-size")}


def world_of(role: str) -> str:
    return WORLDS.get(role, ACROSS)


# The engines that read what another engine stored (or was handed: the P/D consumer), which in
# production is a separately started process: they run in an interpreter of their own, started with
# another hash seed than the cell's other engines (``separate``: another host, or fresh processes).
SECOND_ENGINE = ("load", "twin_load", RETRAINED_LOAD, *AFTER_LOSS, "reuse_load", "prefix_load", "pressure_load",
                 "consumer", "tp_load", "bs_load")


def side_of(role: str) -> str:
    """The interpreter ``role``'s engine runs in: ``separate.SECOND`` for the engines that load what
    another stored, ``separate.FIRST`` for every other."""
    return separate.SECOND if role in SECOND_ENGINE else separate.FIRST


# vLLM alone: shared between cells (BaselineStore)
NO_CONNECTOR = ("baseline", "twin_baseline", TP_BASELINE, BLOCK_BASELINE)
# Roles whose engine settings the baseline does not share (LoRA or prompt embeddings on; another model; a cache of a
# few blocks): when one fails, the same engine without the connector says whether vLLM runs those settings here at all.
OWN_SETTINGS = (LORA, EMBEDS, IMAGES, "reuse_store")
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
               "engine_prompt_embeds": (EMBEDS,), "engine_multimodal_isolation": (IMAGES,),
               "engine_block_reuse": REUSE_ROLES, "engine_shared_prefix": PREFIX_ROLES,
               "engine_cache_pressure": PRESSURE_ROLES, "engine_block_size": (BLOCK_BASELINE, *BLOCK_ROLES)}


def connected(role: str) -> bool:
    """Whether ``role``'s engine runs the connector (not a baseline, a control or a reference)."""
    return role not in NO_CONNECTOR and all(mark not in role for mark in (WITHOUT_CONNECTOR, SPLIT_AT, CACHED_AT, REPLAY))
