"""Checks whose failure messages name the clause and say what differs.

One grammar, after array-api-tests: ``[clause] what=actual, but should be expected [context]``.
Byte comparisons point at the first differing element by its logical index and show both bit
patterns, because "tensors differ" is useless to the person who has to fix the store.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, logical_bytes
from conformance.verdict.clauses import CLAUSES, running


def running_clause_or_none() -> str | None:
    test = running()
    return test.clause if test is not None else None


class ClauseViolation(AssertionError):
    """The subject broke a clause: a conformance *Fail*, as opposed to a harness *Error*.

    ``ClauseViolation(detail)`` names the clause of the test running now; ``ClauseViolation(clause,
    detail)`` names it outright, and must agree with the running test (a typo would file the
    message under another clause: it is the suite's own error).
    """

    def __init__(self, *parts: str, clause: str | None = None) -> None:
        if len(parts) == 2:
            clause, detail = parts
        elif len(parts) == 1:
            (detail,) = parts
        else:
            raise TypeError("ClauseViolation(detail) or ClauseViolation(clause, detail)")
        running = running_clause_or_none()
        clause = clause or running
        if clause not in CLAUSES or (running is not None and clause != running):
            raise ValueError(f"ClauseViolation names clause {clause!r}, but the test running is {running!r}; "
                             f"valid: {', '.join(CLAUSES)}")
        super().__init__(f"[{clause}] {detail}")
        self.clause = clause
        self.detail = detail

    def __reduce__(self) -> Any:  # pickled back from a supervised child with its clause, not re-prefixed
        return (type(self), (self.clause, self.detail), self.__dict__)


def assert_equal(what: str, actual: Any, expected: Any, *, clause: str | None = None, context: str = "") -> None:
    """``assert actual == expected`` with a message naming ``clause`` and ``what``."""
    __tracebackhide__ = True
    if actual != expected:
        suffix = f" [{context}]" if context else ""
        raise ClauseViolation(f"{what}={actual!r}, but should be {expected!r}{suffix}", clause=clause)


def assert_hit(got: KVEntry | None, *, clause: str | None = None, key: str, spec: KVSpec) -> KVEntry:
    """The store returned an entry for (key, spec) that it was given."""
    __tracebackhide__ = True
    if got is None:
        raise ClauseViolation(f"get({key!r}, {spec.describe()}) returned None right after put", clause=clause)
    if not isinstance(got, KVEntry):
        raise ClauseViolation(f"get returned {type(got).__name__}, but should return KVEntry or None", clause=clause)
    return got


def assert_same_bytes(actual: torch.Tensor, expected: torch.Tensor, *, clause: str | None = None, context: str) -> None:
    """``logical_bytes(actual) == logical_bytes(expected)``, pointing at the first difference.

    Shape and dtype are compared only through bytes here: a clause about those uses its own check.
    """
    __tracebackhide__ = True
    got, want = logical_bytes(actual), logical_bytes(expected)
    if got == want:
        return
    if len(got) != len(want):
        raise ClauseViolation(f"content is {len(got)} bytes, but should be {len(want)} bytes [{context}]", clause=clause)
    itemsize = expected.element_size()
    a = np.frombuffer(got, dtype=np.uint8).reshape(-1, itemsize)
    b = np.frombuffer(want, dtype=np.uint8).reshape(-1, itemsize)
    differs = np.flatnonzero((a != b).any(axis=1))
    first = int(differs[0])
    index = tuple(int(i) for i in np.unravel_index(first, tuple(expected.shape)))
    raise ClauseViolation((
        f"element {index} is 0x{_hex(a[first])}, but should be 0x{_hex(b[first])} "
        f"({len(differs)} of {len(a)} elements differ) [{context}]"), clause=clause)


def assert_same_content(actual: torch.Tensor, expected: torch.Tensor, *, tolerance: float | None,
                        element: torch.dtype, clause: str | None = None, context: str) -> None:
    """Bytes (``assert_same_bytes``), or, for a store that declares itself lossy, values within its
    ``tolerance`` (``assert_close``): the one rule every store clause that reads content back applies."""
    __tracebackhide__ = True
    if tolerance is None:
        assert_same_bytes(actual, expected, clause=clause, context=context)
    else:
        assert_close(actual, expected, element, tolerance, clause=clause, context=context)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, element: torch.dtype, tolerance: float, *,
                 clause: str | None = None, context: str) -> None:
    """A lossy round trip's rule: read in their element format (``element``: float8 for the fp8
    caches' uint8 bytes), the values' relative RMS error, sqrt(sum((got - want)^2) / sum(want^2))
    over the finite elements, at most ``tolerance`` (the error's norm itself where every value is 0); NaN where NaN
    was put and the same infinities; the same shape."""
    __tracebackhide__ = True
    if tuple(actual.shape) != tuple(expected.shape) or actual.dtype != expected.dtype:
        raise ClauseViolation(f"got {tuple(actual.shape)} {actual.dtype}, but {tuple(expected.shape)} {expected.dtype} "
                              f"was put [{context}]", clause=clause)
    got, want = (t.detach().cpu().contiguous().view(element).to(torch.float64) for t in (actual, expected))
    nan_kept = torch.equal(got.isnan(), want.isnan())
    inf = want.isinf()
    if not nan_kept or not torch.equal(got[inf], want[inf]) or not torch.equal(got.isinf(), inf):
        raise ClauseViolation(f"the non-finite values (NaN, +-inf) put were not returned as they were [{context}]",
                              clause=clause)
    finite = want.isfinite()
    error = float(relative_rms_error(got[finite], want[finite]))
    if not error <= tolerance:
        raise ClauseViolation(f"relative RMS error {error:.3g} of the values returned, but the store declares at most "
                              f"{tolerance:g} (lossy_tolerance) [{context}]", clause=clause)


def relative_rms_error(got: torch.Tensor, want: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The lossy rule's metric: sqrt(sum((got - want)^2) / sum(want^2)) over ``dim`` (all of it by
    default), the error's norm itself where every wanted value is 0; NaN where ``got`` has one."""
    over = () if dim is None else (dim,)
    norm = want.square().sum(dim=over).sqrt()
    return (got - want).square().sum(dim=over).sqrt() / torch.where(norm > 0, norm, torch.ones_like(norm))


def _hex(element_bytes: np.ndarray) -> str:
    return bytes(element_bytes[::-1]).hex()  # little-endian storage, read as a number


def float_bits(value: Any) -> str:
    """A scalar as the exact bits of a Python float (``float.hex``), for ==-free comparison.

    A non-float (a numpy/torch scalar a store handed back) shows its type, so it never
    compares equal to the float that was put.
    """
    return value.hex() if type(value) is float else f"{type(value).__name__}({value!r})"
