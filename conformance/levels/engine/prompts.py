"""The prompts an engine cell asks for: around block boundaries, extending a stored prefix, a
concurrent batch, tenants, prompts given as embeddings, conversations after a long shared system
prompt, and the bounded-cache workload sized to a declared capacity. Seeded: every cell and every
run asks for the same tokens."""

from __future__ import annotations

import random
from typing import Callable

from conformance.levels.capabilities import PRESSURE_FACTOR
from conformance.levels.engine.models import IMAGE_MODEL, load_recipe
from conformance.levels.engine.specs import Batch

# The batches a cell draws, by name: a role's phases name them (``roles.Role.phases``), a clause reads
# their requests by them.
BOUNDARIES, EXTENDS, CONCURRENT = "boundaries", "extends", "concurrent"
ABORTED, AFTER_ABORT = "aborted", "after_abort"
SALTED, TENANT, UNTENANTED, OTHER_TENANT = "salted", "tenant", "untenanted", "other_tenant"
ADAPTED, ADAPTER_STORED, BASE_ON_ADAPTER = "adapted", "adapter_stored", "base_on_adapter"
OTHER_ADAPTER, ADAPTER_VERSION = "other_adapter", "adapter_version"
EMBEDS_STORED, OTHER_EMBEDS, EMBEDS_AGAIN = "embeds_stored", "other_embeds", "embeds_again"
EMBEDS_AS_TOKENS, TOKENS_AS_EMBEDS = "embeds_as_tokens", "tokens_as_embeds"
IMAGE_STORED, OTHER_IMAGE, IMAGE_AGAIN = "image_stored", "other_image", "image_again"
REUSED, SYSTEM = "reused", "system"
PRESSURE, PRESSURE_AGAIN = "pressure", "pressure_again"  # drawn only for a declared capacity
STORED = (BOUNDARIES, CONCURRENT)  # what a storing engine serves (a P/D producer prefills)
LOADED = (EXTENDS, BOUNDARIES, CONCURRENT)  # what an engine reading them asks for, and is compared on

VOCAB_LOW, VOCAB_HIGH = 4, 2048
REUSED_BLOCKS = 5  # the blocks of each "reused" prompt; its store engine has one usable block more
MAX_PRESSURE_PROMPTS = 48  # what one engine cell stores for the pressure workload, at most
PRESSURE_PROMPT_BLOCKS = (2, 16)  # each of its prompts' length, in blocks, at least and at most (the models' 1024 positions)


