"""vLLM 0.29 and later: the ``KVCacheLayout`` enum era (RFC #42082).

Layouts are the enum's members; every layer is a ``[B, H, N, C]`` view of one backing
allocation laid out by ``get_kv_cache_config_from_groups`` and ``allocate_kv_cache``, exactly
as the model runner allocates it (block-outermost members interleave the layers of a block:
vLLM's cross-layer blocks). The worker hooks run in the order of
``KVConnectorModelRunnerMixin._get_kv_connector_output``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import torch

from conformance.connector_api.eras.base import EraUnavailable

ERA = "layout-enum (vLLM >= 0.29)"


def load() -> LayoutEnumEra:
    try:
        import vllm
        from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: F401
        from vllm.v1.worker.utils import allocate_kv_cache  # noqa: F401
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups  # noqa: F401
    except ImportError as exc:
        raise EraUnavailable(f"{exc}") from None
    return LayoutEnumEra(vllm.__version__)


class LayoutEnumEra:
    name = ERA

    def __init__(self, vllm_version: str) -> None:
        self.vllm_version = vllm_version
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        self._hasher = lambda block_size: get_request_block_hasher(block_size, sha256)

    def layouts(self) -> list[str]:
        from vllm.v1.kv_cache_layout import KVCacheLayout

        return [member.name for member in KVCacheLayout]

    def make_config(self, *, model: str, transfer: Mapping[str, Any], kv_cache_dtype: str,
                    layout: str, block_size: int) -> Any:
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                                 SchedulerConfig, VllmConfig)

        model_config = ModelConfig(model=model, seed=0)
        scheduler_config = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=4096,
                                           max_model_len=model_config.max_model_len,
                                           enable_chunked_prefill=True, is_encoder_decoder=False)
        cache_config = CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype, enable_prefix_caching=True)
        cache_config.kv_cache_layout = layout  # connectors are built after layout resolution
        return VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                          cache_config=cache_config, kv_transfer_config=KVTransferConfig(**transfer),
                          device_config=DeviceConfig("cpu"))

    def storage_dtype(self, config: Any) -> torch.dtype:
        from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

        return kv_cache_dtype_str_to_dtype(config.cache_config.cache_dtype, config.model_config)

    def allocate(self, config: Any, layer_names: Sequence[str], num_blocks: int,
                 mla: bool) -> tuple[Any, dict[str, torch.Tensor]]:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MLAAttentionSpec
        from vllm.v1.worker.utils import allocate_kv_cache

        model = config.model_config
        common = dict(block_size=config.cache_config.block_size, dtype=self.storage_dtype(config),
                      num_kv_heads=model.get_num_kv_heads(config.parallel_config), head_size=model.get_head_size())
        spec = (MLAAttentionSpec(**common, cache_dtype_str=config.cache_config.cache_dtype) if mla
                else FullAttentionSpec(**common))
        config.cache_config.num_gpu_blocks_override = num_blocks
        kv_cache_config = get_kv_cache_config_from_groups(
            config, [KVCacheGroupSpec(list(layer_names), spec)],
            available_memory=spec.page_size_bytes * len(layer_names) * num_blocks)
        config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"),
                                   config.cache_config.get_resolved_kv_cache_layout())
        return kv_cache_config, caches

    def make_scheduler(self, config: Any, kv_cache_config: Any) -> Any:
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        return Scheduler(vllm_config=config, kv_cache_config=kv_cache_config,
                         structured_output_manager=StructuredOutputManager(config),
                         block_size=config.cache_config.block_size, log_stats=True)

    def make_worker_connector(self, config: Any, kv_cache_config: Any) -> Any:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        return KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_cache_config)

    def make_request(self, request_id: str, prompt: Sequence[int], block_size: int) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=1)
        params.update_from_generation_config({}, 0)
        return Request(request_id=request_id, prompt_token_ids=list(prompt), sampling_params=params,
                       pooling_params=None, block_hasher=self._hasher(block_size))

    def run_worker_step(self, worker: Any, scheduler_output: Any, caches: Mapping[str, torch.Tensor],
                        mla: bool, config: Any) -> Any:
        """vLLM's own model-runner connector code for one step (``_get_kv_connector_output``, which
        calls the hooks this vLLM calls, in its order), around what each attention layer does."""
        from vllm.distributed.kv_transfer import kv_transfer_state
        from vllm.forward_context import set_forward_context
        from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

        metadata = {name: _attention_metadata(mla) for name in caches}
        config.compilation_config.static_forward_context = {
            name: SimpleNamespace(kv_cache=cache) for name, cache in caches.items()}
        kv_transfer_state._KV_CONNECTOR_AGENT = worker
        try:
            with set_forward_context(metadata, config), \
                    KVConnectorModelRunnerMixin._get_kv_connector_output(scheduler_output) as output:
                for name, cache in caches.items():  # what each attention layer's forward does
                    worker.wait_for_layer_load(name)
                    worker.save_kv_layer(name, cache, metadata[name])
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = None
        return output

    def model_runner_output(self, scheduler: Any, scheduler_output: Any, connector_output: Any,
                            token: int) -> Any:
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(scheduler_output.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            request = scheduler.requests[rid]
            done = request.num_computed_tokens >= request.num_prompt_tokens
            sampled.append([token] if done else [])
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                 pooler_output=None, kv_connector_output=connector_output)


def _attention_metadata(mla: bool) -> Any:
    """Per-layer attention metadata of the type connectors test for (MLA or not); no fields read."""
    if mla:
        from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadata

        return object.__new__(MLACommonMetadata)
    return SimpleNamespace()
