"""kvconform: an executable KV contract and conformance suite for KV-cache connectors.

Import-light on purpose: pytest loads ``conformance.plugin`` in every session of an
environment where kvconform is installed.
"""

__version__ = "0.1.0"
