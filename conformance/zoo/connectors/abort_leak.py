"""Forgets an aborted request: its save is never reported finished, so the blocks vLLM held for it
are never freed (vLLM PR #45628, vllm-ascend #16662). Finished requests are reported as they should."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class AbortLeakConnector(LifecycleConnector):
    def request_finished(self, request, block_ids):
        if request.is_finished() and request.status.name == "FINISHED_ABORTED":
            self._aborted = getattr(self, "_aborted", set()) | {request.request_id}
        return super().request_finished(request, block_ids)

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        meta.aborted, self._aborted = getattr(self, "_aborted", set()), set()
        return meta

    def get_finished(self, finished_req_ids):
        aborted = getattr(self._get_connector_metadata(), "aborted", set())
        return set(finished_req_ids) - aborted or None, None
