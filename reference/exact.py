"""Exact arithmetic for references that promise one rounding of an exactly computed value.

Dimension legend:
    R: rows (the batch axis; any leading dims flattened)
    N: elements summed per row

Three helpers, each obviously correct from the IEEE definitions rather than fast:

* :func:`exact_row_sums`: the exact sum of each row of fp32-representable values, as a Python
  integer in units of 2**-149 (fp32's smallest subnormal), accumulated in 32-bit limbs;
* :func:`round_once`: fp64 values rounded once, to nearest with ties to even, to fp32, bf16 or
  fp16 (torch's own fp64 -> bf16/fp16 conversion goes through fp32: two roundings);
* :func:`quantum_exponent`: the exponent of the lowest set bit of each value (every value is a
  multiple of ``2**quantum_exponent``), which decides when a floating-point sum is exact.
"""

from __future__ import annotations

import math

import torch

#: Significand bits (with the implicit one) and the smallest normal exponent of each target.
_FORMATS: dict[torch.dtype, tuple[int, int]] = {
    torch.float32: (24, -126),
    torch.bfloat16: (8, -126),
    torch.float16: (11, -14),
}
#: fp32 values are integer multiples of 2**-149.
FP32_QUANTUM_EXPONENT = -149
#: Limbs of 32 bits hold an fp32 significand (24 bits) shifted by up to 31 bits into 2 limbs;
#: positions run over 2**0 .. 2**253 in units of 2**-149, so 9 limbs (one spare for the carry).
_LIMB_BITS = 32
_LIMBS = 9
#: Rows are summed in chunks of at most this many elements (bounds the int64 temporaries).
_CHUNK_ELEMENTS = 1 << 24


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (any float dtype, read exactly as fp64) rounded once to ``dtype``.

    Round to nearest, ties to even, subnormals kept (gradual underflow), beyond the largest
    finite value +-inf (as IEEE 754 round-to-nearest).  +-0 keep their sign, +-inf stay, a NaN
    stays a NaN (its payload is not specified).

    Args:
        x: a float tensor; its values are taken as exact fp64 numbers.
        dtype: float32, bfloat16 or float16.

    Returns:
        A tensor of ``dtype``, the shape and device of ``x``.
    """
    try:
        precision, emin = _FORMATS[dtype]
    except KeyError:
        raise TypeError(f"dtype: expected float32, bfloat16 or float16, got {dtype}") from None
    x64 = x.to(torch.float64)
    _, exponent = torch.frexp(x64)  # |x| in [2**(e-1), 2**e)
    # The spacing of dtype's values around |x|: 2**(e - p) among normals, 2**(emin + 1 - p) below.
    ulp_exp = torch.clamp(exponent.to(torch.int64), min=emin + 1) - precision
    # Scaling by a power of two is exact; round() is half-to-even; scaling back is exact, and the
    # result is a value of dtype (or 2**(emax + 1), which converts to inf).
    ulp = power_of_two(ulp_exp)
    rounded = torch.round(x64 / ulp) * ulp
    rounded = torch.where(torch.isfinite(x64), rounded, x64)
    # A value of dtype converts exactly through any wider format; 2**(emax + 1) goes to inf.
    return rounded.to(torch.float32).to(dtype) if dtype != torch.float32 else rounded.to(dtype)


def power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """``2.0 ** exponent`` as float64, exactly, for integer exponents in [-1022, 1023].

    Built from the bits (biased exponent, zero mantissa), not with ``torch.pow``: CUDA's pow is
    not correctly rounded, and a scale off by one ULP turns exact ties of :func:`round_once`
    into near-ties that round the other way (seen on an H200, 2026-11-30: 1-ULP differences of
    the fp16 reference on every row of an exact matmul case).
    """
    e = exponent.to(torch.int64)
    if bool(((e < -1022) | (e > 1023)).any()):
        raise ValueError("exponent: expected integers in [-1022, 1023]")
    return ((e + 1023) << 52).view(torch.float64)


def quantum_exponent(x: torch.Tensor) -> torch.Tensor:
    """The exponent of the lowest set bit of each element of ``x`` (read exactly as fp64):
    ``x`` is an integer multiple of ``2**q``.  +inf (float64) for zeros and non-finite values.

    Returns a float64 tensor of ``x``'s shape (integers, or +inf).
    """
    x64 = x.to(torch.float64)
    mantissa, exponent = torch.frexp(x64)  # x = mantissa * 2**exponent, |mantissa| in [0.5, 1)
    finite = torch.isfinite(x64) & (x64 != 0)
    mantissa = torch.where(finite, mantissa, torch.full_like(mantissa, 0.5))
    significand = (mantissa.abs() * 2.0**53).to(torch.int64)  # an exact 53-bit integer
    lowest = significand & -significand  # its lowest set bit, a power of two
    low_exp = torch.frexp(lowest.to(torch.float64))[1].to(torch.float64) - 1.0  # exact: 2**k -> k
    q = low_exp + exponent.to(torch.float64) - 53.0
    return torch.where(finite, q, torch.full_like(q, math.inf))


def exact_row_sums(values: torch.Tensor) -> list[int]:
    """The exact sum of each row of ``values``, in units of 2**-149.

    Args:
        values: (R, N), any float dtype, every element finite and exactly representable in
            fp32 (fp32, bf16 and fp16 values all are); any device.

    Returns:
        R Python integers ``I_r`` with ``sum_n values[r, n] == I_r * 2**-149`` exactly.

    Each fp32 value is ``sign * significand * 2**(position - 149)`` (IEEE 754: significand
    ``1.m * 2**23`` at biased exponent ``b >= 1``, position ``b - 1``; ``m`` at position 0 for
    subnormals).  The significand, shifted by ``position % 32``, is split over two 32-bit limbs
    and the limbs are summed in int64 (N < 2**31 terms below 2**32 each cannot overflow); the
    limbs of a row are then joined as one Python integer.
    """
    if values.dim() != 2:
        raise ValueError(f"values: expected a 2-D (R, N) tensor, got {values.dim()}-D")
    rows, n = values.shape
    if n >= 2**31:
        raise ValueError(f"values: at most 2**31 - 1 elements per row, got {n}")
    chunk = max(1, _CHUNK_ELEMENTS // max(n, 1))
    totals: list[int] = []
    for start in range(0, rows, chunk):
        part = values[start : start + chunk].to(torch.float32)
        if not bool(torch.isfinite(part).all()):
            raise ValueError("values: every element must be finite")
        bits = part.contiguous().view(torch.int32).to(torch.int64)  # (r, N)
        negative = bits < 0
        biased = (bits >> 23) & 0xFF
        significand = torch.where(biased == 0, bits & 0x7FFFFF, (bits & 0x7FFFFF) | 0x800000)
        position = torch.clamp(biased, min=1) - 1  # value = significand * 2**(position - 149)
        shifted = significand << (position % _LIMB_BITS)  # < 2**55
        limb = position // _LIMB_BITS  # 0..7
        sign = torch.where(negative, -1, 1)
        low = (shifted & 0xFFFFFFFF) * sign
        high = (shifted >> _LIMB_BITS) * sign
        limbs = torch.zeros(part.shape[0], _LIMBS, dtype=torch.int64, device=part.device)
        limbs.scatter_add_(1, limb, low)
        limbs.scatter_add_(1, limb + 1, high)
        for row in limbs.tolist():
            totals.append(sum(v << (_LIMB_BITS * j) for j, v in enumerate(row)))
    return totals
