"""Reports every finished save twice: in the step it finished and again in the next (a completion
queue read without being drained). vLLM frees the blocks on the first report; the second asserts
in its scheduler (``req_id in self.requests``) and takes the engine core down."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class DoubleReportConnector(LifecycleConnector):
    def get_finished(self, finished_req_ids):
        last = getattr(self, "_last", set())
        self._last = set(finished_req_ids)
        return (self._last | last) or None, None
