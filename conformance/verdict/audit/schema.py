"""The input audit's vocabulary: for every clause, the fields its promise depends on, and how the clause draws two
inputs that differ only in each field (a near miss), early and late, by one unit and by a lot.

A bug hides where the inputs never differ in one field alone, or only at its start, or only by a lot.
So each field is drawn as a twin, and each of the four reaches is True (drawn) or, where it cannot
apply, the reason why (a dtype has no position; a salt is present or not). ``drawn_by`` names the code
that draws the twin; ``tests/verdict/test_audit.py`` checks it exists and that the clause's own test
module reaches it, so the audit cannot drift from what runs. ``docs/input-audit.md`` renders it.
"""

from __future__ import annotations

from typing import NamedTuple, Union

# What a twin pair can differ in: one word each, the same at every level.
FIELDS = {
    "key": "the key a store is asked (a field of a composite key, its case, its length)",
    "tokens": "the prompt's token ids (where two prompts first differ, and how much they share)",
    "cache_salt": "the request's cache_salt (tenant)",
    "lora": "the request's LoRA adapter (name, id, path, weights)",
    "embeds": "a prompt given as embeddings (their values, or token ids instead)",
    "image": "a prompt's image (its pixels; the placeholder token ids are the same)",
    "model": "the checkpoint (weights, directory) of the same architecture",
    "kv_cache_dtype": "the KV cache's element format (fp8_e4m3 / fp8_e5m2, bf16 / fp16)",
    "model_dtype": "the model's dtype under kv_cache_dtype=auto (the same config string, other bytes)",
    "layout": "the KV layout (NHD / HND, a cross-layer buffer)",
    "block_size": "the engine's block size (tokens per block)",
    "geometry": "the entry's shape (layers, tokens, heads, head size)",
    "rank": "the tensor-parallel rank (worker id, world size)",
    "scales": "the fp8 k_scale / v_scale",
    "size": "the entry's or prompt's size in bytes",
    "view": "the tensor's strides and storage offset (how the same content is laid out in memory)",
    "content": "the KV bytes themselves (bit patterns: NaN payloads, -0, subnormals)",
    "damage": "where stored bytes are corrupted or cut (which byte, which file)",
    "timing": "when a read comes after its write (reuse distance, steps, an abort or preemption)",
    "batch": "what else runs in the same step (batch-mates, neighbours' blocks)",
    "api": "the vLLM names the connector uses (present, renamed, gone)",
}

class Gap(str):
    """A reach that applies but is not drawn: what near miss is missing, and the bug it lets through."""


Reach = Union[bool, str]  # True: drawn; a Gap: not drawn (and what that lets through); a str: not applicable, and why


class Twin(NamedTuple):
    """One field a clause's promise depends on, and the near miss the clause draws in it."""

    field: str  # a key of FIELDS
    pair: str  # the two inputs drawn, in words
    early: Reach  # differing near the start (first field, first token, first byte)
    late: Reach  # differing near the end (last field, last block, last byte)
    slight: Reach  # by one unit (one character, one token, one bit, the twin format)
    large: Reach  # by a lot (the whole field, every token after a point, another format family)
    drawn_by: str  # "module:name" of the code that draws the pair


def unplaced(why: str) -> dict[str, str]:
    """``early`` and ``late`` of a field with no position to differ at (a dtype, a salt): ``why``."""
    return {"early": why, "late": why}
