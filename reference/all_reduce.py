"""Reference of ``all_reduce``: the pinned sum of a tensor-parallel all-reduce's partials.

Dimension legend:
    M: rows of the message (tokens), R: leaves of the reduction tree (the partials: one per
    rank at the widest tensor-parallel degree, each the fp32 partial of a fixed split of K),
    N: columns (hidden)

``out[m, n] = fl32(((p[m, 0, n] + p[m, 1, n]) + p[m, 2, n]) + ... + p[m, R-1, n])``: every sum
an IEEE fp64 operation (each fp32 partial widens exactly), in leaf order r = 0..R-1 starting
from the first leaf, then one rounding to fp32 (:func:`batchinv.reference.exact.round_once`).
Where the fp64 leaf-order sum is exact (the leaves of an element span fewer than 29 binades
above the lowest set bit, which holds for every realistic partial) the output is the exact sum
rounded once; elsewhere it is still this one fixed sequence.  A NaN result is the canonical quiet
NaN (as ``moe_combine``).  At a tensor-parallel degree T (dividing R) rank t holds the leaves
``[t R / T, (t + 1) R / T)``: the tree does not depend on T, so TP 1, 2, 4 give the same bits.
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, check_int, check_tensor
from batchinv.reference.exact import round_once
from batchinv.reference.moe_combine import canonical_nan

#: Partial and output dtypes.
DTYPES: tuple[torch.dtype, ...] = (torch.float32,)


def check_tp_degree(tp_degree: Any, leaves: int) -> int:
    """``tp_degree`` validated against the tree's ``leaves`` (None: one leaf per rank, R).

    Raises:
        DTypeError: not an int.
        ArgumentError: below 1, or not a divisor of the number of leaves.
    """
    if tp_degree is None:
        return leaves
    degree = check_int("tp_degree", tp_degree, 1)
    if leaves % degree:
        raise ArgumentError("tp_degree", f"a divisor of the leaves R = {leaves}", degree)
    return degree


def check_all_reduce_args(partials: Any, tp_degree: Any = None) -> tuple[int, int, int, int]:
    """Validate; returns ``(M, R, N, T)``.

    Raises:
        DTypeError: ``partials`` not a float32 tensor; ``tp_degree`` not an int.
        ArgumentError: ``partials`` not 3-D [M, R, N] or R = 0; ``tp_degree`` not dividing R.
        DeviceError: a meta tensor.
    """
    check_tensor("partials", partials, dtypes=DTYPES, ndim=3)
    rows, leaves, cols = partials.shape
    if leaves < 1:
        raise ArgumentError("partials", "[M, R, N] with R >= 1", tuple(partials.shape))
    return rows, leaves, cols, check_tp_degree(tp_degree, leaves)


def all_reduce(partials: torch.Tensor, tp_degree: int | None = None) -> torch.Tensor:
    """``[M, N]`` float32 on partials' device: the fp64 leaf-order sum, rounded once.

    Parameters
    ----------
    partials : Tensor [M, R, N] float32, any strides (a rank-major stack ``[R, M, N]`` viewed
        as ``transpose(0, 1)`` is the layout the ranks' messages have).
    tp_degree : int or None
        The tensor-parallel degree T the partials are spread over (a divisor of R); it does not
        enter the result.

    Returns
    -------
    Tensor [M, N] float32 (see the module docstring).
    """
    check_all_reduce_args(partials, tp_degree)
    p = partials.detach().resolve_neg().cpu().to(torch.float64)  # exact
    acc = p[:, 0]
    for r in range(1, p.shape[1]):
        acc = torch.add(acc, p[:, r])
    out = round_once(acc, torch.float32)
    out = torch.where(torch.isnan(acc), canonical_nan(torch.float32), out)
    return out.to(partials.device)
