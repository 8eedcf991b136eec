"""Bit-exact means bytes: the comparison sees what == on floats cannot."""

from __future__ import annotations

import pytest
import torch

from conformance.verdict.asserts import ClauseViolation, assert_equal, assert_same_bytes, float_bits


def bf16(*patterns: int) -> torch.Tensor:
    return torch.tensor(patterns, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_nan_payloads_differ():
    a, b = bf16(0x7FC0), bf16(0x7F81)
    with pytest.raises(ClauseViolation, match=r"\[byte_exact_roundtrip\] element \(0,\) is 0x7fc0, but should be 0x7f81"):
        assert_same_bytes(a, b, clause="byte_exact_roundtrip", context="")


def test_signed_zeros_differ_although_equal():
    plus, minus = bf16(0x0000), bf16(0x8000)
    assert bool((plus == minus).all())  # why == is not a byte comparison
    with pytest.raises(ClauseViolation):
        assert_same_bytes(plus, minus, clause="byte_exact_roundtrip", context="")


def test_identical_nans_are_equal_although_unequal():
    nan = bf16(0x7FC0, 0xFFC1)
    assert not bool((nan == nan).any())
    assert_same_bytes(nan, nan.clone(), clause="byte_exact_roundtrip", context="")


def test_first_difference_is_located_by_logical_index():
    a = torch.zeros(2, 3, 4, dtype=torch.uint8)
    b = a.clone()
    b[1, 2, 3] = 7
    b[1, 2, 0] = 9
    with pytest.raises(ClauseViolation, match=r"element \(1, 2, 0\) is 0x00, but should be 0x09 \(2 of 24"):
        assert_same_bytes(a, b, clause="byte_exact_roundtrip", context="ctx")


def test_non_contiguous_views_compare_by_logical_content():
    a = torch.arange(24, dtype=torch.int16).view(4, 6)
    assert_same_bytes(a.t(), a.t().contiguous(), clause="byte_exact_roundtrip", context="")


def test_float_bits():
    assert float_bits(0.5) == (0.5).hex()
    assert float_bits(torch.tensor(0.5).item()) == float_bits(0.5)
    assert float_bits(torch.tensor(0.5)) != float_bits(0.5)  # a tensor is not the float that was put


def test_assert_equal_grammar():
    with pytest.raises(ClauseViolation, match=r"^\[shape_preserved\] shape=\(1,\), but should be \(2,\) \[ctx\]$"):
        assert_equal("shape", (1,), (2,), clause="shape_preserved", context="ctx")


def test_a_violation_must_name_a_clause_and_agree_with_the_running_test():
    with pytest.raises(ValueError, match="names clause 'byte_exact_roundtip'"):
        ClauseViolation("byte_exact_roundtip", "a typo files the message nowhere")
    with pytest.raises(ValueError, match="test running is None"):
        ClauseViolation("outside a clause test, the id cannot be taken from the test")
    from conformance.verdict.clauses import end_test, start_test

    token = start_test("n::t", "dtype_preserved")
    try:
        assert str(ClauseViolation("cast to fp16")) == "[dtype_preserved] cast to fp16"
        with pytest.raises(ValueError, match="names clause 'shape_preserved', but the test running is 'dtype_preserved'"):
            ClauseViolation("shape_preserved", "another clause's id in this test")
    finally:
        end_test(token)
