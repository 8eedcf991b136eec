"""Skips a stored file it cannot read, as the known-good ``LoadErrorReportingConnector`` does, but
never says so: ``get_block_ids_with_load_errors`` returns nothing, the hit stays claimed, and vLLM
computes on blocks that hold whatever they held (LMCache PR #2973)."""

from conformance.zoo.good.load_error_reporting import LoadErrorReportingConnector


class SwallowedLoadErrorConnector(LoadErrorReportingConnector):
    def get_block_ids_with_load_errors(self) -> set[int]:
        super().get_block_ids_with_load_errors()  # drained, never reported
        return set()
