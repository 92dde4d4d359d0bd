"""Batch-invariant ``moe_combine`` (docs/MOE.md section 5): the launcher of
``kernels/moe_combine.py``.

``out[t] = sum_j w[t, j] * y[t, j]`` in fp64 in slot order, one rounding (see the kernel and the
reference).  Each token's columns are computed by one program from that token's data alone, so
a row's bits cannot depend on the batch; the column tile (:data:`MOE_COMBINE_BLOCK_H`, keyed on
the arch only) does not enter the result either (columns never meet).  No FMA contraction: the
launch passes ``enable_fp_fusion=False`` (a Triton compile option accepted as a launch keyword in
Triton 3.6; the NVIDIA backend then emits separate ``mul.rn.f64`` and ``add.rn.f64`` and runs
ptxas with ``--fmad=false``).  The interpreter evaluates with NumPy, which never contracts.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, interpreting, kernel_operand
from batchinv.fast.kernels.moe_combine import moe_combine_kernel
from batchinv.reference.moe_combine import check_moe_combine_args

#: Columns per program, keyed on the arch only (never on T).
MOE_COMBINE_BLOCK_H: Final = MappingProxyType({"interp": 128, "sm90": 1024, "sm100": 1024})
DEFAULT_BLOCK_H: Final = 1024


def launch(
    expert_out: torch.Tensor, topk_weights: torch.Tensor | None, reverse: bool = False
) -> torch.Tensor:
    """Launch on validated arguments (``reverse``: the mutant's slot order, tests only)."""
    num_tokens, top_k, hidden = expert_out.shape
    y = kernel_operand(expert_out)
    w = None if topk_weights is None else kernel_operand(topk_weights)
    out = torch.empty((num_tokens, hidden), dtype=y.dtype, device=y.device)
    if num_tokens == 0 or hidden == 0:
        return out
    block_h = MOE_COMBINE_BLOCK_H.get(arch(y.device), DEFAULT_BLOCK_H)
    grid = (num_tokens, triton.cdiv(hidden, block_h))
    options = {} if interpreting() else {"enable_fp_fusion": False}
    with interpreter_quiet():
        moe_combine_kernel[grid](
            y,
            y if w is None else w,
            out,
            top_k,
            hidden,
            y.stride(0),
            y.stride(1),
            y.stride(2),
            0 if w is None else w.stride(0),
            0 if w is None else w.stride(1),
            out.stride(0),
            HAS_WEIGHTS=w is not None,
            REVERSE=reverse,
            BLOCK_H=block_h,
            num_warps=4,
            **options,
        )
    return out


def moe_combine(expert_out: torch.Tensor, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted sum of each token's k expert outputs (Triton, fp64, slot order, one rounding).

    Parameters
    ----------
    expert_out : Tensor [T, k, H], bfloat16, float16 or float32, any strides.
    topk_weights : Tensor [T, k] float32, or None when the weights were already applied.

    Returns
    -------
    Tensor [T, H] of expert_out's dtype, bitwise equal to
    :func:`batchinv.reference.moe_combine.moe_combine` (NaN results are the canonical quiet NaN).

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        As the reference; also a tensor that is not CUDA (CPU under ``TRITON_INTERPRET=1``).
    """
    check_moe_combine_args(expert_out, topk_weights)
    check_launch_device("expert_out", expert_out)
    if topk_weights is not None:
        check_launch_device("topk_weights", topk_weights)
    return launch(expert_out, topk_weights)
