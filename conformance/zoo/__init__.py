"""The known-bad zoo: stores that each carry one real bug, and the clauses that must catch it.

A clause earns its place by failing a store that is really broken. ``tests/zoo/test_zoo.py`` runs
the whole suite against every member and asserts that every clause in ``fails`` fails, nothing
outside ``fails`` and ``may_fail`` fails, and every failure message names its clause.
``may_fail`` lists the clauses that catch the same bug only when the examples happen to exercise
it (a state machine whose runs stay on one-byte formats never sees a 16-bit truncation): like
wpt's known-intermittent expectations, they may pass or fail, never turn the run red. ``hanging`` is not a conformance bug but
a harness fault: it must end as Error, never hang the run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ZooMember:
    target: str
    bug: str
    fails: frozenset[str]
    may_fail: frozenset[str] = frozenset()


ZOO: dict[str, ZooMember] = {m.target.split(":")[0].rsplit(".", 1)[-1]: m for m in (
    ZooMember("conformance.zoo.naive_fp16:make_store",
              "the original report's cache layer: 'KV is fp16' (casts on put, records fp16, "
              "parses fp16 and casts on get, drops scales, keys by token hash only)",
              frozenset({"byte_exact_roundtrip", "dtype_preserved", "stride_contract",
                         "metadata_roundtrip", "scales_roundtrip", "format_isolation",
                         "mismatch_rejection", "long_reuse_distance"}),
              frozenset({"state_machine"})),
    ZooMember("conformance.zoo.wrong_stride_view:make_store",
              "saves the tensor's memory span and views it back with the logical shape: "
              "'shape matches but stride differs'",
              frozenset({"stride_contract"})),
    ZooMember("conformance.zoo.understated_loss:make_store",
              "a quantizing codec that declares less loss than it makes (lossy_tolerance 0.002 for a relative "
              "RMS error near 0.01): its values are held to what it declares",
              frozenset({"stride_contract", "format_isolation", "state_machine", "long_reuse_distance"})),
    ZooMember("conformance.zoo.scale_dropping:make_store",
              "claims scales but writes k_scale/v_scale as 1.0",
              frozenset({"scales_roundtrip"}), frozenset({"state_machine"})),
    ZooMember("conformance.zoo.format_blind_key:make_store",
              "addresses entries by key only, as a cache keyed on the torch dtype 'uint8' does: "
              "fp8_e4m3 and fp8_e5m2 serve each other's bytes",
              frozenset({"format_isolation"})),
    ZooMember("conformance.zoo.truncating:make_store",
              "writes numel bytes instead of nbytes and zero-fills on read",
              frozenset({"byte_exact_roundtrip", "stride_contract", "long_reuse_distance"}),
              frozenset({"format_isolation", "state_machine"})),
    ZooMember("conformance.zoo.unchecked:make_store",
              "trusts its bytes at rest: no length or checksum check, zero-fills short payloads",
              frozenset({"corruption_detected"})),
    ZooMember("conformance.zoo.flattening:make_store",
              "returns pages flattened to [rows, last_dim]",
              frozenset({"shape_preserved"})),
    ZooMember("conformance.zoo.referencing_put:make_store",
              "keeps a reference to the caller's tensor, not its bytes (an asynchronous save that "
              "reads a block vLLM has already reused)",
              frozenset({"no_aliasing"})),
    ZooMember("conformance.zoo.write_behind:make_store",
              "keeps a reference to the caller's tensor until the key's first read, then copies it (a "
              "write-behind store: a block reused between put and the first get is stored as this KV)",
              frozenset({"no_aliasing"})),
    ZooMember("conformance.zoo.shared_buffer_get:make_store",
              "hands out its own buffer on get (a zero-copy read the engine then writes into)",
              frozenset({"no_aliasing"})),
    ZooMember("conformance.zoo.key_truncating:make_store",
              "keeps the first 64 characters of a key: real keys, which share long prefixes, collide",
              frozenset({"state_machine"})),
    ZooMember("conformance.zoo.key_capped:make_store",
              "cuts keys to 250 bytes (memcached's limit; a file named after its key is cut at 255): "
              "LMCache's keys under a long model path, which differ only at the end, collide",
              frozenset({"state_machine"})),
    ZooMember("conformance.zoo.case_folding:make_store",
              "folds keys to lower case (a case-insensitive file system, a lower()ing normaliser): "
              "keys that differ only in case serve each other's KV",
              frozenset({"state_machine"})),
    ZooMember("conformance.zoo.value_capped:make_store",
              "keeps at most 1 MiB of a value and zero-fills the rest (a silent item-size cap)",
              frozenset({"byte_exact_roundtrip", "stride_contract", "state_machine"})),
    ZooMember("conformance.zoo.first_put_wins:make_store",
              "ignores a put of a key it holds and keeps serving the first entry (LMCache's LocalCPU "
              "and LocalDisk backends)",
              frozenset({"state_machine"})),
    ZooMember("conformance.zoo.config_string_key:make_store",
              "files an entry under the kv_cache_dtype string, not the model's dtype: under 'auto' a bf16 "
              "model's cache and an fp16 model's are one format, served to each other",
              frozenset({"format_isolation"})),
    ZooMember("conformance.zoo.middle_elided_key:make_store",
              "shortens a key past 200 bytes to its first and last 96 characters: long keys that differ only "
              "in a middle field (a fine-tune's model path) collide",
              frozenset({"state_machine"})),
    ZooMember("conformance.zoo.inline_small:make_store",
              "keeps values under 4 KiB inline in 2,000-byte index rows and zero-fills the rest: the smallest "
              "real entry (one KV head of 64, 16 fp8 tokens, 2 KiB) loses its tail",
              frozenset({"byte_exact_roundtrip", "state_machine", "long_reuse_distance"}),
              frozenset({"stride_contract", "no_aliasing"})),
    ZooMember("conformance.zoo.index_outliving:make_store",
              "a bounded store (32 MiB, declared nowhere) that evicts an entry's bytes but keeps its index: "
              "contains says yes and get serves zeros after a long reuse distance",
              frozenset({"long_reuse_distance"})),
    ZooMember("conformance.zoo.short_dims:make_store",
              "packs an entry's shape into 16-bit fields and reads the bytes back by it: a dimension past "
              "65,535 (a pool of 65,537 one-token blocks) wraps to 1, the rest of the entry dropped",
              frozenset({"byte_exact_roundtrip", "shape_preserved", "stride_contract", "state_machine"})),
    ZooMember("conformance.zoo.resurrecting_delete:make_store",
              "delete drops the index entry but get still serves the bytes",
              frozenset({"state_machine"})),
)}
