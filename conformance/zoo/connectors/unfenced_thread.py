"""StreamEventsConnector, one bug: its loads run on a worker thread (to overlap them with
compute), fenced by a ``torch.cuda.Event`` recorded on its stream. The event fences only work
issued to that stream; the thread's copies are not, so ``wait_for_layer_load`` returns before
the KV is in place and the forward pass reads the blocks as they were. On vLLM-CPU the event is
a placeholder, and the thread lands its copies a moment later: by the end of the step the cache
holds the right bytes, but the model computed with the old ones. The known-bad twin of
``good/stream_events`` (whose loads run on its stream, in the caller's thread)."""

from __future__ import annotations

import threading
import time

import torch

from conformance.zoo.good.lifecycle import LifecycleConnector
from conformance.zoo.good.stream_events import StreamEventsConnector

LAND_AFTER_S = 0.05  # how long the thread's copies take to start: after the forward pass read the blocks


class UnfencedThreadConnector(StreamEventsConnector):
    _loading: threading.Thread | None = None

    def start_load_kv(self, forward_context, **kwargs):
        def load() -> None:
            time.sleep(LAND_AFTER_S)
            with torch.cuda.stream(self._stream):
                LifecycleConnector.start_load_kv(self, forward_context, **kwargs)

        self._loading = threading.Thread(target=load, name="kv-load")
        self._loading.start()

    def wait_for_layer_load(self, layer_name):
        self._fence()  # the event recorded on the stream: the thread's copies are not on it

    def wait_for_save(self):
        super().wait_for_save()
        if self._loading is not None:  # joined before the step ends, as its stream's work would be
            self._loading.join()
            self._loading = None
