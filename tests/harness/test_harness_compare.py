"""The comparators catch what they must: one flipped bit, a changed NaN payload, +0 vs -0."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from batchinv.harness.bitpatterns import from_bits, pattern
from batchinv.harness.compare import compare_bitwise, compare_tolerance, ulp_distance


def _random(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_equal_tensors_compare_equal(dtype):
    x = _random((5, 7), dtype)
    assert compare_bitwise(x, x.clone()).equal


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bit", [0, 5, 14])
def test_one_flipped_bit_is_caught(dtype, bit):
    x = _random((4, 6), dtype, seed=bit)
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int16
    y = x.clone()
    y.view(int_dtype)[2, 3] ^= 1 << bit
    report = compare_bitwise(x, y)
    assert not report.equal
    assert report.rows_differing == 1 and report.differing_rows == [2]
    assert (report.first.row, report.first.col) == (2, 3)
    assert report.first.expected_bits != report.first.actual_bits


def test_lowest_bit_flip_is_one_ulp():
    x = _random((3, 3))
    y = x.clone()
    y.view(torch.int32)[1, 1] ^= 1
    assert compare_bitwise(x, y).worst_ulp == 1.0


def test_nan_payload_change_is_caught():
    a = from_bits([0x7FC00000, 0x3F800000], torch.float32)
    b = from_bits([0x7FC00001, 0x3F800000], torch.float32)
    assert torch.isnan(a[0]) and torch.isnan(b[0])
    report = compare_bitwise(a, b)
    assert not report.equal
    assert report.first.expected_bits == "0x7fc00000" and report.first.actual_bits == "0x7fc00001"


def test_signalling_vs_quiet_nan_is_caught():
    snan = pattern(torch.float32, "+signalling_nan").tensor().reshape(1)
    qnan = pattern(torch.float32, "+quiet_nan").tensor().reshape(1)
    assert not compare_bitwise(snan, qnan).equal


def test_positive_vs_negative_zero_is_caught_at_zero_ulp():
    pos = from_bits([0x00000000], torch.float32)
    neg = from_bits([0x80000000], torch.float32)
    assert bool(pos == neg)  # value comparison cannot see it
    report = compare_bitwise(pos, neg)
    assert not report.equal
    assert report.worst_ulp == 0.0


def test_shape_and_dtype_mismatch_fail_with_reason():
    x = _random((2, 3))
    assert "shape" in compare_bitwise(x, x[:1]).reason
    assert "dtype" in compare_bitwise(x, x.double()).reason


def test_integer_outputs_compare():
    a = torch.tensor([[1, 2, -1]], dtype=torch.int32)
    b = torch.tensor([[1, 3, -1]], dtype=torch.int32)
    report = compare_bitwise(a, b)
    assert not report.equal and report.first.col == 1


def test_ulp_distance_across_zero_and_nan():
    # Independent construction: struct-packed neighbours of 1.0.
    one = struct.unpack("<I", struct.pack("<f", 1.0))[0]
    a = from_bits([one, one + 3, 0x00000001, 0x7FC00000], torch.float32)
    b = from_bits([one, one, 0x80000001, 0x3F800000], torch.float32)
    d = ulp_distance(a, b)
    assert d.tolist()[:3] == [0.0, 3.0, 2.0]
    assert math.isinf(d[3])


def test_tolerance_within_and_outside():
    ref = torch.tensor([[1.0, 2.0, -3.0]], dtype=torch.float64)
    act = torch.tensor([[1.0, 2.001, -3.0]], dtype=torch.float32)
    ok = compare_tolerance(ref, act, torch.tensor(0.01, dtype=torch.float64))
    assert ok.within and ok.worst_abs == pytest.approx(0.001, rel=1e-3)
    bad = compare_tolerance(ref, act, torch.tensor(1e-4, dtype=torch.float64))
    assert not bad.within and bad.rows_outside == 1 and bad.first.col == 1


def test_tolerance_requires_matching_non_finite_classes():
    ref = torch.tensor([[math.nan, math.inf, 1.0]], dtype=torch.float64)
    assert compare_tolerance(ref, ref.float(), torch.tensor(0.0, dtype=torch.float64)).within
    swapped = torch.tensor([[math.inf, math.nan, 1.0]], dtype=torch.float32)
    assert not compare_tolerance(ref, swapped, torch.tensor(1e9, dtype=torch.float64)).within
    finite_ref = torch.tensor([[1.0]], dtype=torch.float64)
    assert not compare_tolerance(
        finite_ref, torch.tensor([[math.nan]]), torch.tensor(1e9, dtype=torch.float64)
    ).within


@pytest.mark.parametrize("shape", [(0, 5), (0,), (3, 0)])
def test_empty_tensors_compare(shape):
    empty = torch.zeros(shape)
    assert compare_bitwise(empty, empty.clone()).equal
    ref = torch.zeros(shape, dtype=torch.float64)
    assert compare_tolerance(ref, empty, torch.tensor(0.0, dtype=torch.float64)).within


def test_a_nan_bound_admits_nothing():
    ref = torch.tensor([[1.0]], dtype=torch.float64)
    assert not compare_tolerance(
        ref, torch.tensor([[100.0]]), torch.tensor(math.nan, dtype=torch.float64)
    ).within


def test_correct_overflow_to_infinity_is_accepted_and_the_wrong_one_is_not():
    # 70000 is finite in fp64 but rounds to +inf in fp16 (max 65504): +inf is the right answer.
    ref = torch.tensor([[70000.0, -70000.0]], dtype=torch.float64)
    right = torch.tensor([[math.inf, -math.inf]], dtype=torch.float16)
    assert compare_tolerance(ref, right, torch.tensor(1.0, dtype=torch.float64)).within
    wrong_sign = torch.tensor([[math.inf, math.inf]], dtype=torch.float16)
    assert not compare_tolerance(ref, wrong_sign, torch.tensor(1e9, dtype=torch.float64)).within
    # in fp32 the same value is finite, so an infinity there is wrong
    assert not compare_tolerance(ref, right.float(), torch.tensor(1e9, dtype=torch.float64)).within


def test_matching_nan_classes_pass_whatever_their_bound():
    ref = torch.tensor([[math.nan, 1.0]], dtype=torch.float64)
    act = torch.tensor([[math.nan, 1.0]])
    assert compare_tolerance(ref, act, torch.tensor([[math.nan, 0.0]], dtype=torch.float64)).within


def test_bitwise_equal_reads_every_pair():
    from batchinv.harness.compare import bitwise_equal

    x = torch.randn(5, 4)
    neg_zero = torch.zeros(5, 4)
    neg_zero[3, 1] = -0.0
    pairs = [(x, x.clone()), (torch.zeros(5, 4), neg_zero), (torch.empty(0, 4), torch.empty(0, 4))]
    assert bitwise_equal(pairs) == [True, False, True]
    assert bitwise_equal([]) == []
