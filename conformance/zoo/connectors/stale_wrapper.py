"""A wrapper module, as a package's entry point often is: it re-exports a connector written against
vLLM 0.19's layout helpers (``stale_layout_api``) under a name of its own, and imports nothing from
vLLM itself. Reading only this module finds nothing missing (a vacuous Pass); ``api_requirements``
follows the name to the module its code is in and flags what that module needs."""

from conformance.zoo.connectors.stale_layout_api import StaleLayoutConnector as WrappedConnector  # noqa: F401
