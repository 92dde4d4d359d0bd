"""Triton kernel of the MoE SwiGLU activation (only ``@triton.jit`` code).

One program computes ``BLOCK_N`` columns of ``BLOCK_M`` rows (N = I, the intermediate size):
``out = silu(g) * u * s`` in fp32 with one rounding at the store, ``silu(g) = num / (1 + e)``,
``e = exp(-|g|)``, ``num = g * e`` for g < 0 and ``g`` otherwise (e in (0, 1]: the exponential
never overflows).  The product's order depends on the row's scale alone: ``silu * (u * s)`` for
|s| <= 1 (|u * s| <= |u|, never overflows), ``(silu * u) * s`` otherwise (the scale last: a
routed scaling factor such as 2.5 times a u near fp32's maximum would overflow first), so no
intermediate overflows unless the output does.  Where that sequence gives ``0 * inf`` but no
exact factor is zero (silu(g) flushed to 0 below g = -87 or a product underflowed, times an
infinite u or s, or silu(+inf) times an underflowed ``u * s``), the output is the signed
infinity, the exact limit.  Every element is computed by the same instruction sequence
whatever its row, column block or the grid, so the bits depend only on the element's own
inputs.  The launcher is :mod:`batchinv.fast.swiglu`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import NEG_INF, POS_INF, exact_fp32, fp32_to_bf16_rne


@triton.jit(do_not_specialize=["M"])
def swiglu_kernel(
    x_ptr,
    scale_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_om,
    stride_on,
    stride_s,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    SILU_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """``out[m, j] = silu(x[m, j]) * x[m, N + j] * scale[m]`` (scale 1 without ``HAS_SCALE``).

    ``SILU_BF16`` rounds silu(g) to bf16 before the product: never set by the shipped launcher
    (only by the per-M baseline).  ``INTERPRETED`` (the cpu lane) converts bf16 exactly and
    rounds bf16 output to nearest-even with integer ops (the interpreter's casts truncate).
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    # Rows past M read row 0 (never stored), so no load is masked on rows.
    row_off = tl.where(rows < M, rows, 0).to(tl.int64)
    base = x_ptr + row_off[:, None] * stride_xm
    g = tl.load(base + cols[None, :].to(tl.int64) * stride_xn, mask=mask, other=0.0)
    u = tl.load(base + (cols + N)[None, :].to(tl.int64) * stride_xn, mask=mask, other=0.0)
    if INTERPRETED:
        g = exact_fp32(g)
        u = exact_fp32(u)
    else:
        g = g.to(tl.float32)
        u = u.to(tl.float32)
    e = tl.exp(-tl.abs(g))
    num = tl.where(g < 0, g * e, g)
    silu = num / (1.0 + e)
    if SILU_BF16:
        if INTERPRETED:
            silu = exact_fp32(fp32_to_bf16_rne(silu))
        else:
            silu = silu.to(tl.bfloat16).to(tl.float32)
    # sign of the exact product; lost: no exact factor is NaN, zero or silu(-inf) = NaN
    neg = (g < 0) != (u < 0)
    lost = (g == g) & (g != 0) & (g != NEG_INF) & (u == u) & (u != 0)
    if HAS_SCALE:
        s = tl.load(scale_ptr + row_off * stride_s)[:, None]
        small = tl.abs(s) <= 1.0  # NaN: False (either order gives NaN)
        out = tl.where(small, silu * (u * s), (silu * u) * s)
        neg = neg != (s < 0)
        lost = lost & (s == s) & (s != 0)
    else:
        out = silu * u
    # 0 * inf from a flushed or underflowed zero: the exact value is the signed infinity
    out = tl.where((out != out) & lost, tl.where(neg, NEG_INF, POS_INF), out)
    o_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols.to(tl.int64)[None, :] * stride_on
    if INTERPRETED and out_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(o_ptrs, fp32_to_bf16_rne(out), mask=mask)
    else:
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
