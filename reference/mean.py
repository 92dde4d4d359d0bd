"""Reference mean over the last dim: fp64, written the obvious way.

Dimension legend:
    R: rows, the batch axis (dim 0 of a 2-D input)
    B: batch (dim 0 of a 3-D input), S: sequence (dim 1 of a 3-D input)
    N: the reduced last dim (the row length)

``torch.mean(x, dim, keepdim, dtype=dtype)`` casts ``x`` to ``dtype`` first, then reduces; the
reference does the same cast, then sums the exact values in float64 and divides by N.
Only the last dim of a 2-D or 3-D input is supported: that is the case whose output rows are
independent of each other (reducing dim 0 would mix the rows).
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_last_dim, check_tensor

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
    Tensor, (R,) / (B, S) (or with a trailing 1 when ``keepdim``), float64.

    Notes
    -----
    Each row depends on that row alone.  NaN in a row gives NaN; +inf and -inf together give
    NaN; one sign of inf gives that inf.  N = 0 gives NaN (0 / 0).

    Raises
    ------
    DTypeError, ArgumentError: see :func:`check_mean_args`.

    Source: the definition, with ``torch.mean``'s cast-then-reduce meaning of ``dtype``.
    """
    out_dtype = check_mean_args(x, dim, keepdim, dtype)
    n = x.shape[-1]
    x64 = x.to(out_dtype).to(torch.float64)  # (..., N): rounded to dtype as torch.mean does, then exact
    total = x64.sum(dim=-1, keepdim=True)  # (..., 1)
    y = total / n  # (..., 1); N = 0 gives 0 / 0 = NaN
    assert y.shape == (*x.shape[:-1], 1)
    return y if keepdim else y.squeeze(-1)
