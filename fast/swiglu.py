"""Batch-invariant SwiGLU of the MoE expert (docs/MOE.md section 4): launcher only.

Validate (typed errors), allocate, pick the column block from I alone (never from M: the
kernel is elementwise, so no choice changes a bit, but the rule is kept), size the grid
(one program per (row block, column block)), launch :func:`batchinv.fast.kernels.swiglu.swiglu_kernel`.
"""

from __future__ import annotations

import torch

from batchinv.fast.device import (
    check_launch_device,
    check_no_grad,
    interpreter_quiet,
    interpreting,
    kernel_operand,
)
from batchinv.reference.swiglu import check_swiglu_args

#: Largest column block (elements of one row per program).
MAX_BLOCK = 1024


def blocks_for(i: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for intermediate size ``i``: BLOCK_N the next power of two, at most
    1024; BLOCK_M 1 on a GPU, 16 under the interpreter (fewer, vectorized programs).  Never
    keyed on M (elementwise: no block changes a bit, but the rule holds for every launcher)."""
    block_n = min(MAX_BLOCK, 1 << max(0, (i - 1).bit_length()))
    return (16 if interpreting() else 1), block_n


def swiglu(
    gate_up: torch.Tensor, scale: torch.Tensor | None = None, *, silu_bf16: bool = False
) -> torch.Tensor:
    """``out = silu(gate) * up * scale`` per element: one fp32 sequence, one final rounding.

    With ``g`` the gate, ``u`` the up value and ``s`` the row's scale (1 if None), in fp32:
    ``e = exp(-|g|)``, ``num = g * e if g < 0 else g``, ``silu = num / (1 + e)``, then
    ``out = silu * u`` without a scale, ``silu * (u * s)`` for |s| <= 1 and ``(silu * u) * s``
    for |s| > 1 (a routed scaling factor such as DeepSeek-V3's 2.5 multiplies last), rounded
    once to gate_up's dtype (nearest-even).  The order keeps every intermediate finite unless
    the output overflows: for |s| <= 1, |u s| <= |u| (an input, finite in fp32); for |s| > 1,
    an overflowing ``silu * u`` makes the exact product larger still, past the output range.
    Where the sequence gives ``0 * inf`` although no exact factor is zero or NaN (silu flushed
    to +-0 below g = -87, or a product underflowed, times an infinite u or s; silu(+inf) times
    an underflowed ``u * s``), the output is the exact limit: the infinity of sign
    sign(g) sign(u) sign(s).

    Parameters
    ----------
    gate_up : Tensor [M, 2 I], bfloat16 or float16, any strides (gate = columns :I, up = I:)
    scale : Tensor [M], float32, optional: the routing weight applied at the activation
    silu_bf16 : bool
        Round silu(g) to bf16 before the product (the unfused ``F.silu(gate) * up`` precision);
        for baselines only, never set by production callers.

    Returns
    -------
    Tensor [M, I] of gate_up's dtype.  Bitwise invariant along M, row position and neighbours,
    row_start, and repeated calls: each element is one fixed fp32 sequence of its own inputs.
    NaN propagates; silu(+inf) = +inf, silu(-inf) = NaN (-inf * 0), -0 stays -0, and an
    exact zero factor times an infinite one is NaN (silu(0) * inf, as IEEE and the reference).
    Departure from the exact value (bounded by ``harness/components/swiglu.py``): fp32
    underflow of exp(-|g|) for g < -87 (silu flushes towards +-0 times a finite ``u * s``).

    Raises
    ------
    DTypeError, ArgumentError, DeviceError : see :func:`batchinv.reference.swiglu.check_swiglu_args`;
    DeviceError for CPU tensors without the Triton interpreter.
    """
    check_swiglu_args(gate_up, scale)
    check_launch_device("gate_up", gate_up)
    if scale is not None:
        check_no_grad("scale", scale)
    m, two_i = gate_up.shape
    i = two_i // 2
    out = torch.empty((m, i), dtype=gate_up.dtype, device=gate_up.device)
    if m == 0:
        return out
    gate_up = kernel_operand(gate_up)
    scale = kernel_operand(scale) if scale is not None else None
    block_m, block_n = blocks_for(i)
    from batchinv.fast.kernels.swiglu import swiglu_kernel

    with interpreter_quiet():
        swiglu_kernel[(-(m // -block_m), -(i // -block_n))](
            gate_up,
            scale if scale is not None else out,  # never read without HAS_SCALE
            out,
            m,
            i,
            gate_up.stride(0),
            gate_up.stride(1),
            out.stride(0),
            out.stride(1),
            scale.stride(0) if scale is not None else 0,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            HAS_SCALE=scale is not None,
            SILU_BF16=silu_bf16,
            INTERPRETED=interpreting(),
        )
    return out
