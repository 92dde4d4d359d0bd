"""Reference softmax and log_softmax over the last dim: fp64, written the obvious way.

Dimension legend:
    R: rows, the batch axis (dim 0); a 3-D input has rows B and a second leading axis S
    B: batch (dim 0 of a 3-D input)
    S: sequence (dim 1 of a 3-D input)
    V: vocabulary, the reduced last dim (the row length)

The math is ``exp(x - max) / sum(exp(x - max))`` (and ``x - max - log(sum(exp(x - max)))``)
computed entirely in float64 from the input's exact values.  Non-finite rows fall out of that
formula the way they do in aten: a NaN or a +inf anywhere in a row, or a row of all -inf,
makes the whole row NaN; a -inf entry of an otherwise finite row gives 0 (log: -inf).
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, check_last_dim, check_tensor
from batchinv.reference.matmul import unit_roundoff

#: Input dtypes the component accepts (fast and reference alike).
SOFTMAX_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
HALF_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)


def check_softmax_args(x: Any, dim: Any, half_to_float: Any) -> torch.dtype:
    """Validate the arguments shared by fast and reference; return the output dtype.

    Raises:
        DTypeError: ``x`` is not a float32/bfloat16/float16 tensor.
        ArgumentError: ``x`` is not 2-D or 3-D; ``dim`` is not an int, out of range, or not the
            last dim; ``half_to_float`` is not a bool, or True for a float32 input.
    """
    check_tensor("x", x, dtypes=SOFTMAX_DTYPES)
    check_last_dim(x, dim, "V")
    if not isinstance(half_to_float, bool):
        raise ArgumentError("half_to_float", "a bool", type(half_to_float).__name__)
    if half_to_float and x.dtype not in HALF_DTYPES:
        raise ArgumentError("half_to_float", "False for a float32 input (True maps bf16/fp16 to fp32)", True)
    return torch.float32 if half_to_float else x.dtype


def _shift_and_sum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x - max`` and ``sum(exp(x - max))`` of the last dim, in float64.  x: (..., V)."""
    x64 = x.to(torch.float64)  # (..., V), exact: every fp32/bf16/fp16 value is an fp64 value
    if x.shape[-1] == 0:  # empty rows: nothing to normalize (amax has no identity)
        return x64, torch.ones(*x.shape[:-1], 1, dtype=torch.float64, device=x.device)
    row_max = x64.amax(dim=-1, keepdim=True)  # (..., 1); NaN if the row has a NaN
    shifted = x64 - row_max  # (..., V)
    total = shifted.exp().sum(dim=-1, keepdim=True)  # (..., 1)
    assert row_max.shape == total.shape == (*x.shape[:-1], 1)
    return shifted, total


def softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """Reference softmax over the last dim, in float64.

    ``y[..., v] = exp(x[..., v] - max_v' x[..., v']) / sum_v'' exp(x[..., v''] - max_v' x[..., v'])``

    Parameters
    ----------
    x : Tensor, (R, V) or (B, S, V), float32, bfloat16 or float16
    dim : int
        Must name the last dim (-1 or ``x.dim() - 1``).
    half_to_float : bool
        Accepted as in ``aten::_softmax`` (bf16/fp16 only); the reference output is float64 anyway.

    Returns
    -------
    Tensor, same shape as ``x``, float64.

    Notes
    -----
    Each row depends on that row alone (it is computed in fp64 from exact inputs).  NaN or +inf
    in a row, or a row of all -inf: the whole row is NaN.  -inf entries give +0.  Signed zeros
    and subnormals in the input are ordinary values (exp(+-0) = 1).

    Raises
    ------
    DTypeError, ArgumentError: see :func:`check_softmax_args`.

    Source: the textbook definition; non-finite behaviour matches ``torch.softmax``.
    """
    check_softmax_args(x, dim, half_to_float)
    shifted, total = _shift_and_sum(x)
    y = shifted.exp() / total  # (..., V)
    assert y.shape == x.shape and y.dtype == torch.float64
    return y


