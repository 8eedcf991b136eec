"""The connector level: the connector under test driven through vLLM's own
``KVConnectorBase_V1`` hooks, on synthetic paged KV caches that vLLM itself allocates.

A real engine only writes the KV its model happens to produce; this level writes every bit
pattern the format has (NaN payloads, -0, subnormals, fp8 specials) into every layout the
installed vLLM defines, and checks every byte the connector moved.
"""
