"""LifecycleConnector written the way a GPU connector is: each load and save runs under a
``torch.cuda.Stream`` and is fenced with a ``torch.cuda.Event`` (record, then synchronize). On
vLLM-CPU that is legal: its worker imports ``vllm/v1/worker/cpu/shm.py`` first, which replaces
both with CPU placeholders. The positive control that the connector level runs a connector in
the worker vLLM runs it in (``eras.common.platform_worker``); without that, torch's CPU build
refuses the Event ("Tried to instantiate dummy base class Event") and a correct connector fails."""

from __future__ import annotations

import torch

from conformance.zoo.good.lifecycle import LifecycleConnector


class StreamEventsConnector(LifecycleConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stream = torch.cuda.Stream()

    def start_load_kv(self, forward_context, **kwargs):
        with torch.cuda.stream(self._stream):
            super().start_load_kv(forward_context, **kwargs)
        self._fence()

    def wait_for_save(self):
        super().wait_for_save()
        self._fence()

    def _fence(self) -> None:
        done = torch.cuda.Event()
        done.record(self._stream)
        done.synchronize()
