"""A P/D producer that serves its blocks to a consumer of any kv_cache_dtype (no check of the
consumer's format in its handshake): an fp8_e5m2 consumer takes fp8_e4m3 bytes as its own, as
NixlConnector's compatibility hash exists to prevent. ``api_pd_format_isolation`` must flag it."""

from conformance.zoo.good.peer import PeerConnector


class FormatBlindConnector(PeerConnector):
    CHECK_DTYPE = False
