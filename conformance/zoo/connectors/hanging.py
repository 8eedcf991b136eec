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
