"""The "tolerant reader" that two zoo members share: short payloads are zero-filled."""

from __future__ import annotations

from conformance.contract.spec import KVSpec
from conformance.contract.store import tensor_from_bytes


def zero_filled_tensor(payload: bytes, spec: KVSpec):
    return tensor_from_bytes(payload + bytes(max(0, spec.layer_nbytes - len(payload))), spec)
