"""Triton kernels of ``moe_combine`` (only ``@triton.jit`` code).

:func:`moe_combine_kernel`: one program per (token, column tile).  Each slot's value is widened
exactly to fp64, multiplied by its fp32 weight widened to fp64, and added to an fp64
accumulator in slot order j = 0..k-1, starting from the first product; the sum is rounded once
to the output dtype (``round_from_f64``, through fp32 rounded to odd) and a NaN becomes the
canonical quiet NaN (``canonical_nan_block``; both in :mod:`batchinv.fast.kernels.primitives`).
The launcher passes ``enable_fp_fusion=False``: otherwise the backend may contract
``acc + w * y`` into one fused multiply-add (one rounding instead of two), which the fp64
reference, doing the product and the sum as separate IEEE operations, does not.

:func:`moe_combine_atomic_kernel`: the negative control's kernel, one program per (token, slot,
column tile) adding its fp32 product into an fp32 output with ``tl.atomic_add`` (the order of a
token's slots is the atomics' arrival order).
"""

from __future__ import annotations

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import canonical_nan_block, round_from_f64, widen_f32


@triton.jit
def moe_combine_kernel(
    y_ptr,
    w_ptr,
    out_ptr,
    top_k,
    hidden,
    stride_yt,
    stride_yk,
    stride_yh,
    stride_wt,
    stride_wk,
    stride_ot,
    HAS_WEIGHTS: tl.constexpr,
    REVERSE: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < hidden
    y_row = y_ptr + t * stride_yt + h.to(tl.int64) * stride_yh
    first = (top_k - 1) if REVERSE else 0  # REVERSE: a mutant's slot order, never shipped
    y = widen_f32(tl.load(y_row + first * stride_yk, mask=mask, other=0.0)).to(tl.float64)
    if HAS_WEIGHTS:
        w = tl.load(w_ptr + t * stride_wt + first * stride_wk).to(tl.float64)
        acc = w * y
    else:
        acc = y
    for i in range(1, top_k):
        j = (top_k - 1 - i) if REVERSE else i
        y = widen_f32(tl.load(y_row + j * stride_yk, mask=mask, other=0.0)).to(tl.float64)
        if HAS_WEIGHTS:
            w = tl.load(w_ptr + t * stride_wt + j * stride_wk).to(tl.float64)
            acc = acc + w * y
        else:
            acc = acc + y
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    out = round_from_f64(acc, dtype)
    out = tl.where(acc != acc, canonical_nan_block(dtype, BLOCK_H), out)
    tl.store(out_ptr + t * stride_ot + h, out, mask=mask)


@triton.jit
def moe_combine_atomic_kernel(
    y_ptr,
    w_ptr,
    acc_ptr,
    hidden,
    stride_yt,
    stride_yk,
    stride_yh,
    stride_wt,
    stride_wk,
    HAS_WEIGHTS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < hidden
    y = widen_f32(
        tl.load(y_ptr + t * stride_yt + j * stride_yk + h.to(tl.int64) * stride_yh, mask=mask, other=0.0)
    )
    if HAS_WEIGHTS:
        y = tl.load(w_ptr + t * stride_wt + j * stride_wk) * y
    tl.atomic_add(acc_ptr + t * hidden + h, y, mask=mask)
