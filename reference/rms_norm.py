"""Reference RMS norm and fused residual-add + RMS norm: fp64, obviously correct.

Dimension legend:
    M: rows (tokens of the batch); dim 0, the row axis.
    N: hidden size, the normalized (last) dimension.

Formulas (exact real arithmetic, evaluated in fp64):
    rms_norm:            out[m, n] = x[m, n] * w[n] / sqrt(sum_k x[m, k]^2 / N + eps)
    fused_add_rms_norm:  h[m, n]   = round_to_dtype(x[m, n] + residual[m, n])
                         out       = rms_norm(h), residual_out = h

The eps rule (fast kernels and reference alike): ``eps`` is rounded to the nearest float32 once,
before use (:func:`eps_float32`), and that value is added to the fp64 mean of squares; an eps
whose float32 rounding is 0, infinite or NaN is refused with :class:`ArgumentError`.  Any
float32 eps is accepted: ``mean(x^2) + eps`` is formed in fp64, where it cannot overflow (an
fp32 row has mean(x^2) < 2^256), so x = [5e18] * 4 with eps = 3.3e38 gives
5e18 / sqrt(2.5e37 + 3.3e38) = 0.26537, not 0.

Every input is exact in fp64 and so is every square (at most 48 significant bits, between
2^-298 and 2^256): nothing here overflows or underflows for finite input.  The fp64 sum of
N <= 2^20 squares has a relative error below N * 2^-53, so the outputs here stand for the exact
values (the tolerance, :func:`out_bound`, still counts that error).  Argument
validation is shared with the fast launchers (:func:`check_rms_norm_args`), so both raise the
same typed errors.
"""

from __future__ import annotations

import math
import struct
from numbers import Real
from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_same_device, check_tensor

#: Input dtypes of x, weight and residual (all three must match).
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)

#: fp32 unit roundoff (rstd's rounding and the fp32 products).
U32 = 2.0**-24
#: fp64 unit roundoff (the sum of squares, mean, eps add, sqrt and reciprocal; the reference).
U64 = 2.0**-53
#: Half the smallest fp32 subnormal: the absolute error of one fp32 rounding that underflows.
FP32_UNDERFLOW = 2.0**-150
#: Per output dtype: (unit roundoff of the final rounding, half its smallest subnormal).  fp32
#: outputs have no extra rounding (the last fp32 product is the final rounding, counted in U32).
FINAL_ROUNDING: dict[torch.dtype, tuple[float, float]] = {
    torch.bfloat16: (2.0**-8, 2.0**-134),
    torch.float16: (2.0**-11, 2.0**-25),
    torch.float32: (0.0, 0.0),
}


def check_rms_norm_args(
    x: Any,
    weight: Any,
    eps: Any,
    dim: Any,
    residual: Any = None,
    *,
    with_residual: bool = False,
) -> None:
    """Validate the arguments of :func:`rms_norm` / :func:`fused_add_rms_norm`.

    Raises:
        DTypeError: x, weight or residual not a tensor, or of a dtype outside
            :data:`SUPPORTED_DTYPES`, or weight / residual of another dtype than x.
        ArgumentError: x not 2-D (M, N) or N == 0; ``dim`` not an int, out of range for x, or
            not the last dimension; weight not of shape (N,); residual not of x's shape;
            ``eps`` not a real number whose float32 rounding is finite and > 0 (the eps
            rule: eps is rounded to float32 before use, so 1e-50 would become 0 and 1e39 inf).
        DeviceError: weight or residual on another device than x.
    """
    check_tensor("x", x, dtypes=SUPPORTED_DTYPES)
    if x.dim() == 0:  # no dimension to normalize: blame x's rank, not dim
        check_tensor("x", x, ndim=2)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ArgumentError("dim", "an int", type(dim).__name__)
    if not -x.dim() <= dim < max(x.dim(), 1):
        raise ArgumentError("dim", f"a dimension in [{-x.dim()}, {x.dim()}) (out of range)", dim)
    check_tensor("x", x, ndim=2)
    if dim not in (-1, 1):  # x is 2-D here
        raise ArgumentError("dim", "the last dimension (-1 or 1): only the last dimension is normalized", dim)
    if x.shape[1] == 0:
        raise ArgumentError("x", "a non-empty hidden (last) dimension", tuple(x.shape))
    check_tensor("weight", weight, dtypes=SUPPORTED_DTYPES)
    if weight.dtype != x.dtype:
        raise DTypeError(
            "weight",
            f"x's dtype {str(x.dtype).removeprefix('torch.')}",
            str(weight.dtype).removeprefix("torch."),
        )
    if tuple(weight.shape) != (x.shape[1],):
        raise ArgumentError("weight", f"shape ({x.shape[1]},), the hidden size of x", tuple(weight.shape))
    check_same_device("weight", weight, x.device)
    if with_residual:
        check_tensor("residual", residual, dtypes=SUPPORTED_DTYPES)
        if residual.dtype != x.dtype:
            raise DTypeError(
                "residual",
                f"x's dtype {str(x.dtype).removeprefix('torch.')}",
                str(residual.dtype).removeprefix("torch."),
            )
        if residual.shape != x.shape:
            raise ArgumentError("residual", f"x's shape {tuple(x.shape)}", tuple(residual.shape))
        check_same_device("residual", residual, x.device)
    expected_eps = "a real number > 0 whose float32 rounding is finite and > 0 (eps is rounded to float32)"
    if isinstance(eps, bool) or not isinstance(eps, Real):
        raise ArgumentError("eps", expected_eps, eps)
    if not 0.0 < _float32(eps) < math.inf:
        raise ArgumentError("eps", expected_eps, eps)


