"""The clauses: each a named promise a KV store makes, and the test that checks it.

Clauses are data. Tests are tagged with ``@clause("id")``; reports, the README, the
certification golden list and the known-bad-store expectations all name clauses by these ids,
and ``tests/verdict/test_clauses.py`` checks that every id here has a test and every test an id.

Over 450 lines: most of it is the clauses themselves, one entry each; the few functions below them
tie a running test to its clause.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypedDict, TypeVar

from conformance.verdict import seeds
from conformance.vocabulary import Level

if TYPE_CHECKING:
    import pytest

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Clause:
    id: str
    level: Level
    promise: str
    requires: frozenset[str] = frozenset()  # capabilities the store (or connector) must claim
    lossless: bool = False  # Disabled for stores (and connectors) that declare themselves lossy
    needs_load: bool = False  # compares loaded KV: a run in which nothing loaded is Not exercised

    def __str__(self) -> str:
        return self.id


_STORE: Level = "store"
_ENGINE: Level = "engine"
_CONNECTOR: Level = "connector"
# Clauses in which a request's KV is looked up by its prompt: they apply to a prefix cache (what
# every connector is unless it declares itself a P/D transfer only).
_CACHE = frozenset({"cache"})
# Clauses in which a fresh engine (or connector pair) loads what another one stored: they apply to
# a connector whose cache outlives its engine, and are Disabled for one whose cache lives inside it.
_ACROSS = frozenset({"cache", "persistent"})
# Clauses of a producer engine handing KV to a consumer engine by kv_transfer_params.
_PD = frozenset({"pd"})
CLAUSES: dict[str, Clause] = {c.id: c for c in (
    Clause("byte_exact_roundtrip", _STORE,
           "get returns, byte for byte, the logical content that put was given (NaN payloads, "
           "-0, subnormals included)", lossless=True),
    Clause("no_aliasing", _STORE,
           "what get returns is a copy of what put was given, as it was at put: the caller reusing the tensor "
           "it put (all of its memory, or only the view's region), even before the first get, and the engine "
           "writing into the tensor get returned change nothing any get returns", lossless=True),
    Clause("dtype_preserved", _STORE,
           "get returns the spec's storage dtype and element format: no hidden cast through "
           "fp16/fp32, fp8 stays its own format"),
    Clause("shape_preserved", _STORE, "get returns the spec's logical layer shape"),
    Clause("stride_contract", _STORE,
           "a non-contiguous put (HND view, slice of a pool, padded rows, storage offset, one "
           "layer of a cross-layer buffer) stores its logical content, and what comes back "
           "reads that content through its own strides (a lossy store: within its declared lossy_tolerance)"),
    Clause("metadata_roundtrip", _STORE,
           "get returns the spec the entry was stored under (format tag, layout, geometry)"),
    Clause("scales_roundtrip", _STORE,
           "get returns the k_scale/v_scale the entry was stored with",
           requires=frozenset({"scales"})),
    Clause("format_isolation", _STORE,
           "two specs that differ only in format (fp8_e4m3 vs fp8_e5m2, bf16 vs fp16, ...) "
           "never serve each other's bytes under the same key"),
    Clause("mismatch_rejection", _STORE,
           "an entry whose tensor contradicts its spec (dtype, shape) is refused with an error, "
           "never silently cast or stored"),
    Clause("corruption_detected", _STORE,
           "truncated or corrupted bytes at rest give a clear error (or a miss), never garbage",
           requires=frozenset({"at_rest"})),
    Clause("state_machine", _STORE,
           "any sequence of put/get/contains/overwrite (and delete, when claimed) agrees with a dict model, "
           "over real keys: keys that differ only in letter case, keys of 256-1024 bytes that differ only "
           "in their last characters, and keys that differ only in one field of LMCache's layerwise key "
           "(early, middle or late; in one character or all of it) are distinct keys"),
    Clause("long_reuse_distance", _STORE,
           "after more puts than a small cache holds (1,000 entries of 2 KiB, then 48 of 1 MiB), every entry "
           "read back oldest first, the first after 1,048 other puts, is a byte-exact hit or a miss, contains "
           "agreeing with get, and the newest is a hit: a bounded store may evict, capacity declared or not, "
           "never serve other bytes"),
    Clause("api_requirements", _CONNECTOR,
           "every vLLM name the connector's module imports, overrides or calls exists in the installed "
           "vLLM (read with ast before anything is built, followed from a wrapper module to the modules its "
           "connector's code is in); a missing one is named with the release it was last seen in"),
    Clause("api_save_load_roundtrip", _CONNECTOR,
           "driven through vLLM's own hooks, a fresh connector pair loads into other blocks of a fresh "
           "cache, byte for byte, every layer of every token it claims, as the first pair saved it: in "
           "every KV cache layout the installed vLLM allocates and every kv_cache_dtype (NaN payloads, "
           "-0, subnormals, fp8 specials), and into a pair of another block size over the same storage; and it "
           "loads something",
           requires=_ACROSS, needs_load=True),
    Clause("api_same_engine_roundtrip", _CONNECTOR,
           "within one connector pair, a request stored, its blocks freed (the engine's own prefix cache "
           "reset) and overwritten by other KV, then asked for again, is loaded byte for byte as it was "
           "saved, every layer of every token the connector claims; and over empty storage the "
           "connector claims nothing (a cache that lives inside its engine is judged here)",
           requires=_CACHE, needs_load=True),
    Clause("api_no_collateral_writes", _CONNECTOR,
           "saving leaves the paged cache untouched, and loading writes only into the blocks of the "
           "request it loads: a neighbour request's blocks and free blocks keep their bytes (a run that loaded "
           "nothing judged only the first half: Not exercised)",
           requires=_ACROSS, needs_load=True),
    Clause("api_partial_prefix", _CONNECTOR,
           "a request sharing only the first k tokens of a stored prompt loads at most k tokens, and "
           "exactly their bytes; asked at the stored prompt's block edges (one token more, one less, "
           "diverging at and just past a block's end) as well as where the draws fall",
           requires=_ACROSS, needs_load=True),
    Clause("api_concurrent_loads", _CONNECTOR,
           "requests the scheduler admits in one step, saved together and loaded together, each "
           "load exactly their own bytes: none is skipped, and none is handed a batch-mate's KV",
           requires=_ACROSS, needs_load=True),
    Clause("api_shared_prefix", _CONNECTOR,
           "conversations that share a long system prompt (1k and 4k tokens) and differ after it, even only in "
           "their last block, each load their own KV: every loaded token holds what a request with the same "
           "prefix up to it computed, and a prompt that extends a stored one or shares only part of it is "
           "claimed no token past what it shares",
           requires=_CACHE, needs_load=True),
    Clause("api_mixed_hits", _CONNECTOR,
           "a request whose first blocks are in vLLM's own prefix cache and whose later blocks only in the "
           "connector is claimed only tokens beyond num_computed_tokens (never the local hits again), and the "
           "bytes loaded into its later blocks are the stored prompt's",
           requires=_CACHE, needs_load=True),
    Clause("api_damaged_storage", _CONNECTOR,
           "with what a store run left corrupted (a flipped byte) or lost before the load run, the "
           "connector loads nothing, or reports the damaged blocks as failed loads "
           "(get_block_ids_with_load_errors, so vLLM recomputes or fails the request per "
           "kv_load_failure_policy): never other bytes, never an exception that kills the worker",
           requires=_ACROSS, lossless=True, needs_load=True),
    Clause("api_format_isolation", _CONNECTOR,
           "a connector pair of the twin kv_cache_dtype (fp8_e4m3 vs fp8_e5m2, bf16 vs fp16), or under "
           "kv_cache_dtype=auto of the model served in another dtype (bf16 vs fp16, fp16 vs fp32: one config string, "
           "other bytes), over the same storage loads nothing or reports the load failed: never the other format's bytes",
           requires=_ACROSS, needs_load=True),
    Clause("api_model_isolation", _CONNECTOR,
           "an engine of another checkpoint of the model (same architecture, other weights, another "
           "directory) over the same storage loads nothing of what the model stored, or reports the load "
           "failed; the model's own engine still loads it byte for byte",
           requires=_ACROSS, needs_load=True),
    Clause("api_cache_salt", _CONNECTOR,
           "a prompt stored under one cache_salt is never claimed for a request with another salt or "
           "none (one tenant is never served another's KV); the same salt still loads",
           requires=_CACHE, needs_load=True),
    Clause("api_lora_isolation", _CONNECTOR,
           "a prompt stored for a request of one LoRA adapter is never claimed for a request of another "
           "adapter, of another version of the same adapter (its name and id, another directory) or of the base "
           "model (their KV differs); the same adapter still loads",
           requires=_CACHE, needs_load=True),
    Clause("api_prompt_embeds", _CONNECTOR,
           "a prompt given as embeddings (prompt_embeds, no token ids) is never claimed for a request of "
           "other embeddings or of token ids, nor a prompt of token ids for one of embeddings; the same "
           "embeddings load byte for byte; no hook raises on a request without token ids",
           requires=_CACHE, needs_load=True),
    Clause("api_multimodal_isolation", _CONNECTOR,
           "a prompt stored for a request with an image is never claimed for a request of the same token "
           "ids with another image or as text, nor a text prompt for one with an image (the image's KV "
           "differs, its placeholder tokens do not); the same image loads byte for byte",
           requires=_CACHE, needs_load=True),
    Clause("api_chunked_prefill", _CONNECTOR,
           "a prompt longer than the step's token budget (max_num_batched_tokens), prefilled in chunks, "
           "is loaded back byte for byte: the connector claims no token it did not persist",
           requires=_CACHE, needs_load=True),
    Clause("api_abort", _CONNECTOR,
           "requests aborted through the scheduler's own finish path (mid-prefill, with loads or saves "
           "in flight) end cleanly: no hook raises, every block held for them is given back, and what "
           "is later loaded for their prompts is their bytes",
           requires=_CACHE),
    Clause("api_preemption", _CONNECTOR,
           "requests preempted for want of blocks and re-admitted (the connector asked again) finish "
           "without a hook raising, and what they saved loads back byte for byte",
           requires=_CACHE, needs_load=True),
    Clause("api_async_load", _CONNECTOR,
           "a request the connector loads asynchronously (load_async=True), asked for alone, is reported "
           "loaded (finished_recving) over steps without a forward pass (vLLM's kv_connector_no_forward: no "
           "layer hook runs) and holds its stored bytes; a connector that loads synchronously is Not runnable "
           "here (api_chunked_prefill judges loads larger than the step's token budget, async ones included)",
           requires=_CACHE),
    Clause("api_save_before_free", _CONNECTOR,
           "a connector reads a request's blocks only while vLLM holds them for it: blocks it gives back "
           "(request_finished returned False, or once reported in finished_sending) are overwritten at once, "
           "as vLLM's next request in them writes, and what is later loaded for the prompt is still the KV "
           "it computed",
           requires=_CACHE, needs_load=True),
    Clause("api_transfer_reports", _CONNECTOR,
           "get_finished reports each finished async save (finished_sending) and load (finished_recving) "
           "exactly once, only for a request vLLM holds for it, and every block comes back once the "
           "requests ended",
           requires=_CACHE),
    Clause("api_connector_stats", _CONNECTOR,
           "over a store and a reload, the connector's transfer statistics reach vLLM's frontend as vLLM "
           "carries them: gathered by the scheduler (the workers' get_kv_connector_stats aggregated with its "
           "own) and not empty, through the engine core's msgpack encoding, rebuilt by "
           "build_kv_connector_stats, aggregated and reduced to numbers by vLLM's own KVConnectorLogging",
           requires=frozenset({"cache", "stats"})),
    Clause("api_kv_events", _CONNECTOR,
           "with KV events on, a store makes the connector emit BlockStored events; every event it hands "
           "vLLM survives the publisher's msgpack encoding into a KVEventBatch a router decodes, and names "
           "only block hashes vLLM computed for the blocks of requests it served (what a router matches)",
           requires=frozenset({"cache", "events"})),
    Clause("api_cache_pressure", _CONNECTOR,
           "a bounded cache (capacity=BYTES) filled three times over, then asked for every prompt again in "
           "another order, loads each byte for byte or misses it: never other bytes, zeros or a raised hook; "
           "and it still loads the most recent prompt afterwards (it degrades to a miss, never to empty); a "
           "run that evicted nothing is Not exercised",
           requires=frozenset({"cache", "capacity"}), needs_load=True),
    Clause("api_reuse_distance", _CONNECTOR,
           "whatever its capacity, declared or not: 24 prompts of 16 blocks (12 MiB of KV on a bf16 cache, more than a "
           "small cache holds) stored four at a time, then each asked for again oldest first, the first after 23 "
           "others, are each loaded byte for byte or missed: never other bytes, zeros or a raised hook; and the last "
           "asked still load afterwards (a bounded cache degrades to a miss, never to empty)",
           requires=_CACHE, needs_load=True),
    Clause("api_load_errors_reported", _CONNECTOR,
           "with each stored file cut short (its last byte gone), the connector loads nothing or reports "
           "the blocks it could not read (get_block_ids_with_load_errors, in the step of the load): it "
           "never raises (the worker dies) and never claims tokens whose bytes it did not read",
           requires=_ACROSS, needs_load=True),
    Clause("api_pd_roundtrip", _CONNECTOR,
           "a consumer connector pair (kv_consumer) handed, per request, the kv_transfer_params the "
           "producer's request_finished returned loads into its own blocks, byte for byte, every layer of "
           "every token it claims, as the producer (kv_producer) computed them; the producer keeps a "
           "request's blocks until the consumer has them (blocks it frees are reused at once), each side "
           "reports each finished transfer once and gives every block back, and a request handed no "
           "params is claimed nothing",
           requires=_PD, needs_load=True),
    Clause("api_pd_format_isolation", _CONNECTOR,
           "a consumer of the twin kv_cache_dtype (fp8_e4m3 vs fp8_e5m2, bf16 vs fp16) handed a producer's "
           "kv_transfer_params loads nothing or reports the load failed: never the other format's bytes",
           requires=_PD),
    Clause("api_pd_lost_peer", _CONNECTOR,
           "with the producer gone before the consumer pulls, no consumer hook raises, no token is claimed "
           "that was not read (the blocks are reported as failed loads, so vLLM recomputes them), and "
           "every request finishes with its blocks given back",
           requires=_PD),
    Clause("engine_cache_salt", _ENGINE,
           "one engine that stored prompts, had its prefix cache reset and served them again serves "
           "none of them as external hits to requests of another cache_salt, both ways: unsalted prompts to a "
           "tenant, a tenant's to unsalted requests and to another tenant",
           requires=_CACHE, needs_load=True),
    Clause("engine_lora_isolation", _ENGINE,
           "one engine serving LoRA (enable_lora) that stored prompts for the base model and under an adapter "
           "that changes K and V, had its prefix cache reset and served them again across (base-model prompts "
           "under the adapter, the adapter's for the base model, under a second adapter and, after another "
           "reset, under the adapter's next version: its name, other weights loaded in place) serves none of "
           "them as external hits, and "
           "still loads them for the base model",
           requires=_CACHE, needs_load=True),
    Clause("engine_prompt_embeds", _ENGINE,
           "one engine serving prompts given as embeddings (enable_prompt_embeds) that stored one, had its "
           "prefix cache reset and was asked across (other embeddings of the same length, the token ids vLLM "
           "puts in their place, then embeddings after those token ids were stored) serves none of them as "
           "external hits, and still loads the same embeddings",
           requires=_CACHE, needs_load=True),
    Clause("engine_multimodal_isolation", _ENGINE,
           "one engine serving a vision-language model (the suite's tiny Idefics3: an image is 16 placeholder tokens, "
           "the same ids for every image) that stored a prompt opening with an image, had its prefix cache reset and "
           "was asked for the same token ids with another image serves none of them as external hits, and still "
           "loads them for the same image",
           requires=_CACHE, needs_load=True),
    Clause("engine_store_then_load", _ENGINE,
           "a fresh engine that loads what another engine stored produces greedy tokens and top-k "
           "logprobs bit-identical to a no-connector baseline (a concurrent batch: within the measured "
           "batch-composition tolerance), and really loaded external KV "
           "(vLLM's external prefix-cache hits > 0)",
           requires=_ACROSS, needs_load=True),
    Clause("engine_tensor_parallel", _ENGINE,
           "with --kv-tensor-parallel N: a fresh engine of N tensor-parallel ranks that loads what another "
           "such engine stored produces greedy tokens and top-k logprobs bit-identical to vLLM's own output "
           "with N ranks and no connector: every rank is served its own share of the KV heads",
           requires=_ACROSS, needs_load=True),
    Clause("engine_block_size", _ENGINE,
           "a fresh engine at twice the cell's block size that asks for what an engine at the cell's block size "
           "stored over the same storage produces greedy tokens and top-k logprobs bit-identical to vLLM's own "
           "output at that block size with no connector: a token's KV does not depend on the block it sits in, so "
           "across block sizes a connector serves each token its own KV, or nothing; and at the same block size "
           "it loads (else Not exercised)",
           requires=_ACROSS, needs_load=True),
    Clause("engine_same_engine_reload", _ENGINE,
           "one engine that stored its prompts, had its own prefix cache reset (reset_prefix_cache) and "
           "served them again produces the no-connector baseline's greedy tokens and logprob bits, having "
           "really loaded external KV (external prefix-cache hits > 0); on its first pass, over empty "
           "storage, it claims no external hit",
           requires=_CACHE, needs_load=True),
    Clause("engine_abort", _ENGINE,
           "requests aborted through the engine's own abort_request one step after they were added (their "
           "KV saved or being saved) leave the engine serving: every block comes back (vLLM can reset its "
           "prefix cache), and their prompts asked for again produce the baseline's tokens and logprob bits",
           requires=_CACHE),
    Clause("engine_pd_roundtrip", _ENGINE,
           "a consumer engine (kv_consumer) whose requests carry the kv_transfer_params a producer engine "
           "(kv_producer, still serving) returned for the same prompts produces the no-connector "
           "baseline's greedy tokens and logprob bits (a concurrent batch: within the measured "
           "batch-composition tolerance), having loaded the prompts' KV (external prefix-cache hits > 0)",
           requires=_PD, needs_load=True),
    Clause("engine_hma_groups", _ENGINE,
           "on a hybrid model (a sliding-window layer beside a full-attention one), vLLM keeps its hybrid "
           "KV cache manager on with the connector: every connector engine has the KV cache groups the "
           "no-connector baseline has, so the other clauses judge the connector through all of them",
           requires=frozenset({"hma"})),
    Clause("engine_block_reuse", _ENGINE,
           "KV stored by an engine whose freed blocks vLLM gives the next request at once (a cache of one "
           "block more than each prompt takes, prompts served one by one, each ending in its prefill step) "
           "loads into a fresh engine as the baseline computes it: the connector reads a request's blocks only "
           "while vLLM holds them for it",
           requires=_ACROSS, needs_load=True),
    Clause("engine_effective_dtype", _ENGINE,
           "the engines run the requested kv_cache_dtype: vLLM's resolved cache dtype and the KV "
           "tensors it allocated match the KVSpec (no silent fallback to auto)"),
    Clause("engine_format_isolation", _ENGINE,
           "an engine of another kv_cache_dtype (fp8_e4m3 vs fp8_e5m2, bf16 vs fp16) over the same "
           "storage misses or refuses cleanly: never served the other format's bytes, never crashes",
           requires=_ACROSS, needs_load=True),
    Clause("engine_model_isolation", _ENGINE,
           "a fresh engine of another checkpoint of the model (same architecture and KV geometry, other weights, "
           "another directory: a fine-tune served beside its base) asking, one by one, for prompts an engine of the "
           "model stored over the same storage is served none of them as external hits (a load the connector "
           "reports failed is a refusal) and never crashes; and the model's own fresh engine loads (else Not exercised)",
           requires=_ACROSS, needs_load=True),
    Clause("engine_block_boundaries", _ENGINE,
           "prompts one short of, at, and one past block multiples, and a prompt extending a "
           "stored prefix, load bit-identically",
           requires=_ACROSS, needs_load=True),
    Clause("engine_shared_prefix", _ENGINE,
           "conversations that share a system prompt of 4,098 tokens (773 on a model of 1,024 positions) and differ "
           "after it, stored by one engine, are "
           "served by a fresh engine as the no-connector baseline serves them (bits): the first loaded whole, the "
           "others with vLLM's own prefix cache holding the shared part and the connector asked only for the "
           "rest (local and external hits in one request)",
           requires=_ACROSS, needs_load=True),
    Clause("engine_cache_pressure", _ENGINE,
           "a bounded cache (capacity=BYTES) filled three times over by one engine serves a fresh engine, asking "
           "for every prompt again newest first, as the no-connector baseline serves them (bits): an evicted prompt "
           "is recomputed, never served zeros or another's KV; a run that evicted nothing is Not exercised",
           requires=_ACROSS | {"capacity"}, needs_load=True),
    Clause("engine_concurrent_requests", _ENGINE,
           "concurrent requests with shared and distinct prefixes load correctly: the same tokens, "
           "logprobs within the measured batch-composition tolerance (vLLM is not batch-invariant)",
           requires=_ACROSS, needs_load=True),
    Clause("engine_lost_storage", _ENGINE,
           "with the storage lost or truncated between store and load, the engine (vLLM's default "
           "kv_load_failure_policy) never returns wrong tokens: each request matches the baseline or "
           "is failed with finish_reason 'error'",
           requires=_ACROSS, needs_load=True),
    Clause("engine_load_failure_recompute", _ENGINE,
           "with the storage lost or truncated and kv_load_failure_policy=recompute, the engine "
           "survives and serves every request as the baseline does: the connector missed, or reported "
           "the blocks it could not load so vLLM recomputed them; an engine the connector kills fails",
           requires=_ACROSS, needs_load=True),
)}
assert CLAUSES, "no clauses defined"  # sanity check

# What a reader of the compatibility matrix asks of a connector (or store), in the report's order:
# each clause answers one of these questions. "loads correctly" is bit-exact (or within the stated
# tolerance); the others are what goes wrong around correct bytes.
GROUPS: dict[str, tuple[str, ...]] = {
    "loads correctly": (
        "byte_exact_roundtrip", "no_aliasing", "dtype_preserved", "shape_preserved", "stride_contract",
        "metadata_roundtrip", "scales_roundtrip",
        "api_save_load_roundtrip", "api_same_engine_roundtrip", "api_no_collateral_writes", "api_partial_prefix",
        "api_concurrent_loads", "api_shared_prefix", "api_mixed_hits", "api_pd_roundtrip",
        "engine_store_then_load", "engine_tensor_parallel", "engine_block_size", "engine_same_engine_reload",
        "engine_pd_roundtrip", "engine_hma_groups",
        "engine_effective_dtype", "engine_block_boundaries", "engine_shared_prefix", "engine_concurrent_requests"),
    "format isolation": (
        "format_isolation", "mismatch_rejection", "api_format_isolation", "api_model_isolation", "api_pd_format_isolation",
        "engine_format_isolation", "engine_model_isolation"),
    "damaged or lost storage": (
        "corruption_detected", "api_damaged_storage", "api_load_errors_reported", "api_pd_lost_peer",
        "engine_lost_storage", "engine_load_failure_recompute"),
    "lifecycle": (
        "state_machine", "long_reuse_distance",
        "api_cache_salt", "api_lora_isolation", "api_prompt_embeds", "api_multimodal_isolation",
        "api_chunked_prefill", "api_abort", "api_preemption", "api_async_load", "api_save_before_free", "api_transfer_reports",
        "api_connector_stats", "api_kv_events", "api_cache_pressure", "api_reuse_distance",
        "engine_cache_pressure", "engine_cache_salt",
        "engine_lora_isolation", "engine_prompt_embeds", "engine_multimodal_isolation",
        "engine_abort", "engine_block_reuse"),
    "API requirements": ("api_requirements",),
}
GROUP_OF: dict[str, str] = {c: group for group, members in GROUPS.items() for c in members}
assert sorted(GROUP_OF) == sorted(CLAUSES) and len(GROUP_OF) == sum(map(len, GROUPS.values())), \
    "every clause is in exactly one group"

CLAUSE_MARK = "kv_clause"

# One connector-level pass, as its results entry keeps it: its storage, format, layout and block size,
# the tokens each request loaded and the first blocks reported failed ("pass": the functional syntax).
PassRecord = TypedDict("PassRecord", {"storage": str, "pass": int, "kv_cache_dtype": str, "layout": str,
                                      "block_size": int, "loaded": dict[str, int], "failed_blocks": list[int]})


@dataclass
class RunningTest:
    """The clause test running now: its node id, its clause and the examples Hypothesis ran."""

    nodeid: str
    clause: str
    examples: int = 0
    loaded: int = 0  # tokens of KV loaded from the connector: 0 leaves a needs_load clause Not exercised
    # Of the loaded tokens compared within a lossy connector's tolerance, those whose bytes changed:
    # none changed (a codec in no load's path) leaves the clause Not exercised.
    within: int = 0
    coded: int = 0
    # What each pass of the connector level loaded, per request (the last MAX_PASSES): the evidence
    # a verdict rests on, kept in the results.
    passes: list[PassRecord] = field(default_factory=list)
    observed: str = ""  # what the workload did (prompts evicted, local hits), recorded with a Pass
    longest_asked: int = 0  # the longest prompt the connector was asked about, in tokens (its lookups)
    # Why the connector refused the first drawn example it declined after a pair of another configuration
    # was built in the same process (a block size, a dtype): one that declines most takes one geometry.
    declined: str = ""


# Set by the plugin around each clause test (pytest runs one test at a time per process, and
# Hypothesis runs its examples in the test's own thread): what the test is, without repeating it.
_RUNNING: ContextVar[RunningTest | None] = ContextVar("kvconform_running_test", default=None)


def start_test(nodeid: str, clause_id: str) -> Token[RunningTest | None]:
    return _RUNNING.set(RunningTest(nodeid, clause_id))


def end_test(token: Token[RunningTest | None]) -> None:
    _RUNNING.reset(token)


def running() -> RunningTest | None:
    """The clause test running now, or None outside one."""
    return _RUNNING.get()


def count_example() -> None:
    test = _RUNNING.get()
    if test is not None:
        test.examples += 1


def observe(note: str) -> None:
    """Record what the running clause's workload did (or left out), for its results entry (a Pass has
    no message); each note once, after the ones before it."""
    test = _RUNNING.get()
    if test is not None and note not in test.observed:
        test.observed = f"{test.observed}; {note}" if test.observed else note


def note_declined(why: str) -> None:
    """Record why the connector declined a drawn example's configuration (the first such, per test)."""
    test = _RUNNING.get()
    if test is not None and not test.declined:
        test.declined = why