def prompt_batches(block_size: int, seed: int = 0, positions: int = 1024, pad: int = 0) -> dict[str, Batch]:
    """Prompts around block boundaries, one extending a stored prefix, a concurrent batch, and the
    rest below; ``positions``: the model's, which bound the system prompt (``system_tokens``);
    ``pad``: whole blocks every prompt (and the shared prefix) is lengthened by, for a connector
    that declares a min span (``capabilities.span_pad``)."""
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
        BOUNDARIES: {"name": BOUNDARIES, "prompts": boundaries},
        EXTENDS: {"name": EXTENDS, "prompts": [boundaries[-1] + tokens(bs + 11)]},
        CONCURRENT: {"name": CONCURRENT, "prompts": concurrent, "together": True},
        # Stored prompts asked for by another tenant: vLLM keys its own prefix cache by cache_salt.
        SALTED: {"name": SALTED, "prompts": boundaries[-2:], "cache_salt": SALT},
        # Stored prompts asked for under a LoRA adapter (one that changes K and V): their KV differs.
        ADAPTED: {"name": ADAPTED, "prompts": boundaries[-2:], "lora": True},
        # Requests the client abandons one engine step after adding them (prefilled, their KV saved or
        # being saved), then the same prompts asked for again.
        ABORTED: {"name": ABORTED, "prompts": abandoned, "abort_after_steps": 1},
        AFTER_ABORT: {"name": AFTER_ABORT, "prompts": abandoned},
        # Prompts of REUSED_BLOCKS blocks each, for an engine of one block more: each is given the
        # blocks the one before it gave back (vLLM's free queue hands out the least recently used).
        REUSED: {"name": REUSED, "prompts": [prompt((REUSED_BLOCKS - 1) * bs + bs // 3 + i) for i in range(3)]},
        # Tenants the other way: prompts a salted tenant stored (drawn last: the prompts above keep
        # their tokens), asked for again with no salt and under a third tenant's salt.
        **_tenant_batches([prompt(2 * bs + 5), prompt(3 * bs + 1)]),
        # Adapters the other way: prompts stored under the LoRA adapter, asked for by the base model.
        ADAPTER_STORED: {"name": ADAPTER_STORED, "prompts": (adapter := [prompt(2 * bs + 7)]), "lora": True},
        BASE_ON_ADAPTER: {"name": BASE_ON_ADAPTER, "prompts": adapter},
        OTHER_ADAPTER: {"name": OTHER_ADAPTER, "prompts": adapter, "lora": "b"},  # adapter A's, asked under B
        # ... and under A's next version (its name, other weights: vLLM's load_inplace), in a phase of its own
        # (last: from then on A's name computes with the new weights).
        ADAPTER_VERSION: {"name": ADAPTER_VERSION, "prompts": adapter, "lora": "a2"},
        # Prompts given as embeddings (drawn last, as above: lengths only, the child draws the embeddings).
        **_embeds_batches(2 * bs + 7 + pad),
        # Conversations after one long system prompt (drawn last, as above), one by one: a fresh engine
        # loads the first; for the others vLLM's own prefix cache holds the system prompt (and the
        # first conversation) and the connector is asked only for the rest (local and external hits).
        SYSTEM: {"name": SYSTEM, "prompts": _conversations(tokens(system_tokens(positions)), tokens)},
        # Prompts opening with an image, for the vision-language model (its own draw: the prompts above
        # keep their tokens).
        **_image_batches(3 * bs + 5 + pad),
    }


def pressure_batches(capacity: int, token_bytes: int, block_size: int, pad: int = 0) -> dict[str, Batch] | str:
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
    return {PRESSURE: {"name": PRESSURE, "prompts": prompts},
            PRESSURE_AGAIN: {"name": PRESSURE_AGAIN, "prompts": prompts[::-1]}}


def _conversations(system: list[int], tokens: Callable[[int], list[int]]) -> list[list[int]]:
    first = system + tokens(41)
    return [first, system + tokens(97), first + tokens(40)]


def _embeds_batches(length: int) -> dict[str, Batch]:
    """Prompts given as embeddings (``"embeds"``: each prompt's seed; no token ids, vLLM puts zeros in
    their place) crossed with token ids every way: another prompt's embeddings and the zeros asked
    for after one was stored, then embeddings asked for after the zeros were stored (by the phase
    before). The same embeddings asked for again are the same tenant: they still load."""
    zeros = [[0] * length]
    return {EMBEDS_STORED: {"name": EMBEDS_STORED, "prompts": zeros, "embeds": [EMBEDS_SEEDS[0]]},
            OTHER_EMBEDS: {"name": OTHER_EMBEDS, "prompts": zeros, "embeds": [EMBEDS_SEEDS[1]]},
            EMBEDS_AS_TOKENS: {"name": EMBEDS_AS_TOKENS, "prompts": zeros},
            EMBEDS_AGAIN: {"name": EMBEDS_AGAIN, "prompts": zeros, "embeds": [EMBEDS_SEEDS[0]]},
            TOKENS_AS_EMBEDS: {"name": TOKENS_AS_EMBEDS, "prompts": zeros, "embeds": [EMBEDS_SEEDS[2]]}}


EMBEDS_SEEDS = (1, 2, 3)  # the seeds of the three prompts given as embeddings


def _image_batches(length: int) -> dict[str, Batch]:
    """One prompt of ``length`` words after an image (``"images"``: each prompt's image seed), stored
    with one image, then asked for with another behind the same placeholder tokens, and with the
    same again (which still loads). The image opens the prompt, so every block's KV depends on it."""
    rng = random.Random("images")
    vocabulary = load_recipe(IMAGE_MODEL)["images"]["words"]  # the image model's words: w4 up to it
    words = [[rng.randrange(VOCAB_LOW, vocabulary) for _ in range(length)]]
    return {IMAGE_STORED: {"name": IMAGE_STORED, "prompts": words, "images": [IMAGE_SEEDS[0]]},
            OTHER_IMAGE: {"name": OTHER_IMAGE, "prompts": words, "images": [IMAGE_SEEDS[1]]},
            IMAGE_AGAIN: {"name": IMAGE_AGAIN, "prompts": words, "images": [IMAGE_SEEDS[0]]}}


IMAGE_SEEDS = (1, 2)  # the seeds of the two images (noise) behind the same placeholder tokens


def _tenant_batches(prompts: list[list[int]]) -> dict[str, Batch]:
    return {TENANT: {"name": TENANT, "prompts": prompts, "cache_salt": SALT},
            UNTENANTED: {"name": UNTENANTED, "prompts": prompts},
            OTHER_TENANT: {"name": OTHER_TENANT, "prompts": prompts, "cache_salt": THIRD_SALT}}


# The shared system prompt: 4,098 tokens (a 4k prompt one past a block boundary) where the model's
# positions leave room for the conversations after it (qwen3-tiny's 4,608), else as long as they
# allow (773 on the 1,024-position models). Longer ones are the connector level's (api_shared_prefix).
LONGEST_SYSTEM = 4098
OUTPUT_ROOM = 16  # tokens an engine generates past a prompt, with room
CONVERSATION_ROOM = 251  # the longest conversation's own tokens and its output, with room to spare


def system_tokens(positions: int) -> int:
    return min(LONGEST_SYSTEM, positions - CONVERSATION_ROOM)


SALT = "kvconform-another-tenant"  # the cache_salt of the SALTED batch (and of TENANT)
THIRD_SALT = "kvconform-third-tenant"  # TENANT's prompts asked for by yet another tenant
