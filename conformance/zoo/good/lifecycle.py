"""vLLM's ExampleConnector with its lifecycle put right: the positive control of the lifecycle
clauses, and the base each lifecycle known-bad (``conformance/zoo/connectors/``) breaks once.

- the key includes the served model (another checkpoint's engine over the same storage is another
  model), the request's images (as ExampleConnector's does), ``cache_salt``, LoRA adapter (its name and path: another version
  of an adapter under the same name is another adapter) and prompt embeddings
  (ExampleConnector keys on token ids only), and a request without token ids is handled;
- each tensor-parallel rank writes a file of its own (ExampleConnector's ranks share one file per
  layer, and overwrite each other's heads);
- the key includes the block size: what it stores is the layer tensor's rows at the request's
  slots, and those are laid out for the engine's block size (on vLLM-CPU a row of a block is not
  one token's KV: each head's block holds its keys, then its values), so an engine restarted with
  another block size misses instead of being served rows of the old geometry;
- a prompt prefilled in chunks is saved once all of it is computed, from all its blocks
  (ExampleConnector saves at the first chunk, then claims the whole prompt);
- a prompt is stored and loaded under the key its lookup finds: the prompt less its last token, in
  whole blocks (ExampleConnector looks up by that, but stores and loads by the whole prompt's
  blocks, one block more for a prompt of ``n * block_size + 1`` tokens: it claims another prompt's
  folder and then opens one that was never written, a FileNotFoundError in the worker);
- saves are reported asynchronously: ``request_finished`` keeps the blocks and the worker reports
  each finished request once in ``finished_sending``, so vLLM's delayed-free path is exercised.

It keeps ExampleConnector's file format (no checksum, fp8 twins share a key)."""

from __future__ import annotations

import hashlib
import os

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)


