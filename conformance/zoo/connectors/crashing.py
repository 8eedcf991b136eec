"""Dies the way a segfaulting native transfer library does (``os._exit(139)``, no exception, no
cleanup) as soon as it has KV to load. Its process ends mid-hook: the suite must report an Error
for the clause that was running, with the exit status, and go on to the next clause."""

import os

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class CrashingConnector(ExampleConnector):
    def start_load_kv(self, forward_context, **kwargs):
        if any(not r.is_store for r in self._get_connector_metadata().requests):
            os._exit(139)
        super().start_load_kv(forward_context, **kwargs)
