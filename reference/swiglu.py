"""Reference SwiGLU activation of the MoE expert (docs/MOE.md section 4): fp64, obviously correct.

Dimension legend:
    M: rows ((token, slot) pairs of the grouped GEMM's output); dim 0, the row axis.
    I: the intermediate size; ``gate_up`` holds ``[gate | up]``, 2 I columns.

Formula (exact real arithmetic, evaluated in fp64)::

    g = gate_up[m, j], u = gate_up[m, I + j], s = scale[m] (1 when scale is None)
    silu(g) = g / (1 + exp(-g))            for g >= 0 (and NaN)
            = g * exp(g) / (1 + exp(g))    for g < 0  (the same value; exp never overflows)
    out[m, j] = silu(g) * (u * s)

The fast kernel evaluates the same formula in fp32 with one final rounding to gate_up's dtype
(the scale last when |s| > 1); this reference evaluates it in fp64 (every input is exact there,
and ``u * s`` is exact: no fp64 overflow or underflow) and is within a few fp64 ULPs of the
exact value.  IEEE semantics: NaN anywhere gives NaN; silu(+inf) = +inf, silu(-inf) = -inf * 0
= NaN (the formula, as ``F.silu``); +-0 keep their sign (silu(-0) = -0); an exact zero factor
(g = +-0, u = +-0 or s = +-0) times an infinite one is NaN.  silu(g) of a finite nonzero g is
nonzero, but below g ~ -745 fp64's exp(-|g|) underflows and silu64 gives -0: times an infinite
``u * s`` that would be NaN, so there the output is the exact limit, the signed infinity
sign(g) * (u * s).  (Times a finite ``u * s`` the lost value is below 2^-700, far under half of
any output dtype's smallest subnormal.)
Argument validation is shared with the fast launcher (:func:`check_swiglu_args`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_same_device, check_tensor
from batchinv.reference.exact import power_of_two

#: Dtypes of gate_up (the grouped GEMM's output); scale is fp32.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)

# The error model of the fp32 kernel (``batchinv.fast.kernels.swiglu``), see :func:`fp32_error`.
U32 = 2.0**-24  # fp32 unit roundoff (correctly rounded products, 1 + e)
DIV = 2.0**-22  # the fp32 division: 2 ULP allowed (Triton's default div.full.f32 on GPUs)
EXP_ULP = 2.0**-21  # ex2.approx.f32 (tl.exp on GPUs): 2 ULP allowed, plus the argument error
FTZ = 2.0**-126  # exp(-|g|) may be flushed to zero below the smallest normal (ex2.approx.ftz)
UNDER = 2.0**-150  # half the smallest fp32 subnormal: one underflowing fp32 rounding
U64 = 2.0**-53
#: Per output dtype: (unit roundoff, half the smallest subnormal, precision p, smallest exponent).
OUT: dict[torch.dtype, tuple[float, float, int, int]] = {
    torch.bfloat16: (2.0**-8, 2.0**-134, 8, -126),
    torch.float16: (2.0**-11, 2.0**-25, 11, -14),
}


def check_swiglu_args(gate_up: Any, scale: Any) -> None:
    """Validate the arguments of :func:`swiglu`.

    Raises:
        DTypeError: gate_up not a bf16 / fp16 tensor; scale not None nor an fp32 tensor.
        ArgumentError: gate_up not 2-D, or its last dim odd or 0; scale not 1-D of length M.
        DeviceError: scale on another device than gate_up; a meta tensor.
    """
    check_tensor("gate_up", gate_up, dtypes=SUPPORTED_DTYPES, ndim=2)
    if gate_up.shape[1] == 0 or gate_up.shape[1] % 2:
        raise ArgumentError(
            "gate_up", "a last dimension 2 I with I >= 1 (gate then up)", f"shape {tuple(gate_up.shape)}"
        )
    if scale is None:
        return
    if not isinstance(scale, torch.Tensor):
        raise DTypeError("scale", "None or a torch.Tensor", type(scale).__name__)
    check_tensor("scale", scale, dtypes=(torch.float32,), ndim=1)
    if scale.shape[0] != gate_up.shape[0]:
        raise ArgumentError("scale", f"shape ({gate_up.shape[0]},), one per row", tuple(scale.shape))
    check_same_device("scale", scale, gate_up.device)


def silu64(g: torch.Tensor) -> torch.Tensor:
    """silu of fp64 ``g`` in the overflow-free form of the module docstring (fp64 out)."""
    e = torch.exp(-g.abs())  # (0, 1], NaN for NaN
    num = torch.where(g < 0, g * e, g)
    return num / (1.0 + e)


def swiglu(gate_up: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * (up * scale)`` per element, in fp64 (signed infinity where silu
    underflows fp64 and ``up * scale`` is infinite: see the module docstring).

    Parameters
    ----------
    gate_up : Tensor [M, 2 I], bfloat16 or float16 (gate = columns :I, up = columns I:)
    scale : Tensor [M], float32, optional (the routing weight applied at the activation)

    Returns
    -------
    Tensor [M, I], float64, on gate_up's device.  Row-local (a row reads only itself and its
    scale), hence bitwise invariant along every batch axis.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError : see :func:`check_swiglu_args`.
    """
    check_swiglu_args(gate_up, scale)
    m, two_i = gate_up.shape
    i = two_i // 2
    x = gate_up.to(torch.float64)
    g, u = x[:, :i], x[:, i:]  # [M, I] each
    if scale is not None:
        u = u * scale.to(torch.float64)[:, None]  # [M, I]
    silu = silu64(g)
    out = silu * u
    # silu underflowed fp64 (g < ~-745, finite): the exact limit times an infinite u * s
    lost = (silu == 0) & (g != 0) & torch.isinf(u)
    out = torch.where(lost, u * torch.sign(g), out)
    assert out.shape == (m, i)
    return out


