"""Byte-level comparisons between runs, each returning what differs in words.

Slots are compared as raw bytes (``torch.equal`` on uint8), never as floats: NaN payloads
and -0 are content. A message names the layer, the token, the blocks and the first differing
byte, because "caches differ" helps nobody fix a connector. A connector that declares itself
lossy (``lossy=TOL``) is held to its tolerance instead: a layer's loaded values at once, or token
by token where tokens are attributed to the prompt that computed them (``same_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from conformance.levels.connector.runs import Run
from conformance.levels.connector.slots import by_block, token_rows, views_over
from conformance.verdict.asserts import relative_rms_error
from conformance.verdict.clauses import count_coded

MAX_REPORTED = 3
NULL_BLOCK = 0  # vLLM's null block: never a request's KV (a sliding window's slot outside the window)


def loaded_differences(stored: Run, stored_id: str, loaded: Run, loaded_id: str, ntokens: int, *,
                       held: bool = False, first: int = 0) -> list[str]:
    """Tokens [first, ntokens) as the load run holds them (``first``: the tokens vLLM's own prefix
    cache held, which the connector did not load), against what the store run's model wrote
    (where it first computed them: ``Run.origin``), or with ``held`` against what the store run's
    cache held for them at its end (tokens it loaded itself included). Each layer is read through
    its own KV cache group's blocks (a hybrid model has one group per attention type).

    Tokens in blocks the connector reported as failed loads are exempt: vLLM recomputes them; so
    are tokens in a null block on either side (a sliding window's blocks outside the window).
    """
    if ntokens <= first:
        return []
    written = stored.caches if held else views_over(stored.caches, stored.before)
    problems = []
    for layer, view in loaded.caches.items():
        slots = _slots(stored, stored_id, loaded, loaded_id, ntokens, loaded.groups.get(layer, 0), held, first)
        if slots is None:
            continue
        positions, src_blocks, dst_blocks = slots
        offsets = positions % loaded.block_size  # each side read at its own block size (they may differ)
        want = token_rows(written[layer], src_blocks, positions % stored.block_size)
        got = token_rows(view, dst_blocks, offsets)
        differs = (want != got).any(dim=1)
        if loaded.tolerance is not None:  # the layer's loaded values at once, as a lossy store is judged
            count_coded(len(differs), int(differs.sum()))
            error = float(_errors(want.reshape(1, -1), got.reshape(1, -1), loaded.element)[0])
            if not error <= loaded.tolerance:
                problems.append(f"{layer}: the values of its {len(positions)} loaded tokens are off by a relative RMS "
                                f"error of {error:.3g}, but the connector declares at most {loaded.tolerance:g} (lossy)")
            continue
        bad = differs.nonzero().flatten().tolist()
        if bad:
            i = bad[0]
            byte = int((want[i] != got[i]).nonzero()[0])
            problems.append(
                f"{layer}: {len(bad)} of {len(positions)} loaded tokens differ, first token {int(positions[i])} "
                f"(stored in block {int(src_blocks[i])}, loaded into block {int(dst_blocks[i])}, slot "
                f"{int(offsets[i])}): byte {byte} is 0x{int(got[i][byte]):02x}, but should be "
                f"0x{int(want[i][byte]):02x}")
    return problems[:MAX_REPORTED] + late_note(loaded, problems)


def late_note(run: Run, problems: Sequence[str]) -> list[str]:
    """Why loaded bytes differ where the load landed after the forward pass read them."""
    if not (problems and run.landed_late):
        return []
    return [f"{len(run.landed_late)} loaded block(s) changed after the forward pass had read them "
            f"({', '.join(run.landed_late[:MAX_REPORTED])}): the load landed after wait_for_layer_load returned, "
            "so the model computed with what the blocks held before (what is compared is what it read): "
            "wait_for_layer_load(layer) must return only once that layer's loaded KV is in place"]


def same_rows(want: torch.Tensor, got: torch.Tensor, loaded: Run) -> torch.Tensor:
    """Which token rows (bytes) ``got`` holds as ``want``: byte for byte, or for a lossy connector
    its values within the declared tolerance, row by row (``_errors``)."""
    if loaded.tolerance is None:
        return ~(want != got).any(dim=1)
    return _errors(want, got, loaded.element) <= loaded.tolerance


def _errors(want: torch.Tensor, got: torch.Tensor, element: torch.dtype) -> torch.Tensor:
    """Each row's ``relative_rms_error``, read as values of the cache's ``element`` format, over the
    values finite where they were written (random fills hold NaN and inf; KV never does)."""
    values = [rows.contiguous().view(element).to(torch.float64) for rows in (want, got)]
    finite = values[0].isfinite()
    w, g = (torch.where(finite, v, torch.zeros_like(v)) for v in values)
    return relative_rms_error(g, w, dim=1)


def _slots(stored: Run, stored_id: str, loaded: Run, loaded_id: str, ntokens: int, group: int,
           held: bool, first: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(positions, stored blocks, loaded blocks) of the tokens to compare in ``group``, or None."""
    if group == 0:
        src_ids, dst_ids = (stored.blocks if held else stored.origin)[stored_id], loaded.blocks[loaded_id]
    else:
        src_ids, dst_ids = stored.group_blocks[stored_id][group], loaded.group_blocks[loaded_id][group]
    end = min(ntokens, len(src_ids) * stored.block_size, len(dst_ids) * loaded.block_size)
    if end <= first:  # no token of the range in both requests' blocks
        return None
    positions = torch.arange(first, end)
    src_blocks = torch.tensor(src_ids, dtype=torch.long)[positions // stored.block_size]
    dst_blocks = torch.tensor(dst_ids, dtype=torch.long)[positions // loaded.block_size]
    keep = torch.tensor([not _exempt_block(loaded, int(d)) and int(s) != NULL_BLOCK
                         for s, d in zip(src_blocks, dst_blocks)], dtype=torch.bool)
    if not bool(keep.any()):  # every loaded block was reported failed (or lies outside a window)
        return None
    return positions[keep], src_blocks[keep], dst_blocks[keep]


def changed_blocks(run: Run, blocks: Iterable[int]) -> list[str]:
    """Blocks among ``blocks`` whose bytes differ from before the run, per layer."""
    ids = sorted(set(blocks))
    if not ids:
        return []
    index = torch.tensor(ids, dtype=torch.long)
    before = views_over(run.caches, run.before)
    problems = []
    for layer, view in run.caches.items():
        was = by_block(before[layer])[index].contiguous().view(torch.uint8).reshape(len(ids), -1)
        now = by_block(view)[index].contiguous().view(torch.uint8).reshape(len(ids), -1)
        bad = [ids[i] for i in (was != now).any(dim=1).nonzero().flatten().tolist()]
        if bad:
            problems.append(f"{layer}: block(s) {bad[:8]} changed")
    return problems[:MAX_REPORTED]


def unowned_blocks(run: Run, owner: str) -> list[int]:
    """Every block of the cache that ``owner`` does not hold (the null block 0 included)."""
    owned = set(run.blocks.get(owner, ()))
    return [b for b in range(run.num_blocks) if b not in owned]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two prompts share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Source:
    """A request that computed KV a later load may be served: in ``run``, request ``rid`` of
    ``prompt``, which computed its tokens from ``computed_from`` on (those before it were loaded)."""

    run: Run
    rid: str
    prompt: Sequence[int]
    computed_from: int = 0


def unsourced_tokens(sources: Sequence[Source], loaded: Run, loaded_id: str, prompt: Sequence[int], first: int,
                     ntokens: int) -> list[str]:
    """Tokens [first, ntokens) the load run holds for ``loaded_id`` (of ``prompt``) that no source
    computed. A token's KV is a function of the prefix it attends to, so each loaded token must hold
    the bytes some source computed for the same token with the same prefix up to it: a connector that
    dedups a shared system prompt serves any conversation's copy of it, but never, past the point two
    prompts part, the other prompt's KV. Says, for the first token that fails, whose KV it holds."""
    if ntokens <= first:
        return []
    problems = []
    for layer, view in loaded.caches.items():
        group = loaded.groups.get(layer, 0)
        sourced = torch.zeros(ntokens - first, dtype=torch.bool)
        foreign: dict[int, str] = {}  # position -> a source with another prefix whose bytes it holds
        for source in sources:
            shared = common_prefix(prompt, source.prompt)
            start = max(first, source.computed_from)
            slots = _slots(source.run, source.rid, loaded, loaded_id, ntokens, group, False, start)
            if slots is None:
                continue
            positions, src_blocks, dst_blocks = slots
            want = token_rows(views_over(source.run.caches, source.run.before)[layer], src_blocks,
                              positions % source.run.block_size)
            got = token_rows(view, dst_blocks, positions % loaded.block_size)
            same = same_rows(want, got, loaded)
            mine = positions < shared
            sourced[positions[same & mine] - first] = True
            if loaded.tolerance is not None:  # held to the tolerance: was the codec in this load's path?
                kept = same & mine
                count_coded(int(kept.sum()), int((kept & (want != got).any(dim=1)).sum()))
            for p in positions[same & ~mine].tolist():
                foreign.setdefault(p, f"{source.rid!r}, whose prompt parts from this one at token {shared}")
        exempt = _exempt(loaded, loaded_id, group, first, ntokens)
        bad = (~sourced & ~exempt).nonzero().flatten().tolist()
        if bad:
            p = bad[0] + first
            whose = f"the KV request {foreign[p]} computed" if p in foreign else "bytes no request computed there"
            problems.append(f"{layer}: {len(bad)} of {ntokens - first} loaded tokens hold KV computed for another "
                            f"prefix, first token {p}: it holds {whose}")
    return problems[:MAX_REPORTED] + late_note(loaded, problems)


def _exempt(loaded: Run, loaded_id: str, group: int, first: int, ntokens: int) -> torch.Tensor:
    """Positions [first, ntokens) in blocks reported as failed loads or in the null block (vLLM
    recomputes or never reads them)."""
    ids = loaded.blocks[loaded_id] if group == 0 else loaded.group_blocks[loaded_id][group]
    blocks = [ids[p // loaded.block_size] if p // loaded.block_size < len(ids) else NULL_BLOCK
              for p in range(first, ntokens)]
    return torch.tensor([_exempt_block(loaded, b) for b in blocks], dtype=torch.bool)


def _exempt_block(loaded: Run, block: int) -> bool:
    """A loaded block no comparison judges: reported as a failed load (vLLM recomputes it) or the
    null block (a sliding window's slot outside the window)."""
    return block in loaded.load_errors or block == NULL_BLOCK
