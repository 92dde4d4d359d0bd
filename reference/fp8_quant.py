"""Reference dynamic FP8 quantization of activations (per token, or 1 x G groups): obviously correct.

Dimension legend:
    M: rows (tokens of the batch); dim 0, the row axis.
    K: the quantized (last) dimension, the hidden size.
    G: the group length along K (``group_size``; K itself per token); the last group of a row
       may be short (K mod G elements).
    NG: groups per row: 1 per token, ``ceil(K / G)`` with ``group_size=G``.

Formula (every step one IEEE operation on fp32 values, round to nearest even), per group of a
row:

    amax  = max |x| over the group's finite elements (NaN and +-inf ignored; 0 if none)
    scale = fl32(max(amax, MIN_AMAX) / 448)                one fp32 division
    q     = e4m3(fl32(x / scale))                          one fp32 division, then e4m3 rounding

``scale`` is the *dequantization* scale (x ~= q * scale), the convention of
``torch._scaled_mm``, vLLM and DeepSeek-V3 (scale = amax / 448, 448 the largest e4m3fn value).
``e4m3`` (:func:`e4m3_rne_satfinite`) rounds to nearest, ties to even, onto the e4m3fn grid with
subnormals kept (spacing 2^-9 below 2^-6) and saturation: every |v| >= 448 (464, the midpoint
between 448 and the would-be 480, included; +-inf included) gives +-448.  A NaN gives the
e4m3fn NaN with the input's sign (0x7F, or 0xFF for a NaN whose sign bit is set), as torch's
own fp32 -> e4m3fn conversion does; -0.0 stays -0.0 (0x80), and so does any negative value that
rounds to zero.

MIN_AMAX = 2^-64 (:data:`MIN_AMAX`) keeps the scale a normal fp32 (>= 2^-72.8) for every group, an
all-zero, all-NaN or all-infinite group included (then scale = fl32(2^-64 / 448), q = +-0, NaN or
+-448).  It is also large enough that every fp32 / bf16 subnormal input (|x| < 2^-126) quantizes
to +-0 (|x| / scale < 448 * 2^-62 < 2^-10, below half the smallest e4m3 subnormal), so no result
depends on whether hardware flushes subnormal inputs, scales or quotients to zero.  (vLLM's floor
of 1 / (448 * 512) on the scale, i.e. 2^-9 on amax, would cost precision on rows whose |x| are
all below 2^-9; here such rows keep their full e4m3 precision.)

Evaluation here: amax is exact in fp64 (a max of exactly widened inputs); each division is done
in fp64 on two fp32 values and rounded once to fp32.  That equals the correctly rounded fp32
division: double rounding through a format of p' >= 2p + 2 bits is innocuous for +, -, *, /
and sqrt (Figueroa, "When is double rounding innocuous?", 1995), and 53 >= 2 * 24 + 2 (the
fp64 quotient of fp32 values never underflows or overflows fp64).  The e4m3 rounding is done in
fp64 on the exact value with an explicit spacing (a power of two, so the scaled value is exact)
and ``torch.round`` (half to even).  It does not use torch's own float8 conversion: that one
saturates on torch 2.13 (CPU, checked; ``torch/headeronly/util/Float8_e4m3fn.h``), while earlier
releases' version of that routine returned NaN for |x| >= 480 (and so for values rounding past
464) and for +-inf; the reference must not depend on which.

Argument validation is shared with the fast launcher (:func:`check_fp8_quant_args`).
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, check_int, check_tensor
from batchinv.reference.exact import power_of_two

#: Input dtypes of x.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
#: The largest finite float8_e4m3fn value (S.1111.110 = 1.75 * 2^8).
E4M3_MAX = 448.0
#: The floor of amax (see the module docstring): the scale is never below fl32(2^-64 / 448).
MIN_AMAX = 2.0**-64
#: The smallest group size accepted (a power of two).
MIN_GROUP_SIZE = 16
#: Bit patterns of float8_e4m3fn: the largest finite magnitude and the NaN magnitude.
E4M3_MAX_BITS = 0x7E
E4M3_NAN_BITS = 0x7F


def check_group_size(group_size: Any) -> int | None:
    """Validate ``group_size``: None (per token) or a host integer power of two >= 16
    (:func:`~batchinv.reference.errors.check_int`); returns it as a Python int (or None).

    Raises:
        DTypeError: not None nor a host integer (a bool, a float, a tensor...).
        ArgumentError: an int below 16, above 2**62 or not a power of two.
    """
    if group_size is None:
        return None
    group_size = check_int("group_size", group_size, MIN_GROUP_SIZE, 2**62)  # min(group, K) is used
    if group_size & (group_size - 1):
        raise ArgumentError("group_size", f"None or a power of two >= {MIN_GROUP_SIZE}", group_size)
    return group_size


def check_fp8_quant_args(x: Any, group_size: Any) -> int | None:
    """Validate the arguments of :func:`fp8_quant`; returns ``group_size`` as a Python int (or
    None).

    Raises:
        DTypeError: x not a tensor of a dtype in :data:`SUPPORTED_DTYPES`; group_size not None
            nor an int.
        ArgumentError: x not 2-D (M, K) or K == 0; group_size below 16 or not a power of two.
        DeviceError: x on the meta device.
    """
    check_tensor("x", x, dtypes=SUPPORTED_DTYPES, ndim=2)
    if x.shape[1] == 0:
        raise ArgumentError("x", "a 2-D (M, K) tensor with K >= 1", f"shape {tuple(x.shape)}")
    return check_group_size(group_size)


def num_groups(k: int, group_size: int | None) -> int:
    """Groups per row: 1 per token, ``ceil(k / group_size)`` otherwise."""
    return 1 if group_size is None else -(k // -group_size)


def e4m3_rne_satfinite(v: torch.Tensor) -> torch.Tensor:
    """Bits (uint8) of ``v`` rounded to float8_e4m3fn: nearest even, subnormals kept, satfinite.

    Parameters
    ----------
    v : Tensor of any shape, float32 or float64; each value is taken exactly.

    Returns
    -------
    Tensor of ``v``'s shape, uint8: the e4m3fn bits.  |v| >= 448 (+-inf included) gives 0x7E
    with v's sign; NaN gives 0x7F with v's sign bit; values round onto the grid of spacing
    2^(e - 3) for |v| in [2^e, 2^(e + 1)), e >= -6, and 2^-9 below 2^-6 (subnormals), ties to
    the even code; the sign is kept on zeros (-0.0 and negative values rounding to 0 give 0x80).
    """
    v64 = v.to(torch.float64)
    negative = torch.signbit(v64)
    nan = torch.isnan(v64)
    a = torch.where(nan, torch.zeros_like(v64), v64.abs())
    saturated = a >= E4M3_MAX  # +inf included
    a = torch.where(saturated, torch.zeros_like(a), a)  # finite, < 448, from here on
    _, exponent = torch.frexp(a)  # a in [2^(exponent - 1), 2^exponent); a = 0 gives 0
    e = torch.clamp(exponent.to(torch.int64) - 1, min=-6)  # binade; the subnormal range below 2^-6
    # The e4m3 grid around a, exact: built from the bits (CUDA's pow is not correctly rounded;
    # an off-by-an-ulp spacing turns exact ties into near-ties, seen on the H200, run 39).
    spacing = power_of_two(e - 3)
    n = torch.round(a / spacing)  # a / spacing is exact (a power of two); half to even
    value = n * spacing  # the rounded magnitude, <= 448 (exact)
    _, value_exponent = torch.frexp(value)
    ve = value_exponent.to(torch.int64) - 1  # value's binade (value = 0: -1, below -6 too)
    normal = value >= 2.0**-6
    mantissa = torch.round((value / power_of_two(torch.clamp(ve, min=-1022)) - 1.0) * 8.0)  # 0..7, exact
    code_normal = ((ve + 7) << 3) + mantissa.to(torch.int64)
    code_sub = torch.round(value / 2.0**-9).to(torch.int64)  # 0..7 (8 is the normal 2^-6)
    code = torch.where(normal, code_normal, code_sub)
    code = torch.where(saturated, torch.full_like(code, E4M3_MAX_BITS), code)
    code = torch.where(nan, torch.full_like(code, E4M3_NAN_BITS), code)
    code = code | torch.where(negative, 0x80, 0)
    return code.to(torch.uint8)


def fp8_quant(x: torch.Tensor, *, group_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic FP8 (e4m3fn) quantization with one absmax scale per token or per 1 x G group.

    The formula (module docstring): per group, ``amax`` = max |x| over the finite elements,
    ``scale = fl32(max(amax, MIN_AMAX) / 448)``, ``q = e4m3_rne_satfinite(fl32(x / scale))``,
    each division one IEEE fp32 division (round to nearest even), evaluated here in fp64 with
    the fp32 roundings explicit.

    Parameters
    ----------
    x : Tensor [M, K], bfloat16, float16 or float32, any strides.
    group_size : None (one scale per row) or an int power of two >= 16 (1 x G groups along K;
        the last group of a row holds K mod G elements when G does not divide K).

    Returns
    -------
    q : Tensor [M, K], float8_e4m3fn, contiguous, on x's device.
    scale : Tensor [M, NG], float32 (NG = 1 per token, ceil(K / G) per group): the dequantization
        scale, x ~= q * scale.
    Row-local (a row's outputs read only that row): bitwise invariant along M, the row's
    position and neighbours, its place in memory and repeated calls.  NaN -> NaN (sign kept),
    +-inf -> +-448, -0.0 -> -0.0; NaN and +-inf never enter amax.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError : see :func:`check_fp8_quant_args`.

    Source: the dynamic per-token / per-group activation quantization of vLLM
    (``scaled_fp8_quant``, ``per_token_group_quant_fp8``) and DeepSeek-V3 (``act_quant``, 1 x 128).
    """
    group_size = check_fp8_quant_args(x, group_size)
    m, k = x.shape
    g = k if group_size is None else min(group_size, k)  # a group past K is the row: pad to K, not G
    ng = num_groups(k, group_size)
    x64 = x.to(torch.float64)  # [M, K], exact
    padded = torch.zeros((m, ng * g), dtype=torch.float64, device=x.device)  # [M, NG * G]
    padded[:, :k] = torch.where(torch.isfinite(x64), x64.abs(), torch.zeros_like(x64))
    amax = padded.reshape(m, ng, g).amax(dim=2)  # [M, NG], exact
    scale = (torch.clamp(amax, min=MIN_AMAX) / E4M3_MAX).to(torch.float32)  # [M, NG], one rounding
    scale_per_col = scale.to(torch.float64).repeat_interleave(g, dim=1)[:, :k]  # [M, K]
    quotient = (x64 / scale_per_col).to(torch.float32)  # [M, K], one rounding (fp32 x / fp32 scale)
    q = e4m3_rne_satfinite(quotient).view(torch.float8_e4m3fn)  # [M, K]
    assert q.shape == (m, k) and scale.shape == (m, ng)
    return q, scale
