"""LifecycleConnector whose saves commit late: ``save_kv_layer`` only notes what to write, and the
``get_finished`` of the step after requests finished reads those blocks (still held:
``request_finished`` returned True), writes them, then reports those requests as ``finished_sending``. Legal:
vLLM keeps a finished request's blocks, and keeps stepping (``Scheduler.has_requests``), until its
save is reported. The positive control that the suite steps a storing pair or engine until its
saves are reported before a fresh one looks up (a suite that does not fails it: "saves nothing")."""

from __future__ import annotations

import os
import shutil

import safetensors.torch

from conformance.zoo.good.lifecycle import LifecycleConnector


class AsyncCommitConnector(LifecycleConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._noted: list[tuple] = []  # (folder, layer name, paged layer, slot mapping, mla) not yet written
        self._finishing: set[str] = set()  # requests vLLM said finished in the step before

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadata

        for request in self._get_connector_metadata().requests:
            if request.is_store:
                folder = self._generate_foldername_debug(request.token_ids, request.mm_hashes, create_folder=False)
                self._noted.append((folder, layer_name, kv_layer, request.slot_mapping.clone(),
                                    isinstance(attn_metadata, MLACommonMetadata)))

    def wait_for_save(self):
        return

    def get_finished(self, finished_req_ids):
        done, self._finishing = self._finishing, set(finished_req_ids)
        if done:  # a step after requests finished: commit everything noted so far, then report them
            self._commit(self._noted)
            self._noted = []
        return done or None, None

    def _commit(self, noted: list[tuple]) -> None:
        written: dict[str, str] = {}  # folder -> the one its files are written in first
        for folder, layer_name, layer, slots, mla in noted:
            if mla:
                kv = layer.reshape(-1, layer.shape[-1])[slots, ...]
            else:
                kv = layer[slots // self._block_size, :, slots % self._block_size]
            partial = written.setdefault(folder, f"{folder}.partial")
            os.makedirs(partial, exist_ok=True)
            safetensors.torch.save_file({"kv_cache": kv.detach().cpu().contiguous()},
                                        os.path.join(partial, self._layer_file(layer_name)))
        for folder, partial in written.items():  # found (the folder exists) only once whole
            if os.path.isdir(folder):
                shutil.rmtree(partial)
            else:
                os.replace(partial, folder)
