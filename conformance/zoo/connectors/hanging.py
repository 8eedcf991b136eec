"""Never returns from a load (a lock it never gets, a transfer it waits on forever) once it has KV
to load. The first clause that loads must end as an Error after ``--kv-timeout``; every later one
at once, not after a timeout of its own."""

import time

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class HangingConnector(ExampleConnector):
    def start_load_kv(self, forward_context, **kwargs):
        if any(not r.is_store for r in self._get_connector_metadata().requests):
            while True:
                time.sleep(1)
        super().start_load_kv(forward_context, **kwargs)


class GilHangingConnector(ExampleConnector):
    """The same hang in native code that keeps the GIL (a C extension's blocking call made without
    releasing it): no Python thread runs, so the thread watchdog cannot fire, and only the process
    supervising the clause can end it: within two timeouts of the last hook call that began."""

    def start_load_kv(self, forward_context, **kwargs):
        if any(not r.is_store for r in self._get_connector_metadata().requests):
            import ctypes

            ctypes.PyDLL(None).sleep(3600)  # libc's sleep(), called with the GIL held
        super().start_load_kv(forward_context, **kwargs)
