"""The exact-arithmetic helpers behind the bitwise references: one correct rounding, exact row
sums, the quantum (lowest set bit) of a value.  Expectations come from Python's exact
``fractions.Fraction``, numpy's direct fp64 -> fp16 conversion and torch's fp64 -> fp32 cast,
never from the code under test."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from batchinv.reference.exact import exact_row_sums, quantum_exponent, round_once

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _values(seed: int, n: int = 20000) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-150, 130, (n,), generator=g).double())
    edges = [0.0, -0.0, math.inf, -math.inf, 65504.0, 65520.0, 65519.99, 1 + 2**-11, 1 + 3 * 2**-11]
    edges += [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-40, 2**-25, 1.5 * 2**-24, 2**-134, 3 * 2**-134]
    edges += [3.4028235e38, 3.4028236e38, 3.4e38 * 1.0000001, 2.0**128, 1.5 * 2**-149, 2**-150]
    return torch.cat([x, torch.tensor(edges, dtype=torch.float64)])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == F32 else torch.int16)


def _round_fraction(v: float, precision: int, emin: int, emax: int) -> float:
    """Round ``v`` to ``precision`` significant bits, exponent >= ``emin``, exactly (RNE)."""
    if v == 0 or math.isinf(v):
        return v
    _, e = math.frexp(v)
    ulp = Fraction(2) ** (max(e, emin + 1) - precision)
    q = Fraction(v) / ulp
    low = math.floor(q)
    rest = q - low
    n = low + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and low % 2) else 0)
    out = n * ulp
    if abs(out) >= Fraction(2) ** (emax + 1):
        return math.copysign(math.inf, v)
    return float(out)


def test_round_once_to_fp32_is_the_correct_cast():
    x = _values(0)
    assert torch.equal(_bits(round_once(x, F32)), _bits(x.to(F32)))


def test_round_once_to_fp16_matches_numpys_direct_conversion():
    x = _values(1)
    with np.errstate(over="ignore"):
        expected = torch.from_numpy(x.numpy().astype(np.float16))
    assert torch.equal(_bits(round_once(x, F16)), _bits(expected))


def test_round_once_to_bf16_is_one_rounding():
    x = _values(2, n=3000)
    got = round_once(x, BF16).to(torch.float64)
    for v, r in zip(x.tolist(), got.tolist(), strict=True):
        assert r == _round_fraction(v, 8, -126, 127) or (math.isnan(v) and math.isnan(r)), v
    # torch's own cast rounds twice here (to fp32, a bf16 tie, then to even): 1 + 2**-8 + 2**-40
    v = torch.tensor([1 + 2**-8 + 2**-40], dtype=torch.float64)
    assert round_once(v, BF16).item() == 1 + 2**-7 and v.to(BF16).item() == 1.0


def test_round_once_keeps_signed_zeros_and_nan():
    x = torch.tensor([0.0, -0.0, math.nan], dtype=torch.float64)
    for dtype in (F32, BF16, F16):
        out = round_once(x, dtype)
        assert _bits(out)[:2].tolist() == [0, -(2 ** (8 * out.element_size() - 1))]
        assert math.isnan(out[2].item())


def test_quantum_exponent_is_the_lowest_set_bit():
    x = torch.tensor(
        [1.0, 3.0, 0.5, 0.75, 2**-149, 6.0, -12.0, 0.0, math.inf, math.nan, 1 + 2**-52], dtype=torch.float64
    )
    assert quantum_exponent(x).tolist() == [0, 0, -1, -2, -149, 1, 2, math.inf, math.inf, math.inf, -52]


def test_exact_row_sums_are_exact():
    g = torch.Generator().manual_seed(3)
    v = torch.randn(40, 300, generator=g) * torch.exp2(
        torch.randint(-140, 100, (40, 300), generator=g).float()
    )
    v[0, :6] = torch.tensor([1.0, 2**-149, -3.3e38, 3.3e38, 1e-45, -0.0])
    for row, total in zip(v.tolist(), exact_row_sums(v), strict=True):
        assert Fraction(total, 2**149) == sum(Fraction(a) for a in row)
    assert exact_row_sums(v.to(BF16)) == exact_row_sums(v.to(BF16).float())
    with pytest.raises(ValueError, match="finite"):
        exact_row_sums(torch.tensor([[1.0, math.inf]]))


def test_power_of_two_is_exact_from_its_bits_over_the_whole_range():
    """The scale of round_once: exact for every exponent (CUDA's pow is not correctly rounded;
    on an H200 it turned exact ties into near-ties), and refused outside fp64's normal range."""
    from batchinv.reference.exact import power_of_two

    exponents = torch.arange(-1022, 1024)
    expected = torch.tensor([math.ldexp(1.0, int(e)) for e in exponents], dtype=torch.float64)
    assert torch.equal(power_of_two(exponents), expected)
    with pytest.raises(ValueError, match="exponent"):
        power_of_two(torch.tensor([1024]))
