"""What every era does the same way: the scheduler, the worker connector, requests and the
model runner's connector hooks. These APIs held still across the eras; only the config's
layout knob and the KV cache allocator moved, which is what each era module supplies.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from types import SimpleNamespace
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

import torch

from conformance.levels.connector.eras.base import EraUnavailable, Image
from conformance.levels.releases import engine_settings


class HookEra:
    """The era-independent half of ``Era``; subclasses add ``layouts``, ``_set_layout`` and ``allocate``."""

    name: str

    def __init__(self, vllm_version: str) -> None:
        self.vllm_version = vllm_version
        self.worker_module: str | None = None  # imported by worker_setup (platform_worker)
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        self._hasher = lambda block_size: get_request_block_hasher(block_size, sha256)

    def _set_layout(self, cache_config: Any, layout: str) -> None:
        """Put ``layout`` where this vLLM reads it, before the ``VllmConfig`` is built."""
        raise NotImplementedError

    def make_config(self, *, model: str, transfer: Mapping[str, Any], kv_cache_dtype: str,
                    layout: str, block_size: int, scheduling: Mapping[str, int] | None = None,
                    serves: frozenset[str] = frozenset(), model_dtype: str | None = None) -> Any:
        from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, LoRAConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.config.kv_events import KVEventsConfig

        embeds = {"enable_prompt_embeds": True} if "prompt_embeds" in serves else {}
        knobs = {"max_num_seqs": 16, "max_num_batched_tokens": 4096, **(scheduling or {})}
        longest = knobs.pop("max_model_len", None)  # a scenario's long prompt, past the model's own limit
        with _long_prompts_allowed(longest is not None):
            model_config = ModelConfig(model=model, seed=0, **embeds, **({"dtype": model_dtype} if model_dtype else {}),
                                       **({"max_model_len": longest} if longest else {}))
        settings = {"enable_chunked_prefill": True, "enable_prefix_caching": True}
        for rule in engine_settings(self.vllm_version, "cpu", kv_cache_dtype):  # what this release requires
            settings.update(rule["settings"])
        scheduler_config = SchedulerConfig(**knobs, max_model_len=model_config.max_model_len,
                                           enable_chunked_prefill=settings["enable_chunked_prefill"],
                                           is_encoder_decoder=False)
        cache_config = CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype,
                                   enable_prefix_caching=settings["enable_prefix_caching"])
        self._set_layout(cache_config, layout)
        return VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                          cache_config=cache_config, kv_transfer_config=KVTransferConfig(**transfer),
                          device_config=DeviceConfig("cpu"), lora_config=LoRAConfig(max_loras=2) if "lora" in serves else None,
                          kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null")
                          if "events" in serves else None)

    def storage_dtype(self, config: Any) -> torch.dtype:
        from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

        return kv_cache_dtype_str_to_dtype(config.cache_config.cache_dtype, config.model_config)

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

    def worker_setup(self, config: Any) -> ContextManager[Any]:
        """vLLM's worker wrapper runs ``initialize_from_config`` (connector built, caches registered)
        under ``set_current_vllm_config``; a connector may read it there (LMCache's MLA path does).
        Before that, a worker process has imported its platform's worker module (``platform_worker``)
        and has its distributed world: a world of one here, on gloo, as a one-process CPU worker
        has (NixlConnector asks for its tensor-parallel group)."""
        from vllm.config import set_current_vllm_config

        from conformance.verdict.guard import HarnessError

        try:
            self.worker_module = platform_worker()
            with set_current_vllm_config(config):
                _world_of_one()
        except Exception as exc:  # the suite's setup, not the connector's fault
            raise HarnessError(f"vLLM's distributed world (one rank, gloo) could not be set up here: "
                               f"{type(exc).__name__}: {exc}") from exc
        return set_current_vllm_config(config)

    def required_layout(self, config: Any) -> str | None:
        """The KV cache layout the connector requires (``get_required_kvcache_layout``: NixlConnector's
        LBHNC), which vLLM then allocates whatever else was asked; None when it requires none."""
        from vllm.distributed.kv_transfer.kv_connector.utils import get_kv_connector_cache_layout

        required = get_kv_connector_cache_layout(config)
        return None if required is None else str(getattr(required, "name", required))

    def relay_handshake(self, worker: Any, scheduler: Any) -> None:
        """What the engine core does once the workers registered their caches: the worker-side
        connector's handshake metadata handed to the scheduler-side one (NixlConnector serves it
        to its peers)."""
        get = getattr(worker, "get_handshake_metadata", None)
        metadata = get() if get is not None else None
        connector = scheduler.get_kv_connector() if hasattr(scheduler, "get_kv_connector") else scheduler.connector
        if metadata is None or connector is None:
            return
        if hasattr(connector, "set_xfer_handshake_metadata_pp_aware"):
            connector.set_xfer_handshake_metadata_pp_aware({(0, 0): metadata})
        else:
            connector.set_xfer_handshake_metadata({0: metadata})

    def make_request(self, request_id: str, prompt: Sequence[int], block_size: int,
                     cache_salt: str | None = None, kv_transfer_params: dict[str, Any] | None = None,
                     lora: str | None = None, prompt_embeds: torch.Tensor | None = None,
                     image: Image | None = None) -> Any:
        """A one-token request, carrying ``kv_transfer_params`` as vLLM's API server hands them over
        (in the sampling params' ``extra_args``), for the LoRA adapter named ``lora`` if given (its
        id derived from the name, as a server's adapter registry fixes one per adapter; ``name@version``:
        another version of that adapter, the same name and id from another directory, as vLLM's
        ``load_inplace`` replaces one); given
        ``prompt_embeds``, a prompt of embeddings with no token ids (``prompt`` gives only its length);
        given ``image``, a prompt whose tokens there are that image's placeholders (no pixels: the
        scheduler and the connector see only its identifier and place, as in an engine core)."""
        import zlib

        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=1,
                                extra_args={"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params else None)
        params.update_from_generation_config({}, 0)
        return Request(request_id=request_id, prompt_token_ids=None if prompt_embeds is not None else list(prompt),
                       prompt_embeds=prompt_embeds, sampling_params=params,
                       pooling_params=None, block_hasher=self._hasher(block_size), cache_salt=cache_salt,
                       lora_request=LoRARequest(name, zlib.crc32(name.encode()) % 2**30 + 1, f"/kvconform/lora/{lora}")
                       if lora and (name := lora.partition("@")[0]) else None,
                       **({"mm_features": [_feature(image)]} if image else {}))

    def take_images(self, scheduler: Any, tokens: int) -> None:
        """The encoder budget and encoder cache a multimodal model's scheduler sizes for itself."""
        if not hasattr(scheduler, "max_num_encoder_input_tokens"):
            raise EraUnavailable("its scheduler has no encoder budget (max_num_encoder_input_tokens)")
        scheduler.max_num_encoder_input_tokens = tokens
        scheduler.encoder_cache_manager = type(scheduler.encoder_cache_manager)(cache_size=tokens)

    def abort(self, scheduler: Any, request_id: str) -> None:
        """What the engine core does when a client goes away: the scheduler's own finish path."""
        from vllm.v1.request import RequestStatus

        scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)

    def logged_stats(self, transfer: Mapping[str, Any], engine_outputs: Sequence[Any]) -> dict[str, int | float] | None:
        """The engine core's outputs through its msgpack encoder and the frontend's decoder, their
        connector stats observed by vLLM's own ``KVConnectorLogging`` (``build_kv_connector_stats``,
        ``aggregate``) and logged (``is_empty``, ``reduce``) as its logger does, over one interval."""
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
        from vllm.v1.engine import EngineCoreOutputs
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
        logging = KVConnectorLogging(KVTransferConfig(**transfer))
        for outputs in engine_outputs:
            logging.observe(decoder.decode(encoder.encode(outputs)).scheduler_stats.kv_connector_stats)
        accumulated = logging.transfer_stats_accumulator
        if accumulated is None:
            return None
        return {} if accumulated.is_empty() else accumulated.reduce()  # what KVConnectorLogging.log prints

    def event_hashes(self, request: Any) -> list[Any]:
        """The request's block hashes as vLLM's KV events carry them (``ExternalBlockHash``)."""
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        return [maybe_convert_block_hash(h) for h in request.block_hashes]

    def published_events(self, events: Sequence[Any]) -> list[Any]:
        """``events`` as a consumer of vLLM's event publisher reads them: a ``KVEventBatch`` through
        msgspec's msgpack encoder (the publisher's) and a decoder of that type (a router's)."""
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        batch = KVEventBatch(ts=0.0, events=list(events))
        return msgspec.msgpack.Decoder(KVEventBatch).decode(msgspec.msgpack.Encoder().encode(batch)).events

    def resumed(self, scheduler_output: Any) -> set[str]:
        """The cached requests this step re-admits after a preemption (their block ids replace the old)."""
        cached = scheduler_output.scheduled_cached_reqs
        if hasattr(cached, "resumed_req_ids"):
            return set(cached.resumed_req_ids)
        return {rid for rid, again in zip(cached.req_ids, cached.resumed_from_preemption) if again}

    def run_worker_step(self, worker: Any, scheduler_output: Any, caches: Mapping[str, torch.Tensor],
                        mla: bool, config: Any, forward_pass: Callable[[], None] | None = None,
                        read: Callable[[str], None] | None = None) -> Any:
        """vLLM's own model-runner connector code for one step (``_get_kv_connector_output``, which
        calls the hooks this vLLM calls, in its order), around what each attention layer does."""
        from vllm.distributed.kv_transfer import kv_transfer_state
        from vllm.forward_context import set_forward_context
        from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

        forward = bool(scheduler_output.total_num_scheduled_tokens)
        metadata = {name: _attention_metadata(mla) for name in caches} if forward else {}
        config.compilation_config.static_forward_context = {
            name: SimpleNamespace(kv_cache=cache) for name, cache in caches.items()}
        kv_transfer_state._KV_CONNECTOR_AGENT = worker
        try:
            if hasattr(worker, "handle_preemptions"):  # the model runner's first hook of a step, where it exists
                worker.handle_preemptions(scheduler_output.kv_connector_metadata)
            # A step that scheduled no token is vLLM's kv_connector_no_forward: the connector's step
            # hooks (loads started, saves waited for, transfers collected) without any layer's.
            with set_forward_context(metadata or None, config), \
                    KVConnectorModelRunnerMixin._get_kv_connector_output(scheduler_output) as output:
                if forward_pass is not None and metadata:
                    forward_pass()
                for name, layer_metadata in metadata.items():  # what each attention layer's forward does
                    worker.wait_for_layer_load(name)
                    if read is not None:
                        read(name)
                    worker.save_kv_layer(name, caches[name], layer_metadata)
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


