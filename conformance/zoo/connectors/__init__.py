"""Known-bad vLLM connectors for the connector and engine levels: each must be flagged by the
clauses it breaks (tests/levels/connector/test_connector_level.py, tests/levels/engine/test_engine_level.py).

They subclass vLLM's own ExampleConnector and change one thing, so they load wherever it does
(vLLM >= 0.22 on CPU). Selected by module path, as any external connector is:
``--kv-connector conformance.zoo.connectors.noop:NoopConnector``.

``stale_layout_api`` and ``layout_aware`` are for ``kvconform api-requirements`` instead: read,
never run, one written for vLLM 0.19's layout helpers and one for 0.29+'s ``KVCacheLayout``.

``ZOO`` is what the connector level must make of each of them and of the known-good controls
(``conformance/zoo/good/``) under the ci profile, as data beside them (as the store zoo's is,
``conformance/zoo/__init__.py``): the clauses it must fail, may fail, must find Not exercised,
and how it is declared; every other clause must pass, or be Disabled for a capability it does not
declare. ``PD_ZOO`` is the same for the P/D pairs (declared ``pd`` only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BAD = "conformance.zoo.connectors."
GOOD = "conformance.zoo.good."
# The bounded caches' capacity: what they hold, as they declare it (capacity=BYTES) and are
# configured (capacity_bytes).
BOUNDED_CAPACITY = 4 << 20


@dataclass(frozen=True)
class ZooConnector:
    target: str
    fails: frozenset[str] = frozenset()
    # A vLLM connector whose known connector-level failures (matrix.yaml's, at the stack's versions)
    # it fails too, less those in ``not_inherited``.
    inherits: str | None = None
    not_inherited: frozenset[str] = frozenset()
    may_fail: frozenset[str] = frozenset()
    not_exercised: frozenset[str] = frozenset()
    declares: tuple[str, ...] = ()  # its capabilities besides persistent
    persistent: bool = True  # False: a cache inside its engine, run as its author would declare it

    def expected_failures(self, known_failures: Callable[[str], set[str]]) -> set[str]:
        """The clauses it must fail, given ``known_failures``: a vLLM connector's, from matrix.yaml."""
        inherited = known_failures(self.inherits) - self.not_inherited if self.inherits else set()
        return set(self.fails) | inherited

    @property
    def capacity(self) -> int | None:
        """The capacity it declares (capacity=BYTES), which its configuration gives it."""
        return next((int(c.partition("=")[2]) for c in self.declares if c.partition("=")[0] == "capacity"), None)


# ExampleConnector's (matrix.yaml): fp8 twins share a key, no checksum, a file it cannot parse raises
# in the worker; a key of token ids alone (salt, adapter, model, a prompt of embeddings measured by
# its absent token ids); a save at a prompt's first chunk that later claims the whole prompt, hit by
# every scenario that prefills in chunks; a prompt one token past a stored one's whole blocks claimed,
# then loaded from a file never written. Every zoo connector built on it inherits them.
EXAMPLE = "ExampleConnector"
# What the lifecycle control (its key and saves put right) still inherits: its files.
FILE_STORE_BUGS = frozenset({"api_format_isolation", "api_damaged_storage", "api_load_errors_reported"})
# A connector that loads wrong bytes (or another prompt's) loads them wrong in the workloads too.
WRONG_BYTES = frozenset({"api_shared_prefix", "api_mixed_hits"})
# ... and those that load wrong bytes for any prompt, many prompts after it was stored too.
WRONG_LOADS = WRONG_BYTES | {"api_reuse_distance"}
# ... and one that reloads wrong bytes within an engine's lifetime, the same image asked for again too.
WRONG_RELOAD = frozenset({"api_same_engine_roundtrip", "api_save_before_free", "api_multimodal_isolation"})

