"""The KV contract: what a paged KV layer's bytes are (KVSpec, formats), the store protocol, and
Hypothesis strategies over both. Import-light: matrix.yaml tooling reads names.py without torch."""
