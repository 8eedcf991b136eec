"""What an era shim provides: vLLM's own objects, built the way that vLLM version builds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping, Protocol, Sequence

import torch

from conformance.verdict.status import NotRunnable


@dataclass(frozen=True)
class Image:
    """A multimodal input of a request: ``identifier`` (vLLM's hash of the image) behind the
    placeholder tokens ``offset`` to ``offset + length`` of its prompt."""

    identifier: str
    offset: int
    length: int


class EraUnavailable(NotRunnable):
    """The installed vLLM lacks what this era needs (the message names the missing piece)."""


class Era(Protocol):
    name: str
    vllm_version: str

    def layouts(self) -> list[str]:
        """Every KV cache layout this vLLM defines (its own names)."""

    def make_config(self, *, model: str, transfer: Mapping[str, Any], kv_cache_dtype: str,
                    layout: str, block_size: int, scheduling: Mapping[str, int] | None = None,
                    serves: frozenset[str] = frozenset(), model_dtype: str | None = None) -> Any:
        """A real ``VllmConfig`` for the CPU device with the connector configured (``model_dtype``: the
        model served in another dtype than its config's, as ``--dtype`` does); ``scheduling``
        overrides ``SchedulerConfig`` knobs (a token budget that forces chunked prefill); ``serves``
        what an engine serving more than token-id prompts enables: ``lora`` (``--enable-lora``),
        ``prompt_embeds`` (``--enable-prompt-embeds``), ``images`` (see ``take_images``)."""

    def storage_dtype(self, config: Any) -> torch.dtype:
        """The torch dtype vLLM allocates for the config's kv_cache_dtype (uint8 for every fp8)."""

    def allocate(self, config: Any, layer_names: Sequence[str], num_blocks: int,
                 mla: bool) -> tuple[Any, dict[str, torch.Tensor]]:
        """(KVCacheConfig, layer name -> paged KV view) as vLLM's model runner allocates them."""

    def make_scheduler(self, config: Any, kv_cache_config: Any) -> Any: ...

    def take_images(self, scheduler: Any, tokens: int) -> None:
        """Give a text model's scheduler a multimodal model's encoder budget of ``tokens``, so that
        it schedules requests with images (EraUnavailable where this vLLM's scheduler has none)."""

    def make_worker_connector(self, config: Any, kv_cache_config: Any) -> Any: ...

    def worker_setup(self, config: Any) -> ContextManager[Any]:
        """The context vLLM's worker builds its connector and registers the caches in."""

    def required_layout(self, config: Any) -> str | None:
        """The KV cache layout the connector requires of vLLM, if any."""

    def relay_handshake(self, worker: Any, scheduler: Any) -> None:
        """The worker connector's handshake metadata handed to the scheduler's, as the engine core does."""

    def make_request(self, request_id: str, prompt: Sequence[int], block_size: int,
                     cache_salt: str | None = None, kv_transfer_params: dict[str, Any] | None = None,
                     lora: str | None = None, prompt_embeds: torch.Tensor | None = None,
                     image: Image | None = None) -> Any: ...

    def abort(self, scheduler: Any, request_id: str) -> None:
        """Abort a request the way the engine core does (the scheduler's finish path)."""

    def logged_stats(self, transfer: Mapping[str, Any], engine_outputs: Sequence[Any]) -> dict[str, int | float] | None:
        """What vLLM's frontend logs of the connector's stats carried by ``engine_outputs``; None when
        vLLM dropped them (the connector class rebuilt none)."""

    def event_hashes(self, request: Any) -> list[Any]:
        """The request's block hashes in the form vLLM's KV events carry them."""

    def published_events(self, events: Sequence[Any]) -> list[Any]:
        """KV cache events as a consumer of vLLM's event publisher decodes them."""

    def resumed(self, scheduler_output: Any) -> set[str]:
        """Request ids this step re-admits after a preemption."""

    def run_worker_step(self, worker: Any, scheduler_output: Any, caches: Mapping[str, torch.Tensor],
                        mla: bool, config: Any, forward_pass: Callable[[], None] | None = None,
                        read: Callable[[str], None] | None = None) -> Any:
        """The model runner's connector hooks for one step; returns the KVConnectorOutput. ``forward_pass``
        is what the model's forward pass writes: called after the connector's pre-forward hooks
        (start_load_kv) and before the first layer's, in a step that computes tokens. ``read(layer)``:
        where the layer's attention reads its KV (once ``wait_for_layer_load`` returned)."""

    def model_runner_output(self, scheduler: Any, scheduler_output: Any, connector_output: Any,
                            token: int) -> Any:
        """A ModelRunnerOutput that samples ``token`` for every request whose prefill completed."""