ZOO: dict[str, ZooConnector] = {m.target: m for m in (
    # Stores, but never claims a match: it loads nothing (a Fail where a load is required, Not exercised
    # where loaded bytes are compared; damaged storage it never reads is a Pass).
    ZooConnector(BAD + "noop:NoopConnector", frozenset({"api_save_load_roundtrip", "api_same_engine_roundtrip"}),
                 not_exercised=frozenset({
                     "api_concurrent_loads", "api_cache_salt", "api_lora_isolation", "api_prompt_embeds",
                     "api_multimodal_isolation", "api_model_isolation", "api_chunked_prefill", "api_preemption",
                     "api_save_before_free", "api_format_isolation", "api_shared_prefix", "api_mixed_hits",
                     # nor what a load does with damage or a shared prefix
                     "api_damaged_storage", "api_load_errors_reported", "api_partial_prefix", "api_reuse_distance",
                     # nor where a load writes
                     "api_no_collateral_writes"})),
    # Clauses in may_fail catch the same bug when their drawn examples exercise it: allowed to fail,
    # not required to (wpt's intermittent). A connector that loads wrong bytes one request at a time
    # loads them wrong two at a time too.
    ZooConnector(BAD + "reversed_blocks:ReversedBlocksConnector",
                 frozenset({"api_save_load_roundtrip"}) | WRONG_RELOAD | WRONG_LOADS, inherits=EXAMPLE,
                 may_fail=frozenset({"api_concurrent_loads"})),
    ZooConnector(BAD + "past_the_end:PastTheEndConnector",
                 frozenset({"api_no_collateral_writes", "api_shared_prefix", "api_reuse_distance"}), inherits=EXAMPLE,
                 may_fail=frozenset({"api_concurrent_loads"})),
    # Keeps 4 MiB of each layer's KV per prompt: only the 16 MiB probe is past the cap.
    # and a 4k-token system prompt's conversation (4 MiB a layer) crosses it too.
    ZooConnector(BAD + "size_capped:SizeCappedConnector", frozenset({"api_save_load_roundtrip", "api_shared_prefix"}),
                 inherits=EXAMPLE),
    ZooConnector(BAD + "first_layer_only:FirstLayerOnlyConnector",
                 frozenset({"api_save_load_roundtrip"}) | WRONG_RELOAD | WRONG_LOADS, inherits=EXAMPLE,
                 may_fail=frozenset({"api_concurrent_loads"})),
    # Keyed by the first block alone: a prompt sharing only that block is handed the rest of another's KV.
    ZooConnector(BAD + "first_block_keyed:FirstBlockKeyedConnector", frozenset({"api_partial_prefix"}) | WRONG_BYTES,
                 inherits=EXAMPLE),
    # Correct, but reads vLLM's current config where vLLM's worker has one set: flagged only for
    # what it inherits, or the harness is not running hooks in vLLM's context.
    ZooConnector(GOOD + "config_reading:ConfigReadingConnector", inherits=EXAMPLE),
    # Loads only the first request of each step: right one request at a time, wrong in a batch (the
    # image clause's later pass loads the text owner first, then the image owner's blocks stay unloaded).
    ZooConnector(BAD + "first_load_only:FirstLoadOnlyConnector",
                 frozenset({"api_concurrent_loads", "api_reuse_distance", "api_multimodal_isolation"}),
                 inherits=EXAMPLE),
    # A cache inside its engine: the cross-engine clauses are Disabled, never a false Fail.
    ZooConnector(GOOD + "in_engine:InEngineConnector", persistent=False),
    # Remembers the slots instead of copying the KV: wrong once freed blocks are overwritten, in every
    # scenario that reloads within the engine. A cache inside its engine too.
    ZooConnector(BAD + "block_reference:BlockReferenceConnector",
                 frozenset({"api_prompt_embeds", "api_chunked_prefill", "api_abort", "api_preemption"})
                 | WRONG_RELOAD | WRONG_LOADS, persistent=False),
    # ExampleConnector with its lifecycle put right (salted key, saved once computed, async saves
    # reported once): only its file format's bugs are left; each known-bad below breaks one thing.
    ZooConnector(GOOD + "lifecycle:LifecycleConnector", FILE_STORE_BUGS),
    # Keyed by the prompt less its first token: the stored prompt with only that token changed is served it.
    # Met by every first-token twin: a partial prefix, a batch-mate and a conversation's.
    ZooConnector(BAD + "first_token_blind:FirstTokenBlindConnector",
                 frozenset({"api_partial_prefix", "api_concurrent_loads", "api_shared_prefix"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "salt_blind:SaltBlindConnector", frozenset({"api_cache_salt"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "lora_blind:LoraBlindConnector", frozenset({"api_lora_isolation"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "embeds_blind:EmbedsBlindConnector", frozenset({"api_prompt_embeds"}) | FILE_STORE_BUGS),
    # Keyed by its first block's embeddings: met by the near miss that differs in its last whole block.
    ZooConnector(BAD + "embeds_head_keyed:EmbedsHeadKeyedConnector", frozenset({"api_prompt_embeds"}) | FILE_STORE_BUGS),
    # Saves at the first chunk: every scenario that prefills in chunks claims what it never saved.
    ZooConnector(BAD + "early_save:EarlySaveConnector",
                 frozenset({"api_chunked_prefill", "api_abort", "api_preemption"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "double_report:DoubleReportConnector", frozenset({"api_transfer_reports"}) | FILE_STORE_BUGS),
    # Frees a request's blocks at once and saves them a step late: vLLM has given them to another request.
    ZooConnector(BAD + "late_save:LateSaveConnector", frozenset({"api_save_before_free"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "abort_leak:AbortLeakConnector", frozenset({"api_abort"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "readmission_assert:ReadmissionAssertConnector", frozenset({"api_preemption"}) | FILE_STORE_BUGS),
    # Reports the blocks of a file it cannot parse (the engine level's recompute control); the
    # known-bad beside it skips the file just the same but reports nothing (a swallowed load error).
    # The file it never wrote, for a prompt one token past a stored one's blocks, is reported the same.
    ZooConnector(GOOD + "load_error_reporting:LoadErrorReportingConnector", inherits=EXAMPLE,
                 not_inherited=frozenset({"api_load_errors_reported", "api_partial_prefix", "api_reuse_distance",
                                          # nor where a load writes
                                          "api_no_collateral_writes"})),
    ZooConnector(BAD + "swallowed_load_error:SwallowedLoadErrorConnector", inherits=EXAMPLE),
    # Reports them, one step late: vLLM has let the request go on with what the blocks held.
    ZooConnector(BAD + "late_load_error:LateLoadErrorConnector", inherits=EXAMPLE),
    # The lifecycle control with transfer statistics, and the same stats its class cannot rebuild.
    ZooConnector(GOOD + "stats:StatsConnector", FILE_STORE_BUGS, declares=("stats",)),
    # Its saves written a step after their requests finished, then reported: the suite steps until then.
    ZooConnector(GOOD + "async_commit:AsyncCommitConnector", FILE_STORE_BUGS),
    # Its loads fenced by CUDA-API streams and events: vLLM-CPU's worker gives it placeholders.
    ZooConnector(GOOD + "stream_events:StreamEventsConnector", FILE_STORE_BUGS),
    # Its loads on a worker thread the event does not fence: they land after the forward pass read
    # the blocks (the cache is right by the end of the step, the model computed with the old bytes);
    # if its thread loses the race wherever one is compared, a partial prefix too.
    ZooConnector(BAD + "unfenced_thread:UnfencedThreadConnector",
                 frozenset({"api_save_load_roundtrip", "api_concurrent_loads", "api_prompt_embeds",
                            "api_model_isolation", "api_chunked_prefill", "api_abort", "api_preemption"})
                 | WRONG_RELOAD | WRONG_LOADS | FILE_STORE_BUGS,
                 may_fail=frozenset({"api_partial_prefix"})),
    # Another format's prompt is found, then reported as failed blocks: a refusal, not a load. Its
    # format file is damaged with the rest (every file is), so damaged storage is refused too.
    ZooConnector(GOOD + "format_refusing:FormatRefusingConnector", inherits=EXAMPLE,
                 not_inherited=frozenset({"api_load_errors_reported", "api_format_isolation", "api_damaged_storage",
                                          "api_partial_prefix"})),
    # ... and its twin that writes the config string alone: under "auto" a bf16 model's KV and an fp16 one's match.
    ZooConnector(BAD + "config_string_format:ConfigStringFormatConnector", inherits=EXAMPLE,
                 not_inherited=frozenset({"api_load_errors_reported", "api_damaged_storage", "api_partial_prefix"})),
    # The lifecycle control loading asynchronously (its loads run in steps without a forward pass).
    # Its known-bad (forward_only_load) stalls every lone load, so only its clause is run (the
    # lifecycle failure messages' test).
    ZooConnector(GOOD + "async_load:AsyncLoadConnector", FILE_STORE_BUGS),
    ZooConnector(BAD + "stats_unbuilt:UnbuiltStatsConnector", frozenset({"api_connector_stats"}) | FILE_STORE_BUGS,
                 declares=("stats",)),
    # The lifecycle control emitting KV events named by vLLM's block hashes, and by hashes of its own.
    ZooConnector(GOOD + "events:EventsConnector", FILE_STORE_BUGS, declares=("events",)),
    ZooConnector(BAD + "events_own_hash:OwnHashEventsConnector", frozenset({"api_kv_events"}) | FILE_STORE_BUGS,
                 declares=("events",)),
    # The workloads production produces (test_workloads.py): a key cut at 1024 tokens, a claim that
    # counts vLLM's local hits again, a fallback to the shared pool on a tenant's miss, and a bounded
    # cache that recycles an evicted entry's space but keeps its name (beside its correct twin).
    ZooConnector(BAD + "prefix_capped:PrefixCappedConnector", frozenset({"api_shared_prefix"}) | FILE_STORE_BUGS),
    # ... a batch-mate that shares a prefix gets local hits in the same step (two prompts, or the same
    # embeddings beside their near miss in the last block): claimed again too.
    ZooConnector(BAD + "over_claiming:OverClaimingConnector",
                 frozenset({"api_mixed_hits", "api_concurrent_loads", "api_prompt_embeds"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "shared_pool_fallback:SaltFallbackConnector", frozenset({"api_cache_salt"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "shared_pool_fallback:LoraFallbackConnector",
                 frozenset({"api_lora_isolation"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "shared_pool_fallback:EmbedsFallbackConnector",
                 frozenset({"api_prompt_embeds"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "lora_flag_keyed:LoraFlagKeyedConnector", frozenset({"api_lora_isolation"}) | FILE_STORE_BUGS),
    # Raw pages keyed by tokens alone: an engine restarted with another block size is handed pages of
    # the old geometry (the round trip's store at 16-token blocks, load at 32).
    ZooConnector(BAD + "page_copying:PageCopyingConnector", frozenset({"api_save_load_roundtrip"}) | FILE_STORE_BUGS),
    # Keyed by the adapter's name, not its path: the next version of an adapter is served the last's KV.
    ZooConnector(BAD + "lora_name_keyed:LoraNameKeyedConnector", frozenset({"api_lora_isolation"}) | FILE_STORE_BUGS),
    # A 4 MiB cache holds one conversation of a 1k-token system prompt (2 MiB) at a time, and each is
    # asked for again just after its LRU eviction: a miss every time, never a load (Not exercised).
    ZooConnector(GOOD + "bounded:BoundedConnector", FILE_STORE_BUGS, not_exercised=frozenset({"api_shared_prefix"}),
                 declares=(f"capacity={BOUNDED_CAPACITY}",)),
    ZooConnector(BAD + "image_blind:ImageBlindConnector", frozenset({"api_multimodal_isolation"}) | FILE_STORE_BUGS),
    ZooConnector(BAD + "model_blind:ModelBlindConnector", frozenset({"api_model_isolation"}) | FILE_STORE_BUGS),
    # Stores only prompts of more than 256 tokens, declared min-span=256: every prompt is 256 tokens
    # longer, so each clause judges it, and its twin's salt-blind key (unseen on short prompts) is caught.
    ZooConnector(GOOD + "min_span:MinSpanConnector", FILE_STORE_BUGS, declares=("min-span=256",)),
    ZooConnector(BAD + "min_span_salt_blind:MinSpanSaltBlindConnector", frozenset({"api_cache_salt"}) | FILE_STORE_BUGS,
                 declares=("min-span=256",)),
    # Its zeroed entries are met wherever a 4 MiB cache evicts: the 1k- and 4k-token conversations too.
    ZooConnector(BAD + "recycled_slot:RecycledSlotConnector",
                 frozenset({"api_cache_pressure", "api_shared_prefix", "api_reuse_distance"}) | FILE_STORE_BUGS,
                 declares=(f"capacity={BOUNDED_CAPACITY}",)),
    # A 4 MiB quota of its own, declared nowhere: only the workload every cache meets fills it (and,
    # as the bounded cache's, its 1k-token conversations miss: Not exercised).
    ZooConnector(GOOD + "quota:QuotaConnector", FILE_STORE_BUGS, not_exercised=frozenset({"api_shared_prefix"})),
    # ... and its twin whose lookup index outlives the files it evicts: claimed, then loaded from nothing.
    ZooConnector(BAD + "stale_index:StaleIndexConnector", frozenset({"api_reuse_distance", "api_shared_prefix"})
                 | FILE_STORE_BUGS),
)}

# P/D pairs (declared pd only): the positive control and one known-bad per P/D clause, each failing
# exactly it, with what its message must say; every prefix-cache clause is Disabled for them.
# (vLLM's NixlConnector passes these three at this level too, but once, on a loaded 2-core machine,
# one of its pairs hung holding the GIL in NIXL/UCX and was killed as designed: its connector-level
# verdicts live in the matrix's nixl cells, its engine-level pair in tests/levels/engine.)
PD_ZOO: dict[str, dict[str, str]] = {
    GOOD + "peer:PeerConnector": {},
    BAD + "pd_early_free:EarlyFreeConnector": {"api_pd_roundtrip": "had been given back to vLLM (and reused)"},
    BAD + "pd_reversed_blocks:ReversedBlocksPeerConnector": {
        "api_pd_roundtrip": "that differ from what the producer computed"},
    BAD + "pd_format_blind:FormatBlindConnector": {"api_pd_format_isolation": "took the other format's bytes"},
    BAD + "pd_peer_raises:PeerRaisesConnector": {
        "api_pd_lost_peer": "the connector raised in worker hooks: ConnectionRefusedError"},
}
