"""``good/one_geometry``, one bug: its key leaves out the request's ``cache_salt``, so one tenant's
KV is served to another. Undeclared, the tenant scenario asks its daemon for another geometry and
is refused (never a Pass); declared ``one-geometry``, the bug is a Fail."""

from __future__ import annotations

from conformance.zoo.good.one_geometry import OneGeometryConnector


class OneGeometrySaltBlindConnector(OneGeometryConnector):
    KEY_SALT = False