def eps_float32(eps: Any) -> float:
    """The eps actually used by :func:`rms_norm` and the fast kernels: ``eps`` rounded to the
    nearest float32 (ties to even), as a Python float (exact).  Call after validation."""
    return _float32(eps)


def _float32(value: Real) -> float:
    """``value`` rounded to the nearest float32 (inf past its range, either sign; NaN kept)."""
    try:
        return float(struct.unpack("f", struct.pack("f", float(value)))[0])
    except OverflowError:  # float(10**400), or a double that rounds past float32's max
        return -math.inf if value < 0 else math.inf


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1) -> torch.Tensor:
    """RMS norm of each row, in fp64.

    ``out[m, n] = x[m, n] * weight[n] / sqrt(mean_k(x[m, k]^2) + eps32)``, eps32 = eps rounded
    to float32 (the eps rule of this module).

    Parameters
    ----------
    x : Tensor (M, N), bfloat16, float16 or float32
    weight : Tensor (N,), x's dtype
    eps : real, > 0 with a finite, nonzero float32 rounding; that rounding is what is added
    dim : int, the normalized dimension; only the last one (-1 or 1) is supported

    Returns
    -------
    Tensor (M, N), float64, on x's device.  Row-local by construction (each row reads only
    itself), hence bitwise invariant along every batch axis.  No finite row overflows: up to
    rounding, RMSNorm(a * x) = RMSNorm(x) wherever a^2 * mean(x^2) dominates eps.  A NaN anywhere
    in a row makes the whole row NaN; an infinity makes mean(x^2) infinite, so the row's finite
    elements become +-0 (sign of x * weight) and its infinite ones NaN (inf * 0); an all-zero row
    gives signed zeros.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError : see :func:`check_rms_norm_args`.
    """
    check_rms_norm_args(x, weight, eps, dim)
    m, n = x.shape
    x64 = x.to(torch.float64)  # (M, N)
    w64 = weight.to(torch.float64)  # (N,)
    mean_sq = (x64 * x64).sum(dim=1, keepdim=True) / n  # (M, 1); exact squares, no overflow
    rstd = 1.0 / torch.sqrt(mean_sq + eps_float32(eps))  # (M, 1)
    out = x64 * rstd * w64  # (M, N)
    assert out.shape == (m, n) and rstd.shape == (m, 1)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    dim: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMS norm, in fp64: returns ``(out, residual_out)``.

    ``residual_out = round_to_dtype(x + residual)`` (one rounding of the exact sum: fp64 holds
    the exact sum of two fp32/fp16/bf16 values to at least 2p + 2 bits, so the double rounding
    through fp64 is innocuous), and ``out = rms_norm(residual_out, weight, eps)``.

    Parameters
    ----------
    x, residual : Tensor (M, N), bfloat16, float16 or float32 (the same dtype)
    weight : Tensor (N,), x's dtype
    eps : real, > 0 with a finite, nonzero float32 rounding (used rounded, as in :func:`rms_norm`)
    dim : int, the normalized dimension; only the last one (-1 or 1) is supported

    Returns
    -------
    (out, residual_out) : Tensors (M, N), both float64 (residual_out holds values of x's dtype
    exactly).  Row-local, hence bitwise invariant along every batch axis.  NaN and infinity
    behave as in :func:`rms_norm` once added (inf + -inf = NaN).  A finite x + residual past
    x's dtype's range rounds to +-inf in residual_out (IEEE overflow), and that row of out is
    then the rms_norm of a row holding an infinity: +-0 for its finite elements, NaN for the
    infinite ones.  Such a row is an infinite input to the norm, not a finite one.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError : see :func:`check_rms_norm_args`.
    """
    check_rms_norm_args(x, weight, eps, dim, residual, with_residual=True)
    h = (x.to(torch.float64) + residual.to(torch.float64)).to(x.dtype)  # (M, N), x's dtype
    assert h.shape == x.shape
    return rms_norm(h, weight, eps, dim), h.to(torch.float64)


def _gamma(k: int, u: float) -> float:
    return k * u / (1.0 - k * u)


def out_bound(n_cols: int, weight: torch.Tensor, ref_out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The largest allowed |fast - reference| per element of ``out``, for :func:`rms_norm` and the
    ``out`` of :func:`fused_add_rms_norm` (whose ``residual_out`` is exact: bound 0).

    Derived for the fast kernel's ``out = fl_out(fl32(fl32(fl32(h * s) * r) * w))`` with
    ``s * r`` = rstd (s a power of two, r = fl32(rstd64 / s) a normal fp32) and
    ``rstd64 = fl64(1 / fl64(sqrt(fl64(fl64(S / N) + eps32))))``, S the fp64 sum of the exact
    squares; exact value ``o = h * w / sqrt(T)``, ``T = sum(h^2) / N + eps32`` (u = 2^-24,
    v = 2^-53, gamma_k(v) = k v / (1 - k v)):

    * T: N - 1 fp64 additions of nonnegative terms (any order), the division by N and the add
      of eps32 >= 0: ``t = T (1 + theta)``, ``|theta| <= gamma_(N+1)(v)``; no fp64 underflow or
      overflow (T in [2^-149, 2^256]).
    * rstd64: sqrt and reciprocal in fp64, correctly rounded (Triton lowers fp64 ``/`` to
      ``div.rn.f64`` and fp64 sqrt to ``sqrt.rn.f64``; numpy in the interpreter), counted as one
      fp64 ULP (2v) each so that a merely faithful lowering would still be covered; then one
      rounding to fp32 (r is normal): rstd = (1 + rho) / sqrt(T),
      ``1 + rho <= (1 + 2v)(1 + u) / ((1 - 2v) sqrt(1 - gamma_(N+1)(v)))``.
    * h * s: exact, or 2^-150 absolute when it underflows (only for s = 2^-64, where r <= 1).
    * two fp32 products: (1 + u) each, plus 2^-150 absolute each when they underflow.
    * the final rounding to bf16 / fp16: (1 + u_out) relative plus half a subnormal.

    So ``|fast - o| <= |o| rel_f + 2^-150 ((2 + u)(1 + u) |w| + 1)(1 + u_out) + half_sub`` with
    ``rel_f = (1 + rho)(1 + u)^2 (1 + u_out) - 1``: about 3u for fp32 outputs (1.5 to 3 ULP), and
    u_out + 3u for bf16 / fp16.  No term grows with N beyond gamma_(N+1)(v) ~ N 2^-53.  The fp64
    reference itself is within ``gamma_(N+5)(v) |o|`` of o (exact squares, N - 1 additions, a
    division, an add, sqrt, reciprocal, two products), so
    ``|fast - ref| <= |ref| (rel_f + g) / (1 - g) + floor`` with g = gamma_(N+5)(v).

    Parameters
    ----------
    n_cols : int
        N, the hidden size (the length of the sum).
    weight : Tensor (N,), any float dtype
        The weight.
    ref_out : Tensor (M, N), float64
        The reference output (:func:`rms_norm`, or ``out`` of :func:`fused_add_rms_norm`).
    dtype : torch.dtype
        The output dtype: bfloat16, float16 or float32 (a key of :data:`FINAL_ROUNDING`).

    Returns
    -------
    Tensor (M, N), float64, on ``ref_out``'s device: NaN where the reference is NaN (the
    comparator then requires a NaN), infinite where it is infinite.

    Source: the derivation above, in the style of Higham, *Accuracy and Stability of Numerical
    Algorithms*, 2nd ed., section 3.1 (gamma_k).
    """
    g_sum = _gamma(n_cols + 1, U64)
    one_plus_rho = (1.0 + 2 * U64) * (1.0 + U32) / ((1.0 - 2 * U64) * math.sqrt(1.0 - g_sum))
    u_out, half_sub = FINAL_ROUNDING[dtype]
    rel_f = one_plus_rho * (1.0 + U32) ** 2 * (1.0 + u_out) - 1.0
    g_ref = _gamma(n_cols + 5, U64)
    rel = (rel_f + g_ref) / (1.0 - g_ref)
    w = weight.to(device=ref_out.device, dtype=torch.float64).abs()  # (N,)
    floor = FP32_UNDERFLOW * ((2.0 + U32) * (1.0 + U32) * w + 1.0) * (1.0 + u_out) + half_sub
    return ref_out.abs() * rel + floor
