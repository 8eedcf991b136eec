"""Reports the blocks it could not read, as the known-good ``LoadErrorReportingConnector`` does, but
one step late (a completion queue drained before the failures were queued). vLLM maps failed blocks
to the requests loading in the step they are reported: by then the request went on with what the
blocks held, and vLLM ignores the report (vLLM's ``test_kv_load_failure_recovery.py``)."""

from conformance.zoo.good.load_error_reporting import LoadErrorReportingConnector


class LateLoadErrorConnector(LoadErrorReportingConnector):
    def get_block_ids_with_load_errors(self) -> set[int]:
        due: set[int] = getattr(self, "_due", set())
        self._due = super().get_block_ids_with_load_errors()
        return due