def log_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """Reference log_softmax over the last dim, in float64.

    ``y[..., v] = (x[..., v] - max) - log(sum_v' exp(x[..., v'] - max))``

    Parameters
    ----------
    x : Tensor, (R, V) or (B, S, V), float32, bfloat16 or float16
    dim : int
        Must name the last dim (-1 or ``x.dim() - 1``).
    half_to_float : bool
        Accepted as in ``aten::_log_softmax`` (bf16/fp16 only); the output is float64 anyway.

    Returns
    -------
    Tensor, same shape as ``x``, float64.

    Notes
    -----
    NaN or +inf in a row, or a row of all -inf: the whole row is NaN.  -inf entries of an
    otherwise finite row give -inf.

    Raises
    ------
    DTypeError, ArgumentError: see :func:`check_softmax_args`.

    Source: the textbook definition; non-finite behaviour matches ``torch.log_softmax``.
    """
    check_softmax_args(x, dim, half_to_float)
    shifted, total = _shift_and_sum(x)
    y = shifted - total.log()  # (..., V)
    assert y.shape == x.shape and y.dtype == torch.float64
    return y


# --- tolerance ---------------------------------------------------------------------------------
# The error model of a fp32 kernel (``batchinv.fast.kernels.softmax``) against this fp64
# reference, in units of fp32's unit roundoff u = 2**-24.  The output rounding (fp32 to a
# bf16/fp16 output, round to nearest on every lane) costs ``unit_roundoff(out_dtype)``.

#: fp32's unit roundoff.
U32 = 2.0**-24
#: exp: ``ex2.approx.f32`` is within 2 ulp (4 u) on NVIDIA GPUs; NumPy's expf is tighter.
K_EXP = 4.0
#: log: ``lg2.approx.f32`` times ln 2, within 2 ulp relative (4 u) of log S.
K_LOG = 4.0
#: division: ``div.full.f32`` (Triton's fp32 ``/``) is within 2 ulp (4 u).
K_DIV = 4.0
#: A GPU may flush subnormal fp32 intermediates to zero: an absolute error below 2**-126.
FTZ_FLOOR = 2.0**-126


def half_min_subnormal(dtype: torch.dtype) -> float:
    """Half the smallest positive subnormal of floating ``dtype`` (2**-150 for float32, 2**-134
    for bfloat16, 2**-25 for float16): the absolute error of one rounding below the normal range."""
    fin = torch.finfo(dtype)
    return 0.5 * (fin.smallest_normal * fin.eps)


