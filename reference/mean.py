"""Reference mean over the last dim: the exact mean, rounded once to fp64.

Dimension legend:
    R: rows, the batch axis (dim 0 of a 2-D input)
    B: batch (dim 0 of a 3-D input), S: sequence (dim 1 of a 3-D input)
    N: the reduced last dim (the row length)

``torch.mean(x, dim, keepdim, dtype=dtype)`` casts ``x`` to ``dtype`` first, then reduces; the
reference does the same cast, sums the cast values *exactly* (integer arithmetic, see
:func:`batchinv.reference.exact.exact_row_sums`) and divides by N with one correct rounding to
float64.  Rounded once more to ``dtype`` (:func:`batchinv.reference.exact.round_once`) that is
the fast kernel's promise wherever its fp64 lanes are exact (see the registry entry).
Only the last dim of a 2-D or 3-D input is supported: that is the case whose output rows are
independent of each other (reducing dim 0 would mix the rows).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_last_dim, check_tensor
from batchinv.reference.exact import FP32_QUANTUM_EXPONENT, exact_row_sums
from batchinv.reference.matmul import unit_roundoff
from batchinv.reference.softmax import FTZ_FLOOR, half_min_subnormal

#: Input dtypes, and the ``dtype=`` values, the component accepts (fast and reference alike).
MEAN_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)


def check_mean_args(x: Any, dim: Any, keepdim: Any, dtype: Any) -> torch.dtype:
    """Validate the arguments shared by fast and reference; return the output dtype.

    Raises:
        DTypeError: ``x`` is not a float32/bfloat16/float16 tensor, or ``dtype`` is not None or
            one of those.
        ArgumentError: ``x`` is not 2-D or 3-D; ``dim`` is not an int, out of range or not the
            last dim; ``keepdim`` is not a bool.
    """
    check_tensor("x", x, dtypes=MEAN_DTYPES)
    check_last_dim(x, dim, "N")
    if not isinstance(keepdim, bool):
        raise ArgumentError("keepdim", "a bool", type(keepdim).__name__)
    if dtype is not None and dtype not in MEAN_DTYPES:
        names = " or ".join(str(d).removeprefix("torch.") for d in MEAN_DTYPES)
        raise DTypeError("dtype", f"None or {names}", str(dtype).removeprefix("torch."))
    return x.dtype if dtype is None else dtype


def mean(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Reference mean over the last dim, in float64.

    ``y[r] = (1 / N) * sum_n x[r, n].to(dtype)``

    Parameters
    ----------
    x : Tensor, (R, N) or (B, S, N), float32, bfloat16 or float16
    dim : int
        Must name the last dim (-1 or ``x.dim() - 1``).
    keepdim : bool
        Keep the reduced dim with size 1.
    dtype : torch.dtype or None
        As in ``torch.mean``: ``x`` is cast to it before the reduction.

    Returns
    -------
    Tensor, (R,) / (B, S) (or with a trailing 1 when ``keepdim``), float64: the exact mean
    ``sum_n x[r, n].to(dtype) / N`` correctly rounded to float64 (one rounding).

    Notes
    -----
    Each row depends on that row alone.  NaN in a row gives NaN; +inf and -inf together give
    NaN; one sign of inf gives that inf.  N = 0 gives NaN (0 / 0).  An exactly zero sum gives
    +0 (a row of -0 included).

    Raises
    ------
    DTypeError, ArgumentError: see :func:`check_mean_args`.

    Source: the definition, with ``torch.mean``'s cast-then-reduce meaning of ``dtype``.
    """
    out_dtype = check_mean_args(x, dim, keepdim, dtype)
    n = x.shape[-1]
    elements = x.to(out_dtype).reshape(math.prod(x.shape[:-1]), n)  # (R, N): cast as torch.mean does
    rows = elements.shape[0]
    is_nan = torch.isnan(elements).any(dim=-1)  # (R,)
    pos_inf = torch.isposinf(elements).any(dim=-1)  # (R,)
    neg_inf = torch.isneginf(elements).any(dim=-1)  # (R,)
    finite = torch.where(torch.isfinite(elements), elements, torch.zeros_like(elements))
    # The exact sums, I * 2**-149 (fp32/bf16/fp16 values are multiples of 2**-149), and the
    # mean I / (N * 2**149) rounded once to fp64 (Python's int / int is correctly rounded).
    totals = exact_row_sums(finite) if n > 0 else [0] * rows
    denominator = n << -FP32_QUANTUM_EXPONENT
    means = [total / denominator if n > 0 else math.nan for total in totals]
    y = torch.tensor(means, dtype=torch.float64).to(x.device)  # (R,)
    y = torch.where(pos_inf, math.inf, y)
    y = torch.where(neg_inf, -math.inf, y)
    y = torch.where(is_nan | (pos_inf & neg_inf), math.nan, y)
    y = y.reshape(*x.shape[:-1], 1)  # (..., 1)
    return y if keepdim else y.squeeze(-1)