def count_load(tokens: float) -> None:
    """Record that the connector loaded ``tokens`` of KV for the running clause's comparisons."""
    test = _RUNNING.get()
    if test is not None:
        test.loaded += int(tokens)


def note_asked(tokens: int) -> None:
    """Record that the connector was asked about a prompt of ``tokens`` tokens (a lookup)."""
    test = _RUNNING.get()
    if test is not None:
        test.longest_asked = max(test.longest_asked, tokens)


def count_coded(compared: int, changed: int) -> None:
    """Record that ``compared`` loaded tokens were held to a lossy tolerance, ``changed`` of them
    not byte for byte what was stored (the codec in their path)."""
    test = _RUNNING.get()
    if test is not None:
        test.within += compared
        test.coded += changed


MAX_PASSES = 24  # passes kept per clause test: the last ones (a failing example ends the test)


def record_pass(outcome: PassRecord) -> None:
    """Record one connector-level pass's outcome (its requests' loaded tokens, failed blocks)."""
    test = _RUNNING.get()
    if test is not None:
        test.passes = [*test.passes[-(MAX_PASSES - 1):], outcome]


def clause(clause_id: str) -> Callable[[F], F]:
    """Tag a test with the clause it checks, and count the examples Hypothesis runs for it.

    Apply it above ``@given``.
    """
    if clause_id not in CLAUSES:
        raise ValueError(f"clause {clause_id!r} is unknown; valid: {', '.join(CLAUSES)}")

    def decorate(test: F) -> F:
        import pytest  # here, so that matrix.yaml tooling can read the clauses without pytest

        return getattr(pytest.mark, CLAUSE_MARK)(clause_id)(count_examples(test, seed_name=clause_id))

    return decorate