def _row_terms(
    x: torch.Tensor, ref: torch.Tensor, log: bool, chunks: int, combine: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(|x - max| with non-finite entries zeroed, the fp64 probabilities, sum error delta_S)."""
    x64 = x.to(ref.device, torch.float64)
    row_max = x64.amax(dim=-1, keepdim=True)
    dist = (x64 - row_max).abs()
    dist = torch.where(torch.isfinite(dist), dist, torch.zeros_like(dist))
    prob = ref.exp() if log else ref
    prob = torch.where(torch.isfinite(prob), prob, torch.zeros_like(prob))
    # S's relative error: each term's exp arguments add up to |x_j - max| (rounded twice: the
    # subtraction and the log2(e) scaling inside exp), it passes through at most chunks + 1
    # exps and fused multiplies (its own, the lane rescales, the final lane scale), and at most
    # chunks additions of positive terms in its lane, then the fixed-point combine (2 roundings).
    delta_s = (
        2.0 * U32 * (prob * dist).sum(dim=-1, keepdim=True)
        + (chunks + 1) * (K_EXP + 1.0) * U32
        + (chunks + combine) * U32
    )
    return dist, prob, delta_s


def softmax_bound(
    x: torch.Tensor, reference: torch.Tensor, *, out_dtype: torch.dtype, chunks: int, combine: int
) -> torch.Tensor:
    """Per-element bound on |fast - fp64 reference| for a fp32 softmax with a pinned reduction.

    The kernel's model: per row, ``m = max x``; each term ``exp(x_j - m)`` (the subtraction and
    the ``log2 e`` scaling inside ``exp`` round: ``2u |x_j - m|`` relative, plus ``K_EXP u`` for
    ``ex2.approx``); the row sum ``S`` in lanes of ``chunks`` terms each (online rescaling: a
    term passes at most ``chunks + 1`` exps and fused multiplies, ``(chunks + 1)(K_EXP + 1) u``,
    and ``chunks`` additions of positive terms), then a fixed-point combine of ``combine``
    roundings, so ``S`` is within ``delta_S = 2u sum_j p_j |x_j - m| + (chunks + 1)(K_EXP + 1) u
    + (chunks + combine) u`` relative (p = the fp64 probabilities); the division ``K_DIV u``;
    the rounding to the output dtype ``u_out``.

    ``relative = 2u |x - m| + (K_EXP + K_DIV) u + delta_S + u_out``, compounded as
    ``p expm1(relative)``; plus an absolute floor: :data:`FTZ_FLOOR` (flushed subnormal
    intermediates) and half the output dtype's smallest subnormal.  Where the reference is 0
    (an underflowing output, a -inf entry) or NaN only the floor applies.

    Parameters
    ----------
    x : Tensor (..., V), float32, bfloat16 or float16
        The input.
    reference : Tensor (..., V), float64
        :func:`softmax` of ``x``.
    out_dtype : torch.dtype
        The kernel's output dtype (float32 under ``half_to_float``, else ``x``'s).
    chunks, combine : int
        The pinned reduction's depth: terms per lane in sequence and the combine's roundings
        (``batchinv.fast.softmax.reduction_depth`` of the config the kernel runs).

    Returns
    -------
    Tensor (..., V), float64, on ``reference``'s device.

    Source: the derivation above (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
    ed., section 3.1, for the sums), PTX ISA accuracy of ``ex2.approx.f32``/``div.full.f32``.
    """
    dist, prob, delta_s = _row_terms(x, reference, False, chunks, combine)
    rel = 2.0 * U32 * dist + (K_EXP + K_DIV) * U32 + delta_s + unit_roundoff(out_dtype)
    # prob = 0 where the output underflows (or the row is NaN): only the floor applies there
    scaled = torch.where(prob > 0, prob * torch.expm1(rel), torch.zeros_like(prob))
    return scaled + FTZ_FLOOR + half_min_subnormal(out_dtype)


def log_softmax_bound(
    x: torch.Tensor, reference: torch.Tensor, *, out_dtype: torch.dtype, chunks: int, combine: int
) -> torch.Tensor:
    """Per-element bound on |fast - fp64 reference| for a fp32 log_softmax (absolute).

    The kernel's model: ``y = (x - m) - log S`` with ``S`` formed as in :func:`softmax_bound`
    (relative error ``delta_S``, hence ``delta_S`` absolute on ``log S``).  Terms: ``u |x - m|``
    (the subtraction), ``delta_S``, ``K_LOG u max(1, log S)`` (``lg2.approx`` times ln 2),
    ``u |y|`` (the last subtraction) and ``u_out |y|`` (rounding to the output dtype), all
    times ``(1 + u_out)``, plus :data:`FTZ_FLOOR`.  ``log S`` is read off the reference: the
    row maximum's output is exactly ``-log S``.  NaN rows give a finite bound (the comparator
    checks their class only); -inf entries a bound on their finite terms.

    Parameters
    ----------
    x : Tensor (..., V), float32, bfloat16 or float16
        The input.
    reference : Tensor (..., V), float64
        :func:`log_softmax` of ``x``.
    out_dtype : torch.dtype
        The kernel's output dtype (float32 under ``half_to_float``, else ``x``'s).
    chunks, combine : int
        The pinned reduction's depth, as in :func:`softmax_bound`.

    Returns
    -------
    Tensor (..., V), float64, on ``reference``'s device.

    Source: the derivation above, as :func:`softmax_bound`; ``lg2.approx.f32``'s PTX accuracy.
    """
    dist, _, delta_s = _row_terms(x, reference, True, chunks, combine)
    y = torch.where(torch.isfinite(reference), reference.abs(), torch.zeros_like(reference))
    log_s = -reference.amax(dim=-1, keepdim=True)  # the maximum's output is exactly -log S
    log_s = torch.where(torch.isfinite(log_s), log_s, torch.zeros_like(log_s))  # NaN rows: class check only
    u_out = unit_roundoff(out_dtype)
    return (U32 * dist + delta_s + K_LOG * U32 * torch.clamp(log_s, min=1.0) + (U32 + u_out) * y) * (
        1.0 + u_out
    ) + FTZ_FLOOR