@contextlib.contextmanager
def _long_prompts_allowed(allowed: bool) -> Iterator[None]:
    """vLLM refuses a max_model_len past the model's max_position_embeddings unless told to allow it
    (VLLM_ALLOW_LONG_MAX_MODEL_LEN): the connector level computes no attention, so a long prompt only
    means more KV to move."""
    if not allowed:
        yield
        return
    before = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_ALLOW_LONG_MAX_MODEL_LEN", None)
        else:
            os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = before


WORKER_CLS = re.compile(r"""worker_cls\s*=\s*["']([\w.]+)["']""")


@functools.cache
def platform_worker() -> str | None:
    """Import the module of the worker class this vLLM's platform runs (what its
    ``check_and_update_config`` assigns, read from its source: no config is touched), as a worker
    process has it before any connector code: vLLM-CPU's (``cpu_worker``, importing ``cpu/shm``)
    replaces ``torch.cuda.Event`` and ``Stream`` with CPU placeholders, and a connector that creates
    an event works there. Its module name, or None where the platform names none."""
    import importlib
    import inspect

    from vllm.platforms import current_platform

    try:
        source = inspect.getsource(type(current_platform).check_and_update_config)
    except (OSError, TypeError):
        return None
    found = WORKER_CLS.search(source)
    if found is None:
        return None
    module = found.group(1).rpartition(".")[0]
    importlib.import_module(module)
    return module


def _world_of_one() -> None:
    """vLLM's distributed world and model-parallel groups, one rank each, once per process."""
    import tempfile

    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    rendezvous = tempfile.NamedTemporaryFile(prefix="kvconform-world-", delete=False).name
    parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                distributed_init_method=f"file://{rendezvous}")
    parallel_state.ensure_model_parallel_initialized(1, 1)


def _attention_metadata(mla: bool) -> Any:
    """Per-layer attention metadata of the type connectors test for (MLA or not); no fields read."""
    if mla:
        from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadata

        return object.__new__(MLACommonMetadata)
    return SimpleNamespace()


def _feature(image: Image) -> Any:
    """The image as the engine core hands it to the scheduler: its identifier and placeholder range,
    its encoder inputs already elsewhere (``data=None``, as for an item the processor cache holds)."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return MultiModalFeatureSpec(data=None, modality="image", identifier=image.identifier,
                                 mm_position=PlaceholderRange(offset=image.offset, length=image.length),
                                 mm_hash=image.identifier)
