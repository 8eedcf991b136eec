"""LifecycleConnector with a replica the suite cannot reach: every layer file it writes under its
storage is copied to a mirror beside it (``<storage>-mirror``, not under "{storage}"), and every
load reads the mirror. Damage the suite does under "{storage}" is never read, so the damage clauses
compare nothing: Not exercised, never a vacuous Pass (a server's memory tier over a damaged disk
tier is this shape). Its twin ``connectors/mirror_gap`` leaves one layer out of the mirror and
reads that layer's damaged file."""

from __future__ import annotations

import os
import shutil

from conformance.zoo.good.lifecycle import LifecycleConnector


class MirroredConnector(LifecycleConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._loading = False  # set while start_load_kv reads: file names are then the mirror's
        self._written: list[str] = []  # the files the save in progress writes

    def _mirrored(self, layer_name: str) -> bool:
        return True

    def _mirror(self, path: str) -> str:
        root = os.path.normpath(self._storage_path)
        return os.path.join(root + "-mirror", os.path.relpath(path, root))

    def _generate_filename_debug(self, layer_name, *args, **kwargs):
        path = super()._generate_filename_debug(layer_name, *args, **kwargs)
        if not self._loading:
            self._written.append(path)
            return path
        return self._mirror(path) if self._mirrored(layer_name) else path

    def start_load_kv(self, forward_context, **kwargs):
        self._loading = True
        try:
            super().start_load_kv(forward_context, **kwargs)
        finally:
            self._loading = False

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self._written = []
        super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        for path in self._written:
            if os.path.isfile(path) and self._mirrored(layer_name):
                os.makedirs(os.path.dirname(self._mirror(path)), exist_ok=True)
                shutil.copyfile(path, self._mirror(path))