# --- tolerance ---------------------------------------------------------------------------------


def _parts(
    gate_up: torch.Tensor, scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(g, v = u s, silu64(g), |s| per row as a column (1 without a scale), has_scale), fp64."""
    x = gate_up.to(torch.float64)
    i = x.shape[1] // 2
    g, v = x[:, :i], x[:, i:]
    s_abs = torch.ones((x.shape[0], 1), dtype=torch.float64, device=x.device)
    if scale is not None:
        s64 = scale.to(x.device, torch.float64)[:, None]
        v = v * s64
        s_abs = s64.abs()
    return g, v, silu64(g), s_abs, scale is not None


def fp32_error(gate_up: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(relative, absolute) error of the fast kernel's fp32 value before the final rounding.

    The kernel (fast/kernels/swiglu.py) computes, in fp32 from exact fp32 inputs g, u, s:
    ``e = exp(-|g|)``, ``num = g * e`` (g < 0) or g, ``d = 1 + e``, ``silu = num / d``, then
    ``y = silu * (u * s)`` for |s| <= 1 or ``y = (silu * u) * s`` for |s| > 1 (``y = silu * u``
    without a scale); the output is ``fl_out(y)``.  Write v = u s (exact).  Neither product
    order overflows unless the exact |y| is past the output range (the reference is then
    infinite too); a NaN of ``0 * inf`` with no zero exact factor is replaced by the exact
    signed infinity, so infinities agree exactly and the errors below concern finite values.

    * e: tl.exp is ``ex2.approx(x * log2e)`` on GPUs: the product x * fl(log2 e) errs by at most
      2^-23 + 2^-48 relatively (two roundings), i.e. a factor exp(|g| (2^-23 + 2^-48)) on e,
      times (1 + 2^-21) for ex2 itself (2 ULP); numpy's exp in the interpreter is within 1 ULP.
      So e = E (1 + eta), |eta| <= eta(g) = (1 + 2^-21) exp(|g| (2^-23 + 2^-48)) - 1, plus an
      absolute min(2^-126, E) where e is flushed to zero (E < 2^-126, |g| > 87.3); past
      |g| = 104 (E < 2^-150) only that absolute error is counted (eta taken at |g| = 104).
    * num = g e (g < 0): (1 + eta)(1 + u) and |g| min(2^-126, E) absolute; g >= 0: exact.
    * d = 1 + e, e in [0, 1]: relative error <= (1 + eta e / (1 + e) + 2^-126)(1 + u) - 1
      (no cancellation: both terms are >= 0).
    * silu = num / d: (1 + 2^-22) (div.full.f32 is 2 ULP; the interpreter divides correctly),
      plus 2^-150 absolute if it underflows.
    * the two products (one without a scale), each (1 + u) plus 2^-150 absolute: for |s| <= 1,
      ``u s`` then ``silu (u s)``, whose absolute errors reach y times |silu| and 1; for |s| > 1,
      ``silu u`` then ``(silu u) s``, times |s| and 1.  silu's absolute error reaches y times
      |u s| = |v| in either order.

    Hence y = silu(g) v (1 + r) + a with
    ``1 + r <= (1 + eta)(1 + u)(1 + 2^-22)(1 + u)^(1 + has_scale) / (1 - (eta + 2^-126)(1 + u) - u)``
    and ``|a| <= 2 (|g| min(2^-126, E) |v| + 2^-150 (|v| + |silu| + |s| + 1))`` (s = 1 without a
    scale; the factor 2 covers the later relative factors, all below 2).  The fp64 reference
    errs by at most 8 fp64 ULPs (exp, a product, an add, a division, two products), added to r,
    plus an absolute 2^-1074 |g| |v| where its exp(-|g|) is subnormal (below 2^-790: nil here).

    Parameters
    ----------
    gate_up : Tensor [M, 2 I], bfloat16 or float16
    scale : Tensor [M], float32, optional

    Returns
    -------
    (r, a) : Tensors [M, I], float64, on gate_up's device: r relative, a absolute (finite or
    +inf; NaN inputs give 0).

    Source: the derivation above; PTX ISA accuracy of ``ex2.approx.f32`` and ``div.full.f32``.
    """
    g, v, silu, s_abs, has_scale = _parts(gate_up, scale)
    # Past |g| = 104, E = exp(-|g|) < 2^-150: e is 0 or flushed, an absolute error counted below.
    mag = torch.nan_to_num(g.abs(), nan=0.0).clamp(max=104.0)
    eta = (1.0 + EXP_ULP) * torch.exp(mag * (2.0**-23 + 2.0**-48)) - 1.0
    d_err = (eta + FTZ) * (1.0 + U32) + U32
    rel = (1.0 + eta) * (1.0 + U32) * (1.0 + DIV) * (1.0 + U32) ** (2 if has_scale else 1) / (
        1.0 - d_err
    ) - 1.0
    rel = rel + 8 * U64
    flushed = torch.minimum(torch.full_like(g, FTZ), torch.exp(-g.abs()) + 2.0**-1074)  # e's abs error
    absolute = 2.0 * (g.abs() * flushed * v.abs() + UNDER * (v.abs() + silu.abs() + s_abs + 1.0))
    return rel, torch.nan_to_num(absolute, nan=0.0, posinf=math.inf)


def tolerance_bound(
    gate_up: torch.Tensor, scale: torch.Tensor | None = None, *, reference: torch.Tensor | None = None
) -> torch.Tensor:
    """The rigorous bound on ``|fast - reference|`` per element: the fp32 error ``(r, a)`` of
    :func:`fp32_error`, then the final rounding to the output dtype, relative u_out plus half its
    smallest subnormal:
    ``|fast - ref| <= |ref| ((1 + r)(1 + u_out) - 1) + |a| (1 + u_out) + half_sub``.

    Parameters
    ----------
    gate_up : Tensor [M, 2 I], bfloat16 or float16 (its dtype is the output dtype)
    scale : Tensor [M], float32, optional
    reference : Tensor [M, I], float64, optional
        :func:`swiglu` of these operands (computed when not given).

    Returns
    -------
    Tensor [M, I], float64: NaN where the reference is NaN, infinite where it is infinite.

    Source: :func:`fp32_error`, then one round-to-nearest.
    """
    if reference is None:
        reference = swiglu(gate_up, scale)
    rel, absolute = fp32_error(gate_up, scale)
    u_out, half_sub, _, _ = OUT[gate_up.dtype]
    return reference.abs() * ((1.0 + rel) * (1.0 + u_out) - 1.0) + absolute * (1.0 + u_out) + half_sub


def tight_bound(
    gate_up: torch.Tensor, scale: torch.Tensor | None = None, *, reference: torch.Tensor | None = None
) -> torch.Tensor:
    """The judged bound: the final rounding is at most half an output ULP of the fp32 value y,
    so ``|fast - ref| <= |y - ref| + ulp_out(Y) / 2`` with ``|y - ref| <= |ref| r + |a|`` and
    ``Y = |ref| (1 + r) + |a| >= |y|`` (the ULP of Y's binade is at least y's; below the
    normal range the subnormal quantum), ``(r, a)`` from :func:`fp32_error`.  r is a few 2^-24
    for |g| < 100, so a 16-bit intermediate (silu rounded to bf16 before the product, as the
    unfused ``F.silu(g) * u`` does) lands a ULP away from the correctly rounded value on many
    elements: error ~ 1 ULP, over this bound's 1/2 ULP + r.

    Parameters
    ----------
    gate_up : Tensor [M, 2 I], bfloat16 or float16 (its dtype is the output dtype)
    scale : Tensor [M], float32, optional
    reference : Tensor [M, I], float64, optional
        :func:`swiglu` of these operands (computed when not given).

    Returns
    -------
    Tensor [M, I], float64, not above :func:`tolerance_bound` (half an ULP of Y is at most
    u_out Y, or half the smallest subnormal below the normal range).

    Source: :func:`fp32_error`, then half an ULP of the output dtype.
    """
    if reference is None:
        reference = swiglu(gate_up, scale)
    rel, absolute = fp32_error(gate_up, scale)
    _, _, p, emin = OUT[gate_up.dtype]
    err32 = reference.abs() * rel + absolute
    big = reference.abs() + err32
    exponent = torch.floor(torch.log2(torch.where(big > 0, big, torch.ones_like(big))))
    exponent = torch.clamp(torch.nan_to_num(exponent, nan=0.0, posinf=0.0), min=emin)
    half_ulp = power_of_two(exponent - p)  # exact; CUDA's pow/exp2 are not correctly rounded
    return err32 + half_ulp