#: fp64's unit roundoff.
U64 = 2.0**-53


def gamma(k: int) -> float:
    """Higham's gamma_k = k u / (1 - k u) for fp64: the relative bound of k roundings in sequence."""
    return k * U64 / (1.0 - k * U64)


def mean_bound(
    x: torch.Tensor,
    reference: torch.Tensor,
    *,
    keepdim: bool,
    dtype: torch.dtype | None,
    chunks: int,
    combine_loss: float,
) -> torch.Tensor:
    """Per-row bound on |fast - fp64 reference| of a mean summed in fp64 lanes, combined on a
    fixed-point grid and divided in fp64, then rounded once to the output dtype.

    With e_n the elements rounded to the output dtype (exact in fp64; :func:`mean` casts the
    same way, bit for bit), A = mean|e|, y = mean(e) exact and c = ``chunks`` (the pinned
    order's additions in sequence per lane: ``ceil(N / block_n)``):

    * lanes: each adds its <= c elements in sequence in fp64 from +0: in all, at most gamma_c * N A;
    * combine: truncation under ``combine_loss`` (2**-29) of the largest lane <= (1 + gamma_c) N A;
    * the int64 -> fp64 total and the fp64 division: two roundings, under 3u64 (|y| + err);
    * so the fp64 quotient q has |q - y| <= d := (gamma_c + 2**-29 (1 + gamma_c)) A (1 + 3u64)
      + 3u64 |y|;
    * one rounding of q to the output dtype (bf16/fp16 via fp32 rounded to odd: a single
      rounding): u_out |q| <= u_out (|y| + d), or half the smallest subnormal below the normal
      range;
    * the reference is the exact mean rounded once to fp64: u64 |y|;
    * a GPU may flush subnormal elements (the mean moves under 2**-126) and a subnormal fp32
      result (under 2**-126): 2 * FTZ_FLOOR.

    Like every summation bound it scales with mean|e|, not |y|: on a row that cancels the
    relative error may be large while the absolute error stays inside.

    Parameters
    ----------
    x : Tensor, (R, N) or (B, S, N), float32, bfloat16 or float16
        The input of :func:`mean`.
    reference : Tensor, float64
        :func:`mean` of ``x`` with these ``keepdim`` and ``dtype``: (R,) / (B, S), or with a
        trailing 1 when ``keepdim``.
    keepdim : bool
        As given to :func:`mean`.
    dtype : torch.dtype or None
        As given to :func:`mean` (None: ``x``'s dtype); the output dtype.
    chunks : int
        c above, from the kernel's config (``batchinv.fast.mean.reduction_depth``).
    combine_loss : float
        The combine's truncation relative to the largest lane (``batchinv.fast.mean.COMBINE_LOSS``).

    Returns
    -------
    Tensor, the shape of ``reference``, float64, on its device (finite on non-finite rows:
    their class is compared, not a distance).

    Source: the derivation above (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
    ed., section 4.2, recursive summation).
    """
    out_dtype = x.dtype if dtype is None else dtype
    elements = x.to(out_dtype).to(reference.device, torch.float64)  # the values the reference sums
    mean_abs = elements.abs().mean(dim=-1, keepdim=True)
    if not keepdim:
        mean_abs = mean_abs.squeeze(-1)
    mean_abs = torch.where(torch.isfinite(mean_abs), mean_abs, torch.zeros_like(mean_abs))
    y = torch.where(torch.isfinite(reference), reference.abs(), torch.zeros_like(reference))
    g = gamma(chunks)
    fast_q = (g + combine_loss * (1.0 + g)) * mean_abs * (1.0 + 3 * U64) + 3 * U64 * y
    u_out = unit_roundoff(out_dtype)
    fast_err = fast_q * (1.0 + u_out) + u_out * y + half_min_subnormal(out_dtype)
    ref_err = U64 * y
    return fast_err + ref_err + 2 * FTZ_FLOOR
