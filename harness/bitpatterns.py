"""The bit-pattern catalogue: special floating-point values built from raw integer views.

A Python float cannot carry a signalling NaN (the conversion quiets it) nor a chosen NaN
payload, so every special value here is made from its integer bits and viewed as the float
dtype.  Patterns are meant to be injected sparsely into a realistic background (see
:func:`inject`), the way Hypothesis' ``arrays(..., fill=)`` mixes a few special elements into
ordinary data.

Formats (sign | exponent | mantissa bits): fp32 1|8|23, bf16 1|8|7, fp16 1|5|10,
fp8 e4m3fn 1|4|3 (no infinities; only S.1111.111 is NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FloatFormat:
    dtype: torch.dtype
    width: int
    exponent_bits: int
    mantissa_bits: int
    int_dtype: torch.dtype
    has_inf: bool = True

    @property
    def sign_mask(self) -> int:
        return 1 << (self.width - 1)

    @property
    def exponent_mask(self) -> int:
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits

    @property
    def mantissa_mask(self) -> int:
        return (1 << self.mantissa_bits) - 1

    @property
    def all_ones(self) -> int:
        return (1 << self.width) - 1


FORMATS: dict[torch.dtype, FloatFormat] = {
    torch.float32: FloatFormat(torch.float32, 32, 8, 23, torch.int32),
    torch.bfloat16: FloatFormat(torch.bfloat16, 16, 8, 7, torch.int16),
    torch.float16: FloatFormat(torch.float16, 16, 5, 10, torch.int16),
    torch.float8_e4m3fn: FloatFormat(torch.float8_e4m3fn, 8, 4, 3, torch.int8, has_inf=False),
}


def float_format(dtype: torch.dtype) -> FloatFormat:
    """The :class:`FloatFormat` of ``dtype``; ``TypeError`` for a dtype outside the catalogue."""
    try:
        return FORMATS[dtype]
    except KeyError:
        names = ", ".join(str(d).removeprefix("torch.") for d in FORMATS)
        raise TypeError(f"dtype: expected one of {names}, got {dtype}") from None


@dataclass(frozen=True)
class BitPattern:
    """One special value: a name and its raw, unsigned bits in ``dtype``."""

    name: str
    dtype: torch.dtype
    bits: int

    def tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """A 0-d tensor of ``dtype`` holding exactly these bits."""
        return from_bits([self.bits], self.dtype, device).reshape(())

    @property
    def is_nan(self) -> bool:
        fmt = float_format(self.dtype)
        magnitude = self.bits & ~fmt.sign_mask & fmt.all_ones
        if not fmt.has_inf:
            return magnitude == fmt.exponent_mask | fmt.mantissa_mask
        return (magnitude & fmt.exponent_mask) == fmt.exponent_mask and (magnitude & fmt.mantissa_mask) != 0


def from_bits(bits: Sequence[int], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A 1-D tensor of ``dtype`` whose elements have exactly the given unsigned ``bits``."""
    fmt = float_format(dtype)
    signed = [b - (1 << fmt.width) if b >= fmt.sign_mask else b for b in bits]
    return torch.tensor(signed, dtype=fmt.int_dtype, device=device).view(dtype)


