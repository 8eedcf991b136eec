"""vLLM 0.29 and later: the ``KVCacheLayout`` enum era (RFC #42082).

Layouts are the enum's members; every layer is a ``[B, H, N, C]`` view of one backing
allocation laid out by ``get_kv_cache_config_from_groups`` and ``allocate_kv_cache``, exactly
as the model runner allocates it (block-outermost members interleave the layers of a block:
vLLM's cross-layer blocks). The hooks are the shared ones of ``common.HookEra``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from conformance.levels.connector.eras.base import EraUnavailable
from conformance.levels.connector.eras.common import HookEra

ERA = "layout-enum (vLLM >= 0.29)"


def load() -> LayoutEnumEra:
    try:
        import vllm
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups  # noqa: F401
        from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: F401
        from vllm.v1.worker.utils import allocate_kv_cache  # noqa: F401
    except ImportError as exc:
        raise EraUnavailable(f"{exc}") from None
    return LayoutEnumEra(vllm.__version__)


class LayoutEnumEra(HookEra):
    name = ERA

    def layouts(self) -> list[str]:
        from vllm.v1.kv_cache_layout import KVCacheLayout

        return [member.name for member in KVCacheLayout]

    def _set_layout(self, cache_config: Any, layout: str) -> None:
        cache_config.kv_cache_layout = layout  # connectors are built after layout resolution

    def allocate(self, config: Any, layer_names: Sequence[str], num_blocks: int,
                 mla: bool) -> tuple[Any, dict[str, torch.Tensor]]:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheGroupSpec,
            MLAAttentionSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.worker.utils import allocate_kv_cache

        model = config.model_config
        common = dict(block_size=config.cache_config.block_size, dtype=self.storage_dtype(config),
                      num_kv_heads=model.get_num_kv_heads(config.parallel_config), head_size=model.get_head_size())
        spec = (MLAAttentionSpec(**common, cache_dtype_str=config.cache_config.cache_dtype) if mla
                else FullAttentionSpec(**common))
        config.cache_config.num_gpu_blocks_override = num_blocks
        windows = {} if mla else sliding_windows(model, layer_names)
        if windows:  # a hybrid model: vLLM's own grouping (one group per attention type, or one when
            # the hybrid KV cache manager is off, as it is for a connector that is not SupportsHMA)
            groups = get_kv_cache_groups(config, {name: SlidingWindowSpec(**common, sliding_window=windows[name])
                                                  if name in windows else spec for name in layer_names})
        else:
            groups = [KVCacheGroupSpec(list(layer_names), spec)]
        kv_cache_config = get_kv_cache_config_from_groups(
            config, groups, available_memory=spec.page_size_bytes * len(layer_names) * num_blocks)
        config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"),
                                   config.cache_config.get_resolved_kv_cache_layout())
        return kv_cache_config, caches


def sliding_windows(model_config: Any, layer_names: Sequence[str]) -> dict[str, int]:
    """Layer -> its sliding window, for the layers a hybrid model's config marks
    ``sliding_attention`` (gemma3-hybrid-tiny); empty for a model whose layers all attend fully."""
    text = model_config.hf_text_config
    types, window = getattr(text, "layer_types", None), getattr(text, "sliding_window", None)
    if not types or not window:
        return {}
    return {name: int(window) for name, kind in zip(layer_names, types) if kind == "sliding_attention"}
