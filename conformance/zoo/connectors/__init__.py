"""Known-bad vLLM connectors for the connector and engine levels: each must be flagged by the
clauses it breaks (tests/levels/connector/test_connector_level.py, tests/levels/engine/test_engine_level.py).

They subclass vLLM's own ExampleConnector and change one thing, so they load wherever it does
(vLLM >= 0.22 on CPU). Selected by module path, as any external connector is:
``--kv-connector conformance.zoo.connectors.noop:NoopConnector``.

``stale_layout_api`` and ``layout_aware`` are for ``kvconform api-requirements`` instead: read,
never run, one written for vLLM 0.19's layout helpers and one for 0.29+'s ``KVCacheLayout``.
"""
