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