class LifecycleConnector(ExampleConnector):
    KEY_MODEL = True  # the served model (its path or name) is part of the key
    KEY_RANK = True  # each tensor-parallel rank's file of a layer is its own (its share of the heads)
    KEY_BLOCK_SIZE = True  # so is the block size its rows are laid out for
    KEY_SALT = True  # so is the cache_salt
    KEY_LORA = True  # so is the LoRA adapter's name
    KEY_LORA_PATH = True  # and its path: a version loaded from another directory under the same name
    KEY_IMAGES = True  # and the identifiers of its images (multimodal inputs)
    KEY_EMBEDS = True  # and a hash of the prompt's embeddings, for a prompt given as embeddings
    SAVE_COMPLETE = True  # a prompt is saved once it is computed, not at its first chunk

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._admitted: dict = {}  # request id -> Request, from its first lookup to request_finished
        self._blocks: dict[str, list[int]] = {}  # request id -> its block ids so far
        self._saved: set[str] = set()

    # --- scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """ExampleConnector's count (the prompt less its last token, whole blocks), of the prompt's
        real length: ExampleConnector measures ``prompt_token_ids``, absent for a prompt of embeddings."""
        self._admitted[request.request_id] = request
        if not self._found_match_for_request(request):
            return 0, False
        return self._whole_blocks(request) * self._block_size - num_computed_tokens, False

    def _whole_blocks(self, request) -> int:
        """How many blocks of the prompt its key names, stores and loads: those before its last token."""
        return max(0, request.num_prompt_tokens - 2) // self._block_size

    def _found_match_for_request(self, request) -> bool:
        return self._found_match_for_prompt(self._prompt(request), self._tags(request))

    def _lookup_folder(self, request) -> str:
        """The folder a lookup of ``request`` finds its KV in: ExampleConnector's, of the prompt less its
        last token in whole blocks, keyed with the request's tags."""
        prompt = self._prompt(request)
        kept = self._whole_blocks(request) * self._block_size
        return self._generate_foldername_debug(torch.tensor(prompt)[:kept], self._tags(request), create_folder=False)

    @staticmethod
    def _prompt(request) -> list[int]:
        """The prompt's token ids; a prompt of embeddings has none: vLLM's placeholders (zeros)."""
        return list(request.prompt_token_ids if request.prompt_token_ids is not None
                    else request.all_token_ids[:request.num_prompt_tokens])

    def _tags(self, request) -> list[str]:
        """What besides the token ids names the KV: the model, the block size, multimodal inputs, the tenant's
        salt, the adapter, the prompt's embeddings."""
        salt = [f"cache_salt:{request.cache_salt}"] if self.KEY_SALT and request.cache_salt else []
        adapter = request.lora_request
        lora = [f"lora:{adapter.lora_name}" + (f":{adapter.lora_path}" if self.KEY_LORA_PATH else "")] \
            if self.KEY_LORA and adapter else []
        embeds = request.prompt_embeds
        digest = [] if embeds is None or not self.KEY_EMBEDS else [
            "embeds:" + hashlib.sha256(embeds.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:32]]
        images = [f.identifier for f in request.mm_features] if self.KEY_IMAGES else []
        model = [f"model:{self._vllm_config.model_config.model}"] if self.KEY_MODEL else []
        geometry = [f"block_size:{self._block_size}"] if self.KEY_BLOCK_SIZE else []
        return model + geometry + images + salt + lora + digest

    # --- worker side
    def _generate_filename_debug(self, layer_name, *args, **kwargs):
        """ExampleConnector's file of a layer's KV in the prompt's folder, named by ``_layer_file``."""
        folder = os.path.dirname(super()._generate_filename_debug(layer_name, *args, **kwargs))
        return os.path.join(folder, self._layer_file(layer_name))

    def _layer_file(self, layer_name: str) -> str:
        """A layer's file name: per tensor-parallel rank and world size (``KEY_RANK``), else ExampleConnector's."""
        if not self.KEY_RANK:
            return f"{layer_name}.safetensors"
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return f"{layer_name}.rank{get_tensor_model_parallel_rank()}-of-{get_tensor_model_parallel_world_size()}.safetensors"

    def build_connector_meta(self, scheduler_output):
        meta = ExampleConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            self._blocks[new.req_id] = list(new.block_ids[0])
            if new.req_id in self._requests_need_load:
                self._add(meta, new.req_id, is_store=False)
            self._maybe_save(meta, new.req_id, new.num_computed_tokens, scheduler_output, first=True)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()))
        for i, rid in enumerate(cached.req_ids):
            ids = list((cached.new_block_ids[i] or ([],))[0])
            # A re-admitted request's block ids are all of its blocks (the old ones were freed).
            self._blocks[rid] = ids if rid in resumed else self._blocks[rid] + ids
            if rid in resumed and rid in self._requests_need_load:
                self._add(meta, rid, is_store=False)
            self._maybe_save(meta, rid, cached.num_computed_tokens[i], scheduler_output, first=False)
        self._requests_need_load.clear()
        return meta

    def _maybe_save(self, meta, rid: str, computed: int, scheduler_output, *, first: bool) -> None:
        request = self._admitted[rid]
        done = computed + scheduler_output.num_scheduled_tokens.get(rid, 0) >= request.num_prompt_tokens
        due = done if self.SAVE_COMPLETE else first
        if due and rid not in self._saved and not self._found_match_for_request(request):
            self._saved.add(rid)
            self._add(meta, rid, is_store=True)

    def _add(self, meta, rid: str, *, is_store: bool) -> None:
        request = self._admitted[rid]
        # ExampleConnector's metadata keeps the whole blocks of the tokens before the last it is given.
        meta.add_request(token_ids=self._prompt(request)[:self._whole_blocks(request) * self._block_size + 1],
                         block_ids=self._blocks[rid],
                         block_size=self._block_size, is_store=is_store, mm_hashes=self._tags(request))

    def request_finished(self, request, block_ids):
        rid = request.request_id
        for state in (self._admitted, self._blocks):
            state.pop(rid, None)
        self._saved.discard(rid)
        return True, None  # blocks held until the worker reports the save

    # --- worker side
    def get_finished(self, finished_req_ids):
        """Saves finish within the step (wait_for_save), so every request vLLM says finished is done."""
        return set(finished_req_ids) or None, None
