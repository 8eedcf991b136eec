"""Known-good vLLM connectors: positive controls that a clause can be passed the way its message
asks (``conformance/zoo/connectors/`` holds the known-bad ones)."""