def to_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor as unsigned values in int64 (same shape)."""
    fmt = float_format(tensor.dtype)
    return tensor.contiguous().view(fmt.int_dtype).to(torch.int64) & fmt.all_ones


def _max_normal_bits(fmt: FloatFormat) -> int:
    """The bits of the largest finite value (exponent field all ones but one, or, without
    infinities, everything but the NaN pattern)."""
    exp, mant = fmt.exponent_mask, fmt.mantissa_mask
    return (exp - (1 << fmt.mantissa_bits)) | mant if fmt.has_inf else (exp | mant) - 1


def catalogue(dtype: torch.dtype, *, near_max: bool = False) -> tuple[BitPattern, ...]:
    """Every special value of ``dtype``: +-0, +-inf, quiet and signalling NaNs of both signs,
    the all-ones and all-ones-minus-one patterns (0xffffffff / 0xfffffffe for fp32), min/max
    subnormal and min/max normal of both signs; with ``near_max``, also :func:`near_max`'s
    values (opt-in: components whose exact semantics are defined on the base catalogue, such
    as top-k's key order, keep it unchanged)."""
    fmt = float_format(dtype)
    s = fmt.sign_mask
    exp = fmt.exponent_mask
    mant = fmt.mantissa_mask
    quiet_bit = 1 << (fmt.mantissa_bits - 1)
    max_normal = _max_normal_bits(fmt)
    values: list[tuple[str, int]] = [
        ("+0", 0),
        ("-0", s),
        ("+min_subnormal", 1),
        ("-min_subnormal", s | 1),
        ("+max_subnormal", mant),
        ("-max_subnormal", s | mant),
        ("+min_normal", 1 << fmt.mantissa_bits),
        ("-min_normal", s | (1 << fmt.mantissa_bits)),
        ("+max_normal", max_normal),
        ("-max_normal", s | max_normal),
    ]
    if fmt.has_inf:
        values += [
            ("+inf", exp),
            ("-inf", s | exp),
            ("+quiet_nan", exp | quiet_bit),
            ("-quiet_nan", s | exp | quiet_bit),
            ("+signalling_nan", exp | 1),
            ("-signalling_nan", s | exp | 1),
            ("all_ones_nan", fmt.all_ones),
            ("all_ones_minus_one_nan", fmt.all_ones - 1),
        ]
    else:
        values += [("+nan", exp | mant), ("-nan", s | exp | mant)]
    base = tuple(BitPattern(name, dtype, bits) for name, bits in values)
    return base + near_max_patterns(dtype) if near_max else base


def near_max_patterns(dtype: torch.dtype) -> tuple[BitPattern, ...]:
    """Finite values at the top of ``dtype``'s range, both signs, the inputs on which a kernel
    that squares or sums in a narrow type overflows:

    * ``near_max``: max normal minus one ULP;
    * ``max_power_of_two``: the largest power of two (max exponent, zero mantissa), e.g. 2^127;
    * ``square_overflow``: the smallest power of two whose square exceeds the max normal: 2^64
      for fp32 and bf16, 2^8 for fp16 (for these three also the smallest magnitude whose square
      rounds to inf in the dtype), 2^5 for fp8 e4m3fn.

    Max normal itself is in :func:`catalogue`.
    """
    fmt = float_format(dtype)
    s = fmt.sign_mask
    m = fmt.mantissa_bits
    bias = (1 << (fmt.exponent_bits - 1)) - 1
    max_normal = _max_normal_bits(fmt)
    top_exponent = (max_normal >> m) - bias  # the max normal's unbiased exponent
    max_value = (1 + (max_normal & fmt.mantissa_mask) / (1 << m)) * 2.0**top_exponent
    half_exponent = next(e for e in range(top_exponent + 2) if 4.0**e > max_value)
    values = [
        ("near_max", max_normal - 1),
        ("max_power_of_two", max_normal & ~fmt.mantissa_mask),
        ("square_overflow", (half_exponent + bias) << m),
    ]
    return tuple(
        BitPattern(f"{sign}{name}", dtype, bits | (s if sign == "-" else 0))
        for name, bits in values
        for sign in "+-"
    )


def pattern(dtype: torch.dtype, name: str) -> BitPattern:
    """The catalogue entry ``name`` of ``dtype``, near-max values included (``KeyError`` listing
    the names if absent)."""
    known = catalogue(dtype, near_max=True)
    for p in known:
        if p.name == name:
            return p
    raise KeyError(f"no bit pattern {name!r} for {dtype}; known: {[p.name for p in known]}")


def inject(
    background: torch.Tensor,
    patterns: Sequence[BitPattern],
    density: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """A copy of ``background`` with about ``density`` of its elements replaced by ``patterns``.

    Positions and the choice of pattern come from ``generator`` (on the CPU), so the result
    is a function of the seed alone.  The replacement writes integer bits, so signalling NaNs
    and NaN payloads survive.
    """
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density: expected a value in [0, 1], got {density}")
    if not patterns:
        return background.clone()
    fmt = float_format(background.dtype)
    out_bits = background.detach().to("cpu").contiguous().view(fmt.int_dtype).clone().reshape(-1)
    n = out_bits.numel()
    mask = torch.rand(n, generator=generator) < density
    choice = torch.randint(len(patterns), (n,), generator=generator)
    table = from_bits([p.bits for p in patterns], background.dtype).view(fmt.int_dtype)
    out_bits[mask] = table[choice[mask]]
    return out_bits.view(background.dtype).reshape(background.shape).to(background.device)


def quantized(background: torch.Tensor, levels: int) -> torch.Tensor:
    """``background`` rounded to ``levels`` distinct values per unit (a source of exact ties)."""
    return (background.float() * levels).round().div(levels).to(background.dtype)


def relu_plateau(background: torch.Tensor) -> torch.Tensor:
    """``relu(background)``: about half the elements become an exact +0 plateau."""
    return background.clamp_min(0)


def probe_flush_to_zero(device: torch.device | str) -> dict[str, bool]:
    """Whether ``device`` flushes fp32 subnormals, probed once: an operand (``x * 1``) and a
    result (``min_normal / 2``).  Reported beside a lane's results."""
    tiny = pattern(torch.float32, "+min_subnormal").tensor(device)
    one = torch.ones((), device=device)
    min_normal = pattern(torch.float32, "+min_normal").tensor(device)
    return {
        "flushes_subnormal_operand": bool((tiny * one) == 0),
        "flushes_subnormal_result": bool((min_normal / 2) == 0),
    }
