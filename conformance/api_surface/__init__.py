"""vLLM's connector-facing API surface: fingerprint it, diff two fingerprints, check a connector against one.

A connector written for one vLLM release fails on another with an ``ImportError`` or
``AttributeError`` long after the engine started; a fingerprint (JSON, read from the source
with ``ast``) lets the suite say what moved before any engine starts.
"""

SCHEMA = "kvconform.api-fingerprint/1"
