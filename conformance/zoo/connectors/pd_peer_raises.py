"""A P/D consumer that pulls in ``start_load_kv`` and lets a connection error escape: with its
producer gone the worker's hook raises (in vLLM the worker, and the engine, die) instead of
reporting the blocks as failed loads. ``api_pd_lost_peer`` must flag it; with a live producer it
loads correctly, and a producer that refuses it (another format) is still a reported load error."""

from conformance.zoo.good.peer import PeerConnector


class PeerRaisesConnector(PeerConnector):
    def start_load_kv(self, forward_context, **kwargs):
        for load in self._get_connector_metadata().loads:
            try:
                self._pull(load)
                failed = set()
            except ValueError:  # a refusal is reported; a lost connection (OSError) escapes
                failed = {block for group in load["local"] for block in group}
            with self._lock:
                self._failed |= failed
                self._received.add(load["request_id"])