def count_examples(test: F, seed_name: str | None = None) -> F:
    """Count each example a ``@given`` function runs, for the clause test running it, and seed it
    by ``seed_name`` (default: its module and qualified name) under derandomized profiles
    (``conformance.verdict.seeds``).

    ``clause`` applies it; apply it by hand to a ``@given`` helper that a clause test calls.
    """
    handle = getattr(test, "hypothesis", None)
    if handle is not None:
        seeds.register(test, seed_name or f"{test.__module__}.{test.__qualname__}")
        inner = handle.inner_test

        @functools.wraps(inner)
        def counted(*args: Any, **kwargs: Any) -> Any:
            count_example()
            return inner(*args, **kwargs)

        handle.inner_test = counted
    return test


def clause_of(item: pytest.Item) -> Clause | None:
    mark = item.get_closest_marker(CLAUSE_MARK)
    return CLAUSES[mark.args[0]] if mark else None


def disabled_reason(c: Clause, capabilities: frozenset[str], subject: str) -> str | None:
    """Why ``c`` does not apply to a store (or connector) with ``capabilities``, or None when it does."""
    missing = sorted(c.requires - capabilities)
    if missing:
        return f"{c.id} needs capability {', '.join(missing)}, which {subject} does not claim"
    if c.lossless and "lossy" in capabilities:
        return f"{c.id} is a lossless clause and {subject} declares itself lossy"
    return None
